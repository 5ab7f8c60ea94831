//! The rows of a hook that moves to its tenant's new owner: read on the sender
//! ([`movable_hooks`]), taken out of its queue into the outbox ([`stage_hook`]), and put into
//! the receiver's queue under its own seq and ordinal ([`import_hook`]). The protocol around
//! them is [`crate::handoff`]'s.
// Builds the queue's index keys: this module is part of `deliveries` (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, HashSet};

use super::{dead_page_for_tenant, delivery_rows, due_value, DueRow, Kind, PulledRow, Tx};
use ankusa_keyspace::{
    AtMs, Cf, CounterField, DeadKey, DueKey, Family, PulledKey, Seq, SinkIdx, TenantOrd,
};
use ankusa_records::moved::{MovedDelivery, MovedHook, MovedState};
use ankusa_records::{DeliveryRow, Envelope};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::QueueError;

/// Rows of each index family read for one [`movable_hooks`] call, per hook asked for.
const READ_PER_HOOK: usize = 4;

/// What [`movable_hooks`] found of a tenant.
#[derive(Debug, Default)]
pub struct Movable {
    /// The hooks that move, each with every delivery it still owes.
    pub hooks: Vec<MovedHook>,
    /// Rows whose hook is gone (a store that lost hooks before): undeliverable, so they do
    /// not move; [`drop_orphan`] takes them out, counted. Each as a hook with no envelope,
    /// log or events. Without this a dead orphan — which no dispatcher ever meets
    /// — would keep its tenant on a leaving node, and the drain from ending, for good.
    pub orphans: Vec<MovedHook>,
}

/// Up to `max_hooks` hooks of tenant `ord` (and about `max_bytes`), oldest seq first, each
/// with every delivery it still owes: due, scheduled, parked for a pull sink, dead. A hook
/// with a delivery in flight is left for a later call (it moves once its attempt ends), and
/// so is one whose rows this read did not all meet (a row that moved between two scans).
/// Up to `max_hooks` orphans besides.
pub fn movable_hooks(
    store: &Store,
    ord: TenantOrd,
    max_hooks: usize,
    max_bytes: usize,
) -> Result<Movable, QueueError> {
    let cap = max_hooks.saturating_mul(READ_PER_HOOK).max(16);
    // Read first, so that a row claimed between this scan and the ones below is either
    // seen in flight here or missing there (and its hook is left).
    let mut inflight = HashSet::new();
    let (lo, end) = ankusa_keyspace::inflight_tenant_range(ord);
    for kv in store.scan(Family::Inflight, &lo, &end, Dir::Forward)? {
        let (k, _) = kv?;
        inflight.insert(ankusa_keyspace::decode_inflight(&k)?.seq);
    }
    // Each delivery's sink, state and size (the index row's: an orphan may have lost its
    // delivery row too).
    let mut found: BTreeMap<Seq, Vec<(SinkIdx, MovedState, u32)>> = BTreeMap::new();
    let (lo, end) = ankusa_keyspace::due_tenant_range(ord);
    for kv in store.scan(Family::Due, &lo, &end, Dir::Forward)?.take(cap) {
        let (k, v) = kv?;
        let row = DueRow::decode(&k, &v)?;
        found.entry(row.key.seq).or_default().push((
            row.key.sink,
            MovedState::Due {
                at: row.key.at.0,
                retry: row.kind == Kind::Retry,
            },
            row.size,
        ));
    }
    let (lo, end) = ankusa_keyspace::pulled_tenant_range(ord);
    for kv in store
        .scan(Family::Pulled, &lo, &end, Dir::Forward)?
        .take(cap)
    {
        let (k, v) = kv?;
        let row = PulledRow::decode(&k, &v)?;
        found.entry(row.key.seq).or_default().push((
            row.key.sink,
            MovedState::Parked {
                at: row.key.at.0,
                retry: row.kind == Kind::Retry,
                sink_id: row.key.sink_id,
            },
            row.size,
        ));
    }
    let page = dead_page_for_tenant(store, ord, None, cap)?;
    for row in page.rows {
        let size = row.value.size;
        found.entry(row.key.seq).or_default().push((
            row.key.sink,
            MovedState::Dead {
                at: row.key.at.0,
                value: row.value,
            },
            size,
        ));
    }
    let mut out = Vec::new();
    let mut orphans = Vec::new();
    let mut bytes = 0usize;
    for (seq, mut states) in found {
        if out.len() >= max_hooks || (bytes >= max_bytes && !out.is_empty()) {
            break;
        }
        if inflight.contains(&seq) {
            continue;
        }
        let Some(envelope) = store.get(Cf::Hooks, &ankusa_keyspace::hook(seq))? else {
            if orphans.len() < max_hooks {
                orphans.push(orphan(store, seq, states)?);
            }
            continue;
        };
        let env = Envelope::decode(&envelope)
            .map_err(|e| QueueError::corrupt_at(Family::Hooks, &ankusa_keyspace::hook(seq), e))?;
        let pairs: Vec<(Seq, SinkIdx)> = (0..env.sinks.len())
            .map(|i| (seq, SinkIdx(i as u16)))
            .collect();
        let rows = delivery_rows(store, &pairs)?;
        let live = rows.iter().filter(|r| r.is_some()).count();
        states.sort_by_key(|(s, _, _)| *s);
        states.dedup_by_key(|(s, _, _)| *s);
        // Every delivery the hook owes must be here, once: else a row moved meanwhile, or
        // lies past this read, and the hook waits for a later call.
        if states.len() != live
            || states
                .iter()
                .any(|(s, _, _)| rows.get(s.0 as usize).is_none_or(|r| r.is_none()))
        {
            continue;
        }
        let deliveries = states
            .into_iter()
            .filter_map(|(sink, state, _)| {
                let row = rows.get(sink.0 as usize)?.clone()?;
                Some(MovedDelivery {
                    sink: sink.0,
                    row,
                    state,
                })
            })
            .collect();
        let archive = store
            .get(Cf::Index, &ankusa_keyspace::archive(seq))?
            .is_some();
        let log = store.get(Cf::Audit, &ankusa_keyspace::hook_log(seq))?;
        let events = crate::hooklog::moved_events(store, seq)?;
        let hook = MovedHook {
            seq: seq.0,
            envelope,
            deliveries,
            archive,
            log,
            events,
        };
        bytes += ankusa_records::moved::Moved::Hook(hook.clone()).weight();
        out.push(hook);
    }
    Ok(Movable {
        hooks: out,
        orphans,
    })
}

/// Hook `seq`'s rows, read without its envelope: an orphan, its deliveries as their index
/// rows say (the delivery row's attempts where it is still there).
fn orphan(
    store: &Store,
    seq: Seq,
    mut states: Vec<(SinkIdx, MovedState, u32)>,
) -> Result<MovedHook, QueueError> {
    states.sort_by_key(|(s, _, _)| *s);
    states.dedup_by_key(|(s, _, _)| *s);
    let pairs: Vec<(Seq, SinkIdx)> = states.iter().map(|(s, _, _)| (seq, *s)).collect();
    let rows = delivery_rows(store, &pairs)?;
    let deliveries = states
        .into_iter()
        .zip(rows)
        .map(|((sink, state, size), row)| MovedDelivery {
            sink: sink.0,
            // The counters count the index row's size: that is what goes.
            row: DeliveryRow {
                size,
                ..row.unwrap_or_default()
            },
            state,
        })
        .collect();
    Ok(MovedHook {
        seq: seq.0,
        envelope: Vec::new(),
        deliveries,
        // An obligation no archiver can meet without the body: it goes with the rows.
        archive: store
            .get(Cf::Index, &ankusa_keyspace::archive(seq))?
            .is_some(),
        log: None,
        events: Vec::new(),
    })
}

/// The index key a moved delivery has on the sender (tenant `ord`, hook `seq`), and the
/// value it was read with.
fn index_row(ord: TenantOrd, seq: Seq, d: &MovedDelivery) -> (Vec<u8>, Vec<u8>) {
    match &d.state {
        MovedState::Due { at, retry } => {
            let row = due_row(ord, seq, d, *at, *retry);
            (ankusa_keyspace::due(&row.key), due_value(&row))
        }
        MovedState::Parked { at, retry, sink_id } => {
            let key = PulledKey {
                ord,
                sink_id: sink_id.clone(),
                at: AtMs(*at),
                seq,
                sink: SinkIdx(d.sink),
            };
            let mut v = d.row.size.to_be_bytes().to_vec();
            v.push(kind(*retry) as u8);
            (ankusa_keyspace::pulled(&key), v)
        }
        MovedState::Dead { at, value } => (
            ankusa_keyspace::dead(&dead_key(seq, d, *at)),
            value.encode(),
        ),
    }
}

/// Moved delivery `d`'s due row as tenant `ord`'s hook `seq`'s.
fn due_row(ord: TenantOrd, seq: Seq, d: &MovedDelivery, at: u64, retry: bool) -> DueRow {
    DueRow {
        key: DueKey {
            ord,
            at: AtMs(at),
            seq,
            sink: SinkIdx(d.sink),
        },
        size: d.row.size,
        kind: kind(retry),
    }
}

/// Moved delivery `d`'s dead key as hook `seq`'s, dead-lettered at `at`.
fn dead_key(seq: Seq, d: &MovedDelivery, at: u64) -> DeadKey {
    DeadKey {
        at: AtMs(at),
        seq,
        sink: SinkIdx(d.sink),
    }
}

fn kind(retry: bool) -> Kind {
    if retry {
        Kind::Retry
    } else {
        Kind::First
    }
}

/// The counter a moved delivery counts in.
fn field(state: &MovedState) -> CounterField {
    match state {
        MovedState::Due { retry, .. } | MovedState::Parked { retry, .. } => kind(*retry).field(),
        MovedState::Dead { .. } => CounterField::Dead,
    }
}

/// Hook `h`'s delivery rows leave tenant `ord`'s queue as one unit (every index row as it
/// was read, or none), each delivery row with them, with their counter deltas. False when
/// it owes nothing.
fn take_rows(tx: &mut Tx, ord: TenantOrd, h: &MovedHook) -> bool {
    let seq = Seq(h.seq);
    let mut first = true;
    for d in &h.deliveries {
        let (key, value) = index_row(ord, seq, d);
        if first {
            tx.consume(key.clone(), Some(value));
            first = false;
        } else {
            tx.consume_also(key.clone(), Some(value));
        }
        tx.op(Op::delete(Cf::Index, key));
        if let MovedState::Dead { at, .. } = &d.state {
            let dk = dead_key(seq, d, *at);
            let by_tenant = ankusa_keyspace::dead_by_tenant(ord, &dk);
            tx.consume_also(by_tenant.clone(), None);
            tx.op(Op::delete(Cf::Index, by_tenant));
        }
        tx.op(Op::delete(
            Cf::Deliveries,
            ankusa_keyspace::delivery(seq, SinkIdx(d.sink)),
        ));
        tx.delta(ord, field(&d.state), -1);
        tx.delta(ord, CounterField::Bytes, -(d.row.size as i64));
    }
    !first
}

/// Orphan `h` (from [`Movable::orphans`]) of tenant `ord` goes: its rows, counted, as one
/// unit that commits only if they are still there as read. Nothing moves anywhere: with no
/// hook there is nothing any node could deliver.
pub fn drop_orphan(tx: &mut Tx, ord: TenantOrd, h: &MovedHook) {
    if take_rows(tx, ord, h) {
        take_archive(tx, ord, h);
    }
}

/// Hook `h`'s archive obligation, if it has one, leaves with the unit [`take_rows`] began.
fn take_archive(tx: &mut Tx, ord: TenantOrd, h: &MovedHook) {
    if h.archive {
        let key = ankusa_keyspace::archive(Seq(h.seq));
        tx.consume_also(key.clone(), None);
        tx.op(Op::delete(Cf::Index, key));
        tx.delta(ord, CounterField::ArchivePending, -1);
    }
}

/// The sender's side: hook `h` of tenant `ord` leaves this node's queue for the outbox
/// (`outbox`: its key and value there), in one unit that commits only if every index row it
/// was read with is still there as read (so a claim, a replay, a purge or a park that came
/// first wins, and the hook is read again later). Every row, the envelope, its archive
/// obligation, its log record, id and events go, with their counter deltas; the outbox
/// entry comes.
pub fn stage_hook(tx: &mut Tx, ord: TenantOrd, h: &MovedHook, outbox: (Vec<u8>, Vec<u8>)) {
    let seq = Seq(h.seq);
    if !take_rows(tx, ord, h) {
        // A hook that owes nothing does not move (movable_hooks never gives one).
        return;
    }
    take_archive(tx, ord, h);
    tx.op(Op::delete(Cf::Hooks, ankusa_keyspace::hook(seq)));
    tx.op(Op::delete(Cf::Index, ankusa_keyspace::cleared(seq)));
    if h.log.is_some() {
        tx.op(Op::delete(Cf::Audit, ankusa_keyspace::hook_log(seq)));
        if let Some(k) = Envelope::decode(&h.envelope)
            .ok()
            .and_then(|e| ankusa_keyspace::hook_id(&e.id))
        {
            tx.op(Op::delete(Cf::Audit, k));
        }
    }
    for (k, _) in crate::hooklog::event_keys(seq, &h.events) {
        tx.op(Op::delete(Cf::Audit, k));
    }
    tx.op(Op::put(Cf::Default, outbox.0, outbox.1));
}

/// The receiver's side: hook `h`, with envelope `env`, enters this node's queue as tenant
/// `ord`'s hook `seq`: its envelope, each delivery row and its index row (a due row with its
/// active marker, a parked row, a dead row by time and by tenant), its archive obligation,
/// its log record, id and events, with their counter deltas. A creation: no unit.
pub fn import_hook(tx: &mut Tx, ord: TenantOrd, seq: Seq, h: &MovedHook, env: &Envelope) {
    tx.push_op(Op::put(
        Cf::Hooks,
        ankusa_keyspace::hook(seq),
        h.envelope.clone(),
    ));
    for d in &h.deliveries {
        let sink = SinkIdx(d.sink);
        let row = DeliveryRow {
            ord,
            ..d.row.clone()
        };
        tx.push_op(Op::put(
            Cf::Deliveries,
            ankusa_keyspace::delivery(seq, sink),
            row.encode(),
        ));
        tx.delta(ord, CounterField::Bytes, d.row.size as i64);
        match &d.state {
            MovedState::Due { at, retry } => tx.enqueue(&due_row(ord, seq, d, *at, *retry)),
            MovedState::Parked { .. } => {
                let (key, value) = index_row(ord, seq, d);
                tx.push_op(Op::put(Cf::Index, key, value));
                tx.delta(ord, field(&d.state), 1);
            }
            MovedState::Dead { at, value } => {
                let dk = dead_key(seq, d, *at);
                let value = ankusa_records::DeadValue {
                    ord,
                    ..value.clone()
                };
                tx.push_op(Op::put(
                    Cf::Index,
                    ankusa_keyspace::dead_by_tenant(ord, &dk),
                    Vec::new(),
                ));
                tx.push_op(Op::put(
                    Cf::Index,
                    ankusa_keyspace::dead(&dk),
                    value.encode(),
                ));
                tx.delta(ord, CounterField::Dead, 1);
            }
        }
    }
    if h.archive {
        let mut v = (h.envelope.len() as u32).to_be_bytes().to_vec();
        v.extend_from_slice(&ord.0.to_be_bytes());
        tx.push_op(Op::put(Cf::Index, ankusa_keyspace::archive(seq), v));
        tx.delta(ord, CounterField::ArchivePending, 1);
    }
    if let Some(record) = &h.log {
        tx.push_op(Op::put(
            Cf::Audit,
            ankusa_keyspace::hook_log(seq),
            record.clone(),
        ));
        if let Some(k) = ankusa_keyspace::hook_id(&env.id) {
            tx.push_op(Op::put(Cf::Audit, k, seq.0.to_be_bytes()));
        }
    }
    for (k, ev) in crate::hooklog::event_keys(seq, &h.events) {
        tx.push_op(Op::put(Cf::Audit, k, ev.value.clone()));
    }
}

/// The sender's side of a dedupe key that moves: deleted with its expiry key, in a unit
/// that commits only if the key still holds `value` (the writer, its only other writer,
/// may have written it again since it was read).
pub fn stage_dedupe(
    tx: &mut Tx,
    key: &[u8],
    value: &[u8],
    expires: u64,
    outbox: (Vec<u8>, Vec<u8>),
) {
    tx.consume(key.to_vec(), Some(value.to_vec()));
    tx.op(Op::delete(Cf::Index, key.to_vec()));
    tx.op(Op::delete(
        Cf::Index,
        ankusa_keyspace::dedupe_expiry(AtMs(expires), key),
    ));
    tx.op(Op::put(Cf::Default, outbox.0, outbox.1));
}
