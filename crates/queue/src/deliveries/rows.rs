//! The rows of the queue's index and what their values hold: due, inflight and dead
//! rows, and a due row's kind.

use ankusa_keyspace::{AtMs, CounterField, DeadKey, DueKey, InflightKey};
use ankusa_records::DeadValue;

use crate::QueueError;

/// Why a due row is waiting: kind 0 counts as `pending`, kind 1 as `scheduled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum Kind {
    /// First attempt, replay revival, recovery or expansion.
    First = 0,
    /// Waiting out (or just past) a retry backoff.
    Retry = 1,
}

impl Kind {
    pub(super) fn field(self) -> CounterField {
        match self {
            Kind::First => CounterField::Pending,
            Kind::Retry => CounterField::Scheduled,
        }
    }
}

/// A due row: its key fields and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DueRow {
    pub key: DueKey,
    pub size: u32,
    pub kind: Kind,
}

impl DueRow {
    pub fn decode(raw_key: &[u8], value: &[u8]) -> Result<DueRow, QueueError> {
        let key = ankusa_keyspace::decode_due(raw_key)?;
        match value {
            [a, b, c, d, k] if *k <= 1 => Ok(DueRow {
                key,
                size: u32::from_be_bytes([*a, *b, *c, *d]),
                kind: if *k == 0 { Kind::First } else { Kind::Retry },
            }),
            _ => Err(QueueError::corrupt_at(
                ankusa_keyspace::Family::Due,
                raw_key,
                format!("bad value {}", ankusa_keyspace::hex(value)),
            )),
        }
    }
}

/// An inflight row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct InflightRow {
    pub key: InflightKey,
    pub size: u32,
}

impl InflightRow {
    pub fn decode(raw_key: &[u8], value: &[u8]) -> Result<InflightRow, QueueError> {
        let key = ankusa_keyspace::decode_inflight(raw_key)?;
        let size = size_value(value).ok_or_else(|| {
            QueueError::corrupt_at(
                ankusa_keyspace::Family::Inflight,
                raw_key,
                format!("bad value {}", ankusa_keyspace::hex(value)),
            )
        })?;
        Ok(InflightRow { key, size })
    }

    /// The same delivery due again at `at` as `kind` (a retry, a boot recovery).
    pub fn due_at(&self, at: AtMs, kind: Kind) -> DueRow {
        DueRow {
            key: DueKey {
                ord: self.key.ord,
                at,
                seq: self.key.seq,
                sink: self.key.sink,
            },
            size: self.size,
            kind,
        }
    }
}

pub(super) fn size_value(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// A dead row: `?x` key and value (its `?X` twin carries the same key fields).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeadRow {
    pub key: DeadKey,
    pub value: DeadValue,
}

impl DeadRow {
    pub fn decode(key: &[u8], value: &[u8]) -> Result<DeadRow, QueueError> {
        Ok(DeadRow {
            key: ankusa_keyspace::decode_dead(key)?,
            value: DeadValue::decode(value)
                .map_err(|e| QueueError::corrupt_at(ankusa_keyspace::Family::Dead, key, e))?,
        })
    }
}

/// A due row's value: its size and kind.
pub(super) fn due_value(row: &DueRow) -> Vec<u8> {
    let mut v = row.size.to_be_bytes().to_vec();
    v.push(row.kind as u8);
    v
}
