//! Crash tests: the real binary, killed with SIGKILL under load.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_relay::queue::deliveries::{self, DueRow, Envelope, InflightRow};
use ankusa_relay::queue::{fold, tenants};
use ankusa_relay::store::keys::Family;
use ankusa_relay::store::{OpenOptions, Store};

use crate::support::*;

fn yaml(data: &std::path::Path, admin: u16, ingest: u16) -> String {
    format!(
        r#"
data_dir: {}
ingest:
  listen: 127.0.0.1:{ingest}
admin:
  listen: 127.0.0.1:{admin}
  tokens: {ADMIN_TOKENS_YAML}
sinks:
  - {{ id: a, url: "http://127.0.0.1:9/a" }}
  - {{ id: b, url: "http://127.0.0.1:9/b" }}
routes:
  - {{ id: both, sinks: [a, b] }}
sources:
  - id: shared
    tenant: {{ header: x-tenant }}
    verify: {{ scheme: none }}
    route: both
"#,
        data.display()
    )
}

#[test]
fn every_acked_hook_survives_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    let (admin, ingest) = (free_port(), free_port());
    let mut node = Proc::start(dir.path(), &yaml(&data, admin, ingest), admin);

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
    let node = Proc::start(dir.path(), &yaml(&data, admin, ingest), admin);
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
                (ankusa_relay::store::keys::decode_hook(&k).unwrap().0, env),
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
    sink: crate::dispatch::TestSink,
    dir: tempfile::TempDir,
    data: std::path::PathBuf,
    admin: u16,
    ingest: u16,
    yaml: String,
}

impl SinkNode {
    fn new(delay_ms: u64, sink_timeout_ms: u64, extra: &str) -> SinkNode {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sink = rt.block_on(crate::dispatch::TestSink::start());
        sink.delay_ms
            .store(delay_ms, std::sync::atomic::Ordering::Relaxed);
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("db");
        let (admin, ingest) = (free_port(), free_port());
        let yaml = format!(
            r#"
data_dir: {}
ingest: {{ listen: "127.0.0.1:{ingest}" }}
admin: {{ listen: "127.0.0.1:{admin}", tokens: {ADMIN_TOKENS_YAML} }}
dispatch: {{ tick_interval_ms: 10 }}
{extra}
sinks: [{{ id: s, url: "{}", timeout_ms: {sink_timeout_ms} }}]
routes: [{{ id: r, sinks: [s] }}]
sources:
  - {{ id: in, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: r }}
"#,
            data.display(),
            sink.url("/s")
        );
        SinkNode {
            rt,
            sink,
            dir,
            data,
            admin,
            ingest,
            yaml,
        }
    }

    fn start(&self) -> Proc {
        Proc::start(self.dir.path(), &self.yaml, self.admin)
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
    fn received(&self) -> Vec<crate::dispatch::Received> {
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
        let c = ankusa_relay::queue::counters::node(&store).unwrap();
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

/// SIGTERM, and wait for the process to exit on its own (`within`).
fn sigterm(node: &mut Proc, within: Duration) -> std::process::ExitStatus {
    let pid = node.child.id().to_string();
    let ok = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()
        .unwrap();
    assert!(ok.success());
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(status) = node.child.try_wait().unwrap() {
            return status;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the node did not stop within {within:?} of SIGTERM"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
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
        let status = sigterm(&mut node, Duration::from_secs(15));
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
    let status = sigterm(&mut node, Duration::from_secs(15));
    assert!(status.success());
    let store = Store::open(&n.data, &OpenOptions::default()).unwrap();
    let c = ankusa_relay::queue::counters::node(&store).unwrap();
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
    let status = sigterm(&mut node, Duration::from_secs(10));
    assert!(status.success(), "{status}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "the stop took {:?} with a 1 s grace",
        started.elapsed()
    );
    {
        let store = Store::open(&n.data, &OpenOptions::default()).unwrap();
        let c = ankusa_relay::queue::counters::node(&store).unwrap();
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
