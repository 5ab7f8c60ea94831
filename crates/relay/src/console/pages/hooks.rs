//! Finding a hook (by id, or by the provider's delivery id) and a hook's page: its
//! deliveries, their timelines, its body.

use std::fmt::Write;
use std::sync::Arc;

use axum::http::Method;

use super::{page, redirect, tenant_link, wire_name, Page};
use crate::console::html::{esc, hidden, num, plural, table, time_el};
use crate::console::{field, Console, Form, Viewer};
use crate::http::percent_encode as enc;
use ankusa_api::admin::HookOut;

pub(super) async fn find_hook(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
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

pub(super) async fn hook(c: &Arc<Console>, v: &Viewer, id: &str, q: &Form, fragment: bool) -> Page {
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

pub(super) fn render_hook(v: &Viewer, h: &HookOut, with_body: bool) -> String {
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
                    e.next_attempt_ms().map(time_el).unwrap_or_default(),
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
        let _ = write!(
            out,
            "<p class=\"muted\">The body is no longer stored ({}).</p>",
            why_not_stored(h)
        );
    }
    out
}

/// Why a hook's body is gone, from its deliveries: each delivered, some purged by an
/// operator (the log's `purged` event), some dropped or purged before the log recorded
/// purges, or reclaimed after its deliveries ended.
fn why_not_stored(h: &HookOut) -> &'static str {
    use ankusa_api::admin::DeliveryState as S;
    if !h.sinks.is_empty() && h.sinks.iter().all(|s| s.state == S::Delivered) {
        "delivered and reclaimed"
    } else if h.sinks.iter().any(|s| s.state == S::Purged) {
        "an operator purged its undelivered rows"
    } else if h.sinks.iter().any(|s| s.state == S::Gone) {
        "dropped or purged before it was delivered"
    } else {
        "reclaimed"
    }
}
