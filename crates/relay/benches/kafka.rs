//! `cargo bench -p ankusa-relay --bench kafka`: deliveries per second to a Kafka sink
//! against a bare client of the same library.
//!
//! 1. **relay**: a backlog of 20 000 hooks (1 KiB bodies, 1 000 tenants) is written to a
//!    store; a node starts on it and drains it to a `kind: kafka` sink — a topic on a Kafka
//!    broker on loopback (Apache Kafka's jars, KRaft, scripts/kafka.sh) — until every
//!    publish's transaction has committed. The node ticks at its default interval (ticks
//!    also start when slots free).
//! 2. **bare**: rdkafka alone — the same library and producer settings (idempotent,
//!    transactional, `acks=all`), the same messages (body, key, the headers a delivery
//!    carries with its Standard Webhooks signature), committed in transactions of as many
//!    messages as the node's per-sink limit — into a fresh topic of its own. It writes no
//!    marker: it has no store.
//! 3. **twin**: the `delivery` bench's transitions twin (`load::twin`): the same backlog
//!    drained by a plain lock-step loop making the store's moves a delivery needs,
//!    publishing through the node's own Kafka sink (markers included), with none of the
//!    pipeline's machinery.
//! 4. Once, for reference: **the store's moves alone**, the twin without its publishes.
//!
//! The three alternate over [`ROUNDS`] rounds, each on new topics, so that a change in the
//! shared host's load falls on every side of a round; the rule judges the median round.
//!
//! PASS if, in the median round (by the ratio), the relay's CPU per delivery is at most
//! 1.15× the twin's (the `delivery` and `nats` benches' rule). The issue's rule — the
//! relay's rate at least 70% of the bare client's — is printed with the ceiling a relay
//! making the store's moves has on these two cores (docs/performance.md).
#![allow(clippy::expect_used)] // a bench program: a failed expect is a failed run

use std::time::Duration;

use load::broker::{measure, Drain};

use ankusa_relay::node::Node;
use ankusa_relay::testkit::{KafkaBroker, TestNode};
use rdkafka::config::ClientConfig;
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};

mod load;

const BACKLOG: u64 = 20_000;
const TENANTS: u64 = 1_000;
const BODY: usize = 1_024;
const CONCURRENCY: usize = 128;
const ROUNDS: usize = 5;
const SECRET: &str = "whsec_YmVuY2gtc2luay1zZWNyZXQ=";
/// The rule: the relay's CPU per delivery over the transitions twin's, in the median round.
const TWIN_RULE: f64 = 1.15;

/// The node's configuration: its store at `data`, one signed Kafka sink `k` publishing to
/// `topic`.
fn config(data: &std::path::Path, broker: &KafkaBroker, topic: &str) -> ankusa_config::Config {
    TestNode::builder()
        .data_dir(data)
        .section(&format!(
            "dispatch: {{ max_inflight: 512, per_sink_inflight: {CONCURRENCY} }}"
        ))
        .sink_yaml(&format!(
            r#"{{ id: k, kind: kafka, url: "kafka://{}", secret: {{ value: "{SECRET}" }}, kafka: {{ topic: "{topic}" }} }}"#,
            broker.bootstrap()
        ))
        .route("r", &["k"])
        .open_source("in", "r")
        .config_at(data)
}

/// The relay drains its backlog into topic `relay-<round>`.
async fn relay_drain(broker: &KafkaBroker, round: usize, pid: u32) -> Drain {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    load::write_backlog(&data, "k", BACKLOG, TENANTS, BODY);
    eprintln!("kafka: the relay drains its backlog");
    let node = Node::start(config(&data, broker, &format!("relay-{round}")))
        .await
        .expect("node");
    load::broker::node_drain(node, "k", BACKLOG, pid).await
}

/// The transitions twin drains the same backlog into topic `twin-<round>`, publishing
/// through the node's own sink; with `publish` false, the store's moves alone.
async fn twin_drain(broker: &KafkaBroker, round: usize, pid: u32, publish: bool) -> Drain {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("db");
    load::write_backlog(&data, "k", BACKLOG, TENANTS, BODY);
    let store = std::sync::Arc::new(load::node_store(&data));
    let config = config(&data, broker, &format!("twin-{round}"));
    let deliverer =
        ankusa_relay::dispatch::delivery::Deliverer::from_config(&config).expect("deliverer");
    deliverer.with_store(store.clone());
    let target = load::twin::Target {
        sink: deliverer.sink("k").expect("the sink"),
        deliverer,
    };
    eprintln!("kafka: the transitions twin drains its backlog (publishing: {publish})");
    measure(
        BACKLOG,
        pid,
        load::twin::lockstep(
            &store,
            BACKLOG,
            publish.then_some(&target),
            CONCURRENCY,
            committed,
        ),
    )
    .await
}

/// A twin's publish committed.
fn committed(a: &ankusa_relay::dispatch::delivery::Attempt) {
    assert_eq!(
        a.verdict,
        ankusa_relay::dispatch::delivery::Verdict::Delivered,
        "{a:?}"
    );
}

/// The bare client publishes the same messages into topic `bare-<round>`, in transactions
/// of `CONCURRENCY` messages.
async fn bare_publish(broker: &KafkaBroker, round: usize, pid: u32) -> Drain {
    let producer: FutureProducer = ClientConfig::new()
        .set("bootstrap.servers", broker.bootstrap())
        .set("transactional.id", format!("bench-bare-{round}"))
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("linger.ms", "1")
        .create()
        .expect("a producer");
    let p = producer.clone();
    tokio::task::spawn_blocking(move || p.init_transactions(Duration::from_secs(30)))
        .await
        .expect("join")
        .expect("init_transactions");
    let key = ankusa_verify::standard_webhooks_key(SECRET.as_bytes());
    let bodies: Vec<Vec<u8>> = (0..BACKLOG).map(|n| load::backlog_body(n, BODY)).collect();
    let topic = format!("bare-{round}");
    eprintln!("kafka: the bare client publishes the same messages");
    measure(BACKLOG, pid, async {
        for (c, chunk) in bodies.chunks(CONCURRENCY).enumerate() {
            let p = producer.clone();
            let (topic, key, chunk) = (topic.clone(), key.clone(), chunk.to_vec());
            // librdkafka's transaction calls block: on a blocking thread, as the sink's do.
            tokio::task::spawn_blocking(move || {
                p.begin_transaction().expect("begin");
                let mut pending = Vec::with_capacity(chunk.len());
                for (i, body) in chunk.iter().enumerate() {
                    let n = c * CONCURRENCY + i;
                    let id = format!("backlog-{n}");
                    let tenant = format!("tenant-{}", n as u64 % TENANTS);
                    let ts = ankusa_keyspace::now_ms() / 1000;
                    let signature = ankusa_verify::standard_webhooks_sign(&key, &id, ts, body);
                    let ts = ts.to_string();
                    let h = [
                        ("Content-Type", "application/octet-stream".as_bytes()),
                        ("webhook-id", id.as_bytes()),
                        ("ankusa-tenant", tenant.as_bytes()),
                        ("ankusa-source", b"in"),
                        ("webhook-timestamp", ts.as_bytes()),
                        ("webhook-signature", signature.as_bytes()),
                    ]
                    .into_iter()
                    .fold(OwnedHeaders::new(), |h, (k, v)| {
                        h.insert(Header {
                            key: k,
                            value: Some(v),
                        })
                    });
                    let record = FutureRecord::to(&topic)
                        .key(id.as_bytes())
                        .payload(body)
                        .headers(h);
                    pending.push(p.send_result(record).map_err(|(e, _)| e).expect("queued"));
                }
                let rt = tokio::runtime::Handle::current();
                for d in pending {
                    rt.block_on(d).expect("a report").expect("delivered");
                }
                p.commit_transaction(Duration::from_secs(30))
                    .expect("commit");
            })
            .await
            .expect("join");
        }
    })
    .await
}

fn main() -> std::process::ExitCode {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let (rounds, moves) = rt.block_on(async {
        let broker = tokio::task::spawn_blocking(KafkaBroker::start)
            .await
            .expect("the broker");
        let pid = broker.pid().expect("the broker runs");
        let mut rounds = Vec::with_capacity(ROUNDS);
        for round in 0..ROUNDS {
            let relay = relay_drain(&broker, round, pid).await;
            let twin = twin_drain(&broker, round, pid, true).await;
            let bare = bare_publish(&broker, round, pid).await;
            rounds.push((relay, twin, bare));
        }
        let moves = twin_drain(&broker, ROUNDS, pid, false).await;
        (rounds, moves)
    });
    load::broker::report(
        "kafka",
        &format!("{BACKLOG} hooks of {BODY} B over {TENANTS} tenants to a Kafka topic, {CONCURRENCY} publishes in flight"),
        &rounds,
        &moves,
        TWIN_RULE,
    )
}
