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
//! - pages that [look incompressible](frames::looks_incompressible): a frame of raw blocks (the
//!   bytes plus 12 bytes per run), built here without running zstd;
//! - every other page: one zstd frame of the run at the configured level.
//!
//! A chunk whose pages are all of the third kind is therefore one zstd frame, exactly as
//! before; an all-zero chunk is still an empty entry. Concatenated frames are standard zstd
//! data: `ZSTD_decompressDCtx` (behind `zstd::bulk::Decompressor`) decodes them in one call,
//! so restore is unchanged, and a snapshot written this way decodes with the version-1
//! reader that predates it.
//!
//! # Files
//!
//! - `layout.rs`: the fixed header and the frame table: constants, parsing and validation,
//!   little-endian field helpers;
//! - `frames.rs`: how one chunk is encoded: page classification and the zstd frames built
//!   here (raw and RLE blocks);
//! - `capture.rs`: [`capture_portable`], its [`CaptureOptions`] and the [`PortableEncoder`]
//!   with buffers that outlive a capture;
//! - `restore.rs`: [`read_portable_meta`] and [`restore_portable`];
//! - `bench_internals.rs` (feature `bench-internals`): the encoder's internals for the
//!   `stored_frames` bench.

mod capture;
mod frames;
mod layout;
mod restore;
#[cfg(test)]
mod tests;

#[cfg(feature = "bench-internals")]
pub mod bench_internals;

pub(crate) use capture::check_capture_args;
pub use capture::{capture_portable, CaptureOptions, Encoded, PortableEncoder, SPLIT_FLOOR};
pub(crate) use layout::{get_u32, get_u64, put_u32, put_u64};
pub use layout::{PORTABLE_HEADER_LEN, PORTABLE_MAGIC};
pub use restore::{read_portable_meta, restore_portable};

/// Threads for `chunks` chunks: `requested`, or all cores when it is 0, at least 1 and at most
/// one per chunk.
fn worker_count(requested: usize, chunks: usize) -> usize {
    let available = if requested == 0 {
        std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
    } else {
        requested
    };
    available.clamp(1, chunks.max(1))
}
