//! `GET /v1/sources/{id}`: a source as configured, and its waiting work (ADR
//! `pending_for_source`).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;
use serde::Deserialize;

use super::api::{blocking, caller, quarantine_visible, source_tenant, Api, ApiError, ApiResult};
use crate::queue::{deliveries, tenants};

/// Rows read by default, and at most.
const DEFAULT_ROWS: usize = 100_000;
const MAX_ROWS: usize = 1_000_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct SourceQuery {
    /// The most due and inflight rows read to count the backlog.
    limit: Option<usize>,
}

/// `GET /v1/sources/{id}?limit=`: `{id, tenant, verify, route, sinks, forward_headers,
/// backlog: {pending, scheduled, inflight, bytes, rows_read, exact}}`. A source with a
/// fixed tenant reads only that tenant's rows; a shared one folds every due and inflight
/// row, up to `limit` (then `exact` is false). A tenant token sees only the sources fixed
/// to its tenants (as for quarantine).
#[utoipa::path(
    get,
    path = "/v1/sources/{id}",
    tag = "admin",
    params(("id" = String, Path, description = "A source id"), SourceQuery),
    responses(
        (status = 200, description = "The source and its backlog", body = crate::openapi::SourceView),
        crate::openapi::AuthErrors,
        crate::openapi::BadRequest,
        crate::openapi::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<SourceQuery>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let config = &api.config;
    let Some(src) = config.sources.iter().find(|s| s.id == id) else {
        return Err(ApiError::NotFound("source"));
    };
    if !quarantine_visible(config, &c.scope, &id) {
        return Err(ApiError::NotFound("source"));
    }
    let limit = q.limit.unwrap_or(DEFAULT_ROWS).clamp(1, MAX_ROWS);
    let fixed = source_tenant(config, &id);
    let sinks: Vec<String> = config
        .routes
        .iter()
        .find(|r| r.id == src.route)
        .map(|r| r.sinks.clone())
        .unwrap_or_default();
    let verify = serde_json::to_value(&src.verify)
        .ok()
        .and_then(|v| v["scheme"].as_str().map(str::to_owned));
    let forward: Vec<String> = match &src.forward_headers {
        Some(h) => h.clone(),
        None => src
            .verify
            .forward_headers()
            .iter()
            .map(|h| h.to_string())
            .collect(),
    };
    let a = api.clone();
    let tenant = fixed.clone();
    let backlog = blocking(move || {
        let ord = match &tenant {
            // A fixed tenant with no ordinal has never had a row here: nothing to read.
            Some(t) => match tenants::ord(&a.store, t)? {
                Some(o) => Some(o),
                None => {
                    return Ok(deliveries::SourceBacklog {
                        exact: true,
                        ..Default::default()
                    })
                }
            },
            None => None,
        };
        Ok(deliveries::pending_for_source(&a.store, &id, ord, limit)?)
    })
    .await?;
    Ok(Json(serde_json::json!({
        "id": src.id,
        "tenant": fixed,
        "verify": verify,
        "route": src.route,
        "sinks": sinks,
        "forward_headers": forward,
        "backlog": backlog,
    }))
    .into_response())
}
