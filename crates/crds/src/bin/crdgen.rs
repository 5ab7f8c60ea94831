//! Writes the `Relay` CRD to `crates/crds/manifests/relay.yaml` and the chart's CRD template.
//!
//! `cargo run -p ankusa-crds --bin crdgen` from the workspace root; `--check` only
//! compares and exits non-zero on drift.

use std::path::Path;
use std::process::ExitCode;

use ankusa_crds::manifest::{chart_template, manifest, CHART_TEMPLATE_PATH, MANIFEST_PATH};

fn main() -> ExitCode {
    let check = std::env::args().any(|a| a == "--check");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut drift = false;
    for (path, text) in [
        (MANIFEST_PATH, manifest()),
        (CHART_TEMPLATE_PATH, chart_template()),
    ] {
        let file = root.join(path);
        let current = std::fs::read_to_string(&file).unwrap_or_default();
        if current == text {
            continue;
        }
        if check {
            eprintln!("{path} differs from the generated CRD; run `cargo run -p ankusa-crds --bin crdgen`");
            drift = true;
        } else if let Err(e) = std::fs::write(&file, text) {
            eprintln!("cannot write {path}: {e}");
            return ExitCode::FAILURE;
        } else {
            println!("wrote {path}");
        }
    }
    if drift {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
