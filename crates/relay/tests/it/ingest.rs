//! Ingest over real HTTP on 127.0.0.1 against a node with a real store.

use ankusa_store::Rows;
use std::collections::BTreeSet;

use ankusa_keyspace::Family;
use ankusa_queue::{fold, tenants};
use ankusa_records::Envelope;
use ankusa_relay::testkit::TestNode;
use base64::Engine;

use crate::support::*;

const GH_SECRET: &str = "It's a Secret to Everybody";
const SW_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const STRIPE_SECRET: &str = "whsec_stripe_test";
const HMAC_SECRET: &str = "hmac-secret";

/// The ingest tests' node: a sink nobody listens on, and a source per verification scheme;
/// `sections` is more configuration.
async fn edge_node(sections: &str) -> TestNode {
    let hmac = |id: &str, tenant: &str, header: &str, verify: &str, rest: &str| {
        format!(
            r#"{{ id: {id}, tenant: {tenant}, verify: {{ scheme: hmac-sha256, secret: {{ value: "{HMAC_SECRET}" }}, header: {header}{verify} }}, route: main{rest} }}"#
        )
    };
    TestNode::builder()
        .ingest_key("body_limit_bytes: 4096")
        .sink("local", "http://127.0.0.1:9/hooks")
        .route("main", &["local"])
        .source_yaml("{ id: open, verify: { scheme: none }, route: main }")
        .source_yaml(&hmac(
            "shared",
            "{ header: x-tenant }",
            "X-Signature",
            r#", prefix: "sha256=""#,
            ", tenant_binding: shared-secret",
        ))
        .source_yaml(&hmac(
            "byjson",
            "{ json_pointer: /account }",
            "X-Sig-B64",
            ", encoding: base64",
            ", idempotency: { json_pointer: /event }",
        ))
        .source_yaml(&format!(
            r#"{{ id: gh, tenant: {{ fixed: acme }}, verify: {{ scheme: github, secret: {{ value: "{GH_SECRET}" }} }}, route: main }}"#
        ))
        .source_yaml(&format!(
            r#"{{ id: sw, tenant: {{ header: x-tenant }}, verify: {{ scheme: standard-webhooks, secret: {{ value: "{SW_SECRET}" }} }}, tenant_binding: shared-secret, route: main }}"#
        ))
        .source_yaml(&format!(
            r#"{{ id: stripe, tenant: {{ fixed: billing }}, verify: {{ scheme: stripe, secret: {{ value: "{STRIPE_SECRET}" }} }}, route: main }}"#
        ))
        .section(sections)
        .start()
        .await
}

fn b64(b: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(b)
}

fn sw_headers(id: &str, ts: u64, body: &[u8], tenant: &str) -> Vec<(&'static str, String)> {
    let key = ankusa_verify::standard_webhooks_key(SW_SECRET.as_bytes());
    vec![
        ("webhook-id", id.to_owned()),
        ("webhook-timestamp", ts.to_string()),
        (
            "webhook-signature",
            ankusa_verify::standard_webhooks_sign(&key, id, ts, body),
        ),
        ("x-tenant", tenant.to_owned()),
        ("content-type", "application/json".to_owned()),
    ]
}

struct Edge {
    node: TestNode,
    c: Client,
}

impl Edge {
    async fn start(sections: &str) -> Edge {
        Edge {
            node: edge_node(sections).await,
            c: client(),
        }
    }
    async fn post(&self, source: &str, headers: &[(&str, String)], body: &[u8]) -> Resp {
        post(
            &self.c,
            &self.node.ingest_url(source),
            headers,
            body.to_vec(),
        )
        .await
    }
    fn hooks(&self) -> Vec<Envelope> {
        self.node
            .store
            .scan_family(Family::Hooks)
            .unwrap()
            .map(|kv| Envelope::decode(&kv.unwrap().1).unwrap())
            .collect()
    }
    fn tenant_count(&self) -> u32 {
        tenants::count(&self.node.store).unwrap()
    }
    async fn metrics(&self) -> String {
        get_text(&self.c, &self.node.admin_url("/metrics")).await.1
    }
}

#[tokio::test]
async fn each_verification_scheme_accepts_a_signed_request_and_quarantines_a_wrong_one() {
    let t = Edge::start("").await;
    let body = br#"{"account":"acct-7","event":"evt-1","n":1}"#;
    let now = now_s();

    // none
    assert_eq!(t.post("open", &[], body).await.status, 202);

    // hmac-sha256, hex with a prefix
    let good = format!(
        "sha256={}",
        hex(&hmac_sha256(HMAC_SECRET.as_bytes(), &[body]))
    );
    let r = t
        .post(
            "shared",
            &[("x-signature", good.clone()), ("x-tenant", "t1".into())],
            body,
        )
        .await;
    assert_eq!(r.status, 202);
    assert!(r.json()["id"].as_str().unwrap().starts_with("hk_"));
    let bad = format!("sha256={}", hex(&hmac_sha256(b"wrong", &[body])));
    // With what a client may add: credentials, a header of its own, the static header of
    // older releases' nodes. The quarantine keeps none of them.
    let r = t
        .post(
            "shared",
            &[
                ("x-signature", bad),
                ("x-tenant", "t1".into()),
                ("authorization", "Bearer caller-secret-0123".into()),
                ("cookie", "session=caller-cookie".into()),
                ("x-internal-secret", "caller-internal-secret".into()),
                ("ankusa-cluster-token", "caller-cluster-token".into()),
            ],
            body,
        )
        .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"], "unauthorized");
    assert_eq!(r.json()["reason"], "bad_signature");
    // A missing header is named; neither answer carries the secret or the expected value.
    let r = t.post("shared", &[("x-tenant", "t1".into())], body).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["reason"], "missing_header");
    assert!(r.json()["message"]
        .as_str()
        .unwrap()
        .contains("x-signature"));
    let expected = hex(&hmac_sha256(HMAC_SECRET.as_bytes(), &[body]));
    for v in [
        r.json().to_string(),
        String::from_utf8_lossy(&r.body).into_owned(),
    ] {
        assert!(!v.contains(HMAC_SECRET) && !v.contains(&expected), "{v}");
    }

    // hmac-sha256, base64, tenant from a JSON pointer
    let sig = b64(&hmac_sha256(HMAC_SECRET.as_bytes(), &[body]));
    assert_eq!(
        t.post("byjson", &[("x-sig-b64", sig)], body).await.status,
        202
    );
    let sig = b64(&hmac_sha256(HMAC_SECRET.as_bytes(), &[b"other"]));
    assert_eq!(
        t.post("byjson", &[("x-sig-b64", sig)], body).await.status,
        401
    );

    // github (the documentation's example)
    let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
    let gh = [
        ("x-hub-signature-256", sig.to_owned()),
        ("x-github-delivery", "d-1".to_owned()),
    ];
    assert_eq!(t.post("gh", &gh, b"Hello, World!").await.status, 202);
    assert_eq!(t.post("gh", &gh, b"Hello, World?").await.status, 401);

    // standard-webhooks: good, wrong signature, stale timestamp
    assert_eq!(
        t.post("sw", &sw_headers("msg_1", now, body, "t2"), body)
            .await
            .status,
        202
    );
    let mut wrong = sw_headers("msg_2", now, body, "t2");
    wrong[2].1 = "v1,AAAA".into();
    assert_eq!(t.post("sw", &wrong, body).await.status, 401);
    let r = t
        .post("sw", &sw_headers("msg_3", now - 3_600, body, "t2"), body)
        .await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["reason"], "stale_timestamp");
    let mut garbled = sw_headers("msg_4", now, body, "t2");
    garbled[1].1 = "yesterday".into();
    let r = t.post("sw", &garbled, body).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["reason"], "malformed_header");

    // stripe: good, stale
    let stripe_body = br#"{"id":"evt_123","object":"event"}"#;
    let sign = |ts: u64| {
        format!(
            "t={ts},v1={}",
            hex(&hmac_sha256(
                STRIPE_SECRET.as_bytes(),
                &[ts.to_string().as_bytes(), b".", stripe_body]
            ))
        )
    };
    assert_eq!(
        t.post("stripe", &[("stripe-signature", sign(now))], stripe_body)
            .await
            .status,
        202
    );
    assert_eq!(
        t.post(
            "stripe",
            &[("stripe-signature", sign(now - 900))],
            stripe_body
        )
        .await
        .status,
        401
    );

    let hooks = t.hooks();
    assert_eq!(hooks.len(), 6);
    let tenants: BTreeSet<_> = hooks
        .iter()
        .map(|h| h.tenant_or_default().to_owned())
        .collect();
    let expect: BTreeSet<String> = ["default", "t1", "acct-7", "acme", "t2", "billing"]
        .into_iter()
        .map(String::from)
        .collect();
    assert_eq!(tenants, expect);
    assert_eq!(hooks[0].sinks, vec!["local".to_owned()]);

    // Eight quarantined requests, kept with their reason and without credentials.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    let q: Vec<_> = t
        .node
        .store
        .scan_family(Family::Quarantine)
        .unwrap()
        .map(|kv| serde_json::from_slice::<serde_json::Value>(&kv.unwrap().1).unwrap())
        .collect();
    assert_eq!(q.len(), 8);
    assert!(q
        .iter()
        .any(|e| e["reason"] == "timestamp outside the tolerance"));
    assert!(q.iter().any(|e| e["reason"] == "signature mismatch"));
    // With the code the 401 gave, and the tenant the request named where it named one.
    assert!(q.iter().any(
        |e| e["code"] == "stale_timestamp" && e["reason"] == "timestamp outside the tolerance"
    ));
    assert!(q
        .iter()
        .all(|e| ankusa_verify::VerifyError::REASONS
            .contains(&e["code"].as_str().unwrap_or_default())));
    assert!(q.iter().any(|e| e["tenant"].is_string()), "{q:?}");
    // Kept by an allow list: the source's verification and tenant headers, the content
    // type; nothing else the client sent.
    for e in &q {
        let h = e["headers"].to_string();
        for never in [
            "authorization",
            "cookie",
            "x-internal-secret",
            "ankusa-",
            "caller-",
        ] {
            assert!(!h.contains(never), "{never} kept: {h}");
        }
    }
    let shared = q
        .iter()
        .find(|e| e["source"] == "shared" && e["headers"].to_string().contains("x-signature"))
        .expect("the shared source's bad signature");
    assert!(
        shared["headers"].to_string().contains("x-tenant"),
        "{shared}"
    );
    let m = t.metrics().await;
    assert!(
        m.contains(r#"ankusa_ingest_requests_total{source="sw",outcome="quarantined"} 3"#),
        "{m}"
    );
    for (source, reason, n) in [
        ("shared", "bad_signature", 1),
        ("shared", "missing_header", 1),
        ("sw", "bad_signature", 1),
        ("sw", "stale_timestamp", 1),
        ("sw", "malformed_header", 1),
        ("stripe", "stale_timestamp", 1),
    ] {
        let series = format!(
            r#"ankusa_ingest_verification_failures_total{{source="{source}",reason="{reason}"}} {n}"#
        );
        assert!(m.contains(&series), "{series} missing:\n{m}");
    }
    assert!(
        m.contains(r#"ankusa_ingest_requests_total{source="sw",outcome="accepted"} 1"#),
        "{m}"
    );
    // The pipeline keeps retrying the unreachable sink; check the counters once it stopped.
    let store = t.node.store.clone();
    t.node.stop().await;
    assert!(fold::verify(&store).unwrap().is_empty());
}

#[tokio::test]
async fn quarantined_and_rejected_requests_never_create_an_ordinal() {
    let t = Edge::start("").await;
    let body = br#"{"x":1}"#;
    let bad = format!("sha256={}", hex(&hmac_sha256(b"nope", &[body])));
    let good = format!(
        "sha256={}",
        hex(&hmac_sha256(HMAC_SECRET.as_bytes(), &[body]))
    );
    // Bad signature, tenant named in the header: quarantined.
    let r = t
        .post(
            "shared",
            &[("x-signature", bad), ("x-tenant", "evil".into())],
            body,
        )
        .await;
    assert_eq!(r.status, 401);
    // Good signature but no tenant header: rejected.
    let r = t
        .post("shared", &[("x-signature", good.clone())], body)
        .await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"], "bad_tenant");
    // An invalid tenant id (longer than 256 bytes): rejected.
    let r = t
        .post(
            "shared",
            &[("x-signature", good), ("x-tenant", "x".repeat(300))],
            body,
        )
        .await;
    assert_eq!(r.status, 400);
    // Unknown source, oversized body.
    assert_eq!(t.post("nope", &[], body).await.status, 404);
    let big = vec![b'x'; 5000];
    let r = t.post("open", &[], &big).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"], "body_too_large");
    // A JSON-pointer tenant missing from the body.
    let sig = b64(&hmac_sha256(HMAC_SECRET.as_bytes(), &[body]));
    assert_eq!(
        t.post("byjson", &[("x-sig-b64", sig)], body).await.status,
        400
    );

    assert_eq!(t.tenant_count(), 0);
    assert!(tenants::ord(&t.node.store, "evil").unwrap().is_none());
    assert!(t.hooks().is_empty());
    assert_eq!(t.node.store.scan_family(Family::Due).unwrap().count(), 0);
    let m = t.metrics().await;
    assert!(
        m.contains(r#"ankusa_ingest_requests_total{source="_unknown",outcome="rejected"} 1"#),
        "{m}"
    );
    assert!(
        m.contains(r#"ankusa_ingest_requests_total{source="shared",outcome="rejected"} 2"#),
        "{m}"
    );
    t.node.stop().await;
}

#[tokio::test]
async fn tenants_max_refuses_a_new_tenant_with_tenant_limit() {
    let t = Edge::start("tenants:\n  max: 2\n").await;
    let body = b"{}";
    let sw = |id: &str, tenant: &str| sw_headers(id, now_s(), body, tenant);
    assert_eq!(t.post("sw", &sw("m1", "a"), body).await.status, 202);
    assert_eq!(t.post("sw", &sw("m2", "b"), body).await.status, 202);
    let r = t.post("sw", &sw("m3", "c"), body).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"], "tenant_limit");
    assert_eq!(r.headers.get("retry-after").unwrap(), "300");
    // An existing tenant is still accepted at the cap.
    assert_eq!(t.post("sw", &sw("m4", "a"), body).await.status, 202);
    assert_eq!(t.tenant_count(), 2);
    assert_eq!(t.hooks().len(), 3);
    let m = t.metrics().await;
    assert!(
        m.contains(r#"ankusa_ingest_requests_total{source="sw",outcome="tenant_limit"} 1"#),
        "{m}"
    );
    t.node.stop().await;
}

#[tokio::test]
async fn duplicates_within_the_window_get_the_first_id_and_after_it_a_new_hook() {
    let t = Edge::start("dedupe:\n  window_ms: 1500\n  sweep_interval_ms: 100\n").await;
    let body = br#"{"k":1}"#;
    let first = t
        .post("sw", &sw_headers("msg_dup", now_s(), body, "t"), body)
        .await;
    assert_eq!(first.status, 202);
    let id = first.json()["id"].as_str().unwrap().to_owned();
    // The same key within the window: 200, the first id, nothing written.
    let again = t
        .post("sw", &sw_headers("msg_dup", now_s(), body, "t"), body)
        .await;
    assert_eq!(again.status, 200);
    assert_eq!(again.json()["id"], id.as_str());
    assert_eq!(again.json()["duplicate"], true);
    // The same key for another tenant is a different hook.
    assert_eq!(
        t.post("sw", &sw_headers("msg_dup", now_s(), body, "u"), body)
            .await
            .status,
        202
    );
    assert_eq!(t.hooks().len(), 2);
    // Concurrent duplicates: exactly one is accepted.
    let futs: Vec<_> = (0..16)
        .map(|_| {
            let h = sw_headers("msg_race", now_s(), body, "t");
            let url = t.node.ingest_url("sw");
            let c = t.c.clone();
            async move { post(&c, &url, &h, body.to_vec()).await.status }
        })
        .collect();
    let statuses = futures_join(futs).await;
    assert_eq!(
        statuses.iter().filter(|s| **s == 202).count(),
        1,
        "{statuses:?}"
    );
    assert_eq!(statuses.iter().filter(|s| **s == 200).count(), 15);
    // After the window: a new hook, and the sweep removes the expired keys.
    tokio::time::sleep(std::time::Duration::from_millis(1_700)).await;
    let later = t
        .post("sw", &sw_headers("msg_dup", now_s(), body, "t"), body)
        .await;
    assert_eq!(later.status, 202);
    assert_ne!(later.json()["id"], id.as_str());
    assert_eq!(t.hooks().len(), 4);
    tokio::time::sleep(std::time::Duration::from_millis(1_700)).await;
    assert!(t.node.store.scan_family(Family::Dedupe).unwrap().count() <= 1);
    t.node.stop().await;
}

/// Under steady traffic (a request every 50 ms, so the writer's queue is never idle for a
/// whole sweep interval) expired dedupe keys are still swept.
#[tokio::test]
async fn the_dedupe_sweep_runs_under_steady_traffic() {
    let t = Edge::start("dedupe:\n  window_ms: 300\n  sweep_interval_ms: 200\n").await;
    let body = br#"{"k":1}"#;
    let sent: u32 = 40;
    for i in 0..sent {
        let r = t
            .post(
                "sw",
                &sw_headers(&format!("msg_{i}"), now_s(), body, "t"),
                body,
            )
            .await;
        assert_eq!(r.status, 202);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    // Keys of the last ~(window + interval) are still there; the older ones are gone.
    let left = t.node.store.scan_family(Family::Dedupe).unwrap().count();
    assert!(
        left < (sent / 2) as usize,
        "{left} of {sent} dedupe keys left under steady traffic"
    );
    let m = t.metrics().await;
    assert!(
        metric(&m, "ankusa_dedupe_swept_total") >= f64::from(sent / 2),
        "{m}"
    );
    t.node.stop().await;
}

async fn futures_join<F: std::future::Future<Output = u16> + Send + 'static>(
    futs: Vec<F>,
) -> Vec<u16> {
    let handles: Vec<_> = futs.into_iter().map(tokio::spawn).collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(h.await.unwrap());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_commits_many_hooks_per_fsync_under_concurrency() {
    many_hooks_per_fsync("").await;
}

/// The same with the writer's syncer thread (`writer.pipeline: true`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_writer_with_its_pipeline_commits_many_hooks_per_fsync() {
    many_hooks_per_fsync("writer: { pipeline: true }").await;
}

/// 64 clients post 15 hooks each: every one is acked, one WAL sync acks several of them,
/// and once every ack is in no hook waits for a sync.
async fn many_hooks_per_fsync(sections: &str) {
    let t = Edge::start(sections).await;
    let clients = 64;
    let per_client = 15;
    let futs: Vec<_> = (0..clients)
        .map(|i| {
            let url = t.node.ingest_url("open");
            let c = t.c.clone();
            async move {
                let mut ok = 0u16;
                for j in 0..per_client {
                    let body = format!(r#"{{"client":{i},"n":{j}}}"#);
                    if post(&c, &url, &[], body).await.status == 202 {
                        ok += 1;
                    }
                }
                ok
            }
        })
        .collect();
    let accepted: u64 = futures_join(futs).await.into_iter().map(u64::from).sum();
    assert_eq!(accepted, (clients * per_client) as u64);
    let m = t.metrics().await;
    let hooks = metric(&m, "ankusa_writer_batch_hooks_sum");
    let batches = metric(&m, "ankusa_writer_batch_hooks_count");
    assert_eq!(hooks as u64, accepted);
    assert!(
        hooks / batches >= 4.0,
        "{hooks} hooks in {batches} synced batches: the writer is not grouping commits"
    );
    assert_eq!(metric(&m, "ankusa_writer_unsynced_hooks"), 0.0);
    t.node.stop().await;
}

/// A source whose tenant is in its URL, with a secret per tenant (a directory with a
/// file per tenant, as a mounted Secret is): a request verifies only with the secret of the
/// tenant it names. Customer A, who holds A's secret, cannot post into B's queue by
/// registering B's URL; a tenant without a secret is refused like a bad signature; a
/// tenant's file added and a reload, and it is taken.
#[tokio::test]
async fn a_tenant_from_the_url_verifies_only_with_its_own_secret() {
    let keys = tempfile::tempdir().unwrap();
    std::fs::write(keys.path().join("acme"), "acme-secret\n").unwrap();
    std::fs::write(keys.path().join("globex"), "globex-secret").unwrap();
    // A mounted Secret's own entries are not tenants.
    std::fs::create_dir(keys.path().join("..2026_12_06")).unwrap();
    let builder = TestNode::builder()
        .sink("local", "http://127.0.0.1:9/hooks")
        .route("main", &["local"])
        .source_yaml(&format!(
            r#"{{ id: partner, tenant: path, verify: {{ scheme: hmac-sha256, header: x-signature, prefix: "sha256=" }}, tenant_secrets: {{ dir: "{}" }}, route: main }}"#,
            keys.path().display()
        ));
    let node = builder.clone().start().await;
    let c = client();
    let send = |tenant: &'static str, secret: &'static str, body: &'static [u8]| {
        let (c, url) = (c.clone(), node.ingest_url(&format!("partner/{tenant}")));
        async move {
            let sig = format!("sha256={}", hex(&hmac_sha256(secret.as_bytes(), &[body])));
            post(&c, &url, &[("x-signature", sig)], body.to_vec()).await
        }
    };
    assert_eq!(send("acme", "acme-secret", b"a-1").await.status, 202);
    assert_eq!(send("globex", "globex-secret", b"g-1").await.status, 202);
    // A's secret on B's URL: refused and quarantined, nothing in B's queue.
    let r = send("globex", "acme-secret", b"a-posing-as-g").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["reason"], "bad_signature");
    // A tenant with no secret answers as a bad signature does: the answer does not tell
    // which tenants have one.
    let r = send("initech", "acme-secret", b"i-1").await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["reason"], "bad_signature");
    let hooks: Vec<(String, Vec<u8>)> = node
        .store
        .scan_family(Family::Hooks)
        .unwrap()
        .map(|kv| Envelope::decode(&kv.unwrap().1).unwrap())
        .map(|e| (e.tenant_or_default().to_owned(), e.body))
        .collect();
    assert_eq!(
        hooks,
        vec![
            ("acme".to_owned(), b"a-1".to_vec()),
            ("globex".to_owned(), b"g-1".to_vec())
        ]
    );
    // The same signed request again within the dedupe window is a duplicate: the
    // signature is an hmac-sha256 source's default key.
    let again = send("acme", "acme-secret", b"a-1").await;
    assert_eq!(
        (again.status, again.json()["duplicate"].clone()),
        (200, serde_json::json!(true))
    );
    // Onboarding a tenant: its file, then a reload (the running node's watch does it when
    // a mounted Secret changes).
    std::fs::write(keys.path().join("initech"), "initech-secret").unwrap();
    node.reloader
        .reload(&builder.yaml_at(node.dir()), Vec::new())
        .unwrap();
    assert_eq!(send("initech", "initech-secret", b"i-2").await.status, 202);
    assert_eq!(send("acme", "initech-secret", b"i-3").await.status, 401);
    node.stop().await;
}

/// A tenant from the URL or a header, verified with one secret for every tenant, is
/// refused unless the configuration says every tenant shares the risk; `config check`
/// then warns.
#[test]
fn a_shared_secret_for_tenants_from_the_request_must_be_said() {
    let dir = tempfile::tempdir().unwrap();
    let source = |binding: &str| {
        TestNode::builder()
            .sink("local", "http://127.0.0.1:9/hooks")
            .route("main", &["local"])
            .source_yaml(&format!(
                r#"{{ id: shared, tenant: {{ header: x-tenant }}, verify: {{ scheme: github, secret: {{ value: "s" }} }}, route: main{binding} }}"#
            ))
            .yaml_at(dir.path())
    };
    let e = ankusa_config::Config::from_yaml(&source(""), Vec::new()).unwrap_err();
    assert!(e.to_string().contains("sources[0].tenant_binding"), "{e}");
    let ok =
        ankusa_config::Config::from_yaml(&source(", tenant_binding: shared-secret"), Vec::new())
            .unwrap();
    let file = dir.path().join("relay.yaml");
    std::fs::write(&file, source(", tenant_binding: shared-secret")).unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ankusa-relay"))
        .args(["config", "check"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: sources[0]: tenant_binding shared-secret"),
        "{stderr}"
    );
    assert_eq!(ok.warnings().len(), 1);
}
