//! Broken disks: a full one. The data directory is a tmpfs the test mounts (root, as the
//! machine `make test` runs on), filled by ingest, then grown.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::*;
use ankusa_relay::testkit::TestSink;

/// A tmpfs mounted for the test, unmounted when dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        let out = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(at)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mounting a tmpfs for the full-disk test (it needs root): {}",
            text(&out.stderr)
        );
        Tmpfs(at.to_owned())
    }

    fn resize(&self, size: &str) {
        let out = std::process::Command::new("mount")
            .args(["-o", &format!("remount,size={size}")])
            .arg(&self.0)
            .output()
            .expect("mount");
        assert!(out.status.success(), "remount: {}", text(&out.stderr));
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.0).output();
    }
}

/// A full disk: ingest answers 503 `unavailable` once the store's writes fail and acks
/// nothing it did not commit; the node stops being ready (so traffic goes elsewhere) but
/// keeps serving health, `/v1/node` (which names the error) and metrics; when space
/// returns it is ready again by itself, ingest resumes, every acked hook is delivered —
/// those whose delivery was under way when the disk filled too (their outcomes are
/// committed once the store takes writes, not left inflight) — and the counters equal a
/// fold of the families. A full disk is not a stuck store: the node stays up through it
/// for longer than `writer.exit_when_stuck_ms`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_refuses_ingest_loses_nothing_acked_and_recovers_when_space_returns() {
    let dir = tempfile::tempdir().unwrap();
    let mnt = dir.path().join("small");
    std::fs::create_dir(&mnt).unwrap();
    let disk = Tmpfs::mount(&mnt, "24m");
    // A slow sink while the disk fills: deliveries are under way when it does.
    let sink = TestSink::start().await;
    sink.delay_ms
        .store(2_000, std::sync::atomic::Ordering::Relaxed);
    let data = mnt.join("db");
    let spec = proc_node()
        .data_dir(&data)
        .section("writer: { exit_when_stuck_ms: 1000 }")
        .sink("s", &sink.url("/hooks"))
        .route("r", &["s"])
        .open_source("in", "r");
    let (admin, ingest) = (spec.admin_port().unwrap(), spec.ingest_port().unwrap());
    let mut node = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || Proc::start(&dir, &spec)
    })
    .await
    .unwrap();
    let c = client();
    let url = format!("http://127.0.0.1:{ingest}/ingest/in");
    let body = vec![b'x'; 8 * 1024];
    let mut acked = std::collections::BTreeSet::new();
    let mut refused = None;
    for i in 0..20_000u64 {
        let r = post(
            &c,
            &url,
            &[("x-tenant", format!("t{}", i % 5))],
            body.clone(),
        )
        .await;
        match r.status {
            202 => {
                acked.insert(r.json()["id"].as_str().unwrap().to_owned());
            }
            _ => {
                refused = Some(r);
                break;
            }
        }
    }
    let refused = refused.expect("the disk filled up");
    assert_eq!(refused.status, 503);
    assert_eq!(refused.json()["error"], "unavailable");
    assert!(
        acked.len() > 100,
        "acked {} before the disk filled",
        acked.len()
    );
    // Not ready, still alive, and saying why.
    let get = |port: u16, path: &'static str| {
        tokio::task::spawn_blocking(move || http_get(port, path).unwrap())
    };
    let admin_get = |path: &'static str| {
        tokio::task::spawn_blocking(move || http_get_admin(admin, path).unwrap())
    };
    let (s, b) = get(ingest, "/readyz").await.unwrap();
    assert_eq!(s, 503, "{b}");
    assert!(b.contains("store_unavailable"), "{b}");
    assert_eq!(get(admin, "/healthz").await.unwrap().0, 200);
    let (s, b) = admin_get("/v1/node").await.unwrap();
    assert_eq!(s, 200);
    let status: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert!(
        status["write_error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("No space left")),
        "{status}"
    );
    let deadline = Instant::now() + Duration::from_secs(5);
    while !get(admin, "/metrics")
        .await
        .unwrap()
        .1
        .contains("ankusa_store_write_failing 1")
    {
        assert!(Instant::now() < deadline, "the failing gauge never rose");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let r = post(&c, &url, &[("x-tenant", "t1".into())], body.clone()).await;
    assert_eq!(r.status, 503, "still refused while full");
    // Full for three times `exit_when_stuck_ms` (three probes that fail for lack of
    // space): RocksDB resumes from that by itself, so the node must not exit.
    tokio::time::sleep(Duration::from_millis(3_000)).await;
    assert!(
        node.child.try_wait().unwrap().is_none(),
        "the node exited on a full disk; its log ends:\n{}",
        log_tail(dir.path(), 20)
    );
    let r = post(&c, &url, &[("x-tenant", "t1".into())], body.clone()).await;
    assert_eq!(r.status, 503, "still refused while full, and still up");
    // Space returns: ready again with no request to find out, and ingest resumes.
    disk.resize("256m");
    let deadline = Instant::now() + Duration::from_secs(60);
    while get(ingest, "/readyz").await.unwrap().0 != 200 {
        assert!(
            Instant::now() < deadline,
            "the node never became ready again"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let r = post(&c, &url, &[("x-tenant", "t1".into())], body.clone()).await;
    assert_eq!(r.status, 202, "ingest resumed");
    acked.insert(r.json()["id"].as_str().unwrap().to_owned());
    let (_, b) = admin_get("/v1/node").await.unwrap();
    let status: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert!(status["write_error"].is_null(), "{status}");
    // Every acked hook reaches the sink and nothing stays queued: no row is left
    // inflight by an outcome whose commit failed while the disk was full.
    sink.delay_ms.store(0, std::sync::atomic::Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let got: std::collections::BTreeSet<String> = sink
            .on("/hooks")
            .iter()
            .map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned())
            .collect();
        let (_, b) = admin_get("/v1/node").await.unwrap();
        let status: serde_json::Value = serde_json::from_str(&b).unwrap();
        let queued = ["pending", "scheduled", "inflight", "dead"]
            .iter()
            .map(|k| status["counters"][*k].as_u64().unwrap())
            .sum::<u64>();
        if acked.is_subset(&got) && queued == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{} acked hooks never delivered; queued: {}",
            acked.difference(&got).count(),
            status["counters"]
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // And after a stop, the counters equal a fold of the families.
    node.kill9();
    let out = run(&["store", "verify", "--data", data.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A backup whose volume fills: the call fails with `backup_failed` naming the cause,
/// nothing of it stays on the volume (no half-packed archive, no checkpoint), the node
/// keeps serving; with room, the next backup is whole. The same for `backup pull` into a
/// destination that fills.
#[test]
fn a_backup_that_runs_out_of_space_fails_cleanly_and_the_node_keeps_working() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("db");
    store_with_hooks(&data, 60_000);
    let small = dir.path().join("small");
    std::fs::create_dir(&small).unwrap();
    let volume = Tmpfs::mount(&small, "256k");
    let base = proc_node()
        .open_source("in", "r")
        .sink("a", "http://127.0.0.1:9/")
        .sink("b", "http://127.0.0.1:9/")
        .route("r", &["a", "b"]);
    let (admin, ingest) = (base.admin_port().unwrap(), base.ingest_port().unwrap());
    let spec = |backup_dir: &Path| {
        base.clone()
            .admin_key(&format!("backup_dir: {}", backup_dir.display()))
    };
    let empty = |d: &Path| std::fs::read_dir(d).unwrap().next().is_none();

    // `backup pull` into a destination that fills (the node's own staging has room).
    let node = Proc::start(dir.path(), &spec(&dir.path().join("staging")));
    let out = bin()
        .args([
            "backup",
            "pull",
            "--from",
            &format!("http://127.0.0.1:{admin}"),
            "--to",
        ])
        .arg(&small)
        .env("ANKUSA_ADMIN_TOKEN", ADMIN_TOKEN)
        .output()
        .unwrap();
    assert!(!out.status.success(), "{}", text(&out.stdout));
    assert!(
        text(&out.stderr).contains("No space left"),
        "{}",
        text(&out.stderr)
    );
    assert!(empty(&small), "the pull left its partial archive");
    drop(node);

    // The node's own backup volume fills: staged and streamed backups fail cleanly.
    let _node = Proc::start(dir.path(), &spec(&small));
    for path in ["/v1/backups", "/v1/backups/stream"] {
        let (status, body) = http_admin(admin, "POST", path, "", Duration::from_secs(60)).unwrap();
        assert_eq!(status, 500, "{path}: {body}");
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(v["error"], "backup_failed", "{path}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains("No space left"),
            "{v}"
        );
        assert!(empty(&small), "{path} left files on the volume");
    }
    // The node keeps working: ready, and taking hooks.
    assert_eq!(http_get(admin, "/readyz").unwrap().0, 200);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let r = rt.block_on(post(
        &client(),
        &format!("http://127.0.0.1:{ingest}/ingest/in"),
        &[("x-tenant", "acme".to_owned())],
        "{}",
    ));
    assert_eq!(r.status, 202);
    // With room, a whole backup.
    volume.resize("512m");
    let (status, body) =
        http_admin(admin, "POST", "/v1/backups", "", Duration::from_secs(60)).unwrap();
    assert_eq!(status, 200, "{body}");
    let names: Vec<String> = std::fs::read_dir(&small)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names.len(), 1, "{names:?}");
    assert!(names[0].ends_with(".tar.zst"), "{names:?}");
}

/// An ext4 image on a loop device, mounted for the test, unmounted when dropped.
struct LoopDisk {
    image: PathBuf,
    at: PathBuf,
}

impl LoopDisk {
    fn new(image: &Path, at: &Path, size: &str) -> LoopDisk {
        let ok = |c: &mut std::process::Command| {
            let out = c.output().expect("run");
            assert!(out.status.success(), "{c:?}: {}", text(&out.stderr));
        };
        ok(std::process::Command::new("truncate")
            .args(["-s", size])
            .arg(image));
        ok(std::process::Command::new("mkfs.ext4").arg("-q").arg(image));
        std::fs::create_dir_all(at).unwrap();
        let d = LoopDisk {
            image: image.to_owned(),
            at: at.to_owned(),
        };
        d.mount();
        d
    }

    fn mount(&self) {
        let out = std::process::Command::new("mount")
            .args(["-o", "loop"])
            .arg(&self.image)
            .arg(&self.at)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mounting a loop device for the I/O-error test (it needs root): {}",
            text(&out.stderr)
        );
    }

    fn unmount(&self) {
        let out = std::process::Command::new("umount")
            .arg(&self.at)
            .output()
            .expect("umount");
        assert!(out.status.success(), "umount: {}", text(&out.stderr));
    }

    /// ext4's shutdown ioctl (`EXT4_IOC_SHUTDOWN`, without flushing the journal): from
    /// now on every read, write and sync on the filesystem fails with EIO, as on a disk
    /// that died under the node. Returns when the call began and when it returned.
    ///
    /// The kernel does not order the shutdown against an `fdatasync` already under way: one
    /// that overlaps the call can return 0 for data the remounted filesystem does not hold
    /// (`docs/testing.md`, "A disk that fails under the WAL"). Only a sync that returned
    /// before the call began is a durability promise this model of a dead disk can check.
    #[allow(unsafe_code)]
    fn fail_every_io(&self) -> (Instant, Instant) {
        use std::os::fd::AsRawFd;
        const EXT4_IOC_SHUTDOWN: u32 = 0x8004_587D;
        const EXT4_GOING_FLAGS_NOLOGFLUSH: u32 = 2;
        let dir = std::fs::File::open(&self.at).expect("open the mount point");
        let flags = EXT4_GOING_FLAGS_NOLOGFLUSH;
        let began = Instant::now();
        // SAFETY: the descriptor is open for the call; the kernel reads one u32 through
        // the pointer, which points at a live local.
        let rc = unsafe { libc::ioctl(dir.as_raw_fd(), EXT4_IOC_SHUTDOWN as _, &flags) };
        let ended = Instant::now();
        assert_eq!(rc, 0, "shutdown ioctl: {}", std::io::Error::last_os_error());
        (began, ended)
    }
}

impl Drop for LoopDisk {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg(&self.at).output();
    }
}

/// One hook a sender posted, and its answer: a 202 (its id) or a 503.
struct Posted {
    headers: Vec<(&'static str, String)>,
    body: String,
    sent: Instant,
    /// The id of a 202; `None` for a 503.
    acked: Option<String>,
    answered: Instant,
}

/// `senders` tasks posting hooks to `url` until `stop`, each hook's body unique
/// (`{"w":sender,"n":count}`) and its headers from `headers(sender, count)`. An answer
/// other than 202 or 503 fails the test; after a 503, or no answer (a connection the node
/// dropped), a sender waits 5 ms. Each task returns what it posted and got answered.
fn spawn_senders(
    url: &str,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
    senders: u64,
    headers: fn(u64, u64) -> Vec<(&'static str, String)>,
) -> Vec<tokio::task::JoinHandle<Vec<Posted>>> {
    (0..senders)
        .map(|w| {
            let (url, stop) = (url.to_owned(), stop.clone());
            tokio::spawn(async move {
                let c = client();
                let mut posted = Vec::new();
                let mut n = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let (headers, body) = (headers(w, n), format!(r#"{{"w":{w},"n":{n}}}"#));
                    n += 1;
                    let sent = Instant::now();
                    let Some(r) = try_post(&c, &url, &headers, body.clone()).await else {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    };
                    let acked = match r.status {
                        202 => Some(r.json()["id"].as_str().unwrap().to_owned()),
                        s => {
                            assert_eq!(s, 503, "{:?}", r.json());
                            None
                        }
                    };
                    let refused = acked.is_none();
                    posted.push(Posted {
                        headers,
                        body,
                        sent,
                        acked,
                        answered: Instant::now(),
                    });
                    if refused {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                }
                posted
            })
        })
        .collect()
}

/// The disk under the store starts failing every I/O (the WAL's sync included) while
/// hooks arrive from eight senders: the node stops acking — every answer after the
/// failure is 503 — says why on `/v1/node` and `/readyz`, and every hook it acked before
/// the disk failed is in the store once the disk is back (remounted) and the node
/// restarted: delivered, with counters equal to a fold. An ack whose sync overlapped the
/// shutdown call itself is outside what the kernel's shutdown models (see
/// [`LoopDisk::fail_every_io`]); those few are counted and printed, not promised.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_io_error_under_the_wal_stops_every_ack_and_loses_nothing_acked() {
    let dir = tempfile::tempdir().unwrap();
    let disk = LoopDisk::new(
        &dir.path().join("disk.img"),
        &dir.path().join("mnt"),
        "256M",
    );
    let data = disk.at.join("db");
    let sink = TestSink::start().await;
    let spec = proc_node()
        .data_dir(&data)
        .admin_key("backup_dir: {dir}/backups")
        .section("dispatch: { tick_interval_ms: 20 }")
        // Deliveries that failed while the disk did (their hooks could not be read) come due
        // again within a second, not on the default schedule (5 s, 30 s, 120 s … with jitter).
        .section("retry: { schedule_ms: [200], jitter: none }")
        .sink("s", &sink.url("/hooks"))
        .route("r", &["s"])
        .open_source("in", "r");
    let (admin, ingest) = (spec.admin_port().unwrap(), spec.ingest_port().unwrap());
    let start = {
        let dir = dir.path().to_owned();
        move || {
            let (dir, spec) = (dir.clone(), spec.clone());
            tokio::task::spawn_blocking(move || Proc::start(&dir, &spec))
        }
    };
    let mut node = start().await.unwrap();
    let url = format!("http://127.0.0.1:{ingest}/ingest/in");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let senders = spawn_senders(&url, &stop, 8, |w, _| vec![("x-tenant", format!("t{w}"))]);
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (failing_from, failed_at) = disk.fail_every_io();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    // Not ready, saying why.
    let (s, b) = tokio::task::spawn_blocking(move || http_get(ingest, "/readyz").unwrap())
        .await
        .unwrap();
    assert_eq!(s, 503, "{b}");
    assert!(b.contains("store_unavailable"), "{b}");
    let (s, b) = tokio::task::spawn_blocking(move || http_get_admin(admin, "/v1/node").unwrap())
        .await
        .unwrap();
    assert_eq!(s, 200, "{b}");
    let status: serde_json::Value = serde_json::from_str(&b).unwrap();
    assert!(status["write_error"]["message"].is_string(), "{status}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // Acked before the shutdown call began: promised. Acked while it ran: not promised.
    let (mut acked, mut overlapping) = (std::collections::BTreeSet::new(), Vec::new());
    let mut acked_after = 0;
    let mut refusals = 0;
    for s in senders {
        for p in s.await.unwrap() {
            match p.acked {
                Some(id) => {
                    // Sent once the disk had failed: its commit could not have synced.
                    acked_after += usize::from(p.sent > failed_at);
                    if p.answered < failing_from {
                        acked.insert(id);
                    } else {
                        overlapping.push(id);
                    }
                }
                None => refusals += usize::from(p.answered > failed_at),
            }
        }
    }
    assert!(acked.len() > 50, "acked {} before the failure", acked.len());
    assert!(refusals > 0, "nothing was refused after the disk failed");
    assert_eq!(
        acked_after, 0,
        "hooks sent after the disk failed were acked"
    );
    node.kill9();
    // The disk comes back (the journal replays on mount); the node starts on the store.
    disk.unmount();
    disk.mount();
    let _node = start().await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let got: std::collections::BTreeSet<String> = sink
            .on("/hooks")
            .iter()
            .map(|r| r.headers["webhook-id"].to_str().unwrap().to_owned())
            .collect();
        let missing = acked.difference(&got).count();
        if missing == 0 {
            let lost = overlapping.iter().filter(|id| !got.contains(*id)).count();
            eprintln!(
                "{} acked before the shutdown call, all delivered; {} acked while it ran, \
                 {lost} of them not in the store after the remount",
                acked.len(),
                overlapping.len()
            );
            break;
        }
        if Instant::now() >= deadline {
            // Still queued (a delivery problem) or gone (a durability one)?
            let node = tokio::task::spawn_blocking(move || http_get_admin(admin, "/v1/node"))
                .await
                .unwrap();
            panic!(
                "{missing} of {} acked hooks never arrived; the node: {node:?}",
                acked.len()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(_node);
    let out = run(&["store", "verify", "--data", data.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}

/// A shared object for `LD_PRELOAD` that fails one call on a WAL file (`000123.log`) while the
/// flag file an environment variable names exists (the failing call removes it): with
/// `ANKUSA_IT_FAIL_WAL_SYNC`, an `fdatasync` or `fsync` fails with `ENOSPC`; with
/// `ANKUSA_IT_FAIL_WAL_WRITE`, a `write` fails with `EIO`. Everything else is real.
fn wal_fault(dir: &Path) -> PathBuf {
    const SHIM: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int armed_for(const char *var, int fd) {
    const char *flag = getenv(var);
    char link[64], path[4096];
    ssize_t n;
    if (!flag) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    n = readlink(link, path, sizeof path - 1);
    if (n < 4) return 0;
    path[n] = 0;
    /* A WAL file is digits then ".log" (the node's own log, relay.log, is not). */
    if (strcmp(path + n - 4, ".log") != 0) return 0;
    for (ssize_t i = n - 5; i >= 0 && path[i] != '/'; i--)
        if (path[i] < '0' || path[i] > '9') return 0;
    return unlink(flag) == 0;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (armed_for("ANKUSA_IT_FAIL_WAL_SYNC", fd)) { errno = ENOSPC; return -1; }
    return real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (armed_for("ANKUSA_IT_FAIL_WAL_SYNC", fd)) { errno = ENOSPC; return -1; }
    return real(fd);
}

ssize_t write(int fd, const void *buf, size_t count) {
    static ssize_t (*real)(int, const void *, size_t);
    if (!real) real = (ssize_t (*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
    if (armed_for("ANKUSA_IT_FAIL_WAL_WRITE", fd)) { errno = EIO; return -1; }
    return real(fd, buf, count);
}
"#;
    crate::support::preload_library(dir, "wal_fault", SHIM)
}

/// A node started with the WAL fault shim armed by `var` (see [`wal_fault`]), and what it
/// takes to start it again on the same store, as its supervisor would (the flag is gone
/// by then: the restarted node's calls are all real).
struct Faulty {
    dir: PathBuf,
    spec: ankusa_relay::testkit::NodeBuilder,
    env: [(&'static str, PathBuf); 2],
    node: Proc,
    /// Times the node exited stuck and was started again.
    restarts: usize,
}

impl Faulty {
    async fn start(
        dir: &Path,
        spec: &ankusa_relay::testkit::NodeBuilder,
        var: &'static str,
        flag: &Path,
    ) -> Faulty {
        let env = [("LD_PRELOAD", wal_fault(dir)), (var, flag.to_owned())];
        let node = Self::spawn(dir, spec, &env).await;
        Faulty {
            dir: dir.to_owned(),
            spec: spec.clone(),
            env,
            node,
            restarts: 0,
        }
    }

    async fn spawn(
        dir: &Path,
        spec: &ankusa_relay::testkit::NodeBuilder,
        env: &[(&'static str, PathBuf); 2],
    ) -> Proc {
        let (dir, spec, env) = (dir.to_owned(), spec.clone(), env.clone());
        tokio::task::spawn_blocking(move || {
            let env: Vec<(&str, &Path)> = env.iter().map(|(k, v)| (*k, v.as_path())).collect();
            Proc::start_with_env(&dir, &spec, &env)
        })
        .await
        .unwrap()
    }

    /// If the node has exited, it must have exited stuck (`EXIT_STORE_STUCK`, having said
    /// why in its log): it is started again, and `true` returned.
    async fn restart_if_exited(&mut self) -> bool {
        let Some(status) = self.node.child.try_wait().unwrap() else {
            return false;
        };
        let log = std::fs::read_to_string(self.dir.join("relay.log")).unwrap_or_default();
        assert_eq!(
            status.code(),
            Some(ankusa_relay::node::EXIT_STORE_STUCK),
            "the node died ({status}); its log ends:\n{}",
            log_tail(&self.dir, 30)
        );
        assert!(
            log.contains("exiting so that the node restarts and its open replays the WAL"),
            "it exited stuck without saying why; its log ends:\n{}",
            log_tail(&self.dir, 30)
        );
        self.node = Self::spawn(&self.dir, &self.spec, &self.env).await;
        self.restarts += 1;
        true
    }
}

/// One WAL sync fails (`ENOSPC`, as a thin-provisioned or quota'd disk reports it at
/// fsync) while hooks of new and known tenants arrive from four senders, and the store
/// takes writes again by itself. The batch of that sync is readable although its
/// requests were refused, so the writer must not hand its seqs or tenant ordinals out
/// again: every acked hook arrives with its own body, and after a SIGKILL the counters
/// equal a fold of the families (`store verify`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_sync_spends_its_batch_seqs_and_ordinals() {
    // The sink refuses until the load ends: the rows of the failed sync's batch are still
    // due when later batches are written, as they would be behind any backlog.
    wal_fails_once("ANKUSA_IT_FAIL_WAL_SYNC", 503).await;
}

/// The same with a healthy sink: the pipeline has caught up, so the batch whose sync
/// fails had its deliveries written inflight to start at the commit. The writer gives
/// their slots back and makes the rows due before its next batch: the hooks of that batch,
/// answered `duplicate` when sent again, are delivered once (a row left inflight would
/// never arrive).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_sync_leaves_none_of_its_started_deliveries_inflight() {
    wal_fails_once("ANKUSA_IT_FAIL_WAL_SYNC", 0).await;
}

/// One append to the WAL fails (`EIO`): an error RocksDB never resumes from (it refuses
/// every write until the database is opened again). The node exits with
/// `EXIT_STORE_STUCK` once its writes have failed for `writer.exit_when_stuck_ms`, and,
/// started again as its supervisor would, replays the WAL and acks again: every acked hook
/// arrives with its own body, the refused ones sent again are answered `duplicate` when
/// the store kept them, and the counters equal a fold of the families.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_wal_append_makes_the_node_exit_and_its_restart_resumes() {
    wal_fails_once("ANKUSA_IT_FAIL_WAL_WRITE", 0).await;
}

/// One WAL call fails (`var`: a sync or an append; see [`wal_fault`]) under load from four
/// senders, the sink answering `sink_status` (0: 200) until the load ends; see the tests
/// above. The node either resumes by itself (a failed sync: RocksDB recovers from the
/// no-space error) or exits stuck and is started again (a failed append; or a failed sync
/// whose marked WAL file another thread's write met first: RocksDB's log shows "Seen
/// error. Skip writing buffer.").
async fn wal_fails_once(var: &'static str, sink_status: u64) {
    let dir = tempfile::tempdir().unwrap();
    let flag = dir.path().join("fail-next-wal-call");
    let data = dir.path().join("db");
    let sink = TestSink::start().await;
    sink.default_status
        .store(sink_status, std::sync::atomic::Ordering::Relaxed);
    let spec = proc_node()
        .data_dir(&data)
        .section("retry: { schedule_ms: [300], jitter: none, max_attempts: 1000 }")
        .section("writer: { exit_when_stuck_ms: 1000 }")
        .sink("s", &sink.url("/hooks"))
        .route("r", &["s"])
        .source_yaml(
            "{ id: in, tenant: { header: x-tenant }, verify: { scheme: none }, \
               idempotency: { headers: [x-key] }, route: r }",
        );
    let ingest = spec.ingest_port().unwrap();
    let mut node = Faulty::start(dir.path(), &spec, var, &flag).await;
    let url = format!("http://127.0.0.1:{ingest}/ingest/in");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    // A new tenant every 20 hooks of each sender (batches allocate ordinals), and an
    // idempotency key per hook.
    let senders = spawn_senders(&url, &stop, 4, |w, n| {
        vec![
            ("x-tenant", format!("t{w}-{}", n / 20)),
            ("x-key", format!("w{w}-n{n}")),
        ]
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    std::fs::write(&flag, b"").unwrap();
    let armed = Instant::now();
    while flag.exists() {
        assert!(
            armed.elapsed() < Duration::from_secs(10),
            "no WAL call came in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let failed_at = Instant::now();
    // The node acks again, by itself or after a restart: the load goes on until it has
    // acked 60 more hooks (its hooks-per-sync sum), for at most 20 s; a failure prints
    // the node's log and RocksDB's error lines.
    let admin = spec.admin_port().unwrap();
    let acked_by_syncs = || async move {
        tokio::task::spawn_blocking(move || http_get(admin, "/metrics").ok())
            .await
            .unwrap()
            .map(|(_, text)| metric(&text, "ankusa_writer_batch_hooks_sum"))
    };
    let mut before = acked_by_syncs().await.unwrap_or_default();
    while failed_at.elapsed() < Duration::from_secs(20) {
        if node.restart_if_exited().await {
            // A new process: its sum starts again.
            before = 0.0;
        }
        if acked_by_syncs().await.is_some_and(|n| n - before >= 60.0) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let resumed_in = failed_at.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut acked, mut refused) = (std::collections::BTreeMap::new(), Vec::new());
    let mut acked_after = 0;
    for s in senders {
        for p in s.await.unwrap() {
            match p.acked {
                Some(id) => {
                    acked_after += usize::from(p.answered > failed_at);
                    assert!(acked.insert(id, p.body).is_none(), "an id was acked twice");
                }
                None => refused.push((p.headers, p.body)),
            }
        }
    }
    let refusals = refused.len();
    let restarts = node.restarts;
    assert!(refusals > 0, "the failed WAL call refused nothing");
    assert!(
        acked_after > 50,
        "the node acked {acked_after} hooks after the failed WAL call: it did not resume in \
         {resumed_in:?} ({restarts} restarts); its log ends:\n{}\nRocksDB's LOG on errors and \
         recovery:\n{}",
        log_tail(dir.path(), 30),
        std::fs::read_to_string(data.join("LOG"))
            .unwrap_or_default()
            .lines()
            .filter(|l| ["rror", "ecover", "esum", "bg"]
                .iter()
                .any(|w| l.contains(w)))
            .collect::<Vec<_>>()
            .join("\n")
    );
    if var == "ANKUSA_IT_FAIL_WAL_WRITE" {
        assert_eq!(
            restarts, 1,
            "a failed WAL append did not make the node exit"
        );
    }
    // The provider sends each refused hook again with its idempotency key. The hooks of
    // the batch whose WAL call failed are in the store (a failed sync's batch is applied;
    // after a restart, what its WAL holds is): the node answers `duplicate` with their id.
    let c = client();
    let mut duplicates = 0;
    for (headers, body) in refused {
        let r = post(&c, &url, &headers, body.clone()).await;
        assert!(matches!(r.status, 200 | 202), "{} {:?}", r.status, r.json());
        duplicates += usize::from(r.json()["duplicate"] == true);
        let id = r.json()["id"].as_str().unwrap().to_owned();
        assert!(acked.insert(id, body).is_none(), "an id was acked twice");
    }
    if var == "ANKUSA_IT_FAIL_WAL_SYNC" {
        assert!(
            duplicates > 0,
            "no refused hook was in the store: the failed sync's batch was not applied"
        );
    }
    sink.default_status
        .store(0, std::sync::atomic::Ordering::Relaxed);
    // Every acked hook arrives, with its own body. (A seq handed out again would have two
    // batches' rows name one hook: it arrives with two bodies, and the other never.)
    // Without a restart, once: with one, a delivery whose outcome commit failed while the
    // store was stuck is made again after it (at least once).
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut got: std::collections::BTreeMap<String, Vec<Vec<u8>>> = Default::default();
        for r in sink.on("/hooks").into_iter().filter(|r| r.status == 200) {
            let id = r.headers["webhook-id"].to_str().unwrap().to_owned();
            got.entry(id).or_default().push(r.body);
        }
        let missing = acked.keys().filter(|id| !got.contains_key(*id)).count();
        if missing == 0 {
            for (id, body) in &acked {
                assert!(
                    got[id].iter().all(|b| b == body.as_bytes()),
                    "hook {id}: its deliveries {:?}",
                    got[id]
                );
            }
            let twice = got.values().filter(|b| b.len() > 1).count();
            if restarts == 0 {
                assert_eq!(
                    twice, 0,
                    "{twice} hooks were delivered twice to a healthy sink"
                );
            }
            let mut bodies = std::collections::BTreeSet::new();
            for b in got.values().map(|b| &b[0]) {
                assert!(bodies.insert(b), "one body under two ids: {}", text(b));
            }
            eprintln!(
                "{} hooks acked ({acked_after} after the failed WAL call, the first 60 within \
                 {resumed_in:?}, {restarts} restarts), {refusals} refused and sent again \
                 ({duplicates} of them answered duplicate), all acked delivered ({twice} \
                 twice)",
                acked.len()
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{missing} of {} acked hooks never arrived",
            acked.len()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    node.node.kill9();
    // Resumed in place, the writer made the started deliveries of the failed batch due
    // again itself (after a restart, the boot's recovery of inflight rows does it).
    if sink_status == 0 && var == "ANKUSA_IT_FAIL_WAL_SYNC" && restarts == 0 {
        let log = std::fs::read_to_string(dir.path().join("relay.log")).unwrap_or_default();
        assert!(
            log.contains("deliveries of a failed commit that the store holds are due again"),
            "the failed batch started no delivery at its commit: the test did not test it"
        );
    }
    let out = run(&["store", "verify", "--data", data.to_str().unwrap()]);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
