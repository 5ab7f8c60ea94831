//! The I/O shell around the planner: watch `Relay`s, observe what exists, ask the planner,
//! carry out its answer, write the status.
//!
//! One reconcile:
//! 1. read the `Relay` (watched as untyped objects, so one malformed `Relay` is reported on
//!    itself — a Warning Event and a metric — and never breaks the watch of the others);
//! 2. read the user's configuration (inline, or the referenced ConfigMap) and the
//!    operator's token Secret (made once);
//! 3. observe the StatefulSet, pods, owned objects, Jobs, whether the ServiceMonitor API is
//!    served, and poll each ready pod's `/v1/node`;
//! 4. [`planner::rollout`] and [`planner::changes`]: apply only what is missing or drifted,
//!    by server-side apply under [`FIELD_MANAGER`] with an owner reference, with an Event
//!    for each object created or changed; create the Jobs the planner asks for;
//! 5. [`status::status`]: patch the status only when it differs.
//!
//! What triggers a reconcile: a change of a `Relay`'s generation (its spec — not its
//! status, which the operator itself rewrites as node counters move), a change of an owned
//! object, and the `poll_interval` requeue (that is the node poll). A failed reconcile
//! backs off exponentially per object (1 s doubling to 5 min).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ankusa_crds::relay::{Relay, RelayStatus};
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{predicates, reflector, watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde_json::{json, Value};

use crate::metrics::Metrics;
use crate::nodes::NodeClient;
use crate::planner::{self, Change, JobAction, JobObs, Observed, Owned, PodObs, ProbeObs, StsObs};
use crate::resources::{self, DesiredSet, Names, ResourceError};
use crate::status;

/// The field manager of every server-side apply the operator makes.
pub const FIELD_MANAGER: &str = "ankusa-operator";

/// Why a reconcile failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("malformed Relay: {0}")]
    Malformed(String),
    #[error(transparent)]
    Resource(#[from] ResourceError),
}

impl Error {
    /// The `reason` label of the failure metric.
    pub fn reason(&self) -> &'static str {
        match self {
            Error::Kube(kube::Error::Api(s)) if s.code == 409 => "conflict",
            Error::Kube(kube::Error::Api(s)) if s.code == 422 => "invalid",
            Error::Kube(kube::Error::Api(s)) if s.code == 403 => "forbidden",
            Error::Kube(kube::Error::Api(_)) => "api",
            Error::Kube(_) => "transport",
            Error::Malformed(_) => "malformed",
            Error::Resource(_) => "resource",
        }
    }
}

/// Settings of the controller.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How often each `Relay` is reconciled and its nodes polled.
    pub poll_interval: Duration,
    /// How a node's admin URL is formed (see [`crate::nodes::DEFAULT_URL_TEMPLATE`]).
    pub node_url_template: String,
    /// How a node's ingest URL is formed, for the other nodes of its Relay (see
    /// [`crate::resources::DEFAULT_INGEST_URL_TEMPLATE`]).
    pub node_ingest_url_template: String,
    pub node_timeout: Duration,
    /// The Events' reporting instance (the operator pod's name).
    pub instance: String,
    /// Where the Relay watch reports its events and errors, for the pod's probes.
    pub health: Option<Arc<crate::health::Health>>,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            poll_interval: Duration::from_secs(30),
            node_url_template: crate::nodes::DEFAULT_URL_TEMPLATE.into(),
            node_ingest_url_template: crate::resources::DEFAULT_INGEST_URL_TEMPLATE.into(),
            node_timeout: Duration::from_secs(3),
            instance: "ankusa-operator".into(),
            health: None,
        }
    }
}

/// What every reconcile shares.
pub struct Context {
    pub client: Client,
    pub metrics: Arc<Metrics>,
    pub settings: Settings,
    nodes: NodeClient,
    recorder: Recorder,
    /// Consecutive failures per `Relay`, for the backoff.
    failures: Mutex<HashMap<(String, String), u32>>,
    /// What probes learned of images: the store format and the digest the tag resolved to
    /// (at most [`PROBED_MAX`] images; a forgotten one is read from its Job again).
    probed: Mutex<BTreeMap<String, Probed>>,
}

impl Context {
    pub fn new(client: Client, metrics: Arc<Metrics>, settings: Settings) -> Arc<Context> {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: FIELD_MANAGER.into(),
                instance: Some(settings.instance.clone()),
            },
        );
        Arc::new(Context {
            nodes: NodeClient::new(settings.node_url_template.clone(), settings.node_timeout),
            client,
            metrics,
            settings,
            recorder,
            failures: Mutex::new(HashMap::new()),
            probed: Mutex::new(BTreeMap::new()),
        })
    }
}

/// Images whose probe results are kept in memory.
pub const PROBED_MAX: usize = 256;

/// What an image probe learned.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Probed {
    format: u32,
    /// `sha256:…`, when the pod's image ID named a repository digest.
    digest: Option<String>,
}

/// The `Relay` resource as an untyped API resource (the watch reads untyped objects).
pub fn relay_api_resource() -> kube::api::ApiResource {
    kube::api::ApiResource::erase::<Relay>(&())
}

/// Watch every `Relay` (in `namespace`, or all) and reconcile until `shutdown` resolves.
pub async fn run(
    ctx: Arc<Context>,
    namespace: Option<String>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let client = ctx.client.clone();
    let ar = relay_api_resource();
    let (relays, sts, svc, cm, pdb, jobs) = match &namespace {
        Some(ns) => (
            Api::<DynamicObject>::namespaced_with(client.clone(), ns, &ar),
            Api::<StatefulSet>::namespaced(client.clone(), ns),
            Api::<Service>::namespaced(client.clone(), ns),
            Api::<ConfigMap>::namespaced(client.clone(), ns),
            Api::<PodDisruptionBudget>::namespaced(client.clone(), ns),
            Api::<Job>::namespaced(client.clone(), ns),
        ),
        None => (
            Api::<DynamicObject>::all_with(client.clone(), &ar),
            Api::<StatefulSet>::all(client.clone()),
            Api::<Service>::all(client.clone()),
            Api::<ConfigMap>::all(client.clone()),
            Api::<PodDisruptionBudget>::all(client.clone()),
            Api::<Job>::all(client.clone()),
        ),
    };
    let owned = watcher::Config::default().labels("app.kubernetes.io/managed-by=ankusa-operator");
    // Relays trigger a reconcile when their generation changes, not on every status
    // write: the operator's own status patches (node counters move all the time) would
    // otherwise re-trigger it in a loop. Node polls come from the requeue interval, and
    // changes to owned objects still trigger through `owns`.
    let writer = reflector::store::Writer::new(ar.clone());
    let reader = writer.as_reader();
    let health = ctx.settings.health.clone();
    let relay_changes = watcher(relays, watcher::Config::default())
        .map(move |event| {
            if let Some(h) = &health {
                match &event {
                    Ok(watcher::Event::InitDone) => h.watch_event(true),
                    Ok(_) => h.watch_event(false),
                    Err(_) => h.watch_error(),
                }
            }
            event
        })
        .default_backoff()
        .reflect(writer)
        .applied_objects()
        .predicate_filter(predicates::generation, Default::default());
    Controller::for_stream_with(relay_changes, reader, ar)
        .owns(sts, owned.clone())
        .owns(svc, owned.clone())
        .owns(cm, owned.clone())
        .owns(pdb, owned.clone())
        .owns(jobs, owned)
        .graceful_shutdown_on(shutdown)
        .run(reconcile_object, error_policy, ctx)
        .for_each(|res| async move {
            match res {
                Ok((obj, _)) => tracing::debug!(relay = %obj.name, "reconciled"),
                Err(e) => tracing::warn!(error = %e, "reconcile failed"),
            }
        })
        .await;
}

/// Reconcile one watched object: decode it, then [`reconcile`].
pub async fn reconcile_object(obj: Arc<DynamicObject>, ctx: Arc<Context>) -> Result<Action, Error> {
    let relay = match decode(&obj) {
        Ok(r) => r,
        Err(e) => {
            // Report on the object itself and wait for the user to fix it: retrying a
            // spec that cannot parse only repeats the Event.
            let reference = obj.object_ref(&relay_api_resource());
            let _ = ctx
                .recorder
                .publish(
                    &Event {
                        type_: EventType::Warning,
                        reason: "Malformed".into(),
                        note: Some(truncate(&e.to_string(), 1000)),
                        action: "Reconcile".into(),
                        secondary: None,
                    },
                    &reference,
                )
                .await;
            ctx.metrics.failure("malformed");
            tracing::warn!(relay = %obj.name_any(), error = %e, "malformed Relay");
            return Ok(Action::await_change());
        }
    };
    reconcile(Arc::new(relay), ctx).await
}

/// A watched object as a `Relay`.
pub fn decode(obj: &DynamicObject) -> Result<Relay, Error> {
    let v = serde_json::to_value(obj).map_err(|e| Error::Malformed(e.to_string()))?;
    serde_json::from_value(v).map_err(|e| Error::Malformed(e.to_string()))
}

fn truncate(s: &str, n: usize) -> String {
    s.chars().take(n).collect()
}

/// Back off per object: 1 s, 2 s, 4 s … up to 5 min.
pub fn error_policy(obj: Arc<DynamicObject>, err: &Error, ctx: Arc<Context>) -> Action {
    ctx.metrics.failure(err.reason());
    let key = (obj.namespace().unwrap_or_default(), obj.name_any());
    let n = {
        let mut f = ctx.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key).or_insert(0);
        *n = n.saturating_add(1);
        *n
    };
    tracing::warn!(relay = %obj.name_any(), error = %err, failures = n, "reconcile failed");
    Action::requeue(backoff(n))
}

/// The delay after `n` consecutive failures.
pub fn backoff(n: u32) -> Duration {
    let secs = 1u64 << n.saturating_sub(1).min(9);
    Duration::from_secs(secs.min(300))
}

/// One reconcile of one `Relay`.
pub async fn reconcile(relay: Arc<Relay>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = Instant::now();
    ctx.metrics.reconciles.inc();
    let result = reconcile_inner(&relay, &ctx).await;
    ctx.metrics
        .duration
        .observe(started.elapsed().as_secs_f64());
    if result.is_ok() {
        let key = (relay.namespace().unwrap_or_default(), relay.name_any());
        ctx.failures
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&key);
    }
    result
}

async fn reconcile_inner(relay: &Relay, ctx: &Context) -> Result<Action, Error> {
    let names = Names::of(relay)?;
    let ns = names.namespace.as_str();
    let client = &ctx.client;
    let prev = relay.status.clone().unwrap_or_default();
    let mut o = Observed {
        now: now_rfc3339(),
        ..Observed::default()
    };

    let user_config = match user_config(relay, client, ns).await {
        Ok(c) => c,
        Err(e) => {
            o.config_error = Some(e.to_string());
            None
        }
    };
    let token = ensure_token(relay, ctx, &names).await?;

    observe(relay, ctx, &names, &token, &mut o).await?;
    let rollout = planner::rollout(relay, &prev, &o);
    let monitor = planner::monitor_decision(relay, &o);

    if o.config_error.is_none() {
        let mut effective = relay.clone();
        effective.spec.image = rollout.image.clone();
        effective.spec.replicas = rollout.replicas;
        let desired = DesiredSet::build_with(
            &effective,
            user_config.as_ref(),
            rollout.partition,
            monitor == planner::MonitorDecision::Applied,
            &resources::NodeUrls {
                admin: ctx.settings.node_url_template.clone(),
                ingest: ctx.settings.node_ingest_url_template.clone(),
            },
        );
        match desired {
            Ok(mut desired) => {
                o.storage_change =
                    keep_claim_templates(&mut desired, o.objects.statefulset.as_ref());
                // A refused object (a ServiceMonitor the Prometheus Operator rejects, say)
                // is a condition; the rest of the reconcile, the gate's Jobs included,
                // goes on.
                let refused = apply_desired(relay, ctx, &names, &desired, &mut o).await;
                if !refused.is_empty() {
                    o.apply_error = Some(
                        refused
                            .iter()
                            .map(|(what, e)| format!("{what}: {e}"))
                            .collect::<Vec<_>>()
                            .join("; "),
                    );
                }
                for job in &rollout.jobs {
                    create_job(relay, ctx, &names, job).await?;
                }
            }
            Err(e) => o.config_error = Some(e.to_string()),
        }
    }
    let next = write_status(relay, ctx, &prev, &o, &rollout, &monitor).await?;
    for e in planner::upgrade_events(
        relay,
        prev.upgrade.as_ref(),
        next.upgrade.as_ref(),
        &rollout,
    ) {
        event_with(ctx, relay, &e).await;
    }
    ctx.metrics.upgrade(relay, &next);
    if o.apply_error.is_some() {
        // Retried sooner than the poll, with the backoff of a failed reconcile.
        return Ok(Action::requeue(
            ctx.settings.poll_interval.min(Duration::from_secs(10)),
        ));
    }
    Ok(Action::requeue(ctx.settings.poll_interval))
}

/// The StatefulSet's claim templates cannot change in place: the desired object keeps the
/// live ones, and a different size asked for is reported (`Some(message)`) for the user to
/// carry out.
fn keep_claim_templates(desired: &mut DesiredSet, live: Option<&Value>) -> Option<String> {
    let live_templates = live?.pointer("/spec/volumeClaimTemplates")?.clone();
    let live_templates: Vec<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        serde_json::from_value(live_templates).ok()?;
    let spec = desired.statefulset.spec.as_mut()?;
    let wanted = spec.volume_claim_templates.clone().unwrap_or_default();
    let size = |c: &k8s_openapi::api::core::v1::PersistentVolumeClaim| {
        c.spec
            .as_ref()
            .and_then(|s| s.resources.as_ref())
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .map(|q| q.0.clone())
    };
    let class = |c: &k8s_openapi::api::core::v1::PersistentVolumeClaim| {
        c.spec.as_ref().and_then(|s| s.storage_class_name.clone())
    };
    let message = match (wanted.first(), live_templates.first()) {
        (Some(w), Some(l)) if size(w) != size(l) || (class(w).is_some() && class(w) != class(l)) => Some(format!(
            "spec.storage asks for {} ({}) but the StatefulSet's claims were made with {} ({}); claim templates cannot change in place: expand each data-* claim (kubectl edit pvc), then delete the StatefulSet with --cascade=orphan; the operator recreates it with the new template on the release the nodes run",
            size(w).unwrap_or_default(),
            class(w).unwrap_or_else(|| "default class".into()),
            size(l).unwrap_or_default(),
            class(l).unwrap_or_else(|| "default class".into()),
        )),
        _ => None,
    };
    spec.volume_claim_templates = Some(live_templates);
    message
}

/// Measure drift against the API server's own answer (a dry-run apply of each existing
/// object), then carry out the planner's changes. Returns what was refused (`StatefulSet
/// update`, say, with the error); one refusal does not stop the other objects.
async fn apply_desired(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    desired: &DesiredSet,
    o: &mut Observed,
) -> Vec<(String, Error)> {
    let mut refused = Vec::new();
    let mut dry_refused = Vec::new();
    for kind in Owned::ALL {
        if o.objects.get(kind).is_none() {
            continue;
        }
        // Refused even as a dry run: the update itself would be.
        match patch_owned(ctx, names, desired, kind, DryRun::Yes).await {
            Ok(Some(after)) => {
                o.objects.applied.insert(kind, after);
            }
            Ok(None) => {}
            Err(e) => {
                dry_refused.push(kind);
                refused.push((format!("{} update", kind.kind()), e));
            }
        }
    }
    for (kind, change) in planner::changes(desired, &o.objects) {
        if dry_refused.contains(&kind) {
            continue;
        }
        if let Err(e) = apply_owned(relay, ctx, names, desired, kind, change).await {
            ctx.metrics.failure(e.reason());
            refused.push((format!("{} {}", kind.kind(), change_word(change)), e));
        }
    }
    refused
}

fn change_word(c: Change) -> &'static str {
    match c {
        Change::Create => "create",
        Change::Update => "update",
        Change::Delete => "delete",
    }
}

async fn write_status(
    relay: &Relay,
    ctx: &Context,
    prev: &RelayStatus,
    o: &Observed,
    rollout: &planner::Rollout,
    monitor: &planner::MonitorDecision,
) -> Result<RelayStatus, Error> {
    let next = status::status(relay, prev, o, rollout, monitor);
    if relay.status.as_ref() == Some(&next) {
        return Ok(next);
    }
    let api: Api<Relay> =
        Api::namespaced(ctx.client.clone(), &relay.namespace().unwrap_or_default());
    let body = json!({
        "apiVersion": "ankusa.dev/v1alpha1",
        "kind": "Relay",
        "status": next,
    });
    api.patch_status(
        &relay.name_any(),
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&body),
    )
    .await?;
    Ok(next)
}

fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

/// Why the user's relay configuration could not be read: a message for the `Degraded`
/// condition, not a failed reconcile.
#[derive(Debug, thiserror::Error)]
pub enum UserConfigError {
    #[error("reading ConfigMap {name}: {source}")]
    Read { name: String, source: kube::Error },
    #[error("ConfigMap {0} does not exist")]
    Missing(String),
    #[error("ConfigMap {name} has no key {key}")]
    NoKey { name: String, key: String },
    #[error("ConfigMap {name} key {key}: {source}")]
    Yaml {
        name: String,
        key: String,
        source: serde_yaml::Error,
    },
}

/// Why a probe Job's answer could not be read: the probe is reported failed.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("listing its pods: {0}")]
    List(#[from] kube::Error),
    #[error("the probe's pod is gone")]
    PodGone,
    #[error("the probe's pod left no termination message")]
    NoMessage,
    #[error("no store_format in the probe's output: {0}")]
    NoFormat(String),
}

/// The user's relay configuration: `spec.config.inline`, or the YAML under the referenced
/// ConfigMap's key.
async fn user_config(
    relay: &Relay,
    client: &Client,
    ns: &str,
) -> Result<Option<Value>, UserConfigError> {
    let cfg = &relay.spec.config;
    if let Some(inline) = &cfg.inline {
        return Ok(Some(inline.clone()));
    }
    let Some(r) = &cfg.config_map_ref else {
        return Ok(None);
    };
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = api
        .get_opt(&r.name)
        .await
        .map_err(|source| UserConfigError::Read {
            name: r.name.clone(),
            source,
        })?
        .ok_or_else(|| UserConfigError::Missing(r.name.clone()))?;
    let text = cm
        .data
        .as_ref()
        .and_then(|d| d.get(&r.key))
        .ok_or_else(|| UserConfigError::NoKey {
            name: r.name.clone(),
            key: r.key.clone(),
        })?;
    let v: Value = serde_yaml::from_str(text).map_err(|source| UserConfigError::Yaml {
        name: r.name.clone(),
        key: r.key.clone(),
        source,
    })?;
    Ok(Some(v))
}

/// The operator's admin token for this `Relay`, read from its Secret; the Secret (with the
/// backup-scope token and the nodes' cluster token beside it) is made once, and a key
/// missing from an older one added.
async fn ensure_token(relay: &Relay, ctx: &Context, names: &Names) -> Result<String, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let existing = api.get_opt(&names.token_secret).await?;
    let key = |k: &str| {
        existing
            .as_ref()
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get(k))
            .map(|t| String::from_utf8_lossy(&t.0).into_owned())
    };
    let (token, backup, cluster) = (
        key(resources::TOKEN_KEY),
        key(resources::BACKUP_TOKEN_KEY),
        key(resources::CLUSTER_TOKEN_KEY),
    );
    if let (Some(token), Some(_), Some(_)) = (&token, &backup, &cluster) {
        return Ok(token.clone());
    }
    let change = if existing.is_some() {
        Change::Update
    } else {
        Change::Create
    };
    let token = token.unwrap_or_else(new_token);
    let secret = resources::token_secret(
        relay,
        &token,
        &backup.unwrap_or_else(new_token),
        &cluster.unwrap_or_else(new_token),
    )?;
    apply(
        ctx,
        relay,
        &api,
        "Secret",
        &names.token_secret,
        &secret,
        change,
    )
    .await?;
    Ok(token)
}

fn new_token() -> String {
    use rand::RngCore;
    let mut b = [0u8; 32];
    rand::rng().fill_bytes(&mut b);
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn observe(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    token: &str,
    o: &mut Observed,
) -> Result<(), Error> {
    let client = &ctx.client;
    let ns = names.namespace.as_str();

    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let sts = sts_api.get_opt(&names.statefulset).await?;
    o.statefulset = sts.as_ref().map(sts_obs);
    o.objects.statefulset = sts.as_ref().map(to_json);
    o.objects.config_map = get_json::<ConfigMap>(client, ns, &names.config_map).await?;
    o.objects.headless = get_json::<Service>(client, ns, &names.headless).await?;
    o.objects.client = get_json::<Service>(client, ns, &names.client).await?;
    o.objects.pdb = get_json::<PodDisruptionBudget>(client, ns, &names.pdb).await?;

    o.service_monitor_api = service_monitor_served(client).await?;
    if o.service_monitor_api {
        // Read whether or not monitoring is on: one left from when it was on is deleted.
        // A ServiceMonitor of that name that this Relay does not own is not its business.
        let api: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), ns, &resources::service_monitor_resource());
        let uid = relay.metadata.uid.clone();
        o.objects.service_monitor = api
            .get_opt(&names.service_monitor)
            .await?
            .filter(|sm| {
                sm.owner_references()
                    .iter()
                    .any(|r| r.controller == Some(true) && Some(&r.uid) == uid.as_ref())
            })
            .as_ref()
            .map(to_json);
    }

    let selector = resources::selector_labels(&names.relay)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(",");
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!(
            "{selector},{}=relay",
            "app.kubernetes.io/component"
        )))
        .await?;
    o.pods = list
        .items
        .iter()
        .filter_map(|p| pod_obs(p, &names.statefulset))
        .collect();

    let claims: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(client.clone(), ns);
    o.claims = claims
        .list(&ListParams::default().labels(&selector))
        .await?
        .items
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter_map(|c| names.claim_ordinal(&c.name_any()))
        .collect();
    o.claims.sort_unstable();

    // Poll every ready pod, concurrently.
    let polls = o.pods.iter().filter(|p| p.ready).map(|p| {
        let url = ctx.nodes.url(&p.name, &names.headless, ns);
        let name = p.name.clone();
        let nodes = ctx.nodes.clone();
        let token = token.to_owned();
        async move {
            (
                name,
                nodes.poll(&url, &token).await.map_err(|e| e.to_string()),
            )
        }
    });
    for (name, reading) in futures::future::join_all(polls).await {
        ctx.metrics.poll(reading.is_ok());
        if let Err(e) = &reading {
            tracing::info!(relay = %names.relay, pod = %name, error = %e, "node did not answer");
        }
        o.nodes.insert(name, reading);
    }

    observe_jobs(relay, ctx, names, o).await?;
    Ok(())
}

async fn observe_jobs(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    o: &mut Observed,
) -> Result<(), Error> {
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let jobs = api
        .list(&ListParams::default().labels(&format!(
            "app.kubernetes.io/instance={},{}",
            names.relay,
            resources::JOB_LABEL
        )))
        .await?;
    let by_name: BTreeMap<String, &Job> = jobs.items.iter().map(|j| (j.name_any(), j)).collect();
    let cached = ctx.probed.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (image, p) in &cached {
        o.probes.insert(image.clone(), ProbeObs::Format(p.format));
        if let Some(d) = &p.digest {
            o.digests.insert(image.clone(), d.clone());
        }
    }
    // The probe of the spec's image.
    let image = relay.spec.image.clone();
    let name = planner::probe_job_name(relay, &image);
    let probe = match by_name.get(&name) {
        Some(job) if !o.probes.contains_key(&image) => Some(match job_obs(job) {
            JobObs::Running => ProbeObs::Running,
            JobObs::Failed(m) => ProbeObs::Failed(format!("Job {name}: {m}")),
            JobObs::Succeeded => match probe_result(ctx, &names.namespace, &name).await {
                Ok(p) => {
                    if let Some(d) = &p.digest {
                        o.digests.insert(image.clone(), d.clone());
                    }
                    let format = p.format;
                    let mut probed = ctx.probed.lock().unwrap_or_else(|p| p.into_inner());
                    if probed.len() >= PROBED_MAX {
                        probed.pop_first();
                    }
                    probed.insert(image.clone(), p);
                    ProbeObs::Format(format)
                }
                Err(m) => ProbeObs::Failed(format!("Job {name}: {m}")),
            },
        }),
        _ => None,
    };
    if let Some(p) = probe {
        o.probes.insert(image, p);
    }
    // Backup Jobs of the upgrade step under way (their names carry the target and the
    // attempt), by the ordinal they back up.
    if let Some(u) = relay.status.as_ref().and_then(|s| s.upgrade.as_ref()) {
        if u.target_image.is_some() {
            let top = o
                .claims
                .iter()
                .copied()
                .chain([relay.spec.replicas, u.replicas.unwrap_or(0)])
                .max()
                .unwrap_or(0);
            for i in 0..=top {
                let name = planner::backup_job_name(relay, i, u);
                if let Some(job) = by_name.get(&name) {
                    o.backups.insert(i, job_obs(job));
                }
            }
        }
    }
    Ok(())
}

/// What the probe Job's pod learned: the store format it wrote to its termination message
/// (`ankusa-relay version --json --write /dev/termination-log`) and the digest its image
/// resolved to (the container's image ID, when it names a repository digest).
async fn probe_result(ctx: &Context, ns: &str, job: &str) -> Result<Probed, ProbeError> {
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let list = pods
        .list(&ListParams::default().labels(&format!("job-name={job}")))
        .await?;
    let container = list
        .items
        .iter()
        .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Succeeded"))
        .flat_map(|p| {
            p.status
                .iter()
                .flat_map(|s| s.container_statuses.iter().flatten())
        })
        .find(|c| c.name == "probe")
        .ok_or(ProbeError::PodGone)?;
    let message = container
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.message.clone())
        .ok_or(ProbeError::NoMessage)?;
    Ok(Probed {
        format: parse_version_json(&message)?,
        digest: repository_digest(&container.image_id),
    })
}

/// The `sha256:…` of a container's image ID when it names a repository digest
/// (`docker-pullable://repo@sha256:…`, `repo@sha256:…`); a bare image ID (`sha256:…` of the
/// local image) names no pullable image and gives `None`.
pub fn repository_digest(image_id: &str) -> Option<String> {
    let (_, digest) = image_id.rsplit_once('@')?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| digest.to_owned())
}

/// `store_format` from `ankusa-relay version --json` output (its last JSON line).
pub fn parse_version_json(log: &str) -> Result<u32, ProbeError> {
    log.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .and_then(|v| v.get("store_format").and_then(Value::as_u64))
        .and_then(|f| u32::try_from(f).ok())
        .ok_or_else(|| ProbeError::NoFormat(truncate(log, 200)))
}

fn job_obs(job: &Job) -> JobObs {
    let status = job.status.clone().unwrap_or_default();
    if status.succeeded.unwrap_or(0) > 0 {
        return JobObs::Succeeded;
    }
    let failed = status
        .conditions
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.type_ == "Failed" && c.status == "True");
    match failed {
        Some(c) => JobObs::Failed(c.message.or(c.reason).unwrap_or_else(|| "failed".into())),
        None => JobObs::Running,
    }
}

async fn create_job(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    job: &JobAction,
) -> Result<(), Error> {
    let name = job.name(relay);
    let obj = match job {
        JobAction::Probe { image } => resources::probe_job(relay, &name, image)?,
        JobAction::Backup {
            ordinal, target, ..
        } => {
            let url = ctx
                .nodes
                .url(&names.pod(*ordinal), &names.headless, &names.namespace);
            resources::backup_job(
                relay,
                &name,
                *ordinal,
                target,
                resources::BackupSource::Node(&url),
            )?
        }
        JobAction::OfflineBackup {
            ordinal, target, ..
        } => resources::backup_job(
            relay,
            &name,
            *ordinal,
            target,
            resources::BackupSource::Claim,
        )?,
    };
    let api: Api<Job> = Api::namespaced(ctx.client.clone(), &names.namespace);
    ssa(&api, &name, &obj, DryRun::No).await?;
    ctx.metrics.applied("Job", "create");
    Ok(())
}

fn to_json<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

async fn get_json<K>(client: &Client, ns: &str, name: &str) -> Result<Option<Value>, Error>
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug,
{
    let api: Api<K> = Api::namespaced(client.clone(), ns);
    Ok(api.get_opt(name).await?.as_ref().map(to_json))
}

/// `monitoring.coreos.com/v1` serves `servicemonitors`.
pub async fn service_monitor_served(client: &Client) -> Result<bool, Error> {
    match client
        .list_api_group_resources("monitoring.coreos.com/v1")
        .await
    {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == "servicemonitors")),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

fn sts_obs(s: &StatefulSet) -> StsObs {
    let spec = s.spec.clone().unwrap_or_default();
    let status = s.status.clone().unwrap_or_default();
    StsObs {
        image: spec
            .template
            .spec
            .as_ref()
            .and_then(|p| p.containers.iter().find(|c| c.name == "relay"))
            .and_then(|c| c.image.clone())
            .unwrap_or_default(),
        partition: spec
            .update_strategy
            .and_then(|u| u.rolling_update)
            .and_then(|r| r.partition)
            .unwrap_or(0),
        ready_replicas: status.ready_replicas.unwrap_or(0),
        updated_replicas: status.updated_replicas.unwrap_or(0),
    }
}

/// Waiting reasons of a container that will not run without a change (a new image, a
/// fixed Secret or ConfigMap): on the upgrade's current pod they fail the upgrade at once.
const FAILING_REASONS: &[&str] = &[
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

fn pod_obs(p: &Pod, sts: &str) -> Option<PodObs> {
    let name = p.name_any();
    let ordinal = name.strip_prefix(sts)?.strip_prefix('-')?.parse().ok()?;
    let spec = p.spec.as_ref()?;
    let image = spec
        .containers
        .iter()
        .find(|c| c.name == "relay")
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    let status = p.status.clone().unwrap_or_default();
    let ready = p.metadata.deletion_timestamp.is_none()
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True");
    let relay_status = status
        .container_statuses
        .clone()
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.name == "relay");
    let waiting = relay_status
        .as_ref()
        .and_then(|c| c.state.as_ref()?.waiting.clone());
    let failing = waiting.as_ref().and_then(|w| {
        let reason = w.reason.clone()?;
        FAILING_REASONS
            .contains(&reason.as_str())
            .then(|| match &w.message {
                Some(m) if !m.is_empty() => format!("{reason}: {}", truncate(m, 200)),
                _ => reason,
            })
    });
    // Not failing, not Ready: unschedulable, or a container still being created.
    let unscheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False")
        .map(|c| {
            format!(
                "{}: {}",
                c.reason.clone().unwrap_or_else(|| "Unschedulable".into()),
                truncate(c.message.as_deref().unwrap_or(""), 200)
            )
        });
    let waiting = unscheduled.or_else(|| waiting.and_then(|w| w.reason));
    Some(PodObs {
        name,
        ordinal,
        image,
        ready,
        failing,
        waiting,
    })
}

/// Whether a server-side apply is only asked about (`dryRun=All`) or made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DryRun {
    Yes,
    No,
}

/// Server-side apply of the desired object of `kind` (forced, under [`FIELD_MANAGER`]):
/// the object as the API server answered, or `None` when there is no such desired object.
async fn patch_owned(
    ctx: &Context,
    names: &Names,
    desired: &DesiredSet,
    kind: Owned,
    dry_run: DryRun,
) -> Result<Option<Value>, Error> {
    let (client, ns, name) = (
        ctx.client.clone(),
        names.namespace.as_str(),
        names.of_kind(kind),
    );
    let answer = match kind {
        Owned::ConfigMap => {
            let api: Api<ConfigMap> = Api::namespaced(client, ns);
            ssa(&api, name, &desired.config_map, dry_run).await?
        }
        Owned::HeadlessService => {
            let api: Api<Service> = Api::namespaced(client, ns);
            ssa(&api, name, &desired.headless, dry_run).await?
        }
        Owned::ClientService => {
            let api: Api<Service> = Api::namespaced(client, ns);
            ssa(&api, name, &desired.client, dry_run).await?
        }
        Owned::StatefulSet => {
            let api: Api<StatefulSet> = Api::namespaced(client, ns);
            ssa(&api, name, &desired.statefulset, dry_run).await?
        }
        Owned::PodDisruptionBudget => {
            let api: Api<PodDisruptionBudget> = Api::namespaced(client, ns);
            ssa(&api, name, &desired.pdb, dry_run).await?
        }
        Owned::ServiceMonitor => {
            let Some(sm) = &desired.service_monitor else {
                return Ok(None);
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(client, ns, &resources::service_monitor_resource());
            ssa(&api, name, sm, dry_run).await?
        }
    };
    Ok(Some(answer))
}

async fn ssa<K>(api: &Api<K>, name: &str, obj: &K, dry_run: DryRun) -> Result<Value, Error>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut params = PatchParams::apply(FIELD_MANAGER).force();
    params.dry_run = dry_run == DryRun::Yes;
    let answer = api.patch(name, &params, &Patch::Apply(obj)).await?;
    Ok(to_json(&answer))
}

/// Carry out one change of an owned object, with the Event, metric and log line that go
/// with it.
async fn apply_owned(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    desired: &DesiredSet,
    kind: Owned,
    change: Change,
) -> Result<(), Error> {
    let name = names.of_kind(kind);
    if change == Change::Delete {
        // Only a ServiceMonitor is ever deleted (monitoring turned off).
        let api: Api<DynamicObject> = Api::namespaced_with(
            ctx.client.clone(),
            &names.namespace,
            &resources::service_monitor_resource(),
        );
        match api.delete(name, &Default::default()).await {
            Ok(_) => {}
            Err(kube::Error::Api(e)) if e.code == 404 => return Ok(()),
            Err(e) => return Err(e.into()),
        }
    } else if patch_owned(ctx, names, desired, kind, DryRun::No)
        .await?
        .is_none()
    {
        return Ok(());
    }
    record(ctx, relay, kind.kind(), name, change).await;
    Ok(())
}

/// Server-side apply of `obj` under [`FIELD_MANAGER`], forced, then the Event, metric and
/// log line that go with every object the operator creates or changes.
async fn apply<K>(
    ctx: &Context,
    relay: &Relay,
    api: &Api<K>,
    kind: &str,
    name: &str,
    obj: &K,
    change: Change,
) -> Result<(), Error>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    ssa(api, name, obj, DryRun::No).await?;
    record(ctx, relay, kind, name, change).await;
    Ok(())
}

/// The Event, metric and log line of a change the operator made.
async fn record(ctx: &Context, relay: &Relay, kind: &str, name: &str, change: Change) {
    let reason = match change {
        Change::Create => "Created",
        Change::Update => "Updated",
        Change::Delete => "Deleted",
    };
    event(ctx, relay, reason, &format!("{kind}/{name}")).await;
    ctx.metrics.applied(kind, change_word(change));
    tracing::info!(relay = %relay.name_any(), object = %format!("{kind}/{name}"), change = change_word(change), "applied");
}

/// A Normal Event on the `Relay` naming the object it is about (`Kind/name`, the
/// Event's related object, so Events about different objects are not merged into one
/// series). An Event that cannot be written is logged, not fatal.
async fn event(ctx: &Context, relay: &Relay, reason: &str, object: &str) {
    let (kind, name) = object.split_once('/').unwrap_or(("", object));
    let related = k8s_openapi::api::core::v1::ObjectReference {
        kind: Some(kind.to_owned()),
        name: Some(name.to_owned()),
        namespace: relay.namespace(),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: reason.into(),
        note: Some(format!("{reason} {object}")),
        action: "Apply".into(),
        secondary: Some(related),
    };
    if let Err(e) = ctx.recorder.publish(&ev, &relay.object_ref(&())).await {
        tracing::warn!(error = %e, "cannot write an Event");
    }
}

/// The Event of a step of the upgrade gate (a Warning for a failure).
async fn event_with(ctx: &Context, relay: &Relay, e: &planner::StepEvent) {
    let ev = Event {
        type_: if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: e.reason.into(),
        note: Some(truncate(&e.message, 1000)),
        action: "Upgrade".into(),
        secondary: None,
    };
    tracing::info!(relay = %relay.name_any(), reason = e.reason, message = %e.message, "upgrade step");
    if let Err(err) = ctx.recorder.publish(&ev, &relay.object_ref(&())).await {
        tracing::warn!(error = %err, "cannot write an Event");
    }
}
