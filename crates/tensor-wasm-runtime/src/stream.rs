//! Streaming I/O for guests: import module `tw:stream`.
//!
//! | import | signature | does |
//! |---|---|---|
//! | `input_len` | `() -> i64` | bytes of request input in total |
//! | `read_input` | `(ptr, len) -> i32` | copies the next input bytes; 0 at the end |
//! | `emit_chunk` | `(ptr, len) -> i32` | sends a chunk to the client; blocks while the client is slow (bounded buffer), never past the invocation's deadline |
//! | `flush` | `() -> i32` | 0; chunks are sent as emitted |
//!
//! Results: 0 (or a count) on success; `INVALID_ARGUMENT` (-1) for ranges
//! outside memory; `NOT_AVAILABLE` (-2) outside a streaming invocation;
//! `LIMIT_EXCEEDED` (-5) over the per-chunk or per-invocation cap;
//! `CLIENT_GONE` (-7) once the client has disconnected — the guest should stop;
//! any further `emit_chunk` then ends the invocation. A client that stays
//! connected but stops reading holds `emit_chunk` at most until the
//! invocation's deadline, which then ends the invocation as a timeout.
//!
//! WASI commands stream their stdout the same way, with no import of their
//! own ([`Runtime::invoke_command_streaming`](crate::Runtime::invoke_command_streaming)):
//! the request input is their stdin and every write to stdout (at most 4 KiB
//! per chunk, as WASI splits writes) is a chunk, sent as it is written, under
//! the same buffer and caps. A write once the client is gone stops the guest
//! (`ClientGone`); output past the per-invocation cap stops it too
//! (`OutputTooLarge`); a write still waiting for the client at the
//! invocation's deadline ends it as a timeout.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::mpsc::{self, OwnedPermit};
use wasmtime::{Caller, Extern, Linker};
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

use crate::abi::{self, code};
use crate::invocation_state::{DeadlineExceeded, InvocationState};

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

/// A streaming WASI command wrote more stdout than the per-invocation cap.
#[derive(Debug, thiserror::Error)]
#[error("stdout exceeded the cap of {0} bytes")]
pub(crate) struct OutputCapExceeded(pub(crate) u64);

/// How a streamed WASI command ended (its stdout went out as chunks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommandExit {
    pub exit_code: i32,
    /// Bytes of stdout sent.
    pub stdout_bytes: u64,
    /// The last `stderr_tail_bytes` bytes of stderr.
    pub stderr_tail: Vec<u8>,
    /// Whether stderr was longer than the tail.
    pub stderr_truncated: bool,
}

impl StreamIo {
    /// Splits off the input (a WASI command's stdin) and turns the rest into
    /// the command's stdout, whose writes wait for the client until `deadline`
    /// at most.
    pub(crate) fn into_stdout(self, deadline: Instant) -> (Vec<u8>, StdoutChannel) {
        let stdout = StdoutChannel {
            tx: self.tx,
            shared: Arc::new(StdoutShared {
                written: AtomicU64::new(0),
                client_gone: AtomicBool::new(false),
                deadline_passed: AtomicBool::new(false),
                deadline,
                limits: self.limits,
            }),
        };
        (self.input, stdout)
    }
}

/// State every handle of one command's stdout shares.
#[derive(Debug)]
struct StdoutShared {
    written: AtomicU64,
    client_gone: AtomicBool,
    /// A write waited for the client until the invocation's deadline.
    deadline_passed: AtomicBool,
    deadline: Instant,
    limits: StreamLimits,
}

/// A WASI command's stdout that sends each write to the client as a chunk.
#[derive(Clone)]
pub(crate) struct StdoutChannel {
    tx: mpsc::Sender<Vec<u8>>,
    shared: Arc<StdoutShared>,
}

impl StdoutChannel {
    /// Bytes sent so far.
    pub(crate) fn written(&self) -> u64 {
        self.shared.written.load(Ordering::Acquire)
    }

    fn writer(&self) -> ChannelWriter {
        ChannelWriter {
            tx: self.tx.clone(),
            shared: self.shared.clone(),
            permit: None,
            reserving: Mutex::new(None),
        }
    }
}

impl IsTerminal for StdoutChannel {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for StdoutChannel {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.writer())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.writer())
    }
}

type Reserve =
    Pin<Box<dyn Future<Output = Result<OwnedPermit<Vec<u8>>, mpsc::error::SendError<()>>> + Send>>;

/// One handle on a [`StdoutChannel`]. A write needs a permit, a free place in
/// the bounded buffer, so a guest writing faster than the client reads waits
/// for it (back-pressure); a closed buffer means the client is gone.
struct ChannelWriter {
    tx: mpsc::Sender<Vec<u8>>,
    shared: Arc<StdoutShared>,
    permit: Option<OwnedPermit<Vec<u8>>>,
    /// The pending reservation (behind a mutex only to be `Sync`; never contended).
    reserving: Mutex<Option<Reserve>>,
}

impl ChannelWriter {
    /// Ready once a permit is held or the client is gone.
    fn poll_permit(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.permit.is_some() || self.shared.client_gone.load(Ordering::Acquire) {
            return Poll::Ready(());
        }
        let tx = self.tx.clone();
        let reserving = self
            .reserving
            .get_mut()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let future = reserving.get_or_insert_with(|| Box::pin(tx.reserve_owned()));
        let reserved = std::task::ready!(future.as_mut().poll(cx));
        *reserving = None;
        match reserved {
            Ok(permit) => self.permit = Some(permit),
            Err(_closed) => self.shared.client_gone.store(true, Ordering::Release),
        }
        Poll::Ready(())
    }

    /// How many bytes the next write may carry (0: wait for readiness).
    fn allowance(&self) -> StreamResult<usize> {
        if self.shared.client_gone.load(Ordering::Acquire) {
            return Err(StreamError::Trap(wasmtime::Error::new(ClientGone)));
        }
        if self.shared.deadline_passed.load(Ordering::Acquire) {
            return Err(StreamError::Trap(wasmtime::Error::new(DeadlineExceeded)));
        }
        Ok(if self.permit.is_some() {
            self.shared.limits.max_chunk_bytes
        } else {
            0
        })
    }

    /// Sends `bytes` as one chunk with the permit held. A write that would
    /// take stdout past the per-invocation cap stops the guest instead.
    fn send(&mut self, bytes: &[u8]) -> StreamResult<()> {
        if bytes.is_empty() {
            return Ok(());
        }
        if bytes.len() > self.allowance()? {
            return Err(StreamError::trap(
                "stdout write without a permit or larger than check_write allowed",
            ));
        }
        let cap = self.shared.limits.max_total_bytes;
        let written = self.shared.written.load(Ordering::Acquire);
        if written + bytes.len() as u64 > cap {
            return Err(StreamError::Trap(wasmtime::Error::new(OutputCapExceeded(
                cap,
            ))));
        }
        let permit = self.permit.take().expect("allowance checked the permit");
        self.shared
            .written
            .store(written + bytes.len() as u64, Ordering::Release);
        permit.send(bytes.to_vec());
        Ok(())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for ChannelWriter {
    async fn ready(&mut self) {
        // wasmtime-wasi runs this in a tokio context with a timer.
        let deadline = tokio::time::Instant::from_std(self.shared.deadline);
        let shared = self.shared.clone();
        let permit = std::future::poll_fn(|cx| self.poll_permit(cx));
        if tokio::time::timeout_at(deadline, permit).await.is_err() {
            // The client stopped reading: the next write ends the invocation.
            shared.deadline_passed.store(true, Ordering::Release);
        }
    }
}

#[wasmtime_wasi::async_trait]
impl OutputStream for ChannelWriter {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.send(&bytes)
    }

    fn flush(&mut self) -> StreamResult<()> {
        // Chunks go out as they are written.
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        self.allowance()
    }
}

fn stream_error_to_io(e: StreamError) -> std::io::Error {
    match e {
        StreamError::Closed => std::io::ErrorKind::BrokenPipe.into(),
        StreamError::LastOperationFailed(e) | StreamError::Trap(e) => {
            std::io::Error::other(format!("{e:#}"))
        }
    }
}

impl tokio::io::AsyncWrite for ChannelWriter {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        std::task::ready!(this.poll_permit(cx));
        let n = this.allowance().map_err(stream_error_to_io)?.min(buf.len());
        this.send(&buf[..n]).map_err(stream_error_to_io)?;
        Poll::Ready(Ok(n))
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

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
            let deadline = state.deadline;
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
            // Waits while the buffer is full (back-pressure from the client),
            // but not past the deadline: a client that stopped reading must not
            // hold the instance, its thread and its tenant's quota for ever.
            let mut reserve = std::pin::pin!(io.tx.reserve());
            match tensor_wasm_dispatch::block_on_until(&mut reserve, deadline) {
                None => Err(wasmtime::Error::new(DeadlineExceeded)),
                Some(Err(_closed)) => {
                    io.client_gone = true;
                    Ok(code::CLIENT_GONE)
                }
                Some(Ok(permit)) => {
                    permit.send(chunk.to_vec());
                    io.emitted += chunk.len() as u64;
                    Ok(code::OK)
                }
            }
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

#[cfg(test)]
pub(crate) mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::{
        DeploySpec, FsFunctionStore, Runtime, RuntimeConfig, RuntimeError, RuntimeMetrics,
    };

    /// Writes 4 KiB of `x` to stdout until a write fails, then exits with 2.
    const FLOOD: &str = r#"(module
      (import "wasi_snapshot_preview1" "fd_write"
        (func $fd_write (param i32 i32 i32 i32) (result i32)))
      (import "wasi_snapshot_preview1" "proc_exit" (func $proc_exit (param i32)))
      (memory (export "memory") 1)
      (func (export "_start")
        (memory.fill (i32.const 1024) (i32.const 120) (i32.const 4096))
        (i32.store (i32.const 0) (i32.const 1024))
        (i32.store (i32.const 4) (i32.const 4096))
        (loop $more
          (br_if $more (i32.eqz
            (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 16)))))
        (call $proc_exit (i32.const 2))))"#;

    /// A runtime over a fresh store in `dir` (also for other modules' tests).
    pub(crate) fn runtime(dir: &std::path::Path) -> Runtime {
        let store = Arc::new(FsFunctionStore::open(dir).unwrap());
        let metrics = RuntimeMetrics::register(&prometheus::Registry::new()).unwrap();
        Runtime::open(RuntimeConfig::for_tests(dir), store, metrics).unwrap()
    }

    #[test]
    fn stdout_past_the_cap_stops_the_command() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path());
        let id = rt
            .deploy(FLOOD.as_bytes(), DeploySpec::wasi("flood"))
            .unwrap()
            .record
            .id;
        let (tx, mut rx) = mpsc::channel(64);
        let limits = StreamLimits {
            max_chunk_bytes: 1 << 20,
            max_total_bytes: 10_000,
        };
        let result = rt.invoke_command_streaming(&id, StreamIo::new(Vec::new(), tx, limits));
        assert!(
            matches!(result, Err(RuntimeError::OutputTooLarge(10_000))),
            "{result:?}"
        );
        let mut sizes = Vec::new();
        while let Ok(chunk) = rx.try_recv() {
            assert!(chunk.iter().all(|&b| b == b'x'));
            sizes.push(chunk.len());
        }
        assert_eq!(sizes, [4096, 4096], "no chunk takes stdout past the cap");
    }

    #[test]
    fn a_write_after_the_client_left_stops_the_command_as_client_gone() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path());
        let id = rt
            .deploy(FLOOD.as_bytes(), DeploySpec::wasi("flood"))
            .unwrap()
            .record
            .id;
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(2);
        let reader = std::thread::spawn(move || {
            // Take three chunks, then leave.
            for _ in 0..3 {
                assert_eq!(rx.blocking_recv().unwrap().len(), 4096);
            }
        });
        let io = StreamIo::new(Vec::new(), tx, StreamLimits::default());
        let result = rt.invoke_command_streaming(&id, io);
        reader.join().unwrap();
        // Not exit code 2: the guest never saw an error it could ignore.
        assert!(
            matches!(result, Err(RuntimeError::ClientGone)),
            "{result:?}"
        );
    }

    /// Regression test: a client that stays connected but
    /// stopped reading held `emit_chunk` (and the instance, its thread and
    /// the tenant's quota) for ever. It must end at the invocation's deadline,
    /// as a timeout.
    #[test]
    fn emit_chunk_to_a_reader_that_stopped_ends_at_the_deadline() {
        const EMITTER: &str = r#"(module
          (import "tw:stream" "emit_chunk" (func $emit (param i32 i32) (result i32)))
          (memory (export "memory") 1)
          (func (export "flood") (result i32)
            (loop $more
              (br_if $more (i32.eqz (call $emit (i32.const 0) (i32.const 4096)))))
            (i32.const -1)))"#;
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path());
        let timeout_ms = 300;
        let spec = DeploySpec {
            timeout_ms: Some(timeout_ms),
            ..DeploySpec::export("emitter")
        };
        let id = rt.deploy(EMITTER.as_bytes(), spec).unwrap().record.id;
        // The reader takes nothing and stays connected: the buffer fills at once.
        let (tx, rx) = mpsc::channel::<Vec<u8>>(2);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let start = std::time::Instant::now();
        std::thread::spawn(move || {
            let io = StreamIo::new(Vec::new(), tx, StreamLimits::default());
            let _ = done_tx.send(rt.invoke_export_streaming(&id, "flood", &[], io));
        });
        let result = done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("emit_chunk still blocked 10 s after a 300 ms deadline");
        let took = start.elapsed();
        assert!(
            matches!(result, Err(RuntimeError::Timeout { timeout_ms: 300 })),
            "{result:?}"
        );
        // Generous for a loaded machine; the bound itself is deadline + a park wake-up.
        assert!(
            took < std::time::Duration::from_millis(timeout_ms + 1000),
            "ended after {took:?}"
        );
        drop(rx);
    }

    /// The same for a WASI command's stdout: a write still waiting for the
    /// client at the deadline ends the command as a timeout.
    #[test]
    fn a_command_writing_to_a_reader_that_stopped_ends_at_the_deadline() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path());
        let spec = DeploySpec {
            timeout_ms: Some(300),
            ..DeploySpec::wasi("flood")
        };
        let id = rt.deploy(FLOOD.as_bytes(), spec).unwrap().record.id;
        let (tx, rx) = mpsc::channel::<Vec<u8>>(2);
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let io = StreamIo::new(Vec::new(), tx, StreamLimits::default());
            let _ = done_tx.send(rt.invoke_command_streaming(&id, io));
        });
        let result = done_rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("stdout still blocked 10 s after a 300 ms deadline");
        assert!(
            matches!(result, Err(RuntimeError::Timeout { timeout_ms: 300 })),
            "{result:?}"
        );
        drop(rx);
    }

    #[test]
    fn export_functions_are_not_commands() {
        let dir = tempfile::tempdir().unwrap();
        let rt = runtime(dir.path());
        let wat = r#"(module (func (export "f")))"#;
        let id = rt
            .deploy(wat.as_bytes(), DeploySpec::export("f"))
            .unwrap()
            .record
            .id;
        assert!(matches!(
            rt.check_command_call(&id),
            Err(RuntimeError::WrongStyle(_))
        ));
        let (tx, _rx) = mpsc::channel(1);
        let io = StreamIo::new(Vec::new(), tx, StreamLimits::default());
        assert!(matches!(
            rt.invoke_command_streaming(&id, io),
            Err(RuntimeError::WrongStyle(_))
        ));
    }
}
