//! Deliveries in flight per tenant (`dispatch.tenant_max_inflight`) and the tenants'
//! round-robin weights (`dispatch.tenant_weights`).

use std::collections::HashMap;
use std::sync::Arc;

use ankusa_keyspace::TenantOrd;
use ankusa_queue::engine::Store;
use ankusa_queue::QueueError;

/// The configured tenant weights (`dispatch.tenant_weights`), by ordinal once a tenant has
/// one (its first hook is committed): names not yet known are looked up again each tick.
#[derive(Debug, Clone, Default)]
pub struct Weights {
    pub(super) resolved: Arc<std::sync::Mutex<HashMap<TenantOrd, u32>>>,
    pub(super) unresolved: Arc<std::sync::Mutex<Vec<(String, u32)>>>,
}

impl Weights {
    pub fn new(by_name: std::collections::BTreeMap<String, u32>) -> Self {
        Weights {
            resolved: Default::default(),
            unresolved: Arc::new(std::sync::Mutex::new(by_name.into_iter().collect())),
        }
    }

    /// Ordinal → weight, for the tenants that have an ordinal.
    pub fn resolve(&self, store: &Store) -> Result<HashMap<TenantOrd, u32>, QueueError> {
        let mut unresolved = self.unresolved.lock().unwrap_or_else(|p| p.into_inner());
        let mut resolved = self.resolved.lock().unwrap_or_else(|p| p.into_inner());
        let mut still = Vec::new();
        for (name, w) in unresolved.drain(..) {
            match ankusa_queue::tenants::ord(store, &name)? {
                Some(ord) => {
                    resolved.insert(ord, w);
                }
                None => still.push((name, w)),
            }
        }
        *unresolved = still;
        Ok(resolved.clone())
    }
}

/// Deliveries in flight per tenant, capped (`dispatch.tenant_max_inflight`): a tenant's
/// backlog can hold at most its cap of the node's delivery slots.
#[derive(Debug, Clone)]
pub struct TenantSlots {
    pub(super) inner: Arc<SlotsInner>,
}

#[derive(Debug)]
pub(super) struct SlotsInner {
    pub(super) cap: usize,
    pub(super) held: std::sync::Mutex<HashMap<TenantOrd, usize>>,
    /// Signalled when a tenant's or a sink's slot is given back.
    pub(super) freed: tokio::sync::Notify,
}

/// One delivery's hold on its tenant's slots; given back when dropped.
#[derive(Debug)]
pub struct TenantSlot {
    pub(super) slots: TenantSlots,
    pub(super) ord: TenantOrd,
}

impl TenantSlots {
    pub fn new(cap: usize) -> Self {
        TenantSlots {
            inner: Arc::new(SlotsInner {
                cap,
                held: Default::default(),
                freed: tokio::sync::Notify::new(),
            }),
        }
    }

    pub(super) fn held_map(&self) -> std::sync::MutexGuard<'_, HashMap<TenantOrd, usize>> {
        self.inner.held.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The deliveries `ord` has in flight.
    pub fn held(&self, ord: TenantOrd) -> usize {
        self.held_map().get(&ord).copied().unwrap_or(0)
    }

    /// Whether `ord` holds fewer than its cap.
    pub fn has_room(&self, ord: TenantOrd) -> bool {
        self.held_map().get(&ord).copied().unwrap_or(0) < self.inner.cap
    }

    /// A slot of `ord`'s, unless it holds its cap.
    pub fn try_take(&self, ord: TenantOrd) -> Option<TenantSlot> {
        let mut held = self.held_map();
        let n = held.entry(ord).or_default();
        if *n >= self.inner.cap {
            if *n == 0 {
                held.remove(&ord);
            }
            return None;
        }
        *n += 1;
        Some(TenantSlot {
            slots: self.clone(),
            ord,
        })
    }

    /// The `n` tenants holding the most deliveries in flight.
    pub fn top(&self, n: usize) -> Vec<(TenantOrd, usize)> {
        let mut all: Vec<(TenantOrd, usize)> =
            self.held_map().iter().map(|(o, n)| (*o, *n)).collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        all.truncate(n);
        all
    }

    /// Tenants with deliveries in flight, and the most any one of them holds.
    pub fn usage(&self) -> (usize, usize) {
        let held = self.held_map();
        (held.len(), held.values().copied().max().unwrap_or(0))
    }

    /// A sink's slot was given back.
    pub fn notify_freed(&self) {
        self.inner.freed.notify_one();
    }

    /// Resolves once a slot is given back (at once if one was since the last wait).
    pub async fn freed(&self) {
        self.inner.freed.notified().await
    }
}

impl Drop for TenantSlot {
    fn drop(&mut self) {
        {
            let mut held = self.slots.held_map();
            if let Some(n) = held.get_mut(&self.ord) {
                *n -= 1;
                if *n == 0 {
                    held.remove(&self.ord);
                }
            }
        }
        self.slots.notify_freed();
    }
}
