//! Leader election on a `coordination.k8s.io/v1` Lease, so two operator replicas never
//! reconcile at once.
//!
//! A replica takes the Lease when it is absent or its holder has not renewed it within
//! `lease_duration`, renews it every `renew_every`, and writes with the Lease's
//! `resourceVersion` so two replicas racing for an expired Lease cannot both win (the
//! loser gets a 409). A leader that fails to renew before its Lease expires stops: the
//! process exits and Kubernetes restarts it as a follower.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, PostParams};
use kube::Client;
use serde_json::json;

#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    pub lease_duration: Duration,
    pub renew_every: Duration,
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This replica holds the Lease.
    Leading,
    /// Another replica holds a live Lease.
    Following(String),
}

/// Try once to take or renew the Lease.
pub async fn try_acquire(client: &Client, s: &LeaseSettings) -> Result<Outcome, kube::Error> {
    let api: Api<Lease> = Api::namespaced(client.clone(), &s.namespace);
    let now = Timestamp::now();
    let secs = i32::try_from(s.lease_duration.as_secs()).unwrap_or(i32::MAX);
    match api.get_opt(&s.name).await? {
        None => {
            let lease: Lease = serde_json::from_value(json!({
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": { "name": s.name, "namespace": s.namespace },
                "spec": {
                    "holderIdentity": s.identity,
                    "leaseDurationSeconds": secs,
                    "acquireTime": MicroTime(now),
                    "renewTime": MicroTime(now),
                    "leaseTransitions": 0,
                },
            }))
            .map_err(kube::Error::SerdeError)?;
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Outcome::Leading),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Following(String::new())),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            let holder = spec.holder_identity.clone().unwrap_or_default();
            let renewed = spec.renew_time.as_ref().map(|t| t.0);
            let duration =
                SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(secs)));
            let expired = renewed.map(|r| r + duration < now).unwrap_or(true);
            if holder != s.identity && !expired && !holder.is_empty() {
                return Ok(Outcome::Following(holder));
            }
            if holder != s.identity {
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
                spec.holder_identity = Some(s.identity.clone());
            }
            spec.renew_time = Some(MicroTime(now));
            spec.lease_duration_seconds = Some(secs);
            // `replace` carries the resourceVersion we read: a concurrent writer makes it 409.
            match api.replace(&s.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(Outcome::Leading),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Following(holder)),
                Err(e) => Err(e),
            }
        }
    }
}

/// Wait until this replica leads.
pub async fn acquire(client: &Client, s: &LeaseSettings) {
    loop {
        match try_acquire(client, s).await {
            Ok(Outcome::Leading) => {
                tracing::info!(lease = %s.name, identity = %s.identity, "leading");
                return;
            }
            Ok(Outcome::Following(holder)) => {
                tracing::debug!(lease = %s.name, %holder, "following")
            }
            Err(e) => tracing::warn!(lease = %s.name, error = %e, "lease attempt failed"),
        }
        tokio::time::sleep(s.renew_every).await;
    }
}

/// Renew until a renewal fails for longer than the lease lasts; then return (the caller
/// stops reconciling).
pub async fn keep(client: &Client, s: &LeaseSettings) {
    let mut last_ok = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(s.renew_every).await;
        match try_acquire(client, s).await {
            Ok(Outcome::Leading) => last_ok = tokio::time::Instant::now(),
            Ok(Outcome::Following(holder)) => {
                tracing::error!(lease = %s.name, %holder, "lost the lease");
                return;
            }
            Err(e) => {
                tracing::warn!(lease = %s.name, error = %e, "lease renewal failed");
                if last_ok.elapsed() >= s.lease_duration {
                    tracing::error!(lease = %s.name, "lease expired without renewal");
                    return;
                }
            }
        }
    }
}
