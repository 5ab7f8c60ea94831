//! Reclaim: removes a hook when no delivery row, dead row or archive obligation still
//! needs it.
//!
//! Every transition that removes a delivery row or settles an archive obligation leaves a
//! `?c` cleared marker on the hook. A pass reads up to `limit` markers; for each, if the
//! hook has no delivery row left (due, inflight and dead rows all keep theirs) and no
//! `?a`, the hook goes; the marker goes either way (a later settlement puts a new one).
//! Hook seqs are never reused, so a marker can never point at a newer hook.

use super::deliveries;
use crate::store::keys::{self, Family};
use crate::store::Dir;
use crate::store::{Cf, Op, Store, StoreError};

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    pub markers: u64,
    pub hooks_removed: u64,
}

/// One bounded pass over the cleared markers.
pub fn reclaim_pass(store: &Store, limit: usize) -> Result<ReclaimReport, StoreError> {
    let (lo, end) = Family::Cleared.bounds();
    let seqs: Vec<keys::Seq> = store
        .scan(Family::Cleared, &lo, &end, Dir::Forward)?
        .take(limit)
        .map(|kv| Ok(keys::decode_cleared(&kv?.0)?))
        .collect::<Result<_, StoreError>>()?;
    let mut report = ReclaimReport::default();
    let mut ops = Vec::with_capacity(seqs.len() * 2);
    for seq in seqs {
        report.markers += 1;
        ops.push(Op::delete(Cf::Index, keys::cleared(seq)));
        let (from, to) = keys::deliveries_of_hook(seq);
        let has_rows = store
            .first(Family::Deliveries, &from, &to, Dir::Forward)?
            .is_some();
        if !has_rows && !deliveries::has_archive_obligation(store, seq)? {
            ops.push(Op::delete(Cf::Hooks, keys::hook(seq)));
            report.hooks_removed += 1;
        }
    }
    if !ops.is_empty() {
        store.write(ops, false)?;
    }
    Ok(report)
}
