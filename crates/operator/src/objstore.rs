//! `spec.backup.objectStore`: what the nodes are told (their configuration's
//! `backup.object_store`, the credentials and CA bundle in their pods), what a format
//! change waits for when no claim takes archives, and what the status says of the pushes.
//!
//! The nodes push on their own (a node's schedule does not stop for an upgrade held or
//! failed: that is when a backup matters most); the operator only reads what they report
//! in `GET /v1/node`.

use ankusa_api::node::ObjectBackups;
use ankusa_crds::relay::{ObjectStoreSpec, Relay};
use k8s_openapi::jiff::Timestamp;
use serde_json::{json, Value};

use crate::observed::Observed;

/// Where a pod finds the CA bundle.
pub const CA_MOUNT: &str = "/etc/ankusa/objstore-ca";
/// The bundle's file name there.
const CA_FILE: &str = "ca.pem";
/// The pod volume holding it.
const CA_VOLUME: &str = "objstore-ca";

/// The region when the spec names none.
const DEFAULT_REGION: &str = "us-east-1";

/// The node configuration's `backup.object_store`.
pub fn node_section(s: &ObjectStoreSpec) -> Value {
    let mut v = json!({
        "url": s.url,
        "region": s.region.as_deref().unwrap_or(DEFAULT_REGION),
        "interval_ms": s.interval_seconds.max(1) * 1000,
        "keep": s.retention.max(1),
        "instance_metadata": s.instance_metadata,
        "keep_older_formats": s.keep_older_formats,
    });
    if let Some(e) = &s.endpoint {
        v["endpoint"] = json!(e);
    }
    if let Some(b) = s.max_bytes_per_second {
        v["max_bytes_per_second"] = json!(b.max(0));
    }
    if s.ca_bundle.is_some() {
        v["ca_file"] = json!(format!("{CA_MOUNT}/{CA_FILE}"));
    }
    v
}

/// The credentials' variables, from `credentialsSecret`.
pub fn credential_env(s: &ObjectStoreSpec) -> Vec<Value> {
    let Some(secret) = &s.credentials_secret else {
        return Vec::new();
    };
    ["AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"]
        .iter()
        .map(|k| {
            json!({
                "name": k,
                "valueFrom": { "secretKeyRef": { "name": secret, "key": k } },
            })
        })
        .collect()
}

/// The CA bundle's volume and its mount, when the spec names one.
pub fn ca_volume(s: &ObjectStoreSpec) -> Option<(Value, Value)> {
    let ca = s.ca_bundle.as_ref()?;
    let items = json!([{ "key": ca.key, "path": CA_FILE }]);
    let volume = match (&ca.secret_name, &ca.config_map_name) {
        (Some(secret), _) => {
            json!({ "name": CA_VOLUME, "secret": { "secretName": secret, "items": items } })
        }
        (None, Some(cm)) => {
            json!({ "name": CA_VOLUME, "configMap": { "name": cm, "items": items } })
        }
        (None, None) => return None,
    };
    Some((
        volume,
        json!({ "name": CA_VOLUME, "mountPath": CA_MOUNT, "readOnly": true }),
    ))
}

/// Adds the credentials and the CA bundle of `s` to a pod spec whose first container
/// reaches the bucket.
pub fn add_to_pod(pod: &mut Value, s: &ObjectStoreSpec) {
    let container = &mut pod["containers"][0];
    let mut env = container["env"].as_array().cloned().unwrap_or_default();
    env.extend(credential_env(s));
    if !env.is_empty() {
        container["env"] = json!(env);
    }
    if let Some((volume, mount)) = ca_volume(s) {
        let mut mounts = container["volumeMounts"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        mounts.push(mount);
        container["volumeMounts"] = json!(mounts);
        let mut volumes = pod["volumes"].as_array().cloned().unwrap_or_default();
        volumes.push(volume);
        pod["volumes"] = json!(volumes);
    }
}

/// `ankusa-relay restore --from s3://…` arguments reaching the bucket of `s` (the
/// location itself apart).
pub fn restore_args(s: &ObjectStoreSpec) -> Vec<String> {
    let mut a = vec![
        "--region".to_owned(),
        s.region.as_deref().unwrap_or(DEFAULT_REGION).to_owned(),
    ];
    if let Some(e) = &s.endpoint {
        a.extend(["--endpoint".to_owned(), e.clone()]);
        if e.starts_with("http://") {
            a.push("--allow-http".to_owned());
        }
    }
    if s.ca_bundle.is_some() {
        a.extend(["--ca-file".to_owned(), format!("{CA_MOUNT}/{CA_FILE}")]);
    }
    if s.instance_metadata {
        a.push("--instance-metadata".to_owned());
    }
    a
}

/// Node `pod`'s backups in the bucket of `s`: `<url>/<pod>`.
pub fn node_url(s: &ObjectStoreSpec, pod: &str) -> String {
    ankusa_config::s3_node_url(&s.url, pod)
}

/// What node `pod` reports of its pushes, if it answered and pushes.
fn reported<'a>(o: &'a Observed, pod: &str) -> Option<&'a ObjectBackups> {
    o.nodes
        .get(pod)?
        .as_ref()
        .ok()?
        .status
        .object_backups
        .as_ref()
}

/// How old node `pod`'s last backup is (s), if it has one.
fn age_s(b: &ObjectBackups, now: &str) -> Option<i64> {
    let now = now.parse::<Timestamp>().ok()?;
    let at = b.last.as_ref()?.at_ms as i64;
    Some(now.as_millisecond().saturating_sub(at) / 1000)
}

/// When a backup counts as fresh: within twice the interval (one push may be under way).
fn fresh_limit_s(s: &ObjectStoreSpec) -> i64 {
    2 * s.interval_seconds.max(1)
}

/// Why a format change cannot move over the object store's backups now: (reason, message,
/// whether it is a fault the user must act on). `None`: every node of `spec.replicas` has
/// a fresh backup at store format `store` in the bucket, and its last push did not fail.
pub fn gate_problem(
    relay: &Relay,
    o: &Observed,
    store: u32,
) -> Option<(&'static str, String, bool)> {
    let Some(s) = relay.spec.object_store() else {
        return Some((
            "NoBackupDestination",
            "set spec.backup.destination or spec.backup.objectStore (or spec.backup.policy: Never) to let it roll".to_owned(),
            true,
        ));
    };
    let names = crate::names::Names::of(relay).ok()?;
    let limit = fresh_limit_s(s);
    let mut waiting = Vec::new();
    for i in 0..relay.spec.replicas.max(0) {
        let pod = names.pod(i);
        let why = match reported(o, &pod) {
            None => Some("has not reported a push".to_owned()),
            Some(b) => match (&b.last, age_s(b, &o.now)) {
                (None, _) | (_, None) => Some(match &b.last_error {
                    Some(e) => format!("has no backup in the bucket ({e})"),
                    None => "has no backup in the bucket yet".to_owned(),
                }),
                (Some(last), _) if last.store_format != store => Some(format!(
                    "last backup {} is at store format {}, not {store}",
                    last.id, last.store_format
                )),
                (_, Some(age)) if age > limit || b.failures > 0 => Some(format!(
                    "last backup is {age} s old{}",
                    b.last_error
                        .as_deref()
                        .map(|e| format!(", pushes fail: {e}"))
                        .unwrap_or_default()
                )),
                _ => None,
            },
        };
        if let Some(w) = why {
            waiting.push(format!("{pod} {w}"));
        }
    }
    if waiting.is_empty() {
        return None;
    }
    Some((
        "WaitingForBackups",
        format!(
            "it moves once every node has a backup in {} younger than {limit} s: {}",
            s.url,
            waiting.join("; ")
        ),
        false,
    ))
}

/// The `ObjectStoreBackups` condition: (status, reason, message). True while every node
/// of `spec.replicas` reports a backup younger than twice the interval; False naming the
/// nodes that do not (and why their pushes fail).
pub fn condition(relay: &Relay, o: &Observed) -> (bool, &'static str, String) {
    let Some(s) = relay.spec.object_store() else {
        return (
            false,
            "NotConfigured",
            "spec.backup.objectStore is not set".to_owned(),
        );
    };
    let Ok(names) = crate::names::Names::of(relay) else {
        return (false, "NotConfigured", "the Relay has no valid name".into());
    };
    let limit = fresh_limit_s(s);
    let (mut failing, mut stale) = (Vec::new(), Vec::new());
    for i in 0..relay.spec.replicas.max(0) {
        let pod = names.pod(i);
        let Some(b) = reported(o, &pod) else {
            stale.push(format!("{pod}: not reporting"));
            continue;
        };
        if let Some(e) = &b.last_error {
            failing.push(format!(
                "{pod}: {} push(es) failed in a row: {e}",
                b.failures
            ));
        } else if age_s(b, &o.now).is_none_or(|a| a > limit) {
            stale.push(format!("{pod}: no backup within {limit} s"));
        }
    }
    if !failing.is_empty() {
        failing.extend(stale);
        return (false, "PushFailing", failing.join("; "));
    }
    if !stale.is_empty() {
        return (false, "Stale", stale.join("; "));
    }
    (
        true,
        "Current",
        format!("every node pushed a backup to {} within {limit} s", s.url),
    )
}

/// What stops a rollback from the bucket to store format `format`, node by node: a node
/// of `spec.replicas` that reports no backup at that format or below there, or whose data
/// volume has less free space than that backup's store (its restore downloads it beside
/// the store it replaces).
pub fn rollback_problems(relay: &Relay, o: &Observed, format: u32) -> Vec<String> {
    let Ok(names) = crate::names::Names::of(relay) else {
        return vec!["the Relay has no valid name".into()];
    };
    (0..relay.spec.replicas.max(0))
        .filter_map(|i| {
            let pod = names.pod(i);
            let free = o
                .nodes
                .get(&pod)
                .and_then(|n| n.as_ref().ok()?.status.volume_free_bytes);
            match reported(o, &pod) {
                None => Some(format!("{pod} does not report its backups")),
                Some(b) => match b.formats.iter().rfind(|f| f.store_format <= format) {
                    // The restore writes at most the free space less its margin.
                    Some(f)
                        if free.is_some_and(|free| {
                            free < f.bytes.saturating_add(ankusa_api::node::UNPACK_MARGIN_BYTES)
                        }) =>
                    {
                        Some(format!(
                            "{pod}'s volume has {} bytes free, less than backup {} ({} bytes) and the restore's margin of {} MiB",
                            free.unwrap_or_default(),
                            f.id,
                            f.bytes,
                            ankusa_api::node::UNPACK_MARGIN_BYTES >> 20
                        ))
                    }
                    Some(_) => None,
                    None => Some(format!(
                        "{pod} has none in {} (its backups are at store format {})",
                        b.url,
                        b.formats
                            .iter()
                            .map(|f| f.store_format.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )),
                },
            }
        })
        .collect()
}

/// A node's last backup as the status shows it: its id and when its checkpoint was
/// taken (RFC 3339).
pub fn last_backup(o: &Observed, pod: &str) -> Option<String> {
    let last = reported(o, pod)?.last.as_ref()?;
    let at = Timestamp::from_millisecond(last.at_ms as i64).ok()?;
    Some(format!("{} at {at}", last.id))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::observed::NodeReading;
    use ankusa_api::node::{NodeStatus, ObjectBackup};

    fn relay() -> Relay {
        serde_json::from_value(json!({
            "apiVersion": "ankusa.dev/v1alpha1",
            "kind": "Relay",
            "metadata": { "name": "hooks", "namespace": "shop", "uid": "u1" },
            "spec": {
                "image": "relay:1",
                "replicas": 2,
                "backup": { "objectStore": {
                    "url": "s3://dr/hooks",
                    "endpoint": "http://10.0.0.1:8333",
                    "credentialsSecret": "s3-keys",
                    "caBundle": { "configMapName": "private-ca", "key": "ca.crt" },
                    "intervalSeconds": 60,
                } },
            },
        }))
        .unwrap()
    }

    fn node(at_ms: u64, format: u32, error: Option<&str>) -> Result<NodeReading, String> {
        let status: NodeStatus = serde_json::from_value(json!({
            "version": "1", "supported_format": 3, "store_format": format, "migrating_to": null,
            "tenants": 0, "counters": { "pending": 0, "scheduled": 0, "inflight": 0, "dead": 0, "bytes": 0, "archive_pending": 0 },
            "oldest_due_at_ms": null,
        }))
        .unwrap();
        Ok(NodeReading {
            status: NodeStatus {
                object_backups: Some(ObjectBackups {
                    url: "s3://dr/hooks/x".into(),
                    last: Some(ObjectBackup {
                        id: format!("b{at_ms}"),
                        at_ms,
                        store_format: format,
                        ..ObjectBackup::default()
                    }),
                    failures: u64::from(error.is_some()),
                    last_error: error.map(str::to_owned),
                    formats: vec![ankusa_api::node::FormatBackup {
                        store_format: format,
                        id: format!("b{at_ms}"),
                        at_ms,
                        bytes: 100,
                    }],
                    ..ObjectBackups::default()
                }),
                ..status
            },
            top: Vec::new(),
        })
    }

    /// 2026-01-01T00:10:00Z, and that minus `s` seconds in ms.
    const NOW: &str = "2026-01-01T00:10:00Z";
    fn ago(s: u64) -> u64 {
        1_767_226_200_000 - s * 1000
    }

    #[test]
    fn the_nodes_are_told_where_to_push_with_their_credentials_and_ca() {
        let r = relay();
        let s = r
            .spec
            .backup
            .as_ref()
            .unwrap()
            .object_store
            .as_ref()
            .unwrap();
        assert_eq!(
            node_section(s),
            json!({
                "url": "s3://dr/hooks", "region": "us-east-1", "interval_ms": 60000, "keep": 24,
                "instance_metadata": false, "keep_older_formats": true, "endpoint": "http://10.0.0.1:8333",
                "ca_file": "/etc/ankusa/objstore-ca/ca.pem",
            })
        );
        let mut pod = json!({ "containers": [{ "name": "relay" }] });
        add_to_pod(&mut pod, s);
        assert_eq!(
            pod["containers"][0]["env"][0]["valueFrom"]["secretKeyRef"],
            json!({ "name": "s3-keys", "key": "AWS_ACCESS_KEY_ID" })
        );
        assert_eq!(pod["volumes"][0]["configMap"]["name"], "private-ca");
        assert!(restore_args(s).contains(&"--allow-http".to_owned()));
    }

    #[test]
    fn a_format_change_waits_for_a_fresh_backup_of_every_node_at_the_running_format() {
        let r = relay();
        let mut o = Observed {
            now: NOW.into(),
            ..Observed::default()
        };
        let (reason, why, fault) = gate_problem(&r, &o, 2).unwrap();
        assert_eq!((reason, fault), ("WaitingForBackups", false));
        assert!(why.contains("hooks-0 has not reported a push"), "{why}");
        o.nodes.insert("hooks-0".into(), node(ago(30), 2, None));
        o.nodes.insert("hooks-1".into(), node(ago(300), 2, None));
        let (_, why, _) = gate_problem(&r, &o, 2).unwrap();
        assert!(why.contains("hooks-1 last backup is 300 s old"), "{why}");
        o.nodes.insert("hooks-1".into(), node(ago(5), 1, None));
        let (_, why, _) = gate_problem(&r, &o, 2).unwrap();
        assert!(why.contains("at store format 1, not 2"), "{why}");
        o.nodes.insert("hooks-1".into(), node(ago(5), 2, None));
        assert_eq!(gate_problem(&r, &o, 2), None);
        // A push that failed since: not fresh enough to move over.
        o.nodes.insert(
            "hooks-1".into(),
            node(ago(5), 2, Some("connection refused")),
        );
        assert!(gate_problem(&r, &o, 2).is_some());
        let (ok, reason, message) = condition(&r, &o);
        assert!(!ok);
        assert_eq!(reason, "PushFailing");
        assert!(message.contains("hooks-1: 1 push(es) failed in a row: connection refused"));
        o.nodes.insert("hooks-1".into(), node(ago(5), 2, None));
        assert_eq!(condition(&r, &o).1, "Current");
        o.nodes.insert("hooks-0".into(), node(ago(121), 2, None));
        assert_eq!(condition(&r, &o).1, "Stale");
        // A rollback to format 1 finds no backup at it or below; to 2 it does.
        let lacking = rollback_problems(&r, &o, 1);
        assert_eq!(lacking.len(), 2, "{lacking:?}");
        assert!(lacking[0]
            .contains("hooks-0 has none in s3://dr/hooks/x (its backups are at store format 2)"));
        assert!(rollback_problems(&r, &o, 2).is_empty());
        // A volume with less room than the backup: refused, naming it.
        if let Some(Ok(n)) = o.nodes.get_mut("hooks-0") {
            n.status.volume_free_bytes = Some(99);
        }
        assert_eq!(
            rollback_problems(&r, &o, 2),
            [format!(
                "hooks-0's volume has 99 bytes free, less than backup b{} (100 bytes) and the restore's margin of 64 MiB",
                ago(121)
            )]
        );
        o.nodes.remove("hooks-1");
        assert_eq!(
            rollback_problems(&r, &o, 2).last().unwrap(),
            "hooks-1 does not report its backups"
        );
    }
}
