//! Shared pieces of the conformance run: guest memory laid out with canary gaps, input
//! values (NaN, ±Inf, subnormals, full-range integers), launching a blueprint's PTX in the
//! interpreter and comparing it with the CPU, and the counters the summary prints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use tensor_wasm_jit::{Blueprint, Dtype, PtxTarget};
use tensor_wasm_ptx_emu::{launch, Allocation, EmuError, Launch, LaunchStats, Module, Schedule};

/// Device address of guest-memory byte 0 in the interpreter.
pub const BASE: u64 = 0x7f00_0000_0000;
/// Bytes that no kernel may touch (gaps between buffers, unused tails of outputs).
pub const CANARY: u32 = 0x5ac3_5ac3;

/// What the run exercised, for the summary line.
#[derive(Default)]
pub struct Counters {
    pub launches: AtomicU64,
    pub instructions: AtomicU64,
    pub threads: AtomicU64,
    pub kernels: Mutex<Vec<String>>,
}

pub static COUNTERS: Counters = Counters {
    launches: AtomicU64::new(0),
    instructions: AtomicU64::new(0),
    threads: AtomicU64::new(0),
    kernels: Mutex::new(Vec::new()),
};

impl Counters {
    pub fn record(&self, stats: &LaunchStats) {
        self.launches.fetch_add(1, Ordering::Relaxed);
        self.instructions
            .fetch_add(stats.instructions, Ordering::Relaxed);
        self.threads.fetch_add(stats.threads, Ordering::Relaxed);
    }

    pub fn kernel(&self, name: &str) {
        let mut kernels = self.kernels.lock().unwrap();
        if !kernels.iter().any(|k| k == name) {
            kernels.push(name.to_owned());
        }
    }
}

/// splitmix64, for input values.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    /// An f32's bits: special values, any bits, or ordinary values near 1 with full mantissas
    /// (where rounding differences show).
    pub fn f32_bits(&mut self) -> u32 {
        const SPECIAL: [u32; 14] = [
            0x0000_0000, // +0
            0x8000_0000, // -0
            0x3f80_0000, // 1
            0xbf80_0000, // -1
            0x7f80_0000, // +inf
            0xff80_0000, // -inf
            0x7fc0_0000, // NaN
            0x7fc0_0001, // NaN with a payload
            0xffc0_0000, // negative NaN
            0x0000_0001, // smallest subnormal
            0x807f_ffff, // largest negative subnormal
            0x0080_0000, // smallest normal
            0x7f7f_ffff, // largest finite
            0x3dcc_cccd, // 0.1
        ];
        match self.below(10) {
            0 => SPECIAL[self.below(SPECIAL.len() as u64) as usize],
            1 => self.next() as u32,
            _ => {
                let sign = (self.next() as u32 & 1) << 31;
                let exponent = 120 + self.below(15) as u32;
                sign | exponent << 23 | (self.next() as u32 & 0x007f_ffff)
            }
        }
    }

    /// An i32's bits: edge values or anything.
    pub fn i32_bits(&mut self) -> u32 {
        const SPECIAL: [i32; 6] = [0, 1, -1, i32::MIN, i32::MAX, 2];
        match self.below(5) {
            0 => SPECIAL[self.below(SPECIAL.len() as u64) as usize] as u32,
            1 => self.below(7) as u32,
            _ => self.next() as u32,
        }
    }
}

/// Guest memory: each buffer at a 64-byte-aligned offset after a canary gap, the whole
/// memory filled with [`CANARY`] before inputs are written.
pub struct Layout {
    pub memory: Vec<u8>,
    /// `(offset, len)` of each buffer, in parameter order.
    pub buffers: Vec<(usize, usize)>,
}

impl Layout {
    pub fn new(lens: &[usize]) -> Self {
        let mut offset = 64;
        let mut buffers = Vec::new();
        for &len in lens {
            buffers.push((offset, len));
            offset = (offset + len + 64).next_multiple_of(64);
        }
        let memory = CANARY.to_le_bytes().repeat(offset / 4);
        Layout { memory, buffers }
    }

    /// Fills the first `elements` of buffer `index` with values of `dtype`.
    pub fn fill(&mut self, index: usize, elements: usize, dtype: Dtype, rng: &mut Rng) {
        let (offset, len) = self.buffers[index];
        assert!(4 * elements <= len);
        for i in 0..elements {
            let bits = match dtype {
                Dtype::F32 => rng.f32_bits(),
                Dtype::I32 => rng.i32_bits(),
            };
            let at = offset + 4 * i;
            self.memory[at..at + 4].copy_from_slice(&bits.to_le_bytes());
        }
    }

    pub fn arg(&self, index: usize) -> KernelArg {
        let (offset, len) = self.buffers[index];
        KernelArg::Buffer {
            offset: offset as u64,
            len: len as u64,
        }
    }
}

/// The allowed allocations of a launch over `memory`: exactly the buffers, not the gaps.
pub fn allocations<'a>(memory: &'a mut [u8], buffers: &[(usize, usize)]) -> Vec<Allocation<'a>> {
    let mut sorted: Vec<(usize, usize)> = buffers.to_vec();
    sorted.sort_unstable();
    sorted.dedup();
    let mut rest = memory;
    let mut consumed = 0;
    let mut out = Vec::new();
    for (offset, len) in sorted {
        let (_, tail) = rest.split_at_mut(offset - consumed);
        let (bytes, tail) = tail.split_at_mut(len);
        out.push(Allocation {
            base: BASE + offset as u64,
            bytes,
        });
        rest = tail;
        consumed = offset + len;
    }
    out
}

/// The packed parameters of `args` (buffers become device addresses).
pub fn pack(args: &[KernelArg]) -> Vec<u8> {
    let mut out = Vec::new();
    for arg in args {
        let bytes: Vec<u8> = match *arg {
            KernelArg::Buffer { offset, .. } => (BASE + offset).to_le_bytes().to_vec(),
            KernelArg::U32(v) => v.to_le_bytes().to_vec(),
            KernelArg::I32(v) => v.to_le_bytes().to_vec(),
            KernelArg::F32(v) => v.to_bits().to_le_bytes().to_vec(),
            KernelArg::U64(v) => v.to_le_bytes().to_vec(),
            KernelArg::I64(v) => v.to_le_bytes().to_vec(),
            KernelArg::F64(v) => v.to_bits().to_le_bytes().to_vec(),
        };
        let align = bytes.len();
        out.resize(out.len().next_multiple_of(align), 0);
        out.extend_from_slice(&bytes);
    }
    out
}

/// Runs `entry` of `module` over a copy of `memory`, `buffers` being the allowed allocations.
pub fn run_emu(
    module: &Module,
    entry: &str,
    config: &LaunchConfig,
    args: &[KernelArg],
    memory: &[u8],
    buffers: &[(usize, usize)],
    schedule: Schedule,
) -> Result<Vec<u8>, EmuError> {
    let kernel = module.kernel(entry).expect("entry in module");
    let params = pack(args);
    let mut memory = memory.to_vec();
    let mut allocs = allocations(&mut memory, buffers);
    let mut launch_config = Launch::new(config.grid, config.block, &params).schedule(schedule);
    launch_config.step_limit = 1 << 20;
    let stats = launch(kernel, &launch_config, &mut allocs)?;
    COUNTERS.record(&stats);
    COUNTERS.kernel(entry);
    Ok(memory)
}

/// Word-by-word equality; for f32 data two NaNs are equal (the hardware writes its own NaN).
pub fn compare(dtype: Dtype, expected: &[u8], actual: &[u8]) -> Result<(), String> {
    for (i, (e, a)) in expected
        .chunks_exact(4)
        .zip(actual.chunks_exact(4))
        .enumerate()
    {
        let e = u32::from_le_bytes(e.try_into().unwrap());
        let a = u32::from_le_bytes(a.try_into().unwrap());
        let both_nan =
            dtype == Dtype::F32 && f32::from_bits(e).is_nan() && f32::from_bits(a).is_nan();
        if e != a && !both_nan {
            return Err(format!(
                "byte {}: expected {e:#010x} ({}), interpreter wrote {a:#010x} ({})",
                4 * i,
                f32::from_bits(e),
                f32::from_bits(a)
            ));
        }
    }
    Ok(())
}

/// Parsed modules of blueprints, emitted for the default target, parsed once.
pub struct Modules(Mutex<HashMap<String, std::sync::Arc<Module>>>);

impl Modules {
    pub fn new() -> Self {
        Modules(Mutex::new(HashMap::new()))
    }

    pub fn get(&self, blueprint: &Blueprint) -> std::sync::Arc<Module> {
        let mut map = self.0.lock().unwrap();
        map.entry(blueprint.descriptor())
            .or_insert_with(|| {
                let ptx = blueprint.emit_ptx(&PtxTarget::default());
                std::sync::Arc::new(
                    Module::parse(&ptx).unwrap_or_else(|e| panic!("{blueprint}: {e}")),
                )
            })
            .clone()
    }
}

/// One blueprint launch checked: the CPU results (one `CpuRun`, and the parts path when the
/// launch has one), then the interpreter under each schedule, each compared over the whole
/// memory (canaries included).
pub fn check_blueprint(
    blueprint: &Blueprint,
    module: &Module,
    config: &LaunchConfig,
    args: &[KernelArg],
    layout: &Layout,
    schedules: &[Schedule],
) -> Result<(), String> {
    let mut expected = layout.memory.clone();
    blueprint
        .run_cpu(config, args, &mut expected)
        .map_err(|e| format!("run_cpu refused the launch: {e}"))?;
    // The CPU backend's parts path (every core), when the launch has one: what the CPU
    // backend runs for separate buffers.
    let mut parted = layout.memory.clone();
    let parts = blueprint
        .cpu_parts(config, args, parted.len(), 3)
        .map_err(|e| format!("cpu_parts refused the launch: {e}"))?;
    let parted = match parts {
        Some(parts) => {
            parts
                .run_in_order(&mut parted)
                .map_err(|e| format!("the parts failed: {e}"))?;
            Some(parted)
        }
        None => None,
    };
    for &schedule in schedules {
        let actual = run_emu(
            module,
            &blueprint.entry_name(),
            config,
            args,
            &layout.memory,
            &layout.buffers,
            schedule,
        )
        .map_err(|e| format!("{schedule:?}: {e}"))?;
        compare(blueprint.dtype(), &expected, &actual).map_err(|e| format!("{schedule:?}: {e}"))?;
        if let Some(parted) = &parted {
            compare(blueprint.dtype(), parted, &actual)
                .map_err(|e| format!("{schedule:?}, the parts path: {e}"))?;
        }
    }
    Ok(())
}
