//! The store as the node holds it: the handle ([`Store`]), how it is opened
//! ([`OpenOptions`], [`MemoryBudget`]), its errors, read statistics and write health, the
//! backups' tarballs ([`tarball`]) and the format runner ([`migrate`]) — everything of
//! `ankusa-store` but its rows.
//!
//! The row API (`ankusa_store::Rows`: batches of ops, point reads, scans) and the ops are
//! not here. The node crate does not depend on `ankusa-store` (`make check-layers` holds
//! it), so it can neither name that trait nor build an op: it reads rows through this
//! crate's functions and commits the changes they build ([`crate::Change`]) with
//! [`crate::commit`]. A row read or write outside this crate does not compile — the one
//! re-export of another crate's items in the workspace, kept for that reason.
//!
//! ```compile_fail
//! // The handle the node holds has no row reads: `Rows` is not in scope (E0599).
//! fn read(store: &ankusa_queue::engine::Store) {
//!     let _ = store.get(ankusa_keyspace::Cf::Hooks, b"h");
//! }
//! ```

pub use ankusa_store::{
    corruptions, max_open_files_for, migrate, tarball, tombstones_walked, volume_space,
    MemoryBudget, OpenOptions, StatsSnapshot, Store, StoreError, StoreStats, VolumeSpace,
    WriteHealth, SUPPORTED_FORMAT,
};
