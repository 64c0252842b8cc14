//! `jit`: what getting a kernel ready costs.
//!
//! - NVRTC: compile tenant CUDA C++ to PTX and a cubin (`compile_cuda`), cold each time;
//! - driver load of that PTX (`load_ptx`: the driver JIT-compiles it) vs of the cubin
//!   (`load_cubin`: no compilation), the same kernel, each load timed; the runner sets
//!   `CUDA_CACHE_DISABLE=1` so the driver's on-disk JIT cache does not hide the compile;
//! - blueprints: PTX emission alone; a cold `load_program` (fresh backend, empty kernel cache:
//!   emission + driver load) vs warm in the same backend (its module cache) vs a fresh backend
//!   over the kernel cache's directory (PTX from disk + driver load).

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tensor_wasm_gpu::{
    compile_cuda, launch, nvrtc_available, nvrtc_version, open_backend, Backend, KernelArg,
    LaunchConfig, TenantKey,
};
use tensor_wasm_jit::{
    Blueprint, CompiledBlueprint, KernelCache, KernelCacheConfig, KernelCacheMetrics, PtxTarget,
};

use crate::common::{cuda_info, elapsed_ns, median, stats_ns, Memory, Section, Suite};

/// Tenant CUDA C++: `y = a * x + y` with separate roundings (comparable bit for bit).
const SAXPY: tensor_wasm_jit::conformance::CudaKernel = tensor_wasm_jit::conformance::SAXPY;

const BLUEPRINTS: [&str; 3] = ["vector_add[4]", "matmul[16x16x16]", "conv2d[3x3,s1,p1]"];

pub fn run(suite: &Suite) -> anyhow::Result<Section> {
    let backend = suite.backend()?;
    let mut section = Section::default();
    let loads = if suite.quick { 3 } else { 5 };
    section.set(
        "env",
        json!({"CUDA_CACHE_DISABLE": std::env::var("CUDA_CACHE_DISABLE").ok()}),
    );
    let arch = cuda_info(&*backend).map_or((9, 0), |i| i.compute_capability);
    match nvrtc_available() {
        Err(why) => {
            section.set("nvrtc", json!({"available": false, "why": why}));
            section.note(format!("NVRTC not available: {why}"));
        }
        Ok(()) => nvrtc(&backend, arch, loads, &mut section)?,
    }
    blueprints(suite, &backend, loads, &mut section)?;
    Ok(section)
}

fn nvrtc(
    backend: &Arc<dyn Backend>,
    arch: (u32, u32),
    loads: usize,
    section: &mut Section,
) -> anyhow::Result<()> {
    let version = nvrtc_version().ok();
    let mut compile = Vec::new();
    let mut binary = None;
    for _ in 0..loads.min(3) {
        let start = Instant::now();
        let compiled = compile_cuda(SAXPY.source, SAXPY.entry, arch)?;
        compile.push(elapsed_ns(start));
        binary = Some(compiled);
    }
    let binary = binary.expect("compiled at least once");
    let mut row = json!({
        "available": true,
        "version": version.map(|(a, b)| format!("{a}.{b}")),
        "arch": format!("sm_{}{}", arch.0, arch.1),
        "ptx_bytes": binary.ptx.len(),
        "cubin_bytes": binary.cubin.len(),
        "compile": stats_ns(&compile),
    });
    if backend.device().is_cuda() {
        let (mut ptx, mut cubin) = (Vec::new(), Vec::new());
        let tenant = TenantKey::new("gpu-suite-jit");
        let (mut ptx_kernel, mut cubin_kernel) = (None, None);
        for _ in 0..loads {
            let start = Instant::now();
            ptx_kernel = Some(backend.load_ptx(&tenant, &binary.ptx, SAXPY.entry)?);
            ptx.push(elapsed_ns(start));
            let start = Instant::now();
            cubin_kernel = Some(backend.load_cubin(&tenant, &binary.cubin, SAXPY.entry)?);
            cubin.push(elapsed_ns(start));
        }
        for (what, kernel) in [("PTX", ptx_kernel), ("cubin", cubin_kernel)] {
            let kernel = kernel.expect("loaded");
            section.check(
                format!("tenant CUDA C++ loaded from {what} computes saxpy"),
                saxpy_runs(backend, &tenant, &kernel)?,
                "y = 1.5 x + y over 10000 elements, compared bit for bit",
            );
        }
        row["ptx_load"] = stats_ns(&ptx);
        row["cubin_load"] = stats_ns(&cubin);
        row["ptx_over_cubin_load_median"] = json!(median(&ptx) / median(&cubin));
    } else {
        row["ptx_load"] =
            json!({"available": false, "why": "raw PTX and cubin need a CUDA device"});
    }
    section.set("nvrtc", row);
    Ok(())
}

fn saxpy_runs(
    backend: &Arc<dyn Backend>,
    tenant: &TenantKey,
    kernel: &tensor_wasm_gpu::Kernel,
) -> anyhow::Result<bool> {
    let n = 10_000usize;
    let mut memory = Memory::new(&**backend, 8 * n)?;
    let bytes = memory.bytes();
    for i in 0..n {
        bytes[4 * i..4 * i + 4].copy_from_slice(&(i as f32 * 0.25).to_le_bytes());
        bytes[4 * (n + i)..4 * (n + i) + 4].copy_from_slice(&(1.0 - i as f32).to_le_bytes());
    }
    let args = [
        KernelArg::Buffer {
            offset: 0,
            len: 4 * n as u64,
        },
        KernelArg::Buffer {
            offset: 4 * n as u64,
            len: 4 * n as u64,
        },
        KernelArg::F32(1.5),
        KernelArg::U32(n as u32),
    ];
    launch(
        &**backend,
        tenant,
        kernel,
        &LaunchConfig::linear(n as u32, 256),
        &args,
        memory.bytes(),
        |c| c.wait_mut(),
    )??;
    let bytes = memory.bytes();
    Ok((0..n).all(|i| {
        let y = f32::from_le_bytes(bytes[4 * (n + i)..4 * (n + i) + 4].try_into().expect("4"));
        y.to_bits() == (1.5 * (i as f32 * 0.25) + (1.0 - i as f32)).to_bits()
    }))
}

fn blueprints(
    suite: &Suite,
    backend: &Arc<dyn Backend>,
    loads: usize,
    section: &mut Section,
) -> anyhow::Result<()> {
    let target = match cuda_info(&**backend) {
        Some(info) => PtxTarget::for_device(info.compute_capability, info.driver_version)?,
        None => PtxTarget::default(),
    };
    let tenant = TenantKey::new("gpu-suite-jit");
    let mut rows = Vec::new();
    for descriptor in BLUEPRINTS {
        let blueprint = Blueprint::parse(descriptor)?;
        let mut emit = Vec::new();
        for _ in 0..loads {
            let start = Instant::now();
            let ptx = blueprint.emit_ptx(&target);
            emit.push(elapsed_ns(start));
            std::hint::black_box(ptx);
        }
        let (mut cold, mut warm, mut disk) = (Vec::new(), Vec::new(), Vec::new());
        let mut disk_hits = 0;
        for _ in 0..loads {
            let dir = suite.scratch()?;
            let cache = || -> anyhow::Result<Arc<KernelCache>> {
                Ok(Arc::new(KernelCache::new(
                    KernelCacheConfig {
                        dir: Some(dir.path().to_owned()),
                        ..KernelCacheConfig::default()
                    },
                    KernelCacheMetrics::unregistered()?,
                )?))
            };
            let program = |cache: &Arc<KernelCache>| {
                Arc::new(CompiledBlueprint::with_cache(blueprint, cache.clone()))
            };
            let fresh = open_backend(suite.choice)?;
            let first_cache = cache()?;
            let start = Instant::now();
            fresh.load_program(&tenant, program(&first_cache))?;
            cold.push(elapsed_ns(start));
            let start = Instant::now();
            fresh.load_program(&tenant, program(&first_cache))?;
            warm.push(elapsed_ns(start));
            drop(fresh);
            let again = open_backend(suite.choice)?;
            let second_cache = cache()?;
            let start = Instant::now();
            again.load_program(&tenant, program(&second_cache))?;
            disk.push(elapsed_ns(start));
            disk_hits += second_cache.metrics().disk_loads.get();
        }
        rows.push(json!({
            "blueprint": blueprint.descriptor(),
            "target": target.to_string(),
            "emit_ptx": stats_ns(&emit),
            "cold_load_program": stats_ns(&cold),
            "warm_same_backend": stats_ns(&warm),
            "fresh_backend_disk_cache": stats_ns(&disk),
            "cold_over_warm_median": median(&cold) / median(&warm).max(1.0),
            "fresh_backend_ptx_from_disk": disk_hits,
            "loads": loads,
        }));
    }
    section.set("blueprints", Value::Array(rows));
    Ok(())
}
