//! Erasing a tenant for good: `DELETE /v1/tenants/{t}?confirm={t}` (admin scope).
//!
//! The call marks the tenant erasing (`m:erasing:<ord>` with its `tenant.erase` audit row,
//! one synced write) and answers 202; the node's eraser task then removes every key of it
//! in synced chunks ([`ankusa_queue::erase`]) and ends with one write that leaves its
//! ordinal as a tombstone, with a `tenant.erased` audit row. While it runs the tenant's
//! hooks are refused (410 `tenant_erasing`) and no delivery of it is attempted; a restart
//! resumes it from the store. Once it ends, the tenant id is new: a later hook makes it
//! again, with a new ordinal.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use serde::Deserialize;

use super::api::{admin_only, blocking, caller, Api, ApiError};
use ankusa_api::admin::EraseState;
use ankusa_api_macros::answers;
use ankusa_keyspace::{AtMs, TenantOrd};
use ankusa_queue::erase::{self, Cursor, Step};
use ankusa_queue::tenants::Erasing;
use ankusa_store::Store;

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

    /// When tenant `ord`'s erase began, if one runs.
    pub fn since(&self, ord: TenantOrd) -> Option<AtMs> {
        self.lock().get(&ord).map(|e| e.since)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<TenantOrd, Erase>> {
        self.erases.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Runs the node's erases until `stop`: a chunk of each in turn, resting while every one
/// waits on deliveries in flight or none runs.
pub fn spawn(
    api: Arc<Api>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let ords: Vec<TenantOrd> = api.eraser.lock().keys().copied().collect();
            let (mut busy, mut failed) = (false, false);
            for ord in ords {
                let a = api.clone();
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
                _ = api.eraser.wake.notified(), if !failed => {}
                _ = tokio::time::sleep(std::time::Duration::from_millis(rest)) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    })
}

/// One step of tenant `ord`'s erase, and its last write once nothing is left. `true` if it
/// did something (step again at once).
fn advance(api: &Api, ord: TenantOrd) -> Result<bool, ankusa_queue::QueueError> {
    let Some(mut e) = api.eraser.lock().get(&ord).cloned() else {
        return Ok(false);
    };
    let step = erase::step(&api.store, ord, &e.tenant, &mut e.cursor)?;
    let worked = match step {
        Step::Worked { part, removed } => {
            tracing::debug!(tenant = %e.tenant, part, removed, "erase step");
            e.removed += removed;
            true
        }
        Step::Waiting { .. } => false,
        Step::Clean => {
            // The counters are checked first: an erase that cannot end writes nothing.
            let mut ops = erase::finish_ops(&api.store, ord, &e.tenant)?;
            // Every row is deleted; before the erase says it is done, the deleted values
            // leave the store's files too (write-ahead logs, tables, blob files). A crash
            // here resumes at this step and scrubs again.
            let started = std::time::Instant::now();
            api.store.scrub()?;
            tracing::info!(tenant = %e.tenant, ms = started.elapsed().as_millis() as u64, "erased bytes scrubbed from the store's files");
            forget_quarantined(api, &e.tenant)?;
            ops.push(api.audit.op(
                "eraser",
                "tenant.erased",
                Some(&e.tenant),
                serde_json::json!({ "ord": ord.0, "since_ms": e.since.0, "removed": e.removed }),
            ));
            api.store.write(ops, true)?;
            // Counted ended before the tenant goes from the set: a hook the writer does not
            // refuse finds its ordinal cache forgotten ([`Erasing`]).
            api.eraser.erasing.end(&e.tenant);
            api.paused.erased(ord);
            api.quotas.forget(&e.tenant);
            api.eraser.lock().remove(&ord);
            tracing::info!(tenant = %e.tenant, ord = ord.0, removed = e.removed, "tenant erased");
            return Ok(true);
        }
    };
    api.eraser.lock().insert(ord, e);
    Ok(worked)
}

/// The quarantined requests of the sources whose tenant is fixed to `tenant` (they carry
/// no ordinal): deleted with the erase's last steps, so one quarantined while it ran goes
/// too.
fn forget_quarantined(api: &Api, tenant: &str) -> Result<(), ankusa_queue::QueueError> {
    let config = api.config.load();
    let fixed: Vec<String> = config
        .sources
        .iter()
        .filter(|s| super::sources::source_tenant(&config, &s.id).as_deref() == Some(tenant))
        .map(|s| s.id.clone())
        .collect();
    if fixed.is_empty() {
        return Ok(());
    }
    let audit = api.audit.op(
        "eraser",
        "quarantine.delete",
        Some(tenant),
        serde_json::json!({ "erase": true, "sources": fixed }),
    );
    crate::ingest::quarantine::delete(
        &api.store,
        api.quarantine.as_deref(),
        |e| fixed.contains(&e.source),
        audit,
    )?;
    Ok(())
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EraseQuery {
    /// The tenant id again: an erase cannot be undone.
    confirm: Option<String>,
}

/// `DELETE /v1/tenants/{t}?confirm={t}`: erase the tenant for good (admin scope). Every
/// key of it goes — due, inflight (once their attempts end), dead, its hooks, hook log,
/// archive, dedupe keys, quarantined requests of sources fixed to it, counters — in synced
/// chunks; its ordinal stays as a tombstone. 202 while it runs; the tenant is 404 once it
/// ended.
#[answers]
#[utoipa::path(
    delete,
    path = "/v1/tenants/{t}",
    tag = "admin",
    params(("t" = String, Path, description = "A tenant id"), EraseQuery),
    responses(
        (status = 202, description = "The erase runs (or ran already: changed 0)"),
        (status = 400, description = "`confirm` is not the tenant id", body = ankusa_api::error::ErrorBody),
        crate::http::AuthErrors,
        crate::http::Forbidden,
        crate::http::NotFound,
    ),
    security(("bearer" = []))
)]
pub async fn erase(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(t): Path<String>,
    Query(q): Query<EraseQuery>,
) -> Result<(StatusCode, Json<EraseState>), ApiError> {
    let c = caller(&api, &headers)?;
    admin_only(&c)?;
    if q.confirm.as_deref() != Some(t.as_str()) {
        return Err(ApiError::BadRequest(
            "an erase cannot be undone: pass the tenant id again as ?confirm=".into(),
        ));
    }
    let a = api.clone();
    blocking(move || {
        let Some(ord) = ankusa_queue::tenants::ord(&a.store, &t)? else {
            // A node that never held the tenant may still hold limits set for its id on
            // every node of the Relay: they go, and the tenant is not here.
            if a.quotas.overrides(&t).is_some() {
                // A clear is never refused (no ceiling, nothing to check).
                let _cleared = a.quotas.set(&a.store, &t, None, || {
                    a.audit.op(
                        &c.name,
                        "tenant.limits.clear",
                        Some(&t),
                        serde_json::json!({ "erase": true }),
                    )
                })?;
                a.quotas.forget(&t);
            }
            return Err(ApiError::NotFound("tenant"));
        };
        let _one = a.eraser.begins.lock().unwrap_or_else(|p| p.into_inner());
        let (since, changed) = match a.eraser.since(ord) {
            Some(since) => (since, 0),
            None => {
                let since = AtMs(ankusa_keyspace::now_ms());
                a.store.write(
                    vec![
                        ankusa_queue::tenants::erase_begin_op(ord, since),
                        a.audit.op(
                            &c.name,
                            "tenant.erase",
                            Some(&t),
                            serde_json::json!({ "ord": ord.0 }),
                        ),
                    ],
                    true,
                )?;
                a.eraser.track(ord, t.clone(), since, &a.paused);
                (since, 1)
            }
        };
        Ok((
            StatusCode::ACCEPTED,
            Json(EraseState {
                tenant: t,
                erasing: true,
                since_ms: since.0,
                changed,
                unavailable: Vec::new(),
            }),
        ))
    })
    .await
}
