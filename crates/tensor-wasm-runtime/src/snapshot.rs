//! Snapshots of function instances: run an init export once, capture linear memory and the
//! mutable globals, and start later instances from that state instead of from scratch.
//!
//! Capture encodes the state twice, straight from the instance's memory: the **portable** encoding (zstd frames, checksummed) is
//! the durable copy in the function store; the **local** encoding (page-aligned, sparse) is a
//! per-host cache under `<data_dir>/snapshot-cache/`, rebuilt from the portable copy whenever
//! it is missing or fails validation. Restore uses the local image:
//!
//! - **lazy** when guest memory is unified host memory: the image is mapped copy-on-write over
//!   the instance's memory, pages load on first touch, so the cost does not grow with the size;
//! - **eager** otherwise (pooled slots are reused by other instances, CUDA managed memory
//!   cannot be remapped): the stored pages are copied into memory from a read-only mapping of
//!   the image kept with the opened image, by one thread per core. A pooled slot that keeps
//!   its pages resident (`pool_keep_resident_bytes`) skips faulting every page in again.
//!
//! The first restore after a process start opens the local image and verifies every stored
//! page's checksum once; later restores reuse the opened image and, in both modes, trust what
//! was verified (the eager copy does not checksum the runs again, as the lazy mapping never
//! does). An image rebuilt from the portable copy comes from a fully checked snapshot; its
//! eager restores check each run until the next process start verifies it.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use tensor_wasm_snapshot::{
    portable_to_local, write_local, CaptureOptions, GlobalValue, LocalImage, PortableEncoder,
    RestoreLimits, SnapshotError, SnapshotMeta, ValType,
};
use wasmtime::{Instance, Memory, Store, Val, V128};

use crate::error::{Result, RuntimeError};
use crate::function_entry::{FunctionEntry, Prepared};
use crate::instrument::{self, GLOBAL_PREFIX, MEMORY_EXPORT};
use crate::invocation_state::{classify, quiet_wasi, InvocationState};
use crate::store::{new_snapshot_id, FunctionRecord, InvocationStyle, SnapshotRecord, WriteBounds};
use crate::{FunctionInfo, Runtime};

/// Snapshots one function may keep; creating more is a conflict until some are deleted.
pub const MAX_SNAPSHOTS_PER_FUNCTION: usize = 8;

/// How an instance's memory is restored from a snapshot on this server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestoreMode {
    /// Mapped copy-on-write; pages load on first touch.
    Lazy,
    /// Copied into the instance's memory before the first call.
    Eager,
}

impl RestoreMode {
    /// The name used in metrics and in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            RestoreMode::Lazy => "lazy",
            RestoreMode::Eager => "eager",
        }
    }
}

/// An opened and verified local image of one snapshot.
pub(crate) struct Restorable {
    id: String,
    image: LocalImage,
}

impl Runtime {
    /// How this server restores snapshots (depends on where guest memory lives).
    pub fn restore_mode(&self) -> RestoreMode {
        let host_unified = self
            .inner
            .memory_creator
            .as_ref()
            .is_some_and(|c| !c.is_uvm_backed());
        if host_unified {
            RestoreMode::Lazy
        } else {
            RestoreMode::Eager
        }
    }

    /// Runs `init_export` of function `id` in a fresh instance and captures the result as a
    /// new snapshot, durable when this returns. With `activate`, every later instance of the
    /// function starts from it.
    ///
    /// # Errors
    /// [`RuntimeError::SnapshotUnsupported`] for WASI commands, modules that change tables at
    /// run time and reference-typed globals; [`RuntimeError::UnknownExport`] /
    /// [`RuntimeError::InvalidArguments`] for a missing or parameterised init export;
    /// [`RuntimeError::Conflict`] beyond [`MAX_SNAPSHOTS_PER_FUNCTION`]; guest failures of
    /// the init export as for an invocation; [`RuntimeError::StorageQuotaExceeded`] above
    /// the server's `max_stored_bytes_per_tenant`.
    pub fn create_snapshot(
        &self,
        id: &str,
        init_export: &str,
        activate: bool,
    ) -> Result<SnapshotRecord> {
        self.create_snapshot_within(id, init_export, activate, None)
    }

    /// [`Runtime::create_snapshot`] charged against the tenant's stored-bytes quota
    /// `max_stored_bytes` (`None`: the server's `max_stored_bytes_per_tenant`).
    ///
    /// # Errors
    /// As [`Runtime::create_snapshot`].
    pub fn create_snapshot_within(
        &self,
        id: &str,
        init_export: &str,
        activate: bool,
        max_stored_bytes: Option<u64>,
    ) -> Result<SnapshotRecord> {
        let entry = self.entry(id)?;
        let record = &entry.record;
        if record.component {
            return Err(RuntimeError::SnapshotUnsupported(
                "snapshots of WebAssembly components are not built yet (docs/components.md); \
                 each invocation starts from a fresh instance"
                    .into(),
            ));
        }
        if record.style != InvocationStyle::Export {
            return Err(RuntimeError::SnapshotUnsupported(
                "a WASI command runs `_start` from scratch on every invocation; snapshots are \
                 for export-call functions"
                    .into(),
            ));
        }
        let prepared = self.prepared(&entry)?;
        let ty = prepared
            .funcs
            .get(init_export)
            .ok_or_else(|| RuntimeError::UnknownExport(init_export.to_owned()))?;
        if ty.params().len() != 0 {
            return Err(RuntimeError::InvalidArguments(format!(
                "the init export `{init_export}` must take no parameters"
            )));
        }
        // Early refusal before running init; checked again, atomically, before the write.
        self.check_snapshot_count(id)?;
        let binary = self.inner.store.module(&record.module_sha256)?;
        if let Some(what) =
            instrument::table_mutation(&binary).map_err(RuntimeError::InvalidModule)?
        {
            return Err(RuntimeError::SnapshotUnsupported(format!(
                "the module can change its tables at run time ({what}); snapshots record \
                 memory and globals only"
            )));
        }

        let _slot = self.take_slot()?;
        let wasi = prepared
            .needs_wasi
            .then(|| quiet_wasi(&record.name, self.inner.config.stderr_tail_bytes));
        let (mut store, instance) = self.instantiate(&prepared, record, wasi);
        let instance = instance.map_err(|e| classify(e, &mut store, &record.limits))?;
        let init_start = Instant::now();
        if prepared.has_initialize {
            if let Some(init) = instance.get_func(&mut store, "_initialize") {
                init.call(&mut store, &[], &mut [])
                    .map_err(|e| classify(e, &mut store, &record.limits))?;
            }
        }
        let func = instance
            .get_func(&mut store, init_export)
            .ok_or_else(|| RuntimeError::UnknownExport(init_export.to_owned()))?;
        let mut results = vec![Val::I32(0); ty.results().len()];
        func.call(&mut store, &[], &mut results)
            .map_err(|e| classify(e, &mut store, &record.limits))?;
        let init_us = micros(init_start.elapsed());

        let capture_start = Instant::now();
        let (meta, memory) = capture(&mut store, &instance, &prepared, record)?;
        // Encoded straight from the instance's memory, into the runtime's kept encoder.
        let memory = memory.map_or(&[][..], |m| m.data(&store));
        let snapshot_id = new_snapshot_id();
        let mut encoder = EncoderLease::take(self);
        let portable = encoder
            .encode(&meta, memory, &CaptureOptions::default())
            .map_err(|e| RuntimeError::Engine(format!("encoding the snapshot: {e}")))?;
        let local_path = self.local_path(&snapshot_id);
        let written = local_path
            .parent()
            .map_or(Ok(()), |dir| {
                tensor_wasm_durable::create_dir_all(dir).map_err(std::io::Error::from)
            })
            .map_err(SnapshotError::from)
            .and_then(|()| write_local(&meta, memory, &local_path));
        if let Err(e) = written {
            // A cache: the first restore rebuilds it from the portable copy.
            tracing::warn!(snapshot = %snapshot_id, error = %e, "local image not written");
        }
        let capture_us = micros(capture_start.elapsed());
        let snapshot_record = SnapshotRecord {
            id: snapshot_id,
            function_id: record.id.clone(),
            tenant: record.tenant.clone(),
            module_sha256: record.module_sha256.clone(),
            init_export: init_export.to_owned(),
            created_at_ms: meta.created_at_ms,
            memory_bytes: meta.memory_size_bytes,
            stored_bytes: portable.len() as u64,
            globals: meta.globals.len() as u32,
            capture_us,
            init_us,
        };
        drop(store);
        {
            let _lock = self.inner.record_lock.lock().expect("lock");
            // The function may have been deleted while init ran.
            self.entry(id)?;
            // The count and the bytes are checked under the locks the write holds, so
            // concurrent captures cannot together pass either limit.
            let quota = max_stored_bytes.unwrap_or(self.inner.config.max_stored_bytes_per_tenant);
            let reservation = self
                .inner
                .storage
                .reserve(&record.tenant, portable.len() as u64, quota, || {
                    self.check_snapshot_count(id)
                })
                .inspect_err(|_| {
                    let _ = std::fs::remove_file(&local_path);
                })?;
            let bounds = WriteBounds {
                max_snapshots_per_function: Some(MAX_SNAPSHOTS_PER_FUNCTION as u64),
                max_stored_bytes: Some(quota),
                ..WriteBounds::default()
            };
            self.inner
                .store
                .create_snapshot(
                    &snapshot_record,
                    &portable.pieces().collect::<Vec<_>>(),
                    &bounds,
                )
                .inspect_err(|_| {
                    let _ = std::fs::remove_file(&local_path);
                })?;
            reservation.commit();
        }
        let m = &self.inner.metrics;
        m.snapshot_captures.inc();
        m.snapshot_capture_seconds
            .observe(capture_start.elapsed().as_secs_f64());
        m.snapshot_bytes
            .with_label_values(&["captured"])
            .inc_by(snapshot_record.memory_bytes);
        tracing::info!(
            function = %id,
            snapshot = %snapshot_record.id,
            memory_bytes = snapshot_record.memory_bytes,
            stored_bytes = snapshot_record.stored_bytes,
            init_us,
            capture_us,
            "snapshot captured"
        );
        if activate {
            self.set_start_from_snapshot(id, Some(&snapshot_record.id))?;
        }
        Ok(snapshot_record)
    }

    /// [`RuntimeError::Conflict`] when function `id` keeps [`MAX_SNAPSHOTS_PER_FUNCTION`].
    fn check_snapshot_count(&self, id: &str) -> Result<()> {
        if self.inner.store.snapshots(id)?.len() >= MAX_SNAPSHOTS_PER_FUNCTION {
            return Err(WriteBounds::too_many_snapshots(
                id,
                MAX_SNAPSHOTS_PER_FUNCTION as u64,
            ));
        }
        Ok(())
    }

    /// The snapshots of function `id`, oldest first.
    ///
    /// # Errors
    /// [`RuntimeError::FunctionNotFound`], storage errors.
    pub fn snapshots(&self, id: &str) -> Result<Vec<SnapshotRecord>> {
        self.entry(id)?;
        self.inner.store.snapshots(id)
    }

    /// Deletes snapshot `snapshot_id` of function `id`; `false` if it did not exist.
    ///
    /// # Errors
    /// [`RuntimeError::Conflict`] when the function starts from this snapshot.
    pub fn delete_snapshot(&self, id: &str, snapshot_id: &str) -> Result<bool> {
        let _lock = self.inner.record_lock.lock().expect("lock");
        let entry = self.entry(id)?;
        if entry.record.start_from_snapshot.as_deref() == Some(snapshot_id) {
            return Err(RuntimeError::Conflict(format!(
                "function {id} starts every instance from snapshot {snapshot_id}; switch it to \
                 another snapshot (or to none) first"
            )));
        }
        let stored_bytes = self
            .inner
            .store
            .snapshots(id)?
            .iter()
            .find(|s| s.id == snapshot_id)
            .map_or(0, |s| s.stored_bytes);
        let deleted = self.inner.store.delete_snapshot(id, snapshot_id)?;
        if deleted {
            self.inner
                .storage
                .release(&entry.record.tenant, stored_bytes);
            let _ = std::fs::remove_file(self.local_path(snapshot_id));
            tracing::info!(function = %id, snapshot = %snapshot_id, "snapshot deleted");
        }
        Ok(deleted)
    }

    /// Sets the snapshot every instance of function `id` starts from: a snapshot id,
    /// `"latest"`, or `None` for fresh instances. Durable when it returns.
    ///
    /// # Errors
    /// [`RuntimeError::SnapshotNotFound`] when the snapshot (or any, for `"latest"`) is absent.
    pub fn set_start_from_snapshot(
        &self,
        id: &str,
        snapshot: Option<&str>,
    ) -> Result<FunctionInfo> {
        {
            let _lock = self.inner.record_lock.lock().expect("lock");
            self.entry(id)?;
            let target = match snapshot {
                None => None,
                Some(wanted) => {
                    let all = self.inner.store.snapshots(id)?;
                    let found = if wanted == "latest" {
                        all.last()
                    } else {
                        all.iter().find(|s| s.id == wanted)
                    };
                    let found = found.ok_or_else(|| {
                        RuntimeError::SnapshotNotFound(if wanted == "latest" {
                            format!("(latest: function {id} has no snapshots)")
                        } else {
                            wanted.to_owned()
                        })
                    })?;
                    Some(found.id.clone())
                }
            };
            self.modify_record(id, |record| {
                record.start_from_snapshot = target.clone();
                Ok(())
            })?;
        }
        self.function(id)
    }

    /// Removes every snapshot of a deleted function, and their local images.
    pub(crate) fn forget_snapshots(&self, id: &str) -> Result<()> {
        for snapshot in self.inner.store.snapshots(id)? {
            let _ = std::fs::remove_file(self.local_path(&snapshot.id));
        }
        self.inner.store.delete_snapshots(id)
    }

    /// Restores snapshot `snapshot_id` into a freshly instantiated `instance`.
    pub(crate) fn restore_snapshot(
        &self,
        entry: &FunctionEntry,
        prepared: &Prepared,
        snapshot_id: &str,
        store: &mut Store<InvocationState>,
        instance: &Instance,
    ) -> Result<()> {
        let start = Instant::now();
        crate::trace::note_snapshot(snapshot_id);
        let span = tensor_wasm_telemetry::span!(
            "restore snapshot",
            tensor_wasm.snapshot = snapshot_id,
            tensor_wasm.function = entry.record.id.as_str(),
        );
        let _in = span.enter();
        let restorable = self.restorable(entry, snapshot_id)?;
        let image = &restorable.image;
        let corrupt = |message: String| RuntimeError::SnapshotCorrupt {
            id: snapshot_id.to_owned(),
            message,
        };
        let mut mode = RestoreMode::Eager;
        match instance.get_memory(&mut *store, MEMORY_EXPORT) {
            Some(memory) => {
                let current = memory.data_size(&*store);
                let target = image.memory_size();
                if target < current {
                    return Err(corrupt(format!(
                        "its memory ({target} bytes) is smaller than the module's initial \
                         memory ({current} bytes)"
                    )));
                }
                if target > current {
                    let page = memory.page_size(&*store) as usize;
                    memory
                        .grow(&mut *store, ((target - current) / page) as u64)
                        .map_err(|e| classify(e, store, &entry.record.limits))?;
                }
                let dest = memory.data_mut(&mut *store);
                if self.restore_mode() == RestoreMode::Lazy && map_lazily(image, dest) {
                    mode = RestoreMode::Lazy;
                } else {
                    image
                        .read_verified_into(dest)
                        .map_err(|e| corrupt(e.to_string()))?;
                }
            }
            None if image.memory_size() == 0 => {}
            None => return Err(corrupt("the module has no memory to restore into".into())),
        }
        let meta = image.meta();
        let indices: Vec<u32> = meta.globals.iter().map(|g| g.index).collect();
        if indices != prepared.state_globals {
            return Err(corrupt(
                "its globals do not match the module's mutable globals".into(),
            ));
        }
        for global in &meta.globals {
            let handle = instance
                .get_global(&mut *store, &format!("{GLOBAL_PREFIX}{}", global.index))
                .ok_or_else(|| corrupt(format!("global {} is not exported", global.index)))?;
            handle
                .set(&mut *store, value_of(global))
                .map_err(|e| corrupt(format!("global {}: {e}", global.index)))?;
        }
        let m = &self.inner.metrics;
        m.snapshot_restores
            .with_label_values(&[mode.as_str()])
            .inc();
        m.snapshot_restore_seconds
            .with_label_values(&[mode.as_str()])
            .observe(start.elapsed().as_secs_f64());
        m.snapshot_bytes
            .with_label_values(&["restored"])
            .inc_by(image.memory_size() as u64);
        Ok(())
    }

    /// The opened local image of `snapshot_id`, opening (and if needed rebuilding) it once.
    fn restorable(&self, entry: &FunctionEntry, snapshot_id: &str) -> Result<Arc<Restorable>> {
        let mut slot = entry.restore.lock().expect("lock");
        if let Some(open) = slot.as_ref().filter(|r| r.id == snapshot_id) {
            return Ok(open.clone());
        }
        let record = &entry.record;
        let corrupt = |e: SnapshotError| RuntimeError::SnapshotCorrupt {
            id: snapshot_id.to_owned(),
            message: e.to_string(),
        };
        let sha = module_sha(&record.module_sha256)?;
        let limits = RestoreLimits {
            max_memory_bytes: record.limits.memory_limit_bytes,
            ..RestoreLimits::default()
        };
        let path = self.local_path(snapshot_id);
        let cached =
            LocalImage::open(&path, &limits, &sha).and_then(|image| image.verify().map(|()| image));
        let image = match cached {
            Ok(image) => image,
            Err(e) => {
                if path.exists() {
                    tracing::warn!(
                        snapshot = %snapshot_id,
                        error = %e,
                        "local image unusable; rebuilding it from the stored snapshot"
                    );
                }
                let bytes = self
                    .inner
                    .store
                    .snapshot_bytes(&record.id, snapshot_id)?
                    .ok_or_else(|| RuntimeError::SnapshotNotFound(snapshot_id.to_owned()))?;
                if let Some(dir) = path.parent() {
                    tensor_wasm_durable::create_dir_all(dir).map_err(|e| {
                        let (path, source) = e.into_parts();
                        RuntimeError::storage(path, source)
                    })?;
                }
                portable_to_local(&bytes, &limits, &sha, &path).map_err(corrupt)?;
                LocalImage::open(&path, &limits, &sha).map_err(corrupt)?
            }
        };
        let mut image = image;
        if self.restore_mode() == RestoreMode::Eager {
            if let Err(error) = map_for_reads(&mut image) {
                tracing::warn!(snapshot = %snapshot_id, %error, "local image not mapped; reading it");
            }
        }
        let restorable = Arc::new(Restorable {
            id: snapshot_id.to_owned(),
            image,
        });
        *slot = Some(restorable.clone());
        Ok(restorable)
    }

    pub(crate) fn local_path(&self, snapshot_id: &str) -> PathBuf {
        self.inner
            .config
            .data_dir
            .join("snapshot-cache")
            .join(format!("{snapshot_id}.twlocal"))
    }
}

/// The metadata of one instance's state (mutable globals, memory size) and its memory, whose
/// bytes the caller reads while it still holds the store.
fn capture(
    store: &mut Store<InvocationState>,
    instance: &Instance,
    prepared: &Prepared,
    record: &FunctionRecord,
) -> Result<(SnapshotMeta, Option<Memory>)> {
    let memory = instance.get_memory(&mut *store, MEMORY_EXPORT);
    let (len, page_size) = memory.map_or((0, 65_536), |m| {
        (m.data_size(&*store), m.page_size(&*store) as u32)
    });
    let mut meta = SnapshotMeta::new(
        module_sha(&record.module_sha256)?,
        record.id.clone(),
        record.tenant.clone(),
        len as u64,
    );
    meta.page_size = page_size;
    for &index in &prepared.state_globals {
        let global = instance
            .get_global(&mut *store, &format!("{GLOBAL_PREFIX}{index}"))
            .ok_or_else(|| RuntimeError::Engine(format!("global {index} was not exported")))?;
        let (ty, bits) = match global.get(&mut *store) {
            Val::I32(v) => (ValType::I32, u128::from(v as u32)),
            Val::I64(v) => (ValType::I64, u128::from(v as u64)),
            Val::F32(bits) => (ValType::F32, u128::from(bits)),
            Val::F64(bits) => (ValType::F64, u128::from(bits)),
            Val::V128(v) => (ValType::V128, v.as_u128()),
            _ => {
                return Err(RuntimeError::SnapshotUnsupported(format!(
                    "mutable global {index} holds a reference; snapshots record numeric globals \
                     only"
                )))
            }
        };
        meta.globals.push(GlobalValue { index, ty, bits });
    }
    Ok((meta, memory))
}

/// The runtime's kept [`PortableEncoder`] for one capture (a fresh one when another capture
/// holds it). Dropping the lease shrinks the encoder to
/// [`RuntimeConfig::snapshot_encoder_keep_bytes`](crate::RuntimeConfig::snapshot_encoder_keep_bytes)
/// and keeps it for the next capture.
struct EncoderLease<'a> {
    runtime: &'a Runtime,
    encoder: PortableEncoder,
}

impl<'a> EncoderLease<'a> {
    fn take(runtime: &'a Runtime) -> Self {
        let kept = runtime.inner.snapshot_encoder.lock().expect("lock").take();
        Self {
            runtime,
            encoder: kept.unwrap_or_default(),
        }
    }
}

impl std::ops::Deref for EncoderLease<'_> {
    type Target = PortableEncoder;
    fn deref(&self) -> &PortableEncoder {
        &self.encoder
    }
}

impl std::ops::DerefMut for EncoderLease<'_> {
    fn deref_mut(&mut self) -> &mut PortableEncoder {
        &mut self.encoder
    }
}

impl Drop for EncoderLease<'_> {
    fn drop(&mut self) {
        let keep = self.runtime.inner.config.snapshot_encoder_keep_bytes;
        self.encoder
            .shrink_to(usize::try_from(keep).unwrap_or(usize::MAX));
        if self.encoder.retained_bytes() > 0 {
            let mut slot = self.runtime.inner.snapshot_encoder.lock().expect("lock");
            if slot.is_none() {
                *slot = Some(std::mem::take(&mut self.encoder));
            }
        }
    }
}

fn value_of(global: &GlobalValue) -> Val {
    match global.ty {
        ValType::I32 => Val::I32(global.bits as u32 as i32),
        ValType::I64 => Val::I64(global.bits as u64 as i64),
        ValType::F32 => Val::F32(global.bits as u32),
        ValType::F64 => Val::F64(global.bits as u64),
        ValType::V128 => Val::V128(V128::from(global.bits)),
    }
}

fn micros(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

fn module_sha(hex_digest: &str) -> Result<[u8; 32]> {
    let mut sha = [0u8; 32];
    hex::decode_to_slice(hex_digest, &mut sha).map_err(|_| {
        RuntimeError::Engine(format!(
            "function record has a malformed module digest {hex_digest}"
        ))
    })?;
    Ok(sha)
}

/// Maps `image` copy-on-write over `dest` ([`LocalImage::map_into`]); false when it cannot
/// (the caller then reads the image eagerly).
#[allow(unsafe_code)]
fn map_lazily(image: &LocalImage, dest: &mut [u8]) -> bool {
    // SAFETY: local images live under `<data_dir>/snapshot-cache/` and are only ever created
    // by `write_local` / `portable_to_local` (temporary name, then rename) and removed by
    // unlink, so an image file is never truncated or rewritten in place while a restored
    // instance maps it; a replaced or deleted image keeps its inode for the mappings that
    // still use it. Nothing else writes there: a data directory belongs to one server
    // (docs/deploy.md).
    unsafe { image.map_into(dest) }.is_ok()
}

/// Eager restores of `image` copy from a read-only mapping of its file from now on.
#[allow(unsafe_code)]
fn map_for_reads(image: &mut LocalImage) -> std::result::Result<(), SnapshotError> {
    // SAFETY: as in `map_lazily`: a local image is only ever replaced by rename or removed by
    // unlink, never truncated or rewritten in place, and nothing else writes the snapshot
    // cache; the mapping lives as long as the opened image.
    unsafe { image.map_for_reads() }
}
