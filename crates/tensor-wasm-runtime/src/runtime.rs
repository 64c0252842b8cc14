//! [`Runtime`]: deploys, loads and invokes functions under per-invocation limits.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::Value as Json;
use wasmtime::{
    Engine, ExternType, FuncType, InstancePre, Linker, Module, ResourceLimiter, Store, Trap, Val,
};
use wasmtime_wasi::p1::WasiP1Ctx;
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};

use tensor_wasm_dispatch::{DispatchError, KernelDispatcher};
use tensor_wasm_gpu::Device;
use tensor_wasm_jit::{KernelCache, KernelCacheConfig};
use tensor_wasm_mem::TensorWasmMemoryCreator;

use crate::config::RuntimeConfig;
use crate::engine::{build_engine, ArtifactCache, EpochTicker, ModuleSource};
use crate::error::{Result, RuntimeError};
use crate::guest_gpu::{GpuShared, GuestGpu};
use crate::metrics::{Outcome, RuntimeMetrics};
use crate::store::{
    new_function_id, sha256_hex, FunctionLimits, FunctionRecord, FunctionStore, InvocationStyle,
    RECORD_FORMAT,
};
use crate::values::{args_from_json, results_to_json, ExportSignature};

/// Import module name of WASI preview 1.
const WASI_P1: &str = "wasi_snapshot_preview1";
/// Largest stderr a command may write before it traps; the tail is reported.
const STDERR_CAP: usize = 1 << 20;
/// Longest guest error message passed back to callers.
const MAX_MESSAGE: usize = 4096;

/// What a deploy asks for; unset limits take the server defaults.
#[derive(Debug, Clone)]
pub struct DeploySpec {
    /// Owning tenant (empty when tenants are not in use).
    pub tenant: String,
    pub name: String,
    pub style: InvocationStyle,
    pub timeout_ms: Option<u64>,
    pub memory_limit_bytes: Option<u64>,
    pub fuel: Option<u64>,
    /// Grant the raw-PTX capability (needs `allow_raw_ptx` on the server).
    pub raw_ptx: bool,
}

impl DeploySpec {
    /// An export-call function with default limits.
    pub fn export(name: impl Into<String>) -> Self {
        DeploySpec {
            tenant: String::new(),
            name: name.into(),
            style: InvocationStyle::Export,
            timeout_ms: None,
            memory_limit_bytes: None,
            fuel: None,
            raw_ptx: false,
        }
    }

    /// A WASI command with default limits.
    pub fn wasi(name: impl Into<String>) -> Self {
        DeploySpec {
            style: InvocationStyle::Wasi,
            ..DeploySpec::export(name)
        }
    }
}

/// A deployed function as the API shows it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FunctionInfo {
    #[serde(flatten)]
    pub record: FunctionRecord,
    /// Callable exports and their signatures.
    pub exports: Vec<ExportSignature>,
}

/// Result of a WASI command invocation.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    /// The last `stderr_tail_bytes` bytes of stderr.
    pub stderr_tail: Vec<u8>,
    /// Whether stderr was longer than the tail.
    pub stderr_truncated: bool,
}

/// Per-store state of one invocation.
pub(crate) struct InvocationState {
    limiter: InvocationLimiter,
    wasi: Option<WasiP1Ctx>,
    pub(crate) gpu: Option<GuestGpu>,
    pub(crate) stream: Option<crate::stream::StreamIo>,
}

/// Enforces the function's memory limit and remembers that it did.
struct InvocationLimiter {
    memory_limit: usize,
    hit: Option<String>,
}

/// Table elements any instance may have; generous for real programs, bounded for hostile ones.
const MAX_TABLE_ELEMENTS: usize = 1 << 20;

impl ResourceLimiter for InvocationLimiter {
    fn memory_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired <= self.memory_limit {
            return Ok(true);
        }
        let message = format!(
            "memory limit exceeded: the guest asked to grow linear memory from {current} to \
             {desired} bytes; the function's limit is {} bytes",
            self.memory_limit
        );
        self.hit = Some(message.clone());
        Err(wasmtime::Error::msg(message))
    }

    fn table_growing(
        &mut self,
        current: usize,
        desired: usize,
        _maximum: Option<usize>,
    ) -> wasmtime::Result<bool> {
        if desired <= MAX_TABLE_ELEMENTS {
            return Ok(true);
        }
        let message = format!(
            "table limit exceeded: the guest asked to grow a table from {current} to {desired} \
             elements; the limit is {MAX_TABLE_ELEMENTS}"
        );
        self.hit = Some(message.clone());
        Err(wasmtime::Error::msg(message))
    }
}

/// A function compiled and linked, ready to instantiate.
pub(crate) struct Prepared {
    pub(crate) pre: InstancePre<InvocationState>,
    pub(crate) needs_wasi: bool,
    needs_gpu: bool,
    /// Function exports and their types, resolved once.
    pub(crate) funcs: HashMap<String, FuncType>,
    /// Whether the module is a reactor with an `_initialize` to run first.
    pub(crate) has_initialize: bool,
    /// Indices of the mutable globals the instrumentation exported, ascending.
    pub(crate) state_globals: Vec<u32>,
    /// Whether the module imports nothing: a call can touch nothing but its
    /// own fresh instance, so an attempt cut short can be run again unseen.
    self_contained: bool,
}

pub(crate) struct FunctionEntry {
    pub(crate) record: FunctionRecord,
    pub(crate) prepared: OnceLock<Arc<Prepared>>,
    load_lock: Mutex<()>,
    /// The opened local image of `record.start_from_snapshot`, once first used.
    pub(crate) restore: Mutex<Option<Arc<crate::snapshot::Restorable>>>,
    /// Inline calls of this function cut short in a row (reset by one that
    /// finishes); see [`Runtime::try_invoke_export_inline`].
    inline_overruns: AtomicU32,
    /// Calls that skipped the inline attempt since the last one tried.
    inline_skipped: AtomicU32,
}

/// Inline overruns in a row after which a function's calls go straight to
/// the blocking pool.
const INLINE_OVERRUNS_TO_SKIP: u32 = 2;
/// A function skipping inline calls tries one again after this many calls,
/// so a rare slow spell (the thread descheduled over the budget) is not
/// remembered forever.
const INLINE_RETRY_EVERY: u32 = 256;
/// Epoch ticks of an inline attempt: at least one whole tick of run time.
const INLINE_DEADLINE_TICKS: u64 = 2;

pub(crate) struct Inner {
    pub(crate) config: RuntimeConfig,
    engine: Engine,
    linker: Linker<InvocationState>,
    pub(crate) store: Arc<dyn FunctionStore>,
    artifacts: ArtifactCache,
    pub(crate) functions: RwLock<HashMap<String, Arc<FunctionEntry>>>,
    modules: Mutex<HashMap<String, Module>>,
    in_flight: AtomicU32,
    /// Serialises changes of function records after deploy (snapshot settings, deletes).
    pub(crate) record_lock: Mutex<()>,
    pub(crate) metrics: RuntimeMetrics,
    gpu: Arc<GpuShared>,
    pub(crate) memory_creator: Option<Arc<TensorWasmMemoryCreator>>,
    _ticker: EpochTicker,
}

/// The TensorWasm runtime: one engine, a durable function store and the
/// functions deployed in it. Cheap to clone; every method is blocking and
/// meant for a blocking thread (invocations run guest code to completion).
#[derive(Clone)]
pub struct Runtime {
    pub(crate) inner: Arc<Inner>,
}

impl FunctionEntry {
    pub(crate) fn new(record: FunctionRecord) -> Self {
        FunctionEntry {
            record,
            prepared: OnceLock::new(),
            load_lock: Mutex::new(()),
            restore: Mutex::new(None),
            inline_overruns: AtomicU32::new(0),
            inline_skipped: AtomicU32::new(0),
        }
    }
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime")
            .field("data_dir", &self.inner.config.data_dir)
            .finish_non_exhaustive()
    }
}

/// Releases an instance slot when dropped.
pub(crate) struct SlotGuard<'a>(&'a AtomicU32);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn truncate_message(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str(" [truncated]");
    }
    message
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
        let artifacts = ArtifactCache::open(&config.data_dir, &engine)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p1::add_to_linker_sync(&mut linker, |state: &mut InvocationState| {
            state
                .wasi
                .as_mut()
                .expect("stores of modules importing WASI always carry a WASI context")
        })
        .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::guest_gpu::add_to_linker(&mut linker)
            .map_err(|e| RuntimeError::Engine(format!("{e:#}")))?;
        crate::stream::add_to_linker(&mut linker)
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
        ));
        tracing::info!(
            device = %config.backend.device(),
            unified_memory = parts.memory_creator.is_some(),
            uvm = parts.memory_creator.as_ref().is_some_and(|c| c.is_uvm_backed()),
            "runtime engine ready"
        );

        let functions = store
            .functions()?
            .into_iter()
            .map(|record| (record.id.clone(), Arc::new(FunctionEntry::new(record))))
            .collect();
        let ticker = EpochTicker::start(engine.clone(), config.epoch_tick);
        let runtime = Runtime {
            inner: Arc::new(Inner {
                config,
                engine,
                linker,
                store,
                artifacts,
                functions: RwLock::new(functions),
                modules: Mutex::new(HashMap::new()),
                in_flight: AtomicU32::new(0),
                record_lock: Mutex::new(()),
                metrics,
                gpu,
                memory_creator: parts.memory_creator,
                _ticker: ticker,
            }),
        };
        Ok(runtime)
    }

    /// The configuration this runtime runs with.
    pub fn config(&self) -> &RuntimeConfig {
        &self.inner.config
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
    /// records it and has nothing to apply it to. The API keeps it in sync
    /// with the tenant registry; [`Runtime::tenant_gpu_isolation`] reads it.
    pub fn set_tenant_gpu_isolation(&self, tenant: &str, level: Option<crate::GpuIsolation>) {
        self.inner.gpu.set_tenant_isolation(tenant, level);
    }

    /// The GPU isolation level new instances of `tenant`'s functions get: the
    /// one set by [`Runtime::set_tenant_gpu_isolation`], else the backend's.
    pub fn tenant_gpu_isolation(&self, tenant: &str) -> crate::GpuIsolation {
        self.inner.gpu.tenant_isolation(tenant)
    }

    /// The engine (for benches comparing against raw wasmtime).
    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// Loads every stored function (from artifacts where possible) so the first
    /// invocations do not pay for it. Returns how many failed to load.
    pub fn warm_up(&self) -> usize {
        let entries: Vec<_> = self
            .inner
            .functions
            .read()
            .expect("lock")
            .values()
            .cloned()
            .collect();
        let mut failed = 0;
        for entry in entries {
            if let Err(e) = self.prepared(&entry) {
                tracing::error!(function = %entry.record.id, error = %e, "function failed to load");
                failed += 1;
            }
        }
        failed
    }

    /// Every deployed function, oldest first.
    pub fn functions(&self) -> Vec<FunctionRecord> {
        let mut records: Vec<_> = self
            .inner
            .functions
            .read()
            .expect("lock")
            .values()
            .map(|e| e.record.clone())
            .collect();
        records.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        records
    }

    /// One function with its export signatures (loading it if needed).
    pub fn function(&self, id: &str) -> Result<FunctionInfo> {
        let entry = self.entry(id)?;
        let prepared = self.prepared(&entry)?;
        Ok(FunctionInfo {
            record: entry.record.clone(),
            exports: exports_of(prepared.pre.module()),
        })
    }

    /// How function `id` is invoked (cheap: no loading).
    pub fn style(&self, id: &str) -> Result<InvocationStyle> {
        Ok(self.entry(id)?.record.style)
    }

    /// How function `id` is invoked, if `tenant` owns it; any other tenant
    /// gets `FunctionNotFound`, so ids cannot be probed.
    pub fn style_for(&self, id: &str, tenant: &str) -> Result<InvocationStyle> {
        let entry = self.entry(id)?;
        if entry.record.tenant != tenant {
            return Err(RuntimeError::FunctionNotFound(id.to_owned()));
        }
        Ok(entry.record.style)
    }

    /// Style and memory limit of function `id` if `tenant` owns it (one
    /// lookup on the invocation path); `FunctionNotFound` otherwise.
    pub fn invocation_of(&self, id: &str, tenant: &str) -> Result<(InvocationStyle, u64)> {
        let entry = self.entry(id)?;
        if entry.record.tenant != tenant {
            return Err(RuntimeError::FunctionNotFound(id.to_owned()));
        }
        Ok((entry.record.style, entry.record.limits.memory_limit_bytes))
    }

    /// The functions `tenant` owns, oldest first.
    pub fn functions_of(&self, tenant: &str) -> Vec<FunctionRecord> {
        let mut records = self.functions();
        records.retain(|r| r.tenant == tenant);
        records
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

    /// Deploys a module (binary or WAT text) as a new function. Durable when it returns.
    pub fn deploy(&self, module_bytes: &[u8], spec: DeploySpec) -> Result<FunctionInfo> {
        let cfg = &self.inner.config;
        if module_bytes.len() > cfg.max_module_bytes {
            return Err(RuntimeError::InvalidModule(format!(
                "module is {} bytes; the limit is {}",
                module_bytes.len(),
                cfg.max_module_bytes
            )));
        }
        let limits = self.resolve_limits(&spec)?;
        let name = spec.name.trim();
        if name.is_empty() || name.len() > 128 || name.chars().any(char::is_control) {
            return Err(RuntimeError::InvalidConfig(
                "name must be 1 to 128 printable characters".into(),
            ));
        }
        let binary = wat::parse_bytes(module_bytes)
            .map_err(|e| RuntimeError::InvalidModule(truncate_message(format!("{e}"))))?;
        let sha = sha256_hex(&binary);
        let module = self.module_for(&sha, Some(&binary))?;
        let prepared = self.prepare(&module)?;
        check_shape(&module, spec.style, &limits)?;

        let stored_sha = self.inner.store.put_module(&binary)?;
        debug_assert_eq!(stored_sha, sha);
        let record = FunctionRecord {
            format: RECORD_FORMAT,
            id: new_function_id(),
            tenant: spec.tenant.clone(),
            name: name.to_owned(),
            style: spec.style,
            module_sha256: sha,
            module_size: binary.len() as u64,
            created_at_ms: now_ms(),
            limits,
            start_from_snapshot: None,
        };
        self.inner.store.put_function(&record)?;
        let info = FunctionInfo {
            record,
            exports: exports_of(&module),
        };
        let entry = FunctionEntry::new(info.record.clone());
        let _ = entry.prepared.set(Arc::new(prepared));
        self.inner
            .functions
            .write()
            .expect("lock")
            .insert(info.record.id.clone(), Arc::new(entry));
        tracing::info!(function = %info.record.id, name = %info.record.name, "deployed");
        Ok(info)
    }

    fn resolve_limits(&self, spec: &DeploySpec) -> Result<FunctionLimits> {
        let cfg = &self.inner.config;
        let timeout_ms = spec
            .timeout_ms
            .unwrap_or(cfg.default_timeout.as_millis() as u64);
        if timeout_ms == 0 || timeout_ms > cfg.max_timeout.as_millis() as u64 {
            return Err(RuntimeError::InvalidConfig(format!(
                "timeout_ms must be between 1 and {}",
                cfg.max_timeout.as_millis()
            )));
        }
        let memory_limit_bytes = spec
            .memory_limit_bytes
            .unwrap_or(cfg.default_memory_limit_bytes);
        if memory_limit_bytes > cfg.max_memory_limit_bytes {
            return Err(RuntimeError::InvalidConfig(format!(
                "memory_limit_bytes must be at most {}",
                cfg.max_memory_limit_bytes
            )));
        }
        if spec.raw_ptx && !cfg.allow_raw_ptx {
            return Err(RuntimeError::InvalidConfig(
                "raw PTX is disabled on this server (the operator grants it with --allow-raw-ptx; \
                 raw PTX can address any device memory)"
                    .into(),
            ));
        }
        if spec.fuel.is_some() && !cfg.fuel_enabled {
            return Err(RuntimeError::InvalidConfig(
                "fuel metering is disabled on this server (start it with --fuel to allow fuel \
                 budgets)"
                    .into(),
            ));
        }
        Ok(FunctionLimits {
            timeout_ms,
            memory_limit_bytes,
            fuel: spec.fuel,
            raw_ptx: spec.raw_ptx,
        })
    }

    /// Deletes a function; `false` if it did not exist.
    pub fn delete(&self, id: &str) -> Result<bool> {
        let _lock = self.inner.record_lock.lock().expect("lock");
        if !self.inner.store.delete_function(id)? {
            return Ok(false);
        }
        self.forget_snapshots(id)?;
        let removed = self.inner.functions.write().expect("lock").remove(id);
        if let Some(entry) = removed {
            let sha = &entry.record.module_sha256;
            let still_used = self
                .inner
                .functions
                .read()
                .expect("lock")
                .values()
                .any(|e| &e.record.module_sha256 == sha);
            if !still_used {
                let mut modules = self.inner.modules.lock().expect("lock");
                modules.remove(sha);
                self.inner.metrics.cached_modules.set(modules.len() as i64);
            }
        }
        tracing::info!(function = %id, "deleted");
        Ok(true)
    }

    /// The compiled module `sha`: from memory, from an artifact, or compiled
    /// from `binary` (read from the store when not given).
    fn module_for(&self, sha: &str, binary: Option<&[u8]>) -> Result<Module> {
        if let Some(module) = self.inner.modules.lock().expect("lock").get(sha) {
            return Ok(module.clone());
        }
        let start = Instant::now();
        if let Some(module) = self.inner.artifacts.load(&self.inner.engine, sha) {
            self.note_module_loaded(sha, &module, ModuleSource::Artifact, start.elapsed());
            return Ok(module);
        }
        let stored;
        let binary = match binary {
            Some(binary) => binary,
            None => {
                stored = self.inner.store.module(sha)?;
                &stored
            }
        };
        let instrumented = crate::instrument::export_state(binary)
            .map_err(|e| RuntimeError::InvalidModule(truncate_message(e)))?;
        let module = Module::from_binary(&self.inner.engine, &instrumented)
            .map_err(|e| RuntimeError::InvalidModule(truncate_message(format!("{e:#}"))))?;
        self.inner.artifacts.store(sha, &module);
        self.note_module_loaded(sha, &module, ModuleSource::Compiled, start.elapsed());
        Ok(module)
    }

    fn note_module_loaded(&self, sha: &str, module: &Module, source: ModuleSource, took: Duration) {
        let m = &self.inner.metrics;
        m.compile_seconds.observe(took.as_secs_f64());
        m.module_loads.with_label_values(&[source.as_str()]).inc();
        let mut modules = self.inner.modules.lock().expect("lock");
        modules.insert(sha.to_owned(), module.clone());
        m.cached_modules.set(modules.len() as i64);
        tracing::debug!(
            module = sha,
            source = source.as_str(),
            ?took,
            "module ready"
        );
    }

    fn prepare(&self, module: &Module) -> Result<Prepared> {
        let pre = self.inner.linker.instantiate_pre(module).map_err(|e| {
            RuntimeError::InvalidModule(truncate_message(format!(
                "{e:#} (functions may import only `{WASI_P1}`, `{}` and `{}`)",
                crate::abi::MODULE,
                crate::stream::MODULE
            )))
        })?;
        let needs_wasi = module.imports().any(|i| i.module() == WASI_P1);
        let needs_gpu = module.imports().any(|i| i.module() == crate::abi::MODULE);
        let funcs: HashMap<String, FuncType> = module
            .exports()
            .filter_map(|e| match e.ty() {
                ExternType::Func(ty) => Some((e.name().to_owned(), ty)),
                _ => None,
            })
            .collect();
        let has_initialize = funcs.contains_key("_initialize");
        let mut state_globals: Vec<u32> = module
            .exports()
            .filter_map(|e| e.name().strip_prefix(crate::instrument::GLOBAL_PREFIX))
            .filter_map(|index| index.parse().ok())
            .collect();
        state_globals.sort_unstable();
        Ok(Prepared {
            pre,
            needs_wasi,
            needs_gpu,
            funcs,
            has_initialize,
            state_globals,
            self_contained: module.imports().len() == 0,
        })
    }

    /// The prepared form of a stored function, loading it on first use.
    pub(crate) fn prepared(&self, entry: &FunctionEntry) -> Result<Arc<Prepared>> {
        if let Some(p) = entry.prepared.get() {
            return Ok(p.clone());
        }
        let _guard = entry.load_lock.lock().expect("lock");
        if let Some(p) = entry.prepared.get() {
            return Ok(p.clone());
        }
        let module = self.module_for(&entry.record.module_sha256, None)?;
        let prepared = Arc::new(self.prepare(&module)?);
        let _ = entry.prepared.set(prepared.clone());
        Ok(prepared)
    }

    /// Creates a store with the function's limits (and, for GPU guests, its tenant's GPU
    /// lane), and instantiates.
    pub(crate) fn instantiate(
        &self,
        prepared: &Prepared,
        record: &FunctionRecord,
        wasi: Option<WasiP1Ctx>,
    ) -> (Store<InvocationState>, wasmtime::Result<wasmtime::Instance>) {
        self.instantiate_with_deadline(prepared, record, wasi, None)
    }

    /// [`Runtime::instantiate`] with the epoch deadline in ticks (`None`: the
    /// function's own timeout). The deadline covers instantiation too.
    fn instantiate_with_deadline(
        &self,
        prepared: &Prepared,
        record: &FunctionRecord,
        wasi: Option<WasiP1Ctx>,
        deadline_ticks: Option<u64>,
    ) -> (Store<InvocationState>, wasmtime::Result<wasmtime::Instance>) {
        let limits = &record.limits;
        let start = Instant::now();
        let state = InvocationState {
            limiter: InvocationLimiter {
                memory_limit: usize::try_from(limits.memory_limit_bytes).unwrap_or(usize::MAX),
                hit: None,
            },
            wasi,
            gpu: prepared.needs_gpu.then(|| {
                GuestGpu::new(self.inner.gpu.clone(), limits.raw_ptx).with_tenant(&record.tenant)
            }),
            stream: None,
        };
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|s| &mut s.limiter);
        store.set_epoch_deadline(deadline_ticks.unwrap_or_else(|| self.deadline_ticks(limits)));
        store.epoch_deadline_trap();
        if self.inner.config.fuel_enabled {
            store
                .set_fuel(limits.fuel.unwrap_or(u64::MAX))
                .expect("fuel is enabled in the engine");
        }
        // Unified memory is allocated up front at the function's limit.
        let instance = match &self.inner.memory_creator {
            Some(_) => tensor_wasm_mem::with_capacity_hint(limits.memory_limit_bytes, || {
                prepared.pre.instantiate(&mut store)
            }),
            None => prepared.pre.instantiate(&mut store),
        };
        self.inner
            .metrics
            .instantiate_seconds
            .observe(start.elapsed().as_secs_f64());
        (store, instance)
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
        Ok(SlotGuard(slots))
    }

    /// Calls export `export` of an export-style function with JSON arguments.
    pub fn invoke_export(&self, id: &str, export: &str, args: &[Json]) -> Result<Vec<Json>> {
        let start = Instant::now();
        let result = self.invoke_export_inner(id, export, args, None);
        self.finish(start, &result);
        result
    }

    /// Tries export call `export` of function `id` on the calling thread, for
    /// callers (async servers) that would otherwise hand it to a thread that
    /// may block. Only calls that can be cut short and run again unseen are
    /// tried: an export-call function already loaded, importing nothing (the
    /// call touches only its own fresh instance), in pooled guest memory, not
    /// started from a snapshot. The attempt, instantiation included, has an
    /// epoch deadline two ticks away: at least one whole tick
    /// ([`RuntimeConfig::epoch_tick`], 5 ms by default) and at most two; or
    /// the function's own deadline when that is shorter, and then a timeout is
    /// its outcome, as it would be on the blocking pool.
    ///
    /// `None`: not tried, or cut short at the deadline (nothing of the
    /// attempt remains). The caller then runs [`Runtime::invoke_export`]
    /// where blocking is allowed. `Some`: the call's outcome, exactly what
    /// `invoke_export` would have returned. After two overruns in a row a
    /// function's calls skip the attempt, except one in 256 that tries again.
    pub fn try_invoke_export_inline(
        &self,
        id: &str,
        export: &str,
        args: &[Json],
    ) -> Option<Result<Vec<Json>>> {
        if !self.inner.config.inline_calls || self.inner.memory_creator.is_some() {
            return None;
        }
        let entry = self.entry(id).ok()?;
        if entry.record.style != InvocationStyle::Export
            || entry.record.start_from_snapshot.is_some()
        {
            return None;
        }
        let prepared = entry.prepared.get()?.clone();
        if !prepared.self_contained {
            return None;
        }
        if entry.inline_overruns.load(Ordering::Relaxed) >= INLINE_OVERRUNS_TO_SKIP {
            let skipped = entry.inline_skipped.fetch_add(1, Ordering::Relaxed) + 1;
            if skipped < INLINE_RETRY_EVERY {
                return None;
            }
            entry.inline_skipped.store(0, Ordering::Relaxed);
        }
        // A function whose own deadline is shorter keeps it: then a timeout
        // here is its real outcome, not an overrun to run again.
        let own_ticks = self.deadline_ticks(&entry.record.limits);
        let ticks = own_ticks.min(INLINE_DEADLINE_TICKS);
        let start = Instant::now();
        let result = self.call_export(&entry, &prepared, export, args, None, Some(ticks));
        if let Err(RuntimeError::Timeout { .. }) = result {
            // Either way a strike: calls that run into a deadline belong on
            // the blocking pool.
            entry.inline_overruns.fetch_add(1, Ordering::Relaxed);
            if ticks < own_ticks {
                self.inner.metrics.inline_overran.inc();
                tracing::debug!(function = %id, "inline call overran its budget; run again on the blocking pool");
                return None;
            }
        } else {
            entry.inline_overruns.store(0, Ordering::Relaxed);
        }
        self.inner.metrics.inline_done.inc();
        self.finish(start, &result);
        Some(result)
    }

    /// [`Runtime::invoke_export`] with `tw:stream` connected: the guest reads
    /// `io`'s input and its chunks go to `io`'s channel as they are emitted.
    pub fn invoke_export_streaming(
        &self,
        id: &str,
        export: &str,
        args: &[Json],
        io: crate::stream::StreamIo,
    ) -> Result<Vec<Json>> {
        let start = Instant::now();
        let result = self.invoke_export_inner(id, export, args, Some(io));
        self.finish(start, &result);
        result
    }

    /// Checks an export call (export exists, arguments fit its signature)
    /// without running anything, so a streaming response can still answer
    /// a proper 4xx before it starts.
    pub fn check_export_call(&self, id: &str, export: &str, args: &[Json]) -> Result<()> {
        let entry = self.entry(id)?;
        if entry.record.style != InvocationStyle::Export {
            return Err(RuntimeError::WrongStyle(format!(
                "function {id} is a WASI command; streaming is for export-call functions"
            )));
        }
        let prepared = self.prepared(&entry)?;
        let ty = prepared
            .funcs
            .get(export)
            .ok_or_else(|| RuntimeError::UnknownExport(export.to_owned()))?;
        args_from_json(export, ty, args).map(|_| ())
    }

    fn invoke_export_inner(
        &self,
        id: &str,
        export: &str,
        args: &[Json],
        stream: Option<crate::stream::StreamIo>,
    ) -> Result<Vec<Json>> {
        let entry = self.entry(id)?;
        if entry.record.style != InvocationStyle::Export {
            return Err(RuntimeError::WrongStyle(format!(
                "function {id} is a WASI command: send the request body as its stdin"
            )));
        }
        let prepared = self.prepared(&entry)?;
        self.call_export(&entry, &prepared, export, args, stream, None)
    }

    /// Instantiates export-call function `entry` (deadline in epoch ticks,
    /// `None`: its own timeout) and calls `export` with `args`.
    fn call_export(
        &self,
        entry: &FunctionEntry,
        prepared: &Prepared,
        export: &str,
        args: &[Json],
        stream: Option<crate::stream::StreamIo>,
        deadline_ticks: Option<u64>,
    ) -> Result<Vec<Json>> {
        let record = &entry.record;
        let ty = prepared
            .funcs
            .get(export)
            .ok_or_else(|| RuntimeError::UnknownExport(export.to_owned()))?;
        let params = args_from_json(export, ty, args)?;
        let _slot = self.take_slot()?;
        let wasi = prepared
            .needs_wasi
            .then(|| quiet_wasi(&record.name, self.inner.config.stderr_tail_bytes));
        let (mut store, instance) =
            self.instantiate_with_deadline(prepared, record, wasi, deadline_ticks);
        store.data_mut().stream = stream;
        let instance = instance.map_err(|e| classify(e, &mut store, &record.limits))?;
        if let Some(snapshot) = &record.start_from_snapshot {
            // The snapshot holds the state after `_initialize` and the init export.
            self.restore_snapshot(entry, prepared, snapshot, &mut store, &instance)?;
        } else if prepared.has_initialize {
            if let Some(init) = instance.get_func(&mut store, "_initialize") {
                init.call(&mut store, &[], &mut [])
                    .map_err(|e| classify(e, &mut store, &record.limits))?;
            }
        }
        let func = instance
            .get_func(&mut store, export)
            .ok_or_else(|| RuntimeError::UnknownExport(export.to_owned()))?;
        let mut results = vec![Val::I32(0); ty.results().len()];
        func.call(&mut store, &params, &mut results)
            .map_err(|e| classify(e, &mut store, &record.limits))?;
        Ok(results_to_json(&results))
    }

    /// Runs a WASI command function with `stdin` and returns what it wrote.
    pub fn invoke_command(&self, id: &str, stdin: Vec<u8>) -> Result<CommandOutput> {
        let start = Instant::now();
        let result = self.invoke_command_inner(id, stdin);
        self.finish(start, &result);
        result
    }

    fn invoke_command_inner(&self, id: &str, stdin: Vec<u8>) -> Result<CommandOutput> {
        let entry = self.entry(id)?;
        let record = &entry.record;
        if record.style != InvocationStyle::Wasi {
            return Err(RuntimeError::WrongStyle(format!(
                "function {id} is an export-call function: send {{\"export\": ..., \"args\": [...]}}"
            )));
        }
        let prepared = self.prepared(&entry)?;
        let _slot = self.take_slot()?;
        let cap = self.inner.config.max_output_bytes;
        let stdout = MemoryOutputPipe::new(cap);
        let (mut store, stderr, run) = self.run_start(&prepared, record, stdin, stdout.clone());
        let exit_code = match run {
            Ok(code) => code,
            Err(e) => {
                let stdout_full = stdout.contents().len() >= cap
                    || format!("{e:#}").contains("beyond capacity of MemoryOutputPipe")
                        && stdout.contents().len() + 4096 > cap;
                if stdout_full {
                    return Err(RuntimeError::OutputTooLarge(cap));
                }
                log_stderr(record, &stderr.contents());
                return Err(classify(e, &mut store, &record.limits));
            }
        };
        drop(store);
        let stderr = stderr.contents();
        log_stderr(record, &stderr);
        let tail = self.inner.config.stderr_tail_bytes;
        let skip = stderr.len().saturating_sub(tail);
        Ok(CommandOutput {
            exit_code,
            stdout: stdout.contents().to_vec(),
            stderr_tail: stderr[skip..].to_vec(),
            stderr_truncated: skip > 0,
        })
    }

    /// Checks that function `id` is a WASI command, loading it, without
    /// running anything (so a streaming response can still answer a 4xx).
    pub fn check_command_call(&self, id: &str) -> Result<()> {
        let entry = self.entry(id)?;
        if entry.record.style != InvocationStyle::Wasi {
            return Err(RuntimeError::WrongStyle(format!(
                "function {id} is an export-call function: name the export to call"
            )));
        }
        self.prepared(&entry).map(|_| ())
    }

    /// Runs WASI command `id` with `io`'s input as stdin; each write to
    /// stdout goes to `io`'s channel as a chunk as soon as it is written
    /// (blocking while the buffer is full), under `io`'s caps. A write after
    /// the client has gone stops the guest with [`RuntimeError::ClientGone`];
    /// stdout past the per-invocation cap stops it with
    /// [`RuntimeError::OutputTooLarge`].
    pub fn invoke_command_streaming(
        &self,
        id: &str,
        io: crate::stream::StreamIo,
    ) -> Result<crate::stream::CommandExit> {
        let start = Instant::now();
        let result = self.invoke_command_streaming_inner(id, io);
        self.finish(start, &result);
        result
    }

    fn invoke_command_streaming_inner(
        &self,
        id: &str,
        io: crate::stream::StreamIo,
    ) -> Result<crate::stream::CommandExit> {
        let entry = self.entry(id)?;
        let record = &entry.record;
        if record.style != InvocationStyle::Wasi {
            return Err(RuntimeError::WrongStyle(format!(
                "function {id} is an export-call function: name the export to call"
            )));
        }
        let prepared = self.prepared(&entry)?;
        let _slot = self.take_slot()?;
        let (stdin, stdout) = io.into_stdout();
        let (mut store, stderr, run) = self.run_start(&prepared, record, stdin, stdout.clone());
        let exit_code = match run {
            Ok(code) => code,
            Err(e) => {
                log_stderr(record, &stderr.contents());
                if let Some(cap) = e.downcast_ref::<crate::stream::OutputCapExceeded>() {
                    return Err(RuntimeError::OutputTooLarge(
                        usize::try_from(cap.0).unwrap_or(usize::MAX),
                    ));
                }
                return Err(classify(e, &mut store, &record.limits));
            }
        };
        // The stream ends when the last sender (the store's, then ours) is gone.
        drop(store);
        let stdout_bytes = stdout.written();
        drop(stdout);
        let stderr = stderr.contents();
        log_stderr(record, &stderr);
        let tail = self.inner.config.stderr_tail_bytes;
        let skip = stderr.len().saturating_sub(tail);
        Ok(crate::stream::CommandExit {
            exit_code,
            stdout_bytes,
            stderr_tail: stderr[skip..].to_vec(),
            stderr_truncated: skip > 0,
        })
    }

    /// Instantiates a WASI command with `stdin`, `stdout` and a captured stderr, and runs
    /// `_start`: `Ok(exit code)` when it returned or called `proc_exit`, the guest's error
    /// otherwise.
    fn run_start(
        &self,
        prepared: &Prepared,
        record: &FunctionRecord,
        stdin: impl Into<bytes::Bytes>,
        stdout: impl wasmtime_wasi::cli::StdoutStream + 'static,
    ) -> (
        Store<InvocationState>,
        MemoryOutputPipe,
        wasmtime::Result<i32>,
    ) {
        let stderr = MemoryOutputPipe::new(STDERR_CAP);
        let wasi = WasiCtxBuilder::new()
            .stdin(MemoryInputPipe::new(stdin))
            .stdout(stdout)
            .stderr(stderr.clone())
            .arg(&record.name)
            .build_p1();
        let (mut store, instance) = self.instantiate(prepared, record, Some(wasi));
        let run = instance.and_then(|instance| {
            instance
                .get_typed_func::<(), ()>(&mut store, "_start")?
                .call(&mut store, ())
        });
        let code = match run {
            Ok(()) => Ok(0),
            Err(e) => match e.downcast_ref::<I32Exit>() {
                Some(exit) => Ok(exit.0),
                None => Err(e),
            },
        };
        (store, stderr, code)
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
                | RuntimeError::Busy(_),
            ) => Outcome::Rejected,
            Err(_) => Outcome::Error,
        };
        let m = &self.inner.metrics;
        m.record_outcome(outcome);
        m.invocation_seconds.observe(start.elapsed().as_secs_f64());
    }
}

/// A WASI context for export-style functions: no stdin, output only logged.
pub(crate) fn quiet_wasi(name: &str, stderr_cap: usize) -> WasiP1Ctx {
    WasiCtxBuilder::new()
        .stdout(MemoryOutputPipe::new(stderr_cap))
        .stderr(MemoryOutputPipe::new(stderr_cap))
        .arg(name)
        .build_p1()
}

fn log_stderr(record: &FunctionRecord, stderr: &[u8]) {
    if !stderr.is_empty() {
        tracing::info!(
            function = %record.id,
            stderr = %String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(4096)..]),
            "guest stderr"
        );
    }
}

/// Export signatures of a module's function exports.
fn exports_of(module: &Module) -> Vec<ExportSignature> {
    module
        .exports()
        .filter_map(|e| match e.ty() {
            ExternType::Func(ty) => Some(ExportSignature::new(e.name(), &ty)),
            _ => None,
        })
        .filter(|sig| !crate::instrument::is_reserved(&sig.name))
        .collect()
}

/// Deploy-time checks that the module fits its style and limits.
fn check_shape(module: &Module, style: InvocationStyle, limits: &FunctionLimits) -> Result<()> {
    for export in module.exports() {
        if let ExternType::Memory(mem) = export.ty() {
            let initial = mem.minimum().saturating_mul(mem.page_size());
            if initial > limits.memory_limit_bytes {
                return Err(RuntimeError::InvalidConfig(format!(
                    "the module's initial memory is {initial} bytes, above the memory limit of {} \
                     bytes",
                    limits.memory_limit_bytes
                )));
            }
        }
    }
    match style {
        InvocationStyle::Wasi => match module.get_export("_start") {
            Some(ExternType::Func(ty)) if ty.params().len() == 0 && ty.results().len() == 0 => {
                Ok(())
            }
            _ => Err(RuntimeError::InvalidModule(
                "a WASI command must export `_start: func()`".into(),
            )),
        },
        InvocationStyle::Export => {
            if module
                .exports()
                .any(|e| matches!(e.ty(), ExternType::Func(_)))
            {
                Ok(())
            } else {
                Err(RuntimeError::InvalidModule(
                    "an export-call function must export at least one function".into(),
                ))
            }
        }
    }
}

/// Maps a wasmtime error from guest execution to a [`RuntimeError`].
pub(crate) fn classify(
    err: wasmtime::Error,
    store: &mut Store<InvocationState>,
    limits: &FunctionLimits,
) -> RuntimeError {
    if let Some(message) = store.data_mut().limiter.hit.take() {
        return RuntimeError::MemoryLimit(message);
    }
    if let Some(busy) = err.downcast_ref::<DispatchError>() {
        return RuntimeError::Busy(busy.to_string());
    }
    if err.downcast_ref::<crate::stream::ClientGone>().is_some() {
        return RuntimeError::ClientGone;
    }
    match err.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => RuntimeError::Timeout {
            timeout_ms: limits.timeout_ms,
        },
        Some(Trap::OutOfFuel) => RuntimeError::FuelExhausted(limits.fuel.unwrap_or(u64::MAX)),
        _ => RuntimeError::Trap(truncate_message(format!("{err:#}"))),
    }
}
