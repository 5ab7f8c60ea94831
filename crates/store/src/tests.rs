use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::path::Path;
use std::sync::Arc;

use super::migrate::{self, Migration, Outcome, Registry, Step};
use super::*;
use ankusa_keyspace::{CounterField, Seq, TenantOrd};

fn fresh() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path().join("db"), &OpenOptions::default()).unwrap();
    (dir, store)
}

fn counter_value(store: &Store, ord: TenantOrd, field: CounterField) -> i64 {
    store
        .get(Cf::Counters, &ankusa_keyspace::counter(ord, field))
        .unwrap()
        .map_or(0, |v| merge::decode(&v).unwrap())
}

fn put_hooks(store: &Store, n: u64) {
    let ops = (1..=n)
        .map(|i| {
            Op::put(
                Cf::Hooks,
                ankusa_keyspace::hook(Seq(i)),
                format!("hook-{i}"),
            )
        })
        .collect();
    store.write(ops, true).unwrap();
}

#[test]
fn a_new_store_is_stamped_and_has_every_sentinel() {
    let (_d, store) = fresh();
    assert_eq!(store.format().unwrap(), SUPPORTED_FORMAT);
    for fam in Family::FORMAT3 {
        assert!(
            store.get(fam.cf(), &fam.lo()).unwrap().is_some(),
            "{fam:?} lo"
        );
        assert!(
            store.get(fam.cf(), &fam.hi()).unwrap().is_some(),
            "{fam:?} hi"
        );
        // A new store holds only its format stamp, next ordinal and the markers of the
        // families added since format 3.
        let expect = if fam == Family::Meta { 5 } else { 0 };
        assert_eq!(store.scan_family(fam).unwrap().count(), expect, "{fam:?}");
    }
    for fam in [Family::DueV2, Family::InflightV2] {
        assert!(store.get(fam.cf(), &fam.lo()).unwrap().is_none());
    }
}

#[test]
fn scans_return_the_range_in_both_directions() {
    let (_d, store) = fresh();
    put_hooks(&store, 10);
    let fwd: Vec<u64> = store
        .scan(
            Family::Hooks,
            &ankusa_keyspace::hook(Seq(3)),
            &ankusa_keyspace::hook(Seq(7)),
            Dir::Forward,
        )
        .unwrap()
        .map(|kv| ankusa_keyspace::decode_hook(&kv.unwrap().0).unwrap().0)
        .collect();
    assert_eq!(fwd, vec![3, 4, 5, 6]);
    let rev: Vec<u64> = store
        .scan(
            Family::Hooks,
            &ankusa_keyspace::hook(Seq(3)),
            &ankusa_keyspace::hook(Seq(7)),
            Dir::Reverse,
        )
        .unwrap()
        .map(|kv| ankusa_keyspace::decode_hook(&kv.unwrap().0).unwrap().0)
        .collect();
    assert_eq!(rev, vec![6, 5, 4, 3]);
    let (lo, end) = Family::Hooks.bounds();
    let all_rev: Vec<u64> = store
        .scan(Family::Hooks, &lo, &end, Dir::Reverse)
        .unwrap()
        .map(|kv| ankusa_keyspace::decode_hook(&kv.unwrap().0).unwrap().0)
        .collect();
    assert_eq!(all_rev, (1..=10).rev().collect::<Vec<_>>());
    assert_eq!(store.scan_family(Family::Hooks).unwrap().count(), 10);
}

#[test]
fn a_truncated_scan_is_reported_as_corruption() {
    let (_d, store) = fresh();
    put_hooks(&store, 5);
    store
        .write(vec![Op::delete(Cf::Hooks, Family::Hooks.hi())], true)
        .unwrap();
    let found = |f: Family| {
        corruptions()
            .iter()
            .find(|(g, _)| *g == f)
            .map_or(0, |(_, n)| *n)
    };
    let before = found(Family::Hooks);
    let results: Vec<_> = store.scan_family(Family::Hooks).unwrap().collect();
    // Counted (other tests of this process may count too: the count only grows).
    assert!(
        found(Family::Hooks) > before,
        "the corruption was not counted"
    );
    assert_eq!(results.len(), 6, "five rows, then the error");
    assert!(results[..5].iter().all(|r| r.is_ok()));
    match &results[5] {
        Err(StoreError::Corruption { family, detail }) => {
            assert_eq!(*family, Family::Hooks);
            assert_eq!(detail, "scan ended before the family's hi sentinel");
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    // A range that ends before the missing sentinel is still a clean scan.
    let n = store
        .scan(
            Family::Hooks,
            &ankusa_keyspace::hook(Seq(1)),
            &ankusa_keyspace::hook(Seq(3)),
            Dir::Forward,
        )
        .unwrap()
        .count();
    assert_eq!(n, 2);

    // The same for a reverse scan that loses its lo sentinel.
    store
        .write(vec![Op::delete(Cf::Audit, Family::Audit.lo())], true)
        .unwrap();
    let (lo, end) = Family::Audit.bounds();
    let r: Vec<_> = store
        .scan(Family::Audit, &lo, &end, Dir::Reverse)
        .unwrap()
        .collect();
    assert!(matches!(
        r.as_slice(),
        [Err(StoreError::Corruption { family: Family::Audit, detail })] if detail.contains("lo sentinel")
    ));
}

/// A bounded scan reads its range and nothing past it: 10 000 tombstones right after the
/// range (rows just claimed, markers just cleaned) cost it nothing, in either direction,
/// and a point read of an empty range is one seek.
#[test]
fn a_bounded_scan_never_walks_the_tombstones_past_its_range() {
    use rocksdb::perf::{set_perf_stats, PerfContext, PerfMetric, PerfStatsLevel};
    let (_d, store) = fresh();
    put_hooks(&store, 10_010);
    // Rows 11..=10 010 deleted: tombstones between the range [1, 11) and the sentinel.
    let deletes = (11..=10_010)
        .map(|i| Op::delete(Cf::Hooks, ankusa_keyspace::hook(Seq(i))))
        .collect();
    store.write(deletes, true).unwrap();
    set_perf_stats(PerfStatsLevel::EnableCount);
    let mut ctx = PerfContext::default();
    for dir in [Dir::Forward, Dir::Reverse] {
        ctx.reset();
        let n = store
            .scan(
                Family::Hooks,
                &ankusa_keyspace::hook(Seq(1)),
                &ankusa_keyspace::hook(Seq(11)),
                dir,
            )
            .unwrap()
            .map(Result::unwrap)
            .count();
        assert_eq!(n, 10);
        assert_eq!(
            ctx.metric(PerfMetric::InternalDeleteSkippedCount),
            0,
            "{dir:?}: the scan stepped over tombstones past its range"
        );
    }
    // The tombstoned range itself is empty, and reading it is the only way to walk them.
    ctx.reset();
    assert!(store
        .first(
            Family::Hooks,
            &ankusa_keyspace::hook(Seq(11)),
            &ankusa_keyspace::hook(Seq(5_000)),
            Dir::Forward
        )
        .unwrap()
        .is_none());
    let skipped = ctx.metric(PerfMetric::InternalDeleteSkippedCount);
    assert!(
        skipped <= 5_000,
        "walked {skipped} tombstones for a range of 4 989"
    );
    set_perf_stats(PerfStatsLevel::Disable);
}

#[test]
fn concurrent_merges_do_not_lose_counts() {
    let (_d, store) = fresh();
    let store = Arc::new(store);
    let threads = 8;
    let per_thread = 400;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let store = store.clone();
            std::thread::spawn(move || {
                for i in 0..per_thread {
                    // Each batch is its own write, mixing a large and a negative delta.
                    let delta: i64 = if i % 2 == 0 { 3_000_000_000 } else { -1 };
                    store
                        .write(
                            vec![
                                Op::Merge {
                                    cf: Cf::Counters,
                                    key: ankusa_keyspace::counter(
                                        TenantOrd(7),
                                        CounterField::Bytes,
                                    ),
                                    operand: merge::encode(delta).to_vec(),
                                },
                                Op::Merge {
                                    cf: Cf::Counters,
                                    key: ankusa_keyspace::counter(
                                        TenantOrd(7),
                                        CounterField::Pending,
                                    ),
                                    operand: merge::encode(1).to_vec(),
                                },
                            ],
                            t % 2 == 0,
                        )
                        .unwrap();
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
    let n = (threads * per_thread) as i64;
    let expect_bytes = (n / 2) * 3_000_000_000 - n / 2;
    assert_eq!(
        counter_value(&store, TenantOrd(7), CounterField::Bytes),
        expect_bytes
    );
    assert_eq!(
        counter_value(&store, TenantOrd(7), CounterField::Pending),
        n
    );
    // Still exact after the operands are flushed and compacted together.
    store.flush().unwrap();
    assert_eq!(
        counter_value(&store, TenantOrd(7), CounterField::Bytes),
        expect_bytes
    );
}

fn file_digests(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        out.insert(
            e.file_name().to_string_lossy().into_owned(),
            std::fs::read(e.path()).unwrap(),
        );
    }
    out
}

/// Stamps `m:format` as a newer release's migration would: the format file first.
fn stamp(store: &Store, format: u32) {
    store.record_format(format).unwrap();
    store
        .write(
            vec![Op::put(
                Cf::Default,
                ankusa_keyspace::META_FORMAT.to_vec(),
                format.to_be_bytes(),
            )],
            true,
        )
        .unwrap();
}

/// Both a read-write and a read-only open refuse the store at `path` as format 4.
fn refused_as_format_4(path: &Path) {
    for opts in [OpenOptions::default(), OpenOptions::inspect()] {
        match Store::open(path, &opts) {
            Err(StoreError::StoreFormatNewer { found, supported }) => {
                assert_eq!((found, supported), (4, 3));
            }
            other => panic!("expected StoreFormatNewer, got {other:?}"),
        }
    }
}

#[test]
fn a_newer_store_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let store = Store::open(&path, &OpenOptions::default()).unwrap();
        put_hooks(&store, 3);
        stamp(&store, 4);
    }
    let before = file_digests(&path);
    refused_as_format_4(&path);
    let err = Store::open(&path, &OpenOptions::default()).unwrap_err();
    assert!(err.to_string().contains("store format 4 is newer"), "{err}");
    assert!(err.to_string().contains("(format 3)"), "{err}");
    assert_eq!(
        file_digests(&path),
        before,
        "the refused store was modified"
    );
}

/// FORMAT_FILE follows the stamp: written at creation, raised by the migration runner with
/// its last step, put back at the next read-write open of a store without it (or with one
/// lowered by hand); a read-only open writes nothing; a write that is no stamp leaves it.
#[test]
fn the_format_file_is_never_below_the_stamp() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let file = path.join(FORMAT_FILE);
    let read = || std::fs::read_to_string(&file).ok();
    drop(Store::open(&path, &OpenOptions::default()).unwrap());
    assert_eq!(read().as_deref(), Some("3\n"));

    std::fs::remove_file(&file).unwrap();
    drop(Store::open(&path, &OpenOptions::inspect()).unwrap());
    assert_eq!(read(), None, "a read-only open wrote the format file");
    drop(Store::open(&path, &OpenOptions::default()).unwrap());
    assert_eq!(read().as_deref(), Some("3\n"));

    std::fs::write(&file, "2\n").unwrap();
    drop(Store::open(&path, &OpenOptions::default()).unwrap());
    assert_eq!(read().as_deref(), Some("3\n"));

    let store = Store::open(&path, &opts4()).unwrap();
    put_hooks(&store, 4);
    assert_eq!(read().as_deref(), Some("3\n"));
    migrate::run(&store, &upcase_registry(), 4, |p| {
        // Until the last step commits, the store is at 3 and so is the file.
        if !p.finished {
            assert_eq!(read().as_deref(), Some("3\n"));
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(store.format().unwrap(), 4);
    assert_eq!(read().as_deref(), Some("4\n"));
}

/// A format file lowered by hand below a newer stamp does not let the store through: the
/// stamp, read after the open, still refuses it.
#[test]
fn a_format_file_behind_a_newer_stamp_is_still_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    {
        let store = Store::open(&path, &OpenOptions::default()).unwrap();
        stamp(&store, 4);
    }
    std::fs::write(path.join(FORMAT_FILE), "3\n").unwrap();
    refused_as_format_4(&path);
}

#[test]
fn a_missing_data_dir_is_an_error_and_nothing_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope");
    let err = Store::open(&path, &OpenOptions::inspect()).unwrap_err();
    assert!(matches!(err, StoreError::Missing(_)), "{err}");
    assert!(!path.exists());
    std::fs::create_dir(&path).unwrap();
    std::fs::write(path.join("junk"), b"x").unwrap();
    let err = Store::open(&path, &OpenOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::NotAStore { .. }), "{err}");
}

#[test]
fn a_read_only_store_refuses_writes() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    drop(Store::open(&path, &OpenOptions::default()).unwrap());
    let ro = Store::open(&path, &OpenOptions::inspect()).unwrap();
    assert_eq!(ro.format().unwrap(), 3);
    assert!(matches!(ro.write(vec![], true), Err(StoreError::ReadOnly)));
}

/// The info LOG RocksDB writes on a read-only open (the format peek of every open
/// included) goes to a directory of its own that is gone once the store is closed: a
/// process that inspects stores leaves nothing in the temporary directory.
#[test]
fn a_read_only_open_leaves_no_log_behind() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("db");
    let ours = || {
        let prefix = format!("ankusa-ro-log-{}-", std::process::id());
        std::fs::read_dir(std::env::temp_dir())
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
            .count()
    };
    drop(Store::open(&path, &OpenOptions::default()).unwrap());
    std::fs::remove_file(path.join(FORMAT_FILE)).unwrap();
    let ro = Store::open(&path, &OpenOptions::inspect()).unwrap();
    assert_eq!(ours(), 1, "the open store's LOG directory");
    drop(ro);
    assert_eq!(ours(), 0);
}

/// A test migration 3 -> 4: upper-cases every hook value, three rows a step, and counts
/// every row it moves with a merge, so a re-applied step would show as a double count.
struct Upcase;

impl Migration for Upcase {
    fn from(&self) -> u32 {
        3
    }
    fn to(&self) -> u32 {
        4
    }
    fn description(&self) -> &'static str {
        "upper-case hooks (test)"
    }
    fn step(&self, store: &Store, cursor: &[u8]) -> Result<Step, StoreError> {
        let (lo, end) = Family::Hooks.bounds();
        let start = if cursor.is_empty() {
            lo
        } else {
            let mut s = cursor.to_vec();
            s.push(0);
            s
        };
        let mut step = Step::default();
        let mut last = None;
        for kv in store
            .scan(Family::Hooks, &start, &end, Dir::Forward)?
            .take(3)
        {
            let (k, v) = kv?;
            step.ops
                .push(Op::put(Cf::Hooks, k.clone(), v.to_ascii_uppercase()));
            step.ops.push(Op::Merge {
                cf: Cf::Counters,
                key: ankusa_keyspace::counter(TenantOrd(0), CounterField::Pending),
                operand: merge::encode(1).to_vec(),
            });
            step.rows += 1;
            last = Some(k);
        }
        step.next = last;
        Ok(step)
    }
}

fn upcase_registry() -> Registry {
    Registry::new().register(Arc::new(Upcase))
}

fn opts4() -> OpenOptions {
    OpenOptions {
        supported_format: 4,
        ..OpenOptions::default()
    }
}

fn snapshot(store: &Store) -> Vec<(Cf, Vec<KeyValue>)> {
    store.flush().unwrap();
    Cf::ALL
        .into_iter()
        .map(|cf| {
            let mut rows = store.dump_cf(cf).unwrap();
            if cf == Cf::Counters {
                // Merge operands fold on read; compare the values.
                rows = rows
                    .into_iter()
                    .map(|(k, _)| {
                        let v = store.get(cf, &k).unwrap().unwrap_or_default();
                        (k, v)
                    })
                    .collect();
            }
            (cf, rows)
        })
        .collect()
}

#[test]
fn the_migration_runner_resumes_after_a_stop_between_every_pair_of_steps() {
    let hooks = 10u64; // 4 steps of <= 3 rows, then an empty final step
    let reference = {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path().join("db"), &opts4()).unwrap();
        put_hooks(&store, hooks);
        let out =
            migrate::run(&store, &upcase_registry(), 4, |_| ControlFlow::Continue(())).unwrap();
        assert_eq!(
            out,
            Outcome::Done {
                format: 4,
                steps: 5,
                rows: hooks
            }
        );
        snapshot(&store)
    };
    for stop_after in 1..=4u64 {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("db");
        {
            let store = Store::open(&path, &opts4()).unwrap();
            put_hooks(&store, hooks);
            let out = migrate::run(&store, &upcase_registry(), 4, |p| {
                if p.steps == stop_after {
                    ControlFlow::Break(())
                } else {
                    ControlFlow::Continue(())
                }
            })
            .unwrap();
            assert_eq!(
                out,
                Outcome::Stopped {
                    format: 3,
                    steps: stop_after
                }
            );
            let pending = migrate::pending(&store, &upcase_registry(), 4).unwrap();
            assert_eq!(pending.len(), 1);
            assert!(pending[0].resuming);
            assert_eq!(
                pending[0].to_string(),
                "3 -> 4: upper-case hooks (test) (interrupted; resumes from its cursor)"
            );
        }
        // A new process: reopen and finish.
        let store = Store::open(&path, &opts4()).unwrap();
        let out =
            migrate::run(&store, &upcase_registry(), 4, |_| ControlFlow::Continue(())).unwrap();
        assert!(matches!(out, Outcome::Done { format: 4, .. }));
        assert_eq!(
            counter_value(&store, TenantOrd(0), CounterField::Pending),
            hooks as i64,
            "a committed step was applied twice (stopped after {stop_after})"
        );
        assert_eq!(snapshot(&store), reference, "stopped after {stop_after}");
        assert!(migrate::in_progress(&store).unwrap().is_none());
    }
}

#[test]
fn a_missing_migration_path_is_a_clear_error() {
    let (_d, store) = fresh();
    let err = migrate::run(&store, &Registry::new(), 4, |_| ControlFlow::Continue(())).unwrap_err();
    assert_eq!(
        err.to_string(),
        "no migration from store format 3 towards 4 in this build"
    );
    assert!(migrate::pending(&store, &Registry::new(), 3)
        .unwrap()
        .is_empty());
}

#[test]
fn every_family_has_a_read_statistics_slot() {
    for f in Family::FORMAT3.iter().chain(Family::FORMAT2.iter()) {
        assert!(super::family_slot(*f) < super::N_FAMILIES, "{f:?}");
    }
}

#[test]
fn memtables_keep_an_insert_hint_per_stream() {
    let (dir, store) = fresh();
    drop(store);
    let options = std::fs::read_dir(dir.path().join("db"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().starts_with("OPTIONS-"))
        .max_by_key(|e| e.file_name())
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .expect("an OPTIONS file");
    // Each column family's section of the OPTIONS file, by name.
    let section = |name: &str| -> String {
        let head = format!("[CFOptions \"{name}\"]");
        let at = options.find(&head).unwrap_or_else(|| panic!("{head}"));
        let rest = &options[at + head.len()..];
        rest[..rest.find("\n[").unwrap_or(rest.len())].to_string()
    };
    for cf in Cf::ALL {
        let want = match insert_hint_prefix(cf) {
            Some(n) => format!("rocksdb.CappedPrefix.{n}"),
            None => "nullptr".to_string(),
        };
        let line = format!("memtable_insert_with_hint_prefix_extractor={want}");
        assert!(
            section(cf.name()).contains(&line),
            "{}: {line} not in its options",
            cf.name()
        );
    }
}

/// The families read by point — hooks, delivery rows, the index's dedupe keys — keep a
/// filter over their memtables' keys: a read of a key the memtable does not hold is
/// answered by the filter, not a search of the memtable's skiplist.
#[test]
fn point_reads_of_keys_a_memtable_does_not_hold_are_answered_by_its_filter() {
    use rocksdb::perf::{set_perf_stats, PerfContext, PerfMetric, PerfStatsLevel};
    let (_dir, store) = fresh();
    let key = |cf: Cf, i: u64| match cf {
        Cf::Hooks => ankusa_keyspace::hook(Seq(i)),
        Cf::Deliveries => ankusa_keyspace::delivery(Seq(i), ankusa_keyspace::SinkIdx(0)),
        _ => format!("?u-test-{i:08}").into_bytes(),
    };
    for cf in [Cf::Hooks, Cf::Deliveries, Cf::Index] {
        let held: Vec<Vec<u8>> = (1..=100).map(|i| key(cf, i)).collect();
        let absent: Vec<Vec<u8>> = (1_001..=1_100).map(|i| key(cf, i)).collect();
        store
            .write(
                held.iter()
                    .map(|k| Op::put(cf, k.clone(), b"v".to_vec()))
                    .collect(),
                false,
            )
            .unwrap();
        set_perf_stats(PerfStatsLevel::EnableCount);
        let mut ctx = PerfContext::default();
        ctx.reset();
        let found = store.multi_get(cf, &absent).unwrap();
        let filtered = ctx.metric(PerfMetric::BloomMemtableMissCount);
        ctx.reset();
        let read = store.multi_get(cf, &held).unwrap();
        let passed = ctx.metric(PerfMetric::BloomMemtableHitCount);
        set_perf_stats(PerfStatsLevel::Disable);
        assert!(found.iter().all(Option::is_none), "{cf:?}");
        assert!(read.iter().all(Option::is_some), "{cf:?}");
        // A filter of this size lets through about one absent key in a hundred.
        assert!(
            filtered >= 95,
            "{cf:?}: the filter answered {filtered} of 100 absent keys"
        );
        assert_eq!(passed, 100, "{cf:?}: every key held passes the filter");
    }
}

#[test]
fn a_store_held_by_a_process_is_refused_with_its_holder() {
    let (dir, _held) = fresh();
    let err = Store::open(dir.path().join("db"), &OpenOptions::default()).unwrap_err();
    let text = err.to_string();
    assert!(
        matches!(err, StoreError::Locked { holder: Some(pid), .. } if pid == std::process::id()),
        "{err:?}"
    );
    assert!(text.contains("is held by another process"), "{text}");
    assert!(
        text.contains(&format!("(pid {}?)", std::process::id())),
        "{text}"
    );
}
