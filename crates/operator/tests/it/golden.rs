//! The objects a `Relay` owns, compared with committed golden YAML
//! (`tests/golden/<fixture>.yaml`), so a reviewer sees every change to them as a diff.
//! `UPDATE_GOLDEN=1 cargo nextest run -p ankusa-operator golden` rewrites the files.

use ankusa_operator::names::Names;
use ankusa_operator::resources::{self, DesiredSet};

use crate::support::{relay, test_path};

fn rendered(fixture: &str) -> String {
    let r = relay(fixture);
    let d = DesiredSet::build(
        &r,
        r.spec.config.inline.as_ref(),
        0,
        r.spec.monitoring.service_monitor.enabled,
    )
    .unwrap();
    let mut out = d.to_yaml().unwrap();
    let names = Names::of(&r).unwrap();
    // The Jobs of an upgrade and the token Secret (with a fixed token) belong to the review.
    let secret = resources::token_secret(
        &r,
        "0123456789abcdef",
        "fedcba9876543210",
        "8899aabbccddeeff",
        "0011223344556677",
    )
    .unwrap();
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(&secret).unwrap());
    let probe_name = ankusa_operator::plan::probe_job_name(&r, &r.spec.image);
    let probe = resources::probe_job(&r, &probe_name, &r.spec.image).unwrap();
    out.push_str("---\n");
    out.push_str(&serde_yaml::to_string(&probe).unwrap());
    if r.spec.backup.is_some() {
        let cursor = ankusa_crds::status::UpgradeStatus {
            target_image: Some(r.spec.image.clone()),
            started: Some("2026-11-30T00:00:00Z".into()),
            ..Default::default()
        };
        let name = ankusa_operator::plan::backup_job_name(&r, 0, &cursor);
        let url = format!(
            "http://{}.{}.{}.svc:9090",
            names.pod(0),
            names.headless,
            names.namespace
        );
        let job = resources::backup_job(
            &r,
            &name,
            0,
            "ghcr.io/ankusa/relay:0.0.9",
            resources::BackupSource::Node(&url),
        )
        .unwrap();
        out.push_str("---\n");
        out.push_str(&serde_yaml::to_string(&job).unwrap());
    }
    out
}

fn check(fixture: &str) {
    let got = rendered(fixture);
    let path = test_path(&format!("golden/{fixture}.yaml"));
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_default();
    if got != want {
        let diff: Vec<String> = got
            .lines()
            .zip(want.lines().chain(std::iter::repeat("<end of file>")))
            .enumerate()
            .filter(|(_, (g, w))| g != w)
            .take(5)
            .map(|(i, (g, w))| format!("line {}: generated {g:?}, golden {w:?}", i + 1))
            .collect();
        panic!(
            "{} differs from the generated objects (UPDATE_GOLDEN=1 to accept):\n{}",
            path.display(),
            diff.join("\n")
        );
    }
}

#[test]
fn minimal_relay_objects_match_golden_yaml() {
    check("minimal");
}

#[test]
fn full_relay_objects_match_golden_yaml() {
    check("full");
}

/// The relay configuration the operator writes is one the relay node accepts.
#[test]
fn generated_relay_yaml_is_accepted_by_the_relay() {
    for fixture in ["minimal", "full"] {
        let r = relay(fixture);
        let cfg = resources::relay_config(&r, r.spec.config.inline.as_ref()).unwrap();
        let yaml = resources::relay_yaml(&cfg).unwrap();
        // The node reads its secrets at start: give it the files and variables the pod has.
        let dir = tempfile::tempdir().unwrap();
        let token = dir.path().join("token");
        std::fs::write(&token, "an-operator-token-of-32-bytes-at-least").unwrap();
        let backup = dir.path().join("backup-token");
        std::fs::write(&backup, "a-backup-token-of-32-bytes-at-least").unwrap();
        let cluster = dir.path().join("cluster-token");
        std::fs::write(&cluster, "a-cluster-token-of-32-bytes-at-least").unwrap();
        let metrics = dir.path().join("metrics-token");
        std::fs::write(&metrics, "a-metrics-token-of-32-bytes-at-least").unwrap();
        let yaml = yaml
            .replace("/etc/ankusa-operator/token", token.to_str().unwrap())
            .replace(
                "/etc/ankusa-operator/backup-token",
                backup.to_str().unwrap(),
            )
            .replace(
                "/etc/ankusa-operator/cluster-token",
                cluster.to_str().unwrap(),
            )
            .replace(
                "/etc/ankusa-operator/metrics-token",
                metrics.to_str().unwrap(),
            );
        for e in &r.spec.config.secret_env {
            std::env::set_var(&e.name, "a-secret-from-a-secret");
        }
        // What the pod's `ANKUSA_CLUSTER__NAME` (its name) says.
        let pod = ankusa_operator::names::Names::of(&r).unwrap().pod(0);
        let env = vec![("ANKUSA_CLUSTER__NAME".to_owned(), pod.clone())];
        let parsed = ankusa_config::Config::from_yaml(&yaml, env).unwrap_or_else(|e| {
            panic!("{fixture}: the relay refuses the generated config: {e}\n{yaml}")
        });
        assert_eq!(parsed.cluster.name.as_deref(), Some(pod.as_str()));
        assert_eq!(parsed.cluster.nodes.len(), r.spec.replicas.max(1) as usize);
        assert_eq!(parsed.cluster.nodes[0].name, pod);
        assert_eq!(i64::from(parsed.tenants.max), r.spec.tenants.max);
        assert_eq!(parsed.admin.listen.port(), resources::ADMIN_PORT);
        assert_eq!(parsed.ingest.listen.port(), resources::INGEST_PORT);
        assert!(parsed
            .admin
            .tokens
            .iter()
            .any(|t| t.name == resources::TOKEN_NAME));
    }
}

/// The user cannot move the node off the ports, data directory and ceiling the operator
/// manages, and a token of the user's keeps its place beside the operator's.
#[test]
fn operator_keys_override_the_users() {
    let r = relay("minimal");
    let user = serde_json::json!({
        "data_dir": "/tmp/elsewhere",
        "admin": { "listen": "127.0.0.1:1", "tokens": [
            { "name": "ops", "secret": { "env": "OPS_TOKEN" }, "scope": "admin" },
            { "name": resources::TOKEN_NAME, "secret": { "value": "spoofed" }, "scope": "admin" },
        ] },
        "tenants": { "max": 7 },
    });
    let cfg = resources::relay_config(&r, Some(&user)).unwrap();
    assert_eq!(cfg["data_dir"], "/var/lib/ankusa/data");
    assert_eq!(cfg["admin"]["listen"], "[::]:9090");
    assert_eq!(cfg["tenants"]["max"], 1_000_000);
    let tokens = cfg["admin"]["tokens"].as_array().unwrap();
    assert_eq!(tokens.len(), 4);
    assert_eq!(tokens[0]["name"], "ops");
    assert_eq!(tokens[1]["secret"]["file"], "/etc/ankusa-operator/token");
    // The backup Jobs' token: backup scope, nothing else.
    assert_eq!(tokens[2]["name"], resources::BACKUP_TOKEN_NAME);
    assert_eq!(tokens[2]["scope"], "backup");
    assert_eq!(tokens[3]["name"], resources::METRICS_TOKEN_NAME);
    assert_eq!(tokens[3]["scope"], "metrics");
    // Not a mapping: a clear error, nothing built.
    let err = resources::relay_config(&r, Some(&serde_json::json!(["a"]))).unwrap_err();
    assert!(err.to_string().contains("mapping"), "{err}");
}

/// A configuration change the nodes cannot reload rolls the pods (the hash on the template
/// changes); one they reload — sources, sinks, routes, tokens — does not (it reaches them
/// through the ConfigMap's volume); the same configuration gives the same hash.
#[test]
fn config_hash_follows_the_configuration() {
    let r = relay("minimal");
    let a = DesiredSet::build(&r, None, 0, false).unwrap();
    let b = DesiredSet::build(&r, None, 0, false).unwrap();
    let c = DesiredSet::build(
        &r,
        Some(&serde_json::json!({"dedupe": {"window_ms": 1000}})),
        0,
        false,
    )
    .unwrap();
    let hash = |d: &DesiredSet| {
        d.statefulset
            .spec
            .as_ref()
            .unwrap()
            .template
            .metadata
            .as_ref()
            .unwrap()
            .annotations
            .as_ref()
            .unwrap()[resources::CONFIG_HASH_ANNOTATION]
            .clone()
    };
    assert_eq!(hash(&a), hash(&b));
    assert_ne!(hash(&a), hash(&c));
    let reloadable = DesiredSet::build(
        &r,
        Some(&serde_json::json!({
            "sinks": [{"id": "s", "url": "http://127.0.0.1:9/"}],
            "routes": [{"id": "r", "sinks": ["s"]}],
            "sources": [{"id": "a", "verify": {"scheme": "none"}, "route": "r"}],
            "ingest": {"body_limit_bytes": 4096},
        })),
        0,
        false,
    )
    .unwrap();
    assert_eq!(hash(&a), hash(&reloadable));
    assert_ne!(
        a.config_map, reloadable.config_map,
        "the nodes read the new file"
    );
    // `tenants.max` reloads too: a new value reaches the nodes' file, and no pod rolls.
    let mut raised = r.clone();
    raised.spec.tenants.max += 1;
    let raised = DesiredSet::build(&raised, None, 0, false).unwrap();
    assert_eq!(hash(&a), hash(&raised));
    assert_ne!(a.config_map, raised.config_map);
}

/// `config.caBundleRef` mounts the bundle's key as `ca.crt` and points the nodes'
/// `dispatch.ca_bundle` at it, over one the configuration gives.
#[test]
fn a_ca_bundle_ref_is_mounted_and_trusted_by_the_nodes() {
    let mut r = relay("minimal");
    let user = serde_json::json!({ "dispatch": { "ca_bundle": { "pem": "inline" } } });
    for (kind, volume) in [("secret", "secret"), ("configMap", "configMap")] {
        r.spec.config.ca_bundle_ref = Some(
            serde_json::from_value(serde_json::json!({ kind: { "name": "sinks-ca" } })).unwrap(),
        );
        let d = DesiredSet::build(&r, Some(&user), 0, false).unwrap();
        let pod = serde_json::to_value(d.statefulset.spec.unwrap().template.spec.unwrap()).unwrap();
        let v = pod["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "ca-bundle")
            .expect("the bundle's volume");
        assert_eq!(
            v[volume]["items"],
            serde_json::json!([{ "key": "ca.crt", "path": "ca.crt" }])
        );
        let name = if kind == "secret" {
            "secretName"
        } else {
            "name"
        };
        assert_eq!(v[volume][name], "sinks-ca");
        let mount = pod["containers"][0]["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["name"] == "ca-bundle")
            .expect("the bundle's mount")
            .clone();
        assert_eq!(mount["mountPath"], "/etc/ankusa-ca");
        let cfg = resources::relay_config(&r, Some(&user)).unwrap();
        assert_eq!(
            cfg["dispatch"]["ca_bundle"],
            serde_json::json!({ "file": "/etc/ankusa-ca/ca.crt" })
        );
    }
}

/// A pod's termination grace covers the preStop pause and the node's own
/// `shutdown.grace_ms`, so a SIGKILL never cuts a graceful stop short.
#[test]
fn the_termination_grace_covers_the_nodes_shutdown_grace() {
    let r = relay("minimal");
    let grace = |user: Option<serde_json::Value>| {
        let d = resources::DesiredSet::build(&r, user.as_ref(), 0, false).unwrap();
        let pod = d.statefulset.spec.unwrap().template.spec.unwrap();
        let pre_stop = pod.containers[0]
            .lifecycle
            .as_ref()
            .and_then(|l| l.pre_stop.as_ref())
            .and_then(|h| h.sleep.as_ref())
            .map(|s| s.seconds);
        (pod.termination_grace_period_seconds, pre_stop)
    };
    assert_eq!(grace(None), (Some(35), Some(5)));
    assert_eq!(
        grace(Some(
            serde_json::json!({ "shutdown": { "grace_ms": 60_500 } })
        )),
        (Some(5 + 61 + 10), Some(5))
    );
}

/// No selector of a Relay's objects matches the pod of one of its Jobs: a running backup
/// pod takes no ingest traffic, and a finished probe or backup pod (kept a day) stays out
/// of the PodDisruptionBudget, whose controller cannot count a Job's pods and would then
/// allow no eviction at all (`e2e/node.sh` evicts a node after the upgrade's Jobs ran).
#[test]
fn no_selector_of_the_relay_matches_a_job_pod() {
    use std::collections::BTreeMap;
    for fixture in ["minimal", "full"] {
        let r = relay(fixture);
        let d = DesiredSet::build(&r, None, 0, false).unwrap();
        let sts = d.statefulset.spec.as_ref().unwrap();
        let pod_labels = sts
            .template
            .metadata
            .as_ref()
            .unwrap()
            .labels
            .clone()
            .unwrap();
        let selectors: Vec<(&str, BTreeMap<String, String>)> = vec![
            ("StatefulSet", sts.selector.match_labels.clone().unwrap()),
            (
                "headless Service",
                d.headless.spec.clone().unwrap().selector.unwrap(),
            ),
            (
                "client Service",
                d.client.spec.clone().unwrap().selector.unwrap(),
            ),
            (
                "PodDisruptionBudget",
                d.pdb
                    .spec
                    .clone()
                    .unwrap()
                    .selector
                    .unwrap()
                    .match_labels
                    .unwrap(),
            ),
        ];
        let names = Names::of(&r).unwrap();
        let url = format!("http://{}:9090", names.pod(0));
        let jobs = [
            resources::probe_job(&r, "probe", &r.spec.image).unwrap(),
            resources::backup_job(
                &r,
                "b",
                0,
                &r.spec.image,
                resources::BackupSource::Node(&url),
            )
            .unwrap_or_else(|_| resources::probe_job(&r, "p", &r.spec.image).unwrap()),
        ];
        let matches = |sel: &BTreeMap<String, String>, labels: &BTreeMap<String, String>| {
            sel.iter().all(|(k, v)| labels.get(k) == Some(v))
        };
        for (what, sel) in &selectors {
            assert!(
                matches(sel, &pod_labels),
                "{fixture}: the {what} does not select the relay's pods"
            );
            for job in &jobs {
                let labels = job
                    .spec
                    .as_ref()
                    .unwrap()
                    .template
                    .metadata
                    .as_ref()
                    .unwrap();
                let labels = labels.labels.clone().unwrap();
                assert!(
                    !matches(sel, &labels),
                    "{fixture}: the {what} selects the pod of Job {:?}: {labels:?}",
                    job.metadata.name
                );
            }
        }
    }
}

/// With `backup.destination.claimTemplate`, each node's backup Jobs (online and offline)
/// and its restore mount its own claim, `<name>-backups-<ordinal>`, made from the
/// template; an online backup Job prefers the node's zone, where the claim then binds.
#[test]
fn a_claim_template_gives_each_node_its_own_backup_claim() {
    let mut r = relay("full");
    let backup = r.spec.backup.as_mut().unwrap();
    backup.destination = serde_json::from_value(serde_json::json!({
        "claimTemplate": { "size": "50Gi", "storageClassName": "zonal-ssd" }
    }))
    .unwrap();
    assert_eq!(resources::backup_claim(&r, 2).unwrap(), "hooks-backups-2");
    let claim =
        serde_json::to_value(resources::backup_claim_object(&r, 2).unwrap().unwrap()).unwrap();
    assert_eq!(claim["metadata"]["name"], "hooks-backups-2");
    assert_eq!(claim["spec"]["resources"]["requests"]["storage"], "50Gi");
    assert_eq!(claim["spec"]["storageClassName"], "zonal-ssd");
    assert_eq!(
        claim["metadata"]["labels"]["app.kubernetes.io/name"],
        resources::BACKUP_CLAIM_APP_NAME
    );
    // Not one of the nodes' data claims (their selector does not take it).
    assert!(Names::of(&r)
        .unwrap()
        .claim_ordinal("hooks-backups-2")
        .is_none());
    let volume = |job: &k8s_openapi::api::batch::v1::Job| {
        let v = serde_json::to_value(job).unwrap();
        v["spec"]["template"]["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|v| v["name"] == "backups")
            .unwrap()["persistentVolumeClaim"]["claimName"]
            .clone()
    };
    let online = resources::backup_job(
        &r,
        "hooks-backup-2-x",
        2,
        "img",
        resources::BackupSource::Node("http://hooks-2:9090"),
    )
    .unwrap();
    assert_eq!(volume(&online), "hooks-backups-2");
    let affinity =
        serde_json::to_value(&online).unwrap()["spec"]["template"]["spec"]["affinity"].clone();
    let term = &affinity["podAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]
        ["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(
        term["labelSelector"]["matchLabels"]["statefulset.kubernetes.io/pod-name"],
        "hooks-2"
    );
    let offline = resources::backup_job(
        &r,
        "hooks-backup-4-x",
        4,
        "img",
        resources::BackupSource::Claim,
    )
    .unwrap();
    assert_eq!(volume(&offline), "hooks-backups-4");
    let restore =
        resources::restore_job(&r, "hooks-restore-1-x", 1, "img", None, None, false).unwrap();
    assert_eq!(volume(&restore), "hooks-backups-1");
    // A node restore's Job: the archive named, and its report in the termination message.
    let node = resources::restore_job(
        &r,
        "hooks-restore-1-y",
        1,
        "img",
        None,
        Some("b42.tar.zst"),
        true,
    )
    .unwrap();
    let args = serde_json::to_value(&node).unwrap()["spec"]["template"]["spec"]["containers"][0]
        ["args"]
        .clone();
    let args: Vec<String> = serde_json::from_value(args).unwrap();
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--from" && w[1].ends_with("/hooks/hooks-1/b42.tar.zst"))
            && args
                .windows(2)
                .any(|w| w == ["--report", "/dev/termination-log"]),
        "{args:?}"
    );
    // One claim for every node: that claim, and no affinity.
    let shared = relay("full");
    let job = resources::backup_job(
        &shared,
        "hooks-backup-2-x",
        2,
        "img",
        resources::BackupSource::Node("http://hooks-2:9090"),
    )
    .unwrap();
    assert_eq!(
        volume(&job),
        shared
            .spec
            .backup
            .as_ref()
            .unwrap()
            .destination
            .as_ref()
            .unwrap()
            .claim_name
            .clone()
            .unwrap()
    );
    assert!(
        serde_json::to_value(&job).unwrap()["spec"]["template"]["spec"]
            .get("affinity")
            .is_none()
    );
}
