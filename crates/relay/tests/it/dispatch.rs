//! Delivery end to end: a node with a real store delivering to a real axum sink on
//! 127.0.0.1.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ankusa_keyspace::Cf;
use ankusa_keyspace::Family;
use ankusa_queue::counters::Counters;
use ankusa_queue::deliveries::{self, PurgeKinds};
use ankusa_queue::{counters, fold, tenants};
use ankusa_relay::node::Node;
use ankusa_relay::testkit::{eventually, NodeBuilder, TestNode, TestSink};
use ankusa_store::{Op, Rows};
use ankusa_verify::{standard_webhooks_key, Verifier};

use crate::support::*;

const SINK_SECRET: &str = "whsec_c2luay1zZWNyZXQtZm9yLXRoZS10ZXN0cw==";

/// A node on a store under `dir`, listening on ephemeral loopback ports; `rest` is the
/// rest of its configuration.
async fn start_node(dir: &std::path::Path, rest: &str) -> Node {
    start(NodeBuilder::default().section(rest), dir).await
}

/// [`start_node`] with the tests' admin token.
async fn start_node_with_admin(dir: &std::path::Path, rest: &str) -> Node {
    start(
        NodeBuilder::default()
            .admin_token("it", ADMIN_TOKEN)
            .section(rest),
        dir,
    )
    .await
}

async fn start(b: NodeBuilder, dir: &std::path::Path) -> Node {
    Node::start(b.config_at(dir)).await.unwrap()
}

/// Posts `hooks` hooks of `tenant` to `url` from 16 concurrent clients, each acked.
async fn backlog(c: &Client, url: &str, tenant: &str, hooks: usize) {
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let (c, url, tenant) = (c.clone(), url.to_owned(), tenant.to_owned());
            tokio::spawn(async move {
                for n in (w..hooks).step_by(16) {
                    let body = format!(r#"{{"{tenant}":{n}}}"#);
                    let r = post(&c, &url, &[("x-tenant", tenant.clone())], body).await;
                    assert_eq!(r.status, 202);
                }
            })
        })
        .collect();
    for w in workers {
        w.await.unwrap();
    }
}

/// The delivery tests' node: sinks `a` (signed, with an extra header), `b`, `c` and
/// `lenient` (no dead letter on a 4xx) on `sink`, route `main` to `route_sinks`, source `in`
/// (tenant from `x-tenant`, no verification) and `sources`.
fn builder(sink: &TestSink, route_sinks: &[&str], sources: &[&str]) -> NodeBuilder {
    let mut b = TestNode::builder()
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [60, 120, 240], max_attempts: 4, jitter: none }")
        .section("reclaim: { interval_ms: 30 }")
        .sink_yaml(&format!(
            r#"{{ id: a, url: "{}", secret: {{ value: "{SINK_SECRET}" }}, headers: {{ x-extra: "yes" }} }}"#,
            sink.url("/a")
        ))
        .sink("b", &sink.url("/b"))
        .sink("c", &sink.url("/c"))
        .sink_yaml(&format!(
            r#"{{ id: lenient, url: "{}", dead_letter_on_4xx: false }}"#,
            sink.url("/lenient")
        ))
        .route("main", route_sinks)
        .open_source("in", "main");
    for s in sources {
        b = b.source_yaml(s);
    }
    b
}

/// A node delivering to one scriptable sink, and a client for its listeners.
struct NodeAndSink {
    node: TestNode,
    sink: TestSink,
    c: Client,
}

impl NodeAndSink {
    async fn start(route_sinks: &[&str], sources: &[&str]) -> NodeAndSink {
        let sink = TestSink::start().await;
        let node = builder(&sink, route_sinks, sources).start().await;
        NodeAndSink {
            node,
            sink,
            c: client(),
        }
    }

    async fn send(&self, tenant: &str, body: &str) -> String {
        let r = post(
            &self.c,
            &format!("http://{}/ingest/in", self.node.ingest_addr),
            &[
                ("x-tenant", tenant.to_owned()),
                ("content-type", "application/vnd.test+json".to_owned()),
            ],
            body.to_owned(),
        )
        .await;
        assert_eq!(r.status, 202);
        r.json()["id"].as_str().unwrap().to_owned()
    }

    fn node_counts(&self) -> Counters {
        counters::node(&self.node.store).unwrap()
    }

    fn hooks(&self) -> usize {
        self.node.store.scan_family(Family::Hooks).unwrap().count()
    }

    async fn settled(&self) {
        eventually(20, "the queue to settle", || {
            let c = self.node_counts();
            c.pending == 0 && c.scheduled == 0 && c.inflight == 0
        })
        .await;
        assert!(fold::verify(&self.node.store).unwrap().is_empty());
    }
}

/// The writer's commit wakes the pipeline: a hook ingested into an idle node reaches its
/// sink in milliseconds, though the tick interval is a second. (With the starts at commit
/// off: the wake-up is the path of every row that waits in the store.)
#[tokio::test]
async fn a_fresh_hook_is_delivered_from_the_writers_wake_up_not_the_tick() {
    let sink = TestSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rest = one_sink(&sink, "tick_interval_ms: 1000, start_at_commit: false", "");
    let node = start_node(dir.path(), &rest).await;
    let lags = spaced_hooks(&node, &sink).await;
    // The median is what the wake-up gives; every hook well under one tick, whatever a
    // busy test machine does to one of them.
    assert!(
        lags[3] < Duration::from_millis(50),
        "ack to arrival: {lags:?}"
    );
    assert!(
        lags[6] < Duration::from_millis(500),
        "ack to arrival: {lags:?}"
    );
    let m = node.metrics.encode();
    assert!(
        m.contains(r#"ankusa_dispatch_ticks_total{scan="hinted"}"#),
        "{m}"
    );
    node.shutdown().await.unwrap();
}

/// Waits for the node's first tick: it finds nothing due at boot and opens the gate of the
/// starts at the commit.
async fn first_tick(node: &Node) {
    eventually(10, "the first dispatch tick", || {
        node.metrics
            .encode()
            .contains(r#"ankusa_dispatch_ticks_total{scan="full"}"#)
    })
    .await;
}

/// Seven hooks of three tenants, 150 ms apart (the pipeline idle on its timer when each
/// arrives), each delivered to `/a` before the next: their ack-to-arrival times, sorted.
async fn spaced_hooks(node: &Node, sink: &TestSink) -> Vec<Duration> {
    let c = client();
    let mut lags = Vec::new();
    for i in 0..7 {
        tokio::time::sleep(Duration::from_millis(150)).await;
        let r = post(
            &c,
            &format!("http://{}/ingest/in", node.ingest_addr),
            &[("x-tenant", format!("t{}", i % 3))],
            format!(r#"{{"n":{i}}}"#),
        )
        .await;
        let acked = Instant::now();
        assert_eq!(r.status, 202);
        eventually(5, "the hook delivered", || sink.on("/a").len() > i).await;
        lags.push(sink.on("/a")[i].at.saturating_duration_since(acked));
    }
    lags.sort();
    lags
}

/// The configuration of a node with one sink `a` (its `dispatch` keys and more keys of the
/// sink as given), route `main` and source `in` (tenant from `x-tenant`, no verification).
fn one_sink(sink: &TestSink, dispatch: &str, sink_keys: &str) -> String {
    format!(
        r#"
dispatch: {{ {dispatch} }}
sinks: [{{ id: a, url: "{a}"{sink_keys} }}]
routes: [{{ id: main, sinks: [a] }}]
sources: [{{ id: in, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: main }}]
"#,
        a = sink.url("/a"),
    )
}

/// A node whose pipeline has caught up starts a fresh hook's delivery at its ingest
/// commit: no tick claims it (none is due for a second), it reaches the sink in
/// milliseconds, and the store never holds a due row or a marker for it.
#[tokio::test]
async fn a_fresh_hook_into_a_caught_up_node_starts_at_its_commit_with_no_tick() {
    let sink = TestSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rest = one_sink(&sink, "tick_interval_ms: 1000", "");
    let node = start_node(dir.path(), &rest).await;
    first_tick(&node).await;
    let lags = spaced_hooks(&node, &sink).await;
    assert!(
        lags[3] < Duration::from_millis(50),
        "ack to arrival: {lags:?}"
    );
    let m = node.metrics.encode();
    assert_eq!(
        metric(&m, "ankusa_dispatch_started_at_commit_total"),
        7.0,
        "{m}"
    );
    assert_eq!(metric(&m, "ankusa_dispatch_claimed_total"), 0.0, "{m}");
    assert!(
        !m.contains(r#"ankusa_dispatch_ticks_total{scan="hinted"}"#),
        "no hint was needed: {m}"
    );
    eventually(5, "the queue to settle", || {
        let c = counters::node(&node.store).unwrap();
        c.pending == 0 && c.inflight == 0
    })
    .await;
    assert!(fold::verify(&node.store).unwrap().is_empty());
    // No marker was ever written: the active index is empty.
    let now = ankusa_keyspace::AtMs(ankusa_keyspace::now_ms() + 60_000);
    assert!(deliveries::active_tenants(&node.store, now, 4096)
        .unwrap()
        .is_empty());
    node.shutdown().await.unwrap();
}

/// A start refused for want of a slot closes the gate: the rows after it are written due
/// and claimed by ticks in their turn, none overtakes the rows waiting before it, and once
/// the pipeline has caught up again fresh hooks start at their commit once more.
#[tokio::test]
async fn once_a_start_is_refused_fresh_rows_queue_behind_the_waiting_ones() {
    let sink = TestSink::start().await;
    sink.delay_ms.store(300, Ordering::Relaxed);
    let dir = tempfile::tempdir().unwrap();
    let rest = one_sink(&sink, "tick_interval_ms: 20", ", max_inflight: 1");
    let node = start_node(dir.path(), &rest).await;
    let c = client();
    let url = format!("http://{}/ingest/in", node.ingest_addr);
    first_tick(&node).await;
    for n in 0..8 {
        let r = post(
            &c,
            &url,
            &[("x-tenant", "t".to_owned())],
            format!(r#"{{"n":{n}}}"#),
        )
        .await;
        assert_eq!(r.status, 202);
    }
    eventually(20, "every hook delivered", || sink.on("/a").len() >= 8).await;
    let order: Vec<String> = sink
        .on("/a")
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    let sent: Vec<String> = (0..8).map(|n| format!(r#"{{"n":{n}}}"#)).collect();
    assert_eq!(
        order, sent,
        "one tenant's hooks arrive in the order they were sent"
    );
    let m = node.metrics.encode();
    let (started, claimed) = (
        metric(&m, "ankusa_dispatch_started_at_commit_total"),
        metric(&m, "ankusa_dispatch_claimed_total"),
    );
    // The sink takes one request and holds one more in line: the rest waited in the store.
    assert!(
        (1.0..=2.0).contains(&started),
        "started {started}, claimed {claimed}"
    );
    assert_eq!(started + claimed, 8.0, "{m}");
    // Caught up again: the next hook starts at its commit.
    eventually(5, "the queue to settle", || {
        let c = counters::node(&node.store).unwrap();
        c.pending == 0 && c.inflight == 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let r = post(&c, &url, &[("x-tenant", "t".to_owned())], "{}".to_owned()).await;
    assert_eq!(r.status, 202);
    eventually(5, "the last hook delivered", || sink.on("/a").len() >= 9).await;
    let m = node.metrics.encode();
    assert_eq!(
        metric(&m, "ankusa_dispatch_started_at_commit_total"),
        started + 1.0,
        "{m}"
    );
    assert!(fold::verify(&node.store).unwrap().is_empty());
    node.shutdown().await.unwrap();
}

/// A hook that no longer decodes when its retry comes due is corruption, not an orphan:
/// its delivery is not sent and not dropped but dead-lettered with the error, the
/// corruption is counted under `family="hooks"`, other hooks keep flowing, and once the
/// bytes are whole again a replay delivers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_hook_is_never_read_as_gone_by_the_claim() {
    let sink = TestSink::start().await;
    let node = TestNode::builder()
        .admin_token("it", ADMIN_TOKEN)
        .section("dispatch: { tick_interval_ms: 50 }")
        .section("retry: { schedule_ms: [600], max_attempts: 5, jitter: none }")
        .sink("a", &sink.url("/a"))
        .route("main", &["a"])
        .open_source("in", "main")
        .start()
        .await;
    let c = client();
    sink.script("/a", &[(503, None)]);
    let send = |tenant: &str| {
        let (c, url, tenant) = (c.clone(), node.ingest_url("in"), tenant.to_owned());
        async move {
            let r = post(&c, &url, &[("x-tenant", tenant)], "{}").await;
            assert_eq!(r.status, 202);
            r.json()["id"].as_str().unwrap().to_owned()
        }
    };
    let id = send("t").await;
    eventually(5, "the first attempt, then a retry scheduled", || {
        sink.on("/a").len() == 1 && counters::node(&node.store).unwrap().scheduled == 1
    })
    .await;
    let (key, whole) = node
        .store
        .scan_family(Family::Hooks)
        .unwrap()
        .next()
        .expect("the hook")
        .unwrap();
    let put = |v: Vec<u8>| {
        node.store
            .write(vec![Op::put(Cf::Hooks, key.clone(), v)], true)
            .unwrap();
    };
    put(vec![0xff]);
    // When the retry comes due: dead-lettered, not sent; another tenant's hook still goes.
    eventually(5, "the corrupt hook's row dead-lettered", || {
        counters::node(&node.store).unwrap().dead == 1
    })
    .await;
    send("u").await;
    eventually(5, "the other hook delivered and settled", || {
        let counts = counters::node(&node.store).unwrap();
        sink.on("/a").len() == 2 && counts.pending + counts.scheduled + counts.inflight == 0
    })
    .await;
    assert_eq!(counters::node(&node.store).unwrap().dead, 1);
    // The counts are published once a second.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let (_, m) = get_text(&c, &node.admin_url("/metrics")).await;
        if m.lines().any(|l| {
            l.starts_with(r#"ankusa_store_corruption_errors_total{family="hooks"} "#)
                && !l.ends_with(" 0")
        }) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the corruption was not counted: {m}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, dlq) = http_get_auth_token(node.admin_addr.port(), "/v1/dlq", ADMIN_TOKEN).unwrap();
    assert!(
        dlq.contains("does not decode") || dlq.contains("corruption"),
        "{dlq}"
    );
    // Whole again: a replay sends it.
    put(whole);
    let r = post(
        &c,
        &node.admin_url("/v1/dlq/replay"),
        &[
            ("authorization", format!("Bearer {ADMIN_TOKEN}")),
            ("content-type", "application/json".into()),
        ],
        r#"{"tenant":"t"}"#,
    )
    .await;
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    eventually(10, "the replayed hook delivered", || {
        sink.on("/a")
            .iter()
            .filter(|h| String::from_utf8_lossy(&h.body).contains("{}"))
            .count()
            == 3
    })
    .await;
    assert!(sink
        .on("/a")
        .iter()
        .any(|h| h.headers["webhook-id"] == id.as_str()));
    node.stop().await;
}

/// Rows that become due later wake the pipeline too: with a tick of 5 s, a retry goes out
/// when its backoff ends, and a replayed dead row at once.
#[tokio::test]
async fn retries_coming_due_and_replays_are_claimed_without_waiting_for_the_tick() {
    let sink = TestSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        r#"
dispatch: {{ tick_interval_ms: 5000 }}
retry: {{ schedule_ms: [200], max_attempts: 3, jitter: none }}
sinks: [{{ id: a, url: "{a}" }}]
routes: [{{ id: main, sinks: [a] }}]
sources: [{{ id: in, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: main }}]
"#,
        a = sink.url("/a"),
    );
    let node = start_node_with_admin(dir.path(), &rest).await;
    let c = client();
    // 503, then 200: the retry leaves 200 ms after the first attempt, not at the tick.
    sink.script("/a", &[(503, None), (400, None)]);
    let ingest = format!("http://{}/ingest/in", node.ingest_addr);
    let r = post(&c, &ingest, &[("x-tenant", "t".into())], r#"{"n":1}"#).await;
    assert_eq!(r.status, 202);
    eventually(3, "the retry", || sink.on("/a").len() >= 2).await;
    let got = sink.on("/a");
    let gap = got[1].at.duration_since(got[0].at);
    assert!(
        gap >= Duration::from_millis(200) && gap < Duration::from_millis(1_500),
        "retry after {gap:?}"
    );
    // The 400 dead-lettered it; a replay delivers it at once.
    eventually(3, "dead-lettered", || {
        counters::node(&node.store).unwrap().dead == 1
    })
    .await;
    let replay = post(
        &c,
        &format!("http://{}/v1/dlq/replay", node.admin_addr),
        &[
            ("authorization", format!("Bearer {ADMIN_TOKEN}")),
            ("content-type", "application/json".into()),
        ],
        r#"{"tenant":"t"}"#,
    )
    .await;
    assert_eq!(
        replay.status,
        200,
        "{}",
        String::from_utf8_lossy(&replay.body)
    );
    let replayed = Instant::now();
    eventually(3, "the replayed hook delivered", || {
        sink.on("/a").len() >= 3
    })
    .await;
    let lag = sink.on("/a")[2].at.saturating_duration_since(replayed);
    assert!(
        lag < Duration::from_millis(1_500),
        "replay delivered after {lag:?}"
    );
    node.shutdown().await.unwrap();
}

/// A failing sink: 503s halve its limit, three in a row open its breaker (no request for
/// the cooldown: its rows stay due), and once it answers again a probe closes the
/// breaker and the rows go out.
#[tokio::test]
async fn a_failing_sinks_breaker_opens_holds_its_rows_and_a_probe_closes_it() {
    let sink = TestSink::start().await;
    sink.default_status.store(503, Ordering::Relaxed);
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        r#"
dispatch: {{ tick_interval_ms: 20 }}
retry: {{ schedule_ms: [30], max_attempts: 1000, jitter: none }}
sinks: [{{ id: a, url: "{a}", max_inflight: 8, breaker_failures: 3, breaker_cooldown_ms: 600 }}]
routes: [{{ id: main, sinks: [a] }}]
sources: [{{ id: in, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: main }}]
"#,
        a = sink.url("/a"),
    );
    let node = start_node(dir.path(), &rest).await;
    let c = client();
    for i in 0..10 {
        let r = post(
            &c,
            &format!("http://{}/ingest/in", node.ingest_addr),
            &[("x-tenant", "t".into())],
            format!(r#"{{"n":{i}}}"#),
        )
        .await;
        assert_eq!(r.status, 202);
    }
    let gauge = |name: &str| -> Option<i64> {
        let m = node.metrics.encode();
        m.lines().find_map(|l| {
            l.strip_prefix(&format!(r#"{name}{{sink="a"}} "#))?
                .trim()
                .parse()
                .ok()
        })
    };
    eventually(5, "the breaker open", || {
        gauge("ankusa_sink_breaker") == Some(1)
    })
    .await;
    assert!(
        gauge("ankusa_sink_limit").unwrap() < 8,
        "503s lowered the limit"
    );
    // Open: no request reaches the sink for (most of) the cooldown.
    let before = sink.on("/a").len();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        sink.on("/a").len(),
        before,
        "a request while the breaker was open"
    );
    assert_eq!(
        counters::node(&node.store).unwrap().inflight,
        0,
        "the rows wait as due, not in flight"
    );
    // The sink recovers: the probe after the cooldown closes the breaker; all 10 arrive.
    sink.default_status.store(0, Ordering::Relaxed);
    eventually(5, "the breaker closed", || {
        gauge("ankusa_sink_breaker") == Some(0)
    })
    .await;
    eventually(5, "every hook delivered", || {
        let c = counters::node(&node.store).unwrap();
        c.pending + c.scheduled + c.inflight == 0
    })
    .await;
    node.shutdown().await.unwrap();
}

/// A slow sink holds only its own slots: sink A answers in 2 s with `max_inflight: 2` and
/// a backlog of 2 000 hooks, and the same tenant's hooks for sink B still arrive at once.
#[tokio::test]
async fn a_slow_sink_with_a_backlog_never_delays_another_sinks_deliveries() {
    let slow = TestSink::start().await;
    slow.delay_ms.store(2_000, Ordering::Relaxed);
    let fast = TestSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        r#"
dispatch: {{ tick_interval_ms: 50 }}
shutdown: {{ grace_ms: 0 }}
sinks:
  - {{ id: a, url: "{a}", max_inflight: 2, timeout_ms: 10000 }}
  - {{ id: b, url: "{b}" }}
routes: [{{ id: ra, sinks: [a] }}, {{ id: rb, sinks: [b] }}]
sources:
  - {{ id: a, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: ra }}
  - {{ id: b, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: rb }}
"#,
        a = slow.url("/a"),
        b = fast.url("/b"),
    );
    let node = start_node(dir.path(), &rest).await;
    let c = client();
    let url_a = format!("http://{}/ingest/a", node.ingest_addr);
    backlog(&c, &url_a, "t", 2_000).await;
    for i in 0..20 {
        let r = post(
            &c,
            &format!("http://{}/ingest/b", node.ingest_addr),
            &[("x-tenant", "t".into())],
            format!(r#"{{"b":{i}}}"#),
        )
        .await;
        assert_eq!(r.status, 202);
        let acked = Instant::now();
        eventually(5, "B's hook delivered", || fast.on("/b").len() > i).await;
        let lag = fast.on("/b")[i].at.saturating_duration_since(acked);
        assert!(
            lag < Duration::from_millis(1_000),
            "B's hook {i} waited {lag:?} behind A's backlog"
        );
    }
    let a_in_flight = slow.on("/a").len();
    assert!(
        a_in_flight <= 2 * 4,
        "A's sink saw {a_in_flight} requests: more than its 2 slots allow in this time"
    );
    // Once B's last outcome is committed, A holds its 2 requests and as many rows next in
    // line, no more; the rest of its backlog is still due.
    eventually(3, "only A's 4 claims in flight", || {
        counters::node(&node.store).unwrap().inflight <= 4
    })
    .await;
    let counts = counters::node(&node.store).unwrap();
    assert!(
        counts.pending > 1_900,
        "A's backlog still waits: {counts:?}"
    );
    // The tenant's deliveries in flight (A's 4), by name (refreshed each second).
    eventually(3, "the per-tenant in-flight gauge", || {
        node.metrics
            .encode()
            .contains(r#"ankusa_tenant_inflight{tenant="t"} 4"#)
    })
    .await;
    node.shutdown().await.unwrap();
}

/// Fairness: tenant F floods a sink that takes about 200 hooks/s (4 slots, 20 ms each)
/// with a backlog of 2 000; tenant Q's hooks into the same sink go out within about one
/// delivery of being acked (the sink's last slot is kept for a tenant with none in
/// flight), while F's backlog still waits, and the sink never sees more than its 4.
#[tokio::test]
async fn a_quiet_tenant_is_served_beside_a_flooding_one_in_the_same_sink() {
    let sink = TestSink::start().await;
    sink.delay_ms.store(20, Ordering::Relaxed);
    let dir = tempfile::tempdir().unwrap();
    let rest = format!(
        r#"
shutdown: {{ grace_ms: 0 }}
sinks: [{{ id: a, url: "{a}", max_inflight: 4 }}]
routes: [{{ id: main, sinks: [a] }}]
sources: [{{ id: in, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: main }}]
"#,
        a = sink.url("/a"),
    );
    let node = start_node(dir.path(), &rest).await;
    let c = client();
    let url = format!("http://{}/ingest/in", node.ingest_addr);
    backlog(&c, &url, "flood", 2_000).await;
    for i in 0..10 {
        let body = format!(r#"{{"quiet":{i}}}"#);
        let r = post(&c, &url, &[("x-tenant", "quiet".into())], body.clone()).await;
        assert_eq!(r.status, 202);
        let acked = Instant::now();
        let arrived = || {
            sink.on("/a")
                .into_iter()
                .find(|x| x.body == body.as_bytes())
                .map(|x| x.at)
        };
        eventually(10, "the quiet tenant's hook delivered", || {
            arrived().is_some()
        })
        .await;
        let lag = arrived().unwrap().saturating_duration_since(acked);
        // Its own 20 ms delivery and a wake-up, not the flood's backlog nor its requests
        // already out (bounded loosely for a loaded machine).
        assert!(
            lag < Duration::from_millis(250),
            "quiet hook {i} waited {lag:?} behind the flood"
        );
    }
    let counts = counters::node(&node.store).unwrap();
    assert!(
        counts.pending > 500,
        "the flood's backlog still waits: {counts:?}"
    );
    let most = sink.most_open.load(Ordering::SeqCst);
    assert!(
        most <= 4,
        "the sink saw {most} requests at once (max_inflight: 4)"
    );
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_hook_arrives_signed_with_its_original_body() {
    let h = NodeAndSink::start(&["a"], &[]).await;
    let body = r#"{"event":"invoice.paid","amount":4200}"#;
    let id = h.send("acme", body).await;
    eventually(10, "the sink to receive the hook", || {
        !h.sink.on("/a").is_empty()
    })
    .await;
    let got = h.sink.on("/a").remove(0);
    assert_eq!(got.body, body.as_bytes());
    assert_eq!(got.headers["content-type"], "application/vnd.test+json");
    assert_eq!(got.headers["webhook-id"], id.as_str());
    assert_eq!(got.headers["x-extra"], "yes");
    // A receiver verifies the signature the Standard Webhooks way.
    let v = Verifier::StandardWebhooks {
        key: standard_webhooks_key(SINK_SECRET.as_bytes()),
        tolerance_s: 300,
    };
    assert_eq!(v.verify(&got.headers, &got.body, now_s()), Ok(()));
    assert!(v.verify(&got.headers, b"tampered", now_s()).is_err());
    h.settled().await;
    eventually(10, "the delivered hook to be reclaimed", || h.hooks() == 0).await;
    assert_eq!(h.node_counts(), Counters::default());
    h.node.stop().await;
}

/// What a receiver needs besides the body: every hook's tenant and source, and the
/// provider's headers its source forwards — GitHub's event and delivery by default, a
/// source's own list otherwise, never more than the bounds.
#[tokio::test]
async fn a_github_hook_reaches_the_sink_with_its_event_header_tenant_and_source() {
    let h = NodeAndSink::start(
        &["a"],
        &[
            r#"{ id: gh, tenant: { json_pointer: /installation/id }, verify: { scheme: github, secret: { value: "gh-secret" } }, route: main }"#,
            "{ id: shop, tenant: { header: x-tenant }, verify: { scheme: none }, route: main, forward_headers: [X-Shop-Topic] }",
        ],
    )
    .await;
    let url = |source: &str| format!("http://{}/ingest/{source}", h.node.ingest_addr);
    let gh_body = br#"{"action":"opened","installation":{"id":4242}}"#.to_vec();
    let sig = format!("sha256={}", hex(&hmac_sha256(b"gh-secret", &[&gh_body])));
    let r = post(
        &h.c,
        &url("gh"),
        &[
            ("x-hub-signature-256", sig),
            ("x-github-event", "pull_request".into()),
            ("x-github-delivery", "d-77".into()),
            ("x-unlisted", "not forwarded".into()),
        ],
        gh_body.clone(),
    )
    .await;
    assert_eq!(r.status, 202);
    let shop_body = br#"{"order":1}"#.to_vec();
    let r = post(
        &h.c,
        &url("shop"),
        &[
            ("x-tenant", "shop-1".into()),
            ("x-shop-topic", "orders/create".into()),
            ("x-github-event", "push".into()),
        ],
        shop_body.clone(),
    )
    .await;
    assert_eq!(r.status, 202);
    // Over the bound: refused, nothing stored.
    let r = post(
        &h.c,
        &url("shop"),
        &[
            ("x-tenant", "shop-1".into()),
            ("x-shop-topic", "t".repeat(2_000)),
        ],
        shop_body.clone(),
    )
    .await;
    assert_eq!(r.status, 431);
    assert_eq!(r.json()["error"], "headers_too_large");
    eventually(10, "both hooks delivered", || h.sink.on("/a").len() >= 2).await;
    let got = h.sink.on("/a");
    assert_eq!(got.len(), 2, "the refused hook was not stored");
    let gh = got.iter().find(|r| r.body == gh_body).unwrap();
    assert_eq!(gh.headers["x-github-event"], "pull_request");
    assert_eq!(gh.headers["x-github-delivery"], "d-77");
    assert_eq!(gh.headers["ankusa-tenant"], "4242");
    assert_eq!(gh.headers["ankusa-source"], "gh");
    assert!(!gh.headers.contains_key("x-unlisted"));
    assert!(!gh.headers.contains_key("x-hub-signature-256"));
    let shop = got.iter().find(|r| r.body == shop_body).unwrap();
    assert_eq!(shop.headers["x-shop-topic"], "orders/create");
    assert_eq!(shop.headers["ankusa-tenant"], "shop-1");
    assert_eq!(shop.headers["ankusa-source"], "shop");
    assert!(!shop.headers.contains_key("x-github-event"));
    h.node.stop().await;
}

/// A provider that lets each tenant register its own URL: the tenant is the last path
/// segment, for the sources that say so and no other.
#[tokio::test]
async fn a_tenant_in_the_url_files_the_hook_under_it() {
    let h = NodeAndSink::start(
        &["a"],
        &["{ id: pt, tenant: path, verify: { scheme: none }, route: main }"],
    )
    .await;
    let url = |p: &str| format!("http://{}{p}", h.node.ingest_addr);
    let r = post(&h.c, &url("/ingest/pt/acme-7"), &[], r#"{"n":1}"#).await;
    assert_eq!(r.status, 202);
    eventually(10, "the hook delivered", || !h.sink.on("/a").is_empty()).await;
    assert_eq!(h.sink.on("/a")[0].headers["ankusa-tenant"], "acme-7");
    assert_eq!(tenants::count(&h.node.store).unwrap(), 1);
    for (path, why) in [
        ("/ingest/pt", "a path source without a tenant in its URL"),
        (
            "/ingest/in/acme",
            "a header source given a tenant in its URL",
        ),
        ("/ingest/pt/a%0Ab", "a tenant id with a control character"),
    ] {
        let r = post(&h.c, &url(path), &[("x-tenant", "t".into())], "{}").await;
        assert_eq!(
            (r.status, r.json()["error"].as_str()),
            (400, Some("bad_tenant")),
            "{why}"
        );
    }
    assert_eq!(
        tenants::count(&h.node.store).unwrap(),
        1,
        "refusals made no tenant"
    );
    h.node.stop().await;
}

#[tokio::test]
async fn a_sink_answering_500_twice_then_200_gets_the_hook_three_times_on_schedule() {
    let h = NodeAndSink::start(&["b"], &[]).await;
    h.sink
        .script("/b", &[(500, None), (500, None), (200, None)]);
    h.send("acme", "{}").await;
    eventually(10, "three attempts", || h.sink.on("/b").len() == 3).await;
    h.settled().await;
    let got = h.sink.on("/b");
    let gaps: Vec<Duration> = got.windows(2).map(|w| w[1].at - w[0].at).collect();
    // The schedule's first two steps are lower bounds (the tick adds a little).
    assert!(gaps[0] >= Duration::from_millis(60), "{gaps:?}");
    assert!(gaps[1] >= Duration::from_millis(120), "{gaps:?}");
    assert_eq!(h.node_counts().dead, 0);
    let m = h.node.metrics.encode();
    assert!(
        m.contains(r#"ankusa_delivery_attempts_total{sink="b",outcome="retryable"} 2"#),
        "{m}"
    );
    assert!(
        m.contains(r#"ankusa_delivery_attempts_total{sink="b",outcome="delivered"} 1"#),
        "{m}"
    );
    h.node.stop().await;
}

#[tokio::test]
async fn a_400_dead_letters_at_once_exhausted_attempts_dead_letter_and_retry_after_is_honoured() {
    let h = NodeAndSink::start(&["a", "b", "c", "lenient"], &[]).await;
    h.sink.script("/a", &[(400, None)]);
    h.sink.script("/b", &[(503, None); 10]);
    h.sink.script("/c", &[(429, Some(1)), (200, None)]);
    h.sink.script("/lenient", &[(404, None), (200, None)]);
    h.send("acme", "{}").await;
    eventually(15, "every sink to settle", || {
        let c = h.node_counts();
        c.pending == 0 && c.scheduled == 0 && c.inflight == 0 && c.dead == 2
    })
    .await;
    assert_eq!(h.sink.on("/a").len(), 1, "a 400 is not retried");
    assert_eq!(h.sink.on("/b").len(), 4, "max_attempts = 4, then dead");
    let c = h.sink.on("/c");
    assert_eq!(c.len(), 2);
    assert!(
        c[1].at - c[0].at >= Duration::from_secs(1),
        "Retry-After: 1 was not honoured"
    );
    assert_eq!(
        h.sink.on("/lenient").len(),
        2,
        "dead_letter_on_4xx: false retries a 404"
    );
    // The DLQ names both dead deliveries; the hook is kept for them.
    let ord = tenants::ord(&h.node.store, "acme").unwrap().unwrap();
    let page = deliveries::dead_page_for_tenant(&h.node.store, ord, None, 10).unwrap();
    assert_eq!(page.rows.len(), 2);
    assert_eq!(h.hooks(), 1);
    assert!(fold::verify(&h.node.store).unwrap().is_empty());
    h.node.stop().await;
}

#[tokio::test]
async fn fan_out_to_three_sinks_settles_each_independently_and_reclaims_after_the_last() {
    let h = NodeAndSink::start(&["a", "b", "c"], &[]).await;
    h.sink
        .script("/c", &[(500, None), (500, None), (200, None)]);
    h.send("acme", r#"{"n":1}"#).await;
    eventually(10, "a and b delivered", || {
        h.sink.on("/a").len() == 1 && h.sink.on("/b").len() == 1
    })
    .await;
    // c is still retrying: the hook is kept.
    assert!(h.sink.on("/c").len() < 3);
    assert_eq!(h.hooks(), 1);
    h.settled().await;
    assert_eq!(h.sink.on("/c").len(), 3);
    eventually(10, "the hook to be reclaimed", || h.hooks() == 0).await;

    // A sink that never succeeds: dead-lettered, and the hook is kept for the DLQ until the
    // dead row is purged; then it is reclaimed.
    h.sink.script("/c", &[(500, None); 10]);
    h.send("acme", r#"{"n":2}"#).await;
    eventually(15, "c dead-lettered", || h.node_counts().dead == 1).await;
    h.settled().await;
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(h.hooks(), 1, "a dead row keeps its hook");
    let ord = tenants::ord(&h.node.store, "acme").unwrap().unwrap();
    deliveries::purge_tenant(
        &h.node.store,
        ord,
        PurgeKinds {
            pending: false,
            dead: true,
        },
    )
    .unwrap();
    eventually(10, "the purged hook to be reclaimed", || h.hooks() == 0).await;
    assert_eq!(h.node_counts(), Counters::default());
    h.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_tenants_are_all_delivered() {
    let h = NodeAndSink::start(&["b"], &[]).await;
    for i in 0..200 {
        h.send(&format!("t{}", i % 37), &format!(r#"{{"i":{i}}}"#))
            .await;
    }
    eventually(20, "200 deliveries", || h.sink.on("/b").len() >= 200).await;
    h.settled().await;
    let ids: std::collections::BTreeSet<_> = h
        .sink
        .on("/b")
        .iter()
        .map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned())
        .collect();
    assert_eq!(ids.len(), 200);
    h.node.stop().await;
}

/// A sink that answers 200 and then streams its body without end (a tenant's endpoint
/// can): the hook is delivered on the status, at once, the node reads at most
/// `RESPONSE_DRAIN_BYTES` of the body and drops the connection, and it does not wait for
/// the sink's timeout or hold the stream in memory.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_that_streams_an_endless_answer_is_delivered_on_its_status() {
    use std::sync::atomic::AtomicU64;
    let sent = std::sync::Arc::new(AtomicU64::new(0));
    let streamed = sent.clone();
    let app = axum::Router::new().route(
        "/endless",
        axum::routing::post(move || {
            let sent = streamed.clone();
            async move {
                let chunk = bytes::Bytes::from(vec![b'x'; 16 << 10]);
                let stream = futures_util::stream::repeat_with(move || {
                    sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                    Ok::<_, std::convert::Infallible>(chunk.clone())
                });
                axum::body::Body::from_stream(stream)
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(l, app).await });
    let node = TestNode::builder()
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [600000], max_attempts: 3, jitter: none }")
        .sink_yaml(&format!(
            "{{ id: s, url: \"http://127.0.0.1:{port}/endless\", timeout_ms: 60000 }}"
        ))
        .route("r", &["s"])
        .open_source("in", "r")
        .start()
        .await;
    let started = Instant::now();
    let r = post(
        &client(),
        &node.ingest_url("in"),
        &[("x-tenant", "t".to_owned())],
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(r.status, 202);
    eventually(10, "the hook delivered", || {
        node.metrics
            .encode()
            .contains(r#"ankusa_delivery_attempts_total{sink="s",outcome="delivered"} 1"#)
    })
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
    // What the sink wrote before the node let go: its drain cap, plus what the sockets'
    // buffers took — never the stream.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let streamed = sent.load(Ordering::Relaxed);
    assert!(streamed < 64 << 20, "{streamed} bytes streamed");
    let c = counters::node(&node.store).unwrap();
    assert_eq!((c.pending, c.scheduled, c.inflight, c.dead), (0, 0, 0, 0));
    node.stop().await;
}
