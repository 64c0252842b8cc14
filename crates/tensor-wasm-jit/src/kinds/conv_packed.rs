//! The packed path of `conv2d` on the CPU: the weights packed once ([`PackedA`], kept
//! across launches while the weights' bytes are unchanged, [`weights`]) and multiplied by
//! each image's taps, gathered from a zero-padded copy of the image. Same register tiles
//! and order of every sum as the image-by-image multiply: the same bits.

use std::any::Any;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use zerocopy::IntoBytes;

use tensor_wasm_gpu::gemm::{decode_into, encode_into, PackedA};

use super::conv2d::Conv;
use crate::cpu::Element;
use crate::gather::{words, words_mut, Indices};

/// Output pixels of one image whose taps are gathered at a time (whole output rows, at least
/// one).
const PIXEL_BLOCK: usize = 256;
/// Most bytes of one part's packed weights, gathered taps and padded image: a convolution
/// past them multiplies image by image with [`Gemm`] instead.
const PACKED_BYTES: usize = 16 << 20;

/// The packed path: the part's output channels `ko0..` as a [`PackedA`] (packed once),
/// multiplied by the taps of each image, a block of whole output rows at a time. The taps are
/// gathered from a copy of the image with its zero padding around every channel, through a
/// table of where each pixel's window reads (the same for every channel and block).
pub(crate) struct Packed<T> {
    weights: Arc<PackedA<T>>,
    ko0: usize,
    /// Output rows per block; the table's entries for one tap span `block_rows × q` pixels.
    block_rows: usize,
    /// Entry `tap · block_rows·q + j`: where pixel `j` of the first block reads tap
    /// `(ci, r, s)` in `padded` (channel `ci`, row `ih + pad`, column `iw + pad`); a later
    /// block reads `p0 · stride` rows further.
    table: Arc<Indices>,
    /// Columns of a padded channel.
    wp: usize,
    /// The image in progress, each channel padded: `c × (h + 2·pad) × wp`.
    padded: Vec<T>,
    /// The block's taps: row `tap` at `tap · ldb`, pixel `j` of the block at column `j`.
    b: Vec<T>,
    ldb: usize,
    /// Whether `b` holds the block of output rows from `p0`; `jr` is its next panel.
    built: bool,
    p0: usize,
    jr: usize,
    sums: Vec<T>,
}

impl<T: Element> Packed<T> {
    /// The part's weights packed, when the convolution fits [`PACKED_BYTES`]: `w` is the
    /// weights' bytes, `channels` the output channels of the part.
    pub(crate) fn new(conv: &Conv, w: &[u8], channels: Range<usize>) -> Option<Self> {
        let taps = conv.taps();
        let block_rows = (PIXEL_BLOCK / conv.q.max(1)).clamp(1, conv.p.max(1));
        let block = block_rows * conv.q;
        let ldb = block.next_multiple_of(16);
        let (hp, wp) = (conv.h + 2 * conv.pad, conv.w + 2 * conv.pad);
        let values = channels.len().next_multiple_of(16) * taps
            + taps * ldb
            + conv.c * hp * wp
            + taps * block;
        // No taps (no input channels): every output is the empty sum, which the image-by-image
        // multiply writes without any of this.
        if taps == 0
            || values.saturating_mul(4) > PACKED_BYTES
            || conv.c * hp * wp > u32::MAX as usize
        {
            return None;
        }
        let bytes = &w[4 * channels.start * taps..4 * channels.end * taps];
        let weights = weights(bytes, channels.len(), taps);
        let table = table(conv, block_rows);
        Some(Self {
            weights,
            ko0: channels.start,
            block_rows,
            table,
            wp,
            // Zeros past the image too: the gather's windows read up to 32 values at once.
            padded: vec![T::ZERO; conv.c * hp * wp + 32],
            b: vec![T::ZERO; taps * ldb],
            ldb,
            built: false,
            p0: 0,
            jr: 0,
            sums: Vec::new(),
        })
    }

    /// Copies the image whose bytes start `x` into `padded` (the padding stays zero).
    fn pad(&mut self, conv: &Conv, x: &[u8]) {
        let plane = (conv.h + 2 * conv.pad) * self.wp;
        for ci in 0..conv.c {
            for ih in 0..conv.h {
                let at = ci * plane + (ih + conv.pad) * self.wp + conv.pad;
                let row = &x[4 * (ci * conv.h + ih) * conv.w..];
                decode_into(row, &mut self.padded[at..at + conv.w]);
            }
        }
    }

    /// Gathers the taps of the block of output rows from `p0` (`nc` pixels) into `b`.
    fn gather(&mut self, conv: &Conv, nc: usize) {
        let values = words(&self.padded[self.p0 * conv.stride * self.wp..]);
        let block = self.block_rows * conv.q;
        if nc == self.ldb {
            // Rows of `b` as long as the table's: one gather for every tap.
            let taps = &mut self.b[..conv.taps() * nc];
            self.table.gather(values, 0, words_mut(taps));
            return;
        }
        for tap in 0..conv.taps() {
            let row = &mut self.b[tap * self.ldb..][..nc];
            self.table.gather(values, tap * block, words_mut(row));
        }
    }

    /// Gathers the next block of output rows or multiplies one panel of it, for output
    /// channels `channels` of the image whose bytes start `x`, `pixels` pixels of it;
    /// `out(ko)` is the byte offset of channel `ko`'s output plane in `output`. Returns the
    /// work done and whether the image is done.
    pub(crate) fn step(
        &mut self,
        conv: &Conv,
        x: &[u8],
        channels: Range<usize>,
        pixels: usize,
        output: &mut [u8],
        out: impl Fn(usize) -> usize,
    ) -> (usize, bool) {
        let (taps, width) = (conv.taps(), self.weights.width());
        let j0 = self.p0 * conv.q;
        let nc = (self.block_rows * conv.q).min(pixels - j0);
        if !self.built {
            if self.p0 == 0 {
                self.pad(conv, x);
            }
            self.gather(conv, nc);
            (self.built, self.jr) = (true, 0);
            return ((taps * nc).max(1), false);
        }
        let rows = channels.start - self.ko0..channels.end - self.ko0;
        let first = self.weights.tile_start(rows.start);
        let col = self.jr * width;
        self.weights
            .panel(rows.clone(), &self.b[col..], self.ldb, &mut self.sums);
        let cols = width.min(nc - col);
        for row in rows.clone() {
            let at = out(row + self.ko0) + 4 * (j0 + col);
            let values = &self.sums[(row - first) * width..][..cols];
            let bytes = &mut output[at..at + 4 * cols];
            // A whole row of 16 as one fixed-size move (no call to `memcpy`).
            match (
                <&mut [u8; 64]>::try_from(&mut *bytes),
                <&[u8; 64]>::try_from(values.as_bytes()),
            ) {
                (Ok(to), Ok(from)) if cfg!(target_endian = "little") => *to = *from,
                _ => encode_into(values, bytes),
            }
        }
        self.jr += 1;
        let work = (rows.len() * width * taps).max(1);
        if self.jr * width < nc {
            return (work, false);
        }
        self.built = false;
        self.p0 += self.block_rows;
        let done = self.p0 * conv.q >= pixels;
        if done {
            self.p0 = 0;
        }
        (work, done)
    }
}

/// Most entries of the tables of taps kept for later launches, all tables together.
const CACHED_TABLE_ENTRIES: usize = 1 << 20;

/// The geometry a table of taps depends on: input channels, rows and columns, filter rows and
/// columns, stride, padding, output columns and rows per block.
type TableKey = [usize; 9];

static TABLES: Mutex<Vec<(TableKey, Arc<Indices>)>> = Mutex::new(Vec::new());

/// The table of taps of `conv` for blocks of `block_rows` output rows ([`Packed::table`]):
/// from the cache when a launch of the same geometry built it before, else built now and kept,
/// the least recently used tables dropped past [`CACHED_TABLE_ENTRIES`].
fn table(conv: &Conv, block_rows: usize) -> Arc<Indices> {
    let key = [
        conv.c,
        conv.h,
        conv.w,
        conv.r,
        conv.s,
        conv.stride,
        conv.pad,
        conv.q,
        block_rows,
    ];
    let mut tables = TABLES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(at) = tables.iter().position(|(k, _)| *k == key) {
        let entry = tables.remove(at);
        let table = entry.1.clone();
        tables.push(entry);
        return table;
    }
    drop(tables);
    let (hp, wp) = (conv.h + 2 * conv.pad, conv.w + 2 * conv.pad);
    let mut at = Vec::with_capacity(conv.taps() * block_rows * conv.q);
    for ci in 0..conv.c {
        for r in 0..conv.r {
            for s in 0..conv.s {
                for p in 0..block_rows {
                    let row = (ci * hp + p * conv.stride + r) * wp + s;
                    at.extend((0..conv.q).map(|q| (row + q * conv.stride) as u32));
                }
            }
        }
    }
    let table = Arc::new(Indices::new(at));
    let entries = table.len();
    if entries <= CACHED_TABLE_ENTRIES {
        let mut tables = TABLES
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut held: usize = tables.iter().map(|(_, t)| t.len()).sum();
        while held + entries > CACHED_TABLE_ENTRIES && !tables.is_empty() {
            held -= tables.remove(0).1.len();
        }
        tables.push((key, table.clone()));
    }
    table
}

/// Most bytes of weights kept packed for later launches, all entries together.
const CACHED_BYTES: usize = 32 << 20;

/// Weights packed by earlier launches: the bytes they were packed from, and the packing.
type Cached = (Vec<u8>, Arc<dyn Any + Send + Sync>);

static CACHE: Mutex<Vec<Cached>> = Mutex::new(Vec::new());

/// `bytes` (`rows` rows of `taps` little-endian values) packed: from the cache when a launch
/// packed the same bytes as the same shape before (compared in full, so a changed weight is
/// never missed), else packed now and kept, the least recently used entries dropped past
/// [`CACHED_BYTES`].
fn weights<T: Element>(bytes: &[u8], rows: usize, taps: usize) -> Arc<PackedA<T>> {
    let mut cache = CACHE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let hit = cache.iter().position(|(key, packed)| {
        // The same bytes in another shape are other weights (and no bytes at all, with no
        // taps, are any number of rows).
        let shape = packed
            .downcast_ref::<PackedA<T>>()
            .map(|packed| (packed.rows(), packed.depth()));
        key.as_slice() == bytes && shape == Some((rows, taps))
    });
    if let Some(at) = hit {
        let entry = cache.remove(at);
        let packed = entry.1.clone();
        cache.push(entry);
        if let Ok(packed) = packed.downcast::<PackedA<T>>() {
            return packed;
        }
    }
    drop(cache);
    let packed = Arc::new(PackedA::new(rows, taps, |i, out| {
        decode_into(&bytes[4 * i * taps..], out);
    }));
    if 2 * bytes.len() <= CACHED_BYTES {
        let mut cache = CACHE
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let mut held: usize = cache.iter().map(|(key, _)| 2 * key.len()).sum();
        while held + 2 * bytes.len() > CACHED_BYTES && !cache.is_empty() {
            held -= 2 * cache.remove(0).0.len();
        }
        cache.push((bytes.to_vec(), packed.clone()));
    }
    packed
}
