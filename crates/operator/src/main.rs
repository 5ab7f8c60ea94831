//! `ankusa-operator`: `run` (the controller) and `crd` (print the CRD).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use ankusa_operator::controller::{self, Context, Settings};
use ankusa_operator::health::{Health, Thresholds};
use ankusa_operator::leader::{Elector, LeaseSettings};
use ankusa_operator::metrics::Metrics;
use ankusa_operator::telemetry::{self, LogFormat};

#[derive(Debug, Parser)]
#[command(
    name = "ankusa-operator",
    version,
    about = "Reconciles Ankusa Relay resources"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Watch Relay resources and reconcile them.
    Run(Box<RunArgs>),
    /// Print the Relay CustomResourceDefinition as YAML.
    Crd,
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Watch only this namespace (default: every namespace).
    #[arg(long, env = "ANKUSA_OPERATOR_NAMESPACE")]
    watch_namespace: Option<String>,
    /// Where /metrics, /healthz and /readyz are served.
    #[arg(
        long,
        env = "ANKUSA_OPERATOR_METRICS_ADDR",
        default_value = "[::]:8080"
    )]
    metrics_addr: SocketAddr,
    /// Seconds between reconciles of a Relay (and polls of its nodes).
    #[arg(long, env = "ANKUSA_OPERATOR_POLL_INTERVAL_S", default_value_t = 30)]
    poll_interval_s: u64,
    /// A node's admin URL, from {pod}, {service} and {namespace}.
    #[arg(long, env = "ANKUSA_OPERATOR_NODE_URL", default_value = ankusa_operator::nodes::DEFAULT_URL_TEMPLATE)]
    node_url_template: String,
    /// A node's ingest URL, from {pod}, {service} and {namespace}: where the other nodes of
    /// its Relay forward hooks for the tenants it owns.
    #[arg(long, env = "ANKUSA_OPERATOR_NODE_INGEST_URL", default_value = ankusa_operator::resources::DEFAULT_INGEST_URL_TEMPLATE)]
    node_ingest_url_template: String,
    /// Elect a leader through a Lease (turn off only with a single replica).
    #[arg(long, env = "ANKUSA_OPERATOR_LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    leader_election: bool,
    /// The leader election's Lease.
    #[arg(
        long,
        env = "ANKUSA_OPERATOR_LEASE_NAME",
        default_value = "ankusa-operator"
    )]
    lease_name: String,
    /// The Lease's namespace (default: the operator pod's, from POD_NAMESPACE).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    lease_namespace: String,
    /// The operator pods' labels (`k=v,k=v`), which the Relays' NetworkPolicies admit to
    /// the nodes' admin port, in the operator's namespace (POD_NAMESPACE). Default:
    /// `app.kubernetes.io/name=ankusa-operator` in any namespace.
    #[arg(long, env = "ANKUSA_OPERATOR_POD_LABELS")]
    operator_pod_labels: Option<String>,
    /// Seconds a Lease nobody renews stays held.
    #[arg(long, env = "ANKUSA_OPERATOR_LEASE_DURATION_S", default_value_t = 15)]
    lease_duration_s: u64,
    /// Seconds the leader may go without renewing before it steps down (< lease duration).
    #[arg(long, env = "ANKUSA_OPERATOR_RENEW_DEADLINE_S", default_value_t = 10)]
    renew_deadline_s: u64,
    /// Seconds between renewals (and between a follower's looks).
    #[arg(long, env = "ANKUSA_OPERATOR_RETRY_PERIOD_S", default_value_t = 2)]
    retry_period_s: u64,
    /// This replica's identity (default: the pod name, from POD_NAME).
    #[arg(long, env = "POD_NAME", default_value = "ankusa-operator")]
    identity: String,
    /// The logs' format on standard error: text lines or one JSON object a line.
    #[arg(
        long,
        env = "ANKUSA_OPERATOR_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Crd => {
            print!("{}", ankusa_crds::manifest::crd_yaml());
            Ok(())
        }
        Command::Run(args) => {
            telemetry::init(args.log_format);
            tokio::runtime::Runtime::new()?.block_on(run(*args))
        }
    }
}

/// SIGTERM or Ctrl-C, from the moment it is called: set once either arrives. A pod's PID 1
/// has no default action for SIGTERM, so without this a follower waiting for the Lease
/// would make every rollout and drain wait out its grace period.
fn stop_requested() -> anyhow::Result<tokio::sync::watch::Receiver<bool>> {
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    let (tx, rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {},
            _ = term.recv() => {},
        }
        let _ = tx.send(true);
    });
    Ok(rx)
}

/// Resolves once [`stop_requested`]'s signal has come.
async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>) {
    // An error means the sender is gone, which happens only after it sent.
    let _ = stop.wait_for(|s| *s).await;
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    let stop = stop_requested()?;
    let metrics = Arc::new(Metrics::default());
    let lease_duration = Duration::from_secs(args.lease_duration_s.max(2));
    let renew_deadline = Duration::from_secs(
        args.renew_deadline_s
            .clamp(1, args.lease_duration_s.max(2) - 1),
    );
    let health = Arc::new(Health::new(
        Thresholds::new(renew_deadline, lease_duration),
        args.leader_election,
    ));
    let listener = ankusa_config::listen::bind(args.metrics_addr)
        .and_then(tokio::net::TcpListener::from_std)
        .with_context(|| format!("binding {}", args.metrics_addr))?;
    let router = ankusa_operator::metrics::router(metrics.clone(), health.clone());
    tokio::spawn(async move {
        if let Err(e) = axum::serve(listener, router).await {
            tracing::error!(error = %e, "metrics listener stopped");
        }
    });
    let client = kube::Client::try_default()
        .await
        .context("connecting to the Kubernetes API")?;
    let lease = LeaseSettings {
        lease_duration,
        renew_deadline,
        renew_every: Duration::from_secs(args.retry_period_s.max(1)),
        ..LeaseSettings::new(&args.lease_name, &args.lease_namespace, &args.identity)
    };
    let mut elector = Elector::new(client.clone(), lease).with_health(health.clone());
    if args.leader_election {
        tokio::select! {
            _ = elector.acquire() => {},
            _ = stopped(stop.clone()) => {
                tracing::info!(lease = %args.lease_name, "stopped while following");
                return Ok(());
            }
        }
    }
    metrics.leader.set(1);
    let settings = Settings {
        poll_interval: Duration::from_secs(args.poll_interval_s.max(1)),
        node_url_template: args.node_url_template,
        node_ingest_url_template: args.node_ingest_url_template,
        instance: args.identity,
        health: Some(health),
        operator: ankusa_operator::resources::OperatorPeer::from_parts(
            std::env::var("POD_NAMESPACE").ok(),
            args.operator_pod_labels.as_deref(),
        ),
        install: args
            .leader_election
            .then(|| ankusa_operator::controller::claim::Install {
                namespace: args.lease_namespace.clone(),
                lease: args.lease_name.clone(),
            }),
        ..Settings::default()
    };
    let ctx = Context::new(client.clone(), metrics.clone(), settings);
    tracing::info!(namespace = ?args.watch_namespace, "reconciling Relays");
    // Losing the Lease stops the controller; the process then exits and restarts as a
    // follower. A clean stop (SIGTERM) stops the controller first, then releases the
    // Lease, so the next replica leads at its next look.
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let keeper = args.leader_election.then(|| {
        tokio::spawn(async move {
            tokio::select! {
                _ = elector.keep() => {
                    let _ = lost_tx.send(());
                    None
                }
                _ = stop_rx => Some(elector),
            }
        })
    });
    let lost = async move {
        // Without election the sender is dropped at once; that is not a lost Lease.
        if args.leader_election {
            let _ = lost_rx.await;
        } else {
            std::future::pending::<()>().await;
        }
    };
    let shutdown = async move {
        tokio::select! {
            _ = stopped(stop) => {},
            _ = lost => {},
        }
    };
    controller::run(ctx, args.watch_namespace, shutdown).await;
    metrics.leader.set(0);
    let _ = stop_tx.send(());
    if let Some(keeper) = keeper {
        if let Ok(Some(mut elector)) = keeper.await {
            match elector.release().await {
                Ok(true) => tracing::info!(lease = %args.lease_name, "released the lease"),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(lease = %args.lease_name, error = %e, "could not release the lease")
                }
            }
        }
    }
    Ok(())
}
