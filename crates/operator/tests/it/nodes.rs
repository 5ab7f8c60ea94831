//! The operator's poller against a real relay node (in this process: real RocksDB store,
//! real listeners on 127.0.0.1), configured by the operator's own `relay.yaml`.

use std::time::Duration;

use ankusa_operator::nodes::NodeClient;
use ankusa_operator::resources;
use bytes::Bytes;
use http_body_util::Full;
use serde_json::json;

use crate::support::relay;

const TOKEN: &str = "operator-token-0123456789abcdef0123";

async fn post(url: &str, tenant: &str, body: &str) -> u16 {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = hyper::Request::post(url)
        .header("x-tenant", tenant)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    client.request(req).await.unwrap().status().as_u16()
}

/// An admin call with the operator's token: its status.
async fn admin(method: &str, url: &str, body: &str) -> u16 {
    let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .build_http::<Full<Bytes>>();
    let req = hyper::Request::builder()
        .method(method)
        .uri(url)
        .header("authorization", format!("Bearer {TOKEN}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body.to_owned())))
        .unwrap();
    client.request(req).await.unwrap().status().as_u16()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_polls_a_real_node() {
    let dir = tempfile::tempdir().unwrap();
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    // The configuration the operator would mount, with this machine's paths and ports.
    let r = relay("minimal");
    let user = json!({
        "sinks": [{ "id": "nowhere", "url": "http://127.0.0.1:9/hooks", "timeout_ms": 200 }],
        "routes": [{ "id": "r", "sinks": ["nowhere"] }],
        "sources": [{ "id": "demo", "tenant": { "header": "x-tenant" }, "verify": { "scheme": "none" }, "route": "r" }],
        "dispatch": { "tick_interval_ms": 60000 },
        // The sink refuses connections: each hook is dead-lettered on its first attempt,
        // so the node's counts settle.
        "retry": { "max_attempts": 1 },
    });
    let mut cfg = resources::relay_config(&r, Some(&user)).unwrap();
    cfg["data_dir"] = json!(dir.path().join("data"));
    cfg["ingest"]["listen"] = json!("127.0.0.1:0");
    cfg["admin"]["listen"] = json!("127.0.0.1:0");
    cfg["admin"]["backup_dir"] = json!(dir.path().join("backups"));
    cfg["admin"]["tokens"][0]["secret"]["file"] = json!(token_file);
    let backup_file = dir.path().join("backup-token");
    std::fs::write(&backup_file, "a-backup-token-of-the-operator-0123").unwrap();
    cfg["admin"]["tokens"][1]["secret"]["file"] = json!(backup_file);
    let metrics_file = dir.path().join("metrics-token");
    std::fs::write(&metrics_file, "a-metrics-token-of-the-operator-01").unwrap();
    cfg["admin"]["tokens"][2]["secret"]["file"] = json!(metrics_file);
    let cluster_file = dir.path().join("cluster-token");
    std::fs::write(&cluster_file, "a-cluster-token-of-the-nodes-0123456").unwrap();
    cfg["cluster"]["token"]["file"] = json!(cluster_file);
    let yaml = resources::relay_yaml(&cfg).unwrap();
    // The pod's name, as its `ANKUSA_CLUSTER__NAME` gives it.
    let pod = ankusa_operator::names::Names::of(&r).unwrap().pod(0);
    let config =
        ankusa_config::Config::from_yaml(&yaml, vec![("ANKUSA_CLUSTER__NAME".into(), pod)])
            .unwrap();
    let node = ankusa_relay::node::Node::start(config).await.unwrap();

    let ingest = format!("http://{}/ingest/demo", node.ingest_addr);
    for (tenant, n) in [("acme", 3), ("globex", 1)] {
        for i in 0..n {
            assert_eq!(post(&ingest, tenant, &format!("{{\"n\":{i}}}")).await, 202);
        }
    }

    // Fresh hooks are claimed at once (the writer wakes dispatch): wait for the four
    // attempts to fail and settle.
    until_dead(&node, 4, "the hooks never settled").await;
    let client = NodeClient::new("http://{pod}", Duration::from_secs(2));
    let base = format!("http://{}", node.admin_addr);
    let reading = client.poll(&base, TOKEN).await.unwrap();
    assert_eq!(reading.status.store_format, 3);
    assert_eq!(reading.status.tenants, 2);
    assert_eq!(reading.status.counters.dead, 4);
    assert_eq!(reading.status.counters.pending, 0);
    // The tenants the active index still names (their markers wait for the next full
    // read), each with its own counts.
    for t in &reading.top {
        assert!(
            [("acme".to_owned(), 0, 3), ("globex".to_owned(), 0, 1)].contains(&(
                t.tenant.clone(),
                t.pending,
                t.dead
            )),
            "{:?}",
            reading.top
        );
    }

    // A paused tenant and one its quota refused: counted in the node's status, and each
    // marked in its row.
    let limits = format!("{base}/v1/tenants/initech/limits");
    let one = r#"{"ingest_per_second": 0.01, "ingest_burst": 1}"#;
    assert_eq!(admin("PUT", &limits, one).await, 200);
    assert_eq!(post(&ingest, "initech", "{}").await, 202);
    assert_eq!(post(&ingest, "initech", "{}").await, 429);
    assert_eq!(
        admin("POST", &format!("{base}/v1/tenants/globex/pause"), "").await,
        200
    );
    until_dead(&node, 5, "initech's hook never settled").await;
    let reading = client.poll(&base, TOKEN).await.unwrap();
    assert_eq!(
        (
            reading.status.tenants_paused,
            reading.status.tenants_over_quota
        ),
        (Some(1), Some(1))
    );
    let row = |name: &str| reading.top.iter().find(|t| t.tenant == name).cloned();
    let globex = row("globex").expect("globex is listed");
    assert!(globex.paused && globex.quota_refusals == 0, "{globex:?}");
    let initech = row("initech").expect("initech is listed");
    assert!(
        !initech.paused && initech.quota_refusals == 1,
        "{initech:?}"
    );

    // A wrong token is an answer the status reports, not a panic or a hang.
    let err = client
        .poll(&base, "not-the-token-0123456789abcdef")
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ankusa_operator::nodes::PollError::Status { status, .. } if status.as_u16() == 401),
        "{err}"
    );
    // A node that is not there is reported within the timeout.
    let started = std::time::Instant::now();
    let err = client.poll("http://127.0.0.1:9", TOKEN).await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "{err}");
    node.shutdown().await.unwrap();
}

/// Waits (10 s at most, else `why`) until `node` counts `n` dead rows.
async fn until_dead(node: &ankusa_relay::node::Node, n: i64, why: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while ankusa_queue::counters::node(&node.store).unwrap().dead < n {
        assert!(std::time::Instant::now() < deadline, "{why}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
