//! What `/readyz` and `/healthz` of the operator's pod judge: whether the Relay watch has
//! listed and is not failing, and whether the Lease loop keeps making its attempts.
//!
//! - `/readyz` fails while the leader's Relay watch has not listed yet, while it has been
//!   failing for longer than [`Thresholds::watch_failing`], and while a leader has gone
//!   [`Thresholds::renew_deadline`] without renewing its Lease.
//!
//! A watch is failing from its first error until an event comes or no error has come for
//! [`Thresholds::watch_quiet`]: a watcher that fails retries (and errs again) at least every
//! 30 s, its longest backoff, and one that has recovered says nothing until an object
//! changes (it resumes from its resourceVersion without a new list).
//! - `/healthz` fails only when something is stuck for good: the watch failing for
//!   [`Thresholds::watch_stuck`], or the Lease loop making no attempt at all (a hung task)
//!   for [`Thresholds::lease_stuck`]. The kubelet then restarts the container, as it
//!   would a crashed one.
//!
//! A follower is ready while it reads the Lease: one that has not read it within
//! [`Thresholds::renew_deadline`] (the API server unreachable from its pod) could not take
//! over, and a rollout must not count it as a replica that can.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// When a condition turns into a failed probe.
#[derive(Debug, Clone, Copy)]
pub struct Thresholds {
    /// A watch failing this long makes `/readyz` fail.
    pub watch_failing: Duration,
    /// No error for this long ends a failing run (longer than the watcher's longest
    /// backoff step).
    pub watch_quiet: Duration,
    /// ... and `/healthz`.
    pub watch_stuck: Duration,
    /// A leader not renewed for this long is not ready (it is about to step down).
    pub renew_deadline: Duration,
    /// The Lease loop making no attempt for this long fails `/healthz`.
    pub lease_stuck: Duration,
}

impl Thresholds {
    /// From the Lease's settings: 30 s and 5 min for the watch; the renew deadline; four
    /// lease durations for a Lease loop that makes no attempt.
    pub fn new(renew_deadline: Duration, lease_duration: Duration) -> Thresholds {
        Thresholds {
            watch_failing: Duration::from_secs(30),
            watch_quiet: Duration::from_secs(45),
            watch_stuck: Duration::from_secs(300),
            renew_deadline,
            lease_stuck: lease_duration * 4,
        }
    }
}

/// The probes' state, written by the watch stream and the elector.
#[derive(Debug)]
pub struct Health {
    epoch: Instant,
    thresholds: Thresholds,
    election: bool,
    leading: AtomicBool,
    /// Its first list has completed.
    listed: AtomicBool,
    /// Milliseconds since `epoch` (+1; 0: never) of the first and the last error of the
    /// watch's current failing run, and of the last attempt and renewal of the Lease.
    watch_failing_since: AtomicU64,
    watch_last_error: AtomicU64,
    lease_attempt: AtomicU64,
    lease_renewed: AtomicU64,
    /// The last attempt the API server answered (leading or following).
    lease_read: AtomicU64,
}

/// A probe's verdict: `Err` carries the reason, for the 503's body.
pub type Verdict = Result<(), String>;

impl Health {
    pub fn new(thresholds: Thresholds, election: bool) -> Health {
        let h = Health {
            epoch: Instant::now(),
            thresholds,
            election,
            leading: AtomicBool::new(!election),
            listed: AtomicBool::new(false),
            watch_failing_since: AtomicU64::new(0),
            watch_last_error: AtomicU64::new(0),
            lease_attempt: AtomicU64::new(0),
            lease_renewed: AtomicU64::new(0),
            lease_read: AtomicU64::new(0),
        };
        // The Lease loop is judged from the start: its first attempt is due at once.
        h.lease_attempted();
        h
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX) + 1
    }

    fn age(&self, stamp: &AtomicU64) -> Option<Duration> {
        match stamp.load(Ordering::Acquire) {
            0 => None,
            at => Some(Duration::from_millis(self.now().saturating_sub(at))),
        }
    }

    /// The watch produced an event: it is listed (on `listed`) and not failing.
    pub fn watch_event(&self, listed: bool) {
        if listed {
            self.listed.store(true, Ordering::Release);
        }
        self.watch_failing_since.store(0, Ordering::Release);
    }

    /// The watch failed (it retries with backoff): the first error of a run starts the
    /// clock.
    pub fn watch_error(&self) {
        if self.watch_failing_for().is_none() {
            self.watch_failing_since
                .store(self.now(), Ordering::Release);
        }
        self.watch_last_error.store(self.now(), Ordering::Release);
    }

    /// The elector finished an attempt, whatever its outcome.
    pub fn lease_attempted(&self) {
        self.lease_attempt.store(self.now(), Ordering::Release);
    }

    /// The elector took or renewed the Lease.
    pub fn lease_renewed(&self) {
        self.lease_read();
        self.leading.store(true, Ordering::Release);
        self.lease_renewed.store(self.now(), Ordering::Release);
    }

    /// The elector read the Lease (another replica holds it, or this one took it).
    pub fn lease_read(&self) {
        self.lease_attempted();
        self.lease_read.store(self.now(), Ordering::Release);
    }

    /// This replica stopped leading.
    pub fn lease_lost(&self) {
        self.leading.store(false, Ordering::Release);
    }

    /// How long the current failing run has lasted (`None`: the watch is not failing).
    fn watch_failing_for(&self) -> Option<Duration> {
        let quiet = self.age(&self.watch_last_error)?;
        if quiet >= self.thresholds.watch_quiet {
            return None;
        }
        self.age(&self.watch_failing_since)
    }

    /// `/healthz`: fails only when stuck for good.
    pub fn live(&self) -> Verdict {
        let t = self.thresholds;
        if let Some(d) = self.watch_failing_for().filter(|d| *d >= t.watch_stuck) {
            return Err(format!(
                "the Relay watch has been failing for {} s",
                d.as_secs()
            ));
        }
        if self.election {
            if let Some(d) = self
                .age(&self.lease_attempt)
                .filter(|d| *d >= t.lease_stuck)
            {
                return Err(format!(
                    "the Lease loop has made no attempt for {} s",
                    d.as_secs()
                ));
            }
        }
        Ok(())
    }

    /// `/readyz`: everything of `/healthz`; a follower that has read the Lease within the
    /// renew deadline; a leader whose watch has listed, is not failing, and whose Lease is
    /// renewed on time.
    pub fn ready(&self) -> Verdict {
        self.live()?;
        let t = self.thresholds;
        if !self.leading.load(Ordering::Acquire) {
            if !self.election {
                return Ok(());
            }
            return match self.age(&self.lease_read) {
                Some(d) if d < t.renew_deadline => Ok(()),
                Some(d) => Err(format!(
                    "following, but the Lease could not be read for {} s",
                    d.as_secs()
                )),
                None => Err("the Lease has not been read yet".into()),
            };
        }
        if self.election {
            let renewed = self.age(&self.lease_renewed);
            if renewed.is_none_or(|d| d >= t.renew_deadline) {
                return Err(format!(
                    "leading, but the Lease was not renewed within {} s",
                    t.renew_deadline.as_secs()
                ));
            }
        }
        if !self.listed.load(Ordering::Acquire) {
            return Err("the Relay watch has not listed yet".into());
        }
        if let Some(d) = self.watch_failing_for().filter(|d| *d >= t.watch_failing) {
            return Err(format!(
                "the Relay watch has been failing for {} s",
                d.as_secs()
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn quick() -> Thresholds {
        Thresholds {
            watch_failing: Duration::from_millis(30),
            watch_quiet: Duration::from_millis(25),
            watch_stuck: Duration::from_millis(60),
            renew_deadline: Duration::from_millis(40),
            lease_stuck: Duration::from_millis(80),
        }
    }

    #[test]
    fn a_leader_is_ready_once_listed_and_renewed() {
        let h = Health::new(quick(), true);
        assert!(h.ready().unwrap_err().contains("not been read"));
        h.lease_read();
        assert!(
            h.ready().is_ok(),
            "a follower reading the Lease on time is ready"
        );
        h.lease_renewed();
        assert!(h.ready().unwrap_err().contains("not listed"));
        h.watch_event(true);
        assert_eq!(h.ready(), Ok(()));
        assert_eq!(h.live(), Ok(()));
    }

    /// Errors every 15 ms (the watcher's retries) for about `ms`.
    fn fail_for(h: &Health, ms: u64) {
        for _ in 0..ms / 15 {
            h.watch_error();
            std::thread::sleep(Duration::from_millis(15));
        }
        h.watch_error();
    }

    #[test]
    fn a_failing_watch_fails_readiness_then_liveness_and_an_event_clears_both() {
        let h = Health::new(quick(), false);
        h.watch_event(true);
        h.watch_error();
        assert_eq!(h.ready(), Ok(()), "a fresh failure is retried first");
        fail_for(&h, 35);
        assert!(h.ready().unwrap_err().contains("watch has been failing"));
        assert_eq!(h.live(), Ok(()));
        fail_for(&h, 30);
        assert!(h.live().is_err());
        h.watch_event(false);
        assert_eq!((h.live(), h.ready()), (Ok(()), Ok(())));
    }

    #[test]
    fn a_watch_that_stops_erring_has_recovered_without_an_event() {
        let h = Health::new(quick(), false);
        h.watch_event(true);
        fail_for(&h, 35);
        assert!(h.ready().is_err());
        // The watcher resumed: no error, and nothing changed to make an event.
        std::thread::sleep(Duration::from_millis(30));
        assert_eq!((h.live(), h.ready()), (Ok(()), Ok(())));
        // A new error starts a new run.
        h.watch_error();
        assert_eq!(h.ready(), Ok(()));
    }

    #[test]
    fn a_leader_not_renewed_is_not_ready_and_a_hung_lease_loop_not_live() {
        let h = Health::new(quick(), true);
        h.lease_renewed();
        h.watch_event(true);
        std::thread::sleep(Duration::from_millis(45));
        assert!(h.ready().unwrap_err().contains("not renewed"));
        assert_eq!(h.live(), Ok(()));
        std::thread::sleep(Duration::from_millis(40));
        assert!(h.live().unwrap_err().contains("no attempt"));
        h.lease_read();
        h.lease_lost();
        assert_eq!((h.live(), h.ready()), (Ok(()), Ok(())));
    }

    /// A follower whose attempts fail (the API server unreachable) is live while it keeps
    /// trying, and not ready once it has gone the renew deadline without reading the Lease.
    #[test]
    fn a_follower_that_cannot_read_the_lease_is_not_ready() {
        let h = Health::new(quick(), true);
        h.lease_read();
        assert_eq!(h.ready(), Ok(()));
        for _ in 0..5 {
            std::thread::sleep(Duration::from_millis(10));
            h.lease_attempted();
        }
        assert!(h.ready().unwrap_err().contains("could not be read"));
        assert_eq!(h.live(), Ok(()));
        h.lease_read();
        assert_eq!(h.ready(), Ok(()));
    }
}
