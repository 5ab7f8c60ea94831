//! The built-in migrations, one file each, chained through [`super::builtin`].
//!
//! | from | to | migration |
//! |---|---|---|
//! | 2 | 3 | [`tenant_keys::TenantKeys`]: re-key due/inflight/dead by tenant ordinal, seed per-tenant counters |
//!
//! A migration reads the old layout through `formats::legacy` and writes the new rows through
//! the queue's op builders, so the new index keys and their counter deltas come from the
//! one place that builds them.

pub mod tenant_keys;
