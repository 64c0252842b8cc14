//! `cpu-kernels`: the CPU backend's rate on each kernel, for `scripts/cpu_kernels.py` to set
//! next to numpy's peer (`scripts/cpu_peer.py`) in one run file.
//!
//! Every kernel is launched the way the guest ABI launches it once the guest's arguments are
//! checked: `tensor_wasm_gpu::launch` on the CPU backend over one buffer standing for the
//! guest's memory, the blueprint's validation included, waiting for completion. JIT blueprints
//! go through `CompiledBlueprint` like a guest's `kernel_from_blueprint`; builtins through
//! `load_builtin`. Each kernel: one warm-up launch, then launches until `--seconds` have
//! passed (at least 3); the median is reported, as GB/s of bytes read and written (memory-bound
//! kernels, the same byte counts as the peer) or GFLOP/s (2 per multiply-add).
//!
//! Usage: `cpu-kernels [--quick] [--seconds S] [--only NAME[,NAME...]]`; prints one JSON
//! document.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{json, Value};
use tensor_wasm_gpu::{
    open_backend, Backend, BuiltinKernel, DeviceChoice, Kernel, KernelArg, LaunchConfig, TenantKey,
};
use tensor_wasm_jit::{Blueprint, CompiledBlueprint, ParamKind, Shape};

const MI: usize = 1 << 20;

/// One kernel to time.
struct Case {
    /// Its name in the run file, e.g. `elementwise[add] f32`.
    name: String,
    /// The peer's name for the same operation (`scripts/cpu_peer.py`).
    peer: String,
    kernel: Kernel,
    config: LaunchConfig,
    args: Vec<KernelArg>,
    memory: Vec<u8>,
    /// Bytes moved (memory-bound) or floating-point operations per launch.
    work: f64,
    unit: &'static str,
}

/// Deterministic inputs: small values of both signs (no NaN, infinity or denormal).
fn fill(memory: &mut [u8], integer: bool) {
    let mut state = 0x9e37_79b9_u32;
    for chunk in memory.chunks_exact_mut(4) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let small = (state % 2001) as i32 - 1000;
        let bytes = if integer {
            small.to_le_bytes()
        } else {
            (small as f32 / 128.0).to_le_bytes()
        };
        chunk.copy_from_slice(&bytes);
    }
}

/// Buffers laid out one after another for `elements` per buffer parameter of `blueprint`,
/// then its scalars: the arguments in parameter order and the memory length.
fn blueprint_args(
    blueprint: &Blueprint,
    buffer_elements: &[usize],
    dims: &[u32],
) -> (Vec<KernelArg>, usize) {
    let mut args = Vec::new();
    let (mut offset, mut buffers, mut dims) = (0u64, buffer_elements.iter(), dims.iter());
    for param in blueprint.params() {
        match param.kind {
            ParamKind::Input | ParamKind::Output => {
                let len = 4 * *buffers.next().expect("a size per buffer") as u64;
                args.push(KernelArg::Buffer { offset, len });
                offset += len;
            }
            ParamKind::U32 => args.push(KernelArg::U32(*dims.next().expect("a dimension"))),
            ParamKind::F32 => args.push(KernelArg::F32(3.0)),
            ParamKind::I32 => args.push(KernelArg::I32(3)),
        }
    }
    (args, offset as usize)
}

fn jit_case(
    backend: &dyn Backend,
    tenant: &TenantKey,
    descriptor: &str,
    shape: Shape,
    (buffers, dims): (&[usize], &[u32]),
    peer: &str,
    (work, unit): (f64, &'static str),
) -> anyhow::Result<Case> {
    let program = CompiledBlueprint::parse(descriptor)?;
    let blueprint = *program.blueprint();
    let config = blueprint.launch_config(&shape)?;
    let (args, len) = blueprint_args(&blueprint, buffers, dims);
    let mut memory = vec![0u8; len];
    fill(&mut memory, descriptor.ends_with(":i32"));
    let kernel = backend.load_program(tenant, Arc::new(program))?;
    Ok(Case {
        name: descriptor.to_owned(),
        peer: peer.to_owned(),
        kernel,
        config,
        args,
        memory,
        work,
        unit,
    })
}

fn cases(backend: &dyn Backend, tenant: &TenantKey, quick: bool) -> anyhow::Result<Vec<Case>> {
    let n = if quick { MI } else { 16 * MI };
    let n32 = n as u32;
    let mut cases = Vec::new();
    for dtype in ["f32", "i32"] {
        let (two, three, four) = (
            2.0 * 4.0 * n as f64,
            3.0 * 4.0 * n as f64,
            4.0 * 4.0 * n as f64,
        );
        let gb = "gb_per_s";
        let elements = Shape::Elements { n: n32 };
        cases.push(jit_case(
            backend,
            tenant,
            &format!("vector_add[4]:{dtype}"),
            elements,
            (&[n, n, n], &[n32]),
            &format!("vector_add {dtype}"),
            (three, gb),
        )?);
        let mut ops = vec![
            ("add", 3usize, three),
            ("sub", 3, three),
            ("mul", 3, three),
            ("max", 3, three),
            ("min", 3, three),
            ("relu", 2, two),
            ("scale", 2, two),
            ("fma", 4, four),
        ];
        if dtype == "f32" {
            ops.push(("div", 3, three));
        }
        for (op, buffers, bytes) in ops {
            cases.push(jit_case(
                backend,
                tenant,
                &format!("elementwise[{op}]:{dtype}"),
                elements,
                (&vec![n; buffers], &[n32]),
                &format!("elementwise[{op}] {dtype}"),
                (bytes, gb),
            )?);
        }
        // 64 rows, reduced into 64 results; the peer reduces all n elements to one.
        let (rows, cols) = (64u32, n32 / 64);
        for op in ["sum", "max"] {
            cases.push(jit_case(
                backend,
                tenant,
                &format!("reduce[{op}]:{dtype}"),
                Shape::Rows { rows, cols },
                (&[n, rows as usize], &[rows, cols]),
                &format!("reduce[{op}] {dtype}"),
                (4.0 * n as f64, gb),
            )?);
        }
    }
    let sizes: &[u32] = if quick { &[256] } else { &[1024, 2048] };
    for &size in sizes {
        let s = size as usize;
        let flops = 2.0 * (size as f64).powi(3);
        for (descriptor, dtype) in [("matmul[16x16x16]", "f32"), ("matmul[32x32x8]", "f32")] {
            cases.push(jit_case(
                backend,
                tenant,
                descriptor,
                Shape::Matmul {
                    m: size,
                    n: size,
                    k: size,
                },
                (&[s * s, s * s, s * s], &[size, size, size]),
                &format!("matmul {size}^3 {dtype}"),
                (flops, "gflop_per_s"),
            )?);
            if let Some(case) = cases.last_mut() {
                case.name = format!("{descriptor} {size}^3");
            }
        }
        // The builtin matmul: a, b, c, then m, n, k.
        let len = 3 * 4 * s * s;
        let buffer = |i: usize| KernelArg::Buffer {
            offset: (i * 4 * s * s) as u64,
            len: (4 * s * s) as u64,
        };
        let mut memory = vec![0u8; len];
        fill(&mut memory, false);
        cases.push(Case {
            name: format!("builtin matmul {size}^3"),
            peer: format!("matmul {size}^3 f32"),
            kernel: backend.load_builtin(BuiltinKernel::Matmul)?,
            config: LaunchConfig::grid_2d(size, size, [16, 16]),
            args: vec![
                buffer(0),
                buffer(1),
                buffer(2),
                KernelArg::U32(size),
                KernelArg::U32(size),
                KernelArg::U32(size),
            ],
            memory,
            work: flops,
            unit: "gflop_per_s",
        });
    }
    let size = if quick { 256u32 } else { 1024 };
    let s = size as usize;
    cases.push(jit_case(
        backend,
        tenant,
        "matmul[16x16x16]:i32",
        Shape::Matmul {
            m: size,
            n: size,
            k: size,
        },
        (&[s * s, s * s, s * s], &[size, size, size]),
        &format!("matmul {size}^3 i32"),
        (2.0 * (size as f64).powi(3), "gflop_per_s"),
    )?);
    if let Some(case) = cases.last_mut() {
        case.name = format!("matmul[16x16x16]:i32 {size}^3");
    }
    // The builtin vector_add: a, b, out, n.
    let mut memory = vec![0u8; 3 * 4 * n];
    fill(&mut memory, false);
    let buffer = |i: usize| KernelArg::Buffer {
        offset: (i * 4 * n) as u64,
        len: (4 * n) as u64,
    };
    cases.push(Case {
        name: "builtin vector_add".to_owned(),
        peer: "vector_add f32".to_owned(),
        kernel: backend.load_builtin(BuiltinKernel::VectorAdd)?,
        config: LaunchConfig::linear(n32, 256),
        args: vec![buffer(0), buffer(1), buffer(2), KernelArg::U32(n32)],
        memory,
        work: 3.0 * 4.0 * n as f64,
        unit: "gb_per_s",
    });
    // The functions of `tensor_wasm_jit::math`, element-wise over n f32s.
    for op in ["exp", "tanh", "sigmoid", "rsqrt", "erf", "gelu"] {
        cases.push(jit_case(
            backend,
            tenant,
            &format!("elementwise[{op}]:f32"),
            Shape::Elements { n: n32 },
            (&[n, n], &[n32]),
            &format!("elementwise[{op}] f32"),
            (2.0 * 4.0 * n as f64, "gb_per_s"),
        )?);
    }
    // Softmax along the last axis and layer normalisation of rows of 1024: n elements read
    // and written (layernorm's scale and bias, 1024 each, not counted).
    let (rows, cols) = (n32 / 1024, 1024u32);
    cases.push(jit_case(
        backend,
        tenant,
        "softmax[axis]",
        Shape::of_sizes(&[rows, cols, 1]),
        (&[n, n], &[rows, cols, 1]),
        "softmax last axis f32",
        (2.0 * 4.0 * n as f64, "gb_per_s"),
    )?);
    cases.push(jit_case(
        backend,
        tenant,
        "layernorm[rows]",
        Shape::Rows { rows, cols },
        (&[n, 1024, 1024, n], &[rows, cols]),
        "layernorm rows f32",
        (2.0 * 4.0 * n as f64, "gb_per_s"),
    )?);
    // concat[2] along axis 1 of two (rows × n/2/rows) tensors: n elements read and written.
    let (outer, half) = (4096u32, n32 / 4096 / 2);
    cases.push(jit_case(
        backend,
        tenant,
        "concat[2]",
        Shape::of_sizes(&[outer, half, half, 1]),
        (&[n / 2, n / 2, n], &[outer, half, half, 1]),
        "concat axis 1 f32",
        (2.0 * 4.0 * n as f64, "gb_per_s"),
    )?);
    // Data movement (f32): an attention-head permute (batch × sequence × heads × head size to
    // batch × heads × sequence × head size), a square transpose, and an embedding lookup.
    let (batch, square) = if quick { (2u32, 1024u32) } else { (32, 4096) };
    for (order, dims) in [
        ("0213", vec![batch, 512, 16, 64]),
        ("10", vec![square, square]),
    ] {
        let elements = dims.iter().map(|&d| d as usize).product::<usize>();
        let text = dims
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("x");
        let descriptor = format!("permute[{order}]:f32");
        let mut case = jit_case(
            backend,
            tenant,
            &descriptor,
            Shape::of_sizes(&dims),
            (&[elements, elements], &dims),
            &format!("permute[{order}] {text} f32"),
            (2.0 * 4.0 * elements as f64, "gb_per_s"),
        )?;
        case.name = format!("{descriptor} {text}");
        cases.push(case);
    }
    let (rows, cols, count) = (if quick { 5000u32 } else { 50_000 }, 768u32, 8192u32);
    let (table, out) = ((rows * cols) as usize, (count * cols) as usize);
    let mut case = jit_case(
        backend,
        tenant,
        "gather[rows]:f32",
        Shape::of_sizes(&[rows, cols, count]),
        (&[table, count as usize, out], &[rows, cols, count]),
        &format!("gather[rows] {rows}x{cols} by {count} f32"),
        (2.0 * 4.0 * out as f64 + 4.0 * f64::from(count), "gb_per_s"),
    )?;
    case.name = format!("gather[rows]:f32 {rows}x{cols} by {count}");
    // Indices spread over the table, every one in range (as the peer's).
    if let KernelArg::Buffer { offset, .. } = case.args[1] {
        let mut state = 0x2545_f491_u32;
        for i in 0..count as usize {
            state ^= state << 13;
            state ^= state >> 17;
            state ^= state << 5;
            let at = offset as usize + 4 * i;
            case.memory[at..at + 4].copy_from_slice(&((state % rows) as i32).to_le_bytes());
        }
    }
    cases.push(case);
    let (batch, channels, side, kernels) = (if quick { 1u32 } else { 8 }, 64u32, 56u32, 64u32);
    for stride in [1u32, 2] {
        let out_side = (side + 2 - 3) / stride + 1;
        let input = (batch * channels * side * side) as usize;
        let weight = (kernels * channels * 9) as usize;
        let output = (batch * kernels * out_side * out_side) as usize;
        let flops =
            2.0 * f64::from(batch * kernels * out_side * out_side) * f64::from(channels) * 9.0;
        cases.push(jit_case(
            backend,
            tenant,
            &format!("conv2d[3x3,s{stride},p1]"),
            Shape::Conv2d {
                n: batch,
                c: channels,
                h: side,
                w: side,
                k: kernels,
            },
            (
                &[input, weight, output],
                &[batch, channels, side, side, kernels],
            ),
            &format!("conv2d 3x3 stride {stride} f32"),
            (flops, "gflop_per_s"),
        )?);
    }
    // Attention-like batched products: 32 matrices of 128 × 64 times 64 × 128, each layout.
    let (batch, m, n, k) = (if quick { 4u32 } else { 32 }, 128u32, 128u32, 64u32);
    let (bs, ms, ns, ks) = (batch as usize, m as usize, n as usize, k as usize);
    for layout in ["nn", "nt", "tn", "tt"] {
        cases.push(jit_case(
            backend,
            tenant,
            &format!("bmm[{layout}]"),
            Shape::of_sizes(&[batch, m, n, k]),
            (
                &[bs * ms * ks, bs * ks * ns, bs * ms * ns],
                &[batch, m, n, k],
            ),
            &format!("bmm {batch}x{m}x{n}x{k} {layout} f32"),
            (2.0 * f64::from(batch * m * n * k), "gflop_per_s"),
        )?);
    }
    // Pooling 3 × 3, stride 2, padding 1 (a ResNet stem's), over 8 × 64 × 112 × 112.
    let (batch, channels, side) = (if quick { 1u32 } else { 8 }, 64u32, 112u32);
    let out_side = (side + 2 - 3) / 2 + 1;
    let input = (batch * channels * side * side) as usize;
    let output = (batch * channels * out_side * out_side) as usize;
    for op in ["maxpool", "avgpool"] {
        cases.push(jit_case(
            backend,
            tenant,
            &format!("{op}[3x3,s2,p1]"),
            Shape::of_sizes(&[batch, channels, side, side]),
            (&[input, output], &[batch, channels, side, side]),
            &format!("{op} 3x3 stride 2 f32"),
            (4.0 * (input + output) as f64, "gb_per_s"),
        )?);
    }
    Ok(cases)
}

/// Median seconds of one launch of `case`, and how many launches were timed.
fn time(
    backend: &dyn Backend,
    tenant: &TenantKey,
    case: &mut Case,
    seconds: f64,
) -> anyhow::Result<(f64, usize)> {
    let run = |memory: &mut Vec<u8>| -> anyhow::Result<f64> {
        let start = Instant::now();
        tensor_wasm_gpu::launch(
            backend,
            tenant,
            &case.kernel,
            &case.config,
            &case.args,
            memory,
            |c| c.wait_mut(),
        )??;
        Ok(start.elapsed().as_secs_f64())
    };
    let mut memory = std::mem::take(&mut case.memory);
    run(&mut memory)?;
    let mut times = Vec::new();
    let started = Instant::now();
    while times.len() < 3 || started.elapsed().as_secs_f64() < seconds {
        times.push(run(&mut memory)?);
    }
    case.memory = memory;
    times.sort_by(f64::total_cmp);
    Ok((times[times.len() / 2], times.len()))
}

/// The names of `NAME[,NAME...]`; a comma inside brackets belongs to its name
/// (`conv2d[3x3,s1,p1]`).
fn names(list: &str) -> Vec<String> {
    let mut names = vec![String::new()];
    let mut depth = 0u32;
    for c in list.chars() {
        match c {
            '[' => depth += 1,
            ']' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                names.push(String::new());
                continue;
            }
            _ => {}
        }
        names.last_mut().expect("one name at least").push(c);
    }
    names
}

fn main() -> anyhow::Result<()> {
    let mut args = std::env::args().skip(1);
    let (mut quick, mut seconds, mut only) = (false, 1.0f64, Vec::<String>::new());
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--seconds" => seconds = args.next().unwrap_or_default().parse()?,
            "--only" => only = names(&args.next().unwrap_or_default()),
            other => anyhow::bail!("unknown argument {other}; usage: cpu-kernels [--quick] [--seconds S] [--only NAME,...]"),
        }
    }
    let backend = open_backend(DeviceChoice::Cpu)?;
    let tenant = TenantKey::new("tn-cpu-kernels");
    let mut results: Vec<Value> = Vec::new();
    for mut case in cases(&*backend, &tenant, quick)? {
        if !only.is_empty() && !only.contains(&case.name) {
            continue;
        }
        let (median, runs) = time(&*backend, &tenant, &mut case, seconds)?;
        let rate = case.work / median / 1e9;
        eprintln!(
            "{}: {:.3} ms, {rate:.2} {}",
            case.name,
            median * 1e3,
            case.unit
        );
        results.push(json!({
            "kernel": case.name,
            "peer": case.peer,
            "seconds": median,
            "runs": runs,
            case.unit: rate,
        }));
    }
    let report = json!({
        "backend": "cpu",
        "workers": std::thread::available_parallelism().map_or(1, usize::from),
        "gemm_isa": tensor_wasm_gpu::gemm::Isa::selected().name(),
        "quick": quick,
        "results": results,
    });
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}
