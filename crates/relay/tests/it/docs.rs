//! The reference pages say what the code does: every configuration key the code reads is
//! in `docs/configuration.md` and every key there is one the code reads; every metric the
//! node exports is in `docs/observability.md` and every metric there is exported;
//! `docs/operator.md` names every field of the Relay resource and of its status.

use std::collections::BTreeSet;

use ankusa_config::Config;

fn doc(name: &str) -> String {
    std::fs::read_to_string(crate::support::repo().join("docs").join(name)).unwrap()
}

/// The first column of every table row of `text` that is a backquoted name.
fn first_column(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`'))
        .map(|(name, _)| name.to_owned())
        .collect()
}

/// Dotted paths to the leaves of `v`: `a.b`, `list[].field`; an empty object or list is a
/// leaf.
fn leaves(prefix: &str, v: &serde_json::Value, out: &mut BTreeSet<String>) {
    match v {
        serde_json::Value::Object(m) if !m.is_empty() => {
            for (k, v) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                leaves(&p, v, out);
            }
        }
        serde_json::Value::Array(a) if a.first().is_some_and(|x| x.is_object()) => {
            leaves(&format!("{prefix}[]"), &a[0], out);
        }
        _ => {
            out.insert(prefix.to_owned());
        }
    }
}

#[test]
fn configuration_md_lists_every_key_the_code_reads_and_no_other() {
    // One of everything, every optional field set.
    let pem = rcgen::generate_simple_self_signed(vec!["ca".to_owned()])
        .unwrap()
        .cert
        .pem();
    let pem = serde_json::to_string(&pem).unwrap();
    let yaml = r#"
admin:
  tokens: [{ name: ops, secret: { value: "0123456789abcdef0123" }, scope: admin }]
sinks:
  - { id: s, url: "http://127.0.0.1:9/", secret: { value: "whsec_c2luaw==" }, timeout_ms: 5,
      headers: {}, dead_letter_on_4xx: true, max_inflight: 4, breaker_failures: 3, breaker_cooldown_ms: 10,
      ca_bundle: { pem: PEM } }
dispatch: { ca_bundle: { pem: PEM } }
store: { memory_bytes: 67108864 }
routes: [{ id: r, sinks: [s] }]
sources:
  - { id: a, tenant: { header: x-t }, verify: { scheme: none }, idempotency: { headers: [x-i] },
      route: r, body_limit_bytes: 1024, forward_headers: [x-f] }
"#
    .replace("PEM", &pem);
    let c = Config::from_yaml(&yaml, Vec::new()).unwrap();
    let mut code = BTreeSet::new();
    leaves("", &serde_json::to_value(&c).unwrap(), &mut code);
    let documented = first_column(&doc("configuration.md"));
    // A key is documented when it, or the object it belongs to (a tenant source, a verify
    // scheme, a token's scope), has a row.
    let covered = |k: &str| {
        let mut p = k.to_owned();
        loop {
            if documented.contains(&p) {
                return true;
            }
            match p.rfind('.') {
                Some(i) => p.truncate(i),
                None => return false,
            }
        }
    };
    let missing: Vec<&String> = code.iter().filter(|k| !covered(k)).collect();
    assert!(
        missing.is_empty(),
        "keys the code reads, not in configuration.md: {missing:?}"
    );
    let config_rows: BTreeSet<&String> = documented
        .iter()
        .filter(|d| {
            !d.contains(' ')
                && !d.starts_with("ankusa")
                && d.chars().next().is_some_and(|c| c.is_ascii_lowercase())
        })
        .collect();
    let stale: Vec<&&String> = config_rows
        .iter()
        .filter(|d| {
            let d = d.as_str();
            !code
                .iter()
                .any(|k| k == d || k.starts_with(&format!("{d}.")))
                && ![
                    "none",
                    "hmac-sha256",
                    "standard-webhooks",
                    "github",
                    "stripe",
                ]
                .contains(&d)
        })
        .collect();
    assert!(
        stale.is_empty(),
        "rows of configuration.md the code does not read: {stale:?}"
    );
    assert!(code.len() > 50, "{code:?}");
}

#[test]
fn observability_md_lists_every_metric_the_node_exports_and_no_other() {
    let exposition = ankusa_relay::metrics::Metrics::new().encode_prometheus();
    let mut exported = BTreeSet::new();
    for line in exposition.lines() {
        let mut it = line.split_whitespace();
        if let (Some("#"), Some("TYPE"), Some(name), Some(kind)) =
            (it.next(), it.next(), it.next(), it.next())
        {
            exported.insert(if kind == "counter" {
                format!("{}_total", name.trim_end_matches("_total"))
            } else {
                name.to_owned()
            });
        }
    }
    let documented: BTreeSet<String> = first_column(&doc("observability.md"))
        .into_iter()
        .filter(|n| n.starts_with("ankusa_"))
        // `ankusa_sink_limit{sink}`: the name before its labels.
        .map(|n| n.split('{').next().unwrap().to_owned())
        .collect();
    let undocumented: Vec<&String> = exported.difference(&documented).collect();
    let stale: Vec<&String> = documented.difference(&exported).collect();
    assert!(
        undocumented.is_empty(),
        "exported, not in observability.md: {undocumented:?}"
    );
    assert!(
        stale.is_empty(),
        "in observability.md, not exported: {stale:?}"
    );
    assert!(exported.len() > 25);
}

/// Every YAML example of `docs/providers.md` is a source `config check` accepts.
/// The ingest `outcome` label's values, as observability.md lists them, are the code's.
#[test]
fn observability_md_lists_every_ingest_outcome_and_no_other() {
    let text = doc("observability.md");
    let row = text
        .lines()
        .find(|l| l.starts_with("| `ankusa_ingest_requests_total{source, outcome}`"))
        .expect("the ingest requests row");
    // The values, without the remarks in parentheses.
    let mut values = String::new();
    let mut depth = 0;
    for ch in row.split("∈").nth(1).expect("the outcome list").chars() {
        match ch {
            '(' => depth += 1,
            ')' => depth -= 1,
            c if depth == 0 => values.push(c),
            _ => {}
        }
    }
    let listed = values
        .split(',')
        .map(|v| {
            v.split_whitespace()
                .next()
                .unwrap_or("")
                .trim_end_matches('|')
                .to_owned()
        })
        .collect::<BTreeSet<_>>();
    let code = ankusa_relay::ingest::Outcome::ALL
        .iter()
        .map(|o| o.label().to_owned())
        .collect::<BTreeSet<_>>();
    assert_eq!(listed, code, "{row}");
}

#[test]
fn the_provider_examples_pass_config_check() {
    let text = doc("providers.md");
    let mut sources = String::from("sources:\n");
    let mut blocks = 0;
    for block in text.split("```yaml\n").skip(1) {
        let block = block.split("```").next().unwrap();
        blocks += 1;
        for line in block.lines().filter(|l| *l != "sources:") {
            sources.push_str(line);
            sources.push('\n');
        }
    }
    assert!(blocks >= 5, "{blocks} examples");
    let yaml = format!(
        "data_dir: ./never-opened\nsinks: [{{ id: internal, url: \"http://127.0.0.1:9/\" }}]\nroutes: [{{ id: to-internal, sinks: [internal] }}]\n{sources}"
    );
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("providers.yaml");
    std::fs::write(&file, &yaml).unwrap();
    let out = crate::support::bin()
        .current_dir(dir.path())
        .args(["config", "check"])
        .arg(&file)
        .envs([
            ("GITHUB_WEBHOOK_SECRET", "g"),
            ("STRIPE_WEBHOOK_SECRET", "s"),
            ("SHOPIFY_WEBHOOK_SECRET", "h"),
            ("ACME_WHSEC", "whsec_c2VjcmV0"),
            ("PARTNER_SECRET", "p"),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{yaml}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains(&format!("ok ({blocks} sources")));
}

/// `docs/operator.md` says what the Relay resource is: every top-level `spec` field of the
/// CRD is in its example, and its status table lists exactly the CRD's status fields.
#[test]
fn operator_md_names_every_relay_field_and_status_field_of_the_crd() {
    let crd: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(crate::support::repo().join("crates/crds/manifests/relay.yaml"))
            .unwrap(),
    )
    .unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    let fields = |part: &str| -> BTreeSet<String> {
        schema[part]["properties"]
            .as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect()
    };
    let md = doc("operator.md");
    // The example's `spec:` block: its keys two spaces in.
    let example = md
        .split("\nspec:\n")
        .nth(1)
        .unwrap()
        .split("```")
        .next()
        .unwrap();
    let in_example: BTreeSet<String> = example
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| !l.starts_with(' ') && !l.starts_with('#'))
        .filter_map(|l| l.split_once(':').map(|(k, _)| k.trim().to_owned()))
        .collect();
    assert_eq!(
        in_example,
        fields("spec"),
        "the Relay example's spec fields"
    );
    let status = md
        .split("\n## Status\n")
        .nth(1)
        .unwrap()
        .split("\n## ")
        .next()
        .unwrap();
    let table: BTreeSet<String> = first_column(
        status
            .split("\n\n")
            .find(|t| t.contains("| `observedGeneration`"))
            .unwrap(),
    )
    .into_iter()
    .map(|f| f.trim_end_matches("[]").to_owned())
    .collect();
    assert_eq!(table, fields("status"), "operator.md's status table");
}
