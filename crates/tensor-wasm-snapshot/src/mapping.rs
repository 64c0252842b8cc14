//! The only module with `unsafe` in this crate: `mmap` of image files over caller memory
//! (copy-on-write, lazy) and anonymous zeroed page-aligned buffers.
//!
//! The designated home of unsafe code in TensorWasm is `tensor-wasm-mem`; this module is kept
//! small and self-contained so that it can move there unchanged.
#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;

/// The host's page size in bytes.
pub(crate) fn host_page_size() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions; it only reads a constant.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(size).unwrap_or(4096)
}

/// Replaces the pages under `dest` with a private (copy-on-write) mapping of
/// `file[offset .. offset + dest.len()]`.
///
/// Requirements, checked here: `dest` starts on a host page boundary, its length and `offset`
/// are multiples of the host page size, and the file is at least `offset + dest.len()` bytes
/// long. Requirement on the caller, not checkable here: nobody truncates or rewrites the file
/// while the mapping lives (a truncated file turns reads into `SIGBUS`; a rewritten one changes
/// pages the guest has not written yet).
pub(crate) fn map_file_private_fixed(file: &File, offset: u64, dest: &mut [u8]) -> io::Result<()> {
    if dest.is_empty() {
        return Ok(());
    }
    let page = host_page_size();
    let addr = dest.as_mut_ptr();
    if !(addr as usize).is_multiple_of(page)
        || !dest.len().is_multiple_of(page)
        || !offset.is_multiple_of(page as u64)
    {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "mapping requires host-page-aligned address, length and offset",
        ));
    }
    let end = offset
        .checked_add(dest.len() as u64)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "offset overflow"))?;
    if file.metadata()?.len() < end {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file is shorter than the range to map",
        ));
    }
    let file_offset = libc::off_t::try_from(offset)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
    // SAFETY: `addr .. addr + len` is exactly the memory of `dest`, a live, exclusively
    // borrowed, readable and writable region, so no other Rust reference observes the pages
    // being replaced. MAP_FIXED replaces those pages (and nothing outside them, since address
    // and length are page-aligned) with a private read-write mapping of a file range that we
    // just checked lies inside the file, so every byte of `dest` stays readable and writable
    // for as long as the underlying allocation lives. Writes go to private copies; the file is
    // never modified (MAP_PRIVATE).
    let mapped = unsafe {
        libc::mmap(
            addr.cast(),
            dest.len(),
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_FIXED,
            file.as_raw_fd(),
            file_offset,
        )
    };
    if mapped == libc::MAP_FAILED {
        let err = io::Error::last_os_error();
        // A failed MAP_FIXED may already have discarded the old pages. Put zeroed anonymous
        // memory back so that `dest` stays valid memory; if even that fails, continuing would
        // leave a dangling slice, so abort.
        // SAFETY: same region and reasoning as above; an anonymous private mapping needs no
        // file and yields zeroed readable and writable pages.
        let again = unsafe {
            libc::mmap(
                addr.cast(),
                dest.len(),
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if again == libc::MAP_FAILED {
            std::process::abort();
        }
        return Err(err);
    }
    Ok(())
}

/// A zeroed, page-aligned, read-write buffer backed by a private anonymous mapping (the
/// kind of memory [`crate::LocalImage::map_into`] expects). Unmapped on drop.
pub struct AnonymousPages {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned exclusively by this value (like a `Box<[u8]>`); access goes
// through `&self`/`&mut self`, so moving it between threads or sharing `&` is sound.
unsafe impl Send for AnonymousPages {}
// SAFETY: see `Send`; `&AnonymousPages` only hands out `&[u8]`.
unsafe impl Sync for AnonymousPages {}

impl AnonymousPages {
    /// Maps `len` bytes (rounded up to whole host pages) of zeroed memory. Pages are allocated
    /// by the kernel on first touch.
    ///
    /// # Errors
    /// The operating system's error if `mmap` fails.
    pub fn new(len: usize) -> io::Result<Self> {
        let page = host_page_size();
        let rounded = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "length overflow"))?
            .max(page);
        // SAFETY: a fresh anonymous private mapping at an address the kernel picks touches no
        // existing memory.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                rounded,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = std::ptr::NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// The buffer (exactly the requested length).
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` points to at least `len` readable bytes owned by `self` and alive until
        // drop; the shared borrow of `self` prevents concurrent mutation.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The buffer, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_slice`, and the exclusive borrow of `self` makes this the only
        // reference to the bytes.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AnonymousPages {
    fn drop(&mut self) {
        let rounded = self
            .len
            .next_multiple_of(host_page_size())
            .max(host_page_size());
        // SAFETY: unmaps exactly the range mapped in `new` (possibly remapped since by
        // `map_file_private_fixed`, which only replaces pages inside it); no borrow of the
        // bytes outlives `self`.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), rounded);
        }
    }
}

impl std::fmt::Debug for AnonymousPages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnonymousPages")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn anonymous_pages_are_zeroed_and_aligned() {
        let mut pages = AnonymousPages::new(10_000).unwrap();
        assert_eq!(pages.as_slice().len(), 10_000);
        assert_eq!(pages.as_slice().as_ptr() as usize % host_page_size(), 0);
        assert!(pages.as_slice().iter().all(|&b| b == 0));
        pages.as_mut_slice()[9_999] = 5;
        assert_eq!(pages.as_slice()[9_999], 5);
    }

    #[test]
    fn unaligned_destination_is_refused() {
        let file = tempfile::tempfile().unwrap();
        file.set_len(8192).unwrap();
        let mut pages = AnonymousPages::new(8192).unwrap();
        let err = map_file_private_fixed(&file, 0, &mut pages.as_mut_slice()[1..4097]);
        assert_eq!(err.unwrap_err().kind(), io::ErrorKind::InvalidInput);
        let err = map_file_private_fixed(&file, 4096, &mut pages.as_mut_slice()[..8192]);
        assert_eq!(err.unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }
}
