//! Routes: a source's sinks (`routes`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{invalid, ArchiveSetting, ConfigError, Filter};

/// The most configured sinks a route names: a hook's list holds 65 535 sinks, and a tenant's
/// endpoints (1 000 at most) come after them.
pub const MAX_ROUTE_SINKS: usize = u16::MAX as usize - 1_000;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub id: String,
    /// The configured sinks (by id); may be empty when `endpoints` is on.
    #[serde(default)]
    pub sinks: Vec<String>,
    /// Deliver each hook to its tenant's own endpoints too (`/v1/tenants/{t}/endpoints`):
    /// every enabled one whose filter the hook matches, after the route's sinks.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub endpoints: bool,
    /// Archive the hooks of every source on this route (a source's own setting wins).
    #[serde(default)]
    pub archive: Option<ArchiveSetting>,
    /// A sink of the route (by id) takes a hook only when the hook matches its filter; a
    /// sink without one takes every hook.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filters: BTreeMap<String, Filter>,
}

impl RouteConfig {
    /// This route's own keys (`key` is `routes[i]`): 1..=64535 sinks, each one of `sinks`
    /// (none when the tenants' endpoints are on; a hook's list holds 65535 at most, and a
    /// tenant up to 1 000 endpoints).
    pub(crate) fn validate(&self, key: &str, sinks: &BTreeSet<&str>) -> Result<(), ConfigError> {
        ArchiveSetting::validate(&self.archive, key)?;
        let least = usize::from(!self.endpoints);
        if self.sinks.len() < least || self.sinks.len() > MAX_ROUTE_SINKS {
            return Err(invalid(
                &format!("{key}.sinks"),
                format!("must name {least}..={MAX_ROUTE_SINKS} sinks"),
            ));
        }
        for s in &self.sinks {
            if !sinks.contains(s.as_str()) {
                return Err(invalid(
                    &format!("{key}.sinks"),
                    format!("unknown sink {s:?}"),
                ));
            }
        }
        for (sink, filter) in &self.filters {
            let at = format!("{key}.filters.{sink}");
            if !self.sinks.contains(sink) {
                return Err(invalid(&at, "not one of the route's sinks"));
            }
            filter.validate(&at)?;
        }
        Ok(())
    }
}
