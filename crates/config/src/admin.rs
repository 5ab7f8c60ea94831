//! The admin listener and its tokens (`admin`).

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, ConfigError, SecretSource, Secrets};

impl AdminConfig {
    /// The admin section's numbers, and its tokens: names unique, secrets of 16 bytes or
    /// more (read unless `secrets` says not to), a tenant scope naming a tenant.
    pub(crate) fn validate(&self, secrets: Secrets) -> Result<(), ConfigError> {
        in_range(
            "admin.gauge_interval_ms",
            self.gauge_interval_ms,
            100..=3_600_000,
        )?;
        in_range("admin.backup_keep", self.backup_keep, 1..=100)?;
        in_range("admin.max_page", self.max_page, 1..=100_000)?;
        self.connections.validate("admin")?;
        self.console.validate(secrets)?;
        let mut names = std::collections::BTreeSet::new();
        for (i, t) in self.tokens.iter().enumerate() {
            let key = format!("admin.tokens[{i}]");
            if t.name.is_empty() || !names.insert(t.name.as_str()) {
                return Err(invalid(
                    &key,
                    format!("name {:?} is empty or repeated", t.name),
                ));
            }
            t.validate(&key, secrets)?;
        }
        Ok(())
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
    /// The web console at `/ui/` (docs/console.md).
    pub console: ConsoleConfig,
    /// Connections, and how long a client may take to send a request (the other nodes'
    /// forwarded hooks and the backup Jobs' pulls come here too).
    pub connections: crate::listen::ConnectionLimits,
    /// Who may read `/metrics`, and whether it names tenants.
    pub metrics: MetricsAccess,
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
            console: ConsoleConfig::default(),
            connections: crate::listen::ConnectionLimits::default(),
            metrics: MetricsAccess::default(),
        }
    }
}

/// The web console the admin listener serves at `/ui/`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ConsoleConfig {
    /// Serve it (on by default).
    pub enabled: bool,
    /// How long a sign-in lasts without use, in milliseconds.
    pub session_ttl_ms: u64,
    /// The most sessions a node holds; a sign-in past it is refused.
    pub max_sessions: usize,
    /// The key tenant-portal links are signed with. Without it no link can be made. Give
    /// every node of a Relay the same one: a link then opens at any of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub portal_secret: Option<SecretSource>,
    /// The longest a portal link may live, in milliseconds.
    pub portal_max_ttl_ms: u64,
    /// Origins that may frame the tenant portal (CSP `frame-ancestors`); empty: none may.
    pub frame_ancestors: Vec<String>,
    /// The longest a console session lives from its sign-in, used or not.
    pub session_max_ms: u64,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig {
            enabled: true,
            session_ttl_ms: 3_600_000,
            max_sessions: 1_000,
            portal_secret: None,
            portal_max_ttl_ms: 30 * 86_400_000,
            frame_ancestors: Vec::new(),
            session_max_ms: 12 * 3_600_000,
        }
    }
}

impl ConsoleConfig {
    fn validate(&self, secrets: Secrets) -> Result<(), ConfigError> {
        in_range(
            "admin.console.session_ttl_ms",
            self.session_ttl_ms,
            60_000..=7 * 86_400_000,
        )?;
        in_range(
            "admin.console.max_sessions",
            self.max_sessions as u64,
            1..=1_000_000,
        )?;
        in_range(
            "admin.console.portal_max_ttl_ms",
            self.portal_max_ttl_ms,
            60_000..=366 * 86_400_000,
        )?;
        if let Some(s) = &self.portal_secret {
            if secrets
                .len(s, "admin.console.portal_secret")?
                .is_some_and(|n| n < 32)
            {
                return Err(invalid(
                    "admin.console.portal_secret",
                    "must be at least 32 bytes",
                ));
            }
        }
        in_range(
            "admin.console.session_max_ms",
            self.session_max_ms,
            60_000..=30 * 86_400_000,
        )?;
        for (i, o) in self.frame_ancestors.iter().enumerate() {
            if !is_https_origin(o) {
                return Err(invalid(
                    &format!("admin.console.frame_ancestors[{i}]"),
                    format!(
                        "{o:?} is not an HTTPS origin (https://host[:port], a host of letters, digits, dots and dashes, or *.host)"
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// `https://host[:port]`: a host of DNS labels (its first may be `*`, for every
/// subdomain), an optional port, nothing else — never `*` alone, `http://`, a path, or a
/// character a header or a CSP source list would read otherwise.
pub(crate) fn is_https_origin(o: &str) -> bool {
    let Some(rest) = o.strip_prefix("https://") else {
        return false;
    };
    let (host, port) = match rest.rsplit_once(':') {
        Some((h, p)) => (h, Some(p)),
        None => (rest, None),
    };
    let port_ok = port.is_none_or(|p| {
        !p.is_empty()
            && p.len() <= 5
            && p.bytes().all(|b| b.is_ascii_digit())
            && p.parse::<u32>().is_ok_and(|n| (1..=65_535).contains(&n))
    });
    let labels: Vec<&str> = host.split('.').collect();
    let label_ok = |(i, l): (usize, &&str)| {
        (i == 0 && *l == "*" && labels.len() > 2)
            || (!l.is_empty()
                && l.len() <= 63
                && !l.starts_with('-')
                && !l.ends_with('-')
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'))
    };
    port_ok && host.len() <= 253 && labels.iter().enumerate().all(label_ok)
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
    /// Reading `/metrics`, nothing else: a scraper's token.
    Metrics,
}

/// Who may read `/metrics`, and what it names (`admin.metrics`). Read at start.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsAccess {
    /// `/metrics` answers only a bearer token of admin or metrics scope (401 without one,
    /// 403 for another scope).
    pub token_required: bool,
    /// Series labelled with a tenant id (`tenant="…"`) are exported; `false` drops them.
    pub tenant_labels: bool,
}

impl Default for MetricsAccess {
    fn default() -> Self {
        MetricsAccess {
            token_required: false,
            tenant_labels: true,
        }
    }
}

impl TokenConfig {
    fn validate(&self, key: &str, secrets: Secrets) -> Result<(), ConfigError> {
        if secrets
            .len(&self.secret, &format!("{key}.secret"))?
            .is_some_and(|n| n < 16)
        {
            return Err(invalid(
                &format!("{key}.secret"),
                "must be at least 16 bytes",
            ));
        }
        if let ScopeConfig::Tenants(ts) = &self.scope {
            if ts.is_empty() {
                return Err(invalid(
                    &format!("{key}.scope.tenants"),
                    "must name a tenant",
                ));
            }
        }
        Ok(())
    }
}
