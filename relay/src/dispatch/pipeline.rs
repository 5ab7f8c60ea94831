//! The dispatch pipeline: the tick's plan (ADR section 5) and the task that runs it.
//!
//! `active_tenants(now, 4096)` gives the tenants with a marker at or before now, oldest
//! second first; for each, `due_for_tenant` from the tenant's in-memory cursor takes its
//! rows oldest first until the per-tenant, per-tick row and byte budgets are spent.
//! Cross-tenant order is therefore "oldest second first"; within a tenant, oldest first.
//!
//! Cursors (`ord → floor at`) live only in memory, for tenants that are active; a tenant
//! that drains loses its cursor, and after a restart every cursor starts at 0, which only
//! costs a scan over rows already known to be gone.
//!
//! The running pipeline ([`spawn`]) claims a tick's rows in one batch, cleans the markers
//! of the tenants it claimed from, and delivers under a global and a per-sink semaphore;
//! one task commits the outcomes in batches (not synced: a lost outcome means a redelivery
//! after boot recovery, never a loss).
//!
//! A graceful stop: claiming stops; deliveries in flight get up to `shutdown.grace_ms` to
//! finish and have their outcomes committed; those still running then are cut, their rows
//! made due again (synced, counted in `ankusa_shutdown_requeued`), and the write-ahead
//! log is synced. Only a delivery cut at the deadline (or a crash) can be redelivered.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use super::delivery::{backoff, Attempt, Deliverer, Verdict};
use crate::config::{Config, RetryConfig};
use crate::metrics::{Metrics, SinkLabel, SinkOutcome};
use crate::queue::deliveries::{self, DeliveryRow, DueRow, Envelope, InflightRow, Tx};
use crate::store::keys::{self, AtMs, Bucket, Seq, TenantOrd};
use crate::store::{Cf, Store, StoreError};

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

// ---------------------------------------------------------------------------------------
// The running pipeline.

/// The pipeline's settings.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    pub tick_interval: Duration,
    pub max_inflight: usize,
    /// How long a stop waits for deliveries in flight.
    pub grace: Duration,
    pub limits: TickLimits,
    pub retry: RetryConfig,
}

impl PipelineSettings {
    pub fn from_config(c: &Config) -> Self {
        PipelineSettings {
            tick_interval: Duration::from_millis(c.dispatch.tick_interval_ms),
            max_inflight: c.dispatch.max_inflight,
            grace: Duration::from_millis(c.shutdown.grace_ms),
            limits: TickLimits {
                max_markers: 4096,
                rows_per_tick: c.dispatch.max_inflight,
                rows_per_tenant: c.dispatch.rows_per_tenant,
                bytes_per_tick: c.dispatch.bytes_per_tick,
            },
            retry: c.retry.clone(),
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
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let permits = Arc::new(tokio::sync::Semaphore::new(settings.max_inflight));
        let (done_tx, done_rx) = tokio::sync::mpsc::channel::<Done>(settings.max_inflight);
        let committer = tokio::spawn(commit_outcomes(
            store.clone(),
            done_rx,
            settings.retry.clone(),
        ));
        let max_retry_after = Duration::from_millis(settings.retry.max_retry_after_ms);
        let mut cursors = Cursors::default();
        // The delivery tasks, so a stop can cut those still running at its deadline.
        let mut in_flight = tokio::task::JoinSet::new();
        // A tick is worth its fixed cost once a quarter of the permits are free.
        let refill = (settings.max_inflight / 4).max(1) as u32;
        loop {
            if *stop.borrow() {
                break;
            }
            while in_flight.try_join_next().is_some() {}
            if permits.available_permits() < refill as usize {
                tokio::select! {
                    _ = permits.acquire_many(refill) => {}
                    _ = tokio::time::sleep(settings.tick_interval) => {}
                    _ = stop.changed() => {}
                }
            }
            let free = permits.available_permits();
            let mut busy = false;
            if free > 0 {
                let limits = TickLimits {
                    rows_per_tick: settings.limits.rows_per_tick.min(free),
                    ..settings.limits
                };
                let mut ctx = TickCtx {
                    tasks: &mut in_flight,
                    store: &store,
                    deliverer: &deliverer,
                    permits: &permits,
                    done_tx: &done_tx,
                    metrics: &metrics,
                    max_retry_after,
                };
                match tick(&mut ctx, limits, cursors).await {
                    Ok((c, claimed)) => {
                        cursors = c;
                        busy = claimed >= limits.rows_per_tick;
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "dispatch tick failed");
                        cursors = Cursors::default();
                    }
                }
            }
            if !busy {
                tokio::select! {
                    _ = tokio::time::sleep(settings.tick_interval) => {}
                    _ = stop.changed() => {}
                }
            }
        }
        // Stopping: nothing more is claimed. Every permit back means every delivery in
        // flight finished and its outcome is committed.
        let all = u32::try_from(settings.max_inflight).unwrap_or(u32::MAX);
        let finished = tokio::time::timeout(settings.grace, permits.acquire_many(all))
            .await
            .is_ok();
        if !finished {
            in_flight.abort_all();
        }
        while in_flight.join_next().await.is_some() {}
        drop(done_tx);
        let _ = committer.await;
        // What is still in flight in the store now is what the deadline cut: due again.
        let s = store.clone();
        let stopped = tokio::task::spawn_blocking(move || {
            let requeued = deliveries::recover_inflight(&s, AtMs(crate::now_ms()))?;
            s.sync_wal()?;
            Ok::<_, StoreError>(requeued)
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

/// What a tick works with.
struct TickCtx<'a> {
    tasks: &'a mut tokio::task::JoinSet<()>,
    store: &'a Arc<Store>,
    deliverer: &'a Deliverer,
    permits: &'a Arc<tokio::sync::Semaphore>,
    done_tx: &'a tokio::sync::mpsc::Sender<Done>,
    metrics: &'a Arc<Metrics>,
    max_retry_after: Duration,
}

/// One tick: plan, claim, clean markers, fetch envelopes, start deliveries.
async fn tick(
    ctx: &mut TickCtx<'_>,
    limits: TickLimits,
    cursors: Cursors,
) -> Result<(Cursors, usize), StoreError> {
    let TickCtx {
        tasks,
        store,
        deliverer,
        permits,
        done_tx,
        metrics,
        max_retry_after,
    } = ctx;
    let s = (*store).clone();
    let (cursors, jobs, visited) =
        tokio::task::spawn_blocking(move || claim_tick(&s, limits, cursors))
            .await
            .map_err(|e| StoreError::Io {
                context: "dispatch tick".into(),
                source: std::io::Error::other(e.to_string()),
            })??;
    metrics.dispatch_active_tenants.set(visited as i64);
    metrics.dispatch_claimed.inc_by(jobs.len() as u64);
    let claimed = jobs.len();
    for job in jobs {
        let permit = match permits.clone().try_acquire_owned() {
            Ok(p) => p,
            // Sized to the free permits; only a shutdown race gets here.
            Err(_) => permits
                .clone()
                .acquire_owned()
                .await
                .map_err(|e| StoreError::Io {
                    context: "dispatch permits".into(),
                    source: std::io::Error::other(e.to_string()),
                })?,
        };
        let (deliverer, done_tx, metrics) =
            ((*deliverer).clone(), done_tx.clone(), (*metrics).clone());
        let max_retry_after = *max_retry_after;
        tasks.spawn(async move {
            let attempt = match job.envelope.as_deref() {
                None => None,
                Some(env) => Some(
                    match env
                        .sinks
                        .get(job.row.key.sink.0 as usize)
                        .and_then(|id| deliverer.sink(id))
                    {
                        None => Attempt {
                            verdict: Verdict::Dead,
                            status: 0,
                            error: "the hook's sink is no longer configured".into(),
                            latency: Duration::ZERO,
                        },
                        Some(sink) => {
                            let _sink_permit = sink.permits.clone().acquire_owned().await;
                            let a = deliverer.attempt(&sink, env, max_retry_after).await;
                            metrics
                                .delivery_attempts
                                .get_or_create(&SinkOutcome {
                                    sink: sink.id.clone(),
                                    outcome: a.outcome().to_owned(),
                                })
                                .inc();
                            metrics
                                .delivery_latency
                                .get_or_create(&SinkLabel {
                                    sink: sink.id.clone(),
                                })
                                .observe(a.latency.as_secs_f64());
                            a
                        }
                    },
                ),
            };
            let _ = done_tx
                .send(Done {
                    job,
                    attempt,
                    _permit: permit,
                })
                .await;
        });
    }
    Ok((cursors, claimed))
}

/// The blocking half of a tick: plan, claim (one batch), clean the markers of the tenants
/// claimed from, and read the hooks and delivery rows of the claimed rows.
fn claim_tick(
    store: &Store,
    limits: TickLimits,
    mut cursors: Cursors,
) -> Result<(Cursors, Vec<Job>, usize), StoreError> {
    let now = AtMs(crate::now_ms());
    let plan = plan_tick(store, now, &limits, &cursors)?;
    let mut tx = Tx::new();
    let mut rows = Vec::new();
    for w in &plan.work {
        for r in &w.rows {
            rows.push(deliveries::claim(&mut tx, r));
        }
    }
    // One unit per claim, in order: a row another writer moved first (purged, say) is
    // not ours to deliver.
    let committed = tx.commit(store, false)?;
    let rows: Vec<InflightRow> = rows
        .into_iter()
        .zip(committed.moved)
        .filter_map(|(r, moved)| moved.then_some(r))
        .collect();
    for w in &plan.work {
        deliveries::cleanup_markers(store, w.ord, &w.buckets, now)?;
        match w.rows.last() {
            // A full share: more may wait from here on.
            Some(last) if w.rows.len() >= limits.rows_per_tenant => {
                cursors.advance(w.ord, last.key.at)
            }
            // Drained up to now: start from the beginning next time.
            _ => cursors.evict(w.ord),
        }
    }
    let mut seqs: Vec<Seq> = rows.iter().map(|r| r.key.seq).collect();
    seqs.sort();
    seqs.dedup();
    let hooks = store.multi_get(
        Cf::Hooks,
        &seqs.iter().map(|s| keys::hook(*s)).collect::<Vec<_>>(),
    )?;
    let envs: HashMap<Seq, Arc<Envelope>> = seqs
        .into_iter()
        .zip(hooks)
        .filter_map(|(s, v)| Some((s, Arc::new(Envelope::decode(&v?).ok()?))))
        .collect();
    let states = store.multi_get(
        Cf::Deliveries,
        &rows
            .iter()
            .map(|r| keys::delivery(r.key.seq, r.key.sink))
            .collect::<Vec<_>>(),
    )?;
    let jobs = rows
        .into_iter()
        .zip(states)
        .map(|(row, state)| Job {
            state: state
                .and_then(|v| DeliveryRow::decode(&v).ok())
                .unwrap_or(DeliveryRow {
                    ord: row.key.ord,
                    size: row.size,
                    ..DeliveryRow::default()
                }),
            envelope: envs.get(&row.key.seq).cloned(),
            row,
        })
        .collect();
    Ok((cursors, jobs, plan.tenants_visited))
}

/// Commits finished attempts in batches: delivered, retry (with backoff), dead-letter, or
/// orphan drop. Outcomes are not synced: a lost outcome only means a redelivery.
async fn commit_outcomes(
    store: Arc<Store>,
    mut rx: tokio::sync::mpsc::Receiver<Done>,
    retry: RetryConfig,
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
        let store = store.clone();
        let retry = retry.clone();
        let result = tokio::task::spawn_blocking(move || {
            let now = crate::now_ms();
            let mut tx = Tx::new();
            for d in &batch {
                outcome_ops(&mut tx, d, &retry, max_retry_after, now);
            }
            // The permits in `batch` are released once the outcomes are committed.
            tx.commit(&store, false)
        })
        .await;
        match result {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::error!(error = %e, "dispatch: committing outcomes"),
            Err(e) => tracing::error!(error = %e, "dispatch: outcome task"),
        }
    }
}

fn outcome_ops(tx: &mut Tx, d: &Done, retry: &RetryConfig, max_retry_after: Duration, now: u64) {
    let row = &d.job.row;
    let (Some(env), Some(a)) = (d.job.envelope.as_deref(), d.attempt.as_ref()) else {
        // The hook is gone or does not decode: an orphan, dropped through the counted path.
        deliveries::orphan_drop(tx, row);
        return;
    };
    let mut state = d.job.state.clone();
    state.attempts += 1;
    state.last_attempt_at = now;
    state.last_status = a.status;
    state.last_error = a.error.clone();
    match &a.verdict {
        Verdict::Delivered => deliveries::delivered(tx, row),
        Verdict::Retry { retry_after } if state.attempts < retry.max_attempts => {
            let planned = backoff(retry, state.attempts, rand::random::<f64>());
            let delay = retry_after.map_or(planned, |ra| ra.min(max_retry_after).max(planned));
            let at = AtMs(now + delay.as_millis() as u64);
            deliveries::retry(tx, row, at, &state);
        }
        Verdict::Retry { .. } | Verdict::Dead => {
            deliveries::dead_letter(tx, row, AtMs(now), &env.source, &env.id, Some(&state));
        }
    }
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
