//! Requests that failed verification: `GET /v1/quarantine` (newest first, with headers
//! and a body preview), `DELETE /v1/quarantine`, and `POST /v1/quarantine/replay` (verified
//! again, ingested when they pass).

use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::Json;
use serde::Deserialize;

use super::api::{blocking, caller, limit, Api, ApiError};
use super::sources::quarantine_visible;
use crate::ingest::replay::{Replayed, Stored};
use ankusa_api::admin::{
    Deleted, QuarantineItem, QuarantinePage, QuarantineReplayRequest, QuarantineReplayResult,
    QuarantineReplayed,
};
use ankusa_api_macros::answers;
use ankusa_queue::quarantine::Entry;
use base64::Engine;

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct QuarantineQuery {
    id: Option<u64>,
    before: Option<u64>,
    limit: Option<usize>,
}

/// `GET /v1/quarantine`: newest first, with headers and a body preview.
#[answers]
#[utoipa::path(
    get,
    path = "/v1/quarantine",
    tag = "admin",
    params(QuarantineQuery),
    responses(
        (status = 200, description = "Quarantined requests, newest first"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
    ),
    security(("bearer" = []))
)]
pub async fn quarantine_list(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<QuarantineQuery>,
) -> Result<Json<QuarantinePage>, ApiError> {
    let c = caller(&api, &headers)?;
    let n = limit(&api, q.limit);
    let a = api.clone();
    blocking(move || {
        let entries = ankusa_queue::quarantine::page(&a.store, q.before, n, |e| {
            quarantine_visible(&a.config.load(), &c.scope, &e.source)
        })?;
        let next = (entries.len() == n)
            .then(|| entries.last().map(|e| e.id))
            .flatten();
        let items = entries
            .into_iter()
            .map(|e| QuarantineItem {
                body_base64_preview: e.body.chars().take(1024).collect(),
                reason: code_of(&e),
                id: e.id,
                source: e.source,
                at_ms: e.at_ms,
                detail: e.reason,
                tenant: e.tenant,
                headers: e.headers,
            })
            .collect();
        Ok(Json(QuarantinePage { items, next }))
    })
    .await
}

/// `DELETE /v1/quarantine?id=N` (one) or without `id` (everything within scope).
#[answers]
#[utoipa::path(
    delete,
    path = "/v1/quarantine",
    tag = "admin",
    params(QuarantineQuery),
    responses(
        (status = 200, description = "Entries deleted"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn quarantine_delete(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(q): Query<QuarantineQuery>,
) -> Result<Json<Deleted>, ApiError> {
    let c = caller(&api, &headers)?;
    super::api::not_portal(&c)?;
    let a = api.clone();
    blocking(move || {
        let audit = a.audit.op(
            &c.name,
            "quarantine.delete",
            None,
            serde_json::json!({ "id": q.id }),
        );
        let visible = |e: &ankusa_queue::quarantine::Entry| {
            quarantine_visible(&a.config.load(), &c.scope, &e.source)
                && q.id.is_none_or(|id| id == e.id)
        };
        let removed =
            crate::ingest::quarantine::delete(&a.store, a.quarantine.as_deref(), visible, audit)?;
        if q.id.is_some() && removed == 0 {
            return Err(ApiError::NotFound("quarantined request"));
        }
        Ok(Json(Deleted {
            deleted: removed as u64,
        }))
    })
    .await
}

/// The most quarantined requests one replay sends again.
const MAX_QUARANTINE_REPLAY: usize = 1_000;

/// `POST /v1/quarantine/replay`: the selected requests (in the token's scope) verified
/// again with their sources' secrets of now, at the time each was received, and ingested
/// when they pass (`ingest::replay`); what was ingested, or found a duplicate, leaves the
/// quarantine. After a wrong secret is fixed, what it refused is not lost.
#[answers]
#[utoipa::path(
    post,
    path = "/v1/quarantine/replay",
    tag = "admin",
    request_body = QuarantineReplayRequest,
    responses(
        (status = 200, description = "What the requests sent again came to"),
        crate::http::AuthErrors,
        crate::http::BadRequest,
        crate::http::JsonBodyErrors,
    ),
    security(("bearer" = []))
)]
pub async fn quarantine_replay(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Json(req): Json<QuarantineReplayRequest>,
) -> Result<Json<QuarantineReplayed>, ApiError> {
    let c = caller(&api, &headers)?;
    super::api::not_portal(&c)?;
    let cap = req
        .limit
        .unwrap_or(MAX_QUARANTINE_REPLAY)
        .clamp(1, MAX_QUARANTINE_REPLAY);
    let a = api.clone();
    let sel = req.clone();
    let scope = c.scope.clone();
    let picked = blocking(move || {
        let config = a.config.load();
        let fits = |e: &Entry| {
            quarantine_visible(&config, &scope, &e.source)
                && (sel.ids.is_empty() || sel.ids.contains(&e.id))
                && sel.source.as_ref().is_none_or(|s| *s == e.source)
                && sel.reason.as_ref().is_none_or(|r| *r == code_of(e))
                && sel.from_ms.is_none_or(|t| e.at_ms >= t)
                && sel.to_ms.is_none_or(|t| e.at_ms < t)
        };
        // Oldest first: a replay commits them in the order they came.
        let mut picked = ankusa_queue::quarantine::page(&a.store, None, usize::MAX, fits)?;
        picked.reverse();
        picked.truncate(cap);
        Ok(picked)
    })
    .await?;
    let mut out = QuarantineReplayed {
        matched: picked.len() as u64,
        ..Default::default()
    };
    if req.dry_run || picked.is_empty() {
        return Ok(Json(out));
    }
    let ingest = api
        .ingest
        .get()
        .and_then(std::sync::Weak::upgrade)
        .ok_or_else(|| ApiError::Failed {
            code: ankusa_api::error::ErrorCode::NotReady,
            message: "ingest is not running".into(),
        })?;
    let mut gone = std::collections::HashSet::new();
    for e in &picked {
        let body = base64::engine::general_purpose::STANDARD
            .decode(&e.body)
            .unwrap_or_default();
        let replayed = crate::ingest::replay::replay(
            &ingest,
            Stored {
                source: &e.source,
                tenant: e.tenant.as_deref(),
                headers: &e.headers,
                body,
                received_at_ms: e.at_ms,
            },
        )
        .await;
        let (outcome, hook_id, why) = match replayed {
            Replayed::Ingested { id, duplicate } => {
                gone.insert(e.id);
                if duplicate {
                    out.duplicates += 1;
                    ("duplicate", Some(id), String::new())
                } else {
                    out.ingested += 1;
                    ("ingested", Some(id), String::new())
                }
            }
            Replayed::StillFailing { reason } => {
                out.still_failing += 1;
                ("still_failing", None, reason)
            }
            Replayed::Refused { status, message } => {
                out.refused += 1;
                ("refused", None, format!("{status}: {message}"))
            }
        };
        if out.results.len() < 100 {
            out.results.push(QuarantineReplayResult {
                id: e.id,
                outcome: outcome.into(),
                hook_id,
                why,
            });
        }
    }
    drop(ingest);
    let a = api.clone();
    let summary = (
        out.matched,
        out.ingested,
        out.duplicates,
        out.still_failing,
        out.refused,
    );
    blocking(move || {
        let audit = a.audit.op(
            &c.name,
            "quarantine.replay",
            None,
            serde_json::json!({
                "matched": summary.0, "ingested": summary.1, "duplicates": summary.2,
                "still_failing": summary.3, "refused": summary.4,
            }),
        );
        crate::ingest::quarantine::delete(
            &a.store,
            a.quarantine.as_deref(),
            |e| gone.contains(&e.id),
            audit,
        )?;
        Ok(())
    })
    .await?;
    Ok(Json(out))
}

/// An entry's reason code; a row kept before the codes gets it back from its words.
fn code_of(e: &Entry) -> String {
    if e.code.is_empty() {
        ankusa_verify::VerifyError::reason_of_words(&e.reason)
            .unwrap_or("unknown")
            .to_owned()
    } else {
        e.code.clone()
    }
}
