//! The embedded RocksDB store of a relay node: the only crate of the workspace that
//! depends on `rocksdb` (`make check-layers` holds every other crate to it). It knows key
//! bytes, families and formats, never queue semantics: the format migrations and the older
//! layouts they read sit above it, in the queue crate's `formats` module, and are handed to
//! [`migrate::run`] as a [`migrate::Registry`]. Start at [`Store::open`] and [`Rows`].
//!
//! # What it owns
//! - The column families ([`Cf`]) and their options: `counters` gets a 1 MiB write buffer,
//!   no compression and the i64-add merge operator ([`merge`]); the other index families
//!   (`index`, `tenants`) get 16 MiB buffers.
//! - Every key layout (crate `ankusa-keyspace`); nothing outside it builds key bytes.
//! - Atomic batches: [`Rows::write`] applies a list of [`Op`]s as one write batch, synced
//!   or not. An acked hook is only ever acked after a synced batch that holds it. The row
//!   API ([`Rows`]: writes, point reads, scans) is a trait the queue crate names and the
//!   node cannot (it holds the store through `ankusa_queue::engine`).
//! - Scans that cannot mistake corruption for a clean end, without walking past their
//!   range: every scan's iterator is bounded to exactly `[from, to)` (so it never steps
//!   over the tombstones between its range and the next live key), an iterator error is
//!   an error, and every family has lo/hi sentinel keys, written when the family is
//!   created, that a scan reaching the family's end must meet: a scan of the whole family
//!   (or up to its end) that runs dry before its sentinel returns
//!   [`StoreError::Corruption`].
//! - The format stamp (`m:format` in `default`) and the format guard: a store stamped with
//!   a format newer than [`SUPPORTED_FORMAT`] is refused before anything is written, so the
//!   files on disk are left byte for byte as they were.
//! - Migrations ([`migrate`]): a registry of `{from, to, migration}` run step by step, each
//!   step's ops and cursor in one synced batch, resumable after a crash.
//!
//! # Invariants
//! - Sentinels are written only when a family is created (a new store, a new column
//!   family, or a migration's set-up), never to "repair" a store: a missing sentinel must
//!   stay visible as corruption.
//! - Reads are instrumented ([`StoreStats`]): scans per family and point reads per column
//!   family, so tests can prove which families a code path touches.

mod error;
pub mod merge;
pub mod migrate;
mod rows;
mod stats;
pub mod tarball;

pub use error::{corruptions, StoreError};
pub use rows::{sentinel_ops, tombstones_walked, Dir, KeyValue, Op, Rows, Scan};
pub use stats::{StatsSnapshot, StoreStats};

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use rocksdb::{
    BlockBasedOptions, Cache, ColumnFamilyDescriptor, DBCompressionType, Options,
    WriteBufferManager, DB,
};

use ankusa_keyspace::Family;

use stats::{cf_slot, every_family, family_slot, N_FAMILIES};

/// The newest store format this binary reads and writes.
pub const SUPPORTED_FORMAT: u32 = 3;

use ankusa_keyspace::now_ms;
use ankusa_tarball::RESTORING_MARKER;

/// The hooks family's blob garbage collection: the oldest quarter of the blob files is
/// rewritten by the compactions that reach it (RocksDB's default, written out because
/// [`Store::scrub`] sets it back after taking every file).
const BLOB_GC_AGE_CUTOFF: f64 = 0.25;

/// The store's format beside its files (`3\n`), so that an open reads the WAL once: the
/// format guard reads this file instead of opening the store a first time, read-only, for
/// `m:format`. [`Store::record_format`] writes it (synced, then renamed into place) before
/// the batch that stamps `m:format` commits — the creation's and a migration's last — so
/// it is never below the stamp: at worst, after a crash between the two, it names the
/// format a migration was finishing. A store without it (made before it existed, or
/// restored from a checkpoint) is checked the old way once and gets it at its first
/// read-write open.
pub const FORMAT_FILE: &str = "ANKUSA-FORMAT";

/// The format [`FORMAT_FILE`] names in `dir`; `None` if there is none or it does not parse
/// (the guard then reads `m:format` itself).
fn read_format_file(dir: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(dir.join(FORMAT_FILE)).ok()?;
    text.trim().parse().ok()
}

/// Writes [`FORMAT_FILE`] atomically and durably.
fn write_format_file(dir: &Path, format: u32) -> Result<(), StoreError> {
    use std::io::Write;
    let tmp = dir.join(format!("{FORMAT_FILE}.tmp"));
    let context = || format!("writing {}", dir.join(FORMAT_FILE).display());
    let mut f = std::fs::File::create(&tmp).map_err(io(context()))?;
    f.write_all(format!("{format}\n").as_bytes())
        .and_then(|()| f.sync_all())
        .map_err(io(context()))?;
    std::fs::rename(&tmp, dir.join(FORMAT_FILE)).map_err(io(context()))?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io(context()))
}

use ankusa_keyspace::Cf;

/// How many leading key bytes name an insert stream in a column family's memtable, where
/// its writes interleave several of them: the family tag in `audit` (`?l`, `?i`, `?v`,
/// each in seq or id order), the tenant's ordinal in `counters`, the tag and the ordinal in
/// `index` (a tenant's due and inflight rows). RocksDB keeps the last insert position per
/// stream (`memtable_insert_with_hint_prefix_extractor`), so the next key of a stream,
/// which lands next to the last one, skips the skip list's search from the top. The
/// positions are kept in the memtable and count toward its size (about 250 bytes per
/// stream it has seen); the families of one key stream (`hooks`, `deliveries`) already
/// reuse the memtable's own last position. See docs/performance.md.
pub(crate) fn insert_hint_prefix(cf: Cf) -> Option<usize> {
    match cf {
        Cf::Audit => Some(1),
        Cf::Counters => Some(4),
        Cf::Index => Some(5),
        _ => None,
    }
}

/// One memory budget for the whole store: a block cache every column family shares, and
/// a write-buffer manager that charges every family's memtables to that cache and flushes
/// the largest when their sum passes `write_buffer_bytes`. Without one, each family keeps
/// RocksDB's own block cache and its memtables are bounded only per family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemoryBudget {
    /// Blocks read from table files (data, index and filter blocks).
    pub block_cache_bytes: usize,
    /// Every family's memtables together.
    pub write_buffer_bytes: usize,
}

impl MemoryBudget {
    /// The smallest budget a store is given: below it flushes would follow every batch.
    pub const MIN_BYTES: u64 = 32 << 20;

    /// A budget of `total` bytes (at least [`MemoryBudget::MIN_BYTES`]): half for the
    /// memtables (at most 512 MiB: more only delays flushes), the rest for the cache.
    pub fn of_total(total: u64) -> MemoryBudget {
        let total = usize::try_from(total.max(Self::MIN_BYTES)).unwrap_or(usize::MAX);
        let write_buffer_bytes = (total / 2).min(512 << 20);
        MemoryBudget {
            block_cache_bytes: total - write_buffer_bytes,
            write_buffer_bytes,
        }
    }
}

/// The shared cache and write-buffer manager of a [`MemoryBudget`].
struct SharedMemory {
    cache: Cache,
    write_buffers: WriteBufferManager,
}

impl SharedMemory {
    fn of(budget: &MemoryBudget) -> SharedMemory {
        // The cache holds the memtables' charge too, so its capacity is the whole budget.
        let cache = Cache::new_lru_cache(
            budget
                .block_cache_bytes
                .saturating_add(budget.write_buffer_bytes),
        );
        let write_buffers = WriteBufferManager::new_write_buffer_manager_with_cache(
            budget.write_buffer_bytes,
            false,
            cache.clone(),
        );
        SharedMemory {
            cache,
            write_buffers,
        }
    }
}

/// RocksDB's options of a column family.
fn cf_options(cf: Cf, memory: Option<&SharedMemory>) -> Options {
    // The C API has no setter for the hint's extractor: it is set by name, as in an
    // OPTIONS file. A name RocksDB did not know would leave the default (no hints); the
    // test `memtables_keep_an_insert_hint_per_stream` reads the options back.
    let mut o = match insert_hint_prefix(cf) {
        Some(n) => Options::default()
            .get_options_from_string(format!(
                "memtable_insert_with_hint_prefix_extractor=rocksdb.CappedPrefix.{n}"
            ))
            .unwrap_or_default(),
        None => Options::default(),
    };
    match cf {
        Cf::Counters => {
            // Small buffer: a flush collapses the memtable's operands, which bounds the
            // operands a counter read has to apply.
            o.set_write_buffer_size(1 << 20);
            o.set_compression_type(DBCompressionType::None);
            o.set_merge_operator(merge::NAME, merge::full_merge, merge::partial_merge);
        }
        Cf::Index | Cf::Tenants => {
            o.set_write_buffer_size(16 << 20);
            o.set_compression_type(DBCompressionType::None);
        }
        Cf::Hooks => {
            o.set_write_buffer_size(64 << 20);
            o.set_compression_type(DBCompressionType::Zstd);
            o.set_enable_blob_files(true);
            o.set_min_blob_size(512);
            o.set_blob_file_size(64 << 20);
            o.set_blob_compression_type(DBCompressionType::Zstd);
            o.set_enable_blob_gc(true);
            o.set_blob_gc_age_cutoff(BLOB_GC_AGE_CUTOFF);
        }
        Cf::Archive | Cf::Quarantine => {
            o.set_write_buffer_size(64 << 20);
            o.set_compression_type(DBCompressionType::Zstd);
        }
        Cf::Default | Cf::Deliveries | Cf::Audit => {
            o.set_write_buffer_size(16 << 20);
            o.set_compression_type(DBCompressionType::None);
        }
    }
    if matches!(cf, Cf::Hooks | Cf::Deliveries | Cf::Index) {
        // A filter over the memtables' whole keys (2% of the write buffer, allocated in
        // it): a point read of a key the memtable does not hold — a claimed hook, a
        // delivery row, a dedupe key — skips the skiplist search.
        o.set_memtable_prefix_bloom_ratio(0.02);
        o.set_memtable_whole_key_filtering(true);
    }
    let mut b = BlockBasedOptions::default();
    if matches!(cf, Cf::Index | Cf::Tenants) {
        b.set_bloom_filter(10.0, false);
    }
    if let Some(m) = memory {
        b.set_block_cache(&m.cache);
        // Index and filter blocks count against the budget too; level 0's stay pinned,
        // and all of them are evicted last.
        b.set_cache_index_and_filter_blocks(true);
        b.set_cache_index_and_filter_blocks_with_high_priority(true);
        b.set_pin_l0_filter_and_index_blocks_in_cache(true);
    }
    o.set_block_based_table_factory(&b);
    o
}

/// How to open a store.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// Create the directory and a new store at `create_format` if there is none.
    pub create_if_missing: bool,
    /// The format a new store is created at.
    pub create_format: u32,
    /// The newest format this process accepts (the format guard).
    pub supported_format: u32,
    /// Open without writing anything (inspection tools).
    pub read_only: bool,
    /// The most table files RocksDB keeps open (`-1`: no bound). A node sets it from its
    /// open-file limit ([`max_open_files_for`]): past the limit an open fails, and the
    /// store's writes with it.
    pub max_open_files: i32,
    /// One memory budget for the store's caches and memtables (`None`: RocksDB's
    /// per-family defaults).
    pub memory: Option<MemoryBudget>,
}

/// The table files a store may keep open under a soft `RLIMIT_NOFILE` of `limit` (`None`:
/// unlimited): half of it, the other half for sockets, the WAL, the manifest and the
/// rest; at least 64. Unbounded (`-1`) when the limit is.
pub fn max_open_files_for(limit: Option<u64>) -> i32 {
    match limit {
        None => -1,
        Some(n) => i32::try_from(n / 2).unwrap_or(i32::MAX).max(64),
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            create_if_missing: true,
            create_format: SUPPORTED_FORMAT,
            supported_format: SUPPORTED_FORMAT,
            read_only: false,
            max_open_files: -1,
            memory: None,
        }
    }
}

impl OpenOptions {
    /// Open an existing store, read-only, for inspection.
    pub fn inspect() -> Self {
        OpenOptions {
            create_if_missing: false,
            read_only: true,
            ..OpenOptions::default()
        }
    }
}

/// An open store.
pub struct Store {
    db: DB,
    path: PathBuf,
    read_only: bool,
    stats: StoreStats,
    /// Serialises queue transitions that consume a row: see `queue::deliveries::Tx`.
    transitions: std::sync::Mutex<()>,
    /// Whether the last write failed, and why.
    health: WriteHealth,
    /// The shared cache of a [`MemoryBudget`], and the budget.
    memory: Option<(Cache, MemoryBudget)>,
    /// Where a read-only open keeps RocksDB's info LOG; removed after `db` closes (fields
    /// drop in order).
    _ro_log: Option<RoLogDir>,
}

/// A volume's room: what an unprivileged writer may still write, and its size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VolumeSpace {
    pub free: u64,
    pub total: u64,
}

/// The room on the volume `path` is on (`None`: the file system does not say).
pub fn volume_space(path: &Path) -> Option<VolumeSpace> {
    let s = rustix::fs::statvfs(path).ok()?;
    Some(VolumeSpace {
        free: s.f_bavail.saturating_mul(s.f_frsize),
        total: s.f_blocks.saturating_mul(s.f_frsize),
    })
}

/// A directory of its own for the info LOG RocksDB writes even when it opens a store
/// read-only (a read-only open writes nothing into the store); removed when dropped, so
/// every process that peeks leaves nothing behind.
struct RoLogDir(PathBuf);

impl RoLogDir {
    fn new() -> RoLogDir {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("ankusa-ro-log-{}-{n}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        RoLogDir(dir)
    }

    fn options(&self) -> Options {
        let mut o = db_options();
        o.set_db_log_dir(&self.0);
        o
    }
}

impl Drop for RoLogDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The store's write health: the error of the last write if it failed (a full disk, a
/// failed WAL sync), cleared by the next write that succeeds. RocksDB stops every write
/// after such an error and resumes by itself once it can (for a full disk, once space
/// returns); until a write succeeds again the node is not ready.
#[derive(Debug, Default)]
pub struct WriteHealth {
    failing: std::sync::atomic::AtomicBool,
    /// The first error of the current failure, and when (ms since the epoch).
    error: std::sync::Mutex<Option<(String, u64)>>,
    /// Writes that failed since the store was opened.
    failures: std::sync::atomic::AtomicU64,
}

impl WriteHealth {
    fn failed(&self, e: &StoreError) {
        self.failures.fetch_add(1, Ordering::Relaxed);
        if !self.failing.swap(true, Ordering::AcqRel) {
            let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
            *g = Some((e.to_string(), now_ms()));
            tracing::error!(error = %e, "store: writes fail; the node is not ready until one succeeds");
        }
    }

    fn succeeded(&self) {
        // Every write passes here: a load, and a write to the flag only after a failure.
        if self.failing.load(Ordering::Acquire) && self.failing.swap(false, Ordering::AcqRel) {
            let mut g = self.error.lock().unwrap_or_else(|p| p.into_inner());
            let since = g.take().map_or(0, |(_, at)| at);
            tracing::warn!(
                failed_for_ms = now_ms().saturating_sub(since),
                failures = self.failures.load(Ordering::Relaxed),
                "store: writes succeed again"
            );
        }
    }

    /// Whether the last write failed.
    pub fn failing(&self) -> bool {
        self.failing.load(Ordering::Acquire)
    }

    /// The error of the current failure and when it began.
    pub fn error(&self) -> Option<(String, u64)> {
        self.error.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Writes that failed since the store was opened.
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }

    /// Whether the store is stuck: its writes have failed for at least `after_ms` and
    /// `latest`, the error of a write made now, is not a lack of space. RocksDB resumes by
    /// itself, within a fraction of a second, from a failed WAL sync or a full disk once
    /// space returns; an error it classes as fatal (a WAL append that failed, or one that
    /// met the WAL file a failed sync had marked) it never resumes from, and only a new
    /// open of the database — a restart of the process, whose open replays the WAL —
    /// clears it.
    pub fn stuck(&self, latest: &StoreError, after_ms: u64) -> bool {
        if !self.failing() || latest.is_no_space() {
            return false;
        }
        self.error()
            .is_some_and(|(_, since)| now_ms().saturating_sub(since) >= after_ms)
    }
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store").field("path", &self.path).finish()
    }
}

fn db_options() -> Options {
    let mut o = Options::default();
    o.create_if_missing(false);
    o.set_max_background_jobs(2);
    o.set_keep_log_file_num(4);
    // Flushes and compactions write their files out a megabyte at a time rather than all
    // at the file's end: on ext4 (data=ordered) the writer's WAL sync waits for the dirty
    // data of other files in the same journal commit, and a memtable's worth of it made a
    // sync take 100–250 ms under a drain's imports (`cargo bench --bench drain`).
    o.set_bytes_per_sync(1 << 20);
    o
}

/// The bytes of the write-ahead log files (`*.log`) in a store's directory: what its open
/// replays.
fn wal_bytes(path: &Path) -> u64 {
    std::fs::read_dir(path)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

/// RocksDB's answer when another process (or this one) holds the store's `LOCK` file.
fn is_lock_error(e: &rocksdb::Error) -> bool {
    let m = e.to_string();
    m.contains("lock file") || m.contains("lock hold by current process")
}

/// The process holding a POSIX lock on `lock` (RocksDB's `LOCK` file), from
/// `/proc/locks`: a hint for the message, as the holder may have gone since.
fn lock_holder(lock: &Path) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(lock).ok()?;
    let dev = meta.dev();
    // The kernel prints `major:minor:inode`, the device numbers in hex.
    let (major, minor) = (
        ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff),
        (dev & 0xff) | ((dev >> 12) & !0xff),
    );
    let want = format!("{major:02x}:{minor:02x}:{}", meta.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        // `1: POSIX  ADVISORY  WRITE 12345 08:01:1234567 0 EOF`
        let f: Vec<&str> = l.split_whitespace().collect();
        let at = f.iter().position(|x| *x == "WRITE" || *x == "READ")?;
        (f.get(at + 2) == Some(&want.as_str())).then(|| f.get(at + 1)?.parse().ok())?
    })
}

fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> StoreError {
    let context = context.into();
    move |source| StoreError::Io { context, source }
}

impl Store {
    /// With a [`MemoryBudget`]: the bytes its shared cache holds now — cached blocks and
    /// the memtables charged to it — and the budget's total.
    pub fn memory_usage(&self) -> Option<(usize, usize)> {
        self.memory.as_ref().map(|(cache, budget)| {
            (
                cache.get_usage(),
                budget.block_cache_bytes + budget.write_buffer_bytes,
            )
        })
    }

    /// The lock every consuming queue transition commits under: its check that the rows
    /// it consumes are still there and its write are one critical section.
    pub fn transition_lock(&self) -> std::sync::MutexGuard<'_, ()> {
        self.transitions.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Opens (or creates) the store at `path`, applying the format guard first.
    pub fn open(path: impl AsRef<Path>, opts: &OpenOptions) -> Result<Store, StoreError> {
        let path = path.as_ref();
        Self::open_unlocked(path, opts).map_err(|e| match e {
            StoreError::Rocks(r) if is_lock_error(&r) => StoreError::Locked {
                path: path.to_path_buf(),
                holder: lock_holder(&path.join("LOCK")),
            },
            e => e,
        })
    }

    fn open_unlocked(path: &Path, opts: &OpenOptions) -> Result<Store, StoreError> {
        let path = path.to_path_buf();
        if !path.exists() {
            if !opts.create_if_missing {
                return Err(StoreError::Missing(path));
            }
            std::fs::create_dir_all(&path).map_err(io(format!("creating {}", path.display())))?;
        }
        if !path.is_dir() {
            return Err(StoreError::NotAStore {
                path,
                reason: "not a directory".into(),
            });
        }
        if path.join(RESTORING_MARKER).exists() {
            return Err(StoreError::NotAStore {
                path,
                reason: format!(
                    "a restore into it did not finish ({RESTORING_MARKER} is there): delete the directory and restore again"
                ),
            });
        }
        if !path.join("CURRENT").exists() {
            let empty = std::fs::read_dir(&path)
                .map_err(io(format!("reading {}", path.display())))?
                .next()
                .is_none();
            if !empty {
                return Err(StoreError::NotAStore {
                    path,
                    reason: "the directory holds files but no RocksDB CURRENT file".into(),
                });
            }
            if !opts.create_if_missing || opts.read_only {
                return Err(StoreError::NotAStore {
                    path,
                    reason: "the directory is empty".into(),
                });
            }
            return Self::create(path, opts.create_format, opts);
        }
        let existing = DB::list_cf(&db_options(), &path)?;
        // The format guard refuses a newer store before anything opens it, so a refused
        // store is left untouched: from FORMAT_FILE, or, for a store without one, from
        // `m:format` through a read-only open (which reads the WAL once more: the log line
        // below says what each took).
        let wal_bytes = wal_bytes(&path);
        let checked = std::time::Instant::now();
        let file_format = read_format_file(&path);
        let found = match file_format {
            Some(f) => f,
            None => Self::peek_format(&path, &existing)?,
        };
        let check_ms = checked.elapsed().as_millis();
        if found > opts.supported_format {
            return Err(StoreError::StoreFormatNewer {
                found,
                supported: opts.supported_format,
            });
        }
        for name in &existing {
            if Cf::from_name(name).is_none() {
                return Err(StoreError::NotAStore {
                    path,
                    reason: format!("unknown column family {name:?}"),
                });
            }
        }
        if opts.read_only {
            let log = RoLogDir::new();
            let db = DB::open_cf_descriptors_read_only(
                &log.options(),
                &path,
                existing
                    .iter()
                    .filter_map(|n| Cf::from_name(n))
                    .map(|cf| ColumnFamilyDescriptor::new(cf.name(), cf_options(cf, None))),
                false,
            )?;
            let ro = Store {
                db,
                path,
                read_only: true,
                stats: StoreStats::default(),
                transitions: std::sync::Mutex::new(()),
                health: WriteHealth::default(),
                memory: None,
                _ro_log: Some(log),
            };
            ro.checked_format(opts.supported_format)?;
            return Ok(ro);
        }
        // Open with the column families this binary needs at the store's format or any
        // format it will migrate to; the new ones get their families' sentinels.
        let wanted = Cf::of_format(opts.supported_format.max(found));
        let opened = std::time::Instant::now();
        let store = Self::open_rw(path, wanted, false, opts)?;
        tracing::info!(
            wal_bytes,
            format_check_ms = check_ms,
            format_from = if file_format.is_some() {
                FORMAT_FILE
            } else {
                "m:format"
            },
            open_ms = opened.elapsed().as_millis(),
            format = found,
            "store: opened"
        );
        let stamped = store.checked_format(opts.supported_format)?;
        store.record_format(stamped)?;
        let created: Vec<Cf> = wanted
            .iter()
            .copied()
            .filter(|cf| !existing.iter().any(|n| n == cf.name()))
            .collect();
        if !created.is_empty() {
            let ops = Family::FORMAT3
                .iter()
                .filter(|f| created.contains(&f.cf()))
                .flat_map(|f| sentinel_ops(*f))
                .collect();
            store.write(ops, true)?;
        }
        store.ensure_added_families()?;
        Ok(store)
    }

    /// The stamp, unless it is newer than `supported` (a FORMAT_FILE that fell behind the
    /// stamp, which only a hand-made change can do).
    fn checked_format(&self, supported: u32) -> Result<u32, StoreError> {
        let found = self.format()?;
        if found > supported {
            return Err(StoreError::StoreFormatNewer { found, supported });
        }
        Ok(found)
    }

    /// Records `format` in [`FORMAT_FILE`] when it is above what the file names (it never
    /// lowers it): called before the batch that stamps `m:format = format` commits. A
    /// read-only store writes nothing.
    pub fn record_format(&self, format: u32) -> Result<(), StoreError> {
        if self.read_only || read_format_file(&self.path).is_some_and(|f| f >= format) {
            return Ok(());
        }
        write_format_file(&self.path, format)
    }

    /// Reads `m:format` through a read-only open (writes nothing to the store).
    fn peek_format(path: &Path, existing: &[String]) -> Result<u32, StoreError> {
        // Declared first, dropped after `db`.
        let log = RoLogDir::new();
        let db = DB::open_cf_descriptors_read_only(
            &log.options(),
            path,
            existing
                .iter()
                .filter(|n| *n == "default")
                .map(|n| ColumnFamilyDescriptor::new(n, Options::default())),
            false,
        )?;
        let raw = db.get(ankusa_keyspace::META_FORMAT)?;
        let format = raw
            .as_deref()
            .and_then(decode_u32)
            .ok_or_else(|| StoreError::NotAStore {
                path: path.to_path_buf(),
                reason: "no format stamp (m:format) in the default column family".into(),
            })?;
        Ok(format)
    }

    /// Opens read-write with `cfs`, creating the missing ones (and the store if `create`).
    fn open_rw(
        path: PathBuf,
        cfs: &[Cf],
        create: bool,
        opts: &OpenOptions,
    ) -> Result<Store, StoreError> {
        let mut o = db_options();
        o.set_max_open_files(opts.max_open_files);
        let memory = opts
            .memory
            .map(|budget| (SharedMemory::of(&budget), budget));
        if let Some((m, _)) = &memory {
            o.set_write_buffer_manager(&m.write_buffers);
        }
        o.create_if_missing(create);
        o.create_missing_column_families(true);
        let db = DB::open_cf_descriptors(
            &o,
            &path,
            cfs.iter().map(|cf| {
                ColumnFamilyDescriptor::new(
                    cf.name(),
                    cf_options(*cf, memory.as_ref().map(|(m, _)| m)),
                )
            }),
        )?;
        Ok(Store {
            db,
            path,
            read_only: false,
            stats: StoreStats::default(),
            transitions: std::sync::Mutex::new(()),
            health: WriteHealth::default(),
            memory: memory.map(|(m, budget)| (m.cache, budget)),
            _ro_log: None,
        })
    }

    fn create(path: PathBuf, format: u32, opts: &OpenOptions) -> Result<Store, StoreError> {
        let store = Self::open_rw(path, Cf::of_format(format), true, opts)?;
        let mut ops: Vec<Op> = Family::of_format(format)
            .iter()
            .flat_map(|f| sentinel_ops(*f))
            .collect();
        ops.push(Op::put(
            Cf::Default,
            ankusa_keyspace::META_FORMAT.to_vec(),
            format.to_be_bytes(),
        ));
        if format >= 3 {
            ops.push(Op::put(
                Cf::Default,
                ankusa_keyspace::META_NEXT_ORD.to_vec(),
                1u32.to_be_bytes(),
            ));
            for (marker, _) in ADDED_FAMILIES {
                ops.push(Op::put(Cf::Default, marker.to_vec(), []));
            }
        }
        store.record_format(format)?;
        store.write(ops, true)?;
        Ok(store)
    }

    /// Creates the families that came after format 3 within its column families (the
    /// hook log's in `audit`, the archive's in `archive`: [`ADDED_FAMILIES`]) in a format 3
    /// store that predates them: their sentinels and marker in one synced batch, once per
    /// marker. Families whose marker is there are left alone (a missing sentinel there
    /// stays corruption). Run at open and when a migration reaches format 3. Returns how
    /// many sets it created.
    pub fn ensure_added_families(&self) -> Result<usize, StoreError> {
        if self.read_only || self.format()? < 3 {
            return Ok(0);
        }
        let mut created = 0;
        for (marker, families) in ADDED_FAMILIES {
            if self.get(Cf::Default, marker)?.is_some() {
                continue;
            }
            let mut ops: Vec<Op> = families.iter().flat_map(|f| sentinel_ops(*f)).collect();
            ops.push(Op::put(Cf::Default, marker.to_vec(), []));
            self.write(ops, true)?;
            created += 1;
        }
        Ok(created)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The format stamp.
    pub fn format(&self) -> Result<u32, StoreError> {
        let raw = self.get(Cf::Default, ankusa_keyspace::META_FORMAT)?;
        raw.as_deref()
            .and_then(decode_u32)
            .ok_or_else(|| StoreError::corruption(Family::Meta, "format stamp missing"))
    }

    /// Syncs the write-ahead log: every write that returned before this call began,
    /// synced or not, survives a power cut once it returns `Ok` (a graceful stop ends with
    /// it). The ingest writer's syncer calls it once for all the batches written since its
    /// last sync (see `queue::writer`); writes made while it runs go on. A failure leaves
    /// those writes applied and readable, as for [`Rows::write`].
    pub fn sync_wal(&self) -> Result<(), StoreError> {
        if self.read_only {
            return Ok(());
        }
        self.health_of(self.db.flush_wal(true))
    }

    fn health_of(&self, r: Result<(), rocksdb::Error>) -> Result<(), StoreError> {
        match r {
            Ok(()) => {
                self.health.succeeded();
                Ok(())
            }
            Err(e) => {
                let e = StoreError::from(e);
                self.health.failed(&e);
                Err(e)
            }
        }
    }

    /// The store's write health.
    pub fn health(&self) -> &WriteHealth {
        &self.health
    }

    /// A small synced write (`m:probe`, the time of the probe): whether the store takes
    /// writes again after a failure.
    pub fn probe_write(&self) -> Result<(), StoreError> {
        self.write(
            vec![Op::put(
                Cf::Default,
                ankusa_keyspace::META_PROBE.to_vec(),
                now_ms().to_be_bytes().to_vec(),
            )],
            true,
        )
    }

    fn handle(&self, cf: Cf) -> Result<&rocksdb::ColumnFamily, StoreError> {
        self.db
            .cf_handle(cf.name())
            .ok_or_else(|| StoreError::NotAStore {
                path: self.path.clone(),
                reason: format!("column family {} is not open", cf.name()),
            })
    }

    /// What this store has been asked to read since it was opened.
    pub fn stats(&self) -> StatsSnapshot {
        let load = |slots: &[AtomicU64; N_FAMILIES]| {
            every_family()
                .map(|f| (f, slots[family_slot(f)].load(Ordering::Relaxed)))
                .collect()
        };
        StatsSnapshot {
            scans: load(&self.stats.scans),
            seeks: load(&self.stats.seeks),
            point_reads: Cf::ALL
                .iter()
                .map(|c| {
                    (
                        *c,
                        self.stats.point_reads[cf_slot(*c)].load(Ordering::Relaxed),
                    )
                })
                .collect(),
        }
    }

    /// A consistent point-in-time copy of the store at `dir` (which must not exist):
    /// hard links where the file system allows. The copy is an openable store.
    pub fn checkpoint(&self, dir: &Path) -> Result<(), StoreError> {
        let cp = rocksdb::checkpoint::Checkpoint::new(&self.db)?;
        cp.create_checkpoint(dir)?;
        Ok(())
    }

    /// Compacts `[from, to)` of `cf`: drops the tombstones there, so scans over the span
    /// stop stepping over deleted rows. Blocking; for background tasks.
    pub fn compact_range(&self, cf: Cf, from: &[u8], to: &[u8]) {
        if let (false, Ok(h)) = (self.read_only, self.handle(cf)) {
            // The tombstones are in the memtable first: flushed, they reach the files the
            // compaction drops them from.
            let _ = self.db.flush_cf(h);
            let mut o = rocksdb::CompactOptions::default();
            o.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
            // The store's own compactions go on meanwhile: an exclusive one would let L0
            // files pile up under ingest until RocksDB stalls writes.
            o.set_exclusive_manual_compaction(false);
            self.db.compact_range_cf_opt(h, Some(from), Some(to), &o);
        }
    }

    /// Rewrites every file of the store without what was deleted: every memtable flushed
    /// (the write-ahead logs that held deleted values become obsolete and RocksDB deletes
    /// them), then every family compacted whole down to its last level, blob files
    /// included (their garbage collection takes every blob file for the while: live blobs
    /// are rewritten, the rest go with the old files). What an erase calls before it says
    /// it is done, so the erased tenant's bytes are in no file of the store. Blocking, and
    /// it costs a rewrite of the store; for background tasks. A checkpoint taken before
    /// (a backup, a push's) keeps its own links to the old files.
    pub fn scrub(&self) -> Result<(), StoreError> {
        if self.read_only {
            return Ok(());
        }
        self.flush()?;
        for cf in Cf::ALL {
            let Some(h) = self.db.cf_handle(cf.name()) else {
                continue;
            };
            let blobs = cf == Cf::Hooks;
            if blobs {
                self.db
                    .set_options_cf(h, &[("blob_garbage_collection_age_cutoff", "1.0")])?;
            }
            let mut o = rocksdb::CompactOptions::default();
            o.set_bottommost_level_compaction(rocksdb::BottommostLevelCompaction::Force);
            o.set_exclusive_manual_compaction(false);
            self.db
                .compact_range_cf_opt(h, None::<&[u8]>, None::<&[u8]>, &o);
            if blobs {
                self.db.set_options_cf(
                    h,
                    &[(
                        "blob_garbage_collection_age_cutoff",
                        BLOB_GC_AGE_CUTOFF.to_string().as_str(),
                    )],
                )?;
            }
        }
        // What the compactions left obsolete goes now, not at the next flush.
        self.db.flush_wal(true)?;
        Ok(())
    }

    /// Flushes every memtable to disk (tests and tools).
    pub fn flush(&self) -> Result<(), StoreError> {
        for cf in Cf::ALL {
            if let Some(h) = self.db.cf_handle(cf.name()) {
                self.db.flush_cf(h)?;
            }
        }
        Ok(())
    }

    /// The free space of the volume the store is on, for an unprivileged writer (`None`:
    /// the file system does not say).
    pub fn volume_free_bytes(&self) -> Option<u64> {
        volume_space(&self.path).map(|v| v.free)
    }

    /// The store's size on disk: every family's table and blob files (RocksDB's own
    /// in-memory accounting, no directory walk) and the write-ahead log. What a backup of it
    /// needs, before compression.
    pub fn disk_bytes(&self) -> u64 {
        let mut total = wal_bytes(&self.path);
        for cf in Cf::ALL {
            if let Some(h) = self.db.cf_handle(cf.name()) {
                for p in [
                    "rocksdb.total-sst-files-size",
                    "rocksdb.total-blob-file-size",
                ] {
                    total += self
                        .db
                        .property_int_value_cf(h, p)
                        .ok()
                        .flatten()
                        .unwrap_or(0);
                }
            }
        }
        total
    }

    /// RocksDB's own statistics text (`rocksdb.stats`: compactions, write stalls and their
    /// causes per column family, cumulative and since the last read): for benches and
    /// diagnosis.
    pub fn rocksdb_stats(&self) -> String {
        let mut out = self
            .db
            .property_value("rocksdb.stats")
            .ok()
            .flatten()
            .unwrap_or_default();
        for cf in Cf::ALL {
            if let Some(h) = self.db.cf_handle(cf.name()) {
                if let Ok(Some(t)) = self.db.property_value_cf(h, "rocksdb.cfstats") {
                    out.push_str(&t);
                }
            }
        }
        out
    }

    /// Column families present in this store.
    pub fn column_families(&self) -> Vec<Cf> {
        Cf::ALL
            .into_iter()
            .filter(|cf| self.db.cf_handle(cf.name()).is_some())
            .collect()
    }
}

/// Families added to format 3 stores after format 3, inside existing column families, and
/// the meta key that marks each set created ([`Store::ensure_added_families`]).
pub const ADDED_FAMILIES: [(&[u8], &[Family]); 3] = [
    (ankusa_keyspace::META_HOOK_LOG, &Family::HOOK_LOG),
    (ankusa_keyspace::META_ARCHIVE, &Family::ARCHIVE),
    (ankusa_keyspace::META_PULL, &Family::PULL),
];

/// Decodes a big-endian u32 value.
pub fn decode_u32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.try_into().ok()?))
}

#[cfg(test)]
mod tests;
