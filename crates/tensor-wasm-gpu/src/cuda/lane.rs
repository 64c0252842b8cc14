//! Per-tenant lanes: a stream (in the shared context, or in a context of the tenant's own) and
//! the thread that waits for the launches on it; how the backend finds, opens and replaces a
//! tenant's lane, and which context a tenant's programs load into.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;

use cudarc::driver::{CudaContext, CudaStream, DriverError};

use super::events::{is_sticky, wait_for_launches, PendingLaunch};
use super::modules::ContextState;
use super::probe::catching_driver_panics;
use super::CudaBackend;
use crate::{GpuError, GpuIsolation, TenantKey};

/// Where one tenant's launches go: a stream (in the shared context or in the tenant's own, as
/// the isolation level says) and the thread that waits for the launches on it.
///
/// The thread holds the context and the stream until it has reported every launch sent to it,
/// so a lane that leaves the tenant map (or a backend that is dropped) never cuts a launch short.
pub(super) struct Lane {
    pub(super) context: Arc<ContextState>,
    pub(super) stream: Arc<CudaStream>,
    /// The way to the waiter thread; `None` once closed. Held while submitting, so launches
    /// reach the waiter in the order they were queued on the stream.
    pub(super) to_waiter: Mutex<Option<Sender<PendingLaunch>>>,
    waiter: Mutex<Option<JoinHandle<()>>>,
    /// Set by the waiter when a kernel on this lane failed while running. Such errors (an
    /// illegal address, a trap) are sticky: the context is unusable from then on.
    faulted: Arc<AtomicBool>,
}

impl Lane {
    /// A new stream in `context` and its waiter thread.
    fn open(context: Arc<ContextState>, thread_name: String) -> Result<Arc<Self>, GpuError> {
        let stream = context
            .ctx
            .new_stream()
            .map_err(|error| GpuError::cuda("creating a tenant stream", error))?;
        let (to_waiter, from_launches) = mpsc::channel();
        let faulted = Arc::new(AtomicBool::new(false));
        let waiter = {
            let context = context.clone();
            let stream = stream.clone();
            let faulted = faulted.clone();
            std::thread::Builder::new()
                .name(thread_name)
                .spawn(move || {
                    wait_for_launches(&context, &from_launches, &faulted);
                    // Every launch on the stream has been reported: it may be destroyed now.
                    drop(stream);
                })
                .map_err(|error| {
                    GpuError::NotAvailable(format!("cannot start a CUDA event thread: {error}"))
                })?
        };
        Ok(Arc::new(Self {
            context,
            stream,
            to_waiter: Mutex::new(Some(to_waiter)),
            waiter: Mutex::new(Some(waiter)),
            faulted,
        }))
    }

    /// Whether a kernel on this lane failed while running.
    fn faulted(&self) -> bool {
        self.faulted.load(Ordering::Acquire)
    }

    /// Records a driver error met while submitting work to this lane: a sticky one means the
    /// lane's context is unusable, exactly as when the waiter sees a kernel fail, so that a
    /// context lane is replaced on the tenant's next use.
    pub(super) fn note_submit_error(&self, error: &DriverError) {
        if is_sticky(error) && !self.faulted.swap(true, Ordering::AcqRel) {
            tracing::error!(
                // The code's name, not the driver's text: no driver call on this path.
                error = ?error.0,
                primary_context = self.context.ctx.is_primary(),
                "the driver reported a kernel fault while submitting work; CUDA keeps such \
                 errors for the whole context, so its later work fails too"
            );
        }
    }

    /// Closes the way to the waiter thread, which reports the launches still queued and ends;
    /// with `join`, waits for that.
    pub(super) fn close(&self, join: bool) {
        // Both locks hold an `Option` replaced whole: a poisoned lock still holds a valid one.
        self.to_waiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        let waiter = self
            .waiter
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let (true, Some(waiter)) = (join, waiter) {
            if waiter.thread().id() != std::thread::current().id() {
                let _ = waiter.join();
            }
        }
    }
}

impl Drop for Lane {
    fn drop(&mut self) {
        // Detach the thread rather than wait for it: the drop may happen on a launching thread
        // of another tenant (an eviction), which must not wait for this tenant's kernels.
        self.close(false);
    }
}

impl CudaBackend {
    /// The lane of `tenant`, created on first use at the tenant's level: a stream in the shared
    /// context, or a new context of the tenant's own with a stream in it.
    ///
    /// A context lane whose context a kernel fault made unusable is replaced by a new one (a new
    /// context). A stream lane has nothing to replace: the fault broke the one shared context
    /// (see `docs/ARCHITECTURE.md`).
    pub(super) fn lane(&self, tenant: &TenantKey) -> Result<Arc<Lane>, GpuError> {
        let open = |level| self.open_lane(tenant, level);
        let (lane, level) = self.lanes.get_or_create(tenant, open)?;
        if level == GpuIsolation::ContextPerTenant && lane.faulted() {
            if self
                .lanes
                .remove_if(tenant, |known| Arc::ptr_eq(known, &lane))
            {
                tracing::info!(
                    tenant = tenant.as_str(),
                    "replacing the tenant's CUDA context after a kernel fault"
                );
            }
            return Ok(self.lanes.get_or_create(tenant, open)?.0);
        }
        Ok(lane)
    }

    /// A new lane for `tenant` at `level`.
    fn open_lane(&self, tenant: &TenantKey, level: GpuIsolation) -> Result<Arc<Lane>, GpuError> {
        catching_driver_panics(|| {
            let context = match level {
                GpuIsolation::StreamPerTenant => self.shared.clone(),
                GpuIsolation::ContextPerTenant => {
                    let ctx = CudaContext::new_non_primary(self.ordinal, 0).map_err(|error| {
                        GpuError::cuda("creating a context for a tenant", error)
                    })?;
                    ContextState::new(ctx)?
                }
            };
            let number = self.next_lane.fetch_add(1, Ordering::Relaxed);
            let lane = Lane::open(
                context,
                format!("tensor-wasm-cuda{}-lane{number}", self.ordinal),
            )?;
            tracing::debug!(
                tenant = tenant.as_str(),
                isolation = %level,
                "GPU lane created"
            );
            Ok(lane)
        })
    }

    /// The context `tenant`'s programs load into: the shared one for a tenant at
    /// `StreamPerTenant` (no lane needed), else the tenant's own.
    pub(super) fn program_context(
        &self,
        tenant: &TenantKey,
    ) -> Result<Arc<ContextState>, GpuError> {
        match self.lanes.level_of(tenant) {
            GpuIsolation::StreamPerTenant => Ok(self.shared.clone()),
            GpuIsolation::ContextPerTenant => Ok(self.lane(tenant)?.context.clone()),
        }
    }
}
