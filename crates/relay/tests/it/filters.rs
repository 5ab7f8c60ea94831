//! Route filters (`routes[].filters`): a sink takes a hook only when the hook matches its
//! filter — decided once at ingest, before the commit; a hook no sink takes is in the hook
//! log as filtered, counted, and never delivered.

use std::time::Duration;

use ankusa_relay::testkit::{metric, TestNode, TestSink};
use proptest::prelude::*;

use crate::support::{client, get_text, post, raw};

const ADMIN: &str = "filters-admin-token-0123";

async fn hook(node: &TestNode, id: &str) -> serde_json::Value {
    let url = node.admin_url(&format!("/v1/hooks/{id}"));
    let auth = format!("Bearer {ADMIN}");
    let (status, _, v) = raw(
        &client(),
        "GET",
        &url,
        &[("authorization", auth.as_str())],
        "",
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

/// The ids of the sinks a hook was committed with (those it is delivered to).
fn sinks_of(v: &serde_json::Value) -> Vec<String> {
    v["sinks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sink"].as_str().unwrap().to_owned())
        .collect()
}

/// An event header's glob, a JSON pointer's, `any` and `not`: each sink gets the hooks its
/// filter takes and no other, delivered; a hook of a route whose every sink filters it out
/// is answered 202 `filtered`, found by its id as filtered with no sink, counted, and
/// reaches no sink.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_routes_filters_choose_its_sinks_and_a_hook_none_takes_is_logged_as_filtered() {
    let sink = TestSink::start().await;
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .sink("invoices", &sink.url("/invoices"))
        .sink("large", &sink.url("/large"))
        .sink("everything", &sink.url("/everything"))
        .route_yaml(
            r#"{ id: billing, sinks: [invoices, large, everything], filters: {
                invoices: { event: "invoice.*" },
                large: { any: [ { pointer: { pointer: /amount, matches: ["1???", "????"] } },
                                { not: { header: { name: x-priority, matches: low } } } ] } } }"#,
        )
        .route_yaml(
            r#"{ id: pushes, sinks: [invoices], filters: { invoices: { event: [push, "pull_*"] } } }"#,
        )
        .source_yaml(
            "{ id: billing, tenant: { header: x-tenant }, verify: { scheme: none }, route: billing, event_type: { header: x-event } }",
        )
        .source_yaml(
            "{ id: pushes, tenant: { header: x-tenant }, verify: { scheme: none }, route: pushes, event_type: { json_pointer: /kind } }",
        )
        .start()
        .await;
    let c = client();
    let send = |source: &str, headers: Vec<(&'static str, &str)>, body: &str| {
        let (c, url, body) = (c.clone(), node.ingest_url(source), body.to_owned());
        let mut h: Vec<(&'static str, String)> = vec![("x-tenant", "acme".to_owned())];
        h.extend(headers.into_iter().map(|(k, v)| (k, v.to_owned())));
        async move {
            let r = post(&c, &url, &h, body.into_bytes()).await;
            (r.status, r.json())
        }
    };
    // invoice.paid, amount 5000 (4 digits), priority low: invoices, large, everything.
    let (s, a) = send(
        "billing",
        vec![("x-event", "invoice.paid"), ("x-priority", "low")],
        r#"{"amount":5000}"#,
    )
    .await;
    assert_eq!(s, 202);
    // charge.refunded, amount 12 (2 digits), priority low: everything only.
    let (_, b) = send(
        "billing",
        vec![("x-event", "charge.refunded"), ("x-priority", "low")],
        r#"{"amount":12}"#,
    )
    .await;
    // No event header, amount 7, no priority header: large (not low) and everything.
    let (_, c2) = send("billing", vec![], r#"{"amount":7}"#).await;
    let id = |v: &serde_json::Value| v["id"].as_str().unwrap().to_owned();
    assert_eq!(
        sinks_of(&hook(&node, &id(&a)).await),
        ["invoices", "large", "everything"]
    );
    assert_eq!(sinks_of(&hook(&node, &id(&b)).await), ["everything"]);
    assert_eq!(
        sinks_of(&hook(&node, &id(&c2)).await),
        ["large", "everything"]
    );

    // A hook no sink takes: accepted, filtered, in the log, counted, never delivered.
    let (s, d) = send("pushes", vec![], r#"{"kind":"issues"}"#).await;
    assert_eq!(s, 202, "{d}");
    assert_eq!(d["filtered"], true, "{d}");
    let logged = hook(&node, &id(&d)).await;
    assert_eq!(logged["filtered"], true, "{logged}");
    assert!(sinks_of(&logged).is_empty(), "{logged}");
    let (_, e) = send("pushes", vec![], r#"{"kind":"pull_request"}"#).await;
    assert!(e.get("filtered").is_none(), "{e}");
    assert_eq!(sinks_of(&hook(&node, &id(&e)).await), ["invoices"]);

    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while sink.on("/everything").len() < 3
        || sink.on("/invoices").len() < 2
        || sink.on("/large").len() < 2
    {
        assert!(std::time::Instant::now() < deadline, "deliveries missing");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(sink.on("/everything").len(), 3);
    assert_eq!(sink.on("/invoices").len(), 2);
    assert_eq!(sink.on("/large").len(), 2);
    let m = get_text(&c, &node.admin_url("/metrics")).await.1;
    for (series, want) in [
        (r#"ankusa_hooks_filtered_total{source="pushes"}"#, 1.0),
        (
            r#"ankusa_route_filtered_total{source="billing",sink="invoices"}"#,
            2.0,
        ),
        (
            r#"ankusa_route_filtered_total{source="billing",sink="large"}"#,
            1.0,
        ),
        (
            r#"ankusa_route_filtered_total{source="pushes",sink="invoices"}"#,
            1.0,
        ),
    ] {
        assert_eq!(metric(&m, series), Some(want), "{series}:\n{m}");
    }
    // The filtered hook was not stored: no body kept, nothing left to deliver or reclaim.
    let filtered = hook(&node, &id(&d)).await;
    assert_eq!(filtered["stored"], false, "{filtered}");
    node.stop().await;
}

/// A route whose filter reads the event type, for a source that does not say where it is,
/// is refused at start, naming the key; a filter on a sink the route does not name too.
#[test]
fn a_filter_the_configuration_cannot_evaluate_is_refused() {
    let load = |rest: &str| {
        let base = "data_dir: /d\nsinks: [{ id: s, url: \"http://127.0.0.1:9/\" }]\n";
        ankusa_config::Config::from_yaml(&format!("{base}{rest}"), Vec::new())
    };
    let refused = |rest: &str, says: &[&str]| {
        let e = load(rest).unwrap_err().to_string();
        assert!(says.iter().all(|s| e.contains(s)), "{e}");
    };
    let on_push = "routes: [{ id: r, sinks: [s], filters: { s: { event: push } } }]\n";
    refused(
        &format!("{on_push}sources: [{{ id: a, verify: {{ scheme: none }}, route: r }}]\n"),
        &["sources[0].event_type", "filters on the event type"],
    );
    refused(
        "routes: [{ id: r, sinks: [s], filters: { t: { event: push } } }]\n",
        &["routes[0].filters.t", "not one of the route's sinks"],
    );
    refused(
        "routes: [{ id: r, sinks: [s], filters: { s: { pointer: { pointer: type, matches: x } } } }]\n",
        &["is not a JSON pointer"],
    );
    // GitHub's event type is its X-GitHub-Event header: no event_type needed.
    load(&format!(
        "{on_push}sources: [{{ id: a, verify: {{ scheme: github, secret: {{ value: x }} }}, route: r }}]\n"
    ))
    .unwrap();
}

/// A filter, generated over a small alphabet so that hooks match it often enough.
fn filter() -> impl Strategy<Value = serde_json::Value> {
    let pattern = prop::sample::select(vec!["a*", "*b", "a?", "ab", "*", "?", "b*a", "c"]);
    let leaf = prop_oneof![
        pattern
            .clone()
            .prop_map(|p| serde_json::json!({ "event": p })),
        pattern
            .clone()
            .prop_map(|p| serde_json::json!({ "header": { "name": "x-h", "matches": p } })),
        pattern.prop_map(|p| serde_json::json!({ "pointer": { "pointer": "/p", "matches": [p] } })),
    ];
    leaf.prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 1..3)
                .prop_map(|v| serde_json::json!({ "any": v })),
            prop::collection::vec(inner.clone(), 1..3)
                .prop_map(|v| serde_json::json!({ "all": v })),
            inner.prop_map(|f| serde_json::json!({ "not": f })),
        ]
    })
}

/// A hook's event type, `x-h` header and `/p` value (each may be absent).
type Hook = (Option<String>, Option<String>, Option<String>);

fn hook_facts() -> impl Strategy<Value = Hook> {
    let word = prop::option::of(
        prop::sample::select(vec!["a", "ab", "ba", "abb", "b", "c", "aba", ""])
            .prop_map(str::to_owned),
    );
    (word.clone(), word.clone(), word)
}

/// The reference: glob by recursion, filters by their meaning.
fn glob(p: &[char], t: &[char]) -> bool {
    match (p.first(), t.first()) {
        (None, None) => true,
        (Some('*'), _) => glob(&p[1..], t) || (!t.is_empty() && glob(p, &t[1..])),
        (Some('?'), Some(_)) => glob(&p[1..], &t[1..]),
        (Some(a), Some(b)) if a == b => glob(&p[1..], &t[1..]),
        _ => false,
    }
}

fn matches_any(patterns: &serde_json::Value, value: Option<&String>) -> bool {
    let list: Vec<&str> = match patterns {
        serde_json::Value::String(s) => vec![s.as_str()],
        v => v
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p.as_str().unwrap())
            .collect(),
    };
    value.is_some_and(|v| {
        let t: Vec<char> = v.chars().collect();
        list.iter()
            .any(|p| glob(&p.chars().collect::<Vec<_>>(), &t))
    })
}

fn eval(f: &serde_json::Value, h: &Hook) -> bool {
    if let Some(p) = f.get("event") {
        return matches_any(p, h.0.as_ref());
    }
    if let Some(x) = f.get("header") {
        return matches_any(&x["matches"], h.1.as_ref());
    }
    if let Some(x) = f.get("pointer") {
        return matches_any(&x["matches"], h.2.as_ref());
    }
    if let Some(v) = f.get("any") {
        return v.as_array().unwrap().iter().any(|g| eval(g, h));
    }
    if let Some(v) = f.get("all") {
        return v.as_array().unwrap().iter().all(|g| eval(g, h));
    }
    !eval(&f["not"], h)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// Over generated filters and hooks: the sinks each hook is committed with (and so
    /// delivered to) are exactly those whose filter the reference evaluation says it
    /// matches, in the route's order; none is a filtered hook.
    #[test]
    fn the_sinks_a_hook_reaches_are_its_filters_evaluation(
        filters in prop::collection::vec(prop::option::of(filter()), 3),
        hooks in prop::collection::vec(hook_facts(), 1..8),
    ) {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
        rt.block_on(async {
            let names = ["s0", "s1", "s2"];
            let mut map = serde_json::Map::new();
            for (n, f) in names.iter().zip(&filters) {
                if let Some(f) = f {
                    map.insert((*n).to_owned(), f.clone());
                }
            }
            let route = serde_json::json!({ "id": "r", "sinks": names, "filters": map });
            let mut b = TestNode::builder()
                .admin_token("ops", ADMIN)
                .route_yaml(&route.to_string())
                .source_yaml("{ id: in, tenant: { header: x-tenant }, verify: { scheme: none }, route: r, event_type: { header: x-event } }");
            for n in names {
                b = b.sink(n, "http://127.0.0.1:9/never");
            }
            let node = b.start().await;
            let c = client();
            for h in &hooks {
                let mut headers = vec![("x-tenant", "t".to_owned())];
                if let Some(e) = &h.0 {
                    headers.push(("x-event", e.clone()));
                }
                if let Some(v) = &h.1 {
                    headers.push(("x-h", v.clone()));
                }
                let body = match &h.2 {
                    Some(p) => serde_json::json!({ "p": p }),
                    None => serde_json::json!({}),
                };
                let r = post(&c, &node.ingest_url("in"), &headers, body.to_string().into_bytes()).await;
                let json = r.json();
                assert_eq!(r.status, 202, "{json}");
                let want: Vec<String> = names
                    .iter()
                    .zip(&filters)
                    .filter(|(_, f)| f.as_ref().is_none_or(|f| eval(f, h)))
                    .map(|(n, _)| (*n).to_owned())
                    .collect();
                let id = json["id"].as_str().unwrap().to_owned();
                let logged = hook(&node, &id).await;
                assert_eq!(sinks_of(&logged), want, "hook {h:?}, filters {filters:?}");
                assert_eq!(logged["filtered"], want.is_empty());
                assert_eq!(json.get("filtered").is_some(), want.is_empty());
            }
            node.stop().await;
        });
    }
}
