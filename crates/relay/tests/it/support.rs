//! Helpers shared by the integration tests: the real binary, stores built through the
//! library, and a minimal HTTP/1.1 GET over a real TCP connection.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use ankusa_keyspace::AtMs;
use ankusa_queue::writer::Assembler;
use ankusa_records::Envelope;
pub use ankusa_relay::testkit::free_port;
use ankusa_relay::testkit::NodeBuilder;
use ankusa_store::{OpenOptions, Store};

/// The repository's root (this crate sits in `crates/relay`).
pub fn repo() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_ankusa-relay"))
}

pub fn run(args: &[&str]) -> Output {
    bin().args(args).output().expect("run ankusa-relay")
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A format-3 store at `dir` holding `hooks` hooks over three tenants, closed again.
pub fn store_with_hooks(dir: &Path, hooks: u64) {
    let store = Store::open(dir, &OpenOptions::default()).expect("open");
    let mut asm = Assembler::open(&store, 1_000).expect("assembler");
    let envs: Vec<Envelope> = (0..hooks)
        .map(|i| {
            Envelope::builder(format!("hk_{i}"), "it")
                .tenant(match i % 3 {
                    0 => None,
                    1 => Some("acme"),
                    _ => Some("globex"),
                })
                .received_at(AtMs(1_000 + i))
                .sinks(["a", "b"])
                .body(b"{}".to_vec())
                .build()
        })
        .collect();
    let batch = asm.assemble(&store, &envs, true).expect("assemble");
    asm.commit(&store, batch, true).expect("commit");
}

/// One HTTP/1.1 request over a fresh connection with `headers` (each `Name: value`) and
/// `body`, waiting up to `wait` for the answer: (status, body); an error when the
/// connection breaks (a killed server) or no status line comes.
pub fn http_raw(
    port: u16,
    method: &str,
    path: &str,
    headers: &[String],
    body: &str,
    wait: Duration,
) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port))?;
    s.set_read_timeout(Some(wait))?;
    let mut head = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
    for h in headers {
        head.push_str(h);
        head.push_str("\r\n");
    }
    if !body.is_empty() {
        head.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    write!(s, "{head}Connection: close\r\n\r\n{body}")?;
    let mut resp = String::new();
    s.read_to_string(&mut resp)?;
    let status = resp
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other("no status line"))?;
    let body = resp.split("\r\n\r\n").nth(1).unwrap_or_default().to_owned();
    Ok((status, body))
}

/// A JSON request with the admin token ([`http_raw`]).
pub fn http_admin(
    port: u16,
    method: &str,
    path: &str,
    body: &str,
    wait: Duration,
) -> std::io::Result<(u16, String)> {
    let headers = [
        format!("Authorization: Bearer {ADMIN_TOKEN}"),
        "Content-Type: application/json".to_owned(),
    ];
    http_raw(port, method, path, &headers, body, wait)
}

/// The admin token the integration tests' configurations name.
pub const ADMIN_TOKEN: &str = "it-admin-token-0123456789";

/// `GET path` on 127.0.0.1:port; returns (status, body).
pub fn http_get(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_get_auth(port, path, None)
}

/// `GET path` with the admin bearer token.
pub fn http_get_admin(port: u16, path: &str) -> std::io::Result<(u16, String)> {
    http_get_auth(port, path, Some(ADMIN_TOKEN))
}

/// `GET path` with `token` as the bearer token.
pub fn http_get_auth_token(port: u16, path: &str, token: &str) -> std::io::Result<(u16, String)> {
    http_get_auth(port, path, Some(token))
}

fn http_get_auth(port: u16, path: &str, token: Option<&str>) -> std::io::Result<(u16, String)> {
    let auth: Vec<String> = token
        .map(|t| format!("Authorization: Bearer {t}"))
        .into_iter()
        .collect();
    http_raw(port, "GET", path, &auth, "", Duration::from_secs(5))
}

/// Every file of a directory with its bytes.
pub fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .expect("read dir")
        .map(|e| {
            let e = e.expect("entry");
            (
                e.file_name().to_string_lossy().into_owned(),
                std::fs::read(e.path()).expect("read"),
            )
        })
        .collect();
    v.sort();
    v
}

/// A pooled HTTP/1.1 client over real TCP.
pub type Client = hyper_util::client::legacy::Client<
    hyper_util::client::legacy::connect::HttpConnector,
    http_body_util::Full<bytes::Bytes>,
>;

pub fn client() -> Client {
    hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
        .pool_max_idle_per_host(128)
        .build_http()
}

/// A response: status, headers, body.
pub struct Resp {
    pub status: u16,
    pub headers: hyper::HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// POSTs `body` with `headers`.
pub async fn post(
    c: &Client,
    url: &str,
    headers: &[(&str, String)],
    body: impl Into<bytes::Bytes>,
) -> Resp {
    try_post(c, url, headers, body).await.expect("response")
}

/// POSTs `body` with `headers`; `None` if the connection failed (a killed server).
pub async fn try_post(
    c: &Client,
    url: &str,
    headers: &[(&str, String)],
    body: impl Into<bytes::Bytes>,
) -> Option<Resp> {
    post_result(c, url, headers, body).await.ok()
}

/// POSTs `body` with `headers`; the client's error if no answer came.
pub async fn post_result(
    c: &Client,
    url: &str,
    headers: &[(&str, String)],
    body: impl Into<bytes::Bytes>,
) -> Result<Resp, String> {
    use http_body_util::BodyExt;
    let mut req = hyper::Request::post(url);
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let req = req
        .body(http_body_util::Full::new(body.into()))
        .expect("request");
    let resp = c.request(req).await.map_err(|e| format!("{e:?}"))?;
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| format!("{e:?}"))?
        .to_bytes()
        .to_vec();
    Ok(Resp {
        status,
        headers,
        body,
    })
}

/// A raw request: method, URL, headers, body; answers status, headers and the JSON body
/// (`Null` if it is not JSON).
pub async fn raw(
    c: &Client,
    method: &str,
    url: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> (u16, hyper::HeaderMap, serde_json::Value) {
    let mut req = hyper::Request::builder().method(method).uri(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = c
        .request(
            req.body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap(),
        )
        .await
        .unwrap();
    let status = resp.status().as_u16();
    let h = resp.headers().clone();
    let b = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .unwrap()
        .to_bytes();
    (
        status,
        h,
        serde_json::from_slice(&b).unwrap_or(serde_json::Value::Null),
    )
}

/// An admin API call to the listener at `addr` with `token` and a JSON `body` (may be
/// empty): its status and JSON.
pub async fn admin_call(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: &str,
) -> (u16, serde_json::Value) {
    let url = format!("http://{addr}{path}");
    let auth = format!("Bearer {token}");
    let headers = [
        ("authorization", auth.as_str()),
        ("content-type", "application/json"),
    ];
    let (s, _, v) = raw(&client(), method, &url, &headers, body).await;
    (s, v)
}

/// GETs a URL's body as text.
pub async fn get_text(c: &Client, url: &str) -> (u16, String) {
    use http_body_util::BodyExt;
    let req = hyper::Request::get(url)
        .body(http_body_util::Full::new(bytes::Bytes::new()))
        .expect("request");
    let resp = c.request(req).await.expect("response");
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.expect("body").to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// HMAC-SHA256, for signing test requests the way providers do.
pub fn hmac_sha256(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    ankusa_verify::hmac_sha256(key, parts).to_vec()
}

pub use ankusa_keyspace::hex;

pub fn now_s() -> u64 {
    ankusa_keyspace::now_ms() / 1000
}

/// Compiles `source` (C) into `dir/NAME.so` for `LD_PRELOAD`: the fault shims of the
/// process tests, which wrap a libc call of the node's and forward the rest.
pub fn preload_library(dir: &Path, name: &str, source: &str) -> std::path::PathBuf {
    let src = dir.join(format!("{name}.c"));
    let lib = dir.join(format!("{name}.so"));
    std::fs::write(&src, source).expect("write the shim's source");
    let out = Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&lib)
        .arg(&src)
        .arg("-ldl")
        .output()
        .expect("run cc (the C compiler the RocksDB build uses)");
    assert!(out.status.success(), "cc: {}", text(&out.stderr));
    lib
}

/// The process tests' node: fixed free ports and [`ADMIN_TOKEN`] as the admin token.
pub fn proc_node() -> NodeBuilder {
    NodeBuilder::default()
        .free_ports()
        .admin_token("it", ADMIN_TOKEN)
}

/// A relay binary started on a config file; killed when dropped. Its output goes to
/// `relay.log` in its directory, read back by [`Proc::log_tail`] when a test fails.
pub struct Proc {
    pub child: std::process::Child,
}

/// `ankusa-relay sink --listen 127.0.0.1:0` with `args`: the process, its output after its
/// first line, that line (`… listening on http://127.0.0.1:PORT`) and the port.
pub fn demo_sink<S: AsRef<std::ffi::OsStr>>(
    args: impl IntoIterator<Item = S>,
) -> (
    Proc,
    std::io::BufReader<std::process::ChildStdout>,
    String,
    u16,
) {
    use std::io::BufRead;
    let mut sink = Proc {
        child: bin()
            .args(["sink", "--listen", "127.0.0.1:0"])
            .args(args)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap(),
    };
    let mut out = std::io::BufReader::new(sink.child.stdout.take().unwrap());
    let mut first = String::new();
    out.read_line(&mut first).unwrap();
    let port = first
        .trim()
        .rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{first}"));
    (sink, out, first, port)
}

/// The last `lines` lines of the log of the node whose files are under `dir`.
pub fn log_tail(dir: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(dir.join("relay.log")).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

impl Proc {
    /// Starts `ankusa-relay run` on `node`'s configuration (its files under `dir`, its
    /// ports fixed) and waits for `/readyz`.
    pub fn start(dir: &Path, node: &NodeBuilder) -> Proc {
        Proc::start_with_env(dir, node, &[])
    }

    /// [`Proc::start`] with more environment variables for the process.
    pub fn start_with_env(dir: &Path, node: &NodeBuilder, env: &[(&str, &Path)]) -> Proc {
        // The log is appended to across restarts: this process's boot adds one line.
        let boots = |dir: &Path| {
            std::fs::read_to_string(dir.join("relay.log"))
                .unwrap_or_default()
                .matches("relay node ready")
                .count()
        };
        let before = boots(dir);
        let mut p = Proc::spawn_with_env(dir, node, env);
        let admin_port = node.admin_port().expect("fixed ports");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        loop {
            // Only this node's answer counts: the port was free when the test chose it, and
            // between a kill and a restart another test's server (a sink answering any
            // request with an empty 200) may have been given it.
            if let Ok((200, body)) = http_get(admin_port, "/readyz") {
                if body == "ready\n" && boots(dir) > before {
                    return p;
                }
            }
            if let Ok(Some(status)) = p.child.try_wait() {
                panic!(
                    "the node exited ({status}) before it was ready:\n{}",
                    log_tail(dir, 40)
                );
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the node never became ready:\n{}",
                log_tail(dir, 40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Starts `ankusa-relay run` on `node`'s configuration and returns at once (a test that
    /// watches the boot).
    pub fn spawn(dir: &Path, node: &NodeBuilder) -> Proc {
        Proc::spawn_with_env(dir, node, &[])
    }

    pub fn spawn_with_env(dir: &Path, node: &NodeBuilder, env: &[(&str, &Path)]) -> Proc {
        Proc::spawn_into(dir, node, env, None)
    }

    /// [`Proc::start`] inside the cgroup whose `cgroup.procs` is `procs`: the process joins
    /// it before the relay binary starts (a shell writes its own PID there, then `exec`s).
    pub fn start_in_cgroup(dir: &Path, node: &NodeBuilder, procs: &Path) -> Proc {
        let p = Proc::spawn_into(dir, node, &[], Some(procs));
        let admin_port = node.admin_port().expect("fixed ports");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !matches!(http_get(admin_port, "/readyz"), Ok((200, ref b)) if b == "ready\n") {
            assert!(
                std::time::Instant::now() < deadline,
                "the node never became ready:\n{}",
                log_tail(dir, 40)
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        p
    }

    fn spawn_into(
        dir: &Path,
        node: &NodeBuilder,
        env: &[(&str, &Path)],
        cgroup_procs: Option<&Path>,
    ) -> Proc {
        assert!(
            node.admin_port().is_some(),
            "a process node has fixed ports (NodeBuilder::free_ports)"
        );
        let cfg = dir.join("relay.yaml");
        std::fs::write(&cfg, node.yaml_at(dir)).expect("write config");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(dir.join("relay.log"))
            .expect("open relay.log");
        let mut cmd = match cgroup_procs {
            None => bin(),
            Some(procs) => {
                let mut c = Command::new("sh");
                c.args([
                    "-c",
                    r#"echo $$ > "$0" && exec "$@""#,
                    procs.to_str().expect("utf-8 path"),
                    env!("CARGO_BIN_EXE_ankusa-relay"),
                ]);
                c
            }
        };
        let child = cmd
            .args(["run", "--config", cfg.to_str().expect("utf-8 path")])
            .envs(env.iter().copied())
            .stdout(log.try_clone().expect("clone relay.log"))
            .stderr(log)
            .spawn()
            .expect("spawn ankusa-relay");
        Proc { child }
    }

    /// SIGTERM, and go on.
    pub fn sigterm(&self) {
        self.signal(libc::SIGTERM);
    }

    /// Sends `signal` to the process.
    #[allow(unsafe_code)]
    pub fn signal(&self, signal: libc::c_int) {
        let pid = i32::try_from(self.child.id()).expect("a pid");
        // SAFETY: `kill` sends a signal to the process this test started; no memory is
        // touched.
        assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    }

    /// SIGTERM, and wait for the process to exit on its own (`within`).
    pub fn stop(&mut self, within: Duration) -> std::process::ExitStatus {
        self.sigterm();
        let deadline = std::time::Instant::now() + within;
        loop {
            if let Some(status) = self.child.try_wait().expect("wait") {
                return status;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "the node did not stop within {within:?} of SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGKILL, and reap.
    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// Every delivery row a `/v1/node` counters object counts, whatever its state: what a live
/// pipeline moving rows between states cannot change.
pub fn queued_rows(counters: &serde_json::Value) -> i64 {
    ["pending", "scheduled", "inflight", "dead"]
        .iter()
        .map(|f| counters[f].as_i64().expect("a counter"))
        .sum()
}

/// The value of the unlabelled series `name` in a metrics exposition; panics if it is not
/// there.
pub fn metric(text: &str, name: &str) -> f64 {
    ankusa_relay::testkit::metric(text, name).unwrap_or_else(|| panic!("no {name} in {text}"))
}

/// The requests `sink` received on `path`, counted by their `x-github-delivery`.
pub fn deliveries_by_id(
    sink: &ankusa_relay::testkit::TestSink,
    path: &str,
) -> std::collections::HashMap<String, usize> {
    counted_by_id(sink, path, |_| true)
}

/// The requests `sink` received on `path` and answered 2xx (delivered), counted by their
/// `x-github-delivery`.
pub fn accepted_by_id(
    sink: &ankusa_relay::testkit::TestSink,
    path: &str,
) -> std::collections::HashMap<String, usize> {
    counted_by_id(sink, path, |status| (200..300).contains(&status))
}

fn counted_by_id(
    sink: &ankusa_relay::testkit::TestSink,
    path: &str,
    keep: impl Fn(u16) -> bool,
) -> std::collections::HashMap<String, usize> {
    let mut out = std::collections::HashMap::new();
    for r in sink.on(path).into_iter().filter(|r| keep(r.status)) {
        let d = r
            .headers
            .get("x-github-delivery")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        *out.entry(d).or_insert(0) += 1;
    }
    out
}

/// A test CA, and a certificate for 127.0.0.1 it signed with its key: (the CA's
/// certificate, the server's, the server's key).
pub fn private_ca() -> (rcgen::Certificate, rcgen::Certificate, rcgen::KeyPair) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(rcgen::DnType::CommonName, "ankusa test CA");
    let ca = ca.self_signed(&ca_key).unwrap();
    let key = rcgen::KeyPair::generate().unwrap();
    let server = rcgen::CertificateParams::new(vec!["127.0.0.1".to_owned()])
        .unwrap()
        .signed_by(&key, &ca, &ca_key)
        .unwrap();
    (ca, server, key)
}

/// Polls `f` every 25 ms until it holds; panics with `what` after `secs`.
pub async fn until<F: std::future::Future<Output = bool>>(
    secs: u64,
    what: &str,
    mut f: impl FnMut() -> F,
) {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !f().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// The value of the series `name` (with its labels) in the node's metrics, 0 if absent.
pub async fn series(node: &ankusa_relay::testkit::TestNode, name: &str) -> f64 {
    ankusa_relay::testkit::metric(
        &get_text(&client(), &node.admin_url("/metrics")).await.1,
        name,
    )
    .unwrap_or(0.0)
}
