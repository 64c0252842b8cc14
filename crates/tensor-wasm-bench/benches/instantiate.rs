//! Criterion benches of one invocation of a trivial module: TensorWasm's
//! per-invocation path against raw wasmtime, same module, same process.
//!
//! Group `instantiate`:
//! - `instance_pre`: `Runtime::invoke_export(id, "f", &[])` of a deployed
//!   function: lookup, store with limits and epoch deadline, instantiation
//!   from the cached `InstancePre`, the call, metrics, JSON results.
//! - `raw_wasmtime`: a plain pooling engine (no epochs, no fuel), an
//!   `InstancePre` from an empty `Linker`, then `Store::new` +
//!   `InstancePre::instantiate` + a typed call of `f` per iteration.
//! - `raw_wasmtime_same_engine`: the raw path on the runtime's own engine
//!   (its epoch interruption and pool), which splits the gap between engine
//!   configuration and runtime bookkeeping.
//!
//! The tracked figure is `instance_pre / raw_wasmtime`. Criterion measures the
//! ids one after another, so after the Criterion run (only under `cargo
//! bench`, filtered or not) the two are also timed interleaved, A B A B, and the ratio of
//! each round's pair is printed as one `instantiate/interleaved_ratio` line.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::{criterion_group, Criterion};
use tensor_wasm_bench::{raw_pooling_engine, TRIVIAL_WAT};
use tensor_wasm_runtime::{DeploySpec, Runtime, RuntimeConfig};
use tensor_wasm_test_support::app::open_runtime;
use wasmtime::{Engine, InstancePre, Linker, Module, Store};

/// Slots and memory cap of both sides (those of `RuntimeConfig::for_tests`).
const SLOTS: u32 = 64;

struct Ours {
    runtime: Runtime,
    id: String,
    _dir: tempfile::TempDir,
}

fn ours() -> Ours {
    let dir = tempfile::tempdir().expect("temporary directory");
    let registry = prometheus::Registry::new();
    let mut config = RuntimeConfig::for_tests(dir.path());
    config.max_instances = SLOTS;
    let runtime = open_runtime(config, &registry);
    let id = runtime
        .deploy(TRIVIAL_WAT.as_bytes(), DeploySpec::export("trivial"))
        .expect("deploys")
        .record
        .id;
    let out = runtime.invoke_export(&id, "f", &[]).expect("invokes");
    assert_eq!(out, vec![serde_json::json!(42)]);
    Ours {
        runtime,
        id,
        _dir: dir,
    }
}

struct Raw {
    engine: Engine,
    pre: InstancePre<()>,
    /// Epoch deadline to set per store, for engines with epoch interruption.
    epoch_deadline: Option<u64>,
}

impl Raw {
    fn new(engine: Engine, epoch_deadline: Option<u64>) -> Raw {
        let module = Module::new(&engine, TRIVIAL_WAT).expect("compiles");
        let pre = Linker::new(&engine)
            .instantiate_pre(&module)
            .expect("links");
        let raw = Raw {
            engine,
            pre,
            epoch_deadline,
        };
        assert_eq!(raw.call(), 42);
        raw
    }

    /// `Store::new` + `InstancePre::instantiate` + one typed call.
    fn call(&self) -> i32 {
        let mut store = Store::new(&self.engine, ());
        if let Some(ticks) = self.epoch_deadline {
            store.set_epoch_deadline(ticks);
        }
        let instance = self.pre.instantiate(&mut store).expect("instantiates");
        let f = instance
            .get_typed_func::<(), i32>(&mut store, "f")
            .expect("export f");
        f.call(&mut store, ()).expect("runs")
    }
}

fn raw() -> Raw {
    let max_memory = RuntimeConfig::for_tests(std::path::Path::new(".")).max_memory_limit_bytes;
    let engine = raw_pooling_engine(SLOTS, max_memory as usize).expect("engine");
    Raw::new(engine, None)
}

fn instantiate(c: &mut Criterion) {
    let ours = ours();
    let raw = raw();
    let same_engine = Raw::new(ours.runtime.engine().clone(), Some(1_000_000));

    let mut group = c.benchmark_group("instantiate");
    group.bench_function("instance_pre", |b| {
        b.iter(|| {
            ours.runtime
                .invoke_export(black_box(&ours.id), "f", &[])
                .expect("invokes")
        })
    });
    group.bench_function("raw_wasmtime", |b| b.iter(|| black_box(raw.call())));
    group.bench_function("raw_wasmtime_same_engine", |b| {
        b.iter(|| black_box(same_engine.call()))
    });
    group.finish();
}

/// Time of `n` runs of `f`.
fn timed(n: u32, mut f: impl FnMut()) -> Duration {
    let start = Instant::now();
    for _ in 0..n {
        f();
    }
    start.elapsed()
}

/// `instance_pre` and `raw_wasmtime` in alternating batches; prints the
/// median, min and max over rounds of (ours / raw) per round.
fn interleaved_ratio() {
    const ROUNDS: usize = 21;
    const BATCH: u32 = 2_000;
    let ours = ours();
    let raw = raw();
    let mut call_ours = || {
        black_box(
            ours.runtime
                .invoke_export(black_box(&ours.id), "f", &[])
                .expect("invokes"),
        );
    };
    let mut call_raw = || {
        black_box(raw.call());
    };
    // Warm both paths (pool slots, caches).
    timed(BATCH, &mut call_ours);
    timed(BATCH, &mut call_raw);
    let mut ratios = Vec::with_capacity(ROUNDS);
    let mut ours_ns = Vec::with_capacity(ROUNDS);
    let mut raw_ns = Vec::with_capacity(ROUNDS);
    for round in 0..ROUNDS {
        // Alternate which side goes first so drift does not favour one.
        let (a, b) = if round % 2 == 0 {
            let a = timed(BATCH, &mut call_ours);
            (a, timed(BATCH, &mut call_raw))
        } else {
            let b = timed(BATCH, &mut call_raw);
            (timed(BATCH, &mut call_ours), b)
        };
        let a = a.as_nanos() as f64 / f64::from(BATCH);
        let b = b.as_nanos() as f64 / f64::from(BATCH);
        ours_ns.push(a);
        raw_ns.push(b);
        ratios.push(a / b);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (min, max) = ratios
        .iter()
        .fold((f64::MAX, f64::MIN), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    println!(
        "instantiate/interleaved_ratio instance_pre/raw_wasmtime: median {:.3} (min {:.3}, \
         max {:.3}); median ns/iter instance_pre {:.0}, raw_wasmtime {:.0}; {ROUNDS} rounds x \
         {BATCH} calls each side",
        median(&mut ratios),
        min,
        max,
        median(&mut ours_ns),
        median(&mut raw_ns),
    );
}

criterion_group!(benches, instantiate);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    // Only a real bench run (`cargo bench` passes `--bench`; `cargo test`
    // does not) spends its second or so on the interleaved comparison.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--bench") && !args.iter().any(|a| a == "--list") {
        interleaved_ratio();
    }
}
