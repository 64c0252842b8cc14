//! `TenantError`, the error of every fallible registry and store operation.

use std::path::{Path, PathBuf};

/// Why a tenant, token or store operation failed.
///
/// Quota refusals on the hot path are not `TenantError`s but
/// [`QuotaError`](crate::QuotaError)s.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TenantError {
    /// No tenant has this id.
    #[error("no tenant with id {0}")]
    NotFound(String),
    /// The string is not a tenant id (`tn-` and 16 lowercase hex digits).
    #[error("invalid tenant id {0:?}")]
    InvalidId(String),
    /// A tenant name must be 1 to 64 characters of `A-Z a-z 0-9 . _ -`.
    #[error("invalid tenant name {0:?}: use 1 to 64 characters of A-Z a-z 0-9 . _ -")]
    InvalidName(String),
    /// Another tenant already has this name.
    #[error("a tenant named {0:?} already exists")]
    NameTaken(String),
    /// A token label must be at most 128 characters, without control characters.
    #[error("invalid token label: at most 128 characters, no control characters")]
    InvalidLabel,
    /// Reading or writing the store failed.
    #[error("tenant store I/O failed at {path}")]
    Storage {
        /// The file or directory involved.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: std::io::Error,
    },
    /// A shared store cannot be reached; retrying later may succeed.
    #[error("the shared store is unavailable: {0}")]
    Unavailable(String),
    /// A record could not be encoded or decoded.
    #[error("tenant record {path} could not be encoded or decoded")]
    Serde {
        /// The record's file.
        path: PathBuf,
        /// The underlying failure.
        #[source]
        source: serde_json::Error,
    },
    /// The operating system's random source failed.
    #[error("the random number source failed")]
    Random(#[source] std::io::Error),
}

impl TenantError {
    pub(crate) fn storage(path: &Path, source: std::io::Error) -> Self {
        TenantError::Storage {
            path: path.to_path_buf(),
            source,
        }
    }

    pub(crate) fn serde(path: &Path, source: serde_json::Error) -> Self {
        TenantError::Serde {
            path: path.to_path_buf(),
            source,
        }
    }
}
