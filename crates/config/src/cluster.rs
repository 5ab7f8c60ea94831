//! The nodes of one Relay (`cluster`).

use serde::{Deserialize, Serialize};

use crate::{invalid, ConfigError, SecretSource, Secrets};

/// The nodes of one Relay: each tenant belongs to one of them (rendezvous hashing of the
/// tenant id over the node names), and a node forwards a hook for a tenant it does not own
/// to the owner. No nodes (the default) or one: this node owns every tenant.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// This node's name in `nodes` (the operator sets it from the pod name through
    /// `ANKUSA_CLUSTER__NAME`).
    pub name: Option<String>,
    /// Every node of the Relay. The first one keeps the Relay's tenant registry
    /// (`tenants.max` counts tenants relay-wide).
    pub nodes: Vec<ClusterNode>,
    /// The secret the nodes show each other (at least 16 bytes; required with two nodes
    /// or more).
    pub token: Option<SecretSource>,
    /// How long a node waits for another's answer (a forwarded hook, an admin call).
    pub forward_timeout_ms: u64,
    /// How often the node hands the rows it stores of tenants other nodes own to their
    /// owners (a pass; at once after one that moved something). 0: never — a former owner
    /// then delivers what it stored itself, and a leaving node never drains.
    pub handoff_interval_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig {
            name: None,
            nodes: Vec::new(),
            token: None,
            forward_timeout_ms: 10_000,
            handoff_interval_ms: 2_000,
        }
    }
}

/// One node of a Relay.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ClusterNode {
    /// Its stable name (a StatefulSet pod name).
    pub name: String,
    /// Its ingest listener, `http://host:port` (a path, if any, is a prefix).
    pub ingest: String,
    /// Its admin listener, `http://host:port`.
    pub admin: String,
    /// The node is leaving the Relay (a scale-down): it owns no tenant, hands every row it
    /// stores to the tenants' owners (docs/architecture.md, handoff), and forwards the hooks
    /// it receives. Ownership is computed over the nodes that are not leaving.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub leaving: bool,
}

impl ClusterConfig {
    /// Two nodes or more.
    pub fn is_multi(&self) -> bool {
        self.nodes.len() > 1
    }

    pub(crate) fn validate(&self, secrets: Secrets) -> Result<(), ConfigError> {
        if !(100..=120_000).contains(&self.forward_timeout_ms) {
            return Err(invalid(
                "cluster.forward_timeout_ms",
                format!("{} is outside 100..=120000", self.forward_timeout_ms),
            ));
        }
        if self.handoff_interval_ms != 0 && !(100..=600_000).contains(&self.handoff_interval_ms) {
            return Err(invalid(
                "cluster.handoff_interval_ms",
                format!(
                    "{} is neither 0 (off) nor within 100..=600000",
                    self.handoff_interval_ms
                ),
            ));
        }
        let mut names = std::collections::BTreeSet::new();
        for (i, n) in self.nodes.iter().enumerate() {
            let key = format!("cluster.nodes[{i}]");
            let chars_ok = n
                .name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
            if n.name.is_empty()
                || n.name.len() > 253
                || !chars_ok
                || !names.insert(n.name.as_str())
            {
                return Err(invalid(
                    &key,
                    format!(
                        "name {:?} is empty, too long, repeated or not [A-Za-z0-9._-]",
                        n.name
                    ),
                ));
            }
            for (field, url) in [("ingest", &n.ingest), ("admin", &n.admin)] {
                // A path is a prefix the listener's paths are appended to (a proxy's).
                let ok = url
                    .parse::<http::Uri>()
                    .ok()
                    .filter(|u| matches!(u.scheme_str(), Some("http" | "https")))
                    .filter(|u| u.host().is_some() && u.query().is_none());
                if ok.is_none() {
                    return Err(invalid(
                        &format!("{key}.{field}"),
                        format!("{url:?} is not an http(s)://host:port URL"),
                    ));
                }
            }
        }
        if self.nodes.is_empty() {
            return Ok(());
        }
        if self.nodes.iter().all(|n| n.leaving) {
            return Err(invalid(
                "cluster.nodes",
                "every node is leaving: at least one must stay to own the tenants",
            ));
        }
        match &self.name {
            Some(me) if names.contains(me.as_str()) => {}
            Some(me) => {
                return Err(invalid(
                    "cluster.name",
                    format!("{me:?} is not one of cluster.nodes"),
                ))
            }
            None => {
                return Err(invalid(
                    "cluster.name",
                    "must name this node (one of cluster.nodes)",
                ))
            }
        }
        if self.is_multi() {
            let Some(t) = &self.token else {
                return Err(invalid(
                    "cluster.token",
                    "is required with two nodes or more",
                ));
            };
            if secrets == Secrets::Resolve {
                let token = t.resolve("cluster.token")?;
                if token.len() < 16 {
                    return Err(invalid("cluster.token", "must be at least 16 bytes"));
                }
                // It travels in a header: printable ASCII only (no space, no control byte).
                if !token.iter().all(|b| (0x21..=0x7e).contains(b)) {
                    return Err(invalid(
                        "cluster.token",
                        "must be printable ASCII (no spaces or control characters)",
                    ));
                }
            }
        }
        Ok(())
    }
}
