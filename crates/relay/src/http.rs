//! What both listeners share: the one JSON error shape, the layer that puts every error
//! in it (the framework's own rejections, unknown paths and wrong methods included), the
//! readiness answer, and what a listener answers before the store is open. And the one
//! HTTP(S) client the node's outgoing calls to other nodes and the admin CLI use.

pub mod guard;
pub mod serve;

use std::sync::atomic::{AtomicBool, Ordering};

use ankusa_api::error::{ErrorBody, ErrorCode};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::Full;

/// Percent-encodes a path segment or a query value: RFC 3986's unreserved characters
/// stay, every other byte is `%XX`.
pub fn percent_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Percent-decoding (and, in a query or a form, `+` as a space); a `%` not followed by
/// two hex digits stays as it is.
pub fn percent_decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(c) => {
                        out.push(c);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The connector of [`Client`]: HTTP, or HTTPS with webpki roots.
pub type Https = hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector>;

/// The client [`client`] builds.
pub type Client = hyper_util::client::legacy::Client<Https, Full<Bytes>>;

/// An HTTP(S) client for calls to a node's listeners (cluster forwarding, the admin CLI,
/// `backup pull`): keep-alive, webpki roots, `connect_timeout` to connect.
pub fn client(connect_timeout: std::time::Duration) -> Result<Client, rustls::Error> {
    let mut http = hyper_util::client::legacy::connect::HttpConnector::new();
    http.set_connect_timeout(Some(connect_timeout));
    Ok(
        hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build(https(http, &[])?),
    )
}

/// The client side of TLS the node's outbound connections use (sinks, NATS servers):
/// rustls on ring, trusting the web PKI's roots and `cas`.
pub fn tls_client(
    cas: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<rustls::ClientConfig, rustls::Error> {
    let mut roots = rustls::RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    for ca in cas {
        roots.add(ca.clone())?;
    }
    Ok(
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth(),
    )
}

/// HTTP/1.1 over plain HTTP or TLS on `http`, trusting the web PKI's roots (compiled into
/// the binary) and `cas`.
pub fn https<R>(
    mut http: hyper_util::client::legacy::connect::HttpConnector<R>,
    cas: &[rustls::pki_types::CertificateDer<'static>],
) -> Result<
    hyper_rustls::HttpsConnector<hyper_util::client::legacy::connect::HttpConnector<R>>,
    rustls::Error,
> {
    // The TLS layer takes `https://` URIs through the TCP connector.
    http.enforce_http(false);
    Ok(hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls_client(cas)?)
        .https_or_http()
        .enable_http1()
        .wrap_connector(http))
}

/// `url` without its user information and its query's values.
pub fn redact_url(url: &str) -> String {
    let r = ankusa_config::REDACTED;
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((_, host)) => format!("{r}@{host}"),
        None => authority.to_owned(),
    };
    let tail = match tail.split_once('?') {
        Some((path, _)) => format!("{path}?{r}"),
        None => tail.to_owned(),
    };
    if scheme.is_empty() {
        format!("{authority}{tail}")
    } else {
        format!("{scheme}://{authority}{tail}")
    }
}

/// The token of an `Authorization` value of the `Bearer` scheme, whose name is
/// case-insensitive (RFC 7235 §2.1): `bearer t`, `BEARER t` and `Bearer  t` all give `t`.
/// The admin API's tokens and the pull gateway's consumers both use it.
pub fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The one error body shape: `{"error": code, "message": ...}` ([`ErrorBody`]).
pub fn error(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Response {
    answer(status, code, message.into(), None)
}

/// [`error`] with the reason of a code that has several causes.
pub fn error_why(
    status: StatusCode,
    code: ErrorCode,
    message: impl Into<String>,
    reason: &str,
) -> Response {
    answer(status, code, message.into(), Some(reason.to_owned()))
}

fn answer(
    status: StatusCode,
    code: ErrorCode,
    message: String,
    reason: Option<String>,
) -> Response {
    let body = ErrorBody {
        error: code,
        message,
        reason,
    };
    (status, Json(body)).into_response()
}

// The error answers that many operations share, written once for the OpenAPI document:
// the handlers answer through `ApiError` and `error`, whose body is `ErrorBody`.

/// No valid token, or the node not ready: every authenticated admin call.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum AuthErrors {
    #[response(status = 401, description = "No valid token")]
    Unauthorized(ErrorBody),
    #[response(status = 503, description = "The node is not ready")]
    NotReady(ErrorBody),
}

/// A bad parameter or body.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum BadRequest {
    #[response(status = 400, description = "A bad parameter or body")]
    BadRequest(ErrorBody),
}

/// A thing that does not exist, or that the token's scope does not reach (the two look
/// alike, so a scope learns nothing of other tenants).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum NotFound {
    #[response(status = 404, description = "Not found, or outside the token's scope")]
    NotFound(ErrorBody),
}

/// An operation the token's scope does not allow.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum Forbidden {
    #[response(status = 403, description = "Not for this token's scope")]
    Forbidden(ErrorBody),
}

/// A JSON request body refused before the handler: too large, not JSON, a field unknown
/// or missing.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum JsonBodyErrors {
    #[response(status = 413, description = "The body is too large")]
    TooLarge(ErrorBody),
    #[response(status = 415, description = "The body is not JSON")]
    NotJson(ErrorBody),
    #[response(
        status = 422,
        description = "The JSON body has an unknown or missing field"
    )]
    BadFields(ErrorBody),
}

/// Every refusal of `POST /ingest/*`.
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum IngestErrors {
    #[response(status = 400, description = "No tenant, or a bad one (bad_tenant)")]
    BadTenant(ErrorBody),
    #[response(
        status = 401,
        description = "The signature does not verify (quarantined)"
    )]
    Quarantined(ErrorBody),
    #[response(status = 404, description = "No such source")]
    NoSource(ErrorBody),
    #[response(status = 413, description = "The body is too large")]
    TooLarge(ErrorBody),
    #[response(
        status = 431,
        description = "Forwarded headers over their bound (headers_too_large)"
    )]
    HeadersTooLarge(ErrorBody),
    #[response(
        status = 503,
        description = "Not ready, at capacity, the store failing, tenant_limit, or the owner unavailable"
    )]
    Unavailable(ErrorBody),
}

/// `r` with `Retry-After: secs`.
pub fn with_retry_after(mut r: Response, secs: u32) -> Response {
    r.headers_mut()
        .insert("retry-after", axum::http::HeaderValue::from(secs));
    r
}

/// `/readyz`: 200 once `ready` and while the store takes writes; 503 `not_ready` while the
/// node starts, 503 `store_unavailable` while its writes fail (a full disk, a failed WAL
/// sync: the node acks nothing then, so traffic should go to another node).
pub fn readiness(ready: &AtomicBool, store: &ankusa_queue::engine::Store) -> Response {
    if !ready.load(Ordering::Acquire) {
        return error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::NotReady,
            "the node is starting: the store is opening or migrating",
        );
    }
    match store.health().error() {
        Some((e, _)) if store.health().failing() => error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::StoreUnavailable,
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
                    ErrorCode::StoreOpening,
                    "the node is starting: the store is opening",
                )
            }),
        )
        .fallback(|| async {
            let mut r = error(
                StatusCode::SERVICE_UNAVAILABLE,
                ErrorCode::NotReady,
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
fn code_of(status: StatusCode) -> ErrorCode {
    match status {
        StatusCode::BAD_REQUEST => ErrorCode::BadRequest,
        StatusCode::UNAUTHORIZED => ErrorCode::Unauthorized,
        StatusCode::FORBIDDEN => ErrorCode::Forbidden,
        StatusCode::NOT_FOUND => ErrorCode::NotFound,
        StatusCode::METHOD_NOT_ALLOWED => ErrorCode::MethodNotAllowed,
        StatusCode::PAYLOAD_TOO_LARGE => ErrorCode::BodyTooLarge,
        StatusCode::UNSUPPORTED_MEDIA_TYPE => ErrorCode::UnsupportedMediaType,
        StatusCode::UNPROCESSABLE_ENTITY => ErrorCode::BadRequest,
        s if s.is_server_error() => ErrorCode::Internal,
        _ => ErrorCode::BadRequest,
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
    error(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such path")
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_url_loses_its_user_information_and_its_query() {
        assert_eq!(
            super::redact_url("https://user:pw@hooks.example.com:8443/in?token=t#x"),
            "https://<redacted>@hooks.example.com:8443/in?<redacted>"
        );
        assert_eq!(
            super::redact_url("http://127.0.0.1:9/hooks"),
            "http://127.0.0.1:9/hooks"
        );
    }
}
