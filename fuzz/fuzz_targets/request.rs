//! What ingest reads from a verified request before the writer, with structured inputs:
//! the tenant (fixed, a header, a JSON pointer into the body, the URL), the idempotency
//! key and the forwarded headers. An answer or a refusal, never a panic, and every answer
//! within its bounds.
#![no_main]

use ankusa_config::{tenant_id_problem, IdempotencyConfig, TenantFrom};
use ankusa_verify::request::{
    forwarded, idempotency_of, tenant_of, JsonBody, MAX_FORWARD_BYTES, MAX_FORWARD_VALUE,
    MAX_IDEMPOTENCY_KEY,
};
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
    if let Ok(Some(t)) = tenant_of(from.as_ref(), i.in_path.as_deref(), &map, &mut json) {
        assert!(tenant_id_problem(&t).is_none(), "an invalid tenant {t:?} passed");
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
