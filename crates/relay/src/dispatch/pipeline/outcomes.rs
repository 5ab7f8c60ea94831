//! Finished attempts committed in batches: delivered, retried with backoff,
//! dead-lettered, or dropped as orphans.

use std::sync::Arc;
use std::time::Duration;

use super::Done;
use crate::dispatch::delivery::Verdict;
use crate::dispatch::outcome::{outcome_ops, Failed, Finished};
use ankusa_config::RetryConfig;
use ankusa_keyspace::{AtMs, EventKind, TenantOrd};
use ankusa_queue::deliveries::{self, InflightRow, Tx};
use ankusa_queue::engine::Store;
use ankusa_queue::hints::DueHints;
use ankusa_queue::QueueError;
use ankusa_records::{AttemptOutcome, ErrorClass};

/// How long the outcome committer lets outcomes gather after the first of a batch: a
/// delivered hook's slot and permit are held this much longer, and under a steady load a
/// batch commits several outcomes for one wake-up of the thread.
const GATHER: Duration = Duration::from_micros(1_000);

/// What the outcome committer needs besides its channel.
pub(super) struct Committer {
    pub(super) store: Arc<Store>,
    pub(super) retry: RetryConfig,
    pub(super) log: bool,
    pub(super) hints: Arc<DueHints>,
    pub(super) reclaimed: prometheus_client::metrics::counter::Counter,
    pub(super) stop: tokio::sync::watch::Receiver<bool>,
}

/// Starts the outcome committer on a thread of its own (`ankusa-outcomes`): it commits
/// finished attempts in batches — delivered, retry (with backoff), dead-letter, or orphan
/// drop — each batch every outcome that came within [`GATHER`] of its first (at most
/// 1 024), and ends when every sender is gone. Outcomes are not synced: a lost outcome
/// only means a redelivery.
///
/// A thread rather than a task handing each batch to the blocking pool: a batch costs the
/// thread's wake-up and its timer's, where the pool cost three hand-offs (the task's, the
/// pool thread's and the task's again) per batch of a few outcomes — a share of each
/// hook's CPU (docs/performance.md). The channel needs no bound of its own: every outcome
/// in it holds one of the pipeline's `max_inflight` permits.
pub(super) fn spawn_committer(
    c: Committer,
    rx: std::sync::mpsc::Receiver<Done>,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("ankusa-outcomes".into())
        .spawn(move || {
            while let Ok(first) = rx.recv() {
                // Outcomes sent while it sleeps wake nobody: one wake-up per batch, not one
                // per outcome.
                std::thread::sleep(GATHER);
                let mut batch = vec![first];
                batch.extend(rx.try_iter().take(1023));
                commit_batch(&c, &batch);
                // The batch's permits go back as it drops, its outcomes committed.
            }
        })
}

/// Commits one batch of outcomes. A batch whose commit fails (a full disk, a failed WAL
/// sync) is committed again once a second until it succeeds: nothing was written, and its
/// rows must not stay inflight until the next boot. Its slots stay held meanwhile, so the
/// pipeline claims nothing new. Only a stop gives up; boot recovery then makes the rows due
/// again (a redelivery, never a loss).
fn commit_batch(c: &Committer, batch: &[Done]) {
    // Built only with `log.spans` (or an OTLP endpoint): the batch's one write.
    let span = tracing::debug_span!(
        target: crate::telemetry::TARGET,
        "outcomes.commit",
        outcomes = batch.len(),
        tries = tracing::field::Empty,
    );
    let _in = span.enter();
    let mut tries = 0u32;
    loop {
        tries += 1;
        span.record("tries", tries);
        match commit_once(c, batch) {
            // Each retry is claimed when it comes due, not at the next full scan.
            Ok(Committed {
                retries,
                removed,
                failed,
            }) => {
                c.hints.add_later(retries);
                c.reclaimed.inc_by(removed);
                for (i, f) in failed {
                    log_failed(&batch[i], &f);
                }
                return;
            }
            Err(e) if !*c.stop.borrow() => {
                tracing::debug!(error = %e, outcomes = batch.len(), "dispatch: committing outcomes, again in 1 s");
                std::thread::sleep(Duration::from_secs(1));
            }
            Err(e) => {
                tracing::error!(error = %e, outcomes = batch.len(), "dispatch: outcomes not committed at stop; their rows are due again after the next boot");
                return;
            }
        }
    }
}

/// What a committed batch of outcomes leaves to do.
struct Committed {
    /// The retries' tenants and due times, to hint.
    retries: Vec<(TenantOrd, AtMs)>,
    /// Hooks taken along by their last delivery.
    removed: u64,
    /// The failed attempts (by their place in the batch), to log.
    failed: Vec<(usize, Failed)>,
}

/// One try at committing a batch: one unit per outcome, in one write.
fn commit_once(c: &Committer, batch: &[Done]) -> Result<Committed, QueueError> {
    let max_retry_after = Duration::from_millis(c.retry.max_retry_after_ms);
    let now = ankusa_keyspace::now_ms();
    let mut tx = Tx::new();
    let mut retries = Vec::new();
    let mut failed = Vec::new();
    let takes_hook = last_needs(&c.store, batch)?;
    let log = c.log.then_some(&*c.store);
    for (i, (d, last)) in batch.iter().zip(&takes_hook).enumerate() {
        let s = outcome_ops(
            &mut tx,
            log,
            &d.finished(),
            *last,
            &c.retry,
            max_retry_after,
            now,
        )?;
        retries.extend(s.due_again);
        failed.extend(s.failed.map(|f| (i, f)));
        if let Some(forget) = kafka_marker(d) {
            tx.push(forget);
        }
    }
    // One unit per outcome: a hook went only with a row that moved.
    let committed = tx.commit(&c.store, false)?;
    let removed = takes_hook
        .iter()
        .zip(&committed.moved)
        .filter(|(t, m)| **t && **m)
        .count() as u64;
    Ok(Committed {
        retries,
        removed,
        failed,
    })
}

/// The change that deletes a Kafka delivery's marker with its outcome, if one stands.
fn kafka_marker(d: &Done) -> Option<ankusa_queue::Change> {
    let (env, a) = (d.job.envelope.as_deref()?, d.attempt.as_ref()?);
    let sink = env.sinks.get(d.job.row.key.sink.0 as usize)?;
    a.marked
        .then(|| ankusa_queue::kafka::forget_op(sink, &env.id))
}

/// For each finished attempt, whether it is a delivery that takes its hook along: the
/// row was the last thing the hook was kept for ([`deliveries::last_needs`], one read for
/// the batch).
pub(super) fn last_needs(store: &Store, batch: &[Done]) -> Result<Vec<bool>, QueueError> {
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

/// Lines about failed deliveries: a sink that refuses everything could write one per
/// attempt.
static FAILED_LOG: crate::telemetry::LogLimit = crate::telemetry::LogLimit::new(5);

/// Logs one failed attempt (committed): WARN when it went to the DLQ, INFO when it will be
/// tried again. At most [`FAILED_LOG`]'s budget a second; `left_out` counts the rest.
fn log_failed(d: &Done, f: &Failed) {
    let (Some(env), Some(a)) = (d.job.envelope.as_deref(), d.attempt.as_ref()) else {
        return;
    };
    let Some(left_out) = FAILED_LOG.admit(ankusa_keyspace::now_ms() / 1000) else {
        return;
    };
    let sink = env
        .sinks
        .get(d.job.row.key.sink.0 as usize)
        .map_or("", String::as_str);
    let tenant = env.tenant_or_default();
    let class = a.class.map_or("", ErrorClass::name);
    match f.outcome {
        AttemptOutcome::Dead => tracing::warn!(
            hook = %env.id, tenant, sink, attempt = f.attempt, status = a.status, class,
            error = %a.error, left_out,
            "a delivery failed for good: dead-lettered (GET /v1/dlq, `admin dlq replay`)"
        ),
        _ => tracing::info!(
            hook = %env.id, tenant, sink, attempt = f.attempt, status = a.status, class,
            error = %a.error, left_out,
            retry_in_ms = f.next_at.map_or(0, |at| at.0.saturating_sub(ankusa_keyspace::now_ms())),
            "a delivery failed; it will be tried again"
        ),
    }
}

impl Done {
    fn finished(&self) -> Finished<'_> {
        Finished {
            row: &self.job.row,
            state: &self.job.state,
            envelope: self.job.envelope.as_deref(),
            corrupt: self.job.corrupt.as_ref(),
            attempt: self.attempt.as_ref(),
            kind: EventKind::Attempt,
        }
    }
}
