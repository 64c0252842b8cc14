//! Per-tenant GPU isolation: the [`GpuIsolation`] setting, the [`TenantKey`] every load and
//! launch carries, and the bounded maps of per-tenant lanes a CUDA backend keeps.
//!
//! A *lane* is where one tenant's launches go: a CUDA stream in the device's shared (primary)
//! context under [`GpuIsolation::StreamPerTenant`], or a stream in a context of the tenant's own
//! under [`GpuIsolation::ContextPerTenant`]. The level is chosen per tenant: a [`TenantKey`] may
//! carry one ([`TenantKey::with_isolation`]); a key without one gets the level the backend was
//! opened with. One backend therefore holds lanes of both kinds at once, in two maps (one per
//! kind), each bounded by [`GpuIsolation::lane_capacity`]; past it, the lane used least recently
//! is forgotten (work already submitted to it finishes normally, and kernels loaded in it keep
//! it alive until they are dropped).
//!
//! The CPU backend has no streams or contexts: the key only picks the queue its launches wait in
//! (tenants take turns for its workers); the level a key names is ignored.

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use crate::GpuError;

/// Most tenant streams a CUDA backend keeps under [`GpuIsolation::StreamPerTenant`]. A stream
/// costs little (a driver handle, and one waiting thread here), and recreating one costs
/// microseconds, so the bound is generous: it only keeps a host with very many tenants from
/// accumulating streams and threads without end.
pub const MAX_TENANT_STREAMS: usize = 64;

/// Most tenant contexts a CUDA backend keeps under [`GpuIsolation::ContextPerTenant`]. Each
/// context holds device memory of its own (its size depends on the GPU and driver: measure it on
/// the GPU host, see `docs/ARCHITECTURE.md`) and takes far longer to create than a stream, so a
/// tenant evicted from this map pays that again on its next launch. Size it to the tenants that
/// are active at the same time.
pub const MAX_TENANT_CONTEXTS: usize = 8;

/// How the kernels of different tenants are separated on one GPU.
///
/// A backend is opened with one level ([`crate::open_backend_with`]), the default for every
/// tenant whose [`TenantKey`] names none; a key that names one gets that level instead, so one
/// backend may run some tenants in streams of the shared context and others in contexts of
/// their own.
///
/// Neither level is MIG or MPS: both run every tenant in this one process, on one device.
/// `docs/ARCHITECTURE.md` ("GPU isolation between tenants") weighs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub enum GpuIsolation {
    /// One shared CUDA context (the device's primary context) and a stream per tenant. Cheap;
    /// kernels of different tenants can run concurrently; one address space and one fault
    /// domain for all tenants.
    #[default]
    StreamPerTenant,
    /// A CUDA context per tenant on the same device, with its own modules and a stream. Device
    /// allocations made in one context are not mapped in another, and the driver reports a
    /// kernel fault on the context it happened in; kernels of different contexts are
    /// time-sliced rather than run concurrently, and each context costs device memory.
    ContextPerTenant,
}

impl GpuIsolation {
    /// Most per-tenant lanes a CUDA backend keeps at this level: [`MAX_TENANT_STREAMS`] or
    /// [`MAX_TENANT_CONTEXTS`].
    pub fn lane_capacity(self) -> usize {
        match self {
            GpuIsolation::StreamPerTenant => MAX_TENANT_STREAMS,
            GpuIsolation::ContextPerTenant => MAX_TENANT_CONTEXTS,
        }
    }
}

impl FromStr for GpuIsolation {
    type Err = GpuError;

    /// Parses `stream` or `context` (also `stream-per-tenant`, `context-per-tenant`; ASCII
    /// case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "stream" | "stream-per-tenant" => Ok(GpuIsolation::StreamPerTenant),
            "context" | "context-per-tenant" => Ok(GpuIsolation::ContextPerTenant),
            _ => Err(GpuError::InvalidArgument(format!(
                "unknown GPU isolation {s:?}: expected stream or context"
            ))),
        }
    }
}

impl fmt::Display for GpuIsolation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            GpuIsolation::StreamPerTenant => "stream",
            GpuIsolation::ContextPerTenant => "context",
        })
    }
}

/// Which tenant a kernel load or launch is for: an opaque id (in practice the tenant id) and,
/// optionally, the [`GpuIsolation`] level the tenant's lane must have.
///
/// The backend only compares ids; it never parses them. A key without a level
/// ([`TenantKey::new`]) gets the level the backend was opened with; [`TenantKey::with_isolation`]
/// names one for this tenant (the runtime does so for tenants whose records ask for a level).
/// The default (empty) key stands for "no tenants": a server without tenants runs everything
/// under it. Keys are equal when both id and level are; tenant code loaded for a key may be
/// launched for any key with the same id (it runs in the lane it was loaded in). Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantKey {
    id: Arc<str>,
    isolation: Option<GpuIsolation>,
}

impl TenantKey {
    /// The key of tenant `id`, at the backend's level.
    pub fn new(id: &str) -> Self {
        TenantKey::from(Arc::<str>::from(id))
    }

    /// The same tenant, whose lane must have the level `isolation` whatever the backend's
    /// default.
    #[must_use]
    pub fn with_isolation(mut self, isolation: GpuIsolation) -> Self {
        self.isolation = Some(isolation);
        self
    }

    /// The key as text (the id, without the level).
    pub fn as_str(&self) -> &str {
        &self.id
    }

    /// The level this key asks for; `None`: the backend's.
    pub fn isolation(&self) -> Option<GpuIsolation> {
        self.isolation
    }

    /// Whether both keys name the same tenant, whatever levels they ask for.
    pub fn same_tenant(&self, other: &TenantKey) -> bool {
        self.id == other.id
    }

    /// The same id without a level (an `Arc` clone, no allocation): how lane maps key tenants.
    fn id_only(&self) -> TenantKey {
        TenantKey {
            id: self.id.clone(),
            isolation: None,
        }
    }
}

impl Default for TenantKey {
    fn default() -> Self {
        TenantKey::new("")
    }
}

impl From<&str> for TenantKey {
    fn from(id: &str) -> Self {
        TenantKey::new(id)
    }
}

impl From<String> for TenantKey {
    fn from(id: String) -> Self {
        TenantKey::from(Arc::<str>::from(id))
    }
}

impl From<Arc<str>> for TenantKey {
    fn from(id: Arc<str>) -> Self {
        TenantKey {
            id,
            isolation: None,
        }
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tuple = f.debug_tuple("TenantKey");
        tuple.field(&&*self.id);
        if let Some(isolation) = self.isolation {
            tuple.field(&format_args!("{isolation}"));
        }
        tuple.finish()
    }
}

impl fmt::Display for TenantKey {
    /// The id only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.id)
    }
}

/// What a CUDA backend's map of per-tenant lanes of one kind holds and has done (for metrics
/// and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantLaneStats {
    /// The isolation level the lanes implement (which of the two maps this is).
    pub isolation: GpuIsolation,
    /// Most lanes the map keeps ([`GpuIsolation::lane_capacity`]).
    pub capacity: usize,
    /// Lanes in the map now.
    pub live: usize,
    /// Lanes created since the backend opened.
    pub created: u64,
    /// Lanes forgotten because the map was full.
    pub evicted: u64,
}

/// Per-tenant values (lanes), created lazily, at most `capacity` of them, the least recently
/// used forgotten first.
///
/// Creation runs outside the map's lock (a context takes long to create), under a lock of the
/// tenant's own slot, so concurrent first launches of one tenant create one value and other
/// tenants are not held up. Values that leave the map are dropped outside its lock.
pub(crate) struct TenantLanes<V> {
    capacity: usize,
    state: Mutex<LanesState<V>>,
    created: AtomicU64,
    evicted: AtomicU64,
}

struct LanesState<V> {
    slots: HashMap<TenantKey, Slot<V>>,
    /// Counts lookups; a slot's `last_used` is the count at its latest lookup.
    clock: u64,
}

struct Slot<V> {
    cell: Arc<Mutex<Option<V>>>,
    last_used: u64,
}

impl<V: Clone> TenantLanes<V> {
    pub(crate) fn new(capacity: usize) -> Self {
        Self {
            capacity: capacity.max(1),
            state: Mutex::new(LanesState {
                slots: HashMap::new(),
                clock: 0,
            }),
            created: AtomicU64::new(0),
            evicted: AtomicU64::new(0),
        }
    }

    fn lock_state(&self) -> MutexGuard<'_, LanesState<V>> {
        // Every update of the state is a single insert or remove: a poisoned lock still holds a
        // consistent map.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value of `tenant`, created with `create` if the map has none. A failed creation is
    /// not kept: the next call tries again.
    pub(crate) fn get_or_create(
        &self,
        tenant: &TenantKey,
        create: impl FnOnce() -> Result<V, GpuError>,
    ) -> Result<V, GpuError> {
        let (cell, evicted) = {
            let mut state = self.lock_state();
            state.clock += 1;
            let now = state.clock;
            if let Some(slot) = state.slots.get_mut(tenant) {
                slot.last_used = now;
                (slot.cell.clone(), None)
            } else {
                let evicted = if state.slots.len() >= self.capacity {
                    let oldest = state
                        .slots
                        .iter()
                        .min_by_key(|(_, slot)| slot.last_used)
                        .map(|(key, _)| key.clone());
                    oldest.and_then(|key| state.slots.remove(&key))
                } else {
                    None
                };
                let cell = Arc::new(Mutex::new(None));
                state.slots.insert(
                    tenant.clone(),
                    Slot {
                        cell: cell.clone(),
                        last_used: now,
                    },
                );
                (cell, evicted)
            }
        };
        if evicted.is_some() {
            self.evicted.fetch_add(1, Ordering::Relaxed);
        }
        // Outside the map's lock: dropping a lane closes its stream and may wait for a thread.
        drop(evicted);
        // The slot holds `Some` or `None` whole: a poisoned lock still holds a consistent value.
        let mut value = cell.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(value) = value.as_ref() {
            return Ok(value.clone());
        }
        match create() {
            Ok(created) => {
                self.created.fetch_add(1, Ordering::Relaxed);
                *value = Some(created.clone());
                Ok(created)
            }
            Err(error) => {
                // The slot's lock is never held while taking the map's.
                drop(value);
                // Free the slot (unless it was evicted or replaced meanwhile) so a tenant whose
                // lane cannot be created does not hold a place in the map.
                let mut state = self.lock_state();
                if state
                    .slots
                    .get(tenant)
                    .is_some_and(|slot| Arc::ptr_eq(&slot.cell, &cell))
                {
                    state.slots.remove(tenant);
                }
                Err(error)
            }
        }
    }

    /// Forgets the value of `tenant` if `unwanted` says so (a lane whose context faulted); the
    /// next [`TenantLanes::get_or_create`] for the tenant creates a new one. Returns whether it
    /// was forgotten.
    pub(crate) fn remove_if(&self, tenant: &TenantKey, unwanted: impl FnOnce(&V) -> bool) -> bool {
        let Some(cell) = self
            .lock_state()
            .slots
            .get(tenant)
            .map(|slot| slot.cell.clone())
        else {
            return false;
        };
        // Not under the map's lock: the slot's lock may be held for a whole creation.
        let is_unwanted = cell
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .is_some_and(unwanted);
        if !is_unwanted {
            return false;
        }
        let removed = {
            let mut state = self.lock_state();
            let same = state
                .slots
                .get(tenant)
                .is_some_and(|slot| Arc::ptr_eq(&slot.cell, &cell));
            if same {
                state.slots.remove(tenant)
            } else {
                None
            }
        };
        removed.is_some()
    }

    /// Removes every value from the map and returns those that were created.
    pub(crate) fn take_all(&self) -> Vec<V> {
        let slots = std::mem::take(&mut self.lock_state().slots);
        slots
            .into_values()
            .filter_map(|slot| {
                slot.cell
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .take()
            })
            .collect()
    }

    /// What the map holds and has done.
    pub(crate) fn stats(&self, isolation: GpuIsolation) -> TenantLaneStats {
        TenantLaneStats {
            isolation,
            capacity: self.capacity,
            live: self.lock_state().slots.len(),
            created: self.created.load(Ordering::Relaxed),
            evicted: self.evicted.load(Ordering::Relaxed),
        }
    }
}

/// The lanes of a backend, of both kinds: stream lanes and context lanes in maps of their own
/// (bounded by [`MAX_TENANT_STREAMS`] and [`MAX_TENANT_CONTEXTS`]), a tenant's level taken from
/// its [`TenantKey`] or, when the key names none, the backend's default.
///
/// Within a map a tenant is known by its id alone, so a key with a level equal to the default
/// and a key without one reach the same lane. A tenant whose level changes gets a lane of the
/// other kind on its next use; the lane of the old kind is not closed then, only forgotten like
/// any other once its map is full (work on it finishes, and kernels loaded in it keep it).
pub(crate) struct TenantLaneMap<V> {
    default: GpuIsolation,
    streams: TenantLanes<V>,
    contexts: TenantLanes<V>,
}

impl<V: Clone> TenantLaneMap<V> {
    /// Empty maps; `default` is the level of keys that name none.
    pub(crate) fn new(default: GpuIsolation) -> Self {
        Self::with_capacities(default, MAX_TENANT_STREAMS, MAX_TENANT_CONTEXTS)
    }

    pub(crate) fn with_capacities(default: GpuIsolation, streams: usize, contexts: usize) -> Self {
        Self {
            default,
            streams: TenantLanes::new(streams),
            contexts: TenantLanes::new(contexts),
        }
    }

    /// The level of `tenant`'s lane: the one its key names, else the default.
    pub(crate) fn level_of(&self, tenant: &TenantKey) -> GpuIsolation {
        tenant.isolation().unwrap_or(self.default)
    }

    fn map(&self, level: GpuIsolation) -> &TenantLanes<V> {
        match level {
            GpuIsolation::StreamPerTenant => &self.streams,
            GpuIsolation::ContextPerTenant => &self.contexts,
        }
    }

    /// The lane of `tenant` at its level (returned with it), created with `create(level)` if the
    /// map of that level has none (see [`TenantLanes::get_or_create`]).
    pub(crate) fn get_or_create(
        &self,
        tenant: &TenantKey,
        create: impl FnOnce(GpuIsolation) -> Result<V, GpuError>,
    ) -> Result<(V, GpuIsolation), GpuError> {
        let level = self.level_of(tenant);
        let lane = self
            .map(level)
            .get_or_create(&tenant.id_only(), || create(level))?;
        Ok((lane, level))
    }

    /// Forgets `tenant`'s lane at its level if `unwanted` says so (see
    /// [`TenantLanes::remove_if`]).
    pub(crate) fn remove_if(&self, tenant: &TenantKey, unwanted: impl FnOnce(&V) -> bool) -> bool {
        self.map(self.level_of(tenant))
            .remove_if(&tenant.id_only(), unwanted)
    }

    /// Removes every lane of both kinds and returns those that were created.
    pub(crate) fn take_all(&self) -> Vec<V> {
        let mut all = self.streams.take_all();
        all.extend(self.contexts.take_all());
        all
    }

    /// What the map of lanes at `level` holds and has done.
    pub(crate) fn stats(&self, level: GpuIsolation) -> TenantLaneStats {
        self.map(level).stats(level)
    }
}

#[cfg(test)]
mod tests;
