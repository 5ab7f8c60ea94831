//! A sink's pace (a tenant endpoint's `rate_per_second`): its requests start at least
//! 1/rate apart. Each request takes the next start time and sleeps until it; a sink idle
//! for a while starts its next at once (no burst beyond one).

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug)]
pub struct Pace {
    every: Duration,
    next: Mutex<Option<Instant>>,
}

impl Pace {
    /// At most `rate` starts a second (`rate` > 0).
    pub fn per_second(rate: u32) -> Pace {
        Pace {
            every: Duration::from_secs(1) / rate.max(1),
            next: Mutex::new(None),
        }
    }

    /// Waits for this request's start time.
    pub async fn wait(&self) {
        let at = {
            let mut next = self.next.lock().unwrap_or_else(|p| p.into_inner());
            let now = Instant::now();
            let at = next.filter(|n| *n > now).unwrap_or(now);
            *next = Some(at + self.every);
            at
        };
        tokio::time::sleep_until(at).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn starts_are_spaced_by_the_rate() {
        let p = Pace::per_second(4);
        let t0 = Instant::now();
        for _ in 0..5 {
            p.wait().await;
        }
        // The first at once, then four 250 ms apart.
        assert_eq!(Instant::now() - t0, Duration::from_millis(1_000));
        tokio::time::advance(Duration::from_secs(10)).await;
        let t1 = Instant::now();
        p.wait().await;
        assert_eq!(Instant::now(), t1, "an idle sink starts at once");
    }
}
