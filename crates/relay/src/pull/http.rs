//! The claim gateway's calls, on the ingest listener (`/pull/{sink}/…`): consumers reach
//! out to the node as providers do, through the listener that already faces them; the
//! admin listener stays the operators'. Each call takes a consumer's token
//! (`Authorization: Bearer …`, `pull.consumers`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use base64::Engine;

use super::{Ask, Claimed, Conflict, Consumer, Gateway, Settle};
use crate::http::error;
use ankusa_api::cluster::{PullReady, PullWait};
use ankusa_api::error::ErrorCode;
use ankusa_api::pull::ConflictReason;
use ankusa_api::pull::{
    AckRequest, ClaimAnswer, ClaimRequest, ClaimedHook, ConflictBody, ExtendRequest,
    ForwardedHeader, LeaseConflict, NackRequest, SettleAnswer,
};
use ankusa_api_macros::answers;

/// The error answers every pull call shares, for the OpenAPI document (the handlers
/// answer through [`Refused`] and `internal`, whose body is `ErrorBody`).
#[derive(utoipa::IntoResponses)]
#[allow(dead_code)]
pub enum PullErrors {
    #[response(
        status = 400,
        description = "A bound out of range (its message names the key), or no leases or too many"
    )]
    BadRequest(ankusa_api::error::ErrorBody),
    #[response(status = 401, description = "No consumer token")]
    Unauthorized(ankusa_api::error::ErrorBody),
    #[response(
        status = 404,
        description = "No pull sink of that id for this consumer"
    )]
    UnknownSink(ankusa_api::error::ErrorBody),
    #[response(
        status = 503,
        description = "The store did not answer (Retry-After: 1)"
    )]
    Unavailable(ankusa_api::error::ErrorBody),
}

/// The calls, for the ingest listener's router.
pub fn router(gateway: Arc<Gateway>) -> Router {
    Router::new()
        .route("/pull/{sink}/claim", post(claim))
        .route("/pull/{sink}/ack", post(ack))
        .route("/pull/{sink}/nack", post(nack))
        .route("/pull/{sink}/extend", post(extend))
        .route("/pull/{sink}/wait", post(wait))
        .with_state(gateway)
        .layer(axum::middleware::map_response(crate::http::json_errors))
}

/// A call refused before it reached the store: its status, code and message.
struct Refused(StatusCode, ErrorCode, String);

impl IntoResponse for Refused {
    fn into_response(self) -> Response {
        error(self.0, self.1, self.2)
    }
}

impl From<Refused> for Response {
    fn from(r: Refused) -> Response {
        r.into_response()
    }
}

/// The consumer a request's token names, allowed on `sink`: 401 without one, 404 for a
/// sink it may not claim from (or that is no pull sink), so a token learns nothing of
/// the sinks it does not hold.
fn consumer(g: &Gateway, headers: &HeaderMap, sink: &str) -> Result<Arc<Consumer>, Refused> {
    let token = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(crate::http::bearer);
    let Some(c) = token.and_then(|t| g.consumer(t.as_bytes())) else {
        return Err(Refused(
            StatusCode::UNAUTHORIZED,
            ErrorCode::Unauthorized,
            "a consumer token is required (Authorization: Bearer …, pull.consumers)".into(),
        ));
    };
    if !c.may_claim_from(sink) || !g.settings().sinks.contains_key(sink) {
        return Err(Refused(
            StatusCode::NOT_FOUND,
            ErrorCode::UnknownSink,
            format!("no pull sink {sink:?} for this consumer"),
        ));
    }
    Ok(c)
}

fn bad_request(message: String) -> Refused {
    Refused(StatusCode::BAD_REQUEST, ErrorCode::BadRequest, message)
}

fn in_range(key: &str, v: u64, lo: u64, hi: u64) -> Result<u64, Refused> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(bad_request(format!("{key}: {v} is outside {lo}..={hi}")))
    }
}

fn internal(e: impl std::fmt::Display) -> Response {
    tracing::error!(error = %e, "pull: a store operation failed");
    crate::http::with_retry_after(
        error(
            StatusCode::SERVICE_UNAVAILABLE,
            ErrorCode::Unavailable,
            format!("the store did not answer: {e}"),
        ),
        1,
    )
}

/// `POST /pull/{sink}/claim`: lease up to `max` waiting hooks; long-polls up to `wait_ms`
/// when none is waiting, woken when the dispatch tick parks hooks for the sink.
#[answers]
#[utoipa::path(
    post,
    path = "/pull/{sink}/claim",
    tag = "pull",
    params(("sink" = String, Path, description = "A pull sink's id")),
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "The hooks leased (none when nothing came within wait_ms)"),
        (status = 429, description = "The consumer has pull.max_waiting_claims claims waiting on this node (Retry-After: 1)", body = ankusa_api::error::ErrorBody),
        PullErrors,
        crate::http::JsonBodyErrors,
    ),
    security(("bearer" = []))
)]
pub async fn claim(
    State(g): State<Arc<Gateway>>,
    Path(sink): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ClaimRequest>,
) -> Result<Json<ClaimAnswer>, Response> {
    let c = consumer(&g, &headers, &sink)?;
    let s = g.settings();
    let (ask, wait) = ask_of(&req, &s, &sink)?;
    let until = Instant::now() + wait;
    // A waiting claim holds one of its consumer's `pull.max_waiting_claims`.
    let _waiting = if wait.is_zero() {
        None
    } else {
        match g.begin_wait(&c) {
            Some(w) => Some(w),
            None => {
                g.metrics.pull.refused(&sink, "waiting_claims");
                let r = error(
                    StatusCode::TOO_MANY_REQUESTS,
                    ErrorCode::TooManyWaitingClaims,
                    format!(
                        "this consumer has {} claims waiting on this node (pull.max_waiting_claims)",
                        s.max_waiting_claims
                    ),
                );
                return Err(crate::http::with_retry_after(r, 1));
            }
        }
    };
    let wake = g.deliverer.pull_wake.of(&sink);
    let (others, mine) = peers(&g, &headers, &c);
    // The other nodes' waits: each a long call that answers when that node has hooks for
    // this consumer (or its own wait ran out), re-armed when it ends — no polling.
    let mut remote: tokio::task::JoinSet<(usize, Option<bool>)> = tokio::task::JoinSet::new();
    let mut rearm_at: Vec<Instant> = vec![Instant::now(); others.len()];
    let mut armed = vec![false; others.len()];
    let mut c = c;
    // Whether something may have hooks for it: at first, and after a wake-up that says so
    // (a park here, another node's "ready", a reload); not after another node's wait ran
    // out, which is only re-armed.
    let mut round = true;
    loop {
        // Registered before the read: a park between the read and the wait still wakes it.
        let parked = wake.notified();
        tokio::pin!(parked);
        parked.as_mut().enable();
        let reloaded = g.reloaded.notified();
        tokio::pin!(reloaded);
        reloaded.as_mut().enable();
        let hooks = if round {
            gather(&g, &sink, &c, ask, &headers, mine, &others).await?
        } else {
            Vec::new()
        };
        let now = Instant::now();
        if !hooks.is_empty() || now >= until {
            return Ok(Json(ClaimAnswer { hooks }));
        }
        for (i, m) in others.iter().enumerate() {
            if !armed[i] && now >= rearm_at[i] {
                armed[i] = true;
                // Within the call's own timeout, so an answer comes before it.
                let cap = g
                    .cluster
                    .call_timeout()
                    .saturating_sub(Duration::from_secs(1));
                let ms = (until - now).min(cap).as_millis() as u64;
                let (g2, m2, h2, sink2) = (g.clone(), m.clone(), headers.clone(), sink.clone());
                remote.spawn(async move {
                    let asked = Instant::now();
                    let body = PullWait { wait_ms: ms };
                    let path = format!("/pull/{sink2}/wait");
                    let ready = forward_json::<_, PullReady>(&g2, &m2, &path, &h2, &body)
                        .await
                        .and_then(|(s, r)| r.filter(|_| s == 200))
                        .map(|r| r.ready)
                        // "Nothing" long before the wait asked for (a node whose own
                        // `max_wait_ms` is shorter) counts as no answer: no asking at once.
                        .filter(|ready| *ready || asked.elapsed().as_millis() as u64 >= ms / 2);
                    (i, ready)
                });
            }
        }
        // A node that gave no answer is asked again in a second, not at once; one whose wait
        // ran out, or that has hooks (claimed above), at once.
        let next_rearm = (0..others.len())
            .filter(|i| !armed[*i])
            .map(|i| rearm_at[i])
            .min()
            .unwrap_or(until)
            .min(until);
        round = tokio::select! {
            _ = parked => true,
            Some(done) = remote.join_next(), if !remote.is_empty() => match done {
                Ok((i, answer)) => {
                    armed[i] = false;
                    if answer.is_none() {
                        rearm_at[i] = Instant::now() + Duration::from_secs(1);
                    }
                    answer == Some(true)
                }
                Err(_) => false,
            },
            _ = tokio::time::sleep_until(next_rearm.into()) => false,
            _ = reloaded => true,
        };
        // A reload may have revoked the consumer, or taken the sink from it.
        c = consumer(&g, &headers, &sink)?;
    }
}

/// What a claim asks for, each value within the gateway's bounds, and how long it waits.
fn ask_of(req: &ClaimRequest, s: &super::Settings, sink: &str) -> Result<(Ask, Duration), Refused> {
    let sink_lease = s.sinks.get(sink).map_or(s.lease_ms, |k| k.lease_ms);
    let ask = Ask {
        max: in_range(
            "max",
            req.max.unwrap_or(s.max_claim) as u64,
            1,
            s.max_claim as u64,
        )? as usize,
        max_bytes: in_range(
            "max_bytes",
            req.max_bytes.unwrap_or(s.max_claim_bytes),
            1,
            s.max_claim_bytes,
        )?,
        lease_ms: in_range(
            "lease_ms",
            req.lease_ms.unwrap_or(sink_lease),
            1_000,
            s.max_lease_lifetime_ms,
        )?,
    };
    let wait = Duration::from_millis(in_range(
        "wait_ms",
        req.wait_ms.unwrap_or(0),
        0,
        s.max_wait_ms,
    )?);
    Ok((ask, wait))
}

/// The other nodes a claim gathers from, and whether this one holds tenants the consumer
/// sees. In a Relay of several nodes a claim gathers from every node holding tenants the
/// consumer sees (its own first); a node asked by another answers for itself.
fn peers(g: &Gateway, headers: &HeaderMap, c: &Consumer) -> (Vec<crate::cluster::Member>, bool) {
    let others = if g.cluster.is_multi() && !g.cluster.is_local_call(headers) {
        let me = g.cluster.me().unwrap_or_default();
        g.cluster
            .members()
            .iter()
            .filter(|m| m.name != me)
            .filter(|m| match c.tenants() {
                None => true,
                Some(ts) => ts.iter().any(|t| g.cluster.owner_of(t).name == m.name),
            })
            .cloned()
            .collect()
    } else {
        Vec::new()
    };
    let mine = !g.cluster.is_multi()
        || g.cluster.is_local_call(headers)
        || c.tenants()
            .is_none_or(|ts| ts.iter().any(|t| g.cluster.other_owner(t).is_none()));
    (others, mine)
}

/// One round of a claim: this node's hooks (when it holds the consumer's tenants), then
/// each other node's, without waiting, until `ask` is filled.
async fn gather(
    g: &Arc<Gateway>,
    sink: &str,
    c: &Arc<Consumer>,
    ask: Ask,
    headers: &HeaderMap,
    mine: bool,
    others: &[crate::cluster::Member],
) -> Result<Vec<ClaimedHook>, Response> {
    let mut hooks: Vec<ClaimedHook> = Vec::new();
    let mut bytes = 0u64;
    if mine {
        let (g2, sink2, c2) = (g.clone(), sink.to_owned(), c.clone());
        let claimed = tokio::task::spawn_blocking(move || g2.claim(&sink2, &c2, ask)).await;
        let claimed = match claimed {
            Ok(Ok(h)) => h,
            Ok(Err(e)) => return Err(internal(e)),
            Err(e) => return Err(internal(e)),
        };
        for h in claimed {
            bytes += h.envelope.body.len() as u64;
            hooks.push(render(h));
        }
    }
    for m in others {
        if hooks.len() >= ask.max {
            break;
        }
        let body = ClaimRequest {
            max: Some(ask.max - hooks.len()),
            max_bytes: Some(ask.max_bytes.saturating_sub(bytes).max(1)),
            wait_ms: Some(0),
            lease_ms: Some(ask.lease_ms),
        };
        let path = format!("/pull/{sink}/claim");
        let answer = forward_json::<_, ClaimAnswer>(g, m, &path, headers, &body).await;
        if let Some((200, Some(theirs))) = answer {
            for h in theirs.hooks {
                bytes += h.body.as_ref().map_or(0, |b| b.len() as u64);
                hooks.push(h);
            }
        }
    }
    Ok(hooks)
}

/// `POST /pull/{sink}/wait` (between the nodes of a Relay only, signed; 404 to anyone
/// else): answers `{"ready": true}` as soon as this node has hooks of the sink waiting for
/// the consumer whose token the call carries, `false` when `wait_ms` ran out first.
#[answers]
#[utoipa::path(
    post,
    path = "/pull/{sink}/wait",
    tag = "cluster",
    params(("sink" = String, Path, description = "A pull sink's id")),
    request_body = ankusa_api::cluster::PullWait,
    responses(
        (status = 200, description = "Whether hooks wait for the consumer here"),
        PullErrors,
    ),
    security(("bearer" = []))
)]
pub async fn wait(
    State(g): State<Arc<Gateway>>,
    Path(sink): Path<String>,
    headers: HeaderMap,
    Json(req): Json<PullWait>,
) -> Result<Json<PullReady>, Response> {
    if !g.cluster.is_local_call(&headers) {
        return Err(crate::http::not_found().await);
    }
    let c = consumer(&g, &headers, &sink)?;
    let until = Instant::now() + Duration::from_millis(req.wait_ms.min(g.settings().max_wait_ms));
    let wake = g.deliverer.pull_wake.of(&sink);
    loop {
        let parked = wake.notified();
        tokio::pin!(parked);
        parked.as_mut().enable();
        let (g2, sink2, c2) = (g.clone(), sink.clone(), c.clone());
        let ready = match tokio::task::spawn_blocking(move || g2.has_waiting(&sink2, &c2)).await {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(internal(e)),
            Err(e) => return Err(internal(e)),
        };
        if ready || Instant::now() >= until {
            return Ok(Json(PullReady { ready }));
        }
        tokio::select! {
            _ = parked => {}
            _ = tokio::time::sleep_until(until.into()) => {}
        }
    }
}

/// A call to another node's pull gateway: its status and its answer read as an `A` (`None`
/// for an answer that does not read as one), or `None` when it did not answer.
async fn forward_json<B: serde::Serialize, A: serde::de::DeserializeOwned>(
    g: &Gateway,
    to: &crate::cluster::Member,
    path: &str,
    headers: &HeaderMap,
    body: &B,
) -> Option<(u16, Option<A>)> {
    use http_body_util::BodyExt;
    let mut h = HeaderMap::new();
    if let Some(a) = headers.get(axum::http::header::AUTHORIZATION) {
        h.insert(axum::http::header::AUTHORIZATION, a.clone());
    }
    h.insert(
        axum::http::header::CONTENT_TYPE,
        axum::http::HeaderValue::from_static("application/json"),
    );
    let resp = g
        .cluster
        .forward_pull(
            to,
            path,
            &h,
            bytes::Bytes::from(serde_json::to_vec(body).ok()?),
        )
        .await
        .ok()?;
    let status = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.ok()?.to_bytes();
    Some((status, serde_json::from_slice(&bytes).ok()))
}

fn render(c: Claimed) -> ClaimedHook {
    let env = &c.envelope;
    let (body, body_base64) = match std::str::from_utf8(&env.body) {
        Ok(s) => (Some(s.to_owned()), None),
        Err(_) => (
            None,
            Some(base64::engine::general_purpose::STANDARD.encode(&env.body)),
        ),
    };
    ClaimedHook {
        lease: c.lease,
        lease_deadline_ms: c.deadline.0,
        attempt: c.attempt,
        id: env.id.clone(),
        tenant: env.tenant_or_default().to_owned(),
        source: env.source.clone(),
        sink: c.sink,
        received_at_ms: env.received_at.0,
        content_type: env.content_type.clone(),
        headers: env
            .headers
            .iter()
            .map(|(n, v)| ForwardedHeader {
                name: n.clone(),
                value: String::from_utf8_lossy(v).into_owned(),
            })
            .collect(),
        body,
        body_base64,
    }
}

/// The leases of one call: 1 to `pull.max_claim` of them.
fn leases_in(g: &Gateway, leases: &[String]) -> Result<(), Refused> {
    let max = g.settings().max_claim;
    if leases.is_empty() || leases.len() > max {
        return Err(bad_request(format!(
            "leases: {} given; 1 to {max} (pull.max_claim)",
            leases.len()
        )));
    }
    Ok(())
}

/// The call's answer: 200 when every lease was held, 409 `lease_conflict` naming those
/// that were not.
#[allow(
    clippy::result_large_err,
    reason = "the 409 is the call's answer, built once, as the handlers' other refusals are"
)]
fn settled(
    leases: &[String],
    result: Vec<Option<ConflictReason>>,
    deadline: Option<u64>,
) -> Result<Json<SettleAnswer>, Response> {
    let conflicts: Vec<LeaseConflict> = leases
        .iter()
        .zip(&result)
        .filter_map(|(l, c)| {
            c.map(|c| LeaseConflict {
                lease: l.clone(),
                reason: c,
            })
        })
        .collect();
    let settled = result.iter().filter(|c| c.is_none()).count();
    if conflicts.is_empty() {
        return Ok(Json(SettleAnswer {
            settled,
            lease_deadline_ms: deadline,
            conflicts,
        }));
    }
    let expired = conflicts
        .iter()
        .filter(|c| c.reason == ConflictReason::Expired)
        .count();
    Err((
        StatusCode::CONFLICT,
        Json(ConflictBody {
            error: ErrorCode::LeaseConflict,
            message: format!(
                "{} of {} leases were not held ({expired} expired); the others were settled",
                conflicts.len(),
                leases.len()
            ),
            settled,
            conflicts,
        }),
    )
        .into_response())
}

/// What a settle or an extension does on this node.
#[derive(Debug, Clone, Copy)]
enum Op {
    Settle(Settle),
    Extend(u64),
}

async fn run_settle(
    g: Arc<Gateway>,
    sink: String,
    headers: HeaderMap,
    leases: Vec<String>,
    op: Op,
) -> Result<Json<SettleAnswer>, Response> {
    let c = consumer(&g, &headers, &sink)?;
    leases_in(&g, &leases)?;
    // Each lease is settled by the node that holds it: this node's here, the others'
    // sent on (a node asked by another answers for itself).
    let me = g.node().map(str::to_owned);
    let mut by_node: std::collections::BTreeMap<Option<String>, Vec<usize>> = Default::default();
    for (i, l) in leases.iter().enumerate() {
        let node = super::lease::parse_lease_id(l)
            .and_then(|p| p.node)
            .map(str::to_owned);
        let node = match node {
            Some(n) if Some(&n) != me.as_ref() && !g.cluster.is_local_call(&headers) => Some(n),
            _ => None,
        };
        by_node.entry(node).or_default().push(i);
    }
    let mut result: Vec<Option<ConflictReason>> = vec![None; leases.len()];
    let mut deadline = None;
    for (node, idx) in by_node {
        let mine: Vec<String> = idx.iter().map(|i| leases[*i].clone()).collect();
        match node {
            None => {
                let (g2, sink2, c2, l2) = (g.clone(), sink.clone(), c.clone(), mine.clone());
                let r = tokio::task::spawn_blocking(move || match op {
                    Op::Settle(how) => g2.settle(&sink2, &c2, &l2, how).map(|r| (r, None)),
                    Op::Extend(ms) => g2.extend(&sink2, &c2, &l2, ms).map(|(r, d)| (r, Some(d.0))),
                })
                .await;
                let (r, d) = match r {
                    Ok(Ok(r)) => r,
                    Ok(Err(e)) => return Err(internal(e)),
                    Err(e) => return Err(internal(e)),
                };
                deadline = deadline.or(d);
                for (i, c) in idx.iter().zip(r) {
                    result[*i] = c.map(Conflict::reason);
                }
            }
            Some(name) => {
                let member = g.cluster.members().iter().find(|m| m.name == name).cloned();
                let path = format!("/pull/{sink}/{}", op.path());
                let answer = match &member {
                    Some(m) => op.forward(&g, m, &path, &headers, mine).await,
                    None => None,
                };
                match answer {
                    // A 409's body reads as a settle's answer too (and its conflicts).
                    Some((200 | 409, Some(theirs))) => {
                        deadline = deadline.or(theirs.lease_deadline_ms);
                        let conflicts: std::collections::HashMap<String, ConflictReason> = theirs
                            .conflicts
                            .into_iter()
                            .map(|c| (c.lease, c.reason))
                            .collect();
                        for i in &idx {
                            result[*i] = conflicts.get(&leases[*i]).map(|r| match r {
                                ConflictReason::Expired => ConflictReason::Expired,
                                _ => ConflictReason::Unknown,
                            });
                        }
                    }
                    // Not in the node list (a lease of a node that left): unknown; a node
                    // that did not answer: try again later.
                    _ if member.is_none() => idx
                        .iter()
                        .for_each(|i| result[*i] = Some(ConflictReason::Unknown)),
                    _ => idx
                        .iter()
                        .for_each(|i| result[*i] = Some(ConflictReason::Unavailable)),
                }
            }
        }
    }
    settled(&leases, result, deadline)
}

impl Op {
    /// Sends `leases` to the node holding them, as this call's own request.
    async fn forward(
        self,
        g: &Gateway,
        to: &crate::cluster::Member,
        path: &str,
        headers: &HeaderMap,
        leases: Vec<String>,
    ) -> Option<(u16, Option<SettleAnswer>)> {
        match self {
            Op::Settle(Settle::Ack) => {
                forward_json(g, to, path, headers, &AckRequest { leases }).await
            }
            Op::Settle(Settle::Nack { retry_after }) => {
                let retry_after_ms = retry_after.map(|d| d.as_millis() as u64);
                let req = NackRequest {
                    leases,
                    retry_after_ms,
                };
                forward_json(g, to, path, headers, &req).await
            }
            Op::Extend(ms) => {
                let req = ExtendRequest {
                    leases,
                    lease_ms: Some(ms),
                };
                forward_json(g, to, path, headers, &req).await
            }
        }
    }

    fn path(self) -> &'static str {
        match self {
            Op::Settle(Settle::Ack) => "ack",
            Op::Settle(Settle::Nack { .. }) => "nack",
            Op::Extend(_) => "extend",
        }
    }
}

/// `POST /pull/{sink}/ack`: the hooks were delivered. Committed before it answers: an
/// acked hook is never handed out again (docs/pull.md says what a power cut can undo).
#[answers]
#[utoipa::path(
    post,
    path = "/pull/{sink}/ack",
    tag = "pull",
    params(("sink" = String, Path, description = "A pull sink's id")),
    request_body = AckRequest,
    responses(
        (status = 200, description = "Every lease settled"),
        PullErrors,
        crate::http::JsonBodyErrors,
        (status = 409, description = "Some leases were not held (expired or unknown); the others were settled", body = ConflictBody),
    ),
    security(("bearer" = []))
)]
pub async fn ack(
    State(g): State<Arc<Gateway>>,
    Path(sink): Path<String>,
    headers: HeaderMap,
    Json(req): Json<AckRequest>,
) -> Result<Json<SettleAnswer>, Response> {
    run_settle(g, sink, headers, req.leases, Op::Settle(Settle::Ack)).await
}

/// `POST /pull/{sink}/nack`: the hooks were not delivered: each is retried on the retry
/// schedule (no sooner than `retry_after_ms`), or dead-lettered past `retry.max_attempts`.
#[answers]
#[utoipa::path(
    post,
    path = "/pull/{sink}/nack",
    tag = "pull",
    params(("sink" = String, Path, description = "A pull sink's id")),
    request_body = NackRequest,
    responses(
        (status = 200, description = "Every lease given back"),
        PullErrors,
        crate::http::JsonBodyErrors,
        (status = 409, description = "Some leases were not held (expired or unknown); the others were given back", body = ConflictBody),
    ),
    security(("bearer" = []))
)]
pub async fn nack(
    State(g): State<Arc<Gateway>>,
    Path(sink): Path<String>,
    headers: HeaderMap,
    Json(req): Json<NackRequest>,
) -> Result<Json<SettleAnswer>, Response> {
    let retry_after = req.retry_after_ms.map(Duration::from_millis);
    let op = Op::Settle(Settle::Nack { retry_after });
    run_settle(g, sink, headers, req.leases, op).await
}

/// `POST /pull/{sink}/extend`: the leases run `lease_ms` from now.
#[answers]
#[utoipa::path(
    post,
    path = "/pull/{sink}/extend",
    tag = "pull",
    params(("sink" = String, Path, description = "A pull sink's id")),
    request_body = ExtendRequest,
    responses(
        (status = 200, description = "Every lease extended"),
        PullErrors,
        crate::http::JsonBodyErrors,
        (status = 409, description = "Some leases were not held (expired or unknown); the others were extended", body = ConflictBody),
    ),
    security(("bearer" = []))
)]
pub async fn extend(
    State(g): State<Arc<Gateway>>,
    Path(sink): Path<String>,
    headers: HeaderMap,
    Json(req): Json<ExtendRequest>,
) -> Result<Json<SettleAnswer>, Response> {
    let s = g.settings();
    let sink_lease = s.sinks.get(&sink).map_or(s.lease_ms, |k| k.lease_ms);
    let lease_ms = in_range(
        "lease_ms",
        req.lease_ms.unwrap_or(sink_lease),
        1_000,
        ankusa_config::MAX_LEASE_MS,
    )?;
    run_settle(g, sink, headers, req.leases, Op::Extend(lease_ms)).await
}
