//! Snapshot routes: capture after an init export, list, delete. Choosing the snapshot a
//! function's instances start from is `PATCH /functions/{id}` (in `functions.rs`).

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::json;
use tensor_wasm_runtime::{is_valid_snapshot_id, RuntimeError};

use crate::auth::Caller;
use crate::functions::owned;
use crate::routes::{acquire_slot, blocking, body, invocation_guards, parse_json};
use crate::{ApiError, AppState};

fn default_init_export() -> String {
    "init".to_owned()
}

fn default_activate() -> bool {
    true
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateSnapshot {
    /// Export run in a fresh instance before the capture.
    #[serde(default = "default_init_export")]
    init_export: String,
    /// Whether every later instance starts from the new snapshot.
    #[serde(default = "default_activate")]
    activate: bool,
}

/// `POST /functions/{id}/snapshots`: runs the init export under the function's limits and
/// the caller's quotas (it is an invocation), captures, stores durably, answers 201.
pub(crate) async fn create_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    owned(&state, &tenant, &id)?;
    let bytes = body(bytes)?;
    let request: CreateSnapshot = if bytes.iter().all(u8::is_ascii_whitespace) {
        parse_json(b"{}")?
    } else {
        parse_json(&bytes)?
    };
    let (_, memory) = state.inner.runtime.invocation_of(&id, tenant.id())?;
    let runtime = state.inner.runtime.clone();
    let max_stored_bytes = tenant.quotas().max_stored_bytes;
    let guards = invocation_guards(&tenant, memory, runtime.is_uvm_backed())?;
    let permit = acquire_slot(&state).await?;
    let record = blocking(move || {
        let _held = (permit, guards);
        runtime.create_snapshot_within(
            &id,
            &request.init_export,
            request.activate,
            max_stored_bytes,
        )
    })
    .await?;
    Ok((StatusCode::CREATED, Json(record)).into_response())
}

/// `GET /functions/{id}/snapshots`.
pub(crate) async fn list_snapshots(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    owned(&state, caller.tenant()?, &id)?;
    let runtime = state.inner.runtime.clone();
    let (snapshots, function) =
        blocking(move || Ok((runtime.snapshots(&id)?, runtime.function(&id)?))).await?;
    Ok(Json(json!({
        "snapshots": snapshots,
        "start_from_snapshot": function.record.start_from_snapshot,
        "restore_mode": state.inner.runtime.restore_mode().as_str(),
    }))
    .into_response())
}

/// `DELETE /functions/{id}/snapshots/{snapshot_id}`: 204, 404, or 409 for the snapshot the
/// function starts from.
pub(crate) async fn delete_snapshot(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, snapshot_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    owned(&state, caller.tenant()?, &id)?;
    if !is_valid_snapshot_id(&snapshot_id) {
        return Err(RuntimeError::SnapshotNotFound(snapshot_id).into());
    }
    let runtime = state.inner.runtime.clone();
    let key = snapshot_id.clone();
    if blocking(move || runtime.delete_snapshot(&id, &key)).await? {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(RuntimeError::SnapshotNotFound(snapshot_id).into())
    }
}
