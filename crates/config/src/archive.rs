//! Retained hooks (`archive`, and `archive:` of routes and sources).

use serde::{Deserialize, Serialize};

use crate::{invalid, positive, Config, ConfigError};

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
    #[serde(default = "crate::default_true")]
    pub enabled: bool,
    /// Absent: `archive.retention_ms`.
    #[serde(default)]
    pub retention_ms: Option<u64>,
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

impl ArchiveConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        positive("archive.retention_ms", self.retention_ms)?;
        positive("archive.settle_interval_ms", self.settle_interval_ms)?;
        positive("archive.settle_batch", self.settle_batch)?;
        positive("archive.prune_batch", self.prune_batch)
    }
}

impl ArchiveSetting {
    /// The `archive:` setting of a route or a source (`key`, e.g. `routes[0]`).
    pub(crate) fn validate(setting: &Option<ArchiveSetting>, key: &str) -> Result<(), ConfigError> {
        match setting {
            Some(ArchiveSetting {
                retention_ms: Some(0),
                ..
            }) => Err(invalid(
                &format!("{key}.archive.retention_ms"),
                "must be positive",
            )),
            _ => Ok(()),
        }
    }
}
