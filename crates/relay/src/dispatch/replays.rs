//! What keeps replays (`POST /v1/archive/replay`, `POST /v1/dlq/replay`) from crowding out
//! live traffic: one replay at a time per tenant (and one of the whole DLQ), and a lane
//! of the writer's queue they share, so ingest always finds room in it.

use std::collections::HashSet;
use std::sync::Mutex;

/// The most replayed hooks in the writer's queue at once, node-wide: at most a quarter of
/// `writer.queue_capacity`, so a replay never fills the queue live ingest shares.
pub const LANE: usize = 128;

/// Replays running on this node.
#[derive(Debug)]
pub struct Replays {
    running: Mutex<HashSet<String>>,
    /// Permits for replayed hooks in the writer's queue.
    pub lane: tokio::sync::Semaphore,
}

impl Replays {
    /// With `queue_capacity` the writer's (`writer.queue_capacity`).
    pub fn new(queue_capacity: usize) -> Replays {
        Replays {
            running: Mutex::new(HashSet::new()),
            lane: tokio::sync::Semaphore::new(LANE.min(queue_capacity / 4).max(1)),
        }
    }

    /// Starts the replay named `key` (`archive:<tenant>`, `dlq:<tenant>`, `dlq:*`), or
    /// refuses it while one of that name runs (the API answers 409 `replay_running`).
    pub fn begin(&self, key: String) -> Result<Running<'_>, Busy> {
        let mut r = self.running.lock().unwrap_or_else(|p| p.into_inner());
        if !r.insert(key.clone()) {
            return Err(Busy { key });
        }
        Ok(Running { replays: self, key })
    }
}

/// A replay of the same name runs already.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Busy {
    /// Its name: `archive:<tenant>`, `dlq:<tenant>`, `dlq:*`.
    pub key: String,
}

impl std::fmt::Display for Busy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let what = self.key.split_once(':').map_or("it", |(_, t)| t);
        write!(f, "a replay of {what} runs on this node; one at a time")
    }
}

/// A running replay; it ends when dropped.
pub struct Running<'a> {
    replays: &'a Replays,
    key: String,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        self.replays
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.key);
    }
}

#[cfg(test)]
mod tests {
    use super::{Busy, Replays, LANE};

    #[test]
    fn one_replay_of_a_name_at_a_time_and_the_lane_leaves_the_queue_room() {
        let r = Replays::new(100);
        let first = r.begin("archive:a".into()).unwrap();
        let busy = r.begin("archive:a".into()).err();
        assert_eq!(
            busy,
            Some(Busy {
                key: "archive:a".into()
            })
        );
        let other = r.begin("archive:b".into()).unwrap();
        drop(first);
        let again = r.begin("archive:a".into()).unwrap();
        drop((other, again));
        // A quarter of a small queue; never more than the lane.
        assert_eq!(r.lane.available_permits(), 25);
        assert_eq!(Replays::new(1 << 20).lane.available_permits(), LANE);
        assert_eq!(Replays::new(2).lane.available_permits(), 1);
    }
}
