//! Fixtures of the instruction-count benches (`benches/icount.rs`).
//!
//! Each hot path the performance gate tracks by instruction count has a
//! fixture here: the state it runs against, built outside the measured
//! region, and warmed by one call so that lazy first-use work (thread-local
//! initialisation, first hash-map growth) is not what gets counted. The
//! benches run one call of each path under callgrind (gungraun); the counts
//! are compared with `bench-results/icount/baseline.json` by the `icount-gate`
//! tool of `tensor-wasm-bench`.
//!
//! The fixtures are deterministic where the code under test lets them be: fixed
//! inputs, a fixed creation time in snapshot metadata, single-threaded capture.
//! Tenant ids and token secrets are random (the registry draws them), which
//! moves a hash-map probe by a few instructions at most.
//!
//! The fixtures are unit-tested below, so a bench never measures an error path
//! by accident.

use std::sync::Arc;

use tensor_wasm_dispatch::{DispatchConfig, KernelDispatcher};
use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use tensor_wasm_jit::{
    Blueprint, CacheKey, CompiledKernel, Fingerprint, KernelCache, KernelCacheConfig,
    KernelCacheMetrics, PtxTarget, Shape,
};
use tensor_wasm_snapshot::{
    capture_portable, realistic_image, CaptureOptions, GlobalValue, RestoreLimits, SnapshotMeta,
    ValType,
};
use tensor_wasm_tenant::{GpuIsolation, MemoryTenantStore, Quotas, TenantMetrics, TenantRegistry};

/// One dispatch through `dispatcher`: permit acquire, tracking future, poll to
/// completion (the completion is already resolved, so this is pure dispatch
/// overhead), permit release.
pub fn dispatch_once(dispatcher: &KernelDispatcher) {
    let permit = dispatcher
        .acquire_blocking()
        .expect("an idle dispatcher has a free permit");
    dispatcher.track(permit, std::future::ready(())).wait();
}

/// The server's default dispatcher, warmed by one dispatch.
pub fn dispatcher() -> KernelDispatcher {
    let dispatcher = KernelDispatcher::new(DispatchConfig::default());
    dispatch_once(&dispatcher);
    dispatcher
}

/// The PTX target of the reference GPU machines: sm_90 under a CUDA 13.0 driver.
pub fn sm90_target() -> PtxTarget {
    PtxTarget::for_device((9, 0), 13000).expect("sm_90 under CUDA 13.0 is supported")
}

/// A kernel launch as the host sees it before validation.
#[derive(Debug, Clone)]
pub struct Launch {
    pub blueprint: Blueprint,
    pub config: LaunchConfig,
    pub args: Vec<KernelArg>,
    pub memory_len: usize,
}

impl Launch {
    /// [`Blueprint::validate_launch`] of this launch.
    pub fn validate(&self) -> Result<(), tensor_wasm_jit::JitError> {
        self.blueprint
            .validate_launch(&self.config, &self.args, self.memory_len)
    }
}

/// A valid `matmul[16x16x16]` launch: 64 × 64 times 64 × 64 f32 in a 1 MiB memory.
pub fn matmul_launch() -> Launch {
    let blueprint = Blueprint::parse("matmul[16x16x16]").expect("valid descriptor");
    let (m, n, k) = (64u32, 64u32, 64u32);
    let config = blueprint
        .launch_config(&Shape::Matmul { m, n, k })
        .expect("shape within limits");
    let bytes = |rows: u32, cols: u32| u64::from(rows) * u64::from(cols) * 4;
    let a = bytes(m, k);
    let b = bytes(k, n);
    let c = bytes(m, n);
    let args = vec![
        KernelArg::Buffer { offset: 0, len: a },
        KernelArg::Buffer { offset: a, len: b },
        KernelArg::Buffer {
            offset: a + b,
            len: c,
        },
        KernelArg::U32(m),
        KernelArg::U32(n),
        KernelArg::U32(k),
    ];
    Launch {
        blueprint,
        config,
        args,
        memory_len: 1 << 20,
    }
}

/// A valid `vector_add[4]` launch over 65 536 f32 elements, written in place.
pub fn vector_add_launch() -> Launch {
    let blueprint = Blueprint::parse("vector_add[4]").expect("valid descriptor");
    let n = 65_536u32;
    let config = blueprint
        .launch_config(&Shape::Elements { n })
        .expect("shape within limits");
    let len = u64::from(n) * 4;
    let args = vec![
        KernelArg::Buffer { offset: 0, len },
        KernelArg::Buffer { offset: len, len },
        KernelArg::Buffer { offset: 0, len },
        KernelArg::U32(n),
    ];
    Launch {
        blueprint,
        config,
        args,
        memory_len: 1 << 20,
    }
}

/// The blueprint and target of the fingerprint bench (`matmul[16x16x16]`, sm_90).
pub fn fingerprint_input() -> (Blueprint, PtxTarget) {
    let blueprint = Blueprint::parse("matmul[16x16x16]").expect("valid descriptor");
    let target = sm90_target();
    // Warm: the first hash pays for the CPU-feature probe of the SHA-256 code.
    std::hint::black_box(blueprint.fingerprint(&target));
    (blueprint, target)
}

/// An in-memory kernel cache holding `matmul[16x16x16]` for sm_90, its key,
/// and one hit already served.
pub fn warm_cache() -> (KernelCache, CacheKey) {
    let blueprint = Blueprint::parse("matmul[16x16x16]").expect("valid descriptor");
    let target = sm90_target();
    let key = CacheKey {
        fingerprint: Fingerprint::of(&blueprint, &target).0,
        arch: target.sm,
        driver_version: 13000,
    };
    let cache = KernelCache::new(
        KernelCacheConfig::default(),
        KernelCacheMetrics::unregistered().expect("metrics"),
    )
    .expect("an in-memory cache");
    cache
        .get_or_compile(&key, || {
            Ok(CompiledKernel {
                ptx: blueprint.emit_ptx(&target).into(),
                entry: blueprint.entry_name().into(),
                cubin: None,
            })
        })
        .expect("emits");
    assert!(cache.get(&key).is_some(), "the kernel is cached");
    (cache, key)
}

/// A registry of tenants with one tenant's id and bearer secret.
pub struct Tenants {
    pub registry: TenantRegistry,
    /// Id of the tenant in the middle of the creation order.
    pub id: String,
    /// A bearer secret of that tenant.
    pub secret: String,
}

impl std::fmt::Debug for Tenants {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tenants")
            .field("tenants", &self.registry.len())
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A registry (in-memory store) of `count` tenants, warmed by one lookup and
/// one authentication.
pub fn tenants(count: usize) -> Tenants {
    assert!(count > 0);
    let registry = TenantRegistry::open(
        Arc::new(MemoryTenantStore::new()),
        TenantMetrics::unregistered().expect("metrics"),
    )
    .expect("registry");
    let mut chosen = None;
    for i in 0..count {
        let (info, token) = registry
            .create_tenant(&format!("t{i}"), Quotas::default(), GpuIsolation::default())
            .expect("create tenant");
        if i == count / 2 {
            chosen = Some((info.id, token.secret));
        }
    }
    let (id, secret) = chosen.expect("count > 0");
    assert!(registry.lookup(&id).is_some());
    assert!(registry.authenticate(&secret).is_some());
    Tenants {
        registry,
        id,
        secret,
    }
}

/// A portable snapshot of a realistic 1 MiB image and what reading it needs.
#[derive(Debug, Clone)]
pub struct Snapshot {
    pub bytes: Vec<u8>,
    pub limits: RestoreLimits,
    pub module_sha256: [u8; 32],
}

/// Captures a portable snapshot (1 MiB realistic image, 64 KiB frames, one
/// thread, fixed creation time, two globals).
pub fn portable_snapshot() -> Snapshot {
    let module_sha256 = [0x5a; 32];
    let memory = realistic_image(1 << 20, 7);
    let mut meta = SnapshotMeta::new(
        module_sha256,
        "fn-0123456789abcdef01234567",
        "tn-0123456789abcdef",
        memory.len() as u64,
    );
    meta.created_at_ms = 1_763_700_000_000;
    meta.globals = vec![
        GlobalValue {
            index: 0,
            ty: ValType::I32,
            bits: 1_048_576,
        },
        GlobalValue {
            index: 1,
            ty: ValType::I64,
            bits: 42,
        },
    ];
    let options = CaptureOptions {
        chunk_size: 64 << 10,
        zstd_level: 1,
        threads: 1,
    };
    let bytes = capture_portable(&meta, &memory, &options).expect("capture");
    let limits = RestoreLimits::default();
    tensor_wasm_snapshot::read_portable_meta(&bytes, &limits, &module_sha256)
        .expect("the snapshot reads back");
    Snapshot {
        bytes,
        limits,
        module_sha256,
    }
}

/// A blueprint launch on the CPU backend's kernel code, without the pool: its inputs first in
/// `memory`, its output last (from `output`).
#[derive(Debug, Clone)]
pub struct CpuKernel {
    pub launch: Launch,
    pub memory: Vec<u8>,
    pub output: usize,
}

impl CpuKernel {
    /// Plans the launch as parts for 2 cores and computes every part, one after another, as
    /// the CPU backend's workers would (steps until done).
    pub fn run_parts(&mut self) {
        let Launch {
            blueprint,
            config,
            args,
            ..
        } = &self.launch;
        let parts = blueprint
            .cpu_parts(config, args, self.memory.len(), 2)
            .expect("the fixture is valid")
            .expect("separate buffers run as parts");
        let (head, tail) = self.memory.split_at_mut(self.output);
        let inputs: Vec<&[u8]> = parts.inputs.iter().map(|r| &head[r.clone()]).collect();
        for (range, mut part) in parts.parts {
            let output = &mut tail[range.start - self.output..range.end - self.output];
            while !part.step(&inputs, output).expect("the part computes") {}
        }
    }
}

/// `descriptor` over buffers of `sizes` elements laid out one after another (the last one
/// the output), the shape's dimensions as the scalars, inputs filled with small values.
fn cpu_kernel(descriptor: &str, shape: Shape, sizes: &[u64], dims: &[u32]) -> CpuKernel {
    let blueprint = Blueprint::parse(descriptor).expect("valid descriptor");
    let config = blueprint
        .launch_config(&shape)
        .expect("shape within limits");
    let mut args = Vec::new();
    let mut offset = 0u64;
    for &size in sizes {
        args.push(KernelArg::Buffer {
            offset,
            len: 4 * size,
        });
        offset += 4 * size;
    }
    args.extend(dims.iter().map(|&d| KernelArg::U32(d)));
    let output = (offset - 4 * sizes.last().copied().unwrap_or(0)) as usize;
    let mut memory = vec![0u8; offset as usize];
    for (i, chunk) in memory[..output].chunks_exact_mut(4).enumerate() {
        chunk.copy_from_slice(&((i % 61) as f32 / 8.0 - 3.0).to_le_bytes());
    }
    let launch = Launch {
        blueprint,
        config,
        args,
        memory_len: memory.len(),
    };
    let mut kernel = CpuKernel {
        launch,
        memory,
        output,
    };
    kernel.run_parts();
    kernel
}

/// `vector_add[4]` over 65,536 f32 (separate output): the element-wise path.
pub fn cpu_vector_add() -> CpuKernel {
    let n = 65_536u32;
    let size = u64::from(n);
    cpu_kernel(
        "vector_add[4]",
        Shape::Elements { n },
        &[size, size, size],
        &[n],
    )
}

/// `matmul[16x16x16]`, 64 × 64 × 64 f32: the blocked multiply (`Gemm`).
pub fn cpu_matmul() -> CpuKernel {
    let (m, n, k) = (64u32, 64u32, 64u32);
    let sizes = [u64::from(m * k), u64::from(k * n), u64::from(m * n)];
    cpu_kernel(
        "matmul[16x16x16]",
        Shape::Matmul { m, n, k },
        &sizes,
        &[m, n, k],
    )
}

/// `conv2d[3x3,s1,p1]`, one 8-channel 16 × 16 image into 8 channels: taps gathered while
/// packing, then the multiply.
pub fn cpu_conv2d() -> CpuKernel {
    let (n, c, h, w, k) = (1u32, 8u32, 16u32, 16u32, 8u32);
    let sizes = [
        u64::from(n * c * h * w),
        u64::from(k * c * 9),
        u64::from(n * k * h * w),
    ];
    cpu_kernel(
        "conv2d[3x3,s1,p1]",
        Shape::Conv2d { n, c, h, w, k },
        &sizes,
        &[n, c, h, w, k],
    )
}

/// The request headers of [`telemetry_off_request`]: a caller's `traceparent`
/// (which the hooks must not even parse when traces are off).
pub fn traced_headers() -> http::HeaderMap {
    let mut headers = http::HeaderMap::new();
    headers.insert(
        "traceparent",
        http::HeaderValue::from_static("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
    );
    telemetry_off_request(&headers);
    headers
}

/// The telemetry hooks one export call runs with traces off, in the order the
/// request path runs them (`tensor-wasm-api` `edge.rs`, `trace.rs`,
/// `routes.rs`; `tensor-wasm-runtime` `trace.rs`, `load.rs`, `launch.rs`): the
/// server span and its parent, entered on a poll and at the answer; the FaaS
/// span around the call; the coldstart note, the instantiate span, a kernel
/// span with its outcome. Each is one flag check when traces are off.
pub fn telemetry_off_request(headers: &http::HeaderMap) {
    use tensor_wasm_telemetry::span;
    let server = span!(
        "http",
        otel.kind = "server",
        trace_id = tracing::field::Empty
    );
    tensor_wasm_telemetry::adopt_remote_parent(&server, headers);
    let polled = server.enter();
    let faas = span!("faas", faas.coldstart = tracing::field::Empty);
    faas.in_scope(|| {
        if tensor_wasm_telemetry::enabled() {
            tracing::Span::current().record("faas.coldstart", false);
        }
        let instantiate = span!("instantiate");
        drop(instantiate.enter());
        let kernel = span!("kernel", tensor_wasm.kernel.run_us = tracing::field::Empty);
        let launched = kernel.enter();
        drop(launched);
        if !kernel.is_disabled() {
            kernel.record("tensor_wasm.kernel.run_us", 1u64);
        }
    });
    if !faas.is_disabled() {
        faas.record("faas.coldstart", false);
    }
    drop(polled);
    if !server.is_disabled() {
        server.record("trace_id", "-");
    }
    drop(server.enter());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU kernel fixtures compute what the kernels' one-pass run computes.
    #[test]
    fn cpu_kernel_fixtures_compute_the_kernels_results() {
        for mut kernel in [cpu_vector_add(), cpu_matmul(), cpu_conv2d()] {
            let mut expected = kernel.memory.clone();
            expected[kernel.output..].fill(0);
            let Launch {
                blueprint,
                config,
                args,
                ..
            } = &kernel.launch;
            blueprint.run_cpu(config, args, &mut expected).unwrap();
            kernel.memory[kernel.output..].fill(0);
            kernel.run_parts();
            assert_eq!(kernel.memory, expected, "{}", kernel.launch.blueprint);
            assert!(kernel.memory[kernel.output..].iter().any(|&b| b != 0));
        }
    }

    #[test]
    fn dispatch_fixture_releases_its_permit() {
        let d = dispatcher();
        dispatch_once(&d);
        assert_eq!(d.in_flight(), 0);
    }

    #[test]
    fn launch_fixtures_are_valid() {
        matmul_launch().validate().expect("matmul launch is valid");
        vector_add_launch()
            .validate()
            .expect("vector_add launch is valid");
    }

    #[test]
    fn cache_fixture_hits() {
        let (cache, key) = warm_cache();
        assert!(cache.get(&key).is_some());
    }

    #[test]
    fn fingerprint_is_stable() {
        let (blueprint, target) = fingerprint_input();
        assert_eq!(
            blueprint.fingerprint(&target),
            Fingerprint::of(&blueprint, &target)
        );
    }

    #[test]
    fn tenant_fixture_finds_and_authenticates() {
        let t = tenants(4);
        assert_eq!(t.registry.len(), 4);
        assert!(t.registry.lookup(&t.id).is_some());
        assert!(t.registry.authenticate(&t.secret).is_some());
    }

    #[test]
    fn snapshot_fixture_decodes() {
        let s = portable_snapshot();
        let meta = tensor_wasm_snapshot::read_portable_meta(&s.bytes, &s.limits, &s.module_sha256)
            .unwrap();
        assert_eq!(meta.globals.len(), 2);
        assert_eq!(meta.created_at_ms, 1_763_700_000_000);
    }
}
