//! `DurableFile`: a file written under a unique temporary name and moved over its
//! destination by [`DurableFile::commit`] once it is on disk.

use std::ffi::OsStr;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::{sync_dir, DurableError, Step, WriteOptions};

/// Suffix of every temporary file this crate creates.
const TEMP_SUFFIX: &str = ".partial";

/// How many names are tried before giving up when temporary names are taken (by files
/// a crashed process with the same id left behind, or by another pid namespace).
const CREATE_ATTEMPTS: u32 = 64;

/// Numbers the temporary files of this process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A file being written durably: writes go to a temporary file, and
/// [`commit`](DurableFile::commit) makes it the destination, all or nothing.
///
/// Write with [`std::io::Write`], or through [`file`](DurableFile::file) for what needs the
/// [`File`] itself (positioned writes, `set_len` for sparse files). Dropping it without a
/// successful commit removes the temporary file and leaves the destination as it was.
#[derive(Debug)]
pub struct DurableFile {
    file: File,
    temp: PathBuf,
    dest: PathBuf,
    /// Set once the temporary file no longer exists under its name (renamed).
    renamed: bool,
}

impl DurableFile {
    /// Creates a temporary file for `dest`: in the staging directory of `options`, or
    /// beside `dest` when there is none. The directories must exist.
    ///
    /// # Errors
    /// [`Step::CreateTemp`] when `dest` has no file name or the file cannot be created.
    pub fn create(dest: impl Into<PathBuf>, options: &WriteOptions) -> Result<Self, DurableError> {
        let dest = dest.into();
        let Some(name) = dest.file_name() else {
            let e = io::Error::new(io::ErrorKind::InvalidInput, "destination has no file name");
            return Err(DurableError::new(Step::CreateTemp, dest, e));
        };
        let dir = match options.staging_dir.as_deref() {
            Some(dir) => dir,
            None => parent_dir(&dest),
        };
        let mut open = OpenOptions::new();
        open.write(true).create_new(true);
        #[cfg(unix)]
        if let Some(mode) = options.mode {
            use std::os::unix::fs::OpenOptionsExt;
            open.mode(mode);
        }
        let mut attempt = 0;
        loop {
            let temp = dir.join(temp_name(name));
            match open.open(&temp) {
                Ok(file) => {
                    return Ok(DurableFile {
                        file,
                        temp,
                        dest,
                        renamed: false,
                    })
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists && attempt < CREATE_ATTEMPTS => {
                    attempt += 1;
                }
                Err(e) => return Err(DurableError::new(Step::CreateTemp, temp, e)),
            }
        }
    }

    /// The open temporary file, for positioned writes and `set_len`.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Where the bytes go until the commit.
    pub fn temp_path(&self) -> &Path {
        &self.temp
    }

    /// Where the file will be after the commit.
    pub fn destination(&self) -> &Path {
        &self.dest
    }

    /// Makes the written bytes the destination: `fsync` of the file, rename over the
    /// destination, `fsync` of the destination's directory. After a crash the destination
    /// holds either its old content or all of the new.
    ///
    /// # Errors
    /// [`Step::SyncFile`] or [`Step::Rename`]: the temporary file is removed and the
    /// destination is untouched. [`Step::SyncDir`]: the new file is in place but the rename
    /// may not survive a crash.
    pub fn commit(mut self) -> Result<(), DurableError> {
        self.file
            .sync_all()
            .map_err(|e| DurableError::new(Step::SyncFile, &self.temp, e))?;
        fs::rename(&self.temp, &self.dest)
            .map_err(|e| DurableError::new(Step::Rename, &self.dest, e))?;
        self.renamed = true;
        sync_dir(parent_dir(&self.dest))
    }
}

impl Write for DurableFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.file.write(buf)
    }

    fn write_vectored(&mut self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        self.file.write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Drop for DurableFile {
    fn drop(&mut self) {
        if !self.renamed {
            // Best effort: a leftover is removed by `remove_temp_files` or the store's open.
            let _ = fs::remove_file(&self.temp);
        }
    }
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    }
}

/// `.<name>.<pid>-<n>.partial`: unique among the live processes on this host, hidden,
/// and recognisable by [`is_temp_name`].
fn temp_name(name: &OsStr) -> String {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!(
        ".{}.{}-{n}{TEMP_SUFFIX}",
        name.to_string_lossy(),
        std::process::id()
    )
}

/// Whether `name` has the shape [`temp_name`] gives.
pub(crate) fn is_temp_name(name: &OsStr) -> bool {
    let Some(name) = name.to_str() else {
        return false;
    };
    let Some(inner) = name
        .strip_prefix('.')
        .and_then(|n| n.strip_suffix(TEMP_SUFFIX))
    else {
        return false;
    };
    let Some((original, unique)) = inner.rsplit_once('.') else {
        return false;
    };
    let Some((pid, n)) = unique.split_once('-') else {
        return false;
    };
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    !original.is_empty() && digits(pid) && digits(n)
}
