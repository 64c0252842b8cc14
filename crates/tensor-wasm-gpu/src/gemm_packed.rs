//! [`PackedA`]: one `a` packed once and multiplied by many `b`s, panel by panel — a
//! convolution's weights against each image's taps. [`super::Gemm`] packs `a` again for every
//! product, which costs as much as the product itself when `b` is a few columns (the pixels of
//! a small image). Same register tiles, same order of every sum: the same bits as `Gemm`.

use std::ops::Range;

use super::{tile_column, Isa, Lane, KC, MR, NR_NARROW, NR_WIDE};

/// `a` (`m × k`) in panels of `mr` rows, every `p` of each: panel `ir` holds `[p][mr]` at
/// `ir * k * mr` (zero rows past `m`). `mr` is 12, or 16 with AVX-512 when that leaves
/// fewer rows of the last panel empty (16 or 32 rows: a convolution's output channels).
#[derive(Debug)]
pub struct PackedA<T> {
    isa: Isa,
    m: usize,
    k: usize,
    mr: usize,
    packed: Vec<T>,
}

/// Rows of [`PackedA`]'s wider AVX-512 tiles.
const MR_WIDE: usize = 16;

impl<T: Lane> PackedA<T> {
    /// Packs the `m` rows of `k` values each that `row(i, out)` writes into `out`, for tiles of
    /// [`Isa::selected`].
    pub fn new(m: usize, k: usize, mut row: impl FnMut(usize, &mut [T])) -> Self {
        let isa = Isa::selected();
        let wide = isa == Isa::Avx512 && m.next_multiple_of(MR_WIDE) < m.next_multiple_of(MR);
        let mr = if wide { MR_WIDE } else { MR };
        let mut packed = vec![T::ZERO; m.div_ceil(mr) * k * mr];
        let mut values = vec![T::ZERO; k];
        // With no `p` there is nothing to pack (every product is the empty sum).
        for i in (0..m).filter(|_| k > 0) {
            row(i, &mut values);
            let panel = &mut packed[(i / mr) * k * mr..][..k * mr];
            for (slot, &value) in panel[i % mr..].iter_mut().step_by(mr).zip(&values) {
                *slot = value;
            }
        }
        Self {
            isa,
            m,
            k,
            mr,
            packed,
        }
    }

    /// Rows of `a`.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Values of `p` (columns of `a`).
    #[must_use]
    pub fn depth(&self) -> usize {
        self.k
    }

    /// Columns of one panel of `b` ([`PackedA::panel`]): the width of the register tiles.
    #[must_use]
    pub fn width(&self) -> usize {
        match self.isa {
            Isa::Avx512 | Isa::Avx2 => NR_WIDE,
            Isa::Portable => NR_NARROW,
        }
    }

    /// The first row of the tile that holds row `row` (where [`PackedA::panel`]'s sums begin).
    #[must_use]
    pub fn tile_start(&self, row: usize) -> usize {
        row - row % self.mr
    }

    /// Multiplies rows `rows` of `a` by one panel of `b`: [`PackedA::width`] columns of `k`
    /// rows, row `p` at `panel[p * ldb..]` (`ldb >= width`). `sums` then holds the products
    /// of the tiles covering `rows`, row-major, `width` values per row, from row
    /// [`PackedA::tile_start`]`(rows.start)` on. Each sum is `((0 + a·b) + a·b) + ...` in
    /// order of `p`, each product and sum rounded on its own, as [`super::Gemm`].
    ///
    /// # Panics
    /// When `rows` reaches past `a`, `ldb < width`, or `panel` is too short.
    pub fn panel(&self, rows: Range<usize>, panel: &[T], ldb: usize, sums: &mut Vec<T>) {
        assert!(rows.end <= self.m, "rows past a");
        let width = self.width();
        assert!(ldb >= width, "rows of b overlap");
        let mr = self.mr;
        let tiles = rows.start / mr..rows.end.div_ceil(mr);
        let len = tiles.len() * mr * width;
        if sums.len() < len {
            sums.resize(len, T::ZERO);
        }
        if self.k == 0 {
            sums[..len].fill(T::ZERO);
            return;
        }
        // Slices of `p` as `Gemm`'s blocks (the b slice stays in L1 across the tiles); the
        // sums carry over, so the order of every sum is unchanged.
        for pc in (0..self.k).step_by(KC) {
            let kc = KC.min(self.k - pc);
            let b = &panel[pc * ldb..][..(kc - 1) * ldb + width];
            for (tile, sums) in tiles.clone().zip(sums.chunks_exact_mut(mr * width)) {
                let a = &self.packed[(tile * self.k + pc) * mr..][..kc * mr];
                match (mr, width) {
                    #[cfg(target_arch = "x86_64")]
                    // SAFETY: 16-row panels are packed only when the selected ISA is AVX-512,
                    // which `Isa::selected` picks only on a CPU that has it: the one
                    // requirement. The panels are 16 wide, as `width` is for AVX-512.
                    (MR_WIDE, NR_WIDE) => unsafe {
                        T::tile_column_avx512::<MR_WIDE>(kc, a, b, ldb, pc == 0, sums);
                    },
                    (_, NR_WIDE) => {
                        tile_column::<T, NR_WIDE>(self.isa, kc, a, b, ldb, pc == 0, sums);
                    }
                    _ => tile_column::<T, NR_NARROW>(self.isa, kc, a, b, ldb, pc == 0, sums),
                }
            }
        }
    }
}
