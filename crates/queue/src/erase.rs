//! Erasing a tenant (`DELETE /v1/tenants/{t}`): every key of it goes, in synced chunks,
//! and its ordinal stays as a tombstone (docs/storage.md, "Erasing a tenant").
//!
//! While a tenant is erasing (`m:erasing:<ord>`, and [`crate::tenants::Erasing`] in
//! memory) the writer refuses its hooks and dispatch makes no attempt for it. [`step`]
//! then does one chunk of the first part with something left, in this order:
//!
//! 1. its due and dead rows (counted purges, as `DELETE …/queue`);
//! 2. its archive obligations (`?a`, counted drops; one sweep of the obligations);
//! 3. deliveries in flight are waited for: their attempts end, a retry comes back as a due
//!    row and goes by 1;
//! 4. its active markers (`?A`; the purge leaves them to dispatch, one sweep) and its
//!    hooks: every row is gone, so reclaim takes them (passes until one has read every
//!    cleared marker there was);
//! 5. its archived copies (`?h` of its ordinal, with their `?y`);
//! 6. its hook log records, ids and events (one sweep of the log);
//! 7. its dedupe keys (`?u` of its id) and their expiry keys (one sweep of `?e`).
//!
//! A step that finds nothing anywhere answers [`Step::Clean`], and [`finish_ops`] gives
//! the last write: the counters (all zero by then, so the node aggregate is unchanged),
//! `?n`, the `?t` name (left empty), its pause, its limits and the erase marker. Every part
//! is idempotent and reads from the store, so an erase stopped anywhere (a crash) goes on
//! from a fresh [`Cursor`]; the sweeps start again from the beginning.

use ankusa_keyspace::{Cf, CounterField, Family, Seq, TenantOrd};
use ankusa_store::{Dir, Op, Rows, Store};

use crate::deliveries::{self, PurgeKinds};
use crate::{Change, QueueError};

/// Rows written (deleted) in one chunk.
pub const CHUNK: usize = 500;
/// Keys read in one chunk of a sweep over a whole family.
pub const SWEEP: usize = 5_000;

/// How far the sweeps of one erase have gone (in memory; a restart starts them again).
#[derive(Debug, Default, Clone)]
pub struct Cursor {
    obligations: Sweep<Seq>,
    markers: Sweep<Vec<u8>>,
    reclaimed: bool,
    hook_log: Sweep<Vec<u8>>,
    dedupe_expiry: Sweep<Vec<u8>>,
}

#[derive(Debug, Clone)]
enum Sweep<T> {
    From(Option<T>),
    Done,
}

impl<T> Default for Sweep<T> {
    fn default() -> Self {
        Sweep::From(None)
    }
}

/// What one [`step`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Worked on `part`, removing `removed` keys (0: a sweep moved on).
    Worked { part: &'static str, removed: u64 },
    /// Deliveries of the tenant are in flight: step again once their attempts end.
    Waiting { inflight: i64 },
    /// Nothing of the tenant is left but what [`finish_ops`] removes.
    Clean,
}

/// One chunk of tenant `tenant`'s (ordinal `ord`) erase (see the module's docs).
pub fn step(
    store: &Store,
    ord: TenantOrd,
    tenant: &str,
    cursor: &mut Cursor,
) -> Result<Step, QueueError> {
    let kinds = PurgeKinds {
        pending: true,
        dead: true,
    };
    let r = deliveries::purge_tenant_chunk(store, ord, kinds)?;
    if r.batches > 0 {
        return Ok(Step::Worked {
            part: "rows",
            removed: r.due + r.dead,
        });
    }
    if let Sweep::From(after) = cursor.obligations {
        let page = deliveries::archive_obligations(store, after, SWEEP)?;
        let mut tx = crate::Tx::new();
        let mine: Vec<_> = page.iter().filter(|o| o.ord == ord).collect();
        for ob in &mine {
            deliveries::archive_drop(&mut tx, ob);
        }
        tx.commit(store, true)?;
        cursor.obligations = match page.last() {
            Some(last) if page.len() == SWEEP => Sweep::From(Some(last.seq)),
            _ => Sweep::Done,
        };
        return Ok(Step::Worked {
            part: "archive obligations",
            removed: mine.len() as u64,
        });
    }
    let inflight = crate::counters::read_field(store, ord, CounterField::Inflight)?;
    if inflight > 0 {
        return Ok(Step::Waiting { inflight });
    }
    if matches!(cursor.markers, Sweep::From(_)) {
        let removed = sweep_chunk(store, Family::Active, &mut cursor.markers, |k, _| {
            Ok(if ankusa_keyspace::decode_active(k)?.1 == ord {
                vec![Op::delete(Cf::Index, k.to_vec())]
            } else {
                Vec::new()
            })
        })?;
        return Ok(Step::Worked {
            part: "active markers",
            removed,
        });
    }
    if !cursor.reclaimed {
        let r = crate::reclaim::reclaim_pass(store, SWEEP)?;
        cursor.reclaimed = r.markers < SWEEP as u64;
        return Ok(Step::Worked {
            part: "hooks",
            removed: r.hooks_removed,
        });
    }
    let removed = archived_chunk(store, ord)?;
    if removed > 0 {
        return Ok(Step::Worked {
            part: "archive",
            removed,
        });
    }
    if matches!(cursor.hook_log, Sweep::From(_)) {
        let removed = sweep_chunk(store, Family::HookLog, &mut cursor.hook_log, |k, v| {
            let record = ankusa_records::LogRecord::decode(v)
                .map_err(|e| QueueError::corrupt_at(Family::HookLog, k, e))?;
            if record.envelope.tenant_or_default() != tenant {
                return Ok(Vec::new());
            }
            let seq = ankusa_keyspace::decode_hook_log(k)?;
            let (a, b) = ankusa_keyspace::hook_events_of_seqs(seq, Seq(seq.0 + 1));
            let mut ops = vec![
                Op::DeleteRange {
                    cf: Cf::Audit,
                    from: a,
                    to: b,
                },
                Op::delete(Cf::Audit, k.to_vec()),
            ];
            ops.extend(
                ankusa_keyspace::hook_id(&record.envelope.id).map(|id| Op::delete(Cf::Audit, id)),
            );
            Ok(ops)
        })?;
        return Ok(Step::Worked {
            part: "hook log",
            removed,
        });
    }
    let removed = dedupe_chunk(store, tenant)?;
    if removed > 0 {
        return Ok(Step::Worked {
            part: "dedupe keys",
            removed,
        });
    }
    if matches!(cursor.dedupe_expiry, Sweep::From(_)) {
        let mut tail = tenant.as_bytes().to_vec();
        tail.push(0);
        let removed = sweep_chunk(
            store,
            Family::DedupeExpiry,
            &mut cursor.dedupe_expiry,
            |k, _| {
                // `?e`, the expiry, then the `?u` key's tail: `tenant\0idempotency key`.
                Ok(if k.get(9..).is_some_and(|t| t.starts_with(&tail)) {
                    vec![Op::delete(Cf::Index, k.to_vec())]
                } else {
                    Vec::new()
                })
            },
        )?;
        return Ok(Step::Worked {
            part: "dedupe expiry",
            removed,
        });
    }
    Ok(Step::Clean)
}

/// Up to [`CHUNK`] of tenant `ord`'s archived hooks removed, with their expiry entries
/// (one synced write); how many.
fn archived_chunk(store: &Store, ord: TenantOrd) -> Result<u64, QueueError> {
    let (lo, end) = ankusa_keyspace::archived_range(
        ord,
        ankusa_keyspace::AtMs(0),
        ankusa_keyspace::AtMs(u64::MAX),
    );
    let mut ops = Vec::new();
    for kv in store
        .scan(Family::ArchivedHooks, &lo, &end, Dir::Forward)?
        .take(CHUNK)
    {
        let (k, v) = kv?;
        let a = crate::archive::Archived::decode(&k, &v)?;
        ops.push(Op::delete(
            Cf::Archive,
            ankusa_keyspace::archive_expiry(a.expires, a.key.seq),
        ));
        ops.push(Op::delete(Cf::Archive, k));
    }
    let removed = ops.len() as u64 / 2;
    if !ops.is_empty() {
        store.write(ops, true)?;
    }
    Ok(removed)
}

/// Up to [`CHUNK`] of tenant `tenant`'s idempotency keys removed (one synced write); how
/// many. Their expiry entries go in their own sweep.
fn dedupe_chunk(store: &Store, tenant: &str) -> Result<u64, QueueError> {
    let (lo, end) = ankusa_keyspace::dedupe_tenant_range(tenant);
    let keys: Vec<Vec<u8>> = store
        .scan(Family::Dedupe, &lo, &end, Dir::Forward)?
        .take(CHUNK)
        .map(|kv| kv.map(|(k, _)| k))
        .collect::<Result<_, _>>()?;
    let removed = keys.len() as u64;
    if !keys.is_empty() {
        store.write(
            keys.into_iter().map(|k| Op::delete(Cf::Index, k)).collect(),
            true,
        )?;
    }
    Ok(removed)
}

/// One chunk of a sweep over the whole of `family` ([`SWEEP`] keys from where `sweep`
/// stands): `pick(key, value)` gives the ops that remove what belongs to the tenant (none:
/// not its). Written synced; `sweep` moves on, `Done` once a chunk read the family's end.
/// Returns the keys picked.
fn sweep_chunk(
    store: &Store,
    family: Family,
    sweep: &mut Sweep<Vec<u8>>,
    mut pick: impl FnMut(&[u8], &[u8]) -> Result<Vec<Op>, QueueError>,
) -> Result<u64, QueueError> {
    let Sweep::From(from) = sweep else {
        return Ok(0);
    };
    let (lo, end) = family.bounds();
    let from = from.clone().unwrap_or(lo);
    let mut ops = Vec::new();
    let mut picked = 0;
    let mut read = 0;
    let mut last = None;
    for kv in store.scan(family, &from, &end, Dir::Forward)?.take(SWEEP) {
        let (k, v) = kv?;
        read += 1;
        let mine = pick(&k, &v)?;
        if !mine.is_empty() {
            picked += 1;
            ops.extend(mine);
        }
        last = Some(k);
    }
    if !ops.is_empty() {
        store.write(ops, true)?;
    }
    *sweep = match last {
        Some(mut k) if read == SWEEP => {
            k.push(0);
            Sweep::From(Some(k))
        }
        _ => Sweep::Done,
    };
    Ok(picked)
}

/// The last write of tenant `tenant`'s erase, once [`step`] answered [`Step::Clean`]: its
/// counters (every one zero, so the node aggregate does not move), `?n`, its name in `?t`
/// (left empty: the ordinal is never handed out again), its pause, its limits and the
/// erase marker. An error if a counter is not zero (a row is still there).
pub fn finish_ops(store: &Store, ord: TenantOrd, tenant: &str) -> Result<Vec<Change>, QueueError> {
    let c = crate::counters::read(store, ord)?;
    if c != crate::counters::Counters::default() {
        return Err(QueueError::corrupt(
            Family::Counters,
            format!(
                "tenant {tenant:?} (ord {}) has no rows left but its counters are {c:?}",
                ord.0
            ),
        ));
    }
    let mut ops: Vec<Change> = CounterField::ALL
        .iter()
        .map(|f| Change(Op::delete(Cf::Counters, ankusa_keyspace::counter(ord, *f))))
        .collect();
    ops.push(Change(Op::delete(
        Cf::Tenants,
        ankusa_keyspace::tenant_ord(tenant),
    )));
    ops.push(Change(Op::put(
        Cf::Tenants,
        ankusa_keyspace::tenant_name(ord),
        Vec::new(),
    )));
    ops.push(crate::tenants::resume_op(ord));
    ops.push(crate::tenants::limits_op(tenant, None));
    ops.push(crate::tenants::erase_end_op(ord));
    Ok(ops)
}
