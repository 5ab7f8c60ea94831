//! The claim gateway of pull sinks (`pull`): its consumers and its bounds.

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, ConfigError, SecretSource, Secrets};

/// The longest lease a claim or an extension may ask for (12 hours).
pub const MAX_LEASE_MS: u64 = 12 * 3_600_000;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PullConfig {
    /// The tokens consumers claim with, each scoped to pull sinks and, optionally, tenants.
    pub consumers: Vec<ConsumerConfig>,
    /// A lease when neither the claim nor the sink names one, in milliseconds.
    pub lease_ms: u64,
    /// The most hooks one claim answers.
    pub max_claim: usize,
    /// The most body bytes one claim answers (a first hook larger than this still goes,
    /// alone).
    pub max_claim_bytes: u64,
    /// The longest a claim waits for hooks (`wait_ms`).
    pub max_wait_ms: u64,
    /// The most leases out per pull sink when the sink sets no `max_inflight`.
    pub max_leases: usize,
    /// The most leases of one tenant's hooks out per pull sink (absent: the sink's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant_max_leases: Option<usize>,
    /// The longest a lease lives from its claim, extensions included.
    pub max_lease_lifetime_ms: u64,
    /// The most claims one consumer may have waiting (`wait_ms`) at once on a node.
    pub max_waiting_claims: usize,
}

impl Default for PullConfig {
    fn default() -> Self {
        PullConfig {
            consumers: Vec::new(),
            lease_ms: 30_000,
            max_claim: 1_000,
            max_claim_bytes: 16 << 20,
            max_wait_ms: 30_000,
            max_leases: 10_000,
            tenant_max_leases: None,
            max_lease_lifetime_ms: MAX_LEASE_MS,
            max_waiting_claims: 64,
        }
    }
}

/// A consumer's token.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ConsumerConfig {
    /// Who the consumer is (in logs and the hook log's events).
    pub name: String,
    pub secret: SecretSource,
    /// The pull sinks it may claim from.
    pub sinks: Vec<String>,
    /// Only these tenants' hooks (absent: every tenant's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenants: Option<Vec<String>>,
    /// The most leases it may hold per pull sink (absent: the sink's leases shared
    /// equally among the consumers that may claim from it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_leases: Option<usize>,
}

impl PullConfig {
    /// Its numbers, and each consumer: a unique name, a secret of 16 bytes or more, pull
    /// sinks (`pull_sinks`) it names, and a tenant list that names a tenant.
    pub(crate) fn validate(
        &self,
        pull_sinks: &std::collections::BTreeSet<&str>,
        secrets: Secrets,
    ) -> Result<(), ConfigError> {
        in_range("pull.lease_ms", self.lease_ms, 1_000..=MAX_LEASE_MS)?;
        in_range("pull.max_claim", self.max_claim, 1..=10_000)?;
        in_range("pull.max_claim_bytes", self.max_claim_bytes, 1..=1 << 30)?;
        in_range("pull.max_wait_ms", self.max_wait_ms, 0..=300_000)?;
        in_range("pull.max_leases", self.max_leases, 1..=1_000_000)?;
        if let Some(n) = self.tenant_max_leases {
            in_range("pull.tenant_max_leases", n, 1..=1_000_000)?;
        }
        in_range(
            "pull.max_lease_lifetime_ms",
            self.max_lease_lifetime_ms,
            1_000..=MAX_LEASE_MS,
        )?;
        in_range(
            "pull.max_waiting_claims",
            self.max_waiting_claims,
            1..=100_000,
        )?;
        let mut names = std::collections::BTreeSet::new();
        for (i, c) in self.consumers.iter().enumerate() {
            let key = format!("pull.consumers[{i}]");
            if c.name.is_empty() || !names.insert(c.name.as_str()) {
                return Err(invalid(
                    &key,
                    format!("name {:?} is empty or repeated", c.name),
                ));
            }
            if secrets
                .len(&c.secret, &format!("{key}.secret"))?
                .is_some_and(|n| n < 16)
            {
                return Err(invalid(
                    &format!("{key}.secret"),
                    "must be at least 16 bytes",
                ));
            }
            if c.sinks.is_empty() {
                return Err(invalid(&format!("{key}.sinks"), "must name a pull sink"));
            }
            if let Some(s) = c.sinks.iter().find(|s| !pull_sinks.contains(s.as_str())) {
                return Err(invalid(
                    &format!("{key}.sinks"),
                    format!("{s:?} is not a sink of kind pull"),
                ));
            }
            if let Some(n) = c.max_leases {
                in_range(&format!("{key}.max_leases"), n, 1..=1_000_000)?;
            }
            if c.tenants.as_ref().is_some_and(|t| t.is_empty()) {
                return Err(invalid(
                    &format!("{key}.tenants"),
                    "must name a tenant (leave it out for every tenant)",
                ));
            }
        }
        Ok(())
    }
}
