//! The job board: every job in memory, found by id through a map, plus a
//! per-tenant index (jobs queued or running, finished jobs in the order they
//! finished) so that admission, eviction and lookups never scan other jobs.
//!
//! Each change is written to `<data_dir>/jobs/<id>.json` before it is
//! visible. A tenant keeps at most [`JobLimits::max_retained_per_tenant`]
//! finished jobs and each at most [`JobLimits::retention`]: the oldest
//! finished job is forgotten first, in memory and on disk.

use std::collections::{HashMap, VecDeque};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use serde_json::json;

use super::{now_ms, Job, JobStatus};
use crate::ErrorCode;

/// Bounds on asynchronous jobs (the `serve` flags `--max-active-jobs`,
/// `--max-retained-jobs`, `--job-retention-s`, `--max-job-request-bytes`,
/// `--max-job-result-bytes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobLimits {
    /// Jobs one tenant may have queued or running (429 `quota_exhausted` above).
    pub max_active_per_tenant: usize,
    /// Finished jobs kept per tenant; past it the oldest finished job is
    /// forgotten (memory and disk).
    pub max_retained_per_tenant: usize,
    /// How long a finished job is kept.
    pub retention: Duration,
    /// Largest `invoke-async` request body (413 `payload_too_large` above):
    /// the arguments are kept with the job.
    pub max_request_bytes: usize,
    /// Largest results of a job as JSON; a job whose results are larger
    /// fails with `output_too_large` and keeps none of them.
    pub max_result_bytes: usize,
}

impl Default for JobLimits {
    fn default() -> Self {
        JobLimits {
            max_active_per_tenant: 64,
            max_retained_per_tenant: 256,
            retention: Duration::from_secs(3600),
            max_request_bytes: 16 << 10,
            max_result_bytes: 16 << 10,
        }
    }
}

/// What [`JobBoard::admit`] did with a job.
#[derive(Debug)]
pub(crate) enum Admitted {
    /// The job was admitted.
    New,
    /// The tenant has a job with the same idempotency key: its id (the job itself may still
    /// be on its way to the disk).
    Existing(String),
}

/// Why a job was not admitted.
#[derive(Debug)]
pub(crate) enum Refused {
    /// The tenant already has `max_active_per_tenant` unfinished jobs.
    TooManyActive,
    /// The record could not be written.
    Io(std::io::Error),
}

#[derive(Debug, Default)]
struct TenantJobs {
    /// Queued or running jobs, admitted ones not yet visible included.
    active: usize,
    /// Finished jobs, the earliest finished first.
    finished: VecDeque<String>,
}

#[derive(Debug, Default)]
struct Jobs {
    by_id: HashMap<String, Job>,
    tenants: HashMap<String, TenantJobs>,
    /// (tenant, idempotency key) → job id, for the jobs kept.
    keys: HashMap<(String, String), String>,
}

impl Jobs {
    /// Records `job` (not yet counted anywhere) in the index.
    fn index(&mut self, job: &Job) {
        if let Some(key) = &job.idempotency_key {
            self.keys
                .insert((job.tenant.clone(), key.clone()), job.id.clone());
        }
        let of = self.tenants.entry(job.tenant.clone()).or_default();
        if job.status.is_active() {
            of.active += 1;
        } else {
            of.finished.push_back(job.id.clone());
        }
    }

    /// Forgets `tenant`'s finished jobs past `limits` or finished before
    /// `cutoff_ms`, oldest first; returns their ids.
    fn evict(&mut self, tenant: &str, limits: &JobLimits, cutoff_ms: u64) -> Vec<String> {
        let Some(of) = self.tenants.get_mut(tenant) else {
            return Vec::new();
        };
        let mut gone = Vec::new();
        while let Some(oldest) = of.finished.front() {
            let expired = self
                .by_id
                .get(oldest)
                .is_none_or(|j| j.finished_at_ms.is_some_and(|f| f < cutoff_ms));
            if of.finished.len() <= limits.max_retained_per_tenant && !expired {
                break;
            }
            let id = of.finished.pop_front().expect("a front exists");
            gone.push(id);
        }
        if of.active == 0 && of.finished.is_empty() {
            self.tenants.remove(tenant);
        }
        for id in &gone {
            self.remove(id);
        }
        gone
    }

    /// Removes job `id` and its idempotency key from the map (not from the per-tenant index).
    fn remove(&mut self, id: &str) {
        if let Some(job) = self.by_id.remove(id) {
            if let Some(key) = job.idempotency_key {
                self.keys.remove(&(job.tenant, key));
            }
        }
    }
}

/// Jobs in memory, each change persisted before it is visible.
#[derive(Debug)]
pub struct JobBoard {
    dir: Option<PathBuf>,
    limits: JobLimits,
    jobs: Mutex<Jobs>,
    order: super::order::WriteOrder,
}

impl JobBoard {
    /// Jobs kept only in memory (tests, embedding).
    pub fn in_memory(limits: JobLimits) -> Self {
        JobBoard {
            dir: None,
            limits,
            jobs: Mutex::new(Jobs::default()),
            order: super::order::WriteOrder::default(),
        }
    }

    /// Opens `<data_dir>/jobs`: unfinished jobs of an earlier run become
    /// `failed: server restarted`; finished ones past retention or past the
    /// per-tenant bound are removed.
    pub fn open(data_dir: &Path, limits: JobLimits) -> std::io::Result<Self> {
        let dir = data_dir.join("jobs");
        tensor_wasm_durable::create_dir_all(&dir)?;
        let board = JobBoard {
            dir: Some(dir.clone()),
            limits,
            jobs: Mutex::new(Jobs::default()),
            order: super::order::WriteOrder::default(),
        };
        let mut loaded = Vec::new();
        for entry in fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                let _ = fs::remove_file(&path); // leftovers of interrupted writes
                continue;
            }
            let Ok(mut job) = fs::read(&path)
                .map_err(|e| e.to_string())
                .and_then(|b| serde_json::from_slice::<Job>(&b).map_err(|e| e.to_string()))
            else {
                tracing::error!(path = %path.display(), "skipping unreadable job record");
                continue;
            };
            if job.status.is_active() {
                job.status = JobStatus::Failed;
                job.error = Some(
                    json!({"code": "server_restarted", "message": "failed: server restarted"}),
                );
                job.finished_at_ms = Some(now_ms());
                board.persist(&job)?;
            }
            loaded.push(job);
        }
        // Finished queues are in finishing order, as if the jobs finished now.
        loaded.sort_by_key(|j| (j.finished_at_ms, j.created_at_ms));
        let tenants: Vec<String> = {
            let mut jobs = board.lock();
            for job in loaded {
                jobs.index(&job);
                jobs.by_id.insert(job.id.clone(), job);
            }
            jobs.tenants.keys().cloned().collect()
        };
        let cutoff = board.cutoff_ms();
        for tenant in tenants {
            let gone = board.lock().evict(&tenant, &board.limits, cutoff);
            board.remove_files(&gone);
        }
        Ok(board)
    }

    /// The limits this board enforces.
    pub fn limits(&self) -> &JobLimits {
        &self.limits
    }

    fn lock(&self) -> MutexGuard<'_, Jobs> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn cutoff_ms(&self) -> u64 {
        now_ms().saturating_sub(self.limits.retention.as_millis() as u64)
    }

    fn file(dir: &Path, id: &str) -> PathBuf {
        dir.join(format!("{id}.json"))
    }

    fn persist(&self, job: &Job) -> std::io::Result<()> {
        let Some(dir) = &self.dir else {
            return Ok(());
        };
        let bytes = serde_json::to_vec_pretty(job).expect("jobs serialize");
        tensor_wasm_durable::write_file(
            Self::file(dir, &job.id),
            &bytes,
            &tensor_wasm_durable::WriteOptions::new(),
        )?;
        Ok(())
    }

    fn remove_files(&self, ids: &[String]) {
        let Some(dir) = &self.dir else {
            return;
        };
        for id in ids {
            self.order.forget(id);
            let _ = fs::remove_file(Self::file(dir, id));
        }
    }

    /// Removes finished jobs past retention, looking only at the oldest
    /// finished job of each tenant.
    pub fn sweep(&self) {
        let cutoff = self.cutoff_ms();
        let gone: Vec<String> = {
            let mut jobs = self.lock();
            let tenants: Vec<String> = jobs.tenants.keys().cloned().collect();
            tenants
                .iter()
                .flat_map(|t| jobs.evict(t, &self.limits, cutoff))
                .collect()
        };
        self.remove_files(&gone);
    }

    /// A job of `tenant`, if it exists.
    pub fn get(&self, tenant: &str, id: &str) -> Option<Job> {
        self.lock()
            .by_id
            .get(id)
            .filter(|j| j.tenant == tenant)
            .cloned()
    }

    /// Forgets every job of `tenant` (a deleted tenant), files included;
    /// returns how many. A job of it still running afterwards finds its record
    /// gone and writes nothing (see [`JobBoard::update`]).
    pub(crate) fn forget_tenant(&self, tenant: &str) -> usize {
        let gone: Vec<String> = {
            let mut jobs = self.lock();
            jobs.tenants.remove(tenant);
            let ids: Vec<String> = jobs
                .by_id
                .values()
                .filter(|j| j.tenant == tenant)
                .map(|j| j.id.clone())
                .collect();
            for id in &ids {
                jobs.remove(id);
            }
            jobs.keys.retain(|(of, _), _| of != tenant);
            ids
        };
        self.remove_files(&gone);
        gone.len()
    }

    /// Finished jobs `tenant` keeps.
    #[cfg(test)]
    pub(crate) fn retained_of(&self, tenant: &str) -> usize {
        self.lock()
            .tenants
            .get(tenant)
            .map_or(0, |t| t.finished.len())
    }

    /// Jobs queued or running, of every tenant.
    pub fn unfinished(&self) -> usize {
        self.lock().tenants.values().map(|t| t.active).sum()
    }

    /// Admits the queued `job` unless its tenant has a job with the same
    /// idempotency key or `max_active_per_tenant` unfinished jobs (checked,
    /// counted and the key reserved under one lock), persists it, then makes
    /// it visible.
    pub(crate) fn admit(&self, job: Job) -> Result<Admitted, Refused> {
        debug_assert!(job.status.is_active());
        let key = job
            .idempotency_key
            .as_ref()
            .map(|k| (job.tenant.clone(), k.clone()));
        {
            let mut jobs = self.lock();
            if let Some(existing) = key.as_ref().and_then(|k| jobs.keys.get(k)) {
                return Ok(Admitted::Existing(existing.clone()));
            }
            let of = jobs.tenants.entry(job.tenant.clone()).or_default();
            if of.active >= self.limits.max_active_per_tenant {
                return Err(Refused::TooManyActive);
            }
            of.active += 1;
            if let Some(key) = &key {
                jobs.keys.insert(key.clone(), job.id.clone());
            }
        }
        if let Err(e) = self.persist(&job) {
            let mut jobs = self.lock();
            if let Some(of) = jobs.tenants.get_mut(&job.tenant) {
                of.active -= 1;
            }
            if let Some(key) = &key {
                jobs.keys.remove(key);
            }
            return Err(Refused::Io(e));
        }
        self.lock().by_id.insert(job.id.clone(), job);
        Ok(Admitted::New)
    }

    /// Stores `job` whatever its state, unchecked (tests set up boards).
    #[cfg(test)]
    pub(crate) fn insert(&self, job: Job) -> std::io::Result<()> {
        self.persist(&job)?;
        let mut jobs = self.lock();
        jobs.index(&job);
        jobs.by_id.insert(job.id.clone(), job);
        Ok(())
    }

    /// Records every queued or running job as failed with `code` and
    /// `message` (persisted before it returns); returns how many. A job
    /// task still running afterwards cannot change them back.
    pub fn fail_unfinished(&self, code: ErrorCode, message: &str) -> usize {
        let ids: Vec<String> = self
            .lock()
            .by_id
            .values()
            .filter(|j| j.status.is_active())
            .map(|j| j.id.clone())
            .collect();
        let mut failed = 0;
        for id in ids {
            self.update(&id, |j| {
                if j.status.is_active() {
                    j.status = JobStatus::Failed;
                    j.error = Some(json!({"code": code, "message": message}));
                    j.finished_at_ms = Some(now_ms());
                    failed += 1;
                }
            });
        }
        failed
    }

    /// Applies `change` to job `id` and persists it if it changed; returns
    /// the new record. A job that finishes joins its tenant's finished
    /// queue, which may forget the oldest finished jobs.
    pub(crate) fn update(&self, id: &str, change: impl FnOnce(&mut Job)) -> Option<Job> {
        let mut jobs = self.lock();
        let job = jobs.by_id.get_mut(id)?;
        let before = job.clone();
        change(job);
        let after = job.clone();
        if after == before {
            return Some(after);
        }
        let mut gone = Vec::new();
        if before.status.is_active() && !after.status.is_active() {
            let of = jobs.tenants.entry(after.tenant.clone()).or_default();
            of.active -= 1;
            of.finished.push_back(after.id.clone());
            gone = jobs.evict(&after.tenant, &self.limits, self.cutoff_ms());
        }
        // Taken under the lock: ticket order is the order of the changes.
        let ticket = self.order.ticket(id);
        drop(jobs);
        self.remove_files(&gone);
        if let Err(e) = ticket.persist(|| self.persist(&after)) {
            tracing::error!(job = id, error = %e, "could not persist a job update");
        }
        // Forgotten while it was being written (evicted by another job
        // finishing): its file must not outlive it.
        if !self.lock().by_id.contains_key(id) {
            self.remove_files(&[id.to_owned()]);
        }
        Some(after)
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::job;
    use super::*;

    fn finished(tenant: &str, at_ms: u64) -> Job {
        Job {
            tenant: tenant.into(),
            finished_at_ms: Some(at_ms),
            ..job(JobStatus::Succeeded)
        }
    }

    /// A deleted tenant's jobs go, finished or not, files included; a job of it
    /// that finishes afterwards writes nothing back.
    #[test]
    fn a_deleted_tenants_jobs_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let board = JobBoard::open(dir.path(), JobLimits::default()).unwrap();
        let queued = |tenant: &str| Job {
            tenant: tenant.into(),
            ..job(JobStatus::Queued)
        };
        let (done, running, other) = (queued("tn-gone"), queued("tn-gone"), queued("tn-kept"));
        for j in [&done, &running, &other] {
            board.admit(j.clone()).unwrap();
        }
        board.update(&done.id, |j| j.status = JobStatus::Succeeded);
        assert_eq!(board.forget_tenant("tn-gone"), 2);
        assert!(board.get("tn-gone", &done.id).is_none());
        assert!(board
            .update(&running.id, |j| j.status = JobStatus::Failed)
            .is_none());
        assert!(board.get("tn-kept", &other.id).is_some());
        let files: Vec<_> = fs::read_dir(dir.path().join("jobs"))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(files, [format!("{}.json", other.id)]);
        assert_eq!(board.unfinished(), 1);
    }

    #[test]
    fn reopening_keeps_the_newest_finished_jobs_of_each_tenant() {
        let dir = tempfile::tempdir().unwrap();
        let unbounded = JobLimits {
            max_retained_per_tenant: usize::MAX,
            ..JobLimits::default()
        };
        let board = JobBoard::open(dir.path(), unbounded).unwrap();
        let now = now_ms();
        let mut ids = Vec::new();
        for i in 0..5 {
            let j = Job {
                status: JobStatus::Queued,
                finished_at_ms: None,
                ..finished("tn-a", 0)
            };
            board.admit(j.clone()).unwrap();
            board.update(&j.id, |j| {
                j.status = JobStatus::Succeeded;
                j.finished_at_ms = Some(now - 100 + i);
            });
            ids.push(j.id);
        }
        let other = finished("tn-b", now);
        board
            .admit(Job {
                status: JobStatus::Queued,
                ..other.clone()
            })
            .unwrap();
        board.update(&other.id, |j| j.status = JobStatus::Succeeded);
        drop(board);

        let limits = JobLimits {
            max_retained_per_tenant: 2,
            ..JobLimits::default()
        };
        let board = JobBoard::open(dir.path(), limits).unwrap();
        let kept: Vec<bool> = ids
            .iter()
            .map(|id| board.get("tn-a", id).is_some())
            .collect();
        assert_eq!(kept, [false, false, false, true, true]);
        assert!(board.get("tn-b", &other.id).is_some(), "per tenant");
        let files = fs::read_dir(dir.path().join("jobs")).unwrap().count();
        assert_eq!(files, 3);
    }

    #[test]
    fn admission_counts_unfinished_jobs_per_tenant() {
        let board = JobBoard::in_memory(JobLimits {
            max_active_per_tenant: 2,
            ..JobLimits::default()
        });
        let queued = |t: &str| Job {
            tenant: t.into(),
            ..job(JobStatus::Queued)
        };
        let first = queued("tn-a");
        board.admit(first.clone()).unwrap();
        board.admit(queued("tn-a")).unwrap();
        assert!(matches!(
            board.admit(queued("tn-a")),
            Err(Refused::TooManyActive)
        ));
        board.admit(queued("tn-b")).unwrap();
        board.update(&first.id, |j| {
            j.status = JobStatus::Cancelled;
            j.finished_at_ms = Some(now_ms());
        });
        board.admit(queued("tn-a")).unwrap();
        assert_eq!(board.unfinished(), 3);
        assert_eq!(board.retained_of("tn-a"), 1);
    }
}
