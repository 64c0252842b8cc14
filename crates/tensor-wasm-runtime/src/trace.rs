//! What the runtime adds to an invocation's trace (`docs/observability.md`):
//! facts recorded on the invocation's FaaS span (the current span where a
//! call starts) and child spans for loading, instantiating and restoring.
//! Nothing is made or recorded when traces are off.

/// Records on the current span (the invocation's) whether this call had to
/// load its module: `faas.coldstart`.
pub(crate) fn note_coldstart(cold: bool) {
    if tensor_wasm_telemetry::enabled() {
        tracing::Span::current().record("faas.coldstart", cold);
    }
}

/// Records on the current span the snapshot the instance starts from.
pub(crate) fn note_snapshot(snapshot: &str) {
    if tensor_wasm_telemetry::enabled() {
        tracing::Span::current().record("tensor_wasm.snapshot", snapshot);
    }
}

/// The span of loading module `sha` (an artifact read, or a compile).
pub(crate) fn load_span(sha: &str) -> tracing::Span {
    tensor_wasm_telemetry::span!(
        "load module",
        tensor_wasm.module.sha256 = sha,
        tensor_wasm.module.source = tracing::field::Empty,
    )
}

/// The span of creating an instance of `function`.
pub(crate) fn instantiate_span(function: &str) -> tracing::Span {
    tensor_wasm_telemetry::span!(
        "instantiate",
        tensor_wasm.function = function,
        otel.status_code = tracing::field::Empty,
    )
}

/// The trace span of one launch (disabled when traces are off).
pub(crate) fn kernel_span(
    backend: &dyn tensor_wasm_gpu::Backend,
    tenant: &tensor_wasm_gpu::TenantKey,
    kernel: &tensor_wasm_gpu::Kernel,
    config: &tensor_wasm_gpu::LaunchConfig,
    args: &[tensor_wasm_gpu::KernelArg],
) -> tracing::Span {
    if !tensor_wasm_telemetry::enabled() {
        return tracing::Span::none();
    }
    let bytes = buffer_bytes(args);
    let [gx, gy, gz] = config.grid;
    let [bx, by, bz] = config.block;
    tensor_wasm_telemetry::span!(
        "kernel",
        otel.name = %format_args!("kernel {}", kernel.name()),
        otel.status_code = tracing::field::Empty,
        tensor_wasm.kernel.name = kernel.name(),
        tensor_wasm.kernel.fingerprint = kernel.fingerprint().map(hex::encode),
        tensor_wasm.kernel.backend = if backend.device().is_cuda() { "cuda" } else { "cpu" },
        tensor_wasm.kernel.grid = %format_args!("{gx},{gy},{gz}"),
        tensor_wasm.kernel.block = %format_args!("{bx},{by},{bz}"),
        tensor_wasm.kernel.bytes = bytes,
        tensor_wasm.kernel.queue_wait_us = tracing::field::Empty,
        tensor_wasm.kernel.run_us = tracing::field::Empty,
        tensor_wasm.kernel.error = tracing::field::Empty,
        tensor_wasm.tenant = tenant.as_str(),
    )
}

/// Records a launch's queue wait, run time and failure on its span.
pub(crate) fn kernel_done(
    span: &tracing::Span,
    waited: std::time::Duration,
    ran: std::time::Duration,
    outcome: &Result<(), tensor_wasm_gpu::GpuError>,
) {
    if span.is_disabled() {
        return;
    }
    span.record(
        "tensor_wasm.kernel.queue_wait_us",
        waited.as_micros() as u64,
    );
    span.record("tensor_wasm.kernel.run_us", ran.as_micros() as u64);
    if let Err(e) = outcome {
        span.record("otel.status_code", "ERROR");
        span.record("tensor_wasm.kernel.error", tracing::field::display(e));
    }
}

/// The bytes a launch's buffer arguments span.
pub(crate) fn buffer_bytes(args: &[tensor_wasm_gpu::KernelArg]) -> u64 {
    args.iter()
        .map(|arg| match arg {
            tensor_wasm_gpu::KernelArg::Buffer { len, .. } => *len,
            _ => 0,
        })
        .sum()
}
