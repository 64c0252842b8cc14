//! `tanh`, in Rust and as PTX, one operation for one operation.

use super::exp::exp;
use super::{horner, imm, select, with_sign_of, Seq, Temps};

/// Below this `|x|` the odd polynomial is used (no cancellation), from it on the `exp` form
/// (`tanh(0.625) ≈ 0.555`: `1 − 2/(e + 1)` loses less than a bit).
const TANH_SMALL_BELOW: f32 = 0.625;
/// `c0..c4` of `tanh(x) ≈ x + x³·(c0 + c1·s + ... + c4·s⁴)`, `s = x²`, `|x| < 0.625`: a
/// near-minimax fit of relative error 4.5e-9, from `scripts/math_coefficients.py`
/// (`TANH_POLY`).
const TANH_POLY: [f32; 5] = [
    f32::from_bits(0xbeaa_aa99), // -3.333328068e-1
    f32::from_bits(0x3e08_837b), // 1.333140582e-1
    f32::from_bits(0xbd5c_1ad2), // -5.373651534e-2
    f32::from_bits(0x3ca8_fc67), // 2.062816732e-2
    f32::from_bits(0xbbba_8671), // -5.692296196e-3
];

/// The hyperbolic tangent, within 1.5 ulp; exactly ±1 from `|x| ≈ 9.01` on.
///
/// With `a = |x|`, both of these are computed and one selected by `a < 0.625`:
/// - `s = a·a`, `q = c0 + c1·s + ... + c4·s⁴` (Horner in `fma`s), `fma(a·s, q, a)`;
/// - `e = exp(a + a)`, `1 − 2 / (e + 1)` (`add.rn`, `div.rn`, `sub.rn`; `e = +inf` gives 1).
///
/// The sign bit of `x` is then or-ed into the result: `tanh(−x) = −tanh(x)`,
/// `tanh(−0) = −0`, `tanh(±inf) = ±1`, NaN gives NaN.
#[inline(always)]
pub fn tanh(x: f32) -> f32 {
    let a = x.abs();
    let s = a * a;
    let q = horner(s, &TANH_POLY);
    let small = (a * s).mul_add(q, a);
    let e = exp(a + a);
    let large = 1.0 - 2.0 / (e + 1.0);
    with_sign_of(select(a < TANH_SMALL_BELOW, small, large), x)
}

/// Appends PTX computing `dst = tanh(x)` (see [`tanh`]); `dst` may be `x`.
pub fn emit_tanh(out: &mut String, dst: &str, x: &str, temps: &mut Temps) {
    let mut seq = Seq::begin(out, temps, "tanh", dst, x);
    let a = seq.op("abs.f32", &[x]);
    let s = seq.op("mul.rn.f32", &[&a, &a]);
    let q = seq.horner(&s, &TANH_POLY);
    let cube = seq.op("mul.rn.f32", &[&a, &s]);
    let small = seq.op("fma.rn.f32", &[&cube, &q, &a]);
    let twice = seq.op("add.rn.f32", &[&a, &a]);
    let e = seq.exp(&twice);
    let d = seq.op("add.rn.f32", &[&e, &imm(1.0)]);
    let g = seq.op("div.rn.f32", &[&imm(2.0), &d]);
    let large = seq.op("sub.rn.f32", &[&imm(1.0), &g]);
    let is_small = seq.setp("lt", &a, &imm(TANH_SMALL_BELOW));
    let y = seq.select(&is_small, &small, &large);
    let y = seq.with_sign_of(&y, x);
    seq.finish(dst, &y);
}
