//! What bounds a launch: the host's cancel word, which a running launch reads and which the
//! interpreter checks itself, and the host memory one block's threads may hold.

use std::sync::atomic::{AtomicBool, Ordering};

use crate::parse::Func;

/// A word of device memory the host writes while the launch runs: the kernel reads it as a
/// `u32` at `address` (1 once `flag` is set, else 0) and sees the host's write at its next
/// read, as a running kernel sees a host write to mapped memory; the kernel cannot write it
/// (an illegal address). The interpreter also checks `flag` itself every
/// [`CANCEL_CHECK`] instructions of a thread that has not read the word in that many, and
/// ends a launch whose flag is set with [`crate::EmuError::Cancelled`]: a kernel that never reads the
/// word still ends, and one that polls it ends by its own poll.
#[derive(Debug, Clone, Copy)]
pub struct CancelWord<'a> {
    /// Device address of the word (4-byte aligned, outside every allocation).
    pub address: u64,
    /// Set by the host to cancel the launch.
    pub flag: &'a AtomicBool,
}

impl CancelWord<'_> {
    /// The word's value.
    pub(crate) fn value(&self) -> u32 {
        u32::from(self.flag.load(Ordering::Acquire))
    }
}

/// Instructions a thread executes between two checks of the launch's cancel flag.
pub const CANCEL_CHECK: u64 = 1 << 12;

/// Most host memory the threads of one block may hold at once: registers, parameters and
/// local memory of every frame. A thread may hold this divided by the block's threads (at
/// most 16 MiB); a launch whose entry alone needs more is refused, a call that
/// would take a thread past it fails as [`crate::EmuError::CallDepth`].
pub const BLOCK_MEMORY: u64 = 256 << 20;
/// Most host memory one thread may hold.
pub(crate) const MAX_THREAD_BYTES: u64 = 16 << 20;

/// The host memory one frame of `func` holds.
pub(crate) fn frame_cost(func: &Func) -> u64 {
    u64::from(func.regs) * 8
        + u64::from(func.preds)
        + u64::from(func.frame_bytes)
        + u64::from(func.local_bytes)
}
