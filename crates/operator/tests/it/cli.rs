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
