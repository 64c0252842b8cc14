//! Back-pressured kernel dispatch.
//!
//! A [`KernelDispatcher`] admits at most `max_in_flight` kernels at once (a
//! tokio semaphore); up to `max_queued` more callers wait for a permit, and
//! anyone beyond that gets [`DispatchError::Busy`] at once, which the HTTP
//! layer answers with `429` and `Retry-After`. A [`DispatchFuture`] wraps the
//! backend's completion, holds the permit until the kernel is done and records
//! launch-to-completion latency.
//!
//! The dispatcher is executor-agnostic: [`KernelDispatcher::acquire`] is a
//! future and [`KernelDispatcher::acquire_blocking`] parks the calling thread
//! (guest code runs on blocking threads, so host calls from guests use it);
//! [`KernelDispatcher::acquire_blocking_until`] and [`DispatchFuture::wait_until`]
//! give up at a deadline (an invocation's), so no host call waits past it.
//!
//! ```
//! use tensor_wasm_dispatch::{DispatchConfig, KernelDispatcher};
//!
//! let dispatcher = KernelDispatcher::new(DispatchConfig::default());
//! let permit = dispatcher.acquire_blocking().unwrap();
//! // Launch the kernel on the backend, then wait for it under the permit:
//! let done = dispatcher.track(permit, std::future::ready(Ok::<(), ()>(())));
//! assert_eq!(done.wait(), Ok(()));
//! assert_eq!(dispatcher.in_flight(), 0);
//! ```

mod block_on;
mod metrics;

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use tokio::sync::Semaphore;

pub use block_on::{block_on, block_on_until};
pub use metrics::DispatchMetrics;

/// Limits of a dispatcher.
#[derive(Debug, Clone)]
pub struct DispatchConfig {
    /// Kernels that may run at once.
    pub max_in_flight: usize,
    /// Callers that may wait for a permit; more are refused with `Busy`.
    pub max_queued: usize,
}

impl Default for DispatchConfig {
    fn default() -> Self {
        DispatchConfig {
            max_in_flight: 64,
            max_queued: 1024,
        }
    }
}

/// Why a dispatch was not admitted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DispatchError {
    /// Every permit is taken and the wait queue is full.
    #[error("kernel dispatcher saturated: {in_flight} kernels in flight, {queued} waiting")]
    Busy { in_flight: usize, queued: usize },
    /// The dispatcher was shut down.
    #[error("kernel dispatcher is shut down")]
    Closed,
    /// The caller's deadline passed while it waited for a permit.
    #[error("the deadline passed while waiting for a kernel dispatch permit")]
    DeadlinePassed,
}

/// Permits live in `available` (an atomic counter: taking and returning one is one atomic
/// operation) except while callers wait: then a returned permit is handed to a waiter through
/// `handoff`, a semaphore that holds no permits otherwise. A waiter announces itself in `queued`
/// and then tries `available` once more, and a returning permit is added to `available` and
/// then `queued` is checked again, so neither side can miss the other (both sequentially
/// consistent).
struct Shared {
    available: AtomicUsize,
    handoff: Semaphore,
    closed: AtomicBool,
    config: DispatchConfig,
    queued: AtomicUsize,
    metrics: Option<DispatchMetrics>,
}

impl Shared {
    /// Takes a permit from `available` if there is one.
    fn take_fast(&self) -> bool {
        self.available
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |a| a.checked_sub(1))
            .is_ok()
    }

    /// Returns a permit: to a waiter if there is one, else to `available`.
    fn give_back(&self) {
        if self.queued.load(Ordering::SeqCst) > 0 {
            self.handoff.add_permits(1);
            return;
        }
        self.available.fetch_add(1, Ordering::SeqCst);
        // A caller that started waiting meanwhile may have missed it: hand it over.
        if self.queued.load(Ordering::SeqCst) > 0 && self.take_fast() {
            self.handoff.add_permits(1);
        }
    }
}

/// The process-wide admission point for kernel launches. Cheap to clone.
#[derive(Clone)]
pub struct KernelDispatcher {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for KernelDispatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KernelDispatcher")
            .field("config", &self.shared.config)
            .field("in_flight", &self.in_flight())
            .field("queued", &self.queued())
            .finish()
    }
}

/// Permission to run one kernel; released on drop.
pub struct DispatchPermit {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for DispatchPermit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("DispatchPermit")
    }
}

impl Drop for DispatchPermit {
    fn drop(&mut self) {
        self.shared.give_back();
        if let Some(m) = &self.shared.metrics {
            m.in_flight.dec();
        }
    }
}

/// Decrements the queue count however the wait ends (granted, cancelled).
struct QueueSlot<'a>(&'a Shared);

impl Drop for QueueSlot<'_> {
    fn drop(&mut self) {
        self.0.queued.fetch_sub(1, Ordering::SeqCst);
        if let Some(m) = &self.0.metrics {
            m.queued.dec();
        }
    }
}

impl KernelDispatcher {
    /// A dispatcher without metrics.
    pub fn new(config: DispatchConfig) -> Self {
        Self::build(config, None)
    }

    /// A dispatcher reporting to `metrics`.
    pub fn with_metrics(config: DispatchConfig, metrics: DispatchMetrics) -> Self {
        Self::build(config, Some(metrics))
    }

    fn build(config: DispatchConfig, metrics: Option<DispatchMetrics>) -> Self {
        assert!(config.max_in_flight > 0, "max_in_flight must be at least 1");
        KernelDispatcher {
            shared: Arc::new(Shared {
                available: AtomicUsize::new(config.max_in_flight),
                handoff: Semaphore::new(0),
                closed: AtomicBool::new(false),
                config,
                queued: AtomicUsize::new(0),
                metrics,
            }),
        }
    }

    /// The limits this dispatcher enforces.
    pub fn config(&self) -> &DispatchConfig {
        &self.shared.config
    }

    /// Kernels admitted and not yet completed.
    pub fn in_flight(&self) -> usize {
        let free =
            self.shared.available.load(Ordering::SeqCst) + self.shared.handoff.available_permits();
        self.shared.config.max_in_flight.saturating_sub(free)
    }

    /// Callers waiting for a permit.
    pub fn queued(&self) -> usize {
        self.shared.queued.load(Ordering::Acquire)
    }

    /// A permit just taken ([`DispatchPermit`] gives it back on drop).
    fn granted(&self) -> DispatchPermit {
        if let Some(m) = &self.shared.metrics {
            m.in_flight.inc();
        }
        DispatchPermit {
            shared: self.shared.clone(),
        }
    }

    fn busy(&self) -> DispatchError {
        if let Some(m) = &self.shared.metrics {
            m.rejected.inc();
        }
        DispatchError::Busy {
            in_flight: self.in_flight(),
            queued: self.queued(),
        }
    }

    /// Takes a permit: at once when one is free, after waiting in the queue
    /// when the queue has room, `Busy` otherwise.
    pub async fn acquire(&self) -> Result<DispatchPermit, DispatchError> {
        let shared = &self.shared;
        if shared.closed.load(Ordering::Acquire) {
            return Err(DispatchError::Closed);
        }
        if shared.take_fast() {
            return Ok(self.granted());
        }
        // A permit handed over to a waiter that had meanwhile taken one from `available` (or
        // given up) is left in `handoff`: take it before queueing.
        if let Ok(permit) = shared.handoff.try_acquire() {
            permit.forget();
            return Ok(self.granted());
        }
        let reserved = shared
            .queued
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |q| {
                (q < shared.config.max_queued).then_some(q + 1)
            });
        if reserved.is_err() {
            return Err(self.busy());
        }
        if let Some(m) = &shared.metrics {
            m.queued.inc();
        }
        let _slot = QueueSlot(shared);
        // Announced: a permit returned from now on comes through `handoff`; one returned just
        // before is in `available`.
        if shared.take_fast() {
            return Ok(self.granted());
        }
        match shared.handoff.acquire().await {
            Ok(permit) => {
                permit.forget();
                Ok(self.granted())
            }
            Err(_) => Err(DispatchError::Closed),
        }
    }

    /// [`KernelDispatcher::acquire`] for a thread that may block (guest threads).
    pub fn acquire_blocking(&self) -> Result<DispatchPermit, DispatchError> {
        block_on(self.acquire())
    }

    /// [`KernelDispatcher::acquire_blocking`] that gives up at `deadline` with
    /// [`DispatchError::DeadlinePassed`] (leaving the queue as if it had never waited).
    pub fn acquire_blocking_until(
        &self,
        deadline: Instant,
    ) -> Result<DispatchPermit, DispatchError> {
        let mut acquire = std::pin::pin!(self.acquire());
        block_on_until(&mut acquire, deadline).unwrap_or(Err(DispatchError::DeadlinePassed))
    }

    /// Wraps a launched kernel's completion: the permit is held until it
    /// resolves and launch-to-completion latency is recorded.
    pub fn track<F>(&self, permit: DispatchPermit, completion: F) -> DispatchFuture<F> {
        // The clock is read only when there is a latency histogram to feed.
        let started = self.shared.metrics.is_some().then(Instant::now);
        DispatchFuture {
            completion,
            permit: Some(permit),
            started,
        }
    }

    /// Refuses every later acquire with `Closed` and wakes the waiters.
    pub fn close(&self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.handoff.close();
    }
}

/// Completes when the kernel does; holds its dispatch permit until then.
#[derive(Debug)]
pub struct DispatchFuture<F> {
    completion: F,
    permit: Option<DispatchPermit>,
    /// When it was launched; `None` without metrics.
    started: Option<Instant>,
}

impl<F> DispatchFuture<F> {
    fn finish(&mut self) {
        if let Some(permit) = self.permit.take() {
            if let (Some(m), Some(started)) = (&permit.shared.metrics, self.started) {
                m.latency.observe(started.elapsed().as_secs_f64());
            }
        }
    }
}

impl<F: Future + Unpin> Future for DispatchFuture<F> {
    type Output = F::Output;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = &mut *self;
        match Pin::new(&mut this.completion).poll(cx) {
            Poll::Ready(out) => {
                this.finish();
                Poll::Ready(out)
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<F: Future + Unpin> DispatchFuture<F> {
    /// Blocks the calling thread until the kernel completes.
    pub fn wait(self) -> F::Output {
        block_on(self)
    }

    /// Blocks until the kernel completes; if `deadline` passes first, calls `on_deadline` with
    /// the completion once (to cancel it) and goes on waiting for it: the permit is held, and
    /// this returns, only once the kernel has stopped.
    pub fn wait_until(mut self, deadline: Instant, on_deadline: impl FnOnce(&mut F)) -> F::Output {
        if let Some(out) = block_on_until(&mut self, deadline) {
            return out;
        }
        on_deadline(&mut self.completion);
        block_on(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Barrier;

    /// Eight threads take and return permits of a dispatcher capped at two, many thousand
    /// times: never more than two at once, nobody left waiting for a permit that was
    /// returned (the run ends), and every permit back at the end.
    #[test]
    fn permits_under_contention_are_never_lost_or_doubled() {
        let d = KernelDispatcher::new(DispatchConfig {
            max_in_flight: 2,
            max_queued: 64,
        });
        let holding = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (d, holding, most) = (d.clone(), holding.clone(), most.clone());
                std::thread::spawn(move || {
                    for i in 0..5_000u32 {
                        let permit = d.acquire_blocking().expect("the queue has room for all");
                        let now = holding.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        if i % 64 == 0 {
                            std::thread::yield_now();
                        }
                        holding.fetch_sub(1, Ordering::SeqCst);
                        drop(permit);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert!(
            most.load(Ordering::SeqCst) <= 2,
            "more than the cap at once"
        );
        assert_eq!((d.in_flight(), d.queued()), (0, 0));
        let both = (d.acquire_blocking(), d.acquire_blocking());
        assert!(both.0.is_ok() && both.1.is_ok(), "both permits are back");
    }

    #[test]
    fn permits_queue_and_busy_are_exact() {
        let (cap, queue, extra) = (4, 3, 5);
        let metrics = DispatchMetrics::register(&prometheus::Registry::new()).unwrap();
        let d = KernelDispatcher::with_metrics(
            DispatchConfig {
                max_in_flight: cap,
                max_queued: queue,
            },
            metrics.clone(),
        );
        // Hold every permit.
        let held: Vec<_> = (0..cap).map(|_| d.acquire_blocking().unwrap()).collect();
        assert_eq!(d.in_flight(), cap);

        // Queue + extra callers arrive together.
        let start = Arc::new(Barrier::new(queue + extra));
        let handles: Vec<_> = (0..queue + extra)
            .map(|_| {
                let (d, start) = (d.clone(), start.clone());
                std::thread::spawn(move || {
                    start.wait();
                    d.acquire_blocking().map(|permit| {
                        // Completing under the permit.
                        d.track(permit, std::future::ready(())).wait();
                    })
                })
            })
            .collect();
        // Wait until the queue is full and the rest were refused.
        let deadline = Instant::now() + std::time::Duration::from_secs(10);
        while d.queued() < queue || metrics.rejected.get() < extra as u64 {
            assert!(Instant::now() < deadline, "queue never filled");
            std::thread::yield_now();
        }
        drop(held);
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        let ok = results.iter().filter(|r| r.is_ok()).count();
        let busy = results
            .iter()
            .filter(|r| matches!(r, Err(DispatchError::Busy { .. })))
            .count();
        assert_eq!((ok, busy), (queue, extra));
        assert_eq!((d.in_flight(), d.queued()), (0, 0));
    }

    #[test]
    fn cancelled_waiters_leave_the_queue() {
        let d = KernelDispatcher::new(DispatchConfig {
            max_in_flight: 1,
            max_queued: 1,
        });
        let held = d.acquire_blocking().unwrap();
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let waited =
                tokio::time::timeout(std::time::Duration::from_millis(20), d.acquire()).await;
            assert!(waited.is_err(), "the waiter had to time out");
        });
        assert_eq!(d.queued(), 0);
        drop(held);
        assert!(d.acquire_blocking().is_ok());
    }

    #[test]
    fn a_blocking_waiter_gives_up_at_its_deadline() {
        let d = KernelDispatcher::new(DispatchConfig {
            max_in_flight: 1,
            max_queued: 4,
        });
        let held = d.acquire_blocking().unwrap();
        let start = Instant::now();
        let deadline = start + std::time::Duration::from_millis(50);
        assert_eq!(
            d.acquire_blocking_until(deadline).unwrap_err(),
            DispatchError::DeadlinePassed
        );
        assert!(start.elapsed() >= std::time::Duration::from_millis(50));
        assert_eq!(d.queued(), 0, "the waiter left the queue");
        drop(held);
        assert!(
            d.acquire_blocking_until(start).is_ok(),
            "a free permit is never late"
        );
    }

    #[test]
    fn wait_until_calls_back_at_the_deadline_and_still_waits_for_the_kernel() {
        let d = KernelDispatcher::new(DispatchConfig::default());
        let permit = d.acquire_blocking().unwrap();
        // A "kernel" that finishes only once cancelled.
        let cancelled = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = cancelled.clone();
        let kernel = std::future::poll_fn(move |cx| {
            if flag.load(Ordering::Acquire) {
                std::task::Poll::Ready("stopped")
            } else {
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            }
        });
        let deadline = Instant::now() + std::time::Duration::from_millis(20);
        let out = d
            .track(permit, Box::pin(kernel))
            .wait_until(deadline, |_| cancelled.store(true, Ordering::Release));
        assert_eq!(out, "stopped");
        assert!(Instant::now() >= deadline);
        assert_eq!(d.in_flight(), 0);
    }

    #[test]
    fn close_refuses_new_work() {
        let d = KernelDispatcher::new(DispatchConfig::default());
        d.close();
        assert_eq!(d.acquire_blocking().unwrap_err(), DispatchError::Closed);
    }

    #[test]
    fn metrics_follow_the_permits() {
        let registry = prometheus::Registry::new();
        let m = DispatchMetrics::register(&registry).unwrap();
        let d = KernelDispatcher::with_metrics(
            DispatchConfig {
                max_in_flight: 1,
                max_queued: 0,
            },
            m.clone(),
        );
        let p = d.acquire_blocking().unwrap();
        assert_eq!(m.in_flight.get(), 1);
        assert!(matches!(
            d.acquire_blocking(),
            Err(DispatchError::Busy { .. })
        ));
        assert_eq!(m.rejected.get(), 1);
        d.track(p, std::future::ready(())).wait();
        assert_eq!(m.in_flight.get(), 0);
        assert_eq!(m.latency.get_sample_count(), 1);
    }
}
