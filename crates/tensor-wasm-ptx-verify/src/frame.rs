//! One function activation on a path of the launch-time proof (`prove.rs`): what each
//! register may hold, the facts its predicates hold, how registers were computed from
//! others (`origin.rs`), and the `.param` variables written for calls.

use std::collections::BTreeMap;

use crate::decode::{Arith, CmpOp, Kind, Opnd};
use crate::origin::{invert, Origin};
use crate::value::{Piece, Val};

/// A fact a predicate holds about registers (as they are until one of them changes).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fact {
    Cmp {
        cmp: CmpOp,
        signed: bool,
        bits: u32,
        a: Opnd,
        b: Opnd,
    },
    And(Box<Fact>, Box<Fact>),
    Or(Box<Fact>, Box<Fact>),
    Not(Box<Fact>),
}

impl Fact {
    pub fn mentions(&self, reg: u32) -> bool {
        match self {
            Fact::Cmp { a, b, .. } => *a == Opnd::Reg(reg) || *b == Opnd::Reg(reg),
            Fact::And(x, y) | Fact::Or(x, y) => x.mentions(reg) || y.mentions(reg),
            Fact::Not(x) => x.mentions(reg),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub func: usize,
    pub pc: usize,
    pub regs: Vec<Val>,
    pub facts: Vec<Option<Fact>>,
    pub origins: Vec<Option<Origin>>,
    /// Registers written by `or` of two registers (whose sign is negative when either's is).
    pub ors: Vec<Option<(u32, u32)>>,
    /// `.param` variables written in this frame (call arguments, the return value), by
    /// name and byte offset: the store's width and value.
    pub params: BTreeMap<(String, i64), (u32, Val)>,
}

fn join_option<T: PartialEq>(a: &mut [Option<T>], b: &[Option<T>]) {
    for (a, b) in a.iter_mut().zip(b) {
        if a != b {
            *a = None;
        }
    }
}

impl Frame {
    pub fn new(func: usize, registers: usize) -> Frame {
        Frame {
            func,
            pc: 0,
            regs: vec![Val::Top; registers],
            facts: vec![None; registers],
            origins: vec![None; registers],
            ors: vec![None; registers],
            params: BTreeMap::new(),
        }
    }

    /// Merges another path's frame at the same point: every value either may hold.
    pub fn join(&mut self, other: &Frame) {
        for (a, b) in self.regs.iter_mut().zip(&other.regs) {
            if *a != *b {
                *a = a.join(b);
            }
        }
        join_option(&mut self.facts, &other.facts);
        join_option(&mut self.origins, &other.origins);
        join_option(&mut self.ors, &other.ors);
        let mut params = BTreeMap::new();
        for (key, (bits, a)) in &self.params {
            if let Some((_, b)) = other.params.get(key).filter(|(w, _)| w == bits) {
                params.insert(key.clone(), (*bits, a.join(b)));
            }
        }
        self.params = params;
    }

    /// Writes `reg`: what was known of it and of values computed from it is dropped.
    pub fn write(&mut self, reg: u32, val: Val) {
        let r = reg as usize;
        self.regs[r] = val;
        self.facts[r] = None;
        self.origins[r] = None;
        self.ors[r] = None;
        for fact in self.facts.iter_mut() {
            if fact.as_ref().is_some_and(|f| f.mentions(reg)) {
                *fact = None;
            }
        }
        for origin in self.origins.iter_mut() {
            if origin.as_ref().is_some_and(|o| o.mentions(reg)) {
                *origin = None;
            }
        }
        for or in self.ors.iter_mut() {
            if or.is_some_and(|(a, b)| a == reg || b == reg) {
                *or = None;
            }
        }
    }

    /// How an operand (of value `v`) was computed: its register's origin when it has one
    /// root, else the register itself as a root; constants and addresses are offsets.
    fn origin_of(&self, opnd: Opnd, v: Val) -> Option<Origin> {
        if let Opnd::Reg(r) = opnd {
            // A register summing several roots is a root itself: a check of it (or of a
            // value computed from it) can then narrow it, and through it what it sums.
            if let Some(o) = self.origins[r as usize]
                .as_ref()
                .filter(|o| o.terms.len() == 1)
            {
                return Some(o.clone());
            }
            if v.plain().is_some_and(|(lo, hi, _)| lo < hi) {
                return Some(Origin::root(r));
            }
        }
        match v {
            Val::Top => None,
            v => Some(Origin::constant(v)),
        }
    }

    /// The origin of an instruction's result (`value` gives its operands' values).
    pub fn derive(&self, kind: &Kind, value: impl Fn(Opnd) -> Val) -> Option<Origin> {
        let of = |o: Opnd| self.origin_of(o, value(o));
        let constant = |o: Opnd| match value(o).plain() {
            Some((lo, hi, _)) if lo == hi => Some(lo),
            _ => None,
        };
        let product = |a: Opnd, b: Opnd| match (constant(a), constant(b)) {
            (_, Some(k)) => of(a)?.scaled(k),
            (Some(k), _) => of(b)?.scaled(k),
            _ => None,
        };
        match kind {
            Kind::Mov { src, .. } | Kind::Cvt { src, .. } => of(*src),
            Kind::Arith { op, a, b, c, .. } => match op {
                Arith::MulLo | Arith::MulWide => product(*a, *b),
                Arith::Shl => {
                    let k = constant(*b).filter(|k| (0..64).contains(k))?;
                    of(*a)?.scaled(1 << k)
                }
                Arith::Add => of(*a)?.plus(&of(*b)?),
                Arith::Sub => of(*a)?.plus(&of(*b)?.scaled(-1)?),
                Arith::MadLo | Arith::MadWide => product(*a, *b)?.plus(&of(*c)?),
                _ => None,
            },
            _ => None,
        }
    }

    /// Writes an instruction's result with its origin, kept only when it reproduces the
    /// result exactly (so no step wrapped) and does not name the register it writes.
    pub fn write_derived(&mut self, dst: u32, val: Val, origin: Option<Origin>) {
        let origin = origin.filter(|o| {
            !o.terms.is_empty() && !o.mentions(dst) && o.eval(&self.regs).as_ref() == Some(&val)
        });
        self.write(dst, val);
        self.origins[dst as usize] = origin;
    }

    /// Narrows register `r` (read `signed` at `bits`) to `lo..=hi`, keeping its known zero
    /// bits; the registers computed from it narrow with it, and so does its own root when
    /// it is `k × root + c`. False when no value is left.
    pub fn narrow_to(&mut self, r: u32, signed: bool, bits: u32, lo: i128, hi: i128) -> bool {
        let old = self.regs[r as usize].clone();
        let (o0, o1, tz) = old.number(signed, bits);
        let (lo, hi) = (lo.max(o0), hi.min(o1));
        // Known zero bits survive narrowing; the bounds move to the nearest such values.
        let step = 1i128 << tz.min(64);
        let lo = lo.div_euclid(step) * step + if lo.rem_euclid(step) == 0 { 0 } else { step };
        let hi = hi.div_euclid(step) * step;
        if lo > hi {
            return false;
        }
        if (lo, hi) == (o0, o1) {
            return true;
        }
        // The reading is the stored interval itself: relations stay true.
        let kept = matches!(&old, Val::Set(p) if p.len() == 1 && p[0].lo == o0 && p[0].hi == o1);
        let narrowed = Val::Set(vec![Piece::num(lo, hi, tz)]);
        if !kept {
            self.write(r, narrowed);
            return true;
        }
        self.set(r, narrowed);
        if let Some((root, k, c)) = self.origins[r as usize].as_ref().and_then(Origin::single) {
            let (a, b) = invert(k, c, lo, hi);
            if let Some((r0, r1, tz)) = self.regs[root as usize].plain() {
                if a > r0 || b < r1 {
                    if a.max(r0) > b.min(r1) {
                        return false;
                    }
                    self.set(root, Val::Set(vec![Piece::num(a.max(r0), b.min(r1), tz)]));
                }
            }
        }
        true
    }

    /// Replaces `r`'s value by a narrower one and recomputes the registers computed from it
    /// that were not narrowed on their own since, and theirs in turn.
    fn set(&mut self, r: u32, narrowed: Val) {
        let dependents: Vec<usize> = (0..self.regs.len())
            .filter(|&d| {
                self.origins[d].as_ref().is_some_and(|o| o.mentions(r))
                    && self.origins[d]
                        .as_ref()
                        .and_then(|o| o.eval(&self.regs))
                        .as_ref()
                        == Some(&self.regs[d])
            })
            .collect();
        self.regs[r as usize] = narrowed;
        for d in dependents {
            if let Some(now) = self.origins[d].as_ref().and_then(|o| o.eval(&self.regs)) {
                if now != self.regs[d] {
                    // Origins never name their own register, and a root is computed before
                    // what it sums, so this ends.
                    self.set(d as u32, now);
                }
            }
        }
    }
}
