//! Reconcile I/O against the real kube-apiserver (`scripts/k8s-testenv.sh`): what the
//! operator writes, under which field manager and identity, with which owner references,
//! and what it leaves alone. The operator runs as its own ServiceAccount with exactly the
//! chart's rules.

use std::sync::Arc;
use std::time::Duration;

use ankusa_api::node::{Counters, NodeStatus};
use ankusa_crds::relay::Relay;
use ankusa_operator::controller::{self, Context, Settings};
use ankusa_operator::metrics::Metrics;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

use crate::cluster::{self, Audit, OPERATOR_USER};
use crate::support::{merge, relay_value};

/// An operator context on `client` (the operator's identity).
pub(crate) fn context(client: Client, node_url_template: &str) -> Arc<Context> {
    context_with(client, settings(node_url_template))
}

/// The tests' operator settings: nodes at `node_url_template`, a short poll timeout.
pub(crate) fn settings(node_url_template: &str) -> Settings {
    Settings {
        node_url_template: node_url_template.into(),
        node_timeout: Duration::from_millis(500),
        ..Settings::default()
    }
}

/// An operator context on `client` with `settings`.
pub(crate) fn context_with(client: Client, settings: Settings) -> Arc<Context> {
    Context::new(client, Arc::new(Metrics::default()), settings)
}

/// A URL template that answers nothing (port 9 on loopback refuses).
pub(crate) const NOWHERE: &str = "http://127.0.0.1:9/{pod}";

/// The fixture `name` in namespace `ns` with `patch` merged, as created by `admin`.
pub(crate) async fn create_relay(admin: &Client, ns: &str, fixture: &str, patch: Value) -> Relay {
    let mut v = relay_value(fixture);
    for k in ["uid", "generation", "resourceVersion"] {
        v["metadata"].as_object_mut().unwrap().remove(k);
    }
    v["metadata"]["namespace"] = json!(ns);
    merge(&mut v, &patch);
    let relay: Relay = serde_json::from_value(v).unwrap();
    Api::<Relay>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &relay)
        .await
        .unwrap()
}

/// A new namespace (`prefix`) on the full control plane with the fixture `fixture`
/// (`patch` merged), and an operator context as the operator's ServiceAccount whose nodes
/// answer nothing.
pub(crate) async fn set_up(
    prefix: &str,
    fixture: &str,
    patch: Value,
) -> (Client, String, Arc<Context>) {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    set_up_on(admin, op, prefix, fixture, patch).await
}

/// [`set_up`] on the bare API server (no controllers, no ServiceMonitor CRD).
async fn set_up_bare(prefix: &str, fixture: &str, patch: Value) -> (Client, String, Arc<Context>) {
    let admin = cluster::bare_admin().await;
    let op = cluster::bare_operator_client().await;
    set_up_on(admin, op, prefix, fixture, patch).await
}

async fn set_up_on(
    admin: Client,
    op: Client,
    prefix: &str,
    fixture: &str,
    patch: Value,
) -> (Client, String, Arc<Context>) {
    let ns = cluster::namespace(&admin, prefix).await;
    if fixture == "full" {
        placement_objects(&admin, &ns).await;
    }
    create_relay(&admin, &ns, fixture, patch).await;
    (admin, ns, context(op, NOWHERE))
}

/// What the full fixture's pods name and the API server checks when it admits them: the
/// ServiceAccount `relay` in `ns` and the PriorityClass `relay-critical` (cluster-wide,
/// made once and shared by the tests).
async fn placement_objects(admin: &Client, ns: &str) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::scheduling::v1::PriorityClass;
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), ns);
    let account: ServiceAccount =
        serde_json::from_value(json!({ "metadata": { "name": "relay" } })).unwrap();
    accounts
        .create(&PostParams::default(), &account)
        .await
        .unwrap();
    let classes: Api<PriorityClass> = Api::all(admin.clone());
    let class: PriorityClass =
        serde_json::from_value(json!({ "metadata": { "name": "relay-critical" }, "value": 1000 }))
            .unwrap();
    match classes.create(&PostParams::default(), &class).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("PriorityClass relay-critical: {e}"),
    }
}

/// A merge patch of the Relay `name`, as a user's `kubectl patch --type merge`.
pub(crate) async fn merge_spec(relays: &Api<Relay>, name: &str, patch: Value) {
    relays
        .patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
        .unwrap();
}

/// Read the Relay back (with the status the last reconcile wrote) and reconcile it.
pub(crate) async fn reconcile(
    ctx: &Arc<Context>,
    ns: &str,
    name: &str,
) -> Result<(), controller::Error> {
    let api: Api<Relay> = Api::namespaced(ctx.client.clone(), ns);
    let relay = api.get(name).await.unwrap();
    controller::reconcile(Arc::new(relay), ctx.clone())
        .await
        .map(|_| ())
}

pub(crate) async fn condition(admin: &Client, ns: &str, name: &str, type_: &str) -> Value {
    let relay = Api::<Relay>::namespaced(admin.clone(), ns)
        .get(name)
        .await
        .unwrap();
    let v = serde_json::to_value(relay.status.unwrap()).unwrap();
    v["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["type"] == type_)
        .unwrap_or_else(|| panic!("no {type_} condition: {v:#}"))
        .clone()
}

pub(crate) async fn get_json<K>(client: &Client, ns: &str, name: &str) -> Option<Value>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    Api::<K>::namespaced(client.clone(), ns)
        .get_opt(name)
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

async fn service_monitor(client: &Client, ns: &str, name: &str) -> Option<DynamicObject> {
    Api::<DynamicObject>::namespaced_with(
        client.clone(),
        ns,
        &ankusa_operator::resources::service_monitor_resource(),
    )
    .get_opt(name)
    .await
    .unwrap()
}

#[tokio::test]
async fn first_reconcile_creates_everything_with_field_manager_and_owner_references() {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "first").await;
    let relay = create_relay(&admin, &ns, "minimal", json!({})).await;
    let uid = relay.uid().unwrap();
    let ctx = context(op, NOWHERE);
    let audit = Audit::mark();
    reconcile(&ctx, &ns, "relay").await.unwrap();

    let owned = [
        (
            "Secret",
            get_json::<Secret>(&admin, &ns, "relay-operator-token").await,
        ),
        (
            "ConfigMap",
            get_json::<ConfigMap>(&admin, &ns, "relay-config").await,
        ),
        (
            "Service",
            get_json::<Service>(&admin, &ns, "relay-nodes").await,
        ),
        ("Service", get_json::<Service>(&admin, &ns, "relay").await),
        (
            "StatefulSet",
            get_json::<StatefulSet>(&admin, &ns, "relay").await,
        ),
        (
            "PodDisruptionBudget",
            get_json::<PodDisruptionBudget>(&admin, &ns, "relay").await,
        ),
        (
            "Service",
            get_json::<Service>(&admin, &ns, "relay-ingest").await,
        ),
    ];
    for (kind, obj) in &owned {
        let obj = obj
            .as_ref()
            .unwrap_or_else(|| panic!("{kind} was not created"));
        let owners = obj["metadata"]["ownerReferences"].as_array().unwrap();
        assert_eq!(owners.len(), 1, "{kind}");
        assert_eq!(owners[0]["uid"], uid.as_str());
        assert_eq!(owners[0]["kind"], "Relay");
        assert_eq!(owners[0]["controller"], true);
        assert_eq!(
            obj["metadata"]["labels"]["app.kubernetes.io/managed-by"],
            "ankusa-operator"
        );
        let managers: Vec<&Value> = obj["metadata"]["managedFields"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["manager"] == controller::field_manager("relay").as_str())
            .collect();
        assert_eq!(
            managers.len(),
            1,
            "{kind}: {:#}",
            obj["metadata"]["managedFields"]
        );
        assert_eq!(managers[0]["operation"], "Apply", "{kind}");
    }
    // Every write is the operator's own: seven applies, the status, one Event per object.
    let writes = audit.writes(OPERATOR_USER, &ns);
    let applies: Vec<_> = writes
        .iter()
        .filter(|w| w.verb == "patch" && w.resource != "events")
        .collect();
    assert_eq!(
        applies.len(),
        owned.len() + 1,
        "seven objects and the status: {writes:#?}"
    );
    assert!(applies.iter().all(|w| w.uri.contains("fieldManager=ankusa-operator")
        && w.uri.contains("force=true")), "{applies:#?}");
    // Each object under the Relay's own field manager; the status under the shared one.
    assert!(
        applies
            .iter()
            .all(|w| w.resource == "relays"
                || w.uri.contains("fieldManager=ankusa-operator%2Frelay")),
        "{applies:#?}"
    );
    assert!(writes.iter().all(|w| w.verb != "delete"), "{writes:#?}");
    let events = cluster::events(&admin, &ns).await;
    let created: Vec<_> = events
        .iter()
        .filter(|e| e.reason.as_deref() == Some("Created"))
        .collect();
    assert_eq!(created.len(), owned.len(), "{:#?}", events);
    assert!(created
        .iter()
        .all(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("relay")));
    // The status carries observedGeneration on itself and on every condition.
    let stored = Api::<Relay>::namespaced(admin.clone(), &ns)
        .get("relay")
        .await
        .unwrap();
    let status = serde_json::to_value(stored.status.unwrap()).unwrap();
    assert_eq!(status["observedGeneration"], 1);
    let conditions = status["conditions"].as_array().unwrap();
    assert!(conditions.len() >= 5);
    assert!(
        conditions.iter().all(|c| c["observedGeneration"] == 1),
        "{conditions:#?}"
    );
    assert_eq!(status["nodesReady"], "0/1");
}

/// Every object in `ns` with its resourceVersion, and the number of Events.
async fn versions(client: &Client, ns: &str) -> (Vec<(String, String)>, usize) {
    let mut out = Vec::new();
    macro_rules! collect {
        ($t:ty, $kind:expr) => {
            for o in Api::<$t>::namespaced(client.clone(), ns)
                .list(&ListParams::default())
                .await
                .unwrap()
                .items
            {
                out.push((
                    format!("{}/{}", $kind, o.name_any()),
                    o.resource_version().unwrap(),
                ));
            }
        };
    }
    collect!(Relay, "Relay");
    collect!(ConfigMap, "ConfigMap");
    collect!(Secret, "Secret");
    collect!(Service, "Service");
    collect!(StatefulSet, "StatefulSet");
    collect!(PodDisruptionBudget, "PodDisruptionBudget");
    out.sort();
    let events = cluster::events(client, ns).await.len();
    (out, events)
}

/// Four more reconciles of `name` leave every object of `ns` (and the Event count) as
/// they were.
async fn reconciles_write_nothing(ctx: &Arc<Context>, admin: &Client, ns: &str, name: &str) {
    let before = versions(admin, ns).await;
    for _ in 0..4 {
        reconcile(ctx, ns, name).await.unwrap();
        assert_eq!(
            versions(admin, ns).await,
            before,
            "a reconcile with nothing to do wrote"
        );
    }
}

/// On a server with no controllers nothing moves under the operator: after the first
/// reconcile, the second and three polls after it write nothing at all — the server's
/// defaulting (an empty `env` dropped, `1000m` CPU printed as `1`) is not drift.
#[tokio::test]
async fn second_reconcile_and_three_polls_write_nothing() {
    let (admin, ns, ctx) = set_up_bare(
        "noop",
        "full",
        json!({ "spec": { "resources": { "requests": { "cpu": "1000m", "memory": "0.5Gi" } } } }),
    )
    .await;
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    let sts = get_json::<StatefulSet>(&admin, &ns, "hooks").await.unwrap();
    // The server canonicalised the quantities the operator sent.
    assert_eq!(
        sts["spec"]["template"]["spec"]["containers"][0]["resources"]["requests"]["cpu"],
        "1"
    );
    reconciles_write_nothing(&ctx, &admin, &ns, "hooks").await;
    // A Relay without secretEnv: no `env: []` for the server to drop.
    create_relay(&admin, &ns, "minimal", json!({})).await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    reconciles_write_nothing(&ctx, &admin, &ns, "relay").await;
}

/// On the full control plane (controllers, scheduler, kwok nodes), once the world the
/// first reconcile made has settled, three polls write nothing (counted in the audit
/// log), with the ServiceMonitor served and applied.
#[tokio::test]
async fn polls_of_a_settled_relay_write_nothing() {
    let (admin, ns, ctx) = set_up("settled", "full", json!({ "spec": { "replicas": 2 } })).await;
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    assert!(service_monitor(&admin, &ns, "hooks").await.is_some());
    // The StatefulSet controller makes both pods (they wait for volumes: no provisioner).
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    cluster::eventually(Duration::from_secs(60), "two pods", || async {
        (pods.list(&ListParams::default()).await.unwrap().items.len() == 2).then_some(())
    })
    .await;
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    let audit = Audit::mark();
    for _ in 0..3 {
        reconcile(&ctx, &ns, "hooks").await.unwrap();
    }
    let writes = audit.writes(OPERATOR_USER, &ns);
    assert!(
        writes.is_empty(),
        "polls of a settled Relay wrote: {writes:#?}"
    );
}

#[tokio::test]
async fn drift_is_applied_back_and_a_removed_field_disappears() {
    let (admin, ns, ctx) = set_up("drift", "full", json!({})).await;
    reconcile(&ctx, &ns, "hooks").await.unwrap();

    // Someone scales the StatefulSet by hand and restarts it with kubectl.
    let sts_api: Api<StatefulSet> = Api::namespaced(admin.clone(), &ns);
    sts_api
        .patch(
            "hooks",
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": {
                "replicas": 4,
                "template": { "metadata": { "annotations": {
                    "kubectl.kubernetes.io/restartedAt": "2026-11-30T00:00:00Z" } } },
            } })),
        )
        .await
        .unwrap();
    let audit = Audit::mark();
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    let sts = sts_api.get("hooks").await.unwrap();
    let v = serde_json::to_value(&sts).unwrap();
    assert_eq!(v["spec"]["replicas"], 3);
    assert_eq!(
        v["spec"]["template"]["metadata"]["annotations"]["kubectl.kubernetes.io/restartedAt"],
        "2026-11-30T00:00:00Z",
        "another manager's annotation is not drift"
    );
    let writes = audit.writes(OPERATOR_USER, &ns);
    assert!(
        writes
            .iter()
            .any(|w| w.resource == "statefulsets" && w.verb == "patch"),
        "{writes:#?}"
    );
    let events = cluster::events(&admin, &ns).await;
    assert!(events.iter().any(|e| e.reason.as_deref() == Some("Updated")
        && e.note
            .as_deref()
            .unwrap_or("")
            .contains("StatefulSet/hooks")));

    // A field removed from the Relay's spec disappears from the owned object.
    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    relays
        .patch(
            "hooks",
            &PatchParams::default(),
            &Patch::Json::<()>(
                serde_json::from_value(json!([
                    { "op": "remove", "path": "/spec/resources" },
                    { "op": "remove", "path": "/spec/imagePullPolicy" },
                ]))
                .unwrap(),
            ),
        )
        .await
        .unwrap();
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    let v = serde_json::to_value(sts_api.get("hooks").await.unwrap()).unwrap();
    let container = &v["spec"]["template"]["spec"]["containers"][0];
    // The user's resources (a memory limit among them) gave way to the defaults.
    assert_eq!(
        container["resources"],
        json!({ "requests": { "cpu": "250m", "memory": "512Mi" } }),
        "resources stayed: {container:#}"
    );
    // imagePullPolicy is defaulted by the server once the operator stops setting it.
    assert_ne!(container["imagePullPolicy"], json!(null));
    let managed = v["metadata"]["managedFields"].to_string();
    assert!(
        !managed.contains("f:limits"),
        "the operator still owns the removed limits: {managed}"
    );
}

#[tokio::test]
async fn turning_monitoring_off_deletes_the_service_monitor() {
    let (admin, ns, ctx) = set_up("monitoring", "full", json!({})).await;
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    let sm = service_monitor(&admin, &ns, "hooks").await.unwrap();
    assert_eq!(sm.labels()["release"], "prometheus");
    assert_eq!(sm.data["spec"]["endpoints"][0]["interval"], "15s");
    assert_eq!(
        condition(&admin, &ns, "hooks", "ServiceMonitor").await["status"],
        "True"
    );

    // A ServiceMonitor of the same name that the Relay does not own is left alone.
    let other = create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "metadata": { "name": "other" } }),
    )
    .await;
    let foreign: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": { "name": "other", "namespace": ns },
        "spec": { "selector": { "matchLabels": { "app": "x" } }, "endpoints": [{ "port": "web" }] },
    }))
    .unwrap();
    let sm_api = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        &ns,
        &ankusa_operator::resources::service_monitor_resource(),
    );
    sm_api
        .create(&PostParams::default(), &foreign)
        .await
        .unwrap();
    reconcile(&ctx, &ns, &other.name_any()).await.unwrap();
    assert!(service_monitor(&admin, &ns, "other").await.is_some());

    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    relays
        .patch(
            "hooks",
            &PatchParams::default(),
            &Patch::Merge(
                json!({ "spec": { "monitoring": { "serviceMonitor": { "enabled": false } } } }),
            ),
        )
        .await
        .unwrap();
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    assert!(
        service_monitor(&admin, &ns, "hooks").await.is_none(),
        "the ServiceMonitor stayed"
    );
    let cond = condition(&admin, &ns, "hooks", "ServiceMonitor").await;
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "Disabled");
}

/// On the bare API server the Prometheus Operator's CRD is not installed.
#[tokio::test]
async fn missing_service_monitor_api_is_a_condition_not_an_error() {
    let (admin, ns, ctx) = set_up_bare("nosm", "full", json!({})).await;
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    let cond = condition(&admin, &ns, "hooks", "ServiceMonitor").await;
    assert_eq!(cond["status"], "False");
    assert_eq!(cond["reason"], "ApiNotServed");
    assert_eq!(cond["observedGeneration"], 1);
    assert!(get_json::<StatefulSet>(&admin, &ns, "hooks")
        .await
        .is_some());
}

#[tokio::test]
async fn malformed_relay_is_reported_on_itself() {
    // The CRD's schema refuses `replicas: "three"` at admission; what the operator can
    // still meet is an object that passes the schema but not its types, e.g. a Relay
    // stored under an older schema. Decode one as the watch would hand it over.
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "malformed").await;
    let relay = create_relay(&admin, &ns, "minimal", json!({})).await;
    let mut obj: DynamicObject =
        serde_json::from_value(serde_json::to_value(&relay).unwrap()).unwrap();
    obj.data["spec"]["replicas"] = json!("three");
    let ctx = context(op, NOWHERE);
    let audit = Audit::mark();
    let action = controller::reconcile_object(Arc::new(obj), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, kube::runtime::controller::Action::await_change());
    let writes = audit.writes(OPERATOR_USER, &ns);
    assert_eq!(writes.len(), 1, "only the Event: {writes:#?}");
    assert_eq!(writes[0].resource, "events");
    let events = cluster::events(&admin, &ns).await;
    assert!(
        events
            .iter()
            .any(|e| e.reason.as_deref() == Some("Malformed")
                && e.type_.as_deref() == Some("Warning"))
    );
    assert!(get_json::<StatefulSet>(&admin, &ns, "relay")
        .await
        .is_none());
    assert!(ctx
        .metrics
        .encode()
        .contains("ankusa_operator_reconcile_failures_total{reason=\"malformed\"} 1"));
}

#[tokio::test]
async fn missing_config_map_is_degraded_and_nothing_is_applied() {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "cmref").await;
    create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "spec": { "config": { "configMapRef": { "name": "mine" } } } }),
    )
    .await;
    let ctx = context(op, NOWHERE);
    reconcile(&ctx, &ns, "relay").await.unwrap();
    assert!(get_json::<StatefulSet>(&admin, &ns, "relay")
        .await
        .is_none());
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ConfigInvalid");
    assert!(degraded["message"]
        .as_str()
        .unwrap()
        .contains("ConfigMap mine does not exist"));

    // The user creates it: the next reconcile builds the relay from it.
    let cm: ConfigMap = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": { "name": "mine" },
        "data": { "relay.yaml": "dedupe:\n  window_ms: 5000\n" },
    }))
    .unwrap();
    Api::<ConfigMap>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &cm)
        .await
        .unwrap();
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let cm = get_json::<ConfigMap>(&admin, &ns, "relay-config")
        .await
        .unwrap();
    assert!(cm["data"]["relay.yaml"]
        .as_str()
        .unwrap()
        .contains("window_ms: 5000"));
}

/// A configuration the relay would refuse (a sink URL that is not http) is never applied:
/// no ConfigMap or StatefulSet reaches the nodes, `Degraded` quotes the relay's own error
/// naming the key; fixed, it is applied.
#[tokio::test]
async fn a_config_the_relay_would_refuse_is_degraded_and_never_applied() {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "badcfg").await;
    let bad = json!({
        "sinks": [{ "id": "s", "url": "ftp://billing.internal/hooks" }],
        "routes": [{ "id": "r", "sinks": ["s"] }],
    });
    create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "spec": { "config": { "inline": bad } } }),
    )
    .await;
    let ctx = context(op, NOWHERE);
    reconcile(&ctx, &ns, "relay").await.unwrap();
    assert!(get_json::<StatefulSet>(&admin, &ns, "relay")
        .await
        .is_none());
    assert!(get_json::<ConfigMap>(&admin, &ns, "relay-config")
        .await
        .is_none());
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ConfigInvalid");
    let msg = degraded["message"].as_str().unwrap();
    assert!(
        msg.contains("sinks[0].url") && msg.contains("http://"),
        "{msg}"
    );

    let api: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    api.patch(
        "relay",
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "config": { "inline": {
            "sinks": [{ "id": "s", "url": "http://billing.internal/hooks" }],
            "routes": [{ "id": "r", "sinks": ["s"] }],
        } } } })),
    )
    .await
    .unwrap();
    reconcile(&ctx, &ns, "relay").await.unwrap();
    assert!(get_json::<StatefulSet>(&admin, &ns, "relay")
        .await
        .is_some());
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
                    if pod.ends_with("-1") {
                        return (StatusCode::SERVICE_UNAVAILABLE, "{}".to_owned());
                    }
                    let s = NodeStatus {
                        version: "0.1.0".into(),
                        supported_format: 3,
                        store_format: 3,
                        migrating_to: None,
                        migration: None,
                        tenants: 2,
                        counters: Counters { pending: 5, dead: 1, ..Counters::default() },
                        oldest_due_at_ms: None,
                        write_error: None,
                        cluster: None,
                        store_bytes: None,
                        volume_free_bytes: None,
                        config: None,
                        tenants_paused: None,
                        tenants_over_quota: None,
        object_backups: None,
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

/// Bind each of `ns`'s pending claims to a PersistentVolume of its own: the test
/// control plane has no storage provisioner, and a pod waits for its volume.
pub async fn provision(admin: &Client, ns: &str) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), ns);
    let pvs: Api<PersistentVolume> = Api::all(admin.clone());
    for c in claims.list(&ListParams::default()).await.unwrap().items {
        let name = format!("{ns}-{}", c.name_any());
        if pvs.get_opt(&name).await.unwrap().is_some() {
            continue;
        }
        let spec = c.spec.clone().unwrap_or_default();
        let size = spec
            .resources
            .and_then(|r| r.requests)
            .and_then(|r| r.get("storage").cloned())
            .map(|q| q.0)
            .unwrap_or_else(|| "1Gi".into());
        let pv: PersistentVolume = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": { "name": name },
            "spec": {
                "capacity": { "storage": size },
                "accessModes": spec.access_modes.unwrap_or_default(),
                "storageClassName": spec.storage_class_name.unwrap_or_default(),
                "hostPath": { "path": format!("/tmp/ankusa-testenv-volumes/{name}") },
                "claimRef": { "namespace": ns, "name": c.name_any() },
                "persistentVolumeReclaimPolicy": "Retain",
            },
        }))
        .unwrap();
        pvs.create(&PostParams::default(), &pv).await.unwrap();
    }
}

/// Pods of `ns` that are Ready, once there are `n` of them (provisioning their volumes).
pub async fn wait_ready_pods(admin: &Client, ns: &str, n: usize) {
    let pods: Api<Pod> = Api::namespaced(admin.clone(), ns);
    cluster::eventually(
        Duration::from_secs(120),
        &format!("{n} ready pods in {ns}"),
        || async {
            provision(admin, ns).await;
            let list = pods.list(&ListParams::default()).await.unwrap();
            let ready = list
                .items
                .iter()
                .filter(|p| {
                    p.status
                        .as_ref()
                        .and_then(|s| s.conditions.as_ref())
                        .map(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                        .unwrap_or(false)
                })
                .count();
            (ready == n).then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn status_reports_each_node_and_a_silent_one_is_not_fatal() {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "status").await;
    let token = Arc::new(std::sync::Mutex::new(String::new()));
    let url = node_server(token.clone()).await;
    create_relay(&admin, &ns, "minimal", json!({ "spec": { "replicas": 2 } })).await;
    let ctx = context(op, &url);
    reconcile(&ctx, &ns, "relay").await.unwrap();
    // The token the operator made for itself is the one it polls with.
    let secret = Api::<Secret>::namespaced(admin.clone(), &ns)
        .get("relay-operator-token")
        .await
        .unwrap();
    let t = secret.data.unwrap()["token"].0.clone();
    *token.lock().unwrap() = String::from_utf8(t).unwrap();

    // kwok runs the pods once their volumes are bound.
    wait_ready_pods(&admin, &ns, 2).await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let relay = Api::<Relay>::namespaced(admin.clone(), &ns)
        .get("relay")
        .await
        .unwrap();
    let st = serde_json::to_value(relay.status.unwrap()).unwrap();
    assert_eq!(st["nodesReady"], "1/2", "{st:#}");
    assert_eq!(st["storeFormat"], 3);
    assert_eq!(st["nodes"][0]["ready"], true);
    assert_eq!(st["nodes"][0]["pending"], 5);
    assert_eq!(st["nodes"][1]["ready"], false);
    assert!(
        st["nodes"][1]["message"].as_str().unwrap().contains("503"),
        "{st:#}"
    );
    assert_eq!(st["tenants"]["count"], 2);
    assert_eq!(st["tenants"]["pending"], 5);
    assert_eq!(st["topTenants"][0]["tenant"], "acme");
    assert_eq!(st["phase"], "Degraded");
    let m = ctx.metrics.encode();
    assert!(
        m.contains("ankusa_operator_node_polls_total{outcome=\"ok\"} 1"),
        "{m}"
    );
    assert!(
        m.contains("ankusa_operator_node_polls_total{outcome=\"error\"} 1"),
        "{m}"
    );
}

/// An object the API server refuses (here a PodDisruptionBudget a quota forbids) is a
/// `Degraded`/`ApplyFailed` condition naming it; the rest of the reconcile goes on (the
/// StatefulSet is made, the status written), and it is applied once allowed.
#[tokio::test]
async fn a_refused_object_is_a_condition_and_the_rest_goes_on() {
    // The full server: its quota controller computes the quota's usage, without which the
    // quota is not enforced.
    let (admin, ns, ctx) = set_up("refused", "minimal", json!({})).await;
    let quotas: Api<k8s_openapi::api::core::v1::ResourceQuota> =
        Api::namespaced(admin.clone(), &ns);
    quotas
        .create(
            &Default::default(),
            &serde_json::from_value(json!({
                "metadata": { "name": "no-pdbs" },
                "spec": { "hard": { "count/poddisruptionbudgets.policy": "0" } },
            }))
            .unwrap(),
        )
        .await
        .unwrap();
    cluster::eventually(Duration::from_secs(30), "the quota's usage", || {
        let quotas = quotas.clone();
        async move {
            let q = quotas.get("no-pdbs").await.ok()?;
            q.status?.hard.map(|_| ())
        }
    })
    .await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ApplyFailed");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("PodDisruptionBudget create"),
        "{degraded:#}"
    );
    let sts: Api<StatefulSet> = Api::namespaced(admin.clone(), &ns);
    assert!(sts.get_opt("relay").await.unwrap().is_some());
    assert!(ctx.metrics.encode().contains("reason=\"forbidden\""));
    // The error policy of a failed reconcile backs off per object: 1 s, 2 s, 4 s … at most
    // 5 min.
    let obj = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        &ns,
        &controller::relay_api_resource(),
    )
    .get("relay")
    .await
    .unwrap();
    let obj = Arc::new(obj);
    let err = controller::Error::Malformed("x".into());
    let delays: Vec<_> = (0..3)
        .map(|_| controller::error_policy(obj.clone(), &err, ctx.clone()))
        .collect();
    assert_eq!(
        delays,
        [1, 2, 4].map(|s| kube::runtime::controller::Action::requeue(Duration::from_secs(s)))
    );
    assert_eq!(controller::backoff(40), Duration::from_secs(300));
    // Allowed again: the next reconcile applies it.
    quotas.delete("no-pdbs", &Default::default()).await.unwrap();
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_eq!(degraded["status"], "False", "{degraded:#}");
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), &ns);
    assert!(pdbs.get_opt("relay").await.unwrap().is_some());
}

/// The data claims' size as they ask for it, and the StatefulSet's template's.
async fn sizes(admin: &Client, ns: &str) -> (String, Option<String>) {
    let claim = Api::<PersistentVolumeClaim>::namespaced(admin.clone(), ns)
        .get("data-relay-0")
        .await
        .unwrap();
    let asked = claim.spec.unwrap().resources.unwrap().requests.unwrap()["storage"]
        .0
        .clone();
    let sts = Api::<StatefulSet>::namespaced(admin.clone(), ns)
        .get_opt("relay")
        .await
        .unwrap()
        .filter(|s| s.metadata.deletion_timestamp.is_none());
    let template = sts.map(|s| {
        s.spec.unwrap().volume_claim_templates.unwrap()[0]
            .spec
            .clone()
            .unwrap()
            .resources
            .unwrap()
            .requests
            .unwrap()["storage"]
            .0
            .clone()
    });
    (asked, template)
}

/// `spec.storage.size` grown on a StorageClass that allows expansion (one the test makes):
/// the bound data claim is patched to the new size and the StatefulSet made again with the
/// new template, its pod adopted as it runs (not restarted). On a class that does not
/// allow it, nothing changes and `Degraded` says why; a smaller size is never carried out.
#[tokio::test]
async fn a_grown_storage_size_expands_the_claims_where_the_class_allows_it() {
    use k8s_openapi::api::storage::v1::StorageClass;
    let admin = cluster::admin().await;
    let ns = cluster::namespace(&admin, "expand").await;
    let class = format!("expandable-{ns}");
    let classes: Api<StorageClass> = Api::all(admin.clone());
    let sc: StorageClass = serde_json::from_value(json!({
        "metadata": { "name": class },
        "provisioner": "kubernetes.io/no-provisioner",
        "allowVolumeExpansion": true,
        "volumeBindingMode": "Immediate",
    }))
    .unwrap();
    classes.create(&PostParams::default(), &sc).await.unwrap();
    create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "spec": { "replicas": 1, "storage": { "size": "1Gi", "storageClassName": class } } }),
    )
    .await;
    let (op, _) = cluster::operator_client().await;
    let ctx = context(op, NOWHERE);
    reconcile(&ctx, &ns, "relay").await.unwrap();
    wait_ready_pods(&admin, &ns, 1).await;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns);
    cluster::eventually(Duration::from_secs(60), "data-relay-0 bound", || async {
        let c = claims.get("data-relay-0").await.unwrap();
        (c.status.and_then(|s| s.phase).as_deref() == Some("Bound")).then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    let pod_uid = pods.get("relay-0").await.unwrap().uid();

    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    merge_spec(
        &relays,
        "relay",
        json!({ "spec": { "storage": { "size": "2Gi" } } }),
    )
    .await;
    cluster::eventually(
        Duration::from_secs(90),
        "the StatefulSet made again at 2Gi",
        || async {
            // A reconcile may fail while the StatefulSet goes (it is made again after).
            let _ = reconcile(&ctx, &ns, "relay").await;
            let (asked, template) = sizes(&admin, &ns).await;
            (asked == "2Gi" && template.as_deref() == Some("2Gi")).then_some(())
        },
    )
    .await;
    // The pod ran on: adopted by the new StatefulSet, never replaced.
    cluster::eventually(Duration::from_secs(60), "relay-0 adopted", || async {
        let p = pods.get("relay-0").await.unwrap();
        let owned = p
            .owner_references()
            .iter()
            .any(|r| r.kind == "StatefulSet" && r.controller == Some(true));
        owned.then_some(p.uid())
    })
    .await;
    assert_eq!(pods.get("relay-0").await.unwrap().uid(), pod_uid);
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_ne!(degraded["reason"], "StorageChangePending", "{degraded:#}");

    // What a size asked for leaves pending: the Degraded message.
    let pending = |size: &'static str| {
        let (relays, ctx, admin, ns) = (&relays, &ctx, &admin, &ns);
        async move {
            merge_spec(
                relays,
                "relay",
                json!({ "spec": { "storage": { "size": size } } }),
            )
            .await;
            reconcile(ctx, ns, "relay").await.unwrap();
            let degraded = condition(admin, ns, "relay", "Degraded").await;
            assert_eq!(degraded["reason"], "StorageChangePending", "{degraded:#}");
            degraded["message"].as_str().unwrap().to_owned()
        }
    };
    // A smaller size: never carried out.
    let message = pending("1Gi").await;
    assert!(message.contains("never shrinks"), "{message}");
    // The class no longer allows it: nothing changes, and the condition says why.
    classes
        .patch(
            &class,
            &PatchParams::default(),
            &Patch::Merge(json!({ "allowVolumeExpansion": false })),
        )
        .await
        .unwrap();
    let message = pending("3Gi").await;
    assert!(
        message.contains(&format!(
            "StorageClass {class} does not allow volume expansion"
        )) && message.contains("--cascade=orphan"),
        "{message}"
    );
    assert_eq!(
        sizes(&admin, &ns).await,
        ("2Gi".to_owned(), Some("2Gi".to_owned()))
    );
    classes.delete(&class, &Default::default()).await.unwrap();
}

/// A StatefulSet's claim templates are immutable: a changed `spec.storage` is not applied
/// (the templates stay as they are, nothing is refused), and the condition says what to do.
#[tokio::test]
async fn a_storage_change_is_a_condition_that_says_what_to_do() {
    let (admin, ns, ctx) = set_up_bare("storage", "minimal", json!({})).await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    merge_spec(
        &relays,
        "relay",
        json!({ "spec": { "storage": { "size": "50Gi" } } }),
    )
    .await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "StorageChangePending");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("50Gi") && message.contains("--cascade=orphan"),
        "{message}"
    );
    let sts: Api<StatefulSet> = Api::namespaced(admin.clone(), &ns);
    let live = sts.get("relay").await.unwrap();
    let size = &live.spec.unwrap().volume_claim_templates.unwrap()[0]
        .spec
        .clone()
        .unwrap()
        .resources
        .unwrap()
        .requests
        .unwrap()["storage"];
    assert_eq!(size.0, "10Gi");
    // Back to the size the claims have: nothing to do.
    merge_spec(
        &relays,
        "relay",
        json!({ "spec": { "storage": { "size": "10Gi" } } }),
    )
    .await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    assert_eq!(
        condition(&admin, &ns, "relay", "Degraded").await["status"],
        "False"
    );
}

/// The controller's watch loop on the real server's watches: two Relays, each
/// reconciled, and a change to an owned object brings it back.
#[tokio::test]
async fn the_watch_loop_reconciles_and_repairs() {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "watch").await;
    create_relay(&admin, &ns, "minimal", json!({})).await;
    create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "metadata": { "name": "second" } }),
    )
    .await;
    let ctx = context(op, NOWHERE);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let run = tokio::spawn(controller::run(ctx, Some(ns.clone()), async move {
        let _ = stop_rx.await;
    }));
    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    for name in ["relay", "second"] {
        cluster::eventually(
            Duration::from_secs(30),
            &format!("{name} reconciled"),
            || async {
                let r = relays.get(name).await.unwrap();
                (r.status.is_some() && get_json::<StatefulSet>(&admin, &ns, name).await.is_some())
                    .then_some(())
            },
        )
        .await;
    }
    // Someone deletes the client Service: the watch on owned objects brings it back.
    Api::<Service>::namespaced(admin.clone(), &ns)
        .delete("second", &Default::default())
        .await
        .unwrap();
    cluster::eventually(Duration::from_secs(30), "the Service recreated", || async {
        get_json::<Service>(&admin, &ns, "second").await.map(|_| ())
    })
    .await;
    let _ = stop_tx.send(());
    tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .unwrap()
        .unwrap();
}

/// `backup.destination.claimTemplate`: the operator (as its ServiceAccount) makes a
/// backup claim per node, with no owner (deleting the Relay leaves the backups), and
/// leaves one that exists alone.
#[tokio::test]
async fn a_claim_template_makes_a_backup_claim_per_node() {
    let (admin, ns, ctx) = set_up(
        "bkclaims",
        "minimal",
        json!({ "spec": { "replicas": 2, "backup": { "destination": {
            "claimTemplate": { "size": "3Gi", "storageClassName": "nowhere" } } } } }),
    )
    .await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(admin.clone(), &ns);
    for i in 0..2 {
        let c = claims.get(&format!("relay-backups-{i}")).await.unwrap();
        let spec = c.spec.unwrap();
        assert_eq!(spec.storage_class_name.as_deref(), Some("nowhere"));
        assert_eq!(
            spec.resources.unwrap().requests.unwrap()["storage"].0,
            "3Gi"
        );
        assert!(c.metadata.owner_references.unwrap_or_default().is_empty());
    }
    // A second reconcile makes nothing more.
    let audit = Audit::mark();
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let created: Vec<_> = audit
        .writes(OPERATOR_USER, &ns)
        .into_iter()
        .filter(|w| w.resource == "persistentvolumeclaims")
        .collect();
    assert!(created.is_empty(), "{created:#?}");
}

/// `ankusa.dev/reconcile: paused` stops every change to that Relay: a reconcile writes only
/// its status (`Reconciling` False, `Paused`) and one Event, creates nothing, and a second
/// writes nothing at all; the annotation removed, the next reconcile creates its objects.
#[tokio::test]
async fn a_paused_relay_is_left_as_it_is_until_the_annotation_goes() {
    let (admin, ns, ctx) = set_up(
        "paused",
        "minimal",
        json!({ "metadata": { "annotations": { "ankusa.dev/reconcile": "paused" } } }),
    )
    .await;
    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    let audit = Audit::mark();
    controller::reconcile(Arc::new(relays.get("relay").await.unwrap()), ctx.clone())
        .await
        .unwrap();
    let writes = audit.writes(OPERATOR_USER, &ns);
    let mut resources: Vec<&str> = writes.iter().map(|w| w.resource.as_str()).collect();
    resources.sort();
    assert_eq!(resources, ["events", "relays"], "{writes:#?}");
    assert!(get_json::<StatefulSet>(&admin, &ns, "relay")
        .await
        .is_none());
    let r = relays.get("relay").await.unwrap();
    let c = r
        .status
        .as_ref()
        .and_then(|s| {
            s.conditions
                .iter()
                .find(|c| c.type_ == "Reconciling")
                .cloned()
        })
        .expect("a Reconciling condition");
    assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Paused"));
    let audit = Audit::mark();
    controller::reconcile(Arc::new(r), ctx.clone())
        .await
        .unwrap();
    assert!(
        audit.writes(OPERATOR_USER, &ns).is_empty(),
        "a paused Relay again: nothing"
    );
    // Resumed.
    relays
        .patch(
            "relay",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(
                json!({ "metadata": { "annotations": { "ankusa.dev/reconcile": null } } }),
            ),
        )
        .await
        .unwrap();
    controller::reconcile(Arc::new(relays.get("relay").await.unwrap()), ctx)
        .await
        .unwrap();
    assert!(get_json::<StatefulSet>(&admin, &ns, "relay")
        .await
        .is_some());
}
