//! The router driven in-process with `oneshot`: routes, status codes, error
//! codes, body limits, metrics, and the OpenAPI document against the router.

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tensor_wasm_api::{ApiConfig, ErrorCode, HttpRequestLabels, OPENAPI_JSON, ROUTE_TEMPLATES};
use tensor_wasm_test_support::app::{InsecureApp, Reply};
use tensor_wasm_test_support::guests::example;
use tensor_wasm_test_support::wait::{wait_for_async, wait_until_async};
use tower::ServiceExt;

const UNKNOWN_ID: &str = "fn-000000000000000000000000";

fn harness() -> InsecureApp {
    InsecureApp::new()
}

fn harness_with(api: ApiConfig) -> InsecureApp {
    InsecureApp::with(|_| {}, api)
}

#[tokio::test]
async fn health_ready_metrics_and_spec_are_served() {
    let h = harness();
    let r = h.get("/healthz").await;
    assert_eq!(r.status, StatusCode::OK);
    let generated = r.headers["x-request-id"].clone();
    assert_ne!(h.get("/healthz").await.headers["x-request-id"], generated);
    let req = Request::get("/healthz")
        .header("x-request-id", "client-42")
        .body(Body::empty())
        .unwrap();
    let response = h.app.clone().oneshot(req).await.unwrap();
    assert_eq!(response.headers()["x-request-id"], "client-42");
    assert_eq!(h.get("/readyz").await.status, StatusCode::OK);
    assert_eq!(h.get("/openapi.json").await.json()["openapi"], "3.1.0");
    let metrics = h.get("/metrics").await;
    assert_eq!(metrics.status, StatusCode::OK);
    let text = String::from_utf8(metrics.body).unwrap();
    assert!(
        text.contains(
            r#"tensor_wasm_http_requests_total{method="GET",route="/healthz",status="200"} 3"#
        ),
        "{text}"
    );
    assert!(text.contains("tensor_wasm_invocations_total"));
}

#[tokio::test]
async fn readyz_is_503_until_ready() {
    let h = InsecureApp::not_ready(|_| {}, ApiConfig::default());
    let r = h.get("/readyz").await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.code(), "not_ready");
    h.state.set_ready(true);
    assert_eq!(h.get("/readyz").await.status, StatusCode::OK);
}

/// Files under `dir`, recursively.
fn files_under(dir: &std::path::Path) -> usize {
    std::fs::read_dir(dir).map_or(0, |entries| {
        entries
            .flatten()
            .map(|e| {
                if e.path().is_dir() {
                    files_under(&e.path())
                } else {
                    1
                }
            })
            .sum()
    })
}

/// The value of the sample `series` (name and labels, exactly as exposed) on `/metrics`.
async fn metric(h: &InsecureApp, series: &str) -> f64 {
    let text = h.get("/metrics").await.text();
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap()
}

/// A module that compiled but failed to link stayed in the
/// compiled-module map and in `artifacts/` forever (100 such deploys left 200
/// files and `tensor_wasm_cached_modules 100`), and nothing bounded either cache.
#[tokio::test]
async fn failed_deploys_leave_nothing_and_module_caches_stay_bounded() {
    let h = InsecureApp::with(
        |c| {
            c.caches = tensor_wasm_runtime::CacheLimits {
                module_entries: 3,
                artifact_entries: 4,
                ..Default::default()
            }
        },
        ApiConfig::default(),
    );
    let deploy = |wat: String, query: &'static str| {
        let h = &h;
        async move {
            h.send(
                Method::POST,
                &format!("/functions?{query}"),
                Some("application/wasm"),
                wat.into_bytes(),
            )
            .await
        }
    };
    let constant = |i: usize| format!("(module (func (export \"f\") (result i32) i32.const {i}))");
    let first = deploy(constant(1000), "name=first").await;
    assert_eq!(first.status, StatusCode::CREATED, "{}", first.text());
    let artifacts = h.dir.path().join("artifacts");
    let files_before = files_under(&artifacts);
    assert_eq!(files_before, 2, "one artifact and its sidecar");
    let cached_before = metric(&h, "tensor_wasm_cached_modules").await;
    let modules = r#"tensor_wasm_cache_entries{cache="modules"}"#;
    assert_eq!(metric(&h, modules).await, cached_before);

    // Every one compiles; 90 fail to link (an import nothing provides), 10 fail the
    // memory check that runs after linking.
    for i in 0..100 {
        let (wat, query, code) = if i % 10 == 0 {
            (
                format!("(module (memory 300) (func (export \"f\") (result i32) i32.const {i}))"),
                "name=big&memory_limit_bytes=1048576",
                "invalid_config",
            )
        } else {
            (
                format!("(module (import \"env\" \"missing{i}\" (func)) (func (export \"f\")))"),
                "name=unlinkable",
                "invalid_module",
            )
        };
        let r = deploy(wat, query).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{}", r.text());
        assert_eq!(r.code(), code, "{}", r.text());
    }
    assert_eq!(
        files_under(&artifacts),
        files_before,
        "no artifact left behind"
    );
    assert_eq!(
        metric(&h, "tensor_wasm_cached_modules").await,
        cached_before
    );
    assert_eq!(metric(&h, modules).await, cached_before);
    assert_eq!(
        h.runtime.functions().len(),
        1,
        "only the first deploy stored"
    );

    // Many working functions: both caches stay within their bounds, and every
    // function still answers, evicted ones by loading or compiling again.
    let mut ids = Vec::new();
    for i in 0..12 {
        let r = deploy(constant(i), "name=c").await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        ids.push(r.json()["id"].as_str().unwrap().to_owned());
    }
    for round in 0..2 {
        for (i, id) in ids.iter().enumerate() {
            let r = h.invoke(id, json!({"export": "f", "args": []})).await;
            assert_eq!(r.status, StatusCode::OK, "round {round}: {}", r.text());
            assert_eq!(r.json()["results"], json!([i]), "round {round}");
            assert!(metric(&h, modules).await <= 3.0);
            assert!(
                files_under(&artifacts) <= 8,
                "4 artifacts with their sidecars"
            );
        }
    }
    assert!(metric(&h, r#"tensor_wasm_cache_evictions_total{cache="modules"}"#).await > 0.0);
    assert!(
        metric(
            &h,
            r#"tensor_wasm_cache_evictions_total{cache="artifacts"}"#
        )
        .await
            > 0.0
    );
    let bytes = metric(&h, r#"tensor_wasm_cache_bytes{cache="modules"}"#).await;
    assert!(bytes > 0.0, "{bytes}");
}

#[tokio::test]
async fn deploy_list_get_invoke_delete() {
    let h = harness();
    let id = h.deploy("calc.wat", "name=calc").await;
    let list = h.get("/functions").await.json();
    assert_eq!(list["functions"][0]["id"], id.as_str());
    let one = h.get(&format!("/functions/{id}")).await;
    assert_eq!(one.status, StatusCode::OK);
    let exports = one.json()["exports"].clone();
    assert!(exports
        .as_array()
        .unwrap()
        .iter()
        .any(|e| e["name"] == "add" && e["params"] == json!(["i32", "i32"])));

    let r = h
        .invoke(&id, json!({"export": "add", "args": [1, 2]}))
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json(), json!({"results": [3]}));

    let r = h
        .send(Method::DELETE, &format!("/functions/{id}"), None, vec![])
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT);
    assert_eq!(h.get(&format!("/functions/{id}")).await.code(), "not_found");
    let r = h
        .send(Method::DELETE, &format!("/functions/{id}"), None, vec![])
        .await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn deploy_as_json_with_base64_or_wat() {
    use base64::Engine as _;
    let h = harness();
    let b64 = base64::engine::general_purpose::STANDARD.encode(example("upper.wat"));
    let body = json!({"name": "upper", "style": "wasi", "module_base64": b64, "timeout_ms": 2000});
    let r = h
        .send(
            Method::POST,
            "/functions",
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.json()["limits"]["timeout_ms"], 2000);
    let id = r.json()["id"].as_str().unwrap().to_owned();
    let r = h
        .send(
            Method::POST,
            &format!("/functions/{id}/invoke"),
            Some("text/plain"),
            b"abc".to_vec(),
        )
        .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.body, b"ABC");
    assert_eq!(r.headers["x-exit-code"], "0");
    assert_eq!(r.headers["x-stderr-tail"], "upper: done\\n");

    let wat = String::from_utf8(example("calc.wat")).unwrap();
    let body = json!({"wat": wat});
    let r = h
        .send(
            Method::POST,
            "/functions",
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await;
    assert_eq!(r.status, StatusCode::CREATED);
    assert_eq!(r.json()["name"], "function");

    // Options may also be query parameters; one given in both places must agree.
    let body = json!({"wat": wat, "timeout_ms": 1500}).to_string();
    for (query, expected) in [
        ("name=calc2", StatusCode::CREATED),
        ("timeout_ms=1500&name=calc3", StatusCode::CREATED),
        ("timeout_ms=1000", StatusCode::BAD_REQUEST),
    ] {
        let r = h
            .send(
                Method::POST,
                &format!("/functions?{query}"),
                Some("application/json"),
                body.clone().into_bytes(),
            )
            .await;
        assert_eq!(r.status, expected, "{query}: {:?}", r.json());
        if expected == StatusCode::CREATED {
            assert_eq!(r.json()["limits"]["timeout_ms"], 1500);
            assert!(r.json()["name"].as_str().unwrap().starts_with("calc"));
        } else {
            assert_eq!(r.json()["error"]["code"], "bad_request");
        }
    }
}

#[tokio::test]
async fn wasi_output_as_json_when_accepted() {
    let h = harness();
    let id = h.deploy("upper.wat", "name=upper&style=wasi").await;
    let req = Request::post(format!("/functions/{id}/invoke"))
        .header(header::ACCEPT, "application/json")
        .body(Body::from("shout"))
        .unwrap();
    let response = h.app.clone().oneshot(req).await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value =
        serde_json::from_slice(&response.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(body["stdout"], "SHOUT");
    assert_eq!(body["exit_code"], 0);
    assert_eq!(body["stderr_tail"], "upper: done\n");
}

#[tokio::test]
async fn bad_input_gets_documented_errors() {
    let h = harness_with(ApiConfig {
        max_body_bytes: 64 << 10,
        ..ApiConfig::default()
    });
    let id = h.deploy("calc.wat", "name=calc").await;

    let cases: Vec<(Reply, StatusCode, &str)> = vec![
        (
            h.send(
                Method::POST,
                "/functions",
                Some("application/wasm"),
                b"\0asm\x01\0\0\0\x01".to_vec(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "invalid_module",
        ),
        (
            h.send(
                Method::POST,
                "/functions",
                Some("application/wasm"),
                b"(module".to_vec(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "invalid_module",
        ),
        // An HTTP-handler component (WASI 0.2) whose `handle` has the wrong type.
        (
            h.send(
                Method::POST,
                "/functions",
                Some("application/wasm"),
                tensor_wasm_test_support::guests::MISTYPED_HTTP_HANDLER_COMPONENT
                    .as_bytes()
                    .to_vec(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "invalid_module",
        ),
        // A component exporting nothing to invoke.
        (
            h.send(
                Method::POST,
                "/functions",
                Some("application/wasm"),
                b"(component)".to_vec(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "unsupported_feature",
        ),
        (
            h.send(
                Method::POST,
                "/functions",
                Some("application/json"),
                b"{oops".to_vec(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            h.send(
                Method::POST,
                "/functions",
                Some("application/json"),
                br#"{"wat":"(module)","bogus":1}"#.to_vec(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            h.send(
                Method::POST,
                "/functions?style=nope",
                Some("application/wasm"),
                example("calc.wat"),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            h.send(
                Method::POST,
                "/functions?timeout_ms=0",
                Some("application/wasm"),
                example("calc.wat"),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "invalid_config",
        ),
        (
            h.send(
                Method::POST,
                "/functions",
                Some("image/png"),
                example("calc.wat"),
            )
            .await,
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        ),
        (
            h.send(
                Method::POST,
                "/functions",
                Some("application/wasm"),
                vec![b' '; 65 << 10],
            )
            .await,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
        (
            h.invoke(&id, json!({"export": "add", "args": [1]})).await,
            StatusCode::BAD_REQUEST,
            "invalid_arguments",
        ),
        (
            h.invoke(&id, json!({"export": "add", "args": [1, 2.5]}))
                .await,
            StatusCode::BAD_REQUEST,
            "invalid_arguments",
        ),
        (
            h.invoke(&id, json!({"export": "missing"})).await,
            StatusCode::BAD_REQUEST,
            "unknown_export",
        ),
        (
            h.send(
                Method::POST,
                &format!("/functions/{id}/invoke"),
                Some("application/json"),
                b"[1,2".to_vec(),
            )
            .await,
            StatusCode::BAD_REQUEST,
            "bad_request",
        ),
        (
            h.invoke(&id, json!({"export": "div", "args": [1, 0]}))
                .await,
            StatusCode::INTERNAL_SERVER_ERROR,
            "guest_trap",
        ),
        (
            h.invoke(UNKNOWN_ID, json!({"export": "add"})).await,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            h.invoke("fn-..%2F..%2Fetc", json!({"export": "add"})).await,
            StatusCode::NOT_FOUND,
            "not_found",
        ),
        (
            h.get("/nope").await,
            StatusCode::NOT_FOUND,
            "route_not_found",
        ),
        (
            h.send(Method::PUT, "/functions", None, vec![]).await,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
        ),
        (
            h.send(
                Method::POST,
                &format!("/functions/{id}/invoke"),
                Some("application/json"),
                vec![b' '; 65 << 10],
            )
            .await,
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        ),
    ];
    for (i, (reply, status, code)) in cases.iter().enumerate() {
        assert_eq!(
            reply.status,
            *status,
            "case {i}: {}",
            String::from_utf8_lossy(&reply.body)
        );
        assert_eq!(reply.code(), *code, "case {i}");
        assert!(!reply.json()["error"]["message"]
            .as_str()
            .unwrap()
            .is_empty());
    }
    // Still serving, and the good function still works.
    assert_eq!(
        h.invoke(&id, json!({"export": "add", "args": [2, 3]}))
            .await
            .json(),
        json!({"results": [5]})
    );
    assert_eq!(
        h.get("/functions").await.json()["functions"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

/// Every path and method of the OpenAPI document is routed, every other
/// method on those paths is 405, and the error-code enum is exactly the
/// codes the server can answer.
#[tokio::test]
async fn openapi_document_matches_the_router() {
    let h = harness();
    let spec: Value = serde_json::from_str(OPENAPI_JSON).unwrap();
    let paths = spec["paths"].as_object().unwrap();
    let all = ["get", "post", "put", "delete", "patch"];
    let mut seen_routes = 0;
    for (path, item) in paths {
        let id = if path.starts_with("/tenants") {
            "tn-0000000000000000"
        } else if path.starts_with("/jobs") {
            "job-000000000000000000000000"
        } else {
            UNKNOWN_ID
        };
        let uri = path
            .replace("{id}", id)
            .replace("{token_id}", "tk-000000000000")
            .replace("{snapshot_id}", "snap-000000000000000000000000")
            .replace("{name}", "no-such-handler")
            .replace("{path}", "a/b");
        for method in all {
            let m = Method::from_bytes(method.to_uppercase().as_bytes()).unwrap();
            let body = if method == "post" && path == "/functions" {
                b"(module".to_vec()
            } else {
                vec![]
            };
            let r = h.send(m, &uri, Some("application/wasm"), body).await;
            if item.get(method).is_some() {
                seen_routes += 1;
                let code = if r.status.is_success() {
                    String::new()
                } else {
                    r.code()
                };
                assert!(
                    code != "route_not_found" && code != "method_not_allowed",
                    "{method} {path} is in the spec but not routed"
                );
                let documented = item[method]["responses"].as_object().unwrap();
                assert!(
                    documented.contains_key(r.status.as_str()),
                    "{method} {path} answered undocumented {}",
                    r.status
                );
            } else {
                assert_eq!(
                    r.status,
                    StatusCode::METHOD_NOT_ALLOWED,
                    "{method} {path} is routed but not in the spec"
                );
            }
        }
    }
    assert_eq!(seen_routes, 38);
    // The metrics route-label allow-list is exactly the documented routes.
    let mut documented: Vec<&str> = paths.keys().map(String::as_str).collect();
    let mut allowed = ROUTE_TEMPLATES.to_vec();
    documented.sort_unstable();
    allowed.sort_unstable();
    assert_eq!(documented, allowed);

    let mut spec_codes: Vec<String> = spec["components"]["schemas"]["Error"]["properties"]["error"]
        ["properties"]["code"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_owned())
        .collect();
    let mut codes: Vec<String> = ErrorCode::ALL
        .iter()
        .map(|c| c.as_str().to_owned())
        .collect();
    spec_codes.sort();
    codes.sort();
    assert_eq!(spec_codes, codes);
}

#[tokio::test]
async fn metrics_count_invocations_by_outcome_and_route_template() {
    let h = harness();
    let id = h.deploy("calc.wat", "name=calc").await;
    h.invoke(&id, json!({"export": "add", "args": [1, 2]}))
        .await;
    h.invoke(&id, json!({"export": "div", "args": [1, 0]}))
        .await;
    let text = String::from_utf8(h.get("/metrics").await.body).unwrap();
    assert!(
        text.contains(r#"tensor_wasm_invocations_total{outcome="ok"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"tensor_wasm_invocations_total{outcome="trap"} 1"#));
    assert!(text.contains(r#"route="/functions/{id}/invoke",status="500"} 1"#));
    assert!(text.contains(r#"tensor_wasm_module_loads_total{source="compiled"} 1"#));
    assert!(text.contains("tensor_wasm_cached_modules 1"));
    assert!(!text.contains(&id), "raw ids must not become label values");

    // Neither can a client mint methods: any non-standard method is labelled `other`.
    for method in ["FOO", "BAR"] {
        let m = Method::from_bytes(method.as_bytes()).unwrap();
        h.send(m, "/healthz", None, vec![]).await;
    }
    let text = String::from_utf8(h.get("/metrics").await.body).unwrap();
    assert!(!text.contains("FOO") && !text.contains("BAR"), "{text}");
    assert!(
        text.contains(r#"method="other",route="/healthz",status="405"} 2"#),
        "{text}"
    );
    assert_eq!(
        HttpRequestLabels::try_new("/functions/{id}", &Method::PATCH).map(|l| l.route),
        Some("/functions/{id}")
    );
    assert_eq!(
        HttpRequestLabels::try_new("/functions/fn-1", &Method::GET),
        None
    );
}

/// With the only instance slot held by a long invocation, a call waits the
/// queue timeout and answers 429 `busy` with `Retry-After`. No fixed delay decides
/// when the slot is held: the test waits until the long call is in flight,
/// then calls until one is refused (only the long call, which holds the slot
/// for its whole 400 ms deadline, can make one wait).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn saturated_slots_answer_busy_with_retry_after() {
    let h = InsecureApp::with(
        |c| c.max_instances = 1,
        ApiConfig {
            queue_timeout: std::time::Duration::from_millis(50),
            ..ApiConfig::default()
        },
    );
    let spin = h.deploy("loop.wat", "name=loop&timeout_ms=400").await;
    let calc = h.deploy("calc.wat", "name=calc").await;
    let app = h.app.clone();
    let long = tokio::spawn(async move {
        let req = Request::post(format!("/functions/{spin}/invoke"))
            .header(header::CONTENT_TYPE, "application/json")
            .body(Body::from(r#"{"export":"spin"}"#))
            .unwrap();
        app.oneshot(req).await.unwrap().status()
    });
    let tenant = h.tenant();
    wait_until_async(
        std::time::Duration::from_secs(10),
        "the long invocation is in flight",
        || tenant.usage(tensor_wasm_tenant::Resource::ConcurrentInvocations) == 1,
    )
    .await;
    // Between being admitted and taking the slot the long call may still be
    // overtaken once; a call that gets the slot answers 200 and is retried.
    let refused = wait_for_async(
        std::time::Duration::from_secs(10),
        "a call is refused for want of a slot",
        || async {
            let r = h
                .invoke(&calc, json!({"export": "add", "args": [1, 1]}))
                .await;
            if r.status == StatusCode::OK {
                return None;
            }
            Some(r)
        },
    )
    .await;
    assert_eq!(
        refused.status,
        StatusCode::TOO_MANY_REQUESTS,
        "{}",
        refused.text()
    );
    assert_eq!(refused.code(), "busy");
    assert_eq!(refused.headers[header::RETRY_AFTER], "1");
    assert_eq!(long.await.unwrap(), StatusCode::GATEWAY_TIMEOUT);
    // The slot is free again.
    let r = h
        .invoke(&calc, json!({"export": "add", "args": [1, 1]}))
        .await;
    assert_eq!(r.json(), json!({"results": [2]}));
}

#[tokio::test]
async fn saturated_kernel_dispatcher_answers_429() {
    let h = InsecureApp::with(
        |c| {
            c.dispatch = tensor_wasm_dispatch::DispatchConfig {
                max_in_flight: 1,
                max_queued: 0,
            }
        },
        ApiConfig::default(),
    );
    let id = h.deploy("vector_add.wat", "name=vadd").await;

    let held = h.runtime.dispatcher().acquire_blocking().unwrap();
    let r = h.invoke(&id, json!({"export": "run", "args": [100]})).await;
    assert_eq!(r.status, StatusCode::TOO_MANY_REQUESTS);
    assert_eq!(r.code(), "busy");
    assert_eq!(r.headers[header::RETRY_AFTER], "1");
    drop(held);
    let r = h.invoke(&id, json!({"export": "run", "args": [100]})).await;
    assert_eq!(r.json(), json!({"results": [100]}));
    let text = String::from_utf8(h.get("/metrics").await.body).unwrap();
    assert!(
        text.contains("tensor_wasm_dispatch_rejected_total 1"),
        "{text}"
    );
}
