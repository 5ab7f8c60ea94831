//! Configuration reload without a restart: SIGHUP, or a change to the file (`ankusa-relay
//! run` watches it), reads the file again and applies what can change under a running node.
//!
//! **What reloads** ([`ankusa_config::reload::RELOADABLE`], from the configuration crate, which the operator
//! reads too): `sources`, `sinks`, `routes`, `admin.tokens`, `pull`,
//! `ingest.body_limit_bytes`, `tenants.limits` and `tenants.max`; and the content of every
//! CA bundle file (`dispatch.ca_bundle`, `sinks[].ca_bundle`), read again at each reload. Everything else needs a restart: a reload that changes any
//! other key — or the archive setting of any source, which the writer and the archiver
//! read at start — is refused, naming the keys.
//!
//! **All or nothing.** The new file is read and validated exactly as at start (the same
//! `ANKUSA_*` overrides, every secret resolved), and every part is built — the sources with
//! their verifiers, the sinks with their clients, the tokens — before anything is
//! swapped. A refused reload changes nothing and says why: in the log, in
//! `ankusa_config_reloads_total{outcome="refused"}` and `ankusa_config_reload_refused`, and
//! in `/v1/node`'s `config.refused`, until a reload succeeds.
//!
//! **What a reload keeps.** A sink whose configuration, secret and certificate authorities
//! did not change is the same sink (its adaptive limit, breaker, line and connections); a
//! request or a delivery already running finishes with the parts it started with. The
//! parts are swapped sinks first, so a hook a new source takes always finds its sinks.

use std::sync::{Arc, Mutex};

use ankusa_config::{Config, ConfigError};

use arc_swap::ArcSwap;

use crate::admin::auth::Tokens;
use crate::dispatch::delivery::Deliverer;
use crate::ingest::Source;
use crate::metrics::Metrics;

/// How often `run` reads its configuration file for a change.
pub const POLL: std::time::Duration = std::time::Duration::from_secs(2);

/// What a reload did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// The new configuration runs; these reloadable keys changed.
    Applied { changed: Vec<&'static str> },
    /// The file says what already runs (its secrets were read again all the same).
    Unchanged,
}

/// Why a reload was refused; the running configuration stays.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    #[error("these keys need a restart, and the running node keeps their old values: {}", .0.join(", "))]
    NeedsRestart(Vec<String>),
}

/// What a reload swaps: the handles the ingest listener, the pipeline and the admin API
/// read them through.
pub struct Parts {
    pub sources: Arc<ArcSwap<std::collections::HashMap<String, Source>>>,
    pub deliverer: Deliverer,
    pub tokens: Arc<ArcSwap<Tokens>>,
    pub config: Arc<ArcSwap<Config>>,
    /// What `/v1/node` shows of the configuration.
    pub status: Arc<Mutex<ankusa_api::node::ConfigStatus>>,
    /// Every tenant's default quotas (`tenants.limits`).
    pub quotas: Arc<crate::ingest::quota::Quotas>,
    /// The claim gateway's consumers and bounds.
    pub pull: Arc<crate::pull::Gateway>,
    /// The writer's `tenants.max` (new tenants past it are refused at the next batch).
    pub tenants_max: Arc<std::sync::atomic::AtomicU32>,
    /// The node's share of `tenants.max` among the Relay's nodes.
    pub cluster: Arc<crate::cluster::Cluster>,
}

/// The parts a reload swaps, and the configuration they run.
pub struct Reloader {
    running: Mutex<Config>,
    parts: Parts,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Reloader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reloader").finish_non_exhaustive()
    }
}

impl Reloader {
    pub fn new(running: Config, parts: Parts, metrics: Arc<Metrics>) -> Reloader {
        Reloader {
            running: Mutex::new(running),
            parts,
            metrics,
        }
    }

    /// Applies `text` (the configuration file) with `env`'s overrides, or refuses it and
    /// keeps what runs. Counted, logged and shown in `/v1/node` either way.
    pub fn reload(
        &self,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Reloaded, ReloadError> {
        let mut running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let result = self.apply(&mut running, text, env);
        self.record(result)
    }

    /// Counts, logs and shows a reload's outcome.
    fn record(&self, result: Result<Reloaded, ReloadError>) -> Result<Reloaded, ReloadError> {
        let now = ankusa_keyspace::now_ms();
        let mut status = self.parts.status.lock().unwrap_or_else(|p| p.into_inner());
        match &result {
            Ok(Reloaded::Applied { changed }) => {
                status.loaded_at_ms = now;
                status.reloads += 1;
                status.refused = None;
                self.metrics.config_reloaded("applied");
                tracing::info!(changed = %changed.join(", "), "configuration reloaded");
            }
            Ok(Reloaded::Unchanged) => {
                status.refused = None;
                self.metrics.config_reloaded("unchanged");
            }
            Err(e) => {
                status.refused = Some(ankusa_api::node::ReloadRefusal {
                    message: e.to_string(),
                    at_ms: now,
                });
                self.metrics.config_reloaded("refused");
                tracing::warn!(error = %e, "configuration reload refused; the running configuration stays");
            }
        }
        self.metrics
            .config_reload_refused
            .set(i64::from(status.refused.is_some()));
        result
    }

    /// What changes when a running source's `tenant_secrets` directory or a CA bundle file
    /// does, cheaply (the watcher asks every [`POLL`]): each directory's modification time,
    /// which an added or removed tenant moves, and the target of its `..data` link, which a
    /// mounted Kubernetes Secret's or ConfigMap's update swaps; each CA bundle file's
    /// modification time and length (through the links a mounted volume makes). A secret
    /// rewritten in place in a plain directory needs a SIGHUP.
    pub fn watched_files_stamp(&self) -> Vec<u8> {
        let running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        let mut stamp = |path: &std::path::Path| {
            let meta = std::fs::metadata(path).ok();
            let modified = meta.as_ref().and_then(|m| m.modified().ok());
            let len = meta.as_ref().map(std::fs::Metadata::len);
            out.extend_from_slice(
                format!("{}\0{modified:?}\0{len:?}\0", path.display()).as_bytes(),
            );
            let dir = if path.is_dir() {
                Some(path)
            } else {
                path.parent()
            };
            if let Some(Ok(target)) = dir.map(|d| std::fs::read_link(d.join("..data"))) {
                out.extend_from_slice(target.as_os_str().as_encoded_bytes());
            }
        };
        for s in &running.sources {
            if let Some(ankusa_config::TenantSecrets::Dir(dir)) = &s.tenant_secrets {
                stamp(dir);
            }
        }
        let bundles = running
            .sinks
            .iter()
            .filter_map(|s| s.ca_bundle.as_ref())
            .chain(running.dispatch.ca_bundle.as_ref());
        for b in bundles {
            if let ankusa_config::CaBundle::File(path) = b {
                stamp(path);
            }
        }
        out
    }

    /// [`Reloader::reload`] of the file at `path`; a file that cannot be read is refused.
    pub fn reload_file(&self, path: &std::path::Path) -> Result<Reloaded, ReloadError> {
        match std::fs::read_to_string(path) {
            Ok(text) => self.reload(&text, std::env::vars()),
            Err(source) => {
                let e = ConfigError::Read {
                    path: path.to_path_buf(),
                    source,
                };
                self.reload_refused(e.into())
            }
        }
    }

    fn reload_refused(&self, e: ReloadError) -> Result<Reloaded, ReloadError> {
        let _running = self.running.lock().unwrap_or_else(|p| p.into_inner());
        self.record(Err(e))
    }

    fn apply(
        &self,
        running: &mut Config,
        text: &str,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Reloaded, ReloadError> {
        let next = Config::from_yaml(text, env)?;
        let restart = needs_restart(running, &next);
        if !restart.is_empty() {
            return Err(ReloadError::NeedsRestart(restart));
        }
        let changed = ankusa_config::reload::changed(running, &next);
        // Everything built before anything is swapped: a part that cannot be built (a
        // secret file gone, a CA bundle that does not parse) refuses the whole reload. The
        // parts are built even when the file says what runs: a secret given as a file or a
        // variable is read again (a rotated sink secret makes a new sink; the others are
        // kept).
        let p = &self.parts;
        let sinks = p.deliverer.prepare(&next)?;
        let sources = crate::ingest::sources(&next)?;
        let tokens = Tokens::from_config(&next)?;
        let consumers = crate::pull::consumers(&next)?;
        p.deliverer.install(sinks);
        p.pull
            .install(consumers, crate::pull::Settings::from_config(&next));
        p.tokens.store(Arc::new(tokens));
        p.config.store(Arc::new(next.clone()));
        p.sources.store(Arc::new(sources));
        p.quotas.set_defaults(next.tenants.limits);
        if next.tenants.max != running.tenants.max {
            self.set_tenants_max(next.tenants.max);
        }
        *running = next;
        Ok(if changed.is_empty() {
            Reloaded::Unchanged
        } else {
            Reloaded::Applied { changed }
        })
    }

    /// A new `tenants.max`: the writer's ceiling, this node's share of the Relay's, the
    /// gauge. Lowered below the tenants held, the node keeps serving every one of them and
    /// admits no new tenant (the operator's `TenantsMaxBelowHeld` says so).
    fn set_tenants_max(&self, max: u32) {
        self.parts
            .tenants_max
            .store(max, std::sync::atomic::Ordering::Relaxed);
        self.parts.cluster.set_tenants_max(max);
        self.metrics.tenants_max.set(i64::from(max));
        tracing::info!(tenants_max = max, "tenants.max changed");
    }
}

/// Reloads the configuration at `path` on SIGHUP (`hup`), and when its content changes
/// (read every `every`: a Kubernetes ConfigMap volume's update swaps the file); until the
/// runtime stops.
pub async fn watch(
    reloader: Arc<Reloader>,
    path: std::path::PathBuf,
    mut hup: Option<tokio::signal::unix::Signal>,
    every: std::time::Duration,
) {
    let digest = |p: &std::path::Path| -> Option<[u8; 32]> {
        use sha2::Digest;
        let file = std::fs::read(p).ok()?;
        let mut d = sha2::Sha256::new();
        d.update(&file);
        d.update(reloader.watched_files_stamp());
        Some(d.finalize().into())
    };
    let mut seen = digest(&path);
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        let signalled = tokio::select! {
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => std::future::pending().await } } => true,
            _ = tick.tick() => false,
        };
        let now = digest(&path);
        // A file that cannot be read between two polls is not a change (a volume swapping
        // its files); on SIGHUP it is a refused reload.
        if !signalled && (now.is_none() || now == seen) {
            continue;
        }
        seen = now;
        let (r, p) = (reloader.clone(), path.clone());
        let why = if signalled {
            "SIGHUP"
        } else {
            "the file changed"
        };
        tracing::info!(path = %p.display(), why, "reloading the configuration");
        let _ = tokio::task::spawn_blocking(move || r.reload_file(&p)).await;
    }
}

/// The keys `next` changes that a running node cannot: every key outside [`ankusa_config::reload::RELOADABLE`],
/// by its path, and the archive setting of any source (the writer and the archiver read
/// it at start).
fn needs_restart(running: &Config, next: &Config) -> Vec<String> {
    let mut keys = Vec::new();
    let same_otherwise = ankusa_config::reload::with_reloadables_of(next, running);
    if same_otherwise != *running {
        let (a, b) = (to_json(running), to_json(&same_otherwise));
        differing("", &a, &b, &mut keys);
        if keys.is_empty() {
            // Only a secret differs, which the configuration's JSON form redacts.
            keys.push("a secret (cluster.token)".to_owned());
        }
    }
    let ids = running
        .sources
        .iter()
        .chain(&next.sources)
        .map(|s| s.id.as_str());
    let mut seen = std::collections::BTreeSet::new();
    for id in ids.filter(|id| seen.insert(*id)) {
        let (was, is) = (running.archive_policy(id), next.archive_policy(id));
        if was != is {
            keys.push(format!(
                "the archive of source {id} (sources[].archive, routes[].archive)"
            ));
        }
    }
    keys
}

fn to_json(c: &Config) -> serde_json::Value {
    serde_json::to_value(c).unwrap_or_default()
}

/// The paths of the leaves where `a` and `b` differ (lists as a whole).
fn differing(path: &str, a: &serde_json::Value, b: &serde_json::Value, out: &mut Vec<String>) {
    match (a, b) {
        (serde_json::Value::Object(x), serde_json::Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for k in keys {
                let p = if path.is_empty() {
                    k.clone()
                } else {
                    format!("{path}.{k}")
                };
                let null = serde_json::Value::Null;
                differing(
                    &p,
                    x.get(k).unwrap_or(&null),
                    y.get(k).unwrap_or(&null),
                    out,
                );
            }
        }
        _ if a != b => out.push(path.to_owned()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Config {
        Config::from_yaml(text, Vec::new()).unwrap()
    }

    const BASE: &str = "data_dir: /d\n\
        sinks: [{ id: s, url: \"http://127.0.0.1:9/\" }]\n\
        routes: [{ id: r, sinks: [s] }]\n\
        sources: [{ id: a, verify: { scheme: none }, route: r }]\n";

    #[test]
    fn only_the_reloadable_keys_change_under_a_running_node() {
        let running = cfg(BASE);
        let more = format!("{BASE}ingest: {{ body_limit_bytes: 4096 }}\n").replace(
            "[{ id: s,",
            "[{ id: t, url: \"http://127.0.0.1:8/\" }, { id: s,",
        );
        let next = cfg(&more);
        assert!(needs_restart(&running, &next).is_empty());
        assert_eq!(
            ankusa_config::reload::changed(&running, &next),
            ["sinks", "ingest.body_limit_bytes"]
        );
        let moved = cfg(&format!(
            "{BASE}tenants: {{ max: 5 }}\ndispatch: {{ max_inflight: 9 }}\n"
        ));
        assert_eq!(needs_restart(&running, &moved), ["dispatch.max_inflight"]);
        let archived =
            cfg(&BASE.replace("sinks: [s] }", "sinks: [s], archive: { enabled: true } }"));
        let why = needs_restart(&running, &archived);
        assert_eq!(why.len(), 1, "{why:?}");
        assert!(why[0].contains("archive of source a"), "{why:?}");
    }
}
