//! The store's memory (`store`).

use serde::{Deserialize, Serialize};

use crate::{in_range, ConfigError};

/// The least `store.memory_bytes` may be.
pub const STORE_MEMORY_MIN: u64 = 32 << 20;

impl StoreConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        match self.memory_bytes {
            Some(n) => in_range("store.memory_bytes", n, STORE_MEMORY_MIN..=1 << 40),
            None => Ok(()),
        }
    }
}

/// The embedded store's memory: one block cache for every column family and one budget
/// for all their memtables, sized together.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct StoreConfig {
    /// The budget of cache and memtables together. Unset: a quarter of the container's
    /// memory limit (its cgroup's), or 512 MiB where there is no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_bytes: Option<u64>,
}
