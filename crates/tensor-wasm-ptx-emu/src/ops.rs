//! The arithmetic of the PTX ISA on register bits: wrapping integers of 16/32/64 bits,
//! clamped shifts, f32 and f64 rounded to nearest even (NaN results canonical, as the
//! hardware writes them; `.ftz` flushing f32 subnormals), comparisons, conversions and the
//! read-modify-write of atomics.

use crate::ir::{AtomOp, BoolOp, Cmp, FloatOp, IntOp, Rounding, Ty, TyKind, UnaryOp};

/// The NaN the hardware writes for an f32 arithmetic NaN result.
pub(crate) const CANONICAL_NAN: u32 = 0x7fff_ffff;

/// The low `bits` of `value`.
pub(crate) fn mask(value: u64, bits: u32) -> u64 {
    if bits >= 64 {
        value
    } else {
        value & ((1u64 << bits) - 1)
    }
}

/// The low `bits` of `value`, sign-extended.
pub(crate) fn sext(value: u64, bits: u32) -> i64 {
    let shift = 64 - bits;
    ((value << shift) as i64) >> shift
}

/// `value` read as `ty` (signed types sign-extended), widened to i128.
fn wide(value: u64, ty: Ty) -> i128 {
    if ty.signed() {
        i128::from(sext(value, ty.bits))
    } else {
        i128::from(mask(value, ty.bits))
    }
}

/// Integer binary operation; `None` for division by zero (no defined result).
pub(crate) fn int(op: IntOp, ty: Ty, a: u64, b: u64) -> Option<u64> {
    let bits = ty.bits;
    let value = match op {
        IntOp::Add => a.wrapping_add(b),
        IntOp::Sub => a.wrapping_sub(b),
        IntOp::MulLo => a.wrapping_mul(b),
        IntOp::MulHi if ty.signed() => ((wide(a, ty) * wide(b, ty)) >> bits) as u64,
        IntOp::MulHi => ((u128::from(mask(a, bits)) * u128::from(mask(b, bits))) >> bits) as u64,
        IntOp::Div | IntOp::Rem => {
            if mask(b, bits) == 0 {
                return None;
            }
            if ty.signed() {
                let (x, y) = (sext(a, bits), sext(b, bits));
                // In `bits` bits, MIN / -1 wraps to MIN (computed in 64 bits, then masked).
                if op == IntOp::Div {
                    x.wrapping_div(y) as u64
                } else {
                    x.wrapping_rem(y) as u64
                }
            } else {
                let (x, y) = (mask(a, bits), mask(b, bits));
                if op == IntOp::Div {
                    x / y
                } else {
                    x % y
                }
            }
        }
        IntOp::Min | IntOp::Max => {
            let (x, y) = (wide(a, ty), wide(b, ty));
            let pick_a = if op == IntOp::Min { x <= y } else { x >= y };
            if pick_a {
                a
            } else {
                b
            }
        }
        IntOp::And => a & b,
        IntOp::Or => a | b,
        IntOp::Xor => a ^ b,
        // The shift amount is an unsigned 32-bit value; amounts past the width clamp.
        IntOp::Shl => {
            let amount = mask(b, 32);
            if amount >= u64::from(bits) {
                0
            } else {
                a << amount
            }
        }
        IntOp::Shr => {
            let amount = mask(b, 32).min(u64::from(bits));
            if ty.signed() {
                let x = sext(a, bits);
                (x >> amount.min(63)) as u64
            } else if amount >= u64::from(bits) {
                0
            } else {
                mask(a, bits) >> amount
            }
        }
    };
    Some(mask(value, bits))
}

/// `mul.wide`: the full product of two `ty` values, twice as wide.
pub(crate) fn mul_wide(ty: Ty, a: u64, b: u64) -> u64 {
    mask((wide(a, ty) * wide(b, ty)) as u64, ty.bits * 2)
}

fn f(bits: u64) -> f32 {
    f32::from_bits(bits as u32)
}

/// The NaN the hardware writes for an f64 arithmetic NaN result.
pub(crate) const CANONICAL_NAN_64: u64 = 0x7fff_ffff_ffff_ffff;

/// An f32 arithmetic result as register bits, NaNs canonical.
fn bits_of(value: f32) -> u64 {
    if value.is_nan() {
        u64::from(CANONICAL_NAN)
    } else {
        u64::from(value.to_bits())
    }
}

/// An f64 arithmetic result as register bits, NaNs canonical.
fn bits_of_64(value: f64) -> u64 {
    if value.is_nan() {
        CANONICAL_NAN_64
    } else {
        value.to_bits()
    }
}

/// `.ftz`: a subnormal f32 becomes a zero of its sign.
fn flush(value: f32) -> f32 {
    if value.is_subnormal() {
        0f32.copysign(value)
    } else {
        value
    }
}

/// The f32 operands of an instruction, flushed under `.ftz`.
fn f32_in(bits: u64, ftz: bool) -> f32 {
    if ftz {
        flush(f(bits))
    } else {
        f(bits)
    }
}

/// An f32 result, flushed under `.ftz`, NaNs canonical.
fn f32_out(value: f32, ftz: bool) -> u64 {
    bits_of(if ftz { flush(value) } else { value })
}

/// Float binary operation of `bits` (32 or 64), one rounding to nearest even; subnormals
/// kept unless `ftz` (f32 only).
///
/// `min`/`max`: a NaN operand yields the other operand, two NaNs the canonical NaN, and
/// `-0.0` is smaller than `+0.0`.
pub(crate) fn float(op: FloatOp, bits: u32, ftz: bool, a: u64, b: u64) -> u64 {
    if bits == 64 {
        let (x, y) = (f64::from_bits(a), f64::from_bits(b));
        return match op {
            FloatOp::Add => bits_of_64(x + y),
            FloatOp::Sub => bits_of_64(x - y),
            FloatOp::Mul => bits_of_64(x * y),
            FloatOp::Div => bits_of_64(x / y),
            FloatOp::Min | FloatOp::Max => {
                let first = min_max_first(
                    op,
                    x.is_nan(),
                    y.is_nan(),
                    x == y,
                    x < y,
                    x.is_sign_negative(),
                );
                match first {
                    None => CANONICAL_NAN_64,
                    Some(true) => a,
                    Some(false) => b,
                }
            }
        };
    }
    let (x, y) = (f32_in(a, ftz), f32_in(b, ftz));
    match op {
        FloatOp::Add => f32_out(x + y, ftz),
        FloatOp::Sub => f32_out(x - y, ftz),
        FloatOp::Mul => f32_out(x * y, ftz),
        FloatOp::Div => f32_out(x / y, ftz),
        FloatOp::Min | FloatOp::Max => {
            match min_max_first(
                op,
                x.is_nan(),
                y.is_nan(),
                x == y,
                x < y,
                x.is_sign_negative(),
            ) {
                None => u64::from(CANONICAL_NAN),
                Some(true) => u64::from(x.to_bits()),
                Some(false) => u64::from(y.to_bits()),
            }
        }
    }
}

/// Whether `min`/`max` picks its first operand (`None`: both are NaN).
fn min_max_first(
    op: FloatOp,
    x_nan: bool,
    y_nan: bool,
    equal: bool,
    less: bool,
    x_negative: bool,
) -> Option<bool> {
    match (x_nan, y_nan) {
        (true, true) => None,
        (true, false) => Some(false),
        (false, true) => Some(true),
        // Only ±0 compare equal with different bits: -0 is the smaller.
        _ if equal => Some((op == FloatOp::Min) == x_negative),
        _ => Some((op == FloatOp::Min) == less),
    }
}

/// `fma.rn`: `a * b + c` with a single rounding.
pub(crate) fn fma(bits: u32, ftz: bool, a: u64, b: u64, c: u64) -> u64 {
    if bits == 64 {
        let v = |x: u64| f64::from_bits(x);
        return bits_of_64(v(a).mul_add(v(b), v(c)));
    }
    f32_out(f32_in(a, ftz).mul_add(f32_in(b, ftz), f32_in(c, ftz)), ftz)
}

/// `sqrt.rn`: correctly rounded; `sqrt(−0) = −0`, negative operands give the canonical
/// NaN.
pub(crate) fn sqrt(bits: u32, ftz: bool, a: u64) -> u64 {
    if bits == 64 {
        return bits_of_64(f64::from_bits(a).sqrt());
    }
    f32_out(f32_in(a, ftz).sqrt(), ftz)
}

/// Unary operations: `neg`/`abs` of integers wrap; of f32 they flip or clear the sign bit.
pub(crate) fn unary(op: UnaryOp, ty: Ty, a: u64) -> u64 {
    if ty.kind == TyKind::F {
        let sign = 1u64 << (ty.bits - 1);
        return match op {
            UnaryOp::Neg => mask(a ^ sign, ty.bits),
            UnaryOp::Abs => mask(a & !sign, ty.bits),
            UnaryOp::Not => mask(!a, ty.bits),
        };
    }
    let value = match op {
        UnaryOp::Neg => a.wrapping_neg(),
        UnaryOp::Abs => sext(a, ty.bits).wrapping_abs() as u64,
        UnaryOp::Not => !a,
    };
    mask(value, ty.bits)
}

/// `setp`'s comparison of two `ty` values. Ordered float comparisons are false when either
/// operand is NaN; the `u` forms are true then.
pub(crate) fn compare(cmp: Cmp, ty: Ty, ftz: bool, a: u64, b: u64) -> bool {
    if ty.kind == TyKind::F {
        let (x, y) = if ty.bits == 64 {
            (f64::from_bits(a), f64::from_bits(b))
        } else {
            (f64::from(f32_in(a, ftz)), f64::from(f32_in(b, ftz)))
        };
        let unordered = x.is_nan() || y.is_nan();
        return match cmp {
            Cmp::Eq => x == y,
            Cmp::Ne => !unordered && x != y,
            Cmp::Lt => x < y,
            Cmp::Le => x <= y,
            Cmp::Gt => x > y,
            Cmp::Ge => x >= y,
            Cmp::Equ => unordered || x == y,
            Cmp::Neu => unordered || x != y,
            Cmp::Ltu => unordered || x < y,
            Cmp::Leu => unordered || x <= y,
            Cmp::Gtu => unordered || x > y,
            Cmp::Geu => unordered || x >= y,
            Cmp::Num => !unordered,
            Cmp::Nan => unordered,
        };
    }
    let (x, y) = (wide(a, ty), wide(b, ty));
    match cmp {
        Cmp::Eq | Cmp::Equ => x == y,
        Cmp::Ne | Cmp::Neu => x != y,
        Cmp::Lt | Cmp::Ltu => x < y,
        Cmp::Le | Cmp::Leu => x <= y,
        Cmp::Gt | Cmp::Gtu => x > y,
        Cmp::Ge | Cmp::Geu => x >= y,
        Cmp::Num => true,
        Cmp::Nan => false,
    }
}

/// Combines a comparison with `setp`'s third predicate.
pub(crate) fn combine(op: BoolOp, a: bool, b: bool) -> bool {
    match op {
        BoolOp::And => a && b,
        BoolOp::Or => a || b,
        BoolOp::Xor => a != b,
    }
}

/// Whether `cvt` between these types with these modifiers is implemented; the reason if not.
pub(crate) fn check_cvt(
    dst: Ty,
    src: Ty,
    rounding: Option<Rounding>,
    sat: bool,
) -> Result<(), &'static str> {
    let float = |t: Ty| t.kind == TyKind::F;
    match (float(dst), float(src)) {
        (false, false) if rounding.is_none() => Ok(()),
        (false, false) => Err("rounding on an integer conversion"),
        // Float to integer needs an integral rounding; it always saturates.
        (false, true) => match rounding {
            Some(Rounding::Rni | Rounding::Rzi | Rounding::Rmi | Rounding::Rpi) => Ok(()),
            _ => Err("float to integer needs .rni/.rzi/.rmi/.rpi"),
        },
        (true, false) if sat => Err(".sat on a float result"),
        (true, false) if rounding == Some(Rounding::Rn) => Ok(()),
        (true, false) => Err("integer to float needs .rn"),
        (true, true) if sat => Err(".sat on a float result"),
        (true, true) if dst.bits == 64 && src.bits == 32 && rounding.is_none() => Ok(()),
        (true, true) if dst.bits == 32 && src.bits == 64 && rounding == Some(Rounding::Rn) => {
            Ok(())
        }
        (true, true) if dst == src && rounding.is_some() && rounding != Some(Rounding::Rn) => {
            Ok(())
        }
        (true, true) => Err("this float conversion"),
    }
}

fn round_integral(value: f64, rounding: Option<Rounding>) -> f64 {
    match rounding {
        Some(Rounding::Rzi) => value.trunc(),
        Some(Rounding::Rmi) => value.floor(),
        Some(Rounding::Rpi) => value.ceil(),
        _ => value.round_ties_even(),
    }
}

/// `cvt` (already checked by [`check_cvt`]).
pub(crate) fn cvt(dst: Ty, src: Ty, rounding: Option<Rounding>, sat: bool, a: u64) -> u64 {
    let float = |t: Ty| t.kind == TyKind::F;
    let read_float = |a: u64| {
        if src.bits == 32 {
            f64::from(f(a))
        } else {
            f64::from_bits(a)
        }
    };
    match (float(dst), float(src)) {
        (false, false) => {
            let value = wide(a, src);
            if !sat {
                return mask(value as u64, dst.bits);
            }
            let (lo, hi) = int_range(dst);
            mask(value.clamp(lo, hi) as u64, dst.bits)
        }
        (false, true) => {
            let value = round_integral(read_float(a), rounding);
            if value.is_nan() {
                return 0;
            }
            let (lo, hi) = int_range(dst);
            // Saturating: out-of-range values clamp (an f64 holds every f32 exactly).
            let clamped = if value <= lo as f64 {
                lo
            } else if value >= hi as f64 {
                hi
            } else {
                value as i128
            };
            mask(clamped as u64, dst.bits)
        }
        (true, false) => {
            let value = wide(a, src);
            if dst.bits == 32 {
                u64::from((value as f32).to_bits())
            } else {
                (value as f64).to_bits()
            }
        }
        (true, true) => {
            let value = read_float(a);
            if dst.bits == 64 && src.bits == 32 {
                return value.to_bits();
            }
            if dst.bits == 32 && src.bits == 64 {
                return bits_of(value as f32);
            }
            let rounded = round_integral(value, rounding);
            if dst.bits == 32 {
                bits_of(rounded as f32)
            } else {
                rounded.to_bits()
            }
        }
    }
}

fn int_range(ty: Ty) -> (i128, i128) {
    if ty.signed() {
        (-(1i128 << (ty.bits - 1)), (1i128 << (ty.bits - 1)) - 1)
    } else {
        (0, (1i128 << ty.bits) - 1)
    }
}

/// An atomic operation's new memory value from the `old` one (`None` where the memory keeps
/// `old`: a failed `cas`). `ty` is checked by the decoder: integer types of 32 or 64 bits.
pub(crate) fn atom(op: AtomOp, ty: Ty, old: u64, b: u64, c: u64) -> Option<u64> {
    let bits = ty.bits;
    let (old, b) = (mask(old, bits), mask(b, bits));
    let value = match op {
        AtomOp::Add => old.wrapping_add(b),
        AtomOp::Min | AtomOp::Max => {
            let (x, y) = (wide(old, ty), wide(b, ty));
            let keep = if op == AtomOp::Min { x <= y } else { x >= y };
            if keep {
                old
            } else {
                b
            }
        }
        AtomOp::Inc => {
            if old >= b {
                0
            } else {
                old + 1
            }
        }
        AtomOp::Dec => {
            if old == 0 || old > b {
                b
            } else {
                old - 1
            }
        }
        AtomOp::And => old & b,
        AtomOp::Or => old | b,
        AtomOp::Xor => old ^ b,
        AtomOp::Exch => b,
        AtomOp::Cas => {
            if old != b {
                return None;
            }
            c
        }
    };
    Some(mask(value, bits))
}
