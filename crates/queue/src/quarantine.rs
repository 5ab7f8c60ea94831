//! The quarantine's rows: requests that failed verification, `<<?q, id::64>>` in the
//! `quarantine` family, a JSON entry each. The node's ingest (`ankusa-relay`'s
//! `ingest::quarantine`) decides what is kept within its bounds and writes the ops built
//! here; the admin API pages and deletes the rows. A row that does not decode is corruption,
//! never skipped.

use serde::{Deserialize, Serialize};

use ankusa_keyspace::Cf;
use ankusa_keyspace::Family;
use ankusa_store::{Dir, Op, Rows, Store};

use crate::{Change, QueueError};

/// A quarantined request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Entry {
    pub id: u64,
    pub source: String,
    pub at_ms: u64,
    /// What failed, in words (`signature mismatch`, `missing header x-hub-signature-256`).
    pub reason: String,
    /// What failed, as the stable code the 401 and the metric give (`bad_signature`);
    /// empty in a row of a release before it.
    #[serde(default)]
    pub code: String,
    /// The tenant the request named (unverified), when it named one.
    #[serde(default)]
    pub tenant: Option<String>,
    pub headers: Vec<(String, String)>,
    /// The body, base64.
    pub body: String,
}

/// What the family holds: entries, their bytes, and the highest id.
pub fn totals(store: &Store) -> Result<(u64, u64, u64), QueueError> {
    let (mut entries, mut bytes, mut last) = (0u64, 0u64, 0u64);
    for kv in store.scan_family(Family::Quarantine)? {
        let (k, v) = kv?;
        last = last.max(ankusa_keyspace::decode_quarantine(&k)?);
        entries += 1;
        bytes += v.len() as u64;
    }
    Ok((entries, bytes, last))
}

/// The change that keeps `entry`, and its size in bytes; `None` if it does not encode.
pub fn put(entry: &Entry) -> Option<(Change, u64)> {
    let value = serde_json::to_vec(entry).ok()?;
    let size = value.len() as u64;
    Some((
        Change(Op::put(
            Cf::Quarantine,
            ankusa_keyspace::quarantine(entry.id),
            value,
        )),
        size,
    ))
}

/// An entry, or corruption naming its key.
fn decode(key: &[u8], v: &[u8]) -> Result<Entry, QueueError> {
    serde_json::from_slice(v).map_err(|e| {
        QueueError::corrupt(
            Family::Quarantine,
            format!("undecodable entry {}: {e}", ankusa_keyspace::hex(key)),
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
    let to = before.map_or(end, ankusa_keyspace::quarantine);
    let mut out = Vec::new();
    for kv in store.scan(Family::Quarantine, &lo, &to, Dir::Reverse)? {
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

/// Deletes every entry `pick` accepts, in synced chunks of 500, `audit` in the first;
/// `released(entries, bytes)` after each chunk. Returns how many went.
pub fn delete(
    store: &Store,
    pick: impl Fn(&Entry) -> bool,
    audit: Change,
    mut released: impl FnMut(u64, u64),
) -> Result<u64, QueueError> {
    let mut victims: Vec<(Vec<u8>, u64)> = Vec::new();
    for kv in store.scan_family(Family::Quarantine)? {
        let (k, v) = kv?;
        if pick(&decode(&k, &v)?) {
            victims.push((k, v.len() as u64));
        }
    }
    let mut first = Some(audit.0);
    for chunk in victims.chunks(500) {
        let mut ops: Vec<Op> = chunk
            .iter()
            .map(|(k, _)| Op::delete(Cf::Quarantine, k.clone()))
            .collect();
        ops.extend(first.take());
        store.write(ops, true)?;
        released(chunk.len() as u64, chunk.iter().map(|(_, b)| b).sum());
    }
    if let Some(op) = first {
        store.write(vec![op], true)?;
    }
    Ok(victims.len() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{assert_corrupt, Harness};

    fn entry(id: u64) -> Entry {
        Entry {
            id,
            source: "s".into(),
            at_ms: id,
            reason: "bad signature".into(),
            code: "bad_signature".into(),
            tenant: None,
            headers: vec![],
            body: String::new(),
        }
    }

    #[test]
    fn an_undecodable_quarantine_row_is_corruption_not_a_shorter_page() {
        let h = Harness::new();
        let bad = Op::put(
            Cf::Quarantine,
            ankusa_keyspace::quarantine(7),
            b"\xff".to_vec(),
        );
        h.store.write(vec![bad], true).unwrap();
        assert_corrupt(page(&h.store, None, 10, |_| true), Family::Quarantine);
    }

    #[test]
    fn rows_are_paged_newest_first_counted_and_deleted_with_their_room_given_back() {
        let h = Harness::new();
        let ops: Vec<Change> = (1..=3)
            .filter_map(|i| put(&entry(i)))
            .map(|(op, _)| op)
            .collect();
        crate::commit(&h.store, ops, true).unwrap();
        let (n, bytes, last) = totals(&h.store).unwrap();
        assert_eq!((n, last), (3, 3));
        let ids: Vec<u64> = page(&h.store, None, 10, |_| true)
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(ids, [3, 2, 1]);
        let mut given_back = (0, 0);
        let audit = Change(Op::put(
            Cf::Audit,
            ankusa_keyspace::audit(ankusa_keyspace::Seq(1), ankusa_keyspace::AtMs(1)),
            b"{}".to_vec(),
        ));
        let gone = delete(
            &h.store,
            |e| e.id != 2,
            audit,
            |e, b| given_back = (given_back.0 + e, given_back.1 + b),
        )
        .unwrap();
        assert_eq!((gone, given_back.0), (2, 2));
        assert_eq!(totals(&h.store).unwrap().1, bytes - given_back.1);
    }
}
