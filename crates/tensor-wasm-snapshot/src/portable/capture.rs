//! Capture: [`PortableEncoder`] encodes metadata and image in the portable encoding, the
//! chunks on all cores, into buffers it keeps; [`capture_portable`] is the one-shot form.

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
    /// Uncompressed bytes per chunk (frame-table entry); a power of two in 4 KiB ..= 64 MiB.
    /// Default 1 MiB. An image with fewer chunks than worker threads is cut in smaller chunks
    /// (halving, down to [`SPLIT_FLOOR`] bytes) so that every thread gets one.
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
/// (see the `portable` module documentation for how a chunk is encoded). A fresh
/// [`PortableEncoder`] encodes, and its pieces are copied into the returned vector; callers
/// that capture repeatedly, or write the snapshot out anyway, keep a [`PortableEncoder`] and
/// skip both the fresh buffers and the copy.
///
/// # Errors
/// As [`PortableEncoder::encode`].
pub fn capture_portable(
    meta: &SnapshotMeta,
    memory: &[u8],
    options: &CaptureOptions,
) -> Result<Vec<u8>, SnapshotError> {
    Ok(PortableEncoder::new()
        .encode(meta, memory, options)?
        .to_vec())
}

/// The smallest chunk [`CaptureOptions::chunk_size`] is halved to for a small image.
pub const SPLIT_FLOOR: u32 = 64 << 10;

/// `requested`, halved while `len` bytes would give fewer chunks than `threads` (and the
/// half is at least [`SPLIT_FLOOR`]): a small image is then encoded, and decoded, on every
/// core. A chunk size that is already below the floor is kept.
fn split_for_workers(requested: u32, len: usize, threads: usize) -> u32 {
    let mut chunk = requested;
    while chunk / 2 >= SPLIT_FLOOR && len.div_ceil(chunk as usize) < threads {
        chunk /= 2;
    }
    chunk
}

/// The portable encoder with buffers that outlive one capture.
///
/// [`encode`](Self::encode) leaves the snapshot in the encoder's own buffers (one per worker
/// thread, plus header, metadata and frame table) and returns an [`Encoded`] view of them in
/// order; nothing assembles them into one allocation. The buffers keep their capacity for the
/// next capture, whose output then lands in memory that is already mapped: on a host where
/// first touching a page is expensive, that is a large share of a capture of fresh buffers
/// (docs/perf-experiments.md, "Capture"). [`shrink_to`](Self::shrink_to) bounds what stays
/// allocated between captures.
#[derive(Debug, Default)]
pub struct PortableEncoder {
    /// Fixed header, metadata and frame table of the last capture.
    head: Vec<u8>,
    /// One per worker thread of the last capture (and spare ones of earlier captures).
    workers: Vec<WorkerOutput>,
    /// How many of `workers` the last capture used.
    used: usize,
}

/// What one worker of [`PortableEncoder::encode`] produced: the encodings of a contiguous range
/// of chunks, back to back, and where each one is; and the worker's zstd context, kept with
/// the level it was made for.
#[derive(Default)]
struct WorkerOutput {
    buf: Vec<u8>,
    spans: Vec<Span>,
    compressor: Option<(i32, zstd::bulk::Compressor<'static>)>,
}

impl std::fmt::Debug for WorkerOutput {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkerOutput")
            .field("buf_len", &self.buf.len())
            .field("spans", &self.spans.len())
            .field(
                "zstd_level",
                &self.compressor.as_ref().map(|(level, _)| level),
            )
            .finish()
    }
}

/// Where a worker put the encoding of a chunk: start and end in its buffer, CRC-32C of those
/// bytes.
type Span = (usize, usize, u32);

impl PortableEncoder {
    /// An encoder with no buffers yet.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Encodes `meta` and `memory` in the portable encoding, into this encoder's buffers.
    ///
    /// # Errors
    /// [`SnapshotError::InvalidInput`] if `memory.len()` differs from `meta.memory_size_bytes`,
    /// the page size does not divide it, `meta.format_version` is not [`FORMAT_VERSION`] or the
    /// options are out of range; [`SnapshotError::TooLarge`] for oversized metadata;
    /// [`SnapshotError::Io`] if zstd fails. The encoder stays usable after an error.
    pub fn encode(
        &mut self,
        meta: &SnapshotMeta,
        memory: &[u8],
        options: &CaptureOptions,
    ) -> Result<Encoded<'_>, SnapshotError> {
        self.used = 0;
        self.head.clear();
        check_capture_args(meta, memory)?;
        let chunk_size = options.chunk_size;
        if !chunk_size.is_power_of_two() || !(MIN_CHUNK..=MAX_CHUNK).contains(&chunk_size) {
            return Err(SnapshotError::InvalidInput(format!(
                "chunk size {chunk_size} is not a power of two in {MIN_CHUNK}..={MAX_CHUNK}"
            )));
        }
        let meta_bytes = encode_meta(meta)?;
        let chunk_size = split_for_workers(
            chunk_size,
            memory.len(),
            worker_count(options.threads, usize::MAX),
        );
        let chunks: Vec<&[u8]> = memory.chunks(chunk_size as usize).collect();
        let workers = worker_count(options.threads, chunks.len());
        let per_worker = chunks.len().div_ceil(workers).max(1);
        let ranges: Vec<&[&[u8]]> = chunks.chunks(per_worker).collect();
        if self.workers.len() < ranges.len() {
            self.workers
                .resize_with(ranges.len(), WorkerOutput::default);
        }
        let outputs = &mut self.workers[..ranges.len()];
        if let ([range], [output]) = (&ranges[..], &mut *outputs) {
            output.encode(range, options.zstd_level)?;
        } else {
            let results: Vec<Result<(), SnapshotError>> = std::thread::scope(|s| {
                let handles: Vec<_> = ranges
                    .iter()
                    .zip(outputs.iter_mut())
                    .map(|(range, output)| {
                        s.spawn(move || output.encode(range, options.zstd_level))
                    })
                    .collect();
                handles
                    .into_iter()
                    .map(|h| {
                        h.join().unwrap_or_else(|_| {
                            Err(SnapshotError::Corrupt("worker panicked".into()))
                        })
                    })
                    .collect()
            });
            results.into_iter().collect::<Result<(), _>>()?;
        }
        let outputs = &self.workers[..ranges.len()];
        let frames = outputs.iter().map(|o| o.spans.len()).sum::<usize>();
        let table_len = frames * FRAME_ENTRY_LEN;
        let data_start = PORTABLE_HEADER_LEN + meta_bytes.len() + table_len;
        let total_len = data_start + outputs.iter().map(|o| o.buf.len()).sum::<usize>();

        let head = &mut self.head;
        head.resize(PORTABLE_HEADER_LEN, 0);
        head.extend_from_slice(&meta_bytes);
        let mut offset = data_start as u64;
        for &(start, end, crc) in outputs.iter().flat_map(|o| &o.spans) {
            head.extend_from_slice(&offset.to_le_bytes());
            let len = u32::try_from(end - start)
                .map_err(|_| SnapshotError::Corrupt("compressed frame exceeds 4 GiB".into()))?;
            head.extend_from_slice(&len.to_le_bytes());
            head.extend_from_slice(&crc.to_le_bytes());
            offset += u64::from(len);
        }
        let table_crc = crc32c::crc32c(&head[PORTABLE_HEADER_LEN + meta_bytes.len()..]);
        let header = &mut head[..PORTABLE_HEADER_LEN];
        header[0..8].copy_from_slice(&PORTABLE_MAGIC);
        put_u32(header, 8, FORMAT_VERSION);
        put_u32(header, 12, 0); // flags
        put_u32(header, 16, meta_bytes.len() as u32); // <= META_HARD_LIMIT
        put_u32(header, 20, chunk_size);
        put_u64(header, 24, memory.len() as u64);
        put_u64(header, 32, frames as u64);
        put_u64(header, 40, total_len as u64);
        put_u32(header, 48, crc32c::crc32c(&meta_bytes));
        put_u32(header, 52, table_crc);
        let header_crc = crc32c::crc32c(&header[..60]);
        put_u32(header, 60, header_crc);
        self.used = ranges.len();
        Ok(Encoded {
            head: &self.head,
            workers: &self.workers[..self.used],
        })
    }

    /// Bytes this encoder holds allocated between captures.
    #[must_use]
    pub fn retained_bytes(&self) -> usize {
        self.head.capacity()
            + self
                .workers
                .iter()
                .map(|w| w.buf.capacity() + w.spans.capacity() * size_of::<Span>())
                .sum::<usize>()
    }

    /// Frees buffers until at most `bytes` stay allocated (the largest ones first); with 0,
    /// every buffer.
    pub fn shrink_to(&mut self, bytes: usize) {
        self.used = 0;
        while self.retained_bytes() > bytes {
            let largest = self
                .workers
                .iter()
                .enumerate()
                .max_by_key(|(_, w)| w.buf.capacity())
                .map(|(i, _)| i);
            match largest {
                Some(i) => {
                    self.workers.swap_remove(i);
                }
                None => {
                    self.head = Vec::new();
                    break;
                }
            }
        }
    }
}

impl WorkerOutput {
    fn encode(&mut self, chunks: &[&[u8]], zstd_level: i32) -> Result<(), SnapshotError> {
        self.buf.clear();
        self.spans.clear();
        let compressor = match &mut self.compressor {
            Some((level, compressor)) if *level == zstd_level => compressor,
            kept => {
                &mut kept
                    .insert((zstd_level, zstd::bulk::Compressor::new(zstd_level)?))
                    .1
            }
        };
        for chunk in chunks {
            let start = self.buf.len();
            encode_chunk(compressor, chunk, &mut self.buf)?;
            self.spans
                .push((start, self.buf.len(), crc32c::crc32c(&self.buf[start..])));
        }
        Ok(())
    }
}

/// A snapshot encoded by [`PortableEncoder::encode`]: its bytes in order, as a few pieces
/// borrowed from the encoder.
#[derive(Debug, Clone, Copy)]
pub struct Encoded<'a> {
    head: &'a [u8],
    workers: &'a [WorkerOutput],
}

impl<'a> Encoded<'a> {
    /// Length of the snapshot in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.pieces().map(<[u8]>::len).sum()
    }

    /// Always false: a snapshot has at least its header.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The snapshot's bytes as consecutive pieces (header, metadata and frame table first).
    pub fn pieces(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let (head, workers) = (self.head, self.workers);
        std::iter::once(head).chain(workers.iter().map(|w| w.buf.as_slice()))
    }

    /// The snapshot in one vector.
    #[must_use]
    pub fn to_vec(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.len());
        for piece in self.pieces() {
            out.extend_from_slice(piece);
        }
        out
    }

    /// Writes the snapshot to `out`, piece by piece.
    ///
    /// # Errors
    /// The first error of `out`.
    pub fn write_to(&self, out: &mut impl std::io::Write) -> std::io::Result<()> {
        self.pieces().try_for_each(|piece| out.write_all(piece))
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
