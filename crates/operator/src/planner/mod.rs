//! Observed state → next action. Pure: no clock, no client, no randomness; the controller
//! gathers an [`Observed`], calls these functions and carries out what they return.
//!
//! Three decisions, each a function:
//! - [`rollout`]: which image the StatefulSet carries, its replicas, where its
//!   rolling-update partition stands, which Jobs must run, and the upgrade cursor
//!   (`status.upgrade`).
//! - [`changes`]: which owned objects are missing or drifted from what the spec asks for
//!   (create / update; the type has no delete, and no claim is ever among the objects).
//! - [`crate::status::status`] (its own module): the `Relay`'s status from the same
//!   [`Observed`].
//!
//! # The upgrade gate
//! A release whose store format is higher than the nodes' (learned by an image probe Job)
//! moves only behind backups, one node at a time, highest ordinal first. The cursor
//! (`status.upgrade`) holds the partition the gate set; with `n` nodes it starts at `n`:
//! 1. `BackingUp` at partition `p`: node `p-1` (still on the old release) is backed up
//!    now, by a Job that streams its checkpoint to the backup claim; at `p = n` the claims
//!    that outlived earlier scale-downs are backed up too (offline), since a later
//!    scale-up starts the target on them;
//! 2. every backup of the step succeeded → the partition drops to `p-1` (`Verifying`):
//!    the StatefulSet controller replaces that pod with the target release;
//! 3. the pod is Ready on the target and reports the target's format with no migration
//!    running → back to 1 for the next node, or `Completed` at ordinal 0;
//! 4. a failed backup, a pod that fails on the target (any waiting reason that is not a
//!    start, or not Ready within `spec.upgrade.timeouts.verifySeconds`), or a Job past
//!    its deadline stops the roll where it is (`Failed`, `Degraded`, the pod or Job
//!    named). A new `spec.upgrade.retry` resumes the same step; a new image of the same
//!    store format rolls forward from it (fix forward); nothing goes below the format the
//!    migrated stores are at;
//! 5. a new image requested while the upgrade runs waits for it to finish; an image whose
//!    format is *lower* than the stores' is refused: format 3 is a one-way door.
//!
//! What no move of the cluster can break (property-tested in `tests/it/gate.rs`): no pod
//! starts the target release on a volume that was not backed up in this upgrade. The gate
//! keeps it by taking its positions from the cursor, not from what it observes: a
//! StatefulSet that went missing is recreated at the release the nodes ran (`from`) with
//! the cursor's partition; the replicas stay at the count the upgrade began with until it
//! ends; the partition is never raised above a pod that runs the newer release.
//!
//! A release with the same store format rolls the ordinary way: partition 0, and the
//! StatefulSet controller replaces pods one at a time, waiting for readiness.

pub mod adopt;
mod events;
mod objects;

pub use events::{fault_events, upgrade_events, StepEvent};
pub use objects::{changes, monitor_decision, Change, MonitorDecision};

use ankusa_crds::relay::{BackupPolicy, Relay};
use ankusa_crds::status::{RelayStatus, RestoreStatus, UpgradePhase, UpgradeStatus};

use crate::observed::{
    elapsed_s, hold, in_progress, names_image, BackupClaimObs, Hold, JobObs, Observed, PodObs,
    ProbeObs,
};
use crate::plan::{backup_job_name, pinned, JobAction, Rollout};

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

/// The partition that holds every pod on the release it runs: just above the highest
/// ordinal that does not run the template's image. Never above a pod that already runs
/// it (such a pod, recreated below the partition, would come back on the older release).
fn holding_partition(template: &str, pods: &[PodObs], replicas: i32) -> i32 {
    pods.iter()
        .filter(|p| p.image != template)
        .map(|p| p.ordinal + 1)
        .max()
        .unwrap_or(0)
        .clamp(0, replicas)
}

/// Decide the StatefulSet's image, replicas and partition, the Jobs to run and the cursor;
/// a scale-down keeps the nodes it takes out until they are drained ([`drain`](crate::drain)).
pub fn rollout(relay: &Relay, prev: &RelayStatus, o: &Observed) -> Rollout {
    let node_restore = crate::restore::begin_node(relay, prev, o);
    let mut r = rollout_steps(relay, prev, o, node_restore.clone().ok().flatten());
    if r.restore.is_some() {
        return r;
    }
    // A node restore that cannot begin says why, unless something else holds the nodes.
    if let Err(h) = node_restore {
        r.hold = r.hold.or(Some(h));
    }
    crate::drain::drain(relay, o, r)
}

/// [`rollout`] before the drain; `node_restore`: a node restore to begin now.
fn rollout_steps(
    relay: &Relay,
    prev: &RelayStatus,
    o: &Observed,
    node_restore: Option<RestoreStatus>,
) -> Rollout {
    let spec = &relay.spec;
    let replicas = spec.replicas.max(0);
    // A restore under way, or one to begin, decides everything.
    if let Some(r) = prev.restore.clone().filter(crate::restore::in_progress) {
        return crate::restore::step(relay, prev, r, o);
    }
    if let Some(r) = crate::restore::begin_bootstrap(relay, prev, o) {
        return crate::restore::step(relay, prev, r, o);
    }
    if let Some(r) = node_restore {
        return crate::restore::step(relay, prev, r, o);
    }
    if let Some(r) = rollback_to_begin(relay, prev, o) {
        return crate::restore::step(relay, prev, r, o);
    }
    let cursor = prev.upgrade.clone().unwrap_or_default();
    if in_progress(&cursor) {
        return continue_upgrade(relay, prev, cursor, o);
    }
    let steady = |image: &str, target_format| Rollout {
        image: image.to_owned(),
        partition: 0,
        replicas,
        jobs: Vec::new(),
        upgrade: prev.upgrade.clone(),
        target_format,
        hold: None,
        backups_succeeded_now: false,
        current_image: prev.current_image.clone(),
        restore: None,
        claims: Vec::new(),
        hold_statefulset: false,
        stop_pod: None,
    };
    // A store exists once a node has answered; before that there is nothing to protect,
    // and a first install that never came up follows the spec's image (a corrected
    // image replaces one that never started).
    let store_known = prev.store_format.is_some() || o.nodes.values().any(Result::is_ok);
    let Some(sts) = &o.statefulset else {
        if let Some(adoption) = adopt::adopt(relay, prev, o, store_known) {
            return adoption;
        }
        // A missing StatefulSet over existing stores comes back on the release they ran;
        // a new release then goes through the gate like any other.
        let image = match &prev.current_image {
            Some(running) if store_known => running.clone(),
            _ => spec.image.clone(),
        };
        return steady(&image, prev.target_format);
    };
    let everyone_on_template =
        o.pods.iter().all(|p| p.image == sts.image) && o.pods.len() as i32 >= replicas;
    let steady_out = |image: &str, target_format| {
        let mut r = steady(image, target_format);
        if everyone_on_template && sts.image == image {
            r.current_image = Some(sts.image.clone());
        }
        r
    };
    // Pods on the spec's image, by tag or by the digest it resolved to, are where they
    // should be: a pinned fleet is not moved to re-resolve its tag.
    let behind = o.pods.iter().any(|p| !names_image(&spec.image, &p.image))
        || !names_image(&spec.image, &sts.image);
    if !behind {
        return steady_out(&sts.image, prev.target_format);
    }
    if !store_known {
        return steady_out(&pinned(&spec.image, o), prev.target_format);
    }
    let hold_old = |h: Option<Hold>, jobs, target_format| Rollout {
        image: sts.image.clone(),
        partition: holding_partition(&sts.image, &o.pods, replicas),
        replicas,
        jobs,
        upgrade: prev.upgrade.clone(),
        target_format,
        hold: h,
        backups_succeeded_now: false,
        current_image: prev.current_image.clone(),
        restore: None,
        claims: Vec::new(),
        hold_statefulset: false,
        stop_pod: None,
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
    let format = match probe_of(&spec.image, o) {
        Ok(f) => f,
        Err((h, jobs)) => return hold_old(h, jobs, None),
    };
    // The release as the probe resolved it: what every pod of it runs.
    let target = pinned(&spec.image, o);
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
    let gated = match gated(relay, o, &target, format, store) {
        Ok(g) => g,
        Err(h) => return hold_old(h, Vec::new(), Some(format)),
    };
    if !gated {
        return steady_out(&target, Some(format));
    }
    let cursor = UpgradeStatus {
        phase: UpgradePhase::BackingUp,
        target_image: Some(target),
        from_image: Some(sts.image.clone()),
        partition: Some(replicas),
        replicas: Some(replicas),
        retained_claims: o
            .claims
            .iter()
            .copied()
            .filter(|&i| i >= replicas)
            .collect(),
        step_started: Some(o.now.clone()),
        started: Some(o.now.clone()),
        retry_seen: spec.upgrade.retry.clone(),
        ..UpgradeStatus::default()
    };
    let mut prev_with_format = prev.clone();
    prev_with_format.target_format = Some(format);
    continue_upgrade(relay, &prev_with_format, cursor, o)
}

/// Whether the move to `target` (store format `format`, the stores at `store`) goes behind
/// the backup gate, or what holds it: a format below the stores' (only a rollback by
/// restore goes there), or a format change with no fresh backup to move over.
fn gated(
    relay: &Relay,
    o: &Observed,
    target: &str,
    format: u32,
    store: u32,
) -> Result<bool, Option<Hold>> {
    let spec = &relay.spec;
    if format < store {
        // Only a rollback by restore goes below the stores' format; one that could begin
        // began before this, so with `rollbackTo` this says why it could not.
        return Err(match &spec.upgrade.rollback_to {
            Some(_) => hold(
                "RollbackRefused",
                crate::restore::begin_rollback(relay, o, format, store)
                    .err()
                    .unwrap_or_else(|| format!("a rollback to {target} has completed already")),
                true,
            ),
            None => hold(
                "FormatTooOld",
                format!(
                    "{target} supports store format {format}, the stores are at {store}; a store is never moved back: to return to it, restore the nodes from their backups with spec.upgrade.rollbackTo (docs/operator.md, \"Restores: bootstrap and rollback\")"
                ),
                true,
            ),
        });
    }
    Ok(
        match (spec.backup.as_ref().map(|b| b.policy), spec.claim_backup()) {
            (Some(BackupPolicy::Never), _) => false,
            (Some(BackupPolicy::Always), Some(_)) => true,
            (Some(BackupPolicy::FormatChange), Some(_)) => format > store,
            // No claim to back up to: a format change moves over every node's fresh backup in
            // the object store, or not at all.
            _ if format > store => match crate::objstore::gate_problem(relay, o, store) {
                None => false,
                Some((reason, why, terminal)) => {
                    return Err(hold(
                        reason,
                        format!("{target} moves the stores from format {store} to {format}; {why}"),
                        terminal,
                    ));
                }
            },
            _ => false,
        },
    )
}

/// A rollback to begin: `spec.upgrade.rollbackTo` names `spec.image`, whose probed store
/// format is below the stores', and no rollback to it has completed. (Before the probe
/// answers, the ordinary path probes the image.)
fn rollback_to_begin(relay: &Relay, prev: &RelayStatus, o: &Observed) -> Option<RestoreStatus> {
    relay.spec.upgrade.rollback_to.as_ref()?;
    let done = prev.restore.as_ref().is_some_and(|r| {
        r.reason == crate::restore::ROLLBACK
            && r.phase == crate::restore::COMPLETED
            && r.image
                .as_deref()
                .is_some_and(|i| names_image(&relay.spec.image, i))
    });
    if done {
        return None;
    }
    let Some(ProbeObs::Format(format)) = o.probes.get(&relay.spec.image) else {
        return None;
    };
    let store = lowest_format(relay, prev, o)?;
    if *format >= store {
        return None;
    }
    crate::restore::begin_rollback(relay, o, *format, store).ok()
}

/// The store format of `image` from its probe, or the hold (and the probe Job to start)
/// while it is not known.
pub(crate) fn probe_of(image: &str, o: &Observed) -> Result<u32, (Option<Hold>, Vec<JobAction>)> {
    match o.probes.get(image) {
        None => Err((
            hold(
                "ProbingImage",
                format!("learning the store format of {image}"),
                false,
            ),
            vec![JobAction::Probe {
                image: image.to_owned(),
            }],
        )),
        Some(ProbeObs::Running) => Err((
            hold(
                "ProbingImage",
                format!("learning the store format of {image}"),
                false,
            ),
            Vec::new(),
        )),
        Some(ProbeObs::Failed(m)) => Err((
            hold(
                "ProbeFailed",
                format!("the image probe of {image} failed: {m}; set spec.image to a release that starts, or change spec.upgrade.retry to probe it again"),
                true,
            ),
            Vec::new(),
        )),
        Some(ProbeObs::Format(f)) => Ok(*f),
    }
}

/// A gated upgrade, from its cursor (an adoption's too).
pub(crate) fn continue_upgrade(
    relay: &Relay,
    prev: &RelayStatus,
    cursor: UpgradeStatus,
    o: &Observed,
) -> Rollout {
    if !cursor.adopting {
        return upgrade_decision(relay, prev, cursor, o);
    }
    if !names_image(
        &relay.spec.image,
        cursor.target_image.as_deref().unwrap_or(""),
    ) {
        // Another image before the claims were backed up: probed, and backed up for it.
        let mut fresh = prev.clone();
        fresh.upgrade = None;
        if let Some(again) = adopt::adopt(relay, &fresh, o, false) {
            return again;
        }
    }
    let out = upgrade_decision(relay, prev, cursor, o);
    adopt::adopted(relay, o, out)
}

/// The decision of a gated upgrade under way (its cursor).
fn upgrade_decision(
    relay: &Relay,
    prev: &RelayStatus,
    mut cursor: UpgradeStatus,
    o: &Observed,
) -> Rollout {
    let spec = &relay.spec;
    let names = crate::names::Names::of(relay).ok();
    let pod_name = |i: i32| names.as_ref().map(|n| n.pod(i)).unwrap_or_default();
    let n = cursor.replicas.unwrap_or(spec.replicas).max(0);
    let observed = o.statefulset.as_ref().map(|s| s.partition.clamp(0, n));
    let p = cursor.partition.or(observed).unwrap_or(n).clamp(0, n);
    cursor.partition = Some(p);
    cursor.replicas = Some(n);
    let target = cursor
        .target_image
        .clone()
        .unwrap_or_else(|| spec.image.clone());
    let from = cursor
        .from_image
        .clone()
        .or_else(|| o.statefulset.as_ref().map(|s| s.image.clone()))
        .unwrap_or_else(|| target.clone());
    cursor.from_image = Some(from.clone());
    let target_format = prev.target_format;
    let mut out = Rollout {
        image: target.clone(),
        partition: p,
        replicas: n,
        jobs: Vec::new(),
        upgrade: None,
        target_format,
        hold: None,
        backups_succeeded_now: false,
        current_image: prev.current_image.clone(),
        restore: None,
        claims: Vec::new(),
        hold_statefulset: false,
        stop_pod: None,
    };
    let step_age = cursor
        .step_started
        .as_deref()
        .and_then(|s| elapsed_s(s, &o.now));

    if o.statefulset.is_none() && !cursor.adopting {
        // Recreated at the release the nodes ran with every pod held (partition n): a new
        // StatefulSet creates pods at its template, and the old release refuses a newer
        // store where the new one would migrate an unbacked one; pods that outlived the
        // StatefulSet (an orphaning delete) are left as they are. The next decision moves
        // the template to the target and the partition back to the cursor's.
        out.image = from;
        out.partition = n;
        out.hold = hold(
            "StatefulSetMissing",
            format!(
                "recreating the StatefulSet on {} with every pod held; the upgrade resumes at partition {p}",
                out.image
            ),
            false,
        );
        out.upgrade = Some(cursor);
        return out;
    }

    if !names_image(&spec.image, &target) {
        let failed = matches!(cursor.phase, UpgradePhase::Failed | UpgradePhase::Blocked);
        if p >= n && o.pods.iter().all(|x| x.image != target) {
            // Nothing moved: the upgrade is cancelled, every pod stays on its release and
            // the new image goes through the gate from the start.
            out.image = from;
            out.partition = 0;
            cursor.phase = UpgradePhase::Idle;
            cursor.last_error = None;
            cursor.current_pod = None;
            cursor.failed_in = None;
            out.upgrade = Some(cursor);
            return out;
        }
        if !failed {
            out.hold = hold(
                "UpgradeInProgress",
                format!(
                    "{} is waiting: the upgrade to {target} finishes first",
                    spec.image
                ),
                false,
            );
        } else {
            // Fix forward: a release of the migrated stores' format replaces the target
            // from the step that failed.
            let format = match probe_of(&spec.image, o) {
                Ok(f) => f,
                Err((h, jobs)) => {
                    out.hold = h;
                    out.jobs = jobs;
                    out.upgrade = Some(cursor);
                    return out;
                }
            };
            if Some(format) != target_format {
                out.hold = hold(
                    "FixForwardRefused",
                    format!(
                        "{} supports store format {format}; nodes from {} on are at format {}: a fix must support that format (a store is never moved back)",
                        spec.image,
                        pod_name(p),
                        target_format.map(|f| f.to_string()).unwrap_or_else(|| "?".into())
                    ),
                    true,
                );
                out.upgrade = Some(cursor);
                return out;
            }
            cursor.target_image = Some(pinned(&spec.image, o));
            out.image = pinned(&spec.image, o);
            return resume(relay, cursor, o, out);
        }
    }

    if matches!(cursor.phase, UpgradePhase::Failed | UpgradePhase::Blocked) {
        if spec.upgrade.retry == cursor.retry_seen {
            out.hold = hold(
                if cursor.failed_in == Some(UpgradePhase::BackingUp) {
                    "BackupFailed"
                } else {
                    "UpgradeFailed"
                },
                format!(
                    "{}; change spec.upgrade.retry to try again, or set spec.image to a fixed release of the same store format",
                    cursor.last_error.clone().unwrap_or_default()
                ),
                true,
            );
            out.upgrade = Some(cursor);
            return out;
        }
        return resume(relay, cursor, o, out);
    }
    if spec.upgrade.paused {
        out.hold = hold("Paused", "spec.upgrade.paused holds the upgrade", false);
        out.upgrade = Some(cursor);
        return out;
    }
    step(relay, cursor, o, out, step_age)
}

/// A failed upgrade resumes the step it stopped in, as a new attempt (new Job names, a new
/// deadline).
fn resume(relay: &Relay, mut cursor: UpgradeStatus, o: &Observed, out: Rollout) -> Rollout {
    cursor.retry_seen = relay.spec.upgrade.retry.clone();
    cursor.last_error = None;
    cursor.phase = cursor.failed_in.take().unwrap_or(UpgradePhase::BackingUp);
    cursor.step_started = Some(o.now.clone());
    // The Jobs observed belong to the attempt that failed.
    let mut fresh = o.clone();
    fresh.backups.clear();
    step(relay, cursor, &fresh, out, Some(0))
}

fn fail(
    mut cursor: UpgradeStatus,
    mut out: Rollout,
    reason: &'static str,
    message: String,
) -> Rollout {
    cursor.failed_in = Some(match cursor.phase {
        UpgradePhase::Failed | UpgradePhase::Blocked => UpgradePhase::BackingUp,
        phase => phase,
    });
    cursor.phase = UpgradePhase::Failed;
    cursor.last_error = Some(message.clone());
    out.jobs.clear();
    out.hold = hold(
        reason,
        format!("{message}; change spec.upgrade.retry to try again, or set spec.image to a fixed release of the same store format"),
        true,
    );
    out.upgrade = Some(cursor);
    out
}

/// One step of a running upgrade at the cursor's partition.
fn step(
    relay: &Relay,
    mut cursor: UpgradeStatus,
    o: &Observed,
    mut out: Rollout,
    step_age: Option<i64>,
) -> Rollout {
    let spec = &relay.spec;
    let names = crate::names::Names::of(relay).ok();
    let pod_name = |i: i32| names.as_ref().map(|n| n.pod(i)).unwrap_or_default();
    let n = cursor.replicas.unwrap_or(spec.replicas).max(0);
    let p = cursor.partition.unwrap_or(n);
    let target = cursor.target_image.clone().unwrap_or_default();
    let target_format = out.target_format;
    out.partition = p;
    out.image = target.clone();
    if cursor.phase == UpgradePhase::Rolling {
        // A cursor written before `Verifying` covered it.
        cursor.phase = UpgradePhase::Verifying;
    }

    // Every node at or above the partition must run the target, Ready, at the target's
    // format with no migration running, before the next one is backed up and moves (after
    // a fix forward, or a pod recreated, that is more than the last one moved).
    if let Some((i, state, failing)) = unverified(o, p, n, &target, target_format) {
        let name = pod_name(i);
        if failing {
            return fail(
                cursor,
                out,
                "UpgradeFailed",
                format!("{name} on {target}: {state}; the other nodes stay on their release"),
            );
        }
        if cursor.phase != UpgradePhase::Verifying {
            cursor.phase = UpgradePhase::Verifying;
            cursor.step_started = Some(o.now.clone());
            cursor.current_pod = Some(name);
            out.upgrade = Some(cursor);
            return out;
        }
        let limit = spec.upgrade.timeouts.verify_seconds;
        if step_age.map(|a| a > limit).unwrap_or(false) {
            return fail(
                cursor,
                out,
                "UpgradeTimedOut",
                format!("{name} was not verified on {target} within {limit} s ({state})"),
            );
        }
        cursor.current_pod = Some(name);
        out.upgrade = Some(cursor);
        return out;
    }
    cursor.pods_migrated = n - p;
    if cursor.phase == UpgradePhase::Verifying {
        if p == 0 {
            cursor.phase = UpgradePhase::Completed;
            cursor.current_pod = None;
            out.current_image = Some(target);
            out.upgrade = Some(cursor);
            return out;
        }
        // The next node is backed up now, just before it moves.
        cursor.phase = UpgradePhase::BackingUp;
        cursor.step_started = Some(o.now.clone());
        let mut fresh = o.clone();
        fresh.backups.clear();
        return step(relay, cursor, &fresh, out, Some(0));
    }

    {
        // Node p-1, now; at the first step also the claims no pod uses.
        let mut wanted: Vec<(i32, bool)> = Vec::new();
        if p == n {
            wanted.extend(cursor.retained_claims.iter().map(|&i| (i, true)));
        }
        if p > 0 {
            wanted.push((p - 1, false));
        }
        cursor.current_pod = (p > 0).then(|| pod_name(p - 1));
        let (mut jobs, done) = match backups_of_step(relay, o, &cursor, &wanted, &target) {
            Ok(j) => j,
            Err(message) => return fail(cursor, out, "BackupFailed", message),
        };
        cursor.backup_jobs = wanted
            .iter()
            .map(|&(i, _)| backup_job_name(relay, i, &cursor))
            .collect();
        if done < wanted.len() {
            // One backup Job at a time: they all mount the backup claim, which a
            // ReadWriteOnce volume attaches to one host at a time (a second Job elsewhere
            // would wait on Multi-Attach until its deadline).
            // A scheduled backup running now goes first.
            let running = wanted
                .iter()
                .any(|(i, _)| o.backups.get(i) == Some(&JobObs::Running))
                || o.scheduled.values().any(|j| *j == JobObs::Running);
            jobs.truncate(usize::from(!running));
            if let Some(next) = jobs.first().map(JobAction::ordinal) {
                if let Some(problem) = backup_claim_problem(relay, o, next) {
                    out.hold = out.hold.or(hold("BackupClaimNotReady", problem, true));
                    out.upgrade = Some(cursor);
                    return out;
                }
            }
            out.jobs = jobs;
            // A hold already set (a new image waiting for this upgrade) says more.
            out.hold = out.hold.or(hold(
                "BackingUp",
                format!(
                    "backing up {} before it moves to {target} ({done}/{} backups of this step done)",
                    cursor.current_pod.clone().unwrap_or_default(),
                    wanted.len()
                ),
                false,
            ));
            out.upgrade = Some(cursor);
            return out;
        }
        // Every backup of the step is on the backup volume: the next node moves.
        out.backups_succeeded_now = !wanted.is_empty();
        if p == 0 {
            cursor.phase = UpgradePhase::Completed;
            cursor.current_pod = None;
            out.partition = 0;
            out.upgrade = Some(cursor);
            return out;
        }
        cursor.phase = UpgradePhase::Verifying;
        cursor.partition = Some(p - 1);
        cursor.step_started = Some(o.now.clone());
        cursor.current_pod = Some(pod_name(p - 1));
        out.partition = p - 1;
        out.upgrade = Some(cursor);
        out
    }
}

/// The backup Jobs a step of the gate still starts — one for each of the `wanted` nodes
/// (`(ordinal, offline)`) that has none yet — and how many of them succeeded; a failed
/// one's message.
fn backups_of_step(
    relay: &Relay,
    o: &Observed,
    cursor: &UpgradeStatus,
    wanted: &[(i32, bool)],
    target: &str,
) -> Result<(Vec<JobAction>, usize), String> {
    let names = crate::names::Names::of(relay).ok();
    let mut jobs = Vec::new();
    let mut done = 0;
    for &(ordinal, offline) in wanted {
        let name = backup_job_name(relay, ordinal, cursor);
        match o.backups.get(&ordinal) {
            None => jobs.push(if offline {
                JobAction::OfflineBackup {
                    ordinal,
                    target: target.to_owned(),
                    name,
                }
            } else {
                JobAction::Backup {
                    ordinal,
                    target: target.to_owned(),
                    name,
                }
            }),
            Some(JobObs::Running) => {}
            Some(JobObs::Succeeded) => done += 1,
            Some(JobObs::Failed(m)) => {
                let pod = names.as_ref().map(|n| n.pod(ordinal)).unwrap_or_default();
                return Err(format!("backup Job {name} of {pod} failed: {m}"));
            }
        }
    }
    Ok((jobs, done))
}

/// Why the backup claim cannot take the next backup Job's archive — node `next`'s — if it
/// cannot: it does not exist, or it lacks the room for the archive (at most the store's
/// size on disk) and as much again to unpack it for its check, which the Job does before it
/// prunes older archives. The room is the claim's free space as the last backup Job on it
/// reported (`status.backupClaims`), older archives counted; before any report, its
/// capacity, which a first run on a shared claim fills with every node's archive. A store
/// whose size its node does not report (an older release) is not counted.
pub(crate) fn backup_claim_problem(relay: &Relay, o: &Observed, next: i32) -> Option<String> {
    let (_, destination) = relay.spec.claim_backup()?;
    let ns = relay.metadata.namespace.as_deref().unwrap_or("default");
    let names = crate::names::Names::of(relay).ok()?;
    let size = |pod: &str| o.nodes.get(pod)?.as_ref().ok()?.status.store_bytes;
    let pod = names.pod(next);
    let (claim, obs) = match destination.shared() {
        Some(claim) => (claim.to_owned(), o.backup_claim.as_ref()?),
        // The operator makes a missing claim of a node's own.
        None => (names.backup_claim(next), o.node_backup_claims.get(&next)?),
    };
    let capacity = match obs {
        BackupClaimObs::Missing if destination.shared().is_some() => {
            return Some(format!(
                "the backup claim {claim} does not exist in namespace {ns}: create it (see docs/deployment.md, \"Backup volumes\"); backups wait for it, and an upgrade moves nothing"
            ))
        }
        BackupClaimObs::Missing => return None,
        BackupClaimObs::Present { capacity_bytes } => *capacity_bytes,
    };
    let store = size(&pod)?;
    let needed = 2 * store;
    let mib = |b: u64| b.div_ceil(1 << 20);
    if let Some(room) = o.backup_claim_rooms.get(&claim) {
        if let Some(free) = room.free_bytes {
            return (free < needed).then(|| {
                format!(
                    "the backup claim {claim} has {} MiB free after its last backup (Job {}); {pod} needs {} MiB (an archive of its {} MiB store and as much again to check it); grow the claim or lower spec.backup.retention (backups wait, and an upgrade moves nothing)",
                    free >> 20,
                    room.job,
                    mib(needed),
                    mib(store)
                )
            });
        }
    }
    let capacity = capacity?;
    if destination.shared().is_none() {
        return (capacity < needed).then(|| {
            format!(
                "the backup claim {claim} holds {} MiB, {pod} needs {} MiB (its store and room to check its archive); grow the claim (backups wait, and an upgrade moves nothing)",
                capacity >> 20,
                mib(needed)
            )
        });
    }
    // Nothing reported on a shared claim yet: its first run writes every node's archive.
    let sizes: Vec<u64> = (0..relay.spec.replicas.max(next + 1))
        .filter_map(|i| size(&names.pod(i)))
        .collect();
    let total = sizes.iter().sum::<u64>();
    let needed = total + sizes.iter().max().copied().unwrap_or(0);
    (capacity < needed).then(|| {
        format!(
            "the backup claim {claim} holds {} MiB; the nodes' stores take {} MiB on disk, plus the largest again to check its archive: {} MiB at least; grow the claim (backups wait, and an upgrade moves nothing)",
            capacity >> 20,
            mib(total),
            mib(needed)
        )
    })
}

/// The highest node at or above `p` (below `n`) not verified on `target`: its ordinal,
/// what it is doing, and whether that is a failure (a waiting reason that needs a change).
fn unverified(
    o: &Observed,
    p: i32,
    n: i32,
    target: &str,
    target_format: Option<u32>,
) -> Option<(i32, String, bool)> {
    for i in (p..n).rev() {
        let pod = o.pods.iter().find(|x| x.ordinal == i);
        let Some(pod) = pod else {
            return Some((i, "no pod".into(), false));
        };
        if pod.image != target {
            return Some((i, format!("the pod still runs {}", pod.image), false));
        }
        if let Some(reason) = &pod.failing {
            return Some((i, reason.clone(), true));
        }
        if !pod.ready {
            let state = match &pod.waiting {
                Some(w) => format!("the pod is not Ready: {w}"),
                None => "the pod is not Ready".to_owned(),
            };
            return Some((i, state, false));
        }
        match o.nodes.get(&pod.name) {
            Some(Ok(r)) if r.status.migrating_to.is_some() => {
                return Some((i, "still migrating".into(), false))
            }
            Some(Ok(r)) if target_format.is_some_and(|f| r.status.store_format != f) => {
                return Some((
                    i,
                    format!("at store format {}", r.status.store_format),
                    false,
                ))
            }
            Some(Ok(_)) => {}
            _ => return Some((i, "its /v1/node does not answer".into(), false)),
        }
    }
    None
}
