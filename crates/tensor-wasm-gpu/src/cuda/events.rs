//! Completion by events: the blocking-sync event recorded after each launch, and the waiter
//! thread of each lane, which waits for those events in submission order and reports each
//! launch's outcome to its [`Completion`](crate::Completion).

use std::ffi::c_uint;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Receiver;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{sys, CudaContext, CudaStream, DriverError};

use super::modules::ContextState;
use crate::completion::Signal;
use crate::error::driver_error_text;
use crate::GpuError;

/// A CUDA event created with `CU_EVENT_BLOCKING_SYNC` (and `CU_EVENT_DISABLE_TIMING` unless it
/// is `timed`): waiting on it puts the thread to sleep instead of spinning. (cudarc's
/// `CudaEvent` takes one flag only.)
pub(crate) struct BlockingEvent {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
    /// Created for timing: [`BlockingEvent::elapsed_since`] works on it.
    pub(crate) timed: bool,
}

/// Whether launches are timed on the device (`--cuda-timing-events`): an event recorded before
/// each kernel and its completion event, both with timing, and the time between them read
/// once the kernel has finished. Off by default: timing events cost the driver more than
/// events without.
static TIMING_EVENTS: AtomicBool = AtomicBool::new(false);

/// Turns device-side kernel timing on or off for launches from now on.
pub fn set_timing_events(on: bool) {
    TIMING_EVENTS.store(on, Ordering::Relaxed);
}

/// Whether launches are timed on the device.
pub(crate) fn timing_events() -> bool {
    TIMING_EVENTS.load(Ordering::Relaxed)
}

// SAFETY: a CUevent is a driver handle usable from any thread; this wrapper is its only owner.
unsafe impl Send for BlockingEvent {}

impl BlockingEvent {
    pub(crate) fn new(ctx: &Arc<CudaContext>, timed: bool) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let mut flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as c_uint;
        if !timed {
            flags |= sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
        }
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid place for the handle; the context is current.
        unsafe { sys::cuEventCreate(&mut raw, flags) }.result()?;
        Ok(Self {
            raw,
            ctx: ctx.clone(),
            timed,
        })
    }

    /// The device time from `start`'s record to this event's, both timed and completed.
    pub(crate) fn elapsed_since(&self, start: &BlockingEvent) -> Result<Duration, DriverError> {
        let mut ms = 0f32;
        // SAFETY: both events are alive, belong to the same context and have completed.
        unsafe { sys::cuEventElapsedTime_v2(&mut ms, start.raw, self.raw) }.result()?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1000.0))
    }

    /// The context the event belongs to.
    pub(crate) fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Records the work submitted to `stream` so far. The caller has bound the context.
    pub(crate) fn record(&self, stream: &CudaStream) -> Result<(), DriverError> {
        // SAFETY: both handles are alive and belong to `self.ctx`.
        unsafe { sys::cuEventRecord(self.raw, stream.cu_stream()) }.result()
    }

    /// Blocks (sleeping) until the recorded work has finished; returns its error, if any.
    pub(crate) fn synchronize(&self) -> Result<(), DriverError> {
        // SAFETY: the event is alive.
        unsafe { sys::cuEventSynchronize(self.raw) }.result()
    }
}

impl Drop for BlockingEvent {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the event is alive and owned by this wrapper; it is never used again.
            let _ = unsafe { sys::cuEventDestroy_v2(self.raw) };
        }
    }
}

/// Whether CUDA keeps `error` for the whole context: a kernel fault (illegal address or
/// instruction, trap, timeout, ...) after which every later call in that context fails too.
/// A real driver may report one at any later call (a launch, an event record), not only at
/// synchronization.
pub(super) fn is_sticky(error: &DriverError) -> bool {
    use sys::CUresult::*;
    matches!(
        error.0,
        CUDA_ERROR_ILLEGAL_ADDRESS
            | CUDA_ERROR_LAUNCH_TIMEOUT
            | CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUDA_ERROR_MISALIGNED_ADDRESS
            | CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUDA_ERROR_INVALID_PC
            | CUDA_ERROR_LAUNCH_FAILED
            | CUDA_ERROR_ASSERT
            | CUDA_ERROR_ECC_UNCORRECTABLE
    )
}

/// A launched kernel whose completion the waiter thread reports.
pub(super) struct PendingLaunch {
    pub(super) event: BlockingEvent,
    /// The timed event recorded before the kernel, when launches are timed.
    pub(super) start: Option<BlockingEvent>,
    pub(super) signal: Arc<Signal>,
}

/// A lane's waiter thread: waits for each launch's event in submission order and reports it,
/// until the lane is closed. A failed kernel marks the lane `faulted`.
pub(super) fn wait_for_launches(
    context: &ContextState,
    launches: &Receiver<PendingLaunch>,
    faulted: &AtomicBool,
) {
    if let Err(error) = context.ctx.bind_to_thread() {
        tracing::warn!(error = %driver_error_text(error), "CUDA event thread cannot bind the context");
    }
    while let Ok(PendingLaunch {
        event,
        start,
        signal,
    }) = launches.recv()
    {
        let outcome = event.synchronize();
        match outcome {
            Ok(()) => {
                if let Some(start) = start {
                    if let Ok(took) = event.elapsed_since(&start) {
                        signal.set_device_time(took);
                    }
                    context.spare(start);
                }
                context.spare(event);
            }
            Err(error) => {
                if !faulted.swap(true, Ordering::AcqRel) {
                    tracing::error!(
                        error = %driver_error_text(error),
                        primary_context = context.ctx.is_primary(),
                        "a kernel failed while running; CUDA keeps such errors for the whole \
                         context, so its later work fails too"
                    );
                }
            }
        }
        signal.finish(outcome.map_err(|error| GpuError::cuda("running the kernel", error)));
    }
}
