//! The nodes as objects: the StatefulSet, its pods' scheduling, labels and annotations,
//! their shutdown timing, and the PodDisruptionBudget.

use std::collections::BTreeMap;

use ankusa_crds::relay::Relay;
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use serde_json::{json, Value};

use super::jobs::{claim_spec, container_security, pod_security};
use super::{
    labels, metadata, selector_labels, typed, ADMIN_PORT, CONFIG_HASH_ANNOTATION, CONFIG_KEY,
    CONFIG_MOUNT, DATA_MOUNT, INGEST_PORT, TOKEN_MOUNT,
};
use crate::names::{Names, ResourceError};

/// The StatefulSet. `partition` holds ordinals below it on their current revision (the
/// upgrade gate lowers it one ordinal at a time); `config_hash` rolls the pods when what
/// `relay.yaml` says that a node cannot reload changes.
pub fn statefulset(
    relay: &Relay,
    partition: i32,
    config_hash: &str,
    shutdown_grace_ms: u64,
) -> Result<StatefulSet, ResourceError> {
    let names = Names::of(relay)?;
    let spec = &relay.spec;
    let mut container = json!({
        "name": "relay",
        "image": spec.image,
        "args": ["run", "--config", format!("{CONFIG_MOUNT}/{CONFIG_KEY}")],
        "ports": [
            { "name": "ingest", "containerPort": INGEST_PORT, "protocol": "TCP" },
            { "name": "admin", "containerPort": ADMIN_PORT, "protocol": "TCP" },
        ],
        "volumeMounts": [
            { "name": "data", "mountPath": DATA_MOUNT },
            { "name": "config", "mountPath": CONFIG_MOUNT, "readOnly": true },
            { "name": "operator-token", "mountPath": TOKEN_MOUNT, "readOnly": true },
        ],
        // Ready means the store is open, migrated and the listeners are up; a node
        // migrating its store is alive but not ready.
        "readinessProbe": {
            "httpGet": { "path": "/readyz", "port": "admin" },
            "periodSeconds": 5,
            "failureThreshold": 2,
        },
        // `/healthz` answers from the node's first second, before its store opens; the
        // startup budget (`spec.startupSeconds`) covers the container's own start, and
        // liveness is checked only after it.
        "startupProbe": {
            "httpGet": { "path": "/healthz", "port": "admin" },
            "periodSeconds": ankusa_crds::relay::STARTUP_PROBE_PERIOD_S,
            "failureThreshold": startup_failure_threshold(spec.startup_seconds),
        },
        "livenessProbe": {
            "httpGet": { "path": "/healthz", "port": "admin" },
            "periodSeconds": 10,
            "failureThreshold": 6,
        },
        "securityContext": container_security(),
        // Endpoints drop the pod before it stops taking hooks: SIGTERM comes after this.
        "lifecycle": { "preStop": { "sleep": { "seconds": PRE_STOP_S } } },
    });
    // Each node's name in `cluster.nodes` is its pod's (`apiVersion` written out: the API
    // server would add it, and a field it adds would read as drift on every poll).
    let mut env = vec![json!({
        "name": "ANKUSA_CLUSTER__NAME",
        "valueFrom": { "fieldRef": { "apiVersion": "v1", "fieldPath": "metadata.name" } },
    })];
    env.extend(spec.config.secret_env.iter().map(|e| {
        json!({
            "name": e.name,
            "valueFrom": { "secretKeyRef": e.secret_key_ref },
        })
    }));
    container["env"] = json!(env);
    let mut volumes = vec![
        json!({ "name": "config", "configMap": { "name": names.config_map } }),
        json!({ "name": "operator-token", "secret": { "secretName": names.token_secret } }),
    ];
    // A source's `tenant_secrets: { dir }`: each Secret a directory, a file per key, which
    // the kubelet updates in place (the node's reload watch sees its `..data` swap).
    for (i, dir) in spec.config.secret_dirs.iter().enumerate() {
        let volume = format!("secret-dir-{i}");
        volumes.push(json!({ "name": volume, "secret": { "secretName": dir.name } }));
        if let Some(mounts) = container["volumeMounts"].as_array_mut() {
            mounts.push(json!({
                "name": volume,
                "mountPath": format!("{}/{}", ankusa_crds::relay::SECRET_DIRS_MOUNT, dir.name),
                "readOnly": true,
            }));
        }
    }
    if let Some((volume, mount)) = ca_bundle_volume(&spec.config) {
        volumes.push(volume);
        if let Some(mounts) = container["volumeMounts"].as_array_mut() {
            mounts.push(mount);
        }
    }
    if let Some(policy) = &spec.image_pull_policy {
        container["imagePullPolicy"] = json!(policy);
    }
    container["resources"] = match &spec.resources {
        Some(resources) => json!(resources),
        None => json!({ "requests": {
            "cpu": ankusa_crds::relay::DEFAULT_CPU_REQUEST,
            "memory": ankusa_crds::relay::DEFAULT_MEMORY_REQUEST,
        } }),
    };
    let claim_spec = claim_spec(relay);
    let mut set = json!({
            "apiVersion": "apps/v1",
            "kind": "StatefulSet",
            "metadata": metadata(relay, &names.statefulset)?,
            "spec": {
                "replicas": spec.replicas,
                "serviceName": names.headless,
                // Nodes are independent stores: start them together; the upgrade gate,
                // not the pod management policy, orders a format change.
                "podManagementPolicy": "Parallel",
                // A scale-down shrinks only once the nodes it takes out are drained (the
                // planner's `drain`), so deleting their claims then loses nothing; a
                // deleted Relay keeps every claim.
                "persistentVolumeClaimRetentionPolicy": {
                    "whenScaled": match spec.storage.when_scaled.unwrap_or_default() {
                        ankusa_crds::relay::ClaimRetention::Retain => "Retain",
                        ankusa_crds::relay::ClaimRetention::Delete => "Delete",
                    },
                    "whenDeleted": "Retain",
                },
                "selector": { "matchLabels": selector_labels(&names.relay) },
                "updateStrategy": {
                    "type": "RollingUpdate",
                    "rollingUpdate": { "partition": partition },
                },
                "template": {
                    "metadata": {
                        "labels": pod_labels(relay, labels(&names.relay)),
                        "annotations": pod_annotations(relay, [(CONFIG_HASH_ANNOTATION, config_hash)]),
                    },
                    "spec": {
                        // The node's own grace for deliveries in flight, after the preStop
                        // pause, with room to sync and exit: a SIGKILL never cuts a
                        // graceful stop short.
                        "terminationGracePeriodSeconds": termination_grace_s(shutdown_grace_ms),
                        // No `<SERVICE>_SERVICE_HOST` variables for every Service in the
                        // namespace: the relay needs none, and they only crowd its env.
                        "enableServiceLinks": false,
                        "securityContext": pod_security(),
                        "containers": [container],
                        "volumes": volumes,
                        "automountServiceAccountToken": false,
                    },
                },
                "volumeClaimTemplates": [{
                    "metadata": { "name": "data", "labels": selector_labels(&names.relay) },
                    "spec": claim_spec,
                }],
            },
    });
    let pod = &mut set["spec"]["template"]["spec"];
    if let Some(s) = spec.object_store() {
        crate::objstore::add_to_pod(pod, s);
    }
    scheduling(relay, pod);
    let own = json!({ "matchLabels": selector_labels(&names.relay) });
    pod["affinity"] = match &spec.affinity {
        Some(a) => json!(a),
        // Spread the nodes over hosts where the cluster can: one host's loss takes one node.
        None => json!({ "podAntiAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [{
                "weight": 100,
                "podAffinityTerm": { "labelSelector": own, "topologyKey": "kubernetes.io/hostname" },
            }],
        } }),
    };
    if !spec.topology_spread_constraints.is_empty() {
        let mut constraints = json!(spec.topology_spread_constraints);
        for c in constraints.as_array_mut().into_iter().flatten() {
            if c.get("labelSelector").is_none() {
                c["labelSelector"] = own.clone();
            }
        }
        pod["topologySpreadConstraints"] = constraints;
    }
    typed("StatefulSet", set)
}

/// What the relay pods and the Jobs' pods share from the spec: image pull secrets,
/// tolerations, node selector, priority class and ServiceAccount.
pub(super) fn scheduling(relay: &Relay, pod: &mut Value) {
    let spec = &relay.spec;
    if !spec.image_pull_secrets.is_empty() {
        pod["imagePullSecrets"] = json!(spec.image_pull_secrets);
    }
    if !spec.tolerations.is_empty() {
        pod["tolerations"] = json!(spec.tolerations);
    }
    if !spec.node_selector.is_empty() {
        pod["nodeSelector"] = json!(spec.node_selector);
    }
    if let Some(class) = &spec.priority_class_name {
        pod["priorityClassName"] = json!(class);
    }
    if let Some(account) = &spec.service_account_name {
        pod["serviceAccountName"] = json!(account);
    }
}

/// A pod's labels: the operator's `own`, and the spec's `podLabels` (which admission keeps
/// off the operator's keys; the operator's win all the same).
pub(super) fn pod_labels(relay: &Relay, own: BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut l = relay.spec.pod_labels.clone();
    l.extend(own);
    l
}

/// A pod's annotations: the spec's `podAnnotations` and the operator's `own`.
pub(super) fn pod_annotations<'a>(
    relay: &Relay,
    own: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> BTreeMap<String, String> {
    let mut a = relay.spec.pod_annotations.clone();
    a.extend(own.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())));
    a
}

/// The startupProbe's failure threshold for a budget of `seconds`.
pub fn startup_failure_threshold(seconds: i64) -> i64 {
    (seconds + ankusa_crds::relay::STARTUP_PROBE_PERIOD_S - 1)
        / ankusa_crds::relay::STARTUP_PROBE_PERIOD_S
}

/// The pause before a relay container gets SIGTERM, for endpoint controllers and load
/// balancers to stop sending it hooks.
pub const PRE_STOP_S: i64 = 5;

/// The pod's termination grace: the preStop pause, the node's `shutdown.grace_ms`, and 10
/// s to commit, sync and exit.
pub fn termination_grace_s(shutdown_grace_ms: u64) -> i64 {
    PRE_STOP_S + i64::try_from(shutdown_grace_ms.div_ceil(1000)).unwrap_or(600) + 10
}

/// `shutdown.grace_ms` of a relay configuration (the relay's default when unset).
pub fn shutdown_grace_ms(cfg: &Value) -> u64 {
    cfg.pointer("/shutdown/grace_ms")
        .and_then(Value::as_u64)
        .unwrap_or(20_000)
}

/// At most one node down by voluntary eviction: a node down stops its tenants' ingest.
pub fn pdb(relay: &Relay) -> Result<PodDisruptionBudget, ResourceError> {
    let names = Names::of(relay)?;
    typed(
        "PodDisruptionBudget",
        json!({
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": metadata(relay, &names.pdb)?,
            "spec": {
                "maxUnavailable": 1,
                "selector": { "matchLabels": selector_labels(&names.relay) },
            },
        }),
    )
}

/// `config.caBundleRef`'s volume and mount: the bundle's one key as `ca.crt`, which the
/// kubelet updates in place when it rotates (the node reads it again without a restart).
fn ca_bundle_volume(config: &ankusa_crds::relay::ConfigSpec) -> Option<(Value, Value)> {
    let bundle = config.ca_bundle_ref.as_ref()?;
    let items = |key: &str| json!([{ "key": key, "path": "ca.crt" }]);
    let volume = match (&bundle.secret, &bundle.config_map) {
        (Some(k), _) => json!({
            "name": "ca-bundle",
            "secret": { "secretName": k.name, "items": items(&k.key) },
        }),
        (None, Some(k)) => json!({
            "name": "ca-bundle",
            "configMap": { "name": k.name, "items": items(&k.key) },
        }),
        (None, None) => return None,
    };
    let mount = json!({
        "name": "ca-bundle",
        "mountPath": ankusa_crds::relay::CA_BUNDLE_MOUNT,
        "readOnly": true,
    });
    Some((volume, mount))
}
