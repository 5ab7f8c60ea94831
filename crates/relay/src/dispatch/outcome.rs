//! What a finished attempt commits, for the pipeline's push deliveries and the pull
//! gateway's lease ends alike: its outcome's ops (delivered, retried on the schedule,
//! dead-lettered, or dropped as an orphan) and its hook-log event, as one unit of a
//! transaction ([`outcome_ops`]).

use std::sync::Arc;
use std::time::Duration;

use crate::dispatch::delivery::{backoff, Attempt, Verdict};
use ankusa_config::RetryConfig;
use ankusa_keyspace::{AtMs, EventKind, TenantOrd};
use ankusa_queue::deliveries::{self, InflightRow, Tx};
use ankusa_queue::engine::Store;
use ankusa_queue::hooklog;
use ankusa_queue::QueueError;
use ankusa_records::AttemptOutcome;

/// A failed attempt whose outcome was committed: retried, or dead-lettered.
pub(crate) struct Failed {
    pub(crate) outcome: AttemptOutcome,
    /// The attempt's number (1 = first).
    pub(crate) attempt: u32,
    /// A retry's due time.
    pub(crate) next_at: Option<AtMs>,
}

/// What one outcome came to: a retry's tenant and due time, and a failure to log.
#[derive(Default)]
pub(crate) struct Settled {
    pub due_again: Option<(TenantOrd, AtMs)>,
    pub failed: Option<Failed>,
}

/// One finished attempt, as its outcome is committed: a push delivery's (the pipeline's)
/// or a pull lease's end (the pull gateway).
pub(crate) struct Finished<'a> {
    pub(crate) row: &'a InflightRow,
    /// The delivery row as read when the attempt began (attempts so far).
    pub(crate) state: &'a ankusa_records::DeliveryRow,
    pub(crate) envelope: Option<&'a ankusa_records::Envelope>,
    pub(crate) corrupt: Option<&'a Arc<str>>,
    pub(crate) attempt: Option<&'a Attempt>,
    /// The hook log event it writes: an attempt, or a pull lease's ack, nack or expiry.
    pub(crate) kind: EventKind,
}

/// Adds one finished attempt's outcome as one unit (and, with `log`, its hook log event);
/// a retry's tenant and due time. A delivered row that was its hook's last need (`last`)
/// takes the hook with it, in the same unit (no marker for reclaim to come back to).
pub(crate) fn outcome_ops(
    tx: &mut Tx,
    log: Option<&Store>,
    d: &Finished<'_>,
    last: bool,
    retry: &RetryConfig,
    max_retry_after: Duration,
    now: u64,
) -> Result<Settled, QueueError> {
    let row = d.row;
    if let Some(error) = d.corrupt {
        // Corruption: the row goes to the DLQ with the error, where it shows and counts,
        // and a replay sends it once the store is whole again.
        let mut state = d.state.clone();
        state.last_attempt_at = now;
        state.last_error = error.to_string();
        // Without a readable hook the sink has no name here; the DLQ shows its index.
        let env = d.envelope;
        let sink = env
            .and_then(|e| e.sinks.get(row.key.sink.0 as usize).cloned())
            .unwrap_or_else(|| format!("#{}", row.key.sink.0));
        let (source, id) = env.map_or(("", ""), |e| (e.source.as_str(), e.id.as_str()));
        deliveries::dead_letter(tx, row, AtMs(now), source, id, &sink, Some(&state));
        return Ok(Settled::default());
    }
    // The hook is gone: an orphan, dropped through the counted path. A pull consumer's ack
    // settles without reading it (a delivered row needs nothing of the hook's).
    let env = match (d.envelope, d.attempt) {
        (Some(env), Some(_)) => Some(env),
        (None, Some(a)) if d.kind == EventKind::Acked && a.verdict == Verdict::Delivered => None,
        _ => {
            deliveries::orphan_drop(tx, row);
            return Ok(Settled::default());
        }
    };
    let Some(a) = d.attempt else {
        return Ok(Settled::default());
    };
    let mut state = d.state.clone();
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
            let (source, id, sink) = env.map_or(("", "", ""), |env| {
                let sink = env
                    .sinks
                    .get(row.key.sink.0 as usize)
                    .map_or("", String::as_str);
                (env.source.as_str(), env.id.as_str(), sink)
            });
            deliveries::dead_letter(tx, row, AtMs(now), source, id, sink, Some(&state));
            (AttemptOutcome::Dead, Some(AtMs(now)), None)
        }
    };
    if let Some(store) = log {
        let ev = ankusa_records::Event {
            kind: d.kind,
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
    let failed = (outcome != AttemptOutcome::Delivered).then_some(Failed {
        outcome,
        attempt: state.attempts,
        next_at,
    });
    Ok(Settled { due_again, failed })
}
