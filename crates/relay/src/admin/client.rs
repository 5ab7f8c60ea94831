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

use std::collections::BTreeMap;
use std::time::Duration;

use ankusa_api::admin::TenantView;
use ankusa_api::merge::Merge;
use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::{json, Value};

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

    /// One call to node `i`: its JSON answer, or an error naming the node and carrying the
    /// API's error code and message.
    pub async fn call(
        &self,
        i: usize,
        method: hyper::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Value> {
        let url = format!("{}{path}", self.urls[i]);
        let mut req = hyper::Request::builder()
            .method(method)
            .uri(&url)
            .header("authorization", &self.auth)
            // Each node answers for itself: this client merges the nodes' answers.
            .header(crate::cluster::LOCAL_HEADER, "1");
        let payload = match body {
            Some(b) => {
                req = req.header("content-type", "application/json");
                Bytes::from(b.to_string())
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
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if !status.is_success() {
            bail!(
                "{url}: {} {}: {}",
                status.as_u16(),
                v["error"].as_str().unwrap_or("error"),
                v["message"].as_str().unwrap_or("")
            );
        }
        Ok(v)
    }

    /// The same call to every node at once; the answers in node order, or the first error.
    pub async fn all(
        &self,
        method: hyper::Method,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<Vec<Value>> {
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

/// Every node's `/v1/node`, with its URL.
pub fn merge_nodes(urls: &[String], answers: Vec<Value>) -> Value {
    let nodes: Vec<Value> = urls
        .iter()
        .zip(answers)
        .enumerate()
        .map(|(i, (u, mut v))| {
            v["node"] = json!(i);
            v["url"] = json!(u);
            v
        })
        .collect();
    let mut total = BTreeMap::<String, i64>::new();
    for n in &nodes {
        if let Some(c) = n["counters"].as_object() {
            for (k, v) in c {
                *total.entry(k.clone()).or_default() += v.as_i64().unwrap_or(0);
            }
        }
    }
    json!({ "nodes": nodes, "counters": total })
}

/// Tenants from every node's `/v1/tenants?top=N`, one row per tenant with its views added
/// up ([`TenantView::absorb`]) and the nodes that hold it, most pending first, `top` of
/// them.
pub fn merge_tenants(answers: Vec<Value>, top: usize) -> Value {
    let mut by: BTreeMap<String, Merged> = BTreeMap::new();
    for (i, a) in answers.iter().enumerate() {
        for t in a["tenants"].as_array().into_iter().flatten() {
            let name = t["tenant"].as_str().unwrap_or_default().to_owned();
            by.entry(name).or_default().add(i, t);
        }
    }
    let mut rows: Vec<Value> = by.into_iter().map(|(t, m)| m.row(&t)).collect(); // As each node orders them: the most pending, then scheduled, then dead.
    let key = |v: &Value| {
        ["pending", "scheduled", "dead"].map(|k| v["counters"][k].as_i64().unwrap_or(0))
    };
    rows.sort_by(|a, b| {
        key(b)
            .cmp(&key(a))
            .then_with(|| a["tenant"].as_str().cmp(&b["tenant"].as_str()))
    });
    rows.truncate(top);
    // A Relay's tenant count is the sum of its nodes' registries; nodes that are not one
    // Relay (no `owned`) each count their own.
    let registered: Vec<u64> = answers
        .iter()
        .filter_map(|a| a["registered"].as_u64())
        .collect();
    let total = (!registered.is_empty())
        .then(|| registered.iter().sum::<u64>())
        .or_else(|| {
            answers
                .iter()
                .all(|a| a["owned"].is_null())
                .then(|| {
                    answers
                        .iter()
                        .map(|a| a["total"].as_u64())
                        .sum::<Option<u64>>()
                })
                .flatten()
        });
    json!({ "tenants": rows, "total": total })
}

/// One tenant's views over the nodes that know it (`None`: a node that does not), added
/// up.
pub fn merge_tenant(tenant: &str, answers: Vec<Option<Value>>) -> Option<Value> {
    let mut m = Merged::default();
    for (i, a) in answers.into_iter().enumerate() {
        if let Some(a) = a {
            m.add(i, &a);
        }
    }
    (!m.nodes.is_empty()).then(|| m.row(tenant))
}

/// One tenant's views from several nodes ([`TenantView::absorb`]), and which nodes.
#[derive(Default)]
struct Merged {
    view: Option<TenantView>,
    nodes: Vec<usize>,
}

impl Merged {
    /// Node `i`'s view `t` (a view that does not read as one adds nothing but the node).
    fn add(&mut self, i: usize, t: &Value) {
        self.nodes.push(i);
        if let Ok(v) = serde_json::from_value::<TenantView>(t.clone()) {
            match &mut self.view {
                Some(m) => m.merge(&v),
                None => self.view = Some(v),
            }
        }
    }

    fn row(self, tenant: &str) -> Value {
        let view = TenantView {
            tenant: tenant.to_owned(),
            // An ordinal is one node's: a merged view has none.
            ord: None,
            ..self.view.unwrap_or_default()
        };
        let mut row = serde_json::to_value(view).unwrap_or_default();
        row["nodes"] = json!(self.nodes);
        row
    }
}

/// The body of `PUT /v1/tenants/{t}/limits` from `KEY=VALUE` pairs (`none`: `null`).
pub fn limits_body(pairs: &[String]) -> anyhow::Result<Value> {
    let mut body = serde_json::Map::new();
    for p in pairs {
        let (k, v) = p
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--set {p:?}: expected KEY=VALUE"))?;
        let value = if v == "none" {
            Value::Null
        } else {
            let n: f64 = v
                .parse()
                .map_err(|_| anyhow::anyhow!("--set {p:?}: {v:?} is not a number or none"))?;
            serde_json::Number::from_f64(n)
                .map(|n| match n.as_f64() {
                    Some(f) if f.fract() == 0.0 && f >= 0.0 => json!(f as u64),
                    _ => Value::Number(n),
                })
                .ok_or_else(|| anyhow::anyhow!("--set {p:?}: not a finite number"))?
        };
        body.insert(k.to_owned(), value);
    }
    Ok(Value::Object(body))
}

/// One tenant's limits from every node: the first node's, with `changed` and `refused`
/// summed.
pub fn merge_limits(answers: Vec<Value>) -> Value {
    let mut out = answers.first().cloned().unwrap_or(Value::Null);
    for f in ["changed", "refused"] {
        if out.get(f).is_some() {
            out[f] = json!(answers
                .iter()
                .map(|a| a[f].as_u64().unwrap_or(0))
                .sum::<u64>());
        }
    }
    out
}

/// Items from every node's page, each with its node and a merged id, newest first (by
/// `key`), `limit` of them.
pub fn merge_items(answers: Vec<Value>, key: &str, limit: usize) -> Value {
    let mut items: Vec<Value> = Vec::new();
    for (i, a) in answers.into_iter().enumerate() {
        for mut it in a["items"].as_array().cloned().unwrap_or_default() {
            let id = match &it["id"] {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            it["id"] = json!(format!("{i}/{id}"));
            it["node"] = json!(i);
            items.push(it);
        }
    }
    items.sort_by(|a, b| b[key].as_u64().cmp(&a[key].as_u64()));
    items.truncate(limit);
    json!({ "items": items })
}

/// Sums the numeric fields of every node's answer (replay and purge reports).
pub fn sum_reports(answers: &[Value]) -> Value {
    let mut total = serde_json::Map::new();
    for a in answers {
        for (k, v) in a.as_object().into_iter().flatten() {
            if let Some(n) = v.as_i64() {
                let t = total.entry(k.clone()).or_insert(json!(0));
                *t = json!(t.as_i64().unwrap_or(0) + n);
            } else if let Some(b) = v.as_bool() {
                // A flag (`more`) is true if any node's is.
                let t = total.entry(k.clone()).or_insert(json!(false));
                *t = json!(t.as_bool().unwrap_or(false) || b);
            } else {
                total.entry(k.clone()).or_insert(v.clone());
            }
        }
    }
    Value::Object(total)
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

/// A JSON value as a table cell.
/// A table column of epoch milliseconds (`at_ms`, `next_attempt_ms`, …; not durations
/// such as `latency_ms`): the CLI's tables show it as a time, `--json` keeps the number.
pub fn is_time_column(name: &str) -> bool {
    name.ends_with("_ms") && !name.starts_with("latency")
}

/// A time column's header: `at_ms` → `at`.
pub fn time_header(name: &str) -> &str {
    if is_time_column(name) {
        name.strip_suffix("_ms").unwrap_or(name)
    } else {
        name
    }
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

/// The cell of column `name`: a time for a time column, else [`cell`].
pub fn cell_of(name: &str, v: &Value, now_ms: u64) -> String {
    match v.as_u64() {
        Some(ms) if is_time_column(name) && ms > 0 => when(ms, now_ms),
        _ => cell(v),
    }
}

pub fn cell(v: &Value) -> String {
    match v {
        Value::Null => "-".into(),
        Value::String(s) => s.clone(),
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
        assert!(is_time_column("next_attempt_ms") && is_time_column("at_ms"));
        assert!(!is_time_column("latency_ms") && !is_time_column("attempts"));
        assert_eq!(time_header("received_ms"), "received");
        assert_eq!(cell_of("latency_ms", &json!(4.2), now), "4.2");
        assert_eq!(cell_of("at_ms", &Value::Null, now), "-");
    }

    #[test]
    fn merged_listings_sum_and_order_across_nodes() {
        let a = json!({ "tenants": [
            { "tenant": "acme", "counters": { "pending": 5, "scheduled": 0, "inflight": 0, "dead": 1, "bytes": 0, "archive_pending": 0 } },
            { "tenant": "globex", "counters": { "pending": 1, "scheduled": 0, "inflight": 0, "dead": 0, "bytes": 0, "archive_pending": 0 } },
        ]});
        let b = json!({ "tenants": [{ "tenant": "acme", "counters": { "pending": 2, "scheduled": 0, "inflight": 0, "dead": 3, "bytes": 0, "archive_pending": 0 } }] });
        let m = merge_tenants(vec![a, b], 10);
        assert_eq!(m["tenants"][0]["tenant"], "acme");
        assert_eq!(m["tenants"][0]["counters"]["pending"], 7);
        assert_eq!(m["tenants"][0]["counters"]["dead"], 4);
        assert_eq!(m["tenants"][0]["nodes"], json!([0, 1]));
        assert_eq!(m["tenants"].as_array().unwrap().len(), 2);
        assert!(m["total"].is_null(), "no node said how many tenants it has");
        // Nodes that are not one Relay each count their own; a Relay's nodes' registries
        // add up; a Relay whose registries gave no count has none.
        let lone = json!({ "tenants": [], "total": 4 });
        assert_eq!(merge_tenants(vec![lone.clone(), lone], 10)["total"], 8);
        let reg = json!({ "tenants": [], "total": 3, "owned": 3, "registered": 5 });
        let reg2 = json!({ "tenants": [], "total": 2, "owned": 2, "registered": 2 });
        assert_eq!(merge_tenants(vec![reg2, reg], 10)["total"], 7);
        let other = json!({ "tenants": [], "total": 2, "owned": 2 });
        assert!(merge_tenants(vec![other], 10)["total"].is_null());
        // Scheduled and dead work orders tenants with the same pending count.
        let c = json!({ "tenants": [
            { "tenant": "a", "counters": { "pending": 0, "scheduled": 0, "inflight": 0, "dead": 2, "bytes": 0, "archive_pending": 0 } },
            { "tenant": "b", "counters": { "pending": 0, "scheduled": 1, "inflight": 0, "dead": 0, "bytes": 0, "archive_pending": 0 } },
        ]});
        let m = merge_tenants(vec![c], 10);
        assert_eq!(m["tenants"][0]["tenant"], "b");

        let d = merge_items(
            vec![
                json!({ "items": [{ "id": "5.1.0", "at_ms": 5 }, { "id": "2.1.0", "at_ms": 2 }] }),
                json!({ "items": [{ "id": "9.4.0", "at_ms": 9 }] }),
            ],
            "at_ms",
            2,
        );
        let ids: Vec<&str> = d["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|i| i["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, ["1/9.4.0", "0/5.1.0"]);
        assert_eq!(split_id("1/9.4.0", 2).unwrap(), (1, "9.4.0".to_owned()));
        assert!(split_id("2/9.4.0", 2).is_err());
        assert!(split_id("9.4.0", 2).is_err());

        let s = sum_reports(&[
            json!({ "tenant": "acme", "due": 3, "dead": 1 }),
            json!({ "tenant": "acme", "due": 2, "dead": 0 }),
        ]);
        assert_eq!(s, json!({ "tenant": "acme", "due": 5, "dead": 1 }));
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
