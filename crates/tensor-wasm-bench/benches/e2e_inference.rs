//! End-to-end Criterion benches of the HTTP API: requests go through the full
//! axum router (every layer: request ids, tracing, metrics, body limit) with
//! `tower::ServiceExt::oneshot`, and the response body is read in full.
//!
//! Ids: `e2e/healthz/get`, `e2e/create_function/post` (a cold deploy: fresh
//! state and data directory per iteration, built outside the timing),
//! `e2e/invoke_not_found/post` and `e2e/invoke/export_call`.

use std::hint::black_box;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tensor_wasm_bench::{ADD_WAT, INVOKE_ADD_BODY};
use tensor_wasm_test_support::app::{send, InsecureApp};

/// A ready router over a runtime in its own temporary data directory.
fn new_server() -> InsecureApp {
    InsecureApp::new()
}

fn tokio_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn healthz() -> Request<Body> {
    Request::get("/healthz").body(Body::empty()).unwrap()
}

fn create_add() -> Request<Body> {
    Request::post("/functions?name=add&style=export")
        .header(header::CONTENT_TYPE, "application/wasm")
        .body(Body::from(ADD_WAT))
        .unwrap()
}

fn invoke(id: &str) -> Request<Body> {
    Request::post(format!("/functions/{id}/invoke"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(INVOKE_ADD_BODY))
        .unwrap()
}

/// Deploys the `add` module and returns its id.
fn deploy_add(rt: &tokio::runtime::Runtime, app: &Router) -> String {
    let (status, body) = rt.block_on(send(app, create_add()));
    assert_eq!(status, StatusCode::CREATED, "{body:?}");
    let info: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    info["id"].as_str().expect("id").to_owned()
}

fn e2e(c: &mut Criterion) {
    let rt = tokio_runtime();
    let server = new_server();
    let app = &server.app;

    // Check every request once before timing it.
    assert_eq!(rt.block_on(send(app, healthz())).0, StatusCode::OK);
    let missing = "fn-000000000000000000000000";
    assert_eq!(
        rt.block_on(send(app, invoke(missing))).0,
        StatusCode::NOT_FOUND
    );
    let id = deploy_add(&rt, app);
    let (status, body) = rt.block_on(send(app, invoke(&id)));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({"results": [3]})
    );

    let mut group = c.benchmark_group("e2e");
    group.bench_function("healthz/get", |b| {
        b.iter(|| black_box(rt.block_on(send(app, healthz()))))
    });

    // A cold deploy compiles the module and writes the module, the record and
    // the compiled artifact; a fresh state and data directory per iteration
    // keep every caching layer cold. Building the state (engine, pooling
    // allocator, epoch thread) and dropping it stay outside the timing.
    group.sample_size(20);
    group.bench_function("create_function/post", |b| {
        b.iter_batched(
            || (new_server(), create_add()),
            |(fresh, request)| {
                let (status, body) = rt.block_on(send(&fresh.app, request));
                debug_assert_eq!(status, StatusCode::CREATED);
                (fresh, body)
            },
            BatchSize::PerIteration,
        )
    });
    group.sample_size(100);

    group.bench_function("invoke_not_found/post", |b| {
        b.iter(|| black_box(rt.block_on(send(app, invoke(missing)))))
    });
    group.bench_function("invoke/export_call", |b| {
        b.iter(|| black_box(rt.block_on(send(app, invoke(&id)))))
    });
    group.finish();
}

criterion_group!(benches, e2e);
criterion_main!(benches);
