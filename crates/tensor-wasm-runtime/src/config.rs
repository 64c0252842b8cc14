//! Runtime configuration: data directory, limits, pool size, device and guest memory.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tensor_wasm_dispatch::DispatchConfig;
use tensor_wasm_gpu::{open_backend, Backend, DeviceChoice, GpuIsolation};
use tensor_wasm_jit::KernelCacheConfig;

/// Where guest linear memory lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestMemory {
    /// wasmtime's pooling allocator: host memory, fastest instantiation.
    /// Only for the CPU backend.
    Pooled,
    /// One [`tensor_wasm_mem::UnifiedBuffer`] per instance, pre-allocated at the
    /// function's memory limit: CUDA managed memory with a CUDA backend (guest
    /// pointers go to kernels without a copy), guarded host memory otherwise.
    Unified,
}

/// Bounds of the runtime's caches (docs/deploy.md, "Caches"). Each evicts its least
/// recently used entries; whatever is evicted is rebuilt on its next use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheLimits {
    /// Loaded (compiled and linked) modules held in memory.
    pub module_entries: usize,
    /// Bytes of compiled code those modules hold.
    pub module_bytes: u64,
    /// Precompiled module artifacts kept on disk (`<data_dir>/artifacts`).
    pub artifact_entries: usize,
    /// Bytes of those artifacts (with their digest sidecars).
    pub artifact_bytes: u64,
    /// Loaded blueprint kernels shared by all instances.
    pub blueprint_kernels: usize,
}

impl Default for CacheLimits {
    fn default() -> Self {
        CacheLimits {
            module_entries: 1024,
            module_bytes: 2 << 30,
            artifact_entries: 4096,
            artifact_bytes: 8 << 30,
            blueprint_kernels: 1024,
        }
    }
}

/// Bounds of what one component invocation may make the host hold (docs/components.md, "Host
/// resources"). The bytes it hands the host are charged to the function's memory limit as
/// well (`component_charge`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ComponentLimits {
    /// Host resources (streams, pollables, `wasi:http` fields, requests and responses, GPU
    /// buffers ...) one invocation may hold at once; one more is refused with
    /// `resource_limit_exceeded`.
    pub max_resources: usize,
    /// Bytes one `wasi:http` `fields` resource may hold, in wasmtime-wasi-http's accounting
    /// (names and values plus a per-entry overhead). WASI 0.2 has no error for a full map, so
    /// a field past it ends the invocation with `resource_limit_exceeded`.
    pub max_field_bytes: usize,
}

impl Default for ComponentLimits {
    fn default() -> Self {
        ComponentLimits {
            max_resources: 10_000,
            max_field_bytes: 64 << 10,
        }
    }
}

/// Settings of a [`crate::Runtime`]; every field has a production default.
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where functions, modules and artifacts live.
    pub data_dir: PathBuf,
    /// Deadline of an invocation when the function sets none.
    pub default_timeout: Duration,
    /// Longest deadline a function may ask for.
    pub max_timeout: Duration,
    /// Linear-memory limit of an invocation when the function sets none.
    pub default_memory_limit_bytes: u64,
    /// Largest memory limit a function may ask for; sizes the instance pool slots.
    pub max_memory_limit_bytes: u64,
    /// Largest module accepted at deploy.
    pub max_module_bytes: usize,
    /// Instance slots in the pooling allocator = invocations that can run at once.
    pub max_instances: u32,
    /// Whether fuel metering is compiled in (per-function budgets need it).
    pub fuel_enabled: bool,
    /// Cap on what a WASI command may write to stdout.
    pub max_output_bytes: usize,
    /// How many trailing bytes of stderr are reported back.
    pub stderr_tail_bytes: usize,
    /// Period of the epoch ticker; deadlines are rounded up to it.
    pub epoch_tick: Duration,
    /// The kernel backend guests launch on (CPU or CUDA).
    pub backend: Arc<dyn Backend>,
    /// Where guest memory lives; a CUDA backend always uses `Unified`.
    pub guest_memory: GuestMemory,
    /// Concurrency cap and wait queue of kernel launches.
    pub dispatch: DispatchConfig,
    /// Whether functions may be granted the raw-kernel capability (`raw_ptx`:
    /// tenant PTX and CUDA C++) at deploy. Such kernels can address any device
    /// memory: grant it to trusted tenants only.
    pub allow_raw_ptx: bool,
    /// Tenant kernel compiles (NVRTC, or the PTX verifier and fencing rewrite) one tenant
    /// may run at once; a further one waits, until its invocation's deadline. Each runs on
    /// the invocation's thread and cannot be interrupted, so this bounds the cores one
    /// tenant's compiles take. At least 1 (0 counts as 1).
    pub max_compiles_per_tenant: usize,
    /// Bounds of the compiled-kernel cache (its directory is `<data_dir>/kernels`).
    pub kernel_cache: KernelCacheConfig,
    /// How tenants are separated on a CUDA device: a stream per tenant in one
    /// shared context (default) or a context per tenant (see "GPU isolation
    /// between tenants" in docs/ARCHITECTURE.md). This is the server-wide
    /// level, for every tenant without a level of its own
    /// ([`crate::Runtime::set_tenant_gpu_isolation`]). The backend enforces
    /// it, so `backend` must have been opened with this level
    /// (`tensor_wasm_gpu::open_backend_with`, as `tensor-wasm serve` does);
    /// the CPU backend has nothing to isolate and ignores it.
    pub gpu_isolation: GpuIsolation,
    /// Bytes of modules and snapshots one tenant may keep on disk, unless the deploy or
    /// snapshot request gives the tenant's own limit (see [`crate::StorageLedger`]).
    pub max_stored_bytes_per_tenant: u64,
    /// Whether export calls of import-free functions may run on the caller's
    /// thread under a budget of one to two epoch ticks
    /// ([`crate::Runtime::try_invoke_export_inline`]).
    pub inline_calls: bool,
    /// The most linear memory an inline call may have: modules with a larger
    /// initial memory, more than one memory or a table of more than
    /// [`crate::INLINE_MAX_TABLE_ELEMENTS`] elements never run inline, and an
    /// inline call growing memory past it is cut short and run again on a
    /// blocking thread. Bounds the work one uninterruptible instruction
    /// (`memory.fill`, `memory.copy`) and the pooled-slot reset can do on an
    /// async thread.
    pub inline_max_memory_bytes: u64,
    /// Pooled guest memory: bytes of each instance slot's linear memory that stay
    /// resident when an instance ends (zeroed with `memset` instead of handed back
    /// to the kernel). Eager snapshot restores and large guests then write into
    /// pages that are already there instead of faulting every page in again; the
    /// price is that much resident memory per slot once used. 0 (the default)
    /// hands every page back.
    pub pool_keep_resident_bytes: u64,
    /// Bytes of encoder buffers (the portable snapshot of the last capture) kept between
    /// snapshot captures. A capture whose encoding fits writes into memory that is already
    /// there instead of faulting fresh pages in; the price is up to that much resident memory
    /// once a capture has used it. 0 frees the buffers after every capture.
    pub snapshot_encoder_keep_bytes: u64,
    /// Origins a component's outgoing HTTP (`wasi:http/outgoing-handler`) may reach; a
    /// request to any other is refused with `HTTP-request-denied`. Empty (the default):
    /// functions reach nothing outside the server.
    pub outgoing_http_allow: std::sync::Arc<[crate::Origin]>,
    /// Bounds of the loaded-module, artifact and blueprint-kernel caches.
    pub caches: CacheLimits,
    /// Bounds of the host resources a component invocation may hold.
    pub component_limits: ComponentLimits,
    /// `wasi-nn`: the largest model, the parsed-model cache, the `gpu` target's fallback.
    pub nn: crate::NnConfig,
    /// Tests only (no flag or setting of the server reaches it): links
    /// `tensor-wasm:test/never@0.1.0`, whose `never` returns a `wasi:io/poll` pollable that is
    /// never ready, so that a test can hold a component in a host wait no interface would end.
    #[doc(hidden)]
    pub test_never_ready_import: bool,
}

impl RuntimeConfig {
    /// Production defaults rooted at `data_dir`, on the CPU backend.
    pub fn new(data_dir: impl Into<PathBuf>) -> Self {
        RuntimeConfig {
            data_dir: data_dir.into(),
            default_timeout: Duration::from_secs(30),
            max_timeout: Duration::from_secs(15 * 60),
            default_memory_limit_bytes: 256 << 20,
            max_memory_limit_bytes: 1 << 30,
            max_module_bytes: 64 << 20,
            max_instances: 256,
            fuel_enabled: false,
            max_output_bytes: 16 << 20,
            stderr_tail_bytes: 4096,
            epoch_tick: Duration::from_millis(5),
            backend: open_backend(DeviceChoice::Cpu).expect("the CPU backend always opens"),
            guest_memory: GuestMemory::Pooled,
            dispatch: DispatchConfig::default(),
            allow_raw_ptx: false,
            max_compiles_per_tenant: crate::DEFAULT_COMPILES_PER_TENANT,
            kernel_cache: KernelCacheConfig::default(),
            gpu_isolation: GpuIsolation::default(),
            inline_calls: true,
            inline_max_memory_bytes: 8 << 20,
            pool_keep_resident_bytes: 0,
            snapshot_encoder_keep_bytes: 64 << 20,
            max_stored_bytes_per_tenant: 4 << 30,
            caches: CacheLimits::default(),
            component_limits: ComponentLimits::default(),
            nn: crate::NnConfig::default(),
            outgoing_http_allow: std::sync::Arc::from([]),
            test_never_ready_import: false,
        }
    }

    /// Small limits for tests: short deadline, 16 MiB memory, few slots.
    pub fn for_tests(data_dir: &Path) -> Self {
        RuntimeConfig {
            default_timeout: Duration::from_secs(5),
            default_memory_limit_bytes: 16 << 20,
            max_memory_limit_bytes: 64 << 20,
            max_instances: 64,
            ..RuntimeConfig::new(data_dir)
        }
    }

    /// The guest memory actually used: CUDA backends force `Unified`.
    pub fn effective_guest_memory(&self) -> GuestMemory {
        if self.backend.device().is_cuda() {
            GuestMemory::Unified
        } else {
            self.guest_memory
        }
    }
}
