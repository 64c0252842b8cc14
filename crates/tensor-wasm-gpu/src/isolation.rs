//! Per-tenant GPU isolation: the [`GpuIsolation`] setting, the [`TenantKey`] every load and
//! launch carries, and the bounded map of per-tenant lanes a CUDA backend keeps.
//!
//! A *lane* is where one tenant's launches go: a CUDA stream in the device's shared (primary)
//! context under [`GpuIsolation::StreamPerTenant`], or a stream in a context of the tenant's own
//! under [`GpuIsolation::ContextPerTenant`]. Lanes are created on a tenant's first load or
//! launch and kept in a map bounded by [`GpuIsolation::lane_capacity`]; past it, the lane used
//! least recently is forgotten (work already submitted to it finishes normally, and kernels
//! loaded in it keep it alive until they are dropped).
//!
//! The CPU backend has no streams or contexts: it accepts the key and ignores it.

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
/// Neither level is MIG or MPS: both run every tenant in this one process, on one device.
/// `docs/ARCHITECTURE.md` ("GPU isolation between tenants") weighs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
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

/// Which tenant a kernel load or launch is for: an opaque key, in practice the tenant id.
///
/// The backend only compares keys; it never parses them. The default (empty) key stands for
/// "no tenants": a server without tenants runs everything under it. Cheap to clone.
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TenantKey(Arc<str>);

impl TenantKey {
    /// The key of tenant `id`.
    pub fn new(id: &str) -> Self {
        TenantKey(Arc::from(id))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for TenantKey {
    fn default() -> Self {
        TenantKey(Arc::from(""))
    }
}

impl From<&str> for TenantKey {
    fn from(id: &str) -> Self {
        TenantKey::new(id)
    }
}

impl From<String> for TenantKey {
    fn from(id: String) -> Self {
        TenantKey(Arc::from(id))
    }
}

impl From<Arc<str>> for TenantKey {
    fn from(id: Arc<str>) -> Self {
        TenantKey(id)
    }
}

impl fmt::Debug for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("TenantKey").field(&&*self.0).finish()
    }
}

impl fmt::Display for TenantKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a CUDA backend's map of per-tenant lanes holds and has done (for metrics and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TenantLaneStats {
    /// The isolation level the lanes implement.
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

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Barrier;

    use super::*;

    /// A lane stand-in: which creation made it.
    type Lane = Arc<usize>;

    fn counter() -> (
        Arc<AtomicUsize>,
        impl Fn() -> Result<Lane, GpuError> + Clone,
    ) {
        let made = Arc::new(AtomicUsize::new(0));
        let make = {
            let made = made.clone();
            move || Ok(Arc::new(made.fetch_add(1, Ordering::SeqCst)))
        };
        (made, make)
    }

    fn key(id: &str) -> TenantKey {
        TenantKey::new(id)
    }

    #[test]
    fn lanes_are_created_lazily_once_per_tenant() {
        let lanes = TenantLanes::new(4);
        let (made, make) = counter();
        assert_eq!(
            made.load(Ordering::SeqCst),
            0,
            "nothing before the first use"
        );
        assert_eq!(lanes.stats(GpuIsolation::StreamPerTenant).live, 0);
        let first = lanes.get_or_create(&key("tn-a"), make.clone()).unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 1);
        for _ in 0..10 {
            let again = lanes.get_or_create(&key("tn-a"), make.clone()).unwrap();
            assert!(Arc::ptr_eq(&first, &again), "same tenant, same lane");
        }
        assert_eq!(made.load(Ordering::SeqCst), 1);
        let stats = lanes.stats(GpuIsolation::StreamPerTenant);
        assert_eq!((stats.live, stats.created, stats.evicted), (1, 1, 0));
    }

    #[test]
    fn different_tenants_get_different_lanes() {
        let lanes = TenantLanes::new(4);
        let (_, make) = counter();
        let a = lanes.get_or_create(&key("tn-a"), make.clone()).unwrap();
        let b = lanes.get_or_create(&key("tn-b"), make.clone()).unwrap();
        let none = lanes
            .get_or_create(&TenantKey::default(), make.clone())
            .unwrap();
        assert!(!Arc::ptr_eq(&a, &b));
        assert!(!Arc::ptr_eq(&a, &none) && !Arc::ptr_eq(&b, &none));
        assert!(Arc::ptr_eq(
            &a,
            &lanes.get_or_create(&key("tn-a"), make.clone()).unwrap()
        ));
        assert!(Arc::ptr_eq(
            &b,
            &lanes.get_or_create(&key("tn-b"), make).unwrap()
        ));
        assert_eq!(lanes.stats(GpuIsolation::ContextPerTenant).live, 3);
    }

    #[test]
    fn the_cap_forgets_the_least_recently_used_tenant() {
        let lanes = TenantLanes::new(2);
        let (made, make) = counter();
        let a = lanes.get_or_create(&key("a"), make.clone()).unwrap();
        let b = lanes.get_or_create(&key("b"), make.clone()).unwrap();
        // `a` is used again, so `b` is now the least recently used.
        lanes.get_or_create(&key("a"), make.clone()).unwrap();
        let c = lanes.get_or_create(&key("c"), make.clone()).unwrap();
        let stats = lanes.stats(GpuIsolation::StreamPerTenant);
        assert_eq!(
            (stats.capacity, stats.live, stats.created, stats.evicted),
            (2, 2, 3, 1)
        );
        // `a` and `c` are still there; `b` comes back as a new lane (evicting `a`, now the
        // least recently used).
        assert!(Arc::ptr_eq(
            &c,
            &lanes.get_or_create(&key("c"), make.clone()).unwrap()
        ));
        assert!(Arc::ptr_eq(
            &a,
            &lanes.get_or_create(&key("a"), make.clone()).unwrap()
        ));
        assert_eq!(made.load(Ordering::SeqCst), 3);
        let b_again = lanes.get_or_create(&key("b"), make.clone()).unwrap();
        assert!(!Arc::ptr_eq(&b, &b_again));
        assert_eq!(made.load(Ordering::SeqCst), 4);
        let stats = lanes.stats(GpuIsolation::StreamPerTenant);
        assert_eq!((stats.live, stats.evicted), (2, 2));
        // The holder of an evicted lane keeps it working: eviction only forgets it.
        assert_eq!(*b, 1);
    }

    #[test]
    fn a_capacity_of_zero_still_holds_one_lane() {
        let lanes = TenantLanes::new(0);
        let (_, make) = counter();
        let a = lanes.get_or_create(&key("a"), make.clone()).unwrap();
        assert!(Arc::ptr_eq(
            &a,
            &lanes.get_or_create(&key("a"), make).unwrap()
        ));
        assert_eq!(lanes.stats(GpuIsolation::StreamPerTenant).capacity, 1);
    }

    #[test]
    fn failed_creation_is_not_kept() {
        let lanes: TenantLanes<Lane> = TenantLanes::new(2);
        let error = GpuError::Cuda(String::from("CUDA_ERROR_OUT_OF_MEMORY"));
        assert_eq!(
            lanes.get_or_create(&key("a"), || Err(error.clone())),
            Err(error)
        );
        let stats = lanes.stats(GpuIsolation::ContextPerTenant);
        assert_eq!((stats.live, stats.created), (0, 0));
        let (made, make) = counter();
        lanes.get_or_create(&key("a"), make).unwrap();
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert_eq!(lanes.stats(GpuIsolation::ContextPerTenant).created, 1);
    }

    #[test]
    fn concurrent_first_uses_of_one_tenant_create_one_lane() {
        let lanes = Arc::new(TenantLanes::new(8));
        let (made, make) = counter();
        let threads = 8;
        let barrier = Arc::new(Barrier::new(threads));
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                let (lanes, make, barrier) = (lanes.clone(), make.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    lanes
                        .get_or_create(&key("tn-shared"), || {
                            // Slow creation, like a context: the others wait for this one.
                            std::thread::sleep(std::time::Duration::from_millis(20));
                            make()
                        })
                        .unwrap()
                })
            })
            .collect();
        let got: Vec<Lane> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(made.load(Ordering::SeqCst), 1);
        assert!(got.iter().all(|lane| Arc::ptr_eq(lane, &got[0])));
    }

    /// A lane whose drop looks at the map: dropping it under the map's lock would deadlock.
    struct Reentrant {
        lanes: Arc<TenantLanes<Arc<Reentrant>>>,
        drops: Arc<AtomicUsize>,
    }

    impl Drop for Reentrant {
        fn drop(&mut self) {
            let _ = self.lanes.stats(GpuIsolation::StreamPerTenant);
            self.drops.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn evicted_lanes_are_dropped_outside_the_lock() {
        let lanes = Arc::new(TenantLanes::new(1));
        let drops = Arc::new(AtomicUsize::new(0));
        let make = || {
            Ok(Arc::new(Reentrant {
                lanes: lanes.clone(),
                drops: drops.clone(),
            }))
        };
        lanes.get_or_create(&key("a"), make).unwrap();
        lanes.get_or_create(&key("b"), make).unwrap();
        assert_eq!(drops.load(Ordering::SeqCst), 1, "a was evicted and dropped");
        // Break the cycle (the lane holds the map) so the test does not leak.
        drop(lanes.take_all());
        assert_eq!(drops.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn remove_if_forgets_only_an_unwanted_lane() {
        let lanes = TenantLanes::new(4);
        let (made, make) = counter();
        let a = lanes.get_or_create(&key("a"), make.clone()).unwrap();
        let b = lanes.get_or_create(&key("b"), make.clone()).unwrap();
        assert!(!lanes.remove_if(&key("a"), |lane| Arc::ptr_eq(lane, &b)));
        assert!(!lanes.remove_if(&key("nobody"), |_| true));
        assert!(Arc::ptr_eq(
            &a,
            &lanes.get_or_create(&key("a"), make.clone()).unwrap()
        ));
        assert!(lanes.remove_if(&key("a"), |lane| Arc::ptr_eq(lane, &a)));
        let stats = lanes.stats(GpuIsolation::ContextPerTenant);
        assert_eq!((stats.live, stats.evicted), (1, 0));
        let replaced = lanes.get_or_create(&key("a"), make.clone()).unwrap();
        assert!(!Arc::ptr_eq(&a, &replaced));
        assert_eq!(made.load(Ordering::SeqCst), 3);
        // `b` was never touched.
        assert!(Arc::ptr_eq(
            &b,
            &lanes.get_or_create(&key("b"), make).unwrap()
        ));
    }

    #[test]
    fn take_all_empties_the_map() {
        let lanes = TenantLanes::new(4);
        let (_, make) = counter();
        for id in ["a", "b", "c"] {
            lanes.get_or_create(&key(id), make.clone()).unwrap();
        }
        let mut taken: Vec<usize> = lanes.take_all().iter().map(|lane| **lane).collect();
        taken.sort_unstable();
        assert_eq!(taken, [0, 1, 2]);
        assert_eq!(lanes.stats(GpuIsolation::StreamPerTenant).live, 0);
    }

    #[test]
    fn isolation_parses_and_prints() {
        for (text, level) in [
            ("stream", GpuIsolation::StreamPerTenant),
            ("context", GpuIsolation::ContextPerTenant),
        ] {
            assert_eq!(text.parse::<GpuIsolation>(), Ok(level));
            assert_eq!(level.to_string(), text);
        }
        assert_eq!(
            " Context-Per-Tenant ".parse::<GpuIsolation>(),
            Ok(GpuIsolation::ContextPerTenant)
        );
        assert_eq!(
            "stream-per-tenant".parse::<GpuIsolation>(),
            Ok(GpuIsolation::StreamPerTenant)
        );
        assert!(matches!(
            "mig".parse::<GpuIsolation>(),
            Err(GpuError::InvalidArgument(_))
        ));
        assert_eq!(GpuIsolation::default(), GpuIsolation::StreamPerTenant);
        assert_eq!(
            GpuIsolation::StreamPerTenant.lane_capacity(),
            MAX_TENANT_STREAMS
        );
        assert_eq!(
            GpuIsolation::ContextPerTenant.lane_capacity(),
            MAX_TENANT_CONTEXTS
        );
    }

    #[test]
    fn tenant_keys_compare_by_text() {
        assert_eq!(
            TenantKey::new("tn-1"),
            TenantKey::from(String::from("tn-1"))
        );
        assert_eq!(TenantKey::from(Arc::<str>::from("tn-1")), "tn-1".into());
        assert_ne!(TenantKey::new("tn-1"), TenantKey::new("tn-2"));
        assert_eq!(TenantKey::default().as_str(), "");
        assert_eq!(TenantKey::new("tn-1").to_string(), "tn-1");
        assert_eq!(
            format!("{:?}", TenantKey::new("tn-1")),
            "TenantKey(\"tn-1\")"
        );
    }
}
