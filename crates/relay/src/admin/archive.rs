//! `GET /v1/archive` and `POST /v1/archive/replay`: a tenant's archived hooks, and sending
//! them again ([`ankusa_queue::archive`]).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use base64::Engine;
use serde::Deserialize;

use super::api::{blocking, caller, visible_ord, Api, ApiError};
use ankusa_api::admin::{ArchivePage, ArchiveReplayRequest, ArchivedItem, Replayed};
use ankusa_api::error::ErrorCode;
use ankusa_api_macros::answers;
use ankusa_keyspace::{AtMs, Seq};
use ankusa_queue::archive::{self, Archived};
use ankusa_queue::writer::{Reply, Submission};
use ankusa_records::Envelope;

/// The most hooks one replay sends again.
const MAX_REPLAY: usize = 100_000;
/// Hooks one replay reads at a time (and awaits together).
const REPLAY_PAGE: usize = 64;
/// Body bytes one replay holds at a time (a page stops past it; its first hook always
/// goes).
const REPLAY_PAGE_BYTES: usize = 8 << 20;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[serde(deny_unknown_fields)]
pub struct ArchiveQuery {
    tenant: Option<String>,
    from_ms: Option<u64>,
    to_ms: Option<u64>,
    /// `next` of the previous page: `<received_ms>.<seq>`.
    before: Option<String>,
    limit: Option<usize>,
    #[serde(default)]
    body: bool,
}

fn parse_before(s: &str) -> Option<(AtMs, Seq)> {
    let (r, q) = s.split_once('.')?;
    Some((AtMs(r.parse().ok()?), Seq(q.parse().ok()?)))
}

fn item(a: &Archived, body: bool) -> ArchivedItem {
    let env = &a.envelope;
    let (mut text, mut base64) = (None, None);
    if body {
        match std::str::from_utf8(&env.body) {
            Ok(s) => text = Some(s.to_owned()),
            Err(_) => base64 = Some(base64::engine::general_purpose::STANDARD.encode(&env.body)),
        }
    }
    ArchivedItem {
        id: env.id.clone(),
        tenant: env.tenant_or_default().to_owned(),
        source: env.source.clone(),
        received_ms: env.received_at.0,
        expires_ms: a.expires.0,
        size: env.body.len() as u64,
        content_type: env.content_type.clone(),
        sinks: env.sinks.clone(),
        headers: env
            .headers
            .iter()
            .map(|(k, v)| (k.clone(), String::from_utf8_lossy(v).into_owned()))
            .collect(),
        body: text,
        body_base64: base64,
    }
}

/// `GET /v1/archive?tenant=&from_ms=&to_ms=&before=&limit=&body=`: the tenant's archived
/// hooks received in `[from_ms, to_ms)`, newest first, one bounded scan of its range.
#[answers]
#[utoipa::path(
    get,
    path = "/v1/archive",
    tag = "admin",
    params(ArchiveQuery),
    responses(
        (status = 200, description = "The tenant's archived hooks, newest first"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn list(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<ArchiveQuery>,
) -> Result<Json<ArchivePage>, ApiError> {
    let c = caller(&api, &headers)?;
    let Some(tenant) = q.tenant.clone() else {
        return Err(ApiError::BadRequest("tenant is required".into()));
    };
    let before = match q.before.as_deref() {
        None => None,
        Some(b) => Some(parse_before(b).ok_or_else(|| {
            ApiError::BadRequest("before: expected <received_ms>.<seq>, a page's next".into())
        })?),
    };
    let limit = q
        .limit
        .unwrap_or(100)
        .clamp(1, api.config.load().admin.max_page);
    let a = api.clone();
    blocking(move || {
        let ord = visible_ord(&a.store, &c.scope, &tenant)?;
        let page = archive::page(
            &a.store,
            ord,
            AtMs(q.from_ms.unwrap_or(0)),
            AtMs(q.to_ms.unwrap_or(u64::MAX)),
            before,
            limit,
        )?;
        Ok(Json(ArchivePage {
            items: page.items.iter().map(|i| item(i, q.body)).collect(),
            next: page.next.map(|(r, s)| format!("{}.{}", r.0, s.0)),
        }))
    })
    .await
}

/// `POST /v1/archive/replay {tenant, from_ms, to_ms, ids, limit, after}`: each archived
/// hook that matches is committed again as a new hook — same id, body, headers and
/// fan-out, received now — through the writer (a synced commit, then delivery as a first
/// attempt), oldest first. The archive keeps its copy. Read and sent a page at a time
/// (64 hooks, 8 MiB of bodies), one replay per tenant at a time (409 `replay_running`),
/// through a lane of the writer's queue that leaves the rest to live ingest; each hook is
/// charged to the tenant's quotas as an ingested one is, and the replay stops at the first
/// refusal with `stopped`, `retry_after_s` and `next` (pass it as `after` to go on).
/// Answers `{"replayed": n}`; audited.
#[answers]
#[utoipa::path(
    post,
    path = "/v1/archive/replay",
    tag = "admin",
    request_body = ArchiveReplayRequest,
    responses(
        (status = 200, description = "Hooks committed again (stopped, with next, at a quota)"),
        (status = 409, description = "A replay of the tenant runs on this node (replay_running)", body = ankusa_api::error::ErrorBody),
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
    Json(req): Json<ArchiveReplayRequest>,
) -> Result<Json<Replayed>, ApiError> {
    let c = caller(&api, &headers)?;
    let caller_name = c.name.clone();
    let Some(writer) = api.writer.get().cloned() else {
        return Err(ApiError::Failed {
            code: ErrorCode::NotReady,
            message: "the node's writer is not running".into(),
        });
    };
    let limit = req.limit.unwrap_or(MAX_REPLAY).clamp(1, MAX_REPLAY);
    let mut after = match req.after.as_deref().map(parse_cursor) {
        None => None,
        Some(Some(a)) => Some(a),
        Some(None) => {
            return Err(ApiError::BadRequest(
                "after: expected <received_ms>.<seq>".into(),
            ))
        }
    };
    let (from, to) = (
        AtMs(req.from_ms.unwrap_or(0)),
        AtMs(req.to_ms.unwrap_or(u64::MAX)),
    );
    let ids: Arc<std::collections::HashSet<String>> = Arc::new(req.ids.iter().cloned().collect());
    let (a, tenant) = (api.clone(), req.tenant.clone());
    let ord = blocking(move || visible_ord(&a.store, &c.scope, &tenant)).await?;
    let _running = api.replays.begin(format!("archive:{}", req.tenant))?;
    let mut replayed = 0u64;
    let mut stop: Option<(String, Option<u32>)> = None;
    'pages: while (replayed as usize) < limit {
        let (a, ids2) = (api.clone(), ids.clone());
        let page = blocking(move || {
            Ok(archive::page_forward(
                &a.store,
                ord,
                from,
                to,
                after,
                REPLAY_PAGE,
                REPLAY_PAGE_BYTES,
            )?)
        })
        .await?;
        let end = page.next.is_none();
        let mut window = Vec::new();
        for item in page.items {
            if (replayed as usize) + window.len() >= limit {
                break;
            }
            if !ids2.is_empty() && !ids2.contains(&item.envelope.id) {
                after = Some((item.key.received, item.key.seq));
                continue;
            }
            // Charged as an ingested hook is: the tenant's rate and backlog.
            let now = ankusa_keyspace::now_ms();
            // (A point read at most, as ingest does it.)
            if let Some(r) = api.quotas.admit(&api.store, &req.tenant, now)? {
                stop = Some(match r {
                    crate::ingest::quota::Refusal::Rate { retry_after_s } => {
                        ("tenant_rate_limited".to_owned(), Some(retry_after_s))
                    }
                    crate::ingest::quota::Refusal::Backlog { .. } => {
                        ("tenant_backlog_full".to_owned(), None)
                    }
                });
                replayed += submit(&api, &writer, window).await?;
                break 'pages;
            }
            after = Some((item.key.received, item.key.seq));
            window.push(item.envelope);
        }
        replayed += submit(&api, &writer, window).await?;
        if end {
            break;
        }
    }
    let next = stop
        .as_ref()
        .and(after)
        .map(|(r, s)| format!("{}.{}", r.0, s.0));
    let audit = api.audit.op(
        &caller_name,
        "archive.replay",
        Some(&req.tenant),
        serde_json::json!({ "replayed": replayed, "from_ms": req.from_ms, "to_ms": req.to_ms, "ids": req.ids.len(), "stopped": stop.as_ref().map(|s| &s.0) }),
    );
    let a = api.clone();
    blocking(move || Ok(ankusa_queue::commit(&a.store, vec![audit], true)?)).await?;
    Ok(Json(Replayed {
        replayed,
        retry_after_s: stop.as_ref().and_then(|s| s.1),
        stopped: stop.map(|s| s.0),
        next,
    }))
}

/// `<received_ms>.<seq>`.
fn parse_cursor(s: &str) -> Option<(AtMs, Seq)> {
    let (r, q) = s.split_once('.')?;
    Some((AtMs(r.parse().ok()?), Seq(q.parse().ok()?)))
}

/// Commits `window` again through the writer's replay lane (each hook received now), and
/// awaits them: how many were accepted.
async fn submit(
    api: &Api,
    writer: &ankusa_queue::writer::WriterHandle,
    window: Vec<Envelope>,
) -> Result<u64, ApiError> {
    if window.is_empty() {
        return Ok(0);
    }
    let now = AtMs(ankusa_keyspace::now_ms());
    let mut replies = std::collections::VecDeque::with_capacity(window.len());
    let mut accepted = 0;
    // The oldest hook in the lane, awaited: its reply, and its place given back.
    async fn settle(
        front: Option<(
            tokio::sync::oneshot::Receiver<Reply>,
            tokio::sync::SemaphorePermit<'_>,
        )>,
    ) -> u64 {
        match front {
            Some((rx, _permit)) => u64::from(matches!(rx.await, Ok(Reply::Accepted { .. }))),
            None => 0,
        }
    }
    for env in window {
        // A place per hook in the writer's queue: live ingest keeps the rest of it. The
        // lane may be narrower than a page (a small `writer.queue_capacity`): with none
        // free, this replay's own oldest hook is awaited first, never a place it holds.
        let permit = loop {
            match api.replays.lane.try_acquire() {
                Ok(p) => break p,
                Err(tokio::sync::TryAcquireError::NoPermits) if !replies.is_empty() => {
                    accepted += settle(replies.pop_front()).await;
                }
                Err(_) => {
                    break api
                        .replays
                        .lane
                        .acquire()
                        .await
                        .map_err(|_| ApiError::Internal)?
                }
            }
        };
        let (tx, rx) = tokio::sync::oneshot::channel();
        // The hook committed again, as a span of its trace (with `log.spans` or OTLP): the
        // writer's batch follows from it as from an ingest request.
        let span = tracing::debug_span!(
            target: crate::telemetry::TARGET,
            "archive.replay",
            hook_id = env.id.as_str(),
            tenant = env.tenant_or_default(),
            source = env.source.as_str(),
        );
        crate::telemetry::in_hook_trace(&span, &env.id);
        let mut sub = Submission {
            envelope: Envelope {
                received_at: now,
                ..env
            },
            idempotency: None,
            from_archive: true,
            reply: tx,
            span,
        };
        // Ingest may have filled the queue all the same: wait for room rather than refuse.
        loop {
            match writer.try_submit_or_return(sub).map_err(|e| *e) {
                Ok(()) => break,
                Err(std::sync::mpsc::TrySendError::Full(back)) => {
                    sub = back;
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                Err(std::sync::mpsc::TrySendError::Disconnected(_)) => {
                    return Err(ApiError::Failed {
                        code: ErrorCode::Unavailable,
                        message: "the node is stopping".into(),
                    })
                }
            }
        }
        replies.push_back((rx, permit));
    }
    while !replies.is_empty() {
        accepted += settle(replies.pop_front()).await;
    }
    Ok(accepted)
}
