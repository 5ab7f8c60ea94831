//! Scheduled backups (`spec.backup.schedule`): pure, like the planner — observed state and
//! the last status in, the Jobs to start and the next status out.
//!
//! At each time of the schedule a run begins: every node of `spec.replicas`, ordinal 0
//! first, is backed up by a Job that pulls its checkpoint to the backup claim and keeps
//! `spec.backup.retention` archives of that node. One Job at a time — they share the
//! backup claim, which a ReadWriteOnce volume attaches to one host at a time — and none
//! while an upgrade runs (the gate takes its own backups; the run goes on after it), but
//! while one is failed, when backups matter most. A
//! node whose Job fails is recorded (`lastFailure`) and the run moves to the next node.
//! A time of the schedule that passes while a run is still going is skipped, as a
//! CronJob with `concurrencyPolicy: Forbid` skips it. The first run is at the first time
//! of the schedule after the operator first saw it.

use ankusa_crds::relay::Relay;
use ankusa_crds::status::{NodeBackup, RelayStatus, ScheduledBackups, UpgradePhase};
use k8s_openapi::jiff::Timestamp;

use crate::observed::{in_progress, JobObs, Observed};
use crate::plan::JobAction;
use crate::schedule::Cron;

/// What the schedule asks for now.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Decision {
    /// At most one Job.
    pub jobs: Vec<JobAction>,
    pub status: Option<ScheduledBackups>,
    /// Why no backup can run (a schedule that does not parse, a claim missing or too
    /// small).
    pub fault: Option<(&'static str, String)>,
}

/// The name of node `ordinal`'s Job in the run of `run` (its RFC 3339 time): the shape of
/// the gate's backup Jobs (`<name>-backup-<ordinal>-<8 hex>`), so the name rule that
/// bounds those bounds these.
pub fn job_name(relay: &Relay, ordinal: i32, run: &str) -> String {
    let name = relay.metadata.name.clone().unwrap_or_default();
    let mut h = crate::names::config_hash(&format!("scheduled\n{run}"));
    h.truncate(8);
    format!("{name}-backup-{ordinal}-{h}")
}

/// The scheduled backups' next step.
pub fn decide(relay: &Relay, prev: &RelayStatus, o: &Observed) -> Decision {
    let Some((backup, _)) = relay.spec.claim_backup() else {
        return Decision::default();
    };
    let Some(schedule) = backup.schedule.as_deref() else {
        return Decision::default();
    };
    let cron: Cron = match schedule.parse() {
        Ok(c) => c,
        Err(e) => {
            return Decision {
                fault: Some((
                    "BackupScheduleInvalid",
                    format!("spec.backup.schedule: {e}"),
                )),
                ..Decision::default()
            }
        }
    };
    let Ok(now) = o.now.parse::<Timestamp>() else {
        return Decision::default();
    };
    let mut st = prev
        .scheduled_backups
        .clone()
        .filter(|s| s.schedule == schedule)
        .unwrap_or_else(|| ScheduledBackups {
            schedule: schedule.to_owned(),
            since: o.now.clone(),
            ..ScheduledBackups::default()
        });
    let names = crate::names::Names::of(relay).ok();
    let pod = |i: i32| names.as_ref().map(|n| n.pod(i)).unwrap_or_default();
    let replicas = relay.spec.replicas.max(0);
    // One entry per node of the spec, in ordinal order; a node's history stays with it.
    st.nodes = (0..replicas)
        .map(|i| {
            st.nodes
                .iter()
                .find(|n| n.name == pod(i))
                .cloned()
                .unwrap_or_else(|| NodeBackup {
                    name: pod(i),
                    ..NodeBackup::default()
                })
        })
        .collect();
    st.next_run = cron.next(now).map(|t| t.to_string());
    st.interval_seconds = cron.period_s(now).unwrap_or(0);

    if !st.running {
        let since = st.since.parse::<Timestamp>().unwrap_or(now);
        let last = st.run.as_deref().and_then(|r| r.parse::<Timestamp>().ok());
        match cron.prev(now) {
            Some(slot) if slot > since && last.is_none_or(|l| slot > l) => {
                st.run = Some(slot.to_string());
                st.running = true;
            }
            _ => {}
        }
    }
    let mut out = Decision::default();
    if st.running {
        let run = st.run.clone().unwrap_or_default();
        // The first node whose backup has not settled: its Job running, or to start.
        let mut unsettled: Option<(i32, String, bool)> = None;
        for (i, node) in st.nodes.iter_mut().enumerate() {
            let i = i as i32;
            let name = job_name(relay, i, &run);
            if node.last_job.as_deref() == Some(name.as_str()) {
                continue;
            }
            match o.scheduled.get(&i) {
                Some(JobObs::Succeeded) => {
                    node.last_success = Some(o.now.clone());
                    node.last_failure = None;
                    node.last_job = Some(name);
                }
                Some(JobObs::Failed(m)) => {
                    node.last_failure = Some(format!("backup Job {name} failed: {m}"));
                    node.last_job = Some(name);
                }
                Some(JobObs::Running) => {
                    unsettled = Some((i, name, true));
                    break;
                }
                None => {
                    unsettled = Some((i, name, false));
                    break;
                }
            }
        }
        match unsettled {
            // Every node of the run is settled.
            None => st.running = false,
            Some((_, _, true)) => {}
            Some((ordinal, name, false)) => {
                // A failed upgrade runs no Job of its own: its nodes are backed up as
                // scheduled (what a human deciding on a retry or a rollback needs).
                let upgrading = prev
                    .upgrade
                    .as_ref()
                    .is_some_and(|u| in_progress(u) && u.phase != UpgradePhase::Failed)
                    || prev
                        .restore
                        .as_ref()
                        .is_some_and(crate::restore::in_progress);
                let gate_running = o.backups.values().any(|j| *j == JobObs::Running);
                if let Some(problem) = crate::planner::backup_claim_problem(relay, o, ordinal) {
                    out.fault = Some(("BackupClaimNotReady", problem));
                } else if !upgrading && !gate_running {
                    let image = o
                        .statefulset
                        .as_ref()
                        .map(|s| s.image.clone())
                        .unwrap_or_else(|| relay.spec.image.clone());
                    out.jobs.push(JobAction::Backup {
                        ordinal,
                        target: image,
                        name,
                    });
                }
            }
        }
    }
    out.status = Some(st);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observed::{BackupClaimObs, StsObs};
    use ankusa_crds::status::UpgradeStatus;

    fn relay(schedule: &str) -> Relay {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "ankusa.dev/v1alpha1",
            "kind": "Relay",
            "metadata": { "name": "hooks", "namespace": "shop", "uid": "u1" },
            "spec": {
                "image": "relay:1",
                "replicas": 2,
                "backup": { "destination": { "claimName": "backups" }, "schedule": schedule },
            },
        }))
        .unwrap()
    }

    fn observed(now: &str) -> Observed {
        Observed {
            now: now.into(),
            backup_claim: Some(BackupClaimObs::Present {
                capacity_bytes: None,
            }),
            statefulset: Some(StsObs {
                image: "relay:1@sha256:aa".into(),
                partition: 0,
                ready_replicas: 2,
                updated_replicas: 2,
                replicas: 2,
            }),
            ..Observed::default()
        }
    }

    /// One decision, its status carried into the next as the controller does.
    fn step(r: &Relay, prev: &mut RelayStatus, o: &Observed) -> Decision {
        let d = decide(r, prev, o);
        prev.scheduled_backups = d.status.clone();
        d
    }

    fn job(d: &Decision) -> Option<(i32, String)> {
        match d.jobs.as_slice() {
            [] => None,
            [JobAction::Backup {
                ordinal,
                name,
                target,
            }] => {
                assert_eq!(target, "relay:1@sha256:aa", "the nodes' own release");
                Some((*ordinal, name.clone()))
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_run_backs_every_node_up_in_turn_and_records_each_outcome() {
        let r = relay("0 3 * * *");
        let mut prev = RelayStatus::default();
        // First seen at 02:10: nothing runs until 03:00.
        let d = step(&r, &mut prev, &observed("2027-01-01T02:10:00Z"));
        assert_eq!(job(&d), None);
        let st = d.status.unwrap();
        assert_eq!(st.since, "2027-01-01T02:10:00Z");
        assert_eq!(st.next_run.as_deref(), Some("2027-01-01T03:00:00Z"));
        assert_eq!(st.interval_seconds, 86_400);
        assert_eq!(st.nodes.len(), 2);
        let d = step(&r, &mut prev, &observed("2027-01-01T02:59:59Z"));
        assert_eq!(job(&d), None);

        // 03:00: node 0's Job, then nothing new while it runs.
        let mut o = observed("2027-01-01T03:00:05Z");
        let d = step(&r, &mut prev, &o);
        let (ordinal, first) = job(&d).unwrap();
        assert_eq!(ordinal, 0);
        assert_eq!(first, job_name(&r, 0, "2027-01-01T03:00:00Z"));
        assert!(first.starts_with("hooks-backup-0-"), "{first}");
        o.scheduled.insert(0, JobObs::Running);
        assert_eq!(job(&step(&r, &mut prev, &o)), None);

        // Node 0 succeeded: node 1 next; it fails, and the run ends with both settled.
        o.now = "2027-01-01T03:02:00Z".into();
        o.scheduled.insert(0, JobObs::Succeeded);
        let d = step(&r, &mut prev, &o);
        assert_eq!(job(&d).unwrap().0, 1);
        o.scheduled
            .insert(1, JobObs::Failed("BackoffLimitExceeded".into()));
        let d = step(&r, &mut prev, &o);
        assert_eq!(job(&d), None);
        let st = d.status.unwrap();
        assert!(!st.running);
        assert_eq!(
            st.nodes[0].last_success.as_deref(),
            Some("2027-01-01T03:02:00Z")
        );
        assert_eq!(st.nodes[1].last_success, None);
        assert!(st.nodes[1]
            .last_failure
            .as_deref()
            .unwrap()
            .contains("BackoffLimitExceeded"));

        // The Jobs are gone (their TTL) and nothing reruns until the next day's 03:00,
        // which backs node 0 up again.
        let mut o = observed("2027-01-01T20:00:00Z");
        assert_eq!(job(&step(&r, &mut prev, &o)), None);
        o.now = "2027-01-02T03:00:30Z".into();
        let (ordinal, name) = job(&step(&r, &mut prev, &o)).unwrap();
        assert_eq!(ordinal, 0);
        assert_ne!(name, first);
    }

    #[test]
    fn an_upgrade_or_a_missing_claim_holds_the_run_and_a_bad_schedule_is_a_fault() {
        let r = relay("*/5 * * * *");
        let mut prev = RelayStatus::default();
        step(&r, &mut prev, &observed("2027-01-01T00:01:00Z"));
        prev.upgrade = Some(UpgradeStatus {
            phase: UpgradePhase::BackingUp,
            target_image: Some("relay:2".into()),
            ..UpgradeStatus::default()
        });
        let o = observed("2027-01-01T00:05:10Z");
        let d = step(&r, &mut prev, &o);
        assert_eq!(job(&d), None, "the gate's backups go first");
        assert!(
            d.status.unwrap().running,
            "the run waits, it is not dropped"
        );
        // Failed, the upgrade takes no backup of its own: the run goes on.
        prev.upgrade.as_mut().unwrap().phase = UpgradePhase::Failed;
        let mut failed = prev.clone();
        assert_eq!(job(&step(&r, &mut failed, &o)).unwrap().0, 0);
        prev.upgrade = None;
        let mut o = observed("2027-01-01T00:06:00Z");
        o.backups.insert(2, JobObs::Running);
        assert_eq!(
            job(&step(&r, &mut prev, &o)),
            None,
            "one backup Job at a time"
        );
        o.backups.clear();
        o.backup_claim = Some(BackupClaimObs::Missing);
        let d = step(&r, &mut prev, &o);
        assert_eq!(job(&d), None);
        assert_eq!(d.fault.unwrap().0, "BackupClaimNotReady");
        o.backup_claim = Some(BackupClaimObs::Present {
            capacity_bytes: None,
        });
        assert_eq!(job(&step(&r, &mut prev, &o)).unwrap().0, 0);

        let d = decide(&relay("61 * * * *"), &RelayStatus::default(), &o);
        assert_eq!(d.fault.unwrap().0, "BackupScheduleInvalid");
        assert!(d.jobs.is_empty() && d.status.is_none());
    }
}
