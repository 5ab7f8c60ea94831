//! How providers reach a Relay and who may reach its pods, on the real control plane:
//! the ingest Service, the Ingress and the Gateway API HTTPRoute (its CRDs installed from
//! their module), and the NetworkPolicy — whose every rule is read back from the API
//! server and evaluated against real pods through the API server's own label selection.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use ankusa_crds::relay::Relay;
use ankusa_operator::controller::{Context, Settings};
use ankusa_operator::metrics::Metrics;
use ankusa_operator::resources::{self, OperatorPeer};
use k8s_openapi::api::core::v1::{Namespace, Pod, Service};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use kube::api::{Api, DynamicObject, ListParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use crate::cluster;
use crate::reconcile::{condition, create_relay, get_json, merge_spec, reconcile, NOWHERE};

/// An operator context whose nodes answer nothing, with `operator` as its identity.
fn context_as(client: Client, operator: OperatorPeer) -> Arc<Context> {
    let settings = Settings {
        node_url_template: NOWHERE.into(),
        node_timeout: Duration::from_millis(500),
        operator,
        ..Settings::default()
    };
    Context::new(client, Arc::new(Metrics::default()), settings)
}

async fn http_route(client: &Client, ns: &str, name: &str) -> Option<DynamicObject> {
    Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resources::http_route_resource())
        .get_opt(name)
        .await
        .unwrap()
}

#[tokio::test]
async fn ingest_service_ingress_and_http_route_are_applied_changed_and_removed() {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "expose").await;
    create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "spec": { "ingest": {
            "service": {
                "type": "LoadBalancer",
                "annotations": { "example.com/lb-scheme": "internet-facing" },
                "externalTrafficPolicy": "Local",
                "loadBalancerSourceRanges": ["192.0.2.0/24"],
            },
            "ingress": {
                "host": "hooks.example.com",
                "className": "nginx",
                "tlsSecretName": "hooks-tls",
                "annotations": { "cert-manager.io/cluster-issuer": "letsencrypt" },
            },
            "httpRoute": {
                "parentRefs": [{ "name": "public", "namespace": "gateways", "sectionName": "https" }],
                "hostnames": ["hooks.example.com"],
            },
        } } }),
    )
    .await;
    let ctx = context_as(op, OperatorPeer::default());
    reconcile(&ctx, &ns, "relay").await.unwrap();

    // The ingest Service carries the ingest port only: a LoadBalancer never exposes admin.
    let svc = get_json::<Service>(&admin, &ns, "relay-ingest")
        .await
        .unwrap();
    assert_eq!(svc["spec"]["type"], "LoadBalancer");
    assert_eq!(svc["spec"]["externalTrafficPolicy"], "Local");
    assert_eq!(
        svc["spec"]["loadBalancerSourceRanges"],
        json!(["192.0.2.0/24"])
    );
    assert_eq!(
        svc["metadata"]["annotations"]["example.com/lb-scheme"],
        "internet-facing"
    );
    let ports = svc["spec"]["ports"].as_array().unwrap();
    assert_eq!(ports.len(), 1, "{ports:#?}");
    assert_eq!(ports[0]["port"], resources::INGEST_PORT);
    assert!(ports[0]["nodePort"].as_i64().is_some(), "{ports:#?}");
    assert_eq!(
        svc["spec"]["selector"],
        json!(resources::selector_labels("relay"))
    );

    let ing = get_json::<Ingress>(&admin, &ns, "relay-ingest")
        .await
        .unwrap();
    assert_eq!(ing["spec"]["ingressClassName"], "nginx");
    let rule = &ing["spec"]["rules"][0];
    assert_eq!(rule["host"], "hooks.example.com");
    assert_eq!(rule["http"]["paths"][0]["path"], "/ingest");
    assert_eq!(rule["http"]["paths"][0]["pathType"], "Prefix");
    assert_eq!(
        rule["http"]["paths"][0]["backend"]["service"],
        json!({ "name": "relay-ingest", "port": { "name": "ingest" } })
    );
    assert_eq!(
        ing["spec"]["tls"],
        json!([{ "hosts": ["hooks.example.com"], "secretName": "hooks-tls" }])
    );

    // The HTTPRoute passed the Gateway API CRD's own schema and rules.
    let route = http_route(&admin, &ns, "relay-ingest").await.unwrap();
    let spec = &route.data["spec"];
    assert_eq!(spec["hostnames"], json!(["hooks.example.com"]));
    assert_eq!(spec["parentRefs"][0]["name"], "public");
    assert_eq!(spec["parentRefs"][0]["namespace"], "gateways");
    assert_eq!(spec["parentRefs"][0]["sectionName"], "https");
    assert_eq!(
        spec["rules"][0]["matches"][0]["path"],
        json!({ "type": "PathPrefix", "value": "/ingest" })
    );
    assert_eq!(spec["rules"][0]["backendRefs"][0]["name"], "relay-ingest");
    assert_eq!(
        spec["rules"][0]["backendRefs"][0]["port"],
        resources::INGEST_PORT
    );
    assert_eq!(
        condition(&admin, &ns, "relay", "Degraded").await["status"],
        "False"
    );

    // Taken out of the spec, the Ingress and the HTTPRoute go and the Service is a
    // ClusterIP again; an Ingress of another owner with the same name would stay.
    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    merge_spec(
        &relays,
        "relay",
        json!({ "spec": { "ingest": { "service": null, "ingress": null, "httpRoute": null } } }),
    )
    .await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    assert!(get_json::<Ingress>(&admin, &ns, "relay-ingest")
        .await
        .is_none());
    assert!(http_route(&admin, &ns, "relay-ingest").await.is_none());
    let svc = get_json::<Service>(&admin, &ns, "relay-ingest")
        .await
        .unwrap();
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    assert!(
        svc["spec"].get("loadBalancerSourceRanges").is_none(),
        "{svc:#}"
    );
}

#[tokio::test]
async fn an_http_route_on_a_cluster_without_the_gateway_api_is_a_condition() {
    let admin = cluster::bare_admin().await;
    let op = cluster::bare_operator_client().await;
    let ns = cluster::namespace(&admin, "noroute").await;
    create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "spec": { "ingest": { "httpRoute": { "parentRefs": [{ "name": "public" }] } } } }),
    )
    .await;
    let ctx = context_as(op, OperatorPeer::default());
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "HTTPRouteNotServed", "{degraded:#}");
    // Everything else was applied.
    assert!(get_json::<Service>(&admin, &ns, "relay-ingest")
        .await
        .is_some());
}

/// A pod `name` in `ns` with `pod_labels`.
async fn pod_in(admin: &Client, ns: &str, name: &str, pod_labels: Value) {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "labels": pod_labels },
        // Nothing runs it: the real node's taint keeps it off, and no kwok node takes a
        // pod that names a node that does not exist.
        "spec": { "nodeName": "no-such-node", "containers": [{ "name": "c", "image": "none" }] },
    }))
    .unwrap();
    Api::<Pod>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
}

/// `selector` (a LabelSelector) in the query syntax of `?labelSelector=`.
fn selector_query(selector: &Value) -> String {
    let mut terms = Vec::new();
    if let Some(m) = selector["matchLabels"].as_object() {
        for (k, v) in m {
            terms.push(format!("{k}={}", v.as_str().unwrap()));
        }
    }
    if let Some(exprs) = selector["matchExpressions"].as_array() {
        for e in exprs {
            let key = e["key"].as_str().unwrap();
            let values = || {
                e["values"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_str().unwrap())
                    .collect::<Vec<_>>()
                    .join(",")
            };
            terms.push(match e["operator"].as_str().unwrap() {
                "In" => format!("{key} in ({})", values()),
                "NotIn" => format!("{key} notin ({})", values()),
                "Exists" => key.to_owned(),
                "DoesNotExist" => format!("!{key}"),
                other => panic!("operator {other}"),
            });
        }
    }
    terms.join(",")
}

/// The pods (`namespace/name`) `selector` selects in namespace `ns`, as the API server
/// selects them.
async fn pods_selected(admin: &Client, ns: &str, selector: &Value) -> BTreeSet<String> {
    Api::<Pod>::namespaced(admin.clone(), ns)
        .list(&ListParams::default().labels(&selector_query(selector)))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| format!("{ns}/{}", p.metadata.name.unwrap()))
        .collect()
}

/// The pods a NetworkPolicy peer selects, in the policy's namespace `ns` unless it has a
/// namespace selector, everywhere the test made pods (`namespaces`).
async fn peer_pods(
    admin: &Client,
    ns: &str,
    peer: &Value,
    namespaces: &[String],
) -> BTreeSet<String> {
    assert!(
        peer.get("ipBlock").is_none(),
        "no ipBlock peers here: {peer:#}"
    );
    let pod_selector = peer.get("podSelector").cloned().unwrap_or(json!({}));
    let in_namespaces: Vec<String> = match peer.get("namespaceSelector") {
        None => vec![ns.to_owned()],
        Some(sel) => {
            let selected: BTreeSet<String> = Api::<Namespace>::all(admin.clone())
                .list(&ListParams::default().labels(&selector_query(sel)))
                .await
                .unwrap()
                .items
                .into_iter()
                .map(|n| n.metadata.name.unwrap())
                .collect();
            namespaces
                .iter()
                .filter(|n| selected.contains(*n))
                .cloned()
                .collect()
        }
    };
    let mut out = BTreeSet::new();
    for n in in_namespaces {
        out.extend(pods_selected(admin, &n, &pod_selector).await);
    }
    out
}

/// Who the policy admits on `port` (by name), among the pods in `namespaces`.
async fn admitted(
    admin: &Client,
    ns: &str,
    policy: &Value,
    port: &str,
    namespaces: &[String],
) -> BTreeSet<String> {
    let mut everyone = BTreeSet::new();
    for n in namespaces {
        everyone.extend(pods_selected(admin, n, &json!({})).await);
    }
    let mut out = BTreeSet::new();
    for rule in policy["spec"]["ingress"].as_array().unwrap() {
        let covers = rule["ports"]
            .as_array()
            .is_none_or(|ports| ports.iter().any(|p| p["port"] == port));
        if !covers {
            continue;
        }
        match rule.get("from").and_then(Value::as_array) {
            None => out.extend(everyone.iter().cloned()),
            Some(peers) => {
                for peer in peers {
                    out.extend(peer_pods(admin, ns, peer, namespaces).await);
                }
            }
        }
    }
    out
}

#[tokio::test]
async fn the_network_policy_admits_exactly_the_relays_own_traffic() {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "netpol").await;
    // Where the operator runs, where Prometheus runs, where the providers' proxy runs.
    let operator_ns = cluster::namespace(&admin, "netpol-op").await;
    let monitoring_ns = cluster::namespace(&admin, "netpol-mon").await;
    let providers_ns = cluster::namespace_with(
        &admin,
        "netpol-edge",
        json!({ "ankusa.dev/test-role": "providers" }),
    )
    .await;
    create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "spec": { "replicas": 2, "backup": { "destination": { "claimName": "backups" } }, "networkPolicy": {
            "enabled": true,
            "ingestFrom": [{ "namespaceSelector": { "matchLabels": { "ankusa.dev/test-role": "providers" } } }],
            "adminFrom": [{ "podSelector": { "matchLabels": { "role": "oncall-shell" } } }],
        } } }),
    )
    .await;
    let operator = OperatorPeer::from_parts(
        Some(operator_ns.clone()),
        Some("app.kubernetes.io/name=ankusa-operator,app.kubernetes.io/instance=ankusa"),
    );
    let ctx = context_as(op, operator.clone());
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let policy = get_json::<NetworkPolicy>(&admin, &ns, "relay")
        .await
        .unwrap();
    assert_eq!(policy["spec"]["policyTypes"], json!(["Ingress"]));

    // The pods, each with the labels its maker gives it: the relay pods from the
    // StatefulSet's template, a backup Job's pod from the Job's, the operator's from the
    // chart's.
    let sts: Value = get_json::<k8s_openapi::api::apps::v1::StatefulSet>(&admin, &ns, "relay")
        .await
        .unwrap();
    let relay_labels = sts["spec"]["template"]["metadata"]["labels"].clone();
    let relay: Relay = Api::namespaced(admin.clone(), &ns)
        .get("relay")
        .await
        .unwrap();
    let job = resources::backup_job(
        &relay,
        "relay-backup-0-x",
        0,
        "img",
        resources::BackupSource::Node("http://relay-0:9090"),
    )
    .unwrap();
    let job_labels =
        serde_json::to_value(&job).unwrap()["spec"]["template"]["metadata"]["labels"].clone();
    let mut other_relay = relay_labels.clone();
    other_relay["app.kubernetes.io/instance"] = json!("other");
    let mut other_job = job_labels.clone();
    other_job["app.kubernetes.io/instance"] = json!("other");
    let operator_labels = json!(operator.labels);
    // The relay pods are the StatefulSet controller's own (Parallel: both at once).
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    for _ in 0..300 {
        let have = pods.list(&ListParams::default()).await.unwrap().items.len();
        if have >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for name in ["relay-0", "relay-1"] {
        pods.get(name).await.unwrap();
    }
    pod_in(&admin, &ns, "relay-backup", job_labels).await;
    pod_in(&admin, &ns, "other-0", other_relay).await;
    pod_in(&admin, &ns, "other-backup", other_job).await;
    pod_in(&admin, &ns, "app", json!({ "app": "web" })).await;
    pod_in(&admin, &ns, "oncall", json!({ "role": "oncall-shell" })).await;
    // The operator's labels in the wrong namespace are not the operator.
    pod_in(&admin, &ns, "fake-operator", operator_labels.clone()).await;
    pod_in(&admin, &operator_ns, "operator", operator_labels).await;
    pod_in(
        &admin,
        &monitoring_ns,
        "prometheus",
        json!({ "app.kubernetes.io/name": "prometheus" }),
    )
    .await;
    pod_in(
        &admin,
        &monitoring_ns,
        "grafana",
        json!({ "app.kubernetes.io/name": "grafana" }),
    )
    .await;
    pod_in(
        &admin,
        &providers_ns,
        "edge-proxy",
        json!({ "app": "edge" }),
    )
    .await;
    let namespaces = [
        ns.clone(),
        operator_ns.clone(),
        monitoring_ns.clone(),
        providers_ns.clone(),
    ];

    // The policy applies to the relay pods alone (not the Jobs', not another Relay's).
    assert_eq!(
        pods_selected(&admin, &ns, &policy["spec"]["podSelector"]).await,
        set(&[&format!("{ns}/relay-0"), &format!("{ns}/relay-1")])
    );
    assert_eq!(
        admitted(&admin, &ns, &policy, "ingest", &namespaces).await,
        set(&[
            &format!("{ns}/relay-0"),
            &format!("{ns}/relay-1"),
            &format!("{providers_ns}/edge-proxy"),
        ]),
        "ingest: the providers and the other nodes (forwards)"
    );
    assert_eq!(
        admitted(&admin, &ns, &policy, "admin", &namespaces).await,
        set(&[
            &format!("{ns}/relay-0"),
            &format!("{ns}/relay-1"),
            &format!("{ns}/relay-backup"),
            &format!("{ns}/oncall"),
            &format!("{operator_ns}/operator"),
            &format!("{monitoring_ns}/prometheus"),
        ]),
        "admin: the nodes, the operator, this Relay's backup Jobs, the scrapers, adminFrom"
    );

    // With ingestFrom empty, ingest is open to any source (a public webhook endpoint).
    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    merge_spec(
        &relays,
        "relay",
        json!({ "spec": { "networkPolicy": { "ingestFrom": null } } }),
    )
    .await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let policy = get_json::<NetworkPolicy>(&admin, &ns, "relay")
        .await
        .unwrap();
    let all = admitted(&admin, &ns, &policy, "ingest", &namespaces).await;
    assert_eq!(all.len(), 12, "{all:#?}");

    // Turned off, the policy goes.
    merge_spec(
        &relays,
        "relay",
        json!({ "spec": { "networkPolicy": { "enabled": false } } }),
    )
    .await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    assert!(get_json::<NetworkPolicy>(&admin, &ns, "relay")
        .await
        .is_none());
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| (*s).to_owned()).collect()
}
