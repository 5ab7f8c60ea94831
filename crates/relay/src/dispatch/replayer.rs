//! Replay: dead rows made due again. The admin API picks the rows (by ids, tenant, source
//! or time range, within the caller's scope); this module moves them, in synced batches of
//! [`deliveries::CHUNK_ROWS`] through the queue's `revive` op builder, and wakes the
//! pipeline for them.

use ankusa_keyspace::{AtMs, EventKind};
use ankusa_queue::deliveries::{self, DeadRow, Tx};
use ankusa_queue::hints::DueHints;
use ankusa_queue::hooklog;
use ankusa_queue::QueueError;
use ankusa_store::{Op, Store};

/// Revives `rows`, due at `now`; returns how many this call moved. A row a concurrent
/// replay or purge moved first is not revived again (and not counted). `audit`, if any,
/// commits with the first batch (or alone when there is no row). With `log`, each revived
/// delivery gets a `replayed` event in the hook log.
pub fn revive(
    store: &Store,
    hints: &DueHints,
    rows: &[DeadRow],
    now: AtMs,
    log: bool,
    audit: Option<Op>,
) -> Result<u64, QueueError> {
    let mut first = audit;
    let mut revived = 0u64;
    for chunk in rows.chunks(deliveries::CHUNK_ROWS) {
        let mut tx = Tx::new();
        if let Some(op) = first.take() {
            tx.push_op(op);
        }
        for r in chunk {
            deliveries::revive(&mut tx, r, now);
            if log {
                let ev = hooklog::requeued(EventKind::Replayed, now, 0, now);
                hooklog::record(&mut tx, store, r.key.seq, r.key.sink, &ev)?;
            }
        }
        revived += tx.commit(store, true)?.count();
        // Delivered at once, not at the next full scan.
        hints.add(chunk.iter().map(|r| (r.value.ord, now)));
    }
    if let Some(op) = first {
        store.write(vec![op], true)?;
    }
    Ok(revived)
}
