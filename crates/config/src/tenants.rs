//! Tenants: how many a node admits, and what a tenant id may be (`tenants`).

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsConfig {
    /// The most tenants this node will hold (ordinals are never reused).
    pub max: u32,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig { max: 1_000_000 }
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
