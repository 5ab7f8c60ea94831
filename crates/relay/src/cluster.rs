//! One Relay, several nodes: each tenant belongs to one node.
//!
//! - **Ownership**: rendezvous (highest random weight) hashing of the tenant id over the
//!   node names of `cluster.nodes`: the owner is the node whose SHA-256 of
//!   `name ‖ 0x00 ‖ tenant` is highest. A change of the node list moves only the tenants
//!   whose highest weight was the node that left, or is the node that came.
//! - **Forwarding**: a node that is not a tenant's owner verifies the hook, finds its tenant
//!   and sends the request as it came to the owner's ingest listener, with
//!   `ankusa-forwarded-by` and the cluster token; it answers the provider with the owner's
//!   answer, so an ack still means "committed on the node that will deliver it". The owner
//!   takes a forwarded hook itself, whatever its own view of the node list (no request
//!   goes round twice). Owner unreachable: 503 `owner_unavailable` with `Retry-After`.
//! - **The tenant registry**: the first node of `cluster.nodes` keeps every tenant id the
//!   Relay holds (`m:cluster_tenant:<id>` in its store, synced), so `tenants.max` counts
//!   tenants relay-wide. An owner asks it once per tenant and process
//!   (`POST /cluster/v1/tenants/admit`); a tenant the owner already stores is registered
//!   past the limit (it exists), a new one only below it.
//! - **Admin calls** that name a tenant go to its owner (`ankusa-cluster-local` marks a
//!   call a node sent, answered where it lands); `GET /v1/tenants` asks every node and
//!   merges.
//!
//! A single node (no `cluster.nodes`, or one) owns every tenant and sends nothing.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode};
use axum::response::Response;
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use sha2::Digest;
use subtle::ConstantTimeEq;

use crate::metrics::{ForwardLabels, KindLabel, Metrics};
use ankusa_config::Config;
use ankusa_queue::registry::{Admission, Registry};
use ankusa_queue::QueueError;
use ankusa_store::{Store, StoreError};

/// The cluster token a node shows another.
pub const TOKEN_HEADER: &str = "ankusa-cluster-token";
/// On a forwarded hook: the node that forwarded it.
pub const FORWARDED_BY: &str = "ankusa-forwarded-by";
/// On an admin call one node sends another: answer it here, do not route it again.
pub const LOCAL_HEADER: &str = "ankusa-cluster-local";
/// The most bytes of another node's answer read.
const MAX_ANSWER: usize = 256 << 20;

/// One node of the Relay.
#[derive(Debug, Clone)]
pub struct Member {
    pub name: String,
    /// Base URLs, no trailing slash.
    pub ingest: String,
    pub admin: String,
}

/// Why another node gave no answer.
#[derive(Debug, thiserror::Error)]
#[error("node {node} did not answer: {reason}")]
pub struct Unreachable {
    pub node: String,
    pub reason: String,
}

/// This node's view of its Relay.
pub struct Cluster {
    members: Vec<Member>,
    me: usize,
    token: HeaderValue,
    client: crate::http::Client,
    timeout: Duration,
    metrics: Arc<Metrics>,
    /// Tenants the registry admitted (bounded by `tenants.max` and a ceiling).
    admitted: Mutex<HashSet<String>>,
    /// On the first node: the registry.
    registry: Option<Registry>,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("members", &self.members)
            .field("me", &self.me)
            .finish()
    }
}

/// Why a node's view of its Relay could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    #[error(transparent)]
    Config(#[from] ankusa_config::ConfigError),
    #[error("opening the tenant registry: {0}")]
    Registry(#[from] StoreError),
    #[error("TLS setup for the cluster's client: {0}")]
    Tls(#[from] rustls::Error),
}

/// The most admitted tenants remembered; past it the set is cleared (a miss costs one
/// registry call).
const ADMITTED_CEILING: usize = 1 << 20;

impl Cluster {
    /// This node's view of the Relay in `config` (a single node when `cluster.nodes` has
    /// fewer than two).
    pub fn new(
        config: &Config,
        store: &Arc<Store>,
        metrics: Arc<Metrics>,
    ) -> Result<Self, ClusterError> {
        let c = &config.cluster;
        let members: Vec<Member> = c
            .nodes
            .iter()
            .map(|n| Member {
                name: n.name.clone(),
                ingest: n.ingest.trim_end_matches('/').to_owned(),
                admin: n.admin.trim_end_matches('/').to_owned(),
            })
            .collect();
        let me = c
            .name
            .as_ref()
            .and_then(|n| members.iter().position(|m| &m.name == n))
            .unwrap_or(0);
        let token = match &c.token {
            Some(t) => HeaderValue::from_bytes(&t.resolve("cluster.token")?).map_err(|_| {
                ankusa_config::ConfigError::Invalid {
                    key: "cluster.token".into(),
                    message: "must be printable ASCII (it travels in a header)".into(),
                }
            })?,
            None => HeaderValue::from_static(""),
        };
        let multi = members.len() > 1;
        metrics.cluster_nodes.set(members.len().max(1) as i64);
        let registry = if multi && me == 0 {
            let r = Registry::open(store.clone(), config.tenants.max)?;
            metrics.cluster_tenants_registered.set(r.len() as i64);
            Some(r)
        } else {
            None
        };
        Ok(Cluster {
            members,
            me,
            token,
            client: crate::http::client(Duration::from_secs(2))?,
            timeout: Duration::from_millis(c.forward_timeout_ms),
            metrics,
            admitted: Mutex::new(HashSet::new()),
            registry,
        })
    }

    /// Two nodes or more.
    pub fn is_multi(&self) -> bool {
        self.members.len() > 1
    }

    /// The Relay's nodes.
    pub fn members(&self) -> &[Member] {
        &self.members
    }

    /// This node's name (`None` alone).
    pub fn me(&self) -> Option<&str> {
        self.members.get(self.me).map(|m| m.name.as_str())
    }

    /// The owner of `tenant` when it is another node; `None` when it is this one.
    pub fn other_owner(&self, tenant: &str) -> Option<&Member> {
        if !self.is_multi() {
            return None;
        }
        let owner = owner_index(self.members.iter().map(|m| m.name.as_str()), tenant);
        (owner != self.me).then(|| &self.members[owner])
    }

    /// The owner of `tenant` (with two nodes or more).
    pub fn owner_of(&self, tenant: &str) -> &Member {
        &self.members[owner_index(self.members.iter().map(|m| m.name.as_str()), tenant)]
    }

    /// The registry, when this node keeps it.
    pub fn registry(&self) -> Option<&Registry> {
        self.registry.as_ref()
    }

    /// This node's place in the Relay, for `/v1/node` (`None` alone).
    pub fn status(&self) -> Option<ankusa_crds::node::ClusterStatus> {
        self.is_multi().then(|| ankusa_crds::node::ClusterStatus {
            name: self.me().unwrap_or_default().to_owned(),
            nodes: self.members.len() as u32,
            tenants_owned: self.owned() as u64,
            tenants_registered: self.registry.as_ref().map(|r| r.len() as u64),
        })
    }

    /// Publishes the registry's size.
    pub fn set_registered(&self, n: usize) {
        self.metrics.cluster_tenants_registered.set(n as i64);
    }

    /// Tenants this node has taken hooks for as their owner since it started.
    pub fn owned(&self) -> usize {
        self.admitted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether `headers` carry the cluster token (constant time).
    pub fn authentic(&self, headers: &HeaderMap) -> bool {
        self.is_multi()
            && headers
                .get(TOKEN_HEADER)
                .is_some_and(|v| bool::from(v.as_bytes().ct_eq(self.token.as_bytes())))
    }

    /// Makes sure the registry holds `tenant` before this node, its owner, stores a hook
    /// of it: once per tenant and process. `exists`: whether the store already holds it.
    /// A tenant the store holds is taken at once — it exists, and its hooks must not wait
    /// for the registry node — and registered in the background (a registry that does not
    /// answer then misses it until the next try); a new one waits for the registry's word.
    pub async fn admit(
        self: &Arc<Self>,
        tenant: &str,
        exists: impl FnOnce() -> Result<bool, QueueError>,
    ) -> Result<Admission, AdmitError> {
        if !self.is_multi() || self.is_admitted(tenant) {
            return Ok(Admission::Admitted);
        }
        let exists = exists()?;
        if exists && self.registry.is_none() {
            self.remember(tenant);
            let (me, t) = (self.clone(), tenant.to_owned());
            tokio::spawn(async move {
                if let Err(e) = me.admit_remote(&t, true).await {
                    tracing::debug!(tenant = %t, error = %e, "registering an existing tenant failed; the next start tries again");
                }
            });
            return Ok(Admission::Admitted);
        }
        let answer = match &self.registry {
            Some(r) => {
                let a = r.admit(tenant, exists)?;
                self.metrics.cluster_tenants_registered.set(r.len() as i64);
                a
            }
            None => self.admit_remote(tenant, exists).await?,
        };
        if answer == Admission::Admitted {
            self.remember(tenant);
        }
        Ok(answer)
    }

    fn remember(&self, tenant: &str) {
        let mut set = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        if set.len() >= ADMITTED_CEILING {
            set.clear();
        }
        set.insert(tenant.to_owned());
        self.metrics.cluster_tenants_owned.set(set.len() as i64);
    }

    fn is_admitted(&self, tenant: &str) -> bool {
        self.admitted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .contains(tenant)
    }

    async fn admit_remote(&self, tenant: &str, exists: bool) -> Result<Admission, Unreachable> {
        let first = &self.members[0];
        let body = serde_json::json!({ "tenant": tenant, "exists": exists }).to_string();
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        let r = self
            .send(
                "admit",
                first,
                &first.admin,
                Method::POST,
                "/cluster/v1/tenants/admit",
                &headers,
                Bytes::from(body),
            )
            .await?;
        match r.status() {
            StatusCode::OK => Ok(Admission::Admitted),
            StatusCode::CONFLICT => Ok(Admission::Limit),
            s => Err(Unreachable {
                node: first.name.clone(),
                reason: format!("the registry answered {s}"),
            }),
        }
    }

    /// Sends a hook as it came to its owner's ingest listener; the owner's answer.
    pub async fn forward_ingest(
        &self,
        owner: &Member,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, Unreachable> {
        let mut h = headers.clone();
        if let Some(me) = self.me().and_then(|m| HeaderValue::from_str(m).ok()) {
            h.insert(FORWARDED_BY, me);
        }
        self.send(
            "ingest",
            owner,
            &owner.ingest,
            Method::POST,
            path_and_query,
            &h,
            body,
        )
        .await
    }

    /// Sends an admin call to another node's admin listener, to be answered there.
    pub async fn forward_admin(
        &self,
        to: &Member,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, Unreachable> {
        let mut h = headers.clone();
        h.insert(LOCAL_HEADER, HeaderValue::from_static("1"));
        self.send("admin", to, &to.admin, method, path_and_query, &h, body)
            .await
    }

    /// Sends a pull gateway call (`/pull/…`) to another node's ingest listener, to be
    /// answered there for what that node holds.
    pub async fn forward_pull(
        &self,
        to: &Member,
        path: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, Unreachable> {
        let mut h = headers.clone();
        h.insert(LOCAL_HEADER, HeaderValue::from_static("1"));
        self.send("pull", to, &to.ingest, Method::POST, path, &h, body)
            .await
    }

    /// Whether a call is one another node of the Relay sent to be answered here.
    pub fn is_local_call(&self, headers: &HeaderMap) -> bool {
        headers.contains_key(LOCAL_HEADER) && self.authentic(headers)
    }

    /// [`Cluster::forward_admin`] to the node named `name`.
    pub async fn forward_admin_named(
        &self,
        name: &str,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, Unreachable> {
        match self.members.iter().find(|m| m.name == name) {
            Some(m) => {
                self.forward_admin(m, method, path_and_query, headers, body)
                    .await
            }
            None => Err(Unreachable {
                node: name.to_owned(),
                reason: "not in the node list".into(),
            }),
        }
    }

    /// One request to another node, with the cluster token, within `forward_timeout_ms`;
    /// the answer read whole (status, `content-type`, `retry-after`, body).
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        kind: &str,
        to: &Member,
        base: &str,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, Unreachable> {
        let started = Instant::now();
        let res = tokio::time::timeout(
            self.timeout,
            self.exchange(base, method, path_and_query, headers, body),
        )
        .await
        .unwrap_or_else(|_| Err("timed out".to_owned()));
        self.metrics
            .cluster_forward_seconds
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .observe(started.elapsed().as_secs_f64());
        self.metrics
            .cluster_forwards
            .get_or_create(&ForwardLabels {
                kind: kind.to_owned(),
                outcome: if res.is_ok() {
                    "answered"
                } else {
                    "unavailable"
                }
                .to_owned(),
            })
            .inc();
        res.map_err(|reason| {
            tracing::warn!(node = %to.name, %kind, %reason, "another node of the Relay did not answer");
            Unreachable {
                node: to.name.clone(),
                reason,
            }
        })
    }

    async fn exchange(
        &self,
        base: &str,
        method: Method,
        path_and_query: &str,
        headers: &HeaderMap,
        body: Bytes,
    ) -> Result<Response, String> {
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(format!("{base}{path_and_query}"));
        for (k, v) in headers {
            if !is_hop_by_hop(k) {
                req = req.header(k, v);
            }
        }
        let req = req
            .header(TOKEN_HEADER, self.token.clone())
            .body(Full::new(body))
            .map_err(|e| e.to_string())?;
        let resp = self.client.request(req).await.map_err(|e| e.to_string())?;
        let (parts, body) = resp.into_parts();
        let bytes = Limited::new(body, MAX_ANSWER)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        let mut out = Response::new(Body::from(bytes));
        *out.status_mut() = parts.status;
        for name in ["content-type", "retry-after"] {
            if let Some(v) = parts.headers.get(name) {
                out.headers_mut().insert(name, v.clone());
            }
        }
        Ok(out)
    }
}

/// Headers that describe one connection, and the cluster's own (never passed on as they
/// came).
fn is_hop_by_hop(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "host"
            | "content-length"
            | "connection"
            | "keep-alive"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "proxy-authorization"
            | "proxy-connection"
            | TOKEN_HEADER
    )
}

/// Why a tenant could not be admitted.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error(transparent)]
    Unreachable(#[from] Unreachable),
    #[error(transparent)]
    Queue(#[from] QueueError),
}

impl From<StoreError> for AdmitError {
    fn from(e: StoreError) -> Self {
        AdmitError::Queue(e.into())
    }
}

/// The rendezvous weight of `tenant` on node `name`.
fn weight(name: &str, tenant: &str) -> u64 {
    let mut h = sha2::Sha256::new();
    h.update(name.as_bytes());
    h.update([0u8]);
    h.update(tenant.as_bytes());
    let d = h.finalize();
    let mut w = [0u8; 8];
    w.copy_from_slice(&d[..8]);
    u64::from_be_bytes(w)
}

/// The index of the owner of `tenant` among `names`: the highest weight (ties, which
/// SHA-256 makes vanishingly rare, to the smaller name).
pub fn owner_index<'a>(names: impl Iterator<Item = &'a str>, tenant: &str) -> usize {
    let mut best: Option<(u64, &str, usize)> = None;
    for (i, n) in names.enumerate() {
        let w = weight(n, tenant);
        let better = match best {
            None => true,
            Some((bw, bn, _)) => w > bw || (w == bw && n < bn),
        };
        if better {
            best = Some((w, n, i));
        }
    }
    best.map_or(0, |(_, _, i)| i)
}

#[cfg(test)]
mod tests {
    use super::owner_index;

    fn names(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("ankusa-{i}")).collect()
    }

    #[test]
    fn ownership_is_spread_evenly_over_the_nodes() {
        let nodes = names(3);
        let mut per = [0usize; 3];
        for t in 0..30_000 {
            per[owner_index(nodes.iter().map(String::as_str), &format!("tenant-{t}"))] += 1;
        }
        for p in per {
            assert!((9_000..11_000).contains(&p), "{per:?}");
        }
    }

    #[test]
    fn a_fourth_node_moves_about_a_quarter_of_the_tenants_and_only_to_itself() {
        let three = names(3);
        let four = names(4);
        let mut moved = 0;
        for t in 0..20_000 {
            let t = format!("tenant-{t}");
            let before = owner_index(three.iter().map(String::as_str), &t);
            let after = owner_index(four.iter().map(String::as_str), &t);
            if before != after {
                assert_eq!(after, 3, "a tenant moved between two old nodes");
                moved += 1;
            }
        }
        assert!((4_500..5_500).contains(&moved), "{moved} of 20000 moved");
    }

    #[test]
    fn ownership_does_not_depend_on_the_order_of_the_list() {
        let a = names(5);
        let mut b = a.clone();
        b.reverse();
        for t in 0..1_000 {
            let t = format!("t{t}");
            let ia = owner_index(a.iter().map(String::as_str), &t);
            let ib = owner_index(b.iter().map(String::as_str), &t);
            assert_eq!(a[ia], b[ib]);
        }
    }
}
