//! The node itself: `GET /v1/node` (its status, which the operator polls) and
//! `GET /v1/config` (the effective configuration, secrets redacted).

use std::sync::Arc;

use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::IntoResponse;
use axum::Json;

use super::api::{admin_only, blocking, caller, Api, ApiError, ApiResult};

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
pub async fn config(State(api): State<Arc<Api>>, headers: HeaderMap) -> ApiResult {
    admin_only(&caller(&api, &headers)?)?;
    Ok(
        Json(serde_json::to_value(&**api.config.load()).map_err(|_| ApiError::Internal)?)
            .into_response(),
    )
}

/// `GET /v1/node`: the node's status (the operator polls it). Admin only.
#[utoipa::path(
    get,
    path = "/v1/node",
    tag = "admin",
    responses(
        (status = 200, description = "The node's status (served during a boot migration too)", body = ankusa_crds::node::NodeStatus),
        (status = 401, description = "No valid token", body = crate::http::ErrorBody),
        crate::http::Forbidden,
    ),
    security(("bearer" = []))
)]
pub async fn node(State(api): State<Arc<Api>>, headers: HeaderMap) -> ApiResult {
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
        Ok(Json(s).into_response())
    })
    .await
}
