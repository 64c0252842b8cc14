//! Restore: [`read_portable_meta`] reads and checks the metadata alone, [`restore_portable`]
//! validates a whole portable snapshot and decodes its frames on all cores.

use super::layout::{parse_header, read_frame_table, Frame, PortableHeader, PORTABLE_HEADER_LEN};
use super::worker_count;
use crate::meta::{check_meta_consistency, decode_meta};
use crate::{RestoreLimits, SnapshotError, SnapshotMeta};

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
