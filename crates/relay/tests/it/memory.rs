//! The node in a memory-limited cgroup (as in a pod with a memory limit): it reads the
//! limit, sizes the store's one shared cache and memtable budget from it (a quarter), and
//! under a backlog growing past the limit's size its resident memory stays under the limit
//! — no OOM kill, every hook acked.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ankusa_relay::testkit::free_port;

use crate::support::{client, get_text, log_tail, post, proc_node, Proc};

const LIMIT: u64 = 256 << 20;

/// A memory cgroup of this test's, removed (after its processes are gone) when dropped.
struct MemoryCgroup {
    dir: PathBuf,
    procs: PathBuf,
}

impl MemoryCgroup {
    /// Under cgroup v1's memory hierarchy, or v2's unified one.
    fn create(limit: u64) -> MemoryCgroup {
        let name = format!("ankusa-it-{:08x}", rand::random::<u32>());
        let v1 = Path::new("/sys/fs/cgroup/memory");
        let (dir, file) = if v1.join("memory.limit_in_bytes").exists() {
            (v1.join(&name), "memory.limit_in_bytes")
        } else {
            (Path::new("/sys/fs/cgroup").join(&name), "memory.max")
        };
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create the memory cgroup {}: {e}", dir.display()));
        let cg = MemoryCgroup {
            procs: dir.join("cgroup.procs"),
            dir,
        };
        std::fs::write(cg.dir.join(file), limit.to_string()).unwrap();
        cg
    }

    /// Times the kernel's OOM killer acted in this cgroup (v1: `oom_kill` of
    /// `memory.oom_control`; v2: `oom_kill` of `memory.events`).
    fn oom_kills(&self) -> u64 {
        ["memory.oom_control", "memory.events"]
            .iter()
            .filter_map(|f| std::fs::read_to_string(self.dir.join(f)).ok())
            .flat_map(|t| {
                t.lines()
                    .filter_map(|l| l.strip_prefix("oom_kill "))
                    .filter_map(|v| v.trim().parse::<u64>().ok())
                    .collect::<Vec<_>>()
            })
            .sum()
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        // Its processes are this test's, stopped before; an empty cgroup is removed.
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// `VmHWM` (peak resident set) and `VmRSS` of `pid`, in bytes.
fn rss(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse::<u64>().ok())
            .unwrap_or(0)
            * 1024
    };
    (kb("VmHWM:"), kb("VmRSS:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_a_memory_limit_the_store_is_sized_from_it_and_rss_stays_below() {
    let cg = MemoryCgroup::create(LIMIT);
    let dir = tempfile::tempdir().unwrap();
    // A sink that is down: every hook stays queued, the backlog only grows.
    let down = format!("http://127.0.0.1:{}/", free_port());
    let node = proc_node()
        .sink("down", &down)
        .route("main", &["down"])
        .open_source("in", "main");
    let mut p = Proc::start_in_cgroup(dir.path(), &node, &cg.procs);
    let pid = p.child.id();
    let admin = node.admin_port().unwrap();
    let ingest = node.ingest_port().unwrap();
    let metrics = || async move {
        get_text(&client(), &format!("http://127.0.0.1:{admin}/metrics"))
            .await
            .1
    };
    let gauge = |text: &str, name: &str| -> f64 {
        ankusa_relay::testkit::metric(text, name).unwrap_or(-1.0)
    };
    // The budget is a quarter of the limit, read from the cgroup.
    let mut m = String::new();
    for _ in 0..40 {
        m = metrics().await;
        if gauge(&m, "ankusa_store_memory_budget_bytes") > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        gauge(&m, "ankusa_store_memory_budget_bytes"),
        (LIMIT / 4) as f64,
        "{}",
        log_tail(dir.path(), 20)
    );

    // 4 KiB hooks, 64 000 of them: 250 MiB of bodies, about the limit itself.
    let body = bytes::Bytes::from(vec![b'x'; 4096]);
    let url = format!("http://127.0.0.1:{ingest}/ingest/in");
    let workers: Vec<_> = (0..16)
        .map(|w| {
            let (body, url) = (body.clone(), url.clone());
            tokio::spawn(async move {
                let c = client();
                for n in (w..64_000).step_by(16) {
                    let tenant = format!("t{}", n % 100);
                    let r = post(&c, &url, &[("x-tenant", tenant)], body.clone()).await;
                    assert_eq!(r.status, 202, "hook {n}");
                }
            })
        })
        .collect();
    let mut peak_cache = 0.0_f64;
    let mut done = false;
    while !done {
        tokio::time::sleep(Duration::from_millis(500)).await;
        done = workers.iter().all(|w| w.is_finished());
        let m = metrics().await;
        peak_cache = peak_cache.max(gauge(&m, "ankusa_store_memory_bytes"));
        assert!(
            p.child.try_wait().unwrap().is_none(),
            "the node exited under the limit (OOM kills: {}):\n{}",
            cg.oom_kills(),
            log_tail(dir.path(), 20)
        );
    }
    for w in workers {
        w.await.unwrap();
    }
    let (hwm, now) = rss(pid);
    let m = metrics().await;
    let queued = gauge(&m, r#"ankusa_queue_state{field="bytes"}"#);
    eprintln!(
        "limit {} MiB: peak RSS {} MiB, RSS now {} MiB, store cache peak {} MiB of {} MiB, {queued} bytes queued",
        LIMIT >> 20,
        hwm >> 20,
        now >> 20,
        (peak_cache as u64) >> 20,
        LIMIT >> 22,
    );
    assert_eq!(cg.oom_kills(), 0);
    assert!(hwm < LIMIT, "peak RSS {hwm} ≥ the limit {LIMIT}");
    // The shared cache holds to its budget (the memtables' charge is rounded up to whole
    // 256 KiB entries, and RocksDB does not refuse an insert past a soft capacity).
    assert!(
        peak_cache <= (LIMIT / 4) as f64 * 1.25,
        "the store's cache peaked at {peak_cache} bytes"
    );
    let status = p.stop(Duration::from_secs(30));
    assert!(status.success(), "{status}");
}

/// The limit is found for cgroup v2 (the lowest `memory.max` up the tree) and v1 (the
/// hierarchical limit), and "no limit" reads as none.
#[test]
fn the_cgroup_memory_limit_is_read_for_v1_and_v2() {
    use ankusa_relay::node::limits::cgroup_memory_limit_in;
    let root = tempfile::tempdir().unwrap();
    let r = root.path();
    // v2: a pod's limit one level up, none (max) on the container.
    std::fs::create_dir_all(r.join("kubepods/pod1/c1")).unwrap();
    std::fs::write(r.join("kubepods/pod1/memory.max"), "536870912\n").unwrap();
    std::fs::write(r.join("kubepods/pod1/c1/memory.max"), "max\n").unwrap();
    assert_eq!(
        cgroup_memory_limit_in("0::/kubepods/pod1/c1\n", r),
        Some(512 << 20)
    );
    assert_eq!(cgroup_memory_limit_in("0::/elsewhere\n", r), None);
    // v1: the hierarchical limit of memory.stat, else limit_in_bytes; unlimited is none.
    let v1 = r.join("memory/kubepods/pod2");
    std::fs::create_dir_all(&v1).unwrap();
    std::fs::write(v1.join("memory.limit_in_bytes"), "9223372036854771712\n").unwrap();
    std::fs::write(
        v1.join("memory.stat"),
        "cache 0\nhierarchical_memory_limit 268435456\n",
    )
    .unwrap();
    let own = "12:memory:/kubepods/pod2\n11:pids:/kubepods/pod2\n0::/\n";
    assert_eq!(cgroup_memory_limit_in(own, r), Some(256 << 20));
    std::fs::write(
        v1.join("memory.stat"),
        "hierarchical_memory_limit 9223372036854771712\n",
    )
    .unwrap();
    assert_eq!(cgroup_memory_limit_in(own, r), None);
    // v1 in a container: /proc/self/cgroup names the host's path, the container's own
    // cgroup is mounted at the hierarchy's root.
    std::fs::write(
        r.join("memory/memory.stat"),
        "hierarchical_memory_limit 134217728\n",
    )
    .unwrap();
    assert_eq!(
        cgroup_memory_limit_in("12:memory:/kubepods/burstable/pod9/abc\n", r),
        Some(128 << 20)
    );
}
