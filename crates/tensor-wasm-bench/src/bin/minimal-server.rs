//! Minimal reference servers: axum + wasmtime and nothing else, the peers that
//! `scripts/http-throughput.sh` compares `tensor-wasm serve` against.
//!
//! One engine, one `InstancePre` of one module, and one route,
//! `POST /functions/{id}/invoke`, taking the same JSON body as TensorWasm
//! (`{"export": "add", "args": [1, 2]}`) and answering the same shape
//! (`{"results": [3]}`). Each call creates a store, instantiates and calls. No
//! metrics, no limits, no function store, no request ids: every id names the
//! one module. Two modes:
//!
//! - `--floor` (the honest floor, the peer of the headline ratio): the
//!   server's own engine configuration (`tensor_wasm_runtime::build_engine`
//!   with the production defaults of `RuntimeConfig::new`: the pooling
//!   allocator with the same slots and memory cap, epoch interruption), an
//!   epoch thread at the server's tick and a deadline per store, the call
//!   inline on the async worker thread, Tokio's default worker count (one per
//!   core, as `tensor-wasm serve`).
//! - without it (the older, weaker peer, kept for continuity): a plain
//!   pooling engine without epochs, each call in `spawn_blocking`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context as _;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser;
use serde::Deserialize;
use serde_json::{json, Value};
use tensor_wasm_bench::{raw_pooling_engine, ADD_WAT};
use wasmtime::{Engine, InstancePre, Linker, Module, Store};

/// Minimal axum + wasmtime server for throughput comparisons.
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8090")]
    listen: SocketAddr,
    /// Module to serve (WAT or wasm); the built-in `add` module when unset.
    #[arg(long)]
    module: Option<PathBuf>,
    /// Pooling-allocator slots (same default as `tensor-wasm serve`).
    #[arg(long, default_value_t = 256)]
    max_instances: u32,
    /// Largest linear memory of a slot in bytes (same default as `tensor-wasm serve`).
    #[arg(long, default_value_t = 1 << 30)]
    max_memory_bytes: usize,
    /// The honest floor (see the module documentation); `--max-instances` and
    /// `--max-memory-bytes` are then the server's defaults.
    #[arg(long)]
    floor: bool,
}

struct App {
    engine: Engine,
    pre: InstancePre<()>,
    /// With `--floor`: the call runs inline, under this epoch deadline.
    floor_deadline_ticks: Option<u64>,
}

/// Calls `export(a, b)` of a fresh instance.
fn call(app: &App, export: &str, a: i32, b: i32) -> wasmtime::Result<i32> {
    let mut store = Store::new(&app.engine, ());
    if let Some(ticks) = app.floor_deadline_ticks {
        store.set_epoch_deadline(ticks);
    }
    let instance = app.pre.instantiate(&mut store)?;
    let f = instance.get_typed_func::<(i32, i32), i32>(&mut store, export)?;
    f.call(&mut store, (a, b))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CallRequest {
    export: String,
    #[serde(default)]
    args: Vec<Value>,
}

fn error(status: StatusCode, message: impl std::fmt::Display) -> Response {
    (status, Json(json!({ "error": message.to_string() }))).into_response()
}

fn i32_arg(value: &Value) -> Option<i32> {
    value.as_i64().and_then(|v| i32::try_from(v).ok())
}

async fn invoke(State(app): State<Arc<App>>, Path(_id): Path<String>, body: Bytes) -> Response {
    let request: CallRequest = match serde_json::from_slice(&body) {
        Ok(request) => request,
        Err(e) => return error(StatusCode::BAD_REQUEST, format!("invalid JSON: {e}")),
    };
    let (a, b) = match request.args.as_slice() {
        [a, b] => match (i32_arg(a), i32_arg(b)) {
            (Some(a), Some(b)) => (a, b),
            _ => return error(StatusCode::BAD_REQUEST, "arguments must be i32"),
        },
        _ => return error(StatusCode::BAD_REQUEST, "expected 2 arguments"),
    };
    let joined = if app.floor_deadline_ticks.is_some() {
        Ok(call(&app, &request.export, a, b))
    } else {
        tokio::task::spawn_blocking(move || call(&app, &request.export, a, b)).await
    };
    match joined {
        Ok(Ok(n)) => Json(json!({ "results": [n] })).into_response(),
        Ok(Err(e)) => error(StatusCode::BAD_REQUEST, format!("{e:#}")),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e),
    }
}

/// wasmtime's error type is its own; this keeps its message chain.
fn wt<T>(result: wasmtime::Result<T>) -> anyhow::Result<T> {
    result.map_err(|e| anyhow::anyhow!("{e:#}"))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (engine, floor_deadline_ticks) = if args.floor {
        let data = std::env::temp_dir().join("tensor-wasm-floor-server");
        let config = tensor_wasm_runtime::RuntimeConfig::new(data);
        let engine = tensor_wasm_runtime::build_engine(&config)
            .map_err(|e| anyhow::anyhow!("{e}"))?
            .engine;
        // The server's epoch thread: the epoch advances every tick of wall time.
        let ticking = engine.clone();
        let tick = config.epoch_tick;
        std::thread::spawn(move || loop {
            std::thread::sleep(tick);
            ticking.increment_epoch();
        });
        let ticks = config.default_timeout.as_nanos() / tick.as_nanos().max(1);
        (engine, Some(u64::try_from(ticks).unwrap_or(u64::MAX)))
    } else {
        let engine = wt(raw_pooling_engine(
            args.max_instances,
            args.max_memory_bytes,
        ))?;
        (engine, None)
    };
    let module = match &args.module {
        Some(path) => {
            let bytes =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            wt(Module::new(&engine, bytes))?
        }
        None => wt(Module::new(&engine, ADD_WAT))?,
    };
    let pre = wt(Linker::new(&engine).instantiate_pre(&module))?;
    let app = Arc::new(App {
        engine,
        pre,
        floor_deadline_ticks,
    });
    let router = Router::new()
        .route("/functions/{id}/invoke", post(invoke))
        .with_state(app);
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("binding {}", args.listen))?;
    println!("listening on http://{}", listener.local_addr()?);
    axum::serve(listener, router).await?;
    Ok(())
}
