//! Erasing a tenant (`DELETE /v1/tenants/{t}?confirm={t}`) against a real node and real
//! sinks on 127.0.0.1: every key of it goes — delivered, dead and in-flight deliveries, its
//! hooks, hook log, archive, dedupe keys, quarantined requests of a source fixed to it and
//! its counters — its ordinal stays a tombstone, the counters equal a fold, the other
//! tenant keeps everything, and a later hook of the same id is a new tenant.

use ankusa_queue::{counters, fold, tenants};
use ankusa_relay::node::Node;
use ankusa_relay::testkit::{eventually, NodeBuilder, TestSink};
use ankusa_store::Rows;

use crate::support::*;

const A: &str = "erase-me-7f3a";
const B: &str = "keeper-b";
const TOKEN_B: &str = "erase-tenant-b-token-0123456789";
const SECRET: &str = "erase-fixed-source-secret";

fn builder(ok: &TestSink, bad: &TestSink) -> NodeBuilder {
    NodeBuilder::default()
        .admin_token("ops", ADMIN_TOKEN)
        .tenant_token("team-b", TOKEN_B, &["b"])
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("archive: { settle_interval_ms: 20 }")
        .sink_yaml(&format!(r#"{{ id: ok, url: "{}", timeout_ms: 10000 }}"#, ok.url("/in")))
        .sink_yaml(&format!(
            r#"{{ id: bad, url: "{}", dead_letter_on_4xx: true }}"#,
            bad.url("/in")
        ))
        .route_yaml("{ id: both, sinks: [ok, bad], archive: { enabled: true } }")
        .source_yaml(
            "{ id: shared, tenant: { header: x-tenant }, verify: { scheme: none }, idempotency: { headers: [x-idem] }, route: both }",
        )
        .source_yaml(&format!(
            r#"{{ id: a-only, tenant: {{ fixed: {A} }}, verify: {{ scheme: hmac-sha256, secret: {{ value: "{SECRET}" }}, header: x-signature }}, route: both }}"#
        ))
}

/// The erase tests' node: `ok` takes every delivery, `bad` answers 400 (dead-lettered);
/// its store under `dir`.
async fn start() -> (TestSink, TestSink, tempfile::TempDir, Node) {
    let (ok, bad) = (TestSink::start().await, TestSink::start().await);
    bad.default_status
        .store(400, std::sync::atomic::Ordering::Relaxed);
    let dir = tempfile::tempdir().unwrap();
    let node = Node::start(builder(&ok, &bad).config_at(dir.path()))
        .await
        .unwrap();
    (ok, bad, dir, node)
}

async fn call(node: &Node, method: &str, path: &str, token: &str) -> (u16, serde_json::Value) {
    admin_call(node.admin_addr, method, path, token, "").await
}

async fn send(node: &Node, tenant: &str, idem: &str) -> Resp {
    post(
        &client(),
        &format!("http://{}/ingest/shared", node.ingest_addr),
        &[("x-tenant", tenant.to_owned()), ("x-idem", idem.to_owned())],
        format!(r#"{{"tenant":"{tenant}","idem":"{idem}"}}"#).into_bytes(),
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erased_tenant_leaves_no_key_behind_and_its_id_starts_afresh() {
    let (ok, bad, dir, node) = start().await;
    let mut sent_a = Vec::new();
    for i in 0..10 {
        for t in [A, B] {
            let r = send(&node, t, &format!("{t}-{i}")).await;
            assert_eq!(r.status, 202);
            if t == A {
                sent_a.push(r.json()["id"].as_str().unwrap().to_owned());
            }
        }
    }
    // Each hook delivered to `ok`, dead-lettered at `bad`, archived.
    eventually(20, "every hook settled", || {
        let n = counters::node(&node.store).unwrap();
        n.dead == 20 && n.pending + n.scheduled + n.inflight == 0 && n.archive_pending == 0
    })
    .await;
    // A request of the source fixed to A that fails verification: quarantined.
    let r = post(
        &client(),
        &format!("http://{}/ingest/a-only", node.ingest_addr),
        &[("x-signature", "00".to_owned())],
        b"{}".to_vec(),
    )
    .await;
    assert_eq!(r.status, 401);
    // Three more of A's, held in flight at `ok` while the erase begins.
    ok.delay_ms
        .store(1500, std::sync::atomic::Ordering::Relaxed);
    for i in 10..13 {
        assert_eq!(send(&node, A, &format!("{A}-{i}")).await.status, 202);
    }
    let a = tenants::ord(&node.store, A).unwrap().unwrap();
    eventually(10, "A's deliveries in flight", || {
        counters::read(&node.store, a).unwrap().inflight > 0
    })
    .await;

    // What the erase is to remove, in every family the tenant has keys in.
    let before = ankusa_queue::testkit::keys_of_tenant(&node.store, a, A);
    let families: std::collections::BTreeSet<&str> =
        before.iter().filter_map(|k| k.split(':').next()).collect();
    for f in [
        "hooks",
        "deliveries",
        "dead",
        "dead_by_tenant",
        "inflight",
        "archived_hooks",
        "archive_expiry",
        "hook_log",
        "dedupe",
        "dedupe_expiry",
        "counters",
        "tenant_ords",
    ] {
        assert!(families.contains(f), "{f} in {families:?}");
    }
    // Its hooks' log ids and events (keyed by hook id and seq, not by tenant).
    let seqs: Vec<(String, ankusa_keyspace::Seq)> = sent_a
        .iter()
        .map(|id| {
            let seq = ankusa_queue::hooklog::seq_of(&node.store, id)
                .unwrap()
                .unwrap();
            (id.clone(), seq)
        })
        .collect();
    let events = |store: &ankusa_store::Store, seq: ankusa_keyspace::Seq| {
        let (lo, hi) = ankusa_keyspace::hook_events_of_seqs(seq, ankusa_keyspace::Seq(seq.0 + 1));
        store
            .first(
                ankusa_keyspace::Family::HookEvents,
                &lo,
                &hi,
                ankusa_store::Dir::Forward,
            )
            .unwrap()
            .is_some()
    };
    assert!(seqs.iter().any(|(_, s)| events(&node.store, *s)));
    // Admin only, and only with the tenant id again.
    let path = format!("/v1/tenants/{A}");
    assert_eq!(
        call(&node, "DELETE", &format!("{path}?confirm={A}"), TOKEN_B)
            .await
            .0,
        403
    );
    let (s, v) = call(&node, "DELETE", &format!("{path}?confirm={B}"), ADMIN_TOKEN).await;
    assert_eq!((s, v["error"].as_str()), (400, Some("bad_request")), "{v}");
    assert_eq!(
        call(
            &node,
            "DELETE",
            "/v1/tenants/nobody?confirm=nobody",
            ADMIN_TOKEN
        )
        .await
        .0,
        404
    );
    let (s, v) = call(&node, "DELETE", &format!("{path}?confirm={A}"), ADMIN_TOKEN).await;
    assert_eq!((s, v["changed"].as_u64()), (202, Some(1)), "{v}");
    let (s, v) = call(&node, "DELETE", &format!("{path}?confirm={A}"), ADMIN_TOKEN).await;
    assert_eq!((s, v["changed"].as_u64()), (202, Some(0)), "once: {v}");
    // While it runs (its deliveries in flight hold it): shown, and its hooks refused.
    let (_, v) = call(&node, "GET", &path, ADMIN_TOKEN).await;
    assert!(v["erasing_since_ms"].as_u64().is_some(), "{v}");
    let r = send(&node, A, "during").await;
    assert_eq!(
        (r.status, r.json()["error"].as_str()),
        (410, Some("tenant_erasing"))
    );
    eventually(20, "the erase ended", || {
        tenants::ord(&node.store, A).unwrap().is_none()
    })
    .await;
    ok.delay_ms.store(0, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(call(&node, "GET", &path, ADMIN_TOKEN).await.0, 404);
    // B keeps everything: its dead rows and its archive.
    let (_, v) = call(&node, "GET", &format!("/v1/tenants/{B}"), ADMIN_TOKEN).await;
    assert_eq!(v["counters"]["dead"], 10, "{v}");
    let (_, v) = call(
        &node,
        "GET",
        &format!("/v1/archive?tenant={B}"),
        ADMIN_TOKEN,
    )
    .await;
    assert_eq!(v["items"].as_array().map(Vec::len), Some(10), "{v}");
    let (_, audit) = call(&node, "GET", "/v1/audit", ADMIN_TOKEN).await;
    let actions: Vec<&str> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["tenant"] == A)
        .filter_map(|r| r["action"].as_str())
        .collect();
    for want in ["tenant.erase", "tenant.erased", "quarantine.delete"] {
        assert!(actions.contains(&want), "{want}: {actions:?}");
    }
    let (_, q) = call(&node, "GET", "/v1/quarantine", ADMIN_TOKEN).await;
    assert_eq!(q["items"].as_array().map(Vec::len), Some(0), "{q}");
    node.shutdown().await.unwrap();

    {
        let store =
            ankusa_store::Store::open(dir.path().join("db"), &ankusa_store::OpenOptions::default())
                .unwrap();
        let left = ankusa_queue::testkit::keys_of_tenant(&store, a, A);
        assert!(
            left.is_empty(),
            "keys of the erased tenant:\n{}",
            left.join("\n")
        );
        assert!(fold::verify(&store).unwrap().is_empty());
        for (id, seq) in &seqs {
            assert_eq!(
                ankusa_queue::hooklog::seq_of(&store, id).unwrap(),
                None,
                "{id}"
            );
            assert!(!events(&store, *seq), "events of {id}");
        }
        assert_eq!(
            tenants::name(&store, a).unwrap(),
            None,
            "the ordinal is a tombstone"
        );
    }

    // The id starts afresh: a new ordinal, and the same idempotency key is new.
    let node = Node::start(builder(&ok, &bad).config_at(dir.path()))
        .await
        .unwrap();
    let r = send(&node, A, &format!("{A}-0")).await;
    assert_eq!(r.status, 202, "{:?}", r.json());
    let again = tenants::ord(&node.store, A).unwrap().unwrap();
    assert!(again.0 > a.0, "a new ordinal: {} after {}", again.0, a.0);
    node.shutdown().await.unwrap();
}

/// Every occurrence of `needle` in the files under `dir`.
fn occurrences(dir: &std::path::Path, needle: &[u8]) -> usize {
    let mut n = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            n += occurrences(&path, needle);
        } else if let Ok(bytes) = std::fs::read(&path) {
            n += bytes.windows(needle.len()).filter(|w| *w == needle).count();
        }
    }
    n
}

/// An erase that says it is done has taken the tenant's bytes out of the store's files,
/// not only out of every API: after it and a graceful stop, no file of the store (tables,
/// blob files, write-ahead logs) holds a byte string only the erased tenant's bodies
/// carried — bodies inline in the tables and in blob files, flushed before the erase and
/// still in the write-ahead log, delivered, dead and archived — while the other tenant's,
/// stored the same ways, is still found (the search can see what it looks for).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erase_that_ends_leaves_none_of_the_tenants_bytes_in_the_stores_files() {
    let (_ok, _bad, dir, node) = start().await;
    // Random bytes, which no compression shrinks: a marker stored is a marker found.
    let marker = || -> Vec<u8> { (0..48).map(|_| rand::random::<u8>()).collect() };
    let (mark_a, mark_b) = (marker(), marker());
    let c = client();
    let send = |tenant: &'static str, mark: Vec<u8>, i: usize, size: usize| {
        let (c, url) = (
            c.clone(),
            format!("http://{}/ingest/shared", node.ingest_addr),
        );
        async move {
            let mut body = mark;
            body.extend((0..size).map(|_| rand::random::<u8>()));
            let r = post(
                &c,
                &url,
                &[
                    ("x-tenant", tenant.to_owned()),
                    ("x-idem", format!("{tenant}-{i}")),
                    ("content-type", "application/octet-stream".to_owned()),
                ],
                body,
            )
            .await;
            assert_eq!(r.status, 202);
        }
    };
    // Small bodies (inline in the tables) and large ones (blob files) of both tenants,
    // until every one is settled (delivered, dead, archived).
    let send_both = |range: std::ops::Range<usize>| {
        let (mark_a, mark_b, send, node) = (&mark_a, &mark_b, &send, &node);
        async move {
            for i in range.clone() {
                let size = if i % 2 == 0 { 100 } else { 4096 };
                send(A, mark_a.clone(), i, size).await;
                send(B, mark_b.clone(), i, size).await;
            }
            let dead = 2 * range.end as i64;
            eventually(20, "every hook settled", || {
                let n = counters::node(&node.store).unwrap();
                n.dead == dead
                    && n.pending + n.scheduled + n.inflight == 0
                    && n.archive_pending == 0
            })
            .await;
        }
    };
    // Flushed to files; then more that stay in the write-ahead log and the memtables.
    send_both(0..20).await;
    node.store.flush().unwrap();
    send_both(20..30).await;
    let data = dir.path().join("db");
    assert!(occurrences(&data, &mark_a) > 0, "A's bytes stored");
    let path = format!("/v1/tenants/{A}?confirm={A}");
    assert_eq!(call(&node, "DELETE", &path, ADMIN_TOKEN).await.0, 202);
    eventually(30, "the erase ended", || {
        tenants::ord(&node.store, A).unwrap().is_none()
    })
    .await;
    assert!(fold::verify(&node.store).unwrap().is_empty());
    node.shutdown().await.unwrap();
    assert_eq!(
        occurrences(&data, &mark_a),
        0,
        "the erased tenant's bytes are still in the store's files"
    );
    assert!(
        occurrences(&data, &mark_b) >= 30,
        "the other tenant's bytes are found ({} times): the search sees what it looks for",
        occurrences(&data, &mark_b)
    );
}
