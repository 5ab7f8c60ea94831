//! Tenants: every tenant by id (paged), those whose id starts with a prefix, or the
//! busiest; a tenant's page (its counters, sources, dead letters and newest hooks), its
//! purge and its portal link.

use std::fmt::Write;
use std::sync::Arc;

use axum::http::{Method, StatusCode};

use super::{
    body, count_cell, dead_rows, hook_rows, oldest_due, page, redirect, tenant_link, Page,
    DEAD_HEADERS, HOOK_HEADERS,
};
use crate::console::html::{self, csrf_field, esc, hidden, plural, table, time_el};
use crate::console::{field, CallError, Console, Form, Viewer};
use crate::http::percent_encode as enc;
use ankusa_api::admin::{
    DlqPage, PortalLink, PortalRequest, PurgeReport, RecentHooks, TenantView, TenantsTop,
};
use ankusa_api::endpoints::EndpointList;

/// The tenants with the most work, as `GET /v1/tenants?top=50` answers: an admin's from the
/// ranking the history keeps (a minute old at most; each row's counters read now), so the
/// page reads 50 tenants, not the 10⁴ the ranking reads. A tenant scope, and the first
/// seconds of a node, ask the API itself.
pub(super) async fn busiest(c: &Arc<Console>, v: &Viewer) -> Result<TenantsTop, CallError> {
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
pub(super) const TENANT_PAGE: usize = 50;

pub(super) async fn tenants(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
    if let Some(t) = &v.portal {
        return Ok(redirect(&format!("{}/tenants/{}", v.base, enc(t))));
    }
    let search = field(q, "q").unwrap_or("").trim().to_owned();
    let after = field(q, "after");
    // Every tenant by id (those without work too), unless the busiest are asked for.
    let busiest_view = field(q, "view") == Some("busiest") && search.is_empty() && after.is_none();
    let r = if busiest_view {
        busiest(c, v).await?
    } else {
        let path = format!(
            "/v1/tenants?prefix={}&top={TENANT_PAGE}{}",
            enc(&search),
            after
                .map(|a| format!("&after={}", enc(a)))
                .unwrap_or_default()
        );
        c.call::<TenantsTop>(v, Method::GET, &path, None).await?
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
    let base = esc(&v.base);
    let next = r.next.as_deref().map(|n| {
        format!(
            "<p><a rel=\"next\" href=\"{base}/tenants?q={}&amp;after={}\">Next page</a></p>",
            enc(&search),
            enc(n)
        )
    });
    let what = if busiest_view {
        "Tenants with work, the most pending first (ranked each minute; counters now)".to_owned()
    } else if search.is_empty() {
        "Every tenant, by id".to_owned()
    } else {
        format!("Tenants whose id starts with “{}”", esc(&search))
    };
    // The two views, the one shown as text, the other as a link.
    let view = |text: &str, href: &str, shown: bool| {
        if shown {
            text.to_owned()
        } else {
            format!("<a href=\"{base}{href}\">{text}</a>")
        }
    };
    let views = format!(
        "<p class=\"views\">{} · {}</p>",
        view(
            "Every tenant, by id",
            "/tenants",
            !busiest_view && search.is_empty()
        ),
        view("the busiest first", "/tenants?view=busiest", busiest_view),
    );
    let body = format!(
        "<h1>Tenants</h1><p>{} in all.</p>{views}\
<form method=\"get\" action=\"{base}/tenants\" role=\"search\" class=\"row\">\
<label for=\"q\">Search tenants by id prefix</label><input id=\"q\" name=\"q\" value=\"{}\" type=\"search\">\
<button type=\"submit\">Search</button></form>{}{}",
        r.total,
        esc(&search),
        table(&what, &["Tenant", "Pending", "Scheduled", "In flight", "Dead", "Oldest due", "Backlog, 1 h", "State"], &rows),
        next.unwrap_or_default()
    );
    Ok(page(v, "Tenants", "Tenants", body, fragment, true))
}

pub(super) async fn tenant(c: &Arc<Console>, v: &Viewer, t: &str, fragment: bool) -> Page {
    let te = enc(t);
    let paths = [
        format!("/v1/tenants/{te}"),
        format!("/v1/dlq?tenant={te}&limit=20"),
        format!("/v1/hooks?tenant={te}&limit=20"),
        format!("/v1/tenants/{te}/endpoints"),
    ];
    let (view, dead, recent, endpoints) = tokio::join!(
        c.call::<TenantView>(v, Method::GET, &paths[0], None),
        c.call::<DlqPage>(v, Method::GET, &paths[1], None),
        c.call::<RecentHooks>(v, Method::GET, &paths[2], None),
        c.call::<EndpointList>(v, Method::GET, &paths[3], None),
    );
    let (view, dead, recent, endpoints) = (view?, dead?, recent?, endpoints?);
    let ctr = &view.counters;
    let cfg = c.api.config.load();
    let sources: Vec<Vec<String>> = cfg
        .sources
        .iter()
        .filter_map(|src| {
            let own = match crate::ingest::source_tenant(&cfg, &src.id) {
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
<section aria-labelledby=\"h-ep\"><h2 id=\"h-ep\">Endpoints</h2>{}</section>\
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
        endpoints_table(&endpoints),
        table("The newest dead letters", &DEAD_HEADERS, &dead_rows(v, &dead.items, false)),
        table("The newest hooks the node's log keeps", &HOOK_HEADERS, &hook_rows(v, &recent.items, false)),
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

/// The tenant's own endpoints (`/v1/tenants/{t}/endpoints`): what each takes and how it
/// signs, never a secret.
fn endpoints_table(l: &EndpointList) -> String {
    let rows: Vec<Vec<String>> = l
        .endpoints
        .iter()
        .map(|e| {
            let rotating = e.secrets.iter().filter_map(|s| s.expires_ms).max();
            vec![
                format!("<code>{}</code>", esc(&e.id)),
                format!("<code class=\"wrap\">{}</code>", esc(&e.url)),
                esc(e.description.as_deref().unwrap_or("")),
                e.filter
                    .as_ref()
                    .map(|f| format!("<code class=\"wrap\">{}</code>", esc(&f.to_string())))
                    .unwrap_or_else(|| "every hook".into()),
                e.rate_per_second
                    .map(|r| format!("{r}/s"))
                    .unwrap_or_default(),
                if e.enabled { "enabled" } else { "disabled" }.into(),
                rotating
                    .map(|at| format!("rotated; the old secret signs until {}", time_el(at)))
                    .unwrap_or_default(),
            ]
        })
        .collect();
    format!(
        "{}<p class=\"muted\">{} of at most {}. Managed through the API or <code>ankusa-relay admin endpoints</code>.</p>",
        table(
            "The tenant's own endpoints: routes with endpoints on deliver to them",
            &["Id", "URL", "Description", "Takes", "Rate", "State", "Secret"],
            &rows
        ),
        plural(l.endpoints.len() as i64, "endpoint"),
        l.max
    )
}

pub(super) async fn purge(c: &Arc<Console>, v: &Viewer, t: &str, form: &Form) -> Page {
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

pub(super) async fn portal_link(c: &Arc<Console>, v: &Viewer, t: &str, form: &Form) -> Page {
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
