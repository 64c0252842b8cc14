//! `DurableError`: which step of a durable write failed, on which path, and why.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

/// The step of a durable write that failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Creating the temporary file (the path is the temporary file).
    CreateTemp,
    /// Writing the bytes (the path is the temporary file).
    Write,
    /// `fsync` of the temporary file (the path is the temporary file).
    SyncFile,
    /// Renaming the temporary file over the destination (the path is the destination).
    Rename,
    /// `fsync` of a directory (the path is the directory).
    SyncDir,
    /// Creating a directory (the path is the directory).
    CreateDir,
    /// Removing leftover temporary files (the path is the directory or the file).
    Cleanup,
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::CreateTemp => "creating the temporary file",
            Step::Write => "writing",
            Step::SyncFile => "fsync of the file",
            Step::Rename => "renaming into place",
            Step::SyncDir => "fsync of the directory",
            Step::CreateDir => "creating the directory",
            Step::Cleanup => "removing temporary files",
        })
    }
}

/// A durable write (or a directory sync, or a cleanup) failed.
///
/// Carries the failed [`Step`], the path it acted on and the operating system's error.
/// Converts into [`std::io::Error`] (same [`io::ErrorKind`], this error as the message)
/// for callers that speak `io::Result`.
#[derive(Debug, thiserror::Error)]
#[error("{step} failed at {}: {source}", .path.display())]
pub struct DurableError {
    step: Step,
    path: PathBuf,
    #[source]
    source: io::Error,
}

impl DurableError {
    pub(crate) fn new(step: Step, path: impl Into<PathBuf>, source: io::Error) -> Self {
        DurableError {
            step,
            path: path.into(),
            source,
        }
    }

    /// The step that failed.
    pub fn step(&self) -> Step {
        self.step
    }

    /// The path the failed step acted on: the temporary file for [`Step::CreateTemp`],
    /// [`Step::Write`] and [`Step::SyncFile`], the destination for [`Step::Rename`], the
    /// directory for [`Step::SyncDir`].
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The operating system's error.
    pub fn io_error(&self) -> &io::Error {
        &self.source
    }

    /// The path and the operating system's error, for callers with their own error type.
    pub fn into_parts(self) -> (PathBuf, io::Error) {
        (self.path, self.source)
    }
}

impl From<DurableError> for io::Error {
    fn from(e: DurableError) -> Self {
        io::Error::new(e.source.kind(), e)
    }
}
