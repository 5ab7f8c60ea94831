//! The quarantine: requests that failed verification, kept for inspection.
//!
//! Bounded by entry count and bytes (`quarantine.max_entries`, `quarantine.max_bytes`);
//! past either, a failing request is still refused with 401 but not kept, and
//! `ankusa_quarantine_dropped_total` counts it. Credentials (`authorization`, `cookie`)
//! are not kept. Quarantine rows never create a tenant ordinal.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::HeaderMap;
use base64::Engine;
use serde::{Deserialize, Serialize};

use crate::metrics::Metrics;
use crate::queue::QueueError;
use crate::store::keys::{self, Family};
use crate::store::{Cf, Op, Store};

/// Header names never kept.
const DROPPED_HEADERS: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];

/// A quarantined request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    pub source: String,
    pub at_ms: u64,
    pub reason: String,
    pub headers: Vec<(String, String)>,
    /// The body, base64.
    pub body: String,
}

/// The bounded quarantine of a node.
#[derive(Debug)]
pub struct Quarantine {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    next_id: AtomicU64,
    entries: AtomicU64,
    bytes: AtomicU64,
    max_entries: u64,
    max_bytes: u64,
}

impl Quarantine {
    /// Opens the quarantine over a store, counting what it already holds.
    pub fn open(
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        max_entries: u64,
        max_bytes: u64,
    ) -> Result<Self, QueueError> {
        let (mut entries, mut bytes, mut last) = (0u64, 0u64, 0u64);
        for kv in store.scan_family(Family::Quarantine)? {
            let (k, v) = kv?;
            last = last.max(keys::decode_quarantine(&k)?);
            entries += 1;
            bytes += v.len() as u64;
        }
        Ok(Quarantine {
            store,
            metrics,
            next_id: AtomicU64::new(last + 1),
            entries: AtomicU64::new(entries),
            bytes: AtomicU64::new(bytes),
            max_entries,
            max_bytes,
        })
    }

    /// Entries currently kept.
    pub fn len(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps a failed request if there is room (off the request path's thread).
    pub fn keep(&self, source: String, reason: String, headers: &HeaderMap, body: &[u8]) {
        let entry = Entry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            source,
            at_ms: crate::now_ms(),
            reason,
            headers: headers
                .iter()
                .filter(|(k, _)| !DROPPED_HEADERS.contains(&k.as_str()))
                .map(|(k, v)| {
                    (
                        k.to_string(),
                        String::from_utf8_lossy(v.as_bytes()).into_owned(),
                    )
                })
                .collect(),
            body: base64::engine::general_purpose::STANDARD.encode(body),
        };
        let value = match serde_json::to_vec(&entry) {
            Ok(v) => v,
            Err(_) => return,
        };
        let size = value.len() as u64;
        // Reserve room first; give it back if over a ceiling.
        let n = self.entries.fetch_add(1, Ordering::Relaxed) + 1;
        let b = self.bytes.fetch_add(size, Ordering::Relaxed) + size;
        if n > self.max_entries || b > self.max_bytes {
            self.entries.fetch_sub(1, Ordering::Relaxed);
            self.bytes.fetch_sub(size, Ordering::Relaxed);
            self.metrics.quarantine_dropped.inc();
            return;
        }
        let store = self.store.clone();
        let key = keys::quarantine(entry.id);
        tokio::task::spawn_blocking(move || {
            if let Err(e) = store.write(vec![Op::put(Cf::Quarantine, key, value)], false) {
                tracing::warn!(error = %e, "quarantine write failed");
            }
        });
    }

    /// Gives back the room of deleted entries.
    fn released(&self, entries: u64, bytes: u64) {
        self.entries
            .fetch_sub(entries.min(self.len()), Ordering::Relaxed);
        let b = self.bytes.load(Ordering::Relaxed);
        self.bytes.fetch_sub(bytes.min(b), Ordering::Relaxed);
    }
}

/// An entry, or corruption naming its key: a row that does not decode is never skipped.
fn decode(key: &[u8], v: &[u8]) -> Result<Entry, QueueError> {
    serde_json::from_slice(v).map_err(|e| {
        QueueError::corrupt(
            Family::Quarantine,
            format!("undecodable entry {}: {e}", keys::hex(key)),
        )
    })
}

/// Quarantined entries newest first, ids below `before`, that `keep` accepts.
pub fn page(
    store: &Store,
    before: Option<u64>,
    limit: usize,
    keep: impl Fn(&Entry) -> bool,
) -> Result<Vec<Entry>, QueueError> {
    let (lo, end) = Family::Quarantine.bounds();
    let to = before.map_or(end, keys::quarantine);
    let mut out = Vec::new();
    for kv in store.scan(Family::Quarantine, &lo, &to, crate::store::Dir::Reverse)? {
        let (k, v) = kv?;
        let e = decode(&k, &v)?;
        if keep(&e) {
            out.push(e);
            if out.len() >= limit {
                break;
            }
        }
    }
    Ok(out)
}

/// Deletes every entry `pick` accepts, in synced chunks of 500, `audit` in the first.
/// Returns how many went.
pub fn delete(
    store: &Store,
    quarantine: Option<&Quarantine>,
    pick: impl Fn(&Entry) -> bool,
    audit: Op,
) -> Result<u64, QueueError> {
    let mut victims: Vec<(Vec<u8>, u64)> = Vec::new();
    for kv in store.scan_family(Family::Quarantine)? {
        let (k, v) = kv?;
        if pick(&decode(&k, &v)?) {
            victims.push((k, v.len() as u64));
        }
    }
    let mut first = Some(audit);
    for chunk in victims.chunks(500) {
        let mut ops: Vec<Op> = chunk
            .iter()
            .map(|(k, _)| Op::delete(Cf::Quarantine, k.clone()))
            .collect();
        ops.extend(first.take());
        store.write(ops, true)?;
        if let Some(q) = quarantine {
            q.released(chunk.len() as u64, chunk.iter().map(|(_, b)| b).sum());
        }
    }
    if let Some(op) = first {
        store.write(vec![op], true)?;
    }
    Ok(victims.len() as u64)
}
