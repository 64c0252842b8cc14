//! `throughput`: the product's kernels at sizes where the kernel dominates, over managed
//! memory prefetched to the device (the state of guest memory after its first kernel):
//! vector add (bandwidth), matmul f32 4096³ (FLOP/s), conv2d 3×3 (FLOP/s).
//!
//! Each case is timed two ways: wall clock around `tensor_wasm_gpu::launch` + wait (what a
//! guest's launch costs, minus the ABI), and, on CUDA, CUDA events around a raw launch of the
//! same PTX (kernel time alone). `scripts/gpu-suite/torch_peer.py` reads `torch_cases` from
//! this file and measures PyTorch on the same shapes; `summarize.py` puts them side by side.

use std::time::Instant;

use anyhow::anyhow;
use serde_json::{json, Value};
use tensor_wasm_gpu::{launch, BuiltinKernel, KernelArg, LaunchTimer, TenantKey};
use tensor_wasm_jit::{Blueprint, CompiledBlueprint, Shape};

use crate::common::{cuda_info, elapsed_ns, percentile, stats_ns, Memory, Section, Suite};
use crate::plan::{blueprint_plan, builtin_plan, Plan};
use crate::raw;

/// What a case computes, for its rate and its spot check.
#[derive(Debug, Clone, Copy)]
enum Work {
    /// `out = a + b` over `n` f32: 12 n bytes moved.
    VectorAdd { n: u32 },
    /// C = A·B: 2 m n k FLOP.
    Matmul { m: u32, n: u32, k: u32 },
    /// 3×3, stride 1, padding 1: 2 n k h w c 9 FLOP.
    Conv3x3 {
        n: u32,
        c: u32,
        h: u32,
        w: u32,
        k: u32,
    },
}

impl Work {
    /// (amount, unit of the rate) per launch.
    fn amount(&self) -> (f64, &'static str) {
        match *self {
            Work::VectorAdd { n } => (12.0 * f64::from(n), "bytes"),
            Work::Matmul { m, n, k } => (2.0 * f64::from(m) * f64::from(n) * f64::from(k), "flop"),
            Work::Conv3x3 { n, c, h, w, k } => (
                2.0 * f64::from(n)
                    * f64::from(k)
                    * f64::from(h)
                    * f64::from(w)
                    * f64::from(c)
                    * 9.0,
                "flop",
            ),
        }
    }

    fn torch_case(&self) -> Value {
        match *self {
            Work::VectorAdd { n } => json!({"op": "add", "n": n}),
            Work::Matmul { m, n, k } => json!({"op": "mm", "m": m, "n": n, "k": k}),
            Work::Conv3x3 { n, c, h, w, k } => {
                json!({"op": "conv2d", "n": n, "c": c, "h": h, "w": w, "k": k, "r": 3, "s": 3, "stride": 1, "pad": 1})
            }
        }
    }
}

pub fn run(suite: &Suite) -> anyhow::Result<Section> {
    let backend = suite.backend()?;
    let quick = suite.quick;
    let (vn, mm, conv) = if quick {
        (1u32 << 20, 128u32, (1u32, 8u32, 16u32, 16u32, 8u32))
    } else {
        (1 << 28, 4096, (8, 64, 56, 56, 64))
    };
    let (c_n, c_c, c_h, c_w, c_k) = conv;
    let reps = |full: usize| if quick { 3 } else { full };
    let vector = Work::VectorAdd { n: vn };
    let matmul = Work::Matmul {
        m: mm,
        n: mm,
        k: mm,
    };
    let conv = Work::Conv3x3 {
        n: c_n,
        c: c_c,
        h: c_h,
        w: c_w,
        k: c_k,
    };
    let blueprint = |d: &str, shape: Shape| -> anyhow::Result<Plan> {
        blueprint_plan(&Blueprint::parse(d)?, shape, 11)
    };
    let cases: Vec<(&str, Plan, Work, usize)> = vec![
        (
            "vector_add",
            builtin_plan(BuiltinKernel::VectorAdd, [vn, 0, 0], 3),
            vector,
            reps(20),
        ),
        (
            "vector_add[4]",
            blueprint("vector_add[4]", Shape::Elements { n: vn })?,
            vector,
            reps(20),
        ),
        (
            "matmul",
            builtin_plan(BuiltinKernel::Matmul, [mm, mm, mm], 3),
            matmul,
            reps(5),
        ),
        (
            "matmul[16x16x16]",
            blueprint(
                "matmul[16x16x16]",
                Shape::Matmul {
                    m: mm,
                    n: mm,
                    k: mm,
                },
            )?,
            matmul,
            reps(5),
        ),
        (
            "matmul[32x32x8]",
            blueprint(
                "matmul[32x32x8]",
                Shape::Matmul {
                    m: mm,
                    n: mm,
                    k: mm,
                },
            )?,
            matmul,
            reps(5),
        ),
        (
            "matmul[32x32x16]",
            blueprint(
                "matmul[32x32x16]",
                Shape::Matmul {
                    m: mm,
                    n: mm,
                    k: mm,
                },
            )?,
            matmul,
            reps(5),
        ),
        (
            "conv2d[3x3,s1,p1]",
            blueprint(
                "conv2d[3x3,s1,p1]",
                Shape::Conv2d {
                    n: c_n,
                    c: c_c,
                    h: c_h,
                    w: c_w,
                    k: c_k,
                },
            )?,
            conv,
            reps(20),
        ),
    ];

    let mut section = Section::default();
    let tenant = TenantKey::new("gpu-suite-throughput");
    let ctx = backend.cuda_context();
    let info = cuda_info(&*backend);
    let peak = ctx.as_ref().and_then(raw::peak_bandwidth);
    section.set(
        "device_peak_bandwidth_bytes_per_s",
        peak.map_or(Value::Null, |p| json!(p)),
    );
    let mut rows = Vec::new();
    for (label, plan, work, repeats) in &cases {
        println!("  {label}: {}", plan.name);
        let mut memory = Memory::new(&*backend, plan.memory_bytes() as usize)?;
        plan.fill_into(memory.bytes());
        let stream = match &ctx {
            Some(ctx) => Some(raw::stream(ctx)?),
            None => None,
        };
        let mut prefetch_ns = None;
        if let (Some(stream), Some(managed)) = (&stream, memory.managed()) {
            let start = Instant::now();
            managed
                .prefetch_to_device(stream)
                .map_err(|e| anyhow!("prefetch: {e}"))?;
            stream
                .synchronize()
                .map_err(|e| anyhow!("cuStreamSynchronize: {e}"))?;
            prefetch_ns = Some(elapsed_ns(start));
        }
        let kernel = match BuiltinKernel::from_descriptor(&plan.descriptor) {
            Some(builtin) => backend.load_builtin(builtin)?,
            None => backend.load_program(
                &tenant,
                std::sync::Arc::new(CompiledBlueprint::parse(&plan.descriptor)?),
            )?,
        };
        let mut wall = Vec::new();
        for i in 0..=*repeats {
            let start = Instant::now();
            launch(
                &*backend,
                &tenant,
                &kernel,
                &plan.config,
                &plan.args,
                memory.bytes(),
                |c| c.wait_mut(),
            )??;
            if i > 0 {
                wall.push(elapsed_ns(start));
            }
        }
        let mismatches = spot_check(plan, *work, memory.bytes());
        section.check(
            format!("{label} spot check ({})", plan.name),
            mismatches == 0,
            format!("{mismatches} of 64 sampled outputs differ from a host computation"),
        );
        let mut events = Vec::new();
        if let (Some(ctx), Some(stream), Some(info)) = (&ctx, &stream, &info) {
            let raw_kernel = raw::load(ctx, info, &plan.descriptor)?;
            let timer = LaunchTimer::new(ctx)?;
            for i in 0..=*repeats {
                let ns = raw_kernel.launch_timed(
                    stream,
                    &timer,
                    &plan.config,
                    &plan.args,
                    memory.bytes(),
                )?;
                if i > 0 {
                    events.push(ns);
                }
            }
        }
        let (amount, unit) = work.amount();
        let rate = |samples: &[f64]| {
            if samples.is_empty() {
                Value::Null
            } else {
                json!(amount / (percentile(samples, 0.5) * 1e-9))
            }
        };
        rows.push(json!({
            "case": label,
            "plan": plan.name,
            "descriptor": plan.descriptor,
            "work": format!("{work:?}"),
            "amount_per_launch": amount,
            "unit": unit,
            "rate_unit": format!("{unit}/s"),
            "prefetch_ns": prefetch_ns,
            "backend_wall": stats_ns(&wall),
            "backend_wall_rate_p50": rate(&wall),
            "kernel_events": if events.is_empty() { json!({"available": false}) } else { stats_ns(&events) },
            "kernel_events_rate_p50": rate(&events),
            "fraction_of_peak_bandwidth_wall": match (unit, peak, wall.is_empty()) {
                ("bytes", Some(p), false) => json!(amount / (percentile(&wall, 0.5) * 1e-9) / p),
                _ => Value::Null,
            },
            "torch_case": work.torch_case(),
        }));
    }
    section.set("cases", Value::Array(rows));
    section.set(
        "torch_cases",
        json!([vector.torch_case(), matmul.torch_case(), conv.torch_case()]),
    );
    section.set(
        "method",
        json!({
            "memory": if ctx.is_some() { "CUDA managed memory, prefetched to the device" } else { "host memory (CPU backend)" },
            "backend_wall": "wall clock of tensor_wasm_gpu::launch + wait, median after one warm-up",
            "kernel_events": "CUDA events around a raw cudarc launch of the same PTX (tensor_wasm_gpu::RawCudaKernel::launch_timed)",
            "fp32": "IEEE f32 with separate multiply and add (no FMA, no TF32)",
        }),
    );
    Ok(section)
}

/// Compares 64 sampled outputs with a host computation in the kernels' order of operations.
fn spot_check(plan: &Plan, work: Work, memory: &[u8]) -> usize {
    let buffer = |i: usize| match plan.args[i] {
        KernelArg::Buffer { offset, .. } => offset as usize,
        _ => unreachable!("buffers come first"),
    };
    let f = |at: usize, index: usize| {
        let b = at + 4 * index;
        f32::from_le_bytes([memory[b], memory[b + 1], memory[b + 2], memory[b + 3]])
    };
    let mut x = 0x9e37_79b9u32;
    let mut pick = |bound: u32| {
        x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
        (x >> 8) % bound.max(1)
    };
    let (a, b, out) = (buffer(0), buffer(1), buffer(2));
    let mut bad = 0;
    for _ in 0..64 {
        let (got, want) = match work {
            Work::VectorAdd { n } => {
                let i = pick(n) as usize;
                (f(out, i), f(a, i) + f(b, i))
            }
            Work::Matmul { m, n, k } => {
                let (row, col) = (pick(m) as usize, pick(n) as usize);
                let (n, k) = (n as usize, k as usize);
                let mut acc = 0.0f32;
                for p in 0..k {
                    acc += f(a, row * k + p) * f(b, p * n + col);
                }
                (f(out, row * n + col), acc)
            }
            Work::Conv3x3 {
                n: images,
                c,
                h,
                w,
                k,
            } => {
                let (img, ko) = (pick(images) as usize, pick(k) as usize);
                let (y, xx) = (pick(h) as usize, pick(w) as usize);
                let (c, h, w, k) = (c as usize, h as usize, w as usize, k as usize);
                let mut acc = 0.0f32;
                for ci in 0..c {
                    for r in 0..3 {
                        for s in 0..3 {
                            let (iy, ix) = (y as isize + r - 1, xx as isize + s - 1);
                            if iy < 0 || ix < 0 || iy >= h as isize || ix >= w as isize {
                                continue;
                            }
                            let input = ((img * c + ci) * h + iy as usize) * w + ix as usize;
                            let weight = ((ko * c + ci) * 3 + r as usize) * 3 + s as usize;
                            acc += f(a, input) * f(b, weight);
                        }
                    }
                }
                (f(out, ((img * k + ko) * h + y) * w + xx), acc)
            }
        };
        if got.to_bits() != want.to_bits() {
            bad += 1;
        }
    }
    bad
}
