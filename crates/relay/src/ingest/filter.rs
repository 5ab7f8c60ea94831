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

use std::sync::Arc;

use super::Source;
use crate::endpoints::{Record, SERIES as ENDPOINTS_SERIES};
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

/// The sinks of `src`'s route that take this hook, in the route's order, then the
/// tenant's `endpoints` that do (enabled, and their filter matches).
pub(super) fn taken(
    src: &Source,
    endpoints: Option<&[Arc<Record>]>,
    headers: &HeaderMap,
    json: &mut JsonBody<'_>,
    metrics: &Metrics,
) -> Vec<String> {
    let endpoints = endpoints.unwrap_or_default();
    let plain =
        src.sinks.iter().all(|(_, f)| f.is_none()) && endpoints.iter().all(|e| e.filter.is_none());
    if plain {
        let mut out: Vec<String> = src.sinks.iter().map(|(s, _)| s.clone()).collect();
        out.extend(endpoints.iter().filter(|e| e.enabled).map(|e| e.id.clone()));
        if out.is_empty() {
            metrics.hook_filtered(&src.id);
        }
        return out;
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
    let mut out = Vec::with_capacity(src.sinks.len() + endpoints.len());
    for (sink, filter) in &src.sinks {
        match filter {
            Some(f) if !f.matches(&facts) => metrics.route_filtered(&src.id, sink),
            _ => out.push(sink.clone()),
        }
    }
    for e in endpoints.iter().filter(|e| e.enabled) {
        if e.takes(&facts) {
            out.push(e.id.clone());
        } else {
            metrics.route_filtered(&src.id, ENDPOINTS_SERIES);
        }
    }
    if out.is_empty() {
        metrics.hook_filtered(&src.id);
    }
    out
}
