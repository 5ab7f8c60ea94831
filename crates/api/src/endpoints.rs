//! A tenant's own endpoints (`/v1/tenants/{t}/endpoints`): HTTP sinks the tenant manages
//! through the API, delivered to by the routes that say `endpoints: true`.
//!
//! An endpoint's signing secret is shown twice only: in the answer that creates it and in
//! the answer that rotates it. Every other answer shows when each of its secrets was made
//! and until when an old one still signs.

use serde::{Deserialize, Serialize};

use crate::admin::present;

/// `POST /v1/tenants/{t}/endpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointCreate {
    /// `http://` or `https://`, at most 2 048 bytes, no user name or password in it.
    pub url: String,
    /// Free text for the tenant (at most 256 bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Which hooks it takes: a route filter (`{"event": ["invoice.*"]}`, `any`, `all`,
    /// `header`, `json_pointer`), as `routes[].filters` in the configuration; absent: all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub filter: Option<serde_json::Value>,
    /// The most deliveries a second to it (absent: no pace beyond its adaptive limit).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    /// Whether new hooks go to it (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `PATCH /v1/tenants/{t}/endpoints/{id}`: the keys present change, `null` clears
/// `description`, `filter` and `rate_per_second`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct EndpointPatch {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<String>)]
    pub description: Option<Option<String>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<Object>)]
    pub filter: Option<Option<serde_json::Value>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u32>)]
    pub rate_per_second: Option<Option<u32>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

/// `POST /v1/tenants/{t}/endpoints/{id}/rotate`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RotateRequest {
    /// How long the secret it replaces still signs beside the new one, in seconds (absent:
    /// `endpoints.rotation_overlap_s`; 0: it stops at once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlap_s: Option<u64>,
}

/// One of an endpoint's secrets, without its value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SecretInfo {
    pub created_ms: u64,
    /// Until when it still signs (a rotated secret); absent: the current one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

/// An endpoint as the API shows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Endpoint {
    /// `ep_` and 16 hex digits: the sink id its deliveries show.
    pub id: String,
    pub tenant: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub filter: Option<serde_json::Value>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    pub enabled: bool,
    /// The secrets that sign its deliveries now, newest first: during a rotation's overlap
    /// each delivery carries a signature of each.
    pub secrets: Vec<SecretInfo>,
    pub created_ms: u64,
    pub updated_ms: u64,
}

/// The answer of a create or a rotation: the endpoint and its new secret, shown this once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EndpointSecret {
    pub endpoint: Endpoint,
    /// `whsec_` and the key in base64: Standard Webhooks' form, which its libraries take.
    pub secret: String,
}

/// `GET /v1/tenants/{t}/endpoints`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EndpointList {
    pub tenant: String,
    pub endpoints: Vec<Endpoint>,
    /// The most endpoints the tenant may have (`endpoints.max_per_tenant`).
    pub max: usize,
}
