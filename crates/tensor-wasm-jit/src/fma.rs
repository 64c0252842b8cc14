//! Fused multiply-add over slices, and element-wise maps, with the CPU's FMA (and AVX2)
//! instructions when it has them.
//!
//! `f32::mul_add` is one correctly rounded operation either way, but without the `fma` target
//! feature (not in the baseline x86-64 target) it is a libm call per element. Compiled for
//! `fma` and chosen at run time, the same loop becomes vector FMA instructions, with the same
//! correctly rounded results (NaN payloads aside, as everywhere between CPU and GPU).

#![allow(unsafe_code)]

use tensor_wasm_gpu::gemm::Isa;

/// `y[i] = a[i] * b[i] + c[i]`, fused, over the shortest of the four slices.
pub(crate) fn fma_f32(y: &mut [f32], a: &[f32], b: &[f32], c: &[f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        // SAFETY: the CPU has FMA (checked just above), the one requirement of a
        // `#[target_feature(enable = "fma")]` function; the function itself is safe code.
        unsafe { fma_f32_with_fma(y, a, b, c) };
        return;
    }
    fma_f32_portable(y, a, b, c);
}

fn fma_f32_portable(y: &mut [f32], a: &[f32], b: &[f32], c: &[f32]) {
    for (((y, &a), &b), &c) in y.iter_mut().zip(a).zip(b).zip(c) {
        *y = a.mul_add(b, c);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma")]
fn fma_f32_with_fma(y: &mut [f32], a: &[f32], b: &[f32], c: &[f32]) {
    for (((y, &a), &b), &c) in y.iter_mut().zip(a).zip(b).zip(c) {
        *y = a.mul_add(b, c);
    }
}

/// A function of one f32 that [`map_f32`] applies to every element. `apply` should be
/// `#[inline(always)]` (with everything it calls): it is then compiled into the loop, for the
/// loop's target features, and the loop can be vectorised.
pub(crate) trait ElementFunction {
    /// The function. It must compute the same bits with and without AVX2 and FMA: correctly
    /// rounded operations only (`crate::math` is written so).
    fn apply(x: f32) -> f32;
}

/// `y[i] = F::apply(x[i])`, with the loop compiled for the widest vector unit the CPU has
/// (AVX-512, else AVX2, with FMA), or a narrower one named by `TENSOR_WASM_CPU_ISA`
/// ([`Isa::selected`]); every path gives the same bits.
///
/// # Panics
/// If the slices differ in length.
pub(crate) fn map_f32<F: ElementFunction>(y: &mut [f32], x: &[f32]) {
    map_f32_on::<F>(Isa::selected(), y, x);
}

/// [`map_f32`] with the loop for `isa` (narrower when the CPU lacks FMA).
///
/// # Panics
/// If the slices differ in length, or `isa` is one this CPU lacks.
pub(crate) fn map_f32_on<F: ElementFunction>(isa: Isa, y: &mut [f32], x: &[f32]) {
    assert_eq!(y.len(), x.len(), "input and output lengths differ");
    assert!(isa.is_available(), "{} is not available here", isa.name());
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("fma") {
        match isa {
            Isa::Avx512 => {
                // SAFETY: the CPU has AVX-512F (`is_available`, asserted above) and FMA
                // (checked just above), the requirements of the `#[target_feature]` function;
                // the function itself is safe code.
                unsafe { map_f32_with_avx512::<F>(y, x) };
                return;
            }
            Isa::Avx2 => {
                // SAFETY: as above, with AVX2.
                unsafe { map_f32_with_avx2_fma::<F>(y, x) };
                return;
            }
            Isa::Portable => {}
        }
    }
    map_f32_portable::<F>(y, x);
}

fn map_f32_portable<F: ElementFunction>(y: &mut [f32], x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = F::apply(x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
fn map_f32_with_avx2_fma<F: ElementFunction>(y: &mut [f32], x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = F::apply(x);
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma")]
fn map_f32_with_avx512<F: ElementFunction>(y: &mut [f32], x: &[f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y = F::apply(x);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both paths give the correctly rounded fused result, including where the separate
    /// multiply and add would round differently.
    #[test]
    fn both_paths_fuse() {
        let a = [1.0 + f32::EPSILON, 3.0, f32::MAX, -0.0, f32::from_bits(1)];
        let b = [1.0 - f32::EPSILON, 0.1, 2.0, 5.0, 0.5];
        let c = [-1.0, 0.3, -f32::MAX, -0.0, 0.0];
        let mut fused = [0.0f32; 5];
        let mut portable = [0.0f32; 5];
        fma_f32(&mut fused, &a, &b, &c);
        fma_f32_portable(&mut portable, &a, &b, &c);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&fused), bits(&portable));
        // (1 + e)(1 - e) - 1 = -e^2 exactly when fused; 0 when the product is rounded first.
        assert_eq!(fused[0], -(f32::EPSILON * f32::EPSILON));
        assert_eq!(fused[2], f32::MAX, "no overflow in the fused product");
    }
}
