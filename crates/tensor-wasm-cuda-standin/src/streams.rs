//! Streams that run their work on a thread of their own, as a device runs a stream beside the
//! host: `cuLaunchKernel` and `cuEventRecord` on a created stream queue work and return; the
//! stream's worker runs each launch through the interpreter *without* the driver lock (other
//! streams, other contexts and the host go on meanwhile), then marks it done. Waits
//! (`cuStreamSynchronize`, `cuEventSynchronize`, `cuCtxSynchronize`, `cuMemFree` of memory a
//! launch uses) block on [`DONE`] until the work they wait for is done.
//!
//! A launch's memory is every allocation a pointer parameter points into; a 4-byte
//! allocation advised to prefer the host (`cuMemAdvise`, `SET_PREFERRED_LOCATION`, host) is
//! instead the launch's *live word*: the interpreter reads it atomically while the kernel
//! runs, so a host store to it reaches the running kernel, as concurrent managed access does
//! on a GPU (the CUDA backend's cancel word is such an allocation).

use std::collections::VecDeque;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};

use tensor_wasm_ptx_emu::{launch, Allocation, CancelWord, EmuError, Launch, Module, Schedule};

use crate::driver::{driver, Driver};

/// Signalled whenever queued work is done (paired with the driver lock).
pub(crate) static DONE: Condvar = Condvar::new();

/// Blocks, releasing the driver lock, until `ready` holds.
pub(crate) fn wait_until(
    mut guard: MutexGuard<'static, Driver>,
    ready: impl Fn(&Driver) -> bool,
) -> MutexGuard<'static, Driver> {
    while !ready(&guard) {
        guard = DONE.wait(guard).unwrap_or_else(PoisonError::into_inner);
    }
    guard
}

/// One launch, as submitted.
pub(crate) struct Job {
    pub id: u64,
    pub ctx: usize,
    pub stream: usize,
    pub module: Arc<Module>,
    pub name: String,
    pub params: Vec<u8>,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared: u32,
    pub schedule: Schedule,
    pub step_limit: u64,
    /// The allocations the launch may touch, as base and length.
    pub regions: Vec<(u64, usize)>,
    /// The live word's address, if the launch has one.
    pub word: Option<u64>,
}

pub(crate) enum Work {
    Launch(Job),
    /// Marks an event recorded once the work before it is done.
    Record(usize),
    Stop,
}

/// A stream's queue of work.
#[derive(Default)]
pub(crate) struct Queue {
    work: Mutex<VecDeque<Work>>,
    ready: Condvar,
}

impl std::fmt::Debug for Queue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Queue").finish_non_exhaustive()
    }
}

impl Queue {
    pub fn push(&self, work: Work) {
        self.work
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push_back(work);
        self.ready.notify_one();
    }

    fn pop(&self) -> Work {
        let mut work = self.work.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(next) = work.pop_front() {
                return next;
            }
            work = self
                .ready
                .wait(work)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }
}

/// Starts the worker of a new stream.
pub(crate) fn spawn(stream: usize) -> Arc<Queue> {
    let queue = Arc::new(Queue::default());
    let worker = Arc::clone(&queue);
    std::thread::Builder::new()
        .name(format!("standin-stream-{stream:x}"))
        .spawn(move || loop {
            match worker.pop() {
                Work::Launch(job) => {
                    let outcome = run(&job);
                    driver().finish_launch(&job, outcome);
                }
                Work::Record(event) => driver().finish_record(stream, event),
                Work::Stop => return,
            }
            DONE.notify_all();
        })
        .expect("a stand-in stream thread");
    queue
}

/// Runs a launch through the interpreter.
pub(crate) fn run(job: &Job) -> Result<(), EmuError> {
    let kernel = job.module.kernel(&job.name).expect("checked at submission");
    let mut memory: Vec<Allocation<'_>> = job
        .regions
        .iter()
        .map(|&(base, len)| Allocation {
            base,
            // SAFETY: `base..base + len` is a live mapping: `cuMemFree` waits while a launch
            // using it is queued or running. Like a device, the kernel writes it while the
            // host may too: the caller synchronizes, as CUDA requires of it (the live word,
            // which the host writes meanwhile, is not among these).
            bytes: unsafe { std::slice::from_raw_parts_mut(base as *mut u8, len) },
        })
        .collect();
    let mut config = Launch::new(job.grid, job.block, &job.params).schedule(job.schedule);
    config.dynamic_shared_bytes = job.shared;
    config.step_limit = job.step_limit;
    let word = job.word.map(|address| {
        // SAFETY: a live 4-byte, page-aligned allocation (freed only after this launch is
        // done), which the host accesses only atomically (see the module docs).
        (address, unsafe { AtomicU32::from_ptr(address as *mut u32) })
    });
    config.cancel = word.map(|(address, flag)| CancelWord {
        address,
        flag: flag as &AtomicU32,
    });
    launch(kernel, &config, &mut memory).map(drop)
}
