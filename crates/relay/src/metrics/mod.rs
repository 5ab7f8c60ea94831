//! Node metrics (Prometheus text exposition through `prometheus-client`).
//!
//! [`Metrics`] holds every metric the node exports; label sets are bounded (sources come
//! from the configuration, outcomes are a fixed set). [`gauges`] reads the queue gauges at
//! O(1) cost in the backlog and the tenant count: counter point reads and a bounded walk of
//! the active index, never a fold of the due, inflight, dead or archive families.

pub mod gauges;

use std::sync::Arc;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// The fixed set of ingest outcomes.
pub const OUTCOMES: [&str; 11] = [
    "accepted",
    "duplicate",
    "rejected",
    "quarantined",
    "tenant_limit",
    "unavailable",
    "forwarded",
    "owner_unavailable",
    "tenant_rate_limited",
    "tenant_backlog_full",
    "tenant_erasing",
];

/// The claim gateway's metrics, by pull sink (sinks come from the configuration).
#[derive(Debug)]
pub struct PullMetrics {
    claimed: Family<SinkLabel, Counter>,
    acked: Family<SinkLabel, Counter>,
    nacked: Family<SinkLabel, Counter>,
    expired: Family<SinkLabel, Counter>,
    leases: Family<SinkLabel, Gauge>,
    held: Family<SinkLabel, Histogram>,
    refused: Family<PullRefusalLabels, Counter>,
    /// Claims waiting for hooks (`wait_ms`) on this node.
    pub waiting: Gauge,
}

/// A claim the gateway refused or cut short, and why.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PullRefusalLabels {
    pub sink: String,
    pub reason: &'static str,
}

/// One pull sink's series.
#[derive(Debug, Clone)]
pub struct PullSinkMeters {
    pub claimed: Counter,
    pub acked: Counter,
    pub nacked: Counter,
    pub expired: Counter,
    pub leases: Gauge,
    pub held: Histogram,
}

impl PullMetrics {
    fn register(registry: &mut Registry) -> Self {
        let m = PullMetrics {
            claimed: Family::default(),
            acked: Family::default(),
            nacked: Family::default(),
            expired: Family::default(),
            leases: Family::default(),
            held: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.001, 2.0, 20))
            }),
            refused: Family::default(),
            waiting: Gauge::default(),
        };
        registry.register(
            "ankusa_pull_refused",
            "Claims refused or answered short by a bound, by pull sink and reason (consumer_quota, waiting_claims)",
            m.refused.clone(),
        );
        registry.register(
            "ankusa_pull_waiting_claims",
            "Claims waiting for hooks (wait_ms) on this node",
            m.waiting.clone(),
        );
        registry.register(
            "ankusa_pull_claimed",
            "Hooks consumers leased, by pull sink",
            m.claimed.clone(),
        );
        registry.register(
            "ankusa_pull_acked",
            "Leases acked (delivered), by pull sink",
            m.acked.clone(),
        );
        registry.register(
            "ankusa_pull_nacked",
            "Leases nacked (retried on the schedule, or dead-lettered), by pull sink",
            m.nacked.clone(),
        );
        registry.register(
            "ankusa_pull_expired",
            "Leases that ran out before an ack (the attempt counts), by pull sink",
            m.expired.clone(),
        );
        registry.register(
            "ankusa_pull_leases",
            "Leases out on this node, by pull sink",
            m.leases.clone(),
        );
        registry.register(
            "ankusa_pull_lease_seconds",
            "How long a lease was held, from its claim to its ack, nack or expiry, by pull sink",
            m.held.clone(),
        );
        m
    }

    /// A claim refused or answered short by a bound.
    pub fn refused(&self, sink: &str, reason: &'static str) {
        self.refused
            .get_or_create(&PullRefusalLabels {
                sink: sink.to_owned(),
                reason,
            })
            .inc();
    }

    pub fn sink(&self, sink: &str) -> PullSinkMeters {
        let l = SinkLabel {
            sink: sink.to_owned(),
        };
        PullSinkMeters {
            claimed: self.claimed.get_or_create(&l).clone(),
            acked: self.acked.get_or_create(&l).clone(),
            nacked: self.nacked.get_or_create(&l).clone(),
            expired: self.expired.get_or_create(&l).clone(),
            leases: self.leases.get_or_create(&l).clone(),
            held: self.held.get_or_create(&l).clone(),
        }
    }
}

/// The listeners' connections (`ingest`, `admin`): what a client holds of them.
#[derive(Debug)]
pub struct ListenerMetrics {
    open: Family<ListenerLabel, Gauge>,
    refused: Family<ListenerLabel, Counter>,
    timeouts: Family<TimeoutLabels, Counter>,
}

/// A listener (`ingest` or `admin`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub listener: &'static str,
}

/// A listener, and what a client was too slow to send (`headers`: a request's headers, or
/// any request on an idle connection; `body`: a request's body).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabels {
    pub listener: &'static str,
    pub phase: &'static str,
}

impl ListenerMetrics {
    fn register(registry: &mut Registry) -> Self {
        let m = ListenerMetrics {
            open: Family::default(),
            refused: Family::default(),
            timeouts: Family::default(),
        };
        registry.register(
            "ankusa_http_connections",
            "Connections open, by listener",
            m.open.clone(),
        );
        registry.register(
            "ankusa_http_connections_refused",
            "Connections closed as they were accepted because the listener held its connections.max, by listener",
            m.refused.clone(),
        );
        registry.register(
            "ankusa_http_timeouts",
            "Connections and requests cut because the client was too slow: phase headers (a request's headers, or an idle connection) or body, by listener",
            m.timeouts.clone(),
        );
        m
    }

    /// `listener`'s open connections.
    pub fn open(&self, listener: &'static str) -> Gauge {
        self.open.get_or_create(&ListenerLabel { listener }).clone()
    }

    /// `listener`'s connections refused at its ceiling.
    pub fn refused(&self, listener: &'static str) -> Counter {
        self.refused
            .get_or_create(&ListenerLabel { listener })
            .clone()
    }

    /// `listener`'s cuts in `phase` (`headers` or `body`).
    pub fn timeouts(&self, listener: &'static str, phase: &'static str) -> Counter {
        self.timeouts
            .get_or_create(&TimeoutLabels { listener, phase })
            .clone()
    }
}

/// The `source` label of requests naming no configured source.
pub const UNKNOWN_SOURCE: &str = "_unknown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkOutcome {
    pub sink: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SinkLabel {
    pub sink: String,
}

/// The `outcome` label of `ankusa_delivery_attempts`: how one attempt ended. Finer than
/// the hook log's `AttemptOutcome` (delivered, retry, dead): a retry is `error` (no
/// answer) or `retryable` (an answer that asks for one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttemptLabel {
    /// A 2xx.
    Delivered = 0,
    /// A final refusal: the row went to the DLQ.
    Rejected = 1,
    /// No answer (connection, timeout), to be retried.
    Error = 2,
    /// An answer that asks for a retry (429, 5xx).
    Retryable = 3,
}

impl AttemptLabel {
    /// Every outcome, in the order of their series in [`SinkMeters`].
    pub const ALL: [AttemptLabel; 4] = [
        AttemptLabel::Delivered,
        AttemptLabel::Rejected,
        AttemptLabel::Error,
        AttemptLabel::Retryable,
    ];

    /// The label's value.
    pub fn label(self) -> &'static str {
        match self {
            AttemptLabel::Delivered => "delivered",
            AttemptLabel::Rejected => "rejected",
            AttemptLabel::Error => "error",
            AttemptLabel::Retryable => "retryable",
        }
    }
}

/// One sink's delivery series ([`Metrics::sink_meters`]); clones share the series.
#[derive(Clone, Debug)]
pub struct SinkMeters {
    attempts: [Counter; 4],
    /// Delivered attempts the sink had already ([`Attempt::duplicate`](crate::dispatch::delivery::Attempt::duplicate)).
    pub duplicates: Counter,
    pub latency: Histogram,
    pub limit: Gauge,
    pub breaker: Gauge,
    pub requests: Gauge,
    pub queued: Gauge,
    /// The attempts' latencies in fine buckets the console reads (not exported).
    pub recent: Arc<LatencyLog>,
}

/// Attempt latencies in log-linear buckets (four per power of two of microseconds), as
/// counters: two readings apart give the quantiles of what happened between them.
#[derive(Debug)]
pub struct LatencyLog([std::sync::atomic::AtomicU64; LatencyLog::BUCKETS]);

impl Default for LatencyLog {
    fn default() -> Self {
        LatencyLog(std::array::from_fn(|_| {
            std::sync::atomic::AtomicU64::new(0)
        }))
    }
}

impl LatencyLog {
    pub const BUCKETS: usize = 160;

    pub fn bucket_of(us: u64) -> usize {
        if us < 4 {
            return us as usize;
        }
        let log = 63 - us.leading_zeros() as usize;
        let sub = ((us >> (log - 2)) & 3) as usize;
        ((log - 1) * 4 + sub).min(Self::BUCKETS - 1)
    }

    /// The smallest latency (µs) of bucket `i`.
    pub fn lower_us(i: usize) -> u64 {
        if i < 4 {
            return i as u64;
        }
        let (log, sub) = (i / 4 + 1, (i % 4) as u64);
        (4 + sub) << (log - 2)
    }

    pub fn observe(&self, d: std::time::Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        self.0[Self::bucket_of(us)].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }

    pub fn read(&self) -> Vec<u64> {
        self.0
            .iter()
            .map(|c| c.load(std::sync::atomic::Ordering::Relaxed))
            .collect()
    }

    /// The `q` quantile (0..=1) in ms of the counts `later − earlier`, at its bucket's
    /// upper end (at most 25 % above); `None` with no attempts between them.
    pub fn quantile_ms(earlier: &[u64], later: &[u64], q: f64) -> Option<f64> {
        let d: Vec<u64> = later
            .iter()
            .zip(earlier.iter().chain(std::iter::repeat(&0)))
            .map(|(l, e)| l.saturating_sub(*e))
            .collect();
        let total: u64 = d.iter().sum();
        if total == 0 {
            return None;
        }
        let rank = ((total as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in d.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Some(Self::lower_us(i + 1) as f64 / 1000.0);
            }
        }
        None
    }
}

impl SinkMeters {
    /// The attempts counter of `outcome`.
    pub fn attempt(&self, outcome: AttemptLabel) -> &Counter {
        &self.attempts[outcome as usize]
    }
}

/// Which read a dispatch tick planned from: `full` (the active index) or `hinted` (the
/// tenants the writer announced).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ScanLabel {
    pub scan: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ArchiveLabel {
    /// `archived` or `dropped`.
    pub outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct FieldLabel {
    pub field: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TenantLabel {
    pub tenant: String,
}

/// What a node sent another (`ingest`: a hook for a tenant the other owns; `admin`: an
/// admin call about such a tenant; `admit`: a new tenant to the registry) and how it went
/// (`answered` or `unavailable`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ForwardLabels {
    pub kind: String,
    pub outcome: String,
}

/// A store family (`due`, `hooks`, `audit`, ...).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StoreFamilyLabel {
    pub family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindLabel {
    pub kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct IngestLabels {
    pub source: String,
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OutcomeLabel {
    pub outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceSinkLabels {
    pub source: String,
    pub sink: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SourceLabel {
    pub source: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct VerifyLabels {
    pub source: String,
    /// One of `ankusa_verify::VerifyError::REASONS`.
    pub reason: String,
}

/// The metrics of a node, each declared once: its field (and doc), its type and initial
/// value, its exported name and help. The macro writes the [`Metrics`] struct and its
/// constructor, which registers each in that order.
macro_rules! node_metrics {
    ($($(#[$doc:meta])* $field:ident: $ty:ty = $init:expr, $name:literal, $help:literal;)*) => {
        /// Every metric of a node.
        #[derive(Debug)]
        pub struct Metrics {
            pub registry: Registry,
            /// The claim gateway's, per pull sink.
            pub pull: PullMetrics,
            /// The listeners' connections.
            pub listeners: ListenerMetrics,
            /// Each sink's fine latency buckets (for the console; not exported).
            sink_recent: std::sync::Mutex<std::collections::HashMap<String, Arc<LatencyLog>>>,
            $($(#[$doc])* pub $field: $ty,)*
        }

        impl Metrics {
            pub fn new() -> Self {
                let mut registry = Registry::default();
                $(
                    let $field: $ty = $init;
                    registry.register($name, $help, $field.clone());
                )*
                let pull = PullMetrics::register(&mut registry);
                let listeners = ListenerMetrics::register(&mut registry);
                Metrics {
                    registry,
                    pull,
                    listeners,
                    sink_recent: Default::default(),
                    $($field,)*
                }
            }
        }
    };
}

node_metrics! {
    ingest_requests: Family<IngestLabels, Counter> = Default::default(),
        "ankusa_ingest_requests",
        "Ingest requests by source and outcome";
    /// Configuration reloads, by outcome (applied, unchanged, refused).
    config_reloads: Family<OutcomeLabel, Counter> = Default::default(),
        "ankusa_config_reloads",
        "Configuration reloads (SIGHUP, or the file changed), by outcome: applied, unchanged, refused";
    /// 1 while the configuration file holds a reload the node refused.
    config_reload_refused: Gauge = Default::default(),
        "ankusa_config_reload_refused",
        "1 while the configuration file holds a reload the node refused (the previous configuration runs)";
    /// Deliveries a route's filter left out, by source and sink.
    route_filtered: Family<SourceSinkLabels, Counter> = Default::default(),
        "ankusa_route_filtered",
        "Deliveries a route's filter left out (the hook did not match that sink's filter), by source and sink";
    /// Hooks no sink took: committed to the hook log alone.
    hooks_filtered: Family<SourceLabel, Counter> = Default::default(),
        "ankusa_hooks_filtered",
        "Hooks accepted that no sink of their route took (every one's filter left them out): in the hook log as filtered, never delivered";
    /// Requests that failed verification, by source and reason code.
    ingest_verification_failures: Family<VerifyLabels, Counter> = Default::default(),
        "ankusa_ingest_verification_failures",
        "Requests that failed verification (401), by source and reason: missing_header, malformed_header, stale_timestamp, bad_signature";
    ingest_latency: Histogram = Histogram::new(exponential_buckets(0.000_1, 2.0, 18)),
        "ankusa_ingest_latency_seconds",
        "Time from request to answer, including the synced commit for accepted hooks";
    writer_batch_hooks: Histogram = Histogram::new(exponential_buckets(1.0, 2.0, 14)),
        "ankusa_writer_batch_hooks",
        "Hooks acked per WAL sync of the writer (one sync covers every batch written during the sync before it)";
    writer_commit_seconds: Histogram = Histogram::new(exponential_buckets(0.000_05, 2.0, 18)),
        "ankusa_writer_commit_seconds",
        "Duration of each WAL sync that acks the writer's batches";
    /// Hooks written by the writer and waiting for the WAL sync that acks them.
    writer_unsynced_hooks: Gauge = Default::default(),
        "ankusa_writer_unsynced_hooks",
        "Hooks written by the writer and waiting for the WAL sync that acks them";
    quarantine_dropped: Counter = Default::default(),
        "ankusa_quarantine_dropped",
        "Requests that failed verification but were not kept: the quarantine was full";
    dedupe_swept: Counter = Default::default(),
        "ankusa_dedupe_swept",
        "Expired idempotency keys removed";
    delivery_attempts: Family<SinkOutcome, Counter> = Default::default(),
        "ankusa_delivery_attempts",
        "Delivery attempts by sink and outcome (delivered, retryable, rejected, error)";
    /// Deliveries the sink acknowledged as one it had already (a NATS stream's duplicate).
    delivery_duplicates: Family<SinkLabel, Counter> = Default::default(),
        "ankusa_delivery_duplicates",
        "Delivered attempts the sink acknowledged as a duplicate of a message it had (a NATS sink: the stream dropped a repeated Nats-Msg-Id), by sink";
    delivery_latency: Family<SinkLabel, Histogram> = Family::<SinkLabel, Histogram>::new_with_constructor(|| { Histogram::new(exponential_buckets(0.000_5, 2.0, 16)) }),
        "ankusa_delivery_latency_seconds",
        "Duration of a delivery attempt, by sink";
    /// Each sink's adaptive concurrency limit, after its last attempt.
    sink_limit: Family<SinkLabel, Gauge> = Default::default(),
        "ankusa_sink_limit",
        "A sink's adaptive concurrency limit (1..=max_inflight), after its last attempt";
    /// Each sink's breaker after its last attempt: 0 closed, 1 open, 2 half-open.
    sink_breaker: Family<SinkLabel, Gauge> = Default::default(),
        "ankusa_sink_breaker",
        "A sink's breaker after its last attempt: 0 closed, 1 open (its rows stay due), 2 half-open (one probe)";
    /// A sink's requests in flight, after its last attempt.
    sink_requests: Family<SinkLabel, Gauge> = Default::default(),
        "ankusa_sink_requests",
        "A sink's requests in flight (at most its limit), after its last attempt";
    /// A sink's claimed rows waiting in its request line, after its last attempt.
    sink_queued: Family<SinkLabel, Gauge> = Default::default(),
        "ankusa_sink_queued",
        "Rows claimed for a sink waiting in its request line for a slot, after its last attempt";
    dispatch_active_tenants: Gauge = Default::default(),
        "ankusa_dispatch_active_tenants",
        "Distinct tenants the last dispatch tick visited";
    dispatch_claimed: Counter = Default::default(),
        "ankusa_dispatch_claimed",
        "Due rows claimed for delivery";
    /// Fresh deliveries the ingest commit wrote inflight and started, with no tick.
    dispatch_started: Counter = Default::default(),
        "ankusa_dispatch_started_at_commit",
        "Fresh deliveries the ingest commit wrote inflight and started at once, with no tick, read or claim (the pipeline had caught up and every slot they needed was free)";
    dispatch_ticks: Family<ScanLabel, Counter> = Default::default(),
        "ankusa_dispatch_ticks",
        "Dispatch ticks, by the read they planned from (full: the active index; hinted: the tenants the writer announced)";
    /// The read-and-claim half of a tick (plan, claim, marker cleanup, envelope reads).
    dispatch_tick_seconds: Histogram = Histogram::new(exponential_buckets(0.000_05, 2.0, 16)),
        "ankusa_dispatch_tick_seconds",
        "Duration of a dispatch tick's reads and claim (plan, claim, marker cleanup, envelope reads)";
    /// Hinted tenants waiting after the last tick.
    dispatch_hinted_tenants: Gauge = Default::default(),
        "ankusa_dispatch_hinted_tenants",
        "Tenants announced by the writer that the last dispatch tick left for the next";
    /// Tenants with deliveries in flight, and the most one of them holds.
    dispatch_tenants_inflight: Gauge = Default::default(),
        "ankusa_dispatch_tenants_inflight",
        "Tenants with deliveries in flight";
    dispatch_tenant_inflight_max: Gauge = Default::default(),
        "ankusa_dispatch_tenant_inflight_max",
        "Deliveries in flight of the tenant holding the most (at most dispatch.tenant_max_inflight)";
    /// Times the hint set was full (the next tick then scans the active index).
    dispatch_hint_overflows: Counter = Default::default(),
        "ankusa_dispatch_hint_overflows",
        "Times the writer's hints reached their ceiling of 65 536 tenants (the next tick scans the active index)";
    /// Rows still in flight when a graceful stop's grace ran out, made due again.
    shutdown_requeued: Counter = Default::default(),
        "ankusa_shutdown_requeued",
        "Rows whose delivery was still in flight when a graceful stop's grace ran out, made due again";
    /// Cleared markers (hooks awaiting reclaim) the last reclaim sweep found.
    reclaim_backlog: Gauge = Default::default(),
        "ankusa_reclaim_backlog",
        "Hooks awaiting reclaim (cleared markers) that the last reclaim sweep found";
    reclaimed_hooks: Counter = Default::default(),
        "ankusa_reclaimed_hooks",
        "Hooks removed because no delivery, dead row or archive obligation needed them (by reclaim or by the outcome of their last delivery)";
    archive_settled: Family<ArchiveLabel, Counter> = Default::default(),
        "ankusa_archive_settled",
        "Archive obligations settled: archived (kept for their retention) or dropped (hook gone, or the source's archive is off)";
    archive_expired: Counter = Default::default(),
        "ankusa_archive_expired",
        "Archived hooks removed at the end of their retention";
    hook_log_hooks: Gauge = Default::default(),
        "ankusa_hook_log_hooks",
        "Hooks the hook log keeps (newest seq - oldest seq + 1; ceiling hook_log.max_hooks)";
    hook_log_pruned: Counter = Default::default(),
        "ankusa_hook_log_pruned",
        "Hooks removed from the hook log by age or by its ceiling";
    queue_state: Family<FieldLabel, Gauge> = Default::default(),
        "ankusa_queue_state",
        "The node's six queue counters (pending, scheduled, inflight, dead, bytes, archive_pending)";
    oldest_due_age: Gauge<f64, std::sync::atomic::AtomicU64> = Gauge::<f64, std::sync::atomic::AtomicU64>::default(),
        "ankusa_queue_oldest_due_age_seconds",
        "How long the oldest due row has been due (0 when nothing is due)";
    /// Deliveries in flight of the tenants holding the most (refreshed each second).
    tenant_inflight: Family<TenantLabel, Gauge> = Default::default(),
        "ankusa_tenant_inflight",
        "Deliveries in flight of the 20 tenants holding the most (refreshed each second)";
    tenant_pending: Family<TenantLabel, Gauge> = Default::default(),
        "ankusa_tenant_pending",
        "Pending rows of the top 100 tenants among the first 10 000 with work due";
    tenants: Gauge = Default::default(),
        "ankusa_tenants",
        "Tenant ordinals ever allocated";
    /// 1 while the store's writes fail.
    store_write_failing: Gauge = Default::default(),
        "ankusa_store_write_failing",
        "1 while the store's writes fail (a full disk, a failed WAL sync): nothing is acked and the node is not ready";
    store_memory_bytes: Gauge = Default::default(),
        "ankusa_store_memory_bytes",
        "Bytes in the store's shared cache: cached table blocks and the memtables charged to it (store.memory_bytes bounds it)";
    store_memory_budget_bytes: Gauge = Default::default(),
        "ankusa_store_memory_budget_bytes",
        "The store's memory budget: store.memory_bytes, or a quarter of the cgroup's memory limit, or 512 MiB";
    store_write_failures: Counter = Default::default(),
        "ankusa_store_write_failures",
        "Store writes that failed";
    store_corruption: Family<StoreFamilyLabel, Counter> = Default::default(),
        "ankusa_store_corruption_errors",
        "Times a store family was found corrupt (a scan cut short before its sentinel, a row that does not decode); never read as empty";
    /// Requests this node sent to another of its Relay, by kind and outcome.
    cluster_forwards: Family<ForwardLabels, Counter> = Default::default(),
        "ankusa_cluster_forwards",
        "Requests sent to another node of the Relay, by kind (ingest, admin, admit) and outcome (answered, unavailable)";
    /// Time from sending a request to another node to its answer.
    cluster_forward_seconds: Family<KindLabel, Histogram> = Family::<KindLabel, Histogram>::new_with_constructor(|| { Histogram::new(exponential_buckets(0.000_1, 2.0, 18)) }),
        "ankusa_cluster_forward_seconds",
        "Time from sending a request to another node of the Relay to its answer";
    /// Requests signed as a node's that the edge refused, by reason.
    cluster_auth_refused: Family<KindLabel, Counter> = Default::default(),
        "ankusa_cluster_auth_refused",
        "Requests signed as another node's that this node refused, by reason: malformed, bad_signature, stale, replayed, full, body_mismatch, not_a_relay";
    /// Nonces of node requests remembered (the replay window).
    cluster_auth_nonces: Gauge = Default::default(),
        "ankusa_cluster_auth_nonces",
        "Nonces of the other nodes' requests remembered to refuse a replay (at most 1048576)";
    /// Nodes in the Relay's node list (1 when there is none).
    cluster_nodes: Gauge = Default::default(),
        "ankusa_cluster_nodes",
        "Nodes in the Relay's node list";
    /// Tenants this node has taken hooks for as their owner since it started.
    cluster_tenants_owned: Gauge = Default::default(),
        "ankusa_cluster_tenants_owned",
        "Tenants this node has taken hooks for as their owner since it started";
    /// Tenants this node admitted as their owner (the Relay's count is the sum).
    cluster_tenants_registered: Gauge = Default::default(),
        "ankusa_cluster_tenants_registered",
        "Tenants this node admitted as their owner (the Relay's count is the sum over its nodes)";
    /// Deliveries this node holds of tenants another node owns (the handoff's backlog).
    handoff_rows_leaving: Gauge = Default::default(),
        "ankusa_handoff_rows_leaving",
        "Deliveries this node holds of tenants another node owns, as of the last handoff pass";
    /// Items this node took out of its queue and sent, not yet confirmed.
    handoff_staged: Gauge = Default::default(),
        "ankusa_handoff_staged",
        "Items this node took out of its queue for another node and has not had confirmed";
    /// Hooks handed over, by direction (`sent`, `received`, `taken_back`).
    handoff_hooks: Family<DirectionLabel, Counter> = Default::default(),
        "ankusa_handoff_hooks",
        "Hooks handed over between the nodes of the Relay, by direction (sent, received, taken_back)";
    /// Pushes to the object store, by outcome (`completed`, `failed`).
    backup_pushes: Family<OutcomeLabel, Counter> = Default::default(),
        "ankusa_backup_pushes",
        "Backups pushed to the object store, by outcome (completed, failed)";
    /// Bytes pushes uploaded (new table and blob files, and each backup's own).
    backup_uploaded_bytes: Counter = Default::default(),
        "ankusa_backup_uploaded_bytes",
        "Bytes backups uploaded to the object store (files the bucket did not hold yet)";
    /// When the checkpoint of the last completed push was taken (s since the epoch): the
    /// recovery point.
    backup_last_success: Gauge = Default::default(),
        "ankusa_backup_last_success_timestamp_seconds",
        "When the checkpoint of the last backup pushed to the object store was taken: every hook acked before it is in the bucket";
    /// How long pushes take, checkpoint to manifest.
    backup_push_seconds: Histogram = Histogram::new(exponential_buckets(0.05, 2.0, 14)),
        "ankusa_backup_push_seconds",
        "How long a push to the object store took, checkpoint to manifest";
    /// This node's tenant slots: its share of `tenants.max` and its loans.
    cluster_tenant_slots: Gauge = Default::default(),
        "ankusa_cluster_tenant_slots",
        "This node's tenant slots: its share of tenants.max, plus what other nodes lent it, less what it lent them";
    /// `tenants.max`, so a dashboard or an alert can divide by it.
    tenants_max: Gauge = Default::default(),
        "ankusa_tenants_max",
        "The node's tenants.max: a new tenant past it is refused";
    /// The console's sign-ins held.
    console_sessions: Gauge = Default::default(),
        "ankusa_console_sessions",
        "Console sign-ins this node holds (at most admin.console.max_sessions)";
    /// Console sign-ins by outcome (ok, refused, full).
    console_sign_ins: Family<OutcomeLabel, Counter> = Default::default(),
        "ankusa_console_sign_ins",
        "Console sign-ins by outcome: ok, refused (a token that is not valid), full (admin.console.max_sessions reached)";
    /// Tenants whose backlog history the console keeps.
    console_history_tenants: Gauge = Default::default(),
        "ankusa_console_history_tenants",
        "Tenants whose backlog history the console keeps for its sparklines (at most 10 000)";
    /// Tenants whose deliveries are held (`POST /v1/tenants/{t}/pause`).
    tenants_paused: Gauge = Default::default(),
        "ankusa_tenants_paused",
        "Tenants whose deliveries this node holds (paused)";
    /// Tenants with their own limits (`PUT /v1/tenants/{t}/limits`).
    tenant_limit_overrides: Gauge = Default::default(),
        "ankusa_tenant_limit_overrides",
        "Tenants with their own limits on this node (PUT /v1/tenants/{t}/limits)";
    /// Tenants' own endpoints stored here (`/v1/tenants/{t}/endpoints`).
    endpoints: Gauge = Default::default(),
        "ankusa_endpoints",
        "Tenants' own endpoints stored on this node (at most endpoints.max_total)";
    /// Tenants whose endpoint lists are held in memory.
    endpoint_cache_tenants: Gauge = Default::default(),
        "ankusa_endpoint_cache_tenants",
        "Tenants whose endpoint lists this node holds in memory (at most endpoints.cache_tenants)";
    /// Tenants a quota refused a hook of within the last 5 minutes.
    tenants_over_quota: Gauge = Default::default(),
        "ankusa_tenants_over_quota",
        "Tenants a quota (ingest rate, queued bytes) refused a hook of within the last 5 minutes";
}

/// The direction of a handoff (`sent` to a tenant's owner, `received` from another node).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DirectionLabel {
    pub direction: String,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// `sink`'s series, resolved once: a delivery then updates its atomics instead of
    /// looking up (and allocating) a labelled series in each family.
    pub fn sink_meters(&self, sink: &str) -> SinkMeters {
        let label = SinkLabel {
            sink: sink.to_owned(),
        };
        let attempts = AttemptLabel::ALL.map(|outcome| {
            self.delivery_attempts
                .get_or_create(&SinkOutcome {
                    sink: sink.to_owned(),
                    outcome: outcome.label().to_owned(),
                })
                .clone()
        });
        SinkMeters {
            attempts,
            duplicates: self.delivery_duplicates.get_or_create(&label).clone(),
            latency: self.delivery_latency.get_or_create(&label).clone(),
            limit: self.sink_limit.get_or_create(&label).clone(),
            breaker: self.sink_breaker.get_or_create(&label).clone(),
            requests: self.sink_requests.get_or_create(&label).clone(),
            queued: self.sink_queued.get_or_create(&label).clone(),
            recent: self
                .sink_recent
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .entry(sink.to_owned())
                .or_default()
                .clone(),
        }
    }

    /// One console sign-in, by its outcome.
    pub fn console_sign_in(&self, outcome: &str) {
        self.console_sign_ins
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// One configuration reload, by its outcome.
    pub fn config_reloaded(&self, outcome: &str) {
        self.config_reloads
            .get_or_create(&OutcomeLabel {
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// A delivery to `sink` that a filter of `source`'s route left out.
    pub fn route_filtered(&self, source: &str, sink: &str) {
        self.route_filtered
            .get_or_create(&SourceSinkLabels {
                source: source.to_owned(),
                sink: sink.to_owned(),
            })
            .inc();
    }

    /// A hook of `source` that no sink took.
    pub fn hook_filtered(&self, source: &str) {
        self.hooks_filtered
            .get_or_create(&SourceLabel {
                source: source.to_owned(),
            })
            .inc();
    }

    /// One request of `source` that failed verification for `reason`.
    pub fn verification_failed(&self, source: &str, reason: &str) {
        self.ingest_verification_failures
            .get_or_create(&VerifyLabels {
                source: source.to_owned(),
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Hooks `sources` accepted (202) since the start: their
    /// `ankusa_ingest_requests_total{outcome="accepted"}` series, summed.
    pub fn accepted<'a>(&self, sources: impl Iterator<Item = &'a str>) -> u64 {
        sources
            .map(|source| {
                self.ingest_requests
                    .get_or_create(&IngestLabels {
                        source: source.to_owned(),
                        outcome: "accepted".to_owned(),
                    })
                    .get()
            })
            .sum()
    }

    pub fn ingest(&self, source: &str, outcome: &str) {
        self.ingest_requests
            .get_or_create(&IngestLabels {
                source: source.to_owned(),
                outcome: outcome.to_owned(),
            })
            .inc();
    }

    /// Publishes one gauge reading; tenant names come from `name`.
    pub fn publish(
        &self,
        g: &gauges::GaugeReading,
        name: impl Fn(ankusa_keyspace::TenantOrd) -> String,
    ) {
        for f in ankusa_keyspace::CounterField::ALL {
            self.queue_state
                .get_or_create(&FieldLabel {
                    field: f.name().to_owned(),
                })
                .set(g.node.get(f));
        }
        self.oldest_due_age.set(g.oldest_due_age_ms as f64 / 1000.0);
        self.tenants.set(i64::from(g.tenants));
        // The per-tenant family holds only this tick's top tenants.
        self.tenant_pending.clear();
        for (ord, pending) in &g.top_pending {
            self.tenant_pending
                .get_or_create(&TenantLabel { tenant: name(*ord) })
                .set(*pending);
        }
    }

    /// The exposition text, OpenMetrics.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        // Writing to a String cannot fail.
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }

    /// The exposition text in the Prometheus text format (0.0.4): OpenMetrics names a
    /// counter family without its `_total` suffix, the older format with it, and has no
    /// `# EOF`. What a scraper gets unless it asks for OpenMetrics.
    pub fn encode_prometheus(&self) -> String {
        to_prometheus_text(&self.encode())
    }
}

/// Rewrites OpenMetrics text as Prometheus text format 0.0.4.
pub fn to_prometheus_text(om: &str) -> String {
    let counters: std::collections::HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len() + 64);
    for line in om.lines() {
        if line == "# EOF" {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "]
            .into_iter()
            .find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) && !name.ends_with("_total") {
                    out.push_str(&format!("{prefix}{name}_total {tail}"));
                } else {
                    out.push_str(line);
                }
            }
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn counters_are_named_with_their_total_suffix_in_prometheus_text() {
        let om = "# HELP a_requests Requests.\n# TYPE a_requests counter\na_requests_total{x=\"1\"} 2\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n# EOF\n";
        assert_eq!(
            super::to_prometheus_text(om),
            "# HELP a_requests_total Requests.\n# TYPE a_requests_total counter\na_requests_total{x=\"1\"} 2\n# HELP g A gauge.\n# TYPE g gauge\ng 1\n"
        );
    }

    #[test]
    fn accepted_hooks_are_the_sum_of_the_sources_accepted_series() {
        let m = super::Metrics::new();
        for (source, outcome) in [
            ("a", "accepted"),
            ("a", "accepted"),
            ("b", "accepted"),
            ("b", "rejected"),
        ] {
            m.ingest(source, outcome);
        }
        assert_eq!(m.accepted(["a", "b"].into_iter()), 3);
        assert_eq!(m.accepted(["b", "c"].into_iter()), 1);
    }

    #[test]
    fn every_attempt_outcome_counts_in_its_own_series() {
        use super::{AttemptLabel, Metrics};
        let m = Metrics::new();
        let meters = m.sink_meters("s");
        for (n, o) in AttemptLabel::ALL.into_iter().enumerate() {
            for _ in 0..=n {
                meters.attempt(o).inc();
            }
        }
        let text = m.encode();
        for (n, o) in AttemptLabel::ALL.into_iter().enumerate() {
            let line = format!(
                "ankusa_delivery_attempts_total{{sink=\"s\",outcome=\"{}\"}} {}",
                o.label(),
                n + 1
            );
            assert!(text.contains(&line), "{line} not in\n{text}");
        }
    }
}
