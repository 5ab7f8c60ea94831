//! `GET /v1/hooks/{id}`: what happened to one hook, from the hook log
//! ([`ankusa_queue::hooklog`]) and the queue; `GET /v1/tenants/{t}/deliveries/{id}`: the
//! same, found by the provider's delivery id; `GET /v1/hooks`: the newest hooks.

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use base64::Engine;
use serde::Deserialize;

use super::api::{blocking, caller, visible_ord, Api, ApiError};
use ankusa_api::admin::{EventOut, HookOut, HookSummary, RecentHooks, SinkOut};
use ankusa_api_macros::answers;
use ankusa_queue::hooklog::{self, HookView};
use ankusa_records::Event;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct HookQuery {
    /// Include the body (while the hook is still stored).
    #[serde(default)]
    body: bool,
}

/// One hook-log event as the API shows it.
fn event(e: &Event) -> EventOut {
    let attempt = e.kind == ankusa_keyspace::EventKind::Attempt;
    EventOut {
        kind: crate::wire::event_kind(e.kind),
        at_ms: e.at.0,
        attempt: e.attempt,
        outcome: e.outcome.map(crate::wire::outcome),
        status: (e.status != 0).then_some(e.status),
        error_class: e.class.map(crate::wire::error_class),
        error: e.error.clone(),
        latency_ms: attempt.then_some(e.latency_us as f64 / 1000.0),
        next_at_ms: e.next_at.map(|a| a.0),
    }
}

fn render(v: HookView, tenant_paused_since_ms: Option<u64>) -> HookOut {
    let env = v.record.envelope;
    let (body, body_base64) = match v.body {
        None => (None, None),
        Some(b) => match String::from_utf8(b) {
            Ok(s) => (Some(s), None),
            Err(e) => (
                None,
                Some(base64::engine::general_purpose::STANDARD.encode(e.into_bytes())),
            ),
        },
    };
    HookOut {
        tenant: env.tenant_or_default().to_owned(),
        id: env.id,
        source: env.source,
        received_ms: env.received_at.0,
        size: v.record.body_len,
        content_type: env.content_type,
        headers: env
            .headers
            .into_iter()
            .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
            .collect(),
        stored: v.stored,
        filtered: v.sinks.is_empty(),
        tenant_paused_since_ms,
        sinks: v
            .sinks
            .into_iter()
            .map(|s| SinkOut {
                sink: s.sink,
                index: s.index.0,
                state: crate::wire::state(s.state),
                attempts: s.attempts,
                next_attempt_ms: s.next_attempt_at.map(|a| a.0),
                events: s.events.iter().map(event).collect(),
            })
            .collect(),
        body,
        body_base64,
    }
}

/// `GET /v1/hooks/{id}[?body=true]`: the hook's tenant, source, receipt, size, forwarded
/// headers and, per sink, its state, attempts and next attempt. A tenant-scoped token sees
/// only its tenants' hooks (404 for the others, as for an unknown id).
#[answers]
#[utoipa::path(
    get,
    path = "/v1/hooks/{id}",
    tag = "admin",
    params(("id" = String, Path, description = "A hook id"), HookQuery),
    responses(
        (status = 200, description = "The hook from the hook log"),
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
    Query(q): Query<HookQuery>,
) -> Result<Json<HookOut>, ApiError> {
    let c = caller(&api, &headers)?;
    let a = api.clone();
    blocking(move || answer(&a, &c.scope, &id, q.body)).await
}

/// Hook `id` from the log, if `scope` sees its tenant (404 as for an unknown id if not).
fn answer(
    a: &Api,
    scope: &super::auth::Scope,
    id: &str,
    body: bool,
) -> Result<Json<HookOut>, ApiError> {
    let Some(view) = hooklog::lookup(&a.store, id, body)? else {
        return Err(ApiError::NotFound("hook"));
    };
    let tenant = view.record.envelope.tenant_or_default();
    if !scope.sees(tenant) {
        return Err(ApiError::NotFound("hook"));
    }
    let paused = ankusa_queue::tenants::ord(&a.store, tenant)?
        .and_then(|o| super::tenants::paused_since(a, o));
    Ok(Json(render(view, paused)))
}

/// The most hook-log records `GET /v1/hooks` reads for one page.
pub const MAX_RECENT_SCAN: usize = 5_000;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct RecentQuery {
    /// Only this tenant's hooks.
    tenant: Option<String>,
    /// The most hooks listed (default 20, at most `admin.max_page`).
    limit: Option<usize>,
}

/// `GET /v1/hooks?tenant=t&limit=n`: the newest hooks of the node's hook log, newest first,
/// reading at most [`MAX_RECENT_SCAN`] records (the log is in arrival order, with no
/// tenant index).
#[answers]
#[utoipa::path(
    get,
    path = "/v1/hooks",
    tag = "admin",
    params(RecentQuery),
    responses(
        (status = 200, description = "The newest hooks the log keeps"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn recent(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<RecentQuery>,
) -> Result<Json<RecentHooks>, ApiError> {
    let c = caller(&api, &headers)?;
    let n = q
        .limit
        .unwrap_or(20)
        .clamp(1, api.config.load().admin.max_page);
    let a = api.clone();
    blocking(move || {
        if let Some(t) = &q.tenant {
            visible_ord(&a.store, &c.scope, t)?;
        } else if !c.scope.is_admin() {
            // A tenant scope lists its tenants' hooks only: name one.
            return Err(ApiError::BadRequest("name a tenant".into()));
        }
        let (records, truncated) =
            hooklog::recent(&a.store, q.tenant.as_deref(), n, MAX_RECENT_SCAN)?;
        let items = records
            .into_iter()
            .map(|r| HookSummary {
                tenant: r.envelope.tenant_or_default().to_owned(),
                id: r.envelope.id,
                source: r.envelope.source,
                received_ms: r.envelope.received_at.0,
                size: r.body_len,
                sinks: r.envelope.sinks,
            })
            .collect();
        Ok(Json(RecentHooks { items, truncated }))
    })
    .await
}

/// `GET /v1/tenants/{t}/deliveries/{delivery_id}`: the hook a provider's delivery id
/// (`X-GitHub-Delivery`, `webhook-id`, a Stripe event id: the source's `idempotency` key)
/// was taken as, while its dedupe entry lives (`dedupe.window_ms`).
#[answers]
#[utoipa::path(
    get,
    path = "/v1/tenants/{t}/deliveries/{delivery_id}",
    tag = "admin",
    params(
        ("t" = String, Path, description = "A tenant id"),
        ("delivery_id" = String, Path, description = "The provider's delivery id"),
        HookQuery,
    ),
    responses(
        (status = 200, description = "The hook from the hook log"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn by_delivery(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((t, delivery)): Path<(String, String)>,
    Query(q): Query<HookQuery>,
) -> Result<Json<HookOut>, ApiError> {
    let c = caller(&api, &headers)?;
    let a = api.clone();
    blocking(move || {
        visible_ord(&a.store, &c.scope, &t)?;
        let Some(id) = ankusa_queue::dedupe::first_hook_of(&a.store, &t, delivery.as_bytes())?
        else {
            return Err(ApiError::NotFound("delivery"));
        };
        answer(&a, &c.scope, &id, q.body)
    })
    .await
}
