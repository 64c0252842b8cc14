//! The intrinsic register tiles of [`super::Gemm`]'s AVX-512 and AVX2 builds: written by hand
//! because, left to itself, the compiler vectorises the generic tile across rows, with
//! gathers. Each keeps `sum = sum + a * b` as two rounded operations in order of `p`, as
//! every build does, so all give the same bits.

/// The AVX-512 tiles: `R` rows (12, or 16 for [`super::PackedA`]) of one 16-lane vector each, `sum = sum + a * b` as two rounded
/// operations (a multiply, then an add; never fused), in order of `p`.
pub(super) mod avx512 {
    use std::arch::x86_64::{
        __m512i, _mm512_add_epi32, _mm512_add_ps, _mm512_loadu_ps, _mm512_loadu_si512,
        _mm512_maskz_loadu_epi32, _mm512_maskz_loadu_ps, _mm512_mul_ps, _mm512_mullo_epi32,
        _mm512_set1_epi32, _mm512_set1_ps, _mm512_setzero_ps, _mm512_setzero_si512,
        _mm512_storeu_ps, _mm512_storeu_si512,
    };

    use super::super::{NR_WIDE, STRIP, STRIP_ROWS};

    /// The operands of a strip, checked: `b` holds `k` rows of `width` (at most 16) at stride
    /// `ldb`, each row of `a` at least `k` values. Returns `k` and the mask of the `width`
    /// lanes each row of b loads (the others are neither read nor used).
    fn strip_depth<T>(a: &[&[T]; STRIP_ROWS], b: &[T], ldb: usize, width: usize) -> (usize, u16) {
        let k = a[0].len();
        assert!(a.iter().all(|row| row.len() >= k), "short rows of a");
        assert!(
            (1..=STRIP).contains(&width) && ldb >= width,
            "rows of b overlap"
        );
        assert!(k == 0 || b.len() >= (k - 1) * ldb + width, "short b");
        (k, ((1u32 << width) - 1) as u16)
    }

    #[target_feature(enable = "avx512f")]
    pub(in super::super) fn strip_f32(
        a: [&[f32]; STRIP_ROWS],
        (b, ldb, width): (&[f32], usize, usize),
        sums: &mut [[f32; STRIP]; STRIP_ROWS],
    ) {
        let (k, mask) = strip_depth(&a, b, ldb, width);
        let mut acc = [_mm512_setzero_ps(); STRIP_ROWS];
        for p in 0..k {
            // SAFETY: row `p` of b holds the `width` values the mask loads and every row of a
            // holds `k` (`strip_depth`).
            unsafe {
                let b = _mm512_maskz_loadu_ps(mask, b.as_ptr().add(p * ldb));
                for (sum, row) in acc.iter_mut().zip(&a) {
                    let a = _mm512_set1_ps(*row.get_unchecked(p));
                    *sum = _mm512_add_ps(*sum, _mm512_mul_ps(a, b));
                }
            }
        }
        for (sum, out) in acc.iter().zip(sums.iter_mut()) {
            // SAFETY: `out` holds 16 f32: one unaligned 64-byte store.
            unsafe { _mm512_storeu_ps(out.as_mut_ptr(), *sum) };
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(in super::super) fn strip_i32(
        a: [&[i32]; STRIP_ROWS],
        (b, ldb, width): (&[i32], usize, usize),
        sums: &mut [[i32; STRIP]; STRIP_ROWS],
    ) {
        let (k, mask) = strip_depth(&a, b, ldb, width);
        let mut acc = [_mm512_setzero_si512(); STRIP_ROWS];
        for p in 0..k {
            // SAFETY: as in `strip_f32`.
            unsafe {
                let b = _mm512_maskz_loadu_epi32(mask, b.as_ptr().add(p * ldb));
                for (sum, row) in acc.iter_mut().zip(&a) {
                    let a = _mm512_set1_epi32(*row.get_unchecked(p));
                    *sum = _mm512_add_epi32(*sum, _mm512_mullo_epi32(a, b));
                }
            }
        }
        for (sum, out) in acc.iter().zip(sums.iter_mut()) {
            // SAFETY: `out` holds 16 i32: one unaligned 64-byte store.
            unsafe { _mm512_storeu_si512(out.as_mut_ptr().cast::<__m512i>(), *sum) };
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(in super::super) fn tile_column_f32<const R: usize>(
        kc: usize,
        packed_a: &[f32],
        panel: &[f32],
        ldb: usize,
        fresh: bool,
        sums: &mut [f32],
    ) {
        if kc == 0 {
            return;
        }
        assert!(ldb >= NR_WIDE, "rows of b overlap");
        let panel = &panel[..(kc - 1) * ldb + NR_WIDE];
        for (a_panel, tile) in packed_a
            .chunks_exact(kc * R)
            .zip(sums.chunks_exact_mut(R * NR_WIDE))
        {
            let mut acc = [_mm512_setzero_ps(); R];
            for (row, sums) in acc.iter_mut().zip(tile.chunks_exact(NR_WIDE)) {
                if !fresh {
                    // SAFETY: `sums` holds NR_WIDE = 16 f32: one unaligned 64-byte load.
                    *row = unsafe { _mm512_loadu_ps(sums.as_ptr()) };
                }
            }
            for (a, b) in a_panel.chunks_exact(R).zip(panel.chunks(ldb)) {
                // SAFETY: `b` holds at least 16 f32 (`ldb >= 16` each, the last 16).
                let b = unsafe { _mm512_loadu_ps(b.as_ptr()) };
                for (row, &a) in acc.iter_mut().zip(a) {
                    *row = _mm512_add_ps(*row, _mm512_mul_ps(_mm512_set1_ps(a), b));
                }
            }
            for (row, sums) in acc.iter().zip(tile.chunks_exact_mut(NR_WIDE)) {
                // SAFETY: as the load.
                unsafe { _mm512_storeu_ps(sums.as_mut_ptr(), *row) };
            }
        }
    }

    #[target_feature(enable = "avx512f")]
    pub(in super::super) fn tile_column_i32<const R: usize>(
        kc: usize,
        packed_a: &[i32],
        panel: &[i32],
        ldb: usize,
        fresh: bool,
        sums: &mut [i32],
    ) {
        if kc == 0 {
            return;
        }
        assert!(ldb >= NR_WIDE, "rows of b overlap");
        let panel = &panel[..(kc - 1) * ldb + NR_WIDE];
        for (a_panel, tile) in packed_a
            .chunks_exact(kc * R)
            .zip(sums.chunks_exact_mut(R * NR_WIDE))
        {
            let mut acc = [_mm512_setzero_si512(); R];
            for (row, sums) in acc.iter_mut().zip(tile.chunks_exact(NR_WIDE)) {
                if !fresh {
                    // SAFETY: `sums` holds NR_WIDE = 16 i32: one unaligned 64-byte load.
                    *row = unsafe { _mm512_loadu_si512(sums.as_ptr().cast::<__m512i>()) };
                }
            }
            for (a, b) in a_panel.chunks_exact(R).zip(panel.chunks(ldb)) {
                // SAFETY: `b` holds at least 16 i32 (`ldb >= 16` each, the last 16).
                let b = unsafe { _mm512_loadu_si512(b.as_ptr().cast::<__m512i>()) };
                for (row, &a) in acc.iter_mut().zip(a) {
                    *row = _mm512_add_epi32(*row, _mm512_mullo_epi32(_mm512_set1_epi32(a), b));
                }
            }
            for (row, sums) in acc.iter().zip(tile.chunks_exact_mut(NR_WIDE)) {
                // SAFETY: as the load.
                unsafe { _mm512_storeu_si512(sums.as_mut_ptr().cast::<__m512i>(), *row) };
            }
        }
    }
}

/// The AVX2 tiles: 16 wide as the AVX-512 ones, each computed in two halves of 6 rows (12
/// sums in registers: two 8-lane vectors per row), `sum = sum + a * b` as two rounded
/// operations in order of `p`, as every build.
pub(super) mod avx2 {
    use std::arch::x86_64::{
        __m256i, _mm256_add_epi32, _mm256_add_ps, _mm256_loadu_ps, _mm256_loadu_si256,
        _mm256_mul_ps, _mm256_mullo_epi32, _mm256_set1_epi32, _mm256_set1_ps, _mm256_setzero_ps,
        _mm256_setzero_si256, _mm256_storeu_ps, _mm256_storeu_si256,
    };

    use super::super::{MR, NR_WIDE};

    /// Rows of one half of a tile.
    const HALF: usize = MR / 2;

    #[target_feature(enable = "avx2")]
    pub(in super::super) fn tile_column_f32(
        kc: usize,
        packed_a: &[f32],
        panel: &[f32],
        ldb: usize,
        fresh: bool,
        sums: &mut [f32],
    ) {
        if kc == 0 {
            return;
        }
        assert!(ldb >= NR_WIDE, "rows of b overlap");
        let panel = &panel[..(kc - 1) * ldb + NR_WIDE];
        for (a_panel, tile) in packed_a
            .chunks_exact(kc * MR)
            .zip(sums.chunks_exact_mut(MR * NR_WIDE))
        {
            for (half, rows) in tile.chunks_exact_mut(HALF * NR_WIDE).enumerate() {
                let mut acc = [[_mm256_setzero_ps(); 2]; HALF];
                for (row, sums) in acc.iter_mut().zip(rows.chunks_exact(NR_WIDE)) {
                    if fresh {
                        continue;
                    }
                    // SAFETY: `sums` holds NR_WIDE = 16 f32: two unaligned 32-byte loads.
                    *row = unsafe {
                        [
                            _mm256_loadu_ps(sums.as_ptr()),
                            _mm256_loadu_ps(sums.as_ptr().add(8)),
                        ]
                    };
                }
                for (a, b) in a_panel.chunks_exact(MR).zip(panel.chunks(ldb)) {
                    // SAFETY: `b` holds at least 16 f32 (`ldb >= 16` each, the last 16).
                    let b = unsafe {
                        [
                            _mm256_loadu_ps(b.as_ptr()),
                            _mm256_loadu_ps(b.as_ptr().add(8)),
                        ]
                    };
                    for (row, &a) in acc.iter_mut().zip(&a[half * HALF..][..HALF]) {
                        let a = _mm256_set1_ps(a);
                        row[0] = _mm256_add_ps(row[0], _mm256_mul_ps(a, b[0]));
                        row[1] = _mm256_add_ps(row[1], _mm256_mul_ps(a, b[1]));
                    }
                }
                for (row, sums) in acc.iter().zip(rows.chunks_exact_mut(NR_WIDE)) {
                    // SAFETY: as the loads.
                    unsafe {
                        _mm256_storeu_ps(sums.as_mut_ptr(), row[0]);
                        _mm256_storeu_ps(sums.as_mut_ptr().add(8), row[1]);
                    }
                }
            }
        }
    }

    #[target_feature(enable = "avx2")]
    pub(in super::super) fn tile_column_i32(
        kc: usize,
        packed_a: &[i32],
        panel: &[i32],
        ldb: usize,
        fresh: bool,
        sums: &mut [i32],
    ) {
        if kc == 0 {
            return;
        }
        assert!(ldb >= NR_WIDE, "rows of b overlap");
        let panel = &panel[..(kc - 1) * ldb + NR_WIDE];
        let vector = |at: *const i32| at.cast::<__m256i>();
        for (a_panel, tile) in packed_a
            .chunks_exact(kc * MR)
            .zip(sums.chunks_exact_mut(MR * NR_WIDE))
        {
            for (half, rows) in tile.chunks_exact_mut(HALF * NR_WIDE).enumerate() {
                let mut acc = [[_mm256_setzero_si256(); 2]; HALF];
                for (row, sums) in acc.iter_mut().zip(rows.chunks_exact(NR_WIDE)) {
                    if fresh {
                        continue;
                    }
                    // SAFETY: `sums` holds NR_WIDE = 16 i32: two unaligned 32-byte loads.
                    *row = unsafe {
                        [
                            _mm256_loadu_si256(vector(sums.as_ptr())),
                            _mm256_loadu_si256(vector(sums.as_ptr().add(8))),
                        ]
                    };
                }
                for (a, b) in a_panel.chunks_exact(MR).zip(panel.chunks(ldb)) {
                    // SAFETY: `b` holds at least 16 i32 (`ldb >= 16` each, the last 16).
                    let b = unsafe {
                        [
                            _mm256_loadu_si256(vector(b.as_ptr())),
                            _mm256_loadu_si256(vector(b.as_ptr().add(8))),
                        ]
                    };
                    for (row, &a) in acc.iter_mut().zip(&a[half * HALF..][..HALF]) {
                        let a = _mm256_set1_epi32(a);
                        row[0] = _mm256_add_epi32(row[0], _mm256_mullo_epi32(a, b[0]));
                        row[1] = _mm256_add_epi32(row[1], _mm256_mullo_epi32(a, b[1]));
                    }
                }
                for (row, sums) in acc.iter().zip(rows.chunks_exact_mut(NR_WIDE)) {
                    // SAFETY: as the loads.
                    unsafe {
                        _mm256_storeu_si256(sums.as_mut_ptr().cast::<__m256i>(), row[0]);
                        _mm256_storeu_si256(sums.as_mut_ptr().add(8).cast::<__m256i>(), row[1]);
                    }
                }
            }
        }
    }
}
