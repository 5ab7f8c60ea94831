//! Reclaim of delivered hooks (`reclaim`).

use serde::{Deserialize, Serialize};

use crate::{positive, ConfigError};

impl ReclaimConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        positive("reclaim.interval_ms", self.interval_ms)?;
        positive("reclaim.batch", self.batch)
    }
}

/// Reclaim: removing hooks nothing needs any more.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReclaimConfig {
    pub interval_ms: u64,
    /// Cleared markers looked at per pass.
    pub batch: usize,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig {
            interval_ms: 1_000,
            batch: 1_000,
        }
    }
}
