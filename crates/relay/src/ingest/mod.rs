//! Ingest: `POST /ingest/{source}` on the ingest listener.
//!
//! # What a request goes through
//! 1. The source is looked up (unknown → 404 `rejected`).
//! 2. The body is read up to the source's limit (over it → 413 `rejected`).
//! 3. The signature is verified in constant time (failure → 401 `quarantined`: the request
//!    is kept in the bounded quarantine family for inspection; no tenant ordinal is made).
//! 4. The tenant is taken from the source (fixed, a header, a JSON pointer, or the URL's
//!    `/ingest/{source}/{tenant}`; missing →
//!    400 `rejected`), the headers the source forwards are kept (over 1 KiB for one value
//!    or 4 KiB in all → 431 `rejected`), and the idempotency key comes from the configured
//!    headers or the scheme's default.
//! 5. The hook is handed to the writer without blocking (queue full → 503 `unavailable`)
//!    and the handler awaits its answer: `accepted` (202 `{"id"}`, only after the synced
//!    commit that holds it), `duplicate` (200 with the first hook's id, nothing written),
//!    `tenant_limit` (503 `{"error":"tenant_limit"}`, `Retry-After: 300`).
//!
//! The request path takes no lock and does no read-modify-write: it hands its hook to the
//! writer task and awaits the commit. Every request is counted in
//! `ankusa_ingest_requests_total{source,outcome}` with its latency.

mod filter;
pub mod quarantine;
pub mod quota;
pub mod replay;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tracing::Instrument;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderName, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use http_body_util::{BodyExt, LengthLimitError, Limited};

use crate::cluster::{self, Cluster};
use crate::metrics::{Metrics, UNKNOWN_SOURCE};
use ankusa_api::error::ErrorCode;
use ankusa_api::ingest::IngestAnswer;
use ankusa_config::{Config, ConfigError, IdempotencyConfig, TenantFrom, VerifyConfig};
use ankusa_keyspace::AtMs;
use ankusa_queue::registry::Admission;
use ankusa_queue::tenants;
use ankusa_queue::writer::{Reply, Submission, WriterHandle};
use ankusa_records::Envelope;
use ankusa_verify::Keys;

/// A source, ready to serve.
#[derive(Debug, Clone)]
pub struct Source {
    pub id: String,
    pub tenant: Option<TenantFrom>,
    /// The source's verifier, or one per tenant.
    pub keys: Keys,
    pub idempotency: IdempotencyConfig,
    /// The route's sinks, each with its filter (`routes[].filters`) if it has one.
    pub sinks: Vec<(String, Option<ankusa_config::Filter>)>,
    /// Where a hook's event type is, for the filters.
    pub event_type: Option<ankusa_config::EventTypeFrom>,
    pub body_limit: usize,
    /// Request headers kept with the hook and sent to its sinks (lower case).
    pub forward: Vec<HeaderName>,
    /// Its route delivers to the tenant's own endpoints too (`routes[].endpoints`).
    pub endpoints: bool,
}

use ankusa_verify::request::{forwarded, idempotency_of, tenant_of, JsonBody};

impl Source {
    /// What the quarantine keeps of a request's headers: its content type and user agent,
    /// the headers its verifier reads, the one naming its tenant, and those the source
    /// forwards (its provider's event headers) — never credentials, cookies or anything
    /// else a client sent.
    pub fn kept(&self, headers: &HeaderMap) -> HeaderMap {
        let tenant = match &self.tenant {
            Some(TenantFrom::Header(h)) => Some(h.to_ascii_lowercase()),
            _ => None,
        };
        headers
            .iter()
            .filter(|(k, _)| {
                let k = k.as_str();
                matches!(k, "content-type" | "content-length" | "user-agent")
                    || self.keys.header_names().contains(&k)
                    || tenant.as_deref() == Some(k)
                    || self.forward.iter().any(|f| f.as_str() == k)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }
}

/// Builds the sources of a validated configuration (resolving their secrets).
pub fn sources(config: &Config) -> Result<HashMap<String, Source>, ConfigError> {
    let mut out = HashMap::new();
    // The key of a tenant without a secret: nobody holds it.
    let unheld: [u8; 32] = rand::random();
    for (i, s) in config.sources.iter().enumerate() {
        let secret = s
            .verify
            .secret()
            .map(|x| x.resolve(&format!("sources[{i}].verify.secret")))
            .transpose()?;
        let tenant_secrets = s
            .tenant_secrets
            .as_ref()
            .map(|t| t.resolve(&format!("sources[{i}].tenant_secrets")))
            .transpose()?;
        let keys = Keys::new(&s.verify, secret.as_deref(), tenant_secrets, &unheld);
        let default_idem = match &s.verify {
            VerifyConfig::None => IdempotencyConfig::default(),
            // No id of the provider's: the signature is the key, so a captured request
            // sent again within the dedupe window is a duplicate (a stamped one is
            // refused past its tolerance besides).
            VerifyConfig::HmacSha256 { header, .. } => IdempotencyConfig {
                headers: vec![header.to_ascii_lowercase()],
                json_pointer: None,
            },
            VerifyConfig::StandardWebhooks { .. } => IdempotencyConfig {
                headers: vec!["webhook-id".into()],
                json_pointer: None,
            },
            VerifyConfig::Github { .. } => IdempotencyConfig {
                headers: vec!["x-github-delivery".into()],
                json_pointer: None,
            },
            VerifyConfig::Stripe { .. } => IdempotencyConfig {
                headers: Vec::new(),
                json_pointer: Some("/id".into()),
            },
        };
        let route = config.routes.iter().find(|r| r.id == s.route);
        let sinks = route
            .map(|r| {
                r.sinks
                    .iter()
                    .map(|k| (k.clone(), r.filters.get(k).cloned()))
                    .collect()
            })
            .unwrap_or_default();
        out.insert(
            s.id.clone(),
            Source {
                id: s.id.clone(),
                tenant: s.tenant.clone(),
                keys,
                idempotency: s.idempotency.clone().unwrap_or(default_idem),
                sinks,
                event_type: s.event_type(),
                body_limit: s.body_limit_bytes.unwrap_or(config.ingest.body_limit_bytes),
                forward: s
                    .forwarded()
                    .iter()
                    .map(|n| {
                        HeaderName::from_bytes(n.as_bytes()).map_err(|e| ConfigError::Invalid {
                            key: format!("sources[{i}].forward_headers"),
                            message: format!("{n:?}: {e}"),
                        })
                    })
                    .collect::<Result<_, _>>()?,
                endpoints: route.is_some_and(|r| r.endpoints),
            },
        );
    }
    Ok(out)
}

/// Shared state of the ingest handlers.
#[derive(Debug)]
pub struct IngestState {
    /// The configured sources; a configuration reload swaps them whole (a request keeps
    /// the set it started with).
    pub sources: Arc<arc_swap::ArcSwap<HashMap<String, Source>>>,
    /// For readiness: the store's write health.
    pub store: Arc<ankusa_queue::engine::Store>,
    pub writer: WriterHandle,
    pub quarantine: Arc<quarantine::Quarantine>,
    pub metrics: Arc<Metrics>,
    pub ready: Arc<AtomicBool>,
    /// The Relay's nodes: who owns which tenant.
    pub cluster: Arc<Cluster>,
    /// Tenant quotas, enforced here on the tenant's owner.
    pub quotas: Arc<quota::Quotas>,
    /// Tenants' own endpoints, for the routes that deliver to them.
    endpoints: Option<Arc<crate::endpoints::Book>>,
    next_id: AtomicU64,
    id_prefix: String,
    /// Lines about requests that failed verification: a sender can cause them at any rate.
    verify_log: Arc<crate::telemetry::LogLimit>,
}

impl IngestState {
    pub fn new(
        sources: HashMap<String, Source>,
        store: Arc<ankusa_queue::engine::Store>,
        writer: WriterHandle,
        quarantine: Arc<quarantine::Quarantine>,
        metrics: Arc<Metrics>,
        ready: Arc<AtomicBool>,
        cluster: Arc<Cluster>,
        quotas: Arc<quota::Quotas>,
    ) -> Self {
        IngestState {
            quotas,
            sources: Arc::new(arc_swap::ArcSwap::from_pointee(sources)),
            store,
            writer,
            quarantine,
            metrics,
            ready,
            cluster,
            endpoints: None,
            next_id: AtomicU64::new(0),
            verify_log: Arc::new(crate::telemetry::LogLimit::new(VERIFY_LOG_PER_SECOND)),
            // Ids are unique across restarts: boot time and a random part, then a counter.
            id_prefix: format!(
                "hk_{:x}{:06x}",
                ankusa_keyspace::now_ms(),
                rand::random::<u32>() & 0xFF_FFFF
            ),
        }
    }

    /// Delivers to the endpoints `book` holds on the routes that say so.
    pub fn with_endpoints(mut self, book: Arc<crate::endpoints::Book>) -> Self {
        self.endpoints = Some(book);
        self
    }

    fn new_id(&self) -> String {
        format!(
            "{}_{:x}",
            self.id_prefix,
            self.next_id.fetch_add(1, Ordering::Relaxed)
        )
    }
}

/// The tenant a source pins (`tenant: {fixed: …}`, or none: `default`), if it pins one
/// (a source whose tenant comes from the request pins none).
pub fn source_tenant(config: &Config, source: &str) -> Option<String> {
    config
        .sources
        .iter()
        .find(|s| s.id == source)
        .and_then(|s| match &s.tenant {
            Some(ankusa_config::TenantFrom::Fixed(t)) => Some(t.clone()),
            None => Some(ankusa_records::DEFAULT_TENANT.to_owned()),
            _ => None,
        })
}

/// The ingest router.
pub fn router(state: Arc<IngestState>) -> Router {
    Router::new()
        .route("/ingest/{source}", post(ingest))
        .route("/ingest/{source}/{tenant}", post(ingest_for_tenant))
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .fallback(crate::http::not_found)
        .with_state(state)
        .layer(axum::middleware::map_response(crate::http::json_errors))
}

async fn readyz(State(s): State<Arc<IngestState>>) -> Response {
    crate::http::readiness(&s.ready, &s.store)
}

use crate::http::error;
use crate::http::with_retry_after;

/// 503 `tenant_limit`, `Retry-After: 300`.
/// How an ingest request ended: the `outcome` label of `ankusa_ingest_requests_total`
/// (`docs/observability.md` lists every one; a test keeps the two equal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// 202: committed by a synced write.
    Accepted,
    /// 200: an idempotency key seen within the window; nothing new stored.
    Duplicate,
    /// Sent to the node that owns the tenant, which counts the hook's own outcome.
    Forwarded,
    /// 4xx: a bad request (unknown source, body, tenant, headers, a forged forward).
    Rejected,
    /// 401: failed verification; kept in the quarantine.
    Quarantined,
    /// 503: `tenants.max` reached.
    TenantLimit,
    /// 503: the node is starting, at capacity, or its store does not take writes.
    Unavailable,
    /// 503: the tenant's owner did not answer.
    OwnerUnavailable,
    /// 429: the tenant sends faster than its `ingest_per_second`.
    TenantRateLimited,
    /// 503: the tenant's queued bytes are at its `queued_bytes`.
    TenantBacklogFull,
    /// 410: the tenant is being erased.
    TenantErasing,
}

impl Outcome {
    pub const ALL: [Outcome; 11] = [
        Outcome::Accepted,
        Outcome::Duplicate,
        Outcome::Forwarded,
        Outcome::Rejected,
        Outcome::Quarantined,
        Outcome::TenantLimit,
        Outcome::Unavailable,
        Outcome::OwnerUnavailable,
        Outcome::TenantRateLimited,
        Outcome::TenantBacklogFull,
        Outcome::TenantErasing,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Accepted => "accepted",
            Outcome::Duplicate => "duplicate",
            Outcome::Forwarded => "forwarded",
            Outcome::Rejected => "rejected",
            Outcome::Quarantined => "quarantined",
            Outcome::TenantLimit => "tenant_limit",
            Outcome::Unavailable => "unavailable",
            Outcome::OwnerUnavailable => "owner_unavailable",
            Outcome::TenantRateLimited => "tenant_rate_limited",
            Outcome::TenantBacklogFull => "tenant_backlog_full",
            Outcome::TenantErasing => "tenant_erasing",
        }
    }
}

fn tenant_limit(message: &str) -> (Outcome, Response) {
    let r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::TenantLimit,
        message,
    );
    (Outcome::TenantLimit, with_retry_after(r, 300))
}

/// Lines a second about requests that failed verification.
const VERIFY_LOG_PER_SECOND: u32 = 5;

#[utoipa::path(
    post,
    path = "/ingest/{source}",
    tag = "ingest",
    params(("source" = String, Path, description = "A source id")),
    request_body(content = Vec<u8>, description = "The provider's body, as sent", content_type = "*/*"),
    responses(
        (status = 202, description = "Committed by a synced write", body = IngestAnswer),
        (status = 200, description = "Seen within the dedupe window: the first hook's id, duplicate true", body = IngestAnswer),
        crate::http::IngestErrors,
    )
)]
pub(crate) async fn ingest(
    State(s): State<Arc<IngestState>>,
    Path(source): Path<String>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    served(&s, &source, None, &uri, headers, body).await
}

/// `POST /ingest/{source}/{tenant}`: a source whose tenant is in its URL (`tenant: path`).
#[utoipa::path(
    post,
    path = "/ingest/{source}/{tenant}",
    tag = "ingest",
    params(("source" = String, Path, description = "A source id"), ("tenant" = String, Path, description = "The tenant (sources with tenant: path)")),
    request_body(content = Vec<u8>, description = "The provider's body, as sent", content_type = "*/*"),
    responses(
        (status = 202, description = "Committed by a synced write", body = IngestAnswer),
        (status = 200, description = "Seen within the dedupe window: the first hook's id, duplicate true", body = IngestAnswer),
        crate::http::IngestErrors,
    )
)]
pub(crate) async fn ingest_for_tenant(
    State(s): State<Arc<IngestState>>,
    Path((source, tenant)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    served(&s, &source, Some(&tenant), &uri, headers, body).await
}

/// One ingest request, counted and timed.
async fn served(
    s: &IngestState,
    source: &str,
    tenant: Option<&str>,
    uri: &Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    let started = Instant::now();
    // Built only with `log.spans` (or another subscriber that asks for `ankusa::trace`).
    let span = tracing::debug_span!(
        target: crate::telemetry::TARGET,
        "ingest",
        source,
        tenant = tracing::field::Empty,
        hook_id = tracing::field::Empty,
        batch = tracing::field::Empty,
        outcome = tracing::field::Empty,
        status = tracing::field::Empty,
    );
    let sources = s.sources.load_full();
    let (label, outcome, resp) = handle(s, &sources, source, tenant, uri, headers, body, None)
        .instrument(span.clone())
        .await;
    span.record("outcome", outcome.label());
    span.record("status", resp.status().as_u16());
    s.metrics.ingest(label, outcome.label());
    s.metrics
        .ingest_latency
        .observe(started.elapsed().as_secs_f64());
    resp
}

/// One request, from its source's lookup to the writer's answer. `replayed_from` is set
/// for a quarantined request sent again ([`replay`]): it is verified at the time it was
/// received, and a failure is only answered — not logged, counted or kept again.
#[allow(clippy::too_many_arguments)]
async fn handle<'a>(
    s: &IngestState,
    sources: &'a HashMap<String, Source>,
    source: &str,
    in_path: Option<&str>,
    uri: &Uri,
    headers: HeaderMap,
    body: Body,
    replayed_from: Option<u64>,
) -> (&'a str, Outcome, Response) {
    let Some(src) = sources.get(source) else {
        return (
            UNKNOWN_SOURCE,
            Outcome::Rejected,
            error(
                StatusCode::NOT_FOUND,
                ErrorCode::UnknownSource,
                "no such source",
            ),
        );
    };
    let label = src.id.as_str();
    let rejected =
        |status, code: ErrorCode, msg: &str| (label, Outcome::Rejected, error(status, code, msg));
    if !s.ready.load(Ordering::Acquire) {
        let r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NotReady,
            "the node is starting",
        );
        return (label, Outcome::Unavailable, with_retry_after(r, 5));
    }
    // A hook another node of the Relay forwarded is taken here, whatever this node's view
    // of the node list: it never goes round twice. Only a node may say so. A leaving node
    // (a node on the old list during a roll still sends it its former tenants' hooks) sends
    // them on to their owner under its new list instead, which takes them: it stores no
    // new hook, so its drain cannot end over one that came after its last pass.
    let forwarded_in = headers.contains_key(cluster::FORWARDED_BY);
    if forwarded_in && !s.cluster.authentic(&headers) {
        return rejected(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "a forwarded hook must carry the cluster token",
        );
    }
    let bytes = match read_body(body, src.body_limit).await {
        Ok(b) => b,
        Err((status, code, msg)) => return rejected(status, code, msg),
    };
    let now_ms = ankusa_keyspace::now_ms();
    let mut json = JsonBody::new(&bytes);
    // With a secret per tenant the tenant is read first: it picks the key. Otherwise a
    // request is verified before anything of it is read.
    let mut named = None;
    if src.keys.per_tenant() {
        match tenant_of(src.tenant.as_ref(), in_path, &headers, &mut json) {
            Ok(t) => named = Some(t),
            Err(msg) => return rejected(StatusCode::BAD_REQUEST, ErrorCode::BadTenant, msg),
        }
    }
    let claimed = named.as_ref().and_then(|t| t.as_deref());
    let verify_at_ms = replayed_from.unwrap_or(now_ms);
    if let Err(why) = src
        .keys
        .verify(claimed, &headers, &bytes, verify_at_ms / 1000)
    {
        if replayed_from.is_some() {
            return (label, Outcome::Quarantined, still_failing(&why));
        }
        // The tenant the request names, if it names a valid one (read only for a line of
        // the log): unverified, so only a hint for whoever reads it.
        let named = || match named {
            Some(t) => t,
            None => tenant_of(src.tenant.as_ref(), in_path, &headers, &mut json)
                .ok()
                .flatten(),
        };
        let r = failed_verification(s, src, &why, named, forwarded_in, &headers, &bytes, now_ms);
        return (label, Outcome::Quarantined, r);
    }
    let tenant = match named {
        Some(t) => t,
        None => match tenant_of(src.tenant.as_ref(), in_path, &headers, &mut json) {
            Ok(t) => t,
            Err(msg) => return rejected(StatusCode::BAD_REQUEST, ErrorCode::BadTenant, msg),
        },
    };
    let forwarded = match forwarded(&src.forward, &headers) {
        Ok(f) => f,
        Err(msg) => {
            return rejected(
                StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
                ErrorCode::HeadersTooLarge,
                msg,
            )
        }
    };
    let owned_as = tenant.as_deref().unwrap_or(ankusa_records::DEFAULT_TENANT);
    tracing::Span::current().record("tenant", owned_as);
    if !forwarded_in || s.cluster.leaving() {
        if let Some(owner) = s.cluster.other_owner(owned_as) {
            let (outcome, r) = forward_to(s, owner, uri, &headers, &bytes).await;
            return (label, outcome, r);
        }
    }
    if let Some((outcome, r)) = owner_refusal(s, owned_as, now_ms).await {
        return (label, outcome, r);
    }
    let idempotency = idempotency_of(&src.idempotency, &headers, &mut json);
    let sinks = match sinks_taken(s, src, owned_as, &headers, &mut json) {
        Ok(sinks) => sinks,
        Err(r) => return (label, Outcome::Unavailable, *r),
    };
    let filtered = sinks.is_empty();
    let envelope = Envelope {
        id: s.new_id(),
        tenant,
        source: src.id.clone(),
        received_at: AtMs(now_ms),
        content_type: content_type(&headers),
        sinks,
        body: bytes.to_vec(),
        headers: forwarded,
    };
    let span = tracing::Span::current();
    span.record("hook_id", envelope.id.as_str());
    crate::telemetry::in_hook_trace(&span, &envelope.id);
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sub = Submission {
        envelope,
        idempotency,
        from_archive: false,
        reply: tx,
        span,
    };
    let unavailable = |msg: &str| {
        let r = error(StatusCode::SERVICE_UNAVAILABLE, ErrorCode::Unavailable, msg);
        (label, Outcome::Unavailable, with_retry_after(r, 1))
    };
    if s.writer.try_submit(sub).is_err() {
        return unavailable("the node is at capacity");
    }
    match rx.await {
        Ok(reply) => {
            let (outcome, r) = answer(reply, filtered);
            (label, outcome, r)
        }
        Err(_) => unavailable("the store could not commit the hook"),
    }
}

/// The route's filters, once, before the commit: the sinks of `src`'s route that take the
/// hook, then tenant `tenant`'s own endpoints
/// that do when the route delivers to them ([`filter::taken`]); a 503 when those cannot be
/// read.
fn sinks_taken(
    s: &IngestState,
    src: &Source,
    tenant: &str,
    headers: &HeaderMap,
    json: &mut JsonBody<'_>,
) -> Result<Vec<String>, Box<Response>> {
    let endpoints = match s.endpoints.as_ref().filter(|_| src.endpoints) {
        None => None,
        Some(book) => Some(book.of(tenant).map_err(|e| {
            tracing::error!(error = %e, "ingest: reading the tenant's endpoints failed");
            let r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                "the store could not read the tenant's endpoints",
            );
            Box::new(with_retry_after(r, 1))
        })?),
    };
    Ok(filter::taken(
        src,
        endpoints.as_deref(),
        headers,
        json,
        &s.metrics,
    ))
}

/// A hook of a tenant another node owns, sent on to it: its answer, or `unavailable` when
/// it does not answer.
async fn forward_to(
    s: &IngestState,
    owner: &cluster::Member,
    uri: &Uri,
    headers: &HeaderMap,
    bytes: &bytes::Bytes,
) -> (Outcome, Response) {
    let pq = uri.path_and_query().map_or(uri.path(), |p| p.as_str());
    match s
        .cluster
        .forward_ingest(owner, pq, headers, bytes.clone())
        .await
    {
        Ok(r) => (Outcome::Forwarded, r),
        Err(e) => {
            let r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::OwnerUnavailable,
                format!("the node that owns this tenant did not answer ({e})"),
            );
            (Outcome::OwnerUnavailable, with_retry_after(r, 5))
        }
    }
}

/// What the owner refuses a hook of `tenant` for: its admission, then its quotas (after
/// admission: a refused tenant has no ordinal to read); nothing when it takes it.
async fn owner_refusal(s: &IngestState, tenant: &str, now_ms: u64) -> Option<(Outcome, Response)> {
    match admission_refusal(s, tenant).await {
        Some(refused) => Some(refused),
        None => quota_refusal(s.quotas.admit(&s.store, tenant, now_ms)),
    }
}

/// Whether the Relay's tenant registry admits `tenant` on this node (its owner): nothing
/// when it does, or the refusal (`tenants.max`, or a registry that does not answer).
async fn admission_refusal(s: &IngestState, tenant: &str) -> Option<(Outcome, Response)> {
    let store = &s.store;
    match s
        .cluster
        .admit(tenant, || Ok(tenants::ord(store, tenant)?.is_some()))
        .await
    {
        Ok(Admission::Admitted) => None,
        Ok(Admission::Limit) => Some(tenant_limit("this Relay holds tenants.max tenants")),
        Err(e) => {
            let r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::RegistryUnavailable,
                format!("the Relay's tenant registry did not answer ({e})"),
            );
            Some((Outcome::Unavailable, with_retry_after(r, 5)))
        }
    }
}

/// The body, up to the source's limit; what to answer when it is larger or unreadable.
async fn read_body(
    body: Body,
    limit: usize,
) -> Result<bytes::Bytes, (StatusCode, ErrorCode, &'static str)> {
    match Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err((
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::BodyTooLarge,
            "the body is larger than the source's limit",
        )),
        Err(_) => Err((
            StatusCode::BAD_REQUEST,
            ErrorCode::BadBody,
            "the body could not be read",
        )),
    }
}

/// A replayed request that fails verification again: answered only (it is in the
/// quarantine already, and was counted and logged when it came).
fn still_failing(why: &ankusa_verify::VerifyError) -> Response {
    crate::http::error_why(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        format!("the request still fails verification: {why}"),
        why.reason(),
    )
}

/// The request's content type, or `application/octet-stream`.
fn content_type(headers: &HeaderMap) -> String {
    headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("application/octet-stream")
        .to_owned()
}

/// A request that failed verification: counted, logged (at most so many a second), kept in
/// the quarantine unless another node forwarded it, and answered 401 with its reason code.
#[allow(clippy::too_many_arguments)]
fn failed_verification(
    s: &IngestState,
    src: &Source,
    why: &ankusa_verify::VerifyError,
    named: impl FnOnce() -> Option<String>,
    forwarded_in: bool,
    headers: &HeaderMap,
    bytes: &[u8],
    now_ms: u64,
) -> Response {
    let reason = why.reason();
    s.metrics.verification_failed(&src.id, reason);
    // The tenant the request names (unverified), read only for a line of the log or an
    // entry the quarantine has room for: a sender failing at any rate, with a body that
    // names its tenant, costs no parse once both are spent.
    let logged = s.verify_log.admit_or_defer(now_ms / 1000);
    let kept = !forwarded_in && s.quarantine.has_room();
    let named = if logged.is_ok() || kept {
        named()
    } else {
        None
    };
    match logged {
        Ok(left_out) => {
            tracing::warn!(
                source = %src.id,
                tenant = named.as_deref().unwrap_or("-"),
                reason,
                detail = %why,
                left_out,
                "a request failed verification (401); kept in the quarantine"
            );
        }
        // The first left out of a burst: its count is said when this second ends, not with
        // the next failure, which may come much later.
        Err(true) => {
            let log = s.verify_log.clone();
            let wait = 1_000 - now_ms % 1_000 + 10;
            tokio::spawn(async move {
                tokio::time::sleep(std::time::Duration::from_millis(wait)).await;
                let left_out = log.take_left_out();
                if left_out > 0 {
                    tracing::warn!(
                        left_out,
                        "more requests failed verification (401) than are logged one by one; \
                         ankusa_ingest_verification_failures_total counts each"
                    );
                }
            });
        }
        Err(false) => {}
    }
    // A forwarded hook was verified by the node that forwarded it: failing here means the
    // two nodes hold different secrets (a rotation half read), not a bad request. It is
    // kept once, there, never again here.
    if !forwarded_in {
        s.quarantine
            .keep(src.id.clone(), why, named, &src.kept(headers), bytes);
    }
    crate::http::error_why(
        StatusCode::UNAUTHORIZED,
        ErrorCode::Unauthorized,
        format!("the request failed verification: {why}"),
        reason,
    )
}

/// What a tenant's quotas answer: nothing when it may send, or its refusal.
fn quota_refusal(
    admitted: Result<Option<quota::Refusal>, ankusa_queue::QueueError>,
) -> Option<(Outcome, Response)> {
    match admitted {
        Ok(None) => None,
        Ok(Some(quota::Refusal::Rate { retry_after_s })) => {
            let r = error(
                StatusCode::TOO_MANY_REQUESTS,
                ErrorCode::TenantRateLimited,
                "this tenant sends faster than its ingest_per_second",
            );
            Some((
                Outcome::TenantRateLimited,
                with_retry_after(r, retry_after_s),
            ))
        }
        Ok(Some(quota::Refusal::Backlog { queued, limit })) => {
            let r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::TenantBacklogFull,
                format!("this tenant's queued deliveries hold {queued} bytes, its queued_bytes is {limit}"),
            );
            Some((Outcome::TenantBacklogFull, with_retry_after(r, 30)))
        }
        Err(e) => {
            tracing::error!(error = %e, "reading a tenant's queued bytes");
            let r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                "the store could not be read",
            );
            Some((Outcome::Unavailable, with_retry_after(r, 1)))
        }
    }
}

/// The writer's reply, as the provider is answered.
fn answer(reply: Reply, filtered: bool) -> (Outcome, Response) {
    match reply {
        Reply::Accepted { id } => (
            Outcome::Accepted,
            (
                StatusCode::ACCEPTED,
                Json(IngestAnswer {
                    id,
                    duplicate: None,
                    filtered: filtered.then_some(true),
                }),
            )
                .into_response(),
        ),
        Reply::Duplicate { id } => (
            Outcome::Duplicate,
            (
                StatusCode::OK,
                Json(IngestAnswer {
                    id,
                    duplicate: Some(true),
                    filtered: None,
                }),
            )
                .into_response(),
        ),
        Reply::TenantLimit => tenant_limit("this node holds tenants.max tenants"),
        Reply::InvalidTenant(why) => (
            Outcome::Rejected,
            error(StatusCode::BAD_REQUEST, ErrorCode::BadTenant, why),
        ),
        Reply::TenantErasing => (
            Outcome::TenantErasing,
            error(
                StatusCode::GONE,
                ErrorCode::TenantErasing,
                "this tenant is being erased: its hooks are refused until the erase ends",
            ),
        ),
        Reply::Unavailable => {
            let r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::Unavailable,
                "the store could not commit the hook",
            );
            (Outcome::Unavailable, with_retry_after(r, 1))
        }
    }
}
