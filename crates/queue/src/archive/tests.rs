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

/// A policy keeping every source 10 s and limiting tenant `t1`'s archive to `limit` bytes.
struct Limited {
    limit: u64,
}

impl Policy for Limited {
    fn retention_ms(&self, _source: &str) -> Option<u64> {
        Some(10_000)
    }
    fn archive_limit(&self, tenant: &str) -> Option<u64> {
        (tenant == "t1").then_some(self.limit)
    }
}

/// The bytes of a tenant's archived copies, by a scan.
fn archived_bytes(h: &Harness, ord: TenantOrd) -> u64 {
    let (lo, hi) = ankusa_keyspace::archived_range(ord, AtMs(0), AtMs(u64::MAX));
    h.store
        .scan(Family::ArchivedHooks, &lo, &hi, Dir::Forward)
        .unwrap()
        .map(|kv| kv.unwrap().1.len() as u64)
        .sum()
}

/// The sizes as stored of the archived copies the hooks with seqs `seqs` would make.
fn sizes(h: &Harness, seqs: &[Seq]) -> Vec<u64> {
    seqs.iter()
        .map(|s| {
            let env = h
                .store
                .get(Cf::Hooks, &ankusa_keyspace::hook(*s))
                .unwrap()
                .unwrap();
            assert_eq!(stored_len(&env), encode(AtMs(0), &env).len() as u64);
            stored_len(&env)
        })
        .collect()
}

/// What settling copies of `sizes`, in order, onto an archive holding `used` under `limit`
/// archives and refuses: (archived, over quota).
fn greedy(sizes: &[u64], mut used: u64, limit: u64) -> (u64, u64) {
    let (mut archived, mut over) = (0, 0);
    for s in sizes {
        if used + s > limit {
            over += 1;
        } else {
            used += s;
            archived += 1;
        }
    }
    (archived, over)
}

/// A tenant's archive stops at its limit (the hooks past it are settled, not archived, and
/// counted); another tenant's is not limited; expiry makes room again; a new archiver (a
/// restart) reads what the archive holds before it compares.
#[test]
fn a_tenants_archive_stops_at_its_limit_and_expiry_makes_room() {
    let mut h = Harness::new();
    let mut t1_seqs = Vec::new();
    for i in 0..20u64 {
        let t = if i % 2 == 0 { "t1" } else { "t2" };
        let seq = h.ingest(Some(t), 0, 1_000 + i, true);
        if t == "t1" {
            t1_seqs.push(seq);
        }
    }
    let (t1, t2) = (h.ord("t1"), h.ord("t2"));
    let t1_sizes = sizes(&h, &t1_seqs);
    let policy = Limited {
        limit: t1_sizes[..3].iter().sum::<u64>() + 1,
    };
    let (archived, over) = greedy(&t1_sizes, 0, policy.limit);
    assert!(archived >= 3 && over > 0);
    let mut a = Archiver::default();
    let r = a.settle(&h.store, &policy, 100).unwrap();
    assert_eq!((r.archived, r.over_quota), (archived + 10, over), "{r:?}");
    assert!(archived_bytes(&h, t1) <= policy.limit);
    let listed = |ord| {
        page(&h.store, ord, AtMs(0), AtMs(u64::MAX), None, 100)
            .unwrap()
            .items
            .len() as u64
    };
    assert_eq!((listed(t1), listed(t2)), (archived, 10));
    assert_eq!(archive_pending(&h), 0);
    h.assert_counters_equal_fold();
    // Every copy expires: room again.
    a.prune(&h.store, AtMs(u64::MAX - 1), 100).unwrap();
    assert_eq!(archived_bytes(&h, t1), 0);
    let seqs: Vec<Seq> = (0..4u64)
        .map(|i| h.ingest(Some("t1"), 0, 20_000 + i, true))
        .collect();
    let want = greedy(&sizes(&h, &seqs), 0, policy.limit);
    let r = a.settle(&h.store, &policy, 100).unwrap();
    assert_eq!((r.archived, r.over_quota), want, "{r:?}");
    // A fresh archiver reads the archive's size before it compares.
    let seq = h.ingest(Some("t1"), 0, 30_000, true);
    let want = greedy(&sizes(&h, &[seq]), archived_bytes(&h, t1), policy.limit);
    let r = Archiver::default().settle(&h.store, &policy, 100).unwrap();
    assert_eq!((r.archived, r.over_quota), want, "{r:?}");
    assert!(archived_bytes(&h, t1) <= policy.limit);
    h.assert_counters_equal_fold();
}
