//! The node's configuration: one YAML file, every key overridable from the environment.
//!
//! - Unknown keys are errors (`deny_unknown_fields`), so a typo never silently falls back
//!   to a default.
//! - Defaults live in one place: each section's `Default` impl, in the section's module
//!   beside its struct and its checks (and `docs/configuration.md` has one row per key).
//! - Environment overrides ([`env`]): `ANKUSA_<PATH>` where the path's segments are joined
//!   by a double underscore, e.g. `ANKUSA_TENANTS__MAX=5000` sets `tenants.max`, and
//!   `ANKUSA_DATA_DIR=/var/lib/ankusa` sets `data_dir`. The value is parsed as a YAML
//!   scalar.
//! - [`Config::validate`] checks ranges and cross-field rules with messages that name the
//!   key: each section checks its own keys, and `Config` the rules between sections.

mod admin;
mod archive;
mod backup;
mod cluster;
mod dedupe;
mod dispatch;
mod env;
pub use env::EnvReport;
mod filter;
mod hook_log;
mod ingest;
mod kafka;
pub mod listen;
mod log;
mod pull;
mod quarantine;
mod reclaim;
mod retry;
mod routes;
mod secrets;
mod shutdown;
mod sinks;
mod sources;
mod store;
mod tenants;
mod tls;
mod writer;

pub use admin::{AdminConfig, ConsoleConfig, MetricsAccess, ScopeConfig, TokenConfig};
pub use archive::{ArchiveConfig, ArchivePolicy, ArchiveSetting};
pub use backup::{
    s3_location, s3_node_url, BackupConfig, ObjectStoreConfig, DEFAULT_BACKUP_BYTES_PER_SECOND,
};
pub use cluster::{ClusterConfig, ClusterNode};
pub use dedupe::DedupeConfig;
pub use dispatch::DispatchConfig;
pub use hook_log::HookLogConfig;
pub use ingest::IngestConfig;
pub use log::{LogConfig, LogFormat};
pub use pull::{ConsumerConfig, PullConfig, MAX_LEASE_MS};
pub use quarantine::QuarantineConfig;
pub use reclaim::ReclaimConfig;
pub use retry::{Jitter, RetryConfig};
mod endpoints;
mod locate;
pub mod reload;
pub use endpoints::{EndpointsConfig, ENDPOINT_ID_PREFIX, MAX_ROTATION_OVERLAP_S};
pub use filter::{glob, Filter, HeaderMatch, HookFacts, Patterns, PointerMatch};
pub use kafka::{
    kafka_servers, topic_token, KafkaConfig, KafkaSasl, KAFKA_SASL_MECHANISMS, MAX_TOPIC,
};
pub use routes::RouteConfig;
pub use secrets::{SecretSource, Secrets, REDACTED};
pub use shutdown::ShutdownConfig;
pub use sinks::{subject_token, NatsConfig, SinkConfig, SinkKind, MAX_PULL_SINK_ID};
pub use sources::{
    EventTypeFrom, IdempotencyConfig, SigEncoding, SourceConfig, TenantBinding, TenantFrom,
    TenantSecrets, VerifyConfig, MAX_FORWARD_HEADERS, MAX_TENANT_SECRETS, MAX_TENANT_SECRET_BYTES,
    RESERVED_HEADERS,
};
pub use store::{StoreConfig, STORE_MEMORY_MIN};
pub use tenants::{
    tenant_id_problem, TenantLimits, TenantsConfig, INGEST_RATE_RANGE, MAX_TENANT_LEN,
    TENANTS_MAX_RANGE,
};
pub use tls::{CaBundle, MAX_BUNDLE_CERTS};
pub use writer::WriterConfig;

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
    /// An error of the file with where it is (`line 4, column 17`), or of an override with
    /// the variable that made it (`from ANKUSA_TENANTS__MAX`).
    #[error("{error} ({place})")]
    At {
        error: Box<ConfigError>,
        place: String,
    },
}

/// A validation error with where its key is (when its key is one path).
fn placed(e: ConfigError, text: &str, overrides: &[env::Override]) -> ConfigError {
    let path = match &e {
        ConfigError::Invalid { key, .. } => locate::parse(key),
        _ => None,
    };
    match path {
        Some(path) => place(e, &path, text, overrides),
        None => e,
    }
}

/// `e`, about the key at `path`, with where that key was set: by the last variable that
/// set it or a key around it, else at its line and column in `text`.
fn place(
    e: ConfigError,
    path: &[locate::Seg],
    text: &str,
    overrides: &[env::Override],
) -> ConfigError {
    let by_variable = overrides
        .iter()
        .rev()
        .find(|o| !path.is_empty() && path.starts_with(&o.path));
    if let Some(o) = by_variable {
        return from_variable(e, &o.var);
    }
    match locate::line_col(text, path) {
        Some((line, column)) => ConfigError::At {
            error: Box::new(e),
            place: format!("line {line}, column {column}"),
        },
        None => e,
    }
}

/// `e`, from variable `var`.
pub(crate) fn from_variable(e: ConfigError, var: &str) -> ConfigError {
    ConfigError::At {
        error: Box::new(e),
        place: format!("from {var}"),
    }
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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the store lives.
    pub data_dir: PathBuf,
    pub store: StoreConfig,
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
    /// Backups the node pushes to an object store.
    pub backup: BackupConfig,
    pub shutdown: ShutdownConfig,
    pub log: LogConfig,
    pub cluster: ClusterConfig,
    /// The claim gateway of pull sinks.
    pub pull: PullConfig,
    /// Tenants' own endpoints, managed through the API.
    pub endpoints: EndpointsConfig,
    pub sources: Vec<SourceConfig>,
    pub sinks: Vec<SinkConfig>,
    pub routes: Vec<RouteConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./data"),
            store: StoreConfig::default(),
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
            backup: BackupConfig::default(),
            shutdown: ShutdownConfig::default(),
            log: LogConfig::default(),
            cluster: ClusterConfig::default(),
            pull: PullConfig::default(),
            endpoints: EndpointsConfig::default(),
            sources: Vec::new(),
            sinks: Vec::new(),
            routes: Vec::new(),
        }
    }
}

/// `#[serde(default)]` for a switch that is on unless turned off.
fn default_true() -> bool {
    true
}

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
        Self::load_reported(path, env).map(|(cfg, _)| cfg)
    }

    /// [`Config::load`], with what the environment did: the overrides applied and the
    /// `ANKUSA_*` variables left alone.
    pub fn load_reported(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Config, EnvReport), ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_yaml_reported(&text, env)
    }

    /// Parses YAML text, applies overrides, validates. An error names the key's path and
    /// where it is: its line and column in `text`, or the variable that set it.
    pub fn from_yaml(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        Self::from_yaml_reported(text, env).map(|(cfg, _)| cfg)
    }

    /// [`Config::from_yaml`], with what the environment did.
    pub fn from_yaml_reported(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Config, EnvReport), ConfigError> {
        let (cfg, overrides, ignored) = Self::parse(text, env)?;
        cfg.validate().map_err(|e| placed(e, text, &overrides))?;
        let applied = overrides
            .into_iter()
            .map(|o| {
                let key = locate::render(&o.path);
                (o.var, key)
            })
            .collect();
        Ok((cfg, EnvReport { applied, ignored }))
    }

    /// YAML text with the overrides applied, not validated; with what each override set
    /// and the `ANKUSA_*` variables that are not overrides.
    fn parse(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<(Config, Vec<env::Override>, Vec<String>), ConfigError> {
        let mut doc: serde_yaml::Value = if text.trim().is_empty() {
            serde_yaml::Value::Mapping(Default::default())
        } else {
            // serde_yaml's own message says where: "… at line 3 column 5".
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?
        };
        let (overrides, ignored) = env::apply(&mut doc, env)?;
        // Through JSON: serde_yaml's `Value` reads enums only from YAML tags, while the
        // configuration writes them as one-key maps (`tenant: {header: x-tenant}`).
        let json = serde_json::to_value(&doc).map_err(|e| ConfigError::Parse(e.to_string()))?;
        match serde_path_to_error::deserialize(json) {
            Ok(cfg) => Ok((cfg, overrides, ignored)),
            Err(e) => {
                let path = locate::of_error(e.path());
                let error = ConfigError::Invalid {
                    key: locate::render(&path),
                    message: e.into_inner().to_string(),
                };
                Err(place(error, &path, text, &overrides))
            }
        }
    }

    /// [`Config::from_yaml`] without reading any secret: what can be checked of a node's
    /// configuration away from the node (the operator checks a `Relay`'s with it).
    pub fn from_yaml_unresolved(
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let (cfg, overrides, _) = Self::parse(text, env)?;
        cfg.validate_with(Secrets::Skip)
            .map_err(|e| placed(e, text, &overrides))?;
        Ok(cfg)
    }

    /// Range and cross-field checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_with(Secrets::Resolve)
    }

    /// What `config check` and a starting node say about a valid configuration that is
    /// likely not what its author wants, one line each.
    pub fn warnings(&self) -> Vec<String> {
        self.sources
            .iter()
            .enumerate()
            .flat_map(|(i, s)| s.warnings(&format!("sources[{i}]")))
            .collect()
    }

    /// Every check of [`Config::validate`]; with [`Secrets::Skip`], secrets are not read
    /// (where they live — a file, a variable — exists only where the node runs).
    pub fn validate_with(&self, secrets: Secrets) -> Result<(), ConfigError> {
        in_range("tenants.max", self.tenants.max, TENANTS_MAX_RANGE)?;
        if let Some((key, why)) = self.tenants.limits.problem() {
            return Err(invalid(&format!("tenants.limits.{key}"), why));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        self.store.validate()?;
        self.admin.validate(secrets)?;
        self.ingest.validate()?;
        self.writer.validate()?;
        self.dedupe.validate()?;
        self.dispatch.validate(secrets)?;
        self.retry.validate()?;
        self.reclaim.validate()?;
        self.hook_log.validate()?;
        self.archive.validate()?;
        self.backup.validate()?;
        self.shutdown.validate()?;
        self.log.validate()?;
        self.cluster.validate(secrets)?;
        self.endpoints.validate()?;
        // Each list's ids are unique, and what one entry names exists in the next.
        let mut sinks = std::collections::BTreeSet::new();
        for (i, s) in self.sinks.iter().enumerate() {
            let key = format!("sinks[{i}]");
            if s.id.is_empty() || !sinks.insert(s.id.as_str()) {
                return Err(invalid(&key, format!("id {:?} is empty or repeated", s.id)));
            }
            if s.id.starts_with(ENDPOINT_ID_PREFIX) || s.id.starts_with('@') {
                return Err(invalid(
                    &format!("{key}.id"),
                    format!("{ENDPOINT_ID_PREFIX:?} starts the ids of tenants' own endpoints, and \"@endpoints\" labels their series: no sink id starts with either"),
                ));
            }
            s.validate(&key, secrets)?;
        }
        let pull_sinks = self
            .sinks
            .iter()
            .filter(|s| s.kind == SinkKind::Pull)
            .map(|s| s.id.as_str())
            .collect();
        self.pull.validate(&pull_sinks, secrets)?;
        let mut routes = std::collections::BTreeSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            let key = format!("routes[{i}]");
            if r.id.is_empty() || !routes.insert(r.id.as_str()) {
                return Err(invalid(&key, format!("id {:?} is empty or repeated", r.id)));
            }
            r.validate(&key, &sinks)?;
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
            s.validate(&key, &routes, secrets)?;
            let route = self.routes.iter().find(|r| r.id == s.route);
            if let Some(r) = route.filter(|r| r.filters.values().any(Filter::reads_event)) {
                if s.event_type().is_none() {
                    return Err(invalid(
                        &format!("{key}.event_type"),
                        format!(
                            "route {:?} filters on the event type: say where this source's hooks carry it ({{ header: NAME }} or {{ json_pointer: /PATH }})",
                            r.id
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
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

    fn top_level() -> String {
        env::top_level_keys().join(", ")
    }

    /// What `config check` lists: each override with the key it set, whatever the
    /// environment's order, and the `ANKUSA_*` variables that are not configuration.
    #[test]
    fn the_report_names_each_override_and_what_was_left_alone() {
        let text = "sinks:\n  - id: billing\n    url: http://127.0.0.1:9/\n";
        let vars = [
            ("ANKUSA_TENANTS__MAX", "12"),
            ("ANKUSA_SINKS__BILLING__TIMEOUT_MS", "1234"),
            ("ANKUSA_ADMIN_TOKEN", "t"),
            ("ANKUSA_METRICS_SERVICE_HOST", "10.96.0.12"),
            ("PATH", "/bin"),
        ];
        let (cfg, report) = Config::from_yaml_reported(text, env(&vars)).unwrap();
        assert_eq!(cfg.tenants.max, 12);
        assert_eq!(
            report.applied,
            vec![
                (
                    "ANKUSA_SINKS__BILLING__TIMEOUT_MS".to_string(),
                    "sinks[0].timeout_ms".to_string()
                ),
                ("ANKUSA_TENANTS__MAX".to_string(), "tenants.max".to_string()),
            ]
        );
        assert_eq!(
            report.ignored,
            vec!["ANKUSA_ADMIN_TOKEN", "ANKUSA_METRICS_SERVICE_HOST"]
        );
        let mut reversed = env(&vars);
        reversed.reverse();
        let (_, again) = Config::from_yaml_reported(text, reversed).unwrap();
        assert_eq!(again.applied, report.applied);
    }

    /// Values the docs call out of range are refused, each naming its key.
    #[test]
    fn documented_limits_are_enforced() {
        let base = r#"
data_dir: /tmp/x
sinks: [{ id: s, url: "http://a.example/" }]
routes: [{ id: r, sinks: [s] }]
"#;
        for (extra, key) in [
            ("dedupe: { sweep_interval_ms: 0 }", "dedupe.sweep_interval_ms"),
            (
                "sources: [{ id: a, verify: { scheme: none }, route: r, forward_headers: [webhook-foo] }]",
                "sources[0].forward_headers",
            ),
            (
                "sources: [{ id: a, verify: { scheme: none }, route: r, forward_headers: [Ankusa-Foo] }]",
                "sources[0].forward_headers",
            ),
            (
                "sources: [{ id: a, verify: { scheme: hmac-sha256, secret: { value: k }, header: x-sig, prefix: \"s\u{00e9}=\" }, route: r }]",
                "sources[0].verify.prefix",
            ),
            (
                "sources: [{ id: a, verify: { scheme: hmac-sha256, secret: { value: k }, header: x-sig, timestamp_header: \"x ts\" }, route: r }]",
                "sources[0].verify.timestamp_header",
            ),
            (
                "admin: { console: { frame_ancestors: [\"*\"] } }",
                "admin.console.frame_ancestors[0]",
            ),
            (
                "admin: { console: { frame_ancestors: [\"http://app.example.com\"] } }",
                "admin.console.frame_ancestors[0]",
            ),
            (
                "admin: { console: { frame_ancestors: [\"https://app.example.com/path\"] } }",
                "admin.console.frame_ancestors[0]",
            ),
            (
                "admin: { console: { frame_ancestors: [\"https://app.example.com\\tx\"] } }",
                "admin.console.frame_ancestors[0]",
            ),
            (
                "admin: { console: { frame_ancestors: [\"https://*\"] } }",
                "admin.console.frame_ancestors[0]",
            ),
            (
                "sources: [{ id: a, tenant: path, verify: { scheme: github, secret: { value: k } }, route: r }]",
                "sources[0].tenant_binding",
            ),
            (
                "sources: [{ id: a, tenant: { fixed: t }, verify: { scheme: github }, tenant_secrets: { map: { t: { value: k } } }, route: r }]",
                "sources[0].tenant_secrets",
            ),
            (
                "sources: [{ id: a, tenant: path, verify: { scheme: github, secret: { value: k } }, tenant_secrets: { map: { t: { value: k } } }, route: r }]",
                "sources[0].verify.secret",
            ),
            (
                "sources: [{ id: a, tenant: path, verify: { scheme: github }, route: r }]",
                "sources[0].verify.secret",
            ),
            (
                "sources: [{ id: a, tenant: path, verify: { scheme: github }, tenant_secrets: { map: { t: { value: \"\" } } }, route: r }]",
                "sources[0].tenant_secrets",
            ),
            (
                "sources: [{ id: a, tenant: path, verify: { scheme: github }, tenant_secrets: { map: { t: { value: k } } }, tenant_binding: shared-secret, route: r }]",
                "sources[0].tenant_binding",
            ),
            (
                "sources: [{ id: a, tenant: { json_pointer: /t }, verify: { scheme: github, secret: { value: k } }, tenant_binding: shared-secret, route: r }]",
                "sources[0].tenant_binding",
            ),
            (
                "sources: [{ id: a, tenant: path, verify: { scheme: none }, tenant_secrets: { map: { t: { value: k } } }, route: r }]",
                "sources[0].tenant_secrets",
            ),
            (
                "sources: [{ id: a, tenant: path, verify: { scheme: github }, tenant_secrets: { dir: /nonexistent/ankusa-keys }, route: r }]",
                "sources[0].tenant_secrets.dir",
            ),
            (
                "cluster: { name: a, token: { value: \"sixteen bytes or more\" }, nodes: [{ name: a, ingest: \"http://a:1\", admin: \"http://a:2\" }, { name: b, ingest: \"http://b:1\", admin: \"http://b:2\" }] }",
                "cluster.token",
            ),
        ] {
            let yaml = format!("{base}{extra}\n");
            let e = Config::from_yaml(&yaml, Vec::new())
                .expect_err(extra)
                .to_string();
            assert!(e.contains(key), "{extra}: {e}");
        }
    }

    #[test]
    fn https_origins_of_host_names_frame_the_portal() {
        for ok in [
            "https://app.example.com",
            "https://app.example.com:8443",
            "https://*.example.com",
            "https://localhost",
        ] {
            assert!(admin::is_https_origin(ok), "{ok}");
        }
        for bad in [
            "*",
            "https://*",
            "https://*.com",
            "http://app.example.com",
            "https://app.example.com/",
            "https://app.example.com:0",
            "https://app.example.com:99999",
            "https://a b.example.com",
            "https://app.example.com;script-src *",
            "https://-app.example.com",
            "https://",
        ] {
            assert!(!admin::is_https_origin(bad), "{bad}");
        }
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
    fn errors_name_the_key_path_and_the_line_or_the_variable() {
        let sinks = "sinks:\n  - id: a\n    url: http://127.0.0.1:9/\n    timeout_ms: 5s\n";
        let err = |text: &str, vars: &[(&str, &str)]| {
            Config::from_yaml(text, env(vars)).unwrap_err().to_string()
        };
        // A type error, an unknown key, a missing key, a bad variant: path, line, column.
        assert_eq!(
            err(sinks, &[]),
            "invalid config: sinks[0].timeout_ms: invalid type: string \"5s\", expected u64 (line 4, column 17)"
        );
        assert_eq!(
            err("tenants:\n  maxx: 3\n", &[]),
            "invalid config: tenants.maxx: unknown field `maxx`, expected `max` or `limits` (line 2, column 9)"
        );
        assert_eq!(
            err("routes:\n  - sinks: [a]\n", &[]),
            "invalid config: routes[0]: missing field `id` (line 2, column 10)"
        );
        // An HTTP sink without its URL names the key and the kind that needs it.
        assert_eq!(
            err("sinks:\n  - id: a\n", &[]),
            "invalid config: sinks[0].url: an HTTP sink (kind: http, the default) needs an http:// or https:// URL"
        );
        let e = err(
            "sources:\n  - id: s\n    route: r\n    verify: { scheme: hmac }\n",
            &[],
        );
        assert!(
            e.starts_with("invalid config: sources[0].verify.scheme: unknown variant `hmac`")
                && e.ends_with("(line 4, column 23)"),
            "{e}"
        );
        // A range checked after parsing is placed the same way.
        assert!(err("data_dir: /d\ntenants: { max: 0 }\n", &[]).ends_with("(line 2, column 17)"));
        // What a variable set is its error: the variable is named, not a line.
        assert_eq!(
            err("", &[("ANKUSA_TENANTS__MAXX", "3")]),
            "invalid config: tenants.maxx: unknown field `maxx`, expected `max` or `limits` (from ANKUSA_TENANTS__MAXX)"
        );
        let fixed = sinks.replace("5s", "5000");
        assert_eq!(
            err(&fixed, &[("ANKUSA_SINKS__A__TIMEOUT_MS", "5s")]),
            "invalid config: sinks[0].timeout_ms: invalid type: string \"5s\", expected u64 (from ANKUSA_SINKS__A__TIMEOUT_MS)"
        );
        assert!(err("", &[("ANKUSA_TENANTS__MAX", "0")]).ends_with("(from ANKUSA_TENANTS__MAX)"));
        assert!(err(&fixed, &[("ANKUSA_SINKS__7__URL", "x")])
            .ends_with("no entry 7: the list has 1 entries (from ANKUSA_SINKS__7__URL)"));
        // A variable elsewhere does not take the blame for the file's error.
        assert!(err(sinks, &[("ANKUSA_TENANTS__MAX", "5")]).ends_with("(line 4, column 17)"));
        // YAML that does not parse says where, in serde_yaml's words.
        assert!(
            err("tenants: [\n", &[]).contains("line 2"),
            "{}",
            err("tenants: [\n", &[])
        );
    }

    #[test]
    fn unknown_keys_and_bad_ranges_name_the_key() {
        let e = Config::from_yaml("tenant:\n  max: 3\n", env(&[])).unwrap_err();
        assert!(e.to_string().contains("unknown field `tenant`"), "{e}");
        let e = Config::from_yaml("tenants:\n  max: 0\n", env(&[])).unwrap_err();
        assert_eq!(
            e.to_string(),
            "invalid config: tenants.max: 0 is outside 1..=4294967294 (line 2, column 8)"
        );
        let e = Config::from_yaml("", env(&[("ANKUSA_TENANTS__MAXX", "3")])).unwrap_err();
        assert!(e.to_string().contains("maxx"), "{e}");
        let e = Config::from_yaml("", env(&[("ANKUSA_DATA_DIRR", "/d")]));
        assert!(
            e.is_ok(),
            "a variable naming no key is not an override: {e:?}"
        );
        // A double underscore makes it an override, so a first segment that names no key is
        // a misspelt one, said with the nearest key.
        let err = |text: &str, vars: &[(&str, &str)]| {
            Config::from_yaml(text, env(vars)).unwrap_err().to_string()
        };
        assert_eq!(
            err("", &[("ANKUSA_TENANT__MAX", "5")]),
            "invalid config: tenant: not a configuration key (did you mean `tenants`?); the top-level keys are "
                .to_string()
                + &top_level()
                + " (from ANKUSA_TENANT__MAX)"
        );
        assert!(!err("", &[("ANKUSA_XYZZY__A", "5")]).contains("did you mean"));
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
                "backup: { object_store: { url: \"hooks/prod\" } }",
                "backup.object_store.url: \"hooks/prod\" is not an s3://bucket/prefix location",
            ),
            (
                "backup: { object_store: { url: \"s3://hooks\", interval_ms: 999 } }",
                "backup.object_store.interval_ms: 999 is outside 1000..=86400000",
            ),
            (
                "backup: { object_store: { url: \"s3://hooks\", endpoint: \"seaweed:8333\" } }",
                "backup.object_store.endpoint: \"seaweed:8333\" is not an http:// or https:// URL",
            ),
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
            // Each names its key, and where the file sets it.
            let e = Config::from_yaml(&format!("{yaml}\n"), env(&[])).unwrap_err();
            let (key, _) = message.split_once(':').unwrap();
            let leaf = key.rsplit('.').next().unwrap();
            let column = yaml.find(&format!("{leaf}: ")).unwrap() + leaf.len() + 3;
            assert_eq!(
                e.to_string(),
                format!("invalid config: {message} (line 1, column {column})"),
                "{yaml}"
            );
        }
    }
}
