//! The CPU backend: the builtin kernels ([`kernels`]) and host-described programs
//! ([`KernelProgram::cpu_steps`]) on a fixed pool of worker threads that is fair between tenants
//! ([`pool`]); launches are cancellable through their [`Completion`].

mod kernels;
mod pool;
pub(crate) mod tenant_ptx;

use std::ops::Range;
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex};

use self::kernels::{Cursor, GuestMemory, Work};
use self::pool::{CpuJob, JobWork, Task, WorkerPool};
use crate::completion::Signal;
use crate::kernel::{KernelKind, ProgramKernel};
use crate::program::{ProgramCache, PROGRAM_CACHE_CAPACITY};
use crate::validate;
use crate::{
    Backend, BuiltinKernel, Completion, Device, GpuError, GpuIsolation, Kernel, KernelArg,
    KernelProgram, LaunchConfig, TenantKey, TenantLaneStats,
};

/// Runs the builtin kernels on the host.
///
/// Tenants: the CPU has no streams or contexts; the tenant key of a launch picks the queue its
/// tasks wait in, and workers take tasks round-robin between tenants (see `cpu/pool.rs`). The
/// isolation level a key may name is ignored and the backend's is only reported.
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

    /// Queues `parts` of `work` over `memory` on the pool, in `tenant`'s queue, and returns
    /// their completion.
    ///
    /// # Safety
    /// `work` was validated against `memory` and its parts are disjoint (see
    /// `JobWork::run_slice`); the caller holds the duty of [`Backend::launch_unscoped`] for the
    /// returned completion: it must not be leaked.
    unsafe fn submit<'m>(
        &self,
        tenant: &TenantKey,
        work: JobWork,
        mut parts: Vec<(Range<usize>, Option<Cursor>)>,
        memory: &'m mut [u8],
    ) -> Completion<'m> {
        if parts.is_empty() {
            return Completion::finished(Ok(()));
        }
        // A launch of one part runs its first slice on the calling thread: most such launches
        // end within it, without the hand-over to a worker and back (microseconds, more than
        // a small kernel's own time). The calling thread is the invocation's own, so this is
        // the tenant's time, not a worker's that another tenant waits for; a slice is bounded
        // (see `pool.rs`), and what is left goes to the pool from where the slice ended.
        let mut inline_time = None;
        if let [(part, cursor)] = parts.as_mut_slice() {
            if work.runs_inline(cursor) {
                let started = std::time::Instant::now();
                // SAFETY: `memory` is borrowed mutably for this call, so nothing else touches
                // it while the slice runs; the caller validated `work` against it, and this is
                // the launch's only part.
                let outcome = unsafe { pool::run_slice_here(&work, memory, part, cursor) };
                if let Some(outcome) = outcome {
                    return Completion::finished_after(outcome, started.elapsed());
                }
                inline_time = Some(started.elapsed());
            }
        }
        let signal = Signal::new();
        if let Some(took) = inline_time {
            signal.add_worker_time(took);
        }
        let job = Arc::new(CpuJob {
            tenant: Arc::from(tenant.as_str()),
            work,
            memory: GuestMemory(memory.as_mut_ptr()),
            memory_len: memory.len(),
            tasks_left: AtomicUsize::new(parts.len()),
            failure: Mutex::new(None),
            signal: signal.clone(),
        });
        self.pool.submit_helping(
            parts
                .into_iter()
                .map(|(part, cursor)| Task {
                    job: job.clone(),
                    part,
                    cursor,
                })
                .collect(),
        );
        Completion::pending(signal)
    }
}

impl std::fmt::Debug for CpuBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuBackend")
            .field("workers", &self.pool.size())
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

    fn load_ptx(&self, tenant: &TenantKey, ptx: &str, entry: &str) -> Result<Kernel, GpuError> {
        let kernel = tenant_ptx::InterpretedPtx::load(tenant, ptx, entry, false)?;
        Ok(Kernel {
            fingerprint: None,
            kind: KernelKind::Ptx(Arc::new(kernel)),
        })
    }

    fn load_fenced_ptx(
        &self,
        tenant: &TenantKey,
        ptx: &str,
        entry: &str,
    ) -> Result<Kernel, GpuError> {
        let kernel = tenant_ptx::InterpretedPtx::load(tenant, ptx, entry, true)?;
        Ok(Kernel {
            fingerprint: None,
            kind: KernelKind::Ptx(Arc::new(kernel)),
        })
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
                fingerprint: None,
                kind: KernelKind::Program(Arc::new(ProgramKernel {
                    program,
                    function: None,
                })),
            })
        })
    }

    unsafe fn launch_unscoped<'m>(
        &self,
        tenant: &TenantKey,
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
                let Some(ptx) = function.downcast_ref::<tenant_ptx::InterpretedPtx>() else {
                    return Err(GpuError::NotAvailable(format!(
                        "kernel `{}` is a cubin, which needs a CUDA device; this is the CPU \
                         backend",
                        function.entry()
                    )));
                };
                if !ptx.belongs_to(tenant) {
                    return Err(GpuError::InvalidArgument(format!(
                        "kernel `{}` was loaded for another tenant",
                        function.entry()
                    )));
                }
                let signal = Signal::new();
                // SAFETY: `memory` stays borrowed by the returned completion, which its drop
                // keeps until the signal has finished and which the caller may not leak (this
                // function's contract); the kernel's thread is the only one touching it.
                unsafe {
                    tenant_ptx::spawn(
                        function.clone(),
                        *config,
                        args.to_vec(),
                        GuestMemory(memory.as_mut_ptr()),
                        memory.len(),
                        signal.clone(),
                    )
                }?;
                return Ok(Completion::pending(signal));
            }
            KernelKind::Program(loaded) => {
                // Any loaded program runs here, whichever backend loaded it: `run_cpu` needs
                // nothing but the program.
                let program = &loaded.program;
                validate::check_buffers(program.name(), args, memory.len())?;
                program.validate(config, args, memory.len())?;
                if let Some(parts) =
                    program.cpu_parts(config, args, memory.len(), self.pool.size())?
                {
                    parts.check(memory.len())?;
                    let tasks = parts
                        .parts
                        .into_iter()
                        .map(|(range, part)| (range, Some(Cursor::Part(part))))
                        .collect();
                    let work = JobWork::Parts {
                        inputs: parts.inputs,
                    };
                    // SAFETY: the program validated the launch against `memory` above, and
                    // `check` put every part's range inside it, disjoint from the other parts'
                    // and from every input; the completion is returned under this function's
                    // own no-leak contract.
                    return Ok(unsafe { self.submit(tenant, work, tasks, memory) });
                }
                // The steps now, so the first slice may run on the calling thread (a program
                // without steps runs as one call, on a worker).
                let steps = program.cpu_steps(config, args, memory.len())?;
                let work = JobWork::Program {
                    program: program.clone(),
                    config: *config,
                    args: args.to_vec(),
                };
                let whole = vec![(Range::default(), steps.map(Cursor::Steps))];
                // SAFETY: the program validated the launch against `memory` above and runs as
                // one task (its part is unused: the program's steps, or `run_cpu`, are the
                // whole launch); the completion is returned under this function's own no-leak
                // contract.
                return Ok(unsafe { self.submit(tenant, work, whole, memory) });
            }
        };
        let call = validate::plan_builtin(builtin, args, memory.len())?;
        let work = Work::new(call, config);
        let parts = work
            .partition(self.pool.size())
            .into_iter()
            .map(|part| (part, None))
            .collect();
        // SAFETY: `plan_builtin` validated the call against `memory` and `partition` returns
        // disjoint parts; the completion is returned under this function's no-leak contract.
        Ok(unsafe { self.submit(tenant, JobWork::Builtin(work), parts, memory) })
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

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// m = n = k = 4096 over one 64 MiB buffer, inputs and output aliased: one task on one
    /// worker, minutes of work in one piece before slicing.
    const N: u32 = 4096;

    fn aliased_matmul_args() -> Vec<KernelArg> {
        let len = u64::from(N) * u64::from(N) * 4;
        let buffer = KernelArg::Buffer { offset: 0, len };
        vec![
            buffer,
            buffer,
            buffer,
            KernelArg::U32(N),
            KernelArg::U32(N),
            KernelArg::U32(N),
        ]
    }

    fn matmul_config() -> LaunchConfig {
        LaunchConfig::grid_2d(N, N, [16, 16])
    }

    /// Polls `completion` until it is done or `bound` has passed; whether it finished.
    fn done_within(completion: &Completion<'_>, bound: Duration) -> bool {
        let start = Instant::now();
        while !completion.is_done() {
            if start.elapsed() > bound {
                return false;
            }
            std::thread::yield_now();
        }
        true
    }

    #[test]
    fn a_cancelled_launch_stops_at_its_next_slice() {
        let backend = CpuBackend::with_workers(1).unwrap();
        let kernel = backend.load_builtin(BuiltinKernel::Matmul).unwrap();
        let mut memory = vec![0u8; (N * N * 4) as usize];
        let tenant = TenantKey::new("tn-big");
        let (outcome, took) = crate::launch(
            &backend,
            &tenant,
            &kernel,
            &matmul_config(),
            &aliased_matmul_args(),
            &mut memory,
            |completion| {
                let start = Instant::now();
                completion.cancel();
                (completion.wait_mut(), start.elapsed())
            },
        )
        .unwrap();
        assert!(
            matches!(outcome, Err(GpuError::Cancelled(_))),
            "{outcome:?}"
        );
        assert!(took < Duration::from_secs(1), "stopping took {took:?}");
    }

    /// One worker; tenant A's two huge launches are running, then tenant B launches a small
    /// vector_add: B's launch gets the worker after at most a slice or two of A's, not after A
    /// has finished (minutes).
    #[test]
    fn another_tenants_small_launch_is_not_held_behind_a_big_one() {
        let backend = CpuBackend::with_workers(1).unwrap();
        let matmul = backend.load_builtin(BuiltinKernel::Matmul).unwrap();
        let vector_add = backend.load_builtin(BuiltinKernel::VectorAdd).unwrap();
        let (big, small) = (TenantKey::new("tn-big"), TenantKey::new("tn-small"));
        let mut first = vec![0u8; (N * N * 4) as usize];
        let mut second = first.clone();
        let mut third = vec![0u8; 3 * 4096 * 4];
        let add_args = [
            KernelArg::Buffer {
                offset: 0,
                len: 4096 * 4,
            },
            KernelArg::Buffer {
                offset: 4096 * 4,
                len: 4096 * 4,
            },
            KernelArg::Buffer {
                offset: 2 * 4096 * 4,
                len: 4096 * 4,
            },
            KernelArg::U32(4096),
        ];
        let (args, config) = (aliased_matmul_args(), matmul_config());
        let waited = crate::launch(&backend, &big, &matmul, &config, &args, &mut first, |a| {
            crate::launch(&backend, &big, &matmul, &config, &args, &mut second, |b| {
                let waited = crate::launch(
                    &backend,
                    &small,
                    &vector_add,
                    &LaunchConfig::linear(4096, 256),
                    &add_args,
                    &mut third,
                    |small| {
                        let start = Instant::now();
                        let done = done_within(small, Duration::from_secs(10));
                        (done, start.elapsed())
                    },
                );
                b.cancel();
                a.cancel();
                waited
            })
        });
        let (done, took) = waited.unwrap().unwrap().unwrap();
        assert!(
            done,
            "the small launch waited more than 10 s behind the big ones"
        );
        assert!(
            took < Duration::from_secs(1),
            "the small launch took {took:?}"
        );
    }

    /// `c = a · b` for separate 2048 × 2048 matrices at 0, 16 MiB and 32 MiB: the blocked
    /// multiply, in one part per worker.
    fn separate_matmul() -> (Vec<KernelArg>, LaunchConfig, Vec<u8>) {
        let n = 2048u32;
        let bytes = u64::from(n * n * 4);
        let buffer = |i: u64| KernelArg::Buffer {
            offset: i * bytes,
            len: bytes,
        };
        let args = vec![
            buffer(0),
            buffer(1),
            buffer(2),
            KernelArg::U32(n),
            KernelArg::U32(n),
            KernelArg::U32(n),
        ];
        (
            args,
            LaunchConfig::grid_2d(n, n, [16, 16]),
            vec![0u8; 3 * bytes as usize],
        )
    }

    /// Every worker busy with tenant A's large matmuls (two launches, a part per worker each):
    /// tenant B's small vector_add completes within 10 ms plus its own run time on an idle pool
    /// (the median of seven launches).
    #[test]
    fn a_small_launch_waits_at_most_10_ms_behind_large_matmuls() {
        let backend = CpuBackend::with_workers(2).unwrap();
        let matmul = backend.load_builtin(BuiltinKernel::Matmul).unwrap();
        let vector_add = backend.load_builtin(BuiltinKernel::VectorAdd).unwrap();
        let (big, small) = (TenantKey::new("tn-big"), TenantKey::new("tn-small"));
        let n = 4096u64;
        let add_args: Vec<KernelArg> = (0..3)
            .map(|i| KernelArg::Buffer {
                offset: i * 4 * n,
                len: 4 * n,
            })
            .chain([KernelArg::U32(n as u32)])
            .collect();
        let mut add_memory = vec![0u8; 3 * 4 * n as usize];
        let mut time_add = || {
            let start = Instant::now();
            crate::launch(
                &backend,
                &small,
                &vector_add,
                &LaunchConfig::linear(n as u32, 256),
                &add_args,
                &mut add_memory,
                |small| small.wait_mut(),
            )
            .unwrap()
            .unwrap();
            start.elapsed()
        };
        let alone = (0..5).map(|_| time_add()).max().unwrap();
        let (args, config, mut first) = separate_matmul();
        let mut second = first.clone();
        let backend = &backend;
        let waited = crate::launch(backend, &big, &matmul, &config, &args, &mut first, |a| {
            crate::launch(backend, &big, &matmul, &config, &args, &mut second, |b| {
                // Both launches have their parts on the workers by now.
                std::thread::yield_now();
                let mut waited: Vec<Duration> = (0..7).map(|_| time_add()).collect();
                waited.sort();
                let still_running = !a.is_done() && !b.is_done();
                b.cancel();
                a.cancel();
                (waited, still_running)
            })
        });
        let (waited, still_running) = waited.unwrap().unwrap();
        assert!(
            still_running,
            "the large matmuls ended before the small launches"
        );
        // The median of seven: the other tests of this process share the two cores, and the
        // operating system may preempt a worker for a scheduler slice now and then, which no
        // pool can prevent; a pool that made B wait for A's work fails every trial.
        assert!(
            waited[3] <= alone + Duration::from_millis(10),
            "the small launches took {waited:?} behind the large ones ({alone:?} alone)"
        );
    }
}
