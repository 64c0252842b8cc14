//! The layer around every route: the request id (kept or generated, echoed),
//! the request-body deadline (`408 request_timeout`), the body-size limit,
//! the HTTP metrics and the request log line, in one tower service.
//!
//! One service rather than a `from_fn` middleware each: every layer the
//! router adds wraps each route once more, and each wrap costs allocations
//! and a clone of the inner service on every request. Here the inner
//! service is called without a clone (it is driven to readiness first, as
//! tower requires), the metric series of a route are resolved once and
//! cached ([`HttpMetrics::series`]), and the body timer is armed only when
//! a read of the body has to wait ([`DeadlineBody`]).
//!
//! Authentication is a route layer inside this one (see [`crate::router`]),
//! so refused requests are counted and logged too. The route label is the
//! matched route template (`/functions/{id}`), never the raw path, so
//! cardinality is bounded. Server errors log at WARN with the request id;
//! everything else at DEBUG.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use axum::body::Body;
use axum::extract::{DefaultBodyLimit, MatchedPath, Request};
use axum::http::{header, HeaderValue, Method};
use axum::response::{IntoResponse, Response};
use http_body::Body as _;
use tower::{Layer, Service};

use crate::body_deadline::DeadlineBody;
use crate::metrics::HttpRequestLabels;
use crate::{request_id, ApiError, AppState, ErrorCode};

/// The [`Layer`] of [`Edge`]; with the body-size limit inside it, the one
/// layer [`crate::router`] puts around every route.
#[derive(Clone)]
pub(crate) struct EdgeLayer {
    state: AppState,
}

impl EdgeLayer {
    pub(crate) fn new(state: AppState) -> Self {
        EdgeLayer { state }
    }
}

impl<S> Layer<S> for EdgeLayer {
    type Service = Edge<<DefaultBodyLimit as Layer<S>>::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        let limit = DefaultBodyLimit::max(self.state.inner.config.max_body_bytes);
        Edge {
            inner: limit.layer(inner),
            state: self.state.clone(),
        }
    }
}

/// See the module documentation.
#[derive(Clone)]
pub(crate) struct Edge<S> {
    inner: S,
    state: AppState,
}

impl<S> Service<Request> for Edge<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Answer<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let start = Instant::now();
        let state = self.state.clone();
        let id = match req.headers().get(request_id::HEADER) {
            Some(v) if request_id::acceptable(v) => v.clone(),
            _ => {
                let v = state.inner.request_ids.next();
                req.headers_mut().insert(request_id::HEADER, v.clone());
                v
            }
        };
        let labels = HttpRequestLabels::of(
            req.extensions()
                .get::<MatchedPath>()
                .map(MatchedPath::as_str),
            req.method(),
        );
        let expired = if req.body().size_hint().exact() == Some(0) {
            None
        } else {
            let timeout = state.inner.config.body_read_timeout;
            let expired = Arc::new(AtomicBool::new(false));
            let (parts, body) = req.into_parts();
            let body = DeadlineBody::new(body, start + timeout, Arc::clone(&expired));
            req = Request::from_parts(parts, Body::new(body));
            Some(expired)
        };
        let method = req.method().clone();
        Answer {
            answer: self.inner.call(req),
            done: Some(Done {
                state,
                start,
                id,
                labels,
                method,
                expired,
            }),
        }
    }
}

/// The response of an [`Edge`] route, finished (counted, logged, its
/// request id set) when the route has answered.
pub(crate) struct Answer<F> {
    answer: F,
    done: Option<Done>,
}

/// What finishing a response takes.
struct Done {
    state: AppState,
    start: Instant,
    id: HeaderValue,
    labels: HttpRequestLabels,
    method: Method,
    expired: Option<Arc<AtomicBool>>,
}

impl<F> Future for Answer<F>
where
    F: Future<Output = Result<Response, Infallible>> + Unpin,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.get_mut();
        let Poll::Ready(Ok(response)) = Pin::new(&mut this.answer).poll(cx) else {
            return Poll::Pending;
        };
        let done = this.done.take().expect("polled after completion");
        Poll::Ready(Ok(done.finish(response)))
    }
}

impl Done {
    fn finish(self, mut response: Response) -> Response {
        let Done {
            state,
            start,
            id,
            labels,
            method,
            expired,
        } = self;
        if expired.is_some_and(|e| e.load(Ordering::Acquire)) {
            response = body_read_timeout(&state);
        }
        let elapsed = start.elapsed();
        let status = response.status();
        state.inner.http.series(labels).observe(status, elapsed);
        let id_text = id.to_str().unwrap_or("-");
        let route = labels.route;
        if status.is_server_error() {
            tracing::warn!(request_id = id_text, %method, route, status = status.as_u16(), ?elapsed, "request failed");
        } else {
            tracing::debug!(request_id = id_text, %method, route, status = status.as_u16(), ?elapsed, "request");
        }
        response.headers_mut().insert(request_id::HEADER, id);
        response
    }
}

/// The answer to a request whose handler was still reading the body at its
/// deadline.
fn body_read_timeout(state: &AppState) -> Response {
    let mut response = ApiError::new(
        ErrorCode::RequestTimeout,
        format!(
            "the request body did not arrive within {} ms",
            state.inner.config.body_read_timeout.as_millis()
        ),
    )
    .into_response();
    // The rest of the body is never read: the connection cannot be reused.
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}
