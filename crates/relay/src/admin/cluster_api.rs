//! The calls between the nodes of a Relay on the admin listener (`/cluster/v1/…`, signed
//! as a node's): the tenant registry's doors (`crate::cluster`) and the handoff's receiver.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;
use axum::Json;

use super::api::Api;
use super::routing::query_param;
use crate::http::error;
use ankusa_api::error::ErrorCode;
use ankusa_api_macros::answers;

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
    let refused =
        match crate::cluster::handoff::receive(&api.cluster, &api.store, writer, batch).await {
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
