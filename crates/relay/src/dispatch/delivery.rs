//! One delivery attempt: an HTTP POST of the stored body to a sink (a NATS sink's publish
//! is in [`super::nats`]).
//!
//! - The original content type, Standard Webhooks signing with the sink's secret
//!   (`webhook-id` = the hook id, `webhook-timestamp`, `webhook-signature`), the hook's
//!   tenant and source (`ankusa-tenant`, `ankusa-source`), the provider's headers its
//!   source forwards (`sources[].forward_headers`), then the sink's configured headers.
//! - A pooled client (HTTP/1.1 keep-alive; rustls for `https://`), a per-sink timeout.
//! - 2xx → delivered. 408, 429, 5xx, timeouts and connection errors → retry, honouring a
//!   `Retry-After` of seconds within `retry.max_retry_after_ms`. Other 4xx → dead-letter
//!   (unless the sink sets `dead_letter_on_4xx: false`).
//! - The retry schedule: step n (1-based) of `retry.schedule_ms`, the last step repeating,
//!   with full jitter by default; after `retry.max_attempts` attempts, dead-letter.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::Uri;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

use super::control::{Controller, Signal};
use super::line::Line;
use crate::metrics::AttemptLabel;
use ankusa_config::{Config, ConfigError, Jitter, RetryConfig};
use ankusa_keyspace::TenantOrd;
use ankusa_records::Envelope;
use ankusa_records::ErrorClass;
use ankusa_verify::{standard_webhooks_key, standard_webhooks_sign};

use crate::http::Https;

/// The most of a sink's answer body read (and dropped) after its status: enough for the
/// connection of a usual answer to be reused, never the memory of one without end.
pub const RESPONSE_DRAIN_BYTES: usize = 64 << 10;

/// A sink, ready to deliver to.
#[derive(Debug)]
pub struct Sink {
    pub id: String,
    /// How its deliveries leave the node.
    transport: Transport,
    /// The keys that sign its deliveries, newest first (none: unsigned; two during a
    /// tenant endpoint's rotation).
    keys: Vec<Vec<u8>>,
    /// A tenant endpoint's `rate_per_second`.
    pace: Option<super::pace::Pace>,
    pub timeout: Duration,
    headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    pub dead_letter_on_4xx: bool,
    /// The first bytes of a failed attempt's response body its error keeps
    /// (`dispatch.response_body_bytes`).
    response_body_bytes: usize,
    /// The request line: at most the adaptive limit of requests in flight, the next slot
    /// to the next tenant's turn.
    pub line: Arc<Line>,
    /// Bounds this sink's claimed rows ([`Controller::claim_capacity`]): as many next in
    /// line as in flight, so a delivery starts the moment a request ends, and a slow sink
    /// holds a bounded share of the node's slots.
    claims: Arc<tokio::sync::Semaphore>,
    /// The size of `claims`.
    claim_capacity: usize,
    /// Rows claimed for this sink, by tenant.
    claimed_by: std::sync::Mutex<HashMap<TenantOrd, usize>>,
    /// The adaptive limit and the breaker.
    pub control: Controller,
    /// SHA-256 over what the sink was built from — its configuration, its secret, its NATS
    /// credentials and its own certificate authorities as read: a reload keeps a sink whose fingerprint did not
    /// change as it is (its adaptive limit, breaker, line and connections).
    fingerprint: [u8; 32],
}

/// Where a sink's deliveries go. (One per sink, inside its `Arc`: the variants' sizes cost
/// nothing per delivery.)
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
enum Transport {
    /// POSTs to `uri` through `client`: the node's connection pool, or one of the sink's
    /// own when it trusts its own certificate authorities (`sinks[].ca_bundle`).
    Http { uri: Uri, client: Pool },
    /// Publishes to NATS JetStream.
    Nats(super::nats::NatsSink),
    /// Publishes to Kafka, in transactions.
    Kafka(super::kafka::KafkaSink),
}

/// The connections a sink's POSTs go through.
#[derive(Debug, Clone)]
enum Pool {
    /// The system's resolver, any address.
    Open(Client<Https, Full<Bytes>>),
    /// Tenant endpoints': the addresses of [`crate::http::guard`] refused.
    Guarded(Client<Guarded, Full<Bytes>>),
}

/// The connector of tenant endpoints that refuses inner addresses.
type Guarded = hyper_rustls::HttpsConnector<HttpConnector<crate::http::guard::Resolver>>;

impl Pool {
    fn request(
        &self,
        req: hyper::Request<Full<Bytes>>,
    ) -> hyper_util::client::legacy::ResponseFuture {
        match self {
            Pool::Open(c) => c.request(req),
            Pool::Guarded(c) => c.request(req),
        }
    }
}

/// What a sink is built of, whatever its kind.
struct Parts {
    id: String,
    transport: Transport,
    keys: Vec<Vec<u8>>,
    timeout: Duration,
    headers: Vec<(hyper::header::HeaderName, hyper::header::HeaderValue)>,
    dead_letter_on_4xx: bool,
    response_body_bytes: usize,
    permits: usize,
    breaker_failures: u32,
    breaker_cooldown: Duration,
    fingerprint: [u8; 32],
    pace: Option<super::pace::Pace>,
}

impl Sink {
    fn new(p: Parts) -> Arc<Sink> {
        Arc::new(Sink {
            id: p.id,
            transport: p.transport,
            keys: p.keys,
            pace: p.pace,
            timeout: p.timeout,
            headers: p.headers,
            dead_letter_on_4xx: p.dead_letter_on_4xx,
            response_body_bytes: p.response_body_bytes,
            line: Line::new(p.permits),
            claims: Arc::new(tokio::sync::Semaphore::new(Controller::claim_capacity(
                p.permits,
            ))),
            claim_capacity: Controller::claim_capacity(p.permits),
            claimed_by: std::sync::Mutex::new(HashMap::new()),
            control: Controller::new(p.permits, p.breaker_failures, p.breaker_cooldown),
            fingerprint: p.fingerprint,
        })
    }

    /// The Standard Webhooks signature of `env` now, with the sink's secrets if it has
    /// any: the timestamp (seconds) and the `webhook-signature` value (one signature a
    /// key, space-separated, as the standard lets a rotation send them).
    pub fn signature(&self, env: &Envelope) -> Option<(u64, String)> {
        let (first, more) = self.keys.split_first()?;
        let ts = ankusa_keyspace::now_ms() / 1000;
        let mut value = standard_webhooks_sign(first, &env.id, ts, &env.body);
        for key in more {
            value.push(' ');
            value.push_str(&standard_webhooks_sign(key, &env.id, ts, &env.body));
        }
        Some((ts, value))
    }

    /// What a broker sink's publish of `env` takes of this sink: its id, signature,
    /// headers and verdict on a 4xx.
    fn part(&self, env: &Envelope) -> super::nats::SinkPart<'_> {
        super::nats::SinkPart {
            id: &self.id,
            signature: self.signature(env),
            headers: &self.headers,
            dead_letter_on_4xx: self.dead_letter_on_4xx,
        }
    }

    fn claimed_by(&self) -> std::sync::MutexGuard<'_, HashMap<TenantOrd, usize>> {
        self.claimed_by.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A claim slot for one of `tenant`'s rows: a free one within the sink's adaptive
    /// limit (with the reserve if the tenant has none claimed here) and past its breaker.
    pub fn try_claim(self: &Arc<Self>, tenant: TenantOrd) -> Option<ClaimSlot> {
        let permit = self.claims.clone().try_acquire_owned().ok()?;
        // The rows claimed before this one.
        let claimed = self.claim_capacity - self.claims.available_permits() - 1;
        let mut by = self.claimed_by();
        let newcomer = !by.contains_key(&tenant);
        if !self.control.admit(claimed, newcomer, Instant::now()) {
            return None;
        }
        *by.entry(tenant).or_default() += 1;
        Some(ClaimSlot {
            _permit: permit,
            sink: self.clone(),
            tenant,
        })
    }

    /// Whether a quarter of the sink's line (its claims at its limit, [`Controller::line`])
    /// is free: a tick waiting for this sink's slots claims a batch of rows, not the one or
    /// two freed since the last.
    pub fn batch_free(&self) -> bool {
        let line = Controller::line(self.control.limit());
        self.free_claims() * 4 >= line
    }

    /// Claim slots a tick may fill now: free ones, within what the controller admits (its
    /// limit's line, the newcomers' reserve, the breaker).
    pub fn free_claims(&self) -> usize {
        let free = self.claims.available_permits();
        let claimed = self.claim_capacity.saturating_sub(free);
        free.min(self.control.admissible(claimed, Instant::now()))
    }
}

/// A row's claim on one of its sink's slots, given back when dropped.
#[derive(Debug)]
pub struct ClaimSlot {
    _permit: tokio::sync::OwnedSemaphorePermit,
    sink: Arc<Sink>,
    tenant: TenantOrd,
}

impl Drop for ClaimSlot {
    fn drop(&mut self) {
        let mut by = self.sink.claimed_by();
        if let Some(n) = by.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                by.remove(&self.tenant);
            }
        }
    }
}

/// What an attempt came to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    Delivered,
    /// Try again; `retry_after` if the sink asked for a delay.
    Retry {
        retry_after: Option<Duration>,
    },
    /// Do not try again.
    Dead,
}

/// One attempt's result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attempt {
    pub verdict: Verdict,
    /// HTTP status (0: no response).
    pub status: u16,
    /// Why it failed (`None`: delivered).
    pub class: Option<ErrorClass>,
    pub error: String,
    pub latency: Duration,
    /// Delivered, and the sink said it had it already (a NATS stream's duplicate of the
    /// message id, a Kafka transaction of an earlier attempt found committed).
    pub duplicate: bool,
    /// A Kafka sink's marker of this delivery stands in the store: deleted with the
    /// outcome ([`ankusa_queue::kafka`]).
    pub marked: bool,
}

impl Attempt {
    /// What the attempt tells the sink's controller.
    pub fn signal(&self) -> Signal {
        match &self.verdict {
            Verdict::Delivered => Signal::Success,
            Verdict::Retry { retry_after } => Signal::Overloaded {
                retry_after: *retry_after,
            },
            // A 4xx answer (the sink is up and deciding), or a request never sent.
            Verdict::Dead => Signal::Rejected,
        }
    }

    /// How the attempt ended, as `ankusa_delivery_attempts_total` labels it.
    pub fn label(&self) -> AttemptLabel {
        match (&self.verdict, self.status) {
            (Verdict::Delivered, _) => AttemptLabel::Delivered,
            (Verdict::Dead, _) => AttemptLabel::Rejected,
            (Verdict::Retry { .. }, 0) => AttemptLabel::Error,
            (Verdict::Retry { .. }, _) => AttemptLabel::Retryable,
        }
    }
}

/// Builds every sink of `config`, keeping those of `previous` whose fingerprint is the same.
fn build_sinks(config: &Config, previous: Option<&Sinks>) -> Result<Sinks, ConfigError> {
    let node_cas = match &config.dispatch.ca_bundle {
        Some(ca) => ca.certificates("dispatch.ca_bundle")?,
        None => Vec::new(),
    };
    let pool = config.dispatch.per_sink_inflight;
    let shared = delivery_client(&node_cas, pool, "dispatch.ca_bundle")?;
    let mut sinks = HashMap::new();
    let mut pull = std::collections::HashSet::new();
    for (i, s) in config.sinks.iter().enumerate() {
        let key = format!("sinks[{i}]");
        // A pull sink has no request to send: its rows wait for consumers (the pull gateway).
        if s.kind == ankusa_config::SinkKind::Pull {
            pull.insert(s.id.clone());
            continue;
        }
        let secret = match &s.secret {
            Some(sec) => Some(standard_webhooks_key(
                &sec.resolve(&format!("{key}.secret"))?,
            )),
            None => None,
        };
        let mut headers = Vec::new();
        for (k, v) in &s.headers {
            let name = hyper::header::HeaderName::try_from(k.as_str()).map_err(|e| {
                ConfigError::Invalid {
                    key: format!("{key}.headers"),
                    message: format!("{k:?}: {e}"),
                }
            })?;
            let value = hyper::header::HeaderValue::try_from(v.as_str()).map_err(|e| {
                ConfigError::Invalid {
                    key: format!("{key}.headers"),
                    message: format!("{k:?}: {e}"),
                }
            })?;
            headers.push((name, value));
        }
        let permits = s.max_inflight.unwrap_or(config.dispatch.per_sink_inflight);
        // A sink with authorities of its own trusts the node's and those.
        let own_cas = match &s.ca_bundle {
            None => None,
            Some(ca) => {
                let mut cas = node_cas.clone();
                cas.extend(ca.certificates(&format!("{key}.ca_bundle"))?);
                Some(cas)
            }
        };
        let body_bytes = config.dispatch.response_body_bytes;
        // The authorities it trusts as read now: a bundle file rotated under the same path
        // makes a new sink at the next reload.
        let trusted = own_cas.as_ref().unwrap_or(&node_cas);
        // A NATS or Kafka sink's credentials, as resolved, are part of what it is built from.
        let broker = match s.kind {
            ankusa_config::SinkKind::Nats => {
                let (nats, secrets) = super::nats::NatsSink::build(s, &key, trusted)?;
                Some((Transport::Nats(nats), secrets))
            }
            ankusa_config::SinkKind::Kafka => {
                let (kafka, secrets) = super::kafka::KafkaSink::build(s, &key, permits, trusted)?;
                Some((Transport::Kafka(kafka), secrets))
            }
            _ => None,
        };
        let fingerprint = sink_fingerprint(
            s,
            body_bytes,
            secret.as_deref(),
            broker.as_ref().map(|(_, secrets)| &secrets[..]),
            trusted,
        );
        if let Some(kept) = previous.and_then(|p| p.by_id.get(&s.id)) {
            if kept.fingerprint == fingerprint {
                sinks.insert(s.id.clone(), kept.clone());
                continue;
            }
        }
        // Built only for a sink that is new or changed: a kept one keeps its pool.
        let transport = match broker {
            Some((broker, _)) => broker,
            None => Transport::Http {
                uri: s.url.parse().map_err(|e| ConfigError::Invalid {
                    key: format!("{key}.url"),
                    message: format!("{e}"),
                })?,
                client: Pool::Open(match &own_cas {
                    None => shared.clone(),
                    Some(cas) => delivery_client(cas, permits, &format!("{key}.ca_bundle"))?,
                }),
            },
        };
        let sink = Sink::new(Parts {
            id: s.id.clone(),
            transport,
            keys: secret.into_iter().collect(),
            timeout: Duration::from_millis(s.timeout_ms),
            headers,
            dead_letter_on_4xx: s.dead_letter_on_4xx,
            response_body_bytes: body_bytes,
            permits,
            breaker_failures: s.breaker_failures,
            breaker_cooldown: Duration::from_millis(s.breaker_cooldown_ms),
            fingerprint,
            pace: None,
        });
        sinks.insert(s.id.clone(), sink);
    }
    Ok(Sinks {
        generation: 0,
        by_id: sinks,
        pull,
    })
}

/// What a sink is built from, hashed: its configuration, the response bytes its errors
/// keep, its secret and its NATS credentials as resolved, and the certificate authorities
/// it trusts as read (the node's, and its own).
fn sink_fingerprint(
    s: &ankusa_config::SinkConfig,
    body_bytes: usize,
    key: Option<&[u8]>,
    credentials: Option<&[u8]>,
    cas: &[rustls::pki_types::CertificateDer<'static>],
) -> [u8; 32] {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    h.update(serde_json::to_vec(s).unwrap_or_default());
    h.update((body_bytes as u64).to_be_bytes());
    for secret in [key, credentials] {
        h.update([u8::from(secret.is_some())]);
        h.update((secret.map_or(0, <[u8]>::len) as u64).to_be_bytes());
        h.update(secret.unwrap_or_default());
    }
    for ca in cas {
        h.update((ca.len() as u64).to_be_bytes());
        h.update(ca.as_ref());
    }
    h.finalize().into()
}

/// The pooled delivery client, trusting the web PKI's roots and `cas` (`key` names where
/// they came from in an error).
fn delivery_client(
    cas: &[rustls::pki_types::CertificateDer<'static>],
    idle_per_host: usize,
    key: &str,
) -> Result<Client<Https, Full<Bytes>>, ConfigError> {
    pooled(HttpConnector::new(), cas, idle_per_host, key)
}

/// A pooled client over `http` (its resolver: the system's, or the endpoints' guard).
fn pooled<R>(
    http: HttpConnector<R>,
    cas: &[rustls::pki_types::CertificateDer<'static>],
    idle_per_host: usize,
    key: &str,
) -> Result<Client<hyper_rustls::HttpsConnector<HttpConnector<R>>, Full<Bytes>>, ConfigError>
where
    R: Clone + Send + Sync + 'static,
    R: tower::Service<hyper_util::client::legacy::connect::dns::Name>,
    R::Response: Iterator<Item = std::net::SocketAddr>,
    R::Future: Send,
    R::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    let https = crate::http::https(http, cas).map_err(|e| ConfigError::Invalid {
        key: key.to_owned(),
        message: format!("TLS set-up: {e}"),
    })?;
    Ok(Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(60))
        .pool_max_idle_per_host(idle_per_host)
        .build(https))
}

/// The configured sinks, as one reload installed them.
#[derive(Debug, Default)]
pub struct Sinks {
    /// Counts the sets installed: the pipeline's per-sink series follow it.
    pub generation: u64,
    pub by_id: HashMap<String, Arc<Sink>>,
    /// The pull sinks' ids: their due rows are parked for consumers, never sent.
    pub pull: std::collections::HashSet<String>,
}

/// The delivery client: pooled connections and every configured sink. A configuration
/// reload swaps the sinks whole ([`Deliverer::prepare`], [`Deliverer::install`]); a
/// delivery already running keeps the sink it started with.
#[derive(Debug, Clone)]
pub struct Deliverer {
    sinks: Arc<arc_swap::ArcSwap<Sinks>>,
    /// Tenants' own endpoints, built as sinks when their deliveries come.
    endpoints: Option<Arc<EndpointSinks>>,
    /// Wakes the consumers waiting on a pull sink when the tick parks rows for it.
    pub pull_wake: Arc<PullWake>,
    /// The store the Kafka sinks keep their markers in, once the node opened it.
    kafka: Arc<std::sync::OnceLock<super::kafka::KafkaStore>>,
}

pub use super::parked::PullWake;

impl Deliverer {
    pub fn from_config(config: &Config) -> Result<Self, ConfigError> {
        let sinks = build_sinks(config, None)?;
        Ok(Deliverer {
            sinks: Arc::new(arc_swap::ArcSwap::from_pointee(sinks)),
            endpoints: None,
            pull_wake: Arc::default(),
            kafka: Arc::default(),
        })
    }

    /// Gives the Kafka sinks the node's store, for their markers and producer name.
    pub fn with_store(&self, store: Arc<ankusa_queue::engine::Store>) {
        let _ = self.kafka.set(super::kafka::KafkaStore::new(store));
    }

    /// Delivers to the endpoints `book` holds too (before the deliverer is shared).
    pub fn with_endpoints(
        &mut self,
        book: Arc<crate::endpoints::Book>,
        cluster: Arc<crate::cluster::Cluster>,
        config: &Config,
    ) -> Result<(), ConfigError> {
        self.endpoints = Some(Arc::new(EndpointSinks::new(book, cluster, config)?));
        Ok(())
    }

    /// The sink a delivery of `tenant`'s hook to sink `id` goes to: a configured one, or
    /// the tenant's endpoint of that id. `Err` (the delivery is retried): the endpoint could
    /// not be read, or it moved to the tenant's owner, where the row follows it (a
    /// handoff); `Ok(None)`: no such sink, or an endpoint deleted or disabled.
    pub fn sink_for(&self, tenant: &str, id: &str) -> Result<Option<Arc<Sink>>, String> {
        match &self.endpoints {
            Some(e) if id.starts_with(ankusa_config::ENDPOINT_ID_PREFIX) => e.sink(tenant, id),
            _ => Ok(self.sink(id)),
        }
    }

    /// The sinks of `config`, ready to [`install`](Deliverer::install): a sink whose
    /// configuration, secret and certificate authorities did not change is the running
    /// one, kept whole.
    pub fn prepare(&self, config: &Config) -> Result<Sinks, ConfigError> {
        let running = self.sinks.load();
        let mut next = build_sinks(config, Some(&running))?;
        next.generation = running.generation + 1;
        Ok(next)
    }

    /// Makes `sinks` the ones new deliveries go to.
    pub fn install(&self, sinks: Sinks) {
        self.sinks.store(Arc::new(sinks));
    }

    pub fn sink(&self, id: &str) -> Option<Arc<Sink>> {
        self.sinks.load().by_id.get(id).cloned()
    }

    /// Whether `id` is a pull sink now.
    pub fn is_pull(&self, id: &str) -> bool {
        self.sinks.load().pull.contains(id)
    }

    /// The generation of the sinks installed now.
    pub fn generation(&self) -> u64 {
        self.sinks.load().generation
    }

    /// The sinks installed now.
    pub fn current(&self) -> Arc<Sinks> {
        self.sinks.load_full()
    }

    /// Free slots over every sink: the most rows a tick can start deliveries for (the
    /// endpoints' built so far, and one endpoint's more for those not built yet).
    pub fn free_slots(&self) -> usize {
        let configured: usize = self
            .sinks
            .load()
            .by_id
            .values()
            .map(|s| s.free_claims())
            .sum();
        configured + self.endpoints.as_ref().map_or(0, |e| e.free_slots())
    }

    /// Whether some sink has a quarter of its line free (see [`Sink::batch_free`]): worth a
    /// tick that waited for slots.
    pub fn batch_free(&self) -> bool {
        let sinks = self.sinks.load();
        sinks.by_id.is_empty()
            || sinks.by_id.values().any(|s| s.batch_free())
            || self.endpoints.as_ref().is_some_and(|e| e.batch_free())
    }

    /// Sends the hook to the sink once: a POST, or a NATS sink's publish.
    pub async fn attempt(&self, sink: &Sink, env: &Envelope, max_retry_after: Duration) -> Attempt {
        let (uri, client) = match &sink.transport {
            Transport::Http { uri, client } => (uri, client),
            Transport::Nats(nats) => return nats_attempt(sink, nats, env).await,
            Transport::Kafka(kafka) => {
                return kafka_attempt(sink, kafka, env, self.kafka.get()).await
            }
        };
        if let Some(pace) = &sink.pace {
            pace.wait().await;
        }
        let started = Instant::now();
        if let Some(refused) = refused_literal(client, uri) {
            return refused_attempt(refused, started);
        }
        let req = match request(sink, uri, env) {
            Ok(r) => r,
            Err(e) => {
                return Attempt {
                    verdict: Verdict::Dead,
                    status: 0,
                    class: Some(ErrorClass::Request),
                    error: format!("request: {e}"),
                    latency: started.elapsed(),
                    duplicate: false,
                    marked: false,
                }
            }
        };
        let result = tokio::time::timeout(sink.timeout, async {
            let resp = client.request(req).await?;
            let status = resp.status();
            let retry_after = resp
                .headers()
                .get(hyper::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(Duration::from_secs);
            // Drain a short body so the connection goes back to the pool; a longer one (a
            // sink that streams without end, say) is dropped with its connection. The status
            // is the answer; of a failure's body the first bytes are kept, to say why.
            let keep = if status.is_success() {
                0
            } else {
                sink.response_body_bytes
            };
            let mut head = Vec::with_capacity(keep);
            let mut body = resp.into_body();
            let mut drained = 0usize;
            while drained <= RESPONSE_DRAIN_BYTES {
                match body.frame().await {
                    Some(Ok(frame)) => {
                        let data = frame.data_ref().map_or(&[][..], |d| &d[..]);
                        let room = keep - head.len();
                        head.extend_from_slice(&data[..room.min(data.len())]);
                        drained += data.len();
                    }
                    _ => break,
                }
            }
            Ok::<_, hyper_util::client::legacy::Error>((status, retry_after, head))
        })
        .await;
        let latency = started.elapsed();
        match result {
            Err(_) => Attempt {
                verdict: Verdict::Retry { retry_after: None },
                status: 0,
                class: Some(ErrorClass::Timeout),
                error: "timeout".into(),
                latency,
                duplicate: false,
                marked: false,
            },
            Ok(Err(e)) => match crate::http::guard::refusal_in(&e) {
                Some(r) => refused_attempt(r.to_string(), started),
                None => Attempt {
                    verdict: Verdict::Retry { retry_after: None },
                    status: 0,
                    class: Some(ErrorClass::Connection),
                    error: format!("connection: {e}"),
                    latency,
                    duplicate: false,
                    marked: false,
                },
            },
            Ok(Ok((status, retry_after, head))) => {
                let code = status.as_u16();
                let verdict = if status.is_success() {
                    Verdict::Delivered
                } else if code == 408 || code == 429 || status.is_server_error() {
                    Verdict::Retry {
                        retry_after: retry_after.map(|d| d.min(max_retry_after)),
                    }
                } else if status.is_client_error() && sink.dead_letter_on_4xx {
                    Verdict::Dead
                } else {
                    Verdict::Retry { retry_after: None }
                };
                Attempt {
                    verdict,
                    status: code,
                    class: (!status.is_success()).then_some(ErrorClass::Status),
                    error: if status.is_success() {
                        String::new()
                    } else {
                        status_error(code, &head)
                    },
                    latency,
                    duplicate: false,
                    marked: false,
                }
            }
        }
    }
}

/// Why a guarded pool does not connect to the address written in `uri` (the connector
/// resolves names only).
fn refused_literal(pool: &Pool, uri: &Uri) -> Option<String> {
    let Pool::Guarded(_) = pool else { return None };
    let host = uri.host()?.trim_start_matches('[').trim_end_matches(']');
    let ip: std::net::IpAddr = host.parse().ok()?;
    crate::http::guard::refused(ip)
        .map(|why| format!("{ip} is a {why} address: refused (endpoints.allow_private is off)"))
}

/// An attempt the guard refused: dead at once (no retry reaches another address; the
/// tenant fixes its URL and replays).
fn refused_attempt(error: String, started: Instant) -> Attempt {
    Attempt {
        verdict: Verdict::Dead,
        status: 0,
        class: Some(ErrorClass::AddressRefused),
        error,
        latency: started.elapsed(),
        duplicate: false,
        marked: false,
    }
}

/// Tenants' endpoints as sinks, built from their records when a delivery needs one and
/// kept (at most `endpoints.cache_tenants`, the least recently used going first) until
/// their record changes or a rotated secret stops signing.
#[derive(Debug)]
pub struct EndpointSinks {
    book: Arc<crate::endpoints::Book>,
    /// Who owns each tenant: an endpoint not here is its owner's once a handoff moved it.
    cluster: Arc<crate::cluster::Cluster>,
    pool: Pool,
    /// By endpoint id.
    built: std::sync::Mutex<hashlink::LruCache<String, Built>>,
    response_body_bytes: usize,
}

#[derive(Debug)]
struct Built {
    tenant: String,
    /// The record's `updated_ms` it was built from.
    updated_ms: u64,
    /// When its keys change (a rotated secret's end): built again from then on.
    until_ms: u64,
    sink: Arc<Sink>,
}

impl EndpointSinks {
    fn new(
        book: Arc<crate::endpoints::Book>,
        cluster: Arc<crate::cluster::Cluster>,
        config: &Config,
    ) -> Result<Self, ConfigError> {
        let e = &config.endpoints;
        let node_cas = match &config.dispatch.ca_bundle {
            Some(ca) => ca.certificates("dispatch.ca_bundle")?,
            None => Vec::new(),
        };
        // Idle connections kept per host: many tenants' endpoints may share a host (a
        // receiving service's), so the node's per-sink figure, not one endpoint's.
        let idle = config.dispatch.per_sink_inflight;
        let key = "dispatch.ca_bundle";
        let pool = if e.allow_private {
            Pool::Open(delivery_client(&node_cas, idle, key)?)
        } else {
            let guarded = HttpConnector::new_with_resolver(crate::http::guard::Resolver);
            Pool::Guarded(pooled(guarded, &node_cas, idle, key)?)
        };
        Ok(EndpointSinks {
            built: std::sync::Mutex::new(hashlink::LruCache::new(e.cache_tenants.max(1))),
            book,
            cluster,
            pool,
            response_body_bytes: config.dispatch.response_body_bytes,
        })
    }

    fn built(&self) -> std::sync::MutexGuard<'_, hashlink::LruCache<String, Built>> {
        self.built.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn sink(&self, tenant: &str, id: &str) -> Result<Option<Arc<Sink>>, String> {
        let record = match self.book.get(tenant, id) {
            Ok(Some(r)) if r.enabled => r,
            Ok(None) if self.cluster.other_owner(tenant).is_some() => {
                return Err(format!(
                    "the tenant's endpoint {id} moved to the tenant's owner; this row follows it"
                ))
            }
            Ok(_) => return Ok(None),
            Err(e) => return Err(format!("reading the endpoint: {e}")),
        };
        let now = ankusa_keyspace::now_ms();
        // By id alone (ids are random and never reused), the tenant checked: a lookup
        // allocates nothing.
        if let Some(b) = self.built().get(id) {
            if b.tenant == tenant && b.updated_ms == record.updated_ms && now < b.until_ms {
                return Ok(Some(b.sink.clone()));
            }
        }
        let e = self.book.config();
        let uri: Uri = record
            .url
            .parse()
            .map_err(|err| format!("the endpoint's url: {err}"))?;
        let sink = Sink::new(Parts {
            id: record.id.clone(),
            transport: Transport::Http {
                uri,
                client: self.pool.clone(),
            },
            keys: record.keys_at(now),
            timeout: Duration::from_millis(e.timeout_ms),
            headers: Vec::new(),
            dead_letter_on_4xx: true,
            response_body_bytes: self.response_body_bytes,
            permits: e.max_inflight,
            breaker_failures: e.breaker_failures,
            breaker_cooldown: Duration::from_millis(e.breaker_cooldown_ms),
            fingerprint: [0; 32],
            pace: record.rate_per_second.map(super::pace::Pace::per_second),
        });
        self.built().insert(
            id.to_owned(),
            Built {
                tenant: tenant.to_owned(),
                updated_ms: record.updated_ms,
                until_ms: record.keys_change_at(now).unwrap_or(u64::MAX),
                sink: sink.clone(),
            },
        );
        Ok(Some(sink))
    }

    /// At most the claims of every built endpoint and of one not built yet: the bound a
    /// tick reads candidates up to, in O(1) (a tick must not walk thousands of endpoints;
    /// each claim still takes its endpoint's slot, and the node's, or waits).
    fn free_slots(&self) -> usize {
        if self.book.total() == 0 {
            return 0;
        }
        let built = self.built().len();
        (built + 1) * Controller::claim_capacity(self.book.config().max_inflight)
    }

    fn batch_free(&self) -> bool {
        self.book.total() > 0
    }
}

/// A Kafka sink's publish of `env`, as an attempt.
async fn kafka_attempt(
    sink: &Sink,
    kafka: &super::kafka::KafkaSink,
    env: &Envelope,
    store: Option<&super::kafka::KafkaStore>,
) -> Attempt {
    let mut a = published_attempt(kafka.publish(&sink.part(env), env, store).await);
    // The marker goes with a final outcome (delivered, or dead-lettered: its transaction
    // aborted); a retried one's stays, for the next attempt to read back.
    a.marked = !matches!(a.verdict, Verdict::Retry { .. });
    a
}

/// A NATS sink's publish of `env`, as an attempt.
async fn nats_attempt(sink: &Sink, nats: &super::nats::NatsSink, env: &Envelope) -> Attempt {
    published_attempt(nats.publish(&sink.part(env), env).await)
}

/// A broker's answer to a publish, as an attempt.
fn published_attempt(published: super::nats::Published) -> Attempt {
    let latency = published.latency;
    match published.outcome {
        Ok(duplicate) => Attempt {
            verdict: Verdict::Delivered,
            status: 0,
            class: None,
            error: String::new(),
            latency,
            duplicate,
            marked: false,
        },
        Err(f) => Attempt {
            verdict: if f.dead {
                Verdict::Dead
            } else {
                Verdict::Retry { retry_after: None }
            },
            status: f.status,
            class: Some(f.class),
            error: f.error,
            latency,
            duplicate: false,
            marked: false,
        },
    }
}

/// A failed attempt's error: its status and, when its body said something, the first bytes
/// of it on one line (`HTTP 400: {"error":"bad field"}`), within what the hook log keeps.
fn status_error(code: u16, head: &[u8]) -> String {
    let said: String = String::from_utf8_lossy(head)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let said = said.trim();
    if said.is_empty() {
        format!("HTTP {code}")
    } else {
        ankusa_records::error_head(&format!("HTTP {code}: {said}")).to_owned()
    }
}

/// The signed POST of `env` to `sink`: the standard headers by their static names, in
/// one header map sized for them (what a delivery costs is mostly this and the exchange).
fn request(
    sink: &Sink,
    uri: &Uri,
    env: &Envelope,
) -> Result<hyper::Request<Full<Bytes>>, hyper::http::Error> {
    use hyper::header::{HeaderName, HeaderValue, CONTENT_TYPE, USER_AGENT};
    static WEBHOOK_ID: HeaderName = HeaderName::from_static("webhook-id");
    static WEBHOOK_TIMESTAMP: HeaderName = HeaderName::from_static("webhook-timestamp");
    static WEBHOOK_SIGNATURE: HeaderName = HeaderName::from_static("webhook-signature");
    static TENANT: HeaderName = HeaderName::from_static("ankusa-tenant");
    static SOURCE: HeaderName = HeaderName::from_static("ankusa-source");
    let mut req = hyper::Request::new(Full::new(Bytes::from(env.body.clone())));
    *req.method_mut() = hyper::Method::POST;
    *req.uri_mut() = uri.clone();
    let h = req.headers_mut();
    h.reserve(7 + env.headers.len() + sink.headers.len());
    h.insert(CONTENT_TYPE, HeaderValue::from_str(&env.content_type)?);
    h.insert(
        USER_AGENT,
        HeaderValue::from_static(concat!("ankusa/", env!("CARGO_PKG_VERSION"))),
    );
    h.insert(WEBHOOK_ID.clone(), HeaderValue::from_str(&env.id)?);
    h.insert(
        TENANT.clone(),
        HeaderValue::from_str(env.tenant_or_default())?,
    );
    h.insert(SOURCE.clone(), HeaderValue::from_str(&env.source)?);
    // The provider's headers its source forwards (validated at ingest; a name or value
    // that no longer parses, from a store written by hand, is left out).
    for (name, value) in &env.headers {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            h.append(n, v);
        }
    }
    if let Some((ts, signature)) = sink.signature(env) {
        h.insert(WEBHOOK_TIMESTAMP.clone(), HeaderValue::from(ts));
        h.insert(
            WEBHOOK_SIGNATURE.clone(),
            HeaderValue::from_str(&signature)?,
        );
    }
    for (k, v) in &sink.headers {
        h.append(k.clone(), v.clone());
    }
    Ok(req)
}

/// The delay before retry number `attempts` (the attempts made so far, ≥ 1).
pub fn backoff(retry: &RetryConfig, attempts: u32, random: f64) -> Duration {
    let i = (attempts.max(1) as usize - 1).min(retry.schedule_ms.len().saturating_sub(1));
    let step = retry.schedule_ms.get(i).copied().unwrap_or(0);
    let ms = match retry.jitter {
        Jitter::Full => (step as f64 * random.clamp(0.0, 1.0)) as u64,
        Jitter::None => step,
    };
    Duration::from_millis(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reload keeps a sink whose configuration, secret and authorities are the same
    /// (its limit, breaker, line and pool go on), and builds the others anew; a secret
    /// rotated in its file is a new sink.
    #[tokio::test]
    async fn a_reload_keeps_the_sinks_that_did_not_change() {
        let dir = tempfile::tempdir().unwrap();
        let secret = dir.path().join("b.secret");
        std::fs::write(&secret, "whsec_c2VjcmV0LW9uZQ==").unwrap();
        let cfg = |extra: &str| {
            let text = format!(
                "sinks:\n  - {{ id: a, url: \"http://127.0.0.1:9/a\" }}\n  - {{ id: b, url: \"http://127.0.0.1:9/b\", secret: {{ file: {} }} }}\n{extra}",
                secret.display()
            );
            Config::from_yaml(&text, Vec::new()).unwrap()
        };
        let d = Deliverer::from_config(&cfg("")).unwrap();
        let (a, b) = (d.sink("a").unwrap(), d.sink("b").unwrap());
        let next = d
            .prepare(&cfg("  - { id: c, url: \"http://127.0.0.1:9/c\" }\n"))
            .unwrap();
        d.install(next);
        assert_eq!(d.generation(), 1);
        assert!(Arc::ptr_eq(&a, &d.sink("a").unwrap()), "a was rebuilt");
        assert!(Arc::ptr_eq(&b, &d.sink("b").unwrap()), "b was rebuilt");
        assert!(d.sink("c").is_some());
        std::fs::write(&secret, "whsec_c2VjcmV0LXR3bw==").unwrap();
        let next = d.prepare(&cfg("")).unwrap();
        d.install(next);
        assert!(Arc::ptr_eq(&a, &d.sink("a").unwrap()));
        assert!(
            !Arc::ptr_eq(&b, &d.sink("b").unwrap()),
            "b kept its old secret"
        );
        assert!(d.sink("c").is_none(), "c was removed");
    }

    /// A NATS sink's `.creds` are read when the sink is built: a file that is not one is
    /// the configuration's error (the reload refused), not every attempt's; a sink that
    /// reads them builds with no connection made (the first attempt opens it).
    #[tokio::test]
    async fn a_nats_sinks_credentials_are_read_when_it_is_built() {
        let cfg = |creds: &str| {
            let text = format!(
                "sinks:\n  - {{ id: n, kind: nats, url: \"nats://127.0.0.1:9\", nats: {{ subject: s, creds: {{ value: {creds:?} }} }} }}\n"
            );
            Config::from_yaml(&text, Vec::new()).unwrap()
        };
        let e = Deliverer::from_config(&cfg("not a creds file")).unwrap_err();
        assert!(e.to_string().contains("sinks[0].nats.creds"), "{e}");
        let unreachable = "nats://127.0.0.1:9";
        let text = format!(
            "sinks:\n  - {{ id: n, kind: nats, url: \"{unreachable}\", nats: {{ subject: s, token: {{ value: t }} }} }}\n"
        );
        let d = Deliverer::from_config(&Config::from_yaml(&text, Vec::new()).unwrap()).unwrap();
        assert!(d.sink("n").is_some());
    }

    #[test]
    fn backoff_follows_the_schedule_and_repeats_its_last_step() {
        let r = RetryConfig {
            schedule_ms: vec![10, 20, 40],
            jitter: Jitter::None,
            ..RetryConfig::default()
        };
        let ms = |a| backoff(&r, a, 0.5).as_millis();
        assert_eq!([ms(1), ms(2), ms(3), ms(4), ms(9)], [10, 20, 40, 40, 40]);
        let full = RetryConfig {
            jitter: Jitter::Full,
            ..r
        };
        assert_eq!(backoff(&full, 3, 0.25).as_millis(), 10);
        assert_eq!(backoff(&full, 3, 0.0).as_millis(), 0);
        assert_eq!(backoff(&full, 3, 1.0).as_millis(), 40);
    }
}
