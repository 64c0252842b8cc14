//! `erf` and `gelu`, in Rust and as PTX, one operation for one operation.

use super::exp::exp;
use super::{horner, imm, select, with_sign_of, Seq, Temps};

/// Below this `|x|` the odd polynomial is used, from it on the `exp` form.
const ERF_SMALL_BELOW: f32 = 0.875;
/// `|x|` is clamped to this in the `exp` form: `erf(4)` already rounds to 1.
const ERF_CLAMP: f32 = 4.0;
/// `c0..c6` of `erf(x) ≈ x + x·(c0 + c1·s + ... + c6·s⁶)`, `s = x²`, `|x| < 0.875`: a
/// near-minimax fit of relative error 8.6e-10, from `scripts/math_coefficients.py`
/// (`ERF_SMALL`). `c0 = 2/√π − 1`: the leading `x` is added last, unrounded.
const ERF_SMALL: [f32; 7] = [
    f32::from_bits(0x3e03_75d4), // 1.283791661e-1
    f32::from_bits(0xbec0_93a0), // -3.761262894e-1
    f32::from_bits(0x3de7_16ad), // 1.128362194e-1
    f32::from_bits(0xbcdb_ff9c), // -2.685528249e-2
    f32::from_bits(0x3baa_1635), // 5.190635566e-3
    f32::from_bits(0xba52_48e0), // -8.021723479e-4
    f32::from_bits(0x38a4_76b7), // 7.842241757e-5
];
/// `c0..c8` of `erfc(x)·e^(x²) ≈ c0 + c1·t + ... + c8·t⁸`, `t = 1/(1 + x)`,
/// `0.875 ≤ x ≤ 4`: a near-minimax fit of relative error 7.5e-10, from
/// `scripts/math_coefficients.py` (`ERF_LARGE`).
const ERF_LARGE: [f32; 9] = [
    f32::from_bits(0x378a_a97e), // 1.652980791e-5
    f32::from_bits(0x3f10_4449), // 5.635419488e-1
    f32::from_bits(0x3f13_301f), // 5.749530196e-1
    f32::from_bits(0x3e39_f7dd), // 1.816095859e-1
    f32::from_bits(0x3e98_ec06), // 2.986757159e-1
    f32::from_bits(0xc035_32e2), // -2.831230640
    f32::from_bits(0x4091_a702), // 4.551636696
    f32::from_bits(0xc052_882a), // -3.289560795
    f32::from_bits(0x3f75_7aaa), // 9.589029551e-1
];
/// `1/√2` rounded to f32.
const FRAC_1_SQRT_2: f32 = f32::from_bits(0x3f35_04f3);

/// The error function, within 1.5 ulp; exactly ±1 from `|x| ≈ 3.92` on.
///
/// With `a = |x|`, both of these are computed and one selected by `a < 0.875`:
/// - `s = a·a`, `q = c0 + c1·s + ... + c6·s⁶` (Horner in `fma`s), `fma(a, q, a)`;
/// - `b = min(a, 4)` (a select, NaN passes through), `t = 1 / (1 + b)`,
///   `R = c0 + c1·t + ... + c8·t⁸` (Horner), `e = exp(−(b·b))`, `fma(−e, R, 1)`.
///
/// The sign bit of `x` is then or-ed into the result: `erf(−x) = −erf(x)`, `erf(−0) = −0`,
/// `erf(±inf) = ±1`, NaN gives NaN.
#[inline(always)]
pub fn erf(x: f32) -> f32 {
    let a = x.abs();
    let s = a * a;
    let q = horner(s, &ERF_SMALL);
    let small = a.mul_add(q, a);
    let b = select(a > ERF_CLAMP, ERF_CLAMP, a);
    let t = 1.0 / (1.0 + b);
    let r = horner(t, &ERF_LARGE);
    let e = exp(-(b * b));
    let large = (-e).mul_add(r, 1.0);
    with_sign_of(select(a < ERF_SMALL_BELOW, small, large), x)
}

/// Appends PTX computing `dst = erf(x)` (see [`erf`]); `dst` may be `x`.
pub fn emit_erf(out: &mut String, dst: &str, x: &str, temps: &mut Temps) {
    let mut seq = Seq::begin(out, temps, "erf", dst, x);
    let y = seq.erf(x);
    seq.finish(dst, &y);
}

/// The Gaussian error linear unit in its erf form, `x·Φ(x)`, computed as
/// `u = x·(1/√2)` (`mul.rn`, `1/√2` rounded to f32), `s = 1 + erf(u)`, `h = 0.5·x`,
/// `h·s`; where `s = 0` (`x ≲ −5.54`, `erf(u) = −1` exactly) the result is `−0`, also for
/// `x = −inf` (the limit, where `h·s` would be NaN).
///
/// Within 2 ulp of the true `x·Φ(x)` for `x ≥ −0.5`, and within 2 ulp plus 2^−23 absolute
/// everywhere: for negative `x`, `1 + erf(u)` cancels, and the absolute error of `erf` near
/// −1 becomes `0.5·|x|` times that.
#[inline(always)]
pub fn gelu(x: f32) -> f32 {
    let e = erf(x * FRAC_1_SQRT_2);
    let s = 1.0 + e;
    let h = 0.5 * x;
    let y = h * s;
    select(s == 0.0, -0.0, y)
}

/// Appends PTX computing `dst = gelu(x)` (see [`gelu`]); `dst` may be `x`.
pub fn emit_gelu(out: &mut String, dst: &str, x: &str, temps: &mut Temps) {
    let mut seq = Seq::begin(out, temps, "gelu", dst, x);
    let u = seq.op("mul.rn.f32", &[x, &imm(FRAC_1_SQRT_2)]);
    let e = seq.erf(&u);
    let s = seq.op("add.rn.f32", &[&imm(1.0), &e]);
    let h = seq.op("mul.rn.f32", &[&imm(0.5), x]);
    let y = seq.op("mul.rn.f32", &[&h, &s]);
    let zero = seq.setp("eq", &s, &imm(0.0));
    let y = seq.select(&zero, &imm(-0.0), &y);
    seq.finish(dst, &y);
}

impl Seq<'_> {
    /// [`erf`]'s instructions; returns the register holding the result.
    fn erf(&mut self, x: &str) -> String {
        let a = self.op("abs.f32", &[x]);
        let s = self.op("mul.rn.f32", &[&a, &a]);
        let q = self.horner(&s, &ERF_SMALL);
        let small = self.op("fma.rn.f32", &[&a, &q, &a]);
        let above = self.setp("gt", &a, &imm(ERF_CLAMP));
        let b = self.select(&above, &imm(ERF_CLAMP), &a);
        let d = self.op("add.rn.f32", &[&imm(1.0), &b]);
        let t = self.op("div.rn.f32", &[&imm(1.0), &d]);
        let r = self.horner(&t, &ERF_LARGE);
        let b2 = self.op("mul.rn.f32", &[&b, &b]);
        let minus_b2 = self.op("neg.f32", &[&b2]);
        let e = self.exp(&minus_b2);
        let minus_e = self.op("neg.f32", &[&e]);
        let large = self.op("fma.rn.f32", &[&minus_e, &r, &imm(1.0)]);
        let is_small = self.setp("lt", &a, &imm(ERF_SMALL_BELOW));
        let y = self.select(&is_small, &small, &large);
        self.with_sign_of(&y, x)
    }
}
