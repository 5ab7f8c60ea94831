//! The store's errors ([`StoreError`]) and the corruptions this process found, per family
//! ([`corruptions`]).

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use ankusa_keyspace::Family;

use crate::stats::{every_family, family_slot, N_FAMILIES};

/// Errors of the store layer.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("data directory {0} does not exist")]
    Missing(PathBuf),
    #[error("{path} is not an Ankusa store: {reason}")]
    NotAStore { path: PathBuf, reason: String },
    #[error(
        "store format {found} is newer than this binary supports (format {supported}); \
         run a release that supports format {found}, or restore a backup taken before the upgrade"
    )]
    StoreFormatNewer { found: u32, supported: u32 },
    #[error("store corruption in family {}: {detail}", family.name())]
    Corruption { family: Family, detail: String },
    #[error("store corruption: {0}")]
    Key(#[from] ankusa_keyspace::KeyError),
    #[error("the store is open read-only")]
    ReadOnly,
    #[error("no migration from store format {from} towards {to} in this build")]
    NoMigrationPath { from: u32, to: u32 },
    #[error("migration {from} -> {to} failed at step {step}: {detail}")]
    Migration {
        from: u32,
        to: u32,
        step: u64,
        detail: String,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("rocksdb: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error(
        "the store at {} is held by another process{}: stop that node first, or give this one its own data_dir",
        path.display(),
        holder.map(|pid| format!(" (pid {pid}?)")).unwrap_or_default()
    )]
    Locked { path: PathBuf, holder: Option<u32> },
    /// The destination of a restore holds files.
    #[error(transparent)]
    NotEmpty(ankusa_tarball::TarballError),
}

impl StoreError {
    /// Corruption found in `family`. Every corruption is built here, and counted: the node
    /// exports the counts as `ankusa_store_corruption_errors_total{family}`
    /// ([`corruptions`]).
    pub fn corruption(family: Family, detail: impl Into<String>) -> Self {
        CORRUPTIONS[family_slot(family)].fetch_add(1, Ordering::Relaxed);
        StoreError::Corruption {
            family,
            detail: detail.into(),
        }
    }

    /// Whether RocksDB refused for lack of space (the disk is full, or the store reached
    /// its space limit): an error it resumes writing from by itself once space returns.
    /// Any other write error that lasts is one it does not resume from (see
    /// [`WriteHealth::stuck`]).
    pub fn is_no_space(&self) -> bool {
        // RocksDB's status text is its code, then its subcode's message.
        const NO_SPACE: [&str; 2] = [
            "IO error: No space left on device",
            "IO error: Space limit reached",
        ];
        match self {
            StoreError::Rocks(e) => {
                let text = e.to_string();
                NO_SPACE.iter().any(|p| text.starts_with(p))
            }
            _ => false,
        }
    }
}

/// Corruption found in this process so far, by family slot.
static CORRUPTIONS: [AtomicU64; N_FAMILIES] = [const { AtomicU64::new(0) }; N_FAMILIES];

/// How many times this process found each family corrupt (a scan cut short before its
/// sentinel, a row that does not decode), since it started: families never found corrupt
/// are left out.
pub fn corruptions() -> Vec<(Family, u64)> {
    every_family()
        .map(|f| (f, CORRUPTIONS[family_slot(f)].load(Ordering::Relaxed)))
        .filter(|(_, n)| *n > 0)
        .collect()
}
