//! Metrics of the shared store: how long its calls take and how often they fail, and how far
//! behind the change log a replica's caches are.

use prometheus::Registry;
use prometheus::{
    exponential_buckets, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, IntGaugeVec, Opts,
};

/// The shared store's metrics (cheap to clone).
#[derive(Clone, Debug)]
pub struct SharedMetrics {
    latency: HistogramVec,
    errors: IntCounterVec,
    lag: HistogramVec,
    replicas: IntGauge,
    connections: IntGaugeVec,
}

impl SharedMetrics {
    /// Creates the metrics and registers them in `registry`.
    ///
    /// # Errors
    /// When a metric of the same name is registered already.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let buckets = exponential_buckets(1e-4, 2.0, 18)?; // 100 µs .. ~13 s
        let latency = HistogramVec::new(
            HistogramOpts::new(
                "tensor_wasm_shared_store_seconds",
                "Duration of shared-store calls, by store (database, objects).",
            )
            .buckets(buckets.clone()),
            &["store"],
        )?;
        let errors = IntCounterVec::new(
            Opts::new(
                "tensor_wasm_shared_store_errors_total",
                "Failed shared-store calls, by store (database, objects) and kind (unavailable: \
                 not reached; failed: the store answered with an error).",
            ),
            &["store", "kind"],
        )?;
        let lag = HistogramVec::new(
            HistogramOpts::new(
                "tensor_wasm_invalidation_lag_seconds",
                "Time from a change's commit in the shared store to this replica applying it \
                 (the change log follower), by the database's clock, by kind of change \
                 (function, model, tenant, admin; other for a kind this build does not know).",
            )
            .buckets(buckets),
            &["kind"],
        )?;
        let replicas = IntGauge::new(
            "tensor_wasm_live_replicas",
            "Replicas with a recent heartbeat in the shared store, this one included, as this \
             replica last counted them: each enforces 1/n of every tenant's rate and \
             concurrency limits.",
        )?;
        let connections = IntGaugeVec::new(
            Opts::new(
                "tensor_wasm_shared_store_connections",
                "PostgreSQL connections of this replica's pool after its latest call, by state \
                 (in_use, idle); at most --db-max-connections in all.",
            ),
            &["state"],
        )?;
        registry.register(Box::new(connections.clone()))?;
        registry.register(Box::new(replicas.clone()))?;
        registry.register(Box::new(latency.clone()))?;
        registry.register(Box::new(errors.clone()))?;
        registry.register(Box::new(lag.clone()))?;
        Ok(Self {
            latency,
            errors,
            lag,
            replicas,
            connections,
        })
    }

    pub(crate) fn set_live_replicas(&self, live: u64) {
        self.replicas.set(i64::try_from(live).unwrap_or(i64::MAX));
    }

    pub(crate) fn observe<T>(
        &self,
        store: &str,
        seconds: f64,
        result: &Result<T, crate::SharedStoreError>,
    ) {
        self.latency.with_label_values(&[store]).observe(seconds);
        if let Err(e) = result {
            let kind = if e.is_unavailable() {
                "unavailable"
            } else {
                "failed"
            };
            self.errors.with_label_values(&[store, kind]).inc();
        }
    }

    pub(crate) fn set_connections(&self, (in_use, idle): (usize, usize)) {
        let set = |state: &str, n: usize| {
            self.connections
                .with_label_values(&[state])
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set("in_use", in_use);
        set("idle", idle);
    }

    pub(crate) fn observe_lag(&self, kind: &str, seconds: f64) {
        let kind = match kind {
            "function" | "model" | "tenant" | "admin" => kind,
            _ => "other",
        };
        self.lag
            .with_label_values(&[kind])
            .observe(seconds.max(0.0));
    }
}

/// The trace span of one shared-store call (`store` is `database` or
/// `objects`, `what` the table or object key): a child of the caller's span
/// (an invocation's, a request's). Disabled when traces are off.
pub(crate) fn store_span(store: &str, what: &str) -> tracing::Span {
    tensor_wasm_telemetry::span!(
        "shared store",
        otel.name = %format_args!("shared {store}"),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        db.system.name = if store == "database" { "postgresql" } else { "s3" },
        db.collection.name = what,
    )
}

/// Marks a shared-store call's span failed when it was.
pub(crate) fn store_span_done(span: &tracing::Span, failed: bool) {
    if failed && !span.is_disabled() {
        span.record("otel.status_code", "ERROR");
    }
}
