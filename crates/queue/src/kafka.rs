//! What a Kafka sink keeps in the node's store so that a hook it published is not published
//! again after a crash (docs/delivery.md, Kafka):
//!
//! - `m:kafka_id` → this store's producer name (32 hex digits, made once): each Kafka
//!   sink's transactional id is `ankusa-<name>-<sink id>`, the same across restarts of the
//!   node, unlike any other node's.
//! - `m:kafka:<sink id>\0<hook id>` → a *marker*: where the hook's message lies in a
//!   transaction the sink is committing (`<<written_ms::64, partition::32, offset::64>>` and
//!   the topic). Written (synced) before the transaction's commit is asked for, deleted
//!   with the delivery's outcome. A marker found at the sink's start, or after a commit
//!   whose answer never came, is read back: a message there with the hook's id means the
//!   transaction committed and the hook is delivered; none means it was aborted (the
//!   producer's start aborts what it left open) and the hook is published again.
//!
//! Sink ids hold no control character (`\0` ends one). At most a sink's `max_inflight`
//! markers stand at a time, and one per hook.

use ankusa_keyspace::{Cf, Family};
use ankusa_store::{Op, Rows, Store};

use crate::{Change, QueueError};

const ID: &[u8] = b"m:kafka_id";
const PREFIX: &[u8] = b"m:kafka:";

/// Where a published hook's message lies, as a marker keeps it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Marker {
    pub written_ms: u64,
    pub partition: i32,
    pub offset: i64,
    pub topic: String,
}

fn key(sink: &str, hook: &str) -> Vec<u8> {
    let mut k = PREFIX.to_vec();
    k.extend_from_slice(sink.as_bytes());
    k.push(0);
    k.extend_from_slice(hook.as_bytes());
    k
}

fn encode(m: &Marker) -> Vec<u8> {
    let mut v = Vec::with_capacity(20 + m.topic.len());
    v.extend_from_slice(&m.written_ms.to_be_bytes());
    v.extend_from_slice(&m.partition.to_be_bytes());
    v.extend_from_slice(&m.offset.to_be_bytes());
    v.extend_from_slice(m.topic.as_bytes());
    v
}

fn decode(k: &[u8], v: &[u8]) -> Result<Marker, QueueError> {
    let bad = || QueueError::corrupt_at(Family::Meta, k, "a Kafka marker that does not decode");
    if v.len() < 20 {
        return Err(bad());
    }
    let u64_at = |at: usize| u64::from_be_bytes(v[at..at + 8].try_into().unwrap_or([0; 8]));
    Ok(Marker {
        written_ms: u64_at(0),
        partition: i32::from_be_bytes(v[8..12].try_into().unwrap_or([0; 4])),
        offset: u64_at(12) as i64,
        topic: std::str::from_utf8(&v[20..]).map_err(|_| bad())?.to_owned(),
    })
}

/// This store's producer name, if one was made.
pub fn producer_name(store: &Store) -> Result<Option<String>, QueueError> {
    Ok(store
        .get(Cf::Default, ID)?
        .and_then(|v| String::from_utf8(v).ok()))
}

/// The change that records `name` as this store's producer name.
pub fn producer_name_op(name: &str) -> Change {
    Change(Op::put(Cf::Default, ID.to_vec(), name.as_bytes().to_vec()))
}

/// The changes that write sink `sink`'s markers.
pub fn mark_ops<'a>(
    sink: &str,
    marked: impl IntoIterator<Item = (&'a str, &'a Marker)>,
) -> Vec<Change> {
    marked
        .into_iter()
        .map(|(hook, m)| Change(Op::put(Cf::Default, key(sink, hook), encode(m))))
        .collect()
}

/// The change that deletes sink `sink`'s marker of hook `hook` (there or not).
pub fn forget_op(sink: &str, hook: &str) -> Change {
    Change(Op::delete(Cf::Default, key(sink, hook)))
}

/// Sink `sink`'s markers of `hooks`, in their order (one read for them all).
pub fn marked(
    store: &Store,
    sink: &str,
    hooks: &[&str],
) -> Result<Vec<Option<Marker>>, QueueError> {
    let keys: Vec<Vec<u8>> = hooks.iter().map(|h| key(sink, h)).collect();
    store
        .multi_get(Cf::Default, &keys)?
        .into_iter()
        .zip(&keys)
        .map(|(v, k)| v.map(|v| decode(k, &v)).transpose())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Markers are kept per sink, read back as written, and forgotten one by one; another
    /// sink's (even one whose id extends this one's) are not among them.
    #[test]
    fn markers_round_trip_per_sink() {
        let h = crate::testkit::Harness::new();
        let store = &*h.store;
        let m = |offset| Marker {
            written_ms: 7,
            partition: 2,
            offset,
            topic: "hooks.acme".into(),
        };
        let (a, b) = (m(10), m(11));
        let mut ops = mark_ops("k", [("h1", &a), ("h2", &b)]);
        ops.extend(mark_ops("k2", [("h3", &b)]));
        ops.push(producer_name_op("00ff"));
        crate::commit(store, ops, true).unwrap();
        assert_eq!(
            marked(store, "k", &["h2", "h3", "h1"]).unwrap(),
            vec![Some(b.clone()), None, Some(a.clone())]
        );
        assert_eq!(
            marked(store, "k2", &["h1", "h3"]).unwrap(),
            vec![None, Some(b.clone())]
        );
        crate::commit(store, vec![forget_op("k", "h2")], false).unwrap();
        assert_eq!(
            marked(store, "k", &["h1", "h2"]).unwrap(),
            vec![Some(a), None]
        );
        assert_eq!(producer_name(store).unwrap().as_deref(), Some("00ff"));
    }
}
