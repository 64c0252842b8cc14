//! Prometheus metrics of the runtime: invocations, instantiation, compilation.

use prometheus::{
    exponential_buckets, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec,
    IntGauge, IntGaugeVec, Opts, Registry,
};
use tensor_wasm_dispatch::DispatchMetrics;
use tensor_wasm_jit::KernelCacheMetrics;

/// How an invocation ended, as a metrics label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Returned results or exited.
    Ok,
    /// The guest trapped.
    Trap,
    /// The deadline passed.
    Timeout,
    /// A memory, fuel or output limit was hit.
    Limit,
    /// The request was refused before the guest ran (bad arguments, busy).
    Rejected,
    /// The host failed.
    Error,
}

impl Outcome {
    /// Every outcome, in discriminant order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::Trap,
        Outcome::Timeout,
        Outcome::Limit,
        Outcome::Rejected,
        Outcome::Error,
    ];

    /// Label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Trap => "trap",
            Outcome::Timeout => "timeout",
            Outcome::Limit => "limit",
            Outcome::Rejected => "rejected",
            Outcome::Error => "error",
        }
    }
}

/// The size and evictions of one bounded cache (a `cache` label value of
/// `tensor_wasm_cache_entries`, `tensor_wasm_cache_bytes` and
/// `tensor_wasm_cache_evictions_total`).
#[derive(Clone, Debug)]
pub(crate) struct CacheGauges {
    pub(crate) entries: IntGauge,
    pub(crate) bytes: IntGauge,
    pub(crate) evictions: IntCounter,
}

impl CacheGauges {
    /// Sets the size gauges from `cache` and counts `evicted` evictions.
    pub(crate) fn observe<K: Eq + std::hash::Hash + Clone, V>(
        &self,
        cache: &crate::BoundedLru<K, V>,
        evicted: usize,
    ) {
        self.entries.set(cache.len() as i64);
        self.bytes
            .set(i64::try_from(cache.bytes()).unwrap_or(i64::MAX));
        self.evictions.inc_by(evicted as u64);
    }
}

/// Handles to every runtime metric.
#[derive(Clone, Debug)]
pub struct RuntimeMetrics {
    pub(crate) invocations: IntCounterVec,
    /// The `invocations` children, resolved once, indexed by `Outcome as usize`.
    outcomes: [IntCounter; 6],
    pub(crate) invocation_seconds: Histogram,
    pub(crate) instantiate_seconds: Histogram,
    pub(crate) compile_seconds: Histogram,
    pub(crate) module_loads: IntCounterVec,
    pub(crate) cached_modules: IntGauge,
    /// Function records kept aside because this build cannot read them.
    pub(crate) quarantined_records: IntGauge,
    /// Loaded modules in memory (`cache="modules"`).
    pub(crate) module_cache: CacheGauges,
    /// Precompiled artifacts on disk (`cache="artifacts"`).
    pub(crate) artifact_cache: CacheGauges,
    /// Loaded blueprint kernels (`cache="blueprint_kernels"`).
    pub(crate) blueprint_cache: CacheGauges,
    cache_entries: IntGaugeVec,
    cache_bytes: IntGaugeVec,
    cache_evictions: IntCounterVec,
    pub(crate) snapshot_captures: IntCounter,
    pub(crate) snapshot_capture_seconds: Histogram,
    pub(crate) snapshot_restores: IntCounterVec,
    pub(crate) snapshot_restore_seconds: HistogramVec,
    pub(crate) snapshot_bytes: IntCounterVec,
    /// Inline export calls (see `Runtime::try_invoke_export_inline`): `done`
    /// answered on the caller's thread, `overran` cut short and run again.
    pub(crate) inline_done: IntCounter,
    pub(crate) inline_overran: IntCounter,
    inline_calls: IntCounterVec,
    /// Kernel time, bytes moved and device memory by tenant and function,
    /// overruns past a deadline included (a CUDA kernel runs on).
    pub(crate) accounts: crate::accounting::Accounts,
    /// Component invocations ended at their deadline by dropping their call, by style
    /// (`command`, `export`, `http`).
    pub(crate) component_deadline_cancellations: IntCounterVec,
    /// Instance slots held by running invocations (of `--max-instances`).
    pub(crate) slots_in_use: IntGauge,
    /// Metrics of the kernel dispatcher.
    pub dispatch: DispatchMetrics,
    /// Metrics of the compiled-kernel cache.
    pub kernel_cache: KernelCacheMetrics,
}

impl RuntimeMetrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &Registry) -> prometheus::Result<Self> {
        let fast = exponential_buckets(1e-6, 2.0, 24)?; // 1 µs .. ~8 s
        let invocations = IntCounterVec::new(
            Opts::new(
                "tensor_wasm_invocations_total",
                "Invocations by outcome (ok, trap, timeout, limit, rejected, error).",
            ),
            &["outcome"],
        )?;
        let outcomes = Outcome::ALL.map(|o| invocations.with_label_values(&[o.as_str()]));
        let inline_calls = IntCounterVec::new(
            Opts::new(
                "tensor_wasm_inline_calls_total",
                "Export calls tried on the request's thread, by result (done, overran).",
            ),
            &["result"],
        )?;
        let cache_entries = IntGaugeVec::new(
            Opts::new(
                "tensor_wasm_cache_entries",
                "Entries held by a bounded cache (modules, artifacts, blueprint_kernels).",
            ),
            &["cache"],
        )?;
        let cache_bytes = IntGaugeVec::new(
            Opts::new(
                "tensor_wasm_cache_bytes",
                "Bytes held by a bounded cache (compiled code of modules, artifact files).",
            ),
            &["cache"],
        )?;
        let cache_evictions = IntCounterVec::new(
            Opts::new(
                "tensor_wasm_cache_evictions_total",
                "Entries evicted from a bounded cache by its entry or byte bound.",
            ),
            &["cache"],
        )?;
        let gauges = |cache: &str| CacheGauges {
            entries: cache_entries.with_label_values(&[cache]),
            bytes: cache_bytes.with_label_values(&[cache]),
            evictions: cache_evictions.with_label_values(&[cache]),
        };
        let metrics = RuntimeMetrics {
            module_cache: gauges("modules"),
            artifact_cache: gauges("artifacts"),
            blueprint_cache: gauges("blueprint_kernels"),
            invocations,
            outcomes,
            invocation_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "tensor_wasm_invocation_duration_seconds",
                    "Wall time of an invocation from instantiation to results.",
                )
                .buckets(fast.clone()),
            )?,
            instantiate_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "tensor_wasm_instantiate_duration_seconds",
                    "Time to create a store and instantiate a module from its InstancePre.",
                )
                .buckets(fast.clone()),
            )?,
            compile_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "tensor_wasm_module_compile_duration_seconds",
                    "Time to compile a module, or to load its precompiled artifact.",
                )
                .buckets(fast.clone()),
            )?,
            snapshot_captures: IntCounter::new(
                "tensor_wasm_snapshot_captures_total",
                "Snapshots captured (init export run and memory encoded).",
            )?,
            snapshot_capture_seconds: Histogram::with_opts(
                HistogramOpts::new(
                    "tensor_wasm_snapshot_capture_duration_seconds",
                    "Time to encode and store a snapshot, init export excluded.",
                )
                .buckets(fast.clone()),
            )?,
            snapshot_restores: IntCounterVec::new(
                Opts::new(
                    "tensor_wasm_snapshot_restores_total",
                    "Instances started from a snapshot, by mode (lazy: mapped; eager: copied).",
                ),
                &["mode"],
            )?,
            snapshot_restore_seconds: HistogramVec::new(
                HistogramOpts::new(
                    "tensor_wasm_snapshot_restore_duration_seconds",
                    "Time to restore memory and globals into a new instance, by mode.",
                )
                .buckets(fast),
                &["mode"],
            )?,
            snapshot_bytes: IntCounterVec::new(
                Opts::new(
                    "tensor_wasm_snapshot_bytes_total",
                    "Linear-memory bytes captured into snapshots and restored from them.",
                ),
                &["direction"],
            )?,
            module_loads: IntCounterVec::new(
                Opts::new(
                    "tensor_wasm_module_loads_total",
                    "Modules made ready, by source (compiled, artifact).",
                ),
                &["source"],
            )?,
            cached_modules: IntGauge::new(
                "tensor_wasm_cached_modules",
                "Compiled modules held in memory.",
            )?,
            quarantined_records: IntGauge::new(
                "tensor_wasm_quarantined_records",
                "Function records in quarantine (unreadable by this build; see `tensor-wasm doctor --data-dir`).",
            )?,
            inline_done: inline_calls.with_label_values(&["done"]),
            inline_overran: inline_calls.with_label_values(&["overran"]),
            inline_calls,
            accounts: crate::accounting::Accounts::new()?,
            cache_entries,
            cache_bytes,
            cache_evictions,
            component_deadline_cancellations: IntCounterVec::new(
                Opts::new(
                    "tensor_wasm_component_deadline_cancellations_total",
                    "Component invocations ended at their deadline by dropping the call, by style (command, export, http).",
                ),
                &["style"],
            )?,
            slots_in_use: IntGauge::new(
                "tensor_wasm_instance_slots_in_use",
                "Instance slots held by running invocations (of --max-instances).",
            )?,
            dispatch: DispatchMetrics::register(registry)?,
            kernel_cache: KernelCacheMetrics::register(registry)?,
        };
        registry.register(Box::new(metrics.invocations.clone()))?;
        registry.register(Box::new(metrics.invocation_seconds.clone()))?;
        registry.register(Box::new(metrics.instantiate_seconds.clone()))?;
        registry.register(Box::new(metrics.compile_seconds.clone()))?;
        registry.register(Box::new(metrics.module_loads.clone()))?;
        registry.register(Box::new(metrics.cached_modules.clone()))?;
        registry.register(Box::new(metrics.quarantined_records.clone()))?;
        registry.register(Box::new(metrics.snapshot_captures.clone()))?;
        registry.register(Box::new(metrics.snapshot_capture_seconds.clone()))?;
        registry.register(Box::new(metrics.snapshot_restores.clone()))?;
        registry.register(Box::new(metrics.snapshot_restore_seconds.clone()))?;
        registry.register(Box::new(metrics.snapshot_bytes.clone()))?;
        registry.register(Box::new(metrics.inline_calls.clone()))?;
        metrics.accounts.register(registry)?;
        registry.register(Box::new(metrics.cache_entries.clone()))?;
        registry.register(Box::new(metrics.cache_bytes.clone()))?;
        registry.register(Box::new(metrics.cache_evictions.clone()))?;
        registry.register(Box::new(metrics.component_deadline_cancellations.clone()))?;
        registry.register(Box::new(metrics.slots_in_use.clone()))?;
        for style in ["command", "export", "http"] {
            metrics
                .component_deadline_cancellations
                .with_label_values(&[style]);
        }
        for mode in ["lazy", "eager"] {
            metrics.snapshot_restores.with_label_values(&[mode]);
        }
        for direction in ["captured", "restored"] {
            metrics.snapshot_bytes.with_label_values(&[direction]);
        }
        for source in ["compiled", "artifact"] {
            metrics.module_loads.with_label_values(&[source]);
        }
        Ok(metrics)
    }

    /// Number of modules loaded from `source` so far.
    pub fn module_loads(&self, source: crate::ModuleSource) -> u64 {
        self.module_loads
            .with_label_values(&[source.as_str()])
            .get()
    }

    /// Instances started from a snapshot in `mode` (`lazy` or `eager`) so far.
    pub fn snapshot_restores(&self, mode: &str) -> u64 {
        self.snapshot_restores.with_label_values(&[mode]).get()
    }

    /// Kernel seconds charged to `tenant` so far.
    pub fn tenant_kernel_seconds(&self, tenant: &str) -> f64 {
        self.accounts.tenant_kernel_seconds(tenant)
    }

    /// Loaded modules held in memory now.
    pub fn cached_modules(&self) -> i64 {
        self.cached_modules.get()
    }

    /// Evictions from the cache named `cache` (`modules`, `artifacts` or
    /// `blueprint_kernels`) so far.
    pub fn cache_evictions(&self, cache: &str) -> u64 {
        self.cache_evictions.with_label_values(&[cache]).get()
    }

    /// Snapshots captured so far.
    pub fn snapshot_captures(&self) -> u64 {
        self.snapshot_captures.get()
    }

    pub(crate) fn record_outcome(&self, outcome: Outcome) {
        self.outcomes[outcome as usize].inc();
    }
}
