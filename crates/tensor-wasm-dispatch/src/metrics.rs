//! Dispatcher metrics: in flight, queued, rejected, launch-to-completion latency.

use prometheus::{exponential_buckets, Histogram, HistogramOpts, IntCounter, IntGauge, Registry};

/// Handles to the dispatcher's metrics.
#[derive(Clone, Debug)]
pub struct DispatchMetrics {
    pub in_flight: IntGauge,
    pub queued: IntGauge,
    pub rejected: IntCounter,
    pub latency: Histogram,
}

impl DispatchMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let m = DispatchMetrics {
            in_flight: IntGauge::new(
                "tensor_wasm_dispatch_in_flight",
                "Kernels admitted by the dispatcher and not yet complete.",
            )?,
            queued: IntGauge::new(
                "tensor_wasm_dispatch_queued",
                "Launches waiting for a dispatch permit.",
            )?,
            rejected: IntCounter::new(
                "tensor_wasm_dispatch_rejected_total",
                "Launches refused because the dispatcher and its queue were full.",
            )?,
            latency: Histogram::with_opts(
                HistogramOpts::new(
                    "tensor_wasm_dispatch_latency_seconds",
                    "Launch-to-completion time of admitted kernels.",
                )
                .buckets(exponential_buckets(1e-6, 2.0, 26)?),
            )?,
        };
        registry.register(Box::new(m.in_flight.clone()))?;
        registry.register(Box::new(m.queued.clone()))?;
        registry.register(Box::new(m.rejected.clone()))?;
        registry.register(Box::new(m.latency.clone()))?;
        Ok(m)
    }
}
