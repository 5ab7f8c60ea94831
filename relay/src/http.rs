//! What both listeners share: the one JSON error shape and the readiness answer.

use std::sync::atomic::{AtomicBool, Ordering};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;

/// The one error body shape: `{"error": code, "message": ...}`.
pub fn error(status: StatusCode, code: &str, message: impl Into<String>) -> Response {
    (
        status,
        Json(serde_json::json!({ "error": code, "message": message.into() })),
    )
        .into_response()
}

/// `/readyz`: 200 once `ready`, else 503 `not_ready`.
pub fn readiness(ready: &AtomicBool) -> Response {
    if ready.load(Ordering::Acquire) {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the node is starting: the store is opening or migrating",
        )
    }
}
