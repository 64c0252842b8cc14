//! The bare-driver peer of the CUDA backend, for measurements: a builtin's or a program's PTX
//! loaded with cudarc into a context the caller names and launched on the caller's stream, with
//! the backend's validation but none of its lanes, dispatcher or completion thread.
//!
//! The GPU suite times these launches next to the backend's own (`launch`) to show what the
//! backend adds to a bare `cuLaunchKernel`. Each launch borrows its memory mutably and returns
//! only once the kernel has finished ([`RawCudaKernel::launch_and_sync`] waits for the stream,
//! [`RawCudaKernel::launch_timed`] for an event recorded after the kernel), so the API is safe:
//! no kernel of it can still touch the memory when the borrow ends.
//!
//! Before anything is enqueued a launch is checked as the backend checks it: the
//! [`LaunchConfig`] against CUDA's limits, every buffer against the memory, the builtin's
//! signature or [`KernelProgram::validate`], and the arguments against the parameter layout
//! the driver reports for the loaded function. What the backend does besides, this peer does
//! not: it does not ask the driver whether the device can reach the memory (pass CUDA managed
//! memory, or any memory on a device with pageable memory access; a kernel on memory the device
//! cannot reach faults, and the launch returns the driver's error), and a kernel fault leaves
//! the caller's context unusable, as on any bare driver launch.

use std::fmt;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaEvent, CudaFunction, CudaStream};
use cudarc::nvrtc::Ptx;

use crate::cuda::{driver_config, param_sizes, params_for_layout, push_params, Param};
use crate::validate;
use crate::{BuiltinKernel, CudaDeviceInfo, GpuError, KernelArg, KernelProgram, LaunchConfig};

/// A completion event made as the backend's lanes make theirs (`CU_EVENT_BLOCKING_SYNC`, no
/// timing), for [`RawCudaKernel::launch_and_wait_blocking`].
pub struct BlockingSyncEvent {
    event: crate::cuda::BlockingEvent,
}

impl BlockingSyncEvent {
    /// A new event of `ctx`.
    ///
    /// # Errors
    /// `Cuda` when the driver cannot create it.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        crate::cuda::BlockingEvent::new(ctx, false)
            .map(|event| Self { event })
            .map_err(|error| GpuError::cuda("creating a blocking-sync event", error))
    }
}

impl fmt::Debug for BlockingSyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockingSyncEvent").finish_non_exhaustive()
    }
}

/// What a [`RawCudaKernel`] runs, which decides how its launches are validated.
enum Source {
    Builtin(BuiltinKernel),
    Program(Arc<dyn KernelProgram>),
}

/// A builtin or a [`KernelProgram`] loaded straight into a CUDA context with cudarc, launched
/// on a stream of that context by the calling thread.
///
/// # Example
///
/// ```no_run
/// use std::sync::Arc;
/// use tensor_wasm_gpu::{BuiltinKernel, KernelArg, LaunchConfig, RawCudaKernel};
///
/// # fn f(ctx: Arc<cudarc::driver::CudaContext>, managed: &mut [u8]) -> Result<(), tensor_wasm_gpu::GpuError> {
/// // `managed`: 48 bytes of CUDA managed memory holding a = [f32; 4] at 0, b at 16.
/// let kernel = RawCudaKernel::builtin(&ctx, BuiltinKernel::VectorAdd)?;
/// let stream = ctx.new_stream().expect("a stream");
/// let args = [
///     KernelArg::Buffer { offset: 0, len: 16 },
///     KernelArg::Buffer { offset: 16, len: 16 },
///     KernelArg::Buffer { offset: 32, len: 16 },
///     KernelArg::U32(4),
/// ];
/// kernel.launch_and_sync(&stream, &LaunchConfig::linear(4, 256), &args, managed)?;
/// # Ok(())
/// # }
/// ```
pub struct RawCudaKernel {
    source: Source,
    entry: String,
    /// Holds the module it was loaded from.
    function: CudaFunction,
    /// The parameter layout the driver reports, in bytes per parameter.
    param_sizes: Vec<usize>,
    ctx: Arc<CudaContext>,
}

impl fmt::Debug for RawCudaKernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RawCudaKernel")
            .field("entry", &self.entry)
            .field("param_sizes", &self.param_sizes)
            .finish_non_exhaustive()
    }
}

impl RawCudaKernel {
    /// Loads the builtin's PTX (the text the backend loads) into `ctx`.
    ///
    /// # Errors
    /// `Cuda` when the driver rejects the module or reports parameters other than the ones the
    /// launch code passes.
    pub fn builtin(ctx: &Arc<CudaContext>, kernel: BuiltinKernel) -> Result<Self, GpuError> {
        let loaded = Self::load(
            ctx,
            Source::Builtin(kernel),
            kernel.ptx(),
            kernel.descriptor(),
        )?;
        if loaded.param_sizes != kernel.param_sizes() {
            return Err(GpuError::Cuda(format!(
                "builtin `{kernel}` has parameters of {:?} bytes, the launch code passes {:?}",
                loaded.param_sizes,
                kernel.param_sizes()
            )));
        }
        Ok(loaded)
    }

    /// Loads the PTX [`KernelProgram::ptx`] gives for `device` (the device of `ctx`) into
    /// `ctx`: the text a CUDA backend on that device loads.
    ///
    /// # Errors
    /// What [`KernelProgram::ptx`] returns; `InvalidArgument` for PTX text or an entry name
    /// with NUL bytes; `Cuda` when the driver rejects the module or finds no such entry.
    pub fn program(
        ctx: &Arc<CudaContext>,
        device: &CudaDeviceInfo,
        program: Arc<dyn KernelProgram>,
    ) -> Result<Self, GpuError> {
        let (ptx, entry) = program.ptx(device.compute_capability, device.driver_version)?;
        Self::load(ctx, Source::Program(program), &ptx, &entry)
    }

    fn load(
        ctx: &Arc<CudaContext>,
        source: Source,
        ptx: &str,
        entry: &str,
    ) -> Result<Self, GpuError> {
        if ptx.contains('\0') || entry.is_empty() || entry.contains('\0') {
            return Err(GpuError::InvalidArgument(format!(
                "raw CUDA kernel `{entry}`: the PTX text or the entry name has a NUL byte or is \
                 empty"
            )));
        }
        let what = format!("loading `{entry}` for a raw launch");
        ctx.bind_to_thread()
            .map_err(|error| GpuError::cuda("binding the context", error))?;
        let module = ctx
            .load_module(Ptx::from_src(ptx))
            .map_err(|error| GpuError::cuda(&what, error))?;
        let function = module
            .load_function(entry)
            .map_err(|error| GpuError::cuda(&what, error))?;
        let param_sizes = param_sizes(ctx, &function, None)?;
        Ok(Self {
            source,
            entry: entry.to_owned(),
            function,
            param_sizes,
            ctx: ctx.clone(),
        })
    }

    /// The PTX entry this kernel runs.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// `cuLaunchKernel` on `stream` over `memory`, then `cuStreamSynchronize`.
    ///
    /// # Errors
    /// `InvalidArgument` for anything validation rejects (see the module docs; nothing is
    /// launched then) or a stream of another context; `Cuda` for driver errors, among them a
    /// kernel fault.
    pub fn launch_and_sync(
        &self,
        stream: &Arc<CudaStream>,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<(), GpuError> {
        self.launch_then(
            stream,
            config,
            args,
            memory,
            || Ok(()),
            || {
                stream
                    .synchronize()
                    .map_err(|error| GpuError::cuda("waiting for the stream", error))
            },
        )
    }

    /// The same launch, then a wait on `event` recorded after it: a blocking-sync event, as
    /// each lane of the backend waits on (the thread sleeps until the GPU's interrupt), on the
    /// calling thread. Against [`RawCudaKernel::launch_and_sync`] it measures what that way of
    /// waiting costs, apart from the backend's hand-over to and from its lane's waiter thread.
    ///
    /// # Errors
    /// As [`RawCudaKernel::launch_and_sync`]; `InvalidArgument` for an event of another context.
    pub fn launch_and_wait_blocking(
        &self,
        stream: &Arc<CudaStream>,
        event: &BlockingSyncEvent,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<(), GpuError> {
        if !Arc::ptr_eq(event.event.context(), &self.ctx) {
            return Err(GpuError::InvalidArgument(format!(
                "raw CUDA kernel `{}`: the event belongs to another CUDA context",
                self.entry
            )));
        }
        self.launch_then(
            stream,
            config,
            args,
            memory,
            || Ok(()),
            || {
                event
                    .event
                    .record(stream)
                    .map_err(|error| GpuError::cuda("recording the completion event", error))?;
                event
                    .event
                    .synchronize()
                    .map_err(|error| GpuError::cuda("waiting for the completion event", error))
            },
        )
    }

    /// The same launch between `timer`'s two events: records the start event on `stream`,
    /// launches, records the end event and waits for it. Returns the time between the events
    /// in nanoseconds (CUDA event resolution, about half a microsecond).
    ///
    /// # Errors
    /// As [`RawCudaKernel::launch_and_sync`]; `InvalidArgument` for a timer of another context.
    pub fn launch_timed(
        &self,
        stream: &Arc<CudaStream>,
        timer: &LaunchTimer,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<f64, GpuError> {
        if !Arc::ptr_eq(timer.start.context(), &self.ctx) {
            return Err(GpuError::InvalidArgument(String::from(
                "the timer's events belong to another CUDA context than the kernel",
            )));
        }
        let record = |event: &CudaEvent| {
            event
                .record(stream)
                .map_err(|error| GpuError::cuda("recording a timing event", error))
        };
        self.launch_then(
            stream,
            config,
            args,
            memory,
            || record(&timer.start),
            || {
                record(&timer.end)?;
                timer
                    .end
                    .synchronize()
                    .map_err(|error| GpuError::cuda("waiting for the end event", error))?;
                let ms = timer
                    .start
                    .elapsed_ms(&timer.end)
                    .map_err(|error| GpuError::cuda("reading the event times", error))?;
                Ok(f64::from(ms) * 1e6)
            },
        )
    }

    /// Validates, runs `before` (work enqueued ahead of the kernel), launches and runs `wait`,
    /// which must return only once the kernel has finished; when it fails, the stream is
    /// waited for here before the borrow of `memory` ends.
    fn launch_then<T>(
        &self,
        stream: &Arc<CudaStream>,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
        before: impl FnOnce() -> Result<(), GpuError>,
        wait: impl FnOnce() -> Result<T, GpuError>,
    ) -> Result<T, GpuError> {
        if !Arc::ptr_eq(stream.context(), &self.ctx) {
            return Err(GpuError::InvalidArgument(format!(
                "raw CUDA kernel `{}`: the stream belongs to another CUDA context",
                self.entry
            )));
        }
        let base = memory.as_mut_ptr() as u64;
        let params = checked_params(
            &self.source,
            &self.entry,
            &self.param_sizes,
            config,
            args,
            memory.len(),
            base,
        )?;
        before()?;
        let mut builder = stream.launch_builder(&self.function);
        push_params(&mut builder, &params);
        let cfg = driver_config(config);
        // SAFETY: `params` match the layout the driver reported for the function (count and
        // size of every parameter), so the driver reads exactly `params`, which outlive this
        // call. Every address is `memory`'s base plus the offset of a buffer that validation
        // bounded inside `memory` (builtins never leave their buffers; programs are kept inside
        // them by their own `validate`). `memory` is borrowed mutably for this whole call, and
        // the call does not return before the kernel has finished: `wait` returns once it has,
        // and when `wait` fails the stream is synchronised below first.
        unsafe { builder.launch(cfg) }
            .map_err(|error| GpuError::cuda("launching the kernel", error))?;
        let waited = wait();
        if waited.is_err() {
            let _ = stream.synchronize();
        }
        waited
    }
}

/// A pair of CUDA events with timing enabled, for [`RawCudaKernel::launch_timed`]; create it
/// once, outside the timed loop.
pub struct LaunchTimer {
    start: CudaEvent,
    end: CudaEvent,
}

impl fmt::Debug for LaunchTimer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LaunchTimer").finish_non_exhaustive()
    }
}

impl LaunchTimer {
    /// Two events of `ctx` (`CU_EVENT_DEFAULT`: timing enabled).
    ///
    /// # Errors
    /// `Cuda` when the driver cannot create them.
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        let event = || {
            ctx.new_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(|error| GpuError::cuda("creating a timing event", error))
        };
        Ok(Self {
            start: event()?,
            end: event()?,
        })
    }
}

/// Validates a launch of `source` over `memory_len` bytes at `base` and returns its
/// parameters: each buffer as its address, each scalar by value, in argument order, checked
/// against the driver-reported `param_sizes`.
fn checked_params(
    source: &Source,
    entry: &str,
    param_sizes: &[usize],
    config: &LaunchConfig,
    args: &[KernelArg],
    memory_len: usize,
    base: u64,
) -> Result<Vec<Param>, GpuError> {
    validate::check_config(config)?;
    match source {
        Source::Builtin(kernel) => {
            validate::plan_builtin(*kernel, args, memory_len)?;
        }
        Source::Program(program) => {
            validate::check_buffers(program.name(), args, memory_len)?;
            program.validate(config, args, memory_len)?;
        }
    }
    params_for_layout(entry, param_sizes, args, base)
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: u64 = 0x7000_0000_0000;

    fn vector_add_args(n: u32) -> [KernelArg; 4] {
        [
            KernelArg::Buffer { offset: 0, len: 16 },
            KernelArg::Buffer {
                offset: 16,
                len: 16,
            },
            KernelArg::Buffer {
                offset: 32,
                len: 16,
            },
            KernelArg::U32(n),
        ]
    }

    fn builtin_params(args: &[KernelArg], memory_len: usize) -> Result<Vec<Param>, GpuError> {
        let kernel = BuiltinKernel::VectorAdd;
        checked_params(
            &Source::Builtin(kernel),
            kernel.descriptor(),
            kernel.param_sizes(),
            &LaunchConfig::linear(4, 256),
            args,
            memory_len,
            BASE,
        )
    }

    #[test]
    fn buffers_become_addresses_and_scalars_stay_values() {
        assert_eq!(
            builtin_params(&vector_add_args(4), 48).unwrap(),
            [
                Param::U64(BASE),
                Param::U64(BASE + 16),
                Param::U64(BASE + 32),
                Param::U32(4)
            ]
        );
    }

    #[test]
    fn launches_the_backend_refuses_are_refused() {
        // A buffer past the end of memory.
        let error = builtin_params(&vector_add_args(4), 40).unwrap_err();
        assert!(matches!(error, GpuError::InvalidArgument(_)), "{error}");
        // More elements than the buffers hold.
        let error = builtin_params(&vector_add_args(5), 48).unwrap_err();
        assert!(matches!(error, GpuError::InvalidArgument(_)), "{error}");
        // A launch configuration beyond CUDA's limits.
        let kernel = BuiltinKernel::VectorAdd;
        let error = checked_params(
            &Source::Builtin(kernel),
            kernel.descriptor(),
            kernel.param_sizes(),
            &LaunchConfig {
                grid: [1, 1, 1],
                block: [2048, 1, 1],
                shared_bytes: 0,
            },
            &vector_add_args(4),
            48,
            BASE,
        )
        .unwrap_err();
        assert!(matches!(error, GpuError::InvalidArgument(_)), "{error}");
    }

    #[test]
    fn arguments_must_fit_the_reported_parameter_layout() {
        let kernel = BuiltinKernel::VectorAdd;
        let check = |param_sizes: &[usize]| {
            checked_params(
                &Source::Builtin(kernel),
                kernel.descriptor(),
                param_sizes,
                &LaunchConfig::linear(4, 256),
                &vector_add_args(4),
                48,
                BASE,
            )
        };
        assert!(check(&[8, 8, 8, 4]).is_ok());
        let count = check(&[8, 8, 8]).unwrap_err().to_string();
        assert!(count.contains("takes 3 parameters"), "{count}");
        let size = check(&[8, 8, 8, 8]).unwrap_err().to_string();
        assert!(size.contains("argument 3 is u32"), "{size}");
    }

    #[test]
    #[ignore = "needs a CUDA device"]
    fn a_raw_vector_add_matches_the_cpu() {
        let ctx = CudaContext::new(0).expect("this test needs a CUDA device");
        let mut memory = crate::tests::ManagedBuffer::new(ctx.clone(), 48);
        let values = [1.0f32, 2.0, 3.0, 4.0, 10.0, 20.0, 30.0, 40.0];
        let bytes = memory.bytes();
        bytes.fill(0);
        for (i, v) in values.iter().enumerate() {
            bytes[i * 4..i * 4 + 4].copy_from_slice(&v.to_le_bytes());
        }
        let kernel = RawCudaKernel::builtin(&ctx, BuiltinKernel::VectorAdd).unwrap();
        let stream = ctx.new_stream().unwrap();
        let config = LaunchConfig::linear(4, 256);
        kernel
            .launch_and_sync(&stream, &config, &vector_add_args(4), memory.bytes())
            .unwrap();
        let timer = LaunchTimer::new(&ctx).unwrap();
        let ns = kernel
            .launch_timed(
                &stream,
                &timer,
                &config,
                &vector_add_args(4),
                memory.bytes(),
            )
            .unwrap();
        assert!(ns > 0.0, "{ns}");
        let out: Vec<f32> = memory.bytes()[32..]
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        assert_eq!(out, [11.0, 22.0, 33.0, 44.0]);
        // Refused before anything is enqueued.
        let error = kernel
            .launch_and_sync(
                &stream,
                &config,
                &vector_add_args(4),
                &mut memory.bytes()[..40],
            )
            .unwrap_err();
        assert!(matches!(error, GpuError::InvalidArgument(_)), "{error}");
        let other = CudaContext::new_non_primary(0, 0)
            .unwrap()
            .new_stream()
            .unwrap();
        let error = kernel
            .launch_and_sync(&other, &config, &vector_add_args(4), memory.bytes())
            .unwrap_err();
        assert!(
            error.to_string().contains("another CUDA context"),
            "{error}"
        );
    }
}
