//! Route filters at ingest: which of a source's route sinks take a hook
//! (`routes[].filters`), decided once, before the hook is committed. A sink without a
//! filter takes every hook; the others take those that match theirs. The sinks a hook is
//! committed with are the only ones it is delivered to; each one left out is counted
//! (`ankusa_route_filtered_total{source, sink}`), and a hook no sink takes is committed to
//! the hook log alone (and, when its source archives, stored for its archive obligation) —
//! found by its id as `filtered`, counted (`ankusa_hooks_filtered_total{source}`), never
//! delivered.

use std::cell::RefCell;

use ankusa_config::{EventTypeFrom, HookFacts};
use ankusa_verify::request::JsonBody;
use axum::http::HeaderMap;

use super::Source;
use crate::metrics::Metrics;

/// A hook as the filters read it: its headers, its body (parsed at most once) and its
/// event type.
struct Facts<'h, 'b, 'j> {
    headers: &'h HeaderMap,
    json: RefCell<&'j mut JsonBody<'b>>,
    event: Option<String>,
}

impl HookFacts for Facts<'_, '_, '_> {
    fn event(&self) -> Option<&str> {
        self.event.as_deref()
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    fn pointer(&self, pointer: &str) -> Option<String> {
        self.json.borrow_mut().text_at(pointer)
    }
}

/// The sinks of `src`'s route that take this hook, in the route's order.
pub(super) fn taken(
    src: &Source,
    headers: &HeaderMap,
    json: &mut JsonBody<'_>,
    metrics: &Metrics,
) -> Vec<String> {
    if src.sinks.iter().all(|(_, f)| f.is_none()) {
        return src.sinks.iter().map(|(s, _)| s.clone()).collect();
    }
    let event = match &src.event_type {
        Some(EventTypeFrom::Header(h)) => headers
            .get(h.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned),
        Some(EventTypeFrom::JsonPointer(p)) => json.text_at(p),
        None => None,
    };
    let facts = Facts {
        headers,
        json: RefCell::new(json),
        event,
    };
    let mut out = Vec::with_capacity(src.sinks.len());
    for (sink, filter) in &src.sinks {
        match filter {
            Some(f) if !f.matches(&facts) => metrics.route_filtered(&src.id, sink),
            _ => out.push(sink.clone()),
        }
    }
    if out.is_empty() {
        metrics.hook_filtered(&src.id);
    }
    out
}
