//! The FaaS span of an invocation (`docs/observability.md`): made under the
//! request's server span for `/invoke`, `/stream` and HTTP-handler calls,
//! and as the root of its own trace, linked to the submitting request, for
//! an async job (which another replica may run). Disabled, and never made,
//! when traces are off.

use axum::http::HeaderMap;
use tracing::field::Empty;
use tracing::Span;

/// `faas.trigger` of calls made over HTTP.
pub(crate) const HTTP: &str = "http";
/// `faas.trigger` of async jobs: the job queue is the messaging system.
pub(crate) const JOB: &str = "pubsub";

/// The span of invocation `invocation_id` of `function` by `tenant`, a
/// child of the current span (the request's).
pub(crate) fn faas_span(invocation_id: &str, function: &str, tenant: &str) -> Span {
    if !tensor_wasm_telemetry::enabled() {
        return Span::none();
    }
    let parent = Span::current().id();
    faas(parent, "internal", HTTP, invocation_id, function, tenant)
}

/// The span of async job `job` of `function` by `tenant`: a root (the job
/// runs apart from the request that submitted it), linked to that request's
/// span when the job carries its `traceparent`.
pub(crate) fn job_span(
    job: &str,
    function: &str,
    tenant: &str,
    submitted_by: Option<&str>,
) -> Span {
    if !tensor_wasm_telemetry::enabled() {
        return Span::none();
    }
    let span = faas(None, "consumer", JOB, job, function, tenant);
    if let Some(traceparent) = submitted_by {
        tensor_wasm_telemetry::link_to(&span, traceparent);
    }
    tensor_wasm_telemetry::record_trace_id(&span);
    span
}

/// A FaaS span under `parent` (`None`: a root).
fn faas(
    parent: Option<tracing::Id>,
    kind: &'static str,
    trigger: &'static str,
    invocation_id: &str,
    function: &str,
    tenant: &str,
) -> Span {
    tracing::info_span!(
        target: "tensor_wasm::trace",
        parent: parent,
        "faas",
        otel.name = %format_args!("invoke {function}"),
        otel.kind = kind,
        otel.status_code = Empty,
        faas.trigger = trigger,
        faas.invocation_id = invocation_id,
        faas.name = function,
        faas.coldstart = Empty,
        tensor_wasm.function = function,
        tensor_wasm.tenant = tenant,
        tensor_wasm.snapshot = Empty,
        tensor_wasm.error = Empty,
        trace_id = Empty,
    )
}

/// The request id of a request the edge has seen (it sets one on every request).
pub(crate) fn request_id(headers: &HeaderMap) -> &str {
    headers
        .get(crate::request_id::HEADER)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-")
}

/// Marks `span` failed with `code` (the API error code) when `result` is an error.
pub(crate) fn outcome<T>(span: &Span, result: &Result<T, crate::ApiError>) {
    if let Err(e) = result {
        if !span.is_disabled() {
            span.record("otel.status_code", "ERROR");
            span.record("tensor_wasm.error", tracing::field::display(&e.code));
        }
    }
}

/// Marks `span` failed.
pub(crate) fn failed(span: &Span) {
    if !span.is_disabled() {
        span.record("otel.status_code", "ERROR");
    }
}
