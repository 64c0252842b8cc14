//! The shared job queue (`serve --store`, docs/scale-out.md): the asynchronous jobs of every
//! replica in one durable queue ([`JobQueue`], PostgreSQL in `tensor-wasm-shared`), run by
//! whichever replica claims them.
//!
//! A replica claims a queued job only while it holds a free instance slot, under a lease that
//! it renews while the job runs (three times per lease). A replica that dies stops renewing;
//! once the lease has ended, another replica claims the job again (its `attempts` grows), up to
//! [`QueueSettings::max_attempts`] starts, after which the job fails with `attempts_exhausted`.
//! Delivery is therefore at least once: the guest of an async job must tolerate running again.
//!
//! The attempt number fences each attempt's writes: a renewal or an outcome of an attempt whose
//! lease another replica has taken over is refused, and that outcome is discarded. Two replicas
//! run one job at the same time only if a live replica could not renew its lease for a whole
//! lease (a replica cut off from the database); the queue then keeps the newer attempt's
//! outcome.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use prometheus::{IntCounter, IntGauge, Registry};
use serde_json::json;
use tensor_wasm_runtime::Result;
use tokio::sync::{Notify, OwnedSemaphorePermit};

use super::{now_ms, Job, JobLimits, JobStatus};
use crate::AppState;

/// A durable queue of jobs shared by replicas. Blocking: the API calls it on blocking threads.
pub trait JobQueue: Send + Sync + 'static {
    /// Adds the queued `job` unless its tenant has `max_active` jobs queued or running, or a
    /// job with the same idempotency key (checked in the same transaction).
    fn submit(&self, job: &Job, max_active: usize) -> Result<Submitted>;

    /// Job `id` if `tenant` owns it.
    fn get(&self, tenant: &str, id: &str) -> Result<Option<Job>>;

    /// Cancels job `id` of `tenant`: a queued job becomes `cancelled` at once, a running one
    /// is marked `cancel_requested` and ends `cancelled`. Returns the job as it is now.
    fn cancel(&self, tenant: &str, id: &str) -> Result<Option<Job>>;

    /// Claims the oldest job that is queued, or running under a lease that has ended, for
    /// `replica` until `lease` from now: it becomes `running` and its `attempts` grows by one.
    /// No two callers claim the same job while its lease lasts.
    fn claim(&self, replica: &str, lease: Duration) -> Result<Option<Claim>>;

    /// Extends the lease of attempt `attempt` of job `id`; `false` when the attempt no longer
    /// holds the job (another replica took it over, it was cancelled while queued, or it is
    /// gone).
    fn renew(&self, id: &str, attempt: u32, lease: Duration) -> Result<bool>;

    /// Records the outcome of `job` (status, results or error, finishing time) if attempt
    /// `job.attempts` still holds it; a job whose cancellation was requested ends `cancelled`
    /// instead. Keeps the tenant's `retained` newest finished jobs and forgets older ones.
    /// Returns whether the outcome was recorded.
    fn finish(&self, job: &Job, retained: usize) -> Result<bool>;

    /// Puts attempt `attempt` of job `id` back in the queue (a replica shutting down before
    /// the job finished); returns whether it did.
    fn release(&self, id: &str, attempt: u32) -> Result<bool>;

    /// Forgets every job of `tenant` (a deleted tenant); returns how many.
    fn forget_tenant(&self, tenant: &str) -> Result<usize>;

    /// Forgets jobs that finished before `cutoff_ms`; returns how many.
    fn sweep(&self, cutoff_ms: u64) -> Result<usize>;

    /// Jobs queued (waiting for a replica), of every tenant.
    fn depth(&self) -> Result<u64>;
}

/// What [`JobQueue::submit`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    /// The job was added.
    Added,
    /// The tenant already has a job with this idempotency key: that job.
    Existing(Box<Job>),
    /// The tenant already has `max_active` jobs queued or running.
    TooManyActive,
}

/// A job claimed by [`JobQueue::claim`].
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The job, `running`, with `attempts` counting this start.
    pub job: Job,
    /// Whether the job was running under another lease that had ended (its replica stopped
    /// or was cut off).
    pub lease_expired: bool,
}

/// How this replica takes part in the shared queue (`serve` flags `--replica-name`,
/// `--job-lease-s`, `--job-max-attempts`, `--job-poll-ms`).
#[derive(Debug, Clone)]
pub struct QueueSettings {
    /// This replica's name in the queue's leases.
    pub replica: String,
    /// How long a claim holds a job without being renewed.
    pub lease: Duration,
    /// Starts a job may have; a job whose lease ends after the last fails with
    /// `attempts_exhausted`.
    pub max_attempts: u32,
    /// How often an idle replica looks for queued jobs (it is woken at once by jobs
    /// submitted to itself).
    pub poll: Duration,
}

impl Default for QueueSettings {
    fn default() -> Self {
        QueueSettings {
            replica: "replica".into(),
            lease: Duration::from_secs(30),
            max_attempts: 3,
            poll: Duration::from_millis(500),
        }
    }
}

/// The queue's metrics.
#[derive(Debug, Clone)]
struct QueueMetrics {
    depth: IntGauge,
    lease_expiries: IntCounter,
    attempts_exhausted: IntCounter,
}

impl QueueMetrics {
    fn register(registry: &Registry) -> prometheus::Result<Self> {
        let depth = IntGauge::new(
            "tensor_wasm_job_queue_depth",
            "Async jobs queued in the shared job queue and waiting for a replica, of every \
             tenant (read by this replica at most a second ago; the autoscaling signal).",
        )?;
        let lease_expiries = IntCounter::new(
            "tensor_wasm_job_lease_expiries_total",
            "Async jobs this replica claimed after the lease of the replica running them ended \
             (that replica stopped or was cut off): each is a job run again.",
        )?;
        let attempts_exhausted = IntCounter::new(
            "tensor_wasm_job_attempts_exhausted_total",
            "Async jobs this replica failed with attempts_exhausted: their lease ended after \
             the last start allowed (--job-max-attempts).",
        )?;
        registry.register(Box::new(depth.clone()))?;
        registry.register(Box::new(lease_expiries.clone()))?;
        registry.register(Box::new(attempts_exhausted.clone()))?;
        Ok(QueueMetrics {
            depth,
            lease_expiries,
            attempts_exhausted,
        })
    }
}

/// The shared queue as one replica uses it.
pub(crate) struct SharedQueue {
    pub(crate) queue: Arc<dyn JobQueue>,
    settings: QueueSettings,
    limits: JobLimits,
    wake: Notify,
    /// Jobs this replica runs now: id → attempt.
    running: Mutex<HashMap<String, u32>>,
    stopping: AtomicBool,
    metrics: QueueMetrics,
}

/// How often the depth gauge is read, and finished jobs past retention are forgotten.
const HOUSEKEEPING_EVERY: Duration = Duration::from_secs(1);

impl SharedQueue {
    /// Wakes this replica's dispatcher (a job was just submitted here).
    pub(crate) fn wake(&self) {
        self.wake.notify_one();
    }

    fn running(&self) -> std::sync::MutexGuard<'_, HashMap<String, u32>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Jobs this replica runs now.
    pub(crate) fn running_here(&self) -> usize {
        self.running().len()
    }

    /// Stops claiming jobs and puts those still running here back in the queue, for another
    /// replica to run; returns how many.
    pub(crate) fn stop(&self) -> usize {
        self.stopping.store(true, Ordering::Release);
        self.wake.notify_waiters();
        let held: Vec<(String, u32)> = self.running().drain().collect();
        held.into_iter()
            .filter(|(id, attempt)| match self.queue.release(id, *attempt) {
                Ok(released) => released,
                Err(e) => {
                    tracing::warn!(job = %id, error = %e, "could not put a job back in the queue; \
                        another replica takes it when its lease ends");
                    false
                }
            })
            .count()
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

impl AppState {
    /// Keeps asynchronous jobs in the shared `queue` from now on, instead of this process's
    /// job board, and starts this replica's dispatcher, which claims and runs queued jobs
    /// while instance slots are free. Call it once, inside the server's Tokio runtime.
    ///
    /// # Errors
    /// When the queue's metrics cannot be registered, or a queue is set already.
    pub fn use_job_queue(
        &self,
        queue: Arc<dyn JobQueue>,
        settings: QueueSettings,
    ) -> prometheus::Result<()> {
        let metrics = QueueMetrics::register(&self.inner.registry)?;
        let shared = Arc::new(SharedQueue {
            queue,
            settings,
            limits: self.inner.config.jobs.clone(),
            wake: Notify::new(),
            running: Mutex::new(HashMap::new()),
            stopping: AtomicBool::new(false),
            metrics,
        });
        self.inner
            .queue
            .set(shared.clone())
            .map_err(|_| prometheus::Error::Msg("a job queue is set already".into()))?;
        tokio::spawn(dispatch(self.clone(), shared.clone()));
        tokio::spawn(housekeeping(shared));
        Ok(())
    }
}

/// Claims jobs while a slot is free, and runs each in a task of its own.
async fn dispatch(state: AppState, shared: Arc<SharedQueue>) {
    loop {
        let Ok(permit) = state.inner.slots.clone().acquire_owned().await else {
            return;
        };
        if shared.stopping() {
            return;
        }
        // Not while the server is loading its functions or shutting down.
        if !state.inner.ready.load(Ordering::Acquire) {
            drop(permit);
            tokio::select! {
                () = shared.wake.notified() => {}
                () = tokio::time::sleep(shared.settings.poll) => {}
            }
            continue;
        }
        let claimed = {
            let (queue, settings) = (shared.queue.clone(), shared.settings.clone());
            tokio::task::spawn_blocking(move || queue.claim(&settings.replica, settings.lease))
                .await
        };
        match claimed {
            Ok(Ok(Some(claim))) => {
                if claim.lease_expired {
                    shared.metrics.lease_expiries.inc();
                    tracing::info!(job = %claim.job.id, attempt = claim.job.attempts,
                        "claimed a job whose lease had ended; running it again");
                }
                shared
                    .running()
                    .insert(claim.job.id.clone(), claim.job.attempts);
                tokio::spawn(run_claimed(
                    state.clone(),
                    shared.clone(),
                    claim.job,
                    permit,
                ));
                continue;
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "could not claim a job from the shared queue"),
            Err(e) => tracing::error!(error = %e, "claiming a job panicked"),
        }
        drop(permit);
        tokio::select! {
            () = shared.wake.notified() => {}
            () = tokio::time::sleep(shared.settings.poll) => {}
        }
        if shared.stopping() {
            return;
        }
    }
}

/// Reads the queue's depth into its gauge and forgets finished jobs past retention.
async fn housekeeping(shared: Arc<SharedQueue>) {
    let mut tick = tokio::time::interval(HOUSEKEEPING_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !shared.stopping() {
        tick.tick().await;
        let (queue, retention) = (shared.queue.clone(), shared.limits.retention);
        let read = tokio::task::spawn_blocking(move || {
            queue.sweep(now_ms().saturating_sub(retention.as_millis() as u64))?;
            queue.depth()
        })
        .await;
        match read {
            Ok(Ok(depth)) => shared.metrics.depth.set(depth as i64),
            Ok(Err(e)) => tracing::debug!(error = %e, "could not read the job queue's depth"),
            Err(e) => tracing::error!(error = %e, "job queue housekeeping panicked"),
        }
    }
}

/// Renews the lease of attempt `attempt` of job `id` three times per lease until aborted;
/// stops when the attempt lost the job.
async fn renew(shared: Arc<SharedQueue>, id: String, attempt: u32) {
    let lease = shared.settings.lease;
    let mut tick = tokio::time::interval(lease / 3);
    tick.tick().await; // the first tick is at once: the claim has just set the lease
    loop {
        tick.tick().await;
        let (queue, job) = (shared.queue.clone(), id.clone());
        match tokio::task::spawn_blocking(move || queue.renew(&job, attempt, lease)).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => {
                tracing::warn!(job = %id, attempt, "lost the lease of a running job; its outcome will be discarded");
                return;
            }
            Ok(Err(e)) => tracing::warn!(job = %id, error = %e, "could not renew a job's lease"),
            Err(_) => return,
        }
    }
}

/// Runs a claimed job holding `permit`, and records its outcome.
async fn run_claimed(
    state: AppState,
    shared: Arc<SharedQueue>,
    mut job: Job,
    permit: OwnedSemaphorePermit,
) {
    let attempt = job.attempts;
    if job.cancel_requested {
        job.status = JobStatus::Cancelled;
    } else if attempt > shared.settings.max_attempts {
        shared.metrics.attempts_exhausted.inc();
        job.status = JobStatus::Failed;
        job.error = Some(json!({
            "code": "attempts_exhausted",
            "message": format!(
                "the job was started {} times and its replica stopped each time (--job-max-attempts {})",
                attempt - 1,
                shared.settings.max_attempts
            ),
        }));
    } else {
        let renewer = tokio::spawn(renew(shared.clone(), job.id.clone(), attempt));
        let result = super::execute(&state, &job, permit).await;
        renewer.abort();
        super::settle(&mut job, result, shared.limits.max_result_bytes);
    }
    job.finished_at_ms = Some(now_ms());
    if !job.status.is_active() {
        let (queue, retained, record) = (
            shared.queue.clone(),
            shared.limits.max_retained_per_tenant,
            job.clone(),
        );
        match tokio::task::spawn_blocking(move || queue.finish(&record, retained)).await {
            Ok(Ok(true)) => {}
            Ok(Ok(false)) => tracing::warn!(job = %job.id, attempt,
                "a job's outcome was discarded: another replica took it over or it is gone"),
            Ok(Err(e)) => tracing::error!(job = %job.id, error = %e,
                "could not record a job's outcome; another replica runs it again when its lease ends"),
            Err(e) => {
                tracing::error!(job = %job.id, error = %e, "recording a job's outcome panicked")
            }
        }
    }
    let mut running = shared.running();
    if running.get(&job.id) == Some(&attempt) {
        running.remove(&job.id);
    }
}
