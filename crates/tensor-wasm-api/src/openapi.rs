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
    use std::collections::{BTreeMap, BTreeSet};

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

    /// Operation id → (method, path, names of its path parameters), the
    /// path-level ones included.
    fn operations(spec: &Value) -> BTreeMap<String, (String, String, BTreeSet<String>)> {
        let mut ops = BTreeMap::new();
        for (path, item) in spec["paths"].as_object().expect("paths") {
            let path_params = |params: &Value| -> Vec<String> {
                params
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|p| p["in"] == "path")
                    .map(|p| p["name"].as_str().expect("a name").to_owned())
                    .collect()
            };
            let shared = path_params(&item["parameters"]);
            for (method, op) in item.as_object().expect("path item") {
                let Some(id) = op.get("operationId").and_then(Value::as_str) else {
                    continue;
                };
                let mut names: BTreeSet<String> = shared.iter().cloned().collect();
                names.extend(path_params(&op["parameters"]));
                ops.insert(id.to_owned(), (method.clone(), path.clone(), names));
            }
        }
        ops
    }

    /// Follows `$ref`s.
    fn resolve<'a>(spec: &'a Value, mut schema: &'a Value) -> &'a Value {
        while let Some(r) = schema.get("$ref").and_then(Value::as_str) {
            schema = spec
                .pointer(r.strip_prefix('#').expect("a local $ref"))
                .unwrap_or_else(|| panic!("dangling $ref {r}"));
        }
        schema
    }

    /// The schema the JSON pointer `pointer` reaches inside `schema`,
    /// through `$ref`s, `allOf` and `properties`.
    fn property_schema<'a>(spec: &'a Value, schema: &'a Value, pointer: &str) -> Option<&'a Value> {
        let mut at = resolve(spec, schema);
        for name in pointer.split('/').skip(1) {
            let parts: Vec<&Value> = std::iter::once(at)
                .chain(at["allOf"].as_array().into_iter().flatten())
                .map(|s| resolve(spec, s))
                .collect();
            at = parts
                .into_iter()
                .find_map(|s| s["properties"].get(name))
                .map(|s| resolve(spec, s))?;
        }
        Some(at)
    }

    /// Links (what schemathesis' stateful phase follows) name existing
    /// operations, fill exactly their path parameters from fields the
    /// response declares, and together reach every operation on a resource
    /// from the route that creates it: every `/functions/{id}` route from
    /// `POST /functions`, jobs from `invoke-async`, tenants and tokens from
    /// `POST /tenants`, models from `POST /models`.
    #[test]
    fn links_resolve_and_reach_every_function_route() {
        let spec = spec();
        let ops = operations(&spec);
        let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        let mut links = 0;
        for (path, item) in spec["paths"].as_object().expect("paths") {
            for (method, op) in item.as_object().expect("path item") {
                let Some(source) = op.get("operationId").and_then(Value::as_str) else {
                    continue;
                };
                let source_params = &ops[source].2;
                for (status, response) in op["responses"].as_object().expect("responses") {
                    let Some(out) = response.get("links").and_then(Value::as_object) else {
                        continue;
                    };
                    let body = &response["content"]["application/json"]["schema"];
                    for (name, link) in out {
                        let at = format!("{method} {path} {status} link {name}");
                        let target = link["operationId"].as_str().expect("operationId");
                        let (_, _, wanted) = ops
                            .get(target)
                            .unwrap_or_else(|| panic!("{at}: no operation `{target}`"));
                        let params = link["parameters"].as_object().expect("parameters");
                        let given: BTreeSet<String> = params.keys().cloned().collect();
                        assert_eq!(
                            &given, wanted,
                            "{at}: must fill the path parameters of `{target}`"
                        );
                        let mut expressions: Vec<&str> = params
                            .values()
                            .map(|v| v.as_str().expect("a runtime expression"))
                            .collect();
                        if let Some(body) = link.get("requestBody").and_then(Value::as_object) {
                            expressions.extend(body.values().filter_map(Value::as_str));
                        }
                        for expression in expressions {
                            if let Some(pointer) = expression.strip_prefix("$response.body#") {
                                assert!(
                                    property_schema(&spec, body, pointer).is_some(),
                                    "{at}: the {status} response declares no `{pointer}`"
                                );
                            } else if let Some(param) = expression.strip_prefix("$request.path.") {
                                assert!(
                                    source_params.contains(param),
                                    "{at}: no path parameter `{param}`"
                                );
                            } else if expression.starts_with('$') {
                                panic!("{at}: unexpected expression `{expression}`");
                            }
                            // Anything else is a constant (an HTTP handler's path).
                        }
                        edges
                            .entry(source.to_owned())
                            .or_default()
                            .insert(target.to_owned());
                        links += 1;
                    }
                }
            }
        }
        assert!(links >= 15, "only {links} links");

        // What the creators reach, following links transitively.
        let mut reached = BTreeSet::new();
        let mut todo: Vec<&str> = vec!["createFunction", "createTenant", "createModel"];
        while let Some(op) = todo.pop() {
            for next in edges.get(op).into_iter().flatten() {
                if reached.insert(next.clone()) {
                    todo.push(next);
                }
            }
        }
        for (id, (method, path, params)) in &ops {
            if !params.is_empty() {
                assert!(
                    reached.contains(id),
                    "{} {path} (`{id}`) is reached by no link from a creating route",
                    method.to_uppercase()
                );
            }
        }
    }

    /// Which of `branches` (`oneOf` entries of `required` lists) `body` matches.
    fn matching_branches(branches: &[Value], body: &Value) -> usize {
        branches
            .iter()
            .filter(|b| {
                b["required"]
                    .as_array()
                    .expect("a required list")
                    .iter()
                    .all(|f| body.get(f.as_str().expect("a field")).is_some())
            })
            .count()
    }

    /// `DeployRequest` says what the server does: exactly one of
    /// `module_base64` and `wat` (the schema's `oneOf`, checked on every
    /// combination against the handler's own rule).
    #[test]
    fn deploy_request_takes_exactly_one_module_field() {
        let spec = spec();
        let schema = &spec["components"]["schemas"]["DeployRequest"];
        let branches = schema["oneOf"]
            .as_array()
            .expect("DeployRequest has a oneOf");
        let module = "(module)".to_owned();
        let b64 = "KG1vZHVsZSk=".to_owned(); // "(module)"
        for (module_base64, wat) in [
            (None, None),
            (Some(b64.clone()), None),
            (None, Some(module.clone())),
            (Some(b64), Some(module)),
        ] {
            let mut body = serde_json::Map::new();
            if let Some(v) = &module_base64 {
                body.insert("module_base64".into(), v.clone().into());
            }
            if let Some(v) = &wat {
                body.insert("wat".into(), v.clone().into());
            }
            let body = Value::Object(body);
            let schema_accepts = matching_branches(branches, &body) == 1;
            let server_accepts = crate::functions::module_of_json(module_base64, wat).is_ok();
            assert_eq!(schema_accepts, server_accepts, "{body}");
        }
        for field in ["module_base64", "wat"] {
            assert!(
                schema["properties"][field]["type"] == "string",
                "`{field}` is a string property"
            );
        }
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
