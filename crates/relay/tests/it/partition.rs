//! One Relay of three relay processes, each in a network namespace this test creates, under
//! real network faults between them, while clients send GitHub-signed deliveries to random
//! nodes and retry every non-2xx the way providers do (same delivery id, another node,
//! backoff).
//!
//! The network, all of it created by the test and deleted when it ends (nothing is added to
//! the host's own namespace; no traffic leaves the namespaces):
//! - `<tag>t`, the test's namespace: a bridge `br0` with 10.77.0.254 (the clients) and
//!   10.77.0.253 (the sink). The test runs itself again inside it.
//! - `<tag>n<i>`, node `i`: `eth0` 10.77.0.(i+1) on the bridge (a veth pair), the relay on
//!   :8080 (ingest) and :9090 (admin), and a Toxiproxy server (API on :8474) whose proxies
//!   on 127.0.0.1:2j00 / 2j01 lead to node `j`'s ingest and admin. Node `i`'s node list
//!   names every other node through those proxies, so each link i → j has its own.
//!
//! Faults: iptables drops inside a node's namespace (a full partition of two nodes, a
//! one-way partition, one node isolated from the others and the clients), Toxiproxy toxics
//! on a link (latency past `forward_timeout_ms`, a trickle of bandwidth, connection resets,
//! a half-open connection whose answers never come back), SIGSTOP of a node, and a node
//! leaving the node list (the others restart onto a list without it, its tenants move;
//! back at the heal). Each schedule is a few phases, one fault each, healed between
//! phases.
//!
//! After each schedule: every node ready again within a bound; every hook acked to a client
//! delivered, each once (a moved tenant's duplicates, the stated trade-off, counted and
//! printed apart); nothing left pending or inflight; no forward loop (forwards ≤ the
//! clients' requests); every 503 with `Retry-After`; never more tenants than
//! `tenants.max` (and the stated bound for moved tenants); then every node stopped,
//! `store verify` on its store (counters equal a fold), and started again. `make test`
//! runs fixed seeds; `make chaos` runs random schedules (`ANKUSA_CHAOS_SCHEDULES`,
//! `ANKUSA_CHAOS_SEED`).

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ankusa_relay::testkit::{NodeBuilder, TestSink};

use crate::support::*;

const NODES: usize = 3;
const GH_SECRET: &str = "partition-github-secret";
const CLUSTER_TOKEN: &str = "partition-cluster-token-0123456789";
const ADMIN: &str = "partition-admin-token-0123456789";
/// Tenants the clients of every schedule pick from, and those new in each schedule: new
/// tenants arrive under every schedule's faults, and past a few schedules the Relay holds
/// `tenants.max` (the third of `make test`'s).
const COMMON_TENANTS: u64 = 14;
const NEW_TENANTS: u64 = 6;
const TENANTS_MAX: u64 = 30;
/// Set in the test's own namespace: the tag of the namespaces.
const INSIDE: &str = "ANKUSA_PARTITION_NET";

fn node_ip(i: usize) -> String {
    format!("10.77.0.{}", i + 1)
}
const CLIENT_IP: &str = "10.77.0.254";
const SINK_IP: &str = "10.77.0.253";

/// Runs `cmd`, panicking with its output if it fails.
fn sh(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    text(&out.stdout)
}

fn ip(args: &[&str]) {
    sh(Command::new("ip").args(args));
}

/// The namespaces, veth pairs and bridge of one run; deleted on drop.
struct Net {
    tag: String,
}

impl Net {
    fn ns_test(&self) -> String {
        format!("{}t", self.tag)
    }

    fn create() -> Net {
        // Namespaces a killed run of this suite left behind (its process is gone).
        let list = sh(Command::new("ip").args(["netns", "list"]));
        for name in list.lines().filter_map(|l| l.split_whitespace().next()) {
            let Some(rest) = name.strip_prefix("akp") else {
                continue;
            };
            let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
            if !pid.is_empty() && !Path::new(&format!("/proc/{pid}")).exists() {
                let _ = Command::new("ip").args(["netns", "del", name]).status();
            }
        }
        let net = Net {
            tag: format!("akp{}", std::process::id()),
        };
        let t = net.ns_test();
        ip(&["netns", "add", &t]);
        ip(&["-n", &t, "link", "set", "lo", "up"]);
        ip(&["-n", &t, "link", "add", "br0", "type", "bridge"]);
        ip(&[
            "-n",
            &t,
            "addr",
            "add",
            &format!("{CLIENT_IP}/24"),
            "dev",
            "br0",
        ]);
        ip(&[
            "-n",
            &t,
            "addr",
            "add",
            &format!("{SINK_IP}/24"),
            "dev",
            "br0",
        ]);
        ip(&["-n", &t, "link", "set", "br0", "up"]);
        for i in 0..NODES {
            let n = node_ns(&net.tag, i);
            ip(&["netns", "add", &n]);
            ip(&["-n", &n, "link", "set", "lo", "up"]);
            let v = format!("v{i}");
            ip(&[
                "link", "add", &v, "netns", &t, "type", "veth", "peer", "name", "eth0", "netns", &n,
            ]);
            ip(&["-n", &t, "link", "set", &v, "master", "br0", "up"]);
            ip(&[
                "-n",
                &n,
                "addr",
                "add",
                &format!("{}/24", node_ip(i)),
                "dev",
                "eth0",
            ]);
            ip(&["-n", &n, "link", "set", "eth0", "up"]);
        }
        net
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for i in 0..NODES {
            let _ = Command::new("ip")
                .args(["netns", "del", &node_ns(&self.tag, i)])
                .status();
        }
        let _ = Command::new("ip")
            .args(["netns", "del", &self.ns_test()])
            .status();
    }
}

fn node_ns(tag: &str, i: usize) -> String {
    format!("{tag}n{i}")
}

/// splitmix64: the schedules' and clients' choices, from a seed.
#[derive(Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// Two different nodes.
    fn pair(&mut self) -> (usize, usize) {
        let a = self.below(NODES as u64) as usize;
        let b = (a + 1 + self.below(NODES as u64 - 1) as usize) % NODES;
        (a, b)
    }
}

/// One fault.
#[derive(Debug, Clone, PartialEq)]
enum Fault {
    /// Nodes `a` and `b` drop each other's packets.
    Partition(usize, usize),
    /// Packets from `a` to `b` are dropped (b's answers to a's connections never arrive).
    OneWay(usize, usize),
    /// Node `n` reaches no other node and no client (the sink still).
    Isolate(usize),
    /// Link a → b: every answer held `ms`.
    Latency(usize, usize, u64),
    /// Link a → b: answers trickle at 1 KB/s.
    Trickle(usize, usize),
    /// Link a → b: connections reset as soon as data flows.
    Reset(usize, usize),
    /// Link a → b: requests arrive, answers never come back, the connection stays open.
    HalfOpen(usize, usize),
    /// Node `n` is stopped (SIGSTOP) for the phase.
    Pause(usize),
    /// Node `n` leaves the node list: it stops, and the others restart one at a time onto
    /// a list without it (its tenants move to them); at the heal it starts again and they
    /// restart onto the whole list (the tenants move back).
    Shrink(usize),
}

impl Fault {
    /// A Toxiproxy fault's toxic: its type, the stream it acts on, its attributes.
    fn toxic(&self) -> (&'static str, &'static str, serde_json::Value) {
        use serde_json::json;
        match *self {
            Fault::Latency(_, _, ms) => ("latency", "downstream", json!({ "latency": ms })),
            Fault::Trickle(..) => ("bandwidth", "downstream", json!({ "rate": 1 })),
            Fault::Reset(..) => ("reset_peer", "upstream", json!({ "timeout": 0 })),
            Fault::HalfOpen(..) => ("timeout", "downstream", json!({ "timeout": 0 })),
            _ => unreachable!("not a Toxiproxy fault: {self:?}"),
        }
    }

    fn random(rng: &mut Rng) -> Fault {
        let (a, b) = rng.pair();
        match rng.below(9) {
            0 => Fault::Partition(a, b),
            1 => Fault::OneWay(a, b),
            2 => Fault::Isolate(a),
            3 => Fault::Latency(a, b, [300, 2_500][rng.below(2) as usize]),
            4 => Fault::Trickle(a, b),
            5 => Fault::Reset(a, b),
            6 => Fault::HalfOpen(a, b),
            7 => Fault::Pause(a),
            _ => Fault::Shrink(a),
        }
    }
}

/// A schedule: phases of one fault each, `ms` long.
fn schedule(seed: u64, phases: usize) -> Vec<(Fault, u64)> {
    let mut rng = Rng(seed);
    (0..phases)
        .map(|_| (Fault::random(&mut rng), 2_000 + rng.below(2_000)))
        .collect()
}

/// The relay processes, their Toxiproxy servers and the sink, in the namespaces of `tag`.
struct Relay {
    tag: String,
    root: PathBuf,
    toxiproxy: PathBuf,
    nodes: Mutex<Vec<Option<Child>>>,
    /// The nodes of the node list now (all but one while a node is out).
    members: Mutex<Vec<usize>>,
    proxies: Vec<Child>,
    sink: TestSink,
    http: Client,
}

impl Drop for Relay {
    fn drop(&mut self) {
        let nodes = self.nodes.get_mut().unwrap_or_else(|e| e.into_inner());
        for c in nodes.iter_mut().flatten().chain(self.proxies.iter_mut()) {
            let _ = Command::new("kill")
                .args(["-CONT", &c.id().to_string()])
                .status();
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn in_ns(ns: &str, program: &Path) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns]).arg(program);
    c
}

impl Relay {
    fn node_dir(&self, i: usize) -> PathBuf {
        self.root.join(format!("relay-{i}"))
    }

    fn config(&self, i: usize) -> String {
        let members = self.members.lock().unwrap().clone();
        let nodes: Vec<String> = members
            .into_iter()
            .map(|j| {
                let (ingest, admin) = if i == j {
                    (
                        format!("{}:8080", node_ip(j)),
                        format!("{}:9090", node_ip(j)),
                    )
                } else {
                    (format!("127.0.0.1:2{j}00"), format!("127.0.0.1:2{j}01"))
                };
                format!(
                    r#"{{ name: relay-{j}, ingest: "http://{ingest}", admin: "http://{admin}" }}"#
                )
            })
            .collect();
        let b = NodeBuilder::default()
            .ports(9090, 8080)
            .admin_token("it", ADMIN)
            .section("dispatch: { tick_interval_ms: 20 }")
            .section(&format!("tenants: {{ max: {TENANTS_MAX} }}"))
            .section(&format!(
                r#"cluster:
  name: relay-{i}
  token: {{ value: "{CLUSTER_TOKEN}" }}
  forward_timeout_ms: 2000
  nodes: [{}]"#,
                nodes.join(", ")
            ))
            .sink_yaml(&format!(
                r#"{{ id: s, url: "{}", timeout_ms: 5000 }}"#,
                self.sink.url("/s")
            ))
            .route("r", &["s"])
            .source_yaml(&format!(
                r#"{{ id: gh, tenant: {{ header: x-tenant }}, verify: {{ scheme: github, secret: {{ value: "{GH_SECRET}" }} }}, tenant_binding: shared-secret, route: r }}"#
            ));
        b.yaml_at(&self.node_dir(i))
            .replace("listen: \"127.0.0.1:", "listen: \"0.0.0.0:")
    }

    fn log(&self, i: usize) -> std::fs::File {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.node_dir(i).join("relay.log"))
            .unwrap()
    }

    fn start_node(&self, i: usize) {
        let dir = self.node_dir(i);
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = dir.join("relay.yaml");
        std::fs::write(&cfg, self.config(i)).unwrap();
        let child = in_ns(
            &node_ns(&self.tag, i),
            Path::new(env!("CARGO_BIN_EXE_ankusa-relay")),
        )
        .args(["run", "--config", cfg.to_str().unwrap()])
        .stdout(self.log(i))
        .stderr(self.log(i))
        .spawn()
        .unwrap();
        self.nodes.lock().unwrap()[i] = Some(child);
    }

    /// Stops every node (SIGTERM), checks its store (`store verify`: counters equal a
    /// fold) and starts it again.
    fn verify_and_restart(&self) {
        for i in 0..NODES {
            self.stop_node(i);
            let out = run(&[
                "store",
                "verify",
                "--data",
                self.node_dir(i).join("db").to_str().unwrap(),
            ]);
            assert!(out.status.success(), "node {i}: {}", text(&out.stderr));
            assert!(text(&out.stdout).contains("counters equal a fold"));
            self.start_node(i);
        }
    }

    /// SIGTERM, and the node's clean exit.
    fn stop_node(&self, i: usize) {
        let mut c = self.nodes.lock().unwrap()[i].take().unwrap();
        sh(Command::new("kill").args(["-TERM", &c.id().to_string()]));
        assert!(
            c.wait().unwrap().success(),
            "{}",
            log_tail(&self.node_dir(i), 30)
        );
    }

    /// Restarts `nodes` one at a time onto the current node list, each ready before the
    /// next stops (a rolling restart).
    async fn roll(&self, nodes: &[usize]) {
        for &i in nodes {
            tokio::task::block_in_place(|| self.stop_node(i));
            self.start_node(i);
            self.ready(i, Duration::from_secs(60)).await;
        }
    }

    fn start_proxy(&mut self, i: usize) {
        let child = in_ns(&node_ns(&self.tag, i), &self.toxiproxy)
            .args(["-host", &node_ip(i), "-port", "8474"])
            .stdout(Stdio::null())
            .stderr(self.log(i))
            .spawn()
            .unwrap();
        self.proxies.push(child);
    }

    async fn call(&self, method: &str, url: &str, body: &str) -> Result<(u16, String), String> {
        let req = hyper::Request::builder()
            .method(method)
            .uri(url)
            .header("authorization", format!("Bearer {ADMIN}"))
            .header("content-type", "application/json")
            .body(http_body_util::Full::new(bytes::Bytes::from(
                body.to_owned(),
            )))
            .unwrap();
        let work = async {
            let resp = self.http.request(req).await.map_err(|e| e.to_string())?;
            let status = resp.status().as_u16();
            let b = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .map_err(|e| e.to_string())?
                .to_bytes();
            Ok((status, String::from_utf8_lossy(&b).into_owned()))
        };
        tokio::time::timeout(Duration::from_secs(5), work)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }

    async fn toxiproxy(&self, i: usize, method: &str, path: &str, body: &str) {
        let url = format!("http://{}:8474{path}", node_ip(i));
        match self.call(method, &url, body).await {
            Ok((s, _)) if s < 300 => {}
            other => panic!("toxiproxy of node {i}: {method} {path}: {other:?}"),
        }
    }

    /// Waits until every node answers `/readyz` (within `within`); the time it took.
    async fn all_ready(&self, within: Duration) -> Duration {
        let started = Instant::now();
        for i in 0..NODES {
            self.ready(i, within.saturating_sub(started.elapsed()))
                .await;
        }
        started.elapsed()
    }

    /// Waits until node `i` answers `/readyz` (within `within`).
    async fn ready(&self, i: usize, within: Duration) {
        let started = Instant::now();
        let url = format!("http://{}:9090/readyz", node_ip(i));
        loop {
            if let Ok((200, _)) = self.call("GET", &url, "").await {
                return;
            }
            assert!(
                started.elapsed() < within,
                "node {i} not ready within {within:?}:\n{}",
                log_tail(&self.node_dir(i), 30)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sets up every node's proxies: link i → j on 127.0.0.1:2j00 (ingest) and 2j01
    /// (admin) of node i's namespace.
    async fn proxies(&self) {
        for i in 0..NODES {
            let url = format!("http://{}:8474/version", node_ip(i));
            let deadline = Instant::now() + Duration::from_secs(20);
            while self.call("GET", &url, "").await.is_err() {
                assert!(
                    Instant::now() < deadline,
                    "toxiproxy of node {i} never answered"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            for j in (0..NODES).filter(|j| *j != i) {
                for (kind, port, to) in [("ingest", 0, 8080), ("admin", 1, 9090)] {
                    let body = serde_json::json!({
                        "name": format!("to{j}-{kind}"),
                        "listen": format!("127.0.0.1:2{j}0{port}"),
                        "upstream": format!("{}:{to}", node_ip(j)),
                        "enabled": true,
                    });
                    self.toxiproxy(i, "POST", "/proxies", &body.to_string())
                        .await;
                }
            }
        }
    }

    fn iptables(&self, i: usize, rules: &[&[&str]]) {
        for r in rules {
            let mut c = Command::new("ip");
            c.args(["netns", "exec", &node_ns(&self.tag, i), "iptables", "-w"])
                .args(*r);
            sh(&mut c);
        }
    }

    /// Signals node `i` (when it runs).
    fn signal(&self, i: usize, sig: &str) {
        let pid = self.nodes.lock().unwrap()[i].as_ref().map(Child::id);
        if let Some(pid) = pid {
            sh(Command::new("kill").args([sig, &pid.to_string()]));
        }
    }

    async fn toxic(&self, a: usize, b: usize, kind: &str, stream: &str, attrs: serde_json::Value) {
        for p in ["ingest", "admin"] {
            let body = serde_json::json!({
                "name": format!("{kind}-{stream}"),
                "type": kind,
                "stream": stream,
                "toxicity": 1.0,
                "attributes": attrs,
            });
            self.toxiproxy(
                a,
                "POST",
                &format!("/proxies/to{b}-{p}/toxics"),
                &body.to_string(),
            )
            .await;
        }
    }

    async fn inject(&self, f: &Fault) {
        let ip = |n: usize| node_ip(n);
        match *f {
            Fault::Partition(a, b) => {
                for (x, y) in [(a, b), (b, a)] {
                    self.iptables(
                        x,
                        &[
                            &["-A", "INPUT", "-s", &ip(y), "-j", "DROP"],
                            &["-A", "OUTPUT", "-d", &ip(y), "-j", "DROP"],
                        ],
                    );
                }
            }
            Fault::OneWay(a, b) => {
                self.iptables(a, &[&["-A", "OUTPUT", "-d", &ip(b), "-j", "DROP"]]);
            }
            Fault::Isolate(n) => self.iptables(
                n,
                &[
                    &["-A", "INPUT", "-s", SINK_IP, "-j", "ACCEPT"],
                    &["-A", "INPUT", "-s", "10.77.0.0/24", "-j", "DROP"],
                    &["-A", "OUTPUT", "-d", SINK_IP, "-j", "ACCEPT"],
                    &["-A", "OUTPUT", "-d", "10.77.0.0/24", "-j", "DROP"],
                ],
            ),
            Fault::Latency(a, b, _)
            | Fault::Trickle(a, b)
            | Fault::Reset(a, b)
            | Fault::HalfOpen(a, b) => {
                let (kind, stream, attrs) = f.toxic();
                self.toxic(a, b, kind, stream, attrs).await
            }
            Fault::Pause(n) => self.signal(n, "-STOP"),
            Fault::Shrink(n) => {
                let rest: Vec<usize> = (0..NODES).filter(|j| *j != n).collect();
                *self.members.lock().unwrap() = rest.clone();
                tokio::task::block_in_place(|| self.stop_node(n));
                self.roll(&rest).await;
            }
        }
    }

    /// Removes every fault: the drops, the toxics (and the connections they held), the
    /// stops.
    async fn heal(&self) {
        for i in 0..NODES {
            self.iptables(i, &[&["-F"]]);
            self.signal(i, "-CONT");
        }
        for i in 0..NODES {
            self.toxiproxy(i, "POST", "/reset", "").await;
        }
        let out: Vec<usize> = (0..NODES)
            .filter(|i| !self.members.lock().unwrap().contains(i))
            .collect();
        if let [n] = out[..] {
            *self.members.lock().unwrap() = (0..NODES).collect();
            self.start_node(n);
            self.ready(n, Duration::from_secs(60)).await;
            let rest: Vec<usize> = (0..NODES).filter(|j| *j != n).collect();
            self.roll(&rest).await;
        }
    }

    async fn node_json(&self, i: usize, path: &str) -> serde_json::Value {
        let url = format!("http://{}:9090{path}", node_ip(i));
        let (s, body) = self.call("GET", &url, "").await.unwrap();
        assert_eq!(s, 200, "{path} on node {i}: {body}");
        serde_json::from_str(&body).unwrap()
    }

    async fn metrics(&self, i: usize) -> String {
        let url = format!("http://{}:9090/metrics", node_ip(i));
        self.call("GET", &url, "").await.unwrap().1
    }

    /// The sink's deliveries, by `x-github-delivery`.
    fn delivered(&self) -> HashMap<String, usize> {
        deliveries_by_id(&self.sink, "/s")
    }
}

/// What the clients saw in one schedule.
#[derive(Default, Debug)]
struct Seen {
    requests: u64,
    acked: HashSet<String>,
    /// Deliveries refused for good (`tenant_limit`), by tenant.
    limited: HashSet<String>,
    /// Answers by `<status> <error>` (or the client's error), for the report.
    answers: HashMap<String, u64>,
    /// 503s without `Retry-After` (`owner_unavailable`, `registry_unavailable`,
    /// `not_ready`, `tenant_limit`: every one must say when to come back).
    no_retry_after: Vec<String>,
    /// Answers no provider should ever get (a 4xx, a 5xx other than 503).
    unexpected: Vec<String>,
    /// Tenants of acked deliveries.
    tenants: HashSet<String>,
    /// The tenant of each acked delivery.
    tenant_of: HashMap<String, String>,
}

/// One client: sends deliveries until `until`, each retried until acked or refused for
/// good, like a provider: same delivery id, another node each time, backoff from 100 ms
/// to 1 s.
async fn client_loop(
    relay: Arc<Relay>,
    id: String,
    client: u64,
    mut rng: Rng,
    until: Instant,
    seen: Arc<Mutex<Seen>>,
) {
    let mut n = 0;
    while Instant::now() < until {
        n += 1;
        let delivery = format!("{id}-c{client}-{n}");
        let k = rng.below(COMMON_TENANTS + NEW_TENANTS);
        let tenant = if k < COMMON_TENANTS {
            format!("tenant-{k}")
        } else {
            format!("tenant-{id}-{k}")
        };
        let body = format!(r#"{{"delivery":"{delivery}","tenant":"{tenant}"}}"#);
        let sig = format!(
            "sha256={}",
            hex(&hmac_sha256(GH_SECRET.as_bytes(), &[body.as_bytes()]))
        );
        let headers = [
            ("x-hub-signature-256", sig),
            ("x-github-delivery", delivery.clone()),
            ("x-github-event", "push".to_owned()),
            ("x-tenant", tenant.clone()),
        ];
        let mut backoff = 100;
        let given_up = Instant::now() + Duration::from_secs(120);
        let mut node = rng.below(NODES as u64) as usize;
        loop {
            let url = format!("http://{}:8080/ingest/gh", node_ip(node));
            let send = post_result(&relay.http, &url, &headers, body.clone());
            let answer = tokio::time::timeout(Duration::from_secs(5), send)
                .await
                .unwrap_or_else(|_| Err("timed out".into()));
            let done = {
                let mut s = seen.lock().unwrap();
                s.requests += 1;
                match answer {
                    Ok(r) if r.status == 200 || r.status == 202 => {
                        *s.answers.entry(format!("{}", r.status)).or_default() += 1;
                        s.acked.insert(delivery.clone());
                        s.tenants.insert(tenant.clone());
                        s.tenant_of.insert(delivery.clone(), tenant.clone());
                        true
                    }
                    Ok(r) => {
                        let error = r.json()["error"].as_str().unwrap_or_default().to_owned();
                        *s.answers
                            .entry(format!("{} {error}", r.status))
                            .or_default() += 1;
                        if r.status == 503 && !r.headers.contains_key("retry-after") {
                            s.no_retry_after
                                .push(format!("{delivery} at node {node}: {error}"));
                        }
                        if r.status == 503 && error == "tenant_limit" {
                            s.limited.insert(tenant.clone());
                            true
                        } else if r.status != 503 {
                            s.unexpected.push(format!(
                                "{delivery} at node {node}: {} {}",
                                r.status,
                                String::from_utf8_lossy(&r.body)
                            ));
                            true
                        } else {
                            false
                        }
                    }
                    Err(e) => {
                        let kind = if e.contains("timed out") {
                            "timed out"
                        } else {
                            "no connection"
                        };
                        *s.answers.entry(kind.to_owned()).or_default() += 1;
                        false
                    }
                }
            };
            if done {
                break;
            }
            if Instant::now() > given_up {
                break;
            }
            tokio::time::sleep(Duration::from_millis(backoff + rng.below(backoff))).await;
            backoff = (backoff * 2).min(1_000);
            // A retry goes to another node.
            node = (node + 1 + rng.below(NODES as u64 - 1) as usize) % NODES;
        }
        tokio::time::sleep(Duration::from_millis(rng.below(40))).await;
    }
}

/// The sum of a labelled counter's series whose labels contain `filter`.
fn metric_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{name}{{")) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Runs `schedules` against one Relay; panics at the first broken check, printing what the
/// clients saw.
async fn run_schedules(relay: Arc<Relay>, schedules: &[(u64, Vec<(Fault, u64)>)]) {
    let mut previously = HashMap::new();
    // Nodes that were out of the list in any schedule so far (their tenants moved).
    let mut ever_out: HashSet<String> = HashSet::new();
    for (seed, phases) in schedules {
        println!("schedule {seed}: {phases:?}");
        let started = Instant::now();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let forwards_before = forwards(&relay).await;
        let total: u64 = phases.iter().map(|(_, ms)| ms).sum::<u64>() + 1_000;
        let until = Instant::now() + Duration::from_millis(total);
        let clients: Vec<_> = (0..6)
            .map(|c| {
                tokio::spawn(client_loop(
                    relay.clone(),
                    format!("s{seed}"),
                    c,
                    Rng(seed * 1_000 + c),
                    until,
                    seen.clone(),
                ))
            })
            .collect();
        tokio::time::sleep(Duration::from_millis(500)).await;
        for (fault, ms) in phases {
            relay.inject(fault).await;
            tokio::time::sleep(Duration::from_millis(*ms)).await;
            relay.heal().await;
        }
        let healed = Instant::now();
        let ready_in = relay.all_ready(Duration::from_secs(15)).await;
        for c in clients {
            c.await.unwrap();
        }
        let seen = std::mem::take(&mut *seen.lock().unwrap());
        println!(
            "  {} requests, {} acked, answers {:?}; every node ready {ready_in:?} after the heal",
            seen.requests,
            seen.acked.len(),
            seen.answers
        );
        assert!(seen.unexpected.is_empty(), "{:?}", seen.unexpected);
        assert!(seen.no_retry_after.is_empty(), "{:?}", seen.no_retry_after);
        // Every acked hook delivered.
        let deadline = Instant::now() + Duration::from_secs(60);
        let got = loop {
            let got = relay.delivered();
            let missing: Vec<_> = seen
                .acked
                .iter()
                .filter(|d| !got.contains_key(*d))
                .collect();
            if missing.is_empty() {
                break got;
            }
            assert!(
                Instant::now() < deadline,
                "{} acked hooks never delivered, e.g. {:?}",
                missing.len(),
                &missing[..missing.len().min(5)]
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        // Nothing left queued or inflight on any node.
        let deadline = Instant::now() + Duration::from_secs(30);
        for i in 0..NODES {
            loop {
                let n = relay.node_json(i, "/v1/node").await;
                if queued_rows(&n["counters"]) == n["counters"]["dead"].as_i64().unwrap() {
                    assert_eq!(n["counters"]["dead"], 0, "node {i}: {n}");
                    break;
                }
                assert!(Instant::now() < deadline, "node {i} never settled: {n}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        // Each acked delivery once. The documented trade-off: a tenant that moved (a node
        // left the list and came back) has its dedupe keys on the node that took the
        // first copy, so a provider's retry that reached the other owner is a second
        // hook: counted and printed; any other duplicate fails.
        let out: HashSet<String> = phases
            .iter()
            .filter_map(|(f, _)| match f {
                Fault::Shrink(n) => Some(format!("relay-{n}")),
                _ => None,
            })
            .collect();
        ever_out.extend(out.iter().cloned());
        let names: Vec<String> = (0..NODES).map(|i| format!("relay-{i}")).collect();
        let owner = |tenant: &str| {
            &names[ankusa_relay::cluster::owner_index(names.iter().map(String::as_str), tenant)]
        };
        let moved = |tenant: &str| out.contains(owner(tenant));
        let (moved_dups, dups): (Vec<_>, Vec<_>) = got
            .iter()
            .filter(|(d, n)| **n > 1 && seen.acked.contains(*d))
            .partition(|(d, _)| seen.tenant_of.get(*d).is_some_and(|t| moved(t)));
        println!(
            "  delivered {} of {} acked hooks within {:?} of the heal; duplicates: {dups:?}; of moved tenants (the stated trade-off): {moved_dups:?}",
            seen.acked.iter().filter(|d| got.contains_key(*d)).count(),
            seen.acked.len(),
            healed.elapsed()
        );
        assert!(dups.is_empty(), "delivered more than once: {dups:?}");
        // No loop: at most one forward per request a client sent.
        let forwarded = forwards(&relay).await - forwards_before;
        assert!(
            forwarded <= seen.requests as f64,
            "{forwarded} forwards for {} requests",
            seen.requests
        );
        // Never past tenants.max.
        let mut registered = 0;
        for i in 0..NODES {
            let n = relay.node_json(i, "/v1/node").await;
            registered += n["cluster"]["tenants_registered"].as_u64().unwrap();
        }
        for t in &seen.tenants {
            previously.insert(t.clone(), ());
        }
        println!(
            "  tenants: {registered} registered, {} with acked hooks so far, {} refused for the limit",
            previously.len(),
            seen.limited.len()
        );
        // The stated bound: while a node is out of the list, its tenants count nowhere
        // until they send again, and new tenants may take their slots.
        let silent_moved = previously
            .keys()
            .filter(|t| ever_out.contains(owner(t)))
            .count() as u64;
        assert!(
            registered <= TENANTS_MAX + silent_moved,
            "{registered} tenants registered"
        );
        assert!(previously.len() as u64 <= TENANTS_MAX + silent_moved);
        // Counters equal a fold on every node: stopped, verified, started again.
        tokio::task::block_in_place(|| relay.verify_and_restart());
        relay.all_ready(Duration::from_secs(60)).await;
        println!(
            "  every store verified and every node back; the schedule took {:?}",
            started.elapsed()
        );
    }
}

/// The ingest forwards every node has sent.
async fn forwards(relay: &Relay) -> f64 {
    let mut sum = 0.0;
    for i in 0..NODES {
        let m = relay.metrics(i).await;
        sum += metric_sum(&m, "ankusa_cluster_forwards_total", "kind=\"ingest\"");
    }
    sum
}

/// Inside the test's namespace: starts the Relay and runs the schedules.
fn inside(tag: &str, schedules: &[(u64, Vec<(Fault, u64)>)]) {
    let toxiproxy = Command::new("bash")
        .arg(repo().join("scripts/toxiproxy.sh"))
        .output()
        .expect("run scripts/toxiproxy.sh");
    assert!(toxiproxy.status.success(), "{}", text(&toxiproxy.stderr));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let root = tempfile::tempdir().unwrap();
    let sink = rt.block_on(TestSink::start_on(SINK_IP.parse().unwrap()));
    let mut relay = Relay {
        tag: tag.to_owned(),
        root: root.path().to_owned(),
        toxiproxy: PathBuf::from(text(&toxiproxy.stdout).trim()),
        nodes: Mutex::new((0..NODES).map(|_| None).collect()),
        members: Mutex::new((0..NODES).collect()),
        proxies: Vec::new(),
        sink,
        http: client(),
    };
    for i in 0..NODES {
        std::fs::create_dir_all(relay.node_dir(i)).unwrap();
        relay.start_proxy(i);
        relay.start_node(i);
    }
    let relay = Arc::new(relay);
    rt.block_on(async {
        relay.all_ready(Duration::from_secs(60)).await;
        relay.proxies().await;
        run_schedules(relay.clone(), schedules).await;
    });
}

/// Runs `name` (this module's test) again inside a fresh set of namespaces, or, inside
/// them, the schedules.
fn in_namespaces(name: &str, schedules: Vec<(u64, Vec<(Fault, u64)>)>) {
    if let Ok(tag) = std::env::var(INSIDE) {
        inside(&tag, &schedules);
        return;
    }
    let net = Net::create();
    let status = Command::new("ip")
        .args(["netns", "exec", &net.ns_test()])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", name, "--nocapture", "--include-ignored"])
        .env(INSIDE, &net.tag)
        .status()
        .unwrap();
    drop(net);
    assert!(status.success(), "the run inside the namespaces failed");
}

/// The fixed seeds `make test` runs, and the schedules that found a fault, kept.
#[test]
fn a_relay_in_network_namespaces_loses_no_acked_hook_under_partitions_resets_and_stalls() {
    let mut schedules = vec![
        // Every kind of fault once, in a fixed order.
        (
            0,
            vec![
                (Fault::HalfOpen(0, 1), 2_500),
                (Fault::Partition(1, 2), 2_500),
                (Fault::Latency(2, 0, 2_500), 2_500),
                (Fault::Isolate(1), 2_500),
                (Fault::OneWay(0, 2), 2_500),
                (Fault::Reset(1, 0), 2_000),
                (Fault::Trickle(2, 1), 2_500),
                (Fault::Pause(2), 3_000),
                (Fault::Shrink(1), 3_000),
            ],
        ),
    ];
    schedules.extend([7u64, 11].map(|seed| (seed, schedule(seed, 4))));
    in_namespaces(
        "partition::a_relay_in_network_namespaces_loses_no_acked_hook_under_partitions_resets_and_stalls",
        schedules,
    );
}

/// `make chaos`: `ANKUSA_CHAOS_SCHEDULES` random schedules (default 20) from
/// `ANKUSA_CHAOS_SEED` (default: the clock), six phases each. Ignored by `make test`
/// because twenty random schedules take about seven minutes; `make test` runs the same
/// harness and checks on fixed schedules in
/// `a_relay_in_network_namespaces_loses_no_acked_hook_under_partitions_resets_and_stalls`,
/// and `make chaos` runs this one (`--run-ignored only`).
#[test]
#[ignore = "random schedules for minutes: `make chaos` runs it; `make test` runs the fixed ones (a_relay_in_network_namespaces_…)"]
fn chaos() {
    let n: u64 = std::env::var("ANKUSA_CHAOS_SCHEDULES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let seed: u64 = std::env::var("ANKUSA_CHAOS_SEED")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(ankusa_keyspace::now_ms);
    println!("chaos: {n} schedules from seed {seed}");
    let schedules = (0..n).map(|k| (seed + k, schedule(seed + k, 6))).collect();
    in_namespaces("partition::chaos", schedules);
}
