//! The hook log: what happened to a hook, after its rows are gone.
//!
//! A delivered hook's delivery row is deleted at once and reclaim removes the hook within a
//! second, so "was `hk_…` delivered, and how?" needs a record of its own. Three families
//! in the `audit` column family (no format change; created once per store, see
//! [`Store::ensure_added_families`]):
//!
//! | family | key | value | written by |
//! |---|---|---|---|
//! | `hook_log` | `<<?l, seq::64>>` | the envelope without its body, and the body's size | ingest, in the hook's own commit |
//! | `hook_ids` | `<<?i, hook id>>` | `<<seq::64>>` | ingest, same commit |
//! | `hook_events` | `<<?v, seq::64, sink::16, at::64, kind::8>>` | [`Event`] | each attempt's outcome, replay, boot recovery — inside the transition's unit, so an event is written only if its row moved |
//!
//! A delivery keeps at most [`MAX_ATTEMPTS_KEPT`] attempts (older events go when a newer
//! attempt is written). The [`Pruner`] removes whole hooks oldest first — their record,
//! id and events — once they are older than the retention or the log holds more than its
//! ceiling: seqs are commit order, so pruning is a range delete of a seq span (two range
//! tombstones and one point delete per id, whatever the span), and the log's size is
//! `newest seq − oldest seq + 1`, read from its two ends.
//!
//! A hook's state per sink ([`lookup`]) is read, not stored: the delivery row tells whether
//! one is still owed; the last event says where its index row should be (a retry's due
//! time, a dead-letter's time, a replay's due time, or the receipt time if there was no
//! event yet), and one point read confirms it.

use super::deliveries::{self, Kind, Located, Tx};
use ankusa_keyspace::Cf;
use ankusa_keyspace::{AtMs, EventKey, EventKind, Family, Seq, SinkIdx};
/// The hook log's values (crate `ankusa-records`).
use ankusa_records::{AttemptOutcome, Event, LogRecord};
use ankusa_records::{DeliveryRow, Envelope};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::QueueError;

/// Attempts kept per delivery (with the replays and recoveries between them).
pub const MAX_ATTEMPTS_KEPT: usize = 16;

/// Ingest's log ops: the record and the id, in the hook's own commit.
pub fn log_ingest(tx: &mut Tx, seq: Seq, env: &Envelope) {
    tx.push_op(Op::put(
        Cf::Audit,
        ankusa_keyspace::hook_log(seq),
        LogRecord::encode_envelope(env),
    ));
    if let Some(k) = ankusa_keyspace::hook_id(&env.id) {
        tx.push_op(Op::put(Cf::Audit, k, seq.0.to_be_bytes()));
    }
}

/// Adds a delivery's event to the transition just added to `tx` (it commits only if that
/// transition's row moves). An attempt past [`MAX_ATTEMPTS_KEPT`] also deletes the
/// delivery's oldest events (one bounded read of that delivery's events).
pub fn record(
    tx: &mut Tx,
    store: &Store,
    seq: Seq,
    sink: SinkIdx,
    ev: &Event,
) -> Result<(), QueueError> {
    let key = EventKey {
        seq,
        sink,
        at: ev.at,
        kind: ev.kind,
    };
    if ev.kind.is_attempt() && ev.attempt as usize > MAX_ATTEMPTS_KEPT {
        let (lo, hi) = ankusa_keyspace::hook_events_of_delivery(seq, sink);
        let mut attempts = Vec::new();
        for kv in store.scan(Family::HookEvents, &lo, &hi, Dir::Forward)? {
            let (k, _) = kv?;
            let ek = ankusa_keyspace::decode_hook_event(&k)?;
            attempts.push((ek.kind.is_attempt(), k));
        }
        // Keep the newest MAX - 1 attempts (and what came after the oldest of them); the
        // new one makes MAX.
        let n = attempts.iter().filter(|(a, _)| *a).count();
        let mut drop_attempts = (n + 1).saturating_sub(MAX_ATTEMPTS_KEPT);
        for (is_attempt, k) in attempts {
            if drop_attempts == 0 {
                break;
            }
            if is_attempt {
                drop_attempts -= 1;
            }
            tx.unit_op(Op::delete(Cf::Audit, k));
        }
    }
    tx.unit_op(Op::put(
        Cf::Audit,
        ankusa_keyspace::hook_event(&key),
        ev.encode(),
    ));
    Ok(())
}

/// A replay's or a recovery's event: the delivery is due again at `due`.
pub fn requeued(kind: EventKind, now: AtMs, attempts: u32, due: AtMs) -> Event {
    Event {
        kind,
        at: now,
        attempt: attempts,
        outcome: None,
        status: 0,
        class: None,
        error: String::new(),
        latency_us: 0,
        next_at: Some(due),
    }
}

/// A purge's event for delivery (`seq`, `sink`), added to the purge just added to `tx`
/// (it commits only if that row moves) — if the log still keeps the hook: an event of a
/// pruned hook would lie below the pruner's next range and stay. `kept` remembers the
/// answers for the rest of one purge chunk (a hook's sinks share one read).
pub fn log_purge(
    tx: &mut Tx,
    store: &Store,
    seq: Seq,
    sink: SinkIdx,
    now: AtMs,
    kept: &mut std::collections::HashMap<Seq, bool>,
) -> Result<(), QueueError> {
    let logged = match kept.get(&seq) {
        Some(k) => *k,
        None => {
            let k = store
                .get(Cf::Audit, &ankusa_keyspace::hook_log(seq))?
                .is_some();
            kept.insert(seq, k);
            k
        }
    };
    if !logged {
        return Ok(());
    }
    let ev = Event {
        kind: EventKind::Purged,
        at: now,
        attempt: 0,
        outcome: None,
        status: 0,
        class: None,
        error: String::new(),
        latency_us: 0,
        next_at: None,
    };
    record(tx, store, seq, sink, &ev)
}

// ---------------------------------------------------------------------------------------
// Reading.

/// Where a delivery is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeliveryState {
    /// Waiting for its first attempt (or for the one after a replay or a recovery).
    Pending,
    /// Waiting out a retry backoff.
    Scheduled,
    /// Being attempted now.
    Inflight,
    Delivered,
    Dead,
    /// Owed, but its due time is not in the log (a row from before the log, or imported).
    Queued,
    /// An operator's purge removed it (its last event).
    Purged,
    /// Nothing is owed and the last attempt did not deliver it: dropped, or purged before
    /// the log recorded purges.
    Gone,
}

/// One sink of a hook, as [`lookup`] reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SinkView {
    pub index: SinkIdx,
    pub sink: String,
    pub state: DeliveryState,
    pub attempts: u32,
    pub next_attempt_at: Option<AtMs>,
    pub events: Vec<Event>,
}

/// A hook as the log and the queue know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookView {
    pub seq: Seq,
    pub record: LogRecord,
    /// The body, if asked for and the hook is still stored.
    pub body: Option<Vec<u8>>,
    /// The hook is still stored (its body can be read).
    pub stored: bool,
    pub sinks: Vec<SinkView>,
}

/// The newest hooks of the log, newest first: of `tenant` only when given, at most `limit`,
/// reading at most `scan` records (the log has no tenant index: a quiet tenant among busy
/// ones may have none in the span read). Returns the records and whether the span ran out
/// before the log did.
pub fn recent(
    store: &Store,
    tenant: Option<&str>,
    limit: usize,
    scan: usize,
) -> Result<(Vec<LogRecord>, bool), QueueError> {
    let (lo, end) = Family::HookLog.bounds();
    let mut out = Vec::new();
    for (read, kv) in store
        .scan(Family::HookLog, &lo, &end, Dir::Reverse)?
        .enumerate()
    {
        if out.len() >= limit {
            return Ok((out, false));
        }
        if read >= scan {
            return Ok((out, true));
        }
        let (k, v) = kv?;
        let record =
            LogRecord::decode(&v).map_err(|e| QueueError::corrupt_at(Family::HookLog, &k, e))?;
        if tenant.is_none_or(|t| record.envelope.tenant_or_default() == t) {
            out.push(record);
        }
    }
    Ok((out, false))
}

/// A record [`movable_records`] found: whose it is, and the item that moves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MovableRecord {
    pub tenant: String,
    pub id: String,
    pub item: ankusa_records::moved::Moved,
}

/// What [`movable_records`] read.
#[derive(Debug, Default)]
pub struct MovableRecords {
    pub records: Vec<MovableRecord>,
    /// The last seq read: the next call starts after it (`None`: the log ran out).
    pub next: Option<Seq>,
    /// Records left where they are because their hook is still stored (it moves with
    /// its rows, or reclaim removes it within a second): a later pass reads them again.
    pub stored: u64,
}

/// Up to `max` records of the hook log after seq `after` (about `max_bytes`), oldest
/// first, of hooks this node no longer stores (delivered, or gone), each with its events:
/// what a leaving node hands on. The log has no tenant index, so this walks it in seq
/// order; a record that does not decode is corruption.
pub fn movable_records(
    store: &Store,
    after: Option<Seq>,
    max: usize,
    max_bytes: usize,
) -> Result<MovableRecords, QueueError> {
    use ankusa_records::moved::Moved;
    let (mut lo, end) = Family::HookLog.bounds();
    if let Some(a) = after {
        lo = ankusa_keyspace::hook_log(Seq(a.0.saturating_add(1)));
    }
    let mut out = MovableRecords::default();
    let mut bytes = 0usize;
    for kv in store.scan(Family::HookLog, &lo, &end, Dir::Forward)? {
        if out.records.len() >= max || bytes >= max_bytes {
            return Ok(out);
        }
        let (k, v) = kv?;
        let seq = ankusa_keyspace::decode_hook_log(&k)?;
        out.next = Some(seq);
        if store.get(Cf::Hooks, &ankusa_keyspace::hook(seq))?.is_some() {
            out.stored += 1;
            continue;
        }
        let record =
            LogRecord::decode(&v).map_err(|e| QueueError::corrupt_at(Family::HookLog, &k, e))?;
        let item = Moved::Logged {
            seq: seq.0,
            record: v,
            events: moved_events(store, seq)?,
        };
        bytes += item.weight();
        out.records.push(MovableRecord {
            tenant: record.envelope.tenant_or_default().to_owned(),
            id: record.envelope.id,
            item,
        });
    }
    out.next = None;
    Ok(out)
}

/// Hook `seq`'s events as stored (their keys' fields and values): what moves with it (an
/// event of a kind this release does not know stays behind).
pub(crate) fn moved_events(
    store: &Store,
    seq: Seq,
) -> Result<Vec<ankusa_records::moved::MovedEvent>, QueueError> {
    let mut events = Vec::new();
    let (lo, hi) = ankusa_keyspace::hook_events_of_seqs(seq, Seq(seq.0 + 1));
    for kv in store.scan(Family::HookEvents, &lo, &hi, Dir::Forward)? {
        let (k, value) = kv?;
        let Some(key) = ankusa_keyspace::decode_hook_event_known(&k)? else {
            continue;
        };
        events.push(ankusa_records::moved::MovedEvent {
            sink: key.sink.0,
            at: key.at.0,
            kind: key.kind as u8,
            value,
        });
    }
    Ok(events)
}

/// The sender's side of a moved record: its record, id and events go (in the stage's
/// write; the pruner, the log's one other writer, only deletes).
pub fn stage_record(tx: &mut Tx, r: &MovableRecord) {
    let ankusa_records::moved::Moved::Logged { seq, events, .. } = &r.item else {
        return;
    };
    let seq = Seq(*seq);
    tx.push_op(Op::delete(Cf::Audit, ankusa_keyspace::hook_log(seq)));
    if let Some(k) = ankusa_keyspace::hook_id(&r.id) {
        tx.push_op(Op::delete(Cf::Audit, k));
    }
    // Point deletes of the events read (a range tombstone a record would slow the log's
    // reads until compaction).
    for (k, _) in event_keys(seq, events) {
        tx.push_op(Op::delete(Cf::Audit, k));
    }
}

/// Moved `events` with their keys as hook `seq`'s (an event of a kind this release does
/// not know is left out).
pub(crate) fn event_keys(
    seq: Seq,
    events: &[ankusa_records::moved::MovedEvent],
) -> impl Iterator<Item = (Vec<u8>, &ankusa_records::moved::MovedEvent)> + '_ {
    events.iter().filter_map(move |ev| {
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

/// The receiver's side: a moved record enters this node's log as hook `seq`'s, with its
/// id and events (an event of a kind this release does not know is left out).
pub fn import_record(
    tx: &mut Tx,
    seq: Seq,
    id: &str,
    record: &[u8],
    events: &[ankusa_records::moved::MovedEvent],
) {
    tx.push_op(Op::put(
        Cf::Audit,
        ankusa_keyspace::hook_log(seq),
        record.to_vec(),
    ));
    if let Some(k) = ankusa_keyspace::hook_id(id) {
        tx.push_op(Op::put(Cf::Audit, k, seq.0.to_be_bytes()));
    }
    for (k, ev) in event_keys(seq, events) {
        tx.push_op(Op::put(Cf::Audit, k, ev.value.clone()));
    }
}

/// The log's seq of a hook id, if the log keeps it.
pub fn seq_of(store: &Store, id: &str) -> Result<Option<Seq>, QueueError> {
    let Some(k) = ankusa_keyspace::hook_id(id) else {
        return Ok(None);
    };
    match store.get(Cf::Audit, &k)? {
        None => Ok(None),
        Some(v) => match <[u8; 8]>::try_from(v.as_slice()) {
            Ok(b) => Ok(Some(Seq(u64::from_be_bytes(b)))),
            Err(_) => Err(QueueError::corrupt(
                Family::HookIds,
                format!("bad value for {id}"),
            )),
        },
    }
}

/// A hook by id: its record, each sink's state and events, and (with `body`) its body.
/// `None` if the log does not keep the id (never logged, pruned, or another node's).
pub fn lookup(store: &Store, id: &str, body: bool) -> Result<Option<HookView>, QueueError> {
    let Some(seq) = seq_of(store, id)? else {
        return Ok(None);
    };
    let key = ankusa_keyspace::hook_log(seq);
    let Some(raw) = store.get(Cf::Audit, &key)? else {
        return Ok(None);
    };
    let record =
        LogRecord::decode(&raw).map_err(|e| QueueError::corrupt_at(Family::HookLog, &key, e))?;
    if record.envelope.id != id {
        return Ok(None);
    }
    let stored_env = deliveries::envelope(store, seq)?;
    let stored = stored_env.is_some();
    let body = if body {
        stored_env.map(|e| e.body)
    } else {
        None
    };
    let mut sinks = Vec::with_capacity(record.envelope.sinks.len());
    for (i, name) in record.envelope.sinks.iter().enumerate() {
        let index = SinkIdx(i as u16);
        // A transition between the reads can hide the row for a moment: read again.
        let mut view = sink_view(store, seq, index, &record)?;
        if view.state == DeliveryState::Queued {
            view = sink_view(store, seq, index, &record)?;
        }
        view.sink = name.clone();
        sinks.push(view);
    }
    Ok(Some(HookView {
        seq,
        record,
        body,
        stored,
        sinks,
    }))
}

fn sink_view(
    store: &Store,
    seq: Seq,
    sink: SinkIdx,
    record: &LogRecord,
) -> Result<SinkView, QueueError> {
    let (lo, hi) = ankusa_keyspace::hook_events_of_delivery(seq, sink);
    let mut events = Vec::new();
    for kv in store.scan(Family::HookEvents, &lo, &hi, Dir::Forward)? {
        let (k, v) = kv?;
        let Some(ek) = ankusa_keyspace::decode_hook_event_known(&k)? else {
            continue;
        };
        events.push(
            Event::decode(&ek, &v)
                .map_err(|e| QueueError::corrupt_at(Family::HookEvents, &k, e))?,
        );
    }
    let attempts_logged = events
        .iter()
        .filter(|e| e.kind.is_attempt())
        .map(|e| e.attempt)
        .max()
        .unwrap_or(0);
    let key = ankusa_keyspace::delivery(seq, sink);
    let row = match store.get(Cf::Deliveries, &key)? {
        Some(v) => Some(
            DeliveryRow::decode(&v)
                .map_err(|e| QueueError::corrupt_at(Family::Deliveries, &key, e))?,
        ),
        None => None,
    };
    let last = events.last();
    let mut view = SinkView {
        index: sink,
        sink: String::new(),
        state: DeliveryState::Gone,
        attempts: row
            .as_ref()
            .map_or(attempts_logged, |r| r.attempts.max(attempts_logged)),
        next_attempt_at: None,
        events: Vec::new(),
    };
    match row {
        None => {
            if last.is_some_and(|e| e.outcome == Some(AttemptOutcome::Delivered)) {
                view.state = DeliveryState::Delivered;
            } else if last.is_some_and(|e| e.kind == EventKind::Purged) {
                view.state = DeliveryState::Purged;
            }
        }
        Some(row) => {
            let dead_event = last.filter(|e| e.outcome == Some(AttemptOutcome::Dead));
            let due_at = match (dead_event, last) {
                (Some(_), _) => None,
                (None, Some(e)) => e.next_at,
                (None, None) => Some(record.envelope.received_at),
            };
            let dead_at = dead_event.map(|e| e.at);
            view.state = match deliveries::locate(store, row.ord, seq, sink, due_at, dead_at)? {
                Located::Inflight => DeliveryState::Inflight,
                Located::Due(kind) => {
                    view.next_attempt_at = due_at;
                    match kind {
                        Kind::First => DeliveryState::Pending,
                        Kind::Retry => DeliveryState::Scheduled,
                    }
                }
                Located::Dead => DeliveryState::Dead,
                Located::Elsewhere => {
                    // Parked for a pull sink's consumers, at the same due time.
                    let name = record.envelope.sinks.get(sink.0 as usize);
                    let parked = match (name, due_at) {
                        (Some(name), Some(at)) => {
                            deliveries::pulled_at(store, row.ord, name, at, seq, sink)?
                        }
                        _ => None,
                    };
                    match parked {
                        Some(kind) => {
                            view.next_attempt_at = due_at;
                            match kind {
                                Kind::First => DeliveryState::Pending,
                                Kind::Retry => DeliveryState::Scheduled,
                            }
                        }
                        None => DeliveryState::Queued,
                    }
                }
            };
        }
    }
    view.events = events;
    Ok(view)
}

// ---------------------------------------------------------------------------------------
// Pruning.

/// What the log holds and what a pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PruneReport {
    pub pruned: u64,
    /// Hooks the log keeps after the pass (`newest − oldest + 1`, 0 if empty).
    pub hooks: u64,
}

/// The log's limits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    pub retention_ms: u64,
    pub max_hooks: u64,
}

/// Removes whole hooks from the log, oldest first. Keeps a cursor so a pass never walks
/// the span the last one deleted.
#[derive(Debug, Default)]
pub struct Pruner {
    cursor: Option<Seq>,
}

impl Pruner {
    /// One pass of at most `batch` hooks; deletes in one unsynced batch (a lost prune is
    /// done again).
    pub fn pass(
        &mut self,
        store: &Store,
        now: AtMs,
        limits: Retention,
        batch: usize,
    ) -> Result<PruneReport, QueueError> {
        let (lo, end) = Family::HookLog.bounds();
        let from = self.cursor.map_or(lo.clone(), ankusa_keyspace::hook_log);
        let Some((newest, _)) = store.first(Family::HookLog, &lo, &end, Dir::Reverse)? else {
            return Ok(PruneReport::default());
        };
        let newest = ankusa_keyspace::decode_hook_log(&newest)?;
        let cutoff = now.0.saturating_sub(limits.retention_ms);
        let mut first = None;
        let mut last = None;
        let mut ops = Vec::new();
        let mut oldest_kept = None;
        let mut pruned = 0;
        for kv in store
            .scan(Family::HookLog, &from, &end, Dir::Forward)?
            .take(batch)
        {
            let (k, v) = kv?;
            let seq = ankusa_keyspace::decode_hook_log(&k)?;
            let record = LogRecord::decode(&v)
                .map_err(|e| QueueError::corrupt_at(Family::HookLog, &k, e))?;
            let over = newest.0 - seq.0 + 1 > limits.max_hooks;
            if record.envelope.received_at.0 > cutoff && !over {
                oldest_kept = Some(seq);
                break;
            }
            first.get_or_insert(seq);
            last = Some(seq);
            pruned += 1;
            if let Some(k) = ankusa_keyspace::hook_id(&record.envelope.id) {
                ops.push(Op::delete(Cf::Audit, k));
            }
        }
        if let (Some(first), Some(last)) = (first, last) {
            let to = Seq(last.0 + 1);
            let (a, b) = ankusa_keyspace::hook_log_range(first, to);
            ops.push(Op::DeleteRange {
                cf: Cf::Audit,
                from: a,
                to: b,
            });
            let (a, b) = ankusa_keyspace::hook_events_of_seqs(first, to);
            ops.push(Op::DeleteRange {
                cf: Cf::Audit,
                from: a,
                to: b,
            });
            store.write(ops, false)?;
            self.cursor = Some(to);
        }
        let oldest = match oldest_kept {
            Some(s) => Some(s),
            None => store
                .first(
                    Family::HookLog,
                    &self.cursor.map_or(lo, ankusa_keyspace::hook_log),
                    &end,
                    Dir::Forward,
                )?
                .map(|(k, _)| ankusa_keyspace::decode_hook_log(&k))
                .transpose()?,
        };
        Ok(PruneReport {
            pruned,
            hooks: oldest.map_or(0, |o| newest.0.saturating_sub(o.0) + 1),
        })
    }
}

#[cfg(test)]
mod tests;
