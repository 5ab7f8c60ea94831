//! Requests that failed verification: `GET /v1/quarantine` (newest first, with headers
//! and a body preview) and `DELETE /v1/quarantine`.

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::api::{blocking, caller, limit, Api, ApiError};
use super::sources::quarantine_visible;
use ankusa_api::admin::{Deleted, QuarantineItem, QuarantinePage};
use ankusa_api_macros::answers;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct QuarantineQuery {
    id: Option<u64>,
    before: Option<u64>,
    limit: Option<usize>,
}

/// `GET /v1/quarantine`: newest first, with headers and a body preview.
#[answers]
#[utoipa::path(
    get,
    path = "/v1/quarantine",
    tag = "admin",
    params(QuarantineQuery),
    responses(
        (status = 200, description = "Quarantined requests, newest first"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
    ),
    security(("bearer" = []))
)]
pub async fn quarantine_list(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<QuarantineQuery>,
) -> Result<Json<QuarantinePage>, ApiError> {
    let c = caller(&api, &headers)?;
    let n = limit(&api, q.limit);
    let a = api.clone();
    blocking(move || {
        let entries = ankusa_queue::quarantine::page(&a.store, q.before, n, |e| {
            quarantine_visible(&a.config.load(), &c.scope, &e.source)
        })?;
        let next = (entries.len() == n)
            .then(|| entries.last().map(|e| e.id))
            .flatten();
        let items = entries
            .into_iter()
            .map(|e| QuarantineItem {
                body_base64_preview: e.body.chars().take(1024).collect(),
                id: e.id,
                source: e.source,
                at_ms: e.at_ms,
                // A row kept before the codes has its words only.
                reason: if e.code.is_empty() {
                    ankusa_verify::VerifyError::reason_of_words(&e.reason)
                        .unwrap_or("unknown")
                        .to_owned()
                } else {
                    e.code
                },
                detail: e.reason,
                tenant: e.tenant,
                headers: e.headers,
            })
            .collect();
        Ok(Json(QuarantinePage { items, next }))
    })
    .await
}

/// `DELETE /v1/quarantine?id=N` (one) or without `id` (everything within scope).
#[answers]
#[utoipa::path(
    delete,
    path = "/v1/quarantine",
    tag = "admin",
    params(QuarantineQuery),
    responses(
        (status = 200, description = "Entries deleted"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn quarantine_delete(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<QuarantineQuery>,
) -> Result<Json<Deleted>, ApiError> {
    let c = caller(&api, &headers)?;
    super::api::not_portal(&c)?;
    let a = api.clone();
    blocking(move || {
        let audit = a.audit.op(
            &c.name,
            "quarantine.delete",
            None,
            serde_json::json!({ "id": q.id }),
        );
        let visible = |e: &ankusa_queue::quarantine::Entry| {
            quarantine_visible(&a.config.load(), &c.scope, &e.source)
                && q.id.is_none_or(|id| id == e.id)
        };
        let removed =
            crate::ingest::quarantine::delete(&a.store, a.quarantine.as_deref(), visible, audit)?;
        if q.id.is_some() && removed == 0 {
            return Err(ApiError::NotFound("quarantined request"));
        }
        Ok(Json(Deleted {
            deleted: removed as u64,
        }))
    })
    .await
}
