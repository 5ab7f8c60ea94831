//! Ankusa relay node: receives webhooks for many tenants, commits each durably to an
//! embedded RocksDB store before acknowledging it, and delivers it to its sinks.
//!
//! **Where to start**: [`node::Node::start`] puts a node together — the listeners, the
//! store's open and migration, the writer, the pipeline, the gateway — and
//! `docs/architecture.md` draws the same picture.
//!
//! The modules of this crate (the node and its command line):
//! - [`node`]: boot order, the listeners, what a running node holds, its stop.
//! - [`http`]: the listeners themselves (connection caps and read timeouts), JSON errors.
//! - [`ingest`]: `POST /ingest/…`: verification, tenants, quotas, quarantine, the hand-off
//!   to the writer.
//! - [`dispatch`]: the pipeline: ticks over the active index, the request line, deliveries
//!   to HTTP sinks and their outcomes, pauses, replays.
//! - [`pull`]: the claim gateway of pull sinks (`/pull/…`): leases, quotas, long polls.
//! - [`erase`]: erasing a tenant for good: the node's erases and the task that runs them.
//! - [`admin`]: the admin API (`/v1/…`): tenants, DLQ, archive, hooks, erase, backups,
//!   audit, the node's status, and the calls between the nodes of a Relay.
//! - [`console`]: the web console and the tenant portal (`/ui/…`).
//! - [`cluster`]: the nodes of one Relay: ownership, forwarding, signed node calls, the
//!   tenant registry, the handoff of stored rows.
//! - [`objstore`]: backups in S3-compatible object storage and the node's push schedule.
//! - [`upgrade`]: the boot migration's progress (the migrations are `ankusa_queue::formats`).
//! - [`metrics`], [`telemetry`]: Prometheus metrics; logs, spans and traces.
//! - [`reload`]: configuration reload without a restart.
//! - [`openapi`]: the OpenAPI document of both listeners.
//! - [`wire`]: the node's own types (counters, backlogs, states, limits) as the wire
//!   types of `ankusa-api` show them.
//! - [`cli`]: the `ankusa-relay` command line (`run`, `config check`, `admin`, `backup`, …).
//!
//! The crates beneath it (`scripts/check-layers.py` keeps the order): `ankusa-keyspace`
//! (key layouts), `ankusa-records` (stored values), `ankusa-config` (the YAML and its
//! validation), `ankusa-verify` (signatures, node request auth), `ankusa-tarball`
//! (archives), `ankusa-api` (every body the node answers or sends, and the error codes),
//! `ankusa-store` (RocksDB: the only crate that
//! depends on it) and `ankusa-queue` (tenants, counters and every delivery transition as
//! an op builder).

pub mod admin;
pub mod cli;
pub mod cluster;
pub mod console;
pub mod dispatch;
pub mod endpoints;
pub mod erase;
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
pub mod wire;

/// The allocator of every program built on the relay (the node, its tests and benches):
/// the ingest and dispatch paths allocate per hook from many threads, where glibc's
/// allocator spent about a tenth of the node's CPU (docs/performance.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
