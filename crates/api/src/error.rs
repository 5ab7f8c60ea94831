//! The one error shape of both listeners ([`ErrorBody`]) and its stable codes
//! ([`ErrorCode`]): a client matches on the code, never on the message.

use serde::{Deserialize, Serialize};

/// Every error of both listeners: a stable code and a message for people.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    /// A stable code (`ErrorCode`).
    pub error: ErrorCode,
    pub message: String,
    /// Why, where one code has several causes: a 401 of ingest carries the verification
    /// failure's reason (`missing_header`, `malformed_header`, `stale_timestamp`,
    /// `bad_signature`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// The stable codes of `ErrorBody.error` (docs/api.md lists each with its status and
/// whether to retry). A code a newer node answers and this build does not know reads as
/// `other`; no node answers `other` itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    // The request.
    BadRequest,
    BadTenant,
    BadBody,
    BodyTooLarge,
    BodyTimeout,
    HeadersTooLarge,
    UnsupportedMediaType,
    MethodNotAllowed,
    NotFound,
    UnknownSource,
    // Who asks.
    Unauthorized,
    Forbidden,
    NodeUnauthorized,
    NotARelayNode,
    PortalDisabled,
    // The node's state.
    NotReady,
    StoreOpening,
    StoreUnavailable,
    Unavailable,
    Internal,
    // A tenant's bounds.
    TenantLimit,
    TenantRateLimited,
    TenantBacklogFull,
    TenantErasing,
    TooManyOverrides,
    TooManyEndpoints,
    // A Relay of several nodes.
    NotOwner,
    OwnerUnavailable,
    RegistryUnavailable,
    // Operations.
    ReplayRunning,
    BackupFailed,
    // The pull gateway.
    LeaseConflict,
    UnknownSink,
    TooManyWaitingClaims,
    /// A code this build does not know (a newer node's).
    #[serde(other)]
    Other,
}

impl ErrorCode {
    /// Every code a node answers (all but [`ErrorCode::Other`]).
    pub const ALL: &[ErrorCode] = &[
        ErrorCode::BadRequest,
        ErrorCode::BadTenant,
        ErrorCode::BadBody,
        ErrorCode::BodyTooLarge,
        ErrorCode::BodyTimeout,
        ErrorCode::HeadersTooLarge,
        ErrorCode::UnsupportedMediaType,
        ErrorCode::MethodNotAllowed,
        ErrorCode::NotFound,
        ErrorCode::UnknownSource,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
        ErrorCode::NodeUnauthorized,
        ErrorCode::NotARelayNode,
        ErrorCode::PortalDisabled,
        ErrorCode::NotReady,
        ErrorCode::StoreOpening,
        ErrorCode::StoreUnavailable,
        ErrorCode::Unavailable,
        ErrorCode::Internal,
        ErrorCode::TenantLimit,
        ErrorCode::TenantRateLimited,
        ErrorCode::TenantBacklogFull,
        ErrorCode::TenantErasing,
        ErrorCode::TooManyOverrides,
        ErrorCode::TooManyEndpoints,
        ErrorCode::NotOwner,
        ErrorCode::OwnerUnavailable,
        ErrorCode::RegistryUnavailable,
        ErrorCode::ReplayRunning,
        ErrorCode::BackupFailed,
        ErrorCode::LeaseConflict,
        ErrorCode::UnknownSink,
        ErrorCode::TooManyWaitingClaims,
    ];

    /// The code as it is written on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::BadRequest => "bad_request",
            ErrorCode::BadTenant => "bad_tenant",
            ErrorCode::BadBody => "bad_body",
            ErrorCode::BodyTooLarge => "body_too_large",
            ErrorCode::BodyTimeout => "body_timeout",
            ErrorCode::HeadersTooLarge => "headers_too_large",
            ErrorCode::UnsupportedMediaType => "unsupported_media_type",
            ErrorCode::MethodNotAllowed => "method_not_allowed",
            ErrorCode::NotFound => "not_found",
            ErrorCode::UnknownSource => "unknown_source",
            ErrorCode::Unauthorized => "unauthorized",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::NodeUnauthorized => "node_unauthorized",
            ErrorCode::NotARelayNode => "not_a_relay_node",
            ErrorCode::PortalDisabled => "portal_disabled",
            ErrorCode::NotReady => "not_ready",
            ErrorCode::StoreOpening => "store_opening",
            ErrorCode::StoreUnavailable => "store_unavailable",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::Internal => "internal",
            ErrorCode::TenantLimit => "tenant_limit",
            ErrorCode::TenantRateLimited => "tenant_rate_limited",
            ErrorCode::TenantBacklogFull => "tenant_backlog_full",
            ErrorCode::TenantErasing => "tenant_erasing",
            ErrorCode::TooManyOverrides => "too_many_overrides",
            ErrorCode::TooManyEndpoints => "too_many_endpoints",
            ErrorCode::NotOwner => "not_owner",
            ErrorCode::OwnerUnavailable => "owner_unavailable",
            ErrorCode::RegistryUnavailable => "registry_unavailable",
            ErrorCode::ReplayRunning => "replay_running",
            ErrorCode::BackupFailed => "backup_failed",
            ErrorCode::LeaseConflict => "lease_conflict",
            ErrorCode::UnknownSink => "unknown_sink",
            ErrorCode::TooManyWaitingClaims => "too_many_waiting_claims",
            ErrorCode::Other => "other",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn each_code_is_written_as_its_name_and_an_unknown_one_reads_as_other() {
        for &code in ErrorCode::ALL {
            let text = serde_json::to_string(&code).unwrap();
            assert_eq!(text, format!("\"{}\"", code.as_str()));
            assert_eq!(serde_json::from_str::<ErrorCode>(&text).unwrap(), code);
        }
        let later: ErrorCode = serde_json::from_str("\"a_code_of_a_later_release\"").unwrap();
        assert_eq!(later, ErrorCode::Other);
    }
}
