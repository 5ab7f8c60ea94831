//! The API's contract (issue 18): the OpenAPI document the code generates is the one in
//! `docs/`, it names every route the two routers serve and nothing else, `docs/api.md`
//! documents exactly its operations, and `schemathesis` (PyPI; `make test` installs it)
//! drives a live node with every operation and finds no server error and no answer that
//! the schema does not describe.

use std::collections::BTreeSet;
use std::path::Path;

use ankusa_queue::counters;

use ankusa_relay::testkit::{eventually, TestNode, TestSink};

use crate::support::*;

const ADMIN: &str = "contract-admin-token-0123";
const CONSUMER: &str = "contract-consumer-token-0123";

fn repo(path: &str) -> std::path::PathBuf {
    crate::support::repo().join(path)
}

/// (METHOD, path) of every operation of the document.
fn operations(doc: &serde_json::Value) -> BTreeSet<(String, String)> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(p, ops)| {
            ops.as_object()
                .unwrap()
                .keys()
                .map(move |m| (m.to_uppercase(), p.clone()))
        })
        .collect()
}

fn generated() -> serde_json::Value {
    serde_json::from_str(&ankusa_relay::openapi::json()).unwrap()
}

#[test]
fn the_committed_openapi_document_is_the_one_the_code_generates() {
    let committed = std::fs::read_to_string(repo("docs/openapi.json")).unwrap();
    assert!(
        committed == ankusa_relay::openapi::json(),
        "docs/openapi.json is stale: run `cargo run -p ankusa-relay -- openapi > docs/openapi.json`"
    );
    let doc = generated();
    assert_eq!(doc["openapi"], "3.1.0");
    // Every operation says what its errors look like.
    for (m, p) in operations(&doc) {
        let responses = doc["paths"][&p][m.to_lowercase()]["responses"]
            .as_object()
            .unwrap();
        assert!(!responses.is_empty(), "{m} {p}");
    }
}

/// (METHOD, path) of every `.route(…)` in a router's source: the path, and the method
/// routers (`get(`, `post(`, `delete(`, …) before the next builder call; and of every
/// route the admin API declares with where it is answered (`.at(M::GET, "/v1/…", …)`).
fn routes_in(file: &str) -> BTreeSet<(String, String)> {
    let src = std::fs::read_to_string(repo(file)).unwrap();
    let mut out = BTreeSet::new();
    for chunk in src.split(".route(").skip(1) {
        let Some(path) = chunk
            .trim_start()
            .strip_prefix('"')
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        let end = [
            ".route_layer(",
            ".with_state(",
            ".fallback(",
            ".merge(",
            ".layer(",
        ]
        .iter()
        .filter_map(|m| chunk.find(m))
        .min()
        .unwrap_or(chunk.len());
        let body = &chunk[..end];
        for method in ["get", "post", "put", "delete", "patch"] {
            let called = body.match_indices(&format!("{method}(")).any(|(i, _)| {
                i == 0
                    || !body.as_bytes()[i - 1].is_ascii_alphanumeric()
                        && body.as_bytes()[i - 1] != b'_'
            });
            if called {
                out.insert((method.to_uppercase(), path.to_owned()));
            }
        }
    }
    // And every `.at(M::METHOD, "path", …)` of the admin API's declared routes
    // (`admin::routing::V1`).
    for chunk in src.split(".at(").skip(1) {
        let Some((method, rest)) = chunk
            .trim_start()
            .strip_prefix("M::")
            .and_then(|c| c.split_once(','))
        else {
            continue;
        };
        let Some(path) = rest
            .trim_start()
            .strip_prefix('"')
            .and_then(|r| r.split('"').next())
        else {
            continue;
        };
        out.insert((method.trim().to_owned(), path.to_owned()));
    }
    out
}

#[test]
fn the_document_names_every_route_the_routers_serve_and_api_md_documents_each() {
    let doc = operations(&generated());
    let mut served = routes_in("crates/relay/src/admin/mod.rs");
    served.extend(routes_in("crates/relay/src/ingest/mod.rs"));
    served.extend(routes_in("crates/relay/src/pull/http.rs"));
    // The document's own route, which the node mounts on the admin router.
    served.extend(routes_in("crates/relay/src/openapi.rs"));
    assert!(served.len() > 20, "{served:?}");
    let missing: Vec<_> = served.difference(&doc).collect();
    let extra: Vec<_> = doc.difference(&served).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "routes missing from the document: {missing:?}; operations no router serves: {extra:?}"
    );
    // docs/api.md: every "`METHOD /path…`" it mentions is an operation, and every operation
    // is mentioned (a query string after the path is allowed).
    let api = std::fs::read_to_string(repo("docs/api.md")).unwrap();
    let mut documented = BTreeSet::new();
    for chunk in api.split('`').skip(1).step_by(2) {
        let Some((method, rest)) = chunk.split_once(' ') else {
            continue;
        };
        if !["GET", "POST", "PUT", "DELETE", "PATCH"].contains(&method) || !rest.starts_with('/') {
            continue;
        }
        let path = rest.split(['?', ' ']).next().unwrap();
        documented.insert((method.to_owned(), path.to_owned()));
    }
    let undocumented: Vec<_> = doc.difference(&documented).collect();
    let unknown: Vec<_> = documented.difference(&doc).collect();
    assert!(
        undocumented.is_empty() && unknown.is_empty(),
        "operations docs/api.md does not document: {undocumented:?}; endpoints it documents that do not exist: {unknown:?}"
    );
}

async fn start_node(sink: &TestSink) -> TestNode {
    TestNode::builder()
        .admin_token("ops", ADMIN)
        .admin_key("backup_dir: {dir}/backups")
        .admin_key("backup_keep: 2")
        .section("dispatch: { tick_interval_ms: 20 }")
        .section("archive: { settle_interval_ms: 50 }")
        .sink("s", &sink.url("/hooks"))
        .sink_yaml("{ id: q, kind: pull }")
        .section(&format!(
            r#"pull: {{ consumers: [{{ name: c, secret: {{ value: "{CONSUMER}" }}, sinks: [q] }}] }}"#
        ))
        .route_yaml("{ id: r, sinks: [s, q], archive: { enabled: true } }")
        .open_source("shared", "r")
        .source_yaml("{ id: fixed, tenant: { fixed: acme }, verify: { scheme: none }, route: r }")
        .start()
        .await
}

/// Runs schemathesis on `docs/openapi.json` against `url` for the operations `tag_args`
/// select; its output on failure.
fn schemathesis(dir: &Path, url: &str, token: &str, tag_args: &[&str]) -> Result<(), String> {
    let mut args = vec![
        "--config-file".to_owned(),
        dir.join("schemathesis.toml").display().to_string(),
        "run".to_owned(),
        repo("docs/openapi.json").display().to_string(),
        "--url".to_owned(),
        url.to_owned(),
        "-H".to_owned(),
        format!("Authorization: Bearer {token}"),
        "--checks".to_owned(),
        "not_a_server_error,response_schema_conformance".to_owned(),
        "--max-examples".to_owned(),
        "25".to_owned(),
        "--seed".to_owned(),
        "1".to_owned(),
    ];
    args.extend(tag_args.iter().map(|s| s.to_string()));
    let out = std::process::Command::new("python3")
        .args(["-m", "schemathesis.cli"])
        .args(&args)
        .current_dir(dir)
        .output()
        .expect("python3");
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{}{}", text(&out.stdout), text(&out.stderr)))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_no_answer_off_the_schema() {
    let found = std::process::Command::new("python3")
        .args(["-c", "import schemathesis"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        found,
        "schemathesis is not installed: `make test` installs it (scripts/install-deps.sh)"
    );
    let sink = TestSink::start().await;
    // Every hook dead-letters: the DLQ, the hook log and the archive have something to show.
    sink.default_status
        .store(400, std::sync::atomic::Ordering::Relaxed);
    let node = start_node(&sink).await;
    let c = client();
    let mut hook = String::new();
    for i in 0..5 {
        let r = post(
            &c,
            &format!("http://{}/ingest/shared", node.ingest_addr),
            &[("x-tenant", "acme".to_owned())],
            format!(r#"{{"n":{i}}}"#),
        )
        .await;
        assert_eq!(r.status, 202);
        hook = r.json()["id"].as_str().unwrap().to_owned();
    }
    let store = node.store.clone();
    eventually(15, "five dead rows, archived", || {
        let c = counters::node(&store).unwrap();
        c.dead == 5 && c.archive_pending == 0
    })
    .await;
    // Values that reach the handlers' real work, not only their 404s.
    std::fs::write(
        node.dir().join("schemathesis.toml"),
        format!(
            r#"[parameters]
"path.t" = "acme"
"path.source" = "shared"
"path.sink" = "q"
"query.tenant" = "acme"

[[operations]]
include-path = "/v1/hooks/{{id}}"
parameters = {{ "path.id" = "{hook}" }}

[[operations]]
include-path = "/v1/sources/{{id}}"
parameters = {{ "path.id" = "shared" }}
"#
        ),
    )
    .unwrap();
    let admin = format!("http://{}", node.admin_addr);
    let ingest = format!("http://{}", node.ingest_addr);
    let d = node.dir().to_owned();
    let results = tokio::task::spawn_blocking(move || {
        [
            (
                "admin",
                schemathesis(
                    &d,
                    &admin,
                    ADMIN,
                    &["--exclude-tag", "ingest", "--exclude-tag", "pull"],
                ),
            ),
            (
                "ingest",
                schemathesis(&d, &ingest, ADMIN, &["--include-tag", "ingest"]),
            ),
            (
                "pull",
                schemathesis(&d, &ingest, CONSUMER, &["--include-tag", "pull"]),
            ),
        ]
    })
    .await
    .unwrap();
    for (which, r) in results {
        if let Err(out) = r {
            panic!("schemathesis against the {which} listener:\n{out}");
        }
    }
    node.stop().await;
}
