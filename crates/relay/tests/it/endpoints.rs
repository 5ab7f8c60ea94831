//! A tenant's own endpoints (`/v1/tenants/{t}/endpoints`): made, changed, rotated and
//! deleted through the API with the tenant's own token; hooks of a route with
//! `endpoints: true` reach them signed with their secrets, filtered by their filters; a
//! name that resolves to a private address is refused when the delivery connects.

use std::time::Duration;

use ankusa_relay::testkit::{eventually, metric, TestNode, TestSink};
use serde_json::{json, Value};

use crate::support::{admin_call, client, get_text, post};

const ADMIN: &str = "endpoints-admin-token-01";
const ACME: &str = "endpoints-acme-token-0001";
const OTHER: &str = "endpoints-other-token-001";

async fn call(node: &TestNode, method: &str, path: &str, token: &str, body: &str) -> (u16, Value) {
    admin_call(node.admin_addr, method, path, token, body).await
}

/// A node whose route `r` delivers only to the tenants' endpoints, its source reading the
/// tenant from `x-tenant` and the event type from `x-event`.
async fn node_with(endpoints: &str) -> TestNode {
    TestNode::builder()
        .admin_token("ops", ADMIN)
        .tenant_token("acme", ACME, &["acme"])
        .tenant_token("other", OTHER, &["other"])
        .section("dispatch: { tick_interval_ms: 10 }")
        .section(&format!("endpoints: {endpoints}"))
        .section("retry: { max_attempts: 2, schedule_ms: [50] }")
        .route_yaml("{ id: r, sinks: [], endpoints: true }")
        .source_yaml(
            "{ id: s, tenant: { header: x-tenant }, verify: { scheme: none }, route: r, event_type: { header: x-event } }",
        )
        .start()
        .await
}

async fn send(node: &TestNode, tenant: &str, event: &str, body: &str) -> Value {
    let h = vec![
        ("x-tenant", tenant.to_owned()),
        ("x-event", event.to_owned()),
        ("content-type", "application/json".to_owned()),
    ];
    let r = post(
        &client(),
        &node.ingest_url("s"),
        &h,
        body.as_bytes().to_vec(),
    )
    .await;
    assert_eq!(r.status, 202, "{}", String::from_utf8_lossy(&r.body));
    r.json()
}

/// Whether `received`'s `webhook-signature` holds a valid signature by each of `secrets`.
fn signed_by(received: &ankusa_relay::testkit::Received, secrets: &[&str]) -> bool {
    let h = |n: &str| {
        received
            .headers
            .get(n)
            .unwrap()
            .to_str()
            .unwrap()
            .to_owned()
    };
    let (id, ts, sig) = (
        h("webhook-id"),
        h("webhook-timestamp"),
        h("webhook-signature"),
    );
    let sent: Vec<&str> = sig.split(' ').collect();
    sent.len() == secrets.len()
        && secrets.iter().all(|s| {
            let key = ankusa_verify::standard_webhooks_key(s.as_bytes());
            let want = ankusa_verify::standard_webhooks_sign(
                &key,
                &id,
                ts.parse().unwrap(),
                &received.body,
            );
            sent.contains(&want.as_str())
        })
}

/// Create (the secret shown once), list, filters, disable, rotate with an overlap (both
/// signatures on each delivery), delete; another tenant's token sees none of it; a portal
/// of none; the bounds answer 409, bad URLs 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_manages_its_endpoints_and_its_hooks_reach_them_signed_and_filtered() {
    let sink = TestSink::start().await;
    let node = node_with("{ allow_private: true, max_per_tenant: 3 }").await;
    let base = "/v1/tenants/acme/endpoints";

    let body = json!({ "url": sink.url("/invoices"), "filter": { "event": "invoice.*" },
                       "description": "billing" });
    let (s, made) = call(&node, "POST", base, ACME, &body.to_string()).await;
    assert_eq!(s, 201, "{made}");
    let invoices = made["endpoint"]["id"].as_str().unwrap().to_owned();
    let secret_a = made["secret"].as_str().unwrap().to_owned();
    assert!(
        invoices.starts_with("ep_") && secret_a.starts_with("whsec_"),
        "{made}"
    );
    let (s, made) = call(
        &node,
        "POST",
        base,
        ACME,
        &json!({ "url": sink.url("/all") }).to_string(),
    )
    .await;
    assert_eq!(s, 201, "{made}");
    let all = made["endpoint"]["id"].as_str().unwrap().to_owned();
    let secret_b = made["secret"].as_str().unwrap().to_owned();

    // Listed without secrets; another tenant's token finds nothing, and changes nothing.
    let (s, list) = call(&node, "GET", base, ACME, "").await;
    assert_eq!(s, 200);
    assert_eq!(list["endpoints"].as_array().unwrap().len(), 2, "{list}");
    assert_eq!(list["max"], 3);
    assert!(!list.to_string().contains("whsec_"), "{list}");
    for (method, path, body) in [
        ("GET", base.to_owned(), ""),
        ("POST", base.to_owned(), r#"{"url":"http://127.0.0.1:1/x"}"#),
        ("GET", format!("{base}/{invoices}"), ""),
        (
            "PATCH",
            format!("{base}/{invoices}"),
            r#"{"enabled":false}"#,
        ),
        ("DELETE", format!("{base}/{invoices}"), ""),
        ("POST", format!("{base}/{invoices}/rotate"), ""),
    ] {
        let (s, v) = call(&node, method, &path, OTHER, body).await;
        assert_eq!(s, 404, "{method} {path}: {v}");
    }

    // An invoice reaches both, a charge only the endpoint without a filter; each signed.
    let a = send(&node, "acme", "invoice.paid", r#"{"n":1}"#).await;
    send(&node, "acme", "charge.failed", r#"{"n":2}"#).await;
    eventually(10, "the first deliveries", || {
        sink.on("/invoices").len() == 1 && sink.on("/all").len() == 2
    })
    .await;
    assert!(signed_by(&sink.on("/invoices")[0], &[&secret_a]));
    assert!(signed_by(&sink.on("/all")[0], &[&secret_b]));
    assert_eq!(
        sink.on("/invoices")[0].headers["webhook-id"],
        a["id"].as_str().unwrap()
    );
    // A tenant with no endpoints: its hook is taken by nothing, and logged as filtered.
    let none = send(&node, "other", "invoice.paid", "{}").await;
    assert_eq!(none["filtered"], true, "{none}");

    // Disabled: it takes no new hook.
    let (s, v) = call(
        &node,
        "PATCH",
        &format!("{base}/{all}"),
        ACME,
        r#"{"enabled":false,"description":null}"#,
    )
    .await;
    assert_eq!((s, &v["enabled"]), (200, &json!(false)), "{v}");
    assert!(v.get("description").is_none(), "{v}");
    send(&node, "acme", "invoice.sent", r#"{"n":3}"#).await;
    eventually(10, "the invoice after the disable", || {
        sink.on("/invoices").len() == 2
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sink.on("/all").len(), 2, "a disabled endpoint took a hook");

    // Rotated with an overlap: the new and the old secret both sign.
    let (s, r) = call(
        &node,
        "POST",
        &format!("{base}/{invoices}/rotate"),
        ACME,
        r#"{"overlap_s":60}"#,
    )
    .await;
    assert_eq!(s, 200, "{r}");
    let secret_a2 = r["secret"].as_str().unwrap().to_owned();
    assert_ne!(secret_a2, secret_a);
    assert_eq!(r["endpoint"]["secrets"].as_array().unwrap().len(), 2, "{r}");
    send(&node, "acme", "invoice.voided", r#"{"n":4}"#).await;
    eventually(10, "the invoice after the rotation", || {
        sink.on("/invoices").len() == 3
    })
    .await;
    assert!(signed_by(
        &sink.on("/invoices")[2],
        &[&secret_a2, &secret_a]
    ));
    // Rotated again at once: the first secret ends, the second signs alone with the third
    // for the overlap of 0 s — only the newest.
    let (_, r) = call(
        &node,
        "POST",
        &format!("{base}/{invoices}/rotate"),
        ACME,
        r#"{"overlap_s":0}"#,
    )
    .await;
    let secret_a3 = r["secret"].as_str().unwrap().to_owned();
    send(&node, "acme", "invoice.x", r#"{"n":5}"#).await;
    eventually(10, "the invoice after the second rotation", || {
        sink.on("/invoices").len() == 4
    })
    .await;
    assert!(signed_by(&sink.on("/invoices")[3], &[&secret_a3]));

    // The bounds: a third endpoint, then a fourth refused; bad URLs and filters refused.
    let (s, _) = call(
        &node,
        "POST",
        base,
        ACME,
        &json!({ "url": sink.url("/third") }).to_string(),
    )
    .await;
    assert_eq!(s, 201);
    let (s, v) = call(
        &node,
        "POST",
        base,
        ACME,
        &json!({ "url": sink.url("/fourth") }).to_string(),
    )
    .await;
    assert_eq!(
        (s, v["error"].as_str()),
        (409, Some("too_many_endpoints")),
        "{v}"
    );
    for bad in [
        json!({ "url": "ftp://example.com/" }),
        json!({ "url": "https://user:pw@example.com/" }),
        json!({ "url": "https://example.com/", "filter": { "nope": 1 } }),
        json!({ "url": "https://example.com/", "rate_per_second": 0 }),
    ] {
        let (s, v) = call(
            &node,
            "PATCH",
            &format!("{base}/{all}"),
            ACME,
            &bad.to_string(),
        )
        .await;
        assert_eq!(s, 400, "{bad}: {v}");
    }

    // Deleted: gone from the list, its id 404; the node counts what it stores.
    let (s, _) = call(&node, "DELETE", &format!("{base}/{invoices}"), ACME, "").await;
    assert_eq!(s, 200);
    let (s, _) = call(&node, "GET", &format!("{base}/{invoices}"), ADMIN, "").await;
    assert_eq!(s, 404);
    let (_, list) = call(&node, "GET", base, ADMIN, "").await;
    assert_eq!(list["endpoints"].as_array().unwrap().len(), 2, "{list}");
    let (_, text) = get_text(&client(), &node.admin_url("/metrics")).await;
    assert_eq!(metric(&text, "ankusa_endpoints"), Some(2.0));
    // Every change is in the audit log, without a secret.
    let (_, audit) = call(&node, "GET", "/v1/audit?limit=100", ADMIN, "").await;
    let text = audit.to_string();
    for action in [
        "tenant.endpoint.create",
        "tenant.endpoint.update",
        "tenant.endpoint.rotate",
        "tenant.endpoint.delete",
    ] {
        assert!(text.contains(action), "{action}: {text}");
    }
    assert!(!text.contains("whsec_"));
    node.stop().await;
}

/// With `endpoints.allow_private` off, an address written in the URL is refused when the
/// endpoint is saved, and a name (`localhost`) that resolves to 127.0.0.1 when a delivery
/// connects: the delivery is dead at once, `address_refused`, and the sink sees nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_resolves_to_loopback_is_refused_at_delivery() {
    let sink = TestSink::start().await;
    let node = node_with("{}").await;
    let base = "/v1/tenants/acme/endpoints";
    let (s, v) = call(
        &node,
        "POST",
        base,
        ACME,
        &json!({ "url": sink.url("/x") }).to_string(),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["message"].as_str().unwrap().contains("loopback"), "{v}");
    let url = format!("http://localhost:{}/x", sink.port);
    let (s, v) = call(
        &node,
        "POST",
        base,
        ACME,
        &json!({ "url": url }).to_string(),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    let hook = send(&node, "acme", "e", "{}").await;
    let id = hook["id"].as_str().unwrap();
    let mut last = Value::Null;
    for _ in 0..250 {
        let (_, h) = call(&node, "GET", &format!("/v1/hooks/{id}"), ADMIN, "").await;
        if h["sinks"][0]["state"] == "dead" {
            last = h;
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let text = last.to_string();
    assert!(text.contains("address_refused"), "{text}");
    assert!(text.contains("localhost resolves to"), "{text}");
    assert!(sink.on("/x").is_empty(), "the sink was reached");
    node.stop().await;
}

/// An erased tenant's endpoints go with it: those of a tenant with hooks in its erase's
/// last write, those of one that never sent a hook at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_erase_deletes_the_tenants_endpoints() {
    let sink = TestSink::start().await;
    let node = node_with("{ allow_private: true }").await;
    for t in ["acme", "other"] {
        let token = if t == "acme" { ACME } else { OTHER };
        let path = format!("/v1/tenants/{t}/endpoints");
        let (s, _) = call(
            &node,
            "POST",
            &path,
            token,
            &json!({ "url": sink.url("/e") }).to_string(),
        )
        .await;
        assert_eq!(s, 201);
    }
    send(&node, "acme", "e", "{}").await;
    eventually(10, "the delivery", || sink.on("/e").len() == 1).await;
    // acme's hooks are here: its erase runs (202). other never sent one: its endpoints go
    // at once and the tenant is not here (404).
    for (t, status) in [("acme", 202), ("other", 404)] {
        let path = format!("/v1/tenants/{t}?confirm={t}");
        let (s, v) = call(&node, "DELETE", &path, ADMIN, "").await;
        assert_eq!(s, status, "{t}: {v}");
    }
    let gone = || async {
        let (_, text) = get_text(&client(), &node.admin_url("/metrics")).await;
        metric(&text, "ankusa_endpoints")
    };
    for _ in 0..250 {
        if gone().await == Some(0.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(gone().await, Some(0.0));
    for t in ["acme", "other"] {
        let (_, list) = call(
            &node,
            "GET",
            &format!("/v1/tenants/{t}/endpoints"),
            ADMIN,
            "",
        )
        .await;
        assert_eq!(list["endpoints"], json!([]), "{t}: {list}");
    }
    node.stop().await;
}

/// `ankusa-relay admin endpoints …` with a tenant's token: create (the secret printed once),
/// list, update, rotate, delete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_manages_a_tenants_endpoints() {
    let node = node_with("{ allow_private: true }").await;
    let url = format!("http://{}", node.node.admin_addr);
    let cli = |args: Vec<String>| {
        let url = url.clone();
        async move {
            let mut all: Vec<String> = [
                "admin",
                "--url",
                &url,
                "--token",
                ACME,
                "--json",
                "endpoints",
            ]
            .map(String::from)
            .to_vec();
            all.extend(args);
            let out = tokio::task::spawn_blocking(move || {
                crate::support::bin().args(all).output().unwrap()
            })
            .await
            .unwrap();
            assert!(
                out.status.success(),
                "{}",
                crate::support::text(&out.stderr)
            );
            serde_json::from_slice::<Value>(&out.stdout).unwrap()
        }
    };
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let made = cli(args(&[
        "create",
        "acme",
        "https://hooks.example.com/in",
        "--filter",
        r#"{"event":"a.*"}"#,
        "--rate",
        "5",
    ]))
    .await;
    let id = made["endpoint"]["id"].as_str().unwrap().to_owned();
    assert!(
        made["secret"].as_str().unwrap().starts_with("whsec_"),
        "{made}"
    );
    assert_eq!(made["endpoint"]["rate_per_second"], 5);
    let list = cli(args(&["list", "acme"])).await;
    assert_eq!(list["endpoints"][0]["id"], id.as_str(), "{list}");
    let changed = cli(args(&[
        "update",
        "acme",
        &id,
        "--disable",
        "--filter",
        "none",
        "--rate",
        "none",
    ]))
    .await;
    assert_eq!(changed["enabled"], false, "{changed}");
    assert!(
        changed.get("filter").is_none() && changed.get("rate_per_second").is_none(),
        "{changed}"
    );
    let rotated = cli(args(&["rotate", "acme", &id, "--overlap-s", "0"])).await;
    assert_ne!(rotated["secret"], made["secret"]);
    assert_eq!(
        rotated["endpoint"]["secrets"].as_array().unwrap().len(),
        1,
        "{rotated}"
    );
    let gone = cli(args(&["delete", "acme", &id])).await;
    assert_eq!(gone["id"], id.as_str());
    let list = cli(args(&["list", "acme"])).await;
    assert_eq!(list["endpoints"], json!([]));
    node.stop().await;
}

/// An endpoint's `rate_per_second` spaces its requests' starts: eleven hooks at once to an
/// endpoint of 10 a second arrive over at least a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoints_rate_spaces_its_deliveries() {
    let sink = TestSink::start().await;
    let node = node_with("{ allow_private: true }").await;
    let body = json!({ "url": sink.url("/paced"), "rate_per_second": 10 });
    let (s, v) = call(
        &node,
        "POST",
        "/v1/tenants/acme/endpoints",
        ACME,
        &body.to_string(),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    for n in 0..11 {
        send(&node, "acme", "e", &format!("{{\"n\":{n}}}")).await;
    }
    eventually(20, "eleven deliveries", || sink.on("/paced").len() == 11).await;
    let mut at: Vec<_> = sink.on("/paced").iter().map(|r| r.at).collect();
    at.sort();
    let spread = at[10] - at[0];
    assert!(spread >= Duration::from_millis(950), "{spread:?}");
    node.stop().await;
}
