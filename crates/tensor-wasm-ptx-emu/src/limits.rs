//! What bounds a launch: the host's cancel word, which a running launch reads and which the
//! interpreter checks itself, and the host memory one block's threads may hold.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use crate::parse::Func;

/// A word of device memory the host writes while the launch runs: the kernel reads it as a
/// `u32` at `address` (`flag`'s value: an [`AtomicBool`] reads as 1 once set, an
/// [`AtomicU32`] — a word of live host memory — as what it holds) and sees the host's write
/// at its next read, as a running kernel sees a host write to mapped memory; the kernel
/// cannot write it (an illegal address). The interpreter also checks `flag` itself every
/// [`CANCEL_CHECK`] instructions of a thread that has not read the word in that many, and
/// ends a launch whose flag is set with [`crate::EmuError::Cancelled`]: a kernel that never reads the
/// word still ends, and one that polls it ends by its own poll.
#[derive(Debug, Clone, Copy)]
pub struct CancelWord<'a> {
    /// Device address of the word (4-byte aligned, outside every allocation).
    pub address: u64,
    /// Set by the host to cancel the launch (non-zero: cancelled).
    pub flag: &'a dyn CancelFlag,
}

/// What a [`CancelWord`] reads.
pub trait CancelFlag: std::fmt::Debug + Sync {
    /// The word's value now.
    fn value(&self) -> u32;
}

impl CancelFlag for AtomicBool {
    fn value(&self) -> u32 {
        u32::from(self.load(Ordering::Acquire))
    }
}

impl CancelFlag for AtomicU32 {
    fn value(&self) -> u32 {
        self.load(Ordering::Acquire)
    }
}

impl CancelWord<'_> {
    /// The word's value.
    pub(crate) fn value(&self) -> u32 {
        self.flag.value()
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
