//! Types the relay node and the operator share, kept free of RocksDB so the operator can
//! use them without compiling a storage engine.
//!
//! - [`node::NodeStatus`]: what a relay node serves at `GET /v1/node` and the operator
//!   polls to fill the `Relay` resource's status.

pub mod node;
