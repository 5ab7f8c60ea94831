use super::*;
use crate::counters;
use crate::reclaim::reclaim_pass;
use crate::testkit::Harness;

fn keep(ms: u64) -> impl Fn(&str) -> Option<u64> {
    move |_: &str| Some(ms)
}

fn archive_pending(h: &Harness) -> i64 {
    counters::node(&h.store).unwrap().archive_pending
}

#[test]
fn settling_archives_each_hook_once_and_lets_reclaim_remove_it() {
    let mut h = Harness::new();
    // Hooks with no sink: only the archive obligation keeps them.
    for i in 0..30u64 {
        h.ingest(
            Some(if i % 3 == 0 { "t1" } else { "t2" }),
            0,
            1_000 + i,
            true,
        );
    }
    assert_eq!(archive_pending(&h), 30);
    assert_eq!(reclaim_pass(&h.store, 1_000).unwrap().hooks_removed, 0);
    let mut a = Archiver::default();
    let r = a.settle(&h.store, &keep(60_000), 20).unwrap();
    assert_eq!((r.seen, r.archived, r.dropped), (20, 20, 0));
    let r = a.settle(&h.store, &keep(60_000), 20).unwrap();
    assert_eq!((r.seen, r.archived), (10, 10));
    assert_eq!(a.settle(&h.store, &keep(60_000), 20).unwrap().seen, 0);
    assert_eq!(archive_pending(&h), 0);
    h.assert_counters_equal_fold();
    // Settled: reclaim may remove the hooks now; the archive keeps them whole.
    assert_eq!(reclaim_pass(&h.store, 1_000).unwrap().hooks_removed, 30);
    let t1 = h.ord("t1");
    let p = page(&h.store, t1, AtMs(0), AtMs(u64::MAX), None, 100).unwrap();
    assert_eq!(p.items.len(), 10);
    let received: Vec<u64> = p.items.iter().map(|a| a.key.received.0).collect();
    assert!(received.windows(2).all(|w| w[0] > w[1]), "newest first");
    assert_eq!(p.items[0].envelope.received_at, AtMs(1_027));
    assert_eq!(p.items[0].expires, AtMs(61_027));
    assert_eq!(
        p.items[0].envelope.body,
        Harness::envelope(None, 0, 0, 28).body
    );
    assert!(p.next.is_none());
}

#[test]
fn an_obligation_whose_hook_is_gone_or_whose_source_is_off_is_dropped() {
    let mut h = Harness::new();
    let gone = h.ingest(Some("t"), 0, 1_000, true);
    h.ingest(Some("t"), 0, 1_001, true);
    h.store
        .write(
            vec![Op::delete(Cf::Hooks, ankusa_keyspace::hook(gone))],
            false,
        )
        .unwrap();
    let mut a = Archiver::default();
    let off = |_: &str| None;
    let r = a.settle(&h.store, &off, 10).unwrap();
    assert_eq!((r.archived, r.dropped), (0, 2));
    assert_eq!(archive_pending(&h), 0);
    assert_eq!(
        h.store.scan_family(Family::ArchivedHooks).unwrap().count(),
        0
    );
    h.assert_counters_equal_fold();
}

#[test]
fn a_settle_that_loses_the_race_writes_nothing() {
    let mut h = Harness::new();
    h.ingest(Some("t"), 0, 1_000, true);
    let obs = deliveries::archive_obligations(&h.store, None, 10).unwrap();
    // Another settle of the same obligation got there first.
    h.commit(|tx| deliveries::archive_settle(tx, &obs[0]));
    let mut a = Archiver::default();
    a.settle(&h.store, &keep(1), 10).unwrap();
    assert_eq!(
        h.store.scan_family(Family::ArchivedHooks).unwrap().count(),
        0
    );
    h.assert_counters_equal_fold();
}

#[test]
fn retention_removes_expired_hooks_with_a_cursor_and_keeps_the_sentinels() {
    let mut h = Harness::new();
    for i in 0..50u64 {
        h.ingest(Some("t"), 0, 1_000 + i, true);
    }
    let mut a = Archiver::default();
    // Ten-second retention for the first 50; they expire at 11 000 .. 11 049.
    a.settle(&h.store, &keep(10_000), 100).unwrap();
    assert_eq!(a.prune(&h.store, AtMs(10_999), 100).unwrap().expired, 0);
    assert_eq!(a.prune(&h.store, AtMs(11_019), 15).unwrap().expired, 15);
    assert_eq!(a.prune(&h.store, AtMs(11_019), 15).unwrap().expired, 5);
    let t = h.ord("t");
    let left = page(&h.store, t, AtMs(0), AtMs(u64::MAX), None, 100).unwrap();
    assert_eq!(left.items.len(), 30);
    assert_eq!(left.items.last().unwrap().key.received, AtMs(1_020));
    // A pass with nothing expired reads nothing it deleted before.
    let before = h.store.stats();
    assert_eq!(a.prune(&h.store, AtMs(11_019), 100).unwrap().expired, 0);
    let d = h.store.stats().since(&before);
    assert!(d.scans_of(Family::ArchiveExpiry) <= 1);
    assert_eq!(
        a.prune(&h.store, AtMs(u64::MAX - 1), 100).unwrap().expired,
        30
    );
    for f in Family::ARCHIVE {
        assert_eq!(
            h.store.scan_family(f).unwrap().count(),
            0,
            "{f:?}: the sentinels are intact"
        );
    }
}

#[test]
fn pages_run_newest_first_over_a_time_range() {
    let mut h = Harness::new();
    for i in 0..25u64 {
        h.ingest(Some("t"), 0, 1_000 + i, true);
        h.ingest(Some("other"), 0, 1_000 + i, true);
    }
    Archiver::default()
        .settle(&h.store, &keep(1_000_000), 1_000)
        .unwrap();
    let t = h.ord("t");
    let mut before = None;
    let mut seen = Vec::new();
    loop {
        let p = page(&h.store, t, AtMs(1_005), AtMs(1_020), before, 4).unwrap();
        seen.extend(p.items.iter().map(|a| a.key.received.0));
        match p.next {
            Some(n) => before = Some(n),
            None => break,
        }
    }
    assert_eq!(seen, (1_005..1_020).rev().collect::<Vec<_>>());
}
