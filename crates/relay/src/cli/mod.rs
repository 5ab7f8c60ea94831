//! The `ankusa-relay` command line.
//!
//! Every subcommand that is handed bad input (a missing data dir, a newer store format, a
//! corrupted family, a bad config) prints one clear error on stderr, exits non-zero, and
//! writes nothing.

mod admin;
mod backup;
mod client;
mod endpoints;
mod listing;
mod objstore;
mod pull;
mod run;
mod sink;
mod store;
mod times;

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

use ankusa_queue::engine::SUPPORTED_FORMAT;

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
        /// A node's admin URL, e.g. http://127.0.0.1:9090 (or 127.0.0.1:9090: http is the
        /// default scheme); repeat or comma-separate for several nodes.
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
    Sink(sink::SinkArgs),
    /// Consume a pull sink: claim its hooks, print each as a JSON line (or pipe its body to
    /// `--exec`), and ack it (nack it when the command fails).
    Pull {
        /// The node's ingest URL, e.g. http://127.0.0.1:8080.
        #[arg(long, env = "ANKUSA_PULL_URL")]
        url: String,
        /// A consumer token from the node's pull.consumers.
        #[arg(long, env = "ANKUSA_PULL_TOKEN", hide_env_values = true)]
        token: String,
        /// The pull sink's id.
        #[arg(long)]
        sink: String,
        /// Hooks per claim.
        #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u64).range(1..=10_000))]
        max: u64,
        /// How long a claim waits for hooks, in milliseconds.
        #[arg(long, default_value_t = 20_000)]
        wait_ms: u64,
        /// The lease, in milliseconds (default: the sink's).
        #[arg(long)]
        lease_ms: Option<u64>,
        /// A command run through `sh -c` for each hook: its body on stdin, its id, tenant,
        /// source, sink, attempt, content type, receipt time and lease in ANKUSA_*
        /// variables. Exit 0 acks the hook; anything else nacks it.
        #[arg(long)]
        exec: Option<String>,
        /// Stop once this many hooks were acked or nacked.
        #[arg(long)]
        limit: Option<u64>,
        /// Claim once, settle what came, and stop.
        #[arg(long)]
        once: bool,
    },
    /// Backups taken over the admin API (the operator's backup Job runs this).
    Backup {
        #[command(subcommand)]
        command: BackupCommand,
    },
    /// Unpack a backup archive into an empty data directory, or download a backup from
    /// object storage into one.
    Restore {
        /// The .tar.zst a backup produced, or a node's backup directory (`<relay>/<pod>/`
        /// on the backup volume): then its newest archive, or the newest at
        /// `--format-at-most`; or `s3://bucket/prefix` (`backup push`'s): the newest
        /// backup there (at `--format-at-most`), every file's checksum checked.
        #[arg(long)]
        from: PathBuf,
        #[command(flatten)]
        bucket: objstore::Bucket,
        /// The data directory to create (must not exist, or be empty, unless `--replace`).
        #[arg(long)]
        data: PathBuf,
        /// With a directory or a bucket: the newest backup whose store is at most this
        /// format (the backups a release that reads only that format can run on).
        #[arg(long)]
        format_at_most: Option<u32>,
        /// A store already at `--data` is moved aside (to `<data>.replaced-<ms>`; a node
        /// that runs keeps the newest of those) and the backup restored in its place. Run
        /// again after the same restore, it changes nothing.
        #[arg(long)]
        replace: bool,
        /// Write what the restore found, as JSON, to this file (the operator's restore Job:
        /// `/dev/termination-log`): the archive (a bucket's backup id), and the hooks the
        /// replaced store had acked after it, when that store can be read.
        #[arg(long)]
        report: Option<PathBuf>,
        /// This restore's name (the operator's Job's). A run again with the same name finds
        /// its work done; another name restores again, even from the same archive
        /// (without it, a run with `--replace` after a restore of the same archive changes
        /// nothing).
        #[arg(long)]
        once: Option<String>,
    },
    /// Print the OpenAPI 3.1 document of the ingest and admin APIs (docs/openapi.json).
    Openapi,
    /// Print the version and the store format this binary supports.
    Version {
        /// Print JSON (`{version, supported_format}`), as the operator's probe reads it.
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
        /// How many tenants to list, the most pending first.
        #[arg(long, default_value_t = 20)]
        top: usize,
    },
    /// One tenant's counters summed over the nodes that hold it (`tenant T`), or
    /// `tenant erase T --confirm T`.
    #[command(args_conflicts_with_subcommands = true)]
    Tenant {
        #[command(subcommand)]
        command: Option<TenantCommand>,
        /// The tenant's id.
        tenant: Option<String>,
    },
    /// The dead-letter queue.
    Dlq {
        #[command(subcommand)]
        command: DlqCommand,
    },
    /// Remove a tenant's pending and/or dead rows on every node (never rows in flight).
    /// Cannot be undone: give the tenant again with `--confirm`, or look first with
    /// `--dry-run`.
    Purge {
        /// The tenant whose rows go.
        tenant: String,
        /// Comma-separated: pending, dead.
        #[arg(long, default_value = "pending,dead")]
        kinds: String,
        /// The tenant id again: the purge runs only when it matches.
        #[arg(long, required_unless_present = "dry_run")]
        confirm: Option<String>,
        /// Print what a purge would remove (the tenant's counters summed over the nodes);
        /// remove nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Make a tenant's deliveries that wait out a retry's backoff due now, on every node:
    /// all of them, one sink's, or one hook's.
    Retry {
        /// The tenant whose deliveries are made due.
        tenant: String,
        /// Only deliveries to this sink (its id).
        #[arg(long)]
        sink: Option<String>,
        /// Only this hook's deliveries.
        #[arg(long)]
        hook: Option<String>,
    },
    /// Hold a tenant's deliveries on every node: its rows stay due and counted, no
    /// attempt is made until `resume`.
    Pause {
        /// The tenant to hold.
        tenant: String,
    },
    /// End a tenant's pause on every node: its deliveries go on.
    Resume {
        /// The tenant to let go on.
        tenant: String,
    },
    /// A tenant's quotas. With `--set` (admin): its own limits on every node, replacing
    /// any it had; with `--clear`: back to the defaults.
    Limits {
        /// The tenant whose limits are read or changed.
        tenant: String,
        /// `ingest_per_second=N`, `ingest_burst=N` or `queued_bytes=N`; `KEY=none` lifts
        /// the default. Repeat for several.
        #[arg(long = "set", value_name = "KEY=VALUE", conflicts_with = "clear")]
        set: Vec<String>,
        /// Remove the tenant's own limits: the defaults apply again.
        #[arg(long)]
        clear: bool,
    },
    /// A tenant's own endpoints (answered by the tenant's owner).
    Endpoints {
        #[command(subcommand)]
        command: EndpointsCommand,
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
        /// The directory each node's backup goes under, as DIR/<host>_<port>/.
        #[arg(long)]
        to: PathBuf,
        /// Keep the newest N backups in each node's directory, remove the older.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        keep: Option<u64>,
    },
}

#[derive(Debug, Subcommand)]
pub enum EndpointsCommand {
    /// The tenant's endpoints, without their secrets.
    List {
        /// The tenant's id.
        tenant: String,
    },
    /// A new endpoint: prints it and its secret (shown this once).
    Create {
        /// The tenant's id.
        tenant: String,
        /// `http://` or `https://`.
        url: String,
        /// Free text for the tenant.
        #[arg(long)]
        description: Option<String>,
        /// A route filter as JSON (`{"event": "invoice.*"}`).
        #[arg(long)]
        filter: Option<String>,
        /// The most deliveries a second to it.
        #[arg(long)]
        rate: Option<u32>,
        /// Made disabled: it takes no hook until `update --enable`.
        #[arg(long)]
        disabled: bool,
    },
    /// One endpoint.
    Get {
        /// The tenant's id.
        tenant: String,
        /// The endpoint's id (`ep_…`).
        id: String,
    },
    /// Change what the flags say; `--filter none`, `--rate none`, `--description none`
    /// clear.
    Update {
        /// The tenant's id.
        tenant: String,
        /// The endpoint's id (`ep_…`).
        id: String,
        /// A new URL.
        #[arg(long)]
        url: Option<String>,
        /// New free text (`none`: cleared).
        #[arg(long)]
        description: Option<String>,
        /// A new route filter as JSON (`none`: every hook).
        #[arg(long)]
        filter: Option<String>,
        /// The most deliveries a second (`none`: no pace).
        #[arg(long)]
        rate: Option<String>,
        /// New hooks go to it again.
        #[arg(long, conflicts_with = "disable")]
        enable: bool,
        /// New hooks no longer go to it; its queued deliveries dead-letter in their turn.
        #[arg(long)]
        disable: bool,
    },
    /// A new secret (printed once); the old one signs beside it for the overlap.
    Rotate {
        /// The tenant's id.
        tenant: String,
        /// The endpoint's id (`ep_…`).
        id: String,
        /// Seconds the old secret still signs (default: endpoints.rotation_overlap_s).
        #[arg(long)]
        overlap_s: Option<u64>,
    },
    /// Delete an endpoint: its queued deliveries dead-letter in their turn.
    Delete {
        /// The tenant's id.
        tenant: String,
        /// The endpoint's id (`ep_…`).
        id: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum TenantCommand {
    /// Erase a tenant for good on every node: every key of it goes, its ordinal stays as a
    /// tombstone. Cannot be undone.
    Erase {
        /// The tenant to erase.
        tenant: String,
        /// The tenant id again.
        #[arg(long)]
        confirm: String,
    },
}

#[derive(Debug, Subcommand)]
pub enum DlqCommand {
    /// Dead rows of every node, newest first, ids as <node>/<id>; `next` pages on.
    List {
        /// Only this tenant's rows.
        #[arg(long)]
        tenant: Option<String>,
        /// Only rows of hooks from this source.
        #[arg(long)]
        source: Option<String>,
        #[command(flatten)]
        window: times::Window,
        /// Rows on this page.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// The page after the one whose `next` this is (printed under the table).
        #[arg(long)]
        before: Option<String>,
    },
    /// Revive dead rows: by id (<node>/<id>), or by tenant, source and time on every node.
    Replay {
        /// A row's id as the listing prints it (<node>/<id>); repeat for several.
        #[arg(long = "id")]
        ids: Vec<String>,
        /// Only this tenant's rows.
        #[arg(long)]
        tenant: Option<String>,
        /// Only rows of hooks from this source.
        #[arg(long)]
        source: Option<String>,
        #[command(flatten)]
        window: times::Window,
        /// The most rows each node revives.
        #[arg(long)]
        limit: Option<usize>,
        /// Count what the replay would revive; revive nothing.
        #[arg(long)]
        dry_run: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum HooksCommand {
    /// One hook by id, from whichever node's log has it: its tenant, source, receipt and,
    /// per sink, its state and attempts.
    Get {
        /// The hook's id (`hk_…`), as ingest answered it.
        id: String,
        /// Also print the body (while the hook is still stored).
        #[arg(long)]
        body: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum QuarantineCommand {
    /// Quarantined requests of every node, newest first, ids as <node>/<id>; `next` pages
    /// on.
    List {
        /// Requests on this page.
        #[arg(long, default_value_t = 50)]
        limit: usize,
        /// The page after the one whose `next` this is (printed under the table).
        #[arg(long)]
        before: Option<String>,
    },
    /// Verify requests again with their sources' secrets of now (after fixing a wrong
    /// one) and ingest those that pass: by id (<node>/<id>), or by source, reason and time
    /// on every node.
    Replay {
        /// A request's id as the listing prints it (<node>/<id>); repeat for several.
        #[arg(long = "id")]
        ids: Vec<String>,
        /// Only this source's requests.
        #[arg(long)]
        source: Option<String>,
        /// Only requests that failed for this reason (bad_signature, stale_timestamp,
        /// missing_header, malformed_header).
        #[arg(long)]
        reason: Option<String>,
        #[command(flatten)]
        window: times::Window,
        /// The most requests each node sends again.
        #[arg(long)]
        limit: Option<usize>,
        /// Count what would be sent again; send nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Delete one (<node>/<id>), or every one in the token's scope on every node.
    Delete {
        /// The request's id as the listing prints it (<node>/<id>); none: every one.
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
    /// Upload a store no node has open to S3-compatible object storage: its table and
    /// blob files once each (a later push uploads only the files written since), then a
    /// manifest naming every file with its checksum.
    Push {
        /// The store's data directory.
        #[arg(long)]
        data: PathBuf,
        /// `s3://bucket/prefix`.
        #[arg(long)]
        to: String,
        #[command(flatten)]
        bucket: objstore::Bucket,
        /// After the push, keep only the newest N backups under the prefix, and the files
        /// they name (one writer per prefix); and the newest backup of each store format
        /// older than the newest backup's (a rollback's), unless
        /// `--release-older-formats`.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        keep: Option<u64>,
        /// With `--keep`: backups at older store formats are kept only as the newest N.
        #[arg(long, requires = "keep")]
        release_older_formats: bool,
    },
    /// Ask a node for a backup and copy its archive to `--to`, checking it opens.
    Pull {
        /// The node's admin URL, e.g. http://relay-0.relay:9090
        #[arg(long)]
        from: String,
        /// A token of admin or backup scope (`scope: backup` may take backups and nothing
        /// else).
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
        /// Write what was done as JSON to this file: the archive, its size and store
        /// format, and the room left on `--to`'s volume after the prune (the operator's
        /// backup Jobs give it in their termination message).
        #[arg(long, env = "ANKUSA_BACKUP_REPORT")]
        report: Option<PathBuf>,
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
        /// Keep the newest N backups in `--to`, remove the older.
        #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
        keep: Option<u64>,
        /// As `backup pull --report`.
        #[arg(long, env = "ANKUSA_BACKUP_REPORT")]
        report: Option<PathBuf>,
    },
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Format, column families, key counts per family, migration in progress.
    Inspect {
        /// The store's data directory.
        #[arg(long)]
        data: PathBuf,
    },
    /// Run (or, with --dry-run, list) the pending format migrations.
    Migrate {
        /// The store's data directory.
        #[arg(long)]
        data: PathBuf,
        /// List the pending migrations; run none.
        #[arg(long)]
        dry_run: bool,
    },
    /// Check that the counters equal a fold of the families they summarise.
    Verify {
        /// The store's data directory.
        #[arg(long)]
        data: PathBuf,
    },
    /// Write a fixture store of format 2 or 3 as a .tar.zst (tests, upgrade drills).
    Fixture {
        /// The store format of the fixture.
        #[arg(long, value_parser = clap::value_parser!(u32).range(2..=3))]
        format: u32,
        /// The .tar.zst to write.
        out: PathBuf,
    },
}

/// Runs a parsed command line.
/// An error and its causes on one line, each cause written once: a cause whose text its
/// effect already shows (`opening X: <cause>`) is not repeated.
pub fn error_text(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1) {
        let c = cause.to_string();
        if !text.contains(&c) {
            text.push_str(": ");
            text.push_str(&c);
        }
    }
    text
}

pub fn main(cli: Cli) -> anyhow::Result<ExitCode> {
    match cli.command {
        Command::Run { config } => run::run(&config),
        Command::Config {
            command: ConfigCommand::Check { file },
        } => run::config_check(&file),
        Command::Admin {
            urls,
            all_addresses,
            token,
            json,
            timeout_s,
            command,
        } => admin::admin(
            &urls,
            all_addresses,
            &token,
            json,
            std::time::Duration::from_secs(timeout_s),
            command,
        ),
        Command::Sink(args) => sink::sink(args),
        Command::Pull {
            url,
            token,
            sink,
            max,
            wait_ms,
            lease_ms,
            exec,
            limit,
            once,
        } => pull::pull(pull::PullArgs {
            url,
            token,
            sink,
            max: max as usize,
            wait_ms,
            lease_ms,
            exec,
            limit,
            once,
        }),
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
                    report,
                },
        } => backup::backup_pull(
            &from,
            &token,
            &to,
            keep,
            std::time::Duration::from_secs(idle_timeout_s),
            report.as_deref(),
        ),
        Command::Backup {
            command:
                BackupCommand::Offline {
                    data,
                    to,
                    keep,
                    report,
                },
        } => backup::backup_offline(&data, &to, keep, report.as_deref()),
        Command::Backup {
            command:
                BackupCommand::Push {
                    data,
                    to,
                    bucket,
                    keep,
                    release_older_formats,
                },
        } => objstore::push(&data, &to, &bucket, keep, release_older_formats),
        Command::Restore {
            from,
            bucket,
            data,
            format_at_most,
            replace,
            report,
            once,
        } if from.to_string_lossy().starts_with("s3://") => backup::restore_from_bucket(
            &from.to_string_lossy(),
            &bucket,
            &data,
            format_at_most,
            replace,
            report.as_deref(),
            once.as_deref(),
        ),
        Command::Restore {
            from,
            bucket: _,
            data,
            format_at_most,
            replace,
            report,
            once,
        } => backup::restore(
            &from,
            &data,
            format_at_most,
            replace,
            report.as_deref(),
            once.as_deref(),
        ),
        Command::Version { json, write } => {
            let text = if json {
                serde_json::to_string(&ankusa_api::node::Version {
                    version: env!("CARGO_PKG_VERSION").to_owned(),
                    store_format: SUPPORTED_FORMAT,
                })?
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
            StoreCommand::Inspect { data } => store::inspect(&data),
            StoreCommand::Migrate { data, dry_run } => store::migrate_cmd(&data, dry_run),
            StoreCommand::Verify { data } => store::verify(&data),
            StoreCommand::Fixture { format, out } => store::fixture(format, &out),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::error_text;

    #[test]
    fn an_error_text_writes_each_cause_once() {
        let inner = std::io::Error::other("disk on fire");
        let e = anyhow::Error::new(inner).context("opening the store at /d: disk on fire");
        assert_eq!(error_text(&e), "opening the store at /d: disk on fire");
        let e = anyhow::Error::new(std::io::Error::other("no such file")).context("reading x");
        assert_eq!(error_text(&e), "reading x: no such file");
    }
}
