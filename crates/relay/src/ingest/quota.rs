//! Tenant quotas, enforced at ingest by the node that owns the tenant.
//!
//! - **Ingest rate**: a token bucket per tenant, refilled at `ingest_per_second` up to
//!   `ingest_burst`. An empty bucket answers 429 `tenant_rate_limited`, `Retry-After` the
//!   seconds until a token is back.
//! - **Queued bytes**: the tenant's `bytes` counter (the size of its delivery rows, one
//!   point read) at or over `queued_bytes` answers 503 `tenant_backlog_full`. Requests
//!   already past the check may still commit: the overshoot is bounded by the requests in
//!   flight, not by the flood.
//!
//! - **Archive bytes**: enforced by the archiver, not here: a hook that would take the
//!   tenant's archived copies past `archive_bytes` is delivered but not archived
//!   ([`ankusa_queue::archive::Policy::archive_limit`], [`ArchivePolicy`]).
//!
//! The defaults are `tenants.limits` (reloadable); a tenant's own are set at run time with
//! `PUT /v1/tenants/{t}/limits`, persisted as `m:limits:<tenant>` and loaded at boot. A
//! tenant with no limit costs one atomic load per hook while no tenant has its own limits,
//! one map lookup otherwise.
//!
//! Bounds: at most [`MAX_OVERRIDES`] tenants with their own limits (more is refused);
//! buckets and refusal records are kept for at most [`MAX_TRACKED`] tenants each — a full
//! bucket is the same as none and is dropped first, a refusal record older than
//! [`OVER_QUOTA_WINDOW_MS`] next.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use arc_swap::ArcSwap;

use ankusa_api::admin::Overrides;
use ankusa_config::TenantLimits;
use ankusa_keyspace::CounterField;
use ankusa_queue::engine::Store;
use ankusa_queue::{tenants, QueueError};

/// The most tenants with their own limits on a node.
pub const MAX_OVERRIDES: usize = 100_000;
/// The most tenants a node keeps a bucket, or a refusal record, for.
pub const MAX_TRACKED: usize = 65_536;
/// A tenant refused by a quota within this window counts as over quota.
pub const OVER_QUOTA_WINDOW_MS: u64 = 5 * 60 * 1000;

/// `defaults` with a tenant's own limits over them.
pub fn over(o: &Overrides, defaults: &TenantLimits) -> TenantLimits {
    TenantLimits {
        ingest_per_second: o.ingest_per_second.unwrap_or(defaults.ingest_per_second),
        // A burst follows its own rate: a tenant given a rate and no burst gets that
        // rate's default burst, not the default rate's burst.
        ingest_burst: o.ingest_burst.unwrap_or(match o.ingest_per_second {
            Some(_) => None,
            None => defaults.ingest_burst,
        }),
        queued_bytes: o.queued_bytes.unwrap_or(defaults.queued_bytes),
        archive_bytes: o.archive_bytes.unwrap_or(defaults.archive_bytes),
    }
}

/// Why a hook was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 429, retry after this many seconds.
    Rate { retry_after_s: u32 },
    /// 503: the tenant's queued bytes are at its limit.
    Backlog { queued: i64, limit: u64 },
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// A tenant's refusals since the node started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Refused {
    pub count: u64,
    pub last_ms: u64,
}

/// The node's quotas: defaults, overrides, buckets and refusal records.
#[derive(Debug)]
pub struct Quotas {
    defaults: ArcSwap<TenantLimits>,
    overrides: std::sync::RwLock<HashMap<String, Overrides>>,
    /// `overrides.len()`, read without the lock: most nodes have none, and a hook of a
    /// tenant with no limit then costs no lock and no hash.
    overridden: std::sync::atomic::AtomicUsize,
    buckets: Mutex<HashMap<String, Bucket>>,
    refused: Mutex<HashMap<String, Refused>>,
    /// Held by a change of overrides while it writes: one at a time.
    changes: Mutex<()>,
    /// `ankusa_tenant_limit_overrides`.
    overrides_gauge: prometheus_client::metrics::gauge::Gauge,
}

impl Quotas {
    pub fn new(
        defaults: TenantLimits,
        overrides_gauge: prometheus_client::metrics::gauge::Gauge,
    ) -> Quotas {
        Quotas {
            defaults: ArcSwap::from_pointee(defaults),
            overrides: Default::default(),
            overridden: Default::default(),
            buckets: Default::default(),
            refused: Default::default(),
            changes: Default::default(),
            overrides_gauge,
        }
    }

    /// The store's overrides (at boot).
    pub fn load(&self, store: &Store) -> Result<usize, QueueError> {
        let mut map = HashMap::new();
        for (t, json) in tenants::limits(store)? {
            match serde_json::from_slice::<Overrides>(&json) {
                Ok(o) => {
                    map.insert(t, o);
                }
                // Written by this code, so only a corrupt value gets here: the tenant runs
                // on the defaults, and a new PUT writes it again.
                Err(e) => {
                    tracing::error!(tenant = %t, error = %e, "a tenant's stored limits do not decode; it runs on the defaults")
                }
            }
        }
        let n = map.len();
        let mut held = self.overrides.write().unwrap_or_else(|p| p.into_inner());
        *held = map;
        self.counted(&held);
        Ok(n)
    }

    /// New defaults (a configuration reload).
    pub fn set_defaults(&self, defaults: TenantLimits) {
        self.defaults.store(std::sync::Arc::new(defaults));
    }

    pub fn defaults(&self) -> TenantLimits {
        **self.defaults.load()
    }

    /// Tenant `tenant`'s own limits, if it has any.
    pub fn overrides(&self, tenant: &str) -> Option<Overrides> {
        if self.overridden.load(std::sync::atomic::Ordering::Acquire) == 0 {
            return None;
        }
        self.overrides
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(tenant)
            .copied()
    }

    /// The limits tenant `tenant` runs under.
    pub fn effective(&self, tenant: &str) -> TenantLimits {
        let d = self.defaults();
        match self.overrides(tenant) {
            Some(o) => over(&o, &d),
            None => d,
        }
    }

    /// Sets tenant `tenant`'s own limits (`None` or empty: back to the defaults), with the
    /// audit row `audit()` makes, in one synced write. `Ok(false)`: they were so already
    /// (nothing written).
    pub fn set(
        &self,
        store: &Store,
        tenant: &str,
        next: Option<Overrides>,
        audit: impl FnOnce() -> ankusa_queue::Change,
    ) -> Result<Result<bool, SetError>, QueueError> {
        let next = next.filter(|o| !o.is_empty());
        let _one = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        let before = self.overrides(tenant);
        if before == next {
            return Ok(Ok(false));
        }
        if let Some(o) = &next {
            let len = self
                .overrides
                .read()
                .unwrap_or_else(|p| p.into_inner())
                .len();
            if before.is_none() && len >= MAX_OVERRIDES {
                return Ok(Err(SetError::TooMany));
            }
            if let Some((key, why)) = over(o, &self.defaults()).problem() {
                return Ok(Err(SetError::Invalid(format!("{key}: {why}"))));
            }
        }
        let json = next.and_then(|o| serde_json::to_vec(&o).ok());
        ankusa_queue::commit(store, vec![tenants::limits_op(tenant, json), audit()], true)?;
        self.replace(tenant, next);
        Ok(Ok(true))
    }

    /// Tenant `tenant` was erased: its own limits (deleted with its last write), bucket and
    /// refusals go.
    pub fn forget(&self, tenant: &str) {
        let _one = self.changes.lock().unwrap_or_else(|p| p.into_inner());
        self.replace(tenant, None);
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(tenant);
    }

    /// Tenant `tenant`'s own limits in memory are `next` from now; its next hook starts
    /// from a full bucket of the new size.
    fn replace(&self, tenant: &str, next: Option<Overrides>) {
        let mut map = self.overrides.write().unwrap_or_else(|p| p.into_inner());
        match next {
            Some(o) => {
                map.insert(tenant.to_owned(), o);
            }
            None => {
                map.remove(tenant);
            }
        }
        self.counted(&map);
        drop(map);
        self.buckets
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(tenant);
    }

    /// Publishes how many tenants have their own limits.
    fn counted(&self, map: &HashMap<String, Overrides>) {
        self.overridden
            .store(map.len(), std::sync::atomic::Ordering::Release);
        self.overrides_gauge.set(map.len() as i64);
    }

    /// Whether tenant `tenant` may send a hook now: takes a token, and reads its queued
    /// bytes (its ordinal, then one counter) when it has a limit on them. A tenant with no
    /// limit costs an atomic load and a copy of the defaults.
    pub fn admit(
        &self,
        store: &Store,
        tenant: &str,
        now_ms: u64,
    ) -> Result<Option<Refusal>, QueueError> {
        let limits = self.effective(tenant);
        if let (Some(rate), Some(burst)) = (limits.ingest_per_second, limits.burst()) {
            if let Some(wait) = self.take(tenant, rate, burst, Instant::now()) {
                self.record(tenant, now_ms);
                return Ok(Some(Refusal::Rate {
                    retry_after_s: wait.ceil().clamp(1.0, 86_400.0) as u32,
                }));
            }
        }
        if let Some(limit) = limits.queued_bytes {
            if let Some(ord) = tenants::ord(store, tenant)? {
                let queued = ankusa_queue::counters::read_field(store, ord, CounterField::Bytes)?;
                if queued >= 0 && queued as u64 >= limit {
                    self.record(tenant, now_ms);
                    return Ok(Some(Refusal::Backlog { queued, limit }));
                }
            }
        }
        Ok(None)
    }

    /// Takes a token from tenant `tenant`'s bucket; `Some(s)`: none left, one is back in
    /// `s` seconds.
    fn take(&self, tenant: &str, rate: f64, burst: f64, now: Instant) -> Option<f64> {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        let b = match buckets.get_mut(tenant) {
            Some(b) => {
                let refill = now.saturating_duration_since(b.at).as_secs_f64() * rate;
                b.tokens = (b.tokens + refill).min(burst);
                b.at = now;
                b
            }
            None => {
                if buckets.len() >= MAX_TRACKED {
                    // A full bucket is the same as none.
                    buckets.retain(|_, b| {
                        b.tokens + now.saturating_duration_since(b.at).as_secs_f64() * rate < burst
                    });
                }
                if buckets.len() >= MAX_TRACKED {
                    // Every tracked tenant is sending at its limit: the oldest goes.
                    if let Some(k) = buckets
                        .iter()
                        .min_by_key(|(_, b)| b.at)
                        .map(|(k, _)| k.clone())
                    {
                        buckets.remove(&k);
                    }
                }
                buckets.entry(tenant.to_owned()).or_insert(Bucket {
                    tokens: burst,
                    at: now,
                })
            }
        };
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            None
        } else {
            Some((1.0 - b.tokens) / rate)
        }
    }

    fn record(&self, tenant: &str, now_ms: u64) {
        let mut refused = self.refused.lock().unwrap_or_else(|p| p.into_inner());
        if !refused.contains_key(tenant) && refused.len() >= MAX_TRACKED {
            refused.retain(|_, r| now_ms.saturating_sub(r.last_ms) < OVER_QUOTA_WINDOW_MS);
            if refused.len() >= MAX_TRACKED {
                return;
            }
        }
        let r = refused.entry(tenant.to_owned()).or_default();
        r.count += 1;
        r.last_ms = now_ms;
    }

    /// Tenant `tenant`'s refusals since the node started (none: `None`).
    pub fn refused(&self, tenant: &str) -> Option<Refused> {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(tenant)
            .copied()
    }

    /// Tenants refused by a quota within [`OVER_QUOTA_WINDOW_MS`] of `now_ms`.
    pub fn over_quota(&self, now_ms: u64) -> usize {
        self.refused
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|r| now_ms.saturating_sub(r.last_ms) < OVER_QUOTA_WINDOW_MS)
            .count()
    }
}

/// What the archiver archives: the configuration's retention by source, and each tenant's
/// `archive_bytes` from its limits.
#[derive(Debug)]
pub struct ArchivePolicy {
    pub config: ankusa_config::Config,
    pub quotas: std::sync::Arc<Quotas>,
}

impl ankusa_queue::archive::Policy for ArchivePolicy {
    fn retention_ms(&self, source: &str) -> Option<u64> {
        self.config.retention_ms(source)
    }

    fn archive_limit(&self, tenant: &str) -> Option<u64> {
        self.quotas.effective(tenant).archive_bytes
    }
}

/// Why a change of a tenant's limits was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SetError {
    /// [`MAX_OVERRIDES`] tenants have their own limits already.
    TooMany,
    /// The limits the tenant would run under are out of range.
    Invalid(String),
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn quotas(d: TenantLimits) -> Quotas {
        Quotas::new(d, Default::default())
    }

    /// A bucket takes its burst at once, then one token per 1/rate seconds, and says how
    /// long until the next.
    #[test]
    fn a_bucket_takes_its_burst_then_its_rate() {
        let q = quotas(TenantLimits::default());
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(q.take("a", 2.0, 3.0, t0), None);
        }
        let wait = q.take("a", 2.0, 3.0, t0).unwrap();
        assert!((wait - 0.5).abs() < 1e-9, "{wait}");
        // Half a second later one token is back, and only one.
        let t1 = t0 + Duration::from_millis(500);
        assert_eq!(q.take("a", 2.0, 3.0, t1), None);
        assert!(q.take("a", 2.0, 3.0, t1).is_some());
        // Another tenant has its own bucket.
        assert_eq!(q.take("b", 2.0, 3.0, t1), None);
        // A long quiet spell refills to the burst, not beyond.
        let t2 = t1 + Duration::from_secs(60);
        for _ in 0..3 {
            assert_eq!(q.take("a", 2.0, 3.0, t2), None);
        }
        assert!(q.take("a", 2.0, 3.0, t2).is_some());
    }

    /// An absent key keeps the default, `null` lifts it, a value replaces it; a rate given
    /// without a burst takes its own default burst.
    #[test]
    fn overrides_apply_key_by_key_over_the_defaults() {
        let d = TenantLimits {
            ingest_per_second: Some(10.0),
            ingest_burst: Some(50),
            queued_bytes: Some(1 << 20),
            archive_bytes: None,
        };
        let o: Overrides = serde_json::from_str(r#"{"queued_bytes": null}"#).unwrap();
        assert_eq!(
            over(&o, &d),
            TenantLimits {
                queued_bytes: None,
                ..d
            }
        );
        let o: Overrides = serde_json::from_str(r#"{"ingest_per_second": 2}"#).unwrap();
        let e = over(&o, &d);
        assert_eq!(
            (e.ingest_per_second, e.ingest_burst, e.burst()),
            (Some(2.0), None, Some(2.0))
        );
        // Stored and read back as written: `null` stays `null`, absent stays absent.
        let o: Overrides =
            serde_json::from_str(r#"{"ingest_per_second": null, "queued_bytes": 5}"#).unwrap();
        let back: Overrides = serde_json::from_slice(&serde_json::to_vec(&o).unwrap()).unwrap();
        assert_eq!(back, o);
        assert!(serde_json::from_str::<Overrides>(r#"{"bytes": 5}"#).is_err());
    }

    /// The bucket map stays within its ceiling: full buckets go first.
    #[test]
    fn buckets_are_bounded() {
        let q = quotas(TenantLimits::default());
        let t0 = Instant::now();
        for i in 0..MAX_TRACKED + 10 {
            q.take(&format!("t{i}"), 1.0, 1.0, t0);
        }
        assert!(q.buckets.lock().unwrap().len() <= MAX_TRACKED);
    }
}
