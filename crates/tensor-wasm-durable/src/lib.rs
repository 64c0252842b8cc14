//! Crash-safe file writes: the one way TensorWasm writes a file it will rely on later.
//!
//! Every write here goes the same way:
//!
//! 1. create a temporary file with a unique name (`.<name>.<pid>-<n>.partial`), beside the
//!    destination or in a staging directory on the same file system;
//! 2. write the bytes;
//! 3. `fsync` the temporary file;
//! 4. rename it over the destination (atomic on POSIX file systems);
//! 5. `fsync` the destination's directory, so that the rename itself survives a crash.
//!
//! After a crash a reader finds the destination either absent, with its old content, or
//! with all of the new content; never a prefix. A failed write removes its temporary file.
//! Concurrent writers of one destination each use their own temporary file, so the last
//! rename wins and the destination is always one writer's complete file.
//!
//! A crash can still leave temporary files behind. Stores with a staging directory empty
//! it when they open; stores that write beside their files call [`remove_temp_files`].
//!
//! - [`write_file`] writes a byte slice, [`write_file_pieces`] the concatenation of several.
//! - [`DurableFile`] streams: write through [`std::io::Write`] or the [`std::fs::File`]
//!   (positioned writes, sparse files), then [`DurableFile::commit`].
//! - [`sync_dir`] makes a removal or rename in a directory durable.
//! - [`create_dir_all`] creates a directory and its missing parents durably, so that a
//!   record written afterwards never refers to a directory a crash can take back.
//!
//! # Example
//!
//! ```
//! use std::io::Write;
//! use tensor_wasm_durable::{write_file, DurableFile, WriteOptions};
//!
//! let dir = tempfile::tempdir()?;
//! let record = dir.path().join("record.json");
//! write_file(&record, br#"{"id": 1}"#, &WriteOptions::new())?;
//! assert_eq!(std::fs::read(&record)?, br#"{"id": 1}"#);
//!
//! // Streaming, with a private file mode (Unix); nothing is visible before `commit`.
//! let image = dir.path().join("image.bin");
//! let mut file = DurableFile::create(&image, &WriteOptions::new().mode(0o600))?;
//! file.write_all(b"header")?;
//! assert!(!image.exists());
//! file.commit()?;
//! assert_eq!(std::fs::read(&image)?, b"header");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

mod error;
mod file;

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};

pub use error::{DurableError, Step};
pub use file::DurableFile;

/// How a durable write creates its temporary file.
#[derive(Debug, Clone, Default)]
pub struct WriteOptions {
    staging_dir: Option<PathBuf>,
    mode: Option<u32>,
}

impl WriteOptions {
    /// Temporary file beside the destination, default permissions.
    pub fn new() -> Self {
        WriteOptions::default()
    }

    /// Creates the temporary file in `dir` instead of beside the destination. `dir` must
    /// be on the destination's file system (a rename cannot cross file systems).
    #[must_use]
    pub fn staging_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.staging_dir = Some(dir.into());
        self
    }

    /// Unix permission bits of the new file (before the umask), e.g. `0o600` for files
    /// only the service may read. Ignored on other platforms.
    #[must_use]
    pub fn mode(mut self, mode: u32) -> Self {
        self.mode = Some(mode);
        self
    }
}

/// Writes `bytes` to `dest` durably and atomically (see the [crate] documentation),
/// replacing any existing file.
///
/// # Errors
/// The failed [`Step`] with its path; the destination is then untouched (unless the step is
/// [`Step::SyncDir`]) and no temporary file is left.
pub fn write_file(
    dest: impl AsRef<Path>,
    bytes: &[u8],
    options: &WriteOptions,
) -> Result<(), DurableError> {
    write_file_pieces(dest, &[bytes], options)
}

/// [`write_file`] of the concatenation of `pieces`, without concatenating them in memory.
///
/// # Errors
/// As [`write_file`].
pub fn write_file_pieces(
    dest: impl AsRef<Path>,
    pieces: &[&[u8]],
    options: &WriteOptions,
) -> Result<(), DurableError> {
    let mut file = DurableFile::create(dest.as_ref(), options)?;
    for piece in pieces {
        if let Err(e) = file.write_all(piece) {
            return Err(DurableError::new(Step::Write, file.temp_path(), e));
        }
    }
    file.commit()
}

/// `fsync` of a directory: makes the creations, renames and removals in it durable.
/// A no-op on platforms that cannot open a directory as a file.
///
/// # Errors
/// [`Step::SyncDir`] with the directory.
pub fn sync_dir(dir: impl AsRef<Path>) -> Result<(), DurableError> {
    let dir = dir.as_ref();
    if cfg!(unix) {
        File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(|e| DurableError::new(Step::SyncDir, dir, e))?;
    }
    Ok(())
}

/// Creates `dir` and its missing parents, then `fsync`s every directory it created and the
/// parent of the topmost one: after it returns, the new directories survive a crash.
/// Does nothing (no `fsync`) when `dir` already exists.
///
/// # Errors
/// [`Step::CreateDir`] with the directory that could not be created, or
/// [`Step::SyncDir`] with the directory that could not be synced.
pub fn create_dir_all(dir: impl AsRef<Path>) -> Result<(), DurableError> {
    let dir = dir.as_ref();
    if dir.is_dir() {
        return Ok(());
    }
    // The missing directories, deepest first.
    let mut missing = Vec::new();
    let mut cursor = Some(dir);
    while let Some(d) = cursor {
        if d.as_os_str().is_empty() || d.is_dir() {
            break;
        }
        missing.push(d);
        cursor = d.parent();
    }
    if missing.is_empty() {
        // Another writer created the whole chain between the first check and the walk: its
        // syncs may still be to come, so `dir` is synced here as if this call created it.
        missing.push(dir);
    }
    for d in missing.iter().rev() {
        match fs::create_dir(d) {
            Ok(()) => {}
            // Another writer created it meanwhile: it still needs the syncs below.
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && d.is_dir() => {}
            Err(e) => return Err(DurableError::new(Step::CreateDir, *d, e)),
        }
    }
    for d in &missing {
        sync_dir(d)?;
    }
    let top = missing.last().expect("dir did not exist");
    match top.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => sync_dir(parent),
        _ => sync_dir("."),
    }
}

/// Removes the temporary files this crate's writers left in `dir` (after a crash), and
/// nothing else. Returns how many were removed.
///
/// Call it when no writer can be active in `dir` (when a store opens): the temporary file
/// of a write in progress would be removed too, and that write would fail.
///
/// # Errors
/// [`Step::Cleanup`] with the directory or the file that could not be removed.
pub fn remove_temp_files(dir: impl AsRef<Path>) -> Result<usize, DurableError> {
    let dir = dir.as_ref();
    let cleanup = |path: &Path, e| DurableError::new(Step::Cleanup, path, e);
    let mut removed = 0;
    for entry in fs::read_dir(dir).map_err(|e| cleanup(dir, e))? {
        let entry = entry.map_err(|e| cleanup(dir, e))?;
        if !file::is_temp_name(&entry.file_name()) {
            continue;
        }
        let path = entry.path();
        match fs::remove_file(&path) {
            Ok(()) => removed += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(cleanup(&path, e)),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests;
