//! `cargo bench -p ankusa-relay --bench slow_clients`: a provider's hooks while 2 000
//! connections that send nothing or a byte at a time hold the ingest listener.
//!
//! A node with its default `ingest.connections` (at most 4 096 open, headers within 10 s)
//! and a sink that answers at once. An open-loop sender posts 1 KiB hooks for 1 000
//! tenants at 500 hooks/s for 10 s: alone first, then while 1 000 idle connections and
//! 1 000 that send a request's headers one byte every 2 s hold the listener (opened over
//! 10 s, each opened again as soon as the node closes it: what an attacker keeping 2 000
//! open does, a churn of 200 connections a second). The attackers run on a runtime of
//! their own. The table gives each phase's ack latency
//! (request to 202) and the connections the node held during the second.
//!
//! PASS only if every hook is acked in both phases, the node held at least 90 % of the
//! 2 000 connections throughout the second (each closed one is opened again at once, but
//! a sample falls between the two for some: the least seen was 1 902–1 904), and its ack
//! p99 is below twice the first phase's and below 25 ms (the `latency` bench's anchor).
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

mod load;

const RATE: u64 = 500;
const SECS: u64 = 10;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const IDLE: usize = 1_000;
const TRICKLING: usize = 1_000;

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let dir = tempfile::tempdir().expect("tempdir");
    let (alone, attacked, held, cut) = rt.block_on(async {
        let sink = load::noop_sink().await;
        let node = load::relay(dir.path(), sink, "").await;
        let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
        let acks = |sent: Vec<load::Sent>| -> Vec<Duration> {
            let mut v: Vec<Duration> = sent.iter().map(|s| s.acked - s.sent).collect();
            v.sort();
            v
        };
        let alone = acks(
            load::open_loop(url.clone(), RATE, SECS, BODY, |n| {
                format!("tenant-{}", n % TENANTS)
            })
            .await,
        );

        // The attackers, on a thread and runtime of their own.
        let stop = Arc::new(AtomicBool::new(false));
        let addr = node.ingest_addr;
        let attackers = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("attackers' runtime");
                rt.block_on(async move {
                    let mut tasks = Vec::new();
                    // Opened over one header timeout (10 s), so the node closes them as
                    // evenly and they come back as evenly: 200 a second, the churn of
                    // 2 000 held open (a burst of all 2 000 at once is its own case).
                    let spread = Duration::from_millis(10_000 / (IDLE + TRICKLING) as u64);
                    for i in 0..IDLE + TRICKLING {
                        let trickle = i % 2 == 1;
                        tasks.push(tokio::spawn(attacker(addr, trickle, stop.clone())));
                        tokio::time::sleep(spread).await;
                    }
                    for t in tasks {
                        let _ = t.await;
                    }
                })
            })
        };
        let open = |m: &str| load::metric(m, r#"ankusa_http_connections{listener="ingest"}"#);
        let deadline = Instant::now() + Duration::from_secs(60);
        while open(&node.metrics.encode()) < least_held() {
            assert!(
                Instant::now() < deadline,
                "the attackers never held {} connections",
                IDLE + TRICKLING
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The fewest connections held while the provider sends (sampled every 100 ms).
        let metrics = node.metrics.clone();
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = {
            let sampling = sampling.clone();
            tokio::spawn(async move {
                let mut least = f64::MAX;
                while sampling.load(Ordering::Relaxed) {
                    least = least.min(open(&metrics.encode()));
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                least
            })
        };
        let attacked = acks(
            load::open_loop(url.clone(), RATE, SECS, BODY, |n| {
                format!("tenant-{}", n % TENANTS)
            })
            .await,
        );
        sampling.store(false, Ordering::Relaxed);
        let held = sampler.await.expect("sampler");
        stop.store(true, Ordering::Relaxed);
        attackers.join().expect("attackers");
        let cut = load::metric(
            &node.metrics.encode(),
            r#"ankusa_http_timeouts_total{listener="ingest",phase="headers"}"#,
        );
        node.shutdown().await.expect("shutdown");
        (alone, attacked, held, cut)
    });
    let ms = |l: &[Duration], p: f64| load::pct(l, p);
    println!(
        "\nslow_clients — {RATE} hooks/s for {SECS} s, {BODY} B, {TENANTS} tenants; then with {IDLE} idle and {TRICKLING} trickling connections held"
    );
    println!("| phase | hooks acked | p50 (ms) | p99 (ms) | max (ms) | connections held (least) |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (name, l, held) in [("alone", &alone, None), ("attacked", &attacked, Some(held))] {
        println!(
            "| {name} | {} | {:.2} | {:.2} | {:.2} | {} |",
            l.len(),
            ms(l, 0.50),
            ms(l, 0.99),
            ms(l, 1.0),
            held.map_or("-".to_owned(), |h| format!("{h:.0}"))
        );
    }
    println!("\nconnections the node closed for slow headers or idleness: {cut:.0}");
    let (base, under) = (ms(&alone, 0.99), ms(&attacked, 0.99));
    let all = (RATE * SECS) as usize;
    println!(
        "pass: every hook acked, ≥ {:.0} connections held, p99 attacked < 2 × alone ({:.2} ms) and < 25 ms",
        least_held(),
        2.0 * base
    );
    if alone.len() == all
        && attacked.len() == all
        && held >= least_held()
        && under < 2.0 * base
        && under < 25.0
    {
        println!("slow_clients: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("slow_clients: FAIL");
        std::process::ExitCode::FAILURE
    }
}

/// The connections the node must hold throughout the attacked phase.
fn least_held() -> f64 {
    0.9 * (IDLE + TRICKLING) as f64
}

/// One connection held open until `stop`: idle (nothing sent), or trickling a request's
/// headers a byte every 2 s; opened again whenever the node closes it.
async fn attacker(addr: std::net::SocketAddr, trickle: bool, stop: Arc<AtomicBool>) {
    let head = b"POST /ingest/bench HTTP/1.1\r\nhost: relay\r\nx-padding: ";
    while !stop.load(Ordering::Relaxed) {
        let Ok(mut s) = tokio::net::TcpStream::connect(addr).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut sent = 0usize;
        let mut buf = [0u8; 256];
        loop {
            if stop.load(Ordering::Relaxed) {
                return;
            }
            // A read returns when the node closes the connection.
            match tokio::time::timeout(Duration::from_secs(2), s.read(&mut buf)).await {
                Ok(Ok(0)) | Ok(Err(_)) => break,
                Ok(Ok(_)) => break,
                Err(_) => {}
            }
            if trickle {
                let b = head.get(sent).copied().unwrap_or(b'a');
                if s.write_all(&[b]).await.is_err() {
                    break;
                }
                sent += 1;
            }
        }
    }
}
