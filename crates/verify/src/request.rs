//! What ingest reads from a verified request before the writer: its tenant (fixed, a
//! header, a JSON pointer into the body, or the URL), its idempotency key, and the
//! provider headers its source forwards, within their bounds. No RocksDB: fuzzed on its
//! own (`fuzz/fuzz_targets/request.rs`).

use ankusa_config::{IdempotencyConfig, TenantFrom};
use http::{HeaderMap, HeaderName};

/// The most bytes of one forwarded header value.
pub const MAX_FORWARD_VALUE: usize = 1024;
/// The most bytes of all of a hook's forwarded headers, names and values.
pub const MAX_FORWARD_BYTES: usize = 4096;
/// The longest idempotency key taken (a longer one is no key).
pub const MAX_IDEMPOTENCY_KEY: usize = 512;

/// The tenant of a request, per its source.
pub fn tenant_of(
    tenant: Option<&TenantFrom>,
    in_path: Option<&str>,
    headers: &HeaderMap,
    json: &mut JsonBody<'_>,
) -> Result<Option<String>, &'static str> {
    if in_path.is_some() && tenant != Some(&TenantFrom::Path) {
        return Err("this source does not take its tenant from the URL: POST /ingest/{source}");
    }
    let t = match tenant {
        None => return Ok(None),
        Some(TenantFrom::Path) => in_path
            .filter(|t| !t.is_empty())
            .ok_or("this source takes its tenant from the URL: POST /ingest/{source}/{tenant}")?
            .to_owned(),
        Some(TenantFrom::Fixed(t)) => t.clone(),
        Some(TenantFrom::Header(h)) => headers
            .get(h.as_str())
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .filter(|v| !v.is_empty())
            .ok_or("the tenant header is missing")?
            .to_owned(),
        Some(TenantFrom::JsonPointer(p)) => match json.get()?.pointer(p) {
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Number(n)) => n.to_string(),
            _ => return Err("the tenant is missing from the body"),
        },
    };
    if ankusa_config::tenant_id_problem(&t).is_some() {
        return Err("the tenant id is not valid");
    }
    Ok(Some(t))
}

/// The body parsed as JSON once, on demand.
pub struct JsonBody<'a> {
    raw: &'a [u8],
    parsed: Option<Result<serde_json::Value, ()>>,
}

impl<'a> JsonBody<'a> {
    pub fn new(raw: &'a [u8]) -> Self {
        JsonBody { raw, parsed: None }
    }

    fn get(&mut self) -> Result<&serde_json::Value, &'static str> {
        let raw = self.raw;
        self.parsed
            .get_or_insert_with(|| serde_json::from_slice(raw).map_err(|_| ()))
            .as_ref()
            .map_err(|_| "the body is not JSON")
    }

    /// The text of the value at JSON `pointer`: a string as it is, a number or a boolean as
    /// JSON writes it; `None` for anything else, nothing there, or a body that is not JSON
    /// (parsed once, whoever asks first).
    pub fn text_at(&mut self, pointer: &str) -> Option<String> {
        match self.get().ok()?.pointer(pointer)? {
            serde_json::Value::String(s) => Some(s.clone()),
            v @ (serde_json::Value::Number(_) | serde_json::Value::Bool(_)) => Some(v.to_string()),
            _ => None,
        }
    }
}

/// The headers `src` forwards, as received (every value of a repeated one), within
/// [`MAX_FORWARD_VALUE`] each and [`MAX_FORWARD_BYTES`] in all.
pub fn forwarded(
    forward: &[HeaderName],
    headers: &HeaderMap,
) -> Result<Vec<(String, Vec<u8>)>, &'static str> {
    let mut out = Vec::new();
    let mut total = 0;
    for name in forward {
        for v in headers.get_all(name) {
            if v.len() > MAX_FORWARD_VALUE {
                return Err("a forwarded header's value is over 1024 bytes");
            }
            total += name.as_str().len() + v.len();
            if total > MAX_FORWARD_BYTES {
                return Err("the forwarded headers are over 4096 bytes");
            }
            out.push((name.as_str().to_owned(), v.as_bytes().to_vec()));
        }
    }
    Ok(out)
}

pub fn idempotency_of(
    idempotency: &IdempotencyConfig,
    headers: &HeaderMap,
    json: &mut JsonBody<'_>,
) -> Option<Vec<u8>> {
    for h in &idempotency.headers {
        if let Some(v) = headers.get(h.as_str()) {
            if !v.is_empty() && v.len() <= MAX_IDEMPOTENCY_KEY {
                return Some(v.as_bytes().to_vec());
            }
        }
    }
    let p = idempotency.json_pointer.as_ref()?;
    match json.get().ok()?.pointer(p)? {
        serde_json::Value::String(s) if !s.is_empty() && s.len() <= MAX_IDEMPOTENCY_KEY => {
            Some(s.as_bytes().to_vec())
        }
        _ => None,
    }
}
