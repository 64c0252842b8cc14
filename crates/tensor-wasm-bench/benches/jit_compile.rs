//! Criterion benches of the JIT's host-side cost per kernel: emitting PTX text for a blueprint
//! and fingerprinting it (what a kernel cache pays on a miss and on every lookup).
//!
//! - `jit_compile/emit_text/<descriptor>`: `Blueprint::emit_ptx` for sm_90 / PTX ISA 9.0.
//! - `jit_compile/fingerprint/matmul_16x16x16`: `Blueprint::fingerprint` for the same target.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use tensor_wasm_jit::{Blueprint, PtxTarget};

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

criterion_group!(benches, emit_text, fingerprint);
criterion_main!(benches);
