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
//! With the shared store (`serve --store`), jobs live instead in a queue that every replica
//! shares ([`queue`]): claimed under a lease by whichever replica has a free slot, run again by
//! another when its replica dies (at least once), and bounded by the same limits.
//!
//! A submission may carry an `Idempotency-Key` header: a second submission by the same tenant
//! with the same key answers the first job (`202`, `Idempotent-Replayed: true`) for as long as
//! that job is kept.
//!
//! Cancelling a queued job stops it before it runs. A running guest cannot be
//! interrupted from outside its store: it runs to completion (or its
//! deadline) and its outcome is discarded; the job reads `cancelled`.

mod board;
mod order;
pub(crate) mod queue;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path as UrlPath, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tensor_wasm_runtime::RuntimeError;
use tokio::sync::OwnedSemaphorePermit;

use crate::auth::Caller;
use crate::{ApiError, AppState, ErrorCode};

pub use board::{JobBoard, JobLimits};
pub use queue::{Claim, JobQueue, QueueSettings, Submitted};

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
    /// How many times the job has started. Above 1 only with the shared job queue, when a
    /// job whose replica stopped was run again by another (`--store`, docs/scale-out.md).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub attempts: u32,
    /// The `Idempotency-Key` the job was submitted with: a second submission with the same
    /// key by the same tenant answers this job instead of creating one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The W3C `traceparent` of the request that submitted the job, when
    /// traces are exported: the job's run (on any replica) links to it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
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
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    let idempotency_key = idempotency_key(&headers)?;
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
        attempts: 0,
        idempotency_key,
        traceparent: tensor_wasm_telemetry::traceparent_of(&tracing::Span::current()),
    };
    let max_active = state.inner.config.jobs.max_active_per_tenant;
    if let Some(shared) = state.inner.queue.get() {
        let (queue, submitted) = (shared.queue.clone(), job.clone());
        return match crate::routes::blocking(move || queue.submit(&submitted, max_active)).await? {
            queue::Submitted::Added => {
                shared.wake();
                Ok(accepted(&job.id, job.status, false))
            }
            queue::Submitted::Existing(existing) => {
                Ok(accepted(&existing.id, existing.status, true))
            }
            queue::Submitted::TooManyActive => Err(too_many_active(tenant.id(), max_active)),
        };
    }
    let board = &state.inner.jobs;
    board.sweep();
    match board.admit(job.clone()) {
        Ok(board::Admitted::New) => {}
        Ok(board::Admitted::Existing(id)) => {
            // A job still on its way to the disk reads as queued.
            let status = board
                .get(tenant.id(), &id)
                .map_or(JobStatus::Queued, |j| j.status);
            return Ok(accepted(&id, status, true));
        }
        Err(board::Refused::TooManyActive) => {
            return Err(too_many_active(tenant.id(), max_active));
        }
        Err(board::Refused::Io(e)) => return Err(ApiError::internal(e)),
    }
    // A tenant deleted meanwhile: its delete forgets the jobs admitted before
    // it, and this one, admitted after, goes the same way (nothing is kept
    // for a deleted tenant).
    if state.inner.runtime.is_tenant_retired(tenant.id()) {
        board.forget_tenant(tenant.id());
        return Err(RuntimeError::TenantRetired(tenant.id().to_owned()).into());
    }

    let task_state = state.clone();
    let job_id = job.id.clone();
    tokio::spawn(async move {
        run_job(task_state, tenant, job_id, memory).await;
    });
    Ok(accepted(&job.id, job.status, false))
}

/// Longest `Idempotency-Key` accepted.
const MAX_IDEMPOTENCY_KEY: usize = 255;

/// The request's `Idempotency-Key`: 1 to 255 visible ASCII characters, or none.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Ok(None);
    };
    let key = value
        .to_str()
        .ok()
        .filter(|k| {
            (1..=MAX_IDEMPOTENCY_KEY).contains(&k.len()) && k.bytes().all(|b| b.is_ascii_graphic())
        })
        .ok_or_else(|| {
            ApiError::new(
                ErrorCode::BadRequest,
                format!(
                    "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
                ),
            )
        })?;
    Ok(Some(key.to_owned()))
}

/// `202 Accepted` naming job `id`; `replayed` when an earlier submission with the same
/// idempotency key created it (header `Idempotent-Replayed: true`).
fn accepted(id: &str, status: JobStatus, replayed: bool) -> Response {
    let mut response = (
        StatusCode::ACCEPTED,
        [(header::LOCATION, format!("/jobs/{id}"))],
        Json(json!({ "job_id": id, "status": status })),
    )
        .into_response();
    if replayed {
        response.headers_mut().insert(
            "idempotent-replayed",
            header::HeaderValue::from_static("true"),
        );
    }
    response
}

fn too_many_active(tenant: &str, limit: usize) -> ApiError {
    let mut e = ApiError::new(
        ErrorCode::QuotaExhausted,
        format!("tenant {tenant}: {limit} jobs are already queued or running (max_active_jobs)"),
    );
    e.retry_after_s = Some(1);
    e
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
            j.attempts += 1;
        }
    }) else {
        return;
    };
    if job.status != JobStatus::Running {
        return;
    }
    let max_result = board.limits().max_result_bytes;
    let result = call(&state, &job, (permit, guards)).await;
    board.update(&job_id, |j| {
        if !j.status.is_active() {
            return;
        }
        j.finished_at_ms = Some(now_ms());
        if j.cancel_requested {
            j.status = JobStatus::Cancelled;
            return;
        }
        settle(j, result, max_result);
    });
}

/// Runs a job claimed from the shared queue holding `permit`: takes its tenant's quotas like
/// any invocation, then calls it ([`call`]).
async fn execute(
    state: &AppState,
    job: &Job,
    permit: OwnedSemaphorePermit,
) -> Result<Vec<Value>, ApiError> {
    let tenant = state
        .inner
        .tenants
        .lookup(&job.tenant)
        .ok_or_else(|| RuntimeError::TenantRetired(job.tenant.clone()))?;
    let memory =
        crate::routes::owned_export_function(state, &tenant, &job.function_id, "invoke-async")?;
    let uvm = state.inner.runtime.is_uvm_backed();
    let guards = crate::routes::invocation_guards(&tenant, memory, uvm)?;
    call(state, job, (permit, guards)).await
}

/// Calls `job`'s export holding `held` until the guest stops. A job past its deadline (a
/// kernel that cannot be stopped) fails with `invocation_timeout` by the deadline + grace, as a
/// direct call is answered; the work keeps its slot and quotas until the guest stops.
async fn call(
    state: &AppState,
    job: &Job,
    held: (OwnedSemaphorePermit, crate::routes::InvocationGuards),
) -> Result<Vec<Value>, ApiError> {
    let runtime = state.inner.runtime.clone();
    let timeout = runtime.timeout_of(&job.function_id).ok();
    let (id, export, args) = (
        job.function_id.clone(),
        job.export.clone(),
        job.args.clone(),
    );
    let span = crate::trace::job_span(
        &job.id,
        &job.function_id,
        &job.tenant,
        job.traceparent.as_deref(),
    );
    let work = span.in_scope(|| {
        crate::routes::blocking(move || {
            let _held = held;
            runtime.invoke_export(&id, &export, &args)
        })
    });
    let result = match timeout {
        Some(timeout) => crate::routes::within_deadline(timeout, work).await,
        None => work.await,
    };
    crate::trace::outcome(&span, &result);
    result
}

/// Records the outcome of a job's call in `j` (status, and results or error); results larger
/// than `max_result` bytes as JSON fail it with `output_too_large`.
fn settle(j: &mut Job, result: Result<Vec<Value>, ApiError>, max_result: usize) {
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
    let found = match state.inner.queue.get() {
        Some(shared) => {
            let (queue, tenant, job) = (shared.queue.clone(), tenant.id().to_owned(), id.clone());
            crate::routes::blocking(move || queue.get(&tenant, &job)).await?
        }
        None => state.inner.jobs.get(tenant.id(), &id),
    };
    found.map(Json).ok_or_else(|| job_not_found(&id))
}

pub(crate) async fn cancel_job(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    UrlPath(id): UrlPath<String>,
) -> Result<Json<Job>, ApiError> {
    let tenant = caller.tenant()?;
    if !is_valid_job_id(&id) {
        return Err(job_not_found(&id));
    }
    if let Some(shared) = state.inner.queue.get() {
        let (queue, tenant, job) = (shared.queue.clone(), tenant.id().to_owned(), id.clone());
        return crate::routes::blocking(move || queue.cancel(&tenant, &job))
            .await?
            .map(Json)
            .ok_or_else(|| job_not_found(&id));
    }
    if state.inner.jobs.get(tenant.id(), &id).is_none() {
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
            attempts: 0,
            idempotency_key: None,
            traceparent: None,
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
