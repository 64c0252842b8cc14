//! The CPU backend's worker pool, fair between tenants.
//!
//! A launch is a job split into tasks (disjoint parts of its work). A worker runs one *slice* of
//! a task at a time (see `cpu/kernels.rs`: about 0.1 ms) and puts an unfinished task back
//! at the end of its tenant's queue. Tasks are queued per tenant and workers take them
//! round-robin between the tenants that have work queued, so one tenant's large kernels cannot
//! hold every worker while another tenant's small kernel waits: it waits at most one slice per
//! worker. A job whose completion was cancelled ends at its next slice with
//! [`GpuError::Cancelled`]; its queued tasks are dropped as they come up. A launch of one part
//! runs its first slice on the launching thread ([`run_slice_here`]) and is queued only if it
//! has more to do.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::kernels::{Cursor, GuestMemory, Work};
use crate::completion::Signal;
use crate::{GpuError, KernelArg, KernelProgram, LaunchConfig};

/// A slice of a program's steps, or of a blocked matmul's: steps run until this much time has
/// passed (at least one step).
pub(super) const PROGRAM_SLICE: Duration = Duration::from_micros(200);

/// What one launch on the pool computes.
pub(super) enum JobWork {
    /// A builtin, split into parts, each run slice by slice.
    Builtin(Work),
    /// A host-described program, run by one task: slices of its steps
    /// ([`KernelProgram::cpu_steps`]), or one slice for a program without steps.
    Program {
        program: Arc<dyn KernelProgram>,
        config: LaunchConfig,
        args: Vec<KernelArg>,
    },
    /// A host-described program split into parts ([`KernelProgram::cpu_parts`], checked by
    /// [`crate::CpuParts::check`]): each task's part is its output range and its cursor the
    /// part's steps; all of them read `inputs`.
    Parts { inputs: Vec<Range<usize>> },
}

impl JobWork {
    /// Whether a slice of this work, at `cursor`, may run on the thread that launched it: a
    /// program's only when its steps are known (without steps it is one call of any length).
    pub(super) fn runs_inline(&self, cursor: &Option<Cursor>) -> bool {
        !matches!(self, JobWork::Program { .. }) || cursor.is_some()
    }

    /// Runs the next slice of `part`; `true` once the part is done.
    ///
    /// # Safety
    /// `memory` must be the base of the `memory_len` bytes of guest memory the launch was
    /// validated against, valid for reads and writes for the whole call; `cursor` is this
    /// part's, only moved on by this function; no other thread may access the bytes this part
    /// writes, nor write the bytes it reads, while it runs (a program's single task may touch
    /// all of guest memory, so nothing else may; the parts of a `Parts` job were checked to
    /// write disjoint ranges that no part reads).
    unsafe fn run_slice(
        &self,
        memory: GuestMemory,
        memory_len: usize,
        part: &Range<usize>,
        cursor: &mut Option<Cursor>,
    ) -> Result<bool, GpuError> {
        match self {
            JobWork::Builtin(work) => {
                let cursor = cursor.get_or_insert_with(|| work.cursor(part));
                // SAFETY: forwarded from this function's contract.
                Ok(unsafe { work.run_slice(memory, part, cursor) })
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
                if cursor.is_none() {
                    match program.cpu_steps(config, args, memory_len)? {
                        Some(steps) => *cursor = Some(Cursor::Steps(steps)),
                        None => return program.run_cpu(config, args, memory).map(|()| true),
                    }
                }
                let Some(Cursor::Steps(steps)) = cursor else {
                    return Ok(true);
                };
                slice_of_steps(|| steps.step(memory))
            }
            JobWork::Parts { inputs } => {
                let Some(Cursor::Part(steps)) = cursor else {
                    return Ok(true);
                };
                let inputs: Vec<&[u8]> = inputs
                    .iter()
                    // SAFETY: `CpuParts::check` put every input range inside the `memory_len`
                    // bytes at `memory`, and no part writes them (the caller's promise covers
                    // everything else), so shared references to them are sound.
                    .map(|range| unsafe {
                        std::slice::from_raw_parts(memory.0.add(range.start), range.len())
                    })
                    .collect();
                // SAFETY: `part` is this task's output range, checked to lie inside guest memory
                // and to overlap no other part's output and no input; this task's slices run
                // one at a time, so this is the only reference to those bytes.
                let output =
                    unsafe { std::slice::from_raw_parts_mut(memory.0.add(part.start), part.len()) };
                slice_of_steps(|| steps.step(&inputs, output))
            }
        }
    }
}

/// Runs `step` until it reports the end or a slice's time is up; `true` at the end.
fn slice_of_steps(mut step: impl FnMut() -> Result<bool, GpuError>) -> Result<bool, GpuError> {
    let started = Instant::now();
    loop {
        if step()? {
            return Ok(true);
        }
        if started.elapsed() >= PROGRAM_SLICE {
            return Ok(false);
        }
    }
}

/// One launch on the pool: its work, shared by its tasks.
pub(super) struct CpuJob {
    /// The tenant whose queue the job's tasks wait in.
    pub(super) tenant: Arc<str>,
    pub(super) work: JobWork,
    pub(super) memory: GuestMemory,
    pub(super) memory_len: usize,
    pub(super) tasks_left: AtomicUsize,
    pub(super) failure: Mutex<Option<GpuError>>,
    pub(super) signal: Arc<Signal>,
}

/// One part of a job, and where it resumes.
pub(super) struct Task {
    pub(super) job: Arc<CpuJob>,
    pub(super) part: Range<usize>,
    pub(super) cursor: Option<Cursor>,
}

/// Runs the next slice of `part` of `work` on the calling thread, over `memory`: the outcome
/// once the part has ended (a panic is an internal error), `None` when it has more to do (its
/// cursor says where to resume).
///
/// # Safety
/// As [`JobWork::run_slice`], with `memory` the whole guest memory the launch was validated
/// against.
pub(super) unsafe fn run_slice_here(
    work: &JobWork,
    memory: &mut [u8],
    part: &Range<usize>,
    cursor: &mut Option<Cursor>,
) -> Option<Result<(), GpuError>> {
    let (base, len) = (GuestMemory(memory.as_mut_ptr()), memory.len());
    // SAFETY: forwarded from this function's contract.
    let outcome = catch_unwind(AssertUnwindSafe(|| unsafe {
        work.run_slice(base, len, part, cursor)
    }));
    slice_outcome(outcome)
}

/// What a slice's result means for its part: `None` while it has more to do.
fn slice_outcome(
    outcome: std::thread::Result<Result<bool, GpuError>>,
) -> Option<Result<(), GpuError>> {
    match outcome {
        Ok(Ok(false)) => None,
        Ok(Ok(true)) => Some(Ok(())),
        Ok(Err(error)) => Some(Err(error)),
        Err(_) => Some(Err(GpuError::Cuda(String::from(
            "CPU kernel panicked (internal error)",
        )))),
    }
}

impl Task {
    /// Runs one slice; gives the task back when it has more to do.
    fn run_slice(mut self) -> Option<Task> {
        let job = self.job.clone();
        if job.signal.cancel_requested() {
            finish_part(
                &job,
                Some(GpuError::Cancelled(String::from(
                    "the launch was cancelled before it finished (its invocation's deadline \
                     passed)",
                ))),
            );
            return None;
        }
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: the job was validated against the `memory_len` bytes of guest memory at
            // `job.memory`, which its Completion (never leaked, by the contract of
            // `launch_unscoped`) keeps borrowed until `tasks_left` reaches zero in
            // `finish_part`; `partition` gave this task a part disjoint from every other
            // task's, a job whose output aliases an input has one task only, and so does a
            // program job; this task's slices run one at a time (it is in one queue or on one
            // worker, never both).
            unsafe {
                job.work
                    .run_slice(job.memory, job.memory_len, &self.part, &mut self.cursor)
            }
        }));
        job.signal.add_worker_time(started.elapsed());
        match slice_outcome(outcome) {
            None => return Some(self),
            Some(outcome) => finish_part(&job, outcome.err()),
        }
        None
    }
}

/// Records that one task of `job` is over (with `error`, if it failed); the last one finishes
/// the job's completion.
fn finish_part(job: &CpuJob, error: Option<GpuError>) {
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

/// A fixed set of worker threads taking tasks round-robin from per-tenant queues.
pub(super) struct WorkerPool {
    shared: Arc<PoolShared>,
    workers: Vec<JoinHandle<()>>,
}

#[derive(Default)]
struct PoolShared {
    queue: Mutex<PoolQueue>,
    available: Condvar,
    /// Tasks queued, as of the last change of the queue (read without the lock by a worker
    /// watching the queue before it sleeps).
    queued: AtomicUsize,
    /// Whether a worker is watching the queue: one at a time, so that the watcher and the
    /// launching thread (which runs parts itself, `submit_helping`) take two cores at most.
    watching: AtomicBool,
    /// Until when the watcher watches ([`since_start`] nanoseconds): [`SPIN`] after the last
    /// worker found the queue empty. A worker that finds another watching moves it on and
    /// sleeps, so a watcher stays for [`SPIN`] after the pool's latest task, not its own.
    watch_until: AtomicU64,
}

/// Nanoseconds since the first call (a clock the watchers share as one number).
fn since_start() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    u64::try_from(START.get_or_init(Instant::now).elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// How long a worker that finds the queue empty watches it before it sleeps. A model's
/// launches come microseconds apart: a worker still watching takes the next one's parts at
/// once, where a sleeping one takes tens of microseconds to wake (more on a virtual machine,
/// whose idle core must be woken too). Bounded, so an idle pool sleeps.
const SPIN: Duration = Duration::from_micros(50);

/// Queued tasks by tenant, and the order in which tenants get the next free worker.
#[derive(Default)]
struct PoolQueue {
    by_tenant: HashMap<Arc<str>, VecDeque<Task>>,
    /// Tenants with queued tasks, each once: the front one is served next, then goes to the
    /// back if it still has tasks queued.
    turns: VecDeque<Arc<str>>,
    /// Tasks queued, all tenants together.
    len: usize,
    /// Workers asleep on `available` (a submit wakes them only if there are any: a wake is a
    /// system call, and on a virtual machine an interrupt to another core).
    sleeping: usize,
    shutting_down: bool,
}

impl PoolQueue {
    fn push(&mut self, task: Task) {
        let queue = self.by_tenant.entry(task.job.tenant.clone()).or_default();
        if queue.is_empty() {
            self.turns.push_back(task.job.tenant.clone());
        }
        queue.push_back(task);
        self.len += 1;
    }

    /// Takes the last queued task of `job` out of turn (its own caller helping it). Workers
    /// take a job's tasks from the front, so of two parts the caller runs the second and a
    /// worker the first, launch after launch: a plan whose launches split their data alike
    /// keeps each half on one core.
    fn take_of(&mut self, job: &Arc<CpuJob>) -> Option<Task> {
        let queue = self.by_tenant.get_mut(&job.tenant)?;
        let at = queue.iter().rposition(|task| Arc::ptr_eq(&task.job, job))?;
        let task = queue.remove(at);
        self.len -= 1;
        if queue.is_empty() {
            self.by_tenant.remove(&job.tenant);
            self.turns.retain(|tenant| tenant != &job.tenant);
        }
        task
    }

    fn pop(&mut self) -> Option<Task> {
        let tenant = self.turns.pop_front()?;
        let queue = self.by_tenant.get_mut(&tenant)?;
        let task = queue.pop_front();
        self.len -= usize::from(task.is_some());
        if queue.is_empty() {
            self.by_tenant.remove(&tenant);
        } else {
            self.turns.push_back(tenant);
        }
        task
    }
}

impl PoolShared {
    fn lock(&self) -> MutexGuard<'_, PoolQueue> {
        // Tasks run outside the lock, so a poisoned queue is still consistent.
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publishes how many tasks `queue` holds (after changing it, with the lock held).
    fn publish(&self, queue: &PoolQueue) {
        self.queued.store(queue.len, Ordering::Release);
    }

    /// Moves the watch on to [`SPIN`] from now and watches the queue until then (without the
    /// lock), unless another worker is watching; `true` if a task came.
    fn watch(&self) -> bool {
        let spin = u64::try_from(SPIN.as_nanos()).unwrap_or(u64::MAX);
        self.watch_until
            .fetch_max(since_start().saturating_add(spin), Ordering::SeqCst);
        loop {
            if self.watching.swap(true, Ordering::SeqCst) {
                // The watcher reads the moved deadline before it stops.
                return false;
            }
            let came = loop {
                if self.queued.load(Ordering::Acquire) > 0 {
                    break true;
                }
                if since_start() >= self.watch_until.load(Ordering::SeqCst) {
                    break false;
                }
                for _ in 0..64 {
                    std::hint::spin_loop();
                }
            };
            self.watching.store(false, Ordering::SeqCst);
            // A worker that moved the deadline as this one stopped saw it watching and went
            // to sleep: watch on for it.
            if came || since_start() >= self.watch_until.load(Ordering::SeqCst) {
                return came;
            }
        }
    }

    /// Puts `unfinished` back at the end of its tenant's queue, then takes the next task in
    /// turn (waiting for one); `None` once the pool shuts down and nothing is left.
    fn next_task(&self, unfinished: Option<Task>) -> Option<Task> {
        let mut queue = self.lock();
        if let Some(task) = unfinished {
            queue.push(task);
        }
        let mut watched = false;
        loop {
            if let Some(task) = queue.pop() {
                self.publish(&queue);
                return Some(task);
            }
            if queue.shutting_down {
                return None;
            }
            if !watched {
                watched = true;
                drop(queue);
                self.watch();
                queue = self.lock();
                continue;
            }
            queue.sleeping += 1;
            queue = self
                .available
                .wait(queue)
                .unwrap_or_else(PoisonError::into_inner);
            queue.sleeping -= 1;
        }
    }
}

impl WorkerPool {
    pub(super) fn start(size: usize) -> Result<Self, GpuError> {
        let shared = Arc::new(PoolShared::default());
        let mut workers = Vec::with_capacity(size);
        for index in 0..size {
            let worker_shared = shared.clone();
            let spawned = std::thread::Builder::new()
                .name(format!("tensor-wasm-cpu-{index}"))
                .spawn(move || {
                    let mut unfinished = None;
                    while let Some(task) = worker_shared.next_task(unfinished.take()) {
                        unfinished = task.run_slice();
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

    /// Worker threads.
    pub(super) fn size(&self) -> usize {
        self.workers.len()
    }

    /// Queues `tasks` (the parts of one job), then runs slices of the ones still queued on
    /// the calling thread, which would otherwise sit idle waiting for the launch: a small part
    /// is done before a sleeping worker wakes up. It is the launching tenant's own thread and
    /// time, as a one-part launch's first slice (`cpu.rs`); it stops at the first slice that
    /// leaves work, which goes back to the queue for the workers.
    pub(super) fn submit_helping(&self, tasks: Vec<Task>) {
        let Some(job) = tasks.first().map(|task| task.job.clone()) else {
            return;
        };
        self.submit_for(tasks, 1);
        loop {
            let task = {
                let mut queue = self.shared.lock();
                let task = queue.take_of(&job);
                self.shared.publish(&queue);
                task
            };
            let Some(task) = task else {
                return;
            };
            if let Some(unfinished) = task.run_slice() {
                self.submit([unfinished]);
                return;
            }
        }
    }

    /// Queues `tasks`, waking as many sleeping workers as there are tasks beyond the ones
    /// `helpers` threads (the submitter's own) and a watching worker will take: a watcher
    /// looks at the queue under the lock once it stops watching, so a task it is counted for
    /// is never left behind, and a wake-up is a system call that on a virtual machine also
    /// interrupts another core.
    fn submit_for(&self, tasks: impl IntoIterator<Item = Task>, helpers: usize) {
        let mut queue = self.shared.lock();
        let mut count = 0usize;
        for task in tasks {
            queue.push(task);
            count += 1;
        }
        self.shared.publish(&queue);
        let sleeping = queue.sleeping;
        drop(queue);
        let watcher = usize::from(self.shared.watching.load(Ordering::SeqCst));
        let wanted = count.saturating_sub(helpers + watcher).min(sleeping);
        if wanted == sleeping && wanted > 0 {
            self.shared.available.notify_all();
        } else {
            for _ in 0..wanted {
                self.shared.available.notify_one();
            }
        }
    }

    pub(super) fn submit(&self, tasks: impl IntoIterator<Item = Task>) {
        self.submit_for(tasks, 0);
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

#[cfg(test)]
mod tests {
    use super::*;

    fn task(tenant: &str) -> Task {
        Task {
            job: Arc::new(CpuJob {
                tenant: Arc::from(tenant),
                work: JobWork::Builtin(Work::new(
                    crate::validate::BuiltinCall::Scale {
                        x: 0,
                        out: 0,
                        alpha: 1.0,
                        n: 0,
                    },
                    &LaunchConfig::linear(1, 1),
                )),
                memory: GuestMemory(std::ptr::null_mut()),
                memory_len: 0,
                tasks_left: AtomicUsize::new(1),
                failure: Mutex::new(None),
                signal: Signal::new(),
            }),
            part: 0..0,
            cursor: None,
        }
    }

    /// Tenants take turns: a tenant with many queued tasks gets one per turn, as does a tenant
    /// that queued a single task after it.
    #[test]
    fn tenants_are_served_round_robin() {
        let mut queue = PoolQueue::default();
        for _ in 0..3 {
            queue.push(task("big"));
        }
        queue.push(task("small"));
        let order: Vec<String> = std::iter::from_fn(|| queue.pop())
            .map(|t| t.job.tenant.to_string())
            .collect();
        assert_eq!(order, ["big", "small", "big", "big"]);
        assert!(queue.by_tenant.is_empty() && queue.turns.is_empty());

        // A task put back after its slice goes behind the other tenant's waiting task.
        queue.push(task("small"));
        queue.push(task("big"));
        let first = queue.pop().unwrap();
        assert_eq!(&*first.job.tenant, "small");
        queue.push(first);
        assert_eq!(&*queue.pop().unwrap().job.tenant, "big");
        assert_eq!(&*queue.pop().unwrap().job.tenant, "small");
        assert!(queue.pop().is_none());
    }
}
