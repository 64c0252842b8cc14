//! Page-aligned, zero-filled host buffers followed by an inaccessible guard region.

use std::io;
use std::ptr::NonNull;
use std::sync::OnceLock;

use crate::file_map::{forget_owned, record_owned};
use crate::MemError;

/// The host's page size in bytes (4 KiB on x86-64 Linux).
pub fn host_page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: `sysconf` only reads a configuration value; `_SC_PAGESIZE` is
        // always supported on Linux.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        usize::try_from(page)
            .ok()
            .filter(|p| p.is_power_of_two())
            .unwrap_or(4096)
    })
}

/// Rounds `bytes` up to a multiple of the host page size, or `None` on overflow.
pub fn round_up_to_page(bytes: usize) -> Option<usize> {
    let page = host_page_size();
    bytes.checked_add(page - 1).map(|b| b & !(page - 1))
}

/// One anonymous mapping: `capacity()` read/write bytes followed by at least one
/// page of `PROT_NONE` guard.
///
/// ```text
/// base                        base + capacity()          base + reservation_len()
/// |--- READ|WRITE, zeroed ---|--------- PROT_NONE guard ---------|
///        len() <= capacity() = round_up_to_page(len)
/// ```
///
/// The base address is fixed for the buffer's lifetime, so raw pointers into it
/// (handed to wasmtime or to kernels) stay valid until the buffer is dropped.
/// Its accessible pages may be replaced by a copy-on-write file mapping with
/// [`crate::map_file_private_fixed`] (a lazily restored snapshot).
#[derive(Debug)]
pub struct GuardedHostBuffer {
    base: NonNull<u8>,
    /// Bytes the caller asked for.
    len: usize,
    /// `round_up_to_page(len)`: the bytes that are, or can be made, accessible.
    capacity: usize,
    /// Bytes from `base` that are currently READ|WRITE (a page multiple, at most
    /// `capacity`). Equal to `capacity` for buffers made by [`Self::new`].
    accessible: usize,
    /// Total length of the mapping: `capacity` plus the guard.
    reservation: usize,
}

// SAFETY: the buffer exclusively owns its mapping; `&self` methods only hand out
// shared access and `&mut self` methods exclusive access, exactly like a
// `Box<[u8]>`, so moving it or sharing references across threads is sound.
unsafe impl Send for GuardedHostBuffer {}
// SAFETY: see the `Send` impl; no interior mutability is reachable through `&self`.
unsafe impl Sync for GuardedHostBuffer {}

impl GuardedHostBuffer {
    /// Reserves `round_up_to_page(len) + round_up_to_page(guard_bytes)` bytes
    /// (the guard is at least one page) as one `PROT_NONE` mapping, then makes
    /// the first `round_up_to_page(len)` bytes readable and writable.
    pub fn new(len: usize, guard_bytes: usize) -> Result<Self, MemError> {
        Self::with_accessible(len, len, guard_bytes)
    }

    /// Like [`Self::new`], but only the first `round_up_to_page(accessible)`
    /// bytes (clamped to the capacity) start out readable and writable; the
    /// rest of the capacity stays `PROT_NONE` until [`Self::grow_accessible`].
    pub(crate) fn with_accessible(
        len: usize,
        accessible: usize,
        guard_bytes: usize,
    ) -> Result<Self, MemError> {
        let page = host_page_size();
        let too_large = || MemError::TooLarge {
            requested: u64::try_from(len).unwrap_or(u64::MAX),
            cap: u64::try_from(isize::MAX).unwrap_or(u64::MAX),
        };
        let capacity = round_up_to_page(len).ok_or_else(too_large)?;
        let guard = round_up_to_page(guard_bytes)
            .ok_or_else(too_large)?
            .max(page);
        let reservation = capacity.checked_add(guard).ok_or_else(too_large)?;
        if isize::try_from(reservation).is_err() {
            return Err(too_large());
        }

        // SAFETY: a fresh anonymous private mapping at an address the kernel
        // picks; it aliases nothing, and `reservation` is non-zero (the guard is
        // at least one page).
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                reservation,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(MemError::Map(io::Error::last_os_error()));
        }
        let base = NonNull::new(raw.cast::<u8>())
            .ok_or_else(|| MemError::Map(io::Error::other("mmap returned a null mapping")))?;
        // Private and anonymous, never reset with `madvise`, forgotten before `munmap` in
        // `drop`: file images may be mapped over its accessible part.
        record_owned(base.as_ptr(), capacity);

        // From here on, `Drop` unmaps the reservation if making it accessible fails.
        let mut buffer = GuardedHostBuffer {
            base,
            len,
            capacity,
            accessible: 0,
            reservation,
        };
        buffer.grow_accessible(accessible.min(capacity))?;
        Ok(buffer)
    }

    /// Makes the first `round_up_to_page(bytes)` bytes readable and writable.
    /// The newly exposed pages read as zero (they were never accessible).
    /// Shrinking is not supported: a smaller `bytes` is a no-op.
    pub(crate) fn grow_accessible(&mut self, bytes: usize) -> Result<(), MemError> {
        let target = round_up_to_page(bytes)
            .filter(|t| *t <= self.capacity)
            .ok_or(MemError::TooLarge {
                requested: u64::try_from(bytes).unwrap_or(u64::MAX),
                cap: u64::try_from(self.capacity).unwrap_or(u64::MAX),
            })?;
        if target <= self.accessible {
            return Ok(());
        }
        // SAFETY: `[accessible, target)` lies inside our own mapping (target <=
        // capacity < reservation) and is page-aligned; turning PROT_NONE pages
        // into READ|WRITE cannot invalidate any outstanding reference.
        let rc = unsafe {
            libc::mprotect(
                self.base.as_ptr().add(self.accessible).cast(),
                target - self.accessible,
                libc::PROT_READ | libc::PROT_WRITE,
            )
        };
        if rc != 0 {
            return Err(MemError::Map(io::Error::last_os_error()));
        }
        self.accessible = target;
        Ok(())
    }

    /// Bytes requested at construction.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer was created with length zero.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `round_up_to_page(len)`: bytes before the guard region.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Bytes from the base that are currently readable and writable.
    pub fn accessible_len(&self) -> usize {
        self.accessible
    }

    /// Size of the `PROT_NONE` guard region after the capacity.
    pub fn guard_len(&self) -> usize {
        self.reservation - self.capacity
    }

    /// Total bytes of address space reserved (capacity plus guard).
    pub fn reservation_len(&self) -> usize {
        self.reservation
    }

    /// Base address; page-aligned and constant for the buffer's lifetime.
    pub fn as_ptr(&self) -> *const u8 {
        self.base.as_ptr()
    }

    /// Mutable base address; page-aligned and constant for the buffer's lifetime.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The base as `*mut u8` from a shared reference, for wasmtime's
    /// `LinearMemory::as_ptr`, which hands out a mutable pointer from `&self`.
    #[cfg(feature = "wasmtime")]
    pub(crate) fn base_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The readable bytes: `len()` bytes, or fewer while part of the capacity
    /// is still inaccessible.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: the first `accessible` bytes are mapped READ|WRITE and
        // initialised (zero-filled by the kernel); the mapping lives as long as
        // `self`, and `&self` rules out a concurrent `&mut` through this type.
        unsafe { std::slice::from_raw_parts(self.base.as_ptr(), self.len.min(self.accessible)) }
    }

    /// The writable bytes; see [`Self::as_slice`].
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and `&mut self` guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.base.as_ptr(), self.len.min(self.accessible)) }
    }
}

impl Drop for GuardedHostBuffer {
    fn drop(&mut self) {
        // Forget first: once unmapped, the address range may be handed to someone else.
        forget_owned(self.base.as_ptr());
        // SAFETY: `base`/`reservation` describe exactly the mapping created in
        // `with_accessible`, which nothing else unmaps; after drop no pointer
        // derived from this buffer may be used (documented on the type).
        let rc = unsafe { libc::munmap(self.base.as_ptr().cast(), self.reservation) };
        if rc != 0 {
            tracing::error!(
                error = %io::Error::last_os_error(),
                "munmap of guest memory failed; leaking the mapping"
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The permission string of the `/proc/self/maps` line containing `addr`.
    fn perms_at(addr: usize) -> Option<String> {
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        maps.lines().find_map(|line| {
            let mut fields = line.split_whitespace();
            let range = fields.next()?;
            let perms = fields.next()?;
            let (lo, hi) = range.split_once('-')?;
            let lo = usize::from_str_radix(lo, 16).ok()?;
            let hi = usize::from_str_radix(hi, 16).ok()?;
            (lo <= addr && addr < hi).then(|| perms.to_owned())
        })
    }

    #[test]
    fn zeroed_writable_and_page_aligned() {
        let page = host_page_size();
        let mut buf = GuardedHostBuffer::new(3 * page + 5, 0).unwrap();
        assert_eq!(buf.len(), 3 * page + 5);
        assert_eq!(buf.capacity(), 4 * page);
        assert_eq!(buf.as_ptr() as usize % page, 0);
        assert!(buf.as_slice().iter().all(|b| *b == 0));
        let base = buf.as_ptr();
        for (i, b) in buf.as_mut_slice().iter_mut().enumerate() {
            *b = (i % 251) as u8;
        }
        assert_eq!(buf.as_slice()[page + 7], ((page + 7) % 251) as u8);
        assert_eq!(buf.as_ptr(), base, "base never moves");
    }

    #[test]
    fn guard_follows_capacity_in_the_same_reservation() {
        let page = host_page_size();
        let buf = GuardedHostBuffer::new(2 * page + 1, 3 * page).unwrap();
        assert_eq!(buf.capacity(), 3 * page);
        assert_eq!(buf.guard_len(), 3 * page);
        assert_eq!(buf.reservation_len(), 6 * page);
        let base = buf.as_ptr() as usize;
        // The last page before the guard is accessible, everything after is not.
        assert!(perms_at(base + buf.capacity() - 1)
            .unwrap()
            .starts_with("rw"));
        for offset in [
            buf.capacity(),
            buf.capacity() + 1,
            buf.reservation_len() - 1,
        ] {
            assert_eq!(perms_at(base + offset).unwrap(), "---p", "offset {offset}");
        }
    }

    #[test]
    fn guard_is_at_least_one_page() {
        let page = host_page_size();
        let buf = GuardedHostBuffer::new(page, 0).unwrap();
        assert_eq!(buf.guard_len(), page);
        assert_eq!(perms_at(buf.as_ptr() as usize + page).unwrap(), "---p");
    }

    #[test]
    fn zero_length_is_only_guard() {
        let buf = GuardedHostBuffer::new(0, 0).unwrap();
        assert!(buf.is_empty());
        assert_eq!(buf.capacity(), 0);
        assert!(buf.as_slice().is_empty());
        assert_eq!(perms_at(buf.as_ptr() as usize).unwrap(), "---p");
    }

    #[test]
    fn partially_accessible_grows_in_place() {
        let page = host_page_size();
        let mut buf = GuardedHostBuffer::with_accessible(4 * page, page, 0).unwrap();
        let base = buf.as_ptr() as usize;
        assert_eq!(buf.accessible_len(), page);
        assert_eq!(buf.as_slice().len(), page);
        assert_eq!(perms_at(base + page).unwrap(), "---p");
        buf.as_mut_slice()[0] = 9;

        buf.grow_accessible(3 * page).unwrap();
        assert_eq!(buf.as_ptr() as usize, base);
        assert_eq!(buf.accessible_len(), 3 * page);
        assert!(perms_at(base + 3 * page - 1).unwrap().starts_with("rw"));
        assert_eq!(perms_at(base + 3 * page).unwrap(), "---p");
        assert_eq!(buf.as_slice()[0], 9);
        assert!(buf.as_slice()[page..].iter().all(|b| *b == 0));

        assert!(matches!(
            buf.grow_accessible(4 * page + 1),
            Err(MemError::TooLarge { .. })
        ));
        buf.grow_accessible(page).unwrap();
        assert_eq!(buf.accessible_len(), 3 * page, "shrinking is a no-op");
    }

    #[test]
    fn absurd_sizes_are_refused_without_mapping() {
        assert!(matches!(
            GuardedHostBuffer::new(usize::MAX - 10, 0),
            Err(MemError::TooLarge { .. })
        ));
        assert!(matches!(
            GuardedHostBuffer::new(usize::MAX / 2, usize::MAX / 2),
            Err(MemError::TooLarge { .. })
        ));
    }

    proptest::proptest! {
        #[test]
        fn round_up_is_the_smallest_page_multiple(bytes in 0usize..(1 << 40)) {
            let page = host_page_size();
            let r = round_up_to_page(bytes).unwrap();
            proptest::prop_assert_eq!(r % page, 0);
            proptest::prop_assert!(r >= bytes && r - bytes < page);
        }
    }
}
