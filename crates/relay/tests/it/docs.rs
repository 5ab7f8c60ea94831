//! The reference pages say what the code does: every configuration key the code reads is
//! in `docs/configuration.md` and every key there is one the code reads; every metric the
//! node exports is in `docs/observability.md` and every metric there is exported;
//! `docs/operator.md` names every field of the Relay resource and of its status.

use std::collections::BTreeSet;

use ankusa_config::Config;

/// The Relay CRD as generated (`crates/crds/manifests/relay.yaml`).
fn crd() -> serde_yaml::Value {
    let path = crate::support::repo().join("crates/crds/manifests/relay.yaml");
    serde_yaml::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

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
            for x in a {
                leaves(&format!("{prefix}[]"), x, out);
            }
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
  console: { portal_secret: { value: "0123456789abcdef0123456789abcdef" } }
sinks:
  - { id: s, url: "http://127.0.0.1:9/", secret: { value: "whsec_c2luaw==" }, timeout_ms: 5,
      headers: {}, dead_letter_on_4xx: true, max_inflight: 4, breaker_failures: 3, breaker_cooldown_ms: 10,
      ca_bundle: { pem: PEM } }
  - { id: q, kind: pull, lease_ms: 5000, max_inflight: 10 }
  - { id: n, kind: nats, url: "nats://127.0.0.1:4222", nats: { subject: "h.{tenant}", user: u, password: { value: p } } }
  - { id: n2, kind: nats, url: "tls://127.0.0.1:4222", nats: { subject: "h", creds: { value: c } } }
  - { id: n3, kind: nats, url: "nats://127.0.0.1:4222", nats: { subject: "h", token: { value: t } } }
  - { id: k, kind: kafka, url: "kafka://127.0.0.1:9092", kafka: { topic: "h.{tenant}", max_batch: 10,
      sasl: { mechanism: PLAIN, username: u, password: { value: p } } } }
pull:
  tenant_max_leases: 5
  consumers: [{ name: c, secret: { value: "0123456789abcdef0123" }, sinks: [q], tenants: [t], max_leases: 5 }]
dispatch: { ca_bundle: { pem: PEM } }
store: { memory_bytes: 67108864 }
tenants: { limits: { ingest_per_second: 10, ingest_burst: 20, queued_bytes: 1048576, archive_bytes: 1048576 } }
routes: [{ id: r, sinks: [s], endpoints: true, filters: { s: { event: "invoice.*" } } }]
sources:
  - { id: a, tenant: { header: x-t }, verify: { scheme: none }, idempotency: { headers: [x-i] },
      route: r, body_limit_bytes: 1024, forward_headers: [x-f], event_type: { header: x-e } }
  - { id: b, tenant: path, verify: { scheme: github }, tenant_secrets: { map: { t: { value: k } } }, route: r }
  - { id: c, tenant: { header: x-t }, verify: { scheme: github, secret: { value: k } }, tenant_binding: shared-secret, route: r }
backup:
  object_store: { url: "s3://bucket/prefix", endpoint: "https://s3.example", ca_file: /etc/ca.pem }
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
    // The paragraph on overrides names every top-level key and no other.
    let md = doc("configuration.md");
    let listed = md
        .split("its first segment names a top-level key (")
        .nth(1)
        .and_then(|t| t.split(");").next())
        .unwrap();
    let listed: BTreeSet<String> = listed
        .split(',')
        .map(|k| k.trim().trim_matches('`').to_owned())
        .collect();
    let top: BTreeSet<String> = match serde_json::to_value(Config::default()).unwrap() {
        serde_json::Value::Object(m) => m.keys().cloned().collect(),
        _ => unreachable!(),
    };
    assert_eq!(listed, top, "configuration.md's list of top-level keys");
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
    // The per-tenant recipe's directory, as a mounted Secret would give it.
    let keys = dir.path().join("partner-keys");
    std::fs::create_dir(&keys).unwrap();
    std::fs::write(keys.join("acme"), "acme-secret").unwrap();
    let yaml = yaml.replace("/etc/ankusa-secrets/partner-keys", keys.to_str().unwrap());
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
    let crd = crd();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"];
    // The names of an object schema's properties.
    let keys = |object: &serde_yaml::Value| -> BTreeSet<String> {
        object["properties"]
            .as_mapping()
            .unwrap()
            .keys()
            .map(|k| k.as_str().unwrap().to_owned())
            .collect()
    };
    let fields = |part: &str| keys(&schema[part]);
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
    // Each nested status field's own table: one row per field (a row may name several).
    for (field, intro) in [
        ("nodes", "`nodes[]` holds"),
        ("tenants", "`tenants`:"),
        ("topTenants", "`topTenants[]`, summed"),
        ("upgrade", "`upgrade`:"),
        ("restore", "`restore` (the cursor"),
    ] {
        let after = status
            .split(intro)
            .nth(1)
            .unwrap_or_else(|| panic!("operator.md has no table of status.{field}"));
        let rows = after
            .split("\n\n")
            .find(|t| t.starts_with("| field |"))
            .unwrap();
        let named: BTreeSet<String> = rows
            .lines()
            .filter_map(|l| l.strip_prefix("| "))
            .filter_map(|l| l.split_once(" |").map(|(cell, _)| cell.to_owned()))
            .flat_map(|cell| {
                cell.split(", ")
                    .filter_map(|n| n.strip_prefix('`')?.strip_suffix('`').map(str::to_owned))
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut sub = &schema["status"]["properties"][field];
        if sub["type"] == "array" {
            sub = &sub["items"];
        }
        assert_eq!(named, keys(sub), "operator.md's table of status.{field}");
    }
}

/// The Markdown pages of the repository: README.md and docs/*.md, by path.
fn pages() -> Vec<(std::path::PathBuf, String)> {
    let root = crate::support::repo();
    let mut out = vec![root.join("README.md")];
    for e in std::fs::read_dir(root.join("docs")).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "md") {
            out.push(p);
        }
    }
    out.into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            (p, text)
        })
        .collect()
}

/// GitHub's anchor of a heading: lower case, code marks and punctuation dropped, spaces as
/// hyphens; a link's text in place of the link.
fn slug(heading: &str) -> String {
    let mut text = String::new();
    let mut rest = heading;
    while let Some(open) = rest.find('[') {
        let Some(mid) = rest[open..].find("](") else {
            break;
        };
        let Some(close) = rest[open + mid..].find(')') else {
            break;
        };
        text.push_str(&rest[..open]);
        text.push_str(&rest[open + 1..open + mid]);
        rest = &rest[open + mid + close + 1..];
    }
    text.push_str(rest);
    text.to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of a page's headings (outside fenced code).
fn anchors(text: &str) -> BTreeSet<String> {
    let mut fenced = false;
    let mut out = BTreeSet::new();
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        } else if !fenced && line.starts_with('#') {
            out.insert(slug(line.trim_start_matches('#').trim()));
        }
    }
    out
}

/// Every link to a section — `other.md#anchor` or `#anchor` — in README.md and docs/*.md
/// names a heading its page has.
#[test]
fn every_link_to_a_section_names_a_heading_that_exists() {
    let pages = pages();
    let mut broken = Vec::new();
    let mut checked = 0;
    for (path, text) in &pages {
        for part in text.split("](").skip(1) {
            let Some(target) = part.split(')').next() else {
                continue;
            };
            let Some((file, anchor)) = target.split_once('#') else {
                continue;
            };
            if file.contains("://") || !(file.is_empty() || file.ends_with(".md")) {
                continue;
            }
            let page = if file.is_empty() {
                path.clone()
            } else {
                path.parent().unwrap().join(file)
            };
            let Ok(page_text) = std::fs::read_to_string(&page) else {
                broken.push(format!("{}: {target} (no such page)", path.display()));
                continue;
            };
            checked += 1;
            if !anchors(&page_text).contains(anchor) {
                broken.push(format!("{}: {target}", path.display()));
            }
        }
    }
    assert!(checked > 20, "only {checked} links to sections found");
    assert!(
        broken.is_empty(),
        "links to no heading:\n{}",
        broken.join("\n")
    );
}

/// Every `.rs` file under `dir`, recursively.
fn sources(dir: &std::path::Path, out: &mut Vec<(std::path::PathBuf, String)>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            let text = std::fs::read_to_string(&p).unwrap();
            out.push((p, text));
        }
    }
}

/// The stable code each `error(StatusCode::…, "code", …)` of `text` answers, in order.
fn error_codes(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (at, _) in text.match_indices("ErrorCode::") {
        let name: String = text[at + "ErrorCode::".len()..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric())
            .collect();
        let code = ankusa_api::error::ErrorCode::ALL
            .iter()
            .find(|c| format!("{c:?}") == name);
        if let Some(code) = code {
            out.push((at, code.as_str().to_owned()));
        }
    }
    out
}

/// api.md gives every error code ingest answers, and each code that carries a
/// `Retry-After` the value the code sends (`with_retry_after(r, N)` after the code).
#[test]
fn api_md_gives_each_error_code_and_the_retry_after_the_code_sends() {
    let mut files = Vec::new();
    sources(&crate::support::repo().join("crates/relay/src"), &mut files);
    let mut retry: std::collections::BTreeMap<String, BTreeSet<u64>> = Default::default();
    for (_, text) in &files {
        let codes = error_codes(text);
        for (at, _) in text.match_indices("with_retry_after(") {
            if text[..at].trim_end().ends_with("fn") {
                continue;
            }
            let args = text[at..].split(')').next().unwrap();
            // A computed value (a rate limit's refill time) has no one value to give.
            let Ok(n) = args.rsplit(',').next().unwrap().trim().parse::<u64>() else {
                continue;
            };
            // The code answered just before it, within the same few lines.
            let code = codes.iter().rev().find(|(c, _)| *c < at && at - *c < 400);
            let (_, code) = code.unwrap_or_else(|| panic!("no code before {}", &text[at..at + 40]));
            retry.entry(code.clone()).or_default().insert(n);
        }
    }
    assert!(retry.len() >= 4, "{retry:?}");
    let api = doc("api.md");
    let rows: Vec<&str> = api.lines().filter(|l| l.starts_with('|')).collect();
    for (code, values) in &retry {
        // Rows that answer the code (the first column is the outcome, which may share
        // its name).
        let answers = |r: &&&str| {
            r.split('|')
                .skip(2)
                .any(|cell| cell.contains(&format!("`{code}`")))
        };
        let with: Vec<&&str> = rows.iter().filter(answers).collect();
        assert!(!with.is_empty(), "api.md has no row for `{code}`");
        for row in with.iter().filter(|r| r.contains("Retry-After")) {
            for n in values {
                assert!(
                    row.contains(&format!("Retry-After: {n}")),
                    "`{code}` sends Retry-After: {n}; api.md says:\n{row}"
                );
            }
        }
    }
    let ingest = &files
        .iter()
        .find(|(p, _)| p.ends_with("ingest/mod.rs"))
        .unwrap()
        .1;
    for (_, code) in error_codes(ingest) {
        assert!(
            api.contains(&format!("`{code}`")),
            "api.md never names `{code}`"
        );
    }
    // And every code a node answers, wherever it answers it.
    for code in ankusa_api::error::ErrorCode::ALL {
        assert!(
            api.contains(&format!("`{code}`")),
            "api.md never names `{code}`, a code of ankusa_api::error::ErrorCode"
        );
    }
}

/// What `kubectl get relays` shows, in README.md and operator.md, is the CRD's printer
/// columns: the default ones in order, and those `-o wide` adds.
#[test]
fn the_printer_columns_the_docs_show_are_the_crds() {
    let root = crate::support::repo();
    let crd = crd();
    let columns = crd["spec"]["versions"][0]["additionalPrinterColumns"]
        .as_sequence()
        .unwrap();
    let named = |wide: bool| -> Vec<String> {
        columns
            .iter()
            .filter(|c| (c["priority"].as_u64().unwrap_or(0) > 0) == wide)
            .map(|c| c["name"].as_str().unwrap().to_owned())
            .collect()
    };
    let (plain, wide) = (named(false), named(true));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let comment = readme
        .lines()
        .find(|l| l.starts_with("kubectl get relays "))
        .and_then(|l| l.split_once('#'))
        .unwrap()
        .1
        .trim();
    let (shown, adds) = comment.split_once(" (-o wide adds ").unwrap();
    assert_eq!(
        shown.split(", ").collect::<Vec<_>>(),
        plain,
        "README: {comment}"
    );
    assert_eq!(
        adds.trim_end_matches(')').split(", ").collect::<Vec<_>>(),
        wide,
        "README: {comment}"
    );
    // Every sample of operator.md is the plain table or the wide one (every column, in
    // the CRD's order).
    let op = doc("operator.md");
    let upper = |cols: Vec<String>| -> Vec<String> {
        std::iter::once("NAME".to_owned())
            .chain(cols.iter().map(|c| c.to_uppercase()))
            .collect()
    };
    let all: Vec<String> = columns
        .iter()
        .map(|c| c["name"].as_str().unwrap().to_owned())
        .collect();
    let (want_plain, want_wide) = (upper(plain.clone()), upper(all));
    let headers: Vec<Vec<String>> = op
        .lines()
        .filter(|l| l.starts_with("NAME ") && l.contains("READY"))
        .map(|l| l.split_whitespace().map(str::to_owned).collect())
        .collect();
    assert!(
        headers.contains(&want_plain),
        "no plain sample: {headers:?}"
    );
    assert!(
        headers.contains(&want_wide),
        "no -o wide sample: {headers:?}"
    );
    for h in &headers {
        assert!(
            *h == want_plain || *h == want_wide,
            "a sample that is neither `kubectl get relays` nor its -o wide: {h:?}"
        );
    }
    for c in &wide {
        assert!(
            op.contains(&format!("`{c}`")),
            "operator.md never names the {c} column"
        );
    }
}

/// README.md and testing.md say what `make test` runs — every prerequisite of its target
/// and every e2e script — and testing.md lists every bench `make bench` runs, which are
/// the relay's benches.
#[test]
fn the_docs_say_what_make_test_and_make_bench_run() {
    let root = crate::support::repo();
    let makefile = std::fs::read_to_string(root.join("Makefile")).unwrap();
    let recipe = |target: &str| -> Vec<String> {
        makefile
            .split(&format!("\n{target}:"))
            .nth(1)
            .unwrap()
            .split("\n\n")
            .next()
            .unwrap()
            .lines()
            .map(str::to_owned)
            .collect()
    };
    let test = recipe("test");
    // Its prerequisites, and the targets its recipe makes (`$(MAKE) … fmt lint …`, and
    // nextest and e2e under the control plane); the installers are not steps a reader runs.
    let mut named: Vec<String> = test[0]
        .split_whitespace()
        .chain(test[1..].iter().flat_map(|l| {
            l.split("$(MAKE)")
                .skip(1)
                .flat_map(str::split_whitespace)
                .filter(|t| !t.starts_with('-'))
        }))
        .filter(|p| !p.starts_with("deps"))
        .map(str::to_owned)
        .collect();
    // The fuzz smoke runs in the background (its script starts and waits for it).
    if test
        .iter()
        .any(|l| l.contains("scripts/fuzz-smoke.sh start"))
        && test
            .iter()
            .any(|l| l.contains("scripts/fuzz-smoke.sh wait"))
    {
        named.push("fuzz-smoke".into());
    }
    for step in [
        "fmt",
        "lint",
        "check-layers",
        "fuzz-smoke",
        "nextest",
        "e2e",
    ] {
        assert!(
            named.iter().any(|n| n == step),
            "make test no longer makes {step}: {named:?}"
        );
    }
    named.extend(recipe("e2e").iter().filter_map(|l| {
        l.split("bash ")
            .nth(1)
            .map(|s| s.split_whitespace().next().unwrap().to_owned())
    }));
    assert!(
        named.iter().filter(|n| n.starts_with("e2e/")).count() >= 4,
        "{named:?}"
    );
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    for (page, text) in [("README.md", &readme), ("testing.md", &doc("testing.md"))] {
        let line = text.lines().find(|l| l.starts_with("make test ")).unwrap();
        for n in &named {
            assert!(
                line.contains(n.as_str()),
                "{page}'s `make test` line lacks {n}: {line}"
            );
        }
    }
    let benches: BTreeSet<String> = recipe("bench")
        .iter()
        .filter_map(|l| l.split("--bench ").nth(1).map(|b| b.trim().to_owned()))
        .collect();
    let cargo = std::fs::read_to_string(root.join("crates/relay/Cargo.toml")).unwrap();
    let declared: BTreeSet<String> = cargo
        .split("[[bench]]")
        .skip(1)
        .filter_map(|b| b.split("name = \"").nth(1))
        .map(|n| n.split('"').next().unwrap().to_owned())
        .collect();
    assert_eq!(benches, declared, "make bench and crates/relay/Cargo.toml");
    let testing = doc("testing.md");
    let listed: BTreeSet<String> = testing
        .lines()
        .filter_map(|l| l.strip_prefix("cargo bench -p ankusa-relay --bench "))
        .map(|b| b.trim().to_owned())
        .collect();
    assert_eq!(listed, declared, "testing.md's commands");
    let tabled: BTreeSet<String> = testing
        .split("| bench | measures | pass rule |")
        .nth(1)
        .unwrap()
        .split("\n\n")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("| "))
        .filter_map(|l| l.split(" |").next())
        .flat_map(|cell| cell.split(", ").map(|b| b.trim_matches('`').to_owned()))
        .filter(|b| !b.starts_with('-'))
        .collect();
    assert_eq!(tabled, declared, "testing.md's bench table");
}

/// The shell commands of a text: continuation lines joined, comments and indentation gone.
fn commands(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in text.lines() {
        let line = line.trim();
        let (line, more) = match line.strip_suffix('\\') {
            Some(l) => (l.trim_end(), true),
            None => (line, false),
        };
        let line = line.split("   #").next().unwrap().trim_end();
        if !cur.is_empty() {
            cur.push(' ');
        }
        cur.push_str(line);
        if !more {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            cur.clear();
        }
    }
    out
}

/// What the chart's NOTES.txt tells a person to run after `helm install` is what the
/// README's Kubernetes steps run after it, in the same order, the Secret and the backup
/// claim included.
#[test]
fn the_charts_notes_give_the_readmes_kubernetes_steps() {
    let root = crate::support::repo();
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let block = readme
        .split("## On Kubernetes")
        .nth(1)
        .and_then(|t| t.split("```sh\n").nth(1))
        .and_then(|t| t.split("```").next())
        .unwrap();
    let steps: Vec<String> = commands(block)
        .into_iter()
        .filter(|c| c.starts_with("kubectl "))
        .collect();
    assert!(steps.len() >= 5, "{steps:?}");
    let notes = std::fs::read_to_string(root.join("charts/ankusa/templates/NOTES.txt")).unwrap();
    let told: Vec<String> = commands(&notes)
        .into_iter()
        .filter(|c| c.starts_with("kubectl ") && !c.starts_with("kubectl port-forward"))
        .collect();
    assert_eq!(told, steps, "NOTES.txt against README.md");
    // And the example's comment says the same Secret.
    let example = std::fs::read_to_string(root.join("examples/relay.yaml")).unwrap();
    let commented: String = example
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .collect::<Vec<_>>()
        .join("\n");
    assert_eq!(commands(&commented), steps, "examples/relay.yaml's comment");
}

/// Every claim examples/relay.yaml names is created by a file the README's Kubernetes
/// steps apply before it.
#[test]
fn the_readmes_kubernetes_steps_create_every_claim_the_example_names() {
    let root = crate::support::repo();
    let relay = std::fs::read_to_string(root.join("examples/relay.yaml")).unwrap();
    let claims: BTreeSet<&str> = relay
        .lines()
        .filter_map(|l| l.trim().strip_prefix("claimName:"))
        .map(str::trim)
        .collect();
    assert!(!claims.is_empty());
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let applied: Vec<&str> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("kubectl apply -f "))
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let at = applied
        .iter()
        .position(|f| *f == "examples/relay.yaml")
        .unwrap();
    let mut created = BTreeSet::new();
    for file in &applied[..at] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let v = <serde_yaml::Value as serde::Deserialize>::deserialize(doc).unwrap();
            if v["kind"] == "PersistentVolumeClaim" {
                created.insert(v["metadata"]["name"].as_str().unwrap().to_owned());
            }
        }
    }
    for c in claims {
        assert!(created.contains(c), "the README never creates claim {c}");
    }
}

/// A documented range as numbers: `1 – 268 435 456`, `32 MiB – 1 TiB`, `> 0`, `≥ 1024`;
/// `None` for anything else (a path, a list, a choice).
fn range_of(cell: &str) -> Option<(u64, Option<u64>)> {
    let number = |s: &str| -> Option<u64> {
        let s = s.trim();
        let (digits, unit) = match s.split_once(' ') {
            Some((d, u)) if matches!(u, "KiB" | "MiB" | "GiB" | "TiB") => (d, u),
            _ => (s, ""),
        };
        let n: u64 = digits.replace(' ', "").parse().ok()?;
        let scale = match unit {
            "KiB" => 1 << 10,
            "MiB" => 1 << 20,
            "GiB" => 1 << 30,
            "TiB" => 1 << 40,
            _ => 1,
        };
        Some(n * scale)
    };
    let cell = cell.trim();
    if let Some(n) = cell.strip_prefix("> ") {
        return Some((number(n)? + 1, None));
    }
    if let Some(n) = cell.strip_prefix("≥ ") {
        return Some((number(n)?, None));
    }
    let (lo, hi) = cell.split_once(" – ")?;
    Some((number(lo)?, Some(number(hi)?)))
}

/// Every numeric bound configuration.md gives is one the node enforces: the value just
/// outside it is refused naming the key, the bound itself is taken.
#[test]
fn every_documented_numeric_bound_is_enforced() {
    let base = "data_dir: ./never-opened\n\
        sinks: [{ id: s, url: \"http://127.0.0.1:9/\" }, { id: p, kind: pull },\
          { id: k, kind: kafka, url: \"kafka://127.0.0.1:9\", kafka: { topic: t } }]\n\
        routes: [{ id: r, sinks: [s] }]\n\
        sources: [{ id: a, verify: { scheme: none }, route: r }]\n\
        backup: { object_store: { url: \"s3://bucket/prefix\" } }\n\
        pull: { consumers: [{ name: c, secret: { value: \"0123456789abcdef0123\" }, sinks: [p] }] }\n";
    let md = doc("configuration.md");
    let mut checked = Vec::new();
    for row in md.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = row.split(" | ").collect();
        let key = cells[0].trim_start_matches("| `").trim_end_matches('`');
        let Some((lo, hi)) = cells.get(2).and_then(|c| range_of(c)) else {
            continue;
        };
        // The variable that sets the key: a list's first entry (the base has one of each),
        // or for a pull sink's own key the base's second sink, its pull sink, and for a
        // Kafka sink's its third.
        let entry = if cells.get(3).is_some_and(|m| m.starts_with("A pull sink's")) {
            ".1"
        } else if key.starts_with("sinks[].kafka.") {
            ".2"
        } else {
            ".0"
        };
        let var = format!(
            "ANKUSA_{}",
            key.replace("[]", entry).replace('.', "__").to_uppercase()
        );
        let load = |v: u64| Config::from_yaml(base, [(var.clone(), v.to_string())]);
        let refused = |v: u64| match load(v) {
            Ok(_) => panic!("{key} = {v} is outside {lo}..={hi:?} but was taken"),
            Err(e) => {
                let shown = key.replace("[]", &format!("[{}]", &entry[1..]));
                assert!(e.to_string().contains(&shown), "{key} = {v}: {e}");
            }
        };
        if lo > 0 {
            refused(lo - 1);
        }
        if let Some(hi) = hi {
            if hi < u64::MAX {
                refused(hi + 1);
            }
        }
        // The bounds themselves are taken (the largest of a few only where taking it
        // costs nothing: a memory budget is a number until a store opens).
        load(lo).unwrap_or_else(|e| panic!("{key} = {lo} (its minimum): {e}"));
        if let Some(hi) = hi {
            load(hi).unwrap_or_else(|e| panic!("{key} = {hi} (its maximum): {e}"));
        }
        checked.push(key.to_owned());
    }
    assert!(
        checked.len() >= 40,
        "{} bounds checked: {checked:?}",
        checked.len()
    );
}

/// One command of `ankusa-relay`'s tree, read from its `--help`.
struct HelpNode {
    subcommands: BTreeSet<String>,
    /// Each long flag, and whether it takes a value.
    flags: std::collections::BTreeMap<String, bool>,
    /// Its usage ends in `<COMMAND>`: a word after it must be one of `subcommands`.
    needs_subcommand: bool,
    /// Options and arguments its help gives no text for.
    undescribed: Vec<String>,
}

fn help_node(path: &[String]) -> HelpNode {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ankusa-relay"))
        .args(path)
        .arg("--help")
        .output()
        .unwrap();
    assert!(out.status.success(), "ankusa-relay {path:?} --help");
    let help = String::from_utf8(out.stdout).unwrap();
    let mut node = HelpNode {
        subcommands: BTreeSet::new(),
        flags: Default::default(),
        needs_subcommand: help
            .lines()
            .find(|l| l.starts_with("Usage:"))
            .is_some_and(|u| u.trim_end().ends_with("<COMMAND>")),
        undescribed: Vec::new(),
    };
    let lines: Vec<&str> = help.lines().collect();
    let mut section = "";
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with(' ') {
            section = line.trim_end_matches(':');
            continue;
        }
        let t = line.trim_start();
        let entry = (section == "Options" && t.starts_with('-'))
            || (section == "Arguments" && (t.starts_with('<') || t.starts_with('[')));
        if entry && !t.starts_with("-h, --help") && !t.starts_with("-V, --version") {
            // "  --flag <X>  What it is", or the text on the next, deeper line.
            let spec_end = t.find("  ").unwrap_or(t.len());
            let same_line = !t[spec_end..].trim().is_empty();
            let indent = line.len() - t.len();
            let next_line = lines.get(i + 1).is_some_and(|n| {
                let nt = n.trim_start();
                n.len() - nt.len() > indent && !nt.is_empty() && !nt.starts_with('-')
            });
            let text = if same_line {
                t[spec_end..].trim()
            } else {
                lines.get(i + 1).map_or("", |n| n.trim())
            };
            if !(same_line || next_line)
                || text.starts_with("[env:")
                || text.starts_with("[default:")
            {
                node.undescribed.push(t[..spec_end].to_owned());
            }
        }
    }
    let mut in_commands = false;
    for line in help.lines() {
        if line.starts_with("Commands:") {
            in_commands = true;
            continue;
        }
        if line.trim().is_empty() || !line.starts_with(' ') {
            in_commands = false;
        }
        let t = line.trim_start();
        if in_commands && line.starts_with("  ") && !line.starts_with("      ") {
            let name = t.split_whitespace().next().unwrap().to_owned();
            if name != "help" {
                node.subcommands.insert(name);
            }
        } else if let Some(at) = t.find("--") {
            if t.starts_with('-') {
                let rest = &t[at + 2..];
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-')
                    .collect();
                let takes = rest[name.len()..].starts_with(" <");
                node.flags.insert(format!("--{name}"), takes);
            }
        }
    }
    node
}

/// The `ankusa-relay …` commands of the docs: each code block's lines (continuations
/// joined) and each inline code span that names one, as words; the admin CLI's table in
/// api.md, each row's command prefixed with `ankusa-relay admin`.
fn documented_commands() -> Vec<(String, Vec<String>)> {
    let root = crate::support::repo();
    let mut pages = vec![(
        root.join("README.md"),
        std::fs::read_to_string(root.join("README.md")).unwrap(),
    )];
    pages.extend(pages_under(&root.join("docs")));
    let mut found = Vec::new();
    let mut keep = |page: &str, text: &str| {
        // The binary, not the package of `cargo … -p ankusa-relay`.
        let Some(at) = text
            .match_indices("ankusa-relay ")
            .map(|(i, _)| i)
            .find(|&i| {
                let word = text[..i].rsplit([' ', '`']).next().unwrap_or("");
                !word.contains('=')
                    && !text[..i].ends_with("-p ")
                    && !text[..i].ends_with("package ")
            })
        else {
            return;
        };
        let rest = &text[at + "ankusa-relay ".len()..];
        let words: Vec<String> = rest
            .split_whitespace()
            .take_while(|w| !["#", "|", ">", "&&", ";", "2>&1", "\\"].contains(w))
            .map(|w| w.trim_end_matches([',', '.', ')', ':']).to_owned())
            .collect();
        found.push((format!("{page}: ankusa-relay {rest}"), words));
    };
    for (path, text) in &pages {
        let page = path.file_name().unwrap().to_string_lossy().into_owned();
        let mut in_block = false;
        for line in text.replace("\\\n", " ").lines() {
            if line.starts_with("```") {
                in_block = !in_block;
                continue;
            }
            if in_block {
                keep(&page, line);
            } else {
                for span in line.split('`').skip(1).step_by(2) {
                    if span.starts_with("ankusa-relay ") {
                        keep(&page, span);
                    }
                }
            }
        }
        if page == "api.md" {
            let table = text
                .split("| command | what it merges |")
                .nth(1)
                .unwrap()
                .split("\n\n")
                .next()
                .unwrap();
            for row in table.lines().skip(2) {
                for span in row
                    .split(" | ")
                    .next()
                    .unwrap()
                    .split('`')
                    .skip(1)
                    .step_by(2)
                {
                    keep(&page, &format!("ankusa-relay admin {span}"));
                }
            }
        }
    }
    found
}

fn pages_under(dir: &std::path::Path) -> Vec<(std::path::PathBuf, String)> {
    let mut out: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "md"))
        .map(|p| {
            let t = std::fs::read_to_string(&p).unwrap();
            (p, t)
        })
        .collect();
    out.sort();
    out
}

/// Every `ankusa-relay` subcommand and flag README.md and docs/ name exists, at the place
/// they name it: a misspelt flag or a command that moved fails here, not a reader.
#[test]
fn every_cli_subcommand_and_flag_the_docs_name_exists() {
    type Nodes = std::collections::BTreeMap<Vec<String>, HelpNode>;
    fn at<'a>(nodes: &'a mut Nodes, path: &[String]) -> &'a HelpNode {
        nodes
            .entry(path.to_vec())
            .or_insert_with(|| help_node(path))
    }
    let mut nodes = Nodes::default();
    let commands = documented_commands();
    assert!(commands.len() > 40, "{}", commands.len());
    let mut wrong = Vec::new();
    for (where_, words) in &commands {
        let mut path: Vec<String> = Vec::new();
        let mut flags: std::collections::BTreeMap<String, bool> =
            at(&mut nodes, &path).flags.clone();
        let mut i = 0;
        while i < words.len() {
            let w = words[i]
                .trim_start_matches('[')
                .trim_end_matches([']', '…']);
            let w = w.trim_end_matches("...");
            i += 1;
            if w.is_empty() {
                continue;
            }
            if let Some(flag) = w
                .strip_prefix("--")
                .map(|f| format!("--{}", f.split('=').next().unwrap()))
            {
                match flags.get(&flag) {
                    Some(true) if !w.contains('=') => i += 1,
                    Some(_) => {}
                    None => wrong.push(format!(
                        "{where_}\n  no flag {flag} on `{}`",
                        path.join(" ")
                    )),
                }
                continue;
            }
            let node = at(&mut nodes, &path);
            let (subcommands, needs_subcommand) = (node.subcommands.clone(), node.needs_subcommand);
            if w.contains('|') {
                // Alternatives: each one's first word is a subcommand here.
                for alt in w.split('|').filter(|a| !a.is_empty()) {
                    let first = alt.split_whitespace().next().unwrap();
                    if !subcommands.is_empty()
                        && first.chars().all(|c| c.is_ascii_lowercase() || c == '-')
                        && !subcommands.contains(first)
                    {
                        wrong.push(format!(
                            "{where_}\n  no subcommand {first} of `{}`",
                            path.join(" ")
                        ));
                    }
                }
                break;
            }
            if subcommands.contains(w) {
                path.push(w.to_owned());
                flags.extend(at(&mut nodes, &path).flags.clone());
            } else if needs_subcommand {
                wrong.push(format!(
                    "{where_}\n  no subcommand {w} of `{}`",
                    path.join(" ")
                ));
                break;
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Every option and argument of every `ankusa-relay` command has help text.
#[test]
fn every_cli_option_has_help_text() {
    let mut todo: Vec<Vec<String>> = vec![Vec::new()];
    let mut missing = Vec::new();
    let mut walked = 0;
    while let Some(path) = todo.pop() {
        let node = help_node(&path);
        walked += 1;
        for u in &node.undescribed {
            missing.push(format!("ankusa-relay {} {u}", path.join(" ")));
        }
        for sub in &node.subcommands {
            let mut p = path.clone();
            p.push(sub.clone());
            todo.push(p);
        }
    }
    assert!(walked > 25, "{walked}");
    assert!(missing.is_empty(), "no help text:\n{}", missing.join("\n"));
}
