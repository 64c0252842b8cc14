//! Tail latency of four paths, 10 000 timed samples each (not Criterion's
//! pipeline: Criterion reports the centre of a distribution, this reports its
//! tail). Diagnostic, not gated.
//!
//! - `dispatch/serial/100`: 100 dispatches one after another (permit acquire,
//!   tracking future, poll, release), as one sample of the Criterion bench.
//! - `dispatch/concurrent_cap64/100`: 100 dispatches as tasks on a 4-worker
//!   tokio runtime through a cap-64 dispatcher, all awaited.
//! - `e2e/healthz/get`: GET /healthz through the full router (oneshot), body read.
//! - `e2e/invoke_not_found/post`: POST invoke of an unknown function → 404.
//!
//! The four are sampled interleaved, in rounds of 100 samples of each, so
//! that machine-load drift over the run hits all of them alike; 1 000 samples
//! of each are taken first as warm-up and discarded. Percentiles are
//! nearest-rank over the 10 000 samples (p50, p95, p99, p99.9, max).
//!
//! Prints one JSON document on stdout. With `TAIL_LATENCY_OUT=<file>` it also
//! writes it there with machine, date, commit (of the working directory), the
//! load averages before and after the run, and `TAIL_LATENCY_COMMAND` (`make tail-latency` writes
//! `bench-results/tail-latency.json`).
//!
//! Command line: Criterion's (under `cargo bench --bench '*' -- ...`). Its
//! options are ignored; a filter argument selects the paths whose id it
//! matches, as Criterion would select benches (the document then records the
//! filter). When it matches none, as in `bench-gate`'s confirmation re-run of
//! other ids, the binary exits before setting anything up.

use std::hint::black_box;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use serde_json::json;
use tensor_wasm_bench::bench_filter::BenchFilter;
use tensor_wasm_bench::INVOKE_ADD_BODY;
use tensor_wasm_dispatch::{DispatchConfig, KernelDispatcher};
use tensor_wasm_gates::runinfo;
use tensor_wasm_test_support::app::{send, InsecureApp};

const SAMPLES: usize = 10_000;
const WARM_UP: usize = 1_000;
const ROUND: usize = 100;
const DISPATCHES: u64 = 100;
const MISSING: &str = "fn-000000000000000000000000";

const SERIAL: &str = "dispatch/serial/100";
const CONCURRENT: &str = "dispatch/concurrent_cap64/100";
const HEALTHZ: &str = "e2e/healthz/get";
const NOT_FOUND: &str = "e2e/invoke_not_found/post";

/// One path under measurement: a name and one timed sample.
struct Path<'a> {
    id: &'static str,
    sample: Box<dyn FnMut() + 'a>,
    times: Vec<Duration>,
}

fn healthz() -> Request<Body> {
    Request::get("/healthz").body(Body::empty()).unwrap()
}

fn invoke_missing() -> Request<Body> {
    Request::post(format!("/functions/{MISSING}/invoke"))
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(INVOKE_ADD_BODY))
        .unwrap()
}

/// Nearest-rank percentile of sorted samples, in nanoseconds.
fn percentile(sorted: &[Duration], p: f64) -> u128 {
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1].as_nanos()
}

/// `/proc/loadavg`'s 1-, 5- and 15-minute load averages (tails depend on them).
fn load_average() -> Option<String> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    Some(
        text.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
    )
}

fn main() {
    let filter = BenchFilter::from_args(std::env::args().skip(1))
        .unwrap_or_else(|e| panic!("tail_latency: invalid filter: {e}"));
    if ![SERIAL, CONCURRENT, HEALTHZ, NOT_FOUND]
        .iter()
        .any(|id| filter.matches(id))
    {
        eprintln!("tail_latency: the filter matches no path; nothing to run");
        return;
    }
    let load_before = load_average();
    // The API server, as in benches/e2e_inference.rs.
    let server = InsecureApp::new();
    let app = &server.app;
    let current = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    assert_eq!(current.block_on(send(app, healthz())).0, StatusCode::OK);
    assert_eq!(
        current.block_on(send(app, invoke_missing())).0,
        StatusCode::NOT_FOUND
    );

    // The dispatchers, as in benches/kernel_dispatch.rs.
    let serial = KernelDispatcher::new(DispatchConfig::default());
    let workers = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .expect("tokio runtime");
    let concurrent = KernelDispatcher::new(DispatchConfig {
        max_in_flight: 64,
        max_queued: 1 << 20,
    });

    let mut paths = vec![
        Path {
            id: SERIAL,
            sample: Box::new(|| {
                for _ in 0..DISPATCHES {
                    let permit = serial.acquire_blocking().expect("uncontended");
                    serial.track(permit, std::future::ready(())).wait();
                }
            }),
            times: Vec::with_capacity(SAMPLES),
        },
        Path {
            id: CONCURRENT,
            sample: Box::new(|| {
                workers.block_on(async {
                    let tasks: Vec<_> = (0..DISPATCHES)
                        .map(|_| {
                            let d = concurrent.clone();
                            tokio::spawn(async move {
                                let permit = d.acquire().await.expect("queue is large enough");
                                d.track(permit, std::future::ready(())).await
                            })
                        })
                        .collect();
                    for task in tasks {
                        task.await.expect("task ran");
                    }
                })
            }),
            times: Vec::with_capacity(SAMPLES),
        },
        Path {
            id: HEALTHZ,
            sample: Box::new(|| {
                black_box(current.block_on(send(app, healthz())));
            }),
            times: Vec::with_capacity(SAMPLES),
        },
        Path {
            id: NOT_FOUND,
            sample: Box::new(|| {
                black_box(current.block_on(send(app, invoke_missing())));
            }),
            times: Vec::with_capacity(SAMPLES),
        },
    ];
    paths.retain(|path| filter.matches(path.id));

    for path in &mut paths {
        for _ in 0..WARM_UP {
            (path.sample)();
        }
    }
    let started = Instant::now();
    for _ in 0..SAMPLES / ROUND {
        for path in &mut paths {
            for _ in 0..ROUND {
                let t = Instant::now();
                (path.sample)();
                path.times.push(t.elapsed());
            }
        }
    }
    let wall_s = started.elapsed().as_secs_f64();

    let mut results = serde_json::Map::new();
    for path in &mut paths {
        path.times.sort_unstable();
        let t = &path.times;
        let mean = t.iter().map(Duration::as_nanos).sum::<u128>() / t.len() as u128;
        results.insert(
            path.id.to_owned(),
            json!({
                "samples": t.len(),
                "min_ns": t[0].as_nanos(),
                "p50_ns": percentile(t, 50.0),
                "p95_ns": percentile(t, 95.0),
                "p99_ns": percentile(t, 99.0),
                "p99_9_ns": percentile(t, 99.9),
                "max_ns": t[t.len() - 1].as_nanos(),
                "mean_ns": mean,
            }),
        );
    }
    let mut doc = json!({
        "kind": "tail-latency",
        "method": format!(
            "{SAMPLES} timed samples per path after {WARM_UP} warm-up samples, interleaved in rounds of {ROUND} per path; nearest-rank percentiles; one sample of a dispatch path is {DISPATCHES} dispatches, of an e2e path one request through the router (oneshot, current-thread tokio runtime)"
        ),
        "wall_s": (wall_s * 10.0).round() / 10.0,
        "results": results,
    });
    if let Some(text) = filter.text() {
        doc["filter"] = json!(text);
    }
    if let Ok(out) = std::env::var("TAIL_LATENCY_OUT") {
        let fields = doc.as_object_mut().expect("an object");
        fields.insert("date".into(), json!(runinfo::utc_now()));
        fields.insert("commit".into(), json!(runinfo::commit()));
        fields.insert("machine".into(), json!(runinfo::machine()));
        fields.insert(
            "load_average_before_after".into(),
            json!([load_before, load_average()]),
        );
        fields.insert(
            "command".into(),
            json!(std::env::var("TAIL_LATENCY_COMMAND").unwrap_or_else(|_| {
                "cargo bench -p tensor-wasm-bench --bench tail_latency".into()
            })),
        );
        let mut text = serde_json::to_string_pretty(&doc).expect("JSON");
        text.push('\n');
        std::fs::write(&out, text).unwrap_or_else(|e| panic!("writing {out}: {e}"));
        eprintln!("tail_latency: wrote {out}");
    }
    println!("{}", serde_json::to_string(&doc).expect("JSON"));
}
