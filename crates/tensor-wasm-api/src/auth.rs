//! Authentication: who is calling, decided by a route layer on every
//! protected route.
//!
//! Every route except `/healthz` and `/readyz` needs `Authorization: Bearer
//! <token>`. A tenant token acts as that tenant on the function routes; the
//! admin token manages tenants and reads `/metrics` (as does the metrics
//! token, when one is configured, on `/metrics` only). With
//! `--insecure-no-auth` (loopback only) every request acts as the default
//! tenant and as admin.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::extract::Request;
use axum::http::{header, HeaderValue};
use axum::response::{IntoResponse, Response};
use tensor_wasm_tenant::{constant_time_eq, Principal, Tenant};
use tower::{Layer, Service};

use crate::error::quota_error;
use crate::{ApiError, AppState, ErrorCode};

/// How requests are authenticated.
#[derive(Clone)]
pub enum AuthMode {
    /// Bearer tokens checked against the tenant registry.
    Enforced,
    /// No checks: every request is the given (default) tenant, and admin.
    Insecure(Arc<Tenant>),
}

/// Who is calling, put in the request extensions by the authentication route
/// layer (see [`router`](crate::router)).
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
                ErrorCode::Forbidden,
                "the admin token manages tenants; use a tenant token for functions",
            )),
        }
    }

    /// Ok for the admin (and insecure mode), 403 for tenants.
    pub(crate) fn require_admin(&self) -> Result<(), ApiError> {
        match self {
            Caller::Admin | Caller::Insecure(_) => Ok(()),
            Caller::Tenant(_) => Err(ApiError::new(
                ErrorCode::Forbidden,
                "this route needs the admin token",
            )),
        }
    }
}

/// `401 unauthorized` with `WWW-Authenticate: Bearer`.
fn unauthorized(message: &str) -> Response {
    let mut response = ApiError::new(ErrorCode::Unauthorized, message).into_response();
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
/// see [`unauthorized`]). `route_token` is a token that acts as admin on this
/// route only (the metrics token on `/metrics`).
fn caller_of(
    state: &AppState,
    req: &Request,
    route_token: Option<&str>,
) -> Result<Caller, &'static str> {
    let token = match &state.inner.auth {
        AuthMode::Insecure(default) => return Ok(Caller::Insecure(default.clone())),
        AuthMode::Enforced => match bearer(req) {
            Err(message) => return Err(message),
            Ok(None) => return Err("missing `Authorization: Bearer <token>`"),
            Ok(Some(token)) => token,
        },
    };
    if route_token.is_some_and(|m| constant_time_eq(m.as_bytes(), token.as_bytes())) {
        return Ok(Caller::Admin);
    }
    match state.inner.tenants.authenticate(token) {
        Some(Principal::Admin) => Ok(Caller::Admin),
        Some(Principal::Tenant(t)) => Ok(Caller::Tenant(t)),
        None => Err("unknown or revoked token"),
    }
}

/// The route layer of the protected routes (their `405` answers included):
/// a tenant or the admin token, else `401`; with [`Authenticate::metrics_reader`],
/// the layer of `/metrics`, where the metrics token (when one is configured)
/// acts as admin. Handlers take the [`Caller`] as `Extension<Caller>`.
///
/// A tower service rather than a `from_fn` middleware: it calls the route
/// without cloning it, and a refusal is answered without boxing anything.
#[derive(Clone)]
pub(crate) struct Authenticate {
    state: AppState,
    metrics_reader: bool,
}

impl Authenticate {
    /// The layer of every protected route.
    pub(crate) fn protected(state: AppState) -> Self {
        Authenticate {
            state,
            metrics_reader: false,
        }
    }

    /// The layer of `/metrics`.
    pub(crate) fn metrics_reader(state: AppState) -> Self {
        Authenticate {
            state,
            metrics_reader: true,
        }
    }
}

impl<S> Layer<S> for Authenticate {
    type Service = Authenticated<S>;

    fn layer(&self, inner: S) -> Authenticated<S> {
        Authenticated {
            inner,
            layer: self.clone(),
        }
    }
}

/// A route behind [`Authenticate`].
#[derive(Clone)]
pub(crate) struct Authenticated<S> {
    inner: S,
    layer: Authenticate,
}

impl<S> Service<Request> for Authenticated<S>
where
    S: Service<Request, Response = Response, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = Infallible;
    type Future = Admitted<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    /// Puts the caller in the request extensions and runs the route, or
    /// answers `401` without running it. A tenant's request counts against
    /// its rate here (`429` without running the route), before any handler
    /// reads the body.
    fn call(&mut self, mut req: Request) -> Self::Future {
        let route_token = if self.layer.metrics_reader {
            self.layer.state.inner.metrics_token.as_deref()
        } else {
            None
        };
        match admit(&self.layer.state, &req, route_token) {
            Ok(caller) => {
                req.extensions_mut().insert(caller);
                Admitted::Running(self.inner.call(req))
            }
            Err(refusal) => Admitted::Refused(Some(*refusal)),
        }
    }
}

/// The caller of a protected route, or the refusal to answer: `401` without
/// a usable token, `429` when a tenant is over its rate (counted here, before
/// any handler reads the body).
pub(crate) fn admit(
    state: &AppState,
    req: &Request,
    route_token: Option<&str>,
) -> Result<Caller, Box<Response>> {
    let caller = caller_of(state, req, route_token).map_err(|why| Box::new(unauthorized(why)))?;
    if let Caller::Tenant(tenant) | Caller::Insecure(tenant) = &caller {
        if let Err(e) = tenant.check_rate() {
            return Err(Box::new(quota_error(tenant, e).into_response()));
        }
    }
    Ok(caller)
}

/// The answer of an [`Authenticated`] route.
pub(crate) enum Admitted<F> {
    Running(F),
    Refused(Option<Response>),
}

impl<F> Future for Admitted<F>
where
    F: Future<Output = Result<Response, Infallible>> + Unpin,
{
    type Output = Result<Response, Infallible>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.get_mut() {
            Admitted::Running(answer) => Pin::new(answer).poll(cx),
            Admitted::Refused(response) => {
                Poll::Ready(Ok(response.take().expect("polled after completion")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::body::Body;
    use axum::http::{Method, StatusCode};
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
        state: AppState,
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
            app: router(state.clone()),
            state,
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
                .replace("{snapshot_id}", "z")
                .replace("{name}", "n")
                .replace("{path}", "p/q");
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

    /// One request's answer, less the request id (which differs per request).
    async fn answer<S>(app: S, req: Request<Body>) -> (StatusCode, Vec<(String, String)>, String)
    where
        S: Service<Request<Body>, Response = Response, Error = Infallible>,
    {
        use http_body_util::BodyExt;
        let response = app.oneshot(req).await.unwrap();
        let status = response.status();
        let mut headers: Vec<(String, String)> = response
            .headers()
            .iter()
            .filter(|(name, _)| name.as_str() != "x-request-id")
            .map(|(n, v)| (n.to_string(), v.to_str().unwrap_or("?").to_owned()))
            .collect();
        headers.sort();
        let body = response.into_body().collect().await.unwrap().to_bytes();
        (status, headers, String::from_utf8_lossy(&body).into_owned())
    }

    /// `App`'s direct path to `POST /functions/{id}/invoke` answers every request as the
    /// router does: calls, refusals (no token, another tenant's function, an unknown or
    /// malformed id, a wrong method, bad JSON, a body over the limit), and the requests
    /// it leaves to the router; and it is counted under the route's template.
    #[tokio::test]
    async fn the_direct_invoke_path_answers_as_the_router_does() {
        let e = enforced();
        let direct = crate::App::new(e.state.clone());
        let deploy = |token: &str| {
            Request::post("/functions?name=add")
                .header(header::AUTHORIZATION, format!("Bearer {token}"))
                .header(header::CONTENT_TYPE, "application/wasm")
                .body(Body::from(
                    r#"(module (func (export "add") (param i32 i32) (result i32)
                        local.get 0 local.get 1 i32.add))"#,
                ))
                .unwrap()
        };
        let (status, _, body) = answer(e.app.clone(), deploy(&e.tenant)).await;
        assert_eq!(status, StatusCode::CREATED, "{body}");
        let id = serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
            .as_str()
            .unwrap()
            .to_owned();
        let invoke = format!("/functions/{id}/invoke");
        let big = format!(
            r#"{{"export":"add","args":[1,2],"pad":"{}"}}"#,
            "x".repeat(3 << 20)
        );
        let case = |method: Method, uri: &str, token: Option<&str>, body: &str| {
            (
                method,
                uri.to_owned(),
                token.map(str::to_owned),
                body.to_owned(),
            )
        };
        let cases = [
            case(
                Method::POST,
                &invoke,
                Some(&e.tenant),
                r#"{"export":"add","args":[40,2]}"#,
            ),
            case(
                Method::POST,
                &invoke,
                Some(&e.tenant),
                r#"{"export":"add","args":[1.0,2]}"#,
            ),
            case(
                Method::POST,
                &format!("{invoke}?x=1"),
                Some(&e.tenant),
                r#"{"export":"add","args":[1,2]}"#,
            ),
            case(
                Method::POST,
                &invoke,
                None,
                r#"{"export":"add","args":[1,2]}"#,
            ),
            case(Method::POST, &invoke, Some("not-a-token"), "{}"),
            case(
                Method::POST,
                &invoke,
                Some(&e.admin),
                r#"{"export":"add","args":[1,2]}"#,
            ),
            case(
                Method::POST,
                &invoke,
                Some(&e.tenant),
                r#"{"export":"nope","args":[]}"#,
            ),
            case(
                Method::POST,
                &invoke,
                Some(&e.tenant),
                r#"{"export":"add","args":[1]}"#,
            ),
            case(Method::POST, &invoke, Some(&e.tenant), "[1, 2]"),
            case(Method::POST, &invoke, Some(&e.tenant), "{"),
            case(Method::POST, &invoke, Some(&e.tenant), &big),
            case(Method::GET, &invoke, Some(&e.tenant), ""),
            case(Method::POST, &format!("{invoke}/"), Some(&e.tenant), "{}"),
            case(
                Method::POST,
                "/functions/fn-000000000000000000000000/invoke",
                Some(&e.tenant),
                "{}",
            ),
            case(
                Method::POST,
                "/functions/fn-XYZ/invoke",
                Some(&e.tenant),
                "{}",
            ),
            case(Method::POST, "/functions/a/b/invoke", Some(&e.tenant), "{}"),
        ];
        for (method, uri, token, body) in cases {
            let request = || {
                let mut req = Request::builder()
                    .method(method.clone())
                    .uri(&uri)
                    .header(header::CONTENT_TYPE, "application/json");
                if let Some(token) = &token {
                    req = req.header(header::AUTHORIZATION, format!("Bearer {token}"));
                }
                req.body(Body::from(body.clone())).unwrap()
            };
            let routed = answer(e.app.clone(), request()).await;
            let direct = answer(direct.clone(), request()).await;
            assert_eq!(routed, direct, "{method} {uri}");
        }
        let metrics = answer(
            e.app.clone(),
            Request::get("/metrics")
                .header(header::AUTHORIZATION, format!("Bearer {}", e.admin))
                .body(Body::empty())
                .unwrap(),
        )
        .await
        .2;
        // Both paths counted each call of the cases answered 200 (3 each).
        assert!(
            metrics.contains(
                r#"tensor_wasm_http_requests_total{method="POST",route="/functions/{id}/invoke",status="200"} 6"#
            ),
            "{metrics}"
        );
    }
}
