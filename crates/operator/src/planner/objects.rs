//! Which owned objects to apply ([`changes`]) and whether a ServiceMonitor is
//! ([`monitor_decision`]).

use ankusa_crds::relay::Relay;

use crate::observed::{comparable, contains, Observed, ObservedObjects, Owned};
use crate::resources::DesiredSet;

/// Create a missing object, update a drifted one, or delete one no longer wanted (only an
/// optional kind, [`Owned::optional`]: the operator deletes no store, Service or
/// StatefulSet).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Change {
    Create,
    Update,
    Delete,
}

/// Which owned objects to apply: those missing and those that differ from what the
/// operator's apply would make of them (fields the cluster or others added are not drift);
/// and an owned optional object that is no longer wanted, to delete.
pub fn changes(desired: &DesiredSet, observed: &ObservedObjects) -> Vec<(Owned, Change)> {
    let mut out = Vec::new();
    for kind in Owned::ALL {
        let have = observed.get(kind);
        let Some(want) = desired.value(kind) else {
            // Not wanted (a ServiceMonitor with monitoring turned off, an Ingress no longer
            // asked for): an existing one, which the controller reports only when this
            // Relay owns it, goes.
            if have.is_some() && kind.optional() {
                out.push((kind, Change::Delete));
            }
            continue;
        };
        let Some(have) = have else {
            out.push((kind, Change::Create));
            continue;
        };
        let drift = match observed.applied.get(&kind) {
            Some(after) => comparable(after) != comparable(have),
            None => !contains(have, &want),
        };
        if drift {
            out.push((kind, Change::Update));
        }
    }
    out
}

/// What the ServiceMonitor decision was.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum MonitorDecision {
    Disabled,
    Applied,
    /// Asked for, but `monitoring.coreos.com/v1` is not served.
    ApiMissing,
}

pub fn monitor_decision(relay: &Relay, o: &Observed) -> MonitorDecision {
    if !relay.spec.monitoring.service_monitor.enabled {
        MonitorDecision::Disabled
    } else if o.service_monitor_api {
        MonitorDecision::Applied
    } else {
        MonitorDecision::ApiMissing
    }
}
