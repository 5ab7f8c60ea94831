//! Where each admin call is answered in a Relay of several nodes, declared with its route.
//!
//! Every `/v1` route is added through [`V1::at`], which takes an [`Answered`] beside the
//! handler: the routing layer that wraps the handler reads it, not the path. A route cannot
//! be added without saying where it is answered.
//!
//! - [`Answered::Here`]: the node the call reaches (its own state: node, config, audit,
//!   quarantine, backups, portal links, the calls between nodes).
//! - [`Answered::Owner`]: the owner of the tenant the call names ([`TenantIn`]: the
//!   path's `{t}`, the query's `tenant`, the body's `tenant`), with the caller's own token;
//!   by the node it reaches when it names none. Owner unreachable: 503 `owner_unavailable`.
//! - [`Answered::Everywhere`]: every node at once (a former owner still draining the
//!   tenant's rows answers too), the owner's answer first, the others' merged into it by
//!   the body's `ankusa_api::merge::Merge`.
//! - [`Answered::FanOut`]: a fan-out of its own (`relay_wide`: the tenants list, a tenant's
//!   DLQ page, a replay by ids, a hook looked up anywhere).
//!
//! A call carrying `ankusa-cluster-local: 1` is answered by the node it reaches (what a node
//! sends another, and what `ankusa-relay admin` sends when it merges nodes itself); a node
//! that runs alone answers everything itself.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::handler::Handler;
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{on, MethodFilter};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::BodyExt;

use super::api::Api;
use crate::cluster::{Member, Unreachable, LOCAL_HEADER};
use crate::http::{error, percent_decode as decode, with_retry_after};
use ankusa_api::error::ErrorCode;
use ankusa_api::merge::Merge;

/// A fan-out of its own: the call, the handler behind it, its answer.
pub type FanOut = fn(Arc<Api>, Request, Next) -> Pin<Box<dyn Future<Output = Response> + Send>>;

/// Where a call is answered in a Relay of several nodes.
#[derive(Clone, Copy)]
pub enum Answered {
    Here,
    Owner(TenantIn),
    Everywhere(TenantIn, Merger),
    FanOut(FanOut),
}

impl Answered {
    /// Every node, merged as the body `T` merges.
    pub fn everywhere<T: Merge + serde::Serialize + serde::de::DeserializeOwned>(
        t: TenantIn,
    ) -> Answered {
        Answered::Everywhere(t, merge_as::<T>)
    }
}

/// Where a call names its tenant.
#[derive(Clone, Copy)]
pub enum TenantIn {
    /// `/v1/tenants/{t}/…`.
    Path,
    /// `?tenant=t`.
    Query,
    /// The JSON body's `tenant`, as this function reads it (`None`: the body names none, or
    /// is not the call's: its handler refuses it).
    Body(fn(&[u8]) -> Option<String>),
    /// `/v1/sources/{id}`: the source's fixed tenant, or (a shared source) the source id,
    /// whose "owner" answers first.
    Source,
}

/// The `/v1` routes, each added with where it is answered.
pub struct V1 {
    api: Arc<Api>,
    router: Router<Arc<Api>>,
}

impl V1 {
    pub fn new(api: Arc<Api>) -> V1 {
        V1 {
            api,
            router: Router::new(),
        }
    }

    /// `method path` served by `handler`, answered as `answered` says.
    pub fn at<H, T>(
        mut self,
        method: MethodFilter,
        path: &str,
        answered: Answered,
        handler: H,
    ) -> V1
    where
        H: Handler<T, Arc<Api>>,
        T: 'static,
    {
        let layer = axum::middleware::from_fn_with_state((self.api.clone(), answered), route);
        self.router = self.router.route(path, on(method, handler.layer(layer)));
        self
    }

    /// The routes, for the admin router (which adds the readiness gate around them).
    pub fn router(self) -> Router<Arc<Api>> {
        self.router
    }
}

/// The largest admin body read before it is routed (a replay's, to find its tenant).
const MAX_ROUTED_BODY: usize = 1 << 20;

/// An admin request's body, read whole before it is routed: at most [`MAX_ROUTED_BODY`]
/// (413 `body_too_large` past it), whatever the caller's scope.
pub(super) async fn routed_body(body: Body) -> Result<bytes::Bytes, Response> {
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
/// The routing layer of one route: the call answered where its [`Answered`] says.
async fn route(
    State((api, answered)): State<(Arc<Api>, Answered)>,
    req: Request,
    next: Next,
) -> Response {
    // The call's `admin` span names the tenant it concerns (one the body names is known
    // only once the body is read, in a Relay of several nodes).
    let named = match answered {
        Answered::Owner(t) | Answered::Everywhere(t, _) => tenant_named(&api, t, req.uri()),
        Answered::FanOut(_) => tenant_named(&api, TenantIn::Query, req.uri()),
        Answered::Here => None,
    };
    if let Some(tenant) = &named {
        tracing::Span::current().record("tenant", tenant.as_str());
    }
    if !api.cluster.is_multi() || req.headers().contains_key(LOCAL_HEADER) {
        return next.run(req).await;
    }
    let (tenant_in, merge) = match answered {
        Answered::Here => return next.run(req).await,
        Answered::FanOut(f) => return f(api, req, next).await,
        Answered::Owner(t) => (t, None),
        Answered::Everywhere(t, m) => (t, Some(m)),
    };
    let (parts, body) = req.into_parts();
    // Read before the owner (or this node's handler) checks the token's scope: bounded,
    // as every admin body the handlers read is far below it.
    let body = match routed_body(body).await {
        Ok(b) => b,
        Err(refused) => return refused,
    };
    let tenant = match tenant_in {
        TenantIn::Body(read) => {
            let t = read(&body);
            if let Some(t) = &t {
                tracing::Span::current().record("tenant", t.as_str());
            }
            t
        }
        // Named in the path or the query: read above.
        _ => named,
    };
    let Some(tenant) = tenant else {
        return next.run(Request::from_parts(parts, Body::from(body))).await;
    };
    answered_by(&api, &tenant, parts, body, next, merge).await
}

/// The tenant a call names in its path or query (`None` for one its body names).
fn tenant_named(api: &Api, t: TenantIn, uri: &axum::http::Uri) -> Option<String> {
    let path = uri.path();
    match t {
        TenantIn::Path => path
            .strip_prefix("/v1/tenants/")
            .and_then(|rest| rest.split('/').next())
            .map(|t| decode(t, false)),
        TenantIn::Query => query_param(uri.query().unwrap_or(""), "tenant"),
        TenantIn::Body(_) => None,
        TenantIn::Source => path.strip_prefix("/v1/sources/").map(|id| {
            let id = decode(id, false);
            crate::ingest::source_tenant(&api.config.load(), &id).unwrap_or(id)
        }),
    }
}

/// A call about `tenant` answered by its owner (`merge: None`), or by every node and merged.
/// `body` is the call's, read whole already ([`routed_body`]).
pub(super) async fn answered_by(
    api: &Api,
    tenant: &str,
    parts: axum::http::request::Parts,
    body: Bytes,
    next: Next,
    merge: Option<Merger>,
) -> Response {
    let cluster = &api.cluster;
    let owner = cluster.owner_of(tenant).clone();
    let pq = parts
        .uri
        .path_and_query()
        .map_or_else(|| parts.uri.path().to_owned(), |p| p.as_str().to_owned());
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

/// How the nodes' answers to one call about a tenant add up: read as the call's body
/// type and folded by its [`Merge`]; `None` when the first does not read as it.
pub type Merger = fn(&[Bytes], Vec<String>) -> Option<Response>;

/// [`Merger`] of the body type `T`: the first answer (the owner's) with every other
/// answer that reads as a `T` merged in.
pub(super) fn merge_as<T: Merge + serde::Serialize + serde::de::DeserializeOwned>(
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
pub(super) async fn merged(
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
pub(super) async fn read_all(
    answers: Vec<(String, Result<Response, Unreachable>)>,
) -> Vec<(String, Result<(StatusCode, Bytes), Unreachable>)> {
    let mut out = Vec::with_capacity(answers.len());
    for (name, r) in answers {
        let read = match r {
            Ok(resp) => {
                let status = resp.status();
                match resp.into_body().collect().await {
                    Ok(c) => Ok((status, c.to_bytes())),
                    Err(e) => Err(Unreachable::new(name.clone(), e.to_string())),
                }
            }
            Err(e) => Err(e),
        };
        out.push((name, read));
    }
    out
}

/// An answer as it came.
pub(super) fn raw(status: StatusCode, body: Bytes) -> Response {
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(
        "content-type",
        axum::http::HeaderValue::from_static("application/json"),
    );
    r
}

pub(super) fn answer_of(owner: &Member, r: Result<Response, Unreachable>) -> Response {
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
pub(super) async fn get_from_others(
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

/// A query parameter, decoded.
pub(super) fn query_param(query: &str, name: &str) -> Option<String> {
    query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
        (decode(k, true) == name).then(|| decode(v, true))
    })
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
