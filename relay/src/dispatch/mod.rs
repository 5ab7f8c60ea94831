//! Dispatch: turning due rows into deliveries.
//!
//! This layer owns the pipeline's in-memory state (per-tenant scan cursors) and is the
//! only caller of the active index's marker cleanup (`queue::deliveries::cleanup_markers`).
//! [`pipeline::plan_tick`] is the read half of a tick: which tenants have work now and
//! which of their rows to claim, at a cost that depends on the tenants with work due,
//! never on the number of tenants or the size of the backlog.

pub mod control;
pub mod delivery;
pub mod line;
pub mod pipeline;
pub mod replayer;
