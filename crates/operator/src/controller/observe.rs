//! Observing what exists for a `Relay`: its StatefulSet, pods, owned objects, Jobs and
//! their answers, whether the ServiceMonitor and HTTPRoute APIs are served, and the user's
//! configuration.

use std::collections::BTreeMap;

use ankusa_crds::relay::Relay;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, ListParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::Value;

use super::{truncate, Context, Error, Probed, PROBED_MAX};
use crate::names::Names;
use crate::observed::{ForeignObject, JobObs, Observed, Owned, PodObs, ProbeObs, StsObs};
use crate::resources;

use super::apply::to_json;

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
pub(super) async fn user_config(
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

pub(super) async fn observe(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    token: &str,
    o: &mut Observed,
) -> Result<(), Error> {
    let client = &ctx.client;
    let ns = names.namespace.as_str();

    let uid = relay.metadata.uid.clone();
    let uid = uid.as_deref();
    let sts_api: Api<StatefulSet> = Api::namespaced(client.clone(), ns);
    let sts = sts_api.get_opt(&names.statefulset).await?;
    o.objects.statefulset = mine(o, uid, Owned::StatefulSet, names, sts.as_ref().map(to_json));
    o.statefulset = sts
        .as_ref()
        .filter(|_| o.objects.statefulset.is_some())
        .map(sts_obs);
    let cm = get_json::<ConfigMap>(client, ns, &names.config_map).await?;
    o.objects.config_map = mine(o, uid, Owned::ConfigMap, names, cm);
    let headless = get_json::<Service>(client, ns, &names.headless).await?;
    o.objects.headless = mine(o, uid, Owned::HeadlessService, names, headless);
    let svc = get_json::<Service>(client, ns, &names.client).await?;
    o.objects.client = mine(o, uid, Owned::ClientService, names, svc);
    let pdb = get_json::<PodDisruptionBudget>(client, ns, &names.pdb).await?;
    o.objects.pdb = mine(o, uid, Owned::PodDisruptionBudget, names, pdb);
    let ingest = get_json::<Service>(client, ns, &names.ingest).await?;
    o.objects.ingest_service = mine(o, uid, Owned::IngestService, names, ingest);

    observe_optional(relay, client, ns, names, o).await?;

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
    let data = claims
        .list(&ListParams::default().labels(&selector))
        .await?;
    o.data_claims = data
        .items
        .iter()
        .filter(|c| c.metadata.deletion_timestamp.is_none())
        .filter(|c| names.claim_ordinal(&c.name_any()).is_some())
        .map(|c| {
            let spec = c.spec.as_ref();
            crate::observed::DataClaim {
                name: c.name_any(),
                class: spec.and_then(|s| s.storage_class_name.clone()),
                requested: spec
                    .and_then(|s| s.resources.as_ref())
                    .and_then(|r| r.requests.as_ref())
                    .and_then(|r| r.get("storage"))
                    .map(|q| q.0.clone()),
                bound: c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"),
            }
        })
        .collect();
    o.claims = o
        .data_claims
        .iter()
        .filter_map(|c| names.claim_ordinal(&c.name))
        .collect();
    o.claims.sort_unstable();
    observe_backup_claims(relay, &claims, names, o).await?;

    // The claim a restore reads (a bootstrap's may be another than the backup
    // destination).
    // Read while a restore runs or may begin: not for ever after a bootstrap or a
    // rollback that completed.
    let last = relay.status.as_ref().and_then(|s| s.restore.as_ref());
    let restoring = last.is_some_and(crate::restore::in_progress)
        || relay.spec.bootstrap.is_some() && last.is_none()
        || relay.spec.upgrade.rollback_to.is_some()
            && last.is_none_or(|r| r.reason != crate::restore::ROLLBACK)
        || relay.spec.restore_node.as_ref().is_some_and(|rn| {
            last.is_none_or(|r| r.request.as_deref() != Some(rn.request.as_str()))
        });
    if let Some(source) = crate::restore::source(relay).filter(|_| restoring) {
        let next = relay
            .status
            .as_ref()
            .and_then(|s| s.restore.as_ref())
            .filter(|r| crate::restore::in_progress(r))
            .map_or(0, |r| r.node.unwrap_or(r.restored));
        // From a bucket no claim is read.
        if let Some(claim) = source.claim(next) {
            let found = claims
                .list(&ListParams::default().fields(&format!("metadata.name={claim}")))
                .await?;
            o.restore_claim = Some((claim, !found.items.is_empty()));
        }
    }

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
    observe_create_failures(client, ns, names, o).await?;
    o.refusals = super::claim::observe_refusals(ctx, relay, &o.now).await?;
    Ok(())
}

/// How recent a `FailedCreate` Event must be to count: the controllers repeat it (as a
/// series) while the failure lasts.
const CREATE_FAILURE_WINDOW_S: i64 = 600;

/// Why the StatefulSet's missing pods, or the Relay's unfinished Jobs' pods, could not be
/// created (a PriorityClass that does not exist, a ResourceQuota, Pod Security): the
/// controllers say so only in `FailedCreate` Events on the StatefulSet or the Job, read
/// here (only while a pod is missing or a Job runs) into `o.create_failures`, newest first,
/// one per object.
async fn observe_create_failures(
    client: &Client,
    ns: &str,
    names: &Names,
    o: &mut Observed,
) -> Result<(), Error> {
    let pods_missing = o
        .statefulset
        .as_ref()
        .is_some_and(|s| (o.pods.len() as i32) < s.replicas);
    let running = |j: &JobObs| *j == JobObs::Running;
    let jobs_running = o.backups.values().any(running)
        || o.restores.values().any(running)
        || o.scheduled.values().any(running)
        || o.probes.values().any(|p| *p == ProbeObs::Running);
    if !pods_missing && !jobs_running {
        return Ok(());
    }
    let api: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), ns);
    let events = api
        .list(&ListParams::default().fields("reason=FailedCreate"))
        .await?;
    let mut found: BTreeMap<String, (String, String)> = BTreeMap::new();
    let job_prefix = format!("{}-", names.relay);
    for e in events.items {
        let (kind, name) = (
            e.involved_object.kind.clone().unwrap_or_default(),
            e.involved_object.name.clone().unwrap_or_default(),
        );
        let ours = match kind.as_str() {
            "StatefulSet" => pods_missing && name == names.statefulset,
            "Job" => jobs_running && name.starts_with(&job_prefix),
            _ => false,
        };
        let at = e
            .last_timestamp
            .as_ref()
            .map(|t| t.0.to_string())
            .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
            .unwrap_or_default();
        let recent =
            crate::observed::elapsed_s(&at, &o.now).is_some_and(|s| s <= CREATE_FAILURE_WINDOW_S);
        if !ours || !recent {
            continue;
        }
        let object = format!("{kind} {name}");
        let message = truncate(e.message.as_deref().unwrap_or(""), 300);
        if found.get(&object).is_none_or(|(t, _)| *t < at) {
            found.insert(object, (at, message));
        }
    }
    let mut failures: Vec<(String, String)> = found
        .into_iter()
        .map(|(object, (at, message))| (at, format!("{object}: {message}")))
        .collect();
    failures.sort_by(|a, b| b.0.cmp(&a.0));
    o.create_failures = failures.into_iter().map(|(_, m)| m).collect();
    Ok(())
}

/// The live object `v` of `kind` at this Relay's name for it, when the Relay owns it (its
/// controller reference); one that is not its is noted in `o.foreign` and read as absent.
fn mine(
    o: &mut Observed,
    uid: Option<&str>,
    kind: Owned,
    names: &Names,
    v: Option<Value>,
) -> Option<Value> {
    let v = v?;
    let object = format!("{}/{}", kind.kind(), names.of_kind(kind));
    match ForeignObject::of(Some(kind), object, &v, uid) {
        None => Some(v),
        Some(f) => {
            o.foreign.push(f);
            None
        }
    }
}

/// The optional objects, read whether or not the spec asks for them: one left from when it
/// did is deleted. One of that name that this Relay does not own is noted (it matters only
/// when the spec asks for that kind).
async fn observe_optional(
    relay: &Relay,
    client: &kube::Client,
    ns: &str,
    names: &Names,
    o: &mut Observed,
) -> Result<(), Error> {
    let uid = relay.metadata.uid.clone();
    let uid = uid.as_deref();
    o.service_monitor_api =
        api_served(client, "monitoring.coreos.com/v1", "servicemonitors").await?;
    if o.service_monitor_api {
        let sm = get_dynamic(
            client,
            ns,
            &resources::service_monitor_resource(),
            &names.service_monitor,
        )
        .await?;
        o.objects.service_monitor = mine(o, uid, Owned::ServiceMonitor, names, sm);
    }
    o.http_route_api = api_served(client, "gateway.networking.k8s.io/v1", "httproutes").await?;
    if o.http_route_api {
        let route =
            get_dynamic(client, ns, &resources::http_route_resource(), &names.ingest).await?;
        o.objects.http_route = mine(o, uid, Owned::HttpRoute, names, route);
    }
    let ingress = get_json::<Ingress>(client, ns, &names.ingest).await?;
    o.objects.ingress = mine(o, uid, Owned::Ingress, names, ingress);
    let policy = get_json::<NetworkPolicy>(client, ns, &names.network_policy).await?;
    o.objects.network_policy = mine(o, uid, Owned::NetworkPolicy, names, policy);
    Ok(())
}

/// The backup destination's claims: a list by name (the operator may list claims, not get
/// them), or the claims per node by their label.
async fn observe_backup_claims(
    relay: &Relay,
    claims: &Api<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
    names: &Names,
    o: &mut Observed,
) -> Result<(), Error> {
    let capacity = |c: &k8s_openapi::api::core::v1::PersistentVolumeClaim| {
        c.status
            .as_ref()
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .and_then(|q| resources::quantity_bytes(&q.0))
    };
    if let Some((_, destination)) = relay.spec.claim_backup() {
        match destination.shared() {
            Some(name) => {
                let found = claims
                    .list(&ListParams::default().fields(&format!("metadata.name={name}")))
                    .await?;
                o.backup_claim = Some(match found.items.first() {
                    None => crate::observed::BackupClaimObs::Missing,
                    Some(c) => crate::observed::BackupClaimObs::Present {
                        capacity_bytes: capacity(c),
                    },
                });
            }
            None => {
                let found = claims
                    .list(&ListParams::default().labels(&format!(
                        "app.kubernetes.io/name={},app.kubernetes.io/instance={}",
                        resources::BACKUP_CLAIM_APP_NAME,
                        names.relay
                    )))
                    .await?;
                for c in &found.items {
                    let ordinal = c
                        .name_any()
                        .strip_prefix(&format!("{}-backups-", names.relay))
                        .and_then(|i| i.parse::<i32>().ok());
                    if let Some(i) = ordinal {
                        o.node_backup_claims.insert(
                            i,
                            crate::observed::BackupClaimObs::Present {
                                capacity_bytes: capacity(c),
                            },
                        );
                    }
                }
            }
        }
    }
    Ok(())
}

pub(super) async fn observe_jobs(
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
    let name = crate::plan::probe_job_name(relay, &image);
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
    // Restore Jobs of the restore under way, by the ordinal they restore.
    if let Some(r) = relay
        .status
        .as_ref()
        .and_then(|s| s.restore.as_ref())
        .filter(|r| crate::restore::in_progress(r))
    {
        for i in 0..r.replicas {
            if let Some(job) = by_name.get(&crate::restore::job_name(relay, i, r)) {
                o.restores.insert(i, job_obs(job));
            }
        }
        // A node restore's Job reports what it found in its termination message.
        if let Some(i) = r.node.filter(|_| r.reason == crate::restore::NODE) {
            if o.restores.get(&i) == Some(&JobObs::Succeeded) {
                let job = crate::restore::job_name(relay, i, r);
                match finished_container(ctx, &names.namespace, &job, "restore").await {
                    Ok((message, _)) => {
                        o.restore_report = serde_json::from_str(message.trim()).ok()
                    }
                    Err(e) => tracing::debug!(job, error = %e, "the restore Job's report"),
                }
            }
        }
    }
    // Backup Jobs of the scheduled run under way, by the ordinal they back up.
    if let Some(run) = relay
        .status
        .as_ref()
        .and_then(|s| s.scheduled_backups.as_ref())
        .filter(|b| b.running)
        .and_then(|b| b.run.as_deref())
    {
        for i in 0..relay.spec.replicas.max(0) {
            if let Some(job) = by_name.get(&crate::backups::job_name(relay, i, run)) {
                o.scheduled.insert(i, job_obs(job));
            }
        }
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
                let name = crate::plan::backup_job_name(relay, i, u);
                if let Some(job) = by_name.get(&name) {
                    o.backups.insert(i, job_obs(job));
                }
            }
        }
    }
    observe_claim_rooms(relay, ctx, &names.namespace, &jobs.items, o).await;
    Ok(())
}

/// Each backup claim's room and each node's archives there: what `status.backupClaims`
/// and `status.claimArchives` recorded, and for a node whose newest succeeded backup Job
/// finished since, what that Job reported (its termination message; read once: a Job of a
/// release that writes none is recorded without a room or archives, and the claim's
/// capacity is checked instead). Nodes and claims no backup of the spec writes any more
/// are dropped.
async fn observe_claim_rooms(
    relay: &Relay,
    ctx: &Context,
    ns: &str,
    jobs: &[Job],
    o: &mut Observed,
) {
    use ankusa_crds::status::{BackupClaimRoom, NodeArchives};
    let Ok(names) = Names::of(relay) else { return };
    let ordinals: std::collections::BTreeSet<i32> = (0..relay.spec.replicas.max(0))
        .chain(o.claims.iter().copied())
        .collect();
    let claim_of = |i: i32| resources::backup_claim(relay, i).ok();
    let in_use: std::collections::BTreeSet<String> =
        ordinals.iter().filter_map(|&i| claim_of(i)).collect();
    let status = relay.status.clone().unwrap_or_default();
    o.backup_claim_rooms = status
        .backup_claims
        .into_iter()
        .filter(|r| in_use.contains(&r.name))
        .map(|r| (r.name.clone(), r))
        .collect();
    o.claim_archives = status
        .claim_archives
        .into_iter()
        .filter(|a| ordinals.iter().any(|&i| names.pod(i) == a.name))
        .map(|a| (a.name.clone(), a))
        .collect();
    // The newest succeeded backup Job of each node.
    let mut newest: BTreeMap<i32, (&Job, String)> = BTreeMap::new();
    for job in jobs {
        let label = |k: &str| job.labels().get(k).cloned();
        let is_backup = label(resources::JOB_LABEL).as_deref() == Some(resources::BACKUP_JOB);
        let ordinal = label("ankusa.dev/ordinal").and_then(|v| v.parse::<i32>().ok());
        let finished = job
            .status
            .as_ref()
            .and_then(|s| s.completion_time.as_ref())
            .map(|t| t.0.to_string());
        let (true, Some(i), Some(finished), JobObs::Succeeded) =
            (is_backup, ordinal, finished, job_obs(job))
        else {
            continue;
        };
        if !ordinals.contains(&i) {
            continue;
        }
        if newest.get(&i).is_none_or(|(_, at)| *at < finished) {
            newest.insert(i, (job, finished));
        }
    }
    for (i, (job, finished)) in newest {
        let name = job.name_any();
        let pod = names.pod(i);
        let seen = o.claim_archives.get(&pod).is_some_and(|a| {
            a.job == name || a.at.as_deref().is_some_and(|at| at >= finished.as_str())
        });
        if seen {
            continue;
        }
        let report: Option<ankusa_api::node::BackupRunReport> =
            match finished_container(ctx, ns, &name, resources::BACKUP_JOB).await {
                Ok((message, _)) => serde_json::from_str(message.trim()).ok(),
                Err(e) => {
                    tracing::debug!(job = %name, error = %e, "the backup Job's report");
                    None
                }
            };
        let report = report.unwrap_or_default();
        o.claim_archives.insert(
            pod.clone(),
            NodeArchives {
                name: pod,
                formats: report.formats,
                job: name.clone(),
                at: Some(finished.clone()),
            },
        );
        // The claim's room is what its newest Job left.
        let claim = backup_claim_of(job).or_else(|| claim_of(i));
        let Some(claim) = claim.filter(|c| in_use.contains(c)) else {
            continue;
        };
        let newer = o
            .backup_claim_rooms
            .get(&claim)
            .is_none_or(|r| r.at.as_deref().is_none_or(|at| at < finished.as_str()));
        if newer {
            o.backup_claim_rooms.insert(
                claim.clone(),
                BackupClaimRoom {
                    name: claim,
                    free_bytes: report.volume_free_bytes,
                    size_bytes: report.volume_bytes,
                    job: name,
                    at: Some(finished),
                },
            );
        }
    }
}

/// The claim a backup Job writes to: its `backups` volume's.
fn backup_claim_of(job: &Job) -> Option<String> {
    job.spec
        .as_ref()?
        .template
        .spec
        .as_ref()?
        .volumes
        .iter()
        .flatten()
        .find(|v| v.name == "backups")?
        .persistent_volume_claim
        .as_ref()
        .map(|c| c.claim_name.clone())
}

/// What the probe Job's pod learned: the store format it wrote to its termination message
/// (`ankusa-relay version --json --write /dev/termination-log`) and the digest its image
/// resolved to (the container's image ID, when it names a repository digest).
pub(super) async fn probe_result(ctx: &Context, ns: &str, job: &str) -> Result<Probed, ProbeError> {
    let (message, image_id) = finished_container(ctx, ns, job, "probe").await?;
    Ok(Probed {
        format: parse_version_json(&message)?,
        digest: repository_digest(&image_id),
    })
}

/// Container `container` of a Succeeded pod of Job `job`: its termination message and its
/// image ID.
async fn finished_container(
    ctx: &Context,
    ns: &str,
    job: &str,
    container: &str,
) -> Result<(String, String), ProbeError> {
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
        .find(|c| c.name == container)
        .ok_or(ProbeError::PodGone)?;
    let message = container
        .state
        .as_ref()
        .and_then(|s| s.terminated.as_ref())
        .and_then(|t| t.message.clone())
        .ok_or(ProbeError::NoMessage)?;
    Ok((message, container.image_id.clone()))
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
        .find_map(|l| serde_json::from_str::<ankusa_api::node::Version>(l.trim()).ok())
        .map(|v| v.store_format)
        .ok_or_else(|| ProbeError::NoFormat(truncate(log, 200)))
}

pub(super) fn job_obs(job: &Job) -> JobObs {
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

pub(super) async fn get_json<K>(
    client: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<Value>, Error>
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

/// `group_version` (e.g. `monitoring.coreos.com/v1`) serves `resource`.
pub async fn api_served(
    client: &Client,
    group_version: &str,
    resource: &str,
) -> Result<bool, Error> {
    match client.list_api_group_resources(group_version).await {
        Ok(list) => Ok(list.resources.iter().any(|r| r.name == resource)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The object `name` of the dynamic resource `ar`, as JSON.
async fn get_dynamic(
    client: &Client,
    ns: &str,
    ar: &kube::api::ApiResource,
    name: &str,
) -> Result<Option<Value>, Error> {
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, ar);
    Ok(api.get_opt(name).await?.as_ref().map(to_json))
}

pub(super) fn sts_obs(s: &StatefulSet) -> StsObs {
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
        replicas: spec.replicas.unwrap_or(1),
    }
}

/// Waiting reasons of a container that will not run without a change (a new image, a
/// fixed Secret or ConfigMap): on the upgrade's current pod they fail the upgrade at once.
pub(super) const FAILING_REASONS: &[&str] = &[
    "CrashLoopBackOff",
    "ImagePullBackOff",
    "ErrImagePull",
    "ErrImageNeverPull",
    "InvalidImageName",
    "CreateContainerConfigError",
    "CreateContainerError",
    "RunContainerError",
];

pub(super) fn pod_obs(p: &Pod, sts: &str) -> Option<PodObs> {
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
    let scheduled = status
        .conditions
        .iter()
        .flatten()
        .find(|c| c.type_ == "PodScheduled" && c.status == "False");
    let unschedulable_since = scheduled
        .filter(|c| c.reason.as_deref() == Some("Unschedulable"))
        .and_then(|c| c.last_transition_time.as_ref())
        .map(|t| t.0.to_string());
    let unscheduled = scheduled.map(|c| {
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
        unschedulable_since,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn storage_quantities_read_as_bytes() {
        use crate::resources::quantity_bytes as q;
        assert_eq!(q("10Gi"), Some(10 << 30));
        assert_eq!(q("500M"), Some(500_000_000));
        assert_eq!(q("1073741824"), Some(1 << 30));
        assert_eq!(q("1.5Gi"), None);
        assert_eq!(q("100m"), None);
    }
}
