//! Idempotency keys: how long they are kept and swept (`dedupe`).

use serde::{Deserialize, Serialize};

use crate::{positive, ConfigError};

impl DedupeConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        positive("dedupe.window_ms", self.window_ms)?;
        positive("dedupe.sweep_interval_ms", self.sweep_interval_ms)?;
        positive("dedupe.sweep_batch", self.sweep_batch)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DedupeConfig {
    /// How long an idempotency key is remembered.
    pub window_ms: u64,
    /// Most expired dedupe keys removed per sweep.
    pub sweep_batch: usize,
    /// How often the writer sweeps expired dedupe keys when idle.
    pub sweep_interval_ms: u64,
}

impl Default for DedupeConfig {
    fn default() -> Self {
        DedupeConfig {
            window_ms: 24 * 3_600_000,
            sweep_batch: 1_000,
            sweep_interval_ms: 1_000,
        }
    }
}
