//! The admin calls a Relay of several nodes answers with fan-outs of their own
//! ([`super::routing::Answered::FanOut`]):
//!
//! - `GET /v1/tenants`: every node is asked and the answers merged: a tenant's counters
//!   summed over the nodes that hold rows of it, `total` the sum of the nodes' registered
//!   tenants, and each node's answer in `nodes` (`unavailable` names the nodes that gave
//!   none).
//! - `GET /v1/dlq?tenant=t`: every node's page of the tenant's dead rows, merged newest
//!   first, ids `<node>/<id>`, with a cursor per node.
//! - `POST /v1/dlq/replay`: with ids of such a page, each node revives its own; with a
//!   tenant, every node replays its rows of it and the counts are summed.
//! - `GET /v1/hooks/{id}`: the node reached looks in its hook log, then asks the others.

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;

use super::api::Api;
use super::routing::{
    answer_of, answered_by, get_from_others, merge_as, query_param, raw, read_all, routed_body,
    FanOut,
};
use crate::cluster::{Cluster, Unreachable};
use crate::http::{error, percent_encode as encode, with_retry_after};
use ankusa_api::admin::{DlqItem, DlqPage, NodeTenants, ReplayRequest, Revived, TenantsTop};
use ankusa_api::error::ErrorCode;
use ankusa_api::merge::Merge;

/// `GET /v1/tenants`.
pub const TENANTS: FanOut =
    |api, req, next| Box::pin(async move { merged_tenants(&api, req, next).await });

/// `GET /v1/dlq`: a tenant's, relay-wide; every tenant's, this node's.
pub const DLQ: FanOut = |api, req, next| {
    Box::pin(async move {
        let query = req.uri().query().unwrap_or("").to_owned();
        match query_param(&query, "tenant") {
            Some(t) => merged_dlq(&api, req, next, &t, &query).await,
            None => next.run(req).await,
        }
    })
};

/// `POST /v1/dlq/replay`: by ids that name their nodes, each node its own; by a tenant,
/// every node, the counts summed; else this node's.
pub const DLQ_REPLAY: FanOut = |api, req, next| {
    Box::pin(async move {
        let (parts, body) = req.into_parts();
        let bytes = match routed_body(body).await {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        // A body that does not read as the call's is the handler's to refuse.
        let asked = serde_json::from_slice::<ReplayRequest>(&bytes).ok();
        match asked {
            Some(r) if r.ids.iter().any(|i| i.contains('/')) => {
                let req = Request::from_parts(parts, Body::empty());
                replay_by_ids(&api, req, next, r).await
            }
            Some(ReplayRequest {
                tenant: Some(t), ..
            }) => answered_by(&api, &t, parts, bytes, next, Some(merge_as::<Revived>)).await,
            _ => {
                next.run(Request::from_parts(parts, Body::from(bytes)))
                    .await
            }
        }
    })
};

/// `GET /v1/hooks/{id}`.
pub const HOOK: FanOut =
    |api, req, next| Box::pin(async move { hook_anywhere(&api, req, next).await });

/// `GET /v1/dlq?tenant=t` relay-wide: every node's page of the tenant's dead rows (its
/// owner's and a former owner's), merged newest first. Ids are `<node>/<id>`; `next` holds
/// each node's own cursor (`<node>:<id>,…`; a node missing from it has no more rows).
async fn merged_dlq(api: &Api, req: Request, next: Next, tenant: &str, query: &str) -> Response {
    let cluster = &api.cluster;
    let limit = query_param(query, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, api.config.load().admin.max_page);
    let Some(from) = dlq_cursors(cluster, query_param(query, "before").as_deref()) else {
        return error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, "bad cursor");
    };
    let pq_of = |before: &Option<String>| {
        let mut q = format!("/v1/dlq?tenant={}&limit={limit}", encode(tenant));
        if let Some(b) = before {
            q.push_str(&format!("&before={}", encode(b)));
        }
        q
    };
    let me = cluster.me().unwrap_or_default().to_owned();
    let owner = cluster.owner_of(tenant).clone();
    let (mut parts, _) = req.into_parts();
    let headers = parts.headers.clone();
    let mine = from.iter().find(|(n, _)| *n == me).map(|(_, c)| c.clone());
    let local = async {
        match mine {
            Some(c) => {
                parts.uri = pq_of(&c).parse().unwrap_or_default();
                Some(Ok(next
                    .run(Request::from_parts(parts, Body::empty()))
                    .await))
            }
            None => None,
        }
    };
    let others = from.iter().filter(|(n, _)| *n != me).map(|(n, c)| {
        let (pq, headers) = (pq_of(c), &headers);
        async move {
            let r = cluster
                .forward_admin_named(n, Method::GET, &pq, headers, Bytes::new())
                .await;
            (n.clone(), r)
        }
    });
    let (local, remote) = tokio::join!(local, futures_util::future::join_all(others));
    let mut answers: Vec<(String, Result<Response, Unreachable>)> = Vec::new();
    if let Some(l) = local {
        answers.push((me.clone(), l));
    }
    answers.extend(remote);
    let mut pages: Vec<NodePage> = Vec::new();
    let mut unavailable = Vec::new();
    let (mut found, mut not_found) = (false, None);
    for (name, r) in read_all(answers).await {
        let start = from
            .iter()
            .find(|(n, _)| *n == name)
            .and_then(|(_, c)| c.clone());
        let (status, bytes) = match r {
            Ok(answer) => answer,
            Err(e) if name == owner.name => return answer_of(&owner, Err(e)),
            Err(_) => {
                unavailable.push(name.clone());
                // Its place is kept: the next page asks it again.
                pages.push(NodePage::kept(name, start));
                continue;
            }
        };
        if status == StatusCode::NOT_FOUND {
            // The tenant is not there: nothing of it on that node.
            not_found = Some(bytes);
            pages.push(NodePage::kept(name, None).done());
            continue;
        }
        if status != StatusCode::OK {
            if name == owner.name || status == StatusCode::UNAUTHORIZED {
                return raw(status, bytes);
            }
            unavailable.push(name.clone());
            pages.push(NodePage::kept(name, start));
            continue;
        }
        found = true;
        let page: DlqPage = serde_json::from_slice(&bytes).unwrap_or_default();
        pages.push(NodePage {
            node: name,
            items: page.items,
            next: page.next,
            start,
        });
    }
    if let (false, Some(b), true) = (found, not_found, unavailable.is_empty()) {
        return raw(StatusCode::NOT_FOUND, b);
    }
    Json(merge_dlq_pages(&pages, unavailable, limit)).into_response()
}

/// Each node's cursor of a relay-wide DLQ page, from the `before` the caller sent back:
/// `None` from its newest row, `Some(c)` after row `c`; a node absent from a given cursor
/// is done. No cursor: every node from its newest. `None`: a cursor this Relay did not give.
fn dlq_cursors(cluster: &Cluster, before: Option<&str>) -> Option<Vec<(String, Option<String>)>> {
    let Some(c) = before else {
        return Some(
            cluster
                .members()
                .iter()
                .map(|m| (m.name.clone(), None))
                .collect(),
        );
    };
    let mut from = Vec::new();
    for part in c.split(',').filter(|p| !p.is_empty()) {
        let (node, cur) = part.split_once(':')?;
        if !cluster.members().iter().any(|m| m.name == node) {
            return None;
        }
        from.push((node.to_owned(), (!cur.is_empty()).then(|| cur.to_owned())));
    }
    Some(from)
}

/// The nodes' pages merged: newest first, at most `limit` rows, ids `<node>/<id>`, and the
/// cursor that goes on where each node's rows were left.
fn merge_dlq_pages(pages: &[NodePage], unavailable: Vec<String>, limit: usize) -> DlqPage {
    // Newest first across the nodes.
    let mut all: Vec<(usize, usize, u64)> = Vec::new();
    for (p, page) in pages.iter().enumerate() {
        for (i, it) in page.items.iter().enumerate() {
            all.push((p, i, it.at_ms));
        }
    }
    all.sort_by(|a, b| b.2.cmp(&a.2).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1)));
    all.truncate(limit);
    let mut taken = vec![0usize; pages.len()];
    let mut items = Vec::with_capacity(all.len());
    for (p, i, _) in &all {
        let NodePage {
            node, items: page, ..
        } = &pages[*p];
        let mut it = page[*i].clone();
        it.id = format!("{node}/{}", it.id);
        it.node = Some(node.clone());
        items.push(it);
        taken[*p] = taken[*p].max(i + 1);
    }
    let mut cursors = Vec::new();
    for (
        p,
        NodePage {
            node,
            items: page,
            next,
            start,
        },
    ) in pages.iter().enumerate()
    {
        let cur = if page.is_empty() {
            // Nothing read from it: done if it answered an empty page, else where it was.
            if unavailable.contains(node) {
                Some(start.clone().unwrap_or_default())
            } else {
                None
            }
        } else if taken[p] == page.len() {
            next.clone()
        } else if taken[p] == 0 {
            Some(start.clone().unwrap_or_default())
        } else {
            Some(page[taken[p] - 1].id.clone())
        };
        if let Some(c) = cur {
            cursors.push(format!("{node}:{c}"));
        }
    }
    DlqPage {
        items,
        next: (!cursors.is_empty()).then(|| cursors.join(",")),
        unavailable,
    }
}

/// One node's page of a relay-wide DLQ listing.
struct NodePage {
    node: String,
    items: Vec<DlqItem>,
    /// Its own cursor after the page (`None`: no more rows).
    next: Option<String>,
    /// Where the page began (`None`: at its newest row).
    start: Option<String>,
}

impl NodePage {
    /// No rows read from `node` this time: the next page asks it from `start` again.
    fn kept(node: String, start: Option<String>) -> NodePage {
        NodePage {
            node,
            items: Vec::new(),
            next: start.clone(),
            start,
        }
    }

    fn done(self) -> NodePage {
        NodePage {
            next: None,
            start: None,
            ..self
        }
    }
}

/// `POST /v1/dlq/replay` with ids of a relay-wide page (`<node>/<id>`): each node revives
/// its own; `revived` summed. An id without a node is this node's.
async fn replay_by_ids(api: &Api, req: Request, next: Next, body: ReplayRequest) -> Response {
    let cluster = &api.cluster;
    let me = cluster.me().unwrap_or_default().to_owned();
    let mut groups: std::collections::BTreeMap<String, Vec<String>> = Default::default();
    for id in &body.ids {
        let (node, id) = id.split_once('/').unwrap_or((me.as_str(), id));
        if !cluster.members().iter().any(|m| m.name == node) {
            return error(
                StatusCode::BAD_REQUEST,
                ErrorCode::BadRequest,
                format!("no node {node:?} in the Relay"),
            );
        }
        groups.entry(node.to_owned()).or_default().push(id.into());
    }
    let body_for = |ids: &Vec<String>| {
        let b = ReplayRequest {
            ids: ids.clone(),
            ..body.clone()
        };
        Bytes::from(serde_json::to_vec(&b).unwrap_or_default())
    };
    let (mut parts, _) = req.into_parts();
    parts.headers.remove("content-length");
    let headers = parts.headers.clone();
    let mine = groups.get(&me).map(&body_for);
    let local = async {
        match mine {
            Some(b) => Some(next.run(Request::from_parts(parts, Body::from(b))).await),
            None => None,
        }
    };
    let others = groups.iter().filter(|(n, _)| **n != me).map(|(n, ids)| {
        let (b, headers) = (body_for(ids), &headers);
        async move {
            let r = cluster
                .forward_admin_named(n, Method::POST, "/v1/dlq/replay", headers, b)
                .await;
            (n.clone(), r)
        }
    });
    let (local, remote) = tokio::join!(local, futures_util::future::join_all(others));
    let mut out = Revived::default();
    let mut unavailable = Vec::new();
    let mut answers: Vec<(String, Result<Response, Unreachable>)> = Vec::new();
    if let Some(l) = local {
        answers.push((me, Ok(l)));
    }
    answers.extend(remote);
    for (name, r) in read_all(answers).await {
        let Ok((status, bytes)) = r else {
            unavailable.push(name);
            continue;
        };
        if status != StatusCode::OK {
            // The caller's own error (a bad id, a bad token) is every node's.
            return raw(status, bytes);
        }
        out.merge(&serde_json::from_slice(&bytes).unwrap_or_default());
    }
    out.set_unavailable(unavailable);
    Json(out).into_response()
}

/// `GET /v1/hooks/{id}` relay-wide: the node reached looks first; if its log does not have
/// the hook (another node took it, or its tenant moved), every other node is asked at once
/// and the first that has it answers. None has it: 404; none has it but some did not
/// answer: 503 naming them.
async fn hook_anywhere(api: &Api, req: Request, next: Next) -> Response {
    let headers: HeaderMap = req.headers().clone();
    let pq = req
        .uri()
        .path_and_query()
        .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
    let local = next.run(req).await;
    if local.status() != StatusCode::NOT_FOUND {
        return local;
    }
    let mut silent = Vec::new();
    for (name, r) in get_from_others(api, &pq, &headers).await {
        match r {
            Ok(r) if r.status() == StatusCode::NOT_FOUND => {}
            Ok(r) => return r,
            Err(e) => silent.push(format!("{name} ({})", e.reason)),
        }
    }
    if silent.is_empty() {
        return local;
    }
    let r = error(
        StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::OwnerUnavailable,
        format!(
            "no node that answered has this hook, and these did not answer: {}",
            silent.join(", ")
        ),
    );
    with_retry_after(r, 5)
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
        .clamp(1, api.config.load().admin.max_page);
    // A listing by prefix is in id order, paged by id.
    let query = req.uri().query().unwrap_or("");
    let listing = query_param(query, "prefix").is_some() || query_param(query, "after").is_some();
    let me = cluster.me().unwrap_or_default().to_owned();
    let (local, remote) = tokio::join!(next.run(req), get_from_others(api, &pq, &headers));
    let mut answers = vec![(me, Ok(local))];
    answers.extend(remote);
    let mut merged = TenantsTop::default();
    let (mut nodes, mut unavailable) = (Vec::new(), Vec::new());
    for (name, r) in read_all(answers).await {
        let Ok((status, body)) = r else {
            unavailable.push(name);
            continue;
        };
        if status != StatusCode::OK {
            // The caller's own error (a bad token, a bad parameter) is every node's.
            return raw(status, body);
        }
        let Ok(answer) = serde_json::from_slice::<TenantsTop>(&body) else {
            unavailable.push(name);
            continue;
        };
        nodes.push(NodeTenants {
            node: name,
            total: Some(answer.total),
            owned: answer.owned,
        });
        merged.merge(&answer);
    }
    let mut out = merged.ranked(top, !listing);
    out.next = (listing && out.tenants.len() >= top)
        .then(|| out.tenants.last().map(|t| t.tenant.clone()))
        .flatten();
    out.nodes = Some(nodes);
    out.set_unavailable(unavailable);
    Json(out).into_response()
}
