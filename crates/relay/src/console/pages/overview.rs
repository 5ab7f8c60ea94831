//! The overview: the Relay's nodes, this node's counters now, its last hour in charts and
//! the newest hooks of its log.

use std::sync::Arc;

use axum::http::{header, HeaderValue, Method};

use super::{count_cell, hook_rows, oldest_due, page, Page, HOOK_HEADERS};
use crate::console::html::{self, esc, table};
use crate::console::{Console, Viewer};
use ankusa_api::admin::RecentHooks;
use ankusa_api::node::NodeStatus;

/// The newest hooks the overview lists.
const NEWEST_HOOKS: usize = 10;

pub(super) async fn overview(c: &Arc<Console>, v: &Viewer, fragment: bool) -> Page {
    let newest_path = format!("/v1/hooks?limit={NEWEST_HOOKS}");
    let (me, newest) = tokio::join!(
        c.call::<NodeStatus>(v, Method::GET, "/v1/node", None),
        c.call::<RecentHooks>(v, Method::GET, &newest_path, None),
    );
    let (me, newest) = (me?, newest?);
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
        _ => crate::console::history::INTERVAL_MS / 1000,
    };
    let ingest = crate::console::history::rates(&samples, |s| s.accepted);
    let delivery = crate::console::history::rates(&samples, |s| s.delivered);
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
<p class=\"muted\">A sample every {} s since the node started ({} so far).</p></section>\
<section aria-labelledby=\"h-newest\"><h2 id=\"h-newest\">Newest hooks on this node</h2>{}\
<p><a href=\"{}/hooks\">Find a hook</a> · <a href=\"{}/tenants\">Every tenant</a></p></section>",
        table("Nodes of this Relay", &["Node", "Version", "Store format", "Tenants", "Ownership share", "State"], &rows),
        counters.pending,
        counters.scheduled,
        counters.inflight,
        counters.dead,
        me.store_bytes.unwrap_or(0) >> 20,
        html::chart("Ingest", " hooks/s", &ingest, span),
        html::chart("Delivery", " hooks/s", &delivery, span),
        html::chart("Backlog", " rows", &backlog, span),
        crate::console::history::INTERVAL_MS / 1000,
        samples.len(),
        table(
            "The newest hooks this node's log keeps",
            &newest_headers(),
            &hook_rows(v, &newest.items, true)
        ),
        esc(&v.base),
        esc(&v.base),
    );
    Ok(page(v, "Overview", "Overview", body, fragment, true))
}

/// [`HOOK_HEADERS`] with the tenant's column second.
fn newest_headers() -> Vec<&'static str> {
    let mut h = HOOK_HEADERS.to_vec();
    h.insert(1, "Tenant");
    h
}
