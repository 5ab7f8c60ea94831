//! The operator among others, on the real kube-apiserver: an object at one of a Relay's
//! names that is not the Relay's is never taken (a user's ConfigMap, another Relay's
//! Service), the Relay says which and whose, with a Warning Event; each Relay applies
//! under a field manager of its own, and objects the shared manager of earlier releases
//! applied move to it; pods that cannot be created are a condition and an Event.

use std::time::Duration;

use ankusa_operator::controller::{field_manager, FIELD_MANAGER};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::{json, Value};

use crate::cluster;
use crate::reconcile::{condition, context, create_relay, get_json, reconcile, set_up, NOWHERE};

/// The Warning Events of `reason` on the Relays of `ns`.
async fn warnings(admin: &Client, ns: &str, reason: &str) -> Vec<String> {
    cluster::events(admin, ns)
        .await
        .into_iter()
        .filter(|e| e.type_.as_deref() == Some("Warning") && e.reason.as_deref() == Some(reason))
        .map(|e| e.note.unwrap_or_default())
        .collect()
}

fn controllers(obj: &Value) -> Vec<String> {
    obj["metadata"]["ownerReferences"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|r| r["controller"] == true)
        .map(|r| {
            format!(
                "{} {}",
                r["kind"].as_str().unwrap(),
                r["name"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn a_users_config_map_at_the_relays_name_is_never_taken_and_the_relay_says_so() {
    let admin = cluster::admin().await;
    let (op, _) = cluster::operator_client().await;
    let ns = cluster::namespace(&admin, "foreign-cm").await;
    // The user's own ConfigMap, named as the operator names the one it writes.
    let mine: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": "relay-config" },
        "data": { "relay.yaml": "# the user's\n" },
    }))
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), &ns);
    cms.create(&PostParams::default(), &mine).await.unwrap();
    create_relay(&admin, &ns, "minimal", json!({})).await;
    let ctx = context(op, NOWHERE);
    reconcile(&ctx, &ns, "relay").await.unwrap();

    let cm = get_json::<ConfigMap>(&admin, &ns, "relay-config")
        .await
        .unwrap();
    assert_eq!(cm["data"]["relay.yaml"], "# the user's\n", "{cm:#}");
    assert!(controllers(&cm).is_empty(), "{cm:#}");
    assert!(
        get_json::<StatefulSet>(&admin, &ns, "relay")
            .await
            .is_none(),
        "nothing of the Relay is applied while one of its names is taken"
    );
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_eq!(degraded["status"], "True");
    assert_eq!(degraded["reason"], "ObjectNotOwned");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains("ConfigMap/relay-config belongs to no controller"),
        "{message}"
    );
    // One Warning Event, not one a reconcile.
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let events = warnings(&admin, &ns, "ObjectNotOwned").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].contains("ConfigMap/relay-config"), "{events:?}");

    // The user moves it away: the Relay is made.
    cms.delete("relay-config", &Default::default())
        .await
        .unwrap();
    reconcile(&ctx, &ns, "relay").await.unwrap();
    assert!(get_json::<StatefulSet>(&admin, &ns, "relay")
        .await
        .is_some());
    let cm = get_json::<ConfigMap>(&admin, &ns, "relay-config")
        .await
        .unwrap();
    assert_eq!(controllers(&cm), ["Relay relay"]);
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_ne!(degraded["reason"], "ObjectNotOwned", "{degraded:#}");
}

#[tokio::test]
async fn a_config_map_ref_naming_the_config_map_the_operator_writes_is_refused() {
    let admin = cluster::admin().await;
    let ns = cluster::namespace(&admin, "cmref-self").await;
    let mut v = crate::support::relay_value("minimal");
    for k in ["uid", "generation", "resourceVersion"] {
        v["metadata"].as_object_mut().unwrap().remove(k);
    }
    v["metadata"]["namespace"] = json!(ns);
    v["spec"]["config"] = json!({ "configMapRef": { "name": "relay-config" } });
    let relay: ankusa_crds::relay::Relay = serde_json::from_value(v).unwrap();
    let err = Api::<ankusa_crds::relay::Relay>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &relay)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("may not name <Relay name>-config"),
        "{err}"
    );
}

#[tokio::test]
async fn two_relays_whose_names_collide_never_take_each_others_service() {
    let (admin, ns, ctx) = set_up(
        "collide",
        "minimal",
        json!({ "metadata": { "name": "hooks" } }),
    )
    .await;
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    let ingest = get_json::<Service>(&admin, &ns, "hooks-ingest")
        .await
        .unwrap();
    assert_eq!(controllers(&ingest), ["Relay hooks"]);

    // `hooks-ingest`'s client Service would be `hooks`' ingest Service.
    create_relay(
        &admin,
        &ns,
        "minimal",
        json!({ "metadata": { "name": "hooks-ingest" } }),
    )
    .await;
    reconcile(&ctx, &ns, "hooks-ingest").await.unwrap();
    reconcile(&ctx, &ns, "hooks").await.unwrap();
    let after = get_json::<Service>(&admin, &ns, "hooks-ingest")
        .await
        .unwrap();
    assert_eq!(controllers(&after), ["Relay hooks"], "{after:#}");
    assert_eq!(after["spec"]["selector"], ingest["spec"]["selector"]);
    assert!(get_json::<StatefulSet>(&admin, &ns, "hooks-ingest")
        .await
        .is_none());
    let degraded = condition(&admin, &ns, "hooks-ingest", "Degraded").await;
    assert_eq!(degraded["reason"], "ObjectNotOwned");
    assert!(
        degraded["message"]
            .as_str()
            .unwrap()
            .contains("Service/hooks-ingest belongs to Relay hooks"),
        "{degraded:#}"
    );
    // The first Relay is untouched by the second.
    let first = condition(&admin, &ns, "hooks", "Degraded").await;
    assert_ne!(first["reason"], "ObjectNotOwned", "{first:#}");
}

/// The managers of `obj` that applied it (not its status).
fn appliers(obj: &Value) -> Vec<String> {
    obj["metadata"]["managedFields"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|m| m["operation"] == "Apply" && m.get("subresource").is_none())
        .map(|m| m["manager"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn objects_the_shared_field_manager_applied_move_to_the_relays_own_and_its_stale_fields_go() {
    let (admin, ns, ctx) = set_up("manager", "minimal", json!({})).await;
    let op = ctx.client.clone();
    reconcile(&ctx, &ns, "relay").await.unwrap();
    let own = field_manager("relay");
    let svc = get_json::<Service>(&admin, &ns, "relay-ingest")
        .await
        .unwrap();
    assert_eq!(appliers(&svc), std::slice::from_ref(&own));

    // As an earlier release left it: the shared manager applied the object too, with a
    // label this release no longer sets.
    let mut legacy = svc.clone();
    let meta = legacy["metadata"].as_object_mut().unwrap();
    for k in [
        "managedFields",
        "resourceVersion",
        "uid",
        "creationTimestamp",
        "generation",
    ] {
        meta.remove(k);
    }
    legacy["metadata"]["labels"]["ankusa.dev/legacy"] = json!("yes");
    legacy.as_object_mut().unwrap().remove("status");
    Api::<Service>::namespaced(op.clone(), &ns)
        .patch(
            "relay-ingest",
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&legacy),
        )
        .await
        .unwrap();
    let before = get_json::<Service>(&admin, &ns, "relay-ingest")
        .await
        .unwrap();
    assert_eq!(appliers(&before).len(), 2, "{:#}", before["metadata"]);

    reconcile(&ctx, &ns, "relay").await.unwrap();
    let after = get_json::<Service>(&admin, &ns, "relay-ingest")
        .await
        .unwrap();
    assert_eq!(appliers(&after), [own], "{:#}", after["metadata"]);
    assert!(
        after["metadata"]["labels"]
            .get("ankusa.dev/legacy")
            .is_none(),
        "the field only the shared manager set goes: {:#}",
        after["metadata"]
    );
    assert_eq!(after["spec"]["selector"], svc["spec"]["selector"]);
    assert_eq!(controllers(&after), ["Relay relay"]);
}

#[tokio::test]
async fn pods_that_cannot_be_created_are_a_condition_and_a_warning_event() {
    let (admin, ns, ctx) = set_up(
        "no-class",
        "minimal",
        json!({ "spec": { "priorityClassName": "no-such-class" } }),
    )
    .await;
    reconcile(&ctx, &ns, "relay").await.unwrap();
    assert!(get_json::<StatefulSet>(&admin, &ns, "relay")
        .await
        .is_some());
    // The StatefulSet controller tries to make the pod; admission refuses it.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    let degraded = loop {
        reconcile(&ctx, &ns, "relay").await.unwrap();
        let d = condition(&admin, &ns, "relay", "Degraded").await;
        if d["message"]
            .as_str()
            .unwrap_or("")
            .contains("cannot be created")
        {
            break d;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "never reported: {d:#}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let message = degraded["message"].as_str().unwrap();
    assert!(message.contains("StatefulSet relay"), "{message}");
    assert!(message.contains("no-such-class"), "{message}");
    let events = warnings(&admin, &ns, "PodCreateFailed").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].contains("no-such-class"), "{events:?}");
}

/// An operator context of the install whose Lease is `lease_ns/ankusa-operator`.
fn install_context(
    op: Client,
    lease_ns: &str,
) -> std::sync::Arc<ankusa_operator::controller::Context> {
    let install = ankusa_operator::controller::claim::Install {
        namespace: lease_ns.into(),
        lease: "ankusa-operator".into(),
    };
    let settings = ankusa_operator::controller::Settings {
        install: Some(install),
        ..crate::reconcile::settings(NOWHERE)
    };
    crate::reconcile::context_with(op, settings)
}

/// The leader Lease of the install in `ns`, as its leader holds it.
async fn hold_lease(admin: &Client, ns: &str) {
    use k8s_openapi::api::coordination::v1::Lease;
    let lease: Lease = serde_json::from_value(json!({
        "metadata": { "name": "ankusa-operator" },
        "spec": { "holderIdentity": format!("{ns}-0"), "leaseDurationSeconds": 15 },
    }))
    .unwrap();
    Api::<Lease>::namespaced(admin.clone(), ns)
        .create(&PostParams::default(), &lease)
        .await
        .unwrap();
}

async fn managed_by(admin: &Client, ns: &str) -> Option<String> {
    let relay = get_json::<ankusa_crds::relay::Relay>(admin, ns, "relay")
        .await
        .unwrap();
    relay["status"]["operator"].as_str().map(str::to_owned)
}

/// Two operator installs watch one Relay (two chart releases, each with a leader): the
/// first to reconcile it names itself in `status.operator` and manages it; the other
/// changes nothing of it — no object applied, no status written — and says so in a Warning
/// Event, which the managing install reports in `Degraded`. Once the managing install is
/// gone (its Lease with it), the other takes the Relay over.
#[tokio::test]
async fn a_second_install_leaves_a_relay_to_the_install_that_manages_it_until_it_is_gone() {
    let (admin, ns, _) = set_up("installs", "minimal", json!({})).await;
    let (op, _) = cluster::operator_client().await;
    let first = cluster::namespace(&admin, "install-a").await;
    let second = cluster::namespace(&admin, "install-b").await;
    hold_lease(&admin, &first).await;
    hold_lease(&admin, &second).await;
    let (a, b) = (
        install_context(op.clone(), &first),
        install_context(op, &second),
    );
    let (a_id, b_id) = (
        format!("{first}/ankusa-operator"),
        format!("{second}/ankusa-operator"),
    );

    reconcile(&a, &ns, "relay").await.unwrap();
    assert_eq!(
        managed_by(&admin, &ns).await.as_deref(),
        Some(a_id.as_str())
    );
    // The second install: it writes nothing but its Events, and says why.
    let audit = crate::cluster::Audit::mark();
    reconcile(&b, &ns, "relay").await.unwrap();
    reconcile(&b, &ns, "relay").await.unwrap();
    let writes: Vec<String> = audit
        .writes(crate::cluster::OPERATOR_USER, &ns)
        .into_iter()
        .filter(|w| w.resource != "events")
        .map(|w| format!("{} {}", w.verb, w.uri))
        .collect();
    assert!(writes.is_empty(), "the second install wrote: {writes:#?}");
    assert_eq!(
        managed_by(&admin, &ns).await.as_deref(),
        Some(a_id.as_str())
    );
    let said = warnings(&admin, &ns, "ManagedByAnotherOperator").await;
    assert!(
        said.iter()
            .any(|n| n.contains(&b_id) && n.contains(&format!("leaves it to {a_id}"))),
        "{said:?}"
    );
    // The managing install reports it.
    reconcile(&a, &ns, "relay").await.unwrap();
    let degraded = condition(&admin, &ns, "relay", "Degraded").await;
    assert_eq!(degraded["status"], "True", "{degraded:#}");
    let message = degraded["message"].as_str().unwrap();
    assert!(
        message.contains(&format!(
            "the operator install {b_id} watches this Relay too"
        )),
        "{message}"
    );

    // The first install is uninstalled: its Lease goes, and the second takes over.
    Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), &first)
        .delete("ankusa-operator", &Default::default())
        .await
        .unwrap();
    reconcile(&b, &ns, "relay").await.unwrap();
    assert_eq!(
        managed_by(&admin, &ns).await.as_deref(),
        Some(b_id.as_str())
    );
    let sts = get_json::<StatefulSet>(&admin, &ns, "relay").await.unwrap();
    let managers: Vec<&str> = sts["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f["manager"].as_str())
        .collect();
    assert!(
        managers.contains(&field_manager("relay").as_str()),
        "{managers:?}"
    );
    // A reinstalled first install (its Lease back) now leaves the Relay to the second.
    hold_lease(&admin, &first).await;
    reconcile(&a, &ns, "relay").await.unwrap();
    assert_eq!(
        managed_by(&admin, &ns).await.as_deref(),
        Some(b_id.as_str())
    );
    let said = warnings(&admin, &ns, "ManagedByAnotherOperator").await;
    assert!(
        said.iter()
            .any(|n| n.contains(&a_id) && n.contains(&format!("leaves it to {b_id}"))),
        "{said:?}"
    );
}
