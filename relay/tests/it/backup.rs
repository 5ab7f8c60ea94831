//! Backups over the admin API, pulled and restored by the command line.

use ankusa_relay::config::Config;
use ankusa_relay::node::Node;
use ankusa_relay::queue::{counters, fold};
use ankusa_relay::store::{OpenOptions, Store};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pulled_backup_restores_to_the_same_store() {
    let dir = tempfile::tempdir().unwrap();
    let yaml = format!(
        r#"
data_dir: {}
ingest: {{ listen: "127.0.0.1:0" }}
admin: {{ listen: "127.0.0.1:0", tokens: {ADMIN_TOKENS_YAML}, backup_keep: 1 }}
sinks: [{{ id: s, url: "http://127.0.0.1:9/never" }}]
routes: [{{ id: r, sinks: [s] }}]
retry: {{ schedule_ms: [3600000] }}
sources: [{{ id: in, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: r }}]
"#,
        dir.path().join("db").display()
    );
    let node = Node::start(Config::from_yaml(&yaml, Vec::new()).unwrap())
        .await
        .unwrap();
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
    let kept = tokio::task::spawn_blocking(move || {
        run(&[
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
    })
    .await
    .unwrap();
    assert!(kept.status.success(), "{}", text(&kept.stderr));
    let second = archives(&out_dir);
    assert_eq!(second.len(), 1, "{second:?}");
    assert_ne!(second, first);
    assert!(out_dir.join("notes.txt").exists());
    let expect = counters::node(&node.store).unwrap();
    node.shutdown().await.unwrap();

    let archive = std::fs::read_dir(&out_dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.to_string_lossy().ends_with(".tar.zst"))
        .expect("an archive");
    let restored = dir.path().join("restored");
    let out = run(&[
        "restore",
        "--from",
        archive.to_str().unwrap(),
        "--data",
        restored.to_str().unwrap(),
    ]);
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
    let store = Store::open(&restored, &OpenOptions::default()).unwrap();
    // The pipeline kept moving rows (due -> scheduled) around the checkpoint, so compare
    // what the checkpoint cannot split: every row is somewhere, with all its bytes.
    let got = counters::node(&store).unwrap();
    let rows = |c: &ankusa_relay::queue::Counts| c.pending + c.scheduled + c.inflight + c.dead;
    assert_eq!(rows(&got), 40);
    assert_eq!(rows(&expect), 40);
    assert_eq!(got.bytes, expect.bytes);
    assert_eq!(ankusa_relay::queue::tenants::count(&store).unwrap(), 4);
    assert!(fold::verify(&store).unwrap().is_empty());
}
