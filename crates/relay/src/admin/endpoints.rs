//! A tenant's own endpoints: `GET` and `POST /v1/tenants/{t}/endpoints`, `GET`, `PATCH` and
//! `DELETE /v1/tenants/{t}/endpoints/{id}`, `POST /v1/tenants/{t}/endpoints/{id}/rotate`
//! ([`crate::endpoints`] keeps them).
//!
//! Answered by the tenant's owner, relay-wide. An admin token manages every tenant's; a
//! tenant token its own tenants' (another's answer 404, as if it did not exist); a portal
//! link reads its tenant's and changes nothing. Each change is written with its audit row
//! (`tenant.endpoint.create`, `…update`, `…rotate`, `…delete`: the id and URL, never a
//! secret) in one synced write.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;

use super::api::{blocking, caller, not_portal, Api, ApiError};
use super::auth::Caller;
use crate::endpoints::{Record, Refusal};
use ankusa_api::endpoints::{
    Endpoint, EndpointCreate, EndpointList, EndpointPatch, EndpointSecret, RotateRequest,
};
use ankusa_api::error::ErrorCode;
use ankusa_api_macros::answers;

/// The caller, if it may see tenant `t` (a valid id in its scope), or 400 / 404; and, for
/// a change, may change it (not a portal link: 403; not while it is erased: 409).
fn allowed(api: &Api, headers: &HeaderMap, t: &str, change: bool) -> Result<Caller, ApiError> {
    let c = caller(api, headers)?;
    if let Some(why) = ankusa_config::tenant_id_problem(t) {
        return Err(ApiError::BadRequest(format!("tenant id {why}")));
    }
    if !c.scope.sees(t) {
        return Err(ApiError::NotFound("tenant"));
    }
    if change {
        not_portal(&c)?;
        if api.eraser.erasing.contains(t) {
            return Err(ApiError::Conflict {
                code: ErrorCode::TenantErasing,
                message: "the tenant is being erased".into(),
            });
        }
    }
    Ok(c)
}

fn refused(r: Refusal) -> ApiError {
    match r {
        Refusal::Invalid(why) => ApiError::BadRequest(why),
        Refusal::NotFound => ApiError::NotFound("endpoint"),
        Refusal::TooMany(message) => ApiError::Conflict {
            code: ErrorCode::TooManyEndpoints,
            message,
        },
    }
}

/// A JSON body of the call's type, or 400 naming what is wrong.
fn body<T: serde::de::DeserializeOwned>(bytes: &[u8], what: &str) -> Result<T, ApiError> {
    let bytes = if bytes.iter().all(u8::is_ascii_whitespace) {
        b"{}".as_slice()
    } else {
        bytes
    };
    serde_json::from_slice(bytes).map_err(|e| ApiError::BadRequest(format!("{what}: {e}")))
}

/// The audit row of a change to `r`.
fn audited(api: &Api, c: &Caller, action: &str, t: &str, r: &Record) -> ankusa_queue::Change {
    api.audit.op(
        &c.name,
        action,
        Some(t),
        // A URL's query may hold the tenant's own credential: the log keeps its shape.
        serde_json::json!({ "id": r.id, "url": crate::http::redact_url(&r.url), "enabled": r.enabled }),
    )
}

/// `GET /v1/tenants/{t}/endpoints`
#[answers]
#[utoipa::path(
    get,
    path = "/v1/tenants/{t}/endpoints",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    responses(
        (status = 200, description = "The tenant's endpoints, in id order, without their secrets"),
        crate::http::AuthErrors,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
) -> Result<Json<EndpointList>, ApiError> {
    allowed(&api, &headers, &t, false)?;
    blocking(move || {
        let list = api.endpoints.of(&t)?;
        Ok(Json(EndpointList {
            endpoints: list.iter().map(|r| r.view(&t)).collect(),
            max: api.endpoints.config().max_per_tenant,
            tenant: t,
        }))
    })
    .await
}

/// `POST /v1/tenants/{t}/endpoints`
#[answers]
#[utoipa::path(
    post,
    path = "/v1/tenants/{t}/endpoints",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    request_body(content = EndpointCreate, description = "Its URL, and optionally a description, a filter, a rate and whether it is enabled"),
    responses(
        (status = 201, description = "Created: the endpoint and its secret, shown this once"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::Forbidden,
        crate::http::NotFound,
        (status = 409, description = "`too_many_endpoints`: the tenant's or the node's ceiling; `tenant_erasing`"),
    ),
    security(("bearer" = []))
)]
pub async fn create(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
    bytes: axum::body::Bytes,
) -> Result<(StatusCode, Json<EndpointSecret>), ApiError> {
    let c = allowed(&api, &headers, &t, true)?;
    let req: EndpointCreate = body(&bytes, "endpoint")?;
    blocking(move || {
        let made = api.endpoints.create(&t, req, |r| {
            audited(&api, &c, "tenant.endpoint.create", &t, r)
        })?;
        let (r, secret) = made.map_err(refused)?;
        Ok((
            StatusCode::CREATED,
            Json(EndpointSecret {
                endpoint: r.view(&t),
                secret,
            }),
        ))
    })
    .await
}

/// `GET /v1/tenants/{t}/endpoints/{id}`
#[answers]
#[utoipa::path(
    get,
    path = "/v1/tenants/{t}/endpoints/{id}",
    tag = "admin",
    params(
        ("t" = String, Path, description = "A tenant id"),
        ("id" = String, Path, description = "An endpoint's id"),
    ),
    responses(
        (status = 200, description = "The endpoint, without its secrets"),
        crate::http::AuthErrors,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((t, id)): Path<(String, String)>,
) -> Result<Json<Endpoint>, ApiError> {
    allowed(&api, &headers, &t, false)?;
    blocking(move || match api.endpoints.get(&t, &id)? {
        Some(r) => Ok(Json(r.view(&t))),
        None => Err(ApiError::NotFound("endpoint")),
    })
    .await
}

/// `PATCH /v1/tenants/{t}/endpoints/{id}`
#[answers]
#[utoipa::path(
    patch,
    path = "/v1/tenants/{t}/endpoints/{id}",
    tag = "admin",
    params(
        ("t" = String, Path, description = "A tenant id"),
        ("id" = String, Path, description = "An endpoint's id"),
    ),
    request_body(content = EndpointPatch, description = "The keys to change; null clears description, filter and rate_per_second"),
    responses(
        (status = 200, description = "The endpoint after the change"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::Forbidden,
        crate::http::NotFound,
        (status = 409, description = "`tenant_erasing`"),
    ),
    security(("bearer" = []))
)]
pub async fn update(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((t, id)): Path<(String, String)>,
    bytes: axum::body::Bytes,
) -> Result<Json<Endpoint>, ApiError> {
    let c = allowed(&api, &headers, &t, true)?;
    let patch: EndpointPatch = body(&bytes, "endpoint")?;
    blocking(move || {
        let changed = api.endpoints.update(&t, &id, patch, |r| {
            audited(&api, &c, "tenant.endpoint.update", &t, r)
        })?;
        Ok(Json(changed.map_err(refused)?.view(&t)))
    })
    .await
}

/// `POST /v1/tenants/{t}/endpoints/{id}/rotate`
#[answers]
#[utoipa::path(
    post,
    path = "/v1/tenants/{t}/endpoints/{id}/rotate",
    tag = "admin",
    params(
        ("t" = String, Path, description = "A tenant id"),
        ("id" = String, Path, description = "An endpoint's id"),
    ),
    request_body(content = RotateRequest, description = "How long the secret it replaces still signs (optional; an empty body takes the default)"),
    responses(
        (status = 200, description = "The endpoint and its new secret, shown this once"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::Forbidden,
        crate::http::NotFound,
        (status = 409, description = "`tenant_erasing`"),
    ),
    security(("bearer" = []))
)]
pub async fn rotate(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((t, id)): Path<(String, String)>,
    bytes: axum::body::Bytes,
) -> Result<Json<EndpointSecret>, ApiError> {
    let c = allowed(&api, &headers, &t, true)?;
    let req: RotateRequest = body(&bytes, "rotation")?;
    blocking(move || {
        let rotated = api.endpoints.rotate(&t, &id, req.overlap_s, |r| {
            audited(&api, &c, "tenant.endpoint.rotate", &t, r)
        })?;
        let (r, secret) = rotated.map_err(refused)?;
        Ok(Json(EndpointSecret {
            endpoint: r.view(&t),
            secret,
        }))
    })
    .await
}

/// `DELETE /v1/tenants/{t}/endpoints/{id}`
#[answers]
#[utoipa::path(
    delete,
    path = "/v1/tenants/{t}/endpoints/{id}",
    tag = "admin",
    params(
        ("t" = String, Path, description = "A tenant id"),
        ("id" = String, Path, description = "An endpoint's id"),
    ),
    responses(
        (status = 200, description = "Deleted: the endpoint as it was. Its deliveries still queued dead-letter in their turn"),
        crate::http::AuthErrors,
        crate::http::Forbidden,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn delete(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((t, id)): Path<(String, String)>,
) -> Result<Json<Endpoint>, ApiError> {
    let c = allowed(&api, &headers, &t, true)?;
    blocking(move || {
        let gone = api.endpoints.delete(&t, &id, |r| {
            audited(&api, &c, "tenant.endpoint.delete", &t, r)
        })?;
        Ok(Json(gone.map_err(refused)?.view(&t)))
    })
    .await
}
