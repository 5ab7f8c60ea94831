//! The archive: hooks kept whole (body and all) for their retention after delivery.
//!
//! Ingest gives each hook of an archived source an obligation (`?a`, counted in
//! `archive_pending`); reclaim keeps a hook while it has one. The [`Archiver`] settles
//! obligations oldest first: it reads the hooks, writes each into the `archive` column
//! family and settles its obligation **in the same batch** — an archived copy and a settled
//! obligation appear together or not at all, so no hook is archived twice or lost between
//! two stores (the reason the archive is a column family, not segment files beside the
//! store: see `docs/storage.md`).
//!
//! | family | key | value |
//! |---|---|---|
//! | `archived_hooks` | `<<?h, ord::32, received::64, seq::64>>` | `<<1, expires::64>>`, envelope |
//! | `archive_expiry` | `<<?y, expires::64, seq::64>>` | `<<ord::32, received::64>>` |
//!
//! A tenant's archive over a time range is one bounded scan of `?h`. Retention is the
//! expiry index: a prune pass reads the `?y` keys past their time, deletes their `?h` rows
//! and the `?y` span with one range delete, and keeps a cursor so it never walks what it
//! deleted. An obligation whose hook is gone (purged) or whose source has the archive
//! switched off is dropped through the counted path.

use super::deliveries::{self, ArchiveObligation, Tx};
use ankusa_keyspace::Cf;
use ankusa_keyspace::{ArchivedKey, AtMs, Family, Seq, TenantOrd};
use ankusa_records::codec::{Dec, DecodeError, Enc};
use ankusa_records::moved::Moved;
use ankusa_records::Envelope;
use ankusa_store::{Dir, Op, Rows, Store};

use crate::QueueError;

/// What the archive does with an obligation's hook, by its source (from the
/// configuration: [`ankusa_config::Config::archive_policy`]).
pub trait Policy {
    /// The retention to archive with, or `None` to drop the obligation.
    fn retention_ms(&self, source: &str) -> Option<u64>;

    /// The most bytes tenant `tenant`'s archived copies may hold, as stored (`None`: no
    /// limit). A hook that would take it past is not archived.
    fn archive_limit(&self, _tenant: &str) -> Option<u64> {
        None
    }
}

impl<F: Fn(&str) -> Option<u64>> Policy for F {
    fn retention_ms(&self, source: &str) -> Option<u64> {
        self(source)
    }
}

impl Policy for ankusa_config::Config {
    fn retention_ms(&self, source: &str) -> Option<u64> {
        use ankusa_config::ArchivePolicy;
        match self.archive_policy(source) {
            ArchivePolicy::Archive { retention_ms } | ArchivePolicy::Honour { retention_ms } => {
                Some(retention_ms)
            }
            ArchivePolicy::Off => None,
        }
    }
}

/// An archived hook.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Archived {
    pub key: ArchivedKey,
    pub expires: AtMs,
    pub envelope: Envelope,
}

const VERSION: u8 = 1;

fn encode(expires: AtMs, envelope_bytes: &[u8]) -> Vec<u8> {
    Enc::with_version(VERSION)
        .u64(expires.0)
        .bytes(envelope_bytes)
        .finish()
}

impl Archived {
    pub fn decode(raw_key: &[u8], v: &[u8]) -> Result<Archived, QueueError> {
        let key = ankusa_keyspace::decode_archived_hook(raw_key)?;
        let corrupt = |e: DecodeError| QueueError::corrupt_at(Family::ArchivedHooks, raw_key, e);
        let mut d = Dec::new(v, "archived hook");
        d.version(VERSION).map_err(corrupt)?;
        let expires = AtMs(d.u64().map_err(corrupt)?);
        let envelope = Envelope::decode(d.bytes().map_err(corrupt)?).map_err(corrupt)?;
        d.end().map_err(corrupt)?;
        Ok(Archived {
            key,
            expires,
            envelope,
        })
    }
}

/// What a settle pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SettleReport {
    /// Obligations read.
    pub seen: u64,
    pub archived: u64,
    pub dropped: u64,
    /// Not archived: its tenant's archive holds its `archive_bytes`.
    pub over_quota: u64,
}

/// What a prune pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub expired: u64,
}

/// Obligations settled since the last compaction of their span past which the archiver
/// compacts it (so a restart does not walk their tombstones).
const COMPACT_AFTER: u64 = 100_000;

/// Settles obligations and prunes expired hooks, each with a cursor (see the module docs).
#[derive(Debug, Default)]
pub struct Archiver {
    /// The last obligation settled: the next pass starts after it. Obligations are made
    /// in seq order, so none appears behind it.
    settled_to: Option<Seq>,
    settled_since_compaction: u64,
    /// The last expiry key pruned.
    pruned_to: Option<Vec<u8>>,
    /// The bytes of archived copies of each tenant with an archive limit (as stored): read
    /// with one scan of its `?h` range the first time it is needed (bounded by the limit
    /// it is compared with), then kept by the settles and prunes. At most
    /// [`MAX_TALLIED`] tenants; past that it starts again.
    tally: std::collections::HashMap<TenantOrd, u64>,
}

/// The most tenants whose archive bytes an [`Archiver`] keeps.
pub const MAX_TALLIED: usize = 65_536;

/// The bytes an archived copy of an envelope of `envelope_bytes` takes as stored: its
/// version, its expiry, the envelope's length and the envelope ([`encode`]).
fn stored_len(envelope_bytes: &[u8]) -> u64 {
    1 + 8 + 4 + envelope_bytes.len() as u64
}

impl Archiver {
    /// Settles up to `limit` obligations, oldest first, in one unsynced batch (a lost
    /// batch is settled again: the archived rows are the same keys and values).
    pub fn settle(
        &mut self,
        store: &Store,
        policy: &dyn Policy,
        limit: usize,
    ) -> Result<SettleReport, QueueError> {
        let obs = deliveries::archive_obligations(store, self.settled_to, limit)?;
        let Some(last) = obs.last().map(|o| o.seq) else {
            if self.settled_since_compaction > 0 {
                deliveries::compact_obligations(store, None);
                self.settled_since_compaction = 0;
            }
            return Ok(SettleReport::default());
        };
        let hook_keys: Vec<Vec<u8>> = obs.iter().map(|o| ankusa_keyspace::hook(o.seq)).collect();
        let hooks = store.multi_get(Cf::Hooks, &hook_keys)?;
        let mut tx = Tx::new();
        let mut report = SettleReport {
            seen: obs.len() as u64,
            ..SettleReport::default()
        };
        // (unit, tenant, bytes) of each copy counted in a tally before its commit.
        let mut added: Vec<(usize, TenantOrd, u64)> = Vec::new();
        for (units, ((ob, raw), key)) in obs.iter().zip(hooks).zip(&hook_keys).enumerate() {
            // A hook that is gone cannot be archived. Nor can one that does not decode: that
            // is corruption, counted and logged with its key, and the obligation is dropped
            // through the counted path like a gone hook's (the other hooks still settle).
            let env = match raw.as_deref().map(|v| (Envelope::decode(v), v)) {
                Some((Ok(e), v)) => Some((e, v)),
                Some((Err(e), _)) => {
                    let err = QueueError::corrupt_at(Family::Hooks, key, e);
                    tracing::error!(error = %err, "archive: a hook does not decode; not archived");
                    None
                }
                None => None,
            };
            match env.and_then(|(e, v)| policy.retention_ms(&e.source).map(|r| (e, v, r))) {
                Some((env, bytes, retention)) => {
                    if let Some(limit) = policy.archive_limit(env.tenant_or_default()) {
                        let size = stored_len(bytes);
                        let used = self.used(store, ob.ord)?;
                        if used.saturating_add(size) > limit {
                            deliveries::archive_drop(&mut tx, ob);
                            report.over_quota += 1;
                            continue;
                        }
                        self.tally.insert(ob.ord, used + size);
                        added.push((units, ob.ord, size));
                    }
                    archive_one(&mut tx, ob, &env, bytes, retention);
                    report.archived += 1;
                }
                None => {
                    deliveries::archive_drop(&mut tx, ob);
                    report.dropped += 1;
                }
            }
        }
        // Each settle is a unit that consumes its obligation: one already settled (there is
        // one archiver, but be exact) writes nothing, archived copy included.
        let committed = tx.commit(store, false)?;
        for (unit, ord, size) in added {
            if !committed.moved.get(unit).copied().unwrap_or(false) {
                if let Some(t) = self.tally.get_mut(&ord) {
                    *t = t.saturating_sub(size);
                }
            }
        }
        self.settled_to = Some(last);
        self.settled_since_compaction += report.seen;
        if self.settled_since_compaction >= COMPACT_AFTER {
            deliveries::compact_obligations(store, Some(last));
            self.settled_since_compaction = 0;
        }
        Ok(report)
    }

    /// The bytes of tenant `ord`'s archived copies, from its tally or one scan of its range.
    fn used(&mut self, store: &Store, ord: TenantOrd) -> Result<u64, QueueError> {
        if let Some(n) = self.tally.get(&ord) {
            return Ok(*n);
        }
        if self.tally.len() >= MAX_TALLIED {
            self.tally.clear();
        }
        let (lo, hi) = ankusa_keyspace::archived_range(ord, AtMs(0), AtMs(u64::MAX));
        let mut n = 0u64;
        for kv in store.scan(Family::ArchivedHooks, &lo, &hi, Dir::Forward)? {
            n += kv?.1.len() as u64;
        }
        self.tally.insert(ord, n);
        Ok(n)
    }

    /// Removes up to `limit` hooks whose retention ended by `now`.
    pub fn prune(
        &mut self,
        store: &Store,
        now: AtMs,
        limit: usize,
    ) -> Result<PruneReport, QueueError> {
        let (mut lo, until) =
            ankusa_keyspace::archive_expired_before(AtMs(now.0.saturating_add(1)));
        // Above the lo sentinel (the bare prefix), below every real key: the range delete
        // must never take the sentinel.
        lo.push(0);
        let from = self.pruned_to.clone().unwrap_or(lo);
        if from >= until {
            return Ok(PruneReport::default());
        }
        let mut ops = Vec::new();
        let mut last = None;
        let mut tallied: Vec<(TenantOrd, Vec<u8>)> = Vec::new();
        for kv in store
            .scan(Family::ArchiveExpiry, &from, &until, Dir::Forward)?
            .take(limit)
        {
            let (k, v) = kv?;
            let (_, seq) = ankusa_keyspace::decode_archive_expiry(&k)?;
            let (ord, received) = match v.as_slice() {
                [a, b, c, d, rest @ ..] if rest.len() == 8 => (
                    TenantOrd(u32::from_be_bytes([*a, *b, *c, *d])),
                    AtMs(u64::from_be_bytes(rest.try_into().unwrap_or_default())),
                ),
                _ => {
                    return Err(QueueError::corrupt(
                        Family::ArchiveExpiry,
                        format!("bad value {}", ankusa_keyspace::hex(&v)),
                    ))
                }
            };
            let hook = ankusa_keyspace::archived_hook(&ArchivedKey { ord, received, seq });
            if self.tally.contains_key(&ord) {
                tallied.push((ord, hook.clone()));
            }
            ops.push(Op::delete(Cf::Archive, hook));
            last = Some(k);
        }
        // The copies of tallied tenants leave their tally with their size.
        let keys: Vec<Vec<u8>> = tallied.iter().map(|(_, k)| k.clone()).collect();
        for ((ord, _), v) in tallied.iter().zip(store.multi_get(Cf::Archive, &keys)?) {
            if let (Some(t), Some(v)) = (self.tally.get_mut(ord), v) {
                *t = t.saturating_sub(v.len() as u64);
            }
        }
        let Some(mut last) = last else {
            return Ok(PruneReport::default());
        };
        let expired = ops.len() as u64;
        last.push(0);
        ops.push(Op::DeleteRange {
            cf: Cf::Archive,
            from,
            to: last.clone(),
        });
        store.write(ops, false)?;
        self.pruned_to = Some(last);
        Ok(PruneReport { expired })
    }
}

/// One obligation settled into the archive: the archived hook, its expiry key, and the
/// settle (obligation deleted, `archive_pending` −1, a cleared marker for reclaim).
fn archive_one(
    tx: &mut Tx,
    ob: &ArchiveObligation,
    env: &Envelope,
    bytes: &[u8],
    retention_ms: u64,
) {
    let received = env.received_at;
    let expires = AtMs(received.0.saturating_add(retention_ms));
    let key = ArchivedKey {
        ord: ob.ord,
        received,
        seq: ob.seq,
    };
    deliveries::archive_settle(tx, ob);
    tx.unit_op(Op::put(
        Cf::Archive,
        ankusa_keyspace::archived_hook(&key),
        encode(expires, bytes),
    ));
    let mut v = ob.ord.0.to_be_bytes().to_vec();
    v.extend_from_slice(&received.0.to_be_bytes());
    tx.unit_op(Op::put(
        Cf::Archive,
        ankusa_keyspace::archive_expiry(expires, ob.seq),
        v,
    ));
}

/// Up to `max_items` archived copies of tenant `ord` (about `max_bytes` of them) still
/// inside their retention at `now_ms`, oldest first: what a handoff moves to the tenant's
/// new owner. Expired copies stay for the pruner.
pub fn movable_copies(
    store: &Store,
    ord: TenantOrd,
    now_ms: u64,
    max_items: usize,
    max_bytes: usize,
) -> Result<Vec<Moved>, QueueError> {
    let (lo, hi) = ankusa_keyspace::archived_range(ord, AtMs(0), AtMs(u64::MAX));
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for kv in store.scan(Family::ArchivedHooks, &lo, &hi, Dir::Forward)? {
        if out.len() >= max_items || bytes >= max_bytes {
            break;
        }
        let (k, v) = kv?;
        let key = ankusa_keyspace::decode_archived_hook(&k)?;
        let corrupt = |e: DecodeError| QueueError::corrupt_at(Family::ArchivedHooks, &k, e);
        let mut d = Dec::new(&v, "archived hook");
        d.version(VERSION).map_err(corrupt)?;
        let expires = d.u64().map_err(corrupt)?;
        let envelope = d.bytes().map_err(corrupt)?.to_vec();
        if expires <= now_ms {
            continue;
        }
        let m = Moved::Archived {
            seq: key.seq.0,
            received: key.received.0,
            expires,
            envelope,
        };
        bytes += m.weight();
        out.push(m);
    }
    Ok(out)
}

/// The sender's side of a moved copy (`m`, from [`movable_copies`] of tenant `ord`): its
/// `?h` row and expiry key go in the stage's write. (Not a unit: no counter counts
/// archived copies, and the pruner, the one other writer, deletes only expired copies,
/// which never move.)
pub fn stage_copy(tx: &mut Tx, ord: TenantOrd, m: &Moved) {
    let Moved::Archived {
        seq,
        received,
        expires,
        ..
    } = m
    else {
        return;
    };
    let key = ArchivedKey {
        ord,
        received: AtMs(*received),
        seq: Seq(*seq),
    };
    tx.push_op(Op::delete(
        Cf::Archive,
        ankusa_keyspace::archived_hook(&key),
    ));
    tx.push_op(Op::delete(
        Cf::Archive,
        ankusa_keyspace::archive_expiry(AtMs(*expires), Seq(*seq)),
    ));
}

/// The receiver's side: a moved copy enters tenant `ord`'s archive as hook `seq`'s, kept
/// until `expires` (the sender's). The caller skips a copy that expired on its way: its
/// expiry key would sort behind the pruner's cursor and never be read.
pub fn import_copy(
    tx: &mut Tx,
    ord: TenantOrd,
    seq: Seq,
    received: AtMs,
    expires: AtMs,
    envelope_bytes: &[u8],
) {
    let key = ArchivedKey { ord, received, seq };
    tx.push_op(Op::put(
        Cf::Archive,
        ankusa_keyspace::archived_hook(&key),
        encode(expires, envelope_bytes),
    ));
    let mut v = ord.0.to_be_bytes().to_vec();
    v.extend_from_slice(&received.0.to_be_bytes());
    tx.push_op(Op::put(
        Cf::Archive,
        ankusa_keyspace::archive_expiry(expires, seq),
        v,
    ));
}

/// A page of a tenant's archive, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Page {
    pub items: Vec<Archived>,
    /// Pass as `before` for the next page.
    pub next: Option<(AtMs, Seq)>,
}

/// A tenant's archived hooks received in `[from, to)`, newest first, `limit` at most,
/// starting below `before` (`(received, seq)` of the last item of the previous page).
pub fn page(
    store: &Store,
    ord: TenantOrd,
    from: AtMs,
    to: AtMs,
    before: Option<(AtMs, Seq)>,
    limit: usize,
) -> Result<Page, QueueError> {
    let (lo, mut hi) = ankusa_keyspace::archived_range(ord, from, to);
    if let Some((received, seq)) = before {
        let b = ankusa_keyspace::archived_hook(&ArchivedKey { ord, received, seq });
        if b < hi {
            hi = b;
        }
    }
    if lo >= hi {
        return Ok(Page::default());
    }
    let mut items = Vec::new();
    for kv in store
        .scan(Family::ArchivedHooks, &lo, &hi, Dir::Reverse)?
        .take(limit + 1)
    {
        let (k, v) = kv?;
        items.push(Archived::decode(&k, &v)?);
    }
    let next = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|a| (a.key.received, a.key.seq))
    } else {
        None
    };
    Ok(Page { items, next })
}

/// A tenant's archived hooks received in `[from, to)`, oldest first, after `after`
/// (`(received, seq)` of the last one taken), until `limit` hooks or, past the first,
/// `max_bytes` of bodies: what a replay reads a page at a time. The key of the last one
/// read is the next call's `after`; `None` when the range is done.
pub fn page_forward(
    store: &Store,
    ord: TenantOrd,
    from: AtMs,
    to: AtMs,
    after: Option<(AtMs, Seq)>,
    limit: usize,
    max_bytes: usize,
) -> Result<Page, QueueError> {
    let (mut lo, hi) = ankusa_keyspace::archived_range(ord, from, to);
    if let Some((received, seq)) = after {
        // Just past the key itself.
        let mut a = ankusa_keyspace::archived_hook(&ArchivedKey { ord, received, seq });
        a.push(0);
        if a > lo {
            lo = a;
        }
    }
    if lo >= hi {
        return Ok(Page::default());
    }
    let mut items: Vec<Archived> = Vec::new();
    let mut bytes = 0usize;
    let mut more = false;
    for kv in store.scan(Family::ArchivedHooks, &lo, &hi, Dir::Forward)? {
        if items.len() >= limit || (!items.is_empty() && bytes >= max_bytes) {
            more = true;
            break;
        }
        let (k, v) = kv?;
        let a = Archived::decode(&k, &v)?;
        bytes += a.envelope.body.len();
        items.push(a);
    }
    let next = if more {
        items.last().map(|a| (a.key.received, a.key.seq))
    } else {
        None
    };
    Ok(Page { items, next })
}

#[cfg(test)]
mod tests;
