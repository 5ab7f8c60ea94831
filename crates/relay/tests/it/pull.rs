//! Pull sinks against a real node over HTTP on 127.0.0.1: every call of the claim gateway
//! (`/pull/{sink}/claim|ack|nack|extend`) and every error, leases that expire, a tenant
//! consumer's scope, the hook log's events, and the counters equal to the fold.

use std::time::Duration;

use ankusa_queue::fold;
use ankusa_relay::testkit::{eventually, NodeBuilder, TestNode};
use serde_json::{json, Value};

use crate::support::*;

pub const ALL: &str = "pull-consumer-every-tenant-0123";
pub const ACME: &str = "pull-consumer-acme-only-0123456";

/// A node with the pull sink `q` (and a push-free route to it), two consumers.
pub fn builder() -> NodeBuilder {
    NodeBuilder::default()
        .admin_token("ops", ADMIN_TOKEN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [100], jitter: none, max_attempts: 3 }")
        .section(&format!(
            r#"pull:
  max_claim: 50
  max_wait_ms: 5000
  consumers:
    - {{ name: all, secret: {{ value: "{ALL}" }}, sinks: [q] }}
    - {{ name: acme, secret: {{ value: "{ACME}" }}, sinks: [q], tenants: [acme] }}"#
        ))
        .sink_yaml("{ id: q, kind: pull }")
        .route("r", &["q"])
        .open_source("shared", "r")
}

pub async fn send(addr: std::net::SocketAddr, tenant: &str, body: &str) -> String {
    let r = post(
        &client(),
        &format!("http://{addr}/ingest/shared"),
        &[("x-tenant", tenant.to_owned())],
        body.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(r.status, 202);
    r.json()["id"].as_str().unwrap().to_owned()
}

pub async fn call(
    addr: std::net::SocketAddr,
    path: &str,
    token: &str,
    body: Value,
) -> (u16, Value) {
    admin_call(addr, "POST", path, token, &body.to_string()).await
}

/// Claims until `n` hooks came (each claim long-polls), with `token`.
pub async fn claim_n(node: &TestNode, token: &str, n: usize, lease_ms: u64) -> Vec<Value> {
    let mut got = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        assert!(
            std::time::Instant::now() < until,
            "only {got:?} of {n} came"
        );
        let (s, v) = call(
            node.ingest_addr,
            "/pull/q/claim",
            token,
            json!({ "max": n - got.len(), "wait_ms": 2000, "lease_ms": lease_ms }),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        got.extend(v["hooks"].as_array().unwrap().iter().cloned());
    }
    got
}

fn leases(hooks: &[Value]) -> Vec<String> {
    hooks
        .iter()
        .map(|h| h["lease"].as_str().unwrap().to_owned())
        .collect()
}

fn assert_fold(node: &TestNode) {
    assert_eq!(fold::verify(&node.store).unwrap(), Vec::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_call_of_the_claim_gateway_and_every_error() {
    let node = builder().start().await;
    let at = node.ingest_addr;

    // Who may call, and on which sink.
    let (s, v) = call(
        at,
        "/pull/q/claim",
        "not-a-consumer-token-at-all",
        json!({}),
    )
    .await;
    assert_eq!((s, v["error"].as_str()), (401, Some("unauthorized")));
    let (s, v) = admin_call(at, "POST", "/pull/q/claim", "", "{}").await;
    assert_eq!((s, v["error"].as_str()), (401, Some("unauthorized")));
    let (s, v) = call(at, "/pull/other/claim", ALL, json!({})).await;
    assert_eq!((s, v["error"].as_str()), (404, Some("unknown_sink")));
    // An admin token is not a consumer's.
    let (s, _) = call(at, "/pull/q/claim", ADMIN_TOKEN, json!({})).await;
    assert_eq!(s, 401);
    // Bounds, each named.
    for (body, key) in [
        (json!({ "max": 0 }), "max"),
        (json!({ "max": 51 }), "max"),
        (json!({ "max_bytes": 0 }), "max_bytes"),
        (json!({ "wait_ms": 5001 }), "wait_ms"),
        (json!({ "lease_ms": 999 }), "lease_ms"),
        (json!({ "lease_ms": 43_200_001u64 }), "lease_ms"),
    ] {
        let (s, v) = call(at, "/pull/q/claim", ALL, body.clone()).await;
        assert_eq!(s, 400, "{body}: {v}");
        assert!(v["message"].as_str().unwrap().starts_with(key), "{v}");
    }
    let (s, v) = call(at, "/pull/q/claim", ALL, json!({ "maximum": 3 })).await;
    assert!((400..500).contains(&s), "an unknown key: {s} {v}");
    assert!(v["error"].is_string(), "{v}");
    for path in ["/pull/q/ack", "/pull/q/nack", "/pull/q/extend"] {
        let (s, v) = call(at, path, ALL, json!({ "leases": [] })).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (400, Some("bad_request")),
            "{path}"
        );
        let many: Vec<String> = (0..51).map(|i| format!("{i}.0.0")).collect();
        let (s, _) = call(at, path, ALL, json!({ "leases": many })).await;
        assert_eq!(s, 400, "{path}");
    }

    // Nothing waiting: an empty answer after the wait.
    let t0 = std::time::Instant::now();
    let (s, v) = call(at, "/pull/q/claim", ALL, json!({ "wait_ms": 300 })).await;
    assert_eq!((s, v["hooks"].as_array().map(Vec::len)), (200, Some(0)));
    assert!(
        t0.elapsed() >= Duration::from_millis(290),
        "{:?}",
        t0.elapsed()
    );

    // A long-poll wakes when a hook comes.
    let waiter = tokio::spawn(async move {
        call(
            at,
            "/pull/q/claim",
            ALL,
            json!({ "max": 1, "wait_ms": 5000 }),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    let first = send(at, "acme", r#"{"n":0}"#).await;
    let (s, v) = waiter.await.unwrap();
    assert_eq!(s, 200);
    let h = &v["hooks"][0];
    assert_eq!(h["id"].as_str(), Some(first.as_str()), "{v}");
    assert_eq!(
        (
            h["tenant"].as_str(),
            h["source"].as_str(),
            h["sink"].as_str(),
            h["attempt"].as_u64(),
            h["body"].as_str(),
            h["content_type"].as_str(),
        ),
        (
            Some("acme"),
            Some("shared"),
            Some("q"),
            Some(1),
            Some(r#"{"n":0}"#),
            Some("application/octet-stream")
        ),
        "{v}"
    );
    assert!(h["lease_deadline_ms"].as_u64().unwrap() > ankusa_keyspace::now_ms());
    let (s, v) = call(at, "/pull/q/ack", ALL, json!({ "leases": [h["lease"]] })).await;
    assert_eq!((s, v["settled"].as_u64()), (200, Some(1)), "{v}");
    // Settled once: the same lease again is a conflict that changes nothing.
    let (s, v) = call(at, "/pull/q/ack", ALL, json!({ "leases": [h["lease"]] })).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (409, Some("lease_conflict")),
        "{v}"
    );
    assert_eq!(v["conflicts"][0]["reason"], "unknown", "{v}");
    assert_eq!(v["settled"], 0);

    // Four more of acme's, two of globex's.
    for i in 1..5 {
        send(at, "acme", &format!(r#"{{"n":{i}}}"#)).await;
    }
    for i in 0..2 {
        send(at, "globex", &format!(r#"{{"g":{i}}}"#)).await;
    }
    // A tenant's consumer sees only its tenant.
    let mine = claim_n(&node, ACME, 4, 60_000).await;
    assert!(mine.iter().all(|h| h["tenant"] == "acme"), "{mine:?}");
    let (s, v) = call(at, "/pull/q/claim", ACME, json!({ "wait_ms": 300 })).await;
    assert_eq!((s, v["hooks"].as_array().map(Vec::len)), (200, Some(0)));
    let theirs = claim_n(&node, ALL, 2, 60_000).await;
    assert!(theirs.iter().all(|h| h["tenant"] == "globex"), "{theirs:?}");
    // ... and cannot settle another tenant's lease.
    let (s, v) = call(
        at,
        "/pull/q/ack",
        ACME,
        json!({ "leases": leases(&theirs) }),
    )
    .await;
    assert_eq!((s, v["conflicts"].as_array().map(Vec::len)), (409, Some(2)));
    let c = node.store.clone();
    let counters = ankusa_queue::counters::node(&c).unwrap();
    assert_eq!((counters.inflight, counters.pending), (6, 0));
    assert_fold(&node);

    // Extend: a new deadline.
    let (s, v) = call(
        at,
        "/pull/q/extend",
        ALL,
        json!({ "leases": [mine[0]["lease"]], "lease_ms": 120_000 }),
    )
    .await;
    assert_eq!((s, v["settled"].as_u64()), (200, Some(1)), "{v}");
    assert!(v["lease_deadline_ms"].as_u64().unwrap() > ankusa_keyspace::now_ms() + 100_000);

    // Nack: the attempt counts, the hook comes back after the schedule's step.
    let (s, v) = call(
        at,
        "/pull/q/nack",
        ACME,
        json!({ "leases": [mine[1]["lease"]], "retry_after_ms": 200 }),
    )
    .await;
    assert_eq!((s, v["settled"].as_u64()), (200, Some(1)), "{v}");
    let again = claim_n(&node, ACME, 1, 60_000).await;
    assert_eq!(
        (again[0]["id"].clone(), again[0]["attempt"].as_u64()),
        (mine[1]["id"].clone(), Some(2))
    );

    // A mixed ack: the held leases settle, the unknown one is named.
    let mut mixed = leases(&mine[2..4]);
    mixed.push("1.0.0".to_owned());
    mixed.push("not a lease".to_owned());
    let (s, v) = call(at, "/pull/q/ack", ALL, json!({ "leases": mixed })).await;
    assert_eq!((s, v["settled"].as_u64()), (409, Some(2)), "{v}");
    let reasons: Vec<&str> = v["conflicts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["reason"].as_str().unwrap())
        .collect();
    assert_eq!(reasons, ["unknown", "unknown"]);
    let rest: Vec<String> = [&mine[0], &again[0]]
        .into_iter()
        .chain(&theirs)
        .map(|h| h["lease"].as_str().unwrap().to_owned())
        .collect();
    let (s, _) = call(at, "/pull/q/ack", ALL, json!({ "leases": rest })).await;
    assert_eq!(s, 200);
    eventually(10, "every delivery settled", || {
        let c = ankusa_queue::counters::node(&node.store).unwrap();
        (c.inflight, c.pending, c.scheduled, c.dead, c.bytes) == (0, 0, 0, 0, 0)
    })
    .await;
    assert_fold(&node);

    // The hook log: claimed, nacked, claimed, acked.
    let id = mine[1]["id"].as_str().unwrap();
    let (s, v) = admin_call(
        node.admin_addr,
        "GET",
        &format!("/v1/hooks/{id}"),
        ADMIN_TOKEN,
        "",
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let kinds: Vec<&str> = v["sinks"][0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["claimed", "nacked", "claimed", "acked"], "{v}");
    assert_eq!(v["sinks"][0]["state"], "delivered", "{v}");
    assert_eq!(v["sinks"][0]["attempts"], 2, "{v}");

    // The metrics.
    let (_, m) = get_text(&client(), &format!("http://{}/metrics", node.admin_addr)).await;
    for line in [
        r#"ankusa_pull_claimed_total{sink="q"} 8"#,
        r#"ankusa_pull_acked_total{sink="q"} 7"#,
        r#"ankusa_pull_nacked_total{sink="q"} 1"#,
        r#"ankusa_pull_leases{sink="q"} 0"#,
    ] {
        assert!(m.contains(line), "{line} in\n{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_that_runs_out_is_an_attempt_and_a_late_ack_changes_nothing() {
    let node = builder().start().await;
    let at = node.ingest_addr;
    let id = send(at, "acme", "{}").await;
    let first = claim_n(&node, ALL, 1, 1_000).await;
    assert_eq!(first[0]["id"].as_str(), Some(id.as_str()));
    // Past the lease, and past the retry step: claimable again, as attempt 2.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let second = claim_n(&node, ALL, 1, 60_000).await;
    assert_eq!(
        (second[0]["id"].as_str(), second[0]["attempt"].as_u64()),
        (Some(id.as_str()), Some(2))
    );
    // The first lease's ack is late: 409, and the second lease still holds.
    let (s, v) = call(
        at,
        "/pull/q/ack",
        ALL,
        json!({ "leases": [first[0]["lease"]] }),
    )
    .await;
    assert_eq!(
        (s, v["conflicts"][0]["reason"].as_str()),
        (409, Some("expired")),
        "{v}"
    );
    let c = ankusa_queue::counters::node(&node.store).unwrap();
    assert_eq!(c.inflight, 1);
    // Past the attempts: the third expiry dead-letters it.
    let (s, _) = call(
        at,
        "/pull/q/nack",
        ALL,
        json!({ "leases": [second[0]["lease"]] }),
    )
    .await;
    assert_eq!(s, 200);
    let third = claim_n(&node, ALL, 1, 1_000).await;
    assert_eq!(third[0]["attempt"].as_u64(), Some(3));
    eventually(10, "dead-lettered after its third attempt", || {
        ankusa_queue::counters::node(&node.store).unwrap().dead == 1
    })
    .await;
    assert_fold(&node);
    let (_, v) = admin_call(
        node.admin_addr,
        "GET",
        &format!("/v1/hooks/{id}"),
        ADMIN_TOKEN,
        "",
    )
    .await;
    let kinds: Vec<&str> = v["sinks"][0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["claimed", "expired", "claimed", "nacked", "claimed", "expired"],
        "{v}"
    );
    assert_eq!(v["sinks"][0]["state"], "dead", "{v}");
    let (_, m) = get_text(&client(), &format!("http://{}/metrics", node.admin_addr)).await;
    assert!(
        m.contains(r#"ankusa_pull_expired_total{sink="q"} 2"#),
        "{m}"
    );

    // A replay from the DLQ reaches the consumers again.
    let (_, dlq) = admin_call(node.admin_addr, "GET", "/v1/dlq", ADMIN_TOKEN, "").await;
    let row = dlq["items"][0]["id"].clone();
    assert!(row.is_string(), "{dlq}");
    let (s, v) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/dlq/replay",
        ADMIN_TOKEN,
        &json!({ "ids": [row] }).to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let back = claim_n(&node, ALL, 1, 60_000).await;
    assert_eq!(back[0]["id"].as_str(), Some(id.as_str()));
    let (s, _) = call(
        at,
        "/pull/q/ack",
        ALL,
        json!({ "leases": [back[0]["lease"]] }),
    )
    .await;
    assert_eq!(s, 200);
    assert_fold(&node);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_share_a_pull_sink_round_robin_and_bounds_hold() {
    let node = builder().start().await;
    let at = node.ingest_addr;
    // A flood of one tenant, then one hook of another.
    for i in 0..30 {
        send(at, "flood", &format!(r#"{{"i":{i}}}"#)).await;
    }
    send(at, "quiet", "{}").await;
    eventually(10, "every hook parked", || {
        ankusa_queue::deliveries::pulled_rows(&node.store)
            .unwrap()
            .len()
            == 31
    })
    .await;
    // A claim of 4 takes turns: the quiet tenant's hook is in the first turn.
    let (s, v) = call(at, "/pull/q/claim", ALL, json!({ "max": 4 })).await;
    assert_eq!(s, 200);
    let tenants: Vec<&str> = v["hooks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["tenant"].as_str().unwrap())
        .collect();
    assert_eq!(tenants.len(), 4);
    assert!(tenants[..2].contains(&"quiet"), "{tenants:?}");
    // max_bytes: a first hook always comes, then only what fits.
    let (s, v) = call(
        at,
        "/pull/q/claim",
        ALL,
        json!({ "max": 10, "max_bytes": 1 }),
    )
    .await;
    assert_eq!((s, v["hooks"].as_array().map(Vec::len)), (200, Some(1)));
    assert_fold(&node);
}
