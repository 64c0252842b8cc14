//! HTTP-handler components (`wasi:http/incoming-handler`): one request handed to a fresh
//! instance with the function's limits; the component's response (status and headers once it
//! sets them, the body as it writes it) goes to the caller's callback, while the call goes on
//! until `handle` returns or its deadline passes (`component::run_until`). Outgoing HTTP goes
//! to the operator's allow-list only (`outgoing_http`).

use std::time::Instant;

use bytes::Bytes;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::BodyExt;
use wasmtime_wasi_http::p2::bindings::http::types::Scheme;
use wasmtime_wasi_http::WasiHttpView;

use super::command::{log_stderr, quiet_component_ctx, CommandStore};
use crate::component::LoadedComponent;
use crate::error::{Result, RuntimeError};
use crate::store::InvocationStyle;
use crate::Runtime;

/// Largest stderr an HTTP handler may write (its tail is logged, not returned).
const STDERR_CAP: usize = 64 << 10;

/// The body of a request handed to an HTTP handler, and of its response.
pub type HttpBody = UnsyncBoxBody<Bytes, HttpBodyError>;

/// What an HTTP handler answered: its response (the body still streaming), or the
/// `wasi:http` error code it set instead of one.
pub type HttpAnswer = std::result::Result<http::Response<HttpBody>, String>;

/// Why a request's or a response's body ended early.
#[derive(Debug, thiserror::Error)]
pub enum HttpBodyError {
    /// The request body is larger than the server takes; the handler reads an error
    /// (`HTTP-request-body-size`).
    #[error("the request body is larger than {0} bytes")]
    TooLarge(u64),
    /// The body was cut off (a client gone, a deadline): `connection-terminated` to the
    /// handler.
    #[error("{0}")]
    Cut(String),
}

impl From<HttpBodyError> for wasmtime_wasi_http::Error {
    fn from(e: HttpBodyError) -> Self {
        match e {
            HttpBodyError::TooLarge(limit) => {
                wasmtime_wasi_http::Error::HttpRequestBodySize(Some(limit))
            }
            HttpBodyError::Cut(_) => wasmtime_wasi_http::Error::ConnectionTerminated,
        }
    }
}

impl Runtime {
    /// Checks that function `id` is an HTTP handler, loading it, without running anything.
    pub fn check_http_call(&self, id: &str) -> Result<()> {
        let entry = self.entry(id)?;
        match self.component_of_style(&entry)? {
            LoadedComponent::Http(_) => Ok(()),
            _ => Err(not_a_handler(id)),
        }
    }

    /// Hands `request` to HTTP-handler function `id` in a fresh instance, within its limits.
    /// `respond` gets the component's answer as soon as it sets one (the body then streams
    /// while the call goes on); it is dropped unused when the component returns or fails
    /// without answering. Returns when `handle` has returned: `Ok` when it returned, the
    /// guest's failure otherwise (a trap, its deadline, its memory limit).
    pub fn invoke_http(
        &self,
        id: &str,
        request: http::Request<HttpBody>,
        respond: impl FnOnce(HttpAnswer) + Send + Sync + 'static,
    ) -> Result<()> {
        let start = Instant::now();
        let result = self.invoke_http_inner(id, request, respond);
        self.finish(start, &result);
        result
    }

    fn invoke_http_inner(
        &self,
        id: &str,
        request: http::Request<HttpBody>,
        respond: impl FnOnce(HttpAnswer) + Send + Sync + 'static,
    ) -> Result<()> {
        let entry = self.entry(id)?;
        let LoadedComponent::Http(pre) = self.component_of_style(&entry)? else {
            return Err(not_a_handler(id));
        };
        let _slot = self.take_slot()?;
        let record = &entry.record;
        let (ctx, stderr) = quiet_component_ctx(record, STDERR_CAP);
        let mut store = self.component_store(record, ctx);
        let deadline = store.data().deadline;
        let called = crate::component::run_until(deadline, &self.cancelled("http"), async {
            let mut http = store.data_mut().http();
            let request = http.new_incoming_request(Scheme::Http, request)?;
            let out = http.new_response_outparam_from_callback(move |answer| {
                respond(match answer {
                    Ok(response) => Ok(response.map(|body| {
                        body.map_err(|e| HttpBodyError::Cut(e.to_string()))
                            .boxed_unsync()
                    })),
                    Err(code) => Err(format!("{code:?}")),
                });
            })?;
            let proxy = crate::component::instantiate_retrying!(pre.instantiate_async(&mut store))?;
            proxy
                .wasi_http_incoming_handler()
                .call_handle(&mut store, request, out)
                .await
        });
        log_stderr(record, &stderr.contents());
        called.map_err(|e| CommandStore::Component(store).classify(e, &record.limits))
    }

    /// The loaded component of component function `entry`, or `wrong_style` for a core
    /// module.
    fn component_of_style(
        &self,
        entry: &crate::function_entry::FunctionEntry,
    ) -> Result<LoadedComponent> {
        if entry.record.style != InvocationStyle::Http || !entry.record.component {
            return Err(not_a_handler(&entry.record.id));
        }
        self.component_of(entry)
    }
}

fn not_a_handler(id: &str) -> RuntimeError {
    RuntimeError::WrongStyle(format!(
        "function {id} is not an HTTP handler (a component exporting \
         wasi:http/incoming-handler): call it through /invoke"
    ))
}
