//! Settling leases: a consumer's acks, nacks and extensions, and what the gateway ends
//! itself (an expiry, a revocation by a pause or an erase, a hook it cannot hand out),
//! each committed as a push outcome is; and the expiry task that runs at the soonest
//! deadline.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use ankusa_keyspace::{AtMs, EventKind, Seq, SinkIdx, TenantOrd};
use ankusa_queue::deliveries::{self, InflightRow, Lease, Tx};
use ankusa_queue::QueueError;
use ankusa_records::{DeliveryRow, Envelope, ErrorClass};

use crate::dispatch::delivery::{Attempt, PullWake, Verdict};
use crate::dispatch::outcome::{outcome_ops, Finished};

use super::book;
use super::{delivery_rows, envelopes, lease::parse_lease_id, Conflict, Consumer, Gateway, Settle};

impl Gateway {
    /// Settles leases of `sink` for `consumer`: each is acked (delivered) or nacked
    /// (retried on the schedule, dead-lettered past the attempts), if it is still the
    /// lease the consumer holds. Committed (not synced, as a push outcome) before it
    /// returns.
    pub fn settle(
        &self,
        sink: &str,
        consumer: &Consumer,
        leases: &[String],
        how: Settle,
    ) -> Result<Vec<Option<Conflict>>, QueueError> {
        let now = ankusa_keyspace::now_ms();
        let with_hook = matches!(how, Settle::Nack { .. });
        let held = self.held(sink, consumer, leases, now, with_hook)?;
        let store = &*self.store;
        let rows: Vec<(InflightRow, usize)> = held
            .iter()
            .flatten()
            .filter(|_| matches!(how, Settle::Ack))
            .map(|h| (h.row, usize::from(h.lease.sinks)))
            .collect();
        let mut last = deliveries::last_needs(store, &rows)?.into_iter();
        let mut tx = Tx::new();
        let mut retries = Vec::new();
        let mut units = Vec::new();
        for (i, h) in held.iter().enumerate() {
            let Some(h) = h else { continue };
            let attempt = match how {
                Settle::Ack => Attempt {
                    verdict: Verdict::Delivered,
                    status: 0,
                    class: None,
                    error: String::new(),
                    latency: Duration::from_millis(now.saturating_sub(h.lease.claimed_at.0)),
                    duplicate: false,
                    marked: false,
                },
                Settle::Nack { retry_after } => Attempt {
                    verdict: Verdict::Retry { retry_after },
                    status: 0,
                    class: Some(ErrorClass::Nacked),
                    error: format!("nacked by consumer {}", consumer.name),
                    latency: Duration::from_millis(now.saturating_sub(h.lease.claimed_at.0)),
                    duplicate: false,
                    marked: false,
                },
            };
            let kind = match how {
                Settle::Ack => EventKind::Acked,
                Settle::Nack { .. } => EventKind::Nacked,
            };
            let takes_hook = matches!(how, Settle::Ack) && last.next().unwrap_or(false);
            let s = self.outcome(&mut tx, sink, h, &attempt, kind, takes_hook, now)?;
            retries.extend(s);
            units.push(i);
        }
        let committed = tx.commit(store, false)?;
        let mut out = Vec::with_capacity(held.len());
        for (i, h) in held.iter().enumerate() {
            out.push(match h {
                Some(_) => None,
                None => Some(self.why_not(&leases[i], now)?),
            });
        }
        let meters = self.metrics.pull.sink(sink);
        let mut settled = 0u64;
        {
            let mut book = self.book();
            for (i, moved) in units.into_iter().zip(committed.moved) {
                let Some(h) = &held[i] else { continue };
                if moved {
                    book.remove(h.row.key.seq, h.row.key.sink, h.lease.nonce);
                    meters.held.observe(held_for(&h.lease, now));
                    settled += 1;
                } else {
                    out[i] = Some(Conflict::Unknown);
                }
            }
        }
        self.hints.add_later(retries);
        match how {
            Settle::Ack => meters.acked.inc_by(settled),
            Settle::Nack { .. } => meters.nacked.inc_by(settled),
        };
        if settled > 0 {
            // Leases gave their places back: a claim waiting at a quota may take rows now.
            self.deliverer.pull_wake.of(sink).notify_waiters();
        }
        meters.leases.set(self.book().count(sink) as i64);
        Ok(out)
    }

    /// Extends leases of `sink` to `lease_ms` from now.
    pub fn extend(
        &self,
        sink: &str,
        consumer: &Consumer,
        leases: &[String],
        lease_ms: u64,
    ) -> Result<(Vec<Option<Conflict>>, AtMs), QueueError> {
        let now = ankusa_keyspace::now_ms();
        let held = self.held(sink, consumer, leases, now, false)?;
        let deadline = AtMs(now + lease_ms);
        let lifetime = self.settings().max_lease_lifetime_ms;
        let mut tx = Tx::new();
        let mut units = Vec::new();
        let mut past_lifetime = HashSet::new();
        for (i, h) in held.iter().enumerate() {
            let Some(h) = h else { continue };
            // A lease lives at most `pull.max_lease_lifetime_ms` from its claim: a consumer
            // cannot keep a hook (or an erase waiting) forever by extending it.
            if deadline.0 > h.lease.claimed_at.0.saturating_add(lifetime) {
                past_lifetime.insert(i);
                continue;
            }
            let new = Lease {
                deadline,
                ..h.lease
            };
            deliveries::extend_lease(&mut tx, h.row.key.seq, h.row.key.sink, &h.lease, &new);
            units.push((i, new));
        }
        let committed = tx.commit(&self.store, false)?;
        let mut out = Vec::with_capacity(held.len());
        for (i, h) in held.iter().enumerate() {
            out.push(match h {
                Some(_) if past_lifetime.contains(&i) => Some(Conflict::Lifetime),
                Some(_) => None,
                None => Some(self.why_not(&leases[i], now)?),
            });
        }
        let mut book = self.book();
        for ((i, new), moved) in units.into_iter().zip(committed.moved) {
            let Some(h) = &held[i] else { continue };
            if moved {
                let holder = book::Holder {
                    consumer: Some(consumer.key.clone()),
                    ord: h.row.key.ord,
                    hook: None,
                };
                book.insert(sink, h.row.key.seq, h.row.key.sink, &new, holder);
            } else {
                out[i] = Some(Conflict::Unknown);
            }
        }
        Ok((out, deadline))
    }

    /// For each lease id: the lease and its inflight row (and, `with_hook`, its hook), if
    /// the consumer holds it on this sink and it has not expired.
    fn held(
        &self,
        sink: &str,
        consumer: &Consumer,
        leases: &[String],
        now: u64,
        with_hook: bool,
    ) -> Result<Vec<Option<Held>>, QueueError> {
        let store = &*self.store;
        let ids: Vec<Option<(Seq, SinkIdx, u64)>> = leases
            .iter()
            .map(|l| {
                parse_lease_id(l)
                    .filter(|p| p.node == self.node())
                    .map(|p| p.key())
            })
            .collect();
        let keys: Vec<(Seq, SinkIdx)> = ids.iter().flatten().map(|(s, k, _)| (*s, *k)).collect();
        let found = deliveries::read_leases(store, &keys)?;
        let states = delivery_rows(store, &keys)?;
        let mut envs = if with_hook {
            envelopes(store, keys.iter().map(|(s, _)| *s))?
        } else {
            Vec::new()
        }
        .into_iter();
        // A tenant's consumer holds only its tenants' leases.
        let sees: Option<HashSet<TenantOrd>> = match &consumer.tenants {
            None => None,
            Some(names) => {
                let mut ords = HashSet::new();
                for n in names {
                    ords.extend(ankusa_queue::tenants::ord(store, n)?);
                }
                Some(ords)
            }
        };
        let hash = deliveries::sink_hash(sink);
        // The hooks' ids and tenants, as this process's claims read them (a settle's span).
        let names: Vec<Option<Arc<book::HookName>>> = {
            let book = self.book();
            keys.iter().map(|(s, i)| book.hook(*s, *i)).collect()
        };
        let mut names = names.into_iter();
        let mut found = found.into_iter().zip(states);
        let mut out = Vec::with_capacity(ids.len());
        for id in &ids {
            let Some((seq, idx, nonce)) = *id else {
                out.push(None);
                continue;
            };
            let Some((lease, state)) = found.next() else {
                out.push(None);
                continue;
            };
            let hook = names.next().flatten();
            let envelope = if with_hook {
                match envs.next() {
                    Some(Ok(env)) => Some(env),
                    _ => {
                        out.push(None);
                        continue;
                    }
                }
            } else {
                None
            };
            let held = match (lease, state) {
                (Some(lease), Some(state))
                    if lease.nonce == nonce
                        && lease.deadline.0 > now
                        && lease.sink_hash == hash
                        && sees.as_ref().is_none_or(|t| t.contains(&state.ord))
                        // A pause or an erase revoked its tenant's leases.
                        && !self.paused.holds(state.ord) =>
                {
                    Some(Held {
                        row: InflightRow {
                            key: ankusa_keyspace::InflightKey {
                                ord: state.ord,
                                seq,
                                sink: idx,
                            },
                            size: state.size,
                        },
                        state,
                        lease,
                        envelope,
                        hook,
                    })
                }
                _ => None,
            };
            out.push(held);
        }
        Ok(out)
    }

    /// Why a lease the consumer named is not held: expired if its lease is still there
    /// with this nonce past its deadline, unknown otherwise.
    fn why_not(&self, lease: &str, now: u64) -> Result<Conflict, QueueError> {
        let Some((seq, idx, nonce)) = parse_lease_id(lease)
            .filter(|p| p.node == self.node())
            .map(|p| p.key())
        else {
            return Ok(Conflict::Unknown);
        };
        Ok(match deliveries::read_lease(&self.store, seq, idx)? {
            Some(l) if l.nonce == nonce && l.deadline.0 <= now => Conflict::Expired,
            _ if self.book().expired_lately(seq, idx, nonce) => Conflict::Expired,
            _ => Conflict::Unknown,
        })
    }

    /// Adds one lease's outcome (it consumes the inflight row and the lease); a retry's
    /// tenant and due time.
    #[allow(
        clippy::too_many_arguments,
        reason = "one lease's outcome, named by its parts; three callers"
    )]
    fn outcome(
        &self,
        tx: &mut Tx,
        sink: &str,
        h: &Held,
        attempt: &Attempt,
        kind: EventKind,
        takes_hook: bool,
        now: u64,
    ) -> Result<Option<(TenantOrd, AtMs)>, QueueError> {
        let name = || match &h.envelope {
            Some(env) => Some(hook_name(env)),
            None => h.hook.clone(),
        };
        let by = match kind {
            EventKind::Acked | EventKind::Nacked => "consumer",
            _ => "gateway",
        };
        step_span(kind.name(), &name, sink, h.lease.attempt, by);
        let f = Finished {
            row: &h.row,
            state: &h.state,
            envelope: h.envelope.as_ref(),
            corrupt: None,
            attempt: Some(attempt),
            kind,
        };
        let max_retry_after = Duration::from_millis(self.retry.max_retry_after_ms);
        let log = self.log.then_some(&*self.store);
        let s = outcome_ops(tx, log, &f, takes_hook, &self.retry, max_retry_after, now)?;
        deliveries::settle_lease(tx, &h.row, &h.lease);
        Ok(s.due_again)
    }

    /// Settles one lease the gateway itself ends: an expiry, or a hook it could not hand
    /// out (gone: dropped as an orphan; undecodable: dead-lettered with the error).
    pub(super) fn settle_one(
        &self,
        sink: &str,
        seq: Seq,
        idx: SinkIdx,
        lease: Lease,
        why: Outcome,
    ) -> Result<bool, QueueError> {
        let store = &*self.store;
        let key = [(seq, idx)];
        let Some(state) = delivery_rows(store, &key)?.pop().flatten() else {
            // No delivery row: nothing to settle but the book's entry.
            self.book().remove(seq, idx, lease.nonce);
            return Ok(false);
        };
        let row = InflightRow {
            key: ankusa_keyspace::InflightKey {
                ord: state.ord,
                seq,
                sink: idx,
            },
            size: state.size,
        };
        let env = envelopes(store, [seq])?.pop();
        let now = ankusa_keyspace::now_ms();
        let mut tx = Tx::new();
        let mut due_again = None;
        match (&why, env) {
            (Outcome::Expired | Outcome::Revoked, Some(Ok(env))) => {
                let error = match why {
                    Outcome::Revoked => {
                        "the lease was revoked: its tenant was paused or is being erased"
                    }
                    _ => "the lease ran out before an ack",
                };
                let attempt = Attempt {
                    verdict: Verdict::Retry { retry_after: None },
                    status: 0,
                    class: Some(ErrorClass::LeaseExpired),
                    error: error.into(),
                    latency: Duration::from_millis(now.saturating_sub(lease.claimed_at.0)),
                    duplicate: false,
                    marked: false,
                };
                let h = Held {
                    row,
                    state,
                    lease,
                    envelope: Some(env),
                    hook: None,
                };
                let kind = EventKind::Expired;
                due_again = self.outcome(&mut tx, sink, &h, &attempt, kind, false, now)?;
            }
            (_, env) => {
                let corrupt: Option<Arc<str>> = match (&why, &env) {
                    (Outcome::Unsendable(e), _) if e.is_some() => e.clone(),
                    (_, Some(Err(Some(e)))) => Some(e.clone()),
                    _ => None,
                };
                let f = Finished {
                    row: &row,
                    state: &state,
                    envelope: None,
                    corrupt: corrupt.as_ref(),
                    attempt: None,
                    kind: EventKind::Attempt,
                };
                let max_retry_after = Duration::from_millis(self.retry.max_retry_after_ms);
                outcome_ops(&mut tx, None, &f, false, &self.retry, max_retry_after, now)?;
                deliveries::settle_lease(&mut tx, &row, &lease);
            }
        }
        let moved = tx.commit(store, false)?.count() > 0;
        {
            let mut book = self.book();
            book.remove(seq, idx, lease.nonce);
            if moved && matches!(why, Outcome::Expired) {
                book.expired(seq, idx, lease.nonce);
            }
        }
        self.hints.add_later(due_again);
        if moved {
            // A place given back: a claim waiting at a quota may take rows now.
            self.deliverer.pull_wake.of(sink).notify_waiters();
        }
        if moved && matches!(why, Outcome::Expired | Outcome::Revoked) {
            let meters = self.metrics.pull.sink(sink);
            meters.expired.inc();
            meters.held.observe(held_for(&lease, now));
        }
        self.metrics
            .pull
            .sink(sink)
            .leases
            .set(self.book().count(sink) as i64);
        Ok(moved)
    }

    /// Ends the leases whose deadline passed (at most `limit`); the soonest deadline left.
    pub fn expire_due(&self, limit: usize) -> Result<Option<AtMs>, QueueError> {
        let now = ankusa_keyspace::now_ms();
        let due = self.book().due(AtMs(now), limit);
        for e in due {
            // The lease as stored decides: extended, settled or replaced since, it is not
            // this one (an extension is back in the book with its new deadline).
            match deliveries::read_lease(&self.store, e.seq, e.sink)? {
                Some(l) if l.nonce == e.nonce && l.deadline.0 <= now => {
                    self.settle_one(&e.sink_id, e.seq, e.sink, l, Outcome::Expired)?;
                }
                Some(l) if l.nonce == e.nonce && self.paused.holds(e.ord) => {
                    self.settle_one(&e.sink_id, e.seq, e.sink, l, Outcome::Revoked)?;
                }
                Some(l) if l.nonce == e.nonce => {
                    let holder = book::Holder {
                        consumer: None,
                        ord: e.ord,
                        hook: None,
                    };
                    self.book().insert(&e.sink_id, e.seq, e.sink, &l, holder);
                }
                _ => {
                    self.book().remove(e.seq, e.sink, e.nonce);
                }
            }
        }
        Ok(self.book().next_deadline())
    }

    /// Makes the leases of paused and erasing tenants due now (the expiry then takes them
    /// back; a later ack or extension of one is `unknown`). How many.
    pub fn revoke_held(&self) -> usize {
        let now = AtMs(ankusa_keyspace::now_ms());
        let n = self.book().revoke(now, |ord| self.paused.holds(ord));
        if n > 0 {
            self.expiry_wake.notify_one();
        }
        n
    }
}

/// A lease the consumer holds, with what settling it needs.
struct Held {
    row: InflightRow,
    state: DeliveryRow,
    lease: Lease,
    /// Read for a nack (a dead-letter names the hook's source and id), not for an ack.
    envelope: Option<Envelope>,
    /// The hook's id and tenant from the book (an ack's span), if this process claimed it.
    hook: Option<Arc<book::HookName>>,
}

/// A hook's id and tenant.
pub(super) fn hook_name(env: &Envelope) -> Arc<book::HookName> {
    Arc::new(book::HookName {
        id: env.id.clone(),
        tenant: env.tenant_or_default().to_owned(),
    })
}

/// One step of a leased hook's life on the gateway (`lease`, `acked`, `nacked`,
/// `expired`), as a span in the hook's trace: built only with `log.spans` or an OTLP
/// Whether the gateway's spans are built (`log.spans` or an OTLP endpoint): without
/// them a claim keeps no hook name in the lease book.
pub(super) fn spans_on() -> bool {
    tracing::enabled!(target: crate::telemetry::TARGET, tracing::Level::DEBUG)
}

/// endpoint. `by`: the consumer that asked, or `gateway` (an expiry, a revocation).
pub(super) fn step_span(
    step: &str,
    hook: &dyn Fn() -> Option<Arc<book::HookName>>,
    sink: &str,
    attempt: u32,
    by: &str,
) {
    if !spans_on() {
        return;
    }
    let hook = hook();
    let hook = hook.as_deref();
    let id = hook.map_or("", |h| h.id.as_str());
    let span = tracing::debug_span!(
        target: crate::telemetry::TARGET,
        "pull",
        step,
        hook_id = id,
        tenant = hook.map_or("", |h| h.tenant.as_str()),
        sink,
        attempt,
        by,
    );
    if !id.is_empty() {
        crate::telemetry::in_hook_trace(&span, id);
    }
    drop(span.enter());
}

/// Why the gateway itself settles a lease.
pub(super) enum Outcome {
    Expired,
    /// Its tenant was paused or is being erased: taken back as an expiry is (the attempt
    /// counts), but a late ack or extension is `unknown`, not `expired`.
    Revoked,
    /// The hook is gone (`None`) or does not decode (the error).
    Unsendable(Option<Arc<str>>),
}

/// Seconds from a lease's claim to `now`.
fn held_for(lease: &Lease, now: u64) -> f64 {
    now.saturating_sub(lease.claimed_at.0) as f64 / 1_000.0
}

/// Runs the expiry of leases until `stop`: wakes at the soonest deadline (at least every
/// second, and when a claim makes a lease); and every [`PullWake::RESCAN`] the rescan of
/// the parked tenants.
pub fn spawn_expiry(
    gateway: Arc<Gateway>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rescanned = std::time::Instant::now();
        loop {
            if rescanned.elapsed() >= PullWake::RESCAN {
                rescanned = std::time::Instant::now();
                let g = gateway.clone();
                if let Ok(Err(e)) = tokio::task::spawn_blocking(move || g.rescan()).await {
                    tracing::warn!(error = %e, "pull: reading the parked tenants");
                }
            }
            let g = gateway.clone();
            let next = tokio::task::spawn_blocking(move || g.expire_due(1_024)).await;
            let nap = match next {
                Ok(Ok(Some(at))) => Duration::from_millis(
                    at.0.saturating_sub(ankusa_keyspace::now_ms())
                        .clamp(1, 1_000),
                ),
                Ok(Ok(None)) => Duration::from_secs(1),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "pull: expiring leases, again in 1 s");
                    Duration::from_secs(1)
                }
                Err(e) => {
                    tracing::error!(error = %e, "pull: the expiry task");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(nap) => {}
                _ = gateway.expiry_wake.notified() => {}
                _ = gateway.paused.changed.notified() => {
                    gateway.revoke_held();
                }
                _ = stop.changed() => return,
            }
        }
    })
}
