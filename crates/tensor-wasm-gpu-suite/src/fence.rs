//! `fence`: tenant kernels fenced by `tensor_wasm_ptx_verify` on the GPU.
//!
//! 1. Every CUDA C++ kernel of the conformance set (the corpus included), compiled by NVRTC
//!    for this device, is fenced and launched with the hidden parameters (window = the guest
//!    memory, the cancel word in a memory of its own); its memory afterwards must be exactly
//!    what the Rust reference predicts, as the unfenced kernel's is.
//!    The entry a backend runs (`checked`: the lean entry when the launch-time proof admits
//!    the launch, else the fenced one) must leave the same memory.
//! 2. Wall-clock cost: five corpus kernels at sizes where the GPU is busy, unfenced, fenced
//!    and checked launches interleaved (launch plus wait, the median of each), the outputs
//!    compared; the proof's host time per launch description beside them.

use anyhow::Context as _;
use serde_json::{json, Value};
use tensor_wasm_gpu::{compile_cuda, launch, Backend, Kernel, KernelArg, LaunchConfig, TenantKey};
use tensor_wasm_jit::conformance::{cuda_cases, first_difference};
use tensor_wasm_jit::corpus;

use crate::common::{cuda_info, median, Memory, Section, Suite};

/// `source`'s `entry` for this device and its fenced module, both loaded, with the fenced
/// module's lean entry and launch-time proof.
struct Pair {
    plain: Kernel,
    fenced: Kernel,
    lean: Kernel,
    plan: tensor_wasm_ptx_verify::Plan,
    fences: u32,
}

impl Pair {
    /// The entry a backend runs for this launch (the lean one when the proof admits it),
    /// the proof's verdict, and its host time in microseconds (uncached).
    fn checked(
        &self,
        memory: &mut Memory,
        config: &LaunchConfig,
        args: &[KernelArg],
    ) -> (&Kernel, String, f64) {
        let lo = memory.bytes().as_ptr() as u64;
        let hi = lo + memory.bytes().len() as u64;
        let params: Vec<Vec<u8>> = args.iter().map(|a| a.param_bytes(lo)).collect();
        let facts = tensor_wasm_ptx_verify::LaunchFacts {
            params: &params,
            grid: config.grid,
            block: config.block,
            dynamic_shared: tensor_wasm_ptx_verify::dynamic_shared_bytes(config.shared_bytes),
            window: (lo, hi),
        };
        let start = std::time::Instant::now();
        let verdict = self.plan.prove_uncached(&facts);
        let micros = start.elapsed().as_secs_f64() * 1e6;
        match verdict {
            Ok(proof) => (
                &self.lean,
                format!("proven in {} steps, {} rounds", proof.steps, proof.rounds),
                micros,
            ),
            Err(why) => (&self.fenced, format!("not proven: {why}"), micros),
        }
    }
}

fn load(
    backend: &dyn Backend,
    tenant: &TenantKey,
    source: &str,
    entry: &str,
) -> anyhow::Result<Pair> {
    let info = cuda_info(backend).context("the fence section needs a CUDA device")?;
    let binary = compile_cuda(source, entry, info.compute_capability)
        .with_context(|| format!("NVRTC: {entry}"))?;
    let fenced = tensor_wasm_ptx_verify::fence(&binary.ptx)
        .map_err(|refusal| anyhow::anyhow!("{entry} refused: {refusal}"))?;
    let plan = tensor_wasm_ptx_verify::Plan::new(&fenced.ptx, entry)
        .with_context(|| format!("{entry}: the fenced module has no lean copy"))?;
    Ok(Pair {
        plain: backend.load_ptx(tenant, &binary.ptx, entry)?,
        fenced: backend.load_ptx(tenant, &fenced.ptx, entry)?,
        lean: backend.load_ptx(tenant, &fenced.ptx, plan.lean_entry())?,
        plan,
        fences: fenced.fences,
    })
}

/// `args` with the hidden parameters for a window of all of `memory`, and the launch with
/// the dynamic shared memory a fenced kernel needs.
fn fenced_launch(
    memory: &mut Memory,
    cancel: &mut Memory,
    config: &LaunchConfig,
    args: &[KernelArg],
) -> (LaunchConfig, Vec<KernelArg>) {
    let lo = memory.bytes().as_ptr() as u64;
    let hi = lo + memory.bytes().len() as u64;
    let cancel_word = cancel.bytes().as_ptr() as u64;
    let mut config = *config;
    config.shared_bytes = tensor_wasm_ptx_verify::dynamic_shared_bytes(config.shared_bytes);
    let hidden = tensor_wasm_ptx_verify::hidden_args(lo, hi, config.shared_bytes, cancel_word);
    let mut args = args.to_vec();
    args.extend(hidden.iter().map(|v| KernelArg::U64(*v)));
    (config, args)
}

fn run_once(
    backend: &dyn Backend,
    tenant: &TenantKey,
    kernel: &Kernel,
    config: &LaunchConfig,
    args: &[KernelArg],
    memory: &mut Memory,
) -> anyhow::Result<()> {
    launch(backend, tenant, kernel, config, args, memory.bytes(), |c| {
        c.wait_mut()
    })
    .and_then(|done| done)
    .map_err(|e| anyhow::anyhow!("launch: {e}"))
}

pub fn run(suite: &Suite) -> anyhow::Result<Section> {
    let mut section = Section::default();
    let backend = suite.backend()?;
    if !suite.is_cuda() {
        section.note("the fence section runs tenant PTX, which needs a CUDA device: skipped");
        return Ok(section);
    }
    let backend = backend.as_ref();
    let tenant = TenantKey::new("gpu-suite-fence");
    let mut cancel = Memory::new(backend, 4096)?;
    cancel.bytes().fill(0);

    // 1. Bit-identity, fenced and unfenced, against the references.
    let mut rows = Vec::new();
    let mut equal = 0;
    let cases = cuda_cases();
    let layout = shared_layout(backend, &tenant).unwrap_or_else(|e| json!(format!("{e:#}")));
    section.set("shared_layout", layout);
    for case in &cases {
        let entry = case.kernel.entry;
        let pair = load(backend, &tenant, case.kernel.source, entry)?;
        let mut plain = Memory::new(backend, case.layout.memory.len())?;
        plain.bytes().copy_from_slice(&case.layout.memory);
        run_once(
            backend,
            &tenant,
            &pair.plain,
            &case.config,
            &case.args,
            &mut plain,
        )?;
        let mut fenced = Memory::new(backend, case.layout.memory.len())?;
        fenced.bytes().copy_from_slice(&case.layout.memory);
        let (config, args) = fenced_launch(&mut fenced, &mut cancel, &case.config, &case.args);
        run_once(backend, &tenant, &pair.fenced, &config, &args, &mut fenced)?;
        let mut checked = Memory::new(backend, case.layout.memory.len())?;
        checked.bytes().copy_from_slice(&case.layout.memory);
        let (kernel, proof, _) = pair.checked(&mut checked, &case.config, &case.args);
        let (config, args) = fenced_launch(&mut checked, &mut cancel, &case.config, &case.args);
        run_once(backend, &tenant, kernel, &config, &args, &mut checked)?;
        let plain_diff = first_difference(case.dtype, &case.expected, plain.bytes());
        let fenced_diff = first_difference(case.dtype, &case.expected, fenced.bytes());
        let checked_diff = first_difference(case.dtype, &case.expected, checked.bytes());
        if plain_diff.is_none() && fenced_diff.is_none() && checked_diff.is_none() {
            equal += 1;
        }
        rows.push(json!({
            "kernel": entry, "fences": pair.fences,
            "unfenced": plain_diff.unwrap_or_else(|| "equal".into()),
            "fenced": fenced_diff.unwrap_or_else(|| "equal".into()),
            "checked": checked_diff.unwrap_or_else(|| "equal".into()),
            "proof": proof,
        }));
    }
    section.check(
        "every CUDA C++ kernel of the conformance set, fenced and checked, leaves the memory its Rust reference predicts",
        equal == cases.len(),
        format!("{equal} of {} kernels equal fenced, checked and unfenced", cases.len()),
    );
    section.set("bit_identity", Value::Array(rows));

    // 2. Wall clock at sizes that keep the GPU busy.
    let reps = if suite.quick { 3 } else { 31 };
    let mut timings = Vec::new();
    let mut overheads = Vec::new();
    let mut checked_overheads = Vec::new();
    let mut same_at_scale = true;
    for spec in large_launches(suite.quick) {
        let pair = load(backend, &tenant, spec.kernel.source, spec.kernel.entry)?;
        let mut plain = Memory::new(backend, spec.memory.len())?;
        let mut fenced = Memory::new(backend, spec.memory.len())?;
        let mut checked = Memory::new(backend, spec.memory.len())?;
        let (config, args) = fenced_launch(&mut fenced, &mut cancel, &spec.config, &spec.args);
        let (lean_or_fenced, proof, proof_us) =
            pair.checked(&mut checked, &spec.config, &spec.args);
        let (checked_config, checked_args) =
            fenced_launch(&mut checked, &mut cancel, &spec.config, &spec.args);
        let (mut plain_ns, mut fenced_ns, mut checked_ns) = (Vec::new(), Vec::new(), Vec::new());
        // The inputs are written once: timing launches only, not the migration of unified
        // memory a host write causes. The kernels overwrite their outputs (daxpy and the
        // histogram update theirs in place, which changes values, not work). The order
        // alternates, and the first round of each warms up (module load, page migration).
        plain.bytes().copy_from_slice(&spec.memory);
        fenced.bytes().copy_from_slice(&spec.memory);
        checked.bytes().copy_from_slice(&spec.memory);
        for rep in 0..=reps {
            let order = match rep % 3 {
                0 => [0, 1, 2],
                1 => [1, 2, 0],
                _ => [2, 0, 1],
            };
            for which in order {
                let start = std::time::Instant::now();
                match which {
                    0 => run_once(
                        backend,
                        &tenant,
                        &pair.plain,
                        &spec.config,
                        &spec.args,
                        &mut plain,
                    )?,
                    1 => run_once(backend, &tenant, &pair.fenced, &config, &args, &mut fenced)?,
                    _ => run_once(
                        backend,
                        &tenant,
                        lean_or_fenced,
                        &checked_config,
                        &checked_args,
                        &mut checked,
                    )?,
                }
                let ns = start.elapsed().as_nanos() as f64;
                if rep > 0 {
                    [&mut plain_ns, &mut fenced_ns, &mut checked_ns][which].push(ns);
                }
            }
        }
        let plain_bytes = plain.bytes().to_vec();
        let differing = |other: &mut Memory| {
            plain_bytes
                .chunks_exact(4)
                .zip(other.bytes().chunks_exact(4))
                .filter(|(a, b)| a != b)
                .count()
        };
        let (fenced_differ, checked_differ) = (differing(&mut fenced), differing(&mut checked));
        same_at_scale &= fenced_differ == 0 && checked_differ == 0;
        let (p, f, c) = (median(&plain_ns), median(&fenced_ns), median(&checked_ns));
        overheads.push(f / p);
        checked_overheads.push(c / p);
        timings.push(json!({
            "kernel": spec.kernel.entry, "size": spec.size, "repetitions": reps,
            "unfenced_median_ns": p, "fenced_median_ns": f, "overhead": f / p - 1.0,
            "checked_median_ns": c, "checked_overhead": c / p - 1.0,
            "proof": proof, "proof_host_microseconds": proof_us,
            "fences": pair.fences, "differing_words": fenced_differ,
            "checked_differing_words": checked_differ,
        }));
        println!(
            "  {} ({}): unfenced {:.1} µs, fenced {:.1} µs ({:+.1} %), checked {:.1} µs \
             ({:+.1} %; {proof}, {proof_us:.0} µs on the host)",
            spec.kernel.entry,
            spec.size,
            p / 1e3,
            f / 1e3,
            100.0 * (f / p - 1.0),
            c / 1e3,
            100.0 * (c / p - 1.0),
        );
    }
    let geomean_of = |ratios: &[f64]| {
        (ratios.iter().map(|r| r.ln()).sum::<f64>() / ratios.len().max(1) as f64).exp() - 1.0
    };
    let geomean = geomean_of(&overheads);
    let checked_geomean = geomean_of(&checked_overheads);
    section.check(
        "fenced and checked kernels at scale give the unfenced kernels' bytes",
        same_at_scale,
        format!(
            "{} kernels compared (differing words per kernel in wall_clock)",
            timings.len()
        ),
    );
    section.set("wall_clock", Value::Array(timings));
    section.set("wall_clock_geomean_overhead", json!(geomean));
    section.set(
        "wall_clock_geomean_checked_overhead",
        json!(checked_geomean),
    );
    section.target(
        "fenced vs unfenced wall clock (launch + wait), geometric mean overhead",
        100.0 * geomean,
        3.0,
        true,
        "%",
    );
    section.target(
        "checked (lean when proven, else fenced) vs unfenced wall clock, geometric mean overhead",
        100.0 * checked_geomean,
        3.0,
        true,
        "%",
    );
    Ok(section)
}

/// One large launch of a corpus kernel: the memory (inputs at their offsets), the arguments.
struct Large {
    kernel: tensor_wasm_jit::conformance::CudaKernel,
    size: String,
    config: LaunchConfig,
    args: Vec<KernelArg>,
    memory: Vec<u8>,
}

/// Buffers of `lens` bytes one after another (256-byte aligned), filled by `fill`.
fn buffers(lens: &[usize], fill: impl Fn(usize, usize) -> u32) -> (Vec<u8>, Vec<KernelArg>) {
    let mut offset = 0usize;
    let mut args = Vec::new();
    let mut spans = Vec::new();
    for &len in lens {
        spans.push((offset, len));
        args.push(KernelArg::Buffer {
            offset: offset as u64,
            len: len as u64,
        });
        offset = (offset + len).next_multiple_of(256);
    }
    let mut memory = vec![0u8; offset];
    for (index, (start, len)) in spans.iter().enumerate() {
        for (i, word) in memory[*start..start + len].chunks_exact_mut(4).enumerate() {
            word.copy_from_slice(&fill(index, i).to_le_bytes());
        }
    }
    (memory, args)
}

fn large_launches(quick: bool) -> Vec<Large> {
    let scale = if quick { 1 } else { 64 };
    let n = (1usize << 18) * scale;
    let value = |buffer: usize, i: usize| {
        let x = (i as u32)
            .wrapping_mul(2_654_435_761)
            .wrapping_add(buffer as u32 * 97);
        ((x >> 16) as f32 / 65536.0 - 0.5).to_bits()
    };
    let launch = |grid: [u32; 3], block: [u32; 3]| LaunchConfig {
        grid,
        block,
        shared_bytes: 0,
    };
    let mut out = Vec::new();
    // daxpy over a grid-stride loop: n doubles.
    let (memory, mut args) = buffers(&[8 * n, 8 * n], |_, i| (i as u32 % 1000) * 3);
    args.extend([KernelArg::F64(1.5), KernelArg::U64(n as u64)]);
    out.push(Large {
        kernel: corpus::DAXPY_STRIDE,
        size: format!("n={n}"),
        config: launch([264, 1, 1], [256, 1, 1]),
        args,
        memory,
    });
    // gather: n indices into a table of n/4 rows.
    let rows = n / 4;
    let (memory, mut args) = buffers(&[4 * rows, 4 * n, 4 * n], |b, i| match b {
        1 => ((i * 7919) % (rows + 16)) as u32,
        _ => value(b, i),
    });
    args.extend([KernelArg::I32(rows as i32), KernelArg::I32(n as i32)]);
    out.push(Large {
        kernel: corpus::GATHER,
        size: format!("n={n}"),
        config: launch([(n / 256) as u32, 1, 1], [256, 1, 1]),
        args,
        memory,
    });
    // histogram of n words.
    let (memory, mut args) = buffers(
        &[4 * n, 4 * 64],
        |b, i| if b == 0 { i as u32 * 31 } else { 0 },
    );
    args.push(KernelArg::U32(n as u32));
    out.push(Large {
        kernel: corpus::HISTOGRAM,
        size: format!("n={n}"),
        config: launch([(n / 256) as u32, 1, 1], [256, 1, 1]),
        args,
        memory,
    });
    // conv2d of a square image.
    let side = if quick { 256 } else { 2048 };
    let (memory, mut args) = buffers(&[4 * side * side, 4 * 9, 4 * side * side], value);
    args.extend([KernelArg::I32(side as i32), KernelArg::I32(side as i32)]);
    out.push(Large {
        kernel: corpus::CONV2D,
        size: format!("{side}x{side}"),
        config: launch([(side / 16) as u32, (side / 16) as u32, 1], [16, 16, 1]),
        args,
        memory,
    });
    // tiled matmul.
    let m = if quick { 128 } else { 1024 };
    let (memory, mut args) = buffers(&[4 * m * m, 4 * m * m, 4 * m * m], value);
    args.extend([
        KernelArg::I32(m as i32),
        KernelArg::I32(m as i32),
        KernelArg::I32(m as i32),
    ]);
    out.push(Large {
        kernel: corpus::MATMUL_TILED,
        size: format!("{m}x{m}x{m}"),
        config: launch([(m / 16) as u32, (m / 16) as u32, 1], [16, 16, 1]),
        args,
        memory,
    });
    out
}

/// Where this device puts shared variables: the shared-space addresses of two static
/// variables and of the dynamic array, and the special registers that size shared memory.
/// The fence bounds shared accesses by these addresses, not by 0.
fn shared_layout(backend: &dyn Backend, tenant: &TenantKey) -> anyhow::Result<Value> {
    const PTX: &str = r#"
.version 8.0
.target sm_80
.address_size 64
.shared .align 4 .b8 tw_small[64];
.shared .align 16 .b8 tw_large[1024];
.extern .shared .align 16 .b8 tw_dynamic[];
.visible .entry shared_layout(.param .u64 out)
{
    .reg .b64 %rd<8>;
    .reg .b32 %r<4>;
    ld.param.u64 %rd1, [out];
    mov.u64 %rd2, tw_small;
    st.global.u64 [%rd1], %rd2;
    mov.u64 %rd3, tw_large;
    st.global.u64 [%rd1+8], %rd3;
    mov.u64 %rd4, tw_dynamic;
    st.global.u64 [%rd1+16], %rd4;
    mov.u32 %r1, %total_smem_size;
    st.global.u32 [%rd1+24], %r1;
    mov.u32 %r2, %dynamic_smem_size;
    st.global.u32 [%rd1+28], %r2;
    cvta.shared.u64 %rd5, %rd2;
    st.global.u64 [%rd1+32], %rd5;
    st.shared.u32 [tw_small], %r1;
    st.shared.u32 [tw_large], %r1;
    ret;
}
"#;
    let kernel = backend.load_ptx(tenant, PTX, "shared_layout")?;
    let mut memory = Memory::new(backend, 64)?;
    memory.bytes().fill(0);
    let config = LaunchConfig {
        grid: [1, 1, 1],
        block: [1, 1, 1],
        shared_bytes: 256,
    };
    let args = [KernelArg::Buffer { offset: 0, len: 64 }];
    run_once(backend, tenant, &kernel, &config, &args, &mut memory)?;
    let b = memory.bytes();
    let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
    let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
    let layout = json!({
        "tw_small (64 B)": u64_at(0), "tw_large (1024 B)": u64_at(8),
        "tw_dynamic (256 B launched)": u64_at(16), "total_smem_size": u32_at(24),
        "dynamic_smem_size": u32_at(28), "generic address of tw_small": u64_at(32),
    });
    println!("  shared layout: {layout}");
    Ok(layout)
}
