//! The admin listener (default `:9090`) and the admin API behind it (`/v1/…`,
//! docs/api.md): every operator and tenant call on a node, and the calls between the nodes
//! of a Relay (`/cluster/v1/…`).
//!
//! Where to start: [`router`] lists every route. A file per resource ([`dlq`],
//! [`tenants`], [`limits`], [`quarantine`], [`audit`], [`node`], [`hooks`], [`sources`],
//! [`archive`], [`backups`], [`erase`], [`portal`]); what they share in [`api`] (the `Api`
//! they read, errors, the caller); tokens and portal credentials in [`auth`]; where each
//! route is answered in a Relay of several
//! nodes, declared with the route, in [`routing`]; the fan-outs in [`relay_wide`]; the calls
//! between nodes in [`cluster_api`].
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
pub mod cluster_api;
pub mod dlq;
pub mod endpoints;
pub mod erase;
pub mod hooks;
pub mod limits;
pub mod node;
pub mod portal;
pub mod quarantine;
pub mod relay_wide;

pub mod routing;
pub mod sources;
pub mod tenants;

use ankusa_api::admin::{
    EraseState, LimitsView, PauseState, PurgeReport, Retried, SourceView, TenantView,
};
use axum::handler::Handler;
use axum::routing::MethodFilter;

use ankusa_api::error::ErrorCode;
use ankusa_queue::counters;
use ankusa_queue::engine::{migrate, Store, SUPPORTED_FORMAT};
use ankusa_queue::QueueError;

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
/// and all of it but `/v1/node` behind readiness; each `/v1` and `/cluster/v1` route added
/// with where a Relay of several nodes answers it ([`routing::V1::at`]). `more` adds the
/// routes of the layers above (the OpenAPI document, which is read from these handlers, and
/// is answered by the node it reaches), under the same checks.
pub fn router(state: Arc<AdminState>, api: Arc<api::Api>, more: Router<Arc<api::Api>>) -> Router {
    let gate = api.clone();
    let node = Router::new()
        .route("/v1/node", get(node::node))
        .with_state(api.clone());
    use routing::V1;
    let v1 = v1_routes(V1::new(api.clone()))
        .router()
        .merge(more)
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

/// The `/v1` and `/cluster/v1` routes, each with where a Relay of several nodes answers it
/// (`routing`): here, on the tenant's owner, on every node merged, or by a fan-out of its
/// own.
fn v1_routes(v: routing::V1) -> routing::V1 {
    use routing::{Answered, TenantIn};
    use MethodFilter as M;
    let owner = Answered::Owner;
    let here = Answered::Here;
    let path = TenantIn::Path;
    let archive_tenant: fn(&[u8]) -> Option<String> = |b| {
        serde_json::from_slice::<ankusa_api::admin::ArchiveReplayRequest>(b)
            .ok()
            .map(|r| r.tenant)
    };
    let v = v
        .at(M::GET, "/v1/config", here, node::config)
        .at(
            M::GET,
            "/v1/dlq",
            Answered::FanOut(relay_wide::DLQ),
            dlq::dlq,
        )
        .at(
            M::POST,
            "/v1/dlq/replay",
            Answered::FanOut(relay_wide::DLQ_REPLAY),
            dlq::replay,
        )
        .at(
            M::GET,
            "/v1/tenants",
            Answered::FanOut(relay_wide::TENANTS),
            tenants::tenants_top,
        );
    tenant_routes(v)
        .at(M::GET, "/v1/quarantine", here, quarantine::quarantine_list)
        .at(
            M::DELETE,
            "/v1/quarantine",
            here,
            quarantine::quarantine_delete,
        )
        .at(
            M::POST,
            "/v1/quarantine/replay",
            here,
            quarantine::quarantine_replay,
        )
        .at(M::GET, "/v1/audit", here, audit::audit_list)
        .at(M::GET, "/v1/hooks", owner(TenantIn::Query), hooks::recent)
        .at(
            M::GET,
            "/v1/hooks/{id}",
            Answered::FanOut(relay_wide::HOOK),
            hooks::get,
        )
        // The dedupe entry of a delivery id is on the tenant's owner.
        .at(
            M::GET,
            "/v1/tenants/{t}/deliveries/{delivery_id}",
            owner(path),
            hooks::by_delivery,
        )
        .at(M::POST, "/v1/portal-links", here, portal::create)
        // A source's rows are on the owners of its tenants: every node adds its backlog.
        .at(
            M::GET,
            "/v1/sources/{id}",
            Answered::everywhere::<SourceView>(TenantIn::Source),
            sources::get,
        )
        // A tenant's archive is on its owner (what a former owner archived stays there:
        // ask it with `ankusa-cluster-local: 1`).
        .at(M::GET, "/v1/archive", owner(TenantIn::Query), archive::list)
        .at(
            M::POST,
            "/v1/archive/replay",
            owner(TenantIn::Body(archive_tenant)),
            archive::replay,
        )
        .at(M::POST, "/v1/backups", here, backups::create)
        .at(M::POST, "/v1/backups/stream", here, backups::stream)
        .at(M::GET, "/v1/backups/{id}/archive", here, backups::archive)
        .at(M::POST, "/cluster/v1/slots/lend", here, cluster_api::lend)
        .at(M::GET, "/cluster/v1/slots", here, cluster_api::slots)
        .at(M::GET, "/cluster/v1/stored", here, cluster_api::stored)
        // A batch carries up to 4 MiB of hooks, base64 in JSON.
        .at(
            M::POST,
            "/cluster/v1/handoff",
            here,
            cluster_api::handoff.layer(axum::extract::DefaultBodyLimit::max(32 << 20)),
        )
}

/// The routes of one tenant (`/v1/tenants/{t}/…`): most are answered on every node that
/// holds the tenant's rows, its limits' reads by its owner.
fn tenant_routes(v: routing::V1) -> routing::V1 {
    use routing::{Answered, TenantIn};
    use MethodFilter as M;
    let path = TenantIn::Path;
    v.at(
        M::GET,
        "/v1/tenants/{t}",
        Answered::everywhere::<TenantView>(path),
        tenants::tenant,
    )
    // An erase runs on every node that holds the tenant's rows.
    .at(
        M::DELETE,
        "/v1/tenants/{t}",
        Answered::everywhere::<EraseState>(path),
        erase::erase,
    )
    .at(
        M::DELETE,
        "/v1/tenants/{t}/queue",
        Answered::everywhere::<PurgeReport>(path),
        tenants::purge,
    )
    .at(
        M::POST,
        "/v1/tenants/{t}/retry",
        Answered::everywhere::<Retried>(path),
        tenants::retry,
    )
    // Held on every node that holds the tenant's rows: its owner and former owners.
    .at(
        M::POST,
        "/v1/tenants/{t}/pause",
        Answered::everywhere::<PauseState>(path),
        tenants::pause,
    )
    .at(
        M::POST,
        "/v1/tenants/{t}/resume",
        Answered::everywhere::<PauseState>(path),
        tenants::resume,
    )
    // A tenant's limits are the same on every node; its owner enforces them and
    // answers with its refusals.
    .at(
        M::GET,
        "/v1/tenants/{t}/limits",
        Answered::Owner(path),
        limits::get,
    )
    .at(
        M::PUT,
        "/v1/tenants/{t}/limits",
        Answered::everywhere::<LimitsView>(path),
        limits::put,
    )
    .at(
        M::DELETE,
        "/v1/tenants/{t}/limits",
        Answered::everywhere::<LimitsView>(path),
        limits::delete,
    )
    // A tenant's endpoints are kept by its owner.
    .at(
        M::GET,
        "/v1/tenants/{t}/endpoints",
        Answered::Owner(path),
        endpoints::list,
    )
    .at(
        M::POST,
        "/v1/tenants/{t}/endpoints",
        Answered::Owner(path),
        endpoints::create,
    )
    .at(
        M::GET,
        "/v1/tenants/{t}/endpoints/{id}",
        Answered::Owner(path),
        endpoints::get,
    )
    .at(
        M::PATCH,
        "/v1/tenants/{t}/endpoints/{id}",
        Answered::Owner(path),
        endpoints::update,
    )
    .at(
        M::DELETE,
        "/v1/tenants/{t}/endpoints/{id}",
        Answered::Owner(path),
        endpoints::delete,
    )
    .at(
        M::POST,
        "/v1/tenants/{t}/endpoints/{id}/rotate",
        Answered::Owner(path),
        endpoints::rotate,
    )
}

/// Each admin call in an `admin` span (with `log.spans`): its method, path and status.
async fn traced(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    use tracing::Instrument;
    let span = tracing::debug_span!(
        target: crate::telemetry::TARGET,
        "admin",
        method = %req.method(),
        path = req.uri().path(),
        tenant = tracing::field::Empty,
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
