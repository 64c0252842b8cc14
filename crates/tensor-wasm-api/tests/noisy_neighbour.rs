//! Noisy neighbour: one tenant saturating its concurrency quota does not
//! starve another. A test binary of its own, so no other test shares the CPU.

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use common::{server, Server};
use serde_json::json;
use tower::ServiceExt;

/// Tenant A saturates its concurrency quota with slow functions (each holds
/// its slot for 200 ms without burning CPU, so the test measures quota
/// isolation, not CPU contention on a 2-core machine); tenant B's p99 for a
/// fast function stays within 2x of its unloaded p99 (+ 1 ms for timer
/// granularity).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn noisy_neighbour_does_not_starve_another_tenant() {
    let s = server();
    let (_, a) = s
        .tenant(
            "noisy",
            json!({"max_concurrent_invocations": 2, "requests_per_second": 0}),
        )
        .await;
    let (_, b) = s.tenant("quiet", json!({"requests_per_second": 0})).await;
    let nap = s
        .deploy(&a, "sleep.wat", "name=nap&timeout_ms=1000")
        .await
        .json()["id"]
        .as_str()
        .unwrap()
        .to_owned();
    let calc = s.deploy(&b, "calc.wat", "name=calc").await.json()["id"]
        .as_str()
        .unwrap()
        .to_owned();

    async fn p99(s: &Server, token: &str, id: &str) -> Duration {
        let mut samples = Vec::new();
        for _ in 0..1000 {
            let start = Instant::now();
            let r = s.invoke(token, id, "add", json!([1, 2])).await;
            assert_eq!(r.status, StatusCode::OK);
            samples.push(start.elapsed());
        }
        samples.sort();
        samples[samples.len() * 99 / 100]
    }
    let unloaded = p99(&s, &b, &calc).await;

    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut noise = Vec::new();
    for _ in 0..8 {
        let (app, a, nap, stop) = (s.app.clone(), a.clone(), nap.clone(), stop.clone());
        noise.push(tokio::spawn(async move {
            let (mut refused, mut napped) = (0u32, 0u32);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let req = Request::post(format!("/functions/{nap}/invoke"))
                    .header(header::AUTHORIZATION, format!("Bearer {a}"))
                    .header(header::CONTENT_TYPE, "application/json")
                    .body(Body::from(r#"{"export":"nap","args":[200]}"#))
                    .unwrap();
                let status = app.clone().oneshot(req).await.unwrap().status();
                match status {
                    StatusCode::OK => napped += 1,
                    StatusCode::TOO_MANY_REQUESTS => {
                        refused += 1;
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                    other => panic!("noisy invocation answered {other}"),
                }
            }
            (refused, napped)
        }));
    }
    tokio::time::sleep(Duration::from_millis(100)).await;
    let loaded = p99(&s, &b, &calc).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (mut refused, mut napped) = (0, 0);
    for n in noise {
        let (r, n) = n.await.unwrap();
        (refused, napped) = (refused + r, napped + n);
    }
    assert!(refused > 0, "the noisy tenant was never held to its quota");
    assert!(napped > 0, "the noisy tenant's calls never ran");
    assert!(
        loaded <= unloaded * 2 + Duration::from_millis(1),
        "quiet tenant p99 {loaded:?} loaded vs {unloaded:?} unloaded"
    );
}
