//! `run` and `config check`: a node started on its configuration, or the configuration
//! checked as `run` would.

use std::path::Path;
use std::process::ExitCode;

use crate::node::StopSignals;
use ankusa_config::Config;
use ankusa_queue::engine::SUPPORTED_FORMAT;

/// `config check`: what `run` would say about the file, without a store.
pub(super) fn config_check(path: &Path) -> anyhow::Result<ExitCode> {
    let (config, env) = Config::load_reported(path, std::env::vars())?;
    crate::node::check(&config)?;
    crate::telemetry::check(&config.log)?;
    for w in config.warnings() {
        eprintln!("warning: {w}");
    }
    for (var, key) in &env.applied {
        println!("override: {key} from {var}");
    }
    for var in &env.ignored {
        println!("not configuration, ignored: {var}");
    }
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
pub(super) fn run(config_path: &Path) -> anyhow::Result<ExitCode> {
    let rt = tokio::runtime::Runtime::new()?;
    let telemetry = rt.block_on(async move {
        let mut signals = StopSignals::install()?;
        // The logs are as the configuration says: it is read before anything logs (a bad
        // file is the command's error, on standard error).
        let (config, env) = Config::load_reported(config_path, std::env::vars())?;
        let telemetry =
            tokio::task::block_in_place(|| crate::telemetry::init(&config.log))?;
        for (variable, key) in &env.applied {
            tracing::info!(%variable, %key, "configuration override from the environment");
        }
        match crate::node::limits::raise_open_files_limit() {
            Ok((before, after)) if before != after => {
                tracing::info!(from = ?before, to = ?after, "raised the soft open-file limit to the hard limit")
            }
            Ok(_) => {}
            Err(e) => tracing::warn!(error = %e, "could not raise the soft open-file limit"),
        }
        let data_dir = config.data_dir.clone();
        let hangups = signals.hangups();
        let node = signals.start_node(config).await?;
        // SIGHUP, or a change to the file, reloads what can change without a restart.
        tokio::spawn(crate::reload::watch(
            node.reloader.clone(),
            config_path.to_path_buf(),
            hangups,
            crate::reload::POLL,
        ));
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
        anyhow::Ok(telemetry)
    })?;
    // The exporter sends what it holds, off the runtime.
    drop(telemetry);
    Ok(ExitCode::SUCCESS)
}
