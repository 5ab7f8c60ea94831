//! The node's logs: JSON lines (`log.format: json`), and the spans that follow a hook from
//! its request through the writer's batch to its delivery attempt (`log.spans`).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// A node process delivering source `in` to a local sink, with `log` as its log section;
/// it posts one hook (tenant `acme`), waits for its delivery, makes one admin call and
/// returns the hook's id and the log's lines.
fn one_hook(log: &str) -> (String, Vec<String>) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let sink = rt.block_on(ankusa_relay::testkit::TestSink::start());
    let dir = tempfile::tempdir().unwrap();
    let spec = proc_node()
        .section(log)
        .sink("s", &sink.url("/s"))
        .route("r", &["s"])
        .source_yaml("{ id: in, tenant: { header: x-tenant }, verify: { scheme: none }, route: r }");
    let (admin, ingest) = (spec.admin_port().unwrap(), spec.ingest_port().unwrap());
    let node = Proc::start(dir.path(), &spec);
    let (status, body) = http_raw(
        ingest,
        "POST",
        "/ingest/in",
        &[
            "x-tenant: acme".to_owned(),
            "content-type: application/json".to_owned(),
        ],
        r#"{"n":1}"#,
        Duration::from_secs(10),
    )
    .unwrap();
    assert_eq!(status, 202, "{body}");
    let id = serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(20);
    while sink.on("/s").is_empty() {
        assert!(
            Instant::now() < deadline,
            "never delivered:\n{}",
            log_tail(dir.path(), 40)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (status, _) = http_get_admin(admin, "/v1/tenants/acme").unwrap();
    assert_eq!(status, 200);
    // The spans close after their answers: the delivery's after its outcome is read.
    std::thread::sleep(Duration::from_millis(300));
    drop(node);
    let text = std::fs::read_to_string(dir.path().join("relay.log")).unwrap();
    (id, text.lines().map(str::to_owned).collect())
}

/// The closing line of the first span named `name` that `matches`.
fn closed<'a>(spans: &'a [Value], name: &str, matches: impl Fn(&Value) -> bool) -> &'a Value {
    spans
        .iter()
        .find(|l| l["span"]["name"] == name && matches(&l["span"]))
        .unwrap_or_else(|| panic!("no closed {name} span that matches, in:\n{spans:#?}"))
}

#[test]
fn json_logs_follow_a_hook_from_its_request_through_its_batch_to_its_attempt() {
    let (id, lines) = one_hook("log: { format: json, spans: true }");
    // Every line the node wrote is one JSON object (the CLI's own banner is on stdout,
    // the same file here: it is the one line that is not).
    let parsed: Vec<Value> = lines
        .iter()
        .filter(|l| !l.starts_with("ankusa-relay: store"))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(parsed
        .iter()
        .any(|l| l["fields"]["message"] == "relay node ready"));
    let spans: Vec<Value> = parsed
        .into_iter()
        .filter(|l| l["target"] == "ankusa::trace" && l["fields"]["message"] == "close")
        .collect();

    let ingest = closed(&spans, "ingest", |s| s["hook_id"] == id.as_str());
    assert_eq!(ingest["span"]["source"], "in");
    assert_eq!(ingest["span"]["tenant"], "acme");
    assert_eq!(ingest["span"]["outcome"], "accepted");
    assert_eq!(ingest["span"]["status"], 202);
    assert!(ingest["fields"]["time.busy"].is_string(), "{ingest}");
    let batch = ingest["span"]["batch"]
        .as_u64()
        .expect("the request names its batch");

    let written = closed(&spans, "writer.batch", |s| s["batch"] == batch);
    assert!(written["span"]["hooks"].as_u64().unwrap() >= 1, "{written}");

    let attempt = closed(&spans, "delivery", |s| s["hook_id"] == id.as_str());
    assert_eq!(attempt["span"]["tenant"], "acme");
    assert_eq!(attempt["span"]["sink"], "s");
    assert_eq!(attempt["span"]["attempt"], 1);
    assert_eq!(attempt["span"]["status"], 200);
    assert_eq!(attempt["span"]["outcome"], "delivered");

    let call = closed(&spans, "admin", |s| s["path"] == "/v1/tenants/acme");
    assert_eq!(call["span"]["method"], "GET");
    assert_eq!(call["span"]["status"], 200);
}

#[test]
fn without_log_spans_the_text_log_has_no_span_lines() {
    let (id, lines) = one_hook("log: { format: text }");
    assert!(lines.iter().any(|l| l.contains("relay node ready")));
    assert!(
        !lines
            .iter()
            .any(|l| l.contains(&id) || l.contains("ankusa::trace")),
        "a span was written with log.spans off:\n{}",
        lines.join("\n")
    );
    assert!(
        !lines.iter().any(|l| l.trim_start().starts_with('{')),
        "log.format text wrote JSON"
    );
}

#[test]
fn a_bad_log_filter_is_the_commands_error() {
    let dir = tempfile::tempdir().unwrap();
    let spec = proc_node().section("log: { filter: \"info,=[\" }");
    let cfg = dir.path().join("relay.yaml");
    std::fs::write(&cfg, spec.yaml_at(dir.path())).unwrap();
    let out = run(&["run", "--config", cfg.to_str().unwrap()]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("log.filter"),
        "{}",
        text(&out.stderr)
    );
}
