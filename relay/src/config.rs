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

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Where the store lives.
    pub data_dir: PathBuf,
    pub admin: AdminConfig,
    pub tenants: TenantsConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            data_dir: PathBuf::from("./data"),
            admin: AdminConfig::default(),
            tenants: TenantsConfig::default(),
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdminConfig {
    /// The admin listener: health, readiness, node status, metrics.
    pub listen: SocketAddr,
    /// How often the queue gauges are read, in milliseconds.
    pub gauge_interval_ms: u64,
}

impl Default for AdminConfig {
    fn default() -> Self {
        AdminConfig {
            listen: SocketAddr::from(([0, 0, 0, 0], 9090)),
            gauge_interval_ms: 15_000,
        }
    }
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

/// The range `tenants.max` must fall in (ordinal `u32::MAX` is reserved).
pub const TENANTS_MAX_RANGE: std::ops::RangeInclusive<u32> = 1..=4_294_967_294;

impl Config {
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
        let mut doc: serde_yaml::Value = if text.trim().is_empty() {
            serde_yaml::Value::Mapping(Default::default())
        } else {
            serde_yaml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?
        };
        for (k, v) in env {
            if let Some(path) = k.strip_prefix("ANKUSA_") {
                apply_override(&mut doc, path, &v)?;
            }
        }
        let cfg: Config =
            serde_yaml::from_value(doc).map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Range and cross-field checks.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if !TENANTS_MAX_RANGE.contains(&self.tenants.max) {
            return Err(invalid(
                "tenants.max",
                format!("{} is outside 1..=4294967294", self.tenants.max),
            ));
        }
        if !(100..=3_600_000).contains(&self.admin.gauge_interval_ms) {
            return Err(invalid(
                "admin.gauge_interval_ms",
                format!("{} is outside 100..=3600000", self.admin.gauge_interval_ms),
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "must not be empty"));
        }
        Ok(())
    }
}

fn apply_override(doc: &mut serde_yaml::Value, path: &str, raw: &str) -> Result<(), ConfigError> {
    let segments: Vec<String> = path.split("__").map(|s| s.to_ascii_lowercase()).collect();
    let key = segments.join(".");
    if segments.iter().any(|s| s.is_empty()) {
        return Err(invalid(&key, "malformed environment override name"));
    }
    let value: serde_yaml::Value =
        serde_yaml::from_str(raw).map_err(|e| invalid(&key, format!("bad override: {e}")))?;
    let mut node = doc;
    for (i, seg) in segments.iter().enumerate() {
        let map = match node {
            serde_yaml::Value::Mapping(m) => m,
            _ => return Err(invalid(&key, "overrides a key that is not a mapping")),
        };
        let k = serde_yaml::Value::String(seg.clone());
        if i + 1 == segments.len() {
            map.insert(k, value);
            return Ok(());
        }
        node = map
            .entry(k)
            .or_insert_with(|| serde_yaml::Value::Mapping(Default::default()));
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
    fn defaults_apply_and_env_overrides_win() {
        let c =
            Config::from_yaml("data_dir: /tmp/x\n", env(&[("ANKUSA_TENANTS__MAX", "12")])).unwrap();
        assert_eq!(c.tenants.max, 12);
        assert_eq!(c.admin.gauge_interval_ms, 15_000);
        assert_eq!(c.data_dir, PathBuf::from("/tmp/x"));
        let c = Config::from_yaml("", env(&[("ANKUSA_DATA_DIR", "/d"), ("OTHER", "1")])).unwrap();
        assert_eq!(c.data_dir, PathBuf::from("/d"));
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
        let e = Config::from_yaml("tenants:\n  max: 4294967295\n", env(&[])).unwrap_err();
        assert!(e.to_string().contains("tenants.max"), "{e}");
    }
}
