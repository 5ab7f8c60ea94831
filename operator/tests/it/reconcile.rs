//! Reconcile I/O against the in-memory API server: what the operator writes, under which
//! field manager, with which owner references, and what it leaves alone.

use std::sync::Arc;
use std::time::Duration;

use ankusa_crds::node::{NodeCounters, NodeStatus};
use ankusa_crds::relay::Relay;
use ankusa_operator::controller::{self, Context, Settings, FIELD_MANAGER};
use ankusa_operator::metrics::Metrics;
use kube::api::{Api, DynamicObject};
use serde_json::{json, Value};

use crate::apiserver::ApiServer;
use crate::support::{merge, relay_value};

const CORE: &str = "/api/v1";
const APPS: &str = "/apis/apps/v1";
const POLICY: &str = "/apis/policy/v1";
const RELAYS: &str = "/apis/ankusa.dev/v1alpha1";
const MONITORING: &str = "/apis/monitoring.coreos.com/v1";

struct Harness {
    server: ApiServer,
    ctx: Arc<Context>,
    client: kube::Client,
}

async fn harness(node_url_template: &str) -> Harness {
    let (server, client) = ApiServer::start().await;
    let settings = Settings {
        node_url_template: node_url_template.into(),
        node_timeout: Duration::from_millis(500),
        ..Settings::default()
    };
    let ctx = Context::new(client.clone(), Arc::new(Metrics::default()), settings);
    Harness {
        server,
        ctx,
        client,
    }
}

impl Harness {
    fn put_relay(&self, fixture: &str, patch: Value) -> Value {
        let mut v = relay_value(fixture);
        merge(&mut v, &patch);
        let ns = v["metadata"]["namespace"].as_str().unwrap().to_owned();
        self.server.lock().put(RELAYS, &ns, "relays", v.clone());
        v
    }

    /// Read the Relay back (with the status the last reconcile wrote) and reconcile it.
    async fn reconcile(&self, ns: &str, name: &str) -> Result<(), controller::Error> {
        let api: Api<Relay> = Api::namespaced(self.client.clone(), ns);
        let relay = api.get(name).await.unwrap();
        controller::reconcile(Arc::new(relay), self.ctx.clone())
            .await
            .map(|_| ())
    }

    fn object(&self, prefix: &str, ns: &str, plural: &str, name: &str) -> Option<Value> {
        self.server.lock().get(prefix, ns, plural, name).cloned()
    }

    /// The condition `type_` of a stored Relay's status.
    fn condition(&self, ns: &str, name: &str, type_: &str) -> Value {
        let relay = self.object(RELAYS, ns, "relays", name).unwrap();
        relay["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == type_)
            .unwrap_or_else(|| panic!("no {type_} condition"))
            .clone()
    }

    fn clear_log(&self) {
        self.server.lock().requests.clear();
    }
}

fn ready_pod(name: &str, image: &str, instance: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": name, "labels": {
            "app.kubernetes.io/name": "ankusa-relay",
            "app.kubernetes.io/instance": instance,
            "app.kubernetes.io/component": "relay",
        } },
        "spec": { "containers": [{ "name": "relay", "image": image }] },
        "status": { "phase": "Running", "conditions": [{ "type": "Ready", "status": "True" }] },
    })
}

#[tokio::test]
async fn first_reconcile_creates_everything_with_field_manager_and_owner_references() {
    let h = harness(ankusa_operator::nodes::DEFAULT_URL_TEMPLATE).await;
    let relay = h.put_relay("minimal", json!({}));
    let uid = relay["metadata"]["uid"].as_str().unwrap().to_owned();
    h.reconcile("default", "relay").await.unwrap();

    let owned = [
        (CORE, "secrets", "relay-operator-token"),
        (CORE, "configmaps", "relay-config"),
        (CORE, "services", "relay-nodes"),
        (CORE, "services", "relay"),
        (APPS, "statefulsets", "relay"),
        (POLICY, "poddisruptionbudgets", "relay"),
    ];
    for (prefix, plural, name) in owned {
        let obj = h
            .object(prefix, "default", plural, name)
            .unwrap_or_else(|| panic!("{plural}/{name} was not created"));
        let owners = obj["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(owners.len(), 1, "{plural}/{name}");
        assert_eq!(owners[0]["uid"], uid.as_str());
        assert_eq!(owners[0]["kind"], "Relay");
        assert_eq!(owners[0]["controller"], true);
        assert_eq!(
            obj["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "ankusa-operator"
        );
    }
    let inner = h.server.lock();
    // Every write to an owned object is a forced server-side apply under one manager.
    let applies: Vec<_> = inner
        .writes()
        .into_iter()
        .filter(|r| r.method == "PATCH" && !r.path.contains("/events"))
        .cloned()
        .collect();
    assert_eq!(applies.len(), owned.len() + 1, "six objects and the status");
    for r in &applies {
        assert_eq!(
            r.query.get("fieldManager").map(String::as_str),
            Some(FIELD_MANAGER),
            "{}",
            r.path
        );
        assert_eq!(
            r.query.get("force").map(String::as_str),
            Some("true"),
            "{}",
            r.path
        );
        assert!(
            r.content_type.contains("apply-patch"),
            "{}: {}",
            r.path,
            r.content_type
        );
    }
    assert!(
        inner.requests.iter().all(|r| r.method != "DELETE"),
        "the operator deletes nothing"
    );
    // An Event per created object.
    let events: Vec<&Value> = inner
        .requests
        .iter()
        .filter(|r| r.method == "POST" && r.path.contains("/events"))
        .map(|r| &r.body)
        .collect();
    assert_eq!(events.len(), owned.len(), "{events:#?}");
    assert!(events
        .iter()
        .all(|e| e["reason"] == "Created" && e["regarding"]["name"] == "relay"));
    // The status patch carries observedGeneration on the status and on every condition.
    let status_patch = applies
        .iter()
        .find(|r| r.path.ends_with("/status"))
        .unwrap();
    let status = &status_patch.body["status"];
    assert_eq!(status["observedGeneration"], 1);
    let conditions = status["conditions"].as_array().unwrap();
    assert!(conditions.len() >= 5);
    assert!(
        conditions.iter().all(|c| c["observedGeneration"] == 1),
        "{conditions:#?}"
    );
    let stored = inner.get(RELAYS, "default", "relays", "relay").unwrap();
    assert_eq!(stored["status"]["nodesReady"], "0/1");
}

#[tokio::test]
async fn second_reconcile_is_a_noop() {
    let h = harness(ankusa_operator::nodes::DEFAULT_URL_TEMPLATE).await;
    h.put_relay("full", json!({}));
    h.server.lock().monitoring_api = true;
    h.reconcile("payments", "hooks").await.unwrap();
    assert!(h
        .object(MONITORING, "payments", "servicemonitors", "hooks")
        .is_some());
    let versions = |h: &Harness| -> Vec<Value> {
        h.server
            .lock()
            .objects
            .values()
            .map(|o| o["metadata"]["resourceVersion"].clone())
            .collect()
    };
    let before = versions(&h);
    h.clear_log();
    h.reconcile("payments", "hooks").await.unwrap();
    let inner = h.server.lock();
    let writes = inner.writes();
    assert!(writes.is_empty(), "a second reconcile wrote: {writes:#?}");
    drop(inner);
    assert_eq!(before, versions(&h));
}

#[tokio::test]
async fn drifted_statefulset_is_applied_back_with_an_event() {
    let h = harness(ankusa_operator::nodes::DEFAULT_URL_TEMPLATE).await;
    h.put_relay("minimal", json!({}));
    h.reconcile("default", "relay").await.unwrap();
    {
        let mut inner = h.server.lock();
        let key = (
            APPS.to_owned(),
            "default".to_owned(),
            "statefulsets".to_owned(),
            "relay".to_owned(),
        );
        let sts = inner.objects.get_mut(&key).unwrap();
        sts["spec"]["replicas"] = json!(4);
        // Someone else's annotation (kubectl rollout restart) is not drift.
        sts["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"] =
            json!("2026-11-30T00:00:00Z");
    }
    h.clear_log();
    h.reconcile("default", "relay").await.unwrap();
    let sts = h.object(APPS, "default", "statefulsets", "relay").unwrap();
    assert_eq!(sts["spec"]["replicas"], 1);
    assert_eq!(
        sts["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"],
        "2026-11-30T00:00:00Z"
    );
    let inner = h.server.lock();
    let writes = inner.writes();
    assert_eq!(writes.len(), 2, "{writes:#?}");
    assert!(writes[0].path.ends_with("/statefulsets/relay"));
    assert_eq!(writes[1].body["reason"], "Updated");
}

#[tokio::test]
async fn missing_service_monitor_api_is_a_condition_not_an_error() {
    let h = harness(ankusa_operator::nodes::DEFAULT_URL_TEMPLATE).await;
    h.put_relay("full", json!({}));
    h.reconcile("payments", "hooks").await.unwrap();
    assert!(h
        .object(MONITORING, "payments", "servicemonitors", "hooks")
        .is_none());
    let cond = h.condition("payments", "hooks", "ServiceMonitor");
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "ApiNotServed");
    assert_eq!(cond["observedGeneration"], 3);
    // Once the Prometheus Operator is installed, the next reconcile creates it.
    h.server.lock().monitoring_api = true;
    h.reconcile("payments", "hooks").await.unwrap();
    let sm = h
        .object(MONITORING, "payments", "servicemonitors", "hooks")
        .unwrap();
    assert_eq!(sm["metadata"]["labels"]["release"], "prometheus");
    assert_eq!(sm["spec"]["endpoints"][0]["interval"], "15s");
}

#[tokio::test]
async fn malformed_relay_is_reported_on_itself() {
    let h = harness(ankusa_operator::nodes::DEFAULT_URL_TEMPLATE).await;
    h.put_relay("minimal", json!({ "spec": { "replicas": "three" } }));
    let api: Api<DynamicObject> = Api::namespaced_with(
        h.client.clone(),
        "default",
        &controller::relay_api_resource(),
    );
    let obj = api.get("relay").await.unwrap();
    let action = controller::reconcile_object(Arc::new(obj), h.ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, kube::runtime::controller::Action::await_change());
    let inner = h.server.lock();
    let writes = inner.writes();
    assert_eq!(writes.len(), 1, "only the Event: {writes:#?}");
    assert_eq!(writes[0].body["type"], "Warning");
    assert_eq!(writes[0].body["reason"], "Malformed");
    assert!(inner
        .get(APPS, "default", "statefulsets", "relay")
        .is_none());
    assert!(h
        .ctx
        .metrics
        .encode()
        .contains("ankusa_operator_reconcile_failures_total{reason=\"malformed\"} 1"));
}

#[tokio::test]
async fn missing_config_map_is_degraded_and_nothing_is_applied() {
    let h = harness(ankusa_operator::nodes::DEFAULT_URL_TEMPLATE).await;
    h.put_relay(
        "minimal",
        json!({ "spec": { "config": { "configMapRef": { "name": "mine" } } } }),
    );
    h.reconcile("default", "relay").await.unwrap();
    assert!(h.object(APPS, "default", "statefulsets", "relay").is_none());
    let degraded = h.condition("default", "relay", "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ConfigInvalid");
    assert!(degraded["message"]
        .as_str()
        .unwrap()
        .contains("ConfigMap mine does not exist"));

    // The user creates it: the next reconcile builds the relay from it.
    h.server.lock().put(
        CORE,
        "default",
        "configmaps",
        json!({
            "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "mine" },
            "data": { "relay.yaml": "dedupe:\n  window_ms: 5000\n" },
        }),
    );
    h.reconcile("default", "relay").await.unwrap();
    let cm = h
        .object(CORE, "default", "configmaps", "relay-config")
        .unwrap();
    assert!(cm["data"]["relay.yaml"]
        .as_str()
        .unwrap()
        .contains("window_ms: 5000"));
}

/// A node status server standing in for the pods' admin listeners: `/{pod}/v1/node` and
/// `/{pod}/v1/tenants`, checking the operator's token.
async fn node_server(token: Arc<std::sync::Mutex<String>>) -> String {
    use axum::extract::Path;
    use axum::http::{HeaderMap, StatusCode};
    use axum::routing::get;
    let check = move |headers: &HeaderMap, token: &Arc<std::sync::Mutex<String>>| {
        headers.get("authorization").and_then(|v| v.to_str().ok())
            == Some(format!("Bearer {}", token.lock().unwrap()).as_str())
    };
    let t1 = token.clone();
    let t2 = token.clone();
    let app = axum::Router::new()
        .route(
            "/{pod}/v1/node",
            get(move |Path(pod): Path<String>, headers: HeaderMap| {
                let ok = check(&headers, &t1);
                async move {
                    if !ok {
                        return (StatusCode::UNAUTHORIZED, "{}".to_owned());
                    }
                    if pod == "relay-1" {
                        return (StatusCode::SERVICE_UNAVAILABLE, "{}".to_owned());
                    }
                    let s = NodeStatus {
                        version: "0.1.0".into(),
                        supported_format: 3,
                        store_format: 3,
                        migrating_to: None,
                        migration: None,
                        tenants: 2,
                        counters: NodeCounters { pending: 5, dead: 1, ..NodeCounters::default() },
                        oldest_due_at_ms: None,
                    };
                    (StatusCode::OK, serde_json::to_string(&s).unwrap())
                }
            }),
        )
        .route(
            "/{pod}/v1/tenants",
            get(move |headers: HeaderMap| {
                let ok = check(&headers, &t2);
                async move {
                    if !ok {
                        return (StatusCode::UNAUTHORIZED, "{}".to_owned());
                    }
                    let body = json!({ "tenants": [
                        { "tenant": "acme", "ord": 1, "counters": { "pending": 4, "scheduled": 0, "inflight": 0, "dead": 1, "bytes": 10, "archive_pending": 0 } },
                    ], "total": 2 });
                    (StatusCode::OK, body.to_string())
                }
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/{{pod}}")
}

#[tokio::test]
async fn status_reports_each_node_and_a_silent_one_is_not_fatal() {
    let token = Arc::new(std::sync::Mutex::new(String::new()));
    let url = node_server(token.clone()).await;
    let h = harness(&url).await;
    h.put_relay("minimal", json!({ "spec": { "replicas": 3 } }));
    h.reconcile("default", "relay").await.unwrap();
    // The token the operator made for itself is the one it polls with.
    let secret = h
        .object(CORE, "default", "secrets", "relay-operator-token")
        .unwrap();
    let encoded = secret["data"]["token"].as_str().unwrap();
    use base64::Engine;
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .unwrap();
    *token.lock().unwrap() = String::from_utf8(decoded).unwrap();

    let image = "ghcr.io/ankusa/relay:0.1.0";
    {
        let mut inner = h.server.lock();
        inner.put(
            CORE,
            "default",
            "pods",
            ready_pod("relay-0", image, "relay"),
        );
        inner.put(
            CORE,
            "default",
            "pods",
            ready_pod("relay-1", image, "relay"),
        );
        let mut starting = ready_pod("relay-2", image, "relay");
        starting["status"]["conditions"][0]["status"] = json!("False");
        inner.put(CORE, "default", "pods", starting);
    }
    h.reconcile("default", "relay").await.unwrap();
    let relay = h.object(RELAYS, "default", "relays", "relay").unwrap();
    let st = &relay["status"];
    assert_eq!(st["nodesReady"], "1/3");
    assert_eq!(st["storeFormat"], 3);
    assert_eq!(st["nodes"][0]["ready"], true);
    assert_eq!(st["nodes"][0]["pending"], 5);
    assert_eq!(st["nodes"][1]["ready"], false);
    assert!(
        st["nodes"][1]["message"].as_str().unwrap().contains("503"),
        "{st:#}"
    );
    assert_eq!(st["nodes"][2]["message"], "pod is not Ready");
    assert_eq!(st["tenants"]["count"], 2);
    assert_eq!(st["tenants"]["pending"], 5);
    assert_eq!(st["topTenants"][0]["tenant"], "acme");
    assert_eq!(st["phase"], "Degraded");
    let m = h.ctx.metrics.encode();
    assert!(
        m.contains("ankusa_operator_node_polls_total{outcome=\"ok\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("ankusa_operator_node_polls_total{outcome=\"error\"} 1"),
        "{m}"
    );
}

#[tokio::test]
async fn refused_apply_is_degraded_and_retried_with_backoff() {
    let h = harness(ankusa_operator::nodes::DEFAULT_URL_TEMPLATE).await;
    h.put_relay("minimal", json!({}));
    h.server.lock().refuse.push("/statefulsets/".into());
    let err = h.reconcile("default", "relay").await.unwrap_err();
    assert_eq!(err.reason(), "invalid");
    let degraded = h.condition("default", "relay", "Degraded");
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ApplyFailed");
    assert!(degraded["message"]
        .as_str()
        .unwrap()
        .contains("StatefulSet create"));
    // The error policy backs off per object: 1 s, 2 s, 4 s … at most 5 min.
    let api: Api<DynamicObject> = Api::namespaced_with(
        h.client.clone(),
        "default",
        &controller::relay_api_resource(),
    );
    let obj = Arc::new(api.get("relay").await.unwrap());
    let delays: Vec<_> = (0..3)
        .map(|_| controller::error_policy(obj.clone(), &err, h.ctx.clone()))
        .collect();
    assert_eq!(
        delays,
        [1, 2, 4].map(|s| kube::runtime::controller::Action::requeue(Duration::from_secs(s)))
    );
    assert_eq!(controller::backoff(40), Duration::from_secs(300));
    // Once the API server accepts it, the next reconcile succeeds and clears the fault.
    h.server.lock().refuse.clear();
    h.reconcile("default", "relay").await.unwrap();
    assert!(h.object(APPS, "default", "statefulsets", "relay").is_some());
}

/// The controller's watch loop: a malformed Relay is reported on itself and the Relay
/// beside it is reconciled all the same.
#[tokio::test]
async fn the_watch_survives_a_malformed_relay() {
    let h = harness(ankusa_operator::nodes::DEFAULT_URL_TEMPLATE).await;
    h.put_relay("minimal", json!({}));
    let mut bad = relay_value("minimal");
    bad["metadata"]["name"] = json!("broken");
    bad["metadata"]["uid"] = json!("uid-broken");
    bad["spec"]["replicas"] = json!("three");
    h.server.lock().put(RELAYS, "default", "relays", bad);

    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let ctx = h.ctx.clone();
    let run = tokio::spawn(controller::run(ctx, None, async move {
        let _ = stop_rx.await;
    }));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let done = {
            let inner = h.server.lock();
            let sts = inner
                .get(APPS, "default", "statefulsets", "relay")
                .is_some();
            let warned = inner.requests.iter().any(|r| {
                r.method == "POST"
                    && r.body["reason"] == "Malformed"
                    && r.body["regarding"]["name"] == "broken"
            });
            let status = inner
                .get(RELAYS, "default", "relays", "relay")
                .map(|r| !r["status"].is_null())
                .unwrap_or(false);
            sts && warned && status
        };
        if done {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the controller did not reconcile both Relays"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(h
        .object(APPS, "default", "statefulsets", "broken")
        .is_none());
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap();
}
