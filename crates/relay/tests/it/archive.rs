//! The archive (issue 17) over real HTTP: hooks of an archived source are kept whole after
//! delivery and reclaim, listed for their tenant, sent again on request, and gone after
//! their retention; `archive_pending` returns to 0 and the counters equal a fold.

use ankusa_keyspace::Family;
use ankusa_queue::{counters, fold};
use ankusa_relay::testkit::{eventually, TestNode, TestSink};
use ankusa_store::Rows;

use crate::support::*;

const ADMIN: &str = "archive-admin-token-0123";
const TOKEN_A: &str = "archive-tenant-a-token-01";
const TOKEN_B: &str = "archive-tenant-b-token-01";

/// Route `kept` archives, `plain` does not; `brief` keeps its hooks 1.5 s.
async fn start_node(sink: &TestSink) -> TestNode {
    TestNode::builder()
        .admin_token("ops", ADMIN)
        .tenant_token("team-a", TOKEN_A, &["a"])
        .tenant_token("team-b", TOKEN_B, &["b"])
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("reclaim: { interval_ms: 30 }")
        .section("archive: { retention_ms: 600000, settle_interval_ms: 50 }")
        .sink("s", &sink.url("/hooks"))
        .route_yaml("{ id: kept, sinks: [s], archive: { enabled: true } }")
        .route("plain", &["s"])
        .open_source("shared", "kept")
        .source_yaml(
            "{ id: brief, tenant: { header: x-tenant }, verify: { scheme: none }, route: kept, archive: { retention_ms: 1500 } }",
        )
        .open_source("unkept", "plain")
        .start()
        .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn archived_hooks_are_listed_replayed_and_gone_after_their_retention() {
    let sink = TestSink::start().await;
    let node = start_node(&sink).await;
    let c = client();
    let send = |source: &'static str, tenant: &'static str, i: usize| {
        let (c, url) = (
            c.clone(),
            format!("http://{}/ingest/{source}", node.ingest_addr),
        );
        async move {
            let r = post(
                &c,
                &url,
                &[("x-tenant", tenant.to_owned())],
                format!(r#"{{"n":{i}}}"#),
            )
            .await;
            assert_eq!(r.status, 202);
            r.json()["id"].as_str().unwrap().to_owned()
        }
    };
    let mut ids_a = Vec::new();
    for i in 0..5 {
        ids_a.push(send("shared", "a", i).await);
    }
    for i in 0..3 {
        send("shared", "b", i).await;
    }
    for i in 0..2 {
        send("unkept", "a", 100 + i).await;
    }
    for i in 0..2 {
        send("brief", "a", 200 + i).await;
    }
    let store = node.store.clone();
    eventually(15, "every hook delivered, archived and reclaimed", || {
        let n = counters::node(&store).unwrap();
        n.pending == 0
            && n.inflight == 0
            && n.archive_pending == 0
            && store.scan_family(Family::Hooks).unwrap().count() == 0
    })
    .await;
    assert!(fold::verify(&store).unwrap().is_empty());
    assert_eq!(sink.on("/hooks").len(), 12);
    let call = |method: &'static str, path: String, token: &'static str, body: String| {
        let c = c.clone();
        let url = format!("http://{}{path}", node.admin_addr);
        async move {
            let bearer = format!("Bearer {token}");
            let h = [
                ("authorization", bearer.as_str()),
                ("content-type", "application/json"),
            ];
            let (s, _, v) = raw(&c, method, &url, &h, &body).await;
            (s, v)
        }
    };
    // a's archive: the five shared hooks and the two brief ones, newest first, not the
    // unarchived route's.
    let (s, v) = call(
        "GET",
        "/v1/archive?tenant=a&body=true".into(),
        TOKEN_A,
        String::new(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let items = v["items"].as_array().unwrap();
    assert_eq!(items.len(), 7, "{v}");
    let received: Vec<u64> = items
        .iter()
        .map(|i| i["received_ms"].as_u64().unwrap())
        .collect();
    assert!(received.windows(2).all(|w| w[0] >= w[1]), "newest first");
    let first = items.iter().find(|i| i["id"] == ids_a[0].as_str()).unwrap();
    assert_eq!(first["body"], r#"{"n":0}"#);
    assert_eq!(first["source"], "shared");
    assert_eq!(first["sinks"], serde_json::json!(["s"]));
    // Paging.
    let (_, p1) = call(
        "GET",
        "/v1/archive?tenant=a&limit=4".into(),
        ADMIN,
        String::new(),
    )
    .await;
    let next = p1["next"].as_str().unwrap().to_owned();
    let (_, p2) = call(
        "GET",
        format!("/v1/archive?tenant=a&limit=4&before={next}"),
        ADMIN,
        String::new(),
    )
    .await;
    assert_eq!(
        p1["items"].as_array().unwrap().len() + p2["items"].as_array().unwrap().len(),
        7
    );
    assert!(p2["next"].is_null());
    // Scope: b's token cannot read a's archive; a tenant is required.
    let (s, _) = call("GET", "/v1/archive?tenant=a".into(), TOKEN_B, String::new()).await;
    assert_eq!(s, 404);
    let (s, v) = call("GET", "/v1/archive".into(), ADMIN, String::new()).await;
    assert_eq!((s, v["error"].as_str()), (400, Some("bad_request")));
    let (s, v) = call("GET", "/v1/archive?tenant=b".into(), TOKEN_B, String::new()).await;
    assert_eq!((s, v["items"].as_array().map(Vec::len)), (200, Some(3)));

    // Replay one of a's hooks from the archive: delivered again with its id and body; the
    // archive does not take a second copy.
    let before = sink.on("/hooks").len();
    let (s, v) = call(
        "POST",
        "/v1/archive/replay".into(),
        TOKEN_A,
        format!(r#"{{"tenant":"a","ids":["{}"]}}"#, ids_a[2]),
    )
    .await;
    assert_eq!((s, v["replayed"].as_u64()), (200, Some(1)), "{v}");
    eventually(10, "the replayed hook delivered", || {
        sink.on("/hooks").len() == before + 1
    })
    .await;
    let again = sink.on("/hooks").pop().unwrap();
    assert_eq!(again.headers["webhook-id"], ids_a[2].as_str());
    assert_eq!(again.body, br#"{"n":2}"#);
    eventually(10, "the replayed hook reclaimed", || {
        counters::node(&store).unwrap().archive_pending == 0
            && store.scan_family(Family::Hooks).unwrap().count() == 0
    })
    .await;
    let (_, v) = call("GET", "/v1/archive?tenant=a".into(), ADMIN, String::new()).await;
    assert_eq!(
        v["items"].as_array().unwrap().len(),
        7,
        "no second copy: {v}"
    );

    // The brief source's hooks leave after their 1.5 s; the others stay.
    eventually(10, "the brief hooks expired", || {
        store.scan_family(Family::ArchivedHooks).unwrap().count() == 8
    })
    .await;
    let (_, v) = call("GET", "/v1/archive?tenant=a".into(), ADMIN, String::new()).await;
    let sources: Vec<&str> = v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["source"].as_str().unwrap())
        .collect();
    assert_eq!(sources, ["shared"; 5]);
    let (_, m) = get_text(&c, &format!("http://{}/metrics", node.admin_addr)).await;
    assert!(
        m.contains(r#"ankusa_archive_settled_total{outcome="archived"} 10"#),
        "{m}"
    );
    assert!(m.contains("ankusa_archive_expired_total 2"), "{m}");
    // The replay is audited.
    let (_, audit) = call("GET", "/v1/audit".into(), TOKEN_A, String::new()).await;
    assert!(audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["action"] == "archive.replay"));
    assert!(fold::verify(&store).unwrap().is_empty());
    node.stop().await;
}

/// Sends `n` hooks of tenant `a` (`{"n":i}`) through the archived route and waits until
/// each is delivered and archived.
async fn archive_n(node: &TestNode, n: usize) {
    let c = client();
    for i in 0..n {
        let r = post(
            &c,
            &format!("http://{}/ingest/shared", node.ingest_addr),
            &[("x-tenant", "a".to_owned())],
            format!(r#"{{"n":{i}}}"#),
        )
        .await;
        assert_eq!(r.status, 202);
    }
    let store = node.store.clone();
    eventually(15, "every hook delivered and archived", || {
        let n = counters::node(&store).unwrap();
        n.pending == 0 && n.inflight == 0 && n.archive_pending == 0
    })
    .await;
}

/// A replay is charged to the tenant's quotas as ingest is: with a rate of 1 a second and
/// a burst of 2 it replays two hooks and stops, saying why, when to go on and where; the
/// calls with `after` go on from there, and together they replay each hook once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_is_charged_to_the_tenants_quotas_and_goes_on_where_it_stopped() {
    let sink = TestSink::start().await;
    let node = start_node(&sink).await;
    archive_n(&node, 5).await;
    let (s, v) = admin_call(
        node.admin_addr,
        "PUT",
        "/v1/tenants/a/limits",
        ADMIN,
        r#"{"ingest_per_second": 1, "ingest_burst": 2}"#,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let before = sink.on("/hooks").len();
    let (s, v) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/archive/replay",
        ADMIN,
        r#"{"tenant": "a"}"#,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["replayed"], 2, "{v}");
    assert_eq!(v["stopped"], "tenant_rate_limited", "{v}");
    assert!(v["retry_after_s"].as_u64().is_some_and(|s| s >= 1), "{v}");
    let next = v["next"].as_str().unwrap().to_owned();
    // Three seconds refill the bucket's two tokens and more: the rest goes.
    tokio::time::sleep(std::time::Duration::from_millis(3_100)).await;
    let (s, v) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/archive/replay",
        ADMIN,
        &format!(r#"{{"tenant": "a", "after": "{next}"}}"#),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["replayed"], 2, "{v}");
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let (s, v) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/archive/replay",
        ADMIN,
        &format!(
            r#"{{"tenant": "a", "after": "{}"}}"#,
            v["next"].as_str().unwrap()
        ),
    )
    .await;
    assert_eq!((s, v["replayed"].as_u64()), (200, Some(1)), "{v}");
    assert!(v.get("stopped").is_none(), "{v}");
    eventually(15, "the replays delivered", || {
        sink.on("/hooks").len() == before + 5
    })
    .await;
    // Each hook once (delivered concurrently, so in any order).
    let mut bodies: Vec<String> = sink.on("/hooks")[before..]
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    bodies.sort();
    let want: Vec<String> = (0..5).map(|i| format!(r#"{{"n":{i}}}"#)).collect();
    assert_eq!(bodies, want);
    let (s, v) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/archive/replay",
        ADMIN,
        r#"{"tenant": "a", "after": "nonsense"}"#,
    )
    .await;
    assert_eq!(s, 400, "{v}");
    node.stop().await;
}

/// A lane narrower than a page (a small `writer.queue_capacity`: a lane of 2) still
/// replays every hook: the replay awaits its own oldest hook for a place, never waits on
/// one it holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replay_through_a_narrow_lane_sends_every_hook() {
    let sink = TestSink::start().await;
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("writer: { queue_capacity: 8 }")
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("archive: { retention_ms: 600000, settle_interval_ms: 50 }")
        .sink("s", &sink.url("/hooks"))
        .route_yaml("{ id: kept, sinks: [s], archive: { enabled: true } }")
        .open_source("shared", "kept")
        .start()
        .await;
    archive_n(&node, 20).await;
    let replay = admin_call(
        node.admin_addr,
        "POST",
        "/v1/archive/replay",
        ADMIN,
        r#"{"tenant": "a"}"#,
    );
    let (s, v) = tokio::time::timeout(std::time::Duration::from_secs(20), replay)
        .await
        .expect("the replay ended");
    assert_eq!((s, v["replayed"].as_u64()), (200, Some(20)), "{v}");
    node.stop().await;
}
