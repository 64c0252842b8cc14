//! What a component makes the host hold, charged to the function's memory limit.
//!
//! A component invocation has one memory budget, the function's memory limit, shared by three
//! kinds of memory ([`MemoryBudget`]):
//! - its linear memories (wasmtime's `ResourceLimiter`, `memory_growing`);
//! - its `tensor-wasm:gpu` buffers (charged at `allocate`, given back at their drop);
//! - the bytes it hands the host to keep: `wasi:http` header fields (charged by the calls that
//!   take them: `fields` constructor, `from-list`, `set`, `append`, `clone`), the paths and
//!   authorities of outgoing requests, and the buffer of every outgoing body it opens (a body
//!   stream holds up to [`BODY_BUFFER_CHUNKS`] + 1 chunks of [`BODY_CHUNK_BYTES`] while its
//!   reader is slow or absent). These stay charged until the invocation ends, also after the
//!   guest drops them: the charge is a bound of what the host holds, never less than it.
//!
//! Outgoing bodies are watched too ([`Finishing`]): one that ends without the component's
//! `finish` reaches its reader as an error, as the WIT asks, not as a complete body.
//!
//! The calls that take bytes are linked over wasmtime-wasi-http's own (`charge_http_calls`):
//! each charges first and then does what wasmtime-wasi-http does. A charge past the limit
//! ends the invocation with `memory_limit_exceeded`. Besides the budget, the host-resource
//! table is bounded by `ComponentLimits::max_resources`, each `fields` resource by
//! `ComponentLimits::max_field_bytes`, and everything one call lifts from the guest (a typed
//! export's results included) by the store's hostcall fuel, set to the memory limit: a
//! `list<u8>` result is refused before it becomes one host value per byte.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use http_body_util::BodyExt;
use wasmtime::component::{Linker, Resource};
use wasmtime::StoreContextMut;
use wasmtime_wasi_http::p2::bindings::http::types::{self as http, HeaderError};
use wasmtime_wasi_http::p2::body::{HostOutgoingBody, HyperOutgoingBody};
use wasmtime_wasi_http::p2::types::{HostOutgoingRequest, HostOutgoingResponse};
use wasmtime_wasi_http::{FieldMap, WasiHttpCtxView, WasiHttpView};

use wasmtime::component::ResourceTableError;
use wasmtime_wasi_http::FieldMapError;

use crate::component::ComponentState;
use crate::error::RuntimeError;

/// The `wasi:http/types` version the WASI 0.2 host registers.
const HTTP_TYPES: &str = "wasi:http/types@0.2.12";

/// Bytes charged for each field (name and value) beyond its own: the header map's entry.
const FIELD_OVERHEAD: usize = 64;

/// Bytes charged for each `fields` resource beyond its fields: the map and its table entry.
const FIELDS_OVERHEAD: usize = 256;

/// Writes an outgoing body's stream buffers before it waits for its reader.
pub(crate) const BODY_BUFFER_CHUNKS: usize = 1;

/// The largest write to an outgoing body's stream.
pub(crate) const BODY_CHUNK_BYTES: usize = 256 << 10;

/// Bytes an outgoing body can make the host hold: its buffered chunks and the one in flight.
const BODY_BYTES: usize = (BODY_BUFFER_CHUNKS + 1) * BODY_CHUNK_BYTES;

/// A component invocation's one memory budget: its linear memories, its GPU buffers and the
/// bytes it handed the host share the function's memory limit.
#[derive(Debug)]
pub(crate) struct MemoryBudget {
    limit: usize,
    linear: usize,
    gpu: usize,
    host: usize,
    /// What `wasi-nn` holds for the invocation (models, arenas), under the same limit.
    nn: std::sync::Arc<crate::nn::HostBytes>,
    /// The message of the first charge refused for the limit, if one was.
    pub(crate) hit: Option<String>,
}

impl MemoryBudget {
    pub(crate) fn new(limit: u64) -> Self {
        MemoryBudget {
            limit: usize::try_from(limit).unwrap_or(usize::MAX),
            linear: 0,
            gpu: 0,
            host: 0,
            nn: crate::nn::HostBytes::new(limit),
            hit: None,
        }
    }

    /// What `wasi-nn` charges its models and arenas to.
    pub(crate) fn nn_bytes(&self) -> std::sync::Arc<crate::nn::HostBytes> {
        self.nn.clone()
    }

    /// Tells the `wasi-nn` share what the rest of the budget holds.
    fn sync(&self) {
        self.nn.set_others(
            self.linear
                .saturating_add(self.gpu)
                .saturating_add(self.host),
        );
    }

    /// The function's memory limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }

    /// Bytes in use: linear memories, GPU buffers and host-held bytes together.
    pub(crate) fn used(&self) -> usize {
        self.linear
            .saturating_add(self.gpu)
            .saturating_add(self.host)
            .saturating_add(self.nn.held())
    }

    /// The refusal of a charge that would bring the total to `total` bytes.
    fn refusal(&self, what: &str, total: usize) -> String {
        format!(
            "memory limit exceeded: {what} would bring the component's memory to {total} bytes \
             (linear memories {} + GPU buffers {} + bytes held by the host {} + wasi-nn {}); \
             the function's limit is {} bytes",
            self.linear,
            self.gpu,
            self.host,
            self.nn.held(),
            self.limit
        )
    }

    /// [`Self::refusal`], remembered as the invocation's error (the refusal ends it).
    fn refuse(&mut self, what: &str, total: usize) -> String {
        let message = self.refusal(what, total);
        if self.hit.is_none() {
            self.hit = Some(message.clone());
        }
        message
    }

    /// Linear memories growing from `current` to `desired` bytes (one of them).
    pub(crate) fn grow_linear(&mut self, current: usize, desired: usize) -> Result<(), String> {
        let linear = self.linear - current.min(self.linear) + desired;
        let total = linear
            .saturating_add(self.gpu)
            .saturating_add(self.host)
            .saturating_add(self.nn.held());
        if total > self.limit {
            return Err(self.refuse("growing a linear memory", total));
        }
        self.linear = linear;
        self.sync();
        Ok(())
    }

    /// A GPU buffer of `bytes` (as the arena takes it). A refusal is the guest's error to
    /// handle (`limit-exceeded`), not the end of the invocation.
    pub(crate) fn take_gpu(&mut self, bytes: u64) -> Result<(), String> {
        let bytes = usize::try_from(bytes).unwrap_or(usize::MAX);
        let total = self.used().saturating_add(bytes);
        if total > self.limit {
            return Err(self.refusal(&format!("a GPU buffer of {bytes} bytes"), total));
        }
        self.gpu += bytes;
        self.sync();
        Ok(())
    }

    /// A GPU buffer of `bytes` given back.
    pub(crate) fn give_gpu(&mut self, bytes: u64) {
        self.gpu = self
            .gpu
            .saturating_sub(usize::try_from(bytes).unwrap_or(usize::MAX));
        self.sync();
    }

    /// `bytes` the host keeps for the component (`what` says which), charged until the
    /// invocation ends.
    pub(crate) fn charge_host(&mut self, bytes: usize, what: &str) -> wasmtime::Result<()> {
        let total = self.used().saturating_add(bytes);
        if total > self.limit {
            let message = self.refuse(what, total);
            return Err(wasmtime::Error::msg(message));
        }
        self.host += bytes;
        self.sync();
        Ok(())
    }
}

/// The outgoing bodies (of responses and of outgoing requests) a component opened, and whether
/// it finished each. wasmtime-wasi-http ends a body the guest dropped without `finish` (or that
/// was dropped with the guest, at a trap or its deadline) as if it were complete; the WIT says
/// such a body is incomplete and the error must reach the other side. Each body's reader side
/// is wrapped ([`CutUnlessFinished`]) so that its end without `finish` is an error: the
/// client's connection is cut (no final chunk), an upstream's request fails.
#[derive(Default)]
pub(crate) struct Finishing {
    /// By the body resource's handle.
    bodies: std::collections::HashMap<u32, Arc<AtomicBool>>,
}

impl Finishing {
    /// Watches `body`, just opened, whose reader side is `hyper`.
    fn watch(&mut self, body: &Resource<HostOutgoingBody>, hyper: &mut Option<HyperOutgoingBody>) {
        let Some(inner) = hyper.take() else {
            return;
        };
        let finished = Arc::new(AtomicBool::new(false));
        self.bodies.insert(body.rep(), finished.clone());
        *hyper = Some(CutUnlessFinished { inner, finished }.boxed_unsync());
    }

    /// `body` is being finished.
    fn finished(&mut self, body: &Resource<HostOutgoingBody>) {
        if let Some(finished) = self.bodies.remove(&body.rep()) {
            finished.store(true, Ordering::Release);
        }
    }
}

/// An outgoing body whose end is an error unless the component finished it.
struct CutUnlessFinished {
    inner: HyperOutgoingBody,
    finished: Arc<AtomicBool>,
}

impl http_body::Body for CutUnlessFinished {
    type Data = bytes::Bytes;
    type Error = wasmtime_wasi_http::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        use std::task::Poll;
        match std::pin::Pin::new(&mut self.inner).poll_frame(cx) {
            Poll::Ready(None) if !self.finished.load(Ordering::Acquire) => {
                Poll::Ready(Some(Err(wasmtime_wasi_http::Error::HttpProtocolError)))
            }
            other => other,
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream() && self.finished.load(Ordering::Acquire)
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// Bytes of one field as charged.
fn field_bytes(name: &str, value: &[u8]) -> usize {
    name.len() + value.len() + FIELD_OVERHEAD
}

/// A `wasi:http` header call's result as the guest sees it: its error, or a trap.
fn header_result<T>(
    result: Result<T, wasmtime_wasi_http::p2::HeaderError>,
) -> wasmtime::Result<Result<T, HeaderError>> {
    match result {
        Ok(value) => Ok(Ok(value)),
        Err(e) => Ok(Err(e.downcast()?)),
    }
}

type Store<'a> = StoreContextMut<'a, ComponentState>;

/// Links, over wasmtime-wasi-http's, the `wasi:http/types` calls that hand the host bytes to
/// keep: each charges them to the invocation's [`MemoryBudget`] first.
pub(crate) fn charge_http_calls(linker: &mut Linker<ComponentState>) -> wasmtime::Result<()> {
    use http::{
        HostFields, HostOutgoingBody as HostOutgoingBodyCalls, HostOutgoingRequest as Request,
        HostOutgoingResponse as Response,
    };
    linker.allow_shadowing(true);
    let mut types = linker.instance(HTTP_TYPES)?;
    types.func_wrap(
        "[constructor]fields",
        |mut store: Store<'_>, (): ()| -> wasmtime::Result<(Resource<FieldMap>,)> {
            let state = store.data_mut();
            state
                .budget
                .charge_host(FIELDS_OVERHEAD, "a new fields resource")?;
            Ok((HostFields::new(&mut state.http())?,))
        },
    )?;
    types.func_wrap(
        "[static]fields.from-list",
        |mut store: Store<'_>,
         (entries,): (Vec<(String, Vec<u8>)>,)|
         -> wasmtime::Result<(Result<Resource<FieldMap>, HeaderError>,)> {
            let state = store.data_mut();
            let bytes = entries
                .iter()
                .map(|(name, value)| field_bytes(name, value))
                .sum::<usize>();
            state
                .budget
                .charge_host(FIELDS_OVERHEAD + bytes, "a fields resource from a list")?;
            Ok((header_result(HostFields::from_list(
                &mut state.http(),
                entries,
            ))?,))
        },
    )?;
    types.func_wrap(
        "[method]fields.set",
        |mut store: Store<'_>,
         (fields, name, values): (Resource<FieldMap>, String, Vec<Vec<u8>>)|
         -> wasmtime::Result<(Result<(), HeaderError>,)> {
            let state = store.data_mut();
            let bytes = values.iter().map(|v| field_bytes(&name, v)).sum::<usize>();
            state.budget.charge_host(bytes, "a header field")?;
            Ok((header_result(HostFields::set(
                &mut state.http(),
                fields,
                name,
                values,
            ))?,))
        },
    )?;
    types.func_wrap(
        "[method]fields.append",
        |mut store: Store<'_>,
         (fields, name, value): (Resource<FieldMap>, String, Vec<u8>)|
         -> wasmtime::Result<(Result<(), HeaderError>,)> {
            let state = store.data_mut();
            state
                .budget
                .charge_host(field_bytes(&name, &value), "a header field")?;
            Ok((header_result(HostFields::append(
                &mut state.http(),
                fields,
                name,
                value,
            ))?,))
        },
    )?;
    types.func_wrap(
        "[method]fields.clone",
        |mut store: Store<'_>,
         (fields,): (Resource<FieldMap>,)|
         -> wasmtime::Result<(Resource<FieldMap>,)> {
            let state = store.data_mut();
            let bytes = state
                .table
                .get(&fields)?
                .iter()
                .map(|(name, value)| field_bytes(name.as_str(), value.as_bytes()))
                .sum::<usize>();
            state
                .budget
                .charge_host(FIELDS_OVERHEAD + bytes, "a copy of a fields resource")?;
            Ok((HostFields::clone(&mut state.http(), fields)?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-path-with-query",
        |mut store: Store<'_>,
         (request, path): (Resource<HostOutgoingRequest>, Option<String>)|
         -> wasmtime::Result<(Result<(), ()>,)> {
            let state = store.data_mut();
            let bytes = path.as_ref().map_or(0, String::len);
            state.budget.charge_host(bytes, "a request path")?;
            Ok((Request::set_path_with_query(
                &mut state.http(),
                request,
                path,
            )?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.set-authority",
        |mut store: Store<'_>,
         (request, authority): (Resource<HostOutgoingRequest>, Option<String>)|
         -> wasmtime::Result<(Result<(), ()>,)> {
            let state = store.data_mut();
            let bytes = authority.as_ref().map_or(0, String::len);
            state.budget.charge_host(bytes, "a request authority")?;
            Ok((Request::set_authority(
                &mut state.http(),
                request,
                authority,
            )?,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-request.body",
        |mut store: Store<'_>,
         (request,): (Resource<HostOutgoingRequest>,)|
         -> wasmtime::Result<(Result<Resource<HostOutgoingBody>, ()>,)> {
            let state = store.data_mut();
            state
                .budget
                .charge_host(BODY_BYTES, "the buffer of an outgoing request body")?;
            let mut view: WasiHttpCtxView<'_> = state.http();
            let opened = Request::body(&mut view, Resource::new_borrow(request.rep()))?;
            if let Ok(body) = &opened {
                let hyper = &mut state.table.get_mut(&request)?.body;
                state.finishing.watch(body, hyper);
            }
            Ok((opened,))
        },
    )?;
    types.func_wrap(
        "[method]outgoing-response.body",
        |mut store: Store<'_>,
         (response,): (Resource<HostOutgoingResponse>,)|
         -> wasmtime::Result<(Result<Resource<HostOutgoingBody>, ()>,)> {
            let state = store.data_mut();
            state
                .budget
                .charge_host(BODY_BYTES, "the buffer of a response body")?;
            let mut view: WasiHttpCtxView<'_> = state.http();
            let opened = Response::body(&mut view, Resource::new_borrow(response.rep()))?;
            if let Ok(body) = &opened {
                let hyper = &mut state.table.get_mut(&response)?.body;
                state.finishing.watch(body, hyper);
            }
            Ok((opened,))
        },
    )?;
    types.func_wrap(
        "[static]outgoing-body.finish",
        |mut store: Store<'_>,
         (body, trailers): (Resource<HostOutgoingBody>, Option<Resource<FieldMap>>)|
         -> wasmtime::Result<(Result<(), http::ErrorCode>,)> {
            let state = store.data_mut();
            // Marked before the body's end reaches its reader.
            state.finishing.finished(&body);
            let finished = HostOutgoingBodyCalls::finish(&mut state.http(), body, trailers);
            match finished {
                Ok(()) => Ok((Ok(()),)),
                Err(e) => Ok((Err(e.downcast()?),)),
            }
        },
    )?;
    linker.allow_shadowing(false);
    Ok(())
}

/// The runtime's error for component failure `e` when no memory charge was refused: a full
/// resource table or `fields` resource is `ResourceLimit`, a call lifting more than the
/// hostcall fuel (the memory limit) is `MemoryLimit`, anything else as a core module's.
pub(crate) fn classify(
    e: wasmtime::Error,
    limits: &crate::store::FunctionLimits,
    state: &ComponentState,
) -> RuntimeError {
    let full_table = e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<ResourceTableError>(),
            Some(ResourceTableError::Full)
        )
    });
    if full_table {
        return RuntimeError::ResourceLimit(format!(
            "the component holds {} host resources (streams, pollables, fields, requests, GPU \
             buffers ...), the most an invocation may hold at once (--component-max-resources)",
            state.table.max_capacity()
        ));
    }
    let full_fields = e.chain().any(|cause| {
        matches!(
            cause.downcast_ref::<FieldMapError>(),
            Some(FieldMapError::TotalSizeTooBig | FieldMapError::TooManyFields)
        )
    });
    if full_fields {
        return RuntimeError::ResourceLimit(format!(
            "a wasi:http fields resource of the component would exceed {} bytes \
             (--component-max-field-bytes)",
            state.field_size_limit
        ));
    }
    if format!("{e:#}").contains("fuel allocated for hostcalls has been exhausted") {
        return RuntimeError::MemoryLimit(format!(
            "memory limit exceeded: one value passed from the component to the host (an \
             argument of a host call, or the results of a typed export) would take more than \
             {} bytes on the host, the function's memory limit",
            state.budget.limit()
        ));
    }
    crate::invocation_state::classify_error(e, limits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_budget_holds_linear_memory_gpu_buffers_and_host_bytes() {
        let mut budget = MemoryBudget::new(1000);
        budget.grow_linear(0, 600).unwrap();
        budget.take_gpu(300).unwrap();
        budget.charge_host(100, "headers").unwrap();
        assert_eq!(budget.used(), 1000);
        // Past the limit, whichever kind asks.
        assert!(budget.take_gpu(1).is_err());
        assert!(
            budget.hit.is_none(),
            "a refused buffer is the guest's error to handle"
        );
        assert!(budget.charge_host(1, "one byte more").is_err());
        assert!(budget.grow_linear(600, 601).is_err());
        let hit = budget.hit.clone().expect("the first refusal is kept");
        assert!(
            hit.contains("one byte more") && hit.contains("1000 bytes"),
            "{hit}"
        );
        // A GPU buffer given back makes room for linear memory.
        budget.give_gpu(300);
        budget.grow_linear(600, 900).unwrap();
        assert_eq!(budget.used(), 1000);
        // Shrinking-free: a memory growing from its current size counts once.
        assert!(budget.grow_linear(900, 901).is_err());
    }
}
