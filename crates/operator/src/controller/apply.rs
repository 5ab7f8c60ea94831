//! Carrying out the planner's answer: server-side apply of the desired objects under
//! [`super::FIELD_MANAGER`] (drift measured by a dry run), the Jobs it asks for, and the
//! status patch.

use ankusa_crds::relay::Relay;
use ankusa_crds::status::RelayStatus;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service};
use k8s_openapi::api::networking::v1::{Ingress, NetworkPolicy};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::ResourceExt;
use serde_json::{json, Value};

use super::{Context, Error, FIELD_MANAGER};
use crate::names::Names;
use crate::observed::{Observed, Owned};
use crate::plan::JobAction;
use crate::planner::{self, Change};
use crate::resources::{self, DesiredSet};
use crate::status;

use super::events::record;

/// Measure drift against the API server's own answer (a dry-run apply of each existing
/// object), then carry out the planner's changes. Returns what was refused (`StatefulSet
/// update`, say, with the error); one refusal does not stop the other objects.
#[tracing::instrument(
    name = "apply",
    skip_all,
    fields(relay = %relay.name_any(), generation = relay.metadata.generation)
)]
pub(super) async fn apply_desired(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    desired: &DesiredSet,
    o: &mut Observed,
    hold_statefulset: bool,
    leave_statefulset: bool,
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
    let mut changes = planner::changes(desired, &o.objects);
    // An object the shared field manager of earlier releases still applies is applied once
    // under the Relay's own, which lets the shared one go (no Event: nothing changes).
    for kind in Owned::ALL {
        let live = o.objects.get(kind);
        if live.is_some_and(legacy_applier)
            && desired.value(kind).is_some()
            && !changes.iter().any(|(k, _)| *k == kind)
            && !dry_refused.contains(&kind)
            && !(kind == Owned::StatefulSet && (leave_statefulset || hold_statefulset))
        {
            if let Err(e) = patch_owned(ctx, names, desired, kind, DryRun::No).await {
                refused.push((format!("{} update", kind.kind()), e));
            }
        }
    }
    changes.retain(|(kind, _)| !dry_refused.contains(kind));
    for (kind, change) in changes {
        // A bootstrap restores the nodes' claims before any pod may start on them.
        if kind == Owned::StatefulSet
            && (leave_statefulset || hold_statefulset && change == Change::Create)
        {
            continue;
        }
        if let Err(e) = apply_owned(relay, ctx, names, desired, kind, change).await {
            ctx.metrics.failure(e.reason());
            refused.push((format!("{} {}", kind.kind(), change_word(change)), e));
        }
    }
    refused
}

pub(super) fn change_word(c: Change) -> &'static str {
    match c {
        Change::Create => "create",
        Change::Update => "update",
        Change::Delete => "delete",
    }
}

#[tracing::instrument(
    name = "status",
    skip_all,
    fields(relay = %relay.name_any(), generation = relay.metadata.generation)
)]
pub(super) async fn write_status(
    relay: &Relay,
    ctx: &Context,
    prev: &RelayStatus,
    o: &Observed,
    rollout: &crate::plan::Rollout,
    monitor: &planner::MonitorDecision,
    scheduled: &crate::backups::Decision,
) -> Result<(RelayStatus, status::Faults), Error> {
    let (mut next, faults) = status::status(relay, prev, o, rollout, monitor, scheduled);
    // This install claimed the Relay before it reconciled it (`claim`): the status read
    // before may name no install, or one that is gone.
    if let Some(me) = &ctx.settings.install {
        next.operator = Some(me.id());
    }
    if relay.status.as_ref() == Some(&next) {
        return Ok((next, faults));
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
    Ok((next, faults))
}

pub(super) fn now_rfc3339() -> String {
    k8s_openapi::jiff::Timestamp::now()
        .round(k8s_openapi::jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

#[tracing::instrument(
    name = "job",
    skip_all,
    fields(relay = %relay.name_any(), generation = relay.metadata.generation, job = %job.name(relay))
)]
pub(super) async fn create_job(
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
        JobAction::Restore {
            ordinal,
            image,
            format,
            archive,
            report,
            ..
        } => resources::restore_job(
            relay,
            &name,
            *ordinal,
            image,
            *format,
            archive.as_deref(),
            *report,
        )?,
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
    ssa(
        &api,
        &super::field_manager(&names.relay),
        &name,
        &obj,
        DryRun::No,
    )
    .await?;
    ctx.metrics.applied("Job", "create");
    Ok(())
}

/// Claims the operator makes itself — a bootstrap's data claims, made before the
/// StatefulSet; the backup claims per node — each once (one that exists is left as it
/// is).
pub(super) async fn create_claims(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    claims: Vec<k8s_openapi::api::core::v1::PersistentVolumeClaim>,
) -> Result<(), Error> {
    let api: Api<k8s_openapi::api::core::v1::PersistentVolumeClaim> =
        Api::namespaced(ctx.client.clone(), &names.namespace);
    for claim in claims {
        let name = claim.name_any();
        match api.create(&kube::api::PostParams::default(), &claim).await {
            Ok(_) => {
                ctx.metrics.applied("PersistentVolumeClaim", "create");
                record(ctx, relay, "PersistentVolumeClaim", &name, Change::Create).await;
            }
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

pub(super) fn to_json<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap_or(Value::Null)
}

/// Whether a server-side apply is only asked about (`dryRun=All`) or made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DryRun {
    Yes,
    No,
}

/// Server-side apply of the desired object of `kind` (forced, under [`FIELD_MANAGER`]):
/// the object as the API server answered, or `None` when there is no such desired object.
pub(super) async fn patch_owned(
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
    let manager = super::field_manager(&names.relay);
    let manager = manager.as_str();
    let answer = match kind {
        Owned::ConfigMap => {
            let api: Api<ConfigMap> = Api::namespaced(client, ns);
            ssa(&api, manager, name, &desired.config_map, dry_run).await?
        }
        Owned::HeadlessService => {
            let api: Api<Service> = Api::namespaced(client, ns);
            ssa(&api, manager, name, &desired.headless, dry_run).await?
        }
        Owned::ClientService => {
            let api: Api<Service> = Api::namespaced(client, ns);
            ssa(&api, manager, name, &desired.client, dry_run).await?
        }
        Owned::StatefulSet => {
            let api: Api<StatefulSet> = Api::namespaced(client, ns);
            ssa(&api, manager, name, &desired.statefulset, dry_run).await?
        }
        Owned::PodDisruptionBudget => {
            let api: Api<PodDisruptionBudget> = Api::namespaced(client, ns);
            ssa(&api, manager, name, &desired.pdb, dry_run).await?
        }
        Owned::ServiceMonitor => {
            let Some(sm) = &desired.service_monitor else {
                return Ok(None);
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(client, ns, &resources::service_monitor_resource());
            ssa(&api, manager, name, sm, dry_run).await?
        }
        Owned::IngestService => {
            let api: Api<Service> = Api::namespaced(client, ns);
            ssa(&api, manager, name, &desired.ingest_service, dry_run).await?
        }
        Owned::Ingress => {
            let Some(ingress) = &desired.ingress else {
                return Ok(None);
            };
            let api: Api<Ingress> = Api::namespaced(client, ns);
            ssa(&api, manager, name, ingress, dry_run).await?
        }
        Owned::HttpRoute => {
            let Some(route) = &desired.http_route else {
                return Ok(None);
            };
            let api: Api<DynamicObject> =
                Api::namespaced_with(client, ns, &resources::http_route_resource());
            ssa(&api, manager, name, route, dry_run).await?
        }
        Owned::NetworkPolicy => {
            let Some(policy) = &desired.network_policy else {
                return Ok(None);
            };
            let api: Api<NetworkPolicy> = Api::namespaced(client, ns);
            ssa(&api, manager, name, policy, dry_run).await?
        }
    };
    Ok(Some(answer))
}

/// Server-side apply of `obj` as `name`, forced, under the Relay's field manager
/// (`manager`): the API server's answer. A real apply to an object the operator's releases
/// before field managers per Relay also applied then lets that manager go
/// ([`release_legacy_fields`]).
pub(super) async fn ssa<K>(
    api: &Api<K>,
    manager: &str,
    name: &str,
    obj: &K,
    dry_run: DryRun,
) -> Result<Value, Error>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let mut params = PatchParams::apply(manager).force();
    params.dry_run = dry_run == DryRun::Yes;
    let answer = to_json(&api.patch(name, &params, &Patch::Apply(obj)).await?);
    if dry_run == DryRun::No && legacy_applier(&answer) {
        release_legacy_fields(api, name, &answer).await?;
    }
    Ok(answer)
}

/// Whether the shared field manager of earlier releases ([`FIELD_MANAGER`]) still owns
/// fields of the object `v` by an apply.
pub(super) fn legacy_applier(v: &Value) -> bool {
    v.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .is_some_and(|fields| {
            fields.iter().any(|f| {
                f["manager"] == FIELD_MANAGER
                    && f["operation"] == "Apply"
                    && f.get("subresource").is_none()
            })
        })
}

/// The shared field manager of earlier releases applies an empty object: it owns nothing
/// after, so a field only it set (one this release no longer sets) goes, and every field
/// the Relay's own manager applied just before stays (owned by that manager too). Once per
/// object, after the first apply under the Relay's manager.
async fn release_legacy_fields<K>(api: &Api<K>, name: &str, applied: &Value) -> Result<(), Error>
where
    K: Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let empty = json!({
        "apiVersion": applied["apiVersion"],
        "kind": applied["kind"],
        "metadata": { "name": name },
    });
    api.patch(
        name,
        &PatchParams::apply(FIELD_MANAGER),
        &Patch::Apply(&empty),
    )
    .await?;
    Ok(())
}

/// Carry out one change of an owned object, with the Event, metric and log line that go
/// with it.
pub(super) async fn apply_owned(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    desired: &DesiredSet,
    kind: Owned,
    change: Change,
) -> Result<(), Error> {
    let name = names.of_kind(kind);
    if change == Change::Delete {
        // Only an optional kind is ever deleted (no longer asked for).
        let resource = match kind {
            Owned::ServiceMonitor => resources::service_monitor_resource(),
            Owned::HttpRoute => resources::http_route_resource(),
            Owned::Ingress => kube::api::ApiResource::erase::<Ingress>(&()),
            Owned::NetworkPolicy => kube::api::ApiResource::erase::<NetworkPolicy>(&()),
            _ => return Ok(()),
        };
        let api: Api<DynamicObject> =
            Api::namespaced_with(ctx.client.clone(), &names.namespace, &resource);
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
pub(super) async fn apply<K>(
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
    ssa(
        api,
        &super::field_manager(&relay.name_any()),
        name,
        obj,
        DryRun::No,
    )
    .await?;
    record(ctx, relay, kind, name, change).await;
    Ok(())
}

/// A node restore stops one pod while the others serve: the StatefulSet is deleted with
/// its pods orphaned (they keep running; the StatefulSet made again at the restore's end
/// adopts them), and once it is gone, the pod (nothing makes it again meanwhile).
pub(super) async fn stop_one_pod(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    o: &Observed,
    pod: &str,
) -> Result<(), Error> {
    use kube::api::{DeleteParams, PropagationPolicy};
    let ns = &names.namespace;
    if o.statefulset.is_some() {
        let api: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), ns);
        let orphan = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Orphan),
            ..DeleteParams::default()
        };
        match api.delete(&names.statefulset, &orphan).await {
            Ok(_) => {
                record(
                    ctx,
                    relay,
                    "StatefulSet",
                    &names.statefulset,
                    Change::Delete,
                )
                .await
            }
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
        return Ok(());
    }
    if o.pods.iter().any(|p| p.name == pod) {
        let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
        match api.delete(pod, &DeleteParams::default()).await {
            Ok(_) => record(ctx, relay, "Pod", pod, Change::Delete).await,
            Err(kube::Error::Api(e)) if e.code == 404 => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}
