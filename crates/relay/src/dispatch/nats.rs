//! The NATS JetStream sink (`kind: nats`): each hook published on its subject, the
//! stream's acknowledgement its delivery.
//!
//! - `Nats-Msg-Id: <hook id>:<sink id>`: JetStream drops a second publish of the same id
//!   within the stream's duplicate window (two minutes unless the stream says otherwise),
//!   so an attempt made again after a publish that was never answered — a timeout, a
//!   broken connection, the node killed before it committed the outcome — is not a second
//!   message. The stream answers such a publish as a duplicate; it counts as delivered
//!   (`ankusa_delivery_duplicates_total`). The sink's id is part of the key so that two
//!   sinks publishing into one stream are not taken for each other.
//! - The message: the stored body; as headers, what an HTTP delivery sends (`Content-Type`,
//!   `webhook-id`, the Standard Webhooks signature with the sink's `secret`,
//!   `ankusa-tenant`, `ankusa-source`, the forwarded headers, the sink's `headers`).
//! - One connection per sink (NATS multiplexes publishes over it), opened by the first
//!   attempt and kept: the client reconnects by itself, and an attempt while it is away
//!   waits for the ack until the sink's timeout.
//! - The verdicts follow the HTTP sink's: acknowledged → delivered; no stream on the
//!   subject (NATS's 503 "no responders"), a timeout, a broken connection or a 5xx from
//!   JetStream → retried; a 4xx from JetStream or a message over the server's
//!   `max_payload` → dead-lettered (a 4xx retried instead with `dead_letter_on_4xx:
//!   false`).

use std::time::{Duration, Instant};

use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::message::PublishMessage;
use async_nats::{jetstream, ConnectOptions, HeaderMap, HeaderName, ServerAddr};
use bytes::Bytes;

use ankusa_config::{ConfigError, SinkConfig};
use ankusa_records::{Envelope, ErrorClass};

/// How a NATS sink signs in.
enum Auth {
    None,
    /// A `.creds` file's contents: a JWT and the NKey seed that signs the server's nonce.
    Creds(String),
    Token(String),
    User(String, String),
}

/// A NATS sink's servers, subject and connection.
pub struct NatsSink {
    servers: Vec<ServerAddr>,
    subject: String,
    auth: Auth,
    tls: rustls::ClientConfig,
    /// A `tls://` server among them: refuse a server that does not offer TLS.
    require_tls: bool,
    timeout: Duration,
    /// The JetStream context over the sink's one connection, opened by the first attempt.
    js: tokio::sync::OnceCell<jetstream::Context>,
}

impl std::fmt::Debug for NatsSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NatsSink")
            .field("servers", &self.servers)
            .field("subject", &self.subject)
            .finish_non_exhaustive()
    }
}

impl NatsSink {
    /// The sink of `s` (`key`: `sinks[i]`), trusting `cas` for TLS, and the secrets it
    /// resolved (for its fingerprint: a rotated credential is a new sink).
    pub fn build(
        s: &SinkConfig,
        key: &str,
        cas: &[rustls::pki_types::CertificateDer<'static>],
    ) -> Result<(NatsSink, Vec<u8>), ConfigError> {
        let invalid = |k: &str, message: String| ConfigError::Invalid {
            key: format!("{key}.{k}"),
            message,
        };
        let servers = s
            .url
            .split(',')
            .map(|u| u.trim().parse::<ServerAddr>())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| invalid("url", format!("{e}")))?;
        let nats = s
            .nats
            .as_ref()
            .ok_or_else(|| invalid("nats.subject", "a NATS sink needs a subject".into()))?;
        let text = |src: &ankusa_config::SecretSource, k: &str| {
            String::from_utf8(src.resolve(&format!("{key}.nats.{k}"))?)
                .map_err(|_| invalid(&format!("nats.{k}"), "is not UTF-8".into()))
        };
        let auth = match (&nats.creds, &nats.token, &nats.user, &nats.password) {
            (Some(c), ..) => {
                let creds = text(c, "creds")?;
                // Read now, so a malformed file is a configuration error, not an attempt's.
                ConnectOptions::new()
                    .credentials(&creds)
                    .map_err(|e| invalid("nats.creds", format!("{e}")))?;
                Auth::Creds(creds)
            }
            (None, Some(t), ..) => Auth::Token(text(t, "token")?),
            (None, None, Some(u), Some(p)) => Auth::User(u.clone(), text(p, "password")?),
            _ => Auth::None,
        };
        let secrets = match &auth {
            Auth::None => Vec::new(),
            Auth::Creds(c) | Auth::Token(c) => c.as_bytes().to_vec(),
            Auth::User(u, p) => [u.as_bytes(), b"\0", p.as_bytes()].concat(),
        };
        let tls = crate::http::tls_client(cas)
            .map_err(|e| invalid("ca_bundle", format!("TLS set-up: {e}")))?;
        let sink = NatsSink {
            require_tls: servers.iter().any(ServerAddr::tls_required),
            servers,
            subject: nats.subject.clone(),
            auth,
            tls,
            timeout: Duration::from_millis(s.timeout_ms),
            js: tokio::sync::OnceCell::new(),
        };
        Ok((sink, secrets))
    }

    /// The JetStream context, connecting on the first call. The connection is made in the
    /// background: a server that is down is retried by the client, not refused here.
    async fn context(&self) -> Result<&jetstream::Context, async_nats::ConnectError> {
        self.js
            .get_or_try_init(|| async {
                let mut o = ConnectOptions::new()
                    .name(concat!("ankusa/", env!("CARGO_PKG_VERSION")))
                    .retry_on_initial_connect()
                    .max_reconnects(None)
                    .connection_timeout(self.timeout)
                    .require_tls(self.require_tls)
                    .tls_client_config(self.tls.clone());
                o = match &self.auth {
                    Auth::None => o,
                    Auth::Creds(c) => o.credentials(c).map_err(|e| {
                        async_nats::ConnectError::with_source(
                            async_nats::ConnectErrorKind::Authentication,
                            e,
                        )
                    })?,
                    Auth::Token(t) => o.token(t.clone()),
                    Auth::User(u, p) => o.user_and_password(u.clone(), p.clone()),
                };
                let client = o.connect(self.servers.as_slice()).await?;
                Ok(jetstream::ContextBuilder::new()
                    .timeout(self.timeout)
                    .build(client))
            })
            .await
    }

    /// The subject of `env`'s message: the template with its tenant and source, each as
    /// one subject token.
    pub fn subject(&self, env: &Envelope) -> String {
        self.subject
            .replace(
                "{tenant}",
                &ankusa_config::subject_token(env.tenant_or_default()),
            )
            .replace("{source}", &ankusa_config::subject_token(&env.source))
    }

    /// Publishes `env` once, as `sink`'s message, and waits for the stream's
    /// acknowledgement.
    pub async fn publish(&self, sink: &SinkPart<'_>, env: &Envelope) -> Published {
        let started = Instant::now();
        let message = PublishMessage::build()
            .payload(Bytes::from(env.body.clone()))
            .headers(headers(sink, env))
            .message_id(format!("{}:{}", env.id, sink.id));
        let subject = self.subject(env);
        let sent = tokio::time::timeout(self.timeout, async {
            let js = self.context().await.map_err(Failure::Connect)?;
            let ack = js
                .send_publish(subject, message)
                .await
                .map_err(Failure::Publish)?;
            ack.await.map_err(Failure::Publish)
        })
        .await;
        let latency = started.elapsed();
        let outcome = match sent {
            Ok(Ok(ack)) => Ok(ack.duplicate),
            Err(_) => Err(failed(false, 0, ErrorClass::Timeout, "timeout".into())),
            Ok(Err(Failure::Connect(e))) => Err(failed(
                false,
                0,
                ErrorClass::Connection,
                format!("connect: {e}"),
            )),
            Ok(Err(Failure::Publish(e))) => Err(refused(sink, &e)),
        };
        Published { outcome, latency }
    }
}

/// What the delivery hands a publish: the sink's part of the message and its verdicts.
pub struct SinkPart<'a> {
    pub id: &'a str,
    /// The Standard Webhooks signature with the sink's secret: timestamp and value.
    pub signature: Option<(u64, String)>,
    /// The sink's configured headers.
    pub headers: &'a [(hyper::header::HeaderName, hyper::header::HeaderValue)],
    pub dead_letter_on_4xx: bool,
}

/// A publish's end: acknowledged (`true`: as a duplicate), or why not.
#[derive(Debug)]
pub struct Published {
    pub outcome: Result<bool, Failed>,
    pub latency: Duration,
}

/// A publish that was not acknowledged.
#[derive(Debug)]
pub struct Failed {
    /// Dead-letter (else retry).
    pub dead: bool,
    /// NATS's or JetStream's status, 0 for none.
    pub status: u16,
    pub class: ErrorClass,
    pub error: String,
}

fn failed(dead: bool, status: u16, class: ErrorClass, error: String) -> Failed {
    Failed {
        dead,
        status,
        class,
        error: ankusa_records::error_head(&error).to_owned(),
    }
}

enum Failure {
    Connect(async_nats::ConnectError),
    Publish(jetstream::context::PublishError),
}

/// A publish the client or the stream refused: whether to dead-letter it, its status, class
/// and error.
fn refused(sink: &SinkPart<'_>, e: &jetstream::context::PublishError) -> Failed {
    match e.kind() {
        PublishErrorKind::TimedOut => failed(false, 0, ErrorClass::Timeout, format!("{e}")),
        PublishErrorKind::BrokenPipe => failed(false, 0, ErrorClass::Connection, format!("{e}")),
        // NATS answers 503 "no responders": no stream takes the subject (yet).
        PublishErrorKind::StreamNotFound => failed(
            false,
            503,
            ErrorClass::Status,
            "NATS 503: no stream takes the subject".into(),
        ),
        PublishErrorKind::MaxPayloadExceeded => {
            failed(true, 0, ErrorClass::Request, format!("{e}"))
        }
        _ => {
            let api =
                std::error::Error::source(e).and_then(|s| s.downcast_ref::<jetstream::Error>());
            let code = api.map_or(0, |a| u16::try_from(a.code()).unwrap_or(0));
            let dead = (400..500).contains(&code) && sink.dead_letter_on_4xx;
            let class = if code == 0 {
                ErrorClass::Connection
            } else {
                ErrorClass::Status
            };
            let error = match api {
                Some(a) => format!("JetStream {code}: {a}"),
                None => format!("publish: {e}"),
            };
            failed(dead, code, class, error)
        }
    }
}

/// The message's headers: what an HTTP delivery of `env` to `sink` sends (a name or value
/// NATS cannot carry, from a store written by hand, is left out).
fn headers(sink: &SinkPart<'_>, env: &Envelope) -> HeaderMap {
    let mut h = HeaderMap::new();
    let mut put = |name: &str, value: &str| {
        if let (Ok(n), Ok(v)) = (
            name.parse::<HeaderName>(),
            value.parse::<async_nats::HeaderValue>(),
        ) {
            h.append(n, v);
        }
    };
    put("Content-Type", &env.content_type);
    put("webhook-id", &env.id);
    put("ankusa-tenant", env.tenant_or_default());
    put("ankusa-source", &env.source);
    for (name, value) in &env.headers {
        if let Ok(value) = std::str::from_utf8(value) {
            put(name, value);
        }
    }
    if let Some((ts, signature)) = &sink.signature {
        put("webhook-timestamp", &ts.to_string());
        put("webhook-signature", signature);
    }
    for (name, value) in sink.headers {
        if let Ok(value) = value.to_str() {
            put(name.as_str(), value);
        }
    }
    h
}
