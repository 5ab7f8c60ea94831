//! Delivery rows and every transition between their states — the only module that builds
//! `?D ?F ?X ?A` keys (ADR "structural guard").
//!
//! A delivery is one (hook, sink) pair. Its state is which index key it has:
//!
//! ```text
//!             ingest/expand/revive/recover (kind 0)      retry (kind 1)
//!   ──────────────► due ?D ───claim──► inflight ?F ──────────────────┐
//!                    ▲                   │ │ │                       │
//!                    └───────────────────┘ │ └─dead_letter─► dead ?x + ?X
//!                                          └─delivered / orphan_drop─► (row gone, ?c)
//! ```
//!
//! Every op builder takes a [`Tx`] and adds its ops *and* its counter deltas; a `Tx` turns
//! into one atomic batch with [`Tx::into_ops`], which appends the coalesced counter merges.
//! There is no way to put a due row without its active marker ([`Tx::enqueue`] writes
//! both), nor to move a row without its deltas.

use std::collections::BTreeSet;

use super::counters::{self, Delta};
use ankusa_store::keys::{
    self, AtMs, Bucket, CounterField, DeadKey, DueKey, Family, InflightKey, Seq, SinkIdx, TenantOrd,
};
use ankusa_store::{Cf, Dir, Op, Store, StoreError};
/// The values rows and hooks hold (crate `ankusa-values`).
pub use ankusa_values::{DeadValue, DeliveryRow, Envelope};

/// The most rows one purge or recovery batch touches.
pub const CHUNK_ROWS: usize = 500;
/// How many stale markers the oldest-due-age read skips before it settles for a bucket.
pub const OLDEST_DUE_MAX_SKIPS: usize = 32;

/// Why a due row is waiting: kind 0 counts as `pending`, kind 1 as `scheduled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    /// First attempt, replay revival, recovery or expansion.
    First = 0,
    /// Waiting out (or just past) a retry backoff.
    Retry = 1,
}

impl Kind {
    fn field(self) -> CounterField {
        match self {
            Kind::First => CounterField::Pending,
            Kind::Retry => CounterField::Scheduled,
        }
    }
}

/// A due row: its key fields and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DueRow {
    pub key: DueKey,
    pub size: u32,
    pub kind: Kind,
}

impl DueRow {
    pub fn decode(key: &[u8], value: &[u8]) -> Result<DueRow, StoreError> {
        let key = keys::decode_due(key)?;
        match value {
            [a, b, c, d, k] if *k <= 1 => Ok(DueRow {
                key,
                size: u32::from_be_bytes([*a, *b, *c, *d]),
                kind: if *k == 0 { Kind::First } else { Kind::Retry },
            }),
            _ => Err(StoreError::Corruption {
                family: "due",
                detail: format!("bad value {}", keys::hex(value)),
            }),
        }
    }
}

/// An inflight row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InflightRow {
    pub key: InflightKey,
    pub size: u32,
}

impl InflightRow {
    pub fn decode(key: &[u8], value: &[u8]) -> Result<InflightRow, StoreError> {
        let key = keys::decode_inflight(key)?;
        let size = size_value(value).ok_or_else(|| StoreError::Corruption {
            family: "inflight",
            detail: format!("bad value {}", keys::hex(value)),
        })?;
        Ok(InflightRow { key, size })
    }
}

fn size_value(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// A dead row: `?x` key and value (its `?X` twin carries the same key fields).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeadRow {
    pub key: DeadKey,
    pub value: DeadValue,
}

impl DeadRow {
    pub fn decode(key: &[u8], value: &[u8]) -> Result<DeadRow, StoreError> {
        Ok(DeadRow {
            key: keys::decode_dead(key)?,
            value: DeadValue::decode(value).map_err(|e| StoreError::Corruption {
                family: "dead",
                detail: e.to_string(),
            })?,
        })
    }
}

/// A due row's value: its size and kind.
fn due_value(row: &DueRow) -> Vec<u8> {
    let mut v = row.size.to_be_bytes().to_vec();
    v.push(row.kind as u8);
    v
}

/// One atomic batch of queue transitions: ops plus the counter deltas they imply.
///
/// A transition that consumes a row (claim, an outcome, revive, recover, purge: every
/// delete of a due, inflight or dead row) is a *unit* that commits only if that row still
/// exists when the batch commits. [`Tx::commit`] checks every unit's row and writes the
/// batch inside one critical section of the store's transition lock, so two writers that
/// read the same row (two replays, a purge and a claim, a replay and a purge) move it
/// once between them, and only the transitions that moved a row count.
#[derive(Debug, Default)]
pub struct Tx {
    /// Ops and deltas of no unit: creations (ingest, imports) and [`Tx::push_op`].
    ops: Vec<Op>,
    deltas: Vec<Delta>,
    units: Vec<Unit>,
}

/// One consuming transition: the `Index` key of the row it consumes, the value the row
/// had when it was read (where the deltas depend on it: a due row's kind), and what it
/// writes.
#[derive(Debug)]
struct Unit {
    consumes: Vec<u8>,
    expects: Option<Vec<u8>>,
    ops: Vec<Op>,
    deltas: Vec<Delta>,
}

/// The `Index` key and value an op puts, if it puts one.
fn index_put(op: &Op) -> Option<(Vec<u8>, Vec<u8>)> {
    match op {
        Op::Put {
            cf: Cf::Index,
            key,
            value,
        } => Some((key.clone(), value.clone())),
        _ => None,
    }
}

/// What [`Tx::commit`] did: for each consuming transition, in the order they were added,
/// whether its row was still there (and so it moved).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Committed {
    pub moved: Vec<bool>,
}

impl Committed {
    /// How many consuming transitions moved their row.
    pub fn count(&self) -> u64 {
        self.moved.iter().filter(|m| **m).count() as u64
    }
}

impl Tx {
    pub fn new() -> Self {
        Tx::default()
    }

    /// An op outside the queue index (tenant allocation, dedupe keys, audit rows, a
    /// migration cursor) that must commit with this batch, whatever its units do.
    pub fn push_op(&mut self, op: Op) {
        self.ops.push(op);
    }

    pub fn is_empty(&self) -> bool {
        self.ops.is_empty() && self.deltas.is_empty() && self.units.is_empty()
    }

    /// The batch with every unit in it, unchecked: for a single writer (a migration, a
    /// fixture) that owns the whole store. Every op, then the coalesced counter merges.
    pub fn into_ops(self) -> Vec<Op> {
        let (mut ops, mut deltas) = (self.ops, self.deltas);
        for u in self.units {
            ops.extend(u.ops);
            deltas.extend(u.deltas);
        }
        ops.extend(counters::ops(&deltas));
        ops
    }

    /// Checks each unit's row and writes the batch, both under the store's transition
    /// lock: a unit whose row is gone (another writer moved it first), or that consumes
    /// a row an earlier unit of this batch consumed, is left out with its deltas. A batch
    /// with no unit (ingest: creations only) has nothing to check and writes without the
    /// lock, so the writer's synced commits never wait on dispatch or admin commits.
    pub fn commit(self, store: &Store, sync: bool) -> Result<Committed, StoreError> {
        if self.is_empty() {
            return Ok(Committed::default());
        }
        if self.units.is_empty() {
            store.write(self.into_ops(), sync)?;
            return Ok(Committed::default());
        }
        let _serialised = store.transition_lock();
        let wanted: Vec<Vec<u8>> = self.units.iter().map(|u| u.consumes.clone()).collect();
        let present = store.multi_get(Cf::Index, &wanted)?;
        let mut ops = self.ops;
        let mut deltas = self.deltas;
        // Rows this batch itself writes before a unit consumes them (a claim and its
        // outcome in one batch) are there for that unit.
        let mut created: std::collections::HashMap<Vec<u8>, Vec<u8>> =
            ops.iter().filter_map(index_put).collect();
        let mut consumed = std::collections::HashSet::new();
        let mut moved = Vec::with_capacity(self.units.len());
        // The row is there, and as it was read: the same key written again since with
        // another value (a due row that became a retry under the same key) is not the
        // row this unit's deltas describe.
        let as_read = |have: Option<&[u8]>, u: &Unit| match (have, &u.expects) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(v), Some(e)) => v == e.as_slice(),
        };
        for (u, p) in self.units.into_iter().zip(present) {
            let ok = match created.remove(&u.consumes) {
                Some(v) => as_read(Some(&v), &u),
                None => as_read(p.as_deref(), &u) && consumed.insert(u.consumes.clone()),
            };
            if ok {
                created.extend(u.ops.iter().filter_map(index_put));
                ops.extend(u.ops);
                deltas.extend(u.deltas);
            }
            moved.push(ok);
        }
        ops.extend(counters::ops(&deltas));
        if !ops.is_empty() {
            store.write(ops, sync)?;
        }
        Ok(Committed { moved })
    }

    /// Starts a unit: what follows (until the next unit) commits only if `key` is there
    /// (and, with `expects`, holds that value).
    fn consume(&mut self, key: Vec<u8>, expects: Option<Vec<u8>>) {
        self.units.push(Unit {
            consumes: key,
            expects,
            ops: Vec::new(),
            deltas: Vec::new(),
        });
    }

    /// An op that rides with the transition just added: it commits only if that
    /// transition's row moves (the hook log's events).
    pub(super) fn unit_op(&mut self, op: Op) {
        self.op(op);
    }

    /// An op of the current unit (or of none).
    fn op(&mut self, op: Op) {
        match self.units.last_mut() {
            Some(u) => u.ops.push(op),
            None => self.ops.push(op),
        }
    }

    fn delta(&mut self, ord: TenantOrd, field: CounterField, d: i64) {
        let delta = Delta::new(ord, field, d);
        match self.units.last_mut() {
            Some(u) => u.deltas.push(delta),
            None => self.deltas.push(delta),
        }
    }

    /// Puts a due row and its active marker (ADR `due_ops`): the only way a due row is
    /// written. Counts it as pending (kind 0) or scheduled (kind 1).
    fn enqueue(&mut self, row: &DueRow) {
        self.op(Op::put(Cf::Index, keys::due(&row.key), due_value(row)));
        self.op(Op::put(
            Cf::Index,
            keys::active(row.key.at.bucket(), row.key.ord),
            Vec::new(),
        ));
        self.delta(row.key.ord, row.kind.field(), 1);
    }

    fn put_inflight(&mut self, row: &InflightRow) {
        self.op(Op::put(
            Cf::Index,
            keys::inflight(&row.key),
            row.size.to_be_bytes(),
        ));
        self.delta(row.key.ord, CounterField::Inflight, 1);
    }

    fn delete_inflight(&mut self, row: &InflightRow) {
        self.consume(keys::inflight(&row.key), None);
        self.op(Op::delete(Cf::Index, keys::inflight(&row.key)));
        self.delta(row.key.ord, CounterField::Inflight, -1);
    }

    fn delete_due(&mut self, row: &DueRow) {
        // Its kind decides which counter goes down: the row must still be that kind.
        self.consume(keys::due(&row.key), Some(due_value(row)));
        self.op(Op::delete(Cf::Index, keys::due(&row.key)));
        self.delta(row.key.ord, row.kind.field(), -1);
    }

    /// Deletes a delivery row, gives back its bytes, and leaves a `?c` marker so reclaim
    /// looks at the hook.
    fn drop_row(&mut self, ord: TenantOrd, seq: Seq, sink: SinkIdx, size: u32) {
        self.op(Op::delete(Cf::Deliveries, keys::delivery(seq, sink)));
        self.op(Op::put(Cf::Index, keys::cleared(seq), Vec::new()));
        self.delta(ord, CounterField::Bytes, -(size as i64));
    }
}

/// What ingest needs to enqueue one hook.
#[derive(Debug, Clone)]
pub struct NewHook<'a> {
    pub seq: Seq,
    pub ord: TenantOrd,
    pub envelope: &'a Envelope,
    /// Keep an archive obligation (`?a`) until the archive has the hook.
    pub archive: bool,
    /// Write the hook log's record and id ([`super::hooklog`]).
    pub log: bool,
}

/// Ingest: the hook, one delivery row and one due row (kind 0, due at receipt) per sink,
/// and the archive obligation. Returns the encoded size every row counts.
pub fn ingest(tx: &mut Tx, h: &NewHook<'_>) -> u32 {
    let env = h.envelope.encode();
    let size = env.len() as u32;
    tx.op(Op::put(Cf::Hooks, keys::hook(h.seq), env));
    for i in 0..h.envelope.sinks.len() {
        add_delivery(
            tx,
            h.ord,
            h.seq,
            SinkIdx(i as u16),
            size,
            h.envelope.received_at,
        );
    }
    if h.archive {
        let mut v = size.to_be_bytes().to_vec();
        v.extend_from_slice(&h.ord.0.to_be_bytes());
        tx.op(Op::put(Cf::Index, keys::archive(h.seq), v));
        tx.delta(h.ord, CounterField::ArchivePending, 1);
    }
    if h.log {
        super::hooklog::log_ingest(tx, h.seq, h.envelope);
    }
    size
}

fn add_delivery(tx: &mut Tx, ord: TenantOrd, seq: Seq, sink: SinkIdx, size: u32, at: AtMs) {
    let row = DeliveryRow {
        ord,
        size,
        ..DeliveryRow::default()
    };
    tx.op(Op::put(
        Cf::Deliveries,
        keys::delivery(seq, sink),
        row.encode(),
    ));
    tx.delta(ord, CounterField::Bytes, size as i64);
    tx.enqueue(&DueRow {
        key: DueKey { ord, at, seq, sink },
        size,
        kind: Kind::First,
    });
}

/// Expand: a new delivery of an existing hook to sink `sink` (rows imported from an older
/// release, or a route gaining a sink), due at `at` as a first attempt.
pub fn expand(tx: &mut Tx, ord: TenantOrd, seq: Seq, sink: SinkIdx, size: u32, at: AtMs) {
    add_delivery(tx, ord, seq, sink, size, at);
}

/// Claim: due → inflight, with the ord and size the due row carries.
pub fn claim(tx: &mut Tx, row: &DueRow) -> InflightRow {
    tx.delete_due(row);
    let inflight = InflightRow {
        key: InflightKey {
            ord: row.key.ord,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        size: row.size,
    };
    tx.put_inflight(&inflight);
    inflight
}

/// Delivered: the inflight row and its delivery row go.
pub fn delivered(tx: &mut Tx, row: &InflightRow) {
    tx.delete_inflight(row);
    tx.drop_row(row.key.ord, row.key.seq, row.key.sink, row.size);
}

/// Retry: inflight → due at `at` with kind 1; the delivery row records the attempt.
pub fn retry(tx: &mut Tx, row: &InflightRow, at: AtMs, updated: &DeliveryRow) {
    tx.delete_inflight(row);
    tx.op(Op::put(
        Cf::Deliveries,
        keys::delivery(row.key.seq, row.key.sink),
        updated.encode(),
    ));
    tx.enqueue(&DueRow {
        key: DueKey {
            ord: row.key.ord,
            at,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        size: row.size,
        kind: Kind::Retry,
    });
}

/// Dead-letter: inflight → dead, keyed by time (`?x`, its value carrying the ord) and by
/// tenant (`?X`). The delivery row stays (the DLQ still owes it), so bytes do not change.
pub fn dead_letter(
    tx: &mut Tx,
    row: &InflightRow,
    at: AtMs,
    source: &str,
    hook_id: &str,
    sink: &str,
    updated: Option<&DeliveryRow>,
) -> DeadRow {
    tx.delete_inflight(row);
    if let Some(updated) = updated {
        tx.op(Op::put(
            Cf::Deliveries,
            keys::delivery(row.key.seq, row.key.sink),
            updated.encode(),
        ));
    }
    let dead = DeadRow {
        key: DeadKey {
            at,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        value: DeadValue {
            ord: row.key.ord,
            size: row.size,
            source: source.to_owned(),
            hook_id: hook_id.to_owned(),
            sink: sink.to_owned(),
        },
    };
    tx.op(Op::put(
        Cf::Index,
        keys::dead(&dead.key),
        dead.value.encode(),
    ));
    tx.op(Op::put(
        Cf::Index,
        keys::dead_by_tenant(row.key.ord, &dead.key),
        Vec::new(),
    ));
    tx.delta(row.key.ord, CounterField::Dead, 1);
    dead
}

/// Orphan drop: an inflight delivery whose hook is gone or undecodable is removed through
/// the counted path.
pub fn orphan_drop(tx: &mut Tx, row: &InflightRow) {
    delivered(tx, row);
}

/// Revive (replay): dead → due at `at`, kind 0.
pub fn revive(tx: &mut Tx, row: &DeadRow, at: AtMs) {
    delete_dead(tx, row);
    tx.enqueue(&DueRow {
        key: DueKey {
            ord: row.value.ord,
            at,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        size: row.value.size,
        kind: Kind::First,
    });
}

fn delete_dead(tx: &mut Tx, row: &DeadRow) {
    tx.consume(keys::dead(&row.key), None);
    tx.op(Op::delete(Cf::Index, keys::dead(&row.key)));
    tx.op(Op::delete(
        Cf::Index,
        keys::dead_by_tenant(row.value.ord, &row.key),
    ));
    tx.delta(row.value.ord, CounterField::Dead, -1);
}

/// Recover (boot): an inflight row left by a crash goes back to due at `at`, kind 0.
pub fn recover(tx: &mut Tx, row: &InflightRow, at: AtMs) {
    tx.delete_inflight(row);
    tx.enqueue(&DueRow {
        key: DueKey {
            ord: row.key.ord,
            at,
            seq: row.key.seq,
            sink: row.key.sink,
        },
        size: row.size,
        kind: Kind::First,
    });
}

/// Purge one due row (its marker is left for the pipeline's cleanup).
pub fn purge_due(tx: &mut Tx, row: &DueRow) {
    tx.delete_due(row);
    tx.drop_row(row.key.ord, row.key.seq, row.key.sink, row.size);
}

/// Purge one dead row.
pub fn purge_dead(tx: &mut Tx, row: &DeadRow) {
    delete_dead(tx, row);
    tx.drop_row(row.value.ord, row.key.seq, row.key.sink, row.value.size);
}

/// An archive obligation (`?a`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArchiveObligation {
    pub seq: Seq,
    pub ord: TenantOrd,
    pub size: u32,
}

impl ArchiveObligation {
    pub fn decode(key: &[u8], value: &[u8]) -> Result<Self, StoreError> {
        let seq = keys::decode_archive(key)?;
        match value {
            [a, b, c, d, e, f, g, h] => Ok(ArchiveObligation {
                seq,
                size: u32::from_be_bytes([*a, *b, *c, *d]),
                ord: TenantOrd(u32::from_be_bytes([*e, *f, *g, *h])),
            }),
            _ => Err(StoreError::Corruption {
                family: "archive_pending",
                detail: format!("bad value {}", keys::hex(value)),
            }),
        }
    }
}

/// Archive settle: the hook is archived; the obligation goes and reclaim may look. A unit:
/// it (and what rides with it, [`Tx::unit_op`]) commits only if the obligation is there.
pub fn archive_settle(tx: &mut Tx, ob: &ArchiveObligation) {
    tx.consume(keys::archive(ob.seq), None);
    tx.op(Op::delete(Cf::Index, keys::archive(ob.seq)));
    tx.op(Op::put(Cf::Index, keys::cleared(ob.seq), Vec::new()));
    tx.delta(ob.ord, CounterField::ArchivePending, -1);
}

/// Archive drop: the obligation is given up (the archive is off, or the hook is gone).
pub fn archive_drop(tx: &mut Tx, ob: &ArchiveObligation) {
    archive_settle(tx, ob);
}

// ---------------------------------------------------------------------------------------
// Imports: rows that already exist in an older layout, re-keyed by the 2 -> 3 migration.
// Each puts the format-3 index row with its counter deltas; the caller deletes the old key.

/// An imported due row (and its marker): pending or scheduled +1, bytes +size.
pub fn import_due(tx: &mut Tx, row: &DueRow) {
    tx.enqueue(row);
    tx.delta(row.key.ord, CounterField::Bytes, row.size as i64);
}

/// An imported inflight row: inflight +1, bytes +size.
pub fn import_inflight(tx: &mut Tx, row: &InflightRow) {
    tx.put_inflight(row);
    tx.delta(row.key.ord, CounterField::Bytes, row.size as i64);
}

/// An imported dead row: `?x` rewritten with the ord in its value, and `?X`; dead +1,
/// bytes +size.
pub fn import_dead(tx: &mut Tx, row: &DeadRow) {
    tx.op(Op::put(Cf::Index, keys::dead(&row.key), row.value.encode()));
    tx.op(Op::put(
        Cf::Index,
        keys::dead_by_tenant(row.value.ord, &row.key),
        Vec::new(),
    ));
    tx.delta(row.value.ord, CounterField::Dead, 1);
    tx.delta(row.value.ord, CounterField::Bytes, row.value.size as i64);
}

/// An imported archive obligation, rewritten with the ord in its value: archive_pending +1.
pub fn import_archive(tx: &mut Tx, ob: &ArchiveObligation) {
    let mut v = ob.size.to_be_bytes().to_vec();
    v.extend_from_slice(&ob.ord.0.to_be_bytes());
    tx.op(Op::put(Cf::Index, keys::archive(ob.seq), v));
    tx.delta(ob.ord, CounterField::ArchivePending, 1);
}

// ---------------------------------------------------------------------------------------
// Reads.

fn collect<T>(
    scan: impl Iterator<Item = Result<ankusa_store::KeyValue, StoreError>>,
    limit: usize,
    mut decode: impl FnMut(&[u8], &[u8]) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    let mut out = Vec::new();
    for kv in scan.take(limit) {
        let (k, v) = kv?;
        out.push(decode(&k, &v)?);
    }
    Ok(out)
}

/// A tenant with due work, and the markers the scan saw for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveTenant {
    pub ord: TenantOrd,
    /// Marker buckets seen, oldest first.
    pub buckets: Vec<Bucket>,
}

/// The first `limit` active markers with a bucket at or before `now`'s, oldest first,
/// grouped by tenant (in order of each tenant's oldest marker). Never touches a tenant
/// with nothing due, so its cost depends on neither the tenant count nor the backlog.
pub fn active_tenants(
    store: &Store,
    now: AtMs,
    limit: usize,
) -> Result<Vec<ActiveTenant>, StoreError> {
    active_tenants_distinct(store, now, usize::MAX, limit)
}

/// The first `max_tenants` distinct tenants with a marker at or before `now`'s bucket, in
/// order of each one's oldest marker, reading at most `max_markers` markers (a tenant
/// with markers in many buckets cannot make the read unbounded); a marker of a tenant
/// past `max_tenants` is where the read stops. Markers are grouped in one pass (a hash
/// index, not a search per marker). The per-tenant gauge and `/v1/tenants` sample with it.
pub fn active_tenants_distinct(
    store: &Store,
    now: AtMs,
    max_tenants: usize,
    max_markers: usize,
) -> Result<Vec<ActiveTenant>, StoreError> {
    active_tenants_from(store, Bucket(0), now, max_tenants, max_markers)
}

/// [`active_tenants_distinct`] over the markers from bucket `from` on: the dispatch tick
/// starts where the live markers start, not at the cleaned markers' tombstones below them.
pub fn active_tenants_from(
    store: &Store,
    from: Bucket,
    now: AtMs,
    max_tenants: usize,
    max_markers: usize,
) -> Result<Vec<ActiveTenant>, StoreError> {
    let (lo, end) = keys::active_range(from, now.bucket());
    let mut out: Vec<ActiveTenant> = Vec::new();
    let mut index: std::collections::HashMap<TenantOrd, usize> = std::collections::HashMap::new();
    for kv in store
        .scan(Family::Active, &lo, &end, Dir::Forward)?
        .take(max_markers)
    {
        let (k, _) = kv?;
        let (bucket, ord) = keys::decode_active(&k)?;
        match index.get(&ord) {
            Some(&i) => out[i].buckets.push(bucket),
            None if out.len() >= max_tenants => break,
            None => {
                index.insert(ord, out.len());
                out.push(ActiveTenant {
                    ord,
                    buckets: vec![bucket],
                });
            }
        }
    }
    Ok(out)
}

/// A tenant's due rows with `floor <= at <= now`, oldest first, at most `limit` rows and
/// `byte_budget` bytes (the first row is always returned, however large).
pub fn due_for_tenant(
    store: &Store,
    ord: TenantOrd,
    now: AtMs,
    floor: AtMs,
    limit: usize,
    byte_budget: u64,
) -> Result<Vec<DueRow>, StoreError> {
    let (from, to) = keys::due_range(ord, floor, AtMs(now.0.saturating_add(1)));
    let mut out = Vec::new();
    let mut bytes = 0u64;
    for kv in store.scan(Family::Due, &from, &to, Dir::Forward)? {
        if out.len() >= limit {
            break;
        }
        let (k, v) = kv?;
        let row = DueRow::decode(&k, &v)?;
        bytes += row.size as u64;
        if bytes > byte_budget && !out.is_empty() {
            break;
        }
        out.push(row);
    }
    Ok(out)
}

/// The earliest due row of a tenant (one seek).
pub fn first_due(store: &Store, ord: TenantOrd) -> Result<Option<DueRow>, StoreError> {
    first_due_from(store, ord, AtMs(0))
}

/// The earliest due row of a tenant at or after `from` (one seek, over only the
/// tombstones of rows claimed since `from`).
pub fn first_due_from(
    store: &Store,
    ord: TenantOrd,
    from: AtMs,
) -> Result<Option<DueRow>, StoreError> {
    let (from, _) = keys::due_range(ord, from, from);
    let (_, to) = keys::due_tenant_range(ord);
    match store.first(Family::Due, &from, &to, Dir::Forward)? {
        Some((k, v)) => Ok(Some(DueRow::decode(&k, &v)?)),
        None => Ok(None),
    }
}

fn has_due_in(store: &Store, ord: TenantOrd, bucket: Bucket) -> Result<bool, StoreError> {
    let (from, to) = keys::due_range(
        ord,
        bucket.start(),
        Bucket(bucket.0.saturating_add(1)).start(),
    );
    Ok(store
        .first(Family::Due, &from, &to, Dir::Forward)?
        .is_some())
}

/// Cleanup step 1 (ADR section 5): which scanned markers are stale.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a cleanup plan must be carried out"]
pub struct CleanupPlan {
    pub ord: TenantOrd,
    pub stale: Vec<Bucket>,
}

/// Markers deleted by step 2, to be verified by step 3.
#[derive(Debug, Clone, PartialEq, Eq)]
#[must_use = "a cleanup must be verified"]
pub struct DeletedMarkers {
    pub ord: TenantOrd,
    pub buckets: Vec<Bucket>,
}

/// Cleanup, step 1: reads the tenant's first due row; the scanned markers older than its
/// bucket (older than `now`'s bucket if it has none) are stale. A marker of the current
/// second is never stale.
pub fn cleanup_plan(
    store: &Store,
    ord: TenantOrd,
    scanned: &[Bucket],
    now: AtMs,
) -> Result<CleanupPlan, StoreError> {
    // Only markers older than the current second can be stale; with none, skip the seek.
    if scanned.iter().all(|b| *b >= now.bucket()) {
        return Ok(CleanupPlan {
            ord,
            stale: Vec::new(),
        });
    }
    // Every due row has its marker, and the scan met the tenant's markers oldest first:
    // no due row of the tenant is older than the first scanned bucket.
    let oldest = scanned.iter().min().copied().unwrap_or(Bucket(0));
    let keep_from = match first_due_from(store, ord, oldest.start())? {
        Some(first) => first.key.at.bucket().min(now.bucket()),
        None => now.bucket(),
    };
    let stale: BTreeSet<Bucket> = scanned.iter().copied().filter(|b| *b < keep_from).collect();
    Ok(CleanupPlan {
        ord,
        stale: stale.into_iter().collect(),
    })
}

/// Cleanup, step 2: deletes the stale markers (not synced: a lost delete only costs an
/// empty visit).
pub fn cleanup_delete(store: &Store, plan: CleanupPlan) -> Result<DeletedMarkers, StoreError> {
    if !plan.stale.is_empty() {
        let ops = plan
            .stale
            .iter()
            .map(|b| Op::delete(Cf::Index, keys::active(*b, plan.ord)))
            .collect();
        store.write(ops, false)?;
    }
    Ok(DeletedMarkers {
        ord: plan.ord,
        buckets: plan.stale,
    })
}

/// Cleanup, step 3: puts back every deleted marker whose bucket still holds a due row of
/// the tenant — a row a concurrent writer committed (with its marker) after step 1 read
/// and before step 2 deleted. Writers only ever put markers and the pipeline is the only
/// deleter, so after this no due row is without its marker. Returns the buckets restored.
pub fn cleanup_verify(store: &Store, deleted: DeletedMarkers) -> Result<Vec<Bucket>, StoreError> {
    let mut restored = Vec::new();
    for b in deleted.buckets {
        if has_due_in(store, deleted.ord, b)? {
            restored.push(b);
        }
    }
    if !restored.is_empty() {
        let ops = restored
            .iter()
            .map(|b| Op::put(Cf::Index, keys::active(*b, deleted.ord), Vec::new()))
            .collect();
        store.write(ops, false)?;
    }
    Ok(restored)
}

/// The whole delete-then-verify cleanup of one tenant's scanned markers, after a claim.
/// Dispatch-side only: the pipeline is the one deleter of markers.
pub fn cleanup_markers(
    store: &Store,
    ord: TenantOrd,
    scanned: &[Bucket],
    now: AtMs,
) -> Result<(), StoreError> {
    let plan = cleanup_plan(store, ord, scanned, now)?;
    let deleted = cleanup_delete(store, plan)?;
    cleanup_verify(store, deleted)?;
    Ok(())
}

/// When the oldest due row became due: from the first active marker, verified against that
/// tenant's `first_due`; after [`OLDEST_DUE_MAX_SKIPS`] stale markers, the next marker's
/// bucket start. O(1) in the backlog.
pub fn oldest_due_at(store: &Store) -> Result<Option<AtMs>, StoreError> {
    let (lo, end) = Family::Active.bounds();
    for (i, kv) in store
        .scan(Family::Active, &lo, &end, Dir::Forward)?
        .enumerate()
    {
        let (k, _) = kv?;
        let (bucket, ord) = keys::decode_active(&k)?;
        if i >= OLDEST_DUE_MAX_SKIPS {
            return Ok(Some(bucket.start()));
        }
        if let Some(first) = first_due(store, ord)? {
            if first.key.at.bucket() <= bucket {
                return Ok(Some(first.key.at));
            }
        }
    }
    Ok(None)
}

/// A page of the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadPage {
    pub rows: Vec<DeadRow>,
    /// Pass back as `before` for the next page; `None` at the end.
    pub next: Option<DeadKey>,
}

fn page(rows: Vec<DeadRow>, limit: usize) -> DeadPage {
    let next = if rows.len() == limit {
        rows.last().map(|r| r.key)
    } else {
        None
    };
    DeadPage { rows, next }
}

/// The delivery rows of `(hook, sink)` pairs, in order (`None` where there is none). A row
/// that does not decode is an error naming its key, never read as absent.
pub fn delivery_rows(
    store: &Store,
    pairs: &[(Seq, SinkIdx)],
) -> Result<Vec<Option<DeliveryRow>>, StoreError> {
    let ks: Vec<Vec<u8>> = pairs.iter().map(|(s, k)| keys::delivery(*s, *k)).collect();
    store
        .multi_get(Cf::Deliveries, &ks)?
        .into_iter()
        .zip(&ks)
        .map(|(v, k)| {
            v.map(|v| {
                DeliveryRow::decode(&v).map_err(|e| StoreError::Corruption {
                    family: "deliveries",
                    detail: format!("{e} at {}", keys::hex(k)),
                })
            })
            .transpose()
        })
        .collect()
}

/// The hook `seq`'s envelope, if the hook is still stored. An envelope that does not
/// decode is an error.
pub fn envelope(store: &Store, seq: Seq) -> Result<Option<Envelope>, StoreError> {
    let k = keys::hook(seq);
    store
        .get(Cf::Hooks, &k)?
        .map(|v| {
            Envelope::decode(&v).map_err(|e| StoreError::Corruption {
                family: "hooks",
                detail: format!("{e} at {}", keys::hex(&k)),
            })
        })
        .transpose()
}

/// The node's dead rows, newest first, strictly before `before` (a reverse `?x` scan).
pub fn dead_page(
    store: &Store,
    before: Option<DeadKey>,
    limit: usize,
) -> Result<DeadPage, StoreError> {
    let (lo, end) = Family::Dead.bounds();
    let to = before.map_or(end, |k| keys::dead(&k));
    let rows = collect(
        store.scan(Family::Dead, &lo, &to, Dir::Reverse)?,
        limit,
        DeadRow::decode,
    )?;
    Ok(page(rows, limit))
}

/// One tenant's dead rows, newest first: a reverse scan of its `?X` range joined to the
/// `?x` values by key. Reads no hook.
pub fn dead_page_for_tenant(
    store: &Store,
    ord: TenantOrd,
    before: Option<DeadKey>,
    limit: usize,
) -> Result<DeadPage, StoreError> {
    let (lo, end) = keys::dead_tenant_range(ord);
    let to = before.map_or(end, |k| keys::dead_by_tenant(ord, &k));
    let dead_keys = collect(
        store.scan(Family::DeadByTenant, &lo, &to, Dir::Reverse)?,
        limit,
        |k, _| Ok(keys::decode_dead_by_tenant(k)?.1),
    )?;
    let values = store.multi_get(
        Cf::Index,
        &dead_keys.iter().map(keys::dead).collect::<Vec<_>>(),
    )?;
    // The next page starts after the last key scanned, even if its row moved meanwhile.
    let next = (dead_keys.len() == limit)
        .then(|| dead_keys.last().copied())
        .flatten();
    let mut rows = Vec::with_capacity(dead_keys.len());
    for (key, v) in dead_keys.into_iter().zip(values) {
        let Some(v) = v else {
            // `?x` and `?X` go in one batch: if `?X` is gone too, a replay or purge moved
            // the row between the two reads; if it is still there, the pair is broken.
            if store
                .get(Cf::Index, &keys::dead_by_tenant(ord, &key))?
                .is_none()
            {
                continue;
            }
            return Err(StoreError::Corruption {
                family: "dead_by_tenant",
                detail: format!("?X row without its ?x row at seq {}", key.seq.0),
            });
        };
        rows.push(DeadRow::decode(&keys::dead(&key), &v)?);
    }
    Ok(DeadPage { rows, next })
}

/// Which of a tenant's rows a purge removes (never inflight rows).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeKinds {
    pub pending: bool,
    pub dead: bool,
}

/// What a purge removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PurgeReport {
    pub due: u64,
    pub dead: u64,
    pub batches: u64,
}

/// One synced chunk of a purge: up to [`CHUNK_ROWS`] of the tenant's due rows (if asked),
/// else up to [`CHUNK_ROWS`] dead rows. Returns the rows removed (0 when nothing is left).
pub fn purge_tenant_chunk(
    store: &Store,
    ord: TenantOrd,
    kinds: PurgeKinds,
) -> Result<PurgeReport, StoreError> {
    purge_chunk(store, ord, kinds, Vec::new())
}

fn purge_chunk(
    store: &Store,
    ord: TenantOrd,
    kinds: PurgeKinds,
    extra: Vec<Op>,
) -> Result<PurgeReport, StoreError> {
    let mut tx = Tx::new();
    let mut report = PurgeReport::default();
    let mut due = 0usize;
    if kinds.pending {
        let (lo, end) = keys::due_tenant_range(ord);
        for row in collect(
            store.scan(Family::Due, &lo, &end, Dir::Forward)?,
            CHUNK_ROWS,
            DueRow::decode,
        )? {
            purge_due(&mut tx, &row);
            due += 1;
        }
    }
    if kinds.dead && due == 0 {
        let page = dead_page_for_tenant(store, ord, None, CHUNK_ROWS)?;
        for row in &page.rows {
            purge_dead(&mut tx, row);
        }
    }
    let found = !tx.is_empty();
    for op in extra {
        tx.push_op(op);
    }
    let committed = tx.commit(store, true)?;
    // Only the rows this purge removed count: a row claimed or purged by another writer
    // between the read and the commit was left as that writer made it.
    let (due_moved, dead_moved) = committed.moved.split_at(due.min(committed.moved.len()));
    report.due = due_moved.iter().filter(|m| **m).count() as u64;
    report.dead = dead_moved.iter().filter(|m| **m).count() as u64;
    if found {
        report.batches = 1;
    }
    Ok(report)
}

/// Purges a tenant's pending (due) and/or dead rows in synced chunks of [`CHUNK_ROWS`].
/// Idempotent: an interrupted purge finishes by being called again.
pub fn purge_tenant(
    store: &Store,
    ord: TenantOrd,
    kinds: PurgeKinds,
) -> Result<PurgeReport, StoreError> {
    purge_tenant_with(store, ord, kinds, Vec::new())
}

/// [`purge_tenant`], with `first` (an audit row) committed in the first chunk's batch.
pub fn purge_tenant_with(
    store: &Store,
    ord: TenantOrd,
    kinds: PurgeKinds,
    first: Vec<Op>,
) -> Result<PurgeReport, StoreError> {
    let mut total = PurgeReport::default();
    let mut first = Some(first);
    loop {
        let r = purge_chunk(store, ord, kinds, first.take().unwrap_or_default())?;
        if r.batches == 0 {
            return Ok(total);
        }
        total.due += r.due;
        total.dead += r.dead;
        total.batches += r.batches;
    }
}

/// Boot recovery: every inflight row (left by a crash) back to due at `now`, kind 0, in
/// synced chunks. Returns the rows recovered.
pub fn recover_inflight(store: &Store, now: AtMs, log: bool) -> Result<u64, StoreError> {
    let (lo, end) = Family::Inflight.bounds();
    let mut from = lo;
    let mut total = 0;
    loop {
        let rows = collect(
            store.scan(Family::Inflight, &from, &end, Dir::Forward)?,
            CHUNK_ROWS,
            InflightRow::decode,
        )?;
        let Some(last) = rows.last() else {
            return Ok(total);
        };
        from = keys::inflight(&last.key);
        from.push(0);
        let mut tx = Tx::new();
        for row in &rows {
            recover(&mut tx, row, now);
            if log {
                let ev = super::hooklog::requeued(keys::EventKind::Recovered, now, 0, now);
                super::hooklog::record(&mut tx, store, row.key.seq, row.key.sink, &ev)?;
            }
        }
        total += rows.len() as u64;
        tx.commit(store, true)?;
    }
}

/// The archive obligations, oldest first, from `after` (exclusive).
pub fn archive_obligations(
    store: &Store,
    after: Option<Seq>,
    limit: usize,
) -> Result<Vec<ArchiveObligation>, StoreError> {
    let (lo, end) = Family::Archive.bounds();
    let from = after.map_or(lo, |s| {
        let mut k = keys::archive(s);
        k.push(0);
        k
    });
    collect(
        store.scan(Family::Archive, &from, &end, Dir::Forward)?,
        limit,
        ArchiveObligation::decode,
    )
}

/// Compacts the obligations' span up to `through` (all of it with `None`): the archiver's
/// settled obligations are tombstones a fresh sweep would otherwise walk.
pub fn compact_obligations(store: &Store, through: Option<Seq>) {
    let (lo, end) = Family::Archive.bounds();
    let to = through.map_or(end, |s| {
        let mut k = keys::archive(s);
        k.push(0);
        k
    });
    store.compact_range(Cf::Index, &lo, &to);
}

/// Boot repair: every due row's active marker exists. The pipeline's marker cleanup
/// deletes a marker and, if a due row arrived in its bucket meanwhile, restores it in a
/// later unsynced write; a crash that keeps the delete (made durable by a later synced
/// batch) and loses the restore would leave a due row no tick ever visits. One pass over
/// the due family before the pipeline starts (O(due rows), with one point read per
/// distinct tenant-second) puts back what is missing, synced. Returns the markers restored.
pub fn repair_markers(store: &Store) -> Result<u64, StoreError> {
    let mut last: Option<(Bucket, TenantOrd)> = None;
    let mut ops = Vec::new();
    let mut restored = 0;
    for kv in store.scan_family(Family::Due)? {
        let (k, v) = kv?;
        let row = DueRow::decode(&k, &v)?;
        let here = (row.key.at.bucket(), row.key.ord);
        if last == Some(here) {
            continue;
        }
        last = Some(here);
        let marker = keys::active(here.0, here.1);
        if store.get(Cf::Index, &marker)?.is_none() {
            ops.push(Op::put(Cf::Index, marker, Vec::new()));
            restored += 1;
            if ops.len() >= CHUNK_ROWS {
                store.write(std::mem::take(&mut ops), true)?;
            }
        }
    }
    if !ops.is_empty() {
        store.write(ops, true)?;
    }
    Ok(restored)
}

/// Every due row, in key order (fixtures, tools and tests; O(backlog)).
pub fn due_rows(store: &Store) -> Result<Vec<DueRow>, StoreError> {
    collect(store.scan_family(Family::Due)?, usize::MAX, DueRow::decode)
}

/// Where a delivery's index row was found by [`locate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Located {
    Inflight,
    Due(Kind),
    Dead,
    /// Not at any of the places asked about.
    Elsewhere,
}

/// Looks for a delivery's index row by point reads only, at the places the caller
/// expects it (the hook log knows the due or dead time from its last event): inflight,
/// then due at `due_at`, then dead at `dead_at`.
pub fn locate(
    store: &Store,
    ord: TenantOrd,
    seq: Seq,
    sink: SinkIdx,
    due_at: Option<AtMs>,
    dead_at: Option<AtMs>,
) -> Result<Located, StoreError> {
    if store
        .get(Cf::Index, &keys::inflight(&InflightKey { ord, seq, sink }))?
        .is_some()
    {
        return Ok(Located::Inflight);
    }
    if let Some(at) = due_at {
        let key = DueKey { ord, at, seq, sink };
        if let Some(v) = store.get(Cf::Index, &keys::due(&key))? {
            return Ok(Located::Due(DueRow::decode(&keys::due(&key), &v)?.kind));
        }
    }
    if let Some(at) = dead_at {
        if store
            .get(Cf::Index, &keys::dead(&DeadKey { at, seq, sink }))?
            .is_some()
        {
            return Ok(Located::Dead);
        }
    }
    Ok(Located::Elsewhere)
}

/// True if the hook still owes the archive.
pub fn has_archive_obligation(store: &Store, seq: Seq) -> Result<bool, StoreError> {
    Ok(store.get(Cf::Index, &keys::archive(seq))?.is_some())
}

/// A tenant's inflight rows (tests and tools; the pipeline keeps its own in memory).
pub fn inflight_for_tenant(
    store: &Store,
    ord: TenantOrd,
    limit: usize,
) -> Result<Vec<InflightRow>, StoreError> {
    let (lo, end) = keys::inflight_tenant_range(ord);
    collect(
        store.scan(Family::Inflight, &lo, &end, Dir::Forward)?,
        limit,
        InflightRow::decode,
    )
}

/// A source's waiting work ([`pending_for_source`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SourceBacklog {
    pub pending: i64,
    pub scheduled: i64,
    pub inflight: i64,
    pub bytes: i64,
    /// Due and inflight rows read to count these.
    pub rows_read: u64,
    /// False if the read stopped at its limit: the counts are a lower bound.
    pub exact: bool,
}

/// ADR `pending_for_source`: the due and inflight rows whose hook came through `source`.
/// Rows do not name their source, so each row's hook is read (one `multi_get` per 512
/// rows, each hook once). With the source's fixed tenant (`ord`) only that tenant's two
/// ranges are read; a shared source's count is a fold of every due and inflight row —
/// O(backlog), bounded by `limit` rows (then `exact` is false).
pub fn pending_for_source(
    store: &Store,
    source: &str,
    ord: Option<TenantOrd>,
    limit: usize,
) -> Result<SourceBacklog, StoreError> {
    // (seq, what it counts as, size): None for inflight.
    let mut rows: Vec<(Seq, Option<Kind>, u32)> = Vec::new();
    let (due_lo, due_end) = match ord {
        Some(o) => keys::due_tenant_range(o),
        None => Family::Due.bounds(),
    };
    for kv in store.scan(Family::Due, &due_lo, &due_end, Dir::Forward)? {
        if rows.len() > limit {
            break;
        }
        let (k, v) = kv?;
        let r = DueRow::decode(&k, &v)?;
        rows.push((r.key.seq, Some(r.kind), r.size));
    }
    let (in_lo, in_end) = match ord {
        Some(o) => keys::inflight_tenant_range(o),
        None => Family::Inflight.bounds(),
    };
    if rows.len() <= limit {
        for kv in store.scan(Family::Inflight, &in_lo, &in_end, Dir::Forward)? {
            if rows.len() > limit {
                break;
            }
            let (k, v) = kv?;
            let r = InflightRow::decode(&k, &v)?;
            rows.push((r.key.seq, None, r.size));
        }
    }
    let exact = rows.len() <= limit;
    rows.truncate(limit);
    let mut out = SourceBacklog {
        rows_read: rows.len() as u64,
        exact,
        ..SourceBacklog::default()
    };
    let mut of_source: std::collections::HashMap<Seq, bool> = std::collections::HashMap::new();
    for chunk in rows.chunks(512) {
        let mut seqs: Vec<Seq> = chunk
            .iter()
            .map(|r| r.0)
            .filter(|s| !of_source.contains_key(s))
            .collect();
        seqs.sort_unstable();
        seqs.dedup();
        let keys: Vec<Vec<u8>> = seqs.iter().map(|s| keys::hook(*s)).collect();
        for (seq, v) in seqs.iter().zip(store.multi_get(Cf::Hooks, &keys)?) {
            // A hook that is gone or does not decode is no source's.
            let mine = v
                .and_then(|v| Envelope::decode(&v).ok())
                .is_some_and(|e| e.source == source);
            of_source.insert(*seq, mine);
        }
        for (seq, kind, size) in chunk {
            if !of_source[seq] {
                continue;
            }
            match kind {
                Some(Kind::First) => out.pending += 1,
                Some(Kind::Retry) => out.scheduled += 1,
                None => out.inflight += 1,
            }
            out.bytes += *size as i64;
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
