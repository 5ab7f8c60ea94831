//! `cargo bench -p ankusa-relay --bench latency`: how soon an accepted hook reaches its
//! sink.
//!
//! A node with its default settings (tick interval 100 ms) and a local sink answering at
//! once; an open-loop sender posts 1 KiB hooks for 1 000 tenants at a steady 1 000
//! hooks/s for 10 s (each request on its own task at its planned time). For every hook,
//! the time from its ingest request to the sink's receipt. For where that time goes, the
//! table also gives the ack (request to 202: the synced commit) and the rest (202 to
//! receipt: wake-up, claim, POST), and the node's own view of the ack (its handler's time
//! and the writer's WAL sync, from its histograms), without a rule.
//! `ANKUSA_BENCH_EXTRA` adds YAML to the node's configuration, to compare settings in one
//! sitting (e.g. `ANKUSA_BENCH_EXTRA='dispatch: { start_at_commit: false }'`; see
//! `load::bench_extra`).
//!
//! PASS only if p50 < 5 ms and p99 < 25 ms (Svix, measured on this machine at 500/s:
//! 1.9 ms and 10.3 ms).
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::Arc;
use std::time::Duration;

mod load;

const RATE: u64 = 1_000;
const SECS: u64 = 10;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (lat, missing, acks, rest, node_view) = rt.block_on(async {
        let (sink, port) = load::arrival_sink(Duration::ZERO).await;
        let node = load::relay_with_sink(
            dir.path(),
            std::net::SocketAddr::from(([127, 0, 0, 1], port)),
            "",
            "",
        )
        .await;
        let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
        let sent =
            load::open_loop(url, RATE, SECS, BODY, |n| format!("tenant-{}", n % TENANTS)).await;
        let (lat, missing) = load::delivery_lags(&sink, &sent, Duration::from_secs(30)).await;
        let node_view = node.metrics.encode();
        node.shutdown().await.expect("shutdown");
        let (acks, rest) = load::lag_parts(&sink, &sent);
        (lat, missing, acks, rest, node_view)
    });
    let (p50, p90, p99, max) = (
        load::pct(&lat, 0.50),
        load::pct(&lat, 0.90),
        load::pct(&lat, 0.99),
        load::pct(&lat, 1.0),
    );
    println!(
        "\nlatency — open loop at {RATE} hooks/s for {SECS}s, {BODY} B, {TENANTS} tenants, a local sink"
    );
    println!("| hooks delivered | never arrived | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |");
    println!("|---:|---:|---:|---:|---:|---:|");
    println!(
        "| {} | {missing} | {p50:.2} | {p90:.2} | {p99:.2} | {max:.2} |",
        lat.len()
    );
    println!("\nwhere it goes (reference, no rule)");
    println!("| part | p50 (ms) | p90 (ms) | p99 (ms) | max (ms) |");
    println!("|---|---:|---:|---:|---:|");
    for (name, l) in [("ack (request to 202)", &acks), ("202 to receipt", &rest)] {
        if !l.is_empty() {
            println!(
                "| {name} | {:.2} | {:.2} | {:.2} | {:.2} |",
                load::pct(l, 0.50),
                load::pct(l, 0.90),
                load::pct(l, 0.99),
                load::pct(l, 1.0)
            );
        }
    }
    // The node's own view of the ack: from its handler's start to its answer, and the
    // writer's synced commit (histogram bucket bounds). An ack the sender saw stall that
    // the node did not was lost outside the node: the sender's task or the host.
    println!("\nthe node's own view (histogram bucket bounds, ms; reference, no rule)");
    println!("| histogram | p50 | p99 | max |");
    println!("|---|---:|---:|---:|");
    for (name, metric) in [
        ("ingest handler", "ankusa_ingest_latency_seconds"),
        ("writer's WAL sync", "ankusa_writer_commit_seconds"),
    ] {
        let q = |q: f64| load::histogram_quantile(&node_view, metric, q) * 1e3;
        println!(
            "| {name} | {:.2} | {:.2} | {:.2} |",
            q(0.5),
            q(0.99),
            q(1.0)
        );
    }
    println!("\npass: p50 < 5 ms, p99 < 25 ms, every hook delivered");
    if p50 < 5.0 && p99 < 25.0 && missing == 0 {
        println!("latency: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("latency: FAIL");
        std::process::ExitCode::FAILURE
    }
}
