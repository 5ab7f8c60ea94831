//! Pausing a tenant (`POST /v1/tenants/{t}/pause` and `…/resume`) against a real node and
//! a real sink on 127.0.0.1: its deliveries are held — rows due and counted, no attempt —
//! across a restart, while the other tenants' go on; a resume sends them.

use std::time::Duration;

use ankusa_keyspace::AtMs;
use ankusa_queue::{counters, deliveries, fold, tenants};
use ankusa_relay::node::Node;
use ankusa_relay::testkit::{eventually, NodeBuilder, TestSink};

use crate::support::*;

const TOKEN_B: &str = "pause-tenant-b-token-0123456789";

fn builder(sink: &TestSink) -> NodeBuilder {
    NodeBuilder::default()
        .admin_token("ops", ADMIN_TOKEN)
        .tenant_token("team-b", TOKEN_B, &["b"])
        .section("dispatch: { tick_interval_ms: 10 }")
        .sink("s", &sink.url("/in"))
        .route("r", &["s"])
        .open_source("shared", "r")
}

async fn call(node: &Node, method: &str, path: &str, token: &str) -> (u16, serde_json::Value) {
    admin_call(node.admin_addr, method, path, token, "").await
}

async fn send(node: &Node, tenant: &str, n: usize) {
    let c = client();
    for _ in 0..n {
        let r = post(
            &c,
            &format!("http://{}/ingest/shared", node.ingest_addr),
            &[("x-tenant", tenant.to_owned())],
            b"{}".to_vec(),
        )
        .await;
        assert_eq!(r.status, 202);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_tenant_is_held_across_a_restart_and_a_resume_sends_its_hooks() {
    let sink = TestSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(builder(&sink).config_at(dir.path()))
        .await
        .unwrap();
    send(&node, "a", 1).await;
    send(&node, "b", 1).await;
    eventually(10, "a first hook of each tenant delivered", || {
        sink.on("/in").len() == 2
    })
    .await;

    // Another tenant's token cannot pause it; an admin can, once.
    assert_eq!(
        call(&node, "POST", "/v1/tenants/a/pause", TOKEN_B).await.0,
        404
    );
    let (s, v) = call(&node, "POST", "/v1/tenants/a/pause", ADMIN_TOKEN).await;
    assert_eq!(
        (s, v["paused"].as_bool(), v["changed"].as_u64()),
        (200, Some(true), Some(1)),
        "{v}"
    );
    let (_, v) = call(&node, "POST", "/v1/tenants/a/pause", ADMIN_TOKEN).await;
    assert_eq!(
        v["changed"], 0,
        "pausing a paused tenant changes nothing: {v}"
    );
    assert_eq!(
        call(&node, "POST", "/v1/tenants/nobody/pause", ADMIN_TOKEN)
            .await
            .0,
        404
    );

    // Its hooks are accepted over more than one second (markers in several buckets) and
    // wait; b's go on.
    for _ in 0..4 {
        send(&node, "a", 5).await;
        send(&node, "b", 1).await;
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    eventually(10, "b's hooks delivered", || delivered_b(&sink) == 5).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let a = tenants::ord(&node.store, "a").unwrap().unwrap();
    assert_eq!(
        sink.on("/in").iter().filter(|r| is(r, "a")).count(),
        1,
        "no attempt for a paused tenant"
    );
    let c = counters::read(&node.store, a).unwrap();
    assert_eq!((c.pending, c.inflight), (20, 0), "{c:?}");
    // Dispatch took its markers out: a paused backlog holds no tick's marker budget.
    let active =
        deliveries::active_tenants_distinct(&node.store, AtMs(u64::MAX), 100, 10_000).unwrap();
    assert!(active.iter().all(|t| t.ord != a), "{active:?}");
    // It shows, paused, with its backlog.
    let (_, v) = call(&node, "GET", "/v1/tenants/a", ADMIN_TOKEN).await;
    let since = v["paused_since_ms"].as_u64().expect("paused_since_ms");
    let (_, list) = call(&node, "GET", "/v1/tenants", ADMIN_TOKEN).await;
    let row = list["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["tenant"] == "a")
        .unwrap_or_else(|| panic!("a paused tenant is listed: {list}"));
    assert_eq!(
        (
            row["paused_since_ms"].as_u64(),
            row["counters"]["pending"].as_i64()
        ),
        (Some(since), Some(20))
    );
    let (_, metrics) = get_text(&client(), &format!("http://{}/metrics", node.admin_addr)).await;
    assert!(metrics.contains("ankusa_tenants_paused 1"), "{metrics}");
    // And in the hook log: a held hook says its tenant is paused.
    let r = post(
        &client(),
        &format!("http://{}/ingest/shared", node.ingest_addr),
        &[("x-tenant", "a".to_owned())],
        b"{}".to_vec(),
    )
    .await;
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let (_, v) = call(&node, "GET", &format!("/v1/hooks/{id}"), ADMIN_TOKEN).await;
    assert_eq!(v["tenant_paused_since_ms"].as_u64(), Some(since), "{v}");
    assert_eq!(v["sinks"][0]["state"], "pending", "{v}");
    node.shutdown().await.unwrap();

    // A restart keeps the pause.
    let node = Node::start(builder(&sink).config_at(dir.path()))
        .await
        .unwrap();
    send(&node, "a", 1).await;
    tokio::time::sleep(Duration::from_millis(800)).await;
    assert_eq!(
        sink.on("/in").iter().filter(|r| is(r, "a")).count(),
        1,
        "still held after a restart"
    );
    let (_, v) = call(&node, "GET", "/v1/tenants/a", ADMIN_TOKEN).await;
    assert_eq!(v["paused_since_ms"].as_u64(), Some(since), "{v}");

    // Resumed from the command line: its markers back, every hook delivered.
    let args: Vec<String> = [
        "admin",
        "--url",
        &format!("http://{}", node.admin_addr),
        "--token",
        ADMIN_TOKEN,
        "resume",
        "a",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    let out = tokio::task::spawn_blocking(move || bin().args(args).output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (v["paused"].as_bool(), v["changed"].as_u64()),
        (Some(false), Some(1)),
        "{v}"
    );
    assert!(
        v["markers"].as_u64().unwrap() >= 2,
        "a marker per second of its rows: {v}"
    );
    eventually(10, "a's held hooks delivered", || {
        sink.on("/in").iter().filter(|r| is(r, "a")).count() == 23
    })
    .await;
    // The sink has answered the last ones; their acks commit a moment later.
    eventually(10, "a's deliveries settled", || {
        let c = counters::read(&node.store, a).unwrap();
        (c.pending, c.scheduled, c.inflight) == (0, 0, 0)
    })
    .await;
    let (_, v) = call(&node, "GET", "/v1/tenants/a", ADMIN_TOKEN).await;
    assert!(v.get("paused_since_ms").is_none(), "{v}");
    // Each change is audited.
    let (_, audit) = call(&node, "GET", "/v1/audit", ADMIN_TOKEN).await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["tenant"] == "a")
        .filter_map(|r| r["action"].as_str())
        .collect();
    assert_eq!(
        actions.iter().filter(|a| **a == "tenant.pause").count(),
        1,
        "{audit}"
    );
    assert_eq!(
        actions.iter().filter(|a| **a == "tenant.resume").count(),
        1,
        "{audit}"
    );
    node.shutdown().await.unwrap();
    let store =
        ankusa_store::Store::open(dir.path().join("db"), &ankusa_store::OpenOptions::default())
            .unwrap();
    assert!(fold::verify(&store).unwrap().is_empty());
}

fn is(r: &ankusa_relay::testkit::Received, tenant: &str) -> bool {
    r.status == 200 && r.headers.get("ankusa-tenant").and_then(|v| v.to_str().ok()) == Some(tenant)
}

fn delivered_b(sink: &TestSink) -> usize {
    sink.on("/in").iter().filter(|r| is(r, "b")).count()
}
