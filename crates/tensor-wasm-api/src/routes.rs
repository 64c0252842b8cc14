//! Route handlers.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value as Json_};
use tensor_wasm_runtime::{
    is_valid_function_id, CommandOutput, DeploySpec, InvocationStyle, Runtime, RuntimeError,
};
use tensor_wasm_tenant::{QuotaGuard, Resource, Tenant};

use crate::auth::{quota_error, Caller};
use crate::{ApiError, AppState};

/// Longest stderr tail sent in the `x-stderr-tail` header (escaped).
const STDERR_HEADER_BYTES: usize = 1024;

pub(crate) async fn healthz() -> Json<Json_> {
    Json(json!({"status": "ok"}))
}

pub(crate) async fn readyz(State(state): State<AppState>) -> Result<Json<Json_>, ApiError> {
    if state.inner.ready.load(std::sync::atomic::Ordering::Acquire) {
        Ok(Json(json!({"status": "ready"})))
    } else {
        Err(ApiError::new(
            "not_ready",
            "the server is still loading its functions",
        ))
    }
}

pub(crate) async fn metrics(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Response, ApiError> {
    // Metrics span every tenant: admin (or the metrics token) only.
    caller.require_admin()?;
    let families = state.inner.registry.gather();
    let text = prometheus::TextEncoder::new()
        .encode_to_string(&families)
        .map_err(ApiError::internal)?;
    Ok((
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response())
}

pub(crate) async fn route_not_found() -> ApiError {
    ApiError::new("route_not_found", "no such route (see /openapi.json)")
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new("method_not_allowed", "method not allowed on this route")
}

/// Maps a body-read failure: over the limit is 413, anything else 400.
pub(crate) fn body(bytes: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    bytes.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                "payload_too_large",
                "request body exceeds the server's limit",
            )
        } else {
            ApiError::bad_request(rejection.body_text())
        }
    })
}

pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .unwrap_or("")
}

/// Runs blocking runtime work off the async threads.
pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> Result<T, ApiError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::from)
}

/// [`Runtime::try_invoke_export_inline`] on this async thread; a panic in
/// the attempt is a 500, as it is from a blocking task.
fn inline(
    runtime: &Runtime,
    id: &str,
    call: &ExportCallRequest,
) -> Option<Result<Vec<Json_>, ApiError>> {
    let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.try_invoke_export_inline(id, &call.export, &call.args)
    }));
    match attempt {
        Ok(outcome) => outcome.map(|r| r.map_err(ApiError::from)),
        Err(_) => Some(Err(ApiError::internal("the invocation panicked"))),
    }
}

/// Deploy options: query parameters for a raw module body, fields of the JSON body otherwise.
#[derive(Debug, Default, Deserialize)]
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

pub(crate) async fn create_function(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    query: Result<Query<DeployOptions>, QueryRejection>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let bytes = body(bytes)?;
    let (module, options) = match content_type(&headers) {
        "application/wasm" | "application/octet-stream" | "text/plain" | "text/wat" => {
            let Query(options) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
            (bytes.to_vec(), options)
        }
        "application/json" => {
            let req: DeployJson = parse_json(&bytes)?;
            let module = match (req.module_base64, req.wat) {
                (Some(b64), None) => base64::engine::general_purpose::STANDARD
                    .decode(b64.trim())
                    .map_err(|e| ApiError::bad_request(format!("module_base64: {e}")))?,
                (None, Some(wat)) => wat.into_bytes(),
                _ => {
                    return Err(ApiError::bad_request(
                        "give exactly one of `module_base64` or `wat`",
                    ))
                }
            };
            let o = req.options;
            let options = DeployOptions {
                name: o.name,
                style: o.style,
                timeout_ms: o.timeout_ms,
                memory_limit_bytes: o.memory_limit_bytes,
                fuel: o.fuel,
                raw_ptx: o.raw_ptx,
            };
            (module, options)
        }
        other => {
            return Err(ApiError::new(
                "unsupported_media_type",
                format!(
                    "content type `{other}` is not accepted: send application/wasm (binary or \
                     WAT) or application/json"
                ),
            ))
        }
    };
    let tenant = caller.tenant()?.clone();
    tenant.check_rate().map_err(|e| quota_error(&tenant, e))?;
    // A per-module size check: the guard holds nothing.
    drop(
        tenant
            .acquire(Resource::ModuleBytes, module.len() as u64)
            .map_err(|e| quota_error(&tenant, e))?,
    );
    let count = tenant
        .acquire(Resource::Functions, 1)
        .map_err(|e| quota_error(&tenant, e))?;
    let runtime = state.inner.runtime.clone();
    let spec = options.into_spec(tenant.id());
    let info = blocking(move || runtime.deploy(&module, spec)).await?;
    // Deployed: the function counts until it is deleted.
    count.forget_into_usage();
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
    if blocking(move || runtime.delete(&key)).await? {
        tenant.release(Resource::Functions, 1);
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(RuntimeError::FunctionNotFound(id).into())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportCallRequest {
    export: String,
    #[serde(default)]
    args: Vec<Json_>,
}

pub(crate) async fn invoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    headers: HeaderMap,
    bytes: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    if !is_valid_function_id(&id) {
        return Err(RuntimeError::FunctionNotFound(id).into());
    }
    let (style, memory) = state.inner.runtime.invocation_of(&id, tenant.id())?;
    let runtime: Runtime = state.inner.runtime.clone();
    let quota = |e| quota_error(&tenant, e);
    tenant.check_rate().map_err(quota)?;
    // Released on every exit path: the guards move into the blocking task and
    // drop when the guest has finished (trap, timeout or client gone alike).
    let guards = invocation_guards(&tenant, memory, runtime.is_uvm_backed())?;
    let bytes = body(bytes)?;
    let call = match style {
        InvocationStyle::Export => Some(parse_json::<ExportCallRequest>(&bytes)?),
        InvocationStyle::Wasi => None,
    };
    // The permit moves into the blocking task: if the client goes away, the
    // slot stays taken until the guest has really finished.
    let permit = acquire_slot(&state).await?;
    match call {
        Some(call) => {
            // A short import-free call is answered here, without the hand-off
            // to a blocking thread; anything else (or an overrun) goes there.
            if let Some(results) = inline(&runtime, &id, &call) {
                drop((permit, guards));
                // Never ready-at-once forever: a client sending nothing but
                // inline calls still lets this thread's other tasks run.
                tokio::task::consume_budget().await;
                return Ok(Json(json!({ "results": results? })).into_response());
            }
            let results = blocking(move || {
                let _held = (permit, guards);
                runtime.invoke_export(&id, &call.export, &call.args)
            })
            .await?;
            Ok(Json(json!({ "results": results })).into_response())
        }
        None => {
            let stdin = bytes.to_vec();
            let output = blocking(move || {
                let _held = (permit, guards);
                runtime.invoke_command(&id, stdin)
            })
            .await?;
            Ok(command_response(output, wants_json(&headers)))
        }
    }
}

/// The quota a running invocation holds: one concurrent invocation, one live
/// instance, its memory limit of guest memory (and of GPU memory when guest
/// memory is CUDA managed memory). Released when dropped — the holders move
/// into the blocking task, so traps, timeouts and gone clients release alike.
pub(crate) struct InvocationGuards {
    _held: [Option<QuotaGuard>; 4],
}

pub(crate) fn invocation_guards(
    tenant: &Tenant,
    memory: u64,
    uvm: bool,
) -> Result<InvocationGuards, ApiError> {
    let take = |resource, amount| {
        tenant
            .acquire(resource, amount)
            .map_err(|e| quota_error(tenant, e))
    };
    Ok(InvocationGuards {
        _held: [
            Some(take(Resource::ConcurrentInvocations, 1)?),
            Some(take(Resource::LiveInstances, 1)?),
            Some(take(Resource::GuestMemoryBytes, memory)?),
            if uvm {
                Some(take(Resource::GpuMemoryBytes, memory)?)
            } else {
                None
            },
        ],
    })
}

/// The memory limit of export-call function `id` if `tenant` owns it; 404
/// for malformed, unknown or other tenants' ids, 400 `wrong_style` for a WASI
/// command (`route` names the route in the message).
pub(crate) fn owned_export_function(
    state: &AppState,
    tenant: &Tenant,
    id: &str,
    route: &str,
) -> Result<u64, ApiError> {
    if !is_valid_function_id(id) {
        return Err(RuntimeError::FunctionNotFound(id.to_owned()).into());
    }
    let (style, memory) = state.inner.runtime.invocation_of(id, tenant.id())?;
    if style != InvocationStyle::Export {
        return Err(RuntimeError::WrongStyle(format!(
            "function {id} is a WASI command; {route} serves export-call functions"
        ))
        .into());
    }
    Ok(memory)
}

pub(crate) async fn acquire_slot(
    state: &AppState,
) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
    // Fast path without a timer: a free slot.
    if let Ok(permit) = state.inner.slots.clone().try_acquire_owned() {
        return Ok(permit);
    }
    let wait: Duration = state.inner.config.queue_timeout;
    match tokio::time::timeout(wait, state.inner.slots.clone().acquire_owned()).await {
        Ok(Ok(permit)) => Ok(permit),
        Ok(Err(_closed)) => Err(ApiError::new("not_ready", "the server is shutting down")),
        Err(_elapsed) => Err(ApiError::busy(format!(
            "every instance slot stayed busy for {} ms",
            wait.as_millis()
        ))),
    }
}

fn wants_json(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("application/json"))
}

/// A WASI command's result: raw stdout with exit code and stderr tail in
/// headers, or one JSON document when the client accepts JSON.
fn command_response(output: CommandOutput, json_body: bool) -> Response {
    if json_body {
        let mut body = json!({
            "exit_code": output.exit_code,
            "stderr_tail": String::from_utf8_lossy(&output.stderr_tail),
            "stderr_truncated": output.stderr_truncated,
        });
        match String::from_utf8(output.stdout) {
            Ok(text) => body["stdout"] = Json_::from(text),
            Err(e) => {
                body["stdout_base64"] =
                    Json_::from(base64::engine::general_purpose::STANDARD.encode(e.into_bytes()))
            }
        }
        return Json(body).into_response();
    }
    let tail = &output.stderr_tail[output.stderr_tail.len().saturating_sub(STDERR_HEADER_BYTES)..];
    let escaped = tail.escape_ascii().to_string();
    let mut response = (
        [(header::CONTENT_TYPE, "application/octet-stream")],
        output.stdout,
    )
        .into_response();
    let h = response.headers_mut();
    h.insert("x-exit-code", HeaderValue::from(output.exit_code));
    if let Ok(value) = HeaderValue::from_str(&escaped) {
        h.insert("x-stderr-tail", value);
    }
    response
}
