//! In-process API servers driven with `Router::oneshot`: a runtime over a
//! fresh data directory, the router in front of it, and request helpers.
//!
//! - [`InsecureApp`]: one implicit tenant, no tokens (`--insecure-no-auth`),
//!   what the route, error-code and OpenAPI tests and the API benches use.
//! - [`EnforcedApp`]: authentication enforced, tenants created through the
//!   admin API, what the tenant, snapshot and streaming tests use.
//! - [`send`]: one request through a router, body read in full; the request
//!   path the API benches time, so it does no more than that.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{header, HeaderMap, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tempfile::TempDir;
use tensor_wasm_api::{default_tenant, router, ApiConfig, AppState, AuthMode};
use tensor_wasm_runtime::{FsFunctionStore, FunctionStore, Runtime, RuntimeConfig, RuntimeMetrics};
use tensor_wasm_tenant::{FsTenantStore, Tenant, TenantMetrics, TenantRegistry, TenantStore};
use tower::ServiceExt;

use crate::guests::example;

/// Opens a runtime over `config.data_dir` with its metrics in `registry`.
pub fn open_runtime(config: RuntimeConfig, registry: &prometheus::Registry) -> Runtime {
    let store = Arc::new(FsFunctionStore::open(&config.data_dir).expect("function store"));
    let metrics = RuntimeMetrics::register(registry).expect("runtime metrics");
    Runtime::open(config, store, metrics).expect("runtime starts")
}

/// Sends one request through `app` and reads the whole response body.
pub async fn send(app: &Router, request: Request<Body>) -> (StatusCode, Bytes) {
    let response = app
        .clone()
        .oneshot(request)
        .await
        .expect("the router is infallible");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("response body")
        .to_bytes();
    (status, body)
}

/// A response with its headers, read in full.
#[derive(Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    /// Sends `request` through `app` and keeps status, headers and body.
    pub async fn of(app: &Router, request: Request<Body>) -> Reply {
        let response = app
            .clone()
            .oneshot(request)
            .await
            .expect("the router is infallible");
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .expect("response body")
            .to_bytes()
            .to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }

    /// The `error.code` of an error body, `<none>` without one.
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("<none>")
            .to_owned()
    }

    /// The body as text, for assertion messages.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// The router over a fresh runtime with one implicit tenant and no tokens.
pub struct InsecureApp {
    pub app: Router,
    /// The state behind `app` (the same one: `AppState` clones share it).
    pub state: AppState,
    pub runtime: Runtime,
    pub tenants: Arc<TenantRegistry>,
    // Last: the data directory outlives the runtime and the router.
    pub dir: TempDir,
}

impl InsecureApp {
    /// `RuntimeConfig::for_tests` and `ApiConfig::default()`, marked ready.
    pub fn new() -> InsecureApp {
        Self::with(|_| {}, ApiConfig::default())
    }

    /// Tuned runtime configuration and the given API configuration, marked ready.
    pub fn with(tune: impl FnOnce(&mut RuntimeConfig), api: ApiConfig) -> InsecureApp {
        let app = Self::not_ready(tune, api);
        app.state.set_ready(true);
        app
    }

    /// Like [`InsecureApp::with`], but `/readyz` answers 503 until
    /// `state.set_ready(true)`.
    pub fn not_ready(tune: impl FnOnce(&mut RuntimeConfig), api: ApiConfig) -> InsecureApp {
        let dir = tempfile::tempdir().expect("temporary directory");
        let registry = prometheus::Registry::new();
        let mut config = RuntimeConfig::for_tests(dir.path());
        tune(&mut config);
        let runtime = open_runtime(config, &registry);
        let state =
            AppState::insecure_single_tenant(runtime.clone(), registry, api).expect("app state");
        let tenants = state.tenants().clone();
        InsecureApp {
            app: router(state.clone()),
            state,
            runtime,
            tenants,
            dir,
        }
    }

    /// The implicit tenant every request runs as.
    pub fn tenant(&self) -> Arc<Tenant> {
        default_tenant(&self.tenants).expect("the insecure mode's tenant")
    }

    /// Sends `body` with an optional content type.
    pub async fn send(
        &self,
        method: Method,
        uri: &str,
        ctype: Option<&str>,
        body: Vec<u8>,
    ) -> Reply {
        let mut req = Request::builder().method(method).uri(uri);
        if let Some(ct) = ctype {
            req = req.header(header::CONTENT_TYPE, ct);
        }
        Reply::of(&self.app, req.body(Body::from(body)).expect("request")).await
    }

    pub async fn get(&self, uri: &str) -> Reply {
        self.send(Method::GET, uri, None, Vec::new()).await
    }

    /// Deploys `examples/<file>` with the query `query`; returns its id.
    pub async fn deploy(&self, file: &str, query: &str) -> String {
        let r = self
            .send(
                Method::POST,
                &format!("/functions?{query}"),
                Some("application/wasm"),
                example(file),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        r.json()["id"].as_str().expect("an id").to_owned()
    }

    /// Posts `body` (an `{"export", "args"}` document) to the invoke route.
    pub async fn invoke(&self, id: &str, body: Value) -> Reply {
        self.send(
            Method::POST,
            &format!("/functions/{id}/invoke"),
            Some("application/json"),
            body.to_string().into_bytes(),
        )
        .await
    }
}

impl Default for InsecureApp {
    fn default() -> Self {
        Self::new()
    }
}

/// The router over a fresh runtime and tenant store with authentication
/// enforced; `admin` is the bootstrap admin token.
pub struct EnforcedApp {
    pub app: Router,
    pub tenants: Arc<TenantRegistry>,
    pub runtime: Runtime,
    pub admin: String,
    // Last: the data directory outlives the runtime and the router.
    pub dir: TempDir,
}

impl EnforcedApp {
    /// `RuntimeConfig::for_tests` and `ApiConfig::default()`, marked ready.
    pub fn new() -> EnforcedApp {
        Self::with(|_| {}, ApiConfig::default())
    }

    /// Tuned runtime configuration and the given API configuration, marked ready.
    pub fn with(tune: impl FnOnce(&mut RuntimeConfig), api: ApiConfig) -> EnforcedApp {
        Self::over_store(tune, api, |fs| fs)
    }

    /// Like [`EnforcedApp::new`], with the API settings `tune` makes (it
    /// gets the data directory, e.g. for `jobs_dir`).
    pub fn with_api(tune: impl FnOnce(&std::path::Path, &mut ApiConfig)) -> EnforcedApp {
        Self::build(|_| {}, tune, |fs| fs)
    }

    /// Like [`EnforcedApp::with`], with the runtime's function store wrapped
    /// by `wrap` (e.g. a store that holds writes until a test lets them go).
    pub fn over_store(
        tune: impl FnOnce(&mut RuntimeConfig),
        api: ApiConfig,
        wrap: impl FnOnce(Arc<dyn FunctionStore>) -> Arc<dyn FunctionStore>,
    ) -> EnforcedApp {
        Self::build(tune, move |_, settings| *settings = api, wrap)
    }

    /// `RuntimeConfig::for_tests` and `ApiConfig::default()` over the given function and tenant
    /// stores (e.g. a shared store), marked ready.
    pub fn over_stores(
        functions: Arc<dyn FunctionStore>,
        tenants: Arc<dyn TenantStore>,
    ) -> EnforcedApp {
        Self::build_over(|_| {}, |_, _| {}, move |_| (functions, tenants))
    }

    fn build(
        tune: impl FnOnce(&mut RuntimeConfig),
        tune_api: impl FnOnce(&std::path::Path, &mut ApiConfig),
        wrap: impl FnOnce(Arc<dyn FunctionStore>) -> Arc<dyn FunctionStore>,
    ) -> EnforcedApp {
        Self::build_over(tune, tune_api, |dir| {
            let fs: Arc<dyn FunctionStore> =
                Arc::new(FsFunctionStore::open(dir).expect("function store"));
            let tenants: Arc<dyn TenantStore> =
                Arc::new(FsTenantStore::open(dir).expect("tenant store"));
            (wrap(fs), tenants)
        })
    }

    fn build_over(
        tune: impl FnOnce(&mut RuntimeConfig),
        tune_api: impl FnOnce(&std::path::Path, &mut ApiConfig),
        stores: impl FnOnce(&std::path::Path) -> (Arc<dyn FunctionStore>, Arc<dyn TenantStore>),
    ) -> EnforcedApp {
        let dir = tempfile::tempdir().expect("temporary directory");
        let mut api = ApiConfig::default();
        tune_api(dir.path(), &mut api);
        let registry = prometheus::Registry::new();
        let mut config = RuntimeConfig::for_tests(dir.path());
        tune(&mut config);
        let (functions, tenant_store) = stores(&config.data_dir);
        let metrics = RuntimeMetrics::register(&registry).expect("runtime metrics");
        let runtime = Runtime::open(config, functions, metrics).expect("runtime starts");
        let tenants = Arc::new(
            TenantRegistry::open(
                tenant_store,
                TenantMetrics::register(&registry).expect("tenant metrics"),
            )
            .expect("tenant registry"),
        );
        let boot = tenants
            .bootstrap()
            .expect("bootstrap")
            .expect("fresh store");
        let state = AppState::new(
            runtime.clone(),
            registry,
            api,
            tenants.clone(),
            AuthMode::Enforced,
        )
        .expect("app state");
        state.set_ready(true);
        EnforcedApp {
            app: router(state),
            tenants,
            runtime,
            admin: boot.admin_token,
            dir,
        }
    }

    /// Sends `body` with content type `ctype` and an optional
    /// `authorization` header value.
    pub async fn send(
        &self,
        method: Method,
        uri: &str,
        auth: Option<&str>,
        ctype: &str,
        body: Vec<u8>,
    ) -> Reply {
        let mut req = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::CONTENT_TYPE, ctype);
        if let Some(auth) = auth {
            req = req.header(header::AUTHORIZATION, auth);
        }
        Reply::of(&self.app, req.body(Body::from(body)).expect("request")).await
    }

    /// Sends `body` as JSON (none when `Null`) with `token` as bearer.
    pub async fn as_token(&self, token: &str, method: Method, uri: &str, body: Value) -> Reply {
        let auth = format!("Bearer {token}");
        let bytes = if body.is_null() {
            vec![]
        } else {
            body.to_string().into_bytes()
        };
        self.send(method, uri, Some(&auth), "application/json", bytes)
            .await
    }

    /// Creates a tenant through the admin API; returns (id, token).
    pub async fn tenant(&self, name: &str, quotas: Value) -> (String, String) {
        let r = self
            .as_token(
                &self.admin,
                Method::POST,
                "/tenants",
                json!({"name": name, "quotas": quotas}),
            )
            .await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        let v = r.json();
        (
            v["tenant"]["id"].as_str().expect("an id").to_owned(),
            v["token"].as_str().expect("a token").to_owned(),
        )
    }

    /// Deploys `examples/<file>` as `token`'s tenant with the query `query`.
    pub async fn deploy(&self, token: &str, file: &str, query: &str) -> Reply {
        let auth = format!("Bearer {token}");
        self.send(
            Method::POST,
            &format!("/functions?{query}"),
            Some(&auth),
            "application/wasm",
            example(file),
        )
        .await
    }

    /// Like [`EnforcedApp::deploy`], asserting 201; returns the function's id.
    pub async fn deploy_id(&self, token: &str, file: &str, query: &str) -> String {
        let r = self.deploy(token, file, query).await;
        assert_eq!(r.status, StatusCode::CREATED, "{}", r.text());
        r.json()["id"].as_str().expect("an id").to_owned()
    }

    /// Calls `export` of function `id` with `args` as `token`'s tenant.
    pub async fn invoke(&self, token: &str, id: &str, export: &str, args: Value) -> Reply {
        self.as_token(
            token,
            Method::POST,
            &format!("/functions/{id}/invoke"),
            json!({"export": export, "args": args}),
        )
        .await
    }
}

impl Default for EnforcedApp {
    fn default() -> Self {
        Self::new()
    }
}
