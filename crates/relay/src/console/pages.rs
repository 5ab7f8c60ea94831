//! The console's pages. Each reads the admin API in-process ([`Console::call`]) as its
//! viewer and renders HTML; lists are the API's pages (bounded, with a cursor), never a
//! scan of everything.

use std::fmt::Write;
use std::sync::Arc;

use super::html::{self, age, csrf_field, esc, hidden, num, plural, table, time_el};
use super::{body, field, redirect, CallError, Console, Form, Viewer};
use crate::http::percent_encode as enc;
use ankusa_api::admin::{
    ArchivePage, ArchiveReplayRequest, AuditPage, AuditRecord, DlqItem, DlqPage, HookOut,
    HookSummary, PortalLink, PortalRequest, PurgeReport, QuarantineItem, QuarantinePage,
    RecentHooks, ReplayRequest, Replayed, Revived, TenantView, TenantsTop,
};
use ankusa_api::error::ErrorCode;
use ankusa_api::node::NodeStatus;
use axum::http::{header, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};

const CSS: &str = include_str!("assets/console.css");
const JS: &str = include_str!("assets/console.js");

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
            (Some(t), _) => tenant(c, v, t, fragment).await,
            (None, true) => overview(c, v, fragment).await,
            (None, false) => tenants(c, v, q, fragment).await,
        },
        (Method::GET, ["tenants"]) => tenants(c, v, q, fragment).await,
        (Method::GET, ["tenants", t]) => tenant(c, v, t, fragment).await,
        // The tenant portal replays; deleting rows and holding delivery are the operators'.
        (Method::POST, ["tenants", t, "purge"]) if v.portal.is_none() => purge(c, v, t, form).await,
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
        (Method::POST, ["tenants", t, "portal-link"]) => portal_link(c, v, t, form).await,
        (Method::GET, ["hooks"]) => find_hook(c, v, q, fragment).await,
        (Method::GET, ["hooks", id]) => hook(c, v, id, q, fragment).await,
        (Method::GET, ["dlq"]) => dlq(c, v, q, fragment).await,
        (Method::POST, ["dlq", "replay"]) => dlq_replay(c, v, form).await,
        (Method::GET, ["sinks"]) if v.admin => sinks(c, v, fragment),
        (Method::GET, ["archive"]) => archive(c, v, q, fragment).await,
        (Method::POST, ["archive", "replay"]) => archive_replay(c, v, form).await,
        (Method::GET, ["audit"]) => audit(c, v, q, fragment).await,
        (Method::GET, ["quarantine"]) if v.admin => quarantine(c, v, q, fragment).await,
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

// ----- Overview -----------------------------------------------------------------------------

async fn overview(c: &Arc<Console>, v: &Viewer, fragment: bool) -> Page {
    let me: NodeStatus = c.call(v, Method::GET, "/v1/node", None).await?;
    let mut nodes = vec![(
        c.api.cluster.me().unwrap_or("this node").to_owned(),
        Ok(me.clone()),
    )];
    if c.api.cluster.is_multi() {
        let mut h = axum::http::HeaderMap::new();
        if let Ok(b) = HeaderValue::from_str(&format!("Bearer {}", v.credential)) {
            h.insert(header::AUTHORIZATION, b);
        }
        let others = c
            .api
            .cluster
            .members()
            .iter()
            .filter(|m| Some(m.name.as_str()) != c.api.cluster.me())
            .map(|m| {
                let h = h.clone();
                async move {
                    let r = c
                        .api
                        .cluster
                        .forward_admin(m, Method::GET, "/v1/node", &h, bytes::Bytes::new())
                        .await;
                    let v = match r {
                        Ok(resp) if resp.status().is_success() => {
                            use http_body_util::BodyExt;
                            match resp.into_body().collect().await {
                                Ok(b) => serde_json::from_slice::<NodeStatus>(&b.to_bytes())
                                    .map_err(|e| e.to_string()),
                                Err(e) => Err(e.to_string()),
                            }
                        }
                        Ok(resp) => Err(format!("answered {}", resp.status())),
                        Err(e) => Err(e.reason),
                    };
                    (m.name.clone(), v)
                }
            });
        nodes.extend(futures_util::future::join_all(others).await);
    }
    let owned = |n: &NodeStatus| n.cluster.as_ref().map(|c| c.tenants_owned);
    let owned_total: u64 = nodes
        .iter()
        .filter_map(|(_, r)| r.as_ref().ok())
        .filter_map(owned)
        .sum();
    let rows: Vec<Vec<String>> = nodes
        .iter()
        .map(|(name, r)| match r {
            Ok(n) => {
                let share = match owned(n) {
                    Some(o) if owned_total > 0 => {
                        format!("{:.0} %", o as f64 * 100.0 / owned_total as f64)
                    }
                    _ => "100 %".into(),
                };
                let state = if n.write_error.is_some() {
                    "<span class=\"bad\">writes failing</span>".to_owned()
                } else if let Some(to) = n.migrating_to {
                    format!("migrating to format {to}")
                } else {
                    "<span class=\"good\">serving</span>".to_owned()
                };
                vec![
                    esc(name),
                    esc(&n.version),
                    format!("{} (supports {})", n.store_format, n.supported_format),
                    count_cell(i64::from(n.tenants)),
                    share,
                    state,
                ]
            }
            Err(e) => vec![
                esc(name),
                "—".into(),
                "—".into(),
                "—".into(),
                "—".into(),
                format!("<span class=\"bad\">unavailable: {}</span>", esc(e)),
            ],
        })
        .collect();
    let counters = &me.counters;
    let samples = c.history.node();
    // The charts span the samples taken (an hour once the node has run that long).
    let span = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) => (b.at_ms.saturating_sub(a.at_ms) / 1000).max(1),
        _ => super::history::INTERVAL_MS / 1000,
    };
    let ingest = super::history::rates(&samples, |s| s.accepted);
    let delivery = super::history::rates(&samples, |s| s.delivered);
    let backlog: Vec<f64> = samples.iter().map(|s| s.backlog as f64).collect();
    let oldest = oldest_due(me.oldest_due_at_ms);
    let body = format!(
        "<h1>Overview</h1>\
<section aria-labelledby=\"h-nodes\"><h2 id=\"h-nodes\">Nodes</h2>{}</section>\
<section aria-labelledby=\"h-now\"><h2 id=\"h-now\">This node now</h2><dl class=\"facts\">\
<div><dt>Pending</dt><dd>{}</dd></div><div><dt>Scheduled</dt><dd>{}</dd></div>\
<div><dt>In flight</dt><dd>{}</dd></div><div><dt>Dead</dt><dd>{}</dd></div>\
<div><dt>Oldest due</dt><dd>{oldest}</dd></div><div><dt>Store</dt><dd>{} MiB</dd></div></dl></section>\
<section aria-labelledby=\"h-charts\"><h2 id=\"h-charts\">The last hour on this node</h2><div class=\"charts\">{}{}{}</div>\
<p class=\"muted\">A sample every {} s since the node started ({} so far).</p></section>",
        table("Nodes of this Relay", &["Node", "Version", "Store format", "Tenants", "Ownership share", "State"], &rows),
        counters.pending,
        counters.scheduled,
        counters.inflight,
        counters.dead,
        me.store_bytes.unwrap_or(0) >> 20,
        html::chart("Ingest", " hooks/s", &ingest, span),
        html::chart("Delivery", " hooks/s", &delivery, span),
        html::chart("Backlog", " rows", &backlog, span),
        super::history::INTERVAL_MS / 1000,
        samples.len(),
    );
    Ok(page(v, "Overview", "Overview", body, fragment, true))
}

// ----- Tenants -----------------------------------------------------------------------------

/// The tenants with the most work, as `GET /v1/tenants?top=50` answers: an admin's from the
/// ranking the history keeps (a minute old at most; each row's counters read now), so the
/// page reads 50 tenants, not the 10⁴ the ranking reads. A tenant scope, and the first
/// seconds of a node, ask the API itself.
async fn busiest(c: &Arc<Console>, v: &Viewer) -> Result<TenantsTop, CallError> {
    let ranked = if v.admin { c.history.top() } else { None };
    let Some(ranked) = ranked else {
        return c
            .call(
                v,
                Method::GET,
                &format!("/v1/tenants?top={TENANT_PAGE}"),
                None,
            )
            .await;
    };
    let paths: Vec<String> = ranked
        .iter()
        .take(TENANT_PAGE)
        .map(|t| format!("/v1/tenants/{}", enc(t)))
        .collect();
    let (total, views) = tokio::join!(
        c.call::<TenantsTop>(v, Method::GET, "/v1/tenants?prefix=&top=1", None),
        futures_util::future::join_all(paths.iter().map(|p| c.call::<TenantView>(
            v,
            Method::GET,
            p,
            None
        ))),
    );
    let total = total?.total;
    let mut tenants = Vec::new();
    for view in views {
        match view {
            Ok(view) => tenants.push(view),
            // Erased since the ranking.
            Err(e) if e.status == StatusCode::NOT_FOUND => {}
            Err(e) => return Err(e),
        }
    }
    Ok(TenantsTop {
        tenants,
        total,
        ..TenantsTop::default()
    })
}

/// A page of the tenants list.
pub const TENANT_PAGE: usize = 50;

async fn tenants(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    if let Some(t) = &v.portal {
        return Ok(redirect(&format!("{}/tenants/{}", v.base, enc(t))));
    }
    let search = field(q, "q").unwrap_or("").trim().to_owned();
    let after = field(q, "after");
    let listing = !search.is_empty() || after.is_some();
    let r = if listing {
        let path = format!(
            "/v1/tenants?prefix={}&top={TENANT_PAGE}{}",
            enc(&search),
            after
                .map(|a| format!("&after={}", enc(a)))
                .unwrap_or_default()
        );
        c.call::<TenantsTop>(v, Method::GET, &path, None).await?
    } else {
        busiest(c, v).await?
    };
    let rows: Vec<Vec<String>> = r
        .tenants
        .iter()
        .map(|t| {
            let name = t.tenant.as_str();
            let ctr = &t.counters;
            let state = if t.paused_since_ms.is_some() {
                "paused"
            } else if t.erasing_since_ms.is_some() {
                "erasing"
            } else {
                ""
            };
            vec![
                tenant_link(v, name),
                count_cell(ctr.pending),
                count_cell(ctr.scheduled),
                count_cell(ctr.inflight),
                count_cell(ctr.dead),
                oldest_due(t.oldest_due_at_ms),
                html::sparkline(
                    &format!("Backlog of {name} over the last hour"),
                    &c.history.tenant(name),
                ),
                state.into(),
            ]
        })
        .collect();
    let next = r.next.as_deref().map(|n| {
        format!(
            "<p><a rel=\"next\" href=\"{}/tenants?q={}&amp;after={}\">Next page</a></p>",
            esc(&v.base),
            enc(&search),
            enc(n)
        )
    });
    let what = if listing {
        format!("Tenants whose id starts with “{}”", esc(&search))
    } else {
        "Tenants with work, the most pending first (ranked each minute; counters now)".to_owned()
    };
    let body = format!(
        "<h1>Tenants</h1><p>{} in all.</p>\
<form method=\"get\" action=\"{}/tenants\" role=\"search\" class=\"row\">\
<label for=\"q\">Search tenants by id prefix</label><input id=\"q\" name=\"q\" value=\"{}\" type=\"search\">\
<button type=\"submit\">Search</button></form>{}{}",
        r.total,
        esc(&v.base),
        esc(&search),
        table(&what, &["Tenant", "Pending", "Scheduled", "In flight", "Dead", "Oldest due", "Backlog, 1 h", "State"], &rows),
        next.unwrap_or_default()
    );
    Ok(page(v, "Tenants", "Tenants", body, fragment, true))
}

fn hook_rows(v: &Viewer, items: &[HookSummary]) -> Vec<Vec<String>> {
    items
        .iter()
        .map(|h| {
            vec![
                hook_link(v, &h.id),
                esc(&h.source),
                time_el(h.received_ms),
                format!("{} B", h.size),
                esc(&h.sinks.join(", ")),
            ]
        })
        .collect()
}

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

async fn tenant(c: &Arc<Console>, v: &Viewer, t: &str, fragment: bool) -> Page {
    let te = enc(t);
    let paths = [
        format!("/v1/tenants/{te}"),
        format!("/v1/dlq?tenant={te}&limit=20"),
        format!("/v1/hooks?tenant={te}&limit=20"),
    ];
    let (view, dead, recent) = tokio::join!(
        c.call::<TenantView>(v, Method::GET, &paths[0], None),
        c.call::<DlqPage>(v, Method::GET, &paths[1], None),
        c.call::<RecentHooks>(v, Method::GET, &paths[2], None),
    );
    let (view, dead, recent) = (view?, dead?, recent?);
    let ctr = &view.counters;
    let cfg = c.api.config.load();
    let sources: Vec<Vec<String>> = cfg
        .sources
        .iter()
        .filter_map(|src| {
            let own = match crate::admin::sources::source_tenant(&cfg, &src.id) {
                Some(fixed) if fixed != t => return None,
                Some(_) => "this tenant's own",
                None => "shared (tenant from the request)",
            };
            Some(vec![
                format!("<code>{}</code>", esc(&src.id)),
                own.to_owned(),
                esc(&src.route),
            ])
        })
        .collect();
    let paused = view.paused_since_ms;
    let base = esc(&v.base);
    let csrf = csrf_field(&v.csrf);
    let operator = v.portal.is_none();
    let pause_form = if operator {
        format!(
            "<form method=\"post\" action=\"{base}/tenants/{te}/{}\" class=\"inline\">{csrf}<button type=\"submit\">{}</button></form>",
            if paused.is_some() { "resume" } else { "pause" },
            if paused.is_some() { "Resume delivery" } else { "Pause delivery" },
        )
    } else {
        String::new()
    };
    let dead_n = ctr.dead;
    let mut replay_form = String::new();
    if dead_n > 0 {
        replay_form = format!(
            "<form method=\"post\" action=\"{base}/dlq/replay\" class=\"inline\">{csrf}{}<button type=\"submit\">Replay all dead rows…</button></form>",
            hidden("tenant", t)
        );
        if operator {
            let _ = write!(
                replay_form,
                "<form method=\"post\" action=\"{base}/tenants/{te}/purge\" class=\"inline\">{csrf}<button type=\"submit\" class=\"danger\">Purge dead rows…</button></form>"
            );
        }
    }
    let portal_form = if v.admin {
        format!(
            "<details><summary>Share a portal link</summary><form method=\"post\" action=\"{base}/tenants/{te}/portal-link\" class=\"row\">{csrf}\
<label for=\"ttl\">Valid for (hours)</label><input id=\"ttl\" name=\"hours\" type=\"number\" min=\"1\" value=\"24\"><button type=\"submit\">Create link</button></form></details>"
        )
    } else {
        String::new()
    };
    let oldest = oldest_due(view.oldest_due_at_ms);
    let body = format!(
        "<h1>Tenant <span class=\"id\">{}</span></h1>{}\
<dl class=\"facts\"><div><dt>Pending</dt><dd>{}</dd></div><div><dt>Scheduled</dt><dd>{}</dd></div>\
<div><dt>In flight</dt><dd>{}</dd></div><div><dt>Dead</dt><dd>{dead_n}</dd></div><div><dt>Queued bytes</dt><dd>{}</dd></div>\
<div><dt>Oldest due</dt><dd>{oldest}</dd></div></dl>\
<figure class=\"chart small\"><figcaption>Backlog, a sample a minute</figcaption>{}</figure>\
<div class=\"actions\">{pause_form}{replay_form}</div>{portal_form}\
<form method=\"get\" action=\"{base}/hooks\" class=\"row\" role=\"search\">{}\
<label for=\"delivery\">Find by the provider's delivery id</label><input id=\"delivery\" name=\"delivery\"><button type=\"submit\">Find</button></form>\
<section aria-labelledby=\"h-src\"><h2 id=\"h-src\">Sources</h2>{}</section>\
<section aria-labelledby=\"h-dead\"><h2 id=\"h-dead\">Dead letters</h2>{}<p><a href=\"{base}/dlq?tenant={te}\">All dead letters of this tenant</a></p></section>\
<section aria-labelledby=\"h-recent\"><h2 id=\"h-recent\">Recent hooks</h2>{}{}</section>",
        esc(t),
        paused
            .map(|p| format!("<p class=\"alert\">Delivery paused since {}.</p>", time_el(p)))
            .unwrap_or_default(),
        ctr.pending,
        ctr.scheduled,
        ctr.inflight,
        ctr.bytes,
        html::sparkline(&format!("Backlog of {t} over the last hour"), &c.history.tenant(t)),
        hidden("tenant", t),
        table("Sources this tenant's hooks can come in through", &["Source", "Tenant", "Route"], &sources),
        table("The newest dead letters", &DEAD_HEADERS, &dead_rows(v, &dead.items, false)),
        table("The newest hooks the node's log keeps", &["Hook", "Source", "Received", "Size", "Sinks"], &hook_rows(v, &recent.items)),
        if recent.truncated {
            format!("<p class=\"muted\">Read among the node's newest {} hooks.</p>", crate::admin::hooks::MAX_RECENT_SCAN)
        } else {
            String::new()
        },
    );
    Ok(page(
        v,
        &format!("Tenant {t}"),
        "Tenant",
        body,
        fragment,
        true,
    ))
}

async fn purge(c: &Arc<Console>, v: &Viewer, t: &str, form: &Form) -> Page {
    let te = enc(t);
    if field(form, "confirm") != Some("yes") {
        let view: TenantView = c
            .call(v, Method::GET, &format!("/v1/tenants/{te}"), None)
            .await?;
        let dead = view.counters.dead;
        let body = format!(
            "<h1>Purge the dead rows of {}?</h1><p class=\"alert\" role=\"alert\">This deletes <strong>{}</strong> for good. It cannot be undone.</p>\
<form method=\"post\" action=\"{}/tenants/{te}/purge\" class=\"inline\">{}<input type=\"hidden\" name=\"confirm\" value=\"yes\"><button type=\"submit\" class=\"danger\" autofocus>Delete {}</button></form> <a href=\"{}/tenants/{te}\">Cancel</a>",
            esc(t),
            plural(dead, "dead row"),
            esc(&v.base),
            plural(dead, "row"),
            csrf_field(&v.csrf),
            esc(&v.base),
        );
        return Ok(page(v, "Confirm purge", "Tenant", body, false, false));
    }
    let r: PurgeReport = c
        .call(
            v,
            Method::DELETE,
            &format!("/v1/tenants/{te}/queue?kinds=dead"),
            None,
        )
        .await?;
    let body = format!(
        "<h1>Purged</h1><p role=\"status\">{} of {} deleted.</p><p><a href=\"{}/tenants/{te}\">Back to the tenant</a></p>",
        plural(r.dead as i64, "dead row"),
        esc(t),
        esc(&v.base)
    );
    Ok(page(v, "Purged", "Tenant", body, false, false))
}

async fn portal_link(c: &Arc<Console>, v: &Viewer, t: &str, form: &Form) -> Page {
    let hours: u64 = field(form, "hours")
        .and_then(|h| h.parse().ok())
        .unwrap_or(24);
    let req = PortalRequest {
        tenant: t.to_owned(),
        ttl_ms: Some(hours.saturating_mul(3_600_000)),
    };
    let r: PortalLink = c
        .call(v, Method::POST, "/v1/portal-links", body(&req))
        .await?;
    let body = format!(
        "<h1>Portal link for {}</h1><p>Valid until {}. Anyone with it sees this tenant, and only it, in the console.</p>\
<label for=\"link\">Link (a path on this listener; any node with the same portal secret opens it)</label>\
<input id=\"link\" readonly value=\"{}\" class=\"wide\"><p><a href=\"{}\">Open it</a></p>",
        esc(t),
        time_el(r.expires_ms),
        esc(&r.path),
        esc(&r.path),
    );
    Ok(page(v, "Portal link", "Tenants", body, false, false))
}

// ----- Hooks ---------------------------------------------------------------------------------

async fn find_hook(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    if let Some(id) = field(q, "id") {
        return Ok(redirect(&format!("{}/hooks/{}", v.base, enc(id.trim()))));
    }
    let tenant_default = v.portal.clone().unwrap_or_default();
    let tenant = field(q, "tenant")
        .map(str::to_owned)
        .unwrap_or(tenant_default);
    if let (Some(d), false) = (field(q, "delivery"), tenant.is_empty()) {
        let h: HookOut = c
            .call(
                v,
                Method::GET,
                &format!("/v1/tenants/{}/deliveries/{}", enc(&tenant), enc(d.trim())),
                None,
            )
            .await?;
        return Ok(page(
            v,
            "Hook",
            "Find a hook",
            render_hook(v, &h, false),
            fragment,
            true,
        ));
    }
    let base = esc(&v.base);
    let tenant_input = if v.portal.is_some() {
        hidden("tenant", &tenant)
    } else {
        format!("<label for=\"tenant\">Tenant</label><input id=\"tenant\" name=\"tenant\" value=\"{}\" required>", esc(&tenant))
    };
    let body = format!(
        "<h1>Find a hook</h1>\
<form method=\"get\" action=\"{base}/hooks\" class=\"stack\" role=\"search\"><h2>By hook id</h2>\
<label for=\"id\">Hook id</label><input id=\"id\" name=\"id\" required placeholder=\"hk_…\"><button type=\"submit\">Find by id</button></form>\
<form method=\"get\" action=\"{base}/hooks\" class=\"stack\" role=\"search\"><h2>By the provider's delivery id</h2>\
<p class=\"muted\">X-GitHub-Delivery, a Stripe event id, webhook-id: the source's idempotency key, while its dedupe window lasts.</p>\
{tenant_input}<label for=\"delivery\">Delivery id</label><input id=\"delivery\" name=\"delivery\" required><button type=\"submit\">Find by delivery id</button></form>"
    );
    Ok(page(v, "Find a hook", "Find a hook", body, fragment, false))
}

async fn hook(c: &Arc<Console>, v: &Viewer, id: &str, q: &Form, fragment: bool) -> Page {
    let with_body = field(q, "body") == Some("1");
    let h: HookOut = c
        .call(
            v,
            Method::GET,
            &format!(
                "/v1/hooks/{}{}",
                enc(id),
                if with_body { "?body=true" } else { "" }
            ),
            None,
        )
        .await?;
    Ok(page(
        v,
        &format!("Hook {id}"),
        "Find a hook",
        render_hook(v, &h, with_body),
        fragment,
        !with_body,
    ))
}

fn render_hook(v: &Viewer, h: &HookOut, with_body: bool) -> String {
    let base = esc(&v.base);
    let id = h.id.as_str();
    let mut out = format!(
        "<h1>Hook <code class=\"id\">{}</code></h1><dl class=\"facts\">\
<div><dt>Tenant</dt><dd>{}</dd></div><div><dt>Source</dt><dd>{}</dd></div>\
<div><dt>Received</dt><dd>{}</dd></div><div><dt>Size</dt><dd>{} B</dd></div><div><dt>Content type</dt><dd>{}</dd></div></dl>",
        esc(id),
        tenant_link(v, &h.tenant),
        esc(&h.source),
        time_el(h.received_ms),
        h.size,
        esc(&h.content_type),
    );
    if !h.headers.is_empty() {
        let rows: Vec<Vec<String>> = h
            .headers
            .iter()
            .map(|(k, val)| vec![format!("<code>{}</code>", esc(k)), esc(val)])
            .collect();
        out.push_str(&table(
            "Provider headers forwarded to sinks",
            &["Header", "Value"],
            &rows,
        ));
    }
    for sink in &h.sinks {
        let name = sink.sink.as_str();
        let state = wire_name(&sink.state);
        let _ = write!(
            out,
            "<section class=\"sink\" aria-label=\"Delivery to {}\"><h2>To <code>{}</code> <span class=\"state state-{}\">{}</span></h2><p>{}{}</p>",
            esc(name),
            esc(name),
            esc(&state),
            esc(&state),
            plural(i64::from(sink.attempts), "attempt"),
            sink.next_attempt_ms
                .map(|t| format!("; next attempt {}", time_el(t)))
                .unwrap_or_default(),
        );
        let rows: Vec<Vec<String>> = sink
            .events
            .iter()
            .map(|e| {
                vec![
                    time_el(e.at_ms),
                    esc(&wire_name(&e.kind)),
                    if e.attempt > 0 {
                        e.attempt.to_string()
                    } else {
                        String::new()
                    },
                    e.status.map(|s| s.to_string()).unwrap_or_default(),
                    e.latency_ms
                        .map(|l| format!("{} ms", num(l)))
                        .unwrap_or_default(),
                    esc(&e.error_class.map(|c| wire_name(&c)).unwrap_or_default()),
                    esc(&e.error),
                    e.next_at_ms.map(time_el).unwrap_or_default(),
                ]
            })
            .collect();
        out.push_str(&table(
            &format!("Timeline of the delivery to {name}"),
            &[
                "At",
                "Event",
                "Attempt",
                "Status",
                "Latency",
                "Error class",
                "Error",
                "Next attempt",
            ],
            &rows,
        ));
        out.push_str("</section>");
    }
    if with_body {
        let body = h
            .body
            .as_deref()
            .map(esc)
            .or_else(|| {
                h.body_base64
                    .as_deref()
                    .map(|b| format!("(base64) {}", esc(b)))
            })
            .unwrap_or_else(|| "The body is no longer stored.".into());
        let _ = write!(out, "<section aria-labelledby=\"h-body\"><h2 id=\"h-body\">Body</h2><pre class=\"body\">{body}</pre></section>");
    } else if h.stored {
        let _ = write!(
            out,
            "<p><a href=\"{base}/hooks/{}?body=1\">Show the body</a></p>",
            enc(id)
        );
    } else {
        out.push_str(
            "<p class=\"muted\">The body is no longer stored (delivered and reclaimed).</p>",
        );
    }
    out
}

/// The wire name of an enum value of the API (`dead`, `acked`, `lease_expired`).
fn wire_name(v: &impl serde::Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

// ----- Dead letters --------------------------------------------------------------------------

async fn dlq(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    let tenant = field(q, "tenant")
        .map(str::to_owned)
        .or_else(|| v.portal.clone());
    let source = field(q, "source");
    let from = field(q, "from");
    let to = field(q, "to");
    let mut path = "/v1/dlq?limit=50".to_owned();
    let mut carry = String::new();
    for (k, val) in [("tenant", tenant.as_deref()), ("source", source)] {
        if let Some(x) = val {
            let _ = write!(path, "&{k}={}", enc(x));
            let _ = write!(carry, "&amp;{k}={}", enc(x));
        }
    }
    for (k, val) in [("from", from), ("to", to)] {
        if let Some(x) = val {
            let _ = write!(path, "&{k}_ms={}", time_param(k, x)?);
            let _ = write!(carry, "&amp;{k}={}", enc(x));
        }
    }
    if let Some(b) = field(q, "before") {
        let _ = write!(path, "&before={}", enc(b));
    }
    let r: DlqPage = c.call(v, Method::GET, &path, None).await?;
    let mut headers = DEAD_HEADERS.to_vec();
    headers.insert(1, "Tenant");
    let base = esc(&v.base);
    let csrf = csrf_field(&v.csrf);
    let next = r.next.as_deref().map(|n| {
        format!(
            "<p><a rel=\"next\" href=\"{base}/dlq?before={}{carry}\">Older</a></p>",
            enc(n)
        )
    });
    let selection: String = [
        ("tenant", tenant.as_deref()),
        ("source", source),
        ("from", from),
        ("to", to),
    ]
    .into_iter()
    .filter_map(|(k, val)| val.map(|x| hidden(k, x)))
    .collect();
    let bulk = if tenant.is_some() || source.is_some() || from.is_some() || to.is_some() {
        format!(
            "<form method=\"post\" action=\"{base}/dlq/replay\" class=\"inline\">{csrf}{selection}<button type=\"submit\">Replay every row that matches…</button></form>"
        )
    } else {
        "<p class=\"muted\">Filter by tenant, source or time to replay rows in bulk.</p>".to_owned()
    };
    let purge = match (&tenant, source, from, to) {
        (Some(t), None, None, None) if v.portal.is_none() => format!(
            "<form method=\"post\" action=\"{base}/tenants/{}/purge\" class=\"inline\">{csrf}<button type=\"submit\" class=\"danger\">Purge this tenant's dead rows…</button></form>",
            enc(t)
        ),
        _ => String::new(),
    };
    let tenant_input = if v.portal.is_some() {
        String::new()
    } else {
        format!(
            "<div><label for=\"f-tenant\">Tenant</label><input id=\"f-tenant\" name=\"tenant\" value=\"{}\"></div>",
            esc(tenant.as_deref().unwrap_or(""))
        )
    };
    let body = format!(
        "<h1>Dead letters</h1>\
<form method=\"get\" action=\"{base}/dlq\" class=\"filters\" aria-label=\"Filter dead letters\">{tenant_input}\
<div><label for=\"f-source\">Source</label><input id=\"f-source\" name=\"source\" value=\"{}\"></div>\
<div><label for=\"f-from\">From (UTC)</label><input id=\"f-from\" name=\"from\" placeholder=\"YYYY-MM-DD HH:MM\" value=\"{}\"></div>\
<div><label for=\"f-to\">To (UTC)</label><input id=\"f-to\" name=\"to\" placeholder=\"YYYY-MM-DD HH:MM\" value=\"{}\"></div>\
<button type=\"submit\">Filter</button></form><div class=\"actions\">{bulk}{purge}</div>{}{}",
        esc(source.unwrap_or("")),
        esc(from.unwrap_or("")),
        esc(to.unwrap_or("")),
        table("Dead deliveries, newest first", &headers, &dead_rows(v, &r.items, true)),
        next.unwrap_or_default()
    );
    Ok(page(
        v,
        "Dead letters",
        "Dead letters",
        body,
        fragment,
        true,
    ))
}

async fn dlq_replay(c: &Arc<Console>, v: &Viewer, form: &Form) -> Page {
    let tenant = field(form, "tenant")
        .map(str::to_owned)
        .or_else(|| v.portal.clone());
    let time = |k: &str| field(form, k).map(|x| time_param(k, x)).transpose();
    let req = ReplayRequest {
        ids: field(form, "ids")
            .map(|ids| ids.split(',').map(|i| i.trim().to_owned()).collect())
            .unwrap_or_default(),
        tenant: tenant.clone(),
        source: field(form, "source").map(str::to_owned),
        from_ms: time("from")?,
        to_ms: time("to")?,
        limit: None,
        dry_run: false,
    };
    let base = esc(&v.base);
    if field(form, "confirm") != Some("yes") {
        let dry = ReplayRequest {
            dry_run: true,
            ..req.clone()
        };
        let r: Revived = c
            .call(v, Method::POST, "/v1/dlq/replay", body(&dry))
            .await?;
        let matched = r.matched as i64;
        let selection: String = form
            .iter()
            .filter(|(k, _)| k != "csrf" && k != "confirm")
            .map(|(k, val)| hidden(k, val))
            .collect();
        let body = format!(
            "<h1>Replay dead letters?</h1><p role=\"status\"><strong>{matched}</strong> dead {} will move back to the queue and be delivered again.</p>\
<form method=\"post\" action=\"{base}/dlq/replay\" class=\"inline\">{}{selection}{}<button type=\"submit\" autofocus>Replay {}</button></form> <a href=\"{base}/dlq{}\">Cancel</a>",
            if matched == 1 { "row" } else { "rows" },
            csrf_field(&v.csrf),
            hidden("confirm", "yes"),
            plural(matched, "row"),
            tenant.as_deref().map(|t| format!("?tenant={}", enc(t))).unwrap_or_default(),
        );
        return Ok(page(
            v,
            "Confirm replay",
            "Dead letters",
            body,
            false,
            false,
        ));
    }
    let r: Revived = c
        .call(v, Method::POST, "/v1/dlq/replay", body(&req))
        .await?;
    let body = format!(
        "<h1>Replayed</h1><p role=\"status\">{} moved back to the queue.</p><p><a href=\"{base}/dlq{}\">Back to the dead letters</a></p>",
        plural(r.revived as i64, "dead row"),
        tenant.as_deref().map(|t| format!("?tenant={}", enc(t))).unwrap_or_default(),
    );
    Ok(page(v, "Replayed", "Dead letters", body, false, false))
}

// ----- Sinks ---------------------------------------------------------------------------------

fn sinks(c: &Arc<Console>, v: &Viewer, fragment: bool) -> Page {
    let cfg = c.api.config.load();
    let rows: Vec<Vec<String>> = cfg
        .sinks
        .iter()
        .map(|s| {
            let pull = s.kind == ankusa_config::SinkKind::Pull;
            let stats = c.history.sink(&s.id).unwrap_or_default();
            let ms = |x: Option<f64>| {
                x.map(|v| format!("{} ms", num(v)))
                    .unwrap_or_else(|| "—".into())
            };
            if pull {
                let m = c.metrics.pull.sink(&s.id);
                return vec![
                    format!("<code>{}</code>", esc(&s.id)),
                    "pull".into(),
                    "—".into(),
                    format!("{} leases", m.leases.get()),
                    "—".into(),
                    "—".into(),
                    "—".into(),
                    "—".into(),
                    "—".into(),
                ];
            }
            let m = c.metrics.sink_meters(&s.id);
            let breaker = match m.breaker.get() {
                0 => "<span class=\"good\">closed</span>",
                1 => "<span class=\"bad\">open</span>",
                _ => "<span class=\"warn\">half-open</span>",
            };
            vec![
                format!("<code>{}</code>", esc(&s.id)),
                esc(&host_of(&s.url)),
                count_cell(m.limit.get()),
                count_cell(m.requests.get()),
                breaker.into(),
                format!("{}/s", num(stats.attempts_per_s)),
                stats
                    .error_rate
                    .map(|e| format!("{:.1} %", e * 100.0))
                    .unwrap_or_else(|| "—".into()),
                ms(stats.p50_ms),
                ms(stats.p99_ms),
            ]
        })
        .collect();
    let body = format!(
        "<h1>Sinks</h1><p class=\"muted\">Limits, requests in flight and breakers as of each sink's last attempt; rates, errors and latency over the last five minutes on this node.</p>{}",
        table(
            "Sinks of this node",
            &["Sink", "Host", "Adaptive limit", "In flight", "Breaker", "Attempts", "Error rate", "Latency p50", "Latency p99"],
            &rows
        )
    );
    Ok(page(v, "Sinks", "Sinks", body, fragment, true))
}

/// A sink URL's scheme and host (its path and query can hold secrets).
fn host_of(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
            format!("{scheme}://{host}")
        }
        None => String::new(),
    }
}

// ----- Archive, audit, quarantine ------------------------------------------------------------

async fn archive(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    let tenant = field(q, "tenant")
        .map(str::to_owned)
        .or_else(|| v.portal.clone());
    let base = esc(&v.base);
    let form = format!(
        "<form method=\"get\" action=\"{base}/archive\" class=\"row\"><label for=\"a-tenant\">Tenant</label><input id=\"a-tenant\" name=\"tenant\" value=\"{}\" required><button type=\"submit\">Browse</button></form>",
        esc(tenant.as_deref().unwrap_or(""))
    );
    let Some(t) = tenant else {
        let body = format!("<h1>Archive</h1><p>A tenant's archived hooks, newest first.</p>{form}");
        return Ok(page(v, "Archive", "Archive", body, fragment, false));
    };
    let mut path = format!("/v1/archive?tenant={}&limit=50", enc(&t));
    if let Some(b) = field(q, "before") {
        let _ = write!(path, "&before={}", enc(b));
    }
    let r: ArchivePage = c.call(v, Method::GET, &path, None).await?;
    let csrf = csrf_field(&v.csrf);
    let rows: Vec<Vec<String>> = r
        .items
        .iter()
        .map(|a| {
            vec![
                format!("<code>{}</code>", esc(&a.id)),
                esc(&a.source),
                time_el(a.received_ms),
                time_el(a.expires_ms),
                format!("{} B", a.size),
                format!(
                    "<form method=\"post\" action=\"{base}/archive/replay\" class=\"inline\">{csrf}{}{}<button type=\"submit\" aria-label=\"Replay archived hook {}\">Replay</button></form>",
                    hidden("tenant", &t),
                    hidden("ids", &a.id),
                    esc(&a.id)
                ),
            ]
        })
        .collect();
    let next = r.next.as_deref().map(|n| {
        format!(
            "<p><a rel=\"next\" href=\"{base}/archive?tenant={}&amp;before={}\">Older</a></p>",
            enc(&t),
            enc(n)
        )
    });
    let body = format!(
        "<h1>Archive of {}</h1>{form}{}{}",
        esc(&t),
        table(
            "Archived hooks, newest first",
            &["Hook", "Source", "Received", "Kept until", "Size", "Action"],
            &rows
        ),
        next.unwrap_or_default()
    );
    Ok(page(v, "Archive", "Archive", body, fragment, true))
}

async fn archive_replay(c: &Arc<Console>, v: &Viewer, form: &Form) -> Page {
    let tenant = field(form, "tenant")
        .map(str::to_owned)
        .or_else(|| v.portal.clone())
        .unwrap_or_default();
    let ids: Vec<&str> = field(form, "ids")
        .map(|i| i.split(',').map(str::trim).collect())
        .unwrap_or_default();
    let base = esc(&v.base);
    if field(form, "confirm") != Some("yes") {
        let body = format!(
            "<h1>Replay from the archive?</h1><p role=\"status\">{} of {} will be committed again as new hooks and delivered.</p>\
<form method=\"post\" action=\"{base}/archive/replay\" class=\"inline\">{}{}{}{}<button type=\"submit\" autofocus>Replay</button></form> <a href=\"{base}/archive?tenant={}\">Cancel</a>",
            plural(ids.len() as i64, "archived hook"),
            esc(&tenant),
            csrf_field(&v.csrf),
            hidden("tenant", &tenant),
            hidden("ids", &ids.join(",")),
            hidden("confirm", "yes"),
            enc(&tenant),
        );
        return Ok(page(v, "Confirm replay", "Archive", body, false, false));
    }
    let req = ArchiveReplayRequest {
        tenant: tenant.clone(),
        from_ms: None,
        to_ms: None,
        ids: ids.iter().map(|i| (*i).to_owned()).collect(),
        limit: None,
        after: None,
    };
    let r: Replayed = c
        .call(v, Method::POST, "/v1/archive/replay", body(&req))
        .await?;
    let body = format!(
        "<h1>Replayed</h1><p role=\"status\">{} archived hooks committed again.</p><p><a href=\"{base}/archive?tenant={}\">Back to the archive</a></p>",
        r.replayed,
        enc(&tenant)
    );
    Ok(page(v, "Replayed", "Archive", body, false, false))
}

/// A listing the API pages by a numeric `before` (audit, quarantine): 50 rows, the cells
/// `cells` makes of each, and an "Older" link.
#[allow(
    clippy::too_many_arguments,
    reason = "a listing named by its parts; two callers"
)]
async fn cursor_list<P: CursorPage>(
    c: &Arc<Console>,
    v: &Viewer,
    q: &Form,
    fragment: bool,
    (api, page_path, name): (&str, &str, &str),
    (title, intro, caption): (&str, &str, &str),
    headers: &[&str],
    cells: impl Fn(&P::Item) -> Vec<String>,
) -> Page {
    let mut path = format!("{api}?limit=50");
    if let Some(b) = field(q, "before") {
        let _ = write!(path, "&before={}", enc(b));
    }
    let r: P = c.call(v, Method::GET, &path, None).await?;
    let (items, next) = r.parts();
    let rows: Vec<Vec<String>> = items.iter().map(cells).collect();
    let next = next.map(|n| {
        format!(
            "<p><a rel=\"next\" href=\"{}{page_path}?before={n}\">Older</a></p>",
            esc(&v.base)
        )
    });
    let body = format!(
        "<h1>{}</h1>{intro}{}{}",
        esc(title),
        table(caption, headers, &rows),
        next.unwrap_or_default()
    );
    Ok(page(v, name, name, body, fragment, true))
}

/// A page the API cursors by a number: its rows and the next cursor.
trait CursorPage: serde::de::DeserializeOwned {
    type Item;
    fn parts(self) -> (Vec<Self::Item>, Option<u64>);
}

impl CursorPage for AuditPage {
    type Item = AuditRecord;
    fn parts(self) -> (Vec<AuditRecord>, Option<u64>) {
        (self.items, self.next)
    }
}

impl CursorPage for QuarantinePage {
    type Item = QuarantineItem;
    fn parts(self) -> (Vec<QuarantineItem>, Option<u64>) {
        (self.items, self.next)
    }
}

async fn audit(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    cursor_list::<AuditPage>(
        c,
        v,
        q,
        fragment,
        ("/v1/audit", "/audit", "Audit"),
        (
            "Audit trail",
            "",
            "Admin actions on this node, newest first",
        ),
        &["At", "Who", "Action", "Tenant", "Detail"],
        |a| {
            vec![
                time_el(a.at_ms),
                esc(&a.who),
                format!("<code>{}</code>", esc(&a.action)),
                esc(a.tenant.as_deref().unwrap_or("")),
                format!("<code>{}</code>", esc(&a.detail.to_string())),
            ]
        },
    )
    .await
}

async fn quarantine(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    cursor_list::<QuarantinePage>(
        c,
        v,
        q,
        fragment,
        ("/v1/quarantine", "/quarantine", "Quarantine"),
        (
            "Quarantine",
            "<p class=\"muted\">Requests that failed verification, kept for inspection.</p>",
            "Quarantined requests, newest first",
        ),
        &["At", "Source", "Reason", "Headers"],
        |e| {
            vec![
                time_el(e.at_ms),
                format!("<code>{}</code>", esc(&e.source)),
                esc(&e.reason),
                format!(
                    "<code>{}</code>",
                    esc(&serde_json::to_string(&e.headers).unwrap_or_default())
                ),
            ]
        },
    )
    .await
}
