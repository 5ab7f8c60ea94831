//! The ingest writer: its queue and group commit (`writer`).

use serde::{Deserialize, Serialize};

use crate::{at_least, in_range, ConfigError};

impl WriterConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
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
