//! What both listeners share: the one JSON error shape, the layer that puts every error
//! in it (the framework's own rejections, unknown paths and wrong methods included), the
//! readiness answer, and what a listener answers before the store is open. And the one
//! HTTP(S) client the node's outgoing calls to other nodes and the admin CLI use.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::Full;

/// The connector of [`Client`]: HTTP, or HTTPS with webpki roots.
pub type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// The client [`client`] builds.
pub type Client = hyper_util::client::legacy::Client<Https, Full<Bytes>>;

/// An HTTP(S) client for calls to a node's listeners (cluster forwarding, the admin CLI,
/// `backup pull`): keep-alive, webpki roots, `connect_timeout` to connect.
pub fn client(connect_timeout: std::time::Duration) -> Result<Client, rustls::Error> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    http.enforce_http(false);
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new()).build(
            hyper_rustls::HttpsConnectorBuilder::new()
                .with_provider_and_webpki_roots(rustls::crypto::ring::default_provider())?
                .https_or_http()
                .enable_http1()
                .wrap_connector(http),
        ),
    )
}

/// The one error body shape: `{"error": code, "message": ...}`.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": code, "message": message.into() })),
    )
        .into_response()
}

/// `/readyz`: 200 once `ready` and while the store takes writes; 503 `not_ready` while the
/// node starts, 503 `store_unavailable` while its writes fail (a full disk, a failed WAL
/// sync: the node acks nothing then, so traffic should go to another node).
pub fn readiness(ready: &AtomicBool, store: &crate::store::Store) -> Response {
    if !ready.load(Ordering::Acquire) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the node is starting: the store is opening or migrating",
        );
    }
    match store.health().error() {
        Some((e, _)) if store.health().failing() => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "store_unavailable",
            format!("the store refuses writes: {e}"),
        ),
        _ => (StatusCode::OK, "ready\n").into_response(),
    }
}

/// What a listener answers while the store opens: `/healthz` 200 (the process serves),
/// `/readyz` 503 `store_opening`, anything else 503 `not_ready` with `Retry-After: 1`.
pub fn booting() -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/readyz",
            get(|| async {
                error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "store_opening",
                    "the node is starting: the store is opening",
                )
            }),
        )
        .fallback(|| async {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                "not_ready",
                "the node is starting: the store is opening",
            );
            r.headers_mut().insert(
                axum::http::header::RETRY_AFTER,
                axum::http::HeaderValue::from(1),
            );
            r
        })
}

/// The stable code of an error status the framework answered by itself.
fn code_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST => "bad_request",
        StatusCode::UNAUTHORIZED => "unauthorized",
        StatusCode::FORBIDDEN => "forbidden",
        StatusCode::NOT_FOUND => "not_found",
        StatusCode::METHOD_NOT_ALLOWED => "method_not_allowed",
        StatusCode::PAYLOAD_TOO_LARGE => "body_too_large",
        StatusCode::UNSUPPORTED_MEDIA_TYPE => "unsupported_media_type",
        StatusCode::UNPROCESSABLE_ENTITY => "bad_request",
        s if s.is_server_error() => "internal",
        _ => "bad_request",
    }
}

/// The most bytes of a framework rejection's text kept as the error's message.
const MAX_REJECTION_TEXT: usize = 4096;

/// Response middleware for both listeners: an error answer (4xx, 5xx) that is not already
/// JSON — an extractor's rejection (a bad query, an unknown field, a missing content
/// type), the 404 of an unknown path, the 405 of a wrong method — is rewritten to the one
/// shape, its text (if any) as the message. Other answers pass untouched.
pub async fn json_errors(resp: Response) -> Response {
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (parts, body) = resp.into_parts();
    let text = axum::body::to_bytes(body, MAX_REJECTION_TEXT)
        .await
        .map(|b| String::from_utf8_lossy(&b).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("error")
            .to_ascii_lowercase()
    } else {
        text
    };
    let mut out = error(status, code_of(status), message);
    // Keep what the framework said besides the body (`Allow` on a 405, say).
    for (k, v) in parts.headers.iter() {
        if k != axum::http::header::CONTENT_TYPE && k != axum::http::header::CONTENT_LENGTH {
            out.headers_mut().insert(k.clone(), v.clone());
        }
    }
    out
}

/// The answer to a path no route serves.
pub async fn not_found() -> Response {
    error(StatusCode::NOT_FOUND, "not_found", "no such path")
}
