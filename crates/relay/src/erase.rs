//! Erasing a tenant for good (`DELETE /v1/tenants/{t}?confirm={t}` begins it).
//!
//! A call marks the tenant erasing (`m:erasing:<ord>` with its `tenant.erase` audit row,
//! one synced write: [`Eraser::begin`]); the node's eraser task ([`spawn`]) then removes
//! every key of it in synced chunks ([`ankusa_queue::erase`]) and ends with one write that
//! leaves its ordinal as a tombstone, with a `tenant.erased` audit row. While it runs the
//! tenant's hooks are refused (410 `tenant_erasing`) and no delivery of it is attempted; a
//! restart resumes it from the store ([`Eraser::load`]). Once it ends, the tenant id is
//! new: a later hook makes it again, with a new ordinal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;

use ankusa_config::Config;
use ankusa_keyspace::{AtMs, TenantOrd};
use ankusa_queue::audit::Audit;
use ankusa_queue::engine::Store;
use ankusa_queue::erase::{self, Cursor, Step};
use ankusa_queue::tenants::Erasing;
use ankusa_queue::Change;

/// One tenant's erase on this node.
#[derive(Debug, Clone)]
struct Erase {
    tenant: String,
    since: AtMs,
    cursor: Cursor,
    /// Keys removed so far by this process.
    removed: u64,
}

/// The node's erases, and the set the writer refuses hooks from.
#[derive(Debug, Default)]
pub struct Eraser {
    pub erasing: Arc<Erasing>,
    erases: Mutex<BTreeMap<TenantOrd, Erase>>,
    wake: tokio::sync::Notify,
    /// Held by a call that begins an erase while it writes: one at a time.
    begins: Mutex<()>,
}

impl Eraser {
    /// The erases the store holds (at boot, before the writer takes hooks): each tenant
    /// held, its hooks refused. Returns how many.
    pub fn load(
        &self,
        store: &Store,
        paused: &crate::dispatch::paused::Paused,
    ) -> Result<usize, ankusa_queue::QueueError> {
        let found = ankusa_queue::tenants::erasing(store)?;
        for (ord, since) in &found {
            let tenant = ankusa_queue::tenants::name(store, *ord)?.unwrap_or_default();
            self.track(*ord, tenant, *since, paused);
        }
        Ok(found.len())
    }

    fn track(
        &self,
        ord: TenantOrd,
        tenant: String,
        since: AtMs,
        paused: &crate::dispatch::paused::Paused,
    ) {
        self.erasing.begin(&tenant);
        paused.hold_for_erase(ord, since);
        self.lock().insert(
            ord,
            Erase {
                tenant,
                since,
                cursor: Cursor::default(),
                removed: 0,
            },
        );
        self.wake.notify_one();
    }

    /// Begins tenant `ord`'s erase (`tenant` its id) unless one runs: marks it erasing with
    /// `audit` (its `tenant.erase` row) in one synced write, refuses its hooks and holds
    /// its deliveries. When it began, and whether this call began it. One call at a time.
    pub fn begin(
        &self,
        store: &Store,
        ord: TenantOrd,
        tenant: &str,
        audit: Change,
        paused: &crate::dispatch::paused::Paused,
    ) -> Result<(AtMs, bool), ankusa_queue::QueueError> {
        let _one = self.begins.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(since) = self.since(ord) {
            return Ok((since, false));
        }
        let since = AtMs(ankusa_keyspace::now_ms());
        ankusa_queue::commit(
            store,
            vec![ankusa_queue::tenants::erase_begin_op(ord, since), audit],
            true,
        )?;
        self.track(ord, tenant.to_owned(), since, paused);
        Ok((since, true))
    }

    /// When tenant `ord`'s erase began, if one runs.
    pub fn since(&self, ord: TenantOrd) -> Option<AtMs> {
        self.lock().get(&ord).map(|e| e.since)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<TenantOrd, Erase>> {
        self.erases.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the node's erases touch besides the store's rows of the tenant.
#[derive(Clone)]
pub struct Deps {
    pub store: Arc<Store>,
    pub audit: Arc<Audit>,
    pub eraser: Arc<Eraser>,
    /// Its deliveries held while it runs, released once it ends.
    pub paused: Arc<crate::dispatch::paused::Paused>,
    /// Its own limits, forgotten once it ends.
    pub quotas: Arc<crate::ingest::quota::Quotas>,
    /// Its own endpoints, deleted by its last write.
    pub endpoints: Arc<crate::endpoints::Book>,
    /// The quarantined requests of the sources fixed to it.
    pub quarantine: Option<Arc<crate::ingest::quarantine::Quarantine>>,
    pub config: Arc<ArcSwap<Config>>,
}

/// Runs the node's erases until `stop`: a chunk of each in turn, resting while every one
/// waits on deliveries in flight or none runs.
pub fn spawn(d: Deps, mut stop: tokio::sync::watch::Receiver<bool>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let ords: Vec<TenantOrd> = d.eraser.lock().keys().copied().collect();
            let (mut busy, mut failed) = (false, false);
            for ord in ords {
                let a = d.clone();
                match tokio::task::spawn_blocking(move || advance(&a, ord)).await {
                    Ok(Ok(worked)) => busy |= worked,
                    Ok(Err(e)) => {
                        failed = true;
                        tracing::error!(error = %e, ord = ord.0, "erasing a tenant failed; trying again in 5 s")
                    }
                    Err(_) => {
                        failed = true;
                        tracing::error!(ord = ord.0, "an erase step panicked; trying again in 5 s")
                    }
                }
                if *stop.borrow() {
                    return;
                }
            }
            if busy && !failed {
                continue;
            }
            // Resting while deliveries in flight end; longer after a failure (a store that
            // fails its writes, a counter that does not add up), so it is not retried hot.
            let rest = if failed { 5_000 } else { 200 };
            tokio::select! {
                _ = d.eraser.wake.notified(), if !failed => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(rest)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

/// One step of tenant `ord`'s erase, and its last write once nothing is left. `true` if it
/// did something (step again at once).
fn advance(d: &Deps, ord: TenantOrd) -> Result<bool, ankusa_queue::QueueError> {
    let Some(mut e) = d.eraser.lock().get(&ord).cloned() else {
        return Ok(false);
    };
    let step = erase::step(&d.store, ord, &e.tenant, &mut e.cursor)?;
    let worked = match step {
        Step::Worked { part, removed } => {
            tracing::debug!(tenant = %e.tenant, part, removed, "erase step");
            e.removed += removed;
            true
        }
        Step::Waiting { .. } => false,
        Step::Clean => {
            // The counters are checked first: an erase that cannot end writes nothing.
            let mut ops = erase::finish_ops(&d.store, ord, &e.tenant)?;
            // Its endpoints (no new one is made while it is erasing).
            let endpoints = d.endpoints.erase_ops(&e.tenant)?;
            let endpoints_removed = endpoints.len();
            ops.extend(endpoints);
            // Every row is deleted; before the erase says it is done, the deleted values
            // leave the store's files too (write-ahead logs, tables, blob files). A crash
            // here resumes at this step and scrubs again.
            let started = std::time::Instant::now();
            d.store.scrub()?;
            tracing::info!(tenant = %e.tenant, ms = started.elapsed().as_millis() as u64, "erased bytes scrubbed from the store's files");
            forget_quarantined(d, &e.tenant)?;
            ops.push(d.audit.op(
                "eraser",
                "tenant.erased",
                Some(&e.tenant),
                serde_json::json!({ "ord": ord.0, "since_ms": e.since.0, "removed": e.removed }),
            ));
            ankusa_queue::commit(&d.store, ops, true)?;
            // Counted ended before the tenant goes from the set: a hook the writer does not
            // refuse finds its ordinal cache forgotten ([`Erasing`]).
            d.eraser.erasing.end(&e.tenant);
            d.paused.erased(ord);
            d.quotas.forget(&e.tenant);
            d.endpoints.erased(&e.tenant, endpoints_removed);
            d.eraser.lock().remove(&ord);
            tracing::info!(tenant = %e.tenant, ord = ord.0, removed = e.removed, "tenant erased");
            return Ok(true);
        }
    };
    d.eraser.lock().insert(ord, e);
    Ok(worked)
}

/// The quarantined requests of the sources whose tenant is fixed to `tenant` (they carry
/// no ordinal): deleted with the erase's last steps, so one quarantined while it ran goes
/// too.
fn forget_quarantined(d: &Deps, tenant: &str) -> Result<(), ankusa_queue::QueueError> {
    let config = d.config.load();
    let fixed: Vec<String> = config
        .sources
        .iter()
        .filter(|s| crate::ingest::source_tenant(&config, &s.id).as_deref() == Some(tenant))
        .map(|s| s.id.clone())
        .collect();
    if fixed.is_empty() {
        return Ok(());
    }
    let audit = d.audit.op(
        "eraser",
        "quarantine.delete",
        Some(tenant),
        serde_json::json!({ "erase": true, "sources": fixed }),
    );
    crate::ingest::quarantine::delete(
        &d.store,
        d.quarantine.as_deref(),
        |e| fixed.contains(&e.source),
        audit,
    )?;
    Ok(())
}
