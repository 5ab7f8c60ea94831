//! The node's configuration: one YAML file, every key overridable from the environment.
//!
//! - Unknown keys are errors (`deny_unknown_fields`), so a typo never silently falls back
//!   to a default.
//! - Defaults live in one place: the `Default` impls below (and `docs/configuration.md`
//!   has one row per key).
//! - Environment overrides: `ANKUSA_<PATH>` where the path's segments are joined by a
//!   double underscore, e.g. `ANKUSA_TENANTS__MAX=5000` sets `tenants.max`, and
//!   `ANKUSA_DATA_DIR=/var/lib/ankusa` sets `data_dir`. The value is parsed as a YAML
//!   scalar.
//! - [`Config::validate`] checks ranges and cross-field rules with messages that name the
//!   key.

pub mod listen;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid config: {0}")]
    Parse(String),
    #[error("invalid config: {key}: {message}")]
    Invalid { key: String, message: String },
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        message: message.into(),
    }
}

/// `value` must lie in `range`. The range is written once, here in the check, and the
/// message is made from it: `{value} is outside {lo}..={hi}`.
fn in_range<T: PartialOrd + std::fmt::Display>(
    key: &str,
    value: T,
    range: std::ops::RangeInclusive<T>,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("{value} is outside {}..={}", range.start(), range.end()),
        ))
    }
}

/// `value` must be positive.
fn positive<T: PartialOrd + Default>(key: &str, value: T) -> Result<(), ConfigError> {
    if value > T::default() {
        Ok(())
    } else {
        Err(invalid(key, "must be positive"))
    }
}

/// `value` must be at least `min`.
fn at_least<T: PartialOrd + std::fmt::Display>(
    key: &str,
    value: T,
    min: T,
) -> Result<(), ConfigError> {
    if value >= min {
        Ok(())
    } else {
        Err(invalid(key, format!("{value} is less than {min}")))
    }
}

impl AdminConfig {
    /// The admin section's numbers (its tokens are checked with the secrets).
    fn validate_scalars(&self) -> Result<(), ConfigError> {
        in_range(
            "admin.gauge_interval_ms",
            self.gauge_interval_ms,
            100..=3_600_000,
        )?;
        in_range("admin.backup_keep", self.backup_keep, 1..=100)?;
        in_range("admin.max_page", self.max_page, 1..=100_000)
    }
}

impl IngestConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        in_range(
            "ingest.body_limit_bytes",
            self.body_limit_bytes,
            1..=256 << 20,
        )
    }
}

impl WriterConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        in_range("writer.queue_capacity", self.queue_capacity, 1..=1_000_000)?;
        in_range("writer.max_batch_hooks", self.max_batch_hooks, 1..=65_536)?;
        at_least("writer.max_batch_bytes", self.max_batch_bytes, 1024)?;
        in_range(
            "writer.max_batch_delay_us",
            self.max_batch_delay_us,
            0..=1_000_000,
        )?;
        in_range(
            "writer.max_batch_gap_us",
            self.max_batch_gap_us,
            0..=1_000_000,
        )?;
        in_range(
            "writer.exit_when_stuck_ms",
            self.exit_when_stuck_ms,
            0..=3_600_000,
        )
    }
}

impl DedupeConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        positive("dedupe.window_ms", self.window_ms)?;
        positive("dedupe.sweep_batch", self.sweep_batch)
    }
}

impl DispatchConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        in_range(
            "dispatch.tick_interval_ms",
            self.tick_interval_ms,
            1..=60_000,
        )?;
        in_range("dispatch.max_inflight", self.max_inflight, 1..=100_000)?;
        in_range(
            "dispatch.per_sink_inflight",
            self.per_sink_inflight,
            1..=100_000,
        )?;
        in_range(
            "dispatch.tenant_max_inflight",
            self.tenant_max_inflight,
            1..=100_000,
        )?;
        if let Some((t, w)) = self
            .tenant_weights
            .iter()
            .find(|(t, w)| t.is_empty() || !(1..=1_000).contains(*w))
        {
            return Err(invalid(
                "dispatch.tenant_weights",
                format!("{t:?}: {w} (a tenant id and a weight in 1..=1000)"),
            ));
        }
        positive("dispatch.rows_per_tenant", self.rows_per_tenant)?;
        positive("dispatch.bytes_per_tick", self.bytes_per_tick)?;
        in_range(
            "dispatch.tenants_per_tick",
            self.tenants_per_tick,
            1..=100_000,
        )
    }
}

impl RetryConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.schedule_ms.is_empty() {
            return Err(invalid("retry.schedule_ms", "must name at least one delay"));
        }
        in_range("retry.max_attempts", self.max_attempts, 1..=1_000)
    }
}

impl ReclaimConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        positive("reclaim.interval_ms", self.interval_ms)?;
        positive("reclaim.batch", self.batch)
    }
}

impl HookLogConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        positive("hook_log.retention_ms", self.retention_ms)?;
        positive("hook_log.max_hooks", self.max_hooks)?;
        positive("hook_log.prune_interval_ms", self.prune_interval_ms)?;
        positive("hook_log.prune_batch", self.prune_batch)
    }
}

impl ShutdownConfig {
    fn validate(&self) -> Result<(), ConfigError> {
        in_range("shutdown.grace_ms", self.grace_ms, 0..=600_000)
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the store lives.
    pub data_dir: PathBuf,
    pub ingest: IngestConfig,
    pub admin: AdminConfig,
    pub tenants: TenantsConfig,
    pub writer: WriterConfig,
    pub dedupe: DedupeConfig,
    pub quarantine: QuarantineConfig,
    pub dispatch: DispatchConfig,
    pub retry: RetryConfig,
    pub reclaim: ReclaimConfig,
    pub hook_log: HookLogConfig,
    pub archive: ArchiveConfig,
    pub shutdown: ShutdownConfig,
    pub cluster: ClusterConfig,
    pub sources: Vec<SourceConfig>,
    pub sinks: Vec<SinkConfig>,
    pub routes: Vec<RouteConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./data"),
            ingest: IngestConfig::default(),
            admin: AdminConfig::default(),
            tenants: TenantsConfig::default(),
            writer: WriterConfig::default(),
            dedupe: DedupeConfig::default(),
            quarantine: QuarantineConfig::default(),
            dispatch: DispatchConfig::default(),
            retry: RetryConfig::default(),
            reclaim: ReclaimConfig::default(),
            hook_log: HookLogConfig::default(),
            archive: ArchiveConfig::default(),
            shutdown: ShutdownConfig::default(),
            cluster: ClusterConfig::default(),
            sources: Vec::new(),
            sinks: Vec::new(),
            routes: Vec::new(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// The ingest listener: `POST /ingest/{source}`, `/healthz`, `/readyz`.
    pub listen: SocketAddr,
    /// Largest accepted body, unless a source sets its own.
    pub body_limit_bytes: usize,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            listen: SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 8080)),
            body_limit_bytes: 1 << 20,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The admin listener: health, readiness, node status, metrics, the admin API.
    pub listen: SocketAddr,
    /// How often the queue gauges are read, in milliseconds.
    pub gauge_interval_ms: u64,
    /// Bearer tokens of the admin API.
    pub tokens: Vec<TokenConfig>,
    /// How long audit rows are kept.
    pub audit_retention_ms: u64,
    /// Largest page an admin listing returns.
    pub max_page: usize,
    /// Where `POST /v1/backups` writes its archives (default: `<data_dir>.backups`). They
    /// are staging for a puller: a backup on the node's own disk is not a backup.
    pub backup_dir: Option<PathBuf>,
    /// Backup archives kept in `backup_dir`; older ones are deleted.
    pub backup_keep: usize,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 9090)),
            gauge_interval_ms: 15_000,
            tokens: Vec::new(),
            audit_retention_ms: 30 * 86_400_000,
            max_page: 1_000,
            backup_dir: None,
            backup_keep: 2,
        }
    }
}

/// An admin API token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TokenConfig {
    /// Who the token is (written to the audit trail).
    pub name: String,
    pub secret: SecretSource,
    pub scope: ScopeConfig,
}

/// What a token may see and change.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum ScopeConfig {
    /// Everything.
    Admin,
    /// Only these tenants; every other tenant looks absent.
    Tenants(Vec<String>),
    /// Taking and fetching backups (`/v1/backups*`), nothing else: the token the
    /// operator's backup Jobs hold.
    Backup,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TenantsConfig {
    /// The most tenants this node will hold (ordinals are never reused).
    pub max: u32,
}

impl Default for TenantsConfig {
    fn default() -> Self {
        TenantsConfig { max: 1_000_000 }
    }
}

/// The group-commit writer's limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct WriterConfig {
    /// Requests that may wait for the writer; past it ingest answers `unavailable`.
    pub queue_capacity: usize,
    /// Most hooks in one commit batch.
    pub max_batch_hooks: usize,
    /// Most body bytes in one commit batch.
    pub max_batch_bytes: usize,
    /// How long the writer waits, after the first request of a batch, for more.
    pub max_batch_delay_us: u64,
    /// The writer stops waiting for more as soon as none has come for this long: a batch
    /// gathers while requests keep arriving, and a lone request does not sit out the
    /// whole `max_batch_delay_us`.
    pub max_batch_gap_us: u64,
    /// Write the next batch while the last one's WAL sync runs (a second thread syncs and
    /// acks); off (the default), the writer syncs each batch itself before it takes the
    /// next. Off by default: with it on, a failed WAL sync makes the store stuck (and the
    /// node exit, `exit_when_stuck_ms`) more often (docs/architecture.md).
    pub pipeline: bool,
    /// When the store's writes have failed for this long with an error RocksDB does not
    /// resume from by itself (anything but a lack of space), the node exits with code 75
    /// at once, as a crash would, so that its supervisor restarts it and the restart's
    /// open replays the WAL. `0`: never; the node stays up and not ready.
    pub exit_when_stuck_ms: u64,
}

impl Default for WriterConfig {
    fn default() -> Self {
        WriterConfig {
            queue_capacity: 8192,
            max_batch_hooks: 512,
            max_batch_bytes: 8 << 20,
            max_batch_delay_us: 500,
            max_batch_gap_us: 50,
            pipeline: false,
            exit_when_stuck_ms: 5_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DedupeConfig {
    /// How long an idempotency key is remembered.
    pub window_ms: u64,
    /// Most expired dedupe keys removed per sweep.
    pub sweep_batch: usize,
    /// How often the writer sweeps expired dedupe keys when idle.
    pub sweep_interval_ms: u64,
}

impl Default for DedupeConfig {
    fn default() -> Self {
        DedupeConfig {
            window_ms: 24 * 3_600_000,
            sweep_batch: 1_000,
            sweep_interval_ms: 1_000,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct QuarantineConfig {
    /// Most quarantined requests kept; past it new ones are counted and dropped.
    pub max_entries: u64,
    /// Most bytes of quarantined requests kept.
    pub max_bytes: u64,
}

impl Default for QuarantineConfig {
    fn default() -> Self {
        QuarantineConfig {
            max_entries: 10_000,
            max_bytes: 64 << 20,
        }
    }
}

/// The dispatch pipeline's limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchConfig {
    /// How often the pipeline ticks when the last tick had nothing (or little) to do.
    pub tick_interval_ms: u64,
    /// Deliveries in flight across all sinks (the claim budget).
    pub max_inflight: usize,
    /// Deliveries in flight to one sink, unless the sink sets its own.
    pub per_sink_inflight: usize,
    /// Deliveries in flight for one tenant: a tenant's backlog holds at most this many of
    /// the node's delivery slots.
    pub tenant_max_inflight: usize,
    /// Rows per turn of the claim round robin, by tenant id (default 1): a tenant of
    /// weight 3 gets three rows for every one of a tenant of weight 1 when both wait.
    pub tenant_weights: std::collections::BTreeMap<String, u32>,
    /// Rows claimed from one tenant per tick.
    pub rows_per_tenant: usize,
    /// Bytes claimed per tick.
    pub bytes_per_tick: u64,
    /// Tenants one read of a tick visits; a read of more tenants goes on in the next tick.
    pub tenants_per_tick: usize,
    /// Start a fresh hook's deliveries at its ingest commit (written inflight, no tick)
    /// while the pipeline has caught up and their slots are free; off, every delivery is
    /// written due and claimed by a tick.
    pub start_at_commit: bool,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            tick_interval_ms: 100,
            max_inflight: 512,
            per_sink_inflight: 128,
            tenant_max_inflight: 128,
            tenant_weights: Default::default(),
            rows_per_tenant: 256,
            bytes_per_tick: 16 << 20,
            tenants_per_tick: 128,
            start_at_commit: true,
        }
    }
}

/// How jitter is applied to the retry schedule.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum Jitter {
    /// A delay drawn uniformly from `[0, step]` (AWS "full jitter").
    #[default]
    Full,
    /// Exactly the step.
    None,
}

/// The retry schedule.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct RetryConfig {
    /// Delay before retry n (1-based) is `schedule_ms[n-1]`; past the end, the last step.
    pub schedule_ms: Vec<u64>,
    /// Attempts before a delivery is dead-lettered.
    pub max_attempts: u32,
    pub jitter: Jitter,
    /// The longest `Retry-After` a sink may ask for; longer asks are cut to it.
    pub max_retry_after_ms: u64,
}

impl Default for RetryConfig {
    fn default() -> Self {
        RetryConfig {
            schedule_ms: vec![
                5_000, 30_000, 120_000, 600_000, 1_800_000, 3_600_000, 7_200_000, 14_400_000,
            ],
            max_attempts: 10,
            jitter: Jitter::Full,
            max_retry_after_ms: 86_400_000,
        }
    }
}

/// Reclaim: removing hooks nothing needs any more.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ReclaimConfig {
    pub interval_ms: u64,
    /// Cleared markers looked at per pass.
    pub batch: usize,
}

impl Default for ReclaimConfig {
    fn default() -> Self {
        ReclaimConfig {
            interval_ms: 1_000,
            batch: 1_000,
        }
    }
}

/// The hook log: each hook's record (no body) and its deliveries' attempts, kept after
/// the hook is delivered and reclaimed, for `GET /v1/hooks/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct HookLogConfig {
    pub enabled: bool,
    /// Hooks older than this leave the log.
    pub retention_ms: u64,
    /// The log's ceiling: past it, the oldest hooks leave first.
    pub max_hooks: u64,
    pub prune_interval_ms: u64,
    /// Hooks looked at per prune pass.
    pub prune_batch: usize,
}

impl Default for HookLogConfig {
    fn default() -> Self {
        HookLogConfig {
            enabled: true,
            retention_ms: 259_200_000,
            max_hooks: 10_000_000,
            prune_interval_ms: 1_000,
            prune_batch: 10_000,
        }
    }
}

/// The archive: hooks of archived sources or routes kept, bodies and all, for their
/// retention after delivery (`sources[].archive`, `routes[].archive` choose what).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ArchiveConfig {
    /// How long an archived hook is kept, unless its source or route says otherwise.
    pub retention_ms: u64,
    pub settle_interval_ms: u64,
    /// Obligations settled per pass (passes run back to back while full).
    pub settle_batch: usize,
    /// Expired hooks removed per pass.
    pub prune_batch: usize,
}

impl Default for ArchiveConfig {
    fn default() -> Self {
        ArchiveConfig {
            retention_ms: 2_592_000_000,
            settle_interval_ms: 1_000,
            settle_batch: 1_000,
            prune_batch: 1_000,
        }
    }
}

/// A source's or route's archive setting: `archive: {enabled: true, retention_ms: …}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ArchiveSetting {
    #[serde(default = "default_true")]
    pub enabled: bool,
    /// Absent: `archive.retention_ms`.
    #[serde(default)]
    pub retention_ms: Option<u64>,
}

/// A graceful stop (SIGTERM): readiness fails, ingest and claiming stop, deliveries in
/// flight get up to `grace_ms` to finish and have their outcomes committed; rows still in
/// flight then go back to due (synced) and the node exits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ShutdownConfig {
    pub grace_ms: u64,
}

impl Default for ShutdownConfig {
    fn default() -> Self {
        ShutdownConfig { grace_ms: 20_000 }
    }
}

/// The nodes of one Relay: each tenant belongs to one of them (rendezvous hashing of the
/// tenant id over the node names), and a node forwards a hook for a tenant it does not own
/// to the owner. No nodes (the default) or one: this node owns every tenant.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This node's name in `nodes` (the operator sets it from the pod name through
    /// `ANKUSA_CLUSTER__NAME`).
    pub name: Option<String>,
    /// Every node of the Relay. The first one keeps the Relay's tenant registry
    /// (`tenants.max` counts tenants relay-wide).
    pub nodes: Vec<ClusterNode>,
    /// The secret the nodes show each other (at least 16 bytes; required with two nodes
    /// or more).
    pub token: Option<SecretSource>,
    /// How long a node waits for another's answer (a forwarded hook, an admin call).
    pub forward_timeout_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            name: None,
            nodes: Vec::new(),
            token: None,
            forward_timeout_ms: 10_000,
        }
    }
}

/// One node of a Relay.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterNode {
    /// Its stable name (a StatefulSet pod name).
    pub name: String,
    /// Its ingest listener, `http://host:port` (a path, if any, is a prefix).
    pub ingest: String,
    /// Its admin listener, `http://host:port`.
    pub admin: String,
}

impl ClusterConfig {
    /// Two nodes or more.
    pub fn is_multi(&self) -> bool {
        self.nodes.len() > 1
    }

    fn validate(&self, secrets: Secrets) -> Result<(), ConfigError> {
        if !(100..=120_000).contains(&self.forward_timeout_ms) {
            return Err(invalid(
                "cluster.forward_timeout_ms",
                format!("{} is outside 100..=120000", self.forward_timeout_ms),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let key = format!("cluster.nodes[{i}]");
            let chars_ok = n
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if n.name.is_empty()
                || n.name.len() > 253
                || !chars_ok
                || !names.insert(n.name.as_str())
            {
                return Err(invalid(
                    &key,
                    format!(
                        "name {:?} is empty, too long, repeated or not [A-Za-z0-9._-]",
                        n.name
                    ),
                ));
            }
            for (field, url) in [("ingest", &n.ingest), ("admin", &n.admin)] {
                // A path is a prefix the listener's paths are appended to (a proxy's).
                let ok = url
                    .parse::<http::Uri>()
                    .ok()
                    .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
                    .filter(|u| u.host().is_some() && u.query().is_none());
                if ok.is_none() {
                    return Err(invalid(
                        &format!("{key}.{field}"),
                        format!("{url:?} is not an http(s)://host:port URL"),
                    ));
                }
            }
        }
        if self.nodes.is_empty() {
            return Ok(());
        }
        match &self.name {
            Some(me) if names.contains(me.as_str()) => {}
            Some(me) => {
                return Err(invalid(
                    "cluster.name",
                    format!("{me:?} is not one of cluster.nodes"),
                ))
            }
            None => {
                return Err(invalid(
                    "cluster.name",
                    "must name this node (one of cluster.nodes)",
                ))
            }
        }
        if self.is_multi() {
            let Some(t) = &self.token else {
                return Err(invalid(
                    "cluster.token",
                    "is required with two nodes or more",
                ));
            };
            if secrets.len(t, "cluster.token")?.is_some_and(|n| n < 16) {
                return Err(invalid("cluster.token", "must be at least 16 bytes"));
            }
        }
        Ok(())
    }
}

/// Whether validation reads the secrets (their length is checked) or leaves them be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secrets {
    Resolve,
    Skip,
}

impl Secrets {
    /// The secret's length, or `None` when secrets are skipped.
    fn len(self, s: &SecretSource, key: &str) -> Result<Option<usize>, ConfigError> {
        match self {
            Secrets::Resolve => Ok(Some(s.resolve(key)?.len())),
            Secrets::Skip => Ok(None),
        }
    }
}

/// The longest tenant id, in bytes.
pub const MAX_TENANT_LEN: usize = 256;

/// What is wrong with a tenant id, if anything: empty, over 256 bytes, or a control
/// character.
pub fn tenant_id_problem(tenant: &str) -> Option<&'static str> {
    if tenant.is_empty() {
        Some("empty")
    } else if tenant.len() > MAX_TENANT_LEN {
        Some("longer than 256 bytes")
    } else if tenant.chars().any(char::is_control) {
        Some("contains a control character")
    } else {
        None
    }
}

/// A secret: given inline, read from a file, or read from an environment variable.
/// Never printed: `Debug` and serialisation show `<redacted>`.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum SecretSource {
    Value(String),
    File(PathBuf),
    Env(String),
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for SecretSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

/// What every secret is replaced by in `/v1/config`.
pub const REDACTED: &str = "<redacted>";

impl SecretSource {
    /// The secret's bytes (a trailing newline of a file is dropped).
    pub fn resolve(&self, key: &str) -> Result<Vec<u8>, ConfigError> {
        match self {
            SecretSource::Value(v) => Ok(v.as_bytes().to_vec()),
            SecretSource::File(p) => {
                let mut b = std::fs::read(p).map_err(|e| {
                    invalid(key, format!("cannot read secret file {}: {e}", p.display()))
                })?;
                while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                    b.pop();
                }
                Ok(b)
            }
            SecretSource::Env(name) => std::env::var(name)
                .map(String::into_bytes)
                .map_err(|_| invalid(key, format!("environment variable {name} is not set"))),
        }
    }
}

/// Where a source's hooks get their tenant.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum TenantFrom {
    /// Every hook of the source belongs to this tenant.
    Fixed(String),
    /// A request header names the tenant (a shared source).
    Header(String),
    /// A JSON pointer into the body names the tenant (a shared source).
    JsonPointer(String),
    /// The URL names the tenant: `POST /ingest/{source}/{tenant}`, for providers that let
    /// each tenant register its own endpoint URL (`tenant: path`).
    Path,
}

/// How a source's requests are verified.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "scheme", rename_all = "kebab-case", deny_unknown_fields)]
pub enum VerifyConfig {
    None,
    /// HMAC-SHA256 of the body in a header, hex or base64, with an optional prefix.
    #[serde(rename = "hmac-sha256")]
    HmacSha256 {
        secret: SecretSource,
        header: String,
        #[serde(default)]
        prefix: String,
        #[serde(default)]
        encoding: SigEncoding,
    },
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature` (Standard Webhooks).
    StandardWebhooks {
        secret: SecretSource,
        #[serde(default = "default_tolerance")]
        tolerance_s: u64,
    },
    /// `X-Hub-Signature-256: sha256=<hex>`.
    Github {
        secret: SecretSource,
    },
    /// `Stripe-Signature: t=<ts>,v1=<hex>`.
    Stripe {
        secret: SecretSource,
        #[serde(default = "default_tolerance")]
        tolerance_s: u64,
    },
}

impl VerifyConfig {
    /// The headers a source of this scheme forwards unless it lists its own: what a
    /// receiver needs to tell one kind of hook from another when the body does not say.
    /// GitHub names the event only in `X-GitHub-Event`; Stripe's and Standard Webhooks'
    /// events carry their type in the body.
    pub fn forward_headers(&self) -> &'static [&'static str] {
        match self {
            VerifyConfig::Github { .. } => &[
                "X-GitHub-Event",
                "X-GitHub-Delivery",
                "X-GitHub-Hook-ID",
                "X-GitHub-Hook-Installation-Target-Type",
                "X-GitHub-Hook-Installation-Target-ID",
            ],
            VerifyConfig::None
            | VerifyConfig::HmacSha256 { .. }
            | VerifyConfig::StandardWebhooks { .. }
            | VerifyConfig::Stripe { .. } => &[],
        }
    }
}

fn default_tolerance() -> u64 {
    300
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum SigEncoding {
    #[default]
    Hex,
    Base64,
}

/// Where a hook's idempotency key comes from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// Headers tried in order; the first present one is the key.
    pub headers: Vec<String>,
    /// A JSON pointer into the body, tried after the headers.
    pub json_pointer: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    pub id: String,
    /// Absent: every hook belongs to the `default` tenant.
    #[serde(default)]
    pub tenant: Option<TenantFrom>,
    pub verify: VerifyConfig,
    /// Absent: the scheme's own id (`webhook-id`, `X-GitHub-Delivery`, Stripe's event id).
    #[serde(default)]
    pub idempotency: Option<IdempotencyConfig>,
    /// The route (a list of sinks) its hooks fan out to.
    pub route: String,
    #[serde(default)]
    pub body_limit_bytes: Option<usize>,
    /// Request headers kept with each hook and sent on to its sinks (at most
    /// [`MAX_FORWARD_HEADERS`]). Absent: the scheme's own ([`VerifyConfig::forward_headers`]:
    /// GitHub's event and delivery headers); `[]` forwards none.
    #[serde(default)]
    pub forward_headers: Option<Vec<String>>,
    /// Archive this source's hooks (overrides its route's setting).
    #[serde(default)]
    pub archive: Option<ArchiveSetting>,
}

/// The most header names a source may forward.
pub const MAX_FORWARD_HEADERS: usize = 16;

/// Headers a source may not forward: the delivery sets them itself.
pub const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-type",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "user-agent",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "ankusa-tenant",
    "ankusa-source",
];

impl SourceConfig {
    /// The header names (lower case) this source forwards.
    pub fn forwarded(&self) -> Vec<String> {
        match &self.forward_headers {
            Some(names) => names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            None => self
                .verify
                .forward_headers()
                .iter()
                .map(|n| n.to_ascii_lowercase())
                .collect(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    pub id: String,
    pub url: String,
    /// Signs deliveries (Standard Webhooks); `whsec_` + base64, or raw bytes.
    #[serde(default)]
    pub secret: Option<SecretSource>,
    #[serde(default = "default_sink_timeout")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// A 4xx other than 408 and 429 dead-letters at once (else it is retried).
    #[serde(default = "default_true")]
    pub dead_letter_on_4xx: bool,
    /// Deliveries in flight to this sink (default: `dispatch.per_sink_inflight`).
    #[serde(default)]
    pub max_inflight: Option<usize>,
    /// Consecutive failed attempts (408, 429, 5xx, timeouts, connection errors) that open
    /// the sink's breaker.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker keeps the sink's rows due before a probe (longer if the
    /// sink's `Retry-After` asks for it).
    #[serde(default = "default_breaker_cooldown")]
    pub breaker_cooldown_ms: u64,
}

fn default_sink_timeout() -> u64 {
    10_000
}

fn default_breaker_failures() -> u32 {
    5
}

fn default_breaker_cooldown() -> u64 {
    5_000
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub id: String,
    pub sinks: Vec<String>,
    /// Archive the hooks of every source on this route (a source's own setting wins).
    #[serde(default)]
    pub archive: Option<ArchiveSetting>,
}

/// What the archive does with a source's hooks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArchivePolicy {
    /// New hooks get an archive obligation and are kept this long once archived.
    Archive { retention_ms: u64 },
    /// New hooks are not archived; obligations already made are honoured with this
    /// retention (a source the configuration no longer names, or that says nothing).
    Honour { retention_ms: u64 },
    /// Archiving is switched off (`archive: {enabled: false}`): obligations are dropped.
    Off,
}

impl Config {
    /// The archive policy of the hooks of source `id`: its own setting, else its route's.
    pub fn archive_policy(&self, id: &str) -> ArchivePolicy {
        let default = self.archive.retention_ms;
        let source = self.sources.iter().find(|s| s.id == id);
        let setting = source.and_then(|s| {
            s.archive.clone().or_else(|| {
                self.routes
                    .iter()
                    .find(|r| r.id == s.route)
                    .and_then(|r| r.archive.clone())
            })
        });
        match setting {
            Some(ArchiveSetting {
                enabled: true,
                retention_ms,
            }) => ArchivePolicy::Archive {
                retention_ms: retention_ms.unwrap_or(default),
            },
            Some(ArchiveSetting { enabled: false, .. }) => ArchivePolicy::Off,
            None => ArchivePolicy::Honour {
                retention_ms: default,
            },
        }
    }
}

/// The range `tenants.max` must fall in (ordinal `u32::MAX` is reserved).
pub const TENANTS_MAX_RANGE: std::ops::RangeInclusive<u32> = 1..=4_294_967_294;

impl Config {
    /// Where backup archives are staged.
    pub fn backup_dir(&self) -> PathBuf {
        self.admin.backup_dir.clone().unwrap_or_else(|| {
            let mut p = self.data_dir.clone().into_os_string();
            p.push(".backups");
            PathBuf::from(p)
        })
    }

    /// Reads `path`, applies `ANKUSA_*` overrides from `env`, and validates.
    pub fn load(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml(&text, env)
    }

    /// Parses YAML text, applies overrides, validates.
    pub fn from_yaml(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let cfg = Self::parse(text, env)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// YAML text with the overrides applied, not validated.
    fn parse(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let mut doc: serde_yaml::Value = if text.trim().is_empty() {
            serde_yaml::Value::Mapping(Default::default())
        } else {
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?
        };
        let sections = top_level_keys();
        for (k, v) in env {
            let Some(path) = k.strip_prefix("ANKUSA_") else {
                continue;
            };
            // Only a variable whose first segment names a configuration key is an
            // override: Kubernetes injects `<SERVICE>_SERVICE_HOST` and friends for every
            // Service in a pod's namespace (an `ankusa-metrics` Service gives
            // `ANKUSA_METRICS_SERVICE_HOST`), and the command line reads a few `ANKUSA_*`
            // variables of its own. A misspelt key below a real section is still an error.
            let first = path.split("__").next().unwrap_or("").to_ascii_lowercase();
            if !sections.contains(&first) {
                tracing::debug!(variable = %k, "not a configuration override; ignored");
                continue;
            }
            apply_override(&mut doc, path, &v)?;
        }
        // Through JSON: serde_yaml's `Value` reads enums only from YAML tags, while the
        // configuration writes them as one-key maps (`tenant: {header: x-tenant}`).
        let json = serde_json::to_value(&doc).map_err(|e| ConfigError::Parse(e.to_string()))?;
        serde_json::from_value(json).map_err(|e| ConfigError::Parse(e.to_string()))
    }

    /// [`Config::from_yaml`] without reading any secret: what can be checked of a node's
    /// configuration away from the node (the operator checks a `Relay`'s with it).
    pub fn from_yaml_unresolved(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let cfg = Self::parse(text, env)?;
        cfg.validate_with(Secrets::Skip)?;
        Ok(cfg)
    }

    /// Range and cross-field checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with(Secrets::Resolve)
    }

    /// Every check of [`Config::validate`]; with [`Secrets::Skip`], secrets are not read
    /// (where they live — a file, a variable — exists only where the node runs).
    pub fn validate_with(&self, secrets: Secrets) -> Result<(), ConfigError> {
        in_range("tenants.max", self.tenants.max, TENANTS_MAX_RANGE)?;
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        self.admin.validate_scalars()?;
        self.ingest.validate()?;
        self.writer.validate()?;
        self.dedupe.validate()?;
        self.dispatch.validate()?;
        self.retry.validate()?;
        self.reclaim.validate()?;
        self.hook_log.validate()?;
        self.shutdown.validate()?;
        self.cluster.validate(secrets)?;
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.admin.tokens.iter().enumerate() {
            let key = format!("admin.tokens[{i}]");
            if t.name.is_empty() || !names.insert(t.name.as_str()) {
                return Err(invalid(
                    &key,
                    format!("name {:?} is empty or repeated", t.name),
                ));
            }
            if secrets
                .len(&t.secret, &format!("{key}.secret"))?
                .is_some_and(|n| n < 16)
            {
                return Err(invalid(
                    &format!("{key}.secret"),
                    "must be at least 16 bytes",
                ));
            }
            if let ScopeConfig::Tenants(ts) = &t.scope {
                if ts.is_empty() {
                    return Err(invalid(
                        &format!("{key}.scope.tenants"),
                        "must name a tenant",
                    ));
                }
            }
        }
        let mut ids = std::collections::BTreeSet::new();
        for (i, s) in self.sinks.iter().enumerate() {
            let key = format!("sinks[{i}]");
            if s.id.is_empty() || !ids.insert(s.id.as_str()) {
                return Err(invalid(&key, format!("id {:?} is empty or repeated", s.id)));
            }
            if !(s.url.starts_with("http://") || s.url.starts_with("https://")) {
                return Err(invalid(
                    &format!("{key}.url"),
                    "must be an http:// or https:// URL",
                ));
            }
            in_range(&format!("{key}.timeout_ms"), s.timeout_ms, 1..=600_000)?;
            in_range(
                &format!("{key}.breaker_failures"),
                s.breaker_failures,
                1..=10_000,
            )?;
            in_range(
                &format!("{key}.breaker_cooldown_ms"),
                s.breaker_cooldown_ms,
                1..=3_600_000,
            )?;
            // A sink with no slot would never be delivered to.
            if let Some(m) = s.max_inflight {
                in_range(&format!("{key}.max_inflight"), m, 1..=100_000)?;
            }
        }
        let a = &self.archive;
        if a.retention_ms == 0
            || a.settle_interval_ms == 0
            || a.settle_batch == 0
            || a.prune_batch == 0
        {
            return Err(invalid(
                "archive",
                "retention_ms, settle_interval_ms, settle_batch and prune_batch must be positive",
            ));
        }
        let setting_ok = |key: String, s: &Option<ArchiveSetting>| match s {
            Some(ArchiveSetting {
                retention_ms: Some(0),
                ..
            }) => Err(invalid(
                &format!("{key}.archive.retention_ms"),
                "must be positive",
            )),
            _ => Ok(()),
        };
        for (i, r) in self.routes.iter().enumerate() {
            setting_ok(format!("routes[{i}]"), &r.archive)?;
        }
        for (i, s) in self.sources.iter().enumerate() {
            setting_ok(format!("sources[{i}]"), &s.archive)?;
        }
        let mut routes = std::collections::BTreeSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            let key = format!("routes[{i}]");
            if r.id.is_empty() || !routes.insert(r.id.as_str()) {
                return Err(invalid(&key, format!("id {:?} is empty or repeated", r.id)));
            }
            if r.sinks.is_empty() || r.sinks.len() > usize::from(u16::MAX) {
                return Err(invalid(
                    &format!("{key}.sinks"),
                    "must name 1..=65535 sinks",
                ));
            }
            for s in &r.sinks {
                if !ids.contains(s.as_str()) {
                    return Err(invalid(
                        &format!("{key}.sinks"),
                        format!("unknown sink {s:?}"),
                    ));
                }
            }
        }
        let mut sources = std::collections::BTreeSet::new();
        for (i, s) in self.sources.iter().enumerate() {
            let key = format!("sources[{i}]");
            let url_safe =
                s.id.chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if s.id.is_empty() || !url_safe || !sources.insert(s.id.as_str()) {
                return Err(invalid(
                    &key,
                    format!("id {:?} is empty, repeated, or not [A-Za-z0-9._-]", s.id),
                ));
            }
            if !routes.contains(s.route.as_str()) {
                return Err(invalid(
                    &format!("{key}.route"),
                    format!("unknown route {:?}", s.route),
                ));
            }
            if let Some(TenantFrom::JsonPointer(p)) = &s.tenant {
                if !(p.is_empty() || p.starts_with('/')) {
                    return Err(invalid(
                        &format!("{key}.tenant.json_pointer"),
                        "must start with /",
                    ));
                }
            }
            if let Some(TenantFrom::Fixed(t)) = &s.tenant {
                if tenant_id_problem(t).is_some() {
                    return Err(invalid(
                        &format!("{key}.tenant.fixed"),
                        "not a valid tenant id",
                    ));
                }
            }
            if let Some(names) = &s.forward_headers {
                let key = format!("{key}.forward_headers");
                if names.len() > MAX_FORWARD_HEADERS {
                    return Err(invalid(
                        &key,
                        format!("at most {MAX_FORWARD_HEADERS} header names"),
                    ));
                }
                let mut seen = std::collections::BTreeSet::new();
                for n in names {
                    let lower = n.to_ascii_lowercase();
                    if http::HeaderName::from_bytes(n.as_bytes()).is_err()
                        || RESERVED_HEADERS.contains(&lower.as_str())
                        || !seen.insert(lower)
                    {
                        return Err(invalid(
                            &key,
                            format!(
                                "{n:?} is not a header name, is repeated, or is set by the delivery itself ({})",
                                RESERVED_HEADERS.join(", ")
                            ),
                        ));
                    }
                }
            }
            if let Some(n) = s.body_limit_bytes {
                if !(1..=256 << 20).contains(&n) {
                    return Err(invalid(
                        &format!("{key}.body_limit_bytes"),
                        "must be in 1..=268435456",
                    ));
                }
            }
            let secret = match &s.verify {
                VerifyConfig::None => None,
                VerifyConfig::HmacSha256 { secret, .. }
                | VerifyConfig::StandardWebhooks { secret, .. }
                | VerifyConfig::Github { secret }
                | VerifyConfig::Stripe { secret, .. } => Some(secret),
            };
            if let Some(secret) = secret {
                if secrets.len(secret, &format!("{key}.verify.secret"))? == Some(0) {
                    return Err(invalid(&format!("{key}.verify.secret"), "is empty"));
                }
            }
        }
        Ok(())
    }
}

/// The configuration's top-level keys, from its own serialisation.
fn top_level_keys() -> Vec<String> {
    match serde_json::to_value(Config::default()) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Applies one `ANKUSA_A__B__C` override. A segment below a list picks an entry by its
/// index (`ANKUSA_SINKS__0__URL`) or by its `id`, case-insensitively (`ANKUSA_SINKS__CI__URL`);
/// an entry that does not exist is an error, as is a segment below a scalar.
fn apply_override(doc: &mut serde_yaml::Value, path: &str, raw: &str) -> Result<(), ConfigError> {
    let segments: Vec<String> = path.split("__").map(|s| s.to_ascii_lowercase()).collect();
    let key = segments.join(".");
    if segments.iter().any(|s| s.is_empty()) {
        return Err(invalid(&key, "malformed environment override name"));
    }
    let mut value = Some(
        serde_yaml::from_str::<serde_yaml::Value>(raw)
            .map_err(|e| invalid(&key, format!("bad override: {e}")))?,
    );
    let mut node = doc;
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        node = match node {
            serde_yaml::Value::Mapping(m) => {
                let k = serde_yaml::Value::String(seg.clone());
                if last {
                    m.insert(k, value.take().unwrap_or_default());
                    return Ok(());
                }
                m.entry(k)
                    .or_insert_with(|| serde_yaml::Value::Mapping(Default::default()))
            }
            serde_yaml::Value::Sequence(items) => {
                let at = match seg.parse::<usize>() {
                    Ok(n) if n < items.len() => n,
                    Ok(n) => {
                        return Err(invalid(
                            &key,
                            format!("no entry {n}: the list has {} entries", items.len()),
                        ))
                    }
                    Err(_) => items
                        .iter()
                        .position(|it| {
                            it.get("id")
                                .and_then(serde_yaml::Value::as_str)
                                .is_some_and(|id| id.eq_ignore_ascii_case(seg))
                        })
                        .ok_or_else(|| {
                            invalid(&key, format!("no entry with index or id {seg:?}"))
                        })?,
                };
                if last {
                    items[at] = value.take().unwrap_or_default();
                    return Ok(());
                }
                &mut items[at]
            }
            _ => {
                return Err(invalid(
                    &key,
                    "overrides a key below a value that is not a mapping or a list",
                ))
            }
        };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn list_entries_are_addressed_by_index_or_by_id() {
        let yaml = r#"
data_dir: /tmp/x
sinks:
  - { id: ci, url: "http://a.example/" }
  - { id: Billing, url: "http://b.example/" }
routes: [{ id: r, sinks: [ci, Billing] }]
"#;
        let c = Config::from_yaml(
            yaml,
            env(&[
                ("ANKUSA_SINKS__0__URL", "http://c.example/"),
                ("ANKUSA_SINKS__BILLING__TIMEOUT_MS", "1234"),
            ]),
        )
        .unwrap();
        assert_eq!(c.sinks[0].url, "http://c.example/");
        assert_eq!(c.sinks[1].timeout_ms, 1234);
        for (var, says) in [
            ("ANKUSA_SINKS__2__URL", "no entry 2: the list has 2 entries"),
            ("ANKUSA_SINKS__NOPE__URL", "no entry with index or id"),
            ("ANKUSA_DATA_DIR__X", "not a mapping or a list"),
        ] {
            let e = Config::from_yaml(yaml, env(&[(var, "1")]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(says), "{var}: {e}");
        }
    }

    #[test]
    fn defaults_apply_and_env_overrides_win() {
        let c =
            Config::from_yaml("data_dir: /tmp/x\n", env(&[("ANKUSA_TENANTS__MAX", "12")])).unwrap();
        assert_eq!(c.tenants.max, 12);
        assert_eq!(c.admin.gauge_interval_ms, 15_000);
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        let c = Config::from_yaml("", env(&[("ANKUSA_DATA_DIR", "/d"), ("OTHER", "1")])).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/d"));
        // What Kubernetes injects for a Service named `ankusa-metrics` in the pod's
        // namespace, and the command line's own variables, are not overrides.
        let injected = [
            ("ANKUSA_METRICS_SERVICE_HOST", "10.96.0.12"),
            ("ANKUSA_METRICS_SERVICE_PORT", "8080"),
            ("ANKUSA_METRICS_PORT_8080_TCP_ADDR", "10.96.0.12"),
            ("ANKUSA_METRICS_PORT", "tcp://10.96.0.12:8080"),
            ("ANKUSA_ADMIN_TOKEN", "t"),
            ("ANKUSA_SINK_SECRET", "s"),
        ];
        let c = Config::from_yaml("data_dir: /tmp/x\n", env(&injected)).unwrap();
        assert_eq!(
            c,
            Config::from_yaml("data_dir: /tmp/x\n", env(&[])).unwrap()
        );
    }

    #[test]
    fn unknown_keys_and_bad_ranges_name_the_key() {
        let e = Config::from_yaml("tenant:\n  max: 3\n", env(&[])).unwrap_err();
        assert!(e.to_string().contains("unknown field `tenant`"), "{e}");
        let e = Config::from_yaml("tenants:\n  max: 0\n", env(&[])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid config: tenants.max: 0 is outside 1..=4294967294"
        );
        let e = Config::from_yaml("", env(&[("ANKUSA_TENANTS__MAXX", "3")])).unwrap_err();
        assert!(e.to_string().contains("maxx"), "{e}");
        let e = Config::from_yaml("", env(&[("ANKUSA_DATA_DIRR", "/d")]));
        assert!(
            e.is_ok(),
            "a variable naming no key is not an override: {e:?}"
        );
        let e = Config::from_yaml("tenants:\n  max: 4294967295\n", env(&[])).unwrap_err();
        assert!(e.to_string().contains("tenants.max"), "{e}");
        // Forwarded headers: names, no repeats, none the delivery sets, a bounded list.
        let src = |fwd: &str| {
            format!(
                "sinks: [{{ id: s, url: \"http://127.0.0.1:9/\" }}]\nroutes: [{{ id: r, sinks: [s] }}]\nsources: [{{ id: a, verify: {{ scheme: none }}, route: r, forward_headers: {fwd} }}]\n"
            )
        };
        let ok = Config::from_yaml(&src("[X-Shop-Topic, x-request-id]"), env(&[])).unwrap();
        assert_eq!(ok.sources[0].forwarded(), ["x-shop-topic", "x-request-id"]);
        let many = format!(
            "[{}]",
            (0..17)
                .map(|i| format!("x-h{i}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
        for bad in [
            "[webhook-signature]",
            "[Content-Type]",
            "[\"bad name\"]",
            "[x-a, X-A]",
            &many,
        ] {
            let e = Config::from_yaml(&src(bad), env(&[])).unwrap_err();
            assert!(
                e.to_string().contains("sources[0].forward_headers"),
                "{bad}: {e}"
            );
        }
        // The scheme's defaults: GitHub's event and delivery headers, none for the others.
        let gh = "sinks: [{ id: s, url: \"http://127.0.0.1:9/\" }]\nroutes: [{ id: r, sinks: [s] }]\nsources: [{ id: g, verify: { scheme: github, secret: { value: x } }, route: r }, { id: n, verify: { scheme: none }, route: r }]\n";
        let c = Config::from_yaml(gh, env(&[])).unwrap();
        assert!(c.sources[0]
            .forwarded()
            .contains(&"x-github-event".to_owned()));
        assert!(c.sources[1].forwarded().is_empty());
        // A sink with no slot would never be delivered to.
        let yaml = "sinks: [{ id: s, url: \"http://127.0.0.1:9/\", max_inflight: 0 }]\n";
        let e = Config::from_yaml(yaml, env(&[])).unwrap_err();
        assert!(e.to_string().contains("sinks[0].max_inflight"), "{e}");
        let e = Config::from_yaml("dispatch: { tenant_max_inflight: 0 }\n", env(&[])).unwrap_err();
        assert!(e.to_string().contains("tenant_max_inflight"), "{e}");
        let e =
            Config::from_yaml("dispatch: { tenant_weights: { acme: 0 } }\n", env(&[])).unwrap_err();
        assert!(e.to_string().contains("dispatch.tenant_weights"), "{e}");
        let ok =
            Config::from_yaml("dispatch: { tenant_weights: { acme: 3 } }\n", env(&[])).unwrap();
        assert_eq!(ok.dispatch.tenant_weights["acme"], 3);
    }

    /// Each section checks its own keys; a value out of range names its key, and the range
    /// in the message is the one the check uses.
    #[test]
    fn each_section_names_the_key_and_the_range_it_checks() {
        for (yaml, message) in [
            (
                "writer: { max_batch_hooks: 0 }",
                "writer.max_batch_hooks: 0 is outside 1..=65536",
            ),
            (
                "writer: { max_batch_bytes: 10 }",
                "writer.max_batch_bytes: 10 is less than 1024",
            ),
            (
                "writer: { exit_when_stuck_ms: 3600001 }",
                "writer.exit_when_stuck_ms: 3600001 is outside 0..=3600000",
            ),
            (
                "dedupe: { window_ms: 0 }",
                "dedupe.window_ms: must be positive",
            ),
            (
                "dispatch: { per_sink_inflight: 100001 }",
                "dispatch.per_sink_inflight: 100001 is outside 1..=100000",
            ),
            (
                "retry: { max_attempts: 0 }",
                "retry.max_attempts: 0 is outside 1..=1000",
            ),
            ("reclaim: { batch: 0 }", "reclaim.batch: must be positive"),
            (
                "hook_log: { prune_batch: 0 }",
                "hook_log.prune_batch: must be positive",
            ),
            (
                "shutdown: { grace_ms: 600001 }",
                "shutdown.grace_ms: 600001 is outside 0..=600000",
            ),
            (
                "admin: { max_page: 0 }",
                "admin.max_page: 0 is outside 1..=100000",
            ),
            (
                "ingest: { body_limit_bytes: 0 }",
                "ingest.body_limit_bytes: 0 is outside 1..=268435456",
            ),
        ] {
            let e = Config::from_yaml(&format!("{yaml}\n"), env(&[])).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("invalid config: {message}"),
                "{yaml}"
            );
        }
    }
}
