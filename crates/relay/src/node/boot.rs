//! The steps of a node's boot ([`super::Node`]'s `boot` composes them): the store opened, the
//! state the API and the node's parts share, the admin listener's router, the migrations
//! and recovery, the pull gateway, and the node's background tasks.

use std::ops::ControlFlow;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use crate::admin::api::Api;
use crate::admin::auth::Tokens;
use crate::admin::{self, AdminState};
use crate::cluster::Cluster;
use crate::dispatch::delivery::Deliverer;
use crate::dispatch::pipeline::{self, PipelineSettings};
use crate::ingest::quarantine::Quarantine;
use crate::metrics::Metrics;
use ankusa_config::{ArchivePolicy, Config};
use ankusa_keyspace::AtMs;
use ankusa_queue::audit::Audit;
use ankusa_queue::deliveries;
use ankusa_queue::engine::{migrate, Store, SUPPORTED_FORMAT};
use ankusa_queue::hints::DueHints;
use ankusa_queue::writer::Assembler;

use super::limits::{cgroup_memory_limit, open_files_limit, store_options};
use super::tasks::{
    set_store_memory, spawn_archiver, spawn_audit_prune, spawn_console_history, spawn_gauges,
    spawn_handoff, spawn_hook_log_prune, spawn_learn_loans, spawn_reclaim, spawn_write_probe,
};
use super::NodeError;

/// Opens the store (off the async threads), logging the limits it opens under.
pub(super) async fn open_store(
    config: &Config,
    metrics: &Metrics,
) -> Result<Arc<Store>, NodeError> {
    let data_dir = config.data_dir.clone();
    let opts = store_options(config);
    tracing::info!(
        open_files_limit =
            open_files_limit().map_or_else(|| "unlimited".to_owned(), |n| n.to_string()),
        store_max_open_files = opts.max_open_files,
        memory_limit = cgroup_memory_limit().map_or_else(|| "none".to_owned(), |n| n.to_string()),
        store_block_cache_bytes = opts.memory.map_or(0, |m| m.block_cache_bytes),
        store_write_buffer_bytes = opts.memory.map_or(0, |m| m.write_buffer_bytes),
        "opening the store"
    );
    let store = tokio::task::spawn_blocking(move || Store::open(&data_dir, &opts))
        .await
        .map_err(NodeError::task("opening the store"))?
        .map_err(|source| NodeError::Open {
            path: config.data_dir.clone(),
            source,
        })?;
    let store = Arc::new(store);
    metrics.tenants_max.set(i64::from(config.tenants.max));
    // From the first scrape (the write probe keeps them current every second).
    set_store_memory(&store, metrics);
    Ok(store)
}

/// What the admin API, the eraser, ingest and dispatch share: the pauses, quotas, erases,
/// quarantine, due hints and audit trail (the pauses, quotas and erases are filled from
/// the store once its format is current: [`recover`]).
pub(super) fn api_state(
    config: &Config,
    store: &Arc<Store>,
    metrics: &Arc<Metrics>,
    cluster: Arc<Cluster>,
) -> Result<(Arc<Api>, Arc<Quarantine>), NodeError> {
    let quarantine = Arc::new(Quarantine::open(
        store.clone(),
        metrics.clone(),
        config.quarantine.max_entries,
        config.quarantine.max_bytes,
    )?);
    let api = Arc::new(Api {
        paused: Arc::new(crate::dispatch::paused::Paused::counted(
            metrics.tenants_paused.clone(),
        )),
        quotas: Arc::new(crate::ingest::quota::Quotas::new(
            config.tenants.limits,
            metrics.tenant_limit_overrides.clone(),
        )),
        eraser: Arc::new(crate::erase::Eraser::default()),
        endpoints: Arc::new(crate::endpoints::Book::new(
            store.clone(),
            &config.endpoints,
            metrics,
        )),
        cluster,
        hints: Arc::new(DueHints::default()),
        store: store.clone(),
        tokens: Arc::new(arc_swap::ArcSwap::from_pointee(Tokens::from_config(
            config,
        )?)),
        audit: Arc::new(Audit::open(store)?),
        config: Arc::new(arc_swap::ArcSwap::from_pointee(config.clone())),
        config_status: Arc::new(std::sync::Mutex::new(ankusa_api::node::ConfigStatus {
            loaded_at_ms: ankusa_keyspace::now_ms(),
            ..Default::default()
        })),
        quarantine: Some(quarantine.clone()),
        progress: Arc::new(crate::upgrade::Progress::default()),
        writer: std::sync::OnceLock::new(),
        ingest: std::sync::OnceLock::new(),
        backups: std::sync::OnceLock::new(),
        replays: crate::dispatch::replays::Replays::new(config.writer.queue_capacity),
    });
    Ok((api, quarantine))
}

/// The admin listener's router: the API, the console nested under `/ui` (when on), behind
/// the node-identity edge.
pub(super) fn admin_app(
    config: &Config,
    api: &Arc<Api>,
    metrics: &Arc<Metrics>,
    ready: Arc<AtomicBool>,
    history: Arc<crate::console::history::History>,
) -> axum::Router {
    let admin_state = Arc::new(AdminState {
        store: api.store.clone(),
        ready,
        metrics: metrics.clone(),
        tokens: api.tokens.clone(),
        metrics_access: config.admin.metrics,
    });
    let app = admin::router(admin_state, api.clone(), crate::openapi::routes());
    // The console calls the API in-process through the admin router it is nested in.
    let app = if config.admin.console.enabled {
        let console = Arc::new(crate::console::Console::new(
            api.clone(),
            app.clone(),
            metrics.clone(),
            history,
        ));
        app.nest_service("/ui", crate::console::router(console))
    } else {
        app
    };
    let edge_cluster = api.cluster.clone();
    app.layer(axum::middleware::from_fn(move |req, next| {
        crate::cluster::edge(edge_cluster.clone(), true, req, next)
    }))
}

/// The boot's store work, off the async threads: the format migrations (their progress on
/// `/v1/node`), then recovery — deliveries in flight made due again, pauses, erases and
/// quotas loaded, lost markers restored — and the writer's assembler. The rows recovered.
pub(super) fn recover(config: &Config, api: &Api) -> Result<(u64, Assembler), NodeError> {
    let store = &*api.store;
    let progress = &api.progress;
    let out = migrate::run(
        store,
        &ankusa_queue::formats::builtin(),
        SUPPORTED_FORMAT,
        |p| {
            tracing::info!(
                from = p.from,
                to = p.to,
                steps = p.steps,
                rows = p.rows,
                "migration step"
            );
            progress.set(
                (!p.finished).then_some(ankusa_api::node::MigrationProgress {
                    from: p.from,
                    to: p.to,
                    steps: p.steps,
                    rows: p.rows,
                }),
            );
            ControlFlow::Continue(())
        },
    )?;
    progress.set(None);
    tracing::info!(?out, "store format current");
    let (max_tenants, tenants) = (config.tenants.max, ankusa_queue::tenants::count(store)?);
    if tenants > max_tenants {
        tracing::warn!(
            tenants,
            tenants_max = max_tenants,
            "the store holds more tenants than tenants.max: existing tenants are served, new ones are refused"
        );
    }
    let stale = admin::backups::remove_cut_backups(&config.backup_dir())?;
    if stale > 0 {
        tracing::warn!(
            stale,
            "removed checkpoints and half-packed archives of backups a stop cut short"
        );
    }
    let now = AtMs(ankusa_keyspace::now_ms());
    let recovered = deliveries::recover_inflight(store, now, config.hook_log.enabled)?;
    let paused_now = api.paused.load(store)?;
    if paused_now > 0 {
        tracing::info!(
            tenants = paused_now,
            "paused tenants: their deliveries are held"
        );
    }
    // After the pauses: an erase's hold wins over a pause.
    let erasing = api.eraser.load(store, &api.paused)?;
    if erasing > 0 {
        tracing::info!(
            tenants = erasing,
            "tenants being erased: their erase goes on"
        );
    }
    let limited = api.quotas.load(store)?;
    if limited > 0 {
        tracing::info!(tenants = limited, "tenants with their own limits");
    }
    let endpoints = api.endpoints.load()?;
    if endpoints > 0 {
        tracing::info!(endpoints, "tenants' own endpoints");
    }
    let markers = deliveries::repair_markers_except(store, |o| api.paused.holds(o))?;
    if markers > 0 {
        tracing::warn!(markers, "restored active markers a crash had lost");
    }
    let archived: Vec<String> = config
        .sources
        .iter()
        .filter(|s| matches!(config.archive_policy(&s.id), ArchivePolicy::Archive { .. }))
        .map(|s| s.id.clone())
        .collect();
    let assembler = Assembler::open(store, config.tenants.max)?
        .erasing(api.eraser.erasing.clone())
        .logging(config.hook_log.enabled)
        .archiving(archived);
    Ok((recovered, assembler))
}

/// The pull gateway, with the leases the store holds across a restart back in its book.
pub(super) async fn pull_gateway(
    config: &Config,
    api: &Api,
    deliverer: &Deliverer,
    metrics: &Arc<Metrics>,
) -> Result<Arc<crate::pull::Gateway>, NodeError> {
    let gateway = crate::pull::Gateway::new(
        config,
        crate::pull::Parts {
            store: api.store.clone(),
            cluster: api.cluster.clone(),
            deliverer: deliverer.clone(),
            paused: api.paused.clone(),
            hints: api.hints.clone(),
            metrics: metrics.clone(),
        },
    )?;
    let g = gateway.clone();
    let leases = tokio::task::spawn_blocking(move || g.load())
        .await
        .map_err(NodeError::task("boot: reading the pull leases"))??;
    if leases > 0 {
        tracing::info!(
            leases,
            "pull leases held across the restart: each ends with its ack or at its deadline"
        );
    }
    Ok(gateway)
}

/// What the pipeline and the pull gateway's expiry run with.
pub(super) struct Pipeline {
    pub(super) deliverer: Deliverer,
    pub(super) hints: Arc<DueHints>,
    pub(super) starter: Arc<pipeline::runner::Starter>,
    pub(super) gateway: Arc<crate::pull::Gateway>,
    pub(super) history: Arc<crate::console::history::History>,
    /// The handoff takes a batch its receiver refused back through it.
    pub(super) writer: ankusa_queue::writer::WriterHandle,
}

/// The node's tasks, each until `stop`: the pipeline, reclaim, the pull leases' expiry,
/// the hook log's and the audit trail's pruning, the archiver, the gauges, the eraser, the
/// tenant registry's loans, the handoff, the write probe, the console's samples (when it
/// is on) and the pushes to an object store (when configured).
pub(super) fn background_tasks(
    config: &Config,
    store: &Arc<Store>,
    metrics: &Arc<Metrics>,
    api: &Arc<Api>,
    p: Pipeline,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<tokio::task::JoinHandle<()>> {
    let Pipeline {
        deliverer,
        hints,
        starter,
        gateway,
        history,
        writer,
    } = p;
    // The console's samples, when it is on.
    let console_history = config.admin.console.enabled.then(|| {
        spawn_console_history(
            store.clone(),
            api.clone(),
            metrics.clone(),
            history,
            stop.clone(),
        )
    });
    let mut background = vec![
        pipeline::spawn(
            store.clone(),
            deliverer,
            PipelineSettings::from_config(config),
            metrics.clone(),
            hints,
            starter,
            stop.clone(),
        ),
        spawn_reclaim(store.clone(), config, metrics.clone(), stop.clone()),
        crate::pull::settle::spawn_expiry(gateway, stop.clone()),
        spawn_hook_log_prune(store.clone(), config, metrics.clone(), stop.clone()),
        spawn_archiver(
            store.clone(),
            config,
            metrics.clone(),
            api.quotas.clone(),
            stop.clone(),
        ),
        spawn_gauges(
            store.clone(),
            config,
            metrics.clone(),
            api.quotas.clone(),
            stop.clone(),
        ),
        spawn_audit_prune(store.clone(), config, stop.clone()),
        crate::erase::spawn(
            crate::erase::Deps {
                store: api.store.clone(),
                audit: api.audit.clone(),
                eraser: api.eraser.clone(),
                paused: api.paused.clone(),
                quotas: api.quotas.clone(),
                endpoints: api.endpoints.clone(),
                quarantine: api.quarantine.clone(),
                config: api.config.clone(),
            },
            stop.clone(),
        ),
        spawn_learn_loans(api.cluster.clone(), stop.clone()),
        spawn_handoff(
            store.clone(),
            writer,
            api.cluster.clone(),
            config.cluster.handoff_interval_ms,
            stop.clone(),
        ),
        spawn_write_probe(
            store.clone(),
            config.writer.exit_when_stuck_ms,
            metrics.clone(),
            stop.clone(),
        ),
    ];
    background.extend(console_history);
    let stop_backups = stop;
    if let Some(o) = &config.backup.object_store {
        let node = config.cluster.name.as_deref().unwrap_or("node");
        let (backups, task) = crate::objstore::schedule::spawn(
            store.clone(),
            config.data_dir.clone(),
            o.clone(),
            node,
            metrics.clone(),
            stop_backups,
        );
        let _ = api.backups.set(backups);
        background.push(task);
    }
    background
}
