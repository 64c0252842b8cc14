//! Models tenants upload for `wasi-nn`'s `load-by-name`, in the local store: under
//! `nn-models/`, each model's bytes as `<sha256>.onnx` (content-addressed: two records with
//! the same bytes share one file) and each record as `<key>.json`, where the key is the
//! SHA-256 of the tenant id and the name (names are free text). Bytes are written before the
//! record, both durably, so a record never names missing bytes; bytes no record names are
//! removed by the delete that drops the last record, or by the next open.

use std::fs;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use tensor_wasm_durable::{write_file, WriteOptions};

use crate::error::{Result, RuntimeError};
use crate::store::{is_sha256_hex, sha256_hex};

/// The directory under the data directory.
pub(crate) const DIR: &str = "nn-models";

/// A model a tenant stored, loaded by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelRecord {
    /// The tenant that owns it.
    pub tenant: String,
    /// Its name, unique per tenant (what guests pass to `load-by-name`).
    pub name: String,
    /// The SHA-256 of its bytes (hex).
    pub sha256: String,
    /// Its size in bytes.
    pub bytes: u64,
    /// When it was stored (milliseconds since the Unix epoch).
    pub created_unix_ms: u64,
}

impl ModelRecord {
    /// The refusal of storing a model named `name` when its tenant has a model of that name
    /// already (the runtime's check, and a shared store's in its write).
    pub fn name_taken(name: &str) -> RuntimeError {
        RuntimeError::Conflict(format!("a model named `{name}` exists; delete it first"))
    }
}

fn key(tenant: &str, name: &str) -> String {
    let mut hasher = Sha256::new();
    hasher.update((tenant.len() as u64).to_le_bytes());
    hasher.update(tenant.as_bytes());
    hasher.update(name.as_bytes());
    hex::encode(hasher.finalize())
}

fn dir(root: &Path) -> Result<PathBuf> {
    let dir = root.join(DIR);
    tensor_wasm_durable::create_dir_all(&dir).map_err(|e| {
        let (path, source) = e.into_parts();
        RuntimeError::storage(path, source)
    })?;
    Ok(dir)
}

fn write(root: &Path, dest: &Path, bytes: &[u8]) -> Result<()> {
    let options = WriteOptions::new().staging_dir(root.join("tmp"));
    write_file(dest, bytes, &options).map_err(|e| {
        let (path, source) = e.into_parts();
        RuntimeError::storage(path, source)
    })
}

/// Stores `bytes`, then `record`.
pub(crate) fn put(root: &Path, record: &ModelRecord, bytes: &[u8]) -> Result<()> {
    let dir = dir(root)?;
    if sha256_hex(bytes) != record.sha256 {
        return Err(RuntimeError::InvalidConfig(
            "the model record's digest is not its bytes'".into(),
        ));
    }
    let blob = dir.join(format!("{}.onnx", record.sha256));
    if !blob.exists() {
        write(root, &blob, bytes)?;
    }
    let json = serde_json::to_vec_pretty(record).expect("records serialize");
    write(
        root,
        &dir.join(format!("{}.json", key(&record.tenant, &record.name))),
        &json,
    )
}

/// The bytes with digest `sha256`, checked.
pub(crate) fn bytes(root: &Path, sha256: &str) -> Result<Vec<u8>> {
    let dir = root.join(DIR);
    if !is_sha256_hex(sha256) {
        return Err(RuntimeError::CorruptRecord {
            path: dir,
            message: format!("`{sha256}` is not a sha256 digest"),
        });
    }
    let path = dir.join(format!("{sha256}.onnx"));
    let bytes = fs::read(&path).map_err(|e| RuntimeError::storage(&path, e))?;
    if sha256_hex(&bytes) != sha256 {
        return Err(RuntimeError::CorruptRecord {
            path,
            message: "model bytes do not match their digest".into(),
        });
    }
    Ok(bytes)
}

/// Every readable record (an unreadable one is logged and skipped); removes bytes no record
/// names.
pub(crate) fn records(root: &Path) -> Result<Vec<ModelRecord>> {
    let dir = dir(root)?;
    let mut records = Vec::new();
    let mut blobs = Vec::new();
    for entry in fs::read_dir(&dir).map_err(|e| RuntimeError::storage(&dir, e))? {
        let path = entry.map_err(|e| RuntimeError::storage(&dir, e))?.path();
        match path.extension().and_then(|e| e.to_str()) {
            Some("json") => match fs::read(&path)
                .ok()
                .and_then(|b| serde_json::from_slice::<ModelRecord>(&b).ok())
            {
                Some(record) => records.push(record),
                None => tracing::error!(path = %path.display(), "unreadable model record skipped"),
            },
            Some("onnx") => blobs.push(path),
            _ => {}
        }
    }
    for blob in blobs {
        let named = blob
            .file_stem()
            .and_then(|s| s.to_str())
            .is_some_and(|sha| records.iter().any(|r| r.sha256 == sha));
        if !named {
            fs::remove_file(&blob).map_err(|e| RuntimeError::storage(&blob, e))?;
        }
    }
    records.sort_by(|a, b| (&a.tenant, &a.name).cmp(&(&b.tenant, &b.name)));
    Ok(records)
}

/// Deletes the record of `tenant`'s `name`, and its bytes when no other record names them.
pub(crate) fn delete(root: &Path, tenant: &str, name: &str) -> Result<bool> {
    let dir = dir(root)?;
    let path = dir.join(format!("{}.json", key(tenant, name)));
    if !path.exists() {
        return Ok(false);
    }
    fs::remove_file(&path).map_err(|e| RuntimeError::storage(&path, e))?;
    tensor_wasm_durable::sync_dir(&dir).map_err(|e| {
        let (path, source) = e.into_parts();
        RuntimeError::storage(path, source)
    })?;
    // The bytes go with the last record naming them (records() removes them otherwise).
    records(root)?;
    Ok(true)
}
