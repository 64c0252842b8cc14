//! The OpenAPI document, served at `/openapi.json` and checked against the router by tests.

use axum::http::header;
use axum::response::IntoResponse;

/// The OpenAPI 3.1 document of this API.
pub const OPENAPI_JSON: &str = include_str!("../openapi.json");

pub(crate) async fn serve() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI_JSON)
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::OPENAPI_JSON;
    use crate::ErrorCode;

    fn spec() -> Value {
        serde_json::from_str(OPENAPI_JSON).expect("openapi.json is JSON")
    }

    /// The document's `Error.code` enum is [`ErrorCode::ALL`], in order.
    #[test]
    fn error_code_enum_is_error_code_all() {
        let spec = spec();
        let documented: Vec<&str> = spec["components"]["schemas"]["Error"]["properties"]["error"]
            ["properties"]["code"]["enum"]
            .as_array()
            .expect("Error.code has an enum")
            .iter()
            .map(|v| v.as_str().expect("codes are strings"))
            .collect();
        let codes: Vec<&str> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            documented, codes,
            "openapi.json's Error.code enum must list ErrorCode::ALL (src/error.rs) in order"
        );
    }

    /// Every code a response names in its description (`Codes: `a`, `b`.`)
    /// exists and is answered with that response's status.
    #[test]
    fn responses_name_codes_of_their_status() {
        let spec = spec();
        let mut named = 0;
        for (path, item) in spec["paths"].as_object().expect("paths") {
            for (method, operation) in item.as_object().expect("path item") {
                let Some(responses) = operation.get("responses").and_then(Value::as_object) else {
                    continue; // `parameters`
                };
                for (status, response) in responses {
                    let description = response["description"].as_str().unwrap_or("");
                    let Some((_, list)) = description.split_once("Codes: ") else {
                        continue;
                    };
                    for code in list.split('`').skip(1).step_by(2) {
                        let known = ErrorCode::ALL
                            .iter()
                            .find(|c| c.as_str() == code)
                            .unwrap_or_else(|| {
                                panic!("{method} {path} {status}: unknown code `{code}`")
                            });
                        assert_eq!(
                            known.status().as_str(),
                            status,
                            "{method} {path}: `{code}` is documented under {status}"
                        );
                        named += 1;
                    }
                }
            }
        }
        assert!(
            named > 50,
            "only {named} documented codes: is the format unchanged?"
        );
    }
}
