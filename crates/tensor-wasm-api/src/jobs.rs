//! Asynchronous invocations: `POST /functions/{id}/invoke-async` answers 202
//! with a job id at once; `GET /jobs/{id}` tells status, result or error and
//! timings; `DELETE /jobs/{id}` cancels.
//!
//! Jobs are tenant-scoped (another tenant's job id answers 404) and bounded
//! ([`JobLimits`]: jobs queued or running and finished jobs kept per tenant,
//! retention, request and result sizes), and durable: each state change is written to
//! `<data_dir>/jobs/<id>.json` by `tensor_wasm_durable::write_file` (temp file,
//! fsync, rename, directory fsync) before it is acknowledged, in the order the
//! changes were made ([`order::WriteOrder`]), and a job that
//! was queued or running when the server stopped comes back as `failed: server
//! restarted` instead of vanishing. A graceful
//! shutdown waits for unfinished jobs up to its deadline and records those
//! still unfinished then as failed with code `shutting_down`.
//!
//! Cancelling a queued job stops it before it runs. A running guest cannot be
//! interrupted from outside its store: it runs to completion (or its
//! deadline) and its outcome is discarded; the job reads `cancelled`.

mod board;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

mod order;

use crate::auth::Caller;
use crate::{ApiError, AppState, ErrorCode};

pub use board::{JobBoard, JobLimits};

/// Where a job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl JobStatus {
    fn is_active(self) -> bool {
        matches!(self, JobStatus::Queued | JobStatus::Running)
    }
}

/// The durable record of a job (what `GET /jobs/{id}` answers).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Job {
    pub id: String,
    pub tenant: String,
    pub function_id: String,
    pub export: String,
    pub args: Vec<Value>,
    pub status: JobStatus,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub results: Option<Vec<Value>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<Value>,
    pub created_at_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub started_at_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub finished_at_ms: Option<u64>,
    #[serde(default)]
    pub cancel_requested: bool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn new_job_id() -> String {
    let mut raw = [0u8; 12];
    getrandom::fill(&mut raw).expect("the OS random source is available");
    format!(
        "job-{}",
        raw.iter().map(|b| format!("{b:02x}")).collect::<String>()
    )
}

fn is_valid_job_id(id: &str) -> bool {
    id.len() == 28 && id.starts_with("job-") && id[4..].bytes().all(|b| b.is_ascii_hexdigit())
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct AsyncCall {
    export: String,
    #[serde(default)]
    args: Vec<Value>,
}

pub(crate) async fn invoke_async(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    let memory = crate::routes::owned_export_function(&state, &tenant, &id, "invoke-async")?;
    let body = crate::routes::body(bytes)?;
    // The arguments are kept with the job (memory and disk) until it is
    // forgotten: bounded before they are parsed.
    let max_request = state.inner.jobs.limits().max_request_bytes;
    if body.len() > max_request {
        return Err(ApiError::new(
            ErrorCode::PayloadTooLarge,
            format!(
                "an async call's body is {} bytes, more than the {max_request} allowed (max_job_request_bytes)",
                body.len()
            ),
        ));
    }
    let call: AsyncCall = crate::routes::parse_json(&body)?;
    {
        let (runtime, id, export, args) = (
            state.inner.runtime.clone(),
            id.clone(),
            call.export.clone(),
            call.args.clone(),
        );
        crate::routes::blocking(move || runtime.check_export_call(&id, &export, &args)).await?;
    }
    let board = &state.inner.jobs;
    board.sweep();
    let job = Job {
        id: new_job_id(),
        tenant: tenant.id().to_owned(),
        function_id: id.clone(),
        export: call.export,
        args: call.args,
        status: JobStatus::Queued,
        results: None,
        error: None,
        created_at_ms: now_ms(),
        started_at_ms: None,
        finished_at_ms: None,
        cancel_requested: false,
    };
    match board.admit(job.clone()) {
        Ok(()) => {}
        Err(board::Refused::TooManyActive) => {
            let limit = board.limits().max_active_per_tenant;
            let mut e = ApiError::new(
                ErrorCode::QuotaExhausted,
                format!(
                    "tenant {}: {limit} jobs are already queued or running (max_active_jobs)",
                    tenant.id()
                ),
            );
            e.retry_after_s = Some(1);
            return Err(e);
        }
        Err(board::Refused::Io(e)) => return Err(ApiError::internal(e)),
    }
    // A tenant deleted meanwhile: its delete forgets the jobs admitted before
    // it, and this one, admitted after, goes the same way (nothing is kept
    // for a deleted tenant).
    if state.inner.runtime.is_tenant_retired(tenant.id()) {
        board.forget_tenant(tenant.id());
        return Err(
            tensor_wasm_runtime::RuntimeError::TenantRetired(tenant.id().to_owned()).into(),
        );
    }

    let task_state = state.clone();
    let job_id = job.id.clone();
    tokio::spawn(async move {
        run_job(task_state, tenant, job_id, memory).await;
    });
    let location = format!("/jobs/{}", job.id);
    Ok((
        StatusCode::ACCEPTED,
        [(header::LOCATION, location)],
        Json(json!({ "job_id": job.id, "status": job.status })),
    )
        .into_response())
}

async fn run_job(
    state: AppState,
    tenant: Arc<tensor_wasm_tenant::Tenant>,
    job_id: String,
    memory: u64,
) {
    let board = &state.inner.jobs;
    // Every transition starts from an unfinished state: a job cancelled or
    // failed meanwhile (e.g. by a shutdown) keeps what it was given.
    let fail = |error: ApiError| {
        board.update(&job_id, |j| {
            if !j.status.is_active() {
                return;
            }
            j.status = JobStatus::Failed;
            j.error = Some(json!({"code": error.code, "message": error.message}));
            j.finished_at_ms = Some(now_ms());
        });
    };
    // Quotas and a slot are taken when the job starts, like any invocation.
    let uvm = state.inner.runtime.is_uvm_backed();
    let guards = match crate::routes::invocation_guards(&tenant, memory, uvm) {
        Ok(g) => g,
        Err(e) => return fail(e),
    };
    let permit = match crate::routes::acquire_slot(&state).await {
        Ok(p) => p,
        Err(e) => return fail(e),
    };
    let Some(job) = board.update(&job_id, |j| {
        if j.status == JobStatus::Queued && !j.cancel_requested {
            j.status = JobStatus::Running;
            j.started_at_ms = Some(now_ms());
        }
    }) else {
        return;
    };
    if job.status != JobStatus::Running {
        return;
    }
    let runtime = state.inner.runtime.clone();
    let max_result = board.limits().max_result_bytes;
    // A job past its deadline (a kernel that cannot be stopped) fails with
    // `invocation_timeout` by the deadline + grace, as a direct call is
    // answered; the work keeps its slot and quotas until the guest stops.
    let timeout = runtime.timeout_of(&job.function_id).ok();
    let work = crate::routes::blocking(move || {
        let _held = (permit, guards);
        runtime.invoke_export(&job.function_id, &job.export, &job.args)
    });
    let result = match timeout {
        Some(timeout) => crate::routes::within_deadline(timeout, work).await,
        None => work.await,
    };
    board.update(&job_id, |j| {
        if !j.status.is_active() {
            return;
        }
        j.finished_at_ms = Some(now_ms());
        if j.cancel_requested {
            j.status = JobStatus::Cancelled;
            return;
        }
        match result {
            Ok(results) if json_len(&results) > max_result => {
                j.status = JobStatus::Failed;
                j.error = Some(json!({
                    "code": ErrorCode::OutputTooLarge,
                    "message": format!(
                        "the results are {} bytes as JSON, more than the {max_result} a job keeps (max_job_result_bytes)",
                        json_len(&results)
                    ),
                }));
            }
            Ok(results) => {
                j.status = JobStatus::Succeeded;
                j.results = Some(results);
            }
            Err(e) => {
                j.status = JobStatus::Failed;
                j.error = Some(json!({"code": e.code, "message": e.message}));
            }
        }
    });
}

fn json_len(values: &[Value]) -> usize {
    serde_json::to_vec(values).map_or(usize::MAX, |v| v.len())
}

fn job_not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("job {id} not found"))
}

pub(crate) async fn get_job(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Job>, ApiError> {
    let tenant = caller.tenant()?;
    if !is_valid_job_id(&id) {
        return Err(job_not_found(&id));
    }
    state
        .inner
        .jobs
        .get(tenant.id(), &id)
        .map(Json)
        .ok_or_else(|| job_not_found(&id))
}

pub(crate) async fn cancel_job(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Job>, ApiError> {
    let tenant = caller.tenant()?;
    if !is_valid_job_id(&id) || state.inner.jobs.get(tenant.id(), &id).is_none() {
        return Err(job_not_found(&id));
    }
    let job = state
        .inner
        .jobs
        .update(&id, |j| {
            if j.status.is_active() {
                j.cancel_requested = true;
                if j.status == JobStatus::Queued {
                    j.status = JobStatus::Cancelled;
                    j.finished_at_ms = Some(now_ms());
                }
            }
        })
        .ok_or_else(|| job_not_found(&id))?;
    Ok(Json(job))
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn job(status: JobStatus) -> Job {
        Job {
            id: new_job_id(),
            tenant: "tn-0123456789abcdef".into(),
            function_id: "fn-0123456789abcdef01234567".into(),
            export: "add".into(),
            args: vec![json!(1)],
            status,
            results: None,
            error: None,
            created_at_ms: now_ms(),
            started_at_ms: None,
            finished_at_ms: None,
            cancel_requested: false,
        }
    }

    #[test]
    fn unfinished_jobs_survive_a_restart_as_failed() {
        let dir = tempfile::tempdir().unwrap();
        let board = JobBoard::open(dir.path(), JobLimits::default()).unwrap();
        let (queued, running, done) = (
            job(JobStatus::Queued),
            job(JobStatus::Running),
            Job {
                results: Some(vec![json!(3)]),
                finished_at_ms: Some(now_ms()),
                ..job(JobStatus::Succeeded)
            },
        );
        for j in [&queued, &running, &done] {
            board.insert(j.clone()).unwrap();
        }
        std::fs::write(dir.path().join("jobs/half.partial"), b"{").unwrap();
        drop(board);

        let board = JobBoard::open(dir.path(), JobLimits::default()).unwrap();
        for j in [&queued, &running] {
            let after = board.get(&j.tenant, &j.id).unwrap();
            assert_eq!(after.status, JobStatus::Failed);
            assert_eq!(after.error.unwrap()["message"], "failed: server restarted");
        }
        assert_eq!(board.get(&done.tenant, &done.id).unwrap(), done);
        assert!(
            board.get("tn-ffffffffffffffff", &done.id).is_none(),
            "scoped by tenant"
        );
        assert!(!dir.path().join("jobs/half.partial").exists());
    }

    #[test]
    fn shutdown_records_unfinished_jobs_as_failed_durably() {
        let dir = tempfile::tempdir().unwrap();
        let board = JobBoard::open(dir.path(), JobLimits::default()).unwrap();
        let (queued, running, done) = (
            job(JobStatus::Queued),
            job(JobStatus::Running),
            job(JobStatus::Succeeded),
        );
        for j in [&queued, &running, &done] {
            board.insert(j.clone()).unwrap();
        }
        assert_eq!(board.unfinished(), 2);
        assert_eq!(
            board.fail_unfinished(ErrorCode::ShuttingDown, "failed: shutting down"),
            2
        );
        assert_eq!(board.unfinished(), 0);
        drop(board);

        // After the restart they keep the shutdown's record, not "server restarted".
        let board = JobBoard::open(dir.path(), JobLimits::default()).unwrap();
        for j in [&queued, &running] {
            let after = board.get(&j.tenant, &j.id).unwrap();
            assert_eq!(after.status, JobStatus::Failed);
            assert_eq!(after.error.unwrap()["code"], "shutting_down");
            assert!(after.finished_at_ms.is_some());
        }
        assert_eq!(board.get(&done.tenant, &done.id).unwrap(), done);
    }

    #[test]
    fn finished_jobs_expire_after_retention() {
        let dir = tempfile::tempdir().unwrap();
        let board = JobBoard::open(dir.path(), JobLimits::default()).unwrap();
        let old = Job {
            finished_at_ms: Some(
                now_ms() - JobLimits::default().retention.as_millis() as u64 - 1000,
            ),
            ..job(JobStatus::Succeeded)
        };
        board.insert(old.clone()).unwrap();
        board.sweep();
        assert!(board.get(&old.tenant, &old.id).is_none());
        assert!(!dir.path().join(format!("jobs/{}.json", old.id)).exists());
    }

    #[test]
    fn job_ids_are_validated() {
        assert!(is_valid_job_id(&new_job_id()));
        assert!(!is_valid_job_id("job-../../etc"));
    }
}
