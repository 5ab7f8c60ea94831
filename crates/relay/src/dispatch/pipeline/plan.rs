//! The read half of a tick: which tenants have work now and which of their rows to claim,
//! within the tick's budgets, and the in-memory cursors that keep the reads short.

use std::collections::HashMap;

use ankusa_keyspace::{AtMs, Bucket, TenantOrd};
use ankusa_queue::deliveries::{self, DueRow};
use ankusa_queue::engine::Store;
use ankusa_queue::hints::Hinted;
use ankusa_queue::QueueError;

/// A tick's budgets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TickLimits {
    /// Active markers read per tick (4 096 by default).
    pub max_markers: usize,
    /// Rows claimed per tick across all tenants.
    pub rows_per_tick: usize,
    /// Rows claimed per tenant per tick.
    pub rows_per_tenant: usize,
    /// Bytes claimed per tick across all tenants.
    pub bytes_per_tick: u64,
    /// Tenants whose rows one read of a tick reads (each costs a seek even when it finds
    /// nothing): a tick over many tenants is cut into slices, so the fresh hooks that the
    /// next tick takes never wait behind a read of every tenant.
    pub tenants_per_tick: usize,
}

impl Default for TickLimits {
    fn default() -> Self {
        TickLimits {
            max_markers: 4096,
            rows_per_tick: 1024,
            rows_per_tenant: 256,
            bytes_per_tick: 16 << 20,
            tenants_per_tick: 128,
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
    /// The read stopped at the tenant's share or the tick's budget with more rows due
    /// after `rows`; otherwise it read every row due now from its floor.
    pub more: bool,
}

/// What a tick will do.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TickPlan {
    pub work: Vec<TenantWork>,
    /// Distinct tenants the tick looked at (`ankusa_dispatch_active_tenants`).
    pub tenants_visited: usize,
    /// The oldest marker bucket a full read met (none for a hinted read or an empty index).
    pub oldest: Option<Bucket>,
    /// The row or byte budget ran out: more may be due than the tick took.
    pub exhausted: bool,
    /// Paused tenants the read met, with the markers it saw (to take out).
    pub paused: Vec<(TenantOrd, Vec<Bucket>)>,
}

/// The pipeline's in-memory read positions: per-tenant scan floors, the hinted tenants
/// not yet served, and where the active index's live markers start. All are hints; the
/// store is the truth, and a full scan from bucket 0 every [`Cursors::RESCAN_MS`] bounds
/// what a wrong hint can cost to a delay.
#[derive(Debug, Default)]
pub struct Cursors {
    pub(super) floors: HashMap<TenantOrd, AtMs>,
    /// Tenants the writer announced that no tick has drained yet, with their floors.
    pub hinted: Hinted,
    /// The first bucket the next full scan reads (markers below it are cleaned ones).
    pub(super) active_from: Bucket,
    /// When a full scan last started at bucket 0.
    pub(super) rescanned_at: AtMs,
    /// When the last full scan ran, and whether it left work behind.
    pub(super) full_at: AtMs,
    pub(super) backlog: bool,
    /// Where the round robin of the next tick starts.
    pub(super) rotation: usize,
    /// When the per-tenant in-flight gauge was last refreshed, and its new values (the
    /// tenants holding the most), for the async half of the tick to publish.
    pub(super) named_at: AtMs,
    pub(super) top_inflight: Option<Vec<(String, usize)>>,
    /// The last tick left work but could claim none of it (every slot it needed was held).
    pub(super) blocked: bool,
    /// The active tenants the last read of the active index found, visited across ticks.
    pub(super) cycle: Cycle,
    /// The paused tenants, which no tick visits.
    pub paused: std::sync::Arc<crate::dispatch::paused::Paused>,
}

/// The active tenants one read of the active index found, and the next one's turn. A full
/// tick goes on through them where the last stopped, a budget's worth of tenants a tick,
/// and reads the index again only once every one had its turn, after
/// [`Cursors::CYCLE_MS`], at a rescan, or when the hints overflowed: a tick that can claim
/// twenty rows does not read a thousand tenants' markers to find them. Fresh work of
/// tenants the list does not hold reaches the tick through the writer's hints (and retries
/// and replays through theirs); anything else waits for the next read, at most a cycle.
#[derive(Debug, Default)]
pub(super) struct Cycle {
    pub(super) tenants: std::collections::VecDeque<deliveries::ActiveTenant>,
    pub(super) read_at: AtMs,
    /// Work was left that only a fresh read is sure to find.
    pub(super) stale: bool,
}

impl Cursors {
    /// The most cursors kept; past it the map is cleared (a cursor is only a hint).
    pub const CAPACITY: usize = 65_536;
    /// How often a full scan starts at bucket 0 (a marker written below the live start,
    /// by a clock step or a commit slower than [`Cursors::SLACK_BUCKETS`], waits at most
    /// this long).
    pub const RESCAN_MS: u64 = 10_000;
    /// Seconds below the current one that a full scan still reads, for markers committed
    /// late with an earlier `at` (a writer batch's receipt time).
    pub const SLACK_BUCKETS: u64 = 5;
    /// The longest a cycle over one read of the active index lasts.
    pub const CYCLE_MS: u64 = 1_000;
    /// The most tenants a cycle holds with those requeued (twice the markers a read takes
    /// by default); past it, a fresh read finds the tenant.
    pub const CYCLE_CAPACITY: usize = 8_192;

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

    /// Whether the last tick left no due row it knows of behind: no tenant's cursor, no
    /// hinted tenant, no tenant of the cycle still to visit, no spent budget, no row
    /// waiting for a slot (what reopens the [`super::runner::Starter`]'s gate).
    pub fn caught_up(&self) -> bool {
        self.floors.is_empty()
            && self.hinted.is_empty()
            && !self.backlog
            && !self.blocked
            && self.cycle.tenants.is_empty()
    }

    /// Where a full scan at `now` starts: bucket 0 once every [`Cursors::RESCAN_MS`],
    /// otherwise the live start the last scan found.
    pub fn active_from(&self, now: AtMs) -> Bucket {
        if now.0 >= self.rescanned_at.0.saturating_add(Self::RESCAN_MS) {
            Bucket(0)
        } else {
            self.active_from
        }
    }

    /// Whether the tick at `now` scans the active index: when the hints overflowed, when
    /// the last tick left work behind (a spent budget, a tenant's full share) unless it
    /// could claim nothing (waiting for slots), and at least every `interval_ms`.
    pub fn full_due(&self, now: AtMs, interval_ms: u64) -> bool {
        self.hinted.overflowed
            || !self.blocked && (self.backlog || !self.floors.is_empty())
            || now.0 >= self.full_at.0.saturating_add(interval_ms)
    }

    /// Whether the full tick at `now` reads the active index again (see [`Cycle`]).
    pub(super) fn cycle_over(&self, now: AtMs) -> bool {
        self.cycle.tenants.is_empty()
            || self.cycle.stale
            || self.hinted.overflowed
            || now.0 >= self.cycle.read_at.0.saturating_add(Self::CYCLE_MS)
            || now.0 >= self.rescanned_at.0.saturating_add(Self::RESCAN_MS)
    }

    /// Reads the active index from its live start (at most `max_markers` markers) and
    /// starts a cycle over the tenants it found.
    pub(super) fn read_cycle(
        &mut self,
        store: &Store,
        now: AtMs,
        max_markers: usize,
    ) -> Result<(), QueueError> {
        let from = self.active_from(now);
        let active = deliveries::active_tenants_from(store, from, now, usize::MAX, max_markers)?;
        self.start_cycle(now, from, active);
        Ok(())
    }

    /// After a read of the active index from `from` at `now` that found `active`.
    pub(super) fn start_cycle(
        &mut self,
        now: AtMs,
        from: Bucket,
        active: Vec<deliveries::ActiveTenant>,
    ) {
        if from == Bucket(0) {
            self.rescanned_at = now;
        }
        let slack = Bucket(now.bucket().0.saturating_sub(Self::SLACK_BUCKETS));
        let oldest = active.first().and_then(|t| t.buckets.first().copied());
        self.active_from = oldest.map_or(slack, |b| b.min(slack));
        self.hinted.overflowed = false;
        self.cycle = Cycle {
            tenants: active.into(),
            read_at: now,
            stale: false,
        };
    }

    /// A tenant the full tick left work of from `at` on takes its next turn at the cycle's
    /// end (a bounded cycle: past [`Cursors::CYCLE_CAPACITY`], a fresh read finds it).
    pub(super) fn requeue(&mut self, w: &TenantWork, at: AtMs) {
        if self.cycle.tenants.len() < Self::CYCLE_CAPACITY {
            // Its floor says where its rows go on. The markers the cleanup kept (those of
            // buckets from its first row left on) go with it: the turn that drains it
            // cleans them, rather than a visit of the next read of the index that finds
            // nothing but them.
            self.cycle.tenants.push_back(deliveries::ActiveTenant {
                ord: w.ord,
                buckets: w
                    .buckets
                    .iter()
                    .copied()
                    .filter(|b| *b >= at.bucket())
                    .collect(),
            });
        } else {
            self.cycle.stale = true;
        }
    }

    /// After a full tick at `now`.
    pub(super) fn scanned(&mut self, now: AtMs, plan: &TickPlan) {
        self.full_at = now;
        self.backlog = plan.exhausted;
    }
}

/// Plans one full tick: reads the active index from the live start and each visited
/// tenant's due rows from its oldest marker (no due row is older: every due row has its
/// marker), tenants in marker order from the tick's rotation on. Reads only; claiming
/// and the marker cleanup follow in the pipeline.
pub fn plan_tick(
    store: &Store,
    now: AtMs,
    limits: &TickLimits,
    cursors: &Cursors,
) -> Result<TickPlan, QueueError> {
    let from = cursors.active_from(now);
    let active = deliveries::active_tenants_from(store, from, now, usize::MAX, limits.max_markers)?;
    let mut plan = TickPlan {
        oldest: active.first().and_then(|t| t.buckets.first().copied()),
        ..TickPlan::default()
    };
    // Each tick starts one tenant further on: when the budget is small (the slots of a
    // busy sink), every active tenant still gets read in turn, not just the oldest.
    let n = active.len();
    let start = if n == 0 { 0 } else { cursors.rotation % n };
    let mut active: std::collections::VecDeque<_> = active.into();
    active.rotate_left(start);
    visit(store, now, limits, cursors, &mut active, &mut plan)?;
    Ok(plan)
}

/// Plans a full tick from the cycle (see [`Cycle`]): the tenants whose turn is next, each
/// read from its oldest marker seen, until the budget is spent. The tenants it visited
/// leave the cycle; `exhausted` says the budget ran out before the cycle's end.
pub(super) fn plan_cycle(
    store: &Store,
    now: AtMs,
    limits: &TickLimits,
    cursors: &mut Cursors,
) -> Result<TickPlan, QueueError> {
    let mut plan = TickPlan::default();
    let mut tenants = std::mem::take(&mut cursors.cycle.tenants);
    visit(store, now, limits, cursors, &mut tenants, &mut plan)?;
    plan.exhausted &= !tenants.is_empty();
    cursors.cycle.tenants = tenants;
    Ok(plan)
}

/// Takes tenants from the front of `tenants` and reads each one's due rows from its
/// oldest marker (or its cursor), until the tick's budget is spent.
pub(super) fn visit(
    store: &Store,
    now: AtMs,
    limits: &TickLimits,
    cursors: &Cursors,
    tenants: &mut std::collections::VecDeque<deliveries::ActiveTenant>,
    plan: &mut TickPlan,
) -> Result<(), QueueError> {
    let mut budget = Budget::new(limits);
    while let Some(t) = tenants.pop_front() {
        // A paused tenant costs the round robin nothing; its markers go (a resume puts
        // them back), a resuming one's stay.
        match cursors.paused.hold(t.ord) {
            Some(
                crate::dispatch::paused::Hold::Paused(_)
                | crate::dispatch::paused::Hold::Erasing(_),
            ) => {
                plan.paused.push((t.ord, t.buckets));
                continue;
            }
            Some(crate::dispatch::paused::Hold::Resuming) => continue,
            None => {}
        }
        if budget.spent() {
            tenants.push_front(t);
            plan.exhausted = true;
            break;
        }
        plan.tenants_visited += 1;
        let oldest = t.buckets.first().map_or(AtMs(0), |b| b.start());
        let floor = cursors.floor(t.ord).max(oldest);
        let (rows, more) = budget.take(store, t.ord, now, floor, limits)?;
        plan.work.push(TenantWork {
            ord: t.ord,
            buckets: t.buckets,
            rows,
            more,
        });
    }
    plan.exhausted |= budget.spent();
    Ok(())
}

/// Plans the hinted part of a tick: the tenants the writer announced, oldest hint first,
/// each read from its hint. No marker is read or cleaned (a full tick does that).
pub fn plan_hinted(
    store: &Store,
    now: AtMs,
    limits: &TickLimits,
    cursors: &Cursors,
) -> Result<TickPlan, QueueError> {
    let mut tenants: Vec<(TenantOrd, AtMs)> = cursors
        .hinted
        .tenants
        .iter()
        .map(|(o, a)| (*o, *a))
        .collect();
    tenants.sort_by_key(|(o, a)| (*a, *o));
    let mut plan = TickPlan::default();
    let mut budget = Budget::new(limits);
    for (ord, hint) in tenants {
        if cursors.paused.holds(ord) {
            continue;
        }
        if budget.spent() {
            plan.exhausted = true;
            break;
        }
        plan.tenants_visited += 1;
        // From the hint, not the tenant's cursor: fresh rows are read even when an older
        // backlog (say, for a full sink) holds the cursor back.
        let floor = hint;
        let (rows, more) = budget.take(store, ord, now, floor, limits)?;
        plan.work.push(TenantWork {
            ord,
            buckets: Vec::new(),
            rows,
            more,
        });
    }
    plan.exhausted |= budget.spent();
    Ok(plan)
}

/// What is left of a tick's row, byte and tenant budgets.
pub(super) struct Budget {
    pub(super) rows: usize,
    pub(super) bytes: u64,
    pub(super) tenants: usize,
}

impl Budget {
    pub(super) fn new(limits: &TickLimits) -> Self {
        Budget {
            rows: limits.rows_per_tick,
            bytes: limits.bytes_per_tick,
            tenants: limits.tenants_per_tick,
        }
    }
    pub(super) fn spent(&self) -> bool {
        self.rows == 0 || self.bytes == 0 || self.tenants == 0
    }
    /// One tenant's share, oldest first from `floor`, and whether more rows are due after
    /// it (the share or the budget cut the read).
    pub(super) fn take(
        &mut self,
        store: &Store,
        ord: TenantOrd,
        now: AtMs,
        floor: AtMs,
        limits: &TickLimits,
    ) -> Result<(Vec<DueRow>, bool), QueueError> {
        let deliveries::DuePage { rows, more } = deliveries::due_for_tenant(
            store,
            ord,
            now,
            floor,
            limits.rows_per_tenant.min(self.rows),
            self.bytes,
        )?;
        self.tenants = self.tenants.saturating_sub(1);
        self.rows -= rows.len();
        self.bytes = self
            .bytes
            .saturating_sub(rows.iter().map(|r| u64::from(r.size)).sum::<u64>());
        Ok((rows, more))
    }
}

/// What the pipeline does after a tick that claimed `claimed` rows of a budget of
/// `rows_per_tick` and left `c`: tick again at once (`busy`), wait for a slot or a hint
/// (`waiting`), or neither (wait for a hint or the interval). Work left behind (a spent
/// budget, a tenant's full share, hinted tenants not reached, the rest of a read cut at
/// its tenant budget) is taken at once — unless rows were left for want of a slot and
/// none could be claimed: then the next tick waits for a slot to free.
pub(super) fn after_tick(claimed: usize, rows_per_tick: usize, c: &Cursors) -> (bool, bool) {
    let left = c.backlog || !c.hinted.tenants.is_empty();
    let waiting = claimed == 0 && left && c.blocked;
    let busy = claimed >= rows_per_tick || (left && !waiting);
    (busy, waiting)
}

#[cfg(test)]
mod tests {
    use super::*;
    use ankusa_keyspace::Family;
    use ankusa_queue::deliveries::{claim, cleanup_markers, Tx};
    use ankusa_queue::hints::DueHints;
    use ankusa_queue::testkit::Harness;

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

    /// Claims every row the plan names and cleans the tenants' markers, like the pipeline.
    fn claim_all(h: &Harness, plan: &TickPlan, now: AtMs) {
        let mut tx = Tx::new();
        for w in &plan.work {
            for r in &w.rows {
                claim(&mut tx, r);
            }
        }
        tx.commit(&h.store, false).unwrap();
        for w in &plan.work {
            cleanup_markers(&h.store, w.ord, &w.buckets, now).unwrap();
        }
    }

    #[test]
    fn the_turn_that_drains_a_requeued_tenant_cleans_its_markers() {
        let mut h = Harness::new();
        for i in 0..10 {
            h.ingest(Some("a"), 1, 1_000 + i, false);
        }
        let now = AtMs(5_000);
        let limits = TickLimits {
            rows_per_tick: 6,
            rows_per_tenant: 6,
            ..TickLimits::default()
        };
        let mut cursors = Cursors::default();
        cursors
            .read_cycle(&h.store, now, limits.max_markers)
            .unwrap();
        // A full share: six rows claimed, four left in the same second.
        let plan = plan_cycle(&h.store, now, &limits, &mut cursors).unwrap();
        assert_eq!(plan.work[0].rows.len(), 6);
        claim_all(&h, &plan, now);
        let w = &plan.work[0];
        let last = w.rows.last().unwrap().key.at;
        cursors.advance(w.ord, last);
        cursors.requeue(w, last);
        // Its next turn carries the marker the cleanup kept, and drains it.
        let plan = plan_cycle(&h.store, now, &limits, &mut cursors).unwrap();
        assert_eq!(plan.work[0].rows.len(), 4);
        assert_eq!(plan.work[0].buckets, vec![Bucket(1)]);
        claim_all(&h, &plan, now);
        let active =
            deliveries::active_tenants_from(&h.store, Bucket(0), now, usize::MAX, 4096).unwrap();
        assert!(
            active.is_empty(),
            "the drained tenant's marker is cleaned by its own turn: {active:?}"
        );
    }

    /// Tombstones a closure's reads stepped over.
    fn tombstones_walked(f: impl FnOnce()) -> u64 {
        ankusa_queue::engine::tombstones_walked(f).1
    }

    #[test]
    fn a_tick_reads_from_the_oldest_marker_not_over_the_rows_already_claimed() {
        let mut h = Harness::new();
        // 2 000 rows of one tenant in second 1, claimed and their markers cleaned: 2 000
        // due-row tombstones and one marker tombstone below everything live.
        for i in 0..2_000 {
            h.ingest(Some("a"), 1, 1_000 + i % 1_000, false);
        }
        let limits = TickLimits {
            rows_per_tick: 4_096,
            rows_per_tenant: 4_096,
            ..TickLimits::default()
        };
        let mut cursors = Cursors::default();
        let active = deliveries::active_tenants_from(
            &h.store,
            Bucket(0),
            AtMs(3_000),
            usize::MAX,
            limits.max_markers,
        )
        .unwrap();
        let first = plan_tick(&h.store, AtMs(3_000), &limits, &cursors).unwrap();
        assert_eq!(first.work[0].rows.len(), 2_000);
        claim_all(&h, &first, AtMs(3_000));
        cursors.start_cycle(AtMs(3_000), Bucket(0), active);
        // A new row in second 9: the full scan and the cleanup read from second 9.
        h.ingest(Some("a"), 1, 9_100, false);
        let now = AtMs(9_500);
        let walked = tombstones_walked(|| {
            let plan = plan_tick(&h.store, now, &limits, &cursors).unwrap();
            assert_eq!(plan.work[0].rows.len(), 1);
            assert_eq!(plan.oldest, Some(Bucket(9)));
            cleanup_markers(&h.store, plan.work[0].ord, &plan.work[0].buckets, now).unwrap();
        });
        assert!(walked <= 2, "the tick stepped over {walked} tombstones");
        // The same from a hint: no active-index read at all.
        let mut hinted = Cursors::default();
        hinted.hinted.add(
            h.ord("a"),
            AtMs(9_100),
            ankusa_queue::hints::DueHints::CAPACITY,
        );
        let before = h.store.stats();
        let walked = tombstones_walked(|| {
            let plan = plan_hinted(&h.store, now, &limits, &hinted).unwrap();
            assert_eq!(plan.work[0].rows.len(), 1);
        });
        assert_eq!(walked, 0);
        assert_eq!(h.store.stats().since(&before).scans_of(Family::Active), 0);
    }

    /// Each read of a tick visits at most `tenants_per_tick` tenants, due rows or not: the
    /// safety-net read of tenants whose rows hints already took (their markers not yet
    /// cleaned) goes on over several ticks, and so does a hinted read, so a fresh hook
    /// waits one slice, never one read of every tenant.
    #[test]
    fn a_read_visits_at_most_its_tenant_budget_even_where_nothing_is_due() {
        let mut h = Harness::new();
        for t in 0..50 {
            h.ingest(Some(&format!("t{t}")), 1, 20_000 + t, false);
        }
        let now = AtMs(21_000);
        let limits = TickLimits {
            tenants_per_tick: 10,
            ..TickLimits::default()
        };
        let mut cursors = Cursors::default();
        cursors
            .read_cycle(&h.store, now, limits.max_markers)
            .unwrap();
        // The rows go as hinted reads take them: claimed, their markers left.
        let all = plan_tick(&h.store, now, &TickLimits::default(), &Cursors::default()).unwrap();
        assert_eq!(all.work.len(), 50);
        let mut tx = Tx::new();
        for r in all.work.iter().flat_map(|w| &w.rows) {
            claim(&mut tx, r);
        }
        tx.commit(&h.store, false).unwrap();
        for tick in 0..5 {
            let plan = plan_cycle(&h.store, now, &limits, &mut cursors).unwrap();
            assert_eq!(plan.tenants_visited, 10, "tick {tick}");
            assert!(plan.work.iter().all(|w| w.rows.is_empty()), "tick {tick}");
            assert_eq!(plan.exhausted, tick < 4, "tick {tick}");
        }
        let mut hinted = Cursors::default();
        for t in 0..30 {
            hinted
                .hinted
                .add(h.ord(&format!("t{t}")), AtMs(20_000), DueHints::CAPACITY);
        }
        let plan = plan_hinted(&h.store, now, &limits, &hinted).unwrap();
        assert_eq!(plan.tenants_visited, 10);
        assert!(plan.exhausted);
    }

    /// After a tick: work left goes on at once — also when a read cut at its tenant
    /// budget claimed nothing (the next slice must not wait for the interval) — except
    /// rows that no slot could take, which wait for a slot.
    #[test]
    fn only_rows_held_back_by_slots_make_the_next_tick_wait() {
        let mut c = Cursors::default();
        assert_eq!(after_tick(0, 10, &c), (false, false), "idle");
        assert_eq!(after_tick(10, 10, &c), (true, false), "a full budget");
        c.backlog = true;
        assert_eq!(
            after_tick(3, 10, &c),
            (true, false),
            "claimed some, left some"
        );
        assert_eq!(
            after_tick(0, 10, &c),
            (true, false),
            "a slice found nothing due"
        );
        c.blocked = true;
        assert_eq!(after_tick(0, 10, &c), (false, true), "every slot held");
        c.backlog = false;
        c.hinted.add(
            TenantOrd(7),
            AtMs(1),
            ankusa_queue::hints::DueHints::CAPACITY,
        );
        assert_eq!(
            after_tick(0, 10, &c),
            (false, true),
            "a hinted tenant's rows held"
        );
        c.blocked = false;
        assert_eq!(
            after_tick(0, 10, &c),
            (true, false),
            "hinted tenants not reached"
        );
    }

    /// 50 tenants with a row each and a budget of 10 rows a tick: one read of the active
    /// index serves five ticks, each visiting the next ten tenants, until every tenant had
    /// its turn; then, or a cycle's time later, the index is read again.
    #[test]
    fn a_full_tick_goes_on_through_one_read_of_the_active_index() {
        let mut h = Harness::new();
        for t in 0..50 {
            h.ingest(Some(&format!("t{t}")), 1, 20_000 + t, false);
        }
        let limits = TickLimits {
            rows_per_tick: 10,
            ..TickLimits::default()
        };
        let now = AtMs(21_000);
        let mut cursors = Cursors::default();
        assert!(cursors.cycle_over(now));
        cursors
            .read_cycle(&h.store, now, limits.max_markers)
            .unwrap();
        let before = h.store.stats();
        let mut seen = std::collections::BTreeSet::new();
        for tick in 0..5 {
            assert!(!cursors.cycle_over(now), "tick {tick}");
            let plan = plan_cycle(&h.store, now, &limits, &mut cursors).unwrap();
            assert_eq!(plan.tenants_visited, 10);
            assert_eq!(plan.exhausted, tick < 4, "tick {tick}");
            for w in &plan.work {
                assert_eq!(w.rows.len(), 1);
                assert!(seen.insert(w.ord), "{:?} visited twice", w.ord);
            }
        }
        assert_eq!(seen.len(), 50);
        assert_eq!(h.store.stats().since(&before).scans_of(Family::Active), 0);
        assert!(cursors.cycle_over(now), "every tenant had its turn");
        // A cycle with tenants left ends after CYCLE_MS all the same.
        cursors
            .read_cycle(&h.store, now, limits.max_markers)
            .unwrap();
        plan_cycle(&h.store, now, &limits, &mut cursors).unwrap();
        assert!(!cursors.cycle_over(AtMs(now.0 + Cursors::CYCLE_MS - 1)));
        assert!(cursors.cycle_over(AtMs(now.0 + Cursors::CYCLE_MS)));
    }

    #[test]
    fn a_wrong_hint_costs_a_delay_never_a_row() {
        let mut h = Harness::new();
        h.ingest(Some("a"), 1, 5_000, false);
        let limits = TickLimits::default();
        let mut cursors = Cursors::default();
        // A hint past the row (a clock step, say): the hinted tick finds nothing.
        cursors.hinted.add(h.ord("a"), AtMs(5_500), 16);
        assert!(
            cursors.full_due(AtMs(5_600), 100),
            "no full scan has run yet"
        );
        cursors.full_at = AtMs(5_600);
        assert!(!cursors.full_due(AtMs(5_650), 100));
        let hinted = plan_hinted(&h.store, AtMs(5_650), &limits, &cursors).unwrap();
        assert!(hinted.work.iter().all(|w| w.rows.is_empty()));
        // The full scan one interval later does.
        assert!(cursors.full_due(AtMs(5_700), 100));
        let full = plan_tick(&h.store, AtMs(5_700), &limits, &cursors).unwrap();
        assert_eq!(full.work[0].rows.len(), 1);
        // A live start above a late marker: the rescan from bucket 0 finds it.
        cursors.active_from = Bucket(7);
        cursors.rescanned_at = AtMs(5_700);
        assert!(plan_tick(&h.store, AtMs(8_000), &limits, &cursors)
            .unwrap()
            .work
            .is_empty());
        let rescan = AtMs(5_700 + Cursors::RESCAN_MS);
        assert_eq!(cursors.active_from(rescan), Bucket(0));
        assert_eq!(
            plan_tick(&h.store, rescan, &limits, &cursors).unwrap().work[0]
                .rows
                .len(),
            1
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
