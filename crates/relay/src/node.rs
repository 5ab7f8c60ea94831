//! A running relay node: boot order, listeners and shutdown.
//!
//! Boot: bind both listeners and serve them at once (`/healthz` 200, `/readyz` 503
//! `store_opening`) → open the store (format guard first; `max_open_files` bounded by the
//! open-file limit) → the admin router (`/readyz` 503 `not_ready` while migrating) → run
//! pending migrations → recover inflight rows → restore lost active markers → start the
//! writer → the ingest router → start the dispatch pipeline and reclaim → ready. Both
//! listeners are bound before anything slow happens, so a port clash fails the start at
//! once and a liveness probe never waits for a WAL replay. A stop signal before ready ends
//! the process at once ([`StopSignals::start_node`]). Shutdown (SIGTERM) fails readiness
//! first, stops the listeners, lets deliveries in flight finish within
//! `shutdown.grace_ms` and commits their outcomes (what the deadline cuts is due again,
//! synced), and drains the writer.

use std::net::SocketAddr;
use std::ops::ControlFlow;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::admin::api::Api;
use crate::admin::auth::Tokens;
use crate::admin::{self, AdminState};
use crate::cluster::Cluster;
use crate::dispatch::delivery::Deliverer;
use crate::dispatch::pipeline::{self, PipelineSettings};
use crate::ingest::{quarantine::Quarantine, IngestState};
use crate::metrics::{ArchiveLabel, Metrics, StoreFamilyLabel};
use ankusa_config::{ArchivePolicy, Config, ConfigError};
use ankusa_keyspace::AtMs;
use ankusa_queue::audit::Audit;
use ankusa_queue::hints::DueHints;
use ankusa_queue::writer::{self, Assembler, WriterSettings};
use ankusa_queue::{archive, deliveries, hooklog, QueueError};
use ankusa_store::{migrate, OpenOptions, Store, StoreError, SUPPORTED_FORMAT};

/// Errors of starting, running and stopping a node.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("opening the store at {path}: {source}")]
    Open {
        path: std::path::PathBuf,
        source: StoreError,
    },
    #[error(transparent)]
    Queue(#[from] QueueError),
    #[error("{context}: {source}")]
    Io {
        context: String,
        source: std::io::Error,
    },
    #[error("{what}: the task did not finish: {source}")]
    Task {
        what: &'static str,
        source: tokio::task::JoinError,
    },
    #[error("the writer thread panicked")]
    WriterPanicked,
    #[error(transparent)]
    Cluster(#[from] crate::cluster::ClusterError),
}

impl From<StoreError> for NodeError {
    fn from(e: StoreError) -> Self {
        NodeError::Queue(e.into())
    }
}

impl NodeError {
    fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| NodeError::Io { context, source }
    }

    fn task(what: &'static str) -> impl FnOnce(tokio::task::JoinError) -> Self {
        move |source| NodeError::Task { what, source }
    }
}

/// A bound listener whose socket answers [`crate::http::booting`] (through a duplicate of
/// it) until [`Listener::serve`] puts the full router on the socket itself. Connections that
/// arrive in between wait in the socket's backlog, and no request of the running node passes
/// through anything of the boot.
struct Listener {
    socket: std::net::TcpListener,
    /// Ends the booting server (it ends with the node's stop too).
    booted: tokio::sync::watch::Sender<bool>,
    /// Closed once the booting server has ended: no connection of its is left.
    ended: tokio::sync::oneshot::Receiver<()>,
}

impl Listener {
    /// Binds `addr` (the configuration's `key`) and serves the booting router on it at once;
    /// answers the listener and the booting server's task.
    fn bind(
        key: &str,
        addr: SocketAddr,
        limits: ankusa_config::listen::ConnectionLimits,
        meters: crate::http::serve::Meters,
        stop: &tokio::sync::watch::Receiver<bool>,
    ) -> Result<(Listener, tokio::task::JoinHandle<std::io::Result<()>>), NodeError> {
        let context = format!("binding {key} {addr}");
        let socket = ankusa_config::listen::bind(addr).map_err(NodeError::io(context.clone()))?;
        let early = socket
            .try_clone()
            .and_then(tokio::net::TcpListener::from_std)
            .map_err(NodeError::io(context))?;
        let (booted, mut done) = tokio::sync::watch::channel(false);
        let (end, ended) = tokio::sync::oneshot::channel();
        let mut stop = stop.clone();
        // The booting server ends when the full router takes over or the node stops; its
        // connections within the same limits (a client holding one open must not keep the
        // full router from serving).
        let (over, over_rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let ending = tokio::spawn(async move {
                tokio::select! {
                    _ = done.wait_for(|d| *d) => {}
                    _ = stop.wait_for(|s| *s) => {}
                }
                let _ = over.send(true);
            });
            let served =
                crate::http::serve::serve(early, crate::http::booting(), limits, meters, over_rx)
                    .await;
            ending.abort();
            drop(end);
            served
        });
        Ok((
            Listener {
                socket,
                booted,
                ended,
            },
            task,
        ))
    }

    fn local_addr(&self) -> Result<SocketAddr, NodeError> {
        self.socket
            .local_addr()
            .map_err(NodeError::io("reading a listener's address"))
    }

    /// Ends the booting server, waits until it has (so that no request is answered by it
    /// once the full router serves), and serves `app` on the socket within `limits` until
    /// the node stops.
    async fn serve(
        self,
        app: axum::Router,
        limits: ankusa_config::listen::ConnectionLimits,
        meters: crate::http::serve::Meters,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<tokio::task::JoinHandle<std::io::Result<()>>, NodeError> {
        let _ = self.booted.send(true);
        let _ = self.ended.await;
        let listener = tokio::net::TcpListener::from_std(self.socket)
            .map_err(NodeError::io("serving a listener"))?;
        Ok(tokio::spawn(crate::http::serve::serve(
            listener, app, limits, meters, stop,
        )))
    }
}

/// A listener's series in the node's registry, for its server.
fn listener_meters(metrics: &Metrics, listener: &'static str) -> crate::http::serve::Meters {
    let l = &metrics.listeners;
    crate::http::serve::Meters {
        open: l.open(listener),
        refused: l.refused(listener),
        header_timeouts: l.timeouts(listener, "headers"),
        body_timeouts: l.timeouts(listener, "body"),
    }
}

/// What [`Node::boot`] started behind the listeners.
struct Booted {
    store: Arc<Store>,
    metrics: Arc<Metrics>,
    recovered: u64,
    ready: Arc<AtomicBool>,
    servers: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    background: Vec<tokio::task::JoinHandle<()>>,
    writer: std::thread::JoinHandle<()>,
    reloader: Arc<crate::reload::Reloader>,
}

/// A started node.
pub struct Node {
    pub ingest_addr: SocketAddr,
    pub admin_addr: SocketAddr,
    pub store: Arc<Store>,
    pub metrics: Arc<Metrics>,
    pub recovered_inflight: u64,
    ready: Arc<AtomicBool>,
    shutdown: tokio::sync::watch::Sender<bool>,
    servers: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
    background: Vec<tokio::task::JoinHandle<()>>,
    writer: Option<std::thread::JoinHandle<()>>,
    /// Applies a new configuration file's reloadable keys ([`crate::reload`]).
    pub reloader: Arc<crate::reload::Reloader>,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node")
            .field("ingest_addr", &self.ingest_addr)
            .field("admin_addr", &self.admin_addr)
            .finish()
    }
}

/// Every `interval` until stopped, runs `pass` on a blocking thread with its state (a
/// cursor kept from pass to pass), and again at once while it answers `Ok(true)` (a full
/// pass: more is waiting), so the task keeps up with any rate; a failed pass is logged and
/// waits for the next interval. The node's reclaim, hook log pruning and archiver.
fn periodic<S: Default + Send + 'static>(
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
fn spawn_reclaim(
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
fn spawn_hook_log_prune(
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
fn spawn_console_history(
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
fn spawn_archiver(
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
fn remove_replaced_stores(data: &std::path::Path) {
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
fn spawn_gauges(
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

/// The exit code of a node whose store is stuck (`writer.exit_when_stuck_ms`): EX_TEMPFAIL,
/// a failure that a restart clears.
pub const EXIT_STORE_STUCK: i32 = 75;

/// Ends the process with `code` as a crash would: no destructors, no `atexit` handlers
/// (RocksDB's static destructors must not run under its live background threads). What
/// the store wrote is in the OS already, and the log went to unbuffered stderr.
#[allow(unsafe_code)]
fn exit_at_once(code: i32) -> ! {
    // SAFETY: `_exit` has no preconditions; it ends the process without touching its memory.
    unsafe { libc::_exit(code) }
}

/// The exit code of a node stopped by SIGTERM or SIGINT before it was ready (while its
/// store opened, migrated or recovered): 128 + SIGTERM, as a shell reports it.
pub const EXIT_STOPPED_DURING_BOOT: i32 = 143;

/// SIGTERM and SIGINT, taken from the first thing `run` does: the node is PID 1 in its
/// container, and PID 1 ignores a signal it has no handler for, so a pod deleted while
/// its store opens or migrates would wait out its whole grace period.
pub struct StopSignals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
    /// SIGHUP, handled from the start so that it never ends the process: a running node
    /// reloads its configuration on it ([`StopSignals::hangups`]).
    hup: Option<tokio::signal::unix::Signal>,
}

impl StopSignals {
    /// Installs the handlers (inside a Tokio runtime).
    pub fn install() -> Result<StopSignals, NodeError> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(StopSignals {
            term: signal(SignalKind::terminate())
                .map_err(NodeError::io("installing the SIGTERM handler"))?,
            int: signal(SignalKind::interrupt())
                .map_err(NodeError::io("installing the SIGINT handler"))?,
            hup: Some(
                signal(SignalKind::hangup())
                    .map_err(NodeError::io("installing the SIGHUP handler"))?,
            ),
        })
    }

    /// The SIGHUP stream, for the configuration's reload (once).
    pub fn hangups(&mut self) -> Option<tokio::signal::unix::Signal> {
        self.hup.take()
    }

    /// The next stop signal's name.
    pub async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.term.recv() => "SIGTERM",
            _ = self.int.recv() => "SIGINT",
        }
    }

    /// Starts a node, unless a stop signal comes first: then the process ends at once with
    /// [`EXIT_STOPPED_DURING_BOOT`], as a kill would (the open replays the WAL and every
    /// migration step resumes where it stopped: what the crash and migration-kill tests
    /// prove). A graceful stop has nothing to drain before the node is ready.
    pub async fn start_node(&mut self, config: Config) -> Result<Node, NodeError> {
        tokio::select! {
            node = Node::start(config) => node,
            signal = self.recv() => {
                tracing::warn!(
                    signal,
                    code = EXIT_STOPPED_DURING_BOOT,
                    "stopped before the node was ready; the store's open and any migration resume at the next start"
                );
                exit_at_once(EXIT_STOPPED_DURING_BOOT)
            }
        }
    }
}

/// This process's `RLIMIT_NOFILE`.
#[allow(unsafe_code)]
fn nofile() -> std::io::Result<libc::rlimit> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the one struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(l)
}

/// A limit, `None` when unlimited.
fn finite(n: libc::rlim_t) -> Option<u64> {
    (n != libc::RLIM_INFINITY).then_some(n)
}

/// The soft `RLIMIT_NOFILE` of this process (`None`: unlimited, or unreadable).
/// The memory limit of this process's cgroup, if it has one: cgroup v2's `memory.max`, or
/// v1's `memory.limit_in_bytes` (where "no limit" is a number near `i64::MAX`).
pub fn cgroup_memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_memory_limit_in(&own, std::path::Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_memory_limit`] for a `/proc/self/cgroup` of `own` under the cgroup mount `root`.
pub fn cgroup_memory_limit_in(own: &str, root: &std::path::Path) -> Option<u64> {
    let read = |p: std::path::PathBuf| -> Option<u64> {
        let text = std::fs::read_to_string(p).ok()?;
        // Unlimited: "max" (v2), or the page-rounded i64::MAX (v1).
        text.trim().parse::<u64>().ok().filter(|n| *n < 1 << 60)
    };
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // v2: the unified hierarchy. A limit anywhere up the tree bounds this one.
            let mut dir = root.join(path);
            if !dir.exists() {
                dir = root.to_path_buf();
            }
            let mut lowest: Option<u64> = None;
            loop {
                if let Some(n) = read(dir.join("memory.max")) {
                    lowest = Some(lowest.map_or(n, |l| l.min(n)));
                }
                if dir == root || !dir.pop() {
                    break;
                }
            }
            if lowest.is_some() {
                return lowest;
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            // v1 (hierarchical by default: the limit in force is the smallest up the tree,
            // which the kernel reports as hierarchical_memory_limit).
            // In a container without its own cgroup namespace the path is the host's, and
            // the container's cgroup is mounted at the hierarchy's root instead.
            let mut dir = root.join("memory").join(path);
            if !dir.exists() {
                dir = root.join("memory");
            }
            if let Some(n) = std::fs::read_to_string(dir.join("memory.stat"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .filter(|n| *n < 1 << 60)
            {
                return Some(n);
            }
            return read(dir.join("memory.limit_in_bytes"));
        }
    }
    None
}

/// Opens the store (off the async threads), logging the limits it opens under.
async fn open_store(config: &Config, metrics: &Metrics) -> Result<Arc<Store>, NodeError> {
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
fn api_state(
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
        backups: std::sync::OnceLock::new(),
        replays: crate::dispatch::replays::Replays::new(config.writer.queue_capacity),
    });
    Ok((api, quarantine))
}

/// The admin listener's router: the API, the console nested under `/ui` (when on), behind
/// the node-identity edge.
fn admin_app(
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
fn recover(config: &Config, api: &Api) -> Result<(u64, Assembler), NodeError> {
    let store = &*api.store;
    let progress = &api.progress;
    let out = migrate::run(store, &crate::upgrade::builtin(), SUPPORTED_FORMAT, |p| {
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
    })?;
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
async fn pull_gateway(
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
struct Pipeline {
    deliverer: Deliverer,
    hints: Arc<DueHints>,
    starter: Arc<pipeline::runner::Starter>,
    gateway: Arc<crate::pull::Gateway>,
    history: Arc<crate::console::history::History>,
}

/// The node's tasks, each until `stop`: the pipeline, reclaim, the pull leases' expiry,
/// the hook log's and the audit trail's pruning, the archiver, the gauges, the eraser, the
/// tenant registry's loans, the handoff, the write probe, the console's samples (when it
/// is on) and the pushes to an object store (when configured).
fn background_tasks(
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
        crate::pull::spawn_expiry(gateway, stop.clone()),
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
                quarantine: api.quarantine.clone(),
                config: api.config.clone(),
            },
            stop.clone(),
        ),
        spawn_learn_loans(api.cluster.clone(), stop.clone()),
        spawn_handoff(
            store.clone(),
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

/// The options a node opens its store with: at most half of this process's open-file
/// limit in table files ([`ankusa_store::max_open_files_for`]) and one memory budget
/// ([`store_memory_budget`], from `store.memory_bytes` or the cgroup's limit). Whatever
/// else opens the same store to do a node's work (the benches' twins) opens it so too.
pub fn store_options(config: &Config) -> OpenOptions {
    OpenOptions {
        max_open_files: ankusa_store::max_open_files_for(open_files_limit()),
        memory: Some(store_memory_budget(config, cgroup_memory_limit())),
        ..OpenOptions::default()
    }
}

/// The store's memory budget: `store.memory_bytes`, else a quarter of the cgroup's memory
/// `limit` (the rest is the node's own: requests in flight, writer batches, delivery
/// buffers), else 512 MiB.
pub fn store_memory_budget(config: &Config, limit: Option<u64>) -> ankusa_store::MemoryBudget {
    let total = config
        .store
        .memory_bytes
        .or(limit.map(|l| l / 4))
        .unwrap_or(512 << 20);
    ankusa_store::MemoryBudget::of_total(total)
}

pub fn open_files_limit() -> Option<u64> {
    nofile().ok().and_then(|l| finite(l.rlim_cur))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. Container runtimes start processes
/// with a soft limit of 1 024, which a store of tens of GB (thousands of table files) and
/// a few hundred connections exceed; the hard limit is what the runtime allows. Answers the
/// soft limits before and after (`None`: unlimited).
#[allow(unsafe_code)]
pub fn raise_open_files_limit() -> std::io::Result<(Option<u64>, Option<u64>)> {
    let mut l = nofile()?;
    let before = finite(l.rlim_cur);
    if l.rlim_cur != l.rlim_max {
        l.rlim_cur = l.rlim_max;
        // SAFETY: `setrlimit` reads the one struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((before, finite(l.rlim_cur)))
}

/// While the store's writes fail (a full disk, a failed WAL sync), a small synced write
/// every second, so the node becomes ready again as soon as the store takes writes, whether
/// or not traffic arrives to find out. When they have failed for `writer.exit_when_stuck_ms`
/// with an error RocksDB does not resume from ([`ankusa_store::WriteHealth::stuck`]), the
/// process exits with [`EXIT_STORE_STUCK`] at once, as a crash would: a graceful stop's
/// writes would fail too, and the restart's open replays the WAL (what the crash tests
/// prove). Keeps `ankusa_store_write_failing`, `ankusa_store_write_failures_total` and
/// `ankusa_store_corruption_errors_total` current.
fn spawn_write_probe(
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
            for (family, n) in ankusa_store::corruptions() {
                let c = metrics.store_corruption.get_or_create(&StoreFamilyLabel {
                    family: family.name().to_owned(),
                });
                c.inc_by(n.saturating_sub(c.get()));
            }
        }
    })
}

/// `ankusa_store_memory_bytes` and `ankusa_store_memory_budget_bytes` from the store.
fn set_store_memory(store: &Store, metrics: &Metrics) {
    if let Some((used, budget)) = store.memory_usage() {
        let gauge = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        metrics.store_memory_bytes.set(gauge(used));
        metrics.store_memory_budget_bytes.set(gauge(budget));
    }
}

/// Prunes audit rows past `admin.audit_retention_ms`, a bounded batch a minute.
/// Reads the other nodes' ledgers of tenant slots once (a Relay of several nodes).
fn spawn_learn_loans(
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
fn spawn_handoff(
    store: Arc<Store>,
    cluster: Arc<Cluster>,
    interval_ms: u64,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let interval = std::time::Duration::from_millis(interval_ms);
    let sender = Arc::new(crate::cluster::handoff::Sender::new(
        store, cluster, interval,
    ));
    tokio::spawn(async move {
        tokio::select! {
            _ = sender.run() => {}
            _ = stop.wait_for(|s| *s) => {}
        }
    })
}

fn spawn_audit_prune(
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

/// Every check a node makes on a loaded configuration before it opens its store: the
/// sources' verifiers and secrets, the sinks' URLs, secrets and headers, the admin tokens.
/// `config check` runs exactly this.
pub fn check(config: &Config) -> Result<(), ConfigError> {
    crate::ingest::sources(config)?;
    Deliverer::from_config(config)?;
    Tokens::from_config(config)?;
    Ok(())
}

impl Node {
    /// Starts a node from a validated configuration.
    pub async fn start(config: Config) -> Result<Node, NodeError> {
        check(&config)?;
        for warning in config.warnings() {
            tracing::warn!(%warning, "the configuration is valid but likely not meant");
        }
        // Both listeners first, before anything slow: a port clash fails the start at
        // once, and `/healthz` answers (`/readyz` 503 `store_opening`) while the store
        // opens and replays its WAL.
        let (shutdown, stop) = tokio::sync::watch::channel(false);
        let metrics = Arc::new(Metrics::new());
        let (ingest, early_ingest) = Listener::bind(
            "ingest.listen",
            config.ingest.listen,
            config.ingest.connections,
            listener_meters(&metrics, "ingest"),
            &stop,
        )?;
        let mut early = vec![early_ingest];
        let (admin_l, early_admin) = match Listener::bind(
            "admin.listen",
            config.admin.listen,
            config.admin.connections,
            listener_meters(&metrics, "admin"),
            &stop,
        ) {
            Ok(l) => l,
            Err(e) => return Err(Self::failed(&shutdown, early, e).await),
        };
        early.push(early_admin);
        let (ingest_addr, admin_addr) = match (ingest.local_addr(), admin_l.local_addr()) {
            (Ok(i), Ok(a)) => (i, a),
            (Err(e), _) | (_, Err(e)) => return Err(Self::failed(&shutdown, early, e).await),
        };
        tracing::info!(%ingest_addr, %admin_addr, "listening; opening the store");
        match Self::boot(config, metrics, admin_l, ingest, stop).await {
            Ok(parts) => Ok(Node {
                ingest_addr,
                admin_addr,
                store: parts.store,
                metrics: parts.metrics,
                recovered_inflight: parts.recovered,
                ready: parts.ready,
                shutdown,
                servers: parts.servers,
                background: parts.background,
                writer: Some(parts.writer),
                reloader: parts.reloader,
            }),
            Err(e) => Err(Self::failed(&shutdown, early, e).await),
        }
    }

    /// A failed start: the booting servers stop, and are gone (their sockets closed) before
    /// `start` returns, as a supervisor may start another node on the same ports at once.
    async fn failed(
        shutdown: &tokio::sync::watch::Sender<bool>,
        early: Vec<tokio::task::JoinHandle<std::io::Result<()>>>,
        e: NodeError,
    ) -> NodeError {
        let _ = shutdown.send(true);
        for task in early {
            task.abort();
            let _ = task.await;
        }
        e
    }

    /// Everything slow of a start, behind listeners that already serve: opens the store,
    /// installs the admin router, migrates and recovers, starts the writer, installs the
    /// ingest router, starts the pipeline and the periodic tasks.
    async fn boot(
        config: Config,
        metrics: Arc<Metrics>,
        admin_l: Listener,
        ingest: Listener,
        stop: tokio::sync::watch::Receiver<bool>,
    ) -> Result<Booted, NodeError> {
        let sources = crate::ingest::sources(&config)?;
        let deliverer = Deliverer::from_config(&config)?;
        let store = open_store(&config, &metrics).await?;
        let cluster = Arc::new(Cluster::new(&config, &store, metrics.clone())?);
        let ingest_edge = cluster.clone();
        let ready = Arc::new(AtomicBool::new(false));
        let (api, quarantine) = api_state(&config, &store, &metrics, cluster.clone())?;
        let history = Arc::new(crate::console::history::History::new(
            metrics.console_history_tenants.clone(),
        ));
        let admin_app = admin_app(&config, &api, &metrics, ready.clone(), history.clone());
        let mut servers = vec![
            admin_l
                .serve(
                    admin_app,
                    config.admin.connections,
                    listener_meters(&metrics, "admin"),
                    stop.clone(),
                )
                .await?,
        ];

        let (recovered, assembler) = {
            let (config, api) = (config.clone(), api.clone());
            tokio::task::spawn_blocking(move || recover(&config, &api))
                .await
                .map_err(NodeError::task("boot: migrations and recovery"))??
        };
        // Fresh deliveries start at their ingest commit while dispatch has caught up.
        let starter = Arc::new(pipeline::runner::Starter::with_paused(api.paused.clone()));
        let (writer, writer_thread) = writer::spawn(
            store.clone(),
            assembler,
            WriterSettings::from_config(&config),
            writer::WriterMetrics {
                batch_hooks: metrics.writer_batch_hooks.clone(),
                commit_seconds: metrics.writer_commit_seconds.clone(),
                dedupe_swept: metrics.dedupe_swept.clone(),
                unsynced_hooks: metrics.writer_unsynced_hooks.clone(),
            },
            api.hints.clone(),
            config
                .dispatch
                .start_at_commit
                .then(|| starter.clone() as Arc<dyn writer::Starts>),
        )
        .map_err(NodeError::io("starting the writer thread"))?;
        let _ = api.writer.set(writer.clone());
        let gateway = pull_gateway(&config, &api, &deliverer, &metrics).await?;
        let ingest_state = Arc::new(IngestState::new(
            sources,
            store.clone(),
            writer,
            quarantine,
            metrics.clone(),
            ready.clone(),
            cluster,
            api.quotas.clone(),
        ));
        // The reloader holds the parts it swaps, never the states that hold the writer (a
        // stop waits for the writer's last handle to go).
        let reloader = Arc::new(crate::reload::Reloader::new(
            config.clone(),
            crate::reload::Parts {
                sources: ingest_state.sources.clone(),
                deliverer: deliverer.clone(),
                tokens: api.tokens.clone(),
                config: api.config.clone(),
                status: api.config_status.clone(),
                quotas: api.quotas.clone(),
                pull: gateway.clone(),
            },
            metrics.clone(),
        ));
        servers.push(
            ingest
                .serve(
                    crate::ingest::router(ingest_state)
                        .merge(crate::pull::http::router(gateway.clone()))
                        .layer(axum::middleware::from_fn(move |req, next| {
                            crate::cluster::edge(ingest_edge.clone(), false, req, next)
                        })),
                    config.ingest.connections,
                    listener_meters(&metrics, "ingest"),
                    stop.clone(),
                )
                .await?,
        );
        let background = background_tasks(
            &config,
            &store,
            &metrics,
            &api,
            Pipeline {
                deliverer,
                hints: api.hints.clone(),
                starter,
                gateway,
                history,
            },
            stop,
        );
        ready.store(true, Ordering::Release);
        tracing::info!(recovered_inflight = recovered, "relay node ready");
        // The stores restores replaced (`<data>.replaced-<ms>`) but the newest go once the
        // restored one runs: each holds a store's worth of the volume, and one is enough to
        // look into what only it held (or to go forward again after a rollback). In the
        // background: they may be large.
        let data_dir = config.data_dir.clone();
        drop(tokio::task::spawn_blocking(move || {
            remove_replaced_stores(&data_dir)
        }));
        Ok(Booted {
            store,
            metrics,
            recovered,
            ready,
            servers,
            background,
            writer: writer_thread,
            reloader,
        })
    }

    /// A graceful stop: `/readyz` fails and ingest refuses first, then the listeners stop
    /// (requests in progress finish), the pipeline stops claiming and gives deliveries in
    /// flight `shutdown.grace_ms` (see [`pipeline`]), and the writer drains.
    pub async fn shutdown(mut self) -> Result<(), NodeError> {
        self.ready.store(false, Ordering::Release);
        let _ = self.shutdown.send(true);
        for s in self.servers.drain(..) {
            s.await
                .map_err(NodeError::task("a listener"))?
                .map_err(NodeError::io("serving a listener"))?;
        }
        for t in self.background.drain(..) {
            t.await.map_err(NodeError::task("a background task"))?;
        }
        // The servers held the last writer handles; the writer drains and exits.
        if let Some(w) = self.writer.take() {
            tokio::task::spawn_blocking(move || w.join())
                .await
                .map_err(NodeError::task("joining the writer"))?
                .map_err(|_| NodeError::WriterPanicked)?;
        }
        Ok(())
    }

    /// Runs until a stop signal, then shuts down gracefully.
    pub async fn run_until(self, signals: &mut StopSignals) -> Result<(), NodeError> {
        let signal = signals.recv().await;
        tracing::info!(signal, "shutting down");
        self.shutdown().await
    }
}
