//! Signature verification of every scheme on any headers, body, secret and clock: a
//! verdict, never a panic; and a request signed as the provider signs it verifies.
#![no_main]

use ankusa_verify::{standard_webhooks_key, standard_webhooks_sign, Verifier};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    scheme: u8,
    secret: Vec<u8>,
    header: String,
    prefix: String,
    base64: bool,
    tolerance_s: u16,
    headers: Vec<(String, Vec<u8>)>,
    body: Vec<u8>,
    now_s: u32,
    id: String,
}

fuzz_target!(|i: Input| {
    let header = i.header.to_ascii_lowercase();
    let v = match i.scheme % 5 {
        0 => Verifier::None,
        1 => Verifier::HmacSha256 {
            secret: i.secret.clone(),
            header: header.clone(),
            prefix: i.prefix.clone(),
            encoding: if i.base64 {
                ankusa_config::SigEncoding::Base64
            } else {
                ankusa_config::SigEncoding::Hex
            },
            // Every other input with a timestamp header (`x-` + the header's name).
            timestamp: (i.tolerance_s % 2 == 1)
                .then(|| (format!("x-{header}-ts"), u64::from(i.tolerance_s))),
        },
        2 => Verifier::StandardWebhooks {
            key: standard_webhooks_key(&i.secret),
            tolerance_s: u64::from(i.tolerance_s),
        },
        3 => Verifier::Github {
            secret: i.secret.clone(),
        },
        _ => Verifier::Stripe {
            secret: i.secret.clone(),
            tolerance_s: u64::from(i.tolerance_s),
        },
    };
    let mut map = http::HeaderMap::new();
    for (name, value) in i.headers.iter().take(16) {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            map.append(n, v);
        }
    }
    let now = u64::from(i.now_s);
    let _ = v.verify(&map, &i.body, now);

    // Signed as the provider signs: verified.
    if let Verifier::HmacSha256 {
        secret,
        header,
        prefix,
        encoding: ankusa_config::SigEncoding::Hex,
        timestamp,
    } = &v
    {
        let ts = now.to_string();
        let sig = match timestamp {
            Some(_) => ankusa_verify::hmac_sha256(secret, &[ts.as_bytes(), b".", &i.body]),
            None => ankusa_verify::hmac_sha256(secret, &[&i.body]),
        };
        let value = format!("{prefix}{}", ankusa_verify::hex(&sig));
        let mut h = http::HeaderMap::new();
        let named = http::HeaderName::from_bytes(header.as_bytes()).ok();
        if let (Some(n), Ok(val)) = (named, value.parse::<http::HeaderValue>()) {
            // A prefix with spaces at its ends cannot survive the value's trim, nor one
            // outside ASCII a header's text.
            if prefix.trim() == prefix.as_str() && prefix.is_ascii() {
                let stamped = match timestamp {
                    None => true,
                    Some((t, _)) => match http::HeaderName::from_bytes(t.as_bytes()) {
                        Ok(t) => {
                            h.insert(t, ts.parse().unwrap());
                            true
                        }
                        Err(_) => false,
                    },
                };
                h.insert(n, val);
                if stamped {
                    assert!(v.verify(&h, &i.body, now).is_ok(), "{v:?} {h:?}");
                }
            }
        }
    }
    if let Verifier::StandardWebhooks { key, .. } = &v {
        let id = i.id.replace(|c: char| !c.is_ascii_alphanumeric(), "");
        if !id.is_empty() {
            let mut h = http::HeaderMap::new();
            h.insert("webhook-id", id.parse().unwrap());
            h.insert("webhook-timestamp", now.to_string().parse().unwrap());
            h.insert(
                "webhook-signature",
                standard_webhooks_sign(key, &id, now, &i.body)
                    .parse()
                    .unwrap(),
            );
            assert!(v.verify(&h, &i.body, now).is_ok());
        }
    }
});
