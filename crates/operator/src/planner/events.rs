//! The Events of the upgrade gate's decisions ([`upgrade_events`]): what changed from one
//! cursor to the next, and the Jobs a decision starts.

use std::collections::BTreeSet;

use ankusa_crds::relay::Relay;
use ankusa_crds::status::{RelayStatus, UpgradePhase, UpgradeStatus};

use crate::observed::in_progress;
use crate::plan::{JobAction, Rollout};

/// An Event of a step of the upgrade gate.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StepEvent {
    pub reason: &'static str,
    pub message: String,
    pub warning: bool,
}

/// The Events of one decision of the gate: what changed from the cursor `prev` to `next`,
/// and the Jobs it starts.
pub fn upgrade_events(
    relay: &Relay,
    prev: Option<&UpgradeStatus>,
    next: Option<&UpgradeStatus>,
    r: &Rollout,
) -> Vec<StepEvent> {
    let mut out = Vec::new();
    let ev = |reason, message: String, warning| StepEvent {
        reason,
        message,
        warning,
    };
    for job in &r.jobs {
        match job {
            JobAction::Probe { image } => out.push(ev(
                "ProbeStarted",
                format!("Job {} learns the store format of {image}", job.name(relay)),
                false,
            )),
            JobAction::Backup { ordinal, name, .. }
            | JobAction::OfflineBackup { ordinal, name, .. } => out.push(ev(
                "BackupStarted",
                format!("Job {name} backs up node {ordinal}"),
                false,
            )),
            JobAction::Restore {
                ordinal,
                name,
                format,
                ..
            } => out.push(ev(
                "RestoreStarted",
                match format {
                    Some(f) => format!(
                        "Job {name} restores node {ordinal} from its newest backup at store format {f} or lower"
                    ),
                    None => format!("Job {name} restores node {ordinal} from its newest backup"),
                },
                false,
            )),
        }
    }
    let Some(next) = next else {
        return out;
    };
    let default = UpgradeStatus::default();
    let prev = prev.unwrap_or(&default);
    let target = next.target_image.clone().unwrap_or_default();
    if r.backups_succeeded_now {
        out.push(ev(
            "BackupSucceeded",
            format!("backed up: {}", next.backup_jobs.join(", ")),
            false,
        ));
    }
    if next.phase == UpgradePhase::BackingUp && prev.phase != UpgradePhase::BackingUp {
        if let Some(from) = &next.from_image {
            if !in_progress(prev) {
                out.push(ev(
                    "UpgradeStarted",
                    format!("{from} → {target}: each node is backed up just before it moves, highest ordinal first"),
                    false,
                ));
            }
        }
    }
    if let (Some(a), Some(b)) = (prev.partition, next.partition) {
        if b < a && in_progress(prev) {
            out.push(ev(
                "PartitionLowered",
                format!(
                    "partition {a} → {b}: {} moves to {target}",
                    next.current_pod.clone().unwrap_or_default()
                ),
                false,
            ));
        }
    }
    if next.pods_migrated > prev.pods_migrated && in_progress(prev) {
        let pod = prev.current_pod.clone().unwrap_or_default();
        out.push(ev(
            "NodeVerified",
            format!("{pod} runs {target}, Ready, its store migrated"),
            false,
        ));
    }
    if next.phase == UpgradePhase::Completed && prev.phase != UpgradePhase::Completed {
        out.push(ev(
            "UpgradeCompleted",
            format!("every node runs {target}"),
            false,
        ));
    }
    if next.phase == UpgradePhase::Failed && prev.phase != UpgradePhase::Failed {
        let message = next.last_error.clone().unwrap_or_default();
        if next.failed_in == Some(UpgradePhase::BackingUp) {
            out.push(ev("BackupFailed", message.clone(), true));
        }
        out.push(ev("UpgradeFailed", message, true));
    }
    if prev.phase == UpgradePhase::Failed && next.phase != UpgradePhase::Failed && in_progress(next)
    {
        out.push(ev(
            "UpgradeResumed",
            format!(
                "resuming at {} towards {target}",
                next.current_pod.clone().unwrap_or_default()
            ),
            false,
        ));
    }
    out
}

/// Faults whose Warning Event [`upgrade_events`] raises already.
const UPGRADE_FAULTS: [&str; 2] = ["UpgradeFailed", "BackupFailed"];

/// The Warning Events of one reconcile besides the upgrade gate's: each fault (a reason of
/// `Degraded`) that was not among those `reported` at the Relay's last reconcile, a node's
/// scheduled backup that failed since the last status, and the object store's pushes
/// turning to failing or stale. A fault that lasts raises one Event, not one a reconcile.
pub fn fault_events(
    reported: &BTreeSet<&'static str>,
    faults: &[(&'static str, String)],
    prev: &RelayStatus,
    next: &RelayStatus,
) -> Vec<StepEvent> {
    let mut out: Vec<StepEvent> = faults
        .iter()
        .filter(|(reason, _)| !reported.contains(reason) && !UPGRADE_FAULTS.contains(reason))
        .map(|(reason, message)| StepEvent {
            reason,
            message: message.clone(),
            warning: true,
        })
        .collect();
    let failure = |s: &RelayStatus, pod: &str| {
        s.scheduled_backups
            .as_ref()
            .and_then(|b| b.nodes.iter().find(|n| n.name == pod))
            .and_then(|n| n.last_failure.clone())
    };
    for n in next.scheduled_backups.iter().flat_map(|b| &b.nodes) {
        match (&n.last_failure, failure(prev, &n.name)) {
            (Some(now), before) if before.as_ref() != Some(now) => out.push(StepEvent {
                reason: "ScheduledBackupFailed",
                message: format!("{}: {now}", n.name),
                warning: true,
            }),
            _ => {}
        }
    }
    let pushes = |s: &RelayStatus| {
        s.conditions
            .iter()
            .find(|c| c.type_ == "ObjectStoreBackups")
            .map(|c| (c.reason.clone(), c.message.clone()))
    };
    if let Some((reason, message)) = pushes(next) {
        let bad = reason == "PushFailing" || reason == "Stale";
        if bad && pushes(prev).map(|(r, _)| r) != Some(reason.clone()) {
            out.push(StepEvent {
                reason: if reason == "Stale" {
                    "ObjectStoreBackupsStale"
                } else {
                    "ObjectStorePushFailing"
                },
                message,
                warning: true,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use ankusa_crds::status::{NodeBackup, ScheduledBackups};

    fn with_failure(f: Option<&str>) -> RelayStatus {
        RelayStatus {
            scheduled_backups: Some(ScheduledBackups {
                nodes: vec![NodeBackup {
                    name: "hooks-0".into(),
                    last_failure: f.map(str::to_owned),
                    ..NodeBackup::default()
                }],
                ..ScheduledBackups::default()
            }),
            ..RelayStatus::default()
        }
    }

    #[test]
    fn a_fault_raises_one_warning_when_it_appears_and_a_backup_failure_one_each() {
        let faults = vec![
            ("ConfigInvalid", "bad key".to_owned()),
            ("UpgradeFailed", "its own Event".to_owned()),
        ];
        let none = RelayStatus::default();
        let first = fault_events(&BTreeSet::new(), &faults, &none, &none);
        assert_eq!(
            first.iter().map(|e| e.reason).collect::<Vec<_>>(),
            ["ConfigInvalid"]
        );
        assert!(first[0].warning);
        let reported: BTreeSet<&'static str> = ["ConfigInvalid", "UpgradeFailed"].into();
        assert!(fault_events(&reported, &faults, &none, &none).is_empty());
        // A scheduled backup fails: one Event; the same failure again: none; a new one: one.
        let failed = with_failure(Some("Job b1 failed"));
        let e = fault_events(&reported, &faults, &with_failure(None), &failed);
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].reason, "ScheduledBackupFailed");
        assert!(e[0].message.contains("hooks-0: Job b1 failed"));
        assert!(fault_events(&reported, &faults, &failed, &failed).is_empty());
        let again = with_failure(Some("Job b2 failed"));
        assert_eq!(fault_events(&reported, &faults, &failed, &again).len(), 1);
    }
}
