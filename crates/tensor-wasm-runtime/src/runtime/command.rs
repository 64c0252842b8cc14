//! WASI commands: stdin in, stdout and an exit code out, buffered
//! ([`CommandOutput`]) or streamed as it is written. A command is a core module's `_start`
//! (WASI preview 1) or a component's `wasi:cli/run` (WASI 0.2), run with the same limits.

use std::sync::Arc;
use std::time::Instant;

use wasmtime::Store;
use wasmtime_wasi::p2::bindings::CommandPre;
use wasmtime_wasi::p2::pipe::{MemoryInputPipe, MemoryOutputPipe};
use wasmtime_wasi::{I32Exit, WasiCtxBuilder};

use crate::component::{ComponentState, LoadedComponent};
use crate::error::{Result, RuntimeError};
use crate::function_entry::{FunctionEntry, Prepared};
use crate::invocation_state::{classify, InvocationState};
use crate::store::{FunctionRecord, InvocationStyle};
use crate::Runtime;

/// Largest stderr a command may write before it traps; the tail is reported.
const STDERR_CAP: usize = 1 << 20;

/// Result of a WASI command invocation.
#[derive(Debug, Clone)]
pub struct CommandOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    /// The last `stderr_tail_bytes` bytes of stderr.
    pub stderr_tail: Vec<u8>,
    /// Whether stderr was longer than the tail.
    pub stderr_truncated: bool,
}

impl Runtime {
    /// Runs a WASI command function with `stdin` and returns what it wrote.
    pub fn invoke_command(&self, id: &str, stdin: Vec<u8>) -> Result<CommandOutput> {
        let start = Instant::now();
        let result = self.invoke_command_inner(id, stdin);
        self.finish(start, &result);
        result
    }

    fn invoke_command_inner(&self, id: &str, stdin: Vec<u8>) -> Result<CommandOutput> {
        let entry = self.entry(id)?;
        let record = &entry.record;
        if record.style != InvocationStyle::Wasi {
            return Err(Runtime::wrong_style(id, record.style));
        }
        let runner = self.command_runner(&entry)?;
        let _slot = self.take_slot()?;
        let cap = self.inner.config.max_output_bytes;
        let stdout = MemoryOutputPipe::new(cap);
        let (mut store, stderr, run) = self.run_command(&runner, record, stdin, stdout.clone());
        let exit_code = match run {
            Ok(code) => code,
            Err(e) => {
                let stdout_full = stdout.contents().len() >= cap
                    || format!("{e:#}").contains("beyond capacity of MemoryOutputPipe")
                        && stdout.contents().len() + 4096 > cap;
                if stdout_full {
                    return Err(RuntimeError::OutputTooLarge(cap));
                }
                log_stderr(record, &stderr.contents());
                return Err(store.classify(e, &record.limits));
            }
        };
        drop(store);
        let stderr = stderr.contents();
        log_stderr(record, &stderr);
        let tail = self.inner.config.stderr_tail_bytes;
        let skip = stderr.len().saturating_sub(tail);
        Ok(CommandOutput {
            exit_code,
            stdout: stdout.contents().to_vec(),
            stderr_tail: stderr[skip..].to_vec(),
            stderr_truncated: skip > 0,
        })
    }

    /// Checks that function `id` is a WASI command, loading it, without
    /// running anything (so a streaming response can still answer a 4xx).
    pub fn check_command_call(&self, id: &str) -> Result<()> {
        let entry = self.entry(id)?;
        if entry.record.style != InvocationStyle::Wasi {
            return Err(Runtime::wrong_style(id, entry.record.style));
        }
        self.command_runner(&entry).map(drop)
    }

    /// Runs WASI command `id` with `io`'s input as stdin; each write to
    /// stdout goes to `io`'s channel as a chunk as soon as it is written
    /// (blocking while the buffer is full), under `io`'s caps. A write after
    /// the client has gone stops the guest with [`RuntimeError::ClientGone`];
    /// stdout past the per-invocation cap stops it with
    /// [`RuntimeError::OutputTooLarge`].
    pub fn invoke_command_streaming(
        &self,
        id: &str,
        io: crate::stream::StreamIo,
    ) -> Result<crate::stream::CommandExit> {
        let start = Instant::now();
        let result = self.invoke_command_streaming_inner(id, io);
        self.finish(start, &result);
        result
    }

    fn invoke_command_streaming_inner(
        &self,
        id: &str,
        io: crate::stream::StreamIo,
    ) -> Result<crate::stream::CommandExit> {
        let entry = self.entry(id)?;
        let record = &entry.record;
        if record.style != InvocationStyle::Wasi {
            return Err(Runtime::wrong_style(id, record.style));
        }
        let runner = self.command_runner(&entry)?;
        let _slot = self.take_slot()?;
        // The invocation's deadline (the store's starts a moment later).
        let deadline =
            std::time::Instant::now() + std::time::Duration::from_millis(record.limits.timeout_ms);
        let (stdin, stdout) = io.into_stdout(deadline);
        let (mut store, stderr, run) = self.run_command(&runner, record, stdin, stdout.clone());
        let exit_code = match run {
            Ok(code) => code,
            Err(e) => {
                log_stderr(record, &stderr.contents());
                if let Some(cap) = e.downcast_ref::<crate::stream::OutputCapExceeded>() {
                    return Err(RuntimeError::OutputTooLarge(
                        usize::try_from(cap.0).unwrap_or(usize::MAX),
                    ));
                }
                return Err(store.classify(e, &record.limits));
            }
        };
        // The stream ends when the last sender (the store's, then ours) is gone.
        drop(store);
        let stdout_bytes = stdout.written();
        drop(stdout);
        let stderr = stderr.contents();
        log_stderr(record, &stderr);
        let tail = self.inner.config.stderr_tail_bytes;
        let skip = stderr.len().saturating_sub(tail);
        Ok(crate::stream::CommandExit {
            exit_code,
            stdout_bytes,
            stderr_tail: stderr[skip..].to_vec(),
            stderr_truncated: skip > 0,
        })
    }

    /// How function `entry` runs as a command: a core module's `_start` or a component's
    /// `wasi:cli/run`, loaded if needed.
    fn command_runner(&self, entry: &FunctionEntry) -> Result<Runner> {
        if !entry.record.component {
            return Ok(Runner::Core(self.prepared(entry)?));
        }
        match self.component_of(entry)? {
            LoadedComponent::Command(command) => Ok(Runner::Component(command)),
            LoadedComponent::Exports(_) => Err(Runtime::wrong_style(
                &entry.record.id,
                InvocationStyle::Export,
            )),
            LoadedComponent::Http(_) => Err(Runtime::wrong_style(
                &entry.record.id,
                InvocationStyle::Http,
            )),
        }
    }

    /// Instantiates a command with `stdin`, `stdout` and a captured stderr, and runs it:
    /// `Ok(exit code)` when it returned or exited, the guest's error otherwise.
    fn run_command(
        &self,
        runner: &Runner,
        record: &FunctionRecord,
        stdin: impl Into<bytes::Bytes>,
        stdout: impl wasmtime_wasi::cli::StdoutStream + 'static,
    ) -> (CommandStore, MemoryOutputPipe, wasmtime::Result<i32>) {
        let stderr = MemoryOutputPipe::new(STDERR_CAP);
        let mut wasi = WasiCtxBuilder::new();
        wasi.stdin(MemoryInputPipe::new(stdin))
            .stdout(stdout)
            .stderr(stderr.clone())
            .monotonic_clock(crate::wasi_poll::ProcessClock)
            .arg(&record.name);
        let (store, run) = match runner {
            Runner::Core(prepared) => {
                let (mut store, instance) =
                    self.instantiate(prepared, record, Some(wasi.build_p1()));
                let run = instance.and_then(|instance| {
                    instance
                        .get_typed_func::<(), ()>(&mut store, "_start")?
                        .call(&mut store, ())
                });
                (CommandStore::Core(store), run)
            }
            Runner::Component(pre) => {
                let mut store = self.component_store(record, wasi.build());
                let deadline = store.data().deadline;
                let run =
                    crate::component::run_until(deadline, &self.cancelled("command"), async {
                        let command = crate::component::instantiate_retrying!(
                            pre.instantiate_async(&mut store)
                        )?;
                        match command.wasi_cli_run().call_run(&mut store).await? {
                            Ok(()) => Ok(()),
                            // `run` returned an error: the exit code a failing command has.
                            Err(()) => Err(wasmtime::Error::new(I32Exit(1))),
                        }
                    });
                (CommandStore::Component(store), run)
            }
        };
        let code = match run {
            Ok(()) => Ok(0),
            Err(e) => match e.downcast_ref::<I32Exit>() {
                Some(exit) => Ok(exit.0),
                None => Err(e),
            },
        };
        (store, stderr, code)
    }
}

impl Runtime {
    /// The counter of component invocations of `style` dropped at their deadline.
    pub(super) fn cancelled(&self, style: &str) -> prometheus::IntCounter {
        self.inner
            .metrics
            .component_deadline_cancellations
            .with_label_values(&[style])
    }

    /// A store for one invocation of component function `record`: its WASI context, its
    /// memory limit over all the component's memories (and over its GPU buffers), its deadline
    /// and fuel.
    pub(super) fn component_store(
        &self,
        record: &FunctionRecord,
        ctx: wasmtime_wasi::WasiCtx,
    ) -> Store<ComponentState> {
        let limits = &record.limits;
        let mut state = ComponentState::new(
            ctx,
            limits.memory_limit_bytes,
            self.inner.config.component_limits,
            self.inner.config.outgoing_http_allow.clone(),
        );
        let deadline = Instant::now() + std::time::Duration::from_millis(limits.timeout_ms);
        state.set_deadline(deadline);
        // Buffers of `tensor-wasm:gpu` share the memory limit with linear memory; their arena
        // is reserved on first use.
        state.gpu = Some(crate::component_gpu::ComponentGpu::new(
            self.inner.gpu.clone(),
            &record.tenant,
            &record.id,
            limits.raw_ptx,
            deadline,
            self.is_uvm_backed(),
            limits.memory_limit_bytes,
        ));
        state.nn = Some(crate::nn::NnHost::new(
            self.inner.nn.clone(),
            self.inner.gpu.clone(),
            &record.tenant,
            &record.id,
            deadline,
            state.budget.nn_bytes(),
            self.is_uvm_backed(),
        ));
        let mut store = Store::new(&self.inner.components.engine, state);
        store.limiter(|s| &mut s.budget);
        // What one call lifts from the guest (a typed export's results included) is bounded
        // by the memory limit before it becomes host values.
        store.set_hostcall_fuel(usize::try_from(limits.memory_limit_bytes).unwrap_or(usize::MAX));
        store.set_epoch_deadline(self.deadline_ticks(limits));
        store.epoch_deadline_trap();
        if self.inner.config.fuel_enabled {
            store
                .set_fuel(limits.fuel.unwrap_or(u64::MAX))
                .expect("fuel is enabled in the component engine");
        }
        store
    }
}

/// A command ready to run: a core module with `_start`, or a component with `wasi:cli/run`.
enum Runner {
    Core(Arc<Prepared>),
    Component(Arc<CommandPre<ComponentState>>),
}

/// The store a command ran in, kept until its failure is classified.
pub(super) enum CommandStore {
    Core(Store<InvocationState>),
    Component(Store<ComponentState>),
}

impl CommandStore {
    /// The runtime's error for guest failure `e` (a limit the store saw hit first).
    pub(super) fn classify(
        &mut self,
        e: wasmtime::Error,
        limits: &crate::store::FunctionLimits,
    ) -> RuntimeError {
        match self {
            CommandStore::Core(store) => classify(e, store, limits),
            CommandStore::Component(store) => match store.data_mut().budget.hit.take() {
                Some(message) => RuntimeError::MemoryLimit(message),
                None => crate::component_charge::classify(e, limits, store.data()),
            },
        }
    }
}

/// The WASI context of a component invocation that takes no stdin (a typed export, an HTTP
/// handler): its stderr captured (at most `cap` bytes; logged, not returned), the process
/// clock, the function's name as `argv[0]`.
pub(super) fn quiet_component_ctx(
    record: &FunctionRecord,
    cap: usize,
) -> (wasmtime_wasi::WasiCtx, MemoryOutputPipe) {
    let stderr = MemoryOutputPipe::new(cap);
    let ctx = WasiCtxBuilder::new()
        .stderr(stderr.clone())
        .monotonic_clock(crate::wasi_poll::ProcessClock)
        .arg(&record.name)
        .build();
    (ctx, stderr)
}

/// Logs the last 4 KiB of a guest's stderr, if it wrote any.
pub(super) fn log_stderr(record: &FunctionRecord, stderr: &[u8]) {
    if !stderr.is_empty() {
        tracing::info!(
            function = %record.id,
            stderr = %String::from_utf8_lossy(&stderr[stderr.len().saturating_sub(4096)..]),
            "guest stderr"
        );
    }
}
