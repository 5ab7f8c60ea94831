//! The committed CRD manifests are what the types generate, and the example `Relay`
//! validates against the generated schema (while broken ones do not).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;

use ankusa_crds::manifest::{chart_template, manifest, CHART_TEMPLATE_PATH, MANIFEST_PATH};
use ankusa_crds::relay::Relay;
use kube::CustomResourceExt;
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn committed_manifests_match_the_types() {
    for (path, generated) in [
        (MANIFEST_PATH, manifest()),
        (CHART_TEMPLATE_PATH, chart_template()),
    ] {
        let committed = std::fs::read_to_string(root().join(path)).unwrap_or_default();
        assert!(
            committed == generated,
            "{path} differs from the generated CRD: run `cargo run -p ankusa-crds --bin crdgen`"
        );
    }
}

/// The openAPIV3Schema of v1alpha1, as a JSON Schema validator.
fn validator() -> jsonschema::Validator {
    let crd = serde_json::to_value(Relay::crd()).unwrap();
    let schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"].clone();
    jsonschema::validator_for(&schema).unwrap()
}

fn example() -> Value {
    let text = std::fs::read_to_string(root().join("examples/relay.yaml")).unwrap();
    serde_yaml::from_str(&text).unwrap()
}

#[test]
fn example_relay_validates_against_the_crd_schema() {
    let v = validator();
    let doc = example();
    let errors: Vec<String> = v
        .iter_errors(&doc)
        .map(|e| format!("{} at {}", e, e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "examples/relay.yaml: {errors:#?}");
    // And it is a Relay the operator can read.
    let relay: Relay = serde_json::from_value(doc).unwrap();
    assert_eq!(relay.spec.replicas, 3);
    assert_eq!(relay.spec.config.secret_env.len(), 5);
}

#[test]
fn broken_relays_do_not_validate() {
    let v = validator();
    let cases: Vec<(&str, Value)> = vec![
        (
            "replicas is a string",
            json!({ "spec": { "replicas": "three" } }),
        ),
        (
            "tenants.max is a string",
            json!({ "spec": { "tenants": { "max": "lots" } } }),
        ),
        (
            "unknown backup policy",
            json!({ "spec": { "backup": { "destination": { "claimName": "b" }, "policy": "Sometimes" } } }),
        ),
        (
            "secretEnv without secretKeyRef",
            json!({ "spec": { "config": { "secretEnv": [{ "name": "X" }] } } }),
        ),
    ];
    for (what, patch) in cases {
        let mut doc = example();
        merge(&mut doc, &patch);
        assert!(!v.is_valid(&doc), "{what}: validated");
    }
    let mut no_image = example();
    no_image["spec"].as_object_mut().unwrap().remove("image");
    assert!(!v.is_valid(&no_image), "a Relay without an image validated");
    // (A backup with neither a destination nor an object store is a CEL rule's: the API
    // server's admission test has it.)
    let mut no_url = example();
    no_url["spec"]["backup"] = json!({ "objectStore": { "endpoint": "http://10.0.0.1:8333" } });
    assert!(
        !v.is_valid(&no_url),
        "an object store without a url validated"
    );
}

/// The CEL rules the API server enforces are in the schema where they belong.
#[test]
fn cel_rules_guard_nonsense() {
    let crd = serde_json::to_string(&Relay::crd()).unwrap();
    for rule in [
        "self >= 1",
        "!self.startsWith('data-')",
        "!(has(self.inline) && has(self.configMapRef))",
        "self != ''",
    ] {
        assert!(
            crd.contains(&serde_json::to_string(rule).unwrap()),
            "missing CEL rule {rule}"
        );
    }
    let yaml = manifest();
    assert!(yaml.contains("message: tenants.max must be at least 1"));
    assert!(yaml.contains("shortNames:\n    - rly"));
    assert!(yaml.contains("subresources:\n      status: {}"));
}

fn merge(base: &mut Value, patch: &Value) {
    match (base, patch) {
        (Value::Object(b), Value::Object(p)) => {
            for (k, v) in p {
                merge(b.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
        (b, p) => *b = p.clone(),
    }
}
