//! Restores of the nodes from backups — pure, like the planner, whose [`rollout`] asks
//! this module first. Two ways in, one cursor (`status.restore`):
//!
//! - **Bootstrap** (`spec.bootstrap.fromBackup`): a Relay whose nodes have no volume yet
//!   (no StatefulSet, no data claim, no store ever seen) starts from a backup set. The
//!   operator makes each node's data claim itself (`data-<name>-<i>`, the claim template's
//!   spec: the StatefulSet takes them as its own), restores node `i` from the newest
//!   archive in `<relay>/<relay>-<i>/` of the backup claim, one Job at a time, and creates
//!   the StatefulSet only once every node is restored.
//! - **Rollback** (`spec.upgrade.rollbackTo`, with `spec.image` naming the same release,
//!   and `acknowledgeDataLoss`): the release's store format (its probe) is below the
//!   stores'. The StatefulSet goes to 0 replicas (`Stopping`); once no relay pod is left,
//!   each node's store is replaced by its newest backup at that format or lower — the
//!   store it had is moved aside on its volume, never deleted — and the nodes start on
//!   the older release (pinned to its probed digest). Nothing else rolls a store back: a
//!   lower release without `rollbackTo` stays `FormatTooOld`.
//!
//! A restore Job that fails stops the restore (`Failed`, `Degraded` `RestoreFailed`, the
//! Job named); a new `spec.upgrade.retry` resumes it at the node that failed. Taking
//! `rollbackTo` (or `bootstrap`) out of the spec cancels it: the nodes start again on
//! what they have (`Cancelled`). The restore
//! command is idempotent (a retried Job finds its own work done), so a node is never
//! restored twice from two archives.
//!
//! [`rollout`]: crate::planner::rollout

use ankusa_crds::relay::{ObjectStoreSpec, Relay};
use ankusa_crds::status::{RelayStatus, RestoreStatus, UpgradePhase, UpgradeStatus};

use crate::observed::{hold, JobObs, Observed};
use crate::plan::{pinned, JobAction, Rollout};

pub const BOOTSTRAP: &str = "Bootstrap";
pub const NODE: &str = "Node";
pub const ROLLBACK: &str = "Rollback";
pub const STOPPING: &str = "Stopping";
pub const RESTORING: &str = "Restoring";
pub const COMPLETED: &str = "Completed";
pub const FAILED: &str = "Failed";
pub const CANCELLED: &str = "Cancelled";

/// A restore under way (or failed, waiting for a retry).
pub fn in_progress(r: &RestoreStatus) -> bool {
    matches!(r.phase.as_str(), STOPPING | RESTORING | FAILED)
}

/// Node `ordinal`'s restore Job of the restore that began at `started`.
pub fn job_name(relay: &Relay, ordinal: i32, r: &RestoreStatus) -> String {
    let name = relay.metadata.name.clone().unwrap_or_default();
    let mut h = crate::names::config_hash(&format!(
        "restore\n{}\n{}\n{}",
        r.started,
        r.retry_seen.as_deref().unwrap_or(""),
        r.reason
    ));
    h.truncate(8);
    format!("{name}-restore-{ordinal}-{h}")
}

/// Where a restore reads: the claim of each node and the Relay directory on it, or the
/// bucket the nodes pushed to.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// One claim for every node, or `None`: each node's own `<relay>-backups-<ordinal>`.
    pub shared: Option<String>,
    /// The Relay the backups were taken of: node `i` reads `<relay>/<relay>-<i>/` (in a
    /// bucket, `<prefix>/<relay>-<i>/`).
    pub relay: String,
    /// The bucket the nodes pushed to: no claim is read.
    pub bucket: Option<ObjectStoreSpec>,
}

impl Source {
    /// Node `ordinal`'s claim (`None` from a bucket).
    pub fn claim(&self, ordinal: i32) -> Option<String> {
        if self.bucket.is_some() {
            return None;
        }
        Some(match &self.shared {
            Some(c) => c.clone(),
            None => format!("{}-backups-{ordinal}", self.relay),
        })
    }

    /// `<claim>/<relay>` for the status (`<relay>-backups-*` for claims per node), or the
    /// bucket's `s3://bucket/prefix/<relay>-*`.
    pub fn describe(&self) -> String {
        if let Some(b) = &self.bucket {
            return format!("{}/{}-*", b.url.trim_end_matches('/'), self.relay);
        }
        match &self.shared {
            Some(c) => format!("{c}/{}", self.relay),
            None => format!("{}-backups-*/{}", self.relay, self.relay),
        }
    }
}

/// Where a restore of `relay` reads: `spec.bootstrap.fromBackup`'s bucket or claim and
/// Relay; else the backup destination's claims; else the Relay's own bucket
/// (`spec.backup.objectStore`).
pub fn source(relay: &Relay) -> Option<Source> {
    let from = relay.spec.bootstrap.as_ref().map(|b| &b.from_backup);
    let name = from
        .and_then(|f| f.relay.clone())
        .unwrap_or_else(|| relay.metadata.name.clone().unwrap_or_default());
    let (shared, bucket) = match (
        from.and_then(|f| f.object_store.clone()),
        from.and_then(|f| f.claim_name.clone()),
        relay.spec.claim_backup(),
    ) {
        (Some(b), _, _) => (None, Some(b)),
        (None, Some(claim), _) => (Some(claim), None),
        (None, None, Some((_, d))) => (d.shared().map(str::to_owned), None),
        (None, None, None) => (None, Some(relay.spec.object_store()?.clone())),
    };
    Some(Source {
        shared,
        relay: name,
        bucket,
    })
}

/// A new bootstrap cursor, when `spec.bootstrap` asks for one and nothing of the nodes
/// exists yet.
pub fn begin_bootstrap(relay: &Relay, prev: &RelayStatus, o: &Observed) -> Option<RestoreStatus> {
    relay.spec.bootstrap.as_ref()?;
    let untouched = prev.restore.is_none()
        && prev.store_format.is_none()
        && o.statefulset.is_none()
        && o.claims.is_empty()
        && o.nodes.values().all(Result::is_err);
    if !untouched {
        return None;
    }
    let source = source(relay)?;
    Some(RestoreStatus {
        reason: BOOTSTRAP.into(),
        phase: RESTORING.into(),
        source: source.describe(),
        image: Some(relay.spec.image.clone()),
        format: None,
        replicas: relay.spec.replicas.max(0),
        restored: 0,
        started: o.now.clone(),
        retry_seen: relay.spec.upgrade.retry.clone(),
        message: None,
        ..RestoreStatus::default()
    })
}

/// A new rollback cursor: `spec.upgrade.rollbackTo` names `spec.image`, whose store
/// `format` is below the stores' `store`.
pub fn begin_rollback(
    relay: &Relay,
    o: &Observed,
    format: u32,
    store: u32,
) -> Result<RestoreStatus, String> {
    let r = relay
        .spec
        .upgrade
        .rollback_to
        .as_ref()
        .ok_or("no rollbackTo")?;
    if !crate::observed::names_image(&r.image, &relay.spec.image) || !r.acknowledge_data_loss {
        return Err(format!(
            "spec.upgrade.rollbackTo must name spec.image ({}) with acknowledgeDataLoss: true",
            relay.spec.image
        ));
    }
    let source = source(relay).ok_or_else(|| {
        format!(
            "a rollback from store format {store} to {format} restores backups: set spec.backup.destination or spec.backup.objectStore"
        )
    })?;
    // Before any node stops: each has a backup at the format or below, and room on its
    // volume for it.
    let lacking = if source.bucket.is_some() {
        crate::objstore::rollback_problems(relay, o, format)
    } else {
        claim_rollback_problems(relay, o, format, &source)
    };
    if !lacking.is_empty() {
        return Err(format!(
            "a rollback to store format {format} restores each node's newest backup at that format or below, and {} (nothing was stopped)",
            lacking.join("; ")
        ));
    }
    Ok(RestoreStatus {
        reason: ROLLBACK.into(),
        phase: STOPPING.into(),
        source: source.describe(),
        image: Some(pinned(&relay.spec.image, o)),
        format: Some(format),
        replicas: relay.spec.replicas.max(0),
        restored: 0,
        started: o.now.clone(),
        retry_seen: relay.spec.upgrade.retry.clone(),
        message: None,
        ..RestoreStatus::default()
    })
}

/// What stops a rollback from backup claims to store format `format`, node by node, as the
/// nodes' last backup Jobs reported their archives (`status.claimArchives`): a node of
/// `spec.replicas` with no archive at that format or below, or less free space on its data
/// volume than the store that archive unpacks to (the restore unpacks it beside the store
/// it replaces). A node whose archives no backup Job reported since the Relay was made,
/// and archives of another Relay's backups (a bootstrap's source), are not checked here:
/// the restore Job finds what is there.
fn claim_rollback_problems(
    relay: &Relay,
    o: &Observed,
    format: u32,
    source: &Source,
) -> Vec<String> {
    let Ok(names) = crate::names::Names::of(relay) else {
        return vec!["the Relay has no valid name".into()];
    };
    if source.relay != names.relay {
        return Vec::new();
    }
    (0..relay.spec.replicas.max(0))
        .filter_map(|i| {
            let pod = names.pod(i);
            // None reported since the Relay was made (a bootstrap, a release whose Jobs
            // report nothing): its restore Job is the check.
            let reported = o.claim_archives.get(&pod)?;
            // The restore takes the newest archive at the format or below.
            let pick = reported
                .formats
                .iter()
                .filter(|a| a.store_format <= format)
                .max_by_key(|a| archive_number(&a.archive));
            let Some(a) = pick else {
                return Some(format!(
                    "{pod} has no archive at store format {format} or below on {} (its archives are at store format {})",
                    source.claim(i).unwrap_or_default(),
                    reported
                        .formats
                        .iter()
                        .map(|f| f.store_format.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            };
            let free = o
                .nodes
                .get(&pod)
                .and_then(|n| n.as_ref().ok()?.status.volume_free_bytes)?;
            // A restore writes at most the free space less its margin.
            let needed = a
                .store_bytes
                .unwrap_or(a.bytes)
                .saturating_add(ankusa_api::node::UNPACK_MARGIN_BYTES);
            (free < needed).then(|| {
                format!(
                    "{pod}'s volume has {free} bytes free, less than the {needed} bytes archive {} unpacks to with the restore's margin of {} MiB",
                    a.archive,
                    ankusa_api::node::UNPACK_MARGIN_BYTES >> 20
                )
            })
        })
        .collect()
}

/// The number of archive `b<ms>.tar.zst` (0 for another name).
fn archive_number(archive: &str) -> u64 {
    archive
        .strip_prefix('b')
        .and_then(|a| a.strip_suffix(".tar.zst"))
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A node restore to begin: `spec.restoreNode` with a request no restore has taken up yet.
/// `Err`: it cannot begin now, and why (the hold to show); `Ok(None)`: none is asked for,
/// or this request's restore has run (or runs).
pub fn begin_node(
    relay: &Relay,
    prev: &RelayStatus,
    o: &Observed,
) -> Result<Option<RestoreStatus>, crate::observed::Hold> {
    let Some(rn) = relay.spec.restore_node.as_ref() else {
        return Ok(None);
    };
    if let Some(r) = &prev.restore {
        if r.reason == NODE && r.request.as_deref() == Some(rn.request.as_str()) {
            return Ok(None);
        }
        if in_progress(r) {
            return Err(wait_hold(format!(
                "restoreNode (request {}) waits for the {} restore under way",
                rn.request,
                r.reason.to_lowercase()
            )));
        }
    }
    let refuse = |m: String| crate::observed::Hold {
        reason: "RestoreRefused",
        message: m,
        fault: true,
    };
    if rn.ordinal >= relay.spec.replicas {
        return Err(refuse(format!(
            "restoreNode.ordinal {} names no node: the Relay has {} (ordinals 0 to {})",
            rn.ordinal,
            relay.spec.replicas,
            relay.spec.replicas - 1
        )));
    }
    if prev
        .upgrade
        .as_ref()
        .is_some_and(crate::observed::in_progress)
    {
        return Err(wait_hold(format!(
            "restoreNode (request {}) waits for the upgrade under way",
            rn.request
        )));
    }
    let Some(source) = source(relay) else {
        return Err(refuse(
            "restoreNode restores from spec.backup.destination or spec.backup.objectStore: set one"
                .to_owned(),
        ));
    };
    let image = o
        .statefulset
        .as_ref()
        .map(|s| s.image.clone())
        .or_else(|| prev.current_image.clone())
        .unwrap_or_else(|| relay.spec.image.clone());
    Ok(Some(RestoreStatus {
        reason: NODE.into(),
        phase: STOPPING.into(),
        source: source.describe(),
        image: Some(image),
        format: None,
        replicas: relay.spec.replicas,
        restored: 0,
        started: o.now.clone(),
        retry_seen: relay.spec.upgrade.retry.clone(),
        message: None,
        node: Some(rn.ordinal),
        request: Some(rn.request.clone()),
        report: None,
    }))
}

fn wait_hold(message: String) -> crate::observed::Hold {
    crate::observed::Hold {
        reason: "RestoreWaiting",
        message,
        fault: false,
    }
}

/// The rollout while node restore `r` runs: the StatefulSet goes with its pods orphaned
/// (the other nodes keep serving), then the node's pod; once it is gone its store is
/// restored by one Job, and the StatefulSet is made again (it adopts the running pods
/// and starts the restored node).
fn step_node(relay: &Relay, mut r: RestoreStatus, o: &Observed, mut out: Rollout) -> Rollout {
    let i = r.node.unwrap_or_default();
    let names = crate::names::Names::of(relay).ok();
    let pod = names.as_ref().map(|n| n.pod(i)).unwrap_or_default();
    let asked = relay
        .spec
        .restore_node
        .as_ref()
        .is_some_and(|rn| Some(rn.request.as_str()) == r.request.as_deref());
    if !asked {
        r.phase = CANCELLED.into();
        r.message = Some(format!(
            "cancelled: spec.restoreNode (request {}) was removed or changed before {pod} was restored",
            r.request.clone().unwrap_or_default()
        ));
        out.hold_statefulset = false;
        out.restore = Some(r);
        return out;
    }
    out.hold_statefulset = true;
    if r.phase == STOPPING {
        if o.statefulset.is_some() || o.pods.iter().any(|p| p.name == pod) {
            out.stop_pod = Some(pod.clone());
            out.hold = hold(
                "RestoringNode",
                format!("stopping {pod} alone (the StatefulSet deleted with its pods orphaned: the other nodes serve on)"),
                false,
            );
            out.restore = Some(r);
            return out;
        }
        r.phase = RESTORING.into();
    }
    // A volume lost with its claim: the claim is made again for the restore (the
    // StatefulSet takes it by name).
    if !o.claims.contains(&i) {
        out.claims = vec![i];
    }
    let name = job_name(relay, i, &r);
    let restoring = hold(
        "RestoringNode",
        format!("restoring {pod} from {} (Job {name})", r.source),
        false,
    );
    match o.restores.get(&i) {
        Some(JobObs::Succeeded) => {
            r.phase = COMPLETED.into();
            r.restored = 1;
            r.report = o.restore_report.clone();
            r.message = Some(node_restored_message(&pod, r.report.as_ref()));
            out.hold_statefulset = false;
        }
        Some(JobObs::Running) => out.hold = restoring,
        Some(JobObs::Failed(m)) => out.hold = job_failed(&mut r, &name, &pod, m),
        None => {
            if let Some(problem) = restore_claim_problem(&r, o) {
                out.hold = hold("BackupClaimNotReady", problem, true);
            } else {
                out.jobs.push(JobAction::Restore {
                    ordinal: i,
                    name: name.clone(),
                    image: out.image.clone(),
                    format: None,
                    archive: relay
                        .spec
                        .restore_node
                        .as_ref()
                        .and_then(|rn| rn.backup.clone()),
                    report: true,
                });
                out.hold = restoring;
            }
        }
    }
    out.restore = Some(r);
    out
}

/// What a completed node restore says: the archive, and the hooks lost with the replaced
/// store (or why they cannot be counted).
fn node_restored_message(
    pod: &str,
    report: Option<&ankusa_api::node::NodeRestoreReport>,
) -> String {
    match report {
        Some(rep) => match (rep.lost_hooks, &rep.replaced_unreadable) {
            (Some(n), _) => format!(
                "{pod} restored from {}; the store it replaced held {n} hooks acked after that backup, which the restored store lacks",
                rep.archive
            ),
            (None, why) => format!(
                "{pod} restored from {}; the hooks acked after that backup cannot be counted: {}",
                rep.archive,
                why.clone().unwrap_or_default()
            ),
        },
        None => format!("{pod} restored; its Job left no report"),
    }
}

/// The rollout while restore `r` runs.
pub fn step(relay: &Relay, prev: &RelayStatus, mut r: RestoreStatus, o: &Observed) -> Rollout {
    let spec = &relay.spec;
    let running_image = o
        .statefulset
        .as_ref()
        .map(|s| s.image.clone())
        .or_else(|| prev.current_image.clone())
        .unwrap_or_else(|| spec.image.clone());
    let rollback = r.reason == ROLLBACK;
    let mut out = Rollout {
        image: if rollback {
            running_image
        } else {
            r.image.clone().unwrap_or_else(|| spec.image.clone())
        },
        partition: 0,
        // A rollback stops every node before any store is touched.
        replicas: if rollback { 0 } else { r.replicas },
        jobs: Vec::new(),
        upgrade: prev.upgrade.clone(),
        target_format: prev.target_format,
        hold: None,
        backups_succeeded_now: false,
        current_image: prev.current_image.clone(),
        restore: None,
        claims: Vec::new(),
        hold_statefulset: !rollback,
        stop_pod: None,
    };
    if r.reason == NODE {
        out.image = r.image.clone().unwrap_or(out.image);
        out.replicas = r.replicas;
        if r.phase == FAILED {
            if !retried(spec, &mut r, STOPPING) {
                out.hold_statefulset = true;
                out.hold = failed_hold(&r);
                out.restore = Some(r);
                return out;
            }
            return step_node(relay, r, &without_restore_jobs(o), out);
        }
        return step_node(relay, r, o, out);
    }
    // Taken out of the spec (a restore that cannot finish: no archive at the format, a
    // claim that never comes): the nodes start again on what they have. Stores restored so
    // far stay restored; a rollback's replaced stores are beside them on their volumes.
    let asked = if rollback {
        spec.upgrade.rollback_to.is_some()
    } else {
        spec.bootstrap.is_some()
    };
    if !asked {
        r.phase = CANCELLED.into();
        r.message = Some(format!(
            "cancelled after {} of {} nodes: spec.{} was removed",
            r.restored,
            r.replicas,
            if rollback {
                "upgrade.rollbackTo"
            } else {
                "bootstrap"
            }
        ));
        out.replicas = r.replicas;
        out.hold_statefulset = false;
        out.restore = Some(r);
        return out;
    }
    if r.phase == FAILED {
        if !retried(spec, &mut r, RESTORING) {
            out.hold = failed_hold(&r);
            out.restore = Some(r);
            return out;
        }
        return step(relay, prev, r, &without_restore_jobs(o));
    }
    if r.phase == STOPPING {
        let left: Vec<&str> = o.pods.iter().map(|p| p.name.as_str()).collect();
        if !left.is_empty() {
            out.hold = hold(
                "RollingBack",
                format!(
                    "stopping every node before its store is restored (left: {})",
                    left.join(", ")
                ),
                false,
            );
            out.restore = Some(r);
            return out;
        }
        r.phase = RESTORING.into();
    }
    // Restoring: the data claims first (a bootstrap makes them), then node by node.
    if !rollback {
        out.claims = (0..r.replicas).filter(|i| !o.claims.contains(i)).collect();
    }
    if !restore_next(relay, o, &mut r, &mut out, rollback) {
        out.restore = Some(r);
        return out;
    }
    // Every node restored: they start on the release the restore was for.
    r.phase = COMPLETED.into();
    r.message = None;
    let image = r.image.clone().unwrap_or_else(|| spec.image.clone());
    out.image = image.clone();
    out.replicas = r.replicas;
    out.hold_statefulset = false;
    if rollback {
        out.current_image = Some(image.clone());
        out.target_format = r.format;
        // The upgrade the rollback undid is over.
        out.upgrade = Some(UpgradeStatus {
            phase: UpgradePhase::Idle,
            ..UpgradeStatus::default()
        });
    }
    out.restore = Some(r);
    out
}

/// Node by node, each node's restore Job: waited for, or started (unless its claim is
/// not ready). `false` while one is under way or stopped (`out.hold` says which); `true`
/// once every node is restored.
fn restore_next(
    relay: &Relay,
    o: &Observed,
    r: &mut RestoreStatus,
    out: &mut Rollout,
    rollback: bool,
) -> bool {
    let spec = &relay.spec;
    let names = crate::names::Names::of(relay).ok();
    while r.restored < r.replicas {
        let i = r.restored;
        let name = job_name(relay, i, r);
        match o.restores.get(&i) {
            Some(JobObs::Succeeded) => r.restored += 1,
            Some(JobObs::Running) => {
                out.hold = hold("Restoring", restoring_message(r, names.as_ref()), false);
                return false;
            }
            Some(JobObs::Failed(m)) => {
                let pod = names.as_ref().map(|n| n.pod(i)).unwrap_or_default();
                out.hold = job_failed(r, &name, &pod, m);
                return false;
            }
            None => {
                if let Some(problem) = restore_claim_problem(r, o) {
                    out.hold = hold("BackupClaimNotReady", problem, true);
                } else {
                    out.jobs.push(JobAction::Restore {
                        ordinal: i,
                        name,
                        // A rollback restores with the release the nodes ran (it knows
                        // every older format; the older release may lack the command).
                        image: if rollback {
                            out.image.clone()
                        } else {
                            r.image.clone().unwrap_or_else(|| spec.image.clone())
                        },
                        format: r.format,
                        archive: None,
                        report: false,
                    });
                    out.hold = hold("Restoring", restoring_message(r, names.as_ref()), false);
                }
                return false;
            }
        }
    }
    true
}

/// A failed restore whose `spec.upgrade.retry` changed: the cursor goes back to `phase` as
/// a new attempt (new Job names). False while the retry token is the one it failed with.
fn retried(spec: &ankusa_crds::relay::RelaySpec, r: &mut RestoreStatus, phase: &str) -> bool {
    if spec.upgrade.retry == r.retry_seen {
        return false;
    }
    r.retry_seen = spec.upgrade.retry.clone();
    r.phase = phase.into();
    r.message = None;
    true
}

/// What was observed, without the restore Jobs: after a retry they are the failed
/// attempt's, not this one's.
fn without_restore_jobs(o: &Observed) -> Observed {
    let mut fresh = o.clone();
    fresh.restores.clear();
    fresh
}

/// Restore Job `name` of `pod` failed: the restore stops there, and says so.
fn job_failed(
    r: &mut RestoreStatus,
    name: &str,
    pod: &str,
    why: &str,
) -> Option<crate::observed::Hold> {
    r.phase = FAILED.into();
    r.message = Some(format!("restore Job {name} of {pod} failed: {why}"));
    failed_hold(r)
}

/// The hold of a failed restore: what failed, and how to go on.
fn failed_hold(r: &RestoreStatus) -> Option<crate::observed::Hold> {
    hold(
        "RestoreFailed",
        format!(
            "{}; change spec.upgrade.retry to try again",
            r.message.clone().unwrap_or_default()
        ),
        true,
    )
}

fn restoring_message(r: &RestoreStatus, names: Option<&crate::names::Names>) -> String {
    let pod = names.map(|n| n.pod(r.restored)).unwrap_or_default();
    format!(
        "{} restoring {pod} from {} ({} of {} nodes restored){}",
        r.reason.to_lowercase(),
        r.source,
        r.restored,
        r.replicas,
        r.format
            .map(|f| format!(", from its newest backup at store format {f} or lower"))
            .unwrap_or_default()
    )
}

/// The restore's claim for its next node is missing: it waits (the claim of every node,
/// or that node's own).
fn restore_claim_problem(r: &RestoreStatus, o: &Observed) -> Option<String> {
    match &o.restore_claim {
        Some((claim, false)) => Some(format!(
            "the backup claim {claim} holding the backups of node {} does not exist: create it (or bind the volume with the backups to it); the restore waits",
            r.node.unwrap_or(r.restored)
        )),
        _ => None,
    }
}
