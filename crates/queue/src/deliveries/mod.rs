//! Delivery rows and every transition between their states — the only module that builds
//! `?D ?F ?X ?A ?P ?k` keys (the structural guard: `scripts/check-layers.py`).
//!
//! A delivery is one (hook, sink) pair. Its state is which index key it has:
//!
//! ```text
//!             ingest/expand/revive/recover (kind 0)      retry (kind 1)
//!   ──────────────► due ?D ───claim──► inflight ?F ──────────────────┐
//!                    ▲                   │ │ │                       │
//!                    └───────────────────┘ │ └─dead_letter─► dead ?x + ?X
//!                                          └─delivered / orphan_drop─► (row gone, ?c)
//! ```
//!
//! Every op builder takes a [`Tx`] and adds its ops *and* its counter deltas; a `Tx` turns
//! into one atomic batch with [`Tx::into_ops`], which appends the coalesced counter merges.
//! There is no way to put a due row without its active marker ([`Tx::enqueue`] writes
//! both), nor to move a row without its deltas.
//!
//! | module | holds |
//! |---|---|
//! | `rows` | due, inflight and dead rows, a due row's kind |
//! | `tx` | [`Tx`], its units and their check at commit |
//! | `transitions` | every op builder: ingest, claim, outcomes, revive, recover, purge, archive, imports |
//! | `reads` | index reads (active tenants, due rows, dead pages, where a hook stands) and marker cleanup |
//! | `maintenance` | whole-tenant purge, boot recovery, archive obligations, marker repair |
//! | `pull` | pull sinks: a due row parked for consumers (`?P`), its lease (`?k`) |
//! | `handoff` | a hook's rows leaving this node's queue for its tenant's new owner, and entering the owner's ([`crate::handoff`]) |
//!
//! Only these modules (and the keyspace crate) may call the constructors of the index keys:
//! `clippy.toml` disallows them everywhere else.

/// The most rows one purge or recovery batch touches.
pub const CHUNK_ROWS: usize = 500;
/// How many stale markers the oldest-due-age read skips before it settles for a bucket.
pub const OLDEST_DUE_MAX_SKIPS: usize = 32;

mod handoff;
mod maintenance;
mod pull;
mod reads;
mod rows;
mod transitions;
mod tx;

pub use handoff::*;
pub use maintenance::*;
pub use pull::*;
pub use reads::*;
pub use rows::*;
pub use transitions::*;
pub use tx::*;

#[cfg(test)]
mod tests;
