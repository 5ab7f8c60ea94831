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
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::admin::auth::Tokens;
use crate::cluster::Cluster;
use crate::dispatch::delivery::Deliverer;
use crate::dispatch::pipeline::{self};
use crate::ingest::IngestState;
use crate::metrics::Metrics;
use ankusa_config::{Config, ConfigError};
use ankusa_queue::engine::{Store, StoreError};
use ankusa_queue::writer::{self, WriterSettings};
use ankusa_queue::QueueError;

mod boot;
pub mod limits;
mod tasks;

use boot::{admin_app, api_state, background_tasks, open_store, pull_gateway, recover, Pipeline};
use tasks::remove_replaced_stores;

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
        let mut deliverer = Deliverer::from_config(&config)?;
        let store = open_store(&config, &metrics).await?;
        let cluster = Arc::new(Cluster::new(&config, &store, metrics.clone())?);
        let ingest_edge = cluster.clone();
        let ready = Arc::new(AtomicBool::new(false));
        let (api, quarantine) = api_state(&config, &store, &metrics, cluster.clone())?;
        deliverer.with_endpoints(api.endpoints.clone(), cluster.clone(), &config)?;
        let book = api.endpoints.clone();
        cluster.on_endpoints_moved(move || book.reload());
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
        let tenants_max = assembler.tenants_max();
        // The Kafka sinks' markers live in the store (once it is migrated and recovered).
        deliverer.with_store(store.clone());
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
        let handoff_writer = writer.clone();
        let gateway = pull_gateway(&config, &api, &deliverer, &metrics).await?;
        let ingest_state = Arc::new(
            IngestState::new(
                sources,
                store.clone(),
                writer,
                quarantine,
                metrics.clone(),
                ready.clone(),
                cluster.clone(),
                api.quotas.clone(),
            )
            .with_endpoints(api.endpoints.clone()),
        );
        let _ = api.ingest.set(Arc::downgrade(&ingest_state));
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
                tenants_max,
                cluster,
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
                writer: handoff_writer,
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
