//! HTTP-handler components (`wasi:http/incoming-handler`) at their own routes:
//! `/functions/{id}/http/{path}` and `/functions/by-name/{name}/http/{path}` (the caller's
//! newest HTTP handler of that name). Any method; the request's method, `{path}`, query,
//! headers (less `Authorization`, which the server consumed) and body reach the component,
//! the body streamed and bounded by the server's body limit. The component's response is
//! answered as soon as it sets one, its body streamed as it writes it.
//!
//! Deadlines: the response must begin within the function's deadline (plus
//! [`DEADLINE_GRACE`]), else `504 invocation_timeout`; a body still streaming at that point
//! is cut off (the connection aborts), and a request body still arriving then ends with an
//! error the component reads (and, when no response comes, `504 invocation_timeout`, whatever
//! the component did with the error). Either way the component's next read or write fails, so
//! no slow client holds an instance slot past the deadline. A component that returns or fails
//! without a response answers `502 handler_failed` (or its trap, limit or timeout code).

use std::collections::HashMap;
use std::future::Future as _;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::{Path, Request, State};
use axum::http::{self, header, uri::Uri};
use axum::response::Response;
use axum::Extension;
use http_body::{Body as _, Frame, SizeHint};
use http_body_util::BodyExt;
use tensor_wasm_runtime::{
    is_valid_function_id, ClientPresent, ClientWatch, HttpAnswer, HttpBody, HttpBodyError,
    InvocationStyle, Runtime, RuntimeError,
};
use tensor_wasm_tenant::Tenant;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::auth::Caller;
use crate::routes::{acquire_slot, invocation_guards, DEADLINE_GRACE};
use crate::{ApiError, AppState, ErrorCode};

/// Response frames buffered between the component and the client.
const BUFFERED_FRAMES: usize = 4;

/// `ANY /functions/{id}/http/{path}`.
pub(crate) async fn by_id(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(params): Path<HashMap<String, String>>,
    req: Request,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    let id = params.get("id").cloned().unwrap_or_default();
    if !is_valid_function_id(&id) {
        return Err(RuntimeError::FunctionNotFound(id).into());
    }
    // "", "functions", the id, "http", then the component's path.
    serve(state, tenant, id, 4, req).await
}

/// `ANY /functions/by-name/{name}/http/{path}`: the caller's newest HTTP handler named
/// `{name}`; `wrong_style` when the caller's functions of that name are none of them HTTP
/// handlers.
pub(crate) async fn by_name(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(params): Path<HashMap<String, String>>,
    req: Request,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    let name = params.get("name").cloned().unwrap_or_default();
    let named = state.inner.runtime.functions_named(tenant.id(), &name);
    let handler = named
        .iter()
        .filter(|r| r.style == InvocationStyle::Http)
        .max_by_key(|r| r.created_at_ms);
    let id = match (handler, named.first()) {
        (Some(handler), _) => handler.id.clone(),
        // Named, but not an HTTP handler: the function is there, the route is wrong.
        (None, Some(other)) => return Err(Runtime::wrong_style(&other.id, other.style).into()),
        (None, None) => {
            return Err(ApiError::new(
                ErrorCode::NotFound,
                format!("no function named {name:?} is deployed"),
            ))
        }
    };
    // "", "functions", "by-name", the name, "http", then the component's path.
    serve(state, tenant, id, 5, req).await
}

/// Hands `req` to HTTP handler `id` of `tenant`; the component's path is what follows the
/// first `skip` segments of the request's path.
async fn serve(
    state: AppState,
    tenant: Arc<Tenant>,
    id: String,
    skip: usize,
    req: Request,
) -> Result<Response, ApiError> {
    let runtime: Runtime = state.inner.runtime.clone();
    let (style, memory) = runtime.invocation_of(&id, tenant.id())?;
    if style != InvocationStyle::Http {
        return Err(Runtime::wrong_style(&id, style).into());
    }
    let timeout = runtime.timeout_of(&id)?;
    let limit = state.inner.config.max_body_bytes as u64;
    if req.body().size_hint().lower() > limit {
        return Err(too_large(limit));
    }
    // Taken before the body is read, released when the component has returned.
    let guards = invocation_guards(&tenant, memory, runtime.is_uvm_backed())?;
    let permit = acquire_slot(&state).await?;
    let deadline = Instant::now() + timeout;
    let faas = crate::trace::faas_span(crate::trace::request_id(req.headers()), &id, tenant.id());
    let cut = BodyCut::default();
    let request = component_request(req, skip, limit, deadline, cut.clone())?;
    let (tx, rx) = oneshot::channel::<HttpAnswer>();
    let task_id = id.clone();
    // Dropped with this future when the client goes away, which ends the component there.
    let (present, watch) = ClientWatch::pair();
    let mut task = tokio::task::spawn_blocking(move || {
        crate::priority::lower_blocking_priority();
        let _held = (permit, guards);
        let _in = faas.enter();
        watch.scope(|| {
            runtime.invoke_http(&task_id, request, move |answer| {
                // The client may be gone already; then nobody reads the answer.
                let _ = tx.send(answer);
            })
        })
    });
    let waited = tokio::time::timeout_at(deadline + DEADLINE_GRACE, async {
        match rx.await {
            Ok(answer) => Ok(answer),
            // No answer: the component returned or failed; its outcome says which.
            Err(_) => Err((&mut task).await),
        }
    })
    .await;
    // No response, and the request body was cut: that is the answer, whatever the component
    // then did with the error it read (a trap, its own deadline).
    let cut_short = || {
        if cut.overflowed.load(Ordering::Acquire) {
            Some(too_large(limit))
        } else if cut.late.load(Ordering::Acquire) {
            Some(ApiError::from(RuntimeError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            }))
        } else {
            None
        }
    };
    match waited {
        Err(_elapsed) => {
            detach(id, task);
            Err(RuntimeError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            }
            .into())
        }
        Ok(Ok(Ok(response))) => {
            detach(id, task);
            Ok(stream_response(
                response,
                deadline + DEADLINE_GRACE,
                present,
            ))
        }
        Ok(Ok(Err(code))) => {
            detach(id, task);
            Err(cut_short().unwrap_or_else(|| {
                ApiError::new(
                    ErrorCode::HandlerFailed,
                    format!("the HTTP handler answered with the wasi:http error code {code}"),
                )
            }))
        }
        Ok(Err(outcome)) => {
            let outcome = outcome.map_err(ApiError::internal)?;
            if let Some(error) = cut_short() {
                return Err(error);
            }
            outcome?;
            Err(ApiError::new(
                ErrorCode::HandlerFailed,
                "the HTTP handler returned without a response (it never set its \
                 response-outparam)",
            ))
        }
    }
}

fn too_large(limit: u64) -> ApiError {
    ApiError::new(
        ErrorCode::PayloadTooLarge,
        format!("the request body is larger than the server's limit of {limit} bytes"),
    )
}

/// Logs how a component that has answered (or was answered for) ends.
fn detach(id: String, task: tokio::task::JoinHandle<Result<(), RuntimeError>>) {
    tokio::spawn(async move {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::info!(function = %id, error = %e, "HTTP handler failed after its answer")
            }
            Err(e) => tracing::error!(function = %id, error = %e, "HTTP handler task failed"),
        }
    });
}

/// Whether a request body was cut off: past the size limit, or past the deadline.
#[derive(Clone, Default)]
struct BodyCut {
    overflowed: Arc<AtomicBool>,
    late: Arc<AtomicBool>,
}

/// The request as the component sees it: `http://{Host}/{path}?{query}`, without
/// `Authorization`, its body bounded by `limit` bytes and by `deadline`.
fn component_request(
    req: Request,
    skip: usize,
    limit: u64,
    deadline: Instant,
    cut: BodyCut,
) -> Result<http::Request<HttpBody>, ApiError> {
    let (mut parts, body) = req.into_parts();
    let host = parts
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| h.parse::<http::uri::Authority>().is_ok())
        .unwrap_or("localhost")
        .to_owned();
    parts.uri = Uri::builder()
        .scheme("http")
        .authority(host)
        .path_and_query(component_path(&parts.uri, skip))
        .build()
        .map_err(|e| ApiError::bad_request(format!("the request's path: {e}")))?;
    parts.headers.remove(header::AUTHORIZATION);
    let body = BoundedBody {
        inner: body,
        limit,
        seen: 0,
        deadline: Box::pin(tokio::time::sleep_until(deadline)),
        cut,
    };
    Ok(http::Request::from_parts(parts, body.boxed_unsync()))
}

/// What follows the first `skip` segments of `uri`'s path (at least `/`), with its query.
fn component_path(uri: &Uri, skip: usize) -> String {
    let rest = uri.path().splitn(skip + 1, '/').nth(skip).unwrap_or("");
    match uri.query() {
        Some(query) => format!("/{rest}?{query}"),
        None => format!("/{rest}"),
    }
}

/// A request body the component reads: at most `limit` bytes, until `deadline`.
struct BoundedBody {
    inner: Body,
    limit: u64,
    seen: u64,
    deadline: Pin<Box<tokio::time::Sleep>>,
    cut: BodyCut,
}

impl http_body::Body for BoundedBody {
    type Data = Bytes;
    type Error = HttpBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpBodyError>>> {
        if self.deadline.as_mut().poll(cx).is_ready() {
            self.cut.late.store(true, Ordering::Release);
            return Poll::Ready(Some(Err(HttpBodyError::Cut(
                "the request body did not arrive within the function's deadline".into(),
            ))));
        }
        let frame = match Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => frame,
            Poll::Ready(Some(Err(e))) => {
                return Poll::Ready(Some(Err(HttpBodyError::Cut(e.to_string()))))
            }
            Poll::Ready(None) => return Poll::Ready(None),
            Poll::Pending => return Poll::Pending,
        };
        if let Some(data) = frame.data_ref() {
            self.seen += data.len() as u64;
            if self.seen > self.limit {
                self.cut.overflowed.store(true, Ordering::Release);
                return Poll::Ready(Some(Err(HttpBodyError::TooLarge(self.limit))));
            }
        }
        Poll::Ready(Some(Ok(frame)))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// The component's response, its body copied to the client by a task of its own until
/// `deadline`: the copy goes on when the client reads slowly (and no longer than the
/// deadline), and when it stops (deadline, client gone) the component's body is dropped,
/// so the component's next write fails, and `present` with it, which ends the component.
/// A body that ends releases `present`: the component then returns on its own.
fn stream_response(
    response: http::Response<HttpBody>,
    deadline: Instant,
    present: ClientPresent,
) -> Response {
    let (parts, mut body) = response.into_parts();
    let (tx, rx) = mpsc::channel(BUFFERED_FRAMES);
    tokio::spawn(async move {
        loop {
            let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
                Ok(Some(frame)) => frame,
                Ok(None) => return present.release(),
                Err(_elapsed) => Err(HttpBodyError::Cut(
                    "the response body did not end within the function's deadline".into(),
                )),
            };
            let last = frame.is_err();
            let sent = tokio::time::timeout_at(deadline, tx.send(frame)).await;
            if last || !matches!(sent, Ok(Ok(()))) {
                return;
            }
        }
    });
    Response::from_parts(parts, Body::new(ChannelBody { rx }))
}

/// The frames the copying task sends, as a body.
struct ChannelBody {
    rx: mpsc::Receiver<Result<Frame<Bytes>, HttpBodyError>>,
}

impl http_body::Body for ChannelBody {
    type Data = Bytes;
    type Error = HttpBodyError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, HttpBodyError>>> {
        self.rx.poll_recv(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_component_gets_the_path_after_the_route_and_the_query() {
        let uri = |s: &str| s.parse::<Uri>().unwrap();
        let id = "/functions/fn-0/http";
        assert_eq!(component_path(&uri(id), 4), "/");
        assert_eq!(component_path(&uri(&format!("{id}/")), 4), "/");
        assert_eq!(
            component_path(&uri(&format!("{id}/a/b%20c?x=1&y")), 4),
            "/a/b%20c?x=1&y"
        );
        assert_eq!(
            component_path(&uri("/functions/by-name/my%2Fapi/http/items/7?q"), 5),
            "/items/7?q"
        );
    }
}
