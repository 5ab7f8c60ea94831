//! The operator's own metrics (prometheus-client), served at `/metrics` beside `/healthz`
//! and `/readyz` on `--metrics-addr`.
//!
//! - `ankusa_operator_reconciles_total` — reconciles run.
//! - `ankusa_operator_reconcile_failures_total{reason}` — reconciles that failed, by reason.
//! - `ankusa_operator_reconcile_duration_seconds` — histogram of reconcile time.
//! - `ankusa_operator_node_polls_total{outcome}` — `/v1/node` polls, `ok` or `error`.
//! - `ankusa_operator_applies_total{kind,change}` — objects created or updated.
//! - `ankusa_operator_leader` — 1 while this replica holds the leader Lease.
//! - `ankusa_operator_upgrade_phase{namespace,relay,phase}` — 1 for the phase of each
//!   `Relay`'s upgrade cursor (`Idle` without one), 0 for the others.
//! - `ankusa_operator_last_backup_timestamp_seconds{namespace,relay}` — when the last
//!   node backup of an upgrade finished (`time() - …` is its age).
//! - `ankusa_operator_scheduled_backup_success_timestamp_seconds{namespace,relay,pod}` —
//!   when each node's last scheduled backup succeeded (when the schedule was first seen,
//!   until its first success).
//! - `ankusa_operator_scheduled_backup_interval_seconds{namespace,relay}` — the schedule's
//!   interval; absent without a schedule. The `AnkusaBackupStale` alert fires when a
//!   node's last success is older than twice it.
//!
//! A series names only what exists: a pod the schedule no longer lists (a scale-down) loses
//! its success series at the next reconcile, and a deleted `Relay` every series of its own
//! ([`Metrics::forget`], from the Relay watch's delete event). A stale series would keep
//! `AnkusaBackupStale` firing for a node that is gone.

use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::AtomicI64;
use std::sync::{Arc, Mutex};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabels {
    pub reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabels {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RelayLabels {
    pub namespace: String,
    pub relay: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabels {
    pub namespace: String,
    pub relay: String,
    pub pod: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PhaseLabels {
    pub namespace: String,
    pub relay: String,
    pub phase: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    pub kind: String,
    pub change: String,
}

pub struct Metrics {
    pub registry: Registry,
    pub reconciles: Counter,
    pub failures: Family<ReasonLabels, Counter>,
    pub duration: Histogram,
    pub node_polls: Family<OutcomeLabels, Counter>,
    pub applies: Family<ApplyLabels, Counter>,
    pub leader: Gauge<i64, AtomicI64>,
    pub upgrade_phase: Family<PhaseLabels, Gauge<i64, AtomicI64>>,
    pub last_backup: Family<RelayLabels, Gauge<i64, AtomicI64>>,
    pub scheduled_success: Family<PodLabels, Gauge<i64, AtomicI64>>,
    pub scheduled_interval: Family<RelayLabels, Gauge<i64, AtomicI64>>,
    /// The pods of each Relay that have a `scheduled_success` series (what to remove).
    pods: Mutex<HashMap<RelayLabels, BTreeSet<String>>>,
}

/// Every upgrade phase, for the phase gauge.
const PHASES: [ankusa_crds::status::UpgradePhase; 7] = {
    use ankusa_crds::status::UpgradePhase::*;
    [
        Idle, BackingUp, Rolling, Verifying, Completed, Blocked, Failed,
    ]
};

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("ankusa_operator");
        let reconciles = Counter::default();
        registry.register("reconciles", "Reconciles run", reconciles.clone());
        let failures = Family::<ReasonLabels, Counter>::default();
        registry.register(
            "reconcile_failures",
            "Reconciles that failed, by reason",
            failures.clone(),
        );
        let duration = Histogram::new(exponential_buckets(0.005, 2.0, 12));
        registry.register(
            "reconcile_duration_seconds",
            "Time a reconcile took",
            duration.clone(),
        );
        let node_polls = Family::<OutcomeLabels, Counter>::default();
        registry.register(
            "node_polls",
            "Polls of a node's /v1/node, by outcome",
            node_polls.clone(),
        );
        let applies = Family::<ApplyLabels, Counter>::default();
        registry.register(
            "applies",
            "Owned objects created or updated",
            applies.clone(),
        );
        let leader = Gauge::<i64, AtomicI64>::default();
        registry.register(
            "leader",
            "1 while this replica holds the leader Lease",
            leader.clone(),
        );
        let upgrade_phase = Family::<PhaseLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "upgrade_phase",
            "1 for the phase of each Relay's upgrade cursor",
            upgrade_phase.clone(),
        );
        let last_backup = Family::<RelayLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "last_backup_timestamp_seconds",
            "When the last node backup of an upgrade finished",
            last_backup.clone(),
        );
        let scheduled_success = Family::<PodLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "scheduled_backup_success_timestamp_seconds",
            "When each node's last scheduled backup succeeded (the schedule's start until its first)",
            scheduled_success.clone(),
        );
        let scheduled_interval = Family::<RelayLabels, Gauge<i64, AtomicI64>>::default();
        registry.register(
            "scheduled_backup_interval_seconds",
            "Seconds between runs of each Relay's backup schedule",
            scheduled_interval.clone(),
        );
        Metrics {
            upgrade_phase,
            last_backup,
            scheduled_success,
            scheduled_interval,
            registry,
            reconciles,
            failures,
            duration,
            node_polls,
            applies,
            leader,
            pods: Mutex::default(),
        }
    }
}

impl Metrics {
    pub fn failure(&self, reason: &str) {
        self.failures
            .get_or_create(&ReasonLabels {
                reason: reason.to_owned(),
            })
            .inc();
    }

    pub fn poll(&self, ok: bool) {
        self.node_polls
            .get_or_create(&OutcomeLabels {
                outcome: if ok { "ok" } else { "error" }.into(),
            })
            .inc();
    }

    pub fn applied(&self, kind: &str, change: &str) {
        self.applies
            .get_or_create(&ApplyLabels {
                kind: kind.to_owned(),
                change: change.to_owned(),
            })
            .inc();
    }

    /// The upgrade gauges of one `Relay` from its status.
    pub fn upgrade(
        &self,
        relay: &ankusa_crds::relay::Relay,
        status: &ankusa_crds::status::RelayStatus,
    ) {
        use kube::ResourceExt;
        let (namespace, name) = (relay.namespace().unwrap_or_default(), relay.name_any());
        let phase = status.upgrade.as_ref().map(|u| u.phase).unwrap_or_default();
        for p in PHASES {
            self.upgrade_phase
                .get_or_create(&PhaseLabels {
                    namespace: namespace.clone(),
                    relay: name.clone(),
                    phase: format!("{p:?}"),
                })
                .set(i64::from(p == phase));
        }
        let at = status
            .last_backup
            .as_deref()
            .and_then(|t| t.parse::<k8s_openapi::jiff::Timestamp>().ok());
        if let Some(at) = at {
            self.last_backup
                .get_or_create(&RelayLabels {
                    namespace: namespace.clone(),
                    relay: name.clone(),
                })
                .set(at.as_second());
        }
        let relay_labels = RelayLabels {
            namespace: namespace.clone(),
            relay: name.clone(),
        };
        let listed: BTreeSet<String> = status
            .scheduled_backups
            .iter()
            .flat_map(|b| b.nodes.iter().map(|n| n.name.clone()))
            .collect();
        self.keep_pods(&relay_labels, listed);
        let Some(b) = &status.scheduled_backups else {
            self.scheduled_interval.remove(&relay_labels);
            return;
        };
        self.scheduled_interval
            .get_or_create(&relay_labels)
            .set(b.interval_seconds);
        for n in &b.nodes {
            let at = n
                .last_success
                .as_deref()
                .unwrap_or(&b.since)
                .parse::<k8s_openapi::jiff::Timestamp>();
            if let Ok(at) = at {
                self.scheduled_success
                    .get_or_create(&PodLabels {
                        namespace: namespace.clone(),
                        relay: name.clone(),
                        pod: n.name.clone(),
                    })
                    .set(at.as_second());
            }
        }
    }

    /// Removes the success series of the Relay's pods not in `listed`, and remembers
    /// `listed` as those it has.
    fn keep_pods(&self, relay: &RelayLabels, listed: BTreeSet<String>) {
        let mut pods = self.pods.lock().unwrap_or_else(|p| p.into_inner());
        let had = pods.remove(relay).unwrap_or_default();
        for pod in had.difference(&listed) {
            self.scheduled_success.remove(&PodLabels {
                namespace: relay.namespace.clone(),
                relay: relay.relay.clone(),
                pod: pod.clone(),
            });
        }
        if !listed.is_empty() {
            pods.insert(relay.clone(), listed);
        }
    }

    /// A deleted `Relay`: every series of its own goes.
    pub fn forget(&self, namespace: &str, relay: &str) {
        let labels = RelayLabels {
            namespace: namespace.to_owned(),
            relay: relay.to_owned(),
        };
        self.keep_pods(&labels, BTreeSet::new());
        self.scheduled_interval.remove(&labels);
        self.last_backup.remove(&labels);
        for p in PHASES {
            self.upgrade_phase.remove(&PhaseLabels {
                namespace: namespace.to_owned(),
                relay: relay.to_owned(),
                phase: format!("{p:?}"),
            });
        }
    }

    /// The registry in the Prometheus text format.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}

/// `/metrics`, `/healthz`, `/readyz` for the operator's pod: the probes answer 200 `ok` or
/// 503 with the reason ([`crate::health`]).
pub fn router(metrics: Arc<Metrics>, health: Arc<crate::health::Health>) -> axum::Router {
    use axum::routing::get;
    fn answer(v: crate::health::Verdict) -> axum::response::Response {
        use axum::response::IntoResponse;
        match v {
            Ok(()) => "ok".into_response(),
            Err(why) => (axum::http::StatusCode::SERVICE_UNAVAILABLE, why).into_response(),
        }
    }
    let (live, ready) = (health.clone(), health);
    axum::Router::new()
        .route(
            "/metrics",
            get(move || {
                let m = metrics.clone();
                async move {
                    (
                        [(
                            axum::http::header::CONTENT_TYPE,
                            "text/plain; version=0.0.4; charset=utf-8",
                        )],
                        m.encode(),
                    )
                }
            }),
        )
        .route("/healthz", get(move || async move { answer(live.live()) }))
        .route("/readyz", get(move || async move { answer(ready.ready()) }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use ankusa_crds::status::{NodeBackup, RelayStatus, ScheduledBackups};

    fn relay(name: &str) -> ankusa_crds::relay::Relay {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ankusa.dev/v1alpha1",
            "kind": "Relay",
            "metadata": { "name": name, "namespace": "payments" },
            "spec": { "image": "relay:1" },
        }))
        .unwrap()
    }

    fn scheduled(pods: &[&str]) -> RelayStatus {
        RelayStatus {
            last_backup: Some("2026-12-07T08:00:00Z".into()),
            scheduled_backups: Some(ScheduledBackups {
                schedule: "0 * * * *".into(),
                since: "2026-12-07T07:00:00Z".into(),
                interval_seconds: 3600,
                nodes: pods
                    .iter()
                    .map(|p| NodeBackup {
                        name: (*p).into(),
                        last_success: Some("2026-12-07T08:00:00Z".into()),
                        ..NodeBackup::default()
                    })
                    .collect(),
                ..ScheduledBackups::default()
            }),
            ..RelayStatus::default()
        }
    }

    fn series(m: &Metrics, relay: &str) -> Vec<String> {
        m.encode()
            .lines()
            .filter(|l| !l.starts_with('#') && l.contains(&format!("relay=\"{relay}\"")))
            .map(|l| l.split(' ').next().unwrap_or_default().to_owned())
            .collect()
    }

    #[test]
    fn series_of_gone_pods_and_deleted_relays_are_removed() {
        let m = Metrics::default();
        m.upgrade(
            &relay("hooks"),
            &scheduled(&["hooks-0", "hooks-1", "hooks-2"]),
        );
        m.upgrade(&relay("other"), &scheduled(&["other-0"]));
        let pod = |p: &str| format!("pod=\"{p}\"");
        let has = |r: &str, p: &str| series(&m, r).iter().any(|s| s.contains(&pod(p)));
        assert!(has("hooks", "hooks-2"));
        // A scale-down: hooks-2 leaves the schedule's nodes, and its series goes.
        m.upgrade(&relay("hooks"), &scheduled(&["hooks-0", "hooks-1"]));
        assert!(has("hooks", "hooks-1") && !has("hooks", "hooks-2"));
        // The schedule taken off: no success series, no interval.
        m.upgrade(&relay("hooks"), &RelayStatus::default());
        assert!(!has("hooks", "hooks-0"));
        assert!(!series(&m, "hooks").iter().any(|s| s.contains("interval")));
        // A deleted Relay: nothing of it left; another Relay's series stay.
        m.upgrade(&relay("hooks"), &scheduled(&["hooks-0"]));
        m.forget("payments", "hooks");
        assert_eq!(series(&m, "hooks"), Vec::<String>::new());
        assert!(has("other", "other-0"));
        assert!(series(&m, "other").len() > 3);
    }
}
