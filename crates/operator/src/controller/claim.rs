//! One operator install per Relay. An install is its leader election Lease
//! (`<namespace>/<name>`): its replicas elect one leader among themselves, but two installs
//! — two chart releases in two namespaces, both watching every namespace — would each have
//! a leader, and both would reconcile every Relay (each writing its own operator into the
//! NetworkPolicies, each taking the objects from the other).
//!
//! So a Relay names the install that manages it in `status.operator`:
//! - a Relay that names none, or this install, is this install's (named first: a merge
//!   patch of the status that carries the resourceVersion read, so two installs that claim
//!   one Relay at once cannot both win);
//! - a Relay that names another install whose Lease is being renewed is left alone: nothing
//!   of it is read, applied or written but a Warning Event on it
//!   ([`REFUSED_REASON`]), repeated while this install watches it, which the managing
//!   install reads and reports in the Relay's `Degraded` condition
//!   ([`observe_refusals`]);
//! - a Relay that names an install whose Lease is gone, or has not changed for
//!   [`TAKEOVER_AFTER`] of this install's own clock (the rule the elector follows: no two
//!   machines' clocks are compared), is taken over: the install that managed it was
//!   uninstalled or is down.
//!
//! An install that cannot read the other's Lease (its RBAC is namespaced) takes it for
//! renewed: clearing `status.operator` hands the Relay over.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use ankusa_crds::relay::Relay;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Resource, ResourceExt};
use serde_json::json;

use super::{Context, Error};

/// How long another install's Lease may stay unchanged before this install takes its
/// Relays over (its leader renews every few seconds).
pub const TAKEOVER_AFTER: Duration = Duration::from_secs(120);

/// The reason of the Warning Event an install that leaves a Relay to another writes on it.
pub const REFUSED_REASON: &str = "ManagedByAnotherOperator";

/// How recent a refusal's Event must be for the managing install to report it.
const REFUSAL_WINDOW_S: i64 = 600;

/// An operator install: its leader election Lease.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Install {
    pub namespace: String,
    pub lease: String,
}

impl Install {
    /// `<namespace>/<lease>`, as `status.operator` names it.
    pub fn id(&self) -> String {
        format!("{}/{}", self.namespace, self.lease)
    }

    fn parse(id: &str) -> Option<Install> {
        let (namespace, lease) = id.split_once('/')?;
        (!namespace.is_empty() && !lease.is_empty() && !lease.contains('/')).then(|| Install {
            namespace: namespace.to_owned(),
            lease: lease.to_owned(),
        })
    }
}

/// Other installs' Leases as this install last read them: the resourceVersion, and when
/// this install first saw it.
pub type LeaseSightings = HashMap<String, (String, Instant)>;

/// Whose a Relay is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This install's: reconcile it.
    Mine,
    /// The install named manages it: leave it alone.
    Refused { holder: String },
}

/// Whose `relay` is, naming this install on it when it names none or an install that is
/// gone. Without an install of its own (no leader election), every Relay is this one's.
pub async fn claim(relay: &Relay, ctx: &Context) -> Result<Claim, Error> {
    let Some(me) = &ctx.settings.install else {
        return Ok(Claim::Mine);
    };
    let holder = relay.status.as_ref().and_then(|s| s.operator.clone());
    match &holder {
        Some(h) if *h == me.id() => return Ok(Claim::Mine),
        Some(h) if renewed(ctx, h).await? => {
            return Ok(Claim::Refused { holder: h.clone() });
        }
        _ => {}
    }
    let api: Api<Relay> =
        Api::namespaced(ctx.client.clone(), &relay.namespace().unwrap_or_default());
    let body = json!({
        "metadata": { "resourceVersion": relay.resource_version() },
        "status": { "operator": me.id() },
    });
    api.patch_status(
        &relay.name_any(),
        &PatchParams::default(),
        &Patch::Merge(&body),
    )
    .await?;
    tracing::info!(relay = %relay.name_any(), from = ?holder, "this install manages the Relay");
    Ok(Claim::Mine)
}

/// Whether the install `id` names renews its Lease: it exists and changed within
/// [`TAKEOVER_AFTER`] of this install's first sight of its current version. A Lease this
/// install may not read counts as renewed.
async fn renewed(ctx: &Context, id: &str) -> Result<bool, Error> {
    let Some(other) = Install::parse(id) else {
        return Ok(false);
    };
    let api: Api<Lease> = Api::namespaced(ctx.client.clone(), &other.namespace);
    let version = match api.get_opt(&other.lease).await {
        Ok(Some(lease)) => lease.resource_version().unwrap_or_default(),
        Ok(None) => return Ok(false),
        Err(kube::Error::Api(s)) if s.code == 403 => return Ok(true),
        Err(e) => return Err(e.into()),
    };
    let mut seen = ctx.leases.lock().unwrap_or_else(|p| p.into_inner());
    if seen.len() >= 64 && !seen.contains_key(id) {
        seen.clear();
    }
    let entry = seen
        .entry(id.to_owned())
        .or_insert_with(|| (version.clone(), Instant::now()));
    if entry.0 != version {
        *entry = (version, Instant::now());
    }
    Ok(entry.1.elapsed() < TAKEOVER_AFTER)
}

/// The Warning Event on a Relay another install manages, saying this install leaves it
/// alone; its related object is this install's Lease, which the managing install checks
/// (a refusal is reported while the install that made it runs).
pub async fn refuse(ctx: &Context, relay: &Relay, holder: &str) {
    // Only an install of its own refuses a Relay ([`claim`]).
    let Some(me) = &ctx.settings.install else {
        return;
    };
    let note = format!(
        "the operator install {} watches this Relay too and leaves it to {holder}, which manages it: run one operator install per cluster, or give each install namespaces of its own",
        me.id()
    );
    tracing::warn!(relay = %relay.name_any(), holder, "another operator install manages this Relay: left alone");
    let lease = k8s_openapi::api::core::v1::ObjectReference {
        api_version: Some("coordination.k8s.io/v1".into()),
        kind: Some("Lease".into()),
        namespace: Some(me.namespace.clone()),
        name: Some(me.lease.clone()),
        ..Default::default()
    };
    let event = kube::runtime::events::Event {
        type_: kube::runtime::events::EventType::Warning,
        reason: REFUSED_REASON.into(),
        note: Some(note),
        action: "Reconcile".into(),
        secondary: Some(lease),
    };
    if let Err(e) = ctx.recorder.publish(&event, &relay.object_ref(&())).await {
        tracing::warn!(error = %e, "cannot write an Event");
    }
}

/// What other installs that still run said of `relay` in the last ten minutes
/// ([`refuse`]), one message each.
pub async fn observe_refusals(
    ctx: &Context,
    relay: &Relay,
    now: &str,
) -> Result<Vec<String>, Error> {
    let api: Api<k8s_openapi::api::core::v1::Event> =
        Api::namespaced(ctx.client.clone(), &relay.namespace().unwrap_or_default());
    let fields = format!(
        "reason={REFUSED_REASON},involvedObject.kind=Relay,involvedObject.name={}",
        relay.name_any()
    );
    let events = api.list(&ListParams::default().fields(&fields)).await?;
    let recent = events.items.into_iter().filter(|e| {
        let at = e
            .series
            .as_ref()
            .and_then(|s| s.last_observed_time.as_ref())
            .map(|t| t.0.to_string())
            .or_else(|| e.last_timestamp.as_ref().map(|t| t.0.to_string()))
            .or_else(|| e.event_time.as_ref().map(|t| t.0.to_string()))
            .unwrap_or_default();
        crate::observed::elapsed_s(&at, now).is_some_and(|s| s <= REFUSAL_WINDOW_S)
    });
    let mine = ctx.settings.install.as_ref().map(Install::id);
    let mut out = Vec::new();
    for e in recent {
        // The install that refused: the Event's related object, its Lease.
        let install = e.related.as_ref().and_then(|r| {
            Some(format!(
                "{}/{}",
                r.namespace.as_deref()?,
                r.name.as_deref()?
            ))
        });
        let running = match install {
            Some(id) if Some(&id) != mine.as_ref() => renewed(ctx, &id).await?,
            _ => false,
        };
        if let (true, Some(m)) = (running, e.message) {
            out.push(m);
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_install_is_named_by_its_lease() {
        let i = Install {
            namespace: "ankusa-system".into(),
            lease: "ankusa-operator".into(),
        };
        assert_eq!(i.id(), "ankusa-system/ankusa-operator");
        assert_eq!(Install::parse(&i.id()), Some(i));
        for bad in ["", "a", "/b", "a/", "a/b/c"] {
            assert_eq!(Install::parse(bad), None, "{bad}");
        }
    }
}
