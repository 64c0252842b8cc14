//! A PTX interpreter and checker: the tests run the PTX TensorWasm emits in it without a GPU,
//! and it reports what compute-sanitizer would; the CPU backend runs tenant PTX in it, where
//! its checks keep a kernel inside the guest memory it was given.
//!
//! It understands the PTX subset our kernels use (see [`Module::parse`]; anything else is a
//! clear [`EmuError::Unsupported`]) with the ISA's semantics: `.rn` f32 arithmetic (`div`
//! and `sqrt` included) rounded once per instruction (`fma` fused, nothing else contracted),
//! no approximate (`.approx`) or flush-to-zero (`.ftz`) forms, wrapping integer arithmetic,
//! clamped shifts, predicates, vector loads and stores, module- and function-level `.shared`,
//! `bar.sync`, the special registers of 3-D grids and blocks.
//!
//! A launch ([`launch`]) runs the threads of each block as green threads: each runs until it
//! reaches `bar.sync` or exits, then the next, in the order a [`Schedule`] picks. It checks:
//! - every global access against the allocations the launch may touch
//!   ([`EmuError::IllegalAddress`], [`EmuError::Misaligned`]), and every shared and param
//!   access against its space;
//! - shared-memory races: two threads of a block touching one byte between two barriers,
//!   at least one writing ([`EmuError::SharedRace`]);
//! - barrier deadlocks: threads waiting while others exited, or waiting at different
//!   barriers ([`EmuError::Deadlock`]); and runaway loops ([`EmuError::StepLimit`]).
//!
//! The API is plain data in and a `Result` out, so a stand-in driver can call it
//! ([`Kernel::params`] answers `cuFuncGetParamInfo`, [`Kernel::pack_params`] packs
//! `cuLaunchKernel`'s arguments, [`EmuError::cuda_result`] names the driver error).
//!
//! ```
//! use tensor_wasm_ptx_emu::{launch, Allocation, Launch, Module, Schedule};
//!
//! let ptx = r#"
//! .version 8.0
//! .target sm_80
//! .address_size 64
//! .visible .entry twice(.param .u64 p_out)
//! {
//!     .reg .b32 %r<4>;
//!     .reg .b64 %rd<4>;
//!     mov.u32 %r1, %tid.x;
//!     shl.b32 %r2, %r1, 1;
//!     ld.param.u64 %rd1, [p_out];
//!     mul.wide.u32 %rd2, %r1, 4;
//!     add.u64 %rd1, %rd1, %rd2;
//!     st.global.u32 [%rd1], %r2;
//!     ret;
//! }
//! "#;
//! let module = Module::parse(ptx)?;
//! let kernel = module.kernel("twice").expect("entry");
//! let mut out = [0u8; 16];
//! let base = 0x1000u64;
//! let params = kernel.pack_params(&[&base.to_le_bytes()])?;
//! let config = Launch::new([1, 1, 1], [4, 1, 1], &params);
//! launch(kernel, &config, &mut [Allocation { base, bytes: &mut out }])?;
//! assert_eq!(out[12], 6);
//! // One thread too many writes past the allocation: an error, not a crash.
//! let config = Launch::new([1, 1, 1], [5, 1, 1], &params).schedule(Schedule::Reversed);
//! let error = launch(kernel, &config, &mut [Allocation { base, bytes: &mut out }]);
//! assert!(error.unwrap_err().to_string().contains("illegal address 0x1010"));
//! # Ok::<(), tensor_wasm_ptx_emu::EmuError>(())
//! ```

mod access;
mod decl;
mod decode;
mod exec;
mod ir;
pub mod lex;
mod limits;
mod memory;
mod ops;
mod parse;
mod schedule;
mod warp;

use std::fmt;

pub use exec::{check_launch, launch, Allocation, Launch, LaunchStats, Schedule};
pub use limits::{CancelFlag, CancelWord, BLOCK_MEMORY, CANCEL_CHECK};
pub use memory::{LOCAL_WINDOW, SHARED_BASE, SHARED_WINDOW};
pub use parse::{Kernel, Module, ParamInfo};

/// Why a module did not parse or a launch failed. Every message names what it is about
/// (kernel, block, thread, source line, address) so a test failure reads like a sanitizer
/// report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EmuError {
    /// The text is not PTX this parser reads.
    #[error("PTX line {line}: {message}")]
    Parse {
        /// 1-based source line.
        line: u32,
        /// What is wrong.
        message: String,
    },
    /// Valid PTX outside the subset this interpreter implements.
    #[error("PTX line {line}: unsupported: {what}")]
    Unsupported {
        /// 1-based source line.
        line: u32,
        /// The construct.
        what: String,
    },
    /// The launch itself is malformed (dimensions, parameter bytes, allocations).
    #[error("invalid launch of {kernel}: {reason}")]
    InvalidLaunch {
        /// Entry name.
        kernel: String,
        /// What is wrong.
        reason: String,
    },
    /// A global access outside every allowed allocation.
    #[error("{at}: illegal address {address:#x} ({size}-byte {kind})")]
    IllegalAddress {
        /// Kernel, block, thread and line.
        at: Place,
        /// First byte accessed.
        address: u64,
        /// Bytes accessed.
        size: u32,
        /// `global load`, `shared store`, ...
        kind: String,
    },
    /// An access whose address is not a multiple of its size.
    #[error("{at}: misaligned address {address:#x} ({size}-byte {kind})")]
    Misaligned {
        /// Kernel, block, thread and line.
        at: Place,
        /// First byte accessed.
        address: u64,
        /// Bytes accessed.
        size: u32,
        /// `global load`, `shared store`, ...
        kind: String,
    },
    /// Two threads of a block touched one shared byte between two barriers, one writing.
    #[error(
        "{at}: shared-memory race at shared address {offset:#x} with thread {other:?} ({what})"
    )]
    SharedRace {
        /// The second access: kernel, block, thread and line.
        at: Place,
        /// Shared address (the block's shared memory starts at [`SHARED_BASE`]).
        offset: u64,
        /// The thread that touched it first.
        other: [u32; 3],
        /// `write after read`, ...
        what: String,
    },
    /// Threads of a block wait at a barrier that cannot complete.
    #[error("barrier deadlock in {kernel} block {block:?}: {detail}")]
    Deadlock {
        /// Entry name.
        kernel: String,
        /// Block index.
        block: [u32; 3],
        /// Who waits where, and who exited.
        detail: String,
    },
    /// A thread ran more instructions than the launch allows (a runaway loop).
    #[error("{at}: more than {limit} instructions in one thread")]
    StepLimit {
        /// Kernel, block, thread and line.
        at: Place,
        /// The limit.
        limit: u64,
    },
    /// The host set the launch's cancel flag ([`CancelWord`]) and a thread ran on: the
    /// interpreter's own check ended the launch.
    #[error("{at}: cancelled by the host (the launch's cancel word was set)")]
    Cancelled {
        /// Kernel, block, thread and line where the check found the flag set.
        at: Place,
    },
    /// Calls nested deeper than the interpreter allows, or more local memory than a thread
    /// may have (runaway recursion).
    #[error(
        "{at}: call depth over {limit} (nested calls), or more local memory or registers than \
         one thread may hold"
    )]
    CallDepth {
        /// Kernel, block, thread and line of the call.
        at: Place,
        /// Most nested calls.
        limit: u32,
    },
    /// An instruction whose result the ISA leaves unspecified (integer division by zero).
    #[error("{at}: {what}")]
    Undefined {
        /// Kernel, block, thread and line.
        at: Place,
        /// What happened.
        what: String,
    },
}

impl EmuError {
    /// The CUDA driver result a stand-in driver should report for this error: its `CUresult`
    /// value and name. Faults a GPU would report map to theirs (illegal and misaligned
    /// addresses); faults only this checker sees (races, divergent barriers, unspecified
    /// results) are launch failures; PTX outside the subset is "not supported".
    pub fn cuda_result(&self) -> (u32, &'static str) {
        match self {
            EmuError::Parse { .. } => (218, "CUDA_ERROR_INVALID_PTX"),
            EmuError::Unsupported { .. } => (801, "CUDA_ERROR_NOT_SUPPORTED"),
            EmuError::InvalidLaunch { .. } => (1, "CUDA_ERROR_INVALID_VALUE"),
            EmuError::IllegalAddress { .. } => (700, "CUDA_ERROR_ILLEGAL_ADDRESS"),
            EmuError::Misaligned { .. } => (716, "CUDA_ERROR_MISALIGNED_ADDRESS"),
            EmuError::StepLimit { .. } | EmuError::Cancelled { .. } => {
                (702, "CUDA_ERROR_LAUNCH_TIMEOUT")
            }
            EmuError::SharedRace { .. }
            | EmuError::Deadlock { .. }
            | EmuError::CallDepth { .. }
            | EmuError::Undefined { .. } => (719, "CUDA_ERROR_LAUNCH_FAILED"),
        }
    }
}

/// Where in a launch something happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Place {
    /// Entry name.
    pub kernel: String,
    /// Block index (`%ctaid`).
    pub block: [u32; 3],
    /// Thread index (`%tid`).
    pub thread: [u32; 3],
    /// 1-based source line of the instruction.
    pub line: u32,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} block {:?} thread {:?} (PTX line {})",
            self.kernel, self.block, self.thread, self.line
        )
    }
}
