//! The `serve` flags that bound asynchronous jobs (`POST /functions/{id}/invoke-async`).

use std::time::Duration;

use clap::Args;
use tensor_wasm_api::{JobLimits, QueueSettings};

/// Bounds on asynchronous jobs; each flag also reads an environment variable.
#[derive(Debug, Args)]
pub struct JobFlags {
    /// Async jobs one tenant may have queued or running; beyond that `invoke-async` answers 429 `quota_exhausted`.
    #[arg(long, env = "TENSOR_WASM_MAX_ACTIVE_JOBS", default_value_t = 64,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_active_jobs: u32,
    /// Finished async jobs kept per tenant; past it the oldest finished job is forgotten (memory and disk).
    #[arg(long, env = "TENSOR_WASM_MAX_RETAINED_JOBS", default_value_t = 256,
          value_parser = clap::value_parser!(u32).range(1..))]
    max_retained_jobs: u32,
    /// Seconds a finished async job is kept (with its arguments and results).
    #[arg(long, env = "TENSOR_WASM_JOB_RETENTION_S", default_value_t = 3600)]
    job_retention_s: u64,
    /// Largest `invoke-async` request body in bytes (413 above): the arguments are kept with the job.
    #[arg(long, env = "TENSOR_WASM_MAX_JOB_REQUEST_BYTES", default_value_t = 16 << 10)]
    max_job_request_bytes: usize,
    /// Largest results of an async job in bytes of JSON; a job with larger results fails with `output_too_large`.
    #[arg(long, env = "TENSOR_WASM_MAX_JOB_RESULT_BYTES", default_value_t = 16 << 10)]
    max_job_result_bytes: usize,
    /// With `--store`: this replica's name in the shared job queue's leases (default: the host name and process id).
    #[arg(long, env = "TENSOR_WASM_REPLICA_NAME")]
    replica_name: Option<String>,
    /// With `--store`: seconds a replica's claim on a job lasts without renewal (renewed three times per lease while the job runs); a job whose replica dies runs again elsewhere after it.
    #[arg(long, env = "TENSOR_WASM_JOB_LEASE_S", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=86_400))]
    job_lease_s: u64,
    /// With `--store`: starts an async job may have before it fails with `attempts_exhausted` (its replica died each time).
    #[arg(long, env = "TENSOR_WASM_JOB_MAX_ATTEMPTS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=100))]
    job_max_attempts: u32,
    /// With `--store`: milliseconds between an idle replica's looks into the shared job queue (jobs submitted to the replica itself wake it at once).
    #[arg(long, env = "TENSOR_WASM_JOB_POLL_MS", default_value_t = 500,
          value_parser = clap::value_parser!(u64).range(10..=60_000))]
    job_poll_ms: u64,
}

impl JobFlags {
    /// The limits these flags set.
    pub fn limits(&self) -> JobLimits {
        JobLimits {
            max_active_per_tenant: self.max_active_jobs as usize,
            max_retained_per_tenant: self.max_retained_jobs as usize,
            retention: Duration::from_secs(self.job_retention_s),
            max_request_bytes: self.max_job_request_bytes,
            max_result_bytes: self.max_job_result_bytes,
        }
    }

    /// How this replica takes part in the shared job queue.
    pub fn queue(&self) -> QueueSettings {
        let replica = self.replica_name.clone().unwrap_or_else(|| {
            let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "tensor-wasm".into());
            format!("{host}-{}", std::process::id())
        });
        QueueSettings {
            replica,
            lease: Duration::from_secs(self.job_lease_s),
            max_attempts: self.job_max_attempts,
            poll: Duration::from_millis(self.job_poll_ms),
        }
    }
}
