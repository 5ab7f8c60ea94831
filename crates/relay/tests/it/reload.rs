//! Configuration reload: what a running node applies from a new file, all or nothing, and
//! what it refuses until a restart.

use std::time::{Duration, Instant};

use ankusa_relay::reload::{ReloadError, Reloaded};
use ankusa_relay::testkit::{NodeBuilder, TestNode, TestSink};

use crate::support::*;

const ADMIN: &str = "reload-admin-token-0123";
const NEW_ADMIN: &str = "reload-new-token-012345";

fn base(sink: &TestSink) -> NodeBuilder {
    TestNode::builder()
        .admin_token("ops", ADMIN)
        .section("dispatch: { tick_interval_ms: 10 }")
        .sink("one", &sink.url("/one"))
        .route("r1", &["one"])
        .open_source("a", "r1")
}

async fn delivered(sink: &TestSink, path: &str, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while sink.on(path).len() < n {
        assert!(
            Instant::now() < deadline,
            "{path} got {} of {n}",
            sink.on(path).len()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn node_json(c: &Client, node: &TestNode, token: &str) -> (u16, serde_json::Value) {
    let url = node.admin_url("/v1/node");
    let auth = format!("Bearer {token}");
    let (s, _, v) = raw(c, "GET", &url, &[("authorization", auth.as_str())], "").await;
    (s, v)
}

/// A reload adds a source, a sink, a route and a token at once; a change that needs a
/// restart, or a file that does not validate, is refused whole and says why, and the
/// running configuration keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_applies_sources_sinks_routes_and_tokens_or_nothing() {
    let sink = TestSink::start().await;
    let node = base(&sink).start().await;
    let c = client();
    let post = |source: &str| {
        let (c, url) = (c.clone(), node.ingest_url(source));
        async move {
            post(&c, &url, &[("x-tenant", "acme".to_owned())], b"{}".to_vec())
                .await
                .status
        }
    };
    assert_eq!(post("a").await, 202);
    assert_eq!(post("b").await, 404);
    let grown = base(&sink)
        .admin_token("new", NEW_ADMIN)
        .sink("two", &sink.url("/two"))
        .route("r2", &["two"])
        .open_source("b", "r2");
    let r = node.reloader.reload(&grown.yaml_at(node.dir()), Vec::new());
    assert_eq!(
        r.unwrap(),
        Reloaded::Applied {
            changed: vec!["sources", "sinks", "routes", "admin.tokens"]
        }
    );
    assert_eq!(post("b").await, 202);
    assert_eq!(post("a").await, 202);
    delivered(&sink, "/two", 1).await;
    delivered(&sink, "/one", 2).await;
    let (s, v) = node_json(&c, &node, NEW_ADMIN).await;
    assert_eq!(s, 200, "the new token is taken: {v}");
    assert_eq!(v["config"]["reloads"], 1, "{v}");
    assert!(v["config"]["refused"].is_null(), "{v}");
    // The same file again changes nothing.
    let again = node.reloader.reload(&grown.yaml_at(node.dir()), Vec::new());
    assert_eq!(again.unwrap(), Reloaded::Unchanged);

    // A key that needs a restart: refused, named; nothing of the file applies.
    let restart = grown
        .clone()
        .open_source("c", "r2")
        .section("retry: { max_attempts: 3 }");
    let e = node
        .reloader
        .reload(&restart.yaml_at(node.dir()), Vec::new())
        .unwrap_err();
    assert!(
        matches!(&e, ReloadError::NeedsRestart(k) if k == &["retry.max_attempts"]),
        "{e}"
    );
    assert_eq!(post("c").await, 404, "a refused reload applied a source");
    let (_, v) = node_json(&c, &node, ADMIN).await;
    let refused = v["config"]["refused"]["message"].as_str().unwrap();
    assert!(
        refused.contains("need a restart") && refused.contains("retry.max_attempts"),
        "{v}"
    );
    // A file that does not validate: refused with the key and its line.
    let broken = grown
        .clone()
        .sink_yaml("{ id: three, url: \"http://127.0.0.1:9/\", timeout_ms: 5s }");
    let e = node
        .reloader
        .reload(&broken.yaml_at(node.dir()), Vec::new())
        .unwrap_err();
    assert!(
        e.to_string().contains("sinks[2].timeout_ms") && e.to_string().contains("(line "),
        "{e}"
    );
    let m = get_text(&c, &node.admin_url("/metrics")).await.1;
    for series in [
        r#"ankusa_config_reloads_total{outcome="applied"} 1"#,
        r#"ankusa_config_reloads_total{outcome="unchanged"} 1"#,
        r#"ankusa_config_reloads_total{outcome="refused"} 2"#,
        "ankusa_config_reload_refused 1",
    ] {
        assert!(m.contains(series), "{series}:\n{m}");
    }
    // What ran before the refusals still runs; a good file clears the refusal.
    assert_eq!(post("b").await, 202);
    node.reloader
        .reload(&grown.yaml_at(node.dir()), Vec::new())
        .unwrap();
    let (_, v) = node_json(&c, &node, ADMIN).await;
    assert!(v["config"]["refused"].is_null(), "{v}");
    node.stop().await;
}

/// `tenants.max` reloads: raised, a tenant refused before is taken; lowered below the
/// tenants held, every one of them is still served and a new one is refused — all in one
/// running node, and its gauge follows.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tenants_max_reloads_up_and_down_without_refusing_a_held_tenant() {
    let sink = TestSink::start().await;
    let spec = |max: u32| base(&sink).section(&format!("tenants: {{ max: {max} }}"));
    let node = spec(1).start().await;
    let c = client();
    let post = |tenant: &str| {
        let (c, url) = (c.clone(), node.ingest_url("a"));
        let tenant = tenant.to_owned();
        async move {
            post(&c, &url, &[("x-tenant", tenant)], b"{}".to_vec())
                .await
                .status
        }
    };
    let gauge = || async {
        let m = get_text(&c, &node.admin_url("/metrics")).await.1;
        ankusa_relay::testkit::metric(&m, "ankusa_tenants_max")
    };
    assert_eq!(post("t1").await, 202);
    assert_eq!(post("t2").await, 503, "past tenants.max = 1");
    let r = node
        .reloader
        .reload(&spec(2).yaml_at(node.dir()), Vec::new());
    assert_eq!(
        r.unwrap(),
        Reloaded::Applied {
            changed: vec!["tenants.max"]
        }
    );
    assert_eq!(gauge().await, Some(2.0));
    assert_eq!(
        post("t2").await,
        202,
        "raised: the tenant refused before is taken"
    );
    assert_eq!(post("t3").await, 503, "past tenants.max = 2");
    node.reloader
        .reload(&spec(1).yaml_at(node.dir()), Vec::new())
        .unwrap();
    assert_eq!(gauge().await, Some(1.0));
    for held in ["t1", "t2"] {
        assert_eq!(post(held).await, 202, "{held} is held: never refused");
    }
    assert_eq!(post("t3").await, 503, "lowered: no new tenant");
    delivered(&sink, "/one", 4).await;
    node.stop().await;
}

/// `run` reloads its file when it changes, and on SIGHUP — which never ends the process.
#[test]
fn run_reloads_its_file_when_it_changes_and_on_sighup() {
    let dir = tempfile::tempdir().unwrap();
    let spec = proc_node()
        .sink("s", "http://127.0.0.1:9/s")
        .route("r", &["s"])
        .open_source("a", "r");
    let (admin, ingest) = (spec.admin_port().unwrap(), spec.ingest_port().unwrap());
    let mut node = Proc::start(dir.path(), &spec);
    let send = |source: &str| {
        http_raw(
            ingest,
            "POST",
            &format!("/ingest/{source}"),
            &["x-tenant: acme".to_owned()],
            "{}",
            Duration::from_secs(10),
        )
        .unwrap()
        .0
    };
    assert_eq!(send("b"), 404);
    let grown = spec.clone().open_source("b", "r");
    std::fs::write(dir.path().join("relay.yaml"), grown.yaml_at(dir.path())).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while send("b") != 202 {
        assert!(
            Instant::now() < deadline,
            "the changed file was never applied:\n{}",
            log_tail(dir.path(), 20)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let reloads = |outcome: &str| -> u64 {
        let (_, m) = http_get(admin, "/metrics").unwrap();
        let series = format!("ankusa_config_reloads_total{{outcome=\"{outcome}\"}} ");
        m.lines()
            .find_map(|l| l.strip_prefix(series.as_str()))
            .map_or(0, |n| n.trim().parse().unwrap())
    };
    assert_eq!(reloads("applied"), 1);
    // SIGHUP with the file as it is: a reload that finds nothing to change.
    node.signal(libc::SIGHUP);
    let deadline = Instant::now() + Duration::from_secs(10);
    while reloads("unchanged") < 1 {
        assert!(
            Instant::now() < deadline,
            "SIGHUP reloaded nothing:\n{}",
            log_tail(dir.path(), 20)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(send("b"), 202, "the node serves on after SIGHUP");
    let log = std::fs::read_to_string(dir.path().join("relay.log")).unwrap();
    assert!(
        log.contains("the file changed") && log.contains("SIGHUP"),
        "{log}"
    );
    assert!(node.stop(Duration::from_secs(30)).success());
}

/// A source's secret rotated in its file verifies with the new secret after a reload of the
/// same configuration text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_reads_a_rotated_secret_again() {
    let sink = TestSink::start().await;
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("source.secret");
    std::fs::write(&secret, "first-secret").unwrap();
    let spec = TestNode::builder()
        .admin_token("ops", ADMIN)
        .sink("one", &sink.url("/one"))
        .route("r1", &["one"])
        .source_yaml(&format!(
            "{{ id: signed, tenant: {{ fixed: acme }}, verify: {{ scheme: hmac-sha256, secret: {{ file: {} }}, header: x-sig }}, route: r1 }}",
            secret.display()
        ));
    let node = spec.clone().start().await;
    let c = client();
    let body = b"{}".to_vec();
    let signed = |key: &str| {
        let sig = ankusa_verify::hex(&ankusa_verify::hmac_sha256(key.as_bytes(), &[b"{}"]));
        let (c, url, body) = (c.clone(), node.ingest_url("signed"), body.clone());
        async move { post(&c, &url, &[("x-sig", sig)], body).await.status }
    };
    assert_eq!(signed("first-secret").await, 202);
    std::fs::write(&secret, "second-secret").unwrap();
    let r = node.reloader.reload(&spec.yaml_at(node.dir()), Vec::new());
    assert_eq!(r.unwrap(), Reloaded::Unchanged);
    assert_eq!(signed("second-secret").await, 202);
    assert_eq!(signed("first-secret").await, 401);
    node.stop().await;
}
