//! The queue model (docs/storage.md): tenant ordinals, per-tenant counters, the
//! active-tenant index and every delivery transition.
//!
//! # Invariants
//! - **Counters are merges.** The six per-tenant counters are only ever written as blind
//!   merge operands ([`counters`]), mirrored into the node aggregate (ord 0), and ride in
//!   the same atomic batch as the row changes they count. Nothing reads, changes and puts
//!   back a shared row, so no interleaving of writers loses a count.
//! - **Transitions are op builders.** Every state change of a delivery is a function in
//!   [`deliveries`] that adds its ops *and* its counter deltas to a [`Tx`]; only
//!   `deliveries` builds `?D ?F ?X ?A` keys (clippy's `disallowed-methods` keeps it so).
//!   A batch that moves a row without its deltas cannot be assembled from outside.
//! - **Every due row has a marker.** A due row is only ever written together with its
//!   active marker `<<?A, bucket, ord>>`; markers are deleted only by the dispatch side's
//!   delete-then-verify cleanup ([`deliveries::cleanup_markers`]), which restores any marker
//!   a concurrent writer still needs.
//! - **Ordinals are dense and permanent.** Assigned in first-sight order by the writer's
//!   [`tenants::Allocator`] inside the commit batch that first uses them; never reused.
//!
//! # Who writes what
//! The writer (ingest), the dispatch pipeline (claim, delivered, retry, dead-letter, orphan
//! drop, marker cleanup), the replayer (revive), purge, the archive (settle, drop) and boot
//! recovery (`recover_inflight`) all write index rows from their own tasks. That is safe
//! because counters are merges and each transition's ops are one atomic batch.

pub mod archive;
pub mod audit;
pub mod counters;
pub mod dedupe;
pub mod deliveries;
pub mod endpoints;
pub mod engine;
pub mod erase;
pub mod fold;
pub mod formats;
pub mod handoff;
pub mod hints;
pub mod hooklog;
pub mod kafka;
pub mod quarantine;
pub mod reclaim;
pub mod registry;
pub mod tenants;
#[cfg(any(test, feature = "test-support"))]
pub mod testkit;
pub mod writer;

pub use counters::Delta;
pub use deliveries::Tx;

use ankusa_store::{Op, Rows, Store, StoreError};

use ankusa_keyspace::Family;

/// A row change this crate built (an audit row, a tenant's pause or limits, a quarantine
/// entry), for its caller to commit with others in one atomic batch ([`commit`], or a
/// [`Tx`] through [`Tx::push`]). Only this crate builds one: outside it a change can be
/// carried and committed, never made.
///
/// ```compile_fail,E0423
/// // Outside the queue a change cannot be made from an op, however the op was built.
/// let c = ankusa_queue::Change(ankusa_store::Op::delete(ankusa_keyspace::Cf::Hooks, vec![]));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change(pub(crate) Op);

/// Commits `changes` as one atomic batch; `sync` waits for the WAL to reach the disk.
pub fn commit(store: &Store, changes: Vec<Change>, sync: bool) -> Result<(), QueueError> {
    Ok(store.write(changes.into_iter().map(|c| c.0).collect(), sync)?)
}

/// Errors of the queue layer. Every queue function returns this type; the store's errors
/// arrive through `From`, with a damaged family lifted into [`QueueError::Corrupt`] so that
/// callers match corruption in one place whichever layer found it.
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// A row of `family` that does not decode, a missing sentinel, a counter that does not
    /// parse: never read as empty. Counted (`ankusa_store_corruption_errors_total{family}`).
    #[error("store corruption in family {}: {detail}", family.name())]
    Corrupt { family: Family, detail: String },
    #[error(transparent)]
    Store(StoreError),
    #[error("tenant limit reached: this node holds tenants.max = {max} tenants")]
    TenantLimit { max: u32 },
    #[error("invalid tenant id: {0}")]
    InvalidTenant(&'static str),
    #[error("the tenant is being erased")]
    TenantErasing,
    /// A handoff batch for this receiver is staged and not confirmed: send it first.
    #[error("a handoff batch for {receiver} waits for its answer")]
    HandoffStaged { receiver: String },
}

impl QueueError {
    /// Corruption found by the queue in `family` (counted like the store's).
    pub fn corrupt(family: Family, detail: impl Into<String>) -> Self {
        StoreError::corruption(family, detail).into()
    }

    /// Corruption of the row of `family` at `key`: `what` is wrong with it (a decode
    /// error, `"bad value …"`), and the key in hex says where.
    pub fn corrupt_at(family: Family, key: &[u8], what: impl std::fmt::Display) -> Self {
        Self::corrupt(family, format!("{what} at {}", ankusa_keyspace::hex(key)))
    }

    /// Whether this is corruption, found by the queue or by the store (a row or a key
    /// that does not decode).
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            QueueError::Corrupt { .. } | QueueError::Store(StoreError::Key(_))
        )
    }
}

impl From<StoreError> for QueueError {
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::Corruption { family, detail } => QueueError::Corrupt { family, detail },
            e => QueueError::Store(e),
        }
    }
}

/// A key that does not decode is corruption of the store's key space.
impl From<ankusa_keyspace::KeyError> for QueueError {
    fn from(e: ankusa_keyspace::KeyError) -> Self {
        StoreError::from(e).into()
    }
}

/// A tenant's waiting work, from four counter reads.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Backlog {
    pub pending: i64,
    pub scheduled: i64,
    pub inflight: i64,
    pub bytes: i64,
}

/// The backlog of one tenant: one `multi_get` of its counter rows, no scan.
pub fn pending_for_tenant(
    store: &ankusa_store::Store,
    ord: ankusa_keyspace::TenantOrd,
) -> Result<Backlog, QueueError> {
    let c = counters::read(store, ord)?;
    Ok(Backlog {
        pending: c.pending,
        scheduled: c.scheduled,
        inflight: c.inflight,
        bytes: c.bytes,
    })
}

/// The dead-letter count of one tenant, from its counter row.
pub fn dead_for_tenant(
    store: &ankusa_store::Store,
    ord: ankusa_keyspace::TenantOrd,
) -> Result<i64, QueueError> {
    Ok(counters::read(store, ord)?.dead)
}
