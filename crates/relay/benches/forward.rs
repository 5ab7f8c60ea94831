//! `cargo bench -p ankusa-relay --bench forward`: what ingest through a node that does not
//! own the tenant costs, against ingest straight to the owner.
//!
//! A Relay of two nodes (`a`, `b`) in this process, on loopback. Every hook is for one of
//! 1 000 tenants that `b` owns. 64 keep-alive clients post 1 KiB bodies, signed
//! hmac-sha256, for 5 s:
//! - **direct**: to `b`, which verifies, commits (synced) and acks;
//! - **forwarded**: to `a`, which verifies, finds the tenant, sends the request on to `b`
//!   over its keep-alive pool and answers with `b`'s ack.
//!
//! Rounds alternate (direct, forwarded, direct, forwarded) after a warm-up that admits
//! every tenant, so neither side pays the tenant registry or a cold page cache; each mode's
//! rate is its hooks over its seconds, its p99 over all its acks. Both nodes share the
//! machine's two cores, so the forwarded run also pays `a`'s HTTP work on them.
//!
//! PASS if forwarding keeps at least 70% of the direct rate.
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::Arc;
use std::time::Duration;

mod load;

const CLIENTS: usize = 64;
const TENANTS: usize = 1_000;
const BODY: usize = 1_024;
const RUN: Duration = Duration::from_secs(5);
/// Node `name` of the Relay `all`.
async fn node(
    name: &str,
    all: &[(&str, &load::Ports)],
    dir: &std::path::Path,
    sink: std::net::SocketAddr,
) -> ankusa_relay::node::Node {
    let config = load::relay_member(name, all, &[], "", load::bench_node(sink, "", ""), dir);
    ankusa_relay::node::Node::start(config).await.expect("node")
}

/// `CLIENTS` clients posting to `url` for `run`, each request for one of `tenants`:
/// (seconds, latencies).
async fn load(url: Arc<str>, tenants: Arc<Vec<String>>, run: Duration) -> (f64, Vec<Duration>) {
    let tenant = move |w: u64, n: u64| tenants[((w * 31 + n) as usize) % tenants.len()].clone();
    load::closed_loop_with(url, CLIENTS, run, BODY, Arc::new(tenant)).await
}

#[derive(Default)]
struct Mode {
    secs: f64,
    lat: Vec<Duration>,
}

impl Mode {
    fn rate(&self) -> f64 {
        self.lat.len() as f64 / self.secs
    }
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (direct, forwarded, forward_p99) = rt.block_on(async {
        let sink = load::noop_sink().await;
        let dir = tempfile::tempdir().expect("tempdir");
        let (pa, pb) = (load::Ports::free(), load::Ports::free());
        let all = [("a", &pa), ("b", &pb)];
        let a = node("a", &all, dir.path(), sink).await;
        let b = node("b", &all, dir.path(), sink).await;
        let names = ["a", "b"];
        let tenants: Arc<Vec<String>> = Arc::new(
            (0..)
                .map(|i| format!("tenant-{i}"))
                .filter(|t| ankusa_relay::cluster::owner_index(names.iter().copied(), t) == 1)
                .take(TENANTS)
                .collect(),
        );
        let to_b: Arc<str> = format!("http://127.0.0.1:{}/ingest/bench", pb.ingest).into();
        let to_a: Arc<str> = format!("http://127.0.0.1:{}/ingest/bench", pa.ingest).into();
        // Warm-up: every tenant admitted by the registry (on `a`) and known to `b`.
        load(to_b.clone(), tenants.clone(), Duration::from_secs(2)).await;
        let (mut direct, mut forwarded) = (Mode::default(), Mode::default());
        for _ in 0..2 {
            let (s, l) = load(to_b.clone(), tenants.clone(), RUN).await;
            direct.secs += s;
            direct.lat.extend(l);
            let (s, l) = load(to_a.clone(), tenants.clone(), RUN).await;
            forwarded.secs += s;
            forwarded.lat.extend(l);
        }
        // The ingest kind's buckets, as an unlabelled histogram.
        let m = a.metrics.encode().replace("\",kind=\"ingest\"}", "\"}");
        let forward_p99 = load::histogram_quantile(&m, "ankusa_cluster_forward_seconds", 0.99);
        a.shutdown().await.expect("shutdown a");
        b.shutdown().await.expect("shutdown b");
        (direct, forwarded, forward_p99)
    });
    let row = |label: &str, m: &mut Mode| {
        m.lat.sort();
        println!(
            "| {label} | {} | {:.0} | {:.2} | {:.2} |",
            m.lat.len(),
            m.rate(),
            load::pct(&m.lat, 0.50),
            load::pct(&m.lat, 0.99)
        );
    };
    let (mut direct, mut forwarded) = (direct, forwarded);
    println!(
        "\nforward — two nodes, {CLIENTS} keep-alive clients, {BODY} B bodies, {TENANTS} tenants owned by b, hmac-sha256, 2 × {}s per mode",
        RUN.as_secs()
    );
    println!("| mode | hooks acked | hooks/s | p50 ack (ms) | p99 ack (ms) |");
    println!("|---|---:|---:|---:|---:|");
    row("direct (to the owner)", &mut direct);
    row("forwarded (through a non-owner)", &mut forwarded);
    let share = forwarded.rate() / direct.rate();
    println!(
        "\nforwarded / direct = {:.0}%; a's forward to b p99 (ankusa_cluster_forward_seconds, bucket bound) = {:.2} ms",
        share * 100.0,
        forward_p99 * 1e3
    );
    println!("pass: forwarded / direct >= 70%");
    if share >= 0.70 {
        println!("forward: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("forward: FAIL");
        std::process::ExitCode::FAILURE
    }
}
