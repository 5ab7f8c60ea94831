//! The operator's Jobs and claims: the image probe, the backup and restore Jobs, their
//! pods' security contexts, and the data and backup volume claims.

use std::collections::BTreeMap;

use ankusa_crds::relay::Relay;
use serde_json::{json, Value};

use super::pod::{pod_annotations, pod_labels, scheduling};
use super::{labels, metadata, selector_labels, typed, BACKUP_TOKEN_KEY, DATA_MOUNT};
use crate::names::{Names, ResourceError};

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
pub(super) fn job_labels(relay_name: &str, job: &str) -> BTreeMap<String, String> {
    let mut l = labels(relay_name);
    l.insert("app.kubernetes.io/name".into(), JOB_APP_NAME.into());
    l.insert("app.kubernetes.io/component".into(), format!("{job}-job"));
    l.insert(JOB_LABEL.into(), job.into());
    l
}

/// The pod security context of every pod the operator runs: admitted where the namespace
/// enforces the `restricted` Pod Security Standard.
pub(super) fn pod_security() -> Value {
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
pub(super) fn container_security() -> Value {
    json!({
        "allowPrivilegeEscalation": false,
        "readOnlyRootFilesystem": true,
        "capabilities": { "drop": ["ALL"] },
    })
}

/// A run-once Job of the `Relay` (`job` is `probe` or `backup`) around `pod_spec`.
pub(super) fn job(
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
pub(super) fn claim_spec(relay: &Relay) -> Value {
    let storage = &relay.spec.storage;
    claim_spec_of(&storage.size, storage.storage_class_name.as_deref())
}

/// A ReadWriteOnce claim spec of `size` in `class` (the cluster's default when `None`).
pub(super) fn claim_spec_of(size: &str, class: Option<&str>) -> Value {
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
pub(super) fn claim_object(
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
