//! The audit trail: `GET /v1/audit`, newest first; a tenant scope sees its tenants' rows.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::api::{blocking, caller, limit, Api, ApiError};
use ankusa_api::admin::AuditPage;
use ankusa_api_macros::answers;
use ankusa_queue::audit::{self};

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    before: Option<u64>,
    limit: Option<usize>,
}

/// `GET /v1/audit`: newest first; a tenant scope sees rows of its tenants.
#[answers]
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "admin",
    params(AuditQuery),
    responses(
        (status = 200, description = "Audit rows, newest first"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
    ),
    security(("bearer" = []))
)]
pub async fn audit_list(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<AuditQuery>,
) -> Result<Json<AuditPage>, ApiError> {
    let c = caller(&api, &headers)?;
    let n = limit(&api, q.limit);
    let a = api.clone();
    blocking(move || {
        let rows = audit::page(&a.store, q.before, n, |r| {
            c.scope.is_admin() || r.tenant.as_deref().is_some_and(|t| c.scope.sees(t))
        })?;
        let next = (rows.len() == n)
            .then(|| rows.last().map(|r| r.seq))
            .flatten();
        let items = rows.into_iter().map(crate::wire::audit).collect();
        Ok(Json(AuditPage { items, next }))
    })
    .await
}
