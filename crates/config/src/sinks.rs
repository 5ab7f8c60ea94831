//! Sinks: where hooks are delivered (`sinks`).

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, CaBundle, ConfigError, SecretSource, Secrets};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    pub id: String,
    /// `http` (the default): the relay POSTs each hook to `url`. `pull`: consumers claim
    /// the hooks over HTTP (`/pull/{sink}/claim`, docs/pull.md); no `url`.
    #[serde(default)]
    pub kind: SinkKind,
    #[serde(default)]
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
    /// A pull sink's lease when the claim names none, in milliseconds (default:
    /// `pull.lease_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
}

/// How a sink's deliveries leave the node.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SinkKind {
    /// An HTTP POST to the sink's `url`.
    #[default]
    Http,
    /// Consumers lease the hooks over HTTP (the claim gateway).
    Pull,
}

/// The longest id of a pull sink (it is part of the store's keys and of URLs).
pub const MAX_PULL_SINK_ID: usize = 128;

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
        if self.kind == SinkKind::Pull {
            return self.validate_pull(key);
        }
        if self.lease_ms.is_some() {
            return Err(invalid(
                &format!("{key}.lease_ms"),
                "is a pull sink's key (kind: pull)",
            ));
        }
        if self.url.is_empty() {
            return Err(invalid(
                &format!("{key}.url"),
                "an HTTP sink (kind: http, the default) needs an http:// or https:// URL",
            ));
        }
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

    /// A pull sink: an id that fits a key and a URL path, no HTTP keys, a lease in range.
    fn validate_pull(&self, key: &str) -> Result<(), ConfigError> {
        let url_safe = self
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !url_safe || self.id.len() > MAX_PULL_SINK_ID {
            return Err(invalid(
                &format!("{key}.id"),
                format!("a pull sink's id is [A-Za-z0-9._-], at most {MAX_PULL_SINK_ID} bytes"),
            ));
        }
        let http_keys = [
            ("url", !self.url.is_empty()),
            ("secret", self.secret.is_some()),
            ("headers", !self.headers.is_empty()),
            ("ca_bundle", self.ca_bundle.is_some()),
        ];
        if let Some((k, _)) = http_keys.iter().find(|(_, set)| *set) {
            return Err(invalid(
                &format!("{key}.{k}"),
                "is an HTTP sink's key; a pull sink's consumers claim its hooks",
            ));
        }
        if let Some(m) = self.max_inflight {
            in_range(&format!("{key}.max_inflight"), m, 1..=1_000_000)?;
        }
        if let Some(l) = self.lease_ms {
            in_range(
                &format!("{key}.lease_ms"),
                l,
                1_000..=crate::pull::MAX_LEASE_MS,
            )?;
        }
        Ok(())
    }
}
