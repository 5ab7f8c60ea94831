//! Sinks: each push sink's limit, breaker, rates and latency (a NATS or Kafka sink's server and
//! subject or topic for its host); each pull sink's leases.

use std::sync::Arc;

use super::{count_cell, page, Page};
use crate::console::html::{esc, num, table};
use crate::console::{Console, Viewer};

pub(super) fn sinks(c: &Arc<Console>, v: &Viewer, fragment: bool) -> Page {
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
                // A NATS or Kafka sink: its first server and its subject or topic.
                match (&s.nats, &s.kafka) {
                    (Some(n), _) => format!(
                        "{} · <code>{}</code>",
                        esc(&host_of(&s.url)),
                        esc(&n.subject)
                    ),
                    (None, Some(k)) => {
                        format!("{} · <code>{}</code>", esc(&host_of(&s.url)), esc(&k.topic))
                    }
                    (None, None) => esc(&host_of(&s.url)),
                },
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
pub(super) fn host_of(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let host = rest.split(['/', '?', '#']).next().unwrap_or("");
            let host = host.rsplit_once('@').map_or(host, |(_, h)| h);
            format!("{scheme}://{host}")
        }
        None => String::new(),
    }
}
