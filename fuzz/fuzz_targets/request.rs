//! What ingest reads from a verified request before the writer, with structured inputs:
//! the tenant (fixed, a header, a JSON pointer into the body, the URL), the idempotency
//! key and the forwarded headers; and the per-tenant secret lookup (`tenant_secrets`): a
//! request verifies only under the secret of the tenant it names. An answer or a refusal,
//! never a panic, and every answer within its bounds.
#![no_main]

use std::collections::BTreeMap;

use ankusa_config::{tenant_id_problem, IdempotencyConfig, SigEncoding, TenantFrom, VerifyConfig};
use ankusa_verify::request::{
    forwarded, idempotency_of, tenant_of, JsonBody, MAX_FORWARD_BYTES, MAX_FORWARD_VALUE,
    MAX_IDEMPOTENCY_KEY,
};
use ankusa_verify::{hex, hmac_sha256, Keys};
use libfuzzer_sys::fuzz_target;

#[derive(Debug, arbitrary::Arbitrary)]
struct Input {
    tenant_kind: u8,
    tenant: String,
    in_path: Option<String>,
    idempotency_headers: Vec<String>,
    idempotency_pointer: Option<String>,
    forward: Vec<String>,
    headers: Vec<(String, Vec<u8>)>,
    json_body: bool,
    body: Vec<u8>,
    pointer_value: String,
    /// Tenants with a secret of their own, and the secret the request is signed with.
    tenant_secrets: Vec<(String, Vec<u8>)>,
    signing_secret: Vec<u8>,
}

fuzz_target!(|i: Input| {
    let from = match i.tenant_kind % 5 {
        0 => None,
        1 => Some(TenantFrom::Fixed(i.tenant.clone())),
        2 => Some(TenantFrom::Header(i.tenant.to_ascii_lowercase())),
        3 => Some(TenantFrom::JsonPointer(format!("/{}", i.tenant))),
        _ => Some(TenantFrom::Path),
    };
    let mut map = http::HeaderMap::new();
    for (name, value) in i.headers.iter().take(32) {
        if let (Ok(n), Ok(v)) = (
            http::HeaderName::from_bytes(name.as_bytes()),
            http::HeaderValue::from_bytes(value),
        ) {
            map.append(n, v);
        }
    }
    // A JSON body that holds the pointer's value half the time, any bytes otherwise.
    let body = if i.json_body {
        format!(
            "{{{}: {}}}",
            serde_json::Value::String(i.tenant.clone()),
            serde_json::Value::String(i.pointer_value.clone())
        )
        .into_bytes()
    } else {
        i.body.clone()
    };
    let mut json = JsonBody::new(&body);
    let named = tenant_of(from.as_ref(), i.in_path.as_deref(), &map, &mut json);
    if let Ok(Some(t)) = &named {
        assert!(
            tenant_id_problem(t).is_none(),
            "an invalid tenant {t:?} passed"
        );
    }
    // The per-tenant lookup: signed with `signing_secret` in `x-sig`, the request passes
    // only when the tenant it names holds exactly that secret.
    let secrets: BTreeMap<String, Vec<u8>> = i
        .tenant_secrets
        .iter()
        .take(8)
        .filter(|(_, s)| !s.is_empty())
        .cloned()
        .collect();
    let scheme = VerifyConfig::HmacSha256 {
        secret: None,
        header: "x-sig".into(),
        prefix: String::new(),
        encoding: SigEncoding::Hex,
        timestamp_header: None,
        tolerance_s: 300,
    };
    let keys = Keys::new(&scheme, None, Some(secrets.clone()), &[0x5a; 32]);
    let mut signed = map.clone();
    let sig = hex(&hmac_sha256(&i.signing_secret, &[&body]));
    if let Ok(v) = http::HeaderValue::from_str(&sig) {
        signed.insert("x-sig", v);
    }
    let claimed = named.as_ref().ok().and_then(|t| t.as_deref());
    if keys.verify(claimed, &signed, &body, 0).is_ok() {
        // (Two secrets can key the same HMAC — `k` and `k\0` — so the signature is what
        // is compared.)
        let signs = |k: &[u8]| hex(&hmac_sha256(k, &[&body])) == sig;
        let held = claimed.and_then(|t| secrets.get(t));
        assert!(
            held.is_some_and(|h| signs(h)) || (held.is_none() && signs(&[0x5a; 32])),
            "a request passed under a secret its tenant {claimed:?} does not hold"
        );
    }
    let idem = IdempotencyConfig {
        headers: i
            .idempotency_headers
            .iter()
            .take(4)
            .map(|h| h.to_ascii_lowercase())
            .collect(),
        json_pointer: i.idempotency_pointer.clone(),
    };
    if let Some(k) = idempotency_of(&idem, &map, &mut json) {
        assert!(!k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY);
    }
    let names: Vec<http::HeaderName> = i
        .forward
        .iter()
        .take(16)
        .filter_map(|n| http::HeaderName::from_bytes(n.as_bytes()).ok())
        .collect();
    if let Ok(kept) = forwarded(&names, &map) {
        let total: usize = kept.iter().map(|(n, v)| n.len() + v.len()).sum();
        assert!(total <= MAX_FORWARD_BYTES);
        assert!(kept.iter().all(|(_, v)| v.len() <= MAX_FORWARD_VALUE));
    }
});
