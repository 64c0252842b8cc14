//! The tenant admin routes (`/tenants`, `/tenants/{id}`, their tokens), and
//! keeping the runtime's per-tenant GPU isolation in step with the registry.
//!
//! Every route here needs the admin token (or `--insecure-no-auth`).

use axum::extract::{Path, State};
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use serde::Deserialize;
use serde_json::{json, Value};
use std::sync::Arc;

use tensor_wasm_tenant::{
    is_valid_tenant_id, GpuIsolation, Quotas, QuotasPatch, TenantError, TenantRegistry,
};

use crate::auth::Caller;
use crate::{ApiError, AppState, ErrorCode};

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

/// The tenant registry as the runtime's one source of tenant policy
/// ([`tensor_wasm_runtime::TenantPolicy`]): the capability and GPU isolation level each tenant
/// has in the registry now, which the admin routes change and a replica's change-log follower
/// reloads. With a freshness check (a replica of a shared store), a replica that cannot vouch
/// for being current answers that no tenant holds the raw-kernel capability (fail closed).
pub struct RegistryPolicy {
    tenants: Arc<TenantRegistry>,
    fresh: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl std::fmt::Debug for RegistryPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RegistryPolicy")
            .field("tenants", &self.tenants.len())
            .field("following", &self.fresh.is_some())
            .finish()
    }
}

impl RegistryPolicy {
    /// The policy of `tenants`, always current (one process owns the registry).
    pub fn new(tenants: Arc<TenantRegistry>) -> Self {
        RegistryPolicy {
            tenants,
            fresh: None,
        }
    }

    /// The policy of `tenants` kept current by a change-log follower; `fresh` says whether
    /// it has read the log recently enough.
    pub fn following(
        tenants: Arc<TenantRegistry>,
        fresh: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        RegistryPolicy {
            tenants,
            fresh: Some(fresh),
        }
    }
}

impl tensor_wasm_runtime::TenantPolicy for RegistryPolicy {
    fn raw_ptx(&self, tenant: &str) -> Option<bool> {
        let granted = self.tenants.lookup(tenant)?.raw_ptx();
        Some(granted && self.fresh.as_ref().is_none_or(|fresh| fresh()))
    }

    fn gpu_isolation(&self, tenant: &str) -> Option<tensor_wasm_runtime::GpuIsolation> {
        runtime_gpu_isolation(self.tenants.lookup(tenant)?.isolation())
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateTenant {
    name: String,
    #[serde(default, deserialize_with = "crate::routes::object_only")]
    quotas: QuotasPatch,
    #[serde(default)]
    gpu_isolation: Option<GpuIsolation>,
    /// The raw-kernel capability (admin only, like every route here).
    #[serde(default)]
    raw_ptx: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct UpdateTenant {
    #[serde(default)]
    name: Option<String>,
    #[serde(default, deserialize_with = "crate::routes::object_only")]
    quotas: QuotasPatch,
    /// Grants (`true`) or revokes (`false`) the raw-kernel capability.
    #[serde(default)]
    raw_ptx: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct CreateToken {
    #[serde(default)]
    label: String,
}

fn tenant_not_found(id: &str) -> ApiError {
    ApiError::new(ErrorCode::NotFound, format!("tenant {id} not found"))
}

fn tenant_error(e: TenantError) -> ApiError {
    match e {
        TenantError::NotFound(id) | TenantError::InvalidId(id) => tenant_not_found(&id),
        TenantError::NameTaken(_) => ApiError::new(ErrorCode::Conflict, e.to_string()),
        TenantError::InvalidName(_) | TenantError::InvalidLabel => {
            ApiError::bad_request(e.to_string())
        }
        TenantError::Unavailable(_) => ApiError::store_unavailable(e.to_string()),
        other => ApiError::internal(other),
    }
}

fn parse_body<T: serde::de::DeserializeOwned + Default>(bytes: &[u8]) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    crate::routes::parse_json(bytes)
}

pub(crate) async fn create_tenant(
    State(state): State<AppState>,
    Extension(caller): Extension<Caller>,
    body: axum::body::Bytes,
) -> Result<Response, ApiError> {
    caller.require_admin()?;
    let req: CreateTenant = crate::routes::parse_json(&body)?;
    let mut quotas = Quotas::default();
    quotas.apply(&req.quotas);
    let (mut info, token) = state
        .inner
        .tenants
        .create_tenant(&req.name, quotas, req.gpu_isolation.unwrap_or_default())
        .map_err(tenant_error)?;
    if req.raw_ptx {
        info = state
            .inner
            .tenants
            .set_raw_ptx(&info.id, true)
            .map_err(tenant_error)?;
    }
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
    let req: UpdateTenant = crate::routes::parse_json(&body)?;
    let mut info = state
        .inner
        .tenants
        .update(&id, &req.quotas, req.name.as_deref())
        .map_err(tenant_error)?;
    if let Some(granted) = req.raw_ptx {
        // The runtime asks the registry (`RegistryPolicy`): a revoke stops new instances
        // once the registry holds it, before this answers.
        info = state
            .inner
            .tenants
            .set_raw_ptx(&id, granted)
            .map_err(tenant_error)?;
    }
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
    // The tenant's functions go with it. Retired first: a deploy of the
    // tenant still in flight either committed before (and the sweep finds
    // it) or is refused with 410 `tenant_deleted`, storing nothing.
    let runtime = state.inner.runtime.clone();
    let owner = id.clone();
    let swept = tokio::task::spawn_blocking(move || {
        runtime.retire_tenant(&owner);
        for f in runtime.functions_of(&owner) {
            runtime.delete(&f.id)?;
        }
        Ok::<(), tensor_wasm_runtime::RuntimeError>(())
    })
    .await
    .map_err(ApiError::internal)
    .and_then(|r| r.map_err(ApiError::from));
    let deleted = swept.and_then(|()| state.inner.tenants.delete(&id).map_err(tenant_error));
    match deleted {
        Ok(true) => {
            state.inner.jobs.forget_tenant(&id);
            if let Some(shared) = state.inner.queue.get() {
                // Best effort: a job left behind fails when it runs (no tenant), and goes
                // with the retention of finished jobs.
                let (queue, tenant) = (shared.queue.clone(), id.clone());
                if let Err(e) = crate::routes::blocking(move || queue.forget_tenant(&tenant)).await
                {
                    tracing::warn!(tenant = %id, error = %e.message, "could not forget a deleted tenant's jobs");
                }
            }
            Ok(StatusCode::NO_CONTENT)
        }
        Ok(false) => Err(tenant_not_found(&id)),
        Err(e) => {
            // The tenant is still there: it may deploy again (its
            // functions swept so far stay deleted).
            state.inner.runtime.reinstate_tenant(&id);
            Err(e)
        }
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
            ErrorCode::NotFound,
            format!("token {token_id} not found"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn the_registry_policy_reads_the_registry_and_fails_closed_when_behind() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use tensor_wasm_runtime::TenantPolicy;
        let registry = Arc::new(
            TenantRegistry::open(
                Arc::new(tensor_wasm_tenant::MemoryTenantStore::new()),
                tensor_wasm_tenant::TenantMetrics::unregistered().unwrap(),
            )
            .unwrap(),
        );
        let (info, _) = registry
            .create_tenant("p", Quotas::default(), GpuIsolation::OwnContext)
            .unwrap();
        let current = Arc::new(AtomicBool::new(true));
        let fresh = {
            let current = current.clone();
            Arc::new(move || current.load(Ordering::Acquire))
        };
        let policy = RegistryPolicy::following(registry.clone(), fresh);
        assert_eq!(policy.raw_ptx(&info.id), Some(false));
        assert_eq!(policy.raw_ptx("tn-unknown"), None);
        assert_eq!(
            policy.gpu_isolation(&info.id),
            Some(tensor_wasm_runtime::GpuIsolation::ContextPerTenant)
        );
        // A grant is read at once, without anything pushed to the runtime.
        registry.set_raw_ptx(&info.id, true).unwrap();
        assert_eq!(policy.raw_ptx(&info.id), Some(true));
        // Behind the change log: nobody holds the capability here.
        current.store(false, Ordering::Release);
        assert_eq!(policy.raw_ptx(&info.id), Some(false));
        current.store(true, Ordering::Release);
        assert_eq!(policy.raw_ptx(&info.id), Some(true));
    }
}
