//! Handoff between two stores: every delivery in exactly one queue at every step, the
//! counters equal to the fold on both, whatever order the steps, restarts and lost answers
//! come in.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;
use crate::deliveries;
use crate::testkit::Harness;
use crate::writer::{Assembler, Import, ImportReply, Origin};
use ankusa_keyspace::{AtMs, Seq};
use ankusa_records::moved::MovedState;

const TENANT: &str = "moving";
const SENDER: &str = "hooks-2";
const RECEIVER: &str = "hooks-0";

/// Where a delivery stands, as the test compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum At {
    Due,
    Scheduled,
    Inflight,
    Dead,
}

type Places = BTreeMap<(String, u16), At>;

/// Every delivery of the moving tenant in `store`'s queue: (hook id, sink) → where; a
/// delivery found twice in one queue fails the test.
fn queue_of(store: &Store) -> Places {
    let mut out = Places::new();
    let id = |seq: Seq| {
        let env = deliveries::envelope(store, seq)
            .unwrap()
            .expect("a row without its hook");
        (env.tenant_or_default() == TENANT).then_some(env.id)
    };
    let mut put = |k: Option<String>, sink: u16, at: At| {
        if let Some(k) = k {
            assert!(out.insert((k, sink), at).is_none(), "twice in one queue");
        }
    };
    for r in crate::testkit::due_rows(store) {
        let at = if r.kind == deliveries::Kind::Retry {
            At::Scheduled
        } else {
            At::Due
        };
        put(id(r.key.seq), r.key.sink.0, at);
    }
    for r in crate::testkit::inflight_rows(store) {
        put(id(r.key.seq), r.key.sink.0, At::Inflight);
    }
    for r in crate::testkit::dead_rows(store) {
        put(id(r.key.seq), r.key.sink.0, At::Dead);
    }
    out
}

/// The deliveries of the sender's staged batches that the receiver has not imported: in
/// no queue, on their way.
fn in_transit(sender: &Store, receiver: &Store) -> Places {
    let imported = last_imported(receiver, SENDER).unwrap();
    let mut out = Places::new();
    for o in outbox(sender).unwrap() {
        assert_eq!(o.receiver, RECEIVER);
        if o.batch <= imported {
            continue;
        }
        for item in o.items {
            let Moved::Hook(h) = item else { continue };
            let id = ankusa_records::Envelope::decode(&h.envelope).unwrap().id;
            for d in h.deliveries {
                let at = match d.state {
                    MovedState::Due { retry: true, .. } => At::Scheduled,
                    MovedState::Due { .. } | MovedState::Parked { .. } => At::Due,
                    MovedState::Dead { .. } => At::Dead,
                };
                assert!(out.insert((id.clone(), d.sink), at).is_none());
            }
        }
    }
    out
}

/// Imports a batch into `into`'s store through its assembler, as its writer does, with
/// the sync: the writer's answer.
fn import_into(into: &mut Harness, from: Origin, batch: u64, items: Vec<Moved>) -> ImportReply {
    let (reply, _) = tokio::sync::oneshot::channel();
    let imp = Import {
        from,
        batch,
        items,
        reply,
    };
    let (assembled, answer) = into.asm.assemble_import(&into.store, &imp).unwrap();
    if let Some(a) = assembled {
        into.asm.commit(&into.store, a, true).unwrap();
    }
    answer
}

/// Tenant `ord`'s due rows in `store`.
fn due_of(store: &Store, ord: TenantOrd) -> Vec<deliveries::DueRow> {
    crate::testkit::due_rows(store)
        .into_iter()
        .filter(|r| r.key.ord == ord)
        .collect()
}

#[derive(Debug, Clone)]
enum Step {
    /// The sender stages a batch (refused while one waits).
    Stage,
    /// The receiver imports the sender's waiting batch (again, if it had it: a resend after
    /// a lost answer or a restart of the sender).
    Import,
    /// The sender hears the answer and forgets the batch.
    Confirm,
    /// The receiver's process restarts: its writer reads its state from the store again.
    RestartReceiver,
    /// The receiver refuses the waiting batch (its node list says the tenant is not its; it
    /// answers a batch it imported as imported, so only one it has not): the sender takes
    /// it back into its own queue.
    TakeBack,
    /// The sender's process restarts.
    RestartSender,
    /// The sender claims its `n`th due row (a delivery starts there).
    Claim(usize),
    /// The sender's `n`th delivery in flight ends: delivered (0), retried (1), dead (2).
    End(usize, u8),
    /// The receiver delivers its `n`th due row.
    DeliverAtReceiver(usize),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        3 => Just(Step::Stage),
        3 => Just(Step::Import),
        3 => Just(Step::Confirm),
        1 => Just(Step::RestartReceiver),
        2 => Just(Step::TakeBack),
        1 => Just(Step::RestartSender),
        2 => (0usize..64).prop_map(Step::Claim),
        2 => (0usize..64, 0u8..3).prop_map(|(n, k)| Step::End(n, k)),
        1 => (0usize..64).prop_map(Step::DeliverAtReceiver),
    ]
}

struct Pair {
    sender: Harness,
    receiver: Harness,
    /// Every delivery not delivered yet, and where it stands.
    alive: Places,
    /// The ids of the moving tenant's archived copies, each of which is on one node.
    copies: Vec<String>,
}

/// The ids of `tenant`'s archived copies in `store`.
fn archived_ids(store: &Store, tenant: &str) -> Vec<String> {
    let Some(ord) = crate::tenants::ord(store, tenant).unwrap() else {
        return Vec::new();
    };
    crate::archive::page(store, ord, AtMs(0), AtMs(u64::MAX), None, 10_000)
        .unwrap()
        .items
        .into_iter()
        .map(|a| a.envelope.id)
        .collect()
}

/// The ids of the archived copies in the sender's batches the receiver has not imported.
fn copies_in_transit(sender: &Store, receiver: &Store) -> Vec<String> {
    let imported = last_imported(receiver, SENDER).unwrap();
    outbox(sender)
        .unwrap()
        .into_iter()
        .filter(|o| o.batch > imported)
        .flat_map(|o| o.items)
        .filter_map(|m| match m {
            Moved::Archived { envelope, .. } => {
                Some(ankusa_records::Envelope::decode(&envelope).unwrap().id)
            }
            _ => None,
        })
        .collect()
}

impl Pair {
    fn new(hooks: usize) -> Pair {
        let mut sender = Harness::new();
        let mut receiver = Harness::new();
        // With the hook log on, a moved hook's record, id and events move with it.
        sender.asm = Assembler::open(&sender.store, 1_000_000)
            .unwrap()
            .logging(true);
        receiver.asm = Assembler::open(&receiver.store, 1_000_000)
            .unwrap()
            .logging(true);
        let mut alive = Places::new();
        for i in 0..hooks {
            let sinks = 1 + i % 3;
            let seq = sender.ingest(Some(TENANT), sinks, 1_000 + i as u64, i % 4 == 0);
            let id = deliveries::envelope(&sender.store, seq)
                .unwrap()
                .unwrap()
                .id;
            for s in 0..sinks {
                alive.insert((id.clone(), s as u16), At::Due);
            }
            // The receiver has a tenant of its own, and a hook of the moving tenant that
            // came to it after the node list changed.
            receiver.ingest(Some("resident"), 1, 500, false);
        }
        let seq = receiver.ingest(Some(TENANT), 1, 900, false);
        let id = deliveries::envelope(&receiver.store, seq)
            .unwrap()
            .unwrap()
            .id;
        alive.insert((id, 0), At::Due);
        // Both harnesses name hooks hk_1, hk_2, …: the test looks at the moving tenant's
        // hooks only, whose ids differ.
        Pair {
            sender,
            receiver,
            alive,
            copies: Vec::new(),
        }
    }

    /// Hooks of the moving tenant delivered on the sender with an archived copy each; and
    /// the queued hooks' obligations (every fourth) settled into copies too.
    fn add_copies(&mut self) {
        let sender = &mut self.sender;
        for i in 0..3 {
            let seq = sender.ingest(Some(TENANT), 1, 5_000 + i, true);
            let ord = sender.ord(TENANT);
            for r in due_of(&sender.store, ord)
                .into_iter()
                .filter(|r| r.key.seq == seq)
            {
                sender.commit(|tx| {
                    let f = deliveries::claim(tx, &r);
                    deliveries::delivered(tx, &f);
                });
            }
        }
        let far = ankusa_keyspace::now_ms() + 86_400_000;
        crate::archive::Archiver::default()
            .settle(&sender.store, &|_: &str| Some(far), 10_000)
            .unwrap();
        self.copies = archived_ids(&self.sender.store, TENANT);
        self.copies.sort();
    }

    /// A live dedupe key of the moving tenant on the sender (`delivery-1` → `hk_1`).
    fn add_dedupe_key(&mut self) {
        let key = ankusa_keyspace::dedupe(TENANT, b"delivery-1").unwrap();
        let far = ankusa_keyspace::now_ms() + 60_000;
        self.sender
            .commit(|tx| tx.push_op(Op::put(Cf::Index, key, crate::dedupe::value(far, "hk_1"))));
    }

    /// The moving tenant's deliveries in a queue.
    fn moving(&self, store: &Store) -> Places {
        queue_of(store)
    }

    /// Every alive delivery of the moving tenant is in exactly one of: the sender's queue,
    /// the receiver's, the sender's batch the receiver has not imported; where it stood;
    /// and the counters equal the fold on both stores.
    fn check(&self) {
        let a = self.moving(&self.sender.store);
        let b = self.moving(&self.receiver.store);
        let t = in_transit(&self.sender.store, &self.receiver.store);
        let mut all = Places::new();
        for part in [&a, &b, &t] {
            for (k, at) in part {
                assert!(
                    all.insert(k.clone(), *at).is_none(),
                    "{k:?} is in two places: sender {:?}, receiver {:?}, in transit {:?}",
                    a.get(k),
                    b.get(k),
                    t.get(k)
                );
            }
        }
        assert_eq!(all, self.alive, "every alive delivery once, where it stood");
        let mut copies = archived_ids(&self.sender.store, TENANT);
        copies.extend(archived_ids(&self.receiver.store, TENANT));
        copies.extend(copies_in_transit(&self.sender.store, &self.receiver.store));
        copies.sort();
        assert_eq!(copies, self.copies, "every archived copy on one node, once");
        self.sender.assert_counters_equal_fold();
        self.receiver.assert_counters_equal_fold();
        self.sender.assert_every_need_has_its_hook();
        self.receiver.assert_every_need_has_its_hook();
        self.receiver.assert_every_due_row_has_its_marker();
    }

    fn stage(&self) {
        let ord = self.sender.ord(TENANT);
        match stage(&self.sender.store, RECEIVER, ord, TENANT, 0) {
            Ok(_) | Err(QueueError::HandoffStaged { .. }) => {}
            Err(e) => panic!("{e}"),
        }
    }

    fn import(&mut self) -> Option<ImportReply> {
        let o = outbox(&self.sender.store).unwrap().into_iter().next()?;
        Some(import_into(
            &mut self.receiver,
            Origin::Node(SENDER.into()),
            o.batch,
            o.items,
        ))
    }

    /// The sender takes its waiting batch back, through its own writer, if the receiver
    /// has not imported it (it refuses only such a batch): the writer's answer.
    fn take_back(&mut self) -> Option<ImportReply> {
        let o = outbox(&self.sender.store).unwrap().into_iter().next()?;
        if last_imported(&self.receiver.store, SENDER).unwrap() >= o.batch {
            return None;
        }
        let answer = import_into(
            &mut self.sender,
            Origin::TakenBack(o.receiver.clone()),
            o.batch,
            o.items,
        );
        assert!(
            outbox(&self.sender.store).unwrap().is_empty(),
            "a batch taken back leaves the outbox"
        );
        Some(answer)
    }

    fn confirm(&self) {
        if let Some(o) = outbox(&self.sender.store).unwrap().into_iter().next() {
            // Only an answered batch is confirmed.
            if last_imported(&self.receiver.store, SENDER).unwrap() >= o.batch {
                confirm(&self.sender.store, &o.receiver, o.batch).unwrap();
            }
        }
    }

    fn id_of(store: &Store, seq: Seq) -> String {
        deliveries::envelope(store, seq).unwrap().unwrap().id
    }

    fn run(&mut self, s: &Step) {
        match s {
            Step::Stage => self.stage(),
            Step::Import => {
                self.import();
            }
            Step::Confirm => self.confirm(),
            Step::RestartReceiver => {
                self.receiver.asm = Assembler::open(&self.receiver.store, 1_000_000)
                    .unwrap()
                    .logging(true);
            }
            Step::TakeBack => {
                if let Some(answer) = self.take_back() {
                    assert!(matches!(answer, ImportReply::Imported { .. }), "{answer:?}");
                }
            }
            Step::RestartSender => {
                self.sender.asm = Assembler::open(&self.sender.store, 1_000_000)
                    .unwrap()
                    .logging(true);
            }
            Step::Claim(n) => {
                let due = due_of(&self.sender.store, self.sender.ord(TENANT));
                if let Some(row) = due.get(n % due.len().max(1)) {
                    self.sender.commit(|tx| {
                        deliveries::claim(tx, row);
                    });
                    let k = (Self::id_of(&self.sender.store, row.key.seq), row.key.sink.0);
                    self.alive.insert(k, At::Inflight);
                }
            }
            Step::End(n, how) => {
                let rows = self.sender.inflight_rows();
                let Some(row) = rows.get(n % rows.len().max(1)) else {
                    return;
                };
                let k = (Self::id_of(&self.sender.store, row.key.seq), row.key.sink.0);
                match how {
                    0 => {
                        self.sender.commit(|tx| deliveries::delivered(tx, row));
                        self.alive.remove(&k);
                    }
                    1 => {
                        let mut updated = deliveries::delivery_rows(
                            &self.sender.store,
                            &[(row.key.seq, row.key.sink)],
                        )
                        .unwrap()
                        .remove(0)
                        .unwrap();
                        updated.attempts += 1;
                        self.sender.commit(|tx| {
                            deliveries::retry(tx, row, AtMs(5_000), &updated);
                        });
                        self.alive.insert(k, At::Scheduled);
                    }
                    _ => {
                        self.sender.commit(|tx| {
                            deliveries::dead_letter(
                                tx,
                                row,
                                AtMs(6_000),
                                "src",
                                &k.0,
                                "sink0",
                                None,
                            );
                        });
                        self.alive.insert(k, At::Dead);
                    }
                }
            }
            Step::DeliverAtReceiver(n) => {
                let Some(ord) = crate::tenants::ord(&self.receiver.store, TENANT).unwrap() else {
                    return;
                };
                let due = due_of(&self.receiver.store, ord);
                if let Some(row) = due.get(n % due.len().max(1)) {
                    let k = (
                        Self::id_of(&self.receiver.store, row.key.seq),
                        row.key.sink.0,
                    );
                    self.receiver.commit(|tx| {
                        let inflight = deliveries::claim(tx, row);
                        deliveries::delivered(tx, &inflight);
                    });
                    self.alive.remove(&k);
                }
            }
        }
    }

    /// Ends every delivery in flight at the sender (a retry) and moves everything: the
    /// sender holds nothing of the tenant after.
    fn finish(&mut self) {
        for row in self.sender.inflight_rows() {
            self.run(&Step::End(0, 1));
            let _ = row;
        }
        for _ in 0..100 {
            self.stage();
            if outbox(&self.sender.store).unwrap().is_empty() {
                break;
            }
            self.import();
            self.confirm();
            self.check();
        }
        assert!(outbox(&self.sender.store).unwrap().is_empty());
        assert!(self.moving(&self.sender.store).is_empty());
        assert!(archived_ids(&self.sender.store, TENANT).is_empty());
        let ord = self.sender.ord(TENANT);
        let c = crate::counters::read(&self.sender.store, ord).unwrap();
        // Every delivery moved. An archive obligation of a hook delivered here before it
        // could move stays, for this node's archiver to settle.
        assert_eq!((c.pending, c.scheduled, c.inflight, c.dead), (0, 0, 0, 0));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    /// Any sequence of stages, imports (repeated), confirms, receiver restarts and the
    /// sender's own deliveries meanwhile: every delivery is in exactly one queue (or on its
    /// way in a batch not imported yet) after every step, where it stood, every archived
    /// copy on exactly one node (or on its way), and the counters equal the fold on both
    /// stores; at the end the sender holds nothing of the tenant.
    #[test]
    fn handoff_keeps_every_row_in_exactly_one_queue(
        hooks in 1usize..40,
        steps in proptest::collection::vec(step(), 1..40),
    ) {
        let mut pair = Pair::new(hooks);
        pair.add_copies();
        pair.check();
        for s in &steps {
            pair.run(s);
            pair.check();
        }
        pair.finish();
        pair.check();
    }
}

#[test]
fn a_batch_imported_twice_is_written_once_and_dedupe_keys_move() {
    let mut pair = Pair::new(3);
    let ord = pair.sender.ord(TENANT);
    pair.add_dedupe_key();
    let staged = stage(&pair.sender.store, RECEIVER, ord, TENANT, 0)
        .unwrap()
        .unwrap();
    assert_eq!(staged.hooks(), 3);
    assert_eq!(staged.items.len(), 4);
    assert!(matches!(
        stage(&pair.sender.store, RECEIVER, ord, TENANT, 0),
        Err(QueueError::HandoffStaged { .. })
    ));
    assert_eq!(
        pair.import(),
        Some(ImportReply::Imported {
            hooks: 3,
            dedupe: 1,
            archived: 0,
            records: 0,
            endpoints: 0
        })
    );
    pair.check();
    // The answer was lost; the sender sends the batch again.
    assert_eq!(pair.import(), Some(ImportReply::Already));
    pair.check();
    pair.confirm();
    assert!(outbox(&pair.sender.store).unwrap().is_empty());
    assert_eq!(
        crate::dedupe::first_hook_of(&pair.receiver.store, TENANT, b"delivery-1").unwrap(),
        Some("hk_1".into())
    );
    assert_eq!(
        crate::dedupe::first_hook_of(&pair.sender.store, TENANT, b"delivery-1").unwrap(),
        None
    );
    pair.check();
}

/// A batch its receiver refuses (a roll: its list says the tenant is not its) comes back
/// into the sender's queue, counted, with its dedupe keys, hook log records and dedupe
/// window; taking it back twice writes once; the next batch for that receiver takes the
/// next number, which the receiver imports.
#[test]
fn a_refused_batch_is_taken_back_counted_once_and_moves_again_later() {
    let mut pair = Pair::new(6);
    pair.add_copies();
    let ord = pair.sender.ord(TENANT);
    pair.add_dedupe_key();
    let before = crate::counters::read(&pair.sender.store, ord).unwrap();
    let staged = stage(&pair.sender.store, RECEIVER, ord, TENANT, 0)
        .unwrap()
        .unwrap();
    assert!(staged.hooks() > 0);
    let during = crate::counters::read(&pair.sender.store, ord).unwrap();
    assert!(
        held_of(&during) < held_of(&before),
        "staged rows leave the counts"
    );
    pair.check();
    let answer = pair.take_back().unwrap();
    assert!(
        matches!(answer, ImportReply::Imported { hooks, .. } if hooks == staged.hooks() as u64)
    );
    pair.check();
    let after = crate::counters::read(&pair.sender.store, ord).unwrap();
    assert_eq!(held_of(&after), held_of(&before), "every row counted again");
    assert_eq!(
        crate::dedupe::first_hook_of(&pair.sender.store, TENANT, b"delivery-1").unwrap(),
        Some("hk_1".into()),
        "the dedupe key is back"
    );
    // A second take-back of the same batch (its answer lost) writes nothing.
    let answer = import_into(
        &mut pair.sender,
        Origin::TakenBack(RECEIVER.into()),
        staged.batch,
        staged.items.clone(),
    );
    assert_eq!(answer, ImportReply::Already);
    pair.check();
    // Later (the lists agree again) the rows move under the next batch number.
    let next = stage(&pair.sender.store, RECEIVER, ord, TENANT, 0)
        .unwrap()
        .unwrap();
    assert_eq!(next.batch, staged.batch + 1);
    assert!(matches!(pair.import(), Some(ImportReply::Imported { .. })));
    pair.confirm();
    pair.check();
    pair.finish();
    pair.check();
}

fn held_of(c: &crate::counters::Counters) -> i64 {
    c.pending + c.scheduled + c.inflight + c.dead + c.archive_pending
}

#[test]
fn a_hook_with_a_delivery_in_flight_waits_for_its_attempt() {
    let mut pair = Pair::new(2);
    pair.run(&Step::Claim(0));
    let ord = pair.sender.ord(TENANT);
    let staged = stage(&pair.sender.store, RECEIVER, ord, TENANT, 0)
        .unwrap()
        .unwrap();
    assert_eq!(
        staged.hooks(),
        1,
        "only the hook with nothing in flight moves"
    );
    pair.import();
    pair.confirm();
    pair.check();
    pair.run(&Step::End(0, 2));
    pair.finish();
    pair.check();
}

/// A store holding rows whose hook is gone at seqs past every hook (a format-2 store's
/// orphans): a hook imported (or ingested) after a restart never takes their seq, so its
/// rows never overwrite theirs and the counters keep equal to the fold.
#[test]
fn an_import_never_takes_the_seq_of_an_orphan_row() {
    let mut pair = Pair::new(4);
    // An orphan on the receiver, newest of its rows: a hook of its own tenant, archived,
    // whose envelope and log record are gone (as a format-2 store's lost hooks), in a store
    // with no `m:next_seq` (written before it).
    let orphan = pair.receiver.ingest(Some("resident"), 1, 500, true);
    let resident = pair.receiver.ord("resident");
    pair.receiver.commit(|tx| {
        tx.push_op(Op::delete(Cf::Hooks, ankusa_keyspace::hook(orphan)));
        tx.push_op(Op::delete(Cf::Audit, ankusa_keyspace::hook_log(orphan)));
        tx.push_op(Op::delete(
            Cf::Default,
            ankusa_keyspace::META_NEXT_SEQ.to_vec(),
        ));
    });
    pair.receiver.asm = Assembler::open(&pair.receiver.store, 1_000_000)
        .unwrap()
        .logging(true);
    let ord = pair.sender.ord(TENANT);
    stage(&pair.sender.store, RECEIVER, ord, TENANT, 0).unwrap();
    pair.import();
    // No imported hook took the orphan's seq: its rows are as they were.
    assert!(deliveries::envelope(&pair.receiver.store, orphan)
        .unwrap()
        .is_none());
    let rows = deliveries::delivery_rows(
        &pair.receiver.store,
        &[(orphan, ankusa_keyspace::SinkIdx(0))],
    )
    .unwrap();
    assert_eq!(rows[0].as_ref().map(|r| r.ord), Some(resident));
    assert!(deliveries::has_archive_obligation(&pair.receiver.store, orphan).unwrap());
    pair.receiver.assert_counters_equal_fold();
}

/// Rows whose hook the sender lost (a dead letter, a retry due hours later, a first
/// attempt) are undeliverable anywhere: a stage drops them, counted, instead of leaving
/// them to hold the tenant on a leaving node for good (no dispatcher ever meets a dead
/// row). The hooks that are whole move as before, in the same write.
#[test]
fn a_stage_drops_the_rows_whose_hook_is_gone_and_the_tenant_drains() {
    let mut pair = Pair::new(6);
    let ord = pair.sender.ord(TENANT);
    let store = &pair.sender.store;
    let due = due_of(store, ord);
    // Three hooks of one sink each (i % 3 == 0: hooks 0 and 3; hook 1 has two sinks).
    let one_sink: Vec<_> = due
        .iter()
        .filter(|r| r.key.sink.0 == 0)
        .take(3)
        .cloned()
        .collect();
    let (dead, later, first) = (&one_sink[0], &one_sink[1], &one_sink[2]);
    pair.sender.commit(|tx| {
        let inflight = deliveries::claim(tx, dead);
        deliveries::dead_letter(tx, &inflight, AtMs(6_000), "src", "gone", "sink0", None);
    });
    pair.sender.commit(|tx| {
        let inflight = deliveries::claim(tx, later);
        let updated = ankusa_records::DeliveryRow {
            ord,
            size: later.size,
            attempts: 3,
            ..Default::default()
        };
        deliveries::retry(tx, &inflight, AtMs(7_200_000), &updated);
    });
    let mut orphans = Vec::new();
    for seq in [dead.key.seq, later.key.seq, first.key.seq] {
        let env = deliveries::envelope(&pair.sender.store, seq)
            .unwrap()
            .unwrap();
        for s in 0..env.sinks.len() as u16 {
            pair.alive.remove(&(env.id.clone(), s));
        }
        orphans.push(seq);
        pair.sender.commit(|tx| {
            tx.push_op(Op::delete(Cf::Hooks, ankusa_keyspace::hook(seq)));
        });
    }
    let before = crate::counters::read(&pair.sender.store, ord).unwrap();
    assert!(before.dead == 1 && before.scheduled >= 1, "{before:?}");
    // Until nothing is staged: the orphans went in the first write; every whole hook moved.
    while stage(&pair.sender.store, RECEIVER, ord, TENANT, 0)
        .unwrap()
        .is_some()
    {
        pair.import();
        pair.confirm();
        pair.check();
    }
    let left = crate::counters::read(&pair.sender.store, ord).unwrap();
    assert_eq!(
        (
            left.pending,
            left.scheduled,
            left.inflight,
            left.dead,
            left.bytes
        ),
        (0, 0, 0, 0, 0),
        "the sender holds nothing of the tenant: {left:?}"
    );
    for seq in orphans {
        let rows =
            deliveries::delivery_rows(&pair.sender.store, &[(seq, ankusa_keyspace::SinkIdx(0))])
                .unwrap();
        assert!(
            rows[0].is_none(),
            "the orphan {seq:?}'s delivery row is gone"
        );
    }
    pair.check();
}

/// Archived copies of delivered hooks still inside their retention move with the tenant
/// (the receiver lists them as its own, under its own seqs, and prunes them when they
/// expire); a copy already past its retention stays for the sender's pruner.
#[test]
fn archived_copies_in_their_retention_move_and_expired_ones_stay() {
    let mut pair = Pair::new(0);
    for i in 0..3 {
        pair.sender.ingest(Some(TENANT), 1, 2_000 + i, true);
    }
    let ord = pair.sender.ord(TENANT);
    for r in due_of(&pair.sender.store, ord) {
        pair.sender.commit(|tx| {
            let f = deliveries::claim(tx, &r);
            deliveries::delivered(tx, &f);
        });
    }
    let far = ankusa_keyspace::now_ms() + 86_400_000;
    let mut archiver = crate::archive::Archiver::default();
    // The first hook archived for 1 ms (long expired), the others for a day.
    let short = |_: &str| Some(1u64);
    let long = |_: &str| Some(far);
    assert_eq!(
        archiver
            .settle(&pair.sender.store, &short, 1)
            .unwrap()
            .archived,
        1
    );
    assert_eq!(
        archiver
            .settle(&pair.sender.store, &long, 10)
            .unwrap()
            .archived,
        2
    );
    pair.copies = archived_ids(&pair.sender.store, TENANT);
    pair.copies.sort();
    let ids = |store: &Store, ord: TenantOrd| -> Vec<String> {
        let mut v: Vec<String> =
            crate::archive::page(store, ord, AtMs(0), AtMs(u64::MAX), None, 100)
                .unwrap()
                .items
                .into_iter()
                .map(|a| a.envelope.id)
                .collect();
        v.sort();
        v
    };
    let before = ids(&pair.sender.store, ord);
    assert_eq!(before.len(), 3);

    let now = ankusa_keyspace::now_ms();
    let batch = stage(&pair.sender.store, RECEIVER, ord, TENANT, now)
        .unwrap()
        .expect("the copies in their retention are staged");
    assert_eq!(batch.items.len(), 2, "{batch:?}");
    assert!(batch
        .items
        .iter()
        .all(|m| matches!(m, Moved::Archived { .. })));
    assert_eq!(
        ids(&pair.sender.store, ord),
        before[..1],
        "the expired copy stays"
    );
    let answer = pair.import();
    assert!(
        matches!(answer, Some(ImportReply::Imported { archived: 2, .. })),
        "{answer:?}"
    );
    pair.confirm();
    pair.check();
    assert!(stage(&pair.sender.store, RECEIVER, ord, TENANT, now)
        .unwrap()
        .is_none());
    let at_receiver = crate::tenants::ord(&pair.receiver.store, TENANT)
        .unwrap()
        .unwrap();
    assert_eq!(ids(&pair.receiver.store, at_receiver), before[1..]);
    // They expire at the receiver as they would have at the sender.
    let mut pruner = crate::archive::Archiver::default();
    let pruned = pruner
        .prune(&pair.receiver.store, AtMs(u64::MAX / 2), 100)
        .unwrap();
    assert_eq!(pruned.expired, 2);
    assert!(ids(&pair.receiver.store, at_receiver).is_empty());
}

/// A leaving node's hook log: the records of hooks it no longer stores move (with their
/// ids and events), so the receiver explains them by id; the record of a hook still
/// stored stays (it moves with its rows).
#[test]
fn log_records_of_delivered_hooks_move_and_the_receiver_explains_them() {
    let mut pair = Pair::new(2);
    let ord = pair.sender.ord(TENANT);
    // One hook delivered (its hook reclaimed: one with no archive obligation), one still
    // queued.
    let row = due_of(&pair.sender.store, ord)
        .into_iter()
        .find(|r| !deliveries::has_archive_obligation(&pair.sender.store, r.key.seq).unwrap())
        .unwrap();
    let id = Pair::id_of(&pair.sender.store, row.key.seq);
    pair.sender.commit(|tx| {
        let f = deliveries::claim(tx, &row);
        deliveries::delivered(tx, &f);
    });
    let delivered_seq = row.key.seq;
    let env = deliveries::envelope(&pair.sender.store, delivered_seq)
        .unwrap()
        .unwrap();
    if env.sinks.len() > 1 {
        // Its other deliveries too.
        for r in due_of(&pair.sender.store, ord)
            .into_iter()
            .filter(|r| r.key.seq == delivered_seq)
        {
            pair.sender.commit(|tx| {
                let f = deliveries::claim(tx, &r);
                deliveries::delivered(tx, &f);
            });
        }
    }
    for s in 0..env.sinks.len() as u16 {
        pair.alive.remove(&(id.clone(), s));
    }
    pair.sender.commit(|tx| {
        tx.push_op(Op::delete(Cf::Hooks, ankusa_keyspace::hook(delivered_seq)));
    });
    let before = crate::hooklog::lookup(&pair.sender.store, &id, false)
        .unwrap()
        .expect("the sender's log explains it");

    let page = crate::hooklog::movable_records(&pair.sender.store, None, 100, 1 << 20).unwrap();
    assert_eq!(page.records.len(), 1, "{page:?}");
    assert_eq!(page.records[0].id, id);
    assert_eq!(page.records[0].tenant, TENANT);
    assert_eq!(
        page.stored, 1,
        "the queued hook's record waits for its rows"
    );
    assert_eq!(page.next, None);
    let batch = stage_records(&pair.sender.store, RECEIVER, &page.records)
        .unwrap()
        .unwrap();
    assert!(crate::hooklog::lookup(&pair.sender.store, &id, false)
        .unwrap()
        .is_none());
    let answer = pair.import();
    assert!(
        matches!(answer, Some(ImportReply::Imported { records: 1, .. })),
        "{answer:?}"
    );
    confirm(&pair.sender.store, RECEIVER, batch.batch).unwrap();
    let after = crate::hooklog::lookup(&pair.receiver.store, &id, false)
        .unwrap()
        .expect("the receiver's log explains it");
    assert_eq!(after.record, before.record);
    assert_eq!(
        after
            .sinks
            .iter()
            .map(|s| (s.state, s.events.len()))
            .collect::<Vec<_>>(),
        before
            .sinks
            .iter()
            .map(|s| (s.state, s.events.len()))
            .collect::<Vec<_>>()
    );
    assert!(
        crate::hooklog::movable_records(&pair.sender.store, None, 100, 1 << 20)
            .unwrap()
            .records
            .is_empty()
    );
    pair.check();
}

/// A tenant's endpoints move with their own batch: gone from the sender with the stage,
/// on the receiver with the import, and back on the sender when the batch is taken back.
#[test]
fn endpoints_move_in_a_batch_of_their_own_and_come_back_when_taken_back() {
    let mut pair = Pair::new(0);
    let eps: Vec<(String, String, Vec<u8>)> = (0..3)
        .map(|i| {
            (
                TENANT.to_owned(),
                format!("ep_{i}"),
                format!("{{\"n\":{i}}}").into_bytes(),
            )
        })
        .collect();
    let ops = eps
        .iter()
        .map(|(t, id, r)| crate::endpoints::op(t, id, Some(r.clone())))
        .collect();
    crate::commit(&pair.sender.store, ops, true).unwrap();
    let of = |s: &Store| crate::endpoints::of_tenant(s, TENANT).unwrap().len();

    stage_endpoints(&pair.sender.store, RECEIVER, &eps)
        .unwrap()
        .unwrap();
    assert_eq!(of(&pair.sender.store), 0, "staged: no longer the sender's");
    assert_eq!(
        pair.take_back(),
        Some(ImportReply::Imported {
            hooks: 0,
            dedupe: 0,
            archived: 0,
            records: 0,
            endpoints: 3
        })
    );
    assert_eq!(of(&pair.sender.store), 3, "taken back: the sender's again");

    let batch = stage_endpoints(&pair.sender.store, RECEIVER, &eps)
        .unwrap()
        .unwrap();
    assert!(matches!(
        pair.import(),
        Some(ImportReply::Imported { endpoints: 3, .. })
    ));
    assert_eq!(pair.import(), Some(ImportReply::Already));
    confirm(&pair.sender.store, RECEIVER, batch.batch).unwrap();
    assert_eq!(of(&pair.sender.store), 0);
    assert_eq!(
        crate::endpoints::of_tenant(&pair.receiver.store, TENANT).unwrap(),
        eps.iter()
            .map(|(_, id, r)| (id.clone(), r.clone()))
            .collect::<Vec<_>>()
    );
}
