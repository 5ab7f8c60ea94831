//! A claimed or started delivery on its way out ([`Runner`]), and the [`Starter`] that
//! starts a fresh hook's delivery at its ingest commit.

use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument;

use super::crew::{Crew, Work};
use super::slots::{TenantSlot, TenantSlots};
use super::{Done, Job, Metered, SinkSeries};
use crate::dispatch::delivery::{Attempt, ClaimSlot, Deliverer, Verdict};
use ankusa_keyspace::TenantOrd;
use ankusa_records::DeliveryRow;

/// Lines about outcomes the committer refused: once it is gone, every delivery would
/// write one.
static COMMITTER_GONE_LOG: crate::telemetry::LogLimit = crate::telemetry::LogLimit::new(1);

/// What a running delivery needs: its sink (with its series), and where its outcome goes.
pub(super) struct Runner {
    pub(super) deliverer: Arc<Deliverer>,
    pub(super) metrics: Arc<crate::metrics::Metrics>,
    /// The sinks and their series, rebuilt when a reload installs other sinks.
    pub(super) meters: arc_swap::ArcSwap<SinkSeries>,
    /// To the outcome committer's thread.
    pub(super) done_tx: std::sync::mpsc::Sender<Done>,
    pub(super) max_retry_after: Duration,
}

impl Runner {
    /// The sinks installed now, with their series.
    fn sinks(&self) -> Arc<SinkSeries> {
        let series = self.meters.load_full();
        if series.generation == self.deliverer.generation() {
            return series;
        }
        let fresh = Arc::new(SinkSeries::of(&self.deliverer, &self.metrics));
        self.meters.store(fresh.clone());
        fresh
    }

    /// The sink of delivery `k` of `env` and its series (`true`: the endpoints' shared
    /// one); `Ok(None)`: no such sink now; `Err`: its endpoint could not be read.
    #[allow(clippy::type_complexity)]
    fn target<'s>(
        &self,
        sinks: &'s SinkSeries,
        env: &ankusa_records::Envelope,
        k: usize,
    ) -> Result<
        Option<(
            Arc<crate::dispatch::delivery::Sink>,
            &'s crate::metrics::SinkMeters,
            bool,
        )>,
        String,
    > {
        let Some(id) = env.sinks.get(k) else {
            return Ok(None);
        };
        if id.starts_with(ankusa_config::ENDPOINT_ID_PREFIX) {
            let sink = self.deliverer.sink_for(env.tenant_or_default(), id)?;
            return Ok(sink.map(|s| (s, &sinks.endpoints, true)));
        }
        Ok(sinks
            .by_id
            .get(id)
            .map(|Metered { sink, meters }| (sink.clone(), meters, false)))
    }

    /// One claimed (or started) delivery: its attempt, in its tenant's turn in the sink's
    /// line, then its outcome to the committer (which gives the permit back).
    async fn deliver(&self, mut job: Job, permit: tokio::sync::OwnedSemaphorePermit) {
        let sinks = self.sinks();
        // A corrupt row is not attempted: its outcome is the dead letter.
        let attempt = match job.envelope.as_deref().filter(|_| job.corrupt.is_none()) {
            None => None,
            Some(env) => Some(
                match self.target(&sinks, env, job.row.key.sink.0 as usize) {
                    Err(error) => Attempt {
                        verdict: Verdict::Retry { retry_after: None },
                        status: 0,
                        class: Some(ankusa_records::ErrorClass::Unconfigured),
                        error,
                        latency: Duration::ZERO,
                        duplicate: false,
                        marked: false,
                    },
                    Ok(None) => Attempt {
                        verdict: Verdict::Dead,
                        status: 0,
                        class: Some(ankusa_records::ErrorClass::Unconfigured),
                        error: gone(env, job.row.key.sink.0 as usize),
                        latency: Duration::ZERO,
                        duplicate: false,
                        marked: false,
                    },
                    Ok(Some((sink, m, shared))) => {
                        let span = tracing::debug_span!(
                            target: crate::telemetry::TARGET,
                            "delivery",
                            hook_id = env.id.as_str(),
                            tenant = env.tenant_or_default(),
                            sink = sink.id.as_str(),
                            attempt = job.state.attempts + 1,
                            status = tracing::field::Empty,
                            outcome = tracing::field::Empty,
                        );
                        crate::telemetry::in_hook_trace(&span, &env.id);
                        // The claim took one of the sink's claim slots; the request
                        // waits only for its tenant's turn in the sink's line.
                        let a = async {
                            let _request = sink.line.acquire(job.row.key.ord).await;
                            self.deliverer
                                .attempt(&sink, env, self.max_retry_after)
                                .await
                        }
                        .instrument(span.clone())
                        .await;
                        span.record("status", a.status);
                        span.record("outcome", a.label().label());
                        let now = std::time::Instant::now();
                        let (limit, breaker) = sink.control.record(a.signal(), now);
                        let (requests, queued) = sink.line.set_limit(limit);
                        // The endpoints' one series counts; its gauges would be any one
                        // endpoint's.
                        if !shared {
                            m.limit.set(limit as i64);
                            m.breaker.set(breaker as i64);
                            m.requests.set(requests as i64);
                            m.queued.set(queued as i64);
                        }
                        m.attempt(a.label()).inc();
                        if a.duplicate {
                            m.duplicates.inc();
                        }
                        m.latency.observe(a.latency.as_secs_f64());
                        m.recent.observe(a.latency);
                        a
                    }
                },
            ),
        };
        // The sink's slot is free again as soon as the attempt is over.
        if job.sink_slot.take().is_some() {
            job.tenant_slot.slots.notify_freed();
        }
        // The committer ends only once every sender is gone, so a refusal means its
        // thread died: the row stays inflight, made due again at the next boot.
        if self
            .done_tx
            .send(Done {
                job,
                attempt,
                _permit: permit,
            })
            .is_err()
        {
            if let Some(left_out) = COMMITTER_GONE_LOG.admit(ankusa_keyspace::now_ms() / 1000) {
                tracing::error!(left_out, "dispatch: the outcome committer is gone; this delivery's row is due again after the next boot");
            }
        }
    }
}

/// Why delivery `k` of `env` has no sink: a configured one removed, or a tenant's endpoint
/// deleted or disabled.
fn gone(env: &ankusa_records::Envelope, k: usize) -> String {
    match env.sinks.get(k) {
        Some(id) if id.starts_with(ankusa_config::ENDPOINT_ID_PREFIX) => {
            format!("the tenant's endpoint {id} is deleted or disabled")
        }
        _ => "the hook's sink is no longer configured".into(),
    }
}

/// The delivery tasks run each job with the permit it holds ([`Crew`]).
impl Work for Runner {
    type Job = (Job, tokio::sync::OwnedSemaphorePermit);
    fn run(&self, (job, permit): Self::Job) -> impl std::future::Future<Output = ()> + Send + '_ {
        self.deliver(job, permit)
    }
}

/// The pipeline's side of starting a fresh delivery at its ingest commit
/// ([`ankusa_queue::writer::Starts`]). The writer offers each delivery of each hook it
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
    pub(super) parts: std::sync::OnceLock<StartParts>,
    /// `(refusals << 1) | open`: the refusals counted since boot, and whether starts are
    /// given (a tick opens the gate only if the count did not move while it ran).
    pub(super) gate: std::sync::atomic::AtomicU64,
    pub(super) stopping: std::sync::atomic::AtomicBool,
    /// The paused tenants: none of their deliveries starts at commit.
    pub paused: Arc<crate::dispatch::paused::Paused>,
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
pub(super) struct StartParts {
    pub(super) permits: Arc<tokio::sync::Semaphore>,
    pub(super) tenants: TenantSlots,
    pub(super) deliverer: Arc<Deliverer>,
    /// The delivery tasks: closed once the pipeline stops.
    pub(super) crew: Arc<Crew<Runner>>,
    pub(super) started: prometheus_client::metrics::counter::Counter,
}

/// The slots a started delivery runs with (inside a [`StartSlot`]).
pub(super) struct StartSlots {
    pub(super) permit: tokio::sync::OwnedSemaphorePermit,
    pub(super) sink: ClaimSlot,
    pub(super) tenant: TenantSlot,
}

impl Starter {
    /// A starter that starts nothing for the tenants `paused` holds.
    pub fn with_paused(paused: Arc<crate::dispatch::paused::Paused>) -> Starter {
        Starter {
            paused,
            ..Starter::default()
        }
    }

    pub(super) fn attach(&self, parts: StartParts) {
        // A pipeline is spawned once per starter; a second would only start nothing.
        let _ = self.parts.set(parts);
    }

    /// The refusals counted so far.
    pub(super) fn epoch(&self) -> u64 {
        self.gate.load(std::sync::atomic::Ordering::Acquire) >> 1
    }

    /// Opens the gate, unless a start was refused since `epoch` (or it is open).
    pub(super) fn open_since(&self, epoch: u64) {
        use std::sync::atomic::Ordering;
        let _ = self.gate.compare_exchange(
            epoch << 1,
            (epoch << 1) | 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        );
    }

    /// A refusal: the gate closes and the count moves.
    pub(super) fn close(&self) {
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

    pub(super) fn stop(&self) {
        self.stopping
            .store(true, std::sync::atomic::Ordering::Release);
        self.close();
    }
}

impl ankusa_queue::writer::Starts for Starter {
    fn try_start(
        &self,
        ord: TenantOrd,
        tenant: &str,
        sink: &str,
    ) -> Option<ankusa_queue::writer::StartSlot> {
        let p = self.parts.get()?;
        // A paused tenant's row is written due and waits; no tick takes it either, so
        // the gate (which only guards the ticks' order) stays as it is.
        if self.paused.holds(ord) {
            return None;
        }
        // An endpoint that cannot be read now is left to a tick.
        let Ok(target) = p.deliverer.sink_for(tenant, sink) else {
            self.close();
            return None;
        };
        // A pull sink's row (no HTTP sink of that id) is written due for the tick to park:
        // nothing to start, and nothing the gate guards (no push row waits behind it).
        if target.is_none() && p.deliverer.is_pull(sink) {
            return None;
        }
        // A row refused while the gate is closed counts too: a tick that began before it
        // has not seen it, and must not open the gate behind it.
        let slots = self.is_open().then(|| {
            let sink = target?;
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
            Some(s) => Some(ankusa_queue::writer::StartSlot(Box::new(s))),
            None => {
                self.close();
                None
            }
        }
    }

    fn waiting(&self) {
        self.close();
    }

    fn started(&self, rows: Vec<ankusa_queue::writer::Started>) {
        let Some(p) = self.parts.get() else { return };
        let mut jobs = Vec::with_capacity(rows.len());
        for ankusa_queue::writer::Started {
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
            jobs.push((job, permit));
        }
        // A pipeline that stopped runs nothing more: the rows stay inflight for the stop's
        // (or the next boot's) recovery to make due.
        let n = jobs.len() as u64;
        if p.crew.give(jobs) {
            p.started.inc_by(n);
        }
    }
}
