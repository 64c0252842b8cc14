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
//!
//! # Layout
//! - this file: [`CudaBackend`], how it opens a device, and the [`Backend`] it implements;
//! - [`probe`]: driver probing (is `libcuda.so` there, `cuInit`, what each device reports,
//!   whether a device reaches guest memory) with cudarc's panics turned into errors;
//! - [`modules`]: what a context holds (the builtin modules, the program cache, spare events)
//!   and the loading of tenant PTX, cubin and program PTX as a [`modules::PtxFunction`];
//! - [`lane`]: per-tenant lanes, each a stream with the thread that waits for its launches;
//! - [`launch`]: kernel parameters and the submission of a launch to a lane;
//! - [`events`]: completion by blocking-sync events and the lanes' waiter threads.

mod events;
mod lane;
mod launch;
mod modules;
mod probe;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaContext;
use cudarc::nvrtc::Ptx;

use self::lane::Lane;
use self::modules::{ContextState, PtxFunction};
use self::probe::{catching_driver_panics, init_driver, query_device, with_driver};
use crate::isolation::TenantLaneMap;
use crate::kernel::{KernelKind, LoadedFunction, ProgramKernel};
use crate::validate;
use crate::{
    Backend, BuiltinKernel, Completion, Device, GpuError, GpuIsolation, Kernel, KernelArg,
    KernelProgram, LaunchConfig, TenantKey, TenantLaneStats,
};

pub use self::events::set_timing_events;
pub(crate) use self::events::BlockingEvent;
pub(crate) use self::launch::{driver_config, params_for_layout, push_params, Param};
pub(crate) use self::modules::param_sizes;
pub(crate) use self::probe::query_all_devices;

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
        self.load_tenant_function(tenant, || Self::ptx_image(ptx, what), entry, what, None)
    }

    fn load_fenced_ptx(
        &self,
        tenant: &TenantKey,
        ptx: &str,
        entry: &str,
    ) -> Result<Kernel, GpuError> {
        let what = "fenced tenant PTX";
        let plan = tensor_wasm_ptx_verify::Plan::new(ptx, entry);
        let image = || Self::ptx_image(ptx, what);
        self.load_tenant_function(tenant, image, entry, what, Some(plan))
    }

    fn load_cubin(
        &self,
        tenant: &TenantKey,
        cubin: &[u8],
        entry: &str,
    ) -> Result<Kernel, GpuError> {
        crate::cubin::check_cubin(cubin)?;
        let image = || Ok(Ptx::from_binary(cubin.to_vec()));
        self.load_tenant_function(tenant, image, entry, "tenant cubin", None)
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
            fingerprint: None,
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
            KernelKind::Ptx(loaded) => {
                let function = match loaded.downcast_ref::<PtxFunction>() {
                    Some(function) if function.backend_id == self.id => function,
                    _ => {
                        return Err(GpuError::InvalidArgument(format!(
                            "kernel `{}` was loaded by another CUDA backend",
                            loaded.entry()
                        )))
                    }
                };
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
                let mut params = Self::tenant_params(function, args, base)?;
                self.check_reachable(memory)?;
                if function.fenced {
                    // The host writes the cancel word while the kernel runs.
                    if !self.concurrent_managed_access {
                        return Err(GpuError::NotAvailable(String::from(
                            "fenced tenant kernels need concurrent managed access (the host \
                             sets a running kernel's cancel word); this device has none",
                        )));
                    }
                    return Self::submit_fenced(
                        lane,
                        function,
                        &mut params,
                        args,
                        config,
                        base,
                        memory.len(),
                    );
                }
                Self::submit(lane, &function.function, &params, config)
            }
            KernelKind::Program(loaded) => {
                let program = &loaded.program;
                validate::check_buffers(program.name(), args, memory.len())?;
                program.validate(config, args, memory.len())?;
                let lane = self.lane(tenant)?;
                // A program loaded by another backend, in another context or on the CPU is
                // loaded into this lane's context on first use.
                let reloaded;
                let cached = loaded.function.as_deref();
                let function = match cached.and_then(|f| f.downcast_ref::<PtxFunction>()) {
                    Some(function)
                        if function.backend_id == self.id
                            && function.context_id == lane.context.id =>
                    {
                        function
                    }
                    _ => {
                        reloaded = catching_driver_panics(|| {
                            self.load_program_function(&lane.context, program)
                        })?
                        .1;
                        &*reloaded
                    }
                };
                let params = Self::tenant_params(function, args, base)?;
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
