//! Every transition of a delivery between its states, as an op builder on a [`Tx`].
// Builds the queue's index keys: this module is part of `deliveries` (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::*;
use ankusa_store::keys::{
    self, AtMs, CounterField, DeadKey, DueKey, InflightKey, Seq, SinkIdx, TenantOrd,
};
use ankusa_store::{Cf, Op};

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
}

/// Ingest: the hook, one delivery row and one due row (kind 0, due at receipt) per sink,
/// and the archive obligation. Returns the encoded size every row counts.
pub fn ingest(tx: &mut Tx, h: &NewHook<'_>) -> u32 {
    let env = h.envelope.encode();
    let size = env.len() as u32;
    tx.op(Op::put(Cf::Hooks, keys::hook(h.seq), env));
    for i in 0..h.envelope.sinks.len() {
        add_delivery(
            tx,
            h.ord,
            h.seq,
            SinkIdx(i as u16),
            size,
            h.envelope.received_at,
        );
    }
    if h.archive {
        let mut v = size.to_be_bytes().to_vec();
        v.extend_from_slice(&h.ord.0.to_be_bytes());
        tx.op(Op::put(Cf::Index, keys::archive(h.seq), v));
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
    let row = DeliveryRow {
        ord,
        size,
        ..DeliveryRow::default()
    };
    tx.op(Op::put(
        Cf::Deliveries,
        keys::delivery(seq, sink),
        row.encode(),
    ));
    tx.delta(ord, CounterField::Bytes, size as i64);
    tx.enqueue(&DueRow {
        key: DueKey { ord, at, seq, sink },
        size,
        kind: Kind::First,
    });
}

/// Expand: a new delivery of an existing hook to sink `sink` (rows imported from an older
/// release, or a route gaining a sink), due at `at` as a first attempt.
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

/// Retry: inflight → due at `at` with kind 1; the delivery row records the attempt.
pub fn retry(tx: &mut Tx, row: &InflightRow, at: AtMs, updated: &DeliveryRow) {
    tx.delete_inflight(row);
    tx.op(Op::put(
        Cf::Deliveries,
        keys::delivery(row.key.seq, row.key.sink),
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
            keys::delivery(row.key.seq, row.key.sink),
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
        keys::dead(&dead.key),
        dead.value.encode(),
    ));
    tx.op(Op::put(
        Cf::Index,
        keys::dead_by_tenant(row.key.ord, &dead.key),
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
    tx.consume(keys::dead(&row.key), None);
    tx.op(Op::delete(Cf::Index, keys::dead(&row.key)));
    tx.op(Op::delete(
        Cf::Index,
        keys::dead_by_tenant(row.value.ord, &row.key),
    ));
    tx.delta(row.value.ord, CounterField::Dead, -1);
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
        let seq = keys::decode_archive(key)?;
        match value {
            [a, b, c, d, e, f, g, h] => Ok(ArchiveObligation {
                seq,
                size: u32::from_be_bytes([*a, *b, *c, *d]),
                ord: TenantOrd(u32::from_be_bytes([*e, *f, *g, *h])),
            }),
            _ => Err(QueueError::corrupt(
                ankusa_store::Family::Archive,
                format!("bad value {}", keys::hex(value)),
            )),
        }
    }
}

/// Archive settle: the hook is archived; the obligation goes and reclaim may look. A unit:
/// it (and what rides with it, [`Tx::unit_op`]) commits only if the obligation is there.
pub fn archive_settle(tx: &mut Tx, ob: &ArchiveObligation) {
    tx.consume(keys::archive(ob.seq), None);
    tx.op(Op::delete(Cf::Index, keys::archive(ob.seq)));
    tx.op(Op::put(Cf::Index, keys::cleared(ob.seq), Vec::new()));
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
    tx.op(Op::put(Cf::Index, keys::dead(&row.key), row.value.encode()));
    tx.op(Op::put(
        Cf::Index,
        keys::dead_by_tenant(row.value.ord, &row.key),
        Vec::new(),
    ));
    tx.delta(row.value.ord, CounterField::Dead, 1);
    tx.delta(row.value.ord, CounterField::Bytes, row.value.size as i64);
}

/// An imported archive obligation, rewritten with the ord in its value: archive_pending +1.
pub fn import_archive(tx: &mut Tx, ob: &ArchiveObligation) {
    let mut v = ob.size.to_be_bytes().to_vec();
    v.extend_from_slice(&ob.ord.0.to_be_bytes());
    tx.op(Op::put(Cf::Index, keys::archive(ob.seq), v));
    tx.delta(ob.ord, CounterField::ArchivePending, 1);
}
