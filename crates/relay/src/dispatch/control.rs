//! Per-sink flow control: an adaptive concurrency limit and a circuit breaker.
//!
//! **Limit (AIMD).** A sink's limit moves between 1 and its `max_inflight`: every
//! delivered attempt adds `1 / limit` (one slot per limit's worth of successes, the
//! additive increase), every attempt that shows the sink is overloaded — 429, 5xx, a
//! timeout, a connection error — halves it (the multiplicative decrease), at most once per
//! [`Controller::DECREASE_EVERY`] so a burst of failures from one window counts once. The
//! sink's request line ([`super::line`]) lets at most `limit` requests out at once, and the
//! tick claims a row for the sink only while its claimed rows are under twice the limit
//! (as many next in line as in flight), or under that plus a quarter of the limit for a
//! tenant with no row claimed for the sink (its first row never waits for the flood's
//! claims to end).
//!
//! **Breaker.** After `breaker_failures` consecutive failed attempts the breaker opens for
//! `breaker_cooldown_ms` (or the sink's `Retry-After`, if it asked for longer): the sink
//! gets no claims, so its rows stay due instead of being retried in a tight loop. Then it
//! is half-open: one probe row is claimed; its success closes the breaker, its failure
//! opens it again.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The breaker's state, as the `ankusa_sink_breaker` gauge shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Breaker {
    Closed = 0,
    Open = 1,
    HalfOpen = 2,
}

/// What an attempt told the controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// Delivered.
    Success,
    /// The sink answered but refused the hook for good (a 4xx other than 408 and 429): it
    /// is not overloaded.
    Rejected,
    /// 408, 429, 5xx, a timeout, a connection error; with the sink's `Retry-After`.
    Overloaded { retry_after: Option<Duration> },
}

#[derive(Debug)]
struct State {
    limit: f64,
    failures: u32,
    breaker: Breaker,
    open_until: Instant,
    /// A half-open probe is out.
    probing: bool,
    last_decrease: Option<Instant>,
}

/// One sink's controller.
#[derive(Debug)]
pub struct Controller {
    max: usize,
    failures_to_open: u32,
    cooldown: Duration,
    state: Mutex<State>,
}

impl Controller {
    /// The least time between two decreases of the limit.
    pub const DECREASE_EVERY: Duration = Duration::from_millis(100);
    /// The longest a `Retry-After` keeps the breaker open.
    pub const MAX_OPEN: Duration = Duration::from_secs(3600);

    /// Rows claimed for a sink at `limit`: its requests in flight and as many next in line.
    pub fn line(limit: usize) -> usize {
        2 * limit
    }

    /// Claims beyond [`Controller::line`] kept for tenants with no row claimed for the sink.
    pub fn reserve(limit: usize) -> usize {
        limit.div_ceil(4)
    }

    /// The most rows ever claimed for a sink of `max_inflight`.
    pub fn claim_capacity(max_inflight: usize) -> usize {
        let m = max_inflight.max(1);
        Self::line(m) + Self::reserve(m)
    }

    pub fn new(max_inflight: usize, failures_to_open: u32, cooldown: Duration) -> Self {
        Controller {
            max: max_inflight.max(1),
            failures_to_open: failures_to_open.max(1),
            cooldown,
            state: Mutex::new(State {
                limit: max_inflight.max(1) as f64,
                failures: 0,
                breaker: Breaker::Closed,
                open_until: Instant::now(),
                probing: false,
                last_decrease: None,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current limit (1..=max_inflight).
    pub fn limit(&self) -> usize {
        self.limit_of(&self.lock())
    }

    fn limit_of(&self, s: &State) -> usize {
        (s.limit as usize).clamp(1, self.max)
    }

    /// The breaker's state at `now` (an open breaker past its time is half-open).
    pub fn breaker(&self, now: Instant) -> Breaker {
        breaker_at(&self.lock(), now)
    }

    /// Whether a row may be claimed for the sink now, with `claimed` of its rows already
    /// claimed. A half-open breaker admits one probe: admitting it marks it out.
    /// `newcomer`: the row's tenant has no row claimed for the sink.
    pub fn admit(&self, claimed: usize, newcomer: bool, now: Instant) -> bool {
        let mut s = self.lock();
        match s.breaker {
            Breaker::Open if now < s.open_until => false,
            Breaker::Open | Breaker::HalfOpen => {
                s.breaker = Breaker::HalfOpen;
                if s.probing || claimed > 0 {
                    false
                } else {
                    s.probing = true;
                    true
                }
            }
            Breaker::Closed => {
                let limit = self.limit_of(&s);
                claimed < Self::line(limit)
                    || (newcomer && claimed < Self::line(limit) + Self::reserve(limit))
            }
        }
    }

    /// How many more rows [`Controller::admit`] would take now with `claimed` rows claimed:
    /// the room left in the line, or once the line is full the newcomers' reserve (only
    /// rows of tenants with none claimed get it). A tick reads no more rows than its sinks
    /// admit: a row read and then refused costs its hook's read for nothing.
    pub fn admissible(&self, claimed: usize, now: Instant) -> usize {
        let s = self.lock();
        match s.breaker {
            Breaker::Open if now < s.open_until => 0,
            Breaker::Open | Breaker::HalfOpen => usize::from(!s.probing && claimed == 0),
            Breaker::Closed => {
                let limit = self.limit_of(&s);
                let line = Self::line(limit);
                match line.checked_sub(claimed) {
                    Some(room) if room > 0 => room,
                    _ => (line + Self::reserve(limit)).saturating_sub(claimed),
                }
            }
        }
    }

    /// An attempt's outcome. Answers the limit and the breaker's state after it (what
    /// [`Controller::limit`] and [`Controller::breaker`] would, in the same lock).
    pub fn record(&self, signal: Signal, now: Instant) -> (usize, Breaker) {
        let mut s = self.lock();
        match signal {
            Signal::Success | Signal::Rejected => {
                s.failures = 0;
                if s.breaker != Breaker::Closed {
                    s.breaker = Breaker::Closed;
                    s.probing = false;
                    // Start again gently after an outage.
                    s.limit = s.limit.min(1.0_f64.max(self.max as f64 / 4.0));
                }
                if signal == Signal::Success {
                    s.limit = (s.limit + 1.0 / s.limit).min(self.max as f64);
                }
            }
            Signal::Overloaded { retry_after } => {
                s.failures = s.failures.saturating_add(1);
                let recent = s
                    .last_decrease
                    .is_some_and(|t| now.duration_since(t) < Self::DECREASE_EVERY);
                if !recent {
                    s.limit = (s.limit / 2.0).max(1.0);
                    s.last_decrease = Some(now);
                }
                let asked = retry_after.unwrap_or(Duration::ZERO).min(Self::MAX_OPEN);
                if s.breaker == Breaker::HalfOpen
                    || s.failures >= self.failures_to_open
                    || !asked.is_zero()
                {
                    s.breaker = Breaker::Open;
                    s.probing = false;
                    s.open_until = now + self.cooldown.max(asked);
                }
            }
        }
        (self.limit_of(&s), breaker_at(&s, now))
    }
}

/// The breaker's state in `s` at `now`.
fn breaker_at(s: &State, now: Instant) -> Breaker {
    match s.breaker {
        Breaker::Open if now >= s.open_until => Breaker::HalfOpen,
        b => b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn the_limit_halves_on_overload_and_grows_back_on_successes() {
        let c = Controller::new(16, 100, Duration::from_secs(1));
        let t0 = Instant::now();
        assert_eq!(c.limit(), 16);
        c.record(Signal::Overloaded { retry_after: None }, t0);
        assert_eq!(c.limit(), 8);
        // A burst of 503s from the same window counts once.
        c.record(Signal::Overloaded { retry_after: None }, t0 + 10 * MS);
        assert_eq!(c.limit(), 8);
        c.record(Signal::Overloaded { retry_after: None }, t0 + 200 * MS);
        c.record(Signal::Overloaded { retry_after: None }, t0 + 400 * MS);
        c.record(Signal::Overloaded { retry_after: None }, t0 + 600 * MS);
        c.record(Signal::Overloaded { retry_after: None }, t0 + 800 * MS);
        assert_eq!(c.limit(), 1, "never below one");
        // Additive increase: about `limit` successes per slot.
        for _ in 0..200 {
            c.record(Signal::Success, t0 + Duration::from_secs(1));
        }
        assert_eq!(c.limit(), 16, "back to max_inflight and no further");
        // Claims: as many next in line as in flight, and a quarter more for a tenant with
        // none claimed.
        assert!(c.admit(31, false, t0));
        assert!(!c.admit(32, false, t0));
        assert!(c.admit(35, true, t0));
        // What a tick may read: the line's room, then the reserve.
        assert_eq!(c.admissible(0, t0), 32);
        assert_eq!(c.admissible(31, t0), 1);
        assert_eq!(c.admissible(32, t0), 4);
        assert_eq!(c.admissible(35, t0), 1);
        assert_eq!(c.admissible(36, t0), 0);
        assert!(!c.admit(36, true, t0));
        assert_eq!(Controller::claim_capacity(16), 36);
        // A refusal for good is not overload.
        c.record(Signal::Rejected, t0 + Duration::from_secs(2));
        assert_eq!(c.limit(), 16);
    }

    #[test]
    fn the_breaker_opens_after_consecutive_failures_and_a_probe_closes_it() {
        let c = Controller::new(8, 3, Duration::from_millis(500));
        let t0 = Instant::now();
        c.record(Signal::Overloaded { retry_after: None }, t0);
        c.record(Signal::Success, t0);
        c.record(Signal::Overloaded { retry_after: None }, t0);
        c.record(Signal::Overloaded { retry_after: None }, t0);
        assert_eq!(c.breaker(t0), Breaker::Closed, "a success reset the count");
        c.record(Signal::Overloaded { retry_after: None }, t0);
        assert_eq!(c.breaker(t0), Breaker::Open);
        assert!(!c.admit(0, true, t0 + 100 * MS), "open: no claims");
        assert_eq!(c.admissible(0, t0 + 100 * MS), 0);
        // After the cooldown: one probe, no second.
        let later = t0 + 600 * MS;
        assert_eq!(c.breaker(later), Breaker::HalfOpen);
        assert_eq!(c.admissible(0, later), 1);
        assert!(c.admit(0, true, later));
        assert!(!c.admit(0, true, later), "one probe at a time");
        assert_eq!(c.admissible(0, later), 0);
        // The probe fails: open again for a cooldown.
        c.record(Signal::Overloaded { retry_after: None }, later);
        assert_eq!(c.breaker(later + 100 * MS), Breaker::Open);
        let again = later + 600 * MS;
        assert!(c.admit(0, true, again));
        c.record(Signal::Success, again);
        assert_eq!(c.breaker(again), Breaker::Closed);
        assert!(c.admit(0, true, again) && c.admit(1, true, again));
    }

    #[test]
    fn a_retry_after_keeps_the_breaker_open_that_long() {
        let c = Controller::new(8, 100, Duration::from_millis(100));
        let t0 = Instant::now();
        c.record(
            Signal::Overloaded {
                retry_after: Some(Duration::from_secs(30)),
            },
            t0,
        );
        assert_eq!(c.breaker(t0 + Duration::from_secs(29)), Breaker::Open);
        assert_eq!(c.breaker(t0 + Duration::from_secs(31)), Breaker::HalfOpen);
    }
}
