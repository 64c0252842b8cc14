//! Gathers of 32-bit values by index (`out[j] = values[at[j]]`), with AVX-512's gather
//! instruction or a permute when the CPU has it: how the CPU's convolution collects each
//! pixel's taps. Also 2 × 2 maximum pooling by permutes ([`max_pairs_f32`]).

#![allow(unsafe_code)]

use zerocopy::{FromBytes, Immutable, IntoBytes};

/// A table of indices to gather by, with its largest index (checked against the values once
/// per gather, not index by index).
#[derive(Debug, Default)]
pub(crate) struct Indices {
    at: Vec<u32>,
    largest: u32,
    /// For each whole chunk of 16 entries (entries `16c..16c + 16`): its smallest index when
    /// every entry lies less than 32 above it — the chunk is then two vectors' loads and a
    /// permute, much cheaper than a gather — else [`NO_WINDOW`].
    windows: Vec<u32>,
}

/// [`Indices::windows`] of a chunk whose indices spread over more than 32 values.
const NO_WINDOW: u32 = u32::MAX;

impl Indices {
    pub(crate) fn new(at: Vec<u32>) -> Self {
        let largest = largest(&at);
        let windows: Vec<u32> = at
            .chunks_exact(16)
            .map(|chunk| {
                let low = chunk.iter().copied().min().unwrap_or(0);
                if chunk.iter().all(|&i| i - low < 32) {
                    low
                } else {
                    NO_WINDOW
                }
            })
            .collect();
        Self {
            at,
            largest,
            windows,
        }
    }

    /// Entries of the table.
    pub(crate) fn len(&self) -> usize {
        self.at.len()
    }

    /// `out[j] = values[at[first + j]]` for the `out.len()` indices from `first`.
    ///
    /// # Panics
    /// When those indices reach past the table, or one is out of range of `values`.
    pub(crate) fn gather(&self, values: &[u32], first: usize, out: &mut [u32]) {
        let at = &self.at[first..first + out.len()];
        #[cfg(target_arch = "x86_64")]
        if first.is_multiple_of(16) && std::arch::is_x86_feature_detected!("avx512f") {
            let whole = out.len() / 16 * 16;
            let windows = &self.windows[first / 16..][..whole / 16];
            // SAFETY: the CPU has AVX-512F, the function's one target feature.
            unsafe { gather_windows(values, &at[..whole], windows, &mut out[..whole]) };
            gather_u32(values, &at[whole..], &mut out[whole..]);
            return;
        }
        if (self.largest as usize) < values.len() {
            gather_checked(values, at, self.largest, out);
        } else {
            gather_u32(values, at, out);
        }
    }
}

/// [`Indices::gather`] of whole chunks of 16, `windows` holding each chunk's window: where it
/// lies inside `values`, two loads and one permute of the 32 values from the window's start
/// (the permute reads only the low 5 bits of each index less the start: it cannot leave the
/// window); else the gather instruction.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn gather_windows(values: &[u32], at: &[u32], windows: &[u32], out: &mut [u32]) {
    use std::arch::x86_64::{
        __m512i, _mm512_loadu_si512, _mm512_permutex2var_epi32, _mm512_set1_epi32,
        _mm512_storeu_si512, _mm512_sub_epi32,
    };
    let chunks = out.chunks_exact_mut(16).zip(at.chunks_exact(16));
    for ((out, at), &low) in chunks.zip(windows) {
        let end = (low as usize).saturating_add(32);
        if low == NO_WINDOW || end > values.len() {
            gather_u32(values, at, out);
            continue;
        }
        let window = &values[end - 32..end];
        // SAFETY: `window` holds 32 values and `at` and `out` 16 each: unaligned 64-byte loads
        // and a store inside them.
        unsafe {
            let first = _mm512_loadu_si512(window.as_ptr().cast::<__m512i>());
            let second = _mm512_loadu_si512(window.as_ptr().add(16).cast::<__m512i>());
            let at = _mm512_loadu_si512(at.as_ptr().cast::<__m512i>());
            let index = _mm512_sub_epi32(at, _mm512_set1_epi32(low as i32));
            let picked = _mm512_permutex2var_epi32(first, index, second);
            _mm512_storeu_si512(out.as_mut_ptr().cast::<__m512i>(), picked);
        }
    }
}

/// The largest of `at` (0 for none), every index looked at: a loop the compiler vectorises.
fn largest(at: &[u32]) -> u32 {
    at.iter().fold(0u32, |largest, &i| largest.max(i))
}

/// `out[j] = values[at[j]]` for every `j` below the shorter of `at` and `out`.
///
/// # Panics
/// When an index is out of range of `values`.
pub(crate) fn gather_u32(values: &[u32], at: &[u32], out: &mut [u32]) {
    let n = at.len().min(out.len());
    let (at, out) = (&at[..n], &mut out[..n]);
    gather_checked(values, at, largest(at), out);
}

/// [`gather_u32`] of `at` and `out` of one length, `largest` at least every index of `at`.
fn gather_checked(values: &[u32], at: &[u32], largest: u32, out: &mut [u32]) {
    let n = at.len();
    assert!(
        n == 0 || (largest as usize) < values.len(),
        "gather index {largest} past {} values",
        values.len()
    );
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") && largest <= i32::MAX as u32 {
        // SAFETY: the CPU has AVX-512F, the function's one target feature; every index is at
        // most `largest` (the caller's word: `Indices` computed it from the table, `gather_u32`
        // from these indices), which is below `values.len()` (checked above) and fits an i32.
        unsafe { gather_avx512(values, at, out) };
        return;
    }
    for (value, &i) in out.iter_mut().zip(at) {
        *value = values[i as usize];
    }
}

/// # Safety
/// The CPU has AVX-512F; every index of `at` is below `values.len()` and at most `i32::MAX`;
/// `out` is as long as `at`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn gather_avx512(values: &[u32], at: &[u32], out: &mut [u32]) {
    use std::arch::x86_64::{
        __m512i, _mm512_i32gather_epi32, _mm512_loadu_si512, _mm512_storeu_si512,
    };
    let whole = at.len() / 16 * 16;
    for (at, out) in at[..whole]
        .chunks_exact(16)
        .zip(out[..whole].chunks_exact_mut(16))
    {
        // SAFETY: `at` and `out` hold 16 values each (unaligned 64-byte accesses); every index
        // is in range of `values` (the caller's contract), scaled by 4 bytes.
        unsafe {
            let index = _mm512_loadu_si512(at.as_ptr().cast::<__m512i>());
            let gathered = _mm512_i32gather_epi32::<4>(index, values.as_ptr().cast::<i32>());
            _mm512_storeu_si512(out.as_mut_ptr().cast::<__m512i>(), gathered);
        }
    }
    for (value, &i) in out[whole..].iter_mut().zip(&at[whole..]) {
        *value = values[i as usize];
    }
}

/// 2 × 2 maximum pooling at stride 2 over output rows of `q` values, `q` dividing 16, for as
/// many whole blocks of 16 outputs as `out` holds: `x` holds, for each output row `R` from
/// the first, input rows `2R` and `2R + 1` (`2q` values each), one after another. Each output
/// is `sel(sel(sel(L, t00), t01), sel(sel(L, t10), t11))`, `sel` being pooling's select and `L`
/// minus infinity — the taps' fold in order, the select being associative. Returns the
/// outputs written (0 without AVX-512 or for another `q`): the caller does the rest.
pub(crate) fn max_pairs_f32(x: &[f32], q: usize, out: &mut [f32]) -> usize {
    let blocks = (out.len() / 16).min(x.len() / 64);
    #[cfg(target_arch = "x86_64")]
    if q > 0 && 16 % q == 0 && blocks > 0 && std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: the CPU has AVX-512F, the function's one target feature.
        unsafe { max_pairs_avx512(&x[..64 * blocks], q, &mut out[..16 * blocks]) };
        return 16 * blocks;
    }
    0
}

/// [`max_pairs_f32`] with AVX-512: per 16 outputs, four loads, two permutes and two selects
/// to fold each pair of columns, two permutes to line up the rows, and one select.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
fn max_pairs_avx512(x: &[f32], q: usize, out: &mut [f32]) {
    use std::arch::x86_64::{
        __m512, __m512i, _mm512_cmp_ps_mask, _mm512_loadu_ps, _mm512_loadu_si512,
        _mm512_mask_blend_ps, _mm512_permutex2var_ps, _mm512_set1_ps, _mm512_storeu_ps, _CMP_GT_OQ,
        _CMP_UNORD_Q,
    };
    assert!(
        x.len() == 4 * out.len() && out.len().is_multiple_of(16),
        "whole blocks"
    );
    let select = |m: __m512, x: __m512| {
        let take =
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, m) | _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x);
        _mm512_mask_blend_ps(take, m, x)
    };
    let even: [i32; 16] = std::array::from_fn(|j| 2 * j as i32);
    let odd: [i32; 16] = std::array::from_fn(|j| 2 * j as i32 + 1);
    // Output `o` of a block: row `o / q`, column `o % q`; its top fold is folded value
    // `2q · (o / q) + o % q` of the block's 32, its bottom fold `q` further.
    let top: [i32; 16] = std::array::from_fn(|o| (2 * q * (o / q) + o % q) as i32);
    let bottom: [i32; 16] = std::array::from_fn(|o| (2 * q * (o / q) + o % q + q) as i32);
    // SAFETY: each index array holds 16 i32 (unaligned 64-byte loads).
    let [even, odd, top, bottom] = [even, odd, top, bottom]
        .map(|at| unsafe { _mm512_loadu_si512(at.as_ptr().cast::<__m512i>()) });
    let lowest = _mm512_set1_ps(f32::NEG_INFINITY);
    for (x, out) in x.chunks_exact(64).zip(out.chunks_exact_mut(16)) {
        // SAFETY: `x` holds 64 f32 and `out` 16 (unaligned 64-byte loads and a store).
        unsafe {
            let v = [0, 16, 32, 48].map(|at| _mm512_loadu_ps(x.as_ptr().add(at)));
            let fold = |a: __m512, b: __m512| {
                let first = _mm512_permutex2var_ps(a, even, b);
                let second = _mm512_permutex2var_ps(a, odd, b);
                select(select(lowest, first), second)
            };
            let (low, high) = (fold(v[0], v[1]), fold(v[2], v[3]));
            let upper = _mm512_permutex2var_ps(low, top, high);
            let lower = _mm512_permutex2var_ps(low, bottom, high);
            _mm512_storeu_ps(out.as_mut_ptr(), select(upper, lower));
        }
    }
}

/// 32-bit values as their bits (4 bytes each, aligned to 4: a view, no copy).
pub(crate) fn words<T: IntoBytes + Immutable>(values: &[T]) -> &[u32] {
    <[u32]>::ref_from_bytes(values.as_bytes()).unwrap_or_default()
}

/// [`words`], mutably.
pub(crate) fn words_mut<T: IntoBytes + FromBytes>(values: &mut [T]) -> &mut [u32] {
    <[u32]>::mut_from_bytes(values.as_mut_bytes()).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::{gather_u32, Indices, NO_WINDOW};

    #[test]
    fn every_length_gathers_what_indexing_gives() {
        let values: Vec<u32> = (0..100).map(|v| v * 7 + 3).collect();
        for n in [0, 1, 15, 16, 17, 33, 64] {
            let at: Vec<u32> = (0..n).map(|j| (j * 37 % 100) as u32).collect();
            let mut out = vec![0; n];
            gather_u32(&values, &at, &mut out);
            let want: Vec<u32> = at.iter().map(|&i| values[i as usize]).collect();
            assert_eq!(out, want, "{n} indices");
        }
    }

    #[test]
    fn tables_gather_what_indexing_gives_with_and_without_windows() {
        let values: Vec<u32> = (0..300).map(|v| v * 7 + 3).collect();
        // Chunks that fit a window of 32 (rows of 4 at a stride of 6), one that spreads
        // wider, one whose window ends past the values, and a tail shorter than a chunk.
        let mut at: Vec<u32> = (0..32).map(|j| 40 + (j / 4) * 6 + j % 4).collect();
        at.extend((0..16).map(|j| j * 17));
        at.extend((0..16).map(|j| 290 + j % 10));
        at.extend([5, 299, 0]);
        let table = Indices::new(at.clone());
        assert_eq!(table.windows.len(), 4);
        assert!(table.windows[2] == NO_WINDOW && table.windows[3] == 290);
        for first in [0, 16, 3, 32, 48] {
            let n = at.len() - first;
            let mut out = vec![0; n];
            table.gather(&values, first, &mut out);
            let want: Vec<u32> = at[first..].iter().map(|&i| values[i as usize]).collect();
            assert_eq!(out, want, "from {first}");
        }
    }

    #[test]
    #[should_panic(expected = "gather index 100 past 100 values")]
    fn an_index_past_the_values_is_refused() {
        let values = vec![0u32; 100];
        gather_u32(&values, &[3, 100], &mut [0, 0]);
    }
}
