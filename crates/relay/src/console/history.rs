//! What the console's charts draw: samples the node takes every 10 s and keeps for an hour,
//! in memory (a restart starts them again).
//!
//! - The node: hooks accepted and delivered (counters, as rates between samples), its
//!   backlog (the counters' point reads): 360 samples.
//! - Each sink: its attempts by outcome and its latency buckets, 31 samples — rates, error
//!   rate and quantiles over the last five minutes.
//! - Tenants with work: their backlog every minute, 60 samples, for at most
//!   [`MAX_TENANTS`] tenants (`ankusa_console_history_tenants`); past that a tenant gets no
//!   sparkline until one leaves (an hour without work). The same read ranks them (the
//!   most pending, then scheduled, then dead, as `GET /v1/tenants` does): the console's
//!   tenants page shows the first [`TOP`] of that ranking with their counters read again,
//!   so its cost is a page's, not the ranking's (10⁴ counter reads, once a minute).

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;

use ankusa_config::{Config, SinkKind};
use ankusa_queue::engine::Store;
use ankusa_queue::{counters, QueueError};

use crate::metrics::{AttemptLabel, LatencyLog, Metrics};

/// How often the node is sampled.
pub const INTERVAL_MS: u64 = 10_000;
/// Node samples kept (an hour).
pub const NODE_SAMPLES: usize = 360;
/// Sink samples kept (five minutes and one).
pub const SINK_SAMPLES: usize = 31;
/// Tenant samples kept (an hour, one a minute).
pub const TENANT_SAMPLES: usize = 60;
/// Tenants whose backlog is kept.
pub const MAX_TENANTS: usize = 10_000;
/// Tenants kept in the ranking of tenants with work.
pub const TOP: usize = 500;

#[derive(Debug, Clone, Copy, Default)]
pub struct NodeSample {
    pub at_ms: u64,
    pub accepted: u64,
    pub delivered: u64,
    pub backlog: i64,
}

#[derive(Debug, Clone, Default)]
struct SinkSample {
    at_ms: u64,
    attempts: [u64; 4],
    buckets: Vec<u64>,
}

/// A sink's last five minutes.
#[derive(Debug, Clone, Default)]
pub struct SinkStats {
    pub attempts_per_s: f64,
    /// Attempts that did not deliver, of all attempts.
    pub error_rate: Option<f64>,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
}

#[derive(Debug, Default)]
struct Inner {
    node: VecDeque<NodeSample>,
    sinks: HashMap<String, VecDeque<SinkSample>>,
    tenants: HashMap<String, VecDeque<u64>>,
    /// Tenants with work, the most first, as of the last minute's read.
    top: Option<Vec<String>>,
    samples: u64,
}

/// The samples.
#[derive(Debug)]
pub struct History {
    inner: Mutex<Inner>,
    gauge: prometheus_client::metrics::gauge::Gauge,
}

fn push<T>(q: &mut VecDeque<T>, v: T, cap: usize) {
    if q.len() >= cap {
        q.pop_front();
    }
    q.push_back(v);
}

impl History {
    pub fn new(gauge: prometheus_client::metrics::gauge::Gauge) -> Self {
        History {
            inner: Mutex::new(Inner::default()),
            gauge,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// One sample (blocking: it reads the store's counters).
    pub fn sample(
        &self,
        store: &Store,
        metrics: &Metrics,
        config: &Config,
    ) -> Result<(), QueueError> {
        let now = ankusa_keyspace::now_ms();
        let mut delivered = 0;
        let mut sinks = Vec::new();
        for s in &config.sinks {
            if s.kind == SinkKind::Pull {
                delivered += metrics.pull.sink(&s.id).acked.get();
                continue;
            }
            let m = metrics.sink_meters(&s.id);
            let attempts = AttemptLabel::ALL.map(|o| m.attempt(o).get());
            delivered += attempts[AttemptLabel::Delivered as usize];
            sinks.push((
                s.id.clone(),
                SinkSample {
                    at_ms: now,
                    attempts,
                    buckets: m.recent.read(),
                },
            ));
        }
        let c = counters::node(store)?;
        let node = NodeSample {
            at_ms: now,
            accepted: metrics.accepted(config.sources.iter().map(|s| s.id.as_str())),
            delivered,
            backlog: c.pending + c.scheduled + c.inflight,
        };
        let minute = self.lock().samples.is_multiple_of(60_000 / INTERVAL_MS);
        let tenant_backlogs = if minute {
            Some(tenant_backlogs(store)?)
        } else {
            None
        };
        let mut g = self.lock();
        g.samples += 1;
        push(&mut g.node, node, NODE_SAMPLES);
        g.sinks
            .retain(|id, _| config.sinks.iter().any(|s| &s.id == id));
        for (id, s) in sinks {
            push(g.sinks.entry(id).or_default(), s, SINK_SAMPLES);
        }
        if let Some((mut now_backlog, top)) = tenant_backlogs {
            g.top = Some(top);
            for (t, q) in g.tenants.iter_mut() {
                push(q, now_backlog.remove(t).unwrap_or(0), TENANT_SAMPLES);
            }
            g.tenants.retain(|_, q| q.iter().any(|v| *v > 0));
            for (t, b) in now_backlog {
                if g.tenants.len() >= MAX_TENANTS {
                    break;
                }
                push(g.tenants.entry(t).or_default(), b, TENANT_SAMPLES);
            }
            self.gauge.set(g.tenants.len() as i64);
        }
        Ok(())
    }

    /// Tenants with work, the most first (at most [`TOP`]), as of the last minute's read;
    /// `None` before the first.
    pub fn top(&self) -> Option<Vec<String>> {
        self.lock().top.clone()
    }

    /// The node's samples, oldest first.
    pub fn node(&self) -> Vec<NodeSample> {
        self.lock().node.iter().copied().collect()
    }

    /// A tenant's backlog, a sample a minute, oldest first (empty: none kept).
    pub fn tenant(&self, tenant: &str) -> Vec<u64> {
        self.lock()
            .tenants
            .get(tenant)
            .map(|q| q.iter().copied().collect())
            .unwrap_or_default()
    }

    /// A sink's last five minutes (`None` before two samples).
    pub fn sink(&self, sink: &str) -> Option<SinkStats> {
        let g = self.lock();
        let q = g.sinks.get(sink)?;
        let (first, last) = (q.front()?, q.back()?);
        let span_ms = last.at_ms.saturating_sub(first.at_ms);
        if span_ms == 0 {
            return None;
        }
        let d: Vec<u64> = (0..4)
            .map(|i| last.attempts[i].saturating_sub(first.attempts[i]))
            .collect();
        let total: u64 = d.iter().sum();
        Some(SinkStats {
            attempts_per_s: total as f64 * 1000.0 / span_ms as f64,
            error_rate: (total > 0)
                .then(|| 1.0 - d[AttemptLabel::Delivered as usize] as f64 / total as f64),
            p50_ms: LatencyLog::quantile_ms(&first.buckets, &last.buckets, 0.50),
            p99_ms: LatencyLog::quantile_ms(&first.buckets, &last.buckets, 0.99),
        })
    }
}

/// Every tenant with due rows now or later, and its backlog (the active index, bounded as
/// the gauges' read is); and the tenants with work ranked as `GET /v1/tenants` ranks them
/// (those with dead rows too: a skip scan of their index, as bounded).
type TenantRead = (HashMap<String, u64>, Vec<String>);

fn tenant_backlogs(store: &Store) -> Result<TenantRead, QueueError> {
    let mut ranked = crate::admin::tenants::with_work(store, [])?;
    let backlogs = ranked
        .iter()
        .map(|(name, _, c)| {
            (
                name.clone(),
                (c.pending + c.scheduled + c.inflight).max(0) as u64,
            )
        })
        .filter(|(_, b)| *b > 0)
        .collect();
    ranked.truncate(TOP);
    Ok((backlogs, ranked.into_iter().map(|(n, _, _)| n).collect()))
}

/// Rates per second between consecutive samples of `f`.
pub fn rates(samples: &[NodeSample], f: impl Fn(&NodeSample) -> u64) -> Vec<f64> {
    samples
        .windows(2)
        .map(|w| {
            let dt = w[1].at_ms.saturating_sub(w[0].at_ms).max(1) as f64 / 1000.0;
            f(&w[1]).saturating_sub(f(&w[0])) as f64 / dt
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use crate::metrics::LatencyLog;

    #[test]
    fn latency_buckets_are_ordered_and_quantiles_land_within_a_bucket() {
        let mut last = 0;
        for us in [0u64, 1, 3, 4, 5, 7, 8, 100, 1_000, 65_000, 10_000_000] {
            let b = LatencyLog::bucket_of(us);
            assert!(b >= last, "{us}");
            assert!(
                LatencyLog::lower_us(b) <= us && us < LatencyLog::lower_us(b + 1),
                "{us}"
            );
            last = b;
        }
        let log = LatencyLog::default();
        let before = log.read();
        for ms in 1..=100u64 {
            log.observe(std::time::Duration::from_millis(ms));
        }
        let after = log.read();
        let p50 = LatencyLog::quantile_ms(&before, &after, 0.5).unwrap();
        let p99 = LatencyLog::quantile_ms(&before, &after, 0.99).unwrap();
        assert!((50.0..=50.0 * 1.26).contains(&p50), "{p50}");
        assert!((99.0..=99.0 * 1.26).contains(&p99), "{p99}");
        assert_eq!(LatencyLog::quantile_ms(&after, &after, 0.5), None);
    }
}
