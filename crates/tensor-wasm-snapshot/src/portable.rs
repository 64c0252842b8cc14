//! The portable encoding: a checksummed header, bincode metadata, a frame table and the
//! memory image as independent zstd frames, compressed and decompressed on all cores.
//!
//! Byte layout, validation order and limits: `docs/snapshot-format.md`.

use crate::image::is_zero;
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

/// How [`capture_portable`] compresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureOptions {
    /// Uncompressed bytes per zstd frame; a power of two in 4 KiB ..= 64 MiB. Default 1 MiB.
    pub chunk_size: u32,
    /// zstd level. Default 1 (fast; the image is captured on the request path).
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
/// All-zero chunks are stored as empty frames; the others are zstd frames compressed in
/// parallel.
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

    let compress_range = |range: &[&[u8]]| -> Result<Vec<Vec<u8>>, SnapshotError> {
        let mut compressor = zstd::bulk::Compressor::new(options.zstd_level)?;
        range
            .iter()
            .map(|chunk| {
                if is_zero(chunk) {
                    Ok(Vec::new())
                } else {
                    Ok(compressor.compress(chunk)?)
                }
            })
            .collect()
    };
    let frames: Vec<Vec<u8>> = if workers == 1 {
        compress_range(&chunks)?
    } else {
        let results: Vec<Result<Vec<Vec<u8>>, SnapshotError>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunks
                .chunks(per_worker)
                .map(|range| s.spawn(move || compress_range(range)))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(SnapshotError::Corrupt("worker panicked".into())))
                })
                .collect()
        });
        let mut frames = Vec::with_capacity(chunks.len());
        for part in results {
            frames.extend(part?);
        }
        frames
    };

    let table_len = frames.len() * FRAME_ENTRY_LEN;
    let data_start = PORTABLE_HEADER_LEN + meta_bytes.len() + table_len;
    let total_len = data_start + frames.iter().map(Vec::len).sum::<usize>();
    let mut table = Vec::with_capacity(table_len);
    let mut offset = data_start as u64;
    for frame in &frames {
        table.extend_from_slice(&offset.to_le_bytes());
        let len = u32::try_from(frame.len())
            .map_err(|_| SnapshotError::Corrupt("compressed frame exceeds 4 GiB".into()))?;
        table.extend_from_slice(&len.to_le_bytes());
        table.extend_from_slice(&crc32c::crc32c(frame).to_le_bytes());
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
    for frame in &frames {
        out.extend_from_slice(frame);
    }
    Ok(out)
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
            zstd_level: 3,
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
}
