//! The dispatch tick's planning half (ADR section 5).
//!
//! `active_tenants(now, 4096)` gives the tenants with a marker at or before now, oldest
//! second first; for each, `due_for_tenant` from the tenant's in-memory cursor takes its
//! rows oldest first until the per-tenant, per-tick row and byte budgets are spent.
//! Cross-tenant order is therefore "oldest second first"; within a tenant, oldest first.
//!
//! Cursors (`ord → floor at`) live only in memory, for tenants that are active; a tenant
//! that drains loses its cursor, and after a restart every cursor starts at 0, which only
//! costs a scan over rows already known to be gone.

use std::collections::HashMap;

use crate::queue::deliveries::{self, DueRow};
use crate::store::keys::{AtMs, Bucket, TenantOrd};
use crate::store::{Store, StoreError};

/// A tick's budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickLimits {
    /// Active markers read per tick (ADR: 4 096).
    pub max_markers: usize,
    /// Rows claimed per tick across all tenants.
    pub rows_per_tick: usize,
    /// Rows claimed per tenant per tick.
    pub rows_per_tenant: usize,
    /// Bytes claimed per tick across all tenants.
    pub bytes_per_tick: u64,
}

impl Default for TickLimits {
    fn default() -> Self {
        TickLimits {
            max_markers: 4096,
            rows_per_tick: 1024,
            rows_per_tenant: 256,
            bytes_per_tick: 16 << 20,
        }
    }
}

/// One tenant's share of a tick.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantWork {
    pub ord: TenantOrd,
    /// The markers the scan saw (for the cleanup after claiming).
    pub buckets: Vec<Bucket>,
    /// Rows to claim, oldest first.
    pub rows: Vec<DueRow>,
}

/// What a tick will do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickPlan {
    pub work: Vec<TenantWork>,
    /// Distinct tenants the tick looked at (`ankusa_dispatch_active_tenants`).
    pub tenants_visited: usize,
}

/// The pipeline's per-tenant scan cursors, bounded by the tenants the last ticks saw.
#[derive(Debug, Default)]
pub struct Cursors {
    floors: HashMap<TenantOrd, AtMs>,
}

impl Cursors {
    /// The most cursors kept; past it the map is cleared (a cursor is only a hint).
    pub const CAPACITY: usize = 65_536;

    pub fn floor(&self, ord: TenantOrd) -> AtMs {
        self.floors.get(&ord).copied().unwrap_or(AtMs(0))
    }
    /// After claiming `rows` of a tenant: the next scan starts at the last claimed `at`.
    pub fn advance(&mut self, ord: TenantOrd, at: AtMs) {
        if self.floors.len() >= Self::CAPACITY && !self.floors.contains_key(&ord) {
            self.floors.clear();
        }
        self.floors.insert(ord, at);
    }
    /// A tenant with nothing due drops its cursor.
    pub fn evict(&mut self, ord: TenantOrd) {
        self.floors.remove(&ord);
    }
    pub fn len(&self) -> usize {
        self.floors.len()
    }
    pub fn is_empty(&self) -> bool {
        self.floors.is_empty()
    }
}

/// Plans one tick: reads the active index and each visited tenant's due rows. Reads only;
/// claiming and the marker cleanup follow in the pipeline.
pub fn plan_tick(
    store: &Store,
    now: AtMs,
    limits: &TickLimits,
    cursors: &Cursors,
) -> Result<TickPlan, StoreError> {
    let active = deliveries::active_tenants(store, now, limits.max_markers)?;
    let mut plan = TickPlan::default();
    let mut rows_left = limits.rows_per_tick;
    let mut bytes_left = limits.bytes_per_tick;
    for t in active {
        if rows_left == 0 || bytes_left == 0 {
            break;
        }
        plan.tenants_visited += 1;
        let rows = deliveries::due_for_tenant(
            store,
            t.ord,
            now,
            cursors.floor(t.ord),
            limits.rows_per_tenant.min(rows_left),
            bytes_left,
        )?;
        rows_left -= rows.len();
        bytes_left = bytes_left.saturating_sub(rows.iter().map(|r| u64::from(r.size)).sum::<u64>());
        plan.work.push(TenantWork {
            ord: t.ord,
            buckets: t.buckets,
            rows,
        });
    }
    Ok(plan)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::queue::deliveries::{claim, cleanup_markers, Tx};
    use crate::queue::testkit::Harness;
    use crate::store::keys::Family;

    #[test]
    fn a_tick_visits_only_tenants_with_work() {
        let mut h = Harness::new();
        let now = 10_000_000u64;
        for t in 0..1_000u64 {
            let name = format!("tenant-{t}");
            // 3 tenants with rows due now; the others' rows are due in an hour.
            let at = if t % 333 == 7 {
                now - 2_000
            } else {
                now + 3_600_000
            };
            h.ingest(Some(&name), 1, at, false);
        }
        let before = h.store.stats();
        let plan = plan_tick(
            &h.store,
            AtMs(now),
            &TickLimits::default(),
            &Cursors::default(),
        )
        .unwrap();
        let d = h.store.stats().since(&before);
        assert_eq!(plan.tenants_visited, 3);
        assert_eq!(plan.work.iter().map(|w| w.rows.len()).sum::<usize>(), 3);
        assert_eq!(d.scans_of(Family::Active), 1);
        assert_eq!(
            d.scans_of(Family::Due),
            3,
            "one due_for_tenant per tenant with work"
        );
    }

    #[test]
    fn the_tick_claims_oldest_second_first_across_tenants_and_oldest_first_within_one() {
        let mut h = Harness::new();
        // b's oldest row is in an older second than a's; within a second, rows of
        // different tenants are in ordinal order (a was seen first).
        h.ingest(Some("a"), 1, 5_300, false);
        h.ingest(Some("a"), 1, 5_100, false);
        h.ingest(Some("b"), 1, 4_900, false);
        h.ingest(Some("b"), 1, 5_050, false);
        h.ingest(Some("c"), 1, 5_000, false);
        let plan = plan_tick(
            &h.store,
            AtMs(6_000),
            &TickLimits::default(),
            &Cursors::default(),
        )
        .unwrap();
        let order: Vec<(u32, u64)> = plan
            .work
            .iter()
            .flat_map(|w| w.rows.iter().map(|r| (r.key.ord.0, r.key.at.0)))
            .collect();
        let (a, b, c) = (h.ord("a").0, h.ord("b").0, h.ord("c").0);
        // b (second 4) first; then a and c, both first due in second 5, in ordinal order.
        assert_eq!(
            order,
            vec![(b, 4_900), (b, 5_050), (a, 5_100), (a, 5_300), (c, 5_000)]
        );
    }

    #[test]
    fn budgets_and_cursors_bound_a_tick() {
        let mut h = Harness::new();
        for i in 0..50 {
            h.ingest(Some("a"), 1, 1_000 + i, false);
            h.ingest(Some("b"), 1, 1_000 + i, false);
        }
        let limits = TickLimits {
            rows_per_tick: 30,
            rows_per_tenant: 20,
            ..TickLimits::default()
        };
        let plan = plan_tick(&h.store, AtMs(9_000), &limits, &Cursors::default()).unwrap();
        let sizes: Vec<usize> = plan.work.iter().map(|w| w.rows.len()).collect();
        assert_eq!(sizes, vec![20, 10]);

        // Claim a's rows and advance its cursor: the next tick starts past them.
        let a = h.ord("a");
        let mut cursors = Cursors::default();
        let mut tx = Tx::new();
        for r in &plan.work[0].rows {
            claim(&mut tx, r);
        }
        tx.commit(&h.store, false).unwrap();
        cursors.advance(a, plan.work[0].rows.last().unwrap().key.at);
        cleanup_markers(&h.store, a, &plan.work[0].buckets, AtMs(9_000)).unwrap();
        let next = plan_tick(&h.store, AtMs(9_000), &limits, &cursors).unwrap();
        let a_rows = &next.work.iter().find(|w| w.ord == a).unwrap().rows;
        assert_eq!(a_rows[0].key.at, AtMs(1_020));
        h.assert_every_due_row_has_its_marker();
    }
}
