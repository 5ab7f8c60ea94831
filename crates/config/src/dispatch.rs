//! The dispatch pipeline: ticks, slots, budgets, weights (`dispatch`).

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, positive, CaBundle, ConfigError, Secrets};

impl DispatchConfig {
    pub(crate) fn validate(&self, secrets: Secrets) -> Result<(), ConfigError> {
        if let Some(ca) = &self.ca_bundle {
            ca.validate("dispatch.ca_bundle", secrets)?;
        }
        in_range(
            "dispatch.tick_interval_ms",
            self.tick_interval_ms,
            1..=60_000,
        )?;
        in_range("dispatch.max_inflight", self.max_inflight, 1..=100_000)?;
        in_range(
            "dispatch.per_sink_inflight",
            self.per_sink_inflight,
            1..=100_000,
        )?;
        in_range(
            "dispatch.tenant_max_inflight",
            self.tenant_max_inflight,
            1..=100_000,
        )?;
        if let Some((t, w)) = self
            .tenant_weights
            .iter()
            .find(|(t, w)| t.is_empty() || !(1..=1_000).contains(*w))
        {
            return Err(invalid(
                "dispatch.tenant_weights",
                format!("{t:?}: {w} (a tenant id and a weight in 1..=1000)"),
            ));
        }
        positive("dispatch.rows_per_tenant", self.rows_per_tenant)?;
        positive("dispatch.bytes_per_tick", self.bytes_per_tick)?;
        in_range(
            "dispatch.tenants_per_tick",
            self.tenants_per_tick,
            1..=100_000,
        )?;
        in_range(
            "dispatch.response_body_bytes",
            self.response_body_bytes,
            0..=200,
        )
    }
}

/// The dispatch pipeline's limits.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct DispatchConfig {
    /// How often the pipeline ticks when the last tick had nothing (or little) to do.
    pub tick_interval_ms: u64,
    /// Deliveries in flight across all sinks (the claim budget).
    pub max_inflight: usize,
    /// Deliveries in flight to one sink, unless the sink sets its own.
    pub per_sink_inflight: usize,
    /// Deliveries in flight for one tenant: a tenant's backlog holds at most this many of
    /// the node's delivery slots.
    pub tenant_max_inflight: usize,
    /// Rows per turn of the claim round robin, by tenant id (default 1): a tenant of
    /// weight 3 gets three rows for every one of a tenant of weight 1 when both wait.
    pub tenant_weights: std::collections::BTreeMap<String, u32>,
    /// Rows claimed from one tenant per tick.
    pub rows_per_tenant: usize,
    /// Bytes claimed per tick.
    pub bytes_per_tick: u64,
    /// Tenants one read of a tick visits; a read of more tenants goes on in the next tick.
    pub tenants_per_tick: usize,
    /// Start a fresh hook's deliveries at its ingest commit (written inflight, no tick)
    /// while the pipeline has caught up and their slots are free; off, every delivery is
    /// written due and claimed by a tick.
    pub start_at_commit: bool,
    /// Certificate authorities every sink's HTTPS server may be signed by, beyond the web
    /// PKI (a private CA of the deployment).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
    /// The first bytes of a failed attempt's response body kept with its status in the
    /// hook log and the DLQ row (`HTTP 400: {"error":"bad field"}`); 0 keeps none.
    pub response_body_bytes: usize,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            tick_interval_ms: 100,
            max_inflight: 512,
            per_sink_inflight: 128,
            tenant_max_inflight: 128,
            tenant_weights: Default::default(),
            rows_per_tenant: 256,
            bytes_per_tick: 16 << 20,
            tenants_per_tick: 128,
            start_at_commit: true,
            ca_bundle: None,
            response_body_bytes: 200,
        }
    }
}
