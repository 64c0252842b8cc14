//! `GpuError`, the one error type of this crate.

/// Everything that can go wrong when discovering devices, loading kernels or launching them.
///
/// The variants carry human-readable text: the callers turn them into API errors and log lines,
/// they do not branch on details.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GpuError {
    /// The capability is missing on this backend or host (no NVIDIA driver, no device, raw PTX on
    /// the CPU backend, guest memory the device cannot reach).
    #[error("not available: {0}")]
    NotAvailable(String),
    /// The caller passed something invalid: an unknown device name, a kernel argument out of
    /// bounds or of the wrong type, a launch configuration beyond the limits.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// The CUDA driver reported an error; the text starts with the `CUresult` name.
    #[error("CUDA error: {0}")]
    Cuda(String),
    /// The launch was cancelled ([`crate::Completion::cancel`]) and stopped before it finished;
    /// what it wrote to guest memory so far stays there.
    #[error("cancelled: {0}")]
    Cancelled(String),
    /// CUDA C++ did not compile ([`crate::compile_cuda`]): the source has an error, or the
    /// kernel entry is missing. `log` is NVRTC's log (or says which entry is missing), meant
    /// for whoever wrote the source.
    #[error("CUDA C++ compilation failed: {log}")]
    Compile {
        /// NVRTC's compilation log.
        log: String,
    },
}

impl GpuError {
    /// A CUDA driver error, named by its `CUresult` (for example `CUDA_ERROR_NO_DEVICE`), with
    /// what the driver was asked to do.
    pub(crate) fn cuda(what: &str, error: cudarc::driver::DriverError) -> Self {
        GpuError::Cuda(format!("{} during {what}", driver_error_text(error)))
    }
}

/// `CUDA_ERROR_X (driver description)`; the name comes from the enum itself, so this works even
/// when the driver cannot describe the error. It never panics: cudarc resolves
/// `cuGetErrorString` on first use and panics when the driver lacks it, and this runs on error
/// paths outside any other guard (a launch that failed, a completion event that could not be
/// recorded, `raw_launch`'s wait before its stream synchronisation), where a panic would skip
/// their cleanup.
pub(crate) fn driver_error_text(error: cudarc::driver::DriverError) -> String {
    error_text(format!("{:?}", error.0), move || {
        error
            .error_string()
            .ok()
            .map(|description| description.to_string_lossy().into_owned())
    })
}

/// `name (description)`, or `name` alone when `describe` has no description or panics.
fn error_text(
    name: String,
    describe: impl FnOnce() -> Option<String> + std::panic::UnwindSafe,
) -> String {
    match std::panic::catch_unwind(describe) {
        Ok(Some(description)) => format!("{name} ({description})"),
        Ok(None) | Err(_) => name,
    }
}

#[cfg(test)]
mod tests {
    use super::error_text;

    /// Regression test: a driver whose `cuGetErrorString` cannot be
    /// resolved makes cudarc panic; the error text must still come back, with the code's name.
    #[test]
    fn an_error_the_driver_cannot_describe_still_gets_its_name() {
        let panicking = || -> Option<String> { panic!("cuGetErrorString: undefined symbol") };
        assert_eq!(
            error_text("CUDA_ERROR_ILLEGAL_ADDRESS".into(), panicking),
            "CUDA_ERROR_ILLEGAL_ADDRESS"
        );
        assert_eq!(error_text("A".into(), || None), "A");
        assert_eq!(error_text("A".into(), || Some("why".into())), "A (why)");
    }
}
