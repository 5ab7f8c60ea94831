//! `cargo bench -p ankusa-relay --bench ingest`: durable ingest over loopback HTTP.
//!
//! 64 concurrent keep-alive clients post 1 KiB bodies for 1 000 tenants to an
//! hmac-sha256 source; every 202 means the hook was in a synced commit. The same load runs
//! twice against the same binary: with the writer's default group commit, and with its
//! batch limit set to 1 (one fsync per hook). PASS only if group commit reaches at least
//! 20x the hooks/s of the batch-1 run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ankusa_relay::config::Config;
use ankusa_relay::node::Node;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

const CLIENTS: usize = 64;
const TENANTS: usize = 1_000;
const BODY: usize = 1_024;
const RUN: Duration = Duration::from_secs(6);
const SECRET: &str = "bench-secret";

struct Run {
    label: &'static str,
    hooks: u64,
    secs: f64,
    p50_ms: f64,
    p99_ms: f64,
    hooks_per_fsync: f64,
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
        .unwrap_or(0.0)
}

fn sign(body: &[u8]) -> String {
    use hmac::Mac;
    let mut m = hmac::Hmac::<sha2::Sha256>::new_from_slice(SECRET.as_bytes()).expect("key");
    m.update(body);
    let sig: Vec<String> = m
        .finalize()
        .into_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256={}", sig.concat())
}

async fn run(label: &'static str, max_batch_hooks: usize) -> Run {
    let dir = tempfile::tempdir().expect("tempdir");
    let yaml = format!(
        r#"
data_dir: {}
ingest: {{ listen: "127.0.0.1:0" }}
admin: {{ listen: "127.0.0.1:0" }}
writer: {{ max_batch_hooks: {max_batch_hooks} }}
sinks: [{{ id: s, url: "http://127.0.0.1:9/" }}]
routes: [{{ id: r, sinks: [s] }}]
sources:
  - id: bench
    tenant: {{ header: x-tenant }}
    verify: {{ scheme: hmac-sha256, secret: {{ value: "{SECRET}" }}, header: x-signature, prefix: "sha256=" }}
    route: r
"#,
        dir.path().join("db").display()
    );
    let node = Node::start(Config::from_yaml(&yaml, Vec::new()).expect("config"))
        .await
        .expect("node");
    let url: Arc<str> = format!("http://{}/ingest/bench", node.ingest_addr).into();
    let client: Client<_, Full<bytes::Bytes>> = Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(CLIENTS)
        .build_http();
    let deadline = Instant::now() + RUN;
    let started = Instant::now();
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|w| {
            let (client, url) = (client.clone(), url.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut n = 0usize;
                while Instant::now() < deadline {
                    let mut body = format!(r#"{{"worker":{w},"n":{n},"pad":""#).into_bytes();
                    body.resize(BODY - 2, b'x');
                    body.extend_from_slice(b"\"}");
                    let req = hyper::Request::post(&*url)
                        .header("x-tenant", format!("tenant-{}", (w * 31 + n) % TENANTS))
                        .header("x-signature", sign(&body))
                        .header("content-type", "application/json")
                        .body(Full::new(bytes::Bytes::from(body)))
                        .expect("request");
                    let t = Instant::now();
                    let resp = client.request(req).await.expect("response");
                    let status = resp.status();
                    resp.into_body().collect().await.expect("body");
                    assert_eq!(status, 202, "every request must be acked durably");
                    lat.push(t.elapsed());
                    n += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat = Vec::new();
    for t in tasks {
        lat.extend(t.await.expect("client task"));
    }
    let secs = started.elapsed().as_secs_f64();
    lat.sort();
    let pct =
        |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3;
    let m = node.metrics.encode();
    let hooks_per_fsync =
        metric(&m, "ankusa_writer_batch_hooks_sum") / metric(&m, "ankusa_writer_batch_hooks_count");
    let out = Run {
        label,
        hooks: lat.len() as u64,
        secs,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        hooks_per_fsync,
    };
    node.shutdown().await.expect("shutdown");
    out
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let group = rt.block_on(run("group commit (default)", 512));
    let single = rt.block_on(run("batch limit 1", 1));
    println!("\ningest — {CLIENTS} keep-alive clients, {BODY} B bodies, {TENANTS} tenants, hmac-sha256, {}s per run", RUN.as_secs());
    println!("| run | hooks acked | hooks/s | p50 ack (ms) | p99 ack (ms) | hooks per fsync |");
    println!("|---|---:|---:|---:|---:|---:|");
    for r in [&group, &single] {
        println!(
            "| {} | {} | {:.0} | {:.2} | {:.2} | {:.1} |",
            r.label,
            r.hooks,
            r.hooks as f64 / r.secs,
            r.p50_ms,
            r.p99_ms,
            r.hooks_per_fsync
        );
    }
    let ratio = (group.hooks as f64 / group.secs) / (single.hooks as f64 / single.secs);
    println!("\ngroup commit / batch-1 = {ratio:.1}x (pass: >= 20x)");
    if ratio >= 20.0 {
        println!("ingest: PASS");
        std::process::ExitCode::SUCCESS
    } else {
        println!("ingest: FAIL");
        std::process::ExitCode::FAILURE
    }
}
