//! Submitting a launch: the kernel parameters of a validated call (builtins, or tenant and
//! program functions checked against the parameter layout the driver reports), the launch on a
//! lane's stream, and its completion event handed to the lane's waiter thread.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, PoisonError};

use cudarc::driver::{result, sys, CudaContext, CudaFunction, LaunchArgs, PushKernelArg};

use super::events::PendingLaunch;
use super::lane::Lane;
use super::modules::PtxFunction;
use super::CudaBackend;
use crate::completion::{CancelHook, Signal};
use crate::kernel::LoadedFunction;
use crate::validate::BuiltinCall;
use crate::{Completion, GpuError, KernelArg, LaunchConfig};

/// One scalar kernel parameter, by value (the backend's launches and `raw_launch`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Param {
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
}

impl CudaBackend {
    /// The parameters of a validated builtin call over guest memory at `base`.
    pub(super) fn builtin_params(call: BuiltinCall, base: u64) -> Vec<Param> {
        let address = |offset: usize| Param::U64(base + offset as u64);
        match call {
            BuiltinCall::VectorAdd { a, b, out, n } => {
                vec![address(a), address(b), address(out), Param::U32(n)]
            }
            BuiltinCall::Scale { x, out, alpha, n } => {
                vec![address(x), address(out), Param::F32(alpha), Param::U32(n)]
            }
            BuiltinCall::Matmul { a, b, c, m, n, k } => vec![
                address(a),
                address(b),
                address(c),
                Param::U32(m),
                Param::U32(n),
                Param::U32(k),
            ],
        }
    }

    /// The parameters of a tenant kernel, checked against the layout the driver reports.
    pub(super) fn tenant_params(
        function: &PtxFunction,
        args: &[KernelArg],
        base: u64,
    ) -> Result<Vec<Param>, GpuError> {
        params_for_layout(function.entry(), &function.param_sizes, args, base)
    }

    /// Submits a fenced tenant kernel: `params` (the guest's, checked) get the rewrite's hidden
    /// ones — the window (the `len` bytes of guest memory at `base`, 16-byte aligned), the
    /// dynamic shared memory it is given, and a cancel word of its own in managed memory, which
    /// [`Completion::cancel`] sets (the kernel's polls end it). A launch its module's
    /// launch-time proof admits runs the lean entry (the tenant's own code) instead.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn submit_fenced<'m>(
        lane: &Lane,
        function: &PtxFunction,
        params: &mut Vec<Param>,
        args: &[KernelArg],
        config: &LaunchConfig,
        base: u64,
        len: usize,
    ) -> Result<Completion<'m>, GpuError> {
        let word = Arc::new(CancelWord::new(&lane.context.ctx)?);
        let dynamic = tensor_wasm_ptx_verify::dynamic_shared_bytes(config.shared_bytes);
        let hi = base + (len as u64 & !15);
        let mut chosen = &function.function;
        if let Some((lean, plan)) = &function.lean {
            let values: Vec<Vec<u8>> = args.iter().map(|a| a.param_bytes(base)).collect();
            let facts = tensor_wasm_ptx_verify::LaunchFacts {
                params: &values,
                grid: config.grid,
                block: config.block,
                dynamic_shared: dynamic,
                window: (base, hi),
            };
            if plan.admit(&facts).is_ok() {
                chosen = lean;
            }
        }
        let hidden = tensor_wasm_ptx_verify::hidden_args(base, hi, dynamic, word.address());
        params.extend(hidden.map(Param::U64));
        let config = LaunchConfig {
            shared_bytes: dynamic,
            ..*config
        };
        let hook: CancelHook = Box::new(move || word.set());
        Self::submit_with(lane, chosen, params, &config, Some(hook))
    }

    /// Submits `function` (loaded in the lane's context) with `params` to `lane`'s stream and
    /// hands its completion to the lane's waiter thread.
    pub(super) fn submit<'m>(
        lane: &Lane,
        function: &CudaFunction,
        params: &[Param],
        config: &LaunchConfig,
    ) -> Result<Completion<'m>, GpuError> {
        Self::submit_with(lane, function, params, config, None)
    }

    /// [`CudaBackend::submit`], with what cancelling the completion runs.
    fn submit_with<'m>(
        lane: &Lane,
        function: &CudaFunction,
        params: &[Param],
        config: &LaunchConfig,
        on_cancel: Option<CancelHook>,
    ) -> Result<Completion<'m>, GpuError> {
        // Held until the launch is handed to the waiter, so the waiter sees launches in stream
        // order. The lock holds an `Option` replaced whole: a poisoned one is still valid.
        let to_waiter = lane
            .to_waiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        lane.context.make_current()?;
        let timed = super::events::timing_events();
        let event = lane.context.event(timed)?;
        let start = match timed {
            true => {
                let start = lane.context.event(true)?;
                start.record(&lane.stream).map_err(|error| {
                    lane.note_submit_error(&error);
                    GpuError::cuda("recording the timing event", error)
                })?;
                Some(start)
            }
            false => None,
        };
        let mut builder = lane.stream.launch_builder(function);
        push_params(&mut builder, params);
        let cfg = driver_config(config);
        // SAFETY: the parameters match the function's layout (builtins: their PTX signature,
        // checked by the `ptx` tests; tenant kernels and programs: the sizes
        // `cuFuncGetParamInfo` reported), so the driver reads exactly `params`, which outlive
        // this call. Every address points into guest memory that validation bounded (builtins
        // never leave their buffers; programs are kept inside them by their own `validate`;
        // tenant code is trusted by whoever loaded it), and the returned Completion keeps that
        // memory borrowed until the event recorded below has completed (the only caller,
        // `launch_unscoped`, hands it on under the promise that it is never leaked).
        unsafe { builder.launch(cfg) }.map_err(|error| {
            lane.note_submit_error(&error);
            GpuError::cuda("launching the kernel", error)
        })?;
        if let Err(error) = event.record(&lane.stream) {
            lane.note_submit_error(&error);
            // The kernel may be running and no event tracks it: wait for the stream before the
            // borrow of guest memory ends with this error.
            let _ = lane.stream.synchronize();
            return Err(GpuError::cuda("recording the completion event", error));
        }
        let signal = Signal::new();
        if let Some(hook) = on_cancel {
            signal.on_cancel(hook);
        }
        let pending = PendingLaunch {
            event,
            start,
            signal: signal.clone(),
        };
        let unsent = match &*to_waiter {
            Some(to_waiter) => to_waiter.send(pending).err().map(|error| error.0),
            None => Some(pending),
        };
        drop(to_waiter);
        if let Some(pending) = unsent {
            // No waiter thread (the lane was closed, which only the backend's drop does): wait
            // here.
            let outcome = pending
                .event
                .synchronize()
                .map_err(|error| GpuError::cuda("running the kernel", error));
            signal.finish(outcome);
        }
        Ok(Completion::pending(signal))
    }
}

/// Adds `params` to a launch, in order, each by reference (they outlive the launch call).
pub(crate) fn push_params<'a>(builder: &mut LaunchArgs<'a>, params: &'a [Param]) {
    for param in params {
        match param {
            Param::I32(v) => builder.arg(v),
            Param::U32(v) => builder.arg(v),
            Param::I64(v) => builder.arg(v),
            Param::U64(v) => builder.arg(v),
            Param::F32(v) => builder.arg(v),
            Param::F64(v) => builder.arg(v),
        };
    }
}

/// cudarc's launch configuration for ours.
pub(crate) fn driver_config(config: &LaunchConfig) -> cudarc::driver::LaunchConfig {
    cudarc::driver::LaunchConfig {
        grid_dim: (config.grid[0], config.grid[1], config.grid[2]),
        block_dim: (config.block[0], config.block[1], config.block[2]),
        shared_mem_bytes: config.shared_bytes,
    }
}

/// The parameters of a launch of `entry`, each buffer as its address in memory at `base` and
/// each scalar by value, after checking `args` against the parameter sizes the driver reports
/// (count and size of each). Buffers must already be checked against the memory.
pub(crate) fn params_for_layout(
    entry: &str,
    param_sizes: &[usize],
    args: &[KernelArg],
    base: u64,
) -> Result<Vec<Param>, GpuError> {
    if args.len() != param_sizes.len() {
        return Err(GpuError::InvalidArgument(format!(
            "kernel `{entry}` takes {} parameters (sizes in bytes: {param_sizes:?}), got {} \
             arguments",
            param_sizes.len(),
            args.len()
        )));
    }
    args.iter()
        .zip(param_sizes)
        .enumerate()
        .map(|(index, (arg, &size))| {
            if arg.param_size() != size {
                return Err(GpuError::InvalidArgument(format!(
                    "kernel `{entry}` argument {index} is {} ({} bytes) but the parameter is \
                     {size} bytes",
                    arg.type_name(),
                    arg.param_size()
                )));
            }
            Ok(match *arg {
                KernelArg::I32(v) => Param::I32(v),
                KernelArg::U32(v) => Param::U32(v),
                KernelArg::I64(v) => Param::I64(v),
                KernelArg::U64(v) => Param::U64(v),
                KernelArg::F32(v) => Param::F32(v),
                KernelArg::F64(v) => Param::F64(v),
                // In bounds: the caller checked every buffer against the memory, so
                // base + offset <= base + memory length.
                KernelArg::Buffer { offset, .. } => Param::U64(base + offset),
            })
        })
        .collect()
}

/// A fenced kernel's cancel word: 4 bytes of managed memory the host sets while the kernel
/// runs. Freed when the launch's signal is dropped, after the kernel has ended.
struct CancelWord {
    ctx: Arc<CudaContext>,
    ptr: sys::CUdeviceptr,
}

impl CancelWord {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        ctx.bind_to_thread()
            .map_err(|error| GpuError::cuda("binding the context", error))?;
        // SAFETY: a plain allocation of 4 bytes; the word is written (to 0) before any kernel
        // gets its address.
        let ptr =
            unsafe { result::malloc_managed(4, sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL) }
                .map_err(|error| GpuError::cuda("allocating a cancel word", error))?;
        let word = Self {
            ctx: ctx.clone(),
            ptr,
        };
        // The host writes the word and the kernel polls it: keep its page in host memory.
        // Only a placement hint, so a device that declines it still works.
        let host = sys::CUmemLocation {
            type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        };
        // SAFETY: the range is exactly the 4-byte allocation above; advice changes placement
        // only, never the contents.
        let _ = unsafe {
            result::mem_advise(
                ptr,
                4,
                sys::CUmem_advise::CU_MEM_ADVISE_SET_PREFERRED_LOCATION,
                host,
            )
        };
        word.word().store(0, Ordering::Release);
        Ok(word)
    }

    /// The word as a host atomic: managed memory is host-accessible at its device address,
    /// the allocation is 4 bytes and page-aligned, and it lives as long as `self`; the host
    /// only ever stores to it atomically (the kernel reads it with volatile loads).
    fn word(&self) -> &AtomicU32 {
        // SAFETY: as above; every host access of the word goes through this atomic.
        unsafe { AtomicU32::from_ptr(self.ptr as *mut u32) }
    }

    fn address(&self) -> u64 {
        self.ptr
    }

    /// Cancels the kernel: its next poll reads 1 (concurrent managed access: the kernel sees
    /// a host store while it runs).
    fn set(&self) {
        self.word().store(1, Ordering::Release);
    }
}

impl Drop for CancelWord {
    fn drop(&mut self) {
        // The kernel has ended (the signal outlives it): nothing reads the word any more.
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: allocated by `malloc_managed` in `new`, freed once, here.
            let _ = unsafe { result::free_sync(self.ptr) };
        }
    }
}
