//! Growing the nodes' volumes in place when `spec.storage.size` grows.
//!
//! A StatefulSet's claim templates cannot change, but its claims can grow when their
//! StorageClass allows it (`allowVolumeExpansion`). So, when the spec asks for more than the
//! templates hold, on the same class:
//! 1. the class is read: one that does not allow expansion (or cannot be read) leaves
//!    everything as it is, and `Degraded` `StorageChangePending` says why and what to do by
//!    hand;
//! 2. each bound data claim asking for less is patched to the new size (the storage driver
//!    grows the volume, and the file system at the pod's next mount or online, as it
//!    supports);
//! 3. once every node's claim asks for it, the StatefulSet is deleted with its pods
//!    orphaned, and the next reconcile makes it again with the new template: the pods are
//!    adopted as they run, none restarts.
//!
//! Not while an upgrade, a restore or a scale-down is under way (their own steps move the
//! StatefulSet): it waits for them. A smaller size or another class is never carried out.

use ankusa_crds::relay::Relay;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;

use super::events::event;
use super::{Context, Error};
use crate::names::Names;
use crate::observed::Observed;
use crate::plan::Rollout;
use crate::resources::{quantity_bytes, DesiredSet};

/// What `spec.storage` asks of the claims, against the templates the StatefulSet was made
/// with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Growth {
    /// The templates are what the spec asks for.
    Same,
    /// Never carried out (a smaller size, another class): what to do by hand.
    Refused(String),
    /// More room on the same class: `to` from `from`, on `class` (the template's, when it
    /// names one).
    Grow {
        from: String,
        to: String,
        class: Option<String>,
    },
}

/// What to do by hand, when the operator does not.
const BY_HAND: &str = "expand each data-* claim (kubectl edit pvc), then delete the StatefulSet with --cascade=orphan; the operator recreates it with the new template on the release the nodes run";

fn size(c: &PersistentVolumeClaim) -> Option<String> {
    c.spec
        .as_ref()?
        .resources
        .as_ref()?
        .requests
        .as_ref()?
        .get("storage")
        .map(|q| q.0.clone())
}

fn class(c: &PersistentVolumeClaim) -> Option<String> {
    c.spec.as_ref()?.storage_class_name.clone()
}

/// The change from the live claim template `live` to the wanted `wanted`.
pub fn growth(wanted: &PersistentVolumeClaim, live: &PersistentVolumeClaim) -> Growth {
    let (to, from) = (
        size(wanted).unwrap_or_default(),
        size(live).unwrap_or_default(),
    );
    let (want_class, live_class) = (class(wanted), class(live));
    let name = |c: &Option<String>| c.clone().unwrap_or_else(|| "default class".into());
    if want_class.is_some() && want_class != live_class {
        return Growth::Refused(format!(
            "spec.storage asks for {to} ({}) but the StatefulSet's claims were made with {from} ({}); a claim's class cannot change: {BY_HAND}",
            name(&want_class),
            name(&live_class),
        ));
    }
    match (quantity_bytes(&to), quantity_bytes(&from)) {
        (Some(t), Some(f)) if t > f => Growth::Grow {
            from,
            to,
            class: live_class,
        },
        (Some(t), Some(f)) if t == f => Growth::Same,
        _ if to == from => Growth::Same,
        _ => Growth::Refused(format!(
            "spec.storage asks for {to} but the StatefulSet's claims were made with {from}; a claim never shrinks: set spec.storage.size back to {from}"
        )),
    }
}

/// What the volumes' growth to `to` waits for, if anything: an upgrade, a restore or a
/// scale-down, which move the StatefulSet themselves.
fn busy(relay: &Relay, o: &Observed, rollout: &Rollout) -> Option<&'static str> {
    if rollout
        .upgrade
        .as_ref()
        .is_some_and(crate::observed::in_progress)
    {
        return Some("an upgrade");
    }
    if rollout
        .restore
        .as_ref()
        .is_some_and(crate::restore::in_progress)
        || rollout.stop_pod.is_some()
    {
        return Some("a restore");
    }
    if o.statefulset
        .as_ref()
        .is_some_and(|s| s.replicas != relay.spec.replicas)
    {
        return Some("a scale");
    }
    None
}

/// The StatefulSet's claim templates cannot change in place: `desired` keeps the live
/// ones (`live` is the live StatefulSet), and what `spec.storage` asks of them is carried
/// out ([`grow`]) or reported ([`Storage::pending`]).
pub(super) async fn storage(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    desired: &mut DesiredSet,
    o: &Observed,
    rollout: &Rollout,
) -> Result<Storage, Error> {
    Ok(
        match keep_claim_templates(desired, o.objects.statefulset.as_ref()) {
            Growth::Same => Storage::default(),
            Growth::Refused(message) => Storage::pending(message),
            Growth::Grow { from, to, class } => {
                grow(relay, ctx, names, o, rollout, (&from, &to, class)).await?
            }
        },
    )
}

/// Puts the live StatefulSet's claim templates into `desired`: what the spec's differ by.
fn keep_claim_templates(desired: &mut DesiredSet, live: Option<&serde_json::Value>) -> Growth {
    let templates = live
        .and_then(|l| l.pointer("/spec/volumeClaimTemplates"))
        .and_then(|t| serde_json::from_value::<Vec<PersistentVolumeClaim>>(t.clone()).ok());
    let (Some(live_templates), Some(spec)) = (templates, desired.statefulset.spec.as_mut()) else {
        return Growth::Same;
    };
    let wanted = spec.volume_claim_templates.clone().unwrap_or_default();
    let change = match (wanted.first(), live_templates.first()) {
        (Some(w), Some(l)) => growth(w, l),
        _ => Growth::Same,
    };
    spec.volume_claim_templates = Some(live_templates);
    change
}

/// What [`storage`] did.
#[derive(Debug, Default)]
pub struct Storage {
    /// Why the claims cannot grow, for `StorageChangePending`.
    pub pending: Option<String>,
    /// The StatefulSet was deleted (its pods orphaned) to be made again with the new
    /// template: this reconcile does not apply it (the next makes it).
    pub recreating: bool,
}

impl Storage {
    fn pending(message: String) -> Storage {
        Storage {
            pending: Some(message),
            recreating: false,
        }
    }
}

/// Grows the data claims to `to` and then has the StatefulSet made again ([the module's
/// steps](self)).
pub(super) async fn grow(
    relay: &Relay,
    ctx: &Context,
    names: &Names,
    o: &Observed,
    rollout: &Rollout,
    (from, to, class): (&str, &str, Option<String>),
) -> Result<Storage, Error> {
    if let Some(what) = busy(relay, o, rollout) {
        tracing::info!(relay = %names.relay, what, "the volumes grow once it ends");
        return Ok(Storage::default());
    }
    let class = class.or_else(|| o.data_claims.iter().find_map(|c| c.class.clone()));
    let Some(class) = class else {
        return Ok(Storage::pending(format!(
            "spec.storage asks for {to}, the claims hold {from}, and they name no StorageClass to grow them on: {BY_HAND}"
        )));
    };
    let classes: Api<StorageClass> = Api::all(ctx.client.clone());
    let why_not = match classes.get_opt(&class).await {
        Ok(Some(sc)) if sc.allow_volume_expansion == Some(true) => None,
        Ok(Some(_)) => Some(format!(
            "StorageClass {class} does not allow volume expansion (allowVolumeExpansion)"
        )),
        Ok(None) => Some(format!("StorageClass {class} does not exist")),
        Err(kube::Error::Api(s)) if s.code == 403 => Some(format!(
            "the operator may not read StorageClass {class} (a namespaced install)"
        )),
        Err(e) => return Err(e.into()),
    };
    if let Some(why) = why_not {
        return Ok(Storage::pending(format!(
            "spec.storage asks for {to} but the claims hold {from} and {why}: {BY_HAND}"
        )));
    }
    let wanted = quantity_bytes(to).unwrap_or(u64::MAX);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let mut short = 0;
    for c in &o.data_claims {
        if c.requested
            .as_deref()
            .and_then(quantity_bytes)
            .is_some_and(|r| r >= wanted)
        {
            continue;
        }
        if !c.bound {
            // Only a bound claim may grow: the StatefulSet waits (looked at again each poll)
            // until this one is bound and grown too, or its new template would leave it
            // short for good.
            short += 1;
            continue;
        }
        let patch = json!({ "spec": { "resources": { "requests": { "storage": to } } } });
        claims
            .patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        event(
            ctx,
            relay,
            "Expanded",
            &format!("PersistentVolumeClaim/{}", c.name),
        )
        .await;
        tracing::info!(relay = %names.relay, claim = %c.name, from, to, "claim expanded");
    }
    if short > 0 {
        return Ok(Storage::default());
    }
    // Every claim asks for the new size: the StatefulSet is made again with the template
    // that says so, its pods orphaned in the meantime (and adopted again as they run).
    let uid = o
        .objects
        .statefulset
        .as_ref()
        .and_then(|s| s["metadata"]["uid"].as_str());
    let Some(uid) = uid.map(str::to_owned) else {
        return Ok(Storage::default());
    };
    let sets: Api<StatefulSet> = Api::namespaced(ctx.client.clone(), &names.namespace);
    let params = DeleteParams {
        propagation_policy: Some(kube::api::PropagationPolicy::Orphan),
        preconditions: Some(Preconditions {
            uid: Some(uid),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    sets.delete(&names.statefulset, &params).await?;
    event(
        ctx,
        relay,
        "Recreating",
        &format!("StatefulSet/{}", names.statefulset),
    )
    .await;
    tracing::info!(relay = %names.relay, to, "StatefulSet deleted (pods orphaned) to be made with the grown claim template");
    Ok(Storage {
        pending: None,
        recreating: true,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(size: &str, class: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "spec": {
                "resources": { "requests": { "storage": size } },
                "storageClassName": class,
            }
        }))
        .unwrap()
    }

    #[test]
    fn only_more_room_on_the_same_class_grows() {
        let live = claim("10Gi", Some("fast"));
        assert_eq!(growth(&claim("10Gi", Some("fast")), &live), Growth::Same);
        assert_eq!(growth(&claim("10240Mi", None), &live), Growth::Same);
        assert_eq!(
            growth(&claim("20Gi", None), &live),
            Growth::Grow {
                from: "10Gi".into(),
                to: "20Gi".into(),
                class: Some("fast".into())
            }
        );
        let refused = |g: Growth, what: &str| match g {
            Growth::Refused(m) => assert!(m.contains(what), "{m}"),
            other => panic!("{other:?}"),
        };
        refused(growth(&claim("5Gi", None), &live), "never shrinks");
        refused(growth(&claim("20Gi", Some("slow")), &live), "cannot change");
    }
}
