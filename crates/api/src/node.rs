//! The node status served at `GET /v1/node`.

use serde::{Deserialize, Serialize};

/// The six queue counters of a tenant, or of a node (every tenant's summed into ord 0):
/// the one definition, shared by the queue (which keeps them), the relay's API (which
/// serves them) and the operator (which reads them from `/v1/node`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Counters {
    /// First-attempt rows waiting.
    pub pending: i64,
    /// Retry rows waiting.
    pub scheduled: i64,
    pub inflight: i64,
    pub dead: i64,
    /// Σ size of every existing delivery row.
    pub bytes: i64,
    pub archive_pending: i64,
}

/// `ankusa-relay version --json`: the release, and the newest store format it supports
/// (what the operator's probe Job learns of an image before it rolls it out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Version {
    pub version: String,
    pub store_format: u32,
}

/// A store-format migration under way.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MigrationProgress {
    pub from: u32,
    pub to: u32,
    /// Steps committed by this process's run.
    pub steps: u64,
    /// Rows moved by this process's run.
    pub rows: u64,
}

/// `GET /v1/node`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeStatus {
    /// The relay release.
    pub version: String,
    /// The newest store format the release supports.
    pub supported_format: u32,
    /// The store's format stamp.
    pub store_format: u32,
    /// The format an unfinished migration is moving to, if any.
    pub migrating_to: Option<u32>,
    /// Progress of the migration this process is running, if any.
    #[serde(default)]
    pub migration: Option<MigrationProgress>,
    /// Tenant ordinals ever allocated.
    pub tenants: u32,
    pub counters: Counters,
    /// When the oldest due row became due (ms since the epoch), if any.
    pub oldest_due_at_ms: Option<u64>,
    /// Set while the store's writes fail (a full disk, a failed WAL sync): the node acks
    /// nothing and is not ready until a write succeeds again.
    #[serde(default)]
    pub write_error: Option<WriteError>,
    /// The node's place in a Relay of several nodes (absent when it runs alone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterStatus>,
    /// The store's size on disk (table and blob files, write-ahead log): what the operator
    /// checks the backup claim's room against. Absent from older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_bytes: Option<u64>,
    /// The free space of the volume the store is on: what a restore over it may fill (the
    /// store it replaces stays beside it). Absent from older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_free_bytes: Option<u64>,
    /// The configuration the node runs: when it was loaded, and the last reload it
    /// refused. Absent from older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<ConfigStatus>,
    /// Tenants whose deliveries this node holds (paused). Absent from older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants_paused: Option<u64>,
    /// Tenants a quota refused a hook of on this node within the last 5 minutes. Absent
    /// from older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants_over_quota: Option<u64>,
    /// The node's pushes to an object store (`backup.object_store`). Absent when it has
    /// none, and from older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub object_backups: Option<ObjectBackups>,
}

/// A node's backups to an object store: the last that completed, and the failures since.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ObjectBackups {
    /// Where they go: `s3://bucket/prefix/<node>`.
    pub url: String,
    /// The last backup that completed (its manifest written).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last: Option<ObjectBackup>,
    /// Pushes that failed since the last one that completed.
    pub failures: u64,
    /// Why the last push failed, while pushes fail.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the last push failed (ms since the epoch; 0: none).
    pub last_error_at_ms: u64,
    /// Pushes that completed since the node started.
    pub pushes: u64,
    /// The newest backup in the bucket at each store format it holds, as of the last push
    /// (what a rollback to that format or above can restore). Absent from older releases.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub formats: Vec<FormatBackup>,
}

/// The newest backup at one store format.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FormatBackup {
    pub store_format: u32,
    pub id: String,
    /// When its checkpoint was taken (ms since the epoch).
    pub at_ms: u64,
    /// The store's size in it (what its restore writes).
    #[serde(default)]
    pub bytes: u64,
}

/// One backup in the bucket.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ObjectBackup {
    /// Its id (`b<ms>`).
    pub id: String,
    /// When its checkpoint was taken (ms since the epoch): every hook acked before it is
    /// in the bucket, the recovery point.
    pub at_ms: u64,
    /// The store format of the backup.
    pub store_format: u32,
    pub files: u64,
    /// The store's size in it.
    pub bytes: u64,
    /// What this push uploaded (the files the bucket did not hold yet, and its own).
    pub uploaded_bytes: u64,
    /// How long the push took, checkpoint to manifest.
    pub duration_ms: u64,
}

/// The configuration a node runs (`ankusa-relay run --config FILE`, reloaded on SIGHUP or
/// when the file changes).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ConfigStatus {
    /// When the running configuration was loaded: at start, or by the last reload that
    /// changed something (ms since the epoch).
    pub loaded_at_ms: u64,
    /// Reloads applied since the node started.
    pub reloads: u64,
    /// The last reload refused, while the file still says what was refused: the running
    /// configuration is the one before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused: Option<ReloadRefusal>,
}

/// A reload the node refused, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ReloadRefusal {
    pub message: String,
    pub at_ms: u64,
}

/// A node of a Relay of several nodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClusterStatus {
    /// Its name in `cluster.nodes`.
    pub name: String,
    /// Nodes in the Relay's list.
    pub nodes: u32,
    /// Tenants it has taken hooks for as their owner since it started.
    pub tenants_owned: u64,
    /// Tenants it admitted as their owner; the Relay holds the sum over its nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants_registered: Option<u64>,
    /// Its tenant slots: its share of `tenants.max`, plus what other nodes lent it, less
    /// what it lent them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_slots: Option<u64>,
    /// The node is marked `leaving` in its list: it owns no tenant and drains.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
    /// The rows this node holds of tenants another node owns, on their way there
    /// (docs/architecture.md, handoff). Absent from older releases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub handoff: Option<HandoffStatus>,
}

/// What a node holds of tenants it does not own, as of its last handoff pass: a node
/// leaving the Relay may go once `drained`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HandoffStatus {
    /// Tenants stored here that another node owns and that still have rows here.
    pub tenants_leaving: u64,
    /// Their deliveries still here (pending, scheduled, in flight, dead), and their archive
    /// obligations (a delivered hook's copy is made here, then moves).
    pub rows_leaving: u64,
    /// Items taken out of this node's queue and sent, not yet confirmed by their receiver.
    pub staged: u64,
    /// Hooks handed to their owners since this node started.
    pub hooks_moved: u64,
    /// Hooks taken from other nodes since this node started.
    pub hooks_received: u64,
    /// The last pass found nothing of another node's tenants here, and nothing staged (and,
    /// on a leaving node, no hook log record left to hand on).
    pub drained: bool,
    /// Why the handoff does not move, while it does not: the receiver and its answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled: Option<String>,
    /// When the last pass ended (ms since the epoch; 0: none yet).
    pub pass_at_ms: u64,
}

/// Why and since when the store's writes fail.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WriteError {
    pub message: String,
    /// When the failure began (ms since the epoch).
    pub since_ms: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_status_round_trips_through_json() {
        let s = NodeStatus {
            version: "0.1.0".into(),
            supported_format: 3,
            store_format: 2,
            migrating_to: Some(3),
            migration: Some(MigrationProgress {
                from: 2,
                to: 3,
                steps: 4,
                rows: 2_000,
            }),
            tenants: 7,
            counters: Counters {
                pending: 1,
                ..Counters::default()
            },
            oldest_due_at_ms: None,
            write_error: Some(WriteError {
                message: "No space left on device".into(),
                since_ms: 5,
            }),
            cluster: Some(ClusterStatus {
                name: "hooks-0".into(),
                nodes: 3,
                tenants_owned: 4,
                tenants_registered: Some(10),
                tenant_slots: Some(12),
                leaving: true,
                handoff: Some(HandoffStatus {
                    tenants_leaving: 2,
                    rows_leaving: 30,
                    staged: 5,
                    hooks_moved: 100,
                    hooks_received: 0,
                    drained: false,
                    stalled: Some("hooks-1: timed out".into()),
                    pass_at_ms: 9,
                }),
            }),
            store_bytes: Some(1 << 30),
            volume_free_bytes: None,
            config: Some(ConfigStatus {
                loaded_at_ms: 9,
                reloads: 2,
                refused: Some(ReloadRefusal {
                    message: "invalid config: tenants.max: …".into(),
                    at_ms: 10,
                }),
            }),
            tenants_paused: Some(1),
            tenants_over_quota: Some(2),
            object_backups: Some(ObjectBackups {
                url: "s3://dr/hooks/hooks-0".into(),
                last: Some(ObjectBackup {
                    id: "b1".into(),
                    at_ms: 1,
                    store_format: 3,
                    files: 9,
                    bytes: 100,
                    uploaded_bytes: 10,
                    duration_ms: 5,
                }),
                pushes: 1,
                ..ObjectBackups::default()
            }),
        };
        let text = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<NodeStatus>(&text).unwrap(), s);
        // A status from a node that predates the migration field still parses.
        let old = text.replace(
            r#""migration":{"from":2,"to":3,"steps":4,"rows":2000},"#,
            "",
        );
        assert!(serde_json::from_str::<NodeStatus>(&old)
            .unwrap()
            .migration
            .is_none());
    }
}

/// What `ankusa-relay backup pull` / `backup offline` wrote, with `--report <file>` (or
/// `ANKUSA_BACKUP_REPORT`): the archive, and the destination volume's room once older
/// archives were pruned — what the operator's room check for the next backup on that
/// volume reads.
/// The room a restore leaves on its volume: it writes at most the free space less this
/// (`ankusa_store::tarball::UNPACK_MARGIN_BYTES`; a test keeps the two equal), and the
/// operator counts it before it plans one.
pub const UNPACK_MARGIN_BYTES: u64 = 64 << 20;

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct BackupRunReport {
    /// The archive written (`b<ms>.tar.zst`).
    pub archive: String,
    /// Its size.
    pub bytes: u64,
    /// Its store's format.
    pub store_format: u32,
    /// The destination volume's free space after the prune (`None`: the file system does
    /// not say).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_free_bytes: Option<u64>,
    /// The destination volume's size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_bytes: Option<u64>,
    /// The newest archive of each store format the destination holds after the prune,
    /// oldest format first: what a rollback to each format would restore.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub formats: Vec<ArchiveAtFormat>,
}

/// An archive in a backup directory, and what restoring it takes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct ArchiveAtFormat {
    pub store_format: u32,
    /// `b<ms>.tar.zst`.
    pub archive: String,
    /// Its size.
    pub bytes: u64,
    /// The store it unpacks to, as its check measured it (`None`: an archive written
    /// before that was recorded).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub store_bytes: Option<u64>,
}

/// What `ankusa-relay restore --replace --report <file>` found: the archive it restored, and the
/// replaced store against it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase")]
pub struct NodeRestoreReport {
    /// The archive restored (`b<ms>.tar.zst`).
    pub archive: String,
    /// The restored store's next hook seq.
    pub backup_seq: u64,
    /// The replaced store's next hook seq, when it could be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_seq: Option<u64>,
    /// The hooks only the replaced store held: acked after the backup (a seq past
    /// `backupSeq`) and not delivered and reclaimed before the restore. The restored store
    /// lacks them. (`replacedSeq - backupSeq` counts every hook acked after the backup,
    /// delivered or not.)
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_hooks: Option<u64>,
    /// Why the replaced store could not be read (or that there was none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replaced_unreadable: Option<String>,
}
