//! What the node opens its store with: the store's options from the configuration and
//! the memory the cgroup allows, and the process's open-file limit.

use ankusa_config::Config;
use ankusa_queue::engine::OpenOptions;

/// This process's `RLIMIT_NOFILE`.
#[allow(unsafe_code)]
fn nofile() -> std::io::Result<libc::rlimit> {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `getrlimit` writes the one struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(l)
}

/// A limit, `None` when unlimited.
fn finite(n: libc::rlim_t) -> Option<u64> {
    (n != libc::RLIM_INFINITY).then_some(n)
}

/// The soft `RLIMIT_NOFILE` of this process (`None`: unlimited, or unreadable).
/// The memory limit of this process's cgroup, if it has one: cgroup v2's `memory.max`, or
/// v1's `memory.limit_in_bytes` (where "no limit" is a number near `i64::MAX`).
pub fn cgroup_memory_limit() -> Option<u64> {
    let own = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroup_memory_limit_in(&own, std::path::Path::new("/sys/fs/cgroup"))
}

/// [`cgroup_memory_limit`] for a `/proc/self/cgroup` of `own` under the cgroup mount `root`.
pub fn cgroup_memory_limit_in(own: &str, root: &std::path::Path) -> Option<u64> {
    let read = |p: std::path::PathBuf| -> Option<u64> {
        let text = std::fs::read_to_string(p).ok()?;
        // Unlimited: "max" (v2), or the page-rounded i64::MAX (v1).
        text.trim().parse::<u64>().ok().filter(|n| *n < 1 << 60)
    };
    for line in own.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let path = path.trim_start_matches('/');
        if controllers.is_empty() {
            // v2: the unified hierarchy. A limit anywhere up the tree bounds this one.
            let mut dir = root.join(path);
            if !dir.exists() {
                dir = root.to_path_buf();
            }
            let mut lowest: Option<u64> = None;
            loop {
                if let Some(n) = read(dir.join("memory.max")) {
                    lowest = Some(lowest.map_or(n, |l| l.min(n)));
                }
                if dir == root || !dir.pop() {
                    break;
                }
            }
            if lowest.is_some() {
                return lowest;
            }
        } else if controllers.split(',').any(|c| c == "memory") {
            // v1 (hierarchical by default: the limit in force is the smallest up the tree,
            // which the kernel reports as hierarchical_memory_limit).
            // In a container without its own cgroup namespace the path is the host's, and
            // the container's cgroup is mounted at the hierarchy's root instead.
            let mut dir = root.join("memory").join(path);
            if !dir.exists() {
                dir = root.join("memory");
            }
            if let Some(n) = std::fs::read_to_string(dir.join("memory.stat"))
                .ok()
                .and_then(|t| {
                    t.lines()
                        .find_map(|l| l.strip_prefix("hierarchical_memory_limit "))
                        .and_then(|v| v.trim().parse::<u64>().ok())
                })
                .filter(|n| *n < 1 << 60)
            {
                return Some(n);
            }
            return read(dir.join("memory.limit_in_bytes"));
        }
    }
    None
}

/// The options a node opens its store with: at most half of this process's open-file
/// limit in table files ([`ankusa_queue::engine::max_open_files_for`]) and one memory budget
/// ([`store_memory_budget`], from `store.memory_bytes` or the cgroup's limit). Whatever
/// else opens the same store to do a node's work (the benches' twins) opens it so too.
pub fn store_options(config: &Config) -> OpenOptions {
    OpenOptions {
        max_open_files: ankusa_queue::engine::max_open_files_for(open_files_limit()),
        memory: Some(store_memory_budget(config, cgroup_memory_limit())),
        ..OpenOptions::default()
    }
}

/// The store's memory budget: `store.memory_bytes`, else a quarter of the cgroup's memory
/// `limit` (the rest is the node's own: requests in flight, writer batches, delivery
/// buffers), else 512 MiB.
pub fn store_memory_budget(
    config: &Config,
    limit: Option<u64>,
) -> ankusa_queue::engine::MemoryBudget {
    let total = config
        .store
        .memory_bytes
        .or(limit.map(|l| l / 4))
        .unwrap_or(512 << 20);
    ankusa_queue::engine::MemoryBudget::of_total(total)
}

pub fn open_files_limit() -> Option<u64> {
    nofile().ok().and_then(|l| finite(l.rlim_cur))
}

/// Raises the soft `RLIMIT_NOFILE` to the hard limit. Container runtimes start processes
/// with a soft limit of 1 024, which a store of tens of GB (thousands of table files) and
/// a few hundred connections exceed; the hard limit is what the runtime allows. Answers the
/// soft limits before and after (`None`: unlimited).
#[allow(unsafe_code)]
pub fn raise_open_files_limit() -> std::io::Result<(Option<u64>, Option<u64>)> {
    let mut l = nofile()?;
    let before = finite(l.rlim_cur);
    if l.rlim_cur != l.rlim_max {
        l.rlim_cur = l.rlim_max;
        // SAFETY: `setrlimit` reads the one struct it is given.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &l) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok((before, finite(l.rlim_cur)))
}
