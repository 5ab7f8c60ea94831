//! The queue gauges of one tick (docs/storage.md, "Counters and the merge operator" and "The active index").
//!
//! | gauge | source |
//! |---|---|
//! | `ankusa_queue_state{field}` | the six counter rows of ord 0, one `multi_get` |
//! | `ankusa_queue_oldest_due_age_seconds` | the first active marker, verified against its tenant's first due row |
//! | `ankusa_tenant_pending{tenant}` | top [`TOP_TENANTS`] by pending among the first [`ACTIVE_SAMPLE`] distinct tenants in active-index order (at most [`ACTIVE_SAMPLE_MARKERS`] markers read), one counter read each |
//! | `ankusa_tenants` | `m:next_ord - 1` |
//!
//! A tenant with pending work has a marker at or before the current second, so the
//! per-tenant gauge never needs a scan of the counters family.

use ankusa_keyspace::{AtMs, TenantOrd};
use ankusa_queue::counters;
use ankusa_queue::counters::Counters;
use ankusa_queue::engine::Store;
use ankusa_queue::QueueError;
use ankusa_queue::{deliveries, tenants};

/// How many tenants the per-tenant pending gauge reports.
pub const TOP_TENANTS: usize = 100;
/// How many distinct active tenants it looks at.
pub const ACTIVE_SAMPLE: usize = 10_000;
/// The most active markers read to find them (ten per sampled tenant on average).
pub const ACTIVE_SAMPLE_MARKERS: usize = 100_000;

/// One gauge tick's readings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GaugeReading {
    pub node: Counters,
    pub oldest_due_age_ms: u64,
    pub tenants: u32,
    /// `(ord, pending)`, largest first.
    pub top_pending: Vec<(TenantOrd, i64)>,
}

/// Reads every queue gauge.
pub fn read(store: &Store, now: AtMs) -> Result<GaugeReading, QueueError> {
    let node = counters::node(store)?;
    let oldest_due_age_ms =
        deliveries::oldest_due_at(store)?.map_or(0, |at| now.0.saturating_sub(at.0));
    let active =
        deliveries::active_tenants_distinct(store, now, ACTIVE_SAMPLE, ACTIVE_SAMPLE_MARKERS)?;
    let mut top: Vec<(TenantOrd, i64)> = Vec::with_capacity(active.len());
    for t in active {
        let c = counters::read(store, t.ord)?;
        if c.pending > 0 {
            top.push((t.ord, c.pending));
        }
    }
    top.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    top.truncate(TOP_TENANTS);
    Ok(GaugeReading {
        node,
        oldest_due_age_ms,
        tenants: tenants::count(store)?,
        top_pending: top,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use ankusa_keyspace::Family;
    use ankusa_queue::deliveries::{claim, dead_letter};
    use ankusa_queue::testkit::Harness;

    fn busy_harness() -> Harness {
        let mut h = Harness::new();
        for i in 0..40u64 {
            h.ingest(Some("a"), 2, 1_000 + i, i % 2 == 0);
            h.ingest(Some("b"), 1, 2_000 + i, false);
            h.ingest(None, 1, 500_000 + i, false);
        }
        let rows = h.due_rows();
        for r in rows.iter().filter(|r| r.key.ord == h.ord("b")).take(10) {
            h.commit(|tx| {
                let f = claim(tx, r);
                dead_letter(tx, &f, AtMs(3_000), "src", "hk", "s", None);
            });
        }
        h
    }

    #[test]
    fn queue_gauges_read_counters() {
        let h = busy_harness();
        let before = h.store.stats();
        let g = read(&h.store, AtMs(100_000)).unwrap();
        let d = h.store.stats().since(&before);
        for fam in [
            Family::Due,
            Family::Inflight,
            Family::Dead,
            Family::DeadByTenant,
            Family::Archive,
            Family::Counters,
            Family::Hooks,
        ] {
            assert_eq!(d.scans_of(fam), 0, "the gauge tick scanned {fam:?}");
        }
        assert_eq!(
            d.scans_of(Family::Active),
            2,
            "oldest due age and the active sample"
        );
        assert!(d.seeks_of(Family::Due) <= deliveries::OLDEST_DUE_MAX_SKIPS as u64);
        assert_eq!(g.node, ankusa_queue::counters::node(&h.store).unwrap());
        assert_eq!(g.node.pending, 40 * 2 + 30 + 40);
        assert_eq!(g.node.dead, 10);
        assert_eq!(g.node.archive_pending, 20);
        assert_eq!(g.tenants, 3);
        h.assert_counters_equal_fold();
    }

    #[test]
    fn oldest_due_age_comes_from_the_active_index() {
        let h = busy_harness();
        let before = h.store.stats();
        let g = read(&h.store, AtMs(100_000)).unwrap();
        let d = h.store.stats().since(&before);
        assert_eq!(g.oldest_due_age_ms, 100_000 - 1_000);
        assert_eq!(d.seeks_of(Family::Due), 1, "the first marker was live");
        // Nothing due: age 0.
        let empty = Harness::new();
        assert_eq!(read(&empty.store, AtMs(5)).unwrap().oldest_due_age_ms, 0);
    }

    #[test]
    fn top_tenants_by_pending() {
        let h = busy_harness();
        let g = read(&h.store, AtMs(100_000)).unwrap();
        // The default tenant's rows are due in the future: not active yet, not listed.
        assert_eq!(g.top_pending, vec![(h.ord("a"), 80), (h.ord("b"), 30)]);
        let later = read(&h.store, AtMs(600_000)).unwrap();
        assert_eq!(later.top_pending[0], (h.ord("a"), 80));
        assert_eq!(later.top_pending.len(), 3);
    }
}
