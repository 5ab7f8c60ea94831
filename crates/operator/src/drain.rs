//! A scale-down that drains: the nodes past `spec.replicas` hand what they store to the
//! tenants' owners and the StatefulSet shrinks only once they are empty. Pure, like the
//! planner, whose [`rollout`](crate::planner::rollout) ends here.

use ankusa_crds::relay::Relay;

use crate::observed::{Hold, Observed};
use crate::plan::Rollout;

/// The leaving nodes of a scale-down, each with what it still holds: the nodes the
/// StatefulSet runs at or past `spec.replicas`. A node that does not answer, or answers
/// without being marked leaving yet (it has not restarted onto the new node list), holds
/// an unknown amount (`None`).
pub fn leaving_nodes(relay: &Relay, o: &Observed) -> Vec<(String, Option<i64>, Option<String>)> {
    let Some(sts) = o.statefulset.as_ref().filter(|_| handoff_capable(o)) else {
        return Vec::new();
    };
    let names = crate::names::Names::of(relay).ok();
    (relay.spec.replicas.max(0)..sts.replicas)
        .map(|i| {
            let pod = names.as_ref().map(|n| n.pod(i)).unwrap_or_default();
            let cluster = match o.nodes.get(&pod) {
                Some(Ok(n)) => n.status.cluster.clone(),
                _ => None,
            };
            match cluster {
                Some(c) if c.leaving => match c.handoff {
                    Some(h) if h.drained => (pod, Some(0), None),
                    Some(h) => (
                        pod,
                        Some((h.rows_leaving + h.staged) as i64),
                        h.stalled.clone(),
                    ),
                    None => (pod, None, Some("no handoff pass yet".into())),
                },
                Some(_) => (pod, None, Some("not on the new node list yet".into())),
                None => (pod, None, Some("not answering".into())),
            }
        })
        .collect()
}

/// Whether the nodes can hand their rows over: at least one answers, and every node that
/// answers reports its handoff (a release that knows `leaving`; an older one would refuse a
/// node list that marks it). Without it a scale-down shrinks at once, as older operators
/// did, and its claims keep the rows.
pub fn handoff_capable(o: &Observed) -> bool {
    let mut answered = o.nodes.values().filter_map(|n| n.as_ref().ok()).peekable();
    answered.peek().is_some()
        && answered.all(|n| {
            n.status
                .cluster
                .as_ref()
                .is_some_and(|c| c.handoff.is_some())
        })
}

/// The hold (and `Progressing` reason) of a scale-down whose leaving nodes still hold rows.
const DRAINING: &str = "Draining";
/// The same, while a leaving node's handoff does not move (or it does not answer).
const DRAIN_STALLED: &str = "DrainStalled";

/// Whether a hold is a drain's (`Draining`, `DrainStalled`): the controller looks at the
/// nodes again sooner than its poll while one lasts.
pub fn is_drain_hold(h: &Hold) -> bool {
    h.reason == DRAINING || h.reason == DRAIN_STALLED
}

/// A scale-down drains before it shrinks: while a node at or past `spec.replicas` still
/// holds rows (or cannot say), the StatefulSet keeps it — the node list marks it `leaving`,
/// so it owns no tenant and hands what it stores to the owners — and the hold names what
/// it holds and, when its handoff does not move, why. The StatefulSet never shrinks over
/// rows. Scaling back up mid-drain takes the node back as an owner.
pub(crate) fn drain(relay: &Relay, o: &Observed, mut r: Rollout) -> Rollout {
    let Some(sts) = &o.statefulset else {
        return r;
    };
    if sts.replicas <= r.replicas || !handoff_capable(o) {
        return r;
    }
    let leaving = leaving_nodes(relay, o);
    let waiting: Vec<String> = leaving
        .iter()
        .filter(|(_, rows, _)| *rows != Some(0))
        .map(|(pod, rows, why)| {
            let rows = rows.map_or("rows unknown".to_owned(), |n| format!("{n} rows left"));
            match why {
                Some(w) => format!("{pod}: {rows} ({w})"),
                None => format!("{pod}: {rows}"),
            }
        })
        .collect();
    if waiting.is_empty() {
        return r;
    }
    r.replicas = sts.replicas;
    if r.hold.is_none() {
        let stalled = leaving.iter().any(|(_, _, why)| why.is_some());
        r.hold = Some(Hold {
            reason: if stalled { DRAIN_STALLED } else { DRAINING },
            message: format!(
                "the nodes a scale-down takes out hand their rows over first: {}",
                waiting.join("; ")
            ),
            fault: false,
        });
    }
    r
}
