//! Streaming I/O for guests: import module `tw:stream`.
//!
//! | import | signature | does |
//! |---|---|---|
//! | `input_len` | `() -> i64` | bytes of request input in total |
//! | `read_input` | `(ptr, len) -> i32` | copies the next input bytes; 0 at the end |
//! | `emit_chunk` | `(ptr, len) -> i32` | sends a chunk to the client; blocks while the client is slow (bounded buffer) |
//! | `flush` | `() -> i32` | 0; chunks are sent as emitted |
//!
//! Results: 0 (or a count) on success; `INVALID_ARGUMENT` (-1) for ranges
//! outside memory; `NOT_AVAILABLE` (-2) outside a streaming invocation;
//! `LIMIT_EXCEEDED` (-5) over the per-chunk or per-invocation cap;
//! `CLIENT_GONE` (-7) once the client has disconnected — the guest should stop;
//! any further `emit_chunk` then ends the invocation.

use tokio::sync::mpsc;
use wasmtime::{Caller, Extern, Linker};

use crate::abi::{self, code};
use crate::runtime::InvocationState;

/// Import module name.
pub const MODULE: &str = "tw:stream";

/// Caps of one streaming invocation.
#[derive(Debug, Clone, Copy)]
pub struct StreamLimits {
    /// Largest single chunk.
    pub max_chunk_bytes: usize,
    /// Largest total output.
    pub max_total_bytes: u64,
}

impl Default for StreamLimits {
    fn default() -> Self {
        StreamLimits {
            max_chunk_bytes: 1 << 20,
            max_total_bytes: 256 << 20,
        }
    }
}

/// The streaming side of one invocation: input to read, chunks to send.
pub struct StreamIo {
    input: Vec<u8>,
    cursor: usize,
    tx: mpsc::Sender<Vec<u8>>,
    emitted: u64,
    limits: StreamLimits,
    client_gone: bool,
}

impl StreamIo {
    /// Streams chunks into `tx` (bounded: a slow reader slows the guest).
    pub fn new(input: Vec<u8>, tx: mpsc::Sender<Vec<u8>>, limits: StreamLimits) -> Self {
        StreamIo {
            input,
            cursor: 0,
            tx,
            emitted: 0,
            limits,
            client_gone: false,
        }
    }
}

/// The client went away and the guest kept streaming.
#[derive(Debug, thiserror::Error)]
#[error("the client disconnected; the invocation was cancelled")]
pub struct ClientGone;

fn memory_of(caller: &mut Caller<'_, InvocationState>) -> Option<wasmtime::Memory> {
    caller.get_export("memory").and_then(Extern::into_memory)
}

/// Adds `tw:stream` to `linker`.
pub(crate) fn add_to_linker(linker: &mut Linker<InvocationState>) -> wasmtime::Result<()> {
    linker.func_wrap(
        MODULE,
        "input_len",
        |caller: Caller<'_, InvocationState>| -> i64 {
            caller
                .data()
                .stream
                .as_ref()
                .map_or(0, |s| s.input.len() as i64)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "read_input",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32| -> i32 {
            let Some(memory) = memory_of(&mut caller) else {
                return code::INVALID_ARGUMENT;
            };
            let (mem, state) = memory.data_and_store_mut(&mut caller);
            let Some(io) = state.stream.as_mut() else {
                return code::NOT_AVAILABLE;
            };
            let Ok(dest) = abi::guest_bytes(mem, ptr, len) else {
                return code::INVALID_ARGUMENT;
            };
            let n = dest.len().min(io.input.len() - io.cursor);
            let start = ptr as u32 as usize;
            mem[start..start + n].copy_from_slice(&io.input[io.cursor..io.cursor + n]);
            io.cursor += n;
            n as i32
        },
    )?;
    linker.func_wrap(
        MODULE,
        "emit_chunk",
        |mut caller: Caller<'_, InvocationState>, ptr: i32, len: i32| -> wasmtime::Result<i32> {
            let Some(memory) = memory_of(&mut caller) else {
                return Ok(code::INVALID_ARGUMENT);
            };
            let (mem, state) = memory.data_and_store_mut(&mut caller);
            let Some(io) = state.stream.as_mut() else {
                return Ok(code::NOT_AVAILABLE);
            };
            if io.client_gone {
                return Err(wasmtime::Error::new(ClientGone));
            }
            let Ok(chunk) = abi::guest_bytes(mem, ptr, len) else {
                return Ok(code::INVALID_ARGUMENT);
            };
            if chunk.len() > io.limits.max_chunk_bytes
                || io.emitted + chunk.len() as u64 > io.limits.max_total_bytes
            {
                return Ok(code::LIMIT_EXCEEDED);
            }
            io.emitted += chunk.len() as u64;
            // Blocks while the buffer is full: back-pressure from the client.
            if io.tx.blocking_send(chunk.to_vec()).is_err() {
                io.client_gone = true;
                return Ok(code::CLIENT_GONE);
            }
            Ok(code::OK)
        },
    )?;
    linker.func_wrap(
        MODULE,
        "flush",
        |caller: Caller<'_, InvocationState>| -> i32 {
            if caller.data().stream.is_some() {
                code::OK
            } else {
                code::NOT_AVAILABLE
            }
        },
    )?;
    Ok(())
}
