//! What the standard `OTEL_*` environment variables ask for: whether traces
//! are exported at all, over which protocol, how they are sampled and how
//! the export queue is sized.

use std::time::Duration;

use opentelemetry_sdk::trace::{ParentBasedSampler, Sampler, ShouldSample};

/// Where spans go and how, read from the environment by [`Settings::from_env`].
#[derive(Debug, Clone)]
pub struct Settings {
    /// The OTLP protocol.
    pub protocol: Protocol,
    /// How a trace is chosen for export (`OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`).
    pub sampler: SamplerChoice,
    /// Whether a sampled flag in an incoming `traceparent` is followed. Off by
    /// default: a client (a tenant) must not decide what fraction of the
    /// traffic is traced. The trace id is kept either way, so a sampled
    /// request still joins the caller's trace.
    pub trust_remote_sampled: bool,
    /// Spans waiting for export at most (`OTEL_BSP_MAX_QUEUE_SIZE`, 2048);
    /// beyond it a finished span is dropped and counted.
    pub max_queue: usize,
    /// Spans per export request at most (`OTEL_BSP_MAX_EXPORT_BATCH_SIZE`, 512).
    pub max_batch: usize,
    /// How long a span may wait for a batch to fill (`OTEL_BSP_SCHEDULE_DELAY`, 5000 ms).
    pub schedule_delay: Duration,
}

/// The OTLP transport.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `http/protobuf`, the default.
    HttpProtobuf,
    /// `grpc`: only in a build with the `otlp-grpc` feature.
    Grpc,
}

/// The sampler named by `OTEL_TRACES_SAMPLER`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerChoice {
    /// Every trace (`always_on`, and the `parentbased_` form: the default).
    AlwaysOn,
    /// No trace (`always_off`).
    AlwaysOff,
    /// This fraction of trace ids (`traceidratio`, `parentbased_traceidratio`).
    Ratio(f64),
}

/// A setting that cannot be followed.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SettingsError(String);

impl Settings {
    /// The settings the environment gives, or `None` when traces are off:
    /// no OTLP endpoint is set (`OTEL_EXPORTER_OTLP_ENDPOINT`,
    /// `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) and `OTEL_TRACES_EXPORTER` is not
    /// `otlp`, or `OTEL_SDK_DISABLED=true`, or `OTEL_TRACES_EXPORTER=none`.
    pub fn from_env(trust_remote_sampled: bool) -> Result<Option<Settings>, SettingsError> {
        Self::from_lookup(|name| std::env::var(name).ok(), trust_remote_sampled)
    }

    /// [`Settings::from_env`] over any lookup (the tests' own environment).
    pub fn from_lookup(
        var: impl Fn(&str) -> Option<String>,
        trust_remote_sampled: bool,
    ) -> Result<Option<Settings>, SettingsError> {
        let var = |name: &str| var(name).filter(|v| !v.trim().is_empty());
        if var("OTEL_SDK_DISABLED").is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let exporter = var("OTEL_TRACES_EXPORTER");
        match exporter.as_deref().map(str::trim) {
            None => {
                let endpoint = var("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
                    .or_else(|| var("OTEL_EXPORTER_OTLP_ENDPOINT"));
                if endpoint.is_none() {
                    return Ok(None);
                }
            }
            Some("none") => return Ok(None),
            Some("otlp") => {}
            Some(other) => {
                return Err(SettingsError(format!(
                    "OTEL_TRACES_EXPORTER={other}: only `otlp` and `none` are supported"
                )))
            }
        }
        let protocol = match var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| var("OTEL_EXPORTER_OTLP_PROTOCOL"))
            .as_deref()
            .map(str::trim)
        {
            None | Some("http/protobuf") => Protocol::HttpProtobuf,
            Some("grpc") if cfg!(feature = "otlp-grpc") => Protocol::Grpc,
            Some("grpc") => {
                return Err(SettingsError(
                    "OTLP over gRPC is not in this build (build tensor-wasm-cli with the \
                     `otlp-grpc` feature); use http/protobuf"
                        .into(),
                ))
            }
            Some(other) => {
                return Err(SettingsError(format!(
                    "OTLP protocol `{other}` is not supported; use http/protobuf{}",
                    if cfg!(feature = "otlp-grpc") {
                        " or grpc"
                    } else {
                        ""
                    }
                )))
            }
        };
        let ratio = || -> Result<f64, SettingsError> {
            match var("OTEL_TRACES_SAMPLER_ARG") {
                None => Ok(1.0),
                Some(arg) => match arg.trim().parse::<f64>() {
                    Ok(r) if (0.0..=1.0).contains(&r) => Ok(r),
                    _ => Err(SettingsError(format!(
                        "OTEL_TRACES_SAMPLER_ARG={arg}: a ratio from 0 to 1"
                    ))),
                },
            }
        };
        let sampler = match var("OTEL_TRACES_SAMPLER").as_deref().map(str::trim) {
            None | Some("always_on") | Some("parentbased_always_on") => SamplerChoice::AlwaysOn,
            Some("always_off") | Some("parentbased_always_off") => SamplerChoice::AlwaysOff,
            Some("traceidratio") | Some("parentbased_traceidratio") => {
                SamplerChoice::Ratio(ratio()?)
            }
            Some(other) => {
                return Err(SettingsError(format!(
                    "OTEL_TRACES_SAMPLER={other}: one of always_on, always_off, traceidratio \
                     and their parentbased_ forms"
                )))
            }
        };
        let count = |name: &str, default: usize| -> Result<usize, SettingsError> {
            match var(name) {
                None => Ok(default),
                Some(v) => match v.trim().parse::<usize>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(SettingsError(format!(
                        "{name}={v}: a positive whole number"
                    ))),
                },
            }
        };
        let max_queue = count("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?;
        let max_batch = count("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.min(max_queue);
        let schedule_delay = Duration::from_millis(count("OTEL_BSP_SCHEDULE_DELAY", 5000)? as u64);
        Ok(Some(Settings {
            protocol,
            sampler,
            trust_remote_sampled,
            max_queue,
            max_batch,
            schedule_delay,
        }))
    }

    /// The SDK sampler: `sampler` for new traces and for remote parents
    /// unless [`Settings::trust_remote_sampled`]; a local parent's decision is
    /// always followed, so a trace is exported whole or not at all.
    pub(crate) fn sdk_sampler(&self) -> Box<dyn ShouldSample> {
        let root = || match self.sampler {
            SamplerChoice::AlwaysOn => Sampler::AlwaysOn,
            SamplerChoice::AlwaysOff => Sampler::AlwaysOff,
            SamplerChoice::Ratio(r) => Sampler::TraceIdRatioBased(r),
        };
        if self.trust_remote_sampled {
            Box::new(Sampler::ParentBased(Box::new(root())))
        } else {
            Box::new(
                ParentBasedSampler::new(root())
                    .with_remote_parent_sampled(root())
                    .with_remote_parent_not_sampled(root()),
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn settings(vars: &[(&str, &str)]) -> Result<Option<Settings>, SettingsError> {
        Settings::from_lookup(
            |name| {
                vars.iter()
                    .find(|(k, _)| *k == name)
                    .map(|(_, v)| v.to_string())
            },
            false,
        )
    }

    #[test]
    fn off_unless_an_endpoint_or_the_exporter_is_named() {
        assert!(settings(&[]).unwrap().is_none());
        assert!(settings(&[("OTEL_SERVICE_NAME", "x")]).unwrap().is_none());
        assert!(
            settings(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318")])
                .unwrap()
                .is_some()
        );
        assert!(settings(&[("OTEL_TRACES_EXPORTER", "otlp")])
            .unwrap()
            .is_some());
        assert!(settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_SDK_DISABLED", "true")
        ])
        .unwrap()
        .is_none());
        assert!(settings(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318"),
            ("OTEL_TRACES_EXPORTER", "none")
        ])
        .unwrap()
        .is_none());
    }

    #[test]
    fn bad_values_are_refused_by_name() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        for (k, v) in [
            ("OTEL_TRACES_EXPORTER", "zipkin"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "http/json"),
            ("OTEL_TRACES_SAMPLER", "sometimes"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "0"),
        ] {
            let err = settings(&[on, (k, v)]).unwrap_err().to_string();
            assert!(err.contains(v.split('/').next().unwrap()), "{err}");
        }
        let err = settings(&[
            on,
            ("OTEL_TRACES_SAMPLER", "traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "2"),
        ])
        .unwrap_err();
        assert!(err.to_string().contains("OTEL_TRACES_SAMPLER_ARG"));
    }

    #[test]
    fn defaults_and_sampler_forms() {
        let on = ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://c:4318");
        let s = settings(&[on]).unwrap().unwrap();
        assert_eq!(s.protocol, Protocol::HttpProtobuf);
        assert_eq!(s.sampler, SamplerChoice::AlwaysOn);
        assert_eq!((s.max_queue, s.max_batch), (2048, 512));
        assert_eq!(s.schedule_delay, Duration::from_secs(5));
        let s = settings(&[
            on,
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "8"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!(s.sampler, SamplerChoice::Ratio(0.25));
        assert_eq!((s.max_queue, s.max_batch), (8, 8));
    }
}
