//! Test support shared by the node's tests and benches (feature `test-support`): a node
//! configuration builder, an in-process [`TestNode`], and a scriptable local sink.
//!
//! ```ignore
//! let sink = TestSink::start().await;
//! let t = TestNode::builder()
//!     .admin_token("ops", ADMIN)
//!     .sink("s", &sink.url("/hooks"))
//!     .route("r", &["s"])
//!     .open_source("shared", "r")
//!     .section("dispatch: { tick_interval_ms: 10 }")
//!     .start()
//!     .await;
//! ```
//!
//! Every configuration is written as the YAML a user would write, then parsed and validated
//! by [`Config::from_yaml`], so a test exercises the same path as `ankusa-relay run`.
#![allow(clippy::expect_used)] // test support: a failed expect is a failed test or bench

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::{HeaderMap, StatusCode};

use crate::node::Node;
use ankusa_config::Config;

mod kafka;
pub use kafka::KafkaBroker;

/// A node's configuration, built up as YAML: the store under a data directory, listeners on
/// loopback (ephemeral ports unless [`NodeBuilder::ports`]), then what the test adds.
#[derive(Debug, Clone, Default)]
pub struct NodeBuilder {
    data: Option<PathBuf>,
    admin_port: Option<u16>,
    ingest_port: Option<u16>,
    admin: Vec<String>,
    ingest: Vec<String>,
    tokens: Vec<String>,
    sinks: Vec<String>,
    routes: Vec<String>,
    sources: Vec<String>,
    sections: Vec<String>,
}

impl NodeBuilder {
    /// The store's directory. Without one, [`NodeBuilder::start`] makes a temporary
    /// directory that lives as long as the [`TestNode`] (the store is `<dir>/db`).
    pub fn data_dir(mut self, data: impl Into<PathBuf>) -> Self {
        self.data = Some(data.into());
        self
    }

    /// Fixed loopback ports for the admin and ingest listeners (a process test must know
    /// them before the node starts, and a restart keeps them).
    pub fn ports(mut self, admin: u16, ingest: u16) -> Self {
        self.admin_port = Some(admin);
        self.ingest_port = Some(ingest);
        self
    }

    /// [`NodeBuilder::ports`] with two ports free now.
    pub fn free_ports(self) -> Self {
        self.ports(free_port(), free_port())
    }

    /// The admin listener's port, if fixed.
    pub fn admin_port(&self) -> Option<u16> {
        self.admin_port
    }

    /// The ingest listener's port, if fixed.
    pub fn ingest_port(&self) -> Option<u16> {
        self.ingest_port
    }

    /// An admin token of scope `admin`.
    pub fn admin_token(self, name: &str, secret: &str) -> Self {
        self.token_yaml(&format!(
            r#"{{ name: {name}, secret: {{ value: "{secret}" }}, scope: admin }}"#
        ))
    }

    /// An admin token scoped to `tenants`.
    pub fn tenant_token(self, name: &str, secret: &str, tenants: &[&str]) -> Self {
        self.token_yaml(&format!(
            r#"{{ name: {name}, secret: {{ value: "{secret}" }}, scope: {{ tenants: [{}] }} }}"#,
            tenants.join(", ")
        ))
    }

    /// An admin token, as a YAML mapping.
    pub fn token_yaml(mut self, token: &str) -> Self {
        self.tokens.push(token.to_owned());
        self
    }

    /// One more key of the `admin` section (`"gauge_interval_ms: 100"`).
    pub fn admin_key(mut self, line: &str) -> Self {
        self.admin.push(line.to_owned());
        self
    }

    /// One more key of the `ingest` section (`"body_limit_bytes: 4096"`).
    pub fn ingest_key(mut self, line: &str) -> Self {
        self.ingest.push(line.to_owned());
        self
    }

    /// A sink with only an id and a URL.
    pub fn sink(self, id: &str, url: &str) -> Self {
        self.sink_yaml(&format!(r#"{{ id: {id}, url: "{url}" }}"#))
    }

    /// A sink, as a YAML mapping (flow or block style).
    pub fn sink_yaml(mut self, sink: &str) -> Self {
        self.sinks.push(sink.to_owned());
        self
    }

    /// A route to `sinks`.
    pub fn route(self, id: &str, sinks: &[&str]) -> Self {
        self.route_yaml(&format!("{{ id: {id}, sinks: [{}] }}", sinks.join(", ")))
    }

    /// A route, as a YAML mapping.
    pub fn route_yaml(mut self, route: &str) -> Self {
        self.routes.push(route.to_owned());
        self
    }

    /// A source that takes its tenant from the `x-tenant` header and verifies nothing:
    /// what most tests send through.
    pub fn open_source(self, id: &str, route: &str) -> Self {
        self.source_yaml(&format!(
            "{{ id: {id}, tenant: {{ header: x-tenant }}, verify: {{ scheme: none }}, route: {route} }}"
        ))
    }

    /// A source, as a YAML mapping (flow or block style).
    pub fn source_yaml(mut self, source: &str) -> Self {
        self.sources.push(source.to_owned());
        self
    }

    /// Any other top-level YAML (`"dispatch: { tick_interval_ms: 10 }"`), as written.
    pub fn section(mut self, yaml: &str) -> Self {
        self.sections.push(yaml.to_owned());
        self
    }

    /// The configuration file's text for a node whose files go under `dir`: the store at
    /// `<dir>/db` unless [`NodeBuilder::data_dir`] says otherwise, and every `{dir}` in what
    /// the test wrote replaced by `dir` (`.admin_key("backup_dir: {dir}/backups")`).
    pub fn yaml_at(&self, dir: &Path) -> String {
        let data = self.data.clone().unwrap_or_else(|| dir.join("db"));
        let mut y = format!("data_dir: {}\n", data.display());
        let section = |y: &mut String, name: &str, port: Option<u16>, keys: &[String]| {
            y.push_str(&format!(
                "{name}:\n  listen: \"127.0.0.1:{}\"\n",
                port.unwrap_or(0)
            ));
            for k in keys {
                y.push_str(&format!("  {k}\n"));
            }
        };
        section(&mut y, "ingest", self.ingest_port, &self.ingest);
        section(&mut y, "admin", self.admin_port, &self.admin);
        list(&mut y, "  tokens", "    ", &self.tokens);
        list(&mut y, "sinks", "  ", &self.sinks);
        list(&mut y, "routes", "  ", &self.routes);
        list(&mut y, "sources", "  ", &self.sources);
        for s in &self.sections {
            y.push_str(s.trim_matches('\n'));
            y.push('\n');
        }
        y.replace("{dir}", &dir.display().to_string())
    }

    /// The validated configuration ([`NodeBuilder::yaml_at`]); panics with the parser's
    /// message if the test wrote a configuration the node refuses.
    pub fn config_at(&self, dir: &Path) -> Config {
        let yaml = self.yaml_at(dir);
        match Config::from_yaml(&yaml, Vec::new()) {
            Ok(c) => c,
            Err(e) => panic!("test configuration refused: {e}\n{yaml}"),
        }
    }

    /// Starts the node in this process; panics if it does not start.
    pub async fn start(self) -> TestNode {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let node = match Node::start(self.config_at(dir.path())).await {
            Ok(n) => n,
            Err(e) => panic!("the test node did not start: {e}"),
        };
        TestNode { node, dir }
    }
}

/// The value of the unlabelled series `name` in a Prometheus text exposition, if it is
/// there (the tests insist on it, the benches count an absent one as 0).
pub fn metric(text: &str, name: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse().ok())
}

/// A loopback port free now (another process may take it before use).
///
/// It is chosen below the kernel's ephemeral range (`net.ipv4.ip_local_port_range`), at
/// random, and checked free: a node given it binds it later, maybe again after a restart,
/// and a port of the ephemeral range may meanwhile be handed to any `bind(0)` or outgoing
/// connection on the machine (another test's sink, which answers every path with an empty
/// 200, once stood in for a restarting node that way).
///
/// Each port given is **held for this process's life** by a lock on a file named after it
/// (`$TMPDIR/ankusa-test-ports/<port>`), which every test process checks: a node stopped
/// and restarted on its ports never finds one taken by another test that chose it while
/// the node was down (seen: "Address already in use" at a cluster test's restart). The
/// kernel drops the lock when the process ends, however it ends.
pub fn free_port() -> u16 {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u16>().ok())
        .unwrap_or(32_768);
    let floor = 10_000u16;
    if low > floor + 1_000 {
        for _ in 0..1_000 {
            let port = rand::random_range(floor..low);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() && hold_port(port) {
                return port;
            }
        }
    }
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free loopback port")
}

/// Takes the lock of `port` for this process's life: false if another process holds it.
fn hold_port(port: u16) -> bool {
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    let dir = std::env::temp_dir().join("ankusa-test-ports");
    let _ = std::fs::create_dir_all(&dir);
    let Ok(file) = std::fs::File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(dir.join(port.to_string()))
    else {
        // No directory to lock in: the port is only checked free, as before.
        return true;
    };
    if file.try_lock().is_err() {
        return false;
    }
    lock(&HELD).push(file);
    true
}

/// Appends `items` as a YAML block list named `name` (`indent` before each item; the lines
/// of a block-style item are indented under its first).
fn list(y: &mut String, name: &str, indent: &str, items: &[String]) {
    if items.is_empty() {
        return;
    }
    y.push_str(&format!("{name}:\n"));
    for item in items {
        let mut lines = item.trim_matches('\n').lines();
        if let Some(first) = lines.next() {
            y.push_str(&format!("{indent}- {}\n", first.trim()));
        }
        for l in lines {
            y.push_str(&format!("{indent}  {}\n", l.trim_end()));
        }
    }
}

/// A node started in this process by [`NodeBuilder::start`], with the temporary directory
/// that holds its store (and anything else the test writes there).
pub struct TestNode {
    pub node: Node,
    dir: tempfile::TempDir,
}

impl TestNode {
    pub fn builder() -> NodeBuilder {
        NodeBuilder::default()
    }

    /// The temporary directory of this node.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `http://<ingest>/ingest/<source>`.
    pub fn ingest_url(&self, source: &str) -> String {
        format!("http://{}/ingest/{source}", self.node.ingest_addr)
    }

    /// `http://<admin><path>`.
    pub fn admin_url(&self, path: &str) -> String {
        format!("http://{}{path}", self.node.admin_addr)
    }

    /// A graceful stop; panics if the node does not stop cleanly. The directory goes with it.
    pub async fn stop(self) {
        if let Err(e) = self.node.shutdown().await {
            panic!("the test node did not stop cleanly: {e}");
        }
    }
}

impl std::ops::Deref for TestNode {
    type Target = Node;
    fn deref(&self) -> &Node {
        &self.node
    }
}

/// A request the sink received.
#[derive(Debug, Clone)]
pub struct Received {
    pub path: String,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
    pub at: Instant,
    /// The status it was answered (chosen when it arrived, before any `delay_ms`).
    pub status: u16,
}

/// A scripted answer: status and an optional `Retry-After` in seconds.
pub type Answer = (u16, Option<u64>);

/// A local webhook receiver on 127.0.0.1 (or an address of the test's own network
/// namespace): answers each path from a script (default 200),
/// records every request with the status it chose for it on arrival.
#[derive(Clone, Default)]
pub struct TestSink {
    pub received: Arc<Mutex<Vec<Received>>>,
    script: Arc<Mutex<HashMap<String, VecDeque<Answer>>>>,
    /// Every path answers this status when its script is empty (0 = 200).
    pub default_status: Arc<AtomicU64>,
    /// Milliseconds each request is held before the answer.
    pub delay_ms: Arc<AtomicU64>,
    /// Requests being answered now, and the most ever at once.
    pub open: Arc<AtomicU64>,
    pub most_open: Arc<AtomicU64>,
    /// The body of every answer that is not a 2xx (none by default).
    pub failure_body: Arc<Mutex<Vec<u8>>>,
    pub port: u16,
    /// The address it listens on (`None`: 127.0.0.1).
    host: Option<std::net::IpAddr>,
}

impl TestSink {
    pub async fn start() -> TestSink {
        Self::start_on(std::net::Ipv4Addr::LOCALHOST.into()).await
    }

    /// A sink on `host` (an address of a network namespace the test created).
    pub async fn start_on(host: std::net::IpAddr) -> TestSink {
        let mut sink = TestSink {
            host: Some(host),
            ..TestSink::default()
        };
        let l = tokio::net::TcpListener::bind((host, 0))
            .await
            .expect("bind the test sink");
        sink.port = l.local_addr().expect("the sink's address").port();
        let s = sink.clone();
        let app = axum::Router::new().fallback(
            move |uri: axum::http::Uri, headers: HeaderMap, body: axum::body::Bytes| {
                let s = s.clone();
                async move {
                    s.answer(uri.path().to_owned(), headers, body.to_vec())
                        .await
                }
            },
        );
        tokio::spawn(async move {
            let _ = axum::serve(l, app).await;
        });
        sink
    }

    async fn answer(
        &self,
        path: String,
        headers: HeaderMap,
        body: Vec<u8>,
    ) -> axum::response::Response {
        let next = lock(&self.script)
            .get_mut(&path)
            .and_then(VecDeque::pop_front);
        let (status, retry_after) =
            next.unwrap_or_else(
                || match self.default_status.load(Ordering::Relaxed) as u16 {
                    0 => (200, None),
                    n => (n, None),
                },
            );
        lock(&self.received).push(Received {
            path,
            headers,
            body,
            at: Instant::now(),
            status,
        });
        let open = self.open.fetch_add(1, Ordering::SeqCst) + 1;
        self.most_open.fetch_max(open, Ordering::SeqCst);
        let delay = self.delay_ms.load(Ordering::Relaxed);
        if delay > 0 {
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        self.open.fetch_sub(1, Ordering::SeqCst);
        let body = if (200..300).contains(&status) {
            Vec::new()
        } else {
            lock(&self.failure_body).clone()
        };
        let mut resp = axum::response::Response::new(axum::body::Body::from(body));
        *resp.status_mut() =
            StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        if let Some(ra) = retry_after {
            resp.headers_mut().insert("retry-after", ra.into());
        }
        resp
    }

    /// The answers `path` gives next, in order; then the default.
    pub fn script(&self, path: &str, answers: &[Answer]) {
        lock(&self.script).insert(path.to_owned(), answers.iter().copied().collect());
    }

    pub fn url(&self, path: &str) -> String {
        let host = self.host.unwrap_or(std::net::Ipv4Addr::LOCALHOST.into());
        format!("http://{host}:{}{path}", self.port)
    }

    /// The requests received on `path`, in arrival order.
    pub fn on(&self, path: &str) -> Vec<Received> {
        lock(&self.received)
            .iter()
            .filter(|r| r.path == path)
            .cloned()
            .collect()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Polls `f` every 20 ms until it holds; panics with `what` after `secs`.
pub async fn eventually(secs: u64, what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A SeaweedFS server (master, volume, filer and S3 gateway in one process) on loopback:
/// the S3-compatible object store of the backup tests and the `backup` bench, built from
/// its Go module by `scripts/seaweedfs.sh` (cached once per machine). Its telemetry and
/// catalog servers are off, every port is its own, its logs and sockets are in its own
/// directory. Killed when dropped.
pub struct SeaweedFs {
    child: std::process::Child,
    /// The S3 gateway's port.
    pub s3: u16,
    /// Its HTTPS port, when started with a certificate.
    pub https: Option<u16>,
    ports: Vec<u16>,
    dir: tempfile::TempDir,
}

impl SeaweedFs {
    /// Starts it and waits until `bucket` can be made (the gateway answers before its filer
    /// is ready).
    pub fn start(bucket: &str) -> SeaweedFs {
        SeaweedFs::start_in(bucket, &std::env::temp_dir())
    }

    /// [`SeaweedFs::start`] with its files in a new directory under `parent` (a file system
    /// of its own: an object store is not on the node's disk).
    pub fn start_in(bucket: &str, parent: &Path) -> SeaweedFs {
        SeaweedFs::start_with(bucket, parent, None)
    }

    /// [`SeaweedFs::start_in`], the gateway also serving HTTPS with `tls` (the server's
    /// certificate chain and key, PEM files) on [`SeaweedFs::https`].
    pub fn start_with(bucket: &str, parent: &Path, tls: Option<(&Path, &Path)>) -> SeaweedFs {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let built = std::process::Command::new("bash")
            .arg(repo.join("scripts/seaweedfs.sh"))
            .output()
            .expect("run scripts/seaweedfs.sh");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let bin = String::from_utf8_lossy(&built.stdout).trim().to_owned();
        let dir = tempfile::tempdir_in(parent).expect("a directory for SeaweedFS");
        let ports: Vec<u16> = (0..9).map(|_| free_port()).collect();
        let flag = |name: &str, i: usize| format!("-{name}={}", ports[i]);
        let log = std::fs::File::create(dir.path().join("weed.log")).expect("weed.log");
        let mut cmd = std::process::Command::new(&bin);
        cmd.current_dir(dir.path())
            .env("TMPDIR", dir.path())
            .arg(format!("-logdir={}", dir.path().display()))
            .arg("server")
            .args(["-ip=127.0.0.1", "-ip.bind=127.0.0.1", "-metricsPort=0"])
            .arg(format!("-dir={}", dir.path().display()))
            .args([
                flag("master.port", 0),
                flag("master.port.grpc", 1),
                flag("volume.port", 2),
                flag("volume.port.grpc", 3),
                flag("filer.port", 4),
                flag("filer.port.grpc", 5),
                flag("s3.port", 6),
                flag("s3.port.grpc", 7),
            ])
            .args([
                "-master.telemetry=false",
                // By default every volume turns read-only (uploads hang until the client
                // gives up) once the disk has less than 1 % free, which a shared machine
                // building a clean clone can fall to; the tests write megabytes.
                "-volume.minFreeSpace=64MiB",
                "-s3",
                "-s3.port.iceberg=0",
                "-s3.port.lance=0",
            ]);
        if let Some((cert, key)) = tls {
            cmd.arg(format!("-s3.port.https={}", ports[8]))
                .arg(format!("-s3.cert.file={}", cert.display()))
                .arg(format!("-s3.key.file={}", key.display()));
        }
        let child = cmd
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start weed");
        let weed = SeaweedFs {
            child,
            s3: ports[6],
            https: tls.map(|_| ports[8]),
            ports,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(90);
        while !weed.make_bucket(bucket) {
            assert!(
                Instant::now() < deadline,
                "SeaweedFS's S3 gateway never made a bucket: {}",
                std::fs::read_to_string(weed.dir.path().join("weed.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(300));
        }
        weed
    }

    /// `PUT /<bucket>` answered 200 (anonymous: the server has no identities).
    fn make_bucket(&self, bucket: &str) -> bool {
        loopback_http(self.s3, "PUT", &format!("/{bucket}"))
            .is_some_and(|a| a.starts_with("HTTP/1.1 200"))
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.s3)
    }
}

impl Drop for SeaweedFs {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // The unix sockets it makes beside its ports, should it put them in /tmp anyway.
        for p in &self.ports {
            for kind in ["master", "volume", "filer", "s3"] {
                let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{kind}-grpc-{p}.sock"));
                let _ = std::fs::remove_file(format!("/tmp/seaweedfs-{kind}-{p}.sock"));
            }
        }
    }
}

/// The whole answer (status line, headers, body) of a bodiless `method path` to
/// 127.0.0.1:`port` on a connection of its own; `None` if it could not be sent. For the
/// test servers' own endpoints, with no HTTP client of their own.
fn loopback_http(port: u16, method: &str, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut answer = String::new();
    let _ = s.read_to_string(&mut answer);
    Some(answer)
}

/// A NATS server with JetStream on loopback: the broker of the NATS sink's tests and the
/// `nats` bench, built from its Go module by `scripts/nats-server.sh` (cached once per
/// machine). Its store is in its own directory; [`NatsServer::stop`] and
/// [`NatsServer::restart`] take it down and bring it back on the same port and store.
/// Killed when dropped.
pub struct NatsServer {
    child: Option<std::process::Child>,
    bin: String,
    pub port: u16,
    /// Its monitoring port (`/connz`: [`NatsServer::connections`]).
    pub monitor: u16,
    /// Its arguments beyond the port, the monitor and the store (TLS, credentials).
    extra: Vec<String>,
    dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts it (clients need `token` when given) and waits until it takes connections.
    pub fn start(token: Option<&str>) -> NatsServer {
        let extra: Vec<String> = match token {
            Some(t) => vec!["--auth".into(), t.into()],
            None => Vec::new(),
        };
        NatsServer::start_with(&extra)
    }

    /// [`NatsServer::start`] with more of `nats-server`'s arguments (`--tls`, `--user`, …).
    pub fn start_with(extra: &[String]) -> NatsServer {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let built = std::process::Command::new("bash")
            .arg(repo.join("scripts/nats-server.sh"))
            .output()
            .expect("run scripts/nats-server.sh");
        assert!(
            built.status.success(),
            "{}",
            String::from_utf8_lossy(&built.stderr)
        );
        let mut server = NatsServer {
            child: None,
            bin: String::from_utf8_lossy(&built.stdout).trim().to_owned(),
            port: free_port(),
            monitor: free_port(),
            extra: extra.to_vec(),
            dir: tempfile::tempdir().expect("a directory for nats-server"),
        };
        server.restart();
        server
    }

    /// The server's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// `nats://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// Starts it again (after [`NatsServer::stop`]) on its port and store, and waits until
    /// it takes connections.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "nats-server runs already");
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("nats.log"))
            .expect("nats.log");
        let mut cmd = std::process::Command::new(&self.bin);
        cmd.args(["-a", "127.0.0.1", "-p", &self.port.to_string(), "-js"])
            .args(["-m", &self.monitor.to_string()])
            .arg("-sd")
            .arg(self.dir.path().join("store"))
            .args(["--server_name", "ankusa-test"]);
        cmd.args(&self.extra);
        self.child = Some(
            cmd.stdout(std::process::Stdio::null())
                .stderr(log)
                .spawn()
                .expect("start nats-server"),
        );
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "nats-server never listened: {}",
                std::fs::read_to_string(self.dir.path().join("nats.log")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The client connections it has open now (its monitoring endpoint's `/connz`).
    pub fn connections(&self) -> u64 {
        let answer = loopback_http(self.monitor, "GET", "/connz").expect("/connz");
        let body = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
        serde_json::from_str::<serde_json::Value>(body).expect("/connz's JSON")["num_connections"]
            .as_u64()
            .expect("num_connections")
    }

    /// Kills it (SIGKILL: a broker that is gone, not one that says goodbye).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Flow and block style items, `{dir}` and fixed ports all come out as YAML the node's
    /// own parser takes, with the values the test wrote.
    #[test]
    fn the_builder_writes_a_configuration_the_node_takes() {
        let dir = Path::new("/srv/t");
        let b = TestNode::builder()
            .ports(9101, 9102)
            .admin_token("ops", "ops-token-0123456789")
            .tenant_token("a", "a-token-0123456789ab", &["acme", "globex"])
            .admin_key("backup_dir: {dir}/backups")
            .sink("s", "http://127.0.0.1:9/x")
            .route("r", &["s"])
            .source_yaml(
                "id: block\ntenant: { header: x-tenant }\nverify: { scheme: none }\nroute: r",
            )
            .open_source("flow", "r")
            .section("dispatch: { tick_interval_ms: 7 }");
        let c = b.config_at(dir);
        assert_eq!(c.data_dir, dir.join("db"));
        assert_eq!(c.admin.listen.port(), 9101);
        assert_eq!(c.ingest.listen.port(), 9102);
        assert_eq!(b.admin_port(), Some(9101));
        assert_eq!(c.admin.tokens.len(), 2);
        assert_eq!(c.backup_dir(), dir.join("backups"));
        let ids: Vec<_> = c.sources.iter().map(|s| s.id.as_str()).collect();
        assert_eq!(ids, ["block", "flow"]);
        assert_eq!(c.dispatch.tick_interval_ms, 7);
        // Without a data directory of its own, the store goes under the node's directory.
        let own = TestNode::builder().data_dir("/data/x").config_at(dir);
        assert_eq!(own.data_dir, Path::new("/data/x"));
    }
}
