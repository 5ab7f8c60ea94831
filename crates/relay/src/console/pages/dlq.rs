//! Dead letters: the filtered list, and replays (with a dry run that counts first).

use std::fmt::Write;
use std::sync::Arc;

use axum::http::Method;

use super::{body, dead_rows, page, time_param, Page, DEAD_HEADERS};
use crate::console::html::{csrf_field, esc, hidden, plural, table};
use crate::console::{field, Console, Form, Viewer};
use crate::http::percent_encode as enc;
use ankusa_api::admin::{DlqPage, ReplayRequest, Revived};

pub(super) async fn dlq(c: &Arc<Console>, v: &Viewer, q: &Form, fragment: bool) -> Page {
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

pub(super) async fn dlq_replay(c: &Arc<Console>, v: &Viewer, form: &Form) -> Page {
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
