//! The node's logs: JSON lines (`log.format: json`), and the spans that follow a hook from
//! its request through the writer's batch to its delivery attempt (`log.spans`).

use std::time::{Duration, Instant};

use serde_json::Value;

use crate::support::*;

/// POSTs one JSON hook of tenant `acme` to source `in` on `ingest`; its id.
fn post_hook(ingest: u16) -> String {
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
    serde_json::from_str::<Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_owned()
}

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
        .source_yaml(
            "{ id: in, tenant: { header: x-tenant }, verify: { scheme: none }, route: r }",
        );
    let (admin, ingest) = (spec.admin_port().unwrap(), spec.ingest_port().unwrap());
    let node = Proc::start(dir.path(), &spec);
    let id = post_hook(ingest);
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
    // The spans close after their answers: the delivery's after its outcome is read. A
    // graceful stop then ends the node (and sends what its exporter holds).
    std::thread::sleep(Duration::from_millis(300));
    let mut node = node;
    assert!(node.stop(Duration::from_secs(30)).success());
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
    // `config check` says so too, before any node is started with it.
    for args in [vec!["run", "--config"], vec!["config", "check"]] {
        let mut args = args.clone();
        args.push(cfg.to_str().unwrap());
        let out = run(&args);
        assert!(!out.status.success(), "{args:?}");
        assert!(
            text(&out.stderr).contains("log.filter"),
            "{args:?}: {}",
            text(&out.stderr)
        );
    }
}

/// The spans reach a real OpenTelemetry Collector (built from its Go modules) over OTLP:
/// the hook's request and its attempt in one trace, the trace id its hook id gives on every
/// node, and the writer's batch linked to the request it acked.
#[test]
fn spans_reach_an_opentelemetry_collector_in_the_hooks_trace() {
    let root = crate::support::repo();
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/otelcol.sh"))
        .output()
        .expect("run scripts/otelcol.sh");
    assert!(out.status.success(), "{}", text(&out.stderr));
    let collector_bin = text(&out.stdout).trim().to_owned();
    let dir = tempfile::tempdir().unwrap();
    let port = ankusa_relay::testkit::free_port();
    let config = dir.path().join("otelcol.yaml");
    std::fs::write(
        &config,
        format!(
            "receivers: {{ otlp: {{ protocols: {{ http: {{ endpoint: \"127.0.0.1:{port}\" }} }} }} }}\n\
             exporters: {{ debug: {{ verbosity: detailed }} }}\n\
             service:\n  telemetry: {{ metrics: {{ level: none }} }}\n  \
             pipelines: {{ traces: {{ receivers: [otlp], exporters: [debug] }} }}\n"
        ),
    )
    .unwrap();
    let collector_log = dir.path().join("otelcol.log");
    let mut collector = Collector(
        std::process::Command::new(&collector_bin)
            .args(["--config", config.to_str().unwrap()])
            .stdout(std::fs::File::create(&collector_log).unwrap())
            .stderr(std::fs::File::create(dir.path().join("otelcol.err")).unwrap())
            .spawn()
            .expect("start the collector"),
    );
    let ready = || {
        std::fs::read_to_string(dir.path().join("otelcol.err"))
            .unwrap_or_default()
            .contains("Everything is ready")
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready() {
        assert!(Instant::now() < deadline, "the collector did not start");
        assert!(
            collector.0.try_wait().unwrap().is_none(),
            "the collector exited"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    // Spans exported, not written: the node's log has none of them.
    let (id, lines) = one_hook(&format!(
        "log: {{ otlp_endpoint: \"http://127.0.0.1:{port}\", service_name: relay-under-test }}"
    ));
    assert!(!lines.iter().any(|l| l.contains("ankusa::trace")));

    // The exporter sends every 5 s, and the node sent what it held when it stopped.
    let everything = || {
        let t = std::fs::read_to_string(dir.path().join("otelcol.err")).unwrap_or_default()
            + &std::fs::read_to_string(&collector_log).unwrap_or_default();
        t
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    let spans = loop {
        let spans = parse_debug_spans(&everything());
        let named = |n: &str| spans.iter().any(|s| s.name == n);
        if named("ingest") && named("delivery") && named("writer.batch") && named("admin") {
            break spans;
        }
        assert!(
            Instant::now() < deadline,
            "the collector never received the spans:\n{}",
            everything()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(everything().contains("relay-under-test"), "service.name");
    let trace = hex_trace_of(&id);
    let ingest = spans
        .iter()
        .find(|s| s.name == "ingest" && s.attr("hook_id") == Some(id.as_str()))
        .expect("the request's span");
    assert_eq!(ingest.trace_id, trace, "the request is in its hook's trace");
    assert_eq!(ingest.attr("tenant"), Some("acme"));
    let attempt = spans
        .iter()
        .find(|s| s.name == "delivery" && s.attr("hook_id") == Some(id.as_str()))
        .expect("the attempt's span");
    assert_eq!(
        attempt.trace_id, trace,
        "the attempt is in its hook's trace"
    );
    assert_eq!(attempt.attr("outcome"), Some("delivered"));
    let batch = spans
        .iter()
        .find(|s| s.name == "writer.batch" && s.links.contains(&ingest.span_id))
        .unwrap_or_else(|| {
            panic!(
                "no writer.batch span linked to the request {}: {spans:#?}\n{}",
                ingest.span_id,
                everything()
            )
        });
    assert!(batch.attr("hooks").is_some());
}

/// The hex trace id the node derives from hook `id` (`telemetry::hook_context`).
fn hex_trace_of(id: &str) -> String {
    use opentelemetry::trace::TraceContextExt;
    let cx = ankusa_relay::telemetry::hook_context(id);
    cx.span().span_context().trace_id().to_string()
}

/// A child process killed when dropped.
struct Collector(std::process::Child);

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// One span as the collector's debug exporter prints it (`verbosity: detailed`).
#[derive(Debug, Default)]
struct DebugSpan {
    name: String,
    trace_id: String,
    span_id: String,
    attrs: Vec<(String, String)>,
    /// The span ids of its links.
    links: Vec<String>,
}

impl DebugSpan {
    fn attr(&self, k: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(a, _)| a == k)
            .map(|(_, v)| v.as_str())
    }
}

/// Every span in the debug exporter's output: `Span #n`, then `Trace ID : …`, `ID : …`,
/// `Name : …`, `Attributes:` with ` -> key: Str(value)` lines, and `Links:` with
/// `SpanLink #n` and ` -> Trace ID: …`, ` -> ID: …` lines.
fn parse_debug_spans(out: &str) -> Vec<DebugSpan> {
    let mut spans: Vec<DebugSpan> = Vec::new();
    let mut in_links = false;
    for line in out.lines() {
        let l = line.trim();
        if l.starts_with("Span #") {
            spans.push(DebugSpan::default());
            in_links = false;
            continue;
        }
        let Some(s) = spans.last_mut() else { continue };
        // A link's fields are written as ` -> Trace ID: …`, ` -> ID: …`.
        let l = if in_links {
            l.strip_prefix("-> ").unwrap_or(l)
        } else {
            l
        };
        let field = |name: &str| {
            l.strip_prefix(name)
                .and_then(|r| r.trim_start().strip_prefix(':'))
                .map(|v| v.trim().to_owned())
        };
        if l.starts_with("Links:") || l.starts_with("SpanLink #") {
            in_links = true;
        } else if l.starts_with("Attributes:") {
            in_links = false;
        } else if let Some(v) = field("Trace ID") {
            if !in_links {
                s.trace_id = v;
            }
        } else if let Some(v) = field("ID") {
            if in_links {
                s.links.push(v);
            } else {
                s.span_id = v;
            }
        } else if let Some(v) = field("Name") {
            s.name = v;
        } else if let Some(kv) = l.strip_prefix("-> ") {
            if let Some((k, v)) = kv.split_once(": ") {
                let v = v
                    .trim_start_matches(|c: char| c.is_ascii_alphabetic())
                    .trim_start_matches('(')
                    .trim_end_matches(')');
                s.attrs.push((k.to_owned(), v.to_owned()));
            }
        }
    }
    spans
}

/// Verification failures are logged with their source, the tenant the request names and
/// their reason — never the secret or the expected signature — at most five a second.
#[test]
fn verification_failures_are_logged_with_their_reason_within_a_budget() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "a-source-secret-never-logged";
    let spec = proc_node()
        .section("log: { format: json }")
        .sink("s", "http://127.0.0.1:9/s")
        .route("r", &["s"])
        .source_yaml(&format!(
            "{{ id: gh, tenant: {{ header: x-tenant }}, verify: {{ scheme: github, secret: {{ value: {secret} }} }}, tenant_binding: shared-secret, route: r }}"
        ));
    let ingest = spec.ingest_port().unwrap();
    let mut node = Proc::start(dir.path(), &spec);
    let body = r#"{"n":1}"#;
    let expected = ankusa_verify::hex(&ankusa_verify::hmac_sha256(
        secret.as_bytes(),
        &[body.as_bytes()],
    ));
    // The node's budget is per wall-clock second: count the seconds the requests span
    // (a run of 0.3 s can cross from one into the next).
    let first_s = now_s();
    for i in 0..40 {
        let sig = if i % 2 == 0 {
            vec!["x-hub-signature-256: sha256=00ff".to_owned()]
        } else {
            vec![]
        };
        let headers = [sig, vec!["x-tenant: acme".to_owned()]].concat();
        let (status, answer) = http_raw(
            ingest,
            "POST",
            "/ingest/gh",
            &headers,
            body,
            Duration::from_secs(10),
        )
        .unwrap();
        assert_eq!(status, 401, "{answer}");
    }
    let seconds = now_s() - first_s + 1;
    // The count of those left out is said when their second ends, not with the next
    // failure: no more requests come, and it is in the log.
    std::thread::sleep(Duration::from_millis(1_500));
    assert!(node.stop(Duration::from_secs(30)).success());
    let text = std::fs::read_to_string(dir.path().join("relay.log")).unwrap();
    assert!(
        !text.contains(secret) && !text.contains(&expected),
        "the log holds the secret or the expected signature:\n{text}"
    );
    let failures: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["reason"].is_string())
        .collect();
    assert!(!failures.is_empty(), "no failure logged:\n{text}");
    assert!(
        failures.len() as u64 <= 5 * seconds,
        "{} lines in {seconds} s",
        failures.len()
    );
    let first = &failures[0]["fields"];
    assert_eq!(first["source"], "gh");
    assert_eq!(first["tenant"], "acme");
    assert_eq!(first["reason"], "bad_signature");
    assert_eq!(failures[0]["level"], "WARN");
    assert!(failures
        .iter()
        .any(|v| v["fields"]["reason"] == "missing_header"));
    // Each of the 40 is a line of its own or in a `left_out` count, once.
    let said: u64 = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| v["fields"]["left_out"].as_u64())
        .sum();
    assert_eq!(failures.len() as u64 + said, 40, "{text}");
    // Some second held more than its five (on a loaded machine the 40 can spread over
    // eight seconds or more, and then none is left out): its count was said.
    if 40 > 5 * seconds {
        assert!(
            text.contains("more requests failed verification"),
            "the count left out was not said:\n{text}"
        );
    }
}

/// A failed delivery is in the node's log once its outcome is committed: INFO with its
/// next attempt while it will be tried again, WARN once it is dead-lettered.
#[test]
fn failed_deliveries_are_logged_with_their_sink_attempt_and_fate() {
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on the discard port: every attempt is a connection error.
    let spec = proc_node()
        .section("log: { format: json }")
        .section("retry: { schedule_ms: [50], max_attempts: 2, jitter: none }")
        .sink("down", "http://127.0.0.1:9/hooks")
        .route("r", &["down"])
        .source_yaml(
            "{ id: in, tenant: { header: x-tenant }, verify: { scheme: none }, route: r }",
        );
    let (admin, ingest) = (spec.admin_port().unwrap(), spec.ingest_port().unwrap());
    let mut node = Proc::start(dir.path(), &spec);
    let id = post_hook(ingest);
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, dlq) = http_get_admin(admin, "/v1/dlq").unwrap();
        if dlq.contains(&id) {
            break;
        }
        assert!(Instant::now() < deadline, "never dead-lettered: {dlq}");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(node.stop(Duration::from_secs(30)).success());
    let text = std::fs::read_to_string(dir.path().join("relay.log")).unwrap();
    let failed: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["hook"] == id.as_str())
        .collect();
    assert_eq!(failed.len(), 2, "{text}");
    let (retry, dead) = (&failed[0], &failed[1]);
    assert_eq!(retry["level"], "INFO");
    assert_eq!(retry["fields"]["attempt"], 1);
    assert_eq!(retry["fields"]["sink"], "down");
    assert_eq!(retry["fields"]["tenant"], "acme");
    assert_eq!(retry["fields"]["class"], "connection");
    assert!(
        retry["fields"]["retry_in_ms"].as_u64().unwrap() <= 50,
        "{retry}"
    );
    assert_eq!(dead["level"], "WARN");
    assert_eq!(dead["fields"]["attempt"], 2);
    assert!(dead["fields"]["message"]
        .as_str()
        .unwrap()
        .contains("dead-lettered"));
}
