//! Handoff: a tenant's stored rows move to its owner when the node list changes.
//!
//! A tenant belongs to one node (rendezvous hashing over the node list). When the list
//! changes — a scale-down takes a node out, a scale-up brings one in — some tenants get a
//! new owner while their queued rows (due, scheduled, parked, dead), archive obligations,
//! hook log and dedupe keys sit on the node that stored them. The *sender* (that node)
//! hands them to the *receiver* (the new owner) in batches, each of which moves once:
//!
//! 1. **Stage** ([`stage`], one synced write on the sender): the batch's hooks and dedupe
//!    keys leave the sender's queue — every index row, delivery row, envelope, obligation,
//!    log record and event, with their counter deltas — and enter its outbox
//!    (`m:handoff_out:<receiver>\0<batch><item>`), numbered by `m:handoff_sent:<receiver>`.
//!    Each hook is a unit that commits only if every row it was read with is still there
//!    as read, so a claim, a replay, a purge or a park that came first keeps its row and
//!    the hook is read again later. Deliveries in flight are never staged: their hook
//!    waits until the attempt ends.
//! 2. **Import** (on the receiver, by its writer, one write made durable by the WAL sync of
//!    the hook batch it goes with, before its answer): the items get the
//!    receiver's seqs and ordinals and enter its queue with their counter deltas, and
//!    `m:handoff_in:<sender>` records the batch's number in the same write. A batch whose
//!    number is not above that record was imported already: it is answered as such and
//!    writes nothing.
//! 3. **Confirm** ([`confirm`], on the sender, once the receiver answered): the outbox
//!    entries of that batch go, in a write that is not synced (a kill that loses it leaves
//!    the batch to be sent again and answered as imported before; the next stage's synced
//!    write makes it durable).
//!
//! 4. **Take back** (instead of confirm): a batch its receiver will not import — it answers
//!    that the tenants are not its (a roll: the two nodes' lists differ for a while), or it
//!    has left the node list — comes back into the sender's own queue through the sender's
//!    writer ([`take_back_ops`] in the import's write, which deletes the batch's outbox
//!    entries); the next pass stages its rows again for the owner the sender's list names
//!    then, or keeps them when that is itself. (Without it, a batch staged for a node that
//!    then left waited in the outbox for ever: in no queue, counted nowhere.)
//!
//! A kill anywhere leaves every row in exactly one queue: before the stage's write, in the
//! sender's; after it, in the sender's outbox (in no queue: not counted, not delivered)
//! until the receiver's write, then in the receiver's. An outbox left by a kill is sent
//! again at the next start ([`outbox`]); the receiver's record makes that a no-op if it had
//! the batch. A sender stages a receiver's next batch only once the last one is confirmed,
//! so the numbers a receiver sees from one sender only grow. The counters equal the fold on
//! each node after every write, since every write carries its own deltas.

use ankusa_keyspace::{Cf, Family, TenantOrd};
use ankusa_records::moved::Moved;
use ankusa_store::{Dir, Op, Rows, Store};

use crate::deliveries::{self, Tx};
use crate::QueueError;

/// Hooks staged in one batch, at most.
pub const BATCH_HOOKS: usize = 256;
/// Bytes staged in one batch, about (bodies, records and events).
pub const BATCH_BYTES: usize = 4 << 20;

/// `m:handoff_out:<receiver>\0<batch::64><item::32>` → a [`Moved`] item.
const OUT_PREFIX: &[u8] = b"m:handoff_out:";
/// `m:handoff_sent:<receiver>` → the number of the last batch staged for it.
const SENT_PREFIX: &[u8] = b"m:handoff_sent:";
/// `m:handoff_in:<sender>` → the number of the last batch imported from it.
const IN_PREFIX: &[u8] = b"m:handoff_in:";

fn named(prefix: &[u8], name: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(name.as_bytes());
    k
}

fn out_key(receiver: &str, batch: u64, item: u32) -> Vec<u8> {
    let mut k = named(OUT_PREFIX, receiver);
    k.push(0);
    k.extend_from_slice(&batch.to_be_bytes());
    k.extend_from_slice(&item.to_be_bytes());
    k
}

/// Refused while a batch for `receiver` waits for its answer (one at a time: a receiver
/// sees one sender's numbers only grow).
fn none_waiting(store: &Store, receiver: &str) -> Result<(), QueueError> {
    let (lo, hi) = out_range(receiver);
    if store.first(Family::Meta, &lo, &hi, Dir::Forward)?.is_some() {
        return Err(QueueError::HandoffStaged {
            receiver: receiver.to_owned(),
        });
    }
    Ok(())
}

/// Batch `batch` for `receiver`, as just staged.
fn staged(store: &Store, receiver: &str, batch: u64) -> Result<Option<Outbox>, QueueError> {
    Ok(outbox(store)?
        .into_iter()
        .find(|o| o.receiver == receiver && o.batch == batch))
}

/// The keys of `receiver`'s outbox (every batch), as a range.
fn out_range(receiver: &str) -> (Vec<u8>, Vec<u8>) {
    let mut lo = named(OUT_PREFIX, receiver);
    let mut hi = lo.clone();
    lo.push(0);
    hi.push(1);
    (lo, hi)
}

fn read_u64(store: &Store, key: &[u8]) -> Result<u64, QueueError> {
    match store.get(Cf::Default, key)? {
        None => Ok(0),
        Some(v) => Ok(u64::from_be_bytes(v.as_slice().try_into().map_err(
            |_| QueueError::corrupt_at(Family::Meta, key, "not 8 bytes"),
        )?)),
    }
}

/// A staged batch waiting for its receiver's answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outbox {
    pub receiver: String,
    pub batch: u64,
    pub items: Vec<Moved>,
}

impl Outbox {
    /// Hooks in the batch.
    pub fn hooks(&self) -> usize {
        self.items
            .iter()
            .filter(|m| matches!(m, Moved::Hook(_)))
            .count()
    }
}

/// The staged batches that wait for an answer, one per receiver at most, in receiver order.
pub fn outbox(store: &Store) -> Result<Vec<Outbox>, QueueError> {
    let lo = OUT_PREFIX.to_vec();
    let mut hi = lo.clone();
    hi.push(0xFF);
    let mut out: Vec<Outbox> = Vec::new();
    for kv in store.scan(Family::Meta, &lo, &hi, Dir::Forward)? {
        let (k, v) = kv?;
        let rest = &k[OUT_PREFIX.len()..];
        let Some(zero) = rest.iter().position(|b| *b == 0) else {
            return Err(QueueError::corrupt_at(Family::Meta, &k, "outbox key"));
        };
        let receiver = String::from_utf8_lossy(&rest[..zero]).into_owned();
        let batch = rest
            .get(zero + 1..zero + 9)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_be_bytes)
            .ok_or_else(|| QueueError::corrupt_at(Family::Meta, &k, "outbox key"))?;
        let item = Moved::decode(&v).map_err(|e| QueueError::corrupt_at(Family::Meta, &k, e))?;
        match out.last_mut() {
            Some(o) if o.receiver == receiver && o.batch == batch => o.items.push(item),
            _ => out.push(Outbox {
                receiver,
                batch,
                items: vec![item],
            }),
        }
    }
    Ok(out)
}

/// Items in every outbox (a gauge: what was staged and is not confirmed yet).
pub fn outbox_len(store: &Store) -> Result<u64, QueueError> {
    let lo = OUT_PREFIX.to_vec();
    let mut hi = lo.clone();
    hi.push(0xFF);
    let mut n = 0;
    for kv in store.scan(Family::Meta, &lo, &hi, Dir::Forward)? {
        kv?;
        n += 1;
    }
    Ok(n)
}

/// Stages the next batch of tenant `tenant`'s (ordinal `ord`) rows for `receiver`: up to
/// [`BATCH_HOOKS`] hooks that owe deliveries and none in flight, then, in the room left,
/// its archived copies still inside their retention, then its dedupe keys still inside
/// their window. One synced write, which also drops the
/// tenant's orphans (rows whose hook the store lost: undeliverable anywhere; logged).
/// `None` when nothing of the tenant could be staged (nothing left, or everything in flight
/// or moving meanwhile).
/// Refused while an earlier batch for `receiver` waits for its answer: send that first.
pub fn stage(
    store: &Store,
    receiver: &str,
    ord: TenantOrd,
    tenant: &str,
    now_ms: u64,
) -> Result<Option<Outbox>, QueueError> {
    none_waiting(store, receiver)?;
    let movable = deliveries::movable_hooks(store, ord, BATCH_HOOKS, BATCH_BYTES)?;
    let mut items: Vec<Moved> = movable.hooks.into_iter().map(Moved::Hook).collect();
    // Then, in the room left, the tenant's archived copies still in their retention.
    let used: usize = items.iter().map(Moved::weight).sum();
    let room = BATCH_HOOKS.saturating_sub(items.len());
    if room > 0 && used < BATCH_BYTES {
        items.extend(crate::archive::movable_copies(
            store,
            ord,
            now_ms,
            room,
            BATCH_BYTES - used,
        )?);
    }
    let mut dedupe_keys = Vec::new();
    let room = BATCH_HOOKS.saturating_sub(items.len());
    if room > 0 {
        let (dlo, dhi) = ankusa_keyspace::dedupe_tenant_range(tenant);
        for kv in store
            .scan(Family::Dedupe, &dlo, &dhi, Dir::Forward)?
            .take(room)
        {
            let (k, v) = kv?;
            let Some((expires, id)) = crate::dedupe::decode_value(&v) else {
                continue;
            };
            if expires <= now_ms {
                continue;
            }
            items.push(Moved::Dedupe {
                tenant: tenant.to_owned(),
                key: k[dlo.len()..].to_vec(),
                expires,
                id,
            });
            dedupe_keys.push((k, v));
        }
    }
    let mut tx = Tx::new();
    for o in &movable.orphans {
        deliveries::drop_orphan(&mut tx, ord, o);
    }
    if items.is_empty() {
        if !movable.orphans.is_empty() {
            orphans_dropped(tenant, &tx.commit(store, true)?.moved);
        }
        return Ok(None);
    }
    let sent_key = named(SENT_PREFIX, receiver);
    let batch = read_u64(store, &sent_key)? + 1;
    let mut dedupe = dedupe_keys.iter();
    for (i, item) in items.iter().enumerate() {
        let outbox = (out_key(receiver, batch, i as u32), item.encode());
        match item {
            Moved::Hook(h) => deliveries::stage_hook(&mut tx, ord, h, outbox),
            Moved::Dedupe { expires, .. } => {
                if let Some((k, v)) = dedupe.next() {
                    deliveries::stage_dedupe(&mut tx, k, v, *expires, outbox);
                }
            }
            Moved::Archived { .. } => {
                crate::archive::stage_copy(&mut tx, ord, item);
                tx.push_op(Op::put(Cf::Default, outbox.0, outbox.1));
            }
            // Records and endpoints move in batches of their own (stage_records,
            // stage_endpoints).
            Moved::Logged { .. } | Moved::Endpoint { .. } => {}
        }
    }
    tx.push_op(Op::put(Cf::Default, sent_key, batch.to_be_bytes()));
    let committed = tx.commit(store, true)?;
    if !movable.orphans.is_empty() {
        // The orphans' units come first in the batch.
        let n = movable.orphans.len().min(committed.moved.len());
        orphans_dropped(tenant, &committed.moved[..n]);
    }
    staged(store, receiver, batch)
}

/// Stages a batch of hook log records (from [`crate::hooklog::movable_records`], each of a
/// tenant `receiver` owns) for `receiver`: their records, ids and events leave this node's
/// log and enter its outbox, in one synced write, under the next batch number. What a
/// leaving node does once its tenants' rows have moved. Refused while an earlier batch for
/// `receiver` waits for its answer.
pub fn stage_records(
    store: &Store,
    receiver: &str,
    records: &[crate::hooklog::MovableRecord],
) -> Result<Option<Outbox>, QueueError> {
    none_waiting(store, receiver)?;
    if records.is_empty() {
        return Ok(None);
    }
    let sent_key = named(SENT_PREFIX, receiver);
    let batch = read_u64(store, &sent_key)? + 1;
    let mut tx = Tx::new();
    for (i, r) in records.iter().enumerate() {
        crate::hooklog::stage_record(&mut tx, r);
        tx.push_op(Op::put(
            Cf::Default,
            out_key(receiver, batch, i as u32),
            r.item.encode(),
        ));
    }
    tx.push_op(Op::put(Cf::Default, sent_key, batch.to_be_bytes()));
    tx.commit(store, true)?;
    staged(store, receiver, batch)
}

/// Stages tenants' endpoints (`(tenant, id, record)`, each of a tenant `receiver` owns) for
/// `receiver`: they leave this node's store and enter its outbox, in one synced write, under
/// the next batch number (at most [`BATCH_HOOKS`] a batch). Refused while an earlier batch
/// for `receiver` waits for its answer.
pub fn stage_endpoints(
    store: &Store,
    receiver: &str,
    endpoints: &[(String, String, Vec<u8>)],
) -> Result<Option<Outbox>, QueueError> {
    none_waiting(store, receiver)?;
    if endpoints.is_empty() {
        return Ok(None);
    }
    let sent_key = named(SENT_PREFIX, receiver);
    let batch = read_u64(store, &sent_key)? + 1;
    let mut ops = Vec::with_capacity(2 * endpoints.len() + 1);
    for (i, (tenant, id, record)) in endpoints.iter().take(BATCH_HOOKS).enumerate() {
        let item = Moved::Endpoint {
            tenant: tenant.clone(),
            id: id.clone(),
            record: record.clone(),
        };
        ops.push(crate::endpoints::op(tenant, id, None).0);
        ops.push(Op::put(
            Cf::Default,
            out_key(receiver, batch, i as u32),
            item.encode(),
        ));
    }
    ops.push(Op::put(Cf::Default, sent_key, batch.to_be_bytes()));
    store.write(ops, true)?;
    staged(store, receiver, batch)
}

/// Logs the orphans of `tenant` a stage dropped (`moved`: their units' outcomes).
fn orphans_dropped(tenant: &str, moved: &[bool]) {
    let dropped = moved.iter().filter(|m| **m).count();
    if dropped > 0 {
        tracing::warn!(
            tenant,
            dropped,
            "handoff: dropped rows whose hook this store had lost (undeliverable anywhere)"
        );
    }
}

/// The deletes of batch `batch`'s outbox entries for `receiver` (none: the batch is not
/// in the outbox).
fn batch_deletes(store: &Store, receiver: &str, batch: u64) -> Result<Vec<Op>, QueueError> {
    let lo = out_key(receiver, batch, 0);
    let hi = out_key(receiver, batch + 1, 0);
    let mut ops = Vec::new();
    for kv in store.scan(Family::Meta, &lo, &hi, Dir::Forward)? {
        let (k, _) = kv?;
        ops.push(Op::delete(Cf::Default, k));
    }
    Ok(ops)
}

/// The ops that take batch `batch` back from `receiver`'s outbox (its entries deleted), for
/// the write that imports its items into this node's own queue again
/// ([`crate::writer::Origin::TakenBack`]); none when the batch is not in the outbox (taken
/// back or confirmed already).
///
/// Only for a batch its receiver did not import and will not: it answered that the tenants
/// are not its (a receiver answers a batch it imported as such first, whatever its list
/// says now), or it is no longer in the node list. The batch's number stays used: the
/// receiver's numbers from this node still only grow.
pub fn take_back_ops(store: &Store, receiver: &str, batch: u64) -> Result<Vec<Op>, QueueError> {
    batch_deletes(store, receiver, batch)
}

/// The receiver answered batch `batch`: its outbox entries go.
pub fn confirm(store: &Store, receiver: &str, batch: u64) -> Result<(), QueueError> {
    let ops = batch_deletes(store, receiver, batch)?;
    if !ops.is_empty() {
        // Not synced: a kill that loses it leaves the outbox to be sent again, which the
        // receiver answers as imported before; the next stage's synced write covers it.
        store.write(ops, false)?;
    }
    Ok(())
}

/// The number of the last batch imported from `sender` (0: none).
pub fn last_imported(store: &Store, sender: &str) -> Result<u64, QueueError> {
    read_u64(store, &named(IN_PREFIX, sender))
}

/// The op recording batch `batch` of `sender` as imported (in the import's own write).
pub fn imported_op(sender: &str, batch: u64) -> Op {
    Op::put(Cf::Default, named(IN_PREFIX, sender), batch.to_be_bytes())
}

#[cfg(test)]
mod tests;
