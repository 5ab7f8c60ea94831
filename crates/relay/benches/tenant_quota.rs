//! `cargo bench -p ankusa-relay --bench tenant_quota`: does a tenant's ingest quota keep a
//! flood off everyone else's acks, and take the flood at its limit?
//!
//! One node, every tenant limited to `LIMIT` hooks/s (`tenants.limits`, burst `BURST`),
//! one sink that answers at once. In one round:
//! 1. 100 quiet tenants, together `QUIET_RATE` hooks/s (each far under its limit), open
//!    loop for `SECS` s;
//! 2. the same quiet load beside a flooding tenant sending at 10× its limit.
//!
//! For each quiet hook, the time from its request to its 202 (every one must be 202); for
//! the flood, how many it got accepted a second.
//!
//! The pair runs three times, each round on a fresh node and store; the median of three
//! rounds keeps the rule about the quota and not one fsync stall of the shared disk.
//!
//! PASS only if the median over the rounds of (the quiet tenants' ack p99 beside the flood
//! / alone, alone counted as at least 5 ms) is at most 2, and in every round the flood's
//! accepted rate is within 10% of its limit.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::Arc;
use std::time::Duration;

mod load;

const LIMIT: u64 = 100;
const BURST: u64 = 10;
const FLOOD_RATE: u64 = 10 * LIMIT;
const QUIET_TENANTS: u64 = 100;
const QUIET_RATE: u64 = 200;
const SECS: u64 = 10;
const BODY: usize = 1_024;
const ROUNDS: usize = 3;

/// Open-loop ingest as [`load::open_loop`], keeping each answer's status and ack latency.
async fn send(url: Arc<str>, rate: u64, tenant: impl Fn(u64) -> String) -> Vec<(u16, Duration)> {
    load::open_loop_with(url, rate, SECS, BODY, tenant, |status, _, sent| {
        (status, sent.elapsed())
    })
    .await
}

struct Round {
    alone: Vec<Duration>,
    with_flood: Vec<Duration>,
    refused_quiet: usize,
    flood_accepted: usize,
    flood_refused: usize,
}

/// The quiet tenants' sorted ack latencies, and how many were not 202.
fn acks(answers: &[(u16, Duration)]) -> (Vec<Duration>, usize) {
    let mut lat: Vec<Duration> = answers
        .iter()
        .filter(|(s, _)| *s == 202)
        .map(|(_, d)| *d)
        .collect();
    lat.sort();
    let refused = answers.len() - lat.len();
    (lat, refused)
}

async fn round() -> Round {
    let dir = tempfile::tempdir().expect("tempdir");
    let sink = load::noop_sink().await;
    let node = load::relay(
        dir.path(),
        sink,
        &format!("tenants: {{ limits: {{ ingest_per_second: {LIMIT}, ingest_burst: {BURST} }} }}"),
    )
    .await;
    let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
    let quiet = |n| format!("quiet-{}", n % QUIET_TENANTS);
    let (alone, refused_alone) = acks(&send(url.clone(), QUIET_RATE, quiet).await);
    let flood = tokio::spawn(send(url.clone(), FLOOD_RATE, |_| "flood".to_owned()));
    let (with_flood, refused_flood) = acks(&send(url, QUIET_RATE, quiet).await);
    let flood = flood.await.expect("flood");
    let flood_accepted = flood.iter().filter(|(s, _)| *s == 202).count();
    let flood_refused = flood.iter().filter(|(s, _)| *s == 429).count();
    node.shutdown().await.expect("shutdown");
    Round {
        alone,
        with_flood,
        refused_quiet: refused_alone + refused_flood,
        flood_accepted,
        flood_refused,
    }
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    println!(
        "\ntenant_quota — {QUIET_TENANTS} quiet tenants at {QUIET_RATE}/s together, a flood at {FLOOD_RATE}/s; every tenant limited to {LIMIT}/s (burst {BURST}); {SECS}s each, {ROUNDS} rounds"
    );
    println!("| round | quiet tenants | hooks | ack p50 (ms) | ack p99 (ms) | ack max (ms) | flood accepted/s | flood 429 |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    let mut rates_ok = true;
    let mut refused_quiet = 0;
    for n in 1..=ROUNDS {
        let r = rt.block_on(round());
        let rate = r.flood_accepted as f64 / SECS as f64;
        for (label, lat, flood) in [
            ("alone", &r.alone, String::from("-")),
            ("beside the flood", &r.with_flood, format!("{rate:.1}")),
        ] {
            println!(
                "| {n} | {label} | {} | {:.2} | {:.2} | {:.2} | {flood} | {} |",
                lat.len(),
                load::pct(lat, 0.5),
                load::pct(lat, 0.99),
                load::pct(lat, 1.0),
                if flood == "-" { 0 } else { r.flood_refused },
            );
        }
        let (a99, f99) = (load::pct(&r.alone, 0.99), load::pct(&r.with_flood, 0.99));
        ratios.push(f99 / a99.max(5.0));
        rates_ok &= (rate - LIMIT as f64).abs() <= 0.1 * LIMIT as f64;
        refused_quiet += r.refused_quiet;
    }
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "\nquiet ack p99 beside the flood / alone, by round: {}; median {median:.2}x (pass: <= 2x, alone counted as >= 5 ms); flood within 10% of {LIMIT}/s in every round: {rates_ok}; quiet hooks refused: {refused_quiet}",
        shown.join(", ")
    );
    if median <= 2.0 && rates_ok && refused_quiet == 0 {
        println!("tenant_quota: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("tenant_quota: FAIL");
        std::process::ExitCode::FAILURE
    }
}
