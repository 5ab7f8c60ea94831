//! `GET /v1/sources/{id}`: a source as configured, and its waiting work.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::api::{blocking, caller, Api, ApiError};
use super::auth::Scope;
use ankusa_api::admin::SourceView;
use ankusa_api_macros::answers;
use ankusa_config::Config;
use ankusa_queue::deliveries::{self, SourceBacklog};
use ankusa_queue::tenants;

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
#[answers]
#[utoipa::path(
    get,
    path = "/v1/sources/{id}",
    tag = "admin",
    params(("id" = String, Path, description = "A source id"), SourceQuery),
    responses(
        (status = 200, description = "The source and its backlog"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn get(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(id): Path<String>,
    Query(q): Query<SourceQuery>,
) -> Result<Json<SourceView>, ApiError> {
    let c = caller(&api, &headers)?;
    let config = api.config.load_full();
    let config = &*config;
    let Some(src) = config.sources.iter().find(|s| s.id == id) else {
        return Err(ApiError::NotFound("source"));
    };
    if !quarantine_visible(config, &c.scope, &id) {
        return Err(ApiError::NotFound("source"));
    }
    let limit = q.limit.unwrap_or(DEFAULT_ROWS).clamp(1, MAX_ROWS);
    let fixed = crate::ingest::source_tenant(config, &id);
    let sinks: Vec<String> = config
        .routes
        .iter()
        .find(|r| r.id == src.route)
        .map(|r| r.sinks.clone())
        .unwrap_or_default();
    let verify = Some(src.verify.scheme().to_owned());
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
                    return Ok(SourceBacklog {
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
    Ok(Json(SourceView {
        id: src.id.clone(),
        tenant: fixed,
        verify,
        route: src.route.clone(),
        sinks,
        forward_headers: forward,
        backlog: crate::wire::backlog(backlog),
        unavailable: Vec::new(),
    }))
}

/// Whether `scope` sees `source`'s quarantined requests and backlog.
pub(crate) fn quarantine_visible(config: &Config, scope: &Scope, source: &str) -> bool {
    // A shared source's tenant is whatever the unverified request claimed: admin only.
    scope.is_admin() || crate::ingest::source_tenant(config, source).is_some_and(|t| scope.sees(&t))
}
