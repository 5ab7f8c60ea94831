//! The `Relay`'s `status`, written only by the operator: conditions that each carry the
//! generation they describe (so `kubectl wait --for=condition=Ready` never reads a stale
//! answer), the phase, the store format (the lowest over the nodes), what each node
//! reports at `/v1/node`, tenant totals, a bounded top-tenants list, the backups and
//! restores, and the upgrade cursor a restarted operator resumes from. Start at
//! [`RelayStatus`].

use serde::{Deserialize, Serialize};

/// The most entries `status.topTenants` holds.
pub const TOP_TENANTS_MAX: usize = 20;

/// What the operator observed, written only by the operator.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RelayStatus {
    /// The generation this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default)]
    pub conditions: Vec<Condition>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<Phase>,
    /// `ready/desired` nodes, for the printer column.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes_ready: Option<String>,
    /// The lowest store format over the nodes that answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // An int64 in the schema: the API server knows no `uint32` format and warns on it.
    #[schemars(with = "Option<i64>")]
    pub store_format: Option<u32>,
    /// The store format of the target image, once known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // An int64 in the schema: the API server knows no `uint32` format and warns on it.
    #[schemars(with = "Option<i64>")]
    pub target_format: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upgrade: Option<UpgradeStatus>,
    #[serde(default)]
    pub nodes: Vec<NodeReport>,
    /// The deliveries the nodes a scale-down takes out still hold (in flight included) and
    /// their staged batches, summed: 0 when no node is leaving. The StatefulSet shrinks
    /// once every leaving node reports itself drained.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub draining: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<TenantTotals>,
    /// The tenants with the most pending deliveries (at most 20).
    #[serde(default)]
    pub top_tenants: Vec<TopTenant>,
    /// When the last node backup of an upgrade finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_backup: Option<String>,
    /// A restore of the nodes from backups: a bootstrap, or a rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore: Option<RestoreStatus>,
    /// Scheduled backups (`spec.backup.schedule`): the run under way or the last one, and
    /// each node's last success.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduled_backups: Option<ScheduledBackups>,
    /// Each backup claim's room as its last backup Job reported it (free space after that
    /// Job pruned): the room check before a backup on it reads this, not the claim's
    /// capacity, which older archives share.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backup_claims: Vec<BackupClaimRoom>,
    /// Each node's archives on its backup claim, the newest of each store format, as its
    /// last backup Job reported them: what a rollback checks before it stops any node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claim_archives: Vec<NodeArchives>,
    /// The image every node ran when no upgrade was under way: what a StatefulSet that
    /// went missing is recreated with, so no pod starts a new release ungated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_image: Option<String>,
    /// The operator install that manages this Relay, `<namespace>/<lease>` (its leader
    /// election Lease): another install that watches it leaves it alone while that Lease is
    /// renewed, and takes it over once it has not been for a while (the install is gone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
}

/// A restore of the nodes from a backup set, the cursor a restarted operator resumes from.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// `Bootstrap` (a new Relay from backups), `Rollback` (`spec.upgrade.rollbackTo`) or `Node`
    /// (`spec.restoreNode`: one node from its backups).
    pub reason: String,
    /// `Stopping` (a rollback waits for the nodes to stop), `Restoring`, `Completed`,
    /// `Failed`, or `Cancelled` (its spec field was removed).
    pub phase: String,
    /// `<claim>/<relay>`: where the archives come from.
    pub source: String,
    /// The image the nodes start on once restored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The highest store format an archive may have (a rollback's release's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<i64>")]
    pub format: Option<u32>,
    /// The nodes it restores.
    pub replicas: i32,
    /// Nodes restored so far (ordinals below it).
    #[serde(default)]
    pub restored: i32,
    /// When it began (RFC 3339): its Jobs' names carry it.
    pub started: String,
    /// The `spec.upgrade.retry` value this restore has acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_seen: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A `Node` restore's node (`spec.restoreNode.ordinal`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<i32>,
    /// The `spec.restoreNode.request` it carried out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// What a `Node` restore's Job reported: the archive restored and, when the replaced
    /// store could be read, the hooks it had acked after that backup (which the restored
    /// store lacks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub report: Option<ankusa_api::node::NodeRestoreReport>,
}

/// Where scheduled backups stand.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScheduledBackups {
    /// The schedule this describes.
    pub schedule: String,
    /// When the operator first saw the schedule (RFC 3339): until a node's first success,
    /// its backup age counts from here.
    pub since: String,
    /// The time of the run under way, or of the last one (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run: Option<String>,
    /// The run is still backing nodes up.
    #[serde(default)]
    pub running: bool,
    /// The next time of the schedule (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_run: Option<String>,
    /// Seconds between runs, the longest gap around now (the alert fires at twice it).
    #[serde(default)]
    pub interval_seconds: i64,
    /// One entry per node.
    #[serde(default)]
    pub nodes: Vec<NodeBackup>,
}

/// A backup claim's room, as the last backup Job that wrote to it reported.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BackupClaimRoom {
    /// The claim.
    pub name: String,
    /// Its volume's free space after the Job's archive was written and older ones pruned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub free_bytes: Option<u64>,
    /// Its volume's size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size_bytes: Option<u64>,
    /// The Job that reported it.
    pub job: String,
    /// When that Job finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// A node's archives on its backup claim.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeArchives {
    /// The pod.
    pub name: String,
    /// The newest archive of each store format, oldest format first.
    #[serde(default)]
    pub formats: Vec<ankusa_api::node::ArchiveAtFormat>,
    /// The Job that reported them.
    pub job: String,
    /// When that Job finished (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<String>,
}

/// One node's scheduled backups.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeBackup {
    /// The pod.
    pub name: String,
    /// When its last scheduled backup succeeded (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_success: Option<String>,
    /// The Job of its last settled backup.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_job: Option<String>,
    /// Why its last backup failed, while it has not succeeded since.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_failure: Option<String>,
}

/// The `Relay` as a whole.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
pub enum Phase {
    /// Creating objects or waiting for nodes.
    Pending,
    /// Every node ready and answering.
    Running,
    /// A format upgrade is under way.
    Upgrading,
    /// Something needs attention; the conditions say what.
    Degraded,
}

/// A condition in the Kubernetes convention, with the generation it describes.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// `Ready`, `Progressing`, `BackupSucceeded`, `Upgrading`, `Degraded`, `ServiceMonitor`,
    /// `ScheduledBackups`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    #[serde(default)]
    pub message: String,
    /// RFC 3339.
    pub last_transition_time: String,
    pub observed_generation: i64,
}

/// The upgrade cursor: enough for a restarted operator to resume.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UpgradeStatus {
    pub phase: UpgradePhase,
    /// The image being rolled out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_image: Option<String>,
    /// Backup Jobs of this upgrade, one per node.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub backup_jobs: Vec<String>,
    /// The pod being moved now.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub current_pod: Option<String>,
    /// Pods on the target release with their migration finished.
    #[serde(default)]
    pub pods_migrated: i32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The `spec.upgrade.retry` value this cursor has acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_seen: Option<String>,
    /// The release every node ran when the upgrade began.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_image: Option<String>,
    /// The rolling-update partition the gate set last: pods at this ordinal and above run
    /// the target. The cursor, not the StatefulSet, is the truth (a StatefulSet can be
    /// deleted and recreated).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partition: Option<i32>,
    /// The nodes this upgrade covers: the StatefulSet's replicas are held here until it
    /// ends (a scale-up waits; a new pod would otherwise start the target unbacked).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replicas: Option<i32>,
    /// Ordinals at or above `replicas` whose volume claims outlived a scale-down: backed up
    /// (offline) before the first node moves, since a later scale-up starts the target on
    /// them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub retained_claims: Vec<i32>,
    /// When the current step began (RFC 3339), for its deadline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step_started: Option<String>,
    /// When this upgrade began (RFC 3339): its Jobs' names carry it, so a later upgrade to
    /// the same target never takes an earlier one's backup for its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub started: Option<String>,
    /// The phase a `Failed` upgrade stopped in (where a retry resumes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failed_in: Option<UpgradePhase>,
    /// The Relay was created over data claims an earlier one left, whose stores no node of
    /// it has opened: each is backed up offline (`retainedClaims`, `replicas: 0`) before
    /// the StatefulSet exists, since the image could migrate a store of an older format.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub adopting: bool,
}

#[derive(
    Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Default, schemars::JsonSchema,
)]
pub enum UpgradePhase {
    #[default]
    Idle,
    BackingUp,
    Rolling,
    Verifying,
    Completed,
    Blocked,
    Failed,
}

/// One node as the operator last saw it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeReport {
    /// The pod's name.
    pub name: String,
    /// The pod is Ready and its `/v1/node` answered.
    pub ready: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    // An int64 in the schema: the API server knows no `uint32` format and warns on it.
    #[schemars(with = "Option<i64>")]
    pub format: Option<u32>,
    #[serde(default)]
    pub migrating: bool,
    #[serde(default)]
    pub pending: i64,
    #[serde(default)]
    pub dead: i64,
    /// Tenants the node has taken hooks for as their owner since it started (each tenant
    /// of a Relay belongs to one node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants_owned: Option<i64>,
    /// Why the node is not reported ready (not scheduled, not Ready, did not answer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// A scale-down takes the node out: it hands its rows to the other nodes first.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
    /// Rows of tenants other nodes own that the node still holds (its last handoff pass),
    /// and the batches it staged and has not had confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rows_leaving: Option<i64>,
    /// The node's last backup in the object store (`spec.backup.objectStore`): its id and
    /// when its checkpoint was taken, every hook acked before it in the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_object_backup: Option<String>,
}

/// Tenant counts and queue totals summed over the nodes that answered.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, Default, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TenantTotals {
    /// Tenants the Relay holds, each counted once (its tenant registry's count; the sum of
    /// the nodes' tenant ordinals while the registry node does not answer).
    pub count: i64,
    /// `spec.tenants.max`, for the whole Relay.
    pub max: i64,
    pub pending: i64,
    pub scheduled: i64,
    pub inflight: i64,
    pub dead: i64,
    pub bytes: i64,
    /// Tenants whose deliveries are held (`POST /v1/tenants/{t}/pause`), summed over the
    /// nodes that hold them.
    #[serde(default)]
    pub paused: i64,
    /// Tenants a quota (`…/limits`) refused a hook of within the last 5 minutes.
    #[serde(default)]
    pub over_quota: i64,
}

/// A tenant with its backlog, summed over nodes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopTenant {
    pub tenant: String,
    pub pending: i64,
    #[serde(default)]
    pub dead: i64,
    /// When its oldest due row became due (RFC 3339): its backlog's age is now minus this.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_due_at: Option<String>,
    /// Its deliveries are held (`POST /v1/tenants/{t}/pause`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub paused: bool,
    /// Hooks its quotas refused since the nodes started.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub quota_refusals: i64,
}

fn is_zero(n: &i64) -> bool {
    *n == 0
}
