//! `cargo bench -p ankusa-relay --bench archive`: does the archiver keep up, and what does
//! it cost ingest?
//!
//! 1. **Settle.** A store with 10⁶ hooks (256 B bodies, 1 000 tenants, one sink each, every
//!    hook with an archive obligation), written through the writer's assembler; the
//!    archiver settles them all in passes of 1 000 (`archive.settle_batch`): rows/s.
//! 2. **Ingest.** Two nodes as in `ingest` (64 keep-alive clients, 1 KiB hmac-signed hooks,
//!    1 000 tenants, delivery on to a local sink), 6 s of closed-loop load each: the route
//!    not archived, then archived (the archiver settling as hooks come, every 100 ms).
//!    p99 ack of each, and the obligations still unsettled at the end of the load.
//!
//! PASS if settling runs at ≥ 5 000 rows/s, the archived run's p99 ack is within 2× the
//! plain run's, and its unsettled obligations at the end of the load are under 2 s worth of
//! its own ingest (the archiver keeps up with the load it is under).
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_keyspace::AtMs;
use ankusa_queue::archive::Archiver;
use ankusa_queue::counters;
use ankusa_queue::writer::Assembler;
use ankusa_records::Envelope;
use ankusa_store::{OpenOptions, Store};

mod load;

const HOOKS: u64 = 1_000_000;
const TENANTS: u64 = 1_000;
const CLIENTS: usize = 64;
const RUN: Duration = Duration::from_secs(6);

/// Writes `HOOKS` hooks with obligations, 1 000 per unsynced batch.
fn fill(store: &Store) {
    let mut asm = Assembler::open(store, 1_000_000).expect("assembler");
    let now = ankusa_keyspace::now_ms();
    for chunk in 0..HOOKS / 1_000 {
        let envs: Vec<Envelope> = (0..1_000)
            .map(|i| {
                let n = chunk * 1_000 + i;
                Envelope::builder(format!("hk_bench_{n}"), "bench")
                    .tenant(Some(&format!("t{}", n % TENANTS)))
                    .received_at(AtMs(now + n / 1_000))
                    .sinks(["s"])
                    .body(vec![b'x'; 256])
                    .build()
            })
            .collect();
        let batch = asm.assemble(store, &envs, true).expect("assemble");
        asm.commit(store, batch, false).expect("commit");
    }
}

/// Settles every obligation: (rows, seconds).
fn settle_all(store: &Store) -> (u64, f64) {
    let mut a = Archiver::default();
    let keep = |_: &str| Some(30 * 86_400_000u64);
    let started = Instant::now();
    let mut rows = 0;
    loop {
        let r = a.settle(store, &keep, 1_000).expect("settle");
        if r.seen == 0 {
            break;
        }
        rows += r.archived;
    }
    (rows, started.elapsed().as_secs_f64())
}

struct Run {
    rate: f64,
    p50_ms: f64,
    p99_ms: f64,
    unsettled: i64,
}

async fn ingest(archived: bool) -> Run {
    let sink = load::noop_sink().await;
    let dir = tempfile::tempdir().expect("tempdir");
    let route = if archived {
        ", archive: { enabled: true }"
    } else {
        ""
    };
    let node = load::relay_with_route(
        dir.path(),
        sink,
        "",
        route,
        "archive: { settle_interval_ms: 100 }",
    )
    .await;
    let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
    let (secs, lat) = load::closed_loop(url, CLIENTS, RUN, TENANTS, 1_024).await;
    let unsettled = counters::node(&node.store)
        .expect("counters")
        .archive_pending;
    node.shutdown().await.expect("shutdown");
    Run {
        rate: lat.len() as f64 / secs,
        p50_ms: load::pct(&lat, 0.50),
        p99_ms: load::pct(&lat, 0.99),
        unsettled,
    }
}

fn main() -> std::process::ExitCode {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = Store::open(dir.path().join("db"), &OpenOptions::default()).expect("store");
    let started = Instant::now();
    fill(&store);
    let filled = started.elapsed().as_secs_f64();
    let (rows, secs) = settle_all(&store);
    let settle_rate = rows as f64 / secs;
    let pending = counters::node(&store).expect("counters").archive_pending;
    drop(store);

    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let plain = rt.block_on(ingest(false));
    let archived = rt.block_on(ingest(true));

    println!("\narchive — settle {HOOKS} obligations (256 B bodies, {TENANTS} tenants; written in {filled:.1} s), then ingest with and without the archiver ({CLIENTS} clients, 1 KiB hooks, {}s each)", RUN.as_secs());
    println!("| settle | rows | seconds | rows/s | obligations left |");
    println!("|---|---:|---:|---:|---:|");
    println!("| archiver, passes of 1 000 | {rows} | {secs:.1} | {settle_rate:.0} | {pending} |");
    println!("\n| ingest run | hooks/s | p50 ack (ms) | p99 ack (ms) | unsettled at the end |");
    println!("|---|---:|---:|---:|---:|");
    for (label, r) in [
        ("route not archived", &plain),
        ("route archived", &archived),
    ] {
        println!(
            "| {label} | {:.0} | {:.2} | {:.2} | {} |",
            r.rate, r.p50_ms, r.p99_ms, r.unsettled
        );
    }
    let p99_ratio = archived.p99_ms / plain.p99_ms;
    let behind_s = archived.unsettled as f64 / archived.rate;
    println!(
        "\nsettle {settle_rate:.0} rows/s; archived p99 / plain p99 = {p99_ratio:.2}; unsettled at the end = {behind_s:.2} s of ingest"
    );
    println!("pass: settle >= 5000 rows/s, p99 ratio <= 2, unsettled < 2 s of ingest, every obligation settled");
    if settle_rate >= 5_000.0 && p99_ratio <= 2.0 && behind_s < 2.0 && pending == 0 && rows == HOOKS
    {
        println!("archive: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("archive: FAIL");
        std::process::ExitCode::FAILURE
    }
}
