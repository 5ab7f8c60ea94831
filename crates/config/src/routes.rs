//! Routes: a source's sinks (`routes`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::{invalid, ArchiveSetting, ConfigError, Filter};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouteConfig {
    pub id: String,
    pub sinks: Vec<String>,
    /// Archive the hooks of every source on this route (a source's own setting wins).
    #[serde(default)]
    pub archive: Option<ArchiveSetting>,
    /// A sink of the route (by id) takes a hook only when the hook matches its filter; a
    /// sink without one takes every hook.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub filters: BTreeMap<String, Filter>,
}

impl RouteConfig {
    /// This route's own keys (`key` is `routes[i]`): 1..=65535 sinks, each one of `sinks`.
    pub(crate) fn validate(&self, key: &str, sinks: &BTreeSet<&str>) -> Result<(), ConfigError> {
        ArchiveSetting::validate(&self.archive, key)?;
        if self.sinks.is_empty() || self.sinks.len() > usize::from(u16::MAX) {
            return Err(invalid(
                &format!("{key}.sinks"),
                "must name 1..=65535 sinks",
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
