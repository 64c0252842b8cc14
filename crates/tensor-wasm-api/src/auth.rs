//! Authentication and the tenant admin routes.
//!
//! Every route except `/healthz` and `/readyz` needs `Authorization: Bearer
//! <token>`. A tenant token acts as that tenant on the function routes; the
//! admin token manages tenants and reads `/metrics` (as does the metrics
//! token, when one is configured). With `--insecure-no-auth` (loopback only)
//! every request acts as the default tenant and as admin.

use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use tensor_wasm_tenant::{
    constant_time_eq, is_valid_tenant_id, GpuIsolation, Principal, QuotaError, QuotaKind, Quotas,
    QuotasPatch, Tenant, TenantError,
};

use crate::{ApiError, AppState};

/// What a tenant's recorded GPU isolation level asks of the runtime.
///
/// The tenant crate's names predate per-tenant lanes and do not match the
/// GPU crate's: `shared_context_own_stream` (every tenant's default) asks for
/// nothing of its own, so the tenant gets the server-wide level (`serve
/// --gpu-isolation`: a stream in the shared context unless the server was
/// started with `context`); `own_context` asks for a CUDA context of the
/// tenant's own whatever the server-wide level. A server-wide `context`
/// therefore gives every tenant a context; a tenant can raise its isolation
/// above the server's level, never lower it.
pub(crate) fn runtime_gpu_isolation(
    level: GpuIsolation,
) -> Option<tensor_wasm_runtime::GpuIsolation> {
    match level {
        GpuIsolation::SharedContextOwnStream => None,
        GpuIsolation::OwnContext => Some(tensor_wasm_runtime::GpuIsolation::ContextPerTenant),
    }
}

/// Tells the runtime the GPU isolation level tenant `id` recorded (see
/// [`runtime_gpu_isolation`]).
pub(crate) fn sync_gpu_isolation(
    runtime: &tensor_wasm_runtime::Runtime,
    id: &str,
    level: GpuIsolation,
) {
    runtime.set_tenant_gpu_isolation(id, runtime_gpu_isolation(level));
}

/// How requests are authenticated.
#[derive(Clone)]
pub enum AuthMode {
    /// Bearer tokens checked against the tenant registry.
    Enforced,
    /// No checks: every request is the given (default) tenant, and admin.
    Insecure(Arc<Tenant>),
}

/// Who is calling, put in the request extensions by the `observe` middleware.
#[derive(Clone)]
pub enum Caller {
    Admin,
    Tenant(Arc<Tenant>),
    /// `--insecure-no-auth`: the default tenant, with admin rights.
    Insecure(Arc<Tenant>),
}

impl Caller {
    /// The tenant acting, or 403 for the admin token.
    pub(crate) fn tenant(&self) -> Result<&Arc<Tenant>, ApiError> {
        match self {
            Caller::Tenant(t) | Caller::Insecure(t) => Ok(t),
            Caller::Admin => Err(ApiError::new(
                "forbidden",
                "the admin token manages tenants; use a tenant token for functions",
            )),
        }
    }

    /// Ok for the admin (and insecure mode), 403 for tenants.
    pub(crate) fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Caller::Admin | Caller::Insecure(_) => Ok(()),
            Caller::Tenant(_) => Err(ApiError::new(
                "forbidden",
                "this route needs the admin token",
            )),
        }
    }
}

/// `401 unauthorized` with `WWW-Authenticate: Bearer`.
pub(crate) fn unauthorized(message: &str) -> Response {
    let mut response = ApiError::new("unauthorized", message).into_response();
    response
        .headers_mut()
        .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    response
}

/// The bearer token of a request: `Ok(None)` when there is no header.
fn bearer(req: &Request) -> Result<Option<&str>, &'static str> {
    let Some(value) = req.headers().get(header::AUTHORIZATION) else {
        return Ok(None);
    };
    let value = value
        .to_str()
        .map_err(|_| "malformed Authorization header")?;
    let (scheme, token) = value
        .split_once(' ')
        .ok_or("malformed Authorization header: expected `Bearer <token>`")?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err("malformed Authorization header: expected `Bearer <token>`");
    }
    Ok(Some(token.trim()))
}

/// Resolves the caller of a protected route, or says why it is refused (401,
/// see [`unauthorized`]). Called by the `observe` middleware (one layer for
/// request ids, auth and metrics keeps the per-request overhead down).
pub(crate) fn caller_of(state: &AppState, req: &Request) -> Result<Caller, &'static str> {
    let token = match &state.inner.auth {
        AuthMode::Insecure(default) => return Ok(Caller::Insecure(default.clone())),
        AuthMode::Enforced => match bearer(req) {
            Err(message) => return Err(message),
            Ok(None) => return Err("missing `Authorization: Bearer <token>`"),
            Ok(Some(token)) => token,
        },
    };
    let metrics_token = state.inner.metrics_token.as_deref();
    if req.uri().path() == "/metrics"
        && metrics_token.is_some_and(|m| constant_time_eq(m.as_bytes(), token.as_bytes()))
    {
        return Ok(Caller::Admin);
    }
    match state.inner.tenants.authenticate(token) {
        Some(Principal::Admin) => Ok(Caller::Admin),
        Some(Principal::Tenant(t)) => Ok(Caller::Tenant(t)),
        None => Err("unknown or revoked token"),
    }
}

/// Maps a quota refusal to its status: rate and concurrency 429 with
/// `Retry-After`, size 403, count 409; the message names quota and limit.
pub(crate) fn quota_error(tenant: &Tenant, err: QuotaError) -> ApiError {
    let message = format!(
        "tenant {}: {} (quota `{}` = {})",
        tenant.id(),
        err,
        err.quota,
        err.limit
    );
    let mut e = match err.kind {
        QuotaKind::Rate => ApiError::new("rate_limited", message),
        QuotaKind::Concurrency => ApiError::new("quota_exhausted", message),
        QuotaKind::Size => ApiError::new("quota_size_exceeded", message),
        QuotaKind::Count => ApiError::new("quota_count_exceeded", message),
    };
    if matches!(err.kind, QuotaKind::Rate | QuotaKind::Concurrency) {
        e.retry_after_s = Some(err.retry_after_s.unwrap_or(1).max(1));
    }
    e
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateTenant {
    name: String,
    #[serde(default)]
    quotas: QuotasPatch,
    #[serde(default)]
    gpu_isolation: Option<GpuIsolation>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateTenant {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    quotas: QuotasPatch,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateToken {
    #[serde(default)]
    label: String,
}

fn tenant_not_found(id: &str) -> ApiError {
    ApiError::new("not_found", format!("tenant {id} not found"))
}

fn tenant_error(e: TenantError) -> ApiError {
    match e {
        TenantError::NotFound(id) | TenantError::InvalidId(id) => tenant_not_found(&id),
        TenantError::NameTaken(_) => ApiError::new("conflict", e.to_string()),
        TenantError::InvalidName(_) | TenantError::InvalidLabel => {
            ApiError::bad_request(e.to_string())
        }
        other => ApiError::internal(other),
    }
}

fn parse_body<T: serde::de::DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))
}

pub(crate) async fn create_tenant(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let req: CreateTenant = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    let mut quotas = Quotas::default();
    quotas.apply(&req.quotas);
    let (info, token) = state
        .inner
        .tenants
        .create_tenant(&req.name, quotas, req.gpu_isolation.unwrap_or_default())
        .map_err(tenant_error)?;
    // Before the token is returned, so no function of the tenant can have
    // been instantiated at another level.
    sync_gpu_isolation(&state.inner.runtime, &info.id, info.gpu_isolation);
    let location = format!("/tenants/{}", info.id);
    let body = json!({ "tenant": info, "token": token.secret, "token_id": token.info.id });
    Ok((
        StatusCode::CREATED,
        [(header::LOCATION, location)],
        Json(body),
    )
        .into_response())
}

pub(crate) async fn list_tenants(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    Ok(Json(json!({ "tenants": state.inner.tenants.list() })))
}

pub(crate) async fn get_tenant(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    let info = state
        .inner
        .tenants
        .info(&id)
        .ok_or_else(|| tenant_not_found(&id))?;
    let usage = state.inner.tenants.lookup(&id).map(|t| {
        let mut usage = serde_json::Map::new();
        for r in tensor_wasm_tenant::Resource::ALL {
            usage.insert(r.quota_name().to_owned(), json!(t.usage(r)));
        }
        usage
    });
    let mut body = serde_json::to_value(info).map_err(ApiError::internal)?;
    body["usage"] = json!(usage);
    Ok(Json(body))
}

pub(crate) async fn update_tenant(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Json<Value>, ApiError> {
    caller.require_admin()?;
    let req: UpdateTenant = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON: {e}")))?;
    let info = state
        .inner
        .tenants
        .update(&id, &req.quotas, req.name.as_deref())
        .map_err(tenant_error)?;
    Ok(Json(
        serde_json::to_value(info).map_err(ApiError::internal)?,
    ))
}

pub(crate) async fn delete_tenant(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    caller.require_admin()?;
    if !is_valid_tenant_id(&id) || state.inner.tenants.info(&id).is_none() {
        return Err(tenant_not_found(&id));
    }
    // The tenant's functions go with it.
    let runtime = state.inner.runtime.clone();
    let owner = id.clone();
    tokio::task::spawn_blocking(move || {
        for f in runtime.functions_of(&owner) {
            runtime.delete(&f.id)?;
        }
        Ok::<(), tensor_wasm_runtime::RuntimeError>(())
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(ApiError::from)?;
    if state.inner.tenants.delete(&id).map_err(tenant_error)? {
        state.inner.runtime.set_tenant_gpu_isolation(&id, None);
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(tenant_not_found(&id))
    }
}

pub(crate) async fn create_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let req: CreateToken = parse_body(&body)?;
    let token = state
        .inner
        .tenants
        .create_token(&id, &req.label)
        .map_err(tenant_error)?;
    let body = json!({ "token": token.secret, "token_id": token.info.id, "info": token.info });
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

pub(crate) async fn revoke_token(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    Path((id, token_id)): Path<(String, String)>,
) -> Result<StatusCode, ApiError> {
    caller.require_admin()?;
    if state
        .inner
        .tenants
        .revoke_token(&id, &token_id)
        .map_err(tenant_error)?
    {
        Ok(StatusCode::NO_CONTENT)
    } else {
        Err(ApiError::new(
            "not_found",
            format!("token {token_id} not found"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::Method;
    use axum::Router;
    use tensor_wasm_runtime::{FsFunctionStore, Runtime, RuntimeConfig, RuntimeMetrics};
    use tensor_wasm_tenant::{MemoryTenantStore, TenantMetrics, TenantRegistry};
    use tower::ServiceExt;

    use crate::{router, ApiConfig, ROUTE_TEMPLATES};

    const METRICS_TOKEN: &str = "metrics-reader-secret";

    struct Enforced {
        _dir: tempfile::TempDir,
        app: Router,
        admin: String,
        tenant: String,
    }

    /// A router with authentication enforced and a metrics token configured.
    fn enforced() -> Enforced {
        let dir = tempfile::tempdir().unwrap();
        let registry = prometheus::Registry::new();
        let store = Arc::new(FsFunctionStore::open(dir.path()).unwrap());
        let metrics = RuntimeMetrics::register(&registry).unwrap();
        let runtime = Runtime::open(RuntimeConfig::for_tests(dir.path()), store, metrics).unwrap();
        let tenants = Arc::new(
            TenantRegistry::open(
                Arc::new(MemoryTenantStore::new()),
                TenantMetrics::register(&registry).unwrap(),
            )
            .unwrap(),
        );
        let boot = tenants.bootstrap().unwrap().expect("fresh store");
        let config = ApiConfig {
            metrics_token: Some(METRICS_TOKEN.to_owned()),
            ..ApiConfig::default()
        };
        let state = AppState::new(runtime, registry, config, tenants, AuthMode::Enforced).unwrap();
        state.set_ready(true);
        Enforced {
            _dir: dir,
            app: router(state),
            admin: boot.admin_token,
            tenant: boot.tenant_token,
        }
    }

    /// Status and `WWW-Authenticate` of one request with an optional bearer token.
    async fn send(
        app: &Router,
        method: &Method,
        uri: &str,
        token: Option<&str>,
    ) -> (StatusCode, Option<HeaderValue>) {
        let mut req = Request::builder().method(method.clone()).uri(uri);
        if let Some(token) = token {
            req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
        }
        let response = app
            .clone()
            .oneshot(req.body(Body::empty()).unwrap())
            .await
            .unwrap();
        let challenge = response.headers().get(header::WWW_AUTHENTICATE).cloned();
        (response.status(), challenge)
    }

    fn methods() -> Vec<Method> {
        let mut all = vec![
            Method::GET,
            Method::POST,
            Method::PUT,
            Method::PATCH,
            Method::DELETE,
        ];
        all.push(Method::from_bytes(b"FOO").unwrap());
        all
    }

    /// Which routes are public, and which tokens each protected route takes: every
    /// method on every protected route (405s included) is 401 without a token, the
    /// probes answer anyone, unknown paths are 404 for anyone, and the metrics
    /// token opens `/metrics` and nothing else.
    #[tokio::test]
    async fn authentication_covers_every_protected_route_and_only_those() {
        let e = enforced();
        let bearer = Some(HeaderValue::from_static("Bearer"));
        for template in ROUTE_TEMPLATES {
            let uri = template
                .replace("{id}", "x")
                .replace("{token_id}", "y")
                .replace("{snapshot_id}", "z");
            let public = matches!(*template, "/healthz" | "/readyz");
            for method in methods() {
                for token in [None, Some("not-a-token"), Some(METRICS_TOKEN)] {
                    let (status, challenge) = send(&e.app, &method, &uri, token).await;
                    let metrics_reader = *template == "/metrics" && token == Some(METRICS_TOKEN);
                    if public || metrics_reader {
                        let expected = if method == Method::GET {
                            StatusCode::OK
                        } else {
                            StatusCode::METHOD_NOT_ALLOWED
                        };
                        assert_eq!(status, expected, "{method} {uri} with {token:?}");
                        assert_eq!(challenge, None);
                    } else {
                        assert_eq!(
                            (status, &challenge),
                            (StatusCode::UNAUTHORIZED, &bearer),
                            "{method} {uri} with {token:?}"
                        );
                    }
                }
            }
        }
        for uri in ["/nope", "/metrics/", "/functions/x/y/z/w"] {
            let (status, _) = send(&e.app, &Method::GET, uri, None).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
        }
        // `/metrics` and `/openapi.json` with the real tokens.
        let get = |uri: &'static str, token: String| {
            let app = e.app.clone();
            async move { send(&app, &Method::GET, uri, Some(&token)).await.0 }
        };
        assert_eq!(get("/metrics", e.admin.clone()).await, StatusCode::OK);
        assert_eq!(
            get("/metrics", e.tenant.clone()).await,
            StatusCode::FORBIDDEN
        );
        assert_eq!(get("/openapi.json", e.admin.clone()).await, StatusCode::OK);
        assert_eq!(get("/openapi.json", e.tenant.clone()).await, StatusCode::OK);
        assert_eq!(get("/functions", e.tenant.clone()).await, StatusCode::OK);
    }

    #[test]
    fn recorded_gpu_isolation_maps_to_the_runtime_level() {
        // The default asks for nothing: the tenant follows the server-wide level.
        assert_eq!(
            runtime_gpu_isolation(GpuIsolation::SharedContextOwnStream),
            None
        );
        assert_eq!(runtime_gpu_isolation(GpuIsolation::default()), None);
        assert_eq!(
            runtime_gpu_isolation(GpuIsolation::OwnContext),
            Some(tensor_wasm_runtime::GpuIsolation::ContextPerTenant)
        );
    }
}
