//! Handoff, the node's side: the rows this node stores of tenants another node owns go to
//! that owner ([`Sender`]), and the rows another node hands this one come in through its
//! writer ([`receive`]). The protocol — stage, import, confirm — and why a row is never in
//! two queues or none is `ankusa_queue::handoff`'s (and docs/architecture.md's).
//!
//! A node's tenants change owner when the node list does: a node marked `leaving` owns
//! none (a scale-down drains it), a node that joins takes about 1/N of them (a scale-up
//! moves their rows to it). The sender runs one pass every `cluster.handoff_interval_ms` (at once
//! after a pass that moved something, and less often — up to every 5 min — while passes find
//! nothing to move): the outbox a kill left first, then every tenant
//! it stores whose owner is another node, a batch at a time, until each has nothing left
//! but deliveries in flight. The pass's account is the node's `cluster.handoff` status
//! (`GET /v1/node`): what is left to move, and why it does not move while it does not.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;

use super::Cluster;
use crate::metrics::{DirectionLabel, Metrics};
use ankusa_api::cluster::{HandoffAnswer, HandoffBatch, HandoffOutcome, HANDOFF_MAX_ITEMS};
use ankusa_api::error::ErrorCode;
use ankusa_api::node::HandoffStatus;
use ankusa_queue::engine::Store;
use ankusa_queue::handoff::{self, Outbox};
use ankusa_queue::writer::{Import, ImportReply, Origin, WriterHandle};
use ankusa_queue::QueueError;
use ankusa_records::moved::Moved;

/// Tenants read from the store per page of a pass.
const TENANT_PAGE: usize = 1_000;
/// The most tenants remembered as having nothing left here; past it the set is cleared (a
/// tenant forgotten is looked at again: a few reads).
const DONE_CEILING: usize = 1 << 20;
/// How long a receiver waits for its writer to import a batch.
const IMPORT_TIMEOUT: Duration = Duration::from_secs(30);

/// The longest wait between passes once they find nothing to move.
const SETTLED_MAX: Duration = Duration::from_secs(300);

/// What one pass did.
#[derive(Debug, Clone, Copy)]
pub struct Pass {
    /// Hooks handed over.
    pub moved: u64,
    /// Nothing of another node's tenants was found here, and nothing staged.
    pub settled: bool,
}

/// The sending side: passes over the tenants this node stores and does not own.
pub struct Sender {
    /// Between passes that moved nothing (`cluster.handoff_interval_ms`; zero: none run).
    interval: Duration,
    store: Arc<Store>,
    /// Takes a refused batch back into this node's queue (the seqs are the writer's).
    writer: WriterHandle,
    cluster: Arc<Cluster>,
    metrics: Arc<Metrics>,
    /// Tenants found with nothing left here (the node list is fixed for the process, so
    /// a tenant that moved away does not come back to this node).
    done: Mutex<HashSet<String>>,
    moved: AtomicU64,
}

impl Sender {
    pub fn new(
        store: Arc<Store>,
        writer: WriterHandle,
        cluster: Arc<Cluster>,
        interval: Duration,
    ) -> Self {
        Sender {
            interval,
            store,
            writer,
            metrics: cluster.metrics.clone(),
            cluster,
            done: Mutex::new(HashSet::new()),
            moved: AtomicU64::new(0),
        }
    }

    /// Runs passes until dropped: at once after a pass that moved something, else every
    /// `interval`. A single node has nothing to hand anyone; with no interval, none run.
    pub async fn run(self: Arc<Self>) {
        if !self.cluster.is_multi() || self.interval.is_zero() {
            return;
        }
        let mut wait = self.interval;
        loop {
            let pass = self.pass().await;
            if pass.moved > 0 {
                wait = self.interval;
                continue;
            }
            // A pass reads every tenant's name: once one finds nothing here of another
            // node's tenants, the next come less often (the node list is fixed for the
            // process; only a hook another node forwarded here during a roll adds any).
            wait = if pass.settled {
                (wait * 2).min(SETTLED_MAX)
            } else {
                self.interval
            };
            tokio::time::sleep(wait).await;
        }
    }

    /// One pass: the hooks it handed over, and whether it found nothing left to move.
    pub async fn pass(&self) -> Pass {
        let mut moved = 0;
        let mut stalled: Option<String> = None;
        // Receivers that did not take a batch this pass: their tenants wait for the next.
        let mut refused: HashSet<String> = HashSet::new();
        match self.blocking(handoff::outbox).await {
            Ok(outbox) => {
                for o in outbox {
                    let receiver = o.receiver.clone();
                    // A receiver no longer in the node list will never answer: its batch
                    // comes back here, for its tenants' owner now.
                    let sent = if self.cluster.members().iter().any(|m| m.name == receiver) {
                        self.send(o).await
                    } else {
                        self.take_back(o, "it is no longer in the node list")
                            .await
                            .map(|_| 0)
                    };
                    match sent {
                        Ok(n) => moved += n,
                        Err(e) => {
                            stalled = Some(e);
                            refused.insert(receiver);
                        }
                    }
                }
            }
            Err(e) => stalled = Some(format!("reading the outbox: {e}")),
        }
        // Tenants' endpoints go first, at once: their owner's hooks reach them there, and the
        // rows that follow find them. (Rows still here retry until they move too.)
        // (`left_behind`: endpoints, then hook log records, that could not move yet.)
        let (mut left_behind, failed) = self.move_endpoints(&mut refused).await;
        stalled = failed.or(stalled);
        let (mut tenants_leaving, mut rows_leaving) = (0u64, 0u64);
        let mut after: Option<String> = None;
        loop {
            let from = after.clone();
            let page = match self
                .blocking(move |s| ankusa_queue::tenants::list(s, "", from.as_deref(), TENANT_PAGE))
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    stalled = Some(format!("reading the tenants: {e}"));
                    break;
                }
            };
            let Some((last, _)) = page.last() else { break };
            after = Some(last.clone());
            for (tenant, ord) in page {
                let Some(owner) = self.cluster.other_owner(&tenant).map(|m| m.name.clone()) else {
                    continue;
                };
                // A tenant found with nothing left here gains rows again when a hook of it
                // is stored here after all (a node forwarded it during a roll, its owner
                // unreachable): one counter read says so, and it is handed over again.
                // (Without this look a leaving node reported itself drained over them.)
                if self.is_done(&tenant) {
                    match self
                        .blocking(move |s| ankusa_queue::counters::read(s, ord))
                        .await
                    {
                        Ok(c) if held(&c) == 0 => continue,
                        _ => self.unmark_done(&tenant),
                    }
                }
                let mut nothing_staged = false;
                while !refused.contains(&owner) {
                    let (o, t) = (owner.clone(), tenant.clone());
                    let now = ankusa_keyspace::now_ms();
                    match self
                        .blocking(move |s| handoff::stage(s, &o, ord, &t, now))
                        .await
                    {
                        Ok(Some(batch)) => match self.send(batch).await {
                            Ok(n) => moved += n,
                            Err(e) => {
                                stalled = Some(e);
                                refused.insert(owner.clone());
                            }
                        },
                        Ok(None) => {
                            nothing_staged = true;
                            break;
                        }
                        Err(e) => {
                            stalled = Some(format!("staging {tenant:?} for {owner}: {e}"));
                            refused.insert(owner.clone());
                        }
                    }
                }
                let left = match self
                    .blocking(move |s| ankusa_queue::counters::read(s, ord))
                    .await
                {
                    Ok(c) => held(&c),
                    Err(_) => 1,
                };
                if left == 0 && nothing_staged {
                    self.mark_done(&tenant);
                } else if left > 0 {
                    tenants_leaving += 1;
                    rows_leaving += left;
                }
            }
        }
        // A leaving node hands on its hook log too, once its tenants' rows have moved, so
        // that `GET /v1/hooks/{id}` still explains their hooks after it is gone.
        if self.cluster.leaving() && rows_leaving == 0 && stalled.is_none() {
            match self.move_records(&refused).await {
                Ok((n, left)) => {
                    moved += n;
                    left_behind |= left;
                }
                Err(e) => {
                    stalled = Some(e);
                    left_behind = true;
                }
            }
        }
        let staged = self.blocking(handoff::outbox_len).await.unwrap_or(0);
        self.metrics.handoff_rows_leaving.set(rows_leaving as i64);
        self.metrics.handoff_staged.set(staged as i64);
        let received = hooks_counter(&self.metrics, "received").get();
        self.cluster.set_handoff_status(HandoffStatus {
            tenants_leaving,
            rows_leaving,
            staged,
            hooks_moved: self.moved.load(Ordering::Relaxed),
            hooks_received: received,
            drained: rows_leaving == 0 && staged == 0 && stalled.is_none() && !left_behind,
            stalled,
            pass_at_ms: ankusa_keyspace::now_ms(),
        });
        Pass {
            moved,
            settled: rows_leaving == 0 && staged == 0 && tenants_leaving == 0 && !left_behind,
        }
    }

    /// Sends a staged batch and, once its receiver answered, forgets it: the hooks it held.
    /// A receiver that answers that a tenant of the batch is not its (its node list differs
    /// from this node's: a roll) gets it never — it answers a batch it imported as such,
    /// whatever its list — so the batch is taken back at once (and the send fails).
    async fn send(&self, o: Outbox) -> Result<u64, String> {
        let hooks = o.hooks() as u64;
        let body = HandoffBatch {
            from: self.cluster.me().unwrap_or_default().to_owned(),
            batch: o.batch,
            items: o
                .items
                .iter()
                .map(|m| base64::engine::general_purpose::STANDARD.encode(m.encode()))
                .collect(),
        };
        let answer = match self.cluster.send_handoff(&o.receiver, &body).await {
            Ok(a) => a,
            Err(e) if e.code == Some(ErrorCode::NotOwner) => {
                let (receiver, batch) = (o.receiver.clone(), o.batch);
                let why = format!("it answered: {}", e.reason);
                let back = self.take_back(o, &why).await?;
                return Err(format!(
                    "{receiver} refused batch {batch} ({}): {back} hooks taken back, to move once the node lists agree",
                    e.reason
                ));
            }
            Err(e) => return Err(e.to_string()),
        };
        if answer.batch != o.batch {
            return Err(format!(
                "{} answered batch {} for batch {}",
                o.receiver, answer.batch, o.batch
            ));
        }
        let (receiver, batch) = (o.receiver.clone(), o.batch);
        self.blocking(move |s| handoff::confirm(s, &receiver, batch))
            .await
            .map_err(|e| format!("confirming batch {} of {}: {e}", o.batch, o.receiver))?;
        self.moved.fetch_add(hooks, Ordering::Relaxed);
        hooks_counter(&self.metrics, "sent").inc_by(hooks);
        tracing::info!(receiver = %o.receiver, batch = o.batch, hooks, items = o.items.len(), "handoff: a batch moved to its owner");
        Ok(hooks)
    }

    /// Takes a staged batch back into this node's own queue, through its writer (one write
    /// that imports the items again and deletes the batch's outbox entries), because its
    /// receiver will not take it (`why`): the hooks it held. The next pass stages them again
    /// for their tenants' owner then — or keeps them, when that is this node.
    async fn take_back(&self, o: Outbox, why: &str) -> Result<u64, String> {
        let (receiver, batch) = (o.receiver.clone(), o.batch);
        let failed = |e: &dyn std::fmt::Display| {
            format!("taking batch {batch} for {receiver} back ({why}): {e}")
        };
        let reply = import(
            &self.writer,
            Origin::TakenBack(receiver.clone()),
            batch,
            o.items,
        )
        .await
        .map_err(|e| failed(&e))?;
        match reply {
            ImportReply::Imported {
                hooks,
                dedupe,
                archived,
                records,
                endpoints,
            } => {
                hooks_counter(&self.metrics, "taken_back").inc_by(hooks);
                if endpoints > 0 {
                    self.cluster.endpoints_moved();
                }
                tracing::warn!(%receiver, batch, hooks, dedupe, archived, records, endpoints, reason = why, "handoff: a staged batch taken back into this node's queue");
                Ok(hooks)
            }
            ImportReply::Already => Ok(0),
            ImportReply::TenantLimit => Err(failed(&"a tenant would be past tenants.max")),
            ImportReply::Unavailable => Err(failed(&"the writer could not write it now")),
        }
    }

    /// Moves the hook log's records of hooks this node no longer stores to their tenants'
    /// owners, a batch per owner at a time, walking the log once: the records moved, and
    /// whether some are left (a hook still stored here, a record of a tenant no other node
    /// owns). An owner in `refused` (it did not take a batch this pass) waits.
    async fn move_records(&self, refused: &HashSet<String>) -> Result<(u64, bool), String> {
        use ankusa_queue::hooklog::{self, MovableRecord};
        let (mut after, mut moved, mut left) = (None, 0u64, false);
        loop {
            let from = after;
            let page = self
                .blocking(move |s| {
                    hooklog::movable_records(s, from, handoff::BATCH_HOOKS, handoff::BATCH_BYTES)
                })
                .await
                .map_err(|e| format!("reading the hook log: {e}"))?;
            left |= page.stored > 0;
            let mut by_owner: std::collections::BTreeMap<String, Vec<MovableRecord>> =
                Default::default();
            for r in page.records {
                match self.cluster.other_owner(&r.tenant) {
                    Some(m) if !refused.contains(&m.name) => {
                        by_owner.entry(m.name.clone()).or_default().push(r)
                    }
                    _ => left = true,
                }
            }
            for (owner, records) in by_owner {
                let n = records.len() as u64;
                let to = owner.clone();
                let staged = self
                    .blocking(move |s| handoff::stage_records(s, &to, &records))
                    .await
                    .map_err(|e| format!("staging hook log records for {owner}: {e}"))?;
                if let Some(batch) = staged {
                    self.send(batch).await?;
                    moved += n;
                }
            }
            match page.next {
                Some(seq) => after = Some(seq),
                None => return Ok((moved, left)),
            }
        }
    }

    /// Moves the endpoints of tenants another node owns to it, a batch per owner at a time,
    /// walking them once: whether some are left (an owner in `refused` waits), and the last
    /// failure. An owner that does not take its batch joins `refused`: no row of its tenants
    /// moves this pass, so none reaches it before their endpoints.
    async fn move_endpoints(&self, refused: &mut HashSet<String>) -> (bool, Option<String>) {
        let (mut after, mut left, mut moved, mut failed) = (None, false, false, None);
        loop {
            let from = after.take();
            let page = match self
                .blocking(move |s| {
                    ankusa_queue::endpoints::page(s, from.as_deref(), handoff::BATCH_HOOKS)
                })
                .await
            {
                Ok(p) => p,
                Err(e) => {
                    failed = Some(format!("reading the endpoints: {e}"));
                    left = true;
                    break;
                }
            };
            let mut by_owner: std::collections::BTreeMap<String, Vec<(String, String, Vec<u8>)>> =
                Default::default();
            for (tenant, id, record) in page.items {
                match self.cluster.other_owner(&tenant) {
                    None => {}
                    Some(m) if refused.contains(&m.name) => left = true,
                    Some(m) => by_owner
                        .entry(m.name.clone())
                        .or_default()
                        .push((tenant, id, record)),
                }
            }
            for (owner, endpoints) in by_owner {
                let to = owner.clone();
                let staged = self
                    .blocking(move |s| handoff::stage_endpoints(s, &to, &endpoints))
                    .await;
                moved = true;
                let sent = match staged {
                    Ok(Some(batch)) => self.send(batch).await.map(|_| ()),
                    Ok(None) => Ok(()),
                    Err(e) => Err(format!("staging endpoints for {owner}: {e}")),
                };
                if let Err(e) = sent {
                    refused.insert(owner);
                    failed = Some(e);
                    left = true;
                }
            }
            match page.next {
                Some(k) => after = Some(k),
                None => break,
            }
        }
        if moved {
            self.cluster.endpoints_moved();
        }
        (left, failed)
    }

    fn is_done(&self, tenant: &str) -> bool {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(tenant)
    }

    fn unmark_done(&self, tenant: &str) {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(tenant);
    }

    fn mark_done(&self, tenant: &str) {
        let mut done = self.done.lock().unwrap_or_else(|e| e.into_inner());
        if done.len() >= DONE_CEILING {
            done.clear();
        }
        done.insert(tenant.to_owned());
    }

    async fn blocking<T: Send + 'static>(
        &self,
        f: impl FnOnce(&Store) -> Result<T, QueueError> + Send + 'static,
    ) -> Result<T, String> {
        let store = self.store.clone();
        match tokio::task::spawn_blocking(move || f(&store)).await {
            Ok(r) => r.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        }
    }
}

/// What a tenant's counters say this node still holds of it: its deliveries, and its
/// archive obligations (a delivered hook's copy is made here first, by this node's
/// archiver within a second, then moves as a copy).
fn held(c: &ankusa_queue::counters::Counters) -> u64 {
    (c.pending + c.scheduled + c.inflight + c.dead + c.archive_pending).max(0) as u64
}

/// Why a receiver did not take a batch.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// A malformed batch: an unknown sender, too many items, an item that does not decode.
    #[error("{0}")]
    Bad(String),
    /// A tenant of the batch is not this node's (the two nodes' lists disagree, a roll in
    /// progress): the sender keeps the batch and tries again.
    #[error("this node does not own tenant {0:?}")]
    NotOwner(String),
    /// A tenant would be past `tenants.max` here.
    #[error("a tenant of the batch would be past tenants.max on this node")]
    TenantLimit,
    /// The writer is busy or the store failed: nothing written, try again.
    #[error("the batch could not be imported now")]
    Unavailable,
}

/// Imports a batch another node handed this one, through the writer (one synced write,
/// once per batch number): the receiver's answer.
pub async fn receive(
    cluster: &Cluster,
    store: &Store,
    writer: &WriterHandle,
    batch: HandoffBatch,
) -> Result<HandoffAnswer, Refusal> {
    let metrics = &cluster.metrics;
    if !cluster.members().iter().any(|m| m.name == batch.from) || cluster.me() == Some(&batch.from)
    {
        return Err(Refusal::Bad(format!(
            "{:?} is not another node of this Relay",
            batch.from
        )));
    }
    if batch.items.len() > HANDOFF_MAX_ITEMS {
        return Err(Refusal::Bad(format!(
            "{} items; at most {HANDOFF_MAX_ITEMS}",
            batch.items.len()
        )));
    }
    // A batch imported before is answered as such first, whatever this node's list says
    // now: a sender takes back a batch refused as not this node's, so that refusal must
    // mean it is not here.
    let imported = handoff::last_imported(store, &batch.from).map_err(|e| {
        tracing::warn!(error = %e, from = %batch.from, "handoff: reading the batches imported");
        Refusal::Unavailable
    })?;
    if batch.batch <= imported {
        return Ok(already(batch.batch));
    }
    let mut items = Vec::with_capacity(batch.items.len());
    for (i, text) in batch.items.iter().enumerate() {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| Refusal::Bad(format!("items[{i}]: {e}")))?;
        let item = Moved::decode(&bytes).map_err(|e| Refusal::Bad(format!("items[{i}]: {e}")))?;
        let tenant = match &item {
            Moved::Hook(ankusa_records::moved::MovedHook { envelope, .. })
            | Moved::Archived { envelope, .. } => ankusa_records::Envelope::decode(envelope)
                .map_err(|e| Refusal::Bad(format!("items[{i}]: {e}")))?
                .tenant_or_default()
                .to_owned(),
            Moved::Dedupe { tenant, .. } | Moved::Endpoint { tenant, .. } => tenant.clone(),
            Moved::Logged { record, .. } => ankusa_records::LogRecord::decode(record)
                .map_err(|e| Refusal::Bad(format!("items[{i}]: {e}")))?
                .envelope
                .tenant_or_default()
                .to_owned(),
        };
        if cluster.other_owner(&tenant).is_some() || cluster.leaving() {
            return Err(Refusal::NotOwner(tenant));
        }
        items.push(item);
    }
    let reply = import(writer, Origin::Node(batch.from.clone()), batch.batch, items)
        .await
        .map_err(|_| Refusal::Unavailable)?;
    match reply {
        ImportReply::Imported {
            hooks,
            dedupe,
            archived,
            records,
            endpoints,
        } => {
            hooks_counter(metrics, "received").inc_by(hooks);
            if endpoints > 0 {
                cluster.endpoints_moved();
            }
            tracing::info!(from = %batch.from, batch = batch.batch, hooks, dedupe, archived, records, endpoints, "handoff: a batch imported");
            Ok(HandoffAnswer {
                batch: batch.batch,
                outcome: HandoffOutcome::Imported,
                hooks,
                dedupe,
                archived,
                records,
                endpoints,
            })
        }
        ImportReply::Already => Ok(already(batch.batch)),
        ImportReply::TenantLimit => Err(Refusal::TenantLimit),
        ImportReply::Unavailable => Err(Refusal::Unavailable),
    }
}

/// Hands a batch to the writer and waits for its answer, at most [`IMPORT_TIMEOUT`]; why
/// there is none (the writer's queue full, the writer late or stopped).
async fn import(
    writer: &WriterHandle,
    from: Origin,
    batch: u64,
    items: Vec<Moved>,
) -> Result<ImportReply, &'static str> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    writer
        .try_import(Import {
            from,
            batch,
            items,
            reply: tx,
        })
        .map_err(|_| "the writer's queue is full")?;
    tokio::time::timeout(IMPORT_TIMEOUT, rx)
        .await
        .map_err(|_| "the writer did not answer")?
        .map_err(|_| "the writer stopped")
}

/// `ankusa_handoff_hooks_total{direction}`: `sent`, `received` or `taken_back`.
fn hooks_counter(
    metrics: &Metrics,
    direction: &str,
) -> prometheus_client::metrics::counter::Counter {
    metrics
        .handoff_hooks
        .get_or_create(&DirectionLabel {
            direction: direction.into(),
        })
        .clone()
}

/// The answer to a batch imported before: nothing written now.
fn already(batch: u64) -> HandoffAnswer {
    HandoffAnswer {
        batch,
        outcome: HandoffOutcome::Already,
        hooks: 0,
        dedupe: 0,
        archived: 0,
        records: 0,
        endpoints: 0,
    }
}
