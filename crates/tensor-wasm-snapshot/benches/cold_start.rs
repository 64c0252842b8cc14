//! Cold-start benchmarks of the formats: portable capture, eager portable restore, lazy local
//! mapping (open + `map_into` + first-page touch) and a disk round trip, each beside a
//! `memcpy` peer of the same realistic image (`realistic_image`, seed 1: zero pages, ASCII
//! text, random f32s). Restores into a running instance, to its first call
//! (`cold_start/restore_lazy`, `cold_start/restore_eager`, `cold_start/instantiate_plain`),
//! are measured through the runtime in `tensor-wasm-bench`'s `snapshot_restore` bench.
//!
//! `cold_start/capture_reused` is capture as the runtime does it: one [`PortableEncoder`] kept
//! between captures, its pieces copied into a kept buffer.
//!
//! Ids: `cold_start/{capture,capture_reused,restore,map_lazy,memcpy}/{bytes}` for 1 MiB, 16 MiB,
//! 128 MiB and 512 MiB, and `cold_start/disk_round_trip/{bytes}` for 1 MiB and 16 MiB. The
//! benchmarks of one size run back to back so that peers share machine conditions.

use std::cell::OnceCell;
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensor_wasm_snapshot::{
    capture_portable, realistic_image, restore_portable, write_local, AnonymousPages,
    CaptureOptions, LocalImage, PortableEncoder, RestoreLimits, SnapshotMeta,
};

const SIZES: [usize; 4] = [1 << 20, 16 << 20, 128 << 20, 512 << 20];
const MODULE: [u8; 32] = [0x11; 32];

/// The inputs of one size: the image, its metadata, its portable snapshot and its local image.
struct Prepared {
    memory: Vec<u8>,
    meta: SnapshotMeta,
    snapshot: Vec<u8>,
    local_path: PathBuf,
}

impl Prepared {
    fn new(size: usize, dir: &Path, options: &CaptureOptions) -> Self {
        let memory = realistic_image(size, 1);
        let meta = SnapshotMeta::new(MODULE, "bench", "bench", size as u64);
        let snapshot = capture_portable(&meta, &memory, options).expect("capture");
        let local_path = dir.join(format!("{size}.twl"));
        write_local(&meta, &memory, &local_path).expect("write local");
        let ratio = snapshot.len() as f64 / size as f64;
        eprintln!(
            "cold_start: {size} bytes -> portable {} bytes ({ratio:.3})",
            snapshot.len()
        );
        Self {
            memory,
            meta,
            snapshot,
            local_path,
        }
    }
}

/// Each size's inputs (an image of up to 512 MiB, its snapshot and local image) and copy
/// buffer are made when the first id that needs them runs, outside its timing: a filtered run
/// (`bench-gate`'s confirmation re-run) that matches none of a size's ids skips that size's
/// setup.
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
        let prepared = OnceCell::new();
        let setup = || prepared.get_or_init(|| Prepared::new(size, dir.path(), &options));

        group.bench_function(BenchmarkId::new("capture", size), |b| {
            let p = setup();
            b.iter(|| capture_portable(&p.meta, black_box(&p.memory), &options).expect("capture"));
        });
        // The runtime's way: one encoder kept between captures. The snapshot is copied into a
        // kept buffer too, so that the output ends in one contiguous buffer as `capture`'s does.
        let mut encoder = PortableEncoder::new();
        let mut out = Vec::new();
        group.bench_function(BenchmarkId::new("capture_reused", size), |b| {
            let p = setup();
            b.iter(|| {
                let encoded = encoder
                    .encode(&p.meta, black_box(&p.memory), &options)
                    .expect("capture");
                out.clear();
                encoded.write_to(&mut out).expect("write");
                black_box(out.len())
            });
        });
        drop((encoder, out));
        group.bench_function(BenchmarkId::new("restore", size), |b| {
            let p = setup();
            b.iter_with_large_drop(|| {
                restore_portable(black_box(&p.snapshot), &limits, &MODULE).expect("restore")
            });
        });
        group.bench_function(BenchmarkId::new("map_lazy", size), |b| {
            let p = setup();
            // Drop (munmap) is excluded: the figure is the time until the guest could run.
            b.iter_with_large_drop(|| {
                let image = LocalImage::open(&p.local_path, &limits, &MODULE).expect("open");
                let mut dest = AnonymousPages::new(image.memory_size()).expect("mmap");
                // SAFETY: the image was written once by `write_local` into a private
                // temporary directory before the benchmark; nothing writes it again.
                #[allow(unsafe_code)]
                let mapped = unsafe { image.map_into(dest.as_mut_slice()) };
                mapped.expect("map");
                black_box(dest.as_slice()[0]);
                dest
            });
        });
        let mut copy: Option<Vec<u8>> = None;
        group.bench_function(BenchmarkId::new("memcpy", size), |b| {
            let p = setup();
            let copy = copy.get_or_insert_with(|| vec![1u8; size]);
            b.iter(|| copy.copy_from_slice(black_box(&p.memory)));
        });
        black_box(&copy);
        if size <= 16 << 20 {
            let file = dir.path().join(format!("{size}.tws"));
            group.bench_function(BenchmarkId::new("disk_round_trip", size), |b| {
                let p = setup();
                b.iter_with_large_drop(|| {
                    let snap = capture_portable(&p.meta, &p.memory, &options).expect("capture");
                    std::fs::write(&file, &snap).expect("write");
                    let read = std::fs::read(&file).expect("read");
                    restore_portable(&read, &limits, &MODULE).expect("restore")
                });
            });
        }
    }
    group.finish();
}

criterion_group!(benches, cold_start);
criterion_main!(benches);
