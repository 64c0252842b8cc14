//! Control flow and uniformity: which statements only some threads of a block may reach.
//!
//! A value is *divergent* when threads may hold different ones: it comes from `%tid`,
//! `%laneid` or another per-thread register, from memory (a load, an atomic, a shuffle),
//! from a `.func`'s parameters, or from anything computed from such a value, or it is
//! written under a divergent guard or inside a divergent region. A branch (or `ret`/`exit`)
//! on a divergent predicate opens a *divergent region*: every statement reachable from it
//! before its immediate post-dominator. Entry parameters, `%ctaid`, `%ntid`, `%nctaid` and
//! constants are uniform. The analysis is conservative: it may call a uniform barrier
//! divergent (the kernel is then refused, with the line of the branch), never the reverse.

use std::collections::{HashSet, VecDeque};

use tensor_wasm_ptx_emu::lex::{Tok, Token};

use crate::text::{Function, Stmt};

/// Special registers every thread of a block reads alike.
const UNIFORM_SPECIALS: [&str; 4] = ["%ctaid", "%ntid", "%nctaid", "%warpsize"];

/// Opcodes without a register destination.
const NO_DESTINATION: [&str; 13] = [
    "st",
    "red",
    "bar",
    "barrier",
    "bra",
    "ret",
    "exit",
    "call",
    "membar",
    "fence",
    "prefetch",
    "nanosleep",
    "trap",
];

/// Whether `opcode` is a collective every named thread must reach: a barrier or a warp
/// operation.
pub(crate) fn collective(opcode: &str) -> bool {
    let base = opcode.split('.').next().unwrap_or("");
    matches!(
        base,
        "bar" | "barrier" | "shfl" | "vote" | "match" | "redux"
    ) || opcode.starts_with("bar.warp")
}

fn registers(tokens: &[Token]) -> impl Iterator<Item = &str> {
    tokens.iter().filter_map(|t| match &t.tok {
        Tok::Word(w) if w.starts_with('%') => Some(w.as_str()),
        _ => None,
    })
}

fn divergent_special(name: &str) -> bool {
    let head = name.split('.').next().unwrap_or(name);
    if UNIFORM_SPECIALS.contains(&head) {
        return false;
    }
    matches!(
        head,
        "%tid" | "%laneid" | "%clock" | "%clock64" | "%smid" | "%warpid" | "%globaltimer"
    ) || head.starts_with("%lanemask")
}

/// A statement's destination registers and source registers.
pub(crate) fn def_use<'s>(f: &'s Function, stmt: &'s Stmt) -> (Vec<&'s str>, Vec<&'s str>) {
    let Some(opcode) = stmt.opcode() else {
        return (Vec::new(), Vec::new());
    };
    let base = opcode.split('.').next().unwrap_or("");
    let operands = stmt.operands();
    let mut uses: Vec<&str> = stmt.guard().map(|(p, _)| p).into_iter().collect();
    let known = |r: &&str| f.regs.contains_key(*r) || divergent_special(r);
    if NO_DESTINATION.contains(&base) || operands.is_empty() {
        uses.extend(operands.iter().flat_map(|o| registers(o)).filter(known));
        return (Vec::new(), uses);
    }
    let defs = registers(operands[0])
        .filter(|r| f.regs.contains_key(*r))
        .collect();
    uses.extend(
        operands[1..]
            .iter()
            .flat_map(|o| registers(o))
            .filter(known),
    );
    (defs, uses)
}

/// Whether a statement's result differs between threads whatever its inputs.
fn source_of_divergence(f: &Function, stmt: &Stmt) -> bool {
    let Some(opcode) = stmt.opcode() else {
        return false;
    };
    let base = opcode.split('.').next().unwrap_or("");
    if base == "ld" && opcode.contains(".param") {
        // An entry's parameters are the launch's; a function's may differ per thread.
        let name = stmt.operands().get(1).and_then(|o| {
            o.iter().find_map(|t| match &t.tok {
                Tok::Word(w) if !w.starts_with('%') => Some(w.as_str()),
                _ => None,
            })
        });
        return !(f.entry && name.is_some_and(|n| f.header.iter().any(|h| h == n)));
    }
    matches!(base, "ld" | "atom" | "shfl" | "ldu")
        || stmt
            .operands()
            .iter()
            .flat_map(|o| registers(o))
            .any(divergent_special)
}

/// The analysis of one function.
pub(crate) struct Flow {
    /// For each statement, the divergent branch whose region holds it, if any.
    pub region_of: Vec<Option<usize>>,
}

/// Successors of statement `i` (`n` is the virtual exit).
fn successors(f: &Function, i: usize) -> Vec<usize> {
    let n = f.stmts.len();
    let stmt = &f.stmts[i];
    let next = i + 1;
    let Some(opcode) = stmt.opcode() else {
        return vec![next.min(n)];
    };
    let guarded = stmt.guard().is_some();
    let base = opcode.split('.').next().unwrap_or("");
    match base {
        "bra" => {
            let target = f.branch_target(stmt).unwrap_or(n).min(n);
            if guarded {
                vec![target, next.min(n)]
            } else {
                vec![target]
            }
        }
        "ret" | "exit" if guarded => vec![n, next.min(n)],
        "ret" | "exit" => vec![n],
        _ => vec![next.min(n)],
    }
}

/// Post-dominator sets (bit sets over statements and the exit).
fn post_dominators(succ: &[Vec<usize>]) -> Vec<Vec<u64>> {
    let nodes = succ.len() + 1;
    let words = nodes.div_ceil(64);
    let full = vec![u64::MAX; words];
    let mut pdom = vec![full; nodes];
    let exit = nodes - 1;
    pdom[exit] = vec![0; words];
    pdom[exit][exit / 64] |= 1 << (exit % 64);
    let mut changed = true;
    while changed {
        changed = false;
        for i in (0..succ.len()).rev() {
            let mut set = vec![u64::MAX; words];
            for &s in &succ[i] {
                for (w, v) in set.iter_mut().zip(&pdom[s]) {
                    *w &= v;
                }
            }
            set[i / 64] |= 1 << (i % 64);
            if set != pdom[i] {
                pdom[i] = set;
                changed = true;
            }
        }
    }
    pdom
}

fn contains(set: &[u64], i: usize) -> bool {
    set[i / 64] & (1 << (i % 64)) != 0
}

/// The nearest strict post-dominator of `i`: of its post-dominators, the one with the most
/// post-dominators of its own.
fn immediate(pdom: &[Vec<u64>], i: usize) -> usize {
    let count = |s: &Vec<u64>| s.iter().map(|w| w.count_ones()).sum::<u32>();
    (0..pdom.len())
        .filter(|&c| c != i && contains(&pdom[i], c))
        .max_by_key(|&c| count(&pdom[c]))
        .unwrap_or(pdom.len() - 1)
}

/// Reaching definitions: every definition (statement, register), and for each statement the
/// set of definitions that reach it (bit sets over the definitions).
struct Reaching<'f> {
    defs: Vec<(usize, &'f str)>,
    reach_in: Vec<Vec<u64>>,
}

impl<'f> Reaching<'f> {
    fn new(f: &'f Function, succ: &[Vec<usize>]) -> Self {
        let n = f.stmts.len();
        let mut defs = Vec::new();
        let mut defined_at: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, stmt) in f.stmts.iter().enumerate() {
            for r in def_use(f, stmt).0 {
                defined_at[i].push(defs.len());
                defs.push((i, r));
            }
        }
        let words = defs.len().div_ceil(64).max(1);
        let mut preds: Vec<Vec<usize>> = vec![Vec::new(); n];
        for (i, next) in succ.iter().enumerate() {
            for &s in next {
                if s < n {
                    preds[s].push(i);
                }
            }
        }
        // An unguarded definition kills the register's other definitions.
        let kills = |i: usize, set: &mut Vec<u64>| {
            if f.stmts[i].guard().is_some() {
                return;
            }
            for &d in &defined_at[i] {
                for (k, (_, r)) in defs.iter().enumerate() {
                    if *r == defs[d].1 {
                        set[k / 64] &= !(1 << (k % 64));
                    }
                }
            }
        };
        let mut reach_in = vec![vec![0u64; words]; n];
        let mut out = vec![vec![0u64; words]; n];
        let mut changed = true;
        while changed {
            changed = false;
            for i in 0..n {
                let mut set = vec![0u64; words];
                for &p in &preds[i] {
                    for (w, v) in set.iter_mut().zip(&out[p]) {
                        *w |= v;
                    }
                }
                reach_in[i].clone_from(&set);
                kills(i, &mut set);
                for &d in &defined_at[i] {
                    set[d / 64] |= 1 << (d % 64);
                }
                if set != out[i] {
                    out[i] = set;
                    changed = true;
                }
            }
        }
        Reaching { defs, reach_in }
    }

    /// The definitions of `reg` that reach statement `i`.
    fn of(&self, i: usize, reg: &str) -> impl Iterator<Item = usize> + '_ {
        let reg = reg.to_owned();
        (0..self.defs.len()).filter(move |&k| {
            self.reach_in[i][k / 64] & (1 << (k % 64)) != 0 && self.defs[k].1 == reg
        })
    }
}

/// Divergent regions of `f`. Divergence is tracked per definition, so a register that is
/// reused (a parameter's copy, then a thread's loop counter) is judged by the definitions
/// that actually reach each use.
pub(crate) fn analyse(f: &Function) -> Flow {
    let n = f.stmts.len();
    let succ: Vec<Vec<usize>> = (0..n).map(|i| successors(f, i)).collect();
    let pdom = post_dominators(&succ);
    let reaching = Reaching::new(f, &succ);
    let mut divergent_def = vec![false; reaching.defs.len()];
    let mut region_of: Vec<Option<usize>> = vec![None; n];
    let divergent_use = |divergent_def: &[bool], i: usize, reg: &str| {
        divergent_special(reg) || reaching.of(i, reg).any(|d| divergent_def[d])
    };
    loop {
        let before = (
            divergent_def.iter().filter(|d| **d).count(),
            region_of.iter().flatten().count(),
        );
        for (k, &(i, _)) in reaching.defs.iter().enumerate() {
            if divergent_def[k] {
                continue;
            }
            let stmt = &f.stmts[i];
            let uses = def_use(f, stmt).1;
            divergent_def[k] = source_of_divergence(f, stmt)
                || region_of[i].is_some()
                || uses.iter().any(|u| divergent_use(&divergent_def, i, u));
        }
        for (i, stmt) in f.stmts.iter().enumerate() {
            let branches = matches!(
                stmt.opcode().and_then(|o| o.split('.').next()),
                Some("bra" | "ret" | "exit")
            );
            let Some((guard, _)) = stmt.guard() else {
                continue;
            };
            if !branches || !divergent_use(&divergent_def, i, guard) {
                continue;
            }
            let stop = immediate(&pdom, i);
            let mut queue: VecDeque<usize> = succ[i].iter().copied().collect();
            let mut seen = HashSet::new();
            while let Some(s) = queue.pop_front() {
                if s == stop || s >= n || !seen.insert(s) {
                    continue;
                }
                region_of[s].get_or_insert(i);
                queue.extend(succ[s].iter().copied());
            }
        }
        let after = (
            divergent_def.iter().filter(|d| **d).count(),
            region_of.iter().flatten().count(),
        );
        if after == before {
            return Flow { region_of };
        }
    }
}
