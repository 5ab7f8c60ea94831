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

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ankusa_crds::relay::Relay;
use ankusa_crds::status::RelayStatus;
use futures::StreamExt;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::{predicates, reflector, watcher, WatchStreamExt};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use crate::metrics::Metrics;
use crate::names::{Names, ResourceError};
use crate::nodes::NodeClient;
use crate::observed::{ForeignObject, Observed};
use crate::planner::{self, Change};
use crate::resources::{self, DesiredSet};
use crate::status;

pub mod apply;
pub mod claim;
pub mod events;
pub mod expand;
pub mod observe;

use apply::{apply, apply_desired, create_claims, create_job, now_rfc3339, write_status};
use events::{event_with, fault_event};
use observe::{observe, user_config};

/// The field manager of the Relays' status, and of every server-side apply of the
/// releases before field managers per Relay ([`field_manager`]); the Events' reporter.
pub const FIELD_MANAGER: &str = "ankusa-operator";

/// The field manager of every server-side apply made for Relay `relay`:
/// `ankusa-operator/<relay>`. One per Relay, so what one Relay applies is never taken for
/// another's in an object's managed fields.
pub fn field_manager(relay: &str) -> String {
    format!("{FIELD_MANAGER}/{relay}")
}

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

/// How soon a Relay whose scale-down drains is looked at again (the poll, if shorter).
const DRAIN_POLL: Duration = Duration::from_secs(5);

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
    /// Who the operator is, for the NetworkPolicies that admit it to the nodes' admin port.
    pub operator: resources::OperatorPeer,
    /// This install (its leader election Lease), which the Relays it manages name in
    /// `status.operator`; `None` without leader election: every Relay is this one's.
    pub install: Option<claim::Install>,
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
            operator: resources::OperatorPeer::default(),
            install: None,
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
    /// The faults each `Relay` reported at its last reconcile (a Warning Event goes out when
    /// one is new); a deleted Relay's entry goes with it.
    reported: Mutex<HashMap<(String, String), BTreeSet<&'static str>>>,
    /// Other installs' Leases, for whether they still renew them ([`claim`]).
    leases: Mutex<claim::LeaseSightings>,
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
            reported: Mutex::new(HashMap::new()),
            leases: Mutex::new(HashMap::new()),
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
    let forget = ctx.clone();
    let relay_changes = watcher(relays, watcher::Config::default())
        .map(move |event| {
            // A deleted Relay's series and faults go (the controller does not reconcile it
            // again).
            if let Ok(watcher::Event::Delete(obj)) = &event {
                let key = (obj.namespace().unwrap_or_default(), obj.name_any());
                forget.metrics.forget(&key.0, &key.1);
                forget
                    .reported
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&key);
            }
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

/// One reconcile of one `Relay`, in a `reconcile` span naming it and its generation.
#[tracing::instrument(
    name = "reconcile",
    skip_all,
    fields(
        relay = %relay.name_any(),
        namespace = %relay.namespace().unwrap_or_default(),
        generation = relay.metadata.generation,
    )
)]
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
    if let Some(action) = not_reconciled(relay, ctx, &prev).await? {
        return Ok(action);
    }
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
    let token = ensure_token(relay, ctx, &names, &mut o).await?;

    observe(relay, ctx, &names, &token, &mut o).await?;
    let rollout = planner::rollout(relay, &prev, &o);
    let monitor = planner::monitor_decision(relay, &o);
    let scheduled = crate::backups::decide(relay, &prev, &o);

    if o.config_error.is_none() {
        let mut effective = relay.clone();
        effective.spec.image = rollout.image.clone();
        effective.spec.replicas = rollout.replicas;
        let desired = DesiredSet::build_with(
            &effective,
            user_config.as_ref(),
            rollout.partition,
            &resources::Surroundings {
                service_monitor: monitor == planner::MonitorDecision::Applied,
                http_route_api: o.http_route_api,
                urls: resources::NodeUrls {
                    admin: ctx.settings.node_url_template.clone(),
                    ingest: ctx.settings.node_ingest_url_template.clone(),
                },
                operator: ctx.settings.operator.clone(),
                // Only nodes that know `leaving` are told who leaves (an older release
                // refuses a node list that marks one).
                owners: crate::drain::handoff_capable(&o).then_some(relay.spec.replicas),
            },
        );
        // Of the objects at this Relay's names that are not its, those of the kinds it
        // wants hold it: nothing is applied, no Job or claim made, while one is there.
        if let Ok(d) = &desired {
            o.foreign
                .retain(|f| f.kind.is_none_or(|k| d.value(k).is_some()));
        }
        match desired {
            Ok(_) if !o.foreign.is_empty() => {}
            Ok(mut desired) => {
                let storage =
                    expand::storage(relay, ctx, &names, &mut desired, &o, &rollout).await?;
                o.storage_change = storage.pending;
                // A refused object (a ServiceMonitor the Prometheus Operator rejects, say)
                // is a condition; the rest of the reconcile, the gate's Jobs included,
                // goes on.
                if let Some(pod) = &rollout.stop_pod {
                    apply::stop_one_pod(relay, ctx, &names, &o, pod).await?;
                }
                let refused = apply_desired(
                    relay,
                    ctx,
                    &names,
                    &desired,
                    &mut o,
                    rollout.hold_statefulset,
                    rollout.stop_pod.is_some() || storage.recreating,
                )
                .await;
                if !refused.is_empty() {
                    o.apply_error = Some(
                        refused
                            .iter()
                            .map(|(what, e)| format!("{what}: {e}"))
                            .collect::<Vec<_>>()
                            .join("; "),
                    );
                }
                // A bootstrap's data claims, and the backup claims per node missing (of
                // the nodes, and of the claims that outlived a scale-down).
                let mut claims = rollout
                    .claims
                    .iter()
                    .map(|&i| resources::data_claim(relay, i))
                    .collect::<Result<Vec<_>, _>>()?;
                let backed_up = (0..relay.spec.replicas.max(0)).chain(o.claims.iter().copied());
                for i in backed_up.collect::<std::collections::BTreeSet<_>>() {
                    if !o.node_backup_claims.contains_key(&i) {
                        claims.extend(resources::backup_claim_object(relay, i)?);
                    }
                }
                create_claims(relay, ctx, &names, claims).await?;
                for job in rollout.jobs.iter().chain(&scheduled.jobs) {
                    create_job(relay, ctx, &names, job).await?;
                }
            }
            Err(e) => o.config_error = Some(e.to_string()),
        }
    }
    if o.config_error.is_some() {
        o.foreign.retain(|f| f.kind.is_none_or(|k| !k.optional()));
    }
    let (next, faults) =
        write_status(relay, ctx, &prev, &o, &rollout, &monitor, &scheduled).await?;
    for e in planner::upgrade_events(
        relay,
        prev.upgrade.as_ref(),
        next.upgrade.as_ref(),
        &rollout,
    ) {
        event_with(ctx, relay, &e).await;
    }
    ctx.metrics.upgrade(relay, &next);
    warn_new_faults(ctx, relay, &faults, &prev, &next).await;
    if o.apply_error.is_some() {
        // Retried sooner than the poll, with the backoff of a failed reconcile.
        return Ok(Action::requeue(
            ctx.settings.poll_interval.min(Duration::from_secs(10)),
        ));
    }
    // A scheduled run starts at its time, not up to a poll interval later.
    let until_run = next
        .scheduled_backups
        .as_ref()
        .and_then(|b| b.next_run.as_deref())
        .and_then(|t| crate::observed::elapsed_s(&o.now, t))
        .map(|s| Duration::from_secs(s.max(0) as u64 + 1));
    // A node restore stopping its pod looks again soon: the pod's end is not watched. A
    // drain's progress is only in the nodes' answers: a scale-down shrinks (and `Draining`
    // counts down) within seconds of the leaving nodes emptying, not a poll later.
    let until_run = match (&rollout.stop_pod, &rollout.hold) {
        (Some(_), _) => Some(Duration::from_secs(2)),
        (None, Some(h)) if crate::drain::is_drain_hold(h) => {
            Some(until_run.map_or(DRAIN_POLL, |d| d.min(DRAIN_POLL)))
        }
        _ => until_run,
    };
    Ok(Action::requeue(
        until_run.map_or(ctx.settings.poll_interval, |d| {
            d.min(ctx.settings.poll_interval)
        }),
    ))
}

/// The Warning Events of the faults new since the Relay's last reconcile, of a scheduled
/// backup that failed, of object store pushes gone bad ([`planner::fault_events`]).
async fn warn_new_faults(
    ctx: &Context,
    relay: &Relay,
    faults: &status::Faults,
    prev: &RelayStatus,
    next: &RelayStatus,
) {
    let key = (relay.namespace().unwrap_or_default(), relay.name_any());
    let reported = ctx
        .reported
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(key, faults.iter().map(|(reason, _)| *reason).collect())
        .unwrap_or_default();
    for e in planner::fault_events(&reported, faults, prev, next) {
        fault_event(ctx, relay, &e).await;
    }
}

/// A Relay this reconcile leaves as it is: paused by its annotation, or managed by another
/// operator install.
async fn not_reconciled(
    relay: &Relay,
    ctx: &Context,
    prev: &RelayStatus,
) -> Result<Option<Action>, Error> {
    if relay.reconcile_paused() {
        return paused(relay, ctx, prev).await.map(Some);
    }
    match claim::claim(relay, ctx).await? {
        claim::Claim::Refused { holder } => left_to(relay, ctx, &holder).await.map(Some),
        claim::Claim::Mine => Ok(None),
    }
}

/// A Relay another install manages: nothing of it is read or changed; a Warning Event says
/// so (the managing install reports it), and it is looked at again at the next poll (to
/// take it over once that install is gone).
async fn left_to(relay: &Relay, ctx: &Context, holder: &str) -> Result<Action, Error> {
    claim::refuse(ctx, relay, holder).await;
    ctx.metrics.failure("managed_elsewhere");
    Ok(Action::requeue(ctx.settings.poll_interval))
}

/// A Relay whose reconciliation is paused (`ankusa.dev/reconcile: paused`): nothing of it
/// is changed; its status says so (`Reconciling` False, `Paused`, with an Event once).
async fn paused(relay: &Relay, ctx: &Context, prev: &RelayStatus) -> Result<Action, Error> {
    let conditions = status::paused_conditions(relay, prev, &now_rfc3339());
    let was = prev
        .conditions
        .iter()
        .any(|c| c.type_ == "Reconciling" && c.reason == "Paused");
    if !was {
        let api: Api<Relay> =
            Api::namespaced(ctx.client.clone(), &relay.namespace().unwrap_or_default());
        api.patch_status(
            &relay.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&json!({ "status": { "conditions": conditions } })),
        )
        .await?;
        event_with(
            ctx,
            relay,
            &planner::StepEvent {
                warning: false,
                reason: "ReconcilePaused",
                message: "ankusa.dev/reconcile: paused: nothing of this Relay is changed until the annotation is removed".into(),
            },
        )
        .await;
    }
    Ok(Action::requeue(ctx.settings.poll_interval))
}

/// The operator's admin token for this `Relay`, read from its Secret; the Secret (with the
/// backup-scope token and the nodes' cluster token beside it) is made once, and a key
/// missing from an older one added.
///
/// A token Secret at the Relay's name that is not its is neither read nor written: it goes
/// to `o.foreign` (the Relay waits) and the token is empty.
async fn ensure_token(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    o: &mut Observed,
) -> Result<String, Error> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let existing = api.get_opt(&names.token_secret).await?;
    if let Some(f) = existing.as_ref().and_then(|s| {
        ForeignObject::of(
            None,
            format!("Secret/{}", names.token_secret),
            &apply::to_json(s),
            relay.metadata.uid.as_deref(),
        )
    }) {
        o.foreign.push(f);
        return Ok(String::new());
    }
    let key = |k: &str| {
        existing
            .as_ref()
            .and_then(|s| s.data.as_ref())
            .and_then(|d| d.get(k))
            .map(|t| String::from_utf8_lossy(&t.0).into_owned())
    };
    let (token, backup, metrics, cluster) = (
        key(resources::TOKEN_KEY),
        key(resources::BACKUP_TOKEN_KEY),
        key(resources::METRICS_TOKEN_KEY),
        key(resources::CLUSTER_TOKEN_KEY),
    );
    if let (Some(token), Some(_), Some(_), Some(_)) = (&token, &backup, &metrics, &cluster) {
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
        &metrics.unwrap_or_else(new_token),
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
    ankusa_keyspace::hex(&b)
}
