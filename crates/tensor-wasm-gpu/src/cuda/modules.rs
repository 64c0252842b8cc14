//! Module loading: what one CUDA context holds (the builtin modules, the programs loaded by
//! fingerprint, spare completion events), and tenant PTX, tenant cubin and program PTX loaded
//! into a context as a [`PtxFunction`] with the parameter layout the driver reports.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use cudarc::driver::{sys, CudaContext, CudaFunction, DriverError};
use cudarc::nvrtc::Ptx;

use super::events::BlockingEvent;
use super::lane::Lane;
use super::probe::catching_driver_panics;
use super::CudaBackend;
use crate::kernel::{KernelKind, LoadedFunction, ProgramKernel};
use crate::program::{ProgramCache, PROGRAM_CACHE_CAPACITY};
use crate::{BuiltinKernel, GpuError, Kernel, KernelProgram, TenantKey};

/// Most parameters accepted from a tenant kernel (CUDA allows at most 32 764 bytes of them).
const MAX_TENANT_PARAMS: usize = 4096;

/// A function loaded from tenant PTX or cubin, or from a program's PTX, with the parameter
/// layout the driver reports.
pub(super) struct PtxFunction {
    pub(super) backend_id: u64,
    /// The [`ContextState::id`] of the context the module was loaded in.
    pub(super) context_id: u64,
    /// Tenant code: the tenant it was loaded for, and the lane it runs in. `None` for a
    /// program's function (programs may run for any tenant; they are cached per context).
    pub(super) owner: Option<(TenantKey, Arc<Lane>)>,
    entry: String,
    pub(super) function: CudaFunction,
    /// The sizes of the parameters a launch passes: all of the entry's, or for a fenced
    /// kernel all but the rewrite's hidden ones, which the launch adds.
    pub(super) param_sizes: Vec<usize>,
    /// Whether the function is fenced tenant code (its entry ends with the hidden parameters).
    pub(super) fenced: bool,
    /// A fenced module's lean entry (the tenant's own code, same parameters) and the
    /// launch-time proof that decides, per launch, whether it may run instead.
    pub(super) lean: Option<(CudaFunction, tensor_wasm_ptx_verify::Plan)>,
}

impl LoadedFunction for PtxFunction {
    fn entry(&self) -> &str {
        &self.entry
    }

    fn param_sizes(&self) -> &[usize] {
        &self.param_sizes
    }
}

/// One CUDA context and what is loaded in it: the builtins, the programs by fingerprint, and
/// completion events to reuse.
pub(super) struct ContextState {
    /// Unique among all contexts of all backends of this process.
    pub(super) id: u64,
    pub(super) ctx: Arc<CudaContext>,
    pub(super) builtins: BuiltinFunctions,
    /// Loaded programs by fingerprint: the program loaded first, and its function.
    pub(super) programs: ProgramCache<(Arc<ProgramKernel>, Arc<PtxFunction>)>,
    pub(super) spare_events: Mutex<Vec<BlockingEvent>>,
}

impl ContextState {
    /// Loads the builtins into `ctx`.
    pub(super) fn new(ctx: Arc<CudaContext>) -> Result<Arc<Self>, GpuError> {
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
    pub(super) fn make_current(&self) -> Result<(), GpuError> {
        if self.ctx.is_primary() {
            return Ok(());
        }
        // SAFETY: the context is alive (held by `self`); making it current has no other effect.
        unsafe { sys::cuCtxSetCurrent(self.ctx.cu_ctx()) }
            .result()
            .map_err(|error| GpuError::cuda("making a tenant context current", error))
    }

    /// An event of this context, `timed` or not: a spare one, or a new one.
    pub(super) fn event(&self, timed: bool) -> Result<BlockingEvent, GpuError> {
        // The pool is a plain list of whole events: a poisoned lock still holds a valid one.
        let spare = {
            let mut spares = self
                .spare_events
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            spares
                .iter()
                .rposition(|e| e.timed == timed)
                .map(|at| spares.swap_remove(at))
        };
        match spare {
            Some(event) => Ok(event),
            None => BlockingEvent::new(&self.ctx, timed)
                .map_err(|error| GpuError::cuda("creating a completion event", error)),
        }
    }

    /// Keeps `event` (completed) for a later launch.
    pub(super) fn spare(&self, event: BlockingEvent) {
        self.spare_events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(event);
    }
}

/// The three builtin functions, loaded when the backend opens.
pub(super) struct BuiltinFunctions {
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
            let sizes = param_sizes(ctx, &function, Some(kernel.param_sizes().len()))?;
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

    pub(super) fn get(&self, kernel: BuiltinKernel) -> &CudaFunction {
        match kernel {
            BuiltinKernel::VectorAdd => &self.vector_add,
            BuiltinKernel::Scale => &self.scale,
            BuiltinKernel::Matmul => &self.matmul,
        }
    }
}

impl CudaBackend {
    /// Checks PTX text (`what` names it in errors) for NUL bytes and makes it a module image.
    pub(super) fn ptx_image(ptx: &str, what: &str) -> Result<Ptx, GpuError> {
        if ptx.contains('\0') {
            return Err(GpuError::InvalidArgument(format!(
                "{what}: PTX text contains a NUL byte"
            )));
        }
        Ok(Ptx::from_src(ptx))
    }

    /// Loads `entry` from a module image (PTX text without NUL bytes, or a checked cubin) into
    /// `context` and reads its parameter layout (`params`: the count, when our own code says
    /// it; see [`param_sizes`]); `owner` is the tenant and lane of tenant code.
    fn load_function(
        &self,
        context: &ContextState,
        owner: Option<(TenantKey, Arc<Lane>)>,
        image: Ptx,
        entry: &str,
        what: &str,
        params: Option<usize>,
    ) -> Result<Arc<PtxFunction>, GpuError> {
        self.load_function_with(context, owner, image, entry, what, params, None)
            .map(|(function, _)| function)
    }

    /// [`CudaBackend::load_function`], also finding the entry `also` in the same module.
    #[allow(clippy::too_many_arguments)]
    fn load_function_with(
        &self,
        context: &ContextState,
        owner: Option<(TenantKey, Arc<Lane>)>,
        image: Ptx,
        entry: &str,
        what: &str,
        params: Option<usize>,
        also: Option<&str>,
    ) -> Result<(Arc<PtxFunction>, Option<CudaFunction>), GpuError> {
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
        let also = match also {
            Some(name) => Some(module.load_function(name).map_err(|error| {
                GpuError::cuda(&format!("finding entry `{name}` in {what}"), error)
            })?),
            None => None,
        };
        let sizes = param_sizes(&context.ctx, &function, params)?;
        // The second entry is launched with the first one's parameters: same layout only.
        let also = match also {
            Some(f) if param_sizes(&context.ctx, &f, params)? == sizes => Some(f),
            _ => None,
        };
        let param_sizes = sizes;
        let loaded = Arc::new(PtxFunction {
            backend_id: self.id,
            context_id: context.id,
            owner,
            entry: entry.to_owned(),
            function,
            param_sizes,
            fenced: false,
            lean: None,
        });
        Ok((loaded, also))
    }

    /// Loads tenant code for `tenant` into its lane; `fenced` code's entry must end with the
    /// rewrite's hidden parameters (four of 8 bytes), which its launches fill in, and its
    /// `plan` names the module's lean entry, loaded beside it.
    pub(super) fn load_tenant_function(
        &self,
        tenant: &TenantKey,
        image: impl FnOnce() -> Result<Ptx, GpuError>,
        entry: &str,
        what: &str,
        fenced: Option<Option<tensor_wasm_ptx_verify::Plan>>,
    ) -> Result<Kernel, GpuError> {
        let image = image()?;
        catching_driver_panics(|| {
            let lane = self.lane(tenant)?;
            let context = lane.context.clone();
            let owner = Some((tenant.clone(), lane));
            let lean_entry = fenced
                .as_ref()
                .and_then(|plan| plan.as_ref())
                .map(|p| p.lean_entry());
            let (mut function, lean) =
                self.load_function_with(&context, owner, image, entry, what, None, lean_entry)?;
            if let Some(plan) = fenced {
                let loaded = Arc::get_mut(&mut function).expect("just loaded, not shared");
                loaded.lean = lean.zip(plan);
                let hidden = tensor_wasm_ptx_verify::HIDDEN_PARAMS.len();
                let own = loaded.param_sizes.len().checked_sub(hidden);
                match own {
                    Some(own) if loaded.param_sizes[own..].iter().all(|&size| size == 8) => {
                        loaded.param_sizes.truncate(own);
                        loaded.fenced = true;
                    }
                    _ => {
                        return Err(GpuError::InvalidArgument(format!(
                            "kernel `{entry}` is not fenced: its entry does not end with the \
                             rewrite's {hidden} hidden parameters"
                        )))
                    }
                }
            }
            Ok(Kernel {
                kind: KernelKind::Ptx(function),
                fingerprint: None,
            })
        })
    }

    /// The loaded program with the fingerprint of `program`, and its function in `context`:
    /// from the context's cache, or loaded from the PTX of `program`.
    pub(super) fn load_program_function(
        &self,
        context: &ContextState,
        program: &Arc<dyn KernelProgram>,
    ) -> Result<(Arc<ProgramKernel>, Arc<PtxFunction>), GpuError> {
        context.programs.get_or_load(program.fingerprint(), || {
            let (ptx, entry) = program.ptx(self.compute_capability, self.driver_version)?;
            let what = format!("the PTX of program `{}`", program.name());
            let image = Self::ptx_image(&ptx, &what)?;
            let params = program.param_count();
            let function = self.load_function(context, None, image, &entry, &what, params)?;
            let loaded = Arc::new(ProgramKernel {
                program: program.clone(),
                function: Some(function.clone()),
            });
            Ok((loaded, function))
        })
    }
}

/// The size of each parameter of `function`, from `cuFuncGetParamInfo` (CUDA 12.4+).
///
/// `known` is the parameter count of a kernel whose PTX our own code wrote (a builtin, a
/// program that declares [`KernelProgram::param_count`]): exactly those parameters are read,
/// and a driver that reports fewer fails the load. Of tenant code the count is unknown (drivers
/// before CUDA 13.2 have no `cuFuncGetParamCount`): the parameters are read until the driver
/// answers `CUDA_ERROR_INVALID_VALUE` for the index past the last, the one driver error a load
/// provokes on purpose (compute-sanitizer lists it; the GPU suite's sanitizer section counts
/// it apart from every other report).
pub(crate) fn param_sizes(
    ctx: &Arc<CudaContext>,
    function: &CudaFunction,
    known: Option<usize>,
) -> Result<Vec<usize>, GpuError> {
    ctx.bind_to_thread()
        .map_err(|error| GpuError::cuda("binding the context", error))?;
    let mut sizes = Vec::new();
    loop {
        if known == Some(sizes.len()) {
            return Ok(sizes);
        }
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
            Err(DriverError(sys::CUresult::CUDA_ERROR_INVALID_VALUE)) => match known {
                // Past the last parameter.
                None => return Ok(sizes),
                Some(count) => {
                    return Err(GpuError::Cuda(format!(
                        "the kernel's PTX declares {count} parameters, the driver found {}",
                        sizes.len()
                    )))
                }
            },
            Err(error) => return Err(GpuError::cuda("reading the kernel's parameters", error)),
        }
    }
}
