//! The fixed header and the frame table of the portable encoding: their constants, parsing
//! and validation against the snapshot's bounds, and the little-endian field helpers (also
//! used by the local image format).

use crate::{RestoreLimits, SnapshotError, FORMAT_VERSION};

/// Magic of the portable encoding.
pub const PORTABLE_MAGIC: [u8; 8] = *b"TWSNAP\0P";
/// Length of the fixed portable header.
pub const PORTABLE_HEADER_LEN: usize = 64;
/// Bytes per frame-table entry.
pub(super) const FRAME_ENTRY_LEN: usize = 16;
/// Smallest and largest accepted chunk sizes.
pub(super) const MIN_CHUNK: u32 = 4096;
pub(super) const MAX_CHUNK: u32 = 64 << 20;

/// The parsed, validated fixed header of a portable snapshot.
#[derive(Debug)]
pub(super) struct PortableHeader {
    pub(super) meta_len: usize,
    pub(super) chunk_size: usize,
    pub(super) memory_size: usize,
    pub(super) chunk_count: usize,
    pub(super) meta_crc: u32,
    pub(super) table_crc: u32,
}

pub(super) fn parse_header(
    bytes: &[u8],
    limits: &RestoreLimits,
) -> Result<PortableHeader, SnapshotError> {
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
pub(super) struct Frame {
    pub(super) start: usize,
    pub(super) len: usize,
    pub(super) crc: u32,
}

pub(super) fn read_frame_table(
    bytes: &[u8],
    header: &PortableHeader,
) -> Result<Vec<Frame>, SnapshotError> {
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
