//! The node itself: `GET /v1/node` (its status, which the operator polls) and
//! `GET /v1/config` (the effective configuration, secrets redacted).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;

use super::api::{admin_only, blocking, caller, Api, ApiError};
use ankusa_api_macros::answers;

/// `GET /v1/config`: the effective configuration, every secret `<redacted>`. Admin only.
#[utoipa::path(
    get,
    path = "/v1/config",
    tag = "admin",
    responses(
        (status = 200, description = "The effective configuration, secrets redacted", body = Object),
        crate::http::AuthErrors,
        crate::http::Forbidden,
    ),
    security(("bearer" = []))
)]
pub async fn config(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
) -> Result<axum::response::Response, ApiError> {
    admin_only(&caller(&api, &headers)?)?;
    let mut v = serde_json::to_value(&**api.config.load()).map_err(|_| ApiError::Internal)?;
    redact_sinks(&mut v);
    Ok(Json(v).into_response())
}

/// What a sink's configuration carries that is as good as a secret: its headers' values
/// (an API key, a bearer token) and its URL's user information and query.
fn redact_sinks(config: &mut serde_json::Value) {
    let redacted = || serde_json::Value::from(ankusa_config::REDACTED);
    let sinks = config
        .get_mut("sinks")
        .and_then(serde_json::Value::as_array_mut);
    for sink in sinks.into_iter().flatten() {
        if let Some(h) = sink
            .get_mut("headers")
            .and_then(serde_json::Value::as_object_mut)
        {
            h.values_mut().for_each(|v| *v = redacted());
        }
        if let Some(url) = sink.get_mut("url") {
            if let Some(u) = url.as_str() {
                *url = crate::http::redact_url(u).into();
            }
        }
    }
}

/// `GET /v1/node`: the node's status (the operator polls it). Admin only.
#[answers]
#[utoipa::path(
    get,
    path = "/v1/node",
    tag = "admin",
    responses(
        (status = 200, description = "The node's status (served during a boot migration too)"),
        (status = 401, description = "No valid token", body = ankusa_api::error::ErrorBody),
        crate::http::Forbidden,
    ),
    security(("bearer" = []))
)]
pub async fn node(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
) -> Result<Json<ankusa_api::node::NodeStatus>, ApiError> {
    admin_only(&caller(&api, &headers)?)?;
    let a = api.clone();
    blocking(move || {
        let mut s = super::node_status(&a.store, a.progress.get())?;
        s.cluster = a.cluster.status();
        s.tenants_paused = Some(a.paused.paused_len() as u64);
        s.tenants_over_quota = Some(a.quotas.over_quota(ankusa_keyspace::now_ms()) as u64);
        s.object_backups = a.backups.get().map(|b| b.status());
        s.config = Some(
            a.config_status
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
        );
        Ok(Json(s))
    })
    .await
}
