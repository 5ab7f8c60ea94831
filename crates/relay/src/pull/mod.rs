//! The claim gateway: consumers lease the hooks of pull sinks over HTTP.
//!
//! A pull sink's deliveries are due rows like any other; the dispatch tick parks them for
//! consumers (`queue::deliveries::park`) instead of sending them. A consumer's claim
//! ([`Gateway::claim`]) takes waiting rows round robin across the tenants in its scope and
//! moves each to inflight with its lease in one unit; an ack, a nack or the lease's expiry
//! is the attempt's outcome, committed through the same outcome path as a push delivery's
//! (retry schedule, dead-letter past `retry.max_attempts`, counters, hook log), together
//! with the lease it consumes. See docs/pull.md.
//!
//! | part | where |
//! |---|---|
//! | consumers, scopes, bounds | [`Gateway`], [`Consumer`] |
//! | claim, settle, extend | here, on blocking threads |
//! | the lease book: leases out per sink, expiry order | [`book`] |
//! | the HTTP calls on the ingest listener | [`http`] |

pub mod book;
pub mod http;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_config::{Config, ConfigError, RetryConfig};
use ankusa_keyspace::{AtMs, Cf, EventKind, Seq, SinkIdx, TenantOrd};
use ankusa_queue::deliveries::{self, InflightRow, Lease, PulledRow, Tx};
use ankusa_queue::hints::DueHints;
use ankusa_queue::hooklog;
use ankusa_queue::QueueError;
use ankusa_records::{DeliveryRow, Envelope, ErrorClass};
use ankusa_store::Store;
use subtle::ConstantTimeEq;

use crate::dispatch::delivery::{Attempt, Deliverer, PullWake, Verdict};
use crate::dispatch::parked::Visit;
use crate::dispatch::paused::Paused;
use crate::dispatch::pipeline::outcomes::{outcome_ops, Finished};
use crate::metrics::Metrics;
use ankusa_api::pull::ConflictReason;
use book::Book;

/// A consumer, as its token resolved.
#[derive(Debug)]
pub struct Consumer {
    pub name: String,
    /// Its name, as the lease book counts its leases.
    key: Arc<str>,
    /// The SHA-256 of its token.
    digest: [u8; 32],
    sinks: HashSet<String>,
    /// `None`: every tenant.
    tenants: Option<HashSet<String>>,
    /// Its own lease quota per sink (`None`: its share of the sink's).
    max_leases: Option<usize>,
}

impl Consumer {
    pub fn may_claim_from(&self, sink: &str) -> bool {
        self.sinks.contains(sink)
    }

    /// The tenants it sees (`None`: every tenant).
    pub fn tenants(&self) -> Option<&HashSet<String>> {
        self.tenants.as_ref()
    }
}

/// The gateway's settings, from `pull` and the pull sinks.
#[derive(Debug, Clone)]
pub struct Settings {
    pub lease_ms: u64,
    pub max_claim: usize,
    pub max_claim_bytes: u64,
    pub max_wait_ms: u64,
    /// Per pull sink: its lease when the claim names none, and the most leases out.
    pub sinks: HashMap<String, SinkSettings>,
    /// Rows per round-robin turn, by tenant id (`dispatch.tenant_weights`).
    pub weights: std::collections::BTreeMap<String, u32>,
    /// The longest a lease lives from its claim, extensions included.
    pub max_lease_lifetime_ms: u64,
    /// Claims one consumer may have waiting at once.
    pub max_waiting_claims: usize,
}

#[derive(Debug, Clone, Copy)]
pub struct SinkSettings {
    pub lease_ms: u64,
    pub max_leases: usize,
    /// A consumer's quota on the sink when it sets none: the sink's leases shared
    /// equally among the consumers that may claim from it.
    pub consumer_share: usize,
    /// The most leases of one tenant's hooks.
    pub tenant_max_leases: usize,
}

impl Settings {
    pub fn from_config(c: &Config) -> Self {
        let sinks = c
            .sinks
            .iter()
            .filter(|s| s.kind == ankusa_config::SinkKind::Pull)
            .map(|s| {
                let max_leases = s.max_inflight.unwrap_or(c.pull.max_leases);
                let consumers = c
                    .pull
                    .consumers
                    .iter()
                    .filter(|k| k.sinks.contains(&s.id))
                    .count()
                    .max(1);
                (
                    s.id.clone(),
                    SinkSettings {
                        lease_ms: s.lease_ms.unwrap_or(c.pull.lease_ms),
                        max_leases,
                        consumer_share: (max_leases / consumers).max(1),
                        tenant_max_leases: c.pull.tenant_max_leases.unwrap_or(max_leases),
                    },
                )
            })
            .collect();
        Settings {
            lease_ms: c.pull.lease_ms,
            max_claim: c.pull.max_claim,
            max_claim_bytes: c.pull.max_claim_bytes,
            max_wait_ms: c.pull.max_wait_ms,
            sinks,
            weights: c.dispatch.tenant_weights.clone(),
            max_lease_lifetime_ms: c.pull.max_lease_lifetime_ms,
            max_waiting_claims: c.pull.max_waiting_claims,
        }
    }
}

/// What a claim asks for, within the settings' bounds (checked by the caller).
#[derive(Debug, Clone, Copy)]
pub struct Ask {
    pub max: usize,
    pub max_bytes: u64,
    pub lease_ms: u64,
}

/// A hook handed to a consumer under a lease.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub lease: String,
    pub deadline: AtMs,
    pub attempt: u32,
    pub envelope: Arc<Envelope>,
    pub sink: String,
}

/// Why a lease was not settled (or extended).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Conflict {
    /// Its deadline passed: the delivery is (or is about to be) due again.
    Expired,
    /// Not a lease this consumer holds on this sink: settled already, replaced by a later
    /// claim, malformed, another tenant's, or revoked (its tenant paused or erased).
    Unknown,
    /// An extension past `pull.max_lease_lifetime_ms` from the claim: not extended (the
    /// lease keeps its deadline; ack or nack it before).
    Lifetime,
}

impl Conflict {
    /// The reason a settle's answer gives.
    pub fn reason(self) -> ConflictReason {
        match self {
            Conflict::Expired => ConflictReason::Expired,
            Conflict::Unknown => ConflictReason::Unknown,
            Conflict::Lifetime => ConflictReason::Lifetime,
        }
    }
}

/// How a consumer settles leases.
#[derive(Debug, Clone, Copy)]
pub enum Settle {
    Ack,
    Nack { retry_after: Option<Duration> },
}

/// The claim gateway of one node.
pub struct Gateway {
    store: Arc<Store>,
    pub cluster: Arc<crate::cluster::Cluster>,
    deliverer: Deliverer,
    consumers: arc_swap::ArcSwap<Vec<Arc<Consumer>>>,
    settings: arc_swap::ArcSwap<Settings>,
    paused: Arc<Paused>,
    retry: RetryConfig,
    log: bool,
    hints: Arc<DueHints>,
    metrics: Arc<Metrics>,
    book: Mutex<Book>,
    /// Per sink: the tenant the next claim of every tenant starts at (round robin).
    cursors: Mutex<HashMap<String, TenantOrd>>,
    /// Wakes the expiry task when a lease with an earlier deadline is made.
    expiry_wake: tokio::sync::Notify,
    /// Wakes waiting claims when a reload installs new consumers (theirs may be gone).
    reloaded: tokio::sync::Notify,
    /// Claims waiting per consumer.
    waiting: Mutex<HashMap<Arc<str>, usize>>,
}

/// A waiting claim, counted in its consumer's `pull.max_waiting_claims` until dropped.
pub struct Waiting<'a> {
    gateway: &'a Gateway,
    consumer: Arc<str>,
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        let mut w = self
            .gateway
            .waiting
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(n) = w.get_mut(&self.consumer) {
            *n -= 1;
            if *n == 0 {
                w.remove(&self.consumer);
            }
        }
        self.gateway.metrics.pull.waiting.dec();
    }
}

impl std::fmt::Debug for Gateway {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gateway").finish_non_exhaustive()
    }
}

/// Resolves the consumers' tokens.
pub fn consumers(c: &Config) -> Result<Vec<Arc<Consumer>>, ConfigError> {
    c.pull
        .consumers
        .iter()
        .enumerate()
        .map(|(i, k)| {
            Ok(Arc::new(Consumer {
                name: k.name.clone(),
                key: Arc::from(k.name.as_str()),
                max_leases: k.max_leases,
                digest: {
                    use sha2::Digest;
                    let secret = k.secret.resolve(&format!("pull.consumers[{i}].secret"))?;
                    sha2::Sha256::digest(&secret).into()
                },
                sinks: k.sinks.iter().cloned().collect(),
                tenants: k.tenants.as_ref().map(|t| t.iter().cloned().collect()),
            }))
        })
        .collect()
}

/// The parts a gateway works with.
pub struct Parts {
    pub store: Arc<Store>,
    /// The Relay's nodes: a lease id names the node that holds it.
    pub cluster: Arc<crate::cluster::Cluster>,
    pub deliverer: Deliverer,
    pub paused: Arc<Paused>,
    pub hints: Arc<DueHints>,
    pub metrics: Arc<Metrics>,
}

/// Most tenants one claim seeks through for rows (each costs a seek, rows or not).
const MAX_TENANT_SEEKS: usize = 256;

impl Gateway {
    pub fn new(config: &Config, parts: Parts) -> Result<Arc<Gateway>, ConfigError> {
        Ok(Arc::new(Gateway {
            store: parts.store,
            cluster: parts.cluster,
            deliverer: parts.deliverer,
            consumers: arc_swap::ArcSwap::from_pointee(consumers(config)?),
            settings: arc_swap::ArcSwap::from_pointee(Settings::from_config(config)),
            paused: parts.paused,
            retry: config.retry.clone(),
            log: config.hook_log.enabled,
            hints: parts.hints,
            metrics: parts.metrics,
            book: Mutex::new(Book::default()),
            cursors: Mutex::new(HashMap::new()),
            expiry_wake: tokio::sync::Notify::new(),
            reloaded: tokio::sync::Notify::new(),
            waiting: Mutex::new(HashMap::new()),
        }))
    }

    /// Reads the leases a stop or a crash left (boot recovery keeps them) into the book:
    /// each ends at its deadline, or with its consumer's ack. Returns how many.
    pub fn load(&self) -> Result<usize, QueueError> {
        self.rescan()?;
        let leases = deliveries::leases(&self.store)?;
        let envs = envelopes(&self.store, leases.iter().map(|(seq, ..)| *seq))?;
        let keys: Vec<(Seq, SinkIdx)> = leases.iter().map(|(s, i, _)| (*s, *i)).collect();
        let states = delivery_rows(&self.store, &keys)?;
        let mut book = self.book();
        for (((seq, idx, lease), env), state) in leases.iter().zip(envs).zip(states) {
            // A hook that is gone or unreadable is settled at the deadline all the same.
            let env = env.ok();
            let sink = env
                .as_ref()
                .and_then(|e| e.sinks.get(idx.0 as usize).cloned())
                .unwrap_or_default();
            // Its consumer is not stored: it counts in no consumer's quota.
            let holder = book::Holder {
                consumer: None,
                ord: state.map_or(TenantOrd(0), |s| s.ord),
                hook: env.as_ref().map(hook_name),
            };
            book.insert(&sink, *seq, *idx, lease, holder);
        }
        let counts = book.counts();
        drop(book);
        for (sink, n) in counts {
            self.metrics.pull.sink(&sink).leases.set(n as i64);
        }
        Ok(leases.len())
    }

    /// A reload: new consumers and bounds (leases out keep their deadlines).
    pub fn install(&self, consumers: Vec<Arc<Consumer>>, settings: Settings) {
        self.consumers.store(Arc::new(consumers));
        self.settings.store(Arc::new(settings));
        self.reloaded.notify_waiters();
    }

    /// One more waiting claim of `consumer`, or `None` at its `pull.max_waiting_claims`.
    pub fn begin_wait(&self, consumer: &Consumer) -> Option<Waiting<'_>> {
        let max = self.settings().max_waiting_claims;
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let n = w.entry(consumer.key.clone()).or_default();
        if *n >= max {
            return None;
        }
        *n += 1;
        self.metrics.pull.waiting.inc();
        Some(Waiting {
            gateway: self,
            consumer: consumer.key.clone(),
        })
    }

    /// Whether hooks of `sink` wait here for `consumer` (what another node's waiting claim
    /// asks).
    pub fn has_waiting(&self, sink: &str, consumer: &Consumer) -> Result<bool, QueueError> {
        // A look, not a claim: the round robin's cursor stays where the last claim left it.
        Ok(!self.gather(sink, consumer, 1, false)?.is_empty())
    }

    pub fn settings(&self) -> Arc<Settings> {
        self.settings.load_full()
    }

    /// The consumer whose token this is: compared by SHA-256 digest, every consumer each
    /// time, so the comparison says nothing of a token's length or which one matched.
    pub fn consumer(&self, token: &[u8]) -> Option<Arc<Consumer>> {
        use sha2::Digest;
        let given: [u8; 32] = sha2::Sha256::digest(token).into();
        let mut found = None;
        for c in self.consumers.load().iter() {
            if bool::from(c.digest.ct_eq(&given)) && found.is_none() {
                found = Some(c.clone());
            }
        }
        found
    }

    fn book(&self) -> std::sync::MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This node's name in a Relay of several nodes (the lease ids it makes carry it).
    pub fn node(&self) -> Option<&str> {
        self.cluster.is_multi().then(|| self.cluster.me()).flatten()
    }

    /// Leases out now, per sink.
    pub fn leases_out(&self) -> BTreeMap<String, usize> {
        self.book().counts()
    }

    /// Claims up to `ask.max` waiting hooks of `sink` for `consumer`, leased for
    /// `ask.lease_ms`: round robin across the tenants it sees, one row per tenant a turn,
    /// oldest first within a tenant. Nothing waiting: empty (the caller long-polls).
    pub fn claim(
        &self,
        sink: &str,
        consumer: &Consumer,
        ask: Ask,
    ) -> Result<Vec<Claimed>, QueueError> {
        let settings = self.settings();
        let Some(sink_settings) = settings.sinks.get(sink).copied() else {
            return Ok(Vec::new());
        };
        // The sink's room, and the consumer's within its quota: no consumer holds another's
        // share.
        let (room, mine) = {
            let book = self.book();
            let quota = consumer.max_leases.unwrap_or(sink_settings.consumer_share);
            (
                sink_settings.max_leases.saturating_sub(book.count(sink)),
                quota.saturating_sub(book.consumer_count(sink, &consumer.key)),
            )
        };
        let want = ask.max.min(room).min(mine);
        if want == 0 {
            if mine == 0 {
                self.metrics.pull.refused(sink, "consumer_quota");
            }
            return Ok(Vec::new());
        }
        let store = &*self.store;
        let by_tenant = self.gather(sink, consumer, want, true)?;
        // Each tenant's room under `pull.tenant_max_leases`.
        let tenant_room: Vec<usize> = {
            let book = self.book();
            by_tenant
                .iter()
                .map(|(v, _)| {
                    sink_settings
                        .tenant_max_leases
                        .saturating_sub(book.tenant_count(sink, v.ord))
                })
                .collect()
        };
        // A tenant's weight (`dispatch.tenant_weights`): its rows a turn, as in push.
        let weights: Vec<usize> = if settings.weights.is_empty() {
            vec![1; by_tenant.len()]
        } else {
            by_tenant
                .iter()
                .map(|(v, _)| {
                    let name = ankusa_queue::tenants::name(store, v.ord)?;
                    Ok(name
                        .and_then(|n| settings.weights.get(&n).copied())
                        .unwrap_or(1)
                        .max(1) as usize)
                })
                .collect::<Result<_, QueueError>>()?
        };
        // Round robin: a tenant's weight in rows a turn (one by default), until `want` rows
        // or the bytes (the first row always goes, whatever its size).
        let mut picked: Vec<&PulledRow> = Vec::new();
        let mut bytes = 0u64;
        let mut taken = vec![0usize; by_tenant.len()];
        'turns: loop {
            let mut any = false;
            for (i, (_, rows)) in by_tenant.iter().enumerate() {
                for _ in 0..weights[i] {
                    if taken[i] >= tenant_room[i] {
                        break;
                    }
                    let Some(row) = rows.get(taken[i]) else { break };
                    any = true;
                    let size = u64::from(row.size);
                    if !picked.is_empty() && bytes + size > ask.max_bytes {
                        break 'turns;
                    }
                    bytes += size;
                    picked.push(row);
                    taken[i] += 1;
                    if picked.len() >= want {
                        break 'turns;
                    }
                }
            }
            if !any {
                break;
            }
        }
        // Each tenant's floor moves up to the last row this claim takes there.
        for ((v, rows), n) in by_tenant.iter().zip(&taken) {
            if let Some(r) = n.checked_sub(1).and_then(|i| rows.get(i)) {
                let key = (r.key.at, r.key.seq, r.key.sink);
                self.deliverer.pull_wake.claimed(sink, *v, Some(key));
            }
        }
        if picked.is_empty() {
            return Ok(Vec::new());
        }
        let states = delivery_rows(
            store,
            &picked
                .iter()
                .map(|r| (r.key.seq, r.key.sink))
                .collect::<Vec<_>>(),
        )?;
        let envs = envelopes(store, picked.iter().map(|r| r.key.seq))?;
        let now = ankusa_keyspace::now_ms();
        let deadline = AtMs(now + ask.lease_ms);
        let hash = deliveries::sink_hash(sink);
        let mut tx = Tx::new();
        let mut leases = Vec::with_capacity(picked.len());
        for ((row, state), env) in picked.iter().zip(&states).zip(&envs) {
            let attempt = state.as_ref().map_or(0, |s| s.attempts) + 1;
            let lease = Lease {
                nonce: rand::random::<u64>(),
                deadline,
                claimed_at: AtMs(now),
                attempt,
                sinks: env.as_ref().map_or(0, |e| e.sinks.len() as u16),
                sink_hash: hash,
            };
            deliveries::lease(&mut tx, row, &lease);
            if self.log {
                let ev = hooklog::requeued(EventKind::Claimed, AtMs(now), attempt, deadline);
                hooklog::record(&mut tx, store, row.key.seq, row.key.sink, &ev)?;
            }
            leases.push(lease);
        }
        let committed = tx.commit(store, false)?;
        let mut out = Vec::with_capacity(picked.len());
        let mut unsendable = Vec::new();
        {
            let mut book = self.book();
            for (((row, lease), env), moved) in
                picked.iter().zip(leases).zip(envs).zip(committed.moved)
            {
                if !moved {
                    continue;
                }
                let holder = book::Holder {
                    consumer: Some(consumer.key.clone()),
                    ord: row.key.ord,
                    hook: env.as_ref().ok().map(hook_name),
                };
                book.insert(sink, row.key.seq, row.key.sink, &lease, holder);
                match env {
                    Ok(env) => out.push(Claimed {
                        lease: lease_id(self.node(), row.key.seq, row.key.sink, lease.nonce),
                        deadline: lease.deadline,
                        attempt: lease.attempt,
                        envelope: Arc::new(env),
                        sink: sink.to_owned(),
                    }),
                    Err(e) => unsendable.push((row.key.seq, row.key.sink, lease, e)),
                }
            }
        }
        self.expiry_wake.notify_one();
        // A hook that is gone is dropped as an orphan; one that does not decode goes to
        // the DLQ with the error — as the push path does, never handed out.
        for (seq, sink_idx, lease, why) in unsendable {
            self.settle_one(sink, seq, sink_idx, lease, Outcome::Unsendable(why))?;
        }
        for c in &out {
            let name = || Some(hook_name(&c.envelope));
            step_span("lease", &name, sink, c.attempt, &consumer.name);
        }
        let meters = self.metrics.pull.sink(sink);
        meters.claimed.inc_by(out.len() as u64);
        meters.leases.set(self.book().count(sink) as i64);
        Ok(out)
    }

    /// The tenants a claim of `sink` looks at and their oldest waiting rows: the tenants
    /// the tick's index lists for the sink ([`crate::dispatch::parked`]), from the sink's
    /// round-robin cursor (at most [`MAX_TENANT_SEEKS`]), or the consumer's own tenants;
    /// each read from its floor. One row each, then as many more as the round robin can
    /// take when fewer than `want` tenants have rows. `advance`: a claim's read, which moves
    /// the cursor past the last tenant it looked at (a look that claims nothing does not).
    fn gather(
        &self,
        sink: &str,
        consumer: &Consumer,
        want: usize,
        advance: bool,
    ) -> Result<Vec<(Visit, Vec<PulledRow>)>, QueueError> {
        let store = &*self.store;
        let index = &self.deliverer.pull_wake;
        let only: Option<Vec<TenantOrd>> = match &consumer.tenants {
            None => None,
            Some(names) => {
                let mut ords = Vec::with_capacity(names.len());
                for name in names {
                    if let Some(ord) = ankusa_queue::tenants::ord(store, name)? {
                        ords.push(ord);
                    }
                }
                ords.sort();
                Some(ords)
            }
        };
        let start = self
            .cursors
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(sink)
            .copied()
            .unwrap_or(TenantOrd(1));
        let mut out = Vec::new();
        let mut last = None;
        for v in index.tenants(sink, start, MAX_TENANT_SEEKS, only.as_deref()) {
            if out.len() >= want {
                break;
            }
            last = Some(v.ord);
            if self.paused.holds(v.ord) {
                continue;
            }
            let rows = deliveries::waiting_pulls_from(store, v.ord, sink, v.floor, 1)?;
            if rows.is_empty() {
                index.claimed(sink, v, None);
            } else {
                out.push((v, rows));
            }
        }
        if let (true, Some(last), None) = (advance, last, &only) {
            self.cursors
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(sink.to_owned(), TenantOrd(last.0.saturating_add(1)));
        }
        // Fewer tenants than rows wanted: read more of each, a fair share at a time, and
        // again for those that had more while others ran short (a few passes at most).
        let mut limit = vec![1usize; out.len()];
        for _ in 0..4 {
            let have: usize = out.iter().map(|(_, r)| r.len()).sum();
            let more: Vec<usize> = (0..out.len())
                .filter(|i| out[*i].1.len() >= limit[*i])
                .collect();
            if have >= want || more.is_empty() {
                break;
            }
            let extra = (want - have).div_ceil(more.len());
            for i in more {
                limit[i] += extra;
                let (v, rows) = &mut out[i];
                *rows = deliveries::waiting_pulls_from(store, v.ord, sink, v.floor, limit[i])?;
            }
        }
        Ok(out)
    }

    /// Lists, in the tick's index of every pull sink, each tenant with waiting rows that
    /// the index does not list (a boot; and every [`PullWake::RESCAN`], for anything a lost
    /// hint hid). One seek per tenant with waiting rows.
    pub fn rescan(&self) -> Result<usize, QueueError> {
        let mut tenants = Vec::new();
        let mut from = TenantOrd(1);
        while let Some(ord) = deliveries::next_pull_tenant(&self.store, from)? {
            tenants.push(ord);
            if ord.0 >= TenantOrd::MAX_REAL {
                break;
            }
            from = TenantOrd(ord.0 + 1);
        }
        for sink in self.settings().sinks.keys() {
            self.deliverer
                .pull_wake
                .listed(sink, tenants.iter().copied());
        }
        Ok(tenants.len())
    }

    /// Settles leases of `sink` for `consumer`: each is acked (delivered) or nacked
    /// (retried on the schedule, dead-lettered past the attempts), if it is still the
    /// lease the consumer holds. Committed (not synced, as a push outcome) before it
    /// returns.
    pub fn settle(
        &self,
        sink: &str,
        consumer: &Consumer,
        leases: &[String],
        how: Settle,
    ) -> Result<Vec<Option<Conflict>>, QueueError> {
        let now = ankusa_keyspace::now_ms();
        let with_hook = matches!(how, Settle::Nack { .. });
        let held = self.held(sink, consumer, leases, now, with_hook)?;
        let store = &*self.store;
        let rows: Vec<(InflightRow, usize)> = held
            .iter()
            .flatten()
            .filter(|_| matches!(how, Settle::Ack))
            .map(|h| (h.row, usize::from(h.lease.sinks)))
            .collect();
        let mut last = deliveries::last_needs(store, &rows)?.into_iter();
        let mut tx = Tx::new();
        let mut retries = Vec::new();
        let mut units = Vec::new();
        for (i, h) in held.iter().enumerate() {
            let Some(h) = h else { continue };
            let attempt = match how {
                Settle::Ack => Attempt {
                    verdict: Verdict::Delivered,
                    status: 0,
                    class: None,
                    error: String::new(),
                    latency: Duration::from_millis(now.saturating_sub(h.lease.claimed_at.0)),
                },
                Settle::Nack { retry_after } => Attempt {
                    verdict: Verdict::Retry { retry_after },
                    status: 0,
                    class: Some(ErrorClass::Nacked),
                    error: format!("nacked by consumer {}", consumer.name),
                    latency: Duration::from_millis(now.saturating_sub(h.lease.claimed_at.0)),
                },
            };
            let kind = match how {
                Settle::Ack => EventKind::Acked,
                Settle::Nack { .. } => EventKind::Nacked,
            };
            let takes_hook = matches!(how, Settle::Ack) && last.next().unwrap_or(false);
            let s = self.outcome(&mut tx, sink, h, &attempt, kind, takes_hook, now)?;
            retries.extend(s);
            units.push(i);
        }
        let committed = tx.commit(store, false)?;
        let mut out = Vec::with_capacity(held.len());
        for (i, h) in held.iter().enumerate() {
            out.push(match h {
                Some(_) => None,
                None => Some(self.why_not(&leases[i], now)?),
            });
        }
        let meters = self.metrics.pull.sink(sink);
        let mut settled = 0u64;
        {
            let mut book = self.book();
            for (i, moved) in units.into_iter().zip(committed.moved) {
                let Some(h) = &held[i] else { continue };
                if moved {
                    book.remove(h.row.key.seq, h.row.key.sink, h.lease.nonce);
                    meters.held.observe(held_for(&h.lease, now));
                    settled += 1;
                } else {
                    out[i] = Some(Conflict::Unknown);
                }
            }
        }
        self.hints.add_later(retries);
        match how {
            Settle::Ack => meters.acked.inc_by(settled),
            Settle::Nack { .. } => meters.nacked.inc_by(settled),
        };
        if settled > 0 {
            // Leases gave their places back: a claim waiting at a quota may take rows now.
            self.deliverer.pull_wake.of(sink).notify_waiters();
        }
        meters.leases.set(self.book().count(sink) as i64);
        Ok(out)
    }

    /// Extends leases of `sink` to `lease_ms` from now.
    pub fn extend(
        &self,
        sink: &str,
        consumer: &Consumer,
        leases: &[String],
        lease_ms: u64,
    ) -> Result<(Vec<Option<Conflict>>, AtMs), QueueError> {
        let now = ankusa_keyspace::now_ms();
        let held = self.held(sink, consumer, leases, now, false)?;
        let deadline = AtMs(now + lease_ms);
        let lifetime = self.settings().max_lease_lifetime_ms;
        let mut tx = Tx::new();
        let mut units = Vec::new();
        let mut past_lifetime = HashSet::new();
        for (i, h) in held.iter().enumerate() {
            let Some(h) = h else { continue };
            // A lease lives at most `pull.max_lease_lifetime_ms` from its claim: a consumer
            // cannot keep a hook (or an erase waiting) forever by extending it.
            if deadline.0 > h.lease.claimed_at.0.saturating_add(lifetime) {
                past_lifetime.insert(i);
                continue;
            }
            let new = Lease {
                deadline,
                ..h.lease
            };
            deliveries::extend_lease(&mut tx, h.row.key.seq, h.row.key.sink, &h.lease, &new);
            units.push((i, new));
        }
        let committed = tx.commit(&self.store, false)?;
        let mut out = Vec::with_capacity(held.len());
        for (i, h) in held.iter().enumerate() {
            out.push(match h {
                Some(_) if past_lifetime.contains(&i) => Some(Conflict::Lifetime),
                Some(_) => None,
                None => Some(self.why_not(&leases[i], now)?),
            });
        }
        let mut book = self.book();
        for ((i, new), moved) in units.into_iter().zip(committed.moved) {
            let Some(h) = &held[i] else { continue };
            if moved {
                let holder = book::Holder {
                    consumer: Some(consumer.key.clone()),
                    ord: h.row.key.ord,
                    hook: None,
                };
                book.insert(sink, h.row.key.seq, h.row.key.sink, &new, holder);
            } else {
                out[i] = Some(Conflict::Unknown);
            }
        }
        Ok((out, deadline))
    }

    /// For each lease id: the lease and its inflight row (and, `with_hook`, its hook), if
    /// the consumer holds it on this sink and it has not expired.
    fn held(
        &self,
        sink: &str,
        consumer: &Consumer,
        leases: &[String],
        now: u64,
        with_hook: bool,
    ) -> Result<Vec<Option<Held>>, QueueError> {
        let store = &*self.store;
        let ids: Vec<Option<(Seq, SinkIdx, u64)>> = leases
            .iter()
            .map(|l| {
                parse_lease_id(l)
                    .filter(|p| p.node == self.node())
                    .map(|p| p.key())
            })
            .collect();
        let keys: Vec<(Seq, SinkIdx)> = ids.iter().flatten().map(|(s, k, _)| (*s, *k)).collect();
        let found = deliveries::read_leases(store, &keys)?;
        let states = delivery_rows(store, &keys)?;
        let mut envs = if with_hook {
            envelopes(store, keys.iter().map(|(s, _)| *s))?
        } else {
            Vec::new()
        }
        .into_iter();
        // A tenant's consumer holds only its tenants' leases.
        let sees: Option<HashSet<TenantOrd>> = match &consumer.tenants {
            None => None,
            Some(names) => {
                let mut ords = HashSet::new();
                for n in names {
                    ords.extend(ankusa_queue::tenants::ord(store, n)?);
                }
                Some(ords)
            }
        };
        let hash = deliveries::sink_hash(sink);
        // The hooks' ids and tenants, as this process's claims read them (a settle's span).
        let names: Vec<Option<Arc<book::HookName>>> = {
            let book = self.book();
            keys.iter().map(|(s, i)| book.hook(*s, *i)).collect()
        };
        let mut names = names.into_iter();
        let mut found = found.into_iter().zip(states);
        let mut out = Vec::with_capacity(ids.len());
        for id in &ids {
            let Some((seq, idx, nonce)) = *id else {
                out.push(None);
                continue;
            };
            let Some((lease, state)) = found.next() else {
                out.push(None);
                continue;
            };
            let hook = names.next().flatten();
            let envelope = if with_hook {
                match envs.next() {
                    Some(Ok(env)) => Some(env),
                    _ => {
                        out.push(None);
                        continue;
                    }
                }
            } else {
                None
            };
            let held = match (lease, state) {
                (Some(lease), Some(state))
                    if lease.nonce == nonce
                        && lease.deadline.0 > now
                        && lease.sink_hash == hash
                        && sees.as_ref().is_none_or(|t| t.contains(&state.ord))
                        // A pause or an erase revoked its tenant's leases.
                        && !self.paused.holds(state.ord) =>
                {
                    Some(Held {
                        row: InflightRow {
                            key: ankusa_keyspace::InflightKey {
                                ord: state.ord,
                                seq,
                                sink: idx,
                            },
                            size: state.size,
                        },
                        state,
                        lease,
                        envelope,
                        hook,
                    })
                }
                _ => None,
            };
            out.push(held);
        }
        Ok(out)
    }

    /// Why a lease the consumer named is not held: expired if its lease is still there
    /// with this nonce past its deadline, unknown otherwise.
    fn why_not(&self, lease: &str, now: u64) -> Result<Conflict, QueueError> {
        let Some((seq, idx, nonce)) = parse_lease_id(lease)
            .filter(|p| p.node == self.node())
            .map(|p| p.key())
        else {
            return Ok(Conflict::Unknown);
        };
        Ok(match deliveries::read_lease(&self.store, seq, idx)? {
            Some(l) if l.nonce == nonce && l.deadline.0 <= now => Conflict::Expired,
            _ if self.book().expired_lately(seq, idx, nonce) => Conflict::Expired,
            _ => Conflict::Unknown,
        })
    }

    /// Adds one lease's outcome (it consumes the inflight row and the lease); a retry's
    /// tenant and due time.
    #[allow(
        clippy::too_many_arguments,
        reason = "one lease's outcome, named by its parts; three callers"
    )]
    fn outcome(
        &self,
        tx: &mut Tx,
        sink: &str,
        h: &Held,
        attempt: &Attempt,
        kind: EventKind,
        takes_hook: bool,
        now: u64,
    ) -> Result<Option<(TenantOrd, AtMs)>, QueueError> {
        let name = || match &h.envelope {
            Some(env) => Some(hook_name(env)),
            None => h.hook.clone(),
        };
        let by = match kind {
            EventKind::Acked | EventKind::Nacked => "consumer",
            _ => "gateway",
        };
        step_span(kind.name(), &name, sink, h.lease.attempt, by);
        let f = Finished {
            row: &h.row,
            state: &h.state,
            envelope: h.envelope.as_ref(),
            corrupt: None,
            attempt: Some(attempt),
            kind,
        };
        let max_retry_after = Duration::from_millis(self.retry.max_retry_after_ms);
        let log = self.log.then_some(&*self.store);
        let s = outcome_ops(tx, log, &f, takes_hook, &self.retry, max_retry_after, now)?;
        deliveries::settle_lease(tx, &h.row, &h.lease);
        Ok(s.due_again)
    }

    /// Settles one lease the gateway itself ends: an expiry, or a hook it could not hand
    /// out (gone: dropped as an orphan; undecodable: dead-lettered with the error).
    fn settle_one(
        &self,
        sink: &str,
        seq: Seq,
        idx: SinkIdx,
        lease: Lease,
        why: Outcome,
    ) -> Result<bool, QueueError> {
        let store = &*self.store;
        let key = [(seq, idx)];
        let Some(state) = delivery_rows(store, &key)?.pop().flatten() else {
            // No delivery row: nothing to settle but the book's entry.
            self.book().remove(seq, idx, lease.nonce);
            return Ok(false);
        };
        let row = InflightRow {
            key: ankusa_keyspace::InflightKey {
                ord: state.ord,
                seq,
                sink: idx,
            },
            size: state.size,
        };
        let env = envelopes(store, [seq])?.pop();
        let now = ankusa_keyspace::now_ms();
        let mut tx = Tx::new();
        let mut due_again = None;
        match (&why, env) {
            (Outcome::Expired | Outcome::Revoked, Some(Ok(env))) => {
                let error = match why {
                    Outcome::Revoked => {
                        "the lease was revoked: its tenant was paused or is being erased"
                    }
                    _ => "the lease ran out before an ack",
                };
                let attempt = Attempt {
                    verdict: Verdict::Retry { retry_after: None },
                    status: 0,
                    class: Some(ErrorClass::LeaseExpired),
                    error: error.into(),
                    latency: Duration::from_millis(now.saturating_sub(lease.claimed_at.0)),
                };
                let h = Held {
                    row,
                    state,
                    lease,
                    envelope: Some(env),
                    hook: None,
                };
                let kind = EventKind::Expired;
                due_again = self.outcome(&mut tx, sink, &h, &attempt, kind, false, now)?;
            }
            (_, env) => {
                let corrupt: Option<Arc<str>> = match (&why, &env) {
                    (Outcome::Unsendable(e), _) if e.is_some() => e.clone(),
                    (_, Some(Err(Some(e)))) => Some(e.clone()),
                    _ => None,
                };
                let f = Finished {
                    row: &row,
                    state: &state,
                    envelope: None,
                    corrupt: corrupt.as_ref(),
                    attempt: None,
                    kind: EventKind::Attempt,
                };
                let max_retry_after = Duration::from_millis(self.retry.max_retry_after_ms);
                outcome_ops(&mut tx, None, &f, false, &self.retry, max_retry_after, now)?;
                deliveries::settle_lease(&mut tx, &row, &lease);
            }
        }
        let moved = tx.commit(store, false)?.count() > 0;
        {
            let mut book = self.book();
            book.remove(seq, idx, lease.nonce);
            if moved && matches!(why, Outcome::Expired) {
                book.expired(seq, idx, lease.nonce);
            }
        }
        self.hints.add_later(due_again);
        if moved {
            // A place given back: a claim waiting at a quota may take rows now.
            self.deliverer.pull_wake.of(sink).notify_waiters();
        }
        if moved && matches!(why, Outcome::Expired | Outcome::Revoked) {
            let meters = self.metrics.pull.sink(sink);
            meters.expired.inc();
            meters.held.observe(held_for(&lease, now));
        }
        self.metrics
            .pull
            .sink(sink)
            .leases
            .set(self.book().count(sink) as i64);
        Ok(moved)
    }

    /// Ends the leases whose deadline passed (at most `limit`); the soonest deadline left.
    pub fn expire_due(&self, limit: usize) -> Result<Option<AtMs>, QueueError> {
        let now = ankusa_keyspace::now_ms();
        let due = self.book().due(AtMs(now), limit);
        for e in due {
            // The lease as stored decides: extended, settled or replaced since, it is not
            // this one (an extension is back in the book with its new deadline).
            match deliveries::read_lease(&self.store, e.seq, e.sink)? {
                Some(l) if l.nonce == e.nonce && l.deadline.0 <= now => {
                    self.settle_one(&e.sink_id, e.seq, e.sink, l, Outcome::Expired)?;
                }
                Some(l) if l.nonce == e.nonce && self.paused.holds(e.ord) => {
                    self.settle_one(&e.sink_id, e.seq, e.sink, l, Outcome::Revoked)?;
                }
                Some(l) if l.nonce == e.nonce => {
                    let holder = book::Holder {
                        consumer: None,
                        ord: e.ord,
                        hook: None,
                    };
                    self.book().insert(&e.sink_id, e.seq, e.sink, &l, holder);
                }
                _ => {
                    self.book().remove(e.seq, e.sink, e.nonce);
                }
            }
        }
        Ok(self.book().next_deadline())
    }

    /// Makes the leases of paused and erasing tenants due now (the expiry then takes them
    /// back; a later ack or extension of one is `unknown`). How many.
    pub fn revoke_held(&self) -> usize {
        let now = AtMs(ankusa_keyspace::now_ms());
        let n = self.book().revoke(now, |ord| self.paused.holds(ord));
        if n > 0 {
            self.expiry_wake.notify_one();
        }
        n
    }
}

/// A lease the consumer holds, with what settling it needs.
struct Held {
    row: InflightRow,
    state: DeliveryRow,
    lease: Lease,
    /// Read for a nack (a dead-letter names the hook's source and id), not for an ack.
    envelope: Option<Envelope>,
    /// The hook's id and tenant from the book (an ack's span), if this process claimed it.
    hook: Option<Arc<book::HookName>>,
}

/// A hook's id and tenant.
fn hook_name(env: &Envelope) -> Arc<book::HookName> {
    Arc::new(book::HookName {
        id: env.id.clone(),
        tenant: env.tenant_or_default().to_owned(),
    })
}

/// One step of a leased hook's life on the gateway (`lease`, `acked`, `nacked`,
/// `expired`), as a span in the hook's trace: built only with `log.spans` or an OTLP
/// endpoint. `by`: the consumer that asked, or `gateway` (an expiry, a revocation).
fn step_span(
    step: &str,
    hook: &dyn Fn() -> Option<Arc<book::HookName>>,
    sink: &str,
    attempt: u32,
    by: &str,
) {
    if !tracing::enabled!(target: crate::telemetry::TARGET, tracing::Level::DEBUG) {
        return;
    }
    let hook = hook();
    let hook = hook.as_deref();
    let id = hook.map_or("", |h| h.id.as_str());
    let span = tracing::debug_span!(
        target: crate::telemetry::TARGET,
        "pull",
        step,
        hook_id = id,
        tenant = hook.map_or("", |h| h.tenant.as_str()),
        sink,
        attempt,
        by,
    );
    if !id.is_empty() {
        crate::telemetry::in_hook_trace(&span, id);
    }
    drop(span.enter());
}

/// Why the gateway itself settles a lease.
enum Outcome {
    Expired,
    /// Its tenant was paused or is being erased: taken back as an expiry is (the attempt
    /// counts), but a late ack or extension is `unknown`, not `expired`.
    Revoked,
    /// The hook is gone (`None`) or does not decode (the error).
    Unsendable(Option<Arc<str>>),
}

/// The delivery rows of `keys`, decoded (`None`: no row, or one that does not decode — it
/// is then not settled here; boot recovery and the dispatch path own corruption).
fn delivery_rows(
    store: &Store,
    keys: &[(Seq, SinkIdx)],
) -> Result<Vec<Option<DeliveryRow>>, QueueError> {
    let raw: Vec<Vec<u8>> = keys
        .iter()
        .map(|(s, k)| ankusa_keyspace::delivery(*s, *k))
        .collect();
    Ok(store
        .multi_get(Cf::Deliveries, &raw)?
        .into_iter()
        .map(|v| v.and_then(|v| DeliveryRow::decode(&v).ok()))
        .collect())
}

/// A hook as read: its envelope, or why there is none to send.
type Readable = Result<Envelope, Option<Arc<str>>>;

/// The envelopes of `seqs`: `Err(None)` for a hook that is gone, `Err(Some(why))` for one
/// that does not decode.
fn envelopes(
    store: &Store,
    seqs: impl IntoIterator<Item = Seq>,
) -> Result<Vec<Readable>, QueueError> {
    let keys: Vec<Vec<u8>> = seqs.into_iter().map(ankusa_keyspace::hook).collect();
    Ok(store
        .multi_get(Cf::Hooks, &keys)?
        .into_iter()
        .map(|v| match v {
            None => Err(None),
            Some(v) => Envelope::decode(&v).map_err(|e| Some(Arc::from(e.to_string()))),
        })
        .collect())
}

/// Seconds from a lease's claim to `now`.
fn held_for(lease: &Lease, now: u64) -> f64 {
    now.saturating_sub(lease.claimed_at.0) as f64 / 1_000.0
}

/// A lease's id as consumers see it: `<seq>.<sink index>.<nonce>` (hex), after
/// `<node>~` in a Relay of several nodes.
pub fn lease_id(node: Option<&str>, seq: Seq, sink: SinkIdx, nonce: u64) -> String {
    let id = format!("{:x}.{:x}.{:016x}", seq.0, sink.0, nonce);
    match node {
        Some(n) => format!("{n}~{id}"),
        None => id,
    }
}

/// A lease id, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseRef<'a> {
    /// The node that holds it (`None`: a single node's).
    pub node: Option<&'a str>,
    pub seq: Seq,
    pub sink: SinkIdx,
    pub nonce: u64,
}

impl LeaseRef<'_> {
    fn key(&self) -> (Seq, SinkIdx, u64) {
        (self.seq, self.sink, self.nonce)
    }
}

/// Parses a lease id (`None`: not one).
pub fn parse_lease_id(id: &str) -> Option<LeaseRef<'_>> {
    let (node, rest) = match id.rsplit_once('~') {
        Some((n, r)) if !n.is_empty() => (Some(n), r),
        Some(_) => return None,
        None => (None, id),
    };
    let mut parts = rest.split('.');
    let seq = u64::from_str_radix(parts.next()?, 16).ok()?;
    let sink = u16::from_str_radix(parts.next()?, 16).ok()?;
    let nonce = u64::from_str_radix(parts.next()?, 16).ok()?;
    if parts.next().is_some() {
        return None;
    }
    Some(LeaseRef {
        node,
        seq: Seq(seq),
        sink: SinkIdx(sink),
        nonce,
    })
}

/// Runs the expiry of leases until `stop`: wakes at the soonest deadline (at least every
/// second, and when a claim makes a lease); and every [`PullWake::RESCAN`] the rescan of
/// the parked tenants.
pub fn spawn_expiry(
    gateway: Arc<Gateway>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut rescanned = std::time::Instant::now();
        loop {
            if rescanned.elapsed() >= PullWake::RESCAN {
                rescanned = std::time::Instant::now();
                let g = gateway.clone();
                if let Ok(Err(e)) = tokio::task::spawn_blocking(move || g.rescan()).await {
                    tracing::warn!(error = %e, "pull: reading the parked tenants");
                }
            }
            let g = gateway.clone();
            let next = tokio::task::spawn_blocking(move || g.expire_due(1_024)).await;
            let nap = match next {
                Ok(Ok(Some(at))) => Duration::from_millis(
                    at.0.saturating_sub(ankusa_keyspace::now_ms())
                        .clamp(1, 1_000),
                ),
                Ok(Ok(None)) => Duration::from_secs(1),
                Ok(Err(e)) => {
                    tracing::warn!(error = %e, "pull: expiring leases, again in 1 s");
                    Duration::from_secs(1)
                }
                Err(e) => {
                    tracing::error!(error = %e, "pull: the expiry task");
                    Duration::from_secs(1)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(nap) => {}
                _ = gateway.expiry_wake.notified() => {}
                _ = gateway.paused.changed.notified() => {
                    gateway.revoke_held();
                }
                _ = stop.changed() => return,
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lease_ids_round_trip_and_reject_what_is_not_one() {
        let id = lease_id(None, Seq(0x1234), SinkIdx(2), 0xdead_beef);
        assert_eq!(id, "1234.2.00000000deadbeef");
        let p = parse_lease_id(&id).unwrap();
        assert_eq!(
            (p.node, p.key()),
            (None, (Seq(0x1234), SinkIdx(2), 0xdead_beef))
        );
        let id = lease_id(Some("relay-1.nodes"), Seq(1), SinkIdx(0), 7);
        assert_eq!(id, "relay-1.nodes~1.0.0000000000000007");
        let p = parse_lease_id(&id).unwrap();
        assert_eq!(
            (p.node, p.key()),
            (Some("relay-1.nodes"), (Seq(1), SinkIdx(0), 7))
        );
        for bad in [
            "",
            "1.2",
            "1.2.3.4",
            "x.2.3",
            "1.10000.3",
            "1.2.zz",
            "~1.2.3",
        ] {
            assert_eq!(parse_lease_id(bad), None, "{bad}");
        }
    }
}
