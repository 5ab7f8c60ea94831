//! The ingest listener (`ingest`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use crate::{in_range, ConfigError};

impl IngestConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        in_range(
            "ingest.body_limit_bytes",
            self.body_limit_bytes,
            1..=256 << 20,
        )?;
        self.connections.validate("ingest")
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IngestConfig {
    /// The ingest listener: `POST /ingest/{source}`, `/healthz`, `/readyz`.
    pub listen: SocketAddr,
    /// Largest accepted body, unless a source sets its own.
    pub body_limit_bytes: usize,
    /// Connections, and how long a client may take to send a request.
    pub connections: crate::listen::ConnectionLimits,
}

impl Default for IngestConfig {
    fn default() -> Self {
        IngestConfig {
            listen: SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 8080)),
            body_limit_bytes: 1 << 20,
            connections: crate::listen::ConnectionLimits::default(),
        }
    }
}
