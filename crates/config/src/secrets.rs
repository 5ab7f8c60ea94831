//! Secrets: where a key is read from, and whether to read it.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use crate::{invalid, ConfigError};

/// Whether validation reads the secrets (their length is checked) or leaves them be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Secrets {
    Resolve,
    Skip,
}

impl Secrets {
    /// The secret's length, or `None` when secrets are skipped.
    pub(crate) fn len(self, s: &SecretSource, key: &str) -> Result<Option<usize>, ConfigError> {
        match self {
            Secrets::Resolve => Ok(Some(s.resolve(key)?.len())),
            Secrets::Skip => Ok(None),
        }
    }
}

/// A secret: given inline, read from a file, or read from an environment variable.
/// Never printed: `Debug` and serialisation show `<redacted>`.
#[derive(Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum SecretSource {
    Value(String),
    File(PathBuf),
    Env(String),
}

impl std::fmt::Debug for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Serialize for SecretSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(REDACTED)
    }
}

/// What every secret is replaced by in `/v1/config`.
pub const REDACTED: &str = "<redacted>";

impl SecretSource {
    /// The secret's bytes (a trailing newline of a file is dropped).
    pub fn resolve(&self, key: &str) -> Result<Vec<u8>, ConfigError> {
        match self {
            SecretSource::Value(v) => Ok(v.as_bytes().to_vec()),
            SecretSource::File(p) => {
                let mut b = std::fs::read(p).map_err(|e| {
                    invalid(key, format!("cannot read secret file {}: {e}", p.display()))
                })?;
                while b.last().is_some_and(|c| *c == b'\n' || *c == b'\r') {
                    b.pop();
                }
                Ok(b)
            }
            SecretSource::Env(name) => std::env::var(name)
                .map(String::into_bytes)
                .map_err(|_| invalid(key, format!("environment variable {name} is not set"))),
        }
    }
}
