//! `Completion`: the signal that a launched kernel has finished, usable blocking and as a future.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use crate::GpuError;

/// The shared state between a `Completion` and whoever finishes the work (a CPU worker or the
/// CUDA event waiter thread).
pub(crate) struct Signal {
    state: Mutex<SignalState>,
    finished: Condvar,
    /// Set with the outcome: read without the lock by a waiter watching before it sleeps.
    done: AtomicBool,
    /// Set by [`Completion::cancel`]; the work checks it where it can stop (the CPU backend,
    /// between slices).
    cancel_requested: AtomicBool,
    /// Run by [`Completion::cancel`] too: how the work is told on a device (a fenced CUDA
    /// kernel's cancel word).
    on_cancel: Mutex<Option<CancelHook>>,
    /// Nanoseconds CPU workers spent running the work, summed over threads; `u64::MAX`
    /// (the default) for work that is not timed so (a CUDA kernel's).
    worker_ns: AtomicU64,
    /// Nanoseconds a CUDA kernel ran on the device (timing events), `NOT_TIMED` without.
    device_ns: AtomicU64,
}

/// What [`Completion::cancel`] runs besides setting the flag.
pub(crate) type CancelHook = Box<dyn Fn() + Send + Sync>;

#[derive(Default)]
struct SignalState {
    outcome: Option<Result<(), GpuError>>,
    waker: Option<Waker>,
    /// Threads asleep on `finished` (the finisher wakes them only if there are any).
    sleepers: usize,
}

/// Reads the kernel time of a launch ([`Completion::kernel_time`]), kept past the completion.
pub struct KernelTimer(Arc<Signal>);

impl KernelTimer {
    /// The device time of a CUDA kernel between timing events around it, once it has
    /// finished; `None` when launches are not timed (`--cuda-timing-events`) or it was not a
    /// CUDA kernel.
    pub fn device_time(&self) -> Option<Duration> {
        if !self.0.done.load(Ordering::Acquire) {
            return None;
        }
        match self.0.device_ns.load(Ordering::Acquire) {
            NOT_TIMED => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }

    /// The time CPU workers spent running the kernel, summed over threads, once it has
    /// finished; `None` for a kernel not run by CPU workers (a CUDA kernel) or not finished.
    pub fn worker_time(&self) -> Option<Duration> {
        if !self.0.done.load(Ordering::Acquire) {
            return None;
        }
        match self.0.worker_ns.load(Ordering::Acquire) {
            NOT_TIMED => None,
            ns => Some(Duration::from_nanos(ns)),
        }
    }
}

/// How long a blocking wait watches for the outcome before it sleeps: a CPU launch's other
/// parts usually end within it, and a sleeping waiter costs the finisher a wake-up (a system
/// call, and on a virtual machine an interrupt to another core) and itself the time to wake.
const WATCH: Duration = Duration::from_micros(50);

impl Default for Signal {
    fn default() -> Self {
        Signal {
            state: Mutex::default(),
            finished: Condvar::new(),
            done: AtomicBool::new(false),
            cancel_requested: AtomicBool::new(false),
            on_cancel: Mutex::new(None),
            worker_ns: AtomicU64::new(NOT_TIMED),
            device_ns: AtomicU64::new(NOT_TIMED),
        }
    }
}

/// [`Signal::worker_ns`] of work not timed on CPU workers.
const NOT_TIMED: u64 = u64::MAX;

impl Signal {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Sets the device time of the work (before it is finished).
    pub(crate) fn set_device_time(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(NOT_TIMED - 1);
        self.device_ns
            .store(ns.min(NOT_TIMED - 1), Ordering::Release);
    }

    /// Adds `took` to the CPU worker time of the work (before it is finished, so a waiter
    /// sees the whole of it).
    pub(crate) fn add_worker_time(&self, took: Duration) {
        let ns = u64::try_from(took.as_nanos()).unwrap_or(NOT_TIMED - 1);
        let _ = self
            .worker_ns
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
                Some(if now == NOT_TIMED {
                    ns
                } else {
                    now.saturating_add(ns).min(NOT_TIMED - 1)
                })
            });
    }

    /// Marks the work finished with `outcome` and wakes every waiter. Only the first call counts.
    pub(crate) fn finish(&self, outcome: Result<(), GpuError>) {
        let (waker, sleepers) = {
            let mut state = self.lock();
            if state.outcome.is_some() {
                return;
            }
            state.outcome = Some(outcome);
            self.done.store(true, Ordering::Release);
            (state.waker.take(), state.sleepers)
        };
        if sleepers > 0 {
            self.finished.notify_all();
        }
        if let Some(waker) = waker {
            waker.wake();
        }
    }

    /// Whether the completion's owner asked the work to stop early.
    pub(crate) fn cancel_requested(&self) -> bool {
        self.cancel_requested.load(Ordering::Acquire)
    }

    /// Makes [`Completion::cancel`] run `hook` (once set, before the completion is handed out).
    pub(crate) fn on_cancel(&self, hook: CancelHook) {
        *self
            .on_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(hook);
    }

    /// The flag [`Completion::cancel`] sets, for work that watches it itself.
    pub(crate) fn cancel_flag(&self) -> &AtomicBool {
        &self.cancel_requested
    }

    fn lock(&self) -> MutexGuard<'_, SignalState> {
        // The state is a plain value that is never left half-updated, so a poisoned lock (a
        // panic elsewhere while holding it) still holds consistent data.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn block_until_finished(&self) -> Result<(), GpuError> {
        watch_for(WATCH, || self.done.load(Ordering::Acquire));
        let mut state = self.lock();
        loop {
            if let Some(outcome) = &state.outcome {
                return outcome.clone();
            }
            state.sleepers += 1;
            state = self
                .finished
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
            state.sleepers -= 1;
        }
    }

    fn is_finished(&self) -> bool {
        self.lock().outcome.is_some()
    }
}

/// The completion of one kernel launch.
///
/// It borrows the guest memory the kernel works on (`'m`) until the kernel is done. Launch with
/// [`crate::launch`], which lends the completion to a closure as `&mut Completion` and drops it
/// (waiting for the kernel) before it returns. Inside the closure, wait on it either way:
/// - blocking: [`Completion::wait_mut`] (on a plain thread or inside
///   `tokio::task::spawn_blocking`);
/// - async: poll or `.await` the `&mut Completion` (a completion is [`Unpin`], so a mutable
///   reference to it is a [`Future`] too; no particular runtime is needed), for example with a
///   runtime's `block_on` or a wrapper future that takes any `Future + Unpin`.
///
/// Dropping a `Completion` early **blocks until the kernel has finished**, so the guest memory is
/// never handed back while a kernel still reads or writes it. That is also why no safe code gets
/// to own one: a leaked completion (`std::mem::forget`, an `Rc` cycle) would end the borrow
/// without waiting. Owned completions come only from the unsafe
/// [`Backend::launch_unscoped`](crate::Backend::launch_unscoped), whose caller promises not to
/// leak them; such a completion may also be consumed by [`Completion::wait`] or `.await`ed by
/// value.
#[must_use = "a kernel launch is only known to have succeeded once its Completion is waited on"]
pub struct Completion<'m> {
    signal: Arc<Signal>,
    _memory: PhantomData<&'m mut [u8]>,
}

impl<'m> Completion<'m> {
    /// A completion for work that `signal` will report.
    pub(crate) fn pending(signal: Arc<Signal>) -> Self {
        Self {
            signal,
            _memory: PhantomData,
        }
    }

    /// The same, with `took` of CPU worker time (a launch run whole on the launching thread).
    pub(crate) fn finished_after(outcome: Result<(), GpuError>, took: Duration) -> Self {
        let completion = Self::finished(outcome);
        completion.signal.add_worker_time(took);
        completion
    }

    /// What reads the work's kernel time once it has finished.
    pub fn kernel_time(&self) -> KernelTimer {
        KernelTimer(self.signal.clone())
    }

    /// A completion for work that is already finished (for example a launch that covers no
    /// element).
    pub(crate) fn finished(outcome: Result<(), GpuError>) -> Self {
        // Set before anyone can wait: no one to wake (a notify is a system call).
        let signal = Arc::new(Signal {
            state: Mutex::new(SignalState {
                outcome: Some(outcome),
                waker: None,
                sleepers: 0,
            }),
            done: AtomicBool::new(true),
            ..Signal::default()
        });
        Self::pending(signal)
    }

    /// Blocks the calling thread until the kernel has finished and returns its outcome.
    ///
    /// # Errors
    /// The error the kernel ended with, for example a CUDA fault reported by the driver.
    pub fn wait(self) -> Result<(), GpuError> {
        self.signal.block_until_finished()
    }

    /// [`Completion::wait`] through a mutable reference, as [`crate::launch`] lends it: blocks
    /// the calling thread until the kernel has finished and returns its outcome. Waiting again
    /// returns the same outcome at once.
    ///
    /// # Errors
    /// The error the kernel ended with, for example a CUDA fault reported by the driver.
    pub fn wait_mut(&mut self) -> Result<(), GpuError> {
        self.signal.block_until_finished()
    }

    /// Whether the kernel has finished; never blocks.
    pub fn is_done(&self) -> bool {
        self.signal.is_finished()
    }

    /// Asks the kernel to stop early; never blocks. The CPU backend stops a launch at its next
    /// slice (well under a millisecond of work) and the completion then ends with
    /// [`GpuError::Cancelled`], unless the kernel finished first; the guest memory it wrote so
    /// far keeps what was written. A fenced tenant kernel on CUDA ends at its next poll of its
    /// cancel word, which this sets; any other CUDA kernel cannot be stopped: it runs to its end
    /// and the completion reports its outcome. Either way, wait on the completion (or drop it) as
    /// usual: the memory is only released once the kernel has really stopped.
    pub fn cancel(&self) {
        self.signal.cancel_requested.store(true, Ordering::Release);
        let hook = self
            .signal
            .on_cancel
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(hook) = &*hook {
            hook();
        }
    }
}

impl Future for Completion<'_> {
    type Output = Result<(), GpuError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.signal.lock();
        if let Some(outcome) = &state.outcome {
            return Poll::Ready(outcome.clone());
        }
        match &mut state.waker {
            Some(waker) if waker.will_wake(cx.waker()) => {}
            slot => *slot = Some(cx.waker().clone()),
        }
        Poll::Pending
    }
}

// `launch` lends `&mut Completion` to its closure, and callers pass that reference on to code
// that takes any `Future + Unpin` (the runtime's dispatcher): that holds only while a completion
// is `Unpin`.
const _: () = {
    const fn assert_future_unpin<F: Future + Unpin>() {}
    assert_future_unpin::<Completion<'static>>();
    assert_future_unpin::<&mut Completion<'static>>();
};

impl Drop for Completion<'_> {
    fn drop(&mut self) {
        // The borrow of guest memory ends here: the kernel must be done with it first.
        let _outcome = self.signal.block_until_finished();
    }
}

impl fmt::Debug for Completion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Completion")
            .field("done", &self.is_done())
            .finish()
    }
}

/// Checks `ready` without sleeping for up to `limit`; `true` once it holds.
pub(crate) fn watch_for(limit: Duration, ready: impl Fn() -> bool) -> bool {
    if ready() {
        return true;
    }
    let started = Instant::now();
    while started.elapsed() < limit {
        for _ in 0..64 {
            if ready() {
                return true;
            }
            std::hint::spin_loop();
        }
    }
    ready()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::task::Wake;
    use std::thread;
    use std::time::Duration;

    struct CountingWaker {
        wakes: AtomicUsize,
        thread: thread::Thread,
    }

    impl Wake for CountingWaker {
        fn wake(self: Arc<Self>) {
            self.wakes.fetch_add(1, Ordering::SeqCst);
            self.thread.unpark();
        }
    }

    /// A minimal executor: polls `future` on this thread, parking between
    /// wake-ups; `after_first_pending` runs once the future has answered
    /// `Pending` (and so registered its waker) for the first time.
    fn block_on<F: Future>(future: F, after_first_pending: impl FnOnce()) -> (F::Output, usize) {
        let waker_state = Arc::new(CountingWaker {
            wakes: AtomicUsize::new(0),
            thread: thread::current(),
        });
        let waker = Waker::from(waker_state.clone());
        let mut cx = Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        let mut after_first_pending = Some(after_first_pending);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return (output, waker_state.wakes.load(Ordering::SeqCst));
            }
            if let Some(f) = after_first_pending.take() {
                f();
            }
            thread::park();
        }
    }

    #[test]
    fn wait_returns_the_outcome_set_on_another_thread() {
        let signal = Signal::new();
        let completion = Completion::pending(signal.clone());
        assert!(!completion.is_done());
        let finisher = thread::spawn(move || {
            // Not synchronisation: the outcome is the same whether `wait`
            // blocks first or not; the delay makes blocking the likely path.
            thread::sleep(Duration::from_millis(20));
            signal.finish(Err(GpuError::Cuda("CUDA_ERROR_ILLEGAL_ADDRESS".into())));
        });
        assert_eq!(
            completion.wait(),
            Err(GpuError::Cuda("CUDA_ERROR_ILLEGAL_ADDRESS".into()))
        );
        finisher.join().unwrap();
    }

    #[test]
    fn future_is_woken_when_the_work_finishes() {
        let signal = Signal::new();
        let completion = Completion::pending(signal.clone());
        // The work finishes only once the future is waiting for it.
        let mut finisher = None;
        let (outcome, wakes) = block_on(completion, || {
            finisher = Some(thread::spawn(move || signal.finish(Ok(()))));
        });
        assert_eq!(outcome, Ok(()));
        assert!(wakes >= 1, "the future completed without being woken");
        finisher.unwrap().join().unwrap();
    }

    #[test]
    fn wait_mut_blocks_for_the_outcome_and_repeats_it() {
        let signal = Signal::new();
        let mut completion = Completion::pending(signal.clone());
        let finisher = thread::spawn(move || {
            // Not synchronisation, as above: the delay only makes blocking likely.
            thread::sleep(Duration::from_millis(20));
            signal.finish(Err(GpuError::Cuda("CUDA_ERROR_LAUNCH_FAILED".into())));
        });
        let failed = Err(GpuError::Cuda("CUDA_ERROR_LAUNCH_FAILED".into()));
        assert_eq!(completion.wait_mut(), failed);
        assert!(completion.is_done());
        assert_eq!(completion.wait_mut(), failed);
        finisher.join().unwrap();
    }

    #[test]
    fn a_mutable_reference_is_a_future_woken_when_the_work_finishes() {
        let signal = Signal::new();
        let mut completion = Completion::pending(signal.clone());
        let mut finisher = None;
        let (outcome, wakes) = block_on(&mut completion, || {
            finisher = Some(thread::spawn(move || signal.finish(Ok(()))));
        });
        assert_eq!(outcome, Ok(()));
        assert!(wakes >= 1, "the future completed without being woken");
        assert!(completion.is_done());
        finisher.unwrap().join().unwrap();
    }

    #[test]
    fn already_finished_completion_is_ready_at_once() {
        let completion = Completion::finished(Ok(()));
        assert!(completion.is_done());
        let (outcome, wakes) = block_on(completion, || unreachable!("ready at once"));
        assert_eq!(outcome, Ok(()));
        assert_eq!(wakes, 0);
    }

    #[test]
    fn cancel_is_seen_by_the_work_and_does_not_finish_it() {
        let signal = Signal::new();
        let completion = Completion::pending(signal.clone());
        assert!(!signal.cancel_requested());
        completion.cancel();
        assert!(signal.cancel_requested());
        assert!(!completion.is_done(), "only the work finishes a completion");
        signal.finish(Err(GpuError::Cancelled("stopped".into())));
        assert_eq!(
            completion.wait(),
            Err(GpuError::Cancelled("stopped".into()))
        );
    }

    #[test]
    fn only_the_first_outcome_counts() {
        let signal = Signal::new();
        signal.finish(Ok(()));
        signal.finish(Err(GpuError::Cuda("late".into())));
        assert_eq!(Completion::pending(signal).wait(), Ok(()));
    }

    #[test]
    fn drop_blocks_until_the_work_is_finished() {
        let signal = Signal::new();
        let completion = Completion::pending(signal.clone());
        let finished_at = Arc::new(Mutex::new(None));
        let finisher = {
            let finished_at = finished_at.clone();
            thread::spawn(move || {
                // Not synchronisation: `finished_at <= dropped_at` holds
                // whether or not `drop` has to block; the delay makes it block.
                thread::sleep(Duration::from_millis(50));
                *finished_at.lock().unwrap() = Some(std::time::Instant::now());
                signal.finish(Ok(()));
            })
        };
        drop(completion);
        let dropped_at = std::time::Instant::now();
        let finished_at = finished_at
            .lock()
            .unwrap()
            .expect("drop returned before finish");
        assert!(finished_at <= dropped_at);
        finisher.join().unwrap();
    }
}
