//! The HTTP API of TensorWasm: an axum [`Router`] over a
//! [`tensor_wasm_runtime::Runtime`], with bearer-token authentication and
//! per-tenant quotas, stable JSON errors, a body limit, request ids,
//! Prometheus metrics and an OpenAPI document.
//!
//! ```no_run
//! # async fn serve() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use tensor_wasm_api::{router, ApiConfig, AppState, AuthMode};
//! use tensor_wasm_runtime::{FsFunctionStore, Runtime, RuntimeConfig, RuntimeMetrics};
//! use tensor_wasm_tenant::{FsTenantStore, TenantMetrics, TenantRegistry};
//!
//! let registry = prometheus::Registry::new();
//! let store = Arc::new(FsFunctionStore::open("./tensor-wasm-data")?);
//! let metrics = RuntimeMetrics::register(&registry)?;
//! let runtime = Runtime::open(RuntimeConfig::new("./tensor-wasm-data"), store, metrics)?;
//! let tenants = Arc::new(TenantRegistry::open(
//!     Arc::new(FsTenantStore::open("./tensor-wasm-data")?),
//!     TenantMetrics::register(&registry)?,
//! )?);
//! let state = AppState::new(runtime, registry, ApiConfig::default(), tenants, AuthMode::Enforced)?;
//! state.set_ready(true);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! let limits = tensor_wasm_api::ServeLimits::default();
//! tensor_wasm_api::serve(listener, tensor_wasm_api::App::new(state), limits, std::future::pending()).await?;
//! # Ok(()) }
//! ```

mod auth;
mod body_deadline;
mod edge;
pub mod error;
mod functions;
mod http_handler;
mod jobs;
mod metrics;
mod models;
mod openapi;
mod priority;
mod request_id;
mod routes;
mod serve;
mod shutdown;
mod snapshots;
mod stream;
mod tenants;
mod trace;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::{any, delete, get, post};
use axum::Router;
use prometheus::Registry;
use tensor_wasm_runtime::Runtime;
use tensor_wasm_tenant::{MemoryTenantStore, TenantMetrics, TenantRegistry};
use tokio::sync::Semaphore;

pub use auth::{AuthMode, Caller};
pub use edge::{Answer, App, DirectInvoke, Either};
pub use error::{ApiError, ErrorCode};
pub use jobs::{Claim, Job, JobLimits, JobQueue, JobStatus, QueueSettings, Submitted};
pub use metrics::{HttpMetrics, HttpRequestLabels, ROUTE_TEMPLATES};
pub use openapi::OPENAPI_JSON;
pub use serve::{serve, ServeLimits};
pub use tenants::RegistryPolicy;

/// Settings of the HTTP layer.
#[derive(Clone)]
pub struct ApiConfig {
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// How long an invocation may wait for a free instance slot before `429 busy`.
    pub queue_timeout: Duration,
    /// A token that may read `/metrics` (besides the admin token).
    pub metrics_token: Option<String>,
    /// Data directory whose `jobs/` keeps asynchronous jobs durable; `None`
    /// keeps them in memory.
    pub jobs_dir: Option<std::path::PathBuf>,
    /// Bounds on asynchronous jobs.
    pub jobs: JobLimits,
    /// How long a request body may take to arrive, from the request's
    /// headers on (`408 request_timeout` after).
    pub body_read_timeout: Duration,
}

impl std::fmt::Debug for ApiConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiConfig")
            .field("max_body_bytes", &self.max_body_bytes)
            .field("queue_timeout", &self.queue_timeout)
            .field("jobs", &self.jobs)
            .field("body_read_timeout", &self.body_read_timeout)
            .field(
                "metrics_token",
                &self.metrics_token.as_ref().map(|_| "<redacted>"),
            )
            .finish()
    }
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            max_body_bytes: 64 << 20,
            queue_timeout: Duration::from_secs(10),
            metrics_token: None,
            jobs_dir: None,
            jobs: JobLimits::default(),
            body_read_timeout: Duration::from_secs(60),
        }
    }
}

/// Shared state of every handler. Cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<StateInner>,
}

struct StateInner {
    runtime: Runtime,
    tenants: Arc<TenantRegistry>,
    jobs: jobs::JobBoard,
    /// The shared job queue, when jobs live in the shared store instead of `jobs`.
    queue: std::sync::OnceLock<Arc<jobs::queue::SharedQueue>>,
    auth: AuthMode,
    metrics_token: Option<String>,
    registry: Registry,
    http: HttpMetrics,
    slots: Arc<Semaphore>,
    request_ids: request_id::RequestIds,
    ready: AtomicBool,
    /// What else `/readyz` requires (e.g. the shared store reachable), with the reason when
    /// it fails.
    ready_check: std::sync::OnceLock<ReadyCheck>,
    streams_end: shutdown::StreamsEnd,
    config: ApiConfig,
}

/// A readiness condition besides the server's own: `Err(reason)` makes `/readyz` answer
/// `503 not_ready` with that reason.
pub type ReadyCheck = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

impl AppState {
    /// State over `runtime` and `tenants`; HTTP metrics are registered in
    /// `registry`, which `/metrics` serves. Starts not ready (see
    /// [`AppState::set_ready`]).
    ///
    /// Makes `tenants` the runtime's one source of tenant policy
    /// ([`RegistryPolicy`], [`Runtime::set_tenant_policy`]): a tenant's capability and GPU
    /// isolation level are read from it when they are needed, never copied.
    pub fn new(
        runtime: Runtime,
        registry: Registry,
        config: ApiConfig,
        tenants: Arc<TenantRegistry>,
        auth: AuthMode,
    ) -> prometheus::Result<Self> {
        let http = HttpMetrics::register(&registry)?;
        // The runtime asks the registry for each tenant's capability and isolation level.
        runtime.set_tenant_policy(Arc::new(tenants::RegistryPolicy::new(tenants.clone())));
        let slots = Arc::new(Semaphore::new(runtime.config().max_instances as usize));
        let metrics_token = config.metrics_token.clone();
        Ok(AppState {
            inner: Arc::new(StateInner {
                jobs: match &config.jobs_dir {
                    Some(dir) => jobs::JobBoard::open(dir, config.jobs.clone()).map_err(|e| {
                        prometheus::Error::Msg(format!("opening the job store: {e}"))
                    })?,
                    None => jobs::JobBoard::in_memory(config.jobs.clone()),
                },
                queue: std::sync::OnceLock::new(),
                runtime,
                tenants,
                auth,
                metrics_token,
                registry,
                http,
                slots,
                request_ids: request_id::RequestIds::default(),
                ready: AtomicBool::new(false),
                ready_check: std::sync::OnceLock::new(),
                streams_end: shutdown::StreamsEnd::new(),
                config,
            }),
        })
    }

    /// A single-tenant state without authentication (every request is the
    /// tenant `default`, with admin rights), over an in-memory tenant store:
    /// for tests, benches and embedding. The server binary never uses it
    /// unless started with `--insecure-no-auth`.
    pub fn insecure_single_tenant(
        runtime: Runtime,
        registry: Registry,
        config: ApiConfig,
    ) -> Result<Self, Box<dyn std::error::Error + Send + Sync>> {
        let tenants = Arc::new(TenantRegistry::open(
            Arc::new(MemoryTenantStore::new()),
            TenantMetrics::register(&registry)?,
        )?);
        tenants.bootstrap()?;
        let default = default_tenant(&tenants).ok_or("bootstrap created no default tenant")?;
        Ok(Self::new(
            runtime,
            registry,
            config,
            tenants,
            AuthMode::Insecure(default),
        )?)
    }

    /// The tenant registry.
    pub fn tenants(&self) -> &Arc<TenantRegistry> {
        &self.inner.tenants
    }

    /// Marks the service ready (or not) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }

    /// Adds a condition `/readyz` requires from now on (the first one set stays).
    pub fn set_ready_check(&self, check: ReadyCheck) {
        let _ = self.inner.ready_check.set(check);
    }

    /// Whether `/readyz` answers 200, or why not.
    pub(crate) fn readiness(&self) -> Result<(), String> {
        if !self.inner.ready.load(Ordering::Acquire) {
            return Err("the server is still loading its functions".into());
        }
        self.inner.ready_check.get().map_or(Ok(()), |check| check())
    }

    /// The runtime behind the API.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }
}

/// The tenant named `default` (created by the registry's bootstrap), if any.
pub fn default_tenant(tenants: &TenantRegistry) -> Option<Arc<tensor_wasm_tenant::Tenant>> {
    let info = tenants
        .list()
        .into_iter()
        .find(|t| t.name == tensor_wasm_tenant::DEFAULT_TENANT_NAME)?;
    tenants.lookup(&info.id)
}

/// The full router with every route, fallback and layer.
///
/// Authentication is a route layer of each protected group, so it covers
/// exactly their routes (their `405`s included) and nothing else: the health
/// probes and unknown paths (`404`) answer anyone. The outer layer (request
/// ids, metrics, the request log) wraps everything, refusals included.
pub fn router(state: AppState) -> Router {
    let public = Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/readyz", get(routes::readyz));
    // The metrics token opens `/metrics`, and only it.
    let metrics_route = Router::new()
        .route("/metrics", get(routes::metrics))
        .method_not_allowed_fallback(routes::method_not_allowed)
        .route_layer(auth::Authenticate::metrics_reader(state.clone()));
    let protected = Router::new()
        .route("/openapi.json", get(openapi::serve))
        .route(
            "/functions",
            post(functions::create_function).get(functions::list_functions),
        )
        .route(
            "/functions/{id}",
            get(functions::get_function)
                .patch(functions::update_function)
                .delete(functions::delete_function),
        )
        .route(
            "/functions/{id}/snapshots",
            post(snapshots::create_snapshot).get(snapshots::list_snapshots),
        )
        .route(
            "/functions/{id}/snapshots/{snapshot_id}",
            delete(snapshots::delete_snapshot),
        )
        .route("/functions/{id}/invoke", post(routes::invoke))
        .route("/functions/{id}/invoke-stream", post(stream::invoke_stream))
        .route("/functions/{id}/invoke-async", post(jobs::invoke_async))
        .route("/functions/{id}/http", any(http_handler::by_id))
        .route("/functions/{id}/http/", any(http_handler::by_id))
        .route("/functions/{id}/http/{*path}", any(http_handler::by_id))
        .route("/functions/by-name/{name}/http", any(http_handler::by_name))
        .route(
            "/functions/by-name/{name}/http/",
            any(http_handler::by_name),
        )
        .route(
            "/functions/by-name/{name}/http/{*path}",
            any(http_handler::by_name),
        )
        .route("/jobs/{id}", get(jobs::get_job).delete(jobs::cancel_job))
        .route(
            "/models",
            post(models::create_model).get(models::list_models),
        )
        .route(
            "/models/{name}",
            get(models::get_model).delete(models::delete_model),
        )
        .route(
            "/tenants",
            post(tenants::create_tenant).get(tenants::list_tenants),
        )
        .route(
            "/tenants/{id}",
            get(tenants::get_tenant)
                .patch(tenants::update_tenant)
                .delete(tenants::delete_tenant),
        )
        .route("/tenants/{id}/tokens", post(tenants::create_token))
        .route(
            "/tenants/{id}/tokens/{token_id}",
            delete(tenants::revoke_token),
        )
        // Set before the route layer, so that the layer covers `405`s too.
        .method_not_allowed_fallback(routes::method_not_allowed)
        .route_layer(auth::Authenticate::protected(state.clone()));
    public
        .merge(metrics_route)
        .merge(protected)
        .fallback(routes::route_not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(edge::EdgeLayer::new(state.clone()))
        .with_state(state)
}
