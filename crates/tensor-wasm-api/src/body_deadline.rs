//! The body-read deadline: a layer that gives every request body a time
//! limit (`ApiConfig::body_read_timeout`) and answers `408 request_timeout`
//! when the handler was still reading it at the deadline.
//!
//! Nothing is buffered here: the body is wrapped and read by the handler as
//! before (after authentication and the rate check), and the deadline is a
//! timer on its reads.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http_body::{Body as _, Frame, SizeHint};
use tokio::time::Sleep;

use crate::{ApiError, AppState, ErrorCode};

/// A body that fails once its deadline passes.
struct DeadlineBody {
    inner: Body,
    deadline: Pin<Box<Sleep>>,
    expired: Arc<AtomicBool>,
}

/// The error a [`DeadlineBody`] ends with.
#[derive(Debug)]
struct BodyReadTimeout;

impl std::fmt::Display for BodyReadTimeout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request body did not arrive within the body-read timeout")
    }
}

impl std::error::Error for BodyReadTimeout {}

impl http_body::Body for DeadlineBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.expired.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(axum::Error::new(BodyReadTimeout))));
        }
        Pin::new(&mut self.inner).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    // Kept, so that a declared length over the limit is refused (413)
    // before anything is read.
    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The outer layer: wraps a request's body (when it has one) in the
/// deadline, and turns a handler's answer to a body cut short by it into
/// `408 request_timeout` with `Connection: close`.
pub(crate) async fn limit_body_read(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    if req.body().size_hint().exact() == Some(0) {
        return next.run(req).await;
    }
    let timeout = state.inner.config.body_read_timeout;
    let expired = Arc::new(AtomicBool::new(false));
    let (parts, body) = req.into_parts();
    let body = DeadlineBody {
        inner: body,
        deadline: Box::pin(tokio::time::sleep(timeout)),
        expired: Arc::clone(&expired),
    };
    let response = next.run(Request::from_parts(parts, Body::new(body))).await;
    if !expired.load(Ordering::Acquire) {
        return response;
    }
    let mut response = ApiError::new(
        ErrorCode::RequestTimeout,
        format!(
            "the request body did not arrive within {} ms",
            timeout.as_millis()
        ),
    )
    .into_response();
    // The rest of the body is never read: the connection cannot be reused.
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
