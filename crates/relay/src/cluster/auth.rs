//! How the nodes of a Relay know each other's requests: signed per request
//! ([`ankusa_verify::node`], without RocksDB so it is fuzzed on its own).

pub use ankusa_verify::node::*;
