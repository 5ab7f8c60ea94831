//! The node's own backups to an object store (`backup.object_store`): a push every
//! `interval_ms`, under `<prefix>/<node>/`, keeping the newest `keep`.
//!
//! One push at a time (the loop runs them in turn), so one writer per prefix, which the
//! retention needs. Pushes start `interval_ms` apart, the first one a little after the node
//! starts; one that takes longer than the interval is followed by the next at once. A push
//! that fails (the bucket unreachable, a refused credential) is retried sooner — 10 s after
//! the first failure, doubling, never later than the interval — and recorded in
//! [`ObjectBackups`] (`GET /v1/node`: the operator's condition names it) and the
//! `ankusa_backup_pushes{outcome="failed"}` counter. A failed push deletes nothing: the
//! files it uploaded without a manifest go with the next retention that completes.
//!
//! A push runs on a thread of its own ([`super::Pusher`]): its hashing and uploads never
//! take a turn on the workers that serve ingest. It holds a checkpoint of the store (hard
//! links) only while it uploads; one left by a killed process is removed when the node
//! starts.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_api::node::{ObjectBackup, ObjectBackups};
use ankusa_config::ObjectStoreConfig;
use ankusa_queue::engine::Store;

use super::{Remote, Target};
use crate::metrics::{Metrics, OutcomeLabel};

/// The first push this long after start (or after `interval_ms`, if shorter).
const FIRST_PUSH: Duration = Duration::from_secs(10);
/// The first retry after a failed push; it doubles with each failure in a row.
const RETRY_FIRST: Duration = Duration::from_secs(10);
/// The longest error message kept in the status.
const ERROR_MAX: usize = 500;

/// What the pushes did, for `GET /v1/node`.
#[derive(Debug, Default)]
pub struct Backups {
    status: Mutex<ObjectBackups>,
}

impl Backups {
    pub fn status(&self) -> ObjectBackups {
        self.status
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

/// Where node `node`'s pushes go: `<url>/<node>`.
pub fn node_url(config: &ObjectStoreConfig, node: &str) -> String {
    ankusa_config::s3_node_url(&config.url, node)
}

/// When the push after `failures` failures in a row starts, counted from the end of the
/// last one (`None`: from the start of the last one, one interval on).
fn retry_after(failures: u64, interval: Duration) -> Option<Duration> {
    (failures > 0).then(|| {
        let shift = (failures - 1).min(16) as u32;
        RETRY_FIRST.saturating_mul(1 << shift).min(interval)
    })
}

/// Starts the node's pushes. The loop ends with `stop` (a push under way is dropped: its
/// uploads without a manifest are no backup).
pub fn spawn(
    store: Arc<Store>,
    data: PathBuf,
    config: ObjectStoreConfig,
    node: &str,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> (Arc<Backups>, tokio::task::JoinHandle<()>) {
    super::remove_stale_checkpoints(&data);
    let url = node_url(&config, node);
    let backups = Arc::new(Backups {
        status: Mutex::new(ObjectBackups {
            url: url.clone(),
            ..ObjectBackups::default()
        }),
    });
    let shared = backups.clone();
    let interval = Duration::from_millis(config.interval_ms);
    let target = Target::of(&config);
    let task = tokio::spawn(async move {
        let pusher = match super::Pusher::new() {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %format!("{e:#}"), "no backups: the backup thread did not start");
                return;
            }
        };
        let mut remote: Option<std::sync::Arc<Remote>> = None;
        let mut wait = FIRST_PUSH.min(interval);
        loop {
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let started = tokio::time::Instant::now();
            let push = async {
                let r = match remote.take() {
                    Some(r) => remote.insert(r),
                    None => remote.insert(std::sync::Arc::new(Remote::open(&url, &target)?)),
                };
                let retention = super::Retention {
                    keep: config.keep,
                    older_formats: config.keep_older_formats,
                };
                pusher
                    .push(store.clone(), data.clone(), r.clone(), Some(retention))
                    .await
            };
            let outcome = tokio::select! {
                o = push => o,
                _ = stop.wait_for(|s| *s) => return,
            };
            let took = started.elapsed();
            let failures = {
                let mut st = shared.status.lock().unwrap_or_else(|p| p.into_inner());
                match outcome {
                    Ok(p) => {
                        st.pushes += 1;
                        st.failures = 0;
                        st.formats = p.formats.clone();
                        st.last_error = None;
                        st.last = Some(ObjectBackup {
                            id: p.manifest.id.clone(),
                            at_ms: p.at_ms,
                            store_format: p.manifest.store_format,
                            files: p.manifest.files.len() as u64,
                            bytes: p.bytes(),
                            uploaded_bytes: p.uploaded_bytes,
                            duration_ms: took.as_millis() as u64,
                        });
                        metrics.backup_uploaded_bytes.inc_by(p.uploaded_bytes);
                        metrics.backup_last_success.set((p.at_ms / 1000) as i64);
                        metrics.backup_push_seconds.observe(took.as_secs_f64());
                        tracing::info!(
                            backup = %p.manifest.id,
                            files = p.manifest.files.len(),
                            bytes = p.bytes(),
                            uploaded_bytes = p.uploaded_bytes,
                            pruned_backups = p.pruned.backups,
                            pruned_files = p.pruned.files,
                            ms = took.as_millis() as u64,
                            "backup pushed to {url}"
                        );
                    }
                    Err(e) => {
                        // A fresh client for the next attempt (a rotated credential, a
                        // CA bundle fixed).
                        remote = None;
                        st.failures += 1;
                        let mut msg = format!("{e:#}");
                        if msg.len() > ERROR_MAX {
                            let mut cut = ERROR_MAX;
                            while !msg.is_char_boundary(cut) {
                                cut -= 1;
                            }
                            msg.truncate(cut);
                        }
                        st.last_error = Some(msg);
                        st.last_error_at_ms = ankusa_keyspace::now_ms();
                        tracing::warn!(error = %format!("{e:#}"), failures = st.failures, "backup push to {url} failed");
                    }
                }
                st.failures
            };
            let outcome = if failures == 0 { "completed" } else { "failed" };
            metrics
                .backup_pushes
                .get_or_create(&OutcomeLabel {
                    outcome: outcome.into(),
                })
                .inc();
            wait = retry_after(failures, interval).unwrap_or_else(|| interval.saturating_sub(took));
        }
    });
    (backups, task)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_push_is_retried_sooner_and_never_later_than_the_interval() {
        let i = Duration::from_secs(300);
        assert_eq!(retry_after(0, i), None);
        assert_eq!(retry_after(1, i), Some(Duration::from_secs(10)));
        assert_eq!(retry_after(2, i), Some(Duration::from_secs(20)));
        assert_eq!(retry_after(5, i), Some(Duration::from_secs(160)));
        assert_eq!(retry_after(6, i), Some(i));
        assert_eq!(retry_after(1_000, i), Some(i));
        assert_eq!(
            retry_after(1, Duration::from_secs(5)),
            Some(Duration::from_secs(5))
        );
    }
}
