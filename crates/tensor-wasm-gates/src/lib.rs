//! CI gates over committed baselines, and the provenance every run file records.
//!
//! Two binaries decide pass or fail for CI:
//!
//! - `bench-gate` ([`gate`]): the Criterion medians of a run (`make ci-bench`) against
//!   `bench-results/baseline.json`; a regressed metric is re-run once with a Criterion filter
//!   that matches exactly its id ([`criterion_filter::exact_ids`]) and fails only when it
//!   regresses again.
//! - `icount-gate` ([`icount`]): the callgrind instruction counts of a gungraun run
//!   (`make icount`) against `bench-results/icount/baseline.json`, and re-recording that
//!   baseline (`make icount-baseline`).
//!
//! [`runinfo`] is what every run file says about its run (machine, UTC date, commit); the
//! icount baseline, the tail-latency bench of `tensor-wasm-bench` and the GPU suite write it.
//!
//! # Example
//!
//! ```
//! use std::collections::BTreeMap;
//! use tensor_wasm_gates::gate::{evaluate, Baseline};
//!
//! let baseline: Baseline = serde_json::from_str(
//!     r#"{"policy": {"regress_pct_threshold": 10},
//!         "metrics": {"dispatch/serial/1": {"median_ns": 100, "tolerance_pct": 5}}}"#,
//! )
//! .unwrap();
//! let run = BTreeMap::from([("dispatch/serial/1".to_owned(), 112.0)]);
//! // 112 ns is within 100 ns × (1 + (5 + 10) / 100).
//! assert!(evaluate(&baseline, &run).passed());
//! ```

pub mod criterion_filter;
pub mod gate;
pub mod icount;
pub mod runinfo;
