//! The `ankusa-operator` binary's subcommands.

use std::process::Command;

#[test]
fn crd_subcommand_prints_the_generated_crd() {
    let out = Command::new(env!("CARGO_BIN_EXE_ankusa-operator"))
        .arg("crd")
        .output()
        .unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    assert_eq!(printed, ankusa_crds::manifest::crd_yaml());
    let crd: serde_json::Value = serde_yaml::from_str(&printed).unwrap();
    assert_eq!(crd["metadata"]["name"], "relays.ankusa.dev");
}

#[test]
fn run_without_a_cluster_fails_with_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_ankusa-operator"))
        .args([
            "run",
            "--metrics-addr",
            "127.0.0.1:0",
            "--leader-election",
            "false",
        ])
        .env_remove("KUBECONFIG")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("HOME", env!("CARGO_TARGET_TMPDIR"))
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("connecting to the Kubernetes API"), "{err}");
}

/// docs/operator.md's table of `run`'s flags is the binary's: every flag with its
/// variable and default, none the binary does not take, and each with help text.
#[test]
fn operator_md_lists_every_flag_of_run() {
    let out = Command::new(env!("CARGO_BIN_EXE_ankusa-operator"))
        .args(["run", "--help"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    // clap's long help: "      --flag <VALUE>" and, on the next line, "What it is [env:
    // VAR=] [default: D]".
    let mut flags = std::collections::BTreeMap::new();
    let lines: Vec<&str> = help.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let Some(rest) = line.trim_start().strip_prefix("--") else {
            continue;
        };
        let flag = rest.split([' ', '=']).next().unwrap();
        if flag == "help" {
            continue;
        }
        let what = lines.get(i + 1).map_or("", |l| l.trim());
        assert!(
            !what.is_empty() && !what.starts_with("[env:") && !what.starts_with('-'),
            "--{flag} has no help text: {what}"
        );
        let env = what
            .split("[env: ")
            .nth(1)
            .and_then(|e| e.split('=').next())
            .unwrap_or_default()
            .to_owned();
        flags.insert(format!("--{flag}"), env);
    }
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/operator.md"),
    )
    .unwrap();
    let mut documented = std::collections::BTreeMap::new();
    for line in doc.lines().filter(|l| l.starts_with("| `--")) {
        let cells: Vec<&str> = line.split('|').map(str::trim).collect();
        documented.insert(
            cells[1].trim_matches('`').to_owned(),
            cells[2].trim_matches('`').to_owned(),
        );
    }
    assert!(flags.len() >= 14, "{help}");
    assert_eq!(documented, flags, "docs/operator.md against `run --help`");
}
