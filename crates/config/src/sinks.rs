//! Sinks: where hooks are delivered (`sinks`).

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, CaBundle, ConfigError, SecretSource, Secrets};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SinkConfig {
    pub id: String,
    /// `http` (the default): the relay POSTs each hook to `url`. `pull`: consumers claim
    /// the hooks over HTTP (`/pull/{sink}/claim`, docs/pull.md); no `url`. `nats`: each
    /// hook is published to a NATS JetStream stream (`url`: `nats://` or `tls://`, and the
    /// `nats` block). `kafka`: each hook is published to a Kafka topic in a transaction
    /// (`url`: `kafka://` or `kafka+tls://`, and the `kafka` block).
    #[serde(default)]
    pub kind: SinkKind,
    #[serde(default)]
    pub url: String,
    /// Signs deliveries (Standard Webhooks); `whsec_` + base64, or raw bytes.
    #[serde(default)]
    pub secret: Option<SecretSource>,
    #[serde(default = "default_sink_timeout")]
    pub timeout_ms: u64,
    #[serde(default)]
    pub headers: std::collections::BTreeMap<String, String>,
    /// A 4xx other than 408 and 429 dead-letters at once (else it is retried).
    #[serde(default = "crate::default_true")]
    pub dead_letter_on_4xx: bool,
    /// Deliveries in flight to this sink (default: `dispatch.per_sink_inflight`).
    #[serde(default)]
    pub max_inflight: Option<usize>,
    /// Consecutive failed attempts (408, 429, 5xx, timeouts, connection errors) that open
    /// the sink's breaker.
    #[serde(default = "default_breaker_failures")]
    pub breaker_failures: u32,
    /// How long an open breaker keeps the sink's rows due before a probe (longer if the
    /// sink's `Retry-After` asks for it).
    #[serde(default = "default_breaker_cooldown")]
    pub breaker_cooldown_ms: u64,
    /// Certificate authorities this sink's HTTPS server may be signed by, beyond the web
    /// PKI and `dispatch.ca_bundle` (a sink behind a private CA).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<CaBundle>,
    /// A pull sink's lease when the claim names none, in milliseconds (default:
    /// `pull.lease_ms`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_ms: Option<u64>,
    /// A NATS sink's subject and credentials (`kind: nats` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nats: Option<NatsConfig>,
    /// A Kafka sink's topic, sign-in and batch (`kind: kafka` only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kafka: Option<crate::KafkaConfig>,
}

/// Where a NATS sink publishes, and as whom.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct NatsConfig {
    /// The subject each hook is published on; `{tenant}` and `{source}` are replaced by
    /// the hook's tenant and source, each one subject token (see [`subject_token`]).
    pub subject: String,
    /// A `.creds` file's contents (the user's JWT and NKey seed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creds: Option<SecretSource>,
    /// A token the server takes as the client's credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<SecretSource>,
    /// A user name, with `password`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub password: Option<SecretSource>,
}

/// The placeholders a NATS subject may hold.
const SUBJECT_PLACEHOLDERS: [&str; 2] = ["{tenant}", "{source}"];

/// `value` as one NATS subject token: bytes outside `[A-Za-z0-9_-]` as `%XX` (a tenant
/// id may hold `.`, `*`, `>` or spaces, which would split or widen the subject).
pub fn subject_token(value: &str) -> std::borrow::Cow<'_, str> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
    if !value.is_empty() && value.bytes().all(plain) {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() * 3 + 2);
    if value.is_empty() {
        out.push_str("%00");
    }
    for b in value.bytes() {
        if plain(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// What is wrong with `subject` as a NATS sink's subject template, if anything: it must
/// be tokens joined by `.`, none empty, no wildcard (`*`, `>`), no white space, and no
/// placeholder but those of [`SUBJECT_PLACEHOLDERS`].
fn subject_problem(subject: &str) -> Option<String> {
    let mut filled = subject.to_owned();
    for p in SUBJECT_PLACEHOLDERS {
        filled = filled.replace(p, "x");
    }
    if filled.contains(['{', '}']) {
        return Some(format!(
            "the only placeholders are {}",
            SUBJECT_PLACEHOLDERS.join(" and ")
        ));
    }
    if filled.is_empty() || filled.len() > 1024 {
        return Some("is 1 to 1 024 bytes".into());
    }
    for token in filled.split('.') {
        if token.is_empty() {
            return Some("has an empty token (`..`, or a `.` at an end)".into());
        }
        if token == "*" || token == ">" {
            return Some("has a wildcard token: a publish subject names one subject".into());
        }
        if token.chars().any(char::is_whitespace) {
            return Some("has white space".into());
        }
    }
    None
}

/// How a sink's deliveries leave the node.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum SinkKind {
    /// An HTTP POST to the sink's `url`.
    #[default]
    Http,
    /// Consumers lease the hooks over HTTP (the claim gateway).
    Pull,
    /// A publish to NATS JetStream, acknowledged by the stream.
    Nats,
    /// A publish to a Kafka topic, in a transaction that commits.
    Kafka,
}

/// The longest id of a pull sink (it is part of the store's keys and of URLs).
pub const MAX_PULL_SINK_ID: usize = 128;

fn default_sink_timeout() -> u64 {
    10_000
}

fn default_breaker_failures() -> u32 {
    5
}

fn default_breaker_cooldown() -> u64 {
    5_000
}

impl SinkConfig {
    /// This sink's own keys (`key` is `sinks[i]`); its id is checked against the others'.
    pub(crate) fn validate(&self, key: &str, secrets: Secrets) -> Result<(), ConfigError> {
        if self.kind == SinkKind::Pull {
            return self.validate_pull(key);
        }
        if self.kind != SinkKind::Nats && self.nats.is_some() {
            return Err(invalid(
                &format!("{key}.nats"),
                "is a NATS sink's key (kind: nats)",
            ));
        }
        if self.kind != SinkKind::Kafka && self.kafka.is_some() {
            return Err(invalid(
                &format!("{key}.kafka"),
                "is a Kafka sink's key (kind: kafka)",
            ));
        }
        match self.kind {
            SinkKind::Nats => self.validate_nats(key)?,
            SinkKind::Kafka => self.validate_kafka(key)?,
            _ => self.validate_http_url(key)?,
        }
        if self.lease_ms.is_some() {
            return Err(invalid(
                &format!("{key}.lease_ms"),
                "is a pull sink's key (kind: pull)",
            ));
        }
        in_range(&format!("{key}.timeout_ms"), self.timeout_ms, 1..=600_000)?;
        in_range(
            &format!("{key}.breaker_failures"),
            self.breaker_failures,
            1..=10_000,
        )?;
        in_range(
            &format!("{key}.breaker_cooldown_ms"),
            self.breaker_cooldown_ms,
            1..=3_600_000,
        )?;
        // A sink with no slot would never be delivered to.
        if let Some(m) = self.max_inflight {
            in_range(&format!("{key}.max_inflight"), m, 1..=100_000)?;
        }
        if let Some(ca) = &self.ca_bundle {
            ca.validate(&format!("{key}.ca_bundle"), secrets)?;
        }
        Ok(())
    }

    fn validate_http_url(&self, key: &str) -> Result<(), ConfigError> {
        if self.url.is_empty() {
            return Err(invalid(
                &format!("{key}.url"),
                "an HTTP sink (kind: http, the default) needs an http:// or https:// URL",
            ));
        }
        if !(self.url.starts_with("http://") || self.url.starts_with("https://")) {
            return Err(invalid(
                &format!("{key}.url"),
                "must be an http:// or https:// URL",
            ));
        }
        Ok(())
    }

    /// A Kafka sink: its bootstrap servers (`kafka://` or `kafka+tls://`), its block.
    fn validate_kafka(&self, key: &str) -> Result<(), ConfigError> {
        crate::kafka::kafka_servers(&self.url).map_err(|m| invalid(&format!("{key}.url"), m))?;
        let Some(kafka) = &self.kafka else {
            return Err(invalid(
                &format!("{key}.kafka.topic"),
                "a Kafka sink (kind: kafka) needs the topic it publishes to",
            ));
        };
        kafka.validate(&format!("{key}.kafka"))
    }

    /// A NATS sink: its servers (`nats://` or `tls://`, comma-separated), a subject, at
    /// most one way to sign in.
    fn validate_nats(&self, key: &str) -> Result<(), ConfigError> {
        let servers: Vec<&str> = self.url.split(',').map(str::trim).collect();
        if self.url.trim().is_empty()
            || servers
                .iter()
                .any(|u| !(u.starts_with("nats://") || u.starts_with("tls://")) || u.len() < 8)
        {
            return Err(invalid(
                &format!("{key}.url"),
                "a NATS sink needs its servers: nats:// or tls:// URLs, comma-separated",
            ));
        }
        let Some(nats) = &self.nats else {
            return Err(invalid(
                &format!("{key}.nats.subject"),
                "a NATS sink (kind: nats) needs the subject it publishes on",
            ));
        };
        if let Some(why) = subject_problem(&nats.subject) {
            return Err(invalid(&format!("{key}.nats.subject"), why));
        }
        let ways = [
            nats.creds.is_some(),
            nats.token.is_some(),
            nats.user.is_some() || nats.password.is_some(),
        ];
        if ways.iter().filter(|w| **w).count() > 1 {
            return Err(invalid(
                &format!("{key}.nats"),
                "one way to sign in: creds, token, or user and password",
            ));
        }
        if nats.user.is_some() != nats.password.is_some() {
            return Err(invalid(
                &format!("{key}.nats"),
                "user and password go together",
            ));
        }
        Ok(())
    }

    /// A pull sink: an id that fits a key and a URL path, no HTTP keys, a lease in range.
    fn validate_pull(&self, key: &str) -> Result<(), ConfigError> {
        let url_safe = self
            .id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
        if !url_safe || self.id.len() > MAX_PULL_SINK_ID {
            return Err(invalid(
                &format!("{key}.id"),
                format!("a pull sink's id is [A-Za-z0-9._-], at most {MAX_PULL_SINK_ID} bytes"),
            ));
        }
        let http_keys = [
            ("url", !self.url.is_empty()),
            ("secret", self.secret.is_some()),
            ("headers", !self.headers.is_empty()),
            ("ca_bundle", self.ca_bundle.is_some()),
        ];
        if self.nats.is_some() {
            return Err(invalid(
                &format!("{key}.nats"),
                "is a NATS sink's key (kind: nats)",
            ));
        }
        if self.kafka.is_some() {
            return Err(invalid(
                &format!("{key}.kafka"),
                "is a Kafka sink's key (kind: kafka)",
            ));
        }
        if let Some((k, _)) = http_keys.iter().find(|(_, set)| *set) {
            return Err(invalid(
                &format!("{key}.{k}"),
                "is an HTTP sink's key; a pull sink's consumers claim its hooks",
            ));
        }
        if let Some(m) = self.max_inflight {
            in_range(&format!("{key}.max_inflight"), m, 1..=1_000_000)?;
        }
        if let Some(l) = self.lease_ms {
            in_range(
                &format!("{key}.lease_ms"),
                l,
                1_000..=crate::pull::MAX_LEASE_MS,
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn refused(sink: &str) -> String {
        let yaml = format!("sinks: [{sink}]\n");
        Config::from_yaml(&yaml, Vec::new())
            .expect_err(sink)
            .to_string()
    }

    /// A NATS sink needs its servers and a subject it can publish on; one way to sign in;
    /// the other kinds refuse its block.
    #[test]
    fn a_nats_sink_is_checked_for_servers_subject_and_credentials() {
        let ok = "{ id: n, kind: nats, url: \"nats://a:4222, tls://b:4222\", nats: { subject: \"hooks.{tenant}.{source}\", user: u, password: { value: p } } }";
        Config::from_yaml(&format!("sinks: [{ok}]\n"), Vec::new()).unwrap();
        for (sink, key) in [
            ("{ id: n, kind: nats, url: \"http://a\", nats: { subject: s } }", "sinks[0].url"),
            ("{ id: n, kind: nats, url: \"nats://a:1\" }", "sinks[0].nats.subject"),
            ("{ id: n, kind: nats, url: \"nats://a:1\", nats: { subject: \"a.*\" } }", "wildcard"),
            ("{ id: n, kind: nats, url: \"nats://a:1\", nats: { subject: \"a..b\" } }", "empty token"),
            ("{ id: n, kind: nats, url: \"nats://a:1\", nats: { subject: \"a.{hook}\" } }", "placeholders"),
            ("{ id: n, kind: nats, url: \"nats://a:1\", nats: { subject: \"a b\" } }", "white space"),
            ("{ id: n, kind: nats, url: \"nats://a:1\", nats: { subject: s, token: { value: t }, user: u, password: { value: p } } }", "one way to sign in"),
            ("{ id: n, kind: nats, url: \"nats://a:1\", nats: { subject: s, user: u } }", "go together"),
            ("{ id: n, url: \"http://a\", nats: { subject: s } }", "sinks[0].nats"),
            ("{ id: n, kind: pull, nats: { subject: s } }", "sinks[0].nats"),
        ] {
            let e = refused(sink);
            assert!(e.contains(key), "{sink}: {e}");
        }
    }

    /// A tenant or source is one subject token: kept when plain, percent-encoded when it
    /// holds a byte NATS gives a meaning to (or none at all).
    #[test]
    fn a_value_becomes_one_subject_token() {
        assert_eq!(subject_token("acme-1_x"), "acme-1_x");
        assert_eq!(subject_token("a.b c"), "a%2Eb%20c");
        assert_eq!(subject_token(">"), "%3E");
        assert_eq!(subject_token("*"), "%2A");
        assert_eq!(subject_token("50%"), "50%25");
        assert_eq!(subject_token(""), "%00");
        assert_eq!(subject_token("é"), "%C3%A9");
        for t in ["a.b", "*", ">", " ", "x\ty"] {
            assert!(
                !subject_token(t).contains(['.', '*', '>', ' ', '\t']),
                "{t}"
            );
        }
    }
}
