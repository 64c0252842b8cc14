//! OpenTelemetry traces of TensorWasm.
//!
//! Spans are ordinary [`tracing`] spans under the target [`TARGET`]; when
//! traces are configured ([`Settings::from_env`]) a `tracing-opentelemetry`
//! layer turns them into OpenTelemetry spans and the export queue (`export.rs`) sends
//! them over OTLP. When they are not, no such span is made at all: every
//! place that would make one asks [`enabled`] first (one relaxed load), so
//! the request path is what it was without telemetry.
//!
//! Context crosses process boundaries as W3C trace context: taken from an
//! incoming request's `traceparent`/`tracestate` ([`adopt_remote_parent`]),
//! put on outgoing HTTP requests ([`inject_current`]) and stored with an
//! async job ([`traceparent_of`], [`link_to`]).
//!
//! The span names and attributes are listed in `docs/observability.md`.

mod config;
mod context;
mod export;
pub mod labels;
mod logs;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing_subscriber::registry::LookupSpan;

pub use config::{Protocol, SamplerChoice, Settings, SettingsError};
pub use context::{
    adopt_remote_parent, inject_current, link_to, record_trace_id, set_attribute, trace_id_of,
    traceparent_of,
};
pub use export::ExportStats;
pub use logs::{TraceIdLayer, WithTraceIds};

/// The `tracing` target of every span meant for export.
pub const TARGET: &str = "tensor_wasm::trace";

static ENABLED: AtomicBool = AtomicBool::new(false);

/// Whether spans are exported: the one check before a span is made.
#[inline]
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A span for export: `tracing::info_span!` under [`TARGET`] when traces are
/// on, [`tracing::Span::none`] (nothing recorded, nothing allocated) when not.
#[macro_export]
macro_rules! span {
    ($name:expr $(, $($fields:tt)*)?) => {
        if $crate::enabled() {
            ::tracing::info_span!(target: "tensor_wasm::trace", $name $(, $($fields)*)?)
        } else {
            ::tracing::Span::none()
        }
    };
}

/// The exporting half of the telemetry: shut it down at exit so queued
/// spans are sent.
pub struct Telemetry {
    provider: SdkTracerProvider,
    stats: ExportStats,
}

impl Telemetry {
    /// Starts the export queue and its thread for `settings`, naming the
    /// service `tensor-wasm` unless `OTEL_SERVICE_NAME` or
    /// `OTEL_RESOURCE_ATTRIBUTES` say otherwise. Spans are made from the
    /// moment [`Telemetry::layer`] is part of the subscriber.
    pub fn start(settings: &Settings, version: &'static str) -> Result<Telemetry, String> {
        let mut resource = Resource::builder()
            .with_attribute(opentelemetry::KeyValue::new("service.version", version));
        if std::env::var_os("OTEL_SERVICE_NAME").is_none()
            && !std::env::var("OTEL_RESOURCE_ATTRIBUTES").is_ok_and(|a| a.contains("service.name"))
        {
            resource = resource.with_service_name("tensor-wasm");
        }
        let resource = resource.build();
        let stats = ExportStats::new();
        let protocol = settings.protocol;
        let processor = export::QueueProcessor::start(
            move || build_exporter(protocol),
            resource.clone(),
            settings.max_queue,
            settings.max_batch,
            settings.schedule_delay,
            stats.clone(),
        )?;
        let provider = SdkTracerProvider::builder()
            .with_resource(resource)
            .with_sampler(settings.sdk_sampler())
            .with_span_processor(processor)
            .build();
        Ok(Telemetry { provider, stats })
    }

    /// The `tracing` layer that makes OpenTelemetry spans of the spans
    /// under [`TARGET`]. Adding it turns [`enabled`] on.
    pub fn layer<S>(&self) -> impl tracing_subscriber::Layer<S>
    where
        S: tracing::Subscriber + for<'a> LookupSpan<'a>,
    {
        use tracing_subscriber::Layer as _;
        ENABLED.store(true, Ordering::Relaxed);
        tracing_opentelemetry::layer()
            .with_tracer(self.provider.tracer("tensor-wasm"))
            .with_location(false)
            .with_threads(false)
            // No busy/idle timing on every enter and exit (two clock reads and two
            // attributes a span), and no OpenTelemetry context made current there:
            // context is read from the span itself (`context.rs`).
            .with_tracked_inactivity(false)
            .with_context_activation(false)
            .with_target(false)
            .with_level(false)
            .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                meta.target() == TARGET
            }))
    }

    /// The export counters, for the server's `/metrics`.
    pub fn stats(&self) -> &ExportStats {
        &self.stats
    }

    /// Sends what is queued, waiting at most `timeout` (a collector that does
    /// not answer is left behind), and stops exporting.
    pub fn shutdown(self, timeout: Duration) {
        ENABLED.store(false, Ordering::Relaxed);
        let _ = self.provider.shutdown_with_timeout(timeout);
    }
}

/// The OTLP exporter for `protocol`; the endpoint, headers, timeout and
/// compression come from the standard `OTEL_EXPORTER_OTLP_*` variables.
fn build_exporter(protocol: Protocol) -> Result<Exporter, String> {
    match protocol {
        Protocol::HttpProtobuf => {
            use opentelemetry_otlp::WithExportConfig as _;
            opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
                .build()
                .map(Exporter::Http)
                .map_err(|e| format!("building the OTLP exporter: {e}"))
        }
        #[cfg(feature = "otlp-grpc")]
        Protocol::Grpc => grpc::OnRuntime::build().map(Exporter::Grpc),
        #[cfg(not(feature = "otlp-grpc"))]
        Protocol::Grpc => Err("OTLP over gRPC is not in this build".into()),
    }
}

/// The exporter of either protocol.
#[derive(Debug)]
enum Exporter {
    Http(opentelemetry_otlp::SpanExporter),
    #[cfg(feature = "otlp-grpc")]
    Grpc(grpc::OnRuntime),
}

impl opentelemetry_sdk::trace::SpanExporter for Exporter {
    async fn export(
        &self,
        batch: Vec<opentelemetry_sdk::trace::SpanData>,
    ) -> opentelemetry_sdk::error::OTelSdkResult {
        match self {
            Exporter::Http(e) => e.export(batch).await,
            #[cfg(feature = "otlp-grpc")]
            Exporter::Grpc(e) => e.export(batch).await,
        }
    }

    fn set_resource(&mut self, resource: &Resource) {
        match self {
            Exporter::Http(e) => e.set_resource(resource),
            #[cfg(feature = "otlp-grpc")]
            Exporter::Grpc(e) => e.set_resource(resource),
        }
    }
}

/// gRPC export: tonic needs a Tokio runtime, which the export thread keeps
/// for itself.
#[cfg(feature = "otlp-grpc")]
mod grpc {
    use opentelemetry_sdk::error::OTelSdkResult;
    use opentelemetry_sdk::trace::{SpanData, SpanExporter};

    #[derive(Debug)]
    pub(crate) struct OnRuntime {
        runtime: tokio::runtime::Runtime,
        inner: opentelemetry_otlp::SpanExporter,
    }

    impl OnRuntime {
        pub(crate) fn build() -> Result<Self, String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| format!("starting the gRPC exporter's runtime: {e}"))?;
            let inner = {
                let _entered = runtime.enter();
                opentelemetry_otlp::SpanExporter::builder()
                    .with_tonic()
                    .build()
                    .map_err(|e| format!("building the OTLP exporter: {e}"))?
            };
            Ok(OnRuntime { runtime, inner })
        }
    }

    impl SpanExporter for OnRuntime {
        async fn export(&self, batch: Vec<SpanData>) -> OTelSdkResult {
            self.runtime.block_on(self.inner.export(batch))
        }

        fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
            self.inner.set_resource(resource);
        }
    }
}
