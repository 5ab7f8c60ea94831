//! A node's boot as a container runtime sees it: the listeners answer before the store
//! opens, a stop signal during the boot ends the process at once, and the open-file limit
//! is raised and bounds the store.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::support::{bin, http_get, http_raw, log_tail, proc_node, store_with_hooks, Proc};

/// A shared object for `LD_PRELOAD` that holds the first open of a `MANIFEST-*` file for
/// `ANKUSA_IT_SLOW_OPEN_MS` milliseconds: a store on a slow disk freshly attached (or a WAL
/// of gigabytes to replay) as the node sees it. Every call is real.
fn slow_open(dir: &Path) -> PathBuf {
    const HOOK: &str = r#"
static int held;

static void hook(const char *path, int flags) {
    (void)flags;
    const char *ms = getenv("ANKUSA_IT_SLOW_OPEN_MS");
    const char *base = strrchr(path, '/');
    base = base ? base + 1 : path;
    if (!ms || held || strncmp(base, "MANIFEST-", 9) != 0) return;
    held = 1;
    long n = atol(ms);
    struct timespec t = { n / 1000, (n % 1000) * 1000000L };
    nanosleep(&t, 0);
}
"#;
    open_hook(dir, "slow_open", HOOK)
}

/// A shared object for `LD_PRELOAD` whose `open` and `open64` call the C function
/// `hook(path, flags)` defined in `hook`, then the real call.
fn open_hook(dir: &Path, name: &str, hook: &str) -> PathBuf {
    const HEAD: &str = r#"
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
"#;
    const OPEN: &str = r#"
#define OPEN(name)                                                              \
    int name(const char *path, int flags, ...) {                                \
        static int (*real)(const char *, int, ...);                             \
        if (!real) real = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, #name); \
        mode_t mode = 0;                                                        \
        if (flags & (O_CREAT | O_TMPFILE)) {                                    \
            va_list ap; va_start(ap, flags); mode = va_arg(ap, mode_t); va_end(ap); \
        }                                                                       \
        hook(path, flags);                                                      \
        return real(path, flags, mode);                                         \
    }
OPEN(open)
OPEN(open64)
"#;
    crate::support::preload_library(dir, name, &format!("{HEAD}{hook}{OPEN}"))
}

/// Waits up to `limit` for `f` to answer `Some`.
fn until<T>(limit: Duration, what: &str, dir: &Path, mut f: impl FnMut() -> Option<T>) -> T {
    let end = Instant::now() + limit;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < end,
            "{what} within {limit:?}; the node's log ends:\n{}",
            log_tail(dir, 30)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The store's open held for 20 s: `/healthz` answers on both listeners from the first
/// second, `/readyz` 503 `store_opening`, ingest 503 `not_ready` (with `Retry-After`), and
/// a SIGTERM ends the process at once (143), as a pod deleted during a slow boot must not
/// wait out its grace period. The store is untouched: the next start finds every hook.
#[test]
fn the_listeners_answer_while_the_store_opens_and_a_sigterm_then_ends_the_process() {
    let dir = tempfile::tempdir().unwrap();
    store_with_hooks(&dir.path().join("db"), 30);
    let node = proc_node();
    let (admin, ingest) = (node.admin_port().unwrap(), node.ingest_port().unwrap());
    let shim = slow_open(dir.path());
    let started = Instant::now();
    let mut p = Proc::spawn_with_env(
        dir.path(),
        &node,
        &[
            ("LD_PRELOAD", shim.as_path()),
            ("ANKUSA_IT_SLOW_OPEN_MS", Path::new("20000")),
        ],
    );
    for port in [admin, ingest] {
        let (status, body) = until(
            Duration::from_secs(5),
            "/healthz answered",
            dir.path(),
            || http_get(port, "/healthz").ok(),
        );
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        let (status, body) = http_get(port, "/readyz").unwrap();
        assert_eq!(status, 503, "{body}");
        assert!(body.contains("store_opening"), "{body}");
    }
    let (status, body) = http_raw(
        ingest,
        "POST",
        "/ingest/it",
        &["content-type: application/json".into()],
        "{}",
        Duration::from_secs(5),
    )
    .unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("not_ready"), "{body}");
    assert!(
        started.elapsed() < Duration::from_secs(15),
        "the checks ran while the store's open was held"
    );
    let log = std::fs::read_to_string(dir.path().join("relay.log")).unwrap();
    assert!(
        log.contains("listening; opening the store") && !log.contains("store: opened"),
        "the store's open was still held: {}",
        log_tail(dir.path(), 20)
    );

    let term = Instant::now();
    p.sigterm();
    let status = until(
        Duration::from_secs(3),
        "the process ended after SIGTERM",
        dir.path(),
        || p.child.try_wait().unwrap(),
    );
    assert_eq!(
        status.code(),
        Some(ankusa_relay::node::EXIT_STOPPED_DURING_BOOT),
        "{}",
        log_tail(dir.path(), 20)
    );
    assert!(term.elapsed() < Duration::from_secs(3));
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "it did not wait for the open"
    );

    let again = Proc::start(dir.path(), &node);
    let (status, body) = crate::support::http_get_admin(admin, "/v1/node").unwrap();
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["tenants"], 3, "{body}");
    drop(again);
}

/// A node started with a soft open-file limit of 256 and a hard one of 2 048 (as a
/// container runtime may start it) raises the soft limit to the hard one, which
/// `/proc/<pid>/limits` shows, and keeps at most half of it as the store's open files.
#[test]
fn a_node_raises_its_open_file_limit_and_bounds_the_store_by_it() {
    let dir = tempfile::tempdir().unwrap();
    let node = proc_node();
    let cfg = dir.path().join("relay.yaml");
    std::fs::write(&cfg, node.yaml_at(dir.path())).unwrap();
    let log = std::fs::File::create(dir.path().join("relay.log")).unwrap();
    let relay = bin().get_program().to_owned();
    let child = std::process::Command::new("prlimit")
        .arg("--nofile=256:2048")
        .arg(relay)
        .args(["run", "--config", cfg.to_str().unwrap()])
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .expect("run prlimit (util-linux)");
    let p = Proc { child };
    let admin = node.admin_port().unwrap();
    until(
        Duration::from_secs(60),
        "the node became ready",
        dir.path(),
        || matches!(http_get(admin, "/readyz"), Ok((200, _))).then_some(()),
    );
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", p.child.id())).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let numbers: Vec<&str> = line.split_whitespace().skip(3).take(2).collect();
    assert_eq!(numbers, ["2048", "2048"], "{line}");
    let log = std::fs::read_to_string(dir.path().join("relay.log")).unwrap();
    assert!(
        log.contains("raised the soft open-file limit to the hard limit"),
        "{log}"
    );
    assert!(log.contains("store_max_open_files=1024"), "{log}");
}

/// A shared object for `LD_PRELOAD` that appends the path of every file ending in `.log`
/// (RocksDB's write-ahead logs) the process opens for reading (a replay; RocksDB also
/// opens the last log again to append to it) to the file `ANKUSA_IT_OPEN_LOG` names.
fn wal_opens(dir: &Path) -> PathBuf {
    const HOOK: &str = r#"
static int (*real_open)(const char *, int, ...);

static void hook(const char *path, int flags) {
    const char *out = getenv("ANKUSA_IT_OPEN_LOG");
    size_t n = strlen(path);
    if (!out || (flags & O_ACCMODE) != O_RDONLY || n < 4 || strcmp(path + n - 4, ".log") != 0) return;
    if (!real_open) real_open = (int (*)(const char *, int, ...))dlsym(RTLD_NEXT, "open");
    int fd = real_open(out, O_WRONLY | O_APPEND | O_CREAT, 0644);
    if (fd < 0) return;
    (void)!write(fd, path, n);
    (void)!write(fd, "\n", 1);
    close(fd);
}
"#;
    open_hook(dir, "wal_opens", HOOK)
}

/// A node's start reads each write-ahead log of its store once: the format guard takes
/// the format from the store's format file instead of a first, read-only open. A store
/// without the file (an older one) is checked the old way, which reads each log twice, and
/// gets the file at that start.
#[test]
fn a_start_reads_the_write_ahead_log_once() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("db");
    store_with_hooks(&db, 30);
    let node = proc_node();
    let shim = wal_opens(dir.path());
    let opens_log = dir.path().join("opens.txt");
    // The logs the store holds before a start, and how often that start opened each.
    let wals = |db: &Path| -> Vec<String> {
        let mut w: Vec<String> = std::fs::read_dir(db)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".log") && std::fs::metadata(db.join(n)).unwrap().len() > 0)
            .collect();
        w.sort();
        w
    };
    let opens = |wals: Vec<String>| -> Vec<(String, usize)> {
        let text = std::fs::read_to_string(&opens_log).unwrap_or_default();
        let _ = std::fs::remove_file(&opens_log);
        wals.into_iter()
            .map(|w| {
                let n = text
                    .lines()
                    .filter(|l| l.ends_with(&format!("/{w}")))
                    .count();
                (w, n)
            })
            .collect()
    };
    let env = [
        ("LD_PRELOAD", shim.as_path()),
        ("ANKUSA_IT_OPEN_LOG", opens_log.as_path()),
    ];
    let start = |env: &[(&str, &Path)]| {
        let p = Proc::start_with_env(dir.path(), &node, env);
        drop(p);
    };
    assert!(db.join(ankusa_store::FORMAT_FILE).exists());
    let before = wals(&db);
    assert!(
        !before.is_empty(),
        "the store has no write-ahead log to replay"
    );
    start(&env);
    let once = opens(before);
    assert!(once.iter().all(|(_, n)| *n == 1), "{once:?}");

    // More hooks in a fresh log (the start above recovered and replaced the first ones),
    // and the store's format file gone.
    store_with_hooks(&db, 30);
    std::fs::remove_file(db.join(ankusa_store::FORMAT_FILE)).unwrap();
    let before = wals(&db);
    start(&env);
    let twice = opens(before);
    assert!(
        twice.iter().any(|(_, n)| *n == 2),
        "without the format file the guard opens the store first: {twice:?}"
    );
    assert!(db.join(ankusa_store::FORMAT_FILE).exists());
}
