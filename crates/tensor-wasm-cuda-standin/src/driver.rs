//! The stand-in driver's state (contexts, streams, events, modules, functions, managed memory)
//! behind one lock, and the operations the exported functions call: the sticky-error rules,
//! module loading through the PTX parser, and launches through the interpreter — on a
//! created stream by the stream's worker (`streams.rs`), on the null stream at once.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::CStr;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Instant;

use tensor_wasm_ptx_emu::{check_launch, EmuError, Launch, Module};

use crate::config::{config, FaultAt};
use crate::memory::Allocations;
use crate::streams::{self, Job, Queue, Work};

/// The `CUresult` values the stand-in returns.
pub(crate) mod code {
    pub const SUCCESS: u32 = 0;
    pub const INVALID_VALUE: u32 = 1;
    pub const OUT_OF_MEMORY: u32 = 2;
    pub const INVALID_DEVICE: u32 = 101;
    pub const INVALID_CONTEXT: u32 = 201;
    pub const INVALID_PTX: u32 = 218;
    pub const UNSUPPORTED_PTX_VERSION: u32 = 222;
    pub const INVALID_HANDLE: u32 = 400;
    pub const NOT_FOUND: u32 = 500;
    pub const ILLEGAL_ADDRESS: u32 = 700;
    pub const NOT_SUPPORTED: u32 = 801;
}

/// Name and description of each result code the stand-in can return (and a few more a
/// caller may ask about).
const ERRORS: &[(u32, &CStr, &CStr)] = &[
    (0, c"CUDA_SUCCESS", c"no error"),
    (1, c"CUDA_ERROR_INVALID_VALUE", c"invalid argument"),
    (2, c"CUDA_ERROR_OUT_OF_MEMORY", c"out of memory"),
    (3, c"CUDA_ERROR_NOT_INITIALIZED", c"initialization error"),
    (
        100,
        c"CUDA_ERROR_NO_DEVICE",
        c"no CUDA-capable device is detected",
    ),
    (101, c"CUDA_ERROR_INVALID_DEVICE", c"invalid device ordinal"),
    (
        200,
        c"CUDA_ERROR_INVALID_IMAGE",
        c"device kernel image is invalid",
    ),
    (
        201,
        c"CUDA_ERROR_INVALID_CONTEXT",
        c"invalid device context",
    ),
    (
        218,
        c"CUDA_ERROR_INVALID_PTX",
        c"a PTX JIT compilation failed",
    ),
    (
        222,
        c"CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        c"the provided PTX was compiled with an unsupported toolchain.",
    ),
    (
        400,
        c"CUDA_ERROR_INVALID_HANDLE",
        c"invalid resource handle",
    ),
    (500, c"CUDA_ERROR_NOT_FOUND", c"named symbol not found"),
    (600, c"CUDA_ERROR_NOT_READY", c"device not ready"),
    (
        700,
        c"CUDA_ERROR_ILLEGAL_ADDRESS",
        c"an illegal memory access was encountered",
    ),
    (
        702,
        c"CUDA_ERROR_LAUNCH_TIMEOUT",
        c"the launch timed out and was terminated",
    ),
    (716, c"CUDA_ERROR_MISALIGNED_ADDRESS", c"misaligned address"),
    (
        719,
        c"CUDA_ERROR_LAUNCH_FAILED",
        c"unspecified launch failure",
    ),
    (801, c"CUDA_ERROR_NOT_SUPPORTED", c"operation not supported"),
];

/// Name and description of `result`, if the stand-in knows it.
pub(crate) fn error_text(result: u32) -> Option<(&'static CStr, &'static CStr)> {
    ERRORS
        .iter()
        .find(|(code, _, _)| *code == result)
        .map(|&(_, name, text)| (name, text))
}

/// The newest PTX ISA each driver version loads (from the PTX ISA release notes), newest
/// driver first.
const DRIVER_PTX: &[(i32, (u32, u32))] = &[
    (13000, (9, 0)),
    (12090, (8, 8)),
    (12080, (8, 7)),
    (12050, (8, 5)),
    (12040, (8, 4)),
    (12030, (8, 3)),
    (12020, (8, 2)),
    (12010, (8, 1)),
    (12000, (8, 0)),
    (11080, (7, 8)),
];

/// The newest PTX ISA the configured driver version loads.
fn max_ptx_version() -> (u32, u32) {
    let driver = config().driver_version;
    DRIVER_PTX
        .iter()
        .find(|(first, _)| driver >= *first)
        .map_or((7, 0), |&(_, isa)| isa)
}

#[derive(Debug, Default)]
struct Context {
    /// A fault every later call in this context reports.
    sticky: Option<u32>,
    /// A fault not yet reported, and what reports it.
    pending: Option<(FaultAt, u32)>,
}

/// All driver state.
#[derive(Debug, Default)]
pub(crate) struct Driver {
    next_handle: usize,
    contexts: HashMap<usize, Context>,
    /// The primary context and its retain count.
    primary: Option<(usize, u32)>,
    streams: HashMap<usize, usize>,
    /// Each created stream's queue, and its work not yet done.
    workers: HashMap<usize, Arc<Queue>>,
    outstanding: HashMap<usize, u64>,
    /// Launches queued or running, by id: the allocations each uses.
    in_flight: HashMap<u64, Vec<(u64, usize)>>,
    next_launch: u64,
    /// Allocations advised to prefer the host: a 4-byte one is a launch's live word.
    pub host_preferred: HashSet<u64>,
    /// Each event's context, when it was last recorded, and whether the work before that
    /// record is done.
    events: HashMap<usize, (usize, Option<Instant>, bool)>,
    modules: HashMap<usize, (usize, Arc<Module>)>,
    functions: HashMap<usize, (Arc<Module>, String)>,
    pub memory: Allocations,
    /// Launches of kernels the fault injection matches.
    matched_launches: u64,
}

static DRIVER: LazyLock<Mutex<Driver>> = LazyLock::new(Mutex::default);

thread_local! {
    static CURRENT: Cell<usize> = const { Cell::new(0) };
}

/// The driver state, locked.
pub(crate) fn driver() -> MutexGuard<'static, Driver> {
    DRIVER.lock().unwrap_or_else(|poison| poison.into_inner())
}

/// This thread's current context (0: none).
pub(crate) fn current() -> usize {
    CURRENT.with(Cell::get)
}

pub(crate) type Outcome<T> = Result<T, u32>;

impl Driver {
    fn handle(&mut self) -> usize {
        self.next_handle += 1;
        0x7a00_0000 + self.next_handle * 16
    }

    pub fn retain_primary(&mut self) -> usize {
        match &mut self.primary {
            Some((ctx, refs)) => {
                *refs += 1;
                *ctx
            }
            None => {
                let ctx = self.handle();
                self.contexts.insert(ctx, Context::default());
                self.primary = Some((ctx, 1));
                ctx
            }
        }
    }

    /// Releases one reference; the primary context keeps its state (a real driver resets it
    /// at zero references, which nothing here relies on).
    pub fn release_primary(&mut self) -> Outcome<()> {
        match &mut self.primary {
            Some((_, refs)) if *refs > 0 => {
                *refs -= 1;
                Ok(())
            }
            _ => Err(code::INVALID_CONTEXT),
        }
    }

    pub fn create_context(&mut self) -> usize {
        let ctx = self.handle();
        self.contexts.insert(ctx, Context::default());
        ctx
    }

    pub fn destroy_context(&mut self, ctx: usize) -> Outcome<()> {
        if self.primary.is_some_and(|(primary, _)| primary == ctx) {
            return Err(code::INVALID_CONTEXT);
        }
        self.contexts.remove(&ctx).ok_or(code::INVALID_CONTEXT)?;
        let streams: Vec<usize> = self
            .streams
            .iter()
            .filter(|(_, owner)| **owner == ctx)
            .map(|(&stream, _)| stream)
            .collect();
        for stream in streams {
            self.destroy_stream(stream)?;
        }
        self.events.retain(|_, (owner, _, _)| *owner != ctx);
        if current() == ctx {
            set_current(0);
        }
        Ok(())
    }

    pub fn is_context(&self, ctx: usize) -> bool {
        self.contexts.contains_key(&ctx)
    }

    /// The sticky error of `ctx`, if any.
    pub fn check(&self, ctx: usize) -> Outcome<()> {
        match self.contexts.get(&ctx) {
            None => Err(code::INVALID_CONTEXT),
            Some(Context {
                sticky: Some(error),
                ..
            }) => Err(*error),
            Some(_) => Ok(()),
        }
    }

    /// The current context, checked for a sticky error.
    pub fn current_checked(&self) -> Outcome<usize> {
        let ctx = current();
        self.check(ctx)?;
        Ok(ctx)
    }

    /// Reports a pending fault of `ctx` that `at` reports (it becomes sticky), then any
    /// sticky error.
    pub fn report(&mut self, ctx: usize, at: FaultAt) -> Outcome<()> {
        let context = self.contexts.get_mut(&ctx).ok_or(code::INVALID_CONTEXT)?;
        if let Some((when, error)) = context.pending {
            if when == at || (at == FaultAt::Sync && when == FaultAt::EventRecord) {
                context.pending = None;
                context.sticky = Some(error);
            }
        }
        self.check(ctx)
    }

    /// The context of `stream` (the null and per-thread streams: the current context).
    pub fn stream_context(&self, stream: usize) -> Outcome<usize> {
        if stream == 0 || stream == 2 {
            let ctx = current();
            return if self.is_context(ctx) {
                Ok(ctx)
            } else {
                Err(code::INVALID_CONTEXT)
            };
        }
        self.streams
            .get(&stream)
            .copied()
            .ok_or(code::INVALID_HANDLE)
    }

    pub fn create_stream(&mut self) -> Outcome<usize> {
        let ctx = self.current_checked()?;
        let stream = self.handle();
        self.streams.insert(stream, ctx);
        self.workers.insert(stream, streams::spawn(stream));
        Ok(stream)
    }

    /// Destroys `stream`; work already queued on it still runs (as CUDA does).
    pub fn destroy_stream(&mut self, stream: usize) -> Outcome<()> {
        self.streams.remove(&stream).ok_or(code::INVALID_HANDLE)?;
        if let Some(queue) = self.workers.remove(&stream) {
            queue.push(Work::Stop);
        }
        Ok(())
    }

    /// Whether `stream` has work not yet done.
    pub fn busy(&self, stream: usize) -> bool {
        self.outstanding.get(&stream).is_some_and(|&n| n > 0)
    }

    /// Whether a stream of `ctx` has work not yet done.
    pub fn context_busy(&self, ctx: usize) -> bool {
        self.streams
            .iter()
            .any(|(&stream, &owner)| owner == ctx && self.busy(stream))
    }

    /// Whether a queued or running launch uses the allocation at `base`.
    pub fn in_use(&self, base: u64) -> bool {
        self.in_flight
            .values()
            .any(|regions| regions.iter().any(|&(b, _)| b == base))
    }

    /// Whether `event`'s record is done (or it is gone).
    pub fn event_done(&self, event: usize) -> bool {
        self.events.get(&event).is_none_or(|&(_, _, done)| done)
    }

    /// Records `event` on `stream`: at once on the null stream, after the work queued
    /// before it on a created one.
    pub fn record_event(&mut self, event: usize, stream: usize) {
        match self.workers.get(&stream) {
            Some(queue) => {
                if let Some((_, _, done)) = self.events.get_mut(&event) {
                    *done = false;
                }
                *self.outstanding.entry(stream).or_default() += 1;
                queue.push(Work::Record(event));
            }
            None => self.stamp_event(event),
        }
    }

    /// A stream's worker has reached an event's record.
    pub(crate) fn finish_record(&mut self, stream: usize, event: usize) {
        self.stamp_event(event);
        self.done(stream);
    }

    /// A stream's worker has run a launch: a fault is the context's, as after a launch on
    /// a device.
    pub(crate) fn finish_launch(&mut self, job: &Job, outcome: Result<(), EmuError>) {
        self.in_flight.remove(&job.id);
        self.fault(job.ctx, outcome);
        self.done(job.stream);
    }

    fn done(&mut self, stream: usize) {
        if let Some(n) = self.outstanding.get_mut(&stream) {
            *n = n.saturating_sub(1);
        }
    }

    /// Notes a launch's fault in `ctx`: the next synchronization reports it (then sticky).
    /// A launch its live word ended is no fault: the kernel stopped, as it does on a GPU.
    fn fault(&mut self, ctx: usize, outcome: Result<(), EmuError>) {
        let error = match outcome {
            Ok(()) | Err(EmuError::Cancelled { .. }) => return,
            Err(error) => error,
        };
        eprintln!("tensor-wasm stand-in driver: {error}");
        let (result, _) = error.cuda_result();
        if let Some(context) = self.contexts.get_mut(&ctx) {
            context.pending.get_or_insert((FaultAt::Sync, result));
        }
    }

    pub fn create_event(&mut self) -> Outcome<usize> {
        let ctx = self.current_checked()?;
        let event = self.handle();
        self.events.insert(event, (ctx, None, true));
        Ok(event)
    }

    pub fn event_context(&self, event: usize) -> Outcome<usize> {
        self.events
            .get(&event)
            .map(|&(ctx, _, _)| ctx)
            .ok_or(code::INVALID_HANDLE)
    }

    /// Notes when `event` was recorded (the launches before it have completed by then).
    fn stamp_event(&mut self, event: usize) {
        if let Some((_, stamp, done)) = self.events.get_mut(&event) {
            *stamp = Some(Instant::now());
            *done = true;
        }
    }

    /// Host milliseconds between the records of `start` and `end`: the interpreter's wall
    /// time, never a GPU time.
    pub fn elapsed_ms(&self, start: usize, end: usize) -> Outcome<f32> {
        let stamp = |event: usize| match self.events.get(&event) {
            Some(&(_, Some(stamp), true)) => Ok(stamp),
            // Never recorded, or no such event.
            _ => Err(code::INVALID_HANDLE),
        };
        let (start, end) = (stamp(start)?, stamp(end)?);
        Ok(end.saturating_duration_since(start).as_secs_f32() * 1000.0)
    }

    pub fn destroy_event(&mut self, event: usize) -> Outcome<()> {
        self.events
            .remove(&event)
            .map(drop)
            .ok_or(code::INVALID_HANDLE)
    }

    /// Loads a module from `image` (NUL-terminated PTX text) into the current context.
    pub fn load_module(&mut self, image: &[u8]) -> Outcome<usize> {
        let ctx = self.current_checked()?;
        if image.starts_with(b"\x7fELF") || image.starts_with(&[0x50, 0xed, 0x55, 0xba]) {
            return Err(code::NOT_SUPPORTED);
        }
        if config().invalid_ptx {
            return Err(code::INVALID_PTX);
        }
        let text = std::str::from_utf8(image).map_err(|_| code::INVALID_PTX)?;
        if ptx_version(text).is_some_and(|version| version > max_ptx_version()) {
            return Err(code::UNSUPPORTED_PTX_VERSION);
        }
        let module = Module::parse(text).map_err(|error| {
            eprintln!("tensor-wasm stand-in driver: module load: {error}");
            error.cuda_result().0
        })?;
        let handle = self.handle();
        self.modules.insert(handle, (ctx, Arc::new(module)));
        Ok(handle)
    }

    pub fn unload_module(&mut self, module: usize) -> Outcome<()> {
        self.modules.remove(&module).ok_or(code::INVALID_HANDLE)?;
        Ok(())
    }

    pub fn get_function(&mut self, module: usize, name: &str) -> Outcome<usize> {
        let (_, loaded) = self.modules.get(&module).ok_or(code::INVALID_HANDLE)?;
        loaded.kernel(name).ok_or(code::NOT_FOUND)?;
        let loaded = Arc::clone(loaded);
        let handle = self.handle();
        self.functions.insert(handle, (loaded, name.to_owned()));
        Ok(handle)
    }

    /// Offset and size of parameter `index` of `function`.
    pub fn param_info(&self, function: usize, index: usize) -> Outcome<(usize, usize)> {
        let (module, name) = self.functions.get(&function).ok_or(code::INVALID_HANDLE)?;
        let kernel = module.kernel(name).ok_or(code::INVALID_HANDLE)?;
        let param = kernel.params().get(index).ok_or(code::INVALID_VALUE)?;
        Ok((param.offset as usize, param.size as usize))
    }

    /// The parameter sizes of `function`.
    pub fn param_sizes(&self, function: usize) -> Outcome<Vec<usize>> {
        let (module, name) = self.functions.get(&function).ok_or(code::INVALID_HANDLE)?;
        let kernel = module.kernel(name).ok_or(code::INVALID_HANDLE)?;
        Ok(kernel.params().iter().map(|p| p.size as usize).collect())
    }

    /// Submits `function` to `stream`: a created stream's worker runs it, the null stream
    /// at once. `values` holds each parameter's bytes. A launch the interpreter would refuse
    /// (bad dimensions or parameters) is refused here, before anything runs.
    pub fn launch(
        &mut self,
        function: usize,
        grid: [u32; 3],
        block: [u32; 3],
        shared: u32,
        stream: usize,
        values: &[&[u8]],
    ) -> Outcome<()> {
        let ctx = self.stream_context(stream)?;
        self.check(ctx)?;
        let (module, name) = self.functions.get(&function).ok_or(code::INVALID_HANDLE)?;
        let (module, name) = (Arc::clone(module), name.clone());
        let kernel = module.kernel(&name).ok_or(code::INVALID_HANDLE)?;
        let settings = config();
        if let Some(at) = settings.fault {
            let matches = settings
                .fault_kernel
                .as_deref()
                .is_none_or(|part| name.contains(part));
            if matches {
                self.matched_launches += 1;
                if self.matched_launches == settings.fault_at {
                    let context = self.contexts.get_mut(&ctx).ok_or(code::INVALID_CONTEXT)?;
                    eprintln!("tensor-wasm stand-in driver: injected fault in launch of {name}");
                    if at == FaultAt::Launch {
                        context.sticky = Some(code::ILLEGAL_ADDRESS);
                        return Err(code::ILLEGAL_ADDRESS);
                    }
                    context.pending = Some((at, code::ILLEGAL_ADDRESS));
                    return Ok(());
                }
            }
        }
        let params = kernel
            .pack_params(values)
            .map_err(|error| error.cuda_result().0)?;
        // The allocations the pointer parameters point into (the end address included, for
        // an empty buffer at the end of one): the memory this launch may touch.
        let mut regions: Vec<(u64, usize)> = values
            .iter()
            .filter_map(|value| <[u8; 8]>::try_from(*value).ok())
            .map(u64::from_le_bytes)
            .filter_map(|address| {
                self.memory
                    .holding(address)
                    .or_else(|| self.memory.holding(address.checked_sub(1)?))
            })
            .collect();
        regions.sort_unstable();
        regions.dedup();
        let word = regions
            .iter()
            .find(|&&(base, len)| len == 4 && self.host_preferred.contains(&base))
            .map(|&(base, _)| base);
        regions.retain(|&(base, _)| Some(base) != word);
        let mut checked = Launch::new(grid, block, &params);
        checked.dynamic_shared_bytes = shared;
        if let Err(error) = check_launch(kernel, &checked, &regions) {
            eprintln!("tensor-wasm stand-in driver: {error}");
            return Err(error.cuda_result().0);
        }
        self.next_launch += 1;
        let job = Job {
            id: self.next_launch,
            ctx,
            stream,
            module: Arc::clone(&module),
            name,
            params,
            grid,
            block,
            shared,
            schedule: settings.schedule,
            step_limit: settings.step_limit,
            regions: regions.clone(),
            word,
        };
        let mut used = regions;
        used.extend(word.map(|base| (base, 4)));
        match self.workers.get(&stream) {
            Some(queue) => {
                self.in_flight.insert(job.id, used);
                *self.outstanding.entry(stream).or_default() += 1;
                queue.push(Work::Launch(job));
            }
            None => {
                // The null stream: run now, under the lock, as every launch once did.
                let outcome = streams::run(&job);
                self.fault(ctx, outcome);
            }
        }
        Ok(())
    }
}

/// Makes `ctx` this thread's current context.
pub(crate) fn set_current(ctx: usize) {
    CURRENT.with(|current| current.set(ctx));
}

/// The `.version major.minor` of a PTX text.
fn ptx_version(text: &str) -> Option<(u32, u32)> {
    let line = text
        .lines()
        .map(str::trim)
        .find(|line| line.starts_with(".version"))?;
    let (major, minor) = line.strip_prefix(".version")?.trim().split_once('.')?;
    Some((major.parse().ok()?, minor.trim().parse().ok()?))
}

#[cfg(test)]
mod tests {
    use super::ptx_version;

    #[test]
    fn the_ptx_version_is_read_from_its_directive() {
        assert_eq!(
            ptx_version("// x\n.version 9.5\n.target sm_90"),
            Some((9, 5))
        );
        assert_eq!(ptx_version("  .version 8.0 \n"), Some((8, 0)));
        assert_eq!(ptx_version(".target sm_90"), None);
    }
}
