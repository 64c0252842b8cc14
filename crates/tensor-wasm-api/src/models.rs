//! `/models`: ONNX models a tenant stores for its functions' `wasi-nn` `load-by-name`
//! (docs/models.md). The body of `POST /models?name=NAME` is the model's bytes; the model is
//! checked by loading it before anything is stored, and counts against the tenant's
//! stored-bytes quota.

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value as Json_};
use tensor_wasm_runtime::{is_valid_model_name, ModelSpec, RuntimeError};

use crate::auth::Caller;
use crate::routes::{blocking, body};
use crate::{ApiError, AppState, ErrorCode};

/// The query of `POST /models`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ModelQuery {
    name: String,
}

pub(crate) async fn create_model(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<ModelQuery>, axum::extract::rejection::QueryRejection>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    if tenant.is_deleted() {
        return Err(ApiError::new(
            ErrorCode::TenantDeleted,
            format!("tenant {} was deleted", tenant.id()),
        ));
    }
    let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    if !is_valid_model_name(&query.name) {
        return Err(ApiError::bad_request("name: 1 to 128 of A-Z a-z 0-9 . _ -"));
    }
    let bytes = body(bytes)?;
    let runtime = state.inner.runtime.clone();
    let spec = ModelSpec {
        tenant: tenant.id().to_owned(),
        name: query.name,
        max_stored_bytes: tenant.quotas().max_stored_bytes,
    };
    let record = blocking(move || runtime.put_model(&bytes, spec)).await?;
    let location = format!("/models/{}", record.name);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(record),
    )
        .into_response())
}

pub(crate) async fn list_models(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Json_>, ApiError> {
    let tenant = caller.tenant()?;
    Ok(Json(
        json!({ "models": state.inner.runtime.models(tenant.id()) }),
    ))
}

pub(crate) async fn get_model(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?;
    let record = state.inner.runtime.model(tenant.id(), &name)?;
    Ok(Json(record).into_response())
}

pub(crate) async fn delete_model(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(name): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = caller.tenant()?.clone();
    if !is_valid_model_name(&name) {
        return Err(RuntimeError::ModelNotFound(name).into());
    }
    let runtime = state.inner.runtime.clone();
    blocking(move || runtime.delete_model(tenant.id(), &name)).await?;
    Ok(StatusCode::NO_CONTENT)
}
