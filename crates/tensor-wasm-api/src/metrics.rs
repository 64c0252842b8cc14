//! HTTP metrics: requests by route, method and status, and their durations.

use std::time::Instant;

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus::{exponential_buckets, HistogramOpts, HistogramVec, IntCounterVec, Opts, Registry};

use crate::{auth, request_id, AppState};

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

/// The one middleware around every route: request id (kept or generated,
/// echoed), authentication (every route but `/healthz` and `/readyz`),
/// metrics and the request log line. The route label is the matched
/// route template (`/functions/{id}`), never the raw path, so cardinality is
/// bounded. Server errors log at WARN with the request id; everything else at
/// DEBUG.
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
    let route = req.extensions().get::<MatchedPath>().cloned();
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    let method = req.method().clone();
    // Every matched route but the health probes needs a caller.
    let public = matches!(route, "/healthz" | "/readyz" | "unmatched");
    let caller = if public {
        Ok(())
    } else {
        auth::caller_of(&state, &req).map(|caller| {
            req.extensions_mut().insert(caller);
        })
    };
    let mut response = match caller {
        Ok(()) => next.run(req).await,
        Err(why) => auth::unauthorized(why),
    };
    let elapsed = start.elapsed();
    let status = response.status();
    let metrics = &state.inner.http;
    metrics
        .requests
        .with_label_values(&[route, method.as_str(), status.as_str()])
        .inc();
    metrics
        .duration
        .with_label_values(&[route, method.as_str()])
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
