//! A Relay created over data claims an earlier one left goes through the upgrade gate
//! before any node opens them. Pure, like the planner, whose upgrade path calls it.

use ankusa_crds::relay::{BackupPolicy, Relay};
use ankusa_crds::status::{RelayStatus, UpgradePhase, UpgradeStatus};

use super::{continue_upgrade, probe_of};
use crate::observed::{hold, Hold, JobObs, Observed};
use crate::plan::{pinned, Rollout};

/// A Relay created over data claims an earlier one left: no StatefulSet, no store any node
/// of it has opened, no upgrade recorded. A store on those claims may be of an older format
/// that `spec.image` would migrate forward the moment a node opens it, so, as an upgrade's
/// first step does for the claims a scale-down left, the image is probed and every claim
/// backed up offline before the StatefulSet exists (an `adopting` cursor covering no
/// running node). Their format is not known before a node opens them, so they are backed
/// up whatever the image's format (`policy: Never` starts at once); with no backup
/// destination nothing starts (`NoBackupDestination`).
pub(crate) fn adopt(
    relay: &Relay,
    prev: &RelayStatus,
    o: &Observed,
    store_known: bool,
) -> Option<Rollout> {
    let spec = &relay.spec;
    if o.claims.is_empty()
        || store_known
        || prev.current_image.is_some()
        || prev.upgrade.is_some()
        || spec.backup.as_ref().map(|b| b.policy) == Some(BackupPolicy::Never)
    {
        return None;
    }
    let held = |h: Option<Hold>, jobs, target_format| Rollout {
        image: spec.image.clone(),
        partition: 0,
        replicas: 0,
        jobs,
        upgrade: None,
        target_format,
        hold: h,
        backups_succeeded_now: false,
        current_image: None,
        restore: None,
        claims: Vec::new(),
        hold_statefulset: true,
        stop_pod: None,
    };
    let format = match probe_of(&spec.image, o) {
        Ok(f) => f,
        Err((h, jobs)) => return Some(held(h, jobs, None)),
    };
    let names = crate::names::Names::of(relay).ok();
    let claims = retained_claim_names(names.as_ref(), &o.claims);
    if spec.claim_backup().is_none() {
        return Some(held(
            hold(
                "NoBackupDestination",
                format!(
                    "the data claims {claims} of an earlier Relay hold stores no node of this one has opened; {} (store format {format}) would migrate an older one forward with no backup: set spec.backup.destination to back them up first (or spec.backup.policy: Never, or delete the claims to start empty)",
                    spec.image
                ),
                true,
            ),
            Vec::new(),
            Some(format),
        ));
    }
    let cursor = UpgradeStatus {
        phase: UpgradePhase::BackingUp,
        target_image: Some(pinned(&spec.image, o)),
        partition: Some(0),
        replicas: Some(0),
        retained_claims: o.claims.clone(),
        step_started: Some(o.now.clone()),
        started: Some(o.now.clone()),
        retry_seen: spec.upgrade.retry.clone(),
        adopting: true,
        ..UpgradeStatus::default()
    };
    let mut prev_with_format = prev.clone();
    prev_with_format.target_format = Some(format);
    Some(continue_upgrade(relay, &prev_with_format, cursor, o))
}

/// `data-<name>-<i>, …` for the status.
fn retained_claim_names(names: Option<&crate::names::Names>, ordinals: &[i32]) -> String {
    ordinals
        .iter()
        .map(|&i| names.map(|n| n.claim(i)).unwrap_or_else(|| i.to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

/// The decision of an adopting cursor: no StatefulSet until every claim is backed up, then
/// one on the probed image with the spec's replicas.
pub(crate) fn adopted(relay: &Relay, o: &Observed, mut out: Rollout) -> Rollout {
    let done = out
        .upgrade
        .as_ref()
        .is_some_and(|u| u.phase == UpgradePhase::Completed);
    if done {
        out.replicas = relay.spec.replicas.max(0);
        out.partition = 0;
        out.current_image = Some(out.image.clone());
        out.hold_statefulset = false;
        return out;
    }
    out.hold_statefulset = true;
    out.replicas = 0;
    if let Some(h) = out.hold.as_mut().filter(|h| h.reason == "BackingUp") {
        let names = crate::names::Names::of(relay).ok();
        let done = o
            .backups
            .values()
            .filter(|j| **j == JobObs::Succeeded)
            .count();
        h.message = format!(
            "the data claims {} of an earlier Relay are backed up before any node opens them with {} ({done}/{} done)",
            retained_claim_names(names.as_ref(), &o.claims),
            out.image,
            o.claims.len()
        );
    }
    out
}
