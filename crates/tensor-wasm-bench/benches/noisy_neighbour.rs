//! Noisy neighbour, measured: the quiet tenant's p99 latency for a fast call
//! with and without another tenant saturating its concurrency quota. The
//! timing half of `tensor-wasm-api/tests/noisy_neighbour.rs` (which asserts
//! only what cannot depend on the machine's speed). Diagnostic, not gated.
//!
//! Setup as in that test: authentication enforced, tenant A limited to 2
//! concurrent invocations and calling a function that holds its slot 200 ms
//! without burning CPU (eight callers, backing off 10 ms after a 429), tenant
//! B calling `calc.add`. 1 000 timed calls of B unloaded, then 1 000 loaded;
//! nearest-rank p99 of each. The goal: loaded p99 within 2x the unloaded p99
//! plus 1 ms of timer granularity.
//!
//! Id `noisy_neighbour/quiet_p99`. Prints one JSON document on stdout. The
//! command line is Criterion's (under `cargo bench --bench '*' -- ...`): its
//! options are ignored, and a filter that does not match the id exits
//! before setting anything up.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use serde_json::json;
use tensor_wasm_bench::bench_filter::BenchFilter;
use tensor_wasm_tenant::Resource;
use tensor_wasm_test_support::app::{send, EnforcedApp};
use tensor_wasm_test_support::pace::load_tool_back_off;
use tensor_wasm_test_support::wait::wait_until_async;

const ID: &str = "noisy_neighbour/quiet_p99";
const SAMPLES: usize = 1_000;

async fn quiet_p99(s: &EnforcedApp, token: &str, id: &str) -> Duration {
    let mut samples = Vec::with_capacity(SAMPLES);
    for _ in 0..SAMPLES {
        let start = Instant::now();
        let r = s.invoke(token, id, "add", json!([1, 2])).await;
        samples.push(start.elapsed());
        assert_eq!(r.status, StatusCode::OK, "{}", r.text());
    }
    samples.sort_unstable();
    samples[(SAMPLES * 99).div_ceil(100) - 1]
}

fn main() {
    let filter = BenchFilter::from_args(std::env::args().skip(1))
        .unwrap_or_else(|e| panic!("noisy_neighbour: invalid filter: {e}"));
    if !filter.matches(ID) {
        eprintln!("noisy_neighbour: the filter matches no path; nothing to run");
        return;
    }
    let workers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let doc = workers.block_on(async {
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

        let unloaded = quiet_p99(&s, &b, &calc).await;

        let stop = Arc::new(AtomicBool::new(false));
        let mut noise = Vec::new();
        for _ in 0..8 {
            let (app, a, nap, stop) = (s.app.clone(), a.clone(), nap.clone(), stop.clone());
            noise.push(tokio::spawn(async move {
                while !stop.load(Ordering::Relaxed) {
                    let req = Request::post(format!("/functions/{nap}/invoke"))
                        .header(header::AUTHORIZATION, format!("Bearer {a}"))
                        .header(header::CONTENT_TYPE, "application/json")
                        .body(Body::from(r#"{"export":"nap","args":[200]}"#))
                        .expect("request");
                    if send(&app, req).await.0 == StatusCode::TOO_MANY_REQUESTS {
                        load_tool_back_off(Duration::from_millis(10)).await;
                    }
                }
            }));
        }
        let noisy = s.tenants.lookup(&a_id).expect("the noisy tenant");
        wait_until_async(
            Duration::from_secs(30),
            "the noisy tenant is at its quota",
            || noisy.usage(Resource::ConcurrentInvocations) == 2,
        )
        .await;
        let loaded = quiet_p99(&s, &b, &calc).await;
        stop.store(true, Ordering::Relaxed);
        for n in noise {
            n.await.expect("noise task");
        }
        let goal = unloaded * 2 + Duration::from_millis(1);
        json!({
            "kind": "noisy-neighbour",
            "id": ID,
            "samples": SAMPLES,
            "unloaded_p99_ns": unloaded.as_nanos(),
            "loaded_p99_ns": loaded.as_nanos(),
            "ratio": loaded.as_secs_f64() / unloaded.as_secs_f64(),
            "goal": "loaded p99 <= 2 x unloaded p99 + 1 ms",
            "within_goal": loaded <= goal,
        })
    });
    println!("{}", serde_json::to_string(&doc).expect("JSON"));
}
