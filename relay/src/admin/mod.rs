//! The admin listener (default `:9090`): liveness, readiness and the node's status.
//!
//! `/metrics` serves the node's Prometheus metrics. `/healthz` answers as soon as the process serves; `/readyz` only once the store is open
//! and every pending migration has run; `/v1/node` reports the version, store formats,
//! tenant count and the node's aggregate counters (six point reads, never a fold).

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::header::CONTENT_TYPE;
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;

use crate::queue::{counters, tenants, Counts};
use crate::store::{migrate, Store, SUPPORTED_FORMAT};

/// Shared state of the admin handlers.
#[derive(Debug)]
pub struct AdminState {
    pub store: Arc<Store>,
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<crate::metrics::Metrics>,
}

/// The node status served at `/v1/node`.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct NodeStatus {
    pub version: &'static str,
    pub supported_format: u32,
    pub store_format: u32,
    /// The format an unfinished migration is moving to, if any.
    pub migrating_to: Option<u32>,
    pub tenants: u32,
    pub counters: Counts,
    pub oldest_due_at_ms: Option<u64>,
}

/// Reads the node status from the store (O(1): point reads and one marker seek).
pub fn node_status(store: &Store) -> Result<NodeStatus, crate::store::StoreError> {
    Ok(NodeStatus {
        version: env!("CARGO_PKG_VERSION"),
        supported_format: SUPPORTED_FORMAT,
        store_format: store.format()?,
        migrating_to: migrate::in_progress(store)?.map(|(to, _)| to),
        tenants: tenants::count(store)?,
        counters: counters::node(store)?,
        oldest_due_at_ms: crate::queue::deliveries::oldest_due_at(store)?.map(|a| a.0),
    })
}

fn error(status: StatusCode, code: &str, message: String) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": code, "message": message })),
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok\n"
}

async fn readyz(State(s): State<Arc<AdminState>>) -> Response {
    if s.ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the store is opening or migrating".into(),
        )
    }
}

async fn node(State(s): State<Arc<AdminState>>) -> Response {
    let store = s.store.clone();
    match tokio::task::spawn_blocking(move || node_status(&store)).await {
        Ok(Ok(status)) => Json(status).into_response(),
        Ok(Err(e)) => {
            tracing::error!(error = %e, "reading node status");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "store_error",
                "the store could not be read".into(),
            )
        }
        Err(e) => {
            tracing::error!(error = %e, "node status task");
            error(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error".into(),
            )
        }
    }
}

async fn metrics(State(s): State<Arc<AdminState>>) -> Response {
    (
        [(
            CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        s.metrics.encode(),
    )
        .into_response()
}

/// The admin router.
pub fn router(state: Arc<AdminState>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/readyz", get(readyz))
        .route("/v1/node", get(node))
        .with_state(state)
}
