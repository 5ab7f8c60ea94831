//! Sources: where hooks come in, how they are verified and whose they are (`sources`).

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{invalid, tenant_id_problem, ArchiveSetting, ConfigError, SecretSource, Secrets};

/// Where a source's hooks get their tenant.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum TenantFrom {
    /// Every hook of the source belongs to this tenant.
    Fixed(String),
    /// A request header names the tenant (a shared source).
    Header(String),
    /// A JSON pointer into the body names the tenant (a shared source).
    JsonPointer(String),
    /// The URL names the tenant: `POST /ingest/{source}/{tenant}`, for providers that let
    /// each tenant register its own endpoint URL (`tenant: path`).
    Path,
}

/// How a source's requests are verified.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "scheme", rename_all = "kebab-case", deny_unknown_fields)]
pub enum VerifyConfig {
    None,
    /// HMAC-SHA256 of the body in a header, hex or base64, with an optional prefix.
    #[serde(rename = "hmac-sha256")]
    HmacSha256 {
        /// The source's one secret; absent when the source has `tenant_secrets`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<SecretSource>,
        header: String,
        #[serde(default)]
        prefix: String,
        #[serde(default)]
        encoding: SigEncoding,
        /// A header with the request's Unix time in seconds: the signature then covers
        /// `<timestamp>.<body>`, and a request more than `tolerance_s` from the node's
        /// clock is refused (a captured request cannot be replayed later).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        timestamp_header: Option<String>,
        #[serde(default = "default_tolerance")]
        tolerance_s: u64,
    },
    /// `webhook-id`, `webhook-timestamp`, `webhook-signature` (Standard Webhooks).
    StandardWebhooks {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<SecretSource>,
        #[serde(default = "default_tolerance")]
        tolerance_s: u64,
    },
    /// `X-Hub-Signature-256: sha256=<hex>`.
    Github {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<SecretSource>,
    },
    /// `Stripe-Signature: t=<ts>,v1=<hex>`.
    Stripe {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        secret: Option<SecretSource>,
        #[serde(default = "default_tolerance")]
        tolerance_s: u64,
    },
}

impl VerifyConfig {
    /// The scheme's name, as the configuration writes it (`scheme: github`).
    pub fn scheme(&self) -> &'static str {
        match self {
            VerifyConfig::None => "none",
            VerifyConfig::HmacSha256 { .. } => "hmac-sha256",
            VerifyConfig::StandardWebhooks { .. } => "standard-webhooks",
            VerifyConfig::Github { .. } => "github",
            VerifyConfig::Stripe { .. } => "stripe",
        }
    }

    /// The source-wide secret, if the scheme has one and it is given.
    pub fn secret(&self) -> Option<&SecretSource> {
        match self {
            VerifyConfig::None => None,
            VerifyConfig::HmacSha256 { secret, .. }
            | VerifyConfig::StandardWebhooks { secret, .. }
            | VerifyConfig::Github { secret }
            | VerifyConfig::Stripe { secret, .. } => secret.as_ref(),
        }
    }

    /// The headers a source of this scheme forwards unless it lists its own: what a
    /// receiver needs to tell one kind of hook from another when the body does not say.
    /// GitHub names the event only in `X-GitHub-Event`; Stripe's and Standard Webhooks'
    /// events carry their type in the body.
    pub fn forward_headers(&self) -> &'static [&'static str] {
        match self {
            VerifyConfig::Github { .. } => &[
                "X-GitHub-Event",
                "X-GitHub-Delivery",
                "X-GitHub-Hook-ID",
                "X-GitHub-Hook-Installation-Target-Type",
                "X-GitHub-Hook-Installation-Target-ID",
            ],
            VerifyConfig::None
            | VerifyConfig::HmacSha256 { .. }
            | VerifyConfig::StandardWebhooks { .. }
            | VerifyConfig::Stripe { .. } => &[],
        }
    }
}

fn default_tolerance() -> u64 {
    300
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "snake_case")]
pub enum SigEncoding {
    #[default]
    Hex,
    Base64,
}

/// Where a hook's idempotency key comes from.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct IdempotencyConfig {
    /// Headers tried in order; the first present one is the key.
    pub headers: Vec<String>,
    /// A JSON pointer into the body, tried after the headers.
    pub json_pointer: Option<String>,
}

/// The secrets of a source whose tenant comes from the request, one per tenant: a
/// tenant's requests verify only with its own, so one tenant cannot post as another.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum TenantSecrets {
    /// A directory with one file per tenant, named by the tenant's id, holding its secret
    /// (a Kubernetes Secret mounted as a volume, one key per tenant). Names starting with
    /// `.` are skipped (the volume's own `..data` links).
    Dir(PathBuf),
    /// The secrets by tenant id.
    Map(BTreeMap<String, SecretSource>),
}

/// The most tenants one source's `tenant_secrets` may name.
pub const MAX_TENANT_SECRETS: usize = 100_000;
/// The longest one tenant's secret file.
pub const MAX_TENANT_SECRET_BYTES: u64 = 4096;

impl TenantSecrets {
    /// Every tenant's secret, read (`key` is `sources[i].tenant_secrets`).
    pub fn resolve(&self, key: &str) -> Result<BTreeMap<String, Vec<u8>>, ConfigError> {
        let mut out = BTreeMap::new();
        match self {
            TenantSecrets::Map(m) => {
                for (tenant, secret) in m {
                    let k = format!("{key}.map.{tenant}");
                    out.insert(tenant.clone(), secret.resolve(&k)?);
                }
            }
            TenantSecrets::Dir(dir) => {
                let key = format!("{key}.dir");
                let read_err = |e: std::io::Error| {
                    invalid(&key, format!("cannot read {}: {e}", dir.display()))
                };
                for entry in std::fs::read_dir(dir).map_err(read_err)? {
                    let entry = entry.map_err(read_err)?;
                    let name = entry.file_name();
                    let Some(tenant) = name.to_str() else {
                        return Err(invalid(&key, format!("{name:?} is not a UTF-8 tenant id")));
                    };
                    if tenant.starts_with('.') {
                        continue;
                    }
                    let path = entry.path();
                    // Followed: a mounted Secret's keys are links into its `..data`.
                    let meta = std::fs::metadata(&path).map_err(read_err)?;
                    if !meta.is_file() {
                        continue;
                    }
                    if meta.len() > MAX_TENANT_SECRET_BYTES {
                        return Err(invalid(
                            &key,
                            format!("{tenant}: a secret file is at most {MAX_TENANT_SECRET_BYTES} bytes"),
                        ));
                    }
                    if out.len() == MAX_TENANT_SECRETS {
                        return Err(invalid(
                            &key,
                            format!("at most {MAX_TENANT_SECRETS} tenants"),
                        ));
                    }
                    let secret = SecretSource::File(path).resolve(&key)?;
                    out.insert(tenant.to_owned(), secret);
                }
            }
        }
        for (tenant, secret) in &out {
            if let Some(why) = tenant_id_problem(tenant) {
                return Err(invalid(
                    key,
                    format!("{tenant:?} is not a tenant id: {why}"),
                ));
            }
            if secret.is_empty() {
                return Err(invalid(key, format!("the secret of {tenant:?} is empty")));
            }
        }
        Ok(out)
    }
}

/// What a source whose tenant comes from the request says about the tenant's binding to
/// its signature.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum TenantBinding {
    /// One secret for the whole source, and every tenant takes the risk: whoever holds it
    /// can post as any tenant. Right where no tenant holds it (the provider signs with an
    /// app's secret of yours); `config check` warns.
    SharedSecret,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct SourceConfig {
    pub id: String,
    /// Absent: every hook belongs to the `default` tenant.
    #[serde(default)]
    pub tenant: Option<TenantFrom>,
    pub verify: VerifyConfig,
    /// Absent: the scheme's own id (`webhook-id`, `X-GitHub-Delivery`, Stripe's event id).
    #[serde(default)]
    pub idempotency: Option<IdempotencyConfig>,
    /// The route (a list of sinks) its hooks fan out to.
    pub route: String,
    #[serde(default)]
    pub body_limit_bytes: Option<usize>,
    /// Request headers kept with each hook and sent on to its sinks (at most
    /// [`MAX_FORWARD_HEADERS`]). Absent: the scheme's own ([`VerifyConfig::forward_headers`]:
    /// GitHub's event and delivery headers); `[]` forwards none.
    #[serde(default)]
    pub forward_headers: Option<Vec<String>>,
    /// Archive this source's hooks (overrides its route's setting).
    #[serde(default)]
    pub archive: Option<ArchiveSetting>,
    /// One secret per tenant, in place of `verify.secret`, for a source whose tenant comes
    /// from the URL, a header or the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_secrets: Option<TenantSecrets>,
    /// `shared-secret`: a source whose tenant comes from the URL or a header, verified
    /// with one secret for every tenant, says so (refused otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant_binding: Option<TenantBinding>,
    /// Where a hook's event type is, for route filters' `event` conditions. Absent: the
    /// scheme's ([`SourceConfig::event_type`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<EventTypeFrom>,
}

/// Where a hook's event type is.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum EventTypeFrom {
    /// A request header (GitHub's `X-GitHub-Event`, Shopify's `X-Shopify-Topic`).
    Header(String),
    /// A JSON pointer into the body (Stripe's and Standard Webhooks' `/type`).
    JsonPointer(String),
}

/// The most header names a source may forward.
pub const MAX_FORWARD_HEADERS: usize = 16;

/// Headers a source may not forward: the delivery sets them itself.
pub const RESERVED_HEADERS: &[&str] = &[
    "host",
    "content-type",
    "content-length",
    "transfer-encoding",
    "connection",
    "upgrade",
    "te",
    "trailer",
    "keep-alive",
    "proxy-connection",
    "user-agent",
    "webhook-id",
    "webhook-timestamp",
    "webhook-signature",
    "ankusa-tenant",
    "ankusa-source",
];

/// Prefixes of the headers the delivery sets itself: none of them is forwarded.
pub const RESERVED_PREFIXES: &[&str] = &["webhook-", "ankusa-"];

impl SourceConfig {
    /// The header names (lower case) this source forwards.
    pub fn forwarded(&self) -> Vec<String> {
        match &self.forward_headers {
            Some(names) => names.iter().map(|n| n.to_ascii_lowercase()).collect(),
            None => self
                .verify
                .forward_headers()
                .iter()
                .map(|n| n.to_ascii_lowercase())
                .collect(),
        }
    }
}

impl SourceConfig {
    /// Where its hooks' event type is: `event_type`, or the scheme's — GitHub's
    /// `X-GitHub-Event` header, Stripe's and Standard Webhooks' `/type` — or none.
    pub fn event_type(&self) -> Option<EventTypeFrom> {
        self.event_type.clone().or(match &self.verify {
            VerifyConfig::Github { .. } => Some(EventTypeFrom::Header("x-github-event".into())),
            VerifyConfig::Stripe { .. } | VerifyConfig::StandardWebhooks { .. } => {
                Some(EventTypeFrom::JsonPointer("/type".into()))
            }
            _ => None,
        })
    }

    /// This source's own keys (`key` is `sources[i]`): its route one of `routes`, its
    /// tenant rule, forwarded headers, body limit, archive setting and secret (read unless
    /// `secrets` says not to).
    pub(crate) fn validate(
        &self,
        key: &str,
        routes: &BTreeSet<&str>,
        secrets: Secrets,
    ) -> Result<(), ConfigError> {
        ArchiveSetting::validate(&self.archive, key)?;
        if !routes.contains(self.route.as_str()) {
            return Err(invalid(
                &format!("{key}.route"),
                format!("unknown route {:?}", self.route),
            ));
        }
        if let Some(TenantFrom::JsonPointer(p)) = &self.tenant {
            if !(p.is_empty() || p.starts_with('/')) {
                return Err(invalid(
                    &format!("{key}.tenant.json_pointer"),
                    "must start with /",
                ));
            }
        }
        if let VerifyConfig::HmacSha256 {
            header,
            prefix,
            timestamp_header,
            ..
        } = &self.verify
        {
            for (what, name) in std::iter::once(("header", header))
                .chain(timestamp_header.as_ref().map(|t| ("timestamp_header", t)))
            {
                if http::HeaderName::from_bytes(name.as_bytes()).is_err() {
                    return Err(invalid(
                        &format!("{key}.verify.{what}"),
                        format!("{name:?} is not a header name"),
                    ));
                }
            }
            // A header's text is ASCII: a prefix with anything else would never match.
            if !prefix.bytes().all(|b| b == b' ' || b.is_ascii_graphic()) {
                return Err(invalid(
                    &format!("{key}.verify.prefix"),
                    "must be printable ASCII",
                ));
            }
        }
        if let Some(TenantFrom::Fixed(t)) = &self.tenant {
            if tenant_id_problem(t).is_some() {
                return Err(invalid(
                    &format!("{key}.tenant.fixed"),
                    "not a valid tenant id",
                ));
            }
        }
        if let Some(names) = &self.forward_headers {
            let key = format!("{key}.forward_headers");
            if names.len() > MAX_FORWARD_HEADERS {
                return Err(invalid(
                    &key,
                    format!("at most {MAX_FORWARD_HEADERS} header names"),
                ));
            }
            let mut seen = std::collections::BTreeSet::new();
            for n in names {
                let lower = n.to_ascii_lowercase();
                if http::HeaderName::from_bytes(n.as_bytes()).is_err()
                    || RESERVED_HEADERS.contains(&lower.as_str())
                    || RESERVED_PREFIXES.iter().any(|p| lower.starts_with(p))
                    || !seen.insert(lower)
                {
                    return Err(invalid(
                        &key,
                        format!(
                            "{n:?} is not a header name, is repeated, or is set by the delivery itself ({}, and every {}* header)",
                            RESERVED_HEADERS.join(", "),
                            RESERVED_PREFIXES.join("*, ")
                        ),
                    ));
                }
            }
        }
        if let Some(n) = self.body_limit_bytes {
            if !(1..=256 << 20).contains(&n) {
                return Err(invalid(
                    &format!("{key}.body_limit_bytes"),
                    "must be in 1..=268435456",
                ));
            }
        }
        if let Some(secret) = self.verify.secret() {
            if secrets.len(secret, &format!("{key}.verify.secret"))? == Some(0) {
                return Err(invalid(&format!("{key}.verify.secret"), "is empty"));
            }
        }
        self.validate_binding(key, secrets)
    }

    /// Whether the tenant a request names is bound to what it signed: a tenant from the URL
    /// or a header, verified with one secret for every tenant, is refused unless
    /// `tenant_binding: shared-secret` says so; `tenant_secrets` replace `verify.secret`.
    fn validate_binding(&self, key: &str, secrets: Secrets) -> Result<(), ConfigError> {
        let verified = self.verify != VerifyConfig::None;
        let from_request = matches!(
            self.tenant,
            Some(TenantFrom::Path | TenantFrom::Header(_) | TenantFrom::JsonPointer(_))
        );
        match (&self.tenant_secrets, self.verify.secret()) {
            (Some(_), _) if !verified => {
                return Err(invalid(
                    &format!("{key}.tenant_secrets"),
                    "a source with verify scheme none has no secret",
                ))
            }
            (Some(_), _) if !from_request => {
                return Err(invalid(
                    &format!("{key}.tenant_secrets"),
                    "only for a source whose tenant comes from the URL, a header or the body",
                ))
            }
            (Some(_), Some(_)) => {
                return Err(invalid(
                    &format!("{key}.verify.secret"),
                    "a source with tenant_secrets has no source-wide secret",
                ))
            }
            (Some(t), None) => {
                if self.tenant_binding.is_some() {
                    return Err(invalid(
                        &format!("{key}.tenant_binding"),
                        "shared-secret contradicts tenant_secrets",
                    ));
                }
                if secrets == Secrets::Resolve {
                    t.resolve(&format!("{key}.tenant_secrets"))?;
                }
                return Ok(());
            }
            (None, None) if verified => {
                return Err(invalid(
                    &format!("{key}.verify.secret"),
                    "is required (or tenant_secrets)",
                ))
            }
            (None, _) => {}
        }
        let unbound =
            verified && matches!(self.tenant, Some(TenantFrom::Path | TenantFrom::Header(_)));
        if unbound && self.tenant_binding.is_none() {
            return Err(invalid(
                &format!("{key}.tenant_binding"),
                "the tenant comes from the request but is not signed, and one secret verifies every tenant: \
                 whoever holds it can post as any tenant. Give each tenant its secret \
                 (tenant_secrets), or say tenant_binding: shared-secret where no tenant holds the secret",
            ));
        }
        if !unbound && self.tenant_binding.is_some() {
            return Err(invalid(
                &format!("{key}.tenant_binding"),
                "only for a verified source whose tenant comes from the URL or a header",
            ));
        }
        Ok(())
    }

    /// What `config check` says of this source without refusing it.
    pub fn warnings(&self, key: &str) -> Vec<String> {
        let mut out = Vec::new();
        if self.tenant_binding == Some(TenantBinding::SharedSecret) {
            out.push(format!(
                "{key}: tenant_binding shared-secret: whoever holds the source's secret can post as any tenant"
            ));
        }
        if self.verify == VerifyConfig::None {
            out.push(format!(
                "{key}: verify scheme none: whoever reaches the ingest listener can post to this source"
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::VerifyConfig;

    /// `scheme()` is the tag the configuration's YAML writes.
    #[test]
    fn a_schemes_name_is_its_tag() {
        for yaml in [
            "scheme: none",
            "scheme: hmac-sha256\nheader: x-sig",
            "scheme: standard-webhooks",
            "scheme: github",
            "scheme: stripe",
        ] {
            let v: VerifyConfig = serde_yaml::from_str(yaml).unwrap();
            assert_eq!(
                format!("scheme: {}", v.scheme()),
                yaml.lines().next().unwrap()
            );
        }
    }
}
