//! The launch-time proof behind [`crate::Plan::admit`]: an abstract execution of the
//! tenant's own (lean) entry for one launch — its parameters, grid, block, dynamic shared
//! memory and window all known — in which each register holds the set of values it may
//! have in *any* thread (`value.rs`): `%tid` ranges over the block, `%ctaid` over the
//! grid, loaded values are unknown.
//!
//! Paths fork at branches the values cannot decide and meet again where branches meet
//! (their values joined). Loops are *unrolled*, never summarised: a state that takes a
//! backward branch starts a new round (`epoch`), and a state is processed only after every
//! state that could reach the same point in the same round, so meeting paths always join.
//! A loop whose exit depends only on uniform values (the usual counted loop) unrolls exactly;
//! one that the values cannot bound unrolls until the step budget runs out, and the launch
//! is not proven.
//!
//! Proven means: every load, store and atomic lies inside the window (global and generic
//! addresses) or inside its variable (shared and local), aligned to its size, in every
//! thread, and every thread ends within the budget's instructions — so the entry needs
//! neither fences nor cancellation polls. Anything the proof cannot read makes the launch
//! unproven, and the fenced entry runs instead.

use std::collections::BTreeMap;

use crate::frame::{Fact, Frame};

use crate::decode::{Arith, CmpOp, Func, Insn, Kind, Logic, Opnd, PredRef, Special, Var};
use crate::text::Space;
use crate::value::{zeros, Base, Piece, Val};

/// Most instructions the proof executes (over all paths) for one launch.
pub const PROOF_STEPS: u64 = 1 << 16;

/// Most nested calls the proof follows.
const MAX_DEPTH: usize = 16;

/// What one launch is: its packed parameters (the tenant's, without the hidden ones), grid,
/// block, dynamic shared bytes, and the window `lo..hi` its global accesses must stay in.
#[derive(Debug, Clone, Copy)]
pub struct LaunchFacts<'a> {
    pub params: &'a [Vec<u8>],
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub dynamic_shared: u32,
    pub window: (u64, u64),
}

/// A proof's outcome for a proven launch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Proof {
    /// Instructions the proof executed.
    pub steps: u64,
    /// Most backward branches one path took (loop iterations of the longest path).
    pub rounds: u32,
    /// Most instructions one thread can execute.
    pub longest: u64,
}

type State = Vec<Frame>;

pub(crate) struct Prover<'a> {
    pub funcs: &'a [Func],
    pub vars: &'a [Var],
    pub entry: usize,
    pub facts: LaunchFacts<'a>,
}

/// Why a launch is not proven: the PTX line and the reason.
pub(crate) type Unproven = (u32, String);

impl Prover<'_> {
    pub fn run(&self) -> Result<Proof, Unproven> {
        let start = vec![self.frame(self.entry)];
        // Each pending state with the most instructions a path to it has run.
        let mut queue: BTreeMap<(u32, Vec<usize>), (State, u64)> = BTreeMap::new();
        queue.insert((0, vec![0]), (start, 0));
        let mut steps = 0u64;
        let mut rounds = 0u32;
        let mut longest = 0u64;
        while let Some(((epoch, _), (state, length))) = queue.pop_first() {
            rounds = rounds.max(epoch);
            let before = steps;
            let next_states = self.block(state, epoch, &mut steps)?;
            // A block runs one straight stretch: every state it ends in ran all of it.
            let length = length + (steps - before);
            longest = longest.max(length);
            for (epoch, next) in next_states {
                let key = (epoch, next.iter().map(|fr| fr.pc).collect::<Vec<_>>());
                match queue.get_mut(&key) {
                    Some((existing, at_most)) => {
                        for (a, b) in existing.iter_mut().zip(&next) {
                            a.join(b);
                        }
                        *at_most = (*at_most).max(length);
                    }
                    None => {
                        queue.insert(key, (next, length));
                    }
                }
            }
        }
        Ok(Proof {
            steps,
            rounds,
            longest,
        })
    }

    fn frame(&self, func: usize) -> Frame {
        Frame::new(func, self.funcs[func].widths.len())
    }

    /// Runs `state` until it branches, calls, returns, ends, or reaches a point where paths
    /// meet; returns the states to continue with, each with its round.
    fn block(
        &self,
        mut state: State,
        epoch: u32,
        steps: &mut u64,
    ) -> Result<Vec<(u32, State)>, Unproven> {
        let mut first = true;
        loop {
            let top = state.last_mut().expect("a state has a frame");
            let f = &self.funcs[top.func];
            if !first && f.target[top.pc] {
                return Ok(vec![(epoch, state)]);
            }
            first = false;
            let Some(insn) = f.insns.get(top.pc) else {
                // Falling off the end returns.
                return self.ret(state, epoch);
            };
            *steps += 1;
            if *steps > PROOF_STEPS {
                return Err((
                    insn.line,
                    format!("the proof stopped after {PROOF_STEPS} instructions (a loop it cannot bound)"),
                ));
            }
            // The guard: decided, or a fork.
            let (taken, skipped) = match insn.guard {
                None => (Some(state), None),
                Some(guard) => self.split(state, guard),
            };
            match &insn.kind {
                Kind::Bra { target } => {
                    let target = *target;
                    let mut out = Vec::new();
                    if let Some(mut s) = taken {
                        let top = s.last_mut().expect("a frame");
                        let back = target <= top.pc;
                        top.pc = target;
                        out.push((epoch + u32::from(back), s));
                    }
                    if let Some(mut s) = skipped {
                        s.last_mut().expect("a frame").pc += 1;
                        out.push((epoch, s));
                    }
                    return Ok(out);
                }
                Kind::Ret | Kind::Exit => {
                    let mut out = Vec::new();
                    if let Some(s) = taken {
                        if matches!(insn.kind, Kind::Ret) {
                            out.extend(self.ret(s, epoch)?);
                        }
                    }
                    if let Some(mut s) = skipped {
                        s.last_mut().expect("a frame").pc += 1;
                        out.push((epoch, s));
                    }
                    return Ok(out);
                }
                Kind::Call { func, args, .. } => {
                    if skipped.is_some() {
                        return Err((insn.line, "a call under a guard".into()));
                    }
                    let mut s = taken.expect("an unguarded call runs");
                    if s.len() >= MAX_DEPTH {
                        return Err((insn.line, "calls nested too deep".into()));
                    }
                    let caller = s.last().expect("a frame");
                    let mut callee = self.frame(*func);
                    let names = &self.funcs[*func].params;
                    if names.len() != args.len() {
                        return Err((insn.line, "a call's arguments do not match".into()));
                    }
                    for (arg, param) in args.iter().zip(names) {
                        for ((name, offset), v) in &caller.params {
                            if name == arg {
                                callee.params.insert((param.clone(), *offset), v.clone());
                            }
                        }
                    }
                    s.push(callee);
                    return Ok(vec![(epoch, s)]);
                }
                _ => {}
            }
            state = match (taken, skipped) {
                (Some(mut s), None) => {
                    self.step(&mut s, insn)?;
                    s
                }
                (None, Some(s)) => s,
                (Some(mut s), Some(other)) => {
                    self.step(&mut s, insn)?;
                    for (a, b) in s.iter_mut().zip(&other) {
                        a.join(b);
                    }
                    s
                }
                (None, None) => return Ok(Vec::new()),
            };
            state.last_mut().expect("a frame").pc += 1;
        }
    }

    /// Returns from the top frame: the path ends in the entry, else the caller continues
    /// after its call with the return value in its frame.
    fn ret(&self, mut state: State, epoch: u32) -> Result<Vec<(u32, State)>, Unproven> {
        let done = state.pop().expect("a frame");
        let Some(caller) = state.last_mut() else {
            return Ok(Vec::new());
        };
        let Some(Insn {
            kind: Kind::Call { args, ret, .. },
            ..
        }) = self.funcs[caller.func].insns.get(caller.pc)
        else {
            return Err((0, "a return without its call".into()));
        };
        // The call's argument variables and old return value are gone (a later call declares
        // its own); the return value is what the callee wrote to its return variable.
        caller
            .params
            .retain(|(name, _), _| !args.contains(name) && Some(name) != ret.as_ref());
        if let Some(ret) = ret {
            let returns = &self.funcs[done.func].returns;
            for ((name, offset), v) in done.params {
                if returns.contains(&name) {
                    caller.params.insert((ret.clone(), offset), v);
                }
            }
        }
        caller.pc += 1;
        Ok(vec![(epoch, state)])
    }

    /// The states in which a guard holds and in which it does not (`None`: impossible).
    fn split(&self, state: State, (pred, negated): PredRef) -> (Option<State>, Option<State>) {
        let top = state.last().expect("a frame");
        let Some(fact) = top.facts[pred as usize].clone() else {
            return (Some(state.clone()), Some(state));
        };
        let mut holds = state.clone();
        let mut fails = state;
        let holds_ok = self.refine(holds.last_mut().expect("a frame"), &fact, !negated);
        let fails_ok = self.refine(fails.last_mut().expect("a frame"), &fact, negated);
        (holds_ok.then_some(holds), fails_ok.then_some(fails))
    }

    fn value(&self, frame: &Frame, opnd: Opnd) -> Val {
        let (grid, block) = (self.facts.grid, self.facts.block);
        let dim = |t: [u32; 3], d: usize| i128::from(t[d]);
        match opnd {
            Opnd::Reg(r) => frame.regs[r as usize].clone(),
            Opnd::Imm(v) => Val::constant(v),
            Opnd::Special(s) => match s {
                Special::Tid(d) => Val::interval(0, dim(block, d) - 1),
                Special::Ntid(d) => Val::constant(dim(block, d)),
                Special::Ctaid(d) => Val::interval(0, dim(grid, d) - 1),
                Special::Nctaid(d) => Val::constant(dim(grid, d)),
                Special::Lane => Val::interval(0, 31),
                Special::WarpSize => Val::constant(32),
            },
            Opnd::Var(v) => Val::Set(vec![Piece {
                base: Base::Var(v),
                lo: 0,
                hi: 0,
                tz: 64,
            }]),
            Opnd::Unknown => Val::Top,
        }
    }

    /// Executes one instruction that neither branches, calls nor returns.
    fn step(&self, state: &mut State, insn: &Insn) -> Result<(), Unproven> {
        let is_entry = state.len() == 1;
        let frame = state.last_mut().expect("a frame");
        match &insn.kind {
            Kind::Mov { dst, src } => {
                let v = self.value(frame, *src);
                let origin = frame.derive(&insn.kind, |o| self.value(frame, o));
                frame.write_derived(*dst, v, origin);
            }
            Kind::Arith {
                op,
                signed,
                bits,
                dst,
                a,
                b,
                c,
            } => {
                let (insn_a, insn_b) = (*a, *b);
                let (a, b, c) = (
                    self.value(frame, *a),
                    self.value(frame, *b),
                    self.value(frame, *c),
                );
                let v = crate::arith::apply(*op, *signed, *bits, &a, &b, &c);
                let origin = frame.derive(&insn.kind, |o| self.value(frame, o));
                frame.write_derived(*dst, v, origin);
                if let (Arith::Or, Opnd::Reg(x), Opnd::Reg(y)) = (op, insn_a, insn_b) {
                    frame.ors[*dst as usize] = Some((x, y));
                }
            }
            Kind::Cvt { dst, to, from, src } => {
                let v = self.value(frame, *src);
                let out = crate::arith::convert(&v, *from, *to);
                let origin = frame.derive(&insn.kind, |o| self.value(frame, o));
                frame.write_derived(*dst, out, origin);
            }
            Kind::Cvta {
                dst,
                to,
                space,
                src,
            } => {
                let v = self.value(frame, *src);
                let out = match (space, v) {
                    (Space::Global, v) if v.is_number() => v,
                    (Space::Shared, Val::Set(pieces)) => {
                        let converted: Option<Vec<Piece>> = pieces
                            .iter()
                            .map(|p| {
                                let base = match (p.base, to) {
                                    (Base::Var(v), false) => Base::Generic(v),
                                    (Base::Generic(v), true) => Base::Var(v),
                                    _ => return None,
                                };
                                Some(Piece { base, ..*p })
                            })
                            .collect();
                        converted.map_or(Val::Top, Val::from_pieces)
                    }
                    _ => Val::Top,
                };
                frame.write(*dst, out);
            }
            Kind::Selp { dst, a, b, pred } => {
                let (a, b) = (self.value(frame, *a), self.value(frame, *b));
                let out = match self.decide(frame, *pred) {
                    Some(true) => a,
                    Some(false) => b,
                    None => a.join(&b),
                };
                frame.write(*dst, out);
            }
            Kind::Setp {
                dst,
                negated_dst,
                cmp,
                signed,
                bits,
                a,
                b,
                combine,
            } => {
                let mut fact = Fact::Cmp {
                    cmp: *cmp,
                    signed: *signed,
                    bits: *bits,
                    a: *a,
                    b: *b,
                };
                // `(x | y) < 0` (signed) holds when either is negative: say so of x and y.
                if let (Opnd::Reg(r), Opnd::Imm(0), true, CmpOp::Lt | CmpOp::Ge) =
                    (*a, *b, *signed, *cmp)
                {
                    let widths = &self.funcs[frame.func].widths;
                    if let Some((x, y)) = frame.ors[r as usize].filter(|&(x, y)| {
                        widths[x as usize] == *bits && widths[y as usize] == *bits
                    }) {
                        let sign = |reg: u32| {
                            Box::new(Fact::Cmp {
                                cmp: *cmp,
                                signed: true,
                                bits: *bits,
                                a: Opnd::Reg(reg),
                                b: Opnd::Imm(0),
                            })
                        };
                        fact = if *cmp == CmpOp::Lt {
                            Fact::Or(sign(x), sign(y))
                        } else {
                            Fact::And(sign(x), sign(y))
                        };
                    }
                }
                let mut known = true;
                if let Some((op, p)) = combine {
                    match self.fact_of(frame, *p) {
                        Some(other) => {
                            fact = match op {
                                Logic::And => Fact::And(Box::new(fact), Box::new(other)),
                                Logic::Or => Fact::Or(Box::new(fact), Box::new(other)),
                                _ => {
                                    known = false;
                                    fact
                                }
                            }
                        }
                        None => known = false,
                    }
                }
                // A fact naming its own destination would be stale at once.
                let fact = (known && !fact.mentions(*dst)).then_some(fact);
                frame.write(*dst, Val::Top);
                frame.facts[*dst as usize] = fact.clone();
                if let Some(q) = negated_dst {
                    frame.write(*q, Val::Top);
                    frame.facts[*q as usize] = fact
                        .filter(|f| !f.mentions(*q))
                        .map(|f| Fact::Not(Box::new(f)));
                }
            }
            Kind::Logic { op, dst, a, b } => {
                let x = self.fact_of(frame, *a);
                let y = b.and_then(|b| self.fact_of(frame, b));
                let fact = match (op, x, y) {
                    (Logic::Mov, Some(x), _) => Some(x),
                    (Logic::Not, Some(x), _) => Some(Fact::Not(Box::new(x))),
                    (Logic::And, Some(x), Some(y)) => Some(Fact::And(Box::new(x), Box::new(y))),
                    (Logic::Or, Some(x), Some(y)) => Some(Fact::Or(Box::new(x), Box::new(y))),
                    _ => None,
                };
                frame.write(*dst, Val::Top);
                frame.facts[*dst as usize] = fact.filter(|f| !f.mentions(*dst));
            }
            Kind::LdParam {
                dst,
                name,
                offset,
                signed,
                bits,
            } => {
                let f = &self.funcs[frame.func];
                let written = frame
                    .params
                    .get(&(name.clone(), *offset))
                    .filter(|(width, _)| width == bits)
                    .map(|(_, v)| v.clone());
                let v = match written {
                    Some(v) => v,
                    None if is_entry => f
                        .params
                        .iter()
                        .position(|p| p == name)
                        .and_then(|i| self.param(i, *offset, *signed, *bits))
                        .unwrap_or(Val::Top),
                    None => Val::Top,
                };
                frame.write(*dst, v);
            }
            Kind::StParam {
                name,
                offset,
                bits,
                src,
            } => {
                let v = self.value(frame, *src);
                frame.params.insert((name.clone(), *offset), (*bits, v));
            }
            Kind::Access {
                space,
                bytes,
                base,
                offset,
                dsts,
            } => {
                let addr = crate::arith::apply(
                    Arith::Add,
                    true,
                    64,
                    &self.value(frame, *base),
                    &Val::constant(i128::from(*offset)),
                    &Val::Top,
                );
                self.check(*space, *bytes, &addr)
                    .map_err(|why| (insn.line, why))?;
                for d in dsts {
                    frame.write(*d, Val::Top);
                }
            }
            Kind::Clobber(regs) => {
                for r in regs {
                    frame.write(*r, Val::Top);
                }
            }
            Kind::Nop => {}
            Kind::Unreadable => {
                return Err((insn.line, "an instruction the proof cannot read".into()))
            }
            Kind::Bra { .. } | Kind::Call { .. } | Kind::Ret | Kind::Exit => {
                unreachable!("control transfers are handled by `block`")
            }
        }
        Ok(())
    }

    /// Entry parameter `index` read at `offset` as a `bits`-wide integer.
    fn param(&self, index: usize, offset: i64, signed: bool, bits: u32) -> Option<Val> {
        let bytes = self.facts.params.get(index)?;
        let at = usize::try_from(offset).ok()?;
        let raw = bytes.get(at..at + bits as usize / 8)?;
        let mut word = [0u8; 16];
        word[..raw.len()].copy_from_slice(raw);
        let unsigned = u128::from_le_bytes(word) as i128;
        let value = if signed && unsigned >= 1i128 << (bits - 1) {
            unsigned - (1i128 << bits)
        } else {
            unsigned
        };
        Some(Val::constant(value))
    }

    fn fact_of(&self, frame: &Frame, (pred, negated): PredRef) -> Option<Fact> {
        let fact = frame.facts[pred as usize].clone()?;
        Some(if negated {
            Fact::Not(Box::new(fact))
        } else {
            fact
        })
    }

    fn decide(&self, frame: &Frame, pred: PredRef) -> Option<bool> {
        let fact = self.fact_of(frame, pred)?;
        self.eval(frame, &fact)
    }

    fn eval(&self, frame: &Frame, fact: &Fact) -> Option<bool> {
        match fact {
            Fact::Cmp {
                cmp,
                signed,
                bits,
                a,
                b,
            } => {
                let (x, y) = (self.value(frame, *a), self.value(frame, *b));
                if !readable(&x) || !readable(&y) {
                    return None;
                }
                let (a0, a1, _) = x.number(*signed, *bits);
                let (b0, b1, _) = y.number(*signed, *bits);
                match cmp {
                    CmpOp::Lt if a1 < b0 => Some(true),
                    CmpOp::Lt if a0 >= b1 => Some(false),
                    CmpOp::Le if a1 <= b0 => Some(true),
                    CmpOp::Le if a0 > b1 => Some(false),
                    CmpOp::Gt if a0 > b1 => Some(true),
                    CmpOp::Gt if a1 <= b0 => Some(false),
                    CmpOp::Ge if a0 >= b1 => Some(true),
                    CmpOp::Ge if a1 < b0 => Some(false),
                    CmpOp::Eq | CmpOp::Ne if a1 < b0 || b1 < a0 => Some(*cmp == CmpOp::Ne),
                    CmpOp::Eq | CmpOp::Ne if a0 == a1 && b0 == b1 && a0 == b0 => {
                        Some(*cmp == CmpOp::Eq)
                    }
                    _ => None,
                }
            }
            Fact::And(x, y) => match (self.eval(frame, x), self.eval(frame, y)) {
                (Some(false), _) | (_, Some(false)) => Some(false),
                (Some(true), Some(true)) => Some(true),
                _ => None,
            },
            Fact::Or(x, y) => match (self.eval(frame, x), self.eval(frame, y)) {
                (Some(true), _) | (_, Some(true)) => Some(true),
                (Some(false), Some(false)) => Some(false),
                _ => None,
            },
            Fact::Not(x) => self.eval(frame, x).map(|v| !v),
        }
    }

    /// Narrows `frame` to the threads where `fact` is `truth`; false when there are none.
    fn refine(&self, frame: &mut Frame, fact: &Fact, truth: bool) -> bool {
        if let Some(known) = self.eval(frame, fact) {
            return known == truth;
        }
        match (fact, truth) {
            (Fact::Not(x), _) => self.refine(frame, x, !truth),
            (Fact::And(x, y), true) | (Fact::Or(x, y), false) => {
                self.refine(frame, x, truth) && self.refine(frame, y, truth)
            }
            (Fact::And(..) | Fact::Or(..), _) => true,
            (
                Fact::Cmp {
                    cmp,
                    signed,
                    bits,
                    a,
                    b,
                },
                _,
            ) => {
                let cmp = if truth { *cmp } else { negate(*cmp) };
                self.narrow(frame, cmp, *signed, *bits, *a, *b)
                    && self.narrow(frame, swap(cmp), *signed, *bits, *b, *a)
            }
        }
    }

    /// Narrows register `a` to the values `a cmp b` allows.
    fn narrow(
        &self,
        frame: &mut Frame,
        cmp: CmpOp,
        signed: bool,
        bits: u32,
        a: Opnd,
        b: Opnd,
    ) -> bool {
        let Opnd::Reg(r) = a else {
            return true;
        };
        let f = &self.funcs[frame.func];
        let (x, y) = (self.value(frame, a), self.value(frame, b));
        if f.widths[r as usize] != bits || !readable(&x) || !readable(&y) {
            return true;
        }
        let (mut lo, mut hi, _) = x.number(signed, bits);
        let (b0, b1, _) = y.number(signed, bits);
        match cmp {
            CmpOp::Lt => hi = hi.min(b1 - 1),
            CmpOp::Le => hi = hi.min(b1),
            CmpOp::Gt => lo = lo.max(b0 + 1),
            CmpOp::Ge => lo = lo.max(b0),
            CmpOp::Eq => (lo, hi) = (lo.max(b0), hi.min(b1)),
            CmpOp::Ne if b0 == b1 && lo == b0 => lo += 1,
            CmpOp::Ne if b0 == b1 && hi == b0 => hi -= 1,
            CmpOp::Ne => {}
        }
        frame.narrow_to(r, signed, bits, lo, hi)
    }

    /// Checks one access of `bytes` at `addr` in `space`.
    fn check(&self, space: Space, bytes: u64, addr: &Val) -> Result<(), String> {
        let Val::Set(pieces) = addr else {
            return Err(format!(
                "a {} access at an address the proof cannot bound",
                name(space)
            ));
        };
        let align = zeros(i128::from(bytes));
        for p in pieces {
            if p.tz < align {
                return Err(format!(
                    "a {bytes}-byte {} access the proof cannot show aligned",
                    name(space)
                ));
            }
            let (lo, hi) = match (space, p.base) {
                (Space::Global | Space::Generic, Base::Num) => {
                    let (lo, hi) = self.facts.window;
                    (i128::from(lo), i128::from(hi))
                }
                (Space::Shared, Base::Var(v))
                | (Space::Local, Base::Var(v))
                | (Space::Generic, Base::Generic(v)) => {
                    let var = &self.vars[v as usize];
                    let kind = if space == Space::Generic {
                        Space::Shared
                    } else {
                        space
                    };
                    if var.space != kind || var.align < bytes {
                        return Err(format!(
                            "a {} access through a variable of another space or alignment",
                            name(space)
                        ));
                    }
                    let size = if var.dynamic {
                        u64::from(self.facts.dynamic_shared)
                    } else {
                        var.size
                    };
                    (0, i128::from(size))
                }
                _ => {
                    return Err(format!(
                        "a {} access at an address of another space",
                        name(space)
                    ))
                }
            };
            if p.lo < lo || p.hi + i128::from(bytes) > hi {
                let (what, from) = match p.base {
                    Base::Num => ("the window", lo),
                    _ => ("its variable", 0),
                };
                return Err(format!(
                    "a {bytes}-byte {} access may fall outside its memory: at {}..={} \
                     bytes from the start of {what}, which has {}",
                    name(space),
                    p.lo - from,
                    p.hi - from,
                    hi - lo
                ));
            }
        }
        Ok(())
    }
}

/// Whether a value can be compared as a number (`Top` reads as the whole range).
fn readable(v: &Val) -> bool {
    matches!(v, Val::Top) || v.is_number()
}

fn name(space: Space) -> &'static str {
    match space {
        Space::Global => "global",
        Space::Shared => "shared",
        Space::Local => "local",
        Space::Param => "parameter",
        Space::Generic => "generic",
    }
}

fn negate(cmp: CmpOp) -> CmpOp {
    match cmp {
        CmpOp::Eq => CmpOp::Ne,
        CmpOp::Ne => CmpOp::Eq,
        CmpOp::Lt => CmpOp::Ge,
        CmpOp::Le => CmpOp::Gt,
        CmpOp::Gt => CmpOp::Le,
        CmpOp::Ge => CmpOp::Lt,
    }
}

/// `b ? a` for `a cmp b`.
fn swap(cmp: CmpOp) -> CmpOp {
    match cmp {
        CmpOp::Eq => CmpOp::Eq,
        CmpOp::Ne => CmpOp::Ne,
        CmpOp::Lt => CmpOp::Gt,
        CmpOp::Le => CmpOp::Ge,
        CmpOp::Gt => CmpOp::Lt,
        CmpOp::Ge => CmpOp::Le,
    }
}
