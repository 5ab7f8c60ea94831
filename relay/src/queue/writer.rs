//! The writer's batch assembly: the one place hooks become committed queue rows.
//!
//! The ingest writer task (one per node) owns an [`Assembler`]: it hands it the hooks of a
//! batch, gets back ONE [`Tx`] holding the tenant allocations, hooks, delivery rows, due
//! rows with their markers, archive obligations and counter merges, commits it with one
//! synced write, and only then acks the requests. The assembler owns commit order (`seq`)
//! and the tenant [`Allocator`]; nothing else allocates either.

use super::deliveries::{self, Envelope, NewHook, Tx};
use super::tenants::{Allocator, Resolution};
use super::QueueError;
use crate::store::keys::{self, Family, Seq};
use crate::store::{Dir, Store, StoreError};

/// A batch ready to commit, and what each hook of it will get.
#[derive(Debug)]
pub struct Assembled {
    tx: Tx,
    resolution: Resolution,
    next_seq: u64,
    /// Per hook, in input order: its seq, or why it is refused (nothing is written for it).
    pub outcomes: Vec<Result<Seq, QueueError>>,
}

/// Seq and tenant state of the writer.
#[derive(Debug)]
pub struct Assembler {
    alloc: Allocator,
    next_seq: u64,
}

impl Assembler {
    /// Starts after the highest `seq` in `hooks`.
    pub fn open(store: &Store, tenants_max: u32) -> Result<Self, StoreError> {
        let (lo, end) = Family::Hooks.bounds();
        let last = match store.first(Family::Hooks, &lo, &end, Dir::Reverse)? {
            Some((k, _)) => keys::decode_hook(&k)?.0,
            None => 0,
        };
        Ok(Assembler {
            alloc: Allocator::new(tenants_max),
            next_seq: last + 1,
        })
    }

    /// Builds one batch: resolves the batch's distinct tenants (cache, one `multi_get` for
    /// misses, new ordinals), assigns seqs, and adds each accepted hook's ingest ops.
    pub fn assemble(
        &mut self,
        store: &Store,
        hooks: &[Envelope],
        archive: bool,
    ) -> Result<Assembled, StoreError> {
        let resolution = self
            .alloc
            .resolve(store, hooks.iter().map(Envelope::tenant_or_default))?;
        let mut tx = Tx::new();
        for op in &resolution.ops {
            tx.push_op(op.clone());
        }
        let mut next_seq = self.next_seq;
        let mut outcomes = Vec::with_capacity(hooks.len());
        for env in hooks {
            let ord = match resolution.ords.get(env.tenant_or_default()) {
                Some(Ok(ord)) => *ord,
                Some(Err(QueueError::TenantLimit { max })) => {
                    outcomes.push(Err(QueueError::TenantLimit { max: *max }));
                    continue;
                }
                Some(Err(QueueError::InvalidTenant(why))) => {
                    outcomes.push(Err(QueueError::InvalidTenant(why)));
                    continue;
                }
                _ => {
                    outcomes.push(Err(QueueError::InvalidTenant("unresolved")));
                    continue;
                }
            };
            let seq = Seq(next_seq);
            next_seq += 1;
            deliveries::ingest(
                &mut tx,
                &NewHook {
                    seq,
                    ord,
                    envelope: env,
                    archive,
                },
            );
            outcomes.push(Ok(seq));
        }
        Ok(Assembled {
            tx,
            resolution,
            next_seq,
            outcomes,
        })
    }

    /// Commits an assembled batch as one write; on success the allocator caches the
    /// batch's ordinals and the seqs are spent. On failure nothing changes.
    pub fn commit(
        &mut self,
        store: &Store,
        batch: Assembled,
        sync: bool,
    ) -> Result<Vec<Result<Seq, QueueError>>, StoreError> {
        batch.tx.commit(store, sync)?;
        self.alloc.committed(&batch.resolution);
        self.next_seq = batch.next_seq;
        Ok(batch.outcomes)
    }
}
