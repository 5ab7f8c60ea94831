//! `POST /v1/portal-links`: a signed link that opens the console scoped to one tenant
//! (docs/console.md, "The tenant portal").

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;

use super::api::{admin_only, blocking, caller, visible_ord, Api, ApiError};
use ankusa_api::admin::{PortalLink, PortalRequest};
use ankusa_api::error::ErrorCode;
use ankusa_api_macros::answers;

/// A portal link's lifetime when the request names none (24 hours).
pub const DEFAULT_TTL_MS: u64 = 86_400_000;

/// `POST /v1/portal-links`: admin tokens only; 409 `portal_disabled` without
/// `admin.console.portal_secret`. Written to the audit trail.
#[answers]
#[utoipa::path(
    post,
    path = "/v1/portal-links",
    tag = "admin",
    request_body = PortalRequest,
    responses(
        (status = 200, description = "The link"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
        (status = 409, description = "No portal_secret is configured (portal_disabled)", body = ankusa_api::error::ErrorBody),
        crate::http::JsonBodyErrors,
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Json(req): Json<PortalRequest>,
) -> Result<Json<PortalLink>, ApiError> {
    let c = caller(&api, &headers)?;
    admin_only(&c)?;
    let max = api.config.load().admin.console.portal_max_ttl_ms;
    let ttl = req.ttl_ms.unwrap_or(DEFAULT_TTL_MS.min(max));
    if ttl == 0 || ttl > max {
        return Err(ApiError::BadRequest(format!(
            "ttl_ms must be 1 to admin.console.portal_max_ttl_ms ({max})"
        )));
    }
    let a = api.clone();
    blocking(move || {
        visible_ord(&a.store, &c.scope, &req.tenant)?;
        let expires_ms = ankusa_keyspace::now_ms().saturating_add(ttl);
        let Some(credential) = a.tokens.load().portal_credential(&req.tenant, expires_ms) else {
            return Err(ApiError::Conflict {
                code: ErrorCode::PortalDisabled,
                message: "set admin.console.portal_secret to make portal links".into(),
            });
        };
        let audit = a.audit.op(
            &c.name,
            "portal.link",
            Some(&req.tenant),
            serde_json::json!({ "expires_ms": expires_ms }),
        );
        ankusa_queue::commit(&a.store, vec![audit], true)?;
        Ok(Json(PortalLink {
            path: format!("/ui/portal/{credential}/"),
            tenant: req.tenant,
            credential,
            expires_ms,
        }))
    })
    .await
}
