//! Capture: [`capture_portable`] encodes metadata and image in the portable encoding, the
//! chunks on all cores.

use super::frames::encode_chunk;
use super::layout::{
    put_u32, put_u64, FRAME_ENTRY_LEN, MAX_CHUNK, MIN_CHUNK, PORTABLE_HEADER_LEN, PORTABLE_MAGIC,
};
use super::worker_count;
use crate::meta::{check_page_size, encode_meta};
use crate::{SnapshotError, SnapshotMeta, FORMAT_VERSION};

/// How [`capture_portable`] compresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CaptureOptions {
    /// Uncompressed bytes per zstd frame; a power of two in 4 KiB ..= 64 MiB. Default 1 MiB.
    pub chunk_size: u32,
    /// zstd level of the pages that are neither all zero nor incompressible-looking (those
    /// are stored without zstd's search, see the `portable` module documentation). Default 1 (fast; the
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

/// Encodes `meta` and `memory` in the portable encoding.
///
/// All-zero chunks are stored as empty entries; the others as zstd data built in parallel
/// (see the `portable` module documentation for how a chunk is encoded).
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
