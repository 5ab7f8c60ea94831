//! The node's periodic and background tasks: reclaim, the hook log's and the audit
//! trail's pruning, the archiver, the gauges, the write probe, the console's samples, the
//! tenant registry's loans and the handoff; each runs until the node stops.

use std::sync::Arc;

use crate::admin::api::Api;
use crate::cluster::Cluster;
use crate::metrics::{ArchiveLabel, Metrics, StoreFamilyLabel};
use ankusa_config::Config;
use ankusa_keyspace::AtMs;
use ankusa_queue::engine::Store;
use ankusa_queue::{archive, hooklog, QueueError};

use super::{exit_at_once, EXIT_STORE_STUCK};

/// Every `interval` until stopped, runs `pass` on a blocking thread with its state (a
/// cursor kept from pass to pass), and again at once while it answers `Ok(true)` (a full
/// pass: more is waiting), so the task keeps up with any rate; a failed pass is logged and
/// waits for the next interval. The node's reclaim, hook log pruning and archiver.
pub(super) fn periodic<S: Default + Send + 'static>(
    name: &'static str,
    interval: std::time::Duration,
    mut stop: tokio::sync::watch::Receiver<bool>,
    pass: impl FnMut(&mut S) -> Result<bool, QueueError> + Send + 'static,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut held = Some((S::default(), pass));
        loop {
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            loop {
                let Some((mut state, mut pass)) = held.take() else {
                    return;
                };
                let Ok((state, pass, full)) = tokio::task::spawn_blocking(move || {
                    let full = pass(&mut state);
                    (state, pass, full)
                })
                .await
                else {
                    tracing::warn!(task = name, "periodic task panicked; it stops");
                    return;
                };
                held = Some((state, pass));
                match full {
                    Ok(true) if !*stop.borrow() => {}
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(task = name, error = %e, "periodic pass failed");
                        break;
                    }
                }
            }
        }
    })
}

/// Reclaim every `reclaim.interval_ms`, `reclaim.batch` markers a pass. The backlog gauge
/// is what one whole sweep found.
pub(super) fn spawn_reclaim(
    store: Arc<Store>,
    config: &Config,
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let interval = std::time::Duration::from_millis(config.reclaim.interval_ms);
    let batch = config.reclaim.batch;
    periodic(
        "reclaim",
        interval,
        stop,
        move |(reclaimer, found): &mut (ankusa_queue::reclaim::Reclaimer, u64)| {
            let report = reclaimer.pass(&store, batch)?;
            metrics.reclaimed_hooks.inc_by(report.hooks_removed);
            *found += report.markers;
            let full = report.markers as usize >= batch;
            if !full {
                // A short pass ended the sweep.
                metrics
                    .reclaim_backlog
                    .set(i64::try_from(*found).unwrap_or(i64::MAX));
                *found = 0;
            }
            Ok(full)
        },
    )
}

/// Prunes the hook log by age and ceiling every `hook_log.prune_interval_ms`. Runs whether
/// or not logging is on (turning it off lets what was logged age out).
pub(super) fn spawn_hook_log_prune(
    store: Arc<Store>,
    config: &Config,
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let c = &config.hook_log;
    let batch = c.prune_batch;
    let limits = hooklog::Retention {
        retention_ms: c.retention_ms,
        max_hooks: c.max_hooks,
    };
    periodic(
        "hook log prune",
        std::time::Duration::from_millis(c.prune_interval_ms),
        stop,
        move |pruner: &mut hooklog::Pruner| {
            let r = pruner.pass(&store, AtMs(ankusa_keyspace::now_ms()), limits, batch)?;
            metrics.hook_log_pruned.inc_by(r.pruned);
            metrics
                .hook_log_hooks
                .set(i64::try_from(r.hooks).unwrap_or(i64::MAX));
            Ok(r.pruned as usize >= batch)
        },
    )
}

/// The console's samples for its charts, every 10 s.
pub(super) fn spawn_console_history(
    store: Arc<Store>,
    api: Arc<Api>,
    metrics: Arc<Metrics>,
    history: Arc<crate::console::history::History>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    periodic(
        "console history",
        std::time::Duration::from_millis(crate::console::history::INTERVAL_MS),
        stop,
        move |_: &mut ()| {
            history.sample(&store, &metrics, &api.config.load())?;
            Ok(false)
        },
    )
}

/// Settles archive obligations and removes archived hooks past their retention every
/// `archive.settle_interval_ms`.
pub(super) fn spawn_archiver(
    store: Arc<Store>,
    config: &Config,
    metrics: Arc<Metrics>,
    quotas: Arc<crate::ingest::quota::Quotas>,
    stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let (settle_batch, prune_batch) = (config.archive.settle_batch, config.archive.prune_batch);
    let policy = crate::ingest::quota::ArchivePolicy {
        config: config.clone(),
        quotas,
    };
    periodic(
        "archiver",
        std::time::Duration::from_millis(config.archive.settle_interval_ms),
        stop,
        move |a: &mut archive::Archiver| {
            // One pass of the archiver (with `log.spans` or OTLP).
            let span = tracing::debug_span!(
                target: crate::telemetry::TARGET,
                "archive.settle",
                archived = tracing::field::Empty,
                dropped = tracing::field::Empty,
                over_quota = tracing::field::Empty,
                expired = tracing::field::Empty,
            );
            let _in = span.enter();
            let settled = a.settle(&store, &policy, settle_batch)?;
            let pruned = a.prune(&store, AtMs(ankusa_keyspace::now_ms()), prune_batch)?;
            span.record("archived", settled.archived);
            span.record("dropped", settled.dropped);
            span.record("over_quota", settled.over_quota);
            span.record("expired", pruned.expired);
            let label = |outcome| ArchiveLabel { outcome };
            metrics
                .archive_settled
                .get_or_create(&label("archived"))
                .inc_by(settled.archived);
            metrics
                .archive_settled
                .get_or_create(&label("dropped"))
                .inc_by(settled.dropped);
            metrics
                .archive_settled
                .get_or_create(&label("over_quota"))
                .inc_by(settled.over_quota);
            metrics.archive_expired.inc_by(pruned.expired);
            Ok(settled.seen as usize >= settle_batch || pruned.expired as usize >= prune_batch)
        },
    )
}

/// Removes the stores restores moved aside beside `data` (`<name>.replaced-<ms>`), all but
/// the newest.
pub(super) fn remove_replaced_stores(data: &std::path::Path) {
    let mut replaced: Vec<(u64, std::path::PathBuf)> =
        crate::objstore::beside(data, "", ".replaced-")
            .into_iter()
            .filter_map(|(ms, path)| Some((ms.parse().ok()?, path)))
            .collect();
    replaced.sort();
    replaced.pop();
    for (_, path) in replaced {
        match std::fs::remove_dir_all(&path) {
            Ok(()) => {
                tracing::info!(store = %path.display(), "removed an older store a restore replaced")
            }
            Err(err) => {
                tracing::warn!(store = %path.display(), error = %err, "could not remove a store a restore replaced")
            }
        }
    }
}

/// Reads the queue gauges every `admin.gauge_interval_ms` (and once at start).
pub(super) fn spawn_gauges(
    store: Arc<Store>,
    config: &Config,
    metrics: Arc<Metrics>,
    quotas: Arc<crate::ingest::quota::Quotas>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let interval = std::time::Duration::from_millis(config.admin.gauge_interval_ms);
    tokio::spawn(async move {
        loop {
            let (s, m) = (store.clone(), metrics.clone());
            m.tenants_over_quota
                .set(quotas.over_quota(ankusa_keyspace::now_ms()) as i64);
            let tick = tokio::task::spawn_blocking(move || -> Result<(), QueueError> {
                let g = crate::metrics::gauges::read(&s, AtMs(ankusa_keyspace::now_ms()))?;
                let mut names = std::collections::HashMap::new();
                for (ord, _) in &g.top_pending {
                    names.insert(
                        *ord,
                        ankusa_queue::tenants::name(&s, *ord)?.unwrap_or_default(),
                    );
                }
                m.publish(&g, |o| names.get(&o).cloned().unwrap_or_default());
                Ok(())
            })
            .await;
            if !matches!(tick, Ok(Ok(()))) {
                tracing::warn!("queue gauge tick failed");
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

/// While the store's writes fail (a full disk, a failed WAL sync), a small synced write
/// every second, so the node becomes ready again as soon as the store takes writes, whether
/// or not traffic arrives to find out. When they have failed for `writer.exit_when_stuck_ms`
/// with an error RocksDB does not resume from ([`ankusa_queue::engine::WriteHealth::stuck`]), the
/// process exits with [`EXIT_STORE_STUCK`] at once, as a crash would: a graceful stop's
/// writes would fail too, and the restart's open replays the WAL (what the crash tests
/// prove). Keeps `ankusa_store_write_failing`, `ankusa_store_write_failures_total` and
/// `ankusa_store_corruption_errors_total` current.
pub(super) fn spawn_write_probe(
    store: Arc<Store>,
    exit_when_stuck_ms: u64,
    metrics: Arc<Metrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut counted = 0;
        loop {
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            if store.health().failing() {
                let s = store.clone();
                // Its outcome is the store's health; a failure is already logged there.
                let probe = tokio::task::spawn_blocking(move || s.probe_write()).await;
                if let Ok(Err(e)) = probe {
                    if exit_when_stuck_ms > 0 && store.health().stuck(&e, exit_when_stuck_ms) {
                        let (first, since) = store.health().error().unwrap_or_default();
                        tracing::error!(
                            error = %e,
                            first_error = %first,
                            failing_for_ms = ankusa_keyspace::now_ms().saturating_sub(since),
                            code = EXIT_STORE_STUCK,
                            "store: writes fail with an error RocksDB does not resume from; \
                             exiting so that the node restarts and its open replays the WAL"
                        );
                        exit_at_once(EXIT_STORE_STUCK);
                    }
                }
            }
            let failures = store.health().failures();
            metrics.store_write_failures.inc_by(failures - counted);
            counted = failures;
            metrics
                .store_write_failing
                .set(i64::from(store.health().failing()));
            set_store_memory(&store, &metrics);
            for (family, n) in ankusa_queue::engine::corruptions() {
                let c = metrics.store_corruption.get_or_create(&StoreFamilyLabel {
                    family: family.name().to_owned(),
                });
                c.inc_by(n.saturating_sub(c.get()));
            }
        }
    })
}

/// `ankusa_store_memory_bytes` and `ankusa_store_memory_budget_bytes` from the store.
pub(super) fn set_store_memory(store: &Store, metrics: &Metrics) {
    if let Some((used, budget)) = store.memory_usage() {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        metrics.store_memory_bytes.set(gauge(used));
        metrics.store_memory_budget_bytes.set(gauge(budget));
    }
}

/// Prunes audit rows past `admin.audit_retention_ms`, a bounded batch a minute.
/// Reads the other nodes' ledgers of tenant slots once (a Relay of several nodes).
pub(super) fn spawn_learn_loans(
    cluster: Arc<Cluster>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        tokio::select! {
            _ = cluster.learn_loans() => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    })
}

/// Hands the rows this node stores of tenants other nodes own to their owners (a Relay of
/// several nodes; `cluster::handoff`).
pub(super) fn spawn_handoff(
    store: Arc<Store>,
    writer: ankusa_queue::writer::WriterHandle,
    cluster: Arc<Cluster>,
    interval_ms: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let interval = std::time::Duration::from_millis(interval_ms);
    let sender = Arc::new(crate::cluster::handoff::Sender::new(
        store, writer, cluster, interval,
    ));
    tokio::spawn(async move {
        tokio::select! {
            _ = sender.run() => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    })
}

pub(super) fn spawn_audit_prune(
    store: Arc<Store>,
    config: &Config,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let retention = config.admin.audit_retention_ms;
    tokio::spawn(async move {
        loop {
            tokio::select! {
                _ = tokio::time::sleep(std::time::Duration::from_secs(60)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
            let s = store.clone();
            let cutoff = ankusa_keyspace::now_ms().saturating_sub(retention);
            if let Ok(Err(e)) =
                tokio::task::spawn_blocking(move || ankusa_queue::audit::prune(&s, cutoff, 1_000))
                    .await
            {
                tracing::warn!(error = %e, "audit prune failed");
            }
        }
    })
}
