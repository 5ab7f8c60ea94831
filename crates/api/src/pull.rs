//! The pull gateway's bodies (`/pull/{sink}/…` on the ingest listener, with a consumer's
//! token): a claim and the hooks it leased, and the settling of leases (docs/pull.md).

use serde::{Deserialize, Serialize};

use crate::error::ErrorCode;

/// A claim: how many hooks, how many body bytes, how long to wait for the first, and how
/// long to lease them. Each key is optional.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// The most hooks (default and ceiling: `pull.max_claim`).
    pub max: Option<usize>,
    /// The most body bytes (default and ceiling: `pull.max_claim_bytes`); a first hook
    /// larger than this still comes, alone.
    pub max_bytes: Option<u64>,
    /// How long to wait when nothing is waiting (default 0, ceiling `pull.max_wait_ms`).
    pub wait_ms: Option<u64>,
    /// The lease (default: the sink's `lease_ms`; 1 000 ms to 12 h).
    pub lease_ms: Option<u64>,
}

/// The hooks a claim leased.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClaimAnswer {
    pub hooks: Vec<ClaimedHook>,
}

/// One leased hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClaimedHook {
    /// What `ack`, `nack` and `extend` take.
    pub lease: String,
    /// When the lease runs out (ms since the epoch): after it the hook is due again.
    pub lease_deadline_ms: u64,
    /// This is the delivery's `attempt`-th attempt (1 = first).
    pub attempt: u32,
    pub id: String,
    pub tenant: String,
    pub source: String,
    pub sink: String,
    pub received_at_ms: u64,
    pub content_type: String,
    /// The provider's headers its source forwards (`sources[].forward_headers`).
    pub headers: Vec<ForwardedHeader>,
    /// The body, when it is UTF-8 text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body in standard base64, when it is not UTF-8.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ForwardedHeader {
    pub name: String,
    /// The value as received (lossy UTF-8).
    pub value: String,
}

/// Leases to settle.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AckRequest {
    pub leases: Vec<String>,
}

/// Leases to give back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NackRequest {
    pub leases: Vec<String>,
    /// Wait at least this long before the next attempt (the retry schedule's step when
    /// longer; at most `retry.max_retry_after_ms`).
    pub retry_after_ms: Option<u64>,
}

/// Leases to extend.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    pub leases: Vec<String>,
    /// The new lease, from now (1 000 ms to 12 h; default: the sink's `lease_ms`).
    pub lease_ms: Option<u64>,
}

/// What a settle or an extension did: 200 when every lease was held, 409 when one or
/// more were not (the others were still settled or extended).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SettleAnswer {
    /// Leases settled (or extended) by this call.
    pub settled: usize,
    /// The new deadline, for an extension.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_deadline_ms: Option<u64>,
    /// Leases not held: `expired` (past its deadline; the hook is due again), `lifetime`
    /// (an extension past `pull.max_lease_lifetime_ms` from the claim: not extended),
    /// `unknown` (settled already, claimed again since, revoked by a pause or an erase of
    /// its tenant, malformed, or not this consumer's), or
    /// `unavailable` (in a Relay of several nodes, the node holding it did not answer: try
    /// again).
    pub conflicts: Vec<LeaseConflict>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaseConflict {
    pub lease: String,
    pub reason: ConflictReason,
}

/// Why a lease was not held.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ConflictReason {
    /// Past its deadline: the hook is due again.
    Expired,
    /// An extension past `pull.max_lease_lifetime_ms` from the claim: not extended.
    Lifetime,
    /// Settled already, claimed again since, revoked by a pause or an erase of its
    /// tenant, malformed, or not this consumer's.
    Unknown,
    /// In a Relay of several nodes, the node holding it did not answer: try again.
    Unavailable,
}

/// A 409's body: the code `lease_conflict`, and the answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ConflictBody {
    /// Always `lease_conflict`.
    pub error: ErrorCode,
    pub message: String,
    pub settled: usize,
    pub conflicts: Vec<LeaseConflict>,
}
