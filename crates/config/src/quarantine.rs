//! Requests that failed verification, kept for inspection (`quarantine`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QuarantineConfig {
    /// Most quarantined requests kept; past it new ones are counted and dropped.
    pub max_entries: u64,
    /// Most bytes of quarantined requests kept.
    pub max_bytes: u64,
}

impl Default for QuarantineConfig {
    fn default() -> Self {
        QuarantineConfig {
            max_entries: 10_000,
            max_bytes: 64 << 20,
        }
    }
}
