//! Shared helpers of the tenant tests: a router with authentication
//! enforced over a fresh data dir, and request helpers.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Method, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tensor_wasm_api::{router, ApiConfig, AppState, AuthMode};
use tensor_wasm_runtime::{FsFunctionStore, Runtime, RuntimeConfig, RuntimeMetrics};
use tensor_wasm_tenant::{FsTenantStore, TenantMetrics, TenantRegistry};
use tower::ServiceExt;

pub struct Server {
    pub dir: tempfile::TempDir,
    pub app: Router,
    pub tenants: Arc<TenantRegistry>,
    pub runtime: Runtime,
    pub admin: String,
}

pub struct Reply {
    pub status: StatusCode,
    pub headers: axum::http::HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).unwrap_or(Value::Null)
    }
    pub fn code(&self) -> String {
        self.json()["error"]["code"]
            .as_str()
            .unwrap_or("<none>")
            .to_owned()
    }
}

pub fn example(name: &str) -> Vec<u8> {
    std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../examples")
            .join(name),
    )
    .unwrap()
}

pub fn server() -> Server {
    let dir = tempfile::tempdir().unwrap();
    let registry = prometheus::Registry::new();
    let store = Arc::new(FsFunctionStore::open(dir.path()).unwrap());
    let metrics = RuntimeMetrics::register(&registry).unwrap();
    let runtime = Runtime::open(RuntimeConfig::for_tests(dir.path()), store, metrics).unwrap();
    let tenants = Arc::new(
        TenantRegistry::open(
            Arc::new(FsTenantStore::open(dir.path()).unwrap()),
            TenantMetrics::register(&registry).unwrap(),
        )
        .unwrap(),
    );
    let boot = tenants.bootstrap().unwrap().expect("fresh store");
    let state = AppState::new(
        runtime.clone(),
        registry,
        ApiConfig::default(),
        tenants.clone(),
        AuthMode::Enforced,
    )
    .unwrap();
    state.set_ready(true);
    Server {
        dir,
        app: router(state),
        tenants,
        runtime,
        admin: boot.admin_token,
    }
}

impl Server {
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
        let response = self
            .app
            .clone()
            .oneshot(req.body(Body::from(body)).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let headers = response.headers().clone();
        let body = response
            .into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec();
        Reply {
            status,
            headers,
            body,
        }
    }

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
        assert_eq!(
            r.status,
            StatusCode::CREATED,
            "{}",
            String::from_utf8_lossy(&r.body)
        );
        let v = r.json();
        (
            v["tenant"]["id"].as_str().unwrap().to_owned(),
            v["token"].as_str().unwrap().to_owned(),
        )
    }

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
