//! The admin API over real HTTP: scopes, DLQ and replay, purge, quarantine, audit, config
//! redaction, metrics exposition.

use ankusa_store::Rows;
use std::time::Duration;

use ankusa_keyspace::Cf;
use ankusa_keyspace::Family;
use ankusa_queue::counters;
use ankusa_relay::testkit::{eventually, TestNode, TestSink};

use crate::support::*;

const ADMIN: &str = "admin-token-0123456789";
const TOKEN_A: &str = "tenant-a-token-0123456789";
const TOKEN_B: &str = "tenant-b-token-0123456789";
const SRC_SECRET: &str = "source-hmac-secret";
const SINK_SECRET: &str = "whsec_c2VjcmV0LXNpbmstc2VjcmV0";

/// The admin tests' node: an admin token and one per tenant a and b, a signed sink `s`,
/// source `shared` (tenant from `x-tenant`) and sources `sa` / `sb` fixed to tenants a and b
/// with an HMAC check.
async fn start_node(sink: &TestSink) -> TestNode {
    let signed = |id: &str, tenant: &str| {
        format!(
            r#"{{ id: {id}, tenant: {{ fixed: {tenant} }}, verify: {{ scheme: hmac-sha256, secret: {{ value: "{SRC_SECRET}" }}, header: x-sig }}, route: r }}"#
        )
    };
    TestNode::builder()
        .admin_key("gauge_interval_ms: 100")
        .admin_token("ops", ADMIN)
        .tenant_token("team-a", TOKEN_A, &["a"])
        .tenant_token("team-b", TOKEN_B, &["b"])
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [30], max_attempts: 3, jitter: none }")
        .sink_yaml(&format!(
            r#"{{ id: s, url: "{}", secret: {{ value: "{SINK_SECRET}" }} }}"#,
            sink.url("/hooks")
        ))
        .route("r", &["s"])
        .open_source("shared", "r")
        .source_yaml(&signed("sa", "a"))
        .source_yaml(&signed("sb", "b"))
        .start()
        .await
}

struct H {
    node: TestNode,
    sink: TestSink,
    c: Client,
}

impl H {
    /// A node whose sink answers 400: every hook dead-letters at once. Tenants a and b
    /// get 3 dead rows each; sources sa and sb get 2 quarantined requests each.
    async fn start() -> H {
        let sink = TestSink::start().await;
        sink.default_status
            .store(400, std::sync::atomic::Ordering::Relaxed);
        let node = start_node(&sink).await;
        let h = H {
            node,
            sink,
            c: client(),
        };
        for t in ["a", "b"] {
            for i in 0..3 {
                let r = post(
                    &h.c,
                    &format!("http://{}/ingest/shared", h.node.ingest_addr),
                    &[("x-tenant", t.to_owned())],
                    format!(r#"{{"t":"{t}","i":{i}}}"#),
                )
                .await;
                assert_eq!(r.status, 202);
            }
        }
        for src in ["sa", "sb"] {
            for _ in 0..2 {
                let r = post(
                    &h.c,
                    &format!("http://{}/ingest/{src}", h.node.ingest_addr),
                    &[("x-sig", "00".repeat(32))],
                    "{}",
                )
                .await;
                assert_eq!(r.status, 401);
            }
        }
        let store = h.node.store.clone();
        eventually(15, "six dead rows", || {
            counters::node(&store).unwrap().dead == 6
        })
        .await;
        eventually(5, "four quarantined requests", || {
            store.scan_family(Family::Quarantine).unwrap().count() == 4
        })
        .await;
        h
    }

    async fn call(
        &self,
        method: &str,
        path: &str,
        token: Option<&str>,
        body: &str,
    ) -> (u16, serde_json::Value) {
        let bearer = token.map(|t| format!("Bearer {t}"));
        let mut headers = vec![("content-type", "application/json")];
        if let Some(b) = &bearer {
            headers.push(("authorization", b.as_str()));
        }
        let url = format!("http://{}{path}", self.node.admin_addr);
        let (status, _, v) = raw(&self.c, method, &url, &headers, body).await;
        (status, v)
    }
}

fn tenants_of(items: &serde_json::Value) -> Vec<String> {
    items["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["tenant"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_scoped_dlq() {
    let h = H::start().await;
    // Admin: all six, newest first, paged.
    let (s, all) = h.call("GET", "/v1/dlq?limit=4", Some(ADMIN), "").await;
    assert_eq!(s, 200);
    assert_eq!(all["items"].as_array().unwrap().len(), 4);
    let next = all["next"].as_str().unwrap();
    let (_, rest) = h
        .call(
            "GET",
            &format!("/v1/dlq?limit=4&before={next}"),
            Some(ADMIN),
            "",
        )
        .await;
    assert_eq!(rest["items"].as_array().unwrap().len(), 2);
    assert!(rest["next"].is_null());
    // Each row names its sink by id and says why it died.
    let row = &all["items"][0];
    assert_eq!(row["sink"], "s");
    assert_eq!(row["sink_index"], 0);
    assert_eq!(row["attempts"], 1);
    assert_eq!(row["last_status"], 400);
    assert_eq!(row["last_error"], "HTTP 400");
    assert!(row["last_attempt_ms"].as_u64().unwrap() > 0);
    // Team a sees only a's rows, with or without naming the tenant; b does not exist for it.
    for path in ["/v1/dlq", "/v1/dlq?tenant=a"] {
        let (s, v) = h.call("GET", path, Some(TOKEN_A), "").await;
        assert_eq!(s, 200);
        assert_eq!(tenants_of(&v), vec!["a"; 3], "{path}");
    }
    let (s, v) = h.call("GET", "/v1/dlq?tenant=b", Some(TOKEN_A), "").await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")));
    let (s, _) = h.call("GET", "/v1/dlq", None, "").await;
    assert_eq!(s, 401);
    let (s, _) = h.call("GET", "/v1/dlq", Some("not-a-token"), "").await;
    assert_eq!(s, 401);
    // The scheme's name is case-insensitive (RFC 7235).
    let url = format!("http://{}/v1/dlq", h.node.admin_addr);
    let lower = format!("bearer {TOKEN_A}");
    let headers = [("authorization", lower.as_str())];
    let (s, _, v) = raw(&h.c, "GET", &url, &headers, "").await;
    assert_eq!(s, 200);
    assert_eq!(tenants_of(&v), vec!["a"; 3]);
    h.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_scoped_dlq_reads_one_range() {
    let h = H::start().await;
    let before = h.node.store.stats();
    let (s, v) = h.call("GET", "/v1/dlq?tenant=a", Some(ADMIN), "").await;
    let d = h.node.store.stats().since(&before);
    assert_eq!(s, 200);
    assert_eq!(tenants_of(&v).len(), 3);
    assert_eq!(d.scans_of(Family::DeadByTenant), 1, "one ?X range");
    assert_eq!(
        d.scans_of(Family::Dead),
        0,
        "no walk of the node-wide dead family"
    );
    assert_eq!(d.point_reads_of(Cf::Hooks), 0, "no hook read");
    h.node.stop().await;
}

/// Every endpoint, for both tenant scopes: the other tenant's rows cannot be seen or changed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_token_can_neither_see_nor_change_another_tenants_rows() {
    let h = H::start().await;
    for (token, mine, other) in [(TOKEN_A, "a", "b"), (TOKEN_B, "b", "a")] {
        let (_, admin_view) = h
            .call("GET", &format!("/v1/dlq?tenant={other}"), Some(ADMIN), "")
            .await;
        let other_id = admin_view["items"][0]["id"].as_str().unwrap().to_owned();
        let table: Vec<(&str, String, String, u16)> = vec![
            ("GET", format!("/v1/tenants/{other}"), String::new(), 404),
            ("GET", format!("/v1/tenants/{mine}"), String::new(), 200),
            ("GET", format!("/v1/dlq?tenant={other}"), String::new(), 404),
            (
                "DELETE",
                format!("/v1/tenants/{other}/queue?kinds=pending,dead"),
                String::new(),
                404,
            ),
            (
                "POST",
                "/v1/dlq/replay".into(),
                format!(r#"{{"tenant":"{other}"}}"#),
                404,
            ),
            ("GET", "/v1/config".into(), String::new(), 403),
            ("GET", "/v1/node".into(), String::new(), 403),
        ];
        for (method, path, body, want) in table {
            let (s, _) = h.call(method, &path, Some(token), &body).await;
            assert_eq!(s, want, "{token}: {method} {path}");
        }
        // Replay by the other tenant's row id revives nothing.
        let (s, v) = h
            .call(
                "POST",
                "/v1/dlq/replay",
                Some(token),
                &format!(r#"{{"ids":["{other_id}"]}}"#),
            )
            .await;
        assert_eq!((s, v["revived"].as_u64()), (200, Some(0)));
        // Top tenants lists only its own.
        let (_, top) = h.call("GET", "/v1/tenants", Some(token), "").await;
        let names: Vec<_> = top["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["tenant"].as_str().unwrap())
            .collect();
        assert_eq!(names, vec![mine]);
    }
    // Nothing changed for either tenant.
    assert_eq!(counters::node(&h.node.store).unwrap().dead, 6);
    h.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_scoped_quarantine_purge() {
    let h = H::start().await;
    let (_, qa) = h.call("GET", "/v1/quarantine", Some(TOKEN_A), "").await;
    let srcs: Vec<_> = qa["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["source"].as_str().unwrap())
        .collect();
    assert_eq!(srcs, vec!["sa", "sa"]);
    let (_, all) = h.call("GET", "/v1/quarantine", Some(ADMIN), "").await;
    assert_eq!(all["items"].as_array().unwrap().len(), 4);
    // The reason is the 401's code, the words beside it; the sources fix their tenant.
    for e in all["items"].as_array().unwrap() {
        assert_eq!(e["reason"], "bad_signature", "{e}");
        assert_eq!(e["detail"], "signature mismatch", "{e}");
        let fixed = if e["source"] == "sa" { "a" } else { "b" };
        assert_eq!(e["tenant"], fixed, "{e}");
    }
    let b_id = all["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["source"] == "sb")
        .unwrap()["id"]
        .as_u64()
        .unwrap();
    // Team a cannot delete b's entry by id, and "delete all" deletes only its own.
    let (s, _) = h
        .call(
            "DELETE",
            &format!("/v1/quarantine?id={b_id}"),
            Some(TOKEN_A),
            "",
        )
        .await;
    assert_eq!(s, 404);
    let (s, v) = h.call("DELETE", "/v1/quarantine", Some(TOKEN_A), "").await;
    assert_eq!((s, v["deleted"].as_u64()), (200, Some(2)));
    let (_, left) = h.call("GET", "/v1/quarantine", Some(ADMIN), "").await;
    let srcs: Vec<_> = left["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["source"].as_str().unwrap())
        .collect();
    assert_eq!(srcs, vec!["sb", "sb"]);
    // The deletion is audited, and team b does not see team a's audit rows.
    let (_, audit) = h.call("GET", "/v1/audit", Some(ADMIN), "").await;
    assert!(audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["who"] == "team-a" && r["action"] == "quarantine.delete"));
    h.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenant_scoped_replay() {
    let h = H::start().await;
    // The sink recovers; team a replays its tenant: its three hooks are delivered, b's stay dead.
    h.sink
        .default_status
        .store(200, std::sync::atomic::Ordering::Relaxed);
    let received_before = h.sink.on("/hooks").len();
    // By ids, `limit` holds: two of b's rows named, one matched.
    let (_, dlq) = h.call("GET", "/v1/dlq?tenant=b", Some(TOKEN_B), "").await;
    let ids: Vec<&str> = dlq["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["id"].as_str())
        .take(2)
        .collect();
    assert_eq!(ids.len(), 2, "{dlq}");
    let body = serde_json::json!({ "ids": ids, "limit": 1, "dry_run": true }).to_string();
    let (s, v) = h.call("POST", "/v1/dlq/replay", Some(TOKEN_B), &body).await;
    assert_eq!((s, v["matched"].as_u64()), (200, Some(1)), "{v}");
    let (s, v) = h
        .call("POST", "/v1/dlq/replay", Some(TOKEN_A), r#"{"tenant":"a"}"#)
        .await;
    assert_eq!((s, v["revived"].as_u64()), (200, Some(3)));
    let store = h.node.store.clone();
    eventually(15, "a's replayed hooks delivered", || {
        let c = counters::node(&store).unwrap();
        c.pending == 0 && c.inflight == 0 && c.dead == 3
    })
    .await;
    let delivered: Vec<_> = h.sink.on("/hooks")[received_before..]
        .iter()
        .map(|r| String::from_utf8_lossy(&r.body).into_owned())
        .collect();
    assert_eq!(delivered.len(), 3);
    assert!(delivered.iter().all(|b| b.contains(r#""t":"a""#)));
    let (_, a) = h.call("GET", "/v1/tenants/a", Some(TOKEN_A), "").await;
    assert_eq!(a["counters"]["dead"], 0);
    let (_, b) = h.call("GET", "/v1/tenants/b", Some(TOKEN_B), "").await;
    assert_eq!(b["counters"]["dead"], 3);
    // The replay is in the audit trail team a can read.
    let (_, audit) = h.call("GET", "/v1/audit", Some(TOKEN_A), "").await;
    assert!(audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["action"] == "dlq.replay" && r["tenant"] == "a"));
    let (_, audit_b) = h.call("GET", "/v1/audit", Some(TOKEN_B), "").await;
    assert!(audit_b["items"].as_array().unwrap().is_empty());
    h.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_one_tenants_rows_and_a_second_purge_is_a_no_op() {
    let h = H::start().await;
    let (s, v) = h
        .call(
            "DELETE",
            "/v1/tenants/a/queue?kinds=pending,dead",
            Some(ADMIN),
            "",
        )
        .await;
    assert_eq!((s, v["dead"].as_u64()), (200, Some(3)));
    let (_, a) = h.call("GET", "/v1/tenants/a", Some(ADMIN), "").await;
    assert_eq!(a["counters"]["dead"], 0);
    let (_, b) = h.call("GET", "/v1/tenants/b", Some(ADMIN), "").await;
    assert_eq!(b["counters"]["dead"], 3);
    // The hook log says who removed them: `purged`, not delivered.
    let (_, recent) = h
        .call("GET", "/v1/hooks?tenant=a&limit=10", Some(ADMIN), "")
        .await;
    let ids: Vec<&str> = recent["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 3, "{recent}");
    for id in ids {
        let (_, hook) = h
            .call("GET", &format!("/v1/hooks/{id}"), Some(ADMIN), "")
            .await;
        let sink = &hook["sinks"][0];
        assert_eq!(sink["state"], "purged", "{hook}");
        let last = sink["events"].as_array().unwrap().last().unwrap();
        assert_eq!(last["kind"], "purged", "{hook}");
    }
    let (s, v) = h
        .call(
            "DELETE",
            "/v1/tenants/a/queue?kinds=pending,dead",
            Some(ADMIN),
            "",
        )
        .await;
    assert_eq!(
        (s, v["dead"].as_u64(), v["due"].as_u64()),
        (200, Some(0), Some(0))
    );
    let (s, _) = h
        .call("DELETE", "/v1/tenants/a/queue?kinds=bogus", Some(ADMIN), "")
        .await;
    assert_eq!(s, 400);
    assert!(ankusa_queue::fold::verify(&h.node.store)
        .unwrap()
        .is_empty());
    h.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_shows_no_secret_and_node_status_is_served() {
    let h = H::start().await;
    let (s, cfg) = h.call("GET", "/v1/config", Some(ADMIN), "").await;
    assert_eq!(s, 200);
    let text = cfg.to_string();
    for secret in [ADMIN, TOKEN_A, TOKEN_B, SRC_SECRET, SINK_SECRET] {
        assert!(!text.contains(secret), "/v1/config leaks a secret");
    }
    assert!(text.contains("<redacted>"));
    assert_eq!(cfg["tenants"]["max"], 1_000_000);
    let (s, node) = h.call("GET", "/v1/node", Some(ADMIN), "").await;
    assert_eq!(s, 200);
    assert_eq!(node["store_format"], 3);
    assert_eq!(node["counters"]["dead"], 6);
    h.node.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_are_valid_prometheus_text() {
    let h = H::start().await;
    // Let the gauge task publish once (it runs at start, then every interval).
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (status, text) = get_text(&h.c, &format!("http://{}/metrics", h.node.admin_addr)).await;
    assert_eq!(status, 200);
    for name in [
        "ankusa_ingest_requests_total",
        "ankusa_queue_state",
        "ankusa_queue_oldest_due_age_seconds",
        "ankusa_tenants",
        "ankusa_delivery_attempts_total",
        "ankusa_writer_batch_hooks",
        "ankusa_writer_unsynced_hooks",
        "ankusa_reclaim_backlog",
        "ankusa_reclaimed_hooks_total",
        "ankusa_shutdown_requeued_total",
    ] {
        assert!(text.contains(name), "no {name} in the scrape");
    }
    assert!(
        text.contains(r#"ankusa_queue_state{field="dead"} 6"#),
        "{text}"
    );
    let promtool = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian's prometheus package; make test installs it)");
    use std::io::Write;
    let mut child = promtool;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics: {}{}",
        text_of(&out.stdout),
        text_of(&out.stderr)
    );
    h.node.stop().await;
}

/// A dead row whose value no longer decodes: the DLQ page is an error (500), never a page
/// without the row, and the node counts the corruption by family on `/metrics`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_row_is_an_error_and_is_counted_by_family() {
    let h = H::start().await;
    let store = h.node.store.clone();
    let (key, _) = store
        .scan_family(Family::Dead)
        .unwrap()
        .next()
        .expect("a dead row")
        .unwrap();
    store
        .write(
            vec![ankusa_store::Op::put(Cf::Index, key, vec![0xff])],
            true,
        )
        .unwrap();
    let (status, v) = h.call("GET", "/v1/dlq", Some(ADMIN), "").await;
    assert_eq!(status, 500, "{v}");
    // The probe task publishes the counts every second.
    let url = format!("http://{}/metrics", h.node.admin_addr);
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let (_, text) = get_text(&h.c, &url).await;
        let counted = text.lines().any(|l| {
            l.starts_with(r#"ankusa_store_corruption_errors_total{family="dead"} "#)
                && !l.ends_with(" 0")
        });
        if counted {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the corruption was not counted: {text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    h.node.stop().await;
}

fn text_of(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// What an operator did to a node (issue "exact counts under any concurrency"): many dead
/// hooks for five tenants; the sink recovers and, while the pipeline delivers, four
/// replays of the whole DLQ and three purges (two of the same tenant) run at once over
/// HTTP. Each dead row leaves the DLQ once between them, no hook reaches the sink twice
/// after its replay, and the counters equal a fold of the families at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_replays_and_purges_during_dispatch_move_each_row_once() {
    let sink = TestSink::start().await;
    sink.default_status
        .store(400, std::sync::atomic::Ordering::Relaxed);
    let node = start_node(&sink).await;
    let c = client();
    let tenants = ["t0", "t1", "t2", "t3", "t4"];
    let hooks = 600;
    for i in 0..hooks {
        let r = post(
            &c,
            &format!("http://{}/ingest/shared", node.ingest_addr),
            &[("x-tenant", tenants[i % 5].to_owned())],
            format!(r#"{{"i":{i}}}"#),
        )
        .await;
        assert_eq!(r.status, 202);
    }
    let store = node.store.clone();
    eventually(30, "every hook dead-lettered", || {
        counters::node(&store).unwrap().dead == hooks as i64
    })
    .await;
    let before_recovery = sink.on("/hooks").len();
    sink.default_status
        .store(200, std::sync::atomic::Ordering::Relaxed);
    let h = H { node, sink, c };
    // One replay per tenant at a time (and one of the whole DLQ): the whole DLQ and three
    // tenants' at once, over the same rows.
    let replay = |body: &'static str| h.call("POST", "/v1/dlq/replay", Some(ADMIN), body);
    let hr = &h;
    let purge = |t: &'static str| {
        let path = format!("/v1/tenants/{t}/queue?kinds=pending,dead");
        async move { hr.call("DELETE", &path, Some(ADMIN), "").await }
    };
    let (r1, r2, r3, r4, p1, p2, p3) = tokio::join!(
        replay(r#"{"from_ms":0}"#),
        replay(r#"{"tenant":"t0"}"#),
        replay(r#"{"tenant":"t1"}"#),
        replay(r#"{"tenant":"t3"}"#),
        purge("t0"),
        purge("t0"),
        purge("t3")
    );
    let mut revived = 0;
    for (s, v) in [r1, r2, r3, r4] {
        assert_eq!(s, 200, "{v}");
        revived += v["revived"].as_u64().unwrap();
    }
    let (mut purged_dead, mut purged_due) = (0, 0);
    for (s, v) in [p1, p2, p3] {
        assert_eq!(s, 200, "{v}");
        purged_dead += v["dead"].as_u64().unwrap();
        purged_due += v["due"].as_u64().unwrap();
    }
    assert_eq!(
        revived + purged_dead,
        hooks as u64,
        "revived {revived} + purged dead {purged_dead}"
    );
    // Everything revived is delivered or purged (as due) once; nothing is left.
    let store = h.node.store.clone();
    eventually(30, "the revived hooks delivered", || {
        let c = counters::node(&store).unwrap();
        c.pending == 0 && c.scheduled == 0 && c.inflight == 0 && c.dead == 0
    })
    .await;
    let after: Vec<String> = h.sink.on("/hooks")[before_recovery..]
        .iter()
        .map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned())
        .collect();
    let distinct: std::collections::BTreeSet<&String> = after.iter().collect();
    assert_eq!(
        distinct.len(),
        after.len(),
        "a hook reached the sink twice after the replay"
    );
    assert_eq!(
        after.len() as u64 + purged_due,
        revived,
        "delivered + purged as due = revived"
    );
    let c = counters::node(&store).unwrap();
    assert!(c.bytes >= 0 && c.archive_pending >= 0, "{c:?}");
    assert!(ankusa_queue::fold::verify(&store).unwrap().is_empty());
    h.node.stop().await;
}

/// Every error from both listeners is the JSON shape with a stable code — the framework's
/// own rejections, unknown paths and wrong methods too — and on `/v1/*` the token is
/// checked before anything else, so a caller without one learns nothing of the API's shape.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_error_is_json_and_the_token_comes_first() {
    let h = H::start().await;
    let admin = |p: &str| format!("http://{}{p}", h.node.admin_addr);
    let ingest = |p: &str| format!("http://{}{p}", h.node.ingest_addr);
    let bearer = format!("Bearer {ADMIN}");
    let auth = [("authorization", bearer.as_str())];
    // No token: 401 for a path that exists, one that does not, a bad query, a wrong method.
    for (method, path) in [
        ("GET", "/v1/dlq"),
        ("GET", "/v1/no-such-thing"),
        ("GET", "/v1/dlq?limit=many"),
        ("DELETE", "/v1/dlq"),
        ("POST", "/v1/dlq/replay"),
    ] {
        let (s, _, v) = raw(&h.c, method, &admin(path), &[], "").await;
        assert_eq!(
            (s, v["error"].as_str()),
            (401, Some("unauthorized")),
            "{method} {path}"
        );
    }
    // With a token, each error in the shape, with the framework's reason as the message.
    // Method, path, headers besides the token, body, status, code.
    type Case<'a> = (
        &'a str,
        &'a str,
        &'a [(&'a str, &'a str)],
        &'a str,
        u16,
        &'a str,
    );
    let cases: [Case<'_>; 5] = [
        ("GET", "/v1/no-such-thing", &[], "", 404, "not_found"),
        ("GET", "/v1/dlq?limit=many", &[], "", 400, "bad_request"),
        ("DELETE", "/v1/dlq", &[], "", 405, "method_not_allowed"),
        (
            "POST",
            "/v1/dlq/replay",
            &[],
            r#"{"ids":[]}"#,
            415,
            "unsupported_media_type",
        ),
        (
            "POST",
            "/v1/dlq/replay",
            &[("content-type", "application/json")],
            r#"{"idz":[]}"#,
            422,
            "bad_request",
        ),
    ];
    for (method, path, extra, body, status, code) in cases {
        let headers: Vec<(&str, &str)> = auth.iter().chain(extra.iter()).copied().collect();
        let (s, hs, v) = raw(&h.c, method, &admin(path), &headers, body).await;
        assert_eq!(
            (s, v["error"].as_str()),
            (status, Some(code)),
            "{method} {path}: {v}"
        );
        assert!(
            !v["message"].as_str().unwrap().is_empty(),
            "{method} {path}"
        );
        if status == 405 {
            assert!(hs.contains_key("allow"), "a 405 keeps its Allow header");
        }
    }
    // Outside /v1 and on the ingest listener: the same shape.
    let (s, _, v) = raw(&h.c, "GET", &admin("/nope"), &[], "").await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")));
    let (s, _, v) = raw(&h.c, "GET", &ingest("/nope"), &[], "").await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")));
    let (s, _, v) = raw(&h.c, "GET", &ingest("/ingest/shared"), &[], "").await;
    assert_eq!((s, v["error"].as_str()), (405, Some("method_not_allowed")));
    // Answers that are not errors pass untouched.
    let (s, hs, _) = raw(&h.c, "GET", &admin("/metrics"), &[], "").await;
    assert_eq!(s, 200);
    assert!(hs["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain"));
    h.node.stop().await;
}

/// The shipped alert rules are valid Prometheus rules, and `promtool test rules` runs a
/// unit test of every one of them (it fires on the series it is about, not on healthy
/// ones).
#[test]
fn the_alert_rules_pass_promtool_and_each_has_a_unit_test() {
    let files = repo().join("charts/ankusa/files");
    for args in [
        ["check", "rules", "alerts.yaml"],
        ["test", "rules", "alerts.test.yaml"],
    ] {
        let out = std::process::Command::new("promtool")
            .args(args)
            .current_dir(&files)
            .output()
            .expect("promtool (Debian's prometheus package; make test installs it)");
        assert!(
            out.status.success(),
            "promtool {}: {}{}",
            args.join(" "),
            text_of(&out.stdout),
            text_of(&out.stderr)
        );
    }
    let yaml = |f: &str| -> serde_yaml::Value {
        serde_yaml::from_str(&std::fs::read_to_string(files.join(f)).unwrap()).unwrap()
    };
    let alerts: std::collections::BTreeSet<String> = yaml("alerts.yaml")["groups"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_sequence().unwrap().iter())
        .map(|r| r["alert"].as_str().unwrap().to_owned())
        .collect();
    let tested: std::collections::BTreeSet<String> = yaml("alerts.test.yaml")["tests"]
        .as_sequence()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_sequence().unwrap().iter())
        .filter(|t| t["exp_alerts"].as_sequence().is_some_and(|a| !a.is_empty()))
        .map(|t| t["alertname"].as_str().unwrap().to_owned())
        .collect();
    assert!(alerts.len() >= 9, "{alerts:?}");
    assert_eq!(alerts, tested, "every alert has a test in which it fires");
}

/// Every series the alerts and the dashboard query is one the node exports: a renamed or
/// removed metric fails here, not silently on a dashboard.
#[test]
fn the_alerts_and_the_dashboard_query_only_metrics_the_node_exports() {
    let exposition = ankusa_relay::metrics::Metrics::new().encode_prometheus();
    let mut exported = std::collections::BTreeSet::new();
    for line in exposition.lines() {
        let mut it = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (it.next(), it.next(), it.next(), it.next())
        {
            match kind {
                "counter" => {
                    exported.insert(format!("{}_total", name.trim_end_matches("_total")));
                }
                "histogram" => {
                    for s in ["_bucket", "_sum", "_count"] {
                        exported.insert(format!("{name}{s}"));
                    }
                }
                _ => {
                    exported.insert(name.to_owned());
                }
            }
        }
    }
    assert!(
        exported.contains("ankusa_ingest_requests_total"),
        "{exported:?}"
    );
    let re = |text: &str| -> std::collections::BTreeSet<String> {
        let mut out = std::collections::BTreeSet::new();
        let b = text.as_bytes();
        let mut i = 0;
        while let Some(at) = text[i..].find("ankusa_") {
            let start = i + at;
            let mut end = start;
            while end < b.len() && (b[end].is_ascii_lowercase() || b[end] == b'_') {
                end += 1;
            }
            out.insert(text[start..end].to_owned());
            i = end;
        }
        out
    };
    let alerts = std::fs::read_to_string(repo().join("charts/ankusa/files/alerts.yaml")).unwrap();
    let dashboard: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(repo().join("charts/ankusa/dashboards/ankusa-relay.json"))
            .unwrap(),
    )
    .unwrap();
    let mut exprs = String::new();
    for p in dashboard["panels"].as_array().unwrap() {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push_str(t["expr"].as_str().unwrap());
            exprs.push('\n');
        }
    }
    for v in dashboard["templating"]["list"].as_array().unwrap() {
        if let Some(q) = v["query"]["query"].as_str() {
            exprs.push_str(q);
        }
    }
    let queried: Vec<String> = re(&alerts).into_iter().chain(re(&exprs)).collect();
    assert!(queried.len() > 20, "{queried:?}");
    // The operator's own series (`ankusa_operator_*`) are checked against the operator's
    // registry by its chart tests.
    let unknown: Vec<&String> = queried
        .iter()
        .filter(|m| !m.starts_with("ankusa_operator_") && !exported.contains(*m))
        .collect();
    assert!(unknown.is_empty(), "queried but not exported: {unknown:?}");
}

/// `ankusa-relay admin …` against three live nodes: one merged DLQ, one tenant view, a
/// replay and a purge across the nodes, ids that name their node.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_cli_merges_three_nodes() {
    let hs = [H::start().await, H::start().await, H::start().await];
    let urls: Vec<String> = hs
        .iter()
        .map(|h| format!("http://{}", h.node.admin_addr))
        .collect();
    let urls = urls.join(",");
    let cli = |args: &[&str], token: &str| {
        let mut a = vec!["admin", "--url", urls.as_str(), "--token", token];
        a.extend_from_slice(args);
        let a: Vec<String> = a.iter().map(|s| s.to_string()).collect();
        async move {
            tokio::task::spawn_blocking(move || bin().args(&a).output().unwrap())
                .await
                .unwrap()
        }
    };
    let json = |out: &std::process::Output| -> serde_json::Value {
        assert!(out.status.success(), "{}", text_of(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap()
    };
    // Every node's six dead rows in one listing, newest first, ids naming their node.
    let list = json(&cli(&["dlq", "list", "--limit", "100", "--json"], ADMIN).await);
    assert!(
        list["next"].is_null(),
        "one page holds them all: {}",
        list["next"]
    );
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 18);
    for n in 0..3 {
        let of_node = items
            .iter()
            .filter(|i| i["id"].as_str().unwrap().starts_with(&format!("{n}/")))
            .count();
        assert_eq!(of_node, 6, "node {n}");
    }
    let at: Vec<u64> = items.iter().map(|i| i["at_ms"].as_u64().unwrap()).collect();
    assert!(at.windows(2).all(|w| w[0] >= w[1]), "newest first");
    // The table says the same.
    let table = cli(&["dlq", "list", "--limit", "100"], ADMIN).await;
    let text = text_of(&table.stdout);
    assert!(text.starts_with("ID"), "{text}");
    assert_eq!(text.lines().count(), 19, "{text}");
    // Paged, 5 rows at a time through the merged cursor: every row once, newest first,
    // and no `next` after the last page; the table prints how to go on.
    let mut paged: Vec<String> = Vec::new();
    let mut before: Option<String> = None;
    for _ in 0..10 {
        let mut args = vec!["dlq", "list", "--limit", "5", "--json"];
        if let Some(b) = &before {
            args.extend(["--before", b.as_str()]);
        }
        let page = json(&cli(&args, ADMIN).await);
        paged.extend(
            page["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|i| i["id"].as_str().unwrap().to_owned()),
        );
        match page["next"].as_str() {
            Some(n) => before = Some(n.to_owned()),
            None => break,
        }
    }
    let all_ids: Vec<String> = items
        .iter()
        .map(|i| i["id"].as_str().unwrap().to_owned())
        .collect();
    let mut sorted_paged = paged.clone();
    sorted_paged.sort();
    let mut sorted_all = all_ids.clone();
    sorted_all.sort();
    assert_eq!(sorted_paged, sorted_all, "every row once: {paged:?}");
    let table = text_of(&cli(&["dlq", "list", "--limit", "5"], ADMIN).await.stdout);
    assert!(table.contains("next page: --before "), "{table}");
    // Times as people type them: nothing is newer than now, all of it is from the last hour.
    let none = json(&cli(&["dlq", "list", "--from", "now", "--json"], ADMIN).await);
    assert_eq!(none["items"].as_array().unwrap().len(), 0, "{none}");
    let hour = json(
        &cli(
            &["dlq", "list", "--from", "-1h", "--limit", "100", "--json"],
            ADMIN,
        )
        .await,
    );
    assert_eq!(hour["items"].as_array().unwrap().len(), 18, "{hour}");
    let dry = json(
        &cli(
            &["dlq", "replay", "--tenant", "a", "--dry-run", "--json"],
            ADMIN,
        )
        .await,
    );
    assert_eq!(
        (dry["revived"].as_i64(), dry["matched"].as_i64()),
        (Some(0), Some(9)),
        "{dry}"
    );
    // A tenant's counters summed over the nodes that hold it; `tenants` lists the tenants
    // with only dead rows too, and keeps the count of tenants.
    let a = json(&cli(&["tenant", "a", "--json"], ADMIN).await);
    assert_eq!(a["counters"]["dead"], 9, "{a}");
    assert_eq!(a["nodes"], serde_json::json!([0, 1, 2]));
    let tenants = json(&cli(&["tenants", "--json"], ADMIN).await);
    let dead: Vec<i64> = tenants["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            t["counters"]["dead"]
                .as_i64()
                .unwrap_or_else(|| panic!("{tenants}"))
        })
        .collect();
    assert_eq!(dead.iter().sum::<i64>(), 18, "{tenants}");
    assert!(
        tenants["total"].as_u64().is_some_and(|n| n >= 6),
        "{tenants}"
    );
    // The tables show times as times, and a URL may leave out its scheme.
    let bare = hs[0].node.admin_addr.to_string();
    let out = bin()
        .args(["admin", "--url", &bare, "--token", ADMIN, "dlq", "list"])
        .output()
        .unwrap();
    let text = text_of(&out.stdout);
    assert!(out.status.success(), "{}", text_of(&out.stderr));
    assert!(text.lines().next().unwrap().contains(" AT "), "{text}");
    assert!(text.contains("Z (") && text.contains(" ago)"), "{text}");
    let node = json(&cli(&["node", "--json"], ADMIN).await);
    assert_eq!(node["counters"]["dead"], 18);
    assert_eq!(node["nodes"].as_array().unwrap().len(), 3);
    // A hook from the third node's log: the CLI asks each node until one has it.
    let of_third = items
        .iter()
        .find(|i| i["id"].as_str().unwrap().starts_with("2/"))
        .unwrap();
    let hook_id = of_third["hook_id"].as_str().unwrap();
    let hook = json(&cli(&["hooks", "get", hook_id, "--body", "--json"], ADMIN).await);
    assert_eq!(hook["id"], hook_id);
    assert_eq!(hook["sinks"][0]["state"], "dead");
    assert!(
        hook["body"].as_str().unwrap().starts_with(r#"{"t":"#),
        "{hook}"
    );
    let text = text_of(&cli(&["hooks", "get", hook_id], ADMIN).await.stdout);
    assert!(text.contains("dead") && text.contains("HTTP 400"), "{text}");
    let missing = cli(&["hooks", "get", "hk_nowhere"], ADMIN).await;
    assert!(!missing.status.success());
    assert!(
        text_of(&missing.stderr).contains("no node's hook log has hook"),
        "{}",
        text_of(&missing.stderr)
    );
    // A replay by id goes to the node each id names; by tenant, to every node.
    let picked = [
        items[0]["id"].as_str().unwrap(),
        items[17]["id"].as_str().unwrap(),
    ];
    let r = json(
        &cli(
            &[
                "dlq", "replay", "--id", picked[0], "--id", picked[1], "--json",
            ],
            ADMIN,
        )
        .await,
    );
    assert_eq!(r["revived"], 2);
    let r = json(&cli(&["dlq", "replay", "--tenant", "b", "--json"], ADMIN).await);
    // Tenant b's nine, less any of the two just revived by id (still on their way).
    assert!(r["revived"].as_i64().unwrap() >= 7, "{r}");
    // A purge of tenant a on every node: looked at first, then confirmed.
    let dry = json(&cli(&["purge", "a", "--dry-run", "--json"], ADMIN).await);
    assert!(
        dry["dead"].as_i64().unwrap() + dry["due"].as_i64().unwrap() >= 7,
        "{dry}"
    );
    let unconfirmed = cli(&["purge", "a"], ADMIN).await;
    assert!(!unconfirmed.status.success());
    assert!(
        text_of(&unconfirmed.stderr).contains("--confirm"),
        "{}",
        text_of(&unconfirmed.stderr)
    );
    let wrong = cli(&["purge", "a", "--confirm", "b"], ADMIN).await;
    assert!(text_of(&wrong.stderr).contains("a purge cannot be undone"));
    let p = json(
        &cli(
            &[
                "purge",
                "a",
                "--kinds",
                "pending,dead",
                "--confirm",
                "a",
                "--json",
            ],
            ADMIN,
        )
        .await,
    );
    assert_eq!(p["tenant"], "a");
    assert!(
        p["dead"].as_i64().unwrap() + p["due"].as_i64().unwrap() >= 7,
        "{p}"
    );
    // A tenant token sees its own tenant only; a wrong token is refused, naming the node.
    let t = json(&cli(&["tenant", "b", "--json"], TOKEN_B).await);
    assert_eq!(t["nodes"], serde_json::json!([0, 1, 2]));
    let bad = cli(&["node"], "not-a-token").await;
    assert!(!bad.status.success());
    let err = text_of(&bad.stderr);
    assert!(
        err.contains("401 unauthorized") && err.contains(&hs[0].node.admin_addr.to_string()),
        "{err}"
    );
    for h in hs {
        h.node.stop().await;
    }
}

/// The hook log (issue 17): a hook that fails twice and then succeeds shows its three
/// attempts; a dead hook shows its body and why, and a replay then a delivery after it;
/// a tenant token sees only its tenants' hooks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hooks_attempts_and_state_are_in_the_hook_log() {
    let h = H::start().await;
    h.sink
        .default_status
        .store(200, std::sync::atomic::Ordering::Relaxed);
    h.sink.script("/hooks", &[(500, None), (503, None)]);
    let r = post(
        &h.c,
        &format!("http://{}/ingest/shared", h.node.ingest_addr),
        &[("x-tenant", "a".to_owned())],
        r#"{"late":true}"#,
    )
    .await;
    assert_eq!(r.status, 202);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let path = format!("/v1/hooks/{id}");
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let hook = loop {
        let (s, v) = h.call("GET", &path, Some(ADMIN), "").await;
        assert_eq!(s, 200, "{v}");
        if v["sinks"][0]["state"] == "delivered" {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "not delivered: {v:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(hook["id"], id.as_str());
    assert_eq!(hook["tenant"], "a");
    assert_eq!(hook["source"], "shared");
    assert_eq!(hook["size"], 13);
    let sink = &hook["sinks"][0];
    assert_eq!(sink["sink"], "s");
    assert_eq!(sink["attempts"], 3);
    let events = sink["events"].as_array().unwrap();
    let col = |k: &str| events.iter().map(|e| e[k].clone()).collect::<Vec<_>>();
    assert_eq!(col("kind"), ["attempt", "attempt", "attempt"]);
    assert_eq!(col("attempt"), [1, 2, 3]);
    assert_eq!(col("status"), [500, 503, 200]);
    assert_eq!(col("outcome"), ["retry", "retry", "delivered"]);
    assert_eq!(
        col("error_class"),
        [
            serde_json::json!("status"),
            serde_json::json!("status"),
            serde_json::Value::Null
        ]
    );
    assert!(events[0]["next_at_ms"].as_u64().unwrap() >= events[0]["at_ms"].as_u64().unwrap());
    assert!(events[2]["latency_ms"].as_f64().is_some());
    // Tenant scope: a's token reads a's hook; b's token is told there is no such hook.
    let (s, _) = h.call("GET", &path, Some(TOKEN_A), "").await;
    assert_eq!(s, 200);
    let (s, v) = h.call("GET", &path, Some(TOKEN_B), "").await;
    assert_eq!((s, v["error"].as_str()), (404, Some("not_found")));
    let (s, _) = h
        .call("GET", "/v1/hooks/hk_no_such_hook", Some(ADMIN), "")
        .await;
    assert_eq!(s, 404);

    // One of b's dead hooks: its body (still stored), its state and why.
    let (_, dlq) = h.call("GET", "/v1/dlq?tenant=b", Some(TOKEN_B), "").await;
    let dead_id = dlq["items"][0]["hook_id"].as_str().unwrap().to_owned();
    let dead_path = format!("/v1/hooks/{dead_id}");
    let (s, v) = h
        .call("GET", &format!("{dead_path}?body=true"), Some(TOKEN_B), "")
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["sinks"][0]["state"], "dead");
    assert_eq!(v["sinks"][0]["events"][0]["status"], 400);
    assert_eq!(v["sinks"][0]["events"][0]["outcome"], "dead");
    assert_eq!(v["stored"], true);
    assert!(v["body"].as_str().unwrap().starts_with(r#"{"t":"b","i":"#));
    let (s, v) = h
        .call("GET", &format!("{dead_path}?bodyy=1"), Some(ADMIN), "")
        .await;
    assert_eq!((s, v["error"].as_str()), (400, Some("bad_request")), "{v}");
    // Replayed, then delivered: the log shows both after the dead attempt.
    let (s, _) = h
        .call("POST", "/v1/dlq/replay", Some(TOKEN_B), r#"{"tenant":"b"}"#)
        .await;
    assert_eq!(s, 200);
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    let v = loop {
        let (_, v) = h.call("GET", &dead_path, Some(ADMIN), "").await;
        if v["sinks"][0]["state"] == "delivered" {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "not delivered: {v:#}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let kinds: Vec<_> = v["sinks"][0]["events"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["kind"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(kinds, ["attempt", "replayed", "attempt"]);
    h.node.stop().await;
}

/// `GET /v1/sources/{id}`: a source's configuration and the
/// rows its hooks still owe; a tenant token sees only the sources fixed to its tenants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sources_backlog_counts_the_rows_its_hooks_still_owe() {
    let h = H::start().await;
    h.sink
        .default_status
        .store(200, std::sync::atomic::Ordering::Relaxed);
    h.sink
        .delay_ms
        .store(3_000, std::sync::atomic::Ordering::Relaxed);
    for i in 0..3 {
        let r = post(
            &h.c,
            &format!("http://{}/ingest/shared", h.node.ingest_addr),
            &[("x-tenant", "a".to_owned())],
            format!(r#"{{"slow":{i}}}"#),
        )
        .await;
        assert_eq!(r.status, 202);
    }
    let store = h.node.store.clone();
    eventually(10, "three deliveries in flight", || {
        counters::node(&store).unwrap().inflight == 3
    })
    .await;
    let (s, v) = h.call("GET", "/v1/sources/shared", Some(ADMIN), "").await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["verify"], "none");
    assert_eq!(v["sinks"], serde_json::json!(["s"]));
    assert_eq!(v["tenant"], serde_json::Value::Null);
    let b = &v["backlog"];
    assert_eq!(
        (b["inflight"].as_i64(), b["pending"].as_i64()),
        (Some(3), Some(0)),
        "{v}"
    );
    assert_eq!(b["exact"], true);
    let (_, v) = h
        .call("GET", "/v1/sources/shared?limit=1", Some(ADMIN), "")
        .await;
    assert_eq!(
        (
            v["backlog"]["rows_read"].as_u64(),
            v["backlog"]["exact"].as_bool()
        ),
        (Some(1), Some(false))
    );
    // A fixed-tenant source: its tenant's token sees it, another's does not.
    let (s, v) = h.call("GET", "/v1/sources/sa", Some(TOKEN_A), "").await;
    assert_eq!((s, v["tenant"].as_str()), (200, Some("a")), "{v}");
    assert_eq!(v["backlog"]["inflight"], 0, "sa's hooks were refused: {v}");
    for (path, token) in [
        ("/v1/sources/sa", TOKEN_B),
        ("/v1/sources/shared", TOKEN_A),
        ("/v1/sources/nope", ADMIN),
    ] {
        let (s, v) = h.call("GET", path, Some(token), "").await;
        assert_eq!((s, v["error"].as_str()), (404, Some("not_found")), "{path}");
    }
    h.sink
        .delay_ms
        .store(0, std::sync::atomic::Ordering::Relaxed);
    h.node.stop().await;
}

/// `GET /v1/tenants` lists a tenant whose only row waits out a retry's backoff, and one
/// whose only rows are dead, not only tenants with rows due now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_lists_scheduled_and_dead_work_not_only_pending() {
    let sink = TestSink::start().await;
    sink.default_status
        .store(503, std::sync::atomic::Ordering::Relaxed);
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [600000], max_attempts: 2, jitter: none }")
        .sink("s", &sink.url("/hooks"))
        .route("r", &["s"])
        .open_source("shared", "r")
        .start()
        .await;
    let c = client();
    for t in ["later", "gone"] {
        let url = node.ingest_url("shared");
        let r = post(&c, &url, &[("x-tenant", t.to_owned())], b"{}".to_vec()).await;
        assert_eq!(r.status, 202);
        // Each tenant's first attempt fails before the next tenant sends.
        eventually(10, "the first attempt's outcome", || {
            let n = counters::node(&node.store).unwrap();
            n.inflight == 0
                && if t == "later" {
                    n.scheduled == 1
                } else {
                    n.dead == 1
                }
        })
        .await;
        if t == "later" {
            sink.default_status
                .store(400, std::sync::atomic::Ordering::Relaxed);
        }
    }
    let url = format!("http://{}/v1/tenants", node.admin_addr);
    let auth = format!("Bearer {ADMIN}");
    let (status, _, v) = raw(&c, "GET", &url, &[("authorization", auth.as_str())], "").await;
    assert_eq!(status, 200);
    let rows: Vec<(String, i64, i64)> = v["tenants"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            (
                t["tenant"].as_str().unwrap().to_owned(),
                t["counters"]["scheduled"].as_i64().unwrap(),
                t["counters"]["dead"].as_i64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        rows,
        vec![("later".to_owned(), 1, 0), ("gone".to_owned(), 0, 1)],
        "{v}"
    );
    assert_eq!(v["total"], 2);
    node.stop().await;
}

/// `POST /v1/tenants/{t}/retry` makes rows waiting out a 10-minute backoff due now: one
/// hook's, one sink's, then all; within the caller's scope, audited, and from the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retry_now_sends_waiting_rows_at_once() {
    let sink = TestSink::start().await;
    sink.default_status
        .store(503, std::sync::atomic::Ordering::Relaxed);
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .tenant_token("team-b", TOKEN_B, &["b"])
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [600000], max_attempts: 5, jitter: none }")
        .sink("one", &sink.url("/one"))
        .sink("two", &sink.url("/two"))
        .route("r", &["one", "two"])
        .open_source("shared", "r")
        .start()
        .await;
    let c = client();
    let mut ids = Vec::new();
    for t in ["a", "a", "a", "b"] {
        let r = post(
            &c,
            &node.ingest_url("shared"),
            &[("x-tenant", t.to_owned())],
            b"{}".to_vec(),
        )
        .await;
        assert_eq!(r.status, 202);
        ids.push(r.json()["id"].as_str().unwrap().to_owned());
    }
    eventually(10, "every first attempt failed", || {
        let n = counters::node(&node.store).unwrap();
        n.scheduled == 8 && n.inflight == 0
    })
    .await;
    sink.default_status
        .store(200, std::sync::atomic::Ordering::Relaxed);
    let call = |path: &str, token: &str, body: &str| {
        let url = format!("http://{}{path}", node.admin_addr);
        let auth = format!("Bearer {token}");
        let (c, body) = (c.clone(), body.to_owned());
        async move {
            let headers = [
                ("authorization", auth.as_str()),
                ("content-type", "application/json"),
            ];
            let (s, _, v) = raw(&c, "POST", &url, &headers, &body).await;
            (s, v)
        }
    };
    let delivered = |path: &str| sink.on(path).iter().filter(|r| r.status == 200).count();
    // One hook: its two deliveries.
    let body = format!(r#"{{"hook_id":"{}"}}"#, ids[0]);
    let (s, v) = call("/v1/tenants/a/retry", ADMIN, &body).await;
    assert_eq!(
        (s, v["retried"].as_u64(), v["more"].as_bool()),
        (200, Some(2), Some(false)),
        "{v}"
    );
    eventually(10, "hook 0 delivered to both sinks", || {
        delivered("/one") == 1 && delivered("/two") == 1
    })
    .await;
    // One sink: the other two hooks' deliveries to `two`.
    let (s, v) = call("/v1/tenants/a/retry", ADMIN, r#"{"sink":"two"}"#).await;
    assert_eq!((s, v["retried"].as_u64()), (200, Some(2)), "{v}");
    eventually(10, "sink two got them", || delivered("/two") == 3).await;
    assert_eq!(delivered("/one"), 1);
    // Bad input changes nothing; another tenant's token does not see tenant a.
    let (s, v) = call("/v1/tenants/a/retry", ADMIN, r#"{"sink":"nope"}"#).await;
    assert_eq!((s, v["error"].as_str()), (400, Some("bad_request")));
    let (s, _) = call("/v1/tenants/a/retry", ADMIN, r#"{"hook_id":"hk_none"}"#).await;
    assert_eq!(s, 404);
    let (s, _) = call("/v1/tenants/a/retry", TOKEN_B, "{}").await;
    assert_eq!(s, 404);
    assert_eq!(counters::node(&node.store).unwrap().scheduled, 4);
    // All of tenant a's (no body at all), then b's from the command line.
    let (s, v) = call("/v1/tenants/a/retry", ADMIN, "").await;
    assert_eq!((s, v["retried"].as_u64()), (200, Some(2)), "{v}");
    let url = format!("http://{}", node.admin_addr);
    let args: Vec<String> = [
        "admin", "--url", &url, "--token", TOKEN_B, "retry", "b", "--json",
    ]
    .map(String::from)
    .to_vec();
    let out = tokio::task::spawn_blocking(move || bin().args(args).output().unwrap())
        .await
        .unwrap();
    assert!(out.status.success(), "{}", text_of(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["retried"], 2, "{v}");
    eventually(10, "everything delivered", || {
        counters::node(&node.store).unwrap().scheduled == 0
            && delivered("/one") == 4
            && delivered("/two") == 4
    })
    .await;
    // Each call is in the audit log, with who asked and what moved.
    let (_, audit) = {
        let url = format!("http://{}/v1/audit", node.admin_addr);
        let auth = format!("Bearer {ADMIN}");
        let (s, _, v) = raw(&c, "GET", &url, &[("authorization", auth.as_str())], "").await;
        (s, v)
    };
    let retries: Vec<_> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["action"] == "tenant.retry")
        .collect();
    assert_eq!(retries.len(), 4, "{audit}");
    assert!(retries
        .iter()
        .any(|r| r["who"] == "team-b" && r["tenant"] == "b"));
    node.stop().await;
}

/// `GET /v1/config` shows a sink's header names and its host, never its headers' values
/// or its URL's user information and query: each can be a credential.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn config_shows_no_sink_credential() {
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .sink_yaml(
            r#"{ id: keyed, url: "http://hook-user:url-password-0123@127.0.0.1:9/in?token=url-query-token-0123", headers: { x-api-key: header-value-secret-0123 } }"#,
        )
        .route("r", &["keyed"])
        .open_source("in", "r")
        .start()
        .await;
    let port = node.admin_addr.port();
    let (status, text) = tokio::task::spawn_blocking(move || {
        http_get_auth_token(port, "/v1/config", ADMIN).unwrap()
    })
    .await
    .unwrap();
    assert_eq!(status, 200);
    for secret in [
        "hook-user",
        "url-password-0123",
        "url-query-token-0123",
        "header-value-secret-0123",
    ] {
        assert!(!text.contains(secret), "{secret} in {text}");
    }
    assert!(
        text.contains("x-api-key") && text.contains("127.0.0.1:9/in"),
        "{text}"
    );
    node.stop().await;
}

/// A failed attempt keeps the first bytes of what the sink answered (on one line, within
/// `dispatch.response_body_bytes`), in the hook log and the DLQ row; 0 keeps none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_attempt_keeps_the_first_bytes_of_the_answer() {
    let sink = TestSink::start().await;
    sink.default_status
        .store(400, std::sync::atomic::Ordering::Relaxed);
    *sink.failure_body.lock().unwrap() =
        b"{\"error\":\"bad field\",\n \"field\":\"amount\"}".to_vec();
    let node = |bytes: usize| {
        TestNode::builder()
            .admin_token("ops", ADMIN)
            .section(&format!(
                "dispatch: {{ tick_interval_ms: 10, response_body_bytes: {bytes} }}"
            ))
            .sink_yaml(&format!(
                "{{ id: s, url: \"{}\", dead_letter_on_4xx: true }}",
                sink.url("/hooks")
            ))
            .route("r", &["s"])
            .open_source("shared", "r")
            .start()
    };
    for (bytes, want) in [
        (
            200,
            "HTTP 400: {\"error\":\"bad field\",  \"field\":\"amount\"}",
        ),
        (12, "HTTP 400: {\"error\":\"ba"),
        (0, "HTTP 400"),
    ] {
        let node = node(bytes).await;
        let c = client();
        let r = post(
            &c,
            &format!("http://{}/ingest/shared", node.ingest_addr),
            &[("x-tenant", "a".to_owned())],
            "{}",
        )
        .await;
        assert_eq!(r.status, 202);
        let id = r.json()["id"].as_str().unwrap().to_owned();
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        let hook = loop {
            let (s, v) = admin_call(
                node.admin_addr,
                "GET",
                &format!("/v1/hooks/{id}"),
                ADMIN,
                "",
            )
            .await;
            assert_eq!(s, 200, "{v}");
            if v["sinks"][0]["state"] == "dead" {
                break v;
            }
            assert!(std::time::Instant::now() < deadline, "not dead: {v:#}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(
            hook["sinks"][0]["events"][0]["error"], want,
            "{bytes}: {hook}"
        );
        let (_, dlq) = admin_call(node.admin_addr, "GET", "/v1/dlq", ADMIN, "").await;
        assert_eq!(dlq["items"][0]["last_error"], want, "{bytes}: {dlq}");
        node.stop().await;
    }
}

/// The quarantine leads somewhere (issue 71): requests refused while a source had a wrong
/// secret are verified again once it is fixed, and ingested — delivered, out of the
/// quarantine — while one that is still bad stays; a dry run counts and sends nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quarantine_replay_ingests_what_passes_with_the_fixed_secret() {
    let dir = tempfile::tempdir().unwrap();
    let sink = TestSink::start().await;
    let node = |secret: &'static str| {
        TestNode::builder()
            .data_dir(dir.path().join("db"))
            .admin_token("ops", ADMIN)
            .section("dispatch: { tick_interval_ms: 10 }")
            .sink_yaml(&format!("{{ id: s, url: \"{}\" }}", sink.url("/hooks")))
            .route("r", &["s"])
            .source_yaml(&format!(
                r#"{{ id: gh, tenant: {{ header: x-tenant }}, verify: {{ scheme: hmac-sha256, secret: {{ value: "{secret}" }}, header: x-sig }}, tenant_binding: shared-secret, route: r }}"#
            ))
            .start()
    };
    let right = "the-providers-secret";
    let sign = |body: &str| {
        ankusa_verify::hex(&ankusa_verify::hmac_sha256(
            right.as_bytes(),
            &[body.as_bytes()],
        ))
    };
    let first = node("a-secret-typed-wrong").await;
    let c = client();
    let url = format!("http://{}/ingest/gh", first.ingest_addr);
    for i in 0..3 {
        let body = format!(r#"{{"i":{i}}}"#);
        let r = post(
            &c,
            &url,
            &[("x-tenant", "acme".into()), ("x-sig", sign(&body))],
            body,
        )
        .await;
        assert_eq!(r.status, 401);
    }
    let r = post(
        &c,
        &url,
        &[("x-tenant", "acme".into()), ("x-sig", "00".repeat(32))],
        "{}",
    )
    .await;
    assert_eq!(r.status, 401);
    let store = first.store.clone();
    eventually(5, "four quarantined", || {
        store.scan_family(Family::Quarantine).unwrap().count() == 4
    })
    .await;
    first.stop().await;
    drop(store);
    // The secret fixed: the node starts again on the same store.
    let node = node(right).await;
    let call = |body: &'static str| {
        admin_call(
            node.admin_addr,
            "POST",
            "/v1/quarantine/replay",
            ADMIN,
            body,
        )
    };
    let (s, dry) = call(r#"{"dry_run": true}"#).await;
    assert_eq!(
        (s, dry["matched"].as_u64(), dry["ingested"].as_u64()),
        (200, Some(4), Some(0)),
        "{dry}"
    );
    let (s, v) = call(r#"{"reason": "bad_signature"}"#).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        (
            v["matched"].as_u64(),
            v["ingested"].as_u64(),
            v["still_failing"].as_u64()
        ),
        (Some(4), Some(3), Some(1)),
        "{v}"
    );
    let outcomes: Vec<&str> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["ingested", "ingested", "ingested", "still_failing"],
        "oldest first: {v}"
    );
    // Delivered, to the tenant the request named; out of the quarantine; audited.
    let s2 = sink.clone();
    eventually(10, "three delivered", || s2.on("/hooks").len() == 3).await;
    assert!(sink
        .on("/hooks")
        .iter()
        .all(|r| r.headers["ankusa-tenant"] == "acme"));
    let (_, left) = admin_call(node.admin_addr, "GET", "/v1/quarantine", ADMIN, "").await;
    let left = left["items"].as_array().unwrap().clone();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["reason"], "bad_signature");
    let (_, audit) = admin_call(node.admin_addr, "GET", "/v1/audit", ADMIN, "").await;
    assert!(audit.to_string().contains("quarantine.replay"), "{audit}");
    // Again: the one left still fails, nothing else matches.
    let (_, again) = call("{}").await;
    assert_eq!(
        (again["matched"].as_u64(), again["still_failing"].as_u64()),
        (Some(1), Some(1)),
        "{again}"
    );
    // The command line says the same, for every node it is given.
    let url = format!("http://{}", node.admin_addr);
    let out = tokio::task::spawn_blocking(move || {
        bin()
            .args([
                "admin",
                "--url",
                &url,
                "--token",
                ADMIN,
                "quarantine",
                "replay",
            ])
            .args(["--reason", "bad_signature", "--from", "-1h", "--json"])
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(out.status.success(), "{}", text_of(&out.stderr));
    let cli: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (cli["matched"].as_u64(), cli["still_failing"].as_u64()),
        (Some(1), Some(1)),
        "{cli}"
    );
    let c = counters::node(&node.store).unwrap();
    assert_eq!((c.pending, c.inflight), (0, 0));
    node.stop().await;
}
