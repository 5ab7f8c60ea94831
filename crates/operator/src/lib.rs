//! The Ankusa operator: reconciles `Relay` resources (`relays.ankusa.dev`) into relay
//! nodes — a StatefulSet with a volume per node, its Services, configuration, disruption
//! budget and ServiceMonitor — and reports what the nodes say in the `Relay`'s status.
//!
//! - [`planner`] decides (pure: observed state → next action), including the
//!   backup-gated store-format upgrade;
//! - [`resources`] builds the desired objects (pure);
//! - [`status`] computes the status (pure);
//! - [`controller`] is the I/O shell: watch, observe, apply under one field manager,
//!   Events, status patch, backoff;
//! - [`nodes`] polls each node's `/v1/node`;
//! - [`leader`] keeps two replicas from reconciling at once (a Lease);
//! - [`metrics`], [`telemetry`]: the operator's own metrics and logs;
//! - [`health`]: what the pod's `/readyz` and `/healthz` judge (the watch, the Lease);
//! - [`backups`] decides scheduled backups (pure), on [`schedule`]'s cron schedules;
//! - [`restore`] decides restores from backups (pure): a bootstrap, a rollback.
//!
//! The operator never deletes a PersistentVolumeClaim: no code path here can (its only
//! deletes are of the optional objects a spec stops asking for), and the StatefulSet
//! retains its claims on scale-down and deletion.

pub mod backups;
pub mod controller;
pub mod drain;
pub mod health;
pub mod leader;
pub mod metrics;
pub mod names;
pub mod nodes;
pub mod objstore;
pub mod observed;
pub mod plan;
pub mod planner;
pub mod rbac;
pub mod resources;
pub mod restore;
pub mod schedule;
pub mod status;
pub mod telemetry;
