//! Crash tests: the real binary, killed with SIGKILL under load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_keyspace::Family;
use ankusa_queue::deliveries::{self, DueRow, InflightRow};
use ankusa_queue::{fold, tenants};
use ankusa_records::Envelope;
use ankusa_store::{OpenOptions, Rows, Store};

use ankusa_relay::testkit::NodeBuilder;

use crate::support::*;

/// A node whose two sinks never answer: every acked hook stays queued, twice.
fn two_dead_sinks() -> NodeBuilder {
    proc_node()
        .sink("a", "http://127.0.0.1:9/a")
        .sink("b", "http://127.0.0.1:9/b")
        .route("both", &["a", "b"])
        .open_source("shared", "both")
}

#[test]
fn every_acked_hook_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let spec = two_dead_sinks();
    let (admin, ingest) = (spec.admin_port().unwrap(), spec.ingest_port().unwrap());
    let mut node = Proc::start(dir.path(), &spec);

    let acked: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let load = {
        let acked = acked.clone();
        rt.spawn(async move {
            let c = client();
            let url = format!("http://127.0.0.1:{ingest}/ingest/shared");
            let tasks: Vec<_> = (0..32)
                .map(|w| {
                    let (c, url, acked) = (c.clone(), url.clone(), acked.clone());
                    tokio::spawn(async move {
                        for n in 0.. {
                            let tenant = format!("tenant-{}", (w * 7 + n) % 40);
                            let body = format!(r#"{{"w":{w},"n":{n}}}"#);
                            match try_post(&c, &url, &[("x-tenant", tenant.clone())], body).await {
                                Some(r) if r.status == 202 => {
                                    let id = r.json()["id"].as_str().unwrap().to_owned();
                                    acked.lock().unwrap().push((id, tenant));
                                }
                                Some(_) => {}
                                None => return,
                            }
                        }
                    })
                })
                .collect();
            for t in tasks {
                let _ = t.await;
            }
        })
    };
    // Let the load run, then kill the node mid-commit.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while acked.lock().unwrap().len() < 3_000 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    node.kill9();
    rt.block_on(load).unwrap();
    let acked = acked.lock().unwrap().clone();
    assert!(
        acked.len() >= 3_000,
        "only {} hooks acked before the kill",
        acked.len()
    );

    // The restarted binary boots on the crashed store and reports the same counters.
    let node = Proc::start(dir.path(), &spec);
    let (status, body) = http_get_admin(admin, "/v1/node").unwrap();
    assert_eq!(status, 200);
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    drop(node);

    let store = Store::open(&data, &OpenOptions::default()).unwrap();
    let hooks: HashMap<String, (u64, Envelope)> = store
        .scan_family(Family::Hooks)
        .unwrap()
        .map(|kv| {
            let (k, v) = kv.unwrap();
            let env = Envelope::decode(&v).unwrap();
            (
                env.id.clone(),
                (ankusa_keyspace::decode_hook(&k).unwrap().0, env),
            )
        })
        .collect();
    // Each acked hook has one row per sink under its tenant's ordinal: due, or (the node
    // delivers to an unreachable sink meanwhile) inflight or dead.
    let mut rows: HashMap<(u32, u64), usize> = HashMap::new();
    for kv in store.scan_family(Family::Due).unwrap() {
        let (k, v) = kv.unwrap();
        let r = DueRow::decode(&k, &v).unwrap();
        *rows.entry((r.key.ord.0, r.key.seq.0)).or_default() += 1;
    }
    for kv in store.scan_family(Family::Inflight).unwrap() {
        let (k, v) = kv.unwrap();
        let r = InflightRow::decode(&k, &v).unwrap();
        *rows.entry((r.key.ord.0, r.key.seq.0)).or_default() += 1;
    }
    for r in deliveries::dead_page(&store, None, usize::MAX)
        .unwrap()
        .rows
    {
        *rows.entry((r.value.ord.0, r.key.seq.0)).or_default() += 1;
    }
    for (id, tenant) in &acked {
        let (seq, env) = hooks
            .get(id)
            .unwrap_or_else(|| panic!("acked hook {id} is missing after kill -9"));
        assert_eq!(env.tenant.as_deref(), Some(tenant.as_str()));
        let ord = tenants::ord(&store, tenant)
            .unwrap()
            .expect("tenant ordinal");
        assert_eq!(
            rows.get(&(ord.0, *seq)).copied().unwrap_or(0),
            2,
            "hook {id} lacks a row per sink under its tenant's ordinal"
        );
    }
    assert!(
        fold::verify(&store).unwrap().is_empty(),
        "counters differ from the fold"
    );
    let c = &status["counters"];
    let rows_counted = queued_rows(c);
    assert_eq!(rows_counted, 2 * hooks.len() as i64);
}

/// A node (the real binary) delivering to one local sink at `/s`, whose answers are held
/// `delay_ms`; `extra` is more configuration (YAML lines).
struct SinkNode {
    rt: tokio::runtime::Runtime,
    sink: ankusa_relay::testkit::TestSink,
    dir: tempfile::TempDir,
    data: std::path::PathBuf,
    admin: u16,
    ingest: u16,
    spec: NodeBuilder,
}

impl SinkNode {
    fn new(delay_ms: u64, sink_timeout_ms: u64, extra: &str) -> SinkNode {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sink = rt.block_on(ankusa_relay::testkit::TestSink::start());
        sink.delay_ms
            .store(delay_ms, std::sync::atomic::Ordering::Relaxed);
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("db");
        let spec = proc_node()
            .section("dispatch: { tick_interval_ms: 10 }")
            .section(extra)
            .sink_yaml(&format!(
                r#"{{ id: s, url: "{}", timeout_ms: {sink_timeout_ms} }}"#,
                sink.url("/s")
            ))
            .route("r", &["s"])
            .open_source("in", "r");
        SinkNode {
            rt,
            sink,
            dir,
            data,
            admin: spec.admin_port().unwrap(),
            ingest: spec.ingest_port().unwrap(),
            spec,
        }
    }

    fn start(&self) -> Proc {
        Proc::start(self.dir.path(), &self.spec)
    }

    /// Posts `n` hooks over `tenants` tenants; their ids.
    fn ingest(&self, n: usize, tenants: usize) -> Vec<String> {
        self.rt.block_on(async {
            let c = client();
            let mut ids = Vec::new();
            for i in 0..n {
                let r = post(
                    &c,
                    &format!("http://127.0.0.1:{}/ingest/in", self.ingest),
                    &[("x-tenant", format!("t{}", i % tenants))],
                    format!(r#"{{"i":{i}}}"#),
                )
                .await;
                assert_eq!(r.status, 202);
                ids.push(r.json()["id"].as_str().unwrap().to_owned());
            }
            ids
        })
    }

    /// What the sink has received.
    fn received(&self) -> Vec<ankusa_relay::testkit::Received> {
        self.sink.on("/s")
    }

    fn set_delay(&self, ms: u64) {
        self.sink
            .delay_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }
}

#[test]
fn inflight_rows_are_recovered_after_kill_9() {
    let n = SinkNode::new(30_000, 60_000, "retry: { schedule_ms: [50], jitter: none }");
    let (data, admin) = (&n.data, n.admin);
    let mut node = n.start();
    let ids = n.ingest(60, 3);
    // Deliveries are held by the slow sink: they are inflight in the store.
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while n.received().len() < 60 {
        assert!(
            std::time::Instant::now() < deadline,
            "the node never claimed the rows"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    node.kill9();
    {
        let store = Store::open(data, &OpenOptions::default()).unwrap();
        let c = ankusa_queue::counters::node(&store).unwrap();
        assert_eq!(
            c.inflight, 60,
            "the kill should leave the claimed rows inflight"
        );
        assert!(fold::verify(&store).unwrap().is_empty());
    }
    // Restart with a sink that answers at once: every hook arrives at least once.
    n.set_delay(0);
    let node = n.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got: std::collections::BTreeSet<String> = n
            .received()
            .iter()
            .map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned())
            .collect();
        if ids.iter().all(|id| got.contains(id)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not every hook was redelivered"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Let the outcomes commit, then look at the store.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let (_, body) = http_get_admin(admin, "/v1/node").unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        let c = &v["counters"];
        if c["pending"] == 0 && c["inflight"] == 0 && c["scheduled"] == 0 {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the queue never settled: {c}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(node);
    let store = Store::open(data, &OpenOptions::default()).unwrap();
    assert!(
        fold::verify(&store).unwrap().is_empty(),
        "counters differ from the fold"
    );
}

/// A rolling update is a SIGTERM: a node stopped that way while a backlog drains, and
/// started again, four times over, delivers every hook exactly once.
#[test]
fn repeated_sigterm_while_a_backlog_drains_delivers_every_hook_exactly_once() {
    // Slow while the hooks arrive, so a backlog builds; then 20 ms an answer.
    let n = SinkNode::new(
        2_000,
        10_000,
        "shutdown: { grace_ms: 5000 }\nretry: { schedule_ms: [50], jitter: none }",
    );
    let mut node = n.start();
    let ids = n.ingest(3_000, 50);
    let received = |n: &SinkNode| -> HashMap<String, usize> {
        let mut got = HashMap::new();
        for r in n.received() {
            *got.entry(r.headers["webhook-id"].to_str().unwrap().to_owned())
                .or_default() += 1;
        }
        got
    };
    n.set_delay(20);
    for _ in 0..4 {
        std::thread::sleep(Duration::from_millis(100));
        let status = node.stop(Duration::from_secs(15));
        assert!(status.success(), "a graceful stop exits 0: {status}");
        node = n.start();
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while received(&n).len() < ids.len() {
        assert!(
            std::time::Instant::now() < deadline,
            "only {} of {} hooks arrived",
            received(&n).len(),
            ids.len()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let got = received(&n);
    let twice: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        twice.is_empty(),
        "{} hooks arrived more than once after SIGTERMs, e.g. {:?}",
        twice.len(),
        twice.iter().take(3).collect::<Vec<_>>()
    );
    assert!(ids.iter().all(|id| got.contains_key(id)));
    let status = node.stop(Duration::from_secs(15));
    assert!(status.success());
    let store = Store::open(&n.data, &OpenOptions::default()).unwrap();
    let c = ankusa_queue::counters::node(&store).unwrap();
    assert_eq!(
        (c.pending, c.scheduled, c.inflight, c.dead),
        (0, 0, 0, 0),
        "{c:?}"
    );
    assert!(fold::verify(&store).unwrap().is_empty());
}

/// Deliveries still in flight when `shutdown.grace_ms` runs out are cut: the node exits
/// in time, their rows are due again (nothing left inflight), and a restart delivers them.
#[test]
fn a_stop_cuts_deliveries_at_its_grace_and_makes_them_due_again() {
    let n = SinkNode::new(60_000, 120_000, "shutdown: { grace_ms: 1000 }");
    let mut node = n.start();
    n.ingest(20, 2);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while n.received().len() < 20 {
        assert!(std::time::Instant::now() < deadline, "never claimed");
        std::thread::sleep(Duration::from_millis(20));
    }
    let started = std::time::Instant::now();
    let status = node.stop(Duration::from_secs(10));
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stop took {:?} with a 1 s grace",
        started.elapsed()
    );
    {
        let store = Store::open(&n.data, &OpenOptions::default()).unwrap();
        let c = ankusa_queue::counters::node(&store).unwrap();
        assert_eq!((c.inflight, c.pending + c.scheduled), (0, 20), "{c:?}");
        assert!(fold::verify(&store).unwrap().is_empty());
    }
    n.set_delay(0);
    let _node = n.start();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while n.received().len() < 40 {
        assert!(
            std::time::Instant::now() < deadline,
            "the cut deliveries were not made again"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A node on a store of `rows` dead rows whose sink refuses connections and retries once
/// an hour: a revived row moves (due → inflight → scheduled) but never leaves the queue,
/// so "every row is somewhere, once" is `queued_rows == rows`.
struct DeadStore {
    dir: tempfile::TempDir,
    data: std::path::PathBuf,
    admin: u16,
    spec: NodeBuilder,
}

impl DeadStore {
    fn new(rows: u64, tenants: u64) -> DeadStore {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("db");
        crate::seed::store_with_dead(&data, rows, tenants, "it", 2);
        let spec = proc_node()
            .section("retry: { schedule_ms: [3600000], jitter: none }")
            .sink_yaml(r#"{ id: s, url: "http://127.0.0.1:9/refused", timeout_ms: 1000 }"#)
            .route("r", &["s"]);
        DeadStore {
            dir,
            data,
            admin: spec.admin_port().unwrap(),
            spec,
        }
    }

    fn start(&self) -> Proc {
        Proc::start(self.dir.path(), &self.spec)
    }

    fn counters(&self) -> serde_json::Value {
        let (status, body) = http_get_admin(self.admin, "/v1/node").unwrap();
        assert_eq!(status, 200, "{body}");
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["counters"].clone()
    }

    /// Starts `method path` in a thread and SIGKILLs the node once the dead count has
    /// fallen by `by` (the operation is under way, not finished).
    fn kill_during(
        &self,
        node: &mut Proc,
        method: &'static str,
        path: String,
        body: &'static str,
        by: i64,
    ) {
        let start = self.counters()["dead"].as_i64().unwrap();
        let admin = self.admin;
        let call = std::thread::spawn(move || {
            http_admin(admin, method, &path, body, Duration::from_secs(120))
        });
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        loop {
            let dead = self.counters()["dead"].as_i64().unwrap();
            if dead <= start - by {
                assert!(
                    dead > 0,
                    "the operation finished before the kill: make it longer"
                );
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the operation never moved ({dead} dead)"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        node.kill9();
        // The call saw its connection cut (or, at the very end, its answer).
        let _ = call.join().unwrap();
    }

    /// `method path` with the admin token: its 200 answer, as JSON.
    fn call(&self, method: &str, path: &str, body: &str) -> serde_json::Value {
        let (status, body) =
            http_admin(self.admin, method, path, body, Duration::from_secs(120)).unwrap();
        assert_eq!(status, 200, "{method} {path}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    /// `store verify`: the counters equal a fold of the families.
    fn assert_counters_equal_a_fold(&self) {
        let out = run(&["store", "verify", "--data", self.data.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "store verify: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

/// A replay of every dead row: path and body.
const REPLAY_ALL: (&str, &str) = ("/v1/dlq/replay", r#"{"from_ms":0}"#);
/// A purge of every row of the only tenant.
const PURGE_ALL: &str = "/v1/tenants/tenant-0/queue?kinds=pending,dead";

#[test]
fn kill_9_during_a_replay_of_100000_rows_leaves_each_row_moved_once() {
    const ROWS: i64 = 100_000;
    let s = DeadStore::new(ROWS as u64, 1_000);
    let mut node = s.start();
    s.kill_during(&mut node, "POST", REPLAY_ALL.0.into(), REPLAY_ALL.1, 5_000);
    s.assert_counters_equal_a_fold();
    let node = s.start();
    let c = s.counters();
    let dead = c["dead"].as_i64().unwrap();
    assert!(dead > 0 && dead < ROWS, "{c}");
    assert_eq!(queued_rows(&c), ROWS, "every row is somewhere, once: {c}");
    // Replayed again, exactly the rows the cut replay had not revived are revived.
    let v = s.call("POST", REPLAY_ALL.0, REPLAY_ALL.1);
    assert_eq!(v["revived"].as_i64().unwrap(), dead, "{v}");
    let c = s.counters();
    assert_eq!(c["dead"], 0, "{c}");
    assert_eq!(queued_rows(&c), ROWS, "{c}");
    drop(node);
    s.assert_counters_equal_a_fold();
}

#[test]
fn kill_9_during_a_purge_of_100000_rows_leaves_each_row_purged_once() {
    const ROWS: i64 = 100_000;
    let s = DeadStore::new(ROWS as u64, 1);
    let mut node = s.start();
    s.kill_during(&mut node, "DELETE", PURGE_ALL.into(), "", 5_000);
    s.assert_counters_equal_a_fold();
    let node = s.start();
    let c = s.counters();
    let dead = c["dead"].as_i64().unwrap();
    assert!(dead > 0 && dead < ROWS, "{c}");
    assert_eq!(queued_rows(&c), dead, "only dead rows: {c}");
    // Purged again, exactly the rest goes.
    let v = s.call("DELETE", PURGE_ALL, "");
    assert_eq!(v["dead"].as_i64().unwrap(), dead, "{v}");
    assert_eq!(queued_rows(&s.counters()), 0);
    drop(node);
    s.assert_counters_equal_a_fold();
}

fn names_in(dir: &std::path::Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

#[test]
fn kill_9_during_a_backup_leaves_no_archive_but_a_whole_one_and_the_next_boot_clears_the_rest() {
    let s = DeadStore::new(100_000, 1_000);
    let mut node = s.start();
    let backups = s.data.with_extension("backups");
    let admin = s.admin;
    let call = std::thread::spawn(move || {
        http_admin(admin, "POST", "/v1/backups", "", Duration::from_secs(120))
    });
    // Kill as soon as the archive is being packed.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !names_in(&backups).iter().any(|n| n.ends_with(".tar.tmp")) {
        assert!(!call.is_finished(), "the backup finished before the kill");
        assert!(std::time::Instant::now() < deadline, "no backup started");
        std::thread::sleep(Duration::from_millis(1));
    }
    node.kill9();
    let _ = call.join().unwrap();
    let left = names_in(&backups);
    assert!(
        !left.iter().any(|n| n.ends_with(".tar.zst")),
        "a cut backup is never an archive: {left:?}"
    );
    assert!(
        left.iter()
            .any(|n| n.ends_with(".tar.tmp") || n.ends_with(".checkpoint")),
        "{left:?}"
    );
    // The next boot removes the half-packed archive and the checkpoint's hard links.
    let _node = s.start();
    assert_eq!(names_in(&backups), Vec::<String>::new());
    // And backs up whole, restorably.
    let (status, body) =
        http_admin(s.admin, "POST", "/v1/backups", "", Duration::from_secs(120)).unwrap();
    assert_eq!(status, 200, "{body}");
    let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let archive = backups.join(format!("{id}.tar.zst"));
    let restored = s.dir.path().join("restored");
    let out = run(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--data",
        restored.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let out = run(&["store", "verify", "--data", restored.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn a_cut_restore_leaves_a_directory_no_command_opens() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    store_with_hooks(&data, 5_000);
    let archive = dir.path().join("whole.tar.zst");
    ankusa_store::tarball::pack(&data, &archive).unwrap();
    // The archive cut half-way, as a killed copy or restore leaves it.
    let bytes = std::fs::read(&archive).unwrap();
    let cut = dir.path().join("cut.tar.zst");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let half = dir.path().join("half");
    let out = run(&[
        "restore",
        "--from",
        cut.to_str().unwrap(),
        "--data",
        half.to_str().unwrap(),
    ]);
    assert!(!out.status.success());
    assert!(!names_in(&half).is_empty(), "the cut restore wrote files");
    for args in [
        vec!["store", "inspect", "--data", half.to_str().unwrap()],
        vec!["store", "verify", "--data", half.to_str().unwrap()],
    ] {
        let out = run(&args);
        assert!(
            !out.status.success(),
            "{args:?} opened a half-restored store"
        );
        assert!(
            text(&out.stderr).contains("a restore into it did not finish"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
    let cfg = dir.path().join("relay.yaml");
    std::fs::write(
        &cfg,
        format!(
            "data_dir: {}\ningest: {{ listen: \"127.0.0.1:0\" }}\nadmin: {{ listen: \"127.0.0.1:0\" }}\n",
            half.display()
        ),
    )
    .unwrap();
    let out = run(&["run", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success(), "run opened a half-restored store");
    assert!(
        text(&out.stderr).contains("a restore into it did not finish"),
        "{}",
        text(&out.stderr)
    );
    // The whole archive restores, and no marker is left.
    let whole = dir.path().join("whole");
    let out = run(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--data",
        whole.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(!names_in(&whole).contains(&ankusa_tarball::RESTORING_MARKER.to_owned()));
}

#[test]
fn kill_9_during_an_erase_resumes_it_at_the_next_boot_and_leaves_no_key_behind() {
    const ROWS: i64 = 100_000;
    let s = DeadStore::new(ROWS as u64, 2);
    let mut node = s.start();
    s.kill_during(
        &mut node,
        "DELETE",
        "/v1/tenants/tenant-0?confirm=tenant-0".into(),
        "",
        5_000,
    );
    s.assert_counters_equal_a_fold();
    let node = s.start();
    // The erase goes on by itself: the tenant is refused until it ends, then gone.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (status, body) = http_get_admin(s.admin, "/v1/tenants/tenant-0").unwrap();
        if status == 404 {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert!(v["erasing_since_ms"].is_u64(), "{v}");
        assert!(
            std::time::Instant::now() < deadline,
            "the erase never ended: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let c = s.counters();
    assert_eq!(queued_rows(&c), ROWS / 2, "tenant-1's rows stay: {c}");
    drop(node);
    s.assert_counters_equal_a_fold();
    let store = ankusa_store::Store::open(&s.data, &ankusa_store::OpenOptions::default()).unwrap();
    let ord = ankusa_keyspace::TenantOrd(1);
    assert_eq!(ankusa_queue::tenants::name(&store, ord).unwrap(), None);
    let left = ankusa_queue::testkit::keys_of_tenant(&store, ord, "tenant-0");
    assert!(left.is_empty(), "{}", left[..left.len().min(20)].join("\n"));
}
