//! A tenant's quotas: `GET`, `PUT` and `DELETE /v1/tenants/{t}/limits`
//! ([`crate::ingest::quota`] enforces them).
//!
//! A tenant token reads its own tenants' limits; only an admin changes them. A change is
//! persisted with its audit row in one synced write and made on every node of a Relay (the
//! owner enforces; a node that owns the tenant later has them already). The tenant need
//! not exist yet: limits set before its first hook apply to it.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::Json;

use super::api::{admin_only, blocking, caller, Api, ApiError};
use crate::ingest::quota::SetError;
use ankusa_api::admin::{LimitsView, Overrides};
use ankusa_api::error::ErrorCode;
use ankusa_api_macros::answers;

fn view(api: &Api, tenant: String, changed: Option<u64>) -> LimitsView {
    let q = &api.quotas;
    let refused = q.refused(&tenant).unwrap_or_default();
    LimitsView {
        effective: crate::wire::limits(&q.effective(&tenant)),
        defaults: crate::wire::limits(&q.defaults()),
        overrides: q.overrides(&tenant),
        refused: refused.count,
        last_refused_ms: (refused.count > 0).then_some(refused.last_ms),
        changed,
        unavailable: Vec::new(),
        tenant,
    }
}

/// A tenant id the caller may name (a valid one, in its scope), or 400 / 404.
fn named(scope: &super::auth::Scope, t: &str) -> Result<(), ApiError> {
    if let Some(why) = ankusa_config::tenant_id_problem(t) {
        return Err(ApiError::BadRequest(format!("tenant id {why}")));
    }
    if !scope.sees(t) {
        return Err(ApiError::NotFound("tenant"));
    }
    Ok(())
}

/// `GET /v1/tenants/{t}/limits`
#[answers]
#[utoipa::path(
    get,
    path = "/v1/tenants/{t}/limits",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    responses(
        (status = 200, description = "The tenant's limits: effective, defaults, its own, and its refusals"),
        crate::http::AuthErrors,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
) -> Result<Json<LimitsView>, ApiError> {
    let c = caller(&api, &headers)?;
    named(&c.scope, &t)?;
    Ok(Json(view(&api, t, None)))
}

/// `PUT /v1/tenants/{t}/limits`: the tenant's own limits, replacing any it had (admin
/// scope). `{}` is the same as `DELETE`.
#[answers]
#[utoipa::path(
    put,
    path = "/v1/tenants/{t}/limits",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    request_body(content = Overrides, description = "Its own limits: a key absent keeps the default, null lifts it"),
    responses(
        (status = 200, description = "The tenant's limits after the change"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
        (status = 409, description = "`too_many_overrides`: 100 000 tenants have their own limits already"),
    ),
    security(("bearer" = []))
)]
pub async fn put(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<LimitsView>, ApiError> {
    let o: Overrides =
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(format!("limits: {e}")))?;
    change(api, headers, t, Some(o)).await
}

/// `DELETE /v1/tenants/{t}/limits`: the tenant runs on the defaults again (admin scope).
#[answers]
#[utoipa::path(
    delete,
    path = "/v1/tenants/{t}/limits",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    responses(
        (status = 200, description = "The tenant's limits after the change"),
        crate::http::AuthErrors,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
) -> Result<Json<LimitsView>, ApiError> {
    change(api, headers, t, None).await
}

async fn change(
    api: Arc<Api>,
    headers: HeaderMap,
    t: String,
    next: Option<Overrides>,
) -> Result<Json<LimitsView>, ApiError> {
    let c = caller(&api, &headers)?;
    named(&c.scope, &t)?;
    admin_only(&c)?;
    let a = api.clone();
    blocking(move || {
        let detail = serde_json::json!({ "limits": next });
        let action = if next.is_some_and(|o| !o.is_empty()) {
            "tenant.limits.set"
        } else {
            "tenant.limits.clear"
        };
        let changed = match a.quotas.set(&a.store, &t, next, || {
            a.audit.op(&c.name, action, Some(&t), detail)
        })? {
            Ok(changed) => changed,
            Err(SetError::Invalid(why)) => return Err(ApiError::BadRequest(why)),
            Err(SetError::TooMany) => {
                return Err(ApiError::Conflict {
                    code: ErrorCode::TooManyOverrides,
                    message: format!(
                        "{} tenants have their own limits already",
                        crate::ingest::quota::MAX_OVERRIDES
                    ),
                })
            }
        };
        Ok(Json(view(&a, t, Some(u64::from(changed)))))
    })
    .await
}
