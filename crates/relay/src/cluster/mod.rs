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
//! - **The tenant registry** has no single point: `tenants.max` is split into slots among
//!   the nodes (`ankusa_queue::registry`, an escrow of slots). An owner admits a new tenant
//!   against its own slots (once per tenant and process, in memory); out of slots,
//!   it borrows some from another node (`POST /cluster/v1/slots/lend`). A tenant the
//!   owner already stores is registered whatever its slots (it exists). The Relay's
//!   tenant count is the sum of the nodes' registered tenants, never above `tenants.max`.
//!   At start and every 30 s a node reads every other node's ledger
//!   (`GET /cluster/v1/slots`) and keeps the larger totals: a lost answer's slots, or a
//!   lost store's loans, come back.
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

use crate::metrics::{ForwardLabels, KindLabel, Metrics};
use ankusa_api::cluster::{HandoffAnswer, HandoffBatch, LendRequest, Lent, SlotLedger, Stored};
use ankusa_api::error::ErrorCode;
use ankusa_config::Config;
use ankusa_queue::engine::{Store, StoreError};
use ankusa_queue::registry::{Admission, Ledger, Registry, Shares};
use ankusa_queue::QueueError;
use arc_swap::ArcSwap;

/// On a request the listener's edge found signed by a node of the Relay ([`ankusa_verify::node`]): that
/// node's name. The edge removes every `ankusa-*` header of any other request, so only
/// the edge sets it.
pub const VERIFIED_HEADER: &str = "ankusa-node-verified";
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
    /// Leaving the Relay: it owns no tenant and hands what it stores to the owners.
    pub leaving: bool,
}

/// Why another node gave no answer.
#[derive(Debug, thiserror::Error)]
#[error("node {node} did not answer: {reason}")]
pub struct Unreachable {
    pub node: String,
    pub reason: String,
    /// The error's code, when the node answered with one (a refusal, not silence).
    pub code: Option<ErrorCode>,
}

impl Unreachable {
    /// No answer from `node`, for `reason` (no error code).
    pub fn new(node: impl Into<String>, reason: impl Into<String>) -> Self {
        Unreachable {
            node: node.into(),
            reason: reason.into(),
            code: None,
        }
    }
}

/// This node's view of its Relay.
pub struct Cluster {
    members: Vec<Member>,
    /// The places in `members` of the nodes that own tenants (those not leaving).
    owners: Vec<usize>,
    me: usize,
    /// Signs this node's requests and checks the others' (with two nodes or more).
    auth: Option<ankusa_verify::node::NodeAuth>,
    client: crate::http::Client,
    timeout: Duration,
    metrics: Arc<Metrics>,
    /// Tenants the registry admitted (bounded by `tenants.max` and a ceiling).
    admitted: Mutex<HashSet<String>>,
    /// With two nodes or more: this node's part of the tenant registry, and its share (a
    /// reload of `tenants.max` swaps it, [`Cluster::set_tenants_max`]).
    registry: Option<(Registry, ArcSwap<Shares>)>,
    /// One loan asked at a time (the others wait and find its slots).
    borrowing: tokio::sync::Mutex<()>,
    /// Loans asked, to turn the first node asked.
    loans: std::sync::atomic::AtomicUsize,
    /// The last handoff pass's account (`handoff::Handoff` writes it).
    handoff: Mutex<Option<ankusa_api::node::HandoffStatus>>,
    /// Told when a handoff moved tenants' endpoints in or out of the store (the node's
    /// book of them reads the store again).
    endpoints_moved: std::sync::OnceLock<Box<dyn Fn() + Send + Sync>>,
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
    Registry(#[from] QueueError),
    #[error("TLS setup for the cluster's client: {0}")]
    Tls(#[from] rustls::Error),
}

pub mod handoff;

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
                leaving: n.leaving,
            })
            .collect();
        let me = c
            .name
            .as_ref()
            .and_then(|n| members.iter().position(|m| &m.name == n))
            .unwrap_or(0);
        let multi = members.len() > 1;
        let auth = match &c.token {
            Some(t) if multi => Some(ankusa_verify::node::NodeAuth::new(
                &t.resolve("cluster.token")?,
                members.get(me).map_or("", |m| m.name.as_str()),
            )),
            _ => None,
        };
        metrics.cluster_nodes.set(members.len().max(1) as i64);
        // A leaving node owns nothing, so it admits nothing: no part of the registry.
        let registry = if multi && !members[me].leaving {
            let names: Vec<&str> = members
                .iter()
                .filter(|m| !m.leaving)
                .map(|m| m.name.as_str())
                .collect();
            let my_name = members[me].name.clone();
            let shares = Shares::of(config.tenants.max, &names, &my_name);
            let r = Registry::open(store.clone(), |t| {
                names[owner_index(names.iter().copied(), t)] == my_name
            })?;
            metrics.cluster_tenants_registered.set(r.len() as i64);
            metrics.cluster_tenant_slots.set(r.slots(&shares));
            Some((r, ArcSwap::from_pointee(shares)))
        } else {
            None
        };
        let owners = (0..members.len())
            .filter(|i| !members[*i].leaving)
            .collect();
        Ok(Cluster {
            members,
            owners,
            me,
            auth,
            client: crate::http::client(Duration::from_secs(2))?,
            timeout: Duration::from_millis(c.forward_timeout_ms),
            metrics,
            admitted: Mutex::new(HashSet::new()),
            registry,
            borrowing: tokio::sync::Mutex::new(()),
            loans: Default::default(),
            // There from the start: the operator reads its presence as "this release can
            // hand its rows over"; the first pass fills it in.
            handoff: Mutex::new(multi.then(ankusa_api::node::HandoffStatus::default)),
            endpoints_moved: std::sync::OnceLock::new(),
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
        let owner = self.owner_position(tenant);
        (owner != self.me).then(|| &self.members[owner])
    }

    /// The owner of `tenant` (with two nodes or more).
    pub fn owner_of(&self, tenant: &str) -> &Member {
        &self.members[self.owner_position(tenant)]
    }

    /// The place in `members` of `tenant`'s owner: rendezvous over the nodes that are not
    /// leaving.
    fn owner_position(&self, tenant: &str) -> usize {
        let owners = &self.owners;
        owners[owner_index(
            owners.iter().map(|i| self.members[*i].name.as_str()),
            tenant,
        )]
    }

    /// Whether this node is leaving the Relay (it owns no tenant).
    pub fn leaving(&self) -> bool {
        self.members.get(self.me).is_some_and(|m| m.leaving)
    }

    /// This node's part of the tenant registry (two nodes or more).
    pub fn registry(&self) -> Option<&Registry> {
        self.registry.as_ref().map(|(r, _)| r)
    }

    /// This node's place in the Relay, for `/v1/node` (`None` alone).
    pub fn status(&self) -> Option<ankusa_api::node::ClusterStatus> {
        self.is_multi().then(|| ankusa_api::node::ClusterStatus {
            name: self.me().unwrap_or_default().to_owned(),
            nodes: self.members.len() as u32,
            tenants_owned: self.owned() as u64,
            tenants_registered: self.registry().map(|r| r.len() as u64),
            tenant_slots: self
                .registry
                .as_ref()
                .map(|(r, s)| r.slots(&s.load()).max(0) as u64),
            leaving: self.leaving(),
            handoff: self.handoff_status(),
        })
    }

    /// The last handoff pass's account, if one ran.
    pub fn handoff_status(&self) -> Option<ankusa_api::node::HandoffStatus> {
        self.handoff
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// What to do when a handoff moved tenants' endpoints (set once, at boot).
    pub fn on_endpoints_moved(&self, f: impl Fn() + Send + Sync + 'static) {
        let _ = self.endpoints_moved.set(Box::new(f));
    }

    fn endpoints_moved(&self) {
        if let Some(f) = self.endpoints_moved.get() {
            f();
        }
    }

    fn set_handoff_status(&self, status: ankusa_api::node::HandoffStatus) {
        *self.handoff.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
    }

    /// Sends a handoff batch to `to` (`POST /cluster/v1/handoff`): its answer, or why
    /// there is none (unreachable, or a refusal with its status and body).
    pub async fn send_handoff(
        &self,
        to: &str,
        batch: &HandoffBatch,
    ) -> Result<HandoffAnswer, Unreachable> {
        let body = serde_json::to_vec(batch).map_err(|e| Unreachable::new(to, e.to_string()))?;
        self.cluster_call(to, Method::POST, "/cluster/v1/handoff", Bytes::from(body))
            .await
    }

    /// Publishes the registry's size and slots.
    fn publish(&self) {
        if let Some((r, s)) = &self.registry {
            self.metrics.cluster_tenants_registered.set(r.len() as i64);
            self.metrics.cluster_tenant_slots.set(r.slots(&s.load()));
        }
    }

    /// A reload's `tenants.max`: this node's share of it from now on (the node list does
    /// not change without a restart). Loans stay as they are: slots lent or borrowed keep
    /// counting, so a lower `tenants.max` may leave a node with fewer slots than tenants —
    /// it keeps serving them and admits no new one until it has slots again.
    pub fn set_tenants_max(&self, max: u32) {
        let (Some((_, shares)), Some(me)) = (&self.registry, self.me()) else {
            return;
        };
        let names: Vec<&str> = self
            .owners
            .iter()
            .map(|&i| self.members[i].name.as_str())
            .collect();
        shares.store(Arc::new(Shares::of(max, &names, me)));
        self.publish();
    }

    /// Tenants this node has taken hooks for as their owner since it started.
    pub fn owned(&self) -> usize {
        self.admitted
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// Whether a request came from a node of the Relay: the listener's edge checked its
    /// signature ([`edge`]).
    pub fn authentic(&self, headers: &HeaderMap) -> bool {
        self.is_multi() && headers.contains_key(VERIFIED_HEADER)
    }

    /// The signer and checker of node requests (`None`: a single node).
    pub fn auth(&self) -> Option<&ankusa_verify::node::NodeAuth> {
        self.auth.as_ref()
    }

    /// Makes sure the registry holds `tenant` before this node, its owner, stores a hook
    /// of it: once per tenant and process. `exists`: whether the store already holds it —
    /// then it is registered whatever this node's slots. A new tenant takes a free slot;
    /// with none, this node borrows from the others: `Limit` when every other node
    /// answered that it has none, [`AdmitError::Unreachable`] when one that did not answer
    /// might have some.
    pub async fn admit(
        self: &Arc<Self>,
        tenant: &str,
        exists: impl FnOnce() -> Result<bool, QueueError>,
    ) -> Result<Admission, AdmitError> {
        let Some((registry, shares)) = &self.registry else {
            return Ok(Admission::Admitted);
        };
        if self.is_admitted(tenant) {
            return Ok(Admission::Admitted);
        }
        let shares = shares.load_full();
        let mut exists = exists()?;
        let (mut unreachable, mut one_loan, mut asked) = (None, None, false);
        loop {
            let answer = registry.admit(tenant, exists, &shares);
            self.publish();
            if answer == Admission::Admitted {
                self.remember(tenant);
                return Ok(answer);
            }
            if let Some(e) = unreachable {
                return Err(AdmitError::Unreachable(e));
            }
            if one_loan.is_none() {
                // One loan at a time: after the one under way, look again (it may have
                // brought the slot this tenant needs).
                one_loan = Some(self.borrowing.lock().await);
                continue;
            }
            if !asked {
                // A tenant another node stores exists: one that moved here when the node
                // list changed is never refused, whatever the slots.
                asked = true;
                exists = self.stored_elsewhere(&shares.peers, tenant).await;
                continue;
            }
            match self
                .borrow(registry, &shares, (shares.share / 4).max(1))
                .await
            {
                Loan::Got => {}
                Loan::NoneFree => return Ok(Admission::Limit),
                Loan::Unanswered(e) => unreachable = Some(e),
            }
        }
    }

    /// Whether one of `peers` stores `tenant` (`GET /cluster/v1/stored`, all at once; a
    /// node that does not answer counts as no).
    async fn stored_elsewhere(&self, peers: &[String], tenant: &str) -> bool {
        let path = format!(
            "/cluster/v1/stored?tenant={}",
            crate::http::percent_encode(tenant)
        );
        let asks = peers
            .iter()
            .map(|p| self.cluster_call(p, Method::GET, &path, Bytes::new()));
        futures_util::future::join_all(asks)
            .await
            .into_iter()
            .any(|a: Result<Stored, _>| a.is_ok_and(|v| v.stored))
    }

    /// Borrows what this node holds past its slots (tenants registered because they
    /// existed: a share that shrank when a node joined, a store from before slots), so
    /// that the Relay's tenants stay within `tenants.max`. Until it is covered, the Relay
    /// may hold that many too many.
    async fn cover_deficit(&self, registry: &Registry, shares: &Shares) {
        let _one = self.borrowing.lock().await;
        loop {
            let deficit = registry.len() as i64 - registry.slots(shares);
            if deficit <= 0 {
                return;
            }
            if !matches!(
                self.borrow(registry, shares, deficit as u64).await,
                Loan::Got
            ) {
                return;
            }
        }
    }

    /// Asks the other nodes, one after another from a place that turns, to lend up to
    /// `want` slots.
    async fn borrow(&self, registry: &Registry, shares: &Shares, want: u64) -> Loan {
        let me = self.me().unwrap_or_default();
        let body = Bytes::from(
            serde_json::to_vec(&LendRequest {
                to: me.to_owned(),
                want,
            })
            .unwrap_or_default(),
        );
        let n = shares.peers.len();
        let start = self
            .loans
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            % n.max(1);
        let mut unanswered = None;
        for peer in shares.peers.iter().cycle().skip(start).take(n) {
            let answer = self
                .cluster_call::<Lent>(peer, Method::POST, "/cluster/v1/slots/lend", body.clone())
                .await
                .map(|v| (v.lent_total, v.given));
            match answer {
                Ok((total, given)) => {
                    if let Err(e) = registry.learn(peer, total, 0) {
                        tracing::error!(error = %e, "recording a loan");
                        continue;
                    }
                    self.publish();
                    if given > 0 {
                        tracing::info!(node = %peer, slots = given, "borrowed tenant slots");
                        return Loan::Got;
                    }
                }
                Err(e) => unanswered = Some(e),
            }
        }
        match unanswered {
            Some(e) => Loan::Unanswered(e),
            None => Loan::NoneFree,
        }
    }

    /// Lends `to` up to `want` slots (`POST /cluster/v1/slots/lend`): the slots moved and
    /// the running total lent to `to`.
    pub fn lend(&self, to: &str, want: u64) -> Result<(u64, u64), QueueError> {
        let Some((registry, shares)) = &self.registry else {
            return Ok((0, 0));
        };
        let answer = registry.lend(to, want, &shares.load())?;
        self.publish();
        Ok(answer)
    }

    /// Reads every other node's ledger (retrying one that does not answer every 3 s until
    /// each answered), then again every 30 s, and keeps the larger totals of the loans
    /// between it and this node: a store lost here learns what it lent, and slots a lost
    /// answer parked arrive without waiting for another loan. After each read, borrows
    /// what it holds past its slots ([`Cluster::cover_deficit`]).
    pub async fn learn_loans(self: Arc<Self>) {
        let Some((registry, shares)) = &self.registry else {
            return;
        };
        let me = self.me().unwrap_or_default().to_owned();
        loop {
            let now = shares.load_full();
            self.read_ledgers(registry, &now.peers, &me).await;
            self.cover_deficit(registry, &now).await;
            tokio::time::sleep(Duration::from_secs(30)).await;
        }
    }

    async fn read_ledgers(&self, registry: &Registry, peers: &[String], me: &str) {
        let mut left: Vec<&String> = peers.iter().collect();
        while !left.is_empty() {
            let mut still = Vec::new();
            for peer in left {
                match self
                    .cluster_call::<SlotLedger>(
                        peer,
                        Method::GET,
                        "/cluster/v1/slots",
                        Bytes::new(),
                    )
                    .await
                {
                    Ok(v) => {
                        let lent = v.lent.get(me).copied().unwrap_or(0);
                        let heard = v.heard.get(me).copied().unwrap_or(0);
                        if let Err(e) = registry.learn(peer, lent, heard) {
                            tracing::error!(error = %e, "recording another node's loans");
                            still.push(peer);
                        }
                    }
                    Err(_) => still.push(peer),
                }
            }
            self.publish();
            left = still;
            if !left.is_empty() {
                tokio::time::sleep(Duration::from_secs(3)).await;
            }
        }
    }

    /// This node's ledger, for `GET /cluster/v1/slots`.
    pub fn ledger(&self) -> Option<(Ledger, i64)> {
        self.registry
            .as_ref()
            .map(|(r, s)| (r.ledger(), r.slots(&s.load())))
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

    /// A JSON call to another node's `/cluster/v1/…` (status 200 expected), its answer
    /// read as `T` (`ankusa_api::cluster`).
    async fn cluster_call<T: serde::de::DeserializeOwned>(
        &self,
        name: &str,
        method: Method,
        path: &str,
        body: Bytes,
    ) -> Result<T, Unreachable> {
        let unreachable = |reason: String| Unreachable::new(name, reason);
        let to = self
            .members
            .iter()
            .find(|m| m.name == name)
            .ok_or_else(|| unreachable("not in the node list".into()))?;
        let mut headers = HeaderMap::new();
        headers.insert("content-type", HeaderValue::from_static("application/json"));
        let r = self
            .send("slots", to, &to.admin, method, path, &headers, body)
            .await?;
        let status = r.status();
        let bytes = r
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(e.to_string()))?
            .to_bytes();
        if status != StatusCode::OK {
            return Err(Unreachable {
                code: serde_json::from_slice::<ankusa_api::error::ErrorBody>(&bytes)
                    .ok()
                    .map(|b| b.error),
                ..unreachable(format!(
                    "{path} answered {status}: {}",
                    String::from_utf8_lossy(&bytes)
                ))
            });
        }
        serde_json::from_slice(&bytes).map_err(|e| unreachable(format!("{path}: {e}")))
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

    /// How long a call to another node may take (`cluster.forward_timeout_ms`).
    pub fn call_timeout(&self) -> Duration {
        self.timeout
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
            None => Err(Unreachable::new(name, "not in the node list")),
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
            Unreachable::new(to.name.clone(), reason)
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
        let uri: hyper::Uri = format!("{base}{path_and_query}")
            .parse()
            .map_err(|e: hyper::http::uri::InvalidUri| e.to_string())?;
        // Signed as the node's own path: a base URL's path is a proxy's, which takes it
        // off on the way (the receiver sees `path_and_query`).
        let mut req = hyper::Request::builder().method(method.clone()).uri(uri);
        for (k, v) in headers {
            if !is_hop_by_hop(k) {
                req = req.header(k, v);
            }
        }
        if let Some(auth) = &self.auth {
            req = req.header(
                ankusa_verify::node::AUTH_HEADER,
                auth.sign(&method, path_and_query, &body, ankusa_keyspace::now_ms()),
            );
        }
        let req = req.body(Full::new(body)).map_err(|e| e.to_string())?;
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

/// The most bytes of a node's signed request read at the edge (a forwarded hook of the
/// largest source limit, or a handoff batch).
const MAX_NODE_BODY: usize = (256 << 20) + (1 << 20);

/// Every listener's edge: a request signed as a node's ([`ankusa_verify::node::AUTH_HEADER`]) is checked —
/// its head before its body is read, then its body — and refused with 401
/// `node_unauthorized` (503 while the replay window is full) unless it is whole; a checked
/// one goes on with [`VERIFIED_HEADER`] naming its node. Any other request loses every
/// `ankusa-*` header on the way in (only nodes send them), but `ankusa-cluster-local` on
/// the admin listener (`admin`), which asks a node to answer a call itself and carries no
/// authority of its own: the bearer token still decides.
pub async fn edge(
    cluster: Arc<Cluster>,
    admin: bool,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let (mut parts, body) = req.into_parts();
    if !parts.headers.contains_key(ankusa_verify::node::AUTH_HEADER) {
        let internal: Vec<HeaderName> = parts
            .headers
            .keys()
            .filter(|k| k.as_str().starts_with("ankusa-") && !(admin && *k == LOCAL_HEADER))
            .cloned()
            .collect();
        for k in internal {
            parts.headers.remove(k);
        }
        return next
            .run(axum::extract::Request::from_parts(parts, body))
            .await;
    }
    let refuse = |e: ankusa_verify::node::Refused| {
        cluster
            .metrics
            .cluster_auth_refused
            .get_or_create(&KindLabel {
                kind: e.kind().to_owned(),
            })
            .inc();
        tracing::warn!(error = %e, "a request signed as a node's was refused");
        if e == ankusa_verify::node::Refused::Full {
            return crate::http::with_retry_after(
                crate::http::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    ErrorCode::Unavailable,
                    e.to_string(),
                ),
                1,
            );
        }
        crate::http::error(
            StatusCode::UNAUTHORIZED,
            ErrorCode::NodeUnauthorized,
            e.to_string(),
        )
    };
    let Some(auth) = cluster.auth() else {
        cluster
            .metrics
            .cluster_auth_refused
            .get_or_create(&KindLabel {
                kind: "not_a_relay".to_owned(),
            })
            .inc();
        return crate::http::error(
            StatusCode::UNAUTHORIZED,
            ErrorCode::NodeUnauthorized,
            "this node is not part of a Relay of several nodes",
        );
    };
    let pq = parts
        .uri
        .path_and_query()
        .map_or_else(|| "/".to_owned(), |p| p.as_str().to_owned());
    let signed = match auth.verify(
        &parts.method,
        &pq,
        &parts.headers,
        ankusa_keyspace::now_ms(),
    ) {
        Ok(s) => s,
        Err(e) => return refuse(e),
    };
    cluster
        .metrics
        .cluster_auth_nonces
        .set(auth.remembered() as i64);
    let bytes = match Limited::new(body, MAX_NODE_BODY).collect().await {
        Ok(c) => c.to_bytes(),
        Err(_) => {
            return crate::http::error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadBody,
                "the body could not be read whole",
            )
        }
    };
    if let Err(e) = signed.check_body(&bytes) {
        return refuse(e);
    }
    parts.headers.remove(ankusa_verify::node::AUTH_HEADER);
    if let Ok(v) = HeaderValue::from_str(&signed.node) {
        parts.headers.insert(VERIFIED_HEADER, v);
    }
    next.run(axum::extract::Request::from_parts(parts, Body::from(bytes)))
        .await
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
            | ankusa_verify::node::AUTH_HEADER
            | VERIFIED_HEADER
    )
}

/// What asking the other nodes for slots came to.
enum Loan {
    Got,
    /// Every other node answered: none free.
    NoneFree,
    /// None lent, and one did not answer.
    Unanswered(Unreachable),
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
