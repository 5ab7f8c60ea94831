//! Fixtures shared by the operator's tests.

use std::path::PathBuf;

use ankusa_crds::relay::Relay;
use serde_json::Value;

/// The workspace root.
pub fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// `crates/operator/tests/<rel>`.
pub fn test_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join(rel)
}

/// A `Relay` fixture from `tests/fixtures/relays/<name>.yaml`, as JSON.
pub fn relay_value(name: &str) -> Value {
    let path = test_path(&format!("fixtures/relays/{name}.yaml"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_yaml::from_str(&text).unwrap()
}

pub fn relay(name: &str) -> Relay {
    serde_json::from_value(relay_value(name)).unwrap()
}

/// `have` holds every field of `want`; on failure, both are printed.
#[track_caller]
pub fn assert_contains(have: &Value, want: &Value, what: &str) {
    assert!(
        ankusa_operator::observed::contains(have, want),
        "{what}: expected to contain\n{}\nbut was\n{}",
        serde_yaml::to_string(want).unwrap(),
        serde_yaml::to_string(have).unwrap()
    );
}

/// `patch` merged into `base`: mappings key by key, anything else replaced.
pub fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}
