//! Every key layout of the store, and the only place key bytes are built or decoded.
//!
//! All integers are big-endian, so the byte order of keys is the numeric order of their
//! fields. Each *family* (a key prefix inside a column family) has a lo and a hi sentinel
//! that sort before and after every real key of the family; [`Family::lo`] and
//! [`Family::hi`] give them and `Store` writes them when the family is created. A scan
//! that does not reach its family's sentinel was cut short by corruption (see
//! `store::Store::scan`).
//!
//! The constructors of the queue's index keys (`?D ?F ?X ?A`) are `pub` for the queue's
//! own op builders only: `queue::deliveries` is the one caller, and a test scans the
//! crate's sources to keep it so (the structural guard: `scripts/check-layers.py` and `queue::deliveries`'s test).
// Defines (and tests) the queue's index keys that clippy.toml keeps to the queue.
#![allow(clippy::disallowed_methods)]

/// The column families of a store.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Cf {
    Default,
    Hooks,
    Deliveries,
    Index,
    Audit,
    Quarantine,
    Archive,
    Tenants,
    Counters,
}

impl Cf {
    pub const ALL: [Cf; 9] = [
        Cf::Default,
        Cf::Hooks,
        Cf::Deliveries,
        Cf::Index,
        Cf::Audit,
        Cf::Quarantine,
        Cf::Archive,
        Cf::Tenants,
        Cf::Counters,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Cf::Default => "default",
            Cf::Hooks => "hooks",
            Cf::Deliveries => "deliveries",
            Cf::Index => "index",
            Cf::Audit => "audit",
            Cf::Quarantine => "quarantine",
            Cf::Archive => "archive",
            Cf::Tenants => "tenants",
            Cf::Counters => "counters",
        }
    }

    pub fn from_name(name: &str) -> Option<Cf> {
        Cf::ALL.into_iter().find(|cf| cf.name() == name)
    }

    /// The column families a store of `format` has (`tenants` and `counters` came with 3).
    pub fn of_format(format: u32) -> &'static [Cf] {
        if format >= 3 {
            &Cf::ALL
        } else {
            &Cf::ALL[..7]
        }
    }
}

/// Commit order of a hook, assigned by the writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Seq(pub u64);

/// Dense tenant ordinal. 0 is the node aggregate; real tenants are 1, 2, 3, …
/// `u32::MAX` is reserved for the hi sentinels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct TenantOrd(pub u32);

impl TenantOrd {
    /// The node aggregate every counter delta is mirrored into.
    pub const AGGREGATE: TenantOrd = TenantOrd(0);
    /// The largest ordinal a tenant can have (`u32::MAX` is the sentinels').
    pub const MAX_REAL: u32 = u32::MAX - 1;
}

/// Position of a sink in its hook's own fan-out list.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SinkIdx(pub u16);

/// Milliseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct AtMs(pub u64);

/// Milliseconds since the Unix epoch, now (0 on a clock set before it).
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl AtMs {
    /// The active-index bucket (a second) this instant falls in.
    pub fn bucket(self) -> Bucket {
        Bucket(self.0 / 1000)
    }
}

/// An active-index bucket: `at / 1000`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Bucket(pub u64);

impl Bucket {
    /// The first millisecond of the bucket.
    pub fn start(self) -> AtMs {
        AtMs(self.0.saturating_mul(1000))
    }
}

/// The six per-tenant counters (docs/storage.md, "Counters and the merge operator"). The discriminant is the key byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum CounterField {
    Pending = 1,
    Scheduled = 2,
    Inflight = 3,
    Dead = 4,
    Bytes = 5,
    ArchivePending = 6,
}

impl CounterField {
    pub const ALL: [CounterField; 6] = [
        CounterField::Pending,
        CounterField::Scheduled,
        CounterField::Inflight,
        CounterField::Dead,
        CounterField::Bytes,
        CounterField::ArchivePending,
    ];

    pub fn name(self) -> &'static str {
        match self {
            CounterField::Pending => "pending",
            CounterField::Scheduled => "scheduled",
            CounterField::Inflight => "inflight",
            CounterField::Dead => "dead",
            CounterField::Bytes => "bytes",
            CounterField::ArchivePending => "archive_pending",
        }
    }

    pub fn from_byte(b: u8) -> Option<Self> {
        Self::ALL.get((b as usize).wrapping_sub(1)).copied()
    }

    /// Index into a `[i64; 6]`.
    pub fn index(self) -> usize {
        self as usize - 1
    }
}

/// A key that does not have the layout its family promises.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed {family} key ({len} bytes): {hex}")]
pub struct KeyError {
    pub family: &'static str,
    pub len: usize,
    pub hex: String,
}

fn bad(family: &'static str, key: &[u8]) -> KeyError {
    KeyError {
        family,
        len: key.len(),
        hex: hex(key),
    }
}

/// Lower-case hex of a byte string (for error messages and `store inspect`).
pub fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// A family: a key prefix inside one column family, with its sentinels.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    /// `default`: `m:` meta keys (format stamp, next ordinal, migration markers).
    Meta,
    /// `hooks`: `<<seq::64>>` → envelope.
    Hooks,
    /// `deliveries`: `<<seq::64, sink::16>>` → delivery row.
    Deliveries,
    /// `index`: `<<?D, ord::32, at::64, seq::64, sink::16>>` → `<<size::32, kind::8>>`.
    Due,
    /// `index`: `<<?F, ord::32, seq::64, sink::16>>` → `<<size::32>>`.
    Inflight,
    /// `index`: `<<?x, at::64, seq::64, sink::16>>` → dead value (with the ord).
    Dead,
    /// `index`: `<<?X, ord::32, at::64, seq::64, sink::16>>` → empty.
    DeadByTenant,
    /// `index`: `<<?a, seq::64>>` → `<<size::32, ord::32>>` (format 2: `<<size::32>>`).
    Archive,
    /// `index`: `<<?A, bucket::64, ord::32>>` → empty.
    Active,
    /// `index`: `<<?k, seq::64, sink::16>>` → a pull sink's lease of an inflight delivery.
    Claim,
    /// `index`: `<<?P, ord::32, sink id length::8, sink id, at::64, seq::64, sink::16>>` →
    /// `<<size::32, kind::8>>`: a due delivery to a pull sink, waiting for a consumer.
    Pulled,
    /// `index`: `<<?c, seq::64>>` → empty: a delivery of this hook was settled; reclaim looks.
    Cleared,
    /// `index`: `<<?u, tenant, 0, idempotency key>>` → first hook's seq and expiry.
    Dedupe,
    /// `index`: `<<?e, at::64, tenant, 0, idempotency key>>` → empty (dedupe expiry order).
    DedupeExpiry,
    /// `index`, format 2 only: `<<?d, at::64, seq::64, sink::16>>` → `<<size::32>>`.
    DueV2,
    /// `index`, format 2 only: `<<?f, seq::64, sink::16>>` → `<<size::32>>`.
    InflightV2,
    /// `tenants`: `<<?t, ord::32>>` → tenant id (empty = erased tombstone).
    TenantNames,
    /// `tenants`: `<<?n, tenant id>>` → `<<ord::32>>`.
    TenantOrds,
    /// `counters`: `<<ord::32, field::8>>` → merge value (i64).
    Counters,
    /// `audit`: `<<?a, seq::64, at::64>>` → audit record.
    Audit,
    /// `quarantine`: `<<?q, id::64>>` → quarantined request.
    Quarantine,
    /// `archive`: `<<?s, segment::64>>` → archive segment metadata.
    ArchiveSegments,
    /// `audit`: `<<?l, seq::64>>` → the hook log's record of a hook (no body).
    HookLog,
    /// `audit`: `<<?i, hook id>>` → `<<seq::64>>`: a hook id's seq, while the log keeps it.
    HookIds,
    /// `audit`: `<<?v, seq::64, sink::16, at::64, kind::8>>` → a delivery's event (an
    /// attempt, a replay, a recovery).
    HookEvents,
    /// `archive`: `<<?h, ord::32, received::64, seq::64>>` → an archived hook.
    ArchivedHooks,
    /// `archive`: `<<?y, expires::64, seq::64>>` → `<<ord::32, received::64>>`: retention order.
    ArchiveExpiry,
}

impl Family {
    /// Every family of format 3, in column-family order.
    pub const FORMAT3: [Family; 25] = [
        Family::Meta,
        Family::Hooks,
        Family::Deliveries,
        Family::Due,
        Family::Inflight,
        Family::Dead,
        Family::DeadByTenant,
        Family::Archive,
        Family::Active,
        Family::Claim,
        Family::Cleared,
        Family::Dedupe,
        Family::DedupeExpiry,
        Family::TenantNames,
        Family::TenantOrds,
        Family::Counters,
        Family::Audit,
        Family::Quarantine,
        Family::ArchiveSegments,
        Family::HookLog,
        Family::HookIds,
        Family::HookEvents,
        Family::ArchivedHooks,
        Family::ArchiveExpiry,
        Family::Pulled,
    ];

    /// The pull gateway's waiting rows (in `index`), created like the hook log's: once,
    /// marked by [`META_PULL`].
    pub const PULL: [Family; 1] = [Family::Pulled];

    /// The hook log's families: in every format 3 store, created by the release that
    /// brought them (marked by [`META_HOOK_LOG`]) — in the `audit` column family, so no
    /// format change.
    pub const HOOK_LOG: [Family; 3] = [Family::HookLog, Family::HookIds, Family::HookEvents];

    /// The archive's families (in `archive`), created like the hook log's: once, marked by
    /// [`META_ARCHIVE`].
    pub const ARCHIVE: [Family; 2] = [Family::ArchivedHooks, Family::ArchiveExpiry];

    /// Every family of format 2 (the tenant-less layout).
    pub const FORMAT2: [Family; 14] = [
        Family::Meta,
        Family::Hooks,
        Family::Deliveries,
        Family::DueV2,
        Family::InflightV2,
        Family::Dead,
        Family::Archive,
        Family::Claim,
        Family::Cleared,
        Family::Dedupe,
        Family::DedupeExpiry,
        Family::Audit,
        Family::Quarantine,
        Family::ArchiveSegments,
    ];

    /// The families a store of `format` holds.
    pub fn of_format(format: u32) -> &'static [Family] {
        if format <= 2 {
            &Self::FORMAT2
        } else {
            &Self::FORMAT3
        }
    }

    pub fn cf(self) -> Cf {
        use Family::*;
        match self {
            Meta => Cf::Default,
            Hooks => Cf::Hooks,
            Deliveries => Cf::Deliveries,
            Due | Inflight | Dead | DeadByTenant | Archive | Active | Claim | Pulled | Cleared
            | Dedupe | DedupeExpiry | DueV2 | InflightV2 => Cf::Index,
            TenantNames | TenantOrds => Cf::Tenants,
            Counters => Cf::Counters,
            Audit | HookLog | HookIds | HookEvents => Cf::Audit,
            Quarantine => Cf::Quarantine,
            ArchiveSegments | ArchivedHooks | ArchiveExpiry => Cf::Archive,
        }
    }

    pub fn name(self) -> &'static str {
        use Family::*;
        match self {
            Meta => "meta",
            Hooks => "hooks",
            Deliveries => "deliveries",
            Due => "due",
            Inflight => "inflight",
            Dead => "dead",
            DeadByTenant => "dead_by_tenant",
            Archive => "archive_pending",
            Active => "active",
            Claim => "claim",
            Pulled => "pulled",
            Cleared => "cleared",
            Dedupe => "dedupe",
            DedupeExpiry => "dedupe_expiry",
            DueV2 => "due_v2",
            InflightV2 => "inflight_v2",
            TenantNames => "tenants",
            TenantOrds => "tenant_ords",
            Counters => "counters",
            Audit => "audit",
            Quarantine => "quarantine",
            ArchiveSegments => "archive_segments",
            HookLog => "hook_log",
            HookIds => "hook_ids",
            HookEvents => "hook_events",
            ArchivedHooks => "archived_hooks",
            ArchiveExpiry => "archive_expiry",
        }
    }

    /// The prefix every key of the family starts with (empty for the seq-keyed families).
    pub fn prefix(self) -> &'static [u8] {
        use Family::*;
        match self {
            Meta => b"m:",
            Hooks | Deliveries | Counters => b"",
            Due => b"D",
            Inflight => b"F",
            Dead => b"x",
            DeadByTenant => b"X",
            Archive => b"a",
            Active => b"A",
            Claim => b"k",
            Pulled => b"P",
            Cleared => b"c",
            Dedupe => b"u",
            DedupeExpiry => b"e",
            DueV2 => b"d",
            InflightV2 => b"f",
            TenantNames => b"t",
            TenantOrds => b"n",
            Audit => b"a",
            Quarantine => b"q",
            ArchiveSegments => b"s",
            HookLog => b"l",
            HookIds => b"i",
            HookEvents => b"v",
            ArchivedHooks => b"h",
            ArchiveExpiry => b"y",
        }
    }

    /// Length of a key after the prefix, for fixed-width families.
    fn fixed_body_len(self) -> Option<usize> {
        use Family::*;
        match self {
            Hooks => Some(8),
            Deliveries => Some(10),
            Due => Some(22),
            Inflight => Some(14),
            Dead => Some(18),
            DeadByTenant => Some(22),
            Archive => Some(8),
            Active => Some(12),
            Claim => Some(10),
            Cleared => Some(8),
            DueV2 => Some(18),
            InflightV2 => Some(10),
            TenantNames => Some(4),
            Counters => Some(5),
            Audit => Some(16),
            Quarantine => Some(8),
            ArchiveSegments => Some(8),
            HookLog => Some(8),
            HookEvents => Some(19),
            ArchivedHooks => Some(20),
            ArchiveExpiry => Some(16),
            // Text after the prefix: UTF-8 never holds 0xFF, so `prefix ++ [0xFF]` is above
            // every real key (meta keys are ASCII).
            Meta | Dedupe | DedupeExpiry | TenantOrds | HookIds | Pulled => None,
        }
    }

    /// The lo sentinel: sorts before every real key of the family.
    pub fn lo(self) -> Vec<u8> {
        match self {
            // An all-zero counters key is ord 0, field 0: field 0 is never a counter.
            Family::Counters => vec![0; 5],
            // For the other families the bare prefix is shorter than every real key.
            _ => self.prefix().to_vec(),
        }
    }

    /// The hi sentinel: sorts after every real key of the family.
    pub fn hi(self) -> Vec<u8> {
        let mut k = self.prefix().to_vec();
        match self.fixed_body_len() {
            // One byte longer than the largest fixed-width key, all 0xFF.
            Some(n) => k.extend(std::iter::repeat_n(0xFF, n + 1)),
            // `<<at::64>>` then text: above every `at`, then above every text byte.
            None if self == Family::DedupeExpiry => k.extend([0xFF; 9]),
            // `<<ord::32>>` first: no real ordinal is `u32::MAX`.
            None if self == Family::Pulled => k.extend([0xFF; 5]),
            None => k.push(0xFF),
        }
        k
    }

    /// The key range `[lo, hi]` of the family, as `(start, end_exclusive)`.
    pub fn bounds(self) -> (Vec<u8>, Vec<u8>) {
        let mut end = self.hi();
        end.push(0);
        (self.lo(), end)
    }

    /// True if `key` is one of this family's two sentinels.
    pub fn is_sentinel(self, key: &[u8]) -> bool {
        key == self.lo().as_slice() || key == self.hi().as_slice()
    }
}

// ---------------------------------------------------------------------------------------
// Meta keys (`default`).

/// The store format stamp: `<<format::32>>`.
pub const META_FORMAT: &[u8] = b"m:format";
/// `<<ms::64>>`: the last write probe after a failed write (see `Store::probe_write`).
pub const META_PROBE: &[u8] = b"m:probe";
/// Present once the hook log's families ([`Family::HOOK_LOG`]) exist, with their sentinels.
pub const META_HOOK_LOG: &[u8] = b"m:hook_log";
/// Present once the pull gateway's families ([`Family::PULL`]) exist, with their sentinels.
pub const META_PULL: &[u8] = b"m:pull";
/// Present once the archive's families ([`Family::ARCHIVE`]) exist, with their sentinels.
pub const META_ARCHIVE: &[u8] = b"m:archive";
/// The next tenant ordinal to allocate: `<<next::32>>`.
pub const META_NEXT_ORD: &[u8] = b"m:next_ord";
/// The next hook seq the writer hands out: `<<next::64>>`, in every ingest commit. Seqs are
/// never reused, even after reclaim has removed the newest hooks (their hook log records,
/// events and cleared markers are keyed by seq).
pub const META_NEXT_SEQ: &[u8] = b"m:next_seq";

/// `m:migrating:N`: present while the migration to format N is unfinished; its value is the
/// migration's cursor.
pub fn meta_migrating(to: u32) -> Vec<u8> {
    format!("m:migrating:{to}").into_bytes()
}

/// Decodes `m:migrating:N` into N.
pub fn decode_meta_migrating(key: &[u8]) -> Option<u32> {
    std::str::from_utf8(key.strip_prefix(b"m:migrating:")?)
        .ok()?
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------------------
// Helpers.

struct KeyBuf(Vec<u8>);

impl KeyBuf {
    fn new(prefix: &[u8], body: usize) -> Self {
        let mut v = Vec::with_capacity(prefix.len() + body);
        v.extend_from_slice(prefix);
        KeyBuf(v)
    }
    fn u16(mut self, x: u16) -> Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    fn u32(mut self, x: u32) -> Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    fn u64(mut self, x: u64) -> Self {
        self.0.extend_from_slice(&x.to_be_bytes());
        self
    }
    fn bytes(mut self, b: &[u8]) -> Self {
        self.0.extend_from_slice(b);
        self
    }
}

fn rd_u16(b: &[u8], at: usize) -> u16 {
    let mut a = [0u8; 2];
    a.copy_from_slice(&b[at..at + 2]);
    u16::from_be_bytes(a)
}
fn rd_u32(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_be_bytes(a)
}
fn rd_u64(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(a)
}

fn check(family: Family, key: &[u8]) -> Result<(), KeyError> {
    let p = family.prefix();
    let ok = key.starts_with(p)
        && family
            .fixed_body_len()
            .is_none_or(|n| key.len() == p.len() + n);
    if ok {
        Ok(())
    } else {
        Err(bad(family.name(), key))
    }
}

/// The smallest key strictly greater than every key starting with `prefix`
/// (`None` if there is none, i.e. the prefix is all 0xFF).
pub fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xFF {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

// ---------------------------------------------------------------------------------------
// hooks and deliveries.

pub fn hook(seq: Seq) -> Vec<u8> {
    KeyBuf::new(b"", 8).u64(seq.0).0
}

pub fn decode_hook(key: &[u8]) -> Result<Seq, KeyError> {
    check(Family::Hooks, key)?;
    Ok(Seq(rd_u64(key, 0)))
}

pub fn delivery(seq: Seq, sink: SinkIdx) -> Vec<u8> {
    KeyBuf::new(b"", 10).u64(seq.0).u16(sink.0).0
}

/// The range of every delivery row of one hook: `(start, end_exclusive)`.
pub fn deliveries_of_hook(seq: Seq) -> (Vec<u8>, Vec<u8>) {
    (
        delivery(seq, SinkIdx(0)),
        KeyBuf::new(b"", 10).u64(seq.0).u16(u16::MAX).bytes(&[0]).0,
    )
}

pub fn decode_delivery(key: &[u8]) -> Result<(Seq, SinkIdx), KeyError> {
    check(Family::Deliveries, key)?;
    Ok((Seq(rd_u64(key, 0)), SinkIdx(rd_u16(key, 8))))
}

// ---------------------------------------------------------------------------------------
// The queue's index (format 3). Built only by `queue::deliveries`.

/// A due row's key fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DueKey {
    pub ord: TenantOrd,
    pub at: AtMs,
    pub seq: Seq,
    pub sink: SinkIdx,
}

pub fn due(k: &DueKey) -> Vec<u8> {
    KeyBuf::new(b"D", 22)
        .u32(k.ord.0)
        .u64(k.at.0)
        .u64(k.seq.0)
        .u16(k.sink.0)
        .0
}

pub fn decode_due(key: &[u8]) -> Result<DueKey, KeyError> {
    check(Family::Due, key)?;
    Ok(DueKey {
        ord: TenantOrd(rd_u32(key, 1)),
        at: AtMs(rd_u64(key, 5)),
        seq: Seq(rd_u64(key, 13)),
        sink: SinkIdx(rd_u16(key, 21)),
    })
}

/// The due range of one tenant from `from` (inclusive) to `until` (exclusive).
pub fn due_range(ord: TenantOrd, from: AtMs, until: AtMs) -> (Vec<u8>, Vec<u8>) {
    (
        KeyBuf::new(b"D", 12).u32(ord.0).u64(from.0).0,
        KeyBuf::new(b"D", 12).u32(ord.0).u64(until.0).0,
    )
}

/// The whole due range of one tenant.
pub fn due_tenant_range(ord: TenantOrd) -> (Vec<u8>, Vec<u8>) {
    tenant_range(b'D', ord)
}

fn tenant_range(prefix: u8, ord: TenantOrd) -> (Vec<u8>, Vec<u8>) {
    (
        KeyBuf::new(&[prefix], 4).u32(ord.0).0,
        KeyBuf::new(&[prefix], 4).u32(ord.0 + 1).0,
    )
}

/// An inflight row's key fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct InflightKey {
    pub ord: TenantOrd,
    pub seq: Seq,
    pub sink: SinkIdx,
}

pub fn inflight(k: &InflightKey) -> Vec<u8> {
    KeyBuf::new(b"F", 14)
        .u32(k.ord.0)
        .u64(k.seq.0)
        .u16(k.sink.0)
        .0
}

pub fn decode_inflight(key: &[u8]) -> Result<InflightKey, KeyError> {
    check(Family::Inflight, key)?;
    Ok(InflightKey {
        ord: TenantOrd(rd_u32(key, 1)),
        seq: Seq(rd_u64(key, 5)),
        sink: SinkIdx(rd_u16(key, 13)),
    })
}

pub fn inflight_tenant_range(ord: TenantOrd) -> (Vec<u8>, Vec<u8>) {
    tenant_range(b'F', ord)
}

/// A dead row's key fields (`?x` and `?X` carry the same fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct DeadKey {
    pub at: AtMs,
    pub seq: Seq,
    pub sink: SinkIdx,
}

pub fn dead(k: &DeadKey) -> Vec<u8> {
    KeyBuf::new(b"x", 18)
        .u64(k.at.0)
        .u64(k.seq.0)
        .u16(k.sink.0)
        .0
}

pub fn decode_dead(key: &[u8]) -> Result<DeadKey, KeyError> {
    check(Family::Dead, key)?;
    Ok(DeadKey {
        at: AtMs(rd_u64(key, 1)),
        seq: Seq(rd_u64(key, 9)),
        sink: SinkIdx(rd_u16(key, 17)),
    })
}

/// The node-wide dead range from `from` (inclusive) to `until` (exclusive).
pub fn dead_range(from: AtMs, until: AtMs) -> (Vec<u8>, Vec<u8>) {
    (
        KeyBuf::new(b"x", 8).u64(from.0).0,
        KeyBuf::new(b"x", 8).u64(until.0).0,
    )
}

pub fn dead_by_tenant(ord: TenantOrd, k: &DeadKey) -> Vec<u8> {
    KeyBuf::new(b"X", 22)
        .u32(ord.0)
        .u64(k.at.0)
        .u64(k.seq.0)
        .u16(k.sink.0)
        .0
}

pub fn decode_dead_by_tenant(key: &[u8]) -> Result<(TenantOrd, DeadKey), KeyError> {
    check(Family::DeadByTenant, key)?;
    Ok((
        TenantOrd(rd_u32(key, 1)),
        DeadKey {
            at: AtMs(rd_u64(key, 5)),
            seq: Seq(rd_u64(key, 13)),
            sink: SinkIdx(rd_u16(key, 21)),
        },
    ))
}

pub fn dead_tenant_range(ord: TenantOrd) -> (Vec<u8>, Vec<u8>) {
    tenant_range(b'X', ord)
}

pub fn archive(seq: Seq) -> Vec<u8> {
    KeyBuf::new(b"a", 8).u64(seq.0).0
}

pub fn decode_archive(key: &[u8]) -> Result<Seq, KeyError> {
    check(Family::Archive, key)?;
    Ok(Seq(rd_u64(key, 1)))
}

pub fn active(bucket: Bucket, ord: TenantOrd) -> Vec<u8> {
    KeyBuf::new(b"A", 12).u64(bucket.0).u32(ord.0).0
}

pub fn decode_active(key: &[u8]) -> Result<(Bucket, TenantOrd), KeyError> {
    check(Family::Active, key)?;
    Ok((Bucket(rd_u64(key, 1)), TenantOrd(rd_u32(key, 9))))
}

/// Active markers from the family start through `last` (inclusive): `(start, end_exclusive)`.
pub fn active_through(last: Bucket) -> (Vec<u8>, Vec<u8>) {
    active_range(Bucket(0), last)
}

/// Active markers of buckets `first..=last`: `(start, end_exclusive)`.
pub fn active_range(first: Bucket, last: Bucket) -> (Vec<u8>, Vec<u8>) {
    (
        KeyBuf::new(b"A", 8).u64(first.0).0,
        KeyBuf::new(b"A", 8).u64(last.0.saturating_add(1)).0,
    )
}

pub fn claim(seq: Seq, sink: SinkIdx) -> Vec<u8> {
    KeyBuf::new(b"k", 10).u64(seq.0).u16(sink.0).0
}

pub fn decode_claim(key: &[u8]) -> Result<(Seq, SinkIdx), KeyError> {
    check(Family::Claim, key)?;
    Ok((Seq(rd_u64(key, 1)), SinkIdx(rd_u16(key, 9))))
}

/// A waiting pull row's key fields: the due row's, and the pull sink's id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PulledKey {
    pub ord: TenantOrd,
    pub sink_id: String,
    pub at: AtMs,
    pub seq: Seq,
    pub sink: SinkIdx,
}

/// The id part of a pull row's key (`<<length::8, id>>`); ids are at most 255 bytes.
fn pulled_sink_prefix(ord: TenantOrd, sink_id: &str) -> KeyBuf {
    let id = &sink_id.as_bytes()[..sink_id.len().min(255)];
    let mut b = KeyBuf::new(b"P", 5 + id.len() + 18).u32(ord.0);
    b.0.push(id.len() as u8);
    b.bytes(id)
}

pub fn pulled(k: &PulledKey) -> Vec<u8> {
    pulled_sink_prefix(k.ord, &k.sink_id)
        .u64(k.at.0)
        .u64(k.seq.0)
        .u16(k.sink.0)
        .0
}

pub fn decode_pulled(key: &[u8]) -> Result<PulledKey, KeyError> {
    check(Family::Pulled, key)?;
    let bad = || bad(Family::Pulled.name(), key);
    let n = *key.get(5).ok_or_else(bad)? as usize;
    if key.len() != 6 + n + 18 {
        return Err(bad());
    }
    let sink_id = std::str::from_utf8(&key[6..6 + n]).map_err(|_| bad())?;
    let t = 6 + n;
    Ok(PulledKey {
        ord: TenantOrd(rd_u32(key, 1)),
        sink_id: sink_id.to_owned(),
        at: AtMs(rd_u64(key, t)),
        seq: Seq(rd_u64(key, t + 8)),
        sink: SinkIdx(rd_u16(key, t + 16)),
    })
}

/// Every waiting pull row of one tenant for one pull sink, oldest first.
pub fn pulled_sink_range(ord: TenantOrd, sink_id: &str) -> (Vec<u8>, Vec<u8>) {
    let lo = pulled_sink_prefix(ord, sink_id).0;
    #[allow(clippy::expect_used, reason = "the prefix starts with b'P'")]
    let hi = prefix_end(&lo).expect("a pull prefix is never all 0xFF");
    (lo, hi)
}

/// Every waiting pull row of tenants `from` and above (the next tenant with one is the
/// first key at or after the range's start).
pub fn pulled_from(from: TenantOrd) -> (Vec<u8>, Vec<u8>) {
    (
        KeyBuf::new(b"P", 4).u32(from.0).0,
        KeyBuf::new(b"P", 4).u32(u32::MAX).0,
    )
}

/// Every waiting pull row of one tenant.
pub fn pulled_tenant_range(ord: TenantOrd) -> (Vec<u8>, Vec<u8>) {
    tenant_range(b'P', ord)
}

pub fn cleared(seq: Seq) -> Vec<u8> {
    KeyBuf::new(b"c", 8).u64(seq.0).0
}

pub fn decode_cleared(key: &[u8]) -> Result<Seq, KeyError> {
    check(Family::Cleared, key)?;
    Ok(Seq(rd_u64(key, 1)))
}

/// Dedupe keys carry the tenant id and the idempotency key as text; a NUL separates them.
/// Returns `None` if the tenant id holds a NUL (such an id is refused at the edge).
pub fn dedupe(tenant: &str, idem: &[u8]) -> Option<Vec<u8>> {
    if tenant.as_bytes().contains(&0) {
        return None;
    }
    Some(
        KeyBuf::new(b"u", tenant.len() + 1 + idem.len())
            .bytes(tenant.as_bytes())
            .bytes(&[0])
            .bytes(idem)
            .0,
    )
}

/// Every dedupe key of one tenant (`tenant\0` prefix), for erasing a tenant.
pub fn dedupe_tenant_range(tenant: &str) -> (Vec<u8>, Vec<u8>) {
    let start = KeyBuf::new(b"u", tenant.len() + 1)
        .bytes(tenant.as_bytes())
        .bytes(&[0])
        .0;
    let end = KeyBuf::new(b"u", tenant.len() + 1)
        .bytes(tenant.as_bytes())
        .bytes(&[1])
        .0;
    (start, end)
}

pub fn dedupe_expiry(at: AtMs, dedupe_key: &[u8]) -> Vec<u8> {
    // `dedupe_key` is a whole `?u` key; its tail after the `u` is `tenant\0idem`.
    let tail = dedupe_key.get(1..).unwrap_or_default();
    KeyBuf::new(b"e", 8 + tail.len()).u64(at.0).bytes(tail).0
}

/// Decodes a `?e` key into its expiry time and the `?u` key it expires.
pub fn decode_dedupe_expiry(key: &[u8]) -> Result<(AtMs, Vec<u8>), KeyError> {
    if key.len() < 10 || key[0] != b'e' {
        return Err(bad("dedupe_expiry", key));
    }
    let mut u = Vec::with_capacity(key.len() - 8);
    u.push(b'u');
    u.extend_from_slice(&key[9..]);
    Ok((AtMs(rd_u64(key, 1)), u))
}

/// `?e` keys that expire before `until`.
pub fn dedupe_expired_before(until: AtMs) -> (Vec<u8>, Vec<u8>) {
    (
        Family::DedupeExpiry.lo(),
        KeyBuf::new(b"e", 8).u64(until.0).0,
    )
}

// ---------------------------------------------------------------------------------------
// Format 2 (read by the 2 -> 3 migration and written by `store::legacy` only).

pub fn due_v2(at: AtMs, seq: Seq, sink: SinkIdx) -> Vec<u8> {
    KeyBuf::new(b"d", 18).u64(at.0).u64(seq.0).u16(sink.0).0
}

pub fn decode_due_v2(key: &[u8]) -> Result<(AtMs, Seq, SinkIdx), KeyError> {
    check(Family::DueV2, key)?;
    Ok((
        AtMs(rd_u64(key, 1)),
        Seq(rd_u64(key, 9)),
        SinkIdx(rd_u16(key, 17)),
    ))
}

pub fn inflight_v2(seq: Seq, sink: SinkIdx) -> Vec<u8> {
    KeyBuf::new(b"f", 10).u64(seq.0).u16(sink.0).0
}

pub fn decode_inflight_v2(key: &[u8]) -> Result<(Seq, SinkIdx), KeyError> {
    check(Family::InflightV2, key)?;
    Ok((Seq(rd_u64(key, 1)), SinkIdx(rd_u16(key, 9))))
}

// ---------------------------------------------------------------------------------------
// tenants and counters.

pub fn tenant_name(ord: TenantOrd) -> Vec<u8> {
    KeyBuf::new(b"t", 4).u32(ord.0).0
}

pub fn decode_tenant_name(key: &[u8]) -> Result<TenantOrd, KeyError> {
    check(Family::TenantNames, key)?;
    Ok(TenantOrd(rd_u32(key, 1)))
}

pub fn tenant_ord(tenant: &str) -> Vec<u8> {
    KeyBuf::new(b"n", tenant.len()).bytes(tenant.as_bytes()).0
}

pub fn decode_tenant_ord(key: &[u8]) -> Result<String, KeyError> {
    match key.split_first() {
        Some((b'n', rest)) => String::from_utf8(rest.to_vec()).map_err(|_| bad("tenant_ords", key)),
        _ => Err(bad("tenant_ords", key)),
    }
}

pub fn counter(ord: TenantOrd, field: CounterField) -> Vec<u8> {
    KeyBuf::new(b"", 5).u32(ord.0).bytes(&[field as u8]).0
}

pub fn decode_counter(key: &[u8]) -> Result<(TenantOrd, CounterField), KeyError> {
    check(Family::Counters, key)?;
    let field = CounterField::from_byte(key[4]).ok_or_else(|| bad("counters", key))?;
    Ok((TenantOrd(rd_u32(key, 0)), field))
}

// ---------------------------------------------------------------------------------------
// audit, quarantine, archive segments.

pub fn audit(seq: Seq, at: AtMs) -> Vec<u8> {
    KeyBuf::new(b"a", 16).u64(seq.0).u64(at.0).0
}

pub fn decode_audit(key: &[u8]) -> Result<(Seq, AtMs), KeyError> {
    check(Family::Audit, key)?;
    Ok((Seq(rd_u64(key, 1)), AtMs(rd_u64(key, 9))))
}

pub fn quarantine(id: u64) -> Vec<u8> {
    KeyBuf::new(b"q", 8).u64(id).0
}

pub fn decode_quarantine(key: &[u8]) -> Result<u64, KeyError> {
    check(Family::Quarantine, key)?;
    Ok(rd_u64(key, 1))
}

pub fn archive_segment(segment: u64) -> Vec<u8> {
    KeyBuf::new(b"s", 8).u64(segment).0
}

pub fn decode_archive_segment(key: &[u8]) -> Result<u64, KeyError> {
    check(Family::ArchiveSegments, key)?;
    Ok(rd_u64(key, 1))
}

// ---------------------------------------------------------------------------------------
// The hook log (`audit`).

pub fn hook_log(seq: Seq) -> Vec<u8> {
    KeyBuf::new(b"l", 8).u64(seq.0).0
}

pub fn decode_hook_log(key: &[u8]) -> Result<Seq, KeyError> {
    check(Family::HookLog, key)?;
    Ok(Seq(rd_u64(key, 1)))
}

/// The log records of seqs `[from, to)`.
pub fn hook_log_range(from: Seq, to: Seq) -> (Vec<u8>, Vec<u8>) {
    (hook_log(from), hook_log(to))
}

/// `None` for an empty id (hook ids are never empty).
pub fn hook_id(id: &str) -> Option<Vec<u8>> {
    (!id.is_empty()).then(|| KeyBuf::new(b"i", id.len()).bytes(id.as_bytes()).0)
}

pub fn decode_hook_id(key: &[u8]) -> Result<String, KeyError> {
    check(Family::HookIds, key)?;
    match std::str::from_utf8(&key[1..]) {
        Ok(s) if !s.is_empty() => Ok(s.to_owned()),
        _ => Err(bad(Family::HookIds.name(), key)),
    }
}

/// What a delivery's event is: its key's last byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u8)]
pub enum EventKind {
    Attempt = 1,
    Replayed = 2,
    Recovered = 3,
    /// A pull consumer leased the delivery (its attempt starts).
    Claimed = 4,
    /// The consumer acknowledged it: delivered (an attempt's outcome).
    Acked = 5,
    /// The consumer gave it back (an attempt's outcome: retried or dead-lettered).
    Nacked = 6,
    /// Its lease ran out (an attempt's outcome: retried or dead-lettered).
    Expired = 7,
    /// An operator's purge removed its row (`DELETE /v1/tenants/{t}/queue`).
    Purged = 8,
}

impl EventKind {
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(EventKind::Attempt),
            2 => Some(EventKind::Replayed),
            3 => Some(EventKind::Recovered),
            4 => Some(EventKind::Claimed),
            5 => Some(EventKind::Acked),
            6 => Some(EventKind::Nacked),
            7 => Some(EventKind::Expired),
            8 => Some(EventKind::Purged),
            _ => None,
        }
    }

    /// An attempt's outcome (a push attempt, or a pull lease's end): counted in the
    /// delivery's attempts and in what the hook log keeps of them.
    pub fn is_attempt(self) -> bool {
        matches!(
            self,
            EventKind::Attempt | EventKind::Acked | EventKind::Nacked | EventKind::Expired
        )
    }

    pub fn name(self) -> &'static str {
        match self {
            EventKind::Attempt => "attempt",
            EventKind::Replayed => "replayed",
            EventKind::Recovered => "recovered",
            EventKind::Claimed => "claimed",
            EventKind::Acked => "acked",
            EventKind::Nacked => "nacked",
            EventKind::Expired => "expired",
            EventKind::Purged => "purged",
        }
    }
}

/// A delivery event's key fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventKey {
    pub seq: Seq,
    pub sink: SinkIdx,
    pub at: AtMs,
    pub kind: EventKind,
}

pub fn hook_event(k: &EventKey) -> Vec<u8> {
    let mut b = KeyBuf::new(b"v", 19).u64(k.seq.0).u16(k.sink.0).u64(k.at.0);
    b.0.push(k.kind as u8);
    b.0
}

/// [`decode_hook_event`], but `None` for a well-formed key whose kind this release does not
/// know (a newer release's event, read after a rollback): readers leave such events out.
pub fn decode_hook_event_known(key: &[u8]) -> Result<Option<EventKey>, KeyError> {
    check(Family::HookEvents, key)?;
    if EventKind::from_byte(key[19]).is_none() {
        return Ok(None);
    }
    decode_hook_event(key).map(Some)
}

pub fn decode_hook_event(key: &[u8]) -> Result<EventKey, KeyError> {
    check(Family::HookEvents, key)?;
    let kind = EventKind::from_byte(key[19]).ok_or_else(|| bad("hook_events", key))?;
    Ok(EventKey {
        seq: Seq(rd_u64(key, 1)),
        sink: SinkIdx(rd_u16(key, 9)),
        at: AtMs(rd_u64(key, 11)),
        kind,
    })
}

/// Every event of one delivery, oldest first.
pub fn hook_events_of_delivery(seq: Seq, sink: SinkIdx) -> (Vec<u8>, Vec<u8>) {
    let lo = KeyBuf::new(b"v", 10).u64(seq.0).u16(sink.0).0;
    #[allow(clippy::expect_used, reason = "the prefix starts with b'v'")]
    let hi = prefix_end(&lo).expect("a delivery prefix is never all 0xFF");
    (lo, hi)
}

/// Every event of the hooks with seqs `[from, to)`.
pub fn hook_events_of_seqs(from: Seq, to: Seq) -> (Vec<u8>, Vec<u8>) {
    (
        KeyBuf::new(b"v", 8).u64(from.0).0,
        KeyBuf::new(b"v", 8).u64(to.0).0,
    )
}

// ---------------------------------------------------------------------------------------
// The archive (`archive`).

/// An archived hook's key fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ArchivedKey {
    pub ord: TenantOrd,
    pub received: AtMs,
    pub seq: Seq,
}

pub fn archived_hook(k: &ArchivedKey) -> Vec<u8> {
    KeyBuf::new(b"h", 20)
        .u32(k.ord.0)
        .u64(k.received.0)
        .u64(k.seq.0)
        .0
}

pub fn decode_archived_hook(key: &[u8]) -> Result<ArchivedKey, KeyError> {
    check(Family::ArchivedHooks, key)?;
    Ok(ArchivedKey {
        ord: TenantOrd(rd_u32(key, 1)),
        received: AtMs(rd_u64(key, 5)),
        seq: Seq(rd_u64(key, 13)),
    })
}

/// A tenant's archived hooks received in `[from, to)`.
pub fn archived_range(ord: TenantOrd, from: AtMs, to: AtMs) -> (Vec<u8>, Vec<u8>) {
    (
        KeyBuf::new(b"h", 12).u32(ord.0).u64(from.0).0,
        KeyBuf::new(b"h", 12).u32(ord.0).u64(to.0).0,
    )
}

pub fn archive_expiry(expires: AtMs, seq: Seq) -> Vec<u8> {
    KeyBuf::new(b"y", 16).u64(expires.0).u64(seq.0).0
}

pub fn decode_archive_expiry(key: &[u8]) -> Result<(AtMs, Seq), KeyError> {
    check(Family::ArchiveExpiry, key)?;
    Ok((AtMs(rd_u64(key, 1)), Seq(rd_u64(key, 9))))
}

/// Every expiry key of hooks expiring before `until`.
pub fn archive_expired_before(until: AtMs) -> (Vec<u8>, Vec<u8>) {
    (
        Family::ArchiveExpiry.lo(),
        KeyBuf::new(b"y", 8).u64(until.0).0,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn due_key() -> impl Strategy<Value = DueKey> {
        (
            0..=TenantOrd::MAX_REAL,
            any::<u64>(),
            any::<u64>(),
            any::<u16>(),
        )
            .prop_map(|(o, a, s, k)| DueKey {
                ord: TenantOrd(o),
                at: AtMs(a),
                seq: Seq(s),
                sink: SinkIdx(k),
            })
    }

    fn dead_key() -> impl Strategy<Value = DeadKey> {
        (any::<u64>(), any::<u64>(), any::<u16>()).prop_map(|(a, s, k)| DeadKey {
            at: AtMs(a),
            seq: Seq(s),
            sink: SinkIdx(k),
        })
    }

    fn inside(family: Family, key: &[u8]) -> bool {
        family.lo().as_slice() < key && key < family.hi().as_slice()
    }

    proptest! {
        #[test]
        fn due_keys_round_trip_and_sort_by_ord_at_seq_sink(a in due_key(), b in due_key()) {
            let (ka, kb) = (due(&a), due(&b));
            prop_assert_eq!(decode_due(&ka).unwrap(), a);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            prop_assert!(inside(Family::Due, &ka));
            let (lo, hi) = due_tenant_range(a.ord);
            prop_assert!(lo <= ka && ka < hi);
        }

        #[test]
        fn inflight_keys_round_trip_and_sort(a in due_key(), b in due_key()) {
            let ia = InflightKey { ord: a.ord, seq: a.seq, sink: a.sink };
            let ib = InflightKey { ord: b.ord, seq: b.seq, sink: b.sink };
            let (ka, kb) = (inflight(&ia), inflight(&ib));
            prop_assert_eq!(decode_inflight(&ka).unwrap(), ia);
            prop_assert_eq!(ka.cmp(&kb), ia.cmp(&ib));
            prop_assert!(inside(Family::Inflight, &ka));
        }

        #[test]
        fn dead_keys_round_trip_and_sort_by_time(a in dead_key(), b in dead_key(), o in 0..=TenantOrd::MAX_REAL) {
            let (ka, kb) = (dead(&a), dead(&b));
            prop_assert_eq!(decode_dead(&ka).unwrap(), a);
            prop_assert_eq!(ka.cmp(&kb), a.cmp(&b));
            prop_assert!(inside(Family::Dead, &ka));
            let x = dead_by_tenant(TenantOrd(o), &a);
            prop_assert_eq!(decode_dead_by_tenant(&x).unwrap(), (TenantOrd(o), a));
            prop_assert!(inside(Family::DeadByTenant, &x));
            prop_assert_eq!(dead_by_tenant(TenantOrd(o), &a).cmp(&dead_by_tenant(TenantOrd(o), &b)), a.cmp(&b));
        }

        #[test]
        fn active_keys_sort_by_bucket_then_ord(b1 in any::<u64>(), o1 in 0..=TenantOrd::MAX_REAL, b2 in any::<u64>(), o2 in 0..=TenantOrd::MAX_REAL) {
            let (ka, kb) = (active(Bucket(b1), TenantOrd(o1)), active(Bucket(b2), TenantOrd(o2)));
            prop_assert_eq!(decode_active(&ka).unwrap(), (Bucket(b1), TenantOrd(o1)));
            prop_assert_eq!(ka.cmp(&kb), (b1, o1).cmp(&(b2, o2)));
            prop_assert!(inside(Family::Active, &ka));
            if b1 < u64::MAX {
                let (lo, end) = active_through(Bucket(b1));
                prop_assert!(lo < ka && ka < end);
            }
        }

        #[test]
        fn seq_keyed_families_round_trip_and_sort(s1 in any::<u64>(), s2 in any::<u64>(), k1 in any::<u16>(), k2 in any::<u16>(), at in any::<u64>()) {
            prop_assert_eq!(decode_hook(&hook(Seq(s1))).unwrap(), Seq(s1));
            prop_assert_eq!(hook(Seq(s1)).cmp(&hook(Seq(s2))), s1.cmp(&s2));
            prop_assert!(inside(Family::Hooks, &hook(Seq(s1))));
            prop_assert_eq!(decode_delivery(&delivery(Seq(s1), SinkIdx(k1))).unwrap(), (Seq(s1), SinkIdx(k1)));
            prop_assert_eq!(delivery(Seq(s1), SinkIdx(k1)).cmp(&delivery(Seq(s2), SinkIdx(k2))), (s1, k1).cmp(&(s2, k2)));
            prop_assert!(inside(Family::Deliveries, &delivery(Seq(s1), SinkIdx(k1))));
            let (lo, hi) = deliveries_of_hook(Seq(s1));
            let k = delivery(Seq(s1), SinkIdx(k1));
            prop_assert!(lo <= k && k < hi);
            prop_assert_eq!(decode_archive(&archive(Seq(s1))).unwrap(), Seq(s1));
            prop_assert!(inside(Family::Archive, &archive(Seq(s1))));
            prop_assert_eq!(decode_cleared(&cleared(Seq(s1))).unwrap(), Seq(s1));
            prop_assert_eq!(decode_claim(&claim(Seq(s1), SinkIdx(k1))).unwrap(), (Seq(s1), SinkIdx(k1)));
            prop_assert_eq!(decode_audit(&audit(Seq(s1), AtMs(at))).unwrap(), (Seq(s1), AtMs(at)));
            prop_assert_eq!(decode_quarantine(&quarantine(s1)).unwrap(), s1);
            prop_assert_eq!(decode_archive_segment(&archive_segment(s1)).unwrap(), s1);
            prop_assert_eq!(decode_due_v2(&due_v2(AtMs(at), Seq(s1), SinkIdx(k1))).unwrap(), (AtMs(at), Seq(s1), SinkIdx(k1)));
            prop_assert!(inside(Family::DueV2, &due_v2(AtMs(at), Seq(s1), SinkIdx(k1))));
            prop_assert_eq!(decode_inflight_v2(&inflight_v2(Seq(s1), SinkIdx(k1))).unwrap(), (Seq(s1), SinkIdx(k1)));
        }

        #[test]
        fn counter_keys_round_trip_and_stay_inside_sentinels(o in 0..=TenantOrd::MAX_REAL, f in 1u8..=6) {
            let field = CounterField::from_byte(f).unwrap();
            let k = counter(TenantOrd(o), field);
            prop_assert_eq!(decode_counter(&k).unwrap(), (TenantOrd(o), field));
            prop_assert!(inside(Family::Counters, &k));
        }

        #[test]
        fn tenant_keys_round_trip(o in 0..=TenantOrd::MAX_REAL, name in "\\PC{1,40}") {
            prop_assert_eq!(decode_tenant_name(&tenant_name(TenantOrd(o))).unwrap(), TenantOrd(o));
            prop_assert_eq!(decode_tenant_ord(&tenant_ord(&name)).unwrap(), name.clone());
            prop_assert!(inside(Family::TenantOrds, &tenant_ord(&name)));
            prop_assert!(inside(Family::TenantNames, &tenant_name(TenantOrd(o))));
        }

        #[test]
        fn dedupe_keys_stay_in_their_tenant_range(t in "[a-z]{1,12}", idem in proptest::collection::vec(any::<u8>(), 0..40), at in any::<u64>()) {
            let u = dedupe(&t, &idem).unwrap();
            let (lo, hi) = dedupe_tenant_range(&t);
            prop_assert!(lo <= u && u < hi);
            prop_assert!(inside(Family::Dedupe, &u));
            let e = dedupe_expiry(AtMs(at), &u);
            prop_assert_eq!(decode_dedupe_expiry(&e).unwrap(), (AtMs(at), u));
            prop_assert!(inside(Family::DedupeExpiry, &e));
        }
    }

    #[test]
    fn sentinels_of_one_column_family_do_not_overlap() {
        for fam in Family::FORMAT3.iter().chain(Family::FORMAT2.iter()) {
            for other in Family::FORMAT3.iter().chain(Family::FORMAT2.iter()) {
                if fam == other || fam.cf() != other.cf() {
                    continue;
                }
                let (a0, a1) = fam.bounds();
                let (b0, b1) = other.bounds();
                assert!(a1 <= b0 || b1 <= a0, "{fam:?} and {other:?} overlap");
            }
            assert!(fam.lo() < fam.hi());
        }
    }

    proptest! {
        #[test]
        fn hook_log_keys_round_trip_and_stay_inside_sentinels(
            s in 0..u64::MAX, k in any::<u16>(), at in any::<u64>(), kind in 1u8..=8, id in "\\PC{1,60}"
        ) {
            prop_assert_eq!(decode_hook_log(&hook_log(Seq(s))).unwrap(), Seq(s));
            prop_assert!(inside(Family::HookLog, &hook_log(Seq(s))));
            let i = hook_id(&id).unwrap();
            prop_assert_eq!(decode_hook_id(&i).unwrap(), id);
            prop_assert!(inside(Family::HookIds, &i));
            let e = EventKey { seq: Seq(s), sink: SinkIdx(k), at: AtMs(at), kind: EventKind::from_byte(kind).unwrap() };
            let ek = hook_event(&e);
            prop_assert_eq!(decode_hook_event(&ek).unwrap(), e);
            prop_assert!(inside(Family::HookEvents, &ek));
            let (lo, hi) = hook_events_of_delivery(Seq(s), SinkIdx(k));
            prop_assert!(lo <= ek && ek < hi);
            let (lo, hi) = hook_events_of_seqs(Seq(s), Seq(s + 1));
            prop_assert!(lo <= ek && ek < hi);
        }
    }

    proptest! {
        #[test]
        fn archive_keys_round_trip_sort_by_tenant_then_time_and_stay_inside_sentinels(
            o in 0..=TenantOrd::MAX_REAL, r in any::<u64>(), s in any::<u64>(), e in 0..u64::MAX,
        ) {
            let k = ArchivedKey { ord: TenantOrd(o), received: AtMs(r), seq: Seq(s) };
            let b = archived_hook(&k);
            prop_assert_eq!(decode_archived_hook(&b).unwrap(), k);
            prop_assert!(inside(Family::ArchivedHooks, &b));
            if r < u64::MAX {
                let (lo, hi) = archived_range(TenantOrd(o), AtMs(r), AtMs(r + 1));
                prop_assert!(lo <= b && b < hi);
            }
            let y = archive_expiry(AtMs(e), Seq(s));
            prop_assert_eq!(decode_archive_expiry(&y).unwrap(), (AtMs(e), Seq(s)));
            prop_assert!(inside(Family::ArchiveExpiry, &y));
            let (lo, hi) = archive_expired_before(AtMs(e + 1));
            prop_assert!(lo < y && y < hi);
        }
    }

    #[test]
    fn meta_migrating_round_trips() {
        assert_eq!(decode_meta_migrating(&meta_migrating(3)), Some(3));
        assert_eq!(decode_meta_migrating(b"m:format"), None);
    }

    #[test]
    fn malformed_keys_are_errors_not_panics() {
        assert!(decode_due(b"D\x00").is_err());
        assert!(decode_due(&[b'F'; 23]).is_err());
        assert!(decode_counter(&[0, 0, 0, 1, 9]).is_err());
        assert!(decode_dedupe_expiry(b"e").is_err());
    }
}
