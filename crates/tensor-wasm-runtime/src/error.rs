//! Errors of the runtime boundary: deploy, lookup and invocation failures.

use std::path::PathBuf;

/// Everything that can go wrong in [`crate::Runtime`].
///
/// Variants split along who is at fault: the caller (bad module, bad arguments,
/// unknown id), the guest (trap, timeout, limits) or the host (storage, engine).
/// The HTTP layer maps each variant to a status code and a stable error code.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The module bytes are not valid WebAssembly (binary or text) or do not compile.
    #[error("invalid module: {0}")]
    InvalidModule(String),
    /// The deploy request is well-formed but asks for something not allowed.
    #[error("invalid function config: {0}")]
    InvalidConfig(String),
    /// The module is valid WebAssembly but uses a feature this server refuses
    /// (more than one linear memory).
    #[error("unsupported feature: {0}")]
    UnsupportedFeature(String),
    /// No function with this id exists.
    #[error("function {0} not found")]
    FunctionNotFound(String),
    /// The tenant has no model of this name.
    #[error("model `{0}` not found")]
    ModelNotFound(String),
    /// The uploaded model is not an ONNX model this server runs (the message has the
    /// executor's code and names the operator, tensor or field).
    #[error("invalid model: {0}")]
    InvalidOnnx(String),
    /// A capability this server does not have yet (the message says which).
    #[error("not implemented: {0}")]
    NotImplemented(String),
    /// The export-call request names an export the module does not have.
    #[error("unknown export `{0}`")]
    UnknownExport(String),
    /// Arguments do not match the export's signature.
    #[error("invalid arguments: {0}")]
    InvalidArguments(String),
    /// The invocation style of the request does not match the function's.
    #[error("wrong invocation style: {0}")]
    WrongStyle(String),
    /// The guest trapped (unreachable, out-of-bounds access, stack overflow, ...).
    #[error("guest trapped: {0}")]
    Trap(String),
    /// The invocation ran past its deadline and was interrupted.
    #[error("invocation exceeded its deadline of {timeout_ms} ms")]
    Timeout { timeout_ms: u64 },
    /// The guest tried to grow its memory (or tables) past the function's limit.
    #[error("{0}")]
    MemoryLimit(String),
    /// A component held more host resources, or a bigger `wasi:http` fields resource, than
    /// the server allows one invocation (`ComponentLimits`).
    #[error("resource limit exceeded: {0}")]
    ResourceLimit(String),
    /// The guest used up its fuel budget.
    #[error("invocation ran out of fuel (budget {0})")]
    FuelExhausted(u64),
    /// A WASI command wrote more to stdout than the output cap allows.
    #[error("output exceeded the cap of {0} bytes")]
    OutputTooLarge(usize),
    /// The client of a streaming invocation disconnected and the guest kept
    /// streaming: the invocation was cancelled.
    #[error("the client disconnected; the invocation was cancelled")]
    ClientGone,
    /// No snapshot with this id exists for the function.
    #[error("snapshot {0} not found")]
    SnapshotNotFound(String),
    /// The function cannot be snapshotted (style, table mutation, reference globals ...).
    #[error("snapshot not possible: {0}")]
    SnapshotUnsupported(String),
    /// A stored snapshot failed validation (header, version, module hash, checksums).
    #[error("snapshot {id} is unusable: {message}")]
    SnapshotCorrupt { id: String, message: String },
    /// The request conflicts with the current state (a snapshot in use, a cap reached).
    #[error("{0}")]
    Conflict(String),
    /// The function's tenant does not hold the raw-kernel capability (never
    /// granted, or revoked): no deploy asking for it, no new instance of a
    /// raw-kernel function of that tenant.
    #[error("{0}")]
    RawPtxNotGranted(String),
    /// The tenant was deleted ([`crate::Runtime::retire_tenant`]): nothing
    /// new may be created for it.
    #[error("tenant {0} was deleted")]
    TenantRetired(String),
    /// The tenant's modules and snapshots would take more than its stored-bytes quota.
    #[error(
        "the tenant's stored-bytes quota is {limit} bytes; {used} are in use and the request \
         needs {requested} more (delete functions or snapshots first)"
    )]
    StorageQuotaExceeded {
        limit: u64,
        used: u64,
        requested: u64,
    },
    /// Every instance slot, or the kernel dispatcher and its queue, is full.
    #[error("{0}")]
    Busy(String),
    /// The durable store failed.
    #[error("storage error at {path}: {source}")]
    Storage {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// The tenant already has as many functions as its `max_functions` quota allows, counted
    /// by the shared store in the write's transaction.
    #[error(
        "quota max_functions exceeded: tenant {tenant} has reached its limit of {limit} functions"
    )]
    FunctionQuotaExceeded { tenant: String, limit: u64 },
    /// A shared store (PostgreSQL, object storage) cannot be reached; retrying later may
    /// succeed. Nothing was written that the failed call acknowledged.
    #[error("the shared store is unavailable: {0}")]
    StoreUnavailable(String),
    /// A stored record could not be decoded.
    #[error("corrupt record at {path}: {message}")]
    CorruptRecord { path: PathBuf, message: String },
    /// The engine failed for a reason that is not the guest's fault.
    #[error("engine error: {0}")]
    Engine(String),
}

impl RuntimeError {
    pub(crate) fn storage(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        RuntimeError::Storage {
            path: path.into(),
            source,
        }
    }
}

/// Why an instance of a raw-kernel function was not created (its tenant's
/// capability is withheld); carried through wasmtime's error to `classify`.
#[derive(Debug)]
pub(crate) struct RawPtxWithheld(pub(crate) String);

impl std::fmt::Display for RawPtxWithheld {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "tenant {} does not hold the raw-kernel capability (the admin grants it with \
             PATCH /tenants/{{id}} {{\"raw_ptx\": true}}); its raw-kernel functions do not start",
            self.0
        )
    }
}

impl std::error::Error for RawPtxWithheld {}

/// Result alias of this crate.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Longest guest error message passed back to callers.
const MAX_MESSAGE: usize = 4096;

/// Cuts a `message` longer than [`MAX_MESSAGE`] bytes at a character
/// boundary and marks it ` [truncated]`.
pub(crate) fn truncate_message(mut message: String) -> String {
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
        message.push_str(" [truncated]");
    }
    message
}
