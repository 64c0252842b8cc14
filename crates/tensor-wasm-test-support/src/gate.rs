//! A function store that holds chosen writes until a test lets them go
//! ([`GatedStore`]), so a test can stop a deploy or a delete at a known point
//! and act while it waits: disconnect its client, delete its tenant.

use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::Duration;

use tensor_wasm_runtime::{FunctionRecord, FunctionStore, ModelRecord, Result, SnapshotRecord};

use crate::wait::wait_until_async;

/// A barrier that is open or closed; callers that arrive while it is closed
/// wait until it opens, and are counted while they wait.
#[derive(Debug, Default)]
pub struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct GateState {
    closed: bool,
    waiting: usize,
}

impl Gate {
    /// Makes callers arriving from now on wait, until [`Gate::open`] or the
    /// returned guard's drop (so a failing test never leaves a thread parked).
    #[must_use = "the gate opens again when the guard is dropped"]
    pub fn close(self: &Arc<Self>) -> Closed {
        self.lock().closed = true;
        Closed(Arc::clone(self))
    }

    /// Lets every waiting caller (and every later one) through.
    pub fn open(&self) {
        self.lock().closed = false;
        self.changed.notify_all();
    }

    /// How many callers wait at the gate now.
    pub fn waiting(&self) -> usize {
        self.lock().waiting
    }

    /// Waits (bounded, without blocking the async runtime) until `n`
    /// callers wait at the gate.
    pub async fn wait_for_waiting(&self, n: usize) {
        wait_until_async(
            Duration::from_secs(30),
            "callers waiting at the gate",
            || self.waiting() >= n,
        )
        .await;
    }

    fn pass(&self) {
        let mut state = self.lock();
        if !state.closed {
            return;
        }
        state.waiting += 1;
        self.changed.notify_all();
        while state.closed {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
        state.waiting -= 1;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// A [`FunctionStore`] over another whose `put_module` and `delete_function`
/// first pass their [`Gate`]s (open unless a test closes them).
pub struct GatedStore {
    inner: Arc<dyn FunctionStore>,
    /// Passed by every `put_module` (a deploy about to store its module).
    pub put_module: Arc<Gate>,
    /// Passed by every `delete_function` (a delete about to remove a record).
    pub delete_function: Arc<Gate>,
}

impl GatedStore {
    /// Gates (both open) over `inner`.
    pub fn new(inner: Arc<dyn FunctionStore>) -> Self {
        GatedStore {
            inner,
            put_module: Arc::default(),
            delete_function: Arc::default(),
        }
    }
}

/// Opens its [`Gate`] when dropped.
#[derive(Debug)]
pub struct Closed(Arc<Gate>);

impl Drop for Closed {
    fn drop(&mut self) {
        self.0.open();
    }
}

impl FunctionStore for GatedStore {
    fn put_model(&self, record: &ModelRecord, bytes: &[u8]) -> Result<()> {
        self.inner.put_model(record, bytes)
    }

    fn model_bytes(&self, sha256: &str) -> Result<Vec<u8>> {
        self.inner.model_bytes(sha256)
    }

    fn models(&self) -> Result<Vec<ModelRecord>> {
        self.inner.models()
    }

    fn delete_model(&self, tenant: &str, name: &str) -> Result<bool> {
        self.inner.delete_model(tenant, name)
    }

    fn put_module(&self, bytes: &[u8]) -> Result<String> {
        self.put_module.pass();
        self.inner.put_module(bytes)
    }

    fn module(&self, sha256: &str) -> Result<Vec<u8>> {
        self.inner.module(sha256)
    }

    fn put_function(&self, record: &FunctionRecord) -> Result<()> {
        self.inner.put_function(record)
    }

    fn delete_function(&self, id: &str) -> Result<bool> {
        self.delete_function.pass();
        self.inner.delete_function(id)
    }

    fn functions(&self) -> Result<Vec<FunctionRecord>> {
        self.inner.functions()
    }

    fn put_snapshot(&self, record: &SnapshotRecord, pieces: &[&[u8]]) -> Result<()> {
        self.inner.put_snapshot(record, pieces)
    }

    fn snapshot_bytes(&self, function_id: &str, snapshot_id: &str) -> Result<Option<Vec<u8>>> {
        self.inner.snapshot_bytes(function_id, snapshot_id)
    }

    fn snapshots(&self, function_id: &str) -> Result<Vec<SnapshotRecord>> {
        self.inner.snapshots(function_id)
    }

    fn delete_snapshot(&self, function_id: &str, snapshot_id: &str) -> Result<bool> {
        self.inner.delete_snapshot(function_id, snapshot_id)
    }

    fn delete_snapshots(&self, function_id: &str) -> Result<()> {
        self.inner.delete_snapshots(function_id)
    }
}
