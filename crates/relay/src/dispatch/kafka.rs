//! The Kafka sink (`kind: kafka`): each hook published to its topic in a transaction, the
//! transaction's commit its delivery.
//!
//! - Key: the hook's id (so a hook's retries land in one partition, in order); value: the
//!   stored body; headers: what an HTTP delivery sends (`Content-Type`, `webhook-id`, the
//!   Standard Webhooks signature with the sink's `secret`, `ankusa-tenant`,
//!   `ankusa-source`, the forwarded headers, the sink's `headers`).
//! - Exactly once across a crash. The producer is idempotent (no retry of its own is a
//!   second message) and transactional, with an id that is the same across the node's
//!   restarts (`ankusa-<store's producer name>-<sink id>`): its start aborts a transaction
//!   its predecessor left open. Between the publish and the commit of the delivery's
//!   outcome, a *marker* in the store says where the message lies
//!   ([`ankusa_queue::kafka`]), written before the commit is asked for and deleted with
//!   the outcome. A hook that comes with a marker — its earlier attempt's outcome was lost
//!   to a crash, or the commit's answer never came — is read back first (`read_committed`):
//!   found, it is delivered as a duplicate (`ankusa_delivery_duplicates_total`) and not
//!   published again; not found (aborted), it is published.
//! - One producer per sink, on a thread of its own (librdkafka's transactional calls
//!   block): the publishes waiting when a transaction begins go in it together, up to
//!   `kafka.max_batch` — a group commit.
//! - The verdicts follow the HTTP sink's: committed → delivered; a broker away, a timeout,
//!   a topic not there (yet) → retried; a message too large → dead-lettered; an
//!   authorization refused → dead-lettered unless `dead_letter_on_4xx: false`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, Message, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::{Offset, TopicPartitionList};

use ankusa_config::{ConfigError, SinkConfig};
use ankusa_queue::engine::Store;
use ankusa_queue::kafka::Marker;
use ankusa_records::{Envelope, ErrorClass};

use super::nats::{Failed, Published, SinkPart};

/// A Kafka sink's servers, topic, sign-in and producer.
pub struct KafkaSink {
    id: String,
    /// The librdkafka settings both the producer and the read-back consumer use.
    common: Vec<(&'static str, String)>,
    topic: String,
    max_batch: usize,
    timeout: Duration,
    /// The publishes that may wait for the producer: the sink's slots.
    capacity: usize,
    /// To the producer's thread, started by the first publish.
    tx: std::sync::OnceLock<std::sync::mpsc::SyncSender<Job>>,
}

impl std::fmt::Debug for KafkaSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSink")
            .field("id", &self.id)
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

/// One publish handed to the producer's thread, and where its end goes.
struct Job {
    hook: String,
    topic: String,
    body: Vec<u8>,
    headers: OwnedHeaders,
    /// Committed (`true`: by an earlier attempt's transaction, read back), or why not.
    reply: tokio::sync::oneshot::Sender<Result<bool, Failed>>,
}

/// What the node gives its Kafka sinks: the store their markers go to, and its producer
/// name once a sink asked for it.
#[derive(Debug, Clone)]
pub struct KafkaStore {
    pub store: Arc<Store>,
    name: Arc<std::sync::Mutex<Option<String>>>,
}

impl KafkaStore {
    pub fn new(store: Arc<Store>) -> KafkaStore {
        KafkaStore {
            store,
            name: Arc::default(),
        }
    }

    /// The store's producer name, made (and synced) by the first Kafka sink that asks: a
    /// store that never had one has no `m:kafka_id`.
    pub fn name(&self) -> Result<String, ankusa_queue::QueueError> {
        let mut held = self
            .name
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(n) = held.as_ref() {
            return Ok(n.clone());
        }
        let name = match ankusa_queue::kafka::producer_name(&self.store)? {
            Some(n) => n,
            None => {
                let n = ankusa_keyspace::hex(&rand::random::<[u8; 16]>());
                let op = ankusa_queue::kafka::producer_name_op(&n);
                ankusa_queue::commit(&self.store, vec![op], true)?;
                n
            }
        };
        *held = Some(name.clone());
        Ok(name)
    }
}

impl KafkaSink {
    /// The sink of `s` (`key`: `sinks[i]`, `slots` its deliveries in flight at most),
    /// trusting `cas` over TLS, and the secrets it resolved (for its fingerprint).
    pub fn build(
        s: &SinkConfig,
        key: &str,
        slots: usize,
        cas: &[rustls::pki_types::CertificateDer<'static>],
    ) -> Result<(KafkaSink, Vec<u8>), ConfigError> {
        let invalid = |k: &str, message: String| ConfigError::Invalid {
            key: format!("{key}.{k}"),
            message,
        };
        let (servers, tls) = ankusa_config::kafka_servers(&s.url).map_err(|m| invalid("url", m))?;
        let kafka = s
            .kafka
            .as_ref()
            .ok_or_else(|| invalid("kafka.topic", "a Kafka sink needs a topic".into()))?;
        let mut common: Vec<(&'static str, String)> = vec![
            ("bootstrap.servers", servers.join(",")),
            (
                "client.id",
                concat!("ankusa/", env!("CARGO_PKG_VERSION")).into(),
            ),
            (
                "socket.connection.setup.timeout.ms",
                s.timeout_ms.max(1000).to_string(),
            ),
            ("reconnect.backoff.max.ms", "2000".into()),
        ];
        let mut secrets = Vec::new();
        let protocol = match (&kafka.sasl, tls) {
            (None, false) => "plaintext",
            (None, true) => "ssl",
            (Some(_), false) => "sasl_plaintext",
            (Some(_), true) => "sasl_ssl",
        };
        common.push(("security.protocol", protocol.into()));
        if let Some(sasl) = &kafka.sasl {
            let password = String::from_utf8(
                sasl.password
                    .resolve(&format!("{key}.kafka.sasl.password"))?,
            )
            .map_err(|_| invalid("kafka.sasl.password", "is not UTF-8".into()))?;
            secrets = [sasl.username.as_bytes(), b"\0", password.as_bytes()].concat();
            common.push(("sasl.mechanism", sasl.mechanism.clone()));
            common.push(("sasl.username", sasl.username.clone()));
            common.push(("sasl.password", password));
        }
        if tls && !cas.is_empty() {
            common.push(("ssl.ca.pem", pem(cas)));
        }
        let sink = KafkaSink {
            id: s.id.clone(),
            common,
            topic: kafka.topic.clone(),
            max_batch: kafka.max_batch,
            timeout: Duration::from_millis(s.timeout_ms),
            capacity: slots.max(1),
            tx: std::sync::OnceLock::new(),
        };
        Ok((sink, secrets))
    }

    /// The topic of `env`'s message: the template with its tenant and source.
    pub fn topic(&self, env: &Envelope) -> String {
        self.topic
            .replace(
                "{tenant}",
                &ankusa_config::topic_token(env.tenant_or_default()),
            )
            .replace("{source}", &ankusa_config::topic_token(&env.source))
    }

    /// Publishes `env` as `sink`'s message in a transaction and waits for its commit (at
    /// most the sink's timeout); `store` keeps the markers.
    pub async fn publish(
        &self,
        sink: &SinkPart<'_>,
        env: &Envelope,
        store: Option<&KafkaStore>,
    ) -> Published {
        let started = Instant::now();
        let ended = |outcome| Published {
            outcome,
            latency: started.elapsed(),
        };
        let Some(store) = store else {
            let e = "the node gave its Kafka sinks no store".to_owned();
            return ended(Err(failed(false, ErrorClass::Unconfigured, e)));
        };
        let topic = self.topic(env);
        if topic.len() > ankusa_config::MAX_TOPIC {
            let e = format!("the topic is {} characters, over Kafka's 249", topic.len());
            return ended(Err(failed(true, ErrorClass::Request, e)));
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let job = Job {
            hook: env.id.clone(),
            topic,
            body: env.body.clone(),
            headers: headers(sink, env),
            reply,
        };
        let tx = self.tx.get_or_init(|| self.start(store.clone()));
        // The channel holds the sink's in-flight publishes (its slots bound them): a full
        // one is a producer that stopped taking them.
        if tx.try_send(job).is_err() {
            let e = "the sink's producer is not taking publishes".to_owned();
            return ended(Err(failed(false, ErrorClass::Connection, e)));
        }
        let outcome = match tokio::time::timeout(self.timeout, answer).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(failed(
                false,
                ErrorClass::Connection,
                "the sink's producer stopped".into(),
            )),
            Err(_) => Err(failed(false, ErrorClass::Timeout, "timeout".into())),
        };
        ended(outcome)
    }

    /// Starts the producer's thread; it ends when the sink is dropped (a reload replaced
    /// it) and its last publish is answered.
    fn start(&self, store: KafkaStore) -> std::sync::mpsc::SyncSender<Job> {
        let (tx, rx) = std::sync::mpsc::sync_channel(self.capacity);
        let worker = Worker {
            sink: self.id.clone(),
            common: self.common.clone(),
            store,
            max_batch: self.max_batch,
            timeout: self.timeout,
            runtime: tokio::runtime::Handle::current(),
        };
        let spawned = std::thread::Builder::new()
            .name(format!("kafka-{}", self.id))
            .spawn(move || worker.run(&rx));
        if let Err(e) = spawned {
            tracing::error!(sink = %self.id, error = %e, "kafka: the producer's thread did not start");
        }
        tx
    }
}

/// The producer's thread: its clients and what it needs of the sink.
struct Worker {
    sink: String,
    common: Vec<(&'static str, String)>,
    store: KafkaStore,
    max_batch: usize,
    timeout: Duration,
    /// Waits for delivery reports on the producer's thread.
    runtime: tokio::runtime::Handle,
}

/// The producer, once its transactions are initialised, and the read-back consumer.
struct Clients {
    producer: FutureProducer,
    reader: BaseConsumer,
}

impl Worker {
    fn config(&self) -> ClientConfig {
        let mut c = ClientConfig::new();
        for (k, v) in &self.common {
            c.set(*k, v);
        }
        c
    }

    /// A producer whose transactions are initialised (its predecessor's open one aborted)
    /// and a `read_committed` reader, or why not.
    fn clients(&self) -> Result<Clients, String> {
        let name = self.store.name().map_err(|e| format!("store: {e}"))?;
        let transactional_id = format!("ankusa-{name}-{}", self.sink);
        self.kafka_clients(&transactional_id)
            .map_err(|e| format!("producer: {e}"))
    }

    fn kafka_clients(&self, transactional_id: &str) -> Result<Clients, KafkaError> {
        let timeout_ms = self.timeout.as_millis().max(1000);
        let producer: FutureProducer = self
            .config()
            .set("transactional.id", transactional_id)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("linger.ms", "1")
            .set("message.timeout.ms", timeout_ms.to_string())
            // Within the brokers' default `transaction.max.timeout.ms` (15 minutes).
            .set(
                "transaction.timeout.ms",
                (timeout_ms * 2).clamp(60_000, 900_000).to_string(),
            )
            .create()?;
        producer.init_transactions(self.timeout.max(Duration::from_secs(1)))?;
        let reader: BaseConsumer = self
            .config()
            .set("group.id", format!("{transactional_id}-read-back"))
            .set("enable.auto.commit", "false")
            .set("enable.auto.offset.store", "false")
            .set("enable.partition.eof", "true")
            .set("isolation.level", "read_committed")
            .create()?;
        Ok(Clients { producer, reader })
    }

    fn run(self, rx: &std::sync::mpsc::Receiver<Job>) {
        let mut clients: Option<Clients> = None;
        while let Ok(first) = rx.recv() {
            let mut jobs = vec![first];
            while jobs.len() < self.max_batch {
                match rx.try_recv() {
                    Ok(j) => jobs.push(j),
                    Err(_) => break,
                }
            }
            if clients.is_none() {
                match self.clients() {
                    Ok(c) => clients = Some(c),
                    Err(e) => {
                        for j in jobs {
                            let f = failed(false, ErrorClass::Connection, e.clone());
                            let _ = j.reply.send(Err(f));
                        }
                        continue;
                    }
                }
            }
            let Some(c) = clients.as_ref() else { continue };
            if let Err(fatal) = self.batch(c, jobs) {
                tracing::warn!(sink = %self.sink, error = %fatal, "kafka: the producer failed; a new one takes over");
                clients = None;
            }
        }
    }

    /// One batch: hooks whose marker says they may be out already are read back first; the
    /// rest go in one transaction. `Err`: the producer can go on no more.
    fn batch(&self, c: &Clients, jobs: Vec<Job>) -> Result<(), KafkaError> {
        // A hook twice in one batch (an attempt that timed out, its retry already here):
        // the later goes, the earlier is answered — one publish.
        let mut seen = std::collections::HashSet::with_capacity(jobs.len());
        let mut kept = Vec::with_capacity(jobs.len());
        for j in jobs.into_iter().rev() {
            if seen.insert(j.hook.clone()) {
                kept.push(j);
            } else {
                let e = "superseded by a later attempt of the same hook".to_owned();
                let _ = j.reply.send(Err(failed(false, ErrorClass::Timeout, e)));
            }
        }
        kept.reverse();
        let jobs = kept;
        let hooks: Vec<&str> = jobs.iter().map(|j| j.hook.as_str()).collect();
        let marked = match ankusa_queue::kafka::marked(&self.store.store, &self.sink, &hooks) {
            Ok(m) => m,
            Err(e) => {
                for j in jobs {
                    let _ = j.reply.send(Err(failed(
                        false,
                        ErrorClass::Connection,
                        format!("store: {e}"),
                    )));
                }
                return Ok(());
            }
        };
        let mut publish = Vec::with_capacity(jobs.len());
        for (j, m) in jobs.into_iter().zip(marked) {
            let Some(m) = m else {
                publish.push(j);
                continue;
            };
            match read_back(&c.reader, &j.hook, &m, self.timeout) {
                Some(true) => {
                    let _ = j.reply.send(Ok(true));
                }
                Some(false) => publish.push(j),
                None => {
                    let e = "an earlier attempt's transaction is not decided yet".to_owned();
                    let _ = j.reply.send(Err(failed(false, ErrorClass::Timeout, e)));
                }
            }
        }
        if publish.is_empty() {
            return Ok(());
        }
        self.transaction(c, publish)
    }

    /// Publishes `jobs` in one transaction and commits it, markers written first.
    fn transaction(&self, c: &Clients, mut jobs: Vec<Job>) -> Result<(), KafkaError> {
        let p = &c.producer;
        if let Err(e) = p.begin_transaction() {
            answer_all(jobs, &e);
            return Err(e);
        }
        let mut sent = Vec::with_capacity(jobs.len());
        for j in &mut jobs {
            // The headers go with the record (the job keeps its reply).
            let record = FutureRecord::to(&j.topic)
                .key(j.hook.as_bytes())
                .payload(&j.body)
                .headers(std::mem::take(&mut j.headers));
            sent.push(p.send_result(record).map_err(|(e, _)| e));
        }
        let delivered: Vec<Result<(i32, i64), KafkaError>> = sent
            .into_iter()
            .map(|s| match s {
                Err(e) => Err(e),
                Ok(fut) => match self.runtime.block_on(fut) {
                    Ok(Ok(d)) => Ok((d.partition, d.offset)),
                    Ok(Err((e, _))) => Err(e),
                    Err(_) => Err(KafkaError::Canceled),
                },
            })
            .collect();
        if delivered.iter().any(Result::is_err) {
            let aborted = p.abort_transaction(self.timeout);
            for (j, d) in jobs.into_iter().zip(delivered) {
                let f = match d {
                    Err(e) => produce_failed(&e),
                    Ok(_) => failed(
                        false,
                        ErrorClass::Connection,
                        "aborted with another message of its transaction".into(),
                    ),
                };
                let _ = j.reply.send(Err(f));
            }
            return aborted;
        }
        let now = ankusa_keyspace::now_ms();
        let markers: Vec<Marker> = jobs
            .iter()
            .zip(delivered.into_iter().flatten())
            .map(|(j, (partition, offset))| Marker {
                written_ms: now,
                partition,
                offset,
                topic: j.topic.clone(),
            })
            .collect();
        let ops = ankusa_queue::kafka::mark_ops(
            &self.sink,
            jobs.iter().map(|j| j.hook.as_str()).zip(&markers),
        );
        if let Err(e) = ankusa_queue::commit(&self.store.store, ops, true) {
            let aborted = p.abort_transaction(self.timeout);
            for j in jobs {
                let _ = j.reply.send(Err(failed(
                    false,
                    ErrorClass::Connection,
                    format!("store: {e}"),
                )));
            }
            return aborted;
        }
        match p.commit_transaction(self.timeout) {
            Ok(()) => {
                for j in jobs {
                    let _ = j.reply.send(Ok(false));
                }
                Ok(())
            }
            Err(e) => {
                // Aborted or not decided: the markers stay, and each hook's next attempt
                // reads back what became of it.
                let requires_abort =
                    matches!(&e, KafkaError::Transaction(t) if t.txn_requires_abort());
                let result = if requires_abort {
                    p.abort_transaction(self.timeout)
                } else {
                    Err(e.clone())
                };
                answer_all(jobs, &e);
                result
            }
        }
    }
}

/// Answers every job with `e` (to be retried).
fn answer_all(jobs: Vec<Job>, e: &KafkaError) {
    let class = error_class(e);
    for j in jobs {
        let _ = j
            .reply
            .send(Err(failed(false, class, format!("transaction: {e}"))));
    }
}

/// What became of hook `hook`'s message at `m`: `Some(true)` it is there, committed;
/// `Some(false)` it is not (its transaction aborted); `None` not known within `timeout`
/// (its transaction still open, or the broker away).
fn read_back(reader: &BaseConsumer, hook: &str, m: &Marker, timeout: Duration) -> Option<bool> {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(&m.topic, m.partition, Offset::Offset(m.offset))
        .ok()?;
    reader.assign(&tpl).ok()?;
    let deadline = Instant::now() + timeout;
    let answer = loop {
        if Instant::now() >= deadline {
            break None;
        }
        match reader.poll(Duration::from_millis(100)) {
            Some(Ok(msg)) if msg.offset() == m.offset => {
                break Some(msg.key() == Some(hook.as_bytes()));
            }
            // Read committed skips an aborted transaction's messages.
            Some(Ok(msg)) if msg.offset() > m.offset => break Some(false),
            Some(Err(KafkaError::PartitionEOF(_))) => {
                // At the end of what is decided: past the offset, the message was aborted.
                let at = reader
                    .position()
                    .ok()
                    .and_then(|p| p.find_partition(&m.topic, m.partition).map(|e| e.offset()));
                if let Some(Offset::Offset(at)) = at {
                    if at > m.offset {
                        break Some(false);
                    }
                }
            }
            _ => {}
        }
    };
    let _ = reader.unassign();
    answer
}

/// A failed publish of one message: dead-letter what no retry mends.
fn produce_failed(e: &KafkaError) -> Failed {
    use RDKafkaErrorCode as C;
    let code = e.rdkafka_error_code();
    let dead = matches!(
        code,
        Some(C::MessageSizeTooLarge | C::InvalidMessageSize | C::InvalidRecord | C::InvalidMessage)
    );
    let refused = matches!(
        code,
        Some(
            C::TopicAuthorizationFailed
                | C::ClusterAuthorizationFailed
                | C::TransactionalIdAuthorizationFailed
        )
    );
    let class = if dead || refused {
        ErrorClass::Request
    } else {
        error_class(e)
    };
    let mut f = failed(dead, class, format!("publish: {e}"));
    if refused {
        f.status = 403;
        f.class = ErrorClass::Status;
    }
    f
}

/// The class of a failure that is retried.
fn error_class(e: &KafkaError) -> ErrorClass {
    match e.rdkafka_error_code() {
        Some(
            RDKafkaErrorCode::MessageTimedOut
            | RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::RequestTimedOut,
        ) => ErrorClass::Timeout,
        _ => ErrorClass::Connection,
    }
}

fn failed(dead: bool, class: ErrorClass, error: String) -> Failed {
    Failed {
        dead,
        status: 0,
        class,
        error: ankusa_records::error_head(&error).to_owned(),
    }
}

/// `cas` as PEM text, for librdkafka's `ssl.ca.pem`.
fn pem(cas: &[rustls::pki_types::CertificateDer<'static>]) -> String {
    use base64::Engine;
    let mut out = String::new();
    for c in cas {
        out.push_str("-----BEGIN CERTIFICATE-----\n");
        let b64 = base64::engine::general_purpose::STANDARD.encode(c.as_ref());
        for line in b64.as_bytes().chunks(64) {
            out.push_str(std::str::from_utf8(line).unwrap_or_default());
            out.push('\n');
        }
        out.push_str("-----END CERTIFICATE-----\n");
    }
    out
}

/// The message's headers: what an HTTP delivery of `env` to `sink` sends.
fn headers(sink: &SinkPart<'_>, env: &Envelope) -> OwnedHeaders {
    let mut h = OwnedHeaders::new_with_capacity(8 + env.headers.len() + sink.headers.len());
    let mut put = |name: &str, value: &[u8]| {
        h = std::mem::take(&mut h).insert(Header {
            key: name,
            value: Some(value),
        });
    };
    put("Content-Type", env.content_type.as_bytes());
    put("webhook-id", env.id.as_bytes());
    put("ankusa-tenant", env.tenant_or_default().as_bytes());
    put("ankusa-source", env.source.as_bytes());
    for (name, value) in &env.headers {
        put(name, &value[..]);
    }
    if let Some((ts, signature)) = &sink.signature {
        put("webhook-timestamp", ts.to_string().as_bytes());
        put("webhook-signature", signature.as_bytes());
    }
    for (name, value) in sink.headers {
        put(name.as_str(), value.as_bytes());
    }
    h
}
