//! Tenants: how many a node admits, what a tenant id may be, and every tenant's default
//! quotas (`tenants`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsConfig {
    /// The most tenants this node will hold (ordinals are never reused).
    pub max: u32,
    /// Every tenant's quotas, unless `PUT /v1/tenants/{t}/limits` overrides them.
    pub limits: TenantLimits,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig {
            max: 1_000_000,
            limits: TenantLimits::default(),
        }
    }
}

/// One tenant's quotas, enforced by the node that owns it; `None` (absent): no limit.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantLimits {
    /// Hooks a second the tenant may send: a token bucket refilled at this rate. Over it,
    /// 429 `tenant_rate_limited` with `Retry-After` set to the refill time.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingest_per_second: Option<f64>,
    /// The bucket's size: hooks taken at once after a quiet spell (default: one second's
    /// worth, at least 1).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingest_burst: Option<u32>,
    /// The tenant's queued bytes (the size of its delivery rows, the `bytes` counter) at
    /// which its hooks are refused: 503 `tenant_backlog_full`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_bytes: Option<u64>,
    /// The tenant's archived copies, in bytes as stored, at which its next hooks are not
    /// archived (still delivered): the archive keeps what it holds until retention frees
    /// room.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive_bytes: Option<u64>,
}

/// The range of a rate limit, hooks a second.
pub const INGEST_RATE_RANGE: std::ops::RangeInclusive<f64> = 0.001..=1_000_000.0;

impl TenantLimits {
    /// Range checks, naming each key under `prefix` (`tenants.limits`).
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if let Some(r) = self.ingest_per_second {
            if !INGEST_RATE_RANGE.contains(&r) {
                return Some((
                    "ingest_per_second",
                    format!(
                        "{r} is outside {}..={}",
                        INGEST_RATE_RANGE.start(),
                        INGEST_RATE_RANGE.end()
                    ),
                ));
            }
        }
        if self.ingest_burst == Some(0) {
            return Some(("ingest_burst", "must be at least 1".into()));
        }
        if self.ingest_burst.is_some() && self.ingest_per_second.is_none() {
            return Some((
                "ingest_burst",
                "needs ingest_per_second (a burst of an unlimited rate means nothing)".into(),
            ));
        }
        if self.queued_bytes == Some(0) {
            return Some(("queued_bytes", "must be at least 1".into()));
        }
        if self.archive_bytes == Some(0) {
            return Some(("archive_bytes", "must be at least 1".into()));
        }
        None
    }

    /// The bucket's size.
    pub fn burst(&self) -> Option<f64> {
        self.ingest_per_second
            .map(|r| self.ingest_burst.map_or(r.max(1.0), f64::from))
    }
}

/// The range `tenants.max` must fall in (ordinal `u32::MAX` is reserved).
pub const TENANTS_MAX_RANGE: std::ops::RangeInclusive<u32> = 1..=4_294_967_294;

/// The longest tenant id, in bytes.
pub const MAX_TENANT_LEN: usize = 256;

/// What is wrong with a tenant id, if anything: empty, over 256 bytes, or a control
/// character.
pub fn tenant_id_problem(tenant: &str) -> Option<&'static str> {
    if tenant.is_empty() {
        Some("empty")
    } else if tenant.len() > MAX_TENANT_LEN {
        Some("longer than 256 bytes")
    } else if tenant.chars().any(char::is_control) {
        Some("contains a control character")
    } else {
        None
    }
}
