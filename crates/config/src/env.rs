//! Environment overrides: `ANKUSA_<PATH>`, segments joined by a double underscore.

use crate::locate::Seg;
use crate::{invalid, Config, ConfigError};

/// A variable that set a key: the key's path (a list entry by its index).
#[derive(Debug)]
pub(crate) struct Override {
    pub var: String,
    pub path: Vec<Seg>,
}

/// What the environment did to a configuration: the overrides it applied, in the order
/// applied, and the `ANKUSA_*` variables that are not configuration (`config check` lists
/// both; a starting node logs them).
#[derive(Debug, Default)]
pub struct EnvReport {
    /// Each override applied: its variable and the key it set (`tenants.max`, `sinks[1].url`).
    pub applied: Vec<(String, String)>,
    /// `ANKUSA_*` variables left alone: no double underscore and no top-level key for a
    /// name (the command line's own, those Kubernetes injects for a Service).
    pub ignored: Vec<String>,
}

/// Applies every `ANKUSA_*` variable of `env` whose first segment names a top-level key to
/// the parsed document `doc`; returns what each set and what was left alone. An override
/// that cannot apply is an error that names its variable, and so is a variable with a
/// double underscore whose first segment names no key (`ANKUSA_TENANT__MAX`): it can only
/// be a misspelt override, while what Kubernetes injects and the command line reads have
/// single underscores only.
pub(crate) fn apply(
    doc: &mut serde_yaml::Value,
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<(Vec<Override>, Vec<String>), ConfigError> {
    let sections = top_level_keys();
    let mut applied = Vec::new();
    let mut ignored = Vec::new();
    let mut env: Vec<(String, String)> = env.into_iter().collect();
    // One order whatever the process's: the same environment always gives the same
    // configuration and the same report (a later override of one key wins by name).
    env.sort();
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
            if path.contains("__") {
                let hint = nearest(&first, &sections)
                    .map(|s| format!(" (did you mean `{s}`?)"))
                    .unwrap_or_default();
                let e = invalid(
                    &first,
                    format!(
                        "not a configuration key{hint}; the top-level keys are {}",
                        sections.join(", ")
                    ),
                );
                return Err(crate::from_variable(e, &k));
            }
            tracing::debug!(variable = %k, "not a configuration override; ignored");
            ignored.push(k);
            continue;
        }
        let path = apply_override(doc, path, &v).map_err(|e| crate::from_variable(e, &k))?;
        applied.push(Override { var: k, path });
    }
    Ok((applied, ignored))
}

/// The key of `keys` nearest to a misspelt `name`, when it is near: at most two edits
/// (`tenant` → `tenants`, `sink` → `sinks`, `hooklog` → `hook_log`).
fn nearest<'a>(name: &str, keys: &'a [String]) -> Option<&'a str> {
    keys.iter()
        .map(|k| (edits(name, k), k))
        .filter(|(d, _)| *d <= 2)
        .min()
        .map(|(_, k)| k.as_str())
}

/// Levenshtein distance of two short ASCII names.
fn edits(a: &str, b: &str) -> usize {
    let b = b.as_bytes();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.bytes().enumerate() {
        let mut prev = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let cur = row[j + 1];
            row[j + 1] = (prev + usize::from(ca != *cb)).min(row[j] + 1).min(cur + 1);
            prev = cur;
        }
    }
    row[b.len()]
}

/// The configuration's top-level keys, from its own serialisation.
pub(crate) fn top_level_keys() -> Vec<String> {
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
