//! The one error type of the snapshot boundary, [`SnapshotError`].

/// Everything that can go wrong while writing, reading, validating or mapping a snapshot.
///
/// Decoders never panic on hostile input: every malformed byte string maps to one of these
/// variants. Variants name the failing check so that callers (and logs) can tell a truncated
/// upload from a snapshot of another module.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// The input ended before a section it declares.
    #[error("snapshot is truncated: {0}")]
    Truncated(&'static str),
    /// The first eight bytes are not a snapshot magic of the expected encoding.
    #[error("not a TensorWasm snapshot of the expected encoding (bad magic)")]
    BadMagic,
    /// The format version is not one this build reads.
    #[error("unsupported snapshot format version {found} (this build reads {supported})")]
    UnsupportedVersion {
        /// Version found in the header.
        found: u32,
        /// Version this build reads and writes.
        supported: u32,
    },
    /// A CRC-32C over a section did not match its stored value.
    #[error("checksum mismatch in section {section}")]
    ChecksumMismatch {
        /// `header`, `metadata`, `frame_table`, `frame`, `run_table` or `data`.
        section: &'static str,
    },
    /// The snapshot was taken from a different module than the caller expects.
    #[error("snapshot belongs to another module")]
    ModuleMismatch,
    /// A declared size exceeds a limit; nothing of that size was allocated.
    #[error("{what} of {found} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Which quantity was too large.
        what: &'static str,
        /// The declared or actual size.
        found: u64,
        /// The limit in force.
        limit: u64,
    },
    /// Internally inconsistent input whose checksums nevertheless matched (or that fails a
    /// structural rule checked before any checksum applies).
    #[error("corrupt snapshot: {0}")]
    Corrupt(String),
    /// The caller's arguments break a documented requirement (sizes, alignment).
    #[error("invalid argument: {0}")]
    InvalidInput(String),
    /// An operating-system error while reading, writing or mapping a file.
    #[error("snapshot I/O failed")]
    Io(#[from] std::io::Error),
}
