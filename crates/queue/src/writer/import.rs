//! The write that imports another node's handoff batch ([`crate::handoff`]), assembled by
//! the writer like a batch of hooks: the seqs and ordinals it takes are the writer's own.

use ankusa_keyspace::{AtMs, Family, Seq};
use ankusa_records::Envelope;
use ankusa_store::{Rows, Store};

use super::{next_seq, Assembled, Assembler, Import, Origin};
use crate::dedupe;
use crate::deliveries::{self, Tx};
use crate::QueueError;

impl Assembler {
    /// Builds the write that imports another node's batch ([`crate::handoff`]): each hook
    /// gets this node's next seq and its tenant's ordinal here (allocated if new), each
    /// dedupe key is kept unless this node holds a live one of its own, and the batch's
    /// number is recorded (or, taken back, its outbox entries deleted). `None` with the
    /// answer when nothing is to be written: the batch was imported (or taken back) before,
    /// or a tenant would be past `tenants.max`.
    pub fn assemble_import(
        &mut self,
        store: &Store,
        imp: &Import,
    ) -> Result<(Option<Assembled>, ImportReply), QueueError> {
        use ankusa_records::moved::Moved;
        if self.stale {
            self.next_seq = next_seq(store)?;
            self.alloc.reload();
            self.stale = false;
        }
        let Some(done_ops) = done_ops(store, imp)? else {
            return Ok((None, ImportReply::Already));
        };
        let (envelopes, record_ids, mut tenants) = decode_items(&imp.items)?;
        tenants.extend(envelopes.iter().map(Envelope::tenant_or_default));
        let resolution = self.alloc.resolve(store, tenants.iter().copied())?;
        let mut ords = std::collections::HashMap::new();
        for t in &tenants {
            match resolution.ords.get(*t) {
                Some(Ok(ord)) => {
                    ords.insert(t.to_string(), *ord);
                }
                Some(Err(QueueError::TenantLimit { .. })) => {
                    return Ok((None, ImportReply::TenantLimit))
                }
                _ => return Ok((None, ImportReply::Unavailable)),
            }
        }
        let mut tx = Tx::new();
        for op in &resolution.ops {
            tx.push_op(op.clone());
        }
        let mut next_seq = self.next_seq;
        let mut due = Vec::new();
        let (mut hooks, mut dedupes, mut archived, mut records) = (0u64, 0u64, 0u64, 0u64);
        let mut endpoints = 0u64;
        let mut ids = record_ids.iter();
        let mut envs = envelopes.iter();
        let now = ankusa_keyspace::now_ms();
        let dedupe_keys = dedupe_keys(&imp.items);
        let wanted: Vec<Vec<u8>> = dedupe_keys.iter().flatten().cloned().collect();
        let mut held = store
            .multi_get(ankusa_keyspace::Cf::Index, &wanted)?
            .into_iter();
        for (item, dkey) in imp.items.iter().zip(&dedupe_keys) {
            match item {
                Moved::Hook(h) => {
                    let Some(env) = envs.next() else { break };
                    let Some(ord) = ords.get(env.tenant_or_default()).copied() else {
                        continue;
                    };
                    let seq = Seq(next_seq);
                    next_seq += 1;
                    deliveries::import_hook(&mut tx, ord, seq, h, env);
                    for d in &h.deliveries {
                        if let ankusa_records::moved::MovedState::Due { at, .. } = d.state {
                            due.push((ord, AtMs(at)));
                        }
                    }
                    hooks += 1;
                }
                Moved::Archived {
                    received,
                    expires,
                    envelope,
                    ..
                } => {
                    let Some(env) = envs.next() else { break };
                    let Some(ord) = ords.get(env.tenant_or_default()).copied() else {
                        continue;
                    };
                    if *expires <= now {
                        continue;
                    }
                    let seq = Seq(next_seq);
                    next_seq += 1;
                    crate::archive::import_copy(
                        &mut tx,
                        ord,
                        seq,
                        AtMs(*received),
                        AtMs(*expires),
                        envelope,
                    );
                    archived += 1;
                }
                Moved::Logged { record, events, .. } => {
                    let Some(id) = ids.next() else { break };
                    let seq = Seq(next_seq);
                    next_seq += 1;
                    crate::hooklog::import_record(&mut tx, seq, id, record, events);
                    records += 1;
                }
                Moved::Dedupe { expires, id, .. } => {
                    let Some(k) = dkey else { continue };
                    let live_here = held
                        .next()
                        .flatten()
                        .and_then(|v| dedupe::decode_value(&v))
                        .is_some_and(|(e, _)| e > now);
                    if live_here || *expires <= now {
                        continue;
                    }
                    for op in dedupe::keep(k, *expires, id) {
                        tx.push_op(op);
                    }
                    dedupes += 1;
                }
                // Keyed by its tenant's id, it needs no ordinal: kept as it came.
                Moved::Endpoint { tenant, id, record } => {
                    tx.push(crate::endpoints::op(tenant, id, Some(record.clone())));
                    endpoints += 1;
                }
            }
        }
        if next_seq != self.next_seq {
            tx.push_op(ankusa_store::Op::put(
                ankusa_keyspace::Cf::Default,
                ankusa_keyspace::META_NEXT_SEQ.to_vec(),
                next_seq.to_be_bytes(),
            ));
        }
        for op in done_ops {
            tx.push_op(op);
        }
        Ok((
            Some(Assembled {
                tx,
                resolution,
                next_seq,
                outcomes: Vec::new(),
                due,
                started: Vec::new(),
            }),
            ImportReply::Imported {
                hooks,
                dedupe: dedupes,
                archived,
                records,
                endpoints,
            },
        ))
    }
}

/// The dedupe key of each item that is one (`None` for the others), in the items' order.
fn dedupe_keys(items: &[ankusa_records::moved::Moved]) -> Vec<Option<Vec<u8>>> {
    use ankusa_records::moved::Moved;
    items
        .iter()
        .map(|item| match item {
            Moved::Dedupe { tenant, key, .. } => ankusa_keyspace::dedupe(tenant, key),
            _ => None,
        })
        .collect()
}

/// The import's last ops: the batch's number recorded (from another node), or its outbox
/// entries deleted (taken back). `None`: the batch was imported, or taken back, before.
fn done_ops(store: &Store, imp: &Import) -> Result<Option<Vec<ankusa_store::Op>>, QueueError> {
    Ok(match &imp.from {
        Origin::Node(sender) => (crate::handoff::last_imported(store, sender)? < imp.batch)
            .then(|| vec![crate::handoff::imported_op(sender, imp.batch)]),
        Origin::TakenBack(receiver) => {
            Some(crate::handoff::take_back_ops(store, receiver, imp.batch)?)
                .filter(|ops| !ops.is_empty())
        }
    })
}

/// The envelopes of a batch's moved hooks and archived copies and the ids of its moved log
/// records, in the items' order, and the tenants of its dedupe keys. One that does not
/// decode is corruption (of the sender's rows, carried here).
#[allow(clippy::type_complexity)]
fn decode_items(
    items: &[ankusa_records::moved::Moved],
) -> Result<(Vec<Envelope>, Vec<String>, Vec<&str>), QueueError> {
    use ankusa_records::moved::Moved;
    let mut envelopes = Vec::new();
    let mut record_ids = Vec::new();
    let mut tenants: Vec<&str> = Vec::new();
    for item in items {
        match item {
            Moved::Hook(ankusa_records::moved::MovedHook { envelope, .. })
            | Moved::Archived { envelope, .. } => {
                let env = Envelope::decode(envelope).map_err(|e| {
                    QueueError::corrupt(Family::Hooks, format!("a moved hook: {e}"))
                })?;
                envelopes.push(env);
            }
            Moved::Dedupe { tenant, .. } => tenants.push(tenant),
            // A log record needs no ordinal: only its id, to index it by.
            Moved::Logged { record, .. } => {
                let r = ankusa_records::LogRecord::decode(record).map_err(|e| {
                    QueueError::corrupt(Family::HookLog, format!("a moved record: {e}"))
                })?;
                record_ids.push(r.envelope.id);
            }
            Moved::Endpoint { .. } => {}
        }
    }
    Ok((envelopes, record_ids, tenants))
}

/// The writer's answer to an [`Import`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportReply {
    /// Committed by a synced write: this many hooks, dedupe keys, archived copies, hook
    /// log records and tenants' endpoints.
    Imported {
        hooks: u64,
        dedupe: u64,
        archived: u64,
        records: u64,
        endpoints: u64,
    },
    /// This batch (or a later one) of the sender was imported before, or (taken back) is
    /// no longer in the outbox: nothing written.
    Already,
    /// A tenant of the batch would be past `tenants.max` on this node: nothing written.
    TenantLimit,
    /// The store failed, or an item does not decode: nothing written.
    Unavailable,
}
