//! Memory snapshots of TensorWasm function instances: capture a linear memory plus its
//! metadata once, restore it many times.
//!
//! Two encodings share one data model, [`SnapshotMeta`] (bincode 2, small) plus the raw
//! memory image, which never passes through the serializer:
//!
//! - **portable** ([`capture_portable`], [`restore_portable`]): a self-checking byte string
//!   for storage and transfer. The image is cut into fixed-size chunks, each encoded on its
//!   own (one or more zstd frames: RLE for zero pages, stored for incompressible-looking
//!   pages, compressed for the rest) with its own CRC-32C, so capture and restore use every
//!   core.
//! - **local** ([`write_local`], [`LocalImage`], [`portable_to_local`]): a per-host file whose
//!   data region is the image itself at page-aligned offsets, all-zero pages left as holes.
//!   [`LocalImage::map_into`] maps it copy-on-write over the destination memory in one
//!   `mmap`, so restore time does not grow with the image; [`LocalImage::read_into`] is the
//!   eager fallback.
//!
//! Every decoder validates header, version, module hash and checksums before using a byte,
//! checks declared sizes against [`RestoreLimits`] before allocating, and returns a
//! [`SnapshotError`] instead of panicking. The byte layouts are specified in
//! `docs/snapshot-format.md`.
//!
//! The copy-on-write file mapping behind [`LocalImage::map_into`] and the [`AnonymousPages`]
//! buffer it maps into come from `tensor-wasm-mem`
//! ([`tensor_wasm_mem::map_file_private_fixed`]), which checks alignment, file length and
//! that the destination is memory it owns. What it leaves to its callers, that a mapped file
//! is never truncated or rewritten in place, cannot be checked, so [`LocalImage::map_into`]
//! is an `unsafe fn` that passes the same contract on (its only `unsafe`). Images written by
//! [`write_local`] hold it by construction: written under a temporary name and renamed into
//! place, replaced or removed only by rename or unlink.
//!
//! # Example
//!
//! ```
//! use tensor_wasm_snapshot::{
//!     capture_portable, realistic_image, restore_portable, CaptureOptions, RestoreLimits,
//!     SnapshotMeta,
//! };
//!
//! let module_sha256 = [0xab; 32];
//! let memory = realistic_image(4 * 65_536, 7);
//! let meta = SnapshotMeta::new(module_sha256, "resize", "acme", memory.len() as u64);
//!
//! let snapshot = capture_portable(&meta, &memory, &CaptureOptions::default())?;
//! let (meta_back, memory_back) =
//!     restore_portable(&snapshot, &RestoreLimits::default(), &module_sha256)?;
//! assert_eq!(meta_back, meta);
//! assert_eq!(memory_back, memory);
//!
//! // A snapshot of another module is refused.
//! assert!(restore_portable(&snapshot, &RestoreLimits::default(), &[0; 32]).is_err());
//! # Ok::<(), tensor_wasm_snapshot::SnapshotError>(())
//! ```

mod error;
mod image;
mod local;
mod meta;
mod portable;

pub use error::SnapshotError;
pub use image::{realistic_image, IMAGE_PAGE};
pub use local::{portable_to_local, write_local, LocalImage, LOCAL_HEADER_LEN, LOCAL_MAGIC};
pub use meta::{
    GlobalValue, RestoreLimits, SnapshotMeta, TableSnapshot, ValType, FORMAT_VERSION,
    META_HARD_LIMIT,
};
#[cfg(feature = "bench-internals")]
#[doc(hidden)]
pub use portable::bench_internals;
pub use portable::{
    capture_portable, read_portable_meta, restore_portable, CaptureOptions, Encoded,
    PortableEncoder, PORTABLE_HEADER_LEN, PORTABLE_MAGIC, SPLIT_FLOOR,
};
pub use tensor_wasm_mem::AnonymousPages;
