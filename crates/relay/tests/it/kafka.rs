//! The Kafka sink (`kind: kafka`) against a real Kafka broker on loopback (Apache Kafka's
//! jars, KRaft, one node: scripts/kafka.sh): what a message carries, the retries and the
//! DLQ while the broker is away, and each acked hook in the topic once across a SIGKILL of
//! the node after its transaction committed and before its outcome did — and after it was
//! published and before its transaction committed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ankusa_relay::testkit::{free_port, metric, KafkaBroker, TestNode};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::{Offset, TopicPartitionList};

use crate::support::{
    admin_call, client, http_get_admin, post, proc_node, queued_rows, series, until, Proc,
};

const ADMIN: &str = "kafka-admin-token-0123456";

/// One committed message of a topic, as a test reads it.
#[derive(Debug, Clone)]
struct Read {
    topic: String,
    key: Vec<u8>,
    body: Vec<u8>,
    headers: HashMap<String, String>,
}

/// Every committed message of the topics whose names start with `prefix` (read committed,
/// from each partition's start to its end).
fn committed(bootstrap: &str, prefix: &str) -> Vec<Read> {
    read_topics(bootstrap, prefix, "read_committed")
}

/// Every message of the topics whose names start with `prefix`, at `isolation` (Kafka's
/// `isolation.level`: `read_uncommitted` sees open and aborted transactions' messages too).
fn read_topics(bootstrap: &str, prefix: &str, isolation: &str) -> Vec<Read> {
    let c: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .set("group.id", "ankusa-test-reader")
        .set("enable.auto.commit", "false")
        .set("enable.partition.eof", "true")
        .set("isolation.level", isolation)
        .create()
        .expect("a test consumer");
    let md = c
        .fetch_metadata(None, Duration::from_secs(10))
        .expect("the broker's metadata");
    let mut tpl = TopicPartitionList::new();
    for t in md.topics().iter().filter(|t| t.name().starts_with(prefix)) {
        for p in t.partitions() {
            tpl.add_partition_offset(t.name(), p.id(), Offset::Beginning)
                .unwrap();
        }
    }
    let mut left = tpl.count();
    if left == 0 {
        return Vec::new();
    }
    c.assign(&tpl).unwrap();
    let mut out = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while left > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "the topics never ended"
        );
        match c.poll(Duration::from_millis(200)) {
            Some(Ok(m)) => out.push(Read {
                topic: m.topic().to_owned(),
                key: m.key().unwrap_or_default().to_vec(),
                body: m.payload().unwrap_or_default().to_vec(),
                headers: m
                    .headers()
                    .map(|h| {
                        h.iter()
                            .map(|h| {
                                let v = h.value.map(|v| String::from_utf8_lossy(v).into_owned());
                                (h.key.to_owned(), v.unwrap_or_default())
                            })
                            .collect()
                    })
                    .unwrap_or_default(),
            }),
            Some(Err(rdkafka::error::KafkaError::PartitionEOF(_))) => left -= 1,
            _ => {}
        }
    }
    out
}

async fn counters(node: &TestNode) -> serde_json::Value {
    admin_call(node.admin_addr, "GET", "/v1/node", ADMIN, "")
        .await
        .1["counters"]
        .clone()
}

/// A message's topic, key, body and headers are as docs/delivery.md says: `{tenant}` in
/// topic characters (a tenant with a `.` and a space as `_XX`), the hook's id as the key,
/// the Standard Webhooks signature over the body, the forwarded and the sink's headers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_sink_publishes_each_hook_with_its_key_headers_and_signature() {
    let broker = KafkaBroker::start();
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [50], jitter: none, max_attempts: 1000 }")
        .sink_yaml(&format!(
            r#"{{ id: topic, kind: kafka, url: "kafka://{}", timeout_ms: 10000,
                 secret: {{ value: "whsec_c2VjcmV0LW9uZQ==" }}, headers: {{ x-env: test }},
                 kafka: {{ topic: "hooks.{{tenant}}.{{source}}" }} }}"#,
            broker.bootstrap()
        ))
        .route("r", &["topic"])
        .source_yaml(
            "{ id: gh, tenant: { header: x-tenant }, verify: { scheme: none }, route: r, forward_headers: [x-github-event] }",
        )
        .start()
        .await;
    let c = client();
    let send = |tenant: &str, body: &str| {
        let (c, url) = (c.clone(), node.ingest_url("gh"));
        let h = vec![
            ("x-tenant", tenant.to_owned()),
            ("x-github-event", "push".to_owned()),
            ("content-type", "application/json".to_owned()),
        ];
        let body = body.to_owned();
        async move {
            let r = post(&c, &url, &h, body.into_bytes()).await;
            assert_eq!(r.status, 202, "{:?}", r.json());
            r.json()["id"].as_str().unwrap().to_owned()
        }
    };
    let first = send("acme", r#"{"n":1}"#).await;
    let second = send("a.b c", r#"{"n":2}"#).await;
    until(60, "both hooks delivered", || async {
        series(
            &node,
            "ankusa_delivery_attempts_total{sink=\"topic\",outcome=\"delivered\"}",
        )
        .await
            == 2.0
    })
    .await;
    let bootstrap = broker.bootstrap();
    let got = tokio::task::spawn_blocking(move || committed(&bootstrap, "hooks."))
        .await
        .unwrap();
    assert_eq!(got.len(), 2, "two hooks, two messages: {got:?}");
    let by_id: HashMap<&[u8], &Read> = got.iter().map(|m| (&m.key[..], m)).collect();
    let (m1, m2) = (by_id[first.as_bytes()], by_id[second.as_bytes()]);
    assert_eq!(m1.topic, "hooks.acme.gh");
    assert_eq!(m2.topic, "hooks.a_2Eb_20c.gh");
    assert_eq!(m1.body, br#"{"n":1}"#);
    let h = |m: &Read, name: &str| m.headers.get(name).cloned().unwrap_or_default();
    assert_eq!(h(m1, "webhook-id"), first);
    assert_eq!(h(m1, "Content-Type"), "application/json");
    assert_eq!(h(m1, "ankusa-tenant"), "acme");
    assert_eq!(h(m2, "ankusa-tenant"), "a.b c");
    assert_eq!(h(m1, "ankusa-source"), "gh");
    assert_eq!(h(m1, "x-github-event"), "push");
    assert_eq!(h(m1, "x-env"), "test");
    let ts: u64 = h(m1, "webhook-timestamp").parse().unwrap();
    let key = ankusa_verify::standard_webhooks_key(b"whsec_c2VjcmV0LW9uZQ==");
    assert_eq!(
        h(m1, "webhook-signature"),
        ankusa_verify::standard_webhooks_sign(&key, &first, ts, br#"{"n":1}"#)
    );
    assert_eq!(queued_rows(&counters(&node).await), 0);
    node.stop().await;
}

/// The broker killed: attempts fail and are retried on the schedule until
/// `retry.max_attempts` dead-letters the hook, as for an HTTP sink. The broker back (same
/// port and data): a new hook is delivered, and the dead one replayed from the DLQ is too —
/// each once in the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_away_retries_then_dead_letters_and_back_delivers_and_replays() {
    let mut broker = KafkaBroker::start();
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [100, 200, 400], jitter: none, max_attempts: 4 }")
        .sink_yaml(&format!(
            r#"{{ id: away, kind: kafka, url: "kafka://{}", timeout_ms: 1500, breaker_cooldown_ms: 200,
                 kafka: {{ topic: "away" }} }}"#,
            broker.bootstrap()
        ))
        .route("r", &["away"])
        .open_source("s", "r")
        .start()
        .await;
    let c = client();
    let send = |body: &'static str| {
        let (c, url) = (c.clone(), node.ingest_url("s"));
        async move {
            let h = [("x-tenant", "acme".to_owned())];
            let r = post(&c, &url, &h, body.as_bytes().to_vec()).await;
            assert_eq!(r.status, 202);
            r.json()["id"].as_str().unwrap().to_owned()
        }
    };
    let warm = send("warm").await;
    until(60, "the first hook delivered", || async {
        series(
            &node,
            "ankusa_delivery_attempts_total{sink=\"away\",outcome=\"delivered\"}",
        )
        .await
            == 1.0
    })
    .await;
    broker.stop();
    let lost = send("while away").await;
    until(90, "the hook dead-lettered after 4 attempts", || async {
        counters(&node).await["dead"].as_i64() == Some(1)
    })
    .await;
    let (s, hook) = admin_call(
        node.admin_addr,
        "GET",
        &format!("/v1/hooks/{lost}"),
        ADMIN,
        "",
    )
    .await;
    assert_eq!(s, 200, "{hook}");
    assert_eq!(hook["sinks"][0]["attempts"].as_u64(), Some(4), "{hook}");
    broker.restart();
    let back = send("back").await;
    let (s, v) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/dlq/replay",
        ADMIN,
        r#"{"tenant": "acme"}"#,
    )
    .await;
    assert_eq!((s, v["revived"].as_u64()), (200, Some(1)), "{v}");
    until(
        120,
        "every hook delivered once the broker is back",
        || async { queued_rows(&counters(&node).await) == 0 },
    )
    .await;
    let bootstrap = broker.bootstrap();
    let got = tokio::task::spawn_blocking(move || committed(&bootstrap, "away"))
        .await
        .unwrap();
    let mut ids: Vec<String> = got
        .iter()
        .map(|m| String::from_utf8_lossy(&m.key).into_owned())
        .collect();
    ids.sort_unstable();
    let mut want = vec![warm, lost, back];
    want.sort_unstable();
    assert_eq!(ids, want, "each hook once in the topic");
    node.stop().await;
}

/// `kafka+tls://` with SASL PLAIN: a broker whose certificate a private CA signed is reached
/// by the sink that trusts that CA (`ca_bundle`) and signs in with its password (a secret);
/// the same broker without the bundle, or with a wrong password, gets no message — those
/// attempts fail and are retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kafka_sink_over_tls_trusts_its_ca_bundle_and_signs_in_with_its_password() {
    let (ca, cert, key) = crate::support::private_ca();
    let dir = tempfile::tempdir().unwrap();
    let keystore = dir.path().join("broker.pem");
    std::fs::write(&keystore, format!("{}{}", key.serialize_pem(), cert.pem())).unwrap();
    let broker = tokio::task::spawn_blocking(move || {
        KafkaBroker::start_secured(&keystore, &[("relay", "relay-password")])
    })
    .await
    .unwrap();
    let url = format!("kafka+tls://127.0.0.1:{}", broker.secured.unwrap());
    let pem = serde_json::to_string(&ca.pem()).unwrap();
    let sink = |id: &str, ca: bool, password: &str| {
        format!(
            r#"{{ id: {id}, kind: kafka, url: "{url}", timeout_ms: 3000, breaker_failures: 1000,
                 {} kafka: {{ topic: "tls.{id}.{{tenant}}",
                 sasl: {{ mechanism: PLAIN, username: relay, password: {{ value: {password} }} }} }} }}"#,
            if ca {
                format!("ca_bundle: {{ pem: {pem} }},")
            } else {
                String::new()
            }
        )
    };
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [50], jitter: none, max_attempts: 1000 }")
        .sink_yaml(&sink("trusted", true, "relay-password"))
        .sink_yaml(&sink("untrusted", false, "relay-password"))
        .sink_yaml(&sink("wrongpw", true, "not-the-password"))
        .route("r", &["trusted", "untrusted", "wrongpw"])
        .open_source("in", "r")
        .start()
        .await;
    let h = [("x-tenant", "acme".to_owned())];
    let r = post(&client(), &node.ingest_url("in"), &h, b"over tls".to_vec()).await;
    assert_eq!(r.status, 202);
    until(60, "the trusted sink's message delivered", || async {
        series(
            &node,
            "ankusa_delivery_attempts_total{sink=\"trusted\",outcome=\"delivered\"}",
        )
        .await
            == 1.0
    })
    .await;
    let failing = |id: &'static str| {
        let node = &node;
        async move {
            series(
                node,
                &format!("ankusa_delivery_attempts_total{{sink=\"{id}\",outcome=\"error\"}}"),
            )
            .await
        }
    };
    until(
        60,
        "the untrusted and the wrong password's attempts failing",
        || async { failing("untrusted").await >= 2.0 && failing("wrongpw").await >= 2.0 },
    )
    .await;
    let bootstrap = broker.bootstrap();
    let got = tokio::task::spawn_blocking(move || committed(&bootstrap, "tls."))
        .await
        .unwrap();
    assert_eq!(got.len(), 1, "only the trusted sink's message: {got:?}");
    assert_eq!(got[0].topic, "tls.trusted.acme");
    assert_eq!(got[0].body, b"over tls");
    node.stop().await;
}

/// What the proxy holds of the broker's answers.
const PASS: u8 = 0;
/// Kafka's API keys the proxy tells apart.
const PRODUCE: i16 = 0;
const END_TXN: i16 = 26;
/// The answers to `EndTxn` (API key 26), and what follows them on their connection: the
/// broker commits (or aborts) the transaction, the producer never learns.
const HOLD_END_TXN: u8 = 1;
/// The answers to `Produce` (API key 0), and what follows them on their connection: the
/// broker has the messages, the producer never learns it does.
const HOLD_PRODUCE: u8 = 2;
/// The `EndTxn` requests, and what follows them on their connection: the broker never
/// hears of the commit.
const HOLD_END_TXN_REQUEST: u8 = 3;

/// A TCP proxy to a Kafka broker that reads the protocol's frames (a 4-byte size, then the
/// request's API key and correlation id; the answer's correlation id) and holds answers as
/// `mode` says.
struct KafkaProxy {
    port: u16,
    mode: Arc<AtomicU8>,
    /// `EndTxn` requests held, counted.
    held_requests: Arc<std::sync::atomic::AtomicUsize>,
}

impl KafkaProxy {
    async fn start(port: u16, upstream: Arc<BrokerPort>) -> KafkaProxy {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port))
            .await
            .unwrap();
        let mode = Arc::new(AtomicU8::new(PASS));
        let held_requests = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (m, h) = (mode.clone(), held_requests.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let to = upstream.get();
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await else {
                    continue;
                };
                tokio::spawn(relay_frames(client, server, m.clone(), h.clone()));
            }
        });
        KafkaProxy {
            port,
            mode,
            held_requests,
        }
    }
}

/// The broker's port, known once it starts (after the proxy, whose port it advertises).
#[derive(Default)]
struct BrokerPort(std::sync::atomic::AtomicU16);

impl BrokerPort {
    fn get(&self) -> u16 {
        self.0.load(Ordering::SeqCst)
    }
}

async fn read_frame(r: &mut (impl tokio::io::AsyncRead + Unpin)) -> Option<Vec<u8>> {
    use tokio::io::AsyncReadExt;
    let mut size = [0u8; 4];
    r.read_exact(&mut size).await.ok()?;
    let mut frame = vec![0u8; u32::from_be_bytes(size) as usize];
    r.read_exact(&mut frame).await.ok()?;
    let mut whole = size.to_vec();
    whole.extend_from_slice(&frame);
    Some(whole)
}

async fn relay_frames(
    client: tokio::net::TcpStream,
    server: tokio::net::TcpStream,
    mode: Arc<AtomicU8>,
    held_requests: Arc<std::sync::atomic::AtomicUsize>,
) {
    use tokio::io::AsyncWriteExt;
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // The API key of each request sent, by its correlation id: what an answer answers.
    let asked = Arc::new(std::sync::Mutex::new(HashMap::<i32, i16>::new()));
    let (record, up_mode) = (asked.clone(), mode.clone());
    let up = tokio::spawn(async move {
        let mut held = false;
        while let Some(f) = read_frame(&mut cr).await {
            if f.len() >= 12 {
                let api_key = i16::from_be_bytes([f[4], f[5]]);
                let correlation = i32::from_be_bytes([f[8], f[9], f[10], f[11]]);
                record.lock().unwrap().insert(correlation, api_key);
                if api_key == END_TXN
                    && !held
                    && up_mode.load(Ordering::SeqCst) == HOLD_END_TXN_REQUEST
                {
                    held = true;
                    held_requests.fetch_add(1, Ordering::SeqCst);
                }
            }
            if held {
                continue;
            }
            if sw.write_all(&f).await.is_err() {
                break;
            }
        }
    });
    let mut held = false;
    while let Some(f) = read_frame(&mut sr).await {
        let answers = if f.len() >= 8 {
            let correlation = i32::from_be_bytes([f[4], f[5], f[6], f[7]]);
            asked.lock().unwrap().remove(&correlation)
        } else {
            None
        };
        held = held
            || match mode.load(Ordering::SeqCst) {
                HOLD_PRODUCE => answers == Some(PRODUCE),
                HOLD_END_TXN => answers == Some(END_TXN),
                _ => false,
            };
        if held {
            // Never answered: the connection stays open, silent, until the node dies.
            continue;
        }
        if cw.write_all(&f).await.is_err() {
            break;
        }
    }
    up.abort();
}

/// Each acked hook is in the topic once across a SIGKILL of the node:
/// 1. after its transaction committed and before its outcome did (the broker's answer to
///    the commit held by a proxy): restarted, the node reads the marked hooks back, finds
///    them committed, and delivers them as duplicates without publishing them again;
/// 2. after its marker was written and its commit asked for, the request held by the proxy:
///    restarted, the producer's start aborts the open transaction, the marked hooks are read
///    back, not found, and published again;
/// 3. after it was published and before any marker (the answers to its publishes held): restarted, the
///    producer's start aborts the open transaction, and the hooks are published again —
///    each once, as a `read_committed` reader sees the topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acked_hook_is_in_the_topic_once_across_a_sigkill_around_its_commit() {
    const HOOKS: usize = 12;
    let upstream = Arc::new(BrokerPort::default());
    let proxy_port = free_port();
    let proxy = KafkaProxy::start(proxy_port, upstream.clone()).await;
    let broker_port = free_port();
    upstream.0.store(broker_port, Ordering::SeqCst);
    let broker = tokio::task::spawn_blocking(move || {
        KafkaBroker::start_advertising(broker_port, proxy_port)
    })
    .await
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let spec = proc_node()
        .section("dispatch: { tick_interval_ms: 10 }")
        .sink_yaml(&format!(
            r#"{{ id: crash, kind: kafka, url: "kafka://127.0.0.1:{}", timeout_ms: 60000,
                 kafka: {{ topic: "crash" }} }}"#,
            proxy.port
        ))
        .route("r", &["crash"])
        .open_source("s", "r");
    let mut node = Proc::start(dir.path(), &spec);
    let ingest = format!("http://127.0.0.1:{}/ingest/s", spec.ingest_port().unwrap());
    let admin = spec.admin_port().unwrap();
    let c = client();
    let tenant = [("x-tenant", "acme".to_owned())];
    let mut ids = Vec::new();
    let send = |body: String| {
        let (c, ingest, tenant) = (c.clone(), ingest.clone(), tenant.clone());
        async move {
            let r = post(&c, &ingest, &tenant, body.into_bytes()).await;
            assert_eq!(r.status, 202);
            r.json()["id"].as_str().unwrap().to_owned()
        }
    };
    let bootstrap = broker.bootstrap();
    let count = |b: String| async move {
        tokio::task::spawn_blocking(move || committed(&b, "crash").len())
            .await
            .unwrap()
    };
    let drained = |what: &'static str| {
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        loop {
            let (_, body) = http_get_admin(admin, "/v1/node").unwrap();
            let v: serde_json::Value = serde_json::from_str(&body).unwrap();
            if queued_rows(&v["counters"]) == 0 {
                break;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{what}: never delivered: {v}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    ids.push(send("warm".into()).await);
    drained("the first hook");
    assert_eq!(
        count(bootstrap.clone()).await,
        1,
        "the first hook published"
    );

    // 1. The commit reaches the broker; its answer does not reach the node.
    proxy.mode.store(HOLD_END_TXN, Ordering::SeqCst);
    for i in 0..HOOKS {
        ids.push(send(format!("held commit {i}")).await);
    }
    let mut committed_held = 0;
    for _ in 0..400 {
        committed_held = count(bootstrap.clone()).await - 1;
        if committed_held > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        committed_held > 0,
        "a transaction committed while its answer was held"
    );
    // The producer waits on that answer: nothing more commits before the kill.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let committed_held = count(bootstrap.clone()).await - 1;
    node.kill9();
    proxy.mode.store(PASS, Ordering::SeqCst);
    let mut node = Proc::start(dir.path(), &spec);
    drained("after the first kill");
    let (_, text) = http_get_admin(admin, "/metrics").unwrap();
    assert_eq!(
        metric(&text, "ankusa_delivery_duplicates_total{sink=\"crash\"}"),
        Some(committed_held as f64),
        "the restarted node read the committed hooks back instead of publishing them again"
    );

    // 2. Marked, the commit asked for and never received: aborted at the restart.
    proxy.mode.store(HOLD_END_TXN_REQUEST, Ordering::SeqCst);
    let before = count(bootstrap.clone()).await;
    for i in 0..HOOKS {
        ids.push(send(format!("held commit request {i}")).await);
    }
    until(60, "a commit request held", || async {
        proxy.held_requests.load(Ordering::SeqCst) > 0
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(bootstrap.clone()).await, before, "nothing committed");
    node.kill9();
    proxy.mode.store(PASS, Ordering::SeqCst);
    let mut node = Proc::start(dir.path(), &spec);
    drained("after the second kill");
    let (_, text) = http_get_admin(admin, "/metrics").unwrap();
    assert_eq!(
        metric(&text, "ankusa_delivery_duplicates_total{sink=\"crash\"}").unwrap_or(0.0),
        0.0,
        "the aborted transaction's hooks were read back, not found, and published again"
    );

    // 3. Published, no marker yet (the answers to the publishes held): aborted at the restart.
    let before = count(bootstrap.clone()).await;
    let uncommitted = |b: String| async move {
        tokio::task::spawn_blocking(move || read_topics(&b, "crash", "read_uncommitted").len())
            .await
            .unwrap()
    };
    let seen_before = uncommitted(bootstrap.clone()).await;
    proxy.mode.store(HOLD_PRODUCE, Ordering::SeqCst);
    for i in 0..HOOKS {
        ids.push(send(format!("held publish {i}")).await);
    }
    until(60, "held publishes on the broker, uncommitted", || {
        let b = bootstrap.clone();
        async move { uncommitted(b).await > seen_before }
    })
    .await;
    assert_eq!(count(bootstrap.clone()).await, before, "nothing committed");
    node.kill9();
    proxy.mode.store(PASS, Ordering::SeqCst);
    let _node = Proc::start(dir.path(), &spec);
    drained("after the third kill");

    let b = bootstrap.clone();
    let got = tokio::task::spawn_blocking(move || committed(&b, "crash"))
        .await
        .unwrap();
    let mut seen: HashMap<String, usize> = HashMap::new();
    for m in &got {
        *seen
            .entry(String::from_utf8_lossy(&m.key).into_owned())
            .or_default() += 1;
    }
    assert_eq!(got.len(), ids.len(), "{seen:?}");
    for id in &ids {
        assert_eq!(seen.get(id), Some(&1), "hook {id} in the topic once");
    }
    drop(broker);
}
