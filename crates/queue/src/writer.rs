//! The writer's batch assembly: the one place hooks become committed queue rows.
//!
//! The ingest writer task (one per node) owns an [`Assembler`]: it hands it the hooks of a
//! batch, gets back ONE [`Tx`] holding the tenant allocations, hooks, delivery rows, due
//! rows with their markers, archive obligations and counter merges, commits it with one
//! synced write, and only then acks the requests. The assembler owns commit order (`seq`)
//! and the tenant [`Allocator`]; nothing else allocates either.

use super::deliveries::{self, InflightRow, NewHook, Tx};
use super::hints::DueHints;
use super::tenants::{Allocator, Resolution};
use super::QueueError;
use ankusa_keyspace::{AtMs, Family, InflightKey, Seq, SinkIdx, TenantOrd};
use ankusa_records::Envelope;
use ankusa_store::{Dir, Rows, Store};

mod import;
pub use import::ImportReply;
mod sync;

use sync::{AfterSync, Syncer, Syncing, Written};

/// A batch ready to commit, and what each hook of it will get.
#[derive(Debug)]
pub struct Assembled {
    tx: Tx,
    resolution: Resolution,
    next_seq: u64,
    /// Per hook, in input order: its seq, or why it is refused (nothing is written for it).
    pub outcomes: Vec<Result<Seq, QueueError>>,
    /// The tenants given due rows, with each row's `at`: the dispatch tick's hints.
    pub due: Vec<(TenantOrd, AtMs)>,
    /// The deliveries written inflight for the pipeline to start at once ([`Starts`]):
    /// the hook's place in the input, its row, and the slots it runs with.
    pub started: Vec<(usize, InflightRow, StartSlot)>,
}

/// Where the writer offers a fresh hook's deliveries for a start at commit: the dispatch
/// pipeline, when it has caught up with every due row and the delivery's sink, its tenant
/// and the node have a slot free. Such a delivery is written inflight in the ingest batch
/// (never due, no marker, no claim): the pipeline starts it as soon as the batch commits,
/// with no tick, no read of the store and no claim commit. Anything [`Starts::try_start`]
/// refuses is written due, as always, and claimed by a tick in its tenant's turn.
pub trait Starts: Send + Sync {
    /// The slots for a delivery of tenant `ord`'s (`tenant`'s) fresh hook to sink `sink`
    /// (its id), or none: the row is then written due.
    fn try_start(&self, ord: TenantOrd, tenant: &str, sink: &str) -> Option<StartSlot>;
    /// After a commit that wrote due rows, once they are hinted: rows wait in the store
    /// (a tick that began before this has not seen their hints).
    fn waiting(&self);
    /// After the batch's commit, its started deliveries with their hooks. (After a failed
    /// commit the writer drops their slots and makes the rows due itself, before it
    /// assembles another batch: the store may hold them, a write whose sync failed being
    /// applied.)
    fn started(&self, rows: Vec<Started>);
}

/// The slots a started delivery holds, as [`Starts::try_start`] gave them (given back when
/// dropped; only the implementation knows what is inside).
pub struct StartSlot(pub Box<dyn std::any::Any + Send>);

impl std::fmt::Debug for StartSlot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StartSlot")
    }
}

/// A delivery written inflight by the ingest batch, for the pipeline to start.
#[derive(Debug)]
pub struct Started {
    pub row: InflightRow,
    pub envelope: std::sync::Arc<Envelope>,
    pub slot: StartSlot,
}

/// Seq and tenant state of the writer.
#[derive(Debug)]
pub struct Assembler {
    alloc: Allocator,
    next_seq: u64,
    /// A commit failed, so the store may or may not hold that batch (a write whose WAL
    /// sync failed is applied, and RocksDB may resume taking writes): the next batch reads
    /// `m:next_seq` and `m:next_ord` again, so neither a seq nor an ordinal is handed out
    /// twice whichever it was.
    stale: bool,
    /// Write each hook's hook log record ([`super::hooklog`]).
    log: bool,
    /// The sources whose hooks get an archive obligation.
    archived: std::collections::HashSet<String>,
    /// Tenants being erased: their hooks are refused.
    erasing: Option<std::sync::Arc<crate::tenants::Erasing>>,
    /// Erases ended when the ordinal cache was last trusted.
    erasures_seen: u64,
}

impl Assembled {
    /// Another op to commit with the batch (dedupe keys).
    pub(crate) fn push_op(&mut self, op: ankusa_store::Op) {
        self.tx.push_op(op);
    }
}

impl Assembler {
    /// Starts at `m:next_seq`, or after the highest `seq` in `hooks` and in the hook log
    /// (a store written before `m:next_seq`), whichever is higher: a seq is never handed
    /// out twice, even once reclaim has removed the newest hooks.
    pub fn open(store: &Store, tenants_max: u32) -> Result<Self, QueueError> {
        Ok(Assembler {
            alloc: Allocator::new(tenants_max),
            next_seq: next_seq(store)?,
            stale: false,
            log: false,
            archived: Default::default(),
            erasing: None,
            erasures_seen: 0,
        })
    }

    /// The `tenants.max` new tenants are held to: storing into it takes effect at the next
    /// batch ([`crate::tenants::Allocator::max_handle`]).
    pub fn tenants_max(&self) -> std::sync::Arc<std::sync::atomic::AtomicU32> {
        self.alloc.max_handle()
    }

    /// Refuses the hooks of the tenants `erasing` holds, and forgets its cached ordinals
    /// when an erase ends.
    pub fn erasing(mut self, erasing: std::sync::Arc<crate::tenants::Erasing>) -> Self {
        self.erasures_seen = erasing.ended();
        self.erasing = Some(erasing);
        self
    }

    /// Gives the hooks of these sources an archive obligation (`sources[].archive`,
    /// `routes[].archive`).
    pub fn archiving(mut self, sources: impl IntoIterator<Item = String>) -> Self {
        self.archived = sources.into_iter().collect();
        self
    }

    /// Logs every hook it assembles in the hook log (`hook_log.enabled`).
    pub fn logging(mut self, on: bool) -> Self {
        self.log = on;
        self
    }

    /// Builds one batch: resolves the batch's distinct tenants (cache, one `multi_get` for
    /// misses, new ordinals), assigns seqs, and adds each accepted hook's ingest ops.
    pub fn assemble<E: std::borrow::Borrow<Envelope>>(
        &mut self,
        store: &Store,
        hooks: &[E],
        archive: bool,
    ) -> Result<Assembled, QueueError> {
        self.assemble_except(store, hooks, archive, &[], None)
    }

    /// [`Assembler::assemble`], but the hooks whose place in `unarchived` is true get no
    /// archive obligation (hooks replayed from the archive, which has them already), and
    /// each delivery `starts` takes is written inflight for it to start at commit.
    pub fn assemble_except<E: std::borrow::Borrow<Envelope>>(
        &mut self,
        store: &Store,
        hooks: &[E],
        archive: bool,
        unarchived: &[bool],
        starts: Option<&dyn Starts>,
    ) -> Result<Assembled, QueueError> {
        if self.stale {
            self.next_seq = next_seq(store)?;
            self.alloc.reload();
            self.stale = false;
        }
        // The erasing tenants first, then the erases that ended: an erase ends its write,
        // counts itself ended, then lets its tenant go, so a hook not refused here sees the
        // count moved and is resolved afresh (a new ordinal), never to the erased one.
        let refused: Vec<bool> = match &self.erasing {
            Some(e) if !e.is_empty() => hooks
                .iter()
                .map(|h| e.contains(h.borrow().tenant_or_default()))
                .collect(),
            _ => Vec::new(),
        };
        let ended = self.erasing.as_ref().map(|e| e.ended());
        if let Some(ended) = ended.filter(|n| *n != self.erasures_seen) {
            self.forget_ordinals();
            self.erasures_seen = ended;
        }
        let is_refused = |i: usize| refused.get(i).copied().unwrap_or(false);
        let resolution = self.alloc.resolve(
            store,
            hooks
                .iter()
                .enumerate()
                .filter(|(i, _)| !is_refused(*i))
                .map(|(_, e)| e.borrow().tenant_or_default()),
        )?;
        let mut tx = Tx::new();
        for op in &resolution.ops {
            tx.push_op(op.clone());
        }
        let mut next_seq = self.next_seq;
        let mut outcomes = Vec::with_capacity(hooks.len());
        let mut due = Vec::with_capacity(hooks.len());
        let mut started = Vec::new();
        let mut starting: Vec<bool> = Vec::new();
        for (i, env) in hooks.iter().enumerate() {
            let env = env.borrow();
            if is_refused(i) {
                outcomes.push(Err(QueueError::TenantErasing));
                continue;
            }
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
            let archived = (archive || self.archived.contains(&env.source))
                && !unarchived.get(i).copied().unwrap_or(false);
            if env.sinks.is_empty() && !archived {
                // A hook every filter of its route left out: its log record alone (found
                // by its id as filtered). No hook row, no counter moves, nothing to
                // reclaim. (Archived, it is stored for its archive obligation alone.)
                if self.log {
                    crate::hooklog::log_ingest(&mut tx, seq, env);
                }
                outcomes.push(Ok(seq));
                continue;
            }
            let mut slots = Vec::new();
            starting.clear();
            if let Some(starts) = starts {
                for (k, sink) in env.sinks.iter().enumerate() {
                    let slot = starts.try_start(ord, env.tenant_or_default(), sink);
                    starting.push(slot.is_some());
                    slots.extend(slot.map(|s| (SinkIdx(k as u16), s)));
                }
            }
            let size = deliveries::ingest(
                &mut tx,
                &NewHook {
                    seq,
                    ord,
                    envelope: env,
                    archive: archived,
                    log: self.log,
                    started: &starting,
                },
            );
            if slots.len() < env.sinks.len() {
                due.push((ord, env.received_at));
            }
            for (sink, slot) in slots {
                let key = InflightKey { ord, seq, sink };
                started.push((i, InflightRow { key, size }, slot));
            }
            outcomes.push(Ok(seq));
        }
        if next_seq != self.next_seq {
            tx.push_op(ankusa_store::Op::put(
                ankusa_keyspace::Cf::Default,
                ankusa_keyspace::META_NEXT_SEQ.to_vec(),
                next_seq.to_be_bytes(),
            ));
        }
        Ok(Assembled {
            tx,
            resolution,
            next_seq,
            outcomes,
            due,
            started,
        })
    }

    /// Forgets every cached ordinal: the next batch looks its tenants up in the store (a
    /// tenant was erased, and its id has no ordinal any more).
    pub fn forget_ordinals(&mut self) {
        self.alloc.forget();
    }

    /// The store may hold more than this assembler handed out (a WAL sync failed after
    /// the batch was written): the next batch reads its seq and ordinal state again.
    pub fn mark_stale(&mut self) {
        self.stale = true;
    }

    /// Commits an assembled batch as one write; on success the allocator caches the
    /// batch's ordinals and the seqs are spent. On failure the batch may still be in the
    /// store (see `stale`), so the next batch starts from what the store holds.
    pub fn commit(
        &mut self,
        store: &Store,
        batch: Assembled,
        sync: bool,
    ) -> Result<Vec<Result<Seq, QueueError>>, QueueError> {
        if let Err(e) = batch.tx.commit(store, sync) {
            self.stale = true;
            return Err(e);
        }
        self.alloc.committed(&batch.resolution);
        self.next_seq = batch.next_seq;
        Ok(batch.outcomes)
    }
}

/// The next seq to hand out: `m:next_seq`, or after the highest `seq` in `hooks`, the hook
/// log, the delivery rows and the archive obligations, whichever is higher. One more than
/// the seqs the store has handed out: the hooks it acked, counted (`restore --report`
/// compares a replaced store's with its backup's).
pub fn next_seq(store: &Store) -> Result<u64, QueueError> {
    let mut next = match store.get(ankusa_keyspace::Cf::Default, ankusa_keyspace::META_NEXT_SEQ)? {
        Some(v) => u64::from_be_bytes(
            v.as_slice()
                .try_into()
                .map_err(|_| QueueError::corrupt(Family::Meta, "m:next_seq is not 8 bytes"))?,
        ),
        None => 1,
    };
    // Rows keyed by a seq whose hook is gone (a format-2 store's orphans, an archive
    // obligation kept past its hook) count too: a new hook must never take their seq, or
    // its rows would overwrite theirs and the counters drift from the fold.
    for family in [
        Family::Hooks,
        Family::HookLog,
        Family::Deliveries,
        Family::Archive,
    ] {
        let (lo, end) = family.bounds();
        if let Some((k, _)) = store.first(family, &lo, &end, Dir::Reverse)? {
            let seq = match family {
                Family::Hooks => ankusa_keyspace::decode_hook(&k)?,
                Family::Deliveries => ankusa_keyspace::decode_delivery(&k)?.0,
                Family::Archive => ankusa_keyspace::decode_archive(&k)?,
                _ => ankusa_keyspace::decode_hook_log(&k)?,
            };
            next = next.max(seq.0 + 1);
        }
    }
    Ok(next)
}

/// How many hooks the store holds from seq `from` on (those a backup up to `from` lacks,
/// for `restore --report`): a scan of that end of `hooks`.
pub fn hooks_from(store: &Store, from: Seq) -> Result<u64, QueueError> {
    let (_, end) = Family::Hooks.bounds();
    let mut held = 0;
    for row in store.scan(
        Family::Hooks,
        &ankusa_keyspace::hook(from),
        &end,
        Dir::Forward,
    )? {
        row?;
        held += 1;
    }
    Ok(held)
}

// ---------------------------------------------------------------------------------------
// The writer task.

/// One hook handed to the writer, and where its answer goes.
#[derive(Debug)]
pub struct Submission {
    pub envelope: Envelope,
    /// The idempotency key, if the source gives one; deduplicated per tenant.
    pub idempotency: Option<Vec<u8>>,
    /// Sent again from the archive: no new archive obligation.
    pub from_archive: bool,
    pub reply: tokio::sync::oneshot::Sender<Reply>,
    /// The submitter's span (its request's, or none): the batch's span follows from it,
    /// and records in it the batch's number (`batch`).
    pub span: tracing::Span,
}

/// The writer's answer to a submission.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Committed by a synced write.
    Accepted { id: String },
    /// Seen within the dedupe window; nothing was written.
    Duplicate { id: String },
    /// The tenant would be past `tenants.max`.
    TenantLimit,
    /// The tenant id is not acceptable.
    InvalidTenant(&'static str),
    /// The tenant is being erased.
    TenantErasing,
    /// The store failed the commit.
    Unavailable,
}

/// The writer's limits.
#[derive(Debug, Clone)]
pub struct WriterSettings {
    pub queue_capacity: usize,
    pub max_batch_hooks: usize,
    pub max_batch_bytes: usize,
    pub max_batch_delay: std::time::Duration,
    /// The gathering ends once no request has come for this long.
    pub max_batch_gap: std::time::Duration,
    /// Hand each written batch to the syncer and go on (`writer.pipeline`); otherwise
    /// the writer syncs it itself before the next batch.
    pub pipeline: bool,
    pub dedupe_window_ms: u64,
    pub sweep_batch: usize,
    pub sweep_interval: std::time::Duration,
    pub archive: bool,
}

impl WriterSettings {
    pub fn from_config(c: &ankusa_config::Config) -> Self {
        WriterSettings {
            queue_capacity: c.writer.queue_capacity,
            max_batch_hooks: c.writer.max_batch_hooks,
            max_batch_bytes: c.writer.max_batch_bytes,
            max_batch_delay: std::time::Duration::from_micros(c.writer.max_batch_delay_us),
            max_batch_gap: std::time::Duration::from_micros(c.writer.max_batch_gap_us),
            pipeline: c.writer.pipeline,
            dedupe_window_ms: c.dedupe.window_ms,
            sweep_batch: c.dedupe.sweep_batch,
            sweep_interval: std::time::Duration::from_millis(c.dedupe.sweep_interval_ms),
            archive: false,
        }
    }
}

/// The request side of the writer: hands hooks over without blocking.
#[derive(Debug, Clone)]
pub struct WriterHandle {
    tx: std::sync::mpsc::SyncSender<Work>,
}

/// What the writer takes: a hook, or a batch of another node's rows to import.
#[derive(Debug)]
pub enum Work {
    Hook(Submission),
    Import(Import),
}

/// A batch of stored rows another node of the Relay hands this one, their tenants' owner
/// ([`crate::handoff`]): imported in one synced write with the batch's number, once. Or a
/// batch this node staged for a receiver that refused it, taken back into its own queue.
#[derive(Debug)]
pub struct Import {
    /// Where the batch comes from.
    pub from: Origin,
    /// The batch's number among those its sender staged for its receiver.
    pub batch: u64,
    pub items: Vec<ankusa_records::moved::Moved>,
    pub reply: tokio::sync::oneshot::Sender<ImportReply>,
}

/// Where an [`Import`]'s batch comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Another node (its name) handed it to this one: imported once, its number recorded
    /// in the same write (`m:handoff_in:<sender>`).
    Node(String),
    /// This node's own outbox for that receiver (its name), which will not take it (its
    /// node list says the tenants are not its, or it is gone): the rows come back into this
    /// node's queue and the batch's outbox entries go, in the same write, so they are in
    /// exactly one place at every moment. Once only: a batch no longer in the outbox is
    /// answered [`ImportReply::Already`].
    TakenBack(String),
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Origin::Node(n) => write!(f, "{n}"),
            Origin::TakenBack(n) => write!(f, "this node's outbox for {n}"),
        }
    }
}

/// The writer's queue is full (or the writer has stopped): answer `unavailable`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the writer's queue is full")]
pub struct WriterBusy;

impl WriterHandle {
    /// Queues a submission, or refuses at once if the bounded queue is full.
    pub fn try_submit(&self, s: Submission) -> Result<(), WriterBusy> {
        self.tx.try_send(Work::Hook(s)).map_err(|_| WriterBusy)
    }

    /// Queues a submission, or gives it back: `Full` (try again later) or `Disconnected`
    /// (the writer has stopped).
    pub fn try_submit_or_return(
        &self,
        s: Submission,
    ) -> Result<(), Box<std::sync::mpsc::TrySendError<Submission>>> {
        use std::sync::mpsc::TrySendError;
        match self.tx.try_send(Work::Hook(s)) {
            Err(TrySendError::Full(Work::Hook(s))) => Err(Box::new(TrySendError::Full(s))),
            Err(TrySendError::Disconnected(Work::Hook(s))) => {
                Err(Box::new(TrySendError::Disconnected(s)))
            }
            // The channel gives back what was sent: a hook.
            _ => Ok(()),
        }
    }

    /// Queues an import, or refuses at once if the bounded queue is full.
    pub fn try_import(&self, i: Import) -> Result<(), WriterBusy> {
        self.tx.try_send(Work::Import(i)).map_err(|_| WriterBusy)
    }
}

/// What the writer reports, as handles into the node's metrics registry (the node
/// registers them as `ankusa_writer_batch_hooks`, `ankusa_writer_commit_seconds`,
/// `ankusa_dedupe_swept_total` and `ankusa_writer_unsynced_hooks`).
#[derive(Debug, Clone)]
pub struct WriterMetrics {
    /// Hooks acked per WAL sync (every batch written since the sync before).
    pub batch_hooks: prometheus_client::metrics::histogram::Histogram,
    /// Seconds each WAL sync of the writer's batches took.
    pub commit_seconds: prometheus_client::metrics::histogram::Histogram,
    /// Expired dedupe keys removed by the sweep.
    pub dedupe_swept: prometheus_client::metrics::counter::Counter,
    /// Hooks written and waiting for the WAL sync that acks them.
    pub unsynced_hooks: prometheus_client::metrics::gauge::Gauge,
}

/// Most written batches that may wait for the syncer ([`Syncer`]); past it the writer
/// waits for a sync to end before it writes more, its own queue fills and ingest answers
/// 503. The syncer takes every waiting batch at each sync, so under load one or two wait.
pub const UNSYNCED_BATCHES_MAX: usize = 64;

/// Starts the writer thread and its syncer. They stop when every [`WriterHandle`] is
/// dropped (the writer joins the syncer, so every reply is sent when the handle's thread
/// ends).
///
/// The writer writes each batch unsynced and has its [`Syncer`] sync the WAL and answer
/// it. With `settings.pipeline` the syncer is a thread of its own: the writer hands it the
/// batch and goes on to the next at once, and the syncer syncs once for every batch
/// written since its last sync, so batch N + 1 is written while batch N's sync runs.
/// Without it (the default) the writer syncs and answers each batch itself.
pub fn spawn(
    store: std::sync::Arc<Store>,
    assembler: Assembler,
    settings: WriterSettings,
    metrics: WriterMetrics,
    hints: std::sync::Arc<DueHints>,
    starts: Option<std::sync::Arc<dyn Starts>>,
) -> std::io::Result<(WriterHandle, std::thread::JoinHandle<()>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel(settings.queue_capacity);
    let after = std::sync::Arc::new(AfterSync::default());
    let syncer = Syncer {
        store: store.clone(),
        metrics: metrics.clone(),
        starts: starts.clone(),
        after: after.clone(),
    };
    let (sync, syncer_thread) = if settings.pipeline {
        let (to_sync, written) = std::sync::mpsc::sync_channel(UNSYNCED_BATCHES_MAX);
        let thread = std::thread::Builder::new()
            .name("ankusa-wal-sync".into())
            .spawn(move || syncer.run(written))?;
        (Syncing::Pipelined(to_sync), Some(thread))
    } else {
        (Syncing::Inline(syncer), None)
    };
    let mut w = Writer {
        store,
        asm: assembler,
        settings,
        metrics,
        hints,
        starts,
        after,
        sync,
        batches: 0,
        imported: Vec::new(),
    };
    let join = std::thread::Builder::new()
        .name("ankusa-writer".into())
        .spawn(move || {
            w.run(rx);
            // The syncer answers what it holds, then sees its channel close.
            drop(w);
            if let Some(t) = syncer_thread {
                let _ = t.join();
            }
        })?;
    Ok((WriterHandle { tx }, join))
}

struct Writer {
    store: std::sync::Arc<Store>,
    asm: Assembler,
    settings: WriterSettings,
    metrics: WriterMetrics,
    /// Where due work is announced to the dispatch tick, once written.
    hints: std::sync::Arc<DueHints>,
    /// Where fresh deliveries may start at commit (none: every row is due).
    starts: Option<std::sync::Arc<dyn Starts>>,
    /// What a failed sync leaves the writer to do.
    after: std::sync::Arc<AfterSync>,
    /// Where written batches go to be synced and answered.
    sync: Syncing,
    /// Batches taken so far: each one's number in the `writer.batch` span and in its
    /// requests' spans (`batch`).
    batches: u64,
    /// Imports written (unsynced) whose answers wait for the WAL sync of the batch they
    /// go with: one sync for the hooks and the imports of a batch.
    imported: Vec<(tokio::sync::oneshot::Sender<ImportReply>, ImportReply)>,
}

/// A batch: `first`, then what else comes while requests keep arriving — each within
/// `max_batch_gap` of the one before, all within `max_batch_delay` of the first — up to
/// `max_batch_hooks` hooks and `max_batch_bytes` body bytes. What already waits in the
/// channel (it queued during the last commit) is taken without waiting. A steady stream
/// makes large batches (one fsync for many hooks); a lone hook waits at most the gap, not
/// the whole delay, before its commit.
pub fn gather<T>(
    rx: &std::sync::mpsc::Receiver<T>,
    first: T,
    settings: &WriterSettings,
    body_len: impl Fn(&T) -> usize,
) -> Vec<T> {
    let deadline = std::time::Instant::now() + settings.max_batch_delay;
    let mut bytes = body_len(&first);
    let mut batch = vec![first];
    while batch.len() < settings.max_batch_hooks && bytes < settings.max_batch_bytes {
        let next = match rx.try_recv() {
            Ok(s) => s,
            Err(_) => {
                let now = std::time::Instant::now();
                if now >= deadline {
                    break;
                }
                match rx.recv_timeout((deadline - now).min(settings.max_batch_gap)) {
                    Ok(s) => s,
                    Err(_) => break,
                }
            }
        };
        bytes += body_len(&next);
        batch.push(next);
    }
    batch
}

impl Writer {
    fn run(&mut self, rx: std::sync::mpsc::Receiver<Work>) {
        use std::sync::mpsc::RecvTimeoutError;
        // The dedupe sweep runs every `sweep_interval` whatever the traffic: between two
        // batches once the interval has passed (steady traffic never leaves the queue
        // idle), bounded by `sweep_batch` keys per pass so a batch waits for at most one
        // bounded pass.
        let mut next_sweep = std::time::Instant::now() + self.settings.sweep_interval;
        loop {
            let now = std::time::Instant::now();
            if now >= next_sweep {
                // The rows of a failed commit go due even when no hook comes after it.
                if let Err(e) = self.requeue_unstarted() {
                    tracing::debug!(error = %e, "writer: making the rows of a failed commit due");
                }
                self.sweep_dedupe();
                next_sweep = now + self.settings.sweep_interval;
            }
            let wait = next_sweep.saturating_duration_since(std::time::Instant::now());
            let first = match rx.recv_timeout(wait) {
                Ok(s) => s,
                Err(RecvTimeoutError::Timeout) => continue,
                Err(RecvTimeoutError::Disconnected) => return,
            };
            let batch = gather(&rx, first, &self.settings, |w| match w {
                Work::Hook(s) => s.envelope.body.len(),
                Work::Import(_) => 0,
            });
            let mut hooks = Vec::with_capacity(batch.len());
            let mut imports = Vec::new();
            for w in batch {
                match w {
                    Work::Hook(s) => hooks.push(s),
                    Work::Import(i) => imports.push(i),
                }
            }
            // Imports first, unsynced: the batch's one WAL sync makes them durable with
            // its hooks (a hook waits for no sync of an import's own).
            for i in imports {
                self.import(i);
            }
            if !hooks.is_empty() {
                self.commit_batch(hooks);
            }
            if !self.imported.is_empty() {
                let imports = std::mem::take(&mut self.imported);
                self.hand_to_syncer(Written {
                    replies: Vec::new(),
                    started: Vec::new(),
                    imports,
                });
            }
        }
    }

    fn commit_batch(&mut self, batch: Vec<Submission>) {
        self.batches += 1;
        let span = tracing::debug_span!(
            target: "ankusa::trace",
            "writer.batch",
            batch = self.batches,
            hooks = batch.len()
        );
        if !span.is_disabled() {
            for s in &batch {
                span.follows_from(&s.span);
                s.span.record("batch", self.batches);
            }
        }
        let _in_batch = span.enter();
        if self
            .after
            .stale
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            self.asm.mark_stale();
        }
        if let Err(e) = self.requeue_unstarted() {
            tracing::debug!(error = %e, "writer: making the rows of a failed commit due");
            return reply_all(batch, Reply::Unavailable);
        }
        let now = ankusa_keyspace::now_ms();
        let (ukeys, fresh, mut replies) = match self.duplicates(&batch, now) {
            Ok(d) => d,
            Err(e) => {
                tracing::error!(error = %e, "writer: reading dedupe keys");
                return reply_all(batch, Reply::Unavailable);
            }
        };
        let envs: Vec<&Envelope> = fresh.iter().map(|i| &batch[*i].envelope).collect();
        let unarchived: Vec<bool> = fresh.iter().map(|i| batch[*i].from_archive).collect();
        let mut assembled = match self.asm.assemble_except(
            &self.store,
            &envs,
            self.settings.archive,
            &unarchived,
            self.starts.as_deref(),
        ) {
            Ok(a) => a,
            Err(e) => {
                tracing::error!(error = %e, "writer: assembling a batch");
                return reply_all(batch, Reply::Unavailable);
            }
        };
        let expires = now.saturating_add(self.settings.dedupe_window_ms);
        for (j, i) in fresh.iter().enumerate() {
            if let (Some(k), Ok(_)) = (&ukeys[*i], &assembled.outcomes[j]) {
                let id = &batch[*i].envelope.id;
                for op in crate::dedupe::keep(k, expires, id) {
                    assembled.push_op(op);
                }
            }
        }
        let due = std::mem::take(&mut assembled.due);
        // The started rows, by their hook's place in the batch.
        let to_start: Vec<(usize, InflightRow, StartSlot)> = std::mem::take(&mut assembled.started)
            .into_iter()
            .map(|(j, row, slot)| (fresh[j], row, slot))
            .collect();
        // Written unsynced: the syncer's next sync makes it durable and answers.
        let committed = self.asm.commit(&self.store, assembled, false);
        // The due rows are readable now (a failed write may still have applied them): they
        // are hinted before the next batch is assembled, so that a tick which has not
        // seen them cannot open the start gate for a fresh row of their tenant (`waiting`).
        // A hint with no row costs one empty scan.
        let waiting = !due.is_empty();
        self.hints.add(due);
        if let (true, Some(starts)) = (waiting, &self.starts) {
            starts.waiting();
        }
        let outcomes = match committed {
            Ok(outcomes) => outcomes,
            Err(e) => {
                // The store logs the failure that begins an outage; each batch refused
                // during it is only a debug line. The batch may still be applied: its
                // started rows are made due before the next batch.
                tracing::debug!(error = %e, hooks = fresh.len(), "writer: commit failed");
                self.after
                    .unstarted()
                    .extend(to_start.into_iter().map(|(_, row, _)| row));
                return reply_all(batch, Reply::Unavailable);
            }
        };
        for (i, out) in fresh.into_iter().zip(outcomes) {
            replies[i] = Some(match out {
                Ok(_) => Reply::Accepted {
                    id: batch[i].envelope.id.clone(),
                },
                Err(QueueError::TenantLimit { .. }) => Reply::TenantLimit,
                Err(QueueError::InvalidTenant(why)) => Reply::InvalidTenant(why),
                Err(QueueError::TenantErasing) => Reply::TenantErasing,
                Err(_) => Reply::Unavailable,
            });
        }
        let written = written(batch, replies, to_start, std::mem::take(&mut self.imported));
        self.hand_to_syncer(written);
    }

    /// The batch's idempotency keys, the requests that are not duplicates (by index), and
    /// the duplicates' answers. The writer owns the `?u` keys, so one multi_get here is
    /// authoritative. (A key of a batch still waiting for its sync is read too: the
    /// duplicate's answer goes out after a later sync, which covers that batch.) A key
    /// twice in the batch is a duplicate of its first.
    #[allow(clippy::type_complexity)]
    fn duplicates(
        &self,
        batch: &[Submission],
        now: u64,
    ) -> Result<(Vec<Option<Vec<u8>>>, Vec<usize>, Vec<Option<Reply>>), QueueError> {
        let mut replies: Vec<Option<Reply>> = vec![None; batch.len()];
        let ukeys: Vec<Option<Vec<u8>>> = batch
            .iter()
            .map(|s| {
                s.idempotency
                    .as_ref()
                    .and_then(|k| ankusa_keyspace::dedupe(s.envelope.tenant_or_default(), k))
            })
            .collect();
        let present: Vec<Vec<u8>> = ukeys.iter().flatten().cloned().collect();
        let found = self.store.multi_get(ankusa_keyspace::Cf::Index, &present)?;
        let mut seen: std::collections::HashMap<Vec<u8>, String> = present
            .into_iter()
            .zip(found)
            .filter_map(|(k, v)| {
                let (expires, id) = crate::dedupe::read_value(&k, v.as_deref()?)?;
                (expires > now).then_some((k, id))
            })
            .collect();
        let mut fresh: Vec<usize> = Vec::with_capacity(batch.len());
        for (i, s) in batch.iter().enumerate() {
            match ukeys[i].as_ref().and_then(|k| seen.get(k)) {
                Some(id) => replies[i] = Some(Reply::Duplicate { id: id.clone() }),
                None => {
                    if let Some(k) = &ukeys[i] {
                        seen.insert(k.clone(), s.envelope.id.clone());
                    }
                    fresh.push(i);
                }
            }
        }
        Ok((ukeys, fresh, replies))
    }

    /// Hands a written batch to be synced and answered: by the syncer thread with the
    /// pipeline, here without.
    fn hand_to_syncer(&mut self, written: Written) {
        self.metrics.unsynced_hooks.inc_by(written.hooks() as i64);
        match &self.sync {
            Syncing::Inline(syncer) => syncer.finish(vec![written], syncer.sync()),
            // Waits while `UNSYNCED_BATCHES_MAX` batches wait for their sync. The syncer
            // outlives the writer's loop, so the send fails only if it panicked.
            Syncing::Pipelined(to_sync) => {
                if let Err(std::sync::mpsc::SendError(w)) = to_sync.send(written) {
                    tracing::error!("writer: the WAL syncer has stopped");
                    self.metrics.unsynced_hooks.dec_by(w.hooks() as i64);
                    for (reply, _, _) in w.replies {
                        let _ = reply.send(Reply::Unavailable);
                    }
                    for (reply, _) in w.imports {
                        let _ = reply.send(ImportReply::Unavailable);
                    }
                }
            }
        }
    }

    /// After a failed commit whose batch had started deliveries: each of their rows that
    /// the store holds (the write was applied, its sync failed) goes back to due, as boot
    /// recovery would make it, so that nothing stays inflight with no delivery running.
    /// A row the store does not hold (the write was not applied) is left alone: its unit
    /// does not move. Done before the next batch is assembled, which may reuse the failed
    /// batch's seqs when the store does not hold it.
    fn requeue_unstarted(&mut self) -> Result<(), QueueError> {
        let rows = std::mem::take(&mut *self.after.unstarted());
        if rows.is_empty() {
            return Ok(());
        }
        let now = AtMs(ankusa_keyspace::now_ms());
        let due: Vec<(TenantOrd, AtMs)> = rows.iter().map(|r| (r.key.ord, now)).collect();
        let moved = match self.recover_rows(&rows, now) {
            Ok(moved) => moved,
            Err(e) => {
                // Tried again before the next batch, or at the next sweep.
                self.after.unstarted().extend(rows);
                return Err(e);
            }
        };
        tracing::warn!(
            rows = moved.count(),
            "writer: deliveries of a failed commit that the store holds are due again"
        );
        self.hints.add(due);
        Ok(())
    }

    /// Makes `rows` due again in one commit (a unit each: a row the store does not hold
    /// moves nothing), with their hook log records.
    fn recover_rows(
        &self,
        rows: &[InflightRow],
        now: AtMs,
    ) -> Result<deliveries::Committed, QueueError> {
        let mut tx = Tx::new();
        for row in rows {
            deliveries::recover(&mut tx, row, now);
            if self.asm.log {
                let ev =
                    super::hooklog::requeued(ankusa_keyspace::EventKind::Recovered, now, 0, now);
                super::hooklog::record(&mut tx, &self.store, row.key.seq, row.key.sink, &ev)?;
            }
        }
        tx.commit(&self.store, false)
    }

    /// Imports a batch another node handed this one ([`crate::handoff`]): one write with
    /// the batch's number, or nothing (an earlier import had it, a tenant past the limit, a
    /// failure). Written unsynced before the batch's hooks, so the seqs and ordinals it
    /// takes are the writer's own; answered once the batch's sync made it durable.
    fn import(&mut self, imp: Import) {
        let _ = self.requeue_unstarted();
        if self
            .after
            .stale
            .swap(false, std::sync::atomic::Ordering::AcqRel)
        {
            self.asm.mark_stale();
        }
        let reply = match self.asm.assemble_import(&self.store, &imp) {
            Ok((Some(assembled), reply)) => {
                let due = assembled.due.clone();
                match self.asm.commit(&self.store, assembled, false) {
                    Ok(_) => {
                        self.hints.add(due);
                        self.imported.push((imp.reply, reply));
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, from = %imp.from, "writer: an import's commit failed");
                        ImportReply::Unavailable
                    }
                }
            }
            Ok((None, reply)) => reply,
            Err(e) => {
                tracing::warn!(error = %e, from = %imp.from, "writer: assembling an import");
                ImportReply::Unavailable
            }
        };
        let _ = imp.reply.send(reply);
    }

    /// Removes up to `sweep_batch` expired dedupe keys. Runs on the writer thread, the
    /// only writer of `?u`/`?e`, so it cannot race a new key for the same hook.
    fn sweep_dedupe(&mut self) {
        match crate::dedupe::sweep_expired(
            &self.store,
            ankusa_keyspace::now_ms(),
            self.settings.sweep_batch,
        ) {
            Ok(n) => {
                self.metrics.dedupe_swept.inc_by(n);
            }
            Err(e) => tracing::warn!(error = %e, "writer: dedupe sweep"),
        }
    }
}

/// A committed batch as the syncer takes it: each request's answer (a request with none
/// is `unavailable`), and the started rows with their hooks, which go on to the pipeline
/// after the sync.
fn written(
    batch: Vec<Submission>,
    replies: Vec<Option<Reply>>,
    to_start: Vec<(usize, InflightRow, StartSlot)>,
    imports: Vec<(tokio::sync::oneshot::Sender<ImportReply>, ImportReply)>,
) -> Written {
    let mut wanted = Vec::new();
    if !to_start.is_empty() {
        wanted.resize(batch.len(), false);
        for (i, _, _) in &to_start {
            wanted[*i] = true;
        }
    }
    let mut envelopes: Vec<Option<std::sync::Arc<Envelope>>> = vec![None; wanted.len()];
    let mut answers = Vec::with_capacity(batch.len());
    for (i, (s, r)) in batch.into_iter().zip(replies).enumerate() {
        // Only an accepted hook's answer depends on the sync (a duplicate or a refusal
        // wrote nothing).
        let wrote = matches!(r, Some(Reply::Accepted { .. }));
        answers.push((s.reply, r.unwrap_or(Reply::Unavailable), wrote));
        if wanted.get(i).copied().unwrap_or(false) {
            envelopes[i] = Some(std::sync::Arc::new(s.envelope));
        }
    }
    let started = to_start
        .into_iter()
        .filter_map(|(i, row, slot)| {
            let envelope = envelopes[i].clone()?;
            Some(Started {
                row,
                envelope,
                slot,
            })
        })
        .collect();
    Written {
        replies: answers,
        started,
        imports,
    }
}

fn reply_all(batch: Vec<Submission>, r: Reply) {
    for s in batch {
        let _ = s.reply.send(r.clone());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    /// A request of `n` body bytes.
    struct Req(usize);

    fn gather(rx: &std::sync::mpsc::Receiver<Req>, first: Req, s: &WriterSettings) -> Vec<Req> {
        super::gather(rx, first, s, |r| r.0)
    }

    fn settings(delay: Duration, gap: Duration) -> WriterSettings {
        let mut s = WriterSettings::from_config(&ankusa_config::Config::default());
        s.max_batch_delay = delay;
        s.max_batch_gap = gap;
        s
    }

    #[test]
    fn a_batch_takes_what_waits_and_ends_at_the_first_gap() {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..3 {
            tx.send(Req(1)).expect("send");
        }
        // One more comes after a pause far longer than the gap, far shorter than the delay.
        let late = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_secs(1));
            tx.send(Req(1)).expect("send");
        });
        let began = Instant::now();
        let batch = gather(
            &rx,
            Req(1),
            &settings(Duration::from_secs(30), Duration::from_millis(20)),
        );
        assert_eq!(
            batch.len(),
            4,
            "the first and the three waiting, not the late one"
        );
        assert!(
            began.elapsed() < Duration::from_secs(30),
            "the gap ended the batch, not the delay"
        );
        late.join().expect("sender");
        assert_eq!(
            rx.try_iter().count(),
            1,
            "the late request waits for the next batch"
        );
    }

    #[test]
    fn a_steady_stream_gathers_until_the_delay() {
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stream = {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if tx.send(Req(1)).is_err() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        let began = Instant::now();
        let batch = gather(
            &rx,
            Req(1),
            &settings(Duration::from_millis(300), Duration::from_secs(5)),
        );
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        stream.join().expect("stream");
        assert!(
            began.elapsed() >= Duration::from_millis(300),
            "requests kept coming within the gap: it gathered until the delay"
        );
        assert!(batch.len() > 1, "it took what came meanwhile");
    }

    #[test]
    fn a_batch_stops_at_its_hook_and_byte_limits() {
        let (tx, rx) = std::sync::mpsc::channel();
        for _ in 0..10 {
            tx.send(Req(100)).expect("send");
        }
        let mut s = settings(Duration::from_secs(30), Duration::from_secs(30));
        s.max_batch_hooks = 4;
        assert_eq!(gather(&rx, Req(100), &s).len(), 4);
        s.max_batch_hooks = 512;
        s.max_batch_bytes = 250;
        assert_eq!(gather(&rx, Req(100), &s).len(), 3, "100 + 100 + 100 >= 250");
    }
}
