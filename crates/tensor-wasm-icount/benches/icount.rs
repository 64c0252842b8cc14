//! Instruction counts of the hot paths (gungraun + callgrind): deterministic
//! where wall-clock time on a shared 2-core machine is not.
//!
//! Each benchmark runs one call of a hot path under callgrind, once; its
//! fixture (from `tensor_wasm_icount`) is built and warmed outside the counted
//! region, and returned from the benchmark so that dropping it is not counted
//! either. `make icount` runs this target with `--output-format=json` and
//! hands the counts to `icount-gate` (crate `tensor-wasm-bench`), which fails
//! on more than +10 % instructions against `bench-results/icount/baseline.json`.
//!
//! | id (gate)                              | hot path                                                 |
//! |----------------------------------------|----------------------------------------------------------|
//! | `dispatch/permit_poll`                 | `KernelDispatcher::acquire_blocking` + `track` + `wait`  |
//! | `validate_launch/matmul_16x16x16`      | `Blueprint::validate_launch`, valid 64×64×64 matmul      |
//! | `validate_launch/vector_add_4`         | `Blueprint::validate_launch`, valid in-place vector_add  |
//! | `fingerprint/matmul_16x16x16`          | `Blueprint::fingerprint` for sm_90                       |
//! | `kernel_cache/warm_hit`                | `KernelCache::get` of a present kernel                   |
//! | `tenant/lookup_256`                    | `TenantRegistry::lookup` among 256 tenants               |
//! | `tenant/authenticate_256`              | `TenantRegistry::authenticate` (SHA-256 + map + compare) |
//! | `snapshot/read_portable_meta`          | `read_portable_meta`: header, metadata CRC, decode       |
//! | `cpu_kernel/vector_add_4`              | `vector_add[4]`, 64 Ki f32, as the CPU backend's parts    |
//! | `cpu_kernel/matmul_64`                 | `matmul[16x16x16]`, 64³ f32: the blocked multiply        |
//! | `cpu_kernel/conv2d_3x3`                | `conv2d[3x3,s1,p1]`, 8 × 16 × 16 into 8 channels         |
//! | `telemetry_off/request_hooks`          | the trace hooks of one invoke with traces off            |

use std::hint::black_box;

use gungraun::{library_benchmark, library_benchmark_group, main};
use tensor_wasm_dispatch::KernelDispatcher;
use tensor_wasm_icount::{
    cpu_conv2d, cpu_matmul, cpu_vector_add, dispatch_once, dispatcher, fingerprint_input,
    matmul_launch, portable_snapshot, telemetry_off_request, tenants, traced_headers,
    vector_add_launch, warm_cache, CpuKernel, Launch, Snapshot, Tenants,
};
use tensor_wasm_jit::{Blueprint, CacheKey, Fingerprint, KernelCache, PtxTarget};

#[library_benchmark]
#[bench::permit_poll(dispatcher())]
fn dispatch(dispatcher: KernelDispatcher) -> KernelDispatcher {
    dispatch_once(black_box(&dispatcher));
    dispatcher
}

#[library_benchmark]
#[bench::matmul_16x16x16(matmul_launch())]
#[bench::vector_add_4(vector_add_launch())]
fn validate_launch(launch: Launch) -> Launch {
    black_box(black_box(&launch).validate()).expect("the fixture is valid");
    launch
}

#[library_benchmark]
#[bench::matmul_16x16x16(fingerprint_input())]
fn fingerprint(input: (Blueprint, PtxTarget)) -> ((Blueprint, PtxTarget), Fingerprint) {
    let fingerprint = black_box(&input.0).fingerprint(black_box(&input.1));
    (input, fingerprint)
}

#[library_benchmark]
#[bench::warm_hit(warm_cache())]
fn kernel_cache(cache: (KernelCache, CacheKey)) -> (KernelCache, CacheKey) {
    let hit = black_box(&cache.0).get(black_box(&cache.1));
    assert!(hit.is_some(), "warm hit");
    drop(black_box(hit));
    cache
}

#[library_benchmark]
#[bench::lookup_256(tenants(256))]
fn tenant_lookup(t: Tenants) -> Tenants {
    let tenant = black_box(&t.registry).lookup(black_box(&t.id));
    assert!(tenant.is_some(), "the tenant exists");
    drop(black_box(tenant));
    t
}

#[library_benchmark]
#[bench::authenticate_256(tenants(256))]
fn tenant_authenticate(t: Tenants) -> Tenants {
    let principal = black_box(&t.registry).authenticate(black_box(&t.secret));
    assert!(principal.is_some(), "the secret is valid");
    drop(black_box(principal));
    t
}

#[library_benchmark]
#[bench::read_portable_meta(portable_snapshot())]
fn snapshot(s: Snapshot) -> Snapshot {
    let meta = tensor_wasm_snapshot::read_portable_meta(
        black_box(&s.bytes),
        black_box(&s.limits),
        black_box(&s.module_sha256),
    );
    assert!(meta.is_ok(), "the snapshot is valid");
    drop(black_box(meta));
    s
}

#[library_benchmark]
#[bench::vector_add_4(cpu_vector_add())]
#[bench::matmul_64(cpu_matmul())]
#[bench::conv2d_3x3(cpu_conv2d())]
fn cpu_kernel(mut kernel: CpuKernel) -> CpuKernel {
    black_box(&mut kernel).run_parts();
    kernel
}

#[library_benchmark]
#[bench::request_hooks(traced_headers())]
fn telemetry_off(headers: http::HeaderMap) -> http::HeaderMap {
    telemetry_off_request(black_box(&headers));
    headers
}

library_benchmark_group!(
    name = hot_paths,
    benchmarks = [
        dispatch,
        validate_launch,
        fingerprint,
        kernel_cache,
        tenant_lookup,
        tenant_authenticate,
        snapshot,
        cpu_kernel,
        telemetry_off
    ]
);

main!(library_benchmark_groups = hot_paths);
