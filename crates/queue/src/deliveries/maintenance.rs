//! Whole-tenant and whole-store passes: purge, boot recovery of inflight rows, archive
//! obligations, marker repair.
// Builds the queue's index keys: this module is part of `deliveries` (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::{
    collect, dead_page_for_tenant, purge_dead, purge_due, purge_pulled, read_leases, recover,
    waiting_pulls_of_tenant, ArchiveObligation, DueRow, InflightRow, Tx, CHUNK_ROWS,
};
use ankusa_keyspace::Cf;
use ankusa_keyspace::{AtMs, Bucket, Family, Seq, SinkIdx, TenantOrd};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::{Change, QueueError};

/// Which of a tenant's rows a purge removes (never inflight rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeKinds {
    pub pending: bool,
    pub dead: bool,
}

/// What a purge removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeReport {
    pub due: u64,
    pub dead: u64,
    pub batches: u64,
}

/// One synced chunk of a purge: up to [`CHUNK_ROWS`] of the tenant's due rows (if asked),
/// else up to [`CHUNK_ROWS`] dead rows. Returns the rows removed (0 when nothing is left).
/// An erase's chunk: the hook log records no purge (the erase removes the tenant's log).
pub fn purge_tenant_chunk(
    store: &Store,
    ord: TenantOrd,
    kinds: PurgeKinds,
) -> Result<PurgeReport, QueueError> {
    purge_chunk(store, ord, kinds, Vec::new(), None)
}

pub(super) fn purge_chunk(
    store: &Store,
    ord: TenantOrd,
    kinds: PurgeKinds,
    extra: Vec<Op>,
    log_at: Option<AtMs>,
) -> Result<PurgeReport, QueueError> {
    let mut tx = Tx::new();
    let mut report = PurgeReport::default();
    let mut due = 0usize;
    // Each removed row's `purged` event in the hook log, inside its row's unit.
    let mut kept = std::collections::HashMap::new();
    let mut log = |tx: &mut Tx, seq: Seq, sink: SinkIdx| match log_at {
        Some(now) => crate::hooklog::log_purge(tx, store, seq, sink, now, &mut kept),
        None => Ok(()),
    };
    if kinds.pending {
        let (lo, end) = ankusa_keyspace::due_tenant_range(ord);
        for row in collect(
            store.scan(Family::Due, &lo, &end, Dir::Forward)?,
            CHUNK_ROWS,
            DueRow::decode,
        )? {
            purge_due(&mut tx, &row);
            log(&mut tx, row.key.seq, row.key.sink)?;
            due += 1;
        }
        if due < CHUNK_ROWS {
            for row in waiting_pulls_of_tenant(store, ord, CHUNK_ROWS - due)? {
                purge_pulled(&mut tx, &row);
                log(&mut tx, row.key.seq, row.key.sink)?;
                due += 1;
            }
        }
    }
    if kinds.dead && due == 0 {
        let page = dead_page_for_tenant(store, ord, None, CHUNK_ROWS)?;
        for row in &page.rows {
            purge_dead(&mut tx, row);
            log(&mut tx, row.key.seq, row.key.sink)?;
        }
    }
    let found = !tx.is_empty();
    for op in extra {
        tx.push_op(op);
    }
    let committed = tx.commit(store, true)?;
    // Only the rows this purge removed count: a row claimed or purged by another writer
    // between the read and the commit was left as that writer made it.
    let (due_moved, dead_moved) = committed.moved.split_at(due.min(committed.moved.len()));
    report.due = due_moved.iter().filter(|m| **m).count() as u64;
    report.dead = dead_moved.iter().filter(|m| **m).count() as u64;
    if found {
        report.batches = 1;
    }
    Ok(report)
}

/// Purges a tenant's pending (due) and/or dead rows in synced chunks of [`CHUNK_ROWS`],
/// each removed row's `purged` event in the hook log with it (for a hook the log keeps).
/// Idempotent: an interrupted purge finishes by being called again.
pub fn purge_tenant(
    store: &Store,
    ord: TenantOrd,
    kinds: PurgeKinds,
) -> Result<PurgeReport, QueueError> {
    purge_tenant_with(store, ord, kinds, Vec::new())
}

/// [`purge_tenant`], with `first` (an audit row) committed in the first chunk's batch.
pub fn purge_tenant_with(
    store: &Store,
    ord: TenantOrd,
    kinds: PurgeKinds,
    first: Vec<Change>,
) -> Result<PurgeReport, QueueError> {
    let mut total = PurgeReport::default();
    let mut first = Some(first.into_iter().map(|c| c.0).collect());
    let now = AtMs(ankusa_keyspace::now_ms());
    loop {
        let r = purge_chunk(
            store,
            ord,
            kinds,
            first.take().unwrap_or_default(),
            Some(now),
        )?;
        if r.batches == 0 {
            return Ok(total);
        }
        total.due += r.due;
        total.dead += r.dead;
        total.batches += r.batches;
    }
}

/// Boot recovery: every inflight row (left by a crash) back to due at `now`, kind 0, in
/// synced chunks — but a pull delivery's under a lease (`?k`), which the lease keeps.
/// Returns the rows recovered.
pub fn recover_inflight(store: &Store, now: AtMs, log: bool) -> Result<u64, QueueError> {
    let (lo, end) = Family::Inflight.bounds();
    let mut from = lo;
    let mut total = 0;
    loop {
        let rows = collect(
            store.scan(Family::Inflight, &from, &end, Dir::Forward)?,
            CHUNK_ROWS,
            InflightRow::decode,
        )?;
        let Some(last) = rows.last() else {
            return Ok(total);
        };
        from = ankusa_keyspace::inflight(&last.key);
        from.push(0);
        // A pull delivery under a lease stays inflight: its consumer may still ack it,
        // and the gateway ends the lease at its deadline as it would have.
        let leased = read_leases(
            store,
            &rows
                .iter()
                .map(|r| (r.key.seq, r.key.sink))
                .collect::<Vec<_>>(),
        )?;
        let mut tx = Tx::new();
        for (row, lease) in rows.iter().zip(leased) {
            if lease.is_some() {
                continue;
            }
            recover(&mut tx, row, now);
            if log {
                let ev =
                    crate::hooklog::requeued(ankusa_keyspace::EventKind::Recovered, now, 0, now);
                crate::hooklog::record(&mut tx, store, row.key.seq, row.key.sink, &ev)?;
            }
        }
        total += tx.commit(store, true)?.count();
    }
}

/// The archive obligations, oldest first, from `after` (exclusive).
pub fn archive_obligations(
    store: &Store,
    after: Option<Seq>,
    limit: usize,
) -> Result<Vec<ArchiveObligation>, QueueError> {
    let (lo, end) = Family::Archive.bounds();
    let from = after.map_or(lo, |s| {
        let mut k = ankusa_keyspace::archive(s);
        k.push(0);
        k
    });
    collect(
        store.scan(Family::Archive, &from, &end, Dir::Forward)?,
        limit,
        ArchiveObligation::decode,
    )
}

/// Compacts the obligations' span up to `through` (all of it with `None`): the archiver's
/// settled obligations are tombstones a fresh sweep would otherwise walk.
pub fn compact_obligations(store: &Store, through: Option<Seq>) {
    let (lo, end) = Family::Archive.bounds();
    let to = through.map_or(end, |s| {
        let mut k = ankusa_keyspace::archive(s);
        k.push(0);
        k
    });
    store.compact_range(Cf::Index, &lo, &to);
}

/// Boot repair: every due row's active marker exists. The pipeline's marker cleanup
/// deletes a marker and, if a due row arrived in its bucket meanwhile, restores it in a
/// later unsynced write; a crash that keeps the delete (made durable by a later synced
/// batch) and loses the restore would leave a due row no tick ever visits. One pass over
/// the due family before the pipeline starts (O(due rows), with one point read per
/// distinct tenant-second) puts back what is missing, synced. Returns the markers restored.
pub fn repair_markers(store: &Store) -> Result<u64, QueueError> {
    repair_markers_except(store, |_| false)
}

/// [`repair_markers`], but not for the tenants `paused` names: a paused tenant has no
/// markers, and gets them back when it is resumed ([`restore_tenant_markers`]).
pub fn repair_markers_except(
    store: &Store,
    paused: impl Fn(TenantOrd) -> bool,
) -> Result<u64, QueueError> {
    let mut last: Option<(Bucket, TenantOrd)> = None;
    let mut ops = Vec::new();
    let mut restored = 0;
    for kv in store.scan_family(Family::Due)? {
        let (k, v) = kv?;
        let row = DueRow::decode(&k, &v)?;
        let here = (row.key.at.bucket(), row.key.ord);
        if last == Some(here) {
            continue;
        }
        last = Some(here);
        if paused(here.1) {
            continue;
        }
        let marker = ankusa_keyspace::active(here.0, here.1);
        if store.get(Cf::Index, &marker)?.is_none() {
            ops.push(Op::put(Cf::Index, marker, Vec::new()));
            restored += 1;
            if ops.len() >= CHUNK_ROWS {
                store.write(std::mem::take(&mut ops), true)?;
            }
        }
    }
    if !ops.is_empty() {
        store.write(ops, true)?;
    }
    Ok(restored)
}

/// A resumed tenant's markers: one for every second its due rows are in (a paused
/// tenant's markers were taken out as dispatch met them), written synced in chunks before
/// the pause ends. Returns the markers written.
pub fn restore_tenant_markers(store: &Store, ord: TenantOrd) -> Result<u64, QueueError> {
    let (from, to) = ankusa_keyspace::due_tenant_range(ord);
    let mut last: Option<Bucket> = None;
    let mut ops = Vec::new();
    let mut written = 0;
    for kv in store.scan(Family::Due, &from, &to, Dir::Forward)? {
        let (k, v) = kv?;
        let row = DueRow::decode(&k, &v)?;
        let bucket = row.key.at.bucket();
        if last == Some(bucket) {
            continue;
        }
        last = Some(bucket);
        ops.push(Op::put(
            Cf::Index,
            ankusa_keyspace::active(bucket, ord),
            Vec::new(),
        ));
        written += 1;
        if ops.len() >= CHUNK_ROWS {
            store.write(std::mem::take(&mut ops), true)?;
        }
    }
    if !ops.is_empty() {
        store.write(ops, true)?;
    }
    Ok(written)
}

/// Takes a paused tenant's markers of `buckets` out (not synced: one that comes back is
/// taken out again when dispatch meets it).
pub fn drop_markers(store: &Store, ord: TenantOrd, buckets: &[Bucket]) -> Result<(), QueueError> {
    if buckets.is_empty() {
        return Ok(());
    }
    let ops = buckets
        .iter()
        .map(|b| Op::delete(Cf::Index, ankusa_keyspace::active(*b, ord)))
        .collect();
    store.write(ops, false)?;
    Ok(())
}
