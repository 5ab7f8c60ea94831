//! Polling the nodes: `GET /v1/node` and `GET /v1/tenants?top=N` on each ready pod's
//! admin port, through the headless Service, with the operator's admin token.
//!
//! A node that does not answer (or answers garbage) is a reading of its own — reported in
//! `status.nodes[]` and the `Degraded` condition — never an error of the reconcile: one
//! sick node must not stop the operator from managing the others.

use std::time::Duration;

use ankusa_api::node::NodeStatus;
use ankusa_crds::status::TOP_TENANTS_MAX;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use serde::Deserialize;

use crate::observed::NodeReading;

/// The default address of a node's admin API: its DNS name under the headless Service.
pub const DEFAULT_URL_TEMPLATE: &str = "http://{pod}.{service}.{namespace}.svc:9090";

/// Largest answer read from a node.
const MAX_BODY: usize = 1 << 20;

/// Why a node's status could not be read: reported in `status.nodes[]` and the `Degraded`
/// condition, never a failed reconcile.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    #[error("bad request to {url}: {source}")]
    Request {
        url: String,
        source: hyper::http::Error,
    },
    #[error(transparent)]
    Transport(#[from] hyper_util::client::legacy::Error),
    #[error("reading the answer: {0}")]
    Body(String),
    #[error("answered {status}: {body}")]
    Status {
        status: hyper::StatusCode,
        body: String,
    },
    #[error("unreadable answer: {0}")]
    Decode(#[from] serde_json::Error),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

#[derive(Clone)]
pub struct NodeClient {
    http: Client<HttpConnector, Full<Bytes>>,
    template: String,
    timeout: Duration,
}

#[derive(Deserialize)]
struct TopAnswer {
    tenants: Vec<TopEntry>,
}

#[derive(Deserialize)]
struct TopEntry {
    tenant: String,
    counters: ankusa_api::node::Counters,
    #[serde(default)]
    oldest_due_at_ms: Option<u64>,
    #[serde(default)]
    paused_since_ms: Option<u64>,
    #[serde(default)]
    quota_refusals: u64,
}

impl NodeClient {
    /// `template` names the admin URL of a pod with `{pod}`, `{service}` and `{namespace}`.
    pub fn new(template: impl Into<String>, timeout: Duration) -> NodeClient {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(timeout));
        NodeClient {
            http: Client::builder(hyper_util::rt::TokioExecutor::new()).build(connector),
            template: template.into(),
            timeout,
        }
    }

    pub fn url(&self, pod: &str, service: &str, namespace: &str) -> String {
        self.template
            .replace("{pod}", pod)
            .replace("{service}", service)
            .replace("{namespace}", namespace)
    }

    /// Read a node's status and its top tenants.
    pub async fn poll(&self, base: &str, token: &str) -> Result<NodeReading, PollError> {
        let base = base.trim_end_matches('/');
        let status: NodeStatus = self.get_json(&format!("{base}/v1/node"), token).await?;
        let top: TopAnswer = self
            .get_json(&format!("{base}/v1/tenants?top={TOP_TENANTS_MAX}"), token)
            .await?;
        Ok(NodeReading {
            status,
            top: top
                .tenants
                .into_iter()
                .map(|t| crate::observed::TenantReading {
                    tenant: t.tenant,
                    pending: t.counters.pending,
                    dead: t.counters.dead,
                    oldest_due_at_ms: t.oldest_due_at_ms,
                    paused: t.paused_since_ms.is_some(),
                    quota_refusals: t.quota_refusals,
                })
                .collect(),
        })
    }

    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        url: &str,
        token: &str,
    ) -> Result<T, PollError> {
        let req = hyper::Request::get(url)
            .header("authorization", format!("Bearer {token}"))
            // This node's own view: the operator sums the nodes itself.
            .header("ankusa-cluster-local", "1")
            .body(Full::new(Bytes::new()))
            .map_err(|source| PollError::Request {
                url: url.to_owned(),
                source,
            })?;
        let fut = async {
            let resp = self.http.request(req).await?;
            let status = resp.status();
            let body = http_body_util::Limited::new(resp.into_body(), MAX_BODY)
                .collect()
                .await
                .map_err(|e| PollError::Body(e.to_string()))?
                .to_bytes();
            if !status.is_success() {
                return Err(PollError::Status {
                    status,
                    body: String::from_utf8_lossy(&body[..body.len().min(200)]).into_owned(),
                });
            }
            Ok(serde_json::from_slice(&body)?)
        };
        match tokio::time::timeout(self.timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(PollError::Timeout(self.timeout)),
        }
    }
}
