//! The web console (docs/console.md): in a real headless Chromium against a live node
//! (crates/relay/tests/browser/console.py), and its sessions, scopes, CSRF checks and
//! framing headers over plain HTTP.

use std::sync::atomic::Ordering;

use ankusa_queue::counters;
use ankusa_relay::testkit::{eventually, TestNode, TestSink};

use super::support::{admin_call, client, post, repo, text};

const ADMIN: &str = "console-admin-token-0123456789";
const ACME: &str = "console-acme-token-0123456789";
const PORTAL_SECRET: &str = "console-portal-secret-0123456789abcdef";

async fn start(sink: &TestSink, extra_console: &str) -> TestNode {
    TestNode::builder()
        .admin_token("ops", ADMIN)
        .tenant_token("acme-ops", ACME, &["acme"])
        .admin_key(&format!(
            "console: {{ portal_secret: {{ value: \"{PORTAL_SECRET}\" }}{extra_console} }}"
        ))
        .section("dispatch: { tick_interval_ms: 20 }")
        .section("retry: { schedule_ms: [200], max_attempts: 5, jitter: none }")
        .section("archive: { settle_interval_ms: 50 }")
        .sink("flaky", &sink.url("/flaky"))
        .sink_yaml(&format!(
            r#"{{ id: strict, url: "{}", dead_letter_on_4xx: true }}"#,
            sink.url("/strict")
        ))
        .route_yaml("{ id: r, sinks: [flaky], archive: { enabled: true } }")
        .route("d", &["strict"])
        .sink("other", &sink.url("/other"))
        .route("o", &["other"])
        .source_yaml(
            "{ id: plain, tenant: { header: x-tenant }, verify: { scheme: none }, route: o }",
        )
        .source_yaml(
            "{ id: github, tenant: { header: x-tenant }, verify: { scheme: none }, \
             idempotency: { headers: [x-github-delivery] }, route: r }",
        )
        .source_yaml(
            "{ id: gh-dead, tenant: { header: x-tenant }, verify: { scheme: none }, route: d }",
        )
        .start()
        .await
}

async fn send(node: &TestNode, source: &str, tenant: &str, delivery: &str) -> String {
    let r = post(
        &client(),
        &format!("http://{}/ingest/{source}", node.ingest_addr),
        &[
            ("x-tenant", tenant.to_owned()),
            ("x-github-delivery", delivery.to_owned()),
            ("content-type", "application/json".to_owned()),
        ],
        format!(r#"{{"action":"opened","delivery":"{delivery}"}}"#),
    )
    .await;
    assert_eq!(r.status, 202, "{}", text(&r.body));
    r.json()["id"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_console_in_a_real_browser_finds_hooks_replays_keyboard_only_and_scopes_the_portal() {
    for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
        assert!(
            std::path::Path::new(bin).exists(),
            "{bin} is missing: `make test` installs Debian's chromium and chromium-driver (scripts/install-deps.sh)"
        );
    }
    let sink = TestSink::start().await;
    // The flaky sink fails twice, then takes the hook: three attempts.
    sink.script("/flaky", &[(503, None), (503, None)]);
    // The strict sink refuses the first hook for good (dead-lettered), then takes it.
    sink.script("/strict", &[(400, None)]);
    let node = start(&sink, "").await;
    let flaky = send(&node, "github", "acme", "d-flaky-0001").await;
    let dead = send(&node, "gh-dead", "acme", "d-dead-0001").await;
    send(&node, "plain", "globex", "d-globex-0001").await;
    let store = node.store.clone();
    eventually(30, "three attempts of one hook and one dead row", || {
        let c = counters::node(&store).unwrap();
        c.dead == 1 && c.pending + c.scheduled + c.inflight == 0
    })
    .await;
    assert_eq!(sink.on("/flaky").len(), 3, "three attempts of acme's hook");
    let shots = repo().join("target/console-screenshots");
    let out = std::process::Command::new("python3")
        .arg(repo().join("crates/relay/tests/browser/console.py"))
        .env("ADMIN_URL", format!("http://{}", node.admin_addr))
        .env("ADMIN_TOKEN", ADMIN)
        .env("HOOK_FLAKY", &flaky)
        .env("DELIVERY_FLAKY", "d-flaky-0001")
        .env("HOOK_DEAD", &dead)
        .env("SHOTS", &shots)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "the browser test failed:\n{}\n{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    // The replay the keyboard made reached the sink.
    assert_eq!(sink.on("/strict").len(), 2);
    assert_eq!(counters::node(&store).unwrap().dead, 0);
    for page in [
        "login",
        "overview",
        "hook",
        "tenants",
        "tenant",
        "dlq",
        "sinks",
        "portal",
        "replay-confirm",
        "tenant-phone",
    ] {
        let f = shots.join(format!("{page}.png"));
        assert!(
            std::fs::metadata(&f).is_ok_and(|m| m.len() > 1_000),
            "{} was not taken",
            f.display()
        );
    }
    node.stop().await;
}

/// A console request: status, headers, body.
async fn ui(
    node: &TestNode,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    form: &str,
) -> (u16, hyper::HeaderMap, String) {
    use http_body_util::BodyExt;
    let mut req = hyper::Request::builder()
        .method(method)
        .uri(format!("http://{}{path}", node.admin_addr));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if method == "POST" {
        req = req.header("content-type", "application/x-www-form-urlencoded");
    }
    let resp = client()
        .request(
            req.body(http_body_util::Full::new(bytes::Bytes::from(
                form.to_owned(),
            )))
            .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, h, String::from_utf8_lossy(&body).into_owned())
}

async fn sign_in(
    node: &TestNode,
    token: &str,
    extra: &[(&str, &str)],
) -> (String, hyper::HeaderMap) {
    let (s, h, _) = ui(node, "POST", "/ui/login", extra, &format!("token={token}")).await;
    assert_eq!(s, 303);
    let set = h["set-cookie"].to_str().unwrap().to_owned();
    let cookie = set.split(';').next().unwrap().to_owned();
    (cookie, h)
}

fn csrf_of(page: &str) -> String {
    let at = page.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    page[at..].split('"').next().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_scoped_csrf_checked_bounded_and_the_portal_framed_as_configured() {
    let sink = TestSink::start().await;
    sink.default_status.store(400, Ordering::Relaxed);
    let node = start(
        &sink,
        r#", max_sessions: 3, frame_ancestors: ["https://app.example.com"]"#,
    )
    .await;
    send(&node, "gh-dead", "acme", "a1").await;
    send(&node, "gh-dead", "globex", "g1").await;
    let store = node.store.clone();
    eventually(15, "two dead rows", || {
        counters::node(&store).unwrap().dead == 2
    })
    .await;

    // Signed out: the pages send to the sign-in; a wrong token is refused.
    let (s, h, _) = ui(&node, "GET", "/ui/tenants", &[], "").await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/ui/login"));
    let (s, _, body) = ui(
        &node,
        "POST",
        "/ui/login",
        &[],
        "token=wrong-token-0123456789",
    )
    .await;
    assert_eq!(s, 401, "{body}");
    let (s, h, body) = ui(&node, "GET", "/ui/login", &[], "").await;
    assert_eq!(s, 200);
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("default-src 'self'") && csp.contains("frame-ancestors 'none'"),
        "{csp}"
    );
    assert_eq!(h["x-frame-options"], "DENY");
    assert!(
        !body.contains("http://") && !body.contains("https://"),
        "nothing from another origin: {body}"
    );

    // The cookie: HttpOnly, SameSite=Strict; behind TLS the `__Host-` one (Secure, Path=/,
    // no Domain), and that cookie signs the next request in.
    let (tls, h) = sign_in(&node, ADMIN, &[("x-forwarded-proto", "https")]).await;
    let set = h["set-cookie"].to_str().unwrap();
    assert!(set.starts_with("__Host-ankusa_console="), "{set}");
    for part in ["HttpOnly", "SameSite=Strict", "Secure", "Path=/;"] {
        assert!(set.contains(part), "{set}");
    }
    assert!(!set.contains("Domain"), "{set}");
    let (s, _, _) = ui(&node, "GET", "/ui/sinks", &[("cookie", tls.as_str())], "").await;
    assert_eq!(s, 200);

    // A tenant-scoped token sees its tenant and not another.
    let (acme, _) = sign_in(&node, ACME, &[]).await;
    let cookie = [("cookie", acme.as_str())];
    let (s, _, body) = ui(&node, "GET", "/ui/tenants/acme", &cookie, "").await;
    assert_eq!(s, 200, "{body}");
    let (s, _, _) = ui(&node, "GET", "/ui/tenants/globex", &cookie, "").await;
    assert_eq!(s, 404);
    let (s, _, _) = ui(&node, "GET", "/ui/sinks", &cookie, "").await;
    assert_eq!(s, 404, "an admin page is not there for a tenant scope");
    let (_, _, dlq) = ui(&node, "GET", "/ui/dlq", &cookie, "").await;
    assert!(dlq.contains("acme") && !dlq.contains("globex"), "{dlq}");

    // CSRF: no token, a wrong one, or another origin: 403 and nothing moves.
    let csrf = csrf_of(&dlq);
    for (form, origin) in [
        ("tenant=acme&confirm=yes".to_owned(), None),
        ("tenant=acme&confirm=yes&csrf=forged".to_owned(), None),
        (
            format!("tenant=acme&confirm=yes&csrf={csrf}"),
            Some("http://evil.example"),
        ),
    ] {
        let mut h = vec![("cookie", acme.as_str())];
        if let Some(o) = origin {
            h.push(("origin", o));
        }
        let (s, _, _) = ui(&node, "POST", "/ui/dlq/replay", &h, &form).await;
        assert_eq!(s, 403, "{form} {origin:?}");
    }
    assert_eq!(counters::node(&store).unwrap().dead, 2);
    // With it: the confirmation counts the rows and moves none.
    let (s, _, body) = ui(
        &node,
        "POST",
        "/ui/dlq/replay",
        &cookie,
        &format!("tenant=acme&csrf={csrf}"),
    )
    .await;
    assert_eq!(s, 200);
    assert!(
        body.contains("<strong>1</strong> dead row will move"),
        "{body}"
    );
    assert_eq!(
        counters::node(&store).unwrap().dead,
        2,
        "a confirmation changes nothing"
    );
    // A scope cannot reach another tenant's rows through the form either.
    let (_, _, body) = ui(
        &node,
        "POST",
        "/ui/dlq/replay",
        &cookie,
        &format!("tenant=globex&confirm=yes&csrf={csrf}"),
    )
    .await;
    assert!(body.contains("Not found"), "{body}");
    assert_eq!(counters::node(&store).unwrap().dead, 2);

    // Sign-out ends the session.
    let (s, _, _) = ui(
        &node,
        "POST",
        "/ui/logout",
        &cookie,
        &format!("csrf={csrf}"),
    )
    .await;
    assert_eq!(s, 303);
    let (s, _, _) = ui(&node, "GET", "/ui/tenants/acme", &cookie, "").await;
    assert_eq!(s, 303);

    // Bounded: max_sessions 3 (the first admin session is live).
    sign_in(&node, ADMIN, &[]).await;
    sign_in(&node, ADMIN, &[]).await;
    let (s, _, _) = ui(&node, "POST", "/ui/login", &[], &format!("token={ADMIN}")).await;
    assert_eq!(s, 503, "the fourth session is refused");
    let m = metrics_text(&node).await;
    assert!(m.contains("ankusa_console_sessions 3"), "{m}");
    assert!(
        m.contains("ankusa_console_sign_ins_total{outcome=\"full\"} 1"),
        "{m}"
    );

    // The portal: framed by the configured origin only, its tenant only, expired is 404.
    let (s, link) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/portal-links",
        ADMIN,
        r#"{"tenant":"acme","ttl_ms":60000}"#,
    )
    .await;
    assert_eq!(s, 200, "{link}");
    let path = link["path"].as_str().unwrap();
    let (s, h, body) = ui(&node, "GET", path, &[], "").await;
    assert_eq!(s, 200, "{body}");
    assert!(body.contains("Portal of acme"));
    let csp = h["content-security-policy"].to_str().unwrap();
    assert!(
        csp.contains("frame-ancestors https://app.example.com"),
        "{csp}"
    );
    assert!(!h.contains_key("x-frame-options"));
    let (s, _, _) = ui(&node, "GET", &format!("{path}tenants/globex"), &[], "").await;
    assert_eq!(s, 404);
    let (s, _, _) = ui(&node, "GET", &format!("{path}audit"), &[], "").await;
    assert_eq!(s, 200, "the audit rows of its tenant");
    // The credential is the tenant's scope in the API too, and nothing more.
    let cred = link["credential"].as_str().unwrap();
    let (s, _) = admin_call(node.admin_addr, "GET", "/v1/tenants/acme", cred, "").await;
    assert_eq!(s, 200);
    let (s, _) = admin_call(node.admin_addr, "GET", "/v1/tenants/globex", cred, "").await;
    assert_eq!(s, 404);
    let (s, _) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/portal-links",
        cred,
        r#"{"tenant":"acme"}"#,
    )
    .await;
    assert_eq!(s, 403, "a portal makes no links");
    // It replays, and neither deletes rows nor holds delivery: not in the API, not in its pages.
    for (method, path) in [
        ("DELETE", "/v1/tenants/acme/queue?kinds=dead"),
        ("POST", "/v1/tenants/acme/pause"),
        ("DELETE", "/v1/quarantine"),
    ] {
        let (s, _) = admin_call(node.admin_addr, method, path, cred, "").await;
        assert_eq!(s, 403, "{method} {path}");
    }
    assert!(
        !body.contains("Purge") && !body.contains("Pause delivery"),
        "{body}"
    );
    let pcsrf = csrf_of(&body);
    let (s, _, _) = ui(
        &node,
        "POST",
        &format!("{path}tenants/acme/purge"),
        &[],
        &format!("confirm=yes&csrf={pcsrf}"),
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(counters::node(&store).unwrap().dead, 2);
    // A tenant token cannot make links; a link past the ceiling is refused.
    let (s, _) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/portal-links",
        ACME,
        r#"{"tenant":"acme"}"#,
    )
    .await;
    assert_eq!(s, 403);
    let (s, _) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/portal-links",
        ADMIN,
        r#"{"tenant":"acme","ttl_ms":99999999999}"#,
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) = admin_call(
        node.admin_addr,
        "POST",
        "/v1/portal-links",
        ADMIN,
        r#"{"tenant":"nobody"}"#,
    )
    .await;
    assert_eq!(s, 404);
    let (s, _, _) = ui(&node, "GET", "/ui/portal/p1.YWNtZQ.1.AAAA/", &[], "").await;
    assert_eq!(s, 404, "an expired or forged link opens nothing");
    node.stop().await;
}

async fn metrics_text(node: &TestNode) -> String {
    super::support::get_text(&client(), &format!("http://{}/metrics", node.admin_addr))
        .await
        .1
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_with_the_console_off_serves_no_ui() {
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .admin_key("console: { enabled: false }")
        .start()
        .await;
    let (s, _, _) = ui(&node, "GET", "/ui/login", &[], "").await;
    assert_eq!(s, 404);
    node.stop().await;
}

/// A session has what its token has now: a reload that narrows the token to one tenant
/// takes the admin pages from a session signed in before it, and one that makes it a
/// backup token ends the session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_has_what_its_token_has_now_after_a_reload_narrows_it() {
    let with = |scope: &str| {
        TestNode::builder()
            .token_yaml(&format!(
                r#"{{ name: ops, secret: {{ value: "{ADMIN}" }}, scope: {scope} }}"#
            ))
            .sink("s", "http://127.0.0.1:9/hooks")
            .route("r", &["s"])
            .open_source("in", "r")
    };
    let node = with("admin").start().await;
    let (cookie, _) = sign_in(&node, ADMIN, &[]).await;
    let page = |cookie: String| {
        let node = &node;
        async move { ui(node, "GET", "/ui/sinks", &[("cookie", &cookie)], "").await }
    };
    assert_eq!(page(cookie.clone()).await.0, 200, "an admin sees the sinks");
    node.reloader
        .reload(&with("{ tenants: [acme] }").yaml_at(node.dir()), Vec::new())
        .unwrap();
    let (s, _, body) = page(cookie.clone()).await;
    assert_ne!(
        s, 200,
        "a session kept its admin pages after its token narrowed: {body}"
    );
    node.reloader
        .reload(&with("backup").yaml_at(node.dir()), Vec::new())
        .unwrap();
    let (s, h, _) = page(cookie).await;
    assert_eq!((s, h["location"].to_str().unwrap()), (303, "/ui/login"));
    node.stop().await;
}

/// The quarantine page offers to verify a request again: a confirmation that counts it,
/// then the replay's outcome (here it still fails: the secret was not changed), and the
/// request is still there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_quarantine_page_verifies_a_request_again() {
    let node = TestNode::builder()
        .admin_token("ops", ADMIN)
        .sink("s", "http://127.0.0.1:9/s")
        .route("r", &["s"])
        .source_yaml(
            r#"{ id: signed, tenant: { header: x-tenant }, verify: { scheme: hmac-sha256, secret: { value: "a-source-secret" }, header: x-sig }, tenant_binding: shared-secret, route: r }"#,
        )
        .start()
        .await;
    let r = post(
        &client(),
        &format!("http://{}/ingest/signed", node.ingest_addr),
        &[("x-tenant", "acme".to_owned()), ("x-sig", "00".repeat(32))],
        "{}",
    )
    .await;
    assert_eq!(r.status, 401);
    let (cookie, _) = sign_in(&node, ADMIN, &[]).await;
    let cookie = [("cookie", cookie.as_str())];
    let mut page = String::new();
    for _ in 0..100 {
        page = ui(&node, "GET", "/ui/quarantine", &cookie, "").await.2;
        if page.contains("Verify again</button>") {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(
        page.contains("bad_signature") && page.contains("acme"),
        "{page}"
    );
    let id = page
        .split("name=\"ids\" value=\"")
        .nth(1)
        .and_then(|t| t.split('"').next())
        .expect("a row's form")
        .to_owned();
    let csrf = csrf_of(&page);
    let form = format!("ids={id}&csrf={csrf}");
    let (s, _, confirm) = ui(&node, "POST", "/ui/quarantine/replay", &cookie, &form).await;
    assert_eq!(s, 200, "{confirm}");
    assert!(
        confirm.contains("<strong>1</strong> quarantined request will be verified again"),
        "{confirm}"
    );
    let form = format!("ids={id}&confirm=yes&csrf={csrf}");
    let (s, _, done) = ui(&node, "POST", "/ui/quarantine/replay", &cookie, &form).await;
    assert_eq!(s, 200, "{done}");
    assert!(
        done.contains("0 ingested, 0 already received (duplicates), 1 still failing"),
        "{done}"
    );
    let (_, left) = admin_call(node.admin_addr, "GET", "/v1/quarantine", ADMIN, "").await;
    assert_eq!(left["items"].as_array().map(Vec::len), Some(1), "{left}");
    node.stop().await;
}
