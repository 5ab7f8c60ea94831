//! The writer's WAL syncs: a batch written (unsynced) waits in a [`Written`] for the sync
//! that makes it durable; the [`Syncer`] syncs once for every batch handed to it so far
//! and answers their requests, on its own thread (`writer.pipeline`) or the writer's.

use super::{ImportReply, Reply, Started, Starts, WriterMetrics};
use crate::deliveries::InflightRow;
use ankusa_store::Store;

/// How the writer's batches are synced (`writer.pipeline`).
pub(super) enum Syncing {
    /// By the syncer thread, while the writer writes the next batch.
    Pipelined(std::sync::mpsc::SyncSender<Written>),
    /// By the writer itself, before it takes the next batch.
    Inline(Syncer),
}

/// What a failed commit (the writer's write, or the syncer's WAL sync) leaves for the
/// writer to do before its next batch.
#[derive(Debug, Default)]
pub(super) struct AfterSync {
    /// A WAL sync failed: the store holds batches whose requests were refused, so the
    /// next batch reads its seq and ordinal state again ([`Assembler::mark_stale`]).
    pub(super) stale: std::sync::atomic::AtomicBool,
    /// Rows a failed commit had written inflight to start, to make due (see
    /// [`Writer::requeue_unstarted`]).
    pub(super) unstarted: std::sync::Mutex<Vec<InflightRow>>,
}

impl AfterSync {
    pub(super) fn unstarted(&self) -> std::sync::MutexGuard<'_, Vec<InflightRow>> {
        self.unstarted.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A batch written (unsynced) and waiting for the WAL sync that makes it durable: what
/// the syncer does once the sync returns.
pub(super) struct Written {
    /// Each request's answer if the sync succeeds, and whether the batch wrote its hook
    /// (a fresh hook's answer becomes `unavailable` if the sync fails).
    pub(super) replies: Vec<(tokio::sync::oneshot::Sender<Reply>, Reply, bool)>,
    /// Deliveries written inflight, to start once durable.
    pub(super) started: Vec<Started>,
    /// Imports written with the batch: each answer, `unavailable` if the sync fails (an
    /// import that wrote nothing is answered as it is).
    pub(super) imports: Vec<(tokio::sync::oneshot::Sender<ImportReply>, ImportReply)>,
}

impl Written {
    /// Hooks the batch wrote (its accepted answers).
    pub(super) fn hooks(&self) -> usize {
        self.replies.iter().filter(|(_, _, wrote)| *wrote).count()
    }
}

/// Syncs the WAL for the writer and answers the requests of every batch the sync made
/// durable: on its own thread with the pipeline, on the writer's without.
pub(super) struct Syncer {
    pub(super) store: std::sync::Arc<Store>,
    pub(super) metrics: WriterMetrics,
    pub(super) starts: Option<std::sync::Arc<dyn Starts>>,
    pub(super) after: std::sync::Arc<AfterSync>,
}

impl Syncer {
    pub(super) fn run(&self, written: std::sync::mpsc::Receiver<Written>) {
        while let Ok(first) = written.recv() {
            // Every batch handed over so far was written before this sync begins.
            let mut group = vec![first];
            group.extend(written.try_iter());
            let synced = self.sync();
            self.finish(group, synced);
        }
    }

    /// One WAL sync, timed (`ankusa_writer_commit_seconds`).
    pub(super) fn sync(&self) -> Result<(), ankusa_store::StoreError> {
        let began = std::time::Instant::now();
        let synced = self.store.sync_wal();
        if synced.is_ok() {
            self.metrics
                .commit_seconds
                .observe(began.elapsed().as_secs_f64());
        }
        synced
    }

    /// Answers a group of batches after their sync, in the order they were written.
    pub(super) fn finish(&self, group: Vec<Written>, synced: Result<(), ankusa_store::StoreError>) {
        let hooks: usize = group.iter().map(Written::hooks).sum();
        let ok = match &synced {
            Ok(()) => {
                self.metrics.batch_hooks.observe(hooks as f64);
                true
            }
            Err(e) => {
                // The store logs the failure that begins an outage; each sync refused
                // during it is only a debug line.
                tracing::debug!(error = %e, hooks, "writer: WAL sync failed");
                self.after
                    .stale
                    .store(true, std::sync::atomic::Ordering::Release);
                false
            }
        };
        for w in group {
            // Before the answers: a requester that has its ack sees its hook synced.
            self.metrics.unsynced_hooks.dec_by(w.hooks() as i64);
            for (reply, r, wrote) in w.replies {
                // A requester that went away does not care.
                let _ = reply.send(if ok || !wrote { r } else { Reply::Unavailable });
            }
            for (reply, r) in w.imports {
                let wrote = matches!(r, ImportReply::Imported { .. });
                let _ = reply.send(if ok || !wrote {
                    r
                } else {
                    ImportReply::Unavailable
                });
            }
            if w.started.is_empty() {
                continue;
            }
            match (&self.starts, ok) {
                (Some(starts), true) => starts.started(w.started),
                // Their slots go back as they drop; the rows, which the store may hold,
                // are made due by the writer before its next batch.
                _ => self
                    .after
                    .unstarted()
                    .extend(w.started.into_iter().map(|s| s.row)),
            }
        }
    }
}
