//! The objects a `Relay` owns, built from its spec: pure functions, no I/O.
//!
//! Every object carries the same labels, an owner reference to the `Relay` (so deleting
//! the `Relay` garbage-collects them) and nothing the operator does not mean to own:
//! these are server-side apply bodies, and every field in them is a field the operator
//! claims under its field manager. Fields left out (a `kubectl rollout restart`
//! annotation, a replica count an autoscaler sets elsewhere) stay with whoever set them.
//!
//! What a node is, as objects:
//! - ConfigMap `<name>-config`: `relay.yaml`, the user's configuration with the keys that
//!   tie a node to its pod (data directory, listeners, `tenants.max`, backup directory)
//!   set by the operator, and the operator's own admin token (read from a file) added.
//! - Secret `<name>-operator-token`: the token the operator polls `/v1/node` with (`token`,
//!   admin scope) and the one its backup Jobs use (`backup-token`, backup scope); made
//!   once, kept across reconciles.
//! - Services `<name>-nodes` (headless, one DNS name per pod, used by the operator and
//!   Prometheus) and `<name>` (ingest and admin for clients).
//! - StatefulSet `<name>`: one volume claim per node (`data-<name>-<ordinal>`), retained
//!   when the set is scaled down or deleted — the operator never deletes a store.
//! - PodDisruptionBudget `<name>`: at most one node down by eviction.
//! - ServiceMonitor `<name>` when asked for and the Prometheus Operator is installed.
//! - Service `<name>-ingest`: the ingest port alone, of the type `spec.ingest.service`
//!   asks for (what a LoadBalancer or NodePort exposes to providers: never the admin API).
//! - Ingress and HTTPRoute `<name>-ingest` when asked for: `/ingest/` to that Service.
//! - NetworkPolicy `<name>` when asked for: the relay pods admit only the relay's own
//!   traffic ([`network_policy`]).

use std::collections::BTreeMap;

use ankusa_crds::relay::Relay;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Resource;
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use crate::names::{config_hash, Names, ResourceError};

/// The relay's ingest port (`POST /ingest/{source}`).
pub const INGEST_PORT: u16 = 8080;
/// The relay's admin port (`/v1/...`, `/metrics`, `/healthz`, `/readyz`).
pub const ADMIN_PORT: u16 = 9090;
/// Where a node's volume is mounted; the store lives in `data/` under it.
pub const DATA_MOUNT: &str = "/var/lib/ankusa";
/// Where `relay.yaml` is mounted.
pub const CONFIG_MOUNT: &str = "/etc/ankusa";
/// Where the operator's token is mounted.
pub const TOKEN_MOUNT: &str = "/etc/ankusa-operator";
/// The key of the relay configuration in the ConfigMap.
pub const CONFIG_KEY: &str = "relay.yaml";
/// The key of the token in the operator's Secret.
pub const TOKEN_KEY: &str = "token";
/// The admin token name the relay writes to its audit trail for the operator's calls.
pub const TOKEN_NAME: &str = "ankusa-operator";
/// The key of the backup-scope token in the operator's Secret: the only token the backup
/// Jobs hold (it can take and fetch backups, nothing else).
pub const BACKUP_TOKEN_KEY: &str = "backup-token";
/// The key of the cluster token in the operator's Secret: what the nodes of a Relay show
/// each other (forwarded hooks, admin calls, the tenant registry).
pub const CLUSTER_TOKEN_KEY: &str = "cluster-token";
/// The default URL one node reaches another's ingest listener at.
pub const DEFAULT_INGEST_URL_TEMPLATE: &str = "http://{pod}.{service}.{namespace}.svc:8080";
/// The backup token's name in the relay's audit trail.
pub const BACKUP_TOKEN_NAME: &str = "ankusa-backup";
/// The key of the metrics-scope token in the operator's Secret: what the ServiceMonitor's
/// scrapes carry, so `admin.metrics.token_required` keeps them working.
pub const METRICS_TOKEN_KEY: &str = "metrics-token";
/// The metrics token's name.
pub const METRICS_TOKEN_NAME: &str = "ankusa-metrics";
/// Pod template annotation with the hash of `relay.yaml`: a configuration change rolls
/// the nodes (the relay reads its configuration at start).
pub const CONFIG_HASH_ANNOTATION: &str = "ankusa.dev/config-hash";

/// Labels on every object of a `Relay`.
pub fn labels(relay_name: &str) -> BTreeMap<String, String> {
    let mut l = selector_labels(relay_name);
    l.insert(
        "app.kubernetes.io/managed-by".into(),
        "ankusa-operator".into(),
    );
    l.insert("app.kubernetes.io/component".into(), "relay".into());
    l
}

/// The labels that select a `Relay`'s pods (immutable on a StatefulSet).
pub fn selector_labels(relay_name: &str) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("app.kubernetes.io/name".into(), "ankusa-relay".into()),
        ("app.kubernetes.io/instance".into(), relay_name.into()),
    ])
}

/// The controller owner reference every owned object carries.
pub fn owner(relay: &Relay) -> Result<OwnerReference, ResourceError> {
    relay
        .controller_owner_ref(&())
        .ok_or(ResourceError::MissingMeta("uid"))
}

fn metadata(relay: &Relay, name: &str) -> Result<Value, ResourceError> {
    let names = Names::of(relay)?;
    Ok(json!({
        "name": name,
        "namespace": names.namespace,
        "labels": labels(&names.relay),
        "ownerReferences": [owner(relay)?],
    }))
}

/// [`metadata`] with the user's `annotations` (none: no annotations key).
fn annotated(
    relay: &Relay,
    name: &str,
    annotations: &BTreeMap<String, String>,
) -> Result<Value, ResourceError> {
    let mut meta = metadata(relay, name)?;
    if !annotations.is_empty() {
        meta["annotations"] = json!(annotations);
    }
    Ok(meta)
}

/// `v` as a typed object. A field the type does not know would be dropped silently by
/// the conversion; it is refused instead, so a misspelt field is an error, not a no-op.
fn typed<T: DeserializeOwned + serde::Serialize>(
    kind: &'static str,
    v: Value,
) -> Result<T, ResourceError> {
    let t: T = serde_json::from_value(v.clone())
        .map_err(|source| ResourceError::Build { kind, source })?;
    let back = serde_json::to_value(&t).map_err(|source| ResourceError::Build { kind, source })?;
    if !crate::observed::contains(&back, &v) {
        return Err(ResourceError::Config(format!(
            "{kind}: a field is not part of the {kind} schema"
        )));
    }
    Ok(t)
}

/// A storage or memory quantity (`10Gi`, `500M`, `1073741824`) in bytes; `None` for a form a claim's
/// capacity or a memory request never takes (fractions, milli-units).
pub fn quantity_bytes(q: &str) -> Option<u64> {
    let q = q.trim();
    let split = q.find(|c: char| !c.is_ascii_digit()).unwrap_or(q.len());
    let (n, unit) = q.split_at(split);
    let n: u64 = n.parse().ok()?;
    let mult: u64 = match unit {
        "" => 1,
        "k" => 1_000,
        "M" => 1_000_000,
        "G" => 1_000_000_000,
        "T" => 1_000_000_000_000,
        "P" => 1_000_000_000_000_000,
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        "Pi" => 1 << 50,
        _ => return None,
    };
    n.checked_mul(mult)
}

/// The store's memory budget when the relay container has no memory limit: a quarter of
/// its memory request ([`ankusa_crds::relay::DEFAULT_MEMORY_REQUEST`] when `resources` is
/// unset); `None` with a limit (the node reads it from its cgroup).
pub fn store_budget_from_request(relay: &Relay) -> Option<u64> {
    let resources = relay.spec.resources.as_ref();
    let has_limit = resources
        .and_then(|r| r.limits.as_ref())
        .is_some_and(|l| l.contains_key("memory"));
    if has_limit {
        return None;
    }
    let request = match resources {
        Some(r) => r.requests.as_ref()?.get("memory")?.0.clone(),
        None => ankusa_crds::relay::DEFAULT_MEMORY_REQUEST.to_owned(),
    };
    // At least the 64 MiB the store's budget is useful with.
    quantity_bytes(&request).map(|b| (b / 4).max(64 << 20))
}

/// How one node reaches another's listeners: templates of `{pod}`, `{service}` (the
/// headless Service) and `{namespace}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeUrls {
    pub admin: String,
    pub ingest: String,
}

impl Default for NodeUrls {
    fn default() -> Self {
        NodeUrls {
            admin: crate::nodes::DEFAULT_URL_TEMPLATE.into(),
            ingest: DEFAULT_INGEST_URL_TEMPLATE.into(),
        }
    }
}

impl NodeUrls {
    fn fill(template: &str, pod: &str, names: &Names) -> String {
        template
            .replace("{pod}", pod)
            .replace("{service}", &names.headless)
            .replace("{namespace}", &names.namespace)
    }
}

/// The relay configuration the nodes run: `user` (inline or from the referenced
/// ConfigMap; `None` for none) with the operator's keys set, nodes reached at their
/// headless-Service DNS names.
pub fn relay_config(relay: &Relay, user: Option<&Value>) -> Result<Value, ResourceError> {
    relay_config_with(relay, user, &NodeUrls::default(), None)
}

/// [`relay_config`], nodes reached at `urls`. The node list (`cluster.nodes`) is every
/// ordinal of `spec.replicas` (the StatefulSet's, a scale-down's leaving nodes included);
/// the nodes from ordinal `owners` on are marked `leaving`: they own no tenant and hand
/// what they store to the others. Each node learns its own name from its pod's
/// (`ANKUSA_CLUSTER__NAME`).
pub fn relay_config_with(
    relay: &Relay,
    user: Option<&Value>,
    urls: &NodeUrls,
    owners: Option<i32>,
) -> Result<Value, ResourceError> {
    let owners = owners.unwrap_or(relay.spec.replicas).max(1);
    let names = Names::of(relay)?;
    let mut cfg = match user {
        None | Some(Value::Null) => json!({}),
        Some(Value::Object(m)) => Value::Object(m.clone()),
        Some(_) => {
            return Err(ResourceError::Config(
                "the relay configuration must be a mapping of keys".into(),
            ))
        }
    };
    let root = object(&mut cfg, "")?;
    root.insert("data_dir".into(), json!(format!("{DATA_MOUNT}/data")));
    let ingest = entry_object(root, "ingest")?;
    ingest.insert("listen".into(), json!(format!("[::]:{INGEST_PORT}")));
    let admin = entry_object(root, "admin")?;
    admin.insert("listen".into(), json!(format!("[::]:{ADMIN_PORT}")));
    admin.insert("backup_dir".into(), json!(format!("{DATA_MOUNT}/backups")));
    let tokens = admin.entry("tokens").or_insert_with(|| json!([]));
    let Value::Array(tokens) = tokens else {
        return Err(ResourceError::Config("admin.tokens must be a list".into()));
    };
    tokens.retain(|t| {
        t.get("name") != Some(&json!(TOKEN_NAME))
            && t.get("name") != Some(&json!(BACKUP_TOKEN_NAME))
            && t.get("name") != Some(&json!(METRICS_TOKEN_NAME))
    });
    tokens.push(json!({
        "name": TOKEN_NAME,
        "secret": { "file": format!("{TOKEN_MOUNT}/{TOKEN_KEY}") },
        "scope": "admin",
    }));
    tokens.push(json!({
        "name": BACKUP_TOKEN_NAME,
        "secret": { "file": format!("{TOKEN_MOUNT}/{BACKUP_TOKEN_KEY}") },
        "scope": "backup",
    }));
    tokens.push(json!({
        "name": METRICS_TOKEN_NAME,
        "secret": { "file": format!("{TOKEN_MOUNT}/{METRICS_TOKEN_KEY}") },
        "scope": "metrics",
    }));
    let tenants = entry_object(root, "tenants")?;
    tenants.insert("max".into(), json!(relay.spec.tenants.max));
    // With a memory limit the node sizes its store from its cgroup (a quarter of the
    // limit). Without one it would take 512 MiB whatever the pod was given: a quarter of
    // the memory request instead, what the scheduler reserved for it, unless the
    // configuration says otherwise.
    if let Some(request) = store_budget_from_request(relay) {
        let store = entry_object(root, "store")?;
        store
            .entry("memory_bytes")
            .or_insert_with(|| json!(request));
    }
    // The nodes' own pushes to the bucket (spec.backup.objectStore), or none.
    match relay.spec.object_store() {
        Some(s) => {
            entry_object(root, "backup")?
                .insert("object_store".into(), crate::objstore::node_section(s));
        }
        None => {
            if let Some(Value::Object(b)) = root.get_mut("backup") {
                b.remove("object_store");
            }
        }
    }
    let cluster = entry_object(root, "cluster")?;
    cluster.remove("name");
    cluster.insert(
        "nodes".into(),
        json!((0..relay.spec.replicas.max(1))
            .map(|i| {
                let pod = names.pod(i);
                let mut node = json!({
                    "name": pod,
                    "ingest": NodeUrls::fill(&urls.ingest, &pod, &names),
                    "admin": NodeUrls::fill(&urls.admin, &pod, &names),
                });
                if i >= owners {
                    node["leaving"] = json!(true);
                }
                node
            })
            .collect::<Vec<_>>()),
    );
    cluster.insert(
        "token".into(),
        json!({ "file": format!("{TOKEN_MOUNT}/{CLUSTER_TOKEN_KEY}") }),
    );
    Ok(cfg)
}

fn object<'a>(
    v: &'a mut Value,
    key: &str,
) -> Result<&'a mut serde_json::Map<String, Value>, ResourceError> {
    v.as_object_mut()
        .ok_or_else(|| ResourceError::Config(format!("{key} must be a mapping")))
}

fn entry_object<'a>(
    m: &'a mut serde_json::Map<String, Value>,
    key: &str,
) -> Result<&'a mut serde_json::Map<String, Value>, ResourceError> {
    let v = m.entry(key).or_insert_with(|| json!({}));
    if v.is_null() {
        *v = json!({});
    }
    object(v, key)
}

/// Every check a node makes of its configuration but reading its secrets (they live in
/// files and variables of its pod), as the first node would: a configuration the relay
/// would refuse is never applied, so a typo does not crash-loop the nodes one by one.
pub fn check_relay_yaml(relay: &Relay, yaml: &str) -> Result<(), ResourceError> {
    let pod = Names::of(relay)?.pod(0);
    ankusa_config::Config::from_yaml_unresolved(yaml, [("ANKUSA_CLUSTER__NAME".to_owned(), pod)])
        .map(|_| ())
        .map_err(|e| ResourceError::Config(format!("the relay would refuse it: {e}")))
}

/// `relay.yaml` as text, with a stable key order.
pub fn relay_yaml(cfg: &Value) -> Result<String, ResourceError> {
    serde_yaml::to_string(cfg).map_err(|e| ResourceError::Config(e.to_string()))
}

pub fn config_map(relay: &Relay, yaml: &str) -> Result<ConfigMap, ResourceError> {
    let names = Names::of(relay)?;
    typed(
        "ConfigMap",
        json!({
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": metadata(relay, &names.config_map)?,
            "data": { CONFIG_KEY: yaml },
        }),
    )
}

/// The operator's token Secret: the admin, backup, metrics and cluster tokens. Existing
/// values are passed back in, so re-applying it changes nothing.
pub fn token_secret(
    relay: &Relay,
    token: &str,
    backup_token: &str,
    metrics_token: &str,
    cluster_token: &str,
) -> Result<Secret, ResourceError> {
    let names = Names::of(relay)?;
    typed(
        "Secret",
        json!({
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": metadata(relay, &names.token_secret)?,
            "type": "Opaque",
            "stringData": {
                TOKEN_KEY: token,
                BACKUP_TOKEN_KEY: backup_token,
                METRICS_TOKEN_KEY: metrics_token,
                CLUSTER_TOKEN_KEY: cluster_token,
            },
        }),
    )
}

fn ports() -> Value {
    json!([
        { "name": "ingest", "port": INGEST_PORT, "targetPort": "ingest", "protocol": "TCP" },
        { "name": "admin", "port": ADMIN_PORT, "targetPort": "admin", "protocol": "TCP" },
    ])
}

/// Label telling a Relay's two Services apart (`nodes` or `client`): the ServiceMonitor
/// selects `nodes` only, so each pod is scraped once.
pub const SERVICE_LABEL: &str = "ankusa.dev/service";

/// A Service of the relay's pods on the ingest and admin ports, with `spec` added;
/// `role` is its [`SERVICE_LABEL`].
fn service(
    relay: &Relay,
    name: &str,
    role: &str,
    mut spec: Value,
) -> Result<Service, ResourceError> {
    let names = Names::of(relay)?;
    spec["selector"] = json!(selector_labels(&names.relay));
    spec["ports"] = ports();
    let mut meta = metadata(relay, name)?;
    meta["labels"][SERVICE_LABEL] = json!(role);
    typed(
        "Service",
        json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": meta,
            "spec": spec,
        }),
    )
}

/// The headless Service: a DNS name per pod, ready or not (the operator polls a pod
/// that is starting or migrating, and Prometheus scrapes it).
pub fn headless_service(relay: &Relay) -> Result<Service, ResourceError> {
    let names = Names::of(relay)?;
    service(
        relay,
        &names.headless,
        "nodes",
        json!({ "clusterIP": "None", "publishNotReadyAddresses": true }),
    )
}

/// The client Service: ingest for providers, admin for operators of the relay.
pub fn client_service(relay: &Relay) -> Result<Service, ResourceError> {
    let names = Names::of(relay)?;
    service(
        relay,
        &names.client,
        "client",
        json!({ "type": "ClusterIP" }),
    )
}

/// The ingest Service: the ingest port alone, so that a NodePort or LoadBalancer exposes
/// to providers what they send to and nothing else.
pub fn ingest_service(relay: &Relay) -> Result<Service, ResourceError> {
    let names = Names::of(relay)?;
    let want = &relay.spec.ingest.service;
    let mut spec = json!({
        "type": want.type_,
        "selector": selector_labels(&names.relay),
        "ports": [{ "name": "ingest", "port": INGEST_PORT, "targetPort": "ingest", "protocol": "TCP" }],
    });
    if let Some(p) = &want.external_traffic_policy {
        spec["externalTrafficPolicy"] = json!(p);
    }
    if !want.load_balancer_source_ranges.is_empty() {
        spec["loadBalancerSourceRanges"] = json!(want.load_balancer_source_ranges);
    }
    if let Some(c) = &want.load_balancer_class {
        spec["loadBalancerClass"] = json!(c);
    }
    let mut meta = annotated(relay, &names.ingest, &want.annotations)?;
    meta["labels"][SERVICE_LABEL] = json!("ingest");
    typed(
        "Service",
        json!({ "apiVersion": "v1", "kind": "Service", "metadata": meta, "spec": spec }),
    )
}

/// The path prefix providers post to (`/ingest/{source}`); both an Ingress's `Prefix` and
/// an HTTPRoute's `PathPrefix` match it element by element.
pub const INGEST_PATH: &str = "/ingest";

/// The Ingress of `spec.ingest.ingress`: `https://<host>/ingest/` to the ingest Service.
pub fn ingress(relay: &Relay) -> Result<Option<Ingress>, ResourceError> {
    let Some(want) = &relay.spec.ingest.ingress else {
        return Ok(None);
    };
    let names = Names::of(relay)?;
    let meta = annotated(relay, &names.ingest, &want.annotations)?;
    let mut spec = json!({
        "rules": [{
            "host": want.host,
            "http": { "paths": [{
                "path": INGEST_PATH,
                "pathType": "Prefix",
                "backend": { "service": { "name": names.ingest, "port": { "name": "ingest" } } },
            }] },
        }],
    });
    if let Some(class) = &want.class_name {
        spec["ingressClassName"] = json!(class);
    }
    if let Some(secret) = &want.tls_secret_name {
        spec["tls"] = json!([{ "hosts": [want.host], "secretName": secret }]);
    }
    typed(
        "Ingress",
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "Ingress",
            "metadata": meta,
            "spec": spec,
        }),
    )
    .map(Some)
}

/// The Gateway API's `HTTPRoute` resource.
pub fn http_route_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("gateway.networking.k8s.io", "v1", "HTTPRoute"),
        "httproutes",
    )
}

/// The HTTPRoute of `spec.ingest.httpRoute`: `/ingest/` on its Gateways to the ingest
/// Service.
pub fn http_route(relay: &Relay) -> Result<Option<DynamicObject>, ResourceError> {
    let Some(want) = &relay.spec.ingest.http_route else {
        return Ok(None);
    };
    let names = Names::of(relay)?;
    let meta = annotated(relay, &names.ingest, &want.annotations)?;
    let parents: Vec<Value> = want
        .parent_refs
        .iter()
        .map(|g| {
            let mut r = json!({
                "group": "gateway.networking.k8s.io",
                "kind": "Gateway",
                "name": g.name,
            });
            if let Some(ns) = &g.namespace {
                r["namespace"] = json!(ns);
            }
            if let Some(section) = &g.section_name {
                r["sectionName"] = json!(section);
            }
            r
        })
        .collect();
    let mut spec = json!({
        "parentRefs": parents,
        "rules": [{
            "matches": [{ "path": { "type": "PathPrefix", "value": INGEST_PATH } }],
            "backendRefs": [{ "group": "", "kind": "Service", "name": names.ingest, "port": INGEST_PORT }],
        }],
    });
    if !want.hostnames.is_empty() {
        spec["hostnames"] = json!(want.hostnames);
    }
    typed(
        "HTTPRoute",
        json!({
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "HTTPRoute",
            "metadata": meta,
            "spec": spec,
        }),
    )
    .map(Some)
}

/// Who the operator is, for the NetworkPolicy's admin rule: its namespace (any, when not
/// known) and its pods' labels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorPeer {
    pub namespace: Option<String>,
    pub labels: BTreeMap<String, String>,
}

impl Default for OperatorPeer {
    fn default() -> Self {
        OperatorPeer {
            namespace: None,
            labels: BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "ankusa-operator".to_owned(),
            )]),
        }
    }
}

impl OperatorPeer {
    /// `NAMESPACE` and `k=v,k=v` labels, as the chart passes them (`POD_NAMESPACE`,
    /// `ANKUSA_OPERATOR_POD_LABELS`); what is missing keeps its default.
    pub fn from_parts(namespace: Option<String>, labels: Option<&str>) -> OperatorPeer {
        let mut peer = OperatorPeer {
            namespace: namespace.filter(|n| !n.is_empty()),
            ..OperatorPeer::default()
        };
        if let Some(l) = labels.filter(|l| !l.trim().is_empty()) {
            peer.labels = l
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
                .collect();
        }
        peer
    }

    fn peer(&self) -> Value {
        let namespaces = match &self.namespace {
            Some(ns) => json!({ "matchLabels": { "kubernetes.io/metadata.name": ns } }),
            None => json!({}),
        };
        json!({ "namespaceSelector": namespaces, "podSelector": { "matchLabels": self.labels } })
    }
}

/// The NetworkPolicy of `spec.networkPolicy` (`None` when it is off). It selects the
/// relay pods, for ingress only, and admits:
/// 1. ingest from `ingestFrom` (anyone when empty);
/// 2. ingest and admin from the Relay's other nodes (forwards, relay-wide admin);
/// 3. admin from the operator (it polls `/v1/node`) and the Relay's backup Jobs (they pull
///    a checkpoint);
/// 4. admin from `metricsFrom` (scrapers) and from `adminFrom`, each when not empty.
pub fn network_policy(
    relay: &Relay,
    operator: &OperatorPeer,
) -> Result<Option<NetworkPolicy>, ResourceError> {
    let want = &relay.spec.network_policy;
    if !want.enabled {
        return Ok(None);
    }
    let names = Names::of(relay)?;
    let port = |name: &str| json!({ "port": name, "protocol": "TCP" });
    let own = json!({ "podSelector": { "matchLabels": selector_labels(&names.relay) } });
    let mut jobs = selector_labels(&names.relay);
    jobs.insert("app.kubernetes.io/name".into(), JOB_APP_NAME.into());
    let jobs = json!({ "podSelector": { "matchLabels": jobs } });
    let mut ingest = json!({ "ports": [port("ingest")] });
    if !want.ingest_from.is_empty() {
        ingest["from"] = json!(want.ingest_from);
    }
    let mut rules = vec![
        ingest,
        json!({ "ports": [port("ingest"), port("admin")], "from": [own] }),
        json!({ "ports": [port("admin")], "from": [operator.peer(), jobs] }),
    ];
    for peers in [&want.metrics_from, &want.admin_from] {
        if !peers.is_empty() {
            rules.push(json!({ "ports": [port("admin")], "from": peers }));
        }
    }
    typed(
        "NetworkPolicy",
        json!({
            "apiVersion": "networking.k8s.io/v1",
            "kind": "NetworkPolicy",
            "metadata": metadata(relay, &names.network_policy)?,
            "spec": {
                "podSelector": { "matchLabels": selector_labels(&names.relay) },
                "policyTypes": ["Ingress"],
                "ingress": rules,
            },
        }),
    )
    .map(Some)
}

/// The StatefulSet. `partition` holds ordinals below it on their current revision (the
/// upgrade gate lowers it one ordinal at a time); `config_hash` rolls the pods when what
/// `relay.yaml` says that a node cannot reload changes.
pub fn statefulset(
    relay: &Relay,
    partition: i32,
    config_hash: &str,
    shutdown_grace_ms: u64,
) -> Result<StatefulSet, ResourceError> {
    let names = Names::of(relay)?;
    let spec = &relay.spec;
    let mut container = json!({
        "name": "relay",
        "image": spec.image,
        "args": ["run", "--config", format!("{CONFIG_MOUNT}/{CONFIG_KEY}")],
        "ports": [
            { "name": "ingest", "containerPort": INGEST_PORT, "protocol": "TCP" },
            { "name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP" },
        ],
        "volumeMounts": [
            { "name": "data", "mountPath": DATA_MOUNT },
            { "name": "config", "mountPath": CONFIG_MOUNT, "readOnly": true },
            { "name": "operator-token", "mountPath": TOKEN_MOUNT, "readOnly": true },
        ],
        // Ready means the store is open, migrated and the listeners are up; a node
        // migrating its store is alive but not ready.
        "readinessProbe": {
            "httpGet": { "path": "/readyz", "port": "admin" },
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        // `/healthz` answers from the node's first second, before its store opens; the
        // startup budget (`spec.startupSeconds`) covers the container's own start, and
        // liveness is checked only after it.
        "startupProbe": {
            "httpGet": { "path": "/healthz", "port": "admin" },
            "periodSeconds": ankusa_crds::relay::STARTUP_PROBE_PERIOD_S,
            "failureThreshold": startup_failure_threshold(spec.startup_seconds),
        },
        "livenessProbe": {
            "httpGet": { "path": "/healthz", "port": "admin" },
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": container_security(),
        // Endpoints drop the pod before it stops taking hooks: SIGTERM comes after this.
        "lifecycle": { "preStop": { "sleep": { "seconds": PRE_STOP_S } } },
    });
    // Each node's name in `cluster.nodes` is its pod's (`apiVersion` written out: the API
    // server would add it, and a field it adds would read as drift on every poll).
    let mut env = vec![json!({
        "name": "ANKUSA_CLUSTER__NAME",
        "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.name" } },
    })];
    env.extend(spec.config.secret_env.iter().map(|e| {
        json!({
            "name": e.name,
            "valueFrom": { "secretKeyRef": e.secret_key_ref },
        })
    }));
    container["env"] = json!(env);
    let mut volumes = vec![
        json!({ "name": "config", "configMap": { "name": names.config_map } }),
        json!({ "name": "operator-token", "secret": { "secretName": names.token_secret } }),
    ];
    // A source's `tenant_secrets: { dir }`: each Secret a directory, a file per key, which
    // the kubelet updates in place (the node's reload watch sees its `..data` swap).
    for (i, dir) in spec.config.secret_dirs.iter().enumerate() {
        let volume = format!("secret-dir-{i}");
        volumes.push(json!({ "name": volume, "secret": { "secretName": dir.name } }));
        if let Some(mounts) = container["volumeMounts"].as_array_mut() {
            mounts.push(json!({
                "name": volume,
                "mountPath": format!("{}/{}", ankusa_crds::relay::SECRET_DIRS_MOUNT, dir.name),
                "readOnly": true,
            }));
        }
    }
    if let Some(policy) = &spec.image_pull_policy {
        container["imagePullPolicy"] = json!(policy);
    }
    container["resources"] = match &spec.resources {
        Some(resources) => json!(resources),
        None => json!({ "requests": {
            "cpu": ankusa_crds::relay::DEFAULT_CPU_REQUEST,
            "memory": ankusa_crds::relay::DEFAULT_MEMORY_REQUEST,
        } }),
    };
    let claim_spec = claim_spec(relay);
    let mut set = json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": metadata(relay, &names.statefulset)?,
            "spec": {
                "replicas": spec.replicas,
                "serviceName": names.headless,
                // Nodes are independent stores: start them together; the upgrade gate,
                // not the pod management policy, orders a format change.
                "podManagementPolicy": "Parallel",
                // A scale-down shrinks only once the nodes it takes out are drained (the
                // planner's `drain`), so deleting their claims then loses nothing; a
                // deleted Relay keeps every claim.
                "persistentVolumeClaimRetentionPolicy": {
                    "whenScaled": match spec.storage.when_scaled.unwrap_or_default() {
                        ankusa_crds::relay::ClaimRetention::Retain => "Retain",
                        ankusa_crds::relay::ClaimRetention::Delete => "Delete",
                    },
                    "whenDeleted": "Retain",
                },
                "selector": { "matchLabels": selector_labels(&names.relay) },
                "updateStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": { "partition": partition },
                },
                "template": {
                    "metadata": {
                        "labels": pod_labels(relay, labels(&names.relay)),
                        "annotations": pod_annotations(relay, [(CONFIG_HASH_ANNOTATION, config_hash)]),
                    },
                    "spec": {
                        // The node's own grace for deliveries in flight, after the preStop
                        // pause, with room to sync and exit: a SIGKILL never cuts a
                        // graceful stop short.
                        "terminationGracePeriodSeconds": termination_grace_s(shutdown_grace_ms),
                        // No `<SERVICE>_SERVICE_HOST` variables for every Service in the
                        // namespace: the relay needs none, and they only crowd its env.
                        "enableServiceLinks": false,
                        "securityContext": pod_security(),
                        "containers": [container],
                        "volumes": volumes,
                        "automountServiceAccountToken": false,
                    },
                },
                "volumeClaimTemplates": [{
                    "metadata": { "name": "data", "labels": selector_labels(&names.relay) },
                    "spec": claim_spec,
                }],
            },
    });
    let pod = &mut set["spec"]["template"]["spec"];
    if let Some(s) = spec.object_store() {
        crate::objstore::add_to_pod(pod, s);
    }
    scheduling(relay, pod);
    let own = json!({ "matchLabels": selector_labels(&names.relay) });
    pod["affinity"] = match &spec.affinity {
        Some(a) => json!(a),
        // Spread the nodes over hosts where the cluster can: one host's loss takes one node.
        None => json!({ "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": { "labelSelector": own, "topologyKey": "kubernetes.io/hostname" },
            }],
        } }),
    };
    if !spec.topology_spread_constraints.is_empty() {
        let mut constraints = json!(spec.topology_spread_constraints);
        for c in constraints.as_array_mut().into_iter().flatten() {
            if c.get("labelSelector").is_none() {
                c["labelSelector"] = own.clone();
            }
        }
        pod["topologySpreadConstraints"] = constraints;
    }
    typed("StatefulSet", set)
}

/// What the relay pods and the Jobs' pods share from the spec: image pull secrets,
/// tolerations, node selector, priority class and ServiceAccount.
fn scheduling(relay: &Relay, pod: &mut Value) {
    let spec = &relay.spec;
    if !spec.image_pull_secrets.is_empty() {
        pod["imagePullSecrets"] = json!(spec.image_pull_secrets);
    }
    if !spec.tolerations.is_empty() {
        pod["tolerations"] = json!(spec.tolerations);
    }
    if !spec.node_selector.is_empty() {
        pod["nodeSelector"] = json!(spec.node_selector);
    }
    if let Some(class) = &spec.priority_class_name {
        pod["priorityClassName"] = json!(class);
    }
    if let Some(account) = &spec.service_account_name {
        pod["serviceAccountName"] = json!(account);
    }
}

/// A pod's labels: the operator's `own`, and the spec's `podLabels` (which admission keeps
/// off the operator's keys; the operator's win all the same).
fn pod_labels(relay: &Relay, own: BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut l = relay.spec.pod_labels.clone();
    l.extend(own);
    l
}

/// A pod's annotations: the spec's `podAnnotations` and the operator's `own`.
fn pod_annotations<'a>(
    relay: &Relay,
    own: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, String> {
    let mut a = relay.spec.pod_annotations.clone();
    a.extend(own.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())));
    a
}

/// The startupProbe's failure threshold for a budget of `seconds`.
pub fn startup_failure_threshold(seconds: i64) -> i64 {
    (seconds + ankusa_crds::relay::STARTUP_PROBE_PERIOD_S - 1)
        / ankusa_crds::relay::STARTUP_PROBE_PERIOD_S
}

/// The pause before a relay container gets SIGTERM, for endpoint controllers and load
/// balancers to stop sending it hooks.
pub const PRE_STOP_S: i64 = 5;

/// The pod's termination grace: the preStop pause, the node's `shutdown.grace_ms`, and 10
/// s to commit, sync and exit.
pub fn termination_grace_s(shutdown_grace_ms: u64) -> i64 {
    PRE_STOP_S + i64::try_from(shutdown_grace_ms.div_ceil(1000)).unwrap_or(600) + 10
}

/// `shutdown.grace_ms` of a relay configuration (the relay's default when unset).
pub fn shutdown_grace_ms(cfg: &Value) -> u64 {
    cfg.pointer("/shutdown/grace_ms")
        .and_then(Value::as_u64)
        .unwrap_or(20_000)
}

/// At most one node down by voluntary eviction: a node down stops its tenants' ingest.
pub fn pdb(relay: &Relay) -> Result<PodDisruptionBudget, ResourceError> {
    let names = Names::of(relay)?;
    typed(
        "PodDisruptionBudget",
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": metadata(relay, &names.pdb)?,
            "spec": {
                "maxUnavailable": 1,
                "selector": { "matchLabels": selector_labels(&names.relay) },
            },
        }),
    )
}

/// The Prometheus Operator's `ServiceMonitor` resource.
pub fn service_monitor_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("monitoring.coreos.com", "v1", "ServiceMonitor"),
        "servicemonitors",
    )
}

/// A ServiceMonitor scraping every node's `/metrics` through the headless Service.
pub fn service_monitor(relay: &Relay) -> Result<DynamicObject, ResourceError> {
    let names = Names::of(relay)?;
    let sm = &relay.spec.monitoring.service_monitor;
    let mut meta = metadata(relay, &names.service_monitor)?;
    for (k, v) in &sm.labels {
        meta["labels"][k] = json!(v);
    }
    // The scrapes carry the metrics-scope token from the operator's Secret: they keep
    // working when the configuration says `admin.metrics.token_required`.
    let mut endpoint = json!({
        "port": "admin",
        "path": "/metrics",
        "interval": sm.interval,
        "authorization": {
            "type": "Bearer",
            "credentials": { "name": names.token_secret, "key": METRICS_TOKEN_KEY },
        },
    });
    if !sm.relabelings.is_empty() {
        endpoint["relabelings"] = json!(sm.relabelings);
    }
    // The headless Service only: selecting both Services would scrape every pod twice.
    let mut selector = selector_labels(&names.relay);
    selector.insert(SERVICE_LABEL.into(), "nodes".into());
    typed(
        "ServiceMonitor",
        json!({
            "apiVersion": "monitoring.coreos.com/v1",
            "kind": "ServiceMonitor",
            "metadata": meta,
            "spec": {
                "selector": { "matchLabels": selector },
                "namespaceSelector": { "matchNames": [names.namespace] },
                "endpoints": [endpoint],
            },
        }),
    )
}

/// What the desired objects depend on besides the `Relay`: which optional APIs the cluster
/// serves, how nodes reach each other, and who the operator is.
#[derive(Debug, Clone, Default)]
pub struct Surroundings {
    /// A ServiceMonitor is wanted and served.
    pub service_monitor: bool,
    /// `gateway.networking.k8s.io/v1` serves `httproutes`.
    pub http_route_api: bool,
    pub urls: NodeUrls,
    pub operator: OperatorPeer,
    /// The nodes that own tenants (`spec.replicas`) when the StatefulSet runs more: those
    /// past it are leaving (a scale-down drains them first). `None`: every node owns.
    pub owners: Option<i32>,
}

/// Every desired object of a `Relay` (the optional ones only when they will be applied).
#[derive(Debug, Clone)]
pub struct DesiredSet {
    pub config_map: ConfigMap,
    pub headless: Service,
    pub client: Service,
    pub statefulset: StatefulSet,
    pub pdb: PodDisruptionBudget,
    pub service_monitor: Option<DynamicObject>,
    pub ingest_service: Service,
    pub ingress: Option<Ingress>,
    pub http_route: Option<DynamicObject>,
    pub network_policy: Option<NetworkPolicy>,
}

impl DesiredSet {
    /// The desired objects in a cluster that serves the HTTPRoute API, with the default
    /// node URLs and operator identity.
    pub fn build(
        relay: &Relay,
        user_config: Option<&Value>,
        partition: i32,
        with_service_monitor: bool,
    ) -> Result<DesiredSet, ResourceError> {
        Self::build_with(
            relay,
            user_config,
            partition,
            &Surroundings {
                service_monitor: with_service_monitor,
                http_route_api: true,
                ..Surroundings::default()
            },
        )
    }

    /// The desired objects of `relay` in `around`.
    pub fn build_with(
        relay: &Relay,
        user_config: Option<&Value>,
        partition: i32,
        around: &Surroundings,
    ) -> Result<DesiredSet, ResourceError> {
        let cfg = relay_config_with(relay, user_config, &around.urls, around.owners)?;
        let yaml = relay_yaml(&cfg)?;
        check_relay_yaml(relay, &yaml)?;
        Ok(DesiredSet {
            config_map: config_map(relay, &yaml)?,
            headless: headless_service(relay)?,
            client: client_service(relay)?,
            // Only what a node cannot reload rolls the pods: a change of sources, sinks,
            // routes or tokens reaches them through the ConfigMap's volume.
            statefulset: statefulset(
                relay,
                partition,
                &config_hash(&relay_yaml(&ankusa_config::reload::restart_part(&cfg))?),
                shutdown_grace_ms(&cfg),
            )?,
            pdb: pdb(relay)?,
            service_monitor: if around.service_monitor {
                Some(service_monitor(relay)?)
            } else {
                None
            },
            ingest_service: ingest_service(relay)?,
            ingress: ingress(relay)?,
            http_route: if around.http_route_api {
                http_route(relay)?
            } else {
                None
            },
            network_policy: network_policy(relay, &around.operator)?,
        })
    }

    /// The desired object of `kind` as JSON (`None`: no ServiceMonitor is wanted).
    pub fn value(&self, kind: crate::observed::Owned) -> Option<Value> {
        use crate::observed::Owned;
        match kind {
            Owned::ConfigMap => to_value(&self.config_map).ok(),
            Owned::HeadlessService => to_value(&self.headless).ok(),
            Owned::ClientService => to_value(&self.client).ok(),
            Owned::StatefulSet => to_value(&self.statefulset).ok(),
            Owned::PodDisruptionBudget => to_value(&self.pdb).ok(),
            Owned::ServiceMonitor => self.service_monitor.as_ref().and_then(|s| to_value(s).ok()),
            Owned::IngestService => to_value(&self.ingest_service).ok(),
            Owned::Ingress => self.ingress.as_ref().and_then(|s| to_value(s).ok()),
            Owned::HttpRoute => self.http_route.as_ref().and_then(|s| to_value(s).ok()),
            Owned::NetworkPolicy => self.network_policy.as_ref().and_then(|s| to_value(s).ok()),
        }
    }

    /// The objects as one YAML stream, in apply order (what the golden file holds).
    pub fn to_yaml(&self) -> Result<String, ResourceError> {
        let mut out = String::new();
        for d in crate::observed::Owned::ALL
            .into_iter()
            .filter_map(|kind| self.value(kind))
        {
            out.push_str("---\n");
            out.push_str(
                &serde_yaml::to_string(&d).map_err(|e| ResourceError::Config(e.to_string()))?,
            );
        }
        Ok(out)
    }
}

fn to_value<T: serde::Serialize>(t: &T) -> Result<Value, ResourceError> {
    serde_json::to_value(t).map_err(|source| ResourceError::Build {
        kind: "object",
        source,
    })
}

/// Label on the operator's Jobs: `probe` or `backup`.
pub const JOB_LABEL: &str = "ankusa.dev/job";
/// [`JOB_LABEL`]'s value on backup Jobs (the gate's and the schedule's), and their
/// container's name.
pub const BACKUP_JOB: &str = "backup";
/// Where the backup volume is mounted in a backup Job.
pub const BACKUP_MOUNT: &str = "/backups";

/// `app.kubernetes.io/name` of the operator's Job pods.
pub const JOB_APP_NAME: &str = "ankusa-relay-job";

/// The labels of a Job and its pod. Its `app.kubernetes.io/name` is not the relay's, so
/// that no selector of the Relay's — the StatefulSet's, the Services', the
/// PodDisruptionBudget's — ever matches a Job's pod: a running backup pod must not take
/// ingest traffic, and a finished one (kept a day) must not enter the budget, whose
/// controller cannot count a Job's pods and would allow no eviction at all.
fn job_labels(relay_name: &str, job: &str) -> BTreeMap<String, String> {
    let mut l = labels(relay_name);
    l.insert("app.kubernetes.io/name".into(), JOB_APP_NAME.into());
    l.insert("app.kubernetes.io/component".into(), format!("{job}-job"));
    l.insert(JOB_LABEL.into(), job.into());
    l
}

/// The pod security context of every pod the operator runs: admitted where the namespace
/// enforces the `restricted` Pod Security Standard.
fn pod_security() -> Value {
    json!({
        "runAsNonRoot": true,
        "runAsUser": 10001,
        "runAsGroup": 10001,
        "fsGroup": 10001,
        // The kubelet changes the volume's ownership only when its root is not already
        // the group's: not a recursive chown of the whole store at every start.
        "fsGroupChangePolicy": "OnRootMismatch",
        "seccompProfile": { "type": "RuntimeDefault" },
    })
}

/// The container security context of every container the operator runs.
fn container_security() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": { "drop": ["ALL"] },
    })
}

/// A run-once Job of the `Relay` (`job` is `probe` or `backup`) around `pod_spec`.
fn job(
    relay: &Relay,
    name: &str,
    job: &str,
    extra_labels: &[(&str, String)],
    deadline_s: i64,
    mut pod_spec: Value,
) -> Result<k8s_openapi::api::batch::v1::Job, ResourceError> {
    let names = Names::of(relay)?;
    let mut meta = metadata(relay, name)?;
    meta["labels"] = json!(job_labels(&names.relay, job));
    for (k, v) in extra_labels {
        meta["labels"][*k] = json!(v);
    }
    pod_spec["restartPolicy"] = json!("Never");
    pod_spec["enableServiceLinks"] = json!(false);
    pod_spec["automountServiceAccountToken"] = json!(false);
    pod_spec["securityContext"] = pod_security();
    scheduling(relay, &mut pod_spec);
    let resources = relay
        .spec
        .job_resources
        .clone()
        .unwrap_or_else(ankusa_crds::relay::default_job_resources);
    for c in pod_spec["containers"].as_array_mut().into_iter().flatten() {
        c["resources"] = json!(resources);
    }
    let mut template_meta = json!({ "labels": pod_labels(relay, job_labels(&names.relay, job)) });
    let annotations = pod_annotations(relay, []);
    if !annotations.is_empty() {
        template_meta["annotations"] = json!(annotations);
    }
    typed(
        "Job",
        json!({
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": meta,
            "spec": {
                "backoffLimit": 2,
                // spec.upgrade.timeouts: past it the Job fails (DeadlineExceeded) and the
                // upgrade stops with the Job named, instead of waiting forever.
                "activeDeadlineSeconds": deadline_s,
                // A finished Job is read within a reconcile or two; a day is plenty.
                "ttlSecondsAfterFinished": 86400,
                "template": {
                    "metadata": template_meta,
                    "spec": pod_spec,
                },
            },
        }),
    )
}

/// A Job that prints `ankusa-relay version --json` of `image`: the store format a release
/// would move the stores to, learned before any pod moves.
pub fn probe_job(
    relay: &Relay,
    name: &str,
    image: &str,
) -> Result<k8s_openapi::api::batch::v1::Job, ResourceError> {
    job(
        relay,
        name,
        "probe",
        &[],
        relay.spec.upgrade.timeouts.probe_seconds,
        json!({
            "containers": [{
                "name": "probe",
                "image": image,
                // The answer goes to the termination message, which the operator reads
                // from the pod's status (no log access needed).
                "args": ["version", "--json", "--write", "/dev/termination-log"],
                "terminationMessagePath": "/dev/termination-log",
                "securityContext": container_security(),
            }],
        }),
    )
}

/// A node's volume claim spec (`spec.storage`): the StatefulSet's claim template, and the
/// claims a bootstrap makes before the StatefulSet exists.
fn claim_spec(relay: &Relay) -> Value {
    let storage = &relay.spec.storage;
    claim_spec_of(&storage.size, storage.storage_class_name.as_deref())
}

/// A ReadWriteOnce claim spec of `size` in `class` (the cluster's default when `None`).
fn claim_spec_of(size: &str, class: Option<&str>) -> Value {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": { "requests": { "storage": size } },
    });
    if let Some(class) = class {
        spec["storageClassName"] = json!(class);
    }
    spec
}

/// A claim the operator makes itself: `name` in the Relay's namespace with `labels` and
/// `spec`, and no owner (deleting the Relay leaves it, like the StatefulSet's claims).
fn claim_object(
    relay: &Relay,
    name: &str,
    labels: BTreeMap<String, String>,
    spec: Value,
) -> Result<k8s_openapi::api::core::v1::PersistentVolumeClaim, ResourceError> {
    let names = Names::of(relay)?;
    typed(
        "PersistentVolumeClaim",
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": { "name": name, "namespace": names.namespace, "labels": labels },
            "spec": spec,
        }),
    )
}

/// Node `ordinal`'s data claim as the StatefulSet would make it from its template (its
/// name, labels and spec), made ahead of the StatefulSet by a bootstrap, which restores
/// into it: the StatefulSet's pod then takes the claim of its name. Like the StatefulSet's
/// own claims it has no owner: deleting the Relay leaves the store.
pub fn data_claim(
    relay: &Relay,
    ordinal: i32,
) -> Result<k8s_openapi::api::core::v1::PersistentVolumeClaim, ResourceError> {
    let names = Names::of(relay)?;
    claim_object(
        relay,
        &names.claim(ordinal),
        selector_labels(&names.relay),
        claim_spec(relay),
    )
}

/// The claim node `ordinal`'s backups go to: the one claim of every node, or its own
/// (`<name>-backups-<ordinal>`).
pub fn backup_claim(relay: &Relay, ordinal: i32) -> Result<String, ResourceError> {
    let (_, destination) = relay.spec.claim_backup().ok_or(ResourceError::Config(
        "spec.backup.destination is not set".into(),
    ))?;
    Ok(match destination.shared() {
        Some(c) => c.to_owned(),
        None => Names::of(relay)?.backup_claim(ordinal),
    })
}

/// Label of the per-node backup claims the operator makes.
pub const BACKUP_CLAIM_APP_NAME: &str = "ankusa-relay-backup";

/// Node `ordinal`'s own backup claim from `spec.backup.destination.claimTemplate` (`None`
/// with one claim for every node). Like the data claims it has no owner: deleting the
/// Relay leaves the backups.
pub fn backup_claim_object(
    relay: &Relay,
    ordinal: i32,
) -> Result<Option<k8s_openapi::api::core::v1::PersistentVolumeClaim>, ResourceError> {
    let Some(template) = relay
        .spec
        .backup
        .as_ref()
        .and_then(|b| b.destination.as_ref()?.claim_template.as_ref())
    else {
        return Ok(None);
    };
    let names = Names::of(relay)?;
    let mut labels = selector_labels(&names.relay);
    labels.insert(
        "app.kubernetes.io/name".into(),
        BACKUP_CLAIM_APP_NAME.into(),
    );
    claim_object(
        relay,
        &names.backup_claim(ordinal),
        labels,
        claim_spec_of(&template.size, template.storage_class_name.as_deref()),
    )
    .map(Some)
}

/// Node `ordinal`'s restore Job: `ankusa-relay restore --replace` of the newest archive in
/// `<relay>/<relay>-<ordinal>/` on the restore's backup claim (at most `format`; or the
/// named `archive` there), or of the newest backup under `<prefix>/<relay>-<ordinal>/` in
/// its bucket, into the node's data claim, which no pod uses meanwhile. The backup claim is
/// mounted read-only; from a bucket the Job mounts only the data claim, so it runs wherever
/// that claim can be attached. With `report`, what it found goes to the container's
/// termination message.
pub fn restore_job(
    relay: &Relay,
    name: &str,
    ordinal: i32,
    image: &str,
    format: Option<u32>,
    archive: Option<&str>,
    report: bool,
) -> Result<k8s_openapi::api::batch::v1::Job, ResourceError> {
    let names = Names::of(relay)?;
    let source = crate::restore::source(relay).ok_or(ResourceError::Config(
        "a restore needs spec.bootstrap.fromBackup (a claimName or an objectStore), spec.backup.destination or spec.backup.objectStore".into(),
    ))?;
    let from = &source.relay;
    let node = format!("{from}-{ordinal}");
    let (location, backups) = match (&source.bucket, source.claim(ordinal)) {
        (Some(bucket), _) => {
            if archive.is_some() {
                return Err(ResourceError::Config(
                    "restoreNode.backup names an archive on a claim; from a bucket the newest backup is restored".into(),
                ));
            }
            (crate::objstore::node_url(bucket, &node), None)
        }
        (None, Some(claim)) => {
            let dir = format!("{BACKUP_MOUNT}/{from}/{node}");
            (
                archive.map_or(dir.clone(), |a| format!("{dir}/{a}")),
                Some(claim),
            )
        }
        (None, None) => {
            return Err(ResourceError::Config(
                "the restore's source has no claim".into(),
            ))
        }
    };
    let mut args = vec![
        "restore".to_owned(),
        "--from".to_owned(),
        location,
        "--data".to_owned(),
        format!("{DATA_MOUNT}/data"),
        "--replace".to_owned(),
    ];
    if let Some(f) = format {
        args.extend(["--format-at-most".to_owned(), f.to_string()]);
    }
    if report {
        args.extend(["--report".to_owned(), "/dev/termination-log".to_owned()]);
    }
    // A node restore may restore the same backup as one before it: the Job's name tells
    // its own retried run (work done) from a new restore. From a bucket, every restore
    // is named so.
    if report || source.bucket.is_some() {
        args.extend(["--once".to_owned(), name.to_owned()]);
    }
    if let Some(bucket) = &source.bucket {
        args.extend(crate::objstore::restore_args(bucket));
    }
    let mut mounts = vec![json!({ "name": "data", "mountPath": DATA_MOUNT })];
    let mut volumes = vec![json!({
        "name": "data",
        "persistentVolumeClaim": { "claimName": names.claim(ordinal) },
    })];
    if let Some(claim) = backups {
        mounts.insert(
            0,
            json!({ "name": "backups", "mountPath": BACKUP_MOUNT, "readOnly": true }),
        );
        volumes.insert(
            0,
            json!({ "name": "backups", "persistentVolumeClaim": { "claimName": claim, "readOnly": true } }),
        );
    }
    let container = json!({
        "name": "restore",
        "image": image,
        "args": args,
        "volumeMounts": mounts,
        "securityContext": container_security(),
    });
    let mut pod = json!({ "containers": [container], "volumes": volumes });
    if let Some(bucket) = &source.bucket {
        crate::objstore::add_to_pod(&mut pod, bucket);
    }
    job(
        relay,
        name,
        "restore",
        &[("ankusa.dev/ordinal", ordinal.to_string())],
        relay.spec.upgrade.timeouts.backup_seconds,
        pod,
    )
}

/// Where a backup Job reads node `ordinal`'s store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackupSource<'a> {
    /// The running node, over its admin API at this URL (`backup pull`: a checkpoint
    /// streamed, with a token that can take backups and nothing else).
    Node(&'a str),
    /// The node's volume claim, which no pod uses (it outlived a scale-down), mounted
    /// read-only (`backup offline`).
    Claim,
}

/// A Job that backs node `ordinal`'s store up onto the backup volume
/// (`/backups/<relay>/<pod>/<id>.tar.zst`), keeping the newest `spec.backup.retention`
/// there. `image` is the upgrade's target release (the newest puller speaks every older
/// node's backup API).
pub fn backup_job(
    relay: &Relay,
    name: &str,
    ordinal: i32,
    image: &str,
    source: BackupSource<'_>,
) -> Result<k8s_openapi::api::batch::v1::Job, ResourceError> {
    let names = Names::of(relay)?;
    let (backup, destination) = relay.spec.claim_backup().ok_or(ResourceError::Config(
        "spec.backup.destination is not set".into(),
    ))?;
    let to = format!("{BACKUP_MOUNT}/{}/{}", names.relay, names.pod(ordinal));
    // spec.backup.retention: the newest N archives of this node stay.
    let keep = backup.retention.max(1).to_string();
    let mut container = json!({
        "name": BACKUP_JOB,
        "image": image,
        "volumeMounts": [{ "name": "backups", "mountPath": BACKUP_MOUNT }],
        "securityContext": container_security(),
    });
    let mut volumes = vec![json!({
        "name": "backups",
        "persistentVolumeClaim": { "claimName": backup_claim(relay, ordinal)? },
    })];
    let mut pod = json!({});
    match source {
        BackupSource::Node(url) => {
            if destination.shared().is_none() {
                // Its own backup claim binds where its first Job runs: in the node's zone,
                // where an offline backup of the node's data claim can mount both.
                pod["affinity"] = json!({ "podAffinity": {
                    "preferredDuringSchedulingIgnoredDuringExecution": [{
                        "weight": 100,
                        "podAffinityTerm": {
                            "labelSelector": { "matchLabels": {
                                "statefulset.kubernetes.io/pod-name": names.pod(ordinal),
                            } },
                            "topologyKey": "topology.kubernetes.io/zone",
                        },
                    }],
                } });
            }
            container["args"] =
                json!(["backup", "pull", "--from", url, "--to", to, "--keep", keep]);
            container["env"] = json!([{
                "name": "ANKUSA_ADMIN_TOKEN",
                "valueFrom": { "secretKeyRef": { "name": names.token_secret, "key": BACKUP_TOKEN_KEY } },
            }]);
        }
        BackupSource::Claim => {
            let data = format!("{DATA_MOUNT}/data");
            container["args"] =
                json!(["backup", "offline", "--data", data, "--to", to, "--keep", keep]);
            container["volumeMounts"] = json!([
                { "name": "backups", "mountPath": BACKUP_MOUNT },
                { "name": "data", "mountPath": DATA_MOUNT, "readOnly": true },
            ]);
            volumes.push(json!({
                "name": "data",
                "persistentVolumeClaim": { "claimName": names.claim(ordinal), "readOnly": true },
            }));
        }
    }
    // What it wrote and the room left on the claim, for the operator's next room check.
    // An environment variable, not a flag: a release without it ignores it.
    let report = json!({ "name": "ANKUSA_BACKUP_REPORT", "value": "/dev/termination-log" });
    match container["env"].as_array_mut() {
        Some(env) => env.push(report),
        None => container["env"] = json!([report]),
    }
    pod["containers"] = json!([container]);
    pod["volumes"] = json!(volumes);
    job(
        relay,
        name,
        BACKUP_JOB,
        &[("ankusa.dev/ordinal", ordinal.to_string())],
        relay.spec.upgrade.timeouts.backup_seconds,
        pod,
    )
}
