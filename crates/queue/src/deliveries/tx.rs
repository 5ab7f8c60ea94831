//! [`Tx`]: one atomic batch of transitions, its units and their check at commit.
// Builds the queue's index keys: this module is part of `deliveries` (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::{due_value, DueRow, InflightRow};
use crate::counters::{self, Delta};
use crate::Change;
use ankusa_keyspace::Cf;
use ankusa_keyspace::{CounterField, Seq, SinkIdx, TenantOrd};
use ankusa_store::{Op, Rows, Store};

use crate::QueueError;

/// One atomic batch of queue transitions: ops plus the counter deltas they imply.
///
/// A transition that consumes a row (claim, an outcome, revive, recover, purge: every
/// delete of a due, inflight or dead row) is a *unit* that commits only if that row still
/// exists when the batch commits. [`Tx::commit`] checks every unit's row and writes the
/// batch inside one critical section of the store's transition lock, so two writers that
/// read the same row (two replays, a purge and a claim, a replay and a purge) move it
/// once between them, and only the transitions that moved a row count.
#[derive(Debug, Default)]
pub struct Tx {
    /// Ops and deltas of no unit: creations (ingest, imports) and [`Tx::push_op`].
    ops: Vec<Op>,
    deltas: Vec<Delta>,
    units: Vec<Unit>,
}

/// One consuming transition: the `Index` key of the row it consumes, the value the row
/// had when it was read (where the deltas depend on it: a due row's kind), and what it
/// writes.
#[derive(Debug)]
struct Unit {
    consumes: Vec<u8>,
    expects: Option<Vec<u8>>,
    /// Further `Index` rows the unit consumes with its own (a pull delivery's lease with
    /// its inflight row): all must be there, as read, or the unit is left out.
    also: Vec<(Vec<u8>, Option<Vec<u8>>)>,
    ops: Vec<Op>,
    deltas: Vec<Delta>,
}

/// The `Index` key and value an op puts, if it puts one.
pub(super) fn index_put(op: &Op) -> Option<(Vec<u8>, Vec<u8>)> {
    match op {
        Op::Put {
            cf: Cf::Index,
            key,
            value,
        } => Some((key.clone(), value.clone())),
        _ => None,
    }
}

/// What [`Tx::commit`] did: for each consuming transition, in the order they were added,
/// whether its row was still there (and so it moved).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    pub moved: Vec<bool>,
}

impl Committed {
    /// How many consuming transitions moved their row.
    pub fn count(&self) -> u64 {
        self.moved.iter().filter(|m| **m).count() as u64
    }
}

impl Tx {
    pub fn new() -> Self {
        Tx::default()
    }

    /// An op outside the queue index (tenant allocation, dedupe keys, audit rows, a
    /// migration cursor) that must commit with this batch, whatever its units do.
    pub(crate) fn push_op(&mut self, op: Op) {
        self.ops.push(op);
    }

    /// A change the queue built elsewhere (an audit row, a tenant's pause) that must
    /// commit with this batch, whatever its units do.
    pub fn push(&mut self, change: Change) {
        self.ops.push(change.0);
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.deltas.is_empty() && self.units.is_empty()
    }

    /// The batch with every unit in it, unchecked: for a single writer (a migration, a
    /// fixture) that owns the whole store. Every op, then the coalesced counter merges.
    pub fn into_ops(self) -> Vec<Op> {
        let (mut ops, mut deltas) = (self.ops, self.deltas);
        for u in self.units {
            ops.extend(u.ops);
            deltas.extend(u.deltas);
        }
        ops.extend(counters::ops(&deltas));
        ops
    }

    /// Checks each unit's row and writes the batch, both under the store's transition
    /// lock: a unit whose row is gone (another writer moved it first), or that consumes
    /// a row an earlier unit of this batch consumed, is left out with its deltas. A batch
    /// with no unit (ingest: creations only) has nothing to check and writes without the
    /// lock, so the writer's synced commits never wait on dispatch or admin commits.
    pub fn commit(self, store: &Store, sync: bool) -> Result<Committed, QueueError> {
        if self.is_empty() {
            return Ok(Committed::default());
        }
        if self.units.is_empty() {
            store.write(self.into_ops(), sync)?;
            return Ok(Committed::default());
        }
        let _serialised = store.transition_lock();
        let wanted: Vec<Vec<u8>> = self.units.iter().map(|u| u.consumes.clone()).collect();
        let present = store.multi_get(Cf::Index, &wanted)?;
        let also_keys: Vec<Vec<u8>> = self
            .units
            .iter()
            .flat_map(|u| u.also.iter().map(|(k, _)| k.clone()))
            .collect();
        let mut also_present = if also_keys.is_empty() {
            Vec::new()
        } else {
            store.multi_get(Cf::Index, &also_keys)?
        }
        .into_iter();
        let mut ops = self.ops;
        let mut deltas = self.deltas;
        // Rows this batch itself writes before a unit consumes them (a claim and its
        // outcome in one batch) are there for that unit.
        let mut created: std::collections::HashMap<Vec<u8>, Vec<u8>> =
            ops.iter().filter_map(index_put).collect();
        let mut consumed = std::collections::HashSet::new();
        let mut moved = Vec::with_capacity(self.units.len());
        // The row is there, and as it was read: the same key written again since with
        // another value (a due row that became a retry under the same key) is not the
        // row this unit's deltas describe.
        let as_read = |have: Option<&[u8]>, expects: &Option<Vec<u8>>| match (have, expects) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(v), Some(e)) => v == e.as_slice(),
        };
        for (u, p) in self.units.into_iter().zip(present) {
            let also: Vec<Option<Vec<u8>>> = (&mut also_present).take(u.also.len()).collect();
            let also_ok = u
                .also
                .iter()
                .zip(&also)
                .all(|((k, e), have)| !consumed.contains(k) && as_read(have.as_deref(), e));
            let ok = also_ok
                && match created.remove(&u.consumes) {
                    Some(v) => as_read(Some(&v), &u.expects),
                    None => {
                        as_read(p.as_deref(), &u.expects) && consumed.insert(u.consumes.clone())
                    }
                };
            if ok {
                consumed.extend(u.also.iter().map(|(k, _)| k.clone()));
            }
            if ok {
                created.extend(u.ops.iter().filter_map(index_put));
                ops.extend(u.ops);
                deltas.extend(u.deltas);
            }
            moved.push(ok);
        }
        ops.extend(counters::ops(&deltas));
        if !ops.is_empty() {
            store.write(ops, sync)?;
        }
        Ok(Committed { moved })
    }

    /// Starts a unit: what follows (until the next unit) commits only if `key` is there
    /// (and, with `expects`, holds that value).
    pub(super) fn consume(&mut self, key: Vec<u8>, expects: Option<Vec<u8>>) {
        self.units.push(Unit {
            consumes: key,
            expects,
            also: Vec::new(),
            ops: Vec::new(),
            deltas: Vec::new(),
        });
    }

    /// The unit just added also consumes `key` (an `Index` row), which must be there (and,
    /// with `expects`, hold that value) for the unit to commit.
    pub(super) fn consume_also(&mut self, key: Vec<u8>, expects: Option<Vec<u8>>) {
        if let Some(u) = self.units.last_mut() {
            u.also.push((key, expects));
        }
    }

    /// An op that rides with the transition just added: it commits only if that
    /// transition's row moves (the hook log's events).
    pub(crate) fn unit_op(&mut self, op: Op) {
        self.op(op);
    }

    /// An op of the current unit (or of none).
    pub(super) fn op(&mut self, op: Op) {
        match self.units.last_mut() {
            Some(u) => u.ops.push(op),
            None => self.ops.push(op),
        }
    }

    pub(super) fn delta(&mut self, ord: TenantOrd, field: CounterField, d: i64) {
        let delta = Delta::new(ord, field, d);
        match self.units.last_mut() {
            Some(u) => u.deltas.push(delta),
            None => self.deltas.push(delta),
        }
    }

    /// Puts a due row and its active marker: the only way a due row is
    /// written. Counts it as pending (kind 0) or scheduled (kind 1).
    pub(super) fn enqueue(&mut self, row: &DueRow) {
        self.op(Op::put(
            Cf::Index,
            ankusa_keyspace::due(&row.key),
            due_value(row),
        ));
        self.op(Op::put(
            Cf::Index,
            ankusa_keyspace::active(row.key.at.bucket(), row.key.ord),
            Vec::new(),
        ));
        self.delta(row.key.ord, row.kind.field(), 1);
    }

    pub(super) fn put_inflight(&mut self, row: &InflightRow) {
        self.op(Op::put(
            Cf::Index,
            ankusa_keyspace::inflight(&row.key),
            row.size.to_be_bytes(),
        ));
        self.delta(row.key.ord, CounterField::Inflight, 1);
    }

    pub(super) fn delete_inflight(&mut self, row: &InflightRow) {
        self.consume(ankusa_keyspace::inflight(&row.key), None);
        self.op(Op::delete(Cf::Index, ankusa_keyspace::inflight(&row.key)));
        self.delta(row.key.ord, CounterField::Inflight, -1);
    }

    pub(super) fn delete_due(&mut self, row: &DueRow) {
        // Its kind decides which counter goes down: the row must still be that kind.
        self.consume(ankusa_keyspace::due(&row.key), Some(due_value(row)));
        self.op(Op::delete(Cf::Index, ankusa_keyspace::due(&row.key)));
        self.delta(row.key.ord, row.kind.field(), -1);
    }

    /// Deletes a delivery row, gives back its bytes, and leaves a `?c` marker so reclaim
    /// looks at the hook.
    pub(super) fn drop_row(&mut self, ord: TenantOrd, seq: Seq, sink: SinkIdx, size: u32) {
        self.op(Op::delete(
            Cf::Deliveries,
            ankusa_keyspace::delivery(seq, sink),
        ));
        self.op(Op::put(
            Cf::Index,
            ankusa_keyspace::cleared(seq),
            Vec::new(),
        ));
        self.delta(ord, CounterField::Bytes, -(size as i64));
    }

    /// Deletes a hook's last delivery row and gives back its bytes, and the hook with it
    /// (nothing else needs it: [`last_needs`] checked).
    pub(super) fn drop_last_row(&mut self, ord: TenantOrd, seq: Seq, sink: SinkIdx, size: u32) {
        self.op(Op::delete(
            Cf::Deliveries,
            ankusa_keyspace::delivery(seq, sink),
        ));
        self.op(Op::delete(Cf::Hooks, ankusa_keyspace::hook(seq)));
        self.delta(ord, CounterField::Bytes, -(size as i64));
    }
}
