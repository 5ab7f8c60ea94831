//! Tenants' own endpoints (`/v1/tenants/{t}/endpoints`): HTTP sinks a tenant creates,
//! changes, rotates the secret of and deletes through the API, stored in the node's store
//! (`m:endpoint:<tenant>\0<id>`, [`ankusa_queue::endpoints`]) and delivered to by the
//! routes that say `endpoints: true`.
//!
//! - **Bounded**: `endpoints.max_per_tenant` per tenant and `endpoints.max_total` on the
//!   node (409 `too_many_endpoints` past either); the lists read are held for
//!   `endpoints.cache_tenants` tenants, the least recently used going first
//!   (`ankusa_endpoints{state="stored"|"cached_tenants"}`).
//! - **One write each**: a change and its audit row in one synced write; the cached list
//!   of its tenant goes with it, so the next hook reads the change.
//! - **Secrets**: 24 random bytes, `whsec_` and base64 (Standard Webhooks' form), shown in
//!   the create's and the rotation's answers only. A rotation keeps the secret it replaces
//!   signing for an overlap: each delivery carries a signature of each.
//! - **Addresses**: an `http(s)` URL without credentials; an address written in it that is
//!   private, loopback, link-local… is refused at once unless `endpoints.allow_private`
//!   ([`crate::http::guard`]); a name is checked when a delivery connects.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use base64::Engine;
use serde::{Deserialize, Serialize};

use ankusa_api::endpoints as wire;
use ankusa_config::{EndpointsConfig, Filter, HookFacts, ENDPOINT_ID_PREFIX};
use ankusa_queue::engine::Store;
use ankusa_queue::{Change, QueueError};

/// The `sink` label of every tenant endpoint's series (its deliveries, the hooks a filter
/// left out): one for them all, where a label each would make a series of every URL a
/// tenant saves. No configured sink's id starts with `@`.
pub const SERIES: &str = "@endpoints";

/// The longest URL an endpoint may have.
pub const MAX_URL: usize = 2_048;
/// The longest description.
pub const MAX_DESCRIPTION: usize = 256;

/// A secret, as stored: its `whsec_` text, when it was made and, once rotated, until when
/// it still signs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredSecret {
    pub secret: String,
    pub created_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_ms: Option<u64>,
}

/// An endpoint as stored (JSON, version 1).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub v: u8,
    pub id: String,
    pub url: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub filter: Option<Filter>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_per_second: Option<u32>,
    pub enabled: bool,
    /// Newest first.
    pub secrets: Vec<StoredSecret>,
    pub created_ms: u64,
    pub updated_ms: u64,
}

impl Record {
    /// As the API shows it: no secret's value.
    pub fn view(&self, tenant: &str) -> wire::Endpoint {
        wire::Endpoint {
            id: self.id.clone(),
            tenant: tenant.to_owned(),
            url: self.url.clone(),
            description: self.description.clone(),
            filter: self
                .filter
                .as_ref()
                .and_then(|f| serde_json::to_value(f).ok()),
            rate_per_second: self.rate_per_second,
            enabled: self.enabled,
            secrets: self
                .secrets
                .iter()
                .map(|s| wire::SecretInfo {
                    created_ms: s.created_ms,
                    expires_ms: s.expires_ms,
                })
                .collect(),
            created_ms: self.created_ms,
            updated_ms: self.updated_ms,
        }
    }

    /// The keys that sign a delivery at `now_ms`, newest first.
    pub fn keys_at(&self, now_ms: u64) -> Vec<Vec<u8>> {
        self.secrets
            .iter()
            .filter(|s| s.expires_ms.is_none_or(|e| now_ms < e))
            .map(|s| ankusa_verify::standard_webhooks_key(s.secret.as_bytes()))
            .collect()
    }

    /// When the set of keys that sign changes next (a rotated secret's end), if it does.
    pub fn keys_change_at(&self, now_ms: u64) -> Option<u64> {
        self.secrets
            .iter()
            .filter_map(|s| s.expires_ms)
            .filter(|e| *e > now_ms)
            .min()
    }

    /// Whether its filter takes the hook `facts` describes (none: every hook). Whether it
    /// is enabled is its caller's to ask first (a disabled one is not "filtered out").
    pub fn takes(&self, facts: &dyn HookFacts) -> bool {
        self.filter.as_ref().is_none_or(|f| f.matches(facts))
    }
}

/// Why a change was not made.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 400, with what is wrong.
    Invalid(String),
    /// 404.
    NotFound,
    /// 409 `too_many_endpoints`, with what is full.
    TooMany(String),
}

/// A tenant's endpoints, in id order.
pub type List = Arc<[Arc<Record>]>;

/// Every tenant's endpoints on this node: the store's, the lists read lately, the bounds.
pub struct Book {
    store: Arc<Store>,
    config: EndpointsConfig,
    cache: Mutex<hashlink::LruCache<String, List>>,
    /// Endpoints stored on this node.
    total: AtomicUsize,
    /// Counts the changes: a list read before one is not cached after it.
    changes: AtomicU64,
    /// One change at a time (the bounds are checked against what is stored).
    writes: Mutex<()>,
    /// `ankusa_endpoints` and `ankusa_endpoint_cache_tenants`.
    stored_gauge: prometheus_client::metrics::gauge::Gauge,
    cached_gauge: prometheus_client::metrics::gauge::Gauge,
}

impl std::fmt::Debug for Book {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Book")
            .field("total", &self.total())
            .field("cached_tenants", &self.cached_tenants())
            .finish()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A new endpoint id: `ep_` and 16 hex digits.
fn new_id() -> String {
    format!("{ENDPOINT_ID_PREFIX}{:016x}", rand::random::<u64>())
}

/// A new secret: 24 random bytes as `whsec_<base64>`.
fn new_secret() -> String {
    let key: [u8; 24] = rand::random();
    format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    )
}

impl Book {
    /// The book of `store`, empty until [`Book::load`] counts what the store holds.
    pub fn new(
        store: Arc<Store>,
        config: &EndpointsConfig,
        metrics: &crate::metrics::Metrics,
    ) -> Book {
        Book {
            store,
            config: config.clone(),
            cache: Mutex::new(hashlink::LruCache::new(config.cache_tenants.max(1))),
            total: AtomicUsize::new(0),
            changes: AtomicU64::new(0),
            writes: Mutex::new(()),
            stored_gauge: metrics.endpoints.clone(),
            cached_gauge: metrics.endpoint_cache_tenants.clone(),
        }
    }

    /// Sets the stored count (and its gauge) to what `f` makes of it. Called under
    /// `writes`: the one writer of the count at a time.
    fn count(&self, f: impl FnOnce(usize) -> usize) {
        let next = f(self.total.load(Ordering::Relaxed));
        self.total.store(next, Ordering::Relaxed);
        self.stored_gauge.set(next as i64);
    }

    /// Counts the endpoints the store holds (at boot, once its format is current).
    pub fn load(&self) -> Result<usize, QueueError> {
        let _one = lock(&self.writes);
        let total = ankusa_queue::endpoints::all(&self.store)?.len();
        self.count(|_| total);
        Ok(total)
    }

    /// Reads the store again (a handoff moved endpoints in or out of it): the count, and
    /// every list in memory dropped.
    pub fn reload(&self) {
        if let Err(e) = self.load() {
            tracing::error!(error = %e, "endpoints: counting them after a handoff failed");
        }
        let mut cache = lock(&self.cache);
        self.changes.fetch_add(1, Ordering::AcqRel);
        cache.clear();
        self.cached_gauge.set(0);
    }

    pub fn config(&self) -> &EndpointsConfig {
        &self.config
    }

    /// Endpoints stored on this node.
    pub fn total(&self) -> usize {
        self.total.load(Ordering::Relaxed)
    }

    /// Tenants whose lists are held in memory.
    pub fn cached_tenants(&self) -> usize {
        lock(&self.cache).len()
    }

    /// Tenant `tenant`'s endpoints: from memory, or read and kept.
    pub fn of(&self, tenant: &str) -> Result<List, QueueError> {
        if self.total() == 0 {
            return Ok(Arc::from(Vec::new()));
        }
        if let Some(l) = lock(&self.cache).get(tenant) {
            return Ok(l.clone());
        }
        let before = self.changes.load(Ordering::Acquire);
        let list = self.read(tenant)?;
        let mut cache = lock(&self.cache);
        // A change since the read may have written what it did not see.
        if self.changes.load(Ordering::Acquire) == before {
            cache.insert(tenant.to_owned(), list.clone());
            self.cached_gauge.set(cache.len() as i64);
        }
        Ok(list)
    }

    fn read(&self, tenant: &str) -> Result<List, QueueError> {
        let mut out = Vec::new();
        for (id, v) in ankusa_queue::endpoints::of_tenant(&self.store, tenant)? {
            let r: Record = serde_json::from_slice(&v).map_err(|e| {
                QueueError::corrupt_at(
                    ankusa_keyspace::Family::Meta,
                    &ankusa_queue::endpoints::key(tenant, &id),
                    format!("an endpoint that does not decode: {e}"),
                )
            })?;
            out.push(Arc::new(r));
        }
        Ok(Arc::from(out))
    }

    /// Endpoint `id` of `tenant`.
    pub fn get(&self, tenant: &str, id: &str) -> Result<Option<Arc<Record>>, QueueError> {
        Ok(self.of(tenant)?.iter().find(|r| r.id == id).cloned())
    }

    /// Commits `record` (or, `None`, the delete of `id`) with `audit`, synced; the
    /// tenant's list in memory goes.
    fn write(
        &self,
        tenant: &str,
        id: &str,
        record: Option<&Record>,
        audit: Change,
    ) -> Result<(), QueueError> {
        let bytes = record.map(|r| serde_json::to_vec(r).unwrap_or_default());
        let op = ankusa_queue::endpoints::op(tenant, id, bytes);
        ankusa_queue::commit(&self.store, vec![op, audit], true)?;
        self.forget(tenant);
        Ok(())
    }

    /// Tenant `tenant`'s list in memory goes (a change to it was written).
    fn forget(&self, tenant: &str) {
        let mut cache = lock(&self.cache);
        self.changes.fetch_add(1, Ordering::AcqRel);
        cache.remove(tenant);
        self.cached_gauge.set(cache.len() as i64);
    }

    /// Creates an endpoint of `tenant`: the record and its secret (shown this once).
    pub fn create(
        &self,
        tenant: &str,
        req: wire::EndpointCreate,
        audit: impl FnOnce(&Record) -> Change,
    ) -> Result<Result<(Arc<Record>, String), Refusal>, QueueError> {
        let _one = lock(&self.writes);
        let url = match self.checked_url(&req.url) {
            Ok(u) => u,
            Err(why) => return Ok(Err(Refusal::Invalid(why))),
        };
        let filter = match req.filter.map(checked_filter).transpose() {
            Ok(f) => f,
            Err(why) => return Ok(Err(Refusal::Invalid(why))),
        };
        if let Err(why) = checked_text(req.description.as_deref(), req.rate_per_second) {
            return Ok(Err(Refusal::Invalid(why)));
        }
        let max = self.config.max_per_tenant;
        if self.of(tenant)?.len() >= max {
            return Ok(Err(Refusal::TooMany(format!(
                "the tenant has {max} endpoints (endpoints.max_per_tenant)"
            ))));
        }
        let max = self.config.max_total;
        if self.total() >= max {
            return Ok(Err(Refusal::TooMany(format!(
                "this node stores {max} endpoints (endpoints.max_total)"
            ))));
        }
        let now = ankusa_keyspace::now_ms();
        let secret = new_secret();
        let r = Record {
            v: 1,
            id: new_id(),
            url,
            description: req.description,
            filter,
            rate_per_second: req.rate_per_second,
            enabled: req.enabled.unwrap_or(true),
            secrets: vec![StoredSecret {
                secret: secret.clone(),
                created_ms: now,
                expires_ms: None,
            }],
            created_ms: now,
            updated_ms: now,
        };
        self.write(tenant, &r.id, Some(&r), audit(&r))?;
        self.count(|t| t + 1);
        Ok(Ok((Arc::new(r), secret)))
    }

    /// Changes the keys `patch` holds of endpoint `id` of `tenant`.
    pub fn update(
        &self,
        tenant: &str,
        id: &str,
        patch: wire::EndpointPatch,
        audit: impl FnOnce(&Record) -> Change,
    ) -> Result<Result<Arc<Record>, Refusal>, QueueError> {
        let _one = lock(&self.writes);
        let Some(before) = self.get(tenant, id)? else {
            return Ok(Err(Refusal::NotFound));
        };
        let mut r = (*before).clone();
        let checked = (|| -> Result<(), String> {
            if let Some(u) = &patch.url {
                r.url = self.checked_url(u)?;
            }
            if let Some(d) = patch.description {
                r.description = d;
            }
            if let Some(f) = patch.filter {
                r.filter = f.map(checked_filter).transpose()?;
            }
            if let Some(rate) = patch.rate_per_second {
                r.rate_per_second = rate;
            }
            if let Some(e) = patch.enabled {
                r.enabled = e;
            }
            checked_text(r.description.as_deref(), r.rate_per_second)
        })();
        if let Err(why) = checked {
            return Ok(Err(Refusal::Invalid(why)));
        }
        if r == *before {
            return Ok(Ok(before));
        }
        r.updated_ms = ankusa_keyspace::now_ms().max(before.updated_ms + 1);
        self.write(tenant, id, Some(&r), audit(&r))?;
        Ok(Ok(Arc::new(r)))
    }

    /// A new secret for endpoint `id` of `tenant`; the current one signs beside it for
    /// `overlap_s` more seconds (absent: `endpoints.rotation_overlap_s`), and one rotated
    /// before goes.
    pub fn rotate(
        &self,
        tenant: &str,
        id: &str,
        overlap_s: Option<u64>,
        audit: impl FnOnce(&Record) -> Change,
    ) -> Result<Result<(Arc<Record>, String), Refusal>, QueueError> {
        let _one = lock(&self.writes);
        let overlap = overlap_s.unwrap_or(self.config.rotation_overlap_s);
        if overlap > ankusa_config::MAX_ROTATION_OVERLAP_S {
            return Ok(Err(Refusal::Invalid(format!(
                "overlap_s: {overlap} is over {}",
                ankusa_config::MAX_ROTATION_OVERLAP_S
            ))));
        }
        let Some(before) = self.get(tenant, id)? else {
            return Ok(Err(Refusal::NotFound));
        };
        let now = ankusa_keyspace::now_ms().max(before.updated_ms + 1);
        let secret = new_secret();
        let mut r = (*before).clone();
        let mut secrets = vec![StoredSecret {
            secret: secret.clone(),
            created_ms: now,
            expires_ms: None,
        }];
        // The current one keeps signing for the overlap; older ones end now.
        secrets.extend(
            r.secrets
                .iter()
                .find(|s| s.expires_ms.is_none())
                .filter(|_| overlap > 0)
                .map(|s| StoredSecret {
                    expires_ms: Some(now + overlap * 1_000),
                    ..s.clone()
                }),
        );
        r.secrets = secrets;
        r.updated_ms = now;
        self.write(tenant, id, Some(&r), audit(&r))?;
        Ok(Ok((Arc::new(r), secret)))
    }

    /// Deletes endpoint `id` of `tenant`: its deliveries still queued dead-letter when their
    /// turn comes (replayable once an endpoint of that id is back, which never happens: ids
    /// are not reused).
    pub fn delete(
        &self,
        tenant: &str,
        id: &str,
        audit: impl FnOnce(&Record) -> Change,
    ) -> Result<Result<Arc<Record>, Refusal>, QueueError> {
        let _one = lock(&self.writes);
        let Some(before) = self.get(tenant, id)? else {
            return Ok(Err(Refusal::NotFound));
        };
        self.write(tenant, id, None, audit(&before))?;
        self.count(|t| t.saturating_sub(1));
        Ok(Ok(before))
    }

    /// The changes that delete every endpoint of `tenant` (its erase's last write).
    pub fn erase_ops(&self, tenant: &str) -> Result<Vec<Change>, QueueError> {
        ankusa_queue::endpoints::erase_ops(&self.store, tenant)
    }

    /// Tenant `tenant`'s endpoints were deleted by a write of the caller's (its erase).
    pub fn erased(&self, tenant: &str, removed: usize) {
        let _one = lock(&self.writes);
        self.forget(tenant);
        self.count(|t| t.saturating_sub(removed));
    }

    /// Deletes every endpoint of a tenant this node holds no row of (an erase here), with
    /// `audit`; how many went.
    pub fn erase_alone(
        &self,
        tenant: &str,
        audit: impl FnOnce() -> Change,
    ) -> Result<usize, QueueError> {
        let ops = self.erase_ops(tenant)?;
        let n = ops.len();
        if n > 0 {
            let mut ops = ops;
            ops.push(audit());
            ankusa_queue::commit(&self.store, ops, true)?;
            self.erased(tenant, n);
        }
        Ok(n)
    }

    /// `url` as an endpoint may have it.
    fn checked_url(&self, url: &str) -> Result<String, String> {
        checked_url(url, self.config.allow_private)
    }
}

/// `url` as an endpoint may have it: `http(s)://host[:port][/path]`, no credentials, at
/// most [`MAX_URL`] bytes; an address in it refused unless `allow_private`.
pub fn checked_url(url: &str, allow_private: bool) -> Result<String, String> {
    if url.len() > MAX_URL {
        return Err(format!("url: longer than {MAX_URL} bytes"));
    }
    let uri: hyper::Uri = url.parse().map_err(|e| format!("url: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err("url: must be http:// or https://".into()),
    }
    let Some(auth) = uri.authority() else {
        return Err("url: has no host".into());
    };
    if auth.as_str().contains('@') {
        return Err("url: must not hold a user name or password".into());
    }
    let host = auth.host().trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err("url: has no host".into());
    }
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        if let Some(why) = crate::http::guard::refused(ip).filter(|_| !allow_private) {
            return Err(format!(
                "url: {ip} is a {why} address (endpoints.allow_private is off)"
            ));
        }
    }
    Ok(url.to_owned())
}

/// A filter as the API sent it, checked as the configuration's are.
fn checked_filter(v: serde_json::Value) -> Result<Filter, String> {
    let f: Filter = serde_json::from_value(v).map_err(|e| format!("filter: {e}"))?;
    f.validate("filter").map_err(|e| e.to_string())?;
    Ok(f)
}

fn checked_text(description: Option<&str>, rate: Option<u32>) -> Result<(), String> {
    if description.is_some_and(|d| d.len() > MAX_DESCRIPTION) {
        return Err(format!("description: longer than {MAX_DESCRIPTION} bytes"));
    }
    if rate == Some(0) {
        return Err("rate_per_second: must be positive (null: no pace)".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_checked_and_inner_addresses_refused_unless_allowed() {
        for ok in [
            "https://hooks.example.com/in",
            "http://example.com:8080/a?b=c",
            "https://[2606:4700::1111]/x",
        ] {
            assert_eq!(checked_url(ok, false).as_deref(), Ok(ok));
        }
        for (bad, says) in [
            ("ftp://example.com/", "http:// or https://"),
            ("https://user:pw@example.com/", "user name or password"),
            ("/relative", "http:// or https://"),
            ("http://127.0.0.1:9/x", "loopback"),
            ("http://[::1]/x", "loopback"),
            ("http://169.254.169.254/latest/meta-data", "link-local"),
            ("http://10.0.0.8/", "private"),
        ] {
            let e = checked_url(bad, false).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        assert!(checked_url("http://127.0.0.1:9/x", true).is_ok());
        assert!(checked_url(&format!("https://a.example/{}", "x".repeat(MAX_URL)), true).is_err());
    }

    #[test]
    fn a_rotated_secret_signs_until_its_overlap_ends() {
        let r = Record {
            v: 1,
            id: "ep_1".into(),
            url: "https://example.com".into(),
            description: None,
            filter: None,
            rate_per_second: None,
            enabled: true,
            secrets: vec![
                StoredSecret {
                    secret: new_secret(),
                    created_ms: 10,
                    expires_ms: None,
                },
                StoredSecret {
                    secret: new_secret(),
                    created_ms: 1,
                    expires_ms: Some(100),
                },
            ],
            created_ms: 1,
            updated_ms: 10,
        };
        assert_eq!(r.keys_at(50).len(), 2);
        assert_eq!(r.keys_at(100).len(), 1);
        assert_eq!(r.keys_change_at(50), Some(100));
        assert_eq!(r.keys_change_at(100), None);
        let view = serde_json::to_string(&r.view("t")).unwrap();
        assert!(!view.contains("whsec_"), "{view}");
    }
}
