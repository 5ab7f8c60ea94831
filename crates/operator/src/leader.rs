//! Leader election on a `coordination.k8s.io/v1` Lease, so two operator replicas never
//! reconcile at once.
//!
//! The rules are client-go's, so clocks never have to agree between machines:
//! - A follower never reads the holder's `renewTime` against its own clock. It remembers
//!   the Lease's `resourceVersion` and when it, the follower, first saw it; the Lease has
//!   expired when that record has not changed for `leaseDurationSeconds` of the
//!   follower's own monotonic clock.
//! - Every write carries the `resourceVersion` it read, so two replicas racing for an
//!   expired Lease cannot both win (the loser gets a 409).
//! - Every API call has a deadline. A leader that has not renewed within `renew_deadline`
//!   (shorter than the lease) stops reconciling before any follower can take over.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use tokio::time::Instant;

#[derive(Debug, Clone)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a Lease that nobody renews stays held.
    pub lease_duration: Duration,
    /// A leader that has not renewed for this long stops (less than `lease_duration`).
    pub renew_deadline: Duration,
    /// How often the leader renews and a follower looks.
    pub renew_every: Duration,
}

impl LeaseSettings {
    /// client-go's defaults: a 15 s lease, renewed every 2 s, given up after 10 s.
    pub fn new(name: &str, namespace: &str, identity: &str) -> LeaseSettings {
        LeaseSettings {
            name: name.into(),
            namespace: namespace.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            renew_every: Duration::from_secs(2),
        }
    }
}

/// What one attempt found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// This replica holds the Lease.
    Leading,
    /// Another replica holds a live Lease.
    Following(String),
}

/// Why an attempt failed.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    #[error("Kubernetes API: {0}")]
    Kube(#[from] kube::Error),
    #[error("the API server did not answer within {0:?}")]
    Timeout(Duration),
}

/// One replica's view of the Lease.
pub struct Elector {
    client: Client,
    settings: LeaseSettings,
    /// The Lease's resourceVersion as last seen, and when this replica first saw it.
    observed: Option<(String, Instant)>,
    /// Told of every attempt, renewal and loss, for the pod's probes.
    health: Option<std::sync::Arc<crate::health::Health>>,
}

impl Elector {
    pub fn new(client: Client, settings: LeaseSettings) -> Elector {
        Elector {
            client,
            settings,
            observed: None,
            health: None,
        }
    }

    /// Reports attempts, renewals and the loss of the Lease to `health`.
    pub fn with_health(mut self, health: std::sync::Arc<crate::health::Health>) -> Elector {
        self.health = Some(health);
        self
    }

    fn report(&self, outcome: Option<&Outcome>) {
        if let Some(h) = &self.health {
            match outcome {
                Some(Outcome::Leading) => h.lease_renewed(),
                Some(Outcome::Following(_)) => {
                    h.lease_read();
                    h.lease_lost();
                }
                None => h.lease_attempted(),
            }
        }
    }

    /// Try once to take or renew the Lease; every call to the API server has a deadline
    /// of `renew_deadline`.
    pub async fn try_acquire(&mut self) -> Result<Outcome, LeaseError> {
        let deadline = self.settings.renew_deadline;
        let out = match tokio::time::timeout(deadline, self.attempt()).await {
            Ok(r) => r,
            Err(_) => Err(LeaseError::Timeout(deadline)),
        };
        self.report(out.as_ref().ok());
        out
    }

    async fn attempt(&mut self) -> Result<Outcome, LeaseError> {
        let s = self.settings.clone();
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &s.namespace);
        let now = MicroTime(Timestamp::now());
        let secs = i32::try_from(s.lease_duration.as_secs()).unwrap_or(i32::MAX);
        let Some(mut lease) = api.get_opt(&s.name).await? else {
            let lease = Lease {
                metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                    name: Some(s.name.clone()),
                    namespace: Some(s.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(k8s_openapi::api::coordination::v1::LeaseSpec {
                    holder_identity: Some(s.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(now.clone()),
                    renew_time: Some(now.clone()),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            return match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(Outcome::Leading),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Following(String::new())),
                Err(e) => Err(e.into()),
            };
        };
        let version = lease.resource_version().unwrap_or_default();
        let seen_at = match &self.observed {
            Some((v, at)) if *v == version => *at,
            _ => {
                let at = Instant::now();
                self.observed = Some((version, at));
                at
            }
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let held_for = spec
            .lease_duration_seconds
            .map(|d| Duration::from_secs(u64::try_from(d).unwrap_or(0)))
            .unwrap_or(s.lease_duration);
        let expired = seen_at.elapsed() >= held_for;
        if holder != s.identity && !holder.is_empty() && !expired {
            return Ok(Outcome::Following(holder));
        }
        if holder != s.identity {
            spec.acquire_time = Some(now.clone());
            spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            spec.holder_identity = Some(s.identity.clone());
        }
        spec.renew_time = Some(now);
        spec.lease_duration_seconds = Some(secs);
        // `replace` carries the resourceVersion read: a concurrent writer makes it a 409.
        match api.replace(&s.name, &PostParams::default(), &lease).await {
            Ok(written) => {
                self.observed = Some((
                    written.resource_version().unwrap_or_default(),
                    Instant::now(),
                ));
                Ok(Outcome::Leading)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(Outcome::Following(holder)),
            Err(e) => Err(e.into()),
        }
    }

    /// Wait until this replica leads.
    pub async fn acquire(&mut self) {
        loop {
            match self.try_acquire().await {
                Ok(Outcome::Leading) => {
                    tracing::info!(lease = %self.settings.name, identity = %self.settings.identity, "leading");
                    return;
                }
                Ok(Outcome::Following(holder)) => {
                    tracing::debug!(lease = %self.settings.name, %holder, "following")
                }
                Err(e) => {
                    tracing::warn!(lease = %self.settings.name, error = %e, "lease attempt failed")
                }
            }
            tokio::time::sleep(self.settings.renew_every).await;
        }
    }

    fn lost(&self) {
        if let Some(h) = &self.health {
            h.lease_lost();
        }
    }

    /// Gives the Lease up on a clean stop, once this replica has stopped reconciling: its
    /// holder emptied, so the next replica takes it at its next look instead of waiting
    /// out the lease duration (client-go's `ReleaseOnCancel`). Written with the
    /// resourceVersion read, and only while this replica still holds it: a Lease another
    /// replica took meanwhile is left alone. Answers whether it was released.
    pub async fn release(&mut self) -> Result<bool, LeaseError> {
        let deadline = self.settings.renew_deadline;
        match tokio::time::timeout(deadline, self.give_up()).await {
            Ok(r) => r,
            Err(_) => Err(LeaseError::Timeout(deadline)),
        }
    }

    async fn give_up(&mut self) -> Result<bool, LeaseError> {
        let s = self.settings.clone();
        let api: Api<Lease> = Api::namespaced(self.client.clone(), &s.namespace);
        let Some(mut lease) = api.get_opt(&s.name).await? else {
            return Ok(false);
        };
        let spec = lease.spec.get_or_insert_with(Default::default);
        if spec.holder_identity.as_deref() != Some(s.identity.as_str()) {
            return Ok(false);
        }
        let now = MicroTime(Timestamp::now());
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(now.clone());
        spec.acquire_time = Some(now);
        match api.replace(&s.name, &PostParams::default(), &lease).await {
            Ok(_) => {
                self.observed = None;
                self.lost();
                Ok(true)
            }
            Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Renew until the Lease is lost or not renewed within `renew_deadline`; then return
    /// (the caller stops reconciling).
    pub async fn keep(&mut self) {
        let mut last_ok = Instant::now();
        loop {
            tokio::time::sleep(self.settings.renew_every).await;
            let left = self
                .settings
                .renew_deadline
                .saturating_sub(last_ok.elapsed());
            let attempt = tokio::time::timeout(left, self.try_acquire()).await;
            match attempt {
                Ok(Ok(Outcome::Leading)) => last_ok = Instant::now(),
                Ok(Ok(Outcome::Following(holder))) => {
                    // try_acquire has told health.
                    tracing::error!(lease = %self.settings.name, %holder, "lost the lease");
                    return;
                }
                Ok(Err(e)) => {
                    tracing::warn!(lease = %self.settings.name, error = %e, "lease renewal failed")
                }
                Err(_) => {}
            }
            if last_ok.elapsed() >= self.settings.renew_deadline {
                tracing::error!(lease = %self.settings.name, "not renewed within the renew deadline; stepping down");
                self.lost();
                return;
            }
        }
    }
}
