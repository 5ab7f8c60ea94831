//! `cargo bench -p ankusa-relay --bench drain`: how fast a node leaving its Relay hands its
//! stored rows to the owner, and what that costs the owner's own ingest.
//!
//! Two nodes in this process, on loopback: `s` (marked `leaving`) and `r` (the owner of
//! every tenant). `s`'s store holds a backlog of 10⁵ hooks of 1 KiB over 1 000 tenants for
//! a pull sink (parked for consumers, so nothing is delivered meanwhile), written before it
//! starts. First `r` runs alone:
//! - **ingest rate**: 64 keep-alive clients post signed hooks to `r` for 5 s (its closed-loop
//!   rate: the node's ingest rate on this machine);
//! - **baseline**: an open-loop ingest of 1 000 hooks/s to `r` for 10 s (its "normal
//!   ingest"), p99 of the acks.
//!
//! Then `s` starts and drains into `r` while the same open-loop ingest runs on `r` for
//! 10 s; the drain's rate is the hooks `s` handed over by the end of that window over the
//! window (or over the drain, if it ended sooner).
//!
//! PASS if the drain moves at least 20% of the ingest rate and `r`'s p99 during the drain
//! stays under 2× the baseline's.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::Arc;
use std::time::{Duration, Instant};

mod load;

const HOOKS: u64 = 100_000;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const CLIENTS: usize = 64;
const RATE: u64 = 1_000;
const WINDOW: u64 = 10;
/// Node `name` of the Relay `[s (leaving), r]`.
async fn node(
    name: &str,
    all: &[(&str, &load::Ports); 2],
    dir: &std::path::Path,
    sink: std::net::SocketAddr,
) -> ankusa_relay::node::Node {
    let node = load::bench_node(sink, "", "").sink_yaml("{ id: q, kind: pull }");
    let config = load::relay_member(name, all, &["s"], "handoff_interval_ms: 200, ", node, dir);
    ankusa_relay::node::Node::start(config).await.expect("node")
}

/// `CLIENTS` clients posting to `url` for `run` (for live tenants, none of the backlog's):
/// hooks acked per second.
async fn closed_loop(url: Arc<str>, run: Duration) -> f64 {
    let tenant = |w: u64, n: u64| format!("live-{}", (w * 31 + n) % TENANTS);
    let (secs, lat) = load::closed_loop_with(url, CLIENTS, run, BODY, Arc::new(tenant)).await;
    lat.len() as f64 / secs
}

/// The open-loop "normal ingest" on `url`: ack latencies, sorted.
async fn normal_ingest(url: Arc<str>) -> Vec<Duration> {
    let sent = load::open_loop(url, RATE, WINDOW, BODY, |n| format!("live-{}", n % TENANTS)).await;
    let mut lat: Vec<Duration> = sent.iter().map(|s| s.acked - s.sent).collect();
    lat.sort();
    lat
}

/// Hooks `node` has handed to their owners.
fn sent(node: &ankusa_relay::node::Node) -> f64 {
    let m = node.metrics.encode();
    m.lines()
        .find(|l| l.starts_with(r#"ankusa_handoff_hooks_total{direction="sent"}"#))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    // The backlog of the leaving node, for the pull sink: parked at its first tick.
    let filled = Instant::now();
    load::write_backlog(&dir.path().join("s"), "q", HOOKS, TENANTS, BODY);
    println!(
        "backlog: {HOOKS} hooks of {BODY} B over {TENANTS} tenants written in {:.1} s",
        filled.elapsed().as_secs_f64()
    );
    let (rate, base, during, moved, drain_secs, left) = rt.block_on(async {
        let sink = load::noop_sink().await;
        let (ps, pr) = (load::Ports::free(), load::Ports::free());
        let ports = [("s", &ps), ("r", &pr)];
        let r = node("r", &ports, dir.path(), sink).await;
        let to_r: Arc<str> = format!("http://127.0.0.1:{}/ingest/bench", pr.ingest).into();
        // Warm-up: every live tenant known to `r`.
        closed_loop(to_r.clone(), Duration::from_secs(2)).await;
        let rate = closed_loop(to_r.clone(), Duration::from_secs(5)).await;
        let base = normal_ingest(to_r.clone()).await;
        // The leaving node starts and drains while `r` takes its normal ingest.
        let started = Instant::now();
        let s = node("s", &ports, dir.path(), sink).await;
        let watch = {
            let to_r = to_r.clone();
            tokio::spawn(async move { normal_ingest(to_r).await })
        };
        let window = Duration::from_secs(WINDOW);
        let mut drained_at = None;
        while started.elapsed() < window {
            if drained_at.is_none() && sent(&s) >= HOOKS as f64 {
                drained_at = Some(started.elapsed());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let during = watch.await.expect("ingest");
        let moved = sent(&s);
        let drain_secs = drained_at.unwrap_or(window).as_secs_f64();
        // What is left on the leaving node, once the drain is over.
        let deadline = Instant::now() + Duration::from_secs(120);
        while sent(&s) < HOOKS as f64 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let left = HOOKS as f64 - sent(&s);
        s.shutdown().await.expect("shutdown s");
        r.shutdown().await.expect("shutdown r");
        (rate, base, during, moved, drain_secs, left)
    });
    let drain_rate = moved / drain_secs;
    let (p99_base, p99_during) = (load::pct(&base, 0.99), load::pct(&during, 0.99));
    println!(
        "\ndrain — a leaving node hands {HOOKS} parked hooks ({TENANTS} tenants) to the owner, which takes {RATE} hooks/s of its own meanwhile"
    );
    println!("| measure | value |");
    println!("|---|---:|");
    println!("| owner's ingest rate, 64 clients, closed loop (hooks/s) | {rate:.0} |");
    println!(
        "| drain: hooks moved in the first {:.1} s | {moved:.0} |",
        drain_secs
    );
    println!("| drain rate (hooks/s) | {drain_rate:.0} |");
    println!(
        "| drain rate / ingest rate | {:.0}% |",
        drain_rate / rate * 100.0
    );
    println!(
        "| owner's ack p50 / p99 at {RATE}/s, no drain (ms) | {:.2} / {p99_base:.2} |",
        load::pct(&base, 0.50)
    );
    println!(
        "| owner's ack p50 / p99 at {RATE}/s, during the drain (ms) | {:.2} / {p99_during:.2} |",
        load::pct(&during, 0.50)
    );
    println!("| hooks not handed over after 120 s more | {left:.0} |");
    println!("pass: drain rate >= 20% of the ingest rate; p99 during the drain < 2x the p99 without; every hook handed over");
    let pass = drain_rate >= 0.2 * rate && p99_during < 2.0 * p99_base && left == 0.0;
    if pass {
        println!("drain: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("drain: FAIL");
        std::process::ExitCode::FAILURE
    }
}
