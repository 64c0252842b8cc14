//! The CUDA backend: device discovery, the builtin PTX modules, tenant PTX and cubin,
//! host-described programs (loaded once per fingerprint), launches on one stream, and completion
//! through blocking-sync events waited on by a dedicated thread.
//!
//! cudarc panics when `libcuda.so` is missing, so every entry point here first probes for the
//! library (`is_culib_present`) and runs the driver calls under `catch_unwind` as a second line
//! of defence (an older driver lacking a symbol also panics inside cudarc).

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, DriverError, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::completion::Signal;
use crate::error::driver_error_text;
use crate::kernel::{KernelKind, ProgramKernel};
use crate::program::{ProgramCache, PROGRAM_CACHE_CAPACITY};
use crate::validate::{self, BuiltinCall};
use crate::{
    Backend, BuiltinKernel, Completion, CudaDeviceInfo, Device, GpuError, Kernel, KernelArg,
    KernelProgram, LaunchConfig,
};

/// Most parameters accepted from a tenant kernel (CUDA allows at most 32 764 bytes of them).
const MAX_TENANT_PARAMS: usize = 4096;

/// Runs `probe` unless the driver library is missing; turns panics inside cudarc into errors.
fn with_driver<T>(probe: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    // SAFETY: `is_culib_present` only tries to dlopen the driver library by its usual names and
    // closes it again; it has no preconditions.
    let present = unsafe { sys::is_culib_present() };
    if !present {
        return Err(GpuError::NotAvailable(String::from(
            "no NVIDIA driver: libcuda.so could not be loaded",
        )));
    }
    catching_driver_panics(probe)
}

/// Runs driver calls, turning a panic inside cudarc (a symbol the installed driver lacks, a
/// string it cannot convert) into an error instead of unwinding through the server.
fn catching_driver_panics<T>(calls: impl FnOnce() -> Result<T, GpuError>) -> Result<T, GpuError> {
    match catch_unwind(AssertUnwindSafe(calls)) {
        Ok(result) => result,
        Err(panic) => {
            let message = panic
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| panic.downcast_ref::<&str>().copied())
                .unwrap_or("unknown panic");
            Err(GpuError::NotAvailable(format!(
                "the CUDA driver library is unusable: {message}"
            )))
        }
    }
}

/// `cuInit` and the device count; `NotAvailable` when there is no usable device.
fn init_driver() -> Result<usize, GpuError> {
    cudarc::driver::result::init().map_err(|error| {
        GpuError::NotAvailable(format!("cuInit failed: {}", driver_error_text(error)))
    })?;
    let count = cudarc::driver::result::device::get_count().map_err(|error| {
        GpuError::NotAvailable(format!(
            "cuDeviceGetCount failed: {}",
            driver_error_text(error)
        ))
    })?;
    Ok(usize::try_from(count).unwrap_or(0))
}

/// Every CUDA device of this host, or why CUDA cannot be used (the text for `Discovery`).
pub(crate) fn query_all_devices() -> Result<Vec<CudaDeviceInfo>, String> {
    let devices = with_driver(|| {
        let count = init_driver()?;
        let mut devices = Vec::with_capacity(count);
        let mut first_error = None;
        for ordinal in 0..count {
            let info = CudaContext::new(ordinal)
                .map_err(|error| GpuError::cuda("creating a context", error))
                .and_then(|ctx| query_device(&ctx));
            match info {
                Ok(info) => devices.push(info),
                Err(error) => {
                    tracing::warn!(ordinal, %error, "cannot query CUDA device");
                    first_error.get_or_insert(error);
                }
            }
        }
        match first_error {
            Some(error) if devices.is_empty() => Err(error),
            _ => Ok(devices),
        }
    });
    devices.map_err(|error| match error {
        GpuError::NotAvailable(reason)
        | GpuError::Cuda(reason)
        | GpuError::InvalidArgument(reason) => reason,
        GpuError::Compile { log } => log,
    })
}

/// What the driver says about the device of `ctx`.
fn query_device(ctx: &Arc<CudaContext>) -> Result<CudaDeviceInfo, GpuError> {
    let err = |what: &'static str| move |error: DriverError| GpuError::cuda(what, error);
    let attribute = |attribute: sys::CUdevice_attribute| {
        ctx.attribute(attribute)
            .map_err(err("reading a device attribute"))
    };
    let name = ctx.name().map_err(err("reading the device name"))?;
    let (major, minor) = ctx
        .compute_capability()
        .map_err(err("reading the compute capability"))?;
    let total = ctx.total_mem().map_err(err("reading the memory size"))?;
    let (free, _) = ctx.mem_get_info().map_err(err("reading free memory"))?;
    let mut driver_version: c_int = 0;
    // SAFETY: `driver_version` is a valid place for the one int the driver writes.
    unsafe { sys::cuDriverGetVersion(&mut driver_version) }
        .result()
        .map_err(err("reading the driver version"))?;
    let to_u32 = |value: i32| u32::try_from(value).unwrap_or(0);
    Ok(CudaDeviceInfo {
        ordinal: u32::try_from(ctx.ordinal()).unwrap_or(u32::MAX),
        name,
        compute_capability: (to_u32(major), to_u32(minor)),
        driver_version,
        total_memory_bytes: total as u64,
        free_memory_bytes: free as u64,
        pageable_memory_access: attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_PAGEABLE_MEMORY_ACCESS,
        )? != 0,
        concurrent_managed_access: attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS,
        )? != 0,
        multiprocessor_count: to_u32(attribute(
            sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
        )?),
    })
}

/// A function loaded from tenant PTX or cubin, or from a program's PTX, with the parameter
/// layout the driver reports.
pub(crate) struct PtxFunction {
    backend_id: u64,
    entry: String,
    function: CudaFunction,
    param_sizes: Vec<usize>,
}

impl PtxFunction {
    pub(crate) fn entry(&self) -> &str {
        &self.entry
    }

    pub(crate) fn param_sizes(&self) -> &[usize] {
        &self.param_sizes
    }
}

/// A CUDA event created with `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING`: waiting on it
/// puts the thread to sleep instead of spinning. (cudarc's `CudaEvent` takes one flag only.)
struct BlockingEvent {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUevent is a driver handle usable from any thread; this wrapper is its only owner.
unsafe impl Send for BlockingEvent {}

impl BlockingEvent {
    fn new(ctx: &Arc<CudaContext>) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as c_uint
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as c_uint;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        // SAFETY: `raw` is a valid place for the handle; the context is current.
        unsafe { sys::cuEventCreate(&mut raw, flags) }.result()?;
        Ok(Self {
            raw,
            ctx: ctx.clone(),
        })
    }

    /// Records the work submitted to `stream` so far. The caller has bound the context.
    fn record(&self, stream: &CudaStream) -> Result<(), DriverError> {
        // SAFETY: both handles are alive and belong to `self.ctx`.
        unsafe { sys::cuEventRecord(self.raw, stream.cu_stream()) }.result()
    }

    /// Blocks (sleeping) until the recorded work has finished; returns its error, if any.
    fn synchronize(&self) -> Result<(), DriverError> {
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

/// A launched kernel whose completion the waiter thread reports.
struct PendingLaunch {
    event: BlockingEvent,
    signal: Arc<Signal>,
}

/// What a launch needs under one lock: the way to the waiter and the spare events.
struct Launcher {
    to_waiter: Option<Sender<PendingLaunch>>,
    spare_events: Arc<Mutex<Vec<BlockingEvent>>>,
}

/// The three builtin functions, loaded when the backend opens.
struct BuiltinFunctions {
    vector_add: CudaFunction,
    scale: CudaFunction,
    matmul: CudaFunction,
}

impl BuiltinFunctions {
    fn load(ctx: &Arc<CudaContext>) -> Result<Self, GpuError> {
        let load = |kernel: BuiltinKernel| {
            let what = format!("loading the builtin PTX `{kernel}`");
            let module = ctx
                .load_module(Ptx::from_src(kernel.ptx()))
                .map_err(|error| GpuError::cuda(&what, error))?;
            let function = module
                .load_function(kernel.descriptor())
                .map_err(|error| GpuError::cuda(&what, error))?;
            // The launch code passes exactly `param_sizes`; a mismatch would make the driver
            // read the wrong bytes, so refuse to open rather than launch it.
            let sizes = param_sizes(ctx, &function)?;
            if sizes != kernel.param_sizes() {
                return Err(GpuError::Cuda(format!(
                    "builtin `{kernel}` has parameters of {sizes:?} bytes, the launch code \
                     passes {:?}",
                    kernel.param_sizes()
                )));
            }
            Ok(function)
        };
        Ok(Self {
            vector_add: load(BuiltinKernel::VectorAdd)?,
            scale: load(BuiltinKernel::Scale)?,
            matmul: load(BuiltinKernel::Matmul)?,
        })
    }

    fn get(&self, kernel: BuiltinKernel) -> &CudaFunction {
        match kernel {
            BuiltinKernel::VectorAdd => &self.vector_add,
            BuiltinKernel::Scale => &self.scale,
            BuiltinKernel::Matmul => &self.matmul,
        }
    }
}

/// One scalar kernel parameter, by value.
#[derive(Clone, Copy)]
enum Param {
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
}

/// Runs kernels on one CUDA device.
pub(crate) struct CudaBackend {
    id: u64,
    device: Device,
    compute_capability: (u32, u32),
    driver_version: i32,
    pageable_memory_access: bool,
    concurrent_managed_access: bool,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    builtins: BuiltinFunctions,
    /// Loaded programs by fingerprint: the program loaded first, and its function.
    programs: ProgramCache<(Arc<ProgramKernel>, Arc<PtxFunction>)>,
    launcher: Mutex<Launcher>,
    waiter: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// Opens device `ordinal`: context, stream, builtin modules and the waiter thread.
    pub(crate) fn open(ordinal: usize) -> Result<Self, GpuError> {
        with_driver(|| Self::open_with_driver(ordinal))
    }

    fn open_with_driver(ordinal: usize) -> Result<Self, GpuError> {
        let count = init_driver()?;
        if ordinal >= count {
            return Err(GpuError::NotAvailable(format!(
                "no CUDA device {ordinal}: the driver reports {count} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|error| GpuError::cuda("creating the context", error))?;
        let info = query_device(&ctx)?;
        let stream = ctx
            .new_stream()
            .map_err(|error| GpuError::cuda("creating the stream", error))?;
        let builtins = BuiltinFunctions::load(&ctx)?;
        let (to_waiter, from_launches) = mpsc::channel();
        let spare_events = Arc::new(Mutex::new(Vec::new()));
        let waiter = {
            let ctx = ctx.clone();
            let spare_events = spare_events.clone();
            std::thread::Builder::new()
                .name(format!("tensor-wasm-cuda{ordinal}-events"))
                .spawn(move || wait_for_launches(&ctx, &from_launches, &spare_events))
                .map_err(|error| {
                    GpuError::NotAvailable(format!("cannot start the CUDA event thread: {error}"))
                })?
        };
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        tracing::info!(device = %Device::Cuda(info.clone()), "CUDA backend open");
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            compute_capability: info.compute_capability,
            driver_version: info.driver_version,
            pageable_memory_access: info.pageable_memory_access,
            concurrent_managed_access: info.concurrent_managed_access,
            device: Device::Cuda(info),
            ctx,
            stream,
            builtins,
            programs: ProgramCache::new(PROGRAM_CACHE_CAPACITY),
            launcher: Mutex::new(Launcher {
                to_waiter: Some(to_waiter),
                spare_events,
            }),
            waiter: Some(waiter),
        })
    }

    fn lock_launcher(&self) -> MutexGuard<'_, Launcher> {
        // The launcher holds a channel end and a pool of events; neither is left half-updated.
        self.launcher.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Checks that the device can address `memory`: CUDA managed memory on a device where host
    /// and device may touch managed memory concurrently (the host keeps running other guests
    /// while a kernel runs), or any host memory on a device with pageable memory access.
    fn check_reachable(&self, memory: &[u8]) -> Result<(), GpuError> {
        if memory.is_empty() || self.pageable_memory_access {
            return Ok(());
        }
        if !self.concurrent_managed_access {
            return Err(GpuError::NotAvailable(String::from(
                "this device has neither pageable memory access nor concurrent managed access, \
                 so it cannot run kernels on guest memory while the host keeps running",
            )));
        }
        let base = memory.as_ptr() as u64;
        let end = base + memory.len() as u64;
        self.ctx
            .bind_to_thread()
            .map_err(|error| GpuError::cuda("binding the context", error))?;
        let not_reachable = |why: &str| {
            GpuError::NotAvailable(format!(
                "guest memory at {base:#x} ({} bytes) is {why}; this device has no pageable \
                 memory access, so kernels need guest memory in CUDA managed memory",
                memory.len()
            ))
        };
        // The driver writes a boolean (an unsigned int) here; eight zeroed bytes hold it
        // whatever its width.
        let mut is_managed: u64 = 0;
        // SAFETY: `is_managed` is a valid, writable place of 8 bytes, at least as large as the
        // value this attribute writes; the driver only inspects the address `base`.
        let queried = unsafe {
            sys::cuPointerGetAttribute(
                (&mut is_managed as *mut u64).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
                base,
            )
        }
        .result();
        match queried {
            Ok(()) if is_managed != 0 => {}
            Ok(()) => return Err(not_reachable("not CUDA managed memory")),
            Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)) => {
                return Err(not_reachable("not memory the CUDA driver knows"))
            }
            Err(error) => return Err(GpuError::cuda("querying the guest memory", error)),
        }
        let mut range_start: sys::CUdeviceptr = 0;
        let mut range_size: usize = 0;
        // SAFETY: as above; RANGE_START_ADDR writes a CUdeviceptr, RANGE_SIZE a size_t.
        let range = unsafe {
            sys::cuPointerGetAttribute(
                (&mut range_start as *mut sys::CUdeviceptr).cast::<c_void>(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
                base,
            )
            .result()
            .and_then(|()| {
                sys::cuPointerGetAttribute(
                    (&mut range_size as *mut usize).cast::<c_void>(),
                    sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
                    base,
                )
                .result()
            })
        };
        range.map_err(|error| GpuError::cuda("querying the guest memory range", error))?;
        let range_end = range_start.saturating_add(range_size as u64);
        if base < range_start || end > range_end {
            return Err(not_reachable("only partly inside one managed allocation"));
        }
        Ok(())
    }

    /// The parameters of a validated builtin call over guest memory at `base`.
    fn builtin_params(call: BuiltinCall, base: u64) -> Vec<Param> {
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
    fn tenant_params(
        function: &PtxFunction,
        args: &[KernelArg],
        base: u64,
    ) -> Result<Vec<Param>, GpuError> {
        let entry = function.entry();
        if args.len() != function.param_sizes.len() {
            return Err(GpuError::InvalidArgument(format!(
                "kernel `{entry}` takes {} parameters (sizes in bytes: {:?}), got {} arguments",
                function.param_sizes.len(),
                function.param_sizes,
                args.len()
            )));
        }
        args.iter()
            .zip(&function.param_sizes)
            .enumerate()
            .map(|(index, (arg, &size))| {
                if arg.param_size() != size {
                    return Err(GpuError::InvalidArgument(format!(
                        "kernel `{entry}` argument {index} is {} ({} bytes) but the parameter \
                         is {size} bytes",
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
                    // In bounds: `check_buffers` passed, so base + offset <= base + memory.len().
                    KernelArg::Buffer { offset, .. } => Param::U64(base + offset),
                })
            })
            .collect()
    }

    /// Loads `entry` from PTX text (`what` names it in errors) and reads its parameter layout.
    fn load_ptx_function(
        &self,
        ptx: &str,
        entry: &str,
        what: &str,
    ) -> Result<Arc<PtxFunction>, GpuError> {
        if ptx.contains('\0') {
            return Err(GpuError::InvalidArgument(format!(
                "{what}: PTX text contains a NUL byte"
            )));
        }
        self.load_function(Ptx::from_src(ptx), entry, what)
    }

    /// Loads `entry` from a module image (PTX text without NUL bytes, or a checked cubin) and
    /// reads its parameter layout.
    fn load_function(
        &self,
        image: Ptx,
        entry: &str,
        what: &str,
    ) -> Result<Arc<PtxFunction>, GpuError> {
        if entry.is_empty() || entry.contains('\0') {
            return Err(GpuError::InvalidArgument(format!(
                "{what}: invalid entry name {entry:?}"
            )));
        }
        let module = self
            .ctx
            .load_module(image)
            .map_err(|error| GpuError::cuda(&format!("loading {what}"), error))?;
        let function = module.load_function(entry).map_err(|error| {
            GpuError::cuda(&format!("finding entry `{entry}` in {what}"), error)
        })?;
        let param_sizes = param_sizes(&self.ctx, &function)?;
        Ok(Arc::new(PtxFunction {
            backend_id: self.id,
            entry: entry.to_owned(),
            function,
            param_sizes,
        }))
    }

    /// The loaded program with the fingerprint of `program`, and its function on this device:
    /// from the cache, or loaded from the PTX of `program`.
    fn load_program_function(
        &self,
        program: &Arc<dyn KernelProgram>,
    ) -> Result<(Arc<ProgramKernel>, Arc<PtxFunction>), GpuError> {
        self.programs.get_or_load(program.fingerprint(), || {
            let (ptx, entry) = program.ptx(self.compute_capability, self.driver_version)?;
            let what = format!("the PTX of program `{}`", program.name());
            let function = self.load_ptx_function(&ptx, &entry, &what)?;
            let loaded = Arc::new(ProgramKernel {
                program: program.clone(),
                function: Some(function.clone()),
            });
            Ok((loaded, function))
        })
    }

    /// Submits `function` with `params` and hands its completion to the waiter thread.
    fn submit<'m>(
        &self,
        function: &CudaFunction,
        params: &[Param],
        config: &LaunchConfig,
    ) -> Result<Completion<'m>, GpuError> {
        let launcher = self.lock_launcher();
        let spare = launcher
            .spare_events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        let event = match spare {
            Some(event) => event,
            None => BlockingEvent::new(&self.ctx)
                .map_err(|error| GpuError::cuda("creating a completion event", error))?,
        };
        let mut builder = self.stream.launch_builder(function);
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
        let cfg = cudarc::driver::LaunchConfig {
            grid_dim: (config.grid[0], config.grid[1], config.grid[2]),
            block_dim: (config.block[0], config.block[1], config.block[2]),
            shared_mem_bytes: config.shared_bytes,
        };
        // SAFETY: the parameters match the function's layout (builtins: their PTX signature,
        // checked by the `ptx` tests; tenant kernels and programs: the sizes
        // `cuFuncGetParamInfo` reported), so the driver reads exactly `params`, which outlive
        // this call. Every address points into guest memory that validation bounded (builtins
        // never leave their buffers; programs are kept inside them by their own `validate`;
        // tenant code is trusted by whoever loaded it), and the returned Completion keeps that
        // memory borrowed until the event recorded below has completed (the only caller,
        // `launch_unscoped`, hands it on under the promise that it is never leaked).
        unsafe { builder.launch(cfg) }
            .map_err(|error| GpuError::cuda("launching the kernel", error))?;
        if let Err(error) = event.record(&self.stream) {
            // The kernel may be running and no event tracks it: wait for the stream before the
            // borrow of guest memory ends with this error.
            let _ = self.stream.synchronize();
            return Err(GpuError::cuda("recording the completion event", error));
        }
        let signal = Signal::new();
        let pending = PendingLaunch {
            event,
            signal: signal.clone(),
        };
        let unsent = match &launcher.to_waiter {
            Some(to_waiter) => to_waiter.send(pending).err().map(|error| error.0),
            None => Some(pending),
        };
        if let Some(pending) = unsent {
            // No waiter thread (it cannot be gone while the backend lives): wait here.
            let outcome = pending
                .event
                .synchronize()
                .map_err(|error| GpuError::cuda("running the kernel", error));
            signal.finish(outcome);
        }
        Ok(Completion::pending(signal))
    }
}

/// The waiter thread: waits for each launch's event in submission order and reports it.
fn wait_for_launches(
    ctx: &Arc<CudaContext>,
    launches: &Receiver<PendingLaunch>,
    spare_events: &Mutex<Vec<BlockingEvent>>,
) {
    if let Err(error) = ctx.bind_to_thread() {
        tracing::warn!(error = %driver_error_text(error), "CUDA event thread cannot bind the context");
    }
    while let Ok(PendingLaunch { event, signal }) = launches.recv() {
        let outcome = event.synchronize();
        if outcome.is_ok() {
            spare_events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(event);
        }
        signal.finish(outcome.map_err(|error| GpuError::cuda("running the kernel", error)));
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Closing the channel lets the waiter report every launch still queued, then exit.
        let launcher = self
            .launcher
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        launcher.to_waiter = None;
        if let Some(waiter) = self.waiter.take() {
            let _ = waiter.join();
        }
    }
}

impl Backend for CudaBackend {
    fn device(&self) -> &Device {
        &self.device
    }

    fn load_builtin(&self, kernel: BuiltinKernel) -> Result<Kernel, GpuError> {
        Ok(Kernel::builtin(kernel))
    }

    fn load_ptx(&self, ptx: &str, entry: &str) -> Result<Kernel, GpuError> {
        catching_driver_panics(|| {
            let function = self.load_ptx_function(ptx, entry, "tenant PTX")?;
            Ok(Kernel {
                kind: KernelKind::Ptx(function),
            })
        })
    }

    fn load_cubin(&self, cubin: &[u8], entry: &str) -> Result<Kernel, GpuError> {
        crate::cubin::check_cubin(cubin)?;
        catching_driver_panics(|| {
            let function =
                self.load_function(Ptx::from_binary(cubin.to_vec()), entry, "tenant cubin")?;
            Ok(Kernel {
                kind: KernelKind::Ptx(function),
            })
        })
    }

    fn load_program(&self, program: Arc<dyn KernelProgram>) -> Result<Kernel, GpuError> {
        let (loaded, _) = catching_driver_panics(|| self.load_program_function(&program))?;
        Ok(Kernel {
            kind: KernelKind::Program(loaded),
        })
    }

    unsafe fn launch_unscoped<'m>(
        &self,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &'m mut [u8],
    ) -> Result<Completion<'m>, GpuError> {
        validate::check_config(config)?;
        let base = memory.as_mut_ptr() as u64;
        match &kernel.kind {
            KernelKind::Builtin(builtin) => {
                let call = validate::plan_builtin(*builtin, args, memory.len())?;
                self.check_reachable(memory)?;
                let params = Self::builtin_params(call, base);
                self.submit(self.builtins.get(*builtin), &params, config)
            }
            KernelKind::Ptx(function) => {
                if function.backend_id != self.id {
                    return Err(GpuError::InvalidArgument(format!(
                        "kernel `{}` was loaded by another CUDA backend",
                        function.entry()
                    )));
                }
                validate::check_buffers(function.entry(), args, memory.len())?;
                let params = Self::tenant_params(function, args, base)?;
                self.check_reachable(memory)?;
                self.submit(&function.function, &params, config)
            }
            KernelKind::Program(loaded) => {
                let program = &loaded.program;
                validate::check_buffers(program.name(), args, memory.len())?;
                program.validate(config, args, memory.len())?;
                // A program loaded by another backend (or the CPU) is loaded here on first use.
                let function = match &loaded.function {
                    Some(function) if function.backend_id == self.id => function.clone(),
                    _ => catching_driver_panics(|| self.load_program_function(program))?.1,
                };
                let params = Self::tenant_params(&function, args, base)?;
                self.check_reachable(memory)?;
                self.submit(&function.function, &params, config)
            }
        }
    }

    fn cuda_context(&self) -> Option<Arc<CudaContext>> {
        Some(self.ctx.clone())
    }
}

/// The size of each parameter of `function`, from `cuFuncGetParamInfo` (CUDA 12.4+).
fn param_sizes(ctx: &Arc<CudaContext>, function: &CudaFunction) -> Result<Vec<usize>, GpuError> {
    ctx.bind_to_thread()
        .map_err(|error| GpuError::cuda("binding the context", error))?;
    let mut sizes = Vec::new();
    loop {
        if sizes.len() > MAX_TENANT_PARAMS {
            return Err(GpuError::InvalidArgument(format!(
                "kernel has more than {MAX_TENANT_PARAMS} parameters"
            )));
        }
        let (mut offset, mut size) = (0usize, 0usize);
        // SAFETY: the function handle is alive (held by `function`); `offset` and `size` are
        // valid places for the two size_t values the driver writes.
        let queried = unsafe {
            sys::cuFuncGetParamInfo(function.cu_function(), sizes.len(), &mut offset, &mut size)
        }
        .result();
        match queried {
            Ok(()) => sizes.push(size),
            // Past the last parameter.
            Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)) => return Ok(sizes),
            Err(error) => return Err(GpuError::cuda("reading the kernel's parameters", error)),
        }
    }
}
