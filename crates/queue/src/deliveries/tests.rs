//! The queue's proofs (docs/storage.md, "Counters and the merge operator"; docs/testing.md lists them).
// The transitions' own tests read the rows they wrote by key.
#![allow(clippy::disallowed_methods)]

use std::collections::BTreeSet;

use proptest::prelude::*;

use super::*;
use crate::tenants::Allocator;
use crate::testkit::Harness;
use crate::writer::Assembler;
use crate::{counters, dead_for_tenant, fold, pending_for_tenant, QueueError};
use ankusa_keyspace::Cf;
use ankusa_keyspace::{AtMs, Bucket, Family, Seq, SinkIdx, TenantOrd};
use ankusa_records::{DeadValue, DeliveryRow, Envelope, DEFAULT_TENANT};
use ankusa_store::Rows;
use ankusa_store::{Op, Store};

const TENANTS: [Option<&str>; 4] = [None, Some("acme"), Some("globex"), Some("initech")];

#[derive(Debug, Clone)]
enum Transition {
    Ingest {
        tenant: usize,
        sinks: usize,
        at: u64,
        archive: bool,
    },
    /// Ingest with the deliveries of the sinks in the mask started at the commit (written
    /// inflight, never due).
    IngestStarted {
        tenant: usize,
        sinks: usize,
        at: u64,
        archive: bool,
        started: u8,
    },
    Claim(usize),
    Deliver(usize),
    /// Delivered by the pipeline's outcome: the hook goes too where nothing else needs it.
    DeliverReclaiming(usize),
    Retry(usize, u64),
    DeadLetter(usize),
    OrphanDrop(usize),
    Revive(usize),
    /// Retry now: a due row made due at once.
    Hasten(usize, u64),
    Recover,
    Expand(usize),
    Purge {
        tenant: usize,
        pending: bool,
        dead: bool,
    },
    ArchiveSettle(usize),
    ArchiveDrop(usize),
    /// The archiver: a settle pass of up to n obligations (a source with the archive off
    /// drops), then its retention pass at `now`.
    Archiver {
        n: usize,
        off: bool,
        now: u64,
    },
    Reclaim,
    Cleanup(u64),
    /// The tenant erased: its erase steps run to the end (deliveries in flight recovered
    /// when it waits on them, as a stop would), then its last write.
    Erase(usize),
}

fn transition() -> impl Strategy<Value = Transition> {
    prop_oneof![
        4 => (0..TENANTS.len(), 1usize..4, 0u64..20_000, any::<bool>()).prop_map(
            |(tenant, sinks, at, archive)| Transition::Ingest { tenant, sinks, at, archive }
        ),
        2 => (0..TENANTS.len(), 1usize..4, 0u64..20_000, any::<bool>(), any::<u8>()).prop_map(
            |(tenant, sinks, at, archive, started)| Transition::IngestStarted { tenant, sinks, at, archive, started }
        ),
        4 => any::<usize>().prop_map(Transition::Claim),
        2 => any::<usize>().prop_map(Transition::Deliver),
        2 => any::<usize>().prop_map(Transition::DeliverReclaiming),
        2 => (any::<usize>(), 0u64..30_000).prop_map(|(i, at)| Transition::Retry(i, at)),
        2 => any::<usize>().prop_map(Transition::DeadLetter),
        1 => any::<usize>().prop_map(Transition::OrphanDrop),
        2 => any::<usize>().prop_map(Transition::Revive),
        1 => (any::<usize>(), 0u64..20_000).prop_map(|(i, at)| Transition::Hasten(i, at)),
        1 => Just(Transition::Recover),
        1 => any::<usize>().prop_map(Transition::Expand),
        1 => (0..TENANTS.len(), any::<bool>(), any::<bool>())
            .prop_map(|(tenant, pending, dead)| Transition::Purge { tenant, pending, dead }),
        1 => any::<usize>().prop_map(Transition::ArchiveSettle),
        1 => any::<usize>().prop_map(Transition::ArchiveDrop),
        1 => (1usize..4, any::<bool>(), 0u64..40_000)
            .prop_map(|(n, off, now)| Transition::Archiver { n, off, now }),
        1 => Just(Transition::Reclaim),
        2 => (0u64..40_000).prop_map(Transition::Cleanup),
        1 => (0..TENANTS.len()).prop_map(Transition::Erase),
    ]
}

fn pick<T: Clone>(v: &[T], i: usize) -> Option<T> {
    (!v.is_empty()).then(|| v[i % v.len()].clone())
}

/// How many sinks the hook's envelope names (0 for a hook that is gone).
fn sinks_of(store: &Store, seq: Seq) -> usize {
    store
        .get(Cf::Hooks, &ankusa_keyspace::hook(seq))
        .unwrap()
        .map_or(0, |v| Envelope::decode(&v).unwrap().sinks.len())
}

fn apply(h: &mut Harness, t: &Transition) {
    match t {
        Transition::Ingest {
            tenant,
            sinks,
            at,
            archive,
        } => {
            h.ingest(TENANTS[*tenant], *sinks, *at, *archive);
        }
        Transition::IngestStarted {
            tenant,
            sinks,
            at,
            archive,
            started,
        } => {
            h.ingest_started(TENANTS[*tenant], *sinks, *at, *archive, *started);
        }
        Transition::Claim(i) => {
            if let Some(r) = pick(&h.due_rows(), *i) {
                h.commit(|tx| {
                    claim(tx, &r);
                });
            }
        }
        Transition::Deliver(i) => {
            if let Some(r) = pick(&h.inflight_rows(), *i) {
                h.commit(|tx| delivered(tx, &r));
            }
        }
        Transition::DeliverReclaiming(i) => {
            if let Some(r) = pick(&h.inflight_rows(), *i) {
                let last = last_needs(&h.store, &[(r, sinks_of(&h.store, r.key.seq))]).unwrap();
                h.commit(|tx| delivered_last(tx, &r, last[0]));
            }
        }
        Transition::Retry(i, at) => {
            if let Some(r) = pick(&h.inflight_rows(), *i) {
                let row = DeliveryRow {
                    ord: r.key.ord,
                    size: r.size,
                    attempts: 1,
                    ..DeliveryRow::default()
                };
                h.commit(|tx| retry(tx, &r, AtMs(*at), &row));
            }
        }
        Transition::DeadLetter(i) => {
            if let Some(r) = pick(&h.inflight_rows(), *i) {
                h.commit(|tx| {
                    dead_letter(tx, &r, AtMs(r.key.seq.0 * 3), "src", "hk", "s", None);
                });
            }
        }
        Transition::OrphanDrop(i) => {
            if let Some(r) = pick(&h.inflight_rows(), *i) {
                h.commit(|tx| orphan_drop(tx, &r));
            }
        }
        Transition::Revive(i) => {
            if let Some(r) = pick(&h.dead_rows(), *i) {
                h.commit(|tx| revive(tx, &r, AtMs(500)));
            }
        }
        Transition::Hasten(i, at) => {
            if let Some(r) = pick(&h.due_rows(), *i) {
                h.commit(|tx| hasten(tx, &r, AtMs(*at)));
            }
        }
        Transition::Recover => {
            recover_inflight(&h.store, AtMs(700), false).unwrap();
        }
        Transition::Expand(i) => {
            // A new sink for an existing hook, appended to its envelope as an import or a
            // route gaining a sink writes it.
            let seqs: Vec<Seq> = h
                .store
                .scan_family(Family::Hooks)
                .unwrap()
                .map(|kv| ankusa_keyspace::decode_hook(&kv.unwrap().0).unwrap())
                .collect();
            if let Some(seq) = pick(&seqs, *i) {
                let mut env = Envelope::decode(
                    &h.store
                        .get(Cf::Hooks, &ankusa_keyspace::hook(seq))
                        .unwrap()
                        .unwrap(),
                )
                .unwrap();
                let ord = h.ord(env.tenant_or_default());
                let next = SinkIdx(env.sinks.len() as u16);
                env.sinks.push(format!("expanded-{}", next.0));
                h.commit(|tx| {
                    tx.push_op(Op::put(Cf::Hooks, ankusa_keyspace::hook(seq), env.encode()));
                    expand(tx, ord, seq, next, 77, AtMs(900));
                });
            }
        }
        Transition::Purge {
            tenant,
            pending,
            dead,
        } => {
            let name = TENANTS[*tenant].unwrap_or(DEFAULT_TENANT);
            if let Some(ord) = crate::tenants::ord(&h.store, name).unwrap() {
                purge_tenant(
                    &h.store,
                    ord,
                    PurgeKinds {
                        pending: *pending,
                        dead: *dead,
                    },
                )
                .unwrap();
            }
        }
        Transition::ArchiveSettle(i) | Transition::ArchiveDrop(i) => {
            let obs = archive_obligations(&h.store, None, usize::MAX).unwrap();
            if let Some(ob) = pick(&obs, *i) {
                if matches!(t, Transition::ArchiveSettle(_)) {
                    h.commit(|tx| archive_settle(tx, &ob));
                } else {
                    h.commit(|tx| archive_drop(tx, &ob));
                }
            }
        }
        Transition::Archiver { n, off, now } => {
            let policy = |_: &str| (!*off).then_some(10_000u64);
            let mut a = crate::archive::Archiver::default();
            a.settle(&h.store, &policy, *n).unwrap();
            a.prune(&h.store, AtMs(*now), 100).unwrap();
        }
        Transition::Reclaim => {
            crate::reclaim::reclaim_pass(&h.store, 100).unwrap();
        }
        Transition::Cleanup(now) => {
            let now = AtMs(*now);
            for t in active_tenants(&h.store, now, 4096).unwrap() {
                cleanup_markers(&h.store, t.ord, &t.buckets, now).unwrap();
            }
        }
        Transition::Erase(tenant) => {
            let name = TENANTS[*tenant].unwrap_or(DEFAULT_TENANT);
            if let Some(ord) = crate::tenants::ord(&h.store, name).unwrap() {
                let mut cursor = crate::erase::Cursor::default();
                loop {
                    match crate::erase::step(&h.store, ord, name, &mut cursor).unwrap() {
                        crate::erase::Step::Worked { .. } => {}
                        crate::erase::Step::Waiting { .. } => {
                            recover_inflight(&h.store, AtMs(700), false).unwrap();
                        }
                        crate::erase::Step::Clean => break,
                    }
                }
                let ops = crate::erase::finish_ops(&h.store, ord, name).unwrap();
                crate::commit(&h.store, ops, true).unwrap();
                h.asm.forget_ordinals();
                let left = crate::testkit::keys_of_tenant(&h.store, ord, name);
                assert!(left.is_empty(), "{left:?}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn counters_equal_a_fold_after_any_sequence_of_transitions(
        seq in proptest::collection::vec(transition(), 1..60)
    ) {
        let mut h = Harness::new();
        for t in &seq {
            apply(&mut h, t);
        }
        h.assert_counters_equal_fold();
        h.assert_every_need_has_its_hook();
        // Every tenant's point read equals its fold too (the read the admin API serves).
        let folded = fold::fold(&h.store).unwrap();
        for (ord, c) in &folded {
            prop_assert_eq!(&counters::read(&h.store, *ord).unwrap(), c);
        }
    }

    #[test]
    fn no_due_row_without_a_marker(seq in proptest::collection::vec(transition(), 1..60)) {
        let mut h = Harness::new();
        for t in &seq {
            apply(&mut h, t);
            h.assert_every_due_row_has_its_marker();
        }
    }
}

#[test]
fn concurrent_writers_do_not_lose_counts() {
    let mut h = Harness::new();
    let threads = 6usize;
    let per_thread = 150usize;
    for i in 0..threads * per_thread {
        h.ingest(Some("acme"), 1, i as u64, i % 3 == 0);
    }
    let ord = h.ord("acme");
    let rows = h.due_rows();
    let store = h.store.clone();
    // Each thread owns a disjoint slice of rows and drives them through different op
    // builders, one commit per transition, all on the same tenant's counter rows.
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = store.clone();
            let mine: Vec<DueRow> = rows
                .iter()
                .copied()
                .skip(t * per_thread)
                .take(per_thread)
                .collect();
            std::thread::spawn(move || {
                let commit = |f: &dyn Fn(&mut Tx)| {
                    let mut tx = Tx::new();
                    f(&mut tx);
                    tx.commit(&store, false).unwrap();
                };
                for (i, r) in mine.iter().enumerate() {
                    let mut tx = Tx::new();
                    let inflight = claim(&mut tx, r);
                    tx.commit(&store, false).unwrap();
                    match (t + i) % 4 {
                        0 => commit(&|tx| delivered(tx, &inflight)),
                        1 => commit(&|tx| {
                            retry(tx, &inflight, AtMs(99_000), &DeliveryRow::default())
                        }),
                        2 => {
                            let mut tx = Tx::new();
                            let dead =
                                dead_letter(&mut tx, &inflight, AtMs(5), "src", "hk", "s", None);
                            tx.commit(&store, false).unwrap();
                            commit(&|tx| revive(tx, &dead, AtMs(6)));
                        }
                        _ => {} // stays inflight
                    }
                }
            })
        })
        .collect();
    for handle in handles {
        handle.join().unwrap();
    }
    let n = (threads * per_thread) as i64;
    let c = counters::read(&h.store, ord).unwrap();
    let quarter = |k: usize| {
        (0..threads)
            .flat_map(|t| (0..per_thread).map(move |i| (t + i) % 4))
            .filter(|m| *m == k)
            .count() as i64
    };
    assert_eq!(c.pending, quarter(2), "revived rows are pending again");
    assert_eq!(c.scheduled, quarter(1));
    assert_eq!(c.inflight, quarter(3));
    assert_eq!(c.dead, 0);
    assert_eq!(c.archive_pending, (n + 2) / 3);
    assert_eq!(counters::node(&h.store).unwrap(), c);
    h.assert_counters_equal_fold();
}

#[test]
fn tenant_ordinal_is_assigned_once_and_never_reused() {
    let mut h = Harness::new();
    h.ingest(Some("a"), 1, 1, false);
    h.ingest(Some("b"), 1, 1, false);
    h.ingest(Some("a"), 1, 1, false);
    h.ingest(None, 1, 1, false);
    assert_eq!(h.ord("a"), TenantOrd(1));
    assert_eq!(h.ord("b"), TenantOrd(2));
    assert_eq!(h.ord(DEFAULT_TENANT), TenantOrd(3));
    assert_eq!(crate::tenants::count(&h.store).unwrap(), 3);
    assert_eq!(
        crate::tenants::name(&h.store, TenantOrd(2))
            .unwrap()
            .as_deref(),
        Some("b")
    );

    // A resolution whose batch never committed allocates nothing: the next one gets the
    // same ordinal, and nothing was skipped.
    let dropped = h
        .asm
        .assemble(&h.store, &[Harness::envelope(Some("c"), 1, 1, 0)], false)
        .unwrap();
    assert_eq!(dropped.outcomes.len(), 1);
    drop(dropped);
    h.ingest(Some("c"), 1, 1, false);
    assert_eq!(h.ord("c"), TenantOrd(4));

    // A restarted writer (empty cache, next ordinal from the store) agrees.
    let mut fresh = Allocator::with_cache(1_000_000, 2);
    let res = fresh.resolve(&h.store, ["b", "a", "d", "c"]).unwrap();
    assert_eq!(res.ord_of("a"), Some(TenantOrd(1)));
    assert_eq!(res.ord_of("b"), Some(TenantOrd(2)));
    assert_eq!(res.ord_of("c"), Some(TenantOrd(4)));
    assert_eq!(res.ord_of("d"), Some(TenantOrd(5)));
    assert_eq!(res.created, vec![("d".to_owned(), TenantOrd(5))]);
    // Two tenants new in one batch get consecutive ordinals in first-sight order.
    let res = fresh.resolve(&h.store, ["y", "x", "y"]).unwrap();
    assert_eq!(
        res.ord_of("y"),
        Some(TenantOrd(5)),
        "d's batch did not commit"
    );
    assert_eq!(res.ord_of("x"), Some(TenantOrd(6)));
    // The cache is bounded: capacity 2, cleared whole when full.
    fresh.committed(&res);
    assert!(fresh.cache_len() <= 2);
}

#[test]
fn tenants_max_refuses_a_new_tenant_and_never_an_existing_one() {
    let mut h = Harness::with_max(2);
    h.ingest(Some("a"), 1, 1, false);
    h.ingest(Some("b"), 1, 1, false);
    let before = fold::stored(&h.store).unwrap();
    match h.try_ingest(Some("c"), 1, 1, false) {
        Err(QueueError::TenantLimit { max: 2 }) => {}
        other => panic!("expected TenantLimit, got {other:?}"),
    }
    assert_eq!(
        fold::stored(&h.store).unwrap(),
        before,
        "a refusal changed counters"
    );
    assert!(crate::tenants::ord(&h.store, "c").unwrap().is_none());
    assert_eq!(crate::tenants::count(&h.store).unwrap(), 2);
    // Existing tenants at the cap, through the cache and through a cold allocator.
    h.ingest(Some("a"), 1, 2, false);
    h.asm = Assembler::open(&h.store, 2).unwrap();
    h.ingest(Some("b"), 1, 2, false);
    let err = h.try_ingest(Some("c"), 1, 1, false).unwrap_err();
    assert_eq!(
        err.to_string(),
        "tenant limit reached: this node holds tenants.max = 2 tenants"
    );
    h.assert_counters_equal_fold();
}

#[test]
fn invalid_tenant_ids_are_refused_without_an_ordinal() {
    let mut a = Allocator::new(10);
    let h = Harness::new();
    let long = "x".repeat(300);
    let res = a.resolve(&h.store, ["", "a\nb", long.as_str()]).unwrap();
    assert!(res
        .ords
        .values()
        .all(|r| matches!(r, Err(QueueError::InvalidTenant(_)))));
    assert!(res.ops.is_empty());
}

#[test]
fn cleanup_does_not_lose_a_marker_to_a_concurrent_enqueue() {
    let mut h = Harness::new();
    // Tenant acme: a row due in bucket 50, claimed, and a row due in bucket 100.
    h.ingest(Some("acme"), 1, 50_000, false);
    h.ingest(Some("acme"), 1, 100_000, false);
    let ord = h.ord("acme");
    let first = first_due(&h.store, ord).unwrap().unwrap();
    h.commit(|tx| {
        claim(tx, &first);
    });
    let now = AtMs(200_000);
    let active = active_tenants(&h.store, now, 4096).unwrap();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].buckets, vec![Bucket(50), Bucket(100)]);

    // Step 1 reads: bucket 50 is stale (the first due row is in bucket 100).
    let plan = cleanup_plan(&h.store, ord, &active[0].buckets, now).unwrap();
    assert_eq!(plan.stale, vec![Bucket(50)]);
    // A writer commits a row due in bucket 50 (with its marker) before step 2 runs.
    h.ingest(Some("acme"), 1, 50_500, false);
    // Step 2 deletes the marker the writer just put: the hazard is real...
    let deleted = cleanup_delete(&h.store, plan).unwrap();
    assert!(!h.markers().contains(&(Bucket(50), ord)));
    // ...and step 3 puts it back.
    let restored = cleanup_verify(&h.store, deleted).unwrap();
    assert_eq!(restored, vec![Bucket(50)]);
    h.assert_every_due_row_has_its_marker();

    // Without the concurrent writer, the stale marker goes and stays gone.
    let row = first_due(&h.store, ord).unwrap().unwrap();
    h.commit(|tx| {
        claim(tx, &row);
    });
    cleanup_markers(&h.store, ord, &[Bucket(50), Bucket(100)], now).unwrap();
    assert_eq!(h.markers(), BTreeSet::from([(Bucket(100), ord)]));
    h.assert_every_due_row_has_its_marker();
}

#[test]
fn a_marker_of_the_current_second_is_never_deleted() {
    let mut h = Harness::new();
    h.ingest(Some("acme"), 1, 10_200, false);
    let ord = h.ord("acme");
    let r = first_due(&h.store, ord).unwrap().unwrap();
    h.commit(|tx| {
        claim(tx, &r);
    });
    // The tenant has nothing due, but the marker is in the current second: it stays (a
    // retry a few hundred milliseconds ahead may be about to use it).
    cleanup_markers(&h.store, ord, &[Bucket(10)], AtMs(10_900)).unwrap();
    assert!(h.markers().contains(&(Bucket(10), ord)));
    cleanup_markers(&h.store, ord, &[Bucket(10)], AtMs(11_000)).unwrap();
    assert!(h.markers().is_empty());
}

#[test]
fn active_tenants_returns_only_tenants_with_due_rows() {
    let mut h = Harness::new();
    let now = 1_000_000u64;
    h.ingest(Some("due-now"), 2, now - 5_000, false);
    h.ingest(Some("due-later"), 1, now + 3_600_000, false);
    h.ingest(Some("dead-only"), 1, now - 9_000, false);
    h.ingest(Some("inflight-only"), 1, now - 8_000, false);
    for name in ["dead-only", "inflight-only"] {
        let ord = h.ord(name);
        let r = first_due(&h.store, ord).unwrap().unwrap();
        let mut tx = Tx::new();
        let inflight = claim(&mut tx, &r);
        if name == "dead-only" {
            dead_letter(&mut tx, &inflight, AtMs(now - 1), "src", "hk", "s", None);
        }
        tx.commit(&h.store, false).unwrap();
        let active = active_tenants(&h.store, AtMs(now), 4096).unwrap();
        let a = active.iter().find(|t| t.ord == ord).unwrap();
        cleanup_markers(&h.store, ord, &a.buckets, AtMs(now)).unwrap();
    }
    let active = active_tenants(&h.store, AtMs(now), 4096).unwrap();
    assert_eq!(
        active,
        vec![ActiveTenant {
            ord: h.ord("due-now"),
            buckets: vec![Bucket(now / 1000 - 5)]
        }]
    );
    let due = due_for_tenant(&h.store, h.ord("due-now"), AtMs(now), AtMs(0), 10, u64::MAX)
        .unwrap()
        .rows;
    assert_eq!(due.len(), 2);
    assert!(due_for_tenant(
        &h.store,
        h.ord("due-later"),
        AtMs(now),
        AtMs(0),
        10,
        u64::MAX
    )
    .unwrap()
    .rows
    .is_empty());
    // Once its second comes, the later tenant is active too.
    let later = active_tenants(&h.store, AtMs(now + 3_600_000), 4096).unwrap();
    assert_eq!(later.len(), 2);
    assert_eq!(
        oldest_due_at(&h.store).unwrap(),
        Some(AtMs(now - 5_000)),
        "oldest due comes from the first live marker"
    );
}

#[test]
fn due_for_tenant_respects_floor_limit_and_byte_budget_and_says_if_more_is_due() {
    let mut h = Harness::new();
    for at in [1_000, 2_000, 3_000, 4_000, 5_000] {
        h.ingest(Some("t"), 1, at, false);
    }
    let ord = h.ord("t");
    let all = due_for_tenant(&h.store, ord, AtMs(4_000), AtMs(0), 10, u64::MAX)
        .unwrap()
        .rows;
    assert_eq!(
        all.iter().map(|r| r.key.at.0).collect::<Vec<_>>(),
        vec![1_000, 2_000, 3_000, 4_000]
    );
    let floor = due_for_tenant(&h.store, ord, AtMs(4_000), AtMs(2_500), 10, u64::MAX)
        .unwrap()
        .rows;
    assert_eq!(floor.len(), 2);
    assert_eq!(
        due_for_tenant(&h.store, ord, AtMs(9_000), AtMs(0), 2, u64::MAX)
            .unwrap()
            .rows
            .len(),
        2
    );
    let one = due_for_tenant(&h.store, ord, AtMs(9_000), AtMs(0), 10, 1)
        .unwrap()
        .rows;
    assert_eq!(one.len(), 1, "the first row always fits, however large");
    let size = all[0].size as u64;
    let two = due_for_tenant(
        &h.store,
        ord,
        AtMs(9_000),
        AtMs(0),
        10,
        size + all[1].size as u64,
    )
    .unwrap()
    .rows;
    assert_eq!(two.len(), 2);
    // Whether the read stopped with rows still due: a limit or a budget cut it, not the
    // tenant's last row due by `now` (five rows are due at 9 000, four at 4 000).
    let more = |now: u64, limit: usize, budget: u64| {
        due_for_tenant(&h.store, ord, AtMs(now), AtMs(0), limit, budget)
            .unwrap()
            .more
    };
    assert!(!more(4_000, 10, u64::MAX), "every row due by now was read");
    assert!(!more(4_000, 4, u64::MAX), "the limit met the last row due");
    assert!(more(9_000, 2, u64::MAX), "the limit cut the read");
    assert!(more(9_000, 10, 1), "the byte budget cut the read");
}

#[test]
fn pending_for_tenant_dead_for_tenant_and_purge_tenant_touch_one_tenant() {
    let mut h = Harness::new();
    for i in 0..30 {
        h.ingest(Some("a"), 2, i * 10, false);
        h.ingest(Some("b"), 2, i * 10, false);
    }
    for name in ["a", "b"] {
        let ord = h.ord(name);
        for r in due_for_tenant(&h.store, ord, AtMs(u64::MAX - 1), AtMs(0), 10, u64::MAX)
            .unwrap()
            .rows
        {
            let mut tx = Tx::new();
            let inflight = claim(&mut tx, &r);
            dead_letter(
                &mut tx,
                &inflight,
                AtMs(r.key.seq.0),
                "src",
                "hk",
                "s",
                None,
            );
            tx.commit(&h.store, false).unwrap();
        }
    }
    let (a, b) = (h.ord("a"), h.ord("b"));
    let b_before = counters::read(&h.store, b).unwrap();
    let b_rows_before = (
        h.due_rows().iter().filter(|r| r.key.ord == b).count(),
        dead_page_for_tenant(&h.store, b, None, 1000)
            .unwrap()
            .rows
            .len(),
    );
    assert_eq!(pending_for_tenant(&h.store, a).unwrap().pending, 50);
    assert_eq!(dead_for_tenant(&h.store, a).unwrap(), 10);

    let before = h.store.stats();
    let report = purge_tenant(
        &h.store,
        a,
        PurgeKinds {
            pending: true,
            dead: true,
        },
    )
    .unwrap();
    assert_eq!((report.due, report.dead), (50, 10));
    let delta = h.store.stats().since(&before);
    assert_eq!(delta.point_reads_of(Cf::Hooks), 0, "a purge reads no hook");

    let pa = pending_for_tenant(&h.store, a).unwrap();
    assert_eq!(
        (pa.pending, pa.scheduled, pa.inflight, pa.bytes),
        (0, 0, 0, 0)
    );
    assert_eq!(dead_for_tenant(&h.store, a).unwrap(), 0);
    assert_eq!(counters::read(&h.store, b).unwrap(), b_before);
    assert_eq!(
        (
            h.due_rows().iter().filter(|r| r.key.ord == b).count(),
            dead_page_for_tenant(&h.store, b, None, 1000)
                .unwrap()
                .rows
                .len()
        ),
        b_rows_before
    );
    // Every purged hook has a cleared marker for reclaim.
    assert_eq!(h.store.scan_family(Family::Cleared).unwrap().count(), 30);
    // A second purge is a no-op.
    let again = purge_tenant(
        &h.store,
        a,
        PurgeKinds {
            pending: true,
            dead: true,
        },
    )
    .unwrap();
    assert_eq!(again, PurgeReport::default());
    h.assert_counters_equal_fold();
}

#[test]
fn purge_tenant_resumes_after_interruption() {
    let mut h = Harness::new();
    for i in 0..1_200 {
        h.ingest(Some("big"), 1, i, false);
    }
    h.ingest(Some("other"), 1, 5, false);
    let ord = h.ord("big");
    let kinds = PurgeKinds {
        pending: true,
        dead: false,
    };
    // The first chunk commits, then the process "dies".
    let first = purge_tenant_chunk(&h.store, ord, kinds).unwrap();
    assert_eq!(first.due, CHUNK_ROWS as u64);
    assert_eq!(pending_for_tenant(&h.store, ord).unwrap().pending, 700);
    h.assert_counters_equal_fold();
    // Called again, it finishes the job without double counting.
    let rest = purge_tenant(&h.store, ord, kinds).unwrap();
    assert_eq!(rest.due, 700);
    assert_eq!(rest.batches, 2);
    assert_eq!(
        pending_for_tenant(&h.store, ord).unwrap(),
        crate::Backlog::default()
    );
    assert_eq!(
        pending_for_tenant(&h.store, h.ord("other"))
            .unwrap()
            .pending,
        1
    );
    h.assert_counters_equal_fold();
}

#[test]
fn recover_inflight_returns_every_inflight_row_to_due() {
    let mut h = Harness::new();
    for i in 0..1_100 {
        h.ingest(Some(if i % 2 == 0 { "a" } else { "b" }), 1, i, false);
    }
    for r in h.due_rows() {
        h.commit(|tx| {
            claim(tx, &r);
        });
    }
    assert_eq!(counters::node(&h.store).unwrap().inflight, 1_100);
    assert_eq!(
        recover_inflight(&h.store, AtMs(50_000), false).unwrap(),
        1_100
    );
    let c = counters::node(&h.store).unwrap();
    assert_eq!((c.pending, c.inflight), (1_100, 0));
    assert!(h.inflight_rows().is_empty());
    h.assert_counters_equal_fold();
    h.assert_every_due_row_has_its_marker();
}

#[test]
fn dead_pages_are_newest_first_and_the_tenant_page_reads_one_range_and_no_hook() {
    let mut h = Harness::new();
    for i in 0..20u64 {
        h.ingest(Some(if i % 2 == 0 { "a" } else { "b" }), 1, i, false);
    }
    for r in h.due_rows() {
        h.commit(|tx| {
            let inflight = claim(tx, &r);
            dead_letter(
                tx,
                &inflight,
                AtMs(1_000 + r.key.seq.0),
                "src",
                &format!("hk{}", r.key.seq.0),
                "s",
                None,
            );
        });
    }
    let page1 = dead_page(&h.store, None, 8).unwrap();
    let ats: Vec<u64> = page1.rows.iter().map(|r| r.key.at.0).collect();
    assert_eq!(ats, (13..=20).rev().map(|s| 1_000 + s).collect::<Vec<_>>());
    let page2 = dead_page(&h.store, page1.next, 100).unwrap();
    assert_eq!(page2.rows.len(), 12);
    assert!(page2.next.is_none());

    let a = h.ord("a");
    let before = h.store.stats();
    let tp = dead_page_for_tenant(&h.store, a, None, 100).unwrap();
    let delta = h.store.stats().since(&before);
    assert_eq!(tp.rows.len(), 10);
    assert!(tp.rows.iter().all(|r| r.value.ord == a));
    assert!(
        tp.rows.windows(2).all(|w| w[0].key > w[1].key),
        "newest first"
    );
    assert_eq!(delta.scans_of(Family::DeadByTenant), 1);
    assert_eq!(delta.scans_of(Family::Dead), 0);
    assert_eq!(delta.point_reads_of(Cf::Hooks), 0);

    // The tenants with dead rows: one scan per tenant however many rows it has, and the
    // limit holds.
    let b = h.ord("b");
    let before = h.store.stats();
    assert_eq!(tenants_with_dead(&h.store, 10).unwrap(), vec![a, b]);
    let delta = h.store.stats().since(&before);
    assert_eq!(
        delta.scans_of(Family::DeadByTenant),
        3,
        "a, b, then the end"
    );
    assert_eq!(tenants_with_dead(&h.store, 1).unwrap(), vec![a]);
}

#[test]
fn oldest_due_age_skips_stale_markers() {
    let mut h = Harness::new();
    h.ingest(Some("a"), 1, 5_000, false);
    h.ingest(Some("b"), 1, 9_000, false);
    let a = h.ord("a");
    let r = first_due(&h.store, a).unwrap().unwrap();
    h.commit(|tx| {
        claim(tx, &r);
    });
    // a's marker in bucket 5 is stale now; b's row at 9 000 is the oldest due.
    assert_eq!(oldest_due_at(&h.store).unwrap(), Some(AtMs(9_000)));
    let before = h.store.stats();
    oldest_due_at(&h.store).unwrap();
    let d = h.store.stats().since(&before);
    assert_eq!(d.scans_of(Family::Active), 1);
    assert_eq!(d.scans_of(Family::Due), 0);
    assert_eq!(
        d.seeks_of(Family::Due),
        2,
        "one first_due per marker visited"
    );
}

#[test]
fn values_that_do_not_decode_are_errors() {
    assert!(Envelope::decode(b"\x01\x00").is_err());
    assert!(Envelope::decode(b"").is_err());
    assert!(DeliveryRow::decode(b"\x09").is_err());
    assert!(DeadValue::decode(b"\x03\x00\x00").is_err());
    let env = Envelope {
        id: "hk_1".into(),
        tenant: None,
        source: "s".into(),
        received_at: AtMs(5),
        content_type: "text/plain".into(),
        sinks: vec!["a".into(), "b".into()],
        body: b"hello".to_vec(),
        headers: Vec::new(),
    };
    assert_eq!(Envelope::decode(&env.encode()).unwrap(), env);
    let mut bad = env.encode();
    bad.push(0);
    assert!(
        Envelope::decode(&bad).is_err(),
        "trailing bytes are refused"
    );
}

#[test]
fn a_dead_value_names_its_sink_and_a_version_3_value_still_decodes() {
    let v = DeadValue {
        ord: TenantOrd(7),
        size: 9,
        source: "gh".into(),
        hook_id: "hk_1".into(),
        sink: "billing".into(),
    };
    assert_eq!(v.encode()[0], 4);
    assert_eq!(DeadValue::decode(&v.encode()).unwrap(), v);
    let old = DeadValue {
        sink: String::new(),
        ..v
    };
    assert_eq!(old.encode()[0], 3, "unknown sink: written as version 3");
    assert_eq!(DeadValue::decode(&old.encode()).unwrap(), old);
}

#[test]
fn an_envelope_keeps_its_forwarded_headers_and_a_version_1_envelope_still_decodes() {
    let env = Envelope {
        id: "hk_1".into(),
        tenant: Some("acme".into()),
        source: "gh".into(),
        received_at: AtMs(5),
        content_type: "application/json".into(),
        sinks: vec!["a".into()],
        body: b"{}".to_vec(),
        headers: vec![
            ("x-github-event".into(), b"push".to_vec()),
            ("x-github-delivery".into(), b"d-1".to_vec()),
        ],
    };
    assert_eq!(Envelope::decode(&env.encode()).unwrap(), env);
    assert_eq!(env.encode()[0], 2);
    // Without forwarded headers it is written as version 1 (what a release before them
    // reads), and decodes the same.
    let none = Envelope {
        headers: Vec::new(),
        ..env
    };
    let v1 = none.encode();
    assert_eq!(v1[0], 1);
    assert_eq!(Envelope::decode(&v1).unwrap(), none);
    // A version 2 envelope cut inside its headers is an error, not fewer headers.
    let mut cut = Envelope {
        headers: vec![("x-a".into(), b"1".to_vec())],
        ..none
    }
    .encode();
    cut.truncate(cut.len() - 1);
    assert!(Envelope::decode(&cut).is_err());
}

/// The structural guard: only `queue::deliveries` (the `ankusa-keyspace` crate defines
/// them) may call the constructors of the queue's index keys.
#[test]
fn only_deliveries_builds_queue_index_keys() {
    const CONSTRUCTORS: [&str; 12] = [
        "ankusa_keyspace::due(",
        "ankusa_keyspace::due_range(",
        "ankusa_keyspace::due_tenant_range(",
        "ankusa_keyspace::inflight(",
        "ankusa_keyspace::inflight_tenant_range(",
        "ankusa_keyspace::dead(",
        "ankusa_keyspace::dead_range(",
        "ankusa_keyspace::dead_by_tenant(",
        "ankusa_keyspace::dead_tenant_range(",
        "ankusa_keyspace::active(",
        "ankusa_keyspace::active_through(",
        "ankusa_keyspace::archive(",
    ];
    // This crate, and every other crate's sources in the workspace that could reach it.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let relay = root.join("../relay");
    let allowed = [
        root.join("src/deliveries.rs"),
        root.join("src/deliveries/tx.rs"),
        root.join("src/deliveries/transitions.rs"),
        root.join("src/deliveries/reads.rs"),
        root.join("src/deliveries/maintenance.rs"),
        root.join("src/deliveries/handoff.rs"),
        root.join("src/deliveries/tests.rs"),
        // Writes format-2 stores only (fixtures and upgrade tests): `?x` and `?a` keys are
        // the same bytes in both formats, with format-2 values.
        root.join("src/formats/legacy/v2.rs"),
    ];
    let mut offenders = Vec::new();
    let mut stack = vec![
        root.join("src"),
        relay.join("src"),
        relay.join("tests"),
        relay.join("benches"),
        root.join("../store/src"),
    ];
    let mut files = 0;
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                files += 1;
                if allowed.contains(&p) {
                    continue;
                }
                let text = std::fs::read_to_string(&p).unwrap();
                for c in CONSTRUCTORS {
                    // `use ...::keys::{due, ...}` imports would dodge the prefix; refuse them too.
                    let bare = c
                        .trim_start_matches("ankusa_keyspace::")
                        .trim_end_matches('(');
                    let imported = text.lines().any(|l| {
                        l.trim_start().starts_with("use ")
                            && l.contains("ankusa_keyspace::")
                            && l.contains(&format!(" {bare},"))
                    });
                    if text.contains(c) || imported {
                        offenders.push(format!("{} uses {c}", p.display()));
                    }
                }
            }
        }
    }
    assert!(files > 10, "the scan found too few sources ({files})");
    assert!(
        offenders.is_empty(),
        "queue index keys built outside queue::deliveries: {offenders:#?}"
    );
}

#[test]
fn the_tenant_sample_counts_distinct_tenants_within_a_marker_bound() {
    let mut h = Harness::new();
    let now = 1_000_000u64;
    // "busy" has a marker in each of 50 seconds before "quiet"'s one.
    for s in 0..50 {
        h.ingest(Some("busy"), 1, now - 100_000 + s * 1_000, false);
    }
    h.ingest(Some("quiet"), 1, now - 10_000, false);
    // Counted in markers, a sample of 10 sees only "busy".
    let by_markers = active_tenants(&h.store, AtMs(now), 10).unwrap();
    assert_eq!(by_markers.len(), 1);
    assert_eq!(by_markers[0].buckets.len(), 10);
    // Counted in tenants, a sample of 2 sees both, with every marker of each.
    let distinct = active_tenants_distinct(&h.store, AtMs(now), 2, 1_000).unwrap();
    let ords: Vec<_> = distinct.iter().map(|t| t.ord).collect();
    assert_eq!(ords, vec![h.ord("busy"), h.ord("quiet")]);
    assert_eq!(distinct[0].buckets.len(), 50);
    // A sample of one tenant stops at the second tenant's first marker.
    assert_eq!(
        active_tenants_distinct(&h.store, AtMs(now), 1, 1_000)
            .unwrap()
            .len(),
        1
    );
    // The marker bound still holds.
    assert_eq!(
        active_tenants_distinct(&h.store, AtMs(now), 2, 20)
            .unwrap()
            .len(),
        1
    );
}

/// Every node counter of every tenant is non-negative.
fn assert_no_negative_counter(h: &Harness, tenants: &[&str]) {
    for t in tenants {
        let c = counters::read(&h.store, h.ord(t)).unwrap();
        assert!(
            c.pending >= 0 && c.scheduled >= 0 && c.inflight >= 0 && c.dead >= 0 && c.bytes >= 0,
            "{t}: {c:?}"
        );
    }
}

/// Four replays of the whole DLQ and two purges of one tenant, all at once from their own
/// threads: every dead row leaves the DLQ exactly once between them (revived by one
/// replay, or purged), and the counters equal the fold.
#[test]
fn concurrent_replays_and_purges_move_each_dead_row_once() {
    let mut h = Harness::new();
    let now = 1_000_000u64;
    let tenants = ["a", "b", "c"];
    for i in 0..300u64 {
        h.ingest(Some(tenants[(i % 3) as usize]), 1, now - 60_000 + i, false);
    }
    // Everything dead-lettered.
    let due = h.due_rows();
    h.commit(|tx| {
        for r in &due {
            let inflight = claim(tx, r);
            dead_letter(tx, &inflight, AtMs(now), "src", "hk", "s", None);
        }
    });
    assert_eq!(h.dead_rows().len(), 300);
    let store = &h.store;
    let purge_ord = h.ord("a");
    let (revived, purged) = std::thread::scope(|s| {
        let replays: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(move || {
                    let rows = dead_page(store, None, 1_000).unwrap().rows;
                    let mut n = 0;
                    for chunk in rows.chunks(37) {
                        let mut tx = Tx::new();
                        for r in chunk {
                            revive(&mut tx, r, AtMs(now));
                        }
                        n += tx.commit(store, false).unwrap().count();
                    }
                    n
                })
            })
            .collect();
        let purges: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(move || {
                    purge_tenant(
                        store,
                        purge_ord,
                        PurgeKinds {
                            pending: true,
                            dead: true,
                        },
                    )
                    .unwrap()
                })
            })
            .collect();
        let revived: u64 = replays.into_iter().map(|t| t.join().unwrap()).sum();
        let purged: Vec<PurgeReport> = purges.into_iter().map(|t| t.join().unwrap()).collect();
        (revived, purged)
    });
    let purged_dead: u64 = purged.iter().map(|p| p.dead).sum();
    assert_eq!(
        revived + purged_dead,
        300,
        "revived {revived}, purged dead {purged_dead}"
    );
    assert!(h.dead_rows().is_empty());
    // Revived rows of "a" may have been purged as due rows: each row is in exactly one
    // place, or gone with its purge counted.
    let purged_due: u64 = purged.iter().map(|p| p.due).sum();
    assert_eq!(h.due_rows().len() as u64 + purged_due + purged_dead, 300);
    h.assert_counters_equal_fold();
    assert_no_negative_counter(&h, &tenants);
}

/// A purge racing the claims of the same due rows: each row is claimed or purged, never
/// both, and the counters equal the fold.
#[test]
fn a_purge_racing_claims_removes_each_row_once() {
    let mut h = Harness::new();
    let now = 1_000_000u64;
    for i in 0..400u64 {
        h.ingest(Some("t"), 1, now - 60_000 + i, false);
    }
    let rows = h.due_rows();
    let store = &h.store;
    let ord = h.ord("t");
    let (claimed, purged) = std::thread::scope(|s| {
        let claimer = s.spawn(move || {
            let mut moved = Vec::new();
            for chunk in rows.chunks(16) {
                let mut tx = Tx::new();
                let inflight: Vec<InflightRow> = chunk.iter().map(|r| claim(&mut tx, r)).collect();
                let c = tx.commit(store, false).unwrap();
                moved.extend(
                    inflight
                        .into_iter()
                        .zip(c.moved)
                        .filter_map(|(r, m)| m.then_some(r)),
                );
            }
            moved
        });
        let purger = s.spawn(move || {
            purge_tenant(
                store,
                ord,
                PurgeKinds {
                    pending: true,
                    dead: false,
                },
            )
            .unwrap()
        });
        (claimer.join().unwrap(), purger.join().unwrap())
    });
    assert_eq!(
        claimed.len() as u64 + purged.due,
        400,
        "claimed {}, purged {}",
        claimed.len(),
        purged.due
    );
    let inflight = h.inflight_rows();
    assert_eq!(
        inflight.len(),
        claimed.len(),
        "every claimed row is inflight"
    );
    assert!(h.due_rows().is_empty());
    // Delivering every claimed row leaves nothing and counters at the fold.
    h.commit(|tx| {
        for r in &inflight {
            delivered(tx, r);
        }
    });
    h.assert_counters_equal_fold();
    assert_no_negative_counter(&h, &["t"]);
}

/// The state a crash can leave between the marker cleanup's delete and its restore: due
/// rows whose marker is gone. The boot repair puts back exactly the missing markers.
#[test]
fn boot_repair_restores_the_markers_a_crash_lost() {
    let mut h = Harness::new();
    let now = 1_000_000u64;
    h.ingest(Some("a"), 1, now - 5_000, false);
    h.ingest(Some("a"), 1, now - 5_000, false);
    h.ingest(Some("a"), 1, now - 3_000, false);
    h.ingest(Some("b"), 1, now - 5_000, false);
    let lost = [
        (Bucket(now / 1000 - 5), h.ord("a")),
        (Bucket(now / 1000 - 5), h.ord("b")),
    ];
    h.store
        .write(
            lost.iter()
                .map(|(b, o)| Op::delete(Cf::Index, ankusa_keyspace::active(*b, *o)))
                .collect(),
            false,
        )
        .unwrap();
    assert_eq!(h.markers().len(), 1);
    assert_eq!(repair_markers(&h.store).unwrap(), 2);
    h.assert_every_due_row_has_its_marker();
    assert_eq!(h.markers().len(), 3);
    // Nothing to do the second time.
    assert_eq!(repair_markers(&h.store).unwrap(), 0);
    let active = active_tenants(&h.store, AtMs(now), 4096).unwrap();
    assert_eq!(active.len(), 2);
}

/// A paused tenant's markers, taken out as dispatch meets them, come back one per second
/// of its due rows when it is resumed; the boot repair leaves a paused tenant's alone.
#[test]
fn a_resumed_tenant_gets_a_marker_for_every_second_of_its_due_rows() {
    let mut h = Harness::new();
    let now = 1_000_000u64;
    for at in [now - 5_000, now - 5_000, now - 3_000, now - 1_000] {
        h.ingest(Some("a"), 1, at, false);
    }
    h.ingest(Some("b"), 1, now - 5_000, false);
    let a = h.ord("a");
    let mine: Vec<Bucket> = h
        .markers()
        .into_iter()
        .filter(|(_, o)| *o == a)
        .map(|(b, _)| b)
        .collect();
    assert_eq!(mine.len(), 3);
    // Paused: dispatch took them out, and the boot repair does not put them back.
    drop_markers(&h.store, a, &mine).unwrap();
    assert_eq!(repair_markers_except(&h.store, |o| o == a).unwrap(), 0);
    assert!(h.markers().iter().all(|(_, o)| *o != a));
    // Resumed: every second of its rows has its marker again, and only those.
    assert_eq!(restore_tenant_markers(&h.store, a).unwrap(), 3);
    h.assert_every_due_row_has_its_marker();
    assert_eq!(h.markers().len(), 4);
    let active = active_tenants(&h.store, AtMs(now), 4096).unwrap();
    assert_eq!(active.len(), 2);
    // The pause's key reads back.
    let at = AtMs(now - 2_000);
    h.store
        .write(vec![crate::tenants::pause_op(a, at).0], true)
        .unwrap();
    assert_eq!(crate::tenants::paused(&h.store).unwrap(), vec![(a, at)]);
    h.store
        .write(vec![crate::tenants::resume_op(a).0], true)
        .unwrap();
    assert!(crate::tenants::paused(&h.store).unwrap().is_empty());
}

/// An operation a task of the node makes on the queue, as the model-based concurrent test
/// issues it: each reads the rows as they are when it runs, then commits.
#[derive(Debug, Clone)]
enum Task {
    /// The writer: a hook for a tenant with 1..3 sinks.
    Ingest { tenant: usize, sinks: usize },
    /// The pipeline claims up to n due rows (one batch).
    Claim(usize),
    /// Outcomes of up to n inflight rows (one batch): 0 delivered, 1 retry, 2 dead-letter.
    Outcome(usize, u8),
    /// A replay of every dead row, in chunks (`POST /v1/dlq/replay {from_ms: 0}`).
    ReplayAll,
    /// A replay of one tenant's dead rows.
    ReplayTenant(usize),
    /// A replay of the i-th dead row alone (`{ids: [..]}`).
    ReplayOne(usize),
    /// `DELETE /v1/tenants/{t}/queue?kinds=…`.
    Purge {
        tenant: usize,
        pending: bool,
        dead: bool,
    },
    /// Boot recovery of inflight rows.
    Recover,
    /// A reclaim pass (hooks nothing needs).
    Reclaim,
}

fn task() -> impl Strategy<Value = Task> {
    prop_oneof![
        3 => (0..3usize, 1..3usize).prop_map(|(tenant, sinks)| Task::Ingest { tenant, sinks }),
        4 => (1..40usize).prop_map(Task::Claim),
        4 => (1..40usize, 0..3u8).prop_map(|(n, k)| Task::Outcome(n, k)),
        1 => Just(Task::ReplayAll),
        1 => (0..3usize).prop_map(Task::ReplayTenant),
        1 => any::<usize>().prop_map(Task::ReplayOne),
        1 => (0..3usize, any::<bool>(), any::<bool>())
            .prop_map(|(tenant, pending, dead)| Task::Purge { tenant, pending, dead }),
        1 => Just(Task::Recover),
        1 => Just(Task::Reclaim),
    ]
}

/// Rows each kind of move moved, summed over every thread of a schedule: what the store
/// must add up to afterwards if every row made one transition per move that owned it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Moves {
    ingested: u64,
    claimed: u64,
    delivered: u64,
    retried: u64,
    dead_lettered: u64,
    revived: u64,
    purged_due: u64,
    purged_dead: u64,
    recovered: u64,
}

impl std::ops::AddAssign for Moves {
    fn add_assign(&mut self, o: Moves) {
        self.ingested += o.ingested;
        self.claimed += o.claimed;
        self.delivered += o.delivered;
        self.retried += o.retried;
        self.dead_lettered += o.dead_lettered;
        self.revived += o.revived;
        self.purged_due += o.purged_due;
        self.purged_dead += o.purged_dead;
        self.recovered += o.recovered;
    }
}

const MODEL_TENANTS: [&str; 3] = ["m0", "m1", "m2"];
const MODEL_NOW: u64 = 1_000_000;

fn revive_all(store: &Store, rows: &[DeadRow]) -> u64 {
    let mut n = 0;
    for chunk in rows.chunks(13) {
        let mut tx = Tx::new();
        for r in chunk {
            revive(&mut tx, r, AtMs(MODEL_NOW));
        }
        n += tx.commit(store, false).unwrap().count();
    }
    n
}

/// Runs one thread's tasks; returns what they moved.
fn run_tasks(store: &Store, asm: Option<&mut Assembler>, tasks: &[Task], seed: u64) -> Moves {
    let mut m = Moves::default();
    let mut asm = asm;
    let mut n = seed * 1_000_000;
    for t in tasks {
        match t {
            Task::Ingest { tenant, sinks } => {
                // Only the writer thread ingests (as on a node); elsewhere it is a no-op.
                if let Some(asm) = asm.as_deref_mut() {
                    n += 1;
                    let env = Harness::envelope(
                        Some(MODEL_TENANTS[*tenant]),
                        *sinks,
                        MODEL_NOW - 10_000 + n % 5_000,
                        n,
                    );
                    let batch = asm.assemble(store, &[env], false).unwrap();
                    asm.commit(store, batch, false).unwrap();
                    m.ingested += *sinks as u64;
                }
            }
            Task::Claim(k) => {
                let rows = crate::testkit::due_rows(store);
                let mut tx = Tx::new();
                for r in rows.iter().take(*k) {
                    claim(&mut tx, r);
                }
                m.claimed += tx.commit(store, false).unwrap().count();
            }
            Task::Outcome(k, kind) => {
                let rows = crate::testkit::inflight_rows(store);
                let mut tx = Tx::new();
                for r in rows.iter().take(*k) {
                    match kind {
                        0 => delivered(&mut tx, r),
                        1 => retry(
                            &mut tx,
                            r,
                            AtMs(MODEL_NOW - 1),
                            &DeliveryRow {
                                ord: r.key.ord,
                                size: r.size,
                                attempts: 1,
                                ..DeliveryRow::default()
                            },
                        ),
                        _ => {
                            dead_letter(&mut tx, r, AtMs(MODEL_NOW), "src", "hk", "s", None);
                        }
                    }
                }
                let moved = tx.commit(store, false).unwrap().count();
                match kind {
                    0 => m.delivered += moved,
                    1 => m.retried += moved,
                    _ => m.dead_lettered += moved,
                }
            }
            Task::ReplayAll => {
                m.revived += revive_all(store, &crate::testkit::dead_rows(store));
            }
            Task::ReplayTenant(t) => {
                let Some(ord) = crate::tenants::ord(store, MODEL_TENANTS[*t]).unwrap() else {
                    continue;
                };
                let rows = dead_page_for_tenant(store, ord, None, usize::MAX)
                    .unwrap()
                    .rows;
                m.revived += revive_all(store, &rows);
            }
            Task::ReplayOne(i) => {
                if let Some(r) = pick(&crate::testkit::dead_rows(store), *i) {
                    m.revived += revive_all(store, &[r]);
                }
            }
            Task::Purge {
                tenant,
                pending,
                dead,
            } => {
                let Some(ord) = crate::tenants::ord(store, MODEL_TENANTS[*tenant]).unwrap() else {
                    continue;
                };
                let p = purge_tenant(
                    store,
                    ord,
                    PurgeKinds {
                        pending: *pending,
                        dead: *dead,
                    },
                )
                .unwrap();
                m.purged_due += p.due;
                m.purged_dead += p.dead;
            }
            Task::Recover => {
                let rows = crate::testkit::inflight_rows(store);
                let mut tx = Tx::new();
                for r in &rows {
                    recover(&mut tx, r, AtMs(MODEL_NOW - 1));
                }
                m.recovered += tx.commit(store, false).unwrap().count();
            }
            Task::Reclaim => {
                crate::reclaim::reclaim_pass(store, 1_000).unwrap();
            }
        }
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// Schedules of the node's tasks issued from four threads at once against a real
    /// store (a writer ingesting; the others claiming, committing outcomes, replaying by
    /// range, tenant and id, purging, recovering, reclaiming). Afterwards the counters
    /// equal a fold of the families, none is negative, and the rows add up to what each
    /// move reported it moved: a row moved twice (or a move counted for a row another
    /// took first) breaks the sums.
    #[test]
    fn concurrent_tasks_keep_counters_exact_and_move_each_row_once(
        seed_hooks in 20usize..120,
        schedules in prop::collection::vec(prop::collection::vec(task(), 1..25), 4),
    ) {
        let mut h = Harness::new();
        let mut start = Moves::default();
        for i in 0..seed_hooks {
            h.ingest(Some(MODEL_TENANTS[i % 3]), 1 + i % 2, MODEL_NOW - 20_000 + i as u64, false);
            start.ingested += 1 + (i % 2) as u64;
        }
        let Harness { store, asm, .. } = &mut h;
        let store: &Store = store;
        let moves = std::thread::scope(|s| {
            let (writer_tasks, others) = schedules.split_first().unwrap();
            let writer = s.spawn(move || run_tasks(store, Some(asm), writer_tasks, 1));
            let workers: Vec<_> = others
                .iter()
                .enumerate()
                .map(|(i, tasks)| s.spawn(move || run_tasks(store, None, tasks, 2 + i as u64)))
                .collect();
            let mut total = writer.join().unwrap();
            for w in workers {
                total += w.join().unwrap();
            }
            total
        });
        let mut m = start;
        m += moves;
        h.assert_counters_equal_fold();
        let c = counters::node(&h.store).unwrap();
        prop_assert!(
            c.pending >= 0 && c.scheduled >= 0 && c.inflight >= 0 && c.dead >= 0 && c.bytes >= 0,
            "{c:?}"
        );
        for t in MODEL_TENANTS {
            if let Some(ord) = crate::tenants::ord(&h.store, t).unwrap() {
                let tc = counters::read(&h.store, ord).unwrap();
                prop_assert!(
                    tc.pending >= 0 && tc.scheduled >= 0 && tc.inflight >= 0 && tc.dead >= 0 && tc.bytes >= 0,
                    "{t}: {tc:?}"
                );
            }
        }
        let (due, inflight, dead) = (
            h.due_rows().len() as u64,
            h.inflight_rows().len() as u64,
            h.dead_rows().len() as u64,
        );
        prop_assert_eq!(
            inflight,
            m.claimed - m.delivered - m.retried - m.dead_lettered - m.recovered,
            "inflight rows against the moves {:?}", m
        );
        prop_assert_eq!(dead, m.dead_lettered - m.revived - m.purged_dead, "dead rows against {:?}", m);
        prop_assert_eq!(
            due + inflight + dead,
            m.ingested - m.delivered - m.purged_due - m.purged_dead,
            "rows against {:?}", m
        );
        h.assert_every_due_row_has_its_marker();
    }
}

#[test]
fn pending_for_source_counts_its_hooks_rows_and_reads_one_tenant_when_fixed() {
    let mut h = Harness::new();
    let mut n = 0;
    let mut add = |h: &mut Harness, tenant: &str, source: &str, sinks: usize| {
        n += 1;
        let mut env = Harness::envelope(Some(tenant), sinks, 1_000, n);
        env.source = source.into();
        let batch = h.asm.assemble(&h.store, &[env], false).unwrap();
        h.asm.commit(&h.store, batch, false).unwrap();
    };
    for _ in 0..3 {
        add(&mut h, "t1", "gh", 2);
    }
    add(&mut h, "t1", "shared", 1);
    add(&mut h, "t2", "shared", 1);
    add(&mut h, "t2", "shared", 1);
    let first = h.due_rows()[0];
    h.commit(|tx| {
        claim(tx, &first);
    });
    let o1 = h.ord("t1");
    let gh = pending_for_source(&h.store, "gh", Some(o1), 1_000).unwrap();
    assert_eq!(
        (gh.pending, gh.scheduled, gh.inflight, gh.exact),
        (5, 0, 1, true)
    );
    assert_eq!(
        gh.bytes,
        h.due_rows()
            .iter()
            .filter(|r| r.key.ord == o1 && r.key.seq.0 <= 3)
            .map(|r| r.size as i64)
            .sum::<i64>()
            + first.size as i64
    );
    assert_eq!(gh.rows_read, 7, "only t1's rows are read");
    let shared = pending_for_source(&h.store, "shared", None, 1_000).unwrap();
    assert_eq!(
        (shared.pending, shared.inflight, shared.rows_read),
        (3, 0, 9)
    );
    let cut = pending_for_source(&h.store, "shared", None, 4).unwrap();
    assert_eq!((cut.rows_read, cut.exact), (4, false));
    assert_eq!(
        pending_for_source(&h.store, "nobody", None, 1_000)
            .unwrap()
            .pending,
        0
    );
}

#[test]
fn a_hook_seq_is_never_handed_out_twice_even_after_reclaim_removed_the_newest_hooks() {
    let mut h = Harness::new();
    let last = (0..5)
        .map(|_| h.ingest(Some("a"), 0, 1, false))
        .last()
        .unwrap();
    // Reclaim removed every hook (nothing else keeps them here).
    let ops = (1..=last.0)
        .map(|s| Op::delete(Cf::Hooks, ankusa_keyspace::hook(Seq(s))))
        .collect();
    h.store.write(ops, false).unwrap();
    h.asm = Assembler::open(&h.store, 1_000_000).unwrap();
    assert_eq!(h.ingest(Some("a"), 0, 1, false), Seq(last.0 + 1));
    // A store from before `m:next_seq`: the hook log's newest record counts too.
    let mut h = Harness::new();
    h.asm = Assembler::open(&h.store, 1_000_000).unwrap().logging(true);
    let last = (0..3).map(|_| h.ingest(None, 0, 1, false)).last().unwrap();
    let mut ops: Vec<Op> = (1..=last.0)
        .map(|s| Op::delete(Cf::Hooks, ankusa_keyspace::hook(Seq(s))))
        .collect();
    ops.push(Op::delete(
        Cf::Default,
        ankusa_keyspace::META_NEXT_SEQ.to_vec(),
    ));
    h.store.write(ops, false).unwrap();
    h.asm = Assembler::open(&h.store, 1_000_000).unwrap();
    assert_eq!(h.ingest(None, 0, 1, false), Seq(last.0 + 1));
}

/// The outcome of a delivered row takes its hook along when nothing else needs it (one
/// sink, no archive obligation) and leaves no `?c` marker; a hook with another row or an
/// obligation keeps the marker path, and reclaim removes it once the last need is gone.
#[test]
fn a_delivered_last_row_takes_its_hook_and_leaves_no_marker() {
    let mut h = Harness::new();
    let single = h.ingest(Some("acme"), 1, 10, false);
    let pair = h.ingest(Some("acme"), 2, 10, false);
    let archived = h.ingest(Some("acme"), 1, 10, true);
    let rows = h.due_rows();
    h.commit(|tx| {
        for r in &rows {
            claim(tx, r);
        }
    });
    let hook = |seq: Seq| {
        h.store
            .get(Cf::Hooks, &ankusa_keyspace::hook(seq))
            .unwrap()
            .is_some()
    };
    let cleared = |seq: Seq| {
        h.store
            .get(Cf::Index, &ankusa_keyspace::cleared(seq))
            .unwrap()
            .is_some()
    };
    let deliver = |seq: Seq| -> Vec<bool> {
        h.inflight_rows()
            .iter()
            .filter(|r| r.key.seq == seq)
            .map(|r| {
                let last = last_needs(&h.store, &[(*r, sinks_of(&h.store, seq))]).unwrap()[0];
                h.commit(|tx| delivered_last(tx, r, last));
                last
            })
            .collect()
    };
    assert_eq!(deliver(single), vec![true]);
    assert!(!hook(single) && !cleared(single));
    // The first of two rows sees the second; the second sees only its own.
    assert_eq!(deliver(pair), vec![false, true]);
    assert!(!hook(pair) && cleared(pair));
    assert_eq!(deliver(archived), vec![false]);
    assert!(hook(archived) && cleared(archived));
    h.assert_counters_equal_fold();
    h.assert_every_need_has_its_hook();
    // Reclaim reads the two markers: the pair's hook is already gone, the archived one
    // stays for its obligation.
    let report = crate::reclaim::reclaim_pass(&h.store, 100).unwrap();
    assert_eq!(report.markers, 2);
    assert_eq!(report.hooks_removed, 0);
    assert!(hook(archived));
    assert_eq!(counters::read(&h.store, h.ord("acme")).unwrap().bytes, 0);
}

#[test]
fn a_delivery_started_at_commit_is_inflight_with_no_due_row_or_marker() {
    let mut h = Harness::new();
    // Of three sinks, the first and the third start at the commit; the second is due.
    let (seq, started) = h.ingest_started(Some("acme"), 3, 5_000, false, 0b101);
    let acme = h.ord("acme");
    let sinks: Vec<u16> = started.iter().map(|r| r.key.sink.0).collect();
    assert_eq!(sinks, vec![0, 2]);
    assert_eq!(h.inflight_rows(), started);
    let due: Vec<(Seq, u16)> = h
        .due_rows()
        .iter()
        .map(|r| (r.key.seq, r.key.sink.0))
        .collect();
    assert_eq!(due, vec![(seq, 1)]);
    // One marker, for the due row alone.
    let active = active_tenants(&h.store, AtMs(10_000), 4096).unwrap();
    assert_eq!(active.len(), 1);
    assert_eq!(active[0].ord, acme);
    let c = counters::read(&h.store, acme).unwrap();
    assert_eq!((c.pending, c.inflight), (1, 2), "{c:?}");
    h.assert_counters_equal_fold();
    h.assert_every_need_has_its_hook();
    // Delivered, the started rows take the hook along with the last of them.
    let mut tx = Tx::new();
    claim(&mut tx, &h.due_rows()[0]);
    tx.commit(&h.store, false).unwrap();
    for r in h.inflight_rows() {
        let last = last_needs(&h.store, &[(r, 3)]).unwrap()[0];
        h.commit(|tx| delivered_last(tx, &r, last));
    }
    assert!(h
        .store
        .get(Cf::Hooks, &ankusa_keyspace::hook(seq))
        .unwrap()
        .is_none());
    h.assert_counters_equal_fold();
    // A hook started whole writes no due row and no marker at all.
    let (_, started) = h.ingest_started(Some("globex"), 2, 6_000, false, 0b11);
    assert_eq!(started.len(), 2);
    assert!(h.due_rows().is_empty());
    assert!(active_tenants(&h.store, AtMs(10_000), 4096)
        .unwrap()
        .iter()
        .all(|t| t.ord == acme));
    h.assert_counters_equal_fold();
}

#[test]
fn retry_now_makes_a_scheduled_row_due_once_and_keeps_its_counter() {
    let mut h = Harness::new();
    h.ingest(Some("a"), 1, 1_000, false);
    let a = h.ord("a");
    let r = first_due(&h.store, a).unwrap().unwrap();
    let row = DeliveryRow {
        ord: a,
        size: r.size,
        attempts: 1,
        ..DeliveryRow::default()
    };
    h.commit(|tx| {
        let inflight = claim(tx, &r);
        retry(tx, &inflight, AtMs(600_000), &row);
    });
    // Waiting out its backoff: not due at 2 000, found as scheduled.
    assert!(
        due_for_tenant(&h.store, a, AtMs(2_000), AtMs(0), 10, u64::MAX)
            .unwrap()
            .rows
            .is_empty()
    );
    let waiting = scheduled_for_tenant(&h.store, a, AtMs(2_000), 10).unwrap();
    assert_eq!(waiting.len(), 1);
    assert_eq!(waiting[0].key.at, AtMs(600_000));
    assert!(scheduled_for_tenant(&h.store, a, AtMs(600_000), 10)
        .unwrap()
        .is_empty());
    let before = crate::counters::read(&h.store, a).unwrap();
    assert_eq!(before.scheduled, 1);
    h.commit(|tx| hasten(tx, &waiting[0], AtMs(2_000)));
    let due = due_for_tenant(&h.store, a, AtMs(2_000), AtMs(0), 10, u64::MAX)
        .unwrap()
        .rows;
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].key.at, due[0].kind), (AtMs(2_000), Kind::Retry));
    assert_eq!(crate::counters::read(&h.store, a).unwrap(), before);
    // The same row read before the move is not moved twice.
    let mut tx = Tx::new();
    hasten(&mut tx, &waiting[0], AtMs(3_000));
    assert_eq!(tx.commit(&h.store, false).unwrap().count(), 0);
    h.assert_counters_equal_fold();
}
