//! The admin API (`/v1/...`): DLQ and replay, tenants and purge, quarantine, audit,
//! configuration and node status. Every handler authenticates first; a tenant-scoped token
//! sees only its tenants, and everything else answers as if it did not exist.
//!
//! Listings are newest first with an opaque cursor (`next`), pages capped by
//! `admin.max_page`. Every mutating call writes an audit row, in the same batch as its
//! first effect.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::{Deserialize, Serialize};

use super::auth::{Caller, Scope, Tokens};
use crate::config::{Config, TenantFrom};
use crate::ingest::quarantine::Quarantine;
use crate::queue::audit::{self, Audit};
use crate::queue::deliveries::{self, DeadPage, DeadRow, PurgeKinds};
use crate::queue::{counters, tenants, Counts, QueueError};
use crate::store::keys::{AtMs, DeadKey, Seq, SinkIdx, TenantOrd};
use crate::store::{Store, StoreError};

/// What the API handlers share.
#[derive(Debug)]
pub struct Api {
    pub store: Arc<Store>,
    pub tokens: Tokens,
    pub audit: Audit,
    pub config: Arc<Config>,
    pub quarantine: Option<Arc<Quarantine>>,
    /// The boot migration's progress.
    pub progress: Arc<super::Progress>,
    /// Where revived rows are announced to the dispatch pipeline.
    pub hints: Arc<crate::queue::hints::DueHints>,
    /// The Relay's nodes: who owns which tenant.
    pub cluster: Arc<crate::cluster::Cluster>,
    /// The ingest writer, once it runs (after the boot migration): archive replays commit
    /// through it.
    pub writer: std::sync::OnceLock<crate::queue::writer::WriterHandle>,
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
        code: &'static str,
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
                "unauthorized",
                "a valid bearer token is required".to_owned(),
            ),
            ApiError::Forbidden => (
                StatusCode::FORBIDDEN,
                "forbidden",
                "this endpoint needs an admin token".to_owned(),
            ),
            ApiError::NotFound(what) => (
                StatusCode::NOT_FOUND,
                "not_found",
                format!("no such {what}"),
            ),
            ApiError::BadRequest(m) => (StatusCode::BAD_REQUEST, "bad_request", m),
            ApiError::Failed { code, message } => {
                (StatusCode::INTERNAL_SERVER_ERROR, code, message)
            }
            ApiError::Internal => (
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                "internal error".to_owned(),
            ),
        };
        crate::http::error(status, code, msg)
    }
}

pub(crate) type ApiResult = Result<Response, ApiError>;

/// The authenticated caller, or 401.
pub(crate) fn caller(api: &Api, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let c = api
        .tokens
        .authenticate(headers)
        .ok_or(ApiError::Unauthorized)?;
    if c.backup_only {
        return Err(ApiError::Forbidden);
    }
    Ok(c)
}

/// The caller of a backup endpoint: an admin or a backup-scope token.
pub(crate) fn backup_caller(api: &Api, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let c = api
        .tokens
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

/// A DLQ row id: `at.seq.sink`.
fn row_id(k: &DeadKey) -> String {
    format!("{}.{}.{}", k.at.0, k.seq.0, k.sink.0)
}

fn parse_row_id(s: &str) -> Option<DeadKey> {
    let mut it = s.split('.');
    let k = DeadKey {
        at: AtMs(it.next()?.parse().ok()?),
        seq: Seq(it.next()?.parse().ok()?),
        sink: SinkIdx(it.next()?.parse().ok()?),
    };
    it.next().is_none().then_some(k)
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct DlqItem {
    id: String,
    tenant: String,
    at_ms: u64,
    hook_id: String,
    source: String,
    /// The sink's id.
    sink: String,
    /// Its position in the hook's fan-out list.
    sink_index: u16,
    size: u32,
    attempts: u32,
    last_attempt_ms: u64,
    /// HTTP status of the last attempt (0: no response).
    last_status: u16,
    last_error: String,
}

fn names(store: &Store, rows: &[DeadRow]) -> Result<BTreeMap<TenantOrd, String>, QueueError> {
    let mut out = BTreeMap::new();
    for r in rows {
        if let std::collections::btree_map::Entry::Vacant(e) = out.entry(r.value.ord) {
            e.insert(tenants::name(store, r.value.ord)?.unwrap_or_default());
        }
    }
    Ok(out)
}

/// The page's rows as the DLQ lists them: tenant names, the sink's id (from the row, or for
/// a row dead-lettered before the row carried it, from its hook), and the last attempt
/// from the delivery rows (one `multi_get`).
fn items(store: &Store, rows: &[DeadRow]) -> Result<Vec<DlqItem>, QueueError> {
    let names = names(store, rows)?;
    let pairs: Vec<_> = rows.iter().map(|r| (r.key.seq, r.key.sink)).collect();
    let states = deliveries::delivery_rows(store, &pairs)?;
    let mut out = Vec::with_capacity(rows.len());
    for (r, state) in rows.iter().zip(states) {
        let sink = if r.value.sink.is_empty() {
            deliveries::envelope(store, r.key.seq)?
                .and_then(|e| e.sinks.get(r.key.sink.0 as usize).cloned())
                .unwrap_or_default()
        } else {
            r.value.sink.clone()
        };
        let state = state.unwrap_or_default();
        out.push(DlqItem {
            id: row_id(&r.key),
            tenant: names.get(&r.value.ord).cloned().unwrap_or_default(),
            at_ms: r.key.at.0,
            hook_id: r.value.hook_id.clone(),
            source: r.value.source.clone(),
            sink,
            sink_index: r.key.sink.0,
            size: r.value.size,
            attempts: state.attempts,
            last_attempt_ms: state.last_attempt_at,
            last_status: state.last_status,
            last_error: state.last_error,
        });
    }
    Ok(out)
}

/// Dead rows visible to `scope` (optionally one tenant's), newest first, before `before`.
/// A tenant scope merges its tenants' `?X` ranges; no hook is read.
fn dead_rows(
    store: &Store,
    scope: &Scope,
    tenant: Option<&str>,
    before: Option<DeadKey>,
    limit: usize,
) -> Result<DeadPage, ApiError> {
    if let Some(t) = tenant {
        let ord = visible_ord(store, scope, t)?;
        return Ok(deliveries::dead_page_for_tenant(store, ord, before, limit)?);
    }
    match scope {
        Scope::Admin => Ok(deliveries::dead_page(store, before, limit)?),
        Scope::Tenants(ts) => {
            let mut rows = Vec::new();
            for t in ts {
                if let Some(ord) = tenants::ord(store, t)? {
                    rows.extend(deliveries::dead_page_for_tenant(store, ord, before, limit)?.rows);
                }
            }
            rows.sort_by_key(|r| std::cmp::Reverse(r.key));
            rows.truncate(limit);
            let next = (rows.len() == limit)
                .then(|| rows.last().map(|r| r.key))
                .flatten();
            Ok(DeadPage { rows, next })
        }
    }
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageQuery {
    tenant: Option<String>,
    before: Option<String>,
    limit: Option<usize>,
}

fn limit(api: &Api, l: Option<usize>) -> usize {
    l.unwrap_or(100).clamp(1, api.config.admin.max_page)
}

/// `GET /v1/dlq`
#[utoipa::path(
    get,
    path = "/v1/dlq",
    tag = "admin",
    params(PageQuery),
    responses(
        (status = 200, description = "Dead rows, newest first", body = crate::openapi::DlqPage),
        crate::openapi::AuthErrors,
        crate::openapi::BadRequest,
        crate::openapi::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn dlq(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let before = match &q.before {
        Some(s) => Some(parse_row_id(s).ok_or_else(|| ApiError::BadRequest("bad cursor".into()))?),
        None => None,
    };
    let n = limit(&api, q.limit);
    let a = api.clone();
    blocking(move || {
        let page = dead_rows(&a.store, &c.scope, q.tenant.as_deref(), before, n)?;
        let items = items(&a.store, &page.rows)?;
        Ok(Json(serde_json::json!({
            "items": items,
            "next": page.next.map(|k| row_id(&k)),
        }))
        .into_response())
    })
    .await
}

#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    #[serde(default)]
    ids: Vec<String>,
    tenant: Option<String>,
    source: Option<String>,
    from_ms: Option<u64>,
    to_ms: Option<u64>,
    limit: Option<usize>,
}

/// The most rows one replay call revives.
pub const MAX_REPLAY: usize = 100_000;

/// `POST /v1/dlq/replay`: revive dead rows by ids, tenant, source or time range, in synced
/// batches of 500 through the queue's revive op builder.
#[utoipa::path(
    post,
    path = "/v1/dlq/replay",
    tag = "admin",
    request_body = ReplayRequest,
    responses(
        (status = 200, description = "Rows revived by this call", body = crate::openapi::Revived),
        crate::openapi::AuthErrors,
        crate::openapi::BadRequest,
        crate::openapi::NotFound,
        crate::openapi::JsonBodyErrors,
    ),
    security(("bearer" = []))
)]
pub async fn replay(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Json(req): Json<ReplayRequest>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let cap = req.limit.unwrap_or(MAX_REPLAY).clamp(1, MAX_REPLAY);
    let a = api.clone();
    blocking(move || {
        let store = &a.store;
        let mut rows: Vec<DeadRow> = Vec::new();
        if !req.ids.is_empty() {
            let keys: Vec<DeadKey> = req
                .ids
                .iter()
                .map(|s| parse_row_id(s).ok_or_else(|| ApiError::BadRequest(format!("bad id {s:?}"))))
                .collect::<Result<_, _>>()?;
            for k in keys.into_iter().take(cap) {
                // One row at a time through the tenant-aware page: invisible rows are absent.
                let next = DeadKey { at: k.at, seq: k.seq, sink: SinkIdx(k.sink.0.saturating_add(1)) };
                let page = dead_rows(store, &c.scope, req.tenant.as_deref(), Some(next), 1)?;
                if let Some(r) = page.rows.into_iter().find(|r| r.key == k) {
                    rows.push(r);
                }
            }
        } else {
            if req.tenant.is_none() && req.source.is_none() && req.from_ms.is_none() && req.to_ms.is_none() {
                return Err(ApiError::BadRequest("name ids, a tenant, a source or a time range".into()));
            }
            let from = req.from_ms.unwrap_or(0);
            let mut before = req.to_ms.map(|t| DeadKey { at: AtMs(t), seq: Seq(0), sink: SinkIdx(0) });
            'pages: loop {
                let page = dead_rows(store, &c.scope, req.tenant.as_deref(), before, 500)?;
                for r in page.rows {
                    if r.key.at.0 < from {
                        break 'pages;
                    }
                    if req.source.as_ref().is_none_or(|s| *s == r.value.source) {
                        rows.push(r);
                        if rows.len() >= cap {
                            break 'pages;
                        }
                    }
                }
                match page.next {
                    Some(n) => before = Some(n),
                    None => break,
                }
            }
        }
        let now = AtMs(crate::now_ms());
        let total = rows.len();
        let audit = a.audit.op(
            &c.name,
            "dlq.replay",
            req.tenant.as_deref(),
            serde_json::json!({ "rows": total, "source": req.source, "from_ms": req.from_ms, "to_ms": req.to_ms, "ids": req.ids.len() }),
        );
        let revived = crate::dispatch::replayer::revive(
            store,
            &a.hints,
            &rows,
            now,
            a.config.hook_log.enabled,
            Some(audit),
        )?;
        Ok(Json(serde_json::json!({ "revived": revived })).into_response())
    })
    .await
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct TenantView {
    tenant: String,
    ord: u32,
    counters: Counts,
}

/// `GET /v1/tenants/{t}`
#[utoipa::path(
    get,
    path = "/v1/tenants/{t}",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    responses(
        (status = 200, description = "The tenant's counters", body = TenantView),
        crate::openapi::AuthErrors,
        crate::openapi::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn tenant(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let a = api.clone();
    blocking(move || {
        let ord = visible_ord(&a.store, &c.scope, &t)?;
        let counters = counters::read(&a.store, ord)?;
        Ok(Json(TenantView {
            tenant: t,
            ord: ord.0,
            counters,
        })
        .into_response())
    })
    .await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TopQuery {
    top: Option<usize>,
}

/// `GET /v1/tenants?top=N`: the tenants with the most pending work, from the active index
/// and the counters (never a scan of all tenants).
#[utoipa::path(
    get,
    path = "/v1/tenants",
    tag = "admin",
    params(TopQuery),
    responses(
        (status = 200, description = "The tenants with the most pending work", body = crate::openapi::TenantsTop),
        crate::openapi::AuthErrors,
        crate::openapi::BadRequest,
    ),
    security(("bearer" = []))
)]
pub async fn tenants_top(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<TopQuery>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let n = q.top.unwrap_or(100).clamp(1, api.config.admin.max_page);
    let a = api.clone();
    blocking(move || {
        let store = &a.store;
        let mut views = Vec::new();
        match &c.scope {
            Scope::Admin => {
                let now = AtMs(crate::now_ms());
                let active = deliveries::active_tenants_distinct(
                    store,
                    now,
                    crate::metrics::gauges::ACTIVE_SAMPLE,
                    crate::metrics::gauges::ACTIVE_SAMPLE_MARKERS,
                )?;
                for t in active {
                    let counters = counters::read(store, t.ord)?;
                    let name = tenants::name(store, t.ord)?.unwrap_or_default();
                    views.push(TenantView {
                        tenant: name,
                        ord: t.ord.0,
                        counters,
                    });
                }
            }
            Scope::Tenants(ts) => {
                for t in ts {
                    if let Some(ord) = tenants::ord(store, t)? {
                        views.push(TenantView {
                            tenant: t.clone(),
                            ord: ord.0,
                            counters: counters::read(store, ord)?,
                        });
                    }
                }
            }
        }
        views.sort_by(|x, y| {
            y.counters
                .pending
                .cmp(&x.counters.pending)
                .then(x.ord.cmp(&y.ord))
        });
        views.truncate(n);
        let mut out = serde_json::json!({ "tenants": views, "total": tenants::count(store)? });
        if a.cluster.is_multi() {
            out["owned"] = a.cluster.owned().into();
            if let Some(r) = a.cluster.registry() {
                out["registered"] = r.len().into();
            }
        }
        Ok(Json(out).into_response())
    })
    .await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PurgeQuery {
    kinds: String,
}

/// `DELETE /v1/tenants/{t}/queue?kinds=pending,dead`
#[utoipa::path(
    delete,
    path = "/v1/tenants/{t}/queue",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id"), PurgeQuery),
    responses(
        (status = 200, description = "Rows removed", body = crate::openapi::PurgeReport),
        crate::openapi::AuthErrors,
        crate::openapi::BadRequest,
        crate::openapi::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn purge(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
    Query(q): Query<PurgeQuery>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let mut kinds = PurgeKinds::default();
    for k in q.kinds.split(',').map(str::trim) {
        match k {
            "pending" => kinds.pending = true,
            "dead" => kinds.dead = true,
            other => {
                return Err(ApiError::BadRequest(format!(
                    "unknown kind {other:?} (pending, dead)"
                )))
            }
        }
    }
    let a = api.clone();
    blocking(move || {
        let ord = visible_ord(&a.store, &c.scope, &t)?;
        let audit = a.audit.op(&c.name, "tenant.purge", Some(&t), serde_json::json!({ "kinds": q.kinds }));
        let report = deliveries::purge_tenant_with(&a.store, ord, kinds, vec![audit])?;
        Ok(Json(serde_json::json!({ "tenant": t, "due": report.due, "dead": report.dead, "batches": report.batches })).into_response())
    })
    .await
}

/// The tenant a source pins (`tenant: {fixed: …}`, or none: `default`), if it pins one.
pub(crate) fn source_tenant(config: &Config, source: &str) -> Option<String> {
    config
        .sources
        .iter()
        .find(|s| s.id == source)
        .and_then(|s| match &s.tenant {
            Some(TenantFrom::Fixed(t)) => Some(t.clone()),
            None => Some(tenants::DEFAULT_TENANT.to_owned()),
            _ => None,
        })
}

pub(crate) fn quarantine_visible(config: &Config, scope: &Scope, source: &str) -> bool {
    // A shared source's tenant is whatever the unverified request claimed: admin only.
    scope.is_admin() || source_tenant(config, source).is_some_and(|t| scope.sees(&t))
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct QuarantineQuery {
    id: Option<u64>,
    before: Option<u64>,
    limit: Option<usize>,
}

/// `GET /v1/quarantine`: newest first, with headers and a body preview.
#[utoipa::path(
    get,
    path = "/v1/quarantine",
    tag = "admin",
    params(QuarantineQuery),
    responses(
        (status = 200, description = "Quarantined requests, newest first", body = crate::openapi::QuarantinePage),
        crate::openapi::AuthErrors,
        crate::openapi::BadRequest,
    ),
    security(("bearer" = []))
)]
pub async fn quarantine_list(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<QuarantineQuery>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let n = limit(&api, q.limit);
    let a = api.clone();
    blocking(move || {
        let entries = crate::queue::quarantine::page(&a.store, q.before, n, |e| {
            quarantine_visible(&a.config, &c.scope, &e.source)
        })?;
        let next = (entries.len() == n).then(|| entries.last().map(|e| e.id)).flatten();
        let items: Vec<serde_json::Value> = entries
            .into_iter()
            .map(|e| {
                let preview: String = e.body.chars().take(1024).collect();
                serde_json::json!({ "id": e.id, "source": e.source, "at_ms": e.at_ms, "reason": e.reason, "headers": e.headers, "body_base64_preview": preview })
            })
            .collect();
        Ok(Json(serde_json::json!({ "items": items, "next": next })).into_response())
    })
    .await
}

/// `DELETE /v1/quarantine?id=N` (one) or without `id` (everything within scope).
#[utoipa::path(
    delete,
    path = "/v1/quarantine",
    tag = "admin",
    params(QuarantineQuery),
    responses(
        (status = 200, description = "Entries deleted", body = crate::openapi::Deleted),
        crate::openapi::AuthErrors,
        crate::openapi::BadRequest,
        crate::openapi::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn quarantine_delete(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<QuarantineQuery>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let a = api.clone();
    blocking(move || {
        let audit = a.audit.op(
            &c.name,
            "quarantine.delete",
            None,
            serde_json::json!({ "id": q.id }),
        );
        let visible = |e: &crate::queue::quarantine::Entry| {
            quarantine_visible(&a.config, &c.scope, &e.source) && q.id.is_none_or(|id| id == e.id)
        };
        let removed =
            crate::ingest::quarantine::delete(&a.store, a.quarantine.as_deref(), visible, audit)?;
        if q.id.is_some() && removed == 0 {
            return Err(ApiError::NotFound("quarantined request"));
        }
        Ok(Json(serde_json::json!({ "deleted": removed })).into_response())
    })
    .await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct AuditQuery {
    before: Option<u64>,
    limit: Option<usize>,
}

/// `GET /v1/audit`: newest first; a tenant scope sees rows of its tenants.
#[utoipa::path(
    get,
    path = "/v1/audit",
    tag = "admin",
    params(AuditQuery),
    responses(
        (status = 200, description = "Audit rows, newest first", body = crate::openapi::AuditPage),
        crate::openapi::AuthErrors,
        crate::openapi::BadRequest,
    ),
    security(("bearer" = []))
)]
pub async fn audit_list(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<AuditQuery>,
) -> ApiResult {
    let c = caller(&api, &headers)?;
    let n = limit(&api, q.limit);
    let a = api.clone();
    blocking(move || {
        let rows = audit::page(&a.store, q.before, n, |r| {
            c.scope.is_admin() || r.tenant.as_deref().is_some_and(|t| c.scope.sees(t))
        })?;
        let next = (rows.len() == n)
            .then(|| rows.last().map(|r| r.seq))
            .flatten();
        Ok(Json(serde_json::json!({ "items": rows, "next": next })).into_response())
    })
    .await
}

/// `GET /v1/config`: the effective configuration, every secret `<redacted>`. Admin only.
#[utoipa::path(
    get,
    path = "/v1/config",
    tag = "admin",
    responses(
        (status = 200, description = "The effective configuration, secrets redacted", body = Object),
        crate::openapi::AuthErrors,
        crate::openapi::Forbidden,
    ),
    security(("bearer" = []))
)]
pub async fn config(State(api): State<Arc<Api>>, headers: HeaderMap) -> ApiResult {
    admin_only(&caller(&api, &headers)?)?;
    Ok(Json(serde_json::to_value(&*api.config).map_err(|_| ApiError::Internal)?).into_response())
}

/// `GET /v1/node`: the node's status (the operator polls it). Admin only.
#[utoipa::path(
    get,
    path = "/v1/node",
    tag = "admin",
    responses(
        (status = 200, description = "The node's status (served during a boot migration too)", body = ankusa_crds::node::NodeStatus),
        (status = 401, description = "No valid token", body = crate::openapi::ErrorBody),
        crate::openapi::Forbidden,
    ),
    security(("bearer" = []))
)]
pub async fn node(State(api): State<Arc<Api>>, headers: HeaderMap) -> ApiResult {
    admin_only(&caller(&api, &headers)?)?;
    let a = api.clone();
    blocking(move || {
        let mut s = super::node_status(&a.store, a.progress.get())?;
        s.cluster = a.cluster.status();
        Ok(Json(s).into_response())
    })
    .await
}
