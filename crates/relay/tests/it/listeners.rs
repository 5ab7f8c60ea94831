//! What a client may hold of a listener (`ingest.connections`, `admin.connections`),
//! through the real listeners with a raw TCP client: a connection that sends its headers
//! too slowly or sits idle is closed, a body that trickles is answered 408, and a
//! connection past the cap is closed as it is accepted while the held ones keep working.

use std::time::{Duration, Instant};

use ankusa_relay::testkit::{metric, TestNode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

async fn node(ingest: &str) -> TestNode {
    TestNode::builder()
        .ingest_key(ingest)
        .admin_key("connections: { max: 8, header_read_timeout_ms: 30000 }")
        .sink("s", "http://127.0.0.1:9/hooks")
        .route("r", &["s"])
        .open_source("in", "r")
        .start()
        .await
}

/// Reads until the peer closes (or `within` passes: `None`); what it sent.
async fn until_closed(s: &mut TcpStream, within: Duration) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.checked_duration_since(Instant::now())?;
        match tokio::time::timeout(left, s.read(&mut buf)).await {
            Err(_) => return None,
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
        }
    }
}

/// A hook sent whole to source `in`, answered 202.
async fn accepted(node: &TestNode) {
    let r = post(
        &client(),
        &node.ingest_url("in"),
        &[("x-tenant", "t".to_owned())],
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(r.status, 202, "{:?}", r.json());
}

async fn metrics_of(node: &TestNode) -> String {
    get_text(&client(), &node.admin_url("/metrics")).await.1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_sends_its_headers_too_slowly_or_sits_idle_is_closed() {
    let node = node("connections: { header_read_timeout_ms: 600 }").await;
    let addr = node.ingest_addr;

    // Nothing sent: closed after the timeout, not before.
    let started = Instant::now();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    let got = until_closed(&mut silent, Duration::from_secs(10)).await;
    assert!(got.is_some(), "a silent connection was never closed");
    let took = started.elapsed();
    assert!(took >= Duration::from_millis(500), "closed after {took:?}");

    // A byte every 100 ms: the headers never complete in time.
    let mut trickle = TcpStream::connect(addr).await.unwrap();
    // A whole request the node would take (202) if it waited for it.
    let request =
        b"POST /ingest/in HTTP/1.1\r\nhost: x\r\nx-tenant: t\r\ncontent-length: 2\r\n\r\n{}";
    let mut closed = false;
    for b in request {
        if trickle.write_all(&[*b]).await.is_err() {
            closed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = until_closed(&mut trickle, Duration::from_secs(5)).await;
    assert!(
        closed
            || answer
                .as_ref()
                .is_some_and(|a| !a.starts_with(b"HTTP/1.1 2")),
        "a request trickled over {} ms was taken: {answer:?}",
        request.len() * 100
    );

    // A request answered, then idle on keep-alive: closed after the timeout.
    let mut kept = TcpStream::connect(addr).await.unwrap();
    kept.write_all(b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = kept.read(&mut buf).await.unwrap();
    assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
    let idle = Instant::now();
    assert!(until_closed(&mut kept, Duration::from_secs(10))
        .await
        .is_some());
    assert!(idle.elapsed() >= Duration::from_millis(500));

    // A provider that sends promptly is served meanwhile, and each cut is counted.
    accepted(&node).await;
    let m = metrics_of(&node).await;
    let cut = metric(
        &m,
        r#"ankusa_http_timeouts_total{listener="ingest",phase="headers"}"#,
    )
    .unwrap_or(0.0);
    assert!(cut >= 3.0, "{cut}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_arrives_too_slowly_is_answered_408_and_nothing_is_taken() {
    let node = node("connections: { body_read_timeout_ms: 500 }").await;
    let mut s = TcpStream::connect(node.ingest_addr).await.unwrap();
    s.write_all(b"POST /ingest/in HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 40\r\n\r\n{\"a\":")
        .await
        .unwrap();
    let started = Instant::now();
    // A byte every 200 ms: 40 bytes would take 8 s.
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while started.elapsed() < Duration::from_secs(5) {
        let _ = s.write_all(b" ").await;
        if let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(200), s.read(&mut buf)).await
        {
            answer.extend_from_slice(&buf[..n]);
            if n == 0 || answer.windows(4).any(|w| w == b"\r\n\r\n") {
                break;
            }
        }
    }
    let text = String::from_utf8_lossy(&answer).into_owned();
    assert!(text.starts_with("HTTP/1.1 408"), "{text}");
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Only the hook sent whole afterwards is taken.
    accepted(&node).await;
    let m = metrics_of(&node).await;
    assert_eq!(
        metric(
            &m,
            r#"ankusa_ingest_requests_total{source="in",outcome="accepted"}"#
        ),
        Some(1.0),
        "{m}"
    );
    assert_eq!(
        metric(
            &m,
            r#"ankusa_http_timeouts_total{listener="ingest",phase="body"}"#
        ),
        Some(1.0)
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_past_the_cap_are_closed_as_accepted_and_the_held_ones_keep_working() {
    let node = node("connections: { max: 8, header_read_timeout_ms: 30000 }").await;
    // Eight held open (idle, well within the header timeout) on each listener.
    let mut held = Vec::new();
    for addr in [node.ingest_addr, node.admin_addr] {
        for _ in 0..8 {
            held.push(TcpStream::connect(addr).await.unwrap());
        }
    }
    let open = |m: &str, l: &str| {
        metric(m, &format!(r#"ankusa_http_connections{{listener="{l}"}}"#)).unwrap_or(0.0)
    };
    // The ninth on each: the kernel takes it, the node closes it at once.
    for addr in [node.ingest_addr, node.admin_addr] {
        let mut extra = TcpStream::connect(addr).await.unwrap();
        let got = until_closed(&mut extra, Duration::from_secs(5)).await;
        assert_eq!(got, Some(Vec::new()), "the ninth connection was served");
    }
    // The held ones are served: a request on one of each.
    for (i, path) in [(0, "/ingest/in"), (8, "/healthz")] {
        let s = &mut held[i];
        let req = if path == "/healthz" {
            "GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n".to_owned()
        } else {
            format!(
                "POST {path} HTTP/1.1\r\nhost: x\r\nx-tenant: t\r\ncontent-length: 2\r\n\r\n{{}}"
            )
        };
        s.write_all(req.as_bytes()).await.unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).await.unwrap();
        let head = String::from_utf8_lossy(&buf[..n]).into_owned();
        assert!(
            head.starts_with("HTTP/1.1 202") || head.starts_with("HTTP/1.1 200"),
            "{head}"
        );
    }
    // Once some close, new connections are served again (the metrics scrape is one).
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    let m = loop {
        // A scrape refused while the node has not yet seen the held ones close fails.
        let port = node.admin_addr.port();
        let got = tokio::task::spawn_blocking(move || http_get(port, "/metrics"))
            .await
            .unwrap();
        if let Ok((200, m)) = got {
            if open(&m, "ingest") == 0.0 {
                break m;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the closed connections stay counted"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for l in ["ingest", "admin"] {
        let refused = metric(
            &m,
            &format!(r#"ankusa_http_connections_refused_total{{listener="{l}"}}"#),
        );
        // The ninth; on the admin listener maybe a scrape too, sent before the node saw
        // the held ones close.
        assert!(refused.is_some_and(|r| r >= 1.0), "{l}: {refused:?}");
    }
    accepted(&node).await;
    node.stop().await;
}

/// `admin.metrics`: with `token_required`, `/metrics` answers only an admin or a
/// metrics-scope token (which opens nothing else), and with `tenant_labels: false` it
/// names no tenant; by default it answers anyone and names the tenants with work due.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_can_require_a_token_and_leave_tenants_out() {
    const ADMIN: &str = "admin-token-0123456789";
    const SCRAPER: &str = "scraper-token-0123456789";
    const TENANT: &str = "tenant-token-0123456789";
    // A sink that takes the connection and never answers: the hook stays in flight, its
    // tenant in the in-flight gauge.
    let hold = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let sink = format!("http://{}/hooks", hold.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hold.accept().await {
            held.push(s);
        }
    });
    let start = |metrics: &'static str| {
        TestNode::builder()
            .admin_key("gauge_interval_ms: 100")
            .admin_key(metrics)
            // The held delivery is not waited for at the stop.
            .section("shutdown: { grace_ms: 200 }")
            .admin_token("ops", ADMIN)
            .token_yaml(&format!(
                r#"{{ name: scraper, secret: {{ value: "{SCRAPER}" }}, scope: metrics }}"#
            ))
            .tenant_token("team", TENANT, &["acme"])
            .sink("s", &sink)
            .route("r", &["s"])
            .open_source("in", "r")
            .start()
    };
    let scrape = |port: u16, token: Option<&'static str>| {
        tokio::task::spawn_blocking(move || match token {
            Some(t) => http_get_auth_token(port, "/metrics", t).unwrap(),
            None => http_get(port, "/metrics").unwrap(),
        })
    };
    for (metrics, guarded) in [
        (
            "metrics: { token_required: true, tenant_labels: false }",
            true,
        ),
        ("metrics: {}", false),
    ] {
        let node = start(metrics).await;
        let r = post(
            &client(),
            &node.ingest_url("in"),
            &[("x-tenant", "acme".to_owned())],
            b"{}".to_vec(),
        )
        .await;
        assert_eq!(r.status, 202);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !node.metrics.encode().contains(r#"tenant="acme""#) {
            assert!(Instant::now() < deadline, "no series names the tenant");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let port = node.admin_addr.port();
        let (status, _) = scrape(port, None).await.unwrap();
        assert_eq!(status, if guarded { 401 } else { 200 });
        let (status, _) = scrape(port, Some(TENANT)).await.unwrap();
        assert_eq!(status, if guarded { 403 } else { 200 });
        for token in [SCRAPER, ADMIN] {
            let (status, text) = scrape(port, Some(token)).await.unwrap();
            assert_eq!(status, 200);
            assert!(text.contains("ankusa_ingest_requests_total"), "{text}");
            assert_eq!(
                text.contains(r#"tenant="acme""#),
                !guarded,
                "tenant labels with {metrics}"
            );
        }
        // The scraper's token opens nothing else.
        let (status, _) = tokio::task::spawn_blocking(move || {
            http_get_auth_token(port, "/v1/node", SCRAPER).unwrap()
        })
        .await
        .unwrap();
        assert_eq!(status, 403);
        node.stop().await;
    }
}
