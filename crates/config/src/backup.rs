//! Backups the node pushes itself (`backup`): to an S3-compatible bucket.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, ConfigError};

/// Backups the node takes on its own.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct BackupConfig {
    /// Incremental backups to an object store, every `interval_ms`; none when unset.
    pub object_store: Option<ObjectStoreConfig>,
}

/// Where and how often the node pushes its store (docs/deployment.md, backups).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ObjectStoreConfig {
    /// `s3://bucket/prefix`: the node pushes under `<prefix>/<node>/` (its name in
    /// `cluster.name`; `node` when it runs alone).
    pub url: String,
    /// The server's URL (an S3-compatible server's); unset: AWS S3 in `region`.
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default = "default_region")]
    pub region: String,
    /// PEM certificates trusted besides the system's, for an https endpoint signed by a
    /// private authority.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Credentials come from the environment (`AWS_ACCESS_KEY_ID` and
    /// `AWS_SECRET_ACCESS_KEY`, a web identity, a container's); without any, the cloud's
    /// instance metadata service is asked only when this is on, and otherwise requests go
    /// unsigned (a bucket open to the node's network).
    #[serde(default)]
    pub instance_metadata: bool,
    /// Time between the starts of two pushes (the first one a little after start).
    #[serde(default = "default_interval_ms")]
    pub interval_ms: u64,
    /// Backups kept under the node's prefix; a file goes when no kept backup names it.
    #[serde(default = "default_keep")]
    pub keep: usize,
    /// Also keep the newest backup of each store format older than the newest backup's:
    /// what a rollback to an older release restores (off: once the format upgrade is
    /// settled, they age out like the others).
    #[serde(default = "crate::default_true")]
    pub keep_older_formats: bool,
    /// The most a push uploads per second: what it may take of the node's network, disk
    /// and CPU while ingest goes on. 0: as fast as it goes.
    #[serde(default = "default_bytes_per_second")]
    pub max_bytes_per_second: u64,
}

/// 32 MiB/s: at the `sustain` load on two cores, a push at full speed doubled the ingest
/// p99 while it ran; at this pace it added half (the `backup` bench).
pub const DEFAULT_BACKUP_BYTES_PER_SECOND: u64 = 32 << 20;

fn default_bytes_per_second() -> u64 {
    DEFAULT_BACKUP_BYTES_PER_SECOND
}

fn default_region() -> String {
    "us-east-1".into()
}

fn default_interval_ms() -> u64 {
    300_000
}

fn default_keep() -> usize {
    24
}

impl ObjectStoreConfig {
    /// An `http://` endpoint: allowed only when it is named (a private network's server).
    pub fn allow_http(&self) -> bool {
        self.endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"))
    }
}

/// Where node `node` of a Relay whose bucket is `url` pushes: `<url>/<node>` (what the
/// operator's restores read).
pub fn s3_node_url(url: &str, node: &str) -> String {
    format!("{}/{node}", url.trim_end_matches('/'))
}

/// `s3://bucket/prefix` split: the bucket and the prefix (no slashes at its ends).
pub fn s3_location(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("s3://")
        .ok_or_else(|| format!("{url:?} is not an s3://bucket/prefix location"))?;
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(format!("{url:?} names no bucket"));
    }
    Ok((bucket.to_owned(), prefix.trim_matches('/').to_owned()))
}

impl BackupConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        let Some(o) = &self.object_store else {
            return Ok(());
        };
        s3_location(&o.url).map_err(|e| invalid("backup.object_store.url", e))?;
        if let Some(e) = &o.endpoint {
            if !(e.starts_with("http://") || e.starts_with("https://")) {
                return Err(invalid(
                    "backup.object_store.endpoint",
                    format!("{e:?} is not an http:// or https:// URL"),
                ));
            }
        }
        in_range(
            "backup.object_store.interval_ms",
            o.interval_ms,
            1_000..=86_400_000,
        )?;
        if o.max_bytes_per_second != 0 {
            in_range(
                "backup.object_store.max_bytes_per_second",
                o.max_bytes_per_second,
                1_048_576..=u64::MAX,
            )?;
        }
        in_range("backup.object_store.keep", o.keep, 1..=10_000)
    }
}
