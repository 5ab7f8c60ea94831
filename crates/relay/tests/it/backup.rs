//! Backups over the admin API, pulled and restored by the command line.

use ankusa_queue::{counters, fold};
use ankusa_relay::node::Node;
use ankusa_relay::testkit::NodeBuilder;
use ankusa_store::{OpenOptions, Store};

use crate::support::*;

/// A node whose only sink never answers and retries after an hour: every hook stays queued.
fn parked() -> NodeBuilder {
    NodeBuilder::default()
        .sink("s", "http://127.0.0.1:9/never")
        .route("r", &["s"])
        .section("retry: { schedule_ms: [3600000] }")
        .open_source("in", "r")
}

/// Starts `b` with its store at `<dir>/db`.
async fn start(b: NodeBuilder, dir: &std::path::Path) -> Node {
    Node::start(b.config_at(dir)).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulled_backup_restores_to_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let node = start(
        parked()
            .admin_token("it", ADMIN_TOKEN)
            .admin_key("backup_keep: 1"),
        dir.path(),
    )
    .await;
    let c = client();
    for i in 0..40 {
        let r = post(
            &c,
            &format!("http://{}/ingest/in", node.ingest_addr),
            &[("x-tenant", format!("t{}", i % 4))],
            format!("{{\"i\":{i}}}"),
        )
        .await;
        assert_eq!(r.status, 202);
    }
    let admin = format!("http://{}", node.admin_addr);
    let out_dir = dir.path().join("pulled");
    // A token is required, and only an admin one.
    // `backup pull` blocks; run it off the runtime that serves the node.
    let pull = |token: &'static str| {
        let (admin, out_dir) = (admin.clone(), out_dir.clone());
        tokio::task::spawn_blocking(move || {
            run(&[
                "backup",
                "pull",
                "--from",
                &admin,
                "--token",
                token,
                "--to",
                out_dir.to_str().unwrap(),
            ])
        })
    };
    let refused = pull("wrong-token-0123456789").await.unwrap();
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("401"),
        "{}",
        text(&refused.stderr)
    );
    let pulled = pull(ADMIN_TOKEN).await.unwrap();
    assert!(pulled.status.success(), "{}", text(&pulled.stderr));
    // A second pull with --keep 1: the older archive goes, files that are not backups stay.
    let archives = |dir: &std::path::Path| -> Vec<std::path::PathBuf> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.to_string_lossy().ends_with(".tar.zst"))
            .collect();
        v.sort();
        v
    };
    let first = archives(&out_dir);
    assert_eq!(first.len(), 1);
    std::fs::write(out_dir.join("notes.txt"), "not a backup").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let (a, o) = (admin.clone(), out_dir.clone());
    let report = dir.path().join("pull-report.json");
    let r = report.clone();
    // The report's file from the environment, as the operator's backup Jobs give it.
    let kept = tokio::task::spawn_blocking(move || {
        bin()
            .args([
                "backup",
                "pull",
                "--from",
                &a,
                "--token",
                ADMIN_TOKEN,
                "--to",
                o.to_str().unwrap(),
                "--keep",
                "1",
            ])
            .env("ANKUSA_BACKUP_REPORT", &r)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(kept.status.success(), "{}", text(&kept.stderr));
    let second = archives(&out_dir);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);
    assert!(out_dir.join("notes.txt").exists());
    assert_reports(&report, &second[0]);
    let expect = counters::node(&node.store).unwrap();
    node.shutdown().await.unwrap();

    let restored = dir.path().join("restored");
    let (archive, out) = restore_archive_in(&out_dir, &restored);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("store format 3"));
    // Restoring over a store is refused.
    let again = run(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--data",
        restored.to_str().unwrap(),
    ]);
    assert!(!again.status.success());
    let err = text(&again.stderr);
    assert!(
        err.contains("is not empty: restore into a new directory")
            && !err.contains("not an Ankusa store"),
        "{err}"
    );
    let store = Store::open(&restored, &OpenOptions::default()).unwrap();
    // The pipeline kept moving rows (due -> scheduled) around the checkpoint, so compare
    // what the checkpoint cannot split: every row is somewhere, with all its bytes.
    let got = counters::node(&store).unwrap();
    let rows = |c: &ankusa_queue::counters::Counters| c.pending + c.scheduled + c.inflight + c.dead;
    assert_eq!(rows(&got), 40);
    assert_eq!(rows(&expect), 40);
    assert_eq!(got.bytes, expect.bytes);
    assert_eq!(ankusa_queue::tenants::count(&store).unwrap(), 4);
    assert!(fold::verify(&store).unwrap().is_empty());
}

/// `ankusa-relay restore` of the archive in `dir` into `into`: the archive and the output.
fn restore_archive_in(
    dir: &std::path::Path,
    into: &std::path::Path,
) -> (std::path::PathBuf, std::process::Output) {
    let archive = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .expect("an archive");
    let out = run(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--data",
        into.to_str().unwrap(),
    ]);
    (archive, out)
}

const BACKUP_TOKEN: &str = "it-backup-token-0123456789";
const TENANT_TOKEN: &str = "it-tenant-token-0123456789";

/// The node's backup staging directory holds no archive and no checkpoint.
fn nothing_staged(dir: &std::path::Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_token_streams_a_backup_and_can_do_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let staging = dir.path().join("staging");
    let node = start(
        parked()
            .admin_key(&format!("backup_dir: {}", staging.display()))
            .admin_token("it", ADMIN_TOKEN)
            .token_yaml(&format!(
                r#"{{ name: jobs, secret: {{ value: "{BACKUP_TOKEN}" }}, scope: backup }}"#
            ))
            .tenant_token("t0", TENANT_TOKEN, &["t0"]),
        dir.path(),
    )
    .await;
    let c = client();
    for i in 0..30 {
        let r = post(
            &c,
            &format!("http://{}/ingest/in", node.ingest_addr),
            &[("x-tenant", format!("t{}", i % 3))],
            format!("{{\"i\":{i}}}"),
        )
        .await;
        assert_eq!(r.status, 202);
    }
    let port = node.admin_addr.port();
    // The backup token opens nothing but the backup endpoints.
    for path in [
        "/v1/node",
        "/v1/dlq",
        "/v1/tenants/t0",
        "/v1/audit",
        "/v1/config",
    ] {
        let (status, body) = http_get_auth_token(port, path, BACKUP_TOKEN).unwrap();
        assert_eq!(status, 403, "{path}: {body}");
    }
    let admin = format!("http://{}", node.admin_addr);
    let out_dir = dir.path().join("pulled");
    let pull = |token: &'static str| {
        let (admin, out_dir) = (admin.clone(), out_dir.clone());
        tokio::task::spawn_blocking(move || {
            run(&[
                "backup",
                "pull",
                "--from",
                &admin,
                "--token",
                token,
                "--to",
                out_dir.to_str().unwrap(),
                "--idle-timeout-s",
                "20",
            ])
        })
    };
    // A tenant's token cannot take a backup.
    let refused = pull(TENANT_TOKEN).await.unwrap();
    assert!(!refused.status.success());
    assert!(
        text(&refused.stderr).contains("403"),
        "{}",
        text(&refused.stderr)
    );
    let pulled = pull(BACKUP_TOKEN).await.unwrap();
    assert!(pulled.status.success(), "{}", text(&pulled.stderr));
    assert!(text(&pulled.stdout).contains("store format 3"));
    // Streamed: nothing the size of the store stayed on the node's volume.
    assert_eq!(nothing_staged(&staging), Vec::<String>::new());
    let expect = counters::node(&node.store).unwrap();
    node.shutdown().await.unwrap();

    let restored = dir.path().join("restored");
    let (_, out) = restore_archive_in(&out_dir, &restored);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let store = Store::open(&restored, &OpenOptions::default()).unwrap();
    let got = counters::node(&store).unwrap();
    let rows = |c: &ankusa_queue::counters::Counters| c.pending + c.scheduled + c.inflight + c.dead;
    assert_eq!(rows(&got), 30);
    assert_eq!(got.bytes, expect.bytes);
    assert!(fold::verify(&store).unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_offline_backup_packs_a_closed_store_and_refuses_what_is_not_one() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    let node = start(parked().admin_token("it", ADMIN_TOKEN), dir.path()).await;
    let c = client();
    for i in 0..12 {
        let r = post(
            &c,
            &format!("http://{}/ingest/in", node.ingest_addr),
            &[("x-tenant", format!("t{}", i % 2))],
            format!("{{\"i\":{i}}}"),
        )
        .await;
        assert_eq!(r.status, 202);
    }
    node.shutdown().await.unwrap();
    let to = dir.path().join("backups");
    let report = dir.path().join("offline-report.json");
    let out = run(&[
        "backup",
        "offline",
        "--data",
        db.to_str().unwrap(),
        "--to",
        to.to_str().unwrap(),
        "--report",
        report.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut archives: Vec<_> = std::fs::read_dir(&to)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    archives.sort();
    // The archive, and recorded beside it the store format it holds (for retention) and
    // the size it unpacks to (for a restore's room check).
    assert_eq!(archives.len(), 3, "{archives:?}");
    assert!(archives[0].ends_with(".format") && archives[2].ends_with(".tar.zst"));
    assert!(archives[1].ends_with(".store-bytes"));
    assert_eq!(std::fs::read_to_string(to.join(&archives[0])).unwrap(), "3");
    assert_reports(&report, &to.join(&archives[2]));
    let restored = dir.path().join("restored");
    let (_, r) = restore_archive_in(&to, &restored);
    assert!(r.status.success(), "{}", text(&r.stderr));
    let store = Store::open(&restored, &OpenOptions::default()).unwrap();
    let got = counters::node(&store).unwrap();
    assert_eq!(got.pending + got.scheduled + got.inflight + got.dead, 12);

    // Not a store: refused, nothing written.
    let empty = dir.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let elsewhere = dir.path().join("elsewhere");
    let bad = run(&[
        "backup",
        "offline",
        "--data",
        empty.to_str().unwrap(),
        "--to",
        elsewhere.to_str().unwrap(),
    ]);
    assert!(!bad.status.success());
    assert!(!elsewhere.exists());
}

/// `restore --from <a node's backup directory>`: its newest archive; with
/// `--format-at-most`, the newest at that format (a rollback's); with `--replace`, the
/// store there is moved aside, never deleted, and the same restore run again changes
/// nothing.
#[test]
fn a_backup_directory_restores_its_newest_archive_at_a_format_and_replace_keeps_the_old_store() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("backups/hooks/hooks-0");
    std::fs::create_dir_all(&node).unwrap();
    // The format-2 backup taken before an upgrade, then a format-3 one after it.
    std::fs::copy(
        repo().join("crates/relay/tests/fixtures/store-v2.tar.zst"),
        node.join("b1000.tar.zst"),
    )
    .unwrap();
    let live = dir.path().join("live");
    store_with_hooks(&live, 30);
    let packed = run(&[
        "backup",
        "offline",
        "--data",
        live.to_str().unwrap(),
        "--to",
        node.to_str().unwrap(),
    ]);
    assert!(packed.status.success(), "{}", text(&packed.stderr));
    let from = node.to_str().unwrap();
    let data = dir.path().join("volume/data");

    let newest = run(&["restore", "--from", from, "--data", data.to_str().unwrap()]);
    assert!(newest.status.success(), "{}", text(&newest.stderr));
    assert!(
        text(&newest.stdout).contains("store format 3"),
        "{}",
        text(&newest.stdout)
    );

    // Back to format 2 over it: the format-3 store is moved aside.
    let back = [
        "restore",
        "--from",
        from,
        "--data",
        data.to_str().unwrap(),
        "--replace",
        "--format-at-most",
        "2",
    ];
    let out = run(&back);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    assert!(
        said.contains("b1000.tar.zst") && said.contains("store format 2"),
        "{said}"
    );
    let aside: Vec<_> = std::fs::read_dir(dir.path().join("volume"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("data.replaced-"))
        .collect();
    assert_eq!(aside.len(), 1, "{aside:?}");
    let kept = dir.path().join("volume").join(&aside[0]);
    assert_eq!(
        Store::open(&kept, &OpenOptions::inspect())
            .unwrap()
            .format()
            .unwrap(),
        3
    );
    // Nothing staged is left behind.
    let names: Vec<String> = std::fs::read_dir(dir.path().join("volume"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains("staged")), "{names:?}");

    // A retried Job: the same restore again finds its work done and moves nothing.
    let again = run(&back);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert!(
        text(&again.stdout).contains("nothing to do"),
        "{}",
        text(&again.stdout)
    );
    let aside_after = std::fs::read_dir(dir.path().join("volume"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("data.replaced-")
        })
        .count();
    assert_eq!(aside_after, 1);

    // No archive at format 1: refused, naming what is there.
    let none = run(&[
        "restore",
        "--from",
        from,
        "--data",
        dir.path().join("other").to_str().unwrap(),
        "--format-at-most",
        "1",
    ]);
    assert!(!none.status.success());
    let err = text(&none.stderr);
    assert!(
        err.contains("no archive in") && err.contains("(format 3)") && err.contains("(format 2)"),
        "{err}"
    );
}

/// `restore --replace --report`: the hooks the replaced store had acked after the backup
/// (its seq against the backup's), and, over a store that cannot be opened, why they
/// cannot be counted; a retried run gives the same report.
#[test]
fn a_restore_over_a_store_reports_the_hooks_it_acked_after_the_backup() {
    let dir = tempfile::tempdir().unwrap();
    let node = dir.path().join("backups/hooks/hooks-1");
    let data = dir.path().join("volume/data");
    store_with_hooks(&data, 30);
    let packed = run(&[
        "backup",
        "offline",
        "--data",
        data.to_str().unwrap(),
        "--to",
        node.to_str().unwrap(),
    ]);
    assert!(packed.status.success(), "{}", text(&packed.stderr));
    // Seven hooks acked after the backup.
    store_with_hooks(&data, 7);
    let report = dir.path().join("report.json");
    let args = [
        "restore",
        "--from",
        node.to_str().unwrap(),
        "--data",
        data.to_str().unwrap(),
        "--replace",
        "--report",
        report.to_str().unwrap(),
    ];
    let out = run(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("held 7 hooks acked after"),
        "{}",
        text(&out.stdout)
    );
    let read = |p: &std::path::Path| -> ankusa_api::node::NodeRestoreReport {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let r = read(&report);
    assert_eq!(r.lost_hooks, Some(7), "{r:?}");
    assert_eq!(r.replaced_seq, Some(r.backup_seq + 7));
    assert!(
        r.archive.starts_with('b') && r.archive.ends_with(".tar.zst"),
        "{r:?}"
    );
    // The same restore again (a retried Job): nothing moves, the same report.
    std::fs::remove_file(&report).unwrap();
    let again = run(&args);
    assert!(again.status.success(), "{}", text(&again.stderr));
    assert_eq!(read(&report), r);
    // Another restore of the same archive (`--once` names it): it restores again, over a
    // store that has acked since.
    store_with_hooks(&data, 2);
    let mut another = args.to_vec();
    another.extend(["--once", "hooks-restore-1-second"]);
    let out = run(&another);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        !text(&out.stdout).contains("nothing to do"),
        "{}",
        text(&out.stdout)
    );
    assert_eq!(read(&report).lost_hooks, Some(2));
    let again = run(&another);
    assert!(
        text(&again.stdout).contains("nothing to do"),
        "{}",
        text(&again.stdout)
    );

    // A store that does not open (its CURRENT file garbled): restored over, and the
    // report says why the hooks after the backup cannot be counted.
    let other = dir.path().join("volume2/data");
    store_with_hooks(&other, 3);
    std::fs::write(other.join("CURRENT"), b"MANIFEST-999999\n").unwrap();
    let args = [
        "restore",
        "--from",
        node.to_str().unwrap(),
        "--data",
        other.to_str().unwrap(),
        "--replace",
        "--report",
        report.to_str().unwrap(),
    ];
    let out = run(&args);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let r = read(&report);
    assert_eq!(r.lost_hooks, None, "{r:?}");
    assert!(r.replaced_unreadable.is_some(), "{r:?}");
    assert!(
        text(&out.stdout).contains("cannot be counted"),
        "{}",
        text(&out.stdout)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_runs_keeps_only_the_newest_store_a_restore_replaced() {
    let dir = tempfile::tempdir().unwrap();
    for ms in ["1000", "3000", "2000"] {
        let aside = dir.path().join(format!("db.replaced-{ms}"));
        std::fs::create_dir_all(&aside).unwrap();
        std::fs::write(aside.join("000001.sst"), "a store moved aside").unwrap();
    }
    // Not a replaced store: left alone.
    std::fs::create_dir_all(dir.path().join("db.replaced-notes")).unwrap();
    let node = start(parked(), dir.path()).await;
    let left = || {
        let mut v: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with("db.replaced-"))
            .collect();
        v.sort();
        v
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while left().len() > 2 {
        assert!(std::time::Instant::now() < deadline, "{:?}", left());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(left(), ["db.replaced-3000", "db.replaced-notes"]);
    node.shutdown().await.unwrap();
}

/// A backup's `--report` names `archive`, its size and format, and the room left on its
/// volume, as the file system gives it.
fn assert_reports(report: &std::path::Path, archive: &std::path::Path) {
    let r: ankusa_api::node::BackupRunReport =
        serde_json::from_str(&std::fs::read_to_string(report).unwrap()).unwrap();
    let name = archive.file_name().unwrap().to_string_lossy();
    assert_eq!(r.archive, name);
    assert_eq!(r.bytes, std::fs::metadata(archive).unwrap().len());
    assert_eq!(r.store_format, 3);
    let space = ankusa_store::volume_space(archive.parent().unwrap()).unwrap();
    let (free, total) = (r.volume_free_bytes.unwrap(), r.volume_bytes.unwrap());
    assert_eq!(total, space.total);
    assert!(free > 0 && free <= total, "{r:?}");
    // The newest archive of each format there: this one, and the store it unpacks to.
    let [f] = r.formats.as_slice() else {
        panic!("{r:?}")
    };
    assert_eq!(
        (f.store_format, &f.archive, f.bytes),
        (3, &r.archive, r.bytes)
    );
    assert!(f.store_bytes.is_some_and(|b| b > 0), "{r:?}");
}
