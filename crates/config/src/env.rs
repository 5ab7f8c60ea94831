//! Environment overrides: `ANKUSA_<PATH>`, segments joined by a double underscore.

use crate::locate::Seg;
use crate::{invalid, Config, ConfigError};

/// A variable that set a key: the key's path (a list entry by its index).
#[derive(Debug)]
pub(crate) struct Override {
    pub var: String,
    pub path: Vec<Seg>,
}

/// Applies every `ANKUSA_*` variable of `env` whose first segment names a top-level key to
/// the parsed document `doc`; returns what each set. An override that cannot apply is an
/// error that names its variable.
pub(crate) fn apply(
    doc: &mut serde_yaml::Value,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Vec<Override>, ConfigError> {
    let sections = top_level_keys();
    let mut applied = Vec::new();
    for (k, v) in env {
        let Some(path) = k.strip_prefix("ANKUSA_") else {
            continue;
        };
        // Only a variable whose first segment names a configuration key is an
        // override: Kubernetes injects `<SERVICE>_SERVICE_HOST` and friends for every
        // Service in a pod's namespace (an `ankusa-metrics` Service gives
        // `ANKUSA_METRICS_SERVICE_HOST`), and the command line reads a few `ANKUSA_*`
        // variables of its own. A misspelt key below a real section is still an error.
        let first = path.split("__").next().unwrap_or("").to_ascii_lowercase();
        if !sections.contains(&first) {
            tracing::debug!(variable = %k, "not a configuration override; ignored");
            continue;
        }
        let path = apply_override(doc, path, &v).map_err(|e| crate::from_variable(e, &k))?;
        applied.push(Override { var: k, path });
    }
    Ok(applied)
}

/// The configuration's top-level keys, from its own serialisation.
fn top_level_keys() -> Vec<String> {
    match serde_json::to_value(Config::default()) {
        Ok(serde_json::Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Applies one `ANKUSA_A__B__C` override. A segment below a list picks an entry by its
/// index (`ANKUSA_SINKS__0__URL`) or by its `id`, case-insensitively (`ANKUSA_SINKS__CI__URL`);
/// an entry that does not exist is an error, as is a segment below a scalar.
fn apply_override(
    doc: &mut serde_yaml::Value,
    path: &str,
    raw: &str,
) -> Result<Vec<Seg>, ConfigError> {
    let segments: Vec<String> = path.split("__").map(|s| s.to_ascii_lowercase()).collect();
    let key = segments.join(".");
    if segments.iter().any(|s| s.is_empty()) {
        return Err(invalid(&key, "malformed environment override name"));
    }
    let mut value = Some(
        serde_yaml::from_str::<serde_yaml::Value>(raw)
            .map_err(|e| invalid(&key, format!("bad override: {e}")))?,
    );
    let mut node = doc;
    let mut resolved = Vec::new();
    for (i, seg) in segments.iter().enumerate() {
        let last = i + 1 == segments.len();
        node = match node {
            serde_yaml::Value::Mapping(m) => {
                let k = serde_yaml::Value::String(seg.clone());
                resolved.push(Seg::Key(seg.clone()));
                if last {
                    m.insert(k, value.take().unwrap_or_default());
                    return Ok(resolved);
                }
                m.entry(k)
                    .or_insert_with(|| serde_yaml::Value::Mapping(Default::default()))
            }
            serde_yaml::Value::Sequence(items) => {
                let at = match seg.parse::<usize>() {
                    Ok(n) if n < items.len() => n,
                    Ok(n) => {
                        return Err(invalid(
                            &key,
                            format!("no entry {n}: the list has {} entries", items.len()),
                        ))
                    }
                    Err(_) => items
                        .iter()
                        .position(|it| {
                            it.get("id")
                                .and_then(serde_yaml::Value::as_str)
                                .is_some_and(|id| id.eq_ignore_ascii_case(seg))
                        })
                        .ok_or_else(|| {
                            invalid(&key, format!("no entry with index or id {seg:?}"))
                        })?,
                };
                resolved.push(Seg::Index(at));
                if last {
                    items[at] = value.take().unwrap_or_default();
                    return Ok(resolved);
                }
                &mut items[at]
            }
            _ => {
                return Err(invalid(
                    &key,
                    "overrides a key below a value that is not a mapping or a list",
                ))
            }
        };
    }
    Ok(resolved)
}
