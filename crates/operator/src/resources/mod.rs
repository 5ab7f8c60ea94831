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

mod jobs;
mod network;
mod pod;

pub use jobs::{
    backup_claim, backup_claim_object, backup_job, data_claim, probe_job, restore_job,
    BackupSource, BACKUP_CLAIM_APP_NAME, BACKUP_JOB, BACKUP_MOUNT, JOB_APP_NAME, JOB_LABEL,
};
pub use network::{
    client_service, headless_service, http_route, http_route_resource, ingest_service, ingress,
    network_policy, service_monitor, service_monitor_resource, OperatorPeer, INGEST_PATH,
    SERVICE_LABEL,
};
pub use pod::{
    pdb, shutdown_grace_ms, startup_failure_threshold, statefulset, termination_grace_s, PRE_STOP_S,
};

use std::collections::BTreeMap;

use ankusa_crds::relay::Relay;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::DynamicObject;
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
    if relay.spec.config.ca_bundle_ref.is_some() {
        entry_object(root, "dispatch")?.insert(
            "ca_bundle".into(),
            json!({ "file": ankusa_crds::relay::CA_BUNDLE_FILE }),
        );
    }
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
