//! W3C trace context in and out of the process, and the trace id for logs.

use std::collections::HashMap;

use opentelemetry::propagation::TextMapPropagator as _;
use opentelemetry::trace::{TraceContextExt as _, TraceId};
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Headers as a carrier of the propagator.
struct Headers<'a>(&'a http::HeaderMap);

impl opentelemetry::propagation::Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

struct HeadersMut<'a>(&'a mut http::HeaderMap);

impl opentelemetry::propagation::Injector for HeadersMut<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(key.as_bytes()),
            http::HeaderValue::from_str(&value),
        ) {
            self.0.insert(name, value);
        }
    }
}

/// Makes the caller's span (`traceparent`, `tracestate` in `headers`, when
/// well formed) the parent of `span`, a span not yet entered, and records
/// `span`'s `trace_id` field. Whether the caller's sampled flag counts is the
/// sampler's business ([`crate::Settings::trust_remote_sampled`]).
pub fn adopt_remote_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    if span.is_disabled() {
        return;
    }
    if headers.contains_key("traceparent") {
        let cx = TraceContextPropagator::new().extract(&Headers(headers));
        if cx.span().span_context().is_valid() {
            let _ = span.set_parent(cx);
        }
    }
    record_trace_id(span);
}

/// Records `span`'s trace id in its `trace_id` field (which the log lines
/// of everything under it then carry).
pub fn record_trace_id(span: &tracing::Span) {
    if let Some(id) = trace_id_of(span) {
        span.record("trace_id", id.as_str());
    }
}

/// The trace id of `span`, in hex; `None` for a span not exported.
pub fn trace_id_of(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let id = span.context().span().span_context().trace_id();
    (id != TraceId::INVALID).then(|| format!("{id:032x}"))
}

/// Puts the current span's context on an outgoing request's headers
/// (`traceparent`, and `tracestate` when there is one). Nothing when traces
/// are off or there is no current span.
pub fn inject_current(headers: &mut http::HeaderMap) {
    if !crate::enabled() {
        return;
    }
    let span = tracing::Span::current();
    if span.is_disabled() {
        return;
    }
    let cx = span.context();
    if cx.span().span_context().is_valid() {
        TraceContextPropagator::new().inject_context(&cx, &mut HeadersMut(headers));
    }
}

/// `span`'s context as a `traceparent` value, to be stored with work that
/// another process may pick up (an async job).
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    if span.is_disabled() {
        return None;
    }
    let cx = span.context();
    if !cx.span().span_context().is_valid() {
        return None;
    }
    let mut carrier = HashMap::new();
    TraceContextPropagator::new().inject_context(&cx, &mut carrier);
    carrier.remove("traceparent")
}

/// Links `span` (not yet entered) to the span a stored `traceparent` names:
/// an async job's run to the request that submitted it. A malformed value is
/// ignored.
pub fn link_to(span: &tracing::Span, traceparent: &str) {
    if span.is_disabled() {
        return;
    }
    let mut carrier = HashMap::new();
    carrier.insert("traceparent".to_string(), traceparent.to_string());
    let cx = TraceContextPropagator::new().extract(&carrier);
    let linked = cx.span().span_context().clone();
    if linked.is_valid() {
        span.add_link(linked);
    }
}

/// Sets attribute `key` of `span` (a key known only at run time: a guest's).
pub fn set_attribute(span: &tracing::Span, key: String, value: String) {
    if !span.is_disabled() {
        span.set_attribute(key, value);
    }
}
