//! A graceful stop (`shutdown`).

use serde::{Deserialize, Serialize};

use crate::{in_range, ConfigError};

impl ShutdownConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        in_range("shutdown.grace_ms", self.grace_ms, 0..=600_000)
    }
}

/// A graceful stop (SIGTERM): readiness fails, ingest and claiming stop, deliveries in
/// flight get up to `grace_ms` to finish and have their outcomes committed; rows still in
/// flight then go back to due (synced) and the node exits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    pub grace_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig { grace_ms: 20_000 }
    }
}
