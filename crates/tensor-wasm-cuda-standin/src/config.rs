//! The stand-in's settings from the environment (fault injection, memory size, schedule,
//! trace file), read once, and the call trace.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::sync::{Mutex, OnceLock};

use tensor_wasm_ptx_emu::Schedule;

/// Where an injected sticky fault is reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FaultAt {
    /// By the launch itself.
    Launch,
    /// By the next `cuEventRecord` in the context.
    EventRecord,
    /// By the next synchronization (event, stream or context) in the context.
    Sync,
}

/// Settings read from `TENSOR_WASM_STANDIN_*`.
#[derive(Debug)]
pub(crate) struct Config {
    pub fault: Option<FaultAt>,
    pub fault_at: u64,
    pub fault_kernel: Option<String>,
    pub oom: bool,
    pub memory_bytes: u64,
    pub invalid_ptx: bool,
    pub pageable: bool,
    pub schedule: Schedule,
    /// Most instructions one thread of a launch runs before the launch times out.
    pub step_limit: u64,
    /// What `cuDriverGetVersion` reports (CUDA 13.0: 13000).
    pub driver_version: i32,
    trace: Option<Mutex<File>>,
}

fn var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|value| !value.is_empty())
}

fn flag(name: &str) -> bool {
    var(name).is_some_and(|value| value != "0")
}

/// The settings, read on first use.
pub(crate) fn config() -> &'static Config {
    static CONFIG: OnceLock<Config> = OnceLock::new();
    CONFIG.get_or_init(|| {
        let fault = var("TENSOR_WASM_STANDIN_FAULT").map(|at| match at.as_str() {
            "launch" => FaultAt::Launch,
            "event-record" => FaultAt::EventRecord,
            "sync" => FaultAt::Sync,
            other => {
                panic!("TENSOR_WASM_STANDIN_FAULT={other}: expected launch, event-record or sync")
            }
        });
        let schedule = match var("TENSOR_WASM_STANDIN_SCHEDULE").as_deref() {
            None | Some("in-order") => Schedule::InOrder,
            Some("reversed") => Schedule::Reversed,
            Some(seed) => Schedule::Random(seed.parse().unwrap_or_else(|_| {
                panic!("TENSOR_WASM_STANDIN_SCHEDULE={seed}: expected in-order, reversed or a seed")
            })),
        };
        let trace = var("TENSOR_WASM_STANDIN_TRACE").map(|path| {
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .unwrap_or_else(|error| panic!("TENSOR_WASM_STANDIN_TRACE={path}: {error}"));
            Mutex::new(file)
        });
        Config {
            fault,
            fault_at: var("TENSOR_WASM_STANDIN_FAULT_AT")
                .and_then(|n| n.parse().ok())
                .unwrap_or(1),
            fault_kernel: var("TENSOR_WASM_STANDIN_FAULT_KERNEL"),
            oom: flag("TENSOR_WASM_STANDIN_OOM"),
            memory_bytes: var("TENSOR_WASM_STANDIN_MEMORY_BYTES")
                .and_then(|n| n.parse().ok())
                .unwrap_or(16 << 30),
            invalid_ptx: flag("TENSOR_WASM_STANDIN_INVALID_PTX"),
            pageable: flag("TENSOR_WASM_STANDIN_PAGEABLE"),
            schedule,
            step_limit: var("TENSOR_WASM_STANDIN_STEP_LIMIT")
                .and_then(|n| n.parse().ok())
                .unwrap_or(1 << 22),
            driver_version: var("TENSOR_WASM_STANDIN_DRIVER_VERSION")
                .and_then(|n| n.parse().ok())
                .unwrap_or(13000),
            trace,
        }
    })
}

/// Appends `function result` to the trace file, if one is set.
pub(crate) fn trace(function: &str, result: u32) {
    if let Some(file) = &config().trace {
        let mut file = file.lock().unwrap_or_else(|poison| poison.into_inner());
        // A trace line that cannot be written is lost; the driver call itself is unaffected.
        let _ = writeln!(file, "{function} {result}");
    }
}
