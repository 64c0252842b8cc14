//! Per-store state of one invocation: the store data every host import sees
//! ([`InvocationState`]: memory limiter, WASI context, guest GPU, stream I/O),
//! the quiet WASI context of export calls, and the mapping of a guest's error
//! to a [`RuntimeError`].
//!
//! Nothing here depends on [`Runtime`](crate::Runtime): the host imports
//! (`guest_gpu`, `stream`) and the invocation paths (`runtime`, `snapshot`)
//! build on this module instead of reaching into `runtime`.

use tensor_wasm_dispatch::DispatchError;
use wasmtime::{ResourceLimiter, Store, Trap};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::MemoryOutputPipe;
use wasmtime_wasi::WasiCtxBuilder;

use crate::error::{truncate_message, RuntimeError};
use crate::guest_gpu::GuestGpu;
use crate::store::FunctionLimits;

/// Per-store state of one invocation.
pub(crate) struct InvocationState {
    limiter: InvocationLimiter,
    wasi: Option<WasiP1Ctx>,
    pub(crate) gpu: Option<GuestGpu>,
    pub(crate) stream: Option<crate::stream::StreamIo>,
}

/// Enforces the function's memory limit and remembers that it did.
struct InvocationLimiter {
    memory_limit: usize,
    hit: Option<String>,
}

/// Table elements any instance may have; generous for real programs, bounded for hostile ones.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl ResourceLimiter for InvocationLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired <= self.memory_limit {
            return Ok(true);
        }
        let message = format!(
            "memory limit exceeded: the guest asked to grow linear memory from {current} to \
             {desired} bytes; the function's limit is {} bytes",
            self.memory_limit
        );
        self.hit = Some(message.clone());
        Err(wasmtime::Error::msg(message))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired <= MAX_TABLE_ELEMENTS {
            return Ok(true);
        }
        let message = format!(
            "table limit exceeded: the guest asked to grow a table from {current} to {desired} \
             elements; the limit is {MAX_TABLE_ELEMENTS}"
        );
        self.hit = Some(message.clone());
        Err(wasmtime::Error::msg(message))
    }
}

impl InvocationState {
    /// The state of an invocation whose linear memory may grow to
    /// `memory_limit_bytes`, with its WASI context and guest GPU (when the
    /// module imports them); no stream until the caller connects one.
    pub(crate) fn new(
        memory_limit_bytes: u64,
        wasi: Option<WasiP1Ctx>,
        gpu: Option<GuestGpu>,
    ) -> Self {
        InvocationState {
            limiter: InvocationLimiter {
                memory_limit: usize::try_from(memory_limit_bytes).unwrap_or(usize::MAX),
                hit: None,
            },
            wasi,
            gpu,
            stream: None,
        }
    }

    /// The WASI context, for the linker's WASI imports.
    pub(crate) fn wasi(&mut self) -> &mut WasiP1Ctx {
        self.wasi
            .as_mut()
            .expect("stores of modules importing WASI always carry a WASI context")
    }

    /// The limiter the store consults when the guest grows memory or tables.
    pub(crate) fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limiter
    }
}

/// A WASI context for export-style functions: no stdin, output only logged.
pub(crate) fn quiet_wasi(name: &str, stderr_cap: usize) -> WasiP1Ctx {
    WasiCtxBuilder::new()
        .stdout(MemoryOutputPipe::new(stderr_cap))
        .stderr(MemoryOutputPipe::new(stderr_cap))
        .arg(name)
        .build_p1()
}

/// Maps a wasmtime error from guest execution to a [`RuntimeError`].
pub(crate) fn classify(
    err: wasmtime::Error,
    store: &mut Store<InvocationState>,
    limits: &FunctionLimits,
) -> RuntimeError {
    if let Some(message) = store.data_mut().limiter.hit.take() {
        return RuntimeError::MemoryLimit(message);
    }
    if let Some(busy) = err.downcast_ref::<DispatchError>() {
        return RuntimeError::Busy(busy.to_string());
    }
    if err.downcast_ref::<crate::stream::ClientGone>().is_some() {
        return RuntimeError::ClientGone;
    }
    if let Some(withheld) = err.downcast_ref::<crate::error::RawPtxWithheld>() {
        return RuntimeError::RawPtxNotGranted(withheld.to_string());
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => RuntimeError::Timeout {
            timeout_ms: limits.timeout_ms,
        },
        Some(Trap::OutOfFuel) => RuntimeError::FuelExhausted(limits.fuel.unwrap_or(u64::MAX)),
        _ => RuntimeError::Trap(truncate_message(format!("{err:#}"))),
    }
}
