//! The CUDA backend: device discovery, the builtin PTX modules, tenant PTX and cubin,
//! host-described programs (loaded once per fingerprint and context), launches on per-tenant
//! lanes, and completion through blocking-sync events waited on by each lane's thread.
//!
//! Lanes (see [`crate::isolation`]): at [`GpuIsolation::StreamPerTenant`] a tenant's lane is a
//! stream of its own in the device's primary context, which every such lane shares; at
//! [`GpuIsolation::ContextPerTenant`] it is a stream in a non-primary context of the tenant's
//! own (`cuCtxCreate`), with its own copies of the builtin modules and its own program cache.
//! The level is the tenant's ([`TenantKey::isolation`]) or, for a key naming none, the one the
//! backend was opened with; lanes of both kinds live side by side.
//! Guest memory is CUDA managed memory allocated in the primary context (`CU_MEM_ATTACH_GLOBAL`),
//! which the driver documents as valid on every device and stream, so every lane reaches it.
//! Each lane has a thread that waits for its launches in submission order: a slow kernel of one
//! tenant does not delay the completion of another tenant's kernel.
//!
//! cudarc panics when `libcuda.so` is missing, so every entry point here first probes for the
//! library (`is_culib_present`) and runs the driver calls under `catch_unwind` as a second line
//! of defence (an older driver lacking a symbol also panics inside cudarc).

use std::ffi::{c_int, c_uint, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use cudarc::driver::{sys, CudaContext, CudaFunction, CudaStream, DriverError, PushKernelArg};
use cudarc::nvrtc::Ptx;

use crate::completion::Signal;
use crate::error::driver_error_text;
use crate::isolation::TenantLaneMap;
use crate::kernel::{KernelKind, ProgramKernel};
use crate::program::{ProgramCache, PROGRAM_CACHE_CAPACITY};
use crate::validate::{self, BuiltinCall};
use crate::{
    Backend, BuiltinKernel, Completion, CudaDeviceInfo, Device, GpuError, GpuIsolation, Kernel,
    KernelArg, KernelProgram, LaunchConfig, TenantKey, TenantLaneStats,
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
    /// The [`ContextState::id`] of the context the module was loaded in.
    context_id: u64,
    /// Tenant code: the tenant it was loaded for, and the lane it runs in. `None` for a
    /// program's function (programs may run for any tenant; they are cached per context).
    owner: Option<(TenantKey, Arc<Lane>)>,
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

/// One CUDA context and what is loaded in it: the builtins, the programs by fingerprint, and
/// completion events to reuse.
struct ContextState {
    /// Unique among all contexts of all backends of this process.
    id: u64,
    ctx: Arc<CudaContext>,
    builtins: BuiltinFunctions,
    /// Loaded programs by fingerprint: the program loaded first, and its function.
    programs: ProgramCache<(Arc<ProgramKernel>, Arc<PtxFunction>)>,
    spare_events: Mutex<Vec<BlockingEvent>>,
}

impl ContextState {
    /// Loads the builtins into `ctx`.
    fn new(ctx: Arc<CudaContext>) -> Result<Arc<Self>, GpuError> {
        static NEXT_CONTEXT_ID: AtomicU64 = AtomicU64::new(1);
        let builtins = BuiltinFunctions::load(&ctx)?;
        Ok(Arc::new(Self {
            id: NEXT_CONTEXT_ID.fetch_add(1, Ordering::Relaxed),
            ctx,
            builtins,
            programs: ProgramCache::new(PROGRAM_CACHE_CAPACITY),
            spare_events: Mutex::new(Vec::new()),
        }))
    }

    /// Makes this context current on the calling thread, unconditionally.
    ///
    /// cudarc binds a context only when the thread's current handle differs from it. Tenant
    /// contexts are destroyed and created as tenants come and go, and a thread may still have a
    /// destroyed one current; should the driver hand out the same handle again, that check
    /// would skip the bind. Setting it here first rules that out. (The primary context lives
    /// as long as the backend, so it needs none of this.)
    fn make_current(&self) -> Result<(), GpuError> {
        if self.ctx.is_primary() {
            return Ok(());
        }
        // SAFETY: the context is alive (held by `self`); making it current has no other effect.
        unsafe { sys::cuCtxSetCurrent(self.ctx.cu_ctx()) }
            .result()
            .map_err(|error| GpuError::cuda("making a tenant context current", error))
    }

    /// A completion event of this context: a spare one, or a new one.
    fn event(&self) -> Result<BlockingEvent, GpuError> {
        // The pool is a plain list of whole events: a poisoned lock still holds a valid one.
        let spare = self
            .spare_events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .pop();
        match spare {
            Some(event) => Ok(event),
            None => BlockingEvent::new(&self.ctx)
                .map_err(|error| GpuError::cuda("creating a completion event", error)),
        }
    }
}

/// Where one tenant's launches go: a stream (in the shared context or in the tenant's own, as
/// the isolation level says) and the thread that waits for the launches on it.
///
/// The thread holds the context and the stream until it has reported every launch sent to it,
/// so a lane that leaves the tenant map (or a backend that is dropped) never cuts a launch short.
pub(crate) struct Lane {
    context: Arc<ContextState>,
    stream: Arc<CudaStream>,
    /// The way to the waiter thread; `None` once closed. Held while submitting, so launches
    /// reach the waiter in the order they were queued on the stream.
    to_waiter: Mutex<Option<Sender<PendingLaunch>>>,
    waiter: Mutex<Option<JoinHandle<()>>>,
    /// Set by the waiter when a kernel on this lane failed while running. Such errors (an
    /// illegal address, a trap) are sticky: the context is unusable from then on.
    faulted: Arc<AtomicBool>,
}

impl Lane {
    /// A new stream in `context` and its waiter thread.
    fn open(context: Arc<ContextState>, thread_name: String) -> Result<Arc<Self>, GpuError> {
        let stream = context
            .ctx
            .new_stream()
            .map_err(|error| GpuError::cuda("creating a tenant stream", error))?;
        let (to_waiter, from_launches) = mpsc::channel();
        let faulted = Arc::new(AtomicBool::new(false));
        let waiter = {
            let context = context.clone();
            let stream = stream.clone();
            let faulted = faulted.clone();
            std::thread::Builder::new()
                .name(thread_name)
                .spawn(move || {
                    wait_for_launches(&context, &from_launches, &faulted);
                    // Every launch on the stream has been reported: it may be destroyed now.
                    drop(stream);
                })
                .map_err(|error| {
                    GpuError::NotAvailable(format!("cannot start a CUDA event thread: {error}"))
                })?
        };
        Ok(Arc::new(Self {
            context,
            stream,
            to_waiter: Mutex::new(Some(to_waiter)),
            waiter: Mutex::new(Some(waiter)),
            faulted,
        }))
    }

    /// Whether a kernel on this lane failed while running.
    fn faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }

    /// Closes the way to the waiter thread, which reports the launches still queued and ends;
    /// with `join`, waits for that.
    fn close(&self, join: bool) {
        // Both locks hold an `Option` replaced whole: a poisoned lock still holds a valid one.
        self.to_waiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let waiter = self
            .waiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let (true, Some(waiter)) = (join, waiter) {
            if waiter.thread().id() != std::thread::current().id() {
                let _ = waiter.join();
            }
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // Detach the thread rather than wait for it: the drop may happen on a launching thread
        // of another tenant (an eviction), which must not wait for this tenant's kernels.
        self.close(false);
    }
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
    ordinal: usize,
    device: Device,
    compute_capability: (u32, u32),
    driver_version: i32,
    pageable_memory_access: bool,
    concurrent_managed_access: bool,
    /// The level of tenants whose key names none.
    isolation: GpuIsolation,
    /// The device's primary context: guest memory is allocated in it, and every stream lane
    /// (`StreamPerTenant`) is a stream in it.
    shared: Arc<ContextState>,
    /// Each tenant's lane, created on first use, in the map of its level (at most
    /// `level.lane_capacity()` lanes of each kind).
    lanes: TenantLaneMap<Arc<Lane>>,
    /// Numbers the lanes' thread names.
    next_lane: AtomicU64,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("device", &self.device)
            .field("isolation", &self.isolation)
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// Opens device `ordinal`: its primary context and the builtin modules in it. Tenant lanes
    /// (streams, or contexts at `ContextPerTenant`) are created on each tenant's first use;
    /// `isolation` is the level of tenants whose key names none.
    pub(crate) fn open(ordinal: usize, isolation: GpuIsolation) -> Result<Self, GpuError> {
        with_driver(|| Self::open_with_driver(ordinal, isolation))
    }

    fn open_with_driver(ordinal: usize, isolation: GpuIsolation) -> Result<Self, GpuError> {
        let count = init_driver()?;
        if ordinal >= count {
            return Err(GpuError::NotAvailable(format!(
                "no CUDA device {ordinal}: the driver reports {count} device(s)"
            )));
        }
        let ctx = CudaContext::new(ordinal)
            .map_err(|error| GpuError::cuda("creating the context", error))?;
        let info = query_device(&ctx)?;
        // The builtins are loaded here even when tenants get contexts of their own: a builtin
        // whose parameters do not match the launch code refuses to open the backend, and any
        // tenant may ask for a stream lane in this context.
        let shared = ContextState::new(ctx)?;
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        tracing::info!(
            device = %Device::Cuda(info.clone()),
            default_isolation = %isolation,
            max_stream_lanes = GpuIsolation::StreamPerTenant.lane_capacity(),
            max_context_lanes = GpuIsolation::ContextPerTenant.lane_capacity(),
            "CUDA backend open"
        );
        Ok(Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            ordinal,
            compute_capability: info.compute_capability,
            driver_version: info.driver_version,
            pageable_memory_access: info.pageable_memory_access,
            concurrent_managed_access: info.concurrent_managed_access,
            device: Device::Cuda(info),
            isolation,
            shared,
            lanes: TenantLaneMap::new(isolation),
            next_lane: AtomicU64::new(0),
        })
    }

    /// The lane of `tenant`, created on first use at the tenant's level: a stream in the shared
    /// context, or a new context of the tenant's own with a stream in it.
    ///
    /// A context lane whose context a kernel fault made unusable is replaced by a new one (a new
    /// context). A stream lane has nothing to replace: the fault broke the one shared context
    /// (see `docs/ARCHITECTURE.md`).
    fn lane(&self, tenant: &TenantKey) -> Result<Arc<Lane>, GpuError> {
        let open = |level| self.open_lane(tenant, level);
        let (lane, level) = self.lanes.get_or_create(tenant, open)?;
        if level == GpuIsolation::ContextPerTenant && lane.faulted() {
            if self
                .lanes
                .remove_if(tenant, |known| Arc::ptr_eq(known, &lane))
            {
                tracing::info!(
                    tenant = tenant.as_str(),
                    "replacing the tenant's CUDA context after a kernel fault"
                );
            }
            return Ok(self.lanes.get_or_create(tenant, open)?.0);
        }
        Ok(lane)
    }

    /// A new lane for `tenant` at `level`.
    fn open_lane(&self, tenant: &TenantKey, level: GpuIsolation) -> Result<Arc<Lane>, GpuError> {
        catching_driver_panics(|| {
            let context = match level {
                GpuIsolation::StreamPerTenant => self.shared.clone(),
                GpuIsolation::ContextPerTenant => {
                    let ctx = CudaContext::new_non_primary(self.ordinal, 0).map_err(|error| {
                        GpuError::cuda("creating a context for a tenant", error)
                    })?;
                    ContextState::new(ctx)?
                }
            };
            let number = self.next_lane.fetch_add(1, Ordering::Relaxed);
            let lane = Lane::open(
                context,
                format!("tensor-wasm-cuda{}-lane{number}", self.ordinal),
            )?;
            tracing::debug!(
                tenant = tenant.as_str(),
                isolation = %level,
                "GPU lane created"
            );
            Ok(lane)
        })
    }

    /// The context `tenant`'s programs load into: the shared one for a tenant at
    /// `StreamPerTenant` (no lane needed), else the tenant's own.
    fn program_context(&self, tenant: &TenantKey) -> Result<Arc<ContextState>, GpuError> {
        match self.lanes.level_of(tenant) {
            GpuIsolation::StreamPerTenant => Ok(self.shared.clone()),
            GpuIsolation::ContextPerTenant => Ok(self.lane(tenant)?.context.clone()),
        }
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
        // Guest memory was allocated in the primary context; ask about it there.
        self.shared
            .ctx
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

    /// Checks PTX text (`what` names it in errors) for NUL bytes and makes it a module image.
    fn ptx_image(ptx: &str, what: &str) -> Result<Ptx, GpuError> {
        if ptx.contains('\0') {
            return Err(GpuError::InvalidArgument(format!(
                "{what}: PTX text contains a NUL byte"
            )));
        }
        Ok(Ptx::from_src(ptx))
    }

    /// Loads `entry` from a module image (PTX text without NUL bytes, or a checked cubin) into
    /// `context` and reads its parameter layout; `owner` is the tenant and lane of tenant code.
    fn load_function(
        &self,
        context: &ContextState,
        owner: Option<(TenantKey, Arc<Lane>)>,
        image: Ptx,
        entry: &str,
        what: &str,
    ) -> Result<Arc<PtxFunction>, GpuError> {
        if entry.is_empty() || entry.contains('\0') {
            return Err(GpuError::InvalidArgument(format!(
                "{what}: invalid entry name {entry:?}"
            )));
        }
        context.make_current()?;
        let module = context
            .ctx
            .load_module(image)
            .map_err(|error| GpuError::cuda(&format!("loading {what}"), error))?;
        let function = module.load_function(entry).map_err(|error| {
            GpuError::cuda(&format!("finding entry `{entry}` in {what}"), error)
        })?;
        let param_sizes = param_sizes(&context.ctx, &function)?;
        Ok(Arc::new(PtxFunction {
            backend_id: self.id,
            context_id: context.id,
            owner,
            entry: entry.to_owned(),
            function,
            param_sizes,
        }))
    }

    /// Loads tenant code for `tenant` into its lane.
    fn load_tenant_function(
        &self,
        tenant: &TenantKey,
        image: impl FnOnce() -> Result<Ptx, GpuError>,
        entry: &str,
        what: &str,
    ) -> Result<Kernel, GpuError> {
        let image = image()?;
        catching_driver_panics(|| {
            let lane = self.lane(tenant)?;
            let context = lane.context.clone();
            let owner = Some((tenant.clone(), lane));
            let function = self.load_function(&context, owner, image, entry, what)?;
            Ok(Kernel {
                kind: KernelKind::Ptx(function),
            })
        })
    }

    /// The loaded program with the fingerprint of `program`, and its function in `context`:
    /// from the context's cache, or loaded from the PTX of `program`.
    fn load_program_function(
        &self,
        context: &ContextState,
        program: &Arc<dyn KernelProgram>,
    ) -> Result<(Arc<ProgramKernel>, Arc<PtxFunction>), GpuError> {
        context.programs.get_or_load(program.fingerprint(), || {
            let (ptx, entry) = program.ptx(self.compute_capability, self.driver_version)?;
            let what = format!("the PTX of program `{}`", program.name());
            let image = Self::ptx_image(&ptx, &what)?;
            let function = self.load_function(context, None, image, &entry, &what)?;
            let loaded = Arc::new(ProgramKernel {
                program: program.clone(),
                function: Some(function.clone()),
            });
            Ok((loaded, function))
        })
    }

    /// Submits `function` (loaded in the lane's context) with `params` to `lane`'s stream and
    /// hands its completion to the lane's waiter thread.
    fn submit<'m>(
        lane: &Lane,
        function: &CudaFunction,
        params: &[Param],
        config: &LaunchConfig,
    ) -> Result<Completion<'m>, GpuError> {
        // Held until the launch is handed to the waiter, so the waiter sees launches in stream
        // order. The lock holds an `Option` replaced whole: a poisoned one is still valid.
        let to_waiter = lane
            .to_waiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        lane.context.make_current()?;
        let event = lane.context.event()?;
        let mut builder = lane.stream.launch_builder(function);
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
        if let Err(error) = event.record(&lane.stream) {
            // The kernel may be running and no event tracks it: wait for the stream before the
            // borrow of guest memory ends with this error.
            let _ = lane.stream.synchronize();
            return Err(GpuError::cuda("recording the completion event", error));
        }
        let signal = Signal::new();
        let pending = PendingLaunch {
            event,
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

/// A lane's waiter thread: waits for each launch's event in submission order and reports it,
/// until the lane is closed. A failed kernel marks the lane `faulted`.
fn wait_for_launches(
    context: &ContextState,
    launches: &Receiver<PendingLaunch>,
    faulted: &AtomicBool,
) {
    if let Err(error) = context.ctx.bind_to_thread() {
        tracing::warn!(error = %driver_error_text(error), "CUDA event thread cannot bind the context");
    }
    while let Ok(PendingLaunch { event, signal }) = launches.recv() {
        let outcome = event.synchronize();
        match outcome {
            Ok(()) => context
                .spare_events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(event),
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

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Closing each lane lets its waiter report every launch still queued, then exit. (Lanes
        // that tenant kernels still hold are closed too; those kernels can no longer launch
        // without this backend.)
        for lane in self.lanes.take_all() {
            lane.close(true);
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

    fn load_ptx(&self, tenant: &TenantKey, ptx: &str, entry: &str) -> Result<Kernel, GpuError> {
        let what = "tenant PTX";
        self.load_tenant_function(tenant, || Self::ptx_image(ptx, what), entry, what)
    }

    fn load_cubin(
        &self,
        tenant: &TenantKey,
        cubin: &[u8],
        entry: &str,
    ) -> Result<Kernel, GpuError> {
        crate::cubin::check_cubin(cubin)?;
        let image = || Ok(Ptx::from_binary(cubin.to_vec()));
        self.load_tenant_function(tenant, image, entry, "tenant cubin")
    }

    fn load_program(
        &self,
        tenant: &TenantKey,
        program: Arc<dyn KernelProgram>,
    ) -> Result<Kernel, GpuError> {
        let (loaded, _) = catching_driver_panics(|| {
            let context = self.program_context(tenant)?;
            self.load_program_function(&context, &program)
        })?;
        let loaded = match self.lanes.level_of(tenant) {
            // The shared context: the function is the one every stream lane uses (a tenant in a
            // context of its own finds the program in its context on its first launch).
            GpuIsolation::StreamPerTenant => loaded,
            // Each launch finds the function in the launching tenant's context; holding this
            // tenant's function here would keep its context alive as long as the kernel.
            GpuIsolation::ContextPerTenant => Arc::new(ProgramKernel {
                program: loaded.program.clone(),
                function: None,
            }),
        };
        Ok(Kernel {
            kind: KernelKind::Program(loaded),
        })
    }

    unsafe fn launch_unscoped<'m>(
        &self,
        tenant: &TenantKey,
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
                let lane = self.lane(tenant)?;
                Self::submit(&lane, lane.context.builtins.get(*builtin), &params, config)
            }
            KernelKind::Ptx(function) => {
                if function.backend_id != self.id {
                    return Err(GpuError::InvalidArgument(format!(
                        "kernel `{}` was loaded by another CUDA backend",
                        function.entry()
                    )));
                }
                // Tenant code runs for the tenant it was loaded for, in the lane (context) it
                // was loaded in, even if that lane has since left the tenant map or the
                // tenant's level has changed since.
                let lane = match &function.owner {
                    Some((owner, lane)) if owner.same_tenant(tenant) => lane,
                    _ => {
                        return Err(GpuError::InvalidArgument(format!(
                            "kernel `{}` was loaded for another tenant",
                            function.entry()
                        )))
                    }
                };
                validate::check_buffers(function.entry(), args, memory.len())?;
                let params = Self::tenant_params(function, args, base)?;
                self.check_reachable(memory)?;
                Self::submit(lane, &function.function, &params, config)
            }
            KernelKind::Program(loaded) => {
                let program = &loaded.program;
                validate::check_buffers(program.name(), args, memory.len())?;
                program.validate(config, args, memory.len())?;
                let lane = self.lane(tenant)?;
                // A program loaded by another backend, in another context or on the CPU is
                // loaded into this lane's context on first use.
                let function = match &loaded.function {
                    Some(function)
                        if function.backend_id == self.id
                            && function.context_id == lane.context.id =>
                    {
                        function.clone()
                    }
                    _ => {
                        catching_driver_panics(|| {
                            self.load_program_function(&lane.context, program)
                        })?
                        .1
                    }
                };
                let params = Self::tenant_params(&function, args, base)?;
                self.check_reachable(memory)?;
                Self::submit(&lane, &function.function, &params, config)
            }
        }
    }

    fn cuda_context(&self) -> Option<Arc<CudaContext>> {
        Some(self.shared.ctx.clone())
    }

    fn isolation(&self) -> GpuIsolation {
        self.isolation
    }

    fn tenant_lanes(&self, isolation: GpuIsolation) -> Option<TenantLaneStats> {
        Some(self.lanes.stats(isolation))
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
