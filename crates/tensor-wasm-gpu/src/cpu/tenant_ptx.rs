//! Tenant PTX on the CPU backend: run by the PTX interpreter (`tensor-wasm-ptx-emu`), which
//! checks every access against the guest memory it is given, so neither a fenced nor a raw
//! kernel can touch anything else; an access outside is the launch's error, as an illegal
//! address is on a GPU.
//!
//! A launch runs on a thread of its own, not on the worker pool: a tenant kernel is one
//! uninterruptible piece of interpreted work, which must not hold a worker that other
//! tenants' builtins wait for. It ends when the kernel does, or at its invocation's deadline:
//! the completion's cancel flag is the launch's cancel word (a fenced kernel's polls read it),
//! and the interpreter ends any thread that runs on without reading it.
//!
//! Guest memory is given to the interpreter at device address [`GUEST_BASE`]: a buffer
//! argument becomes `GUEST_BASE + offset`. A fenced kernel also gets the rewrite's hidden
//! parameters: its window (all of guest memory), its dynamic shared memory and the cancel
//! word's address ([`CANCEL_WORD`], below the window). A launch of a fenced module that its
//! launch-time proof admits ([`tensor_wasm_ptx_verify::Plan::admit`]) runs the module's lean
//! entry instead — the tenant's own code, without fences or polls — with the same parameters.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use tensor_wasm_ptx_emu::{Allocation, CancelWord, EmuError, Launch, Module};

use crate::completion::Signal;
use crate::kernel::LoadedFunction;
use crate::{GpuError, KernelArg, LaunchConfig, TenantKey};

/// Device address of guest-memory byte 0 in the interpreter.
pub(crate) const GUEST_BASE: u64 = 1 << 40;

/// Device address of the launch's cancel word: below the window, outside guest memory.
pub(crate) const CANCEL_WORD: u64 = GUEST_BASE - 4096;

/// The most PTX text one tenant kernel may have (the interpreter parses it whole).
pub const MAX_TENANT_PTX_BYTES: usize = 4 << 20;

/// Most instructions one thread of a tenant kernel may execute; a launch normally ends at
/// its invocation's deadline long before (the cancel word).
const STEP_LIMIT: u64 = 1 << 40;

/// A tenant kernel the interpreter runs: the parsed module, its entry, and whether it is
/// fenced (its entry then ends with the rewrite's hidden parameters).
pub(crate) struct InterpretedPtx {
    module: Module,
    entry: String,
    /// The sizes of the parameters the guest passes (the hidden ones excluded).
    param_sizes: Vec<usize>,
    tenant: TenantKey,
    fenced: bool,
    /// A fenced module's launch-time proof: a proven launch runs the lean entry (the
    /// tenant's own code, no fences or polls), which the interpreter bounds all the same.
    plan: Option<tensor_wasm_ptx_verify::Plan>,
}

impl LoadedFunction for InterpretedPtx {
    fn entry(&self) -> &str {
        &self.entry
    }

    fn param_sizes(&self) -> &[usize] {
        &self.param_sizes
    }
}

impl InterpretedPtx {
    /// Parses `ptx` and finds `entry`; a fenced module's entry must end with the hidden
    /// parameters ([`tensor_wasm_ptx_verify::HIDDEN_PARAMS`]).
    pub(crate) fn load(
        tenant: &TenantKey,
        ptx: &str,
        entry: &str,
        fenced: bool,
    ) -> Result<Self, GpuError> {
        if ptx.len() > MAX_TENANT_PTX_BYTES {
            return Err(GpuError::InvalidArgument(format!(
                "tenant PTX of {} bytes; the CPU backend's interpreter takes at most \
                 {MAX_TENANT_PTX_BYTES}",
                ptx.len()
            )));
        }
        let module = Module::parse(ptx)
            .map_err(|e| GpuError::InvalidArgument(format!("tenant PTX: {e}")))?;
        let kernel = module.kernel(entry).ok_or_else(|| {
            GpuError::InvalidArgument(format!("tenant PTX has no entry `{entry}`"))
        })?;
        let mut params: Vec<&str> = kernel.params().iter().map(|p| p.name.as_str()).collect();
        if fenced {
            let hidden = tensor_wasm_ptx_verify::HIDDEN_PARAMS;
            let own = params.len().checked_sub(hidden.len());
            if own.is_none_or(|own| params[own..] != hidden) {
                return Err(GpuError::InvalidArgument(format!(
                    "kernel `{entry}` is not fenced: its last parameters are not {hidden:?}"
                )));
            }
            params.truncate(own.unwrap_or(0));
        }
        let param_sizes = kernel.params()[..params.len()]
            .iter()
            .map(|p| p.size as usize)
            .collect();
        let plan = fenced
            .then(|| tensor_wasm_ptx_verify::Plan::new(ptx, entry))
            .flatten()
            .filter(|plan| module.kernel(plan.lean_entry()).is_some());
        Ok(Self {
            module,
            entry: entry.to_owned(),
            param_sizes,
            tenant: tenant.clone(),
            fenced,
            plan,
        })
    }

    /// Whether `tenant` may launch this kernel (the one it was loaded for).
    pub(crate) fn belongs_to(&self, tenant: &TenantKey) -> bool {
        self.tenant.same_tenant(tenant)
    }

    /// The parameters of a launch, unpacked: each argument of its parameter's size (a buffer
    /// as its device address).
    fn values(&self, args: &[KernelArg]) -> Result<Vec<Vec<u8>>, GpuError> {
        if args.len() != self.param_sizes.len() {
            return Err(GpuError::InvalidArgument(format!(
                "kernel `{}` takes {} arguments, got {}",
                self.entry,
                self.param_sizes.len(),
                args.len()
            )));
        }
        let mut values: Vec<Vec<u8>> = Vec::with_capacity(args.len() + 4);
        for (index, (arg, &size)) in args.iter().zip(&self.param_sizes).enumerate() {
            let bytes = arg.param_bytes(GUEST_BASE);
            if bytes.len() != size {
                return Err(GpuError::InvalidArgument(format!(
                    "kernel `{}`: argument {index} is a {} ({} bytes), the parameter has {size}",
                    self.entry,
                    arg.type_name(),
                    bytes.len()
                )));
            }
            values.push(bytes);
        }
        Ok(values)
    }

    /// The entry a launch runs: a fenced module's lean entry when the launch is proven, else
    /// the entry itself.
    fn chosen(&self, facts: &tensor_wasm_ptx_verify::LaunchFacts<'_>) -> &str {
        match &self.plan {
            Some(plan) if plan.admit(facts).is_ok() => plan.lean_entry(),
            _ => &self.entry,
        }
    }

    /// Runs a launch over `memory` until it ends or `cancel` is set.
    pub(crate) fn run(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
        cancel: &AtomicBool,
    ) -> Result<(), GpuError> {
        let dynamic = if self.fenced {
            tensor_wasm_ptx_verify::dynamic_shared_bytes(config.shared_bytes)
        } else {
            config.shared_bytes
        };
        let mut values = self.values(args)?;
        let mut entry = self.entry.as_str();
        if self.fenced {
            let hi = GUEST_BASE + (memory.len() as u64 & !15);
            entry = self.chosen(&tensor_wasm_ptx_verify::LaunchFacts {
                params: &values,
                grid: config.grid,
                block: config.block,
                dynamic_shared: dynamic,
                window: (GUEST_BASE, hi),
            });
            let hidden = tensor_wasm_ptx_verify::hidden_args(GUEST_BASE, hi, dynamic, CANCEL_WORD);
            values.extend(hidden.iter().map(|v| v.to_le_bytes().to_vec()));
        }
        let refs: Vec<&[u8]> = values.iter().map(Vec::as_slice).collect();
        let kernel = self.module.kernel(entry).expect("checked at load");
        let params = kernel
            .pack_params(&refs)
            .map_err(|e| GpuError::InvalidArgument(e.to_string()))?;
        let mut launch = Launch::new(config.grid, config.block, &params);
        launch.dynamic_shared_bytes = dynamic;
        launch.step_limit = STEP_LIMIT;
        launch.cancel = Some(CancelWord {
            address: CANCEL_WORD,
            flag: cancel,
        });
        let outcome = tensor_wasm_ptx_emu::launch(
            kernel,
            &launch,
            &mut [Allocation {
                base: GUEST_BASE,
                bytes: memory,
            }],
        );
        match outcome {
            Ok(_) if cancel.load(std::sync::atomic::Ordering::Acquire) => Err(cancelled()),
            Ok(_) => Ok(()),
            Err(EmuError::Cancelled { .. }) => Err(cancelled()),
            Err(EmuError::InvalidLaunch { reason, .. }) => Err(GpuError::InvalidArgument(format!(
                "kernel `{}`: {reason}",
                self.entry
            ))),
            Err(error) => Err(GpuError::Cuda(format!(
                "tenant kernel `{}` failed in the CPU backend's PTX interpreter: {error}",
                self.entry
            ))),
        }
    }
}

fn cancelled() -> GpuError {
    GpuError::Cancelled(String::from(
        "the tenant kernel was cancelled before it finished (its invocation's deadline passed)",
    ))
}

/// Starts `kernel` over `memory` on a thread of its own; `signal` reports its outcome and
/// carries the cancel flag.
///
/// # Safety
/// `memory` (`len` bytes) must stay valid for reads and writes, and untouched by anything
/// else, until `signal` has finished: the caller returns a `Completion` of `signal` that
/// borrows it and is never leaked (the contract of `Backend::launch_unscoped`).
pub(super) unsafe fn spawn(
    kernel: Arc<dyn LoadedFunction>,
    config: LaunchConfig,
    args: Vec<KernelArg>,
    memory: super::kernels::GuestMemory,
    len: usize,
    signal: Arc<Signal>,
) -> Result<(), GpuError> {
    let thread_signal = signal.clone();
    let spawned = std::thread::Builder::new()
        .name("tenant-ptx".into())
        .spawn(move || {
            let memory = memory;
            let started = std::time::Instant::now();
            let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                let ptx = kernel
                    .downcast_ref::<InterpretedPtx>()
                    .expect("spawned for an interpreted kernel");
                // SAFETY: the caller keeps the `len` bytes at `memory` valid and unshared until
                // `signal` finishes, which happens only below, after this use.
                let memory = unsafe { std::slice::from_raw_parts_mut(memory.0, len) };
                ptx.run(&config, &args, memory, thread_signal.cancel_flag())
            }));
            thread_signal.add_worker_time(started.elapsed());
            thread_signal.finish(outcome.unwrap_or_else(|_| {
                Err(GpuError::Cuda(String::from(
                    "the PTX interpreter panicked (internal error)",
                )))
            }));
        });
    spawned
        .map(|_| ())
        .map_err(|e| GpuError::Cuda(format!("starting the tenant kernel's thread: {e}")))
}
