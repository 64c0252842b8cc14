//! Durable function store: the trait and its embedded local-disk implementation.
//!
//! Layout of the embedded store under the data directory:
//!
//! ```text
//! modules/<sha256>.wasm     module bytes, content-addressed, immutable
//! functions/<id>.json       one metadata record per function
//! snapshots/<function id>/<snapshot id>.twsnap   portable snapshot bytes
//! snapshots/<function id>/<snapshot id>.json     its record (written last)
//! tmp/                      staging area for atomic writes, emptied on open
//! quarantine/functions/     records this build cannot read (see `crate::quarantine`)
//! ```
//!
//! Every write goes through `tensor_wasm_durable::write_file_pieces`: staged in `tmp/`,
//! fsynced, renamed into place and the parent directory fsynced, so a record is
//! either absent or complete after a crash.
//! A deploy writes the module first and the record last: a crash in between
//! leaves an unreferenced module (collected on the next open), never a function
//! without its module. The collection on open never removes what a quarantined
//! (unreadable) record might reference.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tensor_wasm_durable::{write_file_pieces, DurableError, WriteOptions};

use crate::error::{Result, RuntimeError};
pub use crate::model_store::ModelRecord;
use crate::quarantine::{self, Protected, QuarantinedRecord};

/// Version of the [`FunctionRecord`] encoding written by this build.
pub const RECORD_FORMAT: u32 = 1;

/// How a function is invoked; chosen at deploy time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InvocationStyle {
    /// Call a named export with typed arguments, get typed results back.
    Export,
    /// Run the module's `_start` as a WASI preview 1 command: body to stdin,
    /// stdout to the response.
    Wasi,
    /// A component exporting `wasi:http/incoming-handler`: served at its own HTTP routes,
    /// the request passed through and the component's response streamed back.
    Http,
}

impl InvocationStyle {
    /// The name used in the API and in records.
    pub fn as_str(self) -> &'static str {
        match self {
            InvocationStyle::Export => "export",
            InvocationStyle::Wasi => "wasi",
            InvocationStyle::Http => "http",
        }
    }
}

/// Per-function limits, resolved against the server defaults at deploy time.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionLimits {
    /// Wall-clock deadline of one invocation.
    pub timeout_ms: u64,
    /// Largest linear memory an instance may have.
    pub memory_limit_bytes: u64,
    /// Fuel budget per invocation, when fuel metering is enabled.
    pub fuel: Option<u64>,
    /// Whether the function may load raw PTX (a capability; see `allow_raw_ptx`).
    #[serde(default)]
    pub raw_ptx: bool,
}

/// The durable description of a deployed function.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FunctionRecord {
    /// Encoding version ([`RECORD_FORMAT`]).
    pub format: u32,
    /// Opaque id, `fn-` followed by 24 lowercase hex digits.
    pub id: String,
    /// Owning tenant's id (empty for functions deployed without tenants).
    #[serde(default)]
    pub tenant: String,
    /// Human name given at deploy time.
    pub name: String,
    /// How the function is invoked.
    pub style: InvocationStyle,
    /// sha256 of the module binary, lowercase hex.
    pub module_sha256: String,
    /// Size of the module binary in bytes.
    pub module_size: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Resolved limits.
    pub limits: FunctionLimits,
    /// Snapshot every instance starts from (`None`: a fresh instance).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_from_snapshot: Option<String>,
    /// Whether the module is a WebAssembly component (a WASI 0.2 command) rather than a core
    /// module.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub component: bool,
}

/// The durable description of a snapshot; the bytes are stored beside it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    /// Opaque id, `snap-` followed by 24 lowercase hex digits.
    pub id: String,
    /// The function it belongs to.
    pub function_id: String,
    /// Owning tenant's id.
    pub tenant: String,
    /// sha256 of the module the memory belongs to.
    pub module_sha256: String,
    /// The export that ran before the capture.
    pub init_export: String,
    /// Capture time, milliseconds since the Unix epoch.
    pub created_at_ms: u64,
    /// Linear-memory size captured.
    pub memory_bytes: u64,
    /// Size of the portable encoding at rest.
    pub stored_bytes: u64,
    /// Mutable globals captured.
    pub globals: u32,
    /// Capture duration in microseconds (init excluded).
    pub capture_us: u64,
    /// Duration of the init export in microseconds.
    pub init_us: u64,
}

/// Durable storage of functions and their modules.
///
/// The embedded default is [`FsFunctionStore`]; a shared store for several
/// replicas is another implementation of this trait.
pub trait FunctionStore: Send + Sync + 'static {
    /// Stores an ONNX model's bytes (under their sha256) and then its record; durable when
    /// it returns. A store that several processes share refuses a tenant's name already
    /// taken with [`ModelRecord::name_taken`], atomically with the write; a store that one
    /// process owns may rely on that process's own check (the runtime's, under its lock).
    fn put_model(&self, record: &ModelRecord, bytes: &[u8]) -> Result<()>;
    /// [`FunctionStore::put_model`] refusing a model that would take its tenant past
    /// `bounds.max_stored_bytes` ([`RuntimeError::StorageQuotaExceeded`]), counted in the
    /// same transaction as the record's write. The default writes without counting, as
    /// [`FunctionStore::create_function`].
    fn create_model(&self, record: &ModelRecord, bytes: &[u8], bounds: &WriteBounds) -> Result<()> {
        let _ = bounds;
        self.put_model(record, bytes)
    }
    /// The bytes of the model with digest `sha256`, checked against it.
    fn model_bytes(&self, sha256: &str) -> Result<Vec<u8>>;
    /// Every model record.
    fn models(&self) -> Result<Vec<ModelRecord>>;
    /// The record of `tenant`'s model `name` (`None` if there is none). The default reads
    /// every record; stores that can look one up override it.
    fn model(&self, tenant: &str, name: &str) -> Result<Option<ModelRecord>> {
        Ok(self
            .models()?
            .into_iter()
            .find(|record| record.tenant == tenant && record.name == name))
    }
    /// Deletes the record of `tenant`'s model `name`; whether there was one. Its bytes go
    /// when no other record names them: at once in the local store, through the orphan
    /// collector in a shared one.
    fn delete_model(&self, tenant: &str, name: &str) -> Result<bool>;
    /// Stores module bytes under their sha256 and returns the hex digest.
    /// Durable when it returns.
    fn put_module(&self, bytes: &[u8]) -> Result<String>;
    /// Reads module bytes by digest and checks them against it.
    fn module(&self, sha256: &str) -> Result<Vec<u8>>;
    /// Writes a function record atomically; durable when it returns.
    fn put_function(&self, record: &FunctionRecord) -> Result<()>;
    /// Writes `new` in place of the stored record of function `old.id` if that record is still
    /// `old`; durable when it returns `Ok(true)`. `Ok(false)` when it changed since it was
    /// read (read it again and retry), [`RuntimeError::FunctionNotFound`] when it is gone: a
    /// change never re-creates a deleted function. The default compares and writes: right for
    /// a store that one process owns, whose writers hold the runtime's record lock.
    fn replace_function(&self, old: &FunctionRecord, new: &FunctionRecord) -> Result<bool> {
        match self.function(&old.id)? {
            None => Err(RuntimeError::FunctionNotFound(old.id.clone())),
            Some(current) if current == *old => {
                self.put_function(new)?;
                Ok(true)
            }
            Some(_) => Ok(false),
        }
    }
    /// Writes the record of a new function, refusing it when its tenant already has
    /// `bounds.max_functions` functions ([`RuntimeError::FunctionQuotaExceeded`]) or its
    /// module would take the tenant past `bounds.max_stored_bytes`
    /// ([`RuntimeError::StorageQuotaExceeded`]), counted in the same transaction as the write.
    /// The default writes without counting: a store used by one process relies on that
    /// process's own counts.
    fn create_function(&self, record: &FunctionRecord, bounds: &WriteBounds) -> Result<()> {
        let _ = bounds;
        self.put_function(record)
    }
    /// Whether a new function of `tenant` whose module takes `adding` bytes would pass
    /// `bounds` now, checked before the module is stored so that a deploy a quota refuses
    /// stores nothing. [`FunctionStore::create_function`] still counts, exactly, in its own
    /// transaction: this check only spares the upload of what would be refused anyway. The
    /// default admits: a store used by one process relies on that process's own counts.
    fn check_new_function(&self, tenant: &str, adding: u64, bounds: &WriteBounds) -> Result<()> {
        let _ = (tenant, adding, bounds);
        Ok(())
    }
    /// Deletes a function record; `false` if it did not exist.
    fn delete_function(&self, id: &str) -> Result<bool>;
    /// Every stored function record.
    fn functions(&self) -> Result<Vec<FunctionRecord>>;
    /// The stored record of function `id` (`None` if there is none). The default reads
    /// every record; stores that can look one up override it.
    fn function(&self, id: &str) -> Result<Option<FunctionRecord>> {
        Ok(self.functions()?.into_iter().find(|record| record.id == id))
    }
    /// Records the store holds but cannot read (kept aside with everything they might
    /// reference; see `tensor-wasm doctor --data-dir`).
    fn quarantined(&self) -> Result<Vec<QuarantinedRecord>> {
        Ok(Vec::new())
    }
    /// Stores a snapshot's bytes (the concatenation of `pieces`), then its record; durable
    /// when it returns.
    fn put_snapshot(&self, record: &SnapshotRecord, pieces: &[&[u8]]) -> Result<()>;
    /// [`FunctionStore::put_snapshot`] for a new snapshot, refusing it when its function
    /// already keeps `bounds.max_snapshots_per_function` snapshots
    /// ([`WriteBounds::too_many_snapshots`]) or it would take its tenant past
    /// `bounds.max_stored_bytes`, counted in the same transaction as the record's write (the
    /// bytes of a refused snapshot are removed again). The default writes without counting,
    /// as [`FunctionStore::create_function`].
    fn create_snapshot(
        &self,
        record: &SnapshotRecord,
        pieces: &[&[u8]],
        bounds: &WriteBounds,
    ) -> Result<()> {
        let _ = bounds;
        self.put_snapshot(record, pieces)
    }
    /// The bytes of a stored snapshot (`None` if it does not exist).
    fn snapshot_bytes(&self, function_id: &str, snapshot_id: &str) -> Result<Option<Vec<u8>>>;
    /// The snapshot records of a function, oldest first.
    fn snapshots(&self, function_id: &str) -> Result<Vec<SnapshotRecord>>;
    /// Deletes a snapshot; `false` if it did not exist.
    fn delete_snapshot(&self, function_id: &str, snapshot_id: &str) -> Result<bool>;
    /// Deletes every snapshot of a function (when the function is deleted).
    fn delete_snapshots(&self, function_id: &str) -> Result<()>;
}

/// Quotas a store that several processes share checks in the transaction that writes a new
/// record ([`FunctionStore::create_function`], [`FunctionStore::create_snapshot`],
/// [`FunctionStore::create_model`]), so that they hold exactly across the processes. `None`:
/// not checked there.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteBounds {
    /// Functions the tenant may have.
    pub max_functions: Option<u64>,
    /// Bytes of modules (each function's module), snapshots and models the tenant may keep.
    pub max_stored_bytes: Option<u64>,
    /// Snapshots one function may keep.
    pub max_snapshots_per_function: Option<u64>,
}

impl WriteBounds {
    /// The refusal of a snapshot of function `function_id`, which keeps `max` already.
    pub fn too_many_snapshots(function_id: &str, max: u64) -> RuntimeError {
        RuntimeError::Conflict(format!(
            "function {function_id} already has {max} snapshots, the most it may keep; delete \
             one first"
        ))
    }
}

/// sha256 of `bytes` as lowercase hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Whether `id` has the shape of a function id (and so is safe as a file name).
pub fn is_valid_function_id(id: &str) -> bool {
    id.len() == 27
        && id.starts_with("fn-")
        && id[3..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A fresh random function id.
pub fn new_function_id() -> String {
    format!("fn-{}", random_hex())
}

/// Whether `id` has the shape of a snapshot id (and so is safe as a file name).
pub fn is_valid_snapshot_id(id: &str) -> bool {
    id.len() == 29
        && id.starts_with("snap-")
        && id[5..]
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A fresh random snapshot id.
pub fn new_snapshot_id() -> String {
    format!("snap-{}", random_hex())
}

fn random_hex() -> String {
    let mut raw = [0u8; 12];
    getrandom::fill(&mut raw).expect("the OS random source is available");
    hex::encode(raw)
}

pub(crate) fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// The embedded store: plain files on the local data directory.
#[derive(Debug)]
pub struct FsFunctionStore {
    root: PathBuf,
}

impl FsFunctionStore {
    /// Opens (creating if needed) the store under `root`, empties the staging area,
    /// quarantines records it cannot read and removes modules and snapshots no function
    /// references (keeping what a quarantined record might reference).
    pub fn open(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        for dir in ["modules", "functions", "snapshots", "tmp"] {
            let path = root.join(dir);
            tensor_wasm_durable::create_dir_all(&path).map_err(storage_error)?;
        }
        let store = FsFunctionStore { root };
        store.clear_staging()?;
        quarantine::quarantine_unreadable(&store.root)?;
        let protected = Protected::of(&store.root)?;
        store.collect_unreferenced_modules(&protected)?;
        store.collect_orphan_snapshots(&protected)?;
        Ok(store)
    }

    /// The directory this store lives in.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn clear_staging(&self) -> Result<()> {
        let tmp = self.root.join("tmp");
        for entry in fs::read_dir(&tmp).map_err(|e| RuntimeError::storage(&tmp, e))? {
            let path = entry.map_err(|e| RuntimeError::storage(&tmp, e))?.path();
            fs::remove_file(&path).map_err(|e| RuntimeError::storage(&path, e))?;
        }
        Ok(())
    }

    fn collect_unreferenced_modules(&self, protected: &Protected) -> Result<()> {
        let referenced: HashSet<String> = self
            .functions()?
            .into_iter()
            .map(|r| r.module_sha256)
            .collect();
        let dir = self.root.join("modules");
        for entry in fs::read_dir(&dir).map_err(|e| RuntimeError::storage(&dir, e))? {
            let path = entry.map_err(|e| RuntimeError::storage(&dir, e))?.path();
            let Some(stem) = path.file_stem().and_then(|s| s.to_str()) else {
                continue;
            };
            if protected.keeps_module(stem) {
                tracing::warn!(
                    module = stem,
                    "keeping a module a quarantined record may use"
                );
                continue;
            }
            if !referenced.contains(stem) {
                tracing::info!(module = stem, "removing unreferenced module");
                fs::remove_file(&path).map_err(|e| RuntimeError::storage(&path, e))?;
            }
        }
        sync_dir(&dir)
    }

    /// Removes snapshot directories of deleted functions and snapshot bytes whose record
    /// was never written (a crash between the two writes).
    fn collect_orphan_snapshots(&self, protected: &Protected) -> Result<()> {
        let live: HashSet<String> = self.functions()?.into_iter().map(|r| r.id).collect();
        let dir = self.root.join("snapshots");
        for entry in fs::read_dir(&dir).map_err(|e| RuntimeError::storage(&dir, e))? {
            let path = entry.map_err(|e| RuntimeError::storage(&dir, e))?.path();
            let name = path
                .file_name()
                .and_then(|s| s.to_str())
                .unwrap_or_default();
            if !live.contains(name) && protected.keeps_function(name) {
                tracing::warn!(
                    function = name,
                    "keeping snapshots a quarantined record may use"
                );
                continue;
            }
            if !live.contains(name) {
                tracing::info!(function = name, "removing snapshots of a deleted function");
                fs::remove_dir_all(&path).map_err(|e| RuntimeError::storage(&path, e))?;
                continue;
            }
            for file in fs::read_dir(&path).map_err(|e| RuntimeError::storage(&path, e))? {
                let file = file.map_err(|e| RuntimeError::storage(&path, e))?.path();
                if file.extension().and_then(|e| e.to_str()) == Some("twsnap")
                    && !file.with_extension("json").exists()
                {
                    fs::remove_file(&file).map_err(|e| RuntimeError::storage(&file, e))?;
                }
            }
        }
        Ok(())
    }

    fn snapshot_dir(&self, function_id: &str) -> PathBuf {
        self.root.join("snapshots").join(function_id)
    }

    fn module_path(&self, sha256: &str) -> PathBuf {
        self.root.join("modules").join(format!("{sha256}.wasm"))
    }

    fn record_path(&self, id: &str) -> PathBuf {
        self.root.join("functions").join(format!("{id}.json"))
    }

    /// Writes `bytes` to `dest` atomically and durably, staged in `tmp/`.
    fn write_atomic(&self, dest: &Path, bytes: &[u8]) -> Result<()> {
        self.write_atomic_pieces(dest, &[bytes])
    }

    /// [`Self::write_atomic`] of the concatenation of `pieces`.
    fn write_atomic_pieces(&self, dest: &Path, pieces: &[&[u8]]) -> Result<()> {
        let options = WriteOptions::new().staging_dir(self.root.join("tmp"));
        write_file_pieces(dest, pieces, &options).map_err(storage_error)
    }
}

fn storage_error(e: DurableError) -> RuntimeError {
    let (path, source) = e.into_parts();
    RuntimeError::storage(path, source)
}

fn sync_dir(dir: &Path) -> Result<()> {
    tensor_wasm_durable::sync_dir(dir).map_err(storage_error)
}

impl FunctionStore for FsFunctionStore {
    fn put_model(&self, record: &ModelRecord, bytes: &[u8]) -> Result<()> {
        crate::model_store::put(&self.root, record, bytes)
    }

    fn model_bytes(&self, sha256: &str) -> Result<Vec<u8>> {
        crate::model_store::bytes(&self.root, sha256)
    }

    fn models(&self) -> Result<Vec<ModelRecord>> {
        crate::model_store::records(&self.root)
    }

    fn delete_model(&self, tenant: &str, name: &str) -> Result<bool> {
        crate::model_store::delete(&self.root, tenant, name)
    }

    fn put_module(&self, bytes: &[u8]) -> Result<String> {
        let sha = sha256_hex(bytes);
        let path = self.module_path(&sha);
        if !path.exists() {
            self.write_atomic(&path, bytes)?;
        }
        Ok(sha)
    }

    fn module(&self, sha256: &str) -> Result<Vec<u8>> {
        if !is_sha256_hex(sha256) {
            return Err(RuntimeError::CorruptRecord {
                path: self.root.join("modules"),
                message: format!("`{sha256}` is not a sha256 digest"),
            });
        }
        let path = self.module_path(sha256);
        let bytes = fs::read(&path).map_err(|e| RuntimeError::storage(&path, e))?;
        if sha256_hex(&bytes) != sha256 {
            return Err(RuntimeError::CorruptRecord {
                path,
                message: "module bytes do not match their digest".into(),
            });
        }
        Ok(bytes)
    }

    fn put_function(&self, record: &FunctionRecord) -> Result<()> {
        if !is_valid_function_id(&record.id) {
            return Err(RuntimeError::InvalidConfig(format!(
                "`{}` is not a function id",
                record.id
            )));
        }
        let json = serde_json::to_vec_pretty(record).expect("records serialize");
        self.write_atomic(&self.record_path(&record.id), &json)
    }

    fn delete_function(&self, id: &str) -> Result<bool> {
        if !is_valid_function_id(id) {
            return Ok(false);
        }
        let path = self.record_path(id);
        match fs::remove_file(&path) {
            Ok(()) => {
                sync_dir(&self.root.join("functions"))?;
                Ok(true)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(RuntimeError::storage(&path, e)),
        }
    }

    fn functions(&self) -> Result<Vec<FunctionRecord>> {
        let dir = self.root.join("functions");
        let mut records = Vec::new();
        for entry in fs::read_dir(&dir).map_err(|e| RuntimeError::storage(&dir, e))? {
            let path = entry.map_err(|e| RuntimeError::storage(&dir, e))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = fs::read(&path).map_err(|e| RuntimeError::storage(&path, e))?;
            // Open quarantined the unreadable records; one damaged since is skipped here
            // and quarantined at the next open.
            match quarantine::decode_record(&bytes) {
                Ok(record) => records.push(record),
                Err(reason) => tracing::error!(
                    path = %path.display(),
                    reason = %reason,
                    "skipping a function record this build cannot read"
                ),
            }
        }
        records.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(records)
    }

    fn quarantined(&self) -> Result<Vec<QuarantinedRecord>> {
        quarantine::inspect(&self.root)
    }

    fn put_snapshot(&self, record: &SnapshotRecord, pieces: &[&[u8]]) -> Result<()> {
        if !is_valid_function_id(&record.function_id) || !is_valid_snapshot_id(&record.id) {
            return Err(RuntimeError::InvalidConfig(format!(
                "`{}/{}` is not a snapshot id",
                record.function_id, record.id
            )));
        }
        let dir = self.snapshot_dir(&record.function_id);
        // Durable before the snapshot record (and the function record naming it) exists.
        tensor_wasm_durable::create_dir_all(&dir).map_err(storage_error)?;
        self.write_atomic_pieces(&dir.join(format!("{}.twsnap", record.id)), pieces)?;
        let json = serde_json::to_vec_pretty(record).expect("records serialize");
        self.write_atomic(&dir.join(format!("{}.json", record.id)), &json)
    }

    fn snapshot_bytes(&self, function_id: &str, snapshot_id: &str) -> Result<Option<Vec<u8>>> {
        if !is_valid_function_id(function_id) || !is_valid_snapshot_id(snapshot_id) {
            return Ok(None);
        }
        let dir = self.snapshot_dir(function_id);
        if !dir.join(format!("{snapshot_id}.json")).exists() {
            return Ok(None);
        }
        let path = dir.join(format!("{snapshot_id}.twsnap"));
        match fs::read(&path) {
            Ok(bytes) => Ok(Some(bytes)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(RuntimeError::storage(&path, e)),
        }
    }

    fn snapshots(&self, function_id: &str) -> Result<Vec<SnapshotRecord>> {
        if !is_valid_function_id(function_id) {
            return Ok(Vec::new());
        }
        let dir = self.snapshot_dir(function_id);
        let entries = match fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(RuntimeError::storage(&dir, e)),
        };
        let mut records = Vec::new();
        for entry in entries {
            let path = entry.map_err(|e| RuntimeError::storage(&dir, e))?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = fs::read(&path).map_err(|e| RuntimeError::storage(&path, e))?;
            match serde_json::from_slice::<SnapshotRecord>(&bytes) {
                Ok(record) => records.push(record),
                Err(e) => tracing::error!(
                    path = %path.display(),
                    error = %e,
                    "skipping unreadable snapshot record"
                ),
            }
        }
        records.sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
        Ok(records)
    }

    fn delete_snapshot(&self, function_id: &str, snapshot_id: &str) -> Result<bool> {
        if !is_valid_function_id(function_id) || !is_valid_snapshot_id(snapshot_id) {
            return Ok(false);
        }
        let dir = self.snapshot_dir(function_id);
        let record = dir.join(format!("{snapshot_id}.json"));
        match fs::remove_file(&record) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
            Err(e) => return Err(RuntimeError::storage(&record, e)),
        }
        let bytes = dir.join(format!("{snapshot_id}.twsnap"));
        match fs::remove_file(&bytes) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(RuntimeError::storage(&bytes, e)),
        }
        sync_dir(&dir)?;
        Ok(true)
    }

    fn delete_snapshots(&self, function_id: &str) -> Result<()> {
        if !is_valid_function_id(function_id) {
            return Ok(());
        }
        let dir = self.snapshot_dir(function_id);
        match fs::remove_dir_all(&dir) {
            Ok(()) => sync_dir(&self.root.join("snapshots")),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(RuntimeError::storage(&dir, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str, sha: &str) -> FunctionRecord {
        FunctionRecord {
            format: RECORD_FORMAT,
            id: id.into(),
            tenant: "tn-0123456789abcdef".into(),
            name: "f".into(),
            style: InvocationStyle::Export,
            module_sha256: sha.into(),
            module_size: 8,
            created_at_ms: 1,
            limits: FunctionLimits {
                timeout_ms: 1000,
                memory_limit_bytes: 1 << 20,
                fuel: None,
                raw_ptx: false,
            },
            start_from_snapshot: None,
            component: false,
        }
    }

    #[test]
    fn records_and_modules_round_trip_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsFunctionStore::open(dir.path()).unwrap();
        let sha = store.put_module(b"\0asm\x01\0\0\0").unwrap();
        let id = new_function_id();
        store.put_function(&record(&id, &sha)).unwrap();
        drop(store);

        let store = FsFunctionStore::open(dir.path()).unwrap();
        let records = store.functions().unwrap();
        assert_eq!(records, vec![record(&id, &sha)]);
        assert_eq!(store.module(&sha).unwrap(), b"\0asm\x01\0\0\0");
        assert!(store.delete_function(&id).unwrap());
        assert!(!store.delete_function(&id).unwrap());
        assert!(store.functions().unwrap().is_empty());
    }

    #[test]
    fn open_collects_unreferenced_modules_and_staging_leftovers() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsFunctionStore::open(dir.path()).unwrap();
        let orphan = store.put_module(b"orphan").unwrap();
        let kept = store.put_module(b"kept").unwrap();
        store
            .put_function(&record(&new_function_id(), &kept))
            .unwrap();
        fs::write(dir.path().join("tmp/123-0.partial"), b"half").unwrap();
        drop(store);

        let store = FsFunctionStore::open(dir.path()).unwrap();
        assert!(store.module(&kept).is_ok());
        assert!(matches!(
            store.module(&orphan),
            Err(RuntimeError::Storage { .. })
        ));
        assert_eq!(fs::read_dir(dir.path().join("tmp")).unwrap().count(), 0);
    }

    #[test]
    fn corrupt_module_bytes_are_detected() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsFunctionStore::open(dir.path()).unwrap();
        let sha = store.put_module(b"original").unwrap();
        fs::write(store.module_path(&sha), b"tampered").unwrap();
        assert!(matches!(
            store.module(&sha),
            Err(RuntimeError::CorruptRecord { .. })
        ));
    }

    #[test]
    fn unreadable_records_are_skipped_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsFunctionStore::open(dir.path()).unwrap();
        fs::write(dir.path().join("functions/fn-garbage.json"), b"{not json").unwrap();
        assert!(store.functions().unwrap().is_empty());
    }

    #[test]
    fn open_quarantines_an_unknown_format_and_keeps_its_module_and_snapshots() {
        let dir = tempfile::tempdir().unwrap();
        let store = FsFunctionStore::open(dir.path()).unwrap();
        let sha = store.put_module(b"newer").unwrap();
        let orphan = store.put_module(b"orphan").unwrap();
        let id = new_function_id();
        store.put_function(&record(&id, &sha)).unwrap();
        let snap = dir.path().join("snapshots").join(&id);
        fs::create_dir_all(&snap).unwrap();
        fs::write(snap.join("snap-x.json"), b"{}").unwrap();
        drop(store);
        let path = dir.path().join(format!("functions/{id}.json"));
        let text = fs::read_to_string(&path).unwrap();
        fs::write(&path, text.replace("\"format\": 1", "\"format\": 2")).unwrap();

        let store = FsFunctionStore::open(dir.path()).unwrap();
        assert!(store.functions().unwrap().is_empty());
        assert!(
            store.module(&sha).is_ok(),
            "the quarantined record's module is kept"
        );
        assert!(
            store.module(&orphan).is_err(),
            "other orphans are still collected"
        );
        assert!(snap.join("snap-x.json").exists());
        let quarantined = store.quarantined().unwrap();
        assert_eq!(quarantined.len(), 1);
        assert!(quarantined[0].reason.contains("format 2"));
        assert!(quarantined[0]
            .path
            .starts_with(dir.path().join(crate::QUARANTINE_DIR)));
        // A second open finds it in quarantine and still keeps the module.
        drop(store);
        let store = FsFunctionStore::open(dir.path()).unwrap();
        assert!(store.module(&sha).is_ok());
        assert_eq!(store.quarantined().unwrap().len(), 1);
    }

    #[test]
    fn ids_are_validated() {
        let id = new_function_id();
        assert!(is_valid_function_id(&id));
        assert!(!is_valid_function_id("../../etc/passwd"));
        assert!(!is_valid_function_id("fn-XYZ"));
        assert!(!is_valid_function_id(&format!("{id}0")));
    }
}
