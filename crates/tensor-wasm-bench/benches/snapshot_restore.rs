//! Snapshot restore through the runtime, to the instance's first call.
//!
//! A guest whose `init` grows linear memory to `size` bytes and fills it with a realistic
//! image (one page in four left zero, one ASCII text, two random `f32` bits, in 4 KiB
//! pages) is snapshotted once; each iteration is then one whole invocation of a tiny
//! export (`probe`, which reads a text page and a global set by `init`):
//!
//! - `cold_start/restore_lazy/{size}`: unified host memory, image mapped copy-on-write;
//! - `cold_start/restore_eager/{size}`: pooled memory, stored pages read in;
//! - `cold_start/restore_eager_resident/{size}`: the same with the slot's pages kept resident
//!   between instances (`pool_keep_resident_bytes` of 512 MiB: the slot is zeroed in place
//!   when an instance ends, inside the figure, instead of faulted in again);
//! - `cold_start/instantiate_plain/{size}`: the same module and memory limit with no
//!   snapshot (plain wasmtime instantiation + the call; the guest is then uninitialised),
//!   the floor a restore is compared against;
//! - `cold_start/memcpy/{size}`: copying an image of that size into memory already faulted
//!   in, the bound of any eager restore;
//! - `cold_start/memcpy_fresh/{size}`: the same copy into fresh pages (each faulted in on
//!   first write), the bound of an eager restore into a slot that handed its pages back.
//!
//! Sizes: 1 MiB, 16 MiB, 128 MiB, 512 MiB. Peers of one size run back to back.

use std::cell::OnceCell;
use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use tensor_wasm_runtime::{DeploySpec, GuestMemory, Runtime, RuntimeConfig};
use tensor_wasm_test_support::app::open_runtime;

const SIZES: [u64; 4] = [1 << 20, 16 << 20, 128 << 20, 512 << 20];

fn guest(pages: u64) -> String {
    format!(
        r#"(module
  (memory (export "memory") 1 65536)
  (global $ready (mut i32) (i32.const 0))
  (func (export "init")
    (local $addr i32) (local $end i32) (local $x i32) (local $kind i32)
    (drop (memory.grow (i32.const {grow})))
    (local.set $end (i32.const {bytes}))
    (local.set $x (i32.const 2463534242))
    (loop $word
      (local.set $kind (i32.and (i32.shr_u (local.get $addr) (i32.const 12)) (i32.const 3)))
      (if (i32.ne (local.get $kind) (i32.const 0))
        (then
          (local.set $x (i32.xor (local.get $x) (i32.shl (local.get $x) (i32.const 13))))
          (local.set $x (i32.xor (local.get $x) (i32.shr_u (local.get $x) (i32.const 17))))
          (local.set $x (i32.xor (local.get $x) (i32.shl (local.get $x) (i32.const 5))))
          (i32.store (local.get $addr)
            (if (result i32) (i32.eq (local.get $kind) (i32.const 1))
              (then (i32.add (i32.and (local.get $x) (i32.const 0x0f0f0f0f))
                             (i32.const 0x61616161)))
              (else (i32.or (i32.shr_u (local.get $x) (i32.const 9))
                            (i32.const 0x3f800000)))))))
      (local.set $addr (i32.add (local.get $addr) (i32.const 4)))
      (br_if $word (i32.lt_u (local.get $addr) (local.get $end))))
    (global.set $ready (i32.const 1)))
  (func (export "probe") (result i32)
    (i32.add (global.get $ready) (i32.load8_u (i32.const 4096)))))"#,
        grow = pages - 1,
        bytes = pages * 65_536,
    )
}

fn runtime(dir: &std::path::Path, memory: GuestMemory, keep_resident: u64) -> Runtime {
    let config = RuntimeConfig {
        guest_memory: memory,
        pool_keep_resident_bytes: keep_resident,
        max_instances: 4,
        default_timeout: Duration::from_secs(60),
        ..RuntimeConfig::new(dir)
    };
    open_runtime(config, &prometheus::Registry::new())
}

/// Deploys the guest for `size` bytes; with `snapshot`, runs init once and starts every
/// instance from the capture.
fn deploy(rt: &Runtime, size: u64, snapshot: bool) -> String {
    let spec = DeploySpec {
        memory_limit_bytes: Some(size),
        ..DeploySpec::export("restore-bench")
    };
    let id = rt
        .deploy(guest(size / 65_536).as_bytes(), spec)
        .expect("deploy")
        .record
        .id;
    if snapshot {
        rt.create_snapshot(&id, "init", true).expect("snapshot");
        // The first restore opens and verifies the local image once; not part of the figure.
        probe(rt, &id);
    }
    id
}

fn probe(rt: &Runtime, id: &str) -> i64 {
    rt.invoke_export(id, "probe", &[]).expect("probe")[0]
        .as_i64()
        .expect("i32 result")
}

/// The runtime of each restore mode (each over its own data directory).
struct Runtimes {
    lazy: Runtime,
    eager: Runtime,
    resident: Runtime,
}

/// The three deployments of one size.
struct Deployed {
    lazy: String,
    eager: String,
    resident: String,
    plain: String,
}

fn deploy_all(rts: &Runtimes, size: u64) -> Deployed {
    let deployed = Deployed {
        lazy: deploy(&rts.lazy, size, true),
        eager: deploy(&rts.eager, size, true),
        resident: deploy(&rts.resident, size, true),
        plain: deploy(&rts.lazy, size, false),
    };
    // Started from the snapshot: init's global is set and text is where init put it.
    let restored = probe(&rts.lazy, &deployed.lazy);
    assert!(restored > 1, "lazy restore did not carry init's state");
    assert_eq!(probe(&rts.eager, &deployed.eager), restored);
    assert_eq!(probe(&rts.resident, &deployed.resident), restored);
    assert_eq!(probe(&rts.lazy, &deployed.plain), 0);
    deployed
}

/// Runtimes, deployments (a snapshot of up to 512 MiB each) and copy buffers are
/// made when the first id that needs them runs, outside its timing: a filtered run
/// (`bench-gate`'s confirmation re-run) that matches none of a size's ids skips that
/// size's setup.
fn restore(c: &mut Criterion) {
    let mut group = c.benchmark_group("cold_start");
    let lazy_dir = tempfile::tempdir().expect("dir");
    let eager_dir = tempfile::tempdir().expect("dir");
    let resident_dir = tempfile::tempdir().expect("dir");
    let runtimes_cell = OnceCell::new();
    let runtimes = || {
        runtimes_cell.get_or_init(|| Runtimes {
            lazy: runtime(lazy_dir.path(), GuestMemory::Unified, 0),
            eager: runtime(eager_dir.path(), GuestMemory::Pooled, 0),
            resident: runtime(resident_dir.path(), GuestMemory::Pooled, 512 << 20),
        })
    };
    for size in SIZES {
        if size >= 128 << 20 {
            group.sample_size(10);
            group.measurement_time(Duration::from_secs(4));
        } else {
            group.sample_size(30);
            group.measurement_time(Duration::from_secs(3));
        }
        group.throughput(Throughput::Bytes(size));
        let deployed = OnceCell::new();
        let setup = || {
            (
                runtimes(),
                deployed.get_or_init(|| deploy_all(runtimes(), size)),
            )
        };

        group.bench_function(BenchmarkId::new("restore_lazy", size), |b| {
            let (rts, d) = setup();
            b.iter(|| black_box(probe(&rts.lazy, &d.lazy)));
        });
        group.bench_function(BenchmarkId::new("restore_eager", size), |b| {
            let (rts, d) = setup();
            b.iter(|| black_box(probe(&rts.eager, &d.eager)));
        });
        group.bench_function(BenchmarkId::new("restore_eager_resident", size), |b| {
            let (rts, d) = setup();
            b.iter(|| black_box(probe(&rts.resident, &d.resident)));
        });
        group.bench_function(BenchmarkId::new("instantiate_plain", size), |b| {
            let (rts, d) = setup();
            b.iter(|| black_box(probe(&rts.lazy, &d.plain)));
        });
        // The copy an eager restore cannot beat: the image into memory already faulted in.
        let mut buffers: Option<(Vec<u8>, Vec<u8>)> = None;
        group.bench_function(BenchmarkId::new("memcpy", size), |b| {
            let (image, copy) = buffers
                .get_or_insert_with(|| (vec![0x5au8; size as usize], vec![1u8; size as usize]));
            b.iter(|| copy.copy_from_slice(black_box(image)));
        });
        group.bench_function(BenchmarkId::new("memcpy_fresh", size), |b| {
            let (image, _) = buffers
                .get_or_insert_with(|| (vec![0x5au8; size as usize], vec![1u8; size as usize]));
            // `vec![0; n]` of this size is fresh zero pages from the kernel; unmapping them
            // is not part of the figure.
            b.iter_with_large_drop(|| {
                let mut copy = vec![0u8; size as usize];
                copy.copy_from_slice(black_box(image));
                copy
            });
        });
        black_box(&buffers);
        if let Some(d) = deployed.get() {
            let rts = runtimes();
            for (rt, id) in [
                (&rts.lazy, &d.lazy),
                (&rts.eager, &d.eager),
                (&rts.resident, &d.resident),
                (&rts.lazy, &d.plain),
            ] {
                rt.delete(id).expect("delete");
            }
        }
    }
    group.finish();
}

criterion_group!(benches, restore);
criterion_main!(benches);
