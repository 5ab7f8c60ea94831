//! The admin API of a Relay of several nodes answers relay-wide from any of them.
//!
//! - A call that names a tenant goes to the tenant's owner, with the caller's own token:
//!   `GET /v1/tenants/{t}`, `GET /v1/dlq?tenant=t`, `DELETE /v1/tenants/{t}/queue`,
//!   `POST /v1/tenants/{t}/retry` and `POST /v1/dlq/replay` with `"tenant"` go to every
//!   node at once (a former owner still
//!   draining the tenant's rows answers too) and their answers are added up (a DLQ page
//!   merged newest first, ids `<node>/<id>`, which a replay by ids routes back). Owner
//!   unreachable: 503 `owner_unavailable`.
//! - `GET /v1/tenants` asks every node and merges: a tenant's counters summed over the nodes
//!   that hold rows of it, `total` the sum of the nodes' registered tenants, and each node's
//!   answer in `nodes` (`unavailable` names the nodes that gave none).
//! - `GET /v1/hooks/{id}`: the node reached looks in its hook log, then asks the others.
//! - `GET /v1/sources/{id}`: every node is asked, the source's backlogs added up.
//! - `GET /v1/archive?tenant=t`, `GET /v1/hooks?tenant=t`,
//!   `GET /v1/tenants/{t}/deliveries/{id}` and `POST /v1/archive/replay` go to the tenant's
//!   owner.
//! - A call carrying `ankusa-cluster-local: 1` is answered by the node it reaches (what a
//!   node sends another, and what `ankusa-relay admin` sends when it merges nodes itself).
//!   Calls that name no tenant (the DLQ of every tenant, replay by ids, quarantine, audit,
//!   backups, node status) answer for the node they reach.
//!
//! `POST /cluster/v1/slots/lend`, `GET /cluster/v1/slots` and `GET /cluster/v1/stored`
//! (cluster token) are the tenant registry's doors between nodes (`crate::cluster`).

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use bytes::Bytes;
use http_body_util::BodyExt;

use super::api::Api;
use ankusa_api_macros::answers;

use crate::cluster::{Member, Unreachable, LOCAL_HEADER};
use crate::http::{error, percent_decode as decode, percent_encode as encode, with_retry_after};
use ankusa_api::admin::{ArchiveReplayRequest, ReplayRequest};
use ankusa_api::admin::{DlqItem, DlqPage, NodeTenants, Revived, TenantView, TenantsTop};
use ankusa_api::admin::{EraseState, LimitsView, PauseState, PurgeReport, Retried, SourceView};
use ankusa_api::error::ErrorCode;
use ankusa_api::merge::Merge;

/// The largest admin body read before it is routed (a replay's, to find its tenant).
const MAX_ROUTED_BODY: usize = 1 << 20;

/// An admin request's body, read whole before it is routed: at most [`MAX_ROUTED_BODY`]
/// (413 `body_too_large` past it), whatever the caller's scope.
async fn routed_body(body: Body) -> Result<bytes::Bytes, Response> {
    match http_body_util::Limited::new(body, MAX_ROUTED_BODY)
        .collect()
        .await
    {
        Ok(c) => Ok(c.to_bytes()),
        Err(e)
            if e.downcast_ref::<http_body_util::LengthLimitError>()
                .is_some() =>
        {
            Err(error(
                StatusCode::PAYLOAD_TOO_LARGE,
                ErrorCode::BodyTooLarge,
                "an admin request about a tenant carries at most 1 MiB",
            ))
        }
        Err(_) => Err(error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "the body could not be read",
        )),
    }
}

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
    if path.starts_with("/v1/hooks/") && req.method() == Method::GET {
        return hook_anywhere(&api, req, next).await;
    }
    let (req, tenant) = if let Some(rest) = path.strip_prefix("/v1/tenants/") {
        let t = rest.split('/').next().map(|t| decode(t, false));
        (req, t)
    } else if path == "/v1/dlq" && req.method() == Method::GET {
        if let Some(t) = query_param(&query, "tenant") {
            return merged_dlq(&api, req, next, &t, &query).await;
        }
        (req, None)
    } else if (path == "/v1/archive" || path == "/v1/hooks") && req.method() == Method::GET {
        // A tenant's archive is on its owner (what a former owner archived stays there:
        // ask it with `ankusa-cluster-local: 1`).
        let t = query_param(&query, "tenant");
        (req, t)
    } else if (path == "/v1/dlq/replay" || path == "/v1/archive/replay")
        && req.method() == Method::POST
    {
        let (parts, body) = req.into_parts();
        let bytes = match routed_body(body).await {
            Ok(b) => b,
            Err(refused) => return refused,
        };
        // A body that does not read as the call's is the handler's to refuse.
        let t = if path == "/v1/dlq/replay" {
            match serde_json::from_slice::<ReplayRequest>(&bytes) {
                Ok(r) if r.ids.iter().any(|i| i.contains('/')) => {
                    let req = Request::from_parts(parts, Body::empty());
                    return replay_by_ids(&api, req, next, r).await;
                }
                Ok(r) => r.tenant,
                Err(_) => None,
            }
        } else {
            serde_json::from_slice::<ArchiveReplayRequest>(&bytes)
                .ok()
                .map(|r| r.tenant)
        };
        (Request::from_parts(parts, Body::from(bytes)), t)
    } else if let Some(id) = path
        .strip_prefix("/v1/sources/")
        .filter(|_| req.method() == Method::GET)
    {
        // A source's rows live on the owners of its tenants: every node is asked and the
        // backlogs added up. The "owner" whose error wins is its fixed tenant's, or (a
        // shared source) the source id's.
        let id = decode(id, false);
        let key = super::sources::source_tenant(&api.config.load(), &id).unwrap_or(id);
        (req, Some(key))
    } else {
        (req, None)
    };
    let Some(tenant) = tenant else {
        return next.run(req).await;
    };
    // What a former owner still holds counts too: a tenant's view, purge and replay ask
    // every node and add their answers up.
    let merge = match (req.method().clone(), path.as_str()) {
        // A tenant's limits are the same on every node; its owner enforces them and
        // answers with its refusals.
        (Method::GET, p) if p.ends_with("/limits") => None,
        (Method::PUT | Method::DELETE, p) if p.ends_with("/limits") => {
            Some::<Merger>(merge_as::<LimitsView>)
        }
        // The dedupe entry of a delivery id is on the tenant's owner.
        (Method::GET, p) if p.contains("/deliveries/") => None,
        (Method::GET, p) if p.starts_with("/v1/tenants/") && !p.ends_with("/queue") => {
            Some::<Merger>(merge_as::<TenantView>)
        }
        // An erase runs on every node that holds the tenant's rows.
        (Method::DELETE, p)
            if p.strip_prefix("/v1/tenants/")
                .is_some_and(|t| !t.contains('/')) =>
        {
            Some::<Merger>(merge_as::<EraseState>)
        }
        (Method::DELETE, p) if p.ends_with("/queue") => Some::<Merger>(merge_as::<PurgeReport>),
        (Method::POST, "/v1/dlq/replay") => Some::<Merger>(merge_as::<Revived>),
        (Method::POST, p) if p.ends_with("/retry") => Some::<Merger>(merge_as::<Retried>),
        // Held on every node that holds the tenant's rows: its owner and former owners.
        (Method::POST, p) if p.ends_with("/pause") || p.ends_with("/resume") => {
            Some::<Merger>(merge_as::<PauseState>)
        }
        (Method::GET, p) if p.starts_with("/v1/sources/") => Some::<Merger>(merge_as::<SourceView>),
        _ => None,
    };
    let owner = cluster.owner_of(&tenant).clone();
    let (parts, body) = req.into_parts();
    // Read before the owner (or this node's handler) checks the token's scope: bounded,
    // as every admin body the handlers read is far below it.
    let body = match routed_body(body).await {
        Ok(b) => b,
        Err(refused) => return refused,
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

/// `GET /v1/dlq?tenant=t` relay-wide: every node's page of the tenant's dead rows (its
/// owner's and a former owner's), merged newest first. Ids are `<node>/<id>`; `next` holds
/// each node's own cursor (`<node>:<id>,…`; a node missing from it has no more rows).
async fn merged_dlq(api: &Api, req: Request, next: Next, tenant: &str, query: &str) -> Response {
    let cluster = &api.cluster;
    let limit = query_param(query, "limit")
        .and_then(|l| l.parse::<usize>().ok())
        .unwrap_or(100)
        .clamp(1, api.config.load().admin.max_page);
    // Each node's cursor: `None` from its newest row, `Some(c)` after row `c`; a node
    // absent from a given cursor is done.
    let mut from: Vec<(String, Option<String>)> = Vec::new();
    match query_param(query, "before") {
        None => from.extend(cluster.members().iter().map(|m| (m.name.clone(), None))),
        Some(c) => {
            for part in c.split(',').filter(|p| !p.is_empty()) {
                let Some((node, cur)) = part.split_once(':') else {
                    return error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, "bad cursor");
                };
                if !cluster.members().iter().any(|m| m.name == node) {
                    return error(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, "bad cursor");
                }
                from.push((node.to_owned(), (!cur.is_empty()).then(|| cur.to_owned())));
            }
        }
    }
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
    Json(DlqPage {
        items,
        next: (!cursors.is_empty()).then(|| cursors.join(",")),
        unavailable,
    })
    .into_response()
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

/// How the nodes' answers to one call about a tenant add up: read as the call's body
/// type and folded by its [`Merge`]; `None` when the first does not read as it.
type Merger = fn(&[Bytes], Vec<String>) -> Option<Response>;

/// [`Merger`] of the body type `T`: the first answer (the owner's) with every other
/// answer that reads as a `T` merged in.
fn merge_as<T: Merge + serde::Serialize + serde::de::DeserializeOwned>(
    found: &[Bytes],
    unavailable: Vec<String>,
) -> Option<Response> {
    let (first, rest) = found.split_first()?;
    let mut out: T = serde_json::from_slice(first).ok()?;
    for b in rest {
        if let Ok(v) = serde_json::from_slice::<T>(b) {
            out.merge(&v);
        }
    }
    if !unavailable.is_empty() {
        out.set_unavailable(unavailable);
    }
    Some(Json(out).into_response())
}

/// The owner's answer with every other node's 200 added in; the owner's own answer as it
/// is when it is an error other than 404, 503 `owner_unavailable` when it gave none.
async fn merged(
    owner: &Member,
    answers: Vec<(String, Result<Response, Unreachable>)>,
    merge: Merger,
) -> Response {
    let mut owner_answer = None;
    let mut found: Vec<Bytes> = Vec::new();
    let mut unavailable = Vec::new();
    // A call that starts work answers 202 (an erase): the merged answer keeps it.
    let mut success = StatusCode::OK;
    for (name, r) in read_all(answers).await {
        let is_owner = name == owner.name;
        let (status, bytes) = match r {
            Ok(answer) => answer,
            Err(e) if is_owner => return answer_of(owner, Err(e)),
            Err(_) => {
                unavailable.push(name);
                continue;
            }
        };
        if is_owner {
            if !status.is_success() && status != StatusCode::NOT_FOUND {
                return raw(status, bytes);
            }
            owner_answer = Some((status, bytes.clone()));
        }
        if status.is_success() {
            success = status;
            // The owner's answer first: its shape is the merged answer's.
            if is_owner {
                found.insert(0, bytes);
            } else {
                found.push(bytes);
            }
        } else if status != StatusCode::NOT_FOUND && !is_owner {
            unavailable.push(name);
        }
    }
    if found.is_empty() {
        return match owner_answer {
            Some((status, bytes)) => raw(status, bytes),
            None => error(StatusCode::NOT_FOUND, ErrorCode::NotFound, "no such tenant"),
        };
    }
    match merge(&found, unavailable) {
        Some(mut r) => {
            *r.status_mut() = success;
            r
        }
        // The owner's answer is not the call's body: as it came.
        None => raw(success, found.swap_remove(0)),
    }
}

/// Each node's answer read whole: its status and body (a body cut short is no answer).
async fn read_all(
    answers: Vec<(String, Result<Response, Unreachable>)>,
) -> Vec<(String, Result<(StatusCode, Bytes), Unreachable>)> {
    let mut out = Vec::with_capacity(answers.len());
    for (name, r) in answers {
        let read = match r {
            Ok(resp) => {
                let status = resp.status();
                match resp.into_body().collect().await {
                    Ok(c) => Ok((status, c.to_bytes())),
                    Err(e) => Err(Unreachable {
                        node: name.clone(),
                        reason: e.to_string(),
                    }),
                }
            }
            Err(e) => Err(e),
        };
        out.push((name, read));
    }
    out
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

fn answer_of(owner: &Member, r: Result<Response, Unreachable>) -> Response {
    r.unwrap_or_else(|e| {
        let r = error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::OwnerUnavailable,
            format!(
                "{} owns this tenant and did not answer: {}",
                owner.name, e.reason
            ),
        );
        with_retry_after(r, 5)
    })
}

/// `GET pq` sent to every other node of the Relay at once, with the caller's headers.
async fn get_from_others(
    api: &Api,
    pq: &str,
    headers: &HeaderMap,
) -> Vec<(String, Result<Response, Unreachable>)> {
    let cluster = &api.cluster;
    let me = cluster.me().unwrap_or_default();
    let asks = cluster
        .members()
        .iter()
        .filter(|m| m.name != me)
        .map(|m| async move {
            let r = cluster
                .forward_admin(m, Method::GET, pq, headers, Bytes::new())
                .await;
            (m.name.clone(), r)
        });
    futures_util::future::join_all(asks).await
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

/// A query parameter, decoded.
fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (decode(k, true) == name).then(|| decode(v, true))
    })
}

use ankusa_api::cluster::{HandoffAnswer, HandoffBatch, LendRequest, Lent, SlotLedger, Stored};

/// The refusal of a cluster call: a single node, 404; no cluster token, 401.
fn cluster_door(api: &Api, headers: &HeaderMap) -> Option<Response> {
    if !api.cluster.is_multi() {
        return Some(error(
            StatusCode::NOT_FOUND,
            ErrorCode::NotARelayNode,
            "this node is not part of a Relay of several nodes",
        ));
    }
    (!api.cluster.authentic(headers)).then(|| {
        error(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "the cluster token is required",
        )
    })
}

/// `POST /cluster/v1/slots/lend`: lends the asking node up to `want` tenant slots, at most
/// half of this node's free ones, recorded (synced) before the answer.
#[answers]
#[utoipa::path(
    post,
    path = "/cluster/v1/slots/lend",
    tag = "cluster",
    request_body = LendRequest,
    responses(
        (status = 200, description = "The slots lent (maybe none) and the running total"),
        (status = 401, description = "No valid cluster token", body = ankusa_api::error::ErrorBody),
        (status = 404, description = "Not a Relay of several nodes (not_a_relay_node)", body = ankusa_api::error::ErrorBody),
        (status = 503, description = "The loan could not be recorded", body = ankusa_api::error::ErrorBody),
        crate::http::JsonBodyErrors,
    ),
    security(("cluster" = []))
)]
pub async fn lend(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Json(req): Json<LendRequest>,
) -> Result<Json<Lent>, Response> {
    if let Some(r) = cluster_door(&api, &headers) {
        return Err(r);
    }
    let cluster = api.cluster.clone();
    match tokio::task::spawn_blocking(move || cluster.lend(&req.to, req.want)).await {
        Ok(Ok((given, lent_total))) => Ok(Json(Lent { given, lent_total })),
        _ => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            "the loan could not be recorded",
        )),
    }
}

/// `GET /cluster/v1/stored?tenant=t`: whether this node's store holds the tenant (asked by
/// its owner, out of slots, before it refuses a tenant that may have moved to it).
#[answers]
#[utoipa::path(
    get,
    path = "/cluster/v1/stored",
    tag = "cluster",
    params(("tenant" = String, Query, description = "The tenant id")),
    responses(
        (status = 200, description = "Whether this node stores the tenant"),
        (status = 400, description = "No tenant given (bad_request)", body = ankusa_api::error::ErrorBody),
        (status = 401, description = "No valid cluster token", body = ankusa_api::error::ErrorBody),
        (status = 404, description = "Not a Relay of several nodes (not_a_relay_node)", body = ankusa_api::error::ErrorBody),
        (status = 503, description = "The store could not be read", body = ankusa_api::error::ErrorBody),
    ),
    security(("cluster" = []))
)]
pub async fn stored(State(api): State<Arc<Api>>, req: Request) -> Result<Json<Stored>, Response> {
    if let Some(r) = cluster_door(&api, req.headers()) {
        return Err(r);
    }
    let Some(tenant) = query_param(req.uri().query().unwrap_or(""), "tenant") else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            "tenant is required",
        ));
    };
    let store = api.store.clone();
    match tokio::task::spawn_blocking(move || ankusa_queue::tenants::ord(&store, &tenant)).await {
        Ok(Ok(ord)) => Ok(Json(Stored {
            stored: ord.is_some(),
        })),
        _ => Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            "the store could not be read",
        )),
    }
}

/// `POST /cluster/v1/handoff`: a batch of stored rows whose tenants this node owns, from
/// the node that stored them (docs/architecture.md, handoff). Imported once, in one synced
/// write that records the batch's number; a batch sent again is answered `already`.
#[answers]
#[utoipa::path(
    post,
    path = "/cluster/v1/handoff",
    tag = "cluster",
    request_body = HandoffBatch,
    responses(
        (status = 200, description = "Imported now, or before (`already`): the sender may forget the batch"),
        (status = 400, description = "An unknown sender, too many items, an item that does not decode (bad_request)", body = ankusa_api::error::ErrorBody),
        (status = 401, description = "No valid cluster token", body = ankusa_api::error::ErrorBody),
        (status = 404, description = "Not a Relay of several nodes (not_a_relay_node)", body = ankusa_api::error::ErrorBody),
        (status = 409, description = "A tenant of the batch is not this node's (not_owner): the node lists disagree", body = ankusa_api::error::ErrorBody),
        (status = 503, description = "Not imported now (tenant_limit, unavailable): nothing written", body = ankusa_api::error::ErrorBody),
        crate::http::JsonBodyErrors,
    ),
    security(("cluster" = []))
)]
pub async fn handoff(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Json(batch): Json<HandoffBatch>,
) -> Result<Json<HandoffAnswer>, Response> {
    use crate::cluster::handoff::Refusal;
    if let Some(r) = cluster_door(&api, &headers) {
        return Err(r);
    }
    let Some(writer) = api.writer.get() else {
        return Err(error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            "the node is starting",
        ));
    };
    let refused = match crate::cluster::handoff::receive(&api.cluster, writer, batch).await {
        Ok(answer) => return Ok(Json(answer)),
        Err(e @ Refusal::Bad(_)) => error(
            StatusCode::BAD_REQUEST,
            ErrorCode::BadRequest,
            e.to_string(),
        ),
        Err(e @ Refusal::NotOwner(_)) => {
            error(StatusCode::CONFLICT, ErrorCode::NotOwner, e.to_string())
        }
        Err(e @ Refusal::TenantLimit) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::TenantLimit,
            e.to_string(),
        ),
        Err(e @ Refusal::Unavailable) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            e.to_string(),
        ),
    };
    Err(refused)
}

/// `GET /cluster/v1/slots`: this node's tenants, slots and loans, for the other nodes.
#[answers]
#[utoipa::path(
    get,
    path = "/cluster/v1/slots",
    tag = "cluster",
    responses(
        (status = 200, description = "This node's part of the tenant registry"),
        (status = 401, description = "No valid cluster token", body = ankusa_api::error::ErrorBody),
        (status = 404, description = "Not a Relay of several nodes (not_a_relay_node)", body = ankusa_api::error::ErrorBody),
    ),
    security(("cluster" = []))
)]
pub async fn slots(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
) -> Result<Json<SlotLedger>, Response> {
    if let Some(r) = cluster_door(&api, &headers) {
        return Err(r);
    }
    match api.cluster.ledger() {
        Some((l, slots)) => Ok(Json(SlotLedger {
            registered: l.registered,
            slots,
            lent: l.lent,
            heard: l.heard,
        })),
        None => Err(error(
            StatusCode::NOT_FOUND,
            ErrorCode::NotARelayNode,
            "no registry",
        )),
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
        assert_eq!(crate::http::percent_decode("a%20b%zz%4", false), "a b%zz%4");
    }
}
