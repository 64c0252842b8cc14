//! Criterion benches of the cost of export arguments on the invocation path.
//!
//! One deployed module with two exports, so both ids instantiate the same
//! module (one page of memory) and differ only in what is passed:
//!
//! - `call_export/noargs/call_export_with_args_empty`:
//!   `Runtime::invoke_export(id, "f", &[])`, `f: () -> i32`;
//! - `call_export/args/two_i32`: `Runtime::invoke_export(id, "add", &[1, 2])`,
//!   `add: (i32, i32) -> i32` — JSON arguments checked against the export's
//!   type and converted, result converted back.
//!
//! Each call is a whole invocation (lookup, store, instantiation from the
//! cached `InstancePre`, call, metrics); `args/two_i32 ÷ noargs` in one run is
//! the argument handling's share.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use tensor_wasm_runtime::{DeploySpec, RuntimeConfig};
use tensor_wasm_test_support::app::open_runtime;

const TWO_EXPORTS_WAT: &str = r#"(module
  (memory 1)
  (func (export "f") (result i32)
    i32.const 42)
  (func (export "add") (param i32 i32) (result i32)
    local.get 0
    local.get 1
    i32.add))
"#;

fn call_export(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temporary directory");
    let registry = prometheus::Registry::new();
    let runtime = open_runtime(RuntimeConfig::for_tests(dir.path()), &registry);
    let id = runtime
        .deploy(
            TWO_EXPORTS_WAT.as_bytes(),
            DeploySpec::export("two-exports"),
        )
        .expect("deploys")
        .record
        .id;
    let args = [json!(1), json!(2)];
    assert_eq!(
        runtime.invoke_export(&id, "f", &[]).expect("invokes"),
        vec![json!(42)]
    );
    assert_eq!(
        runtime.invoke_export(&id, "add", &args).expect("invokes"),
        vec![json!(3)]
    );

    let mut group = c.benchmark_group("call_export");
    group.bench_function("noargs/call_export_with_args_empty", |b| {
        b.iter(|| {
            runtime
                .invoke_export(black_box(&id), "f", black_box(&[]))
                .expect("invokes")
        })
    });
    group.bench_function("args/two_i32", |b| {
        b.iter(|| {
            runtime
                .invoke_export(black_box(&id), "add", black_box(&args))
                .expect("invokes")
        })
    });
    group.finish();
    drop(runtime);
    drop(dir);
}

criterion_group!(benches, call_export);
criterion_main!(benches);
