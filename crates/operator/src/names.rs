//! The names of the objects a `Relay` owns ([`Names`]), the hash its configuration rolls
//! the nodes by ([`config_hash`]), and why an object could not be built
//! ([`ResourceError`]): what every module that reads or makes those objects shares.

use kube::Resource;
use sha2::{Digest, Sha256};

use ankusa_crds::relay::Relay;

/// Why a desired object could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ResourceError {
    #[error("the Relay has no {0}")]
    MissingMeta(&'static str),
    #[error("relay configuration: {0}")]
    Config(String),
    #[error("building {kind}: {source}")]
    Build {
        kind: &'static str,
        source: serde_json::Error,
    },
}

/// Names of the objects a `Relay` owns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    pub relay: String,
    pub namespace: String,
    pub statefulset: String,
    pub headless: String,
    pub client: String,
    pub config_map: String,
    pub token_secret: String,
    pub pdb: String,
    pub service_monitor: String,
    /// The ingest Service, and the Ingress and HTTPRoute in front of it.
    pub ingest: String,
    pub network_policy: String,
}

impl Names {
    pub fn of(relay: &Relay) -> Result<Names, ResourceError> {
        let name = relay
            .meta()
            .name
            .clone()
            .ok_or(ResourceError::MissingMeta("name"))?;
        let namespace = relay
            .meta()
            .namespace
            .clone()
            .ok_or(ResourceError::MissingMeta("namespace"))?;
        Ok(Names {
            statefulset: name.clone(),
            headless: format!("{name}-nodes"),
            client: name.clone(),
            config_map: format!("{name}-config"),
            token_secret: format!("{name}-operator-token"),
            pdb: name.clone(),
            service_monitor: name.clone(),
            ingest: format!("{name}-ingest"),
            network_policy: name.clone(),
            namespace,
            relay: name,
        })
    }

    /// The name of the owned object of `kind`.
    pub fn of_kind(&self, kind: crate::observed::Owned) -> &str {
        use crate::observed::Owned;
        match kind {
            Owned::ConfigMap => &self.config_map,
            Owned::HeadlessService => &self.headless,
            Owned::ClientService => &self.client,
            Owned::StatefulSet => &self.statefulset,
            Owned::PodDisruptionBudget => &self.pdb,
            Owned::ServiceMonitor => &self.service_monitor,
            Owned::IngestService | Owned::Ingress | Owned::HttpRoute => &self.ingest,
            Owned::NetworkPolicy => &self.network_policy,
        }
    }

    /// The pod of ordinal `i`.
    pub fn pod(&self, i: i32) -> String {
        format!("{}-{i}", self.statefulset)
    }

    /// Node `i`'s volume claim (the StatefulSet's claim template is `data`).
    pub fn claim(&self, i: i32) -> String {
        format!("data-{}-{i}", self.statefulset)
    }

    /// Node `i`'s own backup claim (`spec.backup.destination.claimTemplate`).
    pub fn backup_claim(&self, i: i32) -> String {
        format!("{}-backups-{i}", self.relay)
    }

    /// The ordinal of a node volume claim's name, if it is one of this Relay's.
    pub fn claim_ordinal(&self, claim: &str) -> Option<i32> {
        claim
            .strip_prefix("data-")?
            .strip_prefix(self.statefulset.as_str())?
            .strip_prefix('-')?
            .parse()
            .ok()
    }
}

/// A short hash of `relay.yaml` for the pod template annotation.
pub fn config_hash(yaml: &str) -> String {
    let digest = Sha256::digest(yaml.as_bytes());
    ankusa_keyspace::hex(&digest[..8])
}
