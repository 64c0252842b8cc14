//! `tensor-wasm serve`: configuration flags, logging, startup and graceful shutdown.

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use std::path::Path;

use tensor_wasm_api::{
    default_tenant, serve as serve_connections, ApiConfig, AppState, AuthMode, ServeLimits,
};
use tensor_wasm_dispatch::DispatchConfig;
use tensor_wasm_gpu::{open_backend_with, DeviceChoice, GpuIsolation};
use tensor_wasm_runtime::{
    CacheLimits, ComponentLimits, GuestMemory, Runtime, RuntimeConfig, RuntimeMetrics,
};
use tensor_wasm_tenant::{Bootstrap, Resource, TenantMetrics};

use crate::shared::Stores;
use tensor_wasm_shared::PoolOptions;

/// Guest memory choice on the command line.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum GuestMemoryArg {
    Pooled,
    Unified,
}

/// Log output format.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// Flags of `serve`; each also reads an environment variable.
#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on.
    #[arg(long, env = "TENSOR_WASM_LISTEN", default_value = "127.0.0.1:8080")]
    listen: SocketAddr,
    /// Data directory (functions, modules, compiled artifacts).
    #[arg(
        long,
        env = "TENSOR_WASM_DATA_DIR",
        default_value = "./tensor-wasm-data"
    )]
    data_dir: PathBuf,
    /// The shared store's PostgreSQL URL (`postgres://user:password@host:port/db`): records of
    /// functions, snapshots, tenants, tokens and async jobs live there, shared by every replica,
    /// and the data dir keeps per-host caches. Needs --blob-store. Without both, everything stays in the data dir.
    #[arg(
        long,
        env = "TENSOR_WASM_STORE",
        hide_env_values = true,
        requires = "blob_store"
    )]
    store: Option<String>,
    /// The shared store's object storage for modules and snapshots (`s3://bucket/prefix`;
    /// endpoint, credentials and region from AWS_ENDPOINT, AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_REGION, and AWS_ALLOW_HTTP=true for a plain-HTTP endpoint).
    /// Needs --store.
    #[arg(long, env = "TENSOR_WASM_BLOB_STORE", requires = "store")]
    blob_store: Option<String>,
    /// Default per-invocation deadline in milliseconds.
    #[arg(long, env = "TENSOR_WASM_DEFAULT_TIMEOUT_MS", default_value_t = 30_000)]
    default_timeout_ms: u64,
    /// Longest deadline a function may ask for, in milliseconds.
    #[arg(long, env = "TENSOR_WASM_MAX_TIMEOUT_MS", default_value_t = 900_000)]
    max_timeout_ms: u64,
    /// Default per-invocation linear-memory limit in bytes.
    #[arg(long, env = "TENSOR_WASM_DEFAULT_MEMORY_LIMIT", default_value_t = 256 << 20)]
    default_memory_limit_bytes: u64,
    /// Largest memory limit a function may ask for, in bytes (sizes instance slots).
    #[arg(long, env = "TENSOR_WASM_MAX_MEMORY_LIMIT", default_value_t = 1 << 30)]
    max_memory_limit_bytes: u64,
    /// Instances that may run at once (pooling-allocator slots).
    #[arg(long, env = "TENSOR_WASM_MAX_INSTANCES", default_value_t = 256)]
    max_instances: u32,
    /// Largest request body in bytes (413 above); also the module size limit.
    #[arg(long, env = "TENSOR_WASM_MAX_BODY_BYTES", default_value_t = 64 << 20)]
    max_body_bytes: usize,
    /// How long an invocation waits for a free slot before 503, in milliseconds.
    #[arg(long, env = "TENSOR_WASM_QUEUE_TIMEOUT_MS", default_value_t = 10_000)]
    queue_timeout_ms: u64,
    /// Bytes of modules and snapshots one tenant may keep on disk (409 quota_storage_exceeded
    /// above); a tenant's `max_stored_bytes` quota overrides it.
    #[arg(
        long,
        env = "TENSOR_WASM_MAX_STORED_BYTES_PER_TENANT",
        default_value_t = 4 << 30
    )]
    max_stored_bytes_per_tenant: u64,
    /// Largest stdout of a WASI command in bytes.
    #[arg(long, env = "TENSOR_WASM_MAX_OUTPUT_BYTES", default_value_t = 16 << 20)]
    max_output_bytes: usize,
    /// Enable fuel metering, so functions can set a fuel budget (slows every guest).
    #[arg(long, env = "TENSOR_WASM_FUEL")]
    fuel: bool,
    /// Log format on stderr (filter with RUST_LOG, default `info`).
    #[arg(
        long,
        env = "TENSOR_WASM_LOG_FORMAT",
        value_enum,
        default_value = "text"
    )]
    log_format: LogFormat,
    /// Kernel device: `cpu`, `cuda` (fails without a usable GPU) or `auto`.
    #[arg(long, env = "TENSOR_WASM_DEVICE", default_value = "auto")]
    device: DeviceChoice,
    /// GPU isolation between tenants: `stream` (a CUDA stream per tenant in one
    /// shared context: cheap, concurrent kernels, one fault domain) or `context`
    /// (a CUDA context per tenant: separate device allocations, a faulted context
    /// is replaced, costs device memory per context, kernels time-sliced). This is
    /// the server-wide level; a tenant created with `"gpu_isolation": "own_context"`
    /// gets a context of its own either way. See docs/ARCHITECTURE.md. No effect on
    /// the CPU backend.
    #[arg(long, env = "TENSOR_WASM_GPU_ISOLATION", default_value = "stream")]
    gpu_isolation: GpuIsolation,
    /// Guest linear memory: `pooled` (host memory, fastest instantiation; CPU
    /// only) or `unified` (one buffer per instance, pre-allocated at the
    /// function's memory limit; CUDA managed memory on CUDA). CUDA forces `unified`.
    #[arg(
        long,
        env = "TENSOR_WASM_GUEST_MEMORY",
        value_enum,
        default_value = "pooled"
    )]
    guest_memory: GuestMemoryArg,
    /// Kernels that may run at once across all guests.
    #[arg(long, env = "TENSOR_WASM_MAX_KERNELS_IN_FLIGHT", default_value_t = 64)]
    max_kernels_in_flight: usize,
    /// Kernel launches that may wait for a slot; beyond that invocations get 429.
    #[arg(long, env = "TENSOR_WASM_MAX_QUEUED_LAUNCHES", default_value_t = 1024)]
    max_queued_launches: usize,
    /// Allow functions to be deployed with the raw-PTX capability. Raw PTX can
    /// address any device memory: enable only when every deployer is trusted.
    #[arg(long, env = "TENSOR_WASM_ALLOW_RAW_PTX")]
    allow_raw_ptx: bool,
    /// Tenant kernel compiles (NVRTC, or the PTX verifier and fencing rewrite) one tenant may
    /// run at once; a further one waits until its invocation's deadline. Each takes a core
    /// while it runs and cannot be interrupted. At least 1.
    #[arg(
        long,
        env = "TENSOR_WASM_MAX_COMPILES_PER_TENANT",
        default_value_t = 1,
        value_parser = clap::value_parser!(u16).range(1..=256)
    )]
    max_compiles_per_tenant: u16,
    /// Serve without authentication: every request acts as the default tenant
    /// and as admin. For local experiments only: refused unless listening on
    /// a loopback address.
    #[arg(long, env = "TENSOR_WASM_INSECURE_NO_AUTH")]
    insecure_no_auth: bool,
    /// A token that may read `/metrics` (besides the admin token), e.g. for Prometheus.
    #[arg(long, env = "TENSOR_WASM_METRICS_TOKEN", hide_env_values = true)]
    metrics_token: Option<String>,
    /// Never run export calls on the server's async threads. By default a call
    /// of an import-free function runs there under a budget of 5-10 ms and, if
    /// it overruns, is run again on a blocking thread (after two overruns in a
    /// row, that function's calls go there directly).
    #[arg(long, env = "TENSOR_WASM_NO_INLINE_CALLS")]
    no_inline_calls: bool,
    /// Largest linear memory an inline call may have or grow to: larger modules
    /// (initial size), multi-memory modules and tables over 65,536 elements are
    /// never run inline; a call growing past it is run again on a blocking thread.
    #[arg(long, env = "TENSOR_WASM_INLINE_MAX_MEMORY_BYTES", default_value_t = 8 << 20)]
    inline_max_memory_bytes: u64,
    /// Pooled guest memory: bytes of each instance slot's memory kept resident when an
    /// instance ends (zeroed in place, not handed back to the kernel), so eager snapshot
    /// restores and large guests do not fault their pages in again; costs that much
    /// resident memory per slot once used. 0 hands every page back.
    #[arg(
        long,
        env = "TENSOR_WASM_POOL_KEEP_RESIDENT_BYTES",
        default_value_t = 0
    )]
    pool_keep_resident_bytes: u64,
    /// Origins that WebAssembly components may send HTTP requests to
    /// (`wasi:http/outgoing-handler`), comma-separated: `http://host[:port]` or
    /// `https://host[:port]`, matched exactly by scheme, host and port. Every other request is
    /// refused with `HTTP-request-denied`; none by default. Connections, response heads and
    /// body reads end at the invocation's deadline.
    #[arg(
        long,
        env = "TENSOR_WASM_OUTGOING_HTTP_ALLOW",
        value_delimiter = ',',
        value_name = "ORIGINS"
    )]
    outgoing_http_allow: Vec<tensor_wasm_runtime::Origin>,
    /// wasi-nn: the largest ONNX model (bytes) a guest may load.
    #[arg(long, env = "TENSOR_WASM_NN_MAX_MODEL_BYTES", default_value_t = 256 << 20)]
    nn_max_model_bytes: usize,
    /// wasi-nn: parsed models kept per host (by content hash), to load them again without
    /// parsing.
    #[arg(long, env = "TENSOR_WASM_NN_CACHED_MODELS", default_value_t = 64)]
    nn_cached_models: usize,
    /// wasi-nn: on a host without a GPU, run the `gpu` execution target on the CPU backend
    /// (the same bytes) instead of refusing it with `unsupported-operation`.
    #[arg(long, env = "TENSOR_WASM_NN_GPU_FALLBACK")]
    nn_gpu_fallback: bool,
    /// wasi-nn: ONNX models every tenant can load by name, as `NAME=PATH` (repeatable, or
    /// comma-separated in the variable); parsed at start (a bad one stops the server). A
    /// tenant's own model of the same name comes first.
    #[arg(
        long,
        env = "TENSOR_WASM_NN_PRELOAD",
        value_delimiter = ',',
        value_name = "NAME=PATH",
        value_parser = parse_preload
    )]
    nn_preload: Vec<(String, PathBuf)>,
    /// With `--store`: how long a replica may go without reading the shared change log to its
    /// end before it fails closed: no tenant's raw-kernel functions start or deploy there, and
    /// `/readyz` answers 503, until it has caught up again.
    #[arg(long, env = "TENSOR_WASM_POLICY_STALE_MS", default_value_t = 5000)]
    policy_stale_ms: u64,
    /// With `--store`: PostgreSQL connections this replica opens for its calls, at most (the
    /// change-log follower and the bootstrap lock use one more each).
    #[arg(long, env = "TENSOR_WASM_DB_MAX_CONNECTIONS", default_value_t = PoolOptions::default().max_connections, value_parser = clap::value_parser!(usize))]
    db_max_connections: usize,
    /// With `--store`: how long connecting to PostgreSQL may take, in milliseconds.
    #[arg(long, env = "TENSOR_WASM_DB_CONNECT_TIMEOUT_MS", default_value_t = PoolOptions::default().connect_timeout.as_millis() as u64)]
    db_connect_timeout_ms: u64,
    /// With `--store`: how long one database statement may run, and one database call may
    /// take on this side (waiting for a free connection included), in milliseconds; past it
    /// the call fails with `store_unavailable` (503).
    #[arg(long, env = "TENSOR_WASM_DB_STATEMENT_TIMEOUT_MS", default_value_t = PoolOptions::default().statement_timeout.as_millis() as u64)]
    db_statement_timeout_ms: u64,
    /// With `--store`: how long an unused PostgreSQL connection stays open, in milliseconds.
    #[arg(long, env = "TENSOR_WASM_DB_IDLE_TIMEOUT_MS", default_value_t = PoolOptions::default().idle_timeout.as_millis() as u64)]
    db_idle_timeout_ms: u64,
    /// Host resources (streams, pollables, `wasi:http` fields, requests, responses, GPU
    /// buffers ...) one component invocation may hold at once; one more ends it with
    /// `resource_limit_exceeded`.
    #[arg(long, env = "TENSOR_WASM_COMPONENT_MAX_RESOURCES", default_value_t = ComponentLimits::default().max_resources)]
    component_max_resources: usize,
    /// Bytes one `wasi:http` fields resource of a component may hold (names and values plus
    /// a per-entry overhead); past it the invocation ends with `resource_limit_exceeded`.
    /// The fields themselves are charged to the function's memory limit too.
    #[arg(long, env = "TENSOR_WASM_COMPONENT_MAX_FIELD_BYTES", default_value_t = ComponentLimits::default().max_field_bytes)]
    component_max_field_bytes: usize,
    /// Bytes of snapshot encoder buffers kept between captures: a capture whose encoding
    /// fits writes into memory already there instead of faulting fresh pages in; costs up to
    /// that much resident memory once used. 0 frees them after every capture.
    #[arg(
        long,
        env = "TENSOR_WASM_SNAPSHOT_ENCODER_KEEP_BYTES",
        default_value_t = 64 << 20
    )]
    snapshot_encoder_keep_bytes: u64,
    /// Loaded (compiled and linked) modules kept in memory; the least recently used
    /// are evicted and loaded again on their next call.
    #[arg(long, env = "TENSOR_WASM_MODULE_CACHE_ENTRIES", default_value_t = CacheLimits::default().module_entries)]
    module_cache_entries: usize,
    /// Bytes of compiled code the loaded modules may hold in memory.
    #[arg(long, env = "TENSOR_WASM_MODULE_CACHE_BYTES", default_value_t = CacheLimits::default().module_bytes)]
    module_cache_bytes: u64,
    /// Precompiled module artifacts kept on disk (`<data-dir>/artifacts`); the least
    /// recently used are deleted and compiled again from the stored module on demand.
    #[arg(long, env = "TENSOR_WASM_ARTIFACT_CACHE_ENTRIES", default_value_t = CacheLimits::default().artifact_entries)]
    artifact_cache_entries: usize,
    /// Bytes of precompiled module artifacts kept on disk.
    #[arg(long, env = "TENSOR_WASM_ARTIFACT_CACHE_BYTES", default_value_t = CacheLimits::default().artifact_bytes)]
    artifact_cache_bytes: u64,
    /// Loaded JIT blueprint kernels kept for all instances; the least recently used
    /// are evicted and loaded again (from the kernel cache) on their next use.
    #[arg(long, env = "TENSOR_WASM_MAX_BLUEPRINT_KERNELS", default_value_t = CacheLimits::default().blueprint_kernels)]
    max_blueprint_kernels: usize,
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "TENSOR_WASM_SHUTDOWN_GRACE_S", default_value_t = 30)]
    shutdown_grace_s: u64,
    #[command(flatten)]
    jobs: crate::job_flags::JobFlags,
    /// How long a request body may take to arrive, in milliseconds, from the
    /// request's headers on; then 408 `request_timeout` and the connection closes.
    #[arg(
        long,
        env = "TENSOR_WASM_BODY_READ_TIMEOUT_MS",
        default_value_t = 60_000
    )]
    body_read_timeout_ms: u64,
    /// How long a connection may take to send a request's headers, in
    /// milliseconds; then it is closed unanswered (slow-trickle clients).
    #[arg(
        long,
        env = "TENSOR_WASM_HEADER_READ_TIMEOUT_MS",
        default_value_t = 10_000
    )]
    header_read_timeout_ms: u64,
    /// Connections served at once. Above it, up to 64 more are answered 503
    /// `too_many_connections` and closed; beyond those, closed unanswered.
    #[arg(long, env = "TENSOR_WASM_MAX_CONNECTIONS", default_value_t = 1024)]
    max_connections: usize,
    /// Follow the sampled flag of an incoming W3C `traceparent` (trace export
    /// is configured by the standard `OTEL_*` variables). Off by default: the
    /// sampler configured here decides, so a client cannot make the server
    /// trace every one of its requests; its trace id is kept either way.
    #[arg(long, env = "TENSOR_WASM_OTEL_TRUST_REMOTE_SAMPLED")]
    otel_trust_remote_sampled: bool,
    /// Tenants with metric series of their own (kernel time, bytes moved, device memory,
    /// quotas); the rest are counted under `tenant="other"`.
    #[arg(long, env = "TENSOR_WASM_METRICS_MAX_TENANTS", default_value_t = tensor_wasm_telemetry::labels::DEFAULT_MAX_TENANTS)]
    metrics_max_tenants: usize,
    /// Functions with metric series of their own, over all tenants; the rest are counted
    /// under `function="other"`.
    #[arg(long, env = "TENSOR_WASM_METRICS_MAX_FUNCTIONS", default_value_t = tensor_wasm_telemetry::labels::DEFAULT_MAX_FUNCTIONS)]
    metrics_max_functions: usize,
    /// Time each CUDA kernel on the device, between timing events recorded around it: kernel
    /// seconds are then device time (`timing="cuda_event"`) instead of launch to completion.
    /// Timing events cost the driver a little more per launch.
    #[arg(long, env = "TENSOR_WASM_CUDA_TIMING_EVENTS")]
    cuda_timing_events: bool,
}

/// Logging to stderr (text or JSON lines) and, when the `OTEL_*` variables
/// configure it, trace export over OTLP. The log filter (`RUST_LOG`, `info`
/// by default) does not decide which spans are exported: the trace spans
/// have a layer and a filter of their own.
fn init_logging(
    format: LogFormat,
    trust_remote_sampled: bool,
) -> anyhow::Result<Option<tensor_wasm_telemetry::Telemetry>> {
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    use tracing_subscriber::Layer as _;

    let settings = tensor_wasm_telemetry::Settings::from_env(trust_remote_sampled)
        .map_err(|e| anyhow::anyhow!("OpenTelemetry settings: {e}"))?;
    let telemetry = match &settings {
        Some(settings) => Some(
            tensor_wasm_telemetry::Telemetry::start(settings, env!("CARGO_PKG_VERSION"))
                .map_err(|e| anyhow::anyhow!("starting trace export: {e}"))?,
        ),
        None => None,
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
        // Trace spans are not log lines: the log filter never shows them
        // (their trace id reaches the lines through `TraceIdLayer`).
        .add_directive(
            format!("{}=off", tensor_wasm_telemetry::TARGET)
                .parse()
                .expect("a valid directive"),
        );
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt.with_filter(filter).boxed(),
        LogFormat::Json => {
            let json = tracing_subscriber::fmt::format().json();
            fmt.json()
                .event_format(tensor_wasm_telemetry::WithTraceIds(json))
                .with_filter(filter)
                .boxed()
        }
    };
    let registry = tracing_subscriber::registry().with(fmt);
    match &telemetry {
        Some(telemetry) => registry
            .with(tensor_wasm_telemetry::TraceIdLayer)
            .with(telemetry.layer())
            .init(),
        None => registry.init(),
    }
    Ok(telemetry)
}

impl ServeArgs {
    fn runtime_config(&self) -> anyhow::Result<RuntimeConfig> {
        anyhow::ensure!(
            self.component_max_resources >= 16,
            "--component-max-resources must be at least 16 (a component's WASI streams and \
             an HTTP handler's request and response take some)"
        );
        let backend = open_backend_with(self.device, self.gpu_isolation)
            .with_context(|| format!("opening the `{}` kernel device", self.device))?;
        Ok(RuntimeConfig {
            backend,
            guest_memory: match self.guest_memory {
                GuestMemoryArg::Pooled => GuestMemory::Pooled,
                GuestMemoryArg::Unified => GuestMemory::Unified,
            },
            dispatch: DispatchConfig {
                max_in_flight: self.max_kernels_in_flight.max(1),
                max_queued: self.max_queued_launches,
            },
            allow_raw_ptx: self.allow_raw_ptx,
            max_compiles_per_tenant: usize::from(self.max_compiles_per_tenant),
            gpu_isolation: self.gpu_isolation,
            inline_calls: !self.no_inline_calls,
            inline_max_memory_bytes: self.inline_max_memory_bytes,
            pool_keep_resident_bytes: self.pool_keep_resident_bytes,
            snapshot_encoder_keep_bytes: self.snapshot_encoder_keep_bytes,
            outgoing_http_allow: self.outgoing_http_allow.clone().into(),
            default_timeout: Duration::from_millis(self.default_timeout_ms),
            max_timeout: Duration::from_millis(self.max_timeout_ms),
            default_memory_limit_bytes: self.default_memory_limit_bytes,
            max_memory_limit_bytes: self.max_memory_limit_bytes,
            max_module_bytes: self.max_body_bytes,
            max_instances: self.max_instances,
            fuel_enabled: self.fuel,
            max_output_bytes: self.max_output_bytes,
            max_stored_bytes_per_tenant: self.max_stored_bytes_per_tenant,
            component_limits: ComponentLimits {
                max_resources: self.component_max_resources,
                max_field_bytes: self.component_max_field_bytes,
            },
            nn: tensor_wasm_runtime::NnConfig {
                max_model_bytes: self.nn_max_model_bytes,
                cached_models: tensor_wasm_runtime::CacheBounds {
                    max_entries: self.nn_cached_models,
                    ..tensor_wasm_runtime::NnConfig::default().cached_models
                },
                gpu_fallback: self.nn_gpu_fallback,
                preload: self.nn_preload.clone(),
            },
            caches: CacheLimits {
                module_entries: self.module_cache_entries,
                module_bytes: self.module_cache_bytes,
                artifact_entries: self.artifact_cache_entries,
                artifact_bytes: self.artifact_cache_bytes,
                blueprint_kernels: self.max_blueprint_kernels,
            },
            ..RuntimeConfig::new(&self.data_dir)
        })
    }
}

/// Runs the server until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    let telemetry = init_logging(args.log_format, args.otel_trust_remote_sampled)?;
    tensor_wasm_telemetry::labels::configure(args.metrics_max_tenants, args.metrics_max_functions);
    tensor_wasm_gpu::set_cuda_timing_events(args.cuda_timing_events);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let stats = telemetry.as_ref().map(|t| t.stats().clone());
    let result = tokio.block_on(serve(args, stats));
    if let Some(telemetry) = telemetry {
        telemetry.shutdown(Duration::from_secs(5));
    }
    // Guests still running past the shutdown deadline (their jobs already
    // recorded as failed) sit on blocking threads, some inside WASI calls
    // on the runtime's timers. Dropping the runtime would wait for them, and
    // shutting it down would fail those calls mid-way; the process is about
    // to exit, which ends them.
    std::mem::forget(tokio);
    result
}

async fn serve(
    args: ServeArgs,
    trace_export: Option<tensor_wasm_telemetry::ExportStats>,
) -> anyhow::Result<()> {
    let registry = prometheus::Registry::new();
    if let Some(stats) = &trace_export {
        stats.register(&registry)?;
    }
    let (data_dir, store, blob_store) = (
        args.data_dir.clone(),
        args.store.clone(),
        args.blob_store.clone(),
    );
    let pool = PoolOptions {
        max_connections: args.db_max_connections.max(1),
        connect_timeout: Duration::from_millis(args.db_connect_timeout_ms.max(1)),
        statement_timeout: Duration::from_millis(args.db_statement_timeout_ms.max(1)),
        idle_timeout: Duration::from_millis(args.db_idle_timeout_ms),
    };
    let metrics_registry = registry.clone();
    let stores = Arc::new(
        tokio::task::spawn_blocking(move || {
            Stores::open(
                &data_dir,
                store.as_deref(),
                blob_store.as_deref(),
                pool,
                &metrics_registry,
            )
        })
        .await??,
    );
    let metrics = RuntimeMetrics::register(&registry)?;
    let runtime = Runtime::open(args.runtime_config()?, stores.functions.clone(), metrics)
        .context("starting the runtime")?;
    if args.insecure_no_auth && !args.listen.ip().is_loopback() {
        anyhow::bail!(
            "--insecure-no-auth serves without authentication and is refused on the \
             non-loopback address {}; listen on 127.0.0.1 or drop the flag",
            args.listen
        );
    }
    let tenant_metrics = TenantMetrics::register(&registry)?;
    let opening = stores.clone();
    let (tenants, bootstrap) =
        tokio::task::spawn_blocking(move || opening.open_registry(tenant_metrics)).await??;
    let tenants = Arc::new(tenants);
    write_bootstrap_credentials(bootstrap, &args.data_dir)?;
    // Kept for the server's life: functions and tenants changed by other replicas.
    let follower = stores.follow(&runtime, &tenants);
    let queue_settings = args.jobs.queue();
    stores.join(&queue_settings.replica, &tenants).await?;
    for tenant in tenants.list() {
        if let Some(live) = tenants.lookup(&tenant.id) {
            let owned = runtime.functions_of(&tenant.id).len() as u64;
            live.set_usage(Resource::Functions, owned);
        }
    }
    let auth = if args.insecure_no_auth {
        tracing::warn!("serving WITHOUT authentication (--insecure-no-auth)");
        let default = default_tenant(&tenants).context("no default tenant to act as")?;
        AuthMode::Insecure(default)
    } else {
        AuthMode::Enforced
    };
    let api = ApiConfig {
        max_body_bytes: args.max_body_bytes,
        queue_timeout: Duration::from_millis(args.queue_timeout_ms),
        metrics_token: args.metrics_token.clone(),
        jobs_dir: Some(args.data_dir.clone()),
        jobs: args.jobs.limits(),
        body_read_timeout: Duration::from_millis(args.body_read_timeout_ms),
    };
    let tenants_for_policy = tenants.clone();
    let state = AppState::new(runtime.clone(), registry, api, tenants, auth)?;
    if let Some(queue) = stores.job_queue() {
        state.use_job_queue(queue, queue_settings.clone())?;
    }
    if let Some(follower) = &follower {
        // Not ready while the shared store's database cannot be reached (loaded functions
        // still answer; the load balancer sends new traffic elsewhere).
        let connected = follower.connection_state();
        let freshness = follower.freshness();
        let bound = Duration::from_millis(args.policy_stale_ms);
        let fresh = {
            let freshness = freshness.clone();
            Arc::new(move || freshness.within(bound))
        };
        // Behind the change log: no tenant holds the raw-kernel capability here.
        runtime.set_tenant_policy(Arc::new(tensor_wasm_api::RegistryPolicy::following(
            tenants_for_policy,
            fresh,
        )));
        state.set_ready_check(Arc::new(move || {
            if !connected.load(std::sync::atomic::Ordering::Acquire) {
                Err("the shared store's database cannot be reached".into())
            } else if !freshness.within(bound) {
                Err(format!(
                    "the shared store's change log was not read within {} ms \
                     (--policy-stale-ms)",
                    bound.as_millis()
                ))
            } else {
                Ok(())
            }
        }));
    }

    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    let local = listener.local_addr()?;
    tracing::info!(
        addr = %local,
        data_dir = %args.data_dir.display(),
        device = %runtime.device(),
        uvm = runtime.is_uvm_backed(),
        "listening"
    );
    // Machine-readable line for scripts and tests that listen on port 0.
    // A closed stdout must not stop the server: the line is for whoever reads it.
    let _ = writeln!(std::io::stdout(), "tensor-wasm listening on http://{local}");

    let warm = state.clone();
    tokio::task::spawn_blocking(move || {
        let failed = warm.runtime().warm_up();
        if failed > 0 {
            tracing::warn!(
                failed,
                "some functions failed to load; they answer errors when invoked"
            );
        }
        warm.set_ready(true);
        tracing::info!(functions = warm.runtime().functions().len(), "ready");
    });

    let grace = Duration::from_secs(args.shutdown_grace_s);
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let app = tensor_wasm_api::App::new(state.clone());
    let limits = ServeLimits {
        header_read_timeout: Duration::from_millis(args.header_read_timeout_ms),
        max_connections: args.max_connections.max(1),
    };
    // Installed before the first request can be answered.
    let stop_signal = shutdown_signal();
    let mut server = tokio::spawn(async move {
        serve_connections(listener, app, limits, async {
            let _ = stop_rx.await;
        })
        .await
    });
    tokio::select! {
        () = stop_signal => {}
        joined = &mut server => {
            // The server stopped by itself: nothing to drain.
            return joined.context("server task")?.context("serving");
        }
    }
    let deadline = tokio::time::Instant::now() + grace;
    tracing::info!(grace_s = grace.as_secs(), "shutting down");
    state.set_ready(false);
    let _ = stop_tx.send(());
    let served = drain(&state, &mut server, deadline).await;
    let failed = state.fail_unfinished_jobs();
    let leaving = stores.clone();
    let name = queue_settings.replica.clone();
    let _ = tokio::task::spawn_blocking(move || leaving.leave(&name)).await;
    if failed > 0 && stores.job_queue().is_some() {
        tracing::warn!(
            released = failed,
            "jobs still running at the deadline were put back in the shared queue"
        );
    } else if failed > 0 {
        tracing::warn!(
            failed,
            "jobs still unfinished at the deadline were recorded as failed"
        );
    }
    match served {
        Some(joined) => joined.context("server task")?.context("serving")?,
        None => tracing::warn!("in-flight requests did not finish within the grace period"),
    }
    tracing::info!("stopped");
    Ok(())
}

/// Time kept at the end of the grace period for open streams to send their
/// final event and close.
const STREAM_END_MARGIN: Duration = Duration::from_millis(500);

/// Lets in-flight requests, streams and jobs finish until shortly before
/// `deadline`, then ends the streams still open and waits for the server
/// (and jobs) until `deadline`. Returns the server's result if it stopped.
async fn drain<T>(
    state: &AppState,
    server: &mut tokio::task::JoinHandle<T>,
    deadline: tokio::time::Instant,
) -> Option<Result<T, tokio::task::JoinError>> {
    let now = tokio::time::Instant::now();
    let margin = STREAM_END_MARGIN.min((deadline - now) / 2);
    let mut served = None;
    let settled = async {
        let joined = (&mut *server).await;
        served = Some(joined);
        jobs_finished(state).await;
    };
    if tokio::time::timeout_at(deadline - margin, settled)
        .await
        .is_ok()
    {
        return served;
    }
    if served.is_none() {
        tracing::info!("ending the streams still open");
    }
    state.end_streams();
    let settled = async {
        if served.is_none() {
            served = Some((&mut *server).await);
        }
        jobs_finished(state).await;
    };
    let _ = tokio::time::timeout_at(deadline, settled).await;
    served
}

/// Resolves when no asynchronous job is queued or running.
async fn jobs_finished(state: &AppState) {
    while state.unfinished_jobs() > 0 {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// On first start (no admin, no tenant), creates the admin token and the
/// default tenant and writes their secrets to `<data_dir>/credentials.json`
/// (mode 0600, durably: complete or absent after a crash). The secrets exist
/// nowhere else: the stores keep hashes.
fn write_bootstrap_credentials(boot: Option<Bootstrap>, data_dir: &Path) -> anyhow::Result<()> {
    let path = data_dir.join("credentials.json");
    let Some(boot) = boot else {
        if path.exists() {
            tracing::info!(path = %path.display(), "credentials file");
        }
        return Ok(());
    };
    let body = serde_json::json!({
        "admin_token": boot.admin_token,
        "tenant_id": boot.tenant.id,
        "tenant_token": boot.tenant_token,
    });
    let options = tensor_wasm_durable::WriteOptions::new().mode(0o600);
    tensor_wasm_durable::write_file(&path, format!("{body:#}\n").as_bytes(), &options)
        .with_context(|| format!("writing {}", path.display()))?;
    tracing::info!(
        path = %path.display(),
        "first start: admin token and the default tenant's token written (mode 0600)"
    );
    Ok(())
}

/// SIGTERM or SIGINT. The handlers are installed when this is called, not
/// when the future is first polled: call it before the server starts
/// answering, or a signal arriving in between kills the process outright.
fn shutdown_signal() -> impl std::future::Future<Output = ()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate()).ok();
        let int = signal(SignalKind::interrupt()).ok();
        async move {
            let wait = |s: Option<tokio::signal::unix::Signal>| async move {
                match s {
                    Some(mut s) => {
                        s.recv().await;
                    }
                    None => std::future::pending::<()>().await,
                }
            };
            tokio::select! {
                () = wait(term) => {},
                () = wait(int) => {},
            }
        }
    }
    #[cfg(not(unix))]
    async {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// `NAME=PATH` of `--nn-preload`.
fn parse_preload(text: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: expected NAME=PATH"))?;
    if !tensor_wasm_runtime::is_valid_model_name(name) {
        return Err(format!(
            "`{name}`: a model name is 1 to 128 of A-Z a-z 0-9 . _ -"
        ));
    }
    Ok((name.to_owned(), PathBuf::from(path)))
}
