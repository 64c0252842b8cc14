//! The host of `tensor-wasm:trace@0.1.0` (`sdk/wit/trace.wit`): a component's own spans, kept
//! by [`GuestSpans`] exactly as a core module's `tw:trace` calls are.

use wasmtime::component::{HasSelf, Linker, Resource};

use crate::abi::{code, AbiError};
use crate::component::ComponentState;
use crate::guest_trace::GuestSpans;

mod bindings {
    wasmtime::component::bindgen!({
        path: "../../sdk/wit/trace.wit",
        world: "traced",
        imports: { default: trappable },
        trappable_error_type: {
            "tensor-wasm:trace/spans.error" => super::TraceCallError,
        },
        with: {
            "tensor-wasm:trace/spans.span": super::GuestSpan,
        },
    });
}

use bindings::tensor_wasm::trace::spans;

/// A span resource: its handle in the invocation's [`GuestSpans`].
pub struct GuestSpan(u32);

/// Why a call failed: an error the guest gets, or a trap (a resource table past its bound).
pub enum TraceCallError {
    Guest(spans::Error),
    Trap(wasmtime::Error),
}

impl From<AbiError> for TraceCallError {
    fn from(e: AbiError) -> Self {
        TraceCallError::Guest(match e.code {
            code::LIMIT_EXCEEDED => spans::Error::LimitExceeded(e.message),
            code::PERMISSION_DENIED => spans::Error::PermissionDenied(e.message),
            _ => spans::Error::InvalidArgument(e.message),
        })
    }
}

/// Adds `tensor-wasm:trace` to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<ComponentState>) -> wasmtime::Result<()> {
    bindings::Traced::add_to_linker::<_, HasSelf<ComponentState>>(linker, |state| state)
}

impl ComponentState {
    fn spans(&mut self) -> &mut GuestSpans {
        &mut self.spans
    }
}

impl spans::Host for ComponentState {
    fn convert_error(&mut self, err: TraceCallError) -> wasmtime::Result<spans::Error> {
        match err {
            TraceCallError::Guest(e) => Ok(e),
            TraceCallError::Trap(e) => Err(e),
        }
    }
}

impl spans::HostSpan for ComponentState {
    fn start(&mut self, name: String) -> Result<Resource<GuestSpan>, TraceCallError> {
        let handle = self.spans().start(&name)?;
        self.table
            .push(GuestSpan(handle))
            .map_err(|e| TraceCallError::Trap(wasmtime::Error::new(e)))
    }

    fn set(
        &mut self,
        span: Resource<GuestSpan>,
        key: String,
        value: String,
    ) -> Result<(), TraceCallError> {
        let handle = self
            .table
            .get(&span)
            .map_err(|e| TraceCallError::Trap(wasmtime::Error::new(e)))?
            .0;
        Ok(self.spans().set(handle, &key, &value)?)
    }

    fn end(&mut self, span: Resource<GuestSpan>) -> wasmtime::Result<()> {
        let handle = self.table.get(&span)?.0;
        // Ending a span twice is harmless.
        let _ = self.spans().end(handle);
        Ok(())
    }

    fn drop(&mut self, span: Resource<GuestSpan>) -> wasmtime::Result<()> {
        let GuestSpan(handle) = self.table.delete(span)?;
        let _ = self.spans().end(handle);
        Ok(())
    }
}
