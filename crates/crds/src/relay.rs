//! The `Relay` custom resource (`relays.ankusa.dev/v1alpha1`).
//!
//! - `spec` is what the user asks for: how many nodes, which image, the tenant ceiling, the
//!   volume, the relay's configuration (inline or from a ConfigMap, secrets by reference),
//!   backups, the upgrade controls, monitoring, resources.
//! - `status` is written only by the operator ([`crate::status`]).
//!
//! CEL rules reject what can never work (a zero tenant ceiling, a backup volume that is a
//! node's own volume, inline config and a ConfigMap reference at once) at admission, so
//! the operator never has to carry a nonsense spec.

// `printcolumn(type_ = ...)` repeats per column inside one `#[kube]` attribute, which
// clippy's duplicate-attribute check mistakes for a repeated attribute.
#![allow(clippy::duplicated_attributes)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Affinity, LocalObjectReference, ResourceRequirements, SecretKeySelector, Toleration,
    TopologySpreadConstraint,
};
use k8s_openapi::api::networking::v1::NetworkPolicyPeer;
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

use crate::status::RelayStatus;

/// A set of relay nodes: a StatefulSet, its Services, configuration and monitoring.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "ankusa.dev",
    version = "v1alpha1",
    kind = "Relay",
    namespaced,
    shortname = "rly",
    category = "ankusa",
    status = "RelayStatus",
    derive = "PartialEq",
    // Every owned object's name is built from the Relay's: a Service name is a DNS-1035
    // label, and the longest derived label value (`<name>-backup-<ordinal>-<hash>` on a
    // backup Job, 19 characters more, or the StatefulSet's
    // `controller-revision-hash` label, 11 more) must stay within 63.
    validation = Rule::new("self.metadata.name.size() <= 40").message("a Relay name is at most 40 characters: the names of its StatefulSet, Services and Jobs are built from it"),
    validation = Rule::new("self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')").message("a Relay name must be a DNS-1035 label (lower-case letters, digits and '-', starting with a letter): it names the relay's Services"),
    validation = Rule::new("!has(self.spec.config) || !has(self.spec.config.configMapRef) || self.spec.config.configMapRef.name != self.metadata.name + '-config'").message("spec.config.configMapRef may not name <Relay name>-config: the operator writes that ConfigMap for the nodes (copy yours to another name)"),
    validation = Rule::new("!has(self.spec.upgrade) || !has(self.spec.upgrade.rollbackTo) || self.spec.upgrade.rollbackTo.image == self.spec.image").message("spec.upgrade.rollbackTo.image must be spec.image: set both to the release to return to"),
    validation = Rule::new("!has(self.spec.bootstrap) || has(self.spec.bootstrap.fromBackup.claimName) || has(self.spec.bootstrap.fromBackup.objectStore) || has(self.spec.backup)").message("bootstrap.fromBackup needs a claimName or an objectStore, or spec.backup (its destination or its objectStore) to read the backups from"),
    doc = "A set of Ankusa relay nodes: durable multi-tenant webhook relay on embedded stores",
    printcolumn(
        name = "Ready",
        type_ = "string",
        json_path = r#".status.conditions[?(@.type=="Ready")].status"#
    ),
    printcolumn(name = "Nodes", type_ = "string", json_path = ".status.nodesReady"),
    printcolumn(name = "Format", type_ = "integer", json_path = ".status.storeFormat"),
    printcolumn(name = "Target", type_ = "integer", json_path = ".status.targetFormat"),
    // What an upgrade is doing, empty while none runs: `kubectl get relays -o wide` shows them.
    printcolumn(name = "Upgrade", type_ = "string", json_path = ".status.upgrade.phase", priority = "1"),
    printcolumn(name = "Moving", type_ = "string", json_path = ".status.upgrade.currentPod", priority = "1"),
    printcolumn(
        name = "Tenants",
        type_ = "integer",
        json_path = ".status.tenants.count"
    ),
    printcolumn(
        name = "Pending",
        type_ = "integer",
        json_path = ".status.tenants.pending"
    ),
    printcolumn(name = "Dead", type_ = "integer", json_path = ".status.tenants.dead"),
    // Tenants held or refused: `kubectl get relays -o wide`.
    printcolumn(name = "Paused", type_ = "integer", json_path = ".status.tenants.paused", priority = "1"),
    printcolumn(name = "OverQuota", type_ = "integer", json_path = ".status.tenants.overQuota", priority = "1"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    // Rows the nodes a scale-down takes out still hold, until they are handed over.
    printcolumn(name = "Draining", type_ = "integer", json_path = ".status.draining"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct RelaySpec {
    /// Relay nodes (StatefulSet replicas). Each node has its own store and volume.
    #[serde(default = "default_replicas")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 99").message("replicas must be between 1 and 99"))]
    pub replicas: i32,
    /// The relay image, e.g. `ghcr.io/ankusa/relay:0.1.0`.
    #[schemars(length(max = 1024))]
    #[x_kube(validation = Rule::new("self != ''").message("image must not be empty"))]
    pub image: String,
    /// `Always`, `IfNotPresent` or `Never`; the cluster's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image_pull_policy: Option<String>,
    #[serde(default)]
    pub tenants: TenantsSpec,
    #[serde(default)]
    pub storage: StorageSpec,
    #[serde(default)]
    pub config: ConfigSpec,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup: Option<BackupSpec>,
    /// How a new Relay's nodes start: empty (the default), or from a backup set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootstrap: Option<BootstrapSpec>,
    /// Restore one node from a backup while the others serve (a corrupt or lost volume).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_node: Option<RestoreNodeSpec>,
    #[serde(default)]
    pub upgrade: UpgradeSpec,
    #[serde(default)]
    pub monitoring: MonitoringSpec,
    /// How providers reach the nodes' ingest listener: the `<name>-ingest` Service, and an
    /// optional Ingress or Gateway API HTTPRoute in front of it.
    #[serde(default)]
    pub ingest: IngestSpec,
    /// NetworkPolicies that admit exactly the relay's own traffic, for namespaces that
    /// deny by default.
    #[serde(default)]
    pub network_policy: NetworkPolicySpec,
    /// CPU and memory for each relay container. Unset: a request of
    /// [`DEFAULT_CPU_REQUEST`] and [`DEFAULT_MEMORY_REQUEST`] and no limit (Burstable, not
    /// the BestEffort pods a node's memory pressure evicts first). The node sizes its
    /// RocksDB memory from the container's memory limit when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<ResourceRequirements>,
    /// CPU and memory for the operator's probe and backup Jobs. Unset:
    /// [`default_job_resources`], requests and limits both, which a ResourceQuota that
    /// demands limits admits.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub job_resources: Option<ResourceRequirements>,
    /// Secrets to pull the image with, for the relay pods and the Jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.all(s, has(s.name) && s.name != '')").message("every imagePullSecrets entry needs a name"))]
    pub image_pull_secrets: Vec<LocalObjectReference>,
    /// The relay pods' affinity. Unset: a preferred anti-affinity across hosts
    /// (`kubernetes.io/hostname`), so the nodes of a Relay spread where they can; set, it
    /// replaces that default entirely.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub affinity: Option<Affinity>,
    /// Tolerations of the relay pods and the Jobs.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    #[x_kube(validation = Rule::new("self.all(t, !has(t.operator) || t.operator != 'Exists' || !has(t.value) || t.value == '')").message("a toleration with operator Exists takes no value"))]
    #[x_kube(validation = Rule::new("self.all(t, !has(t.operator) || t.operator == 'Exists' || t.operator == 'Equal')").message("a toleration's operator is Exists or Equal"))]
    #[x_kube(validation = Rule::new("self.all(t, has(t.key) && t.key != '' || has(t.operator) && t.operator == 'Exists')").message("a toleration without a key must have operator Exists"))]
    pub tolerations: Vec<Toleration>,
    /// Node labels the relay pods and the Jobs must be scheduled on.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 32))]
    pub node_selector: BTreeMap<String, String>,
    /// How the relay pods spread over zones or hosts (their own label selector is added
    /// when a constraint has none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 8))]
    #[x_kube(validation = Rule::new("self.all(c, c.maxSkew >= 1)").message("a topology spread constraint's maxSkew is at least 1"))]
    #[x_kube(validation = Rule::new("self.all(c, c.whenUnsatisfiable == 'DoNotSchedule' || c.whenUnsatisfiable == 'ScheduleAnyway')").message("whenUnsatisfiable is DoNotSchedule or ScheduleAnyway"))]
    pub topology_spread_constraints: Vec<TopologySpreadConstraint>,
    /// The relay pods' and the Jobs' PriorityClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub priority_class_name: Option<String>,
    /// Annotations on the relay pods and the Jobs' pods (e.g. a service mesh's opt-out:
    /// a sidecar that never exits keeps a Job's pod from finishing).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    #[x_kube(validation = Rule::new("!self.exists(k, k.startsWith('ankusa.dev/'))").message("podAnnotations must not set the operator's own ankusa.dev/ annotations"))]
    pub pod_annotations: BTreeMap<String, String>,
    /// Labels on the relay pods and the Jobs' pods. The labels the operator selects its
    /// pods by are its own.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend(
        "maxProperties" = 32,
        "additionalProperties" = {
            "type": "string",
            "maxLength": 63,
            "pattern": "^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$",
        },
    ))]
    #[x_kube(validation = Rule::new("!self.exists(k, k.startsWith('ankusa.dev/') || k in ['app.kubernetes.io/name', 'app.kubernetes.io/instance', 'app.kubernetes.io/component', 'app.kubernetes.io/managed-by'])").message("podLabels must not set the labels the operator selects its pods by (app.kubernetes.io/name, instance, component, managed-by, ankusa.dev/*)"))]
    pub pod_labels: BTreeMap<String, String>,
    /// The ServiceAccount of the relay pods and the Jobs (the namespace's `default` when
    /// unset). The relay calls no Kubernetes API; its token is not mounted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(max = 253),
        regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
    )]
    pub service_account_name: Option<String>,
    /// How long a relay container may take from its start to its first `/healthz` answer
    /// (the pod's startupProbe) before the kubelet restarts it; liveness is checked only
    /// after. A node serves `/healthz` before it opens its store, so this covers the
    /// container's own start (volume, process); raise it where those are slow.
    #[serde(default = "default_startup_seconds")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 86400").message("startupSeconds must be between 10 and 86400"))]
    pub startup_seconds: i64,
}

/// The relay container's CPU request when `spec.resources` is unset.
pub const DEFAULT_CPU_REQUEST: &str = "250m";
/// The relay container's memory request when `spec.resources` is unset.
pub const DEFAULT_MEMORY_REQUEST: &str = "512Mi";

/// The Jobs' resources when `spec.jobResources` is unset: a probe prints a line, a backup
/// streams a checkpoint through zstd.
pub fn default_job_resources() -> ResourceRequirements {
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let q = |cpu: &str, mem: &str| {
        BTreeMap::from([
            ("cpu".to_owned(), Quantity(cpu.to_owned())),
            ("memory".to_owned(), Quantity(mem.to_owned())),
        ])
    };
    ResourceRequirements {
        requests: Some(q("100m", "128Mi")),
        limits: Some(q("1", "512Mi")),
        ..ResourceRequirements::default()
    }
}

fn default_replicas() -> i32 {
    1
}

fn default_startup_seconds() -> i64 {
    300
}

/// The period of the relay pods' startupProbe; its failure threshold is
/// `startupSeconds` over it.
pub const STARTUP_PROBE_PERIOD_S: i64 = 5;

/// The tenant ceiling every node holds (`tenants.max` in the relay's configuration).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct TenantsSpec {
    /// The most tenants the Relay will hold (counted once across its nodes); ordinals are
    /// never reused.
    #[serde(default = "default_tenants_max")]
    #[x_kube(validation = Rule::new("self >= 1").message("tenants.max must be at least 1"))]
    pub max: i64,
}

impl Default for TenantsSpec {
    fn default() -> Self {
        TenantsSpec {
            max: default_tenants_max(),
        }
    }
}

fn default_tenants_max() -> i64 {
    1_000_000
}

/// Each node's volume (a PersistentVolumeClaim per node, never deleted by the operator).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StorageSpec {
    /// Requested size, a Kubernetes quantity.
    #[serde(default = "default_storage_size")]
    pub size: String,
    /// The StorageClass; the cluster's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class_name: Option<String>,
    /// What becomes of a node's claim when a scale-down takes the node out, once it has
    /// handed every row to the other nodes (the StatefulSet's
    /// `persistentVolumeClaimRetentionPolicy.whenScaled`): `Retain` (the default) keeps
    /// it, `Delete` deletes it. Claims are never deleted with the Relay.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub when_scaled: Option<ClaimRetention>,
}

/// The annotation that pauses the operator's work on one Relay: with the value `paused`,
/// the operator changes nothing of it (no apply, no Job, no scale, no claim) and says so in
/// the `Reconciling` condition, so that a person can do manual work on its objects (a
/// restore of one node's volume) without the operator undoing it. Remove it (or set any
/// other value) to resume.
pub const RECONCILE_ANNOTATION: &str = "ankusa.dev/reconcile";

impl RelaySpec {
    /// The backups the operator's Jobs take to a claim: `spec.backup` with a destination.
    pub fn claim_backup(&self) -> Option<(&BackupSpec, &BackupDestination)> {
        let b = self.backup.as_ref()?;
        Some((b, b.destination.as_ref()?))
    }

    /// The bucket the nodes push to: `spec.backup.objectStore`.
    pub fn object_store(&self) -> Option<&ObjectStoreSpec> {
        self.backup.as_ref()?.object_store.as_ref()
    }
}

impl Relay {
    /// The operator's work on this Relay is paused ([`RECONCILE_ANNOTATION`]).
    pub fn reconcile_paused(&self) -> bool {
        self.metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(RECONCILE_ANNOTATION))
            .is_some_and(|v| v == "paused")
    }
}

/// Whether a claim outlives its node.
#[derive(
    schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default,
)]
pub enum ClaimRetention {
    #[default]
    Retain,
    Delete,
}

impl Default for StorageSpec {
    fn default() -> Self {
        StorageSpec {
            size: default_storage_size(),
            storage_class_name: None,
            when_scaled: None,
        }
    }
}

fn default_storage_size() -> String {
    "10Gi".into()
}

/// The relay's configuration: sources, sinks, routes and any other relay key.
///
/// The operator owns the keys that tie a node to its pod (`data_dir`, the listeners,
/// `tenants.max`, the backup directory) and adds its own admin token; everything else is
/// passed through to `relay.yaml`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.inline) && has(self.configMapRef))").message("set config.inline or config.configMapRef, not both"))]
pub struct ConfigSpec {
    /// Relay configuration keys, as in `relay.yaml` (see docs/configuration.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "free_form_object")]
    pub inline: Option<serde_json::Value>,
    /// A ConfigMap in the Relay's namespace holding the relay configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_ref: Option<ConfigMapKeyRef>,
    /// Environment variables from Secrets, for `{ env: NAME }` secrets in the configuration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub secret_env: Vec<SecretEnv>,
    /// Secrets mounted read-only as directories, one file per key, at
    /// `/etc/ankusa-secrets/<name>`: for a source's `tenant_secrets: { dir: ... }` (a
    /// secret per tenant). A key added to the Secret reaches the nodes without a restart.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub secret_dirs: Vec<SecretDir>,
    /// Certificate authorities every sink's HTTPS server may be signed by, beyond the web
    /// PKI, from a key of a Secret (cert-manager's `ca.crt`) or a ConfigMap (a
    /// trust-manager Bundle): mounted as `/etc/ankusa-ca/ca.crt` and set as the nodes'
    /// `dispatch.ca_bundle`, in place of one the configuration gives. The nodes read it
    /// again when it rotates, without a restart.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle_ref: Option<CaBundleRef>,
}

/// Where `config.caBundleRef` is mounted (its directory), and the bundle's file in it.
pub const CA_BUNDLE_MOUNT: &str = "/etc/ankusa-ca";
pub const CA_BUNDLE_FILE: &str = "/etc/ankusa-ca/ca.crt";

/// A PEM bundle of certificate authorities: one key of a Secret or of a ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secret) != has(self.configMap)").message("caBundleRef names a secret or a configMap, exactly one"))]
pub struct CaBundleRef {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret: Option<BundleKey>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map: Option<BundleKey>,
}

/// A key of a Secret or a ConfigMap in the Relay's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BundleKey {
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("must be an object's name"))]
    pub name: String,
    /// The key holding the PEM bundle (default `ca.crt`).
    #[serde(default = "default_bundle_key")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[-._a-zA-Z0-9]+$')").message("must be a key of a Secret or a ConfigMap"))]
    pub key: String,
}

fn default_bundle_key() -> String {
    "ca.crt".into()
}

/// A Secret mounted as a directory (`config.secretDirs`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretDir {
    /// The Secret's name, in the Relay's namespace.
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("self.matches('^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$')").message("must be a Secret's name"))]
    pub name: String,
}

/// Where `config.secretDirs` are mounted, each under its Secret's name.
pub const SECRET_DIRS_MOUNT: &str = "/etc/ankusa-secrets";

/// A key of a ConfigMap.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigMapKeyRef {
    pub name: String,
    /// The key holding the YAML (default `relay.yaml`).
    #[serde(default = "default_config_key")]
    pub key: String,
}

fn default_config_key() -> String {
    "relay.yaml".into()
}

/// An environment variable set from a Secret's key.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SecretEnv {
    /// The variable's name, as the configuration names it in `{ env: NAME }`.
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^[A-Za-z_][A-Za-z0-9_]*$')").message("must be an environment variable name"))]
    pub name: String,
    pub secret_key_ref: SecretKeySelector,
}

/// When and where the nodes' stores are backed up: archives on a claim by the operator's
/// Jobs (`destination`), pushes to an object store by the nodes themselves
/// (`objectStore`), or both.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.destination) || has(self.objectStore)").message("set backup.destination (a claim), backup.objectStore (a bucket), or both"))]
pub struct BackupSpec {
    /// Archives on a claim, taken by the operator's Jobs (before upgrades, and on
    /// `schedule`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination: Option<BackupDestination>,
    /// Incremental backups each node pushes to an S3-compatible bucket, under
    /// `<prefix>/<pod>/`, every `intervalSeconds`: they outlive the namespace and the
    /// cluster, and `bootstrap.fromBackup.objectStore` recreates a Relay from them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<ObjectStoreSpec>,
    /// Backups kept per node on the destination.
    #[serde(default = "default_retention")]
    #[x_kube(validation = Rule::new("self >= 1").message("retention must be at least 1"))]
    pub retention: i32,
    #[serde(default)]
    pub policy: BackupPolicy,
    /// A cron schedule (five fields, UTC, or `@daily` and the like) of backups besides the
    /// upgrade gate's: at each time, every node is backed up in turn, one Job at a time,
    /// and `retention` archives per node are kept. Unset: backups run only before
    /// upgrades.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    #[x_kube(validation = Rule::new("self.matches('^(@[a-z]+|\\\\S+(\\\\s+\\\\S+){4})$')").message("schedule is a cron schedule of five fields (minute hour day-of-month month day-of-week), or @hourly, @daily, @weekly, @monthly, @yearly"))]
    pub schedule: Option<String>,
}

fn default_retention() -> i32 {
    3
}

/// An S3-compatible bucket (AWS S3, or a server of your own: requests are path-style).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStoreSpec {
    /// `s3://bucket/prefix`: node `<pod>`'s backups go under `<prefix>/<pod>/`.
    #[schemars(length(min = 6, max = 512))]
    #[x_kube(validation = Rule::new("self.matches('^s3://[a-z0-9][a-z0-9.-]{1,61}[a-z0-9](/.*)?$')").message("url is s3://bucket/prefix, the bucket a valid S3 bucket name"))]
    pub url: String,
    /// The server's URL (`https://…`, or `http://…` for a server on a private network);
    /// unset: AWS S3 in `region`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 8, max = 512))]
    #[x_kube(validation = Rule::new("self.startsWith('http://') || self.startsWith('https://')").message("endpoint is an http:// or https:// URL"))]
    pub endpoint: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64))]
    pub region: Option<String>,
    /// A Secret in the Relay's namespace with the access key (`AWS_ACCESS_KEY_ID`) and the
    /// secret key (`AWS_SECRET_ACCESS_KEY`). Unset: the pods' own (a web identity, the
    /// instance metadata service with `instanceMetadata`), or unsigned requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub credentials_secret: Option<String>,
    /// PEM certificates to trust besides the system's: a Secret's or a ConfigMap's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
    /// Without a credentials Secret, ask the cloud's instance metadata service.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub instance_metadata: bool,
    /// Time between two pushes of a node: the most traffic a lost volume loses, plus a
    /// push's own duration (docs/deployment.md, recovery point).
    #[serde(default = "default_interval_seconds")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 86400").message("intervalSeconds must be between 10 and 86400"))]
    pub interval_seconds: i64,
    /// Backups kept per node; a file goes once no kept backup names it.
    #[serde(default = "default_object_retention")]
    #[x_kube(validation = Rule::new("self >= 1 && self <= 10000").message("objectStore.retention must be between 1 and 10000"))]
    pub retention: i32,
    /// Keep, beyond `retention`, each node's newest backup of every store format older than
    /// its newest backup's: what `upgrade.rollbackTo` restores after a format upgrade.
    /// Set it to false once the upgrade is settled to let them age out.
    #[serde(default = "default_true")]
    pub keep_older_formats: bool,
    /// The most a node's push uploads per second (unset: 32 MiB/s; 0: as fast as it goes),
    /// what it may take of the node while ingest goes on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self == 0 || self >= 1048576").message("maxBytesPerSecond is 0 (no limit) or at least 1048576"))]
    pub max_bytes_per_second: Option<i64>,
}

fn default_true() -> bool {
    true
}

fn default_interval_seconds() -> i64 {
    300
}

fn default_object_retention() -> i32 {
    24
}

/// PEM certificates in a Secret or a ConfigMap of the Relay's namespace.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.secretName) != has(self.configMapName)").message("set caBundle.secretName or caBundle.configMapName, not both"))]
pub struct CaBundle {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub config_map_name: Option<String>,
    /// The key holding the certificates.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// Where the backups go: one claim for every node's backups (`claimName`), or a claim
/// per node the operator makes from a template (`claimTemplate`). Never a node's own
/// volume: a backup on the node's disk does not count.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.claimName) != has(self.claimTemplate)").message("set backup.destination.claimName (one claim for every node) or backup.destination.claimTemplate (a claim per node), not both"))]
pub struct BackupDestination {
    /// One claim, made by you, holding every node's backups (`<relay>/<pod>/`). The
    /// operator runs one backup Job at a time on it, so a ReadWriteOnce volume attaches
    /// to one host at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    #[x_kube(validation = Rule::new("!self.startsWith('data-')").message("the backup claim must not be a node's own volume (data-*)"))]
    pub claim_name: Option<String>,
    /// A claim per node, `<name>-backups-<ordinal>`, made by the operator from this
    /// template and kept like the nodes' own claims: each node's backups on a volume of
    /// their own, in the zone of the node's first backup Job (which prefers the node's
    /// zone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim_template: Option<BackupClaimTemplate>,
}

/// The per-node backup claims' spec.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BackupClaimTemplate {
    /// Requested size, a Kubernetes quantity: `retention` archives of the node's store plus
    /// one more store (checking an archive unpacks it beside itself).
    #[schemars(length(min = 1, max = 64))]
    pub size: String,
    /// The StorageClass; the cluster's default when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub storage_class_name: Option<String>,
}

impl BackupDestination {
    /// One claim for every node (`None`: a claim per node).
    pub fn shared(&self) -> Option<&str> {
        self.claim_name.as_deref()
    }
}

/// When a backup runs before pods move.
#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum BackupPolicy {
    /// Before every change of release (image), whatever its store format.
    Always,
    /// Before a rollout that changes the store format.
    #[default]
    FormatChange,
    /// Never (a format change then rolls without a safety net).
    Never,
}

/// How a new Relay's nodes start.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct BootstrapSpec {
    /// Restore every node from its newest backup on a backup claim before its first start
    /// (disaster recovery: the volumes or the cluster were lost). Applies only to a Relay
    /// whose nodes have no volume yet; it never replaces a store that exists.
    pub from_backup: FromBackup,
}

/// One node restored from its backups while the others serve: that node stops, its store
/// is replaced by the archive (the store it had is moved aside on its volume, never
/// deleted), and it starts again. Runs once per `request`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct RestoreNodeSpec {
    /// The node's ordinal (`<name>-<ordinal>`).
    #[x_kube(validation = Rule::new("self >= 0 && self <= 98").message("restoreNode.ordinal must be between 0 and 98"))]
    pub ordinal: i32,
    /// An archive of the node's backup directory (`b<ms>.tar.zst`); unset: its newest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^b[0-9]+\.tar\.zst$"))]
    pub backup: Option<String>,
    /// Any value: the restore runs once for it; a new value asks for another.
    #[schemars(length(min = 1, max = 63))]
    pub request: String,
}

/// A backup set: the archives of each node of a Relay on a backup claim
/// (`<relay>/<relay>-<ordinal>/b<ms>.tar.zst`, what backup Jobs write), or the backups its
/// nodes pushed to an object store (`<prefix>/<relay>-<ordinal>/`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!(has(self.claimName) && has(self.objectStore))").message("bootstrap.fromBackup reads a claimName or an objectStore, not both"))]
pub struct FromBackup {
    /// The bucket the Relay's nodes pushed to (`spec.backup.objectStore` of the Relay that
    /// was lost): each node restores the newest backup under `<prefix>/<relay>-<i>/`, every
    /// file checked. Needs no claim: the Relay can be recreated in another namespace or
    /// cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_store: Option<ObjectStoreSpec>,
    /// The claim holding the backups, in this namespace (default:
    /// `spec.backup.destination.claimName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub claim_name: Option<String>,
    /// The Relay the backups were taken of (default: this one's name): node `i` is restored
    /// from `<relay>/<relay>-<i>/`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(
        length(min = 1, max = 40),
        regex(pattern = r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
    )]
    pub relay: Option<String>,
}

/// Controls of the backup-gated format upgrade.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeSpec {
    /// Hold every pod on its current release.
    #[serde(default)]
    pub paused: bool,
    /// Change this value to retry a failed upgrade.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub retry: Option<String>,
    /// How long each step of a gated upgrade may take before the upgrade is `Failed`.
    #[serde(default)]
    pub timeouts: UpgradeTimeouts,
    /// Roll back to an older release by restoring every node from its newest backup at
    /// that release's store format: the nodes stop, each store is replaced (the one it
    /// had is moved aside on its volume, not deleted), and they start on `image`. What
    /// the nodes acked after those backups is lost, which `acknowledgeDataLoss` says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_to: Option<RollbackTo>,
}

/// An explicit rollback by restore (`spec.upgrade.rollbackTo`).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("self.acknowledgeDataLoss == true").message("rollbackTo restores the nodes from backups: what they acked since is lost; set acknowledgeDataLoss: true to say so"))]
pub struct RollbackTo {
    /// The release to return to: `spec.image` must name it too.
    #[schemars(length(min = 1, max = 1024))]
    pub image: String,
    #[serde(default)]
    pub acknowledge_data_loss: bool,
}

/// Deadlines of the gated upgrade's steps, in seconds.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeTimeouts {
    /// The image probe Job (`activeDeadlineSeconds`): pulling the image and printing its
    /// version.
    #[serde(default = "default_probe_seconds")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 86400").message("probeSeconds must be between 10 and 86400"))]
    pub probe_seconds: i64,
    /// Each node's backup Job (`activeDeadlineSeconds`).
    #[serde(default = "default_backup_seconds")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 604800").message("backupSeconds must be between 10 and 604800"))]
    pub backup_seconds: i64,
    /// Each node, from its partition drop to Ready on the new release with its migration
    /// finished.
    #[serde(default = "default_verify_seconds")]
    #[x_kube(validation = Rule::new("self >= 10 && self <= 604800").message("verifySeconds must be between 10 and 604800"))]
    pub verify_seconds: i64,
}

impl Default for UpgradeTimeouts {
    fn default() -> Self {
        UpgradeTimeouts {
            probe_seconds: default_probe_seconds(),
            backup_seconds: default_backup_seconds(),
            verify_seconds: default_verify_seconds(),
        }
    }
}

fn default_probe_seconds() -> i64 {
    600
}

fn default_backup_seconds() -> i64 {
    3600
}

fn default_verify_seconds() -> i64 {
    1800
}

/// The `<name>-ingest` Service (the ingest port only: the admin API is never exposed with
/// it) and what routes providers' requests to it.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct IngestSpec {
    #[serde(default)]
    pub service: IngestServiceSpec,
    /// A `networking.k8s.io/v1` Ingress for `/ingest/` on `host` (unset: none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ingress: Option<IngressSpec>,
    /// A `gateway.networking.k8s.io/v1` HTTPRoute for `/ingest/` attached to the named
    /// Gateways (unset: none). The Gateway API's CRDs must be installed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_route: Option<HttpRouteSpec>,
}

/// The `<name>-ingest` Service.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.externalTrafficPolicy) || self.type != 'ClusterIP'").message("externalTrafficPolicy applies to a NodePort or LoadBalancer Service only"))]
#[x_kube(validation = Rule::new("!has(self.loadBalancerSourceRanges) || size(self.loadBalancerSourceRanges) == 0 || self.type == 'LoadBalancer'").message("loadBalancerSourceRanges applies to a LoadBalancer Service only"))]
pub struct IngestServiceSpec {
    /// `ClusterIP` (default), `NodePort` or `LoadBalancer`.
    #[serde(rename = "type", default = "default_service_type")]
    #[x_kube(validation = Rule::new("self in ['ClusterIP', 'NodePort', 'LoadBalancer']").message("type is ClusterIP, NodePort or LoadBalancer"))]
    pub type_: String,
    /// Annotations on the Service (a cloud's load balancer settings).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub annotations: BTreeMap<String, String>,
    /// `Cluster` or `Local` (keeps the client's address, on the nodes that run a relay pod).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[x_kube(validation = Rule::new("self in ['Cluster', 'Local']").message("externalTrafficPolicy is Cluster or Local"))]
    pub external_traffic_policy: Option<String>,
    /// CIDRs a LoadBalancer admits (e.g. a provider's published webhook ranges).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(max = 43)))]
    #[x_kube(validation = Rule::new("self.all(c, isCIDR(c))").message("every loadBalancerSourceRanges entry must be a CIDR such as 192.0.2.0/24"))]
    pub load_balancer_source_ranges: Vec<String>,
    /// The load balancer implementation (`spec.loadBalancerClass`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub load_balancer_class: Option<String>,
}

impl Default for IngestServiceSpec {
    fn default() -> Self {
        IngestServiceSpec {
            type_: default_service_type(),
            annotations: BTreeMap::new(),
            external_traffic_policy: None,
            load_balancer_source_ranges: Vec::new(),
            load_balancer_class: None,
        }
    }
}

fn default_service_type() -> String {
    "ClusterIP".into()
}

/// An Ingress routing `https://<host>/ingest/` to the `<name>-ingest` Service.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IngressSpec {
    /// The host providers send to.
    #[schemars(
        length(min = 1, max = 253),
        regex(
            pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
        )
    )]
    pub host: String,
    /// The IngressClass (the cluster's default when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub class_name: Option<String>,
    /// Annotations on the Ingress (e.g. a cert-manager issuer, a body size limit).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub annotations: BTreeMap<String, String>,
    /// A Secret in the Relay's namespace with the certificate for `host` (unset: no TLS
    /// section; the controller's default certificate, if any).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub tls_secret_name: Option<String>,
}

/// An HTTPRoute attaching `/ingest/` on the named Gateways to the `<name>-ingest` Service.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// The Gateways (and listeners) to attach to.
    #[schemars(length(min = 1, max = 32))]
    pub parent_refs: Vec<GatewayRef>,
    /// Hostnames the route matches (empty: the listeners' own), lower-case DNS names (a
    /// leading `*.` allowed).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 16),
        inner(
            length(min = 1, max = 253),
            regex(
                pattern = r"^(\*\.)?[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
            )
        )
    )]
    pub hostnames: Vec<String>,
    /// Annotations on the HTTPRoute.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 64))]
    pub annotations: BTreeMap<String, String>,
}

/// A Gateway an HTTPRoute attaches to.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRef {
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The Gateway's namespace (the Relay's when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub namespace: Option<String>,
    /// One listener of the Gateway (all when unset).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 253))]
    pub section_name: Option<String>,
}

/// The NetworkPolicies of a Relay. Enabled, the relay pods admit only:
/// - on the ingest port, the providers (`ingestFrom`; anyone when empty) and the other
///   nodes of the Relay, which forward to a tenant's owner;
/// - on the admin port, the other nodes (relay-wide admin), the operator (it polls every
///   node), the operator's backup Jobs (they pull a checkpoint), the scrapers
///   (`metricsFrom`) and whoever `adminFrom` names (people with the admin CLI).
///
/// Nothing else reaches the pods, and egress is left alone (sinks are anywhere).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NetworkPolicySpec {
    #[serde(default)]
    pub enabled: bool,
    /// Who may send hooks (empty: any source, as a public webhook endpoint needs).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub ingest_from: Vec<NetworkPolicyPeer>,
    /// Who may scrape `/metrics` on the admin port. Default: pods labelled
    /// `app.kubernetes.io/name: prometheus` in any namespace (the Prometheus Operator's).
    #[serde(default = "default_metrics_from")]
    #[schemars(length(max = 32))]
    pub metrics_from: Vec<NetworkPolicyPeer>,
    /// Who else may call the admin API (empty: nobody but the operator and the nodes).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub admin_from: Vec<NetworkPolicyPeer>,
}

impl Default for NetworkPolicySpec {
    fn default() -> Self {
        NetworkPolicySpec {
            enabled: false,
            ingest_from: Vec::new(),
            metrics_from: default_metrics_from(),
            admin_from: Vec::new(),
        }
    }
}

fn default_metrics_from() -> Vec<NetworkPolicyPeer> {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
    vec![NetworkPolicyPeer {
        namespace_selector: Some(LabelSelector::default()),
        pod_selector: Some(LabelSelector {
            match_labels: Some(BTreeMap::from([(
                "app.kubernetes.io/name".to_owned(),
                "prometheus".to_owned(),
            )])),
            ..LabelSelector::default()
        }),
        ip_block: None,
    }]
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct MonitoringSpec {
    #[serde(default)]
    pub service_monitor: ServiceMonitorSpec,
}

/// A Prometheus Operator `ServiceMonitor` for the nodes' `/metrics`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ServiceMonitorSpec {
    #[serde(default)]
    pub enabled: bool,
    /// Scrape interval, a Prometheus duration.
    #[serde(default = "default_scrape_interval")]
    #[schemars(length(max = 16))]
    #[x_kube(validation = Rule::new("self.matches('^[0-9]+(ms|s|m|h)$')").message("interval must be a duration such as 30s"))]
    pub interval: String,
    /// Labels on the ServiceMonitor (what the Prometheus selects on).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// Prometheus relabel configs applied to the scrape.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "free_form_list")]
    pub relabelings: Vec<serde_json::Value>,
}

impl Default for ServiceMonitorSpec {
    fn default() -> Self {
        ServiceMonitorSpec {
            enabled: false,
            interval: default_scrape_interval(),
            labels: BTreeMap::new(),
            relabelings: Vec::new(),
        }
    }
}

fn default_scrape_interval() -> String {
    "30s".into()
}

fn free_form_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "object",
        "x-kubernetes-preserve-unknown-fields": true,
    })
}

fn free_form_list(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "array",
        "items": { "type": "object", "x-kubernetes-preserve-unknown-fields": true },
    })
}
