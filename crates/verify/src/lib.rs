//! Signature verification of incoming webhooks, one function per scheme.
//!
//! Every comparison of a signature is constant-time (`subtle`); secrets are never logged.
//! A timestamp outside the scheme's tolerance is refused like a bad signature.

pub mod node;
pub mod request;

use std::borrow::Cow;

use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use ankusa_config::{SigEncoding, VerifyConfig};

type HmacSha256 = Hmac<Sha256>;

/// Why a request failed verification (kept with the quarantined request).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("missing header {0}")]
    MissingHeader(Cow<'static, str>),
    #[error("malformed {0} header")]
    Malformed(Cow<'static, str>),
    #[error("timestamp outside the tolerance")]
    StaleTimestamp,
    #[error("signature mismatch")]
    Mismatch,
}

impl VerifyError {
    /// Every reason code, in the order of [`VerifyError::reason`]'s arms.
    pub const REASONS: [&'static str; 4] = [
        "missing_header",
        "malformed_header",
        "stale_timestamp",
        "bad_signature",
    ];

    /// The reason code of an error's words (its `Display`), for what a release before the
    /// codes kept only in words: `None` for words no error says.
    pub fn reason_of_words(words: &str) -> Option<&'static str> {
        if words.starts_with("missing header ") {
            Some(Self::REASONS[0])
        } else if words.starts_with("malformed ") && words.ends_with(" header") {
            Some(Self::REASONS[1])
        } else if words == VerifyError::StaleTimestamp.to_string() {
            Some(Self::REASONS[2])
        } else if words == VerifyError::Mismatch.to_string() {
            Some(Self::REASONS[3])
        } else {
            None
        }
    }

    /// The stable reason code a refused sender and the metrics see. It names what failed,
    /// never the secret or the expected signature.
    pub fn reason(&self) -> &'static str {
        match self {
            VerifyError::MissingHeader(_) => Self::REASONS[0],
            VerifyError::Malformed(_) => Self::REASONS[1],
            VerifyError::StaleTimestamp => Self::REASONS[2],
            VerifyError::Mismatch => Self::REASONS[3],
        }
    }
}

/// A verifier built from a source's configuration, with its secret resolved.
#[derive(Clone)]
pub enum Verifier {
    None,
    HmacSha256 {
        secret: Vec<u8>,
        header: String,
        prefix: String,
        encoding: SigEncoding,
        /// The header with the request's Unix time (lower case) and the tolerance in
        /// seconds: the signature covers `<timestamp>.<body>`.
        timestamp: Option<(String, u64)>,
    },
    StandardWebhooks {
        key: Vec<u8>,
        tolerance_s: u64,
    },
    Github {
        secret: Vec<u8>,
    },
    Stripe {
        secret: Vec<u8>,
        tolerance_s: u64,
    },
}

impl std::fmt::Debug for Verifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Verifier::None => "none",
            Verifier::HmacSha256 { .. } => "hmac-sha256",
            Verifier::StandardWebhooks { .. } => "standard-webhooks",
            Verifier::Github { .. } => "github",
            Verifier::Stripe { .. } => "stripe",
        })
    }
}

impl Verifier {
    /// The request headers this verifier reads (lower case).
    pub fn header_names(&self) -> Vec<&str> {
        match self {
            Verifier::None => Vec::new(),
            Verifier::HmacSha256 {
                header, timestamp, ..
            } => std::iter::once(header.as_str())
                .chain(timestamp.as_ref().map(|(t, _)| t.as_str()))
                .collect(),
            Verifier::StandardWebhooks { .. } => {
                vec!["webhook-id", "webhook-timestamp", "webhook-signature"]
            }
            Verifier::Github { .. } => vec!["x-hub-signature-256"],
            Verifier::Stripe { .. } => vec!["stripe-signature"],
        }
    }
}

impl Verifier {
    /// The verifier of a source's scheme keyed by `secret` (its own, or one tenant's).
    pub fn from_config(v: &VerifyConfig, secret: &[u8]) -> Verifier {
        match v {
            VerifyConfig::None => Verifier::None,
            VerifyConfig::HmacSha256 {
                header,
                prefix,
                encoding,
                timestamp_header,
                tolerance_s,
                ..
            } => Verifier::HmacSha256 {
                secret: secret.to_vec(),
                header: header.to_ascii_lowercase(),
                prefix: prefix.clone(),
                encoding: *encoding,
                timestamp: timestamp_header
                    .as_ref()
                    .map(|t| (t.to_ascii_lowercase(), *tolerance_s)),
            },
            VerifyConfig::StandardWebhooks { tolerance_s, .. } => Verifier::StandardWebhooks {
                key: standard_webhooks_key(secret),
                tolerance_s: *tolerance_s,
            },
            VerifyConfig::Github { .. } => Verifier::Github {
                secret: secret.to_vec(),
            },
            VerifyConfig::Stripe { tolerance_s, .. } => Verifier::Stripe {
                secret: secret.to_vec(),
                tolerance_s: *tolerance_s,
            },
        }
    }
}

/// A source's keys: one verifier for every tenant, or one per tenant (`tenant_secrets`),
/// so a tenant's requests verify only with its own secret.
#[derive(Clone)]
pub enum Keys {
    Source(Verifier),
    PerTenant {
        by_tenant: std::collections::HashMap<String, Verifier>,
        /// The verifier of a tenant without a secret: the scheme under a key nobody
        /// holds, so such a request costs and answers what a bad signature does (the
        /// answer does not tell which tenants have a secret).
        absent: Verifier,
    },
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Keys::Source(v) => write!(f, "{v:?}"),
            Keys::PerTenant { by_tenant, absent } => {
                write!(f, "{absent:?} ({} tenant secrets)", by_tenant.len())
            }
        }
    }
}

impl Keys {
    /// The keys of a source's scheme: `tenant_secrets` (tenant → secret) when the source
    /// has them, its one `secret` otherwise; `unheld` keys the verifier of a tenant
    /// without a secret (random bytes, at least 32).
    pub fn new(
        v: &VerifyConfig,
        secret: Option<&[u8]>,
        tenant_secrets: Option<std::collections::BTreeMap<String, Vec<u8>>>,
        unheld: &[u8],
    ) -> Keys {
        match tenant_secrets {
            None => Keys::Source(Verifier::from_config(v, secret.unwrap_or_default())),
            Some(m) => Keys::PerTenant {
                by_tenant: m
                    .into_iter()
                    .map(|(t, s)| (t, Verifier::from_config(v, &s)))
                    .collect(),
                absent: Verifier::from_config(v, unheld),
            },
        }
    }

    /// Whether the verifier depends on the request's tenant (it is read first).
    pub fn per_tenant(&self) -> bool {
        matches!(self, Keys::PerTenant { .. })
    }

    /// The verifier of `tenant`'s requests.
    pub fn of(&self, tenant: Option<&str>) -> &Verifier {
        match self {
            Keys::Source(v) => v,
            Keys::PerTenant { by_tenant, absent } => {
                tenant.and_then(|t| by_tenant.get(t)).unwrap_or(absent)
            }
        }
    }

    /// Checks a request that names `tenant` (ignored with one secret for the source).
    pub fn verify(
        &self,
        tenant: Option<&str>,
        h: &dyn Headers,
        body: &[u8],
        now_s: u64,
    ) -> Result<(), VerifyError> {
        self.of(tenant).verify(h, body, now_s)
    }

    /// The request headers the verifiers read (lower case).
    pub fn header_names(&self) -> Vec<&str> {
        self.of(None).header_names()
    }
}

/// Headers as the verifier sees them (lower-case names).
pub trait Headers {
    fn get(&self, name: &str) -> Option<&str>;
}

impl Headers for http::HeaderMap {
    fn get(&self, name: &str) -> Option<&str> {
        http::HeaderMap::get(self, name).and_then(|v| v.to_str().ok())
    }
}

/// HMAC-SHA256 of `parts` in order, keyed by `secret`: what every scheme here checks, and
/// what the node's tests and benches sign with.
pub fn hmac_sha256(secret: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    #[allow(clippy::expect_used, reason = "HMAC takes a key of any length")]
    let mut m =
        HmacSha256::new_from_slice(secret).expect("HMAC-SHA256 accepts keys of every length");
    for p in parts {
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

fn eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

fn hex_decode(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok())
        .collect()
}

fn b64() -> base64::engine::GeneralPurpose {
    base64::engine::general_purpose::STANDARD
}

/// The signing key of a Standard Webhooks secret: `whsec_<base64>` decodes, anything
/// else is used as raw bytes.
pub fn standard_webhooks_key(secret: &[u8]) -> Vec<u8> {
    match secret.strip_prefix(b"whsec_") {
        Some(rest) => b64().decode(rest).unwrap_or_else(|_| secret.to_vec()),
        None => secret.to_vec(),
    }
}

/// The Standard Webhooks signature header value for a message: `v1,<base64>`.
pub fn standard_webhooks_sign(key: &[u8], id: &str, timestamp: u64, body: &[u8]) -> String {
    let ts = timestamp.to_string();
    let sig = hmac_sha256(key, &[id.as_bytes(), b".", ts.as_bytes(), b".", body]);
    format!("v1,{}", b64().encode(sig))
}

fn within(ts: u64, now_s: u64, tolerance_s: u64) -> bool {
    ts.abs_diff(now_s) <= tolerance_s
}

impl Verifier {
    /// Checks a request; `now_s` is the current Unix time in seconds.
    pub fn verify(&self, h: &dyn Headers, body: &[u8], now_s: u64) -> Result<(), VerifyError> {
        match self {
            Verifier::None => Ok(()),
            Verifier::HmacSha256 {
                secret,
                header,
                prefix,
                encoding,
                timestamp,
            } => {
                let stamped = match timestamp {
                    None => None,
                    Some((name, tolerance_s)) => {
                        let v = h
                            .get(name)
                            .ok_or_else(|| VerifyError::MissingHeader(name.clone().into()))?;
                        let ts: u64 = v
                            .trim()
                            .parse()
                            .map_err(|_| VerifyError::Malformed(name.clone().into()))?;
                        if !within(ts, now_s, *tolerance_s) {
                            return Err(VerifyError::StaleTimestamp);
                        }
                        Some(v.trim())
                    }
                };
                let v = h
                    .get(header)
                    .ok_or_else(|| VerifyError::MissingHeader(header.clone().into()))?;
                let v = v
                    .trim()
                    .strip_prefix(prefix.as_str())
                    .ok_or_else(|| VerifyError::Malformed(header.clone().into()))?;
                let given = match encoding {
                    SigEncoding::Hex => hex_decode(v),
                    SigEncoding::Base64 => b64().decode(v).ok(),
                }
                .ok_or_else(|| VerifyError::Malformed(header.clone().into()))?;
                let expected = match stamped {
                    Some(ts) => hmac_sha256(secret, &[ts.as_bytes(), b".", body]),
                    None => hmac_sha256(secret, &[body]),
                };
                if eq(&given, &expected) {
                    Ok(())
                } else {
                    Err(VerifyError::Mismatch)
                }
            }
            Verifier::Github { secret } => {
                let v = h
                    .get("x-hub-signature-256")
                    .ok_or(VerifyError::MissingHeader(Cow::Borrowed(
                        "x-hub-signature-256",
                    )))?;
                let given = v
                    .trim()
                    .strip_prefix("sha256=")
                    .and_then(hex_decode)
                    .ok_or(VerifyError::Malformed(Cow::Borrowed("x-hub-signature-256")))?;
                if eq(&given, &hmac_sha256(secret, &[body])) {
                    Ok(())
                } else {
                    Err(VerifyError::Mismatch)
                }
            }
            Verifier::StandardWebhooks { key, tolerance_s } => {
                let id = h
                    .get("webhook-id")
                    .ok_or(VerifyError::MissingHeader(Cow::Borrowed("webhook-id")))?;
                let ts_raw = h
                    .get("webhook-timestamp")
                    .ok_or(VerifyError::MissingHeader(Cow::Borrowed(
                        "webhook-timestamp",
                    )))?;
                let sigs = h
                    .get("webhook-signature")
                    .ok_or(VerifyError::MissingHeader(Cow::Borrowed(
                        "webhook-signature",
                    )))?;
                let ts: u64 = ts_raw
                    .trim()
                    .parse()
                    .map_err(|_| VerifyError::Malformed(Cow::Borrowed("webhook-timestamp")))?;
                if !within(ts, now_s, *tolerance_s) {
                    return Err(VerifyError::StaleTimestamp);
                }
                let expected = hmac_sha256(
                    key,
                    &[id.as_bytes(), b".", ts_raw.trim().as_bytes(), b".", body],
                );
                // Space-separated `v1,<base64>` entries; any match passes (key rotation).
                let mut any = false;
                for s in sigs.split_whitespace() {
                    if let Some(b) = s.strip_prefix("v1,") {
                        if let Ok(given) = b64().decode(b) {
                            any |= eq(&given, &expected);
                        }
                    }
                }
                if any {
                    Ok(())
                } else {
                    Err(VerifyError::Mismatch)
                }
            }
            Verifier::Stripe {
                secret,
                tolerance_s,
            } => {
                let v =
                    h.get("stripe-signature")
                        .ok_or(VerifyError::MissingHeader(Cow::Borrowed(
                            "stripe-signature",
                        )))?;
                let mut ts = None;
                let mut v1 = Vec::new();
                for part in v.split(',') {
                    match part.trim().split_once('=') {
                        Some(("t", t)) => ts = Some(t),
                        Some(("v1", s)) => v1.push(s),
                        _ => {}
                    }
                }
                let ts_raw = ts.ok_or(VerifyError::Malformed(Cow::Borrowed("stripe-signature")))?;
                let t: u64 = ts_raw
                    .parse()
                    .map_err(|_| VerifyError::Malformed(Cow::Borrowed("stripe-signature")))?;
                if !within(t, now_s, *tolerance_s) {
                    return Err(VerifyError::StaleTimestamp);
                }
                let expected = hmac_sha256(secret, &[ts_raw.as_bytes(), b".", body]);
                let mut any = false;
                for s in v1 {
                    if let Some(given) = hex_decode(s) {
                        any |= eq(&given, &expected);
                    }
                }
                if any {
                    Ok(())
                } else {
                    Err(VerifyError::Mismatch)
                }
            }
        }
    }
}

/// Lower-case hex.
pub fn hex(b: &[u8]) -> String {
    ankusa_keyspace::hex(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    struct H(HashMap<&'static str, String>);
    impl Headers for H {
        fn get(&self, name: &str) -> Option<&str> {
            self.0.get(name).map(String::as_str)
        }
    }
    fn h(pairs: &[(&'static str, &str)]) -> H {
        H(pairs.iter().map(|(k, v)| (*k, v.to_string())).collect())
    }

    #[test]
    fn every_errors_words_give_back_its_code() {
        for e in [
            VerifyError::MissingHeader("x-hub-signature-256".into()),
            VerifyError::Malformed("webhook-signature".into()),
            VerifyError::StaleTimestamp,
            VerifyError::Mismatch,
        ] {
            assert_eq!(
                VerifyError::reason_of_words(&e.to_string()),
                Some(e.reason()),
                "{e}"
            );
        }
        assert_eq!(VerifyError::reason_of_words("something else"), None);
    }

    #[test]
    fn github_documentation_example() {
        // The example in GitHub's "Validating webhook deliveries" documentation.
        let v = Verifier::Github {
            secret: b"It's a Secret to Everybody".to_vec(),
        };
        let sig = "sha256=757107ea0eb2509fc211221cce984b8a37570b6d7586c22c46f4379c8b043e17";
        assert_eq!(
            v.verify(&h(&[("x-hub-signature-256", sig)]), b"Hello, World!", 0),
            Ok(())
        );
        assert_eq!(
            v.verify(&h(&[("x-hub-signature-256", sig)]), b"Hello, World?", 0),
            Err(VerifyError::Mismatch)
        );
        assert_eq!(
            v.verify(&h(&[]), b"Hello, World!", 0),
            Err(VerifyError::MissingHeader(Cow::Borrowed(
                "x-hub-signature-256"
            )))
        );
    }

    /// With `timestamp_header`, an hmac-sha256 source signs `<timestamp>.<body>` and
    /// refuses a request outside its tolerance: a captured request is worth nothing later,
    /// and one whose timestamp was changed does not verify.
    #[test]
    fn hmac_sha256_with_a_timestamp_covers_it_and_refuses_a_stale_one() {
        let secret = b"partner-secret".to_vec();
        let v = Verifier::HmacSha256 {
            secret: secret.clone(),
            header: "x-signature".into(),
            prefix: "sha256=".into(),
            encoding: SigEncoding::Hex,
            timestamp: Some(("x-timestamp".into(), 300)),
        };
        let body = br#"{"n":1}"#;
        let now = 1_800_000_000;
        let signed = |ts: u64| {
            format!(
                "sha256={}",
                hex(&hmac_sha256(
                    &secret,
                    &[ts.to_string().as_bytes(), b".", body]
                ))
            )
        };
        let ts = now.to_string();
        let good = h(&[("x-signature", &signed(now)), ("x-timestamp", &ts)]);
        assert_eq!(v.verify(&good, body, now + 299), Ok(()));
        assert_eq!(
            v.verify(&good, body, now + 301),
            Err(VerifyError::StaleTimestamp)
        );
        // The timestamp moved forward to pass the tolerance: the signature no longer holds.
        let later = (now + 1_000).to_string();
        let moved = h(&[("x-signature", &signed(now)), ("x-timestamp", &later)]);
        assert_eq!(
            v.verify(&moved, body, now + 1_000),
            Err(VerifyError::Mismatch)
        );
        // The body alone signed (no timestamp in it): refused.
        let bare = format!("sha256={}", hex(&hmac_sha256(&secret, &[body])));
        let bare = h(&[("x-signature", &bare), ("x-timestamp", &ts)]);
        assert_eq!(v.verify(&bare, body, now), Err(VerifyError::Mismatch));
        assert_eq!(
            v.verify(&h(&[("x-signature", &signed(now))]), body, now),
            Err(VerifyError::MissingHeader(Cow::Borrowed("x-timestamp")))
        );
        let garbled = h(&[("x-signature", &signed(now)), ("x-timestamp", "soon")]);
        assert_eq!(
            v.verify(&garbled, body, now),
            Err(VerifyError::Malformed(Cow::Borrowed("x-timestamp")))
        );
        assert_eq!(v.header_names(), ["x-signature", "x-timestamp"]);
    }

    #[test]
    fn standard_webhooks_specification_example() {
        // The example of the Standard Webhooks specification's signature section.
        let key = standard_webhooks_key(b"whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw");
        let body = br#"{"test": 2432232314}"#;
        let sig = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=";
        assert_eq!(
            standard_webhooks_sign(&key, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            sig
        );
        let v = Verifier::StandardWebhooks {
            key,
            tolerance_s: 300,
        };
        let headers = h(&[
            ("webhook-id", "msg_p5jXN8AQM9LWM0D4loKWxJek"),
            ("webhook-timestamp", "1614265330"),
            ("webhook-signature", &format!("v1,bm90IGl0 {sig}")),
        ]);
        assert_eq!(v.verify(&headers, body, 1614265330 + 10), Ok(()));
        assert_eq!(
            v.verify(&headers, body, 1614265330 + 301),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            v.verify(&headers, b"{}", 1614265330),
            Err(VerifyError::Mismatch)
        );
    }

    #[test]
    fn stripe_scheme_checks_signature_and_tolerance() {
        let secret = b"whsec_test_secret".to_vec();
        let body = br#"{"id":"evt_1","object":"event"}"#;
        let t = 1_700_000_000u64;
        let good = hex(&hmac_sha256(
            &secret,
            &[t.to_string().as_bytes(), b".", body],
        ));
        let v = Verifier::Stripe {
            secret,
            tolerance_s: 300,
        };
        let hv = format!("t={t},v1={},v0=deadbeef,v1={good}", "00".repeat(32));
        assert_eq!(
            v.verify(&h(&[("stripe-signature", &hv)]), body, t + 5),
            Ok(())
        );
        assert_eq!(
            v.verify(&h(&[("stripe-signature", &hv)]), body, t + 600),
            Err(VerifyError::StaleTimestamp)
        );
        assert_eq!(
            v.verify(&h(&[("stripe-signature", "v1=00")]), body, t),
            Err(VerifyError::Malformed(Cow::Borrowed("stripe-signature")))
        );
    }

    #[test]
    fn hmac_sha256_with_prefix_hex_and_base64() {
        let secret = b"s3cr3t".to_vec();
        let sig = hmac_sha256(&secret, &[b"payload"]);
        let hexv = Verifier::HmacSha256 {
            secret: secret.clone(),
            header: "x-sig".into(),
            prefix: "sha256=".into(),
            encoding: SigEncoding::Hex,
            timestamp: None,
        };
        let good = format!("sha256={}", hex(&sig));
        assert_eq!(hexv.verify(&h(&[("x-sig", &good)]), b"payload", 0), Ok(()));
        assert_eq!(
            hexv.verify(&h(&[("x-sig", &hex(&sig))]), b"payload", 0),
            Err(VerifyError::Malformed(Cow::Borrowed("x-sig")))
        );
        // Each failure has its reason code, and the header it names is the configured one.
        let missing = hexv.verify(&h(&[]), b"payload", 0).unwrap_err();
        assert_eq!(missing, VerifyError::MissingHeader(Cow::Borrowed("x-sig")));
        assert_eq!(missing.reason(), "missing_header");
        assert_eq!(missing.to_string(), "missing header x-sig");
        let wrong = format!("sha256={}", hex(&hmac_sha256(b"other", &[b"payload"])));
        let mismatch = hexv.verify(&h(&[("x-sig", &wrong)]), b"payload", 0);
        assert_eq!(mismatch.unwrap_err().reason(), "bad_signature");
        assert_eq!(VerifyError::StaleTimestamp.reason(), "stale_timestamp");
        assert_eq!(
            VerifyError::Malformed(Cow::Borrowed("x-sig")).reason(),
            "malformed_header"
        );
        let b64v = Verifier::HmacSha256 {
            secret,
            header: "x-sig".into(),
            prefix: String::new(),
            encoding: SigEncoding::Base64,
            timestamp: None,
        };
        assert_eq!(
            b64v.verify(&h(&[("x-sig", &b64().encode(sig))]), b"payload", 0),
            Ok(())
        );
        assert_eq!(
            b64v.verify(&h(&[("x-sig", &b64().encode([0u8; 32]))]), b"payload", 0),
            Err(VerifyError::Mismatch)
        );
    }
}
