//! How one chunk of the image is encoded: each 4 KiB page is classified (all zero,
//! incompressible-looking, other), and every run of pages of one kind becomes one zstd frame,
//! built here for the first two kinds (RLE and raw blocks) and by zstd for the third. See the
//! `portable` module documentation for why.

use std::sync::OnceLock;

use crate::image::{is_zero, IMAGE_PAGE};
use crate::SnapshotError;

/// zstd frame magic number (RFC 8878, 3.1.1).
const ZSTD_MAGIC: u32 = 0xFD2F_B528;
/// Frame_Header_Descriptor of the frames built here: Frame_Content_Size_flag 2 (a 4-byte
/// content size), Single_Segment_flag 1 (no Window_Descriptor), no checksum, no dictionary.
const STORED_FRAME_DESCRIPTOR: u8 = 0b1010_0000;
/// Bytes of a stored frame's header: magic, descriptor, content size.
pub(super) const STORED_FRAME_HEADER_LEN: usize = 4 + 1 + 4;
/// Largest block of a zstd frame (Block_Maximum_Size, RFC 8878 3.1.1.2.4).
pub(super) const ZSTD_BLOCK_MAX: usize = 128 << 10;
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
/// random-`f32` and text pages and an executable's pages fall: printed by the `stored_frames`
/// bench (`benches/stored_frames.rs`; earlier output of the same measurement:
/// `bench-results/2026-11-21-snapshot-stored-frames-costs.txt`).
const RAW_ENTROPY_BITS: f32 = 6.8;

/// How the pages of a run are stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageKind {
    /// All zero: a frame of RLE blocks.
    Zero,
    /// Random-looking: a frame of raw blocks.
    Raw,
    /// Anything else: a zstd frame at the configured level.
    Compress,
}

pub(super) fn page_kind(page: &[u8]) -> PageKind {
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
pub(super) fn looks_incompressible(page: &[u8]) -> bool {
    page.len() >= IMAGE_PAGE && sample_entropy(page) >= RAW_ENTROPY_BITS
}

/// Order-0 entropy in bits per byte of the samples of a full page (see
/// [`looks_incompressible`]).
pub(super) fn sample_entropy(page: &[u8]) -> f32 {
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
pub(super) fn encode_chunk(
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
pub(super) fn stored_frame_len(len: usize) -> usize {
    STORED_FRAME_HEADER_LEN + 3 * len.div_ceil(ZSTD_BLOCK_MAX).max(1) + len
}

/// Appends a zstd frame (RFC 8878) holding `data` without compression: a single-segment
/// header with a 4-byte Frame_Content_Size, then blocks of at most 128 KiB, raw blocks for
/// [`PageKind::Raw`] and RLE blocks of byte 0 for [`PageKind::Zero`] (whose `data` must be
/// all zero), no checksum. `data` is at most one chunk (64 MiB).
pub(super) fn push_stored_frame(out: &mut Vec<u8>, data: &[u8], kind: PageKind) {
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
