//! The OpenAPI document, served at `/openapi.json` and checked against the router by tests.

use axum::http::header;
use axum::response::IntoResponse;

/// The OpenAPI 3.1 document of this API.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

pub(crate) async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}
