//! What the real API server admits: the CRD itself (structural schema, CEL cost), each
//! CEL rule's refusal with its message, Relay names, `kubectl get relays`, the restricted
//! Pod Security Standard, and the ServiceMonitor's selection.

use std::sync::Arc;
use std::time::Duration;

use ankusa_crds::relay::Relay;
use ankusa_operator::controller::{self, Context, Settings};
use ankusa_operator::metrics::Metrics;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{json, Value};

use crate::cluster;
use crate::reconcile::{provision, wait_ready_pods};
use crate::support::root;

fn dry_run() -> PostParams {
    PostParams {
        dry_run: true,
        ..PostParams::default()
    }
}

/// A Relay as the user writes it, in `ns`.
fn relay(ns: &str, name: &str, spec: Value) -> Value {
    json!({
        "apiVersion": "ankusa.dev/v1alpha1", "kind": "Relay",
        "metadata": { "name": name, "namespace": ns },
        "spec": spec,
    })
}

async fn create(client: &Client, ns: &str, v: &Value) -> Result<(), String> {
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), ns, &controller::relay_api_resource());
    let obj: DynamicObject = serde_json::from_value(v.clone()).unwrap();
    api.create(&dry_run(), &obj)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_crd_and_the_charts_crd_install() {
    let admin = cluster::admin().await;
    // The committed manifest is what `k8s-testenv.sh` installed; it is Established.
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let crd = crds.get("relays.ankusa.dev").await.unwrap();
    let established = crd
        .status
        .unwrap()
        .conditions
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Established" && c.status == "True");
    assert!(established);
    let committed: CustomResourceDefinition = serde_yaml::from_str(
        &std::fs::read_to_string(root().join(ankusa_crds::manifest::MANIFEST_PATH)).unwrap(),
    )
    .unwrap();
    assert_eq!(
        serde_json::to_value(&crd.spec.versions).unwrap(),
        serde_json::to_value(&committed.spec.versions).unwrap(),
        "the installed CRD is the committed one"
    );
    // The chart's template, rendered, installs too (server-side dry run of a create
    // under another name would change it; apply it as an update instead).
    let template = ankusa_crds::manifest::chart_template();
    let body: String = template
        .lines()
        .filter(|l| !l.trim_start().starts_with("{{"))
        .collect::<Vec<_>>()
        .join("\n");
    let chart_crd: CustomResourceDefinition = serde_yaml::from_str(&body).unwrap();
    let mut params = PatchParams::apply("ankusa-chart-test").force();
    params.dry_run = true;
    crds.patch("relays.ankusa.dev", &params, &Patch::Apply(&chart_crd))
        .await
        .unwrap();
    // And as a fresh CRD under another group: the API server's create-time checks
    // (structural schema, CEL cost estimates) run in full.
    let mut fresh = committed.clone();
    fresh.metadata.name = Some("relays.fresh.ankusa.dev".into());
    fresh.spec.group = "fresh.ankusa.dev".into();
    crds.create(&dry_run(), &fresh).await.unwrap();
}

#[tokio::test]
async fn every_cel_rule_refuses_its_bad_case_with_its_message() {
    let admin = cluster::admin().await;
    let ns = cluster::namespace(&admin, "cel").await;
    let good = json!({ "image": "ghcr.io/ankusa/relay:0.1.0" });
    create(&admin, &ns, &relay(&ns, "ok", good.clone()))
        .await
        .unwrap();
    // examples/relay.yaml is accepted as it stands.
    let mut example: Value =
        serde_yaml::from_str(&std::fs::read_to_string(root().join("examples/relay.yaml")).unwrap())
            .unwrap();
    example["metadata"]["namespace"] = json!(ns);
    create(&admin, &ns, &example).await.unwrap();

    let cases: Vec<(&str, Value, &str)> = vec![
        (
            "ok",
            json!({ "image": "x", "replicas": 0 }),
            "replicas must be between 1 and 99",
        ),
        (
            "ok",
            json!({ "image": "x", "replicas": 100 }),
            "replicas must be between 1 and 99",
        ),
        ("ok", json!({ "image": "" }), "image must not be empty"),
        (
            "ok",
            json!({ "image": "x", "tenants": { "max": 0 } }),
            "tenants.max must be at least 1",
        ),
        (
            "ok",
            json!({ "image": "x", "config": { "inline": {}, "configMapRef": { "name": "c" } } }),
            "set config.inline or config.configMapRef, not both",
        ),
        (
            "ok",
            json!({ "image": "x", "config": { "secretEnv": [
                { "name": "1BAD", "secretKeyRef": { "name": "s", "key": "k" } } ] } }),
            "must be an environment variable name",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "destination": { "claimName": "data-relay-0" }, "retention": 3 } }),
            "the backup claim must not be a node's own volume",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "destination": { "claimName": "b" }, "retention": 0 } }),
            "retention must be at least 1",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "policy": "Always" } }),
            "set backup.destination (a claim), backup.objectStore (a bucket), or both",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "objectStore": { "url": "hooks/prod" } } }),
            "url is s3://bucket/prefix",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "objectStore": { "url": "s3://dr/hooks", "endpoint": "seaweed:8333" } } }),
            "endpoint is an http:// or https:// URL",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "objectStore": { "url": "s3://dr/hooks", "intervalSeconds": 5 } } }),
            "intervalSeconds must be between 10 and 86400",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "objectStore": { "url": "s3://dr/hooks",
                "caBundle": { "secretName": "a", "configMapName": "b", "key": "ca.crt" } } } }),
            "set caBundle.secretName or caBundle.configMapName, not both",
        ),
        (
            "ok",
            json!({ "image": "x", "bootstrap": { "fromBackup": { "claimName": "b",
                "objectStore": { "url": "s3://dr/hooks" } } } }),
            "bootstrap.fromBackup reads a claimName or an objectStore, not both",
        ),
        (
            "ok",
            json!({ "image": "x", "monitoring": { "serviceMonitor": { "interval": "soon" } } }),
            "interval must be a duration such as 30s",
        ),
        (
            "ok",
            json!({ "image": "x", "podLabels": { "app.kubernetes.io/name": "mine" } }),
            "podLabels must not set the labels the operator selects its pods by",
        ),
        (
            "ok",
            json!({ "image": "x", "podLabels": { "team": "has spaces" } }),
            "spec.podLabels.team",
        ),
        (
            "ok",
            json!({ "image": "x", "podAnnotations": { "ankusa.dev/config-hash": "x" } }),
            "podAnnotations must not set the operator's own",
        ),
        (
            "ok",
            json!({ "image": "x", "tolerations": [{ "key": "k", "operator": "Exists", "value": "v" }] }),
            "a toleration with operator Exists takes no value",
        ),
        (
            "ok",
            json!({ "image": "x", "tolerations": [{ "key": "k", "operator": "Equals" }] }),
            "a toleration's operator is Exists or Equal",
        ),
        (
            "ok",
            json!({ "image": "x", "tolerations": [{ "operator": "Equal", "value": "v" }] }),
            "a toleration without a key must have operator Exists",
        ),
        (
            "ok",
            json!({ "image": "x", "topologySpreadConstraints": [
                { "maxSkew": 0, "topologyKey": "zone", "whenUnsatisfiable": "DoNotSchedule" } ] }),
            "maxSkew is at least 1",
        ),
        (
            "ok",
            json!({ "image": "x", "topologySpreadConstraints": [
                { "maxSkew": 1, "topologyKey": "zone", "whenUnsatisfiable": "Never" } ] }),
            "whenUnsatisfiable is DoNotSchedule or ScheduleAnyway",
        ),
        (
            "ok",
            json!({ "image": "x", "imagePullSecrets": [{ "name": "" }] }),
            "every imagePullSecrets entry needs a name",
        ),
        (
            "ok",
            json!({ "image": "x", "priorityClassName": "Not_A_Name" }),
            "spec.priorityClassName",
        ),
        (
            "ok",
            json!({ "image": "x", "serviceAccountName": "-bad" }),
            "spec.serviceAccountName",
        ),
        (
            "ok",
            json!({ "image": "x", "ingest": { "service": { "type": "External" } } }),
            "type is ClusterIP, NodePort or LoadBalancer",
        ),
        (
            "ok",
            json!({ "image": "x", "ingest": { "service": { "externalTrafficPolicy": "Local" } } }),
            "externalTrafficPolicy applies to a NodePort or LoadBalancer Service only",
        ),
        (
            "ok",
            json!({ "image": "x", "ingest": { "service": { "type": "NodePort", "loadBalancerSourceRanges": ["10.0.0.0/8"] } } }),
            "loadBalancerSourceRanges applies to a LoadBalancer Service only",
        ),
        (
            "ok",
            json!({ "image": "x", "ingest": { "service": { "type": "LoadBalancer", "loadBalancerSourceRanges": ["10.0.0.0"] } } }),
            "every loadBalancerSourceRanges entry must be a CIDR",
        ),
        (
            "ok",
            json!({ "image": "x", "ingest": { "ingress": { "host": "https://hooks.example.com" } } }),
            "spec.ingest.ingress.host",
        ),
        (
            "ok",
            json!({ "image": "x", "ingest": { "httpRoute": { "parentRefs": [] } } }),
            "spec.ingest.httpRoute.parentRefs",
        ),
        (
            "ok",
            json!({ "image": "x", "ingest": { "httpRoute": { "parentRefs": [{ "name": "gw" }], "hostnames": ["Hooks.Example.com"] } } }),
            "spec.ingest.httpRoute.hostnames[0]",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "destination": { "claimName": "b", "claimTemplate": { "size": "1Gi" } } } }),
            "set backup.destination.claimName (one claim for every node) or backup.destination.claimTemplate",
        ),
        (
            "ok",
            json!({ "image": "x", "backup": { "destination": {} } }),
            "set backup.destination.claimName (one claim for every node) or backup.destination.claimTemplate",
        ),
        (
            "ok",
            json!({ "image": "x:1", "upgrade": { "rollbackTo": { "image": "x:0", "acknowledgeDataLoss": true } } }),
            "spec.upgrade.rollbackTo.image must be spec.image",
        ),
        (
            "ok",
            json!({ "image": "x:0", "upgrade": { "rollbackTo": { "image": "x:0" } } }),
            "set acknowledgeDataLoss: true to say so",
        ),
        (
            "ok",
            json!({ "image": "x", "bootstrap": { "fromBackup": { "relay": "old" } } }),
            "bootstrap.fromBackup needs a claimName",
        ),
        (
            "a-relay-name-that-is-longer-than-forty-chars",
            good.clone(),
            "a Relay name is at most 40 characters",
        ),
        (
            "dotted.name",
            good.clone(),
            "a Relay name must be a DNS-1035 label",
        ),
        (
            "9starts-with-a-digit",
            good.clone(),
            "a Relay name must be a DNS-1035 label",
        ),
    ];
    for (name, spec, message) in cases {
        let err = create(&admin, &ns, &relay(&ns, name, spec.clone()))
            .await
            .expect_err(&format!("{name} {spec} was admitted"));
        assert!(err.contains(message), "{spec}: {err}");
    }
    // Every placement field at once (tests/fixtures/relays/full.yaml's) is admitted, and
    // so are the pods the operator builds from them: the StatefulSet and both Jobs, as a
    // server-side dry run.
    let mut full = crate::support::relay_value("full");
    full["metadata"] =
        json!({ "name": "full", "namespace": ns, "uid": "5d0c9a51-7c1e-4b55-9d2b-0f6a2f4c1e01" });
    create(&admin, &ns, &full).await.unwrap();
    let full: Relay = serde_json::from_value(full).unwrap();
    let set = ankusa_operator::resources::DesiredSet::build(&full, None, 0, false).unwrap();
    Api::<k8s_openapi::api::apps::v1::StatefulSet>::namespaced(admin.clone(), &ns)
        .create(&dry_run(), &set.statefulset)
        .await
        .unwrap();
    let jobs: Api<Job> = Api::namespaced(admin.clone(), &ns);
    let probe =
        ankusa_operator::resources::probe_job(&full, "full-probe", &full.spec.image).unwrap();
    jobs.create(&dry_run(), &probe).await.unwrap();
    let backup = ankusa_operator::resources::backup_job(
        &full,
        "full-backup",
        0,
        &full.spec.image,
        ankusa_operator::resources::BackupSource::Claim,
    )
    .unwrap();
    jobs.create(&dry_run(), &backup).await.unwrap();
    // Its exposure too: the ingest Service, the Ingress, the HTTPRoute (against the Gateway
    // API's own CRD) and the NetworkPolicy.
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(admin.clone(), &ns)
        .create(&dry_run(), &set.ingest_service)
        .await
        .unwrap();
    Api::<k8s_openapi::api::networking::v1::Ingress>::namespaced(admin.clone(), &ns)
        .create(&dry_run(), set.ingress.as_ref().unwrap())
        .await
        .unwrap();
    Api::<kube::api::DynamicObject>::namespaced_with(
        admin.clone(),
        &ns,
        &ankusa_operator::resources::http_route_resource(),
    )
    .create(&dry_run(), set.http_route.as_ref().unwrap())
    .await
    .unwrap();
    Api::<k8s_openapi::api::networking::v1::NetworkPolicy>::namespaced(admin.clone(), &ns)
        .create(&dry_run(), set.network_policy.as_ref().unwrap())
        .await
        .unwrap();
    // The longest name the rule allows makes valid objects: the operator builds them all
    // and the server accepts every one (server-side dry run).
    let longest = "r".repeat(40);
    create(&admin, &ns, &relay(&ns, &longest, good))
        .await
        .unwrap();
}

/// A Relay `hooks` with `spec` in a new namespace (`prefix`, `labels`), reconciled once
/// by the operator's identity: (cluster-admin, the namespace, the Relays' API).
async fn reconciled(prefix: &str, labels: Value, spec: Value) -> (Client, String, Api<Relay>) {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace_with(&admin, prefix, labels).await;
    let relays: Api<Relay> = Api::namespaced(admin.clone(), &ns);
    let r: Relay = serde_json::from_value(relay(&ns, "hooks", spec)).unwrap();
    relays.create(&PostParams::default(), &r).await.unwrap();
    let ctx = Context::new(op, Arc::new(Metrics::default()), Settings::default());
    controller::reconcile(Arc::new(relays.get("hooks").await.unwrap()), ctx)
        .await
        .unwrap();
    (admin, ns, relays)
}

/// `kubectl get relays` prints the README's columns, each with a value; `-o wide` adds the
/// upgrade's.
#[tokio::test]
async fn kubectl_get_relays_prints_every_column() {
    let (_, ns, relays) = reconciled(
        "columns",
        json!({}),
        json!({ "image": "ghcr.io/ankusa/relay:0.1.0" }),
    )
    .await;
    // What nodes would report (the e2e run fills it from real nodes).
    relays
        .patch_status(
            "hooks",
            &PatchParams::apply("ankusa-tests").force(),
            &Patch::Apply(json!({
                "apiVersion": "ankusa.dev/v1alpha1", "kind": "Relay",
                "status": { "storeFormat": 2, "targetFormat": 3,
                    "upgrade": { "phase": "Verifying", "targetImage": "ghcr.io/ankusa/relay:0.1.0", "currentPod": "hooks-0", "podsMigrated": 0 },
                    "tenants": { "count": 2, "max": 10, "pending": 1, "scheduled": 0, "inflight": 0, "dead": 0, "bytes": 5, "paused": 1, "overQuota": 0 } },
            })),
        )
        .await
        .unwrap();
    let get = |wide: bool| {
        let mut args = vec!["get", "relays", "-n", ns.as_str()];
        if wide {
            args.extend(["-o", "wide"]);
        }
        let out = std::process::Command::new(cluster::bin("kubectl"))
            .args(&args)
            .env("KUBECONFIG", cluster::path("KUBECONFIG"))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    // The default listing: the README's columns, each with a value.
    let text = get(false);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME", "READY", "NODES", "FORMAT", "TARGET", "TENANTS", "PENDING", "DEAD", "PHASE",
            "DRAINING", "AGE"
        ]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row.len(), header.len(), "{text}");
    assert!(!row.contains(&"<none>"), "{text}");
    assert_eq!(row[0], "hooks");
    assert_eq!(&row[3..8], ["2", "3", "2", "1", "0"], "{text}");
    // `-o wide` adds where an upgrade is (empty while none runs), and the tenants paused
    // and over quota.
    let text = get(true);
    let lines: Vec<&str> = text.lines().collect();
    let header: Vec<&str> = lines[0].split_whitespace().collect();
    assert_eq!(
        header,
        [
            "NAME",
            "READY",
            "NODES",
            "FORMAT",
            "TARGET",
            "UPGRADE",
            "MOVING",
            "TENANTS",
            "PENDING",
            "DEAD",
            "PAUSED",
            "OVERQUOTA",
            "PHASE",
            "DRAINING",
            "AGE"
        ]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row.len(), header.len(), "{text}");
    assert_eq!(
        &row[3..12],
        ["2", "3", "Verifying", "hooks-0", "2", "1", "0", "1", "0"],
        "{text}"
    );
}

/// The operator's pods and Jobs in a namespace enforcing the `restricted` Pod Security
/// Standard are admitted.
#[tokio::test]
async fn restricted_pod_security_admits_relay_pods_and_jobs() {
    let (admin, ns, relays) = reconciled(
        "restricted",
        json!({ "pod-security.kubernetes.io/enforce": "restricted",
                "pod-security.kubernetes.io/enforce-version": "latest" }),
        json!({ "image": "ghcr.io/ankusa/relay:0.1.0", "replicas": 2,
                "backup": { "destination": { "claimName": "backups" } } }),
    )
    .await;
    // The StatefulSet controller's pods are created (admission would refuse them).
    wait_ready_pods(&admin, &ns, 2).await;
    // Probe and backup Jobs, as the operator builds them, create their pods too.
    let r = relays.get("hooks").await.unwrap();
    let jobs: Api<Job> = Api::namespaced(admin.clone(), &ns);
    let probe =
        ankusa_operator::resources::probe_job(&r, "hooks-probe-test", "ghcr.io/ankusa/relay:0.2.0")
            .unwrap();
    use ankusa_operator::resources::{backup_job, BackupSource};
    let backup = backup_job(
        &r,
        "hooks-backup-0-test",
        0,
        "ghcr.io/ankusa/relay:0.1.0",
        BackupSource::Node("http://hooks-0.hooks-nodes:9090"),
    )
    .unwrap();
    // The offline backup of a claim no pod uses, mounted read-only.
    let offline = backup_job(
        &r,
        "hooks-backup-3-test",
        3,
        "ghcr.io/ankusa/relay:0.1.0",
        BackupSource::Claim,
    )
    .unwrap();
    for job in [probe, backup, offline] {
        jobs.create(&PostParams::default(), &job).await.unwrap();
    }
    provision(&admin, &ns).await;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &ns);
    for job in [
        "hooks-probe-test",
        "hooks-backup-0-test",
        "hooks-backup-3-test",
    ] {
        cluster::eventually(
            Duration::from_secs(60),
            &format!("a pod of {job}"),
            || async {
                let list = pods
                    .list(&ListParams::default().labels(&format!("job-name={job}")))
                    .await
                    .unwrap();
                (!list.items.is_empty()).then_some(())
            },
        )
        .await;
    }
    // And a pod that is not restricted is refused there: the namespace does enforce.
    let bad: Pod = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod", "metadata": { "name": "loose" },
        "spec": { "containers": [{ "name": "c", "image": "x" }] },
    }))
    .unwrap();
    let err = pods.create(&PostParams::default(), &bad).await.unwrap_err();
    assert!(err.to_string().contains("violates PodSecurity"), "{err}");
}

/// A Relay in the operator's own namespace, beside the chart's `ankusa-metrics` Service
/// (whose service links would be `ANKUSA_METRICS_*`), gets pods without service links.
#[tokio::test]
async fn relay_pods_get_no_service_links() {
    let (admin, ns, _) = reconciled(
        "links",
        json!({}),
        json!({ "image": "ghcr.io/ankusa/relay:0.1.0" }),
    )
    .await;
    let svc: Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service", "metadata": { "name": "ankusa-metrics" },
        "spec": { "ports": [{ "port": 8080 }], "selector": { "app": "operator" } },
    }))
    .unwrap();
    Api::<Service>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    wait_ready_pods(&admin, &ns, 1).await;
    let pod = Api::<Pod>::namespaced(admin.clone(), &ns)
        .get("hooks-0")
        .await
        .unwrap();
    assert_eq!(pod.spec.unwrap().enable_service_links, Some(false));
}

/// Each relay pod appears exactly once among the endpoints of the Services the
/// ServiceMonitor selects.
#[tokio::test]
async fn each_pod_is_scraped_once() {
    let (admin, ns, _) = reconciled(
        "scrape",
        json!({}),
        json!({ "image": "ghcr.io/ankusa/relay:0.1.0", "replicas": 2,
                "monitoring": { "serviceMonitor": { "enabled": true } } }),
    )
    .await;
    wait_ready_pods(&admin, &ns, 2).await;
    let sm = Api::<DynamicObject>::namespaced_with(
        admin.clone(),
        &ns,
        &ankusa_operator::resources::service_monitor_resource(),
    )
    .get("hooks")
    .await
    .unwrap();
    let selector: Vec<String> = sm.data["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, v)| format!("{k}={}", v.as_str().unwrap()))
        .collect();
    let services = Api::<Service>::namespaced(admin.clone(), &ns)
        .list(&ListParams::default().labels(&selector.join(",")))
        .await
        .unwrap();
    let port = sm.data["spec"]["endpoints"][0]["port"]
        .as_str()
        .unwrap()
        .to_owned();
    let slices: Api<EndpointSlice> = Api::namespaced(admin.clone(), &ns);
    let targets = cluster::eventually(Duration::from_secs(60), "endpoints of both pods", || {
        let services = services.items.clone();
        let slices = slices.clone();
        let port = port.clone();
        async move {
            let mut targets = Vec::new();
            for s in &services {
                let list = slices
                    .list(
                        &ListParams::default()
                            .labels(&format!("kubernetes.io/service-name={}", s.name_any())),
                    )
                    .await
                    .unwrap();
                for slice in list.items {
                    let has_port = slice
                        .ports
                        .unwrap_or_default()
                        .iter()
                        .any(|p| p.name.as_deref() == Some(port.as_str()));
                    if !has_port {
                        continue;
                    }
                    for e in slice.endpoints {
                        if let Some(t) = e.target_ref.and_then(|t| t.name) {
                            targets.push(t);
                        }
                    }
                }
            }
            targets.sort();
            (targets.len() >= 2).then_some(targets)
        }
    })
    .await;
    assert_eq!(
        targets,
        ["hooks-0", "hooks-1"],
        "scrape targets through {} Services",
        services.items.len()
    );
}
