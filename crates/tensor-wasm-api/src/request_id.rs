//! Request ids: `x-request-id` is kept when the client sends one, otherwise
//! generated, echoed in the response and attached to the request's log span.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use axum::http::{HeaderValue, Request};
use tower_http::request_id::{MakeRequestId, RequestId};
use tracing::Span;

/// Generates `<process prefix>-<counter>` ids: unique per process, cheap.
#[derive(Clone, Debug)]
pub struct RequestIds {
    prefix: Arc<str>,
    next: Arc<AtomicU64>,
}

impl Default for RequestIds {
    fn default() -> Self {
        let mut raw = [0u8; 4];
        getrandom_prefix(&mut raw);
        RequestIds {
            prefix: hex_prefix(&raw).into(),
            next: Arc::new(AtomicU64::new(1)),
        }
    }
}

fn getrandom_prefix(raw: &mut [u8; 4]) {
    // A clash of prefixes between restarts only makes ids less unique in logs.
    if getrandom::fill(raw).is_err() {
        *raw = std::process::id().to_le_bytes();
    }
}

fn hex_prefix(raw: &[u8]) -> String {
    raw.iter().map(|b| format!("{b:02x}")).collect()
}

impl MakeRequestId for RequestIds {
    fn make_request_id<B>(&mut self, _request: &Request<B>) -> Option<RequestId> {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        let id = format!("{}-{n}", self.prefix);
        Some(RequestId::new(
            HeaderValue::from_str(&id).expect("ids are ASCII"),
        ))
    }
}

/// Log span of a request, carrying its id. DEBUG level: with the default
/// `info` filter no span is built on the hot path (`RUST_LOG=debug` turns
/// per-request spans on).
pub(crate) fn span_for_request<B>(request: &Request<B>) -> Span {
    let id = request
        .headers()
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("-");
    tracing::debug_span!(
        "request",
        method = %request.method(),
        uri = %request.uri(),
        request_id = %id,
    )
}
