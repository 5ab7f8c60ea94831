//! `cargo bench -p ankusa-relay --bench replay`: a whole-DLQ replay while ingest runs.
//!
//! A node holds 100 000 dead rows (1 000 tenants). Ingest runs open-loop at a steady
//! 5 000 hooks/s (64 keep-alive clients, 1 KiB bodies, each acked after a synced commit)
//! for a baseline window, then again while `POST /v1/dlq/replay {"from_ms": 0}` revives
//! every dead row (the second row of the table counts the requests sent while the replay
//! ran) (synced batches of 500, each transition checked under the transition
//! lock). The dispatch pipeline is held off (its tick is a minute) so the figure is the
//! replay's and ingest's, not delivery's.
//!
//! PASS only if ingest p99 during the replay is within 3x of the baseline p99 (each counted
//! as at least 1 ms) and the replay revives at least 20 000 rows/s.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_relay::node::Node;
use ankusa_relay::testkit::TestNode;
use http_body_util::{BodyExt, Full};

mod load;
#[path = "../tests/it/seed.rs"]
mod seed;

const DEAD: u64 = 100_000;
const TENANTS: u64 = 1_000;
const RATE: u64 = 5_000;
const CLIENTS: u64 = 64;
const BODY: usize = 1_024;
const BASELINE: Duration = Duration::from_secs(5);
const TOKEN: &str = "bench-admin-token-0123456789";

/// Open-loop ingest at RATE for `window`: when each request was sent, and its ack latency.
async fn ingest(url: Arc<str>, window: Duration, offset: u64) -> Vec<(Instant, Duration)> {
    let client = load::client(CLIENTS as usize);
    let every = Duration::from_micros(1_000_000 * CLIENTS / RATE);
    let deadline = Instant::now() + window;
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|w| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut tick = tokio::time::interval(every);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                let mut lat = Vec::new();
                let mut n = 0u64;
                while Instant::now() < deadline {
                    tick.tick().await;
                    let req = hyper::Request::post(&*url)
                        .header(
                            "x-tenant",
                            format!("tenant-{}", (offset + w * 7 + n) % TENANTS),
                        )
                        .header("content-type", "application/json")
                        .body(Full::new(bytes::Bytes::from(load::body(w, n, BODY))))
                        .expect("request");
                    let sent = Instant::now();
                    lat.push((sent, load::post_acked(&client, req).await));
                    n += 1;
                }
                lat
            })
        })
        .collect();
    load::gather(tasks).await
}

/// The latencies, sorted.
fn sorted(lat: impl Iterator<Item = Duration>) -> Vec<Duration> {
    let mut v: Vec<Duration> = lat.collect();
    v.sort();
    v
}

fn main() -> std::process::ExitCode {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    let t = Instant::now();
    seed::store_with_dead(&data, DEAD, TENANTS, "bench", 256);
    println!(
        "seeded {DEAD} dead rows in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let config = TestNode::builder()
        .data_dir(&data)
        .admin_token("bench", TOKEN)
        .section("dispatch: { tick_interval_ms: 60000 }")
        .sink("s", "http://127.0.0.1:9/")
        .route("r", &["s"])
        .open_source("bench", "r")
        .config_at(&data);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (base, during, revived, replay_s, window_s) = rt.block_on(async {
        let node = Node::start(config).await.expect("node");
        let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
        let base = ingest(url.clone(), BASELINE, 0).await;
        // Ingest again, and replay the whole DLQ once it runs.
        let admin = format!("http://{}/v1/dlq/replay", node.admin_addr);
        let replay = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            let client = load::client(1);
            let req = hyper::Request::post(admin)
                .header("authorization", format!("Bearer {TOKEN}"))
                .header("content-type", "application/json")
                .body(Full::new(bytes::Bytes::from_static(
                    br#"{"from_ms":0,"limit":100000}"#,
                )))
                .expect("request");
            let t = Instant::now();
            let resp = client.request(req).await.expect("replay");
            let status = resp.status();
            let body = resp.into_body().collect().await.expect("body").to_bytes();
            assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            (v["revived"].as_u64().expect("revived"), t, t.elapsed())
        });
        // The window covers the replay (it starts 0.5 s in).
        let all = ingest(url, BASELINE, 1_000_000).await;
        let (revived, from, took) = replay.await.expect("replay task");
        node.shutdown().await.expect("shutdown");
        // Only the requests sent while the replay ran.
        let during: Vec<Duration> = sorted(
            all.iter()
                .filter(|(t, _)| *t >= from && *t <= from + took)
                .map(|(_, l)| *l),
        );
        (
            sorted(base.into_iter().map(|(_, l)| l)),
            during,
            revived,
            took.as_secs_f64(),
            took.as_secs_f64(),
        )
    });
    let (b99, d99) = (load::pct(&base, 0.99), load::pct(&during, 0.99));
    let rate = revived as f64 / replay_s;
    println!(
        "\nreplay — {DEAD} dead rows over {TENANTS} tenants, ingest open-loop at {RATE} hooks/s ({CLIENTS} clients, {BODY} B, synced acks)"
    );
    println!("| window | hooks acked | hooks/s | p50 ack (ms) | p99 ack (ms) |");
    println!("|---|---:|---:|---:|---:|");
    println!(
        "| ingest alone | {} | {:.0} | {:.2} | {:.2} |",
        base.len(),
        base.len() as f64 / BASELINE.as_secs_f64(),
        load::pct(&base, 0.5),
        b99
    );
    println!(
        "| ingest during the replay | {} | {:.0} | {:.2} | {:.2} |",
        during.len(),
        during.len() as f64 / window_s,
        load::pct(&during, 0.5),
        d99
    );
    println!(
        "\nreplay: {revived} rows revived in {replay_s:.2}s = {rate:.0} rows/s (pass: >= 20000)"
    );
    let ratio = d99.max(1.0) / b99.max(1.0);
    println!("ingest p99 during / alone = {ratio:.2}x (pass: <= 3x)");
    if revived == DEAD && rate >= 20_000.0 && ratio <= 3.0 {
        println!("replay: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("replay: FAIL");
        std::process::ExitCode::FAILURE
    }
}
