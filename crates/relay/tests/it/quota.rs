//! Tenant quotas against a real node and a real sink on 127.0.0.1: the ingest rate (429
//! with `Retry-After`), queued bytes (503 `tenant_backlog_full`), defaults from the
//! configuration and a tenant's own limits set at run time, persisted and audited.

use ankusa_queue::{counters, tenants};
use ankusa_relay::node::Node;
use ankusa_relay::testkit::{NodeBuilder, TestSink};

use crate::support::*;

const TOKEN_B: &str = "quota-tenant-b-token-0123456789";

fn builder(sink: &TestSink) -> NodeBuilder {
    NodeBuilder::default()
        .admin_token("ops", ADMIN_TOKEN)
        .tenant_token("team-b", TOKEN_B, &["b"])
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("tenants: { limits: { ingest_per_second: 0.2, ingest_burst: 4 } }")
        .sink("s", &sink.url("/in"))
        .route("r", &["s"])
        .open_source("shared", "r")
}

async fn call(
    node: &Node,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    admin_call(node.admin_addr, method, path, token, body).await
}

async fn send(node: &Node, tenant: &str) -> Resp {
    post(
        &client(),
        &format!("http://{}/ingest/shared", node.ingest_addr),
        &[("x-tenant", tenant.to_owned())],
        br#"{"event":"quota"}"#.to_vec(),
    )
    .await
}

/// Statuses of `n` hooks of `tenant` sent one after another.
async fn statuses(node: &Node, tenant: &str, n: usize) -> Vec<u16> {
    let mut out = Vec::new();
    for _ in 0..n {
        out.push(send(node, tenant).await.status);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quotas_refuse_a_tenant_over_its_rate_or_backlog_and_no_other() {
    let sink = TestSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(builder(&sink).config_at(dir.path()))
        .await
        .unwrap();

    // The defaults: a burst of 4, then one every 5 s; each tenant its own bucket.
    assert_eq!(statuses(&node, "a", 4).await, [202; 4]);
    let r = send(&node, "a").await;
    assert_eq!(r.status, 429, "{:?}", r.json());
    assert_eq!(r.json()["error"], "tenant_rate_limited");
    let retry: u64 = r.headers["retry-after"].to_str().unwrap().parse().unwrap();
    assert!(
        (1..=5).contains(&retry),
        "a token is back within 5 s: {retry}"
    );
    assert_eq!(
        statuses(&node, "b", 3).await,
        [202; 3],
        "b has its own bucket"
    );

    // Its own limits (admin only; a tenant token reads its own).
    let own = r#"{"ingest_per_second": null, "queued_bytes": 2000}"#;
    assert_eq!(
        call(&node, "PUT", "/v1/tenants/a/limits", TOKEN_B, own)
            .await
            .0,
        404
    );
    assert_eq!(
        call(&node, "PUT", "/v1/tenants/b/limits", TOKEN_B, own)
            .await
            .0,
        403
    );
    let (s, v) = call(
        &node,
        "PUT",
        "/v1/tenants/a/limits",
        TOKEN_B.trim_end_matches('9'),
        own,
    )
    .await;
    assert_eq!(s, 401, "{v}");
    let (s, v) = call(
        &node,
        "PUT",
        "/v1/tenants/a/limits",
        ADMIN_TOKEN,
        r#"{"queued_bytes": 0}"#,
    )
    .await;
    assert_eq!((s, v["error"].as_str()), (400, Some("bad_request")), "{v}");
    let (s, v) = call(
        &node,
        "PUT",
        "/v1/tenants/a/limits",
        ADMIN_TOKEN,
        r#"{"bytes": 5}"#,
    )
    .await;
    assert_eq!(s, 400, "an unknown key is refused: {v}");
    let (s, v) = call(&node, "PUT", "/v1/tenants/a/limits", ADMIN_TOKEN, own).await;
    assert_eq!((s, v["changed"].as_u64()), (200, Some(1)), "{v}");
    assert_eq!(
        v["effective"],
        serde_json::json!({ "queued_bytes": 2000 }),
        "{v}"
    );
    assert_eq!(v["refused"], 1, "{v}");
    let (_, v) = call(&node, "PUT", "/v1/tenants/a/limits", ADMIN_TOKEN, own).await;
    assert_eq!(v["changed"], 0, "the same limits again change nothing: {v}");
    let (s, v) = call(&node, "GET", "/v1/tenants/b/limits", TOKEN_B, "").await;
    assert_eq!(
        (s, v["effective"]["ingest_burst"].as_u64()),
        (200, Some(4)),
        "{v}"
    );

    // Rate lifted, queued bytes bounded: hold a's deliveries so its rows stay queued, and
    // send until its backlog is full.
    assert_eq!(
        call(&node, "POST", "/v1/tenants/a/pause", ADMIN_TOKEN, "")
            .await
            .0,
        200
    );
    let a = tenants::ord(&node.store, "a").unwrap().unwrap();
    let mut sent = Vec::new();
    for _ in 0..200 {
        let r = send(&node, "a").await;
        sent.push(r.status);
        if r.status != 202 {
            assert_eq!(
                (r.status, r.json()["error"].as_str()),
                (503, Some("tenant_backlog_full"))
            );
            assert!(r.headers.contains_key("retry-after"));
            break;
        }
    }
    assert!(sent.len() > 5 && sent.last() == Some(&503), "{sent:?}");
    let bytes = counters::read(&node.store, a).unwrap().bytes;
    assert!(
        (2000..3000).contains(&bytes),
        "refused at the limit, not past it: {bytes}"
    );
    // b goes on (the last token of its burst).
    assert_eq!(send(&node, "b").await.status, 202);

    // Seen in the tenant's view, the node's status and the metrics.
    let (_, v) = call(&node, "GET", "/v1/tenants/a", ADMIN_TOKEN, "").await;
    assert_eq!(v["quota_refusals"], 2, "{v}");
    assert!(
        v["oldest_due_at_ms"].as_u64().is_some(),
        "a paused backlog has an age: {v}"
    );
    let (_, v) = call(&node, "GET", "/v1/node", ADMIN_TOKEN, "").await;
    assert_eq!(
        (
            v["tenants_over_quota"].as_u64(),
            v["tenants_paused"].as_u64()
        ),
        (Some(1), Some(1)),
        "{v}"
    );
    let (_, metrics) = get_text(&client(), &format!("http://{}/metrics", node.admin_addr)).await;
    for (outcome, n) in [("tenant_rate_limited", 1), ("tenant_backlog_full", 1)] {
        let line =
            format!("ankusa_ingest_requests_total{{source=\"shared\",outcome=\"{outcome}\"}} {n}");
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
    assert!(
        metrics.contains("ankusa_tenant_limit_overrides 1"),
        "{metrics}"
    );
    node.shutdown().await.unwrap();

    // A restart keeps a's own limits; a resume drains its backlog and its hooks are taken
    // again.
    let node = Node::start(builder(&sink).config_at(dir.path()))
        .await
        .unwrap();
    let (_, v) = call(&node, "GET", "/v1/tenants/a/limits", ADMIN_TOKEN, "").await;
    assert_eq!(
        v["overrides"],
        serde_json::json!({ "ingest_per_second": null, "queued_bytes": 2000 }),
        "{v}"
    );
    assert_eq!(send(&node, "a").await.status, 503);
    assert_eq!(
        call(&node, "POST", "/v1/tenants/a/resume", ADMIN_TOKEN, "")
            .await
            .0,
        200
    );
    ankusa_relay::testkit::eventually(10, "a's backlog delivered", || {
        counters::read(&node.store, a).unwrap().bytes == 0
    })
    .await;
    assert_eq!(
        statuses(&node, "a", 6).await,
        [202; 6],
        "no rate limit, backlog free"
    );

    // Back to the defaults: the bucket is full again, and refuses past its burst.
    let (s, v) = call(&node, "DELETE", "/v1/tenants/a/limits", ADMIN_TOKEN, "").await;
    assert_eq!((s, v["changed"].as_u64()), (200, Some(1)), "{v}");
    assert!(v.get("overrides").is_none(), "{v}");
    assert_eq!(statuses(&node, "a", 5).await, [202, 202, 202, 202, 429]);
    let (_, v) = call(&node, "DELETE", "/v1/tenants/a/limits", ADMIN_TOKEN, "").await;
    assert_eq!(v["changed"], 0, "{v}");

    // Limits can be set for a tenant before its first hook.
    let (s, _) = call(
        &node,
        "PUT",
        "/v1/tenants/newcomer/limits",
        ADMIN_TOKEN,
        r#"{"ingest_per_second": 0.1, "ingest_burst": 1}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(statuses(&node, "newcomer", 2).await, [202, 429]);

    // Each change is audited.
    let (_, audit) = call(&node, "GET", "/v1/audit", ADMIN_TOKEN, "").await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["action"].as_str())
        .filter(|a| a.starts_with("tenant.limits"))
        .collect();
    assert_eq!(actions.len(), 3, "set a, clear a, set newcomer: {audit}");
    node.shutdown().await.unwrap();
}

/// A tenant's `archive_bytes`: its hooks past it are delivered but not archived, counted;
/// another tenant's archive is whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_archive_stops_at_its_archive_bytes_and_its_hooks_are_still_delivered() {
    let sink = TestSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(
        NodeBuilder::default()
            .admin_token("ops", ADMIN_TOKEN)
            .section("dispatch: { tick_interval_ms: 10 }")
            .section("archive: { settle_interval_ms: 20 }")
            .sink("s", &sink.url("/in"))
            .route_yaml("{ id: kept, sinks: [s], archive: { enabled: true } }")
            .open_source("shared", "kept")
            .config_at(dir.path()),
    )
    .await
    .unwrap();
    // Room for two copies of these hooks (each a 1 KiB body and its envelope), not three.
    let (s, v) = call(
        &node,
        "PUT",
        "/v1/tenants/a/limits",
        ADMIN_TOKEN,
        r#"{"archive_bytes": 2600}"#,
    )
    .await;
    assert_eq!(
        (s, v["effective"]["archive_bytes"].as_u64()),
        (200, Some(2600)),
        "{v}"
    );
    let body = format!(r#"{{"pad":"{}"}}"#, "x".repeat(1_000));
    for t in ["a", "b"] {
        for _ in 0..5 {
            let r = post(
                &client(),
                &format!("http://{}/ingest/shared", node.ingest_addr),
                &[("x-tenant", t.to_owned())],
                body.clone().into_bytes(),
            )
            .await;
            assert_eq!(r.status, 202);
        }
    }
    ankusa_relay::testkit::eventually(20, "delivered and settled", || {
        let n = counters::node(&node.store).unwrap();
        sink.on("/in").len() == 10 && n.archive_pending == 0 && n.pending + n.inflight == 0
    })
    .await;
    let listed = |v: &serde_json::Value| v["items"].as_array().map(Vec::len);
    let (_, a) = call(&node, "GET", "/v1/archive?tenant=a", ADMIN_TOKEN, "").await;
    let (_, b) = call(&node, "GET", "/v1/archive?tenant=b", ADMIN_TOKEN, "").await;
    assert_eq!((listed(&a), listed(&b)), (Some(2), Some(5)), "{a}\n{b}");
    let (_, metrics) = get_text(&client(), &format!("http://{}/metrics", node.admin_addr)).await;
    let line = r#"ankusa_archive_settled_total{outcome="over_quota"} 3"#;
    assert!(metrics.contains(line), "{line}\n{metrics}");
    node.shutdown().await.unwrap();
}
