//! Bearer-token authentication and tenant scopes of the admin API.
//!
//! Tokens come from `admin.tokens` (inline, file or env). A request's token is compared
//! with every configured token in constant time (over SHA-256 digests, so lengths leak
//! nothing either). A tenant-scoped token sees and changes only its tenants: everything
//! else behaves as if it did not exist (404, not 403).

use std::collections::BTreeSet;

use axum::http::HeaderMap;
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
}

#[derive(Clone)]
struct Token {
    name: String,
    digest: [u8; 32],
    scope: Scope,
    backup_only: bool,
}

/// The configured tokens.
#[derive(Clone, Default)]
pub struct Tokens(Vec<Token>);

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|t| &t.name))
            .finish()
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
                    ScopeConfig::Backup => Scope::Tenants(BTreeSet::new()),
                },
                backup_only: t.scope == ScopeConfig::Backup,
            });
        }
        Ok(Tokens(out))
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
        let digest: [u8; 32] = Sha256::digest(given.as_bytes()).into();
        let mut found = None;
        // Compare with every token, whatever matches first.
        for t in &self.0 {
            if bool::from(t.digest.ct_eq(&digest)) && found.is_none() {
                found = Some(Caller {
                    name: t.name.clone(),
                    scope: t.scope.clone(),
                    backup_only: t.backup_only,
                });
            }
        }
        found
    }
}

pub use crate::http::bearer;

#[cfg(test)]
mod tests {
    use super::bearer;

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
