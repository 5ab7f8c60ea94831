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
pub mod lease;
pub mod settle;

use lease::lease_id;
use settle::{hook_name, spans_on, step_span, Outcome};

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_config::{Config, ConfigError, RetryConfig};
use ankusa_keyspace::{AtMs, EventKind, Seq, SinkIdx, TenantOrd};
use ankusa_queue::deliveries::{self, Lease, PulledRow, Tx};
use ankusa_queue::engine::Store;
use ankusa_queue::hints::DueHints;
use ankusa_queue::hooklog;
use ankusa_queue::QueueError;
use ankusa_records::{DeliveryRow, Envelope};
use subtle::ConstantTimeEq;

use crate::dispatch::delivery::Deliverer;
use crate::dispatch::parked::Visit;
use crate::dispatch::paused::Paused;
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
                hook: env.as_ref().filter(|_| spans_on()).map(hook_name),
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
        let weights = weights_of(store, &settings, &by_tenant)?;
        let (picked, taken) = pick(&by_tenant, &weights, &tenant_room, want, ask.max_bytes);
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
                    // Only for the spans: no allocation per claim without them.
                    hook: env.as_ref().ok().filter(|_| spans_on()).map(hook_name),
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
}

/// Each tenant's weight (`dispatch.tenant_weights`), by its name: its rows a turn.
fn weights_of(
    store: &Store,
    settings: &Settings,
    by_tenant: &[(Visit, Vec<PulledRow>)],
) -> Result<Vec<usize>, QueueError> {
    if settings.weights.is_empty() {
        return Ok(vec![1; by_tenant.len()]);
    }
    by_tenant
        .iter()
        .map(|(v, _)| {
            let name = ankusa_queue::tenants::name(store, v.ord)?;
            Ok(name
                .and_then(|n| settings.weights.get(&n).copied())
                .unwrap_or(1)
                .max(1) as usize)
        })
        .collect()
}

/// Round robin over the tenants: a tenant's weight in rows a turn (one by default), each
/// within its room, until `want` rows or `max_bytes` (the first row always goes, whatever
/// its size). The rows picked, and how many of each tenant's.
fn pick<'a>(
    by_tenant: &'a [(Visit, Vec<PulledRow>)],
    weights: &[usize],
    tenant_room: &[usize],
    want: usize,
    max_bytes: u64,
) -> (Vec<&'a PulledRow>, Vec<usize>) {
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
                if !picked.is_empty() && bytes + size > max_bytes {
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
    (picked, taken)
}

/// The delivery rows of `keys`, decoded (`None`: no row, or one that does not decode — it
/// is then not settled here; boot recovery and the dispatch path own corruption).
fn delivery_rows(
    store: &Store,
    keys: &[(Seq, SinkIdx)],
) -> Result<Vec<Option<DeliveryRow>>, QueueError> {
    Ok(deliveries::delivery_rows_each(store, keys)?
        .into_iter()
        .map(|r| r.and_then(Result::ok))
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
    let seqs: Vec<Seq> = seqs.into_iter().collect();
    Ok(deliveries::envelopes_each(store, &seqs)?
        .into_iter()
        .map(|v| match v {
            None => Err(None),
            Some(Ok(env)) => Ok(env),
            Some(Err(u)) => Err(Some(Arc::from(u.to_string()))),
        })
        .collect())
}
