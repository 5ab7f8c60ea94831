//! The dispatch pipeline: the tick's plan (ADR section 5) and the task that runs it.
//!
//! Every tick reads candidates two ways. A *full* read (at least every
//! `dispatch.tick_interval_ms`, and at once again while a tick that claimed something left
//! work) takes the tenants with a marker at or before now from the active index, visiting
//! them from a rotating start, and for each takes its due rows oldest first from its
//! in-memory cursor or its oldest marker (no due row is older), within per-tenant and
//! per-tick budgets. A *hinted* read takes the tenants the writer, a replay or the retry
//! timer just announced ([`DueHints`]), each from its hint. Hints are shortcuts: whatever
//! they miss the next full read finds.
//!
//! Cursors (`ord → floor at`) live only in memory; a tenant that drains loses its cursor.
//! The active index is read from where its live markers start, so no read walks the
//! tombstones of rows and markers already claimed and cleaned.
//!
//! The candidates' hooks name their sinks; rows are then assigned round robin across
//! tenants (fewest deliveries in flight first), each only with a claim slot of its sink
//! (within its adaptive limit and past its breaker, [`super::control`]) and of its tenant,
//! and claimed in one batch. The markers of the tenants the full read met are cleaned.
//! Deliveries run with those slots held, each request in its tenant's turn in the sink's
//! request line ([`super::line`]); one task commits the outcomes in batches (not synced: a
//! lost outcome means a redelivery after boot recovery, never a loss).
//!
//! A graceful stop: claiming stops; deliveries in flight get up to `shutdown.grace_ms` to
//! finish and have their outcomes committed; those still running then are cut, their rows
//! made due again (synced, counted in `ankusa_shutdown_requeued`), and the write-ahead
//! log is synced. Only a delivery cut at the deadline (or a crash) can be redelivered.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::delivery::{backoff, Attempt, ClaimSlot, Deliverer, Sink, Verdict};
use super::DispatchError;
use crate::config::{Config, RetryConfig};
use crate::metrics::{Metrics, ScanLabel, SinkMeters, TenantLabel};
use crate::queue::deliveries::{self, DeliveryRow, DueRow, Envelope, InflightRow, Tx};
use crate::queue::hints::{DueHints, Hinted};
use crate::queue::hooklog::{self, AttemptOutcome};
use crate::queue::QueueError;
use crate::store::keys::{self, AtMs, Bucket, EventKind, Family, Seq, TenantOrd};
use crate::store::{Cf, Store};

/// Tenants named in `ankusa_tenant_inflight` (those holding the most).
pub const TOP_INFLIGHT: usize = 20;

/// How long a tick waiting for slots lets them come back after the first, so one tick
/// claims for several.
const SLOT_BATCH: Duration = Duration::from_millis(1);

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
}

/// The pipeline's in-memory read positions: per-tenant scan floors, the hinted tenants
/// not yet served, and where the active index's live markers start. All are hints; the
/// store is the truth, and a full scan from bucket 0 every [`Cursors::RESCAN_MS`] bounds
/// what a wrong hint can cost to a delay.
#[derive(Debug, Default)]
pub struct Cursors {
    floors: HashMap<TenantOrd, AtMs>,
    /// Tenants the writer announced that no tick has drained yet, with their floors.
    pub hinted: Hinted,
    /// The first bucket the next full scan reads (markers below it are cleaned ones).
    active_from: Bucket,
    /// When a full scan last started at bucket 0.
    rescanned_at: AtMs,
    /// When the last full scan ran, and whether it left work behind.
    full_at: AtMs,
    backlog: bool,
    /// Where the round robin of the next tick starts.
    rotation: usize,
    /// When the per-tenant in-flight gauge was last refreshed, and its new values (the
    /// tenants holding the most), for the async half of the tick to publish.
    named_at: AtMs,
    top_inflight: Option<Vec<(String, usize)>>,
    /// The last tick left work but could claim none of it (every slot it needed was held).
    blocked: bool,
    /// The active tenants the last read of the active index found, visited across ticks.
    cycle: Cycle,
}

/// The active tenants one read of the active index found, and the next one's turn. A full
/// tick goes on through them where the last stopped, a budget's worth of tenants a tick,
/// and reads the index again only once every one had its turn, after
/// [`Cursors::CYCLE_MS`], at a rescan, or when the hints overflowed: a tick that can claim
/// twenty rows does not read a thousand tenants' markers to find them. Fresh work of
/// tenants the list does not hold reaches the tick through the writer's hints (and retries
/// and replays through theirs); anything else waits for the next read, at most a cycle.
#[derive(Debug, Default)]
struct Cycle {
    tenants: std::collections::VecDeque<deliveries::ActiveTenant>,
    read_at: AtMs,
    /// Work was left that only a fresh read is sure to find.
    stale: bool,
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
    /// waiting for a slot (what reopens the [`Starter`]'s gate).
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
    fn cycle_over(&self, now: AtMs) -> bool {
        self.cycle.tenants.is_empty()
            || self.cycle.stale
            || self.hinted.overflowed
            || now.0 >= self.cycle.read_at.0.saturating_add(Self::CYCLE_MS)
            || now.0 >= self.rescanned_at.0.saturating_add(Self::RESCAN_MS)
    }

    /// Reads the active index from its live start (at most `max_markers` markers) and
    /// starts a cycle over the tenants it found.
    fn read_cycle(
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
    fn start_cycle(&mut self, now: AtMs, from: Bucket, active: Vec<deliveries::ActiveTenant>) {
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

    /// A tenant the full tick left work of takes its next turn at the cycle's end (a
    /// bounded cycle: past [`Cursors::CYCLE_CAPACITY`], a fresh read finds it).
    fn requeue(&mut self, w: &TenantWork) {
        if self.cycle.tenants.len() < Self::CYCLE_CAPACITY {
            // Its floor says where its rows go on; its markers were just cleaned.
            self.cycle.tenants.push_back(deliveries::ActiveTenant {
                ord: w.ord,
                buckets: Vec::new(),
            });
        } else {
            self.cycle.stale = true;
        }
    }

    /// After a full tick at `now`.
    fn scanned(&mut self, now: AtMs, plan: &TickPlan) {
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
fn plan_cycle(
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
fn visit(
    store: &Store,
    now: AtMs,
    limits: &TickLimits,
    cursors: &Cursors,
    tenants: &mut std::collections::VecDeque<deliveries::ActiveTenant>,
    plan: &mut TickPlan,
) -> Result<(), QueueError> {
    let mut budget = Budget::new(limits);
    while let Some(t) = tenants.pop_front() {
        if budget.spent() {
            tenants.push_front(t);
            plan.exhausted = true;
            break;
        }
        plan.tenants_visited += 1;
        let oldest = t.buckets.first().map_or(AtMs(0), |b| b.start());
        let floor = cursors.floor(t.ord).max(oldest);
        let rows = budget.take(store, t.ord, now, floor, limits)?;
        plan.work.push(TenantWork {
            ord: t.ord,
            buckets: t.buckets,
            rows,
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
        if budget.spent() {
            plan.exhausted = true;
            break;
        }
        plan.tenants_visited += 1;
        // From the hint, not the tenant's cursor: fresh rows are read even when an older
        // backlog (say, for a full sink) holds the cursor back.
        let floor = hint;
        let rows = budget.take(store, ord, now, floor, limits)?;
        plan.work.push(TenantWork {
            ord,
            buckets: Vec::new(),
            rows,
        });
    }
    plan.exhausted |= budget.spent();
    Ok(plan)
}

/// What is left of a tick's row, byte and tenant budgets.
struct Budget {
    rows: usize,
    bytes: u64,
    tenants: usize,
}

impl Budget {
    fn new(limits: &TickLimits) -> Self {
        Budget {
            rows: limits.rows_per_tick,
            bytes: limits.bytes_per_tick,
            tenants: limits.tenants_per_tick,
        }
    }
    fn spent(&self) -> bool {
        self.rows == 0 || self.bytes == 0 || self.tenants == 0
    }
    /// One tenant's share, oldest first from `floor`.
    fn take(
        &mut self,
        store: &Store,
        ord: TenantOrd,
        now: AtMs,
        floor: AtMs,
        limits: &TickLimits,
    ) -> Result<Vec<DueRow>, QueueError> {
        let rows = deliveries::due_for_tenant(
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
        Ok(rows)
    }
}

// ---------------------------------------------------------------------------------------
// The running pipeline.

/// The pipeline's settings.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    pub tick_interval: Duration,
    pub max_inflight: usize,
    /// Deliveries in flight for one tenant.
    pub tenant_max_inflight: usize,
    /// Rows per round-robin turn, by tenant id.
    pub tenant_weights: std::collections::BTreeMap<String, u32>,
    /// How long a stop waits for deliveries in flight.
    pub grace: Duration,
    pub limits: TickLimits,
    pub retry: RetryConfig,
    /// Record each attempt (and each recovery) in the hook log.
    pub hook_log: bool,
}

impl PipelineSettings {
    pub fn from_config(c: &Config) -> Self {
        PipelineSettings {
            tick_interval: Duration::from_millis(c.dispatch.tick_interval_ms),
            max_inflight: c.dispatch.max_inflight,
            tenant_max_inflight: c.dispatch.tenant_max_inflight,
            tenant_weights: c.dispatch.tenant_weights.clone(),
            grace: Duration::from_millis(c.shutdown.grace_ms),
            limits: TickLimits {
                max_markers: 4096,
                rows_per_tick: c.dispatch.max_inflight,
                rows_per_tenant: c.dispatch.rows_per_tenant,
                bytes_per_tick: c.dispatch.bytes_per_tick,
                tenants_per_tick: c.dispatch.tenants_per_tick,
            },
            retry: c.retry.clone(),
            hook_log: c.hook_log.enabled,
        }
    }
}

/// A claimed delivery on its way out.
#[derive(Debug)]
struct Job {
    row: InflightRow,
    /// The delivery row as read at claim time (attempts so far).
    state: DeliveryRow,
    envelope: Option<Arc<Envelope>>,
    /// Why the row cannot be delivered: its hook or its delivery row does not decode
    /// (corruption, counted when it was read). It is dead-lettered with this error, never
    /// sent and never dropped as an orphan.
    corrupt: Option<Arc<str>>,
    /// The sink's claim slot, taken before the row was claimed (none for a row with no
    /// sink).
    sink_slot: Option<ClaimSlot>,
    /// The tenant's in-flight slot, given back when the job is dropped.
    tenant_slot: TenantSlot,
}

/// A finished attempt, to be committed.
#[derive(Debug)]
struct Done {
    job: Job,
    attempt: Option<Attempt>,
    _permit: tokio::sync::OwnedSemaphorePermit,
}

/// Starts the pipeline; it stops when `stop` turns true, after committing the outcomes of
/// the deliveries already in flight.
pub fn spawn(
    store: Arc<Store>,
    deliverer: Deliverer,
    settings: PipelineSettings,
    metrics: Arc<Metrics>,
    hints: Arc<DueHints>,
    starter: Arc<Starter>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let permits = Arc::new(tokio::sync::Semaphore::new(settings.max_inflight));
        let tenants = TenantSlots::new(settings.tenant_max_inflight);
        let weights = Weights::new(settings.tenant_weights.clone());
        let (done_tx, done_rx) = tokio::sync::mpsc::channel::<Done>(settings.max_inflight);
        let committer = tokio::spawn(commit_outcomes(
            store.clone(),
            done_rx,
            settings.retry.clone(),
            settings.hook_log,
            hints.clone(),
            metrics.reclaimed_hooks.clone(),
            stop.clone(),
        ));
        let max_retry_after = Duration::from_millis(settings.retry.max_retry_after_ms);
        // Each sink with its series, resolved once: a delivery finds both in one lookup.
        let meters: Arc<HashMap<String, Metered>> = Arc::new(
            deliverer
                .sinks()
                .map(|sink| {
                    let meters = metrics.sink_meters(&sink.id);
                    meters.limit.set(sink.control.limit() as i64);
                    let m = Metered {
                        sink: sink.clone(),
                        meters,
                    };
                    (sink.id.clone(), m)
                })
                .collect(),
        );
        let deliverer = Arc::new(deliverer);
        let run = Arc::new(Runner {
            deliverer: deliverer.clone(),
            meters: meters.clone(),
            done_tx: done_tx.clone(),
            max_retry_after,
        });
        let mut cursors = Cursors::default();
        // The delivery tasks, so a stop can cut those still running at its deadline (the
        // writer's starts run here too).
        let in_flight: Arc<std::sync::Mutex<tokio::task::JoinSet<()>>> = Arc::default();
        starter.attach(StartParts {
            permits: permits.clone(),
            tenants: tenants.clone(),
            deliverer: deliverer.clone(),
            run: Arc::downgrade(&run),
            tasks: in_flight.clone(),
            handle: tokio::runtime::Handle::current(),
            started: metrics.dispatch_started.clone(),
        });
        // A tick is worth its fixed cost once a quarter of the permits are free.
        let refill = (settings.max_inflight / 4).max(1) as u32;
        loop {
            if *stop.borrow() {
                break;
            }
            while lock(&in_flight).try_join_next().is_some() {}
            if permits.available_permits() < refill as usize {
                tokio::select! {
                    _ = permits.acquire_many(refill) => {}
                    _ = tokio::time::sleep(settings.tick_interval) => {}
                    _ = stop.changed() => {}
                }
            }
            let free = permits.available_permits();
            let mut busy = false;
            // Work is waiting for a slot (of a sink, a tenant): the next tick waits for one.
            let mut waiting = false;
            if free > 0 {
                let limits = TickLimits {
                    rows_per_tick: settings.limits.rows_per_tick.min(free),
                    ..settings.limits
                };
                let mut ctx = TickCtx {
                    tasks: &in_flight,
                    tenants: &tenants,
                    weights: &weights,
                    store: &store,
                    hints: &hints,
                    interval_ms: settings.tick_interval.as_millis() as u64,
                    deliverer: &deliverer,
                    run: &run,
                    permits: &permits,
                    metrics: &metrics,
                };
                // A start refused from here on means a fresh row waits in the store.
                let epoch = starter.epoch();
                match tick(&mut ctx, limits, cursors).await {
                    Ok((c, claimed)) => {
                        (busy, waiting) = after_tick(claimed, limits.rows_per_tick, &c);
                        if !busy && !waiting && c.caught_up() {
                            starter.open_since(epoch);
                        }
                        cursors = c;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "dispatch tick failed");
                        cursors = Cursors::default();
                    }
                }
            }
            // The timer: the interval, or sooner when a retry comes due before it.
            let nap = hints.next_later().map_or(settings.tick_interval, |at| {
                Duration::from_millis(at.0.saturating_sub(crate::now_ms()))
                    .min(settings.tick_interval)
            });
            if waiting {
                // A freed slot, or fresh rows (read from their hints only: a blocked
                // backlog is scanned again once a slot frees or the interval passes).
                tokio::select! {
                    _ = tokio::time::sleep(nap) => {}
                    _ = tenants.freed() => {
                        // Let a few more slots come back: one tick for several rows, a
                        // full read again (its rotation reaches every waiting tenant).
                        tokio::time::sleep(SLOT_BATCH).await;
                        cursors.blocked = false;
                    }
                    _ = hints.arrived() => {}
                    _ = stop.changed() => {}
                }
            } else if !busy {
                tokio::select! {
                    _ = tokio::time::sleep(nap) => {}
                    _ = hints.arrived() => {}
                    _ = stop.changed() => {}
                }
            }
        }
        // Stopping: nothing more is claimed or started. Every permit back means every
        // delivery in flight finished and its outcome is committed.
        starter.stop();
        let all = u32::try_from(settings.max_inflight).unwrap_or(u32::MAX);
        let finished = tokio::time::timeout(settings.grace, permits.acquire_many(all))
            .await
            .is_ok();
        let mut in_flight = std::mem::take(&mut *lock(&in_flight));
        if !finished {
            in_flight.abort_all();
        }
        while in_flight.join_next().await.is_some() {}
        drop(run);
        drop(done_tx);
        let _ = committer.await;
        // What is still in flight in the store now is what the deadline cut: due again.
        let (s, log) = (store.clone(), settings.hook_log);
        let stopped = tokio::task::spawn_blocking(move || {
            let requeued = deliveries::recover_inflight(&s, AtMs(crate::now_ms()), log)?;
            s.sync_wal()?;
            Ok::<_, DispatchError>(requeued)
        })
        .await;
        match stopped {
            Ok(Ok(0)) => tracing::info!("dispatch stopped: every delivery in flight finished"),
            Ok(Ok(n)) => {
                metrics.shutdown_requeued.inc_by(n);
                tracing::warn!(
                    requeued = n,
                    grace_ms = settings.grace.as_millis() as u64,
                    "dispatch stopped: deliveries still in flight at the end of the grace are due again (they may be delivered twice)"
                );
            }
            Ok(Err(e)) => tracing::error!(error = %e, "dispatch: making cut deliveries due again"),
            Err(e) => tracing::error!(error = %e, "dispatch: stop task"),
        }
    })
}

/// A configured sink and its series.
struct Metered {
    sink: Arc<Sink>,
    meters: SinkMeters,
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a tick works with.
struct TickCtx<'a> {
    tasks: &'a std::sync::Mutex<tokio::task::JoinSet<()>>,
    tenants: &'a TenantSlots,
    weights: &'a Weights,
    store: &'a Arc<Store>,
    hints: &'a DueHints,
    interval_ms: u64,
    deliverer: &'a Arc<Deliverer>,
    run: &'a Arc<Runner>,
    permits: &'a Arc<tokio::sync::Semaphore>,
    metrics: &'a Arc<Metrics>,
}

/// What a running delivery needs: its sink (with its series), and where its outcome goes.
struct Runner {
    deliverer: Arc<Deliverer>,
    meters: Arc<HashMap<String, Metered>>,
    done_tx: tokio::sync::mpsc::Sender<Done>,
    max_retry_after: Duration,
}

impl Runner {
    /// One claimed (or started) delivery: its attempt, in its tenant's turn in the sink's
    /// line, then its outcome to the committer (which gives the permit back).
    async fn deliver(self: Arc<Self>, mut job: Job, permit: tokio::sync::OwnedSemaphorePermit) {
        // A corrupt row is not attempted: its outcome is the dead letter.
        let attempt = match job.envelope.as_deref().filter(|_| job.corrupt.is_none()) {
            None => None,
            Some(env) => Some(
                match env
                    .sinks
                    .get(job.row.key.sink.0 as usize)
                    .and_then(|id| self.meters.get(id))
                {
                    None => Attempt {
                        verdict: Verdict::Dead,
                        status: 0,
                        class: Some(hooklog::ErrorClass::Unconfigured),
                        error: "the hook's sink is no longer configured".into(),
                        latency: Duration::ZERO,
                    },
                    Some(Metered { sink, meters: m }) => {
                        // The claim took one of the sink's claim slots; the request
                        // waits only for its tenant's turn in the sink's line.
                        let _request = sink.line.acquire(job.row.key.ord).await;
                        let a = self
                            .deliverer
                            .attempt(sink, env, self.max_retry_after)
                            .await;
                        let now = std::time::Instant::now();
                        sink.control.record(a.signal(), now);
                        let limit = sink.control.limit();
                        sink.line.set_limit(limit);
                        m.limit.set(limit as i64);
                        m.breaker.set(sink.control.breaker(now) as i64);
                        let (requests, queued) = sink.line.usage();
                        m.requests.set(requests as i64);
                        m.queued.set(queued as i64);
                        m.attempt(a.label()).inc();
                        m.latency.observe(a.latency.as_secs_f64());
                        a
                    }
                },
            ),
        };
        // The sink's slot is free again as soon as the attempt is over.
        if job.sink_slot.take().is_some() {
            job.tenant_slot.slots.notify_freed();
        }
        let _ = self
            .done_tx
            .send(Done {
                job,
                attempt,
                _permit: permit,
            })
            .await;
    }
}

/// The pipeline's side of starting a fresh delivery at its ingest commit
/// ([`crate::queue::writer::Starts`]). The writer offers each delivery of each hook it
/// assembles; a start is given only while the pipeline has *caught up* — its last tick
/// left no due row behind and no fresh row was refused a start or written due since that
/// tick began — and only with
/// a slot of the node, of the delivery's sink (its adaptive limit and breaker, the
/// newcomers' reserve) and of its tenant, the same slots a tick's claim takes. The row is
/// then written inflight by the ingest batch itself and its delivery starts when the batch
/// commits: no tick, no read of the store, no claim commit, no marker.
///
/// A refused start closes the gate until a tick that began after it catches up again, so a
/// fresh row never overtakes a row of the store waiting for a slot: under a backlog every
/// row goes through the ticks' round robin, as before. It starts nothing until the
/// pipeline has attached its slots, and nothing once a stop began.
#[derive(Default)]
pub struct Starter {
    parts: std::sync::OnceLock<StartParts>,
    /// `(refusals << 1) | open`: the refusals counted since boot, and whether starts are
    /// given (a tick opens the gate only if the count did not move while it ran).
    gate: std::sync::atomic::AtomicU64,
    stopping: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Starter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Starter")
            .field("gate", &self.gate)
            .field("stopping", &self.stopping)
            .finish()
    }
}

/// What the starter takes its slots from and runs its deliveries with.
struct StartParts {
    permits: Arc<tokio::sync::Semaphore>,
    tenants: TenantSlots,
    deliverer: Arc<Deliverer>,
    /// Weak: the outcome channel closes when the stopping pipeline drops its runner.
    run: std::sync::Weak<Runner>,
    tasks: Arc<std::sync::Mutex<tokio::task::JoinSet<()>>>,
    handle: tokio::runtime::Handle,
    started: prometheus_client::metrics::counter::Counter,
}

/// The slots a started delivery runs with (inside a [`StartSlot`]).
struct StartSlots {
    permit: tokio::sync::OwnedSemaphorePermit,
    sink: ClaimSlot,
    tenant: TenantSlot,
}

impl Starter {
    fn attach(&self, parts: StartParts) {
        // A pipeline is spawned once per starter; a second would only start nothing.
        let _ = self.parts.set(parts);
    }

    /// The refusals counted so far.
    fn epoch(&self) -> u64 {
        self.gate.load(std::sync::atomic::Ordering::Acquire) >> 1
    }

    /// Opens the gate, unless a start was refused since `epoch` (or it is open).
    fn open_since(&self, epoch: u64) {
        use std::sync::atomic::Ordering;
        let _ = self.gate.compare_exchange(
            epoch << 1,
            (epoch << 1) | 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// A refusal: the gate closes and the count moves.
    fn close(&self) {
        use std::sync::atomic::Ordering;
        let _ = self
            .gate
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
                Some(((v >> 1) + 1) << 1)
            });
    }

    /// Whether starts are given now.
    pub fn is_open(&self) -> bool {
        use std::sync::atomic::Ordering;
        self.gate.load(Ordering::Acquire) & 1 == 1 && !self.stopping.load(Ordering::Acquire)
    }

    fn stop(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        self.close();
    }
}

impl crate::queue::writer::Starts for Starter {
    fn try_start(&self, ord: TenantOrd, sink: &str) -> Option<crate::queue::writer::StartSlot> {
        let p = self.parts.get()?;
        // A row refused while the gate is closed counts too: a tick that began before it
        // has not seen it, and must not open the gate behind it.
        let slots = self.is_open().then(|| {
            let sink = p.deliverer.sink(sink)?;
            let permit = p.permits.clone().try_acquire_owned().ok()?;
            let sink = sink.try_claim(ord)?;
            let tenant = p.tenants.try_take(ord)?;
            Some(StartSlots {
                permit,
                sink,
                tenant,
            })
        });
        match slots.flatten() {
            Some(s) => Some(crate::queue::writer::StartSlot(Box::new(s))),
            None => {
                self.close();
                None
            }
        }
    }

    fn waiting(&self) {
        self.close();
    }

    fn started(&self, rows: Vec<crate::queue::writer::Started>) {
        let Some(p) = self.parts.get() else { return };
        // A pipeline that stopped runs nothing more: the rows stay inflight for the stop's
        // (or the next boot's) recovery to make due.
        let Some(run) = p.run.upgrade() else { return };
        let mut tasks = lock(&p.tasks);
        // The finished ones go first: between ticks (a second or a minute apart, when every
        // delivery starts at its commit) the set holds only what runs.
        while tasks.try_join_next().is_some() {}
        for crate::queue::writer::Started {
            row,
            envelope,
            slot,
        } in rows
        {
            let Ok(slots) = slot.0.downcast::<StartSlots>() else {
                // Only this starter gives slots; a row without them stays inflight until
                // the stop's or the next boot's recovery makes it due.
                tracing::error!(
                    seq = row.key.seq.0,
                    "dispatch: a started row without its slots"
                );
                continue;
            };
            let StartSlots {
                permit,
                sink,
                tenant,
            } = *slots;
            p.started.inc();
            let job = Job {
                row,
                state: DeliveryRow {
                    ord: row.key.ord,
                    size: row.size,
                    ..DeliveryRow::default()
                },
                envelope: Some(envelope),
                corrupt: None,
                sink_slot: Some(sink),
                tenant_slot: tenant,
            };
            tasks.spawn_on(run.clone().deliver(job, permit), &p.handle);
        }
    }
}

/// One tick: plan, claim, clean markers, fetch envelopes, start deliveries.
async fn tick(
    ctx: &mut TickCtx<'_>,
    limits: TickLimits,
    mut cursors: Cursors,
) -> Result<(Cursors, usize), DispatchError> {
    let TickCtx {
        tasks,
        tenants,
        weights,
        store,
        hints,
        interval_ms,
        deliverer,
        run,
        permits,
        metrics,
    } = ctx;
    let taken = hints.take(AtMs(crate::now_ms()));
    if taken.overflowed {
        metrics.dispatch_hint_overflows.inc();
    }
    cursors.hinted.merge(taken, DueHints::CAPACITY);
    let s = (*store).clone();
    let interval_ms = *interval_ms;
    let started = std::time::Instant::now();
    // No more candidates than free slots: the node's, and the sinks' together (a row
    // needs one of its sink's; orphans and rows of removed sinks need none and are rare).
    let free = limits.rows_per_tick.min(deliverer.free_slots().max(1));
    let limits = TickLimits {
        rows_per_tick: free,
        ..limits
    };
    let claim_ctx = ClaimCtx {
        deliverer: (*deliverer).clone(),
        tenants: (*tenants).clone(),
        weights: (*weights).clone(),
        free,
    };
    let (cursors, jobs, visited, full) = tokio::task::spawn_blocking(move || {
        claim_tick(&s, limits, cursors, interval_ms, &claim_ctx)
    })
    .await
    .map_err(DispatchError::task("dispatch tick"))??;
    metrics
        .dispatch_tick_seconds
        .observe(started.elapsed().as_secs_f64());
    metrics.dispatch_active_tenants.set(visited as i64);
    metrics
        .dispatch_ticks
        .get_or_create(&ScanLabel {
            scan: if full { "full" } else { "hinted" }.to_owned(),
        })
        .inc();
    metrics
        .dispatch_hinted_tenants
        .set(cursors.hinted.tenants.len() as i64);
    let mut cursors = cursors;
    if let Some(top) = cursors.top_inflight.take() {
        metrics.tenant_inflight.clear();
        for (tenant, n) in top {
            metrics
                .tenant_inflight
                .get_or_create(&TenantLabel { tenant })
                .set(n as i64);
        }
    }
    let (tenants_in_flight, most) = tenants.usage();
    metrics
        .dispatch_tenants_inflight
        .set(tenants_in_flight as i64);
    metrics.dispatch_tenant_inflight_max.set(most as i64);
    metrics.dispatch_claimed.inc_by(jobs.len() as u64);
    let claimed = jobs.len();
    for job in jobs {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            // Sized to the free permits; a start at a commit since (or a stop) took one.
            Err(_) => permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| DispatchError::Stopping)?,
        };
        lock(*tasks).spawn((*run).clone().deliver(job, permit));
    }
    Ok((cursors, claimed))
}

/// What the claim half of a tick needs besides the store.
struct ClaimCtx {
    deliverer: Arc<Deliverer>,
    tenants: TenantSlots,
    weights: Weights,
    /// Free global delivery permits: the most rows this tick may claim.
    free: usize,
}

/// A row the tick read, with its hook (if the hook is still there and decodes).
struct Candidate {
    row: DueRow,
    envelope: Option<Arc<Envelope>>,
    /// The hook is there but does not decode (see [`Job::corrupt`]).
    corrupt: Option<Arc<str>>,
}

/// Corruption the dispatch tick found in `family` at `key`: counted and logged, and the
/// error's text for the dead row it becomes.
fn corrupt_row(family: Family, key: &[u8], e: impl std::fmt::Display) -> Arc<str> {
    let err = QueueError::corrupt_at(family, key, e);
    tracing::error!(error = %err, "dispatch: a row does not decode; its delivery is dead-lettered");
    err.to_string().into()
}

/// What the pipeline does after a tick that claimed `claimed` rows of a budget of
/// `rows_per_tick` and left `c`: tick again at once (`busy`), wait for a slot or a hint
/// (`waiting`), or neither (wait for a hint or the interval). Work left behind (a spent
/// budget, a tenant's full share, hinted tenants not reached, the rest of a read cut at
/// its tenant budget) is taken at once — unless rows were left for want of a slot and
/// none could be claimed: then the next tick waits for a slot to free.
fn after_tick(claimed: usize, rows_per_tick: usize, c: &Cursors) -> (bool, bool) {
    let left = c.backlog || !c.hinted.tenants.is_empty();
    let waiting = claimed == 0 && left && c.blocked;
    let busy = claimed >= rows_per_tick || (left && !waiting);
    (busy, waiting)
}

/// The blocking half of a tick: plan (a full scan, or the hinted tenants), read the
/// candidates' hooks (a row's sink is named by its hook), assign rows round robin across
/// tenants — each row only with a free slot of its sink and of its tenant — claim the
/// assigned rows (one batch), clean the markers of the tenants read, and read the claimed
/// rows' delivery rows. Also says whether the tick was a full one.
fn claim_tick(
    store: &Store,
    limits: TickLimits,
    mut cursors: Cursors,
    interval_ms: u64,
    ctx: &ClaimCtx,
) -> Result<(Cursors, Vec<Job>, usize, bool), DispatchError> {
    let now = AtMs(crate::now_ms());
    let full = cursors.full_due(now, interval_ms);
    // No tenant reads more rows than the tick can claim.
    let read = TickLimits {
        rows_per_tenant: limits.rows_per_tenant.min(ctx.free.max(1)),
        ..limits
    };
    let plan = if full {
        if cursors.cycle_over(now) {
            cursors.read_cycle(store, now, read.max_markers)?;
        }
        let plan = plan_cycle(store, now, &read, &mut cursors)?;
        cursors.scanned(now, &plan);
        plan
    } else {
        cursors.backlog = false;
        TickPlan::default()
    };
    // The hinted tenants, every tick: their fresh rows never wait behind a full tick's
    // order or a backlog another sink holds up.
    let hinted = if cursors.hinted.tenants.is_empty() {
        TickPlan::default()
    } else {
        plan_hinted(store, now, &read, &cursors)?
    };
    // Hinted tenants the budget did not reach keep their hints: the next tick's hinted
    // read goes on with them, with no full read of the active index.
    // Per tenant, the rows of both reads, oldest first, once each.
    let mut order: Vec<TenantOrd> = Vec::new();
    let mut rows_of: HashMap<TenantOrd, Vec<DueRow>> = HashMap::new();
    for w in plan.work.iter().chain(&hinted.work) {
        let rows = rows_of.entry(w.ord).or_insert_with(|| {
            order.push(w.ord);
            Vec::new()
        });
        rows.extend(w.rows.iter().copied());
    }
    for rows in rows_of.values_mut() {
        rows.sort();
        rows.dedup_by_key(|r| r.key);
    }
    let mut seqs: Vec<Seq> = rows_of.values().flatten().map(|r| r.key.seq).collect();
    seqs.sort();
    seqs.dedup();
    let hooks = store.multi_get(
        Cf::Hooks,
        &seqs.iter().map(|s| keys::hook(*s)).collect::<Vec<_>>(),
    )?;
    // A hook that is gone is an orphan (its rows are dropped); one that does not decode is
    // corruption, never read as gone: its rows are dead-lettered with the error.
    let mut envs: HashMap<Seq, Arc<Envelope>> = HashMap::with_capacity(seqs.len());
    let mut corrupt: HashMap<Seq, Arc<str>> = HashMap::new();
    for (s, v) in seqs.into_iter().zip(hooks) {
        let Some(v) = v else { continue };
        match Envelope::decode(&v) {
            Ok(env) => {
                envs.insert(s, Arc::new(env));
            }
            Err(e) => {
                corrupt.insert(s, corrupt_row(Family::Hooks, &keys::hook(s), e));
            }
        }
    }
    let work: Vec<(TenantOrd, Vec<Candidate>)> = order
        .iter()
        .map(|ord| {
            let rows = rows_of[ord]
                .iter()
                .map(|r| Candidate {
                    row: *r,
                    envelope: envs.get(&r.key.seq).cloned(),
                    corrupt: corrupt.get(&r.key.seq).cloned(),
                })
                .collect();
            (*ord, rows)
        })
        .collect();
    let start = cursors.rotation;
    cursors.rotation = cursors.rotation.wrapping_add(1);
    let weight_of = ctx.weights.resolve(store)?;
    let picked = assign(&work, start, ctx.free, &ctx.tenants, &weight_of, |c| {
        c.envelope
            .as_deref()
            .and_then(|env| env.sinks.get(c.row.key.sink.0 as usize))
            .and_then(|id| ctx.deliverer.sink(id))
            .map_or(SinkSlot::NotNeeded, |sink| {
                sink.try_claim(c.row.key.ord)
                    .map_or(SinkSlot::Refused, SinkSlot::Taken)
            })
    });
    let mut tx = Tx::new();
    let claims: Vec<InflightRow> = picked
        .iter()
        .map(|p| deliveries::claim(&mut tx, &work[p.tenant].1[p.row].row))
        .collect();
    // One unit per claim, in order: a row another writer moved first (purged, say) is
    // not ours to deliver.
    let committed = tx.commit(store, false)?;
    let mut claimed_keys = std::collections::HashSet::new();
    let mut jobs_in = Vec::new();
    for ((p, row), moved) in picked.into_iter().zip(claims).zip(committed.moved) {
        if moved {
            claimed_keys.insert(work[p.tenant].1[p.row].row.key);
            jobs_in.push((p, row));
        }
    }
    // Where each read stopped: the first row it left (for want of a slot), or none.
    let left = |w: &TenantWork| {
        w.rows
            .iter()
            .find(|r| !claimed_keys.contains(&r.key))
            .map(|r| r.key.at)
    };
    let mut left_any = false;
    for w in &plan.work {
        deliveries::cleanup_markers(store, w.ord, &w.buckets, now)?;
        match (left(w), w.rows.last()) {
            // Rows left for want of a slot: the next read starts at the first of them, and
            // the tenant's next turn is at the cycle's end.
            (Some(at), _) => {
                cursors.advance(w.ord, at);
                cursors.requeue(w);
                left_any = true;
            }
            // A full share: more may wait from here on.
            (None, Some(last)) if w.rows.len() >= read.rows_per_tenant => {
                cursors.advance(w.ord, last.key.at);
                cursors.requeue(w);
                left_any = true;
            }
            // Drained up to now (hinted rows included): the next read starts at its
            // oldest marker.
            _ => {
                cursors.evict(w.ord);
                cursors.hinted.tenants.remove(&w.ord);
            }
        }
    }
    let mut left_hinted = false;
    for w in &hinted.work {
        match (left(w), w.rows.last()) {
            // Rows no slot could take, all of them read: the hint stays at the first, so
            // the next tick offers them again (a quiet tenant keeps its turn).
            (Some(at), _) if w.rows.len() < read.rows_per_tenant => {
                cursors.hinted.tenants.insert(w.ord, at);
                left_hinted = true;
            }
            // A full read of rows no slot could take: the hint goes (a later hint starts
            // at its own rows, not behind these); the full reads hold them, from a fresh
            // read of the active index (the cycle's may not hold the tenant).
            (Some(_), _) => {
                cursors.hinted.tenants.remove(&w.ord);
                cursors.cycle.stale = true;
                left_any = true;
            }
            (None, Some(last)) if w.rows.len() >= read.rows_per_tenant => {
                cursors.hinted.tenants.insert(w.ord, last.key.at);
                left_hinted = true;
            }
            _ => {
                cursors.hinted.tenants.remove(&w.ord);
            }
        }
    }
    // Work left where only a full read finds it again calls for one; work a hint still
    // points at is the hinted read's.
    cursors.backlog |= left_any;
    cursors.blocked = (left_any || left_hinted) && jobs_in.is_empty();
    let state_keys: Vec<Vec<u8>> = jobs_in
        .iter()
        .map(|(_, r)| keys::delivery(r.key.seq, r.key.sink))
        .collect();
    let states = store.multi_get(Cf::Deliveries, &state_keys)?;
    let jobs = jobs_in
        .into_iter()
        .zip(states)
        .zip(&state_keys)
        .map(|(((p, row), state), key)| {
            let candidate = &work[p.tenant].1[p.row];
            let fresh = DeliveryRow {
                ord: row.key.ord,
                size: row.size,
                ..DeliveryRow::default()
            };
            // A delivery row that does not decode is corruption: the row is dead-lettered
            // with the error (and a fresh state), not sent on a made-up attempt count.
            let (state, corrupt) = match state.map(|v| DeliveryRow::decode(&v)) {
                None => (fresh, candidate.corrupt.clone()),
                Some(Ok(s)) => (s, candidate.corrupt.clone()),
                Some(Err(e)) => (fresh, Some(corrupt_row(Family::Deliveries, key, e))),
            };
            Job {
                state,
                envelope: candidate.envelope.clone(),
                corrupt,
                row,
                sink_slot: p.sink_slot,
                tenant_slot: p.tenant_slot,
            }
        })
        .collect();
    // Once a second: the tenants holding the most deliveries in flight, by name.
    if now.0 >= cursors.named_at.0.saturating_add(1_000) {
        cursors.named_at = now;
        let mut top = Vec::new();
        for (ord, n) in ctx.tenants.top(TOP_INFLIGHT) {
            if let Some(name) = crate::queue::tenants::name(store, ord)? {
                top.push((name, n));
            }
        }
        cursors.top_inflight = Some(top);
    }
    Ok((
        cursors,
        jobs,
        plan.tenants_visited + hinted.tenants_visited,
        full,
    ))
}

/// A candidate the round robin gave a slot: `work[tenant].1[row]`.
struct Picked<S> {
    tenant: usize,
    row: usize,
    sink_slot: Option<S>,
    tenant_slot: TenantSlot,
}

/// A row's claim on its sink's slots (`S`: the slot, [`ClaimSlot`] in the node).
enum SinkSlot<S> {
    /// The row needs no sink (an orphan, a sink no longer configured).
    NotNeeded,
    /// One of the sink's claim slots, taken.
    Taken(S),
    /// The sink is full, over its adaptive limit, or its breaker is open.
    Refused,
}

/// Deficit round robin with a quantum of one row: tenants take turns — those with the
/// fewest deliveries in flight first, ties from `start` — each turn giving one tenant its next row that has a slot of its sink (`sink_slot`) and of
/// the tenant, until `budget` rows are picked or no tenant can take one. Within a tenant rows
/// go oldest first; a row whose sink is full is passed over, so a slow sink never holds
/// back the tenant's rows for other sinks, and a flooding tenant gets one row per turn
/// like everyone else.
fn assign<S>(
    work: &[(TenantOrd, Vec<Candidate>)],
    start: usize,
    budget: usize,
    tenants: &TenantSlots,
    weights: &HashMap<TenantOrd, u32>,
    sink_slot: impl Fn(&Candidate) -> SinkSlot<S>,
) -> Vec<Picked<S>> {
    let n = work.len();
    let mut picked = Vec::new();
    if n == 0 {
        return picked;
    }
    let mut next = vec![0usize; n];
    let mut open = vec![true; n];
    // The turn order: tenants with the fewest deliveries in flight first (a quiet tenant
    // before one whose backlog fills the sink), ties from the rotating start.
    let mut order: Vec<usize> = (0..n).map(|k| (start + k) % n).collect();
    let weight = |ord: &TenantOrd| weights.get(ord).copied().unwrap_or(1).max(1);
    // Each tenant's count read once: deliveries end while this sorts, and a key that
    // changes mid-sort is not an order (the standard sort panics on one).
    order.sort_by_cached_key(|t| tenants.held(work[*t].0) * 1_000 / weight(&work[*t].0) as usize);
    while picked.len() < budget {
        let mut progress = false;
        for &t in &order {
            let (ord, rows) = &work[t];
            // A tenant's turn: as many rows as its weight.
            for _ in 0..weight(ord) {
                if !open[t] || picked.len() >= budget {
                    break;
                }
                loop {
                    let Some(c) = rows.get(next[t]) else {
                        open[t] = false;
                        break;
                    };
                    if !tenants.has_room(*ord) {
                        open[t] = false;
                        break;
                    }
                    next[t] += 1;
                    let sink_slot = match sink_slot(c) {
                        SinkSlot::NotNeeded => None,
                        SinkSlot::Taken(p) => Some(p),
                        // The sink is full: this tenant's next row, if another sink's.
                        SinkSlot::Refused => continue,
                    };
                    // Only this task takes slots; others only give them back.
                    let Some(tenant_slot) = tenants.try_take(*ord) else {
                        open[t] = false;
                        break;
                    };
                    picked.push(Picked {
                        tenant: t,
                        row: next[t] - 1,
                        sink_slot,
                        tenant_slot,
                    });
                    progress = true;
                    break;
                }
            }
        }
        if !progress {
            break;
        }
    }
    picked
}

/// The configured tenant weights (`dispatch.tenant_weights`), by ordinal once a tenant has
/// one (its first hook is committed): names not yet known are looked up again each tick.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    resolved: Arc<std::sync::Mutex<HashMap<TenantOrd, u32>>>,
    unresolved: Arc<std::sync::Mutex<Vec<(String, u32)>>>,
}

impl Weights {
    pub fn new(by_name: std::collections::BTreeMap<String, u32>) -> Self {
        Weights {
            resolved: Default::default(),
            unresolved: Arc::new(std::sync::Mutex::new(by_name.into_iter().collect())),
        }
    }

    /// Ordinal → weight, for the tenants that have an ordinal.
    pub fn resolve(&self, store: &Store) -> Result<HashMap<TenantOrd, u32>, QueueError> {
        let mut unresolved = self.unresolved.lock().unwrap_or_else(|p| p.into_inner());
        let mut resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        let mut still = Vec::new();
        for (name, w) in unresolved.drain(..) {
            match crate::queue::tenants::ord(store, &name)? {
                Some(ord) => {
                    resolved.insert(ord, w);
                }
                None => still.push((name, w)),
            }
        }
        *unresolved = still;
        Ok(resolved.clone())
    }
}

/// Deliveries in flight per tenant, capped (`dispatch.tenant_max_inflight`): a tenant's
/// backlog can hold at most its cap of the node's delivery slots.
#[derive(Debug, Clone)]
pub struct TenantSlots {
    inner: Arc<SlotsInner>,
}

#[derive(Debug)]
struct SlotsInner {
    cap: usize,
    held: std::sync::Mutex<HashMap<TenantOrd, usize>>,
    /// Signalled when a tenant's or a sink's slot is given back.
    freed: tokio::sync::Notify,
}

/// One delivery's hold on its tenant's slots; given back when dropped.
#[derive(Debug)]
pub struct TenantSlot {
    slots: TenantSlots,
    ord: TenantOrd,
}

impl TenantSlots {
    pub fn new(cap: usize) -> Self {
        TenantSlots {
            inner: Arc::new(SlotsInner {
                cap,
                held: Default::default(),
                freed: tokio::sync::Notify::new(),
            }),
        }
    }

    fn held_map(&self) -> std::sync::MutexGuard<'_, HashMap<TenantOrd, usize>> {
        self.inner.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The deliveries `ord` has in flight.
    pub fn held(&self, ord: TenantOrd) -> usize {
        self.held_map().get(&ord).copied().unwrap_or(0)
    }

    /// Whether `ord` holds fewer than its cap.
    pub fn has_room(&self, ord: TenantOrd) -> bool {
        self.held_map().get(&ord).copied().unwrap_or(0) < self.inner.cap
    }

    /// A slot of `ord`'s, unless it holds its cap.
    pub fn try_take(&self, ord: TenantOrd) -> Option<TenantSlot> {
        let mut held = self.held_map();
        let n = held.entry(ord).or_default();
        if *n >= self.inner.cap {
            if *n == 0 {
                held.remove(&ord);
            }
            return None;
        }
        *n += 1;
        Some(TenantSlot {
            slots: self.clone(),
            ord,
        })
    }

    /// The `n` tenants holding the most deliveries in flight.
    pub fn top(&self, n: usize) -> Vec<(TenantOrd, usize)> {
        let mut all: Vec<(TenantOrd, usize)> =
            self.held_map().iter().map(|(o, n)| (*o, *n)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    /// Tenants with deliveries in flight, and the most any one of them holds.
    pub fn usage(&self) -> (usize, usize) {
        let held = self.held_map();
        (held.len(), held.values().copied().max().unwrap_or(0))
    }

    /// A sink's slot was given back.
    pub fn notify_freed(&self) {
        self.inner.freed.notify_one();
    }

    /// Resolves once a slot is given back (at once if one was since the last wait).
    pub async fn freed(&self) {
        self.inner.freed.notified().await
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        {
            let mut held = self.slots.held_map();
            if let Some(n) = held.get_mut(&self.ord) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&self.ord);
                }
            }
        }
        self.slots.notify_freed();
    }
}

/// Commits finished attempts in batches: delivered, retry (with backoff), dead-letter, or
/// orphan drop. Outcomes are not synced: a lost outcome only means a redelivery.
async fn commit_outcomes(
    store: Arc<Store>,
    mut rx: tokio::sync::mpsc::Receiver<Done>,
    retry: RetryConfig,
    log: bool,
    hints: Arc<DueHints>,
    reclaimed: prometheus_client::metrics::counter::Counter,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    let max_retry_after = Duration::from_millis(retry.max_retry_after_ms);
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < 1024 {
            match rx.try_recv() {
                Ok(d) => batch.push(d),
                Err(_) => break,
            }
        }
        // A batch whose commit fails (a full disk, a failed WAL sync) is committed again
        // once a second until it succeeds: nothing was written, and its rows must not
        // stay inflight until the next boot. Its slots stay held meanwhile, so the
        // pipeline claims nothing new. Only a stop gives up; boot recovery then makes the
        // rows due again (a redelivery, never a loss).
        let batch = Arc::new(batch);
        loop {
            let (store, retry, b) = (store.clone(), retry.clone(), batch.clone());
            let result = tokio::task::spawn_blocking(move || {
                let now = crate::now_ms();
                let mut tx = Tx::new();
                let mut retries: Vec<(TenantOrd, AtMs)> = Vec::new();
                let takes_hook = last_needs(&store, &b)?;
                let log = log.then_some(&*store);
                for (d, last) in b.iter().zip(&takes_hook) {
                    let r = outcome_ops(&mut tx, log, d, *last, &retry, max_retry_after, now)?;
                    retries.extend(r);
                }
                // One unit per outcome: a hook went only with a row that moved.
                let committed = tx.commit(&store, false)?;
                let removed = takes_hook
                    .iter()
                    .zip(&committed.moved)
                    .filter(|(t, m)| **t && **m)
                    .count() as u64;
                Ok::<_, QueueError>((retries, removed))
            })
            .await;
            match result {
                // Each retry is claimed when it comes due, not at the next full scan.
                Ok(Ok((retries, removed))) => {
                    hints.add_later(retries);
                    reclaimed.inc_by(removed);
                    break;
                }
                Ok(Err(e)) if !*stop.borrow() => {
                    tracing::debug!(error = %e, outcomes = batch.len(), "dispatch: committing outcomes, again in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Ok(Err(e)) => {
                    tracing::error!(error = %e, outcomes = batch.len(), "dispatch: outcomes not committed at stop; their rows are due again after the next boot");
                    break;
                }
                Err(e) => {
                    tracing::error!(error = %e, "dispatch: outcome task");
                    break;
                }
            }
        }
        // The batch's permits go back as it drops, its outcomes committed.
    }
}

/// For each finished attempt, whether it is a delivery that takes its hook along: the
/// row was the last thing the hook was kept for ([`deliveries::last_needs`], one read for
/// the batch).
fn last_needs(store: &Store, batch: &[Done]) -> Result<Vec<bool>, QueueError> {
    let delivered = |d: &Done| {
        let env = d.job.envelope.as_deref()?;
        let a = d.attempt.as_ref()?;
        (d.job.corrupt.is_none() && matches!(a.verdict, Verdict::Delivered))
            .then_some((d.job.row, env.sinks.len()))
    };
    let wanted: Vec<Option<(InflightRow, usize)>> = batch.iter().map(delivered).collect();
    let rows: Vec<(InflightRow, usize)> = wanted.iter().flatten().copied().collect();
    let mut last = deliveries::last_needs(store, &rows)?.into_iter();
    Ok(wanted
        .iter()
        .map(|w| w.is_some() && last.next().unwrap_or(false))
        .collect())
}

/// Adds one finished attempt's outcome as one unit (and, with `log`, its hook log event);
/// a retry's tenant and due time. A delivered row that was its hook's last need (`last`)
/// takes the hook with it, in the same unit (no marker for reclaim to come back to).
fn outcome_ops(
    tx: &mut Tx,
    log: Option<&Store>,
    d: &Done,
    last: bool,
    retry: &RetryConfig,
    max_retry_after: Duration,
    now: u64,
) -> Result<Option<(TenantOrd, AtMs)>, QueueError> {
    let row = &d.job.row;
    if let Some(error) = &d.job.corrupt {
        // Corruption: the row goes to the DLQ with the error, where it shows and counts,
        // and a replay sends it once the store is whole again.
        let mut state = d.job.state.clone();
        state.last_attempt_at = now;
        state.last_error = error.to_string();
        // Without a readable hook the sink has no name here; the DLQ shows its index.
        let env = d.job.envelope.as_deref();
        let sink = env
            .and_then(|e| e.sinks.get(row.key.sink.0 as usize).cloned())
            .unwrap_or_else(|| format!("#{}", row.key.sink.0));
        let (source, id) = env.map_or(("", ""), |e| (e.source.as_str(), e.id.as_str()));
        deliveries::dead_letter(tx, row, AtMs(now), source, id, &sink, Some(&state));
        return Ok(None);
    }
    let (Some(env), Some(a)) = (d.job.envelope.as_deref(), d.attempt.as_ref()) else {
        // The hook is gone: an orphan, dropped through the counted path.
        deliveries::orphan_drop(tx, row);
        return Ok(None);
    };
    let mut state = d.job.state.clone();
    state.attempts += 1;
    state.last_attempt_at = now;
    state.last_status = a.status;
    state.last_error = a.error.clone();
    let (outcome, next_at, due_again) = match &a.verdict {
        Verdict::Delivered => {
            deliveries::delivered_last(tx, row, last);
            (AttemptOutcome::Delivered, None, None)
        }
        Verdict::Retry { retry_after } if state.attempts < retry.max_attempts => {
            let planned = backoff(retry, state.attempts, rand::random::<f64>());
            let delay = retry_after.map_or(planned, |ra| ra.min(max_retry_after).max(planned));
            let at = AtMs(now + delay.as_millis() as u64);
            deliveries::retry(tx, row, at, &state);
            (AttemptOutcome::Retry, Some(at), Some((row.key.ord, at)))
        }
        Verdict::Retry { .. } | Verdict::Dead => {
            let sink = env
                .sinks
                .get(row.key.sink.0 as usize)
                .map_or("", String::as_str);
            deliveries::dead_letter(tx, row, AtMs(now), &env.source, &env.id, sink, Some(&state));
            (AttemptOutcome::Dead, Some(AtMs(now)), None)
        }
    };
    if let Some(store) = log {
        let ev = hooklog::Event {
            kind: EventKind::Attempt,
            at: AtMs(now),
            attempt: state.attempts,
            outcome: Some(outcome),
            status: a.status,
            class: a.class,
            error: a.error.clone(),
            latency_us: a.latency.as_micros() as u64,
            next_at,
        };
        hooklog::record(tx, store, row.key.seq, row.key.sink, &ev)?;
    }
    Ok(due_again)
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

    /// Tombstones a closure's reads stepped over.
    fn tombstones_walked(f: impl FnOnce()) -> u64 {
        crate::store::tombstones_walked(f).1
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
            crate::queue::hints::DueHints::CAPACITY,
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
            crate::queue::hints::DueHints::CAPACITY,
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

    /// Candidates of tenant `ord`: `n` rows, the i-th for sink `sinks[i % len]`.
    fn candidates(ord: u32, n: u64, sinks: &[&str]) -> (TenantOrd, Vec<Candidate>) {
        let rows = (0..n)
            .map(|i| {
                let sink = (i as usize) % sinks.len();
                Candidate {
                    row: DueRow {
                        key: keys::DueKey {
                            ord: TenantOrd(ord),
                            at: AtMs(1_000 + i),
                            seq: Seq(u64::from(ord) * 1_000_000 + i),
                            sink: keys::SinkIdx(sink as u16),
                        },
                        size: 10,
                        kind: deliveries::Kind::First,
                    },
                    envelope: Some(Arc::new(Envelope {
                        sinks: sinks.iter().map(|s| (*s).to_owned()).collect(),
                        ..Envelope::default()
                    })),
                    corrupt: None,
                }
            })
            .collect();
        (TenantOrd(ord), rows)
    }

    fn sink_slots<'a>(
        sinks: &'a HashMap<&'static str, Arc<tokio::sync::Semaphore>>,
    ) -> impl Fn(&Candidate) -> SinkSlot<tokio::sync::OwnedSemaphorePermit> + 'a {
        |c| {
            let slots = c
                .envelope
                .as_deref()
                .and_then(|env| env.sinks.get(c.row.key.sink.0 as usize))
                .and_then(|id| sinks.get(id.as_str()));
            match slots.map(|s| s.clone().try_acquire_owned()) {
                None => SinkSlot::NotNeeded,
                Some(Ok(p)) => SinkSlot::Taken(p),
                Some(Err(_)) => SinkSlot::Refused,
            }
        }
    }

    #[test]
    fn the_round_robin_gives_a_quiet_tenant_its_turn_beside_a_flood() {
        let work = vec![candidates(1, 1_000, &["s"]), candidates(2, 1, &["s"])];
        let sinks = HashMap::from([("s", Arc::new(tokio::sync::Semaphore::new(100)))]);
        let tenants = TenantSlots::new(1_000);
        // Whichever tenant the rotation starts with, the quiet one is in the first round.
        for start in 0..2 {
            let picked = assign(
                &work,
                start,
                2,
                &tenants,
                &HashMap::new(),
                sink_slots(&sinks),
            );
            let who: Vec<usize> = picked.iter().map(|p| p.tenant).collect();
            assert!(who.contains(&1), "start {start}: {who:?}");
        }
        // A flood alone takes the whole budget, oldest first.
        let picked = assign(
            &work[..1],
            0,
            5,
            &tenants,
            &HashMap::new(),
            sink_slots(&sinks),
        );
        let rows: Vec<usize> = picked.iter().map(|p| p.row).collect();
        assert_eq!(rows, vec![0, 1, 2, 3, 4]);
    }

    #[test]
    fn a_tenant_of_weight_three_gets_three_rows_a_turn() {
        let work = vec![candidates(1, 100, &["s"]), candidates(2, 100, &["s"])];
        let sinks = HashMap::from([("s", Arc::new(tokio::sync::Semaphore::new(1_000)))]);
        let tenants = TenantSlots::new(1_000);
        let weights = HashMap::from([(TenantOrd(2), 3)]);
        let picked = assign(&work, 0, 40, &tenants, &weights, sink_slots(&sinks));
        let of = |t: usize| picked.iter().filter(|p| p.tenant == t).count();
        assert_eq!((of(0), of(1)), (10, 30));
    }

    #[test]
    fn a_full_sink_holds_back_only_its_own_rows_and_a_tenant_only_its_cap() {
        // Tenant 1 alternates between a full sink and a free one.
        let work = vec![
            candidates(1, 10, &["slow", "fast"]),
            candidates(2, 10, &["fast"]),
        ];
        let sinks = HashMap::from([
            ("slow", Arc::new(tokio::sync::Semaphore::new(0))),
            ("fast", Arc::new(tokio::sync::Semaphore::new(100))),
        ]);
        let tenants = TenantSlots::new(3);
        let picked = assign(&work, 0, 100, &tenants, &HashMap::new(), sink_slots(&sinks));
        let of = |t: usize| -> Vec<usize> {
            picked
                .iter()
                .filter(|p| p.tenant == t)
                .map(|p| p.row)
                .collect()
        };
        // Tenant 1's rows for `fast` (odd rows) go; its `slow` rows wait; each tenant stops
        // at its cap of 3.
        assert_eq!(of(0), vec![1, 3, 5]);
        assert_eq!(of(1), vec![0, 1, 2]);
        assert!(picked.iter().all(|p| p.sink_slot.is_some()));
        assert_eq!(tenants.usage(), (2, 3));
        assert!(!tenants.has_room(TenantOrd(1)));
        drop(picked);
        assert_eq!(tenants.usage(), (0, 0), "dropped slots are given back");
        assert_eq!(sinks["fast"].available_permits(), 100);
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
