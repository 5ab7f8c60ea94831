//! Paused tenants (`POST /v1/tenants/{t}/pause` and `…/resume`): held here for dispatch,
//! persisted as `m:paused:<ord>` (`ankusa_queue::tenants::paused`).
//!
//! While a tenant is paused, its rows stay due and counted and no attempt is made:
//! - a tick skips it without spending the round robin's budget, and takes out the active
//!   markers it meets (a paused backlog would otherwise fill the tick's marker budget
//!   in front of every other tenant's);
//! - the pipeline starts none of its fresh deliveries at commit (they are written due,
//!   and wait).
//!
//! A resume first marks the tenant resuming (skipped, its markers left alone), puts back a
//! marker for every second its due rows are in, then ends the pause in the store and here.
//! A crash on the way leaves it paused (its key still there); the boot's marker repair
//! and the next resume make it whole.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::RwLock;

use ankusa_keyspace::{AtMs, TenantOrd};

/// A tenant's hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Hold {
    /// Paused at this time: skipped, its markers taken out.
    Paused(AtMs),
    /// Being resumed: skipped, its markers being put back.
    Resuming,
    /// Being erased since this time (`DELETE /v1/tenants/{t}`): skipped, its markers taken
    /// out; neither a pause nor a resume changes it.
    Erasing(AtMs),
}

/// The paused tenants of this node.
#[derive(Debug, Default)]
pub struct Paused {
    holds: RwLock<HashMap<TenantOrd, Hold>>,
    /// `holds.len()`, read without the lock: no tenant is paused on most nodes.
    count: AtomicUsize,
    /// Held by a pause or a resume while it writes: one change at a time.
    changes: std::sync::Mutex<()>,
    /// `ankusa_tenants_paused`.
    gauge: prometheus_client::metrics::gauge::Gauge,
    /// Told when a tenant is held (paused or erasing): the pull gateway revokes its leases.
    pub changed: tokio::sync::Notify,
}

impl Paused {
    /// No tenant paused yet, counted in `gauge`.
    pub fn counted(gauge: prometheus_client::metrics::gauge::Gauge) -> Paused {
        Paused {
            gauge,
            ..Paused::default()
        }
    }

    /// The store's paused tenants (after the boot migration: a format-2 store has none).
    pub fn load(
        &self,
        store: &ankusa_queue::engine::Store,
    ) -> Result<usize, ankusa_queue::QueueError> {
        let found = ankusa_queue::tenants::paused(store)?;
        let mut holds = self.write();
        holds.clear();
        holds.extend(found.into_iter().map(|(o, at)| (o, Hold::Paused(at))));
        self.publish(&holds);
        Ok(holds.len())
    }

    /// Tenant `ord`'s hold, if it has one.
    pub fn hold(&self, ord: TenantOrd) -> Option<Hold> {
        if self.count.load(Ordering::Acquire) == 0 {
            return None;
        }
        self.holds
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .get(&ord)
            .copied()
    }

    /// Tenant `ord` is held (paused, resuming or erasing): dispatch skips it.
    pub fn holds(&self, ord: TenantOrd) -> bool {
        self.hold(ord).is_some()
    }

    /// Held tenants (paused, resuming or erasing).
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Acquire)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// At most `limit` of the held tenants.
    pub fn ords(&self, limit: usize) -> Vec<TenantOrd> {
        if self.is_empty() {
            return Vec::new();
        }
        let holds = self.holds.read().unwrap_or_else(|p| p.into_inner());
        holds.keys().take(limit).copied().collect()
    }

    /// Sets (or, with `None`, ends) tenant `ord`'s hold.
    fn set(&self, ord: TenantOrd, hold: Option<Hold>) {
        let mut holds = self.write();
        match hold {
            Some(h) => {
                holds.insert(ord, h);
                self.changed.notify_one();
            }
            None => {
                holds.remove(&ord);
            }
        }
        self.publish(&holds);
    }

    /// Publishes how many holds there are; the gauge counts the paused (and resuming) ones.
    fn publish(&self, holds: &HashMap<TenantOrd, Hold>) {
        self.count.store(holds.len(), Ordering::Release);
        let paused = holds
            .values()
            .filter(|h| !matches!(h, Hold::Erasing(_)))
            .count();
        self.gauge.set(paused as i64);
    }

    /// Holds tenant `ord` for its erase (from `at`), whatever hold it had.
    pub fn hold_for_erase(&self, ord: TenantOrd, at: AtMs) {
        let _one = self.changing();
        self.set(ord, Some(Hold::Erasing(at)));
    }

    /// Tenant `ord`'s erase ended: it has no hold (its pause went with its rows).
    pub fn erased(&self, ord: TenantOrd) {
        let _one = self.changing();
        self.set(ord, None);
    }

    /// Paused tenants (resuming ones included; not those being erased).
    pub fn paused_len(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        self.holds
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .values()
            .filter(|h| !matches!(h, Hold::Erasing(_)))
            .count()
    }

    /// Pauses tenant `ord` at `at`: its key and the audit row `audit()` makes in one synced
    /// write. `false`: it was paused already (nothing written).
    pub fn pause(
        &self,
        store: &ankusa_queue::engine::Store,
        ord: TenantOrd,
        at: AtMs,
        audit: impl FnOnce() -> ankusa_queue::Change,
    ) -> Result<bool, ankusa_queue::QueueError> {
        let _one = self.changing();
        if self.holds(ord) {
            return Ok(false);
        }
        ankusa_queue::commit(
            store,
            vec![ankusa_queue::tenants::pause_op(ord, at), audit()],
            true,
        )?;
        self.set(ord, Some(Hold::Paused(at)));
        Ok(true)
    }

    /// Resumes tenant `ord`: resuming (skipped, its markers left alone), its markers put
    /// back, then its key deleted with the audit row `audit(markers)` makes. `None`: it
    /// was not paused. On an error it is paused as it was (its key is still there).
    pub fn resume(
        &self,
        store: &ankusa_queue::engine::Store,
        ord: TenantOrd,
        audit: impl FnOnce(u64) -> ankusa_queue::Change,
    ) -> Result<Option<u64>, ankusa_queue::QueueError> {
        let _one = self.changing();
        let Some(hold) = self.hold(ord).filter(|h| !matches!(h, Hold::Erasing(_))) else {
            return Ok(None);
        };
        self.set(ord, Some(Hold::Resuming));
        let resumed =
            ankusa_queue::deliveries::restore_tenant_markers(store, ord).and_then(|markers| {
                ankusa_queue::commit(
                    store,
                    vec![ankusa_queue::tenants::resume_op(ord), audit(markers)],
                    true,
                )?;
                Ok(markers)
            });
        self.set(ord, if resumed.is_ok() { None } else { Some(hold) });
        resumed.map(Some)
    }

    /// One pause or resume at a time (held across its store writes).
    fn changing(&self) -> std::sync::MutexGuard<'_, ()> {
        self.changes.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, HashMap<TenantOrd, Hold>> {
        self.holds.write().unwrap_or_else(|p| p.into_inner())
    }
}
