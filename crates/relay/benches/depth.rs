//! `cargo bench -p ankusa-relay --bench depth`: does ingest slow down as the queue grows,
//! and how fast does a deep queue drain?
//!
//! One node (1 000 tenants, 1 KiB hmac-signed hooks, 64 closed-loop clients) whose sink is
//! down: it accepts connections and holds every request (the node's deliveries in flight
//! fill their permits, and everything else stays queued). Ingest runs until 10⁶ hooks are
//! queued; at every 10⁵ the bench reports the ingest rate of that slice, the process's
//! RSS, and the dispatch ticks so far. Then the sink comes up (the held requests are
//! answered, and every later one at once), and the bench reports the drain: how long
//! until nothing is queued, the rate, and the ticks' cost (`ankusa_dispatch_tick_seconds`).
//!
//! PASS only if the ingest rate near 10⁶ queued is at least 80% of the rate near 10⁵ (the
//! median rate of the last three slices of 10⁵ against that of the first three: one slice
//! swings by ±15% on a shared machine), and the RSS stays under 512 MiB. Each slice also
//! shows the process's CPU and the host's steal, so a slow slice can be told from a slow
//! node.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_queue::counters;

mod load;

const CLIENTS: u64 = 64;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const STEP: u64 = 100_000;
const DEPTH: u64 = 1_000_000;
const RSS_MAX_MIB: f64 = 512.0;

/// A sink that holds every request while `up` is false, then answers 200.
async fn held_sink(up: tokio::sync::watch::Receiver<bool>) -> std::net::SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let app = axum::Router::new()
        .fallback(
            |axum::extract::State(mut up): axum::extract::State<
                tokio::sync::watch::Receiver<bool>,
            >| async move {
                let _ = up.wait_for(|u| *u).await;
                axum::http::StatusCode::OK
            },
        )
        .with_state(up);
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    addr
}

struct Step {
    queued: u64,
    rate: f64,
    rss_mib: f64,
    ticks: f64,
    /// The process's CPU over the slice, in cores.
    cores: f64,
    /// The host's CPU stolen by the hypervisor over the slice, %.
    steal: f64,
}

/// The median of the rates of these slices.
fn median_rate(steps: &[Step]) -> f64 {
    let mut r: Vec<f64> = steps.iter().map(|s| s.rate).collect();
    r.sort_by(f64::total_cmp);
    r[r.len() / 2]
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (steps, drain_s, drained, tick_avg_ms, ticks_in_drain, rss_max) = rt.block_on(async {
        let (up_tx, up_rx) = tokio::sync::watch::channel(false);
        let sink = held_sink(up_rx).await;
        let node = load::relay_with_sink(dir.path(), sink, ", timeout_ms: 600000", "").await;
        let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
        let acked = Arc::new(AtomicU64::new(0));
        let client = load::client(CLIENTS as usize);
        let tasks: Vec<_> = (0..CLIENTS)
            .map(|w| {
                let (client, url, acked) = (client.clone(), url.clone(), acked.clone());
                tokio::spawn(async move {
                    let mut n = 0u64;
                    while acked.load(Ordering::Relaxed) < DEPTH {
                        let req = load::signed_hook(&url, w, n, TENANTS, BODY);
                        load::post_acked(&client, req).await;
                        acked.fetch_add(1, Ordering::Relaxed);
                        n += 1;
                    }
                    Vec::<()>::new()
                })
            })
            .collect();
        let mut steps = Vec::new();
        let mut rss_max: f64 = 0.0;
        let (mut last_t, mut last_n) = (Instant::now(), 0u64);
        let (mut last_cpu, mut last_host) = (load::cpu_time(), load::host_cpu());
        let mut next = STEP;
        while next <= DEPTH {
            tokio::time::sleep(Duration::from_millis(20)).await;
            rss_max = rss_max.max(load::rss_mib());
            let n = acked.load(Ordering::Relaxed);
            if n >= next {
                let m = node.metrics.encode();
                let (cpu, host) = (load::cpu_time(), load::host_cpu());
                let secs = last_t.elapsed().as_secs_f64();
                steps.push(Step {
                    queued: next,
                    rate: (n - last_n) as f64 / secs,
                    rss_mib: load::rss_mib(),
                    ticks: load::metric(&m, "ankusa_dispatch_tick_seconds_count"),
                    cores: (cpu - last_cpu).as_secs_f64() / secs,
                    steal: load::steal_pct(last_host, host),
                });
                (last_t, last_n) = (Instant::now(), n);
                (last_cpu, last_host) = (cpu, host);
                next += STEP;
            }
        }
        load::gather(tasks).await;
        // The sink comes up: drain.
        let m = node.metrics.encode();
        let (ticks0, tick_s0) = (
            load::metric(&m, "ankusa_dispatch_tick_seconds_count"),
            load::metric(&m, "ankusa_dispatch_tick_seconds_sum"),
        );
        let queued_at_start = {
            let c = counters::node(&node.store).expect("counters");
            (c.pending + c.scheduled + c.inflight) as u64
        };
        let t = Instant::now();
        up_tx.send(true).expect("sink gate");
        loop {
            tokio::time::sleep(Duration::from_millis(100)).await;
            rss_max = rss_max.max(load::rss_mib());
            let c = counters::node(&node.store).expect("counters");
            if c.pending + c.scheduled + c.inflight == 0 {
                break;
            }
            assert!(
                t.elapsed() < Duration::from_secs(900),
                "the queue did not drain in 15 minutes: {c:?}"
            );
        }
        let drain_s = t.elapsed().as_secs_f64();
        let m = node.metrics.encode();
        let ticks = load::metric(&m, "ankusa_dispatch_tick_seconds_count") - ticks0;
        let tick_s = load::metric(&m, "ankusa_dispatch_tick_seconds_sum") - tick_s0;
        node.shutdown().await.expect("shutdown");
        (
            steps,
            drain_s,
            queued_at_start,
            tick_s / ticks.max(1.0) * 1e3,
            ticks,
            rss_max,
        )
    });
    println!(
        "\ndepth — {TENANTS} tenants, {BODY} B hmac-signed hooks, {CLIENTS} clients, the sink holding every request"
    );
    println!("| queued | ingest hooks/s (this 10⁵) | RSS (MiB) | dispatch ticks so far | process CPU (cores) | host steal (%) |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for s in &steps {
        println!(
            "| {} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} |",
            s.queued, s.rate, s.rss_mib, s.ticks, s.cores, s.steal
        );
    }
    println!(
        "\ndrain: {drained} rows in {drain_s:.1}s = {:.0} rows/s; {ticks_in_drain:.0} ticks, {tick_avg_ms:.2} ms each on average",
        drained as f64 / drain_s
    );
    let (first, last) = (&steps[0], &steps[steps.len() - 1]);
    // One slice of 10⁵ swings by ±15% on this shared machine with no trend at all, so the
    // rule compares the median of the first three slices with that of the last three: a
    // queue that slows as it grows fails it, one noisy slice does not.
    let ratio = median_rate(&steps[steps.len() - 3..]) / median_rate(&steps[..3]);
    println!(
        "rate at 10⁶ / rate at 10⁵ = {:.0}% (one slice each, reference); median of the last three slices / of the first three = {:.0}% (pass: >= 80%), peak RSS = {rss_max:.0} MiB (pass: < {RSS_MAX_MIB:.0})",
        last.rate / first.rate * 100.0,
        ratio * 100.0
    );
    if ratio >= 0.8 && rss_max < RSS_MAX_MIB {
        println!("depth: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("depth: FAIL");
        std::process::ExitCode::FAILURE
    }
}
