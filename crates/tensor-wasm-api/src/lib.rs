//! The HTTP API of TensorWasm: an axum [`Router`] over a
//! [`tensor_wasm_runtime::Runtime`], with stable JSON errors, a body limit,
//! request ids, Prometheus metrics and an OpenAPI document.
//!
//! ```no_run
//! # async fn serve() -> anyhow::Result<()> {
//! use std::sync::Arc;
//! use tensor_wasm_api::{router, ApiConfig, AppState};
//! use tensor_wasm_runtime::{FsFunctionStore, Runtime, RuntimeConfig, RuntimeMetrics};
//!
//! let registry = prometheus::Registry::new();
//! let store = Arc::new(FsFunctionStore::open("./tensor-wasm-data")?);
//! let metrics = RuntimeMetrics::register(&registry)?;
//! let runtime = Runtime::open(RuntimeConfig::new("./tensor-wasm-data"), store, metrics)?;
//! let state = AppState::new(runtime, registry, ApiConfig::default())?;
//! state.set_ready(true);
//! let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
//! axum::serve(listener, router(state)).await?;
//! # Ok(()) }
//! ```

mod error;
mod metrics;
mod openapi;
mod request_id;
mod routes;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::DefaultBodyLimit;
use axum::routing::{get, post};
use axum::Router;
use prometheus::Registry;
use tensor_wasm_runtime::Runtime;
use tokio::sync::Semaphore;

pub use error::{ApiError, ERROR_CODES};
pub use metrics::HttpMetrics;
pub use openapi::OPENAPI_JSON;

/// Settings of the HTTP layer.
#[derive(Debug, Clone)]
pub struct ApiConfig {
    /// Largest request body accepted (413 above).
    pub max_body_bytes: usize,
    /// How long an invocation may wait for a free instance slot before `503 busy`.
    pub queue_timeout: Duration,
}

impl Default for ApiConfig {
    fn default() -> Self {
        ApiConfig {
            max_body_bytes: 64 << 20,
            queue_timeout: Duration::from_secs(10),
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
    registry: Registry,
    http: HttpMetrics,
    slots: Arc<Semaphore>,
    request_ids: request_id::RequestIds,
    ready: AtomicBool,
    config: ApiConfig,
}

impl AppState {
    /// State over `runtime`; HTTP metrics are registered in `registry`, which
    /// `/metrics` serves. Starts not ready (see [`AppState::set_ready`]).
    pub fn new(
        runtime: Runtime,
        registry: Registry,
        config: ApiConfig,
    ) -> prometheus::Result<Self> {
        let http = HttpMetrics::register(&registry)?;
        let slots = Arc::new(Semaphore::new(runtime.config().max_instances as usize));
        Ok(AppState {
            inner: Arc::new(StateInner {
                runtime,
                registry,
                http,
                slots,
                request_ids: request_id::RequestIds::default(),
                ready: AtomicBool::new(false),
                config,
            }),
        })
    }

    /// Marks the service ready (or not) for `/readyz`.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }

    /// The runtime behind the API.
    pub fn runtime(&self) -> &Runtime {
        &self.inner.runtime
    }
}

/// The full router with every route, fallback and layer.
pub fn router(state: AppState) -> Router {
    let body_limit = state.inner.config.max_body_bytes;
    Router::new()
        .route("/healthz", get(routes::healthz))
        .route("/readyz", get(routes::readyz))
        .route("/metrics", get(routes::metrics))
        .route("/openapi.json", get(openapi::serve))
        .route(
            "/functions",
            post(routes::create_function).get(routes::list_functions),
        )
        .route(
            "/functions/{id}",
            get(routes::get_function).delete(routes::delete_function),
        )
        .route("/functions/{id}/invoke", post(routes::invoke))
        .fallback(routes::route_not_found)
        .method_not_allowed_fallback(routes::method_not_allowed)
        .layer(DefaultBodyLimit::max(body_limit))
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            metrics::observe,
        ))
        .with_state(state)
}
