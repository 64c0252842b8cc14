//! `exp` and `sigmoid`, in Rust and as PTX, one operation for one operation.

use super::{horner, imm, select, Seq, Temps};

/// Larger inputs are clamped to this: `exp(89)` overflows to +inf as `exp(x)` should.
const EXP_MAX_INPUT: f32 = 89.0;
/// Smaller inputs are clamped to this: `exp(−104)` rounds to +0 as `exp(x)` should.
const EXP_MIN_INPUT: f32 = -104.0;
/// `log2 e` rounded to f32.
const LOG2_E: f32 = f32::from_bits(0x3fb8_aa3b);
/// `−ln 2` rounded to f32 (`ln2_hi`): `x − n·ln2_hi` is exact in one `fma` for every `n`
/// the clamped range reaches.
const NEG_LN2_HI: f32 = f32::from_bits(0xbf31_7218);
/// `−(ln 2 − ln2_hi)` rounded to f32 (`ln2_lo`).
const NEG_LN2_LO: f32 = f32::from_bits(0x3102_e308);
/// `c0..c6` of `e^r ≈ c0 + c1·r + c2·r² + ... + c6·r⁶` on `|r| ≤ ln2/2`, `c0 = c1 = 1`: a
/// near-minimax fit of relative error 3.1e-9 (of `c2..c6`, from
/// `scripts/math_coefficients.py`, `EXP_POLY`).
const EXP_POLY: [f32; 7] = [
    1.0,
    1.0,
    f32::from_bits(0x3eff_fffe), // 4.999999404e-1
    f32::from_bits(0x3e2a_aa49), // 1.666652113e-1
    f32::from_bits(0x3d2a_ac5b), // 4.166827723e-2
    f32::from_bits(0x3c09_1cd1), // 8.368686773e-3
    f32::from_bits(0x3ab5_23a4), // 1.381982584e-3
];
/// The f32 exponent bias.
const BIAS: i32 = 127;

/// `e^x`, within 1 ulp (also for subnormal results).
///
/// 1. `x` is clamped to `[−104, 89]` (NaN passes through);
/// 2. `n = rint(x·log2 e)` (`mul.rn`, `cvt.rni`);
/// 3. `r = fma(n, −ln2_lo, fma(n, −ln2_hi, x))`, `|r| ≤ ln2/2`;
/// 4. `p = 1 + r + c2·r² + ... + c6·r⁶` by Horner's rule in `fma`s, highest order first;
/// 5. `k = n` as an integer (`cvt.rzi.s32`), `k1 = k >> 1` (arithmetic), `k2 = k − k1`;
///    the result is `(p · 2^k1) · 2^k2`, each power of two built in the exponent bits
///    (`(k + 127) << 23`) and normal, so only the last multiply rounds (to +inf or into
///    the subnormals, as the exact result would).
///
/// `exp(NaN)` is NaN, `exp(+inf) = +inf`, `exp(−inf) = +0`, `exp(±0) = 1`.
#[inline(always)]
pub fn exp(x: f32) -> f32 {
    let x = select(x > EXP_MAX_INPUT, EXP_MAX_INPUT, x);
    let x = select(x < EXP_MIN_INPUT, EXP_MIN_INPUT, x);
    let n = (x * LOG2_E).round_ties_even();
    let r = n.mul_add(NEG_LN2_HI, x);
    let r = n.mul_add(NEG_LN2_LO, r);
    let p = horner(r, &EXP_POLY);
    let k = n as i32;
    let k1 = k >> 1;
    let k2 = k.wrapping_sub(k1);
    let scale1 = f32::from_bits((k1.wrapping_add(BIAS) << 23) as u32);
    let scale2 = f32::from_bits((k2.wrapping_add(BIAS) << 23) as u32);
    p * scale1 * scale2
}

/// Appends PTX computing `dst = exp(x)` (see [`exp`]); `dst` may be `x`.
pub fn emit_exp(out: &mut String, dst: &str, x: &str, temps: &mut Temps) {
    let mut seq = Seq::begin(out, temps, "exp", dst, x);
    let y = seq.exp(x);
    seq.finish(dst, &y);
}

/// The logistic function `1 / (1 + e^−x)`, within 2.5 ulp (also where it is subnormal).
///
/// Written as `e = exp(−|x|)` (`abs`, `neg`), `d = 1 + e`, then `1 / d` for `x ≥ 0` (and
/// `x = −0`) and `e / d` for `x < 0` (one `div.rn` of the selected numerator): the same
/// function, without the overflow of `e^−x` for `x < −88.7` that would give 0 in place of a
/// subnormal. `sigmoid(+inf) = 1`, `sigmoid(−inf) = 0`, NaN gives NaN.
#[inline(always)]
pub fn sigmoid(x: f32) -> f32 {
    let e = exp(-x.abs());
    let d = 1.0 + e;
    let numerator = select(x < 0.0, e, 1.0);
    numerator / d
}

/// Appends PTX computing `dst = sigmoid(x)` (see [`sigmoid`]); `dst` may be `x`.
pub fn emit_sigmoid(out: &mut String, dst: &str, x: &str, temps: &mut Temps) {
    let mut seq = Seq::begin(out, temps, "sigmoid", dst, x);
    let a = seq.op("abs.f32", &[x]);
    let minus_a = seq.op("neg.f32", &[&a]);
    let e = seq.exp(&minus_a);
    let d = seq.op("add.rn.f32", &[&imm(1.0), &e]);
    let negative = seq.setp("lt", x, &imm(0.0));
    let numerator = seq.select(&negative, &e, &imm(1.0));
    let y = seq.op("div.rn.f32", &[&numerator, &d]);
    seq.finish(dst, &y);
}

impl Seq<'_> {
    /// [`exp`]'s instructions; returns the register holding the result.
    pub(super) fn exp(&mut self, x: &str) -> String {
        let high = self.setp("gt", x, &imm(EXP_MAX_INPUT));
        let x = self.select(&high, &imm(EXP_MAX_INPUT), x);
        let low = self.setp("lt", &x, &imm(EXP_MIN_INPUT));
        let x = self.select(&low, &imm(EXP_MIN_INPUT), &x);
        let scaled = self.op("mul.rn.f32", &[&x, &imm(LOG2_E)]);
        let n = self.op("cvt.rni.f32.f32", &[&scaled]);
        let r = self.op("fma.rn.f32", &[&n, &imm(NEG_LN2_HI), &x]);
        let r = self.op("fma.rn.f32", &[&n, &imm(NEG_LN2_LO), &r]);
        let p = self.horner(&r, &EXP_POLY);
        let k = self.op("cvt.rzi.s32.f32", &[&n]);
        let k1 = self.op("shr.s32", &[&k, "1"]);
        let k2 = self.op("sub.s32", &[&k, &k1]);
        let biased1 = self.op("add.s32", &[&k1, &BIAS.to_string()]);
        let scale1 = self.op("shl.b32", &[&biased1, "23"]);
        let biased2 = self.op("add.s32", &[&k2, &BIAS.to_string()]);
        let scale2 = self.op("shl.b32", &[&biased2, "23"]);
        let y = self.op("mul.rn.f32", &[&p, &scale1]);
        self.op("mul.rn.f32", &[&y, &scale2])
    }
}
