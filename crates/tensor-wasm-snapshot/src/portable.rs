//! The portable encoding: a checksummed header, bincode metadata, a frame table and the
//! memory image as independent zstd data per chunk, compressed and decompressed on all cores.
//!
//! Byte layout, validation order and limits: `docs/snapshot-format.md`.
//!
//! # How a chunk is encoded
//!
//! Compression time goes into zstd's match finder and entropy coder, which earn little on
//! pages of random-looking bytes (model weights, activations: zstd level 1 saves about 9 %
//! on the random `f32`s of [`realistic_image`](crate::realistic_image), run file
//! `bench-results/2026-11-21-snapshot-stored-frames-costs.txt`). So each 4 KiB page
//! of a chunk is classified, and every run of pages of one kind becomes its own zstd frame
//! (RFC 8878), the frames of a chunk concatenated:
//!
//! - all-zero pages: a frame of RLE blocks (4 bytes per 128 KiB), built here;
//! - pages that [look incompressible](looks_incompressible): a frame of raw blocks (the
//!   bytes plus 12 bytes per run), built here without running zstd;
//! - every other page: one zstd frame of the run at the configured level.
//!
//! A chunk whose pages are all of the third kind is therefore one zstd frame, exactly as
//! before; an all-zero chunk is still an empty entry. Concatenated frames are standard zstd
//! data: `ZSTD_decompressDCtx` (behind `zstd::bulk::Decompressor`) decodes them in one call,
//! so restore is unchanged, and a snapshot written this way decodes with the version-1
//! reader that predates it.

use std::sync::OnceLock;

use crate::image::{is_zero, IMAGE_PAGE};
use crate::meta::{check_meta_consistency, check_page_size, decode_meta, encode_meta};
use crate::{RestoreLimits, SnapshotError, SnapshotMeta, FORMAT_VERSION};

/// Magic of the portable encoding.
pub const PORTABLE_MAGIC: [u8; 8] = *b"TWSNAP\0P";
/// Length of the fixed portable header.
pub const PORTABLE_HEADER_LEN: usize = 64;
/// Bytes per frame-table entry.
const FRAME_ENTRY_LEN: usize = 16;
/// Smallest and largest accepted chunk sizes.
const MIN_CHUNK: u32 = 4096;
const MAX_CHUNK: u32 = 64 << 20;

/// zstd frame magic number (RFC 8878, 3.1.1).
const ZSTD_MAGIC: u32 = 0xFD2F_B528;
/// Frame_Header_Descriptor of the frames built here: Frame_Content_Size_flag 2 (a 4-byte
/// content size), Single_Segment_flag 1 (no Window_Descriptor), no checksum, no dictionary.
const STORED_FRAME_DESCRIPTOR: u8 = 0b1010_0000;
/// Bytes of a stored frame's header: magic, descriptor, content size.
const STORED_FRAME_HEADER_LEN: usize = 4 + 1 + 4;
/// Largest block of a zstd frame (Block_Maximum_Size, RFC 8878 3.1.1.2.4).
const ZSTD_BLOCK_MAX: usize = 128 << 10;
/// Block_Type values (RFC 8878 3.1.1.2.2).
const BLOCK_TYPE_RAW: u32 = 0;
const BLOCK_TYPE_RLE: u32 = 1;

/// Bytes per sample of [`looks_incompressible`], and samples per page (evenly spaced).
const ENTROPY_SAMPLE_LEN: usize = 256;
const ENTROPY_SAMPLES: usize = 4;
/// Order-0 entropy of the page sample, in bits per byte, from which a page is stored raw.
///
/// At this entropy an order-0 coder could save at most 15 % of the sample, and the estimate
/// from 1 KiB of a page reads lower than the whole page's entropy. Where the realistic image's
/// random-`f32` and text pages and an executable's pages fall: the `stored_frame_costs`
/// measurement (run file `bench-results/2026-11-21-snapshot-stored-frames-costs.txt`).
const RAW_ENTROPY_BITS: f32 = 6.8;

/// How [`capture_portable`] compresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureOptions {
    /// Uncompressed bytes per zstd frame; a power of two in 4 KiB ..= 64 MiB. Default 1 MiB.
    pub chunk_size: u32,
    /// zstd level of the pages that are neither all zero nor incompressible-looking (those
    /// are stored without zstd's search, see the module documentation). Default 1 (fast; the
    /// image is captured on the request path).
    pub zstd_level: i32,
    /// Worker threads; 0 means `std::thread::available_parallelism`.
    pub threads: usize,
}

impl Default for CaptureOptions {
    fn default() -> Self {
        Self {
            chunk_size: 1 << 20,
            zstd_level: 1,
            threads: 0,
        }
    }
}

fn worker_count(requested: usize, chunks: usize) -> usize {
    let available = if requested == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    } else {
        requested
    };
    available.clamp(1, chunks.max(1))
}

/// Encodes `meta` and `memory` in the portable encoding.
///
/// All-zero chunks are stored as empty entries; the others as zstd data built in parallel
/// (see the module documentation for how a chunk is encoded).
///
/// # Errors
/// [`SnapshotError::InvalidInput`] if `memory.len()` differs from `meta.memory_size_bytes`, the
/// page size does not divide it, `meta.format_version` is not [`FORMAT_VERSION`] or the options
/// are out of range; [`SnapshotError::TooLarge`] for oversized metadata;
/// [`SnapshotError::Io`] if zstd fails.
pub fn capture_portable(
    meta: &SnapshotMeta,
    memory: &[u8],
    options: &CaptureOptions,
) -> Result<Vec<u8>, SnapshotError> {
    check_capture_args(meta, memory)?;
    let chunk_size = options.chunk_size;
    if !chunk_size.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
        return Err(SnapshotError::InvalidInput(format!(
            "chunk size {chunk_size} is not a power of two in {MIN_CHUNK}..={MAX_CHUNK}"
        )));
    }
    let meta_bytes = encode_meta(meta)?;
    let chunks: Vec<&[u8]> = memory.chunks(chunk_size as usize).collect();
    let workers = worker_count(options.threads, chunks.len());
    let per_worker = chunks.len().div_ceil(workers).max(1);

    // Each worker encodes a contiguous range of chunks into one buffer of its own and
    // remembers where each chunk's encoding is: (start, end, CRC-32C).
    let encode_range = |range: &[&[u8]]| -> Result<(Vec<u8>, Vec<Span>), SnapshotError> {
        let mut compressor = zstd::bulk::Compressor::new(options.zstd_level)?;
        let mut buf = Vec::new();
        let mut spans = Vec::with_capacity(range.len());
        for chunk in range {
            let start = buf.len();
            encode_chunk(&mut compressor, chunk, &mut buf)?;
            spans.push((start, buf.len(), crc32c::crc32c(&buf[start..])));
        }
        Ok((buf, spans))
    };
    let parts: Vec<(Vec<u8>, Vec<Span>)> = if workers == 1 {
        vec![encode_range(&chunks)?]
    } else {
        let results: Vec<Result<_, SnapshotError>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunks
                .chunks(per_worker)
                .map(|range| s.spawn(move || encode_range(range)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(SnapshotError::Corrupt("worker panicked".into())))
                })
                .collect()
        });
        results.into_iter().collect::<Result<_, _>>()?
    };
    let frames: Vec<(&[u8], u32)> = parts
        .iter()
        .flat_map(|(buf, spans)| {
            spans
                .iter()
                .map(|&(start, end, crc)| (&buf[start..end], crc))
        })
        .collect();

    let table_len = frames.len() * FRAME_ENTRY_LEN;
    let data_start = PORTABLE_HEADER_LEN + meta_bytes.len() + table_len;
    let total_len = data_start + frames.iter().map(|(f, _)| f.len()).sum::<usize>();
    let mut table = Vec::with_capacity(table_len);
    let mut offset = data_start as u64;
    for &(frame, crc) in &frames {
        table.extend_from_slice(&offset.to_le_bytes());
        let len = u32::try_from(frame.len())
            .map_err(|_| SnapshotError::Corrupt("compressed frame exceeds 4 GiB".into()))?;
        table.extend_from_slice(&len.to_le_bytes());
        table.extend_from_slice(&crc.to_le_bytes());
        offset += u64::from(len);
    }

    let mut header = [0u8; PORTABLE_HEADER_LEN];
    header[0..8].copy_from_slice(&PORTABLE_MAGIC);
    put_u32(&mut header, 8, FORMAT_VERSION);
    put_u32(&mut header, 12, 0); // flags
    put_u32(&mut header, 16, meta_bytes.len() as u32); // <= META_HARD_LIMIT
    put_u32(&mut header, 20, chunk_size);
    put_u64(&mut header, 24, memory.len() as u64);
    put_u64(&mut header, 32, frames.len() as u64);
    put_u64(&mut header, 40, total_len as u64);
    put_u32(&mut header, 48, crc32c::crc32c(&meta_bytes));
    put_u32(&mut header, 52, crc32c::crc32c(&table));
    let header_crc = crc32c::crc32c(&header[..60]);
    put_u32(&mut header, 60, header_crc);

    let mut out = Vec::with_capacity(total_len);
    out.extend_from_slice(&header);
    out.extend_from_slice(&meta_bytes);
    out.extend_from_slice(&table);
    for (frame, _) in &frames {
        out.extend_from_slice(frame);
    }
    Ok(out)
}

/// Where a worker of [`capture_portable`] put the encoding of a chunk: start and end in the
/// worker's buffer, CRC-32C of those bytes.
type Span = (usize, usize, u32);

/// How the pages of a run are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PageKind {
    /// All zero: a frame of RLE blocks.
    Zero,
    /// Random-looking: a frame of raw blocks.
    Raw,
    /// Anything else: a zstd frame at the configured level.
    Compress,
}

fn page_kind(page: &[u8]) -> PageKind {
    if is_zero(page) {
        PageKind::Zero
    } else if looks_incompressible(page) {
        PageKind::Raw
    } else {
        PageKind::Compress
    }
}

/// `c * log2(c)` for every count a page sample can produce.
fn xlog2_table() -> &'static [f32; ENTROPY_SAMPLE_LEN * ENTROPY_SAMPLES + 1] {
    static TABLE: OnceLock<[f32; ENTROPY_SAMPLE_LEN * ENTROPY_SAMPLES + 1]> = OnceLock::new();
    TABLE.get_or_init(|| {
        let mut table = [0f32; ENTROPY_SAMPLE_LEN * ENTROPY_SAMPLES + 1];
        for (c, x) in table.iter_mut().enumerate().skip(1) {
            let c = c as f64;
            *x = (c * c.log2()) as f32;
        }
        table
    })
}

/// Whether a full page looks incompressible: the order-0 (byte-histogram) entropy of
/// [`ENTROPY_SAMPLES`] evenly spaced samples of [`ENTROPY_SAMPLE_LEN`] bytes reaches
/// [`RAW_ENTROPY_BITS`].
///
/// Cost: a histogram of 1 KiB and 256 table look-ups per 4 KiB page, a small fraction of what
/// zstd level 1 spends on the same page (figures in the run file named at
/// [`RAW_ENTROPY_BITS`]). Order-0 entropy misses long repeats (a page of random
/// bytes that also occurs earlier in the chunk is stored raw rather than as a match); the
/// price is compression ratio on such data, never correctness. Partial pages (the end of an
/// image whose length is not a multiple of 4 KiB) are left to zstd.
fn looks_incompressible(page: &[u8]) -> bool {
    page.len() >= IMAGE_PAGE && sample_entropy(page) >= RAW_ENTROPY_BITS
}

/// Order-0 entropy in bits per byte of the samples of a full page (see
/// [`looks_incompressible`]).
fn sample_entropy(page: &[u8]) -> f32 {
    let stride = IMAGE_PAGE / ENTROPY_SAMPLES;
    let mut counts = [0u16; 256];
    for sample in page.chunks_exact(stride) {
        for &b in &sample[..ENTROPY_SAMPLE_LEN] {
            counts[usize::from(b)] += 1;
        }
    }
    let table = xlog2_table();
    let sum: f32 = counts.iter().map(|&c| table[usize::from(c)]).sum();
    let n = (ENTROPY_SAMPLE_LEN * ENTROPY_SAMPLES) as f32;
    // H = -sum(c/n * log2(c/n)) = log2(n) - sum(c * log2(c)) / n
    n.log2() - sum / n
}

/// Appends the encoding of one chunk to `out`: nothing for an all-zero chunk, otherwise one
/// zstd frame per run of pages of one [`PageKind`], never more bytes than
/// [`stored_frame_len`] (a single raw frame is written instead).
fn encode_chunk(
    compressor: &mut zstd::bulk::Compressor<'_>,
    chunk: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), SnapshotError> {
    if is_zero(chunk) {
        return Ok(());
    }
    let start = out.len();
    let mut run_start = 0;
    let mut run_kind = None;
    for (i, page) in chunk.chunks(IMAGE_PAGE).enumerate() {
        let kind = page_kind(page);
        match run_kind {
            Some(k) if k == kind => {}
            Some(k) => {
                let at = i * IMAGE_PAGE;
                encode_run(compressor, k, &chunk[run_start..at], out)?;
                run_start = at;
                run_kind = Some(kind);
            }
            None => run_kind = Some(kind),
        }
    }
    if let Some(kind) = run_kind {
        encode_run(compressor, kind, &chunk[run_start..], out)?;
    }
    if out.len() - start > stored_frame_len(chunk.len()) {
        out.truncate(start);
        push_stored_frame(out, chunk, PageKind::Raw);
    }
    Ok(())
}

fn encode_run(
    compressor: &mut zstd::bulk::Compressor<'_>,
    kind: PageKind,
    run: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), SnapshotError> {
    if kind == PageKind::Compress {
        // zstd writes straight into the spare capacity after `out`'s bytes.
        out.reserve(zstd::zstd_safe::compress_bound(run.len()));
        let mut cursor = std::io::Cursor::new(&mut *out);
        cursor.set_position(cursor.get_ref().len() as u64);
        compressor.compress_to_buffer(run, &mut cursor)?;
    } else {
        push_stored_frame(out, run, kind);
    }
    Ok(())
}

/// Bytes of the frame [`push_stored_frame`] writes for `len` raw bytes.
fn stored_frame_len(len: usize) -> usize {
    STORED_FRAME_HEADER_LEN + 3 * len.div_ceil(ZSTD_BLOCK_MAX).max(1) + len
}

/// Appends a zstd frame (RFC 8878) holding `data` without compression: a single-segment
/// header with a 4-byte Frame_Content_Size, then blocks of at most 128 KiB, raw blocks for
/// [`PageKind::Raw`] and RLE blocks of byte 0 for [`PageKind::Zero`] (whose `data` must be
/// all zero), no checksum. `data` is at most one chunk (64 MiB).
fn push_stored_frame(out: &mut Vec<u8>, data: &[u8], kind: PageKind) {
    let (block_type, len) = match kind {
        PageKind::Zero => (
            BLOCK_TYPE_RLE,
            STORED_FRAME_HEADER_LEN + 4 * data.len().div_ceil(ZSTD_BLOCK_MAX).max(1),
        ),
        _ => (BLOCK_TYPE_RAW, stored_frame_len(data.len())),
    };
    out.reserve(len);
    out.extend_from_slice(&ZSTD_MAGIC.to_le_bytes());
    out.push(STORED_FRAME_DESCRIPTOR);
    out.extend_from_slice(&(data.len() as u32).to_le_bytes()); // <= MAX_CHUNK
    let mut blocks = data.chunks(ZSTD_BLOCK_MAX).peekable();
    if blocks.peek().is_none() {
        // An empty frame still has one (empty, last) block.
        out.extend_from_slice(&(1 | (BLOCK_TYPE_RAW << 1)).to_le_bytes()[..3]);
    }
    while let Some(block) = blocks.next() {
        let last = u32::from(blocks.peek().is_none());
        let header = last | (block_type << 1) | ((block.len() as u32) << 3);
        out.extend_from_slice(&header.to_le_bytes()[..3]);
        if block_type == BLOCK_TYPE_RLE {
            out.push(block[0]);
        } else {
            out.extend_from_slice(block);
        }
    }
}

pub(crate) fn check_capture_args(meta: &SnapshotMeta, memory: &[u8]) -> Result<(), SnapshotError> {
    if meta.format_version != FORMAT_VERSION {
        return Err(SnapshotError::InvalidInput(format!(
            "metadata format version {} is not {FORMAT_VERSION}",
            meta.format_version
        )));
    }
    if meta.memory_size_bytes != memory.len() as u64 {
        return Err(SnapshotError::InvalidInput(format!(
            "metadata declares {} memory bytes but the image has {}",
            meta.memory_size_bytes,
            memory.len()
        )));
    }
    check_page_size(meta).map_err(|e| SnapshotError::InvalidInput(e.to_string()))
}

/// The parsed, validated fixed header of a portable snapshot.
#[derive(Debug)]
struct PortableHeader {
    meta_len: usize,
    chunk_size: usize,
    memory_size: usize,
    chunk_count: usize,
    meta_crc: u32,
    table_crc: u32,
}

fn parse_header(bytes: &[u8], limits: &RestoreLimits) -> Result<PortableHeader, SnapshotError> {
    if bytes.len() < 8 {
        return Err(SnapshotError::Truncated("header"));
    }
    if bytes[0..8] != PORTABLE_MAGIC {
        return Err(SnapshotError::BadMagic);
    }
    if bytes.len() < 12 {
        return Err(SnapshotError::Truncated("header"));
    }
    let version = get_u32(bytes, 8);
    if version != FORMAT_VERSION {
        return Err(SnapshotError::UnsupportedVersion {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    if bytes.len() < PORTABLE_HEADER_LEN {
        return Err(SnapshotError::Truncated("header"));
    }
    if crc32c::crc32c(&bytes[..60]) != get_u32(bytes, 60) {
        return Err(SnapshotError::ChecksumMismatch { section: "header" });
    }
    let flags = get_u32(bytes, 12);
    if flags != 0 {
        return Err(SnapshotError::Corrupt(format!("unknown flags {flags:#x}")));
    }
    let meta_len = get_u32(bytes, 16);
    let chunk_size = get_u32(bytes, 20);
    let memory_size = get_u64(bytes, 24);
    let chunk_count = get_u64(bytes, 32);
    let total_len = get_u64(bytes, 40);
    limits.check_meta(u64::from(meta_len))?;
    limits.check_memory(memory_size)?;
    if !chunk_size.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
        return Err(SnapshotError::Corrupt(format!("chunk size {chunk_size}")));
    }
    if chunk_count != memory_size.div_ceil(u64::from(chunk_size)) {
        return Err(SnapshotError::Corrupt(format!(
            "{chunk_count} frames cannot hold {memory_size} bytes in chunks of {chunk_size}"
        )));
    }
    if total_len > bytes.len() as u64 {
        return Err(SnapshotError::Truncated("frames"));
    }
    if total_len < bytes.len() as u64 {
        return Err(SnapshotError::Corrupt(format!(
            "{} bytes after the end of the snapshot",
            bytes.len() as u64 - total_len
        )));
    }
    // memory_size fits usize (check_memory); chunk_count <= memory_size / 4096 + 1.
    Ok(PortableHeader {
        meta_len: meta_len as usize,
        chunk_size: chunk_size as usize,
        memory_size: memory_size as usize,
        chunk_count: chunk_count as usize,
        meta_crc: get_u32(bytes, 48),
        table_crc: get_u32(bytes, 52),
    })
}

/// One frame of the frame table, validated against the snapshot bounds.
#[derive(Debug, Clone, Copy)]
struct Frame {
    start: usize,
    len: usize,
    crc: u32,
}

/// Reads just the metadata of a portable snapshot, validating the header, the metadata
/// checksum and the module hash (not the frames).
///
/// # Errors
/// As [`restore_portable`], for the checks up to and including the metadata.
pub fn read_portable_meta(
    bytes: &[u8],
    limits: &RestoreLimits,
    expected_module_sha256: &[u8; 32],
) -> Result<SnapshotMeta, SnapshotError> {
    let header = parse_header(bytes, limits)?;
    read_meta_section(bytes, &header, expected_module_sha256)
}

fn read_meta_section(
    bytes: &[u8],
    header: &PortableHeader,
    expected_module_sha256: &[u8; 32],
) -> Result<SnapshotMeta, SnapshotError> {
    let meta_end = PORTABLE_HEADER_LEN + header.meta_len;
    let meta_bytes = bytes
        .get(PORTABLE_HEADER_LEN..meta_end)
        .ok_or(SnapshotError::Truncated("metadata"))?;
    if crc32c::crc32c(meta_bytes) != header.meta_crc {
        return Err(SnapshotError::ChecksumMismatch {
            section: "metadata",
        });
    }
    let meta = decode_meta(meta_bytes)?;
    check_meta_consistency(&meta, header.memory_size as u64, expected_module_sha256)?;
    Ok(meta)
}

/// Decodes a portable snapshot eagerly: validates everything, then decompresses the frames on
/// all cores into a freshly allocated image.
///
/// Validation order: header (magic, version, checksum, flags, declared sizes against `limits`,
/// total length), metadata (checksum, decode, consistency, module hash), frame table
/// (checksum, bounds, contiguity), then per frame its checksum before it is decompressed into
/// a buffer of exactly the chunk size. The image (`memory_size_bytes`, already checked against
/// `limits.max_memory_bytes`) is the only large allocation.
///
/// # Errors
/// Every malformed input yields an error (never a panic): see [`SnapshotError`].
pub fn restore_portable(
    bytes: &[u8],
    limits: &RestoreLimits,
    expected_module_sha256: &[u8; 32],
) -> Result<(SnapshotMeta, Vec<u8>), SnapshotError> {
    let header = parse_header(bytes, limits)?;
    let meta = read_meta_section(bytes, &header, expected_module_sha256)?;
    let frames = read_frame_table(bytes, &header)?;

    let mut memory = vec![0u8; header.memory_size];
    let mut outputs: Vec<(&mut [u8], Frame)> = memory
        .chunks_mut(header.chunk_size)
        .zip(frames.iter().copied())
        .collect();
    let workers = worker_count(0, outputs.len());
    let per_worker = outputs.len().div_ceil(workers).max(1);
    let decompress_range = |range: &mut [(&mut [u8], Frame)]| -> Result<(), SnapshotError> {
        let mut decompressor = zstd::bulk::Decompressor::new()?;
        for (out, frame) in range.iter_mut() {
            decompress_frame(&mut decompressor, bytes, *frame, out)?;
        }
        Ok(())
    };
    if workers == 1 {
        decompress_range(&mut outputs)?;
    } else {
        let results: Vec<Result<(), SnapshotError>> = std::thread::scope(|s| {
            let handles: Vec<_> = outputs
                .chunks_mut(per_worker)
                .map(|range| s.spawn(|| decompress_range(range)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(SnapshotError::Corrupt("worker panicked".into())))
                })
                .collect()
        });
        results.into_iter().collect::<Result<(), _>>()?;
    }
    drop(outputs);
    Ok((meta, memory))
}

fn read_frame_table(bytes: &[u8], header: &PortableHeader) -> Result<Vec<Frame>, SnapshotError> {
    let table_start = PORTABLE_HEADER_LEN + header.meta_len;
    let table_len = header
        .chunk_count
        .checked_mul(FRAME_ENTRY_LEN)
        .ok_or_else(|| SnapshotError::Corrupt("frame table length overflows".into()))?;
    let table = table_start
        .checked_add(table_len)
        .and_then(|end| bytes.get(table_start..end))
        .ok_or(SnapshotError::Truncated("frame table"))?;
    if crc32c::crc32c(table) != header.table_crc {
        return Err(SnapshotError::ChecksumMismatch {
            section: "frame_table",
        });
    }
    let max_frame = zstd::zstd_safe::compress_bound(header.chunk_size);
    let mut expected_start = table_start + table_len;
    let mut frames = Vec::with_capacity(header.chunk_count);
    for entry in table.chunks_exact(FRAME_ENTRY_LEN) {
        let start = get_u64(entry, 0);
        let len = get_u32(entry, 8) as usize;
        if start != expected_start as u64 {
            return Err(SnapshotError::Corrupt(format!(
                "frame starts at {start}, expected {expected_start}"
            )));
        }
        if len > max_frame {
            return Err(SnapshotError::Corrupt(format!(
                "frame of {len} bytes exceeds the compression bound {max_frame}"
            )));
        }
        let end = expected_start
            .checked_add(len)
            .filter(|&end| end <= bytes.len())
            .ok_or(SnapshotError::Truncated("frames"))?;
        frames.push(Frame {
            start: expected_start,
            len,
            crc: get_u32(entry, 12),
        });
        expected_start = end;
    }
    if expected_start != bytes.len() {
        return Err(SnapshotError::Corrupt(format!(
            "frames end at {expected_start} but the snapshot has {} bytes",
            bytes.len()
        )));
    }
    Ok(frames)
}

fn decompress_frame(
    decompressor: &mut zstd::bulk::Decompressor<'_>,
    bytes: &[u8],
    frame: Frame,
    out: &mut [u8],
) -> Result<(), SnapshotError> {
    let src = &bytes[frame.start..frame.start + frame.len]; // bounds checked in the table
    if crc32c::crc32c(src) != frame.crc {
        return Err(SnapshotError::ChecksumMismatch { section: "frame" });
    }
    if src.is_empty() {
        // An all-zero chunk; `out` is freshly zeroed.
        return Ok(());
    }
    let written = decompressor
        .decompress_to_buffer(src, out)
        .map_err(|e| SnapshotError::Corrupt(format!("zstd frame does not decode: {e}")))?;
    if written != out.len() {
        return Err(SnapshotError::Corrupt(format!(
            "frame decodes to {written} bytes, expected {}",
            out.len()
        )));
    }
    Ok(())
}

pub(crate) fn put_u32(buf: &mut [u8], at: usize, v: u32) {
    buf[at..at + 4].copy_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(buf: &mut [u8], at: usize, v: u64) {
    buf[at..at + 8].copy_from_slice(&v.to_le_bytes());
}

/// Reads a little-endian u32; callers guarantee `at + 4 <= buf.len()`.
pub(crate) fn get_u32(buf: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&buf[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Reads a little-endian u64; callers guarantee `at + 8 <= buf.len()`.
pub(crate) fn get_u64(buf: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&buf[at..at + 8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::realistic_image;

    fn meta(len: usize) -> SnapshotMeta {
        SnapshotMeta::new([1; 32], "fn", "acme", len as u64)
    }

    /// `len` bytes of random little-endian `f32`s in [-1, 1) (as in `realistic_image`).
    fn floats(len: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut out = Vec::with_capacity(len + 4);
        while out.len() < len {
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
            let v = (r >> 40) as f32 / (1u64 << 23) as f32 - 1.0;
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// `len` bytes of log-like ASCII text.
    fn text(len: usize, seed: usize) -> Vec<u8> {
        const WORDS: [&str; 8] = ["tensor", "ok", "latency", "the", "gpu", "value", ": ", "\n"];
        let mut out = Vec::with_capacity(len + 8);
        let mut i = seed;
        while out.len() < len {
            out.extend_from_slice(WORDS[(i * 7 + i / 3) % 8].as_bytes());
            out.push(b' ');
            i += 1;
        }
        out.truncate(len);
        out
    }

    /// Splits zstd data into its frames: (bytes, content size).
    fn frames_of(mut data: &[u8]) -> Vec<(usize, usize)> {
        let mut frames = Vec::new();
        while !data.is_empty() {
            let len = zstd::zstd_safe::find_frame_compressed_size(data).unwrap();
            let content = zstd::zstd_safe::get_frame_content_size(data).unwrap();
            frames.push((len, content.unwrap() as usize));
            data = &data[len..];
        }
        frames
    }

    #[test]
    fn stored_frames_decode_with_zstd() {
        let sizes = [
            0,
            1,
            4096,
            ZSTD_BLOCK_MAX - 1,
            ZSTD_BLOCK_MAX,
            ZSTD_BLOCK_MAX + 1,
            2 * ZSTD_BLOCK_MAX,
            (1 << 20) + 5,
        ];
        for len in sizes {
            for kind in [PageKind::Raw, PageKind::Zero] {
                let data = if kind == PageKind::Raw {
                    floats(len, len as u64)
                } else {
                    vec![0; len]
                };
                let mut frame = vec![0xee]; // appends after existing bytes
                push_stored_frame(&mut frame, &data, kind);
                let frame = &frame[1..];
                if kind == PageKind::Raw {
                    assert_eq!(frame.len(), stored_frame_len(len));
                }
                assert_eq!(frame[..4], [0x28, 0xb5, 0x2f, 0xfd]);
                assert_eq!(
                    zstd::zstd_safe::get_frame_content_size(frame).unwrap(),
                    Some(len as u64)
                );
                assert_eq!(
                    zstd::zstd_safe::find_frame_compressed_size(frame).unwrap(),
                    frame.len()
                );
                assert_eq!(zstd::bulk::decompress(frame, len).unwrap(), data);
                // The restore path: a decompressor into a buffer of exactly the content size.
                let mut out = vec![0x55; len];
                let written = zstd::bulk::Decompressor::new()
                    .unwrap()
                    .decompress_to_buffer(frame, &mut out)
                    .unwrap();
                assert_eq!(written, len);
                assert!(out == data, "{kind:?} frame of {len} bytes");
            }
        }
    }

    #[test]
    fn pages_are_classified_by_content() {
        assert_eq!(page_kind(&[0; IMAGE_PAGE]), PageKind::Zero);
        assert_eq!(page_kind(&floats(IMAGE_PAGE, 3)), PageKind::Raw);
        assert_eq!(page_kind(&text(IMAGE_PAGE, 3)), PageKind::Compress);
        // A page that is half floats, half text, and a partial page of floats, go to zstd.
        let mut half = floats(IMAGE_PAGE / 2, 4);
        half.extend(text(IMAGE_PAGE / 2, 4));
        assert_eq!(page_kind(&half), PageKind::Compress);
        assert_eq!(page_kind(&floats(IMAGE_PAGE - 1, 5)), PageKind::Compress);
        // Every random-float and no text page of a realistic image looks incompressible.
        let image = realistic_image(8 << 20, 17);
        for page in image.chunks(IMAGE_PAGE).filter(|p| !is_zero(p)) {
            let is_text = page.iter().all(u8::is_ascii);
            assert_eq!(looks_incompressible(page), !is_text);
        }
    }

    #[test]
    fn mixed_chunk_is_concatenated_frames_one_zstd_call_decodes() {
        let mut chunk = vec![0u8; 2 * IMAGE_PAGE];
        chunk.extend(floats(3 * IMAGE_PAGE, 1));
        chunk.extend(text(2 * IMAGE_PAGE, 1));
        chunk.extend(vec![0u8; IMAGE_PAGE]);
        chunk.extend(floats(40 * IMAGE_PAGE, 2)); // more than one 128 KiB block
        chunk.extend(text(IMAGE_PAGE + 100, 2)); // ends in a partial page
        let mut compressor = zstd::bulk::Compressor::new(1).unwrap();
        let mut out = Vec::new();
        encode_chunk(&mut compressor, &chunk, &mut out).unwrap();
        let rle = |pages: usize| (STORED_FRAME_HEADER_LEN + 4, pages * IMAGE_PAGE);
        let raw = |pages: usize| (stored_frame_len(pages * IMAGE_PAGE), pages * IMAGE_PAGE);
        let frames = frames_of(&out);
        assert_eq!(frames.len(), 6, "{frames:?}");
        assert_eq!(frames[..2], [rle(2), raw(3)]);
        assert_eq!(frames[3..5], [rle(1), raw(40)]);
        for text_frame in [frames[2], frames[5]] {
            assert!(
                text_frame.0 < text_frame.1 / 2,
                "text is compressed: {frames:?}"
            );
        }
        // What `restore_portable` (and every version-1 reader) does with a chunk's data.
        let mut back = vec![0xaa; chunk.len()];
        let written = zstd::bulk::Decompressor::new()
            .unwrap()
            .decompress_to_buffer(&out[..], &mut back)
            .unwrap();
        assert_eq!(written, chunk.len());
        assert!(back == chunk);
    }

    #[test]
    fn uniform_chunks_are_one_frame() {
        let mut compressor = zstd::bulk::Compressor::new(1).unwrap();
        // A chunk with nothing incompressible is the same single zstd frame as before.
        let chunk = text(1 << 20, 9);
        let mut out = Vec::new();
        encode_chunk(&mut compressor, &chunk, &mut out).unwrap();
        assert_eq!(out, zstd::bulk::compress(&chunk, 1).unwrap());
        // An incompressible one is a single raw frame; an all-zero one is empty.
        let chunk = floats(1 << 20, 9);
        out.clear();
        encode_chunk(&mut compressor, &chunk, &mut out).unwrap();
        assert_eq!(
            frames_of(&out),
            [(stored_frame_len(chunk.len()), chunk.len())]
        );
        out.clear();
        encode_chunk(&mut compressor, &[0; 1 << 20], &mut out).unwrap();
        assert!(out.is_empty());
    }

    #[test]
    fn page_by_page_alternation_stays_within_the_frame_bound() {
        // The most frames a chunk can hold: the kind changes on every page.
        for chunk_size in [MIN_CHUNK, 16 << 10, 1 << 20] {
            let mut memory = Vec::new();
            for (i, page) in (0..(4 << 20) / IMAGE_PAGE).enumerate() {
                match i % 4 {
                    0 => memory.extend(floats(IMAGE_PAGE, page as u64)),
                    1 => memory.extend(vec![0; IMAGE_PAGE]),
                    2 => memory.extend(text(IMAGE_PAGE, page)),
                    _ => memory.extend(floats(IMAGE_PAGE - 8, page as u64).iter().chain(&[0; 8])),
                }
            }
            let options = CaptureOptions {
                chunk_size,
                ..CaptureOptions::default()
            };
            let snap = capture_portable(&meta(memory.len()), &memory, &options).unwrap();
            let limits = RestoreLimits::default();
            let header = parse_header(&snap, &limits).unwrap();
            for frame in read_frame_table(&snap, &header).unwrap() {
                assert!(frame.len <= stored_frame_len(chunk_size as usize));
            }
            let (_, back) = restore_portable(&snap, &limits, &[1; 32]).unwrap();
            assert!(back == memory, "chunk size {chunk_size}");
        }
    }

    /// Rewrites frame `index`'s bytes with `edit`, then fixes its CRC, the table CRC and the
    /// header CRC, so that only the zstd decoder can notice.
    fn edit_frame(snap: &mut [u8], index: usize, edit: impl FnOnce(&mut [u8])) {
        let header = parse_header(snap, &RestoreLimits::default()).unwrap();
        let frame = read_frame_table(snap, &header).unwrap()[index];
        edit(&mut snap[frame.start..frame.start + frame.len]);
        let crc = crc32c::crc32c(&snap[frame.start..frame.start + frame.len]);
        let table_start = PORTABLE_HEADER_LEN + header.meta_len;
        put_u32(snap, table_start + index * FRAME_ENTRY_LEN + 12, crc);
        let table_end = table_start + header.chunk_count * FRAME_ENTRY_LEN;
        let table_crc = crc32c::crc32c(&snap[table_start..table_end]);
        put_u32(snap, 52, table_crc);
        let header_crc = crc32c::crc32c(&snap[..60]);
        put_u32(snap, 60, header_crc);
    }

    #[test]
    fn corrupted_stored_frames_are_refused() {
        let memory = floats(256 << 10, 7); // two chunks of one raw frame each
        let options = CaptureOptions {
            chunk_size: 128 << 10,
            ..CaptureOptions::default()
        };
        let snap = capture_portable(&meta(memory.len()), &memory, &options).unwrap();
        let limits = RestoreLimits::default();
        let frame = read_frame_table(&snap, &parse_header(&snap, &limits).unwrap()).unwrap()[1];
        assert_eq!(frame.len, stored_frame_len(128 << 10));
        let restore = |snap: &[u8]| restore_portable(snap, &limits, &[1; 32]);
        assert!(restore(&snap).unwrap().1 == memory);

        // A payload byte changed without fixing the CRC.
        let mut bad = snap.clone();
        bad[frame.start + 100] ^= 1;
        assert!(matches!(
            restore(&bad),
            Err(SnapshotError::ChecksumMismatch { section: "frame" })
        ));
        // Structural damage behind valid CRCs: each is refused by zstd or the length check.
        type Edit = fn(&mut [u8]);
        let edits: [(&str, Edit); 5] = [
            ("reserved block type", |f| f[9] |= 0b110),
            ("block size one less", |f| f[10] = f[10].wrapping_sub(1)),
            ("content size one more", |f| f[5] = f[5].wrapping_add(1)),
            ("last-block flag cleared", |f| f[9] &= !1),
            ("bad magic", |f| f[0] ^= 0x10),
        ];
        for (what, edit) in edits {
            let mut bad = snap.clone();
            edit_frame(&mut bad, 1, edit);
            assert!(
                matches!(restore(&bad), Err(SnapshotError::Corrupt(_))),
                "{what}"
            );
        }
    }

    #[test]
    fn zero_chunks_are_empty_frames() {
        let memory = vec![0u8; 4 << 20];
        let snap =
            capture_portable(&meta(memory.len()), &memory, &CaptureOptions::default()).unwrap();
        assert!(
            snap.len() < 1024,
            "all-zero image took {} bytes",
            snap.len()
        );
        let (_, back) = restore_portable(&snap, &RestoreLimits::default(), &[1; 32]).unwrap();
        assert_eq!(back, memory);
    }

    #[test]
    fn single_thread_and_small_chunks_round_trip() {
        let memory = realistic_image(3 * 65_536, 9);
        let options = CaptureOptions {
            chunk_size: 4096,
            zstd_level: 1,
            threads: 1,
        };
        let snap = capture_portable(&meta(memory.len()), &memory, &options).unwrap();
        let (_, back) = restore_portable(&snap, &RestoreLimits::default(), &[1; 32]).unwrap();
        assert_eq!(back, memory);
    }

    #[test]
    fn declared_size_over_limit_is_refused_before_allocation() {
        let memory = realistic_image(1 << 20, 2);
        let snap =
            capture_portable(&meta(memory.len()), &memory, &CaptureOptions::default()).unwrap();
        let limits = RestoreLimits {
            max_memory_bytes: (1 << 20) - 1,
            ..RestoreLimits::default()
        };
        assert!(matches!(
            restore_portable(&snap, &limits, &[1; 32]),
            Err(SnapshotError::TooLarge {
                what: "memory image",
                ..
            })
        ));
    }

    #[test]
    fn bad_options_and_mismatched_meta_are_refused() {
        let memory = vec![0u8; 65_536];
        let bad = CaptureOptions {
            chunk_size: 3000,
            ..CaptureOptions::default()
        };
        assert!(matches!(
            capture_portable(&meta(memory.len()), &memory, &bad),
            Err(SnapshotError::InvalidInput(_))
        ));
        assert!(matches!(
            capture_portable(&meta(1), &memory, &CaptureOptions::default()),
            Err(SnapshotError::InvalidInput(_))
        ));
    }

    /// Single-thread costs behind the choices of the module documentation, on the pages of
    /// a 64 MiB realistic image (8 MiB of text pages, 8 MiB of random-float pages), each
    /// variant timed once per round, rounds interleaved: `cargo test --release -p
    /// tensor-wasm-snapshot --lib -- --ignored --nocapture stored_frame_costs`. Reports MB/s
    /// of input (median, min and max over the rounds) and compression ratios.
    #[test]
    #[ignore = "measurement, not a test; run in release mode"]
    fn stored_frame_costs() {
        use std::time::Instant;
        const ROUNDS: usize = 15;
        const MB: usize = 1 << 20;
        let image = realistic_image(64 << 20, 1);
        let pages = |text: bool| -> Vec<u8> {
            let class = image
                .chunks(IMAGE_PAGE)
                .filter(|p| !is_zero(p) && p.iter().all(u8::is_ascii) == text);
            class.flatten().copied().take(8 * MB).collect()
        };
        let (text, floats) = (pages(true), pages(false));
        let nonzero: Vec<&[u8]> = text
            .chunks(IMAGE_PAGE)
            .chain(floats.chunks(IMAGE_PAGE))
            .collect();
        let zeros = vec![0u8; 8 * MB];
        let stored = |data: &[u8], kind| -> Vec<Vec<u8>> {
            let frame = |c: &[u8]| {
                let mut f = Vec::new();
                push_stored_frame(&mut f, c, kind);
                f
            };
            data.chunks(MB).map(frame).collect()
        };
        let raw_frames = stored(&floats, PageKind::Raw);
        let rle_frames = stored(&zeros, PageKind::Zero);
        // The chunk encoders before and after stored frames, on 32 MiB of the image, 1 MiB
        // chunks, and the decoding of what they produce (into a reused buffer: no page faults).
        let chunks: Vec<&[u8]> = image[..32 * MB].chunks(MB).collect();
        let mut level1 = zstd::bulk::Compressor::new(1).unwrap();
        let encode_before = |c: &mut zstd::bulk::Compressor<'_>, chunk: &[u8]| {
            if is_zero(chunk) {
                Vec::new()
            } else {
                c.compress(chunk).unwrap()
            }
        };
        let encode_after = |c: &mut zstd::bulk::Compressor<'_>, chunk: &[u8]| {
            let mut out = Vec::new();
            encode_chunk(c, chunk, &mut out).unwrap();
            out
        };
        let before: Vec<Vec<u8>> = chunks
            .iter()
            .map(|c| encode_before(&mut level1, c))
            .collect();
        let after: Vec<Vec<u8>> = chunks
            .iter()
            .map(|c| encode_after(&mut level1, c))
            .collect();
        let mut out = vec![1u8; MB];
        let mut decompressor = zstd::bulk::Decompressor::new().unwrap();
        let mut results: Vec<(String, usize, Vec<f64>)> = Vec::new();
        let mut ratios: Vec<String> = Vec::new();
        for round in 0..ROUNDS {
            let mut slot = 0;
            let mut time = |name: String, len: usize, f: &mut dyn FnMut()| {
                let start = Instant::now();
                f();
                let t = start.elapsed().as_secs_f64();
                if round == 0 {
                    results.push((name, len, Vec::new()));
                }
                results[slot].2.push(t);
                slot += 1;
            };
            time(
                "classify text and float pages (page_kind)".into(),
                16 * MB,
                &mut || {
                    for p in &nonzero {
                        std::hint::black_box(page_kind(p));
                    }
                },
            );
            for (name, data, level) in [
                ("text", &text, 1),
                ("text", &text, -1),
                ("text", &text, -3),
                ("text", &text, -5),
                ("floats", &floats, 1),
            ] {
                let mut c = zstd::bulk::Compressor::new(level).unwrap();
                let mut bytes = 0;
                let name = format!("compress {name}, zstd level {level}");
                time(name.clone(), data.len(), &mut || {
                    bytes = data.chunks(MB).map(|m| c.compress(m).unwrap().len()).sum();
                });
                if round == 0 {
                    ratios.push(format!(
                        "{name}: ratio {:.3}",
                        bytes as f64 / data.len() as f64
                    ));
                }
            }
            time(
                "encode 32 MiB of the image, one level-1 frame per chunk (before)".into(),
                32 * MB,
                &mut || {
                    for chunk in &chunks {
                        std::hint::black_box(encode_before(&mut level1, chunk));
                    }
                },
            );
            time(
                "encode 32 MiB of the image, stored frames (after)".into(),
                32 * MB,
                &mut || {
                    for chunk in &chunks {
                        std::hint::black_box(encode_after(&mut level1, chunk));
                    }
                },
            );
            time("decode the before frames".into(), 32 * MB, &mut || {
                for f in before.iter().filter(|f| !f.is_empty()) {
                    decompressor.decompress_to_buffer(&f[..], &mut out).unwrap();
                }
            });
            time("decode the after frames".into(), 32 * MB, &mut || {
                for f in after.iter().filter(|f| !f.is_empty()) {
                    decompressor.decompress_to_buffer(&f[..], &mut out).unwrap();
                }
            });
            time(
                "floats as raw frames (push_stored_frame)".into(),
                8 * MB,
                &mut || {
                    let mut f = Vec::new();
                    for m in floats.chunks(MB) {
                        f.clear();
                        push_stored_frame(&mut f, m, PageKind::Raw);
                        std::hint::black_box(&f);
                    }
                },
            );
            time(
                "decode the raw frames with zstd".into(),
                8 * MB,
                &mut || {
                    for f in &raw_frames {
                        decompressor.decompress_to_buffer(&f[..], &mut out).unwrap();
                    }
                },
            );
            time(
                "memcpy of the same bytes (direct-copy peer)".into(),
                8 * MB,
                &mut || {
                    for m in floats.chunks(MB) {
                        out.copy_from_slice(std::hint::black_box(m));
                    }
                },
            );
            time(
                "decode RLE zero frames with zstd".into(),
                8 * MB,
                &mut || {
                    for f in &rle_frames {
                        decompressor.decompress_to_buffer(&f[..], &mut out).unwrap();
                    }
                },
            );
            time(
                "memset of the same bytes (direct peer)".into(),
                8 * MB,
                &mut || {
                    for _ in &rle_frames {
                        std::hint::black_box(&mut out).fill(0);
                    }
                },
            );
        }
        // How often a whole-chunk decision ("store the chunk raw if it barely compresses")
        // would apply: the share of incompressible-looking pages per 1 MiB chunk.
        let mut shares: Vec<usize> = image
            .chunks(MB)
            .map(|c| {
                let raw = c
                    .chunks(IMAGE_PAGE)
                    .filter(|p| page_kind(p) == PageKind::Raw);
                raw.count() * 100 / (MB / IMAGE_PAGE)
            })
            .collect();
        shares.sort_unstable();
        println!(
            "incompressible-looking pages per 1 MiB chunk: min {} %, median {} %, max {} % ({} chunks)",
            shares[0],
            shares[shares.len() / 2],
            shares[shares.len() - 1],
            shares.len()
        );
        // Where pages fall against RAW_ENTROPY_BITS: the sample estimate and the whole page's
        // entropy, for the text and random-f32 pages of the image and the full pages of this
        // test executable (machine code and data).
        let whole_page_entropy = |page: &[u8]| {
            let mut counts = [0usize; 256];
            page.iter().for_each(|&b| counts[usize::from(b)] += 1);
            let n = page.len() as f64;
            let h: f64 = counts
                .iter()
                .filter(|&&c| c > 0)
                .map(|&c| -(c as f64 / n) * (c as f64 / n).log2())
                .sum();
            h as f32 + 0.0 // no "-0.00" for a constant page
        };
        let range = |pages: &mut dyn Iterator<Item = &[u8]>, f: &dyn Fn(&[u8]) -> f32| {
            pages.fold((f32::MAX, f32::MIN), |(lo, hi), p| {
                (lo.min(f(p)), hi.max(f(p)))
            })
        };
        let exe = std::fs::read("/proc/self/exe").unwrap_or_default();
        for (name, data) in [
            ("text", &text),
            ("random-f32", &floats),
            ("test executable", &exe),
        ] {
            let (s_lo, s_hi) = range(&mut data.chunks_exact(IMAGE_PAGE), &sample_entropy);
            let (w_lo, w_hi) = range(&mut data.chunks_exact(IMAGE_PAGE), &whole_page_entropy);
            let raw = data
                .chunks_exact(IMAGE_PAGE)
                .filter(|p| looks_incompressible(p));
            println!(
                "{name} pages ({}): sample entropy {s_lo:.2}-{s_hi:.2} bits/byte, whole-page entropy {w_lo:.2}-{w_hi:.2}, stored raw: {}",
                data.len() / IMAGE_PAGE,
                raw.count()
            );
        }
        // Portable size of the whole image, against one level-1 frame per non-empty chunk
        // (the encoder before stored frames).
        let one_frame: usize = image
            .chunks(MB)
            .filter(|c| !is_zero(c))
            .map(|c| zstd::bulk::compress(c, 1).unwrap().len())
            .sum();
        let snap =
            capture_portable(&meta(image.len()), &image, &CaptureOptions::default()).unwrap();
        println!(
            "portable size of the 64 MiB image: {} bytes ({:.3} of the image); frames alone as one level-1 frame per chunk: {} bytes ({:.3})",
            snap.len(),
            snap.len() as f64 / image.len() as f64,
            one_frame,
            one_frame as f64 / image.len() as f64
        );
        for line in ratios {
            println!("{line}");
        }
        for (name, len, mut t) in results {
            t.sort_by(f64::total_cmp);
            let mbps = |s: f64| len as f64 / s / 1e6;
            println!(
                "{name}: median {:.0} MB/s (min {:.0}, max {:.0}, {ROUNDS} rounds)",
                mbps(t[ROUNDS / 2]),
                mbps(t[ROUNDS - 1]),
                mbps(t[0])
            );
        }
    }
}
