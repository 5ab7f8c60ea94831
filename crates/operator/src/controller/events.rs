//! The Events a reconcile records on its `Relay`: an object created or changed, a step of
//! the upgrade (a repeat is a patch of the Event's series).

use ankusa_crds::relay::Relay;
use kube::runtime::events::{Event, EventType};
use kube::{Resource, ResourceExt};

use super::{truncate, Context};
use crate::planner::{self, Change};

use super::apply::change_word;

/// The Event, metric and log line of a change the operator made.
pub(super) async fn record(ctx: &Context, relay: &Relay, kind: &str, name: &str, change: Change) {
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
pub(super) async fn event(ctx: &Context, relay: &Relay, reason: &str, object: &str) {
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
pub(super) async fn event_with(ctx: &Context, relay: &Relay, e: &planner::StepEvent) {
    event_as(ctx, relay, e, "Upgrade").await
}

/// A Warning Event of a fault ([`planner::fault_events`]).
pub(super) async fn fault_event(ctx: &Context, relay: &Relay, e: &planner::StepEvent) {
    event_as(ctx, relay, e, "Reconcile").await
}

async fn event_as(ctx: &Context, relay: &Relay, e: &planner::StepEvent, action: &str) {
    let ev = Event {
        type_: if e.warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: e.reason.into(),
        note: Some(truncate(&e.message, 1000)),
        action: action.into(),
        secondary: None,
    };
    tracing::info!(relay = %relay.name_any(), reason = e.reason, message = %e.message, action, "event");
    if let Err(err) = ctx.recorder.publish(&ev, &relay.object_ref(&())).await {
        tracing::warn!(error = %err, "cannot write an Event");
    }
}
