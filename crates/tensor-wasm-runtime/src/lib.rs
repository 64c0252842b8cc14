//! The TensorWasm runtime: one wasmtime engine per process, a durable function
//! store, compiled-module caching (in memory and as precompiled artifacts on
//! disk) and invocations under per-function limits (deadline by epoch
//! interruption, memory limit, optional fuel).
//!
//! Two invocation styles exist, chosen per function at deploy time:
//! an *export call* (typed arguments in, typed results out) and a *WASI
//! command* (stdin in, stdout out, exit code).
//!
//! ```
//! use std::sync::Arc;
//! use tensor_wasm_runtime::{DeploySpec, FsFunctionStore, Runtime, RuntimeConfig, RuntimeMetrics};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Arc::new(FsFunctionStore::open(dir.path()).unwrap());
//! let metrics = RuntimeMetrics::register(&prometheus::Registry::new()).unwrap();
//! let runtime = Runtime::open(RuntimeConfig::for_tests(dir.path()), store, metrics).unwrap();
//! let wat = r#"(module (func (export "add") (param i32 i32) (result i32)
//!                local.get 0 local.get 1 i32.add))"#;
//! let f = runtime.deploy(wat.as_bytes(), DeploySpec::export("adder")).unwrap();
//! let out = runtime.invoke_export(&f.record.id, "add", &[1.into(), 2.into()]).unwrap();
//! assert_eq!(out, vec![serde_json::json!(3)]);
//! ```

pub mod abi;
mod accounting;
mod bounded;
mod compile_gate;
pub mod component;
mod component_charge;
mod component_gpu;
mod component_trace;
pub mod component_values;
mod config;
mod engine;
mod error;
mod function_entry;
mod guest_gpu;
pub mod guest_trace;
mod instrument;
mod invocation_state;
mod launch;
pub mod layout;
mod metrics;
mod model_store;
mod nn;
mod outgoing_http;
mod quarantine;
mod runtime;
mod snapshot;
mod storage_quota;
mod store;
pub mod stream;
mod trace;
mod values;
mod wasi_poll;

pub use bounded::{BoundedLru, CacheBounds};
pub use compile_gate::DEFAULT_COMPILES_PER_TENANT;
pub use component::{ClientPresent, ClientWatch};
pub use config::{CacheLimits, ComponentLimits, GuestMemory, RuntimeConfig};
pub use engine::{build_engine, engine_fingerprint, EngineParts, ModuleSource};
pub use error::{Result, RuntimeError};
pub use invocation_state::INLINE_MAX_TABLE_ELEMENTS;
pub use metrics::{Outcome, RuntimeMetrics};
pub use nn::NnConfig;
pub use outgoing_http::Origin;
pub use quarantine::{inspect as inspect_quarantine, QuarantinedRecord, QUARANTINE_DIR};
pub use runtime::{
    is_valid_model_name, CommandOutput, DeploySpec, FunctionInfo, HttpAnswer, HttpBody,
    HttpBodyError, InvocationTarget, ModelSpec, Runtime, TenantPolicy,
};
pub use snapshot::{RestoreMode, MAX_SNAPSHOTS_PER_FUNCTION};
pub use storage_quota::{StorageLedger, StorageReservation};
pub use store::{
    is_valid_function_id, is_valid_snapshot_id, sha256_hex, FsFunctionStore, FunctionLimits,
    FunctionRecord, FunctionStore, InvocationStyle, ModelRecord, SnapshotRecord, WriteBounds,
    RECORD_FORMAT,
};
/// How tenants are separated on a CUDA device (see
/// [`Runtime::set_tenant_gpu_isolation`] and [`RuntimeConfig::gpu_isolation`]).
pub use tensor_wasm_gpu::GpuIsolation;
pub use values::{ExportSignature, WasmType, MAX_DECIMAL_CHARS};
