//! Launch plans and the generic launcher guest.
//!
//! The launcher is one WASI command (WAT, below) that reads a 1024-byte *plan* from stdin:
//! a kernel descriptor (a builtin or any JIT blueprint), the launch configuration, the
//! argument records, how to fill its buffers (a fixed LCG, so host and guest fill alike), a
//! number of untimed and timed launches. It fills its own linear memory, asks for the kernel
//! through `wasi:cuda.kernel_from_blueprint`, launches through `wasi:cuda.launch`, timing each
//! timed launch with WASI's monotonic clock, and writes to stdout:
//!
//! `i32 status | u32 timed launches | u32 message length | message | u64 ns per launch ... |
//! output buffer bytes`
//!
//! (status 0, or the ABI's negative error code with `last_error`'s message). The same plan is
//! run on a host copy of the memory by the CPU backend to get the expected output, so every
//! blueprint goes through the full guest path and is compared with the CPU backend.

use anyhow::{anyhow, bail, Context as _};
use sha2::{Digest, Sha256};
use tensor_wasm_gpu::{launch, Backend, BuiltinKernel, KernelArg, LaunchConfig, TenantKey};
use tensor_wasm_jit::conformance::blueprint_kinds;
use tensor_wasm_jit::{Blueprint, CompiledBlueprint, Dtype, ParamKind, Shape};
use tensor_wasm_runtime::abi::tag;

/// Size of a plan.
pub const PLAN_BYTES: usize = 1024;
/// First guest byte buffers may use (below: plan, scratch, message, timings).
pub const DATA_BASE: u64 = 131_072;
/// Most timed launches one plan may ask for.
pub const MAX_REPEATS: u32 = 8192;
const MAGIC: u32 = 0x5347_5754; // "TWGS"
const PAGE: u64 = 65_536;

/// The launcher guest (see the module docs). Plan layout (u32 little-endian unless noted):
/// 0 magic, 4 pages, 8 timed launches, 12 descriptor length, 16..40 grid xyz / block xyz /
/// shared bytes, 44 argument count, 48 fill count, 52 output offset, 56 output length,
/// 60 untimed launches, 64..256 descriptor, 256..768 argument records, 768..1024 fills
/// (offset, length, kind, seed; kind 1 = f32 LCG, 2 = i32 LCG, 4 = byte `seed`).
pub const LAUNCHER_WAT: &str = r#"(module
  (import "wasi_snapshot_preview1" "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import "wasi_snapshot_preview1" "clock_time_get" (func $clock (param i32 i64 i32) (result i32)))
  (import "wasi:cuda" "kernel_from_blueprint" (func $kernel (param i32 i32) (result i32)))
  (import "wasi:cuda" "launch"
    (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
  (import "wasi:cuda" "last_error" (func $last_error (param i32 i32) (result i32)))
  (memory (export "memory") 2)

  (func $write (param $ptr i32) (param $len i32)
    (i32.store (i32.const 1024) (local.get $ptr))
    (i32.store (i32.const 1028) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 1024) (i32.const 1) (i32.const 1040))))

  (func $now (result i64)
    (drop (call $clock (i32.const 1) (i64.const 1) (i32.const 1048)))
    (i64.load (i32.const 1048)))

  (func $fail (param $code i32)
    (local $n i32)
    (local.set $n (call $last_error (i32.const 2048) (i32.const 2048)))
    (if (i32.lt_s (local.get $n) (i32.const 0)) (then (local.set $n (i32.const 0))))
    (if (i32.gt_u (local.get $n) (i32.const 2048)) (then (local.set $n (i32.const 2048))))
    (i32.store (i32.const 1056) (local.get $code))
    (i32.store (i32.const 1060) (i32.const 0))
    (i32.store (i32.const 1064) (local.get $n))
    (call $write (i32.const 1056) (i32.const 12))
    (call $write (i32.const 2048) (local.get $n)))

  (func $fill (param $at i32) (param $len i32) (param $kind i32) (param $seed i32)
    (local $end i32) (local $x i32)
    (if (i32.eq (local.get $kind) (i32.const 4))
      (then (memory.fill (local.get $at) (local.get $seed) (local.get $len)) (return)))
    (local.set $end (i32.add (local.get $at) (i32.and (local.get $len) (i32.const -4))))
    (local.set $x (local.get $seed))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $at) (local.get $end)))
        (local.set $x (i32.add (i32.mul (local.get $x) (i32.const 1664525)) (i32.const 1013904223)))
        (if (i32.eq (local.get $kind) (i32.const 1))
          (then
            (f32.store (local.get $at)
              (f32.mul
                (f32.convert_i32_s (i32.sub (i32.shr_u (local.get $x) (i32.const 20)) (i32.const 2048)))
                (f32.const 0.00390625))))
          (else (i32.store (local.get $at) (i32.shr_s (local.get $x) (i32.const 12)))))
        (local.set $at (i32.add (local.get $at) (i32.const 4)))
        (br $next))))

  (func $go (param $k i32) (result i32)
    (call $launch (local.get $k)
      (i32.load (i32.const 16)) (i32.load (i32.const 20)) (i32.load (i32.const 24))
      (i32.load (i32.const 28)) (i32.load (i32.const 32)) (i32.load (i32.const 36))
      (i32.load (i32.const 40)) (i32.const 256) (i32.shl (i32.load (i32.const 44)) (i32.const 4))))

  (func (export "_start")
    (local $got i32) (local $n i32) (local $k i32) (local $rc i32) (local $i i32)
    (local $reps i32) (local $t0 i64) (local $p i32)
    (block $eof
      (loop $more
        (br_if $eof (i32.ge_u (local.get $got) (i32.const 1024)))
        (i32.store (i32.const 1024) (local.get $got))
        (i32.store (i32.const 1028) (i32.sub (i32.const 1024) (local.get $got)))
        (br_if $eof (call $fd_read (i32.const 0) (i32.const 1024) (i32.const 1) (i32.const 1040)))
        (local.set $n (i32.load (i32.const 1040)))
        (br_if $eof (i32.eqz (local.get $n)))
        (local.set $got (i32.add (local.get $got) (local.get $n)))
        (br $more)))
    (if (i32.or (i32.lt_u (local.get $got) (i32.const 1024))
                (i32.ne (i32.load (i32.const 0)) (i32.const 0x53475754)))
      (then (call $fail (i32.const -100)) (return)))
    (if (i32.gt_u (i32.load (i32.const 4)) (memory.size))
      (then
        (if (i32.eq (memory.grow (i32.sub (i32.load (i32.const 4)) (memory.size))) (i32.const -1))
          (then (call $fail (i32.const -101)) (return)))))
    (block $filled
      (loop $fills
        (br_if $filled (i32.ge_u (local.get $i) (i32.load (i32.const 48))))
        (local.set $p (i32.add (i32.const 768) (i32.shl (local.get $i) (i32.const 4))))
        (call $fill (i32.load (local.get $p)) (i32.load offset=4 (local.get $p))
                    (i32.load offset=8 (local.get $p)) (i32.load offset=12 (local.get $p)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $fills)))
    (local.set $k (call $kernel (i32.const 64) (i32.load (i32.const 12))))
    (if (i32.lt_s (local.get $k) (i32.const 0)) (then (call $fail (local.get $k)) (return)))
    (local.set $i (i32.const 0))
    (block $warm
      (loop $untimed
        (br_if $warm (i32.ge_u (local.get $i) (i32.load (i32.const 60))))
        (local.set $rc (call $go (local.get $k)))
        (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (call $fail (local.get $rc)) (return)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $untimed)))
    (local.set $reps (i32.load (i32.const 8)))
    (local.set $i (i32.const 0))
    (block $timed
      (loop $launches
        (br_if $timed (i32.ge_u (local.get $i) (local.get $reps)))
        (local.set $t0 (call $now))
        (local.set $rc (call $go (local.get $k)))
        (i64.store (i32.add (i32.const 4096) (i32.shl (local.get $i) (i32.const 3)))
                   (i64.sub (call $now) (local.get $t0)))
        (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (call $fail (local.get $rc)) (return)))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $launches)))
    (i32.store (i32.const 1056) (i32.const 0))
    (i32.store (i32.const 1060) (local.get $reps))
    (i32.store (i32.const 1064) (i32.const 0))
    (call $write (i32.const 1056) (i32.const 12))
    (call $write (i32.const 4096) (i32.shl (local.get $reps) (i32.const 3)))
    (call $write (i32.load (i32.const 52)) (i32.load (i32.const 56)))))
"#;

/// How a buffer is filled before the launches.
#[derive(Debug, Clone, Copy)]
pub enum Fill {
    /// f32 values in [-8, 8) in steps of 1/256, from an LCG seeded with the value.
    F32(u32),
    /// i32 values (LCG output >> 12, arithmetic), seeded with the value.
    I32(u32),
    /// Every byte set to the value (the output's sentinel).
    Byte(u8),
}

impl Fill {
    fn code(self) -> (u32, u32) {
        match self {
            Fill::F32(seed) => (1, seed),
            Fill::I32(seed) => (2, seed),
            Fill::Byte(b) => (4, u32::from(b)),
        }
    }

    /// Applies the fill to `memory` exactly as the guest does.
    pub fn apply(self, memory: &mut [u8]) {
        match self {
            Fill::Byte(b) => memory.fill(b),
            Fill::F32(seed) | Fill::I32(seed) => {
                let mut x = seed;
                for word in memory.chunks_exact_mut(4) {
                    x = x.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
                    let bytes = match self {
                        Fill::F32(_) => {
                            (((x >> 20) as i32 - 2048) as f32 * 0.003_906_25).to_le_bytes()
                        }
                        _ => ((x as i32) >> 12).to_le_bytes(),
                    };
                    word.copy_from_slice(&bytes);
                }
            }
        }
    }
}

/// The element type of a plan's output, for comparisons.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutType {
    F32,
    I32,
}

/// One launch plan of the launcher guest.
#[derive(Debug, Clone)]
pub struct Plan {
    pub name: String,
    pub descriptor: String,
    pub config: LaunchConfig,
    pub args: Vec<KernelArg>,
    pub fills: Vec<(u64, u64, Fill)>,
    pub out: (u64, u64),
    pub out_type: OutType,
    pub pages: u32,
    pub warmup: u32,
    pub repeats: u32,
}

/// Hands out aligned buffer offsets from [`DATA_BASE`].
struct Layout {
    next: u64,
}

impl Layout {
    fn new() -> Self {
        Layout { next: DATA_BASE }
    }

    fn take(&mut self, bytes: u64) -> KernelArg {
        let offset = self.next;
        self.next = (offset + bytes.max(4)).div_ceil(256) * 256;
        KernelArg::Buffer { offset, len: bytes }
    }

    fn pages(&self) -> u32 {
        u32::try_from(self.next.div_ceil(PAGE)).expect("plans stay far below 4 GiB")
    }
}

fn offset_len(arg: &KernelArg) -> (u64, u64) {
    match arg {
        KernelArg::Buffer { offset, len } => (*offset, *len),
        _ => unreachable!("only buffers are laid out"),
    }
}

impl Plan {
    /// The 1024-byte plan the guest reads on stdin.
    pub fn encode(&self) -> anyhow::Result<Vec<u8>> {
        let mut plan = vec![0u8; PLAN_BYTES];
        let mut put = |at: usize, v: u32| plan[at..at + 4].copy_from_slice(&v.to_le_bytes());
        if self.descriptor.len() > 192 || self.args.len() > 32 || self.fills.len() > 16 {
            bail!("plan {} is too large for the launcher", self.name);
        }
        if self.repeats > MAX_REPEATS {
            bail!(
                "plan {} asks for more than {MAX_REPEATS} timed launches",
                self.name
            );
        }
        let u32_of = |v: u64| u32::try_from(v).map_err(|_| anyhow!("{v} does not fit in u32"));
        put(0, MAGIC);
        put(4, self.pages);
        put(8, self.repeats);
        put(12, self.descriptor.len() as u32);
        for (i, v) in self
            .config
            .grid
            .iter()
            .chain(&self.config.block)
            .chain(std::iter::once(&self.config.shared_bytes))
            .enumerate()
        {
            put(16 + 4 * i, *v);
        }
        put(44, self.args.len() as u32);
        put(48, self.fills.len() as u32);
        put(52, u32_of(self.out.0)?);
        put(56, u32_of(self.out.1)?);
        put(60, self.warmup);
        plan[64..64 + self.descriptor.len()].copy_from_slice(self.descriptor.as_bytes());
        for (i, arg) in self.args.iter().enumerate() {
            let (tag, aux, value) = record(arg);
            let at = 256 + 16 * i;
            plan[at..at + 4].copy_from_slice(&tag.to_le_bytes());
            plan[at + 4..at + 8].copy_from_slice(&aux.to_le_bytes());
            plan[at + 8..at + 16].copy_from_slice(&value.to_le_bytes());
        }
        for (i, (offset, len, fill)) in self.fills.iter().enumerate() {
            let (kind, seed) = fill.code();
            let at = 768 + 16 * i;
            for (j, v) in [u32_of(*offset)?, u32_of(*len)?, kind, seed]
                .iter()
                .enumerate()
            {
                plan[at + 4 * j..at + 4 * j + 4].copy_from_slice(&v.to_le_bytes());
            }
        }
        Ok(plan)
    }

    /// Bytes of linear memory the guest grows to.
    pub fn memory_bytes(&self) -> u64 {
        u64::from(self.pages) * PAGE
    }

    /// The guest's memory after its fills, built on the host.
    pub fn memory_image(&self) -> Vec<u8> {
        let mut memory = vec![0u8; self.memory_bytes() as usize];
        self.fill_into(&mut memory);
        memory
    }

    /// Applies the plan's fills to `memory` (at least [`Plan::memory_bytes`] long).
    pub fn fill_into(&self, memory: &mut [u8]) {
        for (offset, len, fill) in &self.fills {
            fill.apply(&mut memory[*offset as usize..(*offset + *len) as usize]);
        }
    }

    /// The expected output: the plan run once by `cpu` (the CPU backend) on the host image.
    pub fn reference(&self, cpu: &dyn Backend) -> anyhow::Result<Vec<u8>> {
        let tenant = TenantKey::new("gpu-suite-reference");
        let kernel = match BuiltinKernel::from_descriptor(&self.descriptor) {
            Some(builtin) => cpu.load_builtin(builtin)?,
            None => cpu.load_program(
                &tenant,
                std::sync::Arc::new(CompiledBlueprint::parse(&self.descriptor)?),
            )?,
        };
        let mut memory = self.memory_image();
        launch(
            cpu,
            &tenant,
            &kernel,
            &self.config,
            &self.args,
            &mut memory,
            |c| c.wait_mut(),
        )??;
        let (offset, len) = (self.out.0 as usize, self.out.1 as usize);
        Ok(memory[offset..offset + len].to_vec())
    }

    /// A copy with other launch counts.
    pub fn with_launches(&self, warmup: u32, repeats: u32) -> Plan {
        Plan {
            warmup,
            repeats,
            ..self.clone()
        }
    }
}

/// The ABI record of one argument: (tag, aux, value).
fn record(arg: &KernelArg) -> (u32, u32, u64) {
    match *arg {
        KernelArg::I32(v) => (tag::I32, 0, u64::from(v as u32)),
        KernelArg::U32(v) => (tag::U32, 0, u64::from(v)),
        KernelArg::I64(v) => (tag::I64, 0, v as u64),
        KernelArg::U64(v) => (tag::U64, 0, v),
        KernelArg::F32(v) => (tag::F32, 0, u64::from(v.to_bits())),
        KernelArg::F64(v) => (tag::F64, 0, v.to_bits()),
        KernelArg::Buffer { offset, len } => (tag::BUFFER, len as u32, offset),
    }
}

/// A plan for `blueprint` over `shape`, with buffers filled from `seed`.
pub fn blueprint_plan(blueprint: &Blueprint, shape: Shape, seed: u32) -> anyhow::Result<Plan> {
    let elements = blueprint
        .buffer_elements(&shape)
        .into_iter()
        .collect::<Option<Vec<u64>>>()
        .with_context(|| format!("{blueprint} over {shape:?}: buffers too large"))?;
    if elements.is_empty() {
        bail!("{blueprint} does not take {shape:?}");
    }
    let mut scalars = shape.sizes().into_iter();
    let dtype = blueprint.dtype();
    let mut layout = Layout::new();
    let mut args = Vec::new();
    let mut fills = Vec::new();
    let last = elements.len() - 1;
    let mut buffers = elements.iter().enumerate();
    let mut out = (0, 0);
    for param in blueprint.params() {
        match param.kind {
            ParamKind::Input | ParamKind::Output => {
                let (i, count) = buffers.next().context("a buffer per buffer parameter")?;
                let arg = layout.take(4 * count);
                let (offset, len) = offset_len(&arg);
                let fill = if i == last {
                    out = (offset, len);
                    Fill::Byte(0xA5)
                } else if dtype == Dtype::F32 {
                    Fill::F32(seed.wrapping_mul(31).wrapping_add(i as u32 + 1))
                } else {
                    Fill::I32(seed.wrapping_mul(31).wrapping_add(i as u32 + 1))
                };
                fills.push((offset, len, fill));
                args.push(arg);
            }
            ParamKind::U32 => args.push(KernelArg::U32(
                scalars.next().context("a size per u32 parameter")?,
            )),
            ParamKind::F32 => args.push(KernelArg::F32(1.75)),
            ParamKind::I32 => args.push(KernelArg::I32(-3)),
        }
    }
    let config = blueprint.launch_config(&shape)?;
    let plan = Plan {
        name: format!("{}@{}", blueprint.descriptor(), shape_text(&shape)),
        descriptor: blueprint.descriptor(),
        config,
        args,
        fills,
        out,
        out_type: match dtype {
            Dtype::F32 => OutType::F32,
            Dtype::I32 => OutType::I32,
        },
        pages: layout.pages(),
        warmup: 1,
        repeats: 0,
    };
    blueprint
        .validate_launch(&plan.config, &plan.args, plan.memory_bytes() as usize)
        .with_context(|| format!("plan {} is not a valid launch", plan.name))?;
    Ok(plan)
}

/// A plan for a builtin kernel: `vector_add`/`scale` over `dims[0]` elements, `matmul` over
/// `dims = [m, n, k]`.
pub fn builtin_plan(kernel: BuiltinKernel, dims: [u32; 3], seed: u32) -> Plan {
    let mut layout = Layout::new();
    let f32_in = |layout: &mut Layout, count: u64, i: u32, fills: &mut Vec<(u64, u64, Fill)>| {
        let arg = layout.take(4 * count);
        let (offset, len) = offset_len(&arg);
        fills.push((
            offset,
            len,
            Fill::F32(seed.wrapping_mul(31).wrapping_add(i)),
        ));
        arg
    };
    let mut fills = Vec::new();
    let (args, config, shape) = match kernel {
        BuiltinKernel::VectorAdd => {
            let n = dims[0];
            let a = f32_in(&mut layout, n.into(), 1, &mut fills);
            let b = f32_in(&mut layout, n.into(), 2, &mut fills);
            let out = layout.take(4 * u64::from(n));
            (
                vec![a, b, out, KernelArg::U32(n)],
                LaunchConfig::linear(n, 256),
                format!("n{n}"),
            )
        }
        BuiltinKernel::Scale => {
            let n = dims[0];
            let x = f32_in(&mut layout, n.into(), 1, &mut fills);
            let out = layout.take(4 * u64::from(n));
            (
                vec![x, out, KernelArg::F32(0.75), KernelArg::U32(n)],
                LaunchConfig::linear(n, 256),
                format!("n{n}"),
            )
        }
        BuiltinKernel::Matmul => {
            let [m, n, k] = dims;
            let a = f32_in(&mut layout, u64::from(m) * u64::from(k), 1, &mut fills);
            let b = f32_in(&mut layout, u64::from(k) * u64::from(n), 2, &mut fills);
            let c = layout.take(4 * u64::from(m) * u64::from(n));
            (
                vec![
                    a,
                    b,
                    c,
                    KernelArg::U32(m),
                    KernelArg::U32(n),
                    KernelArg::U32(k),
                ],
                LaunchConfig::grid_2d(n, m, [16, 16]),
                format!("{m}x{n}x{k}"),
            )
        }
    };
    let out_index = if kernel == BuiltinKernel::Scale { 1 } else { 2 };
    let out = offset_len(&args[out_index]);
    fills.push((out.0, out.1, Fill::Byte(0xA5)));
    Plan {
        name: format!("{}@{shape}", kernel.descriptor()),
        descriptor: kernel.descriptor().to_owned(),
        config,
        args,
        fills,
        out,
        out_type: OutType::F32,
        pages: layout.pages(),
        warmup: 1,
        repeats: 0,
    }
}

fn shape_text(shape: &Shape) -> String {
    match shape {
        Shape::Elements { n } => format!("n{n}"),
        Shape::Rows { rows, cols } => format!("{rows}x{cols}"),
        Shape::Matmul { m, n, k } => format!("{m}x{n}x{k}"),
        Shape::Conv2d { n, c, h, w, k } => format!("n{n}c{c}h{h}w{w}k{k}"),
        other => other
            .sizes()
            .iter()
            .map(u32::to_string)
            .collect::<Vec<_>>()
            .join("x"),
    }
}

/// Every blueprint kind of the conformance set (`tensor_wasm_jit::conformance::blueprint_kinds`)
/// in f32 and i32 (where defined) with `shapes` shapes
/// each (1 or 2), then the builtins.
pub fn catalogue(shapes: usize) -> anyhow::Result<Vec<Plan>> {
    let mut plans = Vec::new();
    for kernel in blueprint_kinds() {
        for dtype in ["f32", "i32"] {
            let Ok(blueprint) = Blueprint::parse(&format!("{kernel}:{dtype}")) else {
                continue; // elementwise[div] is f32 only
            };
            let candidates = blueprint.suite_shapes();
            for shape in candidates.into_iter().take(shapes) {
                let seed = seed_of(&format!("{blueprint}@{shape:?}"));
                plans.push(blueprint_plan(&blueprint, shape, seed)?);
            }
        }
    }
    let builtin_dims: [(BuiltinKernel, [[u32; 3]; 2]); 3] = [
        (BuiltinKernel::VectorAdd, [[1003, 0, 0], [70_001, 0, 0]]),
        (BuiltinKernel::Scale, [[1003, 0, 0], [70_001, 0, 0]]),
        (BuiltinKernel::Matmul, [[37, 53, 29], [130, 96, 257]]),
    ];
    for (kernel, dims) in builtin_dims {
        for d in dims.into_iter().take(shapes) {
            plans.push(builtin_plan(kernel, d, seed_of(&format!("{kernel}@{d:?}"))));
        }
    }
    Ok(plans)
}

/// A fill seed that depends on the case alone (FNV-1a of its name), so that a case has the
/// same inputs whichever other cases run.
fn seed_of(name: &str) -> u32 {
    name.bytes().fold(0x811c_9dc5u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    })
}

/// Hostile plans: buffers outside guest memory or smaller than the shape claims. Each must be
/// refused with `INVALID_ARGUMENT` before anything is launched.
pub fn hostile_plans() -> Vec<Plan> {
    let base = builtin_plan(BuiltinKernel::VectorAdd, [1024, 0, 0], 99);
    let end = base.memory_bytes();
    let mut past_end = base.clone();
    past_end.name = "hostile: output buffer runs past the end of guest memory".into();
    past_end.args[2] = KernelArg::Buffer {
        offset: end - 16,
        len: 4096,
    };
    let mut far = base.clone();
    far.name = "hostile: input buffer at an offset far outside guest memory".into();
    far.args[0] = KernelArg::Buffer {
        offset: 0xFFFF_FFFF_0000,
        len: 4096,
    };
    let mut shape = base;
    shape.name = "hostile: n larger than the buffers (kernel would read past them)".into();
    shape.args[3] = KernelArg::U32(1 << 30);
    shape.config = LaunchConfig::linear(1 << 20, 256);
    vec![past_end, far, shape]
}

/// What the launcher wrote.
#[derive(Debug)]
pub struct GuestRun {
    pub status: i32,
    pub message: String,
    pub timings_ns: Vec<u64>,
    pub out: Vec<u8>,
}

/// Parses the launcher's stdout.
pub fn parse_output(stdout: &[u8]) -> anyhow::Result<GuestRun> {
    let word = |at: usize| -> anyhow::Result<u32> {
        stdout
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| anyhow!("launcher output is {} bytes, too short", stdout.len()))
    };
    let status = word(0)? as i32;
    let count = word(4)? as usize;
    let message_len = word(8)? as usize;
    let mut at = 12;
    let message = stdout
        .get(at..at + message_len)
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .ok_or_else(|| anyhow!("launcher output ends inside the message"))?;
    at += message_len;
    let timings = stdout
        .get(at..at + 8 * count)
        .ok_or_else(|| anyhow!("launcher output ends inside the timings"))?;
    let timings_ns = timings
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    at += 8 * count;
    Ok(GuestRun {
        status,
        message,
        timings_ns,
        out: stdout[at..].to_vec(),
    })
}

/// Elements of `got` that differ from `want` (f32: by bits, any NaN equal to any NaN), and
/// the first such index.
pub fn compare(out_type: OutType, got: &[u8], want: &[u8]) -> (usize, Option<usize>) {
    if got.len() != want.len() {
        return (want.len().max(got.len()) / 4, Some(0));
    }
    let mut bad = 0;
    let mut first = None;
    for (i, (g, w)) in got.chunks_exact(4).zip(want.chunks_exact(4)).enumerate() {
        let same = match out_type {
            OutType::I32 => g == w,
            OutType::F32 => {
                let (g, w) = (
                    f32::from_le_bytes(g.try_into().expect("4")),
                    f32::from_le_bytes(w.try_into().expect("4")),
                );
                g.to_bits() == w.to_bits() || (g.is_nan() && w.is_nan())
            }
        };
        if !same {
            bad += 1;
            first.get_or_insert(i);
        }
    }
    (bad, first)
}

/// SHA-256 of the output with every f32 NaN made canonical (so records from different
/// devices compare equal exactly when [`compare`] finds no difference).
pub fn digest(out_type: OutType, bytes: &[u8]) -> String {
    let mut hasher = Sha256::new();
    for word in bytes.chunks(4) {
        let canonical: [u8; 4] = match (out_type, <[u8; 4]>::try_from(word)) {
            (OutType::F32, Ok(w)) if f32::from_le_bytes(w).is_nan() => 0x7fc0_0000u32.to_le_bytes(),
            (_, Ok(w)) => w,
            (_, Err(_)) => {
                hasher.update(word);
                continue;
            }
        };
        hasher.update(canonical);
    }
    hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
