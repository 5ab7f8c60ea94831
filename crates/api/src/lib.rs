//! The wire types of Ankusa: the bodies a node answers or sends over HTTP, as types both
//! sides compile against. A crate at the bottom of the graph (it depends on no other crate
//! of the workspace), so the node's server and its clients — another node, the command
//! line — name one definition, and a renamed field fails to compile on both sides.
//!
//! - [`cluster`]: the calls between the nodes of a Relay (`/cluster/v1/…`): tenant slots,
//!   and the handoff of stored rows to a tenant's new owner.

pub mod cluster;
