//! Tenant ordinals (docs/storage.md, "Tenant ordinals"): dense u32s from 1 in first-sight order, never reused.
//!
//! - `?n tenant → ord` and `?t ord → tenant` in the `tenants` family; `m:next_ord` in meta.
//! - Only the writer allocates, through its [`Allocator`]: the `?t`, `?n` and `m:next_ord`
//!   puts ride in the same commit batch as the rows that use the new ordinal, so an
//!   ordinal is never visible without its rows or the other way round.
//! - The allocator's cache (65 536 entries, cleared whole when full) is filled only after
//!   a commit succeeded ([`Allocator::committed`]); a miss is one `multi_get` of the
//!   batch's uncached tenants.
//! - `tenants.max`: a tenant that would be the max+1-th is refused with
//!   [`QueueError::TenantLimit`]; an existing tenant is never refused.
//! - Erase (later work) deletes `?n` and leaves `?t` as a tombstone with an empty value.

use std::collections::HashMap;

use super::{Change, QueueError};
use ankusa_keyspace::Cf;
use ankusa_keyspace::TenantOrd;
use ankusa_store::{decode_u32, Op, Rows, Store};

/// The longest tenant id accepted, in bytes.
pub const MAX_TENANT_LEN: usize = ankusa_config::MAX_TENANT_LEN;
/// The writer's cache size (entries).
pub const CACHE_CAPACITY: usize = 65_536;

/// Checks a tenant id: non-empty, at most 256 bytes, no control characters.
pub fn validate(tenant: &str) -> Result<(), QueueError> {
    match ankusa_config::tenant_id_problem(tenant) {
        Some(why) => Err(QueueError::InvalidTenant(why)),
        None => Ok(()),
    }
}

/// The ordinal of a tenant, if it has one.
pub fn ord(store: &Store, tenant: &str) -> Result<Option<TenantOrd>, QueueError> {
    Ok(store
        .get(Cf::Tenants, &ankusa_keyspace::tenant_ord(tenant))?
        .as_deref()
        .and_then(decode_u32)
        .map(TenantOrd))
}

/// The tenant id of an ordinal (`None` for an unknown or erased ordinal).
pub fn name(store: &Store, ord: TenantOrd) -> Result<Option<String>, QueueError> {
    Ok(store
        .get(Cf::Tenants, &ankusa_keyspace::tenant_name(ord))?
        .filter(|v| !v.is_empty())
        .map(|v| String::from_utf8_lossy(&v).into_owned()))
}

/// Tenants whose id starts with `prefix`, in id order, after `after`: one seek and at most
/// `limit` rows of the `?n` index (never a scan of every tenant).
pub fn list(
    store: &Store,
    prefix: &str,
    after: Option<&str>,
    limit: usize,
) -> Result<Vec<(String, TenantOrd)>, QueueError> {
    let mut from = ankusa_keyspace::tenant_ord(prefix);
    if let Some(a) = after.filter(|a| a.as_bytes() >= prefix.as_bytes()) {
        from = ankusa_keyspace::tenant_ord(a);
        // Strictly after: the smallest key above `a`'s.
        from.push(0);
    }
    // Every key that starts with the prefix sorts below the prefix followed by 0xFF bytes
    // (ids are UTF-8, which never holds 0xFF).
    let mut to = ankusa_keyspace::tenant_ord(prefix);
    to.extend([0xFF; 4]);
    let mut out = Vec::new();
    for kv in store.scan(
        ankusa_keyspace::Family::TenantOrds,
        &from,
        &to,
        ankusa_store::Dir::Forward,
    )? {
        let (k, v) = kv?;
        if out.len() >= limit {
            break;
        }
        let name = ankusa_keyspace::decode_tenant_ord(&k)?;
        let ord = decode_u32(&v).ok_or_else(|| {
            QueueError::corrupt(
                ankusa_keyspace::Family::TenantOrds,
                format!("bad ordinal for {name:?}"),
            )
        })?;
        out.push((name, TenantOrd(ord)));
    }
    Ok(out)
}

/// The next ordinal to allocate (`m:next_ord`; 1 on a store that has none yet).
pub fn next_ord(store: &Store) -> Result<u32, QueueError> {
    Ok(store
        .get(Cf::Default, ankusa_keyspace::META_NEXT_ORD)?
        .as_deref()
        .and_then(decode_u32)
        .unwrap_or(1))
}

/// Ordinals ever allocated (`m:next_ord - 1`): an O(1) read.
pub fn count(store: &Store) -> Result<u32, QueueError> {
    Ok(next_ord(store)?.saturating_sub(1))
}

/// The ops that create ordinal `ord` for `tenant` and move `m:next_ord` past it.
pub fn allocation_ops(tenant: &str, ord: TenantOrd) -> [Op; 3] {
    [
        Op::put(
            Cf::Tenants,
            ankusa_keyspace::tenant_name(ord),
            tenant.as_bytes(),
        ),
        Op::put(
            Cf::Tenants,
            ankusa_keyspace::tenant_ord(tenant),
            ord.0.to_be_bytes(),
        ),
        Op::put(
            Cf::Default,
            ankusa_keyspace::META_NEXT_ORD.to_vec(),
            (ord.0 + 1).to_be_bytes(),
        ),
    ]
}

/// A bounded map of tenant id → ordinal, cleared whole when full.
#[derive(Debug, Default)]
pub struct TenantCache {
    map: HashMap<String, TenantOrd>,
    capacity: usize,
}

impl TenantCache {
    pub fn new(capacity: usize) -> Self {
        TenantCache {
            map: HashMap::new(),
            capacity: capacity.max(1),
        }
    }
    pub fn get(&self, tenant: &str) -> Option<TenantOrd> {
        self.map.get(tenant).copied()
    }
    pub fn insert(&mut self, tenant: &str, ord: TenantOrd) {
        if self.map.len() >= self.capacity && !self.map.contains_key(tenant) {
            self.map.clear();
        }
        self.map.insert(tenant.to_owned(), ord);
    }
    pub fn len(&self) -> usize {
        self.map.len()
    }
    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

/// The result of resolving one batch's tenants.
#[derive(Debug, Default)]
pub struct Resolution {
    /// Each tenant's ordinal, or why it has none.
    pub ords: HashMap<String, Result<TenantOrd, QueueError>>,
    /// Allocation ops to put in the batch's commit (empty if nothing is new).
    pub ops: Vec<Op>,
    /// Tenants this batch creates, in allocation order.
    pub created: Vec<(String, TenantOrd)>,
    resolved: Vec<(String, TenantOrd)>,
    next: u32,
}

impl Resolution {
    pub fn ord_of(&self, tenant: &str) -> Option<TenantOrd> {
        self.ords.get(tenant).and_then(|r| r.as_ref().ok().copied())
    }
}

/// The writer's tenant resolver: cache, lookup and allocation.
#[derive(Debug)]
pub struct Allocator {
    cache: TenantCache,
    next: Option<u32>,
    /// `tenants.max`, shared with what reloads it ([`Allocator::max_handle`]).
    max: std::sync::Arc<std::sync::atomic::AtomicU32>,
}

impl Allocator {
    pub fn new(max: u32) -> Self {
        Allocator {
            cache: TenantCache::new(CACHE_CAPACITY),
            next: None,
            max: std::sync::Arc::new(std::sync::atomic::AtomicU32::new(max)),
        }
    }

    /// The allocator's `tenants.max`: a store into it takes effect at the next batch
    /// (a configuration reload raises or lowers it; a tenant that has an ordinal is never
    /// refused).
    pub fn max_handle(&self) -> std::sync::Arc<std::sync::atomic::AtomicU32> {
        self.max.clone()
    }

    /// With a cache of `capacity` entries (tests).
    pub fn with_cache(max: u32, capacity: usize) -> Self {
        Allocator {
            cache: TenantCache::new(capacity),
            ..Allocator::new(max)
        }
    }

    pub fn cache_len(&self) -> usize {
        self.cache.len()
    }

    /// Resolves the distinct tenants of a batch: cache hits, one `multi_get` for the
    /// misses, and new ordinals (in order of `tenants`) for those with no row. Nothing is
    /// written and the allocator does not change until [`Allocator::committed`].
    pub fn resolve<'a>(
        &mut self,
        store: &Store,
        tenants: impl IntoIterator<Item = &'a str>,
    ) -> Result<Resolution, QueueError> {
        let mut res = Resolution::default();
        let mut misses: Vec<&str> = Vec::new();
        for t in tenants {
            if res.ords.contains_key(t) || misses.contains(&t) {
                continue;
            }
            if let Err(e) = validate(t) {
                res.ords.insert(t.to_owned(), Err(e));
                continue;
            }
            match self.cache.get(t) {
                Some(o) => {
                    res.ords.insert(t.to_owned(), Ok(o));
                }
                None => misses.push(t),
            }
        }
        if misses.is_empty() {
            return Ok(res);
        }
        let keys: Vec<Vec<u8>> = misses
            .iter()
            .map(|t| ankusa_keyspace::tenant_ord(t))
            .collect();
        let found = store.multi_get(Cf::Tenants, &keys)?;
        let mut next = match self.next {
            Some(n) => n,
            None => next_ord(store)?,
        };
        let max = self.max.load(std::sync::atomic::Ordering::Relaxed);
        for (t, v) in misses.into_iter().zip(found) {
            match v.as_deref().and_then(decode_u32) {
                Some(o) => {
                    res.resolved.push((t.to_owned(), TenantOrd(o)));
                    res.ords.insert(t.to_owned(), Ok(TenantOrd(o)));
                }
                None if next > max || next > TenantOrd::MAX_REAL => {
                    res.ords
                        .insert(t.to_owned(), Err(QueueError::TenantLimit { max }));
                }
                None => {
                    let o = TenantOrd(next);
                    next += 1;
                    res.ops.extend(allocation_ops(t, o));
                    res.created.push((t.to_owned(), o));
                    res.ords.insert(t.to_owned(), Ok(o));
                }
            }
        }
        res.next = next;
        Ok(res)
    }

    /// Forgets the next ordinal, to read `m:next_ord` again: a batch whose commit failed
    /// may be in the store with the ordinals it allocated (then they are spent) or not
    /// (then the next batch allocates them again). The cache holds only committed
    /// tenants, so it stays; a tenant of the failed batch misses it and is looked up.
    pub fn reload(&mut self) {
        self.next = None;
    }

    /// Forgets every cached ordinal (a tenant was erased: its id has none any more).
    pub fn forget(&mut self) {
        self.cache = TenantCache::new(CACHE_CAPACITY);
    }

    /// Records a resolution whose batch committed: caches its ordinals and moves past the
    /// ones it allocated. A batch that failed is not recorded ([`Allocator::reload`]).
    pub fn committed(&mut self, res: &Resolution) {
        for (t, o) in res.resolved.iter().chain(res.created.iter()) {
            self.cache.insert(t, *o);
        }
        if res.next > 0 {
            self.next = Some(res.next);
        }
    }
}

/// Paused tenants: `m:paused:<<ord::32>>` in meta → `<<at::64>>` (when it was paused).
/// While one is there, dispatch makes no attempt for the tenant: its rows stay due and
/// counted, and its active markers are taken out as dispatch meets them (so a paused
/// backlog never fills a tick's marker budget); a resume puts one back for every second
/// its due rows are in ([`crate::deliveries::restore_tenant_markers`]) before the key goes.
const PAUSED_PREFIX: &[u8] = b"m:paused:";
/// The end of [`PAUSED_PREFIX`]'s range (`:` + 1).
const PAUSED_END: &[u8] = b"m:paused;";

/// The key that marks tenant `ord` paused.
pub fn paused_key(ord: TenantOrd) -> Vec<u8> {
    let mut k = PAUSED_PREFIX.to_vec();
    k.extend_from_slice(&ord.0.to_be_bytes());
    k
}

/// The change that pauses tenant `ord` at `at`.
pub fn pause_op(ord: TenantOrd, at: ankusa_keyspace::AtMs) -> Change {
    Change(Op::put(
        Cf::Default,
        paused_key(ord),
        at.0.to_be_bytes().to_vec(),
    ))
}

/// The change that ends tenant `ord`'s pause.
pub fn resume_op(ord: TenantOrd) -> Change {
    Change(Op::delete(Cf::Default, paused_key(ord)))
}

/// Every paused tenant, with when it was paused.
pub fn paused(store: &Store) -> Result<Vec<(TenantOrd, ankusa_keyspace::AtMs)>, QueueError> {
    ord_times(store, PAUSED_PREFIX, PAUSED_END, "a pause key")
}

/// The `<prefix><<ord::32>>` → `<<at::64>>` keys of meta up to `end`; `what` names them in
/// the corruption one that does not decode is.
fn ord_times(
    store: &Store,
    prefix: &[u8],
    end: &[u8],
    what: &str,
) -> Result<Vec<(TenantOrd, ankusa_keyspace::AtMs)>, QueueError> {
    let mut out = Vec::new();
    for (k, v) in meta_range(store, prefix, end)? {
        let ord = k.strip_prefix(prefix).and_then(decode_u32);
        let at = <[u8; 8]>::try_from(v.as_slice())
            .ok()
            .map(u64::from_be_bytes);
        match (ord, at) {
            (Some(o), Some(a)) => out.push((TenantOrd(o), ankusa_keyspace::AtMs(a))),
            _ => {
                return Err(QueueError::corrupt_at(
                    ankusa_keyspace::Family::Meta,
                    &k,
                    format!("{what} that does not decode"),
                ))
            }
        }
    }
    Ok(out)
}

/// A key and its value.
type Kv = (Vec<u8>, Vec<u8>);

/// Every meta key from `prefix` up to `end` (the prefix's end), with its value.
fn meta_range(store: &Store, prefix: &[u8], end: &[u8]) -> Result<Vec<Kv>, QueueError> {
    store
        .scan(
            ankusa_keyspace::Family::Meta,
            prefix,
            end,
            ankusa_store::Dir::Forward,
        )?
        .map(|kv| kv.map_err(QueueError::from))
        .collect()
}

/// Tenant quotas set for one tenant (`PUT /v1/tenants/{t}/limits`): `m:limits:<tenant id>`
/// in meta → the overrides as JSON ([`ankusa_config::TenantLimits`] with `null` for "no
/// limit"; an absent key keeps the default). Keyed by the tenant's id, not its ordinal: a
/// limit can be set before the tenant's first hook, on every node of a Relay, whichever
/// owns it later.
const LIMITS_PREFIX: &[u8] = b"m:limits:";
/// The end of [`LIMITS_PREFIX`]'s range.
const LIMITS_END: &[u8] = b"m:limits;";

/// The key of tenant `tenant`'s quotas.
pub fn limits_key(tenant: &str) -> Vec<u8> {
    let mut k = LIMITS_PREFIX.to_vec();
    k.extend_from_slice(tenant.as_bytes());
    k
}

/// The change that sets tenant `tenant`'s quotas to `json` (or, with `None`, removes them).
pub fn limits_op(tenant: &str, json: Option<Vec<u8>>) -> Change {
    Change(match json {
        Some(v) => Op::put(Cf::Default, limits_key(tenant), v),
        None => Op::delete(Cf::Default, limits_key(tenant)),
    })
}

/// Every tenant's quotas as stored: `(tenant id, JSON)`.
pub fn limits(store: &Store) -> Result<Vec<(String, Vec<u8>)>, QueueError> {
    let mut out = Vec::new();
    for (k, v) in meta_range(store, LIMITS_PREFIX, LIMITS_END)? {
        let tenant = k
            .strip_prefix(LIMITS_PREFIX)
            .and_then(|t| std::str::from_utf8(t).ok())
            .ok_or_else(|| {
                QueueError::corrupt_at(
                    ankusa_keyspace::Family::Meta,
                    &k,
                    "a limits key whose tenant is not UTF-8",
                )
            })?;
        out.push((tenant.to_owned(), v));
    }
    Ok(out)
}

#[cfg(test)]
mod range_tests {
    use super::*;

    #[test]
    fn each_meta_range_ends_where_its_prefix_does() {
        for (p, e) in [
            (PAUSED_PREFIX, PAUSED_END),
            (LIMITS_PREFIX, LIMITS_END),
            (ERASING_PREFIX, ERASING_END),
        ] {
            assert_eq!(ankusa_keyspace::prefix_end(p).as_deref(), Some(e));
        }
    }
}

/// Tenants being erased: `m:erasing:<<ord::32>>` in meta → `<<at::64>>` (when the erase
/// began). While one is there the writer refuses the tenant's hooks and dispatch makes no
/// attempt for it; [`crate::erase`] removes its rows, and its last write deletes the key.
const ERASING_PREFIX: &[u8] = b"m:erasing:";
/// The end of [`ERASING_PREFIX`]'s range.
const ERASING_END: &[u8] = b"m:erasing;";

fn erasing_key(ord: TenantOrd) -> Vec<u8> {
    let mut k = ERASING_PREFIX.to_vec();
    k.extend_from_slice(&ord.0.to_be_bytes());
    k
}

/// The change that marks tenant `ord` erasing since `at`.
pub fn erase_begin_op(ord: TenantOrd, at: ankusa_keyspace::AtMs) -> Change {
    Change(Op::put(
        Cf::Default,
        erasing_key(ord),
        at.0.to_be_bytes().to_vec(),
    ))
}

/// The change that ends tenant `ord`'s erase (in its last write).
pub fn erase_end_op(ord: TenantOrd) -> Change {
    Change(Op::delete(Cf::Default, erasing_key(ord)))
}

/// Every tenant being erased, with when its erase began.
pub fn erasing(store: &Store) -> Result<Vec<(TenantOrd, ankusa_keyspace::AtMs)>, QueueError> {
    ord_times(store, ERASING_PREFIX, ERASING_END, "an erase marker")
}

/// The tenants being erased on this node, shared by the writer (which refuses their hooks)
/// and the erase tasks. When an erase ends the writer forgets every ordinal it cached, so a
/// later hook of the same id makes a new one.
#[derive(Debug, Default)]
pub struct Erasing {
    names: std::sync::RwLock<std::collections::HashSet<String>>,
    /// `names.len()`, read without the lock: no tenant is erasing on most nodes.
    count: std::sync::atomic::AtomicUsize,
    /// Erases ended: the writer drops its ordinal cache when it moves.
    ended: std::sync::atomic::AtomicU64,
}

impl Erasing {
    /// Tenant `tenant`'s hooks are refused from now on.
    pub fn begin(&self, tenant: &str) {
        let mut names = self.names.write().unwrap_or_else(|p| p.into_inner());
        names.insert(tenant.to_owned());
        self.count
            .store(names.len(), std::sync::atomic::Ordering::SeqCst);
    }

    /// Tenant `tenant`'s erase ended (its last write committed): the writer forgets its
    /// cached ordinals, then the tenant's hooks are taken again, as a new tenant.
    pub fn end(&self, tenant: &str) {
        self.ended.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut names = self.names.write().unwrap_or_else(|p| p.into_inner());
        names.remove(tenant);
        self.count
            .store(names.len(), std::sync::atomic::Ordering::SeqCst);
    }

    /// Whether tenant `tenant` is being erased.
    pub fn contains(&self, tenant: &str) -> bool {
        self.count.load(std::sync::atomic::Ordering::SeqCst) > 0
            && self
                .names
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .contains(tenant)
    }

    /// How many erases have ended (the writer compares it with the last it saw).
    pub fn ended(&self) -> u64 {
        self.ended.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn len(&self) -> usize {
        self.count.load(std::sync::atomic::Ordering::SeqCst)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}
