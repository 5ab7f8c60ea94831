//! Observed state → next action. Pure: no clock, no client, no randomness; the controller
//! gathers an [`Observed`], calls these functions and carries out what they return.
//!
//! Three decisions, each a function:
//! - [`rollout`]: which image the StatefulSet carries, where its rolling-update partition
//!   stands, which Jobs must run, and the upgrade cursor (`status.upgrade`).
//! - [`changes`]: which owned objects are missing or drifted from what the spec asks for
//!   (create / update; the type has no delete, and no claim is ever among the objects).
//! - [`crate::status::status`] (its own module): the `Relay`'s status from the same
//!   [`Observed`].
//!
//! # The upgrade gate
//! A release whose store format is higher than the nodes' (learned by an image probe Job,
//! cached in the cursor) moves only behind a backup:
//! 1. the partition is held at `replicas`, so no pod moves;
//! 2. a backup Job per node pulls the node's checkpoint to the backup volume; all must
//!    succeed;
//! 3. the partition drops one ordinal at a time, highest first, each time only after the
//!    pod above it is Ready on the new release and reports the new format with no
//!    migration running;
//! 4. a failure stops the roll where it is (`Failed`, `Degraded`) until
//!    `spec.upgrade.retry` changes;
//! 5. a new image requested mid-upgrade waits for the upgrade to finish; an image whose
//!    format is *lower* than the stores' is refused (`Blocked`): format 3 is a one-way door.
//!
//! Invariants (property-tested in `tests`): the partition never drops below `replicas`
//! for a gated target without every backup of that target succeeded; it drops by at most
//! one ordinal per decision, and only past a verified pod; a restarted operator resumes
//! from `status` alone (the functions keep no state).
//!
//! A release with the same store format rolls the ordinary way: partition 0, and the
//! StatefulSet controller replaces pods one at a time, waiting for readiness.

use std::collections::BTreeMap;

use ankusa_crds::node::NodeStatus;
use ankusa_crds::relay::{BackupPolicy, Relay, RelayStatus, UpgradePhase, UpgradeStatus};
use serde_json::Value;

use crate::resources::DesiredSet;

/// What a StatefulSet reports.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct StsObs {
    /// The image of the pod template.
    pub image: String,
    /// The rolling-update partition in force.
    pub partition: i32,
    pub ready_replicas: i32,
    pub updated_replicas: i32,
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
    /// The relay container is waiting in CrashLoopBackOff (or its image cannot be
    /// pulled): on the upgrade's current pod, that fails the upgrade.
    pub failing: Option<String>,
}

/// What a node answered at `/v1/node` (and `/v1/tenants?top=`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NodeReading {
    pub status: NodeStatus,
    /// Its tenants with the most pending work: (tenant, pending, dead).
    pub top: Vec<(String, i64, i64)>,
}

/// A Job the planner asked for, as the cluster reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JobObs {
    Running,
    Succeeded,
    Failed(String),
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
    /// Backup Jobs of the current upgrade attempt, by ordinal.
    pub backups: BTreeMap<i32, JobObs>,
    pub objects: ObservedObjects,
    /// `monitoring.coreos.com/v1` `servicemonitors` is served.
    pub service_monitor_api: bool,
    /// The user's configuration could not be read (a missing ConfigMap, bad YAML).
    pub config_error: Option<String>,
    /// An apply the controller tried and the API server refused.
    pub apply_error: Option<String>,
    /// RFC 3339, for condition transition times.
    pub now: String,
}

/// A Job to create.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum JobAction {
    /// Run `ankusa-relay version --json` from `image` to learn its store format.
    Probe { image: String },
    /// Pull node `ordinal`'s checkpoint to the backup volume for `target`.
    /// `name` carries the attempt (the retry token), so a retried upgrade backs up anew.
    Backup {
        ordinal: i32,
        target: String,
        name: String,
    },
}

/// The rollout decision.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Rollout {
    /// The image the StatefulSet's template carries.
    pub image: String,
    /// Its rolling-update partition.
    pub partition: i32,
    pub jobs: Vec<JobAction>,
    /// The cursor to write (`None`: no gated upgrade has run).
    pub upgrade: Option<UpgradeStatus>,
    /// The target image's store format, when known.
    pub target_format: Option<u32>,
    /// Why pods are held, or what stopped the upgrade (for the conditions).
    pub hold: Option<Hold>,
    /// Backups of this decision all succeeded (set once, when they do).
    pub backups_succeeded_now: bool,
}

/// Why the rollout is not moving.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Hold {
    pub reason: &'static str,
    pub message: String,
    /// The hold is a fault (Degraded), not a wait.
    pub fault: bool,
}

fn hold(reason: &'static str, message: impl Into<String>, fault: bool) -> Option<Hold> {
    Some(Hold {
        reason,
        message: message.into(),
        fault,
    })
}

/// The lowest store format of the nodes: over those that answered now and the lowest the
/// last status recorded (a node down for a moment, such as the pod a rolling update is
/// replacing, keeps the format it had). Without a recorded format, every node must have
/// answered: the first decision about a format change is not taken on part of the fleet.
pub fn lowest_format(relay: &Relay, prev: &RelayStatus, o: &Observed) -> Option<u32> {
    let answered: Vec<u32> = o
        .nodes
        .values()
        .filter_map(|n| n.as_ref().ok().map(|r| r.status.store_format))
        .collect();
    if prev.store_format.is_none() && answered.len() < relay.spec.replicas.max(0) as usize {
        return None;
    }
    answered.into_iter().chain(prev.store_format).min()
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

/// Decide the StatefulSet's image and partition, the Jobs to run and the cursor.
pub fn rollout(relay: &Relay, prev: &RelayStatus, o: &Observed) -> Rollout {
    let spec = &relay.spec;
    let replicas = spec.replicas.max(0);
    let cursor = prev.upgrade.clone().unwrap_or_default();
    let steady = |image: &str, upgrade: Option<UpgradeStatus>, target_format| Rollout {
        image: image.to_owned(),
        partition: 0,
        jobs: Vec::new(),
        upgrade,
        target_format,
        hold: None,
        backups_succeeded_now: false,
    };
    let Some(sts) = &o.statefulset else {
        // Nothing runs yet: no store to protect.
        return steady(&spec.image, prev.upgrade.clone(), None);
    };
    let observed_partition = sts.partition.clamp(0, replicas);

    if in_progress(&cursor) {
        return continue_upgrade(relay, prev, cursor, observed_partition, o);
    }

    // No upgrade under way. Does any pod run something other than the spec's image?
    let behind = o.pods.iter().any(|p| p.image != spec.image) || sts.image != spec.image;
    let previous_format = prev.target_format;
    if !behind {
        return steady(&spec.image, prev.upgrade.clone(), previous_format);
    }
    let on_old = sts.image.clone();
    let hold_old = |h: Option<Hold>, jobs, target_format| Rollout {
        image: on_old.clone(),
        partition: observed_partition.max(if sts.image == spec.image { replicas } else { 0 }),
        jobs,
        upgrade: prev.upgrade.clone(),
        target_format,
        hold: h,
        backups_succeeded_now: false,
    };
    if spec.upgrade.paused {
        return hold_old(
            hold(
                "Paused",
                "spec.upgrade.paused holds every pod on its release",
                false,
            ),
            Vec::new(),
            None,
        );
    }
    let target = spec.image.clone();
    let format = match o.probes.get(&target) {
        probe @ (None | Some(ProbeObs::Running)) => {
            // Start the probe once; wait for it while it runs.
            let jobs = match probe {
                None => vec![JobAction::Probe {
                    image: target.clone(),
                }],
                _ => Vec::new(),
            };
            return hold_old(
                hold(
                    "ProbingImage",
                    format!("learning the store format of {target}"),
                    false,
                ),
                jobs,
                None,
            );
        }
        Some(ProbeObs::Failed(m)) => {
            return hold_old(
                hold(
                    "ProbeFailed",
                    format!("the image probe of {target} failed: {m}"),
                    true,
                ),
                Vec::new(),
                None,
            )
        }
        Some(ProbeObs::Format(f)) => *f,
    };
    let Some(store) = lowest_format(relay, prev, o) else {
        return hold_old(
            hold(
                "WaitingForNodes",
                "every node must report its store format before a release moves",
                false,
            ),
            Vec::new(),
            Some(format),
        );
    };
    if format < store {
        return hold_old(
            hold(
                "FormatTooOld",
                format!(
                    "{target} supports store format {format}, the stores are at {store}; a store is never moved back (restore from a backup instead)"
                ),
                true,
            ),
            Vec::new(),
            Some(format),
        );
    }
    let gated = match spec.backup.as_ref().map(|b| b.policy) {
        Some(BackupPolicy::Always) => true,
        Some(BackupPolicy::FormatChange) => format > store,
        Some(BackupPolicy::Never) => false,
        // No backup destination: a format change cannot be backed up, so it does not move.
        None => {
            if format > store {
                return hold_old(
                    hold(
                        "NoBackupDestination",
                        format!(
                            "{target} moves the stores from format {store} to {format}; set spec.backup.destination (or spec.backup.policy: Never) to let it roll"
                        ),
                        true,
                    ),
                    Vec::new(),
                    Some(format),
                );
            }
            false
        }
    };
    if !gated {
        return steady(&target, prev.upgrade.clone(), Some(format));
    }
    let cursor = UpgradeStatus {
        phase: UpgradePhase::BackingUp,
        target_image: Some(target),
        backup_jobs: Vec::new(),
        current_pod: None,
        pods_migrated: 0,
        last_error: None,
        retry_seen: spec.upgrade.retry.clone(),
    };
    let mut prev_with_format = prev.clone();
    prev_with_format.target_format = Some(format);
    continue_upgrade(relay, &prev_with_format, cursor, replicas, o)
}

/// A gated upgrade, from its cursor.
fn continue_upgrade(
    relay: &Relay,
    prev: &RelayStatus,
    mut cursor: UpgradeStatus,
    observed_partition: i32,
    o: &Observed,
) -> Rollout {
    let spec = &relay.spec;
    let replicas = spec.replicas.max(0);
    let names = crate::resources::Names::of(relay).ok();
    let target = cursor
        .target_image
        .clone()
        .unwrap_or_else(|| spec.image.clone());
    let target_format = prev.target_format;
    let mut out = Rollout {
        image: target.clone(),
        partition: observed_partition,
        jobs: Vec::new(),
        upgrade: None,
        target_format,
        hold: None,
        backups_succeeded_now: false,
    };
    if spec.image != target {
        // Cancelling is allowed while no pod has moved: back to the release every pod runs.
        let nobody_moved =
            o.pods.iter().all(|p| p.image == spec.image) && observed_partition >= replicas;
        if nobody_moved {
            out.image = spec.image.clone();
            out.partition = 0;
            cursor.phase = UpgradePhase::Idle;
            cursor.last_error = None;
            cursor.current_pod = None;
            out.upgrade = Some(cursor);
            return out;
        }
        out.hold = hold(
            "UpgradeInProgress",
            format!(
                "{} is waiting: the upgrade to {target} finishes first",
                spec.image
            ),
            false,
        );
    }

    // The backup Jobs observed belong to the attempt named in the previous status.
    let mut backups = &o.backups;
    let none = BTreeMap::new();
    // A changed retry token restarts a stopped upgrade where it stopped.
    if matches!(cursor.phase, UpgradePhase::Failed | UpgradePhase::Blocked) {
        if spec.upgrade.retry != cursor.retry_seen {
            // A new attempt: the last attempt's Jobs (one of them failed) do not count.
            backups = &none;
            cursor.retry_seen = spec.upgrade.retry.clone();
            cursor.last_error = None;
            cursor.phase = if cursor.pods_migrated > 0 || observed_partition < replicas {
                UpgradePhase::Rolling
            } else {
                UpgradePhase::BackingUp
            };
        } else {
            out.hold = hold(
                "UpgradeFailed",
                format!(
                    "{}; change spec.upgrade.retry to try again",
                    cursor.last_error.clone().unwrap_or_default()
                ),
                true,
            );
            out.upgrade = Some(cursor);
            return out;
        }
    }
    if spec.upgrade.paused {
        out.hold = hold("Paused", "spec.upgrade.paused holds the upgrade", false);
        out.upgrade = Some(cursor);
        return out;
    }

    if cursor.phase == UpgradePhase::BackingUp {
        out.partition = replicas;
        let names_of_jobs: Vec<String> = (0..replicas)
            .map(|i| backup_job_name(relay, i, &target, cursor.retry_seen.as_deref()))
            .collect();
        cursor.backup_jobs = names_of_jobs;
        let mut done = 0;
        for ordinal in 0..replicas {
            match backups.get(&ordinal) {
                None => out.jobs.push(JobAction::Backup {
                    ordinal,
                    target: target.clone(),
                    name: backup_job_name(relay, ordinal, &target, cursor.retry_seen.as_deref()),
                }),
                Some(JobObs::Running) => {}
                Some(JobObs::Succeeded) => done += 1,
                Some(JobObs::Failed(m)) => {
                    cursor.phase = UpgradePhase::Failed;
                    cursor.last_error = Some(format!("backup of node {ordinal} failed: {m}"));
                    out.jobs.clear();
                    out.hold = hold(
                        "BackupFailed",
                        format!(
                            "backup of node {ordinal} failed: {m}; change spec.upgrade.retry to try again"
                        ),
                        true,
                    );
                    out.upgrade = Some(cursor);
                    return out;
                }
            }
        }
        if done < replicas {
            out.hold = hold(
                "BackingUp",
                format!("{done}/{replicas} node backups done"),
                false,
            );
            out.upgrade = Some(cursor);
            return out;
        }
        out.backups_succeeded_now = true;
        cursor.phase = UpgradePhase::Rolling;
    }

    // Rolling: the pod at the partition is the one updating; it must be verified before
    // the partition drops past the next one.
    let p = observed_partition.min(replicas);
    if p >= replicas {
        out.partition = replicas - 1;
        cursor.current_pod = names.as_ref().map(|n| n.pod(replicas - 1));
        cursor.phase = UpgradePhase::Rolling;
        out.upgrade = Some(cursor);
        return out;
    }
    let pod_name = names.as_ref().map(|n| n.pod(p)).unwrap_or_default();
    cursor.current_pod = Some(pod_name.clone());
    let pod = o.pods.iter().find(|x| x.ordinal == p);
    if let Some(reason) = pod.and_then(|x| x.failing.clone()) {
        if pod.map(|x| x.image == target).unwrap_or(false) {
            cursor.phase = UpgradePhase::Failed;
            cursor.last_error = Some(format!("{pod_name} on {target}: {reason}"));
            out.hold = hold(
                "UpgradeFailed",
                format!("{pod_name} on {target}: {reason}; the other nodes stay on their release; change spec.upgrade.retry to try again"),
                true,
            );
            out.upgrade = Some(cursor);
            return out;
        }
    }
    let verified = pod.map(|x| x.image == target && x.ready).unwrap_or(false)
        && match o.nodes.get(&pod_name) {
            Some(Ok(r)) => {
                r.status.migrating_to.is_none()
                    && target_format
                        .map(|f| r.status.store_format == f)
                        .unwrap_or(true)
            }
            _ => false,
        };
    if !verified {
        cursor.phase = UpgradePhase::Verifying;
        out.partition = p;
        out.upgrade = Some(cursor);
        return out;
    }
    cursor.pods_migrated = replicas - p;
    if p == 0 {
        cursor.phase = UpgradePhase::Completed;
        cursor.current_pod = None;
        out.partition = 0;
        out.upgrade = Some(cursor);
        return out;
    }
    cursor.phase = UpgradePhase::Rolling;
    cursor.current_pod = names.as_ref().map(|n| n.pod(p - 1));
    out.partition = p - 1;
    out.upgrade = Some(cursor);
    out
}

/// The backup Job of node `ordinal` for `target`; a retry token gives a new name, so a
/// retried upgrade backs up again.
pub fn backup_job_name(relay: &Relay, ordinal: i32, target: &str, retry: Option<&str>) -> String {
    let name = relay.metadata.name.clone().unwrap_or_default();
    let key = format!("{target}\n{}", retry.unwrap_or(""));
    format!("{name}-backup-{ordinal}-{}", job_hash(&key))
}

/// The image probe Job of `image`.
pub fn probe_job_name(relay: &Relay, image: &str) -> String {
    let name = relay.metadata.name.clone().unwrap_or_default();
    format!("{name}-probe-{}", job_hash(image))
}

/// 8 hex digits of `key`'s hash: a Job name must stay a 63-character label (the CRD holds
/// Relay names to 40 characters for it).
fn job_hash(key: &str) -> String {
    let mut h = crate::resources::config_hash(key);
    h.truncate(8);
    h
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
}

impl Owned {
    /// Every kind, in apply order.
    pub const ALL: [Owned; 6] = [
        Owned::ConfigMap,
        Owned::HeadlessService,
        Owned::ClientService,
        Owned::StatefulSet,
        Owned::PodDisruptionBudget,
        Owned::ServiceMonitor,
    ];

    pub fn kind(self) -> &'static str {
        match self {
            Owned::ConfigMap => "ConfigMap",
            Owned::HeadlessService | Owned::ClientService => "Service",
            Owned::StatefulSet => "StatefulSet",
            Owned::PodDisruptionBudget => "PodDisruptionBudget",
            Owned::ServiceMonitor => "ServiceMonitor",
        }
    }
}

/// Create a missing object, update a drifted one, or delete one no longer wanted (only a
/// ServiceMonitor: the operator deletes no store, Service or StatefulSet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Change {
    Create,
    Update,
    Delete,
}

/// Which owned objects to apply: those missing and those that differ from what the
/// operator's apply would make of them (fields the cluster or others added are not drift);
/// and an owned ServiceMonitor that is no longer wanted, to delete.
pub fn changes(desired: &DesiredSet, observed: &ObservedObjects) -> Vec<(Owned, Change)> {
    let mut out = Vec::new();
    for kind in Owned::ALL {
        let have = observed.get(kind);
        let Some(want) = desired.value(kind) else {
            // Not wanted (a ServiceMonitor with monitoring turned off): an existing one,
            // which the controller reports only when this Relay owns it, goes.
            if have.is_some() {
                out.push((kind, Change::Delete));
            }
            continue;
        };
        let Some(have) = have else {
            out.push((kind, Change::Create));
            continue;
        };
        let drift = match observed.applied.get(&kind) {
            Some(after) => comparable(after) != comparable(have),
            None => !contains(have, &want),
        };
        if drift {
            out.push((kind, Change::Update));
        }
    }
    out
}

/// An object without what changes under it on every write or is not the operator's to
/// set: its resourceVersion, generation, managed fields and status.
fn comparable(v: &Value) -> Value {
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

/// What the ServiceMonitor decision was.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MonitorDecision {
    Disabled,
    Applied,
    /// Asked for, but `monitoring.coreos.com/v1` is not served.
    ApiMissing,
}

pub fn monitor_decision(relay: &Relay, o: &Observed) -> MonitorDecision {
    if !relay.spec.monitoring.service_monitor.enabled {
        MonitorDecision::Disabled
    } else if o.service_monitor_api {
        MonitorDecision::Applied
    } else {
        MonitorDecision::ApiMissing
    }
}
