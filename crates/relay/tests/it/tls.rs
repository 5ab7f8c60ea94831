//! Delivery to HTTPS sinks behind a private certificate authority: a local HTTPS sink on
//! 127.0.0.1 whose certificate a test CA signed, trusted through `sinks[].ca_bundle` or the
//! node-wide `dispatch.ca_bundle`, and refused (retried, never delivered) without either.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ankusa_relay::testkit::{eventually, metric, TestNode};
use http_body_util::BodyExt;
use hyper::service::service_fn;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::support::{client, get_text, post};

/// A CA, and a server certificate for 127.0.0.1 it signed: (the CA's PEM, the server's
/// chain and key).
fn private_ca() -> (String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
    let (ca, server, key) = crate::support::private_ca();
    (
        ca.pem(),
        vec![server.der().clone()],
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    )
}

fn acceptor(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> tokio_rustls::TlsAcceptor {
    let tls = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(chain, key)
    .unwrap();
    tokio_rustls::TlsAcceptor::from(Arc::new(tls))
}

/// The certificate an HTTPS sink presents to its next connections.
type Presented = Arc<Mutex<tokio_rustls::TlsAcceptor>>;

/// An HTTPS sink on 127.0.0.1: answers 200 to every request and keeps each one's path.
async fn https_sink(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> (u16, Arc<Mutex<Vec<String>>>) {
    let (port, seen, _) = rotating_https_sink(chain, key).await;
    (port, seen)
}

/// [`https_sink`], whose certificate the test may replace (for the connections after).
async fn rotating_https_sink(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
) -> (u16, Arc<Mutex<Vec<String>>>, Presented) {
    let presented = Arc::new(Mutex::new(acceptor(chain, key)));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let paths = seen.clone();
    let current = presented.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = current.lock().unwrap().clone();
            let paths = paths.clone();
            tokio::spawn(async move {
                // A client that does not trust the certificate ends the handshake here.
                let Ok(stream) = acceptor.accept(tcp).await else {
                    return;
                };
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let paths = paths.clone();
                    async move {
                        let path = req.uri().path().to_owned();
                        let _ = req.into_body().collect().await;
                        paths.lock().unwrap().push(path);
                        Ok::<_, std::convert::Infallible>(hyper::Response::new(
                            http_body_util::Full::new(bytes::Bytes::new()),
                        ))
                    }
                });
                // One request per connection: every delivery shakes hands with the
                // certificate presented now.
                let _ = hyper::server::conn::http1::Builder::new()
                    .keep_alive(false)
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    (port, seen, presented)
}

async fn post_one(node: &TestNode, tenant: &str) {
    let r = post(
        &client(),
        &node.ingest_url("in"),
        &[("x-tenant", tenant.to_owned())],
        r#"{"over":"tls"}"#,
    )
    .await;
    assert_eq!(r.status, 202);
}

async fn attempts(node: &TestNode, sink: &str, outcome: &str) -> f64 {
    let (_, text) = get_text(&client(), &node.admin_url("/metrics")).await;
    metric(
        &text,
        &format!(r#"ankusa_delivery_attempts_total{{sink="{sink}",outcome="{outcome}"}}"#),
    )
    .unwrap_or(0.0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sink_behind_a_private_ca_is_delivered_to_only_when_trusted() {
    let (ca_pem, chain, key) = private_ca();
    let (port, seen) = https_sink(chain, key).await;
    let url = |path: &str| format!("https://127.0.0.1:{port}/{path}");
    let pem = serde_json::to_string(&ca_pem).unwrap();
    let node = TestNode::builder()
        .sink_yaml(&format!(
            r#"{{ id: trusted, url: "{}", ca_bundle: {{ pem: {pem} }} }}"#,
            url("trusted")
        ))
        .sink_yaml(&format!(
            r#"{{ id: untrusted, url: "{}", breaker_failures: 1000 }}"#,
            url("untrusted")
        ))
        .route("main", &["trusted", "untrusted"])
        .open_source("in", "main")
        .section("retry: { schedule_ms: [50, 100], max_attempts: 50, jitter: none }")
        .start()
        .await;
    post_one(&node, "acme").await;
    eventually(20, "the trusted sink's delivery", || {
        seen.lock().unwrap().iter().any(|p| p == "/trusted")
    })
    .await;
    // The other sink of the same server: its certificate is not trusted, so each attempt
    // is a connection error, retried, and nothing reaches the server.
    let mut errors = 0.0;
    for _ in 0..100 {
        errors = attempts(&node, "untrusted", "error").await;
        if errors >= 2.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(errors >= 2.0, "attempts to the untrusted sink: {errors}");
    assert_eq!(attempts(&node, "untrusted", "delivered").await, 0.0);
    assert!(!seen.lock().unwrap().iter().any(|p| p == "/untrusted"));
    assert_eq!(attempts(&node, "trusted", "delivered").await, 1.0);
    node.stop().await;

    // The node-wide bundle, from a file, trusts the CA for every sink.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("ca.pem");
    std::fs::write(&file, &ca_pem).unwrap();
    let node = TestNode::builder()
        .sink("plain", &url("plain"))
        .route("main", &["plain"])
        .open_source("in", "main")
        .section(&format!(
            "dispatch: {{ ca_bundle: {{ file: {} }} }}",
            file.display()
        ))
        .start()
        .await;
    post_one(&node, "acme").await;
    eventually(20, "delivery through the node-wide bundle", || {
        seen.lock().unwrap().iter().any(|p| p == "/plain")
    })
    .await;
    node.stop().await;
}

/// The node-wide bundle's file rotated under the same path (a mounted Secret or ConfigMap
/// updated: the operator's `caBundleRef`) is read again without a restart: the file's
/// watcher sees it change, the sinks that trusted the old authorities are rebuilt, and a
/// sink whose server now presents a certificate of the new CA is reached before and after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_wide_bundle_rotated_in_its_file_is_trusted_without_a_restart() {
    let (old_ca, chain, key) = private_ca();
    let (port, seen, presented) = rotating_https_sink(chain, key).await;
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("ca.pem");
    std::fs::write(&bundle, &old_ca).unwrap();
    let spec = TestNode::builder()
        .sink("rotated", &format!("https://127.0.0.1:{port}/rotated"))
        .route("main", &["rotated"])
        .open_source("in", "main")
        .section("retry: { schedule_ms: [50, 100], max_attempts: 1000, jitter: none }")
        .section(&format!(
            "dispatch: {{ tick_interval_ms: 10, ca_bundle: {{ file: {} }} }}",
            bundle.display()
        ));
    let node = spec.clone().start().await;
    let config = dir.path().join("relay.yaml");
    std::fs::write(&config, spec.yaml_at(node.dir())).unwrap();
    let watcher = tokio::spawn(ankusa_relay::reload::watch(
        node.reloader.clone(),
        config,
        None,
        Duration::from_millis(50),
    ));
    post_one(&node, "acme").await;
    let delivered = |n: usize| {
        let seen = seen.clone();
        move || seen.lock().unwrap().len() >= n
    };
    eventually(20, "delivery under the first CA", delivered(1)).await;

    // The server's certificate and the bundle both move to a new CA; nothing else changes.
    let (new_ca, chain, key) = private_ca();
    *presented.lock().unwrap() = acceptor(chain, key);
    let swapped = dir.path().join("ca.pem.new");
    std::fs::write(&swapped, &new_ca).unwrap();
    std::fs::rename(&swapped, &bundle).unwrap();
    let mut reloads = 0.0;
    for _ in 0..200 {
        let (_, text) = get_text(&client(), &node.admin_url("/metrics")).await;
        reloads =
            metric(&text, r#"ankusa_config_reloads_total{outcome="unchanged"}"#).unwrap_or(0.0);
        if reloads >= 1.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(reloads >= 1.0, "the rotated bundle was never read again");
    post_one(&node, "acme").await;
    eventually(20, "delivery under the rotated CA", delivered(2)).await;
    assert_eq!(attempts(&node, "rotated", "delivered").await, 2.0);
    watcher.abort();
    node.stop().await;
}

/// A bundle that holds no certificate is refused at start, naming its key.
#[test]
fn a_bundle_without_a_certificate_is_a_configuration_error() {
    let dir = tempfile::tempdir().unwrap();
    for (section, sink, key) in [
        (
            "",
            r#"{ id: s, url: "https://127.0.0.1:1/", ca_bundle: { pem: "not a certificate" } }"#,
            "sinks[0].ca_bundle",
        ),
        (
            "dispatch: { ca_bundle: { file: /nonexistent/ca.pem } }",
            r#"{ id: s, url: "https://127.0.0.1:1/" }"#,
            "dispatch.ca_bundle",
        ),
    ] {
        let b = TestNode::builder()
            .sink_yaml(sink)
            .route("r", &["s"])
            .open_source("in", "r");
        let b = if section.is_empty() {
            b
        } else {
            b.section(section)
        };
        let yaml = b.yaml_at(dir.path());
        let err = ankusa_config::Config::from_yaml(&yaml, Vec::new())
            .and_then(|c| c.validate().map(|_| c))
            .unwrap_err();
        assert!(err.to_string().contains(key), "{key}: {err}");
    }
}

/// `ankusa-relay sink --tls-cert --tls-key` serves HTTPS: a node that trusts its CA
/// delivers to it, and it prints the hook; a certificate file that holds none is refused
/// before it listens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demo_sink_serves_https_to_a_node_that_trusts_its_ca() {
    use std::io::BufRead;
    let (ca, server, key) = crate::support::private_ca();
    let dir = tempfile::tempdir().unwrap();
    let (cert_file, key_file) = (dir.path().join("tls.crt"), dir.path().join("tls.key"));
    std::fs::write(&cert_file, server.pem()).unwrap();
    std::fs::write(&key_file, key.serialize_pem()).unwrap();
    let tls = [std::ffi::OsStr::new("--tls-cert"), cert_file.as_os_str()];
    let key_arg = [std::ffi::OsStr::new("--tls-key"), key_file.as_os_str()];
    let (sink, mut out, first, port) = crate::support::demo_sink(tls.into_iter().chain(key_arg));
    assert!(first.contains("listening on https://127.0.0.1:"), "{first}");
    let pem = serde_json::to_string(&ca.pem()).unwrap();
    let node = TestNode::builder()
        .sink("demo", &format!("https://127.0.0.1:{port}/hooks"))
        .route("main", &["demo"])
        .open_source("in", "main")
        .section(&format!("dispatch: {{ ca_bundle: {{ pem: {pem} }} }}"))
        .start()
        .await;
    post_one(&node, "acme").await;
    let line = tokio::task::spawn_blocking(move || {
        let mut l = String::new();
        out.read_line(&mut l).unwrap();
        l
    })
    .await
    .unwrap();
    assert!(
        line.starts_with("received ") && line.contains("(tenant acme") && line.contains("→ 204"),
        "{line}"
    );
    node.stop().await;
    drop(sink);

    let refused = crate::support::bin()
        .args(["sink", "--listen", "127.0.0.1:0", "--tls-cert"])
        .arg(&key_file)
        .arg("--tls-key")
        .arg(&key_file)
        .output()
        .unwrap();
    assert_eq!(refused.status.code(), Some(1));
    let err = String::from_utf8_lossy(&refused.stderr);
    assert!(err.contains("holds no certificate"), "{err}");
}
