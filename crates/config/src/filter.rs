//! Filters on a route's sinks (`routes[].filters`): a sink takes a hook only when the hook
//! matches its filter, evaluated once per hook at ingest, before the commit.

use serde::{Deserialize, Serialize};

use crate::{invalid, ConfigError};

/// The most conditions one filter holds (its own and its nested ones).
pub const MAX_CONDITIONS: usize = 64;
/// How deep `any`, `all` and `not` may nest.
pub const MAX_DEPTH: usize = 8;
/// The most patterns of one condition, and the longest pattern.
pub const MAX_PATTERNS: usize = 64;
pub const MAX_PATTERN_LEN: usize = 256;

/// Glob patterns: one or a list. `*` is any run of characters (none included), `?` one
/// character; everything else is itself (case counts).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(untagged)]
pub enum Patterns {
    One(String),
    Many(Vec<String>),
}

impl Patterns {
    pub fn as_slice(&self) -> &[String] {
        match self {
            Patterns::One(p) => std::slice::from_ref(p),
            Patterns::Many(v) => v,
        }
    }

    /// Whether `value` matches one of the patterns.
    pub fn any_matches(&self, value: &str) -> bool {
        self.as_slice().iter().any(|p| glob(p, value))
    }
}

/// Where a header condition looks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct HeaderMatch {
    /// The request header (any case).
    pub name: String,
    pub matches: Patterns,
}

/// Where a JSON pointer condition looks.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PointerMatch {
    /// A JSON pointer into the body (RFC 6901): a string there is matched as it is, a
    /// number or a boolean as JSON writes it; anything else, or nothing, matches no pattern.
    pub pointer: String,
    pub matches: Patterns,
}

/// A filter: a condition, or conditions combined.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, rename_all = "snake_case")]
pub enum Filter {
    /// The hook's event type (its source's `event_type`: a provider's header or a JSON
    /// pointer) matches one of the patterns.
    Event(Patterns),
    Header(HeaderMatch),
    Pointer(PointerMatch),
    /// At least one of the filters matches.
    Any(Vec<Filter>),
    /// Every one of the filters matches.
    All(Vec<Filter>),
    /// The filter does not match.
    Not(Box<Filter>),
}

/// What a filter reads of a hook.
pub trait HookFacts {
    /// The event type, when the source says where it is and the hook has one.
    fn event(&self) -> Option<&str>;
    /// A request header's value (the first, as text).
    fn header(&self, name: &str) -> Option<&str>;
    /// The text of the JSON value at `pointer` (a string as it is, a number or a boolean as
    /// JSON writes it).
    fn pointer(&self, pointer: &str) -> Option<String>;
}

impl Filter {
    /// Whether the hook `facts` describes matches.
    pub fn matches(&self, facts: &dyn HookFacts) -> bool {
        match self {
            Filter::Event(p) => facts.event().is_some_and(|e| p.any_matches(e)),
            Filter::Header(h) => facts
                .header(&h.name)
                .is_some_and(|v| h.matches.any_matches(v)),
            Filter::Pointer(j) => facts
                .pointer(&j.pointer)
                .is_some_and(|v| j.matches.any_matches(&v)),
            Filter::Any(fs) => fs.iter().any(|f| f.matches(facts)),
            Filter::All(fs) => fs.iter().all(|f| f.matches(facts)),
            Filter::Not(f) => !f.matches(facts),
        }
    }

    /// Whether it reads the event type anywhere (its source must then say where that is).
    pub fn reads_event(&self) -> bool {
        match self {
            Filter::Event(_) => true,
            Filter::Header(_) | Filter::Pointer(_) => false,
            Filter::Any(fs) | Filter::All(fs) => fs.iter().any(Filter::reads_event),
            Filter::Not(f) => f.reads_event(),
        }
    }

    /// Its bounds, and each part well formed; `key` names it in errors.
    pub fn validate(&self, key: &str) -> Result<(), ConfigError> {
        let mut count = 0;
        self.validate_at(key, 1, &mut count)
    }

    fn validate_at(&self, key: &str, depth: usize, count: &mut usize) -> Result<(), ConfigError> {
        *count += 1;
        if *count > MAX_CONDITIONS {
            return Err(invalid(
                key,
                format!("more than {MAX_CONDITIONS} conditions"),
            ));
        }
        if depth > MAX_DEPTH {
            return Err(invalid(key, format!("nested deeper than {MAX_DEPTH}")));
        }
        let patterns = |p: &Patterns| -> Result<(), ConfigError> {
            let list = p.as_slice();
            if list.is_empty() || list.len() > MAX_PATTERNS {
                return Err(invalid(
                    key,
                    format!("must give 1..={MAX_PATTERNS} patterns"),
                ));
            }
            if let Some(long) = list.iter().find(|p| p.len() > MAX_PATTERN_LEN) {
                return Err(invalid(
                    key,
                    format!("a pattern longer than {MAX_PATTERN_LEN} bytes: {long:.40}…"),
                ));
            }
            Ok(())
        };
        match self {
            Filter::Event(p) => patterns(p),
            Filter::Header(h) => {
                if http_header_name_ok(&h.name) {
                    patterns(&h.matches)
                } else {
                    Err(invalid(key, format!("{:?} is not a header name", h.name)))
                }
            }
            Filter::Pointer(j) => {
                if j.pointer.is_empty() || j.pointer.starts_with('/') {
                    patterns(&j.matches)
                } else {
                    Err(invalid(
                        key,
                        format!("{:?} is not a JSON pointer (it starts with /)", j.pointer),
                    ))
                }
            }
            Filter::Any(fs) | Filter::All(fs) => {
                if fs.is_empty() {
                    return Err(invalid(key, "any and all hold at least one filter"));
                }
                fs.iter()
                    .try_for_each(|f| f.validate_at(key, depth + 1, count))
            }
            Filter::Not(f) => f.validate_at(key, depth + 1, count),
        }
    }
}

fn http_header_name_ok(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 256
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

/// Whether `text` matches the glob `pattern` (`*` any run, `?` one character): linear in
/// the two lengths' product at worst, with no recursion.
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    // The last `*` seen, and the text position it was tried at.
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                // Let the last `*` take one more character and try again after it.
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_runs_and_single_characters() {
        for (p, t, want) in [
            ("invoice.*", "invoice.paid", true),
            ("invoice.*", "invoice.", true),
            ("invoice.*", "invoices.paid", false),
            ("*", "", true),
            ("", "", true),
            ("", "a", false),
            ("a?c", "abc", true),
            ("a?c", "ac", false),
            ("*.paid", "invoice.paid", true),
            ("*a*b*", "xaxxbx", true),
            ("*a*b", "xaxxbx", false),
            ("push", "Push", false),
            ("orders/*", "orders/create", true),
            ("ü?", "üx", true),
        ] {
            assert_eq!(glob(p, t), want, "{p:?} on {t:?}");
        }
    }
}
