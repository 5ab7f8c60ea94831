//! The admin listener (default `:9090`) and the admin API behind it (`/v1/…`,
//! docs/api.md): every operator and tenant call on a node, and the calls between the nodes
//! of a Relay (`/cluster/v1/…`).
//!
//! Where to start: [`router`] lists every route. A file per resource ([`dlq`],
//! [`tenants`], [`limits`], [`quarantine`], [`audit`], [`node`], [`hooks`], [`sources`],
//! [`archive`], [`backups`], [`erase`], [`portal`]); what they share in [`api`] (the `Api`
//! they read, errors, the caller); tokens and portal credentials in [`auth`]; one replay per
//! tenant at a time in [`replay`]; calls answered for the whole Relay in [`relay_wide`].
//! The bodies are `ankusa_api::admin`'s; the command line's client is `cli::client`.
//! `/metrics` serves the node's Prometheus metrics. `/healthz` answers as soon as the process serves; `/readyz` only once the store is open
//! and every pending migration has run; `/v1/node` reports the version, store formats,
//! tenant count and the node's aggregate counters (six point reads, never a fold).

use std::sync::atomic::AtomicBool;

use axum::http::header::CONTENT_TYPE;
use std::sync::Arc;

use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;

pub mod api;
pub mod archive;
pub mod audit;
pub mod auth;
pub mod backups;
pub mod dlq;
pub mod erase;
pub mod hooks;
pub mod limits;
pub mod node;
pub mod portal;
pub mod quarantine;
pub mod relay_wide;
pub mod replay;
pub mod sources;
pub mod tenants;

use axum::routing::{delete, post};

use ankusa_api::error::ErrorCode;
use ankusa_queue::counters;
use ankusa_queue::QueueError;
use ankusa_store::{migrate, Store, SUPPORTED_FORMAT};

/// Shared state of the admin handlers.
#[derive(Debug)]
pub struct AdminState {
    pub store: Arc<Store>,
    pub ready: Arc<AtomicBool>,
    pub metrics: Arc<crate::metrics::Metrics>,
    /// The admin tokens (the API's), for `/metrics` when it wants one.
    pub tokens: Arc<arc_swap::ArcSwap<auth::Tokens>>,
    pub metrics_access: ankusa_config::MetricsAccess,
}

use ankusa_api::node::{MigrationProgress, NodeStatus};

/// The boot migration's progress, shared with `/v1/node`.
#[derive(Debug, Default)]
pub struct Progress(std::sync::Mutex<Option<MigrationProgress>>);

impl Progress {
    pub fn set(&self, p: Option<MigrationProgress>) {
        if let Ok(mut g) = self.0.lock() {
            *g = p;
        }
    }
    pub fn get(&self) -> Option<MigrationProgress> {
        self.0.lock().ok().and_then(|g| g.clone())
    }
}

/// Reads the node status from the store: point reads, one marker seek, RocksDB's own size
/// properties and a listing of the store directory's WAL files (`store_bytes`).
pub fn node_status(
    store: &Store,
    migration: Option<MigrationProgress>,
) -> Result<NodeStatus, QueueError> {
    let store_format = store.format()?;
    // Tenants and counters live in the current format's families: a store still below it
    // (its boot migration under way) has none to read yet, and reports zeros with
    // `migrating_to` and the migration's progress rather than an error.
    let current = store_format >= SUPPORTED_FORMAT;
    let (tenants, counters, oldest_due_at_ms) = if current {
        (
            ankusa_queue::tenants::count(store)?,
            crate::wire::counters(counters::node(store)?),
            ankusa_queue::deliveries::oldest_due_at(store)?.map(|a| a.0),
        )
    } else {
        (0, ankusa_api::node::Counters::default(), None)
    };
    Ok(NodeStatus {
        version: env!("CARGO_PKG_VERSION").to_owned(),
        supported_format: SUPPORTED_FORMAT,
        store_format,
        migrating_to: migrate::in_progress(store)?.map(|(to, _)| to),
        migration,
        tenants,
        counters,
        oldest_due_at_ms,
        write_error: store
            .health()
            .error()
            .filter(|_| store.health().failing())
            .map(|(message, since_ms)| ankusa_api::node::WriteError { message, since_ms }),
        cluster: None,
        store_bytes: Some(store.disk_bytes()),
        volume_free_bytes: store.volume_free_bytes(),
        config: None,
        tenants_paused: None,
        tenants_over_quota: None,
        object_backups: None,
    })
}

#[utoipa::path(
    get,
    path = "/healthz",
    tag = "admin",
    responses(
        (status = 200, description = "The process serves (both listeners)", content_type = "text/plain", body = String),
    )
)]
pub(crate) async fn healthz() -> &'static str {
    "ok\n"
}

#[utoipa::path(
    get,
    path = "/readyz",
    tag = "admin",
    responses(
        (status = 200, description = "Ready (both listeners)", content_type = "text/plain", body = String),
        (status = 503, description = "Not ready: the store is opening (store_opening), starting or migrating (not_ready), stopping, or the store's writes fail (store_unavailable)", body = ankusa_api::error::ErrorBody),
    )
)]
pub(crate) async fn readyz(State(s): State<Arc<AdminState>>) -> Response {
    crate::http::readiness(&s.ready, &s.store)
}

/// Prometheus text by default; OpenMetrics to a scraper that asks for it.
#[utoipa::path(
    get,
    path = "/metrics",
    tag = "admin",
    responses(
        (status = 200, description = "Prometheus text 0.0.4, or OpenMetrics when the Accept header asks for it", content_type = "text/plain", body = String),
    )
)]
pub(crate) async fn metrics(
    State(s): State<Arc<AdminState>>,
    headers: axum::http::HeaderMap,
) -> Response {
    if s.metrics_access.token_required {
        match s.tokens.load().authenticate(&headers) {
            Some(c) if c.metrics_only || c.scope.is_admin() => {}
            Some(_) => {
                return crate::http::error(
                    axum::http::StatusCode::FORBIDDEN,
                    ErrorCode::Forbidden,
                    "/metrics takes an admin or metrics-scope token",
                )
            }
            None => {
                return crate::http::error(
                    axum::http::StatusCode::UNAUTHORIZED,
                    ErrorCode::Unauthorized,
                    "/metrics takes a bearer token (admin.metrics.token_required)",
                )
            }
        }
    }
    let named = |text: String| {
        if s.metrics_access.tenant_labels {
            text
        } else {
            without_tenant_series(&text)
        }
    };
    let wants_om = headers
        .get(axum::http::header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|a| a.contains("application/openmetrics-text"));
    if wants_om {
        (
            [(
                CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            named(s.metrics.encode()),
        )
            .into_response()
    } else {
        (
            [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")],
            named(s.metrics.encode_prometheus()),
        )
            .into_response()
    }
}

/// The exposition without any series labelled with a tenant id (their families' HELP
/// and TYPE lines stay: a family with no series).
fn without_tenant_series(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for line in text.lines() {
        let sample = !line.starts_with('#');
        if sample && (line.contains("{tenant=\"") || line.contains(",tenant=\"")) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

/// Until the node is ready (store migrated, inflight rows recovered, pipeline started),
/// every `/v1/*` call but `/v1/node` answers 503 `not_ready`: a replay, purge or backup
/// during the boot migration would read or write a store that is still changing shape.
async fn require_ready(
    State(s): State<Arc<AdminState>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if s.ready.load(std::sync::atomic::Ordering::Acquire) {
        next.run(req).await
    } else {
        crate::http::error(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NotReady,
            "the node is starting: the store is opening, migrating or recovering",
        )
    }
}

/// The admin router: health, readiness and metrics unauthenticated; `/v1/*` behind tokens,
/// and all of it but `/v1/node` behind readiness. `more` adds the routes of the layers above
/// (the OpenAPI document, which is read from these handlers), under the same checks.
pub fn router(state: Arc<AdminState>, api: Arc<api::Api>, more: Router<Arc<api::Api>>) -> Router {
    let gate = api.clone();
    let node = Router::new()
        .route("/v1/node", get(node::node))
        .with_state(api.clone());
    let v1 = Router::new()
        .route("/v1/config", get(node::config))
        .route("/v1/dlq", get(dlq::dlq))
        .route("/v1/dlq/replay", post(dlq::replay))
        .route("/v1/tenants", get(tenants::tenants_top))
        .route("/v1/tenants/{t}", get(tenants::tenant).delete(erase::erase))
        .route("/v1/tenants/{t}/queue", delete(tenants::purge))
        .route("/v1/tenants/{t}/retry", post(tenants::retry))
        .route("/v1/tenants/{t}/pause", post(tenants::pause))
        .route("/v1/tenants/{t}/resume", post(tenants::resume))
        .route(
            "/v1/tenants/{t}/limits",
            get(limits::get).put(limits::put).delete(limits::delete),
        )
        .route(
            "/v1/quarantine",
            get(quarantine::quarantine_list).delete(quarantine::quarantine_delete),
        )
        .route("/v1/audit", get(audit::audit_list))
        .route("/v1/hooks", get(hooks::recent))
        .route("/v1/hooks/{id}", get(hooks::get))
        .route(
            "/v1/tenants/{t}/deliveries/{delivery_id}",
            get(hooks::by_delivery),
        )
        .route("/v1/portal-links", post(portal::create))
        .route("/v1/sources/{id}", get(sources::get))
        .route("/v1/archive", get(archive::list))
        .route("/v1/archive/replay", post(archive::replay))
        .route("/v1/backups", post(backups::create))
        .route("/v1/backups/stream", post(backups::stream))
        .route("/v1/backups/{id}/archive", get(backups::archive))
        .route("/cluster/v1/slots/lend", post(relay_wide::lend))
        .route("/cluster/v1/slots", get(relay_wide::slots))
        .route("/cluster/v1/stored", get(relay_wide::stored))
        // A batch carries up to 4 MiB of hooks, base64 in JSON.
        .route(
            "/cluster/v1/handoff",
            post(relay_wide::handoff).layer(axum::extract::DefaultBodyLimit::max(32 << 20)),
        )
        .merge(more)
        .route_layer(axum::middleware::from_fn_with_state(
            api.clone(),
            relay_wide::to_owner,
        ))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_ready,
        ))
        .with_state(api);
    Router::new()
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .route("/readyz", get(readyz))
        .with_state(state)
        .merge(node)
        .merge(v1)
        .fallback(crate::http::not_found)
        .layer(axum::middleware::from_fn_with_state(gate, token_first))
        .layer(axum::middleware::map_response(crate::http::json_errors))
        .layer(axum::middleware::from_fn(traced))
}

/// Each admin call in an `admin` span (with `log.spans`): its method, path and status.
async fn traced(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use tracing::Instrument;
    let span = tracing::debug_span!(
        target: crate::telemetry::TARGET,
        "admin",
        method = %req.method(),
        path = req.uri().path(),
        status = tracing::field::Empty,
    );
    let resp = next.run(req).instrument(span.clone()).await;
    span.record("status", resp.status().as_u16());
    resp
}

/// Every `/v1/*` request shows a valid token before anything else looks at it: a caller
/// without one learns neither which paths exist nor what their parameters are (401 before
/// any 404, 405 or parameter error). The handlers then check the token's scope.
async fn token_first(
    State(api): State<Arc<api::Api>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    if req.uri().path().starts_with("/v1/")
        && api.tokens.load().authenticate(req.headers()).is_none()
    {
        return api::ApiError::Unauthorized.into_response();
    }
    next.run(req).await
}
