//! `DELETE /v1/tenants/{t}?confirm={t}`: begins erasing a tenant for good (admin scope);
//! the node's eraser ([`crate::erase`]) does the rest.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;

use super::api::{admin_only, blocking, caller, Api, ApiError};
use ankusa_api::admin::EraseState;
use ankusa_api_macros::answers;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EraseQuery {
    /// The tenant id again: an erase cannot be undone.
    confirm: Option<String>,
}

/// `DELETE /v1/tenants/{t}?confirm={t}`: erase the tenant for good (admin scope). Every
/// key of it goes — due, inflight (once their attempts end), dead, its hooks, hook log,
/// archive, dedupe keys, quarantined requests of sources fixed to it, counters — in synced
/// chunks; its ordinal stays as a tombstone. 202 while it runs; the tenant is 404 once it
/// ended.
#[answers]
#[utoipa::path(
    delete,
    path = "/v1/tenants/{t}",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id"), EraseQuery),
    responses(
        (status = 202, description = "The erase runs (or ran already: changed 0)"),
        (status = 400, description = "`confirm` is not the tenant id", body = ankusa_api::error::ErrorBody),
        crate::http::AuthErrors,
        crate::http::Forbidden,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn erase(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
    Query(q): Query<EraseQuery>,
) -> Result<(StatusCode, Json<EraseState>), ApiError> {
    let c = caller(&api, &headers)?;
    admin_only(&c)?;
    if q.confirm.as_deref() != Some(t.as_str()) {
        return Err(ApiError::BadRequest(
            "an erase cannot be undone: pass the tenant id again as ?confirm=".into(),
        ));
    }
    let a = api.clone();
    blocking(move || {
        let Some(ord) = ankusa_queue::tenants::ord(&a.store, &t)? else {
            // A node that never held the tenant may still hold limits set for its id on
            // every node of the Relay: they go, and the tenant is not here.
            if a.quotas.overrides(&t).is_some() {
                // A clear is never refused (no ceiling, nothing to check).
                let _cleared = a.quotas.set(&a.store, &t, None, || {
                    a.audit.op(
                        &c.name,
                        "tenant.limits.clear",
                        Some(&t),
                        serde_json::json!({ "erase": true }),
                    )
                })?;
                a.quotas.forget(&t);
            }
            // And endpoints made before the tenant's first hook here.
            a.endpoints.erase_alone(&t, || {
                a.audit.op(
                    &c.name,
                    "tenant.endpoint.delete",
                    Some(&t),
                    serde_json::json!({ "erase": true }),
                )
            })?;
            return Err(ApiError::NotFound("tenant"));
        };
        let audit = a.audit.op(
            &c.name,
            "tenant.erase",
            Some(&t),
            serde_json::json!({ "ord": ord.0 }),
        );
        let (since, began) = a.eraser.begin(&a.store, ord, &t, audit, &a.paused)?;
        let changed = u64::from(began);
        Ok((
            StatusCode::ACCEPTED,
            Json(EraseState {
                tenant: t,
                erasing: true,
                since_ms: since.0,
                changed,
                unavailable: Vec::new(),
            }),
        ))
    })
    .await
}
