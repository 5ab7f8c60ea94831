//! What the admin API's handlers share: [`Api`] (their state), [`ApiError`] (one JSON
//! shape, a stable code), the caller's checks, and paging.
//!
//! Each resource's handlers and the types of their bodies live in a file of their own:
//! [`super::dlq`], [`super::tenants`], [`super::quarantine`], [`super::audit`],
//! [`super::node`], [`super::hooks`], [`super::sources`], [`super::archive`],
//! [`super::backups`]. Every handler authenticates first; a tenant-scoped token sees only
//! its tenants, and everything else answers as if it did not exist. Listings are newest
//! first with an opaque cursor (`next`), pages capped by `admin.max_page`. Every mutating
//! call writes an audit row, in the same batch as its first effect.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

use super::auth::{Caller, Scope, Tokens};
use crate::ingest::quarantine::Quarantine;
use ankusa_api::error::ErrorCode;
use ankusa_config::Config;
use ankusa_keyspace::TenantOrd;
use ankusa_queue::audit::Audit;
use ankusa_queue::engine::{Store, StoreError};
use ankusa_queue::{tenants, QueueError};

/// What the API handlers share.
#[derive(Debug)]
pub struct Api {
    pub store: Arc<Store>,
    /// The admin tokens and the configuration: a reload swaps them (with the sources and
    /// the sinks); the keys that need a restart never change under a running node.
    pub tokens: Arc<arc_swap::ArcSwap<Tokens>>,
    pub audit: Arc<Audit>,
    pub config: Arc<arc_swap::ArcSwap<Config>>,
    /// When the configuration was loaded, and the last reload refused (`/v1/node`).
    pub config_status: Arc<std::sync::Mutex<ankusa_api::node::ConfigStatus>>,
    pub quarantine: Option<Arc<Quarantine>>,
    /// The boot migration's progress.
    pub progress: Arc<crate::upgrade::Progress>,
    /// Where revived rows are announced to the dispatch pipeline.
    pub hints: Arc<ankusa_queue::hints::DueHints>,
    /// The Relay's nodes: who owns which tenant.
    pub cluster: Arc<crate::cluster::Cluster>,
    /// The ingest writer, once it runs (after the boot migration): archive replays commit
    /// through it.
    pub writer: std::sync::OnceLock<ankusa_queue::writer::WriterHandle>,
    /// Ingest, once it runs: quarantined requests are sent through it again. Weak: a stop
    /// waits for the writer's last handle, which ingest holds.
    pub ingest: std::sync::OnceLock<std::sync::Weak<crate::ingest::IngestState>>,
    /// The paused tenants, which dispatch holds.
    pub paused: Arc<crate::dispatch::paused::Paused>,
    /// Tenant quotas, which ingest enforces.
    pub quotas: Arc<crate::ingest::quota::Quotas>,
    /// Tenants' own endpoints, which ingest routes to and dispatch delivers to.
    pub endpoints: Arc<crate::endpoints::Book>,
    /// Tenants being erased, and the erases' progress.
    pub eraser: Arc<crate::erase::Eraser>,
    /// The node's pushes to an object store, once they run (`backup.object_store`).
    pub backups: std::sync::OnceLock<Arc<crate::objstore::schedule::Backups>>,
    /// Replays running, and their lane of the writer's queue.
    pub replays: crate::dispatch::replays::Replays,
}

/// An API error: one JSON shape, a stable code.
#[derive(Debug)]
pub enum ApiError {
    Unauthorized,
    Forbidden,
    NotFound(&'static str),
    BadRequest(String),
    /// An operation that failed for a reason the caller can act on (a full volume).
    Failed {
        code: ErrorCode,
        message: String,
    },
    /// 409: the call cannot be done in the state the node is in (a ceiling reached).
    Conflict {
        code: ErrorCode,
        message: String,
    },
    Internal,
}

impl From<QueueError> for ApiError {
    fn from(e: QueueError) -> Self {
        tracing::error!(error = %e, corruption = e.is_corruption(), "admin API store error");
        ApiError::Internal
    }
}

impl From<crate::dispatch::replays::Busy> for ApiError {
    fn from(b: crate::dispatch::replays::Busy) -> Self {
        ApiError::Conflict {
            code: ErrorCode::ReplayRunning,
            message: b.to_string(),
        }
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        QueueError::from(e).into()
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let (status, code, msg) = match self {
            ApiError::Unauthorized => (
                StatusCode::UNAUTHORIZED,
                ErrorCode::Unauthorized,
                "a valid bearer token is required".to_owned(),
            ),
            ApiError::Forbidden => (
                StatusCode::FORBIDDEN,
                ErrorCode::Forbidden,
                "this endpoint needs an admin token".to_owned(),
            ),
            ApiError::NotFound(what) => (
                StatusCode::NOT_FOUND,
                ErrorCode::NotFound,
                format!("no such {what}"),
            ),
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, ErrorCode::BadRequest, m),
            ApiError::Failed { code, message } => {
                (StatusCode::INTERNAL_SERVER_ERROR, code, message)
            }
            ApiError::Conflict { code, message } => (StatusCode::CONFLICT, code, message),
            ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                ErrorCode::Internal,
                "internal error".to_owned(),
            ),
        };
        crate::http::error(status, code, msg)
    }
}

/// The authenticated caller, or 401.
pub(crate) fn caller(api: &Api, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let c = api
        .tokens
        .load()
        .authenticate(headers)
        .ok_or(ApiError::Unauthorized)?;
    if c.backup_only || c.metrics_only {
        return Err(ApiError::Forbidden);
    }
    Ok(c)
}

/// The caller of a backup endpoint: an admin or a backup-scope token.
pub(crate) fn backup_caller(api: &Api, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let c = api
        .tokens
        .load()
        .authenticate(headers)
        .ok_or(ApiError::Unauthorized)?;
    if c.backup_only || c.scope.is_admin() {
        Ok(c)
    } else {
        Err(ApiError::Forbidden)
    }
}

/// 403 unless the caller has the admin scope.
pub(crate) fn admin_only(c: &Caller) -> Result<(), ApiError> {
    if c.scope.is_admin() {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// 403 for a tenant-portal credential: deleting rows and holding delivery stay with the
/// tokens of `admin.tokens`.
pub(crate) fn not_portal(c: &Caller) -> Result<(), ApiError> {
    if c.portal {
        Err(ApiError::Forbidden)
    } else {
        Ok(())
    }
}

/// Runs store work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, ApiError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|_| ApiError::Internal)?
}

/// A visible tenant's ordinal; 404 for one outside the scope or unknown.
pub(crate) fn visible_ord(
    store: &Store,
    scope: &Scope,
    tenant: &str,
) -> Result<TenantOrd, ApiError> {
    if !scope.sees(tenant) {
        return Err(ApiError::NotFound("tenant"));
    }
    tenants::ord(store, tenant)?.ok_or(ApiError::NotFound("tenant"))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    pub(crate) tenant: Option<String>,
    pub(crate) before: Option<String>,
    pub(crate) limit: Option<usize>,
}

/// A page's size: `limit`, default 100, within `admin.max_page`.
pub(crate) fn limit(api: &Api, l: Option<usize>) -> usize {
    l.unwrap_or(100).clamp(1, api.config.load().admin.max_page)
}
