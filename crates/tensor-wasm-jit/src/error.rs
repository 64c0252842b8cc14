//! `JitError`, the one error type of this crate.

use tensor_wasm_gpu::GpuError;

/// Everything that can go wrong when parsing a blueprint, checking a launch or choosing a target.
///
/// The variants carry human-readable text meant for the guest or the log; callers do not branch
/// on the details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JitError {
    /// The descriptor text does not follow the grammar (see [`crate::Blueprint`]).
    #[error("invalid kernel descriptor {descriptor:?}: {reason}")]
    Parse {
        /// The descriptor as given (truncated to 80 characters).
        descriptor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The descriptor parsed but names a kernel this crate refuses to build (a tile too large for
    /// a block, an operation the data type does not have).
    #[error("invalid blueprint: {0}")]
    InvalidBlueprint(String),
    /// The launch configuration or arguments do not match the blueprint's launch contract.
    #[error("invalid launch: {0}")]
    InvalidLaunch(String),
    /// No PTX can be produced for the device or driver.
    #[error("unsupported device: {0}")]
    UnsupportedDevice(String),
}

impl JitError {
    pub(crate) fn parse(descriptor: &str, reason: impl Into<String>) -> Self {
        JitError::Parse {
            descriptor: descriptor.chars().take(80).collect(),
            reason: reason.into(),
        }
    }
}

impl From<JitError> for GpuError {
    fn from(error: JitError) -> Self {
        match error {
            JitError::UnsupportedDevice(_) => GpuError::NotAvailable(error.to_string()),
            JitError::Parse { .. } | JitError::InvalidBlueprint(_) | JitError::InvalidLaunch(_) => {
                GpuError::InvalidArgument(error.to_string())
            }
        }
    }
}
