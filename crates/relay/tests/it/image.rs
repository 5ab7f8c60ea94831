//! The image `make image` builds (`scripts/image.py`): reproducible, named as the chart and
//! the example use it, non-root with the binary as entrypoint, and complete — the binary
//! runs with nothing but the image's own files.

use std::path::Path;
use std::process::Command;

use crate::support::{repo, text};

/// Builds the relay's image from this test's binary into `out`; answers the digest printed.
fn build(out: &Path, epoch: &str) -> String {
    let o = Command::new("python3")
        .arg(repo().join("scripts/image.py"))
        .args(["--binary", env!("CARGO_BIN_EXE_ankusa-relay")])
        .args(["--ref", "ghcr.io/ankusa/relay:0.1.0-it"])
        .arg("--out")
        .arg(out)
        .env("SOURCE_DATE_EPOCH", epoch)
        .output()
        .expect("run scripts/image.py");
    assert!(o.status.success(), "image.py: {}", text(&o.stderr));
    let digest = text(&o.stdout).trim().to_owned();
    assert!(
        digest.starts_with("sha256:") && digest.len() == 71,
        "{digest}"
    );
    digest
}

/// One JSON blob of the OCI layout in `archive` (a tar), by digest.
fn blob(archive: &Path, digest: &str) -> Vec<u8> {
    let name = format!("blobs/sha256/{}", digest.trim_start_matches("sha256:"));
    let mut a = tar::Archive::new(std::fs::File::open(archive).unwrap());
    for e in a.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_str() == Some(name.as_str()) {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut v).unwrap();
            return v;
        }
    }
    panic!("{name} is not in {}", archive.display());
}

#[test]
fn the_same_inputs_give_the_same_image_digest() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b, c) = (
        dir.path().join("a.oci.tar"),
        dir.path().join("b.oci.tar"),
        dir.path().join("c.oci.tar"),
    );
    let first = build(&a, "0");
    assert_eq!(build(&b, "0"), first, "two builds of the same inputs");
    assert_eq!(
        std::fs::read(&a).unwrap(),
        std::fs::read(&b).unwrap(),
        "the archives themselves are byte for byte the same"
    );
    assert_ne!(
        build(&c, "1700000000"),
        first,
        "SOURCE_DATE_EPOCH is an input"
    );

    // skopeo reads it as the registry tools will, and finds the entrypoint and the user.
    let o = Command::new("skopeo")
        .arg("inspect")
        .arg("--config")
        .arg(format!("oci-archive:{}", a.display()))
        .output()
        .expect("run skopeo (scripts/install-deps.sh installs it)");
    assert!(o.status.success(), "skopeo: {}", text(&o.stderr));
    let config: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(config["config"]["User"], "10001:10001");
    assert_eq!(
        config["config"]["Entrypoint"],
        serde_json::json!(["/usr/local/bin/ankusa-relay"])
    );
    assert_eq!(config["created"], "1970-01-01T00:00:00Z");
    let packages = config["config"]["Labels"]["dev.ankusa.base-packages"]
        .as_str()
        .unwrap();
    for p in ["libc6", "ca-certificates"] {
        assert!(packages.split(' ').any(|x| x == p), "{packages}");
    }

    // The index names the image for containerd's import and for skopeo.
    let mut index = None;
    let mut ar = tar::Archive::new(std::fs::File::open(&a).unwrap());
    for e in ar.entries().unwrap() {
        let mut e = e.unwrap();
        if e.path().unwrap().to_str() == Some("index.json") {
            let mut v = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut v).unwrap();
            index = Some(serde_json::from_slice::<serde_json::Value>(&v).unwrap());
        }
    }
    let index = index.expect("index.json");
    let m = &index["manifests"][0];
    assert_eq!(m["digest"], first.as_str());
    assert_eq!(
        m["annotations"]["io.containerd.image.name"],
        "ghcr.io/ankusa/relay:0.1.0-it"
    );
    assert_eq!(
        m["annotations"]["org.opencontainers.image.ref.name"],
        "0.1.0-it"
    );
    let manifest: serde_json::Value = serde_json::from_slice(&blob(&a, &first)).unwrap();
    assert_eq!(manifest["layers"].as_array().unwrap().len(), 2);
}

/// The layers unpacked into a directory, and the binary run there with `chroot`: it loads
/// only the image's libraries, and reads the image's certificate bundle.
#[test]
fn the_binary_runs_with_only_the_images_files() {
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("relay.oci.tar");
    let digest = build(&archive, "0");
    let manifest: serde_json::Value = serde_json::from_slice(&blob(&archive, &digest)).unwrap();
    let root = dir.path().join("rootfs");
    std::fs::create_dir(&root).unwrap();
    for layer in manifest["layers"].as_array().unwrap() {
        let gz = dir.path().join("layer.tar.gz");
        std::fs::write(&gz, blob(&archive, layer["digest"].as_str().unwrap())).unwrap();
        let o = Command::new("tar")
            .arg("-xzf")
            .arg(&gz)
            .arg("-C")
            .arg(&root)
            .output()
            .expect("run tar");
        assert!(o.status.success(), "tar: {}", text(&o.stderr));
    }
    assert!(
        root.join("etc/ssl/certs/ca-certificates.crt")
            .metadata()
            .unwrap()
            .len()
            > 100_000
    );
    assert!(std::fs::read_to_string(root.join("etc/passwd"))
        .unwrap()
        .contains(":10001:10001:"));
    let o = Command::new("/usr/sbin/chroot")
        .arg(&root)
        .args(["/usr/local/bin/ankusa-relay", "version", "--json"])
        .env_clear()
        .output()
        .expect("run chroot");
    assert!(
        o.status.success(),
        "the binary did not run in the image's files alone: {}{}",
        text(&o.stdout),
        text(&o.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["store_format"], 3, "{v}");
}
