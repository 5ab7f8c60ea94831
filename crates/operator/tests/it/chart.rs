//! The Helm chart, rendered and linted by the real Helm engine (`scripts/render-chart.py`,
//! helm-python-sdk, installed by `scripts/install-deps.sh`): every rendered document parses
//! as its Kubernetes type without a field the type does not know, RBAC is exactly what the
//! code uses, and the CRD template is the generated CRD with `helm.sh/resource-policy: keep`.

use std::collections::BTreeSet;
use std::process::Command;

use ankusa_operator::observed::contains;
use ankusa_operator::rbac::{CLUSTER_RULES, LEADER_RULES};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::support::root;

fn render(values: Value) -> Vec<Value> {
    render_in("ankusa-system", values)
}

/// The chart rendered as an install into namespace `ns`.
fn render_in(ns: &str, values: Value) -> Vec<Value> {
    let out = Command::new("python3")
        .arg(root().join("scripts/render-chart.py"))
        .arg(root().join("charts/ankusa"))
        .arg("--values-json")
        .arg(values.to_string())
        .args(["--namespace", ns])
        .output()
        .expect("python3 runs");
    assert!(
        out.status.success(),
        "the chart does not lint or render:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    documents(&out.stdout)
}

/// The documents of a rendered YAML stream (empty ones left out).
fn documents(stream: &[u8]) -> Vec<Value> {
    let text = std::str::from_utf8(stream).unwrap();
    serde_yaml::Deserializer::from_str(text)
        .map(|d| Value::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// `doc` as a `T`, with nothing lost on the way (an unknown or misplaced field would be).
fn parse<T: DeserializeOwned + serde::Serialize>(doc: &Value) -> T {
    let t: T = serde_json::from_value(doc.clone())
        .unwrap_or_else(|e| panic!("{} does not parse: {e}", doc["kind"]));
    let back = serde_json::to_value(&t).unwrap();
    assert!(
        contains(&back, doc),
        "{} {} has a field its type does not know:\n{}",
        doc["kind"],
        doc["metadata"]["name"],
        serde_yaml::to_string(doc).unwrap()
    );
    t
}

fn check_all(docs: &[Value]) {
    for doc in docs {
        match doc["kind"].as_str().unwrap() {
            "Deployment" => drop(parse::<Deployment>(doc)),
            "ServiceAccount" => drop(parse::<ServiceAccount>(doc)),
            "Service" => drop(parse::<Service>(doc)),
            "ClusterRole" => drop(parse::<ClusterRole>(doc)),
            "ClusterRoleBinding" => drop(parse::<ClusterRoleBinding>(doc)),
            "Role" => drop(parse::<Role>(doc)),
            "RoleBinding" => drop(parse::<RoleBinding>(doc)),
            "CustomResourceDefinition" => drop(parse::<CustomResourceDefinition>(doc)),
            "ConfigMap" => drop(parse::<ConfigMap>(doc)),
            // No Rust type: its spec is checked against the rules file it is made from.
            "PrometheusRule" => {
                assert_eq!(doc["apiVersion"], "monitoring.coreos.com/v1");
                assert!(doc["spec"]["groups"].is_array());
            }
            other => panic!("the chart renders an unexpected kind {other}"),
        }
    }
}

fn kinds(docs: &[Value]) -> Vec<String> {
    docs.iter()
        .map(|d| d["kind"].as_str().unwrap().to_owned())
        .collect()
}

fn find<'a>(docs: &'a [Value], kind: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind}"))
}

type Grant = (String, String, BTreeSet<String>);

fn grants(rules: &[PolicyRule]) -> BTreeSet<Grant> {
    let mut out = BTreeSet::new();
    for r in rules {
        for g in r.api_groups.clone().unwrap_or_default() {
            for res in r.resources.clone().unwrap_or_default() {
                out.insert((g.clone(), res, r.verbs.iter().cloned().collect()));
            }
        }
    }
    out
}

fn expected(rules: &[(&str, &str, &[&str])]) -> BTreeSet<Grant> {
    rules
        .iter()
        .map(|(g, r, v)| {
            (
                (*g).to_owned(),
                (*r).to_owned(),
                v.iter().map(|s| (*s).to_owned()).collect(),
            )
        })
        .collect()
}

#[test]
fn chart_renders_kubernetes_objects() {
    let docs = render(json!({}));
    check_all(&docs);
    let mut k = kinds(&docs);
    k.sort();
    assert_eq!(
        k,
        [
            "ClusterRole",
            "ClusterRoleBinding",
            "CustomResourceDefinition",
            "Deployment",
            "Role",
            "RoleBinding",
            "Service",
            "ServiceAccount"
        ]
    );
    let deploy: Deployment = parse(find(&docs, "Deployment"));
    let spec = deploy.spec.unwrap();
    assert_eq!(spec.replicas, Some(2));
    let pod = spec.template.spec.unwrap();
    let c = &pod.containers[0];
    assert_eq!(c.args.as_deref(), Some(&["run".to_owned()][..]));
    let env: Vec<String> = c
        .env
        .clone()
        .unwrap()
        .iter()
        .map(|e| e.name.clone())
        .collect();
    assert!(env.contains(&"POD_NAME".to_owned()) && env.contains(&"POD_NAMESPACE".to_owned()));
    assert_eq!(pod.service_account_name.as_deref(), Some("ankusa"));
}

#[test]
fn chart_rbac_is_exactly_what_the_code_uses() {
    let docs = render(json!({}));
    let cluster: ClusterRole = parse(find(&docs, "ClusterRole"));
    let granted = grants(&cluster.rules.unwrap_or_default());
    assert_eq!(granted, expected(CLUSTER_RULES));
    let role: Role = parse(find(&docs, "Role"));
    assert_eq!(grants(&role.rules.unwrap()), expected(LEADER_RULES));
    // The deletes are of the optional objects a spec can stop asking for (a
    // ServiceMonitor, an Ingress, an HTTPRoute, a NetworkPolicy), and a node restore's:
    // the StatefulSet (deleted with its pods orphaned) and the one pod it restores. No
    // store, Service, Secret or claim can be deleted by the operator.
    let optional = [
        ("monitoring.coreos.com", "servicemonitors"),
        ("networking.k8s.io", "ingresses"),
        ("networking.k8s.io", "networkpolicies"),
        ("gateway.networking.k8s.io", "httproutes"),
        ("apps", "statefulsets"),
        ("", "pods"),
    ];
    for (group, resource, verbs) in granted {
        assert!(!verbs.contains("deletecollection"), "{group}/{resource}");
        if verbs.contains("delete") {
            assert!(
                optional.contains(&(group.as_str(), resource.as_str())),
                "{group}/{resource} may be deleted"
            );
        }
    }
}

/// With `watchNamespace` the operator's grant is a Role in that namespace, bound to the
/// release's ServiceAccount: the same rules, and nothing cluster-wide (no Secret of another
/// namespace). `e2e/run.sh` runs the operator with it against the real API server.
#[test]
fn one_watched_namespace_is_granted_a_role_not_a_cluster_role() {
    let docs = render(json!({ "watchNamespace": "payments" }));
    check_all(&docs);
    let k = kinds(&docs);
    assert!(!k.contains(&"ClusterRole".to_owned()), "{k:?}");
    assert!(!k.contains(&"ClusterRoleBinding".to_owned()), "{k:?}");
    let named = |kind: &str, name: &str| {
        docs.iter()
            .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name}"))
    };
    let role: Role = parse(named("Role", "ankusa"));
    assert_eq!(role.metadata.namespace.as_deref(), Some("payments"));
    assert_eq!(grants(&role.rules.unwrap()), expected(CLUSTER_RULES));
    let binding: RoleBinding = parse(named("RoleBinding", "ankusa"));
    assert_eq!(binding.metadata.namespace.as_deref(), Some("payments"));
    assert_eq!(
        (
            binding.role_ref.kind.as_str(),
            binding.role_ref.name.as_str()
        ),
        ("Role", "ankusa")
    );
    let subject = &binding.subjects.unwrap()[0];
    assert_eq!(
        (subject.name.as_str(), subject.namespace.as_deref()),
        ("ankusa", Some("ankusa-system"))
    );
    let leader: Role = parse(named("Role", "ankusa-leader"));
    assert_eq!(leader.metadata.namespace.as_deref(), Some("ankusa-system"));
}

/// Two installs of one release name in two namespaces: their cluster-scoped objects have
/// different names, and each binding grants its own role to its own ServiceAccount.
#[test]
fn installs_in_two_namespaces_do_not_share_cluster_objects() {
    let names = |ns: &str| {
        let docs = render_in(ns, json!({}));
        let role: ClusterRole = parse(find(&docs, "ClusterRole"));
        let binding: ClusterRoleBinding = parse(find(&docs, "ClusterRoleBinding"));
        assert_eq!(binding.role_ref.name, role.metadata.name.clone().unwrap());
        let subject = &binding.subjects.unwrap()[0];
        assert_eq!(subject.namespace.as_deref(), Some(ns));
        (role.metadata.name.unwrap(), binding.metadata.name.unwrap())
    };
    let (a, b) = (names("payments"), names("billing"));
    assert_eq!(a.0, "payments-ankusa");
    assert_ne!(a.0, b.0);
    assert_ne!(a.1, b.1);
}

#[test]
fn chart_crd_is_the_generated_crd_kept_on_uninstall() {
    let docs = render(json!({}));
    let crd = find(&docs, "CustomResourceDefinition");
    assert_eq!(
        crd["metadata"]["annotations"]["helm.sh/resource-policy"],
        "keep"
    );
    let mut generated = serde_json::to_value(ankusa_crds::relay::Relay::crd()).unwrap();
    generated["metadata"]["annotations"] = json!({ "helm.sh/resource-policy": "keep" });
    assert_eq!(crd, &generated);
}

#[test]
fn chart_options_change_what_renders() {
    // No CRD, no leader election, one namespace watched.
    let docs = render(json!({
        "crds": { "install": false },
        "leaderElection": { "enabled": false },
        "replicaCount": 1,
        "watchNamespace": "payments",
    }));
    check_all(&docs);
    let k = kinds(&docs);
    assert!(!k.contains(&"CustomResourceDefinition".to_owned()));
    // No leader's Role: the one Role is the operator's grant in the watched namespace.
    let roles: Vec<&Value> = docs.iter().filter(|d| d["kind"] == "Role").collect();
    assert_eq!(roles.len(), 1);
    assert_eq!(roles[0]["metadata"]["namespace"], "payments");
    let deploy: Deployment = parse(find(&docs, "Deployment"));
    let env = deploy.spec.unwrap().template.spec.unwrap().containers[0]
        .env
        .clone()
        .unwrap();
    let get = |n: &str| {
        env.iter()
            .find(|e| e.name == n)
            .and_then(|e| e.value.clone())
    };
    assert_eq!(
        get("ANKUSA_OPERATOR_NAMESPACE").as_deref(),
        Some("payments")
    );
    assert_eq!(
        get("ANKUSA_OPERATOR_LEADER_ELECTION").as_deref(),
        Some("false")
    );
}

#[test]
fn chart_ships_the_alerts_and_the_dashboard_when_asked() {
    let off = render(json!({}));
    let k = kinds(&off);
    assert!(!k.contains(&"PrometheusRule".to_owned()));
    assert!(!k.contains(&"ConfigMap".to_owned()));
    let docs = render(json!({
        "monitoring": {
            "prometheusRule": { "enabled": true, "labels": { "release": "prometheus" } },
            "dashboards": { "enabled": true, "annotations": { "grafana_folder": "Ankusa" } },
        }
    }));
    check_all(&docs);
    // The rule's groups are the rules file's, which promtool checks and tests.
    let rule = find(&docs, "PrometheusRule");
    assert_eq!(rule["metadata"]["labels"]["release"], "prometheus");
    let file: Value = serde_yaml::from_str(
        &std::fs::read_to_string(root().join("charts/ankusa/files/alerts.yaml")).unwrap(),
    )
    .unwrap();
    assert_eq!(rule["spec"]["groups"], file["groups"]);
    // Every operator series an alert queries is one the operator exports.
    let exposition = ankusa_operator::metrics::Metrics::default().encode();
    let alerts = std::fs::read_to_string(root().join("charts/ankusa/files/alerts.yaml")).unwrap();
    let mut queried = 0;
    for (i, _) in alerts.match_indices("ankusa_operator_") {
        let name: String = alerts[i..]
            .chars()
            .take_while(|c| c.is_ascii_lowercase() || *c == '_')
            .collect();
        assert!(
            exposition.contains(&format!("# TYPE {name} ")),
            "{name} is queried but the operator does not export it"
        );
        queried += 1;
    }
    assert!(queried >= 2, "{queried}");
    // The dashboard, byte for byte, labelled for Grafana's sidecar.
    let cm: ConfigMap = parse(find(&docs, "ConfigMap"));
    let labels = cm.metadata.labels.unwrap();
    assert_eq!(labels["grafana_dashboard"], "1");
    assert_eq!(cm.metadata.annotations.unwrap()["grafana_folder"], "Ankusa");
    let json_text = &cm.data.unwrap()["ankusa-relay.json"];
    let shipped: Value = serde_json::from_str(json_text).unwrap();
    let file: Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("charts/ankusa/dashboards/ankusa-relay.json"))
            .unwrap(),
    )
    .unwrap();
    assert_eq!(shipped, file);
    assert_eq!(shipped["uid"], "ankusa-relay");
}

/// With the chart's alerts on, the operator's ServiceMonitor comes with them (the alerts
/// read its series) unless it is turned off; and none without the alerts. The test
/// cluster's own helm renders it, told that the Prometheus Operator's API is served (the
/// offline renderer cannot say so).
#[test]
fn the_alerts_bring_the_operators_service_monitor() {
    let bin = std::env::var("ANKUSA_TESTENV_BIN").expect(
        "ANKUSA_TESTENV_BIN is not set: this test runs under scripts/k8s-testenv.sh (make test)",
    );
    let monitors = |set: &[&str]| -> usize {
        let mut cmd = Command::new(std::path::Path::new(&bin).join("helm"));
        cmd.args(["template", "ankusa"])
            .arg(root().join("charts/ankusa"))
            .args(["--api-versions", "monitoring.coreos.com/v1/ServiceMonitor"]);
        for s in set {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().expect("helm runs");
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        documents(&out.stdout)
            .iter()
            .filter(|v| v["kind"] == "ServiceMonitor")
            .count()
    };
    assert_eq!(monitors(&[]), 0, "no alerts, no ServiceMonitor");
    assert_eq!(monitors(&["monitoring.prometheusRule.enabled=true"]), 1);
    assert_eq!(
        monitors(&[
            "monitoring.prometheusRule.enabled=true",
            "metrics.serviceMonitor.enabled=false"
        ]),
        0,
        "turned off"
    );
    assert_eq!(monitors(&["metrics.serviceMonitor.enabled=true"]), 1);
}
