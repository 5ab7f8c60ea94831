//! `cargo bench -p ankusa-relay --bench backup`: what an incremental backup to an object
//! store costs, and the recovery point it gives.
//!
//! One node as in `sustain` (1 000 tenants, 1 KiB hmac-signed hooks, delivery on to a local
//! no-op sink) and a real S3-compatible server on loopback (SeaweedFS,
//! [`ankusa_relay::testkit::SeaweedFs`], its files on /dev/shm: a bucket is not on the
//! node's disk). 4 s of closed-loop load measure what the node
//! takes in this run; a full backup is pushed; then open-loop load at 80% of that rate for
//! 60 s, and the incremental push the node's schedule would run then (the same
//! `objstore::Pusher`: a thread and a runtime of its own), the load going on through it
//! and 10 s more.
//!
//! What the store wrote in between is its table and blob files that were not in the full
//! backup, each at the largest size seen (the data directory is listed every 50 ms from the
//! full backup to the end of the push; a file made and compacted away between two listings
//! is not counted, so the figure is low, never high). The ingest p99 without a push is over
//! the load's seconds 5 to 60; during the push, over the requests sent while it ran.
//!
//! PASS only if the incremental push uploads at most 1.2× what the store wrote, and the
//! ingest p99 while it runs is under 2× the p99 without one. The recovery point — the
//! traffic a volume lost at the worst moment loses with a push every 60 s — is the
//! interval plus the push's duration, in seconds and in hooks at this load (reported; the
//! write-ahead log is not shipped between pushes).
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ankusa_relay::objstore::{Pusher, Remote, Retention, Target};

mod load;

const CLIENTS: usize = 64;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const CALIBRATE: Duration = Duration::from_secs(4);
/// The schedule's interval: the load between the full and the incremental push.
const INTERVAL: Duration = Duration::from_secs(60);
/// Load after the push starts, so that it runs under load whatever it takes.
const TAIL: Duration = Duration::from_secs(10);
/// The ingest p99 without a push is over the load from here on (the first seconds warm up).
const WARM: Duration = Duration::from_secs(5);

/// Posts hooks until `until`, `CLIENTS` keep-alive clients each at most every `gap` (the
/// sustain bench's open loop): when each request left, and its ack latency.
async fn post_until(url: Arc<str>, until: Instant, gap: Duration) -> Vec<(Instant, Duration)> {
    let client = load::client(CLIENTS);
    let tasks: Vec<_> = (0..CLIENTS as u64)
        .map(|w| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                // Clients start spread over one gap, so the load is even.
                let start = Instant::now() + gap * w as u32 / CLIENTS as u32;
                let mut out = Vec::new();
                for n in 0u64.. {
                    let at = start + gap * n as u32;
                    // A client that fell behind does not catch up after the end.
                    if at >= until || Instant::now() >= until {
                        break;
                    }
                    tokio::time::sleep_until(at.into()).await;
                    let req = load::signed_hook(&url, w, (1 << 32) + n, TENANTS, BODY);
                    let sent = Instant::now();
                    out.push((sent, load::post_acked(&client, req).await));
                }
                out
            })
        })
        .collect();
    load::gather(tasks).await
}

/// The table and blob files of the store at `data`, each at the largest size seen,
/// listed every 50 ms until `stop`.
fn watch_files(
    data: std::path::PathBuf,
    stop: Arc<AtomicBool>,
) -> (
    Arc<Mutex<BTreeMap<String, u64>>>,
    std::thread::JoinHandle<()>,
) {
    let seen = Arc::new(Mutex::new(BTreeMap::new()));
    let out = seen.clone();
    let thread = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            list_into(&data, &mut out.lock().expect("files"));
            std::thread::sleep(Duration::from_millis(50));
        }
        list_into(&data, &mut out.lock().expect("files"));
    });
    (seen, thread)
}

fn list_into(data: &std::path::Path, into: &mut BTreeMap<String, u64>) {
    for e in std::fs::read_dir(data).into_iter().flatten().flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !(name.ends_with(".sst") || name.ends_with(".blob")) {
            continue;
        }
        if let Ok(m) = e.metadata() {
            let size = into.entry(name).or_insert(0);
            *size = (*size).max(m.len());
        }
    }
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    // The bucket on a file system of its own (an object store is elsewhere; here only its
    // CPU shares the node's cores), as the drain bench keeps its sender off the owner's.
    let shm = std::path::Path::new("/dev/shm");
    let weed = if shm.is_dir() {
        ankusa_relay::testkit::SeaweedFs::start_in("bench", shm)
    } else {
        ankusa_relay::testkit::SeaweedFs::start("bench")
    };
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    let target_of = Target {
        endpoint: Some(weed.endpoint()),
        region: "us-east-1".into(),
        allow_http: true,
        ca_file: None,
        instance_metadata: false,
        // The node's default; ANKUSA_BENCH_BACKUP_LIMIT sets another (0: none), to
        // compare in one sitting.
        max_bytes_per_second: match std::env::var("ANKUSA_BENCH_BACKUP_LIMIT") {
            Ok(v) => v.parse().ok().filter(|l| *l > 0),
            Err(_) => Some(ankusa_config::DEFAULT_BACKUP_BYTES_PER_SECOND),
        },
    };
    let remote = Arc::new(Remote::open("s3://bench/relay-0", &target_of).expect("the bucket"));
    let pusher = Pusher::new().expect("the backup thread");
    let retention = Some(Retention {
        keep: 24,
        older_formats: true,
    });
    let report = rt.block_on(async {
        let sink = load::noop_sink().await;
        let node = load::relay(dir.path(), sink, "").await;
        let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
        let (secs, lat) = load::closed_loop(url.clone(), CLIENTS, CALIBRATE, TENANTS, BODY).await;
        let rate = lat.len() as f64 / secs;
        let target = (rate * 0.8).max(1.0) as u64;

        let full = pusher
            .push(node.store.clone(), data.clone(), remote.clone(), retention)
            .await
            .expect("the full backup");
        let in_full: std::collections::BTreeSet<String> =
            full.manifest.files.iter().map(|f| f.name.clone()).collect();
        let stop = Arc::new(AtomicBool::new(false));
        let (files, watcher) = watch_files(data.clone(), stop.clone());

        let started = Instant::now();
        let gap = Duration::from_secs_f64(CLIENTS as f64 / target as f64);
        let loader = tokio::spawn(post_until(url, started + INTERVAL + TAIL, gap));
        tokio::time::sleep_until((started + INTERVAL).into()).await;
        let push_start = Instant::now();
        let push = pusher
            .push(node.store.clone(), data.clone(), remote.clone(), retention)
            .await
            .expect("the incremental backup");
        let push_end = Instant::now();
        stop.store(true, Ordering::Relaxed);
        watcher.join().expect("the file watcher");
        let sent = loader.await.expect("the load");
        let written: u64 = files
            .lock()
            .expect("files")
            .iter()
            .filter(|(name, _)| !in_full.contains(*name))
            .map(|(_, size)| size)
            .sum();
        let lat_of = |from: Instant, to: Instant| {
            let mut v: Vec<Duration> = sent
                .iter()
                .filter(|(at, _)| *at >= from && *at < to)
                .map(|(_, lat)| *lat)
                .collect();
            v.sort();
            v
        };
        let without = lat_of(started + WARM, started + INTERVAL);
        let during = lat_of(push_start, push_end);
        let cut = push_start + Duration::from_millis(push.checkpoint_ms);
        let parts = (lat_of(push_start, cut), lat_of(cut, push_end));
        node.shutdown().await.expect("shutdown");
        (
            rate,
            target,
            full,
            push,
            push_end - push_start,
            written,
            without,
            during,
            parts,
            sent.len(),
        )
    });
    let (rate, target, full, push, took, written, without, during, parts, sent) = report;
    let (p99_without, p99_during) = (load::pct(&without, 0.99), load::pct(&during, 0.99));
    let upload_ratio = push.uploaded_bytes as f64 / written.max(1) as f64;
    let p99_ratio = p99_during / p99_without.max(1e-3);
    let rp_s = INTERVAL.as_secs_f64() + took.as_secs_f64();
    println!(
        "\nbackup — {TENANTS} tenants, {BODY} B hmac-signed hooks, delivery on to a local sink; calibrated at {rate:.0} hooks/s, load at 80% = {target} hooks/s ({sent} hooks in {} s); SeaweedFS on loopback",
        INTERVAL.as_secs() + TAIL.as_secs()
    );
    println!("| push | files | store bytes | uploaded files | uploaded bytes | took (ms) | checkpoint (ms) |");
    println!("|---|---:|---:|---:|---:|---:|---:|");
    println!(
        "| full, before the load | {} | {} | {} | {} | - | {} |",
        full.manifest.files.len(),
        full.bytes(),
        full.uploaded_files,
        full.uploaded_bytes,
        full.checkpoint_ms
    );
    println!(
        "| incremental, after {} s of load | {} | {} | {} | {} | {} | {} |",
        INTERVAL.as_secs(),
        push.manifest.files.len(),
        push.bytes(),
        push.uploaded_files,
        push.uploaded_bytes,
        took.as_millis(),
        push.checkpoint_ms
    );
    println!(
        "\ntable and blob bytes the store wrote since the full backup: {written}; the incremental push uploaded {} = {upload_ratio:.2}x (pass: <= 1.2x)",
        push.uploaded_bytes
    );
    println!(
        "ingest p99 without a push {p99_without:.2} ms ({} requests), during it {p99_during:.2} ms ({} requests) = {p99_ratio:.2}x (pass: < 2x)",
        without.len(),
        during.len()
    );
    let p99_of = |v: &[Duration]| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            format!("{:.2} ms", load::pct(v, 0.99))
        }
    };
    println!(
        "  (reference: p99 while it checkpoints {} ({} requests), while it uploads {} ({} requests))",
        p99_of(&parts.0),
        parts.0.len(),
        p99_of(&parts.1),
        parts.1.len()
    );
    println!(
        "recovery point with a push every {} s: {rp_s:.1} s of traffic at the worst moment = {:.0} hooks at this load (the interval plus one push; no WAL shipped between pushes)",
        INTERVAL.as_secs(),
        rp_s * target as f64
    );
    load::ledger("backup.upload_over_written", upload_ratio, "x");
    load::ledger("backup.p99_during_push_over_without", p99_ratio, "x");
    if upload_ratio <= 1.2 && p99_ratio < 2.0 && !during.is_empty() {
        println!("backup: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("backup: FAIL");
        std::process::ExitCode::FAILURE
    }
}
