//! Backups in object storage (`backup push`, `restore --from s3://…`, a running node's
//! pushes) against a real S3-compatible server: SeaweedFS's S3 gateway, built from its Go
//! module (scripts/seaweedfs.sh, cached once per machine) and started on 127.0.0.1 by the
//! test ([`ankusa_relay::testkit::SeaweedFs`]), its telemetry off and every port its own.

use std::time::{Duration, Instant};

use crate::support::*;

/// The test's server, with a bucket `backups`.
struct Weed(ankusa_relay::testkit::SeaweedFs);

impl std::ops::Deref for Weed {
    type Target = ankusa_relay::testkit::SeaweedFs;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl Weed {
    fn start() -> Weed {
        Weed(ankusa_relay::testkit::SeaweedFs::start("backups"))
    }

    /// An object's bytes put as they are (anonymous: the server has no identities).
    fn put(&self, key: &str, body: &str) {
        let (status, answer) = http_raw(
            self.s3,
            "PUT",
            &format!("/backups/{key}"),
            &[],
            body,
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(status, 200, "{answer}");
    }

    fn delete(&self, key: &str) {
        let (status, answer) = http_raw(
            self.s3,
            "DELETE",
            &format!("/backups/{key}"),
            &[],
            "",
            Duration::from_secs(5),
        )
        .unwrap();
        assert_eq!(status, 204, "{answer}");
    }
}

/// `ankusa-relay ARGS --endpoint … --allow-http`, with credentials in the environment.
fn relay_s3(weed: &Weed, args: &[&str]) -> std::process::Output {
    bin()
        .args(args)
        .args(["--endpoint", &weed.endpoint(), "--allow-http"])
        .env("AWS_ACCESS_KEY_ID", "it")
        .env("AWS_SECRET_ACCESS_KEY", "it-secret")
        .output()
        .expect("run ankusa-relay")
}

/// `backup push --data DATA --to TO` to the test's server.
fn push_s3(weed: &Weed, data: &str, to: &str) -> std::process::Output {
    relay_s3(weed, &["backup", "push", "--data", data, "--to", to])
}

/// `restore --from FROM --data INTO` from the test's server.
fn restore_s3(weed: &Weed, from: &str, into: &std::path::Path) -> std::process::Output {
    relay_s3(
        weed,
        &["restore", "--from", from, "--data", into.to_str().unwrap()],
    )
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

/// The figures of `backup push`'s line: (files, uploaded files).
fn pushed(line: &str) -> (u64, u64) {
    let n = |after: &str| -> u64 {
        let rest = &line[line.find(after).unwrap() + after.len()..];
        rest.split_whitespace()
            .next()
            .unwrap()
            .trim_end_matches(',')
            .parse()
            .unwrap()
    };
    (n(": "), n("uploaded "))
}

#[test]
fn a_store_pushed_twice_uploads_its_files_once_and_restores_from_the_bucket_checked() {
    let weed = Weed::start();
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    store_with_hooks(&data, 50);
    let d = data.to_str().unwrap();

    let first = ok(&push_s3(&weed, d, "s3://backups/relay-0"));
    let (files, uploaded) = pushed(&first);
    assert!(files > 3 && uploaded == files, "{first}");
    // Unchanged: the table and blob files are in the bucket already.
    let second = ok(&push_s3(&weed, d, "s3://backups/relay-0"));
    let (files2, uploaded2) = pushed(&second);
    let tables = std::fs::read_dir(&data)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.ends_with(".sst") || n.ends_with(".blob")
        })
        .count() as u64;
    assert!(tables > 0, "the store has table files");
    assert_eq!(files2, files, "{second}");
    assert!(
        uploaded2 <= files2 - tables,
        "only the small files again: {second}"
    );

    // Restored into another directory: the same store, checked, a lineage of its own.
    let restored = root.path().join("restored");
    let r = restored.to_str().unwrap();
    let out = ok(&restore_s3(&weed, "s3://backups/relay-0", &restored));
    assert!(out.contains("store format 3"), "{out}");
    ok(&run(&["store", "verify", "--data", r]));
    let counters = |dir: &str| {
        ok(&run(&["store", "inspect", "--data", dir]))
            .lines()
            .find(|l| l.starts_with("node counters"))
            .unwrap()
            .to_owned()
    };
    assert_eq!(counters(r), counters(d));
    let lineage =
        |dir: &std::path::Path| std::fs::read_to_string(dir.join(".backup-lineage")).unwrap();
    assert_ne!(lineage(&restored), lineage(&data));

    // A third push keeping one backup: the two before go, and what is kept restores.
    let third = ok(&relay_s3(
        &weed,
        &[
            "backup",
            "push",
            "--data",
            d,
            "--to",
            "s3://backups/relay-0",
            "--keep",
            "1",
        ],
    ));
    // Their own files go (their MANIFEST-* by content), the shared ones stay.
    assert!(third.contains("deleted 2 backups and "), "{third}");
    let again = root.path().join("again");
    ok(&restore_s3(&weed, "s3://backups/relay-0", &again));
    assert_eq!(counters(again.to_str().unwrap()), counters(d));
}

#[test]
fn a_restore_refuses_a_missing_file_a_bad_checksum_and_an_unreachable_bucket() {
    let weed = Weed::start();
    let root = tempfile::tempdir().unwrap();
    let data = root.path().join("data");
    store_with_hooks(&data, 20);
    let d = data.to_str().unwrap();
    ok(&push_s3(&weed, d, "s3://backups/relay-1"));
    let lineage = std::fs::read_to_string(data.join(".backup-lineage")).unwrap();
    let table = std::fs::read_dir(&data)
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .find(|n| n.ends_with(".sst"))
        .unwrap();
    let key = format!("relay-1/files/{}/{table}", lineage.trim());

    // A file changed in the bucket: the restore names it and its checksum.
    weed.put(&key, "not the table file");
    let into = root.path().join("a");
    let out = restore_s3(&weed, "s3://backups/relay-1", &into);
    assert!(!out.status.success());
    assert!(text(&out.stderr).contains(&key), "{}", text(&out.stderr));

    // Gone: refused before anything is written, naming it.
    weed.delete(&key);
    let into = root.path().join("b");
    let out = restore_s3(&weed, "s3://backups/relay-1", &into);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(err.contains("does not hold") && err.contains(&key), "{err}");
    assert!(!into.exists(), "nothing written for a refused backup");

    // A manifest that names a path, not a file of the store: refused, nothing written.
    weed.put(
        "relay-1/backups/b9999999999999/manifest.json",
        r#"{"version":1,"id":"b9999999999999","created_ms":9999999999999,"lineage":"x","store_format":3,
            "files":[{"name":"../escaped","key":"relay-1/x","size":1,"sha256":"00"}]}"#,
    );
    let out = restore_s3(&weed, "s3://backups/relay-1", &into);
    assert!(
        text(&out.stderr).contains("not a store file's name"),
        "{}",
        text(&out.stderr)
    );
    assert!(!into.exists() && !root.path().join("escaped").exists());

    // A manifest naming another store's table file (another lineage's, another prefix's):
    // refused whole, naming it, nothing written.
    let other = format!("relay-2/files/{}/{table}", lineage.trim());
    weed.put(&other, "a table of another store");
    weed.put(
        "relay-1/backups/b9999999999999/manifest.json",
        &format!(
            r#"{{"version":1,"id":"b9999999999999","created_ms":9999999999999,"lineage":"{}","store_format":3,
            "files":[{{"name":"{table}","key":"{other}","size":24,"sha256":"00"}}]}}"#,
            lineage.trim()
        ),
    );
    let out = restore_s3(&weed, "s3://backups/relay-1", &into);
    let err = text(&out.stderr);
    assert!(
        err.contains("names files that are not its store's") && err.contains(&other),
        "{err}"
    );
    assert!(!into.exists());

    // Nothing under another prefix; and a server that is not there.
    let out = restore_s3(&weed, "s3://backups/none", &into);
    assert!(
        text(&out.stderr).contains("no backup in s3://backups/none"),
        "{}",
        text(&out.stderr)
    );
    let port = ankusa_relay::testkit::free_port();
    let out = bin()
        .args([
            "backup",
            "push",
            "--data",
            d,
            "--to",
            "s3://backups/relay-1",
        ])
        .args([
            "--endpoint",
            &format!("http://127.0.0.1:{port}"),
            "--allow-http",
        ])
        .env("AWS_ACCESS_KEY_ID", "it")
        .env("AWS_SECRET_ACCESS_KEY", "it-secret")
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("Connection refused"),
        "{}",
        text(&out.stderr)
    );
}

/// The rows a store holds (`store inspect`'s node counters: pending, scheduled, in flight
/// and dead).
fn rows_in(dir: &std::path::Path) -> u64 {
    let out = ok(&run(&["store", "inspect", "--data", dir.to_str().unwrap()]));
    let line = out
        .lines()
        .find(|l| l.starts_with("node counters"))
        .unwrap()
        .to_owned();
    ["pending=", "scheduled=", "inflight=", "dead="]
        .iter()
        .map(|k| {
            let rest = &line[line.find(k).unwrap() + k.len()..];
            rest.split_whitespace()
                .next()
                .unwrap()
                .parse::<u64>()
                .unwrap()
        })
        .sum()
}

/// A process node whose one sink never answers (every hook stays queued), pushing to
/// `endpoint` every second.
fn pushing_node(endpoint: &str, keep: usize) -> ankusa_relay::testkit::NodeBuilder {
    proc_node()
        .sink("s", "http://127.0.0.1:9/never")
        .route("r", &["s"])
        .section("retry: { schedule_ms: [3600000] }")
        .open_source("in", "r")
        .section(&format!(
            "backup: {{ object_store: {{ url: \"s3://backups/nodes\", endpoint: \"{endpoint}\", interval_ms: 1000, keep: {keep} }} }}"
        ))
}

/// The node's `object_backups` in `GET /v1/node`.
fn object_backups(admin: u16) -> serde_json::Value {
    let (status, body) = http_get_admin(admin, "/v1/node").unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["object_backups"].clone()
}

fn wait_for(what: &str, dir: &std::path::Path, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !f() {
        assert!(Instant::now() < deadline, "{what}:\n{}", log_tail(dir, 30));
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_running_node_pushes_on_its_schedule_and_its_last_backup_restores_after_a_sigkill() {
    let weed = Weed::start();
    let root = tempfile::tempdir().unwrap();
    let dir = root.path().join("node");
    std::fs::create_dir_all(&dir).unwrap();
    let spec = pushing_node(&weed.endpoint(), 2);
    let creds = [
        ("AWS_ACCESS_KEY_ID", std::path::Path::new("it")),
        ("AWS_SECRET_ACCESS_KEY", std::path::Path::new("it-secret")),
    ];
    let mut node = Proc::start_with_env(&dir, &spec, &creds);
    let (admin, ingest) = (spec.admin_port().unwrap(), spec.ingest_port().unwrap());
    let send = |from: u32, n: u32| {
        for i in from..from + n {
            let (status, body) = http_raw(
                ingest,
                "POST",
                "/ingest/in",
                &[format!("x-tenant: t{}", i % 5)],
                &format!("{{\"i\":{i}}}"),
                Duration::from_secs(10),
            )
            .unwrap();
            assert_eq!(status, 202, "{body}");
        }
    };
    send(0, 60);
    let acked_at = ankusa_keyspace::now_ms();
    // A backup whose checkpoint came after the 60 acks; then two more (retention at 2).
    wait_for("no backup after the acks", &dir, || {
        object_backups(admin)["last"]["at_ms"].as_u64() > Some(acked_at)
    });
    let first = object_backups(admin)["pushes"].as_u64().unwrap();
    send(60, 30);
    let all_acked_at = ankusa_keyspace::now_ms();
    wait_for("no more pushes", &dir, || {
        let b = object_backups(admin);
        b["pushes"].as_u64().unwrap() >= first + 3
            && b["last"]["at_ms"].as_u64() > Some(all_acked_at)
    });
    let b = object_backups(admin);
    assert_eq!(b["url"], "s3://backups/nodes/node");
    assert_eq!(b["failures"], 0, "{b}");
    assert!(b["last"]["files"].as_u64().unwrap() > 3, "{b}");
    // An unchanged store uploads only its small files (its tables are in the bucket).
    assert!(
        b["last"]["uploaded_bytes"].as_u64().unwrap() < b["last"]["bytes"].as_u64().unwrap(),
        "{b}"
    );
    let (_, metrics) = http_get(admin, "/metrics").unwrap();
    assert!(
        metrics.contains("ankusa_backup_pushes_total{outcome=\"completed\"}"),
        "{metrics}"
    );
    node.kill9();

    // Restored from the bucket: every hook acked before the last backup is there; a run
    // again of the same restore (a retried Job) finds its work done.
    let into = root.path().join("restored");
    let restore = |once: &str| {
        relay_s3(
            &weed,
            &[
                "restore",
                "--from",
                "s3://backups/nodes/node",
                "--data",
                into.to_str().unwrap(),
                "--once",
                once,
            ],
        )
    };
    ok(&restore("job-1"));
    assert_eq!(rows_in(&into), 90);
    let again = ok(&restore("job-1"));
    assert!(again.contains("by this restore before"), "{again}");
    // Another restore into the restored store is refused: it is not empty.
    let other = restore("job-2");
    assert!(!other.status.success());
    assert!(
        text(&other.stderr).contains("is not empty"),
        "{}",
        text(&other.stderr)
    );
    // The node's own store replaced from the bucket (one node's restore): the store it
    // had moved aside, and what it held beyond the backup reported (nothing: no hook came
    // after the last push).
    let db = dir.join("db");
    let report = root.path().join("report.json");
    let replaced = ok(&relay_s3(
        &weed,
        &[
            "restore",
            "--from",
            "s3://backups/nodes/node",
            "--data",
            db.to_str().unwrap(),
            "--replace",
            "--report",
            report.to_str().unwrap(),
            "--once",
            "job-3",
        ],
    ));
    assert!(replaced.contains("moved the store at"), "{replaced}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&report).unwrap()).unwrap();
    assert!(r["archive"].as_str().unwrap().starts_with('b'), "{r}");
    assert_eq!(r["lostHooks"], 0, "{r}");
    assert_eq!(rows_in(&db), 90);
    // Retention kept two backups under the node's prefix.
    let (status, listing) = http_raw(
        weed.s3,
        "GET",
        "/backups?list-type=2&prefix=nodes/node/backups/",
        &[],
        "",
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(status, 200, "{listing}");
    assert_eq!(
        listing.matches("manifest.json</Key>").count(),
        2,
        "{listing}"
    );
}

#[test]
fn a_node_whose_bucket_is_unreachable_says_so_and_keeps_serving() {
    let root = tempfile::tempdir().unwrap();
    let port = ankusa_relay::testkit::free_port();
    let spec = pushing_node(&format!("http://127.0.0.1:{port}"), 2);
    let _node = Proc::start(root.path(), &spec);
    let admin = spec.admin_port().unwrap();
    wait_for("no failure reported", root.path(), || {
        object_backups(admin)["failures"].as_u64() >= Some(1)
    });
    let b = object_backups(admin);
    assert!(b["last"].is_null(), "{b}");
    let err = b["last_error"].as_str().unwrap();
    assert!(
        err.contains("Connection refused") || err.contains("error sending request"),
        "{err}"
    );
    let (_, metrics) = http_get(admin, "/metrics").unwrap();
    assert!(
        metrics.contains("ankusa_backup_pushes_total{outcome=\"failed\"}"),
        "{metrics}"
    );
    // No checkpoint is left beside the store by the failed pushes.
    let left: Vec<_> = std::fs::read_dir(root.path())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".push-"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    let (status, _) = http_get(admin, "/readyz").unwrap();
    assert_eq!(status, 200);
    // The free space of its volume, for a rollback's room check.
    let (_, body) = http_get_admin(admin, "/v1/node").unwrap();
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert!(v["volume_free_bytes"].as_u64().unwrap() > 0, "{v}");
}

#[test]
fn a_bucket_behind_a_private_ca_is_reached_with_its_bundle_and_refused_without() {
    let root = tempfile::tempdir().unwrap();
    // A CA, and a certificate for 127.0.0.1 it signed.
    let (ca, server, key) = private_ca();
    let (ca_file, cert, key_file) = (
        root.path().join("ca.pem"),
        root.path().join("server.pem"),
        root.path().join("server.key"),
    );
    std::fs::write(&ca_file, ca.pem()).unwrap();
    std::fs::write(&cert, server.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let weed = ankusa_relay::testkit::SeaweedFs::start_with(
        "backups",
        root.path(),
        Some((&cert, &key_file)),
    );
    let endpoint = format!("https://127.0.0.1:{}", weed.https.unwrap());
    let data = root.path().join("data");
    store_with_hooks(&data, 20);
    let s3 = |args: &[&str], ca: bool| {
        let mut c = bin();
        c.args(args).args(["--endpoint", &endpoint]);
        if ca {
            c.args(["--ca-file", ca_file.to_str().unwrap()]);
        }
        c.env("AWS_ACCESS_KEY_ID", "it")
            .env("AWS_SECRET_ACCESS_KEY", "it-secret")
            .output()
            .unwrap()
    };
    let push = [
        "backup",
        "push",
        "--data",
        data.to_str().unwrap(),
        "--to",
        "s3://backups/tls",
    ];
    // Without the bundle the server's certificate is not trusted: nothing is uploaded.
    let refused = s3(&push, false);
    assert!(!refused.status.success());
    let err = text(&refused.stderr);
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // With it, over HTTPS (no --allow-http): pushed, and restored checked.
    ok(&s3(&push, true));
    let into = root.path().join("restored");
    ok(&s3(
        &[
            "restore",
            "--from",
            "s3://backups/tls",
            "--data",
            into.to_str().unwrap(),
        ],
        true,
    ));
    assert_eq!(rows_in(&into), rows_in(&data));
}
