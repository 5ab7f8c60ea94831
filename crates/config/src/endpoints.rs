//! Tenants' own endpoints (`endpoints`): HTTP sinks a tenant manages through the API
//! (`/v1/tenants/{t}/endpoints`), stored in the node's store, reached by the routes that
//! say `endpoints: true`.

use serde::{Deserialize, Serialize};

use crate::{in_range, ConfigError};

/// The prefix of every tenant endpoint's id (`ep_` and 16 hex digits); no configured sink's
/// id may start with it.
pub const ENDPOINT_ID_PREFIX: &str = "ep_";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct EndpointsConfig {
    /// The most endpoints one tenant may have.
    pub max_per_tenant: usize,
    /// The most endpoints this node stores, every tenant's together.
    pub max_total: usize,
    /// Tenants whose endpoint lists are held in memory (the least recently used go first).
    pub cache_tenants: usize,
    /// Deliver to private (RFC 1918, unique local), loopback, link-local, shared (RFC
    /// 6598), unspecified, multicast and reserved addresses. Off: such an address is
    /// refused, checked against the address a name resolves to when the delivery connects.
    pub allow_private: bool,
    /// A delivery's timeout, in milliseconds.
    pub timeout_ms: u64,
    /// Requests in flight to one endpoint, at most (its adaptive limit's ceiling).
    pub max_inflight: usize,
    /// Consecutive failures that open an endpoint's breaker.
    pub breaker_failures: u32,
    /// How long an open breaker waits before a probe, in milliseconds.
    pub breaker_cooldown_ms: u64,
    /// How long a rotated secret still signs beside the new one when the rotation does
    /// not say, in seconds.
    pub rotation_overlap_s: u64,
}

impl Default for EndpointsConfig {
    fn default() -> Self {
        EndpointsConfig {
            max_per_tenant: 20,
            max_total: 100_000,
            cache_tenants: 10_000,
            allow_private: false,
            timeout_ms: 10_000,
            max_inflight: 8,
            breaker_failures: 5,
            breaker_cooldown_ms: 30_000,
            rotation_overlap_s: 86_400,
        }
    }
}

/// The longest overlap of a rotated secret (30 days).
pub const MAX_ROTATION_OVERLAP_S: u64 = 30 * 86_400;

impl EndpointsConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        in_range("endpoints.max_per_tenant", self.max_per_tenant, 1..=1_000)?;
        in_range("endpoints.max_total", self.max_total, 1..=10_000_000)?;
        in_range("endpoints.cache_tenants", self.cache_tenants, 1..=1_000_000)?;
        in_range("endpoints.timeout_ms", self.timeout_ms, 100..=300_000)?;
        in_range("endpoints.max_inflight", self.max_inflight, 1..=1_024)?;
        in_range(
            "endpoints.breaker_failures",
            self.breaker_failures,
            1..=1_000,
        )?;
        in_range(
            "endpoints.breaker_cooldown_ms",
            self.breaker_cooldown_ms,
            100..=3_600_000,
        )?;
        in_range(
            "endpoints.rotation_overlap_s",
            self.rotation_overlap_s,
            0..=MAX_ROTATION_OVERLAP_S,
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_defaults_are_valid_and_each_bound_is_checked() {
        EndpointsConfig::default().validate().unwrap();
        let c = EndpointsConfig {
            max_per_tenant: 0,
            ..EndpointsConfig::default()
        };
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("endpoints.max_per_tenant"), "{e}");
        let c = EndpointsConfig {
            rotation_overlap_s: MAX_ROTATION_OVERLAP_S + 1,
            ..EndpointsConfig::default()
        };
        assert!(c.validate().is_err());
    }
}
