//! The portable encoder's internals, exposed for the `stored_frames` bench only: it is compiled
//! with the `bench-internals` feature, which this crate's dev-dependency on itself enables for
//! its own benches and tests. Not a stable API; hidden from the documentation.

pub use super::frames::PageKind;
use crate::SnapshotError;

/// How a page is stored (see [`PageKind`]).
pub fn page_kind(page: &[u8]) -> PageKind {
    super::frames::page_kind(page)
}

/// Whether a full page looks incompressible (its sampled order-0 entropy reaches the
/// threshold above which pages are stored raw).
pub fn looks_incompressible(page: &[u8]) -> bool {
    super::frames::looks_incompressible(page)
}

/// Order-0 entropy in bits per byte of the samples of a full page, as the classifier sees it.
pub fn sample_entropy(page: &[u8]) -> f32 {
    super::frames::sample_entropy(page)
}

/// Appends the encoding of one chunk to `out`, as [`crate::capture_portable`] does per chunk.
///
/// # Errors
/// [`SnapshotError::Io`] if zstd fails.
pub fn encode_chunk(
    compressor: &mut zstd::bulk::Compressor<'_>,
    chunk: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), SnapshotError> {
    super::frames::encode_chunk(compressor, chunk, out)
}

/// Appends a zstd frame holding `data` without compression: raw blocks for
/// [`PageKind::Raw`], RLE blocks for [`PageKind::Zero`] (then `data` must be all zero).
pub fn push_stored_frame(out: &mut Vec<u8>, data: &[u8], kind: PageKind) {
    super::frames::push_stored_frame(out, data, kind);
}

/// Whether every byte of `bytes` is zero.
pub fn is_zero(bytes: &[u8]) -> bool {
    crate::image::is_zero(bytes)
}
