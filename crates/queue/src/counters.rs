//! The six per-tenant counters as blind merge operands (docs/storage.md, "Counters and the merge operator").
//!
//! | field | + | − |
//! |---|---|---|
//! | pending (due rows, kind 0) | ingest, revive, recover, expand | claim of kind 0, purge |
//! | scheduled (due rows, kind 1) | retry | claim of kind 1, purge |
//! | inflight | claim | delivered, retry, dead-letter, orphan drop, recover |
//! | dead | dead-letter | revive, purge |
//! | bytes (Σ size of existing delivery rows) | ingest, expand | delivered, orphan drop, purge |
//! | archive_pending | ingest with the archive on | archive settle or drop |
//!
//! [`ops`] coalesces a batch's deltas per `(ord, field)` and mirrors each into ord 0, the
//! node aggregate, so the aggregate is exactly the sum of the tenants.

use std::collections::BTreeMap;

use ankusa_keyspace::Cf;
use ankusa_keyspace::{CounterField, TenantOrd};
use ankusa_store::{merge, Op, Rows, Store};

use crate::QueueError;

/// One counter change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delta {
    pub ord: TenantOrd,
    pub field: CounterField,
    pub delta: i64,
}

impl Delta {
    pub fn new(ord: TenantOrd, field: CounterField, delta: i64) -> Self {
        Delta { ord, field, delta }
    }
}

/// The merge ops for a batch's deltas: coalesced per `(ord, field)`, mirrored into ord 0,
/// zero sums dropped.
pub fn ops(deltas: &[Delta]) -> Vec<Op> {
    let mut sums: BTreeMap<(TenantOrd, CounterField), i64> = BTreeMap::new();
    for d in deltas {
        if d.ord != TenantOrd::AGGREGATE {
            *sums.entry((d.ord, d.field)).or_default() += d.delta;
        }
        *sums.entry((TenantOrd::AGGREGATE, d.field)).or_default() += d.delta;
    }
    sums.into_iter()
        .filter(|(_, v)| *v != 0)
        .map(|((ord, field), v)| Op::Merge {
            cf: Cf::Counters,
            key: ankusa_keyspace::counter(ord, field),
            operand: merge::encode(v).to_vec(),
        })
        .collect()
}

/// The six queue counters of a tenant, or of a node (every tenant's summed into ord 0),
/// as the queue keeps them. What the node's API serves is its own wire type
/// (`ankusa_api::node::Counters`), made from this one.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// First-attempt rows waiting.
    pub pending: i64,
    /// Retry rows waiting.
    pub scheduled: i64,
    pub inflight: i64,
    pub dead: i64,
    /// Σ size of every existing delivery row.
    pub bytes: i64,
    pub archive_pending: i64,
}

impl Counters {
    /// One counter by its field.
    pub fn get(&self, f: CounterField) -> i64 {
        match f {
            CounterField::Pending => self.pending,
            CounterField::Scheduled => self.scheduled,
            CounterField::Inflight => self.inflight,
            CounterField::Dead => self.dead,
            CounterField::Bytes => self.bytes,
            CounterField::ArchivePending => self.archive_pending,
        }
    }

    /// Adds `d` to one counter.
    pub fn add(&mut self, f: CounterField, d: i64) {
        let slot = match f {
            CounterField::Pending => &mut self.pending,
            CounterField::Scheduled => &mut self.scheduled,
            CounterField::Inflight => &mut self.inflight,
            CounterField::Dead => &mut self.dead,
            CounterField::Bytes => &mut self.bytes,
            CounterField::ArchivePending => &mut self.archive_pending,
        };
        *slot += d;
    }
}

/// The six counters of one ordinal: one `multi_get` of six point reads.
pub fn read(store: &Store, ord: TenantOrd) -> Result<Counters, QueueError> {
    let keys: Vec<Vec<u8>> = CounterField::ALL
        .iter()
        .map(|f| ankusa_keyspace::counter(ord, *f))
        .collect();
    let vals = store.multi_get(Cf::Counters, &keys)?;
    let mut c = Counters::default();
    for (f, v) in CounterField::ALL.iter().zip(vals) {
        if let Some(v) = v {
            let n = merge::decode(&v).ok_or_else(|| {
                QueueError::corrupt(
                    ankusa_keyspace::Family::Counters,
                    format!("undecodable value for ord {} {}", ord.0, f.name()),
                )
            })?;
            c.add(*f, n);
        }
    }
    Ok(c)
}

/// One counter of one ordinal: one point read.
pub fn read_field(store: &Store, ord: TenantOrd, field: CounterField) -> Result<i64, QueueError> {
    match store.get(Cf::Counters, &ankusa_keyspace::counter(ord, field))? {
        None => Ok(0),
        Some(v) => merge::decode(&v).ok_or_else(|| {
            QueueError::corrupt(
                ankusa_keyspace::Family::Counters,
                format!("undecodable value for ord {} {}", ord.0, field.name()),
            )
        }),
    }
}

/// The node aggregate (ord 0).
pub fn node(store: &Store) -> Result<Counters, QueueError> {
    read(store, TenantOrd::AGGREGATE)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_coalesce_and_mirror_into_the_aggregate() {
        let t = TenantOrd(4);
        let ops = ops(&[
            Delta::new(t, CounterField::Pending, 1),
            Delta::new(t, CounterField::Pending, 1),
            Delta::new(TenantOrd(5), CounterField::Pending, -2),
            Delta::new(t, CounterField::Bytes, 10),
            Delta::new(t, CounterField::Bytes, -10),
        ]);
        let got: Vec<(Vec<u8>, i64)> = ops
            .into_iter()
            .map(|op| match op {
                Op::Merge { key, operand, .. } => (key, merge::decode(&operand).unwrap()),
                other => panic!("{other:?}"),
            })
            .collect();
        // The aggregate's pending sums to zero and is dropped, like t's bytes.
        assert_eq!(
            got,
            vec![
                (ankusa_keyspace::counter(t, CounterField::Pending), 2),
                (
                    ankusa_keyspace::counter(TenantOrd(5), CounterField::Pending),
                    -2
                ),
            ]
        );
    }
}
