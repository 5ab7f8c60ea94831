//! The retry schedule (`retry`).

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, ConfigError};

impl RetryConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.schedule_ms.is_empty() {
            return Err(invalid("retry.schedule_ms", "must name at least one delay"));
        }
        in_range("retry.max_attempts", self.max_attempts, 1..=1_000)
    }
}

/// How jitter is applied to the retry schedule.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    /// A delay drawn uniformly from `[0, step]` (AWS "full jitter").
    #[default]
    Full,
    /// Exactly the step.
    None,
}

/// The retry schedule.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Delay before retry n (1-based) is `schedule_ms[n-1]`; past the end, the last step.
    pub schedule_ms: Vec<u64>,
    /// Attempts before a delivery is dead-lettered.
    pub max_attempts: u32,
    pub jitter: Jitter,
    /// The longest `Retry-After` a sink may ask for; longer asks are cut to it.
    pub max_retry_after_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            schedule_ms: vec![
                5_000, 30_000, 120_000, 600_000, 1_800_000, 3_600_000, 7_200_000, 14_400_000,
            ],
            max_attempts: 10,
            jitter: Jitter::Full,
            max_retry_after_ms: 86_400_000,
        }
    }
}
