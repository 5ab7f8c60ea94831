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
    with_pull_sink(NodeBuilder::default().admin_token("ops", ADMIN_TOKEN))
}

/// `b` with the pull sink `q`, its route and source, two consumers.
pub fn with_pull_sink(b: NodeBuilder) -> NodeBuilder {
    b.section("dispatch: { tick_interval_ms: 10 }")
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
    claim_at(node.ingest_addr, token, n, lease_ms).await
}

/// Claims at the node whose ingest listener is `at` until `n` hooks came.
async fn claim_at(at: std::net::SocketAddr, token: &str, n: usize, lease_ms: u64) -> Vec<Value> {
    let mut got = Vec::new();
    let until = std::time::Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        assert!(
            std::time::Instant::now() < until,
            "only {got:?} of {n} came"
        );
        let (s, v) = call(
            at,
            "/pull/q/claim",
            token,
            json!({ "max": n - got.len(), "wait_ms": 1000, "lease_ms": lease_ms }),
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
        let (s, v) = call(
            at,
            path,
            "not-a-consumer-token-at-all",
            json!({ "leases": ["1.0.0"] }),
        )
        .await;
        assert_eq!(
            (s, v["error"].as_str()),
            (401, Some("unauthorized")),
            "{path}"
        );
        let other = path.replace("/q/", "/other/");
        let (s, v) = call(at, &other, ALL, json!({ "leases": ["1.0.0"] })).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (404, Some("unknown_sink")),
            "{other}"
        );
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

    for ms in [999u64, 43_200_001] {
        let (s, v) = call(
            at,
            "/pull/q/extend",
            ALL,
            json!({ "leases": ["1.0.0"], "lease_ms": ms }),
        )
        .await;
        assert_eq!(s, 400, "{v}");
        assert!(
            v["message"].as_str().unwrap().starts_with("lease_ms"),
            "{v}"
        );
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
    node.stop().await;
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
    node.stop().await;
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
    node.stop().await;
}

/// The command line's consumer, in a process group of its own (its `--exec` commands die
/// with it).
fn consumer(node: &TestNode, extra: &[&str]) -> std::process::Command {
    use std::os::unix::process::CommandExt;
    let mut c = bin();
    c.args([
        "pull",
        "--url",
        &format!("http://{}", node.ingest_addr),
        "--token",
        ALL,
        "--sink",
        "q",
    ])
    .args(extra)
    .process_group(0);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consumer_that_dies_mid_batch_gets_its_hooks_again_after_the_lease() {
    let node = builder().start().await;
    let at = node.ingest_addr;
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(send(at, &format!("t{}", i % 3), &format!(r#"{{"i":{i}}}"#)).await);
    }
    // The first consumer takes a batch of 4 and hangs on the first hook's command.
    let mut first = consumer(
        &node,
        &[
            "--max",
            "4",
            "--wait-ms",
            "3000",
            "--lease-ms",
            "1000",
            "--exec",
            "sleep 60",
        ],
    )
    .spawn()
    .unwrap();
    let store = node.store.clone();
    eventually(15, "a batch of 4 leased", || {
        ankusa_queue::counters::node(&store).unwrap().inflight == 4
    })
    .await;
    // Its connection is gone mid-batch: the process and its command, killed.
    let group = format!("-{}", first.id());
    let killed = std::process::Command::new("kill")
        .args(["-KILL", "--", &group])
        .status()
        .unwrap();
    assert!(killed.success());
    first.wait().unwrap();

    // It comes back: every hook is handled, the leased four on their second attempt.
    let out = node.dir().join("handled");
    let cmd = format!(
        "printf '%s %s %s\\n' \"$ANKUSA_HOOK_ID\" \"$ANKUSA_ATTEMPT\" \"$(cat)\" >> {}",
        out.display()
    );
    let again = consumer(
        &node,
        &[
            "--max",
            "4",
            "--wait-ms",
            "3000",
            "--limit",
            "10",
            "--exec",
            &cmd,
        ],
    )
    .output()
    .unwrap();
    assert!(again.status.success(), "{again:?}");
    let text = std::fs::read_to_string(&out).unwrap();
    let mut seen: Vec<(&str, &str)> = text
        .lines()
        .map(|l| {
            let mut w = l.split(' ');
            (w.next().unwrap(), w.next().unwrap())
        })
        .collect();
    assert_eq!(seen.len(), 10, "{text}");
    let seconds = seen.iter().filter(|(_, a)| *a == "2").count();
    assert_eq!(
        seconds, 4,
        "the first batch came again as attempt 2: {text}"
    );
    seen.sort();
    seen.dedup_by_key(|(id, _)| *id);
    let mut want: Vec<&str> = ids.iter().map(String::as_str).collect();
    want.sort();
    assert_eq!(seen.iter().map(|(id, _)| *id).collect::<Vec<_>>(), want);
    assert!(text.contains(r#"{"i":9}"#), "the body on stdin: {text}");
    let c = ankusa_queue::counters::node(&node.store).unwrap();
    assert_eq!((c.inflight, c.pending, c.scheduled, c.bytes), (0, 0, 0, 0));
    assert_fold(&node);
    node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_example_consumer_handles_and_acks_every_hook() {
    let node = builder().start().await;
    for i in 0..5 {
        send(node.ingest_addr, "acme", &format!(r#"{{"i":{i}}}"#)).await;
    }
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let url = format!("http://{}", node.ingest_addr);
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(root.join("examples/pull_consumer.py"))
            .args([
                "--url",
                &url,
                "--sink",
                "q",
                "--max",
                "10",
                "--wait-ms",
                "2000",
                "--limit",
                "5",
            ])
            .env("ANKUSA_PULL_TOKEN", ALL)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 5, "{lines:?}");
    assert!(lines
        .iter()
        .all(|l| l["tenant"] == "acme" && l["bytes"] == 7));
    let c = ankusa_queue::counters::node(&node.store).unwrap();
    assert_eq!((c.inflight, c.pending, c.bytes), (0, 0, 0));
    // A bad token is a refusal, said once, not retried forever.
    let url = format!("http://{}", node.ingest_addr);
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new("python3")
            .arg(root.join("examples/pull_consumer.py"))
            .args(["--url", &url, "--sink", "q"])
            .env("ANKUSA_PULL_TOKEN", "wrong-token-wrong-token")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("401 unauthorized"),
        "{out:?}"
    );
    node.stop().await;
}

fn ids(hooks: &[Value]) -> std::collections::BTreeSet<String> {
    hooks
        .iter()
        .map(|h| h["id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_with_leases_out_keeps_every_ack_and_every_lease() {
    let dir = tempfile::tempdir().unwrap();
    let spec = with_pull_sink(proc_node());
    let ingest = spec.ingest_port().unwrap();
    let at: std::net::SocketAddr = ([127, 0, 0, 1], ingest).into();
    let start = |dir: std::path::PathBuf, spec: NodeBuilder| {
        tokio::task::block_in_place(|| Proc::start(&dir, &spec))
    };
    let mut node = start(dir.path().to_owned(), spec.clone());
    let mut sent = std::collections::BTreeSet::new();
    for i in 0..20 {
        sent.insert(send(at, &format!("t{}", i % 4), &format!(r#"{{"i":{i}}}"#)).await);
    }
    // 12 leased; 6 of them acked before the kill.
    // A lease long enough for the kill and the restart on a loaded machine.
    let leased = claim_at(at, ALL, 12, 20_000).await;
    let (acked_before, held) = leased.split_at(6);
    let (s, _) = call(
        at,
        "/pull/q/ack",
        ALL,
        json!({ "leases": leases(acked_before) }),
    )
    .await;
    assert_eq!(s, 200);
    node.kill9();

    let mut node = start(dir.path().to_owned(), spec.clone());
    // The leases outlived the kill: 3 of the held ones are acked after it.
    let (acked_after, unacked) = held.split_at(3);
    let (s, v) = call(
        at,
        "/pull/q/ack",
        ALL,
        json!({ "leases": leases(acked_after) }),
    )
    .await;
    assert_eq!((s, v["settled"].as_u64()), (200, Some(3)), "{v}");
    // The 8 never claimed come; nothing leased comes before its deadline.
    let fresh = claim_at(at, ALL, 8, 60_000).await;
    let never: std::collections::BTreeSet<String> =
        sent.difference(&ids(&leased)).cloned().collect();
    assert_eq!(ids(&fresh), never);
    let (s, v) = call(at, "/pull/q/claim", ALL, json!({ "wait_ms": 300 })).await;
    assert_eq!(
        (s, v["hooks"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{v}"
    );
    let (s, _) = call(at, "/pull/q/ack", ALL, json!({ "leases": leases(&fresh) })).await;
    assert_eq!(s, 200);
    // After their lease, the 3 unacked come again, as second attempts; nothing acked does.
    let back = claim_at(at, ALL, 3, 60_000).await;
    assert_eq!(ids(&back), ids(unacked));
    assert!(back.iter().all(|h| h["attempt"] == 2), "{back:?}");
    let (s, _) = call(at, "/pull/q/ack", ALL, json!({ "leases": leases(&back) })).await;
    assert_eq!(s, 200);
    let (s, v) = call(at, "/pull/q/claim", ALL, json!({ "wait_ms": 500 })).await;
    assert_eq!(
        (s, v["hooks"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{v}"
    );
    node.kill9();

    // The store: nothing owed, and the counters equal the fold.
    let store =
        ankusa_store::Store::open(dir.path().join("db"), &ankusa_store::OpenOptions::default())
            .unwrap();
    assert_eq!(fold::verify(&store).unwrap(), Vec::new());
    let c = ankusa_queue::counters::node(&store).unwrap();
    assert_eq!(
        (c.pending, c.scheduled, c.inflight, c.dead, c.bytes),
        (0, 0, 0, 0, 0)
    );
}

// ---------------------------------------------------------------------------------------
// The model: claimers, ackers, nackers, extensions, expiries, replays and purges at once.

/// What the concurrent actors did that the model checks.
#[derive(Default)]
struct Seen {
    /// Seqs whose ack settled a lease (at most once each: a delivered row never returns).
    acked: std::collections::HashMap<u64, u32>,
    /// Lease ids a call settled (ack or nack): each at most once.
    settled: std::collections::HashMap<String, u32>,
    claims: u64,
}

#[test]
fn claims_acks_nacks_expiries_replays_and_purges_at_once_settle_each_lease_once() {
    use ankusa_queue::deliveries::{self, PurgeKinds, Tx};
    use ankusa_queue::testkit::Harness;
    use ankusa_relay::pull::{Ask, Gateway, Parts, Settle};
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{Arc, Mutex};

    for seed in [1u64, 2] {
        let mut h = Harness::new();
        let tenants: Vec<String> = (0..6).map(|t| format!("t{t}")).collect();
        let now = ankusa_keyspace::now_ms();
        let mut seqs = Vec::new();
        for i in 0..300 {
            seqs.push(h.ingest(Some(&tenants[i % 6]), 1, now, false).0);
        }
        let config = ankusa_config::Config::from_yaml(
            r#"
sinks: [{ id: sink0, kind: pull }]
retry: { schedule_ms: [1], jitter: none, max_attempts: 3 }
pull:
  consumers:
    - { name: all, secret: { value: "model-consumer-all-0123" }, sinks: [sink0] }
"#,
            Vec::new(),
        )
        .unwrap();
        let metrics = Arc::new(ankusa_relay::metrics::Metrics::new());
        let deliverer = ankusa_relay::dispatch::delivery::Deliverer::from_config(&config).unwrap();
        let gateway = Gateway::new(
            &config,
            Parts {
                store: h.store.clone(),
                cluster: Arc::new(
                    ankusa_relay::cluster::Cluster::new(&config, &h.store, metrics.clone())
                        .unwrap(),
                ),
                deliverer: deliverer.clone(),
                paused: Arc::new(ankusa_relay::dispatch::paused::Paused::counted(
                    metrics.tenants_paused.clone(),
                )),
                hints: Arc::default(),
                metrics,
            },
        )
        .unwrap();
        let consumer = gateway.consumer(b"model-consumer-all-0123").unwrap();
        let store = h.store.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let seen = Arc::new(Mutex::new(Seen::default()));
        let mut threads = Vec::new();
        // The tick's part: park every due row whose time came.
        {
            let (store, stop, wake) = (store.clone(), stop.clone(), deliverer.pull_wake.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let now = ankusa_keyspace::now_ms();
                    let mut tx = Tx::new();
                    let mut keys = Vec::new();
                    for row in deliveries::due_rows(&store).unwrap() {
                        if row.key.at.0 <= now {
                            deliveries::park(&mut tx, &row, "sink0");
                            keys.push(row.key);
                        }
                    }
                    let moved = tx.commit(&store, false).unwrap().moved;
                    let keys: Vec<_> = keys
                        .into_iter()
                        .zip(moved)
                        .filter(|(_, m)| *m)
                        .map(|(k, _)| k)
                        .collect();
                    wake.parked("sink0", &keys);
                    std::thread::sleep(Duration::from_millis(2));
                }
            }));
        }
        // Consumers: claim, then ack, nack, extend, or let the lease run out.
        for c in 0..3u64 {
            let (g, consumer, stop, seen) = (
                gateway.clone(),
                consumer.clone(),
                stop.clone(),
                seen.clone(),
            );
            threads.push(std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed * 100 + c);
                while !stop.load(Ordering::Relaxed) {
                    let ask = Ask {
                        max: rng.random_range(1..20),
                        max_bytes: 1 << 20,
                        lease_ms: rng.random_range(20..120),
                    };
                    let hooks = g.claim("sink0", &consumer, ask).unwrap();
                    seen.lock().unwrap().claims += hooks.len() as u64;
                    for hook in hooks {
                        let leases = [hook.lease.clone()];
                        let roll = rng.random_range(0..10);
                        let r = match roll {
                            0..5 => g.settle("sink0", &consumer, &leases, Settle::Ack),
                            5..7 => g.settle(
                                "sink0",
                                &consumer,
                                &leases,
                                Settle::Nack { retry_after: None },
                            ),
                            // An extension settles nothing: the lease runs on (or out),
                            // and whatever the call answers, it is not counted as settled.
                            7 => g
                                .extend("sink0", &consumer, &leases, 50)
                                .map(|_| vec![Some(ankusa_relay::pull::Conflict::Unknown)]),
                            _ => Ok(vec![Some(ankusa_relay::pull::Conflict::Unknown)]),
                        }
                        .unwrap();
                        if r[0].is_none() {
                            let mut s = seen.lock().unwrap();
                            *s.settled.entry(hook.lease.clone()).or_default() += 1;
                            if roll < 5 {
                                let seq = ankusa_relay::pull::lease::parse_lease_id(&hook.lease)
                                    .map(|p| p.seq)
                                    .unwrap();
                                *s.acked.entry(seq.0).or_default() += 1;
                            }
                        }
                        // A second settle of the same lease never succeeds.
                        if rng.random_range(0..4) == 0 {
                            let again = g.settle("sink0", &consumer, &leases, Settle::Ack).unwrap();
                            assert!(
                                r[0].is_some() || again[0].is_some(),
                                "a lease settled twice: {}",
                                hook.lease
                            );
                            if again[0].is_none() {
                                let mut s = seen.lock().unwrap();
                                *s.settled.entry(hook.lease.clone()).or_default() += 1;
                                let seq = ankusa_relay::pull::lease::parse_lease_id(&hook.lease)
                                    .map(|p| p.seq)
                                    .unwrap();
                                *s.acked.entry(seq.0).or_default() += 1;
                            }
                        }
                    }
                }
            }));
        }
        // Expiries.
        {
            let (g, stop) = (gateway.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    g.expire_due(1_000).unwrap();
                    std::thread::sleep(Duration::from_millis(3));
                }
            }));
        }
        // Replays of dead rows, and purges of a tenant's queue.
        {
            let (store, stop) = (store.clone(), stop.clone());
            let ords: Vec<_> = tenants.iter().map(|t| h.ord(t)).collect();
            threads.push(std::thread::spawn(move || {
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
                while !stop.load(Ordering::Relaxed) {
                    if rng.random_range(0..3) == 0 {
                        let ord = ords[rng.random_range(0..ords.len())];
                        let kinds = PurgeKinds {
                            pending: true,
                            dead: rng.random_bool(0.5),
                        };
                        deliveries::purge_tenant_chunk(&store, ord, kinds).unwrap();
                    } else {
                        let mut tx = Tx::new();
                        let now = ankusa_keyspace::AtMs(ankusa_keyspace::now_ms());
                        for row in ankusa_queue::testkit::dead_rows(&store).iter().take(20) {
                            deliveries::revive(&mut tx, row, now);
                        }
                        tx.commit(&store, true).unwrap();
                    }
                    std::thread::sleep(Duration::from_millis(rng.random_range(20..80)));
                }
            }));
        }
        std::thread::sleep(Duration::from_secs(3));
        stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        // Drain: every lease out ends at its deadline.
        std::thread::sleep(Duration::from_millis(200));
        gateway.expire_due(100_000).unwrap();
        let s = seen.lock().unwrap();
        assert!(s.claims > 100, "seed {seed}: only {} claims", s.claims);
        assert!(
            s.acked.values().all(|n| *n == 1),
            "seed {seed}: a delivery acked twice"
        );
        assert!(
            s.settled.values().all(|n| *n == 1),
            "seed {seed}: a lease settled twice"
        );
        // Nothing acked is still owed anywhere; no lease is left; counters equal the fold.
        let owed: std::collections::BTreeSet<u64> = deliveries::pulled_rows(&store)
            .unwrap()
            .iter()
            .map(|r| r.key.seq.0)
            .chain(
                deliveries::due_rows(&store)
                    .unwrap()
                    .iter()
                    .map(|r| r.key.seq.0),
            )
            .chain(
                ankusa_queue::testkit::dead_rows(&store)
                    .iter()
                    .map(|r| r.key.seq.0),
            )
            .chain(
                ankusa_queue::testkit::inflight_rows(&store)
                    .iter()
                    .map(|r| r.key.seq.0),
            )
            .collect();
        assert!(
            s.acked.keys().all(|seq| !owed.contains(seq)),
            "seed {seed}: an acked delivery is still owed"
        );
        assert_eq!(
            deliveries::leases(&store).unwrap(),
            Vec::new(),
            "seed {seed}"
        );
        assert_eq!(ankusa_queue::testkit::inflight_rows(&store), Vec::new());
        assert_eq!(fold::verify(&store).unwrap(), Vec::new(), "seed {seed}");
        assert!(gateway.leases_out().values().all(|n| *n == 0));
    }
}

/// `pull --exec` passes the provider headers the source forwards (`ANKUSA_HEADER_<NAME>`),
/// and a command that fails nacks its hook, says so, and makes the run exit 1.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_gets_the_forwarded_headers_and_a_nack_is_reported() {
    let node = builder()
        .source_yaml(
            "{ id: fwd, tenant: { header: x-tenant }, verify: { scheme: none }, route: r, forward_headers: [X-GitHub-Event] }",
        )
        .start()
        .await;
    let r = post(
        &client(),
        &format!("http://{}/ingest/fwd", node.ingest_addr),
        &[
            ("x-tenant", "acme".to_owned()),
            ("x-github-event", "push".to_owned()),
        ],
        br#"{"ok":1}"#.to_vec(),
    )
    .await;
    assert_eq!(r.status, 202);
    let out = node.dir().join("seen");
    let cmd = format!(
        "echo \"$ANKUSA_HEADER_X_GITHUB_EVENT\" >> {}; exit 3",
        out.display()
    );
    let run = consumer(
        &node,
        &[
            "--max",
            "1",
            "--wait-ms",
            "3000",
            "--limit",
            "1",
            "--exec",
            &cmd,
        ],
    )
    .output()
    .unwrap();
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    let err = String::from_utf8_lossy(&run.stderr);
    assert!(
        err.contains("pull: nacked hk_")
            && err.contains("exit status: 3")
            && err.contains("1 of 1 hooks nacked"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&out).unwrap(), "push\n");
    // Nacked, it comes back; a command that succeeds acks it and the run exits 0.
    let ok = consumer(
        &node,
        &[
            "--max",
            "1",
            "--wait-ms",
            "5000",
            "--limit",
            "1",
            "--exec",
            "cat >/dev/null",
        ],
    )
    .output()
    .unwrap();
    assert!(ok.status.success(), "{ok:?}");
    let c = ankusa_queue::counters::node(&node.store).unwrap();
    assert_eq!((c.inflight, c.pending, c.scheduled), (0, 0, 0));
    assert_fold(&node);
    node.stop().await;
}
