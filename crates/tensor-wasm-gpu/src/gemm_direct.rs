//! [`Blocked::step_direct`]: the multiply of few rows (or, with AVX-512, of few columns)
//! straight from b's rows, without panels: packing would cost more than it saves.

use super::{encode_into, Blocked, GemmSource, Isa, Lane, DIRECT_ROWS, STRIP, STRIP_ROWS};

impl<T: Lane, const NR: usize> Blocked<T, NR> {
    /// A multiply of few rows from b's rows as they are (no panels): for each strip of
    /// [`STRIP`] columns and each row, the row's sums of the strip stay in registers while
    /// they gain `a[i][p] · b[p][j]` for each `p` in order (a product, then a sum, each
    /// rounded, as in the tiles). Packing would cost more than it saves. `packed_a` holds all
    /// of a, `packed_b` all of b (rows padded to whole strips), `jr` is the next strip, `sums`
    /// the `m × cols` outputs.
    pub(super) fn step_direct(
        &mut self,
        source: &impl GemmSource<T>,
        c: &mut [u8],
        work: usize,
    ) -> bool {
        let (m, cols, k) = (self.m, self.cols, self.k);
        if self.done() {
            return true;
        }
        let ldb = cols.next_multiple_of(STRIP);
        let mut spent = 0usize;
        // Many rows of few columns: the operands as they lie when the source has them so,
        // else copies (below).
        let strips =
            cfg!(target_arch = "x86_64") && self.isa == Isa::Avx512 && m > DIRECT_ROWS && k > 0;
        let in_place = if strips {
            source.a_in_place().zip(source.b_in_place())
        } else {
            None
        };
        if !self.packed && in_place.is_some() {
            self.sums.clear();
            self.sums.resize(m * cols, T::ZERO);
            self.packed = true;
        }
        if !self.packed {
            self.packed_a.clear();
            self.packed_a.resize(m * k, T::ZERO);
            for (i, row) in self.packed_a.chunks_exact_mut(k.max(1)).enumerate().take(m) {
                if k > 0 {
                    source.a_row(i, 0, row);
                }
            }
            self.packed_b.clear();
            self.packed_b.resize(k * ldb, T::ZERO);
            for (p, row) in self.packed_b.chunks_exact_mut(ldb).enumerate() {
                source.b_row(p, 0, &mut row[..cols]);
            }
            self.sums.clear();
            self.sums.resize(m * cols, T::ZERO);
            self.packed = true;
            spent += k * (m + cols);
        }
        while self.jr * STRIP < cols {
            let j0 = self.jr * STRIP;
            let width = STRIP.min(cols - j0);
            let mut rows = 0;
            #[cfg(target_arch = "x86_64")]
            if strips {
                // STRIP_ROWS rows at a time; a last, short group repeats its last row.
                let ((a_values, lda), (b_values, ldb)) =
                    in_place.unwrap_or(((&self.packed_a, k), (&self.packed_b, ldb)));
                let b = (&b_values[j0..], ldb, width);
                let mut out = [[T::ZERO; STRIP]; STRIP_ROWS];
                while rows < m {
                    let a = std::array::from_fn(|r| {
                        let row = (rows + r).min(m - 1);
                        &a_values[row * lda..][..k]
                    });
                    // SAFETY: this `Blocked` was made for AVX-512 (`Gemm::with_isa` checks that
                    // the CPU has it), the function's one requirement.
                    unsafe { T::strip_avx512(a, b, &mut out) };
                    for (r, values) in out.iter().enumerate().take(m - rows) {
                        self.sums[(rows + r) * cols..][j0..j0 + width]
                            .copy_from_slice(&values[..width]);
                    }
                    rows += STRIP_ROWS;
                }
            }
            for (a, sums) in self
                .packed_a
                .chunks_exact(k.max(1))
                .zip(self.sums.chunks_exact_mut(cols))
                .skip(rows)
            {
                let mut acc = [T::ZERO; STRIP];
                for (&a, b) in a.iter().zip(self.packed_b.chunks_exact(ldb)) {
                    let Ok(b) = <&[T; STRIP]>::try_from(&b[j0..j0 + STRIP]) else {
                        continue;
                    };
                    for (sum, &b) in acc.iter_mut().zip(b) {
                        *sum = sum.add(a.mul(b));
                    }
                }
                sums[j0..j0 + width].copy_from_slice(&acc[..width]);
            }
            self.jr += 1;
            spent += m * k * width;
            if spent >= work && self.jr * STRIP < cols {
                return false;
            }
        }
        for (i, sums) in self.sums.chunks_exact(cols).enumerate() {
            let at = 4 * i * self.ldc;
            encode_into(sums, &mut c[at..at + 4 * cols]);
        }
        self.jc = cols;
        true
    }
}
