//! Transcendental functions defined as fixed sequences of correctly rounded f32 operations,
//! computed identically in Rust and in the PTX this module emits.
//!
//! The GPU's fast instructions (`ex2.approx`, `rsqrt.approx`, `tanh.approx`, ...) differ
//! from any CPU library and from one architecture to the next. The functions here use only
//! operations that IEEE 754 defines to the bit: `add.rn`, `sub.rn`, `mul.rn`, `fma.rn` (Rust
//! `f32::mul_add`, one rounding), `div.rn`, `sqrt.rn` (Rust `/`, `f32::sqrt`),
//! `cvt.rni.f32.f32` (`f32::round_ties_even`), `cvt.rzi.s32.f32` (`as i32`, saturating,
//! NaN to 0), integer and bit operations on the f32 bits, `abs`, `neg`, comparisons and
//! selects. Each function is the same list of these operations on both sides, so a kernel
//! and the CPU backend compute the same bits on every platform (NaN payloads aside: a NaN
//! input gives a NaN).
//!
//! Every function is branch-free (both sides of a case are computed and one is selected), so
//! the slice forms ([`exp_slice`], ...) auto-vectorise; on x86-64 they run a loop compiled
//! for AVX2 and FMA when the CPU has both, with the same results as the portable loop.
//!
//! | function | definition | max error measured | bound asserted |
//! |---|---|---|---|
//! | [`exp`] | `x` clamped to `[−104, 89]`; `n = rint(x·log2 e)`; `r = x − n·ln2_hi − n·ln2_lo` (two `fma`); `e^r` by a degree-6 polynomial (Horner, `fma`); times `2^⌊n/2⌋` and `2^(n−⌊n/2⌋)` built in the exponent bits | 0.891 ulp | 1 ulp |
//! | [`rsqrt`] | `1 / sqrt(x)` (`sqrt.rn`, `div.rn`) | 1.490 ulp | 1.5 ulp |
//! | [`sigmoid`] | `e = exp(−\|x\|)`; `1 / (1 + e)` for `x ≥ 0`, `e / (1 + e)` for `x < 0` (one `div.rn`) | 2.402 ulp | 2.5 ulp |
//! | [`tanh`] | `a = \|x\|`; `a < 0.625`: `a + a³·P(a²)` (degree 4 in `a²`); else `1 − 2 / (exp(2a) + 1)`; sign of `x` restored | 1.362 ulp | 1.5 ulp |
//! | [`erf`] | `a = \|x\|`; `a < 0.875`: `a + a·P(a²)` (degree 6 in `a²`); else `1 − exp(−b²)·R(1/(1 + b))`, `b = min(a, 4)` (degree 8 in `t`); sign of `x` restored | 1.288 ulp | 1.5 ulp |
//! | [`gelu`] | `(0.5·x)·(1 + erf(x·(1/√2)))`, `1/√2` rounded to f32; `−0` where `1 + erf = 0` | 1.776 ulp for `x ≥ −0.5`; 2 ulp + 8.26e-8 everywhere | 2 ulp for `x ≥ −0.5`; 2 ulp + 2^-23 |
//!
//! Errors are in f32 ulps of the exact result (`2^−149` in the subnormal range; an infinite
//! result counts as `±2^128`), against float64 references, over all 2^32 inputs (the
//! ignored test `math::tests::every_f32_input_is_within_the_bounds`, minutes of CPU time).
//! The unit tests that run every time (`math::tests`: every 4099th f32 bit pattern and its
//! negation, dense sweeps of the interesting ranges, every f32 near each threshold, the
//! edges and the inputs of the maxima, about 3 million inputs per function) assert the same
//! bounds. `gelu`'s absolute part is the cancellation in `1 + erf(u)` for negative `x` (its
//! definition, not its evaluation): `erf` near −1 is exact to about 2^−25, which `0.5·|x|`
//! scales. The polynomial coefficients are near-minimax fits of our own in float64, rounded
//! to f32, by `scripts/math_coefficients.py`.
//!
//! Each function also has a PTX emitter ([`emit_exp`], ...) that appends its instruction
//! sequence to a kernel body, with temporaries from a [`Temps`] allocator whose declarations
//! the kernel writes once. [`MathFunction`] lists them all, and
//! [`MathFunction::check_kernel`] wraps one in a standalone kernel for tests.
//!
//! ```
//! use tensor_wasm_jit::math::{self, Temps};
//!
//! assert_eq!(math::exp(0.0), 1.0);
//! assert_eq!(math::tanh(-f32::INFINITY), -1.0);
//! let x = [-1.0f32, 0.0, 2.5];
//! let mut y = [0.0f32; 3];
//! math::sigmoid_slice(&mut y, &x);
//! assert_eq!(y[1], 0.5);
//!
//! let mut temps = Temps::new("m");
//! let mut body = String::new();
//! math::emit_exp(&mut body, "%r4", "%r3", &mut temps);
//! assert!(body.contains("fma.rn.f32") && body.ends_with("mov.b32 %r4, %mb20;\n"));
//! assert_eq!(temps.declarations(), "    .reg .b32 %mb<21>;\n    .reg .pred %mp<2>;\n");
//! ```

mod erf;
mod exp;
mod tanh;
#[cfg(test)]
mod tests;

pub use erf::{emit_erf, emit_gelu, erf, gelu};
pub use exp::{emit_exp, emit_sigmoid, exp, sigmoid};
pub use tanh::{emit_tanh, tanh};

use crate::fma::{map_f32, ElementFunction};
use crate::PtxTarget;

/// The f32 sign bit.
const SIGN: u32 = 0x8000_0000;

/// `1 / sqrt(x)`: `sqrt.rn` then `div.rn`, within 1.5 ulp (two roundings).
/// `rsqrt(+0) = +inf`, `rsqrt(−0) = −inf`, `rsqrt(+inf) = 0`, negative `x` gives NaN.
#[inline(always)]
pub fn rsqrt(x: f32) -> f32 {
    1.0 / x.sqrt()
}

/// Appends PTX computing `dst = rsqrt(x)` (see [`rsqrt`]); `dst` may be `x`.
pub fn emit_rsqrt(out: &mut String, dst: &str, x: &str, temps: &mut Temps) {
    let mut seq = Seq::begin(out, temps, "rsqrt", dst, x);
    let root = seq.op("sqrt.rn.f32", &[x]);
    let y = seq.op("div.rn.f32", &[&imm(1.0), &root]);
    seq.finish(dst, &y);
}

/// `y[i] = exp(x[i])` (see [`exp`]).
///
/// # Panics
/// If the slices differ in length.
pub fn exp_slice(y: &mut [f32], x: &[f32]) {
    map_f32::<Exp>(y, x);
}

/// `y[i] = erf(x[i])` (see [`erf`]).
///
/// # Panics
/// If the slices differ in length.
pub fn erf_slice(y: &mut [f32], x: &[f32]) {
    map_f32::<Erf>(y, x);
}

/// `y[i] = tanh(x[i])` (see [`tanh`]).
///
/// # Panics
/// If the slices differ in length.
pub fn tanh_slice(y: &mut [f32], x: &[f32]) {
    map_f32::<Tanh>(y, x);
}

/// `y[i] = rsqrt(x[i])` (see [`rsqrt`]).
///
/// # Panics
/// If the slices differ in length.
pub fn rsqrt_slice(y: &mut [f32], x: &[f32]) {
    map_f32::<Rsqrt>(y, x);
}

/// `y[i] = sigmoid(x[i])` (see [`sigmoid`]).
///
/// # Panics
/// If the slices differ in length.
pub fn sigmoid_slice(y: &mut [f32], x: &[f32]) {
    map_f32::<Sigmoid>(y, x);
}

/// `y[i] = gelu(x[i])` (see [`gelu`]).
///
/// # Panics
/// If the slices differ in length.
pub fn gelu_slice(y: &mut [f32], x: &[f32]) {
    map_f32::<Gelu>(y, x);
}

/// The slice forms' element functions: `map_f32` inlines `apply` into its loop.
macro_rules! element_functions {
    ($($name:ident = $function:ident;)*) => {$(
        struct $name;
        impl ElementFunction for $name {
            #[inline(always)]
            fn apply(x: f32) -> f32 {
                $function(x)
            }
        }
    )*};
}

element_functions! {
    Exp = exp;
    Erf = erf;
    Tanh = tanh;
    Rsqrt = rsqrt;
    Sigmoid = sigmoid;
    Gelu = gelu;
}

/// The functions of this module, for code that handles them all alike (tests, checks, docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MathFunction {
    /// [`exp`].
    Exp,
    /// [`erf`].
    Erf,
    /// [`tanh`].
    Tanh,
    /// [`rsqrt`].
    Rsqrt,
    /// [`sigmoid`].
    Sigmoid,
    /// [`gelu`].
    Gelu,
}

impl MathFunction {
    /// Every function, in a fixed order.
    pub const ALL: [MathFunction; 6] = [
        MathFunction::Exp,
        MathFunction::Erf,
        MathFunction::Tanh,
        MathFunction::Rsqrt,
        MathFunction::Sigmoid,
        MathFunction::Gelu,
    ];

    /// `exp`, `erf`, `tanh`, `rsqrt`, `sigmoid`, `gelu`.
    pub fn name(self) -> &'static str {
        match self {
            MathFunction::Exp => "exp",
            MathFunction::Erf => "erf",
            MathFunction::Tanh => "tanh",
            MathFunction::Rsqrt => "rsqrt",
            MathFunction::Sigmoid => "sigmoid",
            MathFunction::Gelu => "gelu",
        }
    }

    /// The function of one value.
    pub fn eval(self, x: f32) -> f32 {
        match self {
            MathFunction::Exp => exp(x),
            MathFunction::Erf => erf(x),
            MathFunction::Tanh => tanh(x),
            MathFunction::Rsqrt => rsqrt(x),
            MathFunction::Sigmoid => sigmoid(x),
            MathFunction::Gelu => gelu(x),
        }
    }

    /// The function of every element: `y[i] = f(x[i])`.
    ///
    /// # Panics
    /// If the slices differ in length.
    pub fn eval_slice(self, y: &mut [f32], x: &[f32]) {
        match self {
            MathFunction::Exp => exp_slice(y, x),
            MathFunction::Erf => erf_slice(y, x),
            MathFunction::Tanh => tanh_slice(y, x),
            MathFunction::Rsqrt => rsqrt_slice(y, x),
            MathFunction::Sigmoid => sigmoid_slice(y, x),
            MathFunction::Gelu => gelu_slice(y, x),
        }
    }

    /// Appends PTX computing `dst = f(x)` (`.b32` registers; `dst` may be `x`).
    pub fn emit(self, out: &mut String, dst: &str, x: &str, temps: &mut Temps) {
        match self {
            MathFunction::Exp => emit_exp(out, dst, x, temps),
            MathFunction::Erf => emit_erf(out, dst, x, temps),
            MathFunction::Tanh => emit_tanh(out, dst, x, temps),
            MathFunction::Rsqrt => emit_rsqrt(out, dst, x, temps),
            MathFunction::Sigmoid => emit_sigmoid(out, dst, x, temps),
            MathFunction::Gelu => emit_gelu(out, dst, x, temps),
        }
    }

    /// `tw_math_exp`, ...: the entry of [`MathFunction::check_kernel`].
    pub fn entry_name(self) -> String {
        format!("tw_math_{}", self.name())
    }

    /// A standalone PTX module whose one entry, [`MathFunction::entry_name`]`(.param .u64
    /// p_x, .param .u64 p_y, .param .u32 p_n)`, computes `y[i] = f(x[i])` for each
    /// `i = ctaid.x · ntid.x + tid.x < n`, one element per thread. For the interpreter and
    /// `ptxas` checks of the emitted sequences; not a blueprint.
    pub fn check_kernel(self, target: &PtxTarget) -> String {
        let mut temps = Temps::new("m");
        let mut body = String::new();
        self.emit(&mut body, "%r5", "%r4", &mut temps);
        let entry = self.entry_name();
        let mut out = format!(
            "// {entry}: y[i] = {}(x[i]) for i < n; generated by tensor-wasm-jit.\n\
             .version {}.{}\n.target {}\n.address_size 64\n\n",
            self.name(),
            target.ptx_isa.0,
            target.ptx_isa.1,
            target.sm_name()
        );
        out.push_str(&format!(
            ".visible .entry {entry}(\n    .param .u64 p_x,\n    .param .u64 p_y,\n    \
             .param .u32 p_n\n)\n{{\n"
        ));
        for line in [".reg .pred %p<2>;", ".reg .b32 %r<6>;", ".reg .b64 %rd<4>;"] {
            out.push_str(&format!("    {line}\n"));
        }
        out.push_str(&temps.declarations());
        out.push('\n');
        for line in [
            "mov.u32 %r1, %ctaid.x;",
            "mov.u32 %r2, %ntid.x;",
            "mov.u32 %r3, %tid.x;",
            "mad.lo.u32 %r1, %r1, %r2, %r3;",
            "ld.param.u32 %r2, [p_n];",
            "setp.ge.u32 %p1, %r1, %r2; // guard: i < n",
            "@%p1 bra DONE;",
            "mul.wide.u32 %rd3, %r1, 4;",
            "ld.param.u64 %rd1, [p_x];",
            "cvta.to.global.u64 %rd1, %rd1;",
            "add.u64 %rd1, %rd1, %rd3;",
            "ld.param.u64 %rd2, [p_y];",
            "cvta.to.global.u64 %rd2, %rd2;",
            "add.u64 %rd2, %rd2, %rd3;",
            "ld.global.b32 %r4, [%rd1];",
        ] {
            out.push_str(&format!("    {line}\n"));
        }
        out.push_str(&body);
        out.push_str("    st.global.b32 [%rd2], %r5;\nDONE:\n    ret;\n}\n");
        out
    }
}

/// Allocates the temporary registers of emitted sequences: `.b32` registers
/// `%{prefix}b0, %{prefix}b1, ...` and predicates `%{prefix}p0, ...`, never reused, so
/// sequences can be emitted one after another into one kernel. The kernel declares them
/// once with [`Temps::declarations`], after emitting every sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Temps {
    prefix: String,
    b32: u32,
    pred: u32,
}

impl Temps {
    /// An allocator whose register names start with `%{prefix}`; choose a prefix none of
    /// the kernel's own register names start with.
    ///
    /// # Panics
    /// If `prefix` is empty or not all ASCII lowercase letters.
    pub fn new(prefix: &str) -> Temps {
        assert!(
            !prefix.is_empty() && prefix.bytes().all(|b| b.is_ascii_lowercase()),
            "a register prefix is ASCII lowercase letters, not {prefix:?}"
        );
        Temps {
            prefix: prefix.to_owned(),
            b32: 0,
            pred: 0,
        }
    }

    /// A fresh `.b32` register.
    pub fn b32(&mut self) -> String {
        self.b32 += 1;
        format!("%{}b{}", self.prefix, self.b32 - 1)
    }

    /// A fresh predicate register.
    pub fn pred(&mut self) -> String {
        self.pred += 1;
        format!("%{}p{}", self.prefix, self.pred - 1)
    }

    /// The `.reg` lines declaring every register handed out so far (indented, one per
    /// line; empty when there are none).
    pub fn declarations(&self) -> String {
        let mut out = String::new();
        if self.b32 > 0 {
            out.push_str(&format!("    .reg .b32 %{}b<{}>;\n", self.prefix, self.b32));
        }
        if self.pred > 0 {
            out.push_str(&format!(
                "    .reg .pred %{}p<{}>;\n",
                self.prefix, self.pred
            ));
        }
        out
    }
}

/// An f32 immediate operand: `0f` and the bits in hex.
fn imm(value: f32) -> String {
    format!("0f{:08X}", value.to_bits())
}

/// `if take_a { a } else { b }`: `selp` on the GPU, a blend once vectorised.
#[inline(always)]
fn select(take_a: bool, a: f32, b: f32) -> f32 {
    if take_a {
        a
    } else {
        b
    }
}

/// `magnitude` with the sign bit of `sign` or-ed in (`magnitude` is non-negative or NaN).
#[inline(always)]
fn with_sign_of(magnitude: f32, sign: f32) -> f32 {
    f32::from_bits(magnitude.to_bits() | (sign.to_bits() & SIGN))
}

/// One emitted sequence: each instruction writes a fresh temporary, and only the last one
/// writes the destination, so the destination may be the input.
struct Seq<'a> {
    out: &'a mut String,
    temps: &'a mut Temps,
}

impl<'a> Seq<'a> {
    fn begin(
        out: &'a mut String,
        temps: &'a mut Temps,
        function: &str,
        dst: &str,
        x: &str,
    ) -> Self {
        out.push_str(&format!("    // {dst} = {function}({x})\n"));
        Seq { out, temps }
    }

    fn line(&mut self, text: &str) {
        self.out.push_str("    ");
        self.out.push_str(text);
        self.out.push('\n');
    }

    /// `opcode t, operands...;` into a fresh `.b32` temporary `t`.
    fn op(&mut self, opcode: &str, operands: &[&str]) -> String {
        let dst = self.temps.b32();
        self.line(&format!("{opcode} {dst}, {};", operands.join(", ")));
        dst
    }

    /// `setp.{cmp}.f32 p, a, b;` into a fresh predicate `p`.
    fn setp(&mut self, cmp: &str, a: &str, b: &str) -> String {
        let dst = self.temps.pred();
        self.line(&format!("setp.{cmp}.f32 {dst}, {a}, {b};"));
        dst
    }

    /// [`select`]: `selp.b32 t, a, b, p;`.
    fn select(&mut self, pred: &str, a: &str, b: &str) -> String {
        self.op("selp.b32", &[a, b, pred])
    }

    /// [`with_sign_of`]: `and` out the sign bit of `sign`, `or` it into `magnitude`.
    fn with_sign_of(&mut self, magnitude: &str, sign: &str) -> String {
        let bit = self.op("and.b32", &[sign, &SIGN.to_string()]);
        self.op("or.b32", &[magnitude, &bit])
    }

    /// Horner's rule with `fma.rn`: `((c[n]·v + c[n−1])·v + ...)·v + c[0]`.
    fn horner(&mut self, v: &str, coefficients: &[f32]) -> String {
        let (last, rest) = coefficients.split_last().expect("a polynomial");
        let mut acc = imm(*last);
        for c in rest.iter().rev() {
            acc = self.op("fma.rn.f32", &[&acc, v, &imm(*c)]);
        }
        acc
    }

    fn finish(mut self, dst: &str, value: &str) {
        self.line(&format!("mov.b32 {dst}, {value};"));
    }
}

/// [`Seq::horner`] in Rust: the same `mul_add` chain.
#[inline(always)]
fn horner(v: f32, coefficients: &[f32]) -> f32 {
    let (last, rest) = coefficients.split_last().expect("a polynomial");
    let mut acc = *last;
    for c in rest.iter().rev() {
        acc = acc.mul_add(v, *c);
    }
    acc
}
