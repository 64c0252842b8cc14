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

use crate::auth::admit;
use crate::body_deadline::DeadlineBody;
use crate::metrics::HttpRequestLabels;
use crate::{request_id, routes, ApiError, AppState, ErrorCode};

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

    fn call(&mut self, req: Request) -> Self::Future {
        let labels = HttpRequestLabels::of(
            req.extensions()
                .get::<MatchedPath>()
                .map(MatchedPath::as_str),
            req.method(),
        );
        let (req, done) = Done::start(&self.state, req, labels);
        Answer {
            answer: self.inner.call(req),
            done: Some(done),
        }
    }
}

impl Done {
    /// Takes `req` in: its request id (kept or generated), its body under
    /// the deadline; what finishing its answer takes is returned with it.
    pub(crate) fn start(
        state: &AppState,
        mut req: Request,
        labels: HttpRequestLabels,
    ) -> (Request, Done) {
        let start = Instant::now();
        let state = state.clone();
        let id = match req.headers().get(request_id::HEADER) {
            Some(v) if request_id::acceptable(v) => v.clone(),
            _ => {
                let v = state.inner.request_ids.next();
                req.headers_mut().insert(request_id::HEADER, v.clone());
                v
            }
        };
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
        let span = tensor_wasm_telemetry::span!(
            "http",
            otel.name = %format_args!("{method} {}", labels.route),
            otel.kind = "server",
            otel.status_code = tracing::field::Empty,
            http.request.method = %method,
            http.route = labels.route,
            http.response.status_code = tracing::field::Empty,
            url.path = req.uri().path(),
            url.scheme = "http",
            tensor_wasm.request_id = id.to_str().unwrap_or("-"),
            trace_id = tracing::field::Empty,
        );
        tensor_wasm_telemetry::adopt_remote_parent(&span, req.headers());
        let done = Done {
            span,
            state,
            start,
            id,
            labels,
            method,
            expired,
        };
        (req, done)
    }
}

/// The response of a route behind the edge layer, finished (counted, logged, its
/// request id set) when the route has answered.
pub struct Answer<F> {
    answer: F,
    done: Option<Done>,
}

/// What finishing a response takes.
pub(crate) struct Done {
    /// The request's server span (disabled when traces are off): entered
    /// while the route runs, ended when the answer is finished.
    span: tracing::Span,
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
        let polled = {
            let _entered = this.done.as_ref().map(|done| done.span.enter());
            Pin::new(&mut this.answer).poll(cx)
        };
        let Poll::Ready(Ok(response)) = polled else {
            return Poll::Pending;
        };
        let done = this.done.take().expect("polled after completion");
        Poll::Ready(Ok(done.finish(response)))
    }
}

impl Done {
    /// The answer to the request, finished: counted, logged, its request
    /// id set (and `408` when the body was cut at its deadline).
    pub(crate) fn finish(self, mut response: Response) -> Response {
        let Done {
            span,
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
        if !span.is_disabled() {
            span.record("http.response.status_code", status.as_u16());
            if status.is_server_error() {
                span.record("otel.status_code", "ERROR");
            }
        }
        let id_text = id.to_str().unwrap_or("-");
        let route = labels.route;
        // The log line carries the trace id (nothing when traces are off).
        let _in = span.enter();
        if status.is_server_error() {
            tracing::warn!(request_id = id_text, %method, route, status = status.as_u16(), ?elapsed, "request failed");
        } else {
            tracing::debug!(request_id = id_text, %method, route, status = status.as_u16(), ?elapsed, "request");
        }
        let headers = response.headers_mut();
        headers.insert(request_id::HEADER, id);
        // As the router's routes do (the direct path has none): a body of
        // known length says so.
        if !headers.contains_key(header::CONTENT_LENGTH) {
            if let Some(length) = response.body().size_hint().exact() {
                response
                    .headers_mut()
                    .insert(header::CONTENT_LENGTH, HeaderValue::from(length));
            }
        }
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

/// The route template of the direct path.
const INVOKE_ROUTE: &str = "/functions/{id}/invoke";

/// The service the server runs: [`crate::router`], with a direct path to
/// its busiest route. `POST /functions/{id}/invoke` with a well-formed
/// function id skips the router's path matching and its per-route wrappers
/// and runs what the router would run for it, in the same order: the edge
/// (request id, body deadline, metrics under the route's template,
/// the log line), the body-size limit, authentication and the rate check
/// (`auth::admit`), then the route's handler (`routes::invoke_as`). Everything
/// else, a malformed id included, goes to the router.
#[derive(Clone)]
pub struct App {
    router: axum::Router,
    state: AppState,
    /// The metric labels of the direct path's route.
    labels: HttpRequestLabels,
    /// The body-size limit, around nothing but the handler.
    direct: <DefaultBodyLimit as Layer<DirectInvoke>>::Service,
}

impl App {
    /// [`crate::router`] of `state`, with the direct path in front.
    pub fn new(state: AppState) -> Self {
        let limit = DefaultBodyLimit::max(state.inner.config.max_body_bytes);
        App {
            router: crate::router(state.clone()),
            direct: limit.layer(DirectInvoke {
                state: state.clone(),
            }),
            state,
            labels: HttpRequestLabels::try_new(INVOKE_ROUTE, &Method::POST)
                .expect("the invoke route is a route template"),
        }
    }

    /// The function id of a request the direct path serves.
    fn direct_id(req: &Request) -> Option<&str> {
        if req.method() != Method::POST {
            return None;
        }
        let id = req
            .uri()
            .path()
            .strip_prefix("/functions/")?
            .strip_suffix("/invoke")?;
        tensor_wasm_runtime::is_valid_function_id(id).then_some(id)
    }
}

impl<B> Service<axum::http::Request<B>> for App
where
    B: http_body::Body<Data = axum::body::Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Either<
        <axum::Router as Service<axum::http::Request<B>>>::Future,
        Answer<Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>>,
    >;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // Both paths are always ready (the router says so of itself).
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: axum::http::Request<B>) -> Self::Future {
        let req = req.map(Body::new);
        if Self::direct_id(&req).is_none() {
            return Either::Router(self.router.call(req));
        }
        let (req, done) = Done::start(&self.state, req, self.labels);
        Either::Direct(Answer {
            answer: self.direct.call(req),
            done: Some(done),
        })
    }
}

/// One of the two paths of [`App`].
pub enum Either<R, D> {
    Router(R),
    Direct(D),
}

impl<R, D> Future for Either<R, D>
where
    R: Future<Output = Result<Response, Infallible>> + Unpin,
    D: Future<Output = Result<Response, Infallible>> + Unpin,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Either::Router(answer) => Pin::new(answer).poll(cx),
            Either::Direct(answer) => Pin::new(answer).poll(cx),
        }
    }
}

/// The direct path's handler: authentication, then the invoke route's
/// handler.
#[derive(Clone)]
pub struct DirectInvoke {
    state: AppState,
}

impl Service<Request> for DirectInvoke {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request) -> Self::Future {
        let caller = match admit(&self.state, &req, None) {
            Ok(caller) => caller,
            Err(refusal) => return Box::pin(std::future::ready(Ok(*refusal))),
        };
        let id = App::direct_id(&req)
            .expect("the direct path serves only its own requests")
            .to_owned();
        let state = self.state.clone();
        Box::pin(async move {
            Ok(routes::invoke_as(state, caller, id, req)
                .await
                .into_response())
        })
    }
}
