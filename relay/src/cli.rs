//! The `ankusa-relay` command line.
//!
//! Every subcommand that is handed bad input (a missing data dir, a newer store format, a
//! corrupted family, a bad config) prints one clear error on stderr, exits non-zero, and
//! writes nothing.

use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::config::Config;
use crate::node::StopSignals;
use crate::queue::{counters, fold, tenants};
use crate::store::keys::Family;
use crate::store::{migrate, OpenOptions, Store, SUPPORTED_FORMAT};

#[derive(Debug, Parser)]
#[command(name = "ankusa-relay", version, about = "Ankusa relay node")]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a relay node.
    Run {
        /// The YAML configuration file.
        #[arg(long)]
        config: PathBuf,
    },
    /// The admin API of one node, or of every node of a Relay merged into one answer.
    Admin {
        /// A node's admin URL, e.g. http://127.0.0.1:9090; repeat or comma-separate for
        /// several nodes.
        #[arg(
            long = "url",
            env = "ANKUSA_ADMIN_URL",
            value_delimiter = ',',
            required = true
        )]
        urls: Vec<String>,
        /// Each address an http URL's host resolves to is a node: pass a Relay's headless
        /// Service (http://<relay>-nodes.<namespace>.svc:9090) to reach every node.
        #[arg(long)]
        all_addresses: bool,
        /// A bearer token from the nodes' admin.tokens.
        #[arg(long, env = "ANKUSA_ADMIN_TOKEN", hide_env_values = true)]
        token: String,
        /// Print the merged JSON instead of a table.
        #[arg(long, global = true)]
        json: bool,
        /// Give up on a node that does not answer within this many seconds.
        #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
        timeout_s: u64,
        #[command(subcommand)]
        command: AdminCommand,
    },
    /// Check a configuration file without starting a node.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Inspect and maintain a store.
    Store {
        #[command(subcommand)]
        command: StoreCommand,
    },
    /// A small webhook receiver: prints what it receives and checks its signature.
    Sink {
        #[arg(long, default_value = "127.0.0.1:9999")]
        listen: std::net::SocketAddr,
        /// The sink's Standard Webhooks secret (`whsec_...`), to verify signatures.
        #[arg(long, env = "ANKUSA_SINK_SECRET")]
        secret: Option<String>,
    },
    /// Backups taken over the admin API (the operator's backup Job runs this).
    Backup {
        #[command(subcommand)]
        command: BackupCommand,
    },
    /// Unpack a backup archive into an empty data directory.
    Restore {
        /// The .tar.zst a backup produced.
        #[arg(long)]
        from: PathBuf,
        /// The data directory to create (must not exist, or be empty).
        #[arg(long)]
        data: PathBuf,
    },
    /// Print the OpenAPI 3.1 document of the ingest and admin APIs (docs/openapi.json).
    Openapi,
    /// Print the version and the store format this binary supports.
    Version {
        #[arg(long)]
        json: bool,
        /// Also write the answer to this file (the operator's image probe passes its
        /// pod's termination message file).
        #[arg(long)]
        write: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum AdminCommand {
    /// Each node's release, store format, tenants and queue counters, and their sum.
    Node,
    /// The tenants with the most pending work, their counters summed over the nodes.
    Tenants {
        #[arg(long, default_value_t = 20)]
        top: usize,
    },
    /// One tenant's counters summed over the nodes that hold it.
    Tenant { tenant: String },
    /// The dead-letter queue.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Remove a tenant's pending and/or dead rows on every node (never rows in flight).
    Purge {
        tenant: String,
        /// Comma-separated: pending, dead.
        #[arg(long, default_value = "pending,dead")]
        kinds: String,
    },
    /// Requests that failed verification.
    Quarantine {
        #[command(subcommand)]
        command: QuarantineCommand,
    },
    /// The hook log: what happened to a hook.
    Hooks {
        #[command(subcommand)]
        command: HooksCommand,
    },
    /// Pull a backup of every node into DIR/<host>_<port>/.
    Backup {
        #[arg(long)]
        to: PathBuf,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        keep: Option<u64>,
    },
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead rows of every node, newest first, ids as <node>/<id>.
    List {
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Revive dead rows: by id (<node>/<id>), or by tenant, source and time on every node.
    Replay {
        #[arg(long = "id")]
        ids: Vec<String>,
        #[arg(long)]
        tenant: Option<String>,
        #[arg(long)]
        source: Option<String>,
        #[arg(long)]
        from_ms: Option<u64>,
        #[arg(long)]
        to_ms: Option<u64>,
        /// The most rows each node revives.
        #[arg(long)]
        limit: Option<usize>,
    },
}

#[derive(Debug, Subcommand)]
pub enum HooksCommand {
    /// One hook by id, from whichever node's log has it: its tenant, source, receipt and,
    /// per sink, its state and attempts.
    Get {
        id: String,
        /// Also print the body (while the hook is still stored).
        #[arg(long)]
        body: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// Quarantined requests of every node, newest first, ids as <node>/<id>.
    List {
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// Delete one (<node>/<id>), or every one in the token's scope on every node.
    Delete {
        #[arg(long)]
        id: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
pub enum ConfigCommand {
    /// Every check `run` makes before it opens the store (the file, `ANKUSA_*` overrides,
    /// validation, secrets, sinks' URLs and headers, tokens), with the same message and
    /// exit code; the store is not touched.
    Check {
        /// The YAML configuration file.
        file: PathBuf,
    },
}

#[derive(Debug, Subcommand)]
pub enum BackupCommand {
    /// Ask a node for a backup and copy its archive to `--to`, checking it opens.
    Pull {
        /// The node's admin URL, e.g. http://relay-0.relay:9090
        #[arg(long)]
        from: String,
        /// An admin-scope token.
        #[arg(long, env = "ANKUSA_ADMIN_TOKEN", hide_env_values = true)]
        token: String,
        /// The directory to write `<id>.tar.zst` into.
        #[arg(long)]
        to: PathBuf,
        /// After a successful pull, keep only the newest N archives in `--to`.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        keep: Option<u64>,
        /// Give up when the node sends nothing for this long (connecting included).
        #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..=86400))]
        idle_timeout_s: u64,
    },
    /// Pack a store no node has open (a volume claim that outlived a scale-down) into
    /// `--to`, checking it opens.
    Offline {
        /// The store's data directory.
        #[arg(long)]
        data: PathBuf,
        /// The directory to write `<id>.tar.zst` into.
        #[arg(long)]
        to: PathBuf,
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        keep: Option<u64>,
    },
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Format, column families, key counts per family, migration in progress.
    Inspect {
        #[arg(long)]
        data: PathBuf,
    },
    /// Run (or, with --dry-run, list) the pending format migrations.
    Migrate {
        #[arg(long)]
        data: PathBuf,
        #[arg(long)]
        dry_run: bool,
    },
    /// Check that the counters equal a fold of the families they summarise.
    Verify {
        #[arg(long)]
        data: PathBuf,
    },
    /// Write a fixture store of format 2 or 3 as a .tar.zst (tests, upgrade drills).
    Fixture {
        #[arg(long, value_parser = clap::value_parser!(u32).range(2..=3))]
        format: u32,
        /// The .tar.zst to write.
        out: PathBuf,
    },
}

/// Runs a parsed command line.
pub fn main(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config } => run(&config),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => config_check(&file),
        Command::Admin {
            urls,
            all_addresses,
            token,
            json,
            timeout_s,
            command,
        } => admin(
            &urls,
            all_addresses,
            &token,
            json,
            std::time::Duration::from_secs(timeout_s),
            command,
        ),
        Command::Sink { listen, secret } => sink(listen, secret),
        Command::Openapi => {
            print!("{}", crate::openapi::json());
            Ok(ExitCode::SUCCESS)
        }
        Command::Backup {
            command:
                BackupCommand::Pull {
                    from,
                    token,
                    to,
                    keep,
                    idle_timeout_s,
                },
        } => backup_pull(
            &from,
            &token,
            &to,
            keep,
            std::time::Duration::from_secs(idle_timeout_s),
        ),
        Command::Backup {
            command: BackupCommand::Offline { data, to, keep },
        } => backup_offline(&data, &to, keep),
        Command::Restore { from, data } => restore(&from, &data),
        Command::Version { json, write } => {
            let text = if json {
                serde_json::json!({
                    "version": env!("CARGO_PKG_VERSION"),
                    "store_format": SUPPORTED_FORMAT,
                })
                .to_string()
            } else {
                format!(
                    "ankusa-relay {} (store format {SUPPORTED_FORMAT})",
                    env!("CARGO_PKG_VERSION")
                )
            };
            println!("{text}");
            if let Some(path) = write {
                std::fs::write(&path, format!("{text}\n"))
                    .with_context(|| format!("writing {}", path.display()))?;
            }
            Ok(ExitCode::SUCCESS)
        }
        Command::Store { command } => match command {
            StoreCommand::Inspect { data } => inspect(&data),
            StoreCommand::Migrate { data, dry_run } => migrate_cmd(&data, dry_run),
            StoreCommand::Verify { data } => verify(&data),
            StoreCommand::Fixture { format, out } => fixture(format, &out),
        },
    }
}

fn open_existing(data: &Path, read_only: bool) -> anyhow::Result<Store> {
    let opts = OpenOptions {
        create_if_missing: false,
        read_only,
        ..OpenOptions::default()
    };
    Store::open(data, &opts).with_context(|| format!("opening the store at {}", data.display()))
}

fn inspect(data: &Path) -> anyhow::Result<ExitCode> {
    let store = open_existing(data, true)?;
    let format = store.format()?;
    println!("store:    {}", data.display());
    println!("format:   {format} (this binary supports {SUPPORTED_FORMAT})");
    match migrate::in_progress(&store)? {
        Some((to, cursor)) => println!(
            "migrating: to format {to}, cursor {} bytes (resumes on the next boot or `store migrate`)",
            cursor.len()
        ),
        None => println!("migrating: no"),
    }
    let cfs: Vec<&str> = store.column_families().iter().map(|c| c.name()).collect();
    println!("column families: {}", cfs.join(", "));
    println!("{:<18} {:<11} {:>12}", "family", "cf", "keys");
    for fam in Family::of_format(format) {
        let n = store
            .scan_family(*fam)?
            .try_fold(0u64, |n, kv| kv.map(|_| n + 1))?;
        println!("{:<18} {:<11} {:>12}", fam.name(), fam.cf().name(), n);
    }
    if format >= 3 {
        let c = counters::node(&store)?;
        println!("tenants:  {}", tenants::count(&store)?);
        println!(
            "node counters: pending={} scheduled={} inflight={} dead={} bytes={} archive_pending={}",
            c.pending, c.scheduled, c.inflight, c.dead, c.bytes, c.archive_pending
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn migrate_cmd(data: &Path, dry_run: bool) -> anyhow::Result<ExitCode> {
    let registry = crate::upgrade::builtin();
    if dry_run {
        let store = open_existing(data, true)?;
        let pending = migrate::pending(&store, &registry, SUPPORTED_FORMAT)?;
        if pending.is_empty() {
            println!("store at format {}: no pending migrations", store.format()?);
        }
        for p in pending {
            println!("{p}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    let store = open_existing(data, false)?;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    let started = std::time::Instant::now();
    let out = migrate::run(&store, &registry, SUPPORTED_FORMAT, |p| {
        let rate = p.rows as f64 / started.elapsed().as_secs_f64().max(1e-3);
        let line = format!(
            "{} -> {}: step {}, {} rows, {:.0} rows/s{}",
            p.from,
            p.to,
            p.steps,
            p.rows,
            rate,
            if p.finished { ", done" } else { "" }
        );
        if tty {
            // One line, rewritten in place.
            print!("\r\x1b[2K{line}");
            if p.finished {
                println!();
            }
        } else {
            println!("{line}");
        }
        use std::io::Write;
        let _ = std::io::stdout().flush();
        ControlFlow::Continue(())
    })?;
    match out {
        migrate::Outcome::Done {
            format,
            steps,
            rows,
        } => {
            println!("store at format {format} ({steps} steps, {rows} rows moved)")
        }
        migrate::Outcome::Stopped { format, steps } => {
            println!("stopped at format {format} after {steps} steps")
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn fixture(format: u32, out: &Path) -> anyhow::Result<ExitCode> {
    let dir = tempfile_dir()?;
    let data = dir.join("store");
    match format {
        2 => crate::upgrade::fixture::write_v2(&data)?,
        _ => crate::upgrade::fixture::write_v3(&data)?,
    }
    crate::store::tarball::pack(&data, out)?;
    let _ = std::fs::remove_dir_all(&dir);
    println!("wrote a format {format} fixture store to {}", out.display());
    Ok(ExitCode::SUCCESS)
}

fn tempfile_dir() -> anyhow::Result<PathBuf> {
    let dir = std::env::temp_dir().join(format!(
        "ankusa-fixture-{}-{}",
        std::process::id(),
        crate::now_ms()
    ));
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

fn verify(data: &Path) -> anyhow::Result<ExitCode> {
    let store = open_existing(data, true)?;
    let mismatches = fold::verify(&store)?;
    if mismatches.is_empty() {
        println!("counters equal a fold of the families");
        return Ok(ExitCode::SUCCESS);
    }
    for m in &mismatches {
        eprintln!(
            "ord {}: stored {:?} but the families fold to {:?}",
            m.ord.0, m.stored, m.folded
        );
    }
    Ok(ExitCode::FAILURE)
}

fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .try_init();
}

/// `admin …`: one call per node, merged.
fn admin(
    urls: &[String],
    all_addresses: bool,
    token: &str,
    json_out: bool,
    timeout: std::time::Duration,
    command: AdminCommand,
) -> anyhow::Result<ExitCode> {
    use crate::admin::client::{self as c, cell, table, Nodes};
    use hyper::Method;
    let rt = tokio::runtime::Runtime::new()?;
    let nodes = rt.block_on(Nodes::resolve(urls, all_addresses, token, timeout))?;
    if let AdminCommand::Backup { to, keep } = &command {
        for url in &nodes.urls {
            let (_, rest) = url.split_once("://").unwrap_or(("", url));
            let dir = to.join(rest.replace([':', '/'], "_"));
            backup_pull(url, token, &dir, *keep, timeout)?;
        }
        return Ok(ExitCode::SUCCESS);
    }
    let out: serde_json::Value = rt.block_on(async {
        anyhow::Ok(match &command {
            AdminCommand::Node => {
                c::merge_nodes(&nodes.urls, nodes.all(Method::GET, "/v1/node", None).await?)
            }
            AdminCommand::Tenants { top } => c::merge_tenants(
                nodes
                    .all(Method::GET, &format!("/v1/tenants?top={top}"), None)
                    .await?,
                *top,
            ),
            AdminCommand::Tenant { tenant } => {
                let path = format!("/v1/tenants/{}", c::q(tenant));
                let mut answers = Vec::new();
                for i in 0..nodes.urls.len() {
                    // A node that never saw the tenant answers 404: not an error here.
                    answers.push(match nodes.call(i, Method::GET, &path, None).await {
                        Ok(v) => Some(v),
                        Err(e) if e.to_string().contains(": 404 not_found") => None,
                        Err(e) => return Err(e),
                    });
                }
                c::merge_tenant(tenant, answers)
                    .ok_or_else(|| anyhow::anyhow!("no node holds tenant {tenant:?}"))?
            }
            AdminCommand::Dlq {
                command: DlqCommand::List { tenant, limit },
            } => {
                let mut path = format!("/v1/dlq?limit={limit}");
                if let Some(t) = tenant {
                    path.push_str(&format!("&tenant={}", c::q(t)));
                }
                c::merge_items(nodes.all(Method::GET, &path, None).await?, "at_ms", *limit)
            }
            AdminCommand::Dlq {
                command:
                    DlqCommand::Replay {
                        ids,
                        tenant,
                        source,
                        from_ms,
                        to_ms,
                        limit,
                    },
            } => {
                let filter = serde_json::json!({
                    "tenant": tenant, "source": source, "from_ms": from_ms, "to_ms": to_ms, "limit": limit,
                });
                let mut body: Vec<serde_json::Value> = vec![filter; nodes.urls.len()];
                if !ids.is_empty() {
                    let mut by_node: Vec<Vec<String>> = vec![Vec::new(); nodes.urls.len()];
                    for id in ids {
                        let (n, own) = c::split_id(id, nodes.urls.len())?;
                        by_node[n].push(own);
                    }
                    for (b, own) in body.iter_mut().zip(by_node) {
                        b["ids"] = serde_json::json!(own);
                    }
                }
                let mut answers = Vec::new();
                for (i, b) in body.iter().enumerate() {
                    // A node given no ids of an id replay has nothing to do.
                    if !ids.is_empty() && b["ids"].as_array().is_some_and(|a| a.is_empty()) {
                        continue;
                    }
                    answers.push(nodes.call(i, Method::POST, "/v1/dlq/replay", Some(b)).await?);
                }
                c::sum_reports(&answers)
            }
            AdminCommand::Purge { tenant, kinds } => {
                let path = format!("/v1/tenants/{}/queue?kinds={}", c::q(tenant), c::q(kinds));
                let mut answers = Vec::new();
                for i in 0..nodes.urls.len() {
                    match nodes.call(i, Method::DELETE, &path, None).await {
                        Ok(v) => answers.push(v),
                        Err(e) if e.to_string().contains(": 404 not_found") => {}
                        Err(e) => return Err(e),
                    }
                }
                let mut sum = c::sum_reports(&answers);
                sum["tenant"] = serde_json::json!(tenant);
                sum
            }
            AdminCommand::Quarantine {
                command: QuarantineCommand::List { limit },
            } => c::merge_items(
                nodes
                    .all(Method::GET, &format!("/v1/quarantine?limit={limit}"), None)
                    .await?,
                "at_ms",
                *limit,
            ),
            AdminCommand::Quarantine {
                command: QuarantineCommand::Delete { id },
            } => match id {
                Some(id) => {
                    let (n, own) = c::split_id(id, nodes.urls.len())?;
                    let path = format!("/v1/quarantine?id={}", c::q(&own));
                    nodes.call(n, Method::DELETE, &path, None).await?
                }
                None => c::sum_reports(&nodes.all(Method::DELETE, "/v1/quarantine", None).await?),
            },
            AdminCommand::Hooks {
                command: HooksCommand::Get { id, body },
            } => {
                let path = format!("/v1/hooks/{}?body={body}", c::q(id));
                let mut found = None;
                for i in 0..nodes.urls.len() {
                    // A node whose log does not have the hook answers 404: ask the next.
                    match nodes.call(i, Method::GET, &path, None).await {
                        Ok(v) => {
                            found = Some(v);
                            break;
                        }
                        Err(e) if e.to_string().contains(": 404 not_found") => {}
                        Err(e) => return Err(e),
                    }
                }
                found.ok_or_else(|| anyhow::anyhow!("no node's hook log has hook {id:?}"))?
            }
            AdminCommand::Backup { .. } => unreachable!("handled above"),
        })
    })?;
    if json_out {
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(ExitCode::SUCCESS);
    }
    let counters = ["pending", "scheduled", "inflight", "dead", "bytes"];
    let text = match &command {
        AdminCommand::Node => {
            let mut rows: Vec<Vec<String>> = out["nodes"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|n| {
                    let mut r = vec![
                        cell(&n["node"]),
                        cell(&n["url"]),
                        cell(&n["version"]),
                        cell(&n["store_format"]),
                        cell(&n["tenants"]),
                    ];
                    r.extend(counters.iter().map(|k| cell(&n["counters"][*k])));
                    r
                })
                .collect();
            let mut total = vec![
                "all".into(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ];
            total.extend(counters.iter().map(|k| cell(&out["counters"][*k])));
            rows.push(total);
            let mut h = vec!["node", "url", "version", "format", "tenants"];
            h.extend(counters);
            table(&h, &rows)
        }
        AdminCommand::Tenants { .. } | AdminCommand::Tenant { .. } => {
            let list = match &command {
                AdminCommand::Tenant { .. } => vec![out.clone()],
                _ => out["tenants"].as_array().cloned().unwrap_or_default(),
            };
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|t| {
                    let mut r = vec![cell(&t["tenant"])];
                    r.extend(counters.iter().map(|k| cell(&t["counters"][*k])));
                    r.push(cell(&t["nodes"]));
                    r
                })
                .collect();
            let mut h = vec!["tenant"];
            h.extend(counters);
            h.push("nodes");
            table(&h, &rows)
        }
        AdminCommand::Dlq {
            command: DlqCommand::List { .. },
        } => {
            let rows: Vec<Vec<String>> = out["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| {
                    [
                        "id",
                        "tenant",
                        "at_ms",
                        "hook_id",
                        "source",
                        "sink",
                        "attempts",
                        "last_error",
                    ]
                    .iter()
                    .map(|k| cell(&i[*k]))
                    .collect()
                })
                .collect();
            table(
                &[
                    "id",
                    "tenant",
                    "at_ms",
                    "hook_id",
                    "source",
                    "sink",
                    "attempts",
                    "last_error",
                ],
                &rows,
            )
        }
        AdminCommand::Quarantine {
            command: QuarantineCommand::List { .. },
        } => {
            let rows: Vec<Vec<String>> = out["items"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|i| {
                    ["id", "source", "at_ms", "reason"]
                        .iter()
                        .map(|k| cell(&i[*k]))
                        .collect()
                })
                .collect();
            table(&["id", "source", "at_ms", "reason"], &rows)
        }
        AdminCommand::Hooks { .. } => hook_text(&out),
        _ => {
            let rows: Vec<Vec<String>> = out
                .as_object()
                .into_iter()
                .flatten()
                .map(|(k, v)| vec![k.clone(), cell(v)])
                .collect();
            table(&["field", "value"], &rows)
        }
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// A hook from the hook log as text: its fields, a line per sink, a line per event, and
/// the body if it was asked for.
fn hook_text(h: &serde_json::Value) -> String {
    use crate::admin::client::{cell, table};
    let mut out = String::new();
    for k in [
        "id",
        "tenant",
        "source",
        "received_ms",
        "size",
        "content_type",
        "stored",
    ] {
        out.push_str(&format!("{k:<13} {}\n", cell(&h[k])));
    }
    for (name, value) in h["headers"].as_object().into_iter().flatten() {
        out.push_str(&format!("header        {name}: {}\n", cell(value)));
    }
    let sinks: Vec<&serde_json::Value> = h["sinks"].as_array().into_iter().flatten().collect();
    let rows: Vec<Vec<String>> = sinks
        .iter()
        .map(|s| {
            ["sink", "state", "attempts", "next_attempt_ms"]
                .iter()
                .map(|k| cell(&s[*k]))
                .collect()
        })
        .collect();
    out.push('\n');
    out.push_str(&table(
        &["sink", "state", "attempts", "next_attempt_ms"],
        &rows,
    ));
    let cols = [
        "kind",
        "at_ms",
        "attempt",
        "outcome",
        "status",
        "error",
        "latency_ms",
        "next_at_ms",
    ];
    let rows: Vec<Vec<String>> = sinks
        .iter()
        .flat_map(|s| {
            s["events"].as_array().into_iter().flatten().map(|e| {
                let mut r = vec![cell(&s["sink"])];
                r.extend(cols.iter().map(|k| cell(&e[*k])));
                r
            })
        })
        .collect();
    if !rows.is_empty() {
        let mut h = vec!["sink"];
        h.extend(cols);
        out.push('\n');
        out.push_str(&table(&h, &rows));
    }
    if let Some(b) = h["body"].as_str().or(h["body_base64"].as_str()) {
        out.push_str(&format!(
            "\nbody{}:\n{b}\n",
            if h["body"].is_null() { " (base64)" } else { "" }
        ));
    }
    out
}

/// `config check`: what `run` would say about the file, without a store.
fn config_check(path: &Path) -> anyhow::Result<ExitCode> {
    let config = Config::load(path, std::env::vars())?;
    crate::node::check(&config)?;
    println!(
        "{}: ok ({} sources, {} routes, {} sinks, {} admin tokens)",
        path.display(),
        config.sources.len(),
        config.routes.len(),
        config.sinks.len(),
        config.admin.tokens.len()
    );
    Ok(ExitCode::SUCCESS)
}

/// Starts a node and serves until interrupted. The stop signals' handlers come first, before
/// the configuration is read (see [`StopSignals`]), and the soft open-file limit is raised
/// to the hard one.
fn run(config_path: &Path) -> anyhow::Result<ExitCode> {
    init_tracing();
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let mut signals = StopSignals::install()?;
        match crate::node::raise_open_files_limit() {
            Ok((before, after)) if before != after => {
                tracing::info!(from = ?before, to = ?after, "raised the soft open-file limit to the hard limit")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not raise the soft open-file limit"),
        }
        let config = Config::load(config_path, std::env::vars())?;
        let data_dir = config.data_dir.clone();
        let node = signals.start_node(config).await?;
        println!(
            "ankusa-relay: store {} at format {SUPPORTED_FORMAT} is open; \
             ingest on http://{}/ingest/{{source}}, admin on http://{} (try: curl -H \
             'authorization: Bearer <an admin.tokens secret>' http://{}/v1/node). Ctrl-C stops.",
            data_dir.display(),
            node.ingest_addr,
            node.admin_addr,
            node.admin_addr,
        );
        node.run_until(&mut signals).await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Serves `POST /*` on `listen`, printing each hook and whether its signature verifies.
fn sink(listen: std::net::SocketAddr, secret: Option<String>) -> anyhow::Result<ExitCode> {
    use ankusa_verify::{standard_webhooks_key, Verifier};
    let verifier = secret.map(|s| Verifier::StandardWebhooks {
        key: standard_webhooks_key(s.as_bytes()),
        tolerance_s: 300,
    });
    let verifier = std::sync::Arc::new(verifier);
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async move {
        let app = axum::Router::new().fallback(
            move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
                let verifier = verifier.clone();
                async move {
                    let get = |name: &str| {
                        headers
                            .get(name)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or("-")
                            .to_owned()
                    };
                    let id = get("webhook-id");
                    let from = format!(
                        "tenant {}, source {}",
                        get("ankusa-tenant"),
                        get("ankusa-source")
                    );
                    let check = match verifier.as_ref() {
                        None => "unchecked".to_owned(),
                        Some(v) => match v.verify(&headers, &body, crate::now_ms() / 1000) {
                            Ok(()) => "signature ok".to_owned(),
                            Err(e) => format!("signature BAD ({e})"),
                        },
                    };
                    let preview: String =
                        String::from_utf8_lossy(&body).chars().take(200).collect();
                    println!(
                        "received {id} ({from}, {} bytes, {check}): {preview}",
                        body.len()
                    );
                    axum::http::StatusCode::NO_CONTENT
                }
            },
        );
        let l = crate::config::listen::bind(listen)
            .and_then(tokio::net::TcpListener::from_std)
            .with_context(|| format!("binding {listen}"))?;
        println!("ankusa-relay sink: listening on http://{}", l.local_addr()?);
        // SIGTERM too: in a container the sink is PID 1, which ignores a signal it has no
        // handler for.
        let mut signals = StopSignals::install()?;
        axum::serve(l, app)
            .with_graceful_shutdown(async move {
                signals.recv().await;
            })
            .await?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Unpacks a backup into `data` and checks the result opens (the format guard included).
fn restore(from: &Path, data: &Path) -> anyhow::Result<ExitCode> {
    crate::store::tarball::unpack(from, data)
        .with_context(|| format!("restoring {} into {}", from.display(), data.display()))?;
    let store = Store::open(data, &OpenOptions::inspect())
        .with_context(|| format!("checking the restored store at {}", data.display()))?;
    println!(
        "restored {} into {} (store format {})",
        from.display(),
        data.display(),
        store.format()?
    );
    Ok(ExitCode::SUCCESS)
}

/// Streams a backup from the node (`POST /v1/backups/stream`; a node without it, an older
/// release, is asked the old way: `POST /v1/backups`, then `GET .../archive`) into
/// `to/<id>.tar.zst`, checking it opens before it takes that name.
fn backup_pull(
    from: &str,
    token: &str,
    to: &Path,
    keep: Option<u64>,
    idle: std::time::Duration,
) -> anyhow::Result<ExitCode> {
    use http_body_util::BodyExt;
    let rt = tokio::runtime::Runtime::new()?;
    rt.block_on(async {
        let client = crate::http::client(idle)?;
        let base = from.trim_end_matches('/');
        let auth = format!("Bearer {token}");
        let request = |method: hyper::Method, path: String| {
            hyper::Request::builder()
                .method(method)
                .uri(format!("{base}{path}"))
                .header("authorization", &auth)
                .body(http_body_util::Full::new(bytes::Bytes::new()))
        };
        let within = |what: &'static str| {
            move |_| anyhow::anyhow!("{what}: the node sent nothing for {} s", idle.as_secs())
        };
        let resp = tokio::time::timeout(
            idle,
            client.request(request(hyper::Method::POST, "/v1/backups/stream".into())?),
        )
        .await
        .map_err(within("asking for a backup"))?
        .context("asking for a backup")?;
        let (id, resp) = if resp.status() == hyper::StatusCode::NOT_FOUND {
            // An older node: it packs the archive on its volume, then serves it.
            let resp = tokio::time::timeout(
                idle,
                client.request(request(hyper::Method::POST, "/v1/backups".into())?),
            )
            .await
            .map_err(within("asking for a backup"))?
            .context("asking for a backup")?;
            let status = resp.status();
            let body = tokio::time::timeout(idle, resp.into_body().collect())
                .await
                .map_err(within("reading the answer"))??
                .to_bytes();
            anyhow::ensure!(
                status.is_success(),
                "POST /v1/backups answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
            let v: serde_json::Value = serde_json::from_slice(&body)?;
            let id = v["id"]
                .as_str()
                .context("no backup id in the answer")?
                .to_owned();
            anyhow::ensure!(
                crate::admin::backups::is_backup_id(&id),
                "bad backup id {id:?}"
            );
            let resp = tokio::time::timeout(
                idle,
                client.request(request(
                    hyper::Method::GET,
                    format!("/v1/backups/{id}/archive"),
                )?),
            )
            .await
            .map_err(within("fetching the archive"))?
            .context("fetching the archive")?;
            (id, resp)
        } else {
            let id = resp
                .headers()
                .get("ankusa-backup-id")
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            (id, resp)
        };
        if !resp.status().is_success() {
            let status = resp.status();
            let body = tokio::time::timeout(idle, resp.into_body().collect())
                .await
                .map(|b| b.map(|b| b.to_bytes()).unwrap_or_default())
                .unwrap_or_default();
            anyhow::bail!(
                "the node answered {status}: {}",
                String::from_utf8_lossy(&body)
            );
        }
        anyhow::ensure!(
            crate::admin::backups::is_backup_id(&id),
            "bad backup id {id:?}"
        );
        std::fs::create_dir_all(to)?;
        let out = to.join(format!("{id}.tar.zst"));
        let tmp = to.join(format!("{id}.tar.zst.part"));
        let mut body = resp.into_body();
        let received = async {
            let mut file = std::fs::File::create(&tmp)?;
            let mut bytes = 0u64;
            loop {
                let frame = tokio::time::timeout(idle, body.frame())
                    .await
                    .map_err(within("receiving the archive"))?;
                let Some(frame) = frame else { break };
                if let Ok(data) = frame.context("receiving the archive")?.into_data() {
                    std::io::Write::write_all(&mut file, &data)
                        .with_context(|| format!("writing {}", tmp.display()))?;
                    bytes += data.len() as u64;
                }
            }
            file.sync_all()?;
            anyhow::Ok(bytes)
        }
        .await;
        // A cut transfer or a full destination: nothing of it stays.
        let bytes = match received {
            Ok(b) => b,
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                return Err(e);
            }
        };
        let format = check_archive(&tmp, to, &id)?;
        std::fs::rename(&tmp, &out)?;
        println!(
            "backup {id}: {bytes} bytes, store format {format}, written to {}",
            out.display()
        );
        prune_to(to, keep)?;
        anyhow::Ok(())
    })?;
    Ok(ExitCode::SUCCESS)
}

/// Unpacks `archive` beside it and opens the result (the format guard included): a cut or
/// corrupt archive is refused before it is called a backup. Returns the store's format.
fn check_archive(archive: &Path, dir: &Path, id: &str) -> anyhow::Result<u32> {
    let check = dir.join(format!("{id}.check"));
    let _ = std::fs::remove_dir_all(&check);
    let opened = crate::store::tarball::unpack(archive, &check)
        .map_err(anyhow::Error::from)
        .and_then(|()| Ok(Store::open(&check, &OpenOptions::inspect())?.format()?));
    let _ = std::fs::remove_dir_all(&check);
    if opened.is_err() {
        let _ = std::fs::remove_file(archive);
    }
    opened.context("the archive is not a whole store")
}

/// `--keep`: only the newest N archives stay in `to`.
fn prune_to(to: &Path, keep: Option<u64>) -> anyhow::Result<()> {
    if let Some(keep) = keep {
        let keep = usize::try_from(keep).unwrap_or(usize::MAX);
        let removed = crate::admin::backups::prune(to, keep)?;
        if removed > 0 {
            println!("removed {removed} older backup(s), keeping {keep}");
        }
    }
    Ok(())
}

/// Packs a closed store into `to/<id>.tar.zst` and checks the archive opens.
fn backup_offline(data: &Path, to: &Path, keep: Option<u64>) -> anyhow::Result<ExitCode> {
    // Opening it read-only first: a directory that is not a store (or is open elsewhere
    // and mid-write) is refused before anything is written.
    let format = open_existing(data, true)?.format()?;
    std::fs::create_dir_all(to)?;
    let id = format!("b{}", crate::now_ms());
    let out = to.join(format!("{id}.tar.zst"));
    let tmp = to.join(format!("{id}.tar.zst.part"));
    crate::store::tarball::pack(data, &tmp)
        .with_context(|| format!("packing {}", data.display()))?;
    check_archive(&tmp, to, &id)?;
    std::fs::rename(&tmp, &out)?;
    let bytes = std::fs::metadata(&out)?.len();
    println!(
        "backup {id}: {bytes} bytes, store format {format}, written to {}",
        out.display()
    );
    prune_to(to, keep)?;
    Ok(ExitCode::SUCCESS)
}
