//! The error type shared by every allocation path of this crate.

/// Why a guest memory buffer could not be created, grown or steered.
#[derive(Debug, thiserror::Error)]
pub enum MemError {
    /// `mmap`, `mprotect` or `munmap` failed.
    #[error("host memory mapping failed: {0}")]
    Map(#[source] std::io::Error),

    /// The device does not have `requested` bytes plus the safety headroom free
    /// (see [`crate::device_headroom`]); nothing was allocated.
    #[error(
        "refusing to allocate {requested} bytes of managed memory: only {free} bytes \
         of device memory are free and a safety headroom must stay free"
    )]
    InsufficientDeviceMemory {
        /// Bytes asked for.
        requested: u64,
        /// Bytes the device reported free just before the request.
        free: u64,
    },

    /// A size exceeds a configured limit (or the address space).
    #[error("requested {requested} bytes but the limit is {cap} bytes")]
    TooLarge {
        /// Bytes asked for (for a linear memory: its declared minimum).
        requested: u64,
        /// The limit that applied.
        cap: u64,
    },

    /// Managed memory cannot carry guard pages or an oversized virtual
    /// reservation, so the engine must use explicit bounds checks.
    #[error(
        "managed (UVM) memory needs explicit bounds checks, but the engine asked for a \
         {reservation}-byte reservation and a {guard}-byte guard region; \
         configure the engine with `tensor_wasm_mem::configure_engine`"
    )]
    NeedsExplicitBoundsChecks {
        /// The reservation wasmtime asked for, in bytes.
        reservation: u64,
        /// The guard size wasmtime asked for, in bytes.
        guard: u64,
    },

    /// A CUDA driver call failed.
    #[error("CUDA driver call failed: {0}")]
    Cuda(String),
}

impl From<cudarc::driver::DriverError> for MemError {
    fn from(err: cudarc::driver::DriverError) -> Self {
        MemError::Cuda(err.to_string())
    }
}
