//! Criterion benches of host-side copies into guest memory: a
//! `GuardedHostBuffer` (the host backing of unified guest memory) next to a
//! plain `Vec` (memcpy) peer in the same run, so the ratio is visible.
//!
//! - `memory_bandwidth/sequential/<bytes>` vs `memory_bandwidth/sequential_vec_peer/<bytes>`:
//!   one `copy_from_slice` of `bytes`.
//! - `memory_bandwidth/strided/<bytes>` vs `memory_bandwidth/strided_vec_peer/<bytes>`:
//!   64-byte copies at a 4096-byte stride across `bytes` (one per page).
//!
//! Source data is random bytes (an xorshift stream), not a constant fill.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensor_wasm_mem::GuardedHostBuffer;

const SEQUENTIAL: [usize; 4] = [4096, 65536, 1 << 20, 16 << 20];
const STRIDED: [usize; 3] = [65536, 1 << 20, 16 << 20];
const STRIDE: usize = 4096;
const CHUNK: usize = 64;

fn random_bytes(len: usize) -> Vec<u8> {
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    (0..len)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect()
}

fn strided_copy(dst: &mut [u8], src: &[u8]) {
    for offset in (0..dst.len()).step_by(STRIDE) {
        dst[offset..offset + CHUNK].copy_from_slice(&src[offset..offset + CHUNK]);
    }
}

fn sequential(c: &mut Criterion) {
    let mut group = c.benchmark_group("memory_bandwidth");
    for bytes in SEQUENTIAL {
        let src = random_bytes(bytes);
        let mut guarded = GuardedHostBuffer::new(bytes, 4096).expect("mmap");
        let mut plain = vec![0u8; bytes];
        group.throughput(Throughput::Bytes(bytes as u64));
        group.bench_with_input(BenchmarkId::new("sequential", bytes), &bytes, |b, _| {
            b.iter(|| {
                guarded.as_mut_slice()[..bytes].copy_from_slice(black_box(&src));
                black_box(guarded.as_slice()[bytes - 1]);
            })
        });
        group.bench_with_input(
            BenchmarkId::new("sequential_vec_peer", bytes),
            &bytes,
            |b, _| {
                b.iter(|| {
                    plain.copy_from_slice(black_box(&src));
                    black_box(plain[bytes - 1]);
                })
            },
        );
    }
    for bytes in STRIDED {
        let src = random_bytes(bytes);
        let mut guarded = GuardedHostBuffer::new(bytes, 4096).expect("mmap");
        let mut plain = vec![0u8; bytes];
        group.throughput(Throughput::Bytes((bytes / STRIDE * CHUNK) as u64));
        group.bench_with_input(BenchmarkId::new("strided", bytes), &bytes, |b, _| {
            b.iter(|| {
                strided_copy(&mut guarded.as_mut_slice()[..bytes], black_box(&src));
                black_box(guarded.as_slice()[0]);
            })
        });
        group.bench_with_input(
            BenchmarkId::new("strided_vec_peer", bytes),
            &bytes,
            |b, _| {
                b.iter(|| {
                    strided_copy(&mut plain, black_box(&src));
                    black_box(plain[0]);
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, sequential);

criterion_main!(benches);
