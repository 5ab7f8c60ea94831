//! The quarantine: requests that failed verification, kept for inspection.
//!
//! Bounded by entry count and bytes (`quarantine.max_entries`, `quarantine.max_bytes`);
//! past either, a failing request is still refused with 401 but not kept, and
//! `ankusa_quarantine_dropped_total` counts it. Of a request's headers only what its
//! source allows is kept (`ingest::Source::kept`: the content type and user agent, the
//! verifier's, tenant and forwarded headers); credentials (`authorization`, `cookie`) never
//! are, whatever a source names. A hook another node forwarded is never kept here: the
//! node it reached first kept it. Quarantine rows never create a tenant ordinal. The rows themselves are the
//! queue crate's (`queue::quarantine`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::HeaderMap;
use base64::Engine;

use crate::metrics::Metrics;
use ankusa_queue::engine::Store;
use ankusa_queue::quarantine::{self, Entry};
use ankusa_queue::Change;
use ankusa_queue::QueueError;

/// Header names never kept.
const DROPPED_HEADERS: [&str; 3] = ["authorization", "cookie", "proxy-authorization"];

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
        let (entries, bytes, last) = quarantine::totals(&store)?;
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

    /// Whether a request would be kept now: the count and the bytes below their ceilings.
    pub fn has_room(&self) -> bool {
        self.entries.load(Ordering::Relaxed) < self.max_entries
            && self.bytes.load(Ordering::Relaxed) < self.max_bytes
    }

    /// Entries currently kept.
    pub fn len(&self) -> u64 {
        self.entries.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Keeps a failed request if there is room (off the request path's thread): its
    /// source, why it failed (`why`'s words and stable code), the tenant it named.
    pub fn keep(
        &self,
        source: String,
        why: &ankusa_verify::VerifyError,
        tenant: Option<String>,
        headers: &HeaderMap,
        body: &[u8],
    ) {
        let entry = Entry {
            id: self.next_id.fetch_add(1, Ordering::Relaxed),
            source,
            at_ms: ankusa_keyspace::now_ms(),
            reason: why.to_string(),
            code: why.reason().to_owned(),
            tenant,
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
        let Some((op, size)) = quarantine::put(&entry) else {
            return;
        };
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
        tokio::task::spawn_blocking(move || {
            if let Err(e) = ankusa_queue::commit(&store, vec![op], false) {
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

/// Deletes every entry `pick` accepts (`queue::quarantine::delete`), giving their room
/// back to this node's `quarantine`. Returns how many went.
pub fn delete(
    store: &Store,
    quarantine: Option<&Quarantine>,
    pick: impl Fn(&Entry) -> bool,
    audit: Change,
) -> Result<u64, QueueError> {
    quarantine::delete(store, pick, audit, |entries, bytes| {
        if let Some(q) = quarantine {
            q.released(entries, bytes);
        }
    })
}
