//! Reclaim: removes a hook when no delivery row, dead row or archive obligation still
//! needs it.
//!
//! Every transition that removes a delivery row or settles an archive obligation leaves a
//! `?c` cleared marker on the hook, except the delivered outcome of a hook's last row,
//! which takes the hook with it (`deliveries::last_needs`: the common case of
//! one sink and no archive never reaches reclaim). A pass reads up to `limit` markers; for
//! each, if the hook has no delivery row left (due, inflight and dead rows all keep
//! theirs) and no `?a`, the hook goes; the marker goes either way (a later settlement puts
//! a new one). Hook seqs are never reused, so a marker can never point at a newer hook.
//!
//! A [`Reclaimer`] keeps a cursor: its passes sweep the markers forward from where the
//! last one stopped, so the markers a pass deleted (tombstones until compaction) are not
//! walked again by the next; once a sweep reaches the end it starts over from the first
//! marker (later settlements of older hooks put markers behind the cursor), and after a
//! sweep that deleted many markers it compacts their span, so an idle node's passes cost
//! one seek.

use super::deliveries;
use ankusa_keyspace::Cf;
use ankusa_keyspace::Family;
use ankusa_store::Dir;
use ankusa_store::{Op, Rows, Store};

use crate::QueueError;

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReclaimReport {
    pub markers: u64,
    pub hooks_removed: u64,
}

/// One bounded pass over the cleared markers, from the first.
pub fn reclaim_pass(store: &Store, limit: usize) -> Result<ReclaimReport, QueueError> {
    Reclaimer::default().pass(store, limit)
}

/// Markers deleted since the last compaction of their span past which a finished sweep
/// compacts it.
const COMPACT_AFTER: u64 = 10_000;

/// Reclaim passes that sweep the markers with a cursor (see the module's docs).
#[derive(Debug)]
pub struct Reclaimer {
    /// Where the next pass starts; `None`: at the first marker.
    cursor: Option<ankusa_keyspace::Seq>,
    /// Markers deleted since their span was last compacted.
    deleted: u64,
    compact_after: u64,
}

impl Default for Reclaimer {
    fn default() -> Self {
        Reclaimer::compacting_after(COMPACT_AFTER)
    }
}

impl Reclaimer {
    /// A reclaimer that compacts the markers' span after a sweep once `n` markers were
    /// deleted since the last compaction.
    pub fn compacting_after(n: u64) -> Self {
        Reclaimer {
            cursor: None,
            deleted: 0,
            compact_after: n,
        }
    }

    /// One pass of at most `limit` markers. A short pass ends the sweep: the next starts
    /// from the first marker again.
    pub fn pass(&mut self, store: &Store, limit: usize) -> Result<ReclaimReport, QueueError> {
        let (lo, end) = Family::Cleared.bounds();
        let from = self.cursor.map_or(lo, ankusa_keyspace::cleared);
        let seqs: Vec<ankusa_keyspace::Seq> = store
            .scan(Family::Cleared, &from, &end, Dir::Forward)?
            .take(limit)
            .map(|kv| Ok(ankusa_keyspace::decode_cleared(&kv?.0)?))
            .collect::<Result<_, QueueError>>()?;
        let report = remove(store, &seqs)?;
        self.deleted += report.markers;
        if seqs.len() < limit {
            self.cursor = None;
            if self.deleted >= self.compact_after {
                let (lo, end) = Family::Cleared.bounds();
                store.compact_range(Cf::Index, &lo, &end);
                self.deleted = 0;
            }
        } else {
            self.cursor = seqs.last().map(|s| ankusa_keyspace::Seq(s.0 + 1));
        }
        Ok(report)
    }
}

/// Looks at the hooks of `seqs`' markers: removes each hook nothing needs, and every marker.
fn remove(store: &Store, seqs: &[ankusa_keyspace::Seq]) -> Result<ReclaimReport, QueueError> {
    let mut report = ReclaimReport::default();
    let mut ops = Vec::with_capacity(seqs.len() * 2);
    let mut unneeded = Vec::new();
    for &seq in seqs {
        report.markers += 1;
        ops.push(Op::delete(Cf::Index, ankusa_keyspace::cleared(seq)));
        let (from, to) = ankusa_keyspace::deliveries_of_hook(seq);
        let has_rows = store
            .first(Family::Deliveries, &from, &to, Dir::Forward)?
            .is_some();
        if !has_rows && !deliveries::has_archive_obligation(store, seq)? {
            unneeded.push(ankusa_keyspace::hook(seq));
        }
    }
    // A hook whose last row's outcome took it along (`delivered_last`) may still
    // have a marker an earlier row left: it is not counted twice.
    let present = store.multi_get(Cf::Hooks, &unneeded)?;
    for (key, hook) in unneeded.into_iter().zip(present) {
        if hook.is_some() {
            ops.push(Op::delete(Cf::Hooks, key));
            report.hooks_removed += 1;
        }
    }
    if !ops.is_empty() {
        store.write(ops, false)?;
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deliveries::{claim, delivered, Tx};
    use crate::testkit::Harness;
    use ankusa_store::tombstones_walked;

    /// 3 000 delivered hooks leave 3 000 markers: passes of 1 000 sweep them with a cursor
    /// (no pass walks what the one before deleted), every hook goes, and once the sweep
    /// compacted their span an idle pass steps over no tombstone — without compaction it
    /// would step over all 3 000, every interval, until RocksDB got round to it.
    #[test]
    fn a_sweep_never_rewalks_what_it_deleted_and_an_idle_pass_is_one_seek() {
        let mut h = Harness::new();
        for i in 0..3_000u64 {
            h.ingest(Some("t"), 1, 1_000 + i, false);
        }
        let rows = h.due_rows();
        h.commit(|tx: &mut Tx| {
            for r in &rows {
                let inflight = claim(tx, r);
                delivered(tx, &inflight);
            }
        });
        let mut r = Reclaimer::compacting_after(3_000);
        let mut removed = 0;
        for pass in 0..3 {
            let (report, walked) = tombstones_walked(|| r.pass(&h.store, 1_000).unwrap());
            assert_eq!(report.markers, 1_000, "pass {pass}");
            removed += report.hooks_removed;
            // Each hook's own delivery row is a tombstone its point check may see; the
            // markers the earlier passes deleted are not walked.
            assert!(walked <= 2_000, "pass {pass} walked {walked} tombstones");
        }
        assert_eq!(removed, 3_000);
        // The short pass ends the sweep and compacts the span; idle passes cost nothing.
        assert_eq!(r.pass(&h.store, 1_000).unwrap().markers, 0);
        let (report, walked) = tombstones_walked(|| r.pass(&h.store, 1_000).unwrap());
        assert_eq!(report.markers, 0);
        assert_eq!(walked, 0);
        h.assert_counters_equal_fold();
        assert_eq!(h.store.scan_family(Family::Hooks).unwrap().count(), 0);
    }
}
