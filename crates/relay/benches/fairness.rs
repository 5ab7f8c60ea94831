//! `cargo bench -p ankusa-relay --bench fairness`: does a flooding tenant hold back a
//! quiet one?
//!
//! One node, one sink of limited capacity (16 slots, each answer held 10 ms: about 1 600
//! hooks/s). In one run:
//! 1. the victim tenant alone, open loop at 50 hooks/s for 10 s;
//! 2. the victim again at 50 hooks/s, beside a flooding tenant at 100× its rate (5 000
//!    hooks/s, above the sink's capacity, so the flood's backlog grows) into the same
//!    sink.
//!
//! For each victim hook, the time from its ingest request to the sink's receipt.
//!
//! The pair runs three times, each round on a fresh node and store (the flood's backlog
//! from one round would otherwise hold the next round's "alone"). On this shared disk one
//! fsync stall during a round's flood moves that round's p99 by tens of milliseconds
//! through the victim's ack, whatever dispatch does; the median of three rounds keeps the
//! rule about the scheduling.
//!
//! PASS only if the median over the rounds of (the victim's p99 with the flood / its p99
//! alone, counted as at least 5 ms) is at most 2, and every victim hook arrived.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::Arc;
use std::time::Duration;

mod load;

const VICTIM_RATE: u64 = 50;
const FLOOD_RATE: u64 = 5_000;
const SECS: u64 = 10;
const BODY: usize = 1_024;
const SINK_SLOTS: usize = 16;
const SINK_DELAY: Duration = Duration::from_millis(10);
const ROUNDS: usize = 3;

struct Round {
    alone: Vec<Duration>,
    with_flood: Vec<Duration>,
    parts: [(Vec<Duration>, Vec<Duration>); 2],
    missing: usize,
    flood_sent: usize,
    flood_delivered: usize,
}

async fn round() -> Round {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sink, port) = load::arrival_sink(SINK_DELAY).await;
    let node = load::relay_with_sink(
        dir.path(),
        std::net::SocketAddr::from(([127, 0, 0, 1], port)),
        &format!(", max_inflight: {SINK_SLOTS}"),
        "",
    )
    .await;
    let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
    let victim = |_| "victim".to_owned();
    let sent = load::open_loop(url.clone(), VICTIM_RATE, SECS, BODY, victim).await;
    let (alone, missing_alone) = load::delivery_lags(&sink, &sent, Duration::from_secs(10)).await;
    let parts_alone = load::lag_parts(&sink, &sent);
    let flood = tokio::spawn(load::open_loop(url.clone(), FLOOD_RATE, SECS, BODY, |_| {
        "flood".to_owned()
    }));
    let sent = load::open_loop(url, VICTIM_RATE, SECS, BODY, victim).await;
    let flood_sent = flood.await.expect("flood").len();
    let (with_flood, missing_flood) =
        load::delivery_lags(&sink, &sent, Duration::from_secs(10)).await;
    let parts_flood = load::lag_parts(&sink, &sent);
    let flood_delivered =
        sink.count.load(std::sync::atomic::Ordering::Relaxed) as usize - 2 * sent.len();
    node.shutdown().await.expect("shutdown");
    Round {
        alone,
        with_flood,
        parts: [parts_alone, parts_flood],
        missing: missing_alone + missing_flood,
        flood_sent,
        flood_delivered,
    }
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    println!(
        "\nfairness — victim at {VICTIM_RATE}/s, flood at {FLOOD_RATE}/s, one sink of {SINK_SLOTS} slots × {} ms, {SECS}s each, {ROUNDS} rounds",
        SINK_DELAY.as_millis()
    );
    println!("| round | victim | hooks | p50 (ms) | p99 (ms) | max (ms) | ack p99 (ms) | ack to arrival p99 (ms) |");
    println!("|---:|---|---:|---:|---:|---:|---:|---:|");
    let mut ratios = Vec::new();
    let mut missing = 0;
    let mut flood = Vec::new();
    for n in 1..=ROUNDS {
        let r = rt.block_on(round());
        for ((label, lat), (ack, dispatch)) in
            [("alone", &r.alone), ("beside the flood", &r.with_flood)]
                .into_iter()
                .zip(&r.parts)
        {
            println!(
                "| {n} | {label} | {} | {:.2} | {:.2} | {:.2} | {:.2} | {:.2} |",
                lat.len(),
                load::pct(lat, 0.5),
                load::pct(lat, 0.99),
                load::pct(lat, 1.0),
                load::pct(ack, 0.99),
                load::pct(dispatch, 0.99)
            );
        }
        let (a99, f99) = (load::pct(&r.alone, 0.99), load::pct(&r.with_flood, 0.99));
        ratios.push(f99 / a99.max(5.0));
        missing += r.missing;
        flood.push(format!(
            "{} acked, {} delivered",
            r.flood_sent, r.flood_delivered
        ));
    }
    println!("flood per round: {}", flood.join("; "));
    let shown: Vec<String> = ratios.iter().map(|r| format!("{r:.2}x")).collect();
    ratios.sort_by(f64::total_cmp);
    let median = ratios[ratios.len() / 2];
    println!(
        "\nvictim p99 with the flood / alone, by round: {}; median {median:.2}x (pass: <= 2x, alone counted as >= 5 ms); never arrived: {missing}",
        shown.join(", ")
    );
    if median <= 2.0 && missing == 0 {
        println!("fairness: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("fairness: FAIL");
        std::process::ExitCode::FAILURE
    }
}
