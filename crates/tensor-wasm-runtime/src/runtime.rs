//! [`Runtime`]: deploys, loads and invokes functions under per-invocation limits.
//!
//! This file holds the runtime itself (its shared state, construction and
//! accessors) and the small helpers every path uses: function lookup,
//! instance slots and invocation metrics. The rest of `impl Runtime` is
//! spread by what it does:
//!
//! - [`deploy`]: deploy, delete and look up functions;
//! - [`load`]: compile or load modules, prepare and instantiate them;
//! - [`invoke`]: export calls (blocking, inline, streaming);
//! - [`command`]: WASI commands (buffered and streaming);
//! - `crate::snapshot`: capture and restore of instance state.

mod command;
mod component_call;
mod deploy;
mod http_handler;
mod invoke;
mod load;
mod models;
mod refresh;

pub use models::{is_valid_model_name, ModelSpec};

pub use command::CommandOutput;
pub use deploy::{DeploySpec, FunctionInfo, InvocationTarget};
pub use http_handler::{HttpAnswer, HttpBody, HttpBodyError};

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Instant;

use wasmtime::{Engine, Linker};

use tensor_wasm_dispatch::KernelDispatcher;
use tensor_wasm_gpu::Device;
use tensor_wasm_jit::{KernelCache, KernelCacheConfig};
use tensor_wasm_mem::TensorWasmMemoryCreator;

use crate::bounded::{BoundedLru, CacheBounds};
use crate::config::RuntimeConfig;
use crate::engine::{build_engine, ArtifactCache, EpochTicker};
use crate::error::{Result, RuntimeError};
use crate::function_entry::{FunctionEntry, Prepared};
use crate::guest_gpu::{BlueprintKernels, GpuShared};
use crate::invocation_state::InvocationState;
use crate::metrics::{Outcome, RuntimeMetrics};
use crate::storage_quota::StorageLedger;
use crate::store::{FunctionLimits, FunctionStore};

/// What every clone of a [`Runtime`] shares.
pub(crate) struct Inner {
    pub(crate) config: RuntimeConfig,
    engine: Engine,
    linker: Linker<InvocationState>,
    pub(crate) store: Arc<dyn FunctionStore>,
    pub(crate) artifacts: ArtifactCache,
    pub(crate) functions: RwLock<HashMap<String, Arc<FunctionEntry>>>,
    /// Loaded modules (compiled, linked, ready to instantiate) by module sha256,
    /// bounded by [`crate::CacheLimits`]. Every invocation looks its module up here
    /// under the shared lock (a hash lookup and an atomic store); a module evicted
    /// while functions still use it is loaded again on their next call.
    loaded: RwLock<BoundedLru<String, Arc<Prepared>>>,
    in_flight: AtomicU32,
    /// Serialises changes of function records after deploy (snapshot settings, deletes).
    pub(crate) record_lock: Mutex<()>,
    /// Tenants whose raw-kernel functions may not be deployed or start
    /// (see [`Runtime::set_tenant_raw_ptx`]).
    pub(crate) raw_ptx_withheld: RwLock<HashSet<String>>,
    /// Deleted tenants ([`Runtime::retire_tenant`]). A deploy stores its
    /// module and record holding the read side, so retiring (the write
    /// side) waits for deploys committing now and refuses every later one.
    pub(crate) retired_tenants: RwLock<HashSet<String>>,
    /// Bytes each tenant keeps on disk (modules and snapshots).
    pub(crate) storage: StorageLedger,
    pub(crate) metrics: RuntimeMetrics,
    gpu: Arc<GpuShared>,
    /// `wasi-nn`'s shared state: parsed models by hash, the `cpu` target's backend.
    pub(crate) nn: Arc<crate::nn::NnShared>,
    pub(crate) memory_creator: Option<Arc<TensorWasmMemoryCreator>>,
    /// The snapshot encoder kept between captures (see
    /// [`RuntimeConfig::snapshot_encoder_keep_bytes`]).
    pub(crate) snapshot_encoder: Mutex<Option<tensor_wasm_snapshot::PortableEncoder>>,
    /// WebAssembly components: their engine, WASI 0.2 linker and loaded commands.
    pub(crate) components: crate::component::ComponentHost,
    _ticker: EpochTicker,
}

/// The TensorWasm runtime: one engine, a durable function store and the
/// functions deployed in it. Cheap to clone; every method is blocking and
/// meant for a blocking thread (invocations run guest code to completion).
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("data_dir", &self.inner.config.data_dir)
            .finish_non_exhaustive()
    }
}

/// Releases an instance slot when dropped.
pub(crate) struct SlotGuard<'a>(&'a AtomicU32, &'a prometheus::IntGauge);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
        self.1.dec();
    }
}

/// The one source of each tenant's policy the runtime asks ([`Runtime::set_tenant_policy`]):
/// the server gives it its tenant registry, which a replica's change-log follower keeps
/// current. Asked when a deploy asks for raw kernels and when an instance is created, never
/// copied.
pub trait TenantPolicy: Send + Sync + std::fmt::Debug + 'static {
    /// Whether `tenant` holds the raw-kernel capability now; `None` when the source does not
    /// know the tenant (it then holds nothing). A source that cannot vouch for being current
    /// answers `Some(false)`: privileged capabilities fail closed.
    fn raw_ptx(&self, tenant: &str) -> Option<bool>;
    /// The GPU isolation level `tenant`'s new instances get; `None`: the server's.
    fn gpu_isolation(&self, tenant: &str) -> Option<crate::GpuIsolation>;
}

impl Runtime {
    /// Opens the runtime over `store`, with the engine and artifact cache of `config`.
    /// Function records are read now; modules load lazily (see [`Runtime::warm_up`]).
    pub fn open(
        config: RuntimeConfig,
        store: Arc<dyn FunctionStore>,
        metrics: RuntimeMetrics,
    ) -> Result<Self> {
        let parts = build_engine(&config)?;
        let engine = parts.engine;
        let caches = config.caches;
        let artifacts = ArtifactCache::open(
            &config.data_dir,
            &engine,
            CacheBounds {
                max_entries: caches.artifact_entries,
                max_bytes: caches.artifact_bytes,
            },
            metrics.artifact_cache.clone(),
        )?;
        // Local snapshot images left half-written by a crash: only the temp names
        // `tensor-wasm-durable` gives are removed (a missing directory is fine).
        let _ = tensor_wasm_durable::remove_temp_files(config.data_dir.join("snapshot-cache"));
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state: &mut InvocationState| {
            state.wasi()
        })
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::wasi_poll::add_to_linker(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::guest_gpu::add_to_linker(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::nn::witx::add_to_linker(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::stream::add_to_linker(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::guest_trace::add_to_linker(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        let kernel_dir = config.data_dir.join("kernels");
        let kernel_cache = KernelCache::new(
            KernelCacheConfig {
                dir: Some(kernel_dir.clone()),
                ..config.kernel_cache.clone()
            },
            metrics.kernel_cache.clone(),
        )
        .map_err(|e| RuntimeError::storage(&kernel_dir, e))?;
        let gpu = Arc::new(GpuShared::new(
            config.backend.clone(),
            KernelDispatcher::with_metrics(config.dispatch.clone(), metrics.dispatch.clone()),
            Arc::new(kernel_cache),
            metrics.accounts.clone(),
            BlueprintKernels::new(
                CacheBounds::entries(caches.blueprint_kernels),
                metrics.blueprint_cache.clone(),
            ),
            config.max_compiles_per_tenant,
        ));
        tracing::info!(
            device = %config.backend.device(),
            unified_memory = parts.memory_creator.is_some(),
            uvm = parts.memory_creator.as_ref().is_some_and(|c| c.is_uvm_backed()),
            "runtime engine ready"
        );

        let quarantined = store.quarantined()?;
        metrics.quarantined_records.set(quarantined.len() as i64);
        for record in &quarantined {
            tracing::error!(
                record = %record.path.display(),
                reason = %record.reason,
                "a function record is in quarantine; run `tensor-wasm doctor --data-dir`"
            );
        }
        let records = store.functions()?;
        let storage = StorageLedger::new();
        for record in &records {
            storage.charge(&record.tenant, record.module_size);
            for snapshot in store.snapshots(&record.id)? {
                storage.charge(&record.tenant, snapshot.stored_bytes);
            }
        }
        let functions = records
            .into_iter()
            .map(|record| (record.id.clone(), Arc::new(FunctionEntry::new(record))))
            .collect();
        let components = crate::component::ComponentHost::new(
            crate::engine::build_component_engine(&config)?,
            config.test_never_ready_import,
        )?;
        let ticker = EpochTicker::start(
            vec![engine.clone(), components.engine.clone()],
            config.epoch_tick,
        );
        let nn = Arc::new(crate::nn::NnShared::open(config.nn.clone(), store.clone())?);
        for record in nn
            .named
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .values()
        {
            storage.charge(&record.tenant, record.bytes);
        }
        let runtime = Runtime {
            inner: Arc::new(Inner {
                config,
                engine,
                linker,
                store,
                artifacts,
                functions: RwLock::new(functions),
                loaded: RwLock::new(BoundedLru::new(CacheBounds {
                    max_entries: caches.module_entries,
                    max_bytes: caches.module_bytes,
                })),
                in_flight: AtomicU32::new(0),
                record_lock: Mutex::new(()),
                raw_ptx_withheld: RwLock::new(HashSet::new()),
                retired_tenants: RwLock::new(HashSet::new()),
                storage,
                metrics,
                gpu,
                nn,
                memory_creator: parts.memory_creator,
                snapshot_encoder: Mutex::new(None),
                components,
                _ticker: ticker,
            }),
        };
        Ok(runtime)
    }

    /// The configuration this runtime runs with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
    }

    /// Bytes each tenant keeps on disk (modules and snapshots).
    pub fn storage(&self) -> &StorageLedger {
        &self.inner.storage
    }

    /// The runtime's metrics handles.
    pub fn metrics(&self) -> &RuntimeMetrics {
        &self.inner.metrics
    }

    /// The device kernels run on.
    pub fn device(&self) -> &Device {
        self.inner.gpu.backend.device()
    }

    /// Whether guest linear memory is CUDA managed memory (device-visible).
    pub fn is_uvm_backed(&self) -> bool {
        self.inner
            .memory_creator
            .as_ref()
            .is_some_and(|c| c.is_uvm_backed())
    }

    /// The kernel dispatcher (for tests and benches).
    pub fn dispatcher(&self) -> &KernelDispatcher {
        &self.inner.gpu.dispatcher
    }

    /// Sets the GPU isolation level of `tenant`'s functions: `Some` gives
    /// their instances lanes of that level on a CUDA backend (a context of
    /// the tenant's own, or a stream in the shared context) whatever the
    /// server-wide level (`RuntimeConfig::gpu_isolation`); `None` returns the
    /// tenant to the server-wide level. It applies to instances created after
    /// the call (an instance keeps the lane it started with). The CPU backend
    /// records it and has nothing to apply it to. For embedders without a
    /// policy source ([`Runtime::set_tenant_policy`], which the server uses);
    /// [`Runtime::tenant_gpu_isolation`] reads it.
    pub fn set_tenant_gpu_isolation(&self, tenant: &str, level: Option<crate::GpuIsolation>) {
        self.inner.gpu.set_tenant_isolation(tenant, level);
    }

    /// The GPU isolation level new instances of `tenant`'s functions get: the
    /// one set by [`Runtime::set_tenant_gpu_isolation`], else the backend's.
    pub fn tenant_gpu_isolation(&self, tenant: &str) -> crate::GpuIsolation {
        self.inner.gpu.tenant_isolation(tenant)
    }

    /// For embedders without a policy source ([`Runtime::set_tenant_policy`]):
    /// whether `tenant` holds the raw-kernel capability: with `false`, its
    /// functions may not be deployed with `raw_ptx`, and its raw-kernel
    /// functions already deployed get no new instance (invocations fail with
    /// [`RuntimeError::RawPtxNotGranted`]) until it is granted again. A tenant
    /// never named here is not restricted (the function's own `raw_ptx`, with
    /// `allow_raw_ptx`, decides): the API names every tenant, from its record.
    pub fn set_tenant_raw_ptx(&self, tenant: &str, granted: bool) {
        let mut withheld = self
            .inner
            .raw_ptx_withheld
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if granted {
            withheld.remove(tenant);
        } else {
            withheld.insert(tenant.to_owned());
        }
    }

    /// Makes `policy` the one source of every tenant's raw-kernel capability and GPU
    /// isolation level: asked at each deploy asking for raw kernels and each instance
    /// created, so a grant or revoke holds as soon as the source has it (on a replica, when its
    /// change-log follower has reloaded the tenant). What [`Runtime::set_tenant_raw_ptx`] and
    /// [`Runtime::set_tenant_gpu_isolation`] set no longer counts.
    pub fn set_tenant_policy(&self, policy: Arc<dyn TenantPolicy>) {
        self.inner.gpu.set_policy(policy);
    }

    /// Whether `tenant`'s raw-kernel capability is withheld: by the policy source when there
    /// is one (a tenant it does not know holds nothing), else by
    /// [`Runtime::set_tenant_raw_ptx`].
    pub(crate) fn raw_ptx_withheld(&self, tenant: &str) -> bool {
        if let Some(policy) = self.inner.gpu.policy() {
            return policy.raw_ptx(tenant) != Some(true);
        }
        self.inner
            .raw_ptx_withheld
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(tenant)
    }

    /// Marks `tenant` deleted: from the return on, no function of it is
    /// deployed ([`RuntimeError::TenantRetired`]), and every deploy of it
    /// that committed before is in [`Runtime::functions_of`], so one sweep
    /// after this call finds all of them. Tenant ids are never reused; the
    /// set lives as long as the runtime (one id per deleted tenant).
    pub fn retire_tenant(&self, tenant: &str) {
        self.inner
            .retired_tenants
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(tenant.to_owned());
        // Its functions go; nothing of it can start any more.
        self.set_tenant_raw_ptx(tenant, true);
    }

    /// Whether [`Runtime::retire_tenant`] retired `tenant`.
    pub fn is_tenant_retired(&self, tenant: &str) -> bool {
        self.inner
            .retired_tenants
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .contains(tenant)
    }

    /// Undoes [`Runtime::retire_tenant`] (a tenant delete that failed after
    /// retiring it).
    pub fn reinstate_tenant(&self, tenant: &str) {
        self.inner
            .retired_tenants
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .remove(tenant);
    }

    /// The engine (for benches comparing against raw wasmtime).
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    pub(crate) fn entry(&self, id: &str) -> Result<Arc<FunctionEntry>> {
        self.inner
            .functions
            .read()
            .expect("lock")
            .get(id)
            .cloned()
            .ok_or_else(|| RuntimeError::FunctionNotFound(id.to_owned()))
    }

    /// The refusal of a call of function `id` through a route that does not serve its
    /// `style`, saying how it is called.
    pub fn wrong_style(id: &str, style: crate::InvocationStyle) -> RuntimeError {
        RuntimeError::WrongStyle(match style {
            crate::InvocationStyle::Export => format!(
                "function {id} is an export-call function: send {{\"export\": ..., \"args\": [...]}}"
            ),
            crate::InvocationStyle::Wasi => {
                format!("function {id} is a WASI command: send the request body as its stdin")
            }
            crate::InvocationStyle::Http => format!(
                "function {id} is an HTTP handler: send requests to /functions/{id}/http/"
            ),
        })
    }

    /// A function's deadline in epoch ticks (its timeout rounded up to ticks).
    fn deadline_ticks(&self, limits: &FunctionLimits) -> u64 {
        let tick = self.inner.config.epoch_tick.as_millis().max(1) as u64;
        limits.timeout_ms.div_ceil(tick)
    }

    pub(crate) fn take_slot(&self) -> Result<SlotGuard<'_>> {
        let max = self.inner.config.max_instances;
        let slots = &self.inner.in_flight;
        if slots.fetch_add(1, Ordering::AcqRel) >= max {
            slots.fetch_sub(1, Ordering::AcqRel);
            return Err(RuntimeError::Busy(format!(
                "all {max} instance slots are busy"
            )));
        }
        let in_use = &self.inner.metrics.slots_in_use;
        in_use.inc();
        Ok(SlotGuard(slots, in_use))
    }

    fn finish<T>(&self, start: Instant, result: &Result<T>) {
        let outcome = match result {
            Ok(_) => Outcome::Ok,
            Err(RuntimeError::Trap(_)) => Outcome::Trap,
            Err(RuntimeError::Timeout { .. }) => Outcome::Timeout,
            Err(
                RuntimeError::MemoryLimit(_)
                | RuntimeError::FuelExhausted(_)
                | RuntimeError::OutputTooLarge(_),
            ) => Outcome::Limit,
            Err(
                RuntimeError::InvalidArguments(_)
                | RuntimeError::UnknownExport(_)
                | RuntimeError::WrongStyle(_)
                | RuntimeError::FunctionNotFound(_)
                | RuntimeError::RawPtxNotGranted(_)
                | RuntimeError::TenantRetired(_)
                | RuntimeError::Busy(_),
            ) => Outcome::Rejected,
            Err(_) => Outcome::Error,
        };
        let m = &self.inner.metrics;
        m.record_outcome(outcome);
        m.invocation_seconds.observe(start.elapsed().as_secs_f64());
    }
}
