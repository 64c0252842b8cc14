//! Health, readiness, metrics and fallback routes, `POST /functions/{id}/invoke`,
//! and the helpers every handler shares (body limits, JSON, blocking work,
//! quota guards, instance slots).

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequest as _, Path, Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use base64::Engine as _;
use serde::Deserialize;
use serde_json::{json, Value as Json_};
use tensor_wasm_runtime::{
    is_valid_function_id, ClientWatch, CommandOutput, InvocationStyle, InvocationTarget, Runtime,
    RuntimeError,
};
use tensor_wasm_tenant::{QuotaGuard, Resource, Tenant};

use crate::auth::Caller;
use crate::error::quota_error;
use crate::{ApiError, AppState, ErrorCode};

/// Longest stderr tail sent in the `x-stderr-tail` header (escaped).
const STDERR_HEADER_BYTES: usize = 1024;

/// How long after an invocation's deadline the client gets its
/// `invocation_timeout` at the latest, whatever the guest is stuck in (a CUDA
/// kernel cannot be stopped: the invocation keeps its slot, quota and memory
/// until the kernel ends, but the client is answered).
pub(crate) const DEADLINE_GRACE: Duration = Duration::from_millis(100);

pub(crate) async fn healthz() -> Json<Json_> {
    Json(json!({"status": "ok"}))
}

pub(crate) async fn readyz(State(state): State<AppState>) -> Result<Json<Json_>, ApiError> {
    state
        .readiness()
        .map(|()| Json(json!({"status": "ready"})))
        .map_err(|reason| ApiError::new(ErrorCode::NotReady, reason))
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
    ApiError::new(
        ErrorCode::RouteNotFound,
        "no such route (see /openapi.json)",
    )
}

pub(crate) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        ErrorCode::MethodNotAllowed,
        "method not allowed on this route",
    )
}

/// Maps a body-read failure: over the limit is 413, anything else 400.
pub(crate) fn body(bytes: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    bytes.map_err(|rejection| {
        if rejection.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                ErrorCode::PayloadTooLarge,
                "request body exceeds the server's limit",
            )
        } else {
            ApiError::bad_request(rejection.body_text())
        }
    })
}

/// Parses a JSON request body, which is always an object.
pub(crate) fn parse_json<T: serde::de::DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let bad = |e: serde_json::Error| ApiError::bad_request(format!("invalid JSON: {e}"));
    let mut value: serde_json::Value = serde_json::from_slice(bytes).map_err(bad)?;
    // serde also builds a struct from an array of its fields in order, which no
    // client should rely on: the document says every body is an object.
    if !value.is_object() {
        return Err(ApiError::bad_request(
            "invalid JSON: the request body must be a JSON object",
        ));
    }
    integral_floats_as_integers(&mut value);
    serde_json::from_value(value).map_err(bad)
}

/// Deserializes a nested struct only from a JSON object (`#[serde(deserialize_with)]`), not
/// from the array of its fields that serde would also take.
pub(crate) fn object_only<'de, D, T>(deserializer: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::Deserialize;
    let fields = serde_json::Map::deserialize(deserializer)?;
    T::deserialize(serde_json::Value::Object(fields)).map_err(serde::de::Error::custom)
}

/// JSON Schema (and so the OpenAPI document's `integer`) counts `5.0` as an
/// integer; serde refuses it for an integer field. Integral floats in range
/// become integers, so every client's encoding of a whole number is accepted.
fn integral_floats_as_integers(value: &mut serde_json::Value) {
    use serde_json::Value;
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            if f.fract() != 0.0 {
                return;
            }
            if (0.0..18_446_744_073_709_551_616.0).contains(&f) {
                *value = Value::from(f as u64);
            } else if (-9_223_372_036_854_775_808.0..0.0).contains(&f) {
                *value = Value::from(f as i64);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(integral_floats_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(integral_floats_as_integers),
        _ => {}
    }
}

/// Runs blocking runtime work off the async threads, at the lower priority
/// of [`crate::priority::lower_blocking_priority`].
pub(crate) fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, RuntimeError> + Send + 'static,
) -> impl std::future::Future<Output = Result<T, ApiError>> {
    // The work runs under the span current here (the request's, or an
    // invocation's): nothing when traces are off.
    let span = tracing::Span::current();
    let task = tokio::task::spawn_blocking(move || {
        crate::priority::lower_blocking_priority();
        span.in_scope(f)
    });
    async move {
        task.await
            .map_err(ApiError::internal)?
            .map_err(ApiError::from)
    }
}

/// Waits for `work`, an invocation with deadline `timeout`, at most until
/// [`DEADLINE_GRACE`] past that deadline; then answers `invocation_timeout`
/// and leaves the work running on its own (it holds its guards until the
/// guest has stopped).
pub(crate) async fn within_deadline<T>(
    timeout: Duration,
    work: impl std::future::Future<Output = Result<T, ApiError>>,
) -> Result<T, ApiError> {
    match tokio::time::timeout(timeout.saturating_add(DEADLINE_GRACE), work).await {
        Ok(outcome) => outcome,
        Err(_elapsed) => {
            tracing::warn!(
                timeout_ms = timeout.as_millis() as u64,
                "an invocation is still running past its deadline; answered as a timeout"
            );
            Err(RuntimeError::Timeout {
                timeout_ms: timeout.as_millis() as u64,
            }
            .into())
        }
    }
}

/// [`Runtime::try_invoke_export_inline`] on this async thread; a panic in
/// the attempt is a 500, as it is from a blocking task.
fn inline(
    runtime: &Runtime,
    target: &InvocationTarget,
    call: &ExportCallRequest,
) -> Option<Result<Vec<Json_>, ApiError>> {
    let attempt = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        runtime.try_invoke_target_inline(target, &call.export, &call.args)
    }));
    match attempt {
        Ok(outcome) => outcome.map(|r| r.map_err(ApiError::from)),
        Err(_) => Some(Err(ApiError::internal("the invocation panicked"))),
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ExportCallRequest {
    export: String,
    #[serde(default)]
    args: Vec<Json_>,
}

/// The answer of an export call, serialized as it is (no JSON tree built
/// for it).
#[derive(serde::Serialize)]
struct Results<'a> {
    results: &'a [Json_],
}

/// [`parse_json`] of an export call, parsed straight into its struct (the
/// request path's one JSON pass): an object only, and whole numbers written
/// as floats in the arguments become integers, as `parse_json` has them.
fn parse_call(bytes: &[u8]) -> Result<ExportCallRequest, ApiError> {
    if bytes.trim_ascii_start().first() != Some(&b'{') {
        // Not an object: `parse_json` names what is wrong with it.
        return parse_json(bytes);
    }
    let mut call: ExportCallRequest = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    call.args.iter_mut().for_each(integral_floats_as_integers);
    Ok(call)
}

pub(crate) async fn invoke(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    req: Request,
) -> Result<Response, ApiError> {
    invoke_as(state, caller, id, req).await
}

/// `POST /functions/{id}/invoke` by `caller`: the route's handler, and the
/// direct path of [`crate::App`] to it.
pub(crate) async fn invoke_as(
    state: AppState,
    caller: Caller,
    id: String,
    req: Request,
) -> Result<Response, ApiError> {
    let tenant = caller.tenant()?.clone();
    let json_output = wants_json(req.headers());
    if !is_valid_function_id(&id) {
        return Err(RuntimeError::FunctionNotFound(id).into());
    }
    let target = state.inner.runtime.invocation_target(&id, tenant.id())?;
    let (style, memory, timeout) = (
        target.style(),
        target.memory_limit_bytes(),
        target.timeout(),
    );
    let runtime: Runtime = state.inner.runtime.clone();
    let faas = crate::trace::faas_span(crate::trace::request_id(req.headers()), &id, tenant.id());
    // Released on every exit path: the guards move into the blocking task and
    // drop when the guest has finished (trap, timeout or client gone alike).
    // Taken before the body is read: a tenant at its quotas uploads nothing.
    let guards = invocation_guards(&tenant, memory, runtime.is_uvm_backed())?;
    let bytes = body(Bytes::from_request(req, &state).await)?;
    let call = match style {
        InvocationStyle::Export => Some(parse_call(&bytes)?),
        InvocationStyle::Wasi => None,
        InvocationStyle::Http => return Err(Runtime::wrong_style(&id, style).into()),
    };
    // The permit moves into the blocking task: if the client goes away, the
    // slot stays taken until the guest has really finished.
    let permit = acquire_slot(&state).await?;
    // A short import-free call is answered here, without the hand-off to a
    // blocking thread; anything else (or an overrun) goes there.
    if let Some(call) = &call {
        if let Some(results) = faas.in_scope(|| inline(&runtime, &target, call)) {
            drop((permit, guards));
            if results.is_err() {
                crate::trace::failed(&faas);
            }
            // Never ready-at-once forever: a client sending nothing but
            // inline calls still lets this thread's other tasks run.
            tokio::task::consume_budget().await;
            return Ok(Json(Results { results: &results? }).into_response());
        }
    }
    // Dropped with this future when the client goes away: a component invocation ends then
    // (a core module at its deadline). An inline call has nothing to watch: it waits on
    // nothing and ends at its own short deadline.
    let (_present, watch) = ClientWatch::pair();
    match call {
        Some(call) => {
            let results = within_deadline(
                timeout,
                faas.in_scope(|| {
                    blocking(move || {
                        let _held = (permit, guards);
                        watch.scope(|| runtime.invoke_export(&id, &call.export, &call.args))
                    })
                }),
            )
            .await;
            crate::trace::outcome(&faas, &results);
            Ok(Json(Results { results: &results? }).into_response())
        }
        None => {
            let stdin = bytes.to_vec();
            let output = within_deadline(
                timeout,
                faas.in_scope(|| {
                    blocking(move || {
                        let _held = (permit, guards);
                        watch.scope(|| runtime.invoke_command(&id, stdin))
                    })
                }),
            )
            .await;
            crate::trace::outcome(&faas, &output);
            Ok(command_response(output?, json_output))
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
            "function {id} is not an export-call function ({} style); {route} serves \
             export-call functions",
            style.as_str()
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
        Ok(Err(_closed)) => Err(ApiError::new(
            ErrorCode::NotReady,
            "the server is shutting down",
        )),
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

#[cfg(test)]
mod tests {
    #[test]
    fn whole_numbers_written_as_floats_fill_integer_fields() {
        #[derive(serde::Deserialize)]
        struct Quota {
            n: u32,
            m: i64,
        }
        let q: Quota = super::parse_json(br#"{"n": 8472497.0, "m": -3.0}"#).unwrap();
        assert_eq!((q.n, q.m), (8_472_497, -3));
        assert!(super::parse_json::<Quota>(br#"{"n": 1.5, "m": 0}"#).is_err());
    }

    /// The export-call body is parsed in one pass, and as `parse_json` has it: an object
    /// only, unknown fields refused, whole numbers written as floats made integers.
    #[test]
    fn export_calls_parse_in_one_pass_as_parse_json_does() {
        let call =
            super::parse_call(br#" {"export": "add", "args": [1.0, -2.0, 2.5, [3.0]]}"#).unwrap();
        assert_eq!(call.export, "add");
        assert_eq!(
            serde_json::Value::Array(call.args).to_string(),
            "[1,-2,2.5,[3]]"
        );
        assert!(super::parse_call(br#"["add", [1, 2]]"#).is_err());
        assert!(super::parse_call(br#"{"export": "add", "argz": []}"#).is_err());
        assert!(super::parse_call(br#"{"export": "add""#).is_err());
        let empty = super::parse_call(br#"{"export": "f"}"#).unwrap();
        assert!(empty.args.is_empty());
    }

    /// serde would build these structs from arrays of their fields; the API takes objects only.
    #[test]
    fn bodies_and_nested_structs_must_be_objects() {
        #[derive(Debug, serde::Deserialize)]
        struct Inner {
            #[serde(default)]
            a: Option<u32>,
        }
        #[derive(Debug, serde::Deserialize)]
        struct Outer {
            #[serde(default, deserialize_with = "super::object_only")]
            inner: Option<Inner>,
        }
        assert!(super::parse_json::<Inner>(b"[7]").is_err());
        assert!(super::parse_json::<Outer>(br#"{"inner": [null]}"#).is_err());
        let outer: Outer = super::parse_json(br#"{"inner": {"a": 7}}"#).unwrap();
        assert_eq!(outer.inner.and_then(|inner| inner.a), Some(7));
    }
}
