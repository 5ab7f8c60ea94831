//! What the operator observed of a `Relay`'s objects, pods and nodes ([`Observed`]),
//! the objects it owns ([`Owned`]), and the small facts about them every module reads:
//! the planner decides from these, the controller fills them, the resources and the
//! restore and status code read them. Pure data and pure functions.

use std::collections::BTreeMap;

use ankusa_api::node::NodeStatus;
use ankusa_crds::status::{UpgradePhase, UpgradeStatus};
use serde_json::Value;

/// What a StatefulSet reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StsObs {
    /// The image of the pod template.
    pub image: String,
    /// The rolling-update partition in force.
    pub partition: i32,
    pub ready_replicas: i32,
    pub updated_replicas: i32,
    /// Its replicas as the live object says (0: not read).
    #[serde(default)]
    pub replicas: i32,
}

/// A pod of the `Relay`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct PodObs {
    pub name: String,
    pub ordinal: i32,
    /// The relay container's image.
    pub image: String,
    /// The pod's Ready condition.
    pub ready: bool,
    #[serde(default)]
    /// The relay container cannot run (crash-looping, an image that cannot be pulled or
    /// named, a container that cannot be created): on the upgrade's current pod, that
    /// fails the upgrade.
    pub failing: Option<String>,
    /// Why a pod that is not failing is not Ready yet (unschedulable, creating): named
    /// when its step runs out of time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub waiting: Option<String>,
    /// Since when the scheduler has found no node for it (RFC 3339), while it has not.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unschedulable_since: Option<String>,
}

/// What a node answered at `/v1/node` (and `/v1/tenants?top=`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeReading {
    pub status: NodeStatus,
    /// Its tenants with the most pending work.
    pub top: Vec<TenantReading>,
}

/// One tenant as a node reports it (`GET /v1/tenants?top=`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct TenantReading {
    pub tenant: String,
    pub pending: i64,
    pub dead: i64,
    /// When its oldest due row became due (ms since the epoch).
    pub oldest_due_at_ms: Option<u64>,
    pub paused: bool,
    pub quota_refusals: u64,
}

/// A Job the planner asked for, as the cluster reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JobObs {
    Running,
    Succeeded,
    Failed(String),
}

/// The backup destination's claim.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum BackupClaimObs {
    /// No claim of that name in the namespace.
    Missing,
    /// The claim, with its capacity once bound (bytes).
    Present { capacity_bytes: Option<u64> },
}

/// What the image probe learned of an image.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum ProbeObs {
    Running,
    /// The store format the image's `ankusa-relay version --json` reports.
    Format(u32),
    Failed(String),
}

/// The owned objects as they are in the cluster (JSON, as read), `None` when absent.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct ObservedObjects {
    pub config_map: Option<Value>,
    pub headless: Option<Value>,
    pub client: Option<Value>,
    pub statefulset: Option<Value>,
    pub pdb: Option<Value>,
    pub service_monitor: Option<Value>,
    pub ingest_service: Option<Value>,
    /// The optional objects, each only when this Relay owns it.
    pub ingress: Option<Value>,
    pub http_route: Option<Value>,
    pub network_policy: Option<Value>,
    /// Each existing object as it would be after the operator's apply: the API server's
    /// answer to a dry-run apply of the desired object, with its defaults, canonical
    /// quantities, and the fields the operator no longer sets removed. Where present,
    /// drift is "this differs from the live object"; where absent (the planner's YAML
    /// scenarios), drift is a field of the desired object missing from the live one.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub applied: BTreeMap<Owned, Value>,
}

impl ObservedObjects {
    /// The live object of `kind`.
    pub fn get(&self, kind: Owned) -> Option<&Value> {
        match kind {
            Owned::ConfigMap => self.config_map.as_ref(),
            Owned::HeadlessService => self.headless.as_ref(),
            Owned::ClientService => self.client.as_ref(),
            Owned::StatefulSet => self.statefulset.as_ref(),
            Owned::PodDisruptionBudget => self.pdb.as_ref(),
            Owned::ServiceMonitor => self.service_monitor.as_ref(),
            Owned::IngestService => self.ingest_service.as_ref(),
            Owned::Ingress => self.ingress.as_ref(),
            Owned::HttpRoute => self.http_route.as_ref(),
            Owned::NetworkPolicy => self.network_policy.as_ref(),
        }
    }
}

/// Everything the planner decides from.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct Observed {
    pub statefulset: Option<StsObs>,
    pub pods: Vec<PodObs>,
    /// Poll results by pod name; a pod that is not Ready is not polled.
    pub nodes: BTreeMap<String, Result<NodeReading, String>>,
    /// Image probe results by image.
    pub probes: BTreeMap<String, ProbeObs>,
    /// The digest (`sha256:…`) each probed image resolved to: pods run `image@digest`, so
    /// a tag pushed again later does not change what runs.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub digests: BTreeMap<String, String>,
    /// Backup Jobs of the current upgrade step, by ordinal.
    pub backups: BTreeMap<i32, JobObs>,
    /// Restore Jobs of the restore under way (`status.restore`), by ordinal.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub restores: BTreeMap<i32, JobObs>,
    /// What a node restore's Job reported in its termination message, once it succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_report: Option<ankusa_api::node::NodeRestoreReport>,
    /// The claim a restore reads for its next node, and whether it exists (`None`: not
    /// read).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub restore_claim: Option<(String, bool)>,
    /// With a backup claim per node: each node's, as read, by ordinal (the operator makes
    /// the missing ones).
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub node_backup_claims: BTreeMap<i32, BackupClaimObs>,
    /// Backup Jobs of the scheduled run under way (`status.scheduledBackups.run`), by
    /// ordinal.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub scheduled: BTreeMap<i32, JobObs>,
    /// Ordinals of the nodes' volume claims (`data-<name>-<ordinal>`) that exist.
    pub claims: Vec<i32>,
    /// `spec.backup.destination`'s claim, as read (`None`: not read, nothing is checked).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub backup_claim: Option<BackupClaimObs>,
    /// Each backup claim's room as its last backup Job reported it, by claim: what
    /// `status.backupClaims` held, with the reports of Jobs finished since.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub backup_claim_rooms: BTreeMap<String, ankusa_crds::status::BackupClaimRoom>,
    /// Each node's archives on its backup claim as its last backup Job reported them, by
    /// pod: what `status.claimArchives` held, with the reports of Jobs finished since.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub claim_archives: BTreeMap<String, ankusa_crds::status::NodeArchives>,
    pub objects: ObservedObjects,
    /// `monitoring.coreos.com/v1` `servicemonitors` is served.
    pub service_monitor_api: bool,
    /// `gateway.networking.k8s.io/v1` `httproutes` is served.
    pub http_route_api: bool,
    /// The user's configuration could not be read (a missing ConfigMap, bad YAML).
    pub config_error: Option<String>,
    /// An apply the controller tried and the API server refused.
    pub apply_error: Option<String>,
    /// `spec.storage` differs from the StatefulSet's claim templates (which cannot change
    /// in place): what the user has to do.
    pub storage_change: Option<String>,
    /// Objects at this Relay's names that it does not own (no controller reference to it):
    /// it takes none of them, and while one of a kind it wants is there it applies nothing
    /// (`Degraded`: `ObjectNotOwned`, naming each).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub foreign: Vec<ForeignObject>,
    /// Why pods of the StatefulSet or of the Relay's Jobs could not be created (their
    /// controllers' recent `FailedCreate` Events), newest first: `Kind name: message`.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub create_failures: Vec<String>,
    /// What other operator installs that watch this Relay and leave it to this one said in
    /// the last ten minutes (`Degraded`: `AnotherOperatorWatches`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub refusals: Vec<String>,
    /// The nodes' data claims (`data-<name>-<ordinal>`), for their growth.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub data_claims: Vec<DataClaim>,
    /// RFC 3339, for condition transition times.
    pub now: String,
}

/// A node's data claim as it is.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct DataClaim {
    pub name: String,
    pub class: Option<String>,
    /// `spec.resources.requests.storage`.
    pub requested: Option<String>,
    /// Bound to a volume (only a bound claim may grow).
    pub bound: bool,
}

/// An object at one of a Relay's names that is not the Relay's.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ForeignObject {
    /// Its kind among the applied objects (`None`: the operator's token Secret).
    pub kind: Option<Owned>,
    /// `Kind/name`.
    pub object: String,
    /// Whose it is: its controller (`Relay other`), or that it has none.
    pub owner: String,
}

impl ForeignObject {
    /// The live object `v` at `object` (`Kind/name`), if it is not controlled by the
    /// object of UID `uid`.
    pub fn of(kind: Option<Owned>, object: String, v: &Value, uid: Option<&str>) -> Option<Self> {
        let controller = v
            .pointer("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .and_then(|refs| refs.iter().find(|r| r["controller"] == true));
        match controller {
            Some(c) if uid.is_some() && c["uid"].as_str() == uid => None,
            Some(c) => Some(ForeignObject {
                kind,
                object,
                owner: format!(
                    "{} {}",
                    c["kind"].as_str().unwrap_or("object"),
                    c["name"].as_str().unwrap_or("?")
                ),
            }),
            None => Some(ForeignObject {
                kind,
                object,
                owner: "no controller (made by hand or by another tool)".into(),
            }),
        }
    }
}

/// An owned object kind.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub enum Owned {
    ConfigMap,
    HeadlessService,
    ClientService,
    StatefulSet,
    PodDisruptionBudget,
    ServiceMonitor,
    IngestService,
    Ingress,
    HttpRoute,
    NetworkPolicy,
}

impl Owned {
    /// Every kind, in apply order.
    pub const ALL: [Owned; 10] = [
        Owned::ConfigMap,
        Owned::HeadlessService,
        Owned::ClientService,
        Owned::StatefulSet,
        Owned::PodDisruptionBudget,
        Owned::ServiceMonitor,
        Owned::IngestService,
        Owned::Ingress,
        Owned::HttpRoute,
        Owned::NetworkPolicy,
    ];

    /// A kind the Relay has only when its spec asks for it: one it owns that is no longer
    /// wanted is deleted.
    pub fn optional(self) -> bool {
        matches!(
            self,
            Owned::ServiceMonitor | Owned::Ingress | Owned::HttpRoute | Owned::NetworkPolicy
        )
    }

    pub fn kind(self) -> &'static str {
        match self {
            Owned::ConfigMap => "ConfigMap",
            Owned::HeadlessService | Owned::ClientService | Owned::IngestService => "Service",
            Owned::StatefulSet => "StatefulSet",
            Owned::PodDisruptionBudget => "PodDisruptionBudget",
            Owned::ServiceMonitor => "ServiceMonitor",
            Owned::Ingress => "Ingress",
            Owned::HttpRoute => "HTTPRoute",
            Owned::NetworkPolicy => "NetworkPolicy",
        }
    }
}

/// Why the rollout is not moving.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Hold {
    pub reason: &'static str,
    pub message: String,
    /// The hold is a fault (Degraded), not a wait.
    pub fault: bool,
}

pub(crate) fn hold(reason: &'static str, message: impl Into<String>, fault: bool) -> Option<Hold> {
    Some(Hold {
        reason,
        message: message.into(),
        fault,
    })
}

pub fn in_progress(u: &UpgradeStatus) -> bool {
    matches!(
        u.phase,
        UpgradePhase::BackingUp
            | UpgradePhase::Rolling
            | UpgradePhase::Verifying
            | UpgradePhase::Failed
            | UpgradePhase::Blocked
    ) && u.target_image.is_some()
}

/// `reference` names `image`: the same string, or `image` pinned to a digest
/// (`image@sha256:…`).
pub fn names_image(image: &str, reference: &str) -> bool {
    reference == image
        || reference
            .strip_prefix(image)
            .is_some_and(|rest| rest.starts_with("@sha256:"))
}

/// Seconds from `since` to `now` (both RFC 3339); `None` when either does not parse.
pub fn elapsed_s(since: &str, now: &str) -> Option<i64> {
    use k8s_openapi::jiff::Timestamp;
    let (a, b) = (
        since.parse::<Timestamp>().ok()?,
        now.parse::<Timestamp>().ok()?,
    );
    Some(b.as_second() - a.as_second())
}

/// An object without what changes under it on every write or is not the operator's to
/// set: its resourceVersion, generation, managed fields and status.
pub fn comparable(v: &Value) -> Value {
    let mut v = v.clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        for k in ["resourceVersion", "generation", "managedFields"] {
            meta.remove(k);
        }
    }
    if let Some(o) = v.as_object_mut() {
        o.remove("status");
    }
    v
}

/// `have` holds every field of `want` with the same value. Objects are compared key by
/// key (extra keys in `have` are the cluster's defaults); lists element by element.
pub fn contains(have: &Value, want: &Value) -> bool {
    match (have, want) {
        (Value::Object(h), Value::Object(w)) => w.iter().all(|(k, wv)| match h.get(k) {
            Some(hv) => contains(hv, wv),
            None => wv.is_null() || wv == &Value::Object(Default::default()),
        }),
        (Value::Array(h), Value::Array(w)) => {
            h.len() == w.len() && h.iter().zip(w).all(|(hv, wv)| contains(hv, wv))
        }
        // The API server prints integers in quantities and ports as it was given; a
        // number against its string form (an IntOrString) is the same value.
        (Value::String(h), Value::Number(w)) | (Value::Number(w), Value::String(h)) => {
            h == &w.to_string()
        }
        (h, w) => h == w,
    }
}
