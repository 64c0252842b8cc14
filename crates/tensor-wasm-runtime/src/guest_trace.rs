//! Guest spans: a function's own spans, joined to its invocation's trace.
//!
//! Core modules import `tw:trace` (`sdk/c/tensor_wasm.h`), components
//! `tensor-wasm:trace/spans` (`sdk/wit/trace.wit`); both end here. A guest
//! span is a child of the innermost guest span still open, or of the
//! invocation's span. Spans left open are ended with the invocation. When
//! traces are off the calls succeed and record nothing, so a guest never
//! needs to know.
//!
//! Limits (a guest cannot flood the exporter): [`MAX_SPANS`] per invocation,
//! [`MAX_ATTRIBUTES`] per span, names and keys of at most [`MAX_NAME_BYTES`],
//! values of at most [`MAX_VALUE_BYTES`]. Keys under `faas.`,
//! `tensor_wasm.` and `otel.` are the host's and are refused.

use crate::abi::{code, AbiError};

/// The import module of core modules.
pub const MODULE: &str = "tw:trace";
/// Spans one invocation may start.
pub const MAX_SPANS: usize = 256;
/// Attributes one span may have.
pub const MAX_ATTRIBUTES: usize = 32;
/// Longest span name or attribute key, in bytes.
pub const MAX_NAME_BYTES: usize = 128;
/// Longest attribute value, in bytes.
pub const MAX_VALUE_BYTES: usize = 1024;

/// Key prefixes the host's own attributes use.
const RESERVED: [&str; 3] = ["faas.", "tensor_wasm.", "otel."];

/// The guest spans of one invocation.
#[derive(Default)]
pub(crate) struct GuestSpans {
    /// By handle (index); `None` once ended.
    spans: Vec<Option<Open>>,
    /// Handles of the spans still open, innermost last.
    stack: Vec<u32>,
}

struct Open {
    span: tracing::Span,
    attributes: usize,
}

impl GuestSpans {
    /// Starts a span named `name` under the innermost open one (or the
    /// current span, the invocation's): its handle.
    pub(crate) fn start(&mut self, name: &str) -> Result<u32, AbiError> {
        check_text(name, "a span name", MAX_NAME_BYTES)?;
        if self.spans.len() >= MAX_SPANS {
            return Err(AbiError::new(
                code::LIMIT_EXCEEDED,
                format!("an invocation may start at most {MAX_SPANS} spans"),
            ));
        }
        let span = if tensor_wasm_telemetry::enabled() {
            let parent = self
                .stack
                .last()
                .and_then(|&h| self.spans[h as usize].as_ref())
                .map_or_else(tracing::Span::current, |open| open.span.clone());
            tracing::info_span!(
                target: "tensor_wasm::trace",
                parent: &parent,
                "guest",
                otel.name = name,
                tensor_wasm.guest = true,
            )
        } else {
            tracing::Span::none()
        };
        let handle = self.spans.len() as u32;
        self.spans.push(Some(Open {
            span,
            attributes: 0,
        }));
        self.stack.push(handle);
        Ok(handle)
    }

    /// Sets attribute `key` of open span `handle` to `value`.
    pub(crate) fn set(&mut self, handle: u32, key: &str, value: &str) -> Result<(), AbiError> {
        check_text(key, "an attribute key", MAX_NAME_BYTES)?;
        check_text(value, "an attribute value", MAX_VALUE_BYTES)?;
        if RESERVED.iter().any(|prefix| key.starts_with(prefix)) {
            return Err(AbiError::new(
                code::PERMISSION_DENIED,
                format!("attribute keys under {RESERVED:?} are the host's"),
            ));
        }
        let open = self.open(handle)?;
        if open.attributes >= MAX_ATTRIBUTES {
            return Err(AbiError::new(
                code::LIMIT_EXCEEDED,
                format!("a span may have at most {MAX_ATTRIBUTES} attributes"),
            ));
        }
        open.attributes += 1;
        tensor_wasm_telemetry::set_attribute(&open.span, key.to_owned(), value.to_owned());
        Ok(())
    }

    /// Ends open span `handle` (and any opened inside it and still open).
    pub(crate) fn end(&mut self, handle: u32) -> Result<(), AbiError> {
        self.open(handle)?;
        while let Some(top) = self.stack.pop() {
            self.spans[top as usize] = None;
            if top == handle {
                break;
            }
        }
        Ok(())
    }

    fn open(&mut self, handle: u32) -> Result<&mut Open, AbiError> {
        self.spans
            .get_mut(handle as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| AbiError::new(code::BAD_HANDLE, format!("no open span {handle}")))
    }
}

fn check_text(text: &str, what: &str, max: usize) -> Result<(), AbiError> {
    if text.is_empty() && what == "a span name" {
        return Err(AbiError::new(
            code::INVALID_ARGUMENT,
            "a span name is empty",
        ));
    }
    if text.len() > max {
        return Err(AbiError::new(
            code::LIMIT_EXCEEDED,
            format!("{what} is {} bytes; the limit is {max}", text.len()),
        ));
    }
    Ok(())
}

/// Adds `tw:trace` to `linker`: `span_start(name_ptr, name_len) -> handle`,
/// `span_set(handle, key_ptr, key_len, value_ptr, value_len) -> status`,
/// `span_end(handle) -> status`; negative results are the ABI's error codes.
pub(crate) fn add_to_linker(
    linker: &mut wasmtime::Linker<crate::invocation_state::InvocationState>,
) -> wasmtime::Result<()> {
    use wasmtime::{Caller, Extern};
    type State = crate::invocation_state::InvocationState;

    fn text(caller: &mut Caller<'_, State>, spans: &[(i32, i32)]) -> Result<Vec<String>, AbiError> {
        let memory = caller
            .get_export("memory")
            .and_then(Extern::into_memory)
            .ok_or_else(|| AbiError::new(code::INVALID_ARGUMENT, "the module exports no memory"))?;
        let mem = memory.data(&*caller);
        spans
            .iter()
            .map(|&(ptr, len)| crate::abi::guest_str(mem, ptr, len, "text"))
            .collect()
    }

    linker.func_wrap(
        MODULE,
        "span_start",
        |mut caller: Caller<'_, State>, ptr: i32, len: i32| -> i32 {
            match text(&mut caller, &[(ptr, len)])
                .and_then(|t| caller.data_mut().spans.start(&t[0]))
            {
                Ok(handle) => handle as i32,
                Err(e) => e.code,
            }
        },
    )?;
    linker.func_wrap(
        MODULE,
        "span_set",
        |mut caller: Caller<'_, State>,
         handle: i32,
         kptr: i32,
         klen: i32,
         vptr: i32,
         vlen: i32|
         -> i32 {
            match text(&mut caller, &[(kptr, klen), (vptr, vlen)])
                .and_then(|t| caller.data_mut().spans.set(handle as u32, &t[0], &t[1]))
            {
                Ok(()) => code::OK,
                Err(e) => e.code,
            }
        },
    )?;
    linker.func_wrap(
        MODULE,
        "span_end",
        |mut caller: Caller<'_, State>, handle: i32| -> i32 {
            match caller.data_mut().spans.end(handle as u32) {
                Ok(()) => code::OK,
                Err(e) => e.code,
            }
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_nest_end_and_are_bounded() {
        let mut spans = GuestSpans::default();
        let outer = spans.start("outer").unwrap();
        let inner = spans.start("inner").unwrap();
        spans.set(inner, "rows", "128").unwrap();
        assert_eq!(
            spans.set(inner, "faas.name", "x").unwrap_err().code,
            code::PERMISSION_DENIED
        );
        // Ending the outer span ends the inner one too.
        spans.end(outer).unwrap();
        assert_eq!(spans.end(inner).unwrap_err().code, code::BAD_HANDLE);
        assert_eq!(spans.set(99, "k", "v").unwrap_err().code, code::BAD_HANDLE);
        assert_eq!(spans.start("").unwrap_err().code, code::INVALID_ARGUMENT);
        assert_eq!(
            spans
                .start(&"n".repeat(MAX_NAME_BYTES + 1))
                .unwrap_err()
                .code,
            code::LIMIT_EXCEEDED
        );
        let h = spans.start("attrs").unwrap();
        for i in 0..MAX_ATTRIBUTES {
            spans.set(h, &format!("k{i}"), "v").unwrap();
        }
        assert_eq!(
            spans.set(h, "one-more", "v").unwrap_err().code,
            code::LIMIT_EXCEEDED
        );
        while spans.spans.len() < MAX_SPANS {
            spans.start("s").unwrap();
        }
        assert_eq!(spans.start("s").unwrap_err().code, code::LIMIT_EXCEEDED);
    }
}
