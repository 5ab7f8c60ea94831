//! Bearer-token authentication and tenant scopes of the admin API.
//!
//! Tokens come from `admin.tokens` (inline, file or env). A request's token is compared
//! with every configured token in constant time (over SHA-256 digests, so lengths leak
//! nothing either). A tenant-scoped token sees and changes only its tenants: everything
//! else behaves as if it did not exist (404, not 403).
//!
//! A tenant-portal link's credential (`p1.<tenant>.<expiry>.<signature>`, signed with
//! `admin.console.portal_secret`) is a bearer token too: the scope of its one tenant until
//! it expires. Every node with the same secret accepts it.

use std::collections::BTreeSet;

use axum::http::HeaderMap;
use base64::Engine;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use ankusa_config::{Config, ConfigError, ScopeConfig};

/// What a caller may see.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    Admin,
    Tenants(BTreeSet<String>),
}

impl Scope {
    /// True if `tenant` is visible to this scope.
    pub fn sees(&self, tenant: &str) -> bool {
        match self {
            Scope::Admin => true,
            Scope::Tenants(t) => t.contains(tenant),
        }
    }
    pub fn is_admin(&self) -> bool {
        matches!(self, Scope::Admin)
    }
}

/// An authenticated caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub name: String,
    pub scope: Scope,
    /// A backup-scope token: only the backup endpoints accept it (its `scope` sees no
    /// tenant either way).
    pub backup_only: bool,
    /// A metrics-scope token: only `/metrics` accepts it.
    pub metrics_only: bool,
    /// A tenant-portal credential: it reads and replays, and neither deletes rows nor
    /// holds delivery (purge, pause, resume, quarantine deletes answer 403).
    pub portal: bool,
}

#[derive(Clone)]
struct Token {
    name: String,
    digest: [u8; 32],
    scope: Scope,
    backup_only: bool,
    metrics_only: bool,
}

/// The configured tokens, and the key of portal links.
#[derive(Clone, Default)]
pub struct Tokens(Vec<Token>, Option<PortalKey>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|t| &t.name))
            .finish()
    }
}

/// The key tenant-portal links are signed with.
#[derive(Clone)]
struct PortalKey(Vec<u8>);

/// What a portal credential begins with (its format's version).
const PORTAL_PREFIX: &str = "p1.";

impl PortalKey {
    fn mac(&self, tenant: &str, expires_ms: u64) -> [u8; 32] {
        use hmac::Mac;
        #[allow(clippy::expect_used, reason = "HMAC takes a key of any length")]
        let mut m = hmac::Hmac::<Sha256>::new_from_slice(&self.0).expect("any key length");
        m.update(b"ankusa-portal-v1\0");
        m.update(tenant.as_bytes());
        m.update(b"\0");
        m.update(&expires_ms.to_be_bytes());
        m.finalize().into_bytes().into()
    }
}

impl Tokens {
    pub fn from_config(c: &Config) -> Result<Self, ConfigError> {
        let mut out = Vec::new();
        for (i, t) in c.admin.tokens.iter().enumerate() {
            let secret = t.secret.resolve(&format!("admin.tokens[{i}].secret"))?;
            out.push(Token {
                name: t.name.clone(),
                digest: Sha256::digest(&secret).into(),
                scope: match &t.scope {
                    ScopeConfig::Admin => Scope::Admin,
                    ScopeConfig::Tenants(ts) => Scope::Tenants(ts.iter().cloned().collect()),
                    ScopeConfig::Backup | ScopeConfig::Metrics => Scope::Tenants(BTreeSet::new()),
                },
                backup_only: t.scope == ScopeConfig::Backup,
                metrics_only: t.scope == ScopeConfig::Metrics,
            });
        }
        let portal = match &c.admin.console.portal_secret {
            Some(s) => Some(PortalKey(s.resolve("admin.console.portal_secret")?)),
            None => None,
        };
        Ok(Tokens(out, portal))
    }

    /// Whether portal links can be made (`admin.console.portal_secret` is set).
    pub fn portal_enabled(&self) -> bool {
        self.1.is_some()
    }

    /// A portal credential for `tenant` until `expires_ms` (ms since the epoch).
    pub fn portal_credential(&self, tenant: &str, expires_ms: u64) -> Option<String> {
        let key = self.1.as_ref()?;
        let b64 = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        Some(format!(
            "{PORTAL_PREFIX}{}.{expires_ms}.{}",
            b64.encode(tenant),
            b64.encode(key.mac(tenant, expires_ms))
        ))
    }

    /// The caller a portal credential stands for: its tenant's scope, while it has not
    /// expired and its signature is this node's key's.
    pub fn portal_caller(&self, credential: &str, now_ms: u64) -> Option<Caller> {
        let key = self.1.as_ref()?;
        let rest = credential.strip_prefix(PORTAL_PREFIX)?;
        let mut parts = rest.split('.');
        let (t, exp, sig) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        let b64 = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let tenant = String::from_utf8(b64.decode(t).ok()?).ok()?;
        let expires_ms: u64 = exp.parse().ok()?;
        let sig = b64.decode(sig).ok()?;
        let good = bool::from(key.mac(&tenant, expires_ms).ct_eq(sig.as_slice()));
        (good && now_ms < expires_ms).then(|| Caller {
            name: format!("portal:{tenant}"),
            scope: Scope::Tenants(BTreeSet::from([tenant])),
            backup_only: false,
            metrics_only: false,
            portal: true,
        })
    }

    /// The caller a request's `Authorization: Bearer …` header names, if any (the scheme
    /// in any case, RFC 7235).
    pub fn authenticate(&self, headers: &HeaderMap) -> Option<Caller> {
        let given = bearer(
            headers
                .get(axum::http::header::AUTHORIZATION)?
                .to_str()
                .ok()?,
        )?;
        self.caller_of(given)
    }

    /// The caller a bearer token (or a portal credential) is, if any.
    pub fn caller_of(&self, given: &str) -> Option<Caller> {
        if given.starts_with(PORTAL_PREFIX) {
            return self.portal_caller(given, ankusa_keyspace::now_ms());
        }
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        let mut found = None;
        // Compare with every token, whatever matches first.
        for t in &self.0 {
            if bool::from(t.digest.ct_eq(&digest)) && found.is_none() {
                found = Some(Caller {
                    name: t.name.clone(),
                    scope: t.scope.clone(),
                    backup_only: t.backup_only,
                    metrics_only: t.metrics_only,
                    portal: false,
                });
            }
        }
        found
    }
}

use crate::http::bearer;

#[cfg(test)]
mod tests {
    use super::bearer;

    #[test]
    fn a_portal_credential_is_its_tenants_scope_until_it_expires_and_nothing_once_altered() {
        let mut c = ankusa_config::Config::default();
        c.admin.console.portal_secret = Some(ankusa_config::SecretSource::Value(
            "a-portal-secret-of-32-bytes-or-more".into(),
        ));
        let tokens = super::Tokens::from_config(&c).unwrap();
        let cred = tokens.portal_credential("acme", 2_000).unwrap();
        let caller = tokens.portal_caller(&cred, 1_000).unwrap();
        assert!(caller.scope.sees("acme") && !caller.scope.sees("globex"));
        assert!(!caller.scope.is_admin() && caller.portal);
        assert_eq!(tokens.portal_caller(&cred, 2_000), None, "expired");
        // Another tenant, another expiry or another key: refused.
        let other = tokens.portal_credential("globex", 2_000).unwrap();
        let parts: Vec<&str> = cred.split('.').collect();
        let oparts: Vec<&str> = other.split('.').collect();
        let swapped = format!("p1.{}.{}.{}", oparts[1], parts[2], parts[3]);
        assert_eq!(tokens.portal_caller(&swapped, 1_000), None);
        let later = format!("p1.{}.9999.{}", parts[1], parts[3]);
        assert_eq!(tokens.portal_caller(&later, 1_000), None);
        c.admin.console.portal_secret = Some(ankusa_config::SecretSource::Value(
            "another-portal-secret-of-32-bytes-".into(),
        ));
        let elsewhere = super::Tokens::from_config(&c).unwrap();
        assert_eq!(elsewhere.portal_caller(&cred, 1_000), None);
        // A node without the secret makes no credential and accepts none.
        let none = super::Tokens::from_config(&ankusa_config::Config::default()).unwrap();
        assert_eq!(none.portal_credential("acme", 2_000), None);
        assert_eq!(none.portal_caller(&cred, 1_000), None);
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in [
            "Bearer t0k",
            "bearer t0k",
            "BEARER t0k",
            "Bearer   t0k ",
            "bEaReR t0k",
        ] {
            assert_eq!(bearer(v), Some("t0k"), "{v:?}");
        }
        for v in ["Basic dTpw", "Bearer", "Bearer ", "Bearert0k", "t0k"] {
            assert_eq!(bearer(v), None, "{v:?}");
        }
    }
}
