//! A quarantined request sent again (`POST /v1/quarantine/replay`): verified with its
//! source's secrets of now at the time it was received — a timestamp scheme's tolerance is
//! about its age then, not the replay's — and, when it passes, taken as a request of now
//! would be: its tenant's owner, admission, quotas, dedupe, the writer's synced commit. A
//! failure is only answered: not logged, counted or kept again.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Uri};

use super::IngestState;
use ankusa_api::error::ErrorBody;
use ankusa_api::ingest::IngestAnswer;
use ankusa_config::TenantFrom;

/// What a replayed request came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Replayed {
    /// Committed (or seen within the dedupe window: `duplicate`), with the hook's id.
    Ingested { id: String, duplicate: bool },
    /// It still fails verification, for this reason code.
    StillFailing { reason: String },
    /// Verified but not taken now (the source is gone, a quota, the node not ready…): the
    /// answer's status and message. The request stays in the quarantine.
    Refused { status: u16, message: String },
}

/// A stored request: its source, the tenant it named, its kept headers and its body.
pub struct Stored<'a> {
    pub source: &'a str,
    pub tenant: Option<&'a str>,
    pub headers: &'a [(String, String)],
    pub body: Vec<u8>,
    pub received_at_ms: u64,
}

/// Sends `req` through ingest again.
pub async fn replay(s: &IngestState, req: Stored<'_>) -> Replayed {
    let mut headers = HeaderMap::new();
    for (k, v) in req.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(k.as_bytes()),
            HeaderValue::from_str(v),
        ) {
            headers.append(n, v);
        }
    }
    let sources = s.sources.load_full();
    // The tenant is in the URL only for a source that takes it from there.
    let in_path = match sources.get(req.source).map(|src| &src.tenant) {
        Some(Some(TenantFrom::Path)) => req.tenant,
        _ => None,
    };
    let enc = crate::http::percent_encode;
    let path = match in_path {
        Some(t) => format!("/ingest/{}/{}", enc(req.source), enc(t)),
        None => format!("/ingest/{}", enc(req.source)),
    };
    let uri: Uri = path.parse().unwrap_or_else(|_| Uri::from_static("/ingest"));
    let (_, outcome, resp) = super::handle(
        s,
        &sources,
        req.source,
        in_path,
        &uri,
        headers,
        Body::from(req.body),
        Some(req.received_at_ms),
    )
    .await;
    let status = resp.status().as_u16();
    let bytes = axum::body::to_bytes(resp.into_body(), 64 << 10)
        .await
        .unwrap_or_default();
    if (200..300).contains(&status) {
        if let Ok(a) = serde_json::from_slice::<IngestAnswer>(&bytes) {
            return Replayed::Ingested {
                id: a.id,
                duplicate: a.duplicate.unwrap_or(false),
            };
        }
    }
    let refused = serde_json::from_slice::<ErrorBody>(&bytes).ok();
    match (outcome, refused) {
        (super::Outcome::Quarantined, Some(e)) => Replayed::StillFailing {
            reason: e.reason.unwrap_or_else(|| "unknown".into()),
        },
        (_, e) => Replayed::Refused {
            status,
            message: e.map(|e| e.message).unwrap_or_default(),
        },
    }
}
