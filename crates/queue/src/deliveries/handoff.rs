//! The rows of a hook that moves to its tenant's new owner: read on the sender
//! ([`movable_hooks`]), taken out of its queue into the outbox ([`stage_hook`]), and put into
//! the receiver's queue under its own seq and ordinal ([`import_hook`]). The protocol around
//! them is [`crate::handoff`]'s.
// Builds the queue's index keys: this module is part of `deliveries` (clippy.toml).
#![allow(clippy::disallowed_methods)]

use std::collections::{BTreeMap, HashSet};

use super::*;
use ankusa_keyspace::{
    AtMs, Cf, CounterField, DeadKey, DueKey, EventKey, EventKind, Family, PulledKey, Seq, SinkIdx,
    TenantOrd,
};
use ankusa_records::moved::{MovedDelivery, MovedEvent, MovedHook, MovedState};
use ankusa_store::{Dir, Op, Store};

use crate::QueueError;

/// Rows of each index family read for one [`movable_hooks`] call, per hook asked for.
const READ_PER_HOOK: usize = 4;

/// Up to `max_hooks` hooks of tenant `ord` (and about `max_bytes`), oldest seq first, each
/// with every delivery it still owes: due, scheduled, parked for a pull sink, dead. A hook
/// with a delivery in flight is left for a later call (it moves once its attempt ends), and
/// so is one whose rows this read did not all meet (a row that moved between two scans).
pub fn movable_hooks(
    store: &Store,
    ord: TenantOrd,
    max_hooks: usize,
    max_bytes: usize,
) -> Result<Vec<MovedHook>, QueueError> {
    let cap = max_hooks.saturating_mul(READ_PER_HOOK).max(16);
    // Read first, so that a row claimed between this scan and the ones below is either
    // seen in flight here or missing there (and its hook is left).
    let mut inflight = HashSet::new();
    let (lo, end) = ankusa_keyspace::inflight_tenant_range(ord);
    for kv in store.scan(Family::Inflight, &lo, &end, Dir::Forward)? {
        let (k, _) = kv?;
        inflight.insert(ankusa_keyspace::decode_inflight(&k)?.seq);
    }
    let mut found: BTreeMap<Seq, Vec<(SinkIdx, MovedState)>> = BTreeMap::new();
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
        ));
    }
    let page = dead_page_for_tenant(store, ord, None, cap)?;
    for row in page.rows {
        found.entry(row.key.seq).or_default().push((
            row.key.sink,
            MovedState::Dead {
                at: row.key.at.0,
                value: row.value,
            },
        ));
    }
    let mut out = Vec::new();
    let mut bytes = 0usize;
    for (seq, mut states) in found {
        if out.len() >= max_hooks || (bytes >= max_bytes && !out.is_empty()) {
            break;
        }
        if inflight.contains(&seq) {
            continue;
        }
        let Some(envelope) = store.get(Cf::Hooks, &ankusa_keyspace::hook(seq))? else {
            // Rows without their hook are the dispatcher's to drop (orphans), not to move.
            continue;
        };
        let env = Envelope::decode(&envelope)
            .map_err(|e| QueueError::corrupt_at(Family::Hooks, &ankusa_keyspace::hook(seq), e))?;
        let pairs: Vec<(Seq, SinkIdx)> = (0..env.sinks.len())
            .map(|i| (seq, SinkIdx(i as u16)))
            .collect();
        let rows = delivery_rows(store, &pairs)?;
        let live = rows.iter().filter(|r| r.is_some()).count();
        states.sort_by_key(|(s, _)| *s);
        states.dedup_by_key(|(s, _)| *s);
        // Every delivery the hook owes must be here, once: else a row moved meanwhile, or
        // lies past this read, and the hook waits for a later call.
        if states.len() != live
            || states
                .iter()
                .any(|(s, _)| rows.get(s.0 as usize).is_none_or(|r| r.is_none()))
        {
            continue;
        }
        let deliveries = states
            .into_iter()
            .filter_map(|(sink, state)| {
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
        let mut events = Vec::new();
        let (lo, hi) = ankusa_keyspace::hook_events_of_seqs(seq, Seq(seq.0 + 1));
        for kv in store.scan(Family::HookEvents, &lo, &hi, Dir::Forward)? {
            let (k, v) = kv?;
            let ek = ankusa_keyspace::decode_hook_event(&k)?;
            events.push(MovedEvent {
                sink: ek.sink.0,
                at: ek.at.0,
                kind: ek.kind as u8,
                value: v,
            });
        }
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
    Ok(out)
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

/// The sender's side: hook `h` of tenant `ord` leaves this node's queue for the outbox
/// (`outbox`: its key and value there), in one unit that commits only if every index row it
/// was read with is still there as read (so a claim, a replay, a purge or a park that came
/// first wins, and the hook is read again later). Every row, the envelope, its archive
/// obligation, its log record, id and events go, with their counter deltas; the outbox
/// entry comes.
pub fn stage_hook(tx: &mut Tx, ord: TenantOrd, h: &MovedHook, outbox: (Vec<u8>, Vec<u8>)) {
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
    if first {
        // A hook that owes nothing does not move (movable_hooks never gives one).
        return;
    }
    if h.archive {
        let key = ankusa_keyspace::archive(seq);
        tx.consume_also(key.clone(), None);
        tx.op(Op::delete(Cf::Index, key));
        tx.delta(ord, CounterField::ArchivePending, -1);
    }
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
    for (k, _) in event_keys(seq, h) {
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
    for (k, ev) in event_keys(seq, h) {
        tx.push_op(Op::put(Cf::Audit, k, ev.value.clone()));
    }
}

/// Hook `h`'s events with their keys as hook `seq`'s (an event of a kind this release does
/// not know is left out: `movable_hooks` only reads known ones).
fn event_keys(seq: Seq, h: &MovedHook) -> impl Iterator<Item = (Vec<u8>, &MovedEvent)> + '_ {
    h.events.iter().filter_map(move |ev| {
        let kind = EventKind::from_byte(ev.kind)?;
        let key = ankusa_keyspace::hook_event(&EventKey {
            seq,
            sink: SinkIdx(ev.sink),
            at: AtMs(ev.at),
            kind,
        });
        Some((key, ev))
    })
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
