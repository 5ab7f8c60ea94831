//! A Kafka sink's block (`sinks[].kafka`, `kind: kafka`).

use serde::{Deserialize, Serialize};

use crate::{in_range, invalid, ConfigError, SecretSource};

/// Where a Kafka sink publishes, and as whom.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaConfig {
    /// The topic each hook is published to; `{tenant}` and `{source}` are replaced by the
    /// hook's tenant and source, each as topic characters (see [`topic_token`]).
    pub topic: String,
    /// SASL sign-in (over `kafka://` or `kafka+tls://`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sasl: Option<KafkaSasl>,
    /// Messages one transaction carries at most: the publishes waiting when a transaction
    /// begins go in it together.
    #[serde(default = "default_max_batch")]
    pub max_batch: usize,
}

/// A Kafka sink's SASL mechanism, user name and password.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct KafkaSasl {
    /// `PLAIN`, `SCRAM-SHA-256` or `SCRAM-SHA-512`.
    pub mechanism: String,
    pub username: String,
    pub password: SecretSource,
}

fn default_max_batch() -> usize {
    500
}

/// The SASL mechanisms a Kafka sink signs in with.
pub const KAFKA_SASL_MECHANISMS: [&str; 3] = ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"];

/// The placeholders a Kafka topic may hold.
const TOPIC_PLACEHOLDERS: [&str; 2] = ["{tenant}", "{source}"];

/// The longest topic name Kafka takes.
pub const MAX_TOPIC: usize = 249;

/// `value` in a topic name's characters: bytes outside `[A-Za-z0-9-]` as `_XX` (their hex;
/// `_` itself too, so that two values never give one name; `.` too, which Kafka's metrics
/// confuse with `_`).
pub fn topic_token(value: &str) -> std::borrow::Cow<'_, str> {
    let plain = |b: u8| b.is_ascii_alphanumeric() || b == b'-';
    if !value.is_empty() && value.bytes().all(plain) {
        return std::borrow::Cow::Borrowed(value);
    }
    let mut out = String::with_capacity(value.len() * 3 + 3);
    if value.is_empty() {
        out.push_str("_00");
    }
    for b in value.bytes() {
        if plain(b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("_{b:02X}"));
        }
    }
    std::borrow::Cow::Owned(out)
}

/// The bootstrap servers of a Kafka sink's `url` (`kafka://host:port` or
/// `kafka+tls://host:port`, comma-separated) and whether they are reached over TLS; `Err`
/// says what is wrong.
pub fn kafka_servers(url: &str) -> Result<(Vec<String>, bool), String> {
    let mut servers = Vec::new();
    let mut tls = None;
    for u in url.split(',').map(str::trim) {
        let (this_tls, rest) = if let Some(r) = u.strip_prefix("kafka+tls://") {
            (true, r)
        } else if let Some(r) = u.strip_prefix("kafka://") {
            (false, r)
        } else {
            return Err(
                "a Kafka sink needs its bootstrap servers: kafka:// or kafka+tls:// URLs, comma-separated".into(),
            );
        };
        if *tls.get_or_insert(this_tls) != this_tls {
            return Err("its servers are all kafka:// or all kafka+tls://".into());
        }
        let port_ok = rest
            .rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
        if !port_ok || rest.contains(['/', '@', ' ']) {
            return Err(format!("{u:?}: a server is host:port"));
        }
        servers.push(rest.to_owned());
    }
    Ok((servers, tls.unwrap_or(false)))
}

impl KafkaConfig {
    /// Its topic template, sign-in and batch (`key` is `sinks[i].kafka`).
    pub(crate) fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let mut filled = self.topic.clone();
        for p in TOPIC_PLACEHOLDERS {
            filled = filled.replace(p, "x");
        }
        let topic = format!("{key}.topic");
        if filled.contains(['{', '}']) {
            return Err(invalid(
                &topic,
                format!(
                    "the only placeholders are {}",
                    TOPIC_PLACEHOLDERS.join(" and ")
                ),
            ));
        }
        if filled.is_empty() || filled.len() > MAX_TOPIC || filled == "." || filled == ".." {
            return Err(invalid(&topic, "is a topic name of 1 to 249 characters"));
        }
        if !filled
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        {
            return Err(invalid(
                &topic,
                "a topic name holds only ASCII letters, digits, `.`, `_` and `-`",
            ));
        }
        if let Some(s) = &self.sasl {
            if !KAFKA_SASL_MECHANISMS.contains(&s.mechanism.as_str()) {
                return Err(invalid(
                    &format!("{key}.sasl.mechanism"),
                    format!("is one of {}", KAFKA_SASL_MECHANISMS.join(", ")),
                ));
            }
            if s.username.is_empty() {
                return Err(invalid(&format!("{key}.sasl.username"), "is empty"));
            }
        }
        in_range(&format!("{key}.max_batch"), self.max_batch, 1..=10_000)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Config;

    fn refused(sink: &str) -> String {
        Config::from_yaml(&format!("sinks: [{sink}]\n"), Vec::new())
            .expect_err(sink)
            .to_string()
    }

    /// A Kafka sink needs its bootstrap servers (one scheme for all) and a topic Kafka
    /// takes; a known SASL mechanism; a batch in range; the other kinds refuse its block.
    #[test]
    fn a_kafka_sink_is_checked_for_servers_topic_and_sign_in() {
        let ok = "{ id: k, kind: kafka, url: \"kafka+tls://a:9093, b:9093\", kafka: { topic: \"hooks.{tenant}\" } }";
        assert!(
            refused(ok).contains("kafka+tls://"),
            "a server without its scheme"
        );
        let ok = "{ id: k, kind: kafka, url: \"kafka+tls://a:9093,kafka+tls://b:9093\", kafka: { topic: \"hooks.{tenant}_{source}\", sasl: { mechanism: SCRAM-SHA-512, username: u, password: { value: p } } } }";
        Config::from_yaml(&format!("sinks: [{ok}]\n"), Vec::new()).unwrap();
        for (sink, key) in [
            ("{ id: k, kind: kafka, url: \"http://a:1\", kafka: { topic: t } }", "sinks[0].url"),
            ("{ id: k, kind: kafka, url: \"kafka://a\", kafka: { topic: t } }", "host:port"),
            ("{ id: k, kind: kafka, url: \"kafka://a:1,kafka+tls://b:1\", kafka: { topic: t } }", "all kafka://"),
            ("{ id: k, kind: kafka, url: \"kafka://a:1\" }", "sinks[0].kafka.topic"),
            ("{ id: k, kind: kafka, url: \"kafka://a:1\", kafka: { topic: \"a/b\" } }", "ASCII letters"),
            ("{ id: k, kind: kafka, url: \"kafka://a:1\", kafka: { topic: \"a.{hook}\" } }", "placeholders"),
            ("{ id: k, kind: kafka, url: \"kafka://a:1\", kafka: { topic: \"..\" } }", "1 to 249"),
            ("{ id: k, kind: kafka, url: \"kafka://a:1\", kafka: { topic: t, max_batch: 0 } }", "max_batch"),
            ("{ id: k, kind: kafka, url: \"kafka://a:1\", kafka: { topic: t, sasl: { mechanism: GSSAPI, username: u, password: { value: p } } } }", "SCRAM-SHA-256"),
            ("{ id: k, url: \"http://a\", kafka: { topic: t } }", "sinks[0].kafka"),
            ("{ id: k, kind: pull, kafka: { topic: t } }", "sinks[0].kafka"),
        ] {
            let e = refused(sink);
            assert!(e.contains(key), "{sink}: {e}");
        }
    }

    /// A tenant or source is kept when plain, else `_XX` per byte (`_` and `.` too), so two
    /// values never make one topic; an empty one is `_00`.
    #[test]
    fn a_topic_token_keeps_plain_values_and_escapes_the_rest() {
        assert_eq!(topic_token("acme-1"), "acme-1");
        assert_eq!(topic_token("a.b c"), "a_2Eb_20c");
        assert_eq!(topic_token("a_b"), "a_5Fb");
        assert_ne!(topic_token("a_2E"), topic_token("a."));
        assert_eq!(topic_token(""), "_00");
    }
}
