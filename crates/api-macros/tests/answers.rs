//! The document `#[answers]` gives: each success names the handler's body type, and only
//! the successes do.

use ankusa_api_macros::answers;
use utoipa::OpenApi;

#[derive(serde::Serialize, utoipa::ToSchema)]
struct Page {
    n: u32,
}

#[derive(serde::Serialize, utoipa::ToSchema)]
struct Refusal {
    why: String,
}

struct Json<T>(T);

#[answers]
#[utoipa::path(
    post,
    path = "/pages",
    responses(
        (status = 202, description = "Taken"),
        (status = 200, description = "Taken before"),
        (status = 409, description = "Refused", body = Refusal),
    )
)]
#[allow(dead_code)]
async fn pages() -> Result<(u16, Json<Page>), Json<Refusal>> {
    Ok((202, Json(Page { n: 1 })))
}

#[derive(OpenApi)]
#[openapi(paths(pages))]
struct Doc;

#[test]
fn every_success_names_the_body_the_handler_returns() {
    let doc = serde_json::to_value(Doc::openapi()).unwrap();
    let responses = &doc["paths"]["/pages"]["post"]["responses"];
    for status in ["200", "202"] {
        let schema = &responses[status]["content"]["application/json"]["schema"]["$ref"];
        assert_eq!(schema, "#/components/schemas/Page", "{status}: {responses}");
    }
    let refusal = &responses["409"]["content"]["application/json"]["schema"]["$ref"];
    assert_eq!(refusal, "#/components/schemas/Refusal");
    let _ = pages;
}
