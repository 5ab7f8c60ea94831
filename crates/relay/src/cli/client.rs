//! `ankusa-relay admin …`: the admin API of one node, or of every node of a Relay merged
//! into one answer.
//!
//! Each node has its own store, so a Relay's DLQ, replay, purge and tenant counts are the
//! sum of its nodes'. Given several node URLs (or, with `--all-addresses`, a host name that
//! resolves to several addresses, such as a Relay's headless Service), every call goes to
//! every node at once
//! and the answers are merged: one DLQ listing newest first, one replay count, one
//! purge report, one row per tenant with its counters summed. A node that does not answer
//! fails the command (naming it): a merged answer never leaves a node out silently.
//!
//! Row ids of merged listings are `<node>/<id>`, `<node>` the node's place in the list
//! the command prints; `dlq replay --id` and `quarantine delete --id` take them back.

use std::time::Duration;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde::de::DeserializeOwned;
use serde::Serialize;

use ankusa_api::admin::{TenantView, TenantsTop};
use ankusa_api::error::{ErrorBody, ErrorCode};
use ankusa_api::merge::Merge;
use ankusa_api::node::{Counters, NodeStatus};

/// A body for [`Nodes::call`].
pub fn body(b: &impl Serialize) -> anyhow::Result<Bytes> {
    Ok(Bytes::from(serde_json::to_vec(b)?))
}

/// A node's refusal of a call: its status and the API's error code.
#[derive(Debug)]
pub struct Refused {
    pub url: String,
    pub status: u16,
    /// `None`: the answer was not the API's error body.
    pub code: Option<ErrorCode>,
    pub message: String,
}

impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let code = self.code.map_or("error", ErrorCode::as_str);
        write!(f, "{}: {} {code}: {}", self.url, self.status, self.message)
    }
}

impl std::error::Error for Refused {}

/// Whether `e` is a node's refusal with `code`.
pub fn is_code(e: &anyhow::Error, code: ErrorCode) -> bool {
    e.downcast_ref::<Refused>()
        .is_some_and(|r| r.code == Some(code))
}

/// Whether `e` is a node's refusal with one of `statuses`.
pub fn is_status(e: &anyhow::Error, statuses: &[u16]) -> bool {
    e.downcast_ref::<Refused>()
        .is_some_and(|r| statuses.contains(&r.status))
}

/// The nodes a command talks to, and how.
pub struct Nodes {
    /// Base URLs, one per node, in a stable order (as given, each host's addresses sorted).
    pub urls: Vec<String>,
    client: crate::http::Client,
    auth: String,
    timeout: Duration,
}

/// Splits `http://host:port/prefix` into scheme, host, port and the rest.
/// `host:port` (or `host`) as `http://host:port`: a URL without a scheme is a node's
/// plain-HTTP admin listener.
fn with_scheme(url: &str) -> String {
    if url.contains("://") {
        url.to_owned()
    } else {
        format!("http://{url}")
    }
}

fn split_url(url: &str) -> anyhow::Result<(String, String, u16, String)> {
    let uri: hyper::Uri = url
        .parse()
        .with_context(|| format!("{url:?} is not a URL"))?;
    let scheme = uri.scheme_str().unwrap_or("http").to_owned();
    let host = uri
        .host()
        .ok_or_else(|| anyhow!("{url:?} has no host"))?
        .to_owned();
    let port = uri
        .port_u16()
        .unwrap_or(if scheme == "https" { 443 } else { 80 });
    let rest = uri.path().trim_end_matches('/').to_owned();
    Ok((scheme, host, port, rest))
}

impl Nodes {
    /// The nodes behind `urls`. With `all_addresses`, an `http://` URL whose host resolves
    /// to several addresses stands for each of them (`https://` URLs are kept as given, for
    /// their certificates' names).
    pub async fn resolve(
        urls: &[String],
        all_addresses: bool,
        token: &str,
        timeout: Duration,
    ) -> anyhow::Result<Nodes> {
        let mut out = Vec::new();
        for url in urls.iter().flat_map(|u| u.split(',')).map(str::trim) {
            if url.is_empty() {
                continue;
            }
            let url = with_scheme(url);
            let url = url.as_str();
            let (scheme, host, port, rest) = split_url(url)?;
            if !all_addresses || scheme != "http" || host.parse::<std::net::IpAddr>().is_ok() {
                out.push(url.trim_end_matches('/').to_owned());
                continue;
            }
            let mut addrs: Vec<std::net::SocketAddr> =
                tokio::net::lookup_host((host.as_str(), port))
                    .await
                    .with_context(|| format!("resolving {host}"))?
                    .collect();
            addrs.sort();
            addrs.dedup();
            if addrs.len() <= 1 {
                out.push(url.trim_end_matches('/').to_owned());
            } else {
                out.extend(addrs.iter().map(|a| format!("http://{a}{rest}")));
            }
        }
        if out.is_empty() {
            bail!("no node URL: pass --url (or set ANKUSA_ADMIN_URL)");
        }
        Ok(Nodes {
            urls: out,
            client: crate::http::client(timeout)?,
            auth: format!("Bearer {token}"),
            timeout,
        })
    }

    /// One call to node `i`: its answer read as a `T`, or an error naming the node and
    /// carrying the API's error code and message ([`Refused`], when the node answered one).
    pub async fn call<T: DeserializeOwned>(
        &self,
        i: usize,
        method: hyper::Method,
        path: &str,
        body: Option<&Bytes>,
    ) -> anyhow::Result<T> {
        self.send(i, true, method, path, body).await
    }

    /// One call the Relay routes where it is answered (a tenant's owner): sent to the
    /// first node, without `ankusa-cluster-local`.
    pub async fn routed<T: DeserializeOwned>(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<&Bytes>,
    ) -> anyhow::Result<T> {
        self.send(0, false, method, path, body).await
    }

    async fn send<T: DeserializeOwned>(
        &self,
        i: usize,
        local: bool,
        method: hyper::Method,
        path: &str,
        body: Option<&Bytes>,
    ) -> anyhow::Result<T> {
        let url = format!("{}{path}", self.urls[i]);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(&url)
            .header("authorization", &self.auth);
        if local {
            // Each node answers for itself: this client merges the nodes' answers.
            req = req.header(crate::cluster::LOCAL_HEADER, "1");
        }
        let payload = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                b.clone()
            }
            None => Bytes::new(),
        };
        let req = req.body(Full::new(payload))?;
        let resp = tokio::time::timeout(self.timeout, async {
            let resp = self.client.request(req).await?;
            let status = resp.status();
            let body = resp.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        })
        .await
        .map_err(|_| anyhow!("{url}: no answer within {} s", self.timeout.as_secs()))?
        .with_context(|| url.clone())?;
        let (status, body) = resp;
        if !status.is_success() {
            let refused = serde_json::from_slice::<ErrorBody>(&body).ok();
            return Err(anyhow::Error::new(Refused {
                url,
                status: status.as_u16(),
                code: refused.as_ref().map(|r| r.error),
                message: refused.map(|r| r.message).unwrap_or_default(),
            }));
        }
        serde_json::from_slice(&body).with_context(|| format!("{url}: an answer of another shape"))
    }

    /// The same call to every node at once; the answers in node order, or the first error.
    pub async fn all<T: DeserializeOwned>(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<&Bytes>,
    ) -> anyhow::Result<Vec<T>> {
        let calls = (0..self.urls.len()).map(|i| self.call(i, method.clone(), path, body));
        futures_util::future::join_all(calls)
            .await
            .into_iter()
            .collect()
    }
}

/// Query-string and path escaping of one value.
pub use crate::http::percent_encode as q;

/// A merged id `<node>/<id>`: the node's index and the node's own id.
pub fn split_id(id: &str, nodes: usize) -> anyhow::Result<(usize, String)> {
    let (n, rest) = id
        .split_once('/')
        .ok_or_else(|| anyhow!("{id:?}: ids are <node>/<id>, as the listings print them"))?;
    let n: usize = n
        .parse()
        .map_err(|_| anyhow!("{id:?}: <node> is the node's number in the listing"))?;
    if n >= nodes {
        bail!("{id:?}: there are {nodes} nodes");
    }
    Ok((n, rest.to_owned()))
}

/// One node's `/v1/node`, with its place in the list and its URL.
#[derive(Debug, Serialize)]
pub struct NodeRow {
    pub node: usize,
    pub url: String,
    #[serde(flatten)]
    pub status: NodeStatus,
}

/// `admin node`: every node's status, and their counters summed.
#[derive(Debug, Serialize)]
pub struct NodesOut {
    pub nodes: Vec<NodeRow>,
    pub counters: Counters,
}

/// Every node's `/v1/node`, with its URL.
pub fn merge_nodes(urls: &[String], answers: Vec<NodeStatus>) -> NodesOut {
    let mut counters = Counters::default();
    let nodes = urls
        .iter()
        .zip(answers)
        .enumerate()
        .map(|(i, (u, status))| {
            counters.add(&status.counters);
            NodeRow {
                node: i,
                url: u.clone(),
                status,
            }
        })
        .collect();
    NodesOut { nodes, counters }
}

/// One tenant's views added up over the nodes that hold it ([`Merge`]), and those nodes.
#[derive(Debug, Serialize)]
pub struct TenantRow {
    #[serde(flatten)]
    pub view: TenantView,
    pub nodes: Vec<usize>,
}

/// `admin tenants`: the tenants with the most work over the nodes, and how many there are.
#[derive(Debug, Serialize)]
pub struct TenantsOut {
    pub tenants: Vec<TenantRow>,
    pub total: u64,
}

/// Tenants from every node's `/v1/tenants?top=N`, merged as a node merges them for the
/// whole Relay ([`TenantsTop::ranked`]), each row with the nodes that hold it.
pub fn merge_tenants(answers: Vec<TenantsTop>, top: usize) -> TenantsOut {
    let mut merged = TenantsTop::default();
    for a in &answers {
        merged.merge(a);
    }
    let merged = merged.ranked(top, true);
    let tenants = merged
        .tenants
        .into_iter()
        .map(|view| TenantRow {
            nodes: (0..answers.len())
                .filter(|i| answers[*i].tenants.iter().any(|t| t.tenant == view.tenant))
                .collect(),
            view,
        })
        .collect();
    TenantsOut {
        tenants,
        total: merged.total,
    }
}

/// One tenant's views from the nodes that know it (node index, view), added up; `None`
/// when no node knows it.
pub fn merge_tenant(views: Vec<(usize, TenantView)>) -> Option<TenantRow> {
    let mut nodes = Vec::with_capacity(views.len());
    let mut merged: Option<TenantView> = None;
    for (i, v) in views {
        nodes.push(i);
        match &mut merged {
            Some(m) => m.merge(&v),
            None => merged = Some(v),
        }
    }
    let mut view = merged?;
    // An ordinal is one node's: a merged view has none.
    view.ord = None;
    Some(TenantRow { view, nodes })
}

/// Every node's answer to one call folded into the first ([`Merge`]); `None` when there
/// is none.
pub fn fold<T: Merge>(answers: Vec<T>) -> Option<T> {
    let mut it = answers.into_iter();
    let mut first = it.next()?;
    for a in it {
        first.merge(&a);
    }
    Some(first)
}

/// A plain table: a header row and aligned columns.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<String>, out: &mut String| {
        let padded: Vec<String> = cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(padded.join("  ").trim_end());
        out.push('\n');
    };
    line(headers.iter().map(|h| h.to_uppercase()).collect(), &mut out);
    for r in rows {
        line(r.clone(), &mut out);
    }
    out
}

/// Epoch milliseconds as people read them, against `now_ms`:
/// `2026-12-04T02:30:01Z (3 s ago)`, `… (in 5 min)`.
pub fn when(ms: u64, now_ms: u64) -> String {
    let (secs, sub) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Days since 1970-01-01 to a civil date (the proleptic Gregorian calendar).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let stamp = format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{sub:03}Z",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    );
    let span = |d: u64| match d / 1000 {
        s if s < 120 => format!("{s} s"),
        s if s < 7_200 => format!("{} min", s / 60),
        s if s < 172_800 => format!("{} h", s / 3_600),
        s => format!("{} d", s / 86_400),
    };
    if ms <= now_ms {
        format!("{stamp} ({} ago)", span(now_ms - ms))
    } else {
        format!("{stamp} (in {})", span(ms - now_ms))
    }
}

/// A time cell: `-` for none (or 0), else [`when`].
pub fn time_cell(ms: Option<u64>, now_ms: u64) -> String {
    match ms {
        Some(ms) if ms > 0 => when(ms, now_ms),
        _ => "-".into(),
    }
}

/// A cell of an optional value: `-` for none.
pub fn opt_cell(v: Option<impl ToString>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// A value's cell as its JSON shows it (a string without its quotes; `-` for null): what
/// the `field`/`value` table of a report prints.
pub fn json_cell(v: &serde_json::Value) -> String {
    match v {
        serde_json::Value::Null => "-".into(),
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_url_may_leave_out_its_scheme() {
        assert_eq!(with_scheme("127.0.0.1:9090"), "http://127.0.0.1:9090");
        assert_eq!(
            with_scheme("relay-0.hooks.svc:9090/"),
            "http://relay-0.hooks.svc:9090/"
        );
        assert_eq!(with_scheme("https://r:9090"), "https://r:9090");
        let (scheme, host, port, _) = split_url(&with_scheme("127.0.0.1:9090")).unwrap();
        assert_eq!(
            (scheme.as_str(), host.as_str(), port),
            ("http", "127.0.0.1", 9090)
        );
    }

    #[test]
    fn times_read_as_dates_with_their_distance_from_now() {
        let now = 1_796_351_401_250; // 2026-12-04T02:30:01.250Z
        assert_eq!(when(now - 3_000, now), "2026-12-04T02:29:58.250Z (3 s ago)");
        assert_eq!(
            when(now + 300_000, now),
            "2026-12-04T02:35:01.250Z (in 5 min)"
        );
        assert_eq!(when(0, now), "1970-01-01T00:00:00.000Z (20791 d ago)");
        assert_eq!(
            when(951_782_400_000, 951_782_400_000),
            "2000-02-29T00:00:00.000Z (0 s ago)"
        );
        assert_eq!(time_cell(None, now), "-");
        assert_eq!(time_cell(Some(0), now), "-");
    }

    fn view(tenant: &str, pending: i64, scheduled: i64, dead: i64) -> TenantView {
        TenantView {
            tenant: tenant.into(),
            counters: Counters {
                pending,
                scheduled,
                dead,
                ..Counters::default()
            },
            ..TenantView::default()
        }
    }

    fn top(
        tenants: Vec<TenantView>,
        total: u64,
        owned: Option<u64>,
        reg: Option<u64>,
    ) -> TenantsTop {
        TenantsTop {
            tenants,
            total,
            owned,
            registered: reg,
            ..TenantsTop::default()
        }
    }

    #[test]
    fn merged_listings_sum_and_order_across_nodes() {
        let a = top(
            vec![view("acme", 5, 0, 1), view("globex", 1, 0, 0)],
            2,
            None,
            None,
        );
        let b = top(vec![view("acme", 2, 0, 3)], 1, None, None);
        let m = merge_tenants(vec![a, b], 10);
        assert_eq!(m.tenants[0].view.tenant, "acme");
        assert_eq!(m.tenants[0].view.counters.pending, 7);
        assert_eq!(m.tenants[0].view.counters.dead, 4);
        assert_eq!(m.tenants[0].nodes, [0, 1]);
        assert_eq!(m.tenants.len(), 2);
        // Nodes that are not one Relay each count their own; a Relay's nodes' registries
        // add up.
        assert_eq!(m.total, 3);
        let reg = top(vec![], 3, Some(3), Some(5));
        let reg2 = top(vec![], 2, Some(2), Some(2));
        assert_eq!(merge_tenants(vec![reg2, reg], 10).total, 7);
        // Scheduled and dead work orders tenants with the same pending count.
        let c = top(vec![view("a", 0, 0, 2), view("b", 0, 1, 0)], 2, None, None);
        assert_eq!(merge_tenants(vec![c], 10).tenants[0].view.tenant, "b");

        assert_eq!(split_id("1/9.4.0", 2).unwrap(), (1, "9.4.0".to_owned()));
        assert!(split_id("2/9.4.0", 2).is_err());
        assert!(split_id("9.4.0", 2).is_err());
        assert_eq!(q("a b/é"), "a%20b%2F%C3%A9");
    }

    #[test]
    fn a_table_aligns_its_columns() {
        let t = table(
            &["node", "tenant"],
            &[
                vec!["0".into(), "acme".into()],
                vec!["12".into(), "b".into()],
            ],
        );
        assert_eq!(t, "NODE  TENANT\n0     acme\n12    b\n");
    }
}
