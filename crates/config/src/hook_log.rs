//! The hook log: each hook's timeline of attempts (`hook_log`).

use serde::{Deserialize, Serialize};

use crate::{positive, ConfigError};

impl HookLogConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        positive("hook_log.retention_ms", self.retention_ms)?;
        positive("hook_log.max_hooks", self.max_hooks)?;
        positive("hook_log.prune_interval_ms", self.prune_interval_ms)?;
        positive("hook_log.prune_batch", self.prune_batch)
    }
}

/// The hook log: each hook's record (no body) and its deliveries' attempts, kept after
/// the hook is delivered and reclaimed, for `GET /v1/hooks/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HookLogConfig {
    pub enabled: bool,
    /// Hooks older than this leave the log.
    pub retention_ms: u64,
    /// The log's ceiling: past it, the oldest hooks leave first.
    pub max_hooks: u64,
    pub prune_interval_ms: u64,
    /// Hooks looked at per prune pass.
    pub prune_batch: usize,
}

impl Default for HookLogConfig {
    fn default() -> Self {
        HookLogConfig {
            enabled: true,
            retention_ms: 259_200_000,
            max_hooks: 10_000_000,
            prune_interval_ms: 1_000,
            prune_batch: 10_000,
        }
    }
}
