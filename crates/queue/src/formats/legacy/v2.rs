//! Format 2: the tenant-less layout (docs/storage.md, "Format 2 → 3").
//!
//! | family | cf | key | value |
//! |---|---|---|---|
//! | hooks | hooks | `<<seq::64>>` | envelope (the tenant, if any, only here) |
//! | delivery rows | deliveries | `<<seq::64, sink::16>>` | row |
//! | due | index | `<<?d, at::64, seq::64, sink::16>>` | `<<size::32>>` |
//! | inflight | index | `<<?f, seq::64, sink::16>>` | `<<size::32>>` |
//! | dead | index | `<<?x, at::64, seq::64, sink::16>>` | v2: source id, hook id (no ord) |
//! | archive obligation | index | `<<?a, seq::64>>` | `<<size::32>>` |
//!
//! No `tenants` or `counters` column family. [`Writer`] builds realistic format-2 stores
//! (for fixtures and upgrade tests); the 2 → 3 migration reads them through the decoders
//! here.
// Writes format-2 stores: their `?x` and `?a` keys are the same bytes as format 3's.
#![allow(clippy::disallowed_methods)]

use std::path::Path;

use ankusa_keyspace::Cf;
use ankusa_keyspace::{AtMs, DeadKey, Seq, SinkIdx};
use ankusa_records::codec::{Dec, DecodeError, Enc};
use ankusa_records::{DeliveryRow, Envelope};
use ankusa_store::{Op, OpenOptions, Rows, Store, StoreError};

/// The format this module writes.
pub const FORMAT: u32 = 2;

const DEAD_V2: u8 = 2;

/// A format-2 dead value: the DLQ listing fields, without the tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadValueV2 {
    pub source: String,
    pub hook_id: String,
}

impl DeadValueV2 {
    pub fn encode(&self) -> Vec<u8> {
        Enc::with_version(DEAD_V2)
            .str(&self.source)
            .str(&self.hook_id)
            .finish()
    }
    pub fn decode(v: &[u8]) -> Result<Self, DecodeError> {
        let mut d = Dec::new(v, "format 2 dead value");
        d.version(DEAD_V2)?;
        let out = DeadValueV2 {
            source: d.string()?,
            hook_id: d.string()?,
        };
        d.end()?;
        Ok(out)
    }
}

/// `<<size::32>>`, the value of `?d`, `?f` and format-2 `?a` rows.
pub fn decode_size(v: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(v.get(..4)?.try_into().ok()?))
}

/// Where a format-2 delivery is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    Due { at: AtMs },
    Inflight,
    Dead { at: AtMs },
}

/// Writes a format-2 store.
#[derive(Debug)]
pub struct Writer {
    pub store: Store,
}

impl Writer {
    /// Creates a new format-2 store at `path` (which must not hold a store).
    pub fn create(path: &Path) -> Result<Writer, StoreError> {
        let store = Store::open(
            path,
            &OpenOptions {
                create_if_missing: true,
                create_format: FORMAT,
                supported_format: FORMAT,
                ..OpenOptions::default()
            },
        )?;
        Ok(Writer { store })
    }

    /// A hook whose envelope is stored as given (it may not decode).
    pub fn raw_hook(&self, seq: Seq, bytes: Vec<u8>) -> Result<(), StoreError> {
        self.store.write(
            vec![Op::put(Cf::Hooks, ankusa_keyspace::hook(seq), bytes)],
            false,
        )
    }

    /// A hook with its deliveries: one per `(sink, state)`; `hook: None` writes the rows
    /// without the hook (a missing hook). Archive obligation if `archive`.
    pub fn hook(
        &self,
        seq: Seq,
        hook: Option<&Envelope>,
        size: u32,
        rows: &[(SinkIdx, State)],
        archive: bool,
    ) -> Result<(), StoreError> {
        let mut ops = Vec::new();
        if let Some(env) = hook {
            ops.push(Op::put(Cf::Hooks, ankusa_keyspace::hook(seq), env.encode()));
        }
        for (sink, state) in rows {
            let row = DeliveryRow {
                size,
                attempts: u32::from(matches!(state, State::Dead { .. })),
                ..DeliveryRow::default()
            };
            ops.push(Op::put(
                Cf::Deliveries,
                ankusa_keyspace::delivery(seq, *sink),
                row.encode(),
            ));
            let sz = size.to_be_bytes().to_vec();
            match state {
                State::Due { at } => {
                    ops.push(Op::put(
                        Cf::Index,
                        ankusa_keyspace::due_v2(*at, seq, *sink),
                        sz,
                    ));
                }
                State::Inflight => {
                    ops.push(Op::put(
                        Cf::Index,
                        ankusa_keyspace::inflight_v2(seq, *sink),
                        sz,
                    ));
                }
                State::Dead { at } => {
                    let v = DeadValueV2 {
                        source: hook.map_or("unknown".into(), |e| e.source.clone()),
                        hook_id: hook.map_or(format!("missing-{}", seq.0), |e| e.id.clone()),
                    };
                    let key = DeadKey {
                        at: *at,
                        seq,
                        sink: *sink,
                    };
                    ops.push(Op::put(Cf::Index, ankusa_keyspace::dead(&key), v.encode()));
                }
            }
        }
        if archive {
            ops.push(Op::put(
                Cf::Index,
                ankusa_keyspace::archive(seq),
                size.to_be_bytes(),
            ));
        }
        self.store.write(ops, false)
    }
}
