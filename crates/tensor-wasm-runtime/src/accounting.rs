//! Per-tenant, per-function GPU accounting: kernel time, bytes moved and
//! device memory held (`docs/observability.md`).
//!
//! Kernel time is what each backend can say of it, labelled by `timing`:
//! `cpu_worker` on the CPU backend (the wall time of worker threads on the
//! launch's slices, summed over threads: two workers for one second are two
//! seconds); on CUDA `cuda_event` (device time between timing events
//! recorded around the kernel, with `--cuda-timing-events`) or else
//! `launch_to_completion` (from the launch to its completion event, queueing
//! on the device included). Tenant and function labels are bounded
//! ([`tensor_wasm_telemetry::labels`]): past the limits they read `other`.

use std::time::Duration;

use prometheus::{CounterVec, IntCounterVec, IntGauge, IntGaugeVec, Opts, Registry};

/// The accounting metric families.
#[derive(Clone, Debug)]
pub(crate) struct Accounts {
    kernel_seconds: CounterVec,
    bytes_moved: IntCounterVec,
    device_memory: IntGaugeVec,
}

/// Where bytes went.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Moved {
    /// The buffers a kernel launch was given (what it may read or write).
    KernelArgs,
    /// Copied by the host into device-visible memory (a component's `buffer.write`).
    ToDevice,
    /// Copied by the host out of it (`buffer.read`).
    FromDevice,
}

impl Moved {
    fn label(self) -> &'static str {
        match self {
            Moved::KernelArgs => "kernel_args",
            Moved::ToDevice => "host_to_device",
            Moved::FromDevice => "device_to_host",
        }
    }
}

impl Accounts {
    pub(crate) fn new() -> prometheus::Result<Self> {
        Ok(Accounts {
            kernel_seconds: CounterVec::new(
                Opts::new(
                    "tensor_wasm_tenant_kernel_seconds_total",
                    "Kernel time by tenant, function and backend, past deadlines too; `timing` \
                     says what was measured: cpu_worker (worker threads' time, summed), \
                     cuda_event (device time between timing events) or launch_to_completion.",
                ),
                &["tenant", "function", "backend", "timing"],
            )?,
            bytes_moved: IntCounterVec::new(
                Opts::new(
                    "tensor_wasm_tenant_bytes_moved_total",
                    "Bytes by tenant and function: kernel_args (the buffers launches were \
                     given), host_to_device and device_to_host (copies into and out of \
                     component GPU buffers).",
                ),
                &["tenant", "function", "direction"],
            )?,
            device_memory: IntGaugeVec::new(
                Opts::new(
                    "tensor_wasm_tenant_device_memory_bytes",
                    "Device-visible memory held by running invocations, by tenant and function: \
                     guest memory in CUDA managed memory, component GPU buffer arenas.",
                ),
                &["tenant", "function"],
            )?,
        })
    }

    pub(crate) fn register(&self, registry: &Registry) -> prometheus::Result<()> {
        registry.register(Box::new(self.kernel_seconds.clone()))?;
        registry.register(Box::new(self.bytes_moved.clone()))?;
        registry.register(Box::new(self.device_memory.clone()))
    }

    /// Charges a launch of `function` of `tenant` on `backend`: what the
    /// backend measured (CPU worker time, or CUDA device time between timing
    /// events), else `wall` (launch to completion).
    pub(crate) fn kernel(
        &self,
        tenant: &str,
        function: &str,
        backend: &str,
        timer: Option<&tensor_wasm_gpu::KernelTimer>,
        wall: Duration,
    ) {
        let (timing, took) = match (
            timer.and_then(|t| t.worker_time()),
            timer.and_then(|t| t.device_time()),
        ) {
            (Some(worker), _) => ("cpu_worker", worker),
            (None, Some(device)) => ("cuda_event", device),
            (None, None) => ("launch_to_completion", wall),
        };
        let (t, f) = labels(tenant, function);
        self.kernel_seconds
            .with_label_values(&[t, f, backend, timing])
            .inc_by(took.as_secs_f64());
    }

    /// Counts `bytes` moved for `function` of `tenant`.
    pub(crate) fn moved(&self, tenant: &str, function: &str, what: Moved, bytes: u64) {
        if bytes == 0 {
            return;
        }
        let (t, f) = labels(tenant, function);
        self.bytes_moved
            .with_label_values(&[t, f, what.label()])
            .inc_by(bytes);
    }

    /// Counts `bytes` of device-visible memory held by `function` of `tenant`
    /// until the returned guard is dropped.
    pub(crate) fn hold(&self, tenant: &str, function: &str, bytes: u64) -> DeviceHold {
        let (t, f) = labels(tenant, function);
        let gauge = self.device_memory.with_label_values(&[t, f]);
        let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
        gauge.add(bytes);
        DeviceHold { gauge, bytes }
    }

    /// Kernel seconds charged to `tenant`, over its functions and backends.
    pub(crate) fn tenant_kernel_seconds(&self, tenant: &str) -> f64 {
        use prometheus::core::Collector as _;
        let tenant = tensor_wasm_telemetry::labels::tenant(tenant);
        self.kernel_seconds
            .collect()
            .iter()
            .flat_map(|family| family.get_metric())
            .filter(|m| {
                m.get_label()
                    .iter()
                    .any(|l| l.name() == "tenant" && l.value() == tenant)
            })
            .map(|m| m.get_counter().get_value())
            .sum()
    }
}

fn labels<'a>(tenant: &'a str, function: &'a str) -> (&'a str, &'a str) {
    (
        tensor_wasm_telemetry::labels::tenant(tenant),
        tensor_wasm_telemetry::labels::function(function),
    )
}

/// Device-visible memory counted as held until dropped.
#[derive(Debug)]
pub(crate) struct DeviceHold {
    gauge: IntGauge,
    bytes: i64,
}

impl Drop for DeviceHold {
    fn drop(&mut self) {
        self.gauge.sub(self.bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernels_are_charged_by_what_the_backend_measured() {
        let accounts = Accounts::new().unwrap();
        let ms = Duration::from_millis;
        accounts.kernel("tn-a", "fn-2", "cuda", None, ms(200));
        accounts.kernel("tn-b", "fn-3", "cpu", None, ms(60));
        assert!((accounts.tenant_kernel_seconds("tn-a") - 0.2).abs() < 1e-9);
        assert!((accounts.tenant_kernel_seconds("tn-b") - 0.06).abs() < 1e-9);
        let held = accounts.hold("tn-a", "fn-1", 4096);
        let gauge = accounts.device_memory.with_label_values(&["tn-a", "fn-1"]);
        assert_eq!(gauge.get(), 4096);
        drop(held);
        assert_eq!(gauge.get(), 0);
        accounts.moved("tn-a", "fn-1", Moved::ToDevice, 10);
        accounts.moved("tn-a", "fn-1", Moved::ToDevice, 5);
        assert_eq!(
            accounts
                .bytes_moved
                .with_label_values(&["tn-a", "fn-1", "host_to_device"])
                .get(),
            15
        );
    }
}
