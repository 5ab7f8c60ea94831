//! The NATS JetStream sink (`kind: nats`) against a real `nats-server` on loopback (built
//! from its Go module, scripts/nats-server.sh): what a message carries, the retries and the
//! DLQ while the broker is away, and each acked hook published once across a SIGKILL of
//! the node between the publish and the commit of its outcome.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ankusa_relay::testkit::{metric, NatsServer, TestNode};
use async_nats::jetstream;

use crate::support::{
    admin_call, client, http_get_admin, post, proc_node, queued_rows, series, until, Proc,
};

const ADMIN: &str = "nats-admin-token-012345";

/// A JetStream context on `server` (with its token).
async fn js(server: &NatsServer, token: Option<&str>) -> jetstream::Context {
    let mut o = async_nats::ConnectOptions::new();
    if let Some(t) = token {
        o = o.token(t.to_owned());
    }
    jetstream::new(
        o.connect(server.url())
            .await
            .expect("connect to nats-server"),
    )
}

/// Makes the stream `name` on `subjects`.
async fn make_stream(
    js: &jetstream::Context,
    name: &str,
    subjects: &[&str],
) -> jetstream::stream::Stream {
    js.create_stream(jetstream::stream::Config {
        name: name.to_owned(),
        subjects: subjects.iter().map(|s| (*s).to_owned()).collect(),
        ..Default::default()
    })
    .await
    .expect("create the stream")
}

/// Every message of `stream`, in order.
async fn messages(
    stream: &mut jetstream::stream::Stream,
) -> Vec<jetstream::message::StreamMessage> {
    let info = stream.info().await.expect("stream info").clone();
    let mut out = Vec::new();
    for seq in info.state.first_sequence..=info.state.last_sequence {
        if let Ok(m) = stream.get_raw_message(seq).await {
            out.push(m);
        }
    }
    out
}

async fn stream_len(stream: &mut jetstream::stream::Stream) -> u64 {
    stream.info().await.map_or(0, |i| i.state.messages)
}

/// The node's counters (`/v1/node`).
async fn counters(node: &TestNode) -> serde_json::Value {
    admin_call(node.admin_addr, "GET", "/v1/node", ADMIN, "")
        .await
        .1["counters"]
        .clone()
}

/// The hook log's record of hook `id` (`GET /v1/hooks/{id}`).
async fn hook_of(node: &TestNode, id: &str) -> serde_json::Value {
    let (status, v) = admin_call(
        node.admin_addr,
        "GET",
        &format!("/v1/hooks/{id}"),
        ADMIN,
        "",
    )
    .await;
    assert_eq!(status, 200, "{v}");
    v
}

fn header<'a>(m: &'a jetstream::message::StreamMessage, name: &str) -> &'a str {
    m.headers.get(name).map_or("", |v| v.as_str())
}

/// A message's subject, key (`Nats-Msg-Id`), body and headers are as docs/delivery.md
/// says: `{tenant}` as one subject token (a tenant with a `.` and a space percent-encoded),
/// the Standard Webhooks signature over the body, the forwarded and the sink's headers.
/// A hook published before its stream exists is retried (NATS's 503, no responders) and
/// delivered once the stream is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_sink_publishes_each_hook_with_its_key_headers_and_signature() {
    let server = NatsServer::start(Some("broker-token"));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("nats.token"), "broker-token\n").unwrap();
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [50], jitter: none, max_attempts: 1000 }")
        .sink_yaml(&format!(
            r#"{{ id: stream, kind: nats, url: "{}", timeout_ms: 2000,
                 secret: {{ value: "whsec_c2VjcmV0LW9uZQ==" }}, headers: {{ x-env: test }},
                 nats: {{ subject: "hooks.{{tenant}}.{{source}}", token: {{ file: {} }} }} }}"#,
            server.url(),
            dir.path().join("nats.token").display()
        ))
        .route("r", &["stream"])
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
    // No stream takes the subject yet: NATS answers 503 (no responders), retried.
    let first = send("acme", r#"{"n":1}"#).await;
    until(20, "a retryable attempt (no stream yet)", || async {
        series(
            &node,
            "ankusa_delivery_attempts_total{sink=\"stream\",outcome=\"retryable\"}",
        )
        .await
            >= 1.0
    })
    .await;
    let js = js(&server, Some("broker-token")).await;
    let mut stream = make_stream(&js, "HOOKS", &["hooks.>"]).await;
    let second = send("a.b c", r#"{"n":2}"#).await;
    until(20, "both hooks in the stream", || {
        let mut s = stream.clone();
        async move { stream_len(&mut s).await >= 2 }
    })
    .await;
    let got = messages(&mut stream).await;
    assert_eq!(got.len(), 2, "two hooks, two messages");
    let by_id: HashMap<&str, &jetstream::message::StreamMessage> =
        got.iter().map(|m| (header(m, "webhook-id"), m)).collect();
    let (m1, m2) = (by_id[first.as_str()], by_id[second.as_str()]);
    assert_eq!(m1.subject.as_str(), "hooks.acme.gh");
    assert_eq!(m2.subject.as_str(), "hooks.a%2Eb%20c.gh");
    assert_eq!(&m1.payload[..], br#"{"n":1}"#);
    assert_eq!(header(m1, "Nats-Msg-Id"), format!("{first}:stream"));
    assert_eq!(header(m1, "Content-Type"), "application/json");
    assert_eq!(header(m1, "ankusa-tenant"), "acme");
    assert_eq!(header(m2, "ankusa-tenant"), "a.b c");
    assert_eq!(header(m1, "ankusa-source"), "gh");
    assert_eq!(header(m1, "x-github-event"), "push");
    assert_eq!(header(m1, "x-env"), "test");
    let ts: u64 = header(m1, "webhook-timestamp").parse().unwrap();
    let key = ankusa_verify::standard_webhooks_key(b"whsec_c2VjcmV0LW9uZQ==");
    assert_eq!(
        header(m1, "webhook-signature"),
        ankusa_verify::standard_webhooks_sign(&key, &first, ts, br#"{"n":1}"#)
    );
    // Both delivered, nothing left in the queue.
    until(20, "both hooks delivered", || async {
        series(
            &node,
            "ankusa_delivery_attempts_total{sink=\"stream\",outcome=\"delivered\"}",
        )
        .await
            == 2.0
    })
    .await;
    node.stop().await;
}

/// The broker killed: attempts time out and are retried on the schedule until
/// `retry.max_attempts` dead-letters the hook, as for an HTTP sink. The broker back (same
/// port and store): a new hook is delivered, and the dead one replayed from the DLQ is
/// too — each once in the stream.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_away_retries_then_dead_letters_and_back_delivers_and_replays() {
    let mut server = NatsServer::start(None);
    make_stream(&js(&server, None).await, "AWAY", &["away.>"]).await;
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [100, 200, 400, 800], jitter: none, max_attempts: 8 }")
        .sink_yaml(&format!(
            r#"{{ id: away, kind: nats, url: "{}", timeout_ms: 500, breaker_cooldown_ms: 200,
                 nats: {{ subject: "away.{{tenant}}" }} }}"#,
            server.url()
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
    // Connected and delivering first.
    let warm = send("warm").await;
    until(20, "the first hook delivered", || async {
        series(
            &node,
            "ankusa_delivery_attempts_total{sink=\"away\",outcome=\"delivered\"}",
        )
        .await
            == 1.0
    })
    .await;
    server.stop();
    let lost = send("while away").await;
    until(60, "the hook dead-lettered after 8 attempts", || async {
        counters(&node).await["dead"].as_i64() == Some(1)
    })
    .await;
    let hook = hook_of(&node, &lost).await;
    let attempts = hook["sinks"][0]["attempts"].as_u64().unwrap_or(0);
    assert_eq!(attempts, 8, "{hook}");
    server.restart();
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
        60,
        "every hook delivered once the broker is back",
        || async { queued_rows(&counters(&node).await) == 0 },
    )
    .await;
    let mut stream = js(&server, None).await.get_stream("AWAY").await.unwrap();
    let got = messages(&mut stream).await;
    let mut ids: Vec<&str> = got.iter().map(|m| header(m, "webhook-id")).collect();
    ids.sort_unstable();
    let mut want = vec![warm.as_str(), lost.as_str(), back.as_str()];
    want.sort_unstable();
    assert_eq!(ids, want, "each hook once in the stream");
    node.stop().await;
}

/// `tls://`: a server whose certificate a private CA signed is reached by the sink that
/// trusts that CA (`ca_bundle`) and signs in with its user and password (a secret); the
/// same server without the bundle, or with a wrong password, gets no message — those
/// attempts fail and are retried.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_sink_over_tls_trusts_its_ca_bundle_and_signs_in_with_its_password() {
    let (ca, cert, key) = crate::support::private_ca();
    let dir = tempfile::tempdir().unwrap();
    let file = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let (ca_file, cert_file, key_file) = (
        file("ca.pem", ca.pem()),
        file("cert.pem", cert.pem()),
        file("key.pem", key.serialize_pem()),
    );
    let args: Vec<String> = ["--tls", "--tlscert", &cert_file, "--tlskey", &key_file]
        .into_iter()
        .chain(["--user", "relay", "--pass", "relay-password"])
        .map(str::to_owned)
        .collect();
    let server = NatsServer::start_with(&args);
    let url = format!("tls://127.0.0.1:{}", server.port);
    let nats_client = async_nats::ConnectOptions::new()
        .user_and_password("relay".into(), "relay-password".into())
        .add_root_certificates(ca_file.into())
        .require_tls(true)
        .connect(&url)
        .await
        .expect("the test's TLS connection");
    let mut stream = make_stream(&jetstream::new(nats_client), "TLS", &["tls.>"]).await;
    let pem = serde_json::to_string(&ca.pem()).unwrap();
    let sink = |id: &str, ca: bool, password: &str| {
        format!(
            r#"{{ id: {id}, kind: nats, url: "{url}", timeout_ms: 500, breaker_failures: 1000,
                 {} nats: {{ subject: "tls.{id}.{{tenant}}", user: relay, password: {{ value: {password} }} }} }}"#,
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
    until(20, "the trusted sink's message", || {
        let mut s = stream.clone();
        async move { stream_len(&mut s).await >= 1 }
    })
    .await;
    let errors = |id: &'static str| {
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
        20,
        "the untrusted and the wrong password's attempts failing",
        || async { errors("untrusted").await >= 2.0 && errors("wrongpw").await >= 2.0 },
    )
    .await;
    let got = messages(&mut stream).await;
    assert_eq!(got.len(), 1, "only the trusted sink's message");
    assert_eq!(got[0].subject.as_str(), "tls.trusted.acme");
    assert_eq!(&got[0].payload[..], b"over tls");
    node.stop().await;
}

/// A hook whose message is over the server's `max_payload` (1 MB by default, headers
/// included) is dead-lettered at its first attempt with an error that says so — no retry
/// could deliver it — while a hook that fits is delivered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_over_the_servers_max_payload_is_dead_lettered_at_once() {
    let server = NatsServer::start(None);
    make_stream(&js(&server, None).await, "BIG", &["big.>"]).await;
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .section("retry: { schedule_ms: [50], jitter: none, max_attempts: 1000 }")
        .sink_yaml(&format!(
            r#"{{ id: big, kind: nats, url: "{}", nats: {{ subject: "big.{{tenant}}" }} }}"#,
            server.url()
        ))
        .route("r", &["big"])
        .source_yaml(
            "{ id: in, tenant: { header: x-tenant }, verify: { scheme: none }, route: r, body_limit_bytes: 4194304 }",
        )
        .start()
        .await;
    let c = client();
    let h = [("x-tenant", "acme".to_owned())];
    let small = post(&c, &node.ingest_url("in"), &h, vec![b'a'; 1000]).await;
    assert_eq!(small.status, 202);
    let large = post(&c, &node.ingest_url("in"), &h, vec![b'b'; 1_200_000]).await;
    assert_eq!(large.status, 202);
    let id = large.json()["id"].as_str().unwrap().to_owned();
    until(
        20,
        "the large hook dead and the small one delivered",
        || async {
            let c = counters(&node).await;
            c["dead"].as_i64() == Some(1) && queued_rows(&c) == 1
        },
    )
    .await;
    let hook = hook_of(&node, &id).await;
    let sink = &hook["sinks"][0];
    assert_eq!(sink["attempts"].as_u64(), Some(1), "{hook}");
    let event = &sink["events"][0];
    assert_eq!(event["outcome"], "dead", "{hook}");
    assert!(
        event["error"]
            .as_str()
            .unwrap_or("")
            .contains("max payload size exceeded"),
        "{hook}"
    );
    node.stop().await;
}

/// A reload that keeps a NATS sink as it was keeps its connection; one that changes it
/// builds it anew on a connection of its own and closes the old one once its deliveries
/// end (no connection left behind per reload).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_keeps_an_unchanged_sinks_connection_and_closes_a_replaced_ones() {
    let server = NatsServer::start(None);
    let js = js(&server, None).await;
    let mut stream = make_stream(&js, "RELOAD", &["one.>", "two.>"]).await;
    let builder = |subject: &str| {
        TestNode::builder()
            .admin_token("ops", ADMIN)
            .section("dispatch: { tick_interval_ms: 10 }")
            .sink_yaml(&format!(
                r#"{{ id: s, kind: nats, url: "{}", nats: {{ subject: "{subject}" }} }}"#,
                server.url()
            ))
            .route("r", &["s"])
            .open_source("in", "r")
    };
    let node = builder("one.{tenant}").start().await;
    let c = client();
    let deliver = |n: u64| {
        let (c, url, s) = (c.clone(), node.ingest_url("in"), stream.clone());
        async move {
            let h = [("x-tenant", "acme".to_owned())];
            assert_eq!(post(&c, &url, &h, b"x".to_vec()).await.status, 202);
            until(20, "the hook in the stream", || {
                let mut s = s.clone();
                async move { stream_len(&mut s).await >= n }
            })
            .await;
        }
    };
    deliver(1).await;
    // The test's own connection and the sink's.
    assert_eq!(server.connections(), 2);
    let same = node
        .reloader
        .reload(&builder("one.{tenant}").yaml_at(node.dir()), Vec::new());
    assert!(same.is_ok(), "{same:?}");
    deliver(2).await;
    assert_eq!(
        server.connections(),
        2,
        "an unchanged sink kept its connection"
    );
    let changed = node
        .reloader
        .reload(&builder("two.{tenant}").yaml_at(node.dir()), Vec::new());
    assert!(changed.is_ok(), "{changed:?}");
    deliver(3).await;
    let last = messages(&mut stream).await.pop().unwrap();
    assert_eq!(last.subject.as_str(), "two.acme", "the new sink published");
    until(20, "the replaced sink's connection closed", || async {
        server.connections() == 2
    })
    .await;
    node.stop().await;
}

/// A TCP proxy to `upstream` whose server-to-client direction can be held: what the
/// client sends reaches the server, what the server answers waits while `hold` is set.
struct HoldingProxy {
    port: u16,
    hold: Arc<AtomicBool>,
}

impl HoldingProxy {
    async fn start(upstream: u16) -> HoldingProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let hold = Arc::new(AtomicBool::new(false));
        let h = hold.clone();
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    continue;
                };
                let h = h.clone();
                tokio::spawn(async move {
                    use tokio::io::{AsyncReadExt, AsyncWriteExt};
                    let (mut cr, mut cw) = client.into_split();
                    let (mut sr, mut sw) = server.into_split();
                    let up = tokio::spawn(async move {
                        let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    });
                    let mut buf = vec![0u8; 64 << 10];
                    loop {
                        let n = match sr.read(&mut buf).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        while h.load(Ordering::SeqCst) {
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                    up.abort();
                });
            }
        });
        HoldingProxy { port, hold }
    }
}

/// Each acked hook is published exactly once across a SIGKILL of the node between the
/// publish and the commit of its outcome: the stream's acks are held (a proxy), the
/// stream has every message, the node is killed; restarted, it publishes them again with
/// the same `Nats-Msg-Id`, the stream answers each as a duplicate (counted), and reading
/// the stream back finds every hook once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_acked_hook_is_published_once_across_a_sigkill_between_publish_and_commit() {
    const HOOKS: usize = 20;
    let server = NatsServer::start(None);
    let js_ctx = js(&server, None).await;
    let mut stream = make_stream(&js_ctx, "CRASH", &["crash.>"]).await;
    let proxy = HoldingProxy::start(server.port).await;
    let dir = tempfile::tempdir().unwrap();
    let spec = proc_node()
        .section("dispatch: { tick_interval_ms: 10 }")
        .sink_yaml(&format!(
            r#"{{ id: crash, kind: nats, url: "nats://127.0.0.1:{}", timeout_ms: 60000,
                 nats: {{ subject: "crash.{{tenant}}" }} }}"#,
            proxy.port
        ))
        .route("r", &["crash"])
        .open_source("s", "r");
    let mut node = Proc::start(dir.path(), &spec);
    let ingest = format!("http://127.0.0.1:{}/ingest/s", spec.ingest_port().unwrap());
    let c = client();
    let tenant = [("x-tenant", "acme".to_owned())];
    let warm = post(&c, &ingest, &tenant, b"warm".to_vec()).await;
    assert_eq!(warm.status, 202);
    for _ in 0..200 {
        if stream_len(&mut stream).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(stream_len(&mut stream).await, 1, "the first hook published");
    // The connection is up: hold the stream's answers, then take the hooks in.
    proxy.hold.store(true, Ordering::SeqCst);
    let mut ids = vec![warm.json()["id"].as_str().unwrap().to_owned()];
    for i in 0..HOOKS {
        let r = post(&c, &ingest, &tenant, format!("hook {i}").into_bytes()).await;
        assert_eq!(r.status, 202);
        ids.push(r.json()["id"].as_str().unwrap().to_owned());
    }
    for _ in 0..400 {
        if stream_len(&mut stream).await == HOOKS as u64 + 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert_eq!(
        stream_len(&mut stream).await,
        HOOKS as u64 + 1,
        "every publish reached the stream while its acks were held"
    );
    node.kill9();
    proxy.hold.store(false, Ordering::SeqCst);
    let _node = Proc::start(dir.path(), &spec);
    let admin = spec.admin_port().unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let (_, body) = http_get_admin(admin, "/v1/node").unwrap();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap();
        if queued_rows(&v["counters"]) == 0 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "never delivered: {v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let (_, text) = http_get_admin(admin, "/metrics").unwrap();
    assert_eq!(
        metric(&text, "ankusa_delivery_duplicates_total{sink=\"crash\"}"),
        Some(HOOKS as f64),
        "the restarted node published the held hooks again, and the stream said duplicate"
    );
    let got = messages(&mut stream).await;
    let mut seen: HashMap<String, usize> = HashMap::new();
    for m in &got {
        *seen.entry(header(m, "webhook-id").to_owned()).or_default() += 1;
    }
    assert_eq!(got.len(), HOOKS + 1, "{seen:?}");
    for id in &ids {
        assert_eq!(seen.get(id), Some(&1), "hook {id} in the stream once");
    }
}
