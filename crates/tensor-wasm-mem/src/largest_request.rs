//! [`LargestRequestAllocator`]: a global allocator for tests that bound how much memory a
//! decoder allocates at once.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Forwards every call to [`System`] and remembers the largest single request (allocation,
/// zeroed allocation or reallocation) since the last [`reset`](Self::reset).
///
/// Install it with `#[global_allocator]` in a test binary to check that hostile input never
/// makes code under test ask for more than a limit in one piece. The counter is
/// process-global, so such a binary should hold a single test.
///
/// ```
/// use tensor_wasm_mem::LargestRequestAllocator;
///
/// // In a test binary: #[global_allocator]
/// static ALLOCATOR: LargestRequestAllocator = LargestRequestAllocator::new();
///
/// ALLOCATOR.reset();
/// assert_eq!(ALLOCATOR.largest(), 0);
/// ```
#[derive(Debug, Default)]
pub struct LargestRequestAllocator {
    largest: AtomicUsize,
}

impl LargestRequestAllocator {
    /// An allocator that has seen no request yet.
    #[must_use]
    pub const fn new() -> Self {
        Self {
            largest: AtomicUsize::new(0),
        }
    }

    /// The largest request in bytes since creation or the last [`reset`](Self::reset).
    pub fn largest(&self) -> usize {
        self.largest.load(Ordering::Relaxed)
    }

    /// Forgets the requests seen so far.
    pub fn reset(&self) {
        self.largest.store(0, Ordering::Relaxed);
    }

    fn note(&self, size: usize) {
        self.largest.fetch_max(size, Ordering::Relaxed);
    }
}

// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so the
// `GlobalAlloc` contract is `System`'s; the bookkeeping is a lock-free atomic that never
// allocates.
unsafe impl GlobalAlloc for LargestRequestAllocator {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        self.note(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `GlobalAlloc::alloc`'s contract.
        unsafe { System.alloc(layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        self.note(layout.size());
        // SAFETY: forwarded unchanged; the caller upholds `alloc_zeroed`'s contract.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: forwarded unchanged; `ptr` came from `System` through this allocator.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        self.note(new_size);
        // SAFETY: forwarded unchanged; `ptr` came from `System` through this allocator.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_the_largest_request_until_reset() {
        let allocator = LargestRequestAllocator::new();
        let small = Layout::from_size_align(16, 8).unwrap();
        let big = Layout::from_size_align(4096, 8).unwrap();
        // SAFETY: layouts have non-zero size; every pointer is freed with the layout it was
        // allocated (or reallocated) with.
        unsafe {
            let a = allocator.alloc(big);
            let b = allocator.alloc_zeroed(small);
            assert!(!a.is_null() && !b.is_null());
            assert_eq!(*b, 0);
            assert_eq!(allocator.largest(), 4096);
            let b = allocator.realloc(b, small, 10_000);
            assert!(!b.is_null());
            assert_eq!(allocator.largest(), 10_000);
            allocator.dealloc(a, big);
            allocator.dealloc(b, Layout::from_size_align(10_000, 8).unwrap());
        }
        assert_eq!(allocator.largest(), 10_000, "freeing is not a request");
        allocator.reset();
        assert_eq!(allocator.largest(), 0);
    }
}
