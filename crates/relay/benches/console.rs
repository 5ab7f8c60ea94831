//! `cargo bench -p ankusa-relay --bench console`: the console's pages at scale.
//!
//! A node holds 1 000 000 dead rows over 100 000 tenants (seeded into its store before it
//! starts) and a few hooks ingested over HTTP (the hook log). The bench signs in to the
//! console and asks every page, and the tenant portal's, `REQUESTS` times one after
//! another, timing each request to its first byte (the answer's headers: a page is
//! rendered whole before it is sent, so this is its render time too), once the console's
//! first sample has ranked the tenants with work.
//!
//! PASS only if every page's p99 time to first byte is under 200 ms (the console issue's
//! rule: every list is a page of an index read, never a scan of all tenants or all dead
//! rows).
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::time::{Duration, Instant};

use ankusa_relay::node::Node;
use ankusa_relay::testkit::TestNode;
use http_body_util::{BodyExt, Full};

mod load;
#[path = "../tests/it/seed.rs"]
mod seed;

const DEAD: u64 = 1_000_000;
const TENANTS: u64 = 100_000;
const REQUESTS: usize = 60;
const LIMIT_MS: f64 = 200.0;
const TOKEN: &str = "bench-admin-token-0123456789";

type Client = load::HttpClient;

async fn send(
    c: &Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, Duration, String) {
    let mut req = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(body.to_owned())))
        .expect("request");
    let t = Instant::now();
    let resp = c.request(req).await.expect("answer");
    let ttfb = t.elapsed();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (
        status,
        headers,
        ttfb,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

fn main() -> std::process::ExitCode {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    let t = Instant::now();
    seed::store_with_dead(&data, DEAD, TENANTS, "bench", 64);
    println!(
        "seeded {DEAD} dead rows over {TENANTS} tenants in {:.1}s",
        t.elapsed().as_secs_f64()
    );
    let config = TestNode::builder()
        .data_dir(&data)
        .admin_token("bench", TOKEN)
        .admin_key(
            r#"console: { portal_secret: { value: "bench-portal-secret-0123456789abcdef" } }"#,
        )
        .sink("s", "http://127.0.0.1:9/")
        .route("r", &["s"])
        .open_source("bench", "r")
        .config_at(&data);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let failed = rt.block_on(async {
        let node = Node::start(config).await.expect("node");
        let c = load::client(4);
        let admin = format!("http://{}", node.admin_addr);
        // A few hooks through ingest: the hook log has them.
        let mut hook = String::new();
        for i in 0..20 {
            let (s, _, _, body) = send(
                &c,
                "POST",
                &format!("http://{}/ingest/bench", node.ingest_addr),
                &[("x-tenant", "tenant-42"), ("content-type", "application/json")],
                &format!(r#"{{"n":{i}}}"#),
            )
            .await;
            assert_eq!(s, 202, "{body}");
            let v: serde_json::Value = serde_json::from_str(&body).expect("json");
            hook = v["id"].as_str().expect("id").to_owned();
        }
        let (s, h, _, _) = send(
            &c,
            "POST",
            &format!("{admin}/ui/login"),
            &[("content-type", "application/x-www-form-urlencoded")],
            &format!("token={TOKEN}"),
        )
        .await;
        assert_eq!(s, 303);
        let cookie = h["set-cookie"]
            .to_str()
            .expect("cookie")
            .split(';')
            .next()
            .expect("cookie")
            .to_owned();
        let (_, _, _, link) = send(
            &c,
            "POST",
            &format!("{admin}/v1/portal-links"),
            &[
                ("authorization", &format!("Bearer {TOKEN}")),
                ("content-type", "application/json"),
            ],
            r#"{"tenant":"tenant-7"}"#,
        )
        .await;
        let link: serde_json::Value = serde_json::from_str(&link).expect("json");
        let portal = link["path"].as_str().expect("path").to_owned();
        // The console's first sample (10 s after the start) ranks the tenants with work.
        tokio::time::sleep(Duration::from_millis(
            ankusa_relay::console::history::INTERVAL_MS + 2_000,
        ))
        .await;
        let pages = [
            "/ui/".to_owned(),
            "/ui/tenants".to_owned(),
            "/ui/tenants?view=busiest".to_owned(),
            "/ui/tenants?q=tenant-5".to_owned(),
            "/ui/tenants?q=tenant-&after=tenant-50000".to_owned(),
            "/ui/tenants/tenant-123".to_owned(),
            "/ui/dlq".to_owned(),
            "/ui/dlq?tenant=tenant-77".to_owned(),
            "/ui/dlq?source=bench".to_owned(),
            "/ui/dlq?source=no-such-source".to_owned(),
            "/ui/dlq?from=2000-01-01%2000:00".to_owned(),
            format!("/ui/hooks/{hook}"),
            "/ui/hooks?tenant=tenant-42&delivery=none".to_owned(),
            "/ui/sinks".to_owned(),
            "/ui/archive?tenant=tenant-1".to_owned(),
            "/ui/audit".to_owned(),
            "/ui/quarantine".to_owned(),
            portal.clone(),
            format!("{portal}dlq?tenant=tenant-7"),
        ];
        println!(
            "\nconsole — {DEAD} dead rows, {TENANTS} tenants; {REQUESTS} requests a page, one at a time"
        );
        println!("| page | status | bytes | p50 TTFB (ms) | p99 TTFB (ms) | max (ms) |");
        println!("|---|---:|---:|---:|---:|---:|");
        let mut failed = Vec::new();
        for p in &pages {
            let mut lat = Vec::with_capacity(REQUESTS);
            let (mut status, mut bytes) = (0, 0);
            for _ in 0..REQUESTS {
                let (s, _, ttfb, body) =
                    send(&c, "GET", &format!("{admin}{p}"), &[("cookie", &cookie)], "").await;
                status = s;
                bytes = body.len();
                lat.push(ttfb);
            }
            lat.sort();
            let p99 = load::pct(&lat, 0.99);
            println!(
                "| `{}` | {status} | {bytes} | {:.1} | {p99:.1} | {:.1} |",
                if p.starts_with("/ui/portal/") { p.replacen(&portal, "/ui/portal/…/", 1) } else { p.clone() },
                load::pct(&lat, 0.5),
                lat.last().map_or(0.0, |d| d.as_secs_f64() * 1000.0),
            );
            if p99 >= LIMIT_MS || !(200..400).contains(&status) && status != 404 {
                failed.push(p.clone());
            }
        }
        node.shutdown().await.expect("shutdown");
        failed
    });
    if failed.is_empty() {
        println!("\nPASS: every page's p99 time to first byte is under {LIMIT_MS} ms");
        std::process::ExitCode::SUCCESS
    } else {
        println!("\nFAIL: over {LIMIT_MS} ms at p99 (or not served): {failed:?}");
        std::process::ExitCode::FAILURE
    }
}
