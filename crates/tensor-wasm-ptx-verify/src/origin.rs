//! How a register was computed from others, for the launch-time proof (`prove.rs`): a sum
//! of at most [`MAX_TERMS`] registers (its *roots*), each times a constant, plus an offset
//! value — exactly, with no step wrapping, for as long as no root is written again. When a
//! branch narrows a root, every register computed from it narrows too: a thread index
//! checked after an address was derived from it still bounds the address, and a check of
//! `x − 1 ≥ 0` narrows `x` itself.

use crate::value::{zeros, Base, Piece, Val};

/// Most roots one origin sums.
pub(crate) const MAX_TERMS: usize = 3;

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Origin {
    /// Root register and its factor (never zero).
    pub terms: Vec<(u32, i128)>,
    pub offset: Val,
}

/// `k × v` for a plain number `v` (any value when `k` is 1).
fn scale(v: &Val, k: i128) -> Option<Val> {
    if k == 1 {
        return Some(v.clone());
    }
    let Val::Set(pieces) = v else {
        return None;
    };
    let mut out = Vec::new();
    for p in pieces {
        if p.base != Base::Num {
            return None;
        }
        let (a, b) = (p.lo.checked_mul(k)?, p.hi.checked_mul(k)?);
        out.push(Piece::num(a.min(b), a.max(b), (p.tz + zeros(k)).min(64)));
    }
    Some(Val::from_pieces(out))
}

/// `a + b` without wrapping; at most one side may hold addresses.
fn add(a: &Val, b: &Val) -> Option<Val> {
    let (Val::Set(xs), Val::Set(ys)) = (a, b) else {
        return None;
    };
    let mut out = Vec::new();
    for x in xs {
        for y in ys {
            let base = match (x.base, y.base) {
                (Base::Num, base) | (base, Base::Num) => base,
                _ => return None,
            };
            out.push(Piece {
                base,
                lo: x.lo.checked_add(y.lo)?,
                hi: x.hi.checked_add(y.hi)?,
                tz: x.tz.min(y.tz),
            });
        }
    }
    Some(Val::from_pieces(out))
}

impl Origin {
    pub fn constant(offset: Val) -> Origin {
        Origin {
            terms: Vec::new(),
            offset,
        }
    }

    pub fn root(reg: u32) -> Origin {
        Origin {
            terms: vec![(reg, 1)],
            offset: Val::constant(0),
        }
    }

    pub fn mentions(&self, reg: u32) -> bool {
        self.terms.iter().any(|&(r, _)| r == reg)
    }

    pub fn scaled(&self, k: i128) -> Option<Origin> {
        if k == 0 {
            return Some(Origin::constant(Val::constant(0)));
        }
        let terms = self
            .terms
            .iter()
            .map(|&(r, s)| Some((r, s.checked_mul(k)?)))
            .collect::<Option<_>>()?;
        Some(Origin {
            terms,
            offset: scale(&self.offset, k)?,
        })
    }

    pub fn plus(&self, other: &Origin) -> Option<Origin> {
        let mut terms = self.terms.clone();
        for &(r, s) in &other.terms {
            match terms.iter_mut().find(|(t, _)| *t == r) {
                Some((_, k)) => *k = k.checked_add(s)?,
                None => terms.push((r, s)),
            }
        }
        terms.retain(|&(_, k)| k != 0);
        if terms.len() > MAX_TERMS {
            return None;
        }
        Some(Origin {
            terms,
            offset: add(&self.offset, &other.offset)?,
        })
    }

    /// The values the origin gives over the registers' values `regs`.
    pub fn eval(&self, regs: &[Val]) -> Option<Val> {
        let mut acc = self.offset.clone();
        for &(r, k) in &self.terms {
            acc = add(&acc, &scale(&regs[r as usize], k)?)?;
        }
        Some(acc)
    }

    /// `k × root + c` with one root and a constant `c`: (root, k, c).
    pub fn single(&self) -> Option<(u32, i128, i128)> {
        match self.terms[..] {
            [(root, k)] => match self.offset.plain()? {
                (c, d, _) if c == d => Some((root, k, c)),
                _ => None,
            },
            _ => None,
        }
    }
}

/// The range of `root` for which `k × root + c` lies in `lo..=hi` (`k` non-zero).
pub(crate) fn invert(k: i128, c: i128, lo: i128, hi: i128) -> (i128, i128) {
    let (a, b) = (lo - c, hi - c);
    let ceil = |n: i128, d: i128| -(-n).div_euclid(d);
    if k > 0 {
        (ceil(a, k), b.div_euclid(k))
    } else {
        (ceil(-b, -k), (-a).div_euclid(-k))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_add_scale_and_evaluate() {
        let regs = vec![Val::interval(0, 9), Val::interval(1, 3)];
        let x = Origin::root(0).scaled(4).unwrap();
        let y = Origin::root(1)
            .plus(&Origin::constant(Val::constant(-1)))
            .unwrap();
        let sum = x.plus(&y).unwrap();
        assert_eq!(sum.eval(&regs), Some(Val::interval(0, 38)));
        let cancelled = sum.plus(&x.scaled(-1).unwrap()).unwrap();
        assert_eq!(cancelled.terms, vec![(1, 1)]);
        assert_eq!(cancelled.single(), Some((1, 1, -1)));
    }

    #[test]
    fn inverting_a_scaled_root_rounds_inwards() {
        // 4r + 2 in 3..=17: r in 1..=3.
        assert_eq!(invert(4, 2, 3, 17), (1, 3));
        // -2r in -7..=0: r in 0..=3.
        assert_eq!(invert(-2, 0, -7, 0), (0, 3));
        // r − 1 ≥ 0: r ≥ 1.
        assert_eq!(invert(1, -1, 0, 100), (1, 101));
    }
}
