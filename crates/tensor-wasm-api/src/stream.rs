//! `POST /functions/{id}/invoke-stream`: chunks emitted by the guest reach
//! the client as they are produced — as SSE events when the client accepts
//! `text/event-stream`, as a chunked `application/octet-stream` body
//! otherwise. Export-call functions emit chunks through `tw:stream`; WASI
//! commands get the request body as stdin and each write to stdout is a
//! chunk. A bounded buffer between guest and client means a slow client
//! slows the guest; a client that disconnects makes the guest's next
//! `emit_chunk` return `CLIENT_GONE` (and the one after that end the
//! invocation), or stops a WASI command at its next stdout write. Quota
//! guards and the instance slot are held until the guest has finished.
//!
//! On graceful shutdown, streams still open when the server tells them to
//! end (see [`AppState::end_streams`]) get a final `event: error` with code
//! `shutting_down` (SSE) or an aborted body (chunked), and the guest is
//! stopped as if the client had left.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes};
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use base64::Engine as _;
use futures_core::Stream;
use serde::Deserialize;
use serde_json::{json, Value};
use tensor_wasm_runtime::stream::{CommandExit, StreamIo, StreamLimits};
use tensor_wasm_runtime::{is_valid_function_id, InvocationStyle, Runtime, RuntimeError};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

use crate::auth::Caller;
use crate::{ApiError, AppState, ErrorCode};

/// Chunks buffered between guest and client; with 1 MiB chunks at most,
/// a slow client holds at most this many MiB per stream.
const BUFFERED_CHUNKS: usize = 8;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamQuery {
    /// The export to call (export-call functions only).
    export: Option<String>,
    /// Its arguments as a JSON array (URL-encoded), default `[]`.
    args: Option<String>,
    /// SSE data encoding of chunks: `base64` (default) or `text` (UTF-8, lossy).
    encoding: Option<String>,
}

enum Frame {
    Chunk(Vec<u8>),
    /// The invocation's outcome: the `end` event's JSON, or the error.
    End(Result<Value, ApiError>),
    /// The server is shutting down and ends the stream before the guest.
    ShuttingDown,
}

/// What a streamed invocation returns besides its chunks.
enum Outcome {
    Results(Vec<Value>),
    Exit(CommandExit),
}

impl Outcome {
    /// The data of the final `end` event.
    fn end_event(self) -> Value {
        match self {
            Outcome::Results(results) => json!({ "results": results }),
            Outcome::Exit(exit) => json!({
                "exit_code": exit.exit_code,
                "stdout_bytes": exit.stdout_bytes,
                "stderr_tail": String::from_utf8_lossy(&exit.stderr_tail),
                "stderr_truncated": exit.stderr_truncated,
            }),
        }
    }
}

type ShutdownFuture = Pin<Box<dyn Future<Output = ()> + Send>>;

/// The guest's chunks, then its outcome, as a stream of `T`.
struct InvocationStream<F> {
    rx: mpsc::Receiver<Vec<u8>>,
    done: Option<JoinHandle<Result<Outcome, RuntimeError>>>,
    /// Resolves when the server ends open streams (graceful shutdown).
    shutdown: ShutdownFuture,
    /// The invocation's deadline plus `DEADLINE_GRACE` (routes.rs): a guest still running
    /// then (a kernel that cannot be stopped) is left to finish on its own and the stream ends
    /// with `invocation_timeout`.
    deadline: Pin<Box<tokio::time::Sleep>>,
    timeout: std::time::Duration,
    map: F,
}

impl<F, T> Stream for InvocationStream<F>
where
    F: FnMut(Frame) -> Option<T> + Unpin,
{
    type Item = T;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let this = self.get_mut();
        loop {
            let Some(handle) = this.done.as_mut() else {
                return Poll::Ready(None);
            };
            if this.shutdown.as_mut().poll(cx).is_ready() {
                // Dropping the handle detaches the guest; closing the buffer
                // makes its next write fail as if the client had gone.
                this.done = None;
                this.rx.close();
                if let Some(item) = (this.map)(Frame::ShuttingDown) {
                    return Poll::Ready(Some(item));
                }
                continue;
            }
            if !handle.is_finished() && this.deadline.as_mut().poll(cx).is_ready() {
                // As at shutdown: the guest keeps its slot and quotas until it stops.
                this.done = None;
                this.rx.close();
                tracing::warn!(
                    timeout_ms = this.timeout.as_millis() as u64,
                    "a streamed invocation is still running past its deadline; ended as a timeout"
                );
                let timeout = RuntimeError::Timeout {
                    timeout_ms: this.timeout.as_millis() as u64,
                };
                if let Some(item) = (this.map)(Frame::End(Err(timeout.into()))) {
                    return Poll::Ready(Some(item));
                }
                continue;
            }
            match this.rx.poll_recv(cx) {
                Poll::Ready(Some(chunk)) => {
                    if let Some(item) = (this.map)(Frame::Chunk(chunk)) {
                        return Poll::Ready(Some(item));
                    }
                }
                // Every sender is gone: the invocation has returned.
                Poll::Ready(None) => match Pin::new(handle).poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(joined) => {
                        this.done = None;
                        let end = match joined {
                            Ok(result) => result.map(Outcome::end_event).map_err(ApiError::from),
                            Err(e) => Err(ApiError::internal(e)),
                        };
                        if let Some(item) = (this.map)(Frame::End(end)) {
                            return Poll::Ready(Some(item));
                        }
                    }
                },
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

fn shutting_down() -> ApiError {
    ApiError::new(
        ErrorCode::ShuttingDown,
        "the server is shutting down; the invocation was stopped",
    )
}

fn wants_sse(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// What to run: an export with its arguments, or a WASI command.
enum Call {
    Export { export: String, args: Vec<Value> },
    Command,
}

pub(crate) async fn invoke_stream(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    query: Result<Query<StreamQuery>, axum::extract::rejection::QueryRejection>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    if !is_valid_function_id(&id) {
        return Err(RuntimeError::FunctionNotFound(id).into());
    }
    let (style, memory) = state.inner.runtime.invocation_of(&id, tenant.id())?;
    let timeout = state.inner.runtime.timeout_of(&id)?;
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let call = match style {
        InvocationStyle::Export => Call::Export {
            export: query
                .export
                .ok_or_else(|| ApiError::bad_request("the `export` query parameter is required"))?,
            args: match &query.args {
                Some(text) => serde_json::from_str(text).map_err(|e| {
                    ApiError::bad_request(format!("`args` must be a JSON array: {e}"))
                })?,
                None => Vec::new(),
            },
        },
        InvocationStyle::Wasi => {
            if query.export.is_some() || query.args.is_some() {
                return Err(RuntimeError::WrongStyle(format!(
                    "function {id} is a WASI command: it takes the request body as stdin, no \
                     `export` or `args`"
                ))
                .into());
            }
            Call::Command
        }
        InvocationStyle::Http => return Err(Runtime::wrong_style(&id, style).into()),
    };
    let text = match query.encoding.as_deref() {
        None | Some("base64") => false,
        Some("text") => true,
        Some(other) => {
            return Err(ApiError::bad_request(format!(
                "encoding `{other}`: use base64 or text"
            )))
        }
    };
    let input = crate::routes::body(bytes)?.to_vec();
    let guards =
        crate::routes::invocation_guards(&tenant, memory, state.inner.runtime.is_uvm_backed())?;
    // Refuse bad calls with a proper status before the response starts.
    let runtime = state.inner.runtime.clone();
    {
        let runtime = runtime.clone();
        let id = id.clone();
        let check = match &call {
            Call::Export { export, args } => {
                let (export, args) = (export.clone(), args.clone());
                crate::routes::blocking(move || runtime.check_export_call(&id, &export, &args))
                    .await
            }
            Call::Command => crate::routes::blocking(move || runtime.check_command_call(&id)).await,
        };
        check?;
    }
    let permit = crate::routes::acquire_slot(&state).await?;
    let (tx, rx) = mpsc::channel(BUFFERED_CHUNKS);
    let io = StreamIo::new(input, tx, StreamLimits::default());
    // Ends when the guest has finished, after the response has started.
    let faas = crate::trace::faas_span(crate::trace::request_id(&headers), &id, tenant.id());
    let done = tokio::task::spawn_blocking(move || {
        crate::priority::lower_blocking_priority();
        let _held = (permit, guards);
        let _in = faas.enter();
        match call {
            Call::Export { export, args } => runtime
                .invoke_export_streaming(&id, &export, &args, io)
                .map(Outcome::Results),
            Call::Command => runtime.invoke_command_streaming(&id, io).map(Outcome::Exit),
        }
    });
    let shutdown = Box::pin(state.streams_end());
    let deadline = Box::pin(tokio::time::sleep(
        timeout.saturating_add(crate::routes::DEADLINE_GRACE),
    ));

    if wants_sse(&headers) {
        let events = InvocationStream {
            rx,
            done: Some(done),
            shutdown,
            deadline,
            timeout,
            map: move |frame| {
                let event = match frame {
                    Frame::Chunk(bytes) => {
                        let data = if text {
                            String::from_utf8_lossy(&bytes).into_owned()
                        } else {
                            base64::engine::general_purpose::STANDARD.encode(bytes)
                        };
                        Event::default().event("chunk").data(data)
                    }
                    Frame::End(Ok(end)) => Event::default().event("end").data(end.to_string()),
                    Frame::End(Err(e)) => error_event(&e),
                    Frame::ShuttingDown => error_event(&shutting_down()),
                };
                Some(Ok::<_, Infallible>(event))
            },
        };
        return Ok(Sse::new(events)
            .keep_alive(KeepAlive::default())
            .into_response());
    }
    let chunks = InvocationStream {
        rx,
        done: Some(done),
        shutdown,
        deadline,
        timeout,
        map: |frame| {
            let e = match frame {
                Frame::Chunk(bytes) => return Some(Ok(Bytes::from(bytes))),
                Frame::End(Ok(_)) => return None,
                Frame::End(Err(e)) => e,
                Frame::ShuttingDown => shutting_down(),
            };
            // Mid-stream failure: abort the body so the client sees an
            // incomplete chunked response instead of a silent truncation.
            Some(Err(std::io::Error::other(format!(
                "{}: {}",
                e.code, e.message
            ))))
        },
    };
    Ok((
        [(header::CONTENT_TYPE, "application/octet-stream")],
        Body::from_stream(chunks),
    )
        .into_response())
}

fn error_event(e: &ApiError) -> Event {
    Event::default()
        .event("error")
        .data(json!({ "error": { "code": e.code, "message": e.message } }).to_string())
}
