//! Ankusa relay node: receives webhooks for many tenants, commits each durably to an
//! embedded RocksDB store before acknowledging it, and delivers it to its sinks.
//!
//! Layers (one folder each, each owning its own state):
//! - [`store`]: RocksDB, key layouts, the format guard and the migration runner (crate
//!   `ankusa-store`, the only one that depends on `rocksdb`).
//! - [`upgrade`]: the format migrations, the older layouts they read, and fixtures.
//! - [`queue`] (crate `ankusa-queue`): tenant ordinals, per-tenant counters, the active index and every
//!   delivery transition as an op builder.
//! - [`ingest`]: the ingest listener: verification, tenants, dedupe keys, quarantine.
//! - [`node`]: boot order and the listeners of a running node.
//! - [`dispatch`]: the pipeline's tick over the active index.
//! - [`metrics`]: the queue gauges, read from counters and the active index.
//! - [`admin`]: the admin listener (health, readiness, node status).
//! - [`config`]: the YAML configuration and its validation (crate `config/`).
//! - [`cluster`]: the nodes of one Relay: tenant ownership, forwarding, the tenant registry.
//! - [`objstore`]: backups in S3-compatible object storage, and the node's push schedule.
//! - [`cli`]: the `ankusa-relay` command line.

pub mod admin;
pub mod cli;
pub mod cluster;
pub mod console;
pub mod dispatch;
pub mod http;
pub mod ingest;
pub mod metrics;
pub mod node;
pub mod objstore;
pub mod openapi;
pub mod pull;
pub mod reload;
pub mod telemetry;
#[cfg(any(test, feature = "test-support"))]
pub mod testkit;
pub mod upgrade;

/// The allocator of every program built on the relay (the node, its tests and benches):
/// the ingest and dispatch paths allocate per hook from many threads, where glibc's
/// allocator spent about a tenth of the node's CPU (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
