//! `cargo bench -p ankusa-relay --bench endpoints`: what a delivery to a tenant's own
//! endpoint costs the node next to a delivery to a configured sink.
//!
//! The same node (the same configuration: a configured sink `s`, tenants' endpoints on,
//! `dispatch.max_inflight` 128) drains a backlog of 100 000 hooks (1 KiB, 1 000 tenants) to
//! a local sink over loopback twice in each round:
//!
//! - **configured**: every hook to `s` (the `delivery` bench's backlog);
//! - **endpoints**: each tenant's hooks to its own endpoint (1 000 endpoints, stored as the
//!   API stores them, each with its own secret, all on the same local sink): every delivery
//!   reads its tenant's list from the book (held in memory after its first read), builds
//!   its endpoint's sink once, and goes through its own adaptive limit, line and breaker.
//!
//! The two alternate over [`ROUNDS`] rounds; the rule judges the median round's ratio of
//! the node's CPU per delivery (everything in this process: the node, the sink, RocksDB's
//! threads), endpoints over configured. Rates are printed, not judged: the endpoints'
//! 1 000 lines of 8 reach the node's 128 slots in another order than one sink's line.
//!
//! PASS if, in the median round, a delivery to an endpoint costs at most 1.15× one to a
//! configured sink: a tenant's own endpoints are sinks like the others, and their book and
//! cache are no more than a lookup.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use ankusa_config::Config;
use ankusa_relay::node::Node;
use ankusa_relay::testkit::TestNode;

mod load;

const BACKLOG: u64 = 100_000;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const CONCURRENCY: usize = 128;
const ROUNDS: usize = 5;

/// The node both drains run: the configured sink `s` on `port`, tenants' endpoints on (the
/// bench's sink is on loopback: `allow_private`).
fn config(data: &std::path::Path, port: u16) -> Config {
    TestNode::builder()
        .data_dir(data)
        .section(&format!(
            "dispatch: {{ tick_interval_ms: 5, max_inflight: {CONCURRENCY}, per_sink_inflight: {CONCURRENCY} }}"
        ))
        .section("endpoints: { allow_private: true }")
        .sink_yaml(&format!(
            r#"{{ id: s, url: "http://127.0.0.1:{port}/hooks", secret: {{ value: "whsec_YmVuY2gtc2luay1zZWNyZXQ=" }} }}"#
        ))
        .route_yaml("{ id: r, sinks: [s], endpoints: true }")
        .open_source("in", "r")
        .config_at(data)
}

/// Tenant `t`'s endpoint id.
fn endpoint_id(t: u64) -> String {
    format!("ep_{t:016x}")
}

/// Every tenant's endpoint, written to the store at `data` as the API writes them.
fn write_endpoints(data: &std::path::Path, port: u16) {
    let store = load::node_store(data);
    let now = ankusa_keyspace::now_ms();
    let ops = (0..TENANTS)
        .map(|t| {
            let r = ankusa_relay::endpoints::Record {
                v: 1,
                id: endpoint_id(t),
                url: format!("http://127.0.0.1:{port}/hooks"),
                description: None,
                filter: None,
                rate_per_second: None,
                enabled: true,
                secrets: vec![ankusa_relay::endpoints::StoredSecret {
                    secret: format!("whsec_{}", base64_of(t)),
                    created_ms: now,
                    expires_ms: None,
                }],
                created_ms: now,
                updated_ms: now,
            };
            let json = serde_json::to_vec(&r).expect("record");
            ankusa_queue::endpoints::op(&format!("tenant-{t}"), &r.id, Some(json))
        })
        .collect();
    ankusa_queue::commit(&store, ops, true).expect("endpoints");
}

/// A secret of 24 bytes for tenant `t`, in base64.
fn base64_of(t: u64) -> String {
    use base64::Engine;
    let mut key = [7u8; 24];
    key[..8].copy_from_slice(&t.to_be_bytes());
    base64::engine::general_purpose::STANDARD.encode(key)
}

/// One drain: deliveries per second, the process's CPU per delivery, and the node's
/// dispatch ticks per 1 000 deliveries.
#[derive(Debug, Clone, Copy)]
struct Drain {
    rate: f64,
    cpu_us: f64,
    ticks_per_k: f64,
}

/// A node booted on a backlog to the configured sink (`endpoints` false) or to each
/// tenant's endpoint, drained to the sink: counted from the node's start.
async fn drain(port: u16, sink: &load::ArrivalSink, endpoints: bool) -> Drain {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    if endpoints {
        load::write_backlog_to(&data, BACKLOG, TENANTS, BODY, endpoint_id);
        write_endpoints(&data, port);
    } else {
        load::write_backlog(&data, "s", BACKLOG, TENANTS, BODY);
    }
    sink.count.store(0, Ordering::Relaxed);
    let what = if endpoints { "endpoints" } else { "configured" };
    eprintln!("endpoints: draining to the {what} sink(s)");
    let node = Node::start(config(&data, port)).await.expect("node");
    let before = sink.count.load(Ordering::Relaxed);
    let (started, cpu0) = (Instant::now(), load::cpu_time());
    while sink.count.load(Ordering::Relaxed) < BACKLOG {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the backlog never drained"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (secs, cpu) = (started.elapsed(), load::cpu_time() - cpu0);
    let n = (BACKLOG - before) as f64;
    let ticks = load::metric(&node.metrics.encode(), "ankusa_dispatch_tick_seconds_count");
    node.shutdown().await.expect("shutdown");
    Drain {
        rate: n / secs.as_secs_f64(),
        cpu_us: cpu.as_secs_f64() * 1e6 / n,
        ticks_per_k: ticks * 1e3 / n,
    }
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let rounds: Vec<(Drain, Drain)> = rt.block_on(async {
        let (sink, port) = load::arrival_sink(Duration::ZERO).await;
        let mut rounds = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let configured = drain(port, &sink, false).await;
            let endpoints = drain(port, &sink, true).await;
            rounds.push((configured, endpoints));
        }
        rounds
    });
    println!("\nendpoints — {BACKLOG} hooks of {BODY} B over {TENANTS} tenants to a local sink, the node's slots {CONCURRENCY}");
    println!("| round | configured: deliveries/s | µs CPU each | ticks / 1 000 | endpoints: deliveries/s | µs CPU each | ticks / 1 000 | endpoints / configured (CPU) |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    let ratio = |(c, e): &(Drain, Drain)| e.cpu_us / c.cpu_us;
    for (k, r) in rounds.iter().enumerate() {
        println!(
            "| {} | {:.0} | {:.1} | {:.1} | {:.0} | {:.1} | {:.1} | {:.2}× |",
            k + 1,
            r.0.rate,
            r.0.cpu_us,
            r.0.ticks_per_k,
            r.1.rate,
            r.1.cpu_us,
            r.1.ticks_per_k,
            ratio(r)
        );
    }
    let mut ratios: Vec<f64> = rounds.iter().map(ratio).collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "endpoints / configured, CPU per delivery: the median round {median:.2}× (pass: <= 1.15×)"
    );
    load::ledger("endpoints.cpu_over_configured", median, "x");
    if median <= 1.15 {
        println!("endpoints: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("endpoints: FAIL");
        std::process::ExitCode::FAILURE
    }
}
