//! The CPU backend: the builtin kernels on a fixed pool of worker threads, with the same
//! per-element arithmetic as the PTX kernels so results are bit-identical, and host-described
//! programs ([`KernelProgram::run_cpu`]) on the same pool.

use std::collections::VecDeque;
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::thread::JoinHandle;

use crate::completion::Signal;
use crate::kernel::{KernelKind, ProgramKernel};
use crate::program::{ProgramCache, PROGRAM_CACHE_CAPACITY};
use crate::validate::{self, BuiltinCall};
use crate::{
    Backend, BuiltinKernel, Completion, Device, GpuError, GpuIsolation, Kernel, KernelArg,
    KernelProgram, LaunchConfig, TenantKey, TenantLaneStats,
};

/// Elementwise kernels: fewer elements than this per task are not worth another thread.
const MIN_ELEMENTS_PER_TASK: usize = 1 << 15;
/// Matmul: fewer multiply-adds than this per task are not worth another thread.
const MIN_MULADDS_PER_TASK: u64 = 1 << 17;
/// Matmul register/L1 tile: rows computed together, sharing each loaded row segment of `b`.
const TILE_ROWS: usize = 4;
/// Matmul tile width in columns (accumulators stay in a local array the compiler vectorises).
const TILE_COLS: usize = 64;

/// Runs the builtin kernels on the host.
///
/// Tenants: the CPU has no streams or contexts, so the tenant key of loads and launches is
/// ignored, the level it may name included (every tenant's work shares the one worker pool,
/// first come first served), and the isolation level is only reported.
pub(crate) struct CpuBackend {
    device: Device,
    pool: WorkerPool,
    programs: ProgramCache<Kernel>,
    isolation: GpuIsolation,
}

impl CpuBackend {
    /// Starts one worker per available core.
    pub(crate) fn new() -> Result<Self, GpuError> {
        let workers = std::thread::available_parallelism().map_or(1, |n| n.get());
        Self::with_workers(workers)
    }

    pub(crate) fn with_workers(workers: usize) -> Result<Self, GpuError> {
        Ok(Self {
            device: Device::Cpu,
            pool: WorkerPool::start(workers.max(1))?,
            programs: ProgramCache::new(PROGRAM_CACHE_CAPACITY),
            isolation: GpuIsolation::default(),
        })
    }

    /// The isolation level to report (the CPU backend has nothing to isolate it with).
    pub(crate) fn with_isolation(mut self, isolation: GpuIsolation) -> Self {
        self.isolation = isolation;
        self
    }

    /// How many programs this backend has loaded (cache misses), for tests.
    #[cfg(test)]
    pub(crate) fn program_loads(&self) -> u64 {
        self.programs.loads()
    }

    /// Queues `parts` of `work` over `memory` on the pool and returns their completion.
    ///
    /// # Safety
    /// `work` was validated against `memory` and its parts are disjoint (see
    /// [`JobWork::run`]); the caller holds the duty of [`Backend::launch_unscoped`] for the
    /// returned completion: it must not be leaked.
    unsafe fn submit<'m>(
        &self,
        work: JobWork,
        parts: Vec<Range<usize>>,
        memory: &'m mut [u8],
    ) -> Completion<'m> {
        if parts.is_empty() {
            return Completion::finished(Ok(()));
        }
        let signal = Signal::new();
        let job = Arc::new(CpuJob {
            work,
            memory: GuestMemory(memory.as_mut_ptr()),
            memory_len: memory.len(),
            tasks_left: AtomicUsize::new(parts.len()),
            failure: Mutex::new(None),
            signal: signal.clone(),
        });
        self.pool.submit(parts.into_iter().map(|part| Task {
            job: job.clone(),
            part,
        }));
        Completion::pending(signal)
    }
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("workers", &self.pool.workers.len())
            .finish()
    }
}

impl Backend for CpuBackend {
    fn device(&self) -> &Device {
        &self.device
    }

    fn load_builtin(&self, kernel: BuiltinKernel) -> Result<Kernel, GpuError> {
        Ok(Kernel::builtin(kernel))
    }

    fn load_ptx(&self, _tenant: &TenantKey, _ptx: &str, entry: &str) -> Result<Kernel, GpuError> {
        Err(GpuError::NotAvailable(format!(
            "raw PTX needs a CUDA device; this host runs the CPU backend, which has only the \
             builtin kernels (cannot load entry `{entry}`)"
        )))
    }

    fn load_cubin(
        &self,
        _tenant: &TenantKey,
        _cubin: &[u8],
        entry: &str,
    ) -> Result<Kernel, GpuError> {
        Err(GpuError::NotAvailable(format!(
            "a cubin needs a CUDA device; this host runs the CPU backend (cannot load entry \
             `{entry}`)"
        )))
    }

    fn load_program(
        &self,
        _tenant: &TenantKey,
        program: Arc<dyn KernelProgram>,
    ) -> Result<Kernel, GpuError> {
        self.programs.get_or_load(program.fingerprint(), || {
            Ok(Kernel {
                kind: KernelKind::Program(Arc::new(ProgramKernel {
                    program,
                    function: None,
                })),
            })
        })
    }

    unsafe fn launch_unscoped<'m>(
        &self,
        _tenant: &TenantKey,
        kernel: &Kernel,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &'m mut [u8],
    ) -> Result<Completion<'m>, GpuError> {
        validate::check_config(config)?;
        let builtin = match &kernel.kind {
            KernelKind::Builtin(builtin) => *builtin,
            KernelKind::Ptx(function) => {
                validate::check_buffers(function.entry(), args, memory.len())?;
                return Err(GpuError::NotAvailable(format!(
                    "kernel `{}` is raw PTX or cubin, which needs a CUDA device; this is the \
                     CPU backend",
                    function.entry()
                )));
            }
            KernelKind::Program(loaded) => {
                // Any loaded program runs here, whichever backend loaded it: `run_cpu` needs
                // nothing but the program.
                let program = &loaded.program;
                validate::check_buffers(program.name(), args, memory.len())?;
                program.validate(config, args, memory.len())?;
                let work = JobWork::Program {
                    program: program.clone(),
                    config: *config,
                    args: args.to_vec(),
                };
                // SAFETY: the program validated the launch against `memory` above and runs as
                // one task (its part is unused: `run_cpu` is the whole launch); the completion
                // is returned under this function's own no-leak contract.
                return Ok(unsafe { self.submit(work, vec![Range::default()], memory) });
            }
        };
        let call = validate::plan_builtin(builtin, args, memory.len())?;
        let work = Work::new(call, config);
        let parts = work.partition(self.pool.workers.len());
        // SAFETY: `plan_builtin` validated the call against `memory` and `partition` returns
        // disjoint parts; the completion is returned under this function's no-leak contract.
        Ok(unsafe { self.submit(JobWork::Builtin(work), parts, memory) })
    }

    fn cuda_context(&self) -> Option<Arc<cudarc::driver::CudaContext>> {
        None
    }

    fn isolation(&self) -> GpuIsolation {
        self.isolation
    }

    fn tenant_lanes(&self, _isolation: GpuIsolation) -> Option<TenantLaneStats> {
        None
    }
}

/// The base address of the guest memory a job works on.
#[derive(Clone, Copy)]
struct GuestMemory(*mut u8);

// SAFETY: the pointer is only dereferenced by the tasks of one job, on the bytes validation put
// inside the guest memory; the `Completion` that borrows that memory (`&'m mut [u8]`) does not
// release the borrow before every task has finished (its drop blocks), and the caller of
// `launch_unscoped` promised not to leak it (the safe `crate::launch` never does), so the
// memory outlives every use on any thread. Concurrent tasks write disjoint bytes (see
// `Work::partition`).
unsafe impl Send for GuestMemory {}
// SAFETY: as for `Send`: shared references only copy the address.
unsafe impl Sync for GuestMemory {}

impl GuestMemory {
    /// The f32 data at `offset`. Not necessarily 4-byte aligned in the address space (only the
    /// offset is), so the kernels use unaligned reads and writes.
    fn f32_at(self, offset: usize) -> *mut f32 {
        self.0.wrapping_add(offset).cast::<f32>()
    }
}

/// A validated builtin call and the part of it the launch grid covers.
#[derive(Clone, Copy)]
struct Work {
    call: BuiltinCall,
    /// Elementwise kernels: elements `0..x_limit`. Matmul: columns `0..x_limit`.
    x_limit: usize,
    /// Matmul: rows `0..y_limit`.
    y_limit: usize,
}

impl Work {
    fn new(call: BuiltinCall, config: &LaunchConfig) -> Self {
        let covered = |threads: u64, count: u32| threads.min(u64::from(count)) as usize;
        match call {
            BuiltinCall::VectorAdd { n, .. } | BuiltinCall::Scale { n, .. } => Self {
                call,
                x_limit: covered(config.threads_x(), n),
                y_limit: 1,
            },
            BuiltinCall::Matmul { m, n, .. } => Self {
                call,
                x_limit: covered(config.threads_x(), n),
                y_limit: covered(config.threads_y(), m),
            },
        }
    }

    /// Splits the work into at most `workers` parts: element ranges, or row ranges for matmul.
    /// No part is empty; the parts are disjoint, so their writes are too. When the output
    /// overlaps an input, one part does everything on one thread.
    fn partition(&self, workers: usize) -> Vec<Range<usize>> {
        let (total, wanted, granule) = match self.call {
            BuiltinCall::VectorAdd { .. } | BuiltinCall::Scale { .. } => {
                (self.x_limit, self.x_limit / MIN_ELEMENTS_PER_TASK, 16)
            }
            BuiltinCall::Matmul { k, .. } => {
                if self.x_limit == 0 {
                    return Vec::new();
                }
                let muladds = (self.y_limit as u64) * (self.x_limit as u64) * u64::from(k).max(1);
                let wanted = (muladds / MIN_MULADDS_PER_TASK).min(usize::MAX as u64) as usize;
                (self.y_limit, wanted, TILE_ROWS)
            }
        };
        if total == 0 {
            return Vec::new();
        }
        let parts = if self.call.output_aliases_input() {
            1
        } else {
            wanted.clamp(1, workers.max(1))
        };
        let per_part = total.div_ceil(parts).next_multiple_of(granule);
        (0..total)
            .step_by(per_part)
            .map(|start| start..(start + per_part).min(total))
            .collect()
    }

    /// Runs one part.
    ///
    /// # Safety
    /// `memory` must be the base of the guest memory `self.call` was validated against, valid
    /// for reads and writes for the whole call, and no other thread may access the bytes this
    /// part writes, nor write the bytes it reads, while it runs.
    unsafe fn run(&self, memory: GuestMemory, part: Range<usize>) {
        match self.call {
            BuiltinCall::VectorAdd { a, b, out, .. } => {
                // SAFETY: validation put `n` f32 values inside guest memory at each offset and
                // `part` lies below `x_limit <= n`; exclusivity is the caller's promise.
                unsafe { vector_add(memory.f32_at(a), memory.f32_at(b), memory.f32_at(out), part) }
            }
            BuiltinCall::Scale { x, out, alpha, .. } => {
                // SAFETY: as for vector_add.
                unsafe { scale(memory.f32_at(x), memory.f32_at(out), alpha, part) }
            }
            BuiltinCall::Matmul { a, b, c, n, k, .. } => {
                let shape = MatmulShape {
                    n: n as usize,
                    k: k as usize,
                    columns: self.x_limit,
                };
                // SAFETY: validation put m*k, k*n and m*n f32 values at a, b and c; `part` lies
                // below `y_limit <= m` and `columns <= n`; exclusivity is the caller's promise.
                unsafe {
                    matmul_rows(
                        memory.f32_at(a),
                        memory.f32_at(b),
                        memory.f32_at(c),
                        shape,
                        part,
                    )
                }
            }
        }
    }
}

/// `out[i] = a[i] + b[i]` for `i` in `range`.
///
/// # Safety
/// `a`, `b` valid for reads and `out` for writes of `range.end` f32 values (any alignment); no
/// other thread touches `out[range]` or writes `a[range]`, `b[range]` meanwhile.
unsafe fn vector_add(a: *const f32, b: *const f32, out: *mut f32, range: Range<usize>) {
    for i in range {
        // SAFETY: `i < range.end`, inside every buffer by the caller's promise.
        unsafe {
            let sum = a.add(i).read_unaligned() + b.add(i).read_unaligned();
            out.add(i).write_unaligned(sum);
        }
    }
}

/// `out[i] = alpha * x[i]` for `i` in `range`.
///
/// # Safety
/// As for [`vector_add`].
unsafe fn scale(x: *const f32, out: *mut f32, alpha: f32, range: Range<usize>) {
    for i in range {
        // SAFETY: `i < range.end`, inside both buffers by the caller's promise.
        unsafe {
            let product = alpha * x.add(i).read_unaligned();
            out.add(i).write_unaligned(product);
        }
    }
}

#[derive(Clone, Copy)]
struct MatmulShape {
    /// Columns of `b` and `c` (row stride).
    n: usize,
    /// Columns of `a`, rows of `b`.
    k: usize,
    /// Columns of `c` the launch covers (`<= n`).
    columns: usize,
}

/// `c[row][col] = sum_{p in 0..k} a[row][p] * b[p][col]` for `row` in `rows` and
/// `col < shape.columns`, each sum taken as `acc = acc + a * b` from `acc = 0` in order of `p`,
/// like the PTX kernel (separate multiply and add, both rounded to nearest).
///
/// Tiled: `TILE_ROWS` rows share each loaded segment of a row of `b`, and `TILE_COLS`
/// accumulators per row live in a local array; neither changes the order of any sum.
///
/// # Safety
/// `a` valid for reads of `rows.end * k`, `b` of `k * n`, `c` for writes of `rows.end * n` f32
/// values (any alignment), `columns <= n`; no other thread touches the written rows of `c` or
/// writes `a` or `b` meanwhile.
unsafe fn matmul_rows(
    a: *const f32,
    b: *const f32,
    c: *mut f32,
    shape: MatmulShape,
    rows: Range<usize>,
) {
    let MatmulShape { n, k, columns } = shape;
    let mut b_segment = [0.0f32; TILE_COLS];
    for col0 in (0..columns).step_by(TILE_COLS) {
        let width = TILE_COLS.min(columns - col0);
        if width < TILE_COLS {
            // Lanes past `width` are computed but never stored; keep them ordinary numbers.
            b_segment = [0.0; TILE_COLS];
        }
        let mut row0 = rows.start;
        while row0 < rows.end {
            let height = TILE_ROWS.min(rows.end - row0);
            let mut acc = [[0.0f32; TILE_COLS]; TILE_ROWS];
            for p in 0..k {
                for (j, slot) in b_segment.iter_mut().enumerate().take(width) {
                    // SAFETY: `p < k` and `col0 + j < columns <= n`: inside the k*n values of b.
                    *slot = unsafe { b.add(p * n + col0 + j).read_unaligned() };
                }
                for (r, acc_row) in acc.iter_mut().enumerate().take(height) {
                    // SAFETY: `row0 + r < rows.end` and `p < k`: inside the rows.end*k values of a.
                    let a_value = unsafe { a.add((row0 + r) * k + p).read_unaligned() };
                    for (acc, &b_value) in acc_row.iter_mut().zip(&b_segment) {
                        *acc += a_value * b_value;
                    }
                }
            }
            for (r, acc_row) in acc.iter().enumerate().take(height) {
                for (j, &value) in acc_row.iter().enumerate().take(width) {
                    // SAFETY: `row0 + r < rows.end` and `col0 + j < columns <= n`.
                    unsafe { c.add((row0 + r) * n + col0 + j).write_unaligned(value) };
                }
            }
            row0 += height;
        }
    }
}

/// What one launch on the pool computes.
enum JobWork {
    /// A builtin, split into parts.
    Builtin(Work),
    /// A host-described program, run whole by one task.
    Program {
        program: Arc<dyn KernelProgram>,
        config: LaunchConfig,
        args: Vec<KernelArg>,
    },
}

impl JobWork {
    /// Runs one part.
    ///
    /// # Safety
    /// `memory` must be the base of the `memory_len` bytes of guest memory the launch was
    /// validated against, valid for reads and writes for the whole call, and no other thread
    /// may access the bytes this part writes, nor write the bytes it reads, while it runs (a
    /// program's single task may touch all of guest memory, so nothing else may).
    unsafe fn run(
        &self,
        memory: GuestMemory,
        memory_len: usize,
        part: Range<usize>,
    ) -> Result<(), GpuError> {
        match self {
            JobWork::Builtin(work) => {
                // SAFETY: forwarded from this function's contract.
                unsafe { work.run(memory, part) };
                Ok(())
            }
            JobWork::Program {
                program,
                config,
                args,
            } => {
                // SAFETY: the caller promises `memory_len` bytes at `memory`, valid for reads
                // and writes and touched by no other thread while this runs (a program job has
                // one task), so this is the only reference to them.
                let memory = unsafe { std::slice::from_raw_parts_mut(memory.0, memory_len) };
                program.run_cpu(config, args, memory)
            }
        }
    }
}

/// One launch on the pool: its work, shared by its tasks.
struct CpuJob {
    work: JobWork,
    memory: GuestMemory,
    memory_len: usize,
    tasks_left: AtomicUsize,
    failure: Mutex<Option<GpuError>>,
    signal: Arc<Signal>,
}

/// One part of a job.
struct Task {
    job: Arc<CpuJob>,
    part: Range<usize>,
}

impl Task {
    fn run(self) {
        let job = &self.job;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the job was validated against the `memory_len` bytes of guest memory at
            // `job.memory`, which its Completion (never leaked, by the contract of
            // `launch_unscoped`) keeps borrowed until `tasks_left` reaches zero below;
            // `partition` gave this task a part disjoint from every other task's, a job whose
            // output aliases an input has one task only, and so does a program job.
            unsafe { job.work.run(job.memory, job.memory_len, self.part.clone()) }
        }));
        let error = match outcome {
            Ok(Ok(())) => None,
            Ok(Err(error)) => Some(error),
            Err(_) => Some(GpuError::Cuda(String::from(
                "CPU kernel panicked (internal error)",
            ))),
        };
        if let Some(error) = error {
            let mut failure = job.failure.lock().unwrap_or_else(PoisonError::into_inner);
            failure.get_or_insert(error);
        }
        if job.tasks_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let failure = job
                .failure
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            job.signal.finish(failure.map_or(Ok(()), Err));
        }
    }
}

/// A fixed set of worker threads taking tasks from one queue.
struct WorkerPool {
    shared: Arc<PoolShared>,
    workers: Vec<JoinHandle<()>>,
}

#[derive(Default)]
struct PoolShared {
    queue: Mutex<PoolQueue>,
    available: Condvar,
}

#[derive(Default)]
struct PoolQueue {
    tasks: VecDeque<Task>,
    shutting_down: bool,
}

impl PoolShared {
    fn lock(&self) -> MutexGuard<'_, PoolQueue> {
        // Tasks run outside the lock, so a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn next_task(&self) -> Option<Task> {
        let mut queue = self.lock();
        loop {
            if let Some(task) = queue.tasks.pop_front() {
                return Some(task);
            }
            if queue.shutting_down {
                return None;
            }
            queue = self
                .available
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

impl WorkerPool {
    fn start(size: usize) -> Result<Self, GpuError> {
        let shared = Arc::new(PoolShared::default());
        let mut workers = Vec::with_capacity(size);
        for index in 0..size {
            let worker_shared = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("tensor-wasm-cpu-{index}"))
                .spawn(move || {
                    while let Some(task) = worker_shared.next_task() {
                        task.run();
                    }
                });
            match spawned {
                Ok(handle) => workers.push(handle),
                Err(error) if workers.is_empty() => {
                    return Err(GpuError::NotAvailable(format!(
                        "cannot start CPU kernel worker threads: {error}"
                    )))
                }
                Err(error) => {
                    tracing::warn!(%error, started = workers.len(), "fewer CPU kernel workers than cores");
                    break;
                }
            }
        }
        Ok(Self { shared, workers })
    }

    fn submit(&self, tasks: impl IntoIterator<Item = Task>) {
        let mut queue = self.shared.lock();
        queue.tasks.extend(tasks);
        drop(queue);
        self.shared.available.notify_all();
    }
}

impl Drop for WorkerPool {
    fn drop(&mut self) {
        // Workers finish every queued task before they exit, so no Completion is left waiting.
        self.shared.lock().shutting_down = true;
        self.shared.available.notify_all();
        for worker in self.workers.drain(..) {
            let _ = worker.join();
        }
    }
}
