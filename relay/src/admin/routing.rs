//! The admin API of a Relay of several nodes answers relay-wide from any of them.
//!
//! - A call that names a tenant goes to the tenant's owner, with the caller's own token:
//!   `GET /v1/dlq?tenant=t` is the owner's page; `GET /v1/tenants/{t}`,
//!   `DELETE /v1/tenants/{t}/queue` and `POST /v1/dlq/replay` with `"tenant"` go to every
//!   node at once (a former owner still draining the tenant's rows answers too) and their
//!   answers are added up. Owner unreachable: 503 `owner_unavailable`.
//! - `GET /v1/tenants` asks every node and merges: a tenant's counters summed over the nodes
//!   that hold rows of it, `total` from the Relay's tenant registry, and each node's
//!   answer in `nodes` (`unavailable` names the nodes that gave none).
//! - A call carrying `ankusa-cluster-local: 1` is answered by the node it reaches (what a
//!   node sends another, and what `ankusa-relay admin` sends when it merges nodes itself).
//!   Calls that name no tenant (the DLQ of every tenant, replay by ids, quarantine, audit,
//!   backups, node status) answer for the node they reach.
//!
//! `POST /cluster/v1/tenants/admit` (cluster token) is the registry's door, on the first node.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::Deserialize;
use serde_json::Value;

use super::api::Api;
use crate::cluster::{Admission, Member, LOCAL_HEADER};
use crate::http::error;

/// The largest replay body read to find its tenant.
const MAX_ROUTED_BODY: usize = 1 << 20;

/// Sends admin calls about another node's tenant to that node; merges `GET /v1/tenants`.
pub async fn to_owner(State(api): State<Arc<Api>>, req: Request, next: Next) -> Response {
    let cluster = &api.cluster;
    if !cluster.is_multi() || req.headers().contains_key(LOCAL_HEADER) {
        return next.run(req).await;
    }
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    if path == "/v1/tenants" && req.method() == Method::GET {
        return merged_tenants(&api, req, next).await;
    }
    let (req, tenant) = if let Some(rest) = path.strip_prefix("/v1/tenants/") {
        let t = rest.split('/').next().map(|t| decode(t, false));
        (req, t)
    } else if path == "/v1/dlq" {
        let t = query_param(&query, "tenant");
        (req, t)
    } else if path == "/v1/dlq/replay" && req.method() == Method::POST {
        let (parts, body) = req.into_parts();
        let Ok(bytes) = http_body_util::Limited::new(body, MAX_ROUTED_BODY)
            .collect()
            .await
            .map(|c| c.to_bytes())
        else {
            return error(
                StatusCode::PAYLOAD_TOO_LARGE,
                "bad_request",
                "the replay request is over 1 MiB",
            );
        };
        let t = serde_json::from_slice::<Value>(&bytes)
            .ok()
            .and_then(|v| v.get("tenant")?.as_str().map(str::to_owned));
        (Request::from_parts(parts, Body::from(bytes)), t)
    } else {
        (req, None)
    };
    let Some(tenant) = tenant else {
        return next.run(req).await;
    };
    // What a former owner still holds counts too: a tenant's view, purge and replay ask
    // every node and add their answers up; a DLQ page is the owner's.
    let merge = match (req.method().clone(), path.as_str()) {
        (Method::GET, p) if p.starts_with("/v1/tenants/") && !p.ends_with("/queue") => {
            Some(Merge::View)
        }
        (Method::DELETE, p) if p.ends_with("/queue") => {
            Some(Merge::Sum(&["due", "dead", "batches"]))
        }
        (Method::POST, "/v1/dlq/replay") => Some(Merge::Sum(&["revived"])),
        _ => None,
    };
    let owner = cluster.owner_of(&tenant).clone();
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|c| c.to_bytes()) else {
        return error(
            StatusCode::BAD_REQUEST,
            "bad_request",
            "the body could not be read",
        );
    };
    let pq = parts
        .uri
        .path_and_query()
        .map_or(path.clone(), |p| p.as_str().to_owned());
    let me = cluster.me().unwrap_or_default().to_owned();
    let Some(merge) = merge else {
        if owner.name == me {
            return next.run(Request::from_parts(parts, Body::from(body))).await;
        }
        return answer_of(
            &owner,
            cluster
                .forward_admin(&owner, parts.method.clone(), &pq, &parts.headers, body)
                .await,
        );
    };
    let (method, headers) = (parts.method.clone(), parts.headers.clone());
    let others = cluster
        .members()
        .iter()
        .filter(|m| m.name != me)
        .map(|m| async {
            let r = cluster
                .forward_admin(m, method.clone(), &pq, &headers, body.clone())
                .await;
            (m.name.clone(), r)
        });
    let (local, remote) = tokio::join!(
        next.run(Request::from_parts(parts, Body::from(body.clone()))),
        futures_util::future::join_all(others)
    );
    let mut answers = vec![(me, Ok(local))];
    answers.extend(remote);
    merged(&owner, answers, merge).await
}

/// How the nodes' answers to one call about a tenant add up.
#[derive(Debug, Clone, Copy)]
enum Merge {
    /// `{tenant, ord, counters}`: the counters summed (the owner's `ord`).
    View,
    /// These numeric fields summed.
    Sum(&'static [&'static str]),
}

/// The owner's answer with every other node's 200 added in; the owner's own answer as it
/// is when it is an error other than 404, 503 `owner_unavailable` when it gave none.
async fn merged(
    owner: &Member,
    answers: Vec<(String, Result<Response, crate::cluster::Unreachable>)>,
    merge: Merge,
) -> Response {
    let mut owner_answer = None;
    let mut found: Vec<Value> = Vec::new();
    let mut unavailable = Vec::new();
    for (name, r) in answers {
        let is_owner = name == owner.name;
        let resp = match r {
            Ok(resp) => resp,
            Err(e) if is_owner => return answer_of(owner, Err(e)),
            Err(_) => {
                unavailable.push(name);
                continue;
            }
        };
        let status = resp.status();
        let Ok(bytes) = resp.into_body().collect().await.map(|c| c.to_bytes()) else {
            unavailable.push(name);
            continue;
        };
        if is_owner {
            if status != StatusCode::OK && status != StatusCode::NOT_FOUND {
                return raw(status, bytes);
            }
            owner_answer = Some((status, bytes.clone()));
        }
        if status == StatusCode::OK {
            let v: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            // The owner's answer first: its `ord` and shape are the view's.
            if is_owner {
                found.insert(0, v);
            } else {
                found.push(v);
            }
        } else if status != StatusCode::NOT_FOUND && !is_owner {
            unavailable.push(name);
        }
    }
    let Some(mut out) = found.first().cloned() else {
        return match owner_answer {
            Some((status, bytes)) => raw(status, bytes),
            None => error(StatusCode::NOT_FOUND, "not_found", "no such tenant"),
        };
    };
    for v in &found[1..] {
        match merge {
            Merge::View => add_counters(&mut out, v),
            Merge::Sum(fields) => {
                for f in fields {
                    let sum = out[*f].as_i64().unwrap_or(0) + v[*f].as_i64().unwrap_or(0);
                    out[*f] = sum.into();
                }
            }
        }
    }
    if !unavailable.is_empty() {
        out["unavailable"] = unavailable.into();
    }
    Json(out).into_response()
}

/// An answer as it came.
fn raw(status: StatusCode, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json"),
    );
    r
}

fn answer_of(owner: &Member, r: Result<Response, crate::cluster::Unreachable>) -> Response {
    r.unwrap_or_else(|e| {
        let mut r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            "owner_unavailable",
            format!(
                "{} owns this tenant and did not answer: {}",
                owner.name, e.reason
            ),
        );
        r.headers_mut()
            .insert("retry-after", axum::http::HeaderValue::from(5));
        r
    })
}

/// `GET /v1/tenants` relay-wide: every node's own answer, merged.
async fn merged_tenants(api: &Api, req: Request, next: Next) -> Response {
    let cluster = &api.cluster;
    let headers: HeaderMap = req.headers().clone();
    let pq = req
        .uri()
        .path_and_query()
        .map_or("/v1/tenants".to_owned(), |p| p.as_str().to_owned());
    let top = query_param(req.uri().query().unwrap_or(""), "top")
        .and_then(|t| t.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, api.config.admin.max_page);
    let me = cluster.me().unwrap_or_default().to_owned();
    let others = cluster
        .members()
        .iter()
        .filter(|m| m.name != me)
        .map(|m| async {
            let r = cluster
                .forward_admin(m, Method::GET, &pq, &headers, Bytes::new())
                .await;
            (m.name.clone(), r)
        });
    let (local, remote) = tokio::join!(next.run(req), futures_util::future::join_all(others));
    let mut answers = vec![(me, Ok(local))];
    answers.extend(remote);
    let mut merged: std::collections::BTreeMap<String, Value> = Default::default();
    let (mut nodes, mut unavailable) = (Vec::new(), Vec::new());
    let (mut registered, mut summed_total) = (None, 0u64);
    for (name, r) in answers {
        let Ok(resp) = r else {
            unavailable.push(name);
            continue;
        };
        let status = resp.status();
        let body = match resp.into_body().collect().await {
            Ok(b) => b.to_bytes(),
            Err(_) => {
                unavailable.push(name);
                continue;
            }
        };
        if status != StatusCode::OK {
            // The caller's own error (a bad token, a bad parameter) is every node's.
            return raw(status, body);
        }
        let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if let Some(n) = v.get("registered").and_then(Value::as_u64) {
            registered = Some(n);
        }
        summed_total += v.get("total").and_then(Value::as_u64).unwrap_or(0);
        nodes.push(serde_json::json!({
            "node": name,
            "total": v.get("total"),
            "owned": v.get("owned"),
        }));
        for t in v
            .get("tenants")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let Some(id) = t.get("tenant").and_then(Value::as_str) else {
                continue;
            };
            match merged.get_mut(id) {
                None => {
                    let mut t = t.clone();
                    if let Some(o) = t.as_object_mut() {
                        o.remove("ord");
                    }
                    merged.insert(id.to_owned(), t);
                }
                Some(m) => add_counters(m, t),
            }
        }
    }
    let mut tenants: Vec<Value> = merged.into_values().collect();
    let pending = |t: &Value| t["counters"]["pending"].as_i64().unwrap_or(0);
    tenants.sort_by_key(|t| std::cmp::Reverse(pending(t)));
    tenants.truncate(top);
    Json(serde_json::json!({
        "tenants": tenants,
        "total": registered.unwrap_or(summed_total),
        "nodes": nodes,
        "unavailable": unavailable,
    }))
    .into_response()
}

/// Adds `from`'s counters to `into`'s.
fn add_counters(into: &mut Value, from: &Value) {
    let (Some(i), Some(f)) = (
        into.get_mut("counters").and_then(Value::as_object_mut),
        from.get("counters").and_then(Value::as_object),
    ) else {
        return;
    };
    for (k, v) in f {
        if let (Some(a), Some(b)) = (i.get(k).and_then(Value::as_i64), v.as_i64()) {
            i.insert(k.clone(), Value::from(a + b));
        }
    }
}

/// A query parameter, decoded.
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (decode(k, true) == name).then(|| decode(v, true))
    })
}

/// Percent-decoding (and `+` as a space in a query).
fn decode(s: &str, plus_is_space: bool) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok();
                match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                    Some(c) => {
                        out.push(c);
                        i += 3;
                        continue;
                    }
                    None => out.push(b'%'),
                }
            }
            b'+' if plus_is_space => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdmitRequest {
    tenant: String,
    #[serde(default)]
    exists: bool,
}

/// `POST /cluster/v1/tenants/admit` on the registry node: 200 admitted, 409
/// `tenant_limit`.
pub async fn admit(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Json(req): Json<AdmitRequest>,
) -> Response {
    let cluster = api.cluster.clone();
    if !cluster.authentic(&headers) {
        return error(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "the cluster token is required",
        );
    }
    if cluster.registry().is_none() {
        return error(
            StatusCode::NOT_FOUND,
            "not_registry",
            "this node does not keep the Relay's tenant registry (the first node does)",
        );
    }
    let answer = tokio::task::spawn_blocking(move || {
        let r = cluster
            .registry()
            .map(|r| (r.admit(&req.tenant, req.exists), r.len()));
        (cluster, r)
    })
    .await;
    match answer {
        Ok((cluster, Some((Ok(a), n)))) => {
            cluster.set_registered(n);
            match a {
                Admission::Admitted => {
                    Json(serde_json::json!({ "admitted": true })).into_response()
                }
                Admission::Limit => error(
                    StatusCode::CONFLICT,
                    "tenant_limit",
                    "the Relay holds tenants.max tenants",
                ),
            }
        }
        _ => error(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the registry could not record the tenant",
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn query_parameters_and_path_segments_are_percent_decoded() {
        assert_eq!(
            super::query_param("limit=5&tenant=acme%2Fus+east", "tenant").as_deref(),
            Some("acme/us east")
        );
        assert_eq!(super::query_param("a=1", "tenant"), None);
        assert_eq!(super::decode("a%20b%zz%4", false), "a b%zz%4");
    }
}
