//! Per-store state of one invocation: the store data every host import sees
//! ([`InvocationState`]: memory limiter, WASI context, guest GPU, stream I/O),
//! the quiet WASI context of export calls, and the mapping of a guest's error
//! to a [`RuntimeError`].
//!
//! Nothing here depends on [`Runtime`](crate::Runtime): the host imports
//! (`guest_gpu`, `stream`) and the invocation paths (`runtime`, `snapshot`)
//! build on this module instead of reaching into `runtime`.

use std::time::Instant;

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
    /// When the invocation must end: the epoch deadline stops guest code, and
    /// host calls that can block (kernel launches, `emit_chunk`) give up here.
    pub(crate) deadline: Instant,
    limiter: InvocationLimiter,
    wasi: Option<WasiP1Ctx>,
    pub(crate) gpu: Option<GuestGpu>,
    pub(crate) stream: Option<crate::stream::StreamIo>,
    /// The `wasi-nn` state, for modules importing `wasi_ephemeral_nn`.
    pub(crate) nn: Option<crate::nn::NnHost>,
    /// The guest's own spans (`tw:trace`).
    pub(crate) spans: crate::guest_trace::GuestSpans,
    /// Guest memory in CUDA managed memory, counted as device memory held.
    pub(crate) device_memory: Option<crate::accounting::DeviceHold>,
}

/// Enforces the function's memory limit and remembers that it did.
struct InvocationLimiter {
    memory_limit: usize,
    /// What `wasi-nn` holds for the invocation, under the same limit.
    host: std::sync::Arc<crate::nn::HostBytes>,
    hit: Option<String>,
    /// An inline call's caps (memory bytes); `None` off the async threads.
    inline_memory_cap: Option<usize>,
    /// Whether an inline call tried to pass its caps (it is then run again on
    /// a blocking thread, not failed).
    inline_cap_hit: bool,
}

/// Table elements any instance may have; generous for real programs, bounded for hostile ones.
pub(crate) const MAX_TABLE_ELEMENTS: usize = 1 << 20;

/// Table elements an inline call's instance may have (a larger table is more
/// to initialise and reset on an async thread).
pub const INLINE_MAX_TABLE_ELEMENTS: usize = 1 << 16;

/// The trap that cuts an inline call short at its caps.
#[derive(Debug, thiserror::Error)]
#[error("an inline call may not grow past its caps; it runs again on a blocking thread")]
pub(crate) struct InlineCapExceeded;

/// Refuses a memory or table growth past a limit: the message is kept in `hit` (the
/// invocation's error reports it) and traps the guest.
pub(crate) fn refuse_growth(hit: &mut Option<String>, message: String) -> wasmtime::Result<bool> {
    *hit = Some(message.clone());
    Err(wasmtime::Error::msg(message))
}

impl ResourceLimiter for InvocationLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if self.inline_memory_cap.is_some_and(|cap| desired > cap) {
            self.inline_cap_hit = true;
            return Err(wasmtime::Error::new(InlineCapExceeded));
        }
        let held = self.host.held();
        if desired.saturating_add(held) <= self.memory_limit {
            self.host.set_others(desired);
            return Ok(true);
        }
        let message = format!(
            "memory limit exceeded: the guest asked to grow linear memory from {current} to \
             {desired} bytes (wasi-nn holds {held} more); the function's limit is {} bytes",
            self.memory_limit
        );
        refuse_growth(&mut self.hit, message)
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if self.inline_memory_cap.is_some() && desired > INLINE_MAX_TABLE_ELEMENTS {
            self.inline_cap_hit = true;
            return Err(wasmtime::Error::new(InlineCapExceeded));
        }
        if desired <= MAX_TABLE_ELEMENTS {
            return Ok(true);
        }
        let message = format!(
            "table limit exceeded: the guest asked to grow a table from {current} to {desired} \
             elements; the limit is {MAX_TABLE_ELEMENTS}"
        );
        refuse_growth(&mut self.hit, message)
    }
}

impl InvocationState {
    /// The state of an invocation whose linear memory may grow to
    /// `memory_limit_bytes`, with its WASI context and guest GPU (when the
    /// module imports them); no stream until the caller connects one.
    pub(crate) fn new(
        memory_limit_bytes: u64,
        deadline: Instant,
        wasi: Option<WasiP1Ctx>,
        gpu: Option<GuestGpu>,
    ) -> Self {
        InvocationState {
            deadline,
            limiter: InvocationLimiter {
                memory_limit: usize::try_from(memory_limit_bytes).unwrap_or(usize::MAX),
                host: crate::nn::HostBytes::new(memory_limit_bytes),
                hit: None,
                inline_memory_cap: None,
                inline_cap_hit: false,
            },
            wasi,
            gpu,
            stream: None,
            nn: None,
            spans: crate::guest_trace::GuestSpans::default(),
            device_memory: None,
        }
    }

    /// What `wasi-nn` charges its models and arenas to: the function's memory limit, shared
    /// with linear memory.
    pub(crate) fn host_bytes(&self) -> std::sync::Arc<crate::nn::HostBytes> {
        self.limiter.host.clone()
    }

    /// The WASI context, for the linker's WASI imports.
    pub(crate) fn wasi(&mut self) -> &mut WasiP1Ctx {
        self.wasi
            .as_mut()
            .expect("stores of modules importing WASI always carry a WASI context")
    }

    /// Caps this (inline) call: no memory past `memory_bytes`, no table past
    /// [`INLINE_MAX_TABLE_ELEMENTS`]; passing them cuts the call short.
    pub(crate) fn cap_for_inline(&mut self, memory_bytes: u64) {
        self.limiter.inline_memory_cap = Some(usize::try_from(memory_bytes).unwrap_or(usize::MAX));
    }

    /// Whether this inline call was cut short at its caps.
    pub(crate) fn inline_cap_hit(&self) -> bool {
        self.limiter.inline_cap_hit
    }

    /// The limiter the store consults when the guest grows memory or tables.
    pub(crate) fn limiter(&mut self) -> &mut dyn ResourceLimiter {
        &mut self.limiter
    }
}

/// A host call gave up because the invocation's deadline passed (it ends as
/// a timeout, like guest code past its epoch deadline).
#[derive(Debug, thiserror::Error)]
#[error("the invocation's deadline passed during a host call")]
pub(crate) struct DeadlineExceeded;

/// A WASI context for export-style functions: no stdin, output only logged.
pub(crate) fn quiet_wasi(name: &str, stderr_cap: usize) -> WasiP1Ctx {
    WasiCtxBuilder::new()
        .stdout(MemoryOutputPipe::new(stderr_cap))
        .stderr(MemoryOutputPipe::new(stderr_cap))
        .monotonic_clock(crate::wasi_poll::ProcessClock)
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
    classify_error(err, limits)
}

/// [`classify`] for a guest failure whose store has no limit hit to report.
pub(crate) fn classify_error(err: wasmtime::Error, limits: &FunctionLimits) -> RuntimeError {
    if let Some(busy) = err.downcast_ref::<DispatchError>() {
        return RuntimeError::Busy(busy.to_string());
    }
    if err.downcast_ref::<DeadlineExceeded>().is_some() {
        return RuntimeError::Timeout {
            timeout_ms: limits.timeout_ms,
        };
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
