//! HTTP metrics: requests by route, method and status, and their durations.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{exponential_buckets, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use crate::{request_id, AppState};

/// Handles to the HTTP metrics.
#[derive(Clone, Debug)]
pub struct HttpMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
}

impl HttpMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let requests = IntCounterVec::new(
            Opts::new(
                "tensor_wasm_http_requests_total",
                "HTTP requests by route template, method and status.",
            ),
            &["route", "method", "status"],
        )?;
        let duration = HistogramVec::new(
            HistogramOpts::new(
                "tensor_wasm_http_request_duration_seconds",
                "Time from request to response headers, by route template and method.",
            )
            .buckets(exponential_buckets(1e-5, 2.0, 22)?),
            &["route", "method"],
        )?;
        registry.register(Box::new(requests.clone()))?;
        registry.register(Box::new(duration.clone()))?;
        Ok(HttpMetrics { requests, duration })
    }
}

/// Every route template the router serves, in router order: with `unmatched`, the only
/// values the `route` label takes.
pub const ROUTE_TEMPLATES: &[&str] = &[
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/functions",
    "/functions/{id}",
    "/functions/{id}/snapshots",
    "/functions/{id}/snapshots/{snapshot_id}",
    "/functions/{id}/invoke",
    "/functions/{id}/invoke-stream",
    "/functions/{id}/invoke-async",
    "/functions/{id}/http/{path}",
    "/functions/by-name/{name}/http/{path}",
    "/jobs/{id}",
    "/tenants",
    "/tenants/{id}",
    "/tenants/{id}/tokens",
    "/tenants/{id}/tokens/{token_id}",
];

static ROUTES: std::sync::LazyLock<std::collections::HashSet<&'static str>> =
    std::sync::LazyLock::new(|| ROUTE_TEMPLATES.iter().copied().collect());

/// The documented template of an HTTP handler's routes (the router has three for each: the
/// bare prefix, with a trailing slash, and with `{*path}`); any other route as it is.
fn http_handler_template(route: &str) -> &str {
    for template in [
        "/functions/{id}/http/{path}",
        "/functions/by-name/{name}/http/{path}",
    ] {
        let prefix = &template[..template.len() - "/{path}".len()];
        if route
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.is_empty() || rest == "/" || rest == "/{*path}")
        {
            return template;
        }
    }
    route
}

/// Label values of one HTTP request, each from a fixed allow-list, so that no client can
/// create label values (and so series) at will: a route outside [`ROUTE_TEMPLATES`] or an
/// unknown method (HTTP allows any token) would otherwise become a new series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpRequestLabels {
    /// A route template, or `unmatched`.
    pub route: &'static str,
    /// A standard method name, or `other`.
    pub method: &'static str,
}

impl HttpRequestLabels {
    /// Labels for a matched route template; `None` when `route` is not one the router
    /// serves.
    pub fn try_new(route: &str, method: &axum::http::Method) -> Option<Self> {
        let route = ROUTES.get(http_handler_template(route)).copied()?;
        Some(HttpRequestLabels {
            route,
            method: method_label(method),
        })
    }

    /// Labels of a request: [`HttpRequestLabels::try_new`], or `unmatched`.
    pub fn of(route: Option<&str>, method: &axum::http::Method) -> Self {
        route
            .and_then(|r| Self::try_new(r, method))
            .unwrap_or(HttpRequestLabels {
                route: "unmatched",
                method: method_label(method),
            })
    }
}

fn method_label(method: &axum::http::Method) -> &'static str {
    use axum::http::Method;
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::PATCH => "PATCH",
        Method::DELETE => "DELETE",
        Method::HEAD => "HEAD",
        Method::OPTIONS => "OPTIONS",
        _ => "other",
    }
}

/// The middleware around every route: request id (kept or generated,
/// echoed), metrics and the request log line. Authentication is a route
/// layer inside it (see [`crate::router`]), so refused requests are counted
/// and logged too. The route label is the matched route template
/// (`/functions/{id}`), never the raw path, so cardinality is bounded. Server
/// errors log at WARN with the request id; everything else at DEBUG.
pub(crate) async fn observe(
    State(state): State<AppState>,
    mut req: Request,
    next: Next,
) -> Response {
    let start = Instant::now();
    let id = match req.headers().get(request_id::HEADER) {
        Some(v) if request_id::acceptable(v) => v.clone(),
        _ => {
            let v = state.inner.request_ids.next();
            req.headers_mut().insert(request_id::HEADER, v.clone());
            v
        }
    };
    let labels = HttpRequestLabels::of(
        req.extensions()
            .get::<MatchedPath>()
            .map(MatchedPath::as_str),
        req.method(),
    );
    let route = labels.route;
    let method = req.method().clone();
    let mut response = next.run(req).await;
    let elapsed = start.elapsed();
    let status = response.status();
    let metrics = &state.inner.http;
    metrics
        .requests
        .with_label_values(&[route, labels.method, status.as_str()])
        .inc();
    metrics
        .duration
        .with_label_values(&[route, labels.method])
        .observe(elapsed.as_secs_f64());
    let id_text = id.to_str().unwrap_or("-");
    if status.is_server_error() {
        tracing::warn!(request_id = id_text, %method, route, status = status.as_u16(), ?elapsed, "request failed");
    } else {
        tracing::debug!(request_id = id_text, %method, route, status = status.as_u16(), ?elapsed, "request");
    }
    response.headers_mut().insert(request_id::HEADER, id);
    response
}
