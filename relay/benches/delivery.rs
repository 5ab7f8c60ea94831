//! `cargo bench -p ankusa-relay --bench delivery`: deliveries per second to a local sink.
//!
//! 1. A backlog of 100 000 hooks (1 KiB bodies, 1 000 tenants) is written to a store; a
//!    node starts on it and drains it to a local axum sink over loopback.
//! 2. In the same run, a bare client (the same hyper client, the same concurrency as the
//!    node's per-sink limit) posts the same bodies to the same sink.
//! 3. At a steady 1 000 hooks/s through the ingest listener, the time from the ingest
//!    request to the sink's receipt, p50 and p99.
//!
//! PASS only if the node reaches at least 80% of the bare client's rate.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_relay::config::Config;
use ankusa_relay::node::Node;
use ankusa_relay::queue::deliveries::Envelope;
use ankusa_relay::queue::writer::Assembler;
use ankusa_relay::store::keys::AtMs;
use ankusa_relay::store::{OpenOptions, Store};

mod load;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const BACKLOG: u64 = 100_000;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const CONCURRENCY: usize = 128;
const STEADY_RATE: u64 = 1_000;
const STEADY_SECS: u64 = 5;

fn body(n: u64) -> Vec<u8> {
    let mut b = format!(r#"{{"n":{n},"pad":""#).into_bytes();
    b.resize(BODY - 2, b'x');
    b.extend_from_slice(b"\"}");
    b
}

fn yaml(data: &std::path::Path, port: u16) -> String {
    format!(
        r#"
data_dir: {}
ingest: {{ listen: "127.0.0.1:0" }}
admin: {{ listen: "127.0.0.1:0" }}
dispatch: {{ tick_interval_ms: 5, max_inflight: 512, per_sink_inflight: {CONCURRENCY} }}
sinks: [{{ id: s, url: "http://127.0.0.1:{port}/hooks", secret: {{ value: "whsec_YmVuY2gtc2luay1zZWNyZXQ=" }} }}]
routes: [{{ id: r, sinks: [s] }}]
sources:
  - {{ id: in, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: r }}
"#,
        data.display()
    )
}

async fn relay_drain(port: u16, sink: &load::ArrivalSink) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    {
        let store = Store::open(&data, &OpenOptions::default()).expect("store");
        let mut asm = Assembler::open(&store, 1_000_000).expect("assembler");
        let now = ankusa_relay::now_ms();
        for chunk in 0..BACKLOG / 1_000 {
            let envs: Vec<Envelope> = (0..1_000)
                .map(|i| {
                    let n = chunk * 1_000 + i;
                    Envelope {
                        id: format!("backlog-{n}"),
                        tenant: Some(format!("tenant-{}", n % TENANTS)),
                        source: "in".into(),
                        received_at: AtMs(now - 60_000 + n / 100),
                        content_type: "application/json".into(),
                        sinks: vec!["s".into()],
                        body: body(n),
                        headers: Vec::new(),
                    }
                })
                .collect();
            let b = asm.assemble(&store, &envs, false).expect("assemble");
            asm.commit(&store, b, false).expect("commit");
        }
        store.flush().expect("flush");
    }
    sink.count.store(0, Ordering::Relaxed);
    let started = Instant::now();
    let node = Node::start(Config::from_yaml(&yaml(&data, port), Vec::new()).expect("config"))
        .await
        .expect("node");
    while sink.count.load(Ordering::Relaxed) < BACKLOG {
        assert!(
            started.elapsed() < Duration::from_secs(600),
            "the backlog never drained"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let rate = BACKLOG as f64 / started.elapsed().as_secs_f64();
    node.shutdown().await.expect("shutdown");
    rate
}

async fn bare_client(port: u16, sink: &load::ArrivalSink) -> f64 {
    let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CONCURRENCY)
        .build_http();
    let url: Arc<str> = format!("http://127.0.0.1:{port}/hooks").into();
    let next = Arc::new(AtomicU64::new(0));
    sink.count.store(0, Ordering::Relaxed);
    let started = Instant::now();
    let tasks: Vec<_> = (0..CONCURRENCY)
        .map(|_| {
            let (client, url, next) = (client.clone(), url.clone(), next.clone());
            tokio::spawn(async move {
                loop {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    if n >= BACKLOG {
                        return;
                    }
                    let req = hyper::Request::post(&*url)
                        .header("content-type", "application/json")
                        .header("webhook-id", format!("bare-{n}"))
                        .body(Full::new(bytes::Bytes::from(body(n))))
                        .expect("request");
                    let resp = client.request(req).await.expect("response");
                    let _ = resp.into_body().collect().await;
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.expect("task");
    }
    BACKLOG as f64 / started.elapsed().as_secs_f64()
}

async fn steady_latency(port: u16, sink: &load::ArrivalSink) -> (f64, f64, usize) {
    let dir = tempfile::tempdir().expect("tempdir");
    let node = Node::start(
        Config::from_yaml(&yaml(&dir.path().join("db"), port), Vec::new()).expect("config"),
    )
    .await
    .expect("node");
    let url: Arc<str> = format!("http://{}/ingest/in", node.ingest_addr).into();
    let sent = load::open_loop(url, STEADY_RATE, STEADY_SECS, BODY, |n| {
        format!("tenant-{}", n % TENANTS)
    })
    .await;
    let (lat, _) = load::delivery_lags(sink, &sent, Duration::from_secs(30)).await;
    node.shutdown().await.expect("shutdown");
    (load::pct(&lat, 0.5), load::pct(&lat, 0.99), lat.len())
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (relay, bare, (p50, p99, n)) = rt.block_on(async {
        let (sink, port) = load::arrival_sink(Duration::ZERO).await;
        let relay = relay_drain(port, &sink).await;
        let bare = bare_client(port, &sink).await;
        let steady = steady_latency(port, &sink).await;
        (relay, bare, steady)
    });
    println!("\ndelivery — {BACKLOG} hooks of {BODY} B over {TENANTS} tenants to a local sink, concurrency {CONCURRENCY}");
    println!("| run | deliveries/s |");
    println!("|---|---:|");
    println!("| relay draining its backlog | {relay:.0} |");
    println!("| bare client, same bodies | {bare:.0} |");
    let ratio = relay / bare;
    println!("\nrelay / bare = {:.0}% (pass: >= 80%)", ratio * 100.0);
    println!(
        "ingest-to-delivery at a steady {STEADY_RATE} hooks/s for {STEADY_SECS}s: p50 {p50:.1} ms, p99 {p99:.1} ms ({n} hooks)"
    );
    if ratio >= 0.8 {
        println!("delivery: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("delivery: FAIL");
        std::process::ExitCode::FAILURE
    }
}
