//! `wasi-nn` on our own kernels: ONNX models (`tensor-wasm-onnx`) loaded by guests and run as
//! blueprint launches through the invocation's one launch path
//! ([`GpuShared::launch_on`]: dispatch permit, deadline, kernel seconds, the tenant's GPU
//! lane), so a model gives the same bytes on the CPU backend and on a GPU.
//!
//! Core modules import `wasi_ephemeral_nn` (our own host of that ABI: [`witx`]); components
//! import `wasi:nn` (wasmtime-wasi-nn's bindings over our backend: [`wit`]). Both reach
//! [`NnHost`], the invocation's state: its graphs and execution contexts (a bounded number),
//! each context's arena (CUDA managed memory when guest memory is, host pages otherwise),
//! charged to the function's memory limit through [`HostBytes`].
//!
//! Execution targets: `gpu` runs on the host's CUDA backend; on a CPU host it is refused with
//! `unsupported-operation` unless the operator allows the fallback
//! ([`NnConfig::gpu_fallback`]), when it runs on the CPU backend. `cpu` runs on the CPU
//! backend: the host's own, or on a CUDA host a CPU backend opened for it.

pub(crate) mod wit;
pub(crate) mod witx;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock};
use std::time::Instant;

use sha2::{Digest, Sha256};
use tensor_wasm_gpu::{Backend, Device, DeviceChoice, Kernel, KernelArg, LaunchConfig, TenantKey};
use tensor_wasm_jit::{Blueprint, CompiledBlueprint};
use tensor_wasm_mem::{GuardedHostBuffer, ManagedBuffer, UnifiedBuffer};
use tensor_wasm_onnx::{ErrorCode, Execution, Launcher, Model, OnnxError};

use crate::bounded::{BoundedLru, CacheBounds};
use crate::guest_gpu::{Failure, GpuShared};
use crate::store::{FunctionStore, ModelRecord};

/// Graphs one invocation may load.
pub(crate) const MAX_GRAPHS: usize = 16;
/// Execution contexts one invocation may hold.
pub(crate) const MAX_CONTEXTS: usize = 16;

/// The operator's settings of `wasi-nn`.
#[derive(Debug, Clone)]
pub struct NnConfig {
    /// Largest model (ONNX bytes) a guest may load.
    pub max_model_bytes: usize,
    /// Parsed models kept per host (by content hash), and their constant bytes in all.
    pub cached_models: CacheBounds,
    /// Whether the `gpu` target runs on the CPU backend on a host without a GPU (else it is
    /// refused with `unsupported-operation`).
    pub gpu_fallback: bool,
    /// Models the operator preloads for every tenant: (name, ONNX file). A tenant's own model
    /// of the same name comes first.
    pub preload: Vec<(String, std::path::PathBuf)>,
}

impl Default for NnConfig {
    fn default() -> Self {
        NnConfig {
            max_model_bytes: 256 << 20,
            cached_models: CacheBounds {
                max_entries: 64,
                max_bytes: 4 << 30,
            },
            gpu_fallback: false,
            preload: Vec::new(),
        }
    }
}

/// Bytes the host holds for one invocation outside its linear memory and GPU buffers (the
/// `wasi-nn` models and arenas), counted against the same memory limit: the limiter keeps
/// `others` up to date, and a charge here fails when `others + held` would pass the limit.
#[derive(Debug)]
pub(crate) struct HostBytes {
    limit: usize,
    others: AtomicUsize,
    held: AtomicUsize,
}

impl HostBytes {
    pub(crate) fn new(limit: u64) -> Arc<Self> {
        Arc::new(HostBytes {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            others: AtomicUsize::new(0),
            held: AtomicUsize::new(0),
        })
    }

    /// The invocation's other memory (linear memories, GPU buffers, other host bytes) is now
    /// `bytes`.
    pub(crate) fn set_others(&self, bytes: usize) {
        self.others.store(bytes, Ordering::Relaxed);
    }

    /// Bytes held here.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Relaxed)
    }

    /// Holds `bytes` more (`what` names them), or refuses when the limit would be passed.
    pub(crate) fn take(&self, bytes: usize, what: &str) -> Result<(), OnnxError> {
        let others = self.others.load(Ordering::Relaxed);
        let held = self.held();
        let total = others.saturating_add(held).saturating_add(bytes);
        if total > self.limit {
            return Err(OnnxError::too_large(format!(
                "memory limit exceeded: {what} ({bytes} bytes) would bring the invocation's \
                 memory to {total} bytes (linear memories and GPU buffers {others}, wasi-nn \
                 models and arenas {held}); the function's limit is {} bytes",
                self.limit
            )));
        }
        self.held.fetch_add(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// Gives back `bytes`.
    pub(crate) fn give(&self, bytes: usize) {
        self.held
            .fetch_sub(bytes.min(self.held()), Ordering::Relaxed);
    }
}

/// What every invocation shares: parsed models by content hash, the settings, and the CPU
/// backend of the `cpu` target on a CUDA host.
pub(crate) struct NnShared {
    config: NnConfig,
    models: RwLock<BoundedLru<[u8; 32], Arc<Model>>>,
    /// Models tenants stored, by tenant and name (`crate::runtime::models`).
    pub(crate) named: RwLock<HashMap<(String, String), ModelRecord>>,
    /// Serialises stores and deletes of named models.
    pub(crate) named_lock: Mutex<()>,
    /// Models the operator preloaded, by name, parsed once and never evicted.
    preloaded: HashMap<String, Arc<Model>>,
    store: Arc<dyn FunctionStore>,
    side_cpu: OnceLock<Result<Arc<dyn Backend>, String>>,
    side_kernels: Mutex<HashMap<String, Kernel>>,
}

impl std::fmt::Debug for NnShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NnShared")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

/// Most blueprint kernels the side CPU backend keeps loaded (descriptors come from models).
const MAX_SIDE_KERNELS: usize = 256;

impl NnShared {
    /// The shared state over `store`: its model records read, the operator's models parsed.
    pub(crate) fn open(
        config: NnConfig,
        store: Arc<dyn FunctionStore>,
    ) -> Result<Self, crate::RuntimeError> {
        let mut shared = NnShared {
            models: RwLock::new(BoundedLru::new(config.cached_models)),
            named: RwLock::new(HashMap::new()),
            named_lock: Mutex::new(()),
            preloaded: HashMap::new(),
            store: store.clone(),
            config,
            side_cpu: OnceLock::new(),
            side_kernels: Mutex::new(HashMap::new()),
        };
        for (name, path) in shared.config.preload.clone() {
            let bytes = std::fs::read(&path).map_err(|e| {
                crate::RuntimeError::InvalidConfig(format!(
                    "preloading model `{name}` from {}: {e}",
                    path.display()
                ))
            })?;
            let deadline = Instant::now() + std::time::Duration::from_secs(600);
            let model = shared.model(&bytes, deadline).map_err(|e| {
                crate::RuntimeError::InvalidConfig(format!("preloading model `{name}`: {e}"))
            })?;
            shared.preloaded.insert(name, model);
        }
        let records = store.models()?;
        *shared
            .named
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner) = records
            .into_iter()
            .map(|r| ((r.tenant.clone(), r.name.clone()), r))
            .collect();
        Ok(shared)
    }

    /// The model `tenant` named `name`: its own stored model, else one the operator
    /// preloaded; `None` when neither exists.
    pub(crate) fn by_name(
        &self,
        tenant: &str,
        name: &str,
        deadline: Instant,
    ) -> Result<Option<Arc<Model>>, OnnxError> {
        let record = self
            .named
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&(tenant.to_owned(), name.to_owned()))
            .cloned();
        if let Some(record) = record {
            let mut key = [0u8; 32];
            if hex::decode_to_slice(&record.sha256, &mut key).is_ok() {
                if let Some(model) = self
                    .models
                    .read()
                    .unwrap_or_else(PoisonError::into_inner)
                    .get(&key)
                {
                    return Ok(Some(model.clone()));
                }
            }
            let bytes = self
                .store
                .model_bytes(&record.sha256)
                .map_err(|e| OnnxError::kernel(format!("reading model `{name}`: {e}")))?;
            return self.model(&bytes, deadline).map(Some);
        }
        Ok(self.preloaded.get(name).cloned())
    }

    /// The model in `bytes`: from the cache when a model with the same bytes was loaded,
    /// else decoded (until `deadline`), checked, folded and cached.
    pub(crate) fn model(&self, bytes: &[u8], deadline: Instant) -> Result<Arc<Model>, OnnxError> {
        if bytes.len() > self.config.max_model_bytes {
            return Err(OnnxError::too_large(format!(
                "a model of {} bytes; this host loads at most {}",
                bytes.len(),
                self.config.max_model_bytes
            )));
        }
        let key: [u8; 32] = Sha256::digest(bytes).into();
        if let Some(model) = self
            .models
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return Ok(model.clone());
        }
        let mut options = tensor_wasm_onnx::Options::default();
        options.limits.max_model_bytes = self.config.max_model_bytes;
        options.limits.deadline = Some(deadline);
        let model = Arc::new(Model::load(bytes, &options)?);
        let weight = model.constant_bytes() as u64 + bytes.len() as u64;
        self.models
            .write()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(key, model.clone(), weight);
        Ok(model)
    }

    /// The CPU backend of the `cpu` target on a CUDA host, opened on first use.
    fn side_cpu(&self) -> Result<Arc<dyn Backend>, OnnxError> {
        self.side_cpu
            .get_or_init(|| {
                tensor_wasm_gpu::open_backend(DeviceChoice::Cpu).map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|e| OnnxError::kernel(format!("opening the CPU backend: {e}")))
    }

    fn side_kernel(
        &self,
        backend: &dyn Backend,
        tenant: &TenantKey,
        blueprint: &Blueprint,
    ) -> Result<Kernel, OnnxError> {
        let descriptor = blueprint.descriptor();
        let mut kernels = self
            .side_kernels
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(kernel) = kernels.get(&descriptor) {
            return Ok(kernel.clone());
        }
        let kernel = backend
            .load_program(tenant, Arc::new(CompiledBlueprint::new(*blueprint)))
            .map_err(|e| OnnxError::kernel(format!("loading {descriptor}: {e}")))?;
        if kernels.len() >= MAX_SIDE_KERNELS {
            kernels.clear();
        }
        kernels.insert(descriptor, kernel.clone());
        Ok(kernel)
    }
}

/// Where a graph's kernels run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    /// The host's backend (the GPU on a CUDA host).
    Host,
    /// A CPU backend opened beside the host's CUDA backend.
    SideCpu,
}

/// The execution targets of `wasi-nn`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Requested {
    Cpu,
    Gpu,
    Tpu,
}

/// An arena of an execution context, charged to the invocation while it lives.
pub(crate) struct NnArena {
    memory: UnifiedBuffer,
    charge: Arc<HostBytes>,
    bytes: usize,
}

impl tensor_wasm_onnx::Arena for NnArena {
    fn bytes(&mut self) -> &mut [u8] {
        self.memory.as_mut_slice()
    }
}

impl Drop for NnArena {
    fn drop(&mut self) {
        self.charge.give(self.bytes);
    }
}

/// A graph an invocation loaded.
pub(crate) struct NnGraph {
    pub(crate) model: Arc<Model>,
    pub(crate) target: Target,
}

/// An execution context: the model's execution and where it runs.
pub(crate) struct NnContext {
    pub(crate) exec: Execution<NnArena>,
    pub(crate) target: Target,
    /// The kernels its launches loaded, by blueprint: a plan launches a few kernels many
    /// times, and this skips the backend's cache (a descriptor to parse, a lock) after the
    /// first.
    kernels: HashMap<Blueprint, Kernel>,
}

/// The `wasi-nn` state of one invocation.
pub(crate) struct NnHost {
    shared: Arc<NnShared>,
    gpu: Arc<GpuShared>,
    tenant_id: String,
    /// The function whose invocation this is (kernels are accounted to it).
    function: Arc<str>,
    tenant: TenantKey,
    deadline: Instant,
    charge: Arc<HostBytes>,
    managed: bool,
    pub(crate) graphs: Vec<NnGraph>,
    pub(crate) contexts: Vec<NnContext>,
    /// Why the last compute failed in the launch path, when it did (the dispatcher was
    /// saturated, the deadline passed): the host call turns it into a trap.
    pub(crate) failure: Option<Failure>,
    /// The message of the last refused call (core modules read it through
    /// `tensor_wasm_nn.last_error`; the witx errno cannot carry it).
    pub(crate) last_error: String,
}

impl NnHost {
    pub(crate) fn new(
        shared: Arc<NnShared>,
        gpu: Arc<GpuShared>,
        tenant: &str,
        function: &str,
        deadline: Instant,
        charge: Arc<HostBytes>,
        managed: bool,
    ) -> Self {
        NnHost {
            tenant_id: tenant.to_owned(),
            function: Arc::from(function),
            tenant: gpu.tenant_key(tenant),
            shared,
            gpu,
            deadline,
            charge,
            managed,
            graphs: Vec::new(),
            contexts: Vec::new(),
            failure: None,
            last_error: String::new(),
        }
    }

    /// Loads the model in `bytes` for `target`; returns its graph handle.
    pub(crate) fn load(&mut self, bytes: &[u8], target: Requested) -> Result<u32, OnnxError> {
        let target = self.target(target)?;
        let model = self.shared.model(bytes, self.deadline)?;
        self.add_graph(model, target)
    }

    /// Loads the model named `name` (the tenant's own, else the operator's), on the GPU on a
    /// CUDA host and on the CPU elsewhere; `None` when there is no such model.
    pub(crate) fn load_by_name(&mut self, name: &str) -> Result<Option<u32>, OnnxError> {
        match self.shared.by_name(&self.tenant_id, name, self.deadline)? {
            Some(model) => self.add_graph(model, Target::Host).map(Some),
            None => Ok(None),
        }
    }

    fn add_graph(&mut self, model: Arc<Model>, target: Target) -> Result<u32, OnnxError> {
        if self.graphs.len() >= MAX_GRAPHS {
            return Err(OnnxError::too_large(format!(
                "an invocation may load at most {MAX_GRAPHS} graphs"
            )));
        }
        self.charge
            .take(model.constant_bytes(), "the model's weights")?;
        self.graphs.push(NnGraph { model, target });
        Ok((self.graphs.len() - 1) as u32)
    }

    /// Where a requested target runs on this host.
    fn target(&self, target: Requested) -> Result<Target, OnnxError> {
        let host_is_gpu = matches!(self.gpu.backend.device(), Device::Cuda(_));
        let target = match (target, host_is_gpu) {
            (Requested::Cpu, false) => Target::Host,
            (Requested::Cpu, true) => Target::SideCpu,
            (Requested::Gpu, true) => Target::Host,
            (Requested::Gpu, false) if self.shared.config.gpu_fallback => Target::Host,
            (Requested::Gpu, false) => {
                return Err(OnnxError::unsupported(
                    "execution target gpu: this host has no GPU (the operator may allow the \
                     CPU backend instead: --nn-gpu-fallback)",
                ))
            }
            (Requested::Tpu, _) => {
                return Err(OnnxError::unsupported("execution target tpu"));
            }
        };
        Ok(target)
    }

    /// A new execution context of graph `graph`.
    pub(crate) fn init_context(&mut self, graph: u32) -> Result<u32, OnnxError> {
        let g = self
            .graphs
            .get(graph as usize)
            .ok_or_else(|| OnnxError::invalid_input(format!("no graph {graph}")))?;
        if self.contexts.len() >= MAX_CONTEXTS {
            return Err(OnnxError::too_large(format!(
                "an invocation may hold at most {MAX_CONTEXTS} execution contexts"
            )));
        }
        self.contexts.push(NnContext {
            exec: Execution::new(g.model.clone()),
            target: g.target,
            kernels: HashMap::new(),
        });
        Ok((self.contexts.len() - 1) as u32)
    }

    pub(crate) fn context(&mut self, context: u32) -> Result<&mut NnContext, OnnxError> {
        self.contexts
            .get_mut(context as usize)
            .ok_or_else(|| OnnxError::invalid_input(format!("no execution context {context}")))
    }

    /// Runs context `context` on its inputs. A failure of the launch path itself (the
    /// dispatcher saturated, the deadline passed) is left in [`NnHost::failure`].
    pub(crate) fn compute(&mut self, context: u32) -> Result<(), OnnxError> {
        let (shared, gpu, tenant) = (self.shared.clone(), self.gpu.clone(), self.tenant.clone());
        let function = self.function.clone();
        let (deadline, charge, managed) = (self.deadline, self.charge.clone(), self.managed);
        let ctx = self
            .contexts
            .get_mut(context as usize)
            .ok_or_else(|| OnnxError::invalid_input(format!("no execution context {context}")))?;
        let side = match ctx.target {
            Target::Host => None,
            Target::SideCpu => Some(shared.side_cpu()?),
        };
        let mut launcher = NnLauncher {
            shared: &shared,
            gpu: &gpu,
            side: side.as_deref(),
            tenant: &tenant,
            function: &function,
            deadline,
            kernels: &mut ctx.kernels,
            failure: None,
        };
        let cuda = match &side {
            Some(_) => None,
            None => gpu.backend.cuda_context().filter(|_| managed),
        };
        let mut new_arena = |bytes: usize| -> Result<NnArena, OnnxError> {
            charge.take(bytes, "an execution context's arena")?;
            let memory = match &cuda {
                Some(ctx) => ManagedBuffer::new(ctx, bytes).map(UnifiedBuffer::Managed),
                None => GuardedHostBuffer::new(bytes, 0).map(UnifiedBuffer::Host),
            };
            match memory {
                Ok(memory) => Ok(NnArena {
                    memory,
                    charge: charge.clone(),
                    bytes,
                }),
                Err(e) => {
                    charge.give(bytes);
                    Err(OnnxError::too_large(format!(
                        "reserving {bytes} bytes for an execution context: {e}"
                    )))
                }
            }
        };
        let outcome = ctx
            .exec
            .compute(&mut launcher, &mut new_arena, Some(deadline));
        self.failure = launcher.failure.take();
        outcome
    }
}

/// Runs a plan's launches for one invocation: on the host's backend through
/// [`GpuShared::launch_on`], or on the side CPU backend.
struct NnLauncher<'a> {
    shared: &'a NnShared,
    gpu: &'a GpuShared,
    side: Option<&'a dyn Backend>,
    tenant: &'a TenantKey,
    function: &'a str,
    deadline: Instant,
    kernels: &'a mut HashMap<Blueprint, Kernel>,
    failure: Option<Failure>,
}

impl NnLauncher<'_> {
    /// `blueprint`'s kernel on the backend this context runs on: a failure of the host's
    /// kernel path (for the caller to report), or the side backend's refusal.
    fn kernel(&mut self, blueprint: &Blueprint) -> Result<Result<Kernel, Failure>, OnnxError> {
        if let Some(kernel) = self.kernels.get(blueprint) {
            return Ok(Ok(kernel.clone()));
        }
        let kernel = match self.side {
            None => match self
                .gpu
                .blueprint_kernel(self.tenant, &blueprint.descriptor())
            {
                Ok(kernel) => kernel,
                Err(failure) => return Ok(Err(failure)),
            },
            Some(backend) => self.shared.side_kernel(backend, self.tenant, blueprint)?,
        };
        self.kernels.insert(*blueprint, kernel.clone());
        Ok(Ok(kernel))
    }
}

impl Launcher for NnLauncher<'_> {
    fn launch(
        &mut self,
        blueprint: &Blueprint,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<(), OnnxError> {
        let outcome = self.kernel(blueprint)?.and_then(|kernel| match self.side {
            None => self.gpu.launch_on(
                self.tenant,
                self.function,
                self.deadline,
                &kernel,
                config,
                args,
                memory,
            ),
            Some(backend) => self.gpu.launch_on_backend(
                backend,
                self.tenant,
                self.function,
                self.deadline,
                &kernel,
                config,
                args,
                memory,
            ),
        });
        outcome.map_err(|failure| {
            let error = match &failure {
                Failure::Abi(e) => OnnxError::kernel(format!("{blueprint}: {}", e.message)),
                Failure::Saturated(e) => OnnxError::kernel(format!("{blueprint}: {e}")),
                Failure::Deadline => {
                    OnnxError::new(ErrorCode::Deadline, "the invocation's deadline passed")
                }
            };
            self.failure = Some(failure);
            error
        })
    }
}
