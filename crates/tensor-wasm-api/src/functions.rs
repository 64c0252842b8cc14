//! Function routes: deploy (`POST /functions`), list, get, update
//! (`PATCH /functions/{id}`: the snapshot instances start from) and delete.
//! Invocation routes are in `routes.rs`, `stream.rs` and `jobs.rs`; snapshot
//! routes in `snapshots.rs`.

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{FromRequest as _, Path, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value as Json_};
use tensor_wasm_runtime::{is_valid_function_id, DeploySpec, InvocationStyle, RuntimeError};
use tensor_wasm_tenant::{Resource, Tenant};

use crate::auth::Caller;
use crate::error::quota_error;
use crate::routes::{blocking, body, parse_json};
use crate::{ApiError, AppState, ErrorCode};

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .unwrap_or("")
}

/// A deploy option given as a query parameter, a JSON body field, or both with the same value.
fn either<T: PartialEq + std::fmt::Debug>(
    name: &str,
    query: Option<T>,
    body: Option<T>,
) -> Result<Option<T>, ApiError> {
    match (query, body) {
        (Some(query), Some(body)) if query != body => Err(ApiError::bad_request(format!(
            "deploy option `{name}` is {query:?} in the query but {body:?} in the body"
        ))),
        (query, body) => Ok(body.or(query)),
    }
}

/// Deploy options: query parameters for a raw module body; fields of the JSON body or query
/// parameters (agreeing where both are given) for a JSON body.
#[derive(Debug, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DeployOptions {
    name: Option<String>,
    style: Option<InvocationStyle>,
    timeout_ms: Option<u64>,
    memory_limit_bytes: Option<u64>,
    fuel: Option<u64>,
    raw_ptx: Option<bool>,
}

impl DeployOptions {
    fn into_spec(self, tenant: &str) -> DeploySpec {
        DeploySpec {
            tenant: tenant.to_owned(),
            name: self.name.unwrap_or_else(|| "function".to_owned()),
            style: self.style.unwrap_or(InvocationStyle::Export),
            timeout_ms: self.timeout_ms,
            memory_limit_bytes: self.memory_limit_bytes,
            fuel: self.fuel,
            raw_ptx: self.raw_ptx.unwrap_or(false),
            max_stored_bytes: None,
            max_functions: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DeployJson {
    module_base64: Option<String>,
    wat: Option<String>,
    #[serde(flatten)]
    options: DeployOptionsJson,
}

/// Same fields as [`DeployOptions`]; separate because `deny_unknown_fields`
/// does not combine with `flatten`.
#[derive(Debug, Deserialize)]
struct DeployOptionsJson {
    name: Option<String>,
    style: Option<InvocationStyle>,
    timeout_ms: Option<u64>,
    memory_limit_bytes: Option<u64>,
    fuel: Option<u64>,
    raw_ptx: Option<bool>,
}

/// The module of a JSON deploy: exactly one of `module_base64` and `wat`
/// (the rule the OpenAPI document's `DeployRequest.oneOf` states).
pub(crate) fn module_of_json(
    module_base64: Option<String>,
    wat: Option<String>,
) -> Result<Vec<u8>, ApiError> {
    match (module_base64, wat) {
        (Some(b64), None) => base64::engine::general_purpose::STANDARD
            .decode(b64.trim())
            .map_err(|e| ApiError::bad_request(format!("module_base64: {e}"))),
        (None, Some(wat)) => Ok(wat.into_bytes()),
        _ => Err(ApiError::bad_request(
            "give exactly one of `module_base64` or `wat`",
        )),
    }
}

pub(crate) async fn create_function(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<DeployOptions>, QueryRejection>,
    headers: HeaderMap,
    req: Request,
) -> Result<Response, ApiError> {
    // Everything that can refuse the deploy without its body comes first: a
    // refused client uploads nothing (the body is read last).
    let tenant = caller.tenant()?.clone();
    if tenant.is_deleted() {
        return Err(ApiError::new(
            ErrorCode::TenantDeleted,
            format!("tenant {} was deleted", tenant.id()),
        ));
    }
    let raw_module = match content_type(&headers) {
        "application/wasm" | "application/octet-stream" | "text/plain" | "text/wat" => true,
        "application/json" => false,
        other => {
            return Err(ApiError::new(
                ErrorCode::UnsupportedMediaType,
                format!(
                    "content type `{other}` is not accepted: send application/wasm (binary or \
                     WAT) or application/json"
                ),
            ))
        }
    };
    if raw_module {
        // The module is the body: its declared length (Content-Length) is
        // the module's size.
        let declared = http_body::Body::size_hint(req.body()).exact();
        if let Some(declared) = declared {
            drop(
                tenant
                    .acquire(Resource::ModuleBytes, declared)
                    .map_err(|e| quota_error(&tenant, e))?,
            );
        }
    }
    // Both held by the deploy's work, not by this handler: a client that
    // goes away mid-deploy drops the handler, never the accounting.
    let deploying = tenant
        .acquire(Resource::ConcurrentDeploys, 1)
        .map_err(|e| quota_error(&tenant, e))?;
    let count = tenant
        .acquire(Resource::Functions, 1)
        .map_err(|e| quota_error(&tenant, e))?;
    let bytes = body(Bytes::from_request(req, &state).await)?;
    let (module, options) = if raw_module {
        let Query(options) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
        (bytes.to_vec(), options)
    } else {
        // Options may be body fields or query parameters; one given in both must agree.
        let Query(query) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
        let req: DeployJson = parse_json(&bytes)?;
        let module = module_of_json(req.module_base64, req.wat)?;
        let o = req.options;
        let options = DeployOptions {
            name: either("name", query.name, o.name)?,
            style: either("style", query.style, o.style)?,
            timeout_ms: either("timeout_ms", query.timeout_ms, o.timeout_ms)?,
            memory_limit_bytes: either(
                "memory_limit_bytes",
                query.memory_limit_bytes,
                o.memory_limit_bytes,
            )?,
            fuel: either("fuel", query.fuel, o.fuel)?,
            raw_ptx: either("raw_ptx", query.raw_ptx, o.raw_ptx)?,
        };
        (module, options)
    };
    if options.raw_ptx == Some(true) {
        require_raw_ptx(&state, &tenant)?;
    }
    // A per-module size check: the guard holds nothing.
    drop(
        tenant
            .acquire(Resource::ModuleBytes, module.len() as u64)
            .map_err(|e| quota_error(&tenant, e))?,
    );
    let runtime = state.inner.runtime.clone();
    let mut spec = options.into_spec(tenant.id());
    spec.max_stored_bytes = tenant.quotas().max_stored_bytes;
    spec.max_functions = Some(tenant.limit(Resource::Functions));
    let info = blocking(move || {
        let _deploying = deploying;
        let info = runtime.deploy(&module, spec)?;
        // Deployed: the function counts until it is deleted.
        count.forget_into_usage();
        Ok(info)
    })
    .await?;
    let location = format!("/functions/{}", info.record.id);
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(info),
    )
        .into_response())
}

pub(crate) async fn list_functions(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Json_>, ApiError> {
    let tenant = caller.tenant()?;
    Ok(Json(
        json!({ "functions": state.inner.runtime.functions_of(tenant.id()) }),
    ))
}

/// The style of function `id` if `tenant` owns it; 404 otherwise (for
/// malformed ids, unknown ids and other tenants' ids alike).
pub(crate) fn owned(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
) -> Result<InvocationStyle, ApiError> {
    if !is_valid_function_id(id) {
        return Err(RuntimeError::FunctionNotFound(id.to_owned()).into());
    }
    Ok(state.inner.runtime.style_for(id, tenant.id())?)
}

pub(crate) async fn get_function(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Response, ApiError> {
    owned(&state, caller.tenant()?, &id)?;
    let runtime = state.inner.runtime.clone();
    let info = blocking(move || runtime.function(&id)).await?;
    Ok(Json(info).into_response())
}

pub(crate) async fn delete_function(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let tenant = caller.tenant()?.clone();
    owned(&state, &tenant, &id)?;
    let runtime = state.inner.runtime.clone();
    let key = id.clone();
    let owner = tenant.clone();
    let deleted = blocking(move || {
        // Released with the work, so a client gone mid-delete changes nothing.
        let deleted = runtime.delete(&key)?;
        if deleted {
            owner.release(Resource::Functions, 1);
        }
        Ok(deleted)
    })
    .await?;
    if deleted {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(RuntimeError::FunctionNotFound(id).into())
    }
}

/// 403 `raw_ptx_not_granted` unless the admin granted `tenant` the
/// raw-kernel capability; a server without `--allow-raw-ptx` answers its own
/// 400 (from the runtime) whatever the tenant holds.
fn require_raw_ptx(state: &AppState, tenant: &Tenant) -> Result<(), ApiError> {
    if tenant.raw_ptx() || !state.inner.runtime.config().allow_raw_ptx {
        return Ok(());
    }
    Err(ApiError::new(
        ErrorCode::RawPtxNotGranted,
        format!(
            "tenant {} does not hold the raw-kernel capability (`raw_ptx`); only the admin \
             grants it (PATCH /tenants/{{id}} with {{\"raw_ptx\": true}})",
            tenant.id()
        ),
    ))
}

/// `Some` of whatever the field holds, `null` included, so that an absent
/// field and an explicit `null` differ.
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Json_>, D::Error> {
    Json_::deserialize(d).map(Some)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct UpdateFunction {
    /// A snapshot id, `"latest"`, or `null` for fresh instances. Absent: unchanged.
    #[serde(default, deserialize_with = "present")]
    start_from_snapshot: Option<Json_>,
    /// The raw-kernel capability of the function (granting needs the
    /// tenant's). Absent: unchanged.
    #[serde(default)]
    raw_ptx: Option<bool>,
}

/// `PATCH /functions/{id}`: `start_from_snapshot` and `raw_ptx`; a body must
/// name at least one (an empty body must not silently switch snapshots off).
pub(crate) async fn update_function(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    owned(&state, &tenant, &id)?;
    let request: UpdateFunction = parse_json(&body(bytes)?)?;
    let target = match request.start_from_snapshot {
        None => None,
        Some(Json_::Null) => Some(None),
        Some(Json_::String(s)) => Some(Some(s)),
        Some(_) => {
            return Err(ApiError::bad_request(
                "start_from_snapshot must be a snapshot id, \"latest\" or null",
            ))
        }
    };
    if target.is_none() && request.raw_ptx.is_none() {
        return Err(ApiError::bad_request(
            "name `start_from_snapshot` and/or `raw_ptx` (a snapshot id, \"latest\" or null; \
             true or false)",
        ));
    }
    if request.raw_ptx == Some(true) {
        require_raw_ptx(&state, &tenant)?;
    }
    let runtime = state.inner.runtime.clone();
    let snapshot_named = target.is_some();
    let info = blocking(move || {
        if let Some(raw_ptx) = request.raw_ptx {
            runtime.set_raw_ptx(&id, raw_ptx)?;
        }
        match target {
            Some(target) => runtime.set_start_from_snapshot(&id, target.as_deref()),
            None => runtime.function(&id),
        }
    })
    .await
    .map_err(|e| {
        // The function exists (a 404 would say it does not): a body naming a
        // snapshot it does not have conflicts with its state.
        if snapshot_named && e.code == ErrorCode::NotFound {
            ApiError::new(ErrorCode::Conflict, e.message)
        } else {
            e
        }
    })?;
    Ok(Json(info).into_response())
}
