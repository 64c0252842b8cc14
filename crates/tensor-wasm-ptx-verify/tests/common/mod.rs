//! Running a case of the conformance set in the interpreter, plainly or fenced: the launch
//! is given the guest memory (its window) and the cancel word, nothing else. The
//! `FOREIGN` bytes on each side of the window stand for another tenant's memory: they are
//! not given to the launch, so the interpreter reports any read or write of them (or of
//! any other address outside the two allocations) as an illegal address.

#![allow(dead_code)]

use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use tensor_wasm_jit::conformance::CudaCase;
use tensor_wasm_ptx_emu::{launch, Allocation, EmuError, Launch, Module, Schedule};

/// Device address of guest-memory byte 0.
pub const BASE: u64 = 0x7f00_0000_0000;
/// Bytes of foreign memory on each side of the window; the cancel word lies after it.
pub const FOREIGN: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// The tenant's own module.
    Plain,
    /// The fenced module, given the hidden parameters.
    Fenced,
    /// The fenced module as a backend runs it: the lean entry when the launch-time proof
    /// admits the launch, else the fenced entry.
    Checked,
}

/// What a launch left.
pub struct Outcome {
    pub memory: Vec<u8>,
    /// Instructions the launch executed (guarded-off ones included).
    pub instructions: u64,
    /// In `Checked` mode, whether the lean entry ran.
    pub lean: bool,
}

/// The packed parameters of `args` (buffers become device addresses).
pub fn pack(args: &[KernelArg]) -> Vec<Vec<u8>> {
    args.iter().map(|arg| arg.param_bytes(BASE)).collect()
}

/// Runs `case`'s launch of `module` (its entry named like the case's kernel) with these
/// packed arguments over this guest memory.
pub fn run_with(
    module: &Module,
    plan: Option<&tensor_wasm_ptx_verify::Plan>,
    case: &CudaCase,
    args: &[Vec<u8>],
    memory: &[u8],
    mode: Mode,
    schedule: Schedule,
) -> Result<Outcome, EmuError> {
    let launch = Launched {
        entry: case.kernel.entry,
        plan,
        config: &case.config,
        args,
        memory,
    };
    run_launch(module, &launch, mode, schedule)
}

/// What one launch runs: the entry, its configuration and packed arguments, the memory.
pub struct Launched<'a> {
    pub entry: &'a str,
    /// The launch-time proof of the entry (`Checked` mode).
    pub plan: Option<&'a tensor_wasm_ptx_verify::Plan>,
    pub config: &'a LaunchConfig,
    pub args: &'a [Vec<u8>],
    pub memory: &'a [u8],
}

/// Runs one launch of `module`, plainly or fenced.
pub fn run_launch(
    module: &Module,
    launched: &Launched<'_>,
    mode: Mode,
    schedule: Schedule,
) -> Result<Outcome, EmuError> {
    let (case_config, args, memory) = (launched.config, launched.args, launched.memory);
    let mut memory = memory.to_vec();
    let window = memory.len() as u64;
    let mut entry = launched.entry.to_owned();
    let mut lean = false;
    if mode == Mode::Checked {
        let plan = launched.plan.expect("a checked launch has its plan");
        let facts = tensor_wasm_ptx_verify::LaunchFacts {
            params: args,
            grid: case_config.grid,
            block: case_config.block,
            dynamic_shared: tensor_wasm_ptx_verify::dynamic_shared_bytes(case_config.shared_bytes),
            window: (BASE, BASE + window),
        };
        if plan.admit(&facts).is_ok() {
            entry = plan.lean_entry().to_owned();
            lean = true;
        }
    }
    let kernel = module
        .kernel(&entry)
        .expect("the launch's entry is in the module");
    let mut cancel = [0u8; 4];
    let cancel_at = BASE + window + FOREIGN as u64;
    let mut dynamic = case_config.shared_bytes;
    let mut values = args.to_vec();
    if mode != Mode::Plain {
        dynamic = tensor_wasm_ptx_verify::dynamic_shared_bytes(dynamic);
        let hidden = tensor_wasm_ptx_verify::hidden_args(BASE, BASE + window, dynamic, cancel_at);
        values.extend(hidden.iter().map(|v| v.to_le_bytes().to_vec()));
    }
    let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
    let params = kernel.pack_params(&refs)?;
    let mut config = Launch::new(case_config.grid, case_config.block, &params).schedule(schedule);
    config.dynamic_shared_bytes = dynamic;
    let stats = launch(
        kernel,
        &config,
        &mut [
            Allocation {
                base: BASE,
                bytes: &mut memory,
            },
            Allocation {
                base: cancel_at,
                bytes: &mut cancel,
            },
        ],
    )?;
    Ok(Outcome {
        memory,
        instructions: stats.instructions,
        lean,
    })
}

/// Runs `case` as the conformance set defines it.
pub fn run(
    module: &Module,
    plan: Option<&tensor_wasm_ptx_verify::Plan>,
    case: &CudaCase,
    mode: Mode,
    schedule: Schedule,
) -> Result<Outcome, EmuError> {
    run_with(
        module,
        plan,
        case,
        &pack(&case.args),
        &case.layout.memory,
        mode,
        schedule,
    )
}
