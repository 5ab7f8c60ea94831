//! The dispatch pipeline: the tick's plan (docs/storage.md, "The active index") and the task that runs it.
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
//! Deliveries run with those slots held, on a set of delivery tasks that take them from one
//! queue ([`crew`]), each request in its tenant's turn in the sink's request line
//! ([`super::line`]); one thread commits the outcomes in batches (not synced: a lost
//! outcome means a redelivery after boot recovery, never a loss).
//!
//! A graceful stop: claiming stops; deliveries in flight get up to `shutdown.grace_ms` to
//! finish and have their outcomes committed; those still running then are cut, their rows
//! made due again (synced, counted in `ankusa_shutdown_requeued`), and the write-ahead
//! log is synced. Only a delivery cut at the deadline (or a crash) can be redelivered.
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::delivery::{Attempt, ClaimSlot, Deliverer, Sink};
use super::DispatchError;
use crate::metrics::{Metrics, ScanLabel, SinkMeters, TenantLabel};
use ankusa_config::{Config, RetryConfig};
use ankusa_keyspace::AtMs;
use ankusa_queue::deliveries::{self, InflightRow};
use ankusa_queue::engine::Store;
use ankusa_queue::hints::DueHints;
use ankusa_records::{DeliveryRow, Envelope};
use claim::{ClaimCtx, Ticker};
use crew::Crew;
use outcomes::{spawn_committer, Committer};
use plan::{after_tick, Cursors, TickLimits};
use runner::{Runner, StartParts, Starter};
use slots::{TenantSlot, TenantSlots, Weights};

pub mod claim;
pub mod crew;
pub mod outcomes;
pub mod plan;
pub mod runner;
pub mod slots;

/// Tenants named in `ankusa_tenant_inflight` (those holding the most).
pub const TOP_INFLIGHT: usize = 20;

/// How often a tick waiting for slots looks whether a batch of them came back.
const SLOT_BATCH: Duration = Duration::from_millis(1);
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
        let (done_tx, done_rx) = std::sync::mpsc::channel::<Done>();
        let committer = match spawn_committer(
            Committer {
                store: store.clone(),
                retry: settings.retry.clone(),
                log: settings.hook_log,
                hints: hints.clone(),
                reclaimed: metrics.reclaimed_hooks.clone(),
                stop: stop.clone(),
            },
            done_rx,
        ) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "dispatch: the outcome committer's thread did not start; nothing is delivered");
                return;
            }
        };
        let ticker = match Ticker::spawn(store.clone()) {
            Ok(t) => t,
            Err(e) => {
                tracing::error!(error = %e, "dispatch: the tick thread did not start; nothing is delivered");
                drop(done_tx);
                let _ = tokio::task::spawn_blocking(move || committer.join()).await;
                return;
            }
        };
        let max_retry_after = Duration::from_millis(settings.retry.max_retry_after_ms);
        // Each sink with its series, resolved once per set of sinks: a delivery finds both
        // in one lookup.
        let meters = arc_swap::ArcSwap::from_pointee(SinkSeries::of(&deliverer, &metrics));
        let deliverer = Arc::new(deliverer);
        let run = Arc::new(Runner {
            deliverer: deliverer.clone(),
            metrics: metrics.clone(),
            meters,
            done_tx: done_tx.clone(),
            max_retry_after,
        });
        let paused = starter.paused.clone();
        let mut cursors = Cursors {
            paused: paused.clone(),
            ..Cursors::default()
        };
        // The delivery tasks, for the ticks' claims and the writer's starts; a stop cuts
        // those still running at its deadline (and a pipeline task that ends any other way
        // closes them too).
        let crew = Crew::new(run, crew::IDLE, tokio::runtime::Handle::current());
        let _closes = CloseOnDrop(crew.clone());
        starter.attach(StartParts {
            permits: permits.clone(),
            tenants: tenants.clone(),
            deliverer: deliverer.clone(),
            crew: crew.clone(),
            started: metrics.dispatch_started.clone(),
        });
        // A tick is worth its fixed cost once a quarter of the permits are free.
        let refill = (settings.max_inflight / 4).max(1) as u32;
        loop {
            if *stop.borrow() {
                break;
            }
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
                    ticker: &ticker,
                    crew: &crew,
                    tenants: &tenants,
                    weights: &weights,
                    hints: &hints,
                    interval_ms: settings.tick_interval.as_millis() as u64,
                    deliverer: &deliverer,
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
                        cursors = Cursors {
                            paused: paused.clone(),
                            ..Cursors::default()
                        };
                    }
                }
            }
            rest(
                waiting,
                busy,
                settings.tick_interval,
                &hints,
                &tenants,
                &deliverer,
                &mut stop,
                &mut cursors,
            )
            .await;
        }
        wind_down(
            &store, &settings, &metrics, &starter, &permits, &crew, done_tx, ticker, committer,
        )
        .await;
    })
}

/// What the pipeline waits for before its next tick: the timer (the interval, or sooner
/// when a retry comes due before it), and — with work waiting for a slot — a freed slot or
/// fresh rows; with the sinks busy, a batch of slots; idle, fresh rows. A stop ends it.
#[allow(clippy::too_many_arguments)]
async fn rest(
    waiting: bool,
    busy: bool,
    interval: Duration,
    hints: &DueHints,
    tenants: &TenantSlots,
    deliverer: &Deliverer,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    cursors: &mut Cursors,
) {
    // The timer: the interval, or sooner when a retry comes due before it.
    let nap = hints.next_later().map_or(interval, |at| {
        Duration::from_millis(at.0.saturating_sub(ankusa_keyspace::now_ms())).min(interval)
    });
    if waiting {
        // A freed slot, or fresh rows (read from their hints only: a blocked
        // backlog is scanned again once a slot frees or the interval passes).
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            _ = tenants.freed() => {
                // A full read again (its rotation reaches every waiting tenant),
                // once a batch of slots is back.
                wait_for_batch(deliverer, hints, stop, nap).await;
                cursors.blocked = false;
            }
            _ = hints.arrived() => {}
            _ = stop.changed() => {}
        }
    } else if busy {
        // Work is left and the sinks hold most of their lines: the next tick waits
        // for a batch of slots rather than claiming the few freed meanwhile.
        if !deliverer.batch_free() {
            wait_for_batch(deliverer, hints, stop, nap).await;
        }
    } else {
        tokio::select! {
            _ = tokio::time::sleep(nap) => {}
            _ = hints.arrived() => {}
            _ = stop.changed() => {}
        }
    }
}

/// Stopping: nothing more is claimed or started. Every permit back means every delivery
/// in flight finished and its outcome is committed; at the grace's end the rest are cut,
/// and what is still in flight in the store is made due again.
#[allow(clippy::too_many_arguments)]
async fn wind_down(
    store: &Arc<Store>,
    settings: &PipelineSettings,
    metrics: &Metrics,
    starter: &Starter,
    permits: &tokio::sync::Semaphore,
    crew: &Crew<Runner>,
    done_tx: std::sync::mpsc::Sender<Done>,
    ticker: Ticker,
    committer: std::thread::JoinHandle<()>,
) {
    starter.stop();
    let all = u32::try_from(settings.max_inflight).unwrap_or(u32::MAX);
    let finished = tokio::time::timeout(settings.grace, permits.acquire_many(all))
        .await
        .is_ok();
    let mut members = crew.close();
    if !finished {
        members.abort_all();
    }
    while members.join_next().await.is_some() {}
    drop(done_tx);
    let _ = tokio::task::spawn_blocking(move || ticker.join()).await;
    // The committer ends once every outcome sent is committed.
    let _ = tokio::task::spawn_blocking(move || committer.join()).await;
    // What is still in flight in the store now is what the deadline cut: due again.
    let (s, log) = (store.clone(), settings.hook_log);
    let stopped = tokio::task::spawn_blocking(move || {
        let requeued = deliveries::recover_inflight(&s, AtMs(ankusa_keyspace::now_ms()), log)?;
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
}

/// Lets the sinks' slots come back until a quarter of some sink's line is free
/// ([`Deliverer::batch_free`]), fresh rows are announced, a stop begins or `nap` is over:
/// one tick then claims a batch of rows, not the one or two freed since the last (a tick's
/// reads and claim commit cost about the same for a few rows as for a hundred).
async fn wait_for_batch(
    deliverer: &Deliverer,
    hints: &DueHints,
    stop: &mut tokio::sync::watch::Receiver<bool>,
    nap: Duration,
) {
    let until = tokio::time::Instant::now() + nap;
    let mut fresh = std::pin::pin!(hints.arrived());
    loop {
        tokio::select! {
            _ = tokio::time::sleep(SLOT_BATCH) => {}
            _ = &mut fresh => return,
            _ = stop.changed() => return,
        }
        if deliverer.batch_free() || tokio::time::Instant::now() >= until {
            return;
        }
    }
}

/// A configured sink and its series.
struct Metered {
    sink: Arc<Sink>,
    meters: SinkMeters,
}

/// Every sink installed and its series, for one generation of the sinks.
struct SinkSeries {
    generation: u64,
    by_id: HashMap<String, Metered>,
    /// Every tenant endpoint's deliveries, in one series ([`crate::endpoints::SERIES`]).
    endpoints: SinkMeters,
}

impl SinkSeries {
    fn of(deliverer: &Deliverer, metrics: &Metrics) -> SinkSeries {
        let sinks = deliverer.current();
        let by_id = sinks
            .by_id
            .values()
            .map(|sink| {
                let meters = metrics.sink_meters(&sink.id);
                meters.limit.set(sink.control.limit() as i64);
                let m = Metered {
                    sink: sink.clone(),
                    meters,
                };
                (sink.id.clone(), m)
            })
            .collect();
        SinkSeries {
            generation: sinks.generation,
            by_id,
            endpoints: metrics.sink_meters(crate::endpoints::SERIES),
        }
    }
}

/// Closes the delivery tasks when the pipeline's task ends, however it ends.
struct CloseOnDrop(Arc<Crew<Runner>>);

impl Drop for CloseOnDrop {
    fn drop(&mut self) {
        // Dropping the tasks' set aborts those still running.
        drop(self.0.close());
    }
}

/// What a tick works with.
struct TickCtx<'a> {
    ticker: &'a Ticker,
    crew: &'a Arc<Crew<Runner>>,
    tenants: &'a TenantSlots,
    weights: &'a Weights,
    hints: &'a DueHints,
    interval_ms: u64,
    deliverer: &'a Arc<Deliverer>,
    permits: &'a Arc<tokio::sync::Semaphore>,
    metrics: &'a Arc<Metrics>,
}

/// One tick: plan, claim, clean markers, fetch envelopes, start deliveries.
async fn tick(
    ctx: &mut TickCtx<'_>,
    limits: TickLimits,
    mut cursors: Cursors,
) -> Result<(Cursors, usize), DispatchError> {
    let TickCtx {
        ticker,
        crew,
        tenants,
        weights,
        hints,
        interval_ms,
        deliverer,
        permits,
        metrics,
    } = ctx;
    let taken = hints.take(AtMs(ankusa_keyspace::now_ms()));
    if taken.overflowed {
        metrics.dispatch_hint_overflows.inc();
    }
    cursors.hinted.merge(taken, DueHints::CAPACITY);
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
    let claim::Claimed {
        cursors,
        jobs,
        visited,
        full,
    } = ticker.tick(limits, cursors, interval_ms, claim_ctx).await?;
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
    let mut given = Vec::with_capacity(claimed);
    for job in jobs {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            // Sized to the free permits; a start at a commit since (or a stop) took one.
            Err(_) => {
                // What is already held runs meanwhile (its outcomes give permits back).
                crew.give(std::mem::take(&mut given));
                permits
                    .clone()
                    .acquire_owned()
                    .await
                    .map_err(|_| DispatchError::Stopping)?
            }
        };
        given.push((job, permit));
    }
    crew.give(given);
    Ok((cursors, claimed))
}
