//! Noisy neighbour: one tenant saturating its concurrency quota does not
//! starve another. A test binary of its own, so no other test shares the CPU.
//!
//! What is asserted here cannot depend on the machine's speed: the noisy
//! tenant is held to its quota, and every call of the quiet tenant is served
//! meanwhile. How much the quiet tenant's tail latency moves under the noise
//! (p99 loaded vs unloaded) is a timing ratio, measured by the
//! `noisy_neighbour` bench of `tensor-wasm-bench`.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use serde_json::json;
use tensor_wasm_tenant::Resource;
use tensor_wasm_test_support::app::EnforcedApp;
use tensor_wasm_test_support::pace::load_tool_back_off;
use tensor_wasm_test_support::wait::wait_until_async;
use tower::ServiceExt;

/// Tenant A saturates its concurrency quota (2) with eight callers of a slow
/// function (each call holds its slot for 200 ms without burning CPU, so the
/// test is about quota isolation, not CPU contention on a 2-core machine).
/// Once A has been refused for being at its quota, tenant B's calls of a fast
/// function are all served, while A never holds more than its quota.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noisy_neighbour_does_not_starve_another_tenant() {
    let s = EnforcedApp::new();
    let (a_id, a) = s
        .tenant(
            "noisy",
            json!({"max_concurrent_invocations": 2, "requests_per_second": 0}),
        )
        .await;
    let (_, b) = s.tenant("quiet", json!({"requests_per_second": 0})).await;
    let nap = s
        .deploy_id(&a, "sleep.wat", "name=nap&timeout_ms=1000")
        .await;
    let calc = s.deploy_id(&b, "calc.wat", "name=calc").await;
    let noisy = s.tenants.lookup(&a_id).unwrap();

    let stop = Arc::new(AtomicBool::new(false));
    let refused = Arc::new(AtomicU32::new(0));
    let napped = Arc::new(AtomicU32::new(0));
    let mut noise = Vec::new();
    for _ in 0..8 {
        let (app, a, nap) = (s.app.clone(), a.clone(), nap.clone());
        let (stop, refused, napped) = (stop.clone(), refused.clone(), napped.clone());
        noise.push(tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                let req = Request::post(format!("/functions/{nap}/invoke"))
                    .header(header::AUTHORIZATION, format!("Bearer {a}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(r#"{"export":"nap","args":[200]}"#))
                    .unwrap();
                match app.clone().oneshot(req).await.unwrap().status() {
                    StatusCode::OK => {
                        napped.fetch_add(1, Ordering::Relaxed);
                    }
                    StatusCode::TOO_MANY_REQUESTS => {
                        refused.fetch_add(1, Ordering::Relaxed);
                        load_tool_back_off(Duration::from_millis(10)).await;
                    }
                    other => panic!("noisy invocation answered {other}"),
                }
            }
        }));
    }
    wait_until_async(
        Duration::from_secs(30),
        "the noisy tenant is refused for being at its quota",
        || refused.load(Ordering::Relaxed) > 0,
    )
    .await;

    for i in 0..200 {
        let r = s.invoke(&b, &calc, "add", json!([i, 1])).await;
        assert_eq!(
            (r.status, r.json()),
            (StatusCode::OK, json!({"results": [i + 1]})),
            "quiet call {i} while the noisy tenant is saturated: {}",
            r.text()
        );
        let held = noisy.usage(Resource::ConcurrentInvocations);
        assert!(held <= 2, "the noisy tenant holds {held} slots");
    }

    stop.store(true, Ordering::Relaxed);
    for n in noise {
        n.await.unwrap();
    }
    assert!(
        napped.load(Ordering::Relaxed) > 0,
        "the noisy tenant's calls never ran"
    );
}
