//! `cargo bench -p ankusa-relay --bench pull`: pull delivery against push delivery.
//!
//! 1. **Push**: a node drains a backlog of 100 000 hooks (1 KiB bodies, 1 000 tenants) to a
//!    local axum sink over loopback (the `delivery` bench's drain).
//! 2. **Pull**: the same backlog routed to a pull sink; 16 concurrent consumers claim 100
//!    hooks at a time over HTTP (`POST /pull/q/claim`) and ack each batch
//!    (`POST /pull/q/ack`) until every hook is acked.
//!
//!    The two alternate over [`ROUNDS`] rounds, each round's pair back to back, so a change
//!    in the shared host's load falls on both; the rule judges the median round's ratio.
//! 3. **Round trip** at a steady 1 000 hooks/s into a pull route: a consumer claims every
//!    10 ms without waiting (hooks are there) and acks what it got; a round trip is one
//!    claim call that brought hooks plus its ack call, p50 and p99. For reference, the
//!    time from each hook's ingest ack to its consumer's ack.
//!
//! PASS only if, in the median round (by the ratio), pull delivers at least as many hooks
//! per second as push, and the round trip's p99 is under 10 ms.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_config::Config;
use ankusa_relay::node::Node;
use ankusa_relay::testkit::TestNode;
use http_body_util::{BodyExt, Full};

mod load;

const BACKLOG: u64 = 100_000;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const CONSUMERS: usize = 16;
const CLAIM: usize = 100;
const ROUNDS: usize = 3;
const STEADY_RATE: u64 = 1_000;
const STEADY_SECS: u64 = 5;
const TOKEN: &str = "bench-pull-consumer-token-0123";

/// A node with the push sink `s` (to the local sink on `port`) and the pull sink `q`;
/// the source `in` routes to `sink`.
fn config(data: &std::path::Path, port: u16, sink: &str) -> Config {
    TestNode::builder()
        .data_dir(data)
        .section(
            "dispatch: { tick_interval_ms: 5, max_inflight: 512, per_sink_inflight: 128 }",
        )
        .section(&format!(
            r#"pull: {{ consumers: [{{ name: bench, secret: {{ value: "{TOKEN}" }}, sinks: [q] }}] }}"#
        ))
        .sink_yaml(&format!(
            r#"{{ id: s, url: "http://127.0.0.1:{port}/hooks", secret: {{ value: "whsec_YmVuY2gtc2luay1zZWNyZXQ=" }} }}"#
        ))
        .sink_yaml("{ id: q, kind: pull }")
        .route("r", &[sink])
        .open_source("in", "r")
        .config_at(data)
}

/// The backlog, each hook for `sink`, written to a store at `data`.
fn write_backlog(data: &std::path::Path, sink: &str) {
    load::write_backlog(data, sink, BACKLOG, TENANTS, BODY);
}

/// A drain's hooks per second and the process's CPU per hook.
#[derive(Debug, Clone, Copy)]
struct Drain {
    rate: f64,
    cpu_us: f64,
}

async fn timed<F: std::future::Future<Output = ()>>(f: F) -> Drain {
    let (started, cpu0) = (Instant::now(), load::cpu_time());
    f.await;
    let (secs, cpu) = (started.elapsed(), load::cpu_time() - cpu0);
    Drain {
        rate: BACKLOG as f64 / secs.as_secs_f64(),
        cpu_us: cpu.as_secs_f64() * 1e6 / BACKLOG as f64,
    }
}

async fn push_drain(port: u16, sink: &load::ArrivalSink) -> Drain {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    write_backlog(&data, "s");
    sink.count.store(0, Ordering::Relaxed);
    let started = Instant::now();
    let mut node = None;
    let d = timed(async {
        node = Some(Node::start(config(&data, port, "s")).await.expect("node"));
        while sink.count.load(Ordering::Relaxed) < BACKLOG {
            assert!(
                started.elapsed() < Duration::from_secs(600),
                "push never drained"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    node.expect("node").shutdown().await.expect("shutdown");
    d
}

/// One pull call: its status and JSON.
async fn call(
    client: &load::HttpClient,
    url: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let req = hyper::Request::post(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body.to_string())))
        .expect("request");
    let resp = client.request(req).await.expect("response");
    let status = resp.status().as_u16();
    let b = resp.into_body().collect().await.expect("body").to_bytes();
    (status, serde_json::from_slice(&b).expect("json"))
}

/// One claim (`claim` is its body) and, if it brought hooks, their ack: the hooks.
async fn claim_and_ack(
    client: &load::HttpClient,
    base: &str,
    claim: serde_json::Value,
) -> Vec<serde_json::Value> {
    let (s, v) = call(client, &format!("{base}/claim"), claim).await;
    assert_eq!(s, 200, "{v}");
    let hooks = v["hooks"].as_array().cloned().unwrap_or_default();
    if !hooks.is_empty() {
        let leases: Vec<&str> = hooks
            .iter()
            .map(|h| h["lease"].as_str().expect("lease"))
            .collect();
        let (s, v) = call(
            client,
            &format!("{base}/ack"),
            serde_json::json!({ "leases": leases }),
        )
        .await;
        assert_eq!(s, 200, "{v}");
    }
    hooks
}

async fn pull_drain(port: u16) -> Drain {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    write_backlog(&data, "q");
    let acked = Arc::new(AtomicU64::new(0));
    let mut node = None;
    let d = timed(async {
        let n = Node::start(config(&data, port, "q")).await.expect("node");
        let base: Arc<str> = format!("http://{}/pull/q", n.ingest_addr).into();
        node = Some(n);
        let client = load::client(CONSUMERS);
        let tasks: Vec<_> = (0..CONSUMERS)
            .map(|_| {
                let (client, base, acked) = (client.clone(), base.clone(), acked.clone());
                tokio::spawn(async move {
                    while acked.load(Ordering::Relaxed) < BACKLOG {
                        let claim = serde_json::json!({ "max": CLAIM, "wait_ms": 200 });
                        let hooks = claim_and_ack(&client, &base, claim).await;
                        acked.fetch_add(hooks.len() as u64, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.expect("consumer");
        }
    })
    .await;
    node.expect("node").shutdown().await.expect("shutdown");
    d
}

/// Round trips (claim + ack) of a consumer polling every 10 ms while hooks arrive at
/// [`STEADY_RATE`]; and each hook's time from its ingest ack to its consumer's ack.
async fn steady(port: u16) -> (Vec<Duration>, Vec<Duration>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(config(&dir.path().join("db"), port, "q"))
        .await
        .expect("node");
    let url: Arc<str> = format!("http://{}/ingest/in", node.ingest_addr).into();
    let base = format!("http://{}/pull/q", node.ingest_addr);
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = {
        let done = done.clone();
        tokio::spawn(async move {
            let client = load::client(2);
            let mut trips = Vec::new();
            let mut acked_at = std::collections::HashMap::new();
            let mut idle_since: Option<Instant> = None;
            loop {
                let t = Instant::now();
                let hooks = claim_and_ack(&client, &base, serde_json::json!({ "max": 1000 })).await;
                if hooks.is_empty() {
                    // The load is over and nothing came for a second: done.
                    if done.load(Ordering::Relaxed) {
                        let since = *idle_since.get_or_insert_with(Instant::now);
                        if since.elapsed() > Duration::from_secs(1) {
                            return (trips, acked_at);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
                idle_since = None;
                let now = Instant::now();
                trips.push(now - t);
                for h in &hooks {
                    acked_at.insert(h["id"].as_str().expect("id").to_owned(), now);
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };
    let sent = load::open_loop(url, STEADY_RATE, STEADY_SECS, BODY, |n| {
        format!("tenant-{}", n % TENANTS)
    })
    .await;
    done.store(true, Ordering::Relaxed);
    let (trips, acked_at) = consumer.await.expect("consumer");
    node.shutdown().await.expect("shutdown");
    let lags: Vec<Duration> = sent
        .iter()
        .map(|s| {
            acked_at
                .get(&s.id)
                .map(|a| a.saturating_duration_since(s.acked))
                .expect("every hook acked by its consumer")
        })
        .collect();
    (trips, lags)
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (rounds, (mut trips, mut lags)) = rt.block_on(async {
        let (sink, port) = load::arrival_sink(Duration::ZERO).await;
        let mut rounds = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let push = push_drain(port, &sink).await;
            let pull = pull_drain(port).await;
            rounds.push((push, pull));
        }
        (rounds, steady(port).await)
    });
    let ratio = |i: usize| rounds[i].1.rate / rounds[i].0.rate;
    let mut order: Vec<usize> = (0..rounds.len()).collect();
    order.sort_by(|a, b| ratio(*a).total_cmp(&ratio(*b)));
    let median = order[order.len() / 2];
    println!(
        "\npull — {BACKLOG} hooks of {BODY} B over {TENANTS} tenants; push to a local sink, pull by {CONSUMERS} consumers claiming {CLAIM} at a time"
    );
    println!("| run | hooks/s | CPU per hook (µs) |");
    println!("|---|---:|---:|");
    for (k, (push, pull)) in rounds.iter().enumerate() {
        println!(
            "| push, round {} | {:.0} | {:.1} |",
            k + 1,
            push.rate,
            push.cpu_us
        );
        println!(
            "| pull, round {} | {:.0} | {:.1} |",
            k + 1,
            pull.rate,
            pull.cpu_us
        );
    }
    let each: Vec<String> = (0..rounds.len())
        .map(|i| format!("{:.2}×", ratio(i)))
        .collect();
    let r = ratio(median);
    println!(
        "pull / push by round: {}; the median round {r:.2}× (pass: >= 1.0×)",
        each.join(", ")
    );
    trips.sort();
    lags.sort();
    let (p50, p99) = (load::pct(&trips, 0.5), load::pct(&trips, 0.99));
    println!(
        "claim + ack round trip at a steady {STEADY_RATE} hooks/s for {STEADY_SECS}s: p50 {p50:.2} ms, p99 {p99:.2} ms over {} round trips (pass: p99 < 10 ms); ingest ack to consumer ack: p50 {:.1} ms, p99 {:.1} ms ({} hooks)",
        trips.len(),
        load::pct(&lags, 0.5),
        load::pct(&lags, 0.99),
        lags.len()
    );
    if r >= 1.0 && p99 < 10.0 {
        println!("pull: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("pull: FAIL");
        std::process::ExitCode::FAILURE
    }
}
