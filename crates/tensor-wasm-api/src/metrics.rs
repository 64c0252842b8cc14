//! HTTP metrics: requests by route, method and status, and their durations.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use axum::http::StatusCode;
use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts,
    Registry,
};

/// The method labels [`method_label`] gives, in the order of [`HttpMetrics`]' cache.
const METHOD_LABELS: [&str; 8] = [
    "GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS", "other",
];

/// Handles to the HTTP metrics.
#[derive(Clone, Debug)]
pub struct HttpMetrics {
    requests: IntCounterVec,
    duration: HistogramVec,
    /// The series of each (route, method), resolved at their first request:
    /// index `route * METHOD_LABELS.len() + method`, the route being an index
    /// into [`ROUTE_TEMPLATES`] or its length for `unmatched`.
    series: Arc<[OnceLock<Series>]>,
}

/// The series of one route and method: its duration histogram and its
/// request counter by status (100-599), each resolved at first use.
#[derive(Debug)]
pub(crate) struct Series {
    route: &'static str,
    method: &'static str,
    duration: Histogram,
    requests: IntCounterVec,
    by_status: Box<[OnceLock<IntCounter>]>,
}

impl Series {
    /// Counts one request answered `status` after `elapsed`.
    pub(crate) fn observe(&self, status: StatusCode, elapsed: Duration) {
        self.duration.observe(elapsed.as_secs_f64());
        let counter = usize::from(status.as_u16())
            .checked_sub(100)
            .and_then(|i| self.by_status.get(i));
        match counter {
            Some(slot) => slot.get_or_init(|| self.counter(status)).inc(),
            // `StatusCode` is 100-999; beyond 599 is never sent, but is counted all the same.
            None => self.counter(status).inc(),
        }
    }

    fn counter(&self, status: StatusCode) -> IntCounter {
        self.requests
            .with_label_values(&[self.route, self.method, status.as_str()])
    }
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
        let series = (0..(ROUTE_TEMPLATES.len() + 1) * METHOD_LABELS.len())
            .map(|_| OnceLock::new())
            .collect();
        Ok(HttpMetrics {
            requests,
            duration,
            series,
        })
    }

    /// The series of requests labelled `labels`.
    pub(crate) fn series(&self, labels: HttpRequestLabels) -> &Series {
        let route = ROUTE_TEMPLATES
            .iter()
            .position(|t| std::ptr::eq(*t, labels.route) || *t == labels.route)
            .unwrap_or(ROUTE_TEMPLATES.len());
        let method = METHOD_LABELS
            .iter()
            .position(|m| *m == labels.method)
            .unwrap_or(METHOD_LABELS.len() - 1);
        self.series[route * METHOD_LABELS.len() + method].get_or_init(|| {
            let route = ROUTE_TEMPLATES.get(route).copied().unwrap_or("unmatched");
            let method = METHOD_LABELS[method];
            Series {
                route,
                method,
                duration: self.duration.with_label_values(&[route, method]),
                requests: self.requests.clone(),
                by_status: (100..600).map(|_| OnceLock::new()).collect(),
            }
        })
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
    "/models",
    "/models/{name}",
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
