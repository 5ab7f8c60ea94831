//! One Relay of several relay processes on loopback, sharing a node list: each tenant is
//! owned by one node, hooks sent to any node are stored and delivered by the owner once,
//! `tenants.max` counts relay-wide, and the admin API answers the same from every node.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ankusa_relay::testkit::NodeBuilder;
use base64::Engine;

use crate::support::*;
use ankusa_relay::testkit::TestSink;

const GH_SECRET: &str = "cluster-github-secret";
const CLUSTER_TOKEN: &str = "cluster-token-0123456789abcdef";
const ADMIN: &str = "it-admin-token-0123456789";

#[derive(Clone)]
struct Spec {
    name: String,
    ingest: u16,
    /// The ingest port the other nodes are told (a proxy in front of `ingest`, or it).
    advertised_ingest: u16,
    admin: u16,
    /// The admin port the other nodes are told (a proxy in front of `admin`, or it).
    advertised_admin: u16,
    dir: PathBuf,
}

/// A Relay of relay processes and one local sink.
struct Relay {
    rt: tokio::runtime::Runtime,
    sink: TestSink,
    _root: tempfile::TempDir,
    root: PathBuf,
    specs: Vec<Spec>,
    procs: Vec<Option<Proc>>,
    extra: String,
    /// The route also goes to the pull sink `q`.
    pull: bool,
    /// Node lists that differ from node to node: node `i` lists only these nodes.
    lists: HashMap<usize, Vec<usize>>,
    /// Nodes marked `leaving` in every node's list.
    leaving: HashSet<usize>,
    /// `cluster.handoff_interval_ms` (0: former owners keep what they stored).
    handoff_ms: u64,
    /// The route delivers to the tenants' own endpoints too.
    endpoints: bool,
}

impl Relay {
    fn new(nodes: usize, extra: &str) -> Relay {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        let sink = rt.block_on(TestSink::start());
        let root = tempfile::tempdir().unwrap();
        let mut r = Relay {
            rt,
            sink,
            root: root.path().to_owned(),
            _root: root,
            specs: Vec::new(),
            procs: Vec::new(),
            extra: extra.to_owned(),
            pull: false,
            lists: HashMap::new(),
            leaving: HashSet::new(),
            handoff_ms: 200,
            endpoints: false,
        };
        for _ in 0..nodes {
            r.add_spec();
        }
        r
    }

    fn add_spec(&mut self) {
        let i = self.specs.len();
        let dir = self.root.join(format!("relay-{i}"));
        std::fs::create_dir_all(&dir).unwrap();
        let (ingest, admin) = (free_port(), free_port());
        self.specs.push(Spec {
            name: format!("relay-{i}"),
            ingest,
            advertised_ingest: ingest,
            admin,
            advertised_admin: admin,
            dir,
        });
        self.procs.push(None);
    }

    /// Node `i`'s configuration with the current node list.
    fn spec(&self, i: usize) -> NodeBuilder {
        let s = &self.specs[i];
        let nodes: Vec<String> = self
            .specs
            .iter()
            .enumerate()
            .filter(|(j, _)| self.lists.get(&i).is_none_or(|l| l.contains(j)))
            .map(|(j, n)| {
                format!(
                    r#"{{ name: {}, ingest: "http://127.0.0.1:{}", admin: "http://127.0.0.1:{}", leaving: {} }}"#,
                    n.name,
                    n.advertised_ingest,
                    n.advertised_admin,
                    self.leaving.contains(&j)
                )
            })
            .collect();
        NodeBuilder::default()
            .ports(s.admin, s.ingest)
            .admin_token("it", ADMIN_TOKEN)
            .section("dispatch: { tick_interval_ms: 20 }")
            .section(&format!(
                r#"cluster:
  name: {}
  token: {{ value: "{CLUSTER_TOKEN}" }}
  forward_timeout_ms: 2000
  handoff_interval_ms: {}
  nodes: [{}]"#,
                s.name,
                self.handoff_ms,
                nodes.join(", ")
            ))
            .section(&self.extra)
            .sink_yaml(&format!(
                r#"{{ id: s, url: "{}", timeout_ms: 5000 }}"#,
                self.sink.url("/s")
            ))
            .sink_yaml("{ id: q, kind: pull }")
            .route_yaml(&format!(
                "{{ id: r, sinks: [{}], endpoints: {} }}",
                if self.pull { "s, q" } else { "s" },
                self.endpoints
            ))
            .source_yaml(&format!(
                r#"{{ id: gh, tenant: {{ header: x-tenant }}, verify: {{ scheme: github, secret: {{ value: "{GH_SECRET}" }} }}, tenant_binding: shared-secret, route: r }}"#
            ))
    }

    fn start(&mut self, i: usize) {
        let spec = self.spec(i);
        self.procs[i] = Some(Proc::start(&self.specs[i].dir, &spec));
    }

    fn start_all(&mut self) {
        for i in 0..self.specs.len() {
            self.start(i);
        }
    }

    fn kill9(&mut self, i: usize) {
        if let Some(mut p) = self.procs[i].take() {
            p.kill9();
        }
    }

    /// The index of the node that owns `tenant` under the current node list.
    fn owner(&self, tenant: &str) -> usize {
        ankusa_relay::cluster::owner_index(self.specs.iter().map(|s| s.name.as_str()), tenant)
    }

    fn ingest_url(&self, i: usize) -> String {
        format!("http://127.0.0.1:{}/ingest/gh", self.specs[i].ingest)
    }

    /// Sends a signed GitHub delivery to node `i`; a connection that gives no answer fails
    /// the test with every node's log.
    async fn send(&self, c: &Client, i: usize, tenant: &str, delivery: &str) -> Resp {
        match send_to(c, &self.ingest_url(i), tenant, delivery).await {
            Ok(r) => r,
            Err(e) => panic!(
                "node {i} gave no answer to {delivery} of {tenant}: {e}\n{}",
                self.logs()
            ),
        }
    }

    /// Sends `n` deliveries `<prefix>-<i>` of `tenant` to the nodes in turn, each acked
    /// (202); adds their ids to `acked`.
    fn send_acked(
        &self,
        c: &Client,
        tenant: &str,
        prefix: &str,
        n: usize,
        acked: &mut HashSet<String>,
    ) {
        self.rt.block_on(async {
            for i in 0..n {
                let d = format!("{prefix}-{i}");
                let a = self.send(c, i % self.specs.len(), tenant, &d).await;
                assert_eq!(a.status, 202, "{d}: {:?}", a.json());
                acked.insert(d);
            }
        });
    }

    /// The tail of every node's log.
    fn logs(&self) -> String {
        self.specs
            .iter()
            .map(|s| format!("--- {}\n{}", s.name, log_tail(&s.dir, 30)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// An admin GET on node `i`: status and JSON.
    fn admin_get(&self, i: usize, path: &str) -> (u16, serde_json::Value) {
        let (status, body) = http_get_auth_token(self.specs[i].admin, path, ADMIN).unwrap();
        (status, serde_json::from_str(&body).unwrap_or_default())
    }

    /// The deliveries the sink received, by `x-github-delivery`.
    fn delivered(&self) -> HashMap<String, usize> {
        deliveries_by_id(&self.sink, "/s")
    }

    /// Waits until the sink holds every one of `ids`, or panics after `within`.
    fn await_delivered(&self, ids: &HashSet<String>, within: Duration) -> HashMap<String, usize> {
        let deadline = Instant::now() + within;
        loop {
            let got = self.delivered();
            if ids.iter().all(|d| got.contains_key(d)) {
                return got;
            }
            assert!(
                Instant::now() < deadline,
                "{} of {} acked hooks never arrived",
                ids.iter().filter(|d| !got.contains_key(*d)).count(),
                ids.len()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// Sends a signed GitHub delivery to `url`.
async fn send_to(c: &Client, url: &str, tenant: &str, delivery: &str) -> Result<Resp, String> {
    let body = format!(r#"{{"delivery":"{delivery}","tenant":"{tenant}"}}"#);
    let sig = format!(
        "sha256={}",
        hex(&hmac_sha256(GH_SECRET.as_bytes(), &[body.as_bytes()]))
    );
    post_result(
        c,
        url,
        &[
            ("x-hub-signature-256", sig),
            ("x-github-delivery", delivery.to_owned()),
            ("x-github-event", "push".to_owned()),
            ("x-tenant", tenant.to_owned()),
        ],
        body,
    )
    .await
}

/// Tenant ids owned by each node: `per` for every node.
fn tenants_per_owner(r: &Relay, per: usize) -> Vec<Vec<String>> {
    let mut out = vec![Vec::new(); r.specs.len()];
    for t in 0.. {
        let id = format!("tenant-{t}");
        let o = r.owner(&id);
        if out[o].len() < per {
            out[o].push(id);
        }
        if out.iter().all(|v| v.len() >= per) {
            break;
        }
    }
    out
}

#[test]
fn the_same_github_delivery_sent_to_each_node_is_one_hook_delivered_once() {
    let mut r = Relay::new(3, "");
    r.start_all();
    let owned = tenants_per_owner(&r, 2);
    let c = client();
    let mut ids = HashSet::new();
    let mut hooks = Vec::new();
    r.rt.block_on(async {
        for (o, ts) in owned.iter().enumerate() {
            for t in ts {
                let delivery = format!("d-{t}");
                ids.insert(delivery.clone());
                let mut hook_ids = HashSet::new();
                for i in 0..3 {
                    let a = r.send(&c, i, t, &delivery).await;
                    let want = if hook_ids.is_empty() { 202 } else { 200 };
                    assert_eq!(
                        a.status,
                        want,
                        "node {i}, tenant {t} (owner {o}): {:?}",
                        a.json()
                    );
                    hook_ids.insert(a.json()["id"].as_str().unwrap().to_owned());
                }
                assert_eq!(
                    hook_ids.len(),
                    1,
                    "every node answered with the first hook's id"
                );
                hooks.extend(hook_ids.into_iter().map(|id| (o, id)));
            }
        }
    });
    let got = r.await_delivered(&ids, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    let got2 = r.delivered();
    assert_eq!(got, got2);
    assert!(
        got.values().all(|n| *n == 1),
        "delivered more than once: {got:?}"
    );

    // Node 1 forwarded the hooks of the tenants nodes 0 and 2 own.
    let (_, m) = http_get(r.specs[1].admin, "/metrics").unwrap();
    assert!(
        m.contains(r#"ankusa_cluster_forwards_total{kind="ingest",outcome="answered"} 4"#),
        "{m}"
    );
    assert!(m.contains(r#"outcome="forwarded"} 4"#), "{m}");

    // A tenant's counters live on its owner alone, and every node answers the same view.
    for (o, ts) in owned.iter().enumerate() {
        let t = &ts[0];
        let views: Vec<_> = (0..3)
            .map(|i| r.admin_get(i, &format!("/v1/tenants/{t}")))
            .collect();
        for (i, (status, v)) in views.iter().enumerate() {
            assert_eq!(*status, 200, "node {i}: {v}");
            assert_eq!(v, &views[0].1, "node {i} answers as node 0 does");
        }
        assert_eq!(views[0].1["tenant"], t.as_str(), "{}", views[0].1);
        for i in 0..3 {
            // Asked for its own view, only the owner knows the tenant.
            let own = local_get(&r, i, &format!("/v1/tenants/{t}"));
            assert_eq!(own == 200, i == o, "node {i}'s own view of {t} (owner {o})");
        }
    }
    // A hook is in its owner's log; any node answers for it.
    for (o, id) in &hooks {
        let path = format!("/v1/hooks/{id}");
        for i in 0..3 {
            let (status, v) = r.admin_get(i, &path);
            assert_eq!(status, 200, "node {i}, hook of node {o}: {v}");
            assert_eq!(v["id"], id.as_str());
            assert_eq!(v["sinks"][0]["state"], "delivered", "{v}");
            assert_eq!(
                local_get(&r, i, &path) == 200,
                i == *o,
                "node {i}'s own log"
            );
        }
    }
    assert_eq!(r.admin_get(1, "/v1/hooks/hk_nowhere").0, 404);
    // The relay-wide list counts each tenant once.
    let (status, all) = r.admin_get(2, "/v1/tenants?top=100");
    assert_eq!(status, 200, "{all}");
    assert_eq!(all["total"], 6, "{all}");
    assert_eq!(all["unavailable"].as_array().unwrap().len(), 0, "{all}");
}

/// A GET answered by the node it reaches (`ankusa-cluster-local`): its status.
fn local_get(r: &Relay, i: usize, path: &str) -> u16 {
    local_answer(r, i, path).0
}

/// A GET answered by the node it reaches: its status and JSON.
fn local_answer(r: &Relay, i: usize, path: &str) -> (u16, serde_json::Value) {
    let headers = [
        format!("Authorization: Bearer {ADMIN}"),
        "ankusa-cluster-local: 1".to_owned(),
    ];
    let (s, body) = http_raw(
        r.specs[i].admin,
        "GET",
        path,
        &headers,
        "",
        Duration::from_secs(5),
    )
    .unwrap();
    (s, serde_json::from_str(&body).unwrap_or_default())
}

#[test]
fn tenants_max_counts_tenants_relay_wide_whichever_node_a_hook_reaches() {
    let mut r = Relay::new(3, "tenants: { max: 10 }");
    r.start_all();
    let c = client();
    r.rt.block_on(async {
        for t in 0..10 {
            let a = r.send(&c, t % 3, &format!("t{t}"), &format!("d{t}")).await;
            assert_eq!(a.status, 202, "tenant {t}: {:?}", a.json());
        }
        for i in 0..3 {
            let a = r.send(&c, i, "t-eleventh", &format!("x{i}")).await;
            refused(&a, "tenant_limit", &format!("node {i}"));
            assert_eq!(a.headers["retry-after"], "300");
        }
        // The ten keep flowing, through any node.
        for t in 0..10 {
            let a = r
                .send(&c, (t + 1) % 3, &format!("t{t}"), &format!("e{t}"))
                .await;
            assert_eq!(a.status, 202, "tenant {t}: {:?}", a.json());
        }
    });
    let (_, all) = r.admin_get(1, "/v1/tenants");
    assert_eq!(all["total"], 10, "{all}");
}

#[test]
fn a_killed_owner_makes_only_its_tenants_wait_and_loses_no_acked_hook() {
    let mut r = Relay::new(3, "");
    r.start_all();
    let owned = tenants_per_owner(&r, 1);
    let victim = 2;
    let t = owned[victim][0].clone();
    let c = client();
    let mut acked = HashSet::new();
    r.send_acked(&c, &t, "before", 20, &mut acked);
    r.kill9(victim);
    r.rt.block_on(async {
        for i in 0..3 {
            if i == victim {
                continue;
            }
            let a = r.send(&c, i, &t, &format!("during-{i}")).await;
            assert_eq!(a.status, 503, "{:?}", a.json());
            assert_eq!(a.json()["error"], "owner_unavailable");
            assert!(a.headers.contains_key("retry-after"));
            // Other tenants are unaffected, whoever owns them.
            for (o, ts) in owned.iter().enumerate() {
                if o == victim {
                    continue;
                }
                let d = format!("other-{i}-{o}");
                let a = r.send(&c, i, &ts[0], &d).await;
                assert_eq!(a.status, 202, "{:?}", a.json());
                acked.insert(d);
            }
        }
        // The admin API says who did not answer, rather than answering for it.
        let v = r.admin_get(0, &format!("/v1/tenants/{t}"));
        assert_eq!(v.0, 503, "{}", v.1);
        assert_eq!(v.1["error"], "owner_unavailable");
    });
    r.start(victim);
    r.send_acked(&c, &t, "after", 10, &mut acked);
    let got = r.await_delivered(&acked, Duration::from_secs(60));
    // At least once: a delivery the kill cut short is sent again after the restart; no
    // other hook is delivered twice.
    let twice: Vec<_> = got
        .iter()
        .filter(|(d, n)| **n > 1 && !d.starts_with("before-"))
        .collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
}

#[test]
fn scaling_from_three_to_four_nodes_moves_a_quarter_of_the_tenants_and_loses_nothing() {
    let mut r = Relay::new(3, "");
    r.start_all();
    let tenants: Vec<String> = (0..40).map(|t| format!("scale-{t}")).collect();
    let before: Vec<usize> = tenants.iter().map(|t| r.owner(t)).collect();
    // The fourth node's ports are known now; until it runs, a hook sent to it is sent to
    // another node (a provider retries).
    r.add_spec();
    let urls: Vec<String> = (0..4).map(|i| r.ingest_url(i)).collect();
    let acked = Arc::new(Mutex::new(HashSet::new()));
    let stop = Arc::new(AtomicBool::new(false));
    // Hooks keep arriving before, during and after the change, one sender per tenant; a
    // refused hook is sent again until accepted (as a provider does), so every delivery id
    // is acked exactly once in the end. A tenant whose owner is down waits; others flow.
    let senders: Vec<_> = tenants
        .iter()
        .enumerate()
        .map(|(k, t)| {
            let (acked, stop, t, urls) = (acked.clone(), stop.clone(), t.clone(), urls.clone());
            r.rt.spawn(async move {
                let c = client();
                let mut seq = k;
                while !stop.load(Ordering::Relaxed) {
                    let d = format!("{t}-{seq}");
                    let since = Instant::now();
                    for tries in 0.. {
                        let url = &urls[(seq + tries) % urls.len()];
                        match send_to(&c, url, &t, &d).await {
                            Ok(a) if a.status == 202 || a.status == 200 => {
                                acked.lock().unwrap().insert(d);
                                break;
                            }
                            a => assert!(
                                since.elapsed() < Duration::from_secs(60),
                                "{d} was never accepted: {:?}",
                                a.map(|a| (a.status, a.json()))
                            ),
                        }
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                    seq += 1;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        })
        .collect();
    let wait_for_more = |n: usize| {
        let from = acked.lock().unwrap().len();
        while acked.lock().unwrap().len() < from + n {
            assert!(senders.iter().all(|s| !s.is_finished()), "a sender stopped");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    wait_for_more(80);
    // The fourth node starts with the four-node list, then the others restart with it, one
    // at a time (a StatefulSet's rolling update), while hooks keep arriving.
    r.start(3);
    wait_for_more(40);
    for i in 0..3 {
        if let Some(mut p) = r.procs[i].take() {
            p.stop(Duration::from_secs(60));
        }
        wait_for_more(20);
        r.start(i);
        wait_for_more(40);
    }
    wait_for_more(80);
    stop.store(true, Ordering::Relaxed);
    for s in senders {
        r.rt.block_on(s).unwrap();
    }
    let acked = acked.lock().unwrap().clone();

    let after: Vec<usize> = tenants.iter().map(|t| r.owner(t)).collect();
    let moved: Vec<_> = (0..tenants.len())
        .filter(|&i| before[i] != after[i])
        .collect();
    assert!(
        moved.iter().all(|&i| after[i] == 3),
        "only tenants the new node owns move"
    );
    assert!(
        (4..=18).contains(&moved.len()),
        "about a quarter of 40 tenants moved: {}",
        moved.len()
    );
    let got = r.await_delivered(&acked, Duration::from_secs(60));
    std::thread::sleep(Duration::from_millis(500));
    let dup: Vec<_> = r.delivered().into_iter().filter(|(_, n)| *n > 1).collect();
    assert!(dup.is_empty(), "delivered twice: {dup:?}");
    assert_eq!(got.len(), acked.len());
    // The new node took the hooks of the tenants that moved to it.
    let (_, all) = r.admin_get(3, "/v1/tenants");
    let owned3 = all["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["node"] == "relay-3")
        .unwrap()["owned"]
        .as_u64()
        .unwrap();
    assert_eq!(owned3 as usize, moved.len(), "{all}");
}

/// `ankusa-node-auth` for a request node `node` sends to `path` with `body`, signed with
/// `secret` at `t_ms`.
fn node_signed(
    secret: &str,
    node: &str,
    path: &str,
    body: &str,
    t_ms: u64,
) -> (&'static str, String) {
    let v = ankusa_verify::node::NodeAuth::new(secret.as_bytes(), node).sign(
        &hyper::Method::POST,
        path,
        body.as_bytes(),
        t_ms,
    );
    (
        ankusa_verify::node::AUTH_HEADER,
        v.to_str().unwrap().to_owned(),
    )
}

/// Node identity through the real listeners: a request signed with another secret, a
/// signed one sent again (a replay), one signed too long ago and one whose body is not the
/// signed one are refused (401 `node_unauthorized`, nothing kept); the static header of
/// older releases is nothing, and a provider's request that says it was forwarded loses
/// the mark at the edge and is routed like any other; the tenant registry's doors want a
/// node's signature, which no admin token stands for.
#[test]
fn a_request_not_signed_by_a_node_of_the_relay_is_refused_and_a_replay_too() {
    let mut r = Relay::new(2, "");
    r.start_all();
    let c = client();
    r.rt.block_on(async {
        let body = "{}";
        let sig = format!(
            "sha256={}",
            hex(&hmac_sha256(GH_SECRET.as_bytes(), &[body.as_bytes()]))
        );
        let hook = |extra: Vec<(&'static str, String)>| {
            let mut h = vec![
                ("x-hub-signature-256", sig.clone()),
                ("x-tenant", "t".to_owned()),
                ("ankusa-forwarded-by", "relay-1".to_owned()),
            ];
            h.extend(extra);
            h
        };
        let now = ankusa_keyspace::now_ms();
        let refused = |a: &Resp, why: &str| {
            assert_eq!(a.status, 401, "{:?}", a.json());
            assert_eq!(a.json()["error"], "node_unauthorized", "{:?}", a.json());
            assert!(
                a.json()["message"].as_str().unwrap().contains(why),
                "{:?}",
                a.json()
            );
        };
        let other_secret = node_signed(
            "another-secret-0123456789",
            "relay-1",
            "/ingest/gh",
            body,
            now,
        );
        refused(
            &post(&c, &r.ingest_url(0), &hook(vec![other_secret]), body).await,
            "does not match",
        );
        let stale = node_signed(CLUSTER_TOKEN, "relay-1", "/ingest/gh", body, now - 120_000);
        refused(
            &post(&c, &r.ingest_url(0), &hook(vec![stale]), body).await,
            "from this node's clock",
        );
        let other_body = node_signed(CLUSTER_TOKEN, "relay-1", "/ingest/gh", r#"{"x":1}"#, now);
        refused(
            &post(&c, &r.ingest_url(0), &hook(vec![other_body]), body).await,
            "digest",
        );
        // A node's request, taken once; the same bytes again are a replay.
        let good = node_signed(CLUSTER_TOKEN, "relay-1", "/ingest/gh", body, now);
        let a = post(&c, &r.ingest_url(0), &hook(vec![good.clone()]), body).await;
        assert_eq!(a.status, 202, "{:?}", a.json());
        refused(
            &post(&c, &r.ingest_url(0), &hook(vec![good]), body).await,
            "seen before",
        );
        // The older releases' static header proves nothing: the mark is dropped at the
        // edge and the hook is routed to its owner like a provider's.
        let forwards = |i: usize| {
            let (_, m) = http_get(r.specs[i].admin, "/metrics").unwrap();
            ankusa_relay::testkit::metric(
                &m,
                r#"ankusa_cluster_forwards_total{kind="ingest",outcome="answered"}"#,
            )
            .unwrap_or(0.0)
        };
        let owner = r.owner("t");
        let before = forwards(1 - owner);
        let a = post(
            &c,
            &r.ingest_url(1 - owner),
            &hook(vec![("ankusa-cluster-token", CLUSTER_TOKEN.to_owned())]),
            body,
        )
        .await;
        assert_eq!(a.status, 202, "{:?}", a.json());
        assert_eq!(
            forwards(1 - owner),
            before + 1.0,
            "the hook was not sent to its owner"
        );
        // The tenant registry's doors want a node's signature.
        let a = post(
            &c,
            &format!(
                "http://127.0.0.1:{}/cluster/v1/slots/lend",
                r.specs[0].admin
            ),
            &[("content-type", "application/json".to_owned())],
            r#"{"to":"relay-1","want":1000}"#,
        )
        .await;
        assert_eq!(a.status, 401, "{:?}", a.json());
        let (status, _) =
            http_get_auth_token(r.specs[0].admin, "/cluster/v1/slots", ADMIN).unwrap();
        assert_eq!(status, 401, "an admin token is not a node's signature");
        // Nothing of these requests is in either quarantine.
        for i in 0..2 {
            let (_, q) = r.admin_get(i, "/v1/quarantine");
            assert_eq!(q["items"].as_array().map_or(0, Vec::len), 0, "{q}");
        }
    });
}

#[test]
fn a_tenants_view_dlq_replay_and_purge_add_up_what_a_former_owner_still_holds() {
    let mut r = Relay::new(2, "");
    // The former owner keeps its rows (no handoff), as while a handoff has not reached them.
    r.handoff_ms = 0;
    r.sink
        .default_status
        .store(400, std::sync::atomic::Ordering::Relaxed);
    r.start_all();
    let t = tenants_per_owner(&r, 1)[1][0].clone();
    let c = client();
    r.rt.block_on(async {
        // One hook through the owner, one kept by node 0 as a hook forwarded to it is (a
        // former owner's rows, as after a change of the node list).
        assert_eq!(r.send(&c, 1, &t, "d-owner").await.status, 202);
        let body = r#"{"former":true}"#;
        let sig = format!(
            "sha256={}",
            hex(&hmac_sha256(GH_SECRET.as_bytes(), &[body.as_bytes()]))
        );
        let a = post(
            &c,
            &r.ingest_url(0),
            &[
                ("x-hub-signature-256", sig),
                ("x-github-delivery", "d-former".to_owned()),
                ("x-tenant", t.clone()),
                ("ankusa-forwarded-by", "relay-1".to_owned()),
                node_signed(
                    CLUSTER_TOKEN,
                    "relay-1",
                    "/ingest/gh",
                    body,
                    ankusa_keyspace::now_ms(),
                ),
            ],
            body,
        )
        .await;
        assert_eq!(a.status, 202, "{:?}", a.json());
    });
    // Both are dead-lettered (the sink answers 400).
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = r.admin_get(0, &format!("/v1/tenants/{t}"));
        if v["counters"]["dead"] == 2 {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        std::thread::sleep(Duration::from_millis(50));
    }
    let views: Vec<_> = (0..2)
        .map(|i| r.admin_get(i, &format!("/v1/tenants/{t}")).1)
        .collect();
    assert_eq!(views[0], views[1]);
    assert_eq!(local_get(&r, 0, &format!("/v1/tenants/{t}")), 200);
    let dead_again = || {
        let deadline = Instant::now() + Duration::from_secs(20);
        while r.admin_get(1, &format!("/v1/tenants/{t}")).1["counters"]["dead"] != 2 {
            assert!(Instant::now() < deadline);
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    // The tenant's DLQ from any node: both rows, a page at a time, ids naming their node.
    let mut ids = Vec::new();
    let mut before = String::new();
    for page in 0.. {
        assert!(page < 4, "the pages never ended");
        let q = if before.is_empty() {
            format!("/v1/dlq?tenant={t}&limit=1")
        } else {
            format!("/v1/dlq?tenant={t}&limit=1&before={before}")
        };
        let (status, v) = r.admin_get(1, &q);
        assert_eq!(status, 200, "{v}");
        for it in v["items"].as_array().unwrap() {
            ids.push(it["id"].as_str().unwrap().to_owned());
        }
        match v["next"].as_str() {
            Some(n) => before = n.to_owned(),
            None => break,
        }
    }
    let mut nodes: Vec<_> = ids.iter().map(|i| i.split('/').next().unwrap()).collect();
    nodes.sort();
    assert_eq!(nodes, ["relay-0", "relay-1"], "{ids:?}");
    let replay = |body: String| {
        r.rt.block_on(async {
            let url = format!("http://127.0.0.1:{}/v1/dlq/replay", r.specs[0].admin);
            let a = post(
                &c,
                &url,
                &[
                    ("authorization", format!("Bearer {ADMIN}")),
                    ("content-type", "application/json".to_owned()),
                ],
                body,
            )
            .await;
            assert_eq!(a.status, 200, "{:?}", a.json());
            a.json()
        })
    };
    // Replayed by those ids, from a node that holds one of them.
    let a = replay(serde_json::json!({ "ids": ids }).to_string());
    assert_eq!(a["revived"], 2, "{a}");
    // Dead again (the sink still answers 400): now by tenant.
    dead_again();
    let a = replay(format!(r#"{{"tenant":"{t}"}}"#));
    assert_eq!(a["revived"], 2, "{a}");
    // Dead again; purge both from node 1.
    dead_again();
    let (status, body) = http_admin(
        r.specs[1].admin,
        "DELETE",
        &format!("/v1/tenants/{t}/queue?kinds=pending,dead"),
        "",
        Duration::from_secs(30),
    )
    .unwrap();
    let body: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["dead"], 2, "{body}");
    let (_, v) = r.admin_get(1, &format!("/v1/tenants/{t}"));
    assert_eq!(v["counters"]["dead"], 0, "{v}");
}

/// `a` is a 503 with the error `code` and a `Retry-After` (`whom` names the request).
fn refused(a: &Resp, code: &str, whom: &str) {
    assert_eq!(a.status, 503, "{whom}: {:?}", a.json());
    assert_eq!(a.json()["error"], code, "{whom}: {:?}", a.json());
    assert!(
        a.headers.contains_key("retry-after"),
        "{whom}: {:?}",
        a.headers
    );
}

/// The tenants of node `i`'s registry and its slots, from its `/v1/node`.
fn slots_of(r: &Relay, i: usize) -> (u64, u64) {
    let (_, v) = r.admin_get(i, "/v1/node");
    let c = &v["cluster"];
    (
        c["tenants_registered"]
            .as_u64()
            .unwrap_or_else(|| panic!("{v}")),
        c["tenant_slots"].as_u64().unwrap_or_else(|| panic!("{v}")),
    )
}

/// Fresh tenant ids owned by one of `owners`, in turn, starting at `tenant-<from>`.
fn new_tenants(r: &Relay, owners: &[usize], from: usize, n: usize) -> Vec<String> {
    (from..)
        .map(|t| format!("tenant-{t}"))
        .filter(|t| owners.contains(&r.owner(t)))
        .take(n)
        .collect()
}

#[test]
fn with_any_node_down_the_others_admit_new_tenants_and_never_past_tenants_max() {
    let mut r = Relay::new(3, "tenants: { max: 9 }");
    r.start_all();
    for i in 0..3 {
        assert_eq!(slots_of(&r, i), (0, 3), "node {i}: a third of tenants.max");
    }
    let known = new_tenants(&r, &[1], 0, 1).remove(0);
    let c = client();
    r.rt.block_on(async {
        assert_eq!(r.send(&c, 1, &known, "k-1").await.status, 202);
    });
    // The first node goes down, and node 1 restarts: its store still holds `known`.
    r.kill9(0);
    r.kill9(1);
    r.start(1);
    assert_eq!(slots_of(&r, 1), (1, 3), "counted from its store");
    let fresh = new_tenants(&r, &[1, 2], 1_000, 6);
    r.rt.block_on(async {
        let a = r.send(&c, 2, &known, "k-2").await;
        assert_eq!(a.status, 202, "a tenant the owner stores: {:?}", a.json());
        // Nodes 1 and 2 hold six slots, one taken: five new tenants get in, lending to
        // each other as one runs out, through either node.
        for (k, t) in fresh[..5].iter().enumerate() {
            let a = r.send(&c, k % 2 + 1, t, &format!("n-{k}")).await;
            assert_eq!(a.status, 202, "{t}: {:?}", a.json());
        }
        // The sixth: none free on nodes 1 and 2, and node 0, which may have some, does
        // not answer.
        let a = r.send(&c, 1, &fresh[5], "n-5").await;
        refused(&a, "registry_unavailable", "a new tenant");
        assert_eq!(a.headers["retry-after"], "5");
    });
    let held = |r: &Relay, nodes: &[usize]| -> (u64, u64) {
        nodes
            .iter()
            .map(|&i| slots_of(r, i))
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    };
    assert_eq!(held(&r, &[1, 2]), (6, 6), "{}", r.logs());
    // Node 0 back: it lends, and the sixth gets in; then the Relay fills to nine.
    r.start(0);
    let more = new_tenants(&r, &[0, 1, 2], 2_000, 3);
    r.rt.block_on(async {
        let a = r.send(&c, 2, &fresh[5], "n-5").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
        for (k, t) in more[..2].iter().enumerate() {
            let a = r.send(&c, k % 3, t, &format!("m-{k}")).await;
            assert_eq!(a.status, 202, "{t}: {:?}", a.json());
        }
        // The tenth is refused on every node, whichever node owns it.
        for (k, t) in new_tenants(&r, &[0, 1, 2], 3_000, 3).iter().enumerate() {
            for i in 0..3 {
                let a = r.send(&c, i, t, &format!("x-{k}-{i}")).await;
                refused(&a, "tenant_limit", &format!("{t} at node {i}"));
            }
        }
    });
    assert_eq!(held(&r, &[0, 1, 2]), (9, 9));
    let (_, all) = r.admin_get(2, "/v1/tenants");
    assert_eq!(all["total"], 9, "{all}");
}

#[test]
fn a_loan_whose_answer_was_cut_arrives_with_the_next_and_no_slot_is_in_two_places() {
    let mut r = Relay::new(2, "tenants: { max: 4 }");
    let faults = Arc::new(Faults::default());
    // Node 1 reaches node 0's admin listener only through the proxy.
    let proxy = faulty_link(&r.rt, r.specs[0].admin, faults.clone());
    r.specs[0].advertised_admin = proxy;
    r.start_all();
    let ones = new_tenants(&r, &[1], 0, 3);
    let zeros = new_tenants(&r, &[0], 0, 2);
    let c = client();
    r.rt.block_on(async {
        for (k, t) in ones[..2].iter().enumerate() {
            assert_eq!(r.send(&c, 1, t, &format!("a-{k}")).await.status, 202);
        }
        // Node 1 is out of slots: it asks node 0 whether it stores the tenant, then for a
        // loan; node 0 lends one, and both answers are cut.
        faults.cut.store(2, Ordering::SeqCst);
        let a = r.send(&c, 1, &ones[2], "a-2").await;
        refused(&a, "registry_unavailable", "a new tenant");
        assert_eq!(faults.cut.load(Ordering::SeqCst), 0, "two answers were cut");
    });
    // The slot is with neither node: lent by 0, not heard by 1.
    assert_eq!(slots_of(&r, 0), (0, 1));
    assert_eq!(slots_of(&r, 1), (2, 2));
    r.rt.block_on(async {
        // The provider retries: the next loan's total carries the lost one too.
        let a = r.send(&c, 0, &ones[2], "a-2").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
    });
    assert_eq!(slots_of(&r, 0), (0, 0));
    assert_eq!(slots_of(&r, 1), (3, 4), "one slot free");
    r.rt.block_on(async {
        // Node 0 borrows the last slot back, and the Relay is full.
        let a = r.send(&c, 1, &zeros[0], "z-0").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
        for i in 0..2 {
            let a = r.send(&c, i, &zeros[1], &format!("z-1-{i}")).await;
            refused(&a, "tenant_limit", "a new tenant");
        }
    });
    let (_, all) = r.admin_get(0, "/v1/tenants");
    assert_eq!(all["total"], 4, "{all}");
}

#[test]
fn a_node_whose_volume_is_lost_learns_what_it_lent_and_the_relay_stays_within_tenants_max() {
    let mut r = Relay::new(2, "tenants: { max: 4 }");
    r.start_all();
    let ones = new_tenants(&r, &[1], 0, 4);
    let zero = new_tenants(&r, &[0], 0, 1).remove(0);
    let c = client();
    r.rt.block_on(async {
        // Node 1 takes all four slots: its two and two lent by node 0.
        for (k, t) in ones.iter().enumerate() {
            let a = r.send(&c, 0, t, &format!("o-{k}")).await;
            assert_eq!(a.status, 202, "{t}: {:?}", a.json());
        }
    });
    assert_eq!(slots_of(&r, 0), (0, 0));
    // Node 0's volume is lost; it starts on an empty one.
    r.kill9(0);
    std::fs::remove_dir_all(r.specs[0].dir.join("db")).unwrap();
    r.start(0);
    // It learns from node 1 what it lent (at start, in the background).
    let deadline = Instant::now() + Duration::from_secs(20);
    while slots_of(&r, 0) != (0, 0) {
        assert!(Instant::now() < deadline, "{}", r.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    r.rt.block_on(async {
        let a = r.send(&c, 0, &zero, "z").await;
        refused(&a, "tenant_limit", "a new tenant");
    });
    let (_, all) = r.admin_get(1, "/v1/tenants");
    assert_eq!(all["total"], 4, "{all}");
}

#[test]
fn after_a_node_joins_a_full_relay_moved_tenants_are_never_refused_and_the_relay_stays_within_its_bound(
) {
    let mut r = Relay::new(2, "tenants: { max: 4 }");
    r.start_all();
    // Two tenants that move to the third node when it joins, two that stay.
    let three = ["relay-0", "relay-1", "relay-2"];
    let owner3 = |t: &str| ankusa_relay::cluster::owner_index(three.into_iter(), t);
    let (mut moving, mut staying) = (Vec::new(), Vec::new());
    for t in (0..).map(|k| format!("tenant-{k}")) {
        match owner3(&t) {
            2 if moving.len() < 2 => moving.push(t),
            0 | 1 if staying.len() < 2 => staying.push(t),
            _ => {}
        }
        if moving.len() == 2 && staying.len() == 2 {
            break;
        }
    }
    let newcomers: Vec<String> = (0..)
        .map(|k| format!("newcomer-{k}"))
        .filter(|t| owner3(t) == 2)
        .take(2)
        .collect();
    let c = client();
    r.rt.block_on(async {
        for (k, t) in moving.iter().chain(&staying).enumerate() {
            let a = r.send(&c, k % 2, t, &format!("a-{k}")).await;
            assert_eq!(a.status, 202, "{t}: {:?}", a.json());
        }
    });
    // The third node joins; the first two restart on the new list (shares 2 + 1 + 1).
    // Each counts the tenants it stores and still owns: the two that moved count at the
    // newcomer once they send again.
    r.add_spec();
    r.start(2);
    for i in [1, 0] {
        r.kill9(i);
        r.start(i);
    }
    let registered = |r: &Relay| (0..3).map(|i| slots_of(r, i).0).sum::<u64>();
    assert_eq!(registered(&r), 2);
    r.rt.block_on(async {
        // While the moved tenants are silent, their slots are free: a new tenant takes one
        // (the stated bound: at most the tenants that moved and have not sent since).
        let a = r.send(&c, 0, &newcomers[0], "n-0").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
        // The moved tenants send again: the first takes the last free slot, the second —
        // none free anywhere — is taken all the same: another node stores it.
        for (k, t) in moving.iter().enumerate() {
            let a = r.send(&c, k % 3, t, &format!("b-{k}")).await;
            assert_eq!(a.status, 202, "{t}: {:?}", a.json());
        }
        for (k, t) in staying.iter().enumerate() {
            let a = r.send(&c, k % 3, t, &format!("c-{k}")).await;
            assert_eq!(a.status, 202, "{t}: {:?}", a.json());
        }
        // Full, and one past: no other new tenant, wherever it lands.
        for i in 0..3 {
            let a = r.send(&c, i, &newcomers[1], &format!("n-1-{i}")).await;
            refused(&a, "tenant_limit", "a new tenant");
        }
    });
    assert_eq!(
        registered(&r),
        5,
        "tenants.max and the one moved tenant it took back"
    );
}

/// A tenant's limits set through a node that does not own it are made on every node and
/// enforced by the owner, whichever node a hook reaches; reading them anywhere gives the
/// owner's refusals.
#[test]
fn a_tenants_limits_set_at_any_node_are_enforced_by_its_owner() {
    let mut r = Relay::new(2, "");
    r.start_all();
    let t = tenants_per_owner(&r, 1)[1][0].clone();
    let path = format!("/v1/tenants/{t}/limits");
    let body = r#"{"ingest_per_second": 0.01, "ingest_burst": 2}"#;
    let (s, v) = http_admin(r.specs[0].admin, "PUT", &path, body, Duration::from_secs(5)).unwrap();
    assert_eq!(s, 200, "{v}");
    let v: serde_json::Value = serde_json::from_str(&v).unwrap();
    assert_eq!(v["changed"], 2, "made on both nodes: {v}");
    // Each node holds them (its own answer).
    for i in 0..2 {
        let (_, own) = local_answer(&r, i, &path);
        assert_eq!(own["effective"]["ingest_burst"], 2, "node {i}: {own}");
    }
    let c = client();
    let statuses: Vec<u16> = r.rt.block_on(async {
        let mut out = Vec::new();
        for (k, node) in [0, 1, 0, 1].into_iter().enumerate() {
            out.push(r.send(&c, node, &t, &format!("d-limit-{k}")).await.status);
        }
        out
    });
    assert_eq!(statuses, [202, 202, 429, 429], "one bucket, on the owner");
    let (_, v) = r.admin_get(0, &path);
    assert_eq!(
        v["refused"], 2,
        "the owner's refusals, asked at node 0: {v}"
    );
    let (_, node) = r.admin_get(1, "/v1/node");
    assert_eq!(node["tenants_over_quota"], 1, "{node}");
}

/// An erase asked of a node that does not own the tenant reaches its owner (202, changed
/// 1), takes the limits set for its id on every node with it, and the tenant is then gone
/// whichever node is asked.
#[test]
fn an_erase_asked_at_any_node_erases_the_tenant_on_its_owner() {
    let mut r = Relay::new(2, "");
    r.start_all();
    let t = tenants_per_owner(&r, 1)[1][0].clone();
    let c = client();
    r.rt.block_on(async {
        for k in 0..3 {
            assert_eq!(r.send(&c, 0, &t, &format!("d-erase-{k}")).await.status, 202);
        }
    });
    let limits = format!("/v1/tenants/{t}/limits");
    let wait = Duration::from_secs(5);
    let (s, _) = http_admin(
        r.specs[0].admin,
        "PUT",
        &limits,
        r#"{"queued_bytes": 1000000}"#,
        wait,
    )
    .unwrap();
    assert_eq!(s, 200);
    let erase = format!("/v1/tenants/{t}?confirm={t}");
    let (s, v) = http_admin(r.specs[0].admin, "DELETE", &erase, "", wait).unwrap();
    let v: serde_json::Value = serde_json::from_str(&v).unwrap();
    assert_eq!((s, v["changed"].as_u64()), (202, Some(1)), "{v}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.admin_get(0, &format!("/v1/tenants/{t}")).0 != 404 {
        assert!(Instant::now() < deadline, "the erase never ended");
        std::thread::sleep(Duration::from_millis(50));
    }
    // Its limits are gone on both nodes.
    for i in 0..2 {
        let (_, own) = local_answer(&r, i, &limits);
        assert!(own.get("overrides").is_none(), "node {i}: {own}");
    }
}

const CONSUMER: &str = "cluster-pull-consumer-0123456";
const SCOPED: &str = "cluster-pull-scoped-0123456789";

/// A pull call to node `i`'s ingest listener: status and JSON.
fn pull_call(
    r: &Relay,
    i: usize,
    path: &str,
    token: &str,
    body: serde_json::Value,
) -> (u16, serde_json::Value) {
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], r.specs[i].ingest).into();
    r.rt.block_on(admin_call(addr, "POST", path, token, &body.to_string()))
}

/// Claims at node `i` until `n` hooks came.
fn pull_n(r: &Relay, i: usize, token: &str, n: usize) -> Vec<serde_json::Value> {
    let mut got = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < n {
        assert!(
            Instant::now() < deadline,
            "{} of {n} hooks came\n{}",
            got.len(),
            r.logs()
        );
        let (s, v) = pull_call(
            r,
            i,
            "/pull/q/claim",
            token,
            serde_json::json!({ "max": n - got.len(), "wait_ms": 1000 }),
        );
        assert_eq!(s, 200, "{v}");
        got.extend(v["hooks"].as_array().unwrap().iter().cloned());
    }
    got
}

fn lease_ids(hooks: &[serde_json::Value]) -> Vec<String> {
    hooks
        .iter()
        .map(|h| h["lease"].as_str().unwrap().to_owned())
        .collect()
}

#[test]
fn a_claim_at_any_node_gathers_from_every_owner_and_acks_reach_the_node_that_leased() {
    let mut r = Relay::new(
        3,
        &format!(
            r#"pull:
  consumers:
    - {{ name: all, secret: {{ value: "{CONSUMER}" }}, sinks: [q] }}
    - {{ name: one, secret: {{ value: "{SCOPED}" }}, sinks: [q], tenants: [TENANT] }}"#
        ),
    );
    r.pull = true;
    let owned = tenants_per_owner(&r, 2);
    // The scoped consumer's tenant is one node 0 owns.
    r.extra = r.extra.replace("TENANT", &owned[0][0]);
    r.start_all();
    let c = client();
    for (o, tenants) in owned.iter().enumerate() {
        for t in tenants {
            let resp = r.rt.block_on(r.send(&c, (o + 1) % 3, t, &format!("d-{t}")));
            assert_eq!(resp.status, 202);
        }
    }
    // A claim at node 1 gathers the six hooks from their three owners.
    let hooks = pull_n(&r, 1, CONSUMER, 6);
    let mut tenants: Vec<&str> = hooks
        .iter()
        .map(|h| h["tenant"].as_str().unwrap())
        .collect();
    tenants.sort();
    let mut want: Vec<&str> = owned.iter().flatten().map(String::as_str).collect();
    want.sort();
    assert_eq!(tenants, want);
    for h in &hooks {
        let owner = r.owner(h["tenant"].as_str().unwrap());
        let lease = h["lease"].as_str().unwrap();
        assert!(lease.starts_with(&format!("relay-{owner}~")), "{lease}");
    }
    // Acked at node 2: each lease settles on its node.
    let (s, v) = pull_call(
        &r,
        2,
        "/pull/q/ack",
        CONSUMER,
        serde_json::json!({ "leases": lease_ids(&hooks) }),
    );
    assert_eq!((s, v["settled"].as_u64()), (200, Some(6)), "{v}");
    let (s, v) = pull_call(
        &r,
        0,
        "/pull/q/claim",
        CONSUMER,
        serde_json::json!({ "wait_ms": 300 }),
    );
    assert_eq!(
        (s, v["hooks"].as_array().map(Vec::len)),
        (200, Some(0)),
        "{v}"
    );
    for i in 0..3 {
        let (_, node) = r.admin_get(i, "/v1/node");
        assert_eq!(node["counters"]["inflight"], 0, "node {i}: {node}");
    }

    // A tenant's consumer, at a node that does not own its tenant, gets its hooks.
    let t = owned[0][0].clone();
    let resp = r.rt.block_on(r.send(&c, 2, &t, "d-scoped"));
    assert_eq!(resp.status, 202);
    let mine = pull_n(&r, 2, SCOPED, 1);
    assert_eq!(mine[0]["tenant"].as_str(), Some(t.as_str()));
    // Its owner down, the lease cannot be settled elsewhere: 409, unavailable.
    r.kill9(0);
    let (s, v) = pull_call(
        &r,
        1,
        "/pull/q/ack",
        SCOPED,
        serde_json::json!({ "leases": lease_ids(&mine) }),
    );
    assert_eq!(
        (s, v["conflicts"][0]["reason"].as_str()),
        (409, Some("unavailable")),
        "{v}"
    );
    // Back up, the lease outlived the kill: the ack settles.
    r.start(0);
    let (s, v) = pull_call(
        &r,
        1,
        "/pull/q/ack",
        SCOPED,
        serde_json::json!({ "leases": lease_ids(&mine) }),
    );
    assert_eq!((s, v["settled"].as_u64()), (200, Some(1)), "{v}");
}

/// A console request to node `port`'s admin listener: status, response head, body.
fn console_request(
    port: u16,
    method: &str,
    path: &str,
    cookie: &str,
    form: &str,
) -> (u16, String, String) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut head =
        format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n");
    if !cookie.is_empty() {
        head.push_str(&format!("Cookie: {cookie}\r\n"));
    }
    if method == "POST" {
        head.push_str(&format!(
            "Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n",
            form.len()
        ));
    }
    write!(s, "{head}\r\n{form}").unwrap();
    let mut resp = String::new();
    s.read_to_string(&mut resp).unwrap();
    let (h, b) = resp.split_once("\r\n\r\n").unwrap_or((&resp, ""));
    let status = h
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, h.to_owned(), b.to_owned())
}

#[test]
fn the_console_at_any_node_shows_the_whole_relay_and_replays_a_tenant_another_node_owns() {
    let mut r = Relay::new(3, "");
    r.sink.default_status.store(400, Ordering::Relaxed);
    r.start_all();
    let t = tenants_per_owner(&r, 1)[2][0].clone();
    let c = client();
    // Sent to node 0, stored and dead-lettered by its owner, node 2.
    let id = r.rt.block_on(async {
        let a = r.send(&c, 0, &t, "d-console").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
        a.json()["id"].as_str().unwrap().to_owned()
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.admin_get(2, &format!("/v1/tenants/{t}")).1["counters"]["dead"] != 1 {
        assert!(Instant::now() < deadline, "{}", r.logs());
        std::thread::sleep(Duration::from_millis(50));
    }
    let port = r.specs[0].admin;
    let (s, head, _) = console_request(
        port,
        "POST",
        "/ui/login",
        "",
        &format!("token={ADMIN_TOKEN}"),
    );
    assert_eq!(s, 303, "{head}");
    let cookie = head
        .lines()
        .find_map(|l| l.strip_prefix("set-cookie: "))
        .and_then(|v| v.split(';').next())
        .unwrap()
        .to_owned();
    // The overview names every node, each serving.
    let (s, _, overview) = console_request(port, "GET", "/ui/", &cookie, "");
    assert_eq!(s, 200);
    for n in ["relay-0", "relay-1", "relay-2"] {
        assert!(overview.contains(&format!("<td>{n}</td>")), "{overview}");
    }
    assert_eq!(overview.matches(">serving<").count(), 3, "{overview}");
    // The tenant another node owns: its counters, its dead letter, its hook.
    let (s, _, page) = console_request(port, "GET", &format!("/ui/tenants/{t}"), &cookie, "");
    assert_eq!(s, 200, "{page}");
    assert!(page.contains("<dt>Dead</dt><dd>1</dd>"), "{page}");
    assert!(
        page.contains(&id),
        "its dead letter and its recent hook: {page}"
    );
    let (s, _, hook) = console_request(port, "GET", &format!("/ui/hooks/{id}"), &cookie, "");
    assert_eq!(s, 200, "{hook}");
    assert!(hook.contains("dead"), "{hook}");
    // Replayed from node 0: the owner revives it and delivers it.
    let at = page.find("name=\"csrf\" value=\"").unwrap() + 19;
    let csrf = page[at..].split('"').next().unwrap().to_owned();
    r.sink.default_status.store(200, Ordering::Relaxed);
    let (s, _, done) = console_request(
        port,
        "POST",
        "/ui/dlq/replay",
        &cookie,
        &format!("tenant={t}&confirm=yes&csrf={csrf}"),
    );
    assert_eq!(s, 200, "{done}");
    assert!(done.contains("1 dead row moved back"), "{done}");
    let deadline = Instant::now() + Duration::from_secs(20);
    while r.admin_get(2, &format!("/v1/tenants/{t}")).1["counters"]["dead"] != 0
        || r.delivered().get("d-console") != Some(&2)
    {
        assert!(
            Instant::now() < deadline,
            "{:?}\n{}",
            r.delivered(),
            r.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // A node down: the overview says so and still answers.
    r.kill9(1);
    let (s, _, overview) = console_request(port, "GET", "/ui/", &cookie, "");
    assert_eq!(s, 200);
    assert!(overview.contains("unavailable"), "{overview}");
    assert_eq!(overview.matches(">serving<").count(), 2, "{overview}");
}

/// The faults a [`faulty_link`] injects, changed while it runs.
#[derive(Default)]
struct Faults {
    /// Answers still to swallow: the request reached the server, its answer never comes.
    cut: std::sync::atomic::AtomicUsize,
    /// Held before each answer is passed on, in ms (a slow link).
    delay_ms: std::sync::atomic::AtomicU64,
    /// New connections are closed at once (this side cannot reach the server).
    refuse: AtomicBool,
}

/// A TCP proxy on 127.0.0.1 in front of `upstream`, injecting `faults`; its port.
fn faulty_link(rt: &tokio::runtime::Runtime, upstream: u16, faults: Arc<Faults>) -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    rt.spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            if faults.refuse.load(Ordering::SeqCst) {
                drop(client);
                continue;
            }
            let faults = faults.clone();
            tokio::spawn(async move {
                let Ok(server) = tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                else {
                    return;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                let up = tokio::spawn(async move {
                    let _ = tokio::io::copy(&mut cr, &mut sw).await;
                    let _ = sw.shutdown().await;
                });
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = match sr.read(&mut buf).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    let swallow = faults
                        .cut
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |c| c.checked_sub(1))
                        .is_ok();
                    if swallow {
                        break;
                    }
                    let delay = faults.delay_ms.load(Ordering::SeqCst);
                    if delay > 0 {
                        tokio::time::sleep(Duration::from_millis(delay)).await;
                    }
                    if cw.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
                // Closing both halves: the client sees its connection end.
                up.abort();
                drop(cw);
            });
        }
    });
    port
}

#[test]
fn a_forward_whose_answer_was_cut_or_late_after_the_owner_committed_is_one_hook_when_the_provider_retries(
) {
    let mut r = Relay::new(2, "");
    let faults = Arc::new(Faults::default());
    // Node 0 reaches node 1's ingest listener only through the proxy.
    let proxy = faulty_link(&r.rt, r.specs[1].ingest, faults.clone());
    r.specs[1].advertised_ingest = proxy;
    r.start_all();
    let t = tenants_per_owner(&r, 1)[1][0].clone();
    let c = client();
    r.rt.block_on(async {
        // A first hook through the proxy, answered: the link works.
        assert_eq!(r.send(&c, 0, &t, "d-before").await.status, 202);
        // The owner commits the next one; its answer to node 0 is cut.
        faults.cut.store(1, Ordering::SeqCst);
        let a = r.send(&c, 0, &t, "d-cut").await;
        assert_eq!(a.status, 503, "{:?}", a.json());
        assert_eq!(a.json()["error"], "owner_unavailable", "{:?}", a.json());
        assert!(a.headers.contains_key("retry-after"), "{:?}", a.headers);
        assert_eq!(
            faults.cut.load(Ordering::SeqCst),
            0,
            "the proxy cut one answer"
        );
        // The provider retries, same delivery id, through another node and the first.
        let direct = r.send(&c, 1, &t, "d-cut").await;
        assert_eq!(
            direct.status,
            200,
            "a duplicate of what the owner committed: {:?}",
            direct.json()
        );
        let again = r.send(&c, 0, &t, "d-cut").await;
        assert_eq!(again.status, 200, "{:?}", again.json());
        assert_eq!(direct.json()["id"], again.json()["id"]);
        // A link slow enough to outlast forward_timeout_ms (2 s) on one call, not the next.
        faults.delay_ms.store(2_500, Ordering::SeqCst);
        let slow = r.send(&c, 0, &t, "d-slow").await;
        assert_eq!(slow.status, 503, "{:?}", slow.json());
        assert_eq!(slow.json()["error"], "owner_unavailable");
        assert!(slow.headers.contains_key("retry-after"));
        faults.delay_ms.store(0, Ordering::SeqCst);
        let retried = r.send(&c, 0, &t, "d-slow").await;
        assert!(
            retried.status == 200 || retried.status == 202,
            "{:?}",
            retried.json()
        );
        let once_more = r.send(&c, 1, &t, "d-slow").await;
        assert_eq!(once_more.status, 200, "{:?}", once_more.json());
        assert_eq!(once_more.json()["id"], retried.json()["id"]);
    });
    let ids: HashSet<String> = ["d-before", "d-cut", "d-slow"].map(str::to_owned).into();
    let got = r.await_delivered(&ids, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(got, r.delivered());
    assert!(
        got.values().all(|n| *n == 1),
        "delivered more than once: {got:?}"
    );
    assert_eq!(
        r.admin_get(1, &format!("/v1/tenants/{t}")).1["counters"]["dead"],
        0
    );
}

#[test]
fn a_paused_owner_makes_its_tenants_wait_and_after_it_resumes_every_retried_delivery_is_one_hook() {
    let mut r = Relay::new(3, "");
    r.start_all();
    let owned = tenants_per_owner(&r, 1);
    let victim = 2;
    let t = owned[victim][0].clone();
    let c = client();
    let mut acked = HashSet::new();
    r.send_acked(&c, &t, "before", 9, &mut acked);
    let pid = r.procs[victim].as_ref().unwrap().child.id().to_string();
    // A signal to the node process this test started, by its PID.
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill")
            .args([sig, &pid])
            .status()
            .is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let mut during = Vec::new();
    r.rt.block_on(async {
        for i in 0..2 {
            let d = format!("during-{i}");
            let started = Instant::now();
            let a = r.send(&c, i, &t, &d).await;
            // Its request waits in the stopped node's socket: the forward times out.
            assert_eq!(a.status, 503, "{:?}", a.json());
            assert_eq!(a.json()["error"], "owner_unavailable");
            assert!(a.headers.contains_key("retry-after"));
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "within forward_timeout_ms"
            );
            during.push(d);
            // Other tenants are unaffected.
            for ts in &owned[..2] {
                let d = format!("other-{i}-{}", ts[0]);
                assert_eq!(r.send(&c, i, &ts[0], &d).await.status, 202);
                acked.insert(d);
            }
        }
    });
    signal("-CONT");
    // The provider retries each refused delivery with its id: the owner may have taken the
    // request that waited in its socket (then the retry is its duplicate) or not.
    r.rt.block_on(async {
        for (i, d) in during.iter().enumerate() {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let a = r.send(&c, i, &t, d).await;
                if a.status == 202 || a.status == 200 {
                    acked.insert(d.clone());
                    break;
                }
                assert!(Instant::now() < deadline, "{:?}", a.json());
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    });
    let got = r.await_delivered(&acked, Duration::from_secs(30));
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(got, r.delivered());
    assert!(
        got.values().all(|n| *n == 1),
        "delivered more than once: {got:?}"
    );
    // Healed: every node ready, nothing left in flight or waiting.
    for i in 0..3 {
        assert_eq!(http_get(r.specs[i].admin, "/readyz").unwrap().0, 200);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, v) = r.admin_get(victim, &format!("/v1/tenants/{t}"));
        let c = &v["counters"];
        if c["inflight"] == 0 && c["pending"] == 0 && c["scheduled"] == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{v}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn an_owner_cut_off_from_one_node_is_reached_through_another_and_nothing_is_lost() {
    let mut r = Relay::new(3, "");
    let faults = Arc::new(Faults::default());
    // Node 0 reaches node 2 only through the link; nodes 1 and 2 reach each other directly.
    let link = faulty_link(&r.rt, r.specs[2].ingest, faults.clone());
    r.start(1);
    r.start(2);
    r.specs[2].advertised_ingest = link;
    r.start(0);
    let t = tenants_per_owner(&r, 1)[2][0].clone();
    let c = client();
    faults.refuse.store(true, Ordering::SeqCst);
    let mut acked = HashSet::new();
    r.rt.block_on(async {
        for n in 0..6 {
            let d = format!("d-part-{n}");
            // A provider's client: a node at random, the next on a refusal, with a backoff.
            let mut node = n % 3;
            let mut refusals = 0;
            loop {
                let a = r.send(&c, node, &t, &d).await;
                if a.status == 202 || a.status == 200 {
                    break;
                }
                assert_eq!(node, 0, "only node 0 is cut off: {:?}", a.json());
                assert_eq!(a.json()["error"], "owner_unavailable");
                assert!(a.headers.contains_key("retry-after"));
                refusals += 1;
                assert!(refusals < 5);
                node = (node + 1) % 3;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            acked.insert(d);
        }
    });
    // Healed: node 0 forwards again.
    faults.refuse.store(false, Ordering::SeqCst);
    r.rt.block_on(async {
        let a = r.send(&c, 0, &t, "d-healed").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
        acked.insert("d-healed".to_owned());
    });
    let got = r.await_delivered(&acked, Duration::from_secs(20));
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(got, r.delivered());
    assert!(
        got.values().all(|n| *n == 1),
        "delivered more than once: {got:?}"
    );
    let (_, m) = http_get(r.specs[0].admin, "/metrics").unwrap();
    assert!(
        m.contains(r#"ankusa_cluster_forwards_total{kind="ingest",outcome="unavailable"} 2"#),
        "node 0's two refused forwards: {m}"
    );
}

#[test]
fn a_forward_never_loops_even_when_two_nodes_disagree_on_the_owner() {
    // Node 0 lists nodes 0 and 1; node 1 also lists node 2 (a list being rolled out), which
    // never started: some tenants node 0 sends to node 1, node 1 thinks are node 2's.
    let mut r = Relay::new(3, "");
    r.lists.insert(0, vec![0, 1]);
    let two = |t: &str| ankusa_relay::cluster::owner_index(["relay-0", "relay-1"].into_iter(), t);
    let t = (0..)
        .map(|n| format!("tenant-{n}"))
        .find(|t| two(t) == 1 && r.owner(t) == 2)
        .unwrap();
    r.start(0);
    r.start(1);
    let c = client();
    r.rt.block_on(async {
        // Registry: node 0. Sent to node 0, forwarded to node 1, taken there.
        let a = r.send(&c, 0, &t, "d-loop").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
        // Sent to node 1 itself, it goes to node 2, which does not answer.
        let b = r.send(&c, 1, &t, "d-direct").await;
        assert_eq!(b.status, 503, "{:?}", b.json());
    });
    let ids: HashSet<String> = ["d-loop"].map(str::to_owned).into();
    let got = r.await_delivered(&ids, Duration::from_secs(20));
    assert_eq!(got.get("d-loop"), Some(&1));
    // Node 1 took the forwarded hook and sent nothing on to node 2 for it.
    let (_, m) = http_get(r.specs[1].admin, "/metrics").unwrap();
    assert!(
        m.contains(r#"ankusa_cluster_forwards_total{kind="ingest",outcome="unavailable"} 1"#),
        "only the direct hook went for node 2: {m}"
    );
    assert!(!m.contains(r#"kind="ingest",outcome="answered""#), "{m}");
    let (_, m0) = http_get(r.specs[0].admin, "/metrics").unwrap();
    assert!(
        m0.contains(r#"ankusa_cluster_forwards_total{kind="ingest",outcome="answered"} 1"#),
        "{m0}"
    );
}

/// A roll in progress: nodes 0 and 1 started on the old list of three, node 2 on the new
/// one, which marks it leaving. A tenant node 2 owned and node `new_owner` owns now.
fn roll_with_node_2_leaving(r: &mut Relay, new_owner: usize) -> String {
    let owner_now =
        |t: &str| ankusa_relay::cluster::owner_index(["relay-0", "relay-1"].into_iter(), t);
    let t = (0..)
        .map(|n| format!("tenant-{n}"))
        .find(|t| r.owner(t) == 2 && owner_now(t) == new_owner)
        .unwrap();
    r.start(0);
    r.start(1);
    r.leaving.insert(2);
    r.start(2);
    t
}

#[test]
fn a_leaving_node_sends_a_forwarded_hook_on_to_its_owner_and_stores_none() {
    // Nodes 0 and 1 run the old list; node 2 already runs the new one, which marks it
    // leaving (a roll in progress). Node 0 sends node 2 its former tenants' hooks.
    let mut r = Relay::new(3, "");
    let t = roll_with_node_2_leaving(&mut r, 1);
    let c = client();
    r.rt.block_on(async {
        let a = r.send(&c, 0, &t, "d-on").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
    });
    let ids: HashSet<String> = ["d-on"].map(str::to_owned).into();
    let got = r.await_delivered(&ids, Duration::from_secs(20));
    assert_eq!(got.get("d-on"), Some(&1));
    // Node 2 sent it on (one forward, answered) and took nothing; node 1 took it.
    let (_, m2) = http_get(r.specs[2].admin, "/metrics").unwrap();
    assert!(
        m2.contains(r#"ankusa_cluster_forwards_total{kind="ingest",outcome="answered"} 1"#),
        "{m2}"
    );
    let (_, v) = local_answer(&r, 2, &format!("/v1/tenants/{t}"));
    assert_ne!(
        v["error"],
        serde_json::Value::Null,
        "node 2 stores {t}: {v}"
    );
    let (_, v) = local_answer(&r, 1, &format!("/v1/tenants/{t}"));
    assert_eq!(v["tenant"], t.as_str(), "node 1 stores {t}: {v}");
}

#[test]
fn a_hook_a_roll_stored_on_a_node_with_the_old_list_is_delivered_after_the_roll() {
    // Nodes 0 and 1 run the old list; node 2 already runs the new one, which marks it
    // leaving. A hook of a tenant node 2 owned and node 0 owns now, sent to node 0: node 0
    // forwards it to node 2 (its owner in the old list), node 2 on to node 0 (its owner in
    // the new), which stores it whatever its view. Node 0's handoff stages it for node 2,
    // which refuses it (not its tenant): node 0 takes it back, and once it rolls onto the
    // new list the tenant is its own and the hook is delivered there. (It used to wait in
    // node 0's outbox for node 2 for good: in no queue, counted nowhere.)
    let mut r = Relay::new(
        3,
        "retry: { schedule_ms: [200], jitter: none, max_attempts: 1000 }",
    );
    // The sink refuses: the hook stays queued, so it is staged and moves, or waits.
    r.sink.default_status.store(503, Ordering::Relaxed);
    let t = roll_with_node_2_leaving(&mut r, 0);
    let c = client();
    r.rt.block_on(async {
        let a = r.send(&c, 0, &t, "d-roll").await;
        assert_eq!(a.status, 202, "{:?}", a.json());
    });
    // Node 0 stored it, staged it for node 2, was refused and took it back.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let h = handoff_of(&r, 0);
        if h["stalled"]
            .as_str()
            .is_some_and(|s| s.contains("taken back"))
        {
            assert_eq!(h["staged"], 0, "a refused batch is not left staged: {h}");
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 0 never staged and took back the hook: {h}\n{}",
            r.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let (_, v) = local_answer(&r, 0, &format!("/v1/tenants/{t}"));
    let queued: i64 = ["pending", "scheduled", "inflight"]
        .iter()
        .map(|f| v["counters"][*f].as_i64().unwrap_or(0))
        .sum();
    assert_eq!(queued, 1, "node 0 counts the hook it took back: {v}");
    let (_, m) = http_get(r.specs[0].admin, "/metrics").unwrap();
    assert!(
        m.contains(r#"ankusa_handoff_hooks_total{direction="taken_back"}"#),
        "{m}"
    );
    // The roll reaches node 0.
    if let Some(mut p) = r.procs[0].take() {
        p.stop(Duration::from_secs(60));
    }
    r.start(0);
    r.sink.default_status.store(200, Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !accepted_by_id(&r.sink, "/s").contains_key("d-roll") {
        assert!(
            Instant::now() < deadline,
            "the hook was never delivered: node 0 {}\n{}",
            handoff_of(&r, 0),
            r.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(accepted_by_id(&r.sink, "/s").get("d-roll"), Some(&1));
    for i in 0..3 {
        let h = handoff_of(&r, i);
        assert_eq!(h["staged"], 0, "node {i}: {h}");
    }
}

/// A receiver answers a handoff batch it imported before as such, whatever its node list
/// says now; only a batch it does not have is refused as not its (which is what lets the
/// sender take a refused batch back without a row ending in two queues).
#[test]
fn a_batch_imported_before_is_answered_so_even_once_its_tenant_is_not_the_receivers() {
    let mut r = Relay::new(2, "");
    r.handoff_ms = 0;
    let t = (0..)
        .map(|n| format!("tenant-{n}"))
        .find(|t| r.owner(t) == 0)
        .unwrap();
    r.start_all();
    let c = client();
    let url = format!("http://127.0.0.1:{}/cluster/v1/handoff", r.specs[0].admin);
    let post_batch = |r: &Relay, n: u64| {
        let item = ankusa_records::moved::Moved::Dedupe {
            tenant: t.clone(),
            key: format!("delivery-{n}").into_bytes(),
            expires: ankusa_keyspace::now_ms() + 600_000,
            id: format!("hk_{n}"),
        };
        let body = serde_json::json!({
            "from": "relay-1",
            "batch": n,
            "items": [base64::engine::general_purpose::STANDARD.encode(item.encode())],
        })
        .to_string();
        let auth = node_signed(
            CLUSTER_TOKEN,
            "relay-1",
            "/cluster/v1/handoff",
            &body,
            ankusa_keyspace::now_ms(),
        );
        r.rt.block_on(post(
            &c,
            &url,
            &[auth, ("content-type", "application/json".to_owned())],
            body,
        ))
    };
    let a = post_batch(&r, 1);
    assert_eq!(a.status, 200, "{:?}", a.json());
    assert_eq!(a.json()["outcome"], "imported", "{:?}", a.json());
    // Node 0 restarts marked leaving: the tenant is no longer its.
    r.leaving.insert(0);
    if let Some(mut p) = r.procs[0].take() {
        p.stop(Duration::from_secs(60));
    }
    r.start(0);
    let a = post_batch(&r, 1);
    assert_eq!(a.status, 200, "{:?}", a.json());
    assert_eq!(a.json()["outcome"], "already", "{:?}", a.json());
    let a = post_batch(&r, 2);
    assert_eq!(a.status, 409, "{:?}", a.json());
    assert_eq!(a.json()["error"], "not_owner", "{:?}", a.json());
}

/// `/v1/node`'s handoff account of node `i` (`null` before its first pass).
fn handoff_of(r: &Relay, i: usize) -> serde_json::Value {
    let (_, v) = local_answer(r, i, "/v1/node");
    v["cluster"]["handoff"].clone()
}

/// Waits until node `i` reports itself drained: nothing of another node's tenants left
/// and nothing staged.
fn await_drained(r: &Relay, i: usize, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let h = handoff_of(r, i);
        if h["drained"] == true {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "node {i} never drained: {h}\n{}",
            r.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn a_leaving_node_hands_every_stored_row_to_the_owners_and_each_acked_hook_is_delivered_once() {
    let mut r = Relay::new(
        3,
        "retry: { schedule_ms: [300], jitter: none, max_attempts: 3 }",
    );
    // The sink is down: every hook stays queued, retried, and some end dead.
    r.sink.default_status.store(503, Ordering::Relaxed);
    r.start_all();
    let tenants: Vec<String> = (0..30).map(|t| format!("drain-{t}")).collect();
    let c = client();
    let mut acked = HashSet::new();
    // Through node 2, which owns about a third of them; the others are forwarded.
    for (k, t) in tenants.iter().enumerate() {
        r.send_acked(&c, t, &format!("{t}-a"), 4 + k % 5, &mut acked);
    }
    // Some of node 2's rows are dead by now (three attempts 300 ms apart), some due.
    std::thread::sleep(Duration::from_millis(1500));
    let held = |r: &Relay, i: usize| {
        let (_, v) = local_answer(r, i, "/v1/node");
        let c = &v["counters"];
        ["pending", "scheduled", "inflight", "dead"]
            .iter()
            .map(|f| c[*f].as_i64().unwrap())
            .sum::<i64>()
    };
    let before = held(&r, 2);
    assert!(before > 0, "node 2 holds rows before it leaves");
    let total: i64 = (0..3).map(|i| held(&r, i)).sum();

    // Node 2 leaves: every node restarts with it marked `leaving` (node 2 first, as the
    // operator rolls the new list), and hooks keep arriving meanwhile.
    r.leaving.insert(2);
    for i in [2, 0, 1] {
        if let Some(mut p) = r.procs[i].take() {
            p.stop(Duration::from_secs(60));
        }
        r.start(i);
        for t in tenants.iter().take(10) {
            r.send_acked(&c, t, &format!("{t}-roll{i}"), 1, &mut acked);
        }
    }
    // Kills mid-drain: the leaving node and a receiver, each SIGKILLed and restarted.
    r.kill9(2);
    r.start(2);
    r.kill9(0);
    r.start(0);
    await_drained(&r, 2, Duration::from_secs(60));
    assert_eq!(held(&r, 2), 0, "the drained node holds no row");
    let h = handoff_of(&r, 2);
    assert_eq!(h["rows_leaving"], 0, "{h}");
    assert_eq!(h["staged"], 0, "{h}");
    // Nothing was lost or doubled on the way: the Relay holds what it held, plus the hooks
    // sent since (each still queued: the sink is down).
    // Three restarts, ten hooks of one sink after each.
    let sent_since = 30;
    let after: i64 = (0..3).map(|i| held(&r, i)).sum();
    assert_eq!(
        after,
        total + sent_since,
        "rows before {total}, after {after}"
    );
    // The sink comes back; the dead rows are replayed by tenant; every acked hook arrives
    // exactly once.
    r.sink.default_status.store(200, Ordering::Relaxed);
    for t in &tenants {
        let url = format!("http://127.0.0.1:{}/v1/dlq/replay", r.specs[0].admin);
        let a = r.rt.block_on(post(
            &c,
            &url,
            &[
                ("authorization", format!("Bearer {ADMIN}")),
                ("content-type", "application/json".to_owned()),
            ],
            format!(r#"{{"tenant":"{t}"}}"#),
        ));
        assert_eq!(a.status, 200, "{:?}", a.json());
    }
    // Delivered: answered 2xx (the sink also recorded the attempts it answered 503).
    let accepted = || accepted_by_id(&r.sink, "/s");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !acked.iter().all(|d| accepted().contains_key(d)) {
        assert!(
            Instant::now() < deadline,
            "{} acked hooks never delivered\n{}",
            acked
                .iter()
                .filter(|d| !accepted().contains_key(*d))
                .count(),
            r.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let got = accepted();
    let dup: Vec<_> = got.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dup.is_empty(), "delivered twice: {dup:?}");
    assert_eq!(got.len(), acked.len());
    // On every node the counters equal a fold of the families; the leaving node's store
    // holds no row.
    for i in 0..3 {
        if let Some(mut p) = r.procs[i].take() {
            p.stop(Duration::from_secs(60));
        }
        let data = r.specs[i].dir.join("db");
        let out = run(&["store", "verify", "--data", data.to_str().unwrap()]);
        assert!(
            out.status.success(),
            "node {i}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let out = run(&[
        "store",
        "inspect",
        "--data",
        r.specs[2].dir.join("db").to_str().unwrap(),
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("pending=0 scheduled=0 inflight=0 dead=0"),
        "{text}"
    );
}

/// A tenant's own endpoints follow it to its new owner when its node leaves: the same id,
/// its deliveries still owed there (the endpoint answering 503 when the node left) moved
/// with them and delivered once, and its later hooks delivered to it by the new owner; the
/// node that left holds none.
#[test]
fn a_tenants_endpoints_move_to_its_new_owner_with_its_rows() {
    let mut r = Relay::new(
        3,
        "endpoints: { allow_private: true }\nretry: { schedule_ms: [300], jitter: none, max_attempts: 20 }",
    );
    r.endpoints = true;
    let t = (0..)
        .map(|n| format!("ep-tenant-{n}"))
        .find(|t| r.owner(t) == 2)
        .unwrap();
    r.start_all();
    let c = client();
    let call = |r: &Relay, i: usize, method: &str, path: &str, body: &str| {
        let headers = [
            format!("Authorization: Bearer {ADMIN}"),
            "content-type: application/json".to_owned(),
        ];
        let (s, b) = http_raw(
            r.specs[i].admin,
            method,
            path,
            &headers,
            body,
            Duration::from_secs(5),
        )
        .unwrap();
        (
            s,
            serde_json::from_str::<serde_json::Value>(&b).unwrap_or_default(),
        )
    };
    // Made through node 0, kept by the owner, node 2.
    let path = format!("/v1/tenants/{t}/endpoints");
    let body = serde_json::json!({ "url": r.sink.url("/ep") }).to_string();
    let (s, made) = call(&r, 0, "POST", &path, &body);
    assert_eq!(s, 201, "{made}");
    let id = made["endpoint"]["id"].as_str().unwrap().to_owned();
    let (_, v) = local_answer(&r, 2, &path);
    assert_eq!(v["endpoints"][0]["id"], id.as_str(), "{v}");
    // The endpoint refuses its first deliveries: they wait on node 2, retried.
    r.sink.script("/ep", &[(503, None); 6]);
    let mut acked = HashSet::new();
    r.send_acked(&c, &t, "before", 3, &mut acked);
    std::thread::sleep(Duration::from_millis(400));

    r.leaving.insert(2);
    for i in [2, 0, 1] {
        if let Some(mut p) = r.procs[i].take() {
            p.stop(Duration::from_secs(60));
        }
        r.start(i);
    }
    await_drained(&r, 2, Duration::from_secs(60));
    let owner = (0..2)
        .find(|i| local_answer(&r, *i, &path).1["endpoints"][0]["id"] == id.as_str())
        .expect("the endpoint reached the tenant's new owner");
    let (_, v) = local_answer(&r, 2, &path);
    assert_eq!(
        v["endpoints"],
        serde_json::json!([]),
        "node 2 still holds it: {v}"
    );
    r.send_acked(&c, &t, "after", 3, &mut acked);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !acked
        .iter()
        .all(|d| accepted_by_id(&r.sink, "/ep").contains_key(d))
    {
        assert!(
            Instant::now() < deadline,
            "not every hook reached the endpoint\n{}",
            r.logs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    std::thread::sleep(Duration::from_millis(500));
    let got = accepted_by_id(&r.sink, "/ep");
    assert!(got.values().all(|n| *n == 1), "delivered twice: {got:?}");
    assert_eq!(got.len(), acked.len());
    let (_, text) = http_get_auth_token(r.specs[owner].admin, "/metrics", ADMIN).unwrap();
    assert_eq!(
        ankusa_relay::testkit::metric(&text, "ankusa_endpoints"),
        Some(1.0)
    );
}

/// This node's count of pull calls it sent other nodes (`ankusa_cluster_forwards_total`).
fn pull_calls_sent(r: &Relay, i: usize) -> u64 {
    let (_, text) = http_get_auth_token(r.specs[i].admin, "/metrics", ADMIN).unwrap();
    text.lines()
        .filter(|l| l.starts_with("ankusa_cluster_forwards_total{") && l.contains(r#"kind="pull""#))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// A claim waiting at one node is woken by a hook another node parks, without asking that
/// node again and again while nothing comes: one long call waits there.
#[test]
fn a_waiting_claim_is_woken_by_another_nodes_hook_without_polling_it() {
    let mut r = Relay::new(
        2,
        &format!(
            r#"pull:
  max_wait_ms: 8000
  consumers:
    - {{ name: all, secret: {{ value: "{CONSUMER}" }}, sinks: [q] }}"#
        ),
    );
    r.pull = true;
    let owned = tenants_per_owner(&r, 1);
    r.start_all();
    let before = pull_calls_sent(&r, 0);
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], r.specs[0].ingest).into();
    let waiting = r.rt.spawn(async move {
        let started = Instant::now();
        let got = admin_call(
            addr,
            "POST",
            "/pull/q/claim",
            CONSUMER,
            &serde_json::json!({ "wait_ms": 8000 }).to_string(),
        )
        .await;
        (got, started.elapsed())
    });
    // Two seconds of nothing, then a hook of a tenant node 1 owns.
    std::thread::sleep(Duration::from_secs(2));
    let c = client();
    let t = &owned[1][0];
    assert_eq!(r.rt.block_on(r.send(&c, 1, t, "d-woken")).status, 202);
    let ((s, v), took) = r.rt.block_on(waiting).unwrap();
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["hooks"][0]["tenant"], t.as_str(), "{v}");
    assert!(took < Duration::from_secs(5), "woken after {took:?}");
    // A claim round, one wait, and the round the wake started: a handful of calls, not
    // one every 100 ms of the two seconds.
    let calls = pull_calls_sent(&r, 0) - before;
    assert!(
        calls <= 6,
        "{calls} pull calls to the other node\n{}",
        r.logs()
    );
}
