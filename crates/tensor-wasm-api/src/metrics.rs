//! HTTP metrics: requests by route, method and status, and their durations.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{exponential_buckets, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use crate::AppState;

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

/// Middleware recording every request. The route label is the matched route
/// template (`/functions/{id}`), never the raw path, so cardinality is bounded.
pub(crate) async fn track(State(state): State<AppState>, req: Request, next: Next) -> Response {
    let start = Instant::now();
    let route = req
        .extensions()
        .get::<MatchedPath>()
        .map(|p| p.as_str().to_owned())
        .unwrap_or_else(|| "unmatched".to_owned());
    let method = req.method().clone();
    let response = next.run(req).await;
    let metrics = &state.inner.http;
    metrics
        .requests
        .with_label_values(&[route.as_str(), method.as_str(), response.status().as_str()])
        .inc();
    metrics
        .duration
        .with_label_values(&[route.as_str(), method.as_str()])
        .observe(start.elapsed().as_secs_f64());
    response
}
