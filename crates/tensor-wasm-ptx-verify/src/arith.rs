//! Integer instructions over the proof's values (`value.rs`): each result holds every value
//! the instruction can produce from any values its operands may hold. A result that may wrap
//! becomes its type's whole range. Only `add` and `sub` (and the addition of `mad`) carry a
//! variable's address through; any other instruction on an address gives `Top`.

use crate::decode::Arith;
use crate::value::{Base, Piece, Val};

/// `a op b` (with `c` for `mad`) at `bits`, read `signed`.
pub(crate) fn apply(op: Arith, signed: bool, bits: u32, a: &Val, b: &Val, c: &Val) -> Val {
    match op {
        Arith::Add | Arith::Sub => add(op == Arith::Sub, signed, bits, a, b),
        Arith::MadLo => {
            let product = numeric(Arith::MulLo, signed, bits, a, b);
            add(false, signed, bits, &product, c)
        }
        Arith::MadWide => {
            let product = numeric(Arith::MulWide, signed, bits, a, b);
            add(false, signed, bits * 2, &product, c)
        }
        _ => numeric(op, signed, bits, a, b),
    }
}

/// `a + b` or `a − b`, keeping a variable's address on the left of a subtraction or either
/// side of an addition.
fn add(sub: bool, signed: bool, bits: u32, a: &Val, b: &Val) -> Val {
    let (Val::Set(xs), Val::Set(ys)) = (a, b) else {
        return Val::Top;
    };
    if a.is_number() && b.is_number() {
        let (a0, a1, ta) = a.number(signed, bits);
        let (b0, b1, tb) = b.number(signed, bits);
        let (lo, hi) = if sub {
            (a0 - b1, a1 - b0)
        } else {
            (a0 + b0, a1 + b1)
        };
        return Val::fit(lo, hi, ta.min(tb), signed, bits);
    }
    let mut out = Vec::new();
    for x in xs {
        for y in ys {
            let piece = match (x.base, y.base, sub) {
                (Base::Num, Base::Num, _) => {
                    let single = |p: &Piece| Val::Set(vec![*p]);
                    match add(sub, signed, bits, &single(x), &single(y)) {
                        Val::Set(p) => p[0],
                        Val::Top => return Val::Top,
                    }
                }
                (base, Base::Num, _) => {
                    let (b0, b1, tb) = Val::Set(vec![*y]).number(signed, bits);
                    let (lo, hi) = if sub {
                        (x.lo - b1, x.hi - b0)
                    } else {
                        (x.lo + b0, x.hi + b1)
                    };
                    Piece {
                        base,
                        lo,
                        hi,
                        tz: x.tz.min(tb),
                    }
                }
                (Base::Num, base, false) => {
                    let (a0, a1, ta) = Val::Set(vec![*x]).number(signed, bits);
                    Piece {
                        base,
                        lo: y.lo + a0,
                        hi: y.hi + a1,
                        tz: y.tz.min(ta),
                    }
                }
                _ => return Val::Top,
            };
            out.push(piece);
        }
    }
    Val::from_pieces(out)
}

/// Bits needed for `v` (non-negative).
fn bit_length(v: i128) -> u32 {
    128 - v.leading_zeros()
}

fn numeric(op: Arith, signed: bool, bits: u32, a: &Val, b: &Val) -> Val {
    if !(matches!(a, Val::Top) || a.is_number()) || !(matches!(b, Val::Top) || b.is_number()) {
        return Val::Top;
    }
    let full = |signed: bool, bits: u32| {
        let (lo, hi) = crate::value::range(signed, bits);
        Val::interval(lo, hi)
    };
    let (a0, a1, ta) = a.number(signed, bits);
    let (b0, b1, tb) = b.number(signed, bits);
    // Two known values: the exact result (bitwise operations read unsigned; `rem` and `div`
    // truncate towards zero, as PTX's do).
    if let (Some(x), Some(y)) = (a.singleton(signed, bits), b.singleton(signed, bits)) {
        let unsigned = |v: i128| v.rem_euclid(1i128 << bits);
        let exact = match op {
            Arith::And => Some(unsigned(x) & unsigned(y)),
            Arith::Or => Some(unsigned(x) | unsigned(y)),
            Arith::Xor => Some(unsigned(x) ^ unsigned(y)),
            Arith::Rem if y != 0 => Some(x % y),
            Arith::Div if y != 0 => Some(x / y),
            _ => None,
        };
        if let Some(v) = exact {
            let bitwise = matches!(op, Arith::And | Arith::Or | Arith::Xor);
            let signed = signed && !bitwise;
            return Val::fit(v, v, 0, signed, bits);
        }
    }
    // Products of two 64-bit readings may not fit 128 bits: then the whole range.
    let product = || {
        let c = [
            a0.checked_mul(b0)?,
            a0.checked_mul(b1)?,
            a1.checked_mul(b0)?,
            a1.checked_mul(b1)?,
        ];
        Some((*c.iter().min()?, *c.iter().max()?))
    };
    let tz = (ta + tb).min(64);
    match op {
        Arith::MulLo => match product() {
            Some((lo, hi)) => Val::fit(lo, hi, tz, signed, bits),
            None => full(signed, bits),
        },
        Arith::MulWide => match product() {
            Some((lo, hi)) => Val::fit(lo, hi, tz, signed, bits * 2),
            None => full(signed, bits * 2),
        },
        Arith::Shl | Arith::Shr => {
            let Some(k) = b
                .singleton(false, 32)
                .filter(|k| (0..i128::from(bits)).contains(k))
            else {
                return full(signed && op == Arith::Shr, bits);
            };
            let k = k as u32;
            if op == Arith::Shl {
                let (lo, hi, tz) = a.number(false, bits);
                // Readings are below 2^64 and shifts below 64: the result fits 128 bits.
                Val::fit(lo << k, hi << k, (tz + k).min(64), false, bits)
            } else {
                let (lo, hi, tz) = a.number(signed, bits);
                Val::fit(lo >> k, hi >> k, tz.saturating_sub(k), signed, bits)
            }
        }
        Arith::And | Arith::Or | Arith::Xor => {
            let (a0, a1, ta) = a.number(false, bits);
            let (b0, b1, tb) = b.number(false, bits);
            let (lo, hi, tz) = match op {
                Arith::And => (0, a1.min(b1), ta.max(tb)),
                Arith::Or => (
                    a0.max(b0),
                    (1i128 << bit_length(a1.max(b1))) - 1,
                    ta.min(tb),
                ),
                _ => (0, (1i128 << bit_length(a1.max(b1))) - 1, ta.min(tb)),
            };
            Val::fit(lo, hi, tz, false, bits)
        }
        Arith::Min => Val::fit(a0.min(b0), a1.min(b1), ta.min(tb), signed, bits),
        Arith::Max => Val::fit(a0.max(b0), a1.max(b1), ta.min(tb), signed, bits),
        Arith::Rem if b0 >= 1 && a0 >= 0 => Val::fit(0, a1.min(b1 - 1), 0, signed, bits),
        Arith::Rem if b0 >= 1 => Val::fit(-(b1 - 1), b1 - 1, 0, signed, bits),
        Arith::Div if b0 >= 1 && a0 >= 0 => Val::fit(a0 / b1, a1 / b0, 0, signed, bits),
        Arith::Not => {
            let (a0, a1, _) = a.number(false, bits);
            let max = (1i128 << bits) - 1;
            Val::fit(max - a1, max - a0, 0, false, bits)
        }
        Arith::Neg if signed => Val::fit(-a1, -a0, ta, signed, bits),
        Arith::Abs if signed && a0 >= 0 => Val::fit(a0, a1, ta, signed, bits),
        Arith::Abs if signed && a1 <= 0 => Val::fit(-a1, -a0, ta, signed, bits),
        Arith::Abs if signed => Val::fit(0, a1.max(-a0), 0, signed, bits),
        _ => full(signed, bits),
    }
}

/// `cvt` between integer types: the source read as `from`, extended or truncated to `to`.
pub(crate) fn convert(v: &Val, from: (bool, u32), to: (bool, u32)) -> Val {
    match v {
        Val::Set(pieces) if !v.is_number() => {
            // A shared address keeps its meaning through 32- and 64-bit moves; a generic
            // one only at 64 bits.
            let keeps = |p: &Piece| match p.base {
                Base::Var(_) => from.1 >= 32 && to.1 >= 32 && !from.0,
                Base::Generic(_) => from.1 == 64 && to.1 == 64,
                Base::Num => false,
            };
            if pieces.iter().all(keeps) {
                v.clone()
            } else {
                Val::Top
            }
        }
        _ => {
            let (lo, hi, tz) = v.number(from.0, from.1);
            Val::Set(vec![Piece::num(lo, hi, tz.min(to.1))])
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn num(lo: i128, hi: i128) -> Val {
        Val::interval(lo, hi)
    }

    #[test]
    fn additions_that_may_wrap_give_the_whole_range() {
        let i = num(0, (1 << 31) - 1);
        let sum = apply(Arith::Add, true, 32, &i, &Val::constant(1), &Val::Top);
        assert_eq!(sum.number(true, 32), (-(1 << 31), (1 << 31) - 1, 0));
        let small = apply(
            Arith::Add,
            true,
            32,
            &num(0, 9),
            &Val::constant(16),
            &Val::Top,
        );
        assert_eq!(small.number(true, 32), (16, 25, 0));
    }

    #[test]
    fn wide_products_never_wrap_and_count_zero_bits() {
        let p = apply(
            Arith::MulWide,
            false,
            32,
            &num(0, u32::MAX as i128),
            &Val::constant(4),
            &Val::Top,
        );
        assert_eq!(p.number(false, 64), (0, 4 * u32::MAX as i128, 2));
    }

    #[test]
    fn a_variable_survives_offsets_and_nothing_else() {
        let var = Val::Set(vec![Piece {
            base: Base::Var(3),
            lo: 0,
            hi: 0,
            tz: 64,
        }]);
        let moved = apply(Arith::Add, false, 64, &var, &num(0, 252), &Val::Top);
        let Val::Set(p) = &moved else {
            panic!("an offset address is a set")
        };
        assert_eq!((p[0].base, p[0].lo, p[0].hi), (Base::Var(3), 0, 252));
        assert_eq!(
            apply(Arith::MulLo, false, 64, &var, &Val::constant(2), &Val::Top),
            Val::Top
        );
        assert_eq!(
            apply(Arith::Sub, false, 64, &Val::constant(8), &var, &Val::Top),
            Val::Top
        );
    }

    #[test]
    fn masks_remainders_and_shifts_bound_unknown_values() {
        let huge = apply(Arith::MulLo, false, 64, &Val::Top, &Val::Top, &Val::Top);
        assert_eq!(huge.number(false, 64), (0, u64::MAX as i128, 0));
        let masked = apply(
            Arith::And,
            false,
            32,
            &Val::Top,
            &Val::constant(63),
            &Val::Top,
        );
        assert_eq!(masked.number(false, 32), (0, 63, 0));
        let rem = apply(
            Arith::Rem,
            false,
            32,
            &Val::Top,
            &Val::constant(10),
            &Val::Top,
        );
        assert_eq!(rem.number(false, 32), (0, 9, 0));
        let signed_rem = apply(
            Arith::Rem,
            true,
            32,
            &Val::Top,
            &Val::constant(10),
            &Val::Top,
        );
        assert_eq!(signed_rem.number(true, 32), (-9, 9, 0));
        let shifted = apply(
            Arith::Shl,
            false,
            32,
            &num(0, 3),
            &Val::constant(2),
            &Val::Top,
        );
        assert_eq!(shifted.number(false, 32), (0, 12, 2));
        let unknown_shift = apply(Arith::Shl, false, 32, &num(0, 3), &num(0, 2), &Val::Top);
        assert_eq!(unknown_shift.number(false, 32), (0, u32::MAX as i128, 0));
    }

    #[test]
    fn known_values_give_exact_bitwise_results() {
        let c = |v| Val::constant(v);
        assert_eq!(apply(Arith::And, false, 32, &c(13), &c(3), &Val::Top), c(1));
        assert_eq!(apply(Arith::Or, false, 32, &c(8), &c(3), &Val::Top), c(11));
        assert_eq!(apply(Arith::Rem, true, 32, &c(-7), &c(3), &Val::Top), c(-1));
        assert_eq!(apply(Arith::Div, true, 32, &c(-7), &c(2), &Val::Top), c(-3));
        // -1 & 3 as 32-bit registers: 3.
        assert_eq!(apply(Arith::And, true, 32, &c(-1), &c(3), &Val::Top), c(3));
    }

    #[test]
    fn conversions_read_the_source_type() {
        let minus_one = Val::constant(u32::MAX as i128);
        let widened = convert(&minus_one, (true, 32), (true, 64));
        assert_eq!(widened.number(true, 64), (-1, -1, 0));
        let zero_extended = convert(&minus_one, (false, 32), (false, 64));
        assert_eq!(
            zero_extended.number(false, 64),
            (u32::MAX as i128, u32::MAX as i128, 0)
        );
        let truncated = convert(&num(0, 1 << 40), (false, 64), (false, 32));
        assert_eq!(truncated.number(false, 32), (0, u32::MAX as i128, 0));
    }
}
