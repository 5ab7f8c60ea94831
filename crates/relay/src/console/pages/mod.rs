//! The console's pages. Each reads the admin API in-process ([`Console::call`]) as its
//! viewer and renders HTML; lists are the API's pages (bounded, with a cursor), never a
//! scan of everything.
//!
//! This file holds the page chrome, sign-in, the router ([`dispatch`]) and what the pages
//! share; a file per section: [`overview`], [`tenants`], [`hooks`], [`dlq`], [`sinks`],
//! [`records`] (archive, audit, quarantine).

mod dlq;
mod hooks;
mod overview;
mod records;
mod sinks;
mod tenants;

use std::fmt::Write;
use std::sync::Arc;

use super::html::{self, age, csrf_field, esc, hidden, time_el};
use super::{body, field, redirect, CallError, Console, Form, Viewer};
use crate::http::percent_encode as enc;
use ankusa_api::admin::{DlqItem, HookSummary};
use ankusa_api::error::ErrorCode;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("../assets/console.css");
const JS: &str = include_str!("../assets/console.js");

/// How often a live page refreshes itself, in ms.
pub const LIVE_MS: u64 = 5_000;

/// A static asset (no sign-in needed; cached for an hour).
pub fn asset(name: &str) -> Response {
    let (ctype, body) = match name {
        "console.css" => ("text/css; charset=utf-8", CSS),
        "console.js" => ("text/javascript; charset=utf-8", JS),
        _ => return message(StatusCode::NOT_FOUND, "Not found", "No such file."),
    };
    (
        [
            (header::CONTENT_TYPE, ctype),
            (header::CACHE_CONTROL, "public, max-age=3600"),
        ],
        body,
    )
        .into_response()
}

fn head(title: &str) -> String {
    format!(
        "<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\">\
<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
<title>{} · Ankusa</title><link rel=\"stylesheet\" href=\"/ui/assets/console.css\">\
<script src=\"/ui/assets/console.js\" defer></script></head>",
        esc(title)
    )
}

/// An HTML answer.
fn html_answer(status: StatusCode, body: String) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        body,
    )
        .into_response()
}

/// A page without navigation (sign-in, errors before sign-in).
pub fn message(status: StatusCode, title: &str, text: &str) -> Response {
    let body = format!(
        "{}<body><main id=\"main\" class=\"narrow\"><h1>{}</h1><p>{}</p>\
<p><a href=\"/ui/\">Back to the console</a></p></main></body></html>",
        head(title),
        esc(title),
        esc(text)
    );
    html_answer(status, body)
}

/// The sign-in form.
pub fn login(problem: Option<&str>, status: StatusCode) -> Response {
    let alert = problem
        .map(|p| format!("<p class=\"alert\" role=\"alert\">{}</p>", esc(p)))
        .unwrap_or_default();
    let body = format!(
        "{}<body><main id=\"main\" class=\"narrow\"><h1>Ankusa console</h1>{alert}\
<form method=\"post\" action=\"/ui/login\" class=\"stack\">\
<label for=\"token\">Admin token</label>\
<input id=\"token\" name=\"token\" type=\"password\" autocomplete=\"current-password\" required autofocus>\
<button type=\"submit\">Sign in</button></form>\
<p class=\"muted\">A token of <code>admin.tokens</code>: a tenant-scoped token sees only its tenants.</p>\
</main></body></html>",
        head("Sign in")
    );
    html_answer(status, body)
}

/// `POST /ui/login`: a session for a valid token.
pub async fn sign_in(c: &Arc<Console>, form: &Form, secure: bool) -> Response {
    let token = field(form, "token").unwrap_or("").trim().to_owned();
    let caller = c
        .api
        .tokens
        .load()
        .caller_of(&token)
        .filter(|caller| !caller.backup_only && !caller.metrics_only && !caller.portal);
    let Some(caller) = caller else {
        c.metrics.console_sign_in("refused");
        return login(
            Some("That token is not valid here."),
            StatusCode::UNAUTHORIZED,
        );
    };
    let admin = caller.scope.is_admin();
    match c.sessions.create(token, caller.name, admin) {
        Ok(sid) => {
            c.metrics.console_sign_in("ok");
            let ttl =
                std::time::Duration::from_millis(c.api.config.load().admin.console.session_ttl_ms);
            let mut r = redirect("/ui/");
            if let Ok(v) =
                HeaderValue::from_str(&super::session::set_cookie(Some(&sid), ttl, secure))
            {
                r.headers_mut().insert(header::SET_COOKIE, v);
            }
            r
        }
        Err(super::session::Full) => {
            c.metrics.console_sign_in("full");
            login(
                Some("The node holds as many sessions as admin.console.max_sessions allows; try again later."),
                StatusCode::SERVICE_UNAVAILABLE,
            )
        }
    }
}

/// A page of the console: its frame, or (a live refresh) only its content.
fn page(
    v: &Viewer,
    title: &str,
    active: &str,
    body: String,
    fragment: bool,
    live: bool,
) -> Response {
    page_with(v, title, active, body, fragment, live, StatusCode::OK)
}

fn page_with(
    v: &Viewer,
    title: &str,
    active: &str,
    body: String,
    fragment: bool,
    live: bool,
    status: StatusCode,
) -> Response {
    if fragment {
        return html_answer(status, body);
    }
    let mut nav = String::new();
    let mut links: Vec<(&str, String)> = Vec::new();
    match &v.portal {
        Some(t) => {
            links.push(("Tenant", format!("{}/tenants/{}", v.base, enc(t))));
            links.push(("Find a hook", format!("{}/hooks", v.base)));
            links.push(("Dead letters", format!("{}/dlq?tenant={}", v.base, enc(t))));
            links.push(("Archive", format!("{}/archive?tenant={}", v.base, enc(t))));
        }
        None => {
            if v.admin {
                links.push(("Overview", format!("{}/", v.base)));
            }
            links.push(("Tenants", format!("{}/tenants", v.base)));
            links.push(("Find a hook", format!("{}/hooks", v.base)));
            links.push(("Dead letters", format!("{}/dlq", v.base)));
            if v.admin {
                links.push(("Sinks", format!("{}/sinks", v.base)));
            }
            links.push(("Archive", format!("{}/archive", v.base)));
            links.push(("Audit", format!("{}/audit", v.base)));
            if v.admin {
                links.push(("Quarantine", format!("{}/quarantine", v.base)));
            }
        }
    }
    for (name, href) in links {
        let current = if name == active {
            " aria-current=\"page\""
        } else {
            ""
        };
        let _ = write!(
            nav,
            "<li><a href=\"{}\"{current}>{}</a></li>",
            esc(&href),
            esc(name)
        );
    }
    let who = match &v.portal {
        Some(t) => format!("<span class=\"who\">Portal of {}</span>", esc(t)),
        None => format!(
            "<span class=\"who\">{}</span><form method=\"post\" action=\"/ui/logout\" class=\"inline\">{}<button type=\"submit\" class=\"link\">Sign out</button></form>",
            esc(&v.name),
            csrf_field(&v.csrf)
        ),
    };
    let live_attr = if live {
        format!(" data-live=\"{LIVE_MS}\"")
    } else {
        String::new()
    };
    let out = format!(
        "{}<body><a class=\"skip\" href=\"#main\">Skip to content</a>\
<header><nav aria-label=\"Main\"><a class=\"brand\" href=\"{}/\">Ankusa</a><ul>{nav}</ul><div class=\"session\">{who}</div></nav></header>\
<main id=\"main\" tabindex=\"-1\"{live_attr}>{body}</main></body></html>",
        head(title),
        esc(&v.base)
    );
    html_answer(status, out)
}

fn error_page(v: &Viewer, e: CallError, fragment: bool) -> Response {
    let (title, text) = match e.status {
        StatusCode::NOT_FOUND => ("Not found", e.message.clone()),
        StatusCode::FORBIDDEN => ("Not allowed", "This needs an admin token.".to_owned()),
        _ => (
            "Something went wrong",
            format!("{} ({})", e.message, e.code),
        ),
    };
    let body = format!(
        "<h1>{}</h1><p class=\"alert\" role=\"alert\">{}</p>",
        esc(title),
        esc(&text)
    );
    page_with(v, title, "", body, fragment, false, e.status)
}

/// Routes a console request (its path below `/ui` or below the portal's prefix).
pub async fn dispatch(
    c: &Arc<Console>,
    v: &Viewer,
    method: &Method,
    path: &str,
    q: &Form,
    form: &Form,
    fragment: bool,
) -> Response {
    let segs: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(|s| crate::http::percent_decode(s, false))
        .collect();
    let segs: Vec<&str> = segs.iter().map(String::as_str).collect();
    let r = match (method.clone(), segs.as_slice()) {
        (Method::GET, []) => match (&v.portal, v.admin) {
            (Some(t), _) => tenants::tenant(c, v, t, fragment).await,
            (None, true) => overview::overview(c, v, fragment).await,
            (None, false) => tenants::tenants(c, v, q, fragment).await,
        },
        (Method::GET, ["tenants"]) => tenants::tenants(c, v, q, fragment).await,
        (Method::GET, ["tenants", t]) => tenants::tenant(c, v, t, fragment).await,
        // The tenant portal replays; deleting rows and holding delivery are the operators'.
        (Method::POST, ["tenants", t, "purge"]) if v.portal.is_none() => {
            tenants::purge(c, v, t, form).await
        }
        (Method::POST, ["tenants", t, action @ ("pause" | "resume")]) if v.portal.is_none() => {
            let r = c
                .call::<ankusa_api::admin::PauseState>(
                    v,
                    Method::POST,
                    &format!("/v1/tenants/{}/{action}", enc(t)),
                    None,
                )
                .await;
            r.map(|_| redirect(&format!("{}/tenants/{}", v.base, enc(t))))
        }
        (Method::POST, ["tenants", t, "portal-link"]) => tenants::portal_link(c, v, t, form).await,
        (Method::GET, ["hooks"]) => hooks::find_hook(c, v, q, fragment).await,
        (Method::GET, ["hooks", id]) => hooks::hook(c, v, id, q, fragment).await,
        (Method::GET, ["dlq"]) => dlq::dlq(c, v, q, fragment).await,
        (Method::POST, ["dlq", "replay"]) => dlq::dlq_replay(c, v, form).await,
        (Method::GET, ["sinks"]) if v.admin => sinks::sinks(c, v, fragment),
        (Method::GET, ["archive"]) => records::archive(c, v, q, fragment).await,
        (Method::POST, ["archive", "replay"]) => records::archive_replay(c, v, form).await,
        (Method::GET, ["audit"]) => records::audit(c, v, q, fragment).await,
        (Method::GET, ["quarantine"]) if v.admin => records::quarantine(c, v, q, fragment).await,
        (Method::POST, ["quarantine", "replay"]) if v.admin => {
            records::quarantine_replay(c, v, form).await
        }
        _ => Err(CallError::new(
            StatusCode::NOT_FOUND,
            ErrorCode::NotFound,
            "There is no such page.",
        )),
    };
    r.unwrap_or_else(|e| error_page(v, e, fragment))
}

type Page = Result<Response, CallError>;

fn count_cell(v: i64) -> String {
    format!("<span class=\"num\">{v}</span>")
}

/// How long ago `oldest_due_at_ms` of a tenant's or a node's view was, or a dash.
fn oldest_due(oldest_due_at_ms: Option<u64>) -> String {
    oldest_due_at_ms
        .map(|t| age(ankusa_keyspace::now_ms().saturating_sub(t)))
        .unwrap_or_else(|| "—".into())
}

/// A link to the console's page of `id` under `section`, around `inner` (HTML).
fn link(v: &Viewer, section: &str, id: &str, inner: &str) -> String {
    format!(
        "<a href=\"{}/{section}/{}\">{inner}</a>",
        esc(&v.base),
        enc(id)
    )
}

fn tenant_link(v: &Viewer, t: &str) -> String {
    link(v, "tenants", t, &esc(t))
}

fn hook_link(v: &Viewer, id: &str) -> String {
    link(v, "hooks", id, &format!("<code>{}</code>", esc(id)))
}

/// A time the form gives (`YYYY-MM-DD HH:MM`, UTC) in ms, or 400 naming the field.
fn time_param(field: &str, value: &str) -> Result<u64, CallError> {
    html::parse_time(value).ok_or_else(|| {
        CallError::new(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            format!("{field}: {value:?} is not a time (YYYY-MM-DD HH:MM, UTC)"),
        )
    })
}

/// The rows of a table of hooks: `HOOK_HEADERS`, with the tenant second if `with_tenant`.
fn hook_rows(v: &Viewer, items: &[HookSummary], with_tenant: bool) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|h| {
            let mut row = vec![hook_link(v, &h.id)];
            if with_tenant {
                row.push(tenant_link(v, &h.tenant));
            }
            row.extend([
                esc(&h.source),
                time_el(h.received_ms),
                format!("{} B", h.size),
                esc(&h.sinks.join(", ")),
            ]);
            row
        })
        .collect()
}

/// The columns of [`hook_rows`] (without the tenant's).
const HOOK_HEADERS: [&str; 5] = ["Hook", "Source", "Received", "Size", "Sinks"];

fn dead_rows(v: &Viewer, items: &[DlqItem], with_tenant: bool) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|d| {
            let id = d.id.as_str();
            let mut row = vec![time_el(d.at_ms)];
            if with_tenant {
                row.push(tenant_link(v, &d.tenant));
            }
            row.extend([
                hook_link(v, &d.hook_id),
                esc(&d.source),
                esc(&d.sink),
                count_cell(i64::from(d.attempts)),
                format!("{} {}", d.last_status, esc(&d.last_error)),
                format!(
                    "<form method=\"post\" action=\"{}/dlq/replay\" class=\"inline\">{}{}{}<button type=\"submit\" aria-label=\"Replay the dead delivery of {} to {}\">Replay</button></form>",
                    esc(&v.base),
                    csrf_field(&v.csrf),
                    hidden("ids", id),
                    hidden("tenant", &d.tenant),
                    esc(&d.hook_id),
                    esc(&d.sink)
                ),
            ]);
            row
        })
        .collect()
}

const DEAD_HEADERS: [&str; 7] = [
    "Dead since",
    "Hook",
    "Source",
    "Sink",
    "Attempts",
    "Last answer",
    "Action",
];

/// The wire name of an enum value of the API (`dead`, `acked`, `lease_expired`).
fn wire_name(v: &impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}
