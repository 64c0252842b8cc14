//! Cold-start benchmarks of the formats: portable capture, eager portable restore, lazy local
//! mapping (open + `map_into` + first-page touch) and a disk round trip, each beside a
//! `memcpy` peer of the same realistic image (`realistic_image`, seed 1: zero pages, ASCII
//! text, random f32s). Restores into a running instance, to its first call
//! (`cold_start/restore_lazy`, `cold_start/restore_eager`, `cold_start/instantiate_plain`),
//! are measured through the runtime in `tensor-wasm-bench`'s `snapshot_restore` bench.
//!
//! Ids: `cold_start/{capture,restore,map_lazy,memcpy}/{bytes}` for 1 MiB, 16 MiB,
//! 128 MiB and 512 MiB, and `cold_start/disk_round_trip/{bytes}` for 1 MiB and 16 MiB. The
//! benchmarks of one size run back to back so that peers share machine conditions.

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensor_wasm_snapshot::{
    capture_portable, realistic_image, restore_portable, write_local, AnonymousPages,
    CaptureOptions, LocalImage, RestoreLimits, SnapshotMeta,
};

const SIZES: [usize; 4] = [1 << 20, 16 << 20, 128 << 20, 512 << 20];
const MODULE: [u8; 32] = [0x11; 32];

fn cold_start(c: &mut Criterion) {
    let dir = tempfile::tempdir().expect("temp dir");
    let limits = RestoreLimits::default();
    let options = CaptureOptions::default();
    let mut group = c.benchmark_group("cold_start");
    for size in SIZES {
        if size >= 128 << 20 {
            group.sample_size(10);
            group.measurement_time(Duration::from_secs(3));
        } else {
            group.sample_size(30);
        }
        group.throughput(Throughput::Bytes(size as u64));
        let memory = realistic_image(size, 1);
        let meta = SnapshotMeta::new(MODULE, "bench", "bench", size as u64);
        let snapshot = capture_portable(&meta, &memory, &options).expect("capture");
        let local_path = dir.path().join(format!("{size}.twl"));
        write_local(&meta, &memory, &local_path).expect("write local");

        group.bench_with_input(BenchmarkId::new("capture", size), &memory, |b, memory| {
            b.iter(|| capture_portable(&meta, black_box(memory), &options).expect("capture"));
        });
        group.bench_with_input(BenchmarkId::new("restore", size), &snapshot, |b, snap| {
            b.iter_with_large_drop(|| {
                restore_portable(black_box(snap), &limits, &MODULE).expect("restore")
            });
        });
        group.bench_with_input(
            BenchmarkId::new("map_lazy", size),
            &local_path,
            |b, path| {
                // Drop (munmap) is excluded: the figure is the time until the guest could run.
                b.iter_with_large_drop(|| {
                    let image = LocalImage::open(path, &limits, &MODULE).expect("open");
                    let mut dest = AnonymousPages::new(image.memory_size()).expect("mmap");
                    image.map_into(dest.as_mut_slice()).expect("map");
                    black_box(dest.as_slice()[0]);
                    dest
                });
            },
        );
        let mut copy = vec![1u8; size];
        group.bench_with_input(BenchmarkId::new("memcpy", size), &memory, |b, memory| {
            b.iter(|| copy.copy_from_slice(black_box(memory)));
        });
        black_box(&copy);
        if size <= 16 << 20 {
            let file = dir.path().join(format!("{size}.tws"));
            group.bench_with_input(
                BenchmarkId::new("disk_round_trip", size),
                &memory,
                |b, memory| {
                    b.iter_with_large_drop(|| {
                        let snap = capture_portable(&meta, memory, &options).expect("capture");
                        std::fs::write(&file, &snap).expect("write");
                        let read = std::fs::read(&file).expect("read");
                        restore_portable(&read, &limits, &MODULE).expect("restore")
                    });
                },
            );
        }
        let ratio = snapshot.len() as f64 / size as f64;
        eprintln!(
            "cold_start: {size} bytes -> portable {} bytes ({ratio:.3})",
            snapshot.len()
        );
    }
    group.finish();
}

criterion_group!(benches, cold_start);
criterion_main!(benches);
