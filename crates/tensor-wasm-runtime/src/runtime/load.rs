//! Loading functions: compiled modules (from memory, a precompiled artifact
//! or the stored binary), their [`Prepared`] form, and instances of it in a
//! store with the function's limits.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use wasmtime::{ExternType, FuncType, Module, Store};
use wasmtime_wasi::p1::WasiP1Ctx;

use crate::bounded::BoundedLru;
use crate::engine::ModuleSource;
use crate::error::{truncate_message, Result, RuntimeError};
use crate::function_entry::{FunctionEntry, Prepared};
use crate::guest_gpu::GuestGpu;
use crate::invocation_state::InvocationState;
use crate::store::FunctionRecord;
use crate::Runtime;

/// Import module name of WASI preview 1.
const WASI_P1: &str = "wasi_snapshot_preview1";

/// Bytes in a wasm page.
const WASM_PAGE_BYTES: u64 = 64 << 10;

/// What an inline attempt may use: an epoch deadline of `ticks`, and at most
/// `max_memory_bytes` of linear memory (tables: at most
/// [`crate::INLINE_MAX_TABLE_ELEMENTS`] elements).
#[derive(Debug, Clone, Copy)]
pub(super) struct InlineBudget {
    pub(super) ticks: u64,
    pub(super) max_memory_bytes: u64,
}

impl Runtime {
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
            let loaded = if entry.record.component {
                self.component_of(&entry).map(drop)
            } else {
                self.prepared(&entry).map(drop)
            };
            if let Err(e) = loaded {
                tracing::error!(function = %entry.record.id, error = %e, "function failed to load");
                failed += 1;
            }
        }
        failed
    }

    /// The compiled module `sha`: from its artifact, or compiled from `binary` (read
    /// from the store when not given). Not cached here: the caller caches the
    /// prepared form and writes an artifact ([`Runtime::keep_loaded`]) once the
    /// module has proved usable, so a module that fails to link leaves nothing.
    pub(super) fn load_module(
        &self,
        sha: &str,
        binary: Option<&[u8]>,
    ) -> Result<(Module, ModuleSource)> {
        let start = Instant::now();
        let span = crate::trace::load_span(sha);
        let _in = span.enter();
        if let Some(module) = self.inner.artifacts.load(&self.inner.engine, sha) {
            span.record("tensor_wasm.module.source", "artifact");
            self.note_module_loaded(sha, ModuleSource::Artifact, start.elapsed());
            return Ok((module, ModuleSource::Artifact));
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
        span.record("tensor_wasm.module.source", "compiled");
        self.note_module_loaded(sha, ModuleSource::Compiled, start.elapsed());
        Ok((module, ModuleSource::Compiled))
    }

    fn note_module_loaded(&self, sha: &str, source: ModuleSource, took: Duration) {
        let m = &self.inner.metrics;
        m.compile_seconds.observe(took.as_secs_f64());
        m.module_loads.with_label_values(&[source.as_str()]).inc();
        tracing::debug!(
            module = sha,
            source = source.as_str(),
            ?took,
            "module ready"
        );
    }

    /// The loaded module `sha` if it is in memory, marked as used. On every
    /// invocation: a shared lock, a hash lookup and an atomic store.
    pub(crate) fn cached_prepared(&self, sha: &str) -> Option<Arc<Prepared>> {
        self.inner.loaded.read().expect("lock").get(sha).cloned()
    }

    /// Keeps a module that proved usable: its artifact on disk (when it was just
    /// compiled) and its prepared form in memory, evicting the least recently used
    /// past the bounds.
    pub(super) fn keep_loaded(&self, sha: &str, source: ModuleSource, prepared: &Arc<Prepared>) {
        let module = prepared.pre.module();
        if source == ModuleSource::Compiled {
            self.inner.artifacts.store(sha, module);
        }
        let image = module.image_range();
        let bytes = (image.end as usize).saturating_sub(image.start as usize) as u64;
        let mut loaded = self.inner.loaded.write().expect("lock");
        let evicted = loaded.insert(sha.to_owned(), prepared.clone(), bytes);
        self.note_loaded_cache(&loaded, evicted.len());
        drop(loaded);
        // Evicted modules are dropped here, outside the lock; instances and calls
        // that still hold them keep them alive until they finish.
        drop(evicted);
    }

    /// Forgets module `sha`, in memory and its artifact, unless a function uses it.
    pub(super) fn forget_module_if_unused(&self, sha: &str) {
        let used = self
            .inner
            .functions
            .read()
            .expect("lock")
            .values()
            .any(|e| e.record.module_sha256 == sha);
        if used {
            return;
        }
        self.inner.components.forget(sha);
        let mut loaded = self.inner.loaded.write().expect("lock");
        let removed = loaded.remove(sha);
        self.note_loaded_cache(&loaded, 0);
        drop(loaded);
        drop(removed);
        self.inner.artifacts.remove(sha);
    }

    fn note_loaded_cache(&self, loaded: &BoundedLru<String, Arc<Prepared>>, evicted: usize) {
        let m = &self.inner.metrics;
        m.cached_modules.set(loaded.len() as i64);
        m.module_cache.observe(loaded, evicted);
    }

    pub(super) fn prepare(&self, module: &Module) -> Result<Prepared> {
        let pre = self.inner.linker.instantiate_pre(module).map_err(|e| {
            RuntimeError::InvalidModule(truncate_message(format!(
                "{e:#} (functions may import only `{WASI_P1}`, `{}`, `{}` and `{}`)",
                crate::abi::MODULE,
                crate::stream::MODULE,
                crate::guest_trace::MODULE
            )))
        })?;
        let needs_wasi = module.imports().any(|i| i.module() == WASI_P1);
        let needs_gpu = module.imports().any(|i| i.module() == crate::abi::MODULE);
        let needs_nn = module.imports().any(|i| {
            i.module() == crate::nn::witx::MODULE || i.module() == crate::nn::witx::ERROR_MODULE
        });
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
        // Small in the worst case: what an inline call may start with.
        let resources = module.resources_required();
        let fits_inline = resources.num_memories <= 1
            && resources.max_initial_memory_size.is_none_or(|pages| {
                pages.saturating_mul(WASM_PAGE_BYTES) <= self.inner.config.inline_max_memory_bytes
            })
            && resources
                .max_initial_table_size
                .is_none_or(|elements| elements <= crate::INLINE_MAX_TABLE_ELEMENTS as u64);
        Ok(Prepared {
            pre,
            needs_wasi,
            needs_gpu,
            needs_nn,
            funcs,
            has_initialize,
            state_globals,
            self_contained: module.imports().len() == 0,
            fits_inline,
        })
    }

    /// The prepared form of a stored function: from the loaded-module cache, or
    /// loaded now (on first use, or after the cache evicted it).
    /// The component of `entry` (a function whose record says `component`), compiled and
    /// linked, from the store's bytes unless it is loaded already.
    pub(crate) fn component_of(
        &self,
        entry: &FunctionEntry,
    ) -> Result<crate::component::LoadedComponent> {
        let sha = &entry.record.module_sha256;
        self.inner
            .components
            .load(sha, &self.inner.artifacts, true, || {
                self.inner.store.module(sha)
            })
    }

    pub(crate) fn prepared(&self, entry: &FunctionEntry) -> Result<Arc<Prepared>> {
        let sha = &entry.record.module_sha256;
        if let Some(p) = self.cached_prepared(sha) {
            crate::trace::note_coldstart(false);
            return Ok(p);
        }
        let _guard = entry.load_lock.lock().expect("lock");
        if let Some(p) = self.cached_prepared(sha) {
            crate::trace::note_coldstart(false);
            return Ok(p);
        }
        crate::trace::note_coldstart(true);
        let (module, source) = self.load_module(sha, None)?;
        let prepared = Arc::new(self.prepare(&module)?);
        self.keep_loaded(sha, source, &prepared);
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

    /// [`Runtime::instantiate`] for an inline attempt under `inline`'s budget
    /// (`None`: the function's own limits). The deadline covers instantiation
    /// too.
    pub(super) fn instantiate_with_deadline(
        &self,
        prepared: &Prepared,
        record: &FunctionRecord,
        wasi: Option<WasiP1Ctx>,
        inline: Option<InlineBudget>,
    ) -> (Store<InvocationState>, wasmtime::Result<wasmtime::Instance>) {
        let deadline_ticks = inline.map(|budget| budget.ticks);
        let limits = &record.limits;
        if limits.raw_ptx && self.raw_ptx_withheld(&record.tenant) {
            // Checked here, where every instance starts, so a revoked
            // capability stops invocations, async jobs and snapshots alike.
            let store = Store::new(
                &self.inner.engine,
                InvocationState::new(limits.memory_limit_bytes, Instant::now(), None, None),
            );
            let withheld = crate::error::RawPtxWithheld(record.tenant.clone());
            return (store, Err(wasmtime::Error::new(withheld)));
        }
        let start = Instant::now();
        let span = crate::trace::instantiate_span(&record.id);
        let _in = span.enter();
        let ticks = deadline_ticks.unwrap_or_else(|| self.deadline_ticks(limits));
        // The same deadline as wall time, for host calls (which epochs cannot stop).
        let deadline = start
            + match deadline_ticks {
                Some(ticks) => self
                    .inner
                    .config
                    .epoch_tick
                    .saturating_mul(u32::try_from(ticks).unwrap_or(u32::MAX)),
                None => Duration::from_millis(limits.timeout_ms),
            };
        let gpu = prepared.needs_gpu.then(|| {
            GuestGpu::new(self.inner.gpu.clone(), limits.raw_ptx, deadline)
                .with_tenant(&record.tenant)
                .for_function(&record.id)
        });
        let mut state = InvocationState::new(limits.memory_limit_bytes, deadline, wasi, gpu);
        if prepared.needs_nn {
            state.nn = Some(crate::nn::NnHost::new(
                self.inner.nn.clone(),
                self.inner.gpu.clone(),
                &record.tenant,
                &record.id,
                deadline,
                state.host_bytes(),
                self.is_uvm_backed(),
            ));
        }
        if let Some(budget) = inline {
            state.cap_for_inline(budget.max_memory_bytes);
        }
        if self.inner.memory_creator.is_some() {
            // Unified memory: the whole limit is reserved up front (below).
            state.device_memory = Some(self.inner.gpu.accounts.hold(
                &record.tenant,
                &record.id,
                limits.memory_limit_bytes,
            ));
        }
        let mut store = Store::new(&self.inner.engine, state);
        store.limiter(|s| s.limiter());
        store.set_epoch_deadline(ticks);
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
        if instance.is_err() {
            span.record("otel.status_code", "ERROR");
        }
        (store, instance)
    }
}
