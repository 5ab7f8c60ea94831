//! The admin API's bodies (`/v1/…` on the admin listener): what each call takes and
//! answers, for the node that serves them, the command line and the console that read
//! them, and the relay-wide merge of several nodes' answers ([`crate::merge`]).
//!
//! Sections follow the API's resources: tenants, the dead-letter queue, hooks, the
//! archive, the quarantine, the audit log, sources, limits, the portal, backups, erasing.

use std::collections::BTreeMap;

use serde::{Deserialize, Deserializer, Serialize};

use crate::node::Counters;

fn is_zero(n: &u64) -> bool {
    *n == 0
}

// ---------------------------------------------------------------------------------------
// What several bodies embed.

/// What a hook-log event was.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum EventKind {
    Attempt,
    Replayed,
    Recovered,
    /// A pull consumer leased the delivery (its attempt starts).
    Claimed,
    /// The consumer acknowledged it: delivered.
    Acked,
    /// The consumer gave it back: retried or dead-lettered.
    Nacked,
    /// Its lease ran out: retried or dead-lettered.
    Expired,
    /// An operator's purge removed the delivery (`DELETE /v1/tenants/{t}/queue`).
    Purged,
}

/// How an attempt ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum AttemptOutcome {
    Delivered,
    Retry,
    Dead,
}

/// Why an attempt failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// No response within the sink's timeout.
    Timeout,
    /// No connection, or it broke before an answer.
    Connection,
    /// The sink answered with a status that is not 2xx.
    Status,
    /// The request could not be built (a header value of the sink's config).
    Request,
    /// The hook's sink is no longer in the configuration.
    Unconfigured,
    /// A pull consumer gave the delivery back (`nack`).
    Nacked,
    /// A pull consumer's lease ran out before an ack.
    LeaseExpired,
    /// A tenant endpoint's address is one the node does not deliver to (private,
    /// loopback, link-local…: `endpoints.allow_private` is off).
    AddressRefused,
}

/// Where a delivery is now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum DeliveryState {
    /// Waiting for its first attempt (or for the one after a replay or a recovery).
    Pending,
    /// Waiting out a retry backoff.
    Scheduled,
    /// Being attempted now.
    Inflight,
    Delivered,
    Dead,
    /// Owed, but its due time is not in the log (a row from before the log, or imported).
    Queued,
    /// An operator's purge removed it (the log's last event for it).
    Purged,
    /// Nothing is owed and the last attempt did not deliver it: dropped (its sink left the
    /// configuration), or purged before the log recorded purges.
    Gone,
}

/// A source's waiting work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SourceBacklog {
    pub pending: i64,
    pub scheduled: i64,
    pub inflight: i64,
    pub bytes: i64,
    /// Due and inflight rows read to count these.
    pub rows_read: u64,
    /// False if the read stopped at its limit: the counts are a lower bound.
    pub exact: bool,
}

/// One audit row.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditRecord {
    pub seq: u64,
    pub at_ms: u64,
    /// The token's name.
    pub who: String,
    /// What was done, e.g. `purge`, `replay`, `quarantine.delete`.
    pub action: String,
    /// The tenant it concerned, if one.
    pub tenant: Option<String>,
    /// What the call named and did: free-form, by action.
    pub detail: serde_json::Value,
}

/// A tenant's quotas (`tenants.limits`, or a tenant's own over them): a key absent, no
/// limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default)]
pub struct Limits {
    /// Hooks a second (a token bucket refilled at this rate).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingest_per_second: Option<f64>,
    /// The bucket's size.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ingest_burst: Option<u32>,
    /// Queued bytes at which its hooks are refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queued_bytes: Option<u64>,
    /// Archived bytes at which its next hooks are not archived.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub archive_bytes: Option<u64>,
}

/// One tenant's own limits, over the defaults: a key absent keeps the default, `null`
/// lifts it. The body of `PUT /v1/tenants/{t}/limits`, and what the node keeps.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Overrides {
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<f64>)]
    pub ingest_per_second: Option<Option<f64>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u32>)]
    pub ingest_burst: Option<Option<u32>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u64>)]
    pub queued_bytes: Option<Option<u64>>,
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    #[schema(value_type = Option<u64>)]
    pub archive_bytes: Option<Option<u64>>,
}

impl Overrides {
    /// No key set: the tenant runs under the defaults.
    pub fn is_empty(&self) -> bool {
        *self == Overrides::default()
    }
}

/// A key that is there, `null` included (`Some(None)`); an absent key is the field's
/// default (`None`).
pub(crate) fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    Option::<T>::deserialize(d).map(Some)
}

// ---------------------------------------------------------------------------------------
// The archive.

/// One archived hook.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ArchivedItem {
    pub id: String,
    pub tenant: String,
    pub source: String,
    pub received_ms: u64,
    pub expires_ms: u64,
    pub size: u64,
    pub content_type: String,
    pub sinks: Vec<String>,
    pub headers: BTreeMap<String, String>,
    /// With `body=true`, a UTF-8 body.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// With `body=true`, a body that is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

/// `GET /v1/archive`: a page of archived hooks.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ArchivePage {
    pub items: Vec<ArchivedItem>,
    /// `<received_ms>.<seq>`: pass as `before` for the next page.
    pub next: Option<String>,
}

/// `POST /v1/archive/replay`: hooks committed again.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Replayed {
    pub replayed: u64,
    /// Why the replay stopped before the end of what it matched: `tenant_rate_limited`
    /// (the tenant's `ingest_per_second`: go on after `retry_after_s`) or
    /// `tenant_backlog_full` (its `queued_bytes`). Absent: it went to the end (or `limit`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stopped: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after_s: Option<u32>,
    /// With `stopped`: pass as `after` to go on where it stopped.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ArchiveReplayRequest {
    pub tenant: String,
    pub from_ms: Option<u64>,
    pub to_ms: Option<u64>,
    /// Only these hook ids.
    #[serde(default)]
    pub ids: Vec<String>,
    pub limit: Option<usize>,
    /// `<received_ms>.<seq>` (a stopped replay's `next`): only the hooks after it.
    pub after: Option<String>,
}

// ---------------------------------------------------------------------------------------
// Sources.

/// `GET /v1/sources/{id}`: a source's settings and its backlog.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SourceView {
    pub id: String,
    /// The tenant the source pins (`default` without a tenant setting); null: shared.
    pub tenant: Option<String>,
    /// The verification scheme.
    pub verify: Option<String>,
    pub route: String,
    pub sinks: Vec<String>,
    pub forward_headers: Vec<String>,
    pub backlog: SourceBacklog,
    /// A Relay of several nodes: the nodes that gave no answer (their rows are not counted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// Hooks.

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EventOut {
    pub kind: EventKind,
    pub at_ms: u64,
    pub attempt: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<AttemptOutcome>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_class: Option<ErrorClass>,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
    /// The retry's due time, a replay's or a recovery's; for a `dead` outcome, when it
    /// was dead-lettered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_at_ms: Option<u64>,
}

impl EventOut {
    /// When the event made the delivery due again: none for a dead-lettering, whose
    /// `next_at_ms` is the time it went to the DLQ, not an attempt to come.
    pub fn next_attempt_ms(&self) -> Option<u64> {
        match self.outcome {
            Some(AttemptOutcome::Dead) => None,
            _ => self.next_at_ms,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SinkOut {
    pub sink: String,
    pub index: u16,
    pub state: DeliveryState,
    pub attempts: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub next_attempt_ms: Option<u64>,
    pub events: Vec<EventOut>,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HookOut {
    pub id: String,
    pub tenant: String,
    pub source: String,
    pub received_ms: u64,
    pub size: u32,
    pub content_type: String,
    /// The provider's headers its source forwards to sinks.
    pub headers: BTreeMap<String, String>,
    /// The hook is still stored: its body can be read (`?body=true`).
    pub stored: bool,
    /// No sink of its route took it (every one's filter left it out): it is never
    /// delivered, and its body is kept only for an archive obligation.
    #[serde(default)]
    pub filtered: bool,
    /// Its tenant is paused on this node since then (ms since the epoch): its queued
    /// deliveries wait for `…/resume`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_paused_since_ms: Option<u64>,
    pub sinks: Vec<SinkOut>,
    /// The body as text, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
    /// The body in base64, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub body_base64: Option<String>,
}

/// One hook of a listing.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HookSummary {
    pub id: String,
    pub tenant: String,
    pub source: String,
    pub received_ms: u64,
    pub size: u32,
    pub sinks: Vec<String>,
}

/// `GET /v1/hooks`: the newest hooks.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RecentHooks {
    pub items: Vec<HookSummary>,
    /// The span read ran out before the log did: older hooks of the tenant may exist.
    pub truncated: bool,
}

// ---------------------------------------------------------------------------------------
// The quarantine.

/// One quarantined request.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QuarantineItem {
    pub id: u64,
    pub source: String,
    pub at_ms: u64,
    /// Why verification failed, as the 401 and `ankusa_ingest_verification_failures_total`
    /// say it: `missing_header`, `malformed_header`, `stale_timestamp`, `bad_signature`.
    pub reason: String,
    /// The same in words (`missing header x-hub-signature-256`).
    #[serde(default)]
    pub detail: String,
    /// The tenant the request named (unverified), when it named one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// `[name, value]` pairs as received.
    pub headers: Vec<(String, String)>,
    /// The first 1 024 characters of the body's base64.
    pub body_base64_preview: String,
}

/// `GET /v1/quarantine`: a page of quarantined requests.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QuarantinePage {
    pub items: Vec<QuarantineItem>,
    /// Pass as `before` for the next page.
    pub next: Option<u64>,
}

/// `DELETE /v1/quarantine`: how many entries went.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Deleted {
    pub deleted: u64,
}

/// `POST /v1/quarantine/replay`: which quarantined requests to verify again (with the
/// source's secrets of now) and ingest when they pass. Every field narrows; none at all
/// picks every request in the token's scope.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(default, deny_unknown_fields)]
pub struct QuarantineReplayRequest {
    /// Only these ids (as `GET /v1/quarantine` gives them).
    pub ids: Vec<u64>,
    /// Only this source's requests.
    pub source: Option<String>,
    /// Only requests that failed for this reason code (`bad_signature`, …).
    pub reason: Option<String>,
    /// Only requests received at or after this time (ms since the epoch).
    pub from_ms: Option<u64>,
    /// Only requests received before this time.
    pub to_ms: Option<u64>,
    /// The most requests this call sends again (default and ceiling 1 000).
    pub limit: Option<usize>,
    /// Count what the selection matches; send nothing again.
    pub dry_run: bool,
}

/// What a replay of the quarantine did.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QuarantineReplayed {
    /// Requests the selection matched.
    pub matched: u64,
    /// Verified and committed as new hooks: gone from the quarantine.
    pub ingested: u64,
    /// Verified, and seen within the dedupe window already: gone from the quarantine.
    pub duplicates: u64,
    /// Still failing verification: kept.
    pub still_failing: u64,
    /// Verified but not taken now (a quota, the node not ready, the source gone): kept.
    pub refused: u64,
    /// The first 100 requests sent again, with what each came to.
    pub results: Vec<QuarantineReplayResult>,
    /// A Relay of several nodes: the nodes that gave no answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

/// One quarantined request sent again.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct QuarantineReplayResult {
    pub id: u64,
    /// `ingested`, `duplicate`, `still_failing` or `refused`.
    pub outcome: String,
    /// The hook's id, when it was ingested.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hook_id: Option<String>,
    /// Why it still fails (a reason code), or why it was refused.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub why: String,
}

// ---------------------------------------------------------------------------------------
// The audit log.

/// `GET /v1/audit`: a page of audit rows.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditPage {
    pub items: Vec<AuditRecord>,
    /// Pass as `before` for the next page.
    pub next: Option<u64>,
}

// ---------------------------------------------------------------------------------------
// The dead-letter queue.

/// One dead row.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DlqItem {
    /// `<at_ms>.<seq>.<sink_index>`; relay-wide, `<node>/<id>`.
    pub id: String,
    pub tenant: String,
    pub at_ms: u64,
    pub hook_id: String,
    pub source: String,
    /// The sink's id.
    pub sink: String,
    /// Its position in the hook's fan-out list.
    pub sink_index: u16,
    pub size: u32,
    pub attempts: u32,
    pub last_attempt_ms: u64,
    /// HTTP status of the last attempt (0: no response).
    pub last_status: u16,
    pub last_error: String,
    /// A Relay of several nodes: the node that holds the row.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
}

/// `GET /v1/dlq`: a page of dead rows.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct DlqPage {
    pub items: Vec<DlqItem>,
    /// Pass as `before` for the next page.
    pub next: Option<String>,
    /// A Relay of several nodes: the nodes that gave no answer (their rows are missing).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

/// `POST /v1/dlq/replay`: how many rows were revived.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Revived {
    /// Rows this call moved from the DLQ to due.
    pub revived: u64,
    /// Rows the call's selection matched (with `dry_run`: what a replay would move).
    #[serde(default)]
    pub matched: u64,
    /// A Relay of several nodes: the nodes that gave no answer.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayRequest {
    #[serde(default)]
    pub ids: Vec<String>,
    pub tenant: Option<String>,
    pub source: Option<String>,
    pub from_ms: Option<u64>,
    pub to_ms: Option<u64>,
    pub limit: Option<usize>,
    /// Count the rows the selection matches and move none (what a confirmation shows).
    #[serde(default)]
    pub dry_run: bool,
}

// ---------------------------------------------------------------------------------------
// Backups.

/// `POST /v1/backups`: the backup taken.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct BackupCreated {
    pub id: String,
    /// The archive's size.
    pub bytes: u64,
    /// The store format the backup holds.
    pub store_format: u32,
}

// ---------------------------------------------------------------------------------------
// The tenant portal.

#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PortalRequest {
    /// The tenant the link shows (it must exist).
    pub tenant: String,
    /// How long the link lives, in milliseconds (default 24 h, at most
    /// `admin.console.portal_max_ttl_ms`).
    pub ttl_ms: Option<u64>,
}

/// A portal link.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PortalLink {
    pub tenant: String,
    /// The console's path for it, on any node's admin listener with the same
    /// `portal_secret`: `/ui/portal/<credential>/`.
    pub path: String,
    /// The credential itself: also a bearer token of the admin API with the tenant's
    /// scope, until it expires.
    pub credential: String,
    pub expires_ms: u64,
}

// ---------------------------------------------------------------------------------------
// Tenant limits.

/// A tenant's limits.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LimitsView {
    pub tenant: String,
    /// What the tenant runs under: its own limits over the defaults. A key absent: no
    /// limit.
    pub effective: Limits,
    /// Every tenant's (`tenants.limits`).
    pub defaults: Limits,
    /// Its own, over the defaults: a key absent keeps the default, `null` lifts it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub overrides: Option<Overrides>,
    /// Hooks a quota refused on this node since it started.
    pub refused: u64,
    /// When the last was refused (ms since the epoch).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_refused_ms: Option<u64>,
    /// A change: the nodes it changed (0: they were so already; relay-wide, summed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub changed: Option<u64>,
    /// A Relay of several nodes: the nodes that gave no answer (their limits are as they
    /// were).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// Erasing a tenant.

/// `DELETE /v1/tenants/{t}?confirm={t}`: the erase under way.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct EraseState {
    pub tenant: String,
    pub erasing: bool,
    /// When the erase began (ms since the epoch).
    pub since_ms: u64,
    /// Nodes this call began an erase on (0: it ran already; relay-wide, summed).
    pub changed: u64,
    /// A Relay of several nodes: the nodes that gave no answer (the tenant's rows there
    /// stay: call again).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

// ---------------------------------------------------------------------------------------
// Tenants.

/// `GET /v1/tenants/{t}`: a tenant's counters.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantView {
    pub tenant: String,
    /// Its ordinal on the node that answered (absent from a relay-wide merge).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ord: Option<u32>,
    pub counters: Counters,
    /// Paused since (ms since the epoch): its deliveries are held (`…/resume` ends it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_since_ms: Option<u64>,
    /// Being erased since (ms since the epoch): its hooks are refused, its rows going
    /// (`DELETE /v1/tenants/{t}`); the tenant is 404 once the erase ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub erasing_since_ms: Option<u64>,
    /// When its oldest due row became due (ms since the epoch): how long its backlog has
    /// waited. A paused tenant's grows.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oldest_due_at_ms: Option<u64>,
    /// Hooks its quotas refused since the node started (`…/limits`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub quota_refusals: u64,
    /// A Relay of several nodes: the nodes that gave no answer (their rows are not counted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

/// `GET /v1/tenants`: the tenants with the most pending work.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TenantsTop {
    pub tenants: Vec<TenantView>,
    /// Tenants this node holds (relay-wide: the sum of the nodes' `registered`).
    pub total: u64,
    /// A Relay of several nodes: tenants this node owns.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owned: Option<u64>,
    /// A Relay of several nodes: tenants this node's registry counts (those its store
    /// holds and those it admitted since it started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registered: Option<u64>,
    /// A listing by `prefix`: the `after` of its next page (absent on the last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next: Option<String>,
    /// Relay-wide (always there): each node's own `total` and `owned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodes: Option<Vec<NodeTenants>>,
    /// Relay-wide (always there): the nodes that gave no answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unavailable: Option<Vec<String>>,
}

/// One node's part of a relay-wide `GET /v1/tenants`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
pub struct NodeTenants {
    pub node: String,
    pub total: Option<u64>,
    pub owned: Option<u64>,
}

/// `DELETE /v1/tenants/{t}/queue`: the rows removed.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PurgeReport {
    pub tenant: String,
    pub due: u64,
    pub dead: u64,
    /// Synced batches written.
    pub batches: u64,
    /// A Relay of several nodes: the nodes that gave no answer (their rows are left).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

/// `POST /v1/tenants/{t}/retry`: which of the tenant's waiting rows to make due now.
#[derive(Debug, Clone, Default, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RetryRequest {
    /// Only deliveries to this sink (its id).
    pub sink: Option<String>,
    /// Only this hook's deliveries (found through the hook log).
    pub hook_id: Option<String>,
    /// At most this many rows (default and ceiling 10 000).
    pub limit: Option<usize>,
}

/// The rows a retry now moved.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Retried {
    pub tenant: String,
    /// Rows made due now.
    pub retried: u64,
    /// More rows matched than one call moves: call again.
    pub more: bool,
    /// A Relay of several nodes: the nodes that gave no answer (their rows still wait).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}

/// `POST /v1/tenants/{t}/pause` and `…/resume`: the tenant's state after the call.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PauseState {
    pub tenant: String,
    pub paused: bool,
    /// Nodes whose state the call changed (0: it was so already; relay-wide, summed).
    pub changed: u64,
    /// A resume: the active markers put back, one per second its due rows are in.
    pub markers: u64,
    /// A Relay of several nodes: the nodes that gave no answer (their rows are not held).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unavailable: Vec<String>,
}
