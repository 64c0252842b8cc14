//! `latency`: launch to completion of one small kernel (builtin `vector_add`, 4096 elements),
//! three ways, interleaved round by round in one process on one device:
//!
//! - **raw**: cudarc `cuLaunchKernel` + `cuStreamSynchronize` of the same PTX on managed
//!   memory, on the calling thread (`tensor_wasm_gpu::RawCudaKernel`: the backend's argument
//!   validation and nothing else; the floor; CUDA only);
//! - **backend**: `tensor_wasm_gpu::launch` (validation, the tenant's lane, completion through
//!   the lane's event thread) on managed memory;
//! - **raw-blocking**: the raw launch, then a wait on a blocking-sync event recorded after it,
//!   on the calling thread (how the backend's lane waits, without its hand-over between
//!   threads; a diagnostic of where the backend's time goes; CUDA only);
//! - **abi**: a guest calling `wasi:cuda.launch` (argument parsing, dispatcher permit, the
//!   backend launch, completion), timed inside the guest with WASI's monotonic clock.

use std::time::Instant;

use anyhow::bail;
use serde_json::json;
use tensor_wasm_gpu::{launch, BuiltinKernel, TenantKey};

use crate::common::{cuda_info, elapsed_ns, percentile, runtime, stats_ns, Memory, Section, Suite};
use crate::correctness::{deploy_launcher, invoke_plan};
use crate::plan::builtin_plan;
use crate::raw;

/// Elements of the kernel.
pub const N: u32 = 4096;

pub fn run(suite: &Suite) -> anyhow::Result<Section> {
    let backend = suite.backend()?;
    let plan = builtin_plan(BuiltinKernel::VectorAdd, [N, 0, 0], 5);
    let (rounds, per_round, warm) = if suite.quick {
        (3, 100, 10)
    } else {
        (10, 500, 50)
    };
    let dir = suite.scratch()?;
    let rt = runtime(backend.clone(), dir.path(), 4 << 20, 4, false)?;
    let id = deploy_launcher(&rt, 4 << 20)?;
    let tenant = TenantKey::new("gpu-suite-latency");
    let kernel = backend.load_builtin(BuiltinKernel::VectorAdd)?;

    let image = plan.memory_image();
    let mut api_memory = Memory::new(&*backend, image.len())?;
    api_memory.bytes().copy_from_slice(&image);
    let mut raw_peer = match backend.cuda_context() {
        Some(ctx) => {
            let info = cuda_info(&*backend).expect("a CUDA backend has CUDA info");
            let kernel = raw::load(&ctx, &info, &plan.descriptor)?;
            let stream = raw::stream(&ctx)?;
            let event = tensor_wasm_gpu::BlockingSyncEvent::new(&ctx)?;
            let mut memory = Memory::new(&*backend, image.len())?;
            memory.bytes().copy_from_slice(&image);
            Some((kernel, stream, event, memory))
        }
        None => None,
    };

    let (mut raw_ns, mut api_ns, mut abi_ns) = (Vec::new(), Vec::new(), Vec::new());
    let mut blocking_ns = Vec::new();
    for _ in 0..rounds {
        if let Some((kernel, stream, event, memory)) = raw_peer.as_mut() {
            for i in 0..warm + per_round {
                let start = Instant::now();
                kernel.launch_and_sync(stream, &plan.config, &plan.args, memory.bytes())?;
                if i >= warm {
                    raw_ns.push(elapsed_ns(start));
                }
            }
            for i in 0..warm + per_round {
                let start = Instant::now();
                kernel.launch_and_wait_blocking(
                    stream,
                    event,
                    &plan.config,
                    &plan.args,
                    memory.bytes(),
                )?;
                if i >= warm {
                    blocking_ns.push(elapsed_ns(start));
                }
            }
        }
        for i in 0..warm + per_round {
            let start = Instant::now();
            launch(
                &*backend,
                &tenant,
                &kernel,
                &plan.config,
                &plan.args,
                api_memory.bytes(),
                |c| c.wait_mut(),
            )??;
            if i >= warm {
                api_ns.push(elapsed_ns(start));
            }
        }
        let run = invoke_plan(&rt, &id, &plan.with_launches(warm, per_round))?;
        if run.status != 0 {
            bail!(
                "the guest's launches failed: {} {}",
                run.status,
                run.message
            );
        }
        abi_ns.extend(run.timings_ns.iter().map(|&t| t as f64));
    }

    let mut section = Section::default();
    let expected = plan.reference(&*tensor_wasm_gpu::open_backend(
        tensor_wasm_gpu::DeviceChoice::Cpu,
    )?)?;
    let (o, l) = (plan.out.0 as usize, plan.out.1 as usize);
    let api_out = api_memory.bytes()[o..o + l].to_vec();
    section.check(
        "backend launches computed vector_add like the CPU backend",
        crate::plan::compare(plan.out_type, &api_out, &expected).0 == 0,
        "output of the last backend launch compared bit for bit",
    );
    if let Some((_, _, _, memory)) = raw_peer.as_mut() {
        let raw_out = memory.bytes()[o..o + l].to_vec();
        section.check(
            "raw cudarc launches computed vector_add like the CPU backend",
            crate::plan::compare(plan.out_type, &raw_out, &expected).0 == 0,
            "output of the last raw launch compared bit for bit",
        );
    }

    section.set(
        "kernel",
        json!({"descriptor": "vector_add", "elements": N, "config": {
            "grid": plan.config.grid, "block": plan.config.block}}),
    );
    section.set(
        "method",
        json!({
            "rounds": rounds, "timed_per_round": per_round, "warmup_per_round": warm,
            "order": "raw, raw-blocking, backend, abi in every round",
            "raw": "cudarc cuLaunchKernel + cuStreamSynchronize on the calling thread (tensor_wasm_gpu::RawCudaKernel, validated like the backend), managed memory",
            "raw_blocking": "the raw launch, then cuEventRecord + cuEventSynchronize of a CU_EVENT_BLOCKING_SYNC event on the calling thread (tensor_wasm_gpu::RawCudaKernel::launch_and_wait_blocking): how the backend's lane waits, without its hand-over between threads",
            "backend": "tensor_wasm_gpu::launch + Completion::wait_mut, managed memory",
            "abi": "guest wasi:cuda.launch timed in the guest (WASI monotonic clock), guest memory",
        }),
    );
    section.set(
        "raw",
        if raw_ns.is_empty() {
            json!({"available": false, "why": "no raw CUDA launch on the CPU backend"})
        } else {
            stats_ns(&raw_ns)
        },
    );
    if !blocking_ns.is_empty() {
        section.set("raw_blocking", stats_ns(&blocking_ns));
    }
    section.set("backend", stats_ns(&api_ns));
    section.set("abi", stats_ns(&abi_ns));
    if !raw_ns.is_empty() {
        let ratio = |a: &[f64], p: f64| percentile(a, p) / percentile(&raw_ns, p);
        let ratios = json!({
            "abi_over_raw_p50": ratio(&abi_ns, 0.5),
            "abi_over_raw_p99": ratio(&abi_ns, 0.99),
            "backend_over_raw_p50": ratio(&api_ns, 0.5),
            "backend_over_raw_p99": ratio(&api_ns, 0.99),
            "raw_blocking_over_raw_p50": ratio(&blocking_ns, 0.5),
            "raw_blocking_over_raw_p99": ratio(&blocking_ns, 0.99),
        });
        section.target(
            "abi launch-to-completion p50 / raw",
            ratio(&abi_ns, 0.5),
            1.25,
            true,
            "x",
        );
        section.target(
            "abi launch-to-completion p99 / raw",
            ratio(&abi_ns, 0.99),
            1.25,
            true,
            "x",
        );
        section.set("ratios", ratios);
    } else {
        section.set(
            "ratios",
            json!({"abi_over_backend_p50": percentile(&abi_ns, 0.5) / percentile(&api_ns, 0.5)}),
        );
    }
    Ok(section)
}
