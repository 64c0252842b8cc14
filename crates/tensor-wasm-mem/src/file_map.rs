//! Copy-on-write file mappings over memory this crate owns ([`map_file_private_fixed`]), and
//! [`AnonymousPages`], a plain zeroed page-aligned buffer to map them into.
//!
//! Mapping a file over memory is only sound when the memory's owner is known: an owner that
//! recycles pages with `madvise(MADV_DONTNEED)` expects them to read back as zeros, but on a
//! private *file* mapping they read back as the file. So this module keeps a registry of the
//! mappings this crate created ([`AnonymousPages`], [`crate::GuardedHostBuffer`]) and maps
//! files only inside those.

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;
use std::sync::{Mutex, PoisonError};

use crate::host_page_size;

/// Start address → end address of every live mapping that this crate created and that
/// [`map_file_private_fixed`] may replace pages of.
static OWNED_MAPPINGS: Mutex<BTreeMap<usize, usize>> = Mutex::new(BTreeMap::new());

/// Records `[start, start + len)` as a mapping this crate owns.
///
/// Only for a mapping that was created private and anonymous, whose pages its owner never
/// resets with `madvise` expecting zeros, and whose owner calls [`forget_owned`] *before*
/// unmapping it (so that a later, unrelated mapping at the same address is never mistaken
/// for it).
pub(crate) fn record_owned(start: *const u8, len: usize) {
    if len == 0 {
        return;
    }
    let start = start as usize;
    OWNED_MAPPINGS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(start, start.saturating_add(len));
}

/// Removes the mapping starting at `start` from the registry (a no-op if it is not there).
pub(crate) fn forget_owned(start: *const u8) {
    OWNED_MAPPINGS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .remove(&(start as usize));
}

/// Whether `[start, start + len)` lies inside one mapping recorded by [`record_owned`].
fn is_owned(start: usize, len: usize) -> bool {
    let Some(end) = start.checked_add(len) else {
        return false;
    };
    OWNED_MAPPINGS
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .range(..=start)
        .next_back()
        .is_some_and(|(_, &owned_end)| end <= owned_end)
}

fn invalid_input(message: &'static str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, message)
}

/// Replaces the pages under `dest` with a private (copy-on-write) mapping of
/// `file[offset .. offset + dest.len()]`: nothing is read now, each page is loaded from the
/// file when first touched, and writes go to private copies, never to the file. The
/// mapping lasts until the memory's owner unmaps it (for example by dropping the
/// [`AnonymousPages`]).
///
/// # Checked here
/// Each of these is refused with an error before anything is mapped, leaving `dest` as it
/// was. An empty `dest` is a no-op.
/// - `dest`'s address and length and `offset` are multiples of [`host_page_size`]
///   ([`io::ErrorKind::InvalidInput`]).
/// - `dest` lies inside one mapping created by this crate and still alive: the bytes of an
///   [`AnonymousPages`] or of a [`crate::GuardedHostBuffer`] (which includes a wasmtime linear
///   memory made by the host-backed memory creator) ([`io::ErrorKind::InvalidInput`]). Other
///   memory is refused even when aligned (see below).
/// - `file` is a regular file ([`io::ErrorKind::InvalidInput`]) of at least
///   `offset + dest.len()` bytes ([`io::ErrorKind::UnexpectedEof`]).
///
/// If `mmap` itself fails after these checks (for example `file` was not opened for
/// reading), `dest` is left as zeroed pages and the operating system's error is returned.
///
/// # What this function guarantees
/// - `&mut [u8]` makes the caller the only one observing those bytes during the call, and
///   changing their values is what a write through it could do too.
/// - Address and length are page-aligned, so `MAP_FIXED` replaces exactly the pages of
///   `dest` and no byte outside it. The new pages are readable and writable like the old
///   ones (a `&mut [u8]` can only cover such memory), and the whole range lies inside the
///   file, so every reference or raw pointer into `dest` stays valid and every bit pattern
///   read is a valid `u8`.
/// - The owner is known. This crate's buffers release their mapping with `munmap`, which
///   removes the file mapping with it, and never reset pages with `madvise(MADV_DONTNEED)`.
///   Memory owned by someone else is refused because that assumption fails there: an
///   allocator that purges freed heap pages with `MADV_DONTNEED` may later hand them out as
///   zeroed memory (`alloc_zeroed`), and wasmtime's pooling allocator resets a slot the same
///   way for the next instance; on a file mapping those pages would read back as the file,
///   not as zeros. CUDA managed memory is driver-managed and must not be remapped at all.
/// - If `mmap` fails, the old pages may already be gone; fresh anonymous zero pages are
///   mapped in their place so that `dest` stays valid memory, and if even that fails the
///   process aborts rather than return with a dangling slice.
///
/// # Safety
/// The caller must ensure that the file does not change while it is mapped.
/// On Linux a private mapping copies a page only when this process writes it; until then
/// the page shows the file's *current* contents. So, for as long as the mapping lives:
/// - the file must not be **truncated** below `offset + dest.len()`: touching a page past
///   the new end raises `SIGBUS`, which kills the process (wasmtime may turn a fault in
///   guest code into a trap instead). An I/O error while a page is loaded later (a failing
///   disk, a network file system) is reported the same way.
/// - the file must not be **rewritten in place**: pages not yet written through `dest`
///   would change without any write to them, under references that Rust assumes stable.
///
/// No check here can rule these out, since any code holding a writable handle to the same
/// file could do either; this is why this function (like general-purpose `mmap` crates) is
/// `unsafe`. Map only files that are immutable by construction: TensorWasm's snapshot store
/// writes an image under a temporary name and renames it into place, and replaces or deletes
/// images only by rename or unlink, which leave a mapped inode intact; nothing opens an
/// existing image for writing.
///
/// # Errors
/// As listed above, or the operating system's error from `fstat` or `mmap`.
///
/// # Example
/// ```
/// use std::io::Write;
/// use tensor_wasm_mem::{host_page_size, map_file_private_fixed, AnonymousPages};
///
/// let page = host_page_size();
/// let mut file = tempfile::tempfile()?;
/// file.write_all(&vec![7u8; page])?;
///
/// let mut pages = AnonymousPages::new(2 * page)?;
/// // SAFETY: the temporary file is private to this example and never written again.
/// unsafe { map_file_private_fixed(&file, 0, &mut pages.as_mut_slice()[..page]) }?;
/// assert!(pages.as_slice()[..page].iter().all(|&b| b == 7));
/// assert!(pages.as_slice()[page..].iter().all(|&b| b == 0));
///
/// // A heap buffer is not this crate's memory, aligned or not.
/// let mut heap = vec![0u8; 3 * page];
/// let at = heap.as_ptr().align_offset(page);
/// // SAFETY: as above (and nothing is mapped: the call is refused).
/// assert!(unsafe { map_file_private_fixed(&file, 0, &mut heap[at..at + page]) }.is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
pub unsafe fn map_file_private_fixed(file: &File, offset: u64, dest: &mut [u8]) -> io::Result<()> {
    if dest.is_empty() {
        return Ok(());
    }
    let page = host_page_size();
    let addr = dest.as_mut_ptr();
    if !(addr as usize).is_multiple_of(page)
        || !dest.len().is_multiple_of(page)
        || !offset.is_multiple_of(page as u64)
    {
        return Err(invalid_input(
            "mapping requires host-page-aligned address, length and offset",
        ));
    }
    if !is_owned(addr as usize, dest.len()) {
        return Err(invalid_input(
            "the destination is not memory owned by tensor-wasm-mem \
             (AnonymousPages or GuardedHostBuffer)",
        ));
    }
    let end = offset
        .checked_add(dest.len() as u64)
        .ok_or_else(|| invalid_input("offset overflow"))?;
    let metadata = file.metadata()?;
    if !metadata.is_file() {
        return Err(invalid_input("only regular files can be mapped"));
    }
    if metadata.len() < end {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            "file is shorter than the range to map",
        ));
    }
    let file_offset =
        libc::off_t::try_from(offset).map_err(|_| invalid_input("offset too large"))?;
    // SAFETY: `addr .. addr + len` is exactly the memory of `dest`: live, readable and
    // writable, exclusively borrowed, so no other reference observes the pages being
    // replaced, and inside a mapping this crate owns (checked above), whose owner neither
    // recycles pages with `madvise` nor unmaps them while `dest` is borrowed. MAP_FIXED
    // replaces exactly those pages (address and length are page-aligned) with a private
    // read-write mapping of a range that lies inside the regular file (checked above), so
    // every byte of `dest` stays readable and writable until the owner unmaps it. Writes go
    // to private copies; the file is never modified (MAP_PRIVATE). The file staying
    // unchanged while mapped is this function's `# Safety` contract, upheld by the caller.
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
        // memory back so that `dest` stays valid memory; if even that fails, continuing
        // would leave a dangling slice, so abort.
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

/// A read-only view of a whole file through a shared mapping, unmapped on drop. Pages are read
/// from the page cache on first touch and stay mapped for the view's life, so repeated reads
/// of the same bytes cost a memory copy, not a system call.
pub struct FileView {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value and only read through `&self`; the contract of
// `FileView::new` keeps the bytes unchanged for its life.
unsafe impl Send for FileView {}
// SAFETY: see `Send`: shared access only reads.
unsafe impl Sync for FileView {}

impl FileView {
    /// Maps all of `file` read-only (an empty file needs no mapping).
    ///
    /// # Safety
    /// For as long as the view lives, the file must not be **truncated** (touching a page past
    /// the new end raises `SIGBUS`) nor **written** (the view's bytes are handed out as `&[u8]`,
    /// which must not change). A file that is only ever replaced by rename satisfies both.
    ///
    /// # Errors
    /// The operating system's error if `fstat` or `mmap` fails.
    pub unsafe fn new(file: &File) -> io::Result<Self> {
        let len = usize::try_from(file.metadata()?.len())
            .map_err(|_| invalid_input("file larger than the address space"))?;
        if len == 0 {
            return Ok(Self {
                ptr: NonNull::dangling(),
                len: 0,
            });
        }
        // SAFETY: a fresh read-only shared mapping of an open file at an address the kernel
        // picks touches no existing memory.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(raw.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Self { ptr, len })
    }

    /// The file's bytes.
    #[must_use]
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `len` readable bytes are mapped at `ptr` until drop (or `len` is 0 and the
        // pointer dangling, which an empty slice allows); `new`'s contract keeps them unchanged.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl std::fmt::Debug for FileView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileView").field("len", &self.len).finish()
    }
}

impl Drop for FileView {
    fn drop(&mut self) {
        if self.len > 0 {
            // SAFETY: unmaps exactly the mapping `new` made; no reference into it outlives
            // `self` (`as_slice` borrows `self`).
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        }
    }
}

/// A zeroed, page-aligned, read-write buffer backed by a private anonymous mapping, without
/// guard pages: the kind of memory [`map_file_private_fixed`] accepts. Pages are allocated
/// by the kernel on first touch; the mapping is unmapped on drop.
pub struct AnonymousPages {
    ptr: NonNull<u8>,
    /// Bytes requested.
    len: usize,
    /// Bytes mapped: `len` rounded up to whole pages, at least one page.
    mapped_len: usize,
}

// SAFETY: the mapping is owned exclusively by this value (like a `Box<[u8]>`); access goes
// through `&self`/`&mut self`, so moving it between threads or sharing `&` is sound.
unsafe impl Send for AnonymousPages {}
// SAFETY: see `Send`; `&AnonymousPages` only hands out `&[u8]`.
unsafe impl Sync for AnonymousPages {}

impl AnonymousPages {
    /// Maps `len` bytes (rounded up to whole host pages, at least one) of zeroed memory.
    ///
    /// # Errors
    /// [`io::ErrorKind::InvalidInput`] if rounding overflows; the operating system's error
    /// if `mmap` fails.
    pub fn new(len: usize) -> io::Result<Self> {
        let page = host_page_size();
        let mapped_len = len
            .checked_next_multiple_of(page)
            .ok_or_else(|| invalid_input("length overflow"))?
            .max(page);
        // SAFETY: a fresh anonymous private mapping at an address the kernel picks touches no
        // existing memory.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(raw.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        // Private, anonymous, never reset with `madvise`, forgotten before `munmap` in `drop`.
        record_owned(ptr.as_ptr(), mapped_len);
        Ok(Self {
            ptr,
            len,
            mapped_len,
        })
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
        // Forget first: once unmapped, the address range may be handed to someone else.
        forget_owned(self.ptr.as_ptr());
        // SAFETY: unmaps exactly the range mapped in `new` (possibly remapped since by
        // `map_file_private_fixed`, which only replaces pages inside it); no borrow of the
        // bytes outlives `self`.
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped_len) };
        if rc != 0 {
            tracing::error!(
                error = %io::Error::last_os_error(),
                "munmap of anonymous pages failed; leaking the mapping"
            );
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
    use std::io::{Read, Seek, Write};
    use std::os::unix::fs::FileExt;

    use super::*;
    use crate::GuardedHostBuffer;

    /// A temporary file of `pages` host pages; page `i` is filled with byte `i + 1`.
    fn patterned_file(pages: usize) -> File {
        let page = host_page_size();
        let mut file = tempfile::tempfile().unwrap();
        for i in 0..pages {
            file.write_all(&vec![i as u8 + 1; page]).unwrap();
        }
        file
    }

    /// [`map_file_private_fixed`] on the tests' files.
    fn map(file: &File, offset: u64, dest: &mut [u8]) -> io::Result<()> {
        // SAFETY: every file mapped here is a private temporary file that the test never
        // truncates or writes while a mapping of it lives.
        unsafe { map_file_private_fixed(file, offset, dest) }
    }

    fn file_contents(file: &mut File) -> Vec<u8> {
        let mut bytes = Vec::new();
        file.rewind().unwrap();
        file.read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn anonymous_pages_are_zeroed_aligned_and_owned() {
        let mut pages = AnonymousPages::new(10_000).unwrap();
        assert_eq!(pages.as_slice().len(), 10_000);
        assert_eq!(pages.as_slice().as_ptr() as usize % host_page_size(), 0);
        assert!(pages.as_slice().iter().all(|&b| b == 0));
        pages.as_mut_slice()[9_999] = 5;
        assert_eq!(pages.as_slice()[9_999], 5);

        let start = pages.as_slice().as_ptr() as usize;
        let mapped = 10_000usize.next_multiple_of(host_page_size());
        assert!(is_owned(start, mapped));
        assert!(!is_owned(start, mapped + 1), "past the end of the mapping");
        drop(pages);
        assert!(!is_owned(start, 1), "forgotten on drop");
    }

    #[test]
    fn reads_see_the_file_and_writes_stay_private() {
        let page = host_page_size();
        let mut file = patterned_file(4);
        let before = file_contents(&mut file);
        let mut pages = AnonymousPages::new(4 * page).unwrap();
        pages.as_mut_slice().fill(0xee);

        // File pages 1 and 2 over buffer pages 1 and 2.
        map(
            &file,
            page as u64,
            &mut pages.as_mut_slice()[page..3 * page],
        )
        .unwrap();
        let bytes = pages.as_slice();
        assert!(
            bytes[..page].iter().all(|&b| b == 0xee),
            "page before untouched"
        );
        assert!(bytes[page..2 * page].iter().all(|&b| b == 2));
        assert!(bytes[2 * page..3 * page].iter().all(|&b| b == 3));
        assert!(
            bytes[3 * page..].iter().all(|&b| b == 0xee),
            "page after untouched"
        );

        pages.as_mut_slice()[page..3 * page].fill(0x42);
        pages.as_mut_slice()[page + 17] = 9;
        assert!(pages.as_slice()[page..3 * page]
            .iter()
            .enumerate()
            .all(|(i, &b)| b == if i == 17 { 9 } else { 0x42 }));
        assert_eq!(
            file_contents(&mut file),
            before,
            "writes never reach the file"
        );
        drop(pages);
        assert_eq!(file_contents(&mut file), before);
    }

    #[test]
    fn guarded_host_buffers_accept_mappings() {
        let page = host_page_size();
        let file = patterned_file(2);
        let mut buffer = GuardedHostBuffer::new(2 * page, page).unwrap();
        map(&file, 0, buffer.as_mut_slice()).unwrap();
        assert!(buffer.as_slice()[..page].iter().all(|&b| b == 1));
        assert!(buffer.as_slice()[page..].iter().all(|&b| b == 2));
        let base = buffer.as_ptr() as usize;
        drop(buffer);
        assert!(!is_owned(base, page), "forgotten on drop");
    }

    #[test]
    fn misaligned_or_short_inputs_are_refused_and_leave_dest_alone() {
        let page = host_page_size();
        let file = patterned_file(2);
        let mut pages = AnonymousPages::new(4 * page).unwrap();
        pages.as_mut_slice().fill(0xee);
        let dest = pages.as_mut_slice();
        let kind = |r: io::Result<()>| r.unwrap_err().kind();

        // Misaligned address, length or offset.
        assert_eq!(
            kind(map(&file, 0, &mut dest[1..=page])),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(map(&file, 0, &mut dest[..page - 1])),
            io::ErrorKind::InvalidInput
        );
        assert_eq!(
            kind(map(&file, 1, &mut dest[..page])),
            io::ErrorKind::InvalidInput
        );
        // The file is two pages: three pages, or two from page one, are past its end.
        assert_eq!(
            kind(map(&file, 0, &mut dest[..3 * page])),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            kind(map(&file, page as u64, &mut dest[..2 * page])),
            io::ErrorKind::UnexpectedEof
        );
        assert_eq!(
            kind(map(&file, u64::MAX - 4095, &mut dest[..page])),
            io::ErrorKind::InvalidInput,
            "offset + length overflows"
        );
        // Not a regular file.
        let device = File::open("/dev/zero").unwrap();
        assert_eq!(
            kind(map(&device, 0, &mut dest[..page])),
            io::ErrorKind::InvalidInput
        );
        // Empty is a no-op, even unaligned.
        map(&file, 1, &mut dest[3..3]).unwrap();
        assert!(pages.as_slice().iter().all(|&b| b == 0xee));
    }

    #[test]
    fn memory_this_crate_does_not_own_is_refused() {
        let page = host_page_size();
        let file = patterned_file(1);
        let mut heap = vec![0xeeu8; 3 * page];
        let at = heap.as_ptr().align_offset(page);
        let err = map(&file, 0, &mut heap[at..at + page]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        assert!(heap.iter().all(|&b| b == 0xee));

        // A range that starts inside an owned mapping but runs past its end is refused too.
        let mut pages = AnonymousPages::new(page).unwrap();
        let start = pages.as_mut_slice().as_mut_ptr() as usize;
        assert!(is_owned(start, page));
        assert!(!is_owned(start, 2 * page));
    }

    #[test]
    fn a_failed_mmap_leaves_zeroed_pages() {
        let page = host_page_size();
        let mut readable = patterned_file(1);
        let path = tempfile::NamedTempFile::new().unwrap();
        path.as_file()
            .write_all_at(&file_contents(&mut readable), 0)
            .unwrap();
        // `mmap` needs a readable descriptor; a write-only one passes every check above it.
        let write_only = std::fs::OpenOptions::new()
            .write(true)
            .open(path.path())
            .unwrap();
        let mut pages = AnonymousPages::new(page).unwrap();
        pages.as_mut_slice().fill(0xee);
        let err = map(&write_only, 0, pages.as_mut_slice()).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::PermissionDenied);
        assert!(pages.as_slice().iter().all(|&b| b == 0));
        pages.as_mut_slice()[0] = 1;
        assert_eq!(pages.as_slice()[0], 1, "still ordinary writable memory");
    }
}
