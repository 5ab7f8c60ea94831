//! The node's logs and traces: one `tracing` subscriber with a layer for the log lines
//! (text or JSON, `log.filter`) and, with `log.otlp_endpoint`, one exporting the spans
//! that follow a hook to an OpenTelemetry collector over OTLP/HTTP.
//!
//! The spans (target [`TARGET`], level DEBUG: `ingest`, `writer.batch`, `delivery`,
//! `admin`) are enabled only for a layer that asks for them — the log layer with
//! `log.spans`, the exporter — so with neither, no span is ever built.
//!
//! **A hook is one trace.** Its trace id is derived from its id ([`hook_context`]): the
//! request's `ingest` span and every `delivery` attempt, on whichever node and after any
//! number of restarts, are children of the same (unexported) root, so a trace backend
//! shows a hook's whole life under one trace id, and `writer.batch` links to the requests
//! it acked.

use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider,
};
use sha2::Digest;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::fmt::format::FmtSpan;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{filter, Layer};

use ankusa_config::{LogConfig, LogFormat};

/// The target of the spans that follow a hook.
pub const TARGET: &str = "ankusa::trace";

/// Why the logs could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TelemetryError {
    #[error("log.filter (or RUST_LOG) {directives:?} is not a filter: {source}")]
    Filter {
        directives: String,
        source: filter::ParseError,
    },
    #[error("log.otlp_endpoint {endpoint:?}: {source}")]
    Exporter {
        endpoint: String,
        source: opentelemetry_otlp::ExporterBuildError,
    },
}

/// Keeps the exporter while the node runs; dropped, it sends what it holds.
#[derive(Debug, Default)]
pub struct Telemetry {
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(p) = self.provider.take() {
            if let Err(e) = p.shutdown() {
                eprintln!("ankusa-relay: exporting the last spans: {e}");
            }
        }
    }
}

/// Starts the logs (and the exporter) as `log` says; `RUST_LOG`, when set, replaces
/// `log.filter`. A second call in one process (tests) keeps the first subscriber.
pub fn init(log: &LogConfig) -> Result<Telemetry, TelemetryError> {
    let mut events = events_filter(log)?;
    let span_events = if log.spans {
        let spans = format!("{TARGET}=debug");
        events = events.add_directive(spans.parse().map_err(|source| TelemetryError::Filter {
            directives: spans.clone(),
            source,
        })?);
        FmtSpan::CLOSE
    } else {
        FmtSpan::NONE
    };
    let fmt = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_span_events(span_events);
    let fmt = match log.format {
        LogFormat::Text => fmt
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .boxed(),
        LogFormat::Json => fmt
            .json()
            .with_current_span(true)
            .with_span_list(true)
            .boxed(),
    };
    let mut telemetry = Telemetry::default();
    let otel = match &log.otlp_endpoint {
        None => None,
        Some(base) => {
            use opentelemetry_otlp::WithExportConfig;
            install_rustls_provider();
            let endpoint = format!("{}/v1/traces", base.trim_end_matches('/'));
            let exporter = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_endpoint(endpoint.clone())
                .build()
                .map_err(|source| TelemetryError::Exporter { endpoint, source })?;
            let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
                .with_batch_exporter(exporter)
                .with_resource(
                    opentelemetry_sdk::Resource::builder()
                        .with_service_name(log.service_name.clone())
                        .build(),
                )
                .build();
            let tracer = provider.tracer("ankusa-relay");
            telemetry.provider = Some(provider);
            Some(
                tracing_opentelemetry::layer()
                    .with_tracer(tracer)
                    // Entering a span does not start it: a request's span is put in its
                    // hook's trace once the hook has an id (after it was entered).
                    .with_context_activation(false)
                    .with_filter(filter::Targets::new().with_target(TARGET, tracing::Level::DEBUG)),
            )
        }
    };
    let _ = tracing_subscriber::registry()
        .with(fmt.with_filter(events))
        .with(otel)
        .try_init();
    Ok(telemetry)
}

/// The filter of the log's events: `RUST_LOG` when set, else `log.filter`.
fn events_filter(log: &LogConfig) -> Result<filter::EnvFilter, TelemetryError> {
    let directives = match std::env::var("RUST_LOG") {
        Ok(v) if !v.trim().is_empty() => v,
        _ => log.filter.clone(),
    };
    filter::EnvFilter::try_new(&directives).map_err(|source| TelemetryError::Filter {
        directives: directives.clone(),
        source,
    })
}

/// What `config check` can tell of the log section without setting anything up: that its
/// filter (or `RUST_LOG`) parses.
pub fn check(log: &LogConfig) -> Result<(), TelemetryError> {
    events_filter(log).map(drop)
}

/// The OpenTelemetry context of hook `id`'s trace: a remote parent whose trace id and span
/// id are the first 24 bytes of SHA-256 over the id, the same on every node.
pub fn hook_context(id: &str) -> opentelemetry::Context {
    let d = sha2::Sha256::new()
        .chain_update(b"ankusa-hook\0")
        .chain_update(id.as_bytes())
        .finalize();
    let mut trace = [0u8; 16];
    let mut span = [0u8; 8];
    trace.copy_from_slice(&d[..16]);
    span.copy_from_slice(&d[16..24]);
    let cx = SpanContext::new(
        TraceId::from_bytes(trace),
        SpanId::from_bytes(span),
        TraceFlags::SAMPLED,
        true,
        TraceState::default(),
    );
    opentelemetry::Context::new().with_remote_span_context(cx)
}

/// Puts `span` (a hook's request or attempt) in hook `id`'s trace, if spans are exported.
pub fn in_hook_trace(span: &tracing::Span, id: &str) {
    if !span.is_disabled() {
        // No exporter (log.spans alone), or a span already started: it keeps its own trace.
        let _ = span.set_parent(hook_context(id));
    }
}

/// A budget of log lines a second, for lines the outside world can cause at any rate
/// (a sender failing verification, a sink refusing every attempt): at most `per_second`
/// are written each second, and the first written after a gap says how many were left out.
#[derive(Debug)]
pub struct LogLimit {
    per_second: u32,
    /// The current second, the lines written in it, and the lines left out since the last
    /// one written.
    state: std::sync::Mutex<(u64, u32, u64)>,
}

impl LogLimit {
    pub const fn new(per_second: u32) -> Self {
        LogLimit {
            per_second,
            state: std::sync::Mutex::new((0, 0, 0)),
        }
    }

    /// `Some(left_out)` when a line may be written in second `now_s` (`left_out` lines
    /// were not since the last one that was), `None` when this second's budget is spent.
    pub fn admit(&self, now_s: u64) -> Option<u64> {
        self.admit_or_defer(now_s).ok()
    }

    /// [`LogLimit::admit`], telling a line left out whether it is the first since the
    /// count was last said: `Err(true)` asks the caller to say the count soon
    /// ([`LogLimit::take_left_out`] when this second is over), rather than with the next
    /// line written, which may come much later or never.
    pub fn admit_or_defer(&self, now_s: u64) -> Result<u64, bool> {
        // One lock for the decision and the count, so that of two lines left out at once
        // exactly one is the first.
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.0 != now_s {
            st.0 = now_s;
            st.1 = 0;
        }
        if st.1 < self.per_second {
            st.1 += 1;
            Ok(std::mem::take(&mut st.2))
        } else {
            st.2 += 1;
            Err(st.2 == 1)
        }
    }

    /// The lines left out and not said yet (none after this).
    pub fn take_left_out(&self) -> u64 {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut st.2)
    }
}

/// Chooses ring as rustls's crypto provider for this process, once (later calls do
/// nothing): reqwest's rustls comes without one of its own, and both of its users here —
/// the OpenTelemetry exporter and the object-store client of `backup push` / `restore` —
/// need it before they build a client.
pub fn install_rustls_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

#[cfg(test)]
mod tests {
    use super::LogLimit;

    #[test]
    fn a_log_limit_writes_its_budget_each_second_and_counts_the_rest() {
        let l = LogLimit::new(2);
        assert_eq!(l.admit(10), Some(0));
        assert_eq!(l.admit(10), Some(0));
        assert_eq!(l.admit(10), None);
        assert_eq!(l.admit(10), None);
        // The next second's first line says two were left out; the count starts again.
        assert_eq!(l.admit(11), Some(2));
        assert_eq!(l.admit(11), Some(0));
        assert_eq!(l.admit(11), None);
        assert_eq!(l.admit(12), Some(1));
    }

    #[test]
    fn the_first_line_left_out_asks_for_the_count_to_be_said() {
        let l = LogLimit::new(1);
        assert_eq!(l.admit_or_defer(10), Ok(0));
        assert_eq!(l.admit_or_defer(10), Err(true));
        assert_eq!(l.admit_or_defer(10), Err(false));
        assert_eq!(l.take_left_out(), 2);
        // Said: the next second's first line has nothing more to say.
        assert_eq!(l.admit_or_defer(11), Ok(0));
        assert_eq!(l.admit_or_defer(11), Err(true));
    }
}
