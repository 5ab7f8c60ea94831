//! The `Relay`'s status, computed from what the nodes and the cluster report (pure), and
//! the patch that writes it.
//!
//! Every condition carries the generation it describes, so `kubectl wait
//! --for=condition=Ready` never acts on an answer about an older spec. A condition keeps
//! its `lastTransitionTime` while its status stays the same, so re-writing an unchanged
//! status changes nothing.
//!
//! Conditions: `Ready` (every node's pod runs `spec.image`, is Ready and its `/v1/node`
//! answers), `Progressing`,
//! `Upgrading`, `BackupSucceeded` (once a backup ran), `Degraded` (configuration, apply,
//! upgrade or node faults — a node that does not answer is reported here, not an error of
//! the reconcile), `ServiceMonitor`, `ScheduledBackups` and `ObjectStoreBackups` (every
//! node pushed to the bucket within twice `spec.backup.objectStore.intervalSeconds`).

use std::collections::BTreeMap;

use ankusa_crds::relay::Relay;
use ankusa_crds::status::{
    Condition, NodeReport, Phase, RelayStatus, TenantTotals, TopTenant, UpgradePhase,
    TOP_TENANTS_MAX,
};

use crate::observed::{in_progress, Observed};
use crate::plan::Rollout;
use crate::planner::MonitorDecision;

/// The faults `Degraded` reports: each one's reason and message, the first the condition's
/// reason.
pub type Faults = Vec<(&'static str, String)>;

/// The `Relay`'s status, and the faults its `Degraded` condition reports (each reason and
/// message), for their Warning Events.
pub fn status(
    relay: &Relay,
    prev: &RelayStatus,
    o: &Observed,
    r: &Rollout,
    monitor: &MonitorDecision,
    scheduled: &crate::backups::Decision,
) -> (RelayStatus, Faults) {
    let generation = relay.metadata.generation.unwrap_or(0);
    let replicas = relay.spec.replicas.max(0);
    // The nodes a scale-down takes out stay in the report (and their rows in the totals)
    // until the StatefulSet lets them go: they still hold rows while they drain.
    let leaving: BTreeMap<String, Option<i64>> = crate::drain::leaving_nodes(relay, o)
        .into_iter()
        .map(|(pod, rows, _)| (pod, rows))
        .collect();
    let fleet = Fleet::of(relay, o, &leaving);
    let store_format = store_format(prev, o, r);
    let all_ready = o.statefulset.is_some() && fleet.current == replicas;
    let upgrading = r.upgrade.as_ref().map(in_progress).unwrap_or(false);

    let mut conds = Conditions::new(prev, generation, &o.now);
    rollout_conditions(&mut conds, relay, o, r, &fleet, all_ready, upgrading);
    scheduled_condition(&mut conds, scheduled, &o.now);
    let (ok, reason, message) = crate::objstore::condition(relay, o);
    conds.set("ObjectStoreBackups", ok, reason, message);
    let faults = faults(relay, o, r, scheduled, &fleet.nodes);
    match faults.first() {
        Some((reason, _)) => conds.set(
            "Degraded",
            true,
            reason,
            faults
                .iter()
                .map(|(_, m)| m.as_str())
                .collect::<Vec<_>>()
                .join("; "),
        ),
        None => conds.set("Degraded", false, "Healthy", "nothing needs attention"),
    }
    match monitor {
        MonitorDecision::Disabled => conds.set("ServiceMonitor", false, "Disabled", "spec.monitoring.serviceMonitor.enabled is false"),
        MonitorDecision::Applied => conds.set("ServiceMonitor", true, "Applied", "the ServiceMonitor scrapes every node's /metrics"),
        MonitorDecision::ApiMissing => conds.set(
            "ServiceMonitor",
            false,
            "ApiNotServed",
            "monitoring.coreos.com/v1 ServiceMonitor is not served by this cluster (is the Prometheus Operator installed?)",
        ),
    }

    let phase = if !faults.is_empty() {
        Phase::Degraded
    } else if upgrading {
        Phase::Upgrading
    } else if all_ready {
        Phase::Running
    } else {
        Phase::Pending
    };
    let answered = fleet.answered;
    let status = RelayStatus {
        observed_generation: Some(generation),
        conditions: conds.into_vec(),
        phase: Some(phase),
        nodes_ready: Some(format!("{answered}/{replicas}")),
        store_format,
        // Until a probe says otherwise, the target is what the running release supports.
        target_format: r.target_format.or(prev.target_format).or_else(|| {
            o.nodes
                .values()
                .filter_map(|n| n.as_ref().ok().map(|r| r.status.supported_format))
                .min()
        }),
        upgrade: r.upgrade.clone(),
        nodes: fleet.nodes,
        // A node that cannot say what it holds counts as one row: the drain is not over.
        draining: Some(leaving.values().map(|rows| rows.unwrap_or(1)).sum::<i64>()),
        tenants: Some(fleet.totals),
        top_tenants: fleet.top,
        last_backup: if r.backups_succeeded_now {
            Some(o.now.clone())
        } else {
            prev.last_backup.clone()
        },
        current_image: r.current_image.clone(),
        scheduled_backups: scheduled.status.clone(),
        backup_claims: o.backup_claim_rooms.values().cloned().collect(),
        claim_archives: o.claim_archives.values().cloned().collect(),
        restore: r.restore.clone().or_else(|| prev.restore.clone()),
        // The install that manages it: `write_status` names this one.
        operator: prev.operator.clone(),
    };
    (status, faults)
}

/// What the nodes report, gathered: each node's report, the tenant totals, the top
/// tenants, and how many of the wanted nodes answer and how many of those run
/// `spec.image` (Ready waits for every one of them, so that after an image change
/// `kubectl wait --for=condition=Ready` does not return at once).
struct Fleet {
    nodes: Vec<NodeReport>,
    totals: TenantTotals,
    top: Vec<TopTenant>,
    answered: i32,
    current: i32,
}

impl Fleet {
    fn of(relay: &Relay, o: &Observed, leaving: &BTreeMap<String, Option<i64>>) -> Fleet {
        let replicas = relay.spec.replicas.max(0);
        let names = crate::names::Names::of(relay).ok();
        let mut nodes = Vec::new();
        let mut totals = TenantTotals {
            max: relay.spec.tenants.max,
            ..TenantTotals::default()
        };
        let mut top: BTreeMap<String, crate::observed::TenantReading> = BTreeMap::new();
        let mut answered = 0;
        // The Relay's tenant registry (its first node) counts each tenant once; the sum of the
        // nodes' ordinals counts a tenant again on a node it moved away from.
        let mut registered: Option<i64> = None;
        // Nodes that answer and run `spec.image`: Ready waits for every one of them, so that
        // after an image change `kubectl wait --for=condition=Ready` does not return at once.
        let mut current = 0;
        let present = replicas.max(o.statefulset.as_ref().map_or(0, |s| s.replicas));
        for i in 0..present {
            let name = names.as_ref().map(|n| n.pod(i)).unwrap_or_default();
            let pod = o.pods.iter().find(|p| p.ordinal == i);
            let mut report = NodeReport {
                name: name.clone(),
                leaving: i >= replicas,
                rows_leaving: leaving.get(&name).copied().flatten(),
                last_object_backup: crate::objstore::last_backup(o, &name),
                ..NodeReport::default()
            };
            match (pod, o.nodes.get(&name)) {
                (None, _) => report.message = Some("no pod".into()),
                (Some(p), _) if !p.ready => {
                    report.message = Some(
                        p.failing
                            .clone()
                            .unwrap_or_else(|| "pod is not Ready".into()),
                    )
                }
                (Some(_), None) => report.message = Some("not polled yet".into()),
                (Some(_), Some(Err(e))) => report.message = Some(format!("/v1/node: {e}")),
                (Some(p), Some(Ok(n))) => {
                    if i < replicas {
                        answered += 1;
                        if crate::observed::names_image(&relay.spec.image, &p.image) {
                            current += 1;
                        }
                    }
                    let s = &n.status;
                    report.ready = true;
                    report.version = Some(s.version.clone());
                    report.format = Some(s.store_format);
                    report.migrating = s.migrating_to.is_some();
                    report.pending = s.counters.pending;
                    report.dead = s.counters.dead;
                    report.tenants_owned = s.cluster.as_ref().map(|c| c.tenants_owned as i64);
                    if let Some(n) = s.cluster.as_ref().and_then(|c| c.tenants_registered) {
                        *registered.get_or_insert(0) += n as i64;
                    }
                    totals.count += i64::from(s.tenants);
                    totals.pending += s.counters.pending;
                    totals.scheduled += s.counters.scheduled;
                    totals.inflight += s.counters.inflight;
                    totals.dead += s.counters.dead;
                    totals.bytes += s.counters.bytes;
                    totals.paused += s.tenants_paused.unwrap_or(0) as i64;
                    totals.over_quota += s.tenants_over_quota.unwrap_or(0) as i64;
                    for t in &n.top {
                        let e = top.entry(t.tenant.clone()).or_default();
                        e.pending += t.pending;
                        e.dead += t.dead;
                        e.oldest_due_at_ms = match (e.oldest_due_at_ms, t.oldest_due_at_ms) {
                            (Some(a), Some(b)) => Some(a.min(b)),
                            (a, b) => a.or(b),
                        };
                        e.paused |= t.paused;
                        e.quota_refusals += t.quota_refusals;
                    }
                }
            }
            nodes.push(report);
        }
        if let Some(n) = registered {
            totals.count = n;
        }
        let mut top: Vec<TopTenant> = top
            .into_iter()
            .map(|(tenant, t)| TopTenant {
                tenant,
                pending: t.pending,
                dead: t.dead,
                oldest_due_at: t.oldest_due_at_ms.and_then(|ms| {
                    k8s_openapi::jiff::Timestamp::from_millisecond(ms as i64)
                        .ok()
                        .map(|ts| ts.to_string())
                }),
                paused: t.paused,
                quota_refusals: t.quota_refusals as i64,
            })
            .collect();
        top.sort_by(|a, b| b.pending.cmp(&a.pending).then(a.tenant.cmp(&b.tenant)));
        top.truncate(TOP_TENANTS_MAX);

        Fleet {
            nodes,
            totals,
            top,
            answered,
            current,
        }
    }
}

/// The lowest store format of the nodes. It only rises when every node has reported: a
/// node that is down keeps the format it had (the gate decides from this, and a first
/// install is told apart from a fleet whose nodes are all down by it).
fn store_format(prev: &RelayStatus, o: &Observed, r: &Rollout) -> Option<u32> {
    let reported = o
        .nodes
        .values()
        .filter_map(|n| n.as_ref().ok().map(|r| r.status.store_format))
        .min();
    let everyone = !o.pods.is_empty()
        && o.pods
            .iter()
            .all(|p| matches!(o.nodes.get(&p.name), Some(Ok(_))));
    // A restore at a lower format (a rollback) resets what the stores are at: every store
    // was replaced.
    let restored_format = r
        .restore
        .as_ref()
        .filter(|x| x.phase == crate::restore::COMPLETED)
        .and_then(|x| x.format);
    if everyone {
        reported
    } else if let Some(f) = restored_format.filter(|_| {
        prev.restore.as_ref().map(|x| x.phase.as_str()) != Some(crate::restore::COMPLETED)
    }) {
        Some(f)
    } else {
        reported.into_iter().chain(prev.store_format).min()
    }
}

/// `Ready`, `Progressing`, `Upgrading` and `BackupSucceeded`: where the nodes and the
/// release stand.
fn rollout_conditions(
    conds: &mut Conditions<'_>,
    relay: &Relay,
    o: &Observed,
    r: &Rollout,
    fleet: &Fleet,
    all_ready: bool,
    upgrading: bool,
) {
    let replicas = relay.spec.replicas.max(0);
    let (answered, current, nodes) = (fleet.answered, fleet.current, &fleet.nodes);
    if all_ready {
        conds.set(
            "Ready",
            true,
            "AllNodesReady",
            format!("{answered}/{replicas} nodes ready and answering"),
        );
    } else if answered == replicas && o.statefulset.is_some() {
        conds.set(
            "Ready",
            false,
            "ReleaseRolling",
            format!("{current}/{replicas} nodes run {}", relay.spec.image),
        );
    } else {
        let waiting: Vec<String> = nodes
            .iter()
            .filter(|n| !n.ready)
            .map(|n| format!("{}: {}", n.name, n.message.clone().unwrap_or_default()))
            .collect();
        conds.set("Ready", false, "NodesNotReady", waiting.join("; "));
    }
    let sts = o.statefulset.as_ref();
    let rolling = sts
        .map(|s| s.updated_replicas < replicas || s.ready_replicas < replicas)
        .unwrap_or(true);
    // Progressing=True while work is under way (a probe, a backup, a node moving);
    // False when held by the user or stopped by a fault (Degraded says which).
    match (&r.hold, upgrading, rolling) {
        (Some(h), _, _) if h.fault || h.reason == "Paused" => {
            conds.set("Progressing", false, h.reason, h.message.clone())
        }
        (Some(h), _, _) => conds.set("Progressing", true, h.reason, h.message.clone()),
        (_, true, _) => conds.set(
            "Progressing",
            true,
            "Upgrading",
            match r.upgrade.as_ref().and_then(|u| u.current_pod.clone()) {
                Some(pod) => format!("{pod} is moving to the target release"),
                None => "a gated format upgrade is rolling".to_owned(),
            },
        ),
        (_, _, true) => conds.set(
            "Progressing",
            true,
            "RollingOut",
            "nodes are being created or updated",
        ),
        _ => conds.set(
            "Progressing",
            false,
            "Stable",
            "every node runs the requested release",
        ),
    }
    match &r.upgrade {
        Some(u) if in_progress(u) => conds.set(
            "Upgrading",
            !matches!(u.phase, UpgradePhase::Failed | UpgradePhase::Blocked),
            match u.phase {
                UpgradePhase::BackingUp => "BackingUp",
                UpgradePhase::Rolling => "Rolling",
                UpgradePhase::Verifying => "Verifying",
                UpgradePhase::Failed => "Failed",
                _ => "Blocked",
            },
            format!(
                "to {}: {} of {replicas} nodes migrated",
                u.target_image.clone().unwrap_or_default(),
                u.pods_migrated
            ),
        ),
        _ => conds.set(
            "Upgrading",
            false,
            "NoUpgrade",
            "no format upgrade under way",
        ),
    }
    if r.backups_succeeded_now {
        let jobs = r
            .upgrade
            .as_ref()
            .map(|u| u.backup_jobs.join(", "))
            .unwrap_or_default();
        conds.set(
            "BackupSucceeded",
            true,
            "BackupsCompleted",
            format!("backed up just before the node moved: {jobs}"),
        );
    } else if let Some(h) = r.hold.as_ref().filter(|h| h.reason == "BackupFailed") {
        conds.set("BackupSucceeded", false, "BackupFailed", h.message.clone());
    }
}

/// How long a relay pod may wait for the scheduler before `PodUnschedulable` says so.
const UNSCHEDULABLE_GRACE_S: i64 = 60;

/// What `Degraded` reports: each fault's reason and message, the first one the
/// condition's reason.
fn faults(
    relay: &Relay,
    o: &Observed,
    r: &Rollout,
    scheduled: &crate::backups::Decision,
    nodes: &[NodeReport],
) -> Faults {
    let mut faults = Faults::new();
    if !o.foreign.is_empty() {
        faults.push(("ObjectNotOwned", foreign_message(relay, &o.foreign)));
    }
    if let Some(e) = &o.config_error {
        faults.push(("ConfigInvalid", e.clone()));
    }
    if !o.create_failures.is_empty() {
        faults.push((
            "PodCreateFailed",
            format!("pods cannot be created: {}", o.create_failures.join("; ")),
        ));
    }
    // A pod the scheduler has not placed for a minute (not one a volume binding or a
    // cluster autoscaler is about to place).
    let unschedulable: Vec<String> = o
        .pods
        .iter()
        .filter_map(|p| {
            let since = p.unschedulable_since.as_deref()?;
            let long = crate::observed::elapsed_s(since, &o.now)? >= UNSCHEDULABLE_GRACE_S;
            long.then(|| format!("{}: {}", p.name, p.waiting.as_deref().unwrap_or("")))
        })
        .collect();
    if !unschedulable.is_empty() {
        faults.push((
            "PodUnschedulable",
            format!(
                "the scheduler places no node for {}",
                unschedulable.join("; ")
            ),
        ));
    }
    if let Some(e) = &o.apply_error {
        faults.push(("ApplyFailed", e.clone()));
    }
    if let Some(held) = tenants_held(o).filter(|h| *h > relay.spec.tenants.max) {
        faults.push((
            "TenantsMaxBelowHeld",
            format!(
                "spec.tenants.max is {} but the Relay holds {held} tenants: no new tenant is admitted until it is raised above that or tenants are erased (the tenants held keep their hooks)",
                relay.spec.tenants.max
            ),
        ));
    }
    if let Some(e) = &o.storage_change {
        faults.push(("StorageChangePending", e.clone()));
    }
    if let Some((reason, message)) = &scheduled.fault {
        faults.push((reason, message.clone()));
    }
    if relay.spec.ingest.http_route.is_some() && !o.http_route_api {
        faults.push((
            "HTTPRouteNotServed",
            "spec.ingest.httpRoute asks for an HTTPRoute, but gateway.networking.k8s.io/v1 HTTPRoute is not served by this cluster (install the Gateway API's CRDs)".to_owned(),
        ));
    }
    if let Some(h) = r.hold.as_ref().filter(|h| h.fault) {
        faults.push((h.reason, h.message.clone()));
    }
    let silent: Vec<&NodeReport> = nodes
        .iter()
        .filter(|n| {
            !n.ready
                && n.message
                    .as_deref()
                    .map(|m| m.starts_with("/v1/node"))
                    .unwrap_or(false)
        })
        .collect();
    if !silent.is_empty() {
        faults.push((
            "NodeNotAnswering",
            silent
                .iter()
                .map(|n| format!("{}: {}", n.name, n.message.clone().unwrap_or_default()))
                .collect::<Vec<_>>()
                .join("; "),
        ));
    }
    // Last: another install's refusal never hides what this one has to say.
    if !o.refusals.is_empty() {
        faults.push(("AnotherOperatorWatches", o.refusals.join("; ")));
    }
    faults
}

/// The tenants the Relay holds, by the nodes that answered: its registry's count (each
/// tenant once), or the nodes' own counts where no node keeps a registry (one node).
fn tenants_held(o: &Observed) -> Option<i64> {
    let readings: Vec<&ankusa_api::node::NodeStatus> = o
        .nodes
        .values()
        .filter_map(|n| n.as_ref().ok().map(|r| &r.status))
        .collect();
    if readings.is_empty() {
        return None;
    }
    let registered: Option<i64> = readings
        .iter()
        .filter_map(|s| s.cluster.as_ref().and_then(|c| c.tenants_registered))
        .map(|n| n as i64)
        .reduce(|a, b| a + b);
    Some(registered.unwrap_or_else(|| readings.iter().map(|s| i64::from(s.tenants)).sum()))
}

/// What `ObjectNotOwned` says: each object at one of the Relay's names that is not its,
/// whose it is, and what to do.
fn foreign_message(relay: &Relay, foreign: &[crate::observed::ForeignObject]) -> String {
    let objects = foreign
        .iter()
        .map(|f| format!("{} belongs to {}", f.object, f.owner))
        .collect::<Vec<_>>()
        .join("; ");
    let config_ref = relay
        .spec
        .config
        .config_map_ref
        .as_ref()
        .map(|r| r.name.as_str())
        .zip(relay.metadata.name.as_deref())
        .filter(|(cm, name)| *cm == format!("{name}-config"))
        .map(|(cm, _)| {
            format!(" (spec.configMapRef names {cm}, the ConfigMap this Relay writes for its nodes: copy it to another name and point configMapRef there)")
        })
        .unwrap_or_default();
    format!(
        "{objects}{config_ref}: the operator takes no object it does not own, and applies nothing of this Relay while one of its names is taken: rename or delete that object, or give this Relay another name"
    )
}

/// `ScheduledBackups`: True while every node's last scheduled backup is younger than twice
/// the schedule's interval (a node that never succeeded counts from when the schedule was
/// first seen), False naming the nodes that are not.
fn scheduled_condition(conds: &mut Conditions<'_>, d: &crate::backups::Decision, now: &str) {
    let Some(st) = &d.status else {
        let (reason, message) = match &d.fault {
            Some((reason, m)) => (*reason, m.clone()),
            None => ("NotScheduled", "spec.backup.schedule is not set".to_owned()),
        };
        conds.set("ScheduledBackups", false, reason, message);
        return;
    };
    let limit = 2 * st.interval_seconds.max(60);
    let stale: Vec<String> = st
        .nodes
        .iter()
        .filter_map(|n| {
            let since = n.last_success.as_deref().unwrap_or(&st.since);
            let age = crate::observed::elapsed_s(since, now)?;
            (age > limit).then(|| match &n.last_failure {
                Some(f) => format!("{}: no backup for {age} s ({f})", n.name),
                None => format!("{}: no backup for {age} s", n.name),
            })
        })
        .collect();
    if !stale.is_empty() {
        conds.set("ScheduledBackups", false, "Stale", stale.join("; "));
    } else if let Some((reason, m)) = &d.fault {
        conds.set("ScheduledBackups", false, reason, m.clone());
    } else {
        conds.set(
            "ScheduledBackups",
            true,
            "Current",
            format!(
                "every node backed up within {limit} s (twice the schedule {:?}); next run {}",
                st.schedule,
                st.next_run.clone().unwrap_or_default()
            ),
        );
    }
}

/// Conditions with their transition time kept while their status does not change.
/// The conditions of a Relay whose reconciliation is paused
/// (`ankusa.dev/reconcile: paused`): the last ones the operator wrote, with `Reconciling`
/// False, reason `Paused`.
pub fn paused_conditions(relay: &Relay, prev: &RelayStatus, now: &str) -> Vec<Condition> {
    let generation = relay.metadata.generation.unwrap_or(0);
    let mut c = Conditions::new(prev, generation, now);
    c.set(
        "Reconciling",
        false,
        "Paused",
        "ankusa.dev/reconcile: paused: the operator changes nothing of this Relay until the annotation is removed",
    );
    let mut out: Vec<Condition> = prev
        .conditions
        .iter()
        .filter(|c| c.type_ != "Reconciling")
        .cloned()
        .collect();
    out.extend(c.into_vec());
    out
}

struct Conditions<'a> {
    prev: &'a RelayStatus,
    generation: i64,
    now: &'a str,
    out: Vec<Condition>,
}

impl<'a> Conditions<'a> {
    fn new(prev: &'a RelayStatus, generation: i64, now: &'a str) -> Self {
        Conditions {
            prev,
            generation,
            now,
            out: Vec::new(),
        }
    }

    fn set(&mut self, type_: &str, status: bool, reason: &str, message: impl Into<String>) {
        let status = if status { "True" } else { "False" }.to_owned();
        let last_transition_time = self
            .prev
            .conditions
            .iter()
            .find(|c| c.type_ == type_ && c.status == status)
            .map(|c| c.last_transition_time.clone())
            .unwrap_or_else(|| self.now.to_owned());
        self.out.push(Condition {
            type_: type_.to_owned(),
            status,
            reason: reason.to_owned(),
            message: message.into(),
            last_transition_time,
            observed_generation: self.generation,
        });
    }

    fn into_vec(self) -> Vec<Condition> {
        self.out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observed::{ForeignObject, NodeReading, Owned, PodObs};
    use serde_json::json;

    fn relay(max: i64) -> Relay {
        serde_json::from_value(json!({
            "apiVersion": "ankusa.dev/v1alpha1",
            "kind": "Relay",
            "metadata": { "name": "hooks", "namespace": "shop", "uid": "u1" },
            "spec": { "image": "relay:1", "replicas": 1, "tenants": { "max": max } },
        }))
        .unwrap()
    }

    fn answering(tenants: u32) -> Observed {
        let status = serde_json::from_value(json!({
            "version": "1", "supported_format": 3, "store_format": 3, "migrating_to": null,
            "tenants": tenants, "counters": { "pending": 0, "scheduled": 0, "inflight": 0, "dead": 0, "bytes": 0, "archive_pending": 0 },
            "oldest_due_at_ms": null,
        }))
        .unwrap();
        let mut o = Observed::default();
        o.nodes.insert(
            "hooks-0".into(),
            Ok(NodeReading {
                status,
                top: Vec::new(),
            }),
        );
        o
    }

    fn reasons(relay: &Relay, o: &Observed) -> Vec<&'static str> {
        faults(relay, o, &dummy_rollout(), &Default::default(), &[])
            .into_iter()
            .map(|(reason, _)| reason)
            .collect()
    }

    #[test]
    fn a_tenants_max_below_the_tenants_held_is_a_fault() {
        assert!(reasons(&relay(10), &answering(10)).is_empty());
        assert_eq!(reasons(&relay(9), &answering(10)), ["TenantsMaxBelowHeld"]);
        // Nothing answers: nothing is known.
        assert!(reasons(&relay(1), &Observed::default()).is_empty());
    }

    #[test]
    fn foreign_objects_pods_not_made_and_not_placed_are_faults_naming_them() {
        let mut o = answering(0);
        o.foreign.push(ForeignObject {
            kind: Some(Owned::ConfigMap),
            object: "ConfigMap/hooks-config".into(),
            owner: "no controller".into(),
        });
        o.create_failures
            .push("StatefulSet hooks: no PriorityClass with name gold was found".into());
        o.pods.push(PodObs {
            name: "hooks-0".into(),
            ordinal: 0,
            image: "relay:1".into(),
            ready: false,
            failing: None,
            waiting: Some("Unschedulable: 0/3 nodes are available: 3 Insufficient cpu".into()),
            unschedulable_since: Some("2026-01-01T00:00:00Z".into()),
        });
        o.now = "2026-01-01T00:01:00Z".into();
        let r = relay(10);
        assert_eq!(
            reasons(&r, &o),
            ["ObjectNotOwned", "PodCreateFailed", "PodUnschedulable"]
        );
        let all = faults(&r, &o, &dummy_rollout(), &Default::default(), &[]);
        assert!(all[0]
            .1
            .contains("ConfigMap/hooks-config belongs to no controller"));
        assert!(all[1].1.contains("gold"));
        assert!(all[2].1.contains("hooks-0: Unschedulable: 0/3 nodes"));
    }

    fn dummy_rollout() -> Rollout {
        Rollout {
            image: "relay:1".into(),
            partition: 0,
            replicas: 1,
            jobs: Vec::new(),
            upgrade: None,
            target_format: None,
            hold: None,
            backups_succeeded_now: false,
            current_image: None,
            restore: None,
            claims: Vec::new(),
            hold_statefulset: false,
            stop_pod: None,
        }
    }
}
