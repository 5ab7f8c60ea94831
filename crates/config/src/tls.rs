//! Certificate authorities the delivery client trusts beyond the web PKI
//! (`dispatch.ca_bundle`, `sinks[].ca_bundle`).

use std::path::PathBuf;

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::CertificateDer;
use serde::{Deserialize, Serialize};

use crate::{invalid, ConfigError, Secrets};

/// The most certificates one bundle may hold.
pub const MAX_BUNDLE_CERTS: usize = 256;

/// PEM certificates (`-----BEGIN CERTIFICATE-----`), read from a file or given inline.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum CaBundle {
    File(PathBuf),
    Pem(String),
}

impl CaBundle {
    /// The bundle's certificates: at least one, at most [`MAX_BUNDLE_CERTS`]; anything that
    /// is not a PEM certificate is an error naming `key`.
    pub fn certificates(&self, key: &str) -> Result<Vec<CertificateDer<'static>>, ConfigError> {
        let text = match self {
            CaBundle::Pem(p) => p.as_bytes().to_vec(),
            CaBundle::File(path) => std::fs::read(path).map_err(|e| {
                invalid(
                    key,
                    format!("cannot read the CA bundle {}: {e}", path.display()),
                )
            })?,
        };
        let mut certs = Vec::new();
        for c in CertificateDer::pem_slice_iter(&text) {
            let c = c.map_err(|e| invalid(key, format!("not a PEM certificate bundle: {e}")))?;
            certs.push(c);
            if certs.len() > MAX_BUNDLE_CERTS {
                return Err(invalid(
                    key,
                    format!("more than {MAX_BUNDLE_CERTS} certificates"),
                ));
            }
        }
        if certs.is_empty() {
            return Err(invalid(
                key,
                "holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            ));
        }
        Ok(certs)
    }

    /// Checked as the node will read it; a file is read only when secrets are (it exists
    /// where the node runs).
    pub(crate) fn validate(&self, key: &str, secrets: Secrets) -> Result<(), ConfigError> {
        match (self, secrets) {
            (CaBundle::File(_), Secrets::Skip) => Ok(()),
            _ => self.certificates(key).map(drop),
        }
    }
}
