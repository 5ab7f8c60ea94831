//! The node's logs: their format, their filter, and whether the spans that follow a hook
//! are written (`log`).

use serde::{Deserialize, Serialize};

use crate::{invalid, ConfigError};

/// How log lines are written.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum LogFormat {
    /// One line of text per event, for a terminal.
    #[default]
    Text,
    /// One JSON object per line, with the fields of the event and of its spans, for a
    /// cluster's log pipeline.
    Json,
}

/// Logging. `RUST_LOG`, when set, replaces `filter`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LogConfig {
    pub format: LogFormat,
    /// Which events are written: a `tracing` filter (`info`, `warn,ankusa_queue=debug`).
    pub filter: String,
    /// Write the spans that follow a hook — `ingest` (a request: source, tenant, hook id,
    /// the writer's batch, outcome), `writer.batch` (its hooks, linked to their requests),
    /// `delivery` (an attempt: hook id, tenant, sink, attempt, status), `admin` (a call) —
    /// each as one line when it closes, with its duration. Off: they cost nothing.
    pub spans: bool,
    /// Export those spans over OTLP/HTTP (protobuf) to an OpenTelemetry collector at this
    /// base URL (`http://otel-collector:4318`; they go to its `/v1/traces`), whatever
    /// `spans` says. Absent: nothing is exported.
    pub otlp_endpoint: Option<String>,
    /// The `service.name` of the exported spans.
    pub service_name: String,
}

impl Default for LogConfig {
    fn default() -> Self {
        LogConfig {
            format: LogFormat::Text,
            filter: "info".to_owned(),
            spans: false,
            otlp_endpoint: None,
            service_name: "ankusa-relay".to_owned(),
        }
    }
}

impl LogConfig {
    pub(crate) fn validate(&self) -> Result<(), ConfigError> {
        if self.filter.trim().is_empty() {
            return Err(invalid("log.filter", "must not be empty (e.g. info)"));
        }
        if let Some(e) = &self.otlp_endpoint {
            // The exporter speaks plain HTTP: a collector beside the node (a sidecar, a
            // node agent) forwards over TLS.
            if !e.starts_with("http://") || e.len() <= "http://".len() {
                return Err(invalid(
                    "log.otlp_endpoint",
                    "must be an http:// URL (a collector beside the node)",
                ));
            }
        }
        if self.service_name.trim().is_empty() {
            return Err(invalid("log.service_name", "must not be empty"));
        }
        Ok(())
    }
}
