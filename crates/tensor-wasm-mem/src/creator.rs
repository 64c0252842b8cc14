//! wasmtime integration: a `MemoryCreator` that allocates every guest linear memory once, at its capacity.

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use cudarc::driver::CudaContext;
use wasmtime::{Config, InstanceAllocationStrategy, LinearMemory, MemoryCreator, MemoryType};

use crate::{GuardedHostBuffer, ManagedBuffer, MemError, UnifiedBuffer};

thread_local! {
    static CAPACITY_HINT: Cell<Option<u64>> = const { Cell::new(None) };
}

/// Runs `f` with a capacity hint of `bytes` for every linear memory that a
/// [`TensorWasmMemoryCreator`] creates on this thread while `f` runs (typically
/// around `Instance::new` / `InstancePre::instantiate`).
///
/// The hint can only lower a memory's capacity (below the module's declared
/// maximum and the creator's cap), never raise it. Hints nest; the previous
/// hint is restored when `f` returns or unwinds. Asynchronous instantiation may
/// create memories on another thread, where the hint does not apply.
pub fn with_capacity_hint<R>(bytes: u64, f: impl FnOnce() -> R) -> R {
    struct Restore(Option<u64>);
    impl Drop for Restore {
        fn drop(&mut self) {
            CAPACITY_HINT.with(|hint| hint.set(self.0));
        }
    }
    let _restore = Restore(CAPACITY_HINT.with(|hint| hint.replace(Some(bytes))));
    f()
}

/// The capacity hint in effect on this thread, if any.
pub fn current_capacity_hint() -> Option<u64> {
    CAPACITY_HINT.with(Cell::get)
}

/// Configures `config` so that every linear memory comes from `creator` and
/// never moves:
///
/// * `with_host_memory(creator)` and the on-demand allocation strategy (the
///   pooling allocator never calls a custom creator);
/// * `memory_init_cow(false)`: with copy-on-write images, a custom creator
///   panics at instantiation of modules with data segments (wasmtime #10740);
/// * `memory_reservation(0)`, `memory_guard_size(0)`,
///   `memory_reservation_for_growth(0)`: compiled code performs explicit bounds
///   checks against the current size, as managed memory cannot have guard pages;
/// * `memory_may_move(false)`: kernels hold raw pointers into guest memory.
///
/// Engines built this way pass `reserved_size_in_bytes = Some(0)` and
/// `guard_size_in_bytes = 0` to the creator.
pub fn configure_engine(config: &mut Config, creator: Arc<TensorWasmMemoryCreator>) {
    config
        .with_host_memory(creator)
        .allocation_strategy(InstanceAllocationStrategy::OnDemand)
        .memory_init_cow(false)
        .memory_reservation(0)
        .memory_guard_size(0)
        .memory_reservation_for_growth(0)
        .memory_may_move(false);
}

/// Where a [`TensorWasmMemoryCreator`] puts guest memory.
#[derive(Debug, Clone)]
pub enum MemoryBacking {
    /// Host pages ([`GuardedHostBuffer`]).
    Host,
    /// CUDA managed memory on this context's device ([`ManagedBuffer`]).
    Managed(Arc<CudaContext>),
}

/// A [`wasmtime::MemoryCreator`] that allocates each linear memory up front at
/// its capacity: the smallest of the module's declared maximum, the
/// [thread's hint](with_capacity_hint) and `cap_bytes`, rounded down to whole
/// wasm pages. A memory whose minimum exceeds that capacity is refused, which
/// wasmtime reports as an instantiation error.
#[derive(Debug)]
pub struct TensorWasmMemoryCreator {
    backing: MemoryBacking,
    cap_bytes: u64,
    live: Arc<AtomicUsize>,
}

impl TensorWasmMemoryCreator {
    /// A creator allocating from `backing`, never more than `cap_bytes` per memory.
    pub fn new(backing: MemoryBacking, cap_bytes: u64) -> Self {
        TensorWasmMemoryCreator {
            backing,
            cap_bytes,
            live: Arc::new(AtomicUsize::new(0)),
        }
    }

    /// Where memories are allocated.
    pub fn backing(&self) -> &MemoryBacking {
        &self.backing
    }

    /// The largest capacity any single memory gets, in bytes.
    pub fn cap_bytes(&self) -> u64 {
        self.cap_bytes
    }

    /// Whether memories are CUDA managed memory that kernels address directly.
    pub fn is_uvm_backed(&self) -> bool {
        matches!(self.backing, MemoryBacking::Managed(_))
    }

    /// How many memories made by this creator are alive right now.
    pub fn live_memories(&self) -> usize {
        self.live.load(Ordering::Acquire)
    }

    fn allocate(&self, request: &MemoryRequest) -> Result<TensorWasmLinearMemory, MemError> {
        let capacity = plan_capacity(request, current_capacity_hint(), self.cap_bytes)?;
        let reservation = request.reserved.unwrap_or(0);
        let (buffer, protect_on_grow) = match &self.backing {
            MemoryBacking::Host => {
                let layout = HostLayout::plan(capacity, reservation, request.guard)?;
                let accessible = if layout.protect_on_grow {
                    request.minimum
                } else {
                    capacity
                };
                let buffer =
                    GuardedHostBuffer::with_accessible(capacity, accessible, layout.guard_bytes)?;
                (UnifiedBuffer::Host(buffer), layout.protect_on_grow)
            }
            MemoryBacking::Managed(ctx) => {
                check_managed_layout(reservation, request.guard)?;
                (
                    UnifiedBuffer::Managed(ManagedBuffer::new(ctx, capacity)?),
                    false,
                )
            }
        };
        tracing::debug!(
            minimum = request.minimum,
            maximum = ?request.maximum,
            capacity,
            reservation,
            guard = request.guard,
            uvm = buffer.is_uvm_backed(),
            "guest linear memory allocated"
        );
        self.live.fetch_add(1, Ordering::AcqRel);
        Ok(TensorWasmLinearMemory {
            buffer,
            size: request.minimum,
            capacity,
            protect_on_grow,
            live: Arc::clone(&self.live),
        })
    }
}

// SAFETY: every memory returned is a fresh, zero-filled, page-aligned mapping
// owned solely by the returned `TensorWasmLinearMemory` (so by the wasmtime
// instance); its base never moves; it is at least `byte_capacity()` bytes long,
// followed by `max(reserved, capacity) - capacity + guard_size_in_bytes` bytes
// of PROT_NONE (host backing), or wasmtime is told it has neither reservation
// nor guard (managed backing refuses any other configuration).
unsafe impl MemoryCreator for TensorWasmMemoryCreator {
    fn new_memory(
        &self,
        ty: MemoryType,
        minimum: usize,
        maximum: Option<usize>,
        reserved_size_in_bytes: Option<usize>,
        guard_size_in_bytes: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        let request = MemoryRequest {
            minimum,
            maximum,
            page_size: ty.page_size(),
            reserved: reserved_size_in_bytes,
            guard: guard_size_in_bytes,
        };
        self.allocate(&request)
            .map(|memory| Box::new(memory) as Box<dyn LinearMemory>)
            .map_err(|err| err.to_string())
    }
}

/// One guest linear memory made by [`TensorWasmMemoryCreator`]: a buffer
/// allocated at its full capacity, whose size only grows within it.
#[derive(Debug)]
pub struct TensorWasmLinearMemory {
    buffer: UnifiedBuffer,
    /// Current wasm-visible size in bytes.
    size: usize,
    /// Largest size this memory can reach without moving, in bytes.
    capacity: usize,
    /// Whether pages past `size` are kept PROT_NONE (host backing under an
    /// engine that may elide bounds checks) and opened on growth.
    protect_on_grow: bool,
    live: Arc<AtomicUsize>,
}

impl TensorWasmLinearMemory {
    /// Current size in bytes.
    pub fn byte_size(&self) -> usize {
        self.size
    }

    /// Capacity in bytes; growth beyond it fails.
    pub fn byte_capacity(&self) -> usize {
        self.capacity
    }

    /// The backing buffer.
    pub fn buffer(&self) -> &UnifiedBuffer {
        &self.buffer
    }

    /// Whether the memory is CUDA managed memory that kernels address directly.
    pub fn is_uvm_backed(&self) -> bool {
        self.buffer.is_uvm_backed()
    }
}

// SAFETY: the base pointer is page-aligned and never changes; `byte_size() <=
// byte_capacity()` bytes from it are always readable and writable (all of the
// capacity when `protect_on_grow` is false); the creator placed the guard
// region wasmtime asked for after it.
unsafe impl LinearMemory for TensorWasmLinearMemory {
    fn byte_size(&self) -> usize {
        self.size
    }

    fn byte_capacity(&self) -> usize {
        self.capacity
    }

    fn grow_to(&mut self, new_size: usize) -> wasmtime::Result<()> {
        if new_size > self.capacity {
            return Err(wasmtime::Error::new(MemError::TooLarge {
                requested: to_u64(new_size),
                cap: to_u64(self.capacity),
            }));
        }
        if self.protect_on_grow {
            if let UnifiedBuffer::Host(buffer) = &mut self.buffer {
                buffer
                    .grow_accessible(new_size)
                    .map_err(wasmtime::Error::new)?;
            }
        }
        self.size = new_size;
        Ok(())
    }

    fn as_ptr(&self) -> *mut u8 {
        self.buffer.base_ptr()
    }
}

impl Drop for TensorWasmLinearMemory {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }
}

/// What wasmtime asked for, in bytes.
#[derive(Debug, Clone, Copy)]
struct MemoryRequest {
    minimum: usize,
    maximum: Option<usize>,
    page_size: u64,
    reserved: Option<usize>,
    guard: usize,
}

/// The capacity to allocate: `min(maximum, hint, cap)` rounded down to whole
/// wasm pages, or `TooLarge` when that is below the minimum.
fn plan_capacity(request: &MemoryRequest, hint: Option<u64>, cap: u64) -> Result<usize, MemError> {
    let mut limit = cap;
    if let Some(maximum) = request.maximum {
        limit = limit.min(to_u64(maximum));
    }
    if let Some(hint) = hint {
        limit = limit.min(hint);
    }
    let page = request.page_size.max(1);
    let limit = limit - limit % page;
    let minimum = to_u64(request.minimum);
    if minimum > limit {
        return Err(MemError::TooLarge {
            requested: minimum,
            cap: limit,
        });
    }
    usize::try_from(limit).map_err(|_| MemError::TooLarge {
        requested: limit,
        cap: to_u64(usize::MAX),
    })
}

/// How a host-backed memory is laid out for the reservation and guard wasmtime
/// asked for.
#[derive(Debug, PartialEq, Eq)]
struct HostLayout {
    /// PROT_NONE bytes after the capacity: the rest of the reservation plus the guard.
    guard_bytes: usize,
    /// With a non-zero reservation or guard, compiled code may skip bounds
    /// checks and rely on faults, so pages past the current size must fault too.
    protect_on_grow: bool,
}

impl HostLayout {
    fn plan(capacity: usize, reservation: usize, guard: usize) -> Result<Self, MemError> {
        let guard_bytes = reservation
            .saturating_sub(capacity)
            .checked_add(guard)
            .ok_or(MemError::TooLarge {
                requested: to_u64(reservation),
                cap: to_u64(usize::MAX - guard),
            })?;
        Ok(HostLayout {
            guard_bytes,
            protect_on_grow: reservation != 0 || guard != 0,
        })
    }
}

/// Managed memory is one `cuMemAllocManaged` block with no room for
/// inaccessible pages, so it only works when compiled code bounds-checks every
/// access against the current size: no reservation and no guard.
fn check_managed_layout(reservation: usize, guard: usize) -> Result<(), MemError> {
    if reservation != 0 || guard != 0 {
        return Err(MemError::NeedsExplicitBoundsChecks {
            reservation: to_u64(reservation),
            guard: to_u64(guard),
        });
    }
    Ok(())
}

fn to_u64(bytes: usize) -> u64 {
    u64::try_from(bytes).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const WASM_PAGE: u64 = 65536;

    fn request(min_pages: usize, max_pages: Option<usize>) -> MemoryRequest {
        MemoryRequest {
            minimum: min_pages * 65536,
            maximum: max_pages.map(|p| p * 65536),
            page_size: WASM_PAGE,
            reserved: Some(0),
            guard: 0,
        }
    }

    #[test]
    fn capacity_is_the_smallest_limit() {
        let cap = 64 << 20;
        assert_eq!(
            plan_capacity(&request(1, Some(16)), None, cap).unwrap(),
            16 * 65536
        );
        assert_eq!(
            plan_capacity(&request(1, None), None, cap).unwrap(),
            64 << 20
        );
        assert_eq!(
            plan_capacity(&request(1, Some(16)), Some(4 * WASM_PAGE), cap).unwrap(),
            4 * 65536
        );
        assert_eq!(
            plan_capacity(&request(1, Some(16)), Some(1 << 40), cap).unwrap(),
            16 * 65536,
            "a hint never raises the capacity"
        );
        assert_eq!(
            plan_capacity(&request(1, Some(16)), None, 2 * WASM_PAGE).unwrap(),
            2 * 65536
        );
    }

    #[test]
    fn capacity_rounds_down_to_whole_wasm_pages() {
        assert_eq!(
            plan_capacity(&request(1, None), Some(3 * WASM_PAGE + 100), u64::MAX).unwrap(),
            3 * 65536
        );
        let mut tiny_pages = request(0, None);
        tiny_pages.page_size = 1;
        assert_eq!(
            plan_capacity(&tiny_pages, Some(1001), u64::MAX).unwrap(),
            1001
        );
    }

    #[test]
    fn minimum_above_capacity_is_refused() {
        match plan_capacity(&request(4, Some(16)), Some(3 * WASM_PAGE + 5), u64::MAX) {
            Err(MemError::TooLarge { requested, cap }) => {
                assert_eq!(requested, 4 * WASM_PAGE);
                assert_eq!(cap, 3 * WASM_PAGE);
            }
            other => panic!("expected TooLarge, got {other:?}"),
        }
        assert!(plan_capacity(&request(1, None), None, WASM_PAGE - 1).is_err());
        assert_eq!(
            plan_capacity(&request(0, Some(0)), None, u64::MAX).unwrap(),
            0
        );
    }

    #[test]
    fn host_layout_covers_reservation_and_guard() {
        let explicit = HostLayout::plan(1 << 20, 0, 0).unwrap();
        assert_eq!(
            explicit,
            HostLayout {
                guard_bytes: 0,
                protect_on_grow: false
            }
        );

        let reserved = HostLayout::plan(1 << 20, 4 << 30, 32 << 20).unwrap();
        assert_eq!(reserved.guard_bytes, (4 << 30) - (1 << 20) + (32 << 20));
        assert!(reserved.protect_on_grow);

        let guard_only = HostLayout::plan(1 << 20, 0, 65536).unwrap();
        assert_eq!(guard_only.guard_bytes, 65536);
        assert!(guard_only.protect_on_grow);

        assert!(HostLayout::plan(0, usize::MAX, 1).is_err());
    }

    #[test]
    fn managed_memory_requires_explicit_bounds_checks() {
        check_managed_layout(0, 0).unwrap();
        for (reservation, guard) in [(4 << 30, 0), (0, 65536), (4 << 30, 32 << 20)] {
            match check_managed_layout(reservation, guard) {
                Err(MemError::NeedsExplicitBoundsChecks {
                    reservation: r,
                    guard: g,
                }) => {
                    assert_eq!((r, g), (reservation as u64, guard as u64));
                }
                other => panic!("expected refusal, got {other:?}"),
            }
        }
    }

    #[test]
    fn hint_is_scoped_and_nests() {
        assert_eq!(current_capacity_hint(), None);
        with_capacity_hint(10, || {
            assert_eq!(current_capacity_hint(), Some(10));
            with_capacity_hint(5, || assert_eq!(current_capacity_hint(), Some(5)));
            assert_eq!(current_capacity_hint(), Some(10));
        });
        assert_eq!(current_capacity_hint(), None);
        let unwound = std::panic::catch_unwind(|| with_capacity_hint(7, || panic!("boom")));
        assert!(unwound.is_err());
        assert_eq!(current_capacity_hint(), None, "restored after a panic");
        std::thread::spawn(|| assert_eq!(current_capacity_hint(), None))
            .join()
            .unwrap();
    }

    fn host_memory(
        creator: &TensorWasmMemoryCreator,
        min_pages: u32,
        max_pages: Option<u32>,
        reserved: Option<usize>,
        guard: usize,
    ) -> Result<Box<dyn LinearMemory>, String> {
        let ty = MemoryType::new(min_pages, max_pages);
        creator.new_memory(
            ty,
            min_pages as usize * 65536,
            max_pages.map(|p| p as usize * 65536),
            reserved,
            guard,
        )
    }

    #[test]
    fn linear_memory_grows_in_place_up_to_capacity() {
        let creator = TensorWasmMemoryCreator::new(MemoryBacking::Host, 1 << 30);
        let mut mem = host_memory(&creator, 1, Some(4), Some(0), 0).unwrap();
        assert_eq!(creator.live_memories(), 1);
        assert_eq!(mem.byte_size(), 65536);
        assert_eq!(mem.byte_capacity(), 4 * 65536);
        let base = mem.as_ptr();
        assert_eq!(base as usize % crate::host_page_size(), 0);
        mem.grow_to(3 * 65536).unwrap();
        assert_eq!(mem.byte_size(), 3 * 65536);
        assert_eq!(mem.as_ptr(), base);
        let err = mem.grow_to(4 * 65536 + 1).unwrap_err();
        assert!(err.downcast_ref::<MemError>().is_some());
        assert_eq!(mem.byte_size(), 3 * 65536, "failed growth keeps the size");
        drop(mem);
        assert_eq!(creator.live_memories(), 0);
    }

    #[test]
    fn refusals_do_not_count_as_live() {
        let creator = TensorWasmMemoryCreator::new(MemoryBacking::Host, 2 * 65536);
        let Err(err) = host_memory(&creator, 3, None, Some(0), 0) else {
            panic!("minimum above the cap must be refused");
        };
        assert!(err.contains("limit"), "{err}");
        assert_eq!(creator.live_memories(), 0);
        assert!(!creator.is_uvm_backed());
    }
}
