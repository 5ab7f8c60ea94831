//! Index reads: the active tenants, due rows, the oldest due age, dead pages, a hook's
//! delivery rows and where it stands, backlogs; and the dispatch side's marker cleanup.
// Builds the queue's index keys: this module is part of `deliveries` (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;

use super::{DeadRow, DueRow, InflightRow, Kind, OLDEST_DUE_MAX_SKIPS};
use ankusa_keyspace::Cf;
use ankusa_keyspace::{
    self, AtMs, Bucket, DeadKey, DueKey, Family, InflightKey, Seq, SinkIdx, TenantOrd,
};
use ankusa_records::{DeliveryRow, Envelope};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::QueueError;

pub(super) fn collect<T>(
    scan: impl Iterator<Item = Result<ankusa_store::KeyValue, ankusa_store::StoreError>>,
    limit: usize,
    mut decode: impl FnMut(&[u8], &[u8]) -> Result<T, QueueError>,
) -> Result<Vec<T>, QueueError> {
    let mut out = Vec::new();
    for kv in scan.take(limit) {
        let (k, v) = kv?;
        out.push(decode(&k, &v)?);
    }
    Ok(out)
}

/// A tenant with due work, and the markers the scan saw for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveTenant {
    pub ord: TenantOrd,
    /// Marker buckets seen, oldest first.
    pub buckets: Vec<Bucket>,
}

/// The first `limit` active markers with a bucket at or before `now`'s, oldest first,
/// grouped by tenant (in order of each tenant's oldest marker). Never touches a tenant
/// with nothing due, so its cost depends on neither the tenant count nor the backlog.
pub fn active_tenants(
    store: &Store,
    now: AtMs,
    limit: usize,
) -> Result<Vec<ActiveTenant>, QueueError> {
    active_tenants_distinct(store, now, usize::MAX, limit)
}

/// The first `max_tenants` distinct tenants with a marker at or before `now`'s bucket, in
/// order of each one's oldest marker, reading at most `max_markers` markers (a tenant
/// with markers in many buckets cannot make the read unbounded); a marker of a tenant
/// past `max_tenants` is where the read stops. Markers are grouped in one pass (a hash
/// index, not a search per marker). The per-tenant gauge and `/v1/tenants` sample with it.
pub fn active_tenants_distinct(
    store: &Store,
    now: AtMs,
    max_tenants: usize,
    max_markers: usize,
) -> Result<Vec<ActiveTenant>, QueueError> {
    active_tenants_from(store, Bucket(0), now, max_tenants, max_markers)
}

/// [`active_tenants_distinct`] over the markers from bucket `from` on: the dispatch tick
/// starts where the live markers start, not at the cleaned markers' tombstones below them.
pub fn active_tenants_from(
    store: &Store,
    from: Bucket,
    now: AtMs,
    max_tenants: usize,
    max_markers: usize,
) -> Result<Vec<ActiveTenant>, QueueError> {
    let (lo, end) = ankusa_keyspace::active_range(from, now.bucket());
    let mut out: Vec<ActiveTenant> = Vec::new();
    let mut index: std::collections::HashMap<TenantOrd, usize> = std::collections::HashMap::new();
    for kv in store
        .scan(Family::Active, &lo, &end, Dir::Forward)?
        .take(max_markers)
    {
        let (k, _) = kv?;
        let (bucket, ord) = ankusa_keyspace::decode_active(&k)?;
        match index.get(&ord) {
            Some(&i) => out[i].buckets.push(bucket),
            None if out.len() >= max_tenants => break,
            None => {
                index.insert(ord, out.len());
                out.push(ActiveTenant {
                    ord,
                    buckets: vec![bucket],
                });
            }
        }
    }
    Ok(out)
}

/// A tenant's due rows with `floor <= at <= now`, oldest first, at most `limit` rows and
/// `byte_budget` bytes (the first row is always returned, however large).
pub fn due_for_tenant(
    store: &Store,
    ord: TenantOrd,
    now: AtMs,
    floor: AtMs,
    limit: usize,
    byte_budget: u64,
) -> Result<DuePage, QueueError> {
    let (from, to) = ankusa_keyspace::due_range(ord, floor, AtMs(now.0.saturating_add(1)));
    let mut rows = Vec::new();
    let mut bytes = 0u64;
    for kv in store.scan(Family::Due, &from, &to, Dir::Forward)? {
        if rows.len() >= limit {
            return Ok(DuePage { rows, more: true });
        }
        let (k, v) = kv?;
        let row = DueRow::decode(&k, &v)?;
        bytes += row.size as u64;
        if bytes > byte_budget && !rows.is_empty() {
            return Ok(DuePage { rows, more: true });
        }
        rows.push(row);
    }
    Ok(DuePage { rows, more: false })
}

/// What [`due_for_tenant`] read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DuePage {
    /// The rows, oldest first.
    pub rows: Vec<DueRow>,
    /// The read stopped at its `limit` or `byte_budget` with more rows due after `rows`;
    /// otherwise it read every row due by `now` from its floor.
    pub more: bool,
}

/// A tenant's due rows that wait for a time after `now` (a retry's backoff), earliest
/// first, at most `limit`: one range scan of its `?D` rows from `now`.
pub fn scheduled_for_tenant(
    store: &Store,
    ord: TenantOrd,
    now: AtMs,
    limit: usize,
) -> Result<Vec<DueRow>, QueueError> {
    let (from, to) = ankusa_keyspace::due_range(ord, AtMs(now.0.saturating_add(1)), AtMs(u64::MAX));
    collect(
        store.scan(Family::Due, &from, &to, Dir::Forward)?,
        limit,
        DueRow::decode,
    )
}

/// The earliest due row of a tenant (one seek).
pub fn first_due(store: &Store, ord: TenantOrd) -> Result<Option<DueRow>, QueueError> {
    first_due_from(store, ord, AtMs(0))
}

/// The earliest due row of a tenant at or after `from` (one seek, over only the
/// tombstones of rows claimed since `from`).
pub fn first_due_from(
    store: &Store,
    ord: TenantOrd,
    from: AtMs,
) -> Result<Option<DueRow>, QueueError> {
    let (from, _) = ankusa_keyspace::due_range(ord, from, from);
    let (_, to) = ankusa_keyspace::due_tenant_range(ord);
    match store.first(Family::Due, &from, &to, Dir::Forward)? {
        Some((k, v)) => Ok(Some(DueRow::decode(&k, &v)?)),
        None => Ok(None),
    }
}

pub(super) fn has_due_in(
    store: &Store,
    ord: TenantOrd,
    bucket: Bucket,
) -> Result<bool, QueueError> {
    let (from, to) = ankusa_keyspace::due_range(
        ord,
        bucket.start(),
        Bucket(bucket.0.saturating_add(1)).start(),
    );
    Ok(store
        .first(Family::Due, &from, &to, Dir::Forward)?
        .is_some())
}

/// Cleanup step 1 (docs/storage.md, "The active index"): which scanned markers are stale.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a cleanup plan must be carried out"]
pub struct CleanupPlan {
    pub ord: TenantOrd,
    pub stale: Vec<Bucket>,
}

/// Markers deleted by step 2, to be verified by step 3.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a cleanup must be verified"]
pub struct DeletedMarkers {
    pub ord: TenantOrd,
    pub buckets: Vec<Bucket>,
}

/// Cleanup, step 1: reads the tenant's first due row; the scanned markers older than its
/// bucket (older than `now`'s bucket if it has none) are stale. A marker of the current
/// second is never stale.
pub fn cleanup_plan(
    store: &Store,
    ord: TenantOrd,
    scanned: &[Bucket],
    now: AtMs,
) -> Result<CleanupPlan, QueueError> {
    // Only markers older than the current second can be stale; with none, skip the seek.
    if scanned.iter().all(|b| *b >= now.bucket()) {
        return Ok(CleanupPlan {
            ord,
            stale: Vec::new(),
        });
    }
    // Every due row has its marker, and the scan met the tenant's markers oldest first:
    // no due row of the tenant is older than the first scanned bucket.
    let oldest = scanned.iter().min().copied().unwrap_or(Bucket(0));
    let keep_from = match first_due_from(store, ord, oldest.start())? {
        Some(first) => first.key.at.bucket().min(now.bucket()),
        None => now.bucket(),
    };
    let stale: BTreeSet<Bucket> = scanned.iter().copied().filter(|b| *b < keep_from).collect();
    Ok(CleanupPlan {
        ord,
        stale: stale.into_iter().collect(),
    })
}

/// Cleanup, step 2: deletes the stale markers (not synced: a lost delete only costs an
/// empty visit).
pub fn cleanup_delete(store: &Store, plan: CleanupPlan) -> Result<DeletedMarkers, QueueError> {
    if !plan.stale.is_empty() {
        let ops = plan
            .stale
            .iter()
            .map(|b| Op::delete(Cf::Index, ankusa_keyspace::active(*b, plan.ord)))
            .collect();
        store.write(ops, false)?;
    }
    Ok(DeletedMarkers {
        ord: plan.ord,
        buckets: plan.stale,
    })
}

/// Cleanup, step 3: puts back every deleted marker whose bucket still holds a due row of
/// the tenant — a row a concurrent writer committed (with its marker) after step 1 read
/// and before step 2 deleted. Writers only ever put markers and the pipeline is the only
/// deleter, so after this no due row is without its marker. Returns the buckets restored.
pub fn cleanup_verify(store: &Store, deleted: DeletedMarkers) -> Result<Vec<Bucket>, QueueError> {
    let mut restored = Vec::new();
    for b in deleted.buckets {
        if has_due_in(store, deleted.ord, b)? {
            restored.push(b);
        }
    }
    if !restored.is_empty() {
        let ops = restored
            .iter()
            .map(|b| {
                Op::put(
                    Cf::Index,
                    ankusa_keyspace::active(*b, deleted.ord),
                    Vec::new(),
                )
            })
            .collect();
        store.write(ops, false)?;
    }
    Ok(restored)
}

/// The whole delete-then-verify cleanup of one tenant's scanned markers, after a claim.
/// Dispatch-side only: the pipeline is the one deleter of markers.
pub fn cleanup_markers(
    store: &Store,
    ord: TenantOrd,
    scanned: &[Bucket],
    now: AtMs,
) -> Result<(), QueueError> {
    let plan = cleanup_plan(store, ord, scanned, now)?;
    let deleted = cleanup_delete(store, plan)?;
    cleanup_verify(store, deleted)?;
    Ok(())
}

/// When the oldest due row became due: from the first active marker, verified against that
/// tenant's `first_due`; after [`OLDEST_DUE_MAX_SKIPS`] stale markers, the next marker's
/// bucket start. O(1) in the backlog.
pub fn oldest_due_at(store: &Store) -> Result<Option<AtMs>, QueueError> {
    let (lo, end) = Family::Active.bounds();
    for (i, kv) in store
        .scan(Family::Active, &lo, &end, Dir::Forward)?
        .enumerate()
    {
        let (k, _) = kv?;
        let (bucket, ord) = ankusa_keyspace::decode_active(&k)?;
        if i >= OLDEST_DUE_MAX_SKIPS {
            return Ok(Some(bucket.start()));
        }
        if let Some(first) = first_due(store, ord)? {
            if first.key.at.bucket() <= bucket {
                return Ok(Some(first.key.at));
            }
        }
    }
    Ok(None)
}

/// A page of the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadPage {
    pub rows: Vec<DeadRow>,
    /// Pass back as `before` for the next page; `None` at the end.
    pub next: Option<DeadKey>,
}

pub(super) fn page(rows: Vec<DeadRow>, limit: usize) -> DeadPage {
    let next = if rows.len() == limit {
        rows.last().map(|r| r.key)
    } else {
        None
    };
    DeadPage { rows, next }
}

/// The delivery rows of `(hook, sink)` pairs, in order (`None` where there is none). A row
/// that does not decode is an error naming its key, never read as absent.
pub fn delivery_rows(
    store: &Store,
    pairs: &[(Seq, SinkIdx)],
) -> Result<Vec<Option<DeliveryRow>>, QueueError> {
    delivery_rows_each(store, pairs)?
        .into_iter()
        .map(|r| r.map(|r| r.map_err(Undecodable::corruption)).transpose())
        .collect()
}

/// A stored row that does not decode, found by a read that goes on past it: not yet
/// counted as corruption; [`Undecodable::corruption`] counts it and names its key.
#[derive(Debug)]
pub struct Undecodable {
    family: Family,
    key: Vec<u8>,
    error: ankusa_records::codec::DecodeError,
}

impl Undecodable {
    /// The corruption, counted (`ankusa_store_corruption_errors_total{family}`).
    pub fn corruption(self) -> QueueError {
        QueueError::corrupt_at(self.family, &self.key, self.error)
    }
}

/// What is wrong with the row, and where: the decode error and the key in hex.
impl std::fmt::Display for Undecodable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} at {}", self.error, ankusa_keyspace::hex(&self.key))
    }
}

/// One row of a batch read, on its own: `None` where there is none, `Err` where it does
/// not decode, so that one bad row does not fail the others.
pub type EachRow<T> = Option<Result<T, Undecodable>>;

fn each<T>(
    store: &Store,
    family: Family,
    keys: Vec<Vec<u8>>,
    decode: impl Fn(&[u8]) -> Result<T, ankusa_records::codec::DecodeError>,
) -> Result<Vec<EachRow<T>>, QueueError> {
    let values = store.multi_get(family.cf(), &keys)?;
    Ok(values
        .into_iter()
        .zip(keys)
        .map(|(v, key)| v.map(|v| decode(&v).map_err(|error| Undecodable { family, key, error })))
        .collect())
}

/// The envelopes of `seqs`, in order, each on its own (`None`: the hook is gone): one
/// `multi_get`.
pub fn envelopes_each(store: &Store, seqs: &[Seq]) -> Result<Vec<EachRow<Envelope>>, QueueError> {
    let keys = seqs.iter().map(|s| ankusa_keyspace::hook(*s)).collect();
    each(store, Family::Hooks, keys, Envelope::decode)
}

/// The delivery rows of `(hook, sink)` pairs, in order, each on its own: one `multi_get`.
pub fn delivery_rows_each(
    store: &Store,
    pairs: &[(Seq, SinkIdx)],
) -> Result<Vec<EachRow<DeliveryRow>>, QueueError> {
    let keys = pairs
        .iter()
        .map(|(s, k)| ankusa_keyspace::delivery(*s, *k))
        .collect();
    each(store, Family::Deliveries, keys, DeliveryRow::decode)
}

/// The hook `seq`'s envelope, if the hook is still stored. An envelope that does not
/// decode is an error.
pub fn envelope(store: &Store, seq: Seq) -> Result<Option<Envelope>, QueueError> {
    let k = ankusa_keyspace::hook(seq);
    store
        .get(Cf::Hooks, &k)?
        .map(|v| Envelope::decode(&v).map_err(|e| QueueError::corrupt_at(Family::Hooks, &k, e)))
        .transpose()
}

/// The first `limit` distinct tenants with dead rows, in ordinal order: a skip scan of
/// `?X` that reads one key per tenant (a seek past each tenant's rows), never a tenant's
/// whole range.
pub fn tenants_with_dead(store: &Store, limit: usize) -> Result<Vec<TenantOrd>, QueueError> {
    let (_, end) = Family::DeadByTenant.bounds();
    let mut from = ankusa_keyspace::dead_tenant_range(TenantOrd(0)).0;
    let mut out = Vec::new();
    while out.len() < limit {
        let Some(kv) = store
            .scan(Family::DeadByTenant, &from, &end, Dir::Forward)?
            .next()
        else {
            break;
        };
        let (k, _) = kv?;
        let (ord, _) = ankusa_keyspace::decode_dead_by_tenant(&k)?;
        out.push(ord);
        if ord.0 == u32::MAX {
            break;
        }
        from = ankusa_keyspace::dead_tenant_range(TenantOrd(ord.0 + 1)).0;
    }
    Ok(out)
}

/// The node's dead rows, newest first, strictly before `before` (a reverse `?x` scan).
pub fn dead_page(
    store: &Store,
    before: Option<DeadKey>,
    limit: usize,
) -> Result<DeadPage, QueueError> {
    let (lo, end) = Family::Dead.bounds();
    let to = before.map_or(end, |k| ankusa_keyspace::dead(&k));
    let rows = collect(
        store.scan(Family::Dead, &lo, &to, Dir::Reverse)?,
        limit,
        DeadRow::decode,
    )?;
    Ok(page(rows, limit))
}

/// One tenant's dead rows, newest first: a reverse scan of its `?X` range joined to the
/// `?x` values by key. Reads no hook.
pub fn dead_page_for_tenant(
    store: &Store,
    ord: TenantOrd,
    before: Option<DeadKey>,
    limit: usize,
) -> Result<DeadPage, QueueError> {
    let (lo, end) = ankusa_keyspace::dead_tenant_range(ord);
    let to = before.map_or(end, |k| ankusa_keyspace::dead_by_tenant(ord, &k));
    let dead_keys = collect(
        store.scan(Family::DeadByTenant, &lo, &to, Dir::Reverse)?,
        limit,
        |k, _| Ok(ankusa_keyspace::decode_dead_by_tenant(k)?.1),
    )?;
    let values = store.multi_get(
        Cf::Index,
        &dead_keys
            .iter()
            .map(ankusa_keyspace::dead)
            .collect::<Vec<_>>(),
    )?;
    // The next page starts after the last key scanned, even if its row moved meanwhile.
    let next = (dead_keys.len() == limit)
        .then(|| dead_keys.last().copied())
        .flatten();
    let mut rows = Vec::with_capacity(dead_keys.len());
    for (key, v) in dead_keys.into_iter().zip(values) {
        let Some(v) = v else {
            // `?x` and `?X` go in one batch: if `?X` is gone too, a replay or purge moved
            // the row between the two reads; if it is still there, the pair is broken.
            if store
                .get(Cf::Index, &ankusa_keyspace::dead_by_tenant(ord, &key))?
                .is_none()
            {
                continue;
            }
            return Err(QueueError::corrupt(
                Family::DeadByTenant,
                format!("?X row without its ?x row at seq {}", key.seq.0),
            ));
        };
        rows.push(DeadRow::decode(&ankusa_keyspace::dead(&key), &v)?);
    }
    Ok(DeadPage { rows, next })
}

/// Every due row, in key order (fixtures, tools and tests; O(backlog)).
pub fn due_rows(store: &Store) -> Result<Vec<DueRow>, QueueError> {
    collect(store.scan_family(Family::Due)?, usize::MAX, DueRow::decode)
}

/// Where a delivery's index row was found by [`locate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Located {
    Inflight,
    Due(Kind),
    Dead,
    /// Not at any of the places asked about.
    Elsewhere,
}

/// Looks for a delivery's index row by point reads only, at the places the caller
/// expects it (the hook log knows the due or dead time from its last event): inflight,
/// then due at `due_at`, then dead at `dead_at`.
pub fn locate(
    store: &Store,
    ord: TenantOrd,
    seq: Seq,
    sink: SinkIdx,
    due_at: Option<AtMs>,
    dead_at: Option<AtMs>,
) -> Result<Located, QueueError> {
    if store
        .get(
            Cf::Index,
            &ankusa_keyspace::inflight(&InflightKey { ord, seq, sink }),
        )?
        .is_some()
    {
        return Ok(Located::Inflight);
    }
    if let Some(at) = due_at {
        let key = DueKey { ord, at, seq, sink };
        if let Some(v) = store.get(Cf::Index, &ankusa_keyspace::due(&key))? {
            return Ok(Located::Due(
                DueRow::decode(&ankusa_keyspace::due(&key), &v)?.kind,
            ));
        }
    }
    if let Some(at) = dead_at {
        if store
            .get(
                Cf::Index,
                &ankusa_keyspace::dead(&DeadKey { at, seq, sink }),
            )?
            .is_some()
        {
            return Ok(Located::Dead);
        }
    }
    Ok(Located::Elsewhere)
}

/// True if the hook still owes the archive.
pub fn has_archive_obligation(store: &Store, seq: Seq) -> Result<bool, QueueError> {
    Ok(store
        .get(Cf::Index, &ankusa_keyspace::archive(seq))?
        .is_some())
}

/// A tenant's inflight rows (tests and tools; the pipeline keeps its own in memory).
pub fn inflight_for_tenant(
    store: &Store,
    ord: TenantOrd,
    limit: usize,
) -> Result<Vec<InflightRow>, QueueError> {
    let (lo, end) = ankusa_keyspace::inflight_tenant_range(ord);
    collect(
        store.scan(Family::Inflight, &lo, &end, Dir::Forward)?,
        limit,
        InflightRow::decode,
    )
}

/// A source's waiting work ([`pending_for_source`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SourceBacklog {
    pub pending: i64,
    pub scheduled: i64,
    pub inflight: i64,
    pub bytes: i64,
    /// Due and inflight rows read to count these.
    pub rows_read: u64,
    /// False if the read stopped at its limit: the counts are a lower bound.
    pub exact: bool,
}

/// The due and inflight rows whose hook came through `source`.
/// Rows do not name their source, so each row's hook is read (one `multi_get` per 512
/// rows, each hook once). With the source's fixed tenant (`ord`) only that tenant's two
/// ranges are read; a shared source's count is a fold of every due and inflight row —
/// O(backlog), bounded by `limit` rows (then `exact` is false).
pub fn pending_for_source(
    store: &Store,
    source: &str,
    ord: Option<TenantOrd>,
    limit: usize,
) -> Result<SourceBacklog, QueueError> {
    // (seq, what it counts as, size): None for inflight.
    let mut rows: Vec<(Seq, Option<Kind>, u32)> = Vec::new();
    let (due_lo, due_end) = match ord {
        Some(o) => ankusa_keyspace::due_tenant_range(o),
        None => Family::Due.bounds(),
    };
    for kv in store.scan(Family::Due, &due_lo, &due_end, Dir::Forward)? {
        if rows.len() > limit {
            break;
        }
        let (k, v) = kv?;
        let r = DueRow::decode(&k, &v)?;
        rows.push((r.key.seq, Some(r.kind), r.size));
    }
    let (in_lo, in_end) = match ord {
        Some(o) => ankusa_keyspace::inflight_tenant_range(o),
        None => Family::Inflight.bounds(),
    };
    if rows.len() <= limit {
        for kv in store.scan(Family::Inflight, &in_lo, &in_end, Dir::Forward)? {
            if rows.len() > limit {
                break;
            }
            let (k, v) = kv?;
            let r = InflightRow::decode(&k, &v)?;
            rows.push((r.key.seq, None, r.size));
        }
    }
    let exact = rows.len() <= limit;
    rows.truncate(limit);
    let mut out = SourceBacklog {
        rows_read: rows.len() as u64,
        exact,
        ..SourceBacklog::default()
    };
    let mut of_source: std::collections::HashMap<Seq, bool> = std::collections::HashMap::new();
    for chunk in rows.chunks(512) {
        let mut seqs: Vec<Seq> = chunk
            .iter()
            .map(|r| r.0)
            .filter(|s| !of_source.contains_key(s))
            .collect();
        seqs.sort_unstable();
        seqs.dedup();
        let keys: Vec<Vec<u8>> = seqs.iter().map(|s| ankusa_keyspace::hook(*s)).collect();
        for ((seq, v), key) in seqs
            .iter()
            .zip(store.multi_get(Cf::Hooks, &keys)?)
            .zip(&keys)
        {
            // A hook that is gone is no source's; one that does not decode is corruption.
            let mine = match v {
                Some(v) => {
                    Envelope::decode(&v)
                        .map_err(|e| QueueError::corrupt_at(Family::Hooks, key, e))?
                        .source
                        == source
                }
                None => false,
            };
            of_source.insert(*seq, mine);
        }
        for (seq, kind, size) in chunk {
            if !of_source[seq] {
                continue;
            }
            match kind {
                Some(Kind::First) => out.pending += 1,
                Some(Kind::Retry) => out.scheduled += 1,
                None => out.inflight += 1,
            }
            out.bytes += *size as i64;
        }
    }
    Ok(out)
}
