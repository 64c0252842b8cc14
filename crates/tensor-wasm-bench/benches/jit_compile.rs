//! Criterion benches of the JIT's host-side cost per kernel: emitting PTX text for a blueprint
//! and fingerprinting it (what a kernel cache pays on a miss and on every lookup).
//!
//! - `jit_compile/emit_text/<descriptor>`: `Blueprint::emit_ptx` for sm_90 / PTX ISA 9.0.
//! - `jit_compile/fingerprint/matmul_16x16x16`: `Blueprint::fingerprint` for the same target.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use tensor_wasm_jit::{
    Blueprint, CacheKey, CompiledKernel, Fingerprint, KernelCache, KernelCacheConfig,
    KernelCacheMetrics, PtxTarget,
};

const EMITTED: [&str; 4] = [
    "vector_add[4]",
    "vector_add[16]",
    "matmul[16x16x16]",
    "conv2d[3x3]",
];

fn target() -> PtxTarget {
    PtxTarget::for_device((9, 0), 13000).expect("sm_90 under CUDA 13.0 is supported")
}

fn emit_text(c: &mut Criterion) {
    let target = target();
    let mut group = c.benchmark_group("jit_compile/emit_text");
    for descriptor in EMITTED {
        let blueprint = Blueprint::parse(descriptor).expect("valid descriptor");
        group.bench_function(descriptor, |b| {
            b.iter(|| black_box(&blueprint).emit_ptx(black_box(&target)))
        });
    }
    group.finish();
}

fn fingerprint(c: &mut Criterion) {
    let target = target();
    let blueprint = Blueprint::parse("matmul[16x16x16]").expect("valid descriptor");
    let mut group = c.benchmark_group("jit_compile/fingerprint");
    group.bench_function("matmul_16x16x16", |b| {
        b.iter(|| black_box(&blueprint).fingerprint(black_box(&target)))
    });
    group.finish();
}

fn memory_cache() -> KernelCache {
    KernelCache::new(
        KernelCacheConfig::default(),
        KernelCacheMetrics::unregistered().expect("metrics"),
    )
    .expect("in-memory cache")
}

/// `cold_miss_then_insert`: emit + insert + get on an empty cache (the cache
/// is built outside the timing by `iter_batched_ref`); `warm_hit`: `get` of a
/// present entry only.
fn cache(c: &mut Criterion) {
    let blueprint = Blueprint::parse("matmul[16x16x16]").expect("valid descriptor");
    let target = target();
    let key = CacheKey {
        fingerprint: Fingerprint::of(&blueprint, &target).0,
        arch: target.sm,
        driver_version: 13000,
    };
    let emit = || CompiledKernel {
        ptx: blueprint.emit_ptx(&target).into(),
        entry: blueprint.entry_name().into(),
        cubin: None,
    };
    let mut group = c.benchmark_group("jit_compile/cache");
    group.bench_function("cold_miss_then_insert", |b| {
        b.iter_batched_ref(
            memory_cache,
            |cache| {
                let got = cache.get_or_compile(&key, || Ok(emit())).expect("emits");
                black_box(cache.get(&key));
                got
            },
            BatchSize::SmallInput,
        )
    });
    let warm = memory_cache();
    warm.get_or_compile(&key, || Ok(emit())).expect("emits");
    group.bench_function("warm_hit", |b| {
        b.iter(|| black_box(warm.get(black_box(&key))))
    });
    group.finish();
}

criterion_group!(benches, emit_text, fingerprint, cache);
criterion_main!(benches);
