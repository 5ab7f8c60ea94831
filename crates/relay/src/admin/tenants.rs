//! Tenants: `GET /v1/tenants/{t}` (its counters), `GET /v1/tenants?top=N` (the tenants
//! with the most pending work), `DELETE /v1/tenants/{t}/queue` (purge), `…/retry`, and
//! `…/pause` and `…/resume` (deliveries held, [`crate::dispatch::paused`]).

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::api::{blocking, caller, visible_ord, Api, ApiError};
use super::auth::Scope;
use ankusa_api::admin::{PauseState, PurgeReport, Retried, RetryRequest, TenantView, TenantsTop};
use ankusa_api::node::Counters;
use ankusa_api_macros::answers;
use ankusa_keyspace::AtMs;
use ankusa_queue::deliveries::{self, PurgeKinds};
use ankusa_queue::{counters, tenants};

/// Tenant `tenant` (ordinal `ord`) on this node: its counters, oldest due row (one seek),
/// pause and refusals.
pub(crate) fn view(
    api: &Api,
    tenant: String,
    ord: ankusa_keyspace::TenantOrd,
) -> Result<TenantView, ankusa_queue::QueueError> {
    Ok(TenantView {
        counters: crate::wire::counters(counters::read(&api.store, ord)?),
        oldest_due_at_ms: deliveries::first_due(&api.store, ord)?.map(|r| r.key.at.0),
        ord: Some(ord.0),
        paused_since_ms: paused_since(api, ord),
        erasing_since_ms: api.eraser.since(ord).map(|a| a.0),
        quota_refusals: api.quotas.refused(&tenant).map_or(0, |r| r.count),
        unavailable: Vec::new(),
        tenant,
    })
}

/// `GET /v1/tenants/{t}`
#[answers]
#[utoipa::path(
    get,
    path = "/v1/tenants/{t}",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    responses(
        (status = 200, description = "The tenant's counters"),
        crate::http::AuthErrors,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn tenant(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
) -> Result<Json<TenantView>, ApiError> {
    let c = caller(&api, &headers)?;
    let a = api.clone();
    blocking(move || {
        let ord = visible_ord(&a.store, &c.scope, &t)?;
        Ok(Json(view(&a, t, ord)?))
    })
    .await
}

/// Every tenant with work — due rows now or later (every bucket of the active index), dead
/// rows (a skip scan of their index, one key per tenant), and `more` (paused tenants, whose
/// markers dispatch took out) — each with its counters, bounded as the gauges' read is;
/// the most work first ([`Counters::work_order`], then the oldest ordinal).
pub(crate) fn with_work(
    store: &ankusa_queue::engine::Store,
    more: impl IntoIterator<Item = ankusa_keyspace::TenantOrd>,
) -> Result<Vec<(String, ankusa_keyspace::TenantOrd, Counters)>, ankusa_queue::QueueError> {
    let active = deliveries::active_tenants_distinct(
        store,
        AtMs(u64::MAX),
        crate::metrics::gauges::ACTIVE_SAMPLE,
        crate::metrics::gauges::ACTIVE_SAMPLE_MARKERS,
    )?;
    let dead = deliveries::tenants_with_dead(store, crate::metrics::gauges::ACTIVE_SAMPLE)?;
    let mut seen = std::collections::HashSet::new();
    let ords = active.into_iter().map(|t| t.ord).chain(dead).chain(more);
    let mut out = Vec::new();
    for ord in ords.filter(|o| seen.insert(*o)) {
        let counters = crate::wire::counters(counters::read(store, ord)?);
        // A marker the dispatcher has not cleaned yet can name a tenant with nothing left.
        if counters.pending + counters.scheduled + counters.inflight + counters.dead == 0 {
            continue;
        }
        let name = tenants::name(store, ord)?.unwrap_or_default();
        out.push((name, ord, counters));
    }
    by_work(&mut out);
    Ok(out)
}

/// Most work first ([`Counters::work_order`]), then the oldest ordinal.
fn by_work(tenants: &mut [(String, ankusa_keyspace::TenantOrd, Counters)]) {
    tenants.sort_by(|x, y| y.2.work_order().cmp(&x.2.work_order()).then(x.1.cmp(&y.1)));
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct TopQuery {
    top: Option<usize>,
    /// List every tenant whose id starts with this, in id order (with or without work).
    prefix: Option<String>,
    /// With `prefix` (or alone): the page after this tenant id (the last page's `next`).
    after: Option<String>,
}

/// `GET /v1/tenants?top=N`: the tenants with work — pending, scheduled or dead — the most
/// pending first, from the active index, a skip scan of the dead rows' tenant index and the
/// counters (never a scan of all tenants). `?prefix=P[&after=T]`: every tenant whose id
/// starts with `P`, in id order, a page of `top` from one seek of the tenant index.
#[answers]
#[utoipa::path(
    get,
    path = "/v1/tenants",
    tag = "admin",
    params(TopQuery),
    responses(
        (status = 200, description = "The tenants with pending, scheduled or dead rows, the most pending first"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
    ),
    security(("bearer" = []))
)]
pub async fn tenants_top(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<TopQuery>,
) -> Result<Json<TenantsTop>, ApiError> {
    let c = caller(&api, &headers)?;
    let n = q
        .top
        .unwrap_or(100)
        .clamp(1, api.config.load().admin.max_page);
    let a = api.clone();
    let listing = q.prefix.is_some() || q.after.is_some();
    blocking(move || {
        let store = &a.store;
        // The page's tenants, then each read whole.
        let (page, next) = if listing {
            let prefix = q.prefix.unwrap_or_default();
            let listed = match &c.scope {
                Scope::Admin => tenants::list(store, &prefix, q.after.as_deref(), n)?,
                Scope::Tenants(ts) => {
                    let mut out = Vec::new();
                    let after = q.after.as_deref().unwrap_or("");
                    for t in ts
                        .iter()
                        .filter(|t| t.starts_with(&prefix) && t.as_str() > after)
                    {
                        if out.len() >= n {
                            break;
                        }
                        if let Some(ord) = tenants::ord(store, t)? {
                            out.push((t.clone(), ord));
                        }
                    }
                    out
                }
            };
            let next = (listed.len() >= n)
                .then(|| listed.last().map(|(t, _)| t.clone()))
                .flatten();
            (listed, next)
        } else {
            let mut ranked = match &c.scope {
                // And the paused ones: dispatch took their markers out.
                Scope::Admin => {
                    with_work(store, a.paused.ords(crate::metrics::gauges::ACTIVE_SAMPLE))?
                }
                Scope::Tenants(ts) => {
                    let mut out = Vec::new();
                    for t in ts {
                        if let Some(ord) = tenants::ord(store, t)? {
                            out.push((
                                t.clone(),
                                ord,
                                crate::wire::counters(counters::read(store, ord)?),
                            ));
                        }
                    }
                    by_work(&mut out);
                    out
                }
            };
            ranked.truncate(n);
            let page = ranked
                .into_iter()
                .map(|(name, ord, _)| (name, ord))
                .collect();
            (page, None)
        };
        let views = page
            .into_iter()
            .map(|(name, ord)| view(&a, name, ord))
            .collect::<Result<Vec<_>, _>>()?;
        let multi = a.cluster.is_multi();
        Ok(Json(TenantsTop {
            tenants: views,
            total: u64::from(tenants::count(store)?),
            owned: multi.then(|| a.cluster.owned() as u64),
            registered: multi
                .then(|| a.cluster.registry().map(|r| r.len() as u64))
                .flatten(),
            next,
            nodes: None,
            unavailable: None,
        }))
    })
    .await
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PurgeQuery {
    kinds: String,
}

/// `DELETE /v1/tenants/{t}/queue?kinds=pending,dead`
#[answers]
#[utoipa::path(
    delete,
    path = "/v1/tenants/{t}/queue",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id"), PurgeQuery),
    responses(
        (status = 200, description = "Rows removed"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn purge(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
    Query(q): Query<PurgeQuery>,
) -> Result<Json<PurgeReport>, ApiError> {
    let c = caller(&api, &headers)?;
    super::api::not_portal(&c)?;
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
        let audit = a.audit.op(
            &c.name,
            "tenant.purge",
            Some(&t),
            serde_json::json!({ "kinds": q.kinds }),
        );
        let report = deliveries::purge_tenant_with(&a.store, ord, kinds, vec![audit])?;
        Ok(Json(PurgeReport {
            tenant: t,
            due: report.due,
            dead: report.dead,
            batches: report.batches,
            unavailable: Vec::new(),
        }))
    })
    .await
}

/// The most rows one retry now moves, and the most waiting rows it reads to find them.
pub const MAX_RETRY: usize = 10_000;
pub const MAX_RETRY_SCAN: usize = 100_000;

/// `POST /v1/tenants/{t}/retry`: the tenant's rows waiting out a retry's backoff (or due
/// later for another reason) are due now — all of them, one sink's, or one hook's. Rows
/// move in synced batches with the audit row; a row that moved meanwhile (claimed,
/// purged) is not counted.
#[answers]
#[utoipa::path(
    post,
    path = "/v1/tenants/{t}/retry",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    request_body = RetryRequest,
    responses(
        (status = 200, description = "Rows made due now"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn retry(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
    body: bytes::Bytes,
) -> Result<Json<Retried>, ApiError> {
    let c = caller(&api, &headers)?;
    // No body (or an empty one) is every waiting row of the tenant.
    let req: RetryRequest = if body.iter().all(u8::is_ascii_whitespace) {
        RetryRequest::default()
    } else {
        serde_json::from_slice(&body).map_err(|e| ApiError::BadRequest(e.to_string()))?
    };
    let cap = req.limit.unwrap_or(MAX_RETRY).clamp(1, MAX_RETRY);
    if let Some(s) = &req.sink {
        if !api.config.load().sinks.iter().any(|k| k.id == *s) {
            return Err(ApiError::BadRequest(format!("no sink {s:?}")));
        }
    }
    let a = api.clone();
    blocking(move || {
        let store = &a.store;
        let ord = visible_ord(store, &c.scope, &t)?;
        let seq = match &req.hook_id {
            None => None,
            Some(id) => Some(
                ankusa_queue::hooklog::seq_of(store, id)?
                    .ok_or(ApiError::NotFound("no such hook in the hook log"))?,
            ),
        };
        let now = AtMs(ankusa_keyspace::now_ms());
        let waiting = deliveries::scheduled_for_tenant(store, ord, now, MAX_RETRY_SCAN)?;
        let mut sinks_of = std::collections::HashMap::new();
        let mut rows = Vec::new();
        let mut more = waiting.len() == MAX_RETRY_SCAN;
        for r in waiting {
            if seq.is_some_and(|s| s != r.key.seq) {
                continue;
            }
            if let Some(want) = &req.sink {
                // The sink's name is in its hook's envelope, read once per hook.
                let names = match sinks_of.entry(r.key.seq) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => {
                        let env = deliveries::envelope(store, r.key.seq)?;
                        e.insert(env.map(|e| e.sinks).unwrap_or_default())
                    }
                };
                if names.get(r.key.sink.0 as usize) != Some(want) {
                    continue;
                }
            }
            if rows.len() == cap {
                more = true;
                break;
            }
            rows.push(r);
        }
        let audit = a.audit.op(
            &c.name,
            "tenant.retry",
            Some(&t),
            serde_json::json!({ "rows": rows.len(), "sink": req.sink, "hook_id": req.hook_id }),
        );
        let retried = crate::dispatch::replayer::hasten(
            store,
            &a.hints,
            &rows,
            now,
            a.config.load().hook_log.enabled,
            Some(audit),
        )?;
        Ok(Json(Retried {
            tenant: t,
            retried,
            more,
            unavailable: Vec::new(),
        }))
    })
    .await
}

/// When tenant `ord` was paused on this node, if it is.
pub(crate) fn paused_since(api: &Api, ord: ankusa_keyspace::TenantOrd) -> Option<u64> {
    match api.paused.hold(ord) {
        Some(crate::dispatch::paused::Hold::Paused(at)) => Some(at.0),
        _ => None,
    }
}

/// `POST /v1/tenants/{t}/pause`: no delivery of the tenant is attempted until it is
/// resumed. Its rows stay due and counted, with their due times; deliveries in flight
/// finish. Persisted with its audit row in one synced write; pausing a paused tenant
/// changes nothing.
#[answers]
#[utoipa::path(
    post,
    path = "/v1/tenants/{t}/pause",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    responses(
        (status = 200, description = "The tenant is paused"),
        crate::http::AuthErrors,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn pause(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
) -> Result<Json<PauseState>, ApiError> {
    pause_call(api, headers, t, true).await
}

/// `POST /v1/tenants/{t}/resume`: the tenant's deliveries go on. Its due rows get their
/// active markers back (synced, in chunks) before the pause ends in the store, with its
/// audit row; resuming a tenant that is not paused changes nothing.
#[answers]
#[utoipa::path(
    post,
    path = "/v1/tenants/{t}/resume",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id")),
    responses(
        (status = 200, description = "The tenant's deliveries go on"),
        crate::http::AuthErrors,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn resume(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
) -> Result<Json<PauseState>, ApiError> {
    pause_call(api, headers, t, false).await
}

/// A pause (`pause`) or a resume of tenant `t`, in the caller's scope, audited.
async fn pause_call(
    api: Arc<Api>,
    headers: HeaderMap,
    t: String,
    pause: bool,
) -> Result<Json<PauseState>, ApiError> {
    let c = caller(&api, &headers)?;
    super::api::not_portal(&c)?;
    let a = api.clone();
    blocking(move || {
        let ord = visible_ord(&a.store, &c.scope, &t)?;
        let audit = |action, detail| a.audit.op(&c.name, action, Some(&t), detail);
        let (changed, markers) = if pause {
            let at = AtMs(ankusa_keyspace::now_ms());
            let paused = a.paused.pause(&a.store, ord, at, || {
                audit("tenant.pause", serde_json::json!({}))
            })?;
            (u64::from(paused), 0)
        } else {
            match a.paused.resume(&a.store, ord, |markers| {
                audit("tenant.resume", serde_json::json!({ "markers": markers }))
            })? {
                Some(markers) => (1, markers),
                None => (0, 0),
            }
        };
        Ok(Json(PauseState {
            tenant: t,
            paused: pause,
            changed,
            markers,
            unavailable: Vec::new(),
        }))
    })
    .await
}
