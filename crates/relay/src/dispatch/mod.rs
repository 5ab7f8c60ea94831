//! Dispatch: turning due rows into deliveries.
//!
//! This layer owns the pipeline's in-memory state (per-tenant scan cursors) and is the
//! only caller of the active index's marker cleanup (`queue::deliveries::cleanup_markers`).
//! [`pipeline::plan::plan_tick`] is the read half of a tick: which tenants have work now and
//! which of their rows to claim, at a cost that depends on the tenants with work due,
//! never on the number of tenants or the size of the backlog.
//!
//! [`replayer`] moves dead rows back to due (a replay) and waiting ones to now (a retry);
//! [`replays`] keeps replays from crowding out live traffic (one per tenant at a time, and
//! a lane of the writer's queue).

pub mod control;
pub mod delivery;
pub mod kafka;
pub mod line;
pub mod nats;
pub mod outcome;
pub mod pace;
pub mod parked;
pub mod paused;
pub mod pipeline;
pub mod replayer;
pub mod replays;

use ankusa_queue::engine::StoreError;
use ankusa_queue::QueueError;

/// Errors of the dispatch side: the queue's, and the runtime's own failures around them.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Queue(#[from] QueueError),
    /// The delivery permits were closed: the node is stopping.
    #[error("the delivery permits are closed: the node is stopping")]
    Stopping,
    /// Work on a thread of the pipeline's own that panicked.
    #[error("{what} panicked: {message}")]
    Panicked { what: &'static str, message: String },
    /// A thread of the pipeline's own is gone (it ends only when the pipeline does).
    #[error("{0}: its thread is gone")]
    Gone(&'static str),
}

impl From<StoreError> for DispatchError {
    fn from(e: StoreError) -> Self {
        DispatchError::Queue(e.into())
    }
}

impl DispatchError {
    /// `what` panicked with the payload `p`.
    pub fn panicked(what: &'static str, p: &(dyn std::any::Any + Send)) -> Self {
        let message = p
            .downcast_ref::<&str>()
            .map(|m| (*m).to_owned())
            .or_else(|| p.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "(no message)".to_owned());
        DispatchError::Panicked { what, message }
    }
}
