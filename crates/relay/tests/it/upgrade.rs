//! Store format 2 → 3 (docs/storage.md, "Format 2 → 3").

use std::collections::BTreeMap;
use std::io::BufRead;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};

use ankusa_keyspace::Cf;
use ankusa_keyspace::{AtMs, Family, Seq, SinkIdx, TenantOrd};
use ankusa_queue::counters::Counters;
use ankusa_queue::formats::legacy::v2::{State, Writer};
use ankusa_queue::{counters, deliveries, fold, tenants};
use ankusa_records::Envelope;
use ankusa_store::migrate::{self, Outcome};
use ankusa_store::{tarball, KeyValue, OpenOptions, Rows, Store, StoreError};

use crate::support::*;

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

fn unpack(name: &str, dir: &Path) -> PathBuf {
    let data = dir.join("db");
    tarball::unpack(&fixture(name), &data).unwrap();
    data
}

fn migrate_all(store: &Store) -> Outcome {
    migrate::run(store, &ankusa_queue::formats::builtin(), 3, |_| {
        ControlFlow::Continue(())
    })
    .unwrap()
}

/// Every column family's contents, counters as their merged values.
fn snapshot(store: &Store) -> Vec<(Cf, Vec<KeyValue>)> {
    store.flush().unwrap();
    store
        .column_families()
        .into_iter()
        .map(|cf| {
            let rows = store
                .dump_cf(cf)
                .unwrap()
                .into_iter()
                .map(|(k, v)| {
                    if cf == Cf::Counters {
                        let merged = store.get(cf, &k).unwrap().unwrap_or_default();
                        (k, merged)
                    } else {
                        (k, v)
                    }
                })
                .collect();
            (cf, rows)
        })
        .collect()
}

fn tenant_counts(store: &Store, name: &str) -> Counters {
    let ord = tenants::ord(store, name)
        .unwrap()
        .unwrap_or_else(|| panic!("no tenant {name}"));
    counters::read(store, ord).unwrap()
}

#[test]
fn v2_fixture_upgrades_to_v3_with_counters_equal_to_a_fold() {
    let dir = tempfile::tempdir().unwrap();
    let data = unpack("store-v2.tar.zst", dir.path());
    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    assert_eq!(store.format().unwrap(), 2);
    assert!(matches!(
        migrate_all(&store),
        Outcome::Done { format: 3, .. }
    ));
    assert_eq!(store.format().unwrap(), 3);
    assert!(migrate::in_progress(&store).unwrap().is_none());
    assert!(
        fold::verify(&store).unwrap().is_empty(),
        "counters differ from the fold"
    );
    // No format-2 index row is left, and no sentinel of one.
    for fam in [Family::DueV2, Family::InflightV2] {
        let (lo, end) = fam.bounds();
        let raw = store.dump_cf(Cf::Index).unwrap();
        assert!(raw
            .iter()
            .all(|(k, _)| !(k.as_slice() >= lo.as_slice() && k.as_slice() < end.as_slice())));
    }
    // Per tenant, what the fixture put there (see ankusa_queue::formats::fixture).
    let acme = tenant_counts(&store, "acme");
    assert_eq!(
        (acme.pending, acme.scheduled, acme.inflight, acme.dead),
        (2, 1, 1, 1)
    );
    let globex = tenant_counts(&store, "globex");
    assert_eq!((globex.pending, globex.scheduled, globex.dead), (1, 1, 1));
    let deadonly = tenant_counts(&store, "deadonly");
    assert_eq!(
        (
            deadonly.pending,
            deadonly.scheduled,
            deadonly.inflight,
            deadonly.dead
        ),
        (0, 0, 0, 3)
    );
    assert_eq!(deadonly.archive_pending, 1);
    let default = tenant_counts(&store, ankusa_records::DEFAULT_TENANT);
    // Hook 6 (due), hook 7 (inflight), the undecodable hook 20 and the missing hook 21.
    assert_eq!((default.pending, default.inflight), (3, 2));
    assert_eq!(counters::node(&store).unwrap().dead, 5);
    // Every dead row's value carries its ord; the by-tenant view agrees with the node view.
    let all = deliveries::dead_page(&store, None, 100).unwrap().rows;
    for r in &all {
        let page = deliveries::dead_page_for_tenant(&store, r.value.ord, None, 100).unwrap();
        assert!(page.rows.contains(r));
    }
    // Due rows have their markers; the far-future ones are retries (kind 1).
    for r in deliveries::due_rows(&store).unwrap() {
        let kind_is_retry = r.kind == deliveries::Kind::Retry;
        assert_eq!(
            kind_is_retry,
            r.key.at.0 > ankusa_queue::formats::fixture::FUTURE - 1,
            "{r:?}"
        );
    }
}

#[test]
fn a_hook_with_no_tenant_or_no_envelope_files_under_default() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    {
        let w = Writer::create(&data).unwrap();
        let env = Envelope::builder("a", "s")
            .received_at(AtMs(1))
            .content_type("x")
            .sinks(["k"])
            .build();
        w.hook(
            Seq(1),
            Some(&env),
            10,
            &[(SinkIdx(0), State::Due { at: AtMs(5) })],
            false,
        )
        .unwrap();
        w.raw_hook(Seq(2), vec![0xde, 0xad]).unwrap();
        w.hook(Seq(2), None, 10, &[(SinkIdx(0), State::Inflight)], false)
            .unwrap();
        w.hook(
            Seq(3),
            None,
            10,
            &[(SinkIdx(0), State::Dead { at: AtMs(7) })],
            true,
        )
        .unwrap();
    }
    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    migrate_all(&store);
    assert_eq!(tenants::count(&store).unwrap(), 1);
    let c = tenant_counts(&store, ankusa_records::DEFAULT_TENANT);
    assert_eq!(
        (c.pending, c.inflight, c.dead, c.archive_pending),
        (1, 1, 1, 1)
    );
    assert!(fold::verify(&store).unwrap().is_empty());
}

/// A format-2 store big enough for several steps per phase, written the same way each time.
fn big_v2(data: &Path, hooks: u64) {
    let w = Writer::create(data).unwrap();
    for n in 1..=hooks {
        let tenant = match n % 5 {
            0 => None,
            k => Some(format!("tenant-{k}-{}", n % 13)),
        };
        let env = Envelope::builder(format!("h{n}"), "src")
            .tenant(tenant.as_deref())
            .received_at(AtMs(1_600_000_000_000 + n))
            .sinks(["a", "b"])
            .body(vec![b'x'; (n % 50) as usize])
            .build();
        let at = |n: u64| {
            AtMs(if n.is_multiple_of(7) {
                4_000_000_000_000 + n
            } else {
                1_600_000_000_000 + n
            })
        };
        let states = match n % 4 {
            0 => vec![State::Due { at: at(n) }, State::Inflight],
            1 => vec![
                State::Due { at: at(n) },
                State::Dead {
                    at: AtMs(1_650_000_000_000 + n),
                },
            ],
            2 => vec![State::Inflight, State::Due { at: at(n + 1) }],
            _ => vec![
                State::Dead {
                    at: AtMs(1_650_000_000_000 + n),
                },
                State::Due { at: at(n) },
            ],
        };
        let rows: Vec<_> = states
            .into_iter()
            .enumerate()
            .map(|(i, s)| (SinkIdx(i as u16), s))
            .collect();
        let hook = (n % 97 != 0).then_some(&env);
        w.hook(Seq(n), hook, 64, &rows, n % 3 == 0).unwrap();
    }
    w.store.flush().unwrap();
}

#[test]
fn resumes_interrupted_tenant_migration_without_double_counting() {
    const HOOKS: u64 = 700; // 1 400 rows: several 500-row steps in the due phase
    let reference = {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("db");
        big_v2(&data, HOOKS);
        let store = Store::open(&data, &OpenOptions::default()).unwrap();
        let Outcome::Done { steps, .. } = migrate_all(&store) else {
            panic!()
        };
        assert!(fold::verify(&store).unwrap().is_empty());
        (steps, snapshot(&store))
    };
    let (steps, reference) = reference;
    assert!(
        steps >= 4,
        "the test store should take several steps ({steps})"
    );
    for stop_after in 1..steps {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("db");
        big_v2(&data, HOOKS);
        {
            let store = Store::open(&data, &OpenOptions::default()).unwrap();
            let out = migrate::run(&store, &ankusa_queue::formats::builtin(), 3, |p| {
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
                    format: 2,
                    steps: stop_after
                }
            );
            assert!(migrate::in_progress(&store).unwrap().is_some());
        }
        let store = Store::open(&data, &OpenOptions::default()).unwrap();
        assert!(matches!(
            migrate_all(&store),
            Outcome::Done { format: 3, .. }
        ));
        assert!(
            fold::verify(&store).unwrap().is_empty(),
            "stopped after {stop_after}"
        );
        assert!(
            snapshot(&store) == reference,
            "stopped after {stop_after}: differs from an uninterrupted run"
        );
    }
}

#[test]
fn a_migration_killed_with_sigkill_resumes_to_the_same_store() {
    const HOOKS: u64 = 20_000;
    let reference = {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("db");
        big_v2(&data, HOOKS);
        let store = Store::open(&data, &OpenOptions::default()).unwrap();
        migrate_all(&store);
        snapshot(&store)
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    big_v2(&data, HOOKS);
    let mut child = bin()
        .args(["store", "migrate", "--data", data.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = 0;
    while seen < 5 {
        let line = lines.next().expect("progress line").unwrap();
        assert!(
            !line.contains("done"),
            "the migration finished before it could be killed"
        );
        seen += 1;
    }
    child.kill().unwrap();
    child.wait().unwrap();
    {
        let store = Store::open(&data, &OpenOptions::default()).unwrap();
        assert_eq!(
            store.format().unwrap(),
            2,
            "killed mid-way, the store is still format 2"
        );
        assert!(migrate::in_progress(&store).unwrap().is_some());
    }
    let out = run(&["store", "migrate", "--data", data.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    assert!(fold::verify(&store).unwrap().is_empty());
    assert!(
        snapshot(&store) == reference,
        "a resumed migration differs from an uninterrupted one"
    );
}

#[test]
fn tenant_migration_allocates_each_ordinal_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    big_v2(&data, 1_200);
    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    migrate_all(&store);
    let mut by_ord: BTreeMap<u32, String> = BTreeMap::new();
    for kv in store.scan_family(Family::TenantNames).unwrap() {
        let (k, v) = kv.unwrap();
        let ord = ankusa_keyspace::decode_tenant_name(&k).unwrap();
        by_ord.insert(ord.0, String::from_utf8(v).unwrap());
    }
    let n = by_ord.len() as u32;
    // Dense from 1, one name each, and `?n` maps every name back to its ordinal.
    assert_eq!(
        by_ord.keys().copied().collect::<Vec<_>>(),
        (1..=n).collect::<Vec<_>>()
    );
    for (ord, name) in &by_ord {
        assert_eq!(tenants::ord(&store, name).unwrap(), Some(TenantOrd(*ord)));
    }
    assert_eq!(
        store.scan_family(Family::TenantOrds).unwrap().count() as u32,
        n
    );
    assert_eq!(tenants::count(&store).unwrap(), n);
    // 4 × 13 named tenants plus default.
    assert_eq!(n, 4 * 13 + 1);
}

#[test]
fn an_empty_format_2_store_migrates_in_one_step() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    drop(Writer::create(&data).unwrap());
    let out = run(&[
        "store",
        "migrate",
        "--data",
        data.to_str().unwrap(),
        "--dry-run",
    ]);
    assert_eq!(
        text(&out.stdout),
        "2 -> 3: re-key due/inflight/dead by tenant ordinal, seed per-tenant counters\n"
    );
    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    assert_eq!(
        migrate_all(&store),
        Outcome::Done {
            format: 3,
            steps: 1,
            rows: 0
        }
    );
    for fam in Family::FORMAT3 {
        assert!(store.scan_family(fam).is_ok());
        let n = store
            .scan_family(fam)
            .unwrap()
            .collect::<Result<Vec<_>, StoreError>>()
            .unwrap()
            .len();
        // The format stamp and the hook log's, archive's and pull gateway's markers.
        assert_eq!(n, if fam == Family::Meta { 4 } else { 0 }, "{fam:?}");
    }
}

#[test]
fn a_format_2_release_refuses_a_format_3_store() {
    let dir = tempfile::tempdir().unwrap();
    let data = unpack("store-v3.tar.zst", dir.path());
    let before = files(&data);
    let format2 = OpenOptions {
        supported_format: 2,
        ..OpenOptions::default()
    };
    match Store::open(&data, &format2) {
        Err(StoreError::StoreFormatNewer {
            found: 3,
            supported: 2,
        }) => {}
        other => panic!("expected StoreFormatNewer {{3, 2}}, got {other:?}"),
    }
    assert_eq!(files(&data), before, "the refused store was modified");
}

fn node_status(admin: u16) -> serde_json::Value {
    let (status, body) = http_get_admin(admin, "/v1/node").unwrap();
    assert_eq!(status, 200);
    serde_json::from_str(&body).unwrap()
}

#[test]
fn a_restored_format_2_backup_migrates_on_boot() {
    let dir = tempfile::tempdir().unwrap();
    let data = unpack("store-v2.tar.zst", dir.path());
    let spec = proc_node().data_dir(&data);
    let admin = spec.admin_port().unwrap();
    let node = Proc::start(dir.path(), &spec);
    let s = node_status(admin);
    assert_eq!(s["store_format"], 3);
    assert_eq!(s["migrating_to"], serde_json::Value::Null);
    assert_eq!(s["tenants"], 4);
    let imported = s["counters"]["archive_pending"].as_i64().unwrap();
    assert!(imported > 0, "the fixture holds archive obligations: {s}");
    // The archiver settles the imported obligations (their sources are not in this
    // configuration: honoured with the default retention, or dropped if the hook is gone).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while node_status(admin)["counters"]["archive_pending"] != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "imported obligations not settled"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    // Four hooks are there and archived; one obligation's hook is missing: dropped. The
    // fixture's hooks were received decades ago, so their retention has ended too.
    let (_, m) = http_get(admin, "/metrics").unwrap();
    for line in [
        r#"ankusa_archive_settled_total{outcome="archived"} 4"#,
        r#"ankusa_archive_settled_total{outcome="dropped"} 1"#,
        "ankusa_archive_expired_total 4",
    ] {
        assert!(m.contains(line), "{line}: {m}");
    }
    drop(node);
    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    assert!(fold::verify(&store).unwrap().is_empty());
    assert_eq!(store.scan_family(Family::ArchivedHooks).unwrap().count(), 0);
}

#[test]
fn the_v3_fixture_task_writes_a_store_that_boots() {
    let dir = tempfile::tempdir().unwrap();
    let out_file = dir.path().join("store-v3.tar.zst");
    let out = run(&[
        "store",
        "fixture",
        "--format",
        "3",
        out_file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let data = dir.path().join("db");
    tarball::unpack(&out_file, &data).unwrap();
    {
        let store = Store::open(&data, &OpenOptions::inspect()).unwrap();
        assert_eq!(store.format().unwrap(), 3);
        assert_eq!(tenants::count(&store).unwrap(), 4);
        let c = counters::node(&store).unwrap();
        assert!(
            c.pending > 0
                && c.scheduled > 0
                && c.inflight > 0
                && c.dead > 0
                && c.archive_pending > 0,
            "{c:?}"
        );
        let deadonly = tenant_counts(&store, "deadonly");
        assert_eq!(
            (deadonly.pending, deadonly.scheduled, deadonly.inflight),
            (0, 0, 0)
        );
        assert!(deadonly.dead > 0);
        assert!(tenants::ord(&store, ankusa_records::DEFAULT_TENANT)
            .unwrap()
            .is_some());
        assert!(fold::verify(&store).unwrap().is_empty());
    }
    let before = {
        let store = Store::open(&data, &OpenOptions::inspect()).unwrap();
        let c = counters::node(&store).unwrap();
        c.pending + c.scheduled + c.inflight + c.dead
    };
    let spec = proc_node().data_dir(&data);
    let admin = spec.admin_port().unwrap();
    let node = Proc::start(dir.path(), &spec);
    let s = node_status(admin);
    assert_eq!(s["store_format"], 3);
    // The node's pipeline moves rows on at once (the fixture's sinks are not configured
    // here, so they dead-letter): every row is still counted somewhere.
    let c = &s["counters"];
    let after = queued_rows(c);
    assert_eq!(after, before);
    drop(node);
    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    assert!(fold::verify(&store).unwrap().is_empty());
    // The committed fixture is the same story.
    let dir2 = tempfile::tempdir().unwrap();
    let committed = unpack("store-v3.tar.zst", dir2.path());
    let store2 = Store::open(&committed, &OpenOptions::inspect()).unwrap();
    assert_eq!(tenants::count(&store2).unwrap(), 4);
}

#[test]
fn node_status_reports_the_boot_migration_while_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    big_v2(&data, 30_000);
    let spec = proc_node().data_dir(&data);
    let admin = spec.admin_port().unwrap();
    let mut node = Proc::spawn(dir.path(), &spec);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen_progress = false;
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never became ready"
        );
        let answer = http_get_admin(admin, "/v1/node");
        if let Ok((code, body)) = &answer {
            // Answering at all, it answers the status: never a 500 mid-migration. Before
            // that, while the store is still opening (the listeners answer from the start),
            // there is no status yet: 503 not_ready, saying so.
            let opening = *code == 503 && body.contains("the store is opening");
            assert!(
                *code == 200 || opening && !seen_progress,
                "/v1/node during the boot: {code} {body}"
            );
        }
        if let Ok((200, body)) = answer {
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            // The progress, the format and the marker are read one after the other: an
            // answer given as the migration ends may show its steps with the marker gone.
            // Only an answer that still names the migration speaks for a node mid-way.
            if v["migration"]["steps"].as_u64().is_some_and(|s| s > 0) && v["migrating_to"] == 3 {
                assert_eq!(v["store_format"], 2);
                assert_eq!(
                    http_get(admin, "/readyz").unwrap().0,
                    503,
                    "ready during a migration"
                );
                // Nothing but /v1/node reads or writes the store before the node is ready.
                let (code, body) = http_get_admin(admin, "/v1/dlq").unwrap();
                assert_eq!(code, 503, "{body}");
                assert!(body.contains("not_ready"), "{body}");
                seen_progress = true;
            }
            if v["store_format"] == 3 {
                break;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    // Once the node is ready, the finished migration is no longer reported.
    while http_get(admin, "/readyz").map(|r| r.0).unwrap_or(0) != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never became ready"
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let (_, body) = http_get_admin(admin, "/v1/node").unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["migration"].is_null(), "{v}");
    node.kill9();
    assert!(
        seen_progress,
        "/v1/node never showed the migration's progress"
    );
}

fn v2_state() -> impl proptest::strategy::Strategy<Value = State> {
    use proptest::prelude::*;
    prop_oneof![
        (0u64..u64::MAX / 2).prop_map(|at| State::Due { at: AtMs(at) }),
        Just(State::Inflight),
        (0u64..u64::MAX / 2).prop_map(|at| State::Dead { at: AtMs(at) }),
    ]
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

    /// A migration of any format-2 rows (issue 20's "one migration step over arbitrary
    /// format-2 rows": the step needs RocksDB, so it is a property test, not a libFuzzer
    /// target): hooks of any tenant (none, valid, or an id no tenant may have), present,
    /// missing or undecodable, with any mix of due, inflight and dead rows at any time and
    /// archive obligations. It finishes; each row is moved exactly once; the counters equal
    /// a fold of the families.
    #[test]
    fn a_migration_of_any_format_2_rows_moves_each_once_and_counts_them_all(
        hooks in proptest::collection::vec(
            (0u8..5, proptest::collection::vec(v2_state(), 0..4), proptest::bool::ANY, 0u8..4),
            1..40,
        )
    ) {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("db");
        let w = Writer::create(&data).unwrap();
        let (mut rows_written, mut obligations) = (0usize, 0usize);
        for (i, (tenant, states, archive, kind)) in hooks.iter().enumerate() {
            let seq = Seq(i as u64 + 1);
            let tenant = match tenant {
                0 => None,
                1 => Some("acme".to_owned()),
                2 => Some("globex".to_owned()),
                3 => Some(String::new()),
                _ => Some("bad\u{7}tenant".to_owned()),
            };
            let env = Envelope::builder(format!("h{i}"), "src")
                .tenant(tenant.as_deref())
                .received_at(AtMs(1_000 + i as u64))
                .sinks((0..states.len()).map(|s| format!("s{s}")))
                .body(vec![b'x'; i])
                .build();
            let rows: Vec<_> = states.iter().cloned().enumerate().map(|(s, st)| (SinkIdx(s as u16), st)).collect();
            rows_written += rows.len();
            obligations += usize::from(*archive);
            match kind {
                // The hook is missing: its rows are filed under `default`.
                0 => w.hook(seq, None, 32, &rows, *archive).unwrap(),
                // The hook does not decode.
                1 => {
                    w.raw_hook(seq, b"\xffnot an envelope".to_vec()).unwrap();
                    w.hook(seq, None, 16, &rows, *archive).unwrap();
                }
                _ => w.hook(seq, Some(&env), 64, &rows, *archive).unwrap(),
            }
        }
        w.store.flush().unwrap();
        drop(w);
        let store = Store::open(&data, &OpenOptions::default()).unwrap();
        let out = migrate_all(&store);
        proptest::prop_assert!(matches!(out, Outcome::Done { format: 3, .. }), "{out:?}");
        proptest::prop_assert!(fold::verify(&store).unwrap().is_empty(), "counters differ from the fold");
        let count = |f: Family| store.scan_family(f).unwrap().count();
        proptest::prop_assert_eq!(count(Family::Due) + count(Family::Inflight) + count(Family::Dead), rows_written);
        proptest::prop_assert_eq!(count(Family::Dead), count(Family::DeadByTenant));
        proptest::prop_assert_eq!(count(Family::Archive), obligations);
        let c = counters::node(&store).unwrap();
        proptest::prop_assert_eq!(c.archive_pending as usize, obligations);
    }
}
