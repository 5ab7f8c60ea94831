//! The API's contract: an OpenAPI 3.1 document generated from the handlers' own
//! annotations (`utoipa`), served at `/v1/openapi.json` on the admin listener and committed
//! as `docs/openapi.json` (a test keeps the two equal, another compares the routers' routes
//! and `docs/api.md` with it; `schemathesis` checks a live node's answers against it).
//!
//! Every body's schema comes from the type its handler serializes, declared in the
//! wire-types crate (`ankusa_api::admin::DlqPage`, `ankusa_api::ingest::IngestAnswer`,
//! `ankusa_api::error::ErrorBody`, …): there are no schema-only mirrors here. This module
//! only gathers the paths.

use utoipa::openapi::security::{ApiKey, ApiKeyValue, HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

/// The bearer token of `/v1/*` and the cluster token of `/cluster/v1/*`.
struct Security;

impl Modify for Security {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let c = openapi.components.get_or_insert_with(Default::default);
        c.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
        c.add_security_scheme(
            "cluster",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("ankusa-node-auth"))),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Ankusa relay node",
        description = "The ingest listener (`ingest.listen`, default :8080: `/ingest/*`, `/pull/*`, `/healthz`, `/readyz`) and the admin listener (`admin.listen`, default :9090: `/v1/*`, `/cluster/v1/*`, `/metrics`, `/healthz`, `/readyz`) of one node. Every error is `ErrorBody`. See docs/api.md."
    ),
    paths(
        crate::ingest::ingest,
        crate::ingest::ingest_for_tenant,
        crate::admin::healthz,
        crate::admin::readyz,
        crate::admin::metrics,
        crate::admin::node::node,
        crate::admin::node::config,
        crate::admin::dlq::dlq,
        crate::admin::dlq::replay,
        crate::admin::tenants::tenants_top,
        crate::admin::tenants::tenant,
        crate::admin::tenants::purge,
        crate::admin::tenants::retry,
        crate::admin::tenants::pause,
        crate::admin::tenants::resume,
        crate::admin::erase::erase,
        crate::admin::limits::get,
        crate::admin::limits::put,
        crate::admin::limits::delete,
        crate::admin::endpoints::list,
        crate::admin::endpoints::create,
        crate::admin::endpoints::get,
        crate::admin::endpoints::update,
        crate::admin::endpoints::rotate,
        crate::admin::endpoints::delete,
        crate::admin::quarantine::quarantine_list,
        crate::admin::quarantine::quarantine_delete,
        crate::admin::quarantine::quarantine_replay,
        crate::admin::audit::audit_list,
        crate::admin::hooks::get,
        crate::admin::hooks::recent,
        crate::admin::hooks::by_delivery,
        crate::admin::portal::create,
        crate::admin::sources::get,
        crate::admin::archive::list,
        crate::admin::archive::replay,
        crate::admin::backups::create,
        crate::admin::backups::stream,
        crate::admin::backups::archive,
        crate::admin::cluster_api::lend,
        crate::admin::cluster_api::slots,
        crate::admin::cluster_api::stored,
        crate::admin::cluster_api::handoff,
        crate::pull::http::claim,
        crate::pull::http::ack,
        crate::pull::http::nack,
        crate::pull::http::extend,
        crate::pull::http::wait,
        document,
    ),
    modifiers(&Security),
    tags(
        (name = "ingest", description = "The ingest listener: providers post hooks here."),
        (name = "pull", description = "The ingest listener: consumers of pull sinks lease hooks here (docs/pull.md)."),
        (name = "admin", description = "The admin listener: operators and the operator."),
        (name = "cluster", description = "Between the nodes of one Relay."),
    )
)]
pub struct ApiDoc;

/// The document, as `/v1/openapi.json` serves it and `docs/openapi.json` holds it.
pub fn json() -> String {
    #[allow(
        clippy::expect_used,
        reason = "a document of derived schemas has only string keys: it always serializes"
    )]
    let mut s = ApiDoc::openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes");
    s.push('\n');
    s
}

/// `GET /v1/openapi.json`: this document.
#[utoipa::path(
    get,
    path = "/v1/openapi.json",
    tag = "admin",
    responses(
        (status = 200, description = "The OpenAPI 3.1 document of both listeners", content_type = "application/json", body = Object),
        (status = 401, body = ankusa_api::error::ErrorBody),
    ),
    security(("bearer" = []))
)]
pub async fn document() -> axum::response::Response {
    use axum::response::IntoResponse;
    (
        [(axum::http::header::CONTENT_TYPE, "application/json")],
        json(),
    )
        .into_response()
}

/// The document's route, which the node mounts on the admin router (behind its token and
/// readiness checks, like every `/v1` route).
pub fn routes() -> axum::Router<std::sync::Arc<crate::admin::api::Api>> {
    axum::Router::new().route("/v1/openapi.json", axum::routing::get(document))
}
