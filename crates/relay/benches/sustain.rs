//! `cargo bench -p ankusa-relay --bench sustain`: does reclaim keep up, and does the node
//! go quiet after the load?
//!
//! One node (1 000 tenants, 1 KiB hmac-signed hooks, delivery on to a local no-op sink).
//! First 4 s of closed-loop load (64 clients, as in `ingest`) measure what this node takes
//! in this run; then 60 s of open-loop load at 80% of that rate, then 30 s idle. Every
//! 10 s the hooks family's size (keys) is counted, with the queued rows and the reclaim
//! backlog gauge; every idle second, the process's CPU (the load generator and the sink
//! are idle by then, so it is the node's).
//!
//! Then the same from outside, against the anchor that does not move with the code
//! ([`load::outside`]): `wrk -t2 -c64` for 60 s at a no-op axum handler process, then at a
//! relay process (its sink in this one), each process's CPU from `/proc`; the relay's CPU
//! per acked hook over its whole life (ingest, delivery, reclaim) against the no-op's per
//! request.
//!
//! PASS only if the hooks awaiting reclaim at the end of the load (hooks in the family
//! that no delivery, dead row or obligation needs) are under 2 s worth of ingest, the
//! idle CPU falls under 5% of one core within 10 s of the load stopping, and from outside
//! the relay's CPU per acked hook is at most [`load::outside::ANCHOR_RATIO`]× the no-op's
//! per request with wrk's p99 under 10 ms (`wrk` missing: FAIL; `make bench` installs it).
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use ankusa_store::Rows;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_keyspace::Family;
use ankusa_queue::counters;
use ankusa_queue::counters::Counters;
use ankusa_relay::node::Node;

mod load;

const CLIENTS: u64 = 64;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const CALIBRATE: Duration = Duration::from_secs(4);
const LOAD: Duration = Duration::from_secs(60);
const IDLE: Duration = Duration::from_secs(30);
/// Each process's time under wrk in the outside phase.
const OUTSIDE: Duration = Duration::from_secs(60);

/// Posts hooks until `until`, each client at most every `gap` (no gap: closed loop).
/// Returns the hooks acked.
async fn post_until(url: Arc<str>, until: Instant, gap: Option<Duration>, first: u64) -> u64 {
    let client = load::client(CLIENTS as usize);
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|w| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                // Clients start spread over one gap, so the open-loop load is even.
                let start = Instant::now() + gap.map_or(Duration::ZERO, |g| g * w as u32 / 64);
                let mut n = 0u64;
                let mut acked = Vec::new();
                loop {
                    let at = start + gap.map_or(Duration::ZERO, |g| g * n as u32);
                    // A client that fell behind does not catch up after the end.
                    if at >= until || Instant::now() >= until {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                    let req = load::signed_hook(&url, w, first + n, TENANTS, BODY);
                    load::post_acked(&client, req).await;
                    acked.push(());
                    n += 1;
                }
                acked
            })
        })
        .collect();
    load::gather(tasks).await.len() as u64
}

/// The hooks family's keys, counted (a full read of the family).
fn hook_keys(node: &Node) -> u64 {
    let mut n = 0;
    for kv in node.store.scan_family(Family::Hooks).expect("scan") {
        kv.expect("hook");
        n += 1;
    }
    n
}

/// Rows that still need their hook (one sink: one row per hook).
fn needed(c: &Counters) -> u64 {
    (c.pending + c.scheduled + c.inflight + c.dead).max(0) as u64
}

struct Sample {
    at_s: u64,
    phase: &'static str,
    hooks: u64,
    needed: u64,
    backlog_gauge: f64,
    cpu: Option<f64>,
}

/// Counted off the runtime's workers, so the load and the node keep them.
async fn sample(node: &Node, at_s: u64, phase: &'static str, cpu: Option<f64>) -> Sample {
    let c = counters::node(&node.store).expect("counters");
    let hooks = tokio::task::block_in_place(|| hook_keys(node));
    Sample {
        at_s,
        phase,
        hooks,
        needed: needed(&c),
        backlog_gauge: load::metric(&node.metrics.encode(), "ankusa_reclaim_backlog"),
        cpu,
    }
}

/// The outside phase: its table, and whether its rules hold.
fn outside_judged(rt: &tokio::runtime::Runtime) -> bool {
    use load::outside;
    if !outside::available() {
        println!("\nsustain (outside): wrk is not installed (make bench installs it): FAIL");
        return false;
    }
    let (noop, relay) = outside::alternate(
        rt,
        1,
        OUTSIDE.as_secs(),
        CLIENTS as usize,
        TENANTS as usize,
        BODY,
    );
    println!(
        "\nsustain (outside) — wrk -t{} -c{CLIENTS} for {}s at each process, {BODY} B hmac-signed hooks over {TENANTS} tenants; relay: {}",
        outside::THREADS,
        OUTSIDE.as_secs(),
        outside::relay_bin()
    );
    outside::verdict("sustain", &noop, &relay, "")
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // The outside phase's anchor: this executable again, serving only the no-op handler.
    load::outside::serve_noop_if_asked(&rt);
    let dir = tempfile::tempdir().expect("tempdir");
    let (rate, target, samples, idle_cpu, life) = rt.block_on(async {
        let sink = load::noop_sink().await;
        let node = load::relay(dir.path(), sink, "").await;
        let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
        let t = Instant::now();
        let calibrated = post_until(url.clone(), t + CALIBRATE, None, 0).await;
        let rate = calibrated as f64 / t.elapsed().as_secs_f64();
        let target = rate * 0.8;
        let gap = Duration::from_secs_f64(CLIENTS as f64 / target);
        let mut samples = Vec::new();
        let cpu_start = load::cpu_time();
        let started = Instant::now();
        let load_end = started + LOAD;
        let loader = tokio::spawn(post_until(url, load_end, Some(gap), 1 << 32));
        for s in (10..=LOAD.as_secs()).step_by(10) {
            tokio::time::sleep_until((started + Duration::from_secs(s)).into()).await;
            samples.push(sample(&node, s, "load", None).await);
        }
        let sent = loader.await.expect("loader");
        println!(
            "load: {sent} hooks in {:.1}s ({:.0}/s)",
            started.elapsed().as_secs_f64(),
            sent as f64 / LOAD.as_secs_f64()
        );
        // Idle: the process's CPU each second. A count (every 10 s) is taken after the
        // second's reading and the next second starts after it.
        let mut idle_cpu = Vec::new();
        let idle_start = Instant::now();
        let (mut from, mut cpu0) = (Instant::now(), load::cpu_time());
        for s in 1..=IDLE.as_secs() {
            tokio::time::sleep_until((idle_start + Duration::from_secs(s)).into()).await;
            let cpu = (load::cpu_time() - cpu0).as_secs_f64() / from.elapsed().as_secs_f64();
            idle_cpu.push(cpu);
            if s % 10 == 0 {
                samples.push(sample(&node, LOAD.as_secs() + s, "idle", Some(cpu)).await);
            }
            (from, cpu0) = (Instant::now(), load::cpu_time());
        }
        // Every hook of the load was ingested, delivered and reclaimed by the end of the
        // idle time (the table shows the hook keys back to 0).
        let life = (load::cpu_time() - cpu_start).as_secs_f64() * 1e6 / sent.max(1) as f64;
        node.shutdown().await.expect("shutdown");
        (rate, target, samples, idle_cpu, life)
    });
    println!(
        "\nsustain — {TENANTS} tenants, {BODY} B hmac-signed hooks, delivery on to a local sink; calibrated at {rate:.0} hooks/s, load at 80% = {target:.0} hooks/s for {}s, then {}s idle",
        LOAD.as_secs(),
        IDLE.as_secs()
    );
    println!("| t (s) | phase | hook keys | still needed | awaiting reclaim | reclaim backlog gauge | CPU (cores) |");
    println!("|---:|---|---:|---:|---:|---:|---:|");
    for s in &samples {
        println!(
            "| {} | {} | {} | {} | {} | {:.0} | {} |",
            s.at_s,
            s.phase,
            s.hooks,
            s.needed,
            s.hooks.saturating_sub(s.needed),
            s.backlog_gauge,
            s.cpu.map_or("-".into(), |c| format!("{c:.3}"))
        );
    }
    let idle: Vec<String> = idle_cpu
        .iter()
        .map(|c| format!("{:.0}%", c * 100.0))
        .collect();
    println!("idle CPU by second: {}", idle.join(" "));
    println!(
        "CPU per hook over its whole life — ingested, delivered, reclaimed, and the idle time after: {life:.1} µs (this process: the load generator and the sink included; reference, no rule: the outside phase below judges the relay alone)"
    );
    let end = samples
        .iter()
        .rfind(|s| s.phase == "load")
        .expect("a load sample");
    let awaiting = end.hooks.saturating_sub(end.needed);
    let quiet_after = idle_cpu.iter().position(|c| *c < 0.05).map(|i| i + 1);
    println!(
        "\nawaiting reclaim at the end of the load = {awaiting} (pass: < {:.0}, 2 s of ingest); idle CPU under 5% after {} (pass: <= 10 s)",
        2.0 * target,
        quiet_after.map_or("never".into(), |s| format!("{s} s"))
    );
    let inside = (awaiting as f64) < 2.0 * target && quiet_after.is_some_and(|s| s <= 10);
    let outside = outside_judged(&rt);
    if inside && outside {
        println!("sustain: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("sustain: FAIL");
        std::process::ExitCode::FAILURE
    }
}
