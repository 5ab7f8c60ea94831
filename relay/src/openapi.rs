//! The API's contract: an OpenAPI 3.1 document generated from the handlers' own
//! annotations (`utoipa`), served at `/v1/openapi.json` on the admin listener and committed
//! as `docs/openapi.json` (a test keeps the two equal, another compares the routers' routes
//! and `docs/api.md` with it; `schemathesis` checks a live node's answers against it).
//!
//! The shapes below are the answers that handlers build as JSON values; the handlers' own
//! types (`DlqItem`, `TenantView`, `NodeStatus`, the hook log's view, …) carry their schema.

use serde::Serialize;
use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

/// Every error of both listeners: a stable code and a message for people.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable code: `unauthorized`, `not_found`, `bad_request`, `tenant_limit`, …
    pub error: String,
    pub message: String,
}

// The error answers that many operations share, written once. They only describe the
// document: the handlers answer through `ApiError` and `http::error`.

/// No valid token, or the node not ready: every authenticated admin call.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum AuthErrors {
    #[response(status = 401, description = "No valid token")]
    Unauthorized(ErrorBody),
    #[response(status = 503, description = "The node is not ready")]
    NotReady(ErrorBody),
}

/// A bad parameter or body.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum BadRequest {
    #[response(status = 400, description = "A bad parameter or body")]
    BadRequest(ErrorBody),
}

/// A thing that does not exist, or that the token's scope does not reach (the two look
/// alike, so a scope learns nothing of other tenants).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum NotFound {
    #[response(status = 404, description = "Not found, or outside the token's scope")]
    NotFound(ErrorBody),
}

/// An operation the token's scope does not allow.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum Forbidden {
    #[response(status = 403, description = "Not for this token's scope")]
    Forbidden(ErrorBody),
}

/// A JSON request body refused before the handler: too large, not JSON, a field unknown
/// or missing.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum JsonBodyErrors {
    #[response(status = 413, description = "The body is too large")]
    TooLarge(ErrorBody),
    #[response(status = 415, description = "The body is not JSON")]
    NotJson(ErrorBody),
    #[response(
        status = 422,
        description = "The JSON body has an unknown or missing field"
    )]
    BadFields(ErrorBody),
}

/// Every refusal of `POST /ingest/*`.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum IngestErrors {
    #[response(status = 400, description = "No tenant, or a bad one (bad_tenant)")]
    BadTenant(ErrorBody),
    #[response(
        status = 401,
        description = "The signature does not verify (quarantined)"
    )]
    Quarantined(ErrorBody),
    #[response(status = 404, description = "No such source")]
    NoSource(ErrorBody),
    #[response(status = 413, description = "The body is too large")]
    TooLarge(ErrorBody),
    #[response(
        status = 431,
        description = "Forwarded headers over their bound (headers_too_large)"
    )]
    HeadersTooLarge(ErrorBody),
    #[response(
        status = 503,
        description = "Not ready, at capacity, the store failing, tenant_limit, or the owner unavailable"
    )]
    Unavailable(ErrorBody),
}

/// `202` (committed by a synced write) or `200` with `duplicate` (seen within the dedupe
/// window: the first hook's id).
#[derive(Debug, Serialize, ToSchema)]
pub struct IngestAnswer {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duplicate: Option<bool>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct DlqPage {
    pub items: Vec<crate::admin::api::DlqItem>,
    /// Pass as `before` for the next page.
    pub next: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Revived {
    /// Rows this call moved from the DLQ to due.
    pub revived: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TenantsTop {
    pub tenants: Vec<crate::admin::api::TenantView>,
    /// Tenants this node holds (in a Relay of several nodes: the registry's count).
    pub total: u64,
    /// A Relay of several nodes: tenants this node owns.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub owned: Option<u64>,
    /// The registry node: tenants the registry holds.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub registered: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct PurgeReport {
    pub tenant: String,
    pub due: u64,
    pub dead: u64,
    pub batches: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QuarantineItem {
    pub id: u64,
    pub source: String,
    pub at_ms: u64,
    pub reason: String,
    /// `[name, value]` pairs as received.
    pub headers: Vec<(String, String)>,
    /// The first 1 024 characters of the body's base64.
    pub body_base64_preview: String,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct QuarantinePage {
    pub items: Vec<QuarantineItem>,
    pub next: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Deleted {
    pub deleted: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct AuditPage {
    pub items: Vec<crate::queue::audit::Record>,
    pub next: Option<u64>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SourceBacklog {
    pub pending: i64,
    pub scheduled: i64,
    pub inflight: i64,
    pub bytes: i64,
    pub rows_read: u64,
    /// False if the read stopped at `limit`: the counts are a lower bound.
    pub exact: bool,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct SourceView {
    pub id: String,
    /// The tenant the source pins (`default` without a tenant setting); null: shared.
    pub tenant: Option<String>,
    /// The verification scheme.
    pub verify: Option<String>,
    pub route: String,
    pub sinks: Vec<String>,
    pub forward_headers: Vec<String>,
    pub backlog: SourceBacklog,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ArchivedItem {
    pub id: String,
    pub tenant: String,
    pub source: String,
    pub received_ms: u64,
    pub expires_ms: u64,
    pub size: u64,
    pub content_type: String,
    pub sinks: Vec<String>,
    pub headers: std::collections::BTreeMap<String, String>,
    /// With `body=true`, a UTF-8 body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// With `body=true`, a body that is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct ArchivePage {
    pub items: Vec<ArchivedItem>,
    /// `<received_ms>.<seq>`: pass as `before` for the next page.
    pub next: Option<String>,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Replayed {
    pub replayed: u64,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct BackupCreated {
    pub id: String,
    pub bytes: u64,
    pub store_format: u32,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct Admitted {
    pub admitted: bool,
}

/// The bearer token of `/v1/*` and the cluster token of `/cluster/v1/*`.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "cluster",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("ankusa-cluster-token"))),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Ankusa relay node",
        description = "The ingest listener (`ingest.listen`, default :8080: `/ingest/*`, `/healthz`, `/readyz`) and the admin listener (`admin.listen`, default :9090: `/v1/*`, `/cluster/v1/*`, `/metrics`, `/healthz`, `/readyz`) of one node. Every error is `ErrorBody`. See docs/api.md."
    ),
    paths(
        crate::ingest::ingest,
        crate::ingest::ingest_for_tenant,
        crate::admin::healthz,
        crate::admin::readyz,
        crate::admin::metrics,
        crate::admin::api::node,
        crate::admin::api::config,
        crate::admin::api::dlq,
        crate::admin::api::replay,
        crate::admin::api::tenants_top,
        crate::admin::api::tenant,
        crate::admin::api::purge,
        crate::admin::api::quarantine_list,
        crate::admin::api::quarantine_delete,
        crate::admin::api::audit_list,
        crate::admin::hooks::get,
        crate::admin::sources::get,
        crate::admin::archive::list,
        crate::admin::archive::replay,
        crate::admin::backups::create,
        crate::admin::backups::stream,
        crate::admin::backups::archive,
        crate::admin::relay_wide::admit,
        document,
    ),
    modifiers(&Security),
    tags(
        (name = "ingest", description = "The ingest listener: providers post hooks here."),
        (name = "admin", description = "The admin listener: operators and the operator."),
        (name = "cluster", description = "Between the nodes of one Relay."),
    )
)]
pub struct ApiDoc;

/// The document, as `/v1/openapi.json` serves it and `docs/openapi.json` holds it.
pub fn json() -> String {
    #[allow(
        clippy::expect_used,
        reason = "a document of derived schemas has only string keys: it always serializes"
    )]
    let mut s = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    s.push('\n');
    s
}

/// `GET /v1/openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "admin",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of both listeners", content_type = "application/json", body = Object),
        (status = 401, body = ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn document() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json(),
    )
        .into_response()
}
