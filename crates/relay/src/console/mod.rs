//! The web console: the admin listener serves it at `/ui/` (docs/console.md).
//!
//! Server-rendered HTML with one small script (live refresh) and one stylesheet, both
//! embedded in the binary; nothing loads from another origin (`Content-Security-Policy`
//! of `'self'`). The console is a client of the admin API: each page calls the API
//! in-process with the signed-in token (or the portal link's credential), so it sees what
//! that token sees — tenant scopes, relay-wide answers, the audit trail — and no more.
//!
//! - Sign-in and sessions: [`session`]. A tenant portal (`/ui/portal/<credential>/…`) needs
//!   no cookie, so it works framed in another site (`admin.console.frame_ancestors`).
//! - Every POST carries the session's CSRF token and, when the browser sends an `Origin`,
//!   comes from this origin; anything else is 403 and changes nothing.
//! - Pages: [`pages`]; the charts' samples: [`history`]; HTML helpers: [`html`].

pub mod history;
pub mod html;
pub mod pages;
pub mod session;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;

use ankusa_api::error::{ErrorBody, ErrorCode};

use crate::admin::api::Api;
use crate::metrics::Metrics;
use history::History;
use session::Sessions;

/// The largest form a console POST may send.
const MAX_FORM: usize = 64 << 10;
/// The largest API answer a page reads (a hook's body included).
const MAX_ANSWER: usize = 32 << 20;

/// The console's state.
pub struct Console {
    pub api: Arc<Api>,
    /// The admin listener's own router: the API the pages call in-process.
    app: Router,
    pub sessions: Sessions,
    pub history: Arc<History>,
    pub metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Console {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Console").finish_non_exhaustive()
    }
}

/// Who is looking, and where their links start.
#[derive(Clone, Debug)]
pub struct Viewer {
    /// The bearer token the page's API calls carry.
    pub credential: String,
    pub name: String,
    pub admin: bool,
    /// The tenant portal's tenant.
    pub portal: Option<String>,
    /// `/ui` or `/ui/portal/<credential>`.
    pub base: String,
    pub csrf: String,
    /// The session id (a signed-in viewer).
    pub session: Option<String>,
}

/// An API call's failure, as the page shows it.
#[derive(Debug)]
pub struct CallError {
    pub status: StatusCode,
    pub code: ErrorCode,
    pub message: String,
}

impl CallError {
    pub fn new(status: StatusCode, code: ErrorCode, message: impl Into<String>) -> Self {
        CallError {
            status,
            code,
            message: message.into(),
        }
    }
}

/// A body for [`Console::call`].
pub fn body(b: &impl serde::Serialize) -> Option<Bytes> {
    serde_json::to_vec(b).ok().map(Bytes::from)
}

impl Console {
    pub fn new(api: Arc<Api>, app: Router, metrics: Arc<Metrics>, history: Arc<History>) -> Self {
        let c = api.config.load().admin.console.clone();
        Console {
            sessions: Sessions::new(
                Duration::from_millis(c.session_ttl_ms),
                c.max_sessions,
                metrics.console_sessions.clone(),
            )
            .with_max_age(Duration::from_millis(c.session_max_ms)),
            api,
            app,
            history,
            metrics,
        }
    }

    /// Calls the admin API in-process as `viewer`; its answer, read as the call's type.
    pub async fn call<T: DeserializeOwned>(
        &self,
        viewer: &Viewer,
        method: Method,
        path_and_query: &str,
        body: Option<Bytes>,
    ) -> Result<T, CallError> {
        use tower::ServiceExt;
        let mut req = Request::builder()
            .method(method)
            .uri(path_and_query)
            .header(
                header::AUTHORIZATION,
                format!("Bearer {}", viewer.credential),
            );
        if body.is_some() {
            req = req.header(header::CONTENT_TYPE, "application/json");
        }
        let req = req
            .body(Body::from(body.unwrap_or_default()))
            .map_err(|e| {
                CallError::new(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::BadRequest,
                    e.to_string(),
                )
            })?;
        let internal =
            |m: String| CallError::new(StatusCode::INTERNAL_SERVER_ERROR, ErrorCode::Internal, m);
        let resp = self
            .app
            .clone()
            .oneshot(req)
            .await
            .map_err(|e| internal(e.to_string()))?;
        let status = resp.status();
        let bytes = http_body_util::Limited::new(resp.into_body(), MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| internal(e.to_string()))?
            .to_bytes();
        if status.is_success() {
            return serde_json::from_slice(&bytes)
                .map_err(|e| internal(format!("{path_and_query} answered another shape: {e}")));
        }
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(e) => CallError::new(status, e.error, e.message),
            Err(_) => CallError::new(
                status,
                ErrorCode::Other,
                String::from_utf8_lossy(&bytes).into_owned(),
            ),
        })
    }
}

/// The console as a router to nest at `/ui`.
pub fn router(console: Arc<Console>) -> Router {
    Router::new().fallback(entry).with_state(console)
}

/// Whether the request came over TLS (a proxy in front says so).
fn over_tls(h: &HeaderMap) -> bool {
    h.get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("https"))
        || h.get(header::FORWARDED)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.to_ascii_lowercase().contains("proto=https"))
}

/// A POST from another origin: the browser's `Sec-Fetch-Site` says so, or (an older
/// browser) its `Origin` is not this host.
fn cross_origin(h: &HeaderMap) -> bool {
    if let Some(site) = h.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
        return site != "same-origin" && site != "none";
    }
    let Some(origin) = h.get(header::ORIGIN).and_then(|v| v.to_str().ok()) else {
        return false;
    };
    let host = h
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let origin_host = origin.split_once("://").map_or(origin, |(_, r)| r);
    origin == "null" || origin_host != host
}

/// The form fields of a POST body.
pub type Form = Vec<(String, String)>;

/// A form field.
pub fn field<'a>(form: &'a Form, name: &str) -> Option<&'a str> {
    form.iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
        .filter(|v| !v.is_empty())
}

fn parse_form(body: &[u8]) -> Form {
    let s = String::from_utf8_lossy(body);
    s.split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (form_decode(k), form_decode(v))
        })
        .collect()
}

fn form_decode(s: &str) -> String {
    crate::http::percent_decode(s, true)
}

/// The query string's parameters.
pub fn query(req_query: Option<&str>) -> Form {
    parse_form(req_query.unwrap_or("").as_bytes())
}

/// The console's Content-Security-Policy up to its `frame-ancestors` sources.
macro_rules! csp {
    () => {
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; base-uri 'none'; object-src 'none'; frame-ancestors"
    };
}

/// Every console request: assets, sign-in, the portal and the signed-in pages; the
/// security headers on every answer.
async fn entry(State(c): State<Arc<Console>>, req: Request) -> Response {
    let portal = req.uri().path().starts_with("/portal/");
    let mut resp = route(&c, req).await;
    let h = resp.headers_mut();
    // Only the portal may be framed, and only by the origins the configuration names.
    let ancestors = c.api.config.load().admin.console.frame_ancestors.join(" ");
    let frame = if portal && !ancestors.is_empty() {
        ancestors.as_str()
    } else {
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        "'none'"
    };
    // Never without a policy: one that does not make a header (which validation keeps
    // from happening) falls back to framing by none.
    let v = HeaderValue::from_str(&format!("{} {frame}", csp!())).unwrap_or_else(|_| {
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        HeaderValue::from_static(concat!(csp!(), " 'none'"))
    });
    h.insert(header::CONTENT_SECURITY_POLICY, v);
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    // No referrer leaves for another site (a portal's URL holds its credential); a form's
    // `Origin` still names this one.
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    if !h.contains_key(header::CACHE_CONTROL) {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    }
    resp
}

async fn route(c: &Arc<Console>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    let q = query(parts.uri.query());
    let method = parts.method.clone();
    if method != Method::GET && method != Method::POST {
        return pages::message(
            StatusCode::METHOD_NOT_ALLOWED,
            "Not allowed",
            "Use GET or POST.",
        );
    }
    if let Some(asset) = path.strip_prefix("/assets/") {
        return pages::asset(asset);
    }
    let form = if method == Method::POST {
        if cross_origin(&parts.headers) {
            return pages::message(
                StatusCode::FORBIDDEN,
                "Refused",
                "A form from another site.",
            );
        }
        match http_body_util::Limited::new(body, MAX_FORM).collect().await {
            Ok(b) => parse_form(&b.to_bytes()),
            Err(_) => {
                return pages::message(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Too large",
                    "The form is over 64 KiB.",
                )
            }
        }
    } else {
        Vec::new()
    };
    let secure = over_tls(&parts.headers);
    // The portal: its credential is its sign-in.
    let (viewer, rest) = if let Some(r) = path.strip_prefix("/portal/") {
        let (cred, rest) = r.split_once('/').unwrap_or((r, ""));
        let Some(caller) = c
            .api
            .tokens
            .load()
            .portal_caller(cred, ankusa_keyspace::now_ms())
        else {
            return pages::message(
                StatusCode::NOT_FOUND,
                "Link not valid",
                "This portal link has expired or is not valid. Ask for a new one.",
            );
        };
        let tenant = match &caller.scope {
            crate::admin::auth::Scope::Tenants(t) => t.iter().next().cloned().unwrap_or_default(),
            crate::admin::auth::Scope::Admin => String::new(),
        };
        let v = Viewer {
            credential: cred.to_owned(),
            name: caller.name,
            admin: false,
            portal: Some(tenant),
            base: format!("/ui/portal/{cred}"),
            csrf: session::portal_csrf(cred),
            session: None,
        };
        (v, format!("/{rest}"))
    } else {
        match path.as_str() {
            "/login" if method == Method::GET => return pages::login(None, StatusCode::OK),
            "/login" => return pages::sign_in(c, &form, secure).await,
            _ => {}
        }
        let Some((sid, s)) = session::cookie_of(&parts.headers)
            .and_then(|sid| c.sessions.get(&sid).map(|s| (sid, s)))
        else {
            if method == Method::GET {
                return redirect("/ui/login");
            }
            return pages::message(StatusCode::FORBIDDEN, "Signed out", "Sign in again.");
        };
        // A token a reload removed (or narrowed to backups or metrics) ends its sessions;
        // one it narrowed to tenants keeps them with that scope: what the session may do
        // is the token's now, never what it was at the sign-in.
        let caller = c
            .api
            .tokens
            .load()
            .caller_of(&s.credential)
            .filter(|caller| !caller.backup_only && !caller.metrics_only);
        let Some(caller) = caller else {
            c.sessions.remove(&sid);
            return redirect("/ui/login");
        };
        let v = Viewer {
            credential: s.credential,
            name: s.name,
            admin: caller.scope.is_admin(),
            portal: None,
            base: "/ui".into(),
            csrf: s.csrf,
            session: Some(sid),
        };
        (v, path.clone())
    };
    if method == Method::POST {
        let given = field(&form, "csrf").unwrap_or("");
        if !session::csrf_ok(&viewer.csrf, given) {
            return pages::message(
                StatusCode::FORBIDDEN,
                "Refused",
                "The form's CSRF token is missing or wrong: reload the page and try again.",
            );
        }
        if rest == "/logout" {
            if let Some(sid) = &viewer.session {
                c.sessions.remove(sid);
            }
            let mut r = redirect("/ui/login");
            if let Ok(v) = HeaderValue::from_str(&session::set_cookie(None, Duration::ZERO, secure))
            {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            return r;
        }
    }
    let fragment = parts.headers.contains_key("x-console-fragment");
    pages::dispatch(c, &viewer, &method, &rest, &q, &form, fragment).await
}

/// 303 to `to`.
pub fn redirect(to: &str) -> Response {
    let mut r = StatusCode::SEE_OTHER.into_response();
    if let Ok(v) = HeaderValue::from_str(to) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    r
}
