//! `tensor-wasm serve`: configuration flags, logging, startup and graceful shutdown.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use tensor_wasm_api::{router, ApiConfig, AppState};
use tensor_wasm_dispatch::DispatchConfig;
use tensor_wasm_gpu::{open_backend, DeviceChoice};
use tensor_wasm_runtime::{FsFunctionStore, GuestMemory, Runtime, RuntimeConfig, RuntimeMetrics};

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
    /// Seconds in-flight requests get to finish after SIGTERM/SIGINT.
    #[arg(long, env = "TENSOR_WASM_SHUTDOWN_GRACE_S", default_value_t = 30)]
    shutdown_grace_s: u64,
}

fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

impl ServeArgs {
    fn runtime_config(&self) -> anyhow::Result<RuntimeConfig> {
        let backend = open_backend(self.device)
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
            default_timeout: Duration::from_millis(self.default_timeout_ms),
            max_timeout: Duration::from_millis(self.max_timeout_ms),
            default_memory_limit_bytes: self.default_memory_limit_bytes,
            max_memory_limit_bytes: self.max_memory_limit_bytes,
            max_module_bytes: self.max_body_bytes,
            max_instances: self.max_instances,
            fuel_enabled: self.fuel,
            max_output_bytes: self.max_output_bytes,
            ..RuntimeConfig::new(&self.data_dir)
        })
    }
}

/// Runs the server until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logging(args.log_format);
    let tokio = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    tokio.block_on(serve(args))
}

async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let registry = prometheus::Registry::new();
    let store = FsFunctionStore::open(&args.data_dir)
        .with_context(|| format!("opening the data directory {}", args.data_dir.display()))?;
    let metrics = RuntimeMetrics::register(&registry)?;
    let runtime = Runtime::open(args.runtime_config()?, Arc::new(store), metrics)
        .context("starting the runtime")?;
    let api = ApiConfig {
        max_body_bytes: args.max_body_bytes,
        queue_timeout: Duration::from_millis(args.queue_timeout_ms),
    };
    let state = AppState::new(runtime.clone(), registry, api)?;

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
    println!("tensor-wasm listening on http://{local}");

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
    let server = tokio::spawn(async move {
        axum::serve(listener, router(state))
            .with_graceful_shutdown(async {
                let _ = stop_rx.await;
            })
            .await
    });
    shutdown_signal().await;
    tracing::info!(grace_s = grace.as_secs(), "shutting down");
    let _ = stop_tx.send(());
    match tokio::time::timeout(grace, server).await {
        Ok(joined) => joined.context("server task")?.context("serving")?,
        Err(_) => tracing::warn!("in-flight requests did not finish within the grace period"),
    }
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
