//! Shared pieces of the conformance run (the kernels, their cases and the guest memory with
//! canary gaps come from `tensor_wasm_jit::conformance`): launching a blueprint's PTX in the
//! interpreter and comparing it with the CPU, and the counters the summary prints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use tensor_wasm_jit::{Blueprint, Dtype, PtxTarget};
use tensor_wasm_ptx_emu::{launch, Allocation, EmuError, Launch, LaunchStats, Module, Schedule};

pub use tensor_wasm_jit::conformance::Layout;

/// Device address of guest-memory byte 0 in the interpreter.
pub const BASE: u64 = 0x7f00_0000_0000;

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
        let bytes = arg.param_bytes(BASE);
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
    launch_config.dynamic_shared_bytes = config.shared_bytes;
    let stats = launch(kernel, &launch_config, &mut allocs)?;
    COUNTERS.record(&stats);
    COUNTERS.kernel(entry);
    Ok(memory)
}

/// Word-by-word equality; for f32 data two NaNs are equal (the hardware writes its own NaN).
pub fn compare(dtype: Dtype, expected: &[u8], actual: &[u8]) -> Result<(), String> {
    match tensor_wasm_jit::conformance::first_difference(dtype, expected, actual) {
        None => Ok(()),
        Some(difference) => Err(format!("the interpreter's memory: {difference}")),
    }
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
