//! What a rollout decision is made of: the decision ([`Rollout`]), the Jobs it asks for
//! ([`JobAction`]) and their names, and an image as pods run it ([`pinned`]). The planner
//! makes them; its parts (adoption, drain, restore) and the controller read them.

use ankusa_crds::relay::Relay;
use ankusa_crds::status::{RestoreStatus, UpgradeStatus};

use crate::observed::{Hold, Observed};

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
    /// Pack the store on claim `ordinal`, which no pod uses (it outlived a scale-down),
    /// onto the backup volume for `target`.
    OfflineBackup {
        ordinal: i32,
        target: String,
        name: String,
    },
    /// Restore node `ordinal`'s data claim from its newest backup (at most `format`),
    /// running `image`.
    Restore {
        ordinal: i32,
        name: String,
        image: String,
        format: Option<u32>,
        /// One archive of the node's backup directory (`spec.restoreNode.backup`); `None`:
        /// its newest.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        archive: Option<String>,
        /// The Job writes what it found (`restore --report`) to its termination message
        /// (a node restore's: the release the node runs has the flag).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        report: bool,
    },
}

impl JobAction {
    /// The node it is for (a probe's: none, -1).
    pub fn ordinal(&self) -> i32 {
        match self {
            JobAction::Probe { .. } => -1,
            JobAction::Backup { ordinal, .. }
            | JobAction::OfflineBackup { ordinal, .. }
            | JobAction::Restore { ordinal, .. } => *ordinal,
        }
    }

    /// The Job's name.
    pub fn name(&self, relay: &Relay) -> String {
        match self {
            JobAction::Probe { image } => probe_job_name(relay, image),
            JobAction::Backup { name, .. }
            | JobAction::OfflineBackup { name, .. }
            | JobAction::Restore { name, .. } => name.clone(),
        }
    }
}

/// The rollout decision.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Rollout {
    /// The image the StatefulSet's template carries.
    pub image: String,
    /// Its rolling-update partition.
    pub partition: i32,
    /// Its replicas: `spec.replicas`, or the count a gated upgrade began with while it runs.
    pub replicas: i32,
    pub jobs: Vec<JobAction>,
    /// The cursor to write (`None`: no gated upgrade has run).
    pub upgrade: Option<UpgradeStatus>,
    /// The target image's store format, when known.
    pub target_format: Option<u32>,
    /// Why pods are held, or what stopped the upgrade (for the conditions).
    pub hold: Option<Hold>,
    /// The backups of an upgrade step all succeeded in this decision.
    pub backups_succeeded_now: bool,
    /// The image every node runs with no upgrade under way (`status.currentImage`).
    pub current_image: Option<String>,
    /// The restore cursor to write (`None`: no restore in this decision).
    pub restore: Option<RestoreStatus>,
    /// Node data claims to create before their restore (a bootstrap).
    pub claims: Vec<i32>,
    /// The StatefulSet is not created yet (a bootstrap restores its claims first).
    pub hold_statefulset: bool,
    /// A node restore stops this pod alone: the StatefulSet is deleted with its pods
    /// orphaned (the others keep serving), then this pod; `hold_statefulset` keeps it
    /// from being made again until the restore ends.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stop_pod: Option<String>,
}

/// `image` pinned to the digest its probe resolved (`image@sha256:…`), or as it is when
/// none is known (or it names a digest already).
pub fn pinned(image: &str, o: &Observed) -> String {
    match o.digests.get(image) {
        Some(d) if !image.contains('@') => format!("{image}@{d}"),
        _ => image.to_owned(),
    }
}

/// The backup Job of node `ordinal` in the upgrade `cursor` stands for: its name carries the
/// target, the attempt (the retry token) and when the upgrade began, so a retried upgrade,
/// a fix forward or a later upgrade to the same target backs up anew.
pub fn backup_job_name(relay: &Relay, ordinal: i32, cursor: &UpgradeStatus) -> String {
    let name = relay.metadata.name.clone().unwrap_or_default();
    let key = format!(
        "{}\n{}\n{}",
        cursor.target_image.as_deref().unwrap_or(""),
        cursor.retry_seen.as_deref().unwrap_or(""),
        cursor.started.as_deref().unwrap_or("")
    );
    format!("{name}-backup-{ordinal}-{}", job_hash(&key))
}

/// The image probe Job of `image`, for this value of `spec.upgrade.retry`: a new value
/// names a Job that does not exist yet, so a failed probe is run again (the failed one is
/// kept, as every Job is, for a day).
pub fn probe_job_name(relay: &Relay, image: &str) -> String {
    let name = relay.metadata.name.clone().unwrap_or_default();
    let key = match relay.spec.upgrade.retry.as_deref() {
        None => image.to_owned(),
        Some(retry) => format!("{image}\n{retry}"),
    };
    format!("{name}-probe-{}", job_hash(&key))
}

/// 8 hex digits of `key`'s hash: a Job name must stay a 63-character label (the CRD holds
/// Relay names to 40 characters for it).
fn job_hash(key: &str) -> String {
    let mut h = crate::names::config_hash(key);
    h.truncate(8);
    h
}
