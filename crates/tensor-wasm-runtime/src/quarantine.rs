//! Quarantine of function records the store cannot read (corrupted, or of a newer format
//! after a downgrade): moved aside, never deleted, and every file they might reference kept.
//!
//! A record this build cannot read may still be the only description of a function a
//! newer build wrote. Deleting its module and snapshots as "unreferenced" would make a
//! later upgrade (or a repair by hand) impossible, so when the store opens:
//!
//! 1. each unreadable record in `functions/` is moved to `quarantine/functions/` (a later
//!    start finds it there again; an operator repairs it and moves it back);
//! 2. the startup sweep of unreferenced modules and snapshot directories keeps everything
//!    a quarantined record might reference: every sha256 and function id found in its
//!    bytes, or, when none can be found, every module or snapshot directory;
//! 3. the records are logged at error level, counted by the `tensor_wasm_quarantined_records`
//!    gauge, and listed by `tensor-wasm doctor --data-dir`.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

use crate::error::{Result, RuntimeError};
use crate::store::{is_valid_function_id, FunctionRecord, RECORD_FORMAT};

/// Where quarantined function records live, relative to the data directory.
pub const QUARANTINE_DIR: &str = "quarantine/functions";

/// A function record the store cannot read, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuarantinedRecord {
    /// Where the record is now.
    pub path: PathBuf,
    /// Why it cannot be read.
    pub reason: String,
}

/// Decodes a function record, or says why it cannot be used by this build.
pub(crate) fn decode_record(bytes: &[u8]) -> std::result::Result<FunctionRecord, String> {
    // The format is looked at first: a newer format may not decode as this build's record.
    if let Ok(value) = serde_json::from_slice::<serde_json::Value>(bytes) {
        let format = value.get("format").and_then(serde_json::Value::as_u64);
        if format != Some(u64::from(RECORD_FORMAT)) {
            return Err(match format {
                Some(f) => format!("unknown record format {f} (this build reads {RECORD_FORMAT})"),
                None => "no record format".to_owned(),
            });
        }
    }
    serde_json::from_slice(bytes).map_err(|e| format!("unreadable: {e}"))
}

/// Moves every unreadable record of `root/functions/` into the quarantine.
/// Returns the records moved now.
pub(crate) fn quarantine_unreadable(root: &Path) -> Result<Vec<QuarantinedRecord>> {
    let functions = root.join("functions");
    let mut moved = Vec::new();
    for entry in fs::read_dir(&functions).map_err(|e| RuntimeError::storage(&functions, e))? {
        let path = entry
            .map_err(|e| RuntimeError::storage(&functions, e))?
            .path();
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let bytes = fs::read(&path).map_err(|e| RuntimeError::storage(&path, e))?;
        let Err(reason) = decode_record(&bytes) else {
            continue;
        };
        let dir = root.join(QUARANTINE_DIR);
        tensor_wasm_durable::create_dir_all(&dir).map_err(storage_error)?;
        let dest = free_name(&dir, path.file_name().expect("read_dir gives file names"));
        fs::rename(&path, &dest).map_err(|e| RuntimeError::storage(&dest, e))?;
        tensor_wasm_durable::sync_dir(&dir).map_err(storage_error)?;
        tensor_wasm_durable::sync_dir(&functions).map_err(storage_error)?;
        tracing::error!(
            record = %path.display(),
            quarantined_to = %dest.display(),
            reason = %reason,
            "QUARANTINED a function record this build cannot read; its module and snapshots \
             are kept (see `tensor-wasm doctor --data-dir`)"
        );
        moved.push(QuarantinedRecord { path: dest, reason });
    }
    Ok(moved)
}

/// A name in `dir` no file has: `name`, else `name.<n>` for the first free `n`.
fn free_name(dir: &Path, name: &std::ffi::OsStr) -> PathBuf {
    let first = dir.join(name);
    if !first.exists() {
        return first;
    }
    (1u32..)
        .map(|n| dir.join(format!("{}.{n}", name.to_string_lossy())))
        .find(|p| !p.exists())
        .expect("some suffix is free")
}

/// The quarantined records under `root` (the data directory), and the records of
/// `functions/` that would be quarantined at the next start. Reads only.
///
/// # Errors
/// A directory or record that cannot be read.
pub fn inspect(root: &Path) -> Result<Vec<QuarantinedRecord>> {
    let mut found = Vec::new();
    for path in files_in(&root.join(QUARANTINE_DIR))? {
        let bytes = fs::read(&path).map_err(|e| RuntimeError::storage(&path, e))?;
        let reason = decode_record(&bytes).err().unwrap_or_else(|| {
            "readable now: move it back to functions/ and restart to restore it".to_owned()
        });
        found.push(QuarantinedRecord { path, reason });
    }
    for path in files_in(&root.join("functions"))? {
        if path.extension().and_then(|e| e.to_str()) != Some("json") {
            continue;
        }
        let bytes = fs::read(&path).map_err(|e| RuntimeError::storage(&path, e))?;
        if let Err(reason) = decode_record(&bytes) {
            let reason = format!("{reason} (quarantined at the next start)");
            found.push(QuarantinedRecord { path, reason });
        }
    }
    Ok(found)
}

/// Files directly in `dir`, sorted; none when it does not exist.
fn files_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(RuntimeError::storage(dir, e)),
    };
    let mut files = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|e| RuntimeError::storage(dir, e))?;
        if entry.file_type().is_ok_and(|t| t.is_file()) {
            files.push(entry.path());
        }
    }
    files.sort();
    Ok(files)
}

/// What the quarantined records might reference; the startup sweep keeps all of it.
#[derive(Debug, Default)]
pub(crate) struct Protected {
    /// Module digests named by a quarantined record.
    modules: HashSet<String>,
    /// Function ids named by a quarantined record (snapshot directories).
    functions: HashSet<String>,
    /// A record names no module digest: every module is kept.
    all_modules: bool,
    /// A record names no function id: every snapshot directory is kept.
    all_functions: bool,
}

impl Protected {
    /// Reads every record in the quarantine of `root`.
    pub(crate) fn of(root: &Path) -> Result<Self> {
        let mut protected = Protected::default();
        for path in files_in(&root.join(QUARANTINE_DIR))? {
            let bytes = fs::read(&path).map_err(|e| RuntimeError::storage(&path, e))?;
            protected.add(&path, &bytes);
        }
        Ok(protected)
    }

    /// Adds what the record at `path` with `bytes` might reference: every 64-hex-digit
    /// token (a module digest) and every function id in its text or its file name. Any
    /// field name or nesting a newer format uses still carries these tokens.
    fn add(&mut self, path: &Path, bytes: &[u8]) {
        let text = String::from_utf8_lossy(bytes);
        let name = path
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        let mut modules = 0;
        let mut functions = 0;
        let tokens = text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '-'));
        for token in tokens.chain(name.split('.')) {
            if token.len() == 64 && token.bytes().all(|b| b.is_ascii_hexdigit()) {
                self.modules.insert(token.to_ascii_lowercase());
                modules += 1;
            } else if is_valid_function_id(token) {
                self.functions.insert(token.to_owned());
                functions += 1;
            }
        }
        self.all_modules |= modules == 0;
        self.all_functions |= functions == 0;
    }

    /// Whether the module with digest `sha256` must be kept.
    pub(crate) fn keeps_module(&self, sha256: &str) -> bool {
        self.all_modules || self.modules.contains(sha256)
    }

    /// Whether the snapshots of function `id` must be kept.
    pub(crate) fn keeps_function(&self, id: &str) -> bool {
        self.all_functions || self.functions.contains(id)
    }
}

fn storage_error(e: tensor_wasm_durable::DurableError) -> RuntimeError {
    let (path, source) = e.into_parts();
    RuntimeError::storage(path, source)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_newer_format_and_garbage_are_refused_with_reasons() {
        let newer = br#"{"format": 2, "id": "fn-000000000000000000000001"}"#;
        assert!(decode_record(newer)
            .unwrap_err()
            .contains("unknown record format 2"));
        assert!(decode_record(b"{not json")
            .unwrap_err()
            .contains("unreadable"));
    }

    #[test]
    fn referenced_digests_and_ids_are_protected_and_unknowable_ones_protect_everything() {
        let sha = "ab".repeat(32);
        let mut p = Protected::default();
        let record = format!(r#"{{"format": 2, "module": {{"sha256": "{sha}"}}}}"#);
        p.add(
            Path::new("fn-0123456789abcdef01234567.json"),
            record.as_bytes(),
        );
        assert!(p.keeps_module(&sha));
        assert!(!p.keeps_module(&"cd".repeat(32)));
        assert!(p.keeps_function("fn-0123456789abcdef01234567"));
        assert!(!p.keeps_function("fn-000000000000000000000000"));

        p.add(Path::new("notes.json"), b"{trunc");
        assert!(p.keeps_module(&"cd".repeat(32)));
        assert!(p.keeps_function("fn-000000000000000000000000"));
    }
}
