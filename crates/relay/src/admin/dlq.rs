//! The dead-letter queue: `GET /v1/dlq` (a page of dead rows, newest first) and
//! `POST /v1/dlq/replay` (revive rows by ids, tenant, source or time range).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::api::{blocking, caller, limit, visible_ord, Api, ApiError, PageQuery};
use super::auth::Scope;
use ankusa_api::admin::{DlqItem, DlqPage, ReplayRequest, Revived};
use ankusa_api_macros::answers;
use ankusa_keyspace::{AtMs, DeadKey, Seq, SinkIdx, TenantOrd};
use ankusa_queue::deliveries::{self, DeadPage, DeadRow};
use ankusa_queue::engine::Store;
use ankusa_queue::{tenants, QueueError};

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
            node: None,
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

/// The most dead rows one filtered page reads before it answers with what it found and a
/// cursor to go on from (a filter that matches few rows never scans the whole DLQ).
pub const MAX_FILTER_SCAN: usize = 10_000;

/// `GET /v1/dlq`'s filters.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct DlqFilter {
    /// Only rows of hooks that came in through this source.
    source: Option<String>,
    /// Only rows dead-lettered at or after this time (ms since the epoch).
    from_ms: Option<u64>,
    /// Only rows dead-lettered before this time (ms since the epoch).
    to_ms: Option<u64>,
}

/// `GET /v1/dlq`: a page of dead rows, newest first; with filters, the rows that match
/// among at most [`MAX_FILTER_SCAN`] read (`next` goes on after the last row read).
#[answers]
#[utoipa::path(
    get,
    path = "/v1/dlq",
    tag = "admin",
    params(PageQuery, DlqFilter),
    responses(
        (status = 200, description = "Dead rows, newest first"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn dlq(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<PageQuery>,
    Query(f): Query<DlqFilter>,
) -> Result<Json<DlqPage>, ApiError> {
    let c = caller(&api, &headers)?;
    let mut before = match &q.before {
        Some(s) => Some(parse_row_id(s).ok_or_else(|| ApiError::BadRequest("bad cursor".into()))?),
        None => None,
    };
    if let (None, Some(t)) = (before, f.to_ms) {
        before = Some(DeadKey {
            at: AtMs(t),
            seq: Seq(0),
            sink: SinkIdx(0),
        });
    }
    let n = limit(&api, q.limit);
    let a = api.clone();
    blocking(move || {
        let filtered = f.source.is_some() || f.from_ms.is_some();
        if !filtered {
            let page = dead_rows(&a.store, &c.scope, q.tenant.as_deref(), before, n)?;
            let items = items(&a.store, &page.rows)?;
            return Ok(Json(DlqPage {
                items,
                next: page.next.map(|k| row_id(&k)),
                unavailable: Vec::new(),
            }));
        }
        let from = f.from_ms.unwrap_or(0);
        let (mut rows, mut read) = (Vec::new(), 0usize);
        let mut next: Option<DeadKey>;
        'pages: loop {
            let page = dead_rows(&a.store, &c.scope, q.tenant.as_deref(), before, 500)?;
            for r in page.rows {
                if r.key.at.0 < from {
                    next = None;
                    break 'pages;
                }
                read += 1;
                next = Some(r.key);
                if f.source.as_ref().is_none_or(|s| *s == r.value.source) {
                    rows.push(r);
                    if rows.len() >= n {
                        break 'pages;
                    }
                }
                if read >= MAX_FILTER_SCAN {
                    break 'pages;
                }
            }
            match page.next {
                Some(k) => before = Some(k),
                None => {
                    next = None;
                    break;
                }
            }
        }
        let items = items(&a.store, &rows)?;
        Ok(Json(DlqPage {
            items,
            next: next.map(|k| row_id(&k)),
            unavailable: Vec::new(),
        }))
    })
    .await
}

/// The most rows one replay call revives.
pub const MAX_REPLAY: usize = 100_000;
/// Rows a replay reads and revives at a time (one synced batch).
const REVIVE_PAGE: usize = 500;

/// `POST /v1/dlq/replay`: revive dead rows by ids, tenant, source or time range, in synced
/// batches of 500 through the queue's revive op builder.
#[answers]
#[utoipa::path(
    post,
    path = "/v1/dlq/replay",
    tag = "admin",
    request_body = ReplayRequest,
    responses(
        (status = 200, description = "Rows revived by this call"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
        crate::http::JsonBodyErrors,
    ),
    security(("bearer" = []))
)]
pub async fn replay(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Json(req): Json<ReplayRequest>,
) -> Result<Json<Revived>, ApiError> {
    let c = caller(&api, &headers)?;
    let cap = req.limit.unwrap_or(MAX_REPLAY).clamp(1, MAX_REPLAY);
    if req.ids.is_empty()
        && req.tenant.is_none()
        && req.source.is_none()
        && req.from_ms.is_none()
        && req.to_ms.is_none()
    {
        return Err(ApiError::BadRequest(
            "name ids, a tenant, a source or a time range".into(),
        ));
    }
    // One replay of a tenant at a time, and one of the whole DLQ.
    let _running = api
        .replays
        .begin(format!("dlq:{}", req.tenant.as_deref().unwrap_or("*")))?;
    let a = api.clone();
    blocking(move || {
        let store = &a.store;
        let now = AtMs(ankusa_keyspace::now_ms());
        let log = a.config.load().hook_log.enabled;
        let (mut matched, mut revived) = (0u64, 0u64);
        // Revived a page at a time, as read: no more than a page of rows is held.
        let mut take = |page: Vec<DeadRow>| -> Result<(), ApiError> {
            matched += page.len() as u64;
            if !req.dry_run && !page.is_empty() {
                revived +=
                    crate::dispatch::replayer::revive(store, &a.hints, &page, now, log, None)?;
            }
            Ok(())
        };
        if !req.ids.is_empty() {
            let keys: Vec<DeadKey> = req
                .ids
                .iter()
                .map(|s| parse_row_id(s).ok_or_else(|| ApiError::BadRequest(format!("bad id {s:?}"))))
                .collect::<Result<_, _>>()?;
            for chunk in keys[..keys.len().min(cap)].chunks(REVIVE_PAGE) {
                let mut rows = Vec::with_capacity(chunk.len());
                for k in chunk {
                    // One row at a time through the tenant-aware page: invisible rows are absent.
                    let next = DeadKey { at: k.at, seq: k.seq, sink: SinkIdx(k.sink.0.saturating_add(1)) };
                    let page = dead_rows(store, &c.scope, req.tenant.as_deref(), Some(next), 1)?;
                    rows.extend(page.rows.into_iter().find(|r| r.key == *k));
                }
                take(rows)?;
            }
        } else {
            let from = req.from_ms.unwrap_or(0);
            let mut before = req.to_ms.map(|t| DeadKey { at: AtMs(t), seq: Seq(0), sink: SinkIdx(0) });
            let mut left = cap;
            'pages: loop {
                let page = dead_rows(store, &c.scope, req.tenant.as_deref(), before, REVIVE_PAGE)?;
                let mut rows = Vec::new();
                let mut done = false;
                for r in page.rows {
                    if r.key.at.0 < from {
                        done = true;
                        break;
                    }
                    if req.source.as_ref().is_none_or(|s| *s == r.value.source) {
                        rows.push(r);
                        left -= 1;
                        if left == 0 {
                            done = true;
                            break;
                        }
                    }
                }
                take(rows)?;
                match page.next {
                    Some(n) if !done => before = Some(n),
                    _ => break 'pages,
                }
            }
        }
        if !req.dry_run {
            let audit = a.audit.op(
                &c.name,
                "dlq.replay",
                req.tenant.as_deref(),
                serde_json::json!({ "rows": matched, "revived": revived, "source": req.source, "from_ms": req.from_ms, "to_ms": req.to_ms, "ids": req.ids.len() }),
            );
            ankusa_queue::commit(store, vec![audit], true)?;
        }
        Ok(Json(Revived {
            revived,
            matched,
            unavailable: Vec::new(),
        }))
    })
    .await
}
