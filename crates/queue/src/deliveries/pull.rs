//! Pull sinks: a due delivery parked for consumers (`?P`), and its lease (`?k`).
//!
//! ```text
//!   due ?D ──park──► waiting ?P ──lease──► inflight ?F + lease ?k ──ack──► (row gone)
//!                                                   │      └──nack / expiry──► due ?D (retry) or dead
//!                                                   └──extend: a new ?k value
//! ```
//!
//! - **Park.** The dispatch tick meets a due row whose sink is a pull sink and moves it to
//!   `?P`, keyed by tenant and sink id, with its kind: it stays `pending` (or `scheduled`)
//!   and no tick reads it again. Every way a row becomes due (ingest, a retry, a replay,
//!   a boot recovery) goes through `?D`, so every one reaches the consumers the same way.
//! - **Lease.** A claim moves `?P` → `?F` (`pending` −1, `inflight` +1) and writes the
//!   lease `?k` in the same unit. The lease holds a nonce, its deadline, when it was
//!   claimed and the attempt's number.
//! - **Settle.** An ack, a nack or an expiry is an outcome of the inflight row that also
//!   consumes the lease, as read: a lease extended, settled or claimed again since is not
//!   the one the caller holds, and the unit is left out. A delivery is settled at most once
//!   per lease.
//! - **Crash.** A lease is a row: boot recovery leaves a leased inflight row as it is (its
//!   consumer may still ack it after the restart), and the gateway reads the leases back
//!   and ends each at its deadline.
// Builds the queue's index keys: this module is part of `deliveries` (clippy.toml).
#![allow(clippy::disallowed_methods)]

use super::{collect, DueRow, InflightRow, Kind, Tx};
use ankusa_keyspace::Cf;
use ankusa_keyspace::{self, AtMs, Family, InflightKey, PulledKey, Seq, SinkIdx, TenantOrd};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::QueueError;

/// A delivery to a pull sink waiting for a consumer.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PulledRow {
    pub key: PulledKey,
    pub size: u32,
    pub kind: Kind,
}

impl PulledRow {
    pub fn decode(raw_key: &[u8], value: &[u8]) -> Result<PulledRow, QueueError> {
        let key = ankusa_keyspace::decode_pulled(raw_key)?;
        match value {
            [a, b, c, d, k] if *k <= 1 => Ok(PulledRow {
                key,
                size: u32::from_be_bytes([*a, *b, *c, *d]),
                kind: if *k == 0 { Kind::First } else { Kind::Retry },
            }),
            _ => Err(QueueError::corrupt_at(
                Family::Pulled,
                raw_key,
                format!("bad value {}", ankusa_keyspace::hex(value)),
            )),
        }
    }

    fn value(&self) -> Vec<u8> {
        let mut v = self.size.to_be_bytes().to_vec();
        v.push(self.kind as u8);
        v
    }

    /// The inflight row a lease of this row makes.
    pub fn inflight(&self) -> InflightRow {
        InflightRow {
            key: InflightKey {
                ord: self.key.ord,
                seq: self.key.seq,
                sink: self.key.sink,
            },
            size: self.size,
        }
    }
}

/// A lease of an inflight pull delivery (`?k`'s value).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Tells this lease from every other of the same delivery.
    pub nonce: u64,
    pub deadline: AtMs,
    pub claimed_at: AtMs,
    /// The attempt this lease is (1 = first).
    pub attempt: u32,
    /// The sinks the hook names (an ack's last-need check reads no hook).
    pub sinks: u16,
    /// A hash of the pull sink's id: a lease settles only through its own sink.
    pub sink_hash: u64,
}

impl Lease {
    const V1: u8 = 1;
    const LEN: usize = 39;

    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(Self::LEN);
        v.push(Self::V1);
        v.extend_from_slice(&self.nonce.to_be_bytes());
        v.extend_from_slice(&self.deadline.0.to_be_bytes());
        v.extend_from_slice(&self.claimed_at.0.to_be_bytes());
        v.extend_from_slice(&self.attempt.to_be_bytes());
        v.extend_from_slice(&self.sinks.to_be_bytes());
        v.extend_from_slice(&self.sink_hash.to_be_bytes());
        v
    }

    pub fn decode(key: &[u8], v: &[u8]) -> Result<Lease, QueueError> {
        let bad = || {
            QueueError::corrupt_at(
                Family::Claim,
                key,
                format!("bad value {}", ankusa_keyspace::hex(v)),
            )
        };
        if v.len() != Self::LEN || v[0] != Self::V1 {
            return Err(bad());
        }
        let u64_at = |i: usize| -> Result<u64, QueueError> {
            Ok(u64::from_be_bytes(
                v[i..i + 8].try_into().map_err(|_| bad())?,
            ))
        };
        Ok(Lease {
            nonce: u64_at(1)?,
            deadline: AtMs(u64_at(9)?),
            claimed_at: AtMs(u64_at(17)?),
            attempt: u32::from_be_bytes(v[25..29].try_into().map_err(|_| bad())?),
            sinks: u16::from_be_bytes(v[29..31].try_into().map_err(|_| bad())?),
            sink_hash: u64_at(31)?,
        })
    }
}

/// The hash a lease keeps of its pull sink's id (FNV-1a, 64 bits: it tells configured
/// sinks apart, nothing more).
pub fn sink_hash(sink_id: &str) -> u64 {
    sink_id.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Park: a due row of a pull sink (`sink_id`) waits for a consumer in `?P`; its kind, and
/// with it the counter it is in, stays.
pub fn park(tx: &mut Tx, row: &DueRow, sink_id: &str) {
    tx.delete_due(row);
    let pulled = PulledRow {
        key: PulledKey {
            ord: row.key.ord,
            sink_id: sink_id.to_owned(),
            at: row.key.at,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        size: row.size,
        kind: row.kind,
    };
    tx.op(Op::put(
        Cf::Index,
        ankusa_keyspace::pulled(&pulled.key),
        pulled.value(),
    ));
    tx.delta(row.key.ord, row.kind.field(), 1);
}

/// Lease: waiting → inflight, with its lease, in one unit (the row must still be waiting,
/// as read).
pub fn lease(tx: &mut Tx, row: &PulledRow, lease: &Lease) -> InflightRow {
    let key = ankusa_keyspace::pulled(&row.key);
    tx.consume(key.clone(), Some(row.value()));
    tx.op(Op::delete(Cf::Index, key));
    tx.delta(row.key.ord, row.kind.field(), -1);
    let inflight = row.inflight();
    tx.put_inflight(&inflight);
    tx.op(Op::put(
        Cf::Index,
        ankusa_keyspace::claim(row.key.seq, row.key.sink),
        lease.encode(),
    ));
    inflight
}

/// The transition just added (an outcome of `row`) also consumes its lease, which must
/// still be `lease`: a lease extended, settled or made again since is not this one.
pub fn settle_lease(tx: &mut Tx, row: &InflightRow, lease: &Lease) {
    let key = ankusa_keyspace::claim(row.key.seq, row.key.sink);
    tx.consume_also(key.clone(), Some(lease.encode()));
    tx.op(Op::delete(Cf::Index, key));
}

/// Extend: the lease `old` of delivery (`seq`, `sink`) gets `new`'s deadline, if it is
/// still `old`.
pub fn extend_lease(tx: &mut Tx, seq: Seq, sink: SinkIdx, old: &Lease, new: &Lease) {
    let key = ankusa_keyspace::claim(seq, sink);
    tx.consume(key.clone(), Some(old.encode()));
    tx.op(Op::put(Cf::Index, key, new.encode()));
}

/// A delivery's lease, if it has one.
pub fn read_lease(store: &Store, seq: Seq, sink: SinkIdx) -> Result<Option<Lease>, QueueError> {
    let key = ankusa_keyspace::claim(seq, sink);
    store
        .get(Cf::Index, &key)?
        .map(|v| Lease::decode(&key, &v))
        .transpose()
}

/// The leases of several deliveries (one `multi_get`).
pub fn read_leases(
    store: &Store,
    deliveries: &[(Seq, SinkIdx)],
) -> Result<Vec<Option<Lease>>, QueueError> {
    let keys: Vec<Vec<u8>> = deliveries
        .iter()
        .map(|(seq, sink)| ankusa_keyspace::claim(*seq, *sink))
        .collect();
    store
        .multi_get(Cf::Index, &keys)?
        .into_iter()
        .zip(&keys)
        .map(|(v, k)| v.map(|v| Lease::decode(k, &v)).transpose())
        .collect()
}

/// Every lease in the store, with its inflight row's delivery (a boot's expiry schedule;
/// O(leases)).
pub fn leases(store: &Store) -> Result<Vec<(Seq, SinkIdx, Lease)>, QueueError> {
    let mut out = Vec::new();
    for kv in store.scan_family(Family::Claim)? {
        let (k, v) = kv?;
        let (seq, sink) = ankusa_keyspace::decode_claim(&k)?;
        out.push((seq, sink, Lease::decode(&k, &v)?));
    }
    Ok(out)
}

/// The first tenant at or after `from` with a waiting pull row (for any pull sink).
pub fn next_pull_tenant(store: &Store, from: TenantOrd) -> Result<Option<TenantOrd>, QueueError> {
    let (lo, hi) = ankusa_keyspace::pulled_from(from);
    match store.first(Family::Pulled, &lo, &hi, Dir::Forward)? {
        None => Ok(None),
        Some((k, _)) => Ok(Some(ankusa_keyspace::decode_pulled(&k)?.ord)),
    }
}

/// Up to `limit` of tenant `ord`'s rows waiting for pull sink `sink_id`, oldest first.
pub fn waiting_pulls(
    store: &Store,
    ord: TenantOrd,
    sink_id: &str,
    limit: usize,
) -> Result<Vec<PulledRow>, QueueError> {
    let (lo, hi) = ankusa_keyspace::pulled_sink_range(ord, sink_id);
    collect(
        store.scan(Family::Pulled, &lo, &hi, Dir::Forward)?,
        limit,
        PulledRow::decode,
    )
}

/// Up to `limit` of tenant `ord`'s rows waiting for pull sink `sink_id` at or after the
/// row key fields `from` (`None`: from its first), oldest first.
pub fn waiting_pulls_from(
    store: &Store,
    ord: TenantOrd,
    sink_id: &str,
    from: Option<(AtMs, Seq, SinkIdx)>,
    limit: usize,
) -> Result<Vec<PulledRow>, QueueError> {
    let (lo, hi) = ankusa_keyspace::pulled_sink_range(ord, sink_id);
    let lo = match from {
        None => lo,
        Some((at, seq, sink)) => ankusa_keyspace::pulled(&PulledKey {
            ord,
            sink_id: sink_id.to_owned(),
            at,
            seq,
            sink,
        }),
    };
    collect(
        store.scan(Family::Pulled, &lo, &hi, Dir::Forward)?,
        limit,
        PulledRow::decode,
    )
}

/// Up to `limit` of tenant `ord`'s waiting pull rows, for every pull sink (a purge).
pub fn waiting_pulls_of_tenant(
    store: &Store,
    ord: TenantOrd,
    limit: usize,
) -> Result<Vec<PulledRow>, QueueError> {
    let (lo, hi) = ankusa_keyspace::pulled_tenant_range(ord);
    collect(
        store.scan(Family::Pulled, &lo, &hi, Dir::Forward)?,
        limit,
        PulledRow::decode,
    )
}

/// Every waiting pull row (the fold, tools and tests; O(waiting)).
pub fn pulled_rows(store: &Store) -> Result<Vec<PulledRow>, QueueError> {
    collect(
        store.scan_family(Family::Pulled)?,
        usize::MAX,
        PulledRow::decode,
    )
}

/// Purge one waiting pull row.
pub fn purge_pulled(tx: &mut Tx, row: &PulledRow) {
    let key = ankusa_keyspace::pulled(&row.key);
    tx.consume(key.clone(), Some(row.value()));
    tx.op(Op::delete(Cf::Index, key));
    tx.delta(row.key.ord, row.kind.field(), -1);
    tx.drop_row(row.key.ord, row.key.seq, row.key.sink, row.size);
}

/// Whether delivery (`seq`, `sink`) of tenant `ord` waits for pull sink `sink_id` at `at`.
pub fn pulled_at(
    store: &Store,
    ord: TenantOrd,
    sink_id: &str,
    at: AtMs,
    seq: Seq,
    sink: SinkIdx,
) -> Result<Option<Kind>, QueueError> {
    let key = ankusa_keyspace::pulled(&PulledKey {
        ord,
        sink_id: sink_id.to_owned(),
        at,
        seq,
        sink,
    });
    match store.get(Cf::Index, &key)? {
        None => Ok(None),
        Some(v) => Ok(Some(PulledRow::decode(&key, &v)?.kind)),
    }
}
