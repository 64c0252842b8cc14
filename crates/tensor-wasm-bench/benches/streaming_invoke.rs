//! `/invoke-stream` next to the `/invoke` floor, through the full axum router (every layer)
//! with `tower::ServiceExt::oneshot`, the response body read in full.
//!
//! Ids: `invoke_stream/baseline_invoke` (`POST /functions/{id}/invoke` of the `add` export:
//! the floor), `invoke_stream/sse` and `invoke_stream/chunked` (`POST
//! /functions/{id}/invoke-stream` of examples/stream.wat's `ticks(1, 0)`: one chunk, then the
//! outcome, as Server-Sent Events and as a chunked octet stream).

use std::hint::black_box;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use criterion::{criterion_group, criterion_main, Criterion};
use tensor_wasm_bench::{ADD_WAT, INVOKE_ADD_BODY};
use tensor_wasm_test_support::app::{send, InsecureApp};
use tensor_wasm_test_support::guests::examples_dir;

fn deploy(rt: &tokio::runtime::Runtime, app: &Router, name: &str, wasm: Vec<u8>) -> String {
    let request = Request::post(format!("/functions?name={name}&style=export"))
        .header(header::CONTENT_TYPE, "application/wasm")
        .body(Body::from(wasm))
        .unwrap();
    let (status, body) = rt.block_on(send(app, request));
    assert_eq!(status, StatusCode::CREATED, "{body:?}");
    let info: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
    info["id"].as_str().expect("id").to_owned()
}

fn invoke(id: &str) -> Request<Body> {
    Request::post(format!("/functions/{id}/invoke"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(INVOKE_ADD_BODY))
        .unwrap()
}

/// `ticks(1, 0)` as a stream, SSE when `accept` is `text/event-stream`.
fn stream(id: &str, accept: &str) -> Request<Body> {
    Request::post(format!(
        "/functions/{id}/invoke-stream?export=ticks&args=%5B1%2C0%5D"
    ))
    .header(header::ACCEPT, accept)
    .body(Body::empty())
    .unwrap()
}

fn invoke_stream(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let server = InsecureApp::new();
    let app = &server.app;
    let add = deploy(&rt, app, "add", ADD_WAT.as_bytes().to_vec());
    let streamer = deploy(
        &rt,
        app,
        "stream",
        std::fs::read(examples_dir().join("stream.wat")).expect("examples/stream.wat"),
    );

    // Check every request once before timing it.
    let (status, body) = rt.block_on(send(app, invoke(&add)));
    assert_eq!(status, StatusCode::OK, "{body:?}");
    let (status, body) = rt.block_on(send(app, stream(&streamer, "*/*")));
    assert_eq!(status, StatusCode::OK, "{body:?}");
    assert_eq!(&body[..], b"tick\n");
    let (status, body) = rt.block_on(send(app, stream(&streamer, "text/event-stream")));
    assert_eq!(status, StatusCode::OK, "{body:?}");
    // One chunk ("tick\n", base64 in the event) and the outcome.
    let events = String::from_utf8_lossy(&body);
    assert!(
        events.contains("data: dGljawo=") && events.contains(r#"{"results":[1]}"#),
        "{events}"
    );

    let mut group = c.benchmark_group("invoke_stream");
    group.bench_function("baseline_invoke", |b| {
        b.iter(|| black_box(rt.block_on(send(app, invoke(&add)))))
    });
    group.bench_function("sse", |b| {
        b.iter(|| black_box(rt.block_on(send(app, stream(&streamer, "text/event-stream")))))
    });
    group.bench_function("chunked", |b| {
        b.iter(|| black_box(rt.block_on(send(app, stream(&streamer, "*/*")))))
    });
    group.finish();
}

criterion_group!(benches, invoke_stream);
criterion_main!(benches);
