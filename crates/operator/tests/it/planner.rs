//! Planner scenarios from YAML fixtures (`tests/fixtures/planner/*.yaml`).
//!
//! Each file names a `Relay` fixture (or patches one), the status the `Relay` carries, what
//! the cluster and the nodes report, and what the planner must decide: the StatefulSet's
//! image and partition, Jobs, the upgrade cursor's phase, which objects to create or
//! update, and a subset of the status. Owned objects are observed as `none` (nothing
//! exists) or `desired` (exactly what the spec asks for), with `drift` merged in.

use ankusa_crds::relay::Relay;
use ankusa_crds::status::RelayStatus;
use ankusa_operator::observed::{Observed, ObservedObjects};
use ankusa_operator::planner;
use ankusa_operator::resources::{DesiredSet, Surroundings};
use ankusa_operator::status;
use serde::Deserialize;
use serde_json::{json, Value};

use crate::support::{assert_contains, merge, relay_value, test_path};

#[derive(Deserialize)]
struct Scenario {
    relay: String,
    #[serde(default)]
    spec: Value,
    #[serde(default)]
    status: Option<RelayStatus>,
    #[serde(default)]
    observed: Observed,
    /// `none` or `desired`.
    #[serde(default = "none")]
    objects: String,
    #[serde(default)]
    drift: Value,
    expect: Value,
}

fn none() -> String {
    "none".into()
}

fn desired_objects(
    relay: &Relay,
    user: Option<&Value>,
    partition: i32,
    around: &Surroundings,
) -> ObservedObjects {
    let d = DesiredSet::build_with(relay, user, partition, around).unwrap();
    ObservedObjects {
        config_map: Some(j(&d.config_map)),
        headless: Some(j(&d.headless)),
        client: Some(j(&d.client)),
        statefulset: Some(j(&d.statefulset)),
        pdb: Some(j(&d.pdb)),
        service_monitor: d.service_monitor.as_ref().map(j),
        ingest_service: Some(j(&d.ingest_service)),
        ingress: d.ingress.as_ref().map(j),
        http_route: d.http_route.as_ref().map(j),
        network_policy: d.network_policy.as_ref().map(j),
        ..ObservedObjects::default()
    }
}

fn j<T: serde::Serialize>(t: &T) -> Value {
    serde_json::to_value(t).unwrap()
}

fn run(file: &str) {
    let path = test_path(&format!("fixtures/planner/{file}"));
    let text = std::fs::read_to_string(&path).unwrap();
    // Through JSON, so enums read as `{ Ok: ... }` rather than YAML tags.
    let v: Value = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let route_api = v["observed"]["http_route_api"].as_bool();
    let sc: Scenario = serde_json::from_value(v).unwrap_or_else(|e| panic!("{file}: {e}"));
    let mut rv = relay_value(&sc.relay);
    if !sc.spec.is_null() {
        merge(&mut rv["spec"], &sc.spec);
    }
    let relay: Relay = serde_json::from_value(rv).unwrap();
    let prev = sc.status.clone().unwrap_or_default();
    let mut o = sc.observed;
    // The fixtures' clusters serve the Gateway API unless one says otherwise.
    o.http_route_api = route_api.unwrap_or(true);
    o.now = "2026-11-30T00:00:00Z".into();

    // First the rollout (it decides the image and partition the objects are compared at).
    let r = planner::rollout(&relay, &prev, &o);
    let monitor = planner::monitor_decision(&relay, &o);
    let around = Surroundings {
        service_monitor: monitor == planner::MonitorDecision::Applied,
        http_route_api: o.http_route_api,
        owners: ankusa_operator::drain::handoff_capable(&o).then_some(relay.spec.replicas),
        ..Surroundings::default()
    };
    let user = relay.spec.config.inline.clone();
    if sc.objects == "desired" {
        // What the cluster holds: what the spec asked for at the observed state.
        let mut steady = relay.clone();
        if let Some(s) = &o.statefulset {
            steady.spec.image = s.image.clone();
        }
        let partition = o.statefulset.as_ref().map(|s| s.partition).unwrap_or(0);
        let mut objs =
            serde_json::to_value(desired_objects(&steady, user.as_ref(), partition, &around))
                .unwrap();
        if !sc.drift.is_null() {
            merge(&mut objs, &sc.drift);
        }
        o.objects = serde_json::from_value(objs).unwrap();
    }
    let mut effective = relay.clone();
    effective.spec.image = r.image.clone();
    effective.spec.replicas = r.replicas;
    let desired = DesiredSet::build_with(&effective, user.as_ref(), r.partition, &around).unwrap();
    let changes = planner::changes(&desired, &o.objects);
    let scheduled = ankusa_operator::backups::decide(&relay, &prev, &o);
    let st = status::status(&relay, &prev, &o, &r, &monitor, &scheduled).0;

    let conditions: serde_json::Map<String, Value> = st
        .conditions
        .iter()
        .map(|c| (c.type_.clone(), json!({ "status": c.status, "reason": c.reason, "observedGeneration": c.observed_generation })))
        .collect();
    let actual = json!({
        "image": r.image,
        "partition": r.partition,
        "jobs": r.jobs,
        "upgradePhase": r.upgrade.as_ref().map(|u| u.phase),
        "upgrade": r.upgrade,
        "hold": r.hold.as_ref().map(|h| h.reason),
        "holdStatefulset": r.hold_statefulset,
        "stopPod": r.stop_pod,
        "claims": r.claims,
        "changes": changes,
        "statefulset": serde_json::to_value(&desired.statefulset).unwrap(),
        "status": serde_json::to_value(&st).unwrap(),
        "conditions": conditions,
    });
    assert_contains(&actual, &sc.expect, file);
    // Every condition describes this generation.
    for c in &st.conditions {
        assert_eq!(
            c.observed_generation,
            relay.metadata.generation.unwrap(),
            "{file}: {}",
            c.type_
        );
    }
    assert_eq!(st.observed_generation, relay.metadata.generation, "{file}");
}

macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                run(concat!(stringify!($name), ".yaml"));
            }
        )*

        /// Every fixture file has a test above.
        #[test]
        fn every_planner_fixture_is_run() {
            let listed = [$(concat!(stringify!($name), ".yaml")),*];
            for entry in std::fs::read_dir(test_path("fixtures/planner")).unwrap() {
                let name = entry.unwrap().file_name().into_string().unwrap();
                assert!(listed.contains(&name.as_str()), "{name} is not run by any test");
            }
        }
    };
}

scenarios!(
    creates_everything_for_a_new_relay,
    a_node_restore_stops_that_node_alone,
    a_node_restore_runs_its_job_once_the_pod_is_gone,
    a_node_restore_completes_and_starts_the_node_again,
    a_node_restore_of_a_node_that_does_not_exist_is_refused,
    a_node_restore_waits_for_the_upgrade_under_way,
    a_relay_created_over_retained_claims_probes_its_image_first,
    a_relay_created_over_retained_claims_backs_them_up_before_its_statefulset,
    a_relay_created_over_retained_claims_starts_once_they_are_backed_up,
    a_relay_created_over_retained_claims_with_no_backup_destination_holds,
    nothing_to_do_when_everything_matches,
    updates_a_drifted_statefulset,
    scales_up,
    scales_down_keeping_every_claim,
    reports_nodes_and_tenants,
    reports_a_node_that_does_not_answer,
    service_monitor_without_its_api_is_a_condition,
    same_format_release_rolls_without_a_gate,
    same_format_roll_keeps_going_while_a_pod_restarts,
    new_image_is_probed_before_any_pod_moves,
    format_change_holds_pods_and_starts_backups,
    backups_done_lower_the_partition_by_one,
    a_verified_pod_backs_up_the_next_node_before_it_moves,
    a_missing_statefulset_comes_back_on_the_running_release,
    a_missing_statefulset_keeps_the_running_release,
    a_scale_up_waits_for_the_upgrade,
    retained_claims_are_backed_up_before_the_first_node_moves,
    a_node_not_verified_in_time_fails_the_upgrade,
    a_fixed_image_rolls_forward_from_a_failed_upgrade,
    a_fix_of_a_lower_format_is_refused,
    a_first_install_that_never_started_takes_a_corrected_image,
    a_pause_never_raises_the_partition_above_a_moved_pod,
    a_probed_release_runs_by_digest,
    a_pinned_fleet_stays_on_its_digest,
    unverified_pod_holds_the_partition,
    failed_backup_stops_the_upgrade,
    crash_looping_pod_fails_the_upgrade,
    retry_token_resumes_a_failed_upgrade,
    third_target_waits_for_the_upgrade,
    older_format_is_refused,
    last_pod_verified_completes_the_upgrade,
    backup_jobs_run_one_at_a_time,
    a_missing_backup_claim_holds_the_upgrade,
    a_bootstrap_restores_each_node_before_the_statefulset,
    a_bootstrap_restores_the_next_node_and_then_starts_them,
    a_bootstrap_never_replaces_a_store_that_exists,
    a_bootstrap_waits_for_the_claim_of_its_backups,
    a_failed_restore_stops_until_a_retry,
    a_rollback_stops_every_node_first,
    a_rollback_from_a_claim_without_an_archive_at_the_format_stops_nothing,
    a_rollback_to_a_volume_without_room_for_its_archive_stops_nothing,
    a_rollback_restores_at_the_release_format_then_starts_it,
    a_rollback_completes_on_the_older_release,
    a_rollback_taken_out_of_the_spec_is_cancelled,
    a_backup_claim_too_small_holds_the_upgrade,
    a_backup_claim_with_room_lets_the_backups_start,
    a_backup_claim_full_of_older_archives_holds_the_upgrade,
    a_backup_claim_with_free_room_left_lets_the_backup_start,
    a_scale_down_keeps_the_leaving_node_until_it_is_drained,
    a_drained_leaving_node_lets_the_statefulset_shrink,
    a_leaving_node_that_does_not_answer_holds_the_scale_down,
    a_scale_down_of_nodes_that_cannot_hand_over_shrinks_at_once,
    a_format_change_with_only_an_object_store_waits_for_fresh_backups,
    a_format_change_moves_over_fresh_backups_in_the_object_store,
    a_bootstrap_from_a_bucket_restores_each_node_without_a_claim,
    a_rollback_from_a_bucket_without_a_backup_at_the_format_stops_nothing,
);

/// A reference names an image by its tag or pinned to a digest; only a repository digest
/// from a container's image ID pins.
#[test]
fn images_are_pinned_by_repository_digest_only() {
    let d = format!("sha256:{}", "ab".repeat(32));
    assert!(ankusa_operator::observed::names_image("r/x:1", "r/x:1"));
    assert!(ankusa_operator::observed::names_image(
        "r/x:1",
        &format!("r/x:1@{d}")
    ));
    assert!(!ankusa_operator::observed::names_image("r/x:1", "r/x:10"));
    assert!(!ankusa_operator::observed::names_image(
        "r/x:1",
        &format!("r/x:10@{d}")
    ));
    use ankusa_operator::controller::observe::repository_digest;
    assert_eq!(
        repository_digest(&format!("docker-pullable://r/x@{d}")),
        Some(d.clone())
    );
    assert_eq!(repository_digest(&format!("r/x@{d}")), Some(d.clone()));
    // A local image ID is not a digest a registry serves.
    assert_eq!(repository_digest(&d), None);
    assert_eq!(repository_digest("r/x@sha256:short"), None);
    assert_eq!(repository_digest(""), None);
}
