//! The shared queue of asynchronous jobs ([`JobQueue`] over table `tw_jobs`, migration 3).
//!
//! Each job is one row: the job as submitted (`record`) and its state beside it. A replica
//! claims the oldest queued job, or a running one whose lease has ended, with
//! `FOR UPDATE SKIP LOCKED`, so that replicas claiming at once never wait for each other nor
//! take the same job. The claim sets the lease by the database's clock (replicas' clocks may
//! differ) and counts the attempt; renewals, outcomes and releases name the attempt, and only
//! the attempt that holds the job may write them.
//!
//! Admission is exact across replicas: the tenant's unfinished jobs are counted, and its
//! idempotency key looked up, in the transaction that inserts the job, under a per-tenant
//! transaction lock.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::time::Duration;
use tensor_wasm_api::{Claim, Job, JobQueue, JobStatus, Submitted};
use tensor_wasm_runtime::Result;
use tokio_postgres::Row;

use crate::store::{from_json, Shared, SharedStore};

/// The columns [`job_of`] reads, in any statement that returns a job.
const JOB_COLUMNS: &str =
    "id, record, status, outcome, attempts, cancel_requested, started_at_ms, finished_at_ms";

/// What a job's call gave: results, or an error.
#[derive(Debug, Serialize, Deserialize)]
struct Outcome {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    results: Option<Vec<Value>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<Value>,
}

fn status_name(status: JobStatus) -> String {
    match serde_json::to_value(status) {
        Ok(Value::String(name)) => name,
        _ => unreachable!("job statuses serialize as strings"),
    }
}

/// The job a row of [`JOB_COLUMNS`] holds.
fn job_of(row: &Row) -> Shared<Job> {
    let id: String = row.get("id");
    let mut job: Job = from_json(row.get("record"), &format!("job record {id}"))?;
    job.status = from_json(
        Value::String(row.get("status")),
        &format!("status of job {id}"),
    )?;
    if let Some(outcome) = row.get::<_, Option<Value>>("outcome") {
        let outcome: Outcome = from_json(outcome, &format!("outcome of job {id}"))?;
        job.results = outcome.results;
        job.error = outcome.error;
    }
    job.attempts = u32::try_from(row.get::<_, i32>("attempts")).unwrap_or(0);
    job.cancel_requested = row.get("cancel_requested");
    job.started_at_ms = row
        .get::<_, Option<i64>>("started_at_ms")
        .map(|ms| ms as u64);
    job.finished_at_ms = row
        .get::<_, Option<i64>>("finished_at_ms")
        .map(|ms| ms as u64);
    Ok(job)
}

fn seconds(lease: Duration) -> f64 {
    lease.as_secs_f64()
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

impl JobQueue for SharedStore {
    fn submit(&self, job: &Job, max_active: usize) -> Result<Submitted> {
        let job = job.clone();
        self.with_db("tw_jobs", move |db| async move {
            let mut client = db.client().await?;
            let tx = client.transaction().await?;
            tx.execute(
                "SELECT pg_advisory_xact_lock(hashtext('tw_jobs:' || $1))",
                &[&job.tenant],
            )
            .await?;
            if let Some(key) = &job.idempotency_key {
                let sql = format!(
                    "SELECT {JOB_COLUMNS} FROM tw_jobs WHERE tenant = $1 AND idempotency_key = $2"
                );
                if let Some(row) = tx.query_opt(&sql, &[&job.tenant, key]).await? {
                    return Ok(Submitted::Existing(Box::new(job_of(&row)?)));
                }
            }
            let active: i64 = tx
                .query_one(
                    "SELECT count(*) FROM tw_jobs
                     WHERE tenant = $1 AND status IN ('queued', 'running')",
                    &[&job.tenant],
                )
                .await?
                .get(0);
            if active >= i64::try_from(max_active).unwrap_or(i64::MAX) {
                return Ok(Submitted::TooManyActive);
            }
            tx.execute(
                "INSERT INTO tw_jobs (id, tenant, status, record, created_at_ms, idempotency_key)
                 VALUES ($1, $2, 'queued', $3, $4, $5)",
                &[
                    &job.id,
                    &job.tenant,
                    &serde_json::to_value(&job).expect("jobs serialize"),
                    &(job.created_at_ms as i64),
                    &job.idempotency_key,
                ],
            )
            .await?;
            tx.commit().await?;
            Ok(Submitted::Added)
        })
    }

    fn get(&self, tenant: &str, id: &str) -> Result<Option<Job>> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.with_db("tw_jobs", move |db| async move {
            let sql = format!("SELECT {JOB_COLUMNS} FROM tw_jobs WHERE id = $1 AND tenant = $2");
            let row = db.client().await?.query_opt(&sql, &[&id, &tenant]).await?;
            row.as_ref().map(job_of).transpose()
        })
    }

    fn cancel(&self, tenant: &str, id: &str) -> Result<Option<Job>> {
        let (tenant, id) = (tenant.to_owned(), id.to_owned());
        self.with_db("tw_jobs", move |db| async move {
            // `status` on the right-hand side is the row's state before this update.
            let sql = format!(
                "UPDATE tw_jobs SET cancel_requested = true,
                     status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
                     finished_at_ms = CASE WHEN status = 'queued' THEN $3 ELSE finished_at_ms END
                 WHERE id = $1 AND tenant = $2 AND status IN ('queued', 'running')
                 RETURNING {JOB_COLUMNS}"
            );
            let client = db.client().await?;
            if let Some(row) = client.query_opt(&sql, &[&id, &tenant, &now_ms()]).await? {
                return job_of(&row).map(Some);
            }
            let sql = format!("SELECT {JOB_COLUMNS} FROM tw_jobs WHERE id = $1 AND tenant = $2");
            let row = client.query_opt(&sql, &[&id, &tenant]).await?;
            row.as_ref().map(job_of).transpose()
        })
    }

    fn claim(&self, replica: &str, lease: Duration) -> Result<Option<Claim>> {
        let replica = replica.to_owned();
        self.with_db("tw_jobs", move |db| async move {
            let sql = format!(
                "WITH next AS (
                     SELECT id, status AS was FROM tw_jobs
                     WHERE status = 'queued' OR (status = 'running' AND lease_until < now())
                     ORDER BY created_at_ms, id
                     LIMIT 1
                     FOR UPDATE SKIP LOCKED)
                 UPDATE tw_jobs j SET status = 'running', attempts = j.attempts + 1,
                     lease_owner = $1, lease_until = now() + make_interval(secs => $2),
                     started_at_ms = $3
                 FROM next WHERE j.id = next.id
                 RETURNING next.was, {}",
                JOB_COLUMNS
                    .split(", ")
                    .map(|c| format!("j.{c}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            let row = db
                .client()
                .await?
                .query_opt(&sql, &[&replica, &seconds(lease), &now_ms()])
                .await?;
            let Some(row) = row else {
                return Ok(None);
            };
            let was: String = row.get("was");
            Ok(Some(Claim {
                job: job_of(&row)?,
                lease_expired: was == "running",
            }))
        })
    }

    fn renew(&self, id: &str, attempt: u32, lease: Duration) -> Result<bool> {
        let id = id.to_owned();
        self.with_db("tw_jobs", move |db| async move {
            let renewed = db
                .client()
                .await?
                .execute(
                    "UPDATE tw_jobs SET lease_until = now() + make_interval(secs => $3)
                     WHERE id = $1 AND attempts = $2 AND status = 'running'",
                    &[&id, &(attempt as i32), &seconds(lease)],
                )
                .await?;
            Ok(renewed == 1)
        })
    }

    fn finish(&self, job: &Job, retained: usize) -> Result<bool> {
        let job = job.clone();
        self.with_db("tw_jobs", move |db| async move {
            let outcome = Outcome {
                results: job.results.clone(),
                error: job.error.clone(),
            };
            let outcome = serde_json::to_value(&outcome).expect("outcomes serialize");
            let mut client = db.client().await?;
            let tx = client.transaction().await?;
            let finished = tx
                .execute(
                    "UPDATE tw_jobs SET
                         status = CASE WHEN cancel_requested THEN 'cancelled' ELSE $3::text END,
                         outcome = CASE WHEN cancel_requested THEN NULL ELSE $4::jsonb END,
                         finished_at_ms = $5, lease_owner = NULL, lease_until = NULL
                     WHERE id = $1 AND attempts = $2 AND status = 'running'",
                    &[
                        &job.id,
                        &(job.attempts as i32),
                        &status_name(job.status),
                        &outcome,
                        &job.finished_at_ms.map(|ms| ms as i64),
                    ],
                )
                .await?;
            // The tenant keeps its `retained` newest finished jobs.
            tx.execute(
                "DELETE FROM tw_jobs WHERE tenant = $1 AND finished_at_ms IS NOT NULL
                     AND id NOT IN (SELECT id FROM tw_jobs
                                    WHERE tenant = $1 AND finished_at_ms IS NOT NULL
                                    ORDER BY finished_at_ms DESC, id DESC LIMIT $2)",
                &[&job.tenant, &i64::try_from(retained).unwrap_or(i64::MAX)],
            )
            .await?;
            tx.commit().await?;
            Ok(finished == 1)
        })
    }

    fn release(&self, id: &str, attempt: u32) -> Result<bool> {
        let id = id.to_owned();
        self.with_db("tw_jobs", move |db| async move {
            // The attempt stays counted: the released attempt's number must not be handed out
            // again while its guest may still be finishing.
            let released = db
                .client()
                .await?
                .execute(
                    "UPDATE tw_jobs SET status = 'queued', lease_owner = NULL, lease_until = NULL
                     WHERE id = $1 AND attempts = $2 AND status = 'running'",
                    &[&id, &(attempt as i32)],
                )
                .await?;
            Ok(released == 1)
        })
    }

    fn forget_tenant(&self, tenant: &str) -> Result<usize> {
        let tenant = tenant.to_owned();
        self.with_db("tw_jobs", move |db| async move {
            let gone = db
                .client()
                .await?
                .execute("DELETE FROM tw_jobs WHERE tenant = $1", &[&tenant])
                .await?;
            Ok(gone as usize)
        })
    }

    fn sweep(&self, cutoff_ms: u64) -> Result<usize> {
        self.with_db("tw_jobs", move |db| async move {
            let gone = db
                .client()
                .await?
                .execute(
                    "DELETE FROM tw_jobs WHERE finished_at_ms < $1",
                    &[&(cutoff_ms as i64)],
                )
                .await?;
            Ok(gone as usize)
        })
    }

    fn depth(&self) -> Result<u64> {
        self.with_db("tw_jobs", move |db| async move {
            let queued: i64 = db
                .client()
                .await?
                .query_one("SELECT count(*) FROM tw_jobs WHERE status = 'queued'", &[])
                .await?
                .get(0);
            Ok(queued as u64)
        })
    }
}
