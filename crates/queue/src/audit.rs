//! The audit trail: one row per mutating admin call, `<<?a, seq::64, at::64>>` in the
//! `audit` family, written in the same batch as the call's effect where it has one.
//! Rows are pruned by age (`admin.audit_retention_ms`) in bounded batches. The admin API
//! (`ankusa-relay`'s `admin`) commits the changes built here and pages the rows.

use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use ankusa_keyspace::Cf;
use ankusa_keyspace::{AtMs, Family, Seq};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::{Change, QueueError};

/// One audit row.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Record {
    pub seq: u64,
    pub at_ms: u64,
    /// The token's name.
    pub who: String,
    /// What was done, e.g. `purge`, `replay`, `quarantine.delete`.
    pub action: String,
    /// The tenant it concerned, if one.
    pub tenant: Option<String>,
    pub detail: serde_json::Value,
}

/// Hands out audit seqs and builds audit ops.
#[derive(Debug)]
pub struct Audit {
    next: AtomicU64,
}

impl Audit {
    /// Continues after the highest audit seq in the store.
    pub fn open(store: &Store) -> Result<Self, QueueError> {
        let (lo, end) = Family::Audit.bounds();
        let last = match store.first(Family::Audit, &lo, &end, Dir::Reverse)? {
            Some((k, _)) => ankusa_keyspace::decode_audit(&k)?.0 .0,
            None => 0,
        };
        Ok(Audit {
            next: AtomicU64::new(last + 1),
        })
    }

    /// The op that records one call.
    pub fn op(
        &self,
        who: &str,
        action: &str,
        tenant: Option<&str>,
        detail: serde_json::Value,
    ) -> Change {
        let seq = self.next.fetch_add(1, Ordering::Relaxed);
        let at = ankusa_keyspace::now_ms();
        let r = Record {
            seq,
            at_ms: at,
            who: who.to_owned(),
            action: action.to_owned(),
            tenant: tenant.map(str::to_owned),
            detail,
        };
        Change(Op::put(
            Cf::Audit,
            ankusa_keyspace::audit(Seq(seq), AtMs(at)),
            serde_json::to_vec(&r).unwrap_or_default(),
        ))
    }
}

/// Audit rows newest first, strictly before seq `before`, that `keep` accepts.
pub fn page(
    store: &Store,
    before: Option<u64>,
    limit: usize,
    keep: impl Fn(&Record) -> bool,
) -> Result<Vec<Record>, QueueError> {
    let (lo, end) = Family::Audit.bounds();
    let to = before.map_or(end, |s| ankusa_keyspace::audit(Seq(s), AtMs(0)));
    let mut out = Vec::new();
    for kv in store.scan(Family::Audit, &lo, &to, Dir::Reverse)? {
        let (k, v) = kv?;
        // A row that does not decode is corruption, never skipped.
        let r: Record = serde_json::from_slice(&v).map_err(|e| {
            QueueError::corrupt(
                Family::Audit,
                format!("undecodable row {}: {e}", ankusa_keyspace::hex(&k)),
            )
        })?;
        if keep(&r) {
            out.push(r);
            if out.len() >= limit {
                break;
            }
        }
    }
    Ok(out)
}

/// Deletes up to `limit` audit rows older than `cutoff_ms`; returns how many.
pub fn prune(store: &Store, cutoff_ms: u64, limit: usize) -> Result<u64, QueueError> {
    let mut ops = Vec::new();
    for kv in store.scan_family(Family::Audit)?.take(limit) {
        let (k, _) = kv?;
        let (_, at) = ankusa_keyspace::decode_audit(&k)?;
        // Seqs grow with time, so the first row young enough ends the pass.
        if at.0 >= cutoff_ms {
            break;
        }
        ops.push(Op::delete(Cf::Audit, k));
    }
    let n = ops.len() as u64;
    if n > 0 {
        store.write(ops, false)?;
    }
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{assert_corrupt, Harness};

    #[test]
    fn an_undecodable_audit_row_is_corruption_not_a_shorter_page() {
        let h = Harness::new();
        let audit = Audit::open(&h.store).unwrap();
        let op = audit.op("ops", "dlq.replay", None, serde_json::json!({}));
        crate::commit(&h.store, vec![op], true).unwrap();
        assert_eq!(page(&h.store, None, 10, |_| true).unwrap().len(), 1);
        let bad = Op::put(
            Cf::Audit,
            ankusa_keyspace::audit(Seq(99), AtMs(1)),
            b"{not json".to_vec(),
        );
        h.store.write(vec![bad], true).unwrap();
        assert_corrupt(page(&h.store, None, 10, |_| true), Family::Audit);
    }

    #[test]
    fn audit_seqs_continue_after_the_highest_in_the_store_and_prune_goes_by_age() {
        let h = Harness::new();
        let audit = Audit::open(&h.store).unwrap();
        let ops = (0..3)
            .map(|i| audit.op("ops", "purge", Some("acme"), serde_json::json!({ "i": i })))
            .collect();
        crate::commit(&h.store, ops, true).unwrap();
        let again = Audit::open(&h.store).unwrap();
        let op = again.op("ops", "replay", None, serde_json::json!({}));
        crate::commit(&h.store, vec![op], true).unwrap();
        let seqs: Vec<u64> = page(&h.store, None, 10, |_| true)
            .unwrap()
            .iter()
            .map(|r| r.seq)
            .collect();
        assert_eq!(seqs, [4, 3, 2, 1]);
        assert_eq!(
            prune(&h.store, 0, 100).unwrap(),
            0,
            "nothing is older than 0"
        );
        assert_eq!(
            prune(&h.store, u64::MAX, 2).unwrap(),
            2,
            "bounded by the limit"
        );
        assert_eq!(page(&h.store, None, 10, |_| true).unwrap().len(), 2);
    }
}
