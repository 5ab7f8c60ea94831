//! The claim gateway's bounds against a hostile or careless consumer, over HTTP on
//! 127.0.0.1: a consumer holds at most its share of a pull sink's leases and a tenant at
//! most its cap; a lease lives at most its lifetime however often it is extended; a pause
//! or an erase revokes a tenant's leases; a consumer's waiting claims are capped (429);
//! a reload that revokes a consumer ends its waiting claim.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use ankusa_relay::testkit::{eventually, NodeBuilder, TestNode};
use serde_json::{json, Value};

use crate::pull::{call, send};
use crate::support::*;

const A: &str = "pull-bounds-consumer-a-0123456";
const B: &str = "pull-bounds-consumer-b-0123456";

/// A node with the pull sink `q` (10 leases), two consumers of every tenant (a share of 5
/// each) and `pull` keys `extra`.
fn builder(extra: &str) -> NodeBuilder {
    with_consumers(extra, &[("a", A), ("b", B)])
}

/// [`builder`] with these consumers (name, token) of `q`.
fn with_consumers(extra: &str, consumers: &[(&str, &str)]) -> NodeBuilder {
    let consumers: String = consumers
        .iter()
        .map(|(name, token)| {
            format!("\n    - {{ name: {name}, secret: {{ value: \"{token}\" }}, sinks: [q] }}")
        })
        .collect();
    NodeBuilder::default()
        .admin_token("ops", ADMIN_TOKEN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section(&format!(
            "pull:\n  max_wait_ms: 5000\n  {extra}\n  consumers:{consumers}"
        ))
        .sink_yaml("{ id: q, kind: pull, max_inflight: 10 }")
        .route("r", &["q"])
        .open_source("shared", "r")
}

async fn parked(node: &TestNode, n: usize) {
    eventually(10, "every hook parked", || {
        ankusa_queue::deliveries::pulled_rows(&node.store)
            .unwrap()
            .len()
            == n
    })
    .await;
}

fn hooks(v: &Value) -> Vec<Value> {
    v["hooks"].as_array().cloned().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_holds_at_most_its_share_and_a_tenant_at_most_its_cap() {
    let node = builder("tenant_max_leases: 4").start().await;
    let at = node.ingest_addr;
    for t in ["t1", "t2", "t3"] {
        for i in 0..6 {
            send(at, t, &format!(r#"{{"i":{i}}}"#)).await;
        }
    }
    parked(&node, 18).await;
    // `a` asks for everything: it gets its share, 5 of the sink's 10.
    let (s, first) = call(at, "/pull/q/claim", A, json!({ "max": 50 })).await;
    assert_eq!((s, hooks(&first).len()), (200, 5), "{first}");
    let (s, v) = call(at, "/pull/q/claim", A, json!({ "max": 50 })).await;
    assert_eq!((s, hooks(&v).len()), (200, 0), "at its quota: {v}");
    // `b` is not starved by `a`: its own share.
    let (s, second) = call(at, "/pull/q/claim", B, json!({ "max": 50 })).await;
    assert_eq!((s, hooks(&second).len()), (200, 5), "{second}");
    // Ten leases out, no tenant's more than 4.
    let mut per_tenant = BTreeMap::new();
    for h in hooks(&first).into_iter().chain(hooks(&second)) {
        *per_tenant
            .entry(h["tenant"].as_str().unwrap().to_owned())
            .or_insert(0) += 1;
    }
    assert!(per_tenant.values().all(|n| *n <= 4), "{per_tenant:?}");
    assert_eq!(per_tenant.values().sum::<i32>(), 10);
    let m = get_text(&client(), &node.admin_url("/metrics")).await.1;
    assert!(
        m.contains(r#"ankusa_pull_refused_total{sink="q",reason="consumer_quota"} 1"#),
        "{m}"
    );
    assert!(m.contains(r#"ankusa_pull_leases{sink="q"} 10"#), "{m}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_holds_at_most_its_cap_of_a_shared_sinks_leases() {
    let node = builder("tenant_max_leases: 3").start().await;
    let at = node.ingest_addr;
    for i in 0..8 {
        send(at, "flood", &format!(r#"{{"i":{i}}}"#)).await;
    }
    parked(&node, 8).await;
    let (s, v) = call(at, "/pull/q/claim", A, json!({ "max": 50 })).await;
    assert_eq!((s, hooks(&v).len()), (200, 3), "{v}");
    let (s, v) = call(at, "/pull/q/claim", B, json!({ "max": 50 })).await;
    assert_eq!(
        (s, hooks(&v).len()),
        (200, 0),
        "the tenant is at its cap: {v}"
    );
    // Another tenant's hook still goes.
    send(at, "quiet", "{}").await;
    parked(&node, 6).await;
    let (s, v) = call(
        at,
        "/pull/q/claim",
        B,
        json!({ "max": 50, "wait_ms": 2000 }),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(
        hooks(&v)
            .iter()
            .map(|h| h["tenant"].clone())
            .collect::<Vec<_>>(),
        vec![json!("quiet")]
    );
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_lives_at_most_its_lifetime_however_often_it_is_extended() {
    let node = builder("max_lease_lifetime_ms: 3000").start().await;
    let at = node.ingest_addr;
    send(at, "t", "{}").await;
    parked(&node, 1).await;
    // A claim may not ask for more than the lifetime.
    let (s, v) = call(at, "/pull/q/claim", A, json!({ "lease_ms": 5000 })).await;
    assert_eq!(s, 400, "{v}");
    let (s, v) = call(at, "/pull/q/claim", A, json!({ "lease_ms": 1000 })).await;
    assert_eq!(s, 200);
    let lease = hooks(&v)[0]["lease"].clone();
    let (s, v) = call(
        at,
        "/pull/q/extend",
        A,
        json!({ "leases": [lease], "lease_ms": 1500 }),
    )
    .await;
    assert_eq!((s, v["settled"].as_u64()), (200, Some(1)), "{v}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    // Past the lifetime from its claim: not extended, and said why.
    let (s, v) = call(
        at,
        "/pull/q/extend",
        A,
        json!({ "leases": [lease], "lease_ms": 2900 }),
    )
    .await;
    assert_eq!(s, 409, "{v}");
    assert_eq!(v["conflicts"][0]["reason"], "lifetime", "{v}");
    // It still holds its deadline: an ack goes.
    let (s, v) = call(at, "/pull/q/ack", A, json!({ "leases": [lease] })).await;
    assert_eq!((s, v["settled"].as_u64()), (200, Some(1)), "{v}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_or_an_erase_revokes_the_tenants_leases() {
    let node = builder("").start().await;
    let at = node.ingest_addr;
    send(at, "paused", "{}").await;
    send(at, "erased", "{}").await;
    send(at, "kept", "{}").await;
    parked(&node, 3).await;
    let (s, v) = call(
        at,
        "/pull/q/claim",
        A,
        json!({ "max": 3, "lease_ms": 600000 }),
    )
    .await;
    assert_eq!((s, hooks(&v).len()), (200, 3), "{v}");
    let lease_of = |t: &str| {
        hooks(&v)
            .iter()
            .find(|h| h["tenant"] == t)
            .map(|h| h["lease"].clone())
            .unwrap()
    };
    let (s, _) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/tenants/paused/pause",
        ADMIN_TOKEN,
        "",
    )
    .await;
    assert_eq!(s, 200);
    let (s, _) = admin_call(
        node.admin_addr,
        "DELETE",
        "/v1/tenants/erased?confirm=erased",
        ADMIN_TOKEN,
        "",
    )
    .await;
    assert_eq!(s, 202);
    // The erase does not wait out a ten-minute lease: it is revoked.
    let started = Instant::now();
    eventually(10, "the erase ended", || {
        ankusa_queue::tenants::ord(&node.store, "erased")
            .unwrap()
            .is_none()
    })
    .await;
    assert!(started.elapsed() < Duration::from_secs(10));
    // A late ack or extension of a revoked lease is unknown; the other tenant's goes.
    let (s, v) = call(
        at,
        "/pull/q/extend",
        A,
        json!({ "leases": [lease_of("paused")] }),
    )
    .await;
    assert_eq!(
        (s, v["conflicts"][0]["reason"].as_str()),
        (409, Some("unknown")),
        "{v}"
    );
    let (s, v) = call(
        at,
        "/pull/q/ack",
        A,
        json!({ "leases": [lease_of("paused"), lease_of("kept")] }),
    )
    .await;
    assert_eq!((s, v["settled"].as_u64()), (409, Some(1)), "{v}");
    // The paused tenant's hook is due again, held by the pause: no consumer gets it.
    let (s, v) = call(at, "/pull/q/claim", B, json!({ "wait_ms": 500 })).await;
    assert_eq!((s, hooks(&v).len()), (200, 0), "{v}");
    let (_, t) = admin_call(
        node.admin_addr,
        "GET",
        "/v1/tenants/paused",
        ADMIN_TOKEN,
        "",
    )
    .await;
    assert_eq!(t["counters"]["inflight"], 0, "{t}");
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_claims_are_capped_per_consumer_and_a_revoked_consumer_stops_waiting() {
    let node = builder("max_waiting_claims: 2").start().await;
    let at = node.ingest_addr;
    let wait = |token: &'static str| {
        tokio::spawn(async move {
            let started = Instant::now();
            let r = call(at, "/pull/q/claim", token, json!({ "wait_ms": 5000 })).await;
            (r, started.elapsed())
        })
    };
    let (w1, w2) = (wait(A), wait(A));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, v) = call(at, "/pull/q/claim", A, json!({ "wait_ms": 5000 })).await;
    assert_eq!(
        (s, v["error"].as_str()),
        (429, Some("too_many_waiting_claims")),
        "{v}"
    );
    // Another consumer is not held by `a`'s cap; a claim that does not wait is not either.
    let (s, _) = call(at, "/pull/q/claim", B, json!({ "wait_ms": 100 })).await;
    assert_eq!(s, 200);
    let (s, _) = call(at, "/pull/q/claim", A, json!({})).await;
    assert_eq!(s, 200);
    // A reload without `a`: its waiting claims end at once, refused.
    let without_a = with_consumers("max_waiting_claims: 2", &[("b", B)]);
    node.reloader
        .reload(&without_a.yaml_at(node.dir()), Vec::new())
        .unwrap();
    for w in [w1, w2] {
        let ((s, v), took) = w.await.unwrap();
        assert_eq!(s, 401, "{v}");
        assert!(took < Duration::from_secs(3), "{took:?}");
    }
    let m = get_text(&client(), &node.admin_url("/metrics")).await.1;
    assert!(m.contains("ankusa_pull_waiting_claims 0"), "{m}");
    assert!(
        m.contains(r#"ankusa_pull_refused_total{sink="q",reason="waiting_claims"} 1"#),
        "{m}"
    );
    node.stop().await;
}

/// A claim waiting while its consumer is at its quota takes rows as soon as the consumer's
/// acks give places back, not at the end of its wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_waiting_at_its_quota_is_woken_by_its_acks() {
    let node = builder("").start().await;
    let at = node.ingest_addr;
    for i in 0..8 {
        send(at, "t", &format!(r#"{{"i":{i}}}"#)).await;
    }
    parked(&node, 8).await;
    let (s, v) = call(at, "/pull/q/claim", A, json!({ "max": 50 })).await;
    assert_eq!((s, hooks(&v).len()), (200, 5), "{v}");
    let leases: Vec<Value> = hooks(&v).iter().map(|h| h["lease"].clone()).collect();
    let waiting = tokio::spawn(async move {
        let started = Instant::now();
        let r = call(
            at,
            "/pull/q/claim",
            A,
            json!({ "max": 50, "wait_ms": 5000 }),
        )
        .await;
        (r, started.elapsed())
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, _) = call(at, "/pull/q/ack", A, json!({ "leases": leases })).await;
    assert_eq!(s, 200);
    let ((s, v), took) = waiting.await.unwrap();
    assert_eq!((s, hooks(&v).len()), (200, 3), "{v}");
    assert!(took < Duration::from_secs(3), "woken after {took:?}");
    node.stop().await;
}
