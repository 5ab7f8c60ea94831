//! Replay: dead rows made due again, and retry now: rows waiting out a retry's backoff
//! made due at once. The admin API picks the rows (within the caller's scope); this module
//! moves them, in synced batches of [`deliveries::CHUNK_ROWS`] through the queue's
//! `revive` and `hasten` op builders, and wakes the pipeline for them.

use ankusa_keyspace::{AtMs, EventKind, Seq, SinkIdx, TenantOrd};
use ankusa_queue::deliveries::{self, DeadRow, DueRow, Tx};
use ankusa_queue::engine::Store;
use ankusa_queue::hints::DueHints;
use ankusa_queue::hooklog;
use ankusa_queue::Change;
use ankusa_queue::QueueError;

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
    audit: Option<Change>,
) -> Result<u64, QueueError> {
    let revive = |tx: &mut Tx, r: &DeadRow| deliveries::revive(tx, r, now);
    let moved = requeue(store, hints, rows, now, "replay", log, audit, revive)?;
    // Each revived delivery as a span of its hook's trace (with `log.spans` or OTLP).
    if tracing::enabled!(target: crate::telemetry::TARGET, tracing::Level::DEBUG) {
        for r in rows {
            let span = tracing::debug_span!(
                target: crate::telemetry::TARGET,
                "replayed",
                hook_id = r.value.hook_id.as_str(),
                sink = r.value.sink.as_str(),
                source = r.value.source.as_str(),
            );
            crate::telemetry::in_hook_trace(&span, &r.value.hook_id);
            drop(span.enter());
        }
    }
    Ok(moved)
}

/// Makes `rows` (due later: a retry's backoff) due at `now`, as [`revive`] does dead rows.
pub fn hasten(
    store: &Store,
    hints: &DueHints,
    rows: &[DueRow],
    now: AtMs,
    log: bool,
    audit: Option<Change>,
) -> Result<u64, QueueError> {
    let hasten = |tx: &mut Tx, r: &DueRow| deliveries::hasten(tx, r, now);
    requeue(store, hints, rows, now, "retry", log, audit, hasten)
}

/// A row a replay or a retry now moves: its tenant and its delivery.
trait Requeued {
    fn at(&self) -> (TenantOrd, Seq, SinkIdx);
}

impl Requeued for DeadRow {
    fn at(&self) -> (TenantOrd, Seq, SinkIdx) {
        (self.value.ord, self.key.seq, self.key.sink)
    }
}

impl Requeued for DueRow {
    fn at(&self) -> (TenantOrd, Seq, SinkIdx) {
        (self.key.ord, self.key.seq, self.key.sink)
    }
}

/// Moves `rows` with `op`, due at `now`, in synced batches, each delivery with a
/// `replayed` event when `log`; wakes the pipeline for each batch's tenants. Each batch is
/// a `requeue` span (`what`: replay or retry).
#[allow(
    clippy::too_many_arguments,
    reason = "the two requeues' shared body, named by its parts"
)]
fn requeue<R: Requeued>(
    store: &Store,
    hints: &DueHints,
    rows: &[R],
    now: AtMs,
    what: &'static str,
    log: bool,
    audit: Option<Change>,
    op: impl Fn(&mut Tx, &R),
) -> Result<u64, QueueError> {
    let mut first = audit;
    let mut moved = 0u64;
    for chunk in rows.chunks(deliveries::CHUNK_ROWS) {
        let span = tracing::debug_span!(
            target: crate::telemetry::TARGET,
            "requeue",
            what,
            rows = chunk.len(),
        );
        let _in = span.enter();
        let mut tx = Tx::new();
        if let Some(op) = first.take() {
            tx.push(op);
        }
        for r in chunk {
            op(&mut tx, r);
            if log {
                let (_, seq, sink) = r.at();
                let ev = hooklog::requeued(EventKind::Replayed, now, 0, now);
                hooklog::record(&mut tx, store, seq, sink, &ev)?;
            }
        }
        moved += tx.commit(store, true)?.count();
        // Delivered at once, not at the next full scan.
        hints.add(chunk.iter().map(|r| (r.at().0, now)));
    }
    if let Some(op) = first {
        ankusa_queue::commit(store, vec![op], true)?;
    }
    Ok(moved)
}
