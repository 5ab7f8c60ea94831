//! `admin endpoints …`: a tenant's own endpoints, through the Relay (each call is routed to
//! the tenant's owner by the node it reaches). Prints the API's answer as JSON.

use hyper::Method;

use super::client::{self as c, body, Nodes};
use super::EndpointsCommand;
use ankusa_api::endpoints::{
    Endpoint, EndpointCreate, EndpointList, EndpointPatch, EndpointSecret, RotateRequest,
};

/// A JSON filter given on the command line (`none`: cleared).
fn filter_arg(text: &str) -> anyhow::Result<Option<serde_json::Value>> {
    if text == "none" {
        return Ok(None);
    }
    serde_json::from_str(text)
        .map(Some)
        .map_err(|e| anyhow::anyhow!("--filter: not JSON: {e}"))
}

/// The command's call and its answer, as JSON.
pub(super) async fn answer(
    nodes: &Nodes,
    command: &EndpointsCommand,
) -> anyhow::Result<serde_json::Value> {
    let base = |t: &str| format!("/v1/tenants/{}/endpoints", c::q(t));
    let one = |t: &str, id: &str| format!("{}/{}", base(t), c::q(id));
    Ok(match command {
        EndpointsCommand::List { tenant } => {
            let l: EndpointList = nodes.routed(Method::GET, &base(tenant), None).await?;
            serde_json::to_value(l)?
        }
        EndpointsCommand::Create {
            tenant,
            url,
            description,
            filter,
            rate,
            disabled,
        } => {
            let req = EndpointCreate {
                url: url.clone(),
                description: description.clone(),
                filter: filter.as_deref().map(filter_arg).transpose()?.flatten(),
                rate_per_second: *rate,
                enabled: Some(!disabled),
            };
            let b = body(&req)?;
            let made: EndpointSecret = nodes.routed(Method::POST, &base(tenant), Some(&b)).await?;
            serde_json::to_value(made)?
        }
        EndpointsCommand::Get { tenant, id } => {
            let e: Endpoint = nodes.routed(Method::GET, &one(tenant, id), None).await?;
            serde_json::to_value(e)?
        }
        EndpointsCommand::Update {
            tenant,
            id,
            url,
            description,
            filter,
            rate,
            enable,
            disable,
        } => {
            let rate = match rate.as_deref() {
                None => None,
                Some("none") => Some(None),
                Some(n) => Some(Some(
                    n.parse::<u32>()
                        .map_err(|e| anyhow::anyhow!("--rate: {e}"))?,
                )),
            };
            let patch = EndpointPatch {
                url: url.clone(),
                description: description
                    .as_ref()
                    .map(|d| (d != "none").then(|| d.clone())),
                filter: filter.as_deref().map(filter_arg).transpose()?,
                rate_per_second: rate,
                enabled: (*enable || *disable).then_some(*enable),
            };
            let b = body(&patch)?;
            let e: Endpoint = nodes
                .routed(Method::PATCH, &one(tenant, id), Some(&b))
                .await?;
            serde_json::to_value(e)?
        }
        EndpointsCommand::Rotate {
            tenant,
            id,
            overlap_s,
        } => {
            let b = body(&RotateRequest {
                overlap_s: *overlap_s,
            })?;
            let path = format!("{}/rotate", one(tenant, id));
            let r: EndpointSecret = nodes.routed(Method::POST, &path, Some(&b)).await?;
            serde_json::to_value(r)?
        }
        EndpointsCommand::Delete { tenant, id } => {
            let e: Endpoint = nodes.routed(Method::DELETE, &one(tenant, id), None).await?;
            serde_json::to_value(e)?
        }
    })
}
