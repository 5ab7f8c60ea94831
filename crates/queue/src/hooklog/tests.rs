use super::*;
use crate::deliveries::{claim, dead_letter, delivered, retry, revive, DueRow};
use crate::testkit::Harness;
use crate::writer::Assembler;
use ankusa_keyspace::EventKind;
use ankusa_records::{ErrorClass, MAX_ERROR_BYTES};
use ankusa_store::OpenOptions;

fn logging() -> Harness {
    let mut h = Harness::new();
    h.asm = Assembler::open(&h.store, 1_000_000).unwrap().logging(true);
    h
}

fn due_of(h: &Harness, seq: Seq, sink: u16) -> DueRow {
    h.due_rows()
        .into_iter()
        .find(|r| r.key.seq == seq && r.key.sink == SinkIdx(sink))
        .unwrap()
}

fn attempt(n: u32, outcome: AttemptOutcome, status: u16, at: u64, next: Option<u64>) -> Event {
    Event {
        kind: EventKind::Attempt,
        at: AtMs(at),
        attempt: n,
        outcome: Some(outcome),
        status,
        class: (status != 200).then_some(ErrorClass::Status),
        error: if status == 200 {
            String::new()
        } else {
            format!("HTTP {status}")
        },
        latency_us: 1_500,
        next_at: next.map(AtMs),
    }
}

fn states(h: &Harness, id: &str) -> Vec<(DeliveryState, Option<u64>)> {
    lookup(&h.store, id, false)
        .unwrap()
        .unwrap()
        .sinks
        .iter()
        .map(|s| (s.state, s.next_attempt_at.map(|a| a.0)))
        .collect()
}

#[test]
fn a_logged_hook_is_found_by_id_and_its_states_follow_its_transitions() {
    let mut h = logging();
    let seq = h.ingest(Some("acme"), 3, 1_000, false);
    let id = Harness::envelope(None, 0, 0, 1).id;
    let v = lookup(&h.store, &id, true).unwrap().unwrap();
    assert_eq!(v.seq, seq);
    assert_eq!(v.record.envelope.tenant.as_deref(), Some("acme"));
    assert_eq!(v.record.envelope.sinks, ["sink0", "sink1", "sink2"]);
    assert!(v.stored);
    assert_eq!(v.body.as_deref(), Some(&[b'x'; 10][..]));
    assert!(v.record.envelope.body.is_empty(), "the log keeps no body");
    assert_eq!(
        states(&h, &id),
        [(DeliveryState::Pending, Some(1_000)); 3].to_vec()
    );

    // sink0: claimed, then a 503 and a retry at 5 000.
    let r0 = due_of(&h, seq, 0);
    let mut f0 = None;
    h.commit(|tx| f0 = Some(claim(tx, &r0)));
    assert_eq!(states(&h, &id)[0].0, DeliveryState::Inflight);
    let f0 = f0.unwrap();
    let row = DeliveryRow {
        ord: f0.key.ord,
        size: f0.size,
        attempts: 1,
        ..DeliveryRow::default()
    };
    let mut tx = Tx::new();
    retry(&mut tx, &f0, AtMs(5_000), &row);
    let ev = attempt(1, AttemptOutcome::Retry, 503, 2_000, Some(5_000));
    record(&mut tx, &h.store, seq, SinkIdx(0), &ev).unwrap();
    tx.commit(&h.store, false).unwrap();

    // sink1: claimed and dead-lettered at 2 100 after a 410.
    let r1 = due_of(&h, seq, 1);
    let mut tx = Tx::new();
    let f1 = claim(&mut tx, &r1);
    dead_letter(&mut tx, &f1, AtMs(2_100), "src", &id, "sink1", None);
    record(
        &mut tx,
        &h.store,
        seq,
        SinkIdx(1),
        &attempt(1, AttemptOutcome::Dead, 410, 2_100, Some(2_100)),
    )
    .unwrap();
    tx.commit(&h.store, false).unwrap();

    // sink2: claimed and delivered.
    let r2 = due_of(&h, seq, 2);
    let mut tx = Tx::new();
    let f2 = claim(&mut tx, &r2);
    delivered(&mut tx, &f2);
    record(
        &mut tx,
        &h.store,
        seq,
        SinkIdx(2),
        &attempt(1, AttemptOutcome::Delivered, 200, 2_200, None),
    )
    .unwrap();
    tx.commit(&h.store, false).unwrap();

    assert_eq!(
        states(&h, &id),
        [
            (DeliveryState::Scheduled, Some(5_000)),
            (DeliveryState::Dead, None),
            (DeliveryState::Delivered, None),
        ]
    );
    let v = lookup(&h.store, &id, false).unwrap().unwrap();
    assert_eq!(v.sinks[1].events[0].status, 410);
    assert_eq!(v.sinks[1].events[0].class, Some(ErrorClass::Status));
    assert_eq!(v.sinks[2].attempts, 1);

    // A replay of sink1: pending again, due at the replay.
    let dead = h.dead_rows().pop().unwrap();
    let mut tx = Tx::new();
    revive(&mut tx, &dead, AtMs(9_000));
    let ev = requeued(EventKind::Replayed, AtMs(9_000), 0, AtMs(9_000));
    record(&mut tx, &h.store, seq, SinkIdx(1), &ev).unwrap();
    tx.commit(&h.store, false).unwrap();
    assert_eq!(states(&h, &id)[1], (DeliveryState::Pending, Some(9_000)));
    h.assert_counters_equal_fold();

    // Unknown ids and another hook's id are not found.
    assert!(lookup(&h.store, "hk_nope", false).unwrap().is_none());
    assert!(lookup(&h.store, "", false).unwrap().is_none());
}

#[test]
fn an_event_rides_with_its_transition_and_is_not_written_if_the_row_moved_first() {
    let mut h = logging();
    let seq = h.ingest(None, 1, 1_000, false);
    let r = due_of(&h, seq, 0);
    let mut f = None;
    h.commit(|tx| f = Some(claim(tx, &r)));
    let f = f.unwrap();
    // A purge (or another outcome) moved the row first: this outcome's unit is left out,
    // and its event with it.
    h.commit(|tx| delivered(tx, &f));
    let mut tx = Tx::new();
    delivered(&mut tx, &f);
    record(
        &mut tx,
        &h.store,
        seq,
        SinkIdx(0),
        &attempt(1, AttemptOutcome::Delivered, 200, 2_000, None),
    )
    .unwrap();
    assert_eq!(tx.commit(&h.store, false).unwrap().count(), 0);
    assert_eq!(h.store.scan_family(Family::HookEvents).unwrap().count(), 0);
}

#[test]
fn a_delivery_keeps_only_its_last_attempts() {
    let mut h = logging();
    let seq = h.ingest(None, 1, 1_000, false);
    let mut at = 1_000;
    for n in 1..=(MAX_ATTEMPTS_KEPT as u32 + 5) {
        let r = due_of(&h, seq, 0);
        let mut tx = Tx::new();
        let f = claim(&mut tx, &r);
        at += 10;
        let row = DeliveryRow {
            ord: f.key.ord,
            size: f.size,
            attempts: n,
            ..DeliveryRow::default()
        };
        retry(&mut tx, &f, AtMs(at + 5), &row);
        record(
            &mut tx,
            &h.store,
            seq,
            SinkIdx(0),
            &attempt(n, AttemptOutcome::Retry, 500, at, Some(at + 5)),
        )
        .unwrap();
        tx.commit(&h.store, false).unwrap();
    }
    let id = Harness::envelope(None, 0, 0, 1).id;
    let v = lookup(&h.store, &id, false).unwrap().unwrap();
    let kept: Vec<u32> = v.sinks[0].events.iter().map(|e| e.attempt).collect();
    assert_eq!(kept, (6..=21).collect::<Vec<_>>());
    assert_eq!(v.sinks[0].attempts, 21);
    assert_eq!(v.sinks[0].state, DeliveryState::Scheduled);
}

#[test]
fn pruning_removes_whole_hooks_oldest_first_by_age_and_by_the_ceiling() {
    let mut h = logging();
    for i in 0..100u64 {
        let seq = h.ingest(Some("t"), 1, 1_000 + i, false);
        let mut tx = Tx::new();
        tx.push_op(Op::put(
            Cf::Audit,
            ankusa_keyspace::hook_event(&EventKey {
                seq,
                sink: SinkIdx(0),
                at: AtMs(2_000 + i),
                kind: EventKind::Attempt,
            }),
            attempt(1, AttemptOutcome::Retry, 500, 2_000 + i, Some(9_000)).encode(),
        ));
        tx.commit(&h.store, false).unwrap();
    }
    let id = |n: u64| Harness::envelope(None, 0, 0, n).id;
    let count = |f: Family| h.store.scan_family(f).unwrap().count();
    let mut p = Pruner::default();
    // Received by 1 029 (10 s before 11 029): the first 30 go (a batch of 20, then 10).
    let limits = Retention {
        retention_ms: 10_000,
        max_hooks: 1_000,
    };
    let r = p.pass(&h.store, AtMs(11_029), limits, 20).unwrap();
    assert_eq!(
        r,
        PruneReport {
            pruned: 20,
            hooks: 80
        }
    );
    let r = p.pass(&h.store, AtMs(11_029), limits, 20).unwrap();
    assert_eq!(
        r,
        PruneReport {
            pruned: 10,
            hooks: 70
        }
    );
    assert!(lookup(&h.store, &id(30), false).unwrap().is_none());
    assert!(lookup(&h.store, &id(31), false).unwrap().is_some());
    assert_eq!(count(Family::HookLog), 70);
    assert_eq!(count(Family::HookIds), 70);
    assert_eq!(count(Family::HookEvents), 70);
    // Nothing more is old: a pass removes nothing and reads one record.
    let before = h.store.stats();
    let r = p.pass(&h.store, AtMs(11_029), limits, 20).unwrap();
    assert_eq!(
        r,
        PruneReport {
            pruned: 0,
            hooks: 70
        }
    );
    assert_eq!(h.store.stats().since(&before).scans_of(Family::HookLog), 1);
    // The ceiling: at most 50, the oldest leave first whatever their age.
    let ceiling = Retention {
        retention_ms: u64::MAX,
        max_hooks: 50,
    };
    let r = p.pass(&h.store, AtMs(11_029), ceiling, 1_000).unwrap();
    assert_eq!(
        r,
        PruneReport {
            pruned: 20,
            hooks: 50
        }
    );
    assert!(lookup(&h.store, &id(50), false).unwrap().is_none());
    assert!(lookup(&h.store, &id(51), false).unwrap().is_some());
    // The queue is untouched: the hooks' rows are all still due.
    assert_eq!(h.due_rows().len(), 100);
    h.assert_counters_equal_fold();
}

#[test]
fn a_store_from_before_the_log_gets_its_families_once_and_never_a_repair() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let store = Store::open(&path, &OpenOptions::default()).unwrap();
    // What a store written before the hook log holds: no marker, no sentinels.
    let mut ops = vec![Op::delete(
        Cf::Default,
        ankusa_keyspace::META_HOOK_LOG.to_vec(),
    )];
    for f in Family::HOOK_LOG {
        ops.push(Op::delete(f.cf(), f.lo()));
        ops.push(Op::delete(f.cf(), f.hi()));
    }
    store.write(ops, true).unwrap();
    drop(store);
    let store = Store::open(&path, &OpenOptions::default()).unwrap();
    for f in Family::HOOK_LOG {
        assert_eq!(store.scan_family(f).unwrap().count(), 0, "{f:?}");
    }
    // With the marker there, a lost sentinel stays corruption.
    store
        .write(vec![Op::delete(Cf::Audit, Family::HookLog.hi())], true)
        .unwrap();
    drop(store);
    let store = Store::open(&path, &OpenOptions::default()).unwrap();
    assert!(store
        .scan_family(Family::HookLog)
        .unwrap()
        .any(|kv| kv.is_err()));
}

#[test]
fn records_and_events_round_trip_and_bound_their_error() {
    let env = Harness::envelope(Some("t"), 2, 5, 3);
    let rec = LogRecord::decode(&LogRecord::encode_envelope(&env)).unwrap();
    assert_eq!(rec, LogRecord::of(&env));
    assert_eq!(rec.body_len, 30);
    let mut ev = attempt(3, AttemptOutcome::Retry, 0, 7, Some(9));
    ev.class = Some(ErrorClass::Connection);
    ev.error = "é".repeat(200);
    let key = EventKey {
        seq: Seq(1),
        sink: SinkIdx(0),
        at: AtMs(7),
        kind: EventKind::Attempt,
    };
    let back = Event::decode(&key, &ev.encode()).unwrap();
    assert_eq!(back.error.len(), MAX_ERROR_BYTES);
    assert_eq!(back.class, Some(ErrorClass::Connection));
    assert!(Event::decode(&key, b"\x01").is_err());
    assert!(LogRecord::decode(b"").is_err());
}

#[test]
fn a_purge_leaves_a_purged_event_but_not_under_a_pruned_hook_nor_in_an_erase() {
    use crate::deliveries::{purge_tenant, purge_tenant_chunk, PurgeKinds};
    let all = PurgeKinds {
        pending: true,
        dead: true,
    };
    let mut h = logging();
    let a = h.ingest(Some("acme"), 2, 1_000, false); // hk_1: two pending deliveries
    let b = h.ingest(Some("acme"), 1, 1_001, false); // hk_2: dead-lettered
    let c = h.ingest(Some("acme"), 1, 1_002, false); // hk_3: pruned from the log
    let rb = due_of(&h, b, 0);
    let mut tx = Tx::new();
    let fb = claim(&mut tx, &rb);
    dead_letter(&mut tx, &fb, AtMs(2_000), "src", "hk_2", "sink0", None);
    record(
        &mut tx,
        &h.store,
        b,
        SinkIdx(0),
        &attempt(1, AttemptOutcome::Dead, 410, 2_000, Some(2_000)),
    )
    .unwrap();
    tx.commit(&h.store, false).unwrap();
    h.store
        .write(
            vec![Op::delete(Cf::Audit, ankusa_keyspace::hook_log(c))],
            false,
        )
        .unwrap();
    // An event of a kind a newer release writes: read past, not an error.
    let mut future = ankusa_keyspace::hook_event(&EventKey {
        seq: a,
        sink: SinkIdx(0),
        at: AtMs(1_500),
        kind: EventKind::Replayed,
    });
    *future.last_mut().unwrap() = 0xEE;
    h.store
        .write(vec![Op::put(Cf::Audit, future, vec![1])], false)
        .unwrap();

    let report = purge_tenant(&h.store, h.ord("acme"), all).unwrap();
    assert_eq!((report.due, report.dead), (3, 1));
    assert_eq!(
        states(&h, "hk_1"),
        [(DeliveryState::Purged, None), (DeliveryState::Purged, None)]
    );
    assert_eq!(states(&h, "hk_2"), [(DeliveryState::Purged, None)]);
    let v = lookup(&h.store, "hk_2", false).unwrap().unwrap();
    let kinds: Vec<EventKind> = v.sinks[0].events.iter().map(|e| e.kind).collect();
    assert_eq!(kinds, [EventKind::Attempt, EventKind::Purged]);
    assert_eq!(v.sinks[0].attempts, 1, "a purge is not an attempt");
    let (lo, hi) = ankusa_keyspace::hook_events_of_seqs(c, Seq(c.0 + 1));
    let under_c = h.store.scan(Family::HookEvents, &lo, &hi, Dir::Forward);
    assert_eq!(under_c.unwrap().count(), 0, "no event under a pruned hook");
    h.assert_counters_equal_fold();

    // An erase's chunk removes the rows and writes no event (the erase takes the log).
    let mut h = logging();
    let d = h.ingest(Some("gone"), 1, 1_000, false);
    let r = purge_tenant_chunk(&h.store, h.ord("gone"), all).unwrap();
    assert_eq!(r.due, 1);
    let (lo, hi) = ankusa_keyspace::hook_events_of_seqs(d, Seq(d.0 + 1));
    let events = h.store.scan(Family::HookEvents, &lo, &hi, Dir::Forward);
    assert_eq!(events.unwrap().count(), 0);
    assert_eq!(states(&h, "hk_1"), [(DeliveryState::Gone, None)]);
}

/// A hook with no sink (every filter of its route left it out) is committed to the log
/// alone: found by its id with no sink, its body not kept, no hook row, no counter moved;
/// the next hook gets the next seq. Archived, it is stored for its archive obligation.
#[test]
fn a_hook_no_sink_took_is_logged_alone() {
    let mut h = logging();
    let seq = h.ingest(Some("acme"), 0, 1_000, false);
    let id = Harness::envelope(None, 0, 0, 1).id;
    let v = lookup(&h.store, &id, true).unwrap().unwrap();
    assert_eq!(v.seq, seq);
    assert!(v.record.envelope.sinks.is_empty());
    assert!(v.sinks.is_empty());
    assert!(!v.stored, "a filtered hook's body is not kept");
    assert_eq!(v.body, None);
    assert_eq!(
        crate::fold::rows_in(&h.store, ankusa_keyspace::Family::Hooks).unwrap(),
        0
    );
    assert!(crate::fold::stored(&h.store)
        .unwrap()
        .values()
        .all(|c| *c == Default::default()));
    h.assert_counters_equal_fold();
    let next = h.ingest(Some("acme"), 1, 1_001, false);
    assert_eq!(next.0, seq.0 + 1);
    h.ingest(Some("acme"), 0, 1_002, true);
    let archived = Harness::envelope(None, 0, 0, 3).id;
    assert!(lookup(&h.store, &archived, false).unwrap().unwrap().stored);
    h.assert_counters_equal_fold();
}
