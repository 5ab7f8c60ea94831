//! The upgrade gate against simulated StatefulSet and Job controllers, with injected
//! failures (backup Jobs that fail, pods that crash-loop on the new release, a user who
//! retries), checked after every decision:
//!
//! - the partition never drops below `replicas` unless every backup of that target
//!   succeeded (in some attempt);
//! - it drops by at most one ordinal per decision, and only past a verified pod (on the
//!   target, Ready, new format, no migration running);
//! - a pod on the new format is never handed the old release (the format never decreases);
//! - at most one pod is between releases at a time;
//! - the planner carries nothing between decisions but the status, which goes through JSON
//!   each time as it would through the API server (a restart resumes from status alone);
//! - without a failure left in place, the upgrade completes with every node on format 3.

use std::collections::BTreeMap;

use ankusa_crds::node::{NodeCounters, NodeStatus};
use ankusa_crds::relay::{Relay, RelayStatus, UpgradePhase};
use ankusa_operator::planner::{
    self, JobAction, JobObs, NodeReading, Observed, PodObs, ProbeObs, StsObs,
};
use ankusa_operator::status;
use proptest::prelude::*;

use crate::support::relay_value;

const OLD: &str = "ghcr.io/ankusa/relay:0.0.9";
const NEW: &str = "ghcr.io/ankusa/relay:0.1.0";

#[derive(Debug, Clone)]
struct SimPod {
    image: String,
    ready: bool,
    format: u32,
    migrating: bool,
    crashing: bool,
}

/// What the world does at one step.
#[derive(Debug, Clone)]
struct Step {
    /// A running backup Job fails instead of succeeding.
    backup_fails: bool,
    /// A pod started on the new release crash-loops.
    pod_crashes: bool,
    /// The user bumps `spec.upgrade.retry` (and the cause of a failure goes away).
    retry: bool,
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.1),
        prop::bool::weighted(0.3),
    )
        .prop_map(|(backup_fails, pod_crashes, retry)| Step {
            backup_fails,
            pod_crashes,
            retry,
        })
}

fn node_status(p: &SimPod) -> NodeStatus {
    NodeStatus {
        version: p.image.clone(),
        supported_format: if p.image == NEW { 3 } else { 2 },
        store_format: p.format,
        migrating_to: if p.migrating { Some(3) } else { None },
        migration: None,
        tenants: 1,
        counters: NodeCounters::default(),
        oldest_due_at_ms: None,
    }
}

fn run(replicas: i32, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut v = relay_value("full");
    v["spec"]["replicas"] = serde_json::json!(replicas);
    let mut relay: Relay = serde_json::from_value(v).unwrap();
    relay.spec.image = NEW.into();
    let mut pods: Vec<SimPod> = (0..replicas)
        .map(|_| SimPod {
            image: OLD.into(),
            ready: true,
            format: 2,
            migrating: false,
            crashing: false,
        })
        .collect();
    let mut sts = StsObs {
        image: OLD.into(),
        partition: 0,
        ready_replicas: replicas,
        updated_replicas: replicas,
    };
    let mut status_json = serde_json::to_string(&RelayStatus::default()).unwrap();
    // Backup Jobs by (attempt, ordinal).
    let mut jobs: BTreeMap<String, JobObs> = BTreeMap::new();
    let mut backed_up = false;
    let mut retry = 0u32;

    for (n, st) in steps.iter().enumerate() {
        // A restarted operator has only what the API server returns.
        let prev: RelayStatus = serde_json::from_str(&status_json).unwrap();
        let attempt = prev.upgrade.as_ref().and_then(|u| u.retry_seen.clone());
        let mut o = Observed {
            statefulset: Some(sts.clone()),
            now: format!("2026-11-30T00:{:02}:00Z", n % 60),
            probes: BTreeMap::from([(NEW.to_owned(), ProbeObs::Format(3))]),
            ..Observed::default()
        };
        for (i, p) in pods.iter().enumerate() {
            let name = format!("hooks-{i}");
            o.pods.push(PodObs {
                name: name.clone(),
                ordinal: i as i32,
                image: p.image.clone(),
                ready: p.ready,
                failing: p.crashing.then(|| "CrashLoopBackOff".to_owned()),
            });
            if p.ready {
                o.nodes.insert(
                    name,
                    Ok(NodeReading {
                        status: node_status(p),
                        top: vec![],
                    }),
                );
            }
        }
        if let Some(u) = &prev.upgrade {
            if let Some(target) = &u.target_image {
                for i in 0..replicas {
                    let name = planner::backup_job_name(&relay, i, target, attempt.as_deref());
                    if let Some(j) = jobs.get(&name) {
                        o.backups.insert(i, j.clone());
                    }
                }
            }
        }
        let all_backed_up_now = o.backups.len() == replicas as usize
            && o.backups.values().all(|j| *j == JobObs::Succeeded);
        backed_up |= all_backed_up_now;

        let r = planner::rollout(&relay, &prev, &o);

        // Invariants of this decision.
        let observed_p = sts.partition;
        if r.image == NEW && r.partition < replicas && r.partition < observed_p {
            prop_assert!(
                backed_up,
                "step {n}: partition dropped to {} without a backup",
                r.partition
            );
            prop_assert!(
                observed_p - r.partition <= 1,
                "step {n}: partition dropped {observed_p} -> {}",
                r.partition
            );
            if observed_p < replicas {
                let p = &pods[observed_p as usize];
                prop_assert!(
                    p.image == NEW && p.ready && p.format == 3 && !p.migrating,
                    "step {n}: dropped past unverified hooks-{observed_p}: {p:?}"
                );
            }
        }
        for (i, p) in pods.iter().enumerate() {
            if p.format == 3 && i as i32 >= r.partition {
                prop_assert_eq!(
                    &r.image,
                    NEW,
                    "step {}: a format-3 node would get the old release",
                    n
                );
            }
        }
        let between = pods
            .iter()
            .enumerate()
            .filter(|(i, p)| *i as i32 >= r.partition && !(p.image == r.image && p.ready))
            .count();
        prop_assert!(
            between <= 1,
            "step {n}: {between} pods between releases at partition {}",
            r.partition
        );

        // The decision is carried out.
        sts.image = r.image.clone();
        sts.partition = r.partition;
        for j in &r.jobs {
            if let JobAction::Backup { name, .. } = j {
                jobs.entry(name.clone()).or_insert(JobObs::Running);
            }
        }
        let monitor = planner::monitor_decision(&relay, &o);
        let next = status::status(&relay, &prev, &o, &r, &monitor);
        status_json = serde_json::to_string(&next).unwrap();

        // The world moves: Jobs finish, the StatefulSet controller replaces at most one pod
        // (the highest ordinal at or above the partition not on the template), pods start.
        for j in jobs.values_mut() {
            if *j == JobObs::Running {
                *j = if st.backup_fails {
                    JobObs::Failed("BackoffLimitExceeded".into())
                } else {
                    JobObs::Succeeded
                };
            }
        }
        for p in pods.iter_mut() {
            if p.image == NEW && !p.ready && !p.crashing {
                if p.migrating {
                    p.migrating = false;
                    p.format = 3;
                    p.ready = true;
                } else {
                    p.migrating = p.format < 3;
                    p.ready = !p.migrating;
                    if !p.migrating {
                        p.format = 3;
                    }
                }
            }
        }
        let settled = pods.iter().all(|p| p.ready);
        if settled {
            if let Some(i) = (sts.partition..replicas)
                .rev()
                .find(|i| pods[*i as usize].image != sts.image)
            {
                let p = &mut pods[i as usize];
                prop_assert!(
                    !(p.format == 3 && sts.image == OLD),
                    "the simulator rolled a format-3 node back"
                );
                p.image = sts.image.clone();
                p.ready = false;
                p.crashing = st.pod_crashes && p.image == NEW;
            }
        }
        if st.retry
            && next
                .upgrade
                .as_ref()
                .map(|u| u.phase == UpgradePhase::Failed)
                .unwrap_or(false)
        {
            retry += 1;
            relay.spec.upgrade.retry = Some(retry.to_string());
            for p in pods.iter_mut() {
                p.crashing = false;
            }
        }
    }

    // With no failure left in place, a long enough run completes.
    let last: RelayStatus = serde_json::from_str(&status_json).unwrap();
    let failed = last
        .upgrade
        .as_ref()
        .map(|u| u.phase == UpgradePhase::Failed)
        .unwrap_or(false);
    if !failed
        && steps.len() >= 40
        && steps
            .iter()
            .rev()
            .take(30)
            .all(|s| !s.backup_fails && !s.pod_crashes)
    {
        prop_assert!(
            pods.iter()
                .all(|p| p.image == NEW && p.format == 3 && p.ready),
            "{pods:?}"
        );
        prop_assert_eq!(last.upgrade.map(|u| u.phase), Some(UpgradePhase::Completed));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn upgrade_gate_invariants_hold_against_simulated_controllers(
        replicas in 1i32..=4,
        steps in prop::collection::vec(step(), 10..60),
    ) {
        run(replicas, &steps)?;
    }
}

/// The same simulation without failures completes (a fixed, readable case).
#[test]
fn a_clean_three_node_upgrade_completes() {
    let steps = vec![
        Step {
            backup_fails: false,
            pod_crashes: false,
            retry: false
        };
        40
    ];
    run(3, &steps).unwrap();
}
