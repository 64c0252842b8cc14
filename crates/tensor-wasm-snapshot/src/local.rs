//! The local encoding: a page-aligned sparse file whose data region is the memory image at
//! its own offsets, with all-zero 4 KiB pages left as holes, so that a restore maps the whole
//! image with one copy-on-write `mmap` ([`LocalImage::map_into`]).
//!
//! Byte layout, validation order and limits: `docs/snapshot-format.md`.

use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use tensor_wasm_durable::{DurableError, DurableFile, WriteOptions};
use tensor_wasm_mem::{host_page_size, map_file_private_fixed, FileView};

use crate::image::{is_zero, IMAGE_PAGE};
use crate::meta::{check_meta_consistency, decode_meta, encode_meta};
use crate::portable::{check_capture_args, get_u32, get_u64, put_u32, put_u64};
use crate::{restore_portable, RestoreLimits, SnapshotError, SnapshotMeta, FORMAT_VERSION};

/// Magic of the local encoding.
pub const LOCAL_MAGIC: [u8; 8] = *b"TWSNAP\0L";
/// Length of the fixed local header.
pub const LOCAL_HEADER_LEN: usize = 64;
/// Bytes per run-table entry.
const RUN_ENTRY_LEN: usize = 24;

/// An eager restore copies and checksums this much at a time, so the checksum reads what the
/// copy just wrote from the core's L2 cache.
const READ_CHUNK: usize = 128 << 10;

/// Images of at least this many bytes are restored eagerly by one thread per core.
const PARALLEL_READ_MIN: usize = 8 << 20;

/// Zeroes `bytes` page by page, writing only pages that are not zero already: the memory an
/// eager restore writes into is mostly fresh (zero) pages, and a page that is only read stays
/// unallocated, or at least is not written a second time.
fn zero(bytes: &mut [u8]) {
    for page in bytes.chunks_mut(IMAGE_PAGE) {
        if !is_zero(page) {
            page.fill(0);
        }
    }
}

/// The checksum of the part of run `run` that one thread of an eager restore read.
struct Piece {
    run: usize,
    crc: u32,
    len: usize,
}

/// A maximal run of consecutive non-zero pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Run {
    first_page: u64,
    page_count: u64,
    crc: u32,
}

fn find_runs(memory: &[u8]) -> Vec<Run> {
    let mut runs: Vec<Run> = Vec::new();
    let mut current: Option<(u64, u64)> = None;
    for (i, page) in memory.chunks(IMAGE_PAGE).enumerate() {
        let i = i as u64;
        match (is_zero(page), current) {
            (false, None) => current = Some((i, 1)),
            (false, Some((first, n))) => current = Some((first, n + 1)),
            (true, Some((first, n))) => {
                runs.push(make_run(memory, first, n));
                current = None;
            }
            (true, None) => {}
        }
    }
    if let Some((first, n)) = current {
        runs.push(make_run(memory, first, n));
    }
    runs
}

fn make_run(memory: &[u8], first_page: u64, page_count: u64) -> Run {
    let start = first_page as usize * IMAGE_PAGE;
    let end = start + page_count as usize * IMAGE_PAGE;
    Run {
        first_page,
        page_count,
        crc: crc32c::crc32c(&memory[start..end]),
    }
}

fn data_offset(meta_len: usize, run_count: usize) -> usize {
    (LOCAL_HEADER_LEN + meta_len + run_count * RUN_ENTRY_LEN).next_multiple_of(IMAGE_PAGE)
}

/// Writes `meta` and `memory` as a local image at `path`.
///
/// The file is written durably ([`tensor_wasm_durable::DurableFile`]): under a temporary name
/// next to `path`, `fsync`ed and renamed into place, so a reader never sees a half-written
/// image, even after a crash. A local image is a per-host cache that can always be rebuilt
/// from the portable snapshot.
///
/// # Errors
/// [`SnapshotError::InvalidInput`] if `memory.len()` is not a multiple of 4096 or disagrees
/// with `meta`; [`SnapshotError::Io`] for file-system errors.
pub fn write_local(meta: &SnapshotMeta, memory: &[u8], path: &Path) -> Result<(), SnapshotError> {
    check_capture_args(meta, memory)?;
    if !memory.len().is_multiple_of(IMAGE_PAGE) {
        return Err(SnapshotError::InvalidInput(format!(
            "local images hold whole 4 KiB pages; {} bytes is not a multiple",
            memory.len()
        )));
    }
    let meta_bytes = encode_meta(meta)?;
    let runs = find_runs(memory);
    let run_count = u32::try_from(runs.len())
        .map_err(|_| SnapshotError::InvalidInput("too many page runs".into()))?;
    let mut table = Vec::with_capacity(runs.len() * RUN_ENTRY_LEN);
    for run in &runs {
        table.extend_from_slice(&run.first_page.to_le_bytes());
        table.extend_from_slice(&run.page_count.to_le_bytes());
        table.extend_from_slice(&run.crc.to_le_bytes());
        table.extend_from_slice(&0u32.to_le_bytes());
    }
    let data_start = data_offset(meta_bytes.len(), runs.len());

    let mut header = [0u8; LOCAL_HEADER_LEN];
    header[0..8].copy_from_slice(&LOCAL_MAGIC);
    put_u32(&mut header, 8, FORMAT_VERSION);
    put_u32(&mut header, 12, 0); // flags
    put_u32(&mut header, 16, meta_bytes.len() as u32); // <= META_HARD_LIMIT
    put_u32(&mut header, 20, IMAGE_PAGE as u32);
    put_u64(&mut header, 24, memory.len() as u64);
    put_u32(&mut header, 32, run_count);
    put_u32(&mut header, 36, crc32c::crc32c(&meta_bytes));
    put_u32(&mut header, 40, crc32c::crc32c(&table));
    put_u64(&mut header, 48, data_start as u64);
    let header_crc = crc32c::crc32c(&header[..60]);
    put_u32(&mut header, 60, header_crc);

    // Dropped on an error before the commit: the temporary file goes with it.
    let mut file = DurableFile::create(path, &WriteOptions::new()).map_err(io_error)?;
    file.write_all(&header)?;
    file.write_all(&meta_bytes)?;
    file.write_all(&table)?;
    // Zero pages stay holes: only the runs are written.
    file.file().set_len((data_start + memory.len()) as u64)?;
    for run in &runs {
        let start = run.first_page as usize * IMAGE_PAGE;
        let end = start + run.page_count as usize * IMAGE_PAGE;
        file.file()
            .write_all_at(&memory[start..end], (data_start + start) as u64)?;
    }
    file.commit().map_err(io_error)?;
    Ok(())
}

fn io_error(e: DurableError) -> SnapshotError {
    SnapshotError::Io(e.into())
}

/// Converts a portable snapshot into a local image at `out_path` (once per host), after the
/// full validation of [`restore_portable`]. Returns the metadata.
///
/// # Errors
/// Those of [`restore_portable`] and [`write_local`].
pub fn portable_to_local(
    portable: &[u8],
    limits: &RestoreLimits,
    expected_module_sha256: &[u8; 32],
    out_path: &Path,
) -> Result<SnapshotMeta, SnapshotError> {
    let (meta, memory) = restore_portable(portable, limits, expected_module_sha256)?;
    write_local(&meta, &memory, out_path)?;
    Ok(meta)
}

/// An opened, validated local image: header, metadata and run table are checked; data pages
/// are checked by [`LocalImage::read_into`] and [`LocalImage::verify`], not by the lazy
/// [`LocalImage::map_into`].
#[derive(Debug)]
pub struct LocalImage {
    file: File,
    /// The file mapped read-only, once [`LocalImage::map_for_reads`] asked for it.
    view: Option<FileView>,
    meta: SnapshotMeta,
    runs: Vec<Run>,
    data_offset: u64,
    memory_size: usize,
    /// Set once [`LocalImage::verify`] has checked every run of this opened image.
    verified: AtomicBool,
}

impl LocalImage {
    /// Opens and validates the image at `path`.
    ///
    /// Validation order: header (magic, version, checksum, flags, page size, declared sizes
    /// against `limits`, data offset, file length), metadata (checksum, decode, consistency,
    /// module hash), run table (checksum, sorted, disjoint, non-adjacent, in bounds).
    ///
    /// # Errors
    /// See [`SnapshotError`]; nothing larger than the declared (and limit-checked) metadata
    /// and run table is allocated.
    pub fn open(
        path: &Path,
        limits: &RestoreLimits,
        expected_module_sha256: &[u8; 32],
    ) -> Result<Self, SnapshotError> {
        let mut file = File::open(path)?;
        let file_len = file.metadata()?.len();
        let mut header = [0u8; LOCAL_HEADER_LEN];
        let have = read_up_to(&mut file, &mut header)?;
        if have < 8 {
            return Err(SnapshotError::Truncated("header"));
        }
        if header[0..8] != LOCAL_MAGIC {
            return Err(SnapshotError::BadMagic);
        }
        if have < 12 {
            return Err(SnapshotError::Truncated("header"));
        }
        let version = get_u32(&header, 8);
        if version != FORMAT_VERSION {
            return Err(SnapshotError::UnsupportedVersion {
                found: version,
                supported: FORMAT_VERSION,
            });
        }
        if have < LOCAL_HEADER_LEN {
            return Err(SnapshotError::Truncated("header"));
        }
        if crc32c::crc32c(&header[..60]) != get_u32(&header, 60) {
            return Err(SnapshotError::ChecksumMismatch { section: "header" });
        }
        let flags = get_u32(&header, 12);
        if flags != 0 {
            return Err(SnapshotError::Corrupt(format!("unknown flags {flags:#x}")));
        }
        let meta_len = get_u32(&header, 16);
        let page_size = get_u32(&header, 20);
        let memory_size = get_u64(&header, 24);
        let run_count = u64::from(get_u32(&header, 32));
        let data_offset = get_u64(&header, 48);
        if page_size as usize != IMAGE_PAGE {
            return Err(SnapshotError::Corrupt(format!("page size {page_size}")));
        }
        limits.check_meta(u64::from(meta_len))?;
        limits.check_memory(memory_size)?;
        if !memory_size.is_multiple_of(IMAGE_PAGE as u64) {
            return Err(SnapshotError::Corrupt(format!(
                "memory size {memory_size} is not whole pages"
            )));
        }
        let pages = memory_size / IMAGE_PAGE as u64;
        if run_count > pages.div_ceil(2) {
            return Err(SnapshotError::Corrupt(format!(
                "{run_count} runs cannot fit {pages} pages"
            )));
        }
        // Both fit usize: bounded by limits (meta) and by the addressable image (runs).
        let (meta_len, run_count) = (meta_len as usize, run_count as usize);
        if data_offset != data_offset_u64(meta_len, run_count) {
            return Err(SnapshotError::Corrupt(format!("data offset {data_offset}")));
        }
        let expected_len = data_offset + memory_size;
        if file_len < expected_len {
            return Err(SnapshotError::Truncated("data"));
        }
        if file_len > expected_len {
            return Err(SnapshotError::Corrupt(format!(
                "{} bytes after the end of the image",
                file_len - expected_len
            )));
        }

        let mut meta_bytes = vec![0u8; meta_len];
        file.read_exact_at(&mut meta_bytes, LOCAL_HEADER_LEN as u64)?;
        if crc32c::crc32c(&meta_bytes) != get_u32(&header, 36) {
            return Err(SnapshotError::ChecksumMismatch {
                section: "metadata",
            });
        }
        let meta = decode_meta(&meta_bytes)?;
        check_meta_consistency(&meta, memory_size, expected_module_sha256)?;

        let mut table = vec![0u8; run_count * RUN_ENTRY_LEN];
        file.read_exact_at(&mut table, (LOCAL_HEADER_LEN + meta_len) as u64)?;
        if crc32c::crc32c(&table) != get_u32(&header, 40) {
            return Err(SnapshotError::ChecksumMismatch {
                section: "run_table",
            });
        }
        let mut runs = Vec::with_capacity(run_count);
        let mut next_free = 0u64; // first page a run may start at
        for entry in table.chunks_exact(RUN_ENTRY_LEN) {
            let run = Run {
                first_page: get_u64(entry, 0),
                page_count: get_u64(entry, 8),
                crc: get_u32(entry, 16),
            };
            let end = run.first_page.checked_add(run.page_count);
            let ok = run.page_count > 0
                && run.first_page >= next_free
                && end.is_some_and(|end| end <= pages)
                && get_u32(entry, 20) == 0;
            if !ok {
                return Err(SnapshotError::Corrupt(format!("bad page run {run:?}")));
            }
            next_free = end.unwrap_or(pages) + 1; // runs are maximal: a zero page separates them
            runs.push(run);
        }
        Ok(Self {
            file,
            view: None,
            meta,
            runs,
            data_offset,
            memory_size: memory_size as usize,
            verified: AtomicBool::new(false),
        })
    }

    /// The snapshot's metadata.
    #[must_use]
    pub fn meta(&self) -> &SnapshotMeta {
        &self.meta
    }

    /// Image length in bytes (a multiple of 4096).
    #[must_use]
    pub fn memory_size(&self) -> usize {
        self.memory_size
    }

    /// Bytes of non-zero pages stored in the file.
    #[must_use]
    pub fn stored_bytes(&self) -> u64 {
        self.runs.iter().map(|r| r.page_count).sum::<u64>() * IMAGE_PAGE as u64
    }

    /// Lazily restores the image into `dest[..memory_size]` with one private (copy-on-write)
    /// file mapping: no data is read until a page is touched; writes to `dest` never reach the
    /// file. Bytes of `dest` past `memory_size` are left alone.
    ///
    /// Requirements, all checked: `dest` starts on a 4 KiB boundary, holds at least
    /// `memory_size` bytes, the host page size is 4 KiB, and `dest` is memory owned by
    /// `tensor-wasm-mem` whose pages may be replaced: an [`crate::AnonymousPages`], or a
    /// [`tensor_wasm_mem::GuardedHostBuffer`] such as a wasmtime linear memory made by its
    /// host-backed memory creator. Other memory (heap allocations, wasmtime's pooled memory,
    /// device or shared memory) is refused; use [`LocalImage::read_into`] there. `dest` need
    /// not be zeroed: zero pages are mapped from holes of the file. The mapping is made by
    /// [`tensor_wasm_mem::map_file_private_fixed`]. Data-page checksums are not verified
    /// here; call [`LocalImage::verify`] once after conversion when the file system is not
    /// trusted.
    ///
    /// # Safety
    /// The image file must not be **truncated** (a later first touch of a page past the new
    /// end raises `SIGBUS`) or **rewritten in place** (pages not yet written through `dest`
    /// would change under live references) for as long as the mapping lives, that is until
    /// the owner of `dest` unmaps it. Nothing here can check that. Images written by
    /// [`write_local`] satisfy it when nothing else writes to the snapshot directory:
    /// [`write_local`] only ever replaces an image by rename, and a replaced or deleted image
    /// stays intact for the mappings that still use it. See
    /// [`tensor_wasm_mem::map_file_private_fixed`] for the full contract.
    ///
    /// # Errors
    /// [`SnapshotError::InvalidInput`] when a requirement above is not met (then `dest` is
    /// untouched); [`SnapshotError::Io`] if the file is shorter than its header says (then
    /// `dest` is untouched) or if `mmap` fails (then `dest[..memory_size]` is zeroed).
    #[allow(unsafe_code)]
    pub unsafe fn map_into(&self, dest: &mut [u8]) -> Result<(), SnapshotError> {
        self.check_dest(dest)?;
        if host_page_size() != IMAGE_PAGE {
            return Err(SnapshotError::InvalidInput(format!(
                "host page size {} is not 4096; use read_into",
                host_page_size()
            )));
        }
        if !(dest.as_ptr() as usize).is_multiple_of(IMAGE_PAGE) {
            return Err(SnapshotError::InvalidInput(
                "destination is not 4 KiB aligned".into(),
            ));
        }
        // SAFETY: the file not changing while mapped is this function's own `# Safety`
        // contract, passed on to its caller unchanged; everything else is checked there.
        unsafe {
            map_file_private_fixed(&self.file, self.data_offset, &mut dest[..self.memory_size])
        }
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::InvalidInput => SnapshotError::InvalidInput(e.to_string()),
            _ => SnapshotError::Io(e),
        })
    }

    /// Eagerly restores the image into `dest[..memory_size]`: zero pages are written as zeros,
    /// runs are read and their checksums verified. Any alignment works.
    ///
    /// Images of 8 MiB or more are read by one thread per core, each
    /// taking a contiguous share of the pages; a run split between threads is checked by
    /// combining the checksums of its pieces.
    ///
    /// # Errors
    /// [`SnapshotError::InvalidInput`] if `dest` is too small;
    /// [`SnapshotError::ChecksumMismatch`] (`data`) if a run is corrupt, after which `dest`
    /// holds partial data; [`SnapshotError::Io`] on read errors.
    pub fn read_into(&self, dest: &mut [u8]) -> Result<(), SnapshotError> {
        self.read(dest, true)
    }

    /// [`LocalImage::read_into`], except that once this opened image has passed
    /// [`LocalImage::verify`] the runs are copied without computing their checksums again:
    /// the trust [`LocalImage::map_into`] gives the same file (docs/snapshot-format.md). An
    /// image that was not verified is read and checked as by [`LocalImage::read_into`].
    ///
    /// # Errors
    /// As [`LocalImage::read_into`].
    pub fn read_verified_into(&self, dest: &mut [u8]) -> Result<(), SnapshotError> {
        self.read(dest, !self.verified.load(Ordering::Acquire))
    }

    /// The eager restore; with `check`, each run's checksum is verified.
    fn read(&self, dest: &mut [u8], check: bool) -> Result<(), SnapshotError> {
        self.check_dest(dest)?;
        let dest = &mut dest[..self.memory_size];
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let threads = cores.min(self.memory_size / PARALLEL_READ_MIN).max(1);
        let share = (self.memory_size / IMAGE_PAGE).div_ceil(threads) * IMAGE_PAGE;
        let shares: Vec<Result<Vec<Piece>, SnapshotError>> = if threads == 1 {
            vec![self.read_share(dest, 0, check)]
        } else {
            std::thread::scope(|scope| {
                let workers: Vec<_> = dest
                    .chunks_mut(share)
                    .enumerate()
                    .map(|(i, part)| scope.spawn(move || self.read_share(part, i * share, check)))
                    .collect();
                workers
                    .into_iter()
                    .map(|worker| {
                        worker.join().unwrap_or_else(|_| {
                            Err(SnapshotError::Corrupt("a restore thread panicked".into()))
                        })
                    })
                    .collect()
            })
        };
        if !check {
            return shares.into_iter().try_for_each(|share| share.map(drop));
        }
        // Each run's checksum from its pieces, in order (shares are in page order).
        let mut sums: Vec<Option<u32>> = vec![None; self.runs.len()];
        for share in shares {
            for piece in share? {
                let sum = &mut sums[piece.run];
                *sum = Some(match *sum {
                    None => piece.crc,
                    Some(before) => crc32c::crc32c_combine(before, piece.crc, piece.len),
                });
            }
        }
        if self
            .runs
            .iter()
            .zip(sums)
            .any(|(run, sum)| sum != Some(run.crc))
        {
            return Err(SnapshotError::ChecksumMismatch { section: "data" });
        }
        Ok(())
    }

    /// Reads the image's bytes `offset..offset + part.len()` into `part`: the stored pages
    /// from the file or its mapping (128 KiB at a time, with `check` checksummed while still in
    /// cache), zeros elsewhere.
    /// Returns the checksum of each run's piece in this share (0 without `check`).
    fn read_share(
        &self,
        part: &mut [u8],
        offset: usize,
        check: bool,
    ) -> Result<Vec<Piece>, SnapshotError> {
        let end = offset + part.len();
        let run_end = |run: &Run| (run.first_page + run.page_count) as usize * IMAGE_PAGE;
        let first = self.runs.partition_point(|run| run_end(run) <= offset);
        let mut pieces = Vec::new();
        let mut zero_from = offset;
        for (index, run) in self.runs.iter().enumerate().skip(first) {
            let start = run.first_page as usize * IMAGE_PAGE;
            if start >= end {
                break;
            }
            let (lo, hi) = (start.max(offset), run_end(run).min(end));
            zero(&mut part[zero_from - offset..lo - offset]);
            let (mut crc, mut at) = (0u32, lo);
            for chunk in part[lo - offset..hi - offset].chunks_mut(READ_CHUNK) {
                let from = self.data_offset + at as u64;
                match &self.view {
                    // In bounds: `open` checked the file's length against the image.
                    Some(view) => {
                        chunk.copy_from_slice(&view.as_slice()[from as usize..][..chunk.len()]);
                    }
                    None => self.file.read_exact_at(chunk, from)?,
                }
                if check {
                    crc = crc32c::crc32c_append(crc, chunk);
                }
                at += chunk.len();
            }
            pieces.push(Piece {
                run: index,
                crc,
                len: hi - lo,
            });
            zero_from = hi;
        }
        zero(&mut part[zero_from - offset..]);
        Ok(pieces)
    }

    /// Makes [`LocalImage::read_into`] copy from a read-only mapping of the file, kept for the
    /// image's life, instead of reading it with a system call per MiB: after the first
    /// restore, the pages are mapped already and a restore costs a memory copy and the
    /// checksums.
    ///
    /// # Safety
    /// The image file must not be truncated or written for as long as this image lives (see
    /// [`FileView::new`]). Images written by [`write_local`] satisfy it when nothing else
    /// writes to the snapshot directory: it only ever replaces an image by rename.
    ///
    /// # Errors
    /// [`SnapshotError::Io`] if the file cannot be mapped; reads then keep using the file.
    #[allow(unsafe_code)]
    pub unsafe fn map_for_reads(&mut self) -> Result<(), SnapshotError> {
        // SAFETY: this function's own contract, passed on unchanged.
        self.view = Some(unsafe { FileView::new(&self.file) }?);
        Ok(())
    }

    /// Reads every stored run (1 MiB at a time) and checks its checksum. After it succeeds,
    /// [`LocalImage::read_verified_into`] trusts the runs of this opened image.
    ///
    /// # Errors
    /// [`SnapshotError::ChecksumMismatch`] (`data`) or [`SnapshotError::Io`].
    pub fn verify(&self) -> Result<(), SnapshotError> {
        let mut buf = vec![0u8; 1 << 20];
        for run in &self.runs {
            let mut offset = self.data_offset + run.first_page * IMAGE_PAGE as u64;
            let mut left = run.page_count * IMAGE_PAGE as u64;
            let mut crc = 0u32;
            while left > 0 {
                let n = left.min(buf.len() as u64) as usize;
                self.file.read_exact_at(&mut buf[..n], offset)?;
                crc = crc32c::crc32c_append(crc, &buf[..n]);
                offset += n as u64;
                left -= n as u64;
            }
            if crc != run.crc {
                return Err(SnapshotError::ChecksumMismatch { section: "data" });
            }
        }
        self.verified.store(true, Ordering::Release);
        Ok(())
    }

    fn check_dest(&self, dest: &[u8]) -> Result<(), SnapshotError> {
        if dest.len() < self.memory_size {
            return Err(SnapshotError::InvalidInput(format!(
                "destination holds {} bytes, the image {}",
                dest.len(),
                self.memory_size
            )));
        }
        Ok(())
    }
}

fn data_offset_u64(meta_len: usize, run_count: usize) -> u64 {
    data_offset(meta_len, run_count) as u64
}

/// Reads until `buf` is full or end of file; returns the bytes read.
fn read_up_to(file: &mut File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut have = 0;
    while have < buf.len() {
        match file.read(&mut buf[have..]) {
            Ok(0) => break,
            Ok(n) => have += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(have)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_maximal_and_skip_zero_pages() {
        let mut memory = vec![0u8; 8 * IMAGE_PAGE];
        for page in [1, 2, 5, 7] {
            memory[page * IMAGE_PAGE + 17] = 1;
        }
        let runs: Vec<(u64, u64)> = find_runs(&memory)
            .iter()
            .map(|r| (r.first_page, r.page_count))
            .collect();
        assert_eq!(runs, vec![(1, 2), (5, 1), (7, 1)]);
    }

    #[test]
    fn odd_sized_memory_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let mut meta = SnapshotMeta::new([0; 32], "f", "t", 100);
        meta.page_size = 1;
        let err = write_local(&meta, &[1u8; 100], &dir.path().join("x")).unwrap_err();
        assert!(matches!(err, SnapshotError::InvalidInput(_)));
    }

    #[test]
    fn map_into_refuses_memory_that_tensor_wasm_mem_does_not_own() {
        let dir = tempfile::tempdir().unwrap();
        let memory = crate::realistic_image(2 * 65_536, 3);
        let meta = SnapshotMeta::new([0; 32], "f", "t", memory.len() as u64);
        let path = dir.path().join("img.twl");
        write_local(&meta, &memory, &path).unwrap();
        let image = LocalImage::open(&path, &RestoreLimits::default(), &[0; 32]).unwrap();

        // 4 KiB aligned heap memory: aligned, but its allocator owns the pages.
        let mut heap = vec![0xeeu8; memory.len() + IMAGE_PAGE];
        let at = heap.as_ptr().align_offset(IMAGE_PAGE);
        let dest = &mut heap[at..at + memory.len()];
        // SAFETY: the image is a private temporary file nothing writes while mapped (and
        // nothing is mapped: the call is refused).
        #[allow(unsafe_code)]
        let err = unsafe { image.map_into(dest) }.unwrap_err();
        assert!(matches!(err, SnapshotError::InvalidInput(_)), "{err}");
        assert!(dest.iter().all(|&b| b == 0xee), "left untouched");
        image.read_into(dest).unwrap();
        assert!(dest == &memory[..]);
    }

    #[test]
    fn write_local_replaces_by_rename_and_leaves_no_temp_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("img.twl");
        let first = crate::realistic_image(65_536, 1);
        let second = crate::realistic_image(65_536, 2);
        let meta = SnapshotMeta::new([0; 32], "f", "t", first.len() as u64);
        write_local(&meta, &first, &path).unwrap();
        let old = LocalImage::open(&path, &RestoreLimits::default(), &[0; 32]).unwrap();
        write_local(&meta, &second, &path).unwrap();
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["img.twl"]);
        // The open image still reads the file it opened; a new open reads the new one.
        old.verify().unwrap();
        let mut memory = vec![0u8; first.len()];
        old.read_into(&mut memory).unwrap();
        assert!(memory == first);
        let new = LocalImage::open(&path, &RestoreLimits::default(), &[0; 32]).unwrap();
        new.read_into(&mut memory).unwrap();
        assert!(memory == second);

        // A failed write (a directory is in the way) leaves nothing behind.
        let blocked = dir.path().join("blocked");
        std::fs::create_dir_all(blocked.join("inside")).unwrap();
        let err = write_local(&meta, &first, &blocked).unwrap_err();
        assert!(matches!(err, SnapshotError::Io(_)), "{err}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 2);
    }
}
