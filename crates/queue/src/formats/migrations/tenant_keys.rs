//! Format 2 → 3 (docs/storage.md, "Format 2 → 3"): re-key due, inflight and dead rows by tenant ordinal, add the
//! ord to the dead and archive values, and seed the per-tenant counters.
//!
//! | phase | reads | writes, per row |
//! |---|---|---|
//! | 1 due (`?d`) | key, value, the hook (for the tenant) | delete `?d`; `?D` (kind 1 if due after the migration started, else 0) and its marker; pending or scheduled +1, bytes +size |
//! | 2 inflight (`?f`) | key, value, the hook | delete `?f`; `?F`; inflight +1, bytes +size |
//! | 3 dead (`?x`) | key, value, the delivery row (size), the hook | `?x` with the ord; `?X`; dead +1, bytes +size |
//! | 4 archive (`?a`) | key, value, the hook | `?a` with the ord; archive_pending +1 |
//! | 5 finish | — | delete the old `?d` and `?f` ranges (strays and their sentinels) |
//!
//! The cursor is `<<phase::8, started_at::64, last_old_key>>`: each step seeks just past
//! the last old key it moved (never to the family's start, where the moved keys are
//! tombstones), and `started_at` keeps the kind decision stable across resumes. A step moves
//! at most 500 rows; a phase with nothing left hands over to the next within the same step,
//! so an empty store migrates in one step.
//!
//! Tenants come from the hook envelope (`tenant` or `default`); a hook that is missing or
//! does not decode files its rows under `default`. Ordinals are allocated in first-sight
//! order within the step's batch (`?t`, `?n`, `m:next_ord` ride with the rows), read back
//! from the store by the next step, so each is allocated once. Past `tenants.max` the
//! migration goes on (the cap refuses new tenants at ingest; it never strands rows).
//!
//! Bytes: the design's phase 2 lists only `inflight +1`; this migration also adds the row's
//! size to `bytes`, because `bytes` counts every existing delivery row (due, inflight and
//! dead) and the counters must equal a fold of the families.

use std::collections::{BTreeMap, HashMap};

use crate::deliveries::{self, ArchiveObligation, DeadRow, DueRow, InflightRow, Kind, Tx};
use crate::formats::legacy::v2;
use crate::tenants;
use ankusa_keyspace::Cf;
use ankusa_keyspace::{DeadKey, DueKey, Family, InflightKey, Seq, TenantOrd};
use ankusa_records::DEFAULT_TENANT;
use ankusa_records::{DeadValue, DeliveryRow, Envelope};
use ankusa_store::migrate::{Migration, Step, MAX_STEP_ROWS};
use ankusa_store::{sentinel_ops, Dir, KeyValue, Op, Rows, Store, StoreError};

/// The 2 → 3 migration.
#[derive(Debug, Default, Clone, Copy)]
pub struct TenantKeys;

const PHASE_DUE: u8 = 1;
const PHASE_INFLIGHT: u8 = 2;
const PHASE_DEAD: u8 = 3;
const PHASE_ARCHIVE: u8 = 4;
const PHASE_FINISH: u8 = 5;

fn cursor(phase: u8, started: u64, last: &[u8]) -> Vec<u8> {
    let mut c = vec![phase];
    c.extend_from_slice(&started.to_be_bytes());
    c.extend_from_slice(last);
    c
}

fn parse(c: &[u8]) -> Result<(u8, u64, &[u8]), StoreError> {
    if c.is_empty() {
        return Ok((PHASE_DUE, ankusa_keyspace::now_ms(), &[]));
    }
    match c {
        [p, rest @ ..] if (PHASE_DUE..=PHASE_FINISH).contains(p) && rest.len() >= 8 => {
            let (t, last) = rest.split_at(8);
            let mut a = [0u8; 8];
            a.copy_from_slice(t);
            Ok((*p, u64::from_be_bytes(a), last))
        }
        _ => Err(StoreError::corruption(
            Family::Meta,
            format!("bad 2 -> 3 migration cursor {}", ankusa_keyspace::hex(c)),
        )),
    }
}

/// Tenant resolution within one step: existing ordinals from `?n`, new ones allocated in
/// first-sight order from `m:next_ord`.
struct Ords {
    next: u32,
    known: HashMap<String, TenantOrd>,
}

impl Ords {
    fn new(store: &Store) -> Result<Self, StoreError> {
        Ok(Ords {
            next: tenants::next_ord(store).map_err(super::super::step_error)?,
            known: HashMap::new(),
        })
    }

    /// The ordinals of `names` (in order), adding allocation ops to `tx` for new ones.
    fn resolve(&mut self, store: &Store, names: &[String], tx: &mut Tx) -> Result<(), StoreError> {
        let mut missing: Vec<&String> = names
            .iter()
            .filter(|n| !self.known.contains_key(*n))
            .collect();
        missing.dedup();
        let found = store.multi_get(
            Cf::Tenants,
            &missing
                .iter()
                .map(|n| ankusa_keyspace::tenant_ord(n))
                .collect::<Vec<_>>(),
        )?;
        for (name, v) in missing.into_iter().zip(found) {
            if self.known.contains_key(name) {
                continue;
            }
            let ord = match v.as_deref().and_then(ankusa_store::decode_u32) {
                Some(o) => TenantOrd(o),
                None => {
                    let o = TenantOrd(self.next);
                    self.next += 1;
                    for op in tenants::allocation_ops(name, o) {
                        tx.push_op(op);
                    }
                    o
                }
            };
            self.known.insert(name.clone(), ord);
        }
        Ok(())
    }

    fn get(&self, name: &str) -> TenantOrd {
        self.known
            .get(name)
            .copied()
            .unwrap_or(TenantOrd::AGGREGATE)
    }
}

/// The tenant of each hook (`default` for a missing or undecodable one).
fn tenants_of(store: &Store, seqs: &[Seq]) -> Result<BTreeMap<Seq, String>, StoreError> {
    let mut uniq = seqs.to_vec();
    uniq.sort();
    uniq.dedup();
    let hooks = store.multi_get(
        Cf::Hooks,
        &uniq
            .iter()
            .map(|s| ankusa_keyspace::hook(*s))
            .collect::<Vec<_>>(),
    )?;
    Ok(uniq
        .into_iter()
        .zip(hooks)
        .map(|(s, v)| {
            let t = v
                .and_then(|b| Envelope::decode(&b).ok())
                .and_then(|e| e.tenant)
                .filter(|t| tenants::validate(t).is_ok())
                .unwrap_or_else(|| DEFAULT_TENANT.to_owned());
            (s, t)
        })
        .collect())
}

fn after(last: &[u8], family: Family) -> Vec<u8> {
    if last.is_empty() {
        family.lo()
    } else {
        let mut k = last.to_vec();
        k.push(0);
        k
    }
}

fn read(store: &Store, family: Family, last: &[u8]) -> Result<Vec<KeyValue>, StoreError> {
    let (_, end) = family.bounds();
    store
        .scan(family, &after(last, family), &end, Dir::Forward)?
        .take(MAX_STEP_ROWS)
        .collect()
}

fn corrupt(family: Family, detail: String) -> StoreError {
    StoreError::corruption(family, detail)
}

impl Migration for TenantKeys {
    fn from(&self) -> u32 {
        2
    }

    fn to(&self) -> u32 {
        3
    }

    fn description(&self) -> &'static str {
        "re-key due/inflight/dead by tenant ordinal, seed per-tenant counters"
    }

    fn prepare(&self, _store: &Store) -> Result<Vec<Op>, StoreError> {
        // The new families of the index column family (tenants and counters got theirs
        // when their column families were created on open).
        Ok([
            Family::Due,
            Family::Inflight,
            Family::DeadByTenant,
            Family::Active,
        ]
        .into_iter()
        .flat_map(sentinel_ops)
        .collect())
    }

    fn step(&self, store: &Store, c: &[u8]) -> Result<Step, StoreError> {
        let (mut phase, started, last) = parse(c)?;
        let mut last = last.to_vec();
        let mut tx = Tx::new();
        let mut ords = Ords::new(store)?;
        let mut rows = 0u64;
        loop {
            let family = match phase {
                PHASE_DUE => Family::DueV2,
                PHASE_INFLIGHT => Family::InflightV2,
                PHASE_DEAD => Family::Dead,
                PHASE_ARCHIVE => Family::Archive,
                _ => {
                    for fam in [Family::DueV2, Family::InflightV2] {
                        let (from, to) = fam.bounds();
                        tx.push_op(Op::DeleteRange {
                            cf: Cf::Index,
                            from,
                            to,
                        });
                    }
                    return Ok(Step {
                        ops: tx.into_ops(),
                        next: None,
                        rows,
                    });
                }
            };
            let batch = read(store, family, &last)?;
            if batch.is_empty() {
                phase += 1;
                last.clear();
                continue;
            }
            rows += batch.len() as u64;
            let seqs: Vec<Seq> = batch
                .iter()
                .map(|(k, _)| seq_of(family, k))
                .collect::<Result<_, _>>()?;
            let names = tenants_of(store, &seqs)?;
            let in_order: Vec<String> = seqs.iter().map(|s| names[s].clone()).collect();
            ords.resolve(store, &in_order, &mut tx)?;
            match phase {
                PHASE_DUE => {
                    for (k, v) in &batch {
                        let (at, seq, sink) = ankusa_keyspace::decode_due_v2(k)?;
                        let size = v2::decode_size(v).ok_or_else(|| {
                            corrupt(
                                Family::DueV2,
                                format!("bad value at {}", ankusa_keyspace::hex(k)),
                            )
                        })?;
                        tx.push_op(Op::delete(Cf::Index, k.clone()));
                        let kind = if at.0 > started {
                            Kind::Retry
                        } else {
                            Kind::First
                        };
                        let ord = ords.get(&names[&seq]);
                        deliveries::import_due(
                            &mut tx,
                            &DueRow {
                                key: DueKey { ord, at, seq, sink },
                                size,
                                kind,
                            },
                        );
                    }
                }
                PHASE_INFLIGHT => {
                    for (k, v) in &batch {
                        let (seq, sink) = ankusa_keyspace::decode_inflight_v2(k)?;
                        let size = v2::decode_size(v).ok_or_else(|| {
                            corrupt(
                                Family::InflightV2,
                                format!("bad value at {}", ankusa_keyspace::hex(k)),
                            )
                        })?;
                        tx.push_op(Op::delete(Cf::Index, k.clone()));
                        let ord = ords.get(&names[&seq]);
                        deliveries::import_inflight(
                            &mut tx,
                            &InflightRow {
                                key: InflightKey { ord, seq, sink },
                                size,
                            },
                        );
                    }
                }
                PHASE_DEAD => {
                    let dkeys: Vec<DeadKey> = batch
                        .iter()
                        .map(|(k, _)| ankusa_keyspace::decode_dead(k))
                        .collect::<Result<_, _>>()?;
                    let drows = store.multi_get(
                        Cf::Deliveries,
                        &dkeys
                            .iter()
                            .map(|d| ankusa_keyspace::delivery(d.seq, d.sink))
                            .collect::<Vec<_>>(),
                    )?;
                    for ((key, (k, v)), drow) in dkeys.into_iter().zip(&batch).zip(drows) {
                        let old = v2::DeadValueV2::decode(v).map_err(|e| {
                            corrupt(Family::Dead, format!("{e} at {}", ankusa_keyspace::hex(k)))
                        })?;
                        let size = drow
                            .and_then(|r| DeliveryRow::decode(&r).ok())
                            .map_or(0, |r| r.size);
                        let value = DeadValue {
                            ord: ords.get(&names[&key.seq]),
                            size,
                            source: old.source,
                            hook_id: old.hook_id,
                            sink: String::new(),
                        };
                        deliveries::import_dead(&mut tx, &DeadRow { key, value });
                    }
                }
                _ => {
                    for (k, v) in &batch {
                        let seq = ankusa_keyspace::decode_archive(k)?;
                        let size = v2::decode_size(v).ok_or_else(|| {
                            corrupt(
                                Family::Archive,
                                format!("bad value at {}", ankusa_keyspace::hex(k)),
                            )
                        })?;
                        deliveries::import_archive(
                            &mut tx,
                            &ArchiveObligation {
                                seq,
                                ord: ords.get(&names[&seq]),
                                size,
                            },
                        );
                    }
                }
            }
            last = batch.last().map(|(k, _)| k.clone()).unwrap_or_default();
            return Ok(Step {
                ops: tx.into_ops(),
                next: Some(cursor(phase, started, &last)),
                rows,
            });
        }
    }
}

fn seq_of(family: Family, k: &[u8]) -> Result<Seq, StoreError> {
    Ok(match family {
        Family::DueV2 => ankusa_keyspace::decode_due_v2(k)?.1,
        Family::InflightV2 => ankusa_keyspace::decode_inflight_v2(k)?.0,
        Family::Dead => ankusa_keyspace::decode_dead(k)?.seq,
        _ => ankusa_keyspace::decode_archive(k)?,
    })
}
