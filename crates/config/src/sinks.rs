//! Sinks: where hooks are delivered (`sinks`).

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, CaBundle, ConfigError, SecretSource, Secrets};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    pub id: String,
    pub url: String,
    /// Signs deliveries (Standard Webhooks); `whsec_` + base64, or raw bytes.
    #[serde(default)]
    pub secret: Option<SecretSource>,
    #[serde(default = "default_sink_timeout")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// A 4xx other than 408 and 429 dead-letters at once (else it is retried).
    #[serde(default = "crate::default_true")]
    pub dead_letter_on_4xx: bool,
    /// Deliveries in flight to this sink (default: `dispatch.per_sink_inflight`).
    #[serde(default)]
    pub max_inflight: Option<usize>,
    /// Consecutive failed attempts (408, 429, 5xx, timeouts, connection errors) that open
    /// the sink's breaker.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker keeps the sink's rows due before a probe (longer if the
    /// sink's `Retry-After` asks for it).
    #[serde(default = "default_breaker_cooldown")]
    pub breaker_cooldown_ms: u64,
    /// Certificate authorities this sink's HTTPS server may be signed by, beyond the web
    /// PKI and `dispatch.ca_bundle` (a sink behind a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
}

fn default_sink_timeout() -> u64 {
    10_000
}

fn default_breaker_failures() -> u32 {
    5
}

fn default_breaker_cooldown() -> u64 {
    5_000
}

impl SinkConfig {
    /// This sink's own keys (`key` is `sinks[i]`); its id is checked against the others'.
    pub(crate) fn validate(&self, key: &str, secrets: Secrets) -> Result<(), ConfigError> {
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(invalid(
                &format!("{key}.url"),
                "must be an http:// or https:// URL",
            ));
        }
        in_range(&format!("{key}.timeout_ms"), self.timeout_ms, 1..=600_000)?;
        in_range(
            &format!("{key}.breaker_failures"),
            self.breaker_failures,
            1..=10_000,
        )?;
        in_range(
            &format!("{key}.breaker_cooldown_ms"),
            self.breaker_cooldown_ms,
            1..=3_600_000,
        )?;
        // A sink with no slot would never be delivered to.
        if let Some(m) = self.max_inflight {
            in_range(&format!("{key}.max_inflight"), m, 1..=100_000)?;
        }
        if let Some(ca) = &self.ca_bundle {
            ca.validate(&format!("{key}.ca_bundle"), secrets)?;
        }
        Ok(())
    }
}
