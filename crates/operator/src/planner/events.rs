//! The Events of the upgrade gate's decisions ([`upgrade_events`]): what changed from one
//! cursor to the next, and the Jobs a decision starts.

use ankusa_crds::relay::Relay;
use ankusa_crds::status::{UpgradePhase, UpgradeStatus};

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
