//! The HTTP load of the benches that post hooks (`ingest`, `replay`, `sustain`, `depth`):
//! keep-alive clients posting JSON bodies of a fixed size, each expecting its 202, and the
//! relay node and local sink they run against.
// Each bench uses its own part of this module.
#![allow(dead_code)]

pub mod broker;
pub mod outside;
pub mod twin;

use std::collections::HashMap;
use std::time::{Duration, Instant};

use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

pub type HttpClient = Client<HttpConnector, Full<bytes::Bytes>>;

/// A client keeping up to `connections` connections alive.
pub fn client(connections: usize) -> HttpClient {
    Client::builder(TokioExecutor::new())
        .pool_max_idle_per_host(connections)
        .build_http()
}

/// A JSON body of exactly `size` bytes, distinct per worker and request.
pub fn body(worker: u64, n: u64, size: usize) -> Vec<u8> {
    let mut body = format!(r#"{{"worker":{worker},"n":{n},"pad":""#).into_bytes();
    body.resize(size - 2, b'x');
    body.extend_from_slice(b"\"}");
    body
}

/// Sends `req`, reads the answer, asserts it is 202; the ack latency.
pub async fn post_acked(client: &HttpClient, req: hyper::Request<Full<bytes::Bytes>>) -> Duration {
    let t = Instant::now();
    let resp = client.request(req).await.expect("response");
    let status = resp.status();
    resp.into_body().collect().await.expect("body");
    assert_eq!(status, 202, "every hook must be acked");
    t.elapsed()
}

/// The results of every client task, in one list.
pub async fn gather<T>(tasks: Vec<tokio::task::JoinHandle<Vec<T>>>) -> Vec<T> {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("client task"));
    }
    all
}

/// The hmac-sha256 secret of the benches' `bench` source.
pub const SECRET: &str = "bench-secret";

/// `sha256=<hex>` over `body` with [`SECRET`].
pub fn sign(body: &[u8]) -> String {
    let mac = ankusa_verify::hmac_sha256(SECRET.as_bytes(), &[body]);
    format!("sha256={}", ankusa_keyspace::hex(&mac))
}

/// Request `n` of client `worker`: a signed `size`-byte hook for one of `tenants` tenants.
pub fn signed_hook(
    url: &str,
    worker: u64,
    n: u64,
    tenants: u64,
    size: usize,
) -> hyper::Request<Full<bytes::Bytes>> {
    let tenant = format!("tenant-{}", (worker * 31 + n) % tenants);
    signed_hook_for(url, &tenant, worker, n, size)
}

/// Request `n` of client `worker`: a signed `size`-byte hook for `tenant`.
pub fn signed_hook_for(
    url: &str,
    tenant: &str,
    worker: u64,
    n: u64,
    size: usize,
) -> hyper::Request<Full<bytes::Bytes>> {
    let body = body(worker, n, size);
    hyper::Request::post(url)
        .header("x-tenant", tenant)
        .header("x-signature", sign(&body))
        .header("content-type", "application/json")
        .body(Full::new(bytes::Bytes::from(body)))
        .expect("request")
}

/// A local sink answering 200 at once.
pub async fn noop_sink() -> std::net::SocketAddr {
    counting_sink().await.0
}

/// A local sink answering 200 at once, and the count of the requests it answered.
pub async fn counting_sink() -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = l.local_addr().expect("addr");
    let seen = std::sync::Arc::new(AtomicU64::new(0));
    let count = seen.clone();
    let app = axum::Router::new().fallback(move || {
        count.fetch_add(1, Ordering::Relaxed);
        async { axum::http::StatusCode::OK }
    });
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (addr, seen)
}

/// A relay node on a store under `dir`: source `bench` (tenant from `x-tenant`,
/// hmac-sha256 with [`SECRET`]) routed to one sink at `sink`; `extra` adds top-level keys.
pub async fn relay(
    dir: &std::path::Path,
    sink: std::net::SocketAddr,
    extra: &str,
) -> ankusa_relay::node::Node {
    relay_with_sink(dir, sink, "", extra).await
}

/// [`relay`] with more keys for the sink (`sink_keys`, e.g. `", timeout_ms: 600000"`).
pub async fn relay_with_sink(
    dir: &std::path::Path,
    sink: std::net::SocketAddr,
    sink_keys: &str,
    extra: &str,
) -> ankusa_relay::node::Node {
    relay_with_route(dir, sink, sink_keys, "", extra).await
}

/// [`relay_with_sink`] with more keys for the route (`route_keys`, e.g.
/// `", archive: { enabled: true }"`).
pub async fn relay_with_route(
    dir: &std::path::Path,
    sink: std::net::SocketAddr,
    sink_keys: &str,
    route_keys: &str,
    extra: &str,
) -> ankusa_relay::node::Node {
    let config = bench_node(sink, sink_keys, route_keys)
        .section(extra)
        .section(&bench_extra())
        .config_at(dir);
    ankusa_relay::node::Node::start(config).await.expect("node")
}

/// `ANKUSA_BENCH_EXTRA`: YAML added to the configuration of every node the benches start
/// through [`relay`] (top-level keys the bench does not set itself), to compare two settings
/// in one sitting, e.g. `ANKUSA_BENCH_EXTRA='dispatch: { start_at_commit: false }'`.
pub fn bench_extra() -> String {
    std::env::var("ANKUSA_BENCH_EXTRA").unwrap_or_default()
}

/// The benches' node: source `bench` (tenant from `x-tenant`, hmac-sha256 with [`SECRET`])
/// routed to one sink at `sink`, with more keys for the sink and the route.
pub fn bench_node(
    sink: std::net::SocketAddr,
    sink_keys: &str,
    route_keys: &str,
) -> ankusa_relay::testkit::NodeBuilder {
    ankusa_relay::testkit::TestNode::builder()
        .sink_yaml(&format!(r#"{{ id: s, url: "http://{sink}/"{sink_keys} }}"#))
        .route_yaml(&format!("{{ id: r, sinks: [s]{route_keys} }}"))
        .source_yaml(&format!(
            r#"{{ id: bench, tenant: {{ header: x-tenant }}, verify: {{ scheme: hmac-sha256, secret: {{ value: "{SECRET}" }}, header: x-signature, prefix: "sha256=" }}, tenant_binding: shared-secret, idempotency: {{ headers: [] }}, route: r }}"#
        ))
}

/// A figure for the ledger (`make bench-check`, `scripts/bench-check.py`): one line
/// `ledger <name> <value> <unit>`, lower is better. Ratios within one run, not absolute
/// times, so a busier host does not move them.
pub fn ledger(name: &str, value: f64, unit: &str) {
    println!("ledger {name} {value:.3} {unit}");
}

/// The value of an unlabelled sample `name` in a metrics text (0 if absent).
pub fn metric(text: &str, name: &str) -> f64 {
    ankusa_relay::testkit::metric(text, name).unwrap_or(0.0)
}

/// The `p` quantile of sorted latencies, in ms.
pub fn pct(lat: &[Duration], p: f64) -> f64 {
    lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)].as_secs_f64() * 1e3
}

/// This process's CPU time so far (user + system), from `/proc/self/stat`.
pub fn cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").expect("/proc/self/stat");
    stat_cpu(&stat).1
}

/// Another process's CPU time so far (user + system), from `/proc/<pid>/stat`: a broker the
/// bench started.
pub fn process_cpu(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the process's stat");
    stat_cpu(&stat).1
}

/// The command (a thread's name) and the CPU time (user + system) of a `stat` file.
fn stat_cpu(stat: &str) -> (&str, Duration) {
    let (open, close) = (
        stat.find('(').expect("stat"),
        stat.rfind(')').expect("stat"),
    );
    // Fields after the command's closing parenthesis; utime and stime are 14th and 15th.
    let f: Vec<&str> = stat[close + 2..].split(' ').collect();
    let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
    // USER_HZ is 100 on Linux.
    (&stat[open + 1..close], Duration::from_millis(ticks * 10))
}

/// The CPU time so far of each of this process's threads alive now, by thread id, with its
/// name (`/proc/self/task/*/stat`).
pub fn thread_cpu() -> HashMap<String, (String, Duration)> {
    let mut out = HashMap::new();
    for task in std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .flatten()
    {
        // A thread that ended since the listing has no stat to read.
        let Ok(stat) = std::fs::read_to_string(task.path().join("stat")) else {
            continue;
        };
        let (name, cpu) = stat_cpu(&stat);
        out.insert(
            task.file_name().to_string_lossy().into_owned(),
            (name.to_owned(), cpu),
        );
    }
    out
}

/// The CPU time spent between two [`thread_cpu`] readings, by thread name. A thread that
/// ended before `after` is not counted (its time is only in [`cpu_time`]).
pub fn cpu_by_thread(
    before: &HashMap<String, (String, Duration)>,
    after: &HashMap<String, (String, Duration)>,
) -> Vec<(String, Duration)> {
    let mut by: std::collections::BTreeMap<String, Duration> = Default::default();
    for (tid, (name, cpu)) in after {
        let was = before.get(tid).map_or(Duration::ZERO, |(_, c)| *c);
        *by.entry(name.clone()).or_default() += cpu.saturating_sub(was);
    }
    by.into_iter().collect()
}

/// The host's CPU time so far, from the first line of `/proc/stat`: (stolen by the
/// hypervisor, all), in ticks. Their deltas over a window give the share of the host's
/// CPU another guest took (`steal`), which slows every bench on a shared machine.
pub fn host_cpu() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let f: Vec<u64> = stat
        .lines()
        .next()
        .expect("the cpu line")
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is within user).
    (f.get(7).copied().unwrap_or(0), f.iter().take(8).sum())
}

/// The share of the host's CPU stolen between two [`host_cpu`] readings, in %.
pub fn steal_pct(before: (u64, u64), after: (u64, u64)) -> f64 {
    let all = after.1.saturating_sub(before.1).max(1);
    after.0.saturating_sub(before.0) as f64 * 100.0 / all as f64
}

/// This process's resident set, in MiB, from `/proc/self/status`.
pub fn rss_mib() -> f64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(0.0, |kb| kb / 1024.0)
}

/// The cumulative buckets of histogram `name` in a metrics text: (upper bound, count).
pub fn histogram_buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, count) = rest.split_once("\"} ")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The `q` quantile of histogram `name` in a metrics text, as the upper bound of the bucket
/// it falls in (seconds; 0 if the histogram is empty).
pub fn histogram_quantile(text: &str, name: &str, q: f64) -> f64 {
    let buckets = histogram_buckets(text, name);
    let total = buckets.last().map_or(0.0, |b| b.1);
    buckets
        .iter()
        .find(|(_, c)| *c >= total * q && total > 0.0)
        .map_or(0.0, |b| b.0)
}

/// A local sink that answers 204 and records when each `webhook-id` arrived; optionally
/// holding each request `delay` behind `slots` concurrent answers (a sink of limited
/// capacity).
#[derive(Clone, Default)]
pub struct ArrivalSink {
    pub count: std::sync::Arc<std::sync::atomic::AtomicU64>,
    pub arrivals: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<String, Instant>>>,
}

impl ArrivalSink {
    /// When `id` arrived, if it has.
    pub fn arrived(&self, id: &str) -> Option<Instant> {
        self.arrivals.lock().expect("lock").get(id).copied()
    }
}

/// Starts an [`ArrivalSink`] on 127.0.0.1; its port.
pub async fn arrival_sink(delay: Duration) -> (ArrivalSink, u16) {
    use std::sync::atomic::Ordering;
    let sink = ArrivalSink::default();
    let s = sink.clone();
    let app = axum::Router::new().fallback(
        move |headers: axum::http::HeaderMap, _body: axum::body::Bytes| {
            let s = s.clone();
            async move {
                if !delay.is_zero() {
                    tokio::time::sleep(delay).await;
                }
                s.count.fetch_add(1, Ordering::Relaxed);
                if let Some(id) = headers.get("webhook-id").and_then(|v| v.to_str().ok()) {
                    s.arrivals
                        .lock()
                        .expect("lock")
                        .insert(id.to_owned(), Instant::now());
                }
                axum::http::StatusCode::NO_CONTENT
            }
        },
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = l.local_addr().expect("addr").port();
    tokio::spawn(async move {
        let _ = axum::serve(l, app).await;
    });
    (sink, port)
}

/// A hook an open-loop sender had acked: its id, when its request left, when its 202 came.
#[derive(Debug, Clone)]
pub struct Sent {
    pub id: String,
    pub sent: Instant,
    pub acked: Instant,
}

/// Open-loop ingest: `rate` hooks/s for `secs` seconds to `url`, tenant `tenant(n)`, each
/// request on its own task at its planned time, signed for the `bench` source (a source
/// that verifies nothing ignores the header).
pub async fn open_loop(
    url: std::sync::Arc<str>,
    rate: u64,
    secs: u64,
    size: usize,
    tenant: impl Fn(u64) -> String,
) -> Vec<Sent> {
    open_loop_with(url, rate, secs, size, tenant, |status, b, sent| {
        assert_eq!(status, 202, "{}", String::from_utf8_lossy(b));
        let v: serde_json::Value = serde_json::from_slice(b).expect("json");
        Sent {
            id: v["id"].as_str().expect("id").to_owned(),
            sent,
            acked: Instant::now(),
        }
    })
    .await
}

/// [`open_loop`], each answer read by `answer(status, body, when its request left)`.
pub async fn open_loop_with<T: Send + 'static>(
    url: std::sync::Arc<str>,
    rate: u64,
    secs: u64,
    size: usize,
    tenant: impl Fn(u64) -> String,
    answer: fn(u16, &[u8], Instant) -> T,
) -> Vec<T> {
    let client = client(256);
    let period = Duration::from_nanos(1_000_000_000 / rate);
    let start = Instant::now();
    let mut tasks = Vec::new();
    for n in 0..rate * secs {
        tokio::time::sleep_until((start + period * n as u32).into()).await;
        let (client, url) = (client.clone(), url.clone());
        let b = body(n, n, size);
        let req = hyper::Request::post(&*url)
            .header("x-tenant", tenant(n))
            .header("x-signature", sign(&b))
            .header("content-type", "application/json")
            .body(Full::new(bytes::Bytes::from(b)))
            .expect("request");
        tasks.push(tokio::spawn(async move {
            let t = Instant::now();
            let resp = client.request(req).await.expect("response");
            let status = resp.status().as_u16();
            let b = resp.into_body().collect().await.expect("body").to_bytes();
            vec![answer(status, &b, t)]
        }));
    }
    gather(tasks).await
}

/// Ingest-to-delivery latencies of `sent` (waiting up to `wait` for the last arrivals),
/// sorted; and how many never arrived.
pub async fn delivery_lags(
    sink: &ArrivalSink,
    sent: &[Sent],
    wait: Duration,
) -> (Vec<Duration>, usize) {
    let deadline = Instant::now() + wait;
    while sent.iter().any(|s| sink.arrived(&s.id).is_none()) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut lat: Vec<Duration> = sent
        .iter()
        .filter_map(|s| {
            sink.arrived(&s.id)
                .map(|a| a.saturating_duration_since(s.sent))
        })
        .collect();
    lat.sort();
    let missing = sent.len() - lat.len();
    (lat, missing)
}

/// The parts of the latencies of delivered hooks: request to ack, and ack to arrival;
/// each sorted.
pub fn lag_parts(sink: &ArrivalSink, sent: &[Sent]) -> (Vec<Duration>, Vec<Duration>) {
    let (mut ack, mut dispatch): (Vec<Duration>, Vec<Duration>) = sent
        .iter()
        .filter_map(|s| {
            let a = sink.arrived(&s.id)?;
            Some((s.acked - s.sent, a.saturating_duration_since(s.acked)))
        })
        .unzip();
    ack.sort();
    dispatch.sort();
    (ack, dispatch)
}

/// `clients` keep-alive clients posting signed hooks (`body` bytes, `tenants` tenants) to
/// `url` back to back for `run`: (seconds, sorted ack latencies).
pub async fn closed_loop(
    url: std::sync::Arc<str>,
    clients: usize,
    run: Duration,
    tenants: u64,
    body: usize,
) -> (f64, Vec<Duration>) {
    let tenant = move |w: u64, n: u64| format!("tenant-{}", (w * 31 + n) % tenants);
    closed_loop_with(url, clients, run, body, std::sync::Arc::new(tenant)).await
}

/// [`closed_loop`] with request `n` of client `w` for `tenant(w, n)`.
pub async fn closed_loop_with(
    url: std::sync::Arc<str>,
    clients: usize,
    run: Duration,
    body: usize,
    tenant: std::sync::Arc<dyn Fn(u64, u64) -> String + Send + Sync>,
) -> (f64, Vec<Duration>) {
    let client = client(clients);
    let deadline = std::time::Instant::now() + run;
    let started = std::time::Instant::now();
    let tasks: Vec<_> = (0..clients as u64)
        .map(|w| {
            let (client, url, tenant) = (client.clone(), url.clone(), tenant.clone());
            tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut n = 0u64;
                while std::time::Instant::now() < deadline {
                    let req = signed_hook_for(&url, &tenant(w, n), w, n, body);
                    lat.push(post_acked(&client, req).await);
                    n += 1;
                }
                lat
            })
        })
        .collect();
    let mut lat = gather(tasks).await;
    let secs = started.elapsed().as_secs_f64();
    lat.sort();
    (secs, lat)
}

/// A bench node's ports.
pub struct Ports {
    pub ingest: u16,
    pub admin: u16,
}

impl Ports {
    /// Two loopback ports free now.
    pub fn free() -> Ports {
        Ports {
            ingest: ankusa_relay::testkit::free_port(),
            admin: ankusa_relay::testkit::free_port(),
        }
    }
}

/// The cluster token of the benches' Relays.
pub const CLUSTER_TOKEN: &str = "bench-cluster-token-0123456789";

/// Node `name` of a Relay of the nodes `all` on loopback (those in `leaving` marked so),
/// from `node` (a [`bench_node`]), with `cluster_keys` (e.g. `"handoff_interval_ms: 200, "`)
/// added to its cluster section; its store under `dir/<name>`.
pub fn relay_member(
    name: &str,
    all: &[(&str, &Ports)],
    leaving: &[&str],
    cluster_keys: &str,
    node: ankusa_relay::testkit::NodeBuilder,
    dir: &std::path::Path,
) -> ankusa_config::Config {
    let nodes: Vec<String> = all
        .iter()
        .map(|(n, p)| {
            format!(
                r#"{{ name: {n}, ingest: "http://127.0.0.1:{}", admin: "http://127.0.0.1:{}", leaving: {} }}"#,
                p.ingest,
                p.admin,
                leaving.contains(n)
            )
        })
        .collect();
    let me = all.iter().find(|(n, _)| *n == name).expect("a node").1;
    node.data_dir(dir.join(name))
        .ports(me.admin, me.ingest)
        .section(&format!(
            r#"cluster: {{ name: {name}, token: {{ value: "{CLUSTER_TOKEN}" }}, {cluster_keys}nodes: [{}] }}"#,
            nodes.join(", ")
        ))
        .config_at(dir)
}

/// The body of backlog hook `n`: `size` bytes of JSON.
pub fn backlog_body(n: u64, size: usize) -> Vec<u8> {
    let mut b = format!(r#"{{"n":{n},"pad":""#).into_bytes();
    b.resize(size - 2, b'x');
    b.extend_from_slice(b"\"}");
    b
}

/// The store at `data`, opened as the benches' nodes open theirs
/// ([`ankusa_relay::node::limits::store_options`]: its memory budget, its table-file bound): a twin
/// doing a node's work does it on the same store, not on RocksDB's defaults.
pub fn node_store(data: &std::path::Path) -> ankusa_store::Store {
    let options = ankusa_relay::node::limits::store_options(&ankusa_config::Config::default());
    ankusa_store::Store::open(data, &options).expect("store")
}

/// A backlog of `hooks` hooks of `size` bytes over `tenants` tenants, each to `sink`,
/// received over the last minute, written to a store at `data` through the writer's
/// assembler (the `delivery` and `pull` benches drain it).
pub fn write_backlog(data: &std::path::Path, sink: &str, hooks: u64, tenants: u64, size: usize) {
    write_backlog_to(data, hooks, tenants, size, |_| sink.to_owned());
}

/// [`write_backlog`], each tenant's hooks (tenant `tenant-<t>`) to the sink `sink_of(t)`
/// names.
#[allow(dead_code)] // not every bench of this module's users writes to several sinks
pub fn write_backlog_to(
    data: &std::path::Path,
    hooks: u64,
    tenants: u64,
    size: usize,
    sink_of: impl Fn(u64) -> String,
) {
    use ankusa_keyspace::AtMs;
    use ankusa_records::Envelope;
    let store = node_store(data);
    let mut asm = ankusa_queue::writer::Assembler::open(&store, 1_000_000).expect("assembler");
    let now = ankusa_keyspace::now_ms();
    for chunk in 0..hooks / 1_000 {
        let envs: Vec<Envelope> = (0..1_000)
            .map(|i| {
                let n = chunk * 1_000 + i;
                Envelope::builder(format!("backlog-{n}"), "in")
                    .tenant(Some(&format!("tenant-{}", n % tenants)))
                    .received_at(AtMs(now - 60_000 + n / 100))
                    .sinks([sink_of(n % tenants)])
                    .body(backlog_body(n, size))
                    .build()
            })
            .collect();
        let b = asm.assemble(&store, &envs, false).expect("assemble");
        asm.commit(&store, b, false).expect("commit");
    }
    store.flush().expect("flush");
}

/// The delivered outcome of `rows` (first attempts) in one unsynced unit: see
/// [`settle_attempts`].
pub fn settle_delivered(
    store: &ankusa_store::Store,
    rows: &[ankusa_queue::deliveries::InflightRow],
    log: bool,
) {
    let rows: Vec<_> = rows.iter().map(|r| (*r, 1)).collect();
    settle_attempts(store, &rows, log);
}

/// The delivered outcome of `rows`, each with its attempt's number, in one unsynced unit —
/// inflight rows deleted, the last need of each hook dropped, counters, and with `log`
/// each attempt's hook-log event — then a reclaim pass: what the `delivery` bench's twins
/// and the `ingest` bench's store floor commit for a delivery.
pub fn settle_attempts(
    store: &ankusa_store::Store,
    rows: &[(ankusa_queue::deliveries::InflightRow, u32)],
    log: bool,
) {
    use ankusa_queue::deliveries::{self, Tx};
    let mut tx = Tx::new();
    let needs: Vec<_> = rows.iter().map(|(r, _)| (*r, 1)).collect();
    let last = deliveries::last_needs(store, &needs).expect("last needs");
    let at = ankusa_keyspace::AtMs(ankusa_keyspace::now_ms());
    for ((r, attempt), last) in rows.iter().zip(last) {
        deliveries::delivered_last(&mut tx, r, last);
        if log {
            let ev = ankusa_records::Event {
                kind: ankusa_keyspace::EventKind::Attempt,
                at,
                attempt: *attempt,
                outcome: Some(ankusa_records::AttemptOutcome::Delivered),
                status: 204,
                class: None,
                error: String::new(),
                latency_us: 300,
                next_at: None,
            };
            ankusa_queue::hooklog::record(&mut tx, store, r.key.seq, r.key.sink, &ev)
                .expect("event");
        }
    }
    tx.commit(store, false).expect("outcomes");
    ankusa_queue::reclaim::reclaim_pass(store, 1_000).expect("reclaim");
}
