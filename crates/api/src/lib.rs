//! The wire types of Ankusa: every body a node answers or sends over HTTP, as types both
//! sides compile against. A crate at the bottom of the graph (it depends on no other crate
//! of the workspace), so the node's server and its clients — another node, the command
//! line, the console, the operator — name one definition, and a renamed field fails to
//! compile on both sides.
//!
//! - [`error`]: the one error shape of both listeners and its stable codes.
//! - [`admin`]: the admin API (`/v1/…`): tenants, the dead-letter queue, hooks, the
//!   archive, the quarantine, the audit log, sources, limits, the portal, backups.
//! - [`node`]: `GET /v1/node`, the node's status the operator polls, and the reports of
//!   the backup and restore commands the operator's Jobs write.
//! - [`ingest`]: what ingest answers when it takes a hook.
//! - [`pull`]: the pull gateway (`/pull/{sink}/…`).
//! - [`endpoints`]: a tenant's own endpoints (`/v1/tenants/{t}/endpoints`).
//! - [`cluster`]: the calls between the nodes of a Relay (`/cluster/v1/…`).
//! - [`merge`]: how a relay-wide call folds the answers of several nodes into one, the
//!   same for the node that fans a call out and for the command line.
//!
//! Start at [`admin`] for what an operator's tools read, at [`node::NodeStatus`] for what
//! the Kubernetes operator reads.

pub mod admin;
pub mod cluster;
pub mod endpoints;
pub mod error;
pub mod ingest;
pub mod merge;
pub mod node;
pub mod pull;
