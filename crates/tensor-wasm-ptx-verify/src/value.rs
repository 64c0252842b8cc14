//! The values of the launch-time proof (`prove.rs`): for each register, the set of values
//! it may hold in any thread, as at most [`MAX_PIECES`] intervals, each on a base — a plain
//! number, or an offset from a `.shared`/`.local` variable's address (in its own space or
//! as a generic address) — with the number of low bits known to be zero.
//!
//! A register `w` bits wide holds a value's residue modulo 2^w; an interval may lie
//! anywhere on the integers, and an instruction reads it as its type says (signed or
//! unsigned): when the interval does not fit that reading without wrapping, the reading is
//! the type's whole range.

/// Most intervals one value keeps; more are merged into their hull per base, then `Top`.
pub(crate) const MAX_PIECES: usize = 4;

/// Offsets from a variable beyond this magnitude are not tracked.
const MAX_OFFSET: i128 = 1 << 40;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Base {
    Num,
    /// A variable's address in its own space (shared or local).
    Var(u32),
    /// A shared variable's generic address.
    Generic(u32),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Piece {
    pub base: Base,
    pub lo: i128,
    pub hi: i128,
    /// Low bits known to be zero in every value (at most 64).
    pub tz: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Val {
    /// Any value.
    Top,
    /// One of these (never empty).
    Set(Vec<Piece>),
}

/// Low zero bits of `v` (64 for zero).
pub(crate) fn zeros(v: i128) -> u32 {
    if v == 0 {
        64
    } else {
        v.trailing_zeros().min(64)
    }
}

/// The range of a `bits`-wide reading.
pub(crate) fn range(signed: bool, bits: u32) -> (i128, i128) {
    if signed {
        (-(1i128 << (bits - 1)), (1i128 << (bits - 1)) - 1)
    } else {
        (0, (1i128 << bits) - 1)
    }
}

/// `[lo, hi]` as a `bits`-wide register read signed or unsigned: the same interval when it
/// fits, shifted by 2^bits when that makes it fit, else the whole range.
pub(crate) fn read(lo: i128, hi: i128, signed: bool, bits: u32) -> (i128, i128) {
    let (min, max) = range(signed, bits);
    let span = 1i128 << bits;
    if lo >= min && hi <= max {
        (lo, hi)
    } else if lo - span >= min && hi - span <= max {
        (lo - span, hi - span)
    } else if lo + span >= min && hi + span <= max {
        (lo + span, hi + span)
    } else {
        (min, max)
    }
}

impl Piece {
    pub fn num(lo: i128, hi: i128, tz: u32) -> Piece {
        let tz = if lo == hi { tz.max(zeros(lo)) } else { tz };
        Piece {
            base: Base::Num,
            lo,
            hi,
            tz: tz.min(64),
        }
    }
}

impl Val {
    pub fn constant(v: i128) -> Val {
        Val::Set(vec![Piece::num(v, v, 0)])
    }

    pub fn interval(lo: i128, hi: i128) -> Val {
        Val::Set(vec![Piece::num(lo, hi, 0)])
    }

    /// A result of `bits` width read `signed`: kept when it fits, else the whole range.
    pub fn fit(lo: i128, hi: i128, tz: u32, signed: bool, bits: u32) -> Val {
        let (min, max) = range(signed, bits);
        if lo >= min && hi <= max {
            Val::Set(vec![Piece::num(lo, hi, tz)])
        } else {
            Val::Set(vec![Piece::num(min, max, tz.min(bits))])
        }
    }

    pub fn from_pieces(mut pieces: Vec<Piece>) -> Val {
        if pieces.is_empty() {
            return Val::Top;
        }
        pieces.sort_by_key(|p| p.base);
        let mut merged: Vec<Piece> = Vec::with_capacity(pieces.len());
        for p in pieces {
            if p.base != Base::Num && (p.lo < -MAX_OFFSET || p.hi > MAX_OFFSET) {
                return Val::Top;
            }
            match merged.last_mut() {
                Some(last) if last.base == p.base => {
                    last.lo = last.lo.min(p.lo);
                    last.hi = last.hi.max(p.hi);
                    last.tz = last.tz.min(p.tz);
                }
                _ => merged.push(p),
            }
        }
        if merged.len() > MAX_PIECES {
            Val::Top
        } else {
            Val::Set(merged)
        }
    }

    pub fn join(&self, other: &Val) -> Val {
        match (self, other) {
            (Val::Set(a), Val::Set(b)) => {
                Val::from_pieces(a.iter().chain(b.iter()).copied().collect())
            }
            _ => Val::Top,
        }
    }

    /// The hull of the value read as a `bits`-wide number, with its known zero bits; the
    /// whole range when it is `Top` or holds an address.
    pub fn number(&self, signed: bool, bits: u32) -> (i128, i128, u32) {
        match self {
            Val::Set(pieces) if pieces.iter().all(|p| p.base == Base::Num) => {
                let mut out: Option<(i128, i128, u32)> = None;
                for p in pieces {
                    let (lo, hi) = read(p.lo, p.hi, signed, bits);
                    let tz = p.tz.min(bits);
                    out = Some(match out {
                        None => (lo, hi, tz),
                        Some((a, b, t)) => (a.min(lo), b.max(hi), t.min(tz)),
                    });
                }
                out.expect("a set is never empty")
            }
            _ => {
                let (lo, hi) = range(signed, bits);
                (lo, hi, 0)
            }
        }
    }

    /// The one interval of a plain number: bounds and known zero bits.
    pub fn plain(&self) -> Option<(i128, i128, u32)> {
        match self {
            Val::Set(p) if p.len() == 1 && p[0].base == Base::Num => {
                Some((p[0].lo, p[0].hi, p[0].tz))
            }
            _ => None,
        }
    }

    /// Whether the value is a plain number (no variable's address in it).
    pub fn is_number(&self) -> bool {
        matches!(self, Val::Set(pieces) if pieces.iter().all(|p| p.base == Base::Num))
    }

    /// The single value it can hold, if any.
    pub fn singleton(&self, signed: bool, bits: u32) -> Option<i128> {
        let (lo, hi, _) = self.number(signed, bits);
        (lo == hi && self.is_number()).then_some(lo)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings_shift_by_the_width_or_widen_to_the_whole_range() {
        assert_eq!(read(-4, -1, false, 32), ((1 << 32) - 4, (1 << 32) - 1));
        assert_eq!(read((1 << 32) - 2, (1 << 32) - 1, true, 32), (-2, -1));
        assert_eq!(read(-1, 1, false, 32), (0, (1 << 32) - 1));
        assert_eq!(read(0, 1 << 31, true, 32), (-(1 << 31), (1 << 31) - 1));
        assert_eq!(read(3, 9, true, 64), (3, 9));
    }

    #[test]
    fn results_that_may_wrap_become_the_whole_range() {
        assert_eq!(
            Val::fit(0, 1 << 31, 2, true, 32),
            Val::Set(vec![Piece::num(-(1 << 31), (1 << 31) - 1, 2)])
        );
        assert_eq!(Val::fit(5, 5, 0, false, 32), Val::constant(5));
    }

    #[test]
    fn joins_merge_per_base_and_give_up_past_the_limit() {
        let var = |v: u32, lo, hi| Piece {
            base: Base::Var(v),
            lo,
            hi,
            tz: 2,
        };
        let a = Val::Set(vec![var(0, 0, 4)]);
        let b = Val::Set(vec![var(0, 8, 12), Piece::num(100, 100, 0)]);
        let Val::Set(joined) = a.join(&b) else {
            panic!("a join of sets is a set")
        };
        assert_eq!(joined.len(), 2);
        assert!(joined.contains(&var(0, 0, 12)));
        let many: Vec<Piece> = (0..=MAX_PIECES as u32).map(|v| var(v, 0, 0)).collect();
        assert_eq!(Val::from_pieces(many), Val::Top);
        assert!(!a.is_number());
        assert_eq!(a.number(false, 32), (0, (1 << 32) - 1, 0));
    }
}
