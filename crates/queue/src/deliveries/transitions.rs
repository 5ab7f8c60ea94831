//! Every transition of a delivery between its states, as an op builder on a [`Tx`].
// Builds the queue's index keys: this module is part of `deliveries` (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::{DeadRow, DueRow, InflightRow, Kind, Tx};
use ankusa_keyspace::Cf;
use ankusa_keyspace::{
    self, AtMs, CounterField, DeadKey, DueKey, InflightKey, Seq, SinkIdx, TenantOrd,
};
use ankusa_records::{DeadValue, DeliveryRow, Envelope};
use ankusa_store::{Op, Rows, Store};

use crate::QueueError;

/// What ingest needs to enqueue one hook.
#[derive(Debug, Clone)]
pub struct NewHook<'a> {
    pub seq: Seq,
    pub ord: TenantOrd,
    pub envelope: &'a Envelope,
    /// Keep an archive obligation (`?a`) until the archive has the hook.
    pub archive: bool,
    /// Write the hook log's record and id ([`super::hooklog`]).
    pub log: bool,
    /// The sinks (by index in the envelope's list) whose deliveries the dispatch pipeline
    /// starts as soon as the batch commits: their rows are written inflight, not due (see
    /// [`crate::writer::Starts`]). Empty: every delivery is due.
    pub started: &'a [bool],
}

/// Ingest: the hook, one delivery row per sink with one due row (kind 0, due at receipt)
/// or, for a sink in [`NewHook::started`], one inflight row, and the archive obligation.
/// Returns the encoded size every row counts.
pub fn ingest(tx: &mut Tx, h: &NewHook<'_>) -> u32 {
    let env = h.envelope.encode();
    let size = env.len() as u32;
    tx.op(Op::put(Cf::Hooks, ankusa_keyspace::hook(h.seq), env));
    for i in 0..h.envelope.sinks.len() {
        let sink = SinkIdx(i as u16);
        if h.started.get(i).copied().unwrap_or(false) {
            add_started(tx, h.ord, h.seq, sink, size);
        } else {
            add_delivery(tx, h.ord, h.seq, sink, size, h.envelope.received_at);
        }
    }
    if h.archive {
        let mut v = size.to_be_bytes().to_vec();
        v.extend_from_slice(&h.ord.0.to_be_bytes());
        tx.op(Op::put(Cf::Index, ankusa_keyspace::archive(h.seq), v));
        tx.delta(h.ord, CounterField::ArchivePending, 1);
    }
    if h.log {
        crate::hooklog::log_ingest(tx, h.seq, h.envelope);
    }
    size
}

pub(super) fn add_delivery(
    tx: &mut Tx,
    ord: TenantOrd,
    seq: Seq,
    sink: SinkIdx,
    size: u32,
    at: AtMs,
) {
    put_delivery_row(tx, ord, seq, sink, size);
    tx.enqueue(&DueRow {
        key: DueKey { ord, at, seq, sink },
        size,
        kind: Kind::First,
    });
}

/// A fresh hook's delivery claimed at ingest: its delivery row and an inflight row (the
/// same rows, deltas and key as [`claim`] leaves), with no due row or marker in between.
fn add_started(tx: &mut Tx, ord: TenantOrd, seq: Seq, sink: SinkIdx, size: u32) {
    put_delivery_row(tx, ord, seq, sink, size);
    tx.put_inflight(&InflightRow {
        key: InflightKey { ord, seq, sink },
        size,
    });
}

/// A new delivery's row (no attempt yet) and the bytes it counts.
fn put_delivery_row(tx: &mut Tx, ord: TenantOrd, seq: Seq, sink: SinkIdx, size: u32) {
    let row = DeliveryRow {
        ord,
        size,
        ..DeliveryRow::default()
    };
    tx.op(Op::put(
        Cf::Deliveries,
        ankusa_keyspace::delivery(seq, sink),
        row.encode(),
    ));
    tx.delta(ord, CounterField::Bytes, size as i64);
}

/// Expand: a new delivery of an existing hook to sink `sink` (rows imported from an older
/// release, or a route gaining a sink), due at `at` as a first attempt. The hook's envelope
/// must name the sink at that index (a new sink is appended to it in the same batch):
/// delivery reads the sink's name there, and [`last_needs`] looks for a hook's rows only
/// at the indexes its envelope names.
pub fn expand(tx: &mut Tx, ord: TenantOrd, seq: Seq, sink: SinkIdx, size: u32, at: AtMs) {
    add_delivery(tx, ord, seq, sink, size, at);
}

/// Claim: due → inflight, with the ord and size the due row carries.
pub fn claim(tx: &mut Tx, row: &DueRow) -> InflightRow {
    tx.delete_due(row);
    let inflight = InflightRow {
        key: InflightKey {
            ord: row.key.ord,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        size: row.size,
    };
    tx.put_inflight(&inflight);
    inflight
}

/// Delivered: the inflight row and its delivery row go.
pub fn delivered(tx: &mut Tx, row: &InflightRow) {
    tx.delete_inflight(row);
    tx.drop_row(row.key.ord, row.key.seq, row.key.sink, row.size);
}

/// For each delivered row and the number of sinks its hook names, whether the row is the
/// last thing its hook is kept for: no other delivery row of the hook (due, inflight or
/// dead) and no archive obligation. One `multi_get` for the whole batch; a hook of one
/// sink costs one key (its `?a`).
///
/// The reads are made before the commit, outside its lock, and that is safe because what
/// they look for is only ever created with the hook: its rows and obligation at ingest,
/// for the sink indexes its envelope names (an [`expand`] of a new sink is committed with
/// the envelope naming it, and imports run before the node dispatches). What is absent now
/// stays absent;
/// a row of the hook that another writer removes meanwhile leaves its own marker, so a hook
/// read as still needed is reclaimed later, never too early. Two rows of one hook in the
/// same batch each see the other, and both leave a marker.
pub fn last_needs(store: &Store, rows: &[(InflightRow, usize)]) -> Result<Vec<bool>, QueueError> {
    let mut obligations = Vec::with_capacity(rows.len());
    let mut others = Vec::new();
    let mut spans = Vec::with_capacity(rows.len());
    for (row, sinks) in rows {
        obligations.push(ankusa_keyspace::archive(row.key.seq));
        let start = others.len();
        others.extend(
            (0..*sinks)
                .filter(|s| *s != row.key.sink.0 as usize)
                .map(|s| ankusa_keyspace::delivery(row.key.seq, SinkIdx(s as u16))),
        );
        spans.push(start..others.len());
    }
    let obligations = store.multi_get(Cf::Index, &obligations)?;
    let others = store.multi_get(Cf::Deliveries, &others)?;
    Ok(obligations
        .iter()
        .zip(spans)
        .map(|(ob, span)| ob.is_none() && others[span].iter().all(Option::is_none))
        .collect())
}

/// Delivered; with `last` (from [`last_needs`]) the hook goes in the same unit, and no `?c`
/// marker is left for reclaim to read back, delete and check again (the common case: one
/// sink, no archive). Without it, as [`delivered`].
pub fn delivered_last(tx: &mut Tx, row: &InflightRow, last: bool) {
    tx.delete_inflight(row);
    if last {
        tx.drop_last_row(row.key.ord, row.key.seq, row.key.sink, row.size);
    } else {
        tx.drop_row(row.key.ord, row.key.seq, row.key.sink, row.size);
    }
}

/// Retry: inflight → due at `at` with kind 1; the delivery row records the attempt.
pub fn retry(tx: &mut Tx, row: &InflightRow, at: AtMs, updated: &DeliveryRow) {
    tx.delete_inflight(row);
    tx.op(Op::put(
        Cf::Deliveries,
        ankusa_keyspace::delivery(row.key.seq, row.key.sink),
        updated.encode(),
    ));
    tx.enqueue(&row.due_at(at, Kind::Retry));
}

/// Dead-letter: inflight → dead, keyed by time (`?x`, its value carrying the ord) and by
/// tenant (`?X`). The delivery row stays (the DLQ still owes it), so bytes do not change.
pub fn dead_letter(
    tx: &mut Tx,
    row: &InflightRow,
    at: AtMs,
    source: &str,
    hook_id: &str,
    sink: &str,
    updated: Option<&DeliveryRow>,
) -> DeadRow {
    tx.delete_inflight(row);
    if let Some(updated) = updated {
        tx.op(Op::put(
            Cf::Deliveries,
            ankusa_keyspace::delivery(row.key.seq, row.key.sink),
            updated.encode(),
        ));
    }
    let dead = DeadRow {
        key: DeadKey {
            at,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        value: DeadValue {
            ord: row.key.ord,
            size: row.size,
            source: source.to_owned(),
            hook_id: hook_id.to_owned(),
            sink: sink.to_owned(),
        },
    };
    tx.op(Op::put(
        Cf::Index,
        ankusa_keyspace::dead(&dead.key),
        dead.value.encode(),
    ));
    tx.op(Op::put(
        Cf::Index,
        ankusa_keyspace::dead_by_tenant(row.key.ord, &dead.key),
        Vec::new(),
    ));
    tx.delta(row.key.ord, CounterField::Dead, 1);
    dead
}

/// Orphan drop: an inflight delivery whose hook is gone or undecodable is removed through
/// the counted path.
pub fn orphan_drop(tx: &mut Tx, row: &InflightRow) {
    delivered(tx, row);
}

/// Revive (replay): dead → due at `at`, kind 0.
pub fn revive(tx: &mut Tx, row: &DeadRow, at: AtMs) {
    delete_dead(tx, row);
    tx.enqueue(&DueRow {
        key: DueKey {
            ord: row.value.ord,
            at,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        size: row.value.size,
        kind: Kind::First,
    });
}

pub(super) fn delete_dead(tx: &mut Tx, row: &DeadRow) {
    tx.consume(ankusa_keyspace::dead(&row.key), None);
    tx.op(Op::delete(Cf::Index, ankusa_keyspace::dead(&row.key)));
    tx.op(Op::delete(
        Cf::Index,
        ankusa_keyspace::dead_by_tenant(row.value.ord, &row.key),
    ));
    tx.delta(row.value.ord, CounterField::Dead, -1);
}

/// Retry now: a due row waiting for its time (a retry's backoff) becomes due at `at`. Its
/// kind stays, and with it the counter it is in (a retry is still `scheduled` until it is
/// claimed); a row another writer moved first is not moved again.
pub fn hasten(tx: &mut Tx, row: &DueRow, at: AtMs) {
    tx.delete_due(row);
    tx.enqueue(&DueRow {
        key: DueKey { at, ..row.key },
        ..*row
    });
}

/// Recover (boot): an inflight row left by a crash goes back to due at `at`, kind 0.
pub fn recover(tx: &mut Tx, row: &InflightRow, at: AtMs) {
    tx.delete_inflight(row);
    tx.enqueue(&row.due_at(at, Kind::First));
}

/// Purge one due row (its marker is left for the pipeline's cleanup).
pub fn purge_due(tx: &mut Tx, row: &DueRow) {
    tx.delete_due(row);
    tx.drop_row(row.key.ord, row.key.seq, row.key.sink, row.size);
}

/// Purge one dead row.
pub fn purge_dead(tx: &mut Tx, row: &DeadRow) {
    delete_dead(tx, row);
    tx.drop_row(row.value.ord, row.key.seq, row.key.sink, row.value.size);
}

/// An archive obligation (`?a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveObligation {
    pub seq: Seq,
    pub ord: TenantOrd,
    pub size: u32,
}

impl ArchiveObligation {
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Self, QueueError> {
        let seq = ankusa_keyspace::decode_archive(key)?;
        match value {
            [a, b, c, d, e, f, g, h] => Ok(ArchiveObligation {
                seq,
                size: u32::from_be_bytes([*a, *b, *c, *d]),
                ord: TenantOrd(u32::from_be_bytes([*e, *f, *g, *h])),
            }),
            _ => Err(QueueError::corrupt(
                ankusa_keyspace::Family::Archive,
                format!("bad value {}", ankusa_keyspace::hex(value)),
            )),
        }
    }
}

/// Archive settle: the hook is archived; the obligation goes and reclaim may look. A unit:
/// it (and what rides with it, [`Tx::unit_op`]) commits only if the obligation is there.
pub fn archive_settle(tx: &mut Tx, ob: &ArchiveObligation) {
    tx.consume(ankusa_keyspace::archive(ob.seq), None);
    tx.op(Op::delete(Cf::Index, ankusa_keyspace::archive(ob.seq)));
    tx.op(Op::put(
        Cf::Index,
        ankusa_keyspace::cleared(ob.seq),
        Vec::new(),
    ));
    tx.delta(ob.ord, CounterField::ArchivePending, -1);
}

/// Archive drop: the obligation is given up (the archive is off, or the hook is gone).
pub fn archive_drop(tx: &mut Tx, ob: &ArchiveObligation) {
    archive_settle(tx, ob);
}

// ---------------------------------------------------------------------------------------
// Imports: rows that already exist in an older layout, re-keyed by the 2 -> 3 migration.
// Each puts the format-3 index row with its counter deltas; the caller deletes the old key.

/// An imported due row (and its marker): pending or scheduled +1, bytes +size.
pub fn import_due(tx: &mut Tx, row: &DueRow) {
    tx.enqueue(row);
    tx.delta(row.key.ord, CounterField::Bytes, row.size as i64);
}

/// An imported inflight row: inflight +1, bytes +size.
pub fn import_inflight(tx: &mut Tx, row: &InflightRow) {
    tx.put_inflight(row);
    tx.delta(row.key.ord, CounterField::Bytes, row.size as i64);
}

/// An imported dead row: `?x` rewritten with the ord in its value, and `?X`; dead +1,
/// bytes +size.
pub fn import_dead(tx: &mut Tx, row: &DeadRow) {
    tx.op(Op::put(
        Cf::Index,
        ankusa_keyspace::dead(&row.key),
        row.value.encode(),
    ));
    tx.op(Op::put(
        Cf::Index,
        ankusa_keyspace::dead_by_tenant(row.value.ord, &row.key),
        Vec::new(),
    ));
    tx.delta(row.value.ord, CounterField::Dead, 1);
    tx.delta(row.value.ord, CounterField::Bytes, row.value.size as i64);
}

/// An imported archive obligation, rewritten with the ord in its value: archive_pending +1.
pub fn import_archive(tx: &mut Tx, ob: &ArchiveObligation) {
    let mut v = ob.size.to_be_bytes().to_vec();
    v.extend_from_slice(&ob.ord.0.to_be_bytes());
    tx.op(Op::put(Cf::Index, ankusa_keyspace::archive(ob.seq), v));
    tx.delta(ob.ord, CounterField::ArchivePending, 1);
}
