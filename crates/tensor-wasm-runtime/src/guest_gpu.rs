//! Host side of the `wasi:cuda` ABI: per-instance kernel handles and the
//! linker functions guests import (see [`crate::abi`] for the contract).

use std::collections::HashMap;
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Instant;

use sha2::{Digest, Sha256};
use tensor_wasm_dispatch::{DispatchError, KernelDispatcher};
use tensor_wasm_gpu::{
    Backend, BuiltinKernel, Device, GpuError, GpuIsolation, Kernel, LaunchConfig, TenantKey,
};
use tensor_wasm_jit::{Blueprint, CacheKey, CompiledBlueprint, CompiledKernel, KernelCache};
use wasmtime::{Caller, Extern, Linker};

use crate::abi::{self, code, AbiError};
use crate::bounded::{BoundedLru, CacheBounds};
use crate::compile_gate::CompileGate;
use crate::invocation_state::{DeadlineExceeded, InvocationState};
use crate::metrics::CacheGauges;

/// Loaded blueprint kernels by canonical descriptor, at most
/// [`crate::CacheLimits::blueprint_kernels`] of them. A descriptor is chosen by the
/// guest, so without a bound any guest could grow the map forever; an evicted
/// kernel is loaded again (through the kernel cache) on its next use, and
/// instances holding a handle to it keep their own.
#[derive(Debug)]
pub(crate) struct BlueprintKernels {
    kernels: RwLock<BoundedLru<String, Kernel>>,
    gauges: CacheGauges,
}

impl BlueprintKernels {
    pub(crate) fn new(bounds: CacheBounds, gauges: CacheGauges) -> Self {
        BlueprintKernels {
            kernels: RwLock::new(BoundedLru::new(bounds)),
            gauges,
        }
    }

    fn get(&self, descriptor: &str) -> Option<Kernel> {
        self.kernels
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(descriptor)
            .cloned()
    }

    fn insert(&self, descriptor: String, kernel: Kernel) {
        let mut kernels = self.kernels.write().unwrap_or_else(PoisonError::into_inner);
        let evicted = kernels.insert(descriptor, kernel, 0);
        self.gauges.observe(&kernels, evicted.len());
    }

    /// Kernels held now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.kernels
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }
}

/// What every instance shares: the backend, the dispatcher and compiled kernels.
///
/// Sharing rule: kernels are shared across all instances of all functions
/// only when they are identical, read-only and not a tenant's own code —
/// blueprint kernels (generated code keyed by the blueprint's fingerprint;
/// each launch runs in the launching tenant's GPU lane). A tenant's compiled
/// CUDA C++ is cached per tenant (the tenant id is part of its cache key), so
/// one tenant never gets another's compiled code or learns from a cache hit
/// that another tenant compiled the same source. A kernel holds no data:
/// buffers are per launch, inside the launching instance's memory. Kernel
/// *handles* are per instance, and tenant PTX/CUDA kernels launch only for
/// the tenant that loaded them.
#[derive(Debug)]
pub(crate) struct GpuShared {
    pub backend: Arc<dyn Backend>,
    pub dispatcher: KernelDispatcher,
    cache: Arc<KernelCache>,
    /// Kernel time and bytes by tenant and function (`RuntimeMetrics::accounts`).
    pub(crate) accounts: crate::accounting::Accounts,
    /// Loaded blueprint kernels by canonical descriptor.
    blueprints: BlueprintKernels,
    /// GPU isolation levels set for single tenants (by tenant id); a tenant
    /// not in here gets the backend's level. Read once per instantiation of a
    /// module importing `wasi:cuda`; written when tenants are created,
    /// changed or deleted.
    tenant_isolation: RwLock<HashMap<String, GpuIsolation>>,
    /// The one source of tenant policy, when the embedder gave one
    /// ([`crate::Runtime::set_tenant_policy`]).
    policy: RwLock<Option<Arc<dyn crate::TenantPolicy>>>,
    /// Tenant kernel compiles running, bounded per tenant.
    compiles: CompileGate,
}

impl GpuShared {
    pub(crate) fn new(
        backend: Arc<dyn Backend>,
        dispatcher: KernelDispatcher,
        cache: Arc<KernelCache>,
        accounts: crate::accounting::Accounts,
        blueprints: BlueprintKernels,
        max_compiles_per_tenant: usize,
    ) -> Self {
        GpuShared {
            backend,
            dispatcher,
            cache,
            accounts,
            blueprints,
            tenant_isolation: RwLock::new(HashMap::new()),
            policy: RwLock::new(None),
            compiles: CompileGate::new(max_compiles_per_tenant),
        }
    }

    /// Makes `policy` the one source of every tenant's GPU isolation level and raw-kernel
    /// capability; the levels set with [`GpuShared::set_tenant_isolation`] no longer count.
    pub(crate) fn set_policy(&self, policy: Arc<dyn crate::TenantPolicy>) {
        *self.policy.write().unwrap_or_else(PoisonError::into_inner) = Some(policy);
    }

    /// The policy source, when one was given.
    pub(crate) fn policy(&self) -> Option<Arc<dyn crate::TenantPolicy>> {
        self.policy
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sets the GPU isolation level of `tenant`'s lanes: `Some` pins it,
    /// `None` forgets it (the tenant gets the backend's level again).
    pub(crate) fn set_tenant_isolation(&self, tenant: &str, level: Option<GpuIsolation>) {
        let mut levels = self
            .tenant_isolation
            .write()
            .unwrap_or_else(PoisonError::into_inner);
        match level {
            Some(level) => {
                levels.insert(tenant.to_owned(), level);
            }
            None => {
                levels.remove(tenant);
            }
        }
    }

    /// The level set for `tenant`, if any: the policy source's when there is one (asked each
    /// time, so an instance gets the level its tenant has now).
    fn pinned_isolation(&self, tenant: &str) -> Option<GpuIsolation> {
        if let Some(policy) = self.policy() {
            return policy.gpu_isolation(tenant);
        }
        self.tenant_isolation
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(tenant)
            .copied()
    }

    /// The GPU isolation level `tenant`'s instances get: the one set for it,
    /// else the backend's.
    pub(crate) fn tenant_isolation(&self, tenant: &str) -> GpuIsolation {
        self.pinned_isolation(tenant)
            .unwrap_or_else(|| self.backend.isolation())
    }

    /// The key `tenant`'s kernels load and launch under: its id, with the
    /// level set for it (a key without one gets the backend's level).
    pub(crate) fn tenant_key(&self, tenant: &str) -> TenantKey {
        let key = TenantKey::new(tenant);
        match self.pinned_isolation(tenant) {
            Some(level) => key.with_isolation(level),
            None => key,
        }
    }

    /// A kernel for `descriptor`: a built-in, or a JIT blueprint (parsed,
    /// emitted through the kernel cache on CUDA, loaded once per process, or
    /// once per tenant context under context-per-tenant GPU isolation).
    pub(crate) fn blueprint_kernel(
        &self,
        tenant: &TenantKey,
        descriptor: &str,
    ) -> Result<Kernel, Failure> {
        if let Some(builtin) = BuiltinKernel::from_descriptor(descriptor) {
            return Ok(self.backend.load_builtin(builtin)?);
        }
        let blueprint = Blueprint::parse(descriptor).map_err(|e| {
            AbiError::new(
                code::INVALID_ARGUMENT,
                format!("blueprint `{descriptor}`: {e}"),
            )
        })?;
        let canonical = blueprint.descriptor();
        if let Some(kernel) = self.blueprints.get(&canonical) {
            return Ok(kernel);
        }
        let program = CompiledBlueprint::with_cache(blueprint, self.cache.clone());
        let kernel = self.backend.load_program(tenant, Arc::new(program))?;
        self.blueprints.insert(canonical, kernel.clone());
        Ok(kernel)
    }

    /// A kernel from tenant PTX: loaded as it is for a function with the `raw_ptx`
    /// capability (`raw`); otherwise verified and fenced first (the fenced text is cached by
    /// fingerprint, per tenant, on disk too) and loaded fenced, so it reaches no memory but the
    /// guest's and ends at the invocation's deadline. PTX the verifier refuses is
    /// `INVALID_ARGUMENT`, naming the line, the instruction and the rule. A compile waits for
    /// the tenant's compile slot (`compile_gate`) until `deadline`.
    pub(crate) fn tenant_ptx_kernel(
        &self,
        tenant: &TenantKey,
        ptx: &str,
        entry: &str,
        raw: bool,
        deadline: Instant,
    ) -> Result<Kernel, Failure> {
        if raw {
            return Ok(self.backend.load_ptx(tenant, ptx, entry)?);
        }
        let key = CacheKey {
            fingerprint: source_fingerprint(b"tensor-wasm fenced ptx v1\0", tenant, ptx, entry),
            arch: (0, 0),
            driver_version: 0,
        };
        let fenced = self.compiled(tenant, &key, deadline, || fence(ptx, entry))?;
        Ok(self
            .backend
            .load_fenced_ptx(tenant, &fenced.ptx, entry)?
            .with_fingerprint(key.fingerprint))
    }

    /// A kernel from tenant CUDA C++. On a CUDA device with `raw`: compiled by NVRTC for the
    /// device's exact architecture (once per tenant, source, entry and architecture, through
    /// the kernel cache, on disk too) and loaded as cubin for `tenant`. Otherwise compiled to
    /// PTX (for the device's architecture, or sm_80 on the CPU backend) and loaded as
    /// [`GpuShared::tenant_ptx_kernel`] loads PTX: fenced unless `raw`.
    pub(crate) fn cuda_kernel(
        &self,
        tenant: &TenantKey,
        source: &str,
        entry: &str,
        raw: bool,
        deadline: Instant,
    ) -> Result<Kernel, Failure> {
        let (arch, driver_version) = match self.backend.device() {
            Device::Cuda(info) => (info.compute_capability, info.driver_version),
            _ => (CPU_CUDA_ARCH, 0),
        };
        let cubin = raw && matches!(self.backend.device(), Device::Cuda(_));
        if !cubin {
            if let Err(reason) = tensor_wasm_gpu::nvrtc_available() {
                return Err(AbiError::new(
                    code::NOT_AVAILABLE,
                    format!("CUDA C++ kernels need NVRTC, which this host lacks: {reason}"),
                )
                .into());
            }
        }
        let domain: &[u8] = if cubin {
            b"tensor-wasm cuda c++ v2\0"
        } else {
            b"tensor-wasm cuda c++ ptx v1\0"
        };
        let key = CacheKey {
            fingerprint: source_fingerprint(domain, tenant, source, entry),
            arch,
            driver_version,
        };
        let compiled = self.compiled(tenant, &key, deadline, || {
            let binary =
                tensor_wasm_gpu::compile_cuda(source, entry, arch).map_err(|e| e.to_string())?;
            Ok(CompiledKernel {
                ptx: binary.ptx.into(),
                entry: entry.into(),
                cubin: cubin.then(|| binary.cubin.into()),
            })
        })?;
        if !cubin {
            return self.tenant_ptx_kernel(tenant, &compiled.ptx, entry, raw, deadline);
        }
        let cubin = compiled
            .cubin
            .as_ref()
            .ok_or_else(|| AbiError::new(code::DEVICE_ERROR, "cached kernel has no cubin"))?;
        Ok(self
            .backend
            .load_cubin(tenant, cubin, entry)?
            .with_fingerprint(key.fingerprint))
    }

    /// The kernel cache's entry for `key`, or `compile`d (and cached) in one of `tenant`'s
    /// compile slots, waited for until `deadline`; a compile error is `INVALID_ARGUMENT`.
    fn compiled(
        &self,
        tenant: &TenantKey,
        key: &CacheKey,
        deadline: Instant,
        compile: impl FnOnce() -> Result<CompiledKernel, String>,
    ) -> Result<Arc<CompiledKernel>, Failure> {
        if let Some(hit) = self.cache.get(key) {
            return Ok(hit);
        }
        let _permit = self
            .compiles
            .acquire(tenant.as_str(), deadline)
            .ok_or(Failure::Deadline)?;
        self.cache
            .get_or_compile(key, compile)
            .map_err(|message| AbiError::new(code::INVALID_ARGUMENT, message).into())
    }
}

/// The compute capability tenant CUDA C++ is compiled for on the CPU backend (its PTX runs
/// in the interpreter).
const CPU_CUDA_ARCH: (u32, u32) = (8, 0);

/// The kernel-cache fingerprint of tenant source (CUDA C++ or PTX) under a `domain` naming
/// what is cached. The tenant is part of it: compiled tenant code is never shared across
/// tenants (see the sharing rule on [`GpuShared`]).
fn source_fingerprint(domain: &[u8], tenant: &TenantKey, source: &str, entry: &str) -> [u8; 16] {
    let mut hasher = Sha256::new();
    hasher.update(domain);
    // Length-prefixed, so no tenant id and source can run into each other.
    hasher.update((tenant.as_str().len() as u64).to_le_bytes());
    hasher.update(tenant.as_str().as_bytes());
    // `entry` is an identifier (NVRTC and the PTX parser refuse anything else): no NUL in it.
    hasher.update(source.as_bytes());
    hasher.update(b"\0");
    hasher.update(entry.as_bytes());
    let digest = hasher.finalize();
    digest[..16].try_into().expect("16 bytes")
}

/// Tenant PTX verified and fenced, as the kernel cache keeps it.
fn fence(ptx: &str, entry: &str) -> Result<CompiledKernel, String> {
    let fenced = tensor_wasm_ptx_verify::fence(ptx)
        .map_err(|refusal| format!("the PTX verifier refused the kernel: {refusal}"))?;
    if !fenced.kernels.iter().any(|k| k == entry) {
        return Err(format!("the PTX has no entry `{entry}`"));
    }
    Ok(CompiledKernel {
        ptx: fenced.ptx.into(),
        entry: entry.into(),
        cubin: None,
    })
}

/// Per-instance state of a guest that imports `wasi:cuda`.
pub(crate) struct GuestGpu {
    shared: Arc<GpuShared>,
    kernels: Vec<Kernel>,
    last_error: String,
    raw_ptx: bool,
    /// The tenant whose function this instance runs, with the GPU isolation
    /// level set for it when the instance was created: its kernels load and
    /// launch in that tenant's GPU lane (stream or context).
    tenant: TenantKey,
    /// The function whose instance this is (its kernels are accounted to it).
    function: Arc<str>,
    /// The invocation's deadline: no host call waits past it (a launch waits
    /// for a dispatch permit and for its kernel until then, and cancels a
    /// CPU kernel there).
    deadline: Instant,
}

impl GuestGpu {
    /// GPU state of an instance of a function without a tenant (the empty
    /// tenant id: one lane shared by every such function), for an invocation
    /// ending at `deadline`.
    pub(crate) fn new(shared: Arc<GpuShared>, raw_ptx: bool, deadline: Instant) -> Self {
        GuestGpu {
            shared,
            kernels: Vec::new(),
            last_error: String::new(),
            raw_ptx,
            tenant: TenantKey::default(),
            function: Arc::from(""),
            deadline,
        }
    }

    /// The same, for an instance of function `id` (its kernels are accounted to it).
    pub(crate) fn for_function(mut self, id: &str) -> Self {
        self.function = Arc::from(id);
        self
    }

    /// The same, for an instance of a function of `tenant` (its id, as in
    /// `FunctionRecord::tenant`), at the GPU isolation level set for that
    /// tenant ([`GpuShared::set_tenant_isolation`]) or else the backend's. The
    /// level is read once, here: a change applies to instances created after
    /// it.
    pub(crate) fn with_tenant(mut self, tenant: &str) -> Self {
        self.tenant = self.shared.tenant_key(tenant);
        self
    }

    fn add_kernel(&mut self, kernel: Kernel) -> Result<i32, Failure> {
        if self.kernels.len() >= abi::MAX_KERNELS_PER_INSTANCE {
            return Err(Failure::Abi(AbiError::new(
                code::LIMIT_EXCEEDED,
                format!(
                    "an instance may create at most {} kernels",
                    abi::MAX_KERNELS_PER_INSTANCE
                ),
            )));
        }
        self.kernels.push(kernel);
        Ok((self.kernels.len() - 1) as i32)
    }
}

/// Why a host call failed: an error code for the guest, or a condition that
/// ends the invocation (the dispatcher is saturated: the client gets 429; the
/// invocation's deadline passed in the host call: `invocation_timeout`).
pub(crate) enum Failure {
    Abi(AbiError),
    Saturated(DispatchError),
    Deadline,
}

impl From<DispatchError> for Failure {
    fn from(e: DispatchError) -> Self {
        match e {
            DispatchError::DeadlinePassed => Failure::Deadline,
            other => Failure::Saturated(other),
        }
    }
}

impl From<AbiError> for Failure {
    fn from(e: AbiError) -> Self {
        Failure::Abi(e)
    }
}

impl From<GpuError> for Failure {
    fn from(e: GpuError) -> Self {
        let code = match &e {
            GpuError::InvalidArgument(_) | GpuError::Compile { .. } => code::INVALID_ARGUMENT,
            GpuError::NotAvailable(_) => code::NOT_AVAILABLE,
            _ => code::DEVICE_ERROR,
        };
        Failure::Abi(AbiError::new(code, e.to_string()))
    }
}

/// Runs `f` with the caller's memory and GPU state, turning failures into
/// guest error codes (recorded for `last_error`) or traps.
fn with_gpu(
    caller: &mut Caller<'_, InvocationState>,
    f: impl FnOnce(&mut [u8], &mut GuestGpu) -> Result<i32, Failure>,
) -> wasmtime::Result<i32> {
    let memory = caller.get_export("memory").and_then(Extern::into_memory);
    let Some(memory) = memory else {
        if let Some(gpu) = caller.data_mut().gpu.as_mut() {
            gpu.last_error = "the module must export its linear memory as `memory`".into();
        }
        return Ok(code::INVALID_ARGUMENT);
    };
    let (bytes, state) = memory.data_and_store_mut(caller);
    let gpu = state
        .gpu
        .as_mut()
        .expect("instances of modules importing wasi:cuda carry GPU state");
    match f(bytes, gpu) {
        Ok(v) => Ok(v),
        Err(Failure::Abi(e)) => {
            gpu.last_error = e.message;
            Ok(e.code)
        }
        Err(Failure::Saturated(e)) => Err(wasmtime::Error::new(e)),
        Err(Failure::Deadline) => Err(wasmtime::Error::new(DeadlineExceeded)),
    }
}

/// Adds the `wasi:cuda` functions to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<InvocationState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        abi::MODULE,
        "kernel_from_blueprint",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                let desc = abi::guest_str(mem, ptr, len, "descriptor")?;
                let kernel = gpu.shared.blueprint_kernel(&gpu.tenant, desc.trim())?;
                gpu.add_kernel(kernel)
            })
        },
    )?;
    linker.func_wrap(
        abi::MODULE,
        "kernel_from_ptx",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32, eptr: i32, elen: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                let ptx = abi::guest_str(mem, ptr, len, "PTX")?;
                let entry = abi::guest_str(mem, eptr, elen, "entry name")?;
                let kernel = gpu.shared.tenant_ptx_kernel(
                    &gpu.tenant,
                    &ptx,
                    &entry,
                    gpu.raw_ptx,
                    gpu.deadline,
                )?;
                gpu.add_kernel(kernel)
            })
        },
    )?;
    linker.func_wrap(
        abi::MODULE,
        "kernel_from_cuda",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32, eptr: i32, elen: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                let source = abi::guest_str(mem, ptr, len, "CUDA C++ source")?;
                let entry = abi::guest_str(mem, eptr, elen, "entry name")?;
                let kernel = gpu.shared.cuda_kernel(
                    &gpu.tenant,
                    &source,
                    &entry,
                    gpu.raw_ptx,
                    gpu.deadline,
                )?;
                gpu.add_kernel(kernel)
            })
        },
    )?;
    linker.func_wrap(
        abi::MODULE,
        "launch",
        |mut caller: Caller<'_, InvocationState>,
         handle: i32,
         gx: i32,
         gy: i32,
         gz: i32,
         bx: i32,
         by: i32,
         bz: i32,
         shared_bytes: i32,
         args_ptr: i32,
         args_len: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                let kernel = usize::try_from(handle)
                    .ok()
                    .and_then(|h| gpu.kernels.get(h))
                    .cloned()
                    .ok_or_else(|| {
                        AbiError::new(code::BAD_HANDLE, format!("no kernel with handle {handle}"))
                    })?;
                let config = LaunchConfig {
                    grid: [gx as u32, gy as u32, gz as u32],
                    block: [bx as u32, by as u32, bz as u32],
                    shared_bytes: shared_bytes as u32,
                };
                let args = abi::parse_args(mem, args_ptr, args_len)?;
                let shared = gpu.shared.clone();
                shared.launch_on(
                    &gpu.tenant,
                    &gpu.function,
                    gpu.deadline,
                    &kernel,
                    &config,
                    &args,
                    mem,
                )?;
                Ok(code::OK)
            })
        },
    )?;
    linker.func_wrap(
        abi::MODULE,
        "sync",
        |mut caller: Caller<'_, InvocationState>| with_gpu(&mut caller, |_, _| Ok(code::OK)),
    )?;
    linker.func_wrap(
        abi::MODULE,
        "last_error",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32| {
            with_gpu(&mut caller, |mem, gpu| {
                let message = gpu.last_error.as_bytes();
                let start = ptr as u32 as usize;
                let room = (len as u32 as usize).min(message.len());
                let dest = start
                    .checked_add(room)
                    .filter(|&end| end <= mem.len())
                    .ok_or_else(|| {
                        AbiError::new(code::INVALID_ARGUMENT, "last_error buffer is out of bounds")
                    })?;
                mem[start..dest].copy_from_slice(&message[..room]);
                Ok(message.len() as i32)
            })
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SOURCE: &str = r#"extern "C" __global__ void k(float* x) { x[0] = 1.0f; }"#;

    fn cuda_fingerprint(tenant: &TenantKey, source: &str, entry: &str) -> [u8; 16] {
        source_fingerprint(b"tensor-wasm cuda c++ v2\0", tenant, source, entry)
    }

    #[test]
    fn tenant_cuda_code_is_cached_per_tenant() {
        let (a, b) = (TenantKey::new("tn-a"), TenantKey::new("tn-b"));
        let fingerprint = cuda_fingerprint(&a, SOURCE, "k");
        assert_eq!(fingerprint, cuda_fingerprint(&a, SOURCE, "k"));
        assert_ne!(fingerprint, cuda_fingerprint(&b, SOURCE, "k"));
        assert_ne!(
            fingerprint,
            cuda_fingerprint(&TenantKey::default(), SOURCE, "k")
        );
        assert_ne!(fingerprint, cuda_fingerprint(&a, SOURCE, "k2"));
        assert_ne!(fingerprint, cuda_fingerprint(&a, "// other", "k"));
        // The tenant id cannot run into the source.
        assert_ne!(
            cuda_fingerprint(&TenantKey::new("tn-a"), "bc", "k"),
            cuda_fingerprint(&TenantKey::new("tn-ab"), "c", "k")
        );
        // Fenced PTX, PTX compiled from CUDA C++ and cubins never share an entry.
        assert_ne!(
            fingerprint,
            source_fingerprint(b"tensor-wasm fenced ptx v1\0", &a, SOURCE, "k")
        );
        assert_ne!(
            fingerprint,
            source_fingerprint(b"tensor-wasm cuda c++ ptx v1\0", &a, SOURCE, "k")
        );
    }

    fn cpu_shared(isolation: GpuIsolation) -> Arc<GpuShared> {
        cpu_shared_with(
            isolation,
            BlueprintKernels::new(CacheBounds::entries(16), gauges()),
        )
    }

    fn gauges() -> CacheGauges {
        crate::RuntimeMetrics::register(&prometheus::Registry::new())
            .unwrap()
            .blueprint_cache
    }

    fn cpu_shared_with(isolation: GpuIsolation, blueprints: BlueprintKernels) -> Arc<GpuShared> {
        Arc::new(GpuShared::new(
            tensor_wasm_gpu::open_backend_with(tensor_wasm_gpu::DeviceChoice::Cpu, isolation)
                .unwrap(),
            KernelDispatcher::new(Default::default()),
            Arc::new(
                KernelCache::new(
                    Default::default(),
                    tensor_wasm_jit::KernelCacheMetrics::unregistered().unwrap(),
                )
                .unwrap(),
            ),
            crate::accounting::Accounts::new().unwrap(),
            blueprints,
            crate::DEFAULT_COMPILES_PER_TENANT,
        ))
    }

    #[test]
    fn blueprint_kernels_are_bounded_and_evicted_ones_load_again() {
        let gauges = gauges();
        let shared = cpu_shared_with(
            GpuIsolation::default(),
            BlueprintKernels::new(CacheBounds::entries(2), gauges.clone()),
        );
        let tenant = TenantKey::default();
        let load = |m: u32| {
            shared
                .blueprint_kernel(&tenant, &format!("matmul[{m}x16x16]"))
                .is_ok()
        };
        for m in 1..=5 {
            assert!(load(m), "matmul[{m}x16x16]");
            assert!(shared.blueprints.len() <= 2);
        }
        assert_eq!(shared.blueprints.len(), 2);
        assert_eq!((gauges.entries.get(), gauges.evictions.get()), (2, 3));
        assert!(load(1), "an evicted kernel is loaded again");
        assert_eq!(gauges.evictions.get(), 4);
    }

    #[test]
    fn guest_gpu_state_carries_the_tenant_level() {
        for default in [
            GpuIsolation::StreamPerTenant,
            GpuIsolation::ContextPerTenant,
        ] {
            let shared = cpu_shared(default);
            let plain =
                GuestGpu::new(shared.clone(), false, Instant::now()).with_tenant("tn-plain");
            assert_eq!(plain.tenant.isolation(), None, "the backend's level");
            assert_eq!(shared.tenant_isolation("tn-plain"), default);

            shared.set_tenant_isolation("tn-own", Some(GpuIsolation::ContextPerTenant));
            shared.set_tenant_isolation("tn-stream", Some(GpuIsolation::StreamPerTenant));
            let own = GuestGpu::new(shared.clone(), false, Instant::now()).with_tenant("tn-own");
            assert_eq!(own.tenant.as_str(), "tn-own");
            assert_eq!(own.tenant.isolation(), Some(GpuIsolation::ContextPerTenant));
            let stream =
                GuestGpu::new(shared.clone(), false, Instant::now()).with_tenant("tn-stream");
            assert_eq!(
                stream.tenant.isolation(),
                Some(GpuIsolation::StreamPerTenant)
            );
            assert_eq!(
                shared.tenant_isolation("tn-own"),
                GpuIsolation::ContextPerTenant
            );
            // Other tenants are untouched.
            assert_eq!(
                GuestGpu::new(shared.clone(), false, Instant::now())
                    .with_tenant("tn-plain")
                    .tenant
                    .isolation(),
                None
            );

            // Forgetting the level gives later instances the backend's again; an
            // instance created before keeps the key it was created with.
            shared.set_tenant_isolation("tn-own", None);
            assert_eq!(shared.tenant_isolation("tn-own"), default);
            let later = GuestGpu::new(shared.clone(), false, Instant::now()).with_tenant("tn-own");
            assert_eq!(later.tenant.isolation(), None);
            assert_eq!(own.tenant.isolation(), Some(GpuIsolation::ContextPerTenant));
        }
    }

    #[test]
    fn guest_gpu_state_carries_the_tenant() {
        let shared = cpu_shared(GpuIsolation::default());
        let untenanted = GuestGpu::new(shared.clone(), false, Instant::now());
        assert_eq!(untenanted.tenant, TenantKey::default());
        let owned = GuestGpu::new(shared, true, Instant::now()).with_tenant("tn-0123456789abcdef");
        assert_eq!(owned.tenant.as_str(), "tn-0123456789abcdef");
        assert!(owned.raw_ptx);
    }
}
