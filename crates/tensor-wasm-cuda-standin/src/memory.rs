//! "Managed memory": page-aligned anonymous host mappings whose addresses are the device
//! pointers, and the lookups the driver functions need (which allocation holds a range).

use std::collections::BTreeMap;

/// The live allocations, by base address.
#[derive(Debug, Default)]
pub(crate) struct Allocations {
    regions: BTreeMap<u64, usize>,
    bytes: u64,
}

const PAGE: usize = 4096;

impl Allocations {
    /// Bytes allocated now.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Maps `len` zeroed bytes (rounded up to whole pages); `None` when the host refuses.
    pub fn allocate(&mut self, len: usize) -> Option<u64> {
        let mapped = len.checked_add(PAGE - 1)? / PAGE * PAGE;
        // SAFETY: an anonymous private mapping at an address the kernel picks touches no
        // existing memory; the result is checked against MAP_FAILED.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return None;
        }
        let base = address as u64;
        self.regions.insert(base, mapped);
        self.bytes += mapped as u64;
        Some(base)
    }

    /// Unmaps the allocation starting at `base`; false when there is none.
    pub fn free(&mut self, base: u64) -> bool {
        let Some(mapped) = self.regions.remove(&base) else {
            return false;
        };
        self.bytes -= mapped as u64;
        // SAFETY: `base..base + mapped` is a mapping this table made and just forgot; nothing
        // of the driver refers to it any more (a caller still using it is the caller's bug,
        // as with a real driver).
        unsafe { libc::munmap(base as *mut libc::c_void, mapped) };
        true
    }

    /// The allocation (base, length) holding `address`, if any.
    pub fn holding(&self, address: u64) -> Option<(u64, usize)> {
        let (&base, &len) = self.regions.range(..=address).next_back()?;
        (address < base + len as u64).then_some((base, len))
    }

    /// Whether `address..address + len` lies inside one allocation.
    pub fn contains(&self, address: u64, len: usize) -> bool {
        self.holding(address)
            .is_some_and(|(base, size)| address + len as u64 <= base + size as u64)
    }
}

/// Sets `len` bytes at `address` to `value`. Zeroing whole pages drops them instead
/// (`MADV_DONTNEED` gives fresh zero pages), so clearing a large, untouched guest memory
/// costs nothing.
///
/// # Safety
/// `address..address + len` lies inside one live allocation ([`Allocations::contains`]).
pub(crate) unsafe fn fill(address: u64, value: u8, len: usize) {
    let end = address + len as u64;
    let page = PAGE as u64;
    let (inner_start, inner_end) = (address.div_ceil(page) * page, end / page * page);
    if value == 0 && inner_start < inner_end {
        // SAFETY: (the caller's promise) both edges lie inside the allocation.
        unsafe {
            std::ptr::write_bytes(address as *mut u8, 0, (inner_start - address) as usize);
            std::ptr::write_bytes(inner_end as *mut u8, 0, (end - inner_end) as usize);
        }
        // SAFETY: whole pages of a private anonymous mapping of ours; dropping them makes
        // them read back as zeros, which is what was asked.
        let dropped = unsafe {
            libc::madvise(
                inner_start as *mut libc::c_void,
                (inner_end - inner_start) as usize,
                libc::MADV_DONTNEED,
            )
        };
        if dropped == 0 {
            return;
        }
    }
    // SAFETY: (the caller's promise) the range lies inside one live allocation.
    unsafe { std::ptr::write_bytes(address as *mut u8, value, len) };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocations_are_page_aligned_zeroed_and_found_by_range() {
        let mut table = Allocations::default();
        let base = table.allocate(5000).unwrap();
        assert_eq!(base % PAGE as u64, 0);
        assert_eq!(table.bytes(), 2 * PAGE as u64);
        assert_eq!(table.holding(base + 4999), Some((base, 2 * PAGE)));
        assert_eq!(table.holding(base + 2 * PAGE as u64), None);
        assert!(table.contains(base + 10, 100));
        assert!(!table.contains(base + 10, 2 * PAGE));
        // SAFETY: all of it lies inside the allocation.
        unsafe {
            fill(base, 0xab, 2 * PAGE);
            fill(base + 3, 0, PAGE + 10);
        }
        // SAFETY: the allocation is live and 2 pages long.
        let bytes = unsafe { std::slice::from_raw_parts(base as *const u8, 2 * PAGE) };
        assert_eq!(&bytes[..3], &[0xab; 3]);
        assert!(bytes[3..PAGE + 13].iter().all(|&b| b == 0));
        assert!(bytes[PAGE + 13..].iter().all(|&b| b == 0xab));
        assert!(table.free(base));
        assert!(!table.free(base));
        assert_eq!(table.bytes(), 0);
    }
}
