//! Deploying, deleting and looking up functions: the deploy request
//! ([`DeploySpec`]), its checks and limits, and the function catalogue.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use wasmtime::{ExternType, Module};

use crate::component_values::TypedExport;
use crate::error::{truncate_message, Result, RuntimeError};
use crate::function_entry::FunctionEntry;
use crate::store::{
    new_function_id, sha256_hex, FunctionLimits, FunctionRecord, InvocationStyle, RECORD_FORMAT,
};
use crate::values::ExportSignature;
use crate::Runtime;

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
    /// The tenant's stored-bytes quota (`None`: the server's
    /// `max_stored_bytes_per_tenant`); the module counts against it.
    pub max_stored_bytes: Option<u64>,
    /// The tenant's function-count quota, checked again by the store in the transaction that
    /// writes the record ([`crate::FunctionStore::create_function`]): exact across replicas
    /// of a shared store. `None`: the store does not check (the caller's count suffices, as
    /// it does for one process).
    pub max_functions: Option<u64>,
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
            max_stored_bytes: None,
            max_functions: None,
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
    /// Callable exports and their signatures (a core module's).
    pub exports: Vec<ExportSignature>,
    /// A component's typed exports with their WIT types (absent for every other function).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub typed_exports: Vec<TypedExport>,
}

/// Milliseconds since the Unix epoch (0 if the clock is set before it).
fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Runtime {
    /// Every deployed function, oldest first.
    pub fn functions(&self) -> Vec<FunctionRecord> {
        self.functions_where(|_| true)
    }

    /// The functions `keep` selects, oldest first; only those are cloned, so a lookup for one
    /// tenant costs a comparison per other function, not a copy of its record.
    fn functions_where(&self, keep: impl Fn(&FunctionRecord) -> bool) -> Vec<FunctionRecord> {
        let mut records: Vec<_> = self
            .inner
            .functions
            .read()
            .expect("lock")
            .values()
            .filter(|e| keep(&e.record))
            .map(|e| e.record.clone())
            .collect();
        records.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        records
    }

    /// The functions of `tenant` named `name`, oldest first.
    pub fn functions_named(&self, tenant: &str, name: &str) -> Vec<FunctionRecord> {
        self.functions_where(|r| r.tenant == tenant && r.name == name)
    }

    /// One function with its export signatures (loading it if needed).
    pub fn function(&self, id: &str) -> Result<FunctionInfo> {
        let entry = self.entry(id)?;
        if entry.record.component {
            // Its typed exports have WIT types, which the core signatures cannot show.
            let loaded = self.component_of(&entry)?;
            return Ok(FunctionInfo {
                record: entry.record.clone(),
                exports: Vec::new(),
                typed_exports: self.typed_exports(&loaded),
            });
        }
        let prepared = self.prepared(&entry)?;
        Ok(FunctionInfo {
            record: entry.record.clone(),
            exports: exports_of(prepared.pre.module()),
            typed_exports: Vec::new(),
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

    /// Function `id` as `tenant` invokes it: what the invocation path needs
    /// to know about it, from one lookup; `FunctionNotFound` when `id` is
    /// unknown or another tenant's.
    pub fn invocation_target(&self, id: &str, tenant: &str) -> Result<InvocationTarget> {
        let entry = self.entry(id)?;
        if entry.record.tenant != tenant {
            return Err(RuntimeError::FunctionNotFound(id.to_owned()));
        }
        Ok(InvocationTarget { entry })
    }

    /// The deadline of one invocation of function `id` (its `timeout_ms`).
    pub fn timeout_of(&self, id: &str) -> Result<std::time::Duration> {
        let entry = self.entry(id)?;
        Ok(std::time::Duration::from_millis(
            entry.record.limits.timeout_ms,
        ))
    }

    /// The functions `tenant` owns, oldest first.
    pub fn functions_of(&self, tenant: &str) -> Vec<FunctionRecord> {
        self.functions_where(|r| r.tenant == tenant)
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
        let component = crate::component::is_component(&binary);
        // A core module is cached (and its artifact written) only once the deploy has
        // succeeded: a module that compiles but fails to link or to pass the checks
        // below leaves nothing behind.
        let compile = tensor_wasm_telemetry::span!(
            "compile",
            tensor_wasm.module.sha256 = sha.as_str(),
            tensor_wasm.module.bytes = binary.len(),
            tensor_wasm.module.component = component,
            tensor_wasm.tenant = spec.tenant.as_str(),
            faas.name = name,
        );
        let compiling = compile.enter();
        let (style, core, exports, typed_exports) = if component {
            let (style, typed_exports) = self.check_component(&sha, &binary)?;
            (style, None, Vec::new(), typed_exports)
        } else {
            check_single_memory(&binary)?;
            let (prepared, loaded) = match self.cached_prepared(&sha) {
                Some(prepared) => (prepared, None),
                None => {
                    let (module, source) = self.load_module(&sha, Some(&binary))?;
                    (Arc::new(self.prepare(&module)?), Some(source))
                }
            };
            let module = prepared.pre.module();
            check_shape(module, spec.style, &limits)?;
            let exports = exports_of(module);
            (spec.style, Some((prepared, loaded)), exports, Vec::new())
        };
        drop(compiling);

        // The commit: module, record and catalogue entry under the read side
        // of the retired set, so a tenant delete either sees this function
        // in its sweep or this deploy sees the tenant retired (and stores
        // nothing).
        let retired = self
            .inner
            .retired_tenants
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if retired.contains(&spec.tenant) {
            return Err(RuntimeError::TenantRetired(spec.tenant));
        }
        let quota = spec
            .max_stored_bytes
            .unwrap_or(cfg.max_stored_bytes_per_tenant);
        let reservation =
            self.inner
                .storage
                .reserve(&spec.tenant, binary.len() as u64, quota, || Ok(()))?;
        let bounds = crate::WriteBounds {
            max_functions: spec.max_functions,
            max_stored_bytes: Some(quota),
            ..crate::WriteBounds::default()
        };
        // A deploy the shared counts refuse stores nothing.
        self.inner
            .store
            .check_new_function(&spec.tenant, binary.len() as u64, &bounds)?;
        let stored_sha = self.inner.store.put_module(&binary)?;
        debug_assert_eq!(stored_sha, sha);
        let record = FunctionRecord {
            format: RECORD_FORMAT,
            id: new_function_id(),
            tenant: spec.tenant.clone(),
            name: name.to_owned(),
            style,
            module_sha256: sha,
            module_size: binary.len() as u64,
            created_at_ms: now_ms(),
            limits,
            start_from_snapshot: None,
            component,
        };
        self.inner.store.create_function(&record, &bounds)?;
        reservation.commit();
        let info = FunctionInfo {
            record,
            exports,
            typed_exports,
        };
        let entry = FunctionEntry::new(info.record.clone());
        self.inner
            .functions
            .write()
            .expect("lock")
            .insert(info.record.id.clone(), Arc::new(entry));
        if let Some((prepared, Some(source))) = core {
            self.keep_loaded(&info.record.module_sha256, source, &prepared);
        }
        if component {
            let sha = &info.record.module_sha256;
            self.inner
                .components
                .write_artifact(sha, &self.inner.artifacts);
        }
        drop(retired);
        tracing::info!(function = %info.record.id, name = %info.record.name, "deployed");
        Ok(info)
    }

    /// Checks a component at deploy and returns the style its exports give it: an HTTP
    /// handler (`http`), a command (`wasi`) or typed exports (`export`); a component with
    /// nothing to invoke is refused. It must compile and link against the WASI 0.2,
    /// `wasi:http` and `tensor-wasm:gpu` hosts.
    /// Classifies, compiles and links component `binary`: its style and its typed exports.
    fn check_component(
        &self,
        sha: &str,
        binary: &[u8],
    ) -> Result<(InvocationStyle, Vec<TypedExport>)> {
        use crate::component::{classify, refusal, ComponentStyle};
        let style = match classify(binary)? {
            ComponentStyle::HttpHandler => InvocationStyle::Http,
            ComponentStyle::Command => InvocationStyle::Wasi,
            ComponentStyle::TypedExports(_) => InvocationStyle::Export,
            other => return Err(refusal(&other)),
        };
        let artifacts = &self.inner.artifacts;
        let loaded = self
            .inner
            .components
            .load(sha, artifacts, false, || Ok(binary.to_vec()))?;
        Ok((style, self.typed_exports(&loaded)))
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
        if spec.raw_ptx {
            self.check_raw_ptx_grant(&spec.tenant)?;
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

    /// Grants or withdraws the raw-kernel capability of function `id`
    /// (`FunctionLimits::raw_ptx`); granting needs `allow_raw_ptx` and a
    /// tenant whose capability is not withheld
    /// ([`Runtime::set_tenant_raw_ptx`]). Instances started afterwards see it.
    pub fn set_raw_ptx(&self, id: &str, raw_ptx: bool) -> Result<FunctionInfo> {
        {
            let _lock = self.inner.record_lock.lock().expect("lock");
            let entry = self.entry(id)?;
            if raw_ptx {
                self.check_raw_ptx_grant(&entry.record.tenant)?;
            }
            self.modify_record(id, |record| {
                record.limits.raw_ptx = raw_ptx;
                Ok(())
            })?;
        }
        self.function(id)
    }

    /// Changes the record of function `id` by `change`, applied to the record as the store
    /// holds it now (not to this replica's copy, which may be behind another replica's
    /// change), and makes the result this runtime's entry. The write is conditional on the
    /// record read ([`crate::FunctionStore::replace_function`]); when another writer came first it
    /// is read and changed again. A function deleted meanwhile stays deleted
    /// ([`RuntimeError::FunctionNotFound`]). The caller holds `record_lock`.
    pub(crate) fn modify_record(
        &self,
        id: &str,
        change: impl Fn(&mut FunctionRecord) -> Result<()>,
    ) -> Result<()> {
        const ATTEMPTS: usize = 32;
        for _ in 0..ATTEMPTS {
            let current = self
                .inner
                .store
                .function(id)?
                .ok_or_else(|| RuntimeError::FunctionNotFound(id.to_owned()))?;
            let mut record = current.clone();
            change(&mut record)?;
            if record == current || self.inner.store.replace_function(&current, &record)? {
                // The loaded module stays in the module cache (keyed by its hash).
                self.inner
                    .functions
                    .write()
                    .expect("lock")
                    .insert(id.to_owned(), Arc::new(FunctionEntry::new(record)));
                return Ok(());
            }
        }
        Err(RuntimeError::StoreUnavailable(format!(
            "function {id}: {ATTEMPTS} other writers changed it first; retry"
        )))
    }

    /// Whether a function of `tenant` may be given the raw-kernel
    /// capability: the server allows it (`allow_raw_ptx`) and the tenant's
    /// capability is not withheld.
    fn check_raw_ptx_grant(&self, tenant: &str) -> Result<()> {
        if !self.inner.config.allow_raw_ptx {
            return Err(RuntimeError::InvalidConfig(
                "raw PTX is disabled on this server (the operator grants it with --allow-raw-ptx; \
                 raw PTX can address any device memory)"
                    .into(),
            ));
        }
        if self.raw_ptx_withheld(tenant) {
            return Err(RuntimeError::RawPtxNotGranted(format!(
                "tenant {tenant} does not hold the raw-kernel capability; the admin grants it \
                 with PATCH /tenants/{{id}} {{\"raw_ptx\": true}}"
            )));
        }
        Ok(())
    }

    /// Deletes a function; `false` if it did not exist.
    pub fn delete(&self, id: &str) -> Result<bool> {
        let _lock = self.inner.record_lock.lock().expect("lock");
        let snapshots = self.inner.store.snapshots(id)?;
        if !self.inner.store.delete_function(id)? {
            return Ok(false);
        }
        self.forget_snapshots(id)?;
        let removed = self.inner.functions.write().expect("lock").remove(id);
        if let Some(entry) = removed {
            let snapshot_bytes: u64 = snapshots.iter().map(|s| s.stored_bytes).sum();
            self.inner.storage.release(
                &entry.record.tenant,
                entry.record.module_size + snapshot_bytes,
            );
            self.forget_module_if_unused(&entry.record.module_sha256);
        }
        tracing::info!(function = %id, "deleted");
        Ok(true)
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

/// Refuses modules with more than one linear memory, imported or defined.
///
/// Every memory of an instance is allocated at the function's memory limit
/// (unified guest memory) while quotas and the limit count one memory per
/// instance, so a module with N memories would hold N times what it is charged
/// for. The engine has multi-memory turned off as well; this check runs before
/// compiling so that the client gets a clear `unsupported_feature` error.
fn check_single_memory(binary: &[u8]) -> Result<()> {
    use wasmparser::{Parser, Payload, TypeRef};
    let invalid = |e: wasmparser::BinaryReaderError| {
        RuntimeError::InvalidModule(truncate_message(e.to_string()))
    };
    let mut memories = 0u64;
    for payload in Parser::new(0).parse_all(binary) {
        match payload.map_err(invalid)? {
            Payload::ImportSection(reader) => {
                for import in reader.into_imports() {
                    if matches!(import.map_err(invalid)?.ty, TypeRef::Memory(_)) {
                        memories += 1;
                    }
                }
            }
            Payload::MemorySection(reader) => memories += u64::from(reader.count()),
            _ => {}
        }
    }
    if memories > 1 {
        return Err(RuntimeError::UnsupportedFeature(format!(
            "the module has {memories} linear memories (imported and defined); TensorWasm \
             accepts at most one (the multi-memory proposal is not supported)"
        )));
    }
    Ok(())
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
        InvocationStyle::Http => Err(RuntimeError::InvalidConfig(
            "style `http` is for components exporting wasi:http/incoming-handler; this is a \
             core module (style `export` or `wasi`)"
                .into(),
        )),
    }
}

/// A function looked up for one invocation ([`Runtime::invocation_target`]).
pub struct InvocationTarget {
    pub(super) entry: Arc<FunctionEntry>,
}

impl InvocationTarget {
    /// How the function is invoked.
    pub fn style(&self) -> InvocationStyle {
        self.entry.record.style
    }

    /// Its memory limit in bytes.
    pub fn memory_limit_bytes(&self) -> u64 {
        self.entry.record.limits.memory_limit_bytes
    }

    /// The deadline of one invocation (its `timeout_ms`).
    pub fn timeout(&self) -> std::time::Duration {
        std::time::Duration::from_millis(self.entry.record.limits.timeout_ms)
    }
}
