//! Groups of accesses one fence can cover: accesses through the same 64-bit register at
//! constant offsets, of one size, in one straight-line stretch (no label, branch, return,
//! call or redefinition of the register between them, none of them guarded). When the first
//! runs, all run with the same register value, so in a correct kernel all are in bounds
//! together: one clamp of the register into `[lo − first offset, hi − last end]` at the
//! first access covers the group, and the kernel's own register is left alone. An unrolled
//! loop over a shared tile is the typical group.

use std::collections::HashMap;

use tensor_wasm_ptx_emu::lex::{parse_int, Tok, Token};

use crate::cfg;
use crate::fence::{access_bytes, address, space_of, Base};
use crate::text::{Function, Space};

/// One group: the register, its space, its lowest offset, the bytes from there to the end
/// of its last access, and the access size.
pub(crate) struct Group {
    pub register: String,
    pub space: Space,
    pub low: i64,
    pub span: u64,
    pub bytes: u64,
}

/// A grouped access: its group, whether it is the first, and its offset from the group's
/// lowest one.
#[derive(Clone, Copy)]
pub(crate) struct Member {
    pub group: usize,
    pub first: bool,
    pub relative: i64,
}

/// The groups of `f` and the accesses in them, by statement index. `fits` says whether a
/// span fits the space's memory for every launch.
pub(crate) fn groups(
    f: &Function,
    constant: &HashMap<String, (String, i64)>,
    fits: impl Fn(Space, u64) -> bool,
) -> (Vec<Group>, HashMap<usize, Member>) {
    // Open runs by register: (space, bytes, [(statement, offset)]).
    type Run = (Space, u64, Vec<(usize, i64)>);
    let mut open: HashMap<String, Run> = HashMap::new();
    let mut closed: Vec<(String, Run)> = Vec::new();
    let labels: std::collections::HashSet<usize> = f.labels.values().copied().collect();
    for (i, stmt) in f.stmts.iter().enumerate() {
        if labels.contains(&i) {
            closed.extend(open.drain());
        }
        let Some(opcode) = stmt.opcode() else {
            continue;
        };
        let base = opcode.split('.').next().unwrap_or("");
        if matches!(base, "bra" | "ret" | "exit" | "call" | "brx") {
            closed.extend(open.drain());
            continue;
        }
        let mut access = None;
        if matches!(base, "ld" | "st" | "atom" | "red") && stmt.guard().is_none() {
            let index = usize::from(matches!(base, "ld" | "atom"));
            let space = space_of(opcode);
            if let (Some(operand), Some(bytes)) = (stmt.operands().get(index), access_bytes(opcode))
            {
                if let Some(addr) = address(operand) {
                    if let Base::Register(r) = addr.base {
                        let wide = f.regs.get(r) == Some(&64);
                        let groupable =
                            matches!(space, Space::Global | Space::Shared | Space::Local);
                        if wide && groupable && !constant.contains_key(r) {
                            access = Some((r.to_owned(), space, bytes, addr.offset));
                        }
                    }
                }
            }
        }
        if let Some((r, space, bytes, offset)) = access {
            let same = open
                .get(&r)
                .is_some_and(|(s, b, _)| *s == space && *b == bytes);
            if !same {
                if let Some(run) = open.remove(&r) {
                    closed.push((r.clone(), run));
                }
                open.insert(r.clone(), (space, bytes, Vec::new()));
            }
            open.get_mut(&r).expect("inserted").2.push((i, offset));
        }
        // A redefinition ends the register's run (after the access that may read it).
        for d in cfg::def_use(f, stmt).0 {
            if let Some(run) = open.remove(d) {
                closed.push((d.to_owned(), run));
            }
        }
    }
    closed.extend(open.drain());
    let mut groups = Vec::new();
    let mut members = HashMap::new();
    for (register, (space, bytes, uses)) in closed {
        if uses.len() < 2 {
            continue;
        }
        let low = uses.iter().map(|u| u.1).min().expect("two uses");
        let high = uses.iter().map(|u| u.1).max().expect("two uses");
        let span = (high - low) as u64 + bytes;
        let aligned = uses.iter().all(|u| (u.1 - low) % bytes as i64 == 0);
        if !aligned || !fits(space, span) {
            continue;
        }
        let group = groups.len();
        for (k, (stmt, offset)) in uses.iter().enumerate() {
            members.insert(
                *stmt,
                Member {
                    group,
                    first: k == 0,
                    relative: offset - low,
                },
            );
        }
        groups.push(Group {
            register,
            space,
            low,
            span,
            bytes,
        });
    }
    (groups, members)
}

/// Registers whose one definition makes them a variable's address plus a constant
/// (`mov.u64 %rd, var`, then `add` of constants): the variable and the offset.
pub(crate) fn constant_addresses(
    f: &Function,
    shared: &HashMap<String, u64>,
) -> HashMap<String, (String, i64)> {
    let mut defs: HashMap<&str, usize> = HashMap::new();
    for stmt in &f.stmts {
        for d in cfg::def_use(f, stmt).0 {
            *defs.entry(d).or_default() += 1;
        }
    }
    let mut known: HashMap<String, (String, i64)> = HashMap::new();
    for stmt in &f.stmts {
        let (Some(opcode), None) = (stmt.opcode(), stmt.guard()) else {
            continue;
        };
        let operands = stmt.operands();
        let word = |o: &[Token]| match o {
            [Token {
                tok: Tok::Word(w), ..
            }] => Some(w.clone()),
            _ => None,
        };
        let number = |o: &[Token]| match o {
            [Token {
                tok: Tok::Num(n), ..
            }] => parse_int(n).map(|v| v as i64),
            [Token {
                tok: Tok::Punct('-'),
                ..
            }, Token {
                tok: Tok::Num(n), ..
            }] => parse_int(n).map(|v| -(v as i64)),
            _ => None,
        };
        let Some(dst) = operands.first().and_then(|o| word(o)) else {
            continue;
        };
        if defs.get(dst.as_str()) != Some(&1) {
            continue;
        }
        let value = match (opcode, &operands[..]) {
            ("mov.u64" | "mov.b64", [_, src]) => word(src)
                .filter(|w| f.vars.contains_key(w) || shared.contains_key(w))
                .map(|w| (w, 0)),
            ("add.u64" | "add.s64", [_, a, b]) => {
                let from = |r: &[Token], k: &[Token]| {
                    let (sym, base) = known.get(&word(r)?)?.clone();
                    Some((sym, base + number(k)?))
                };
                from(a, b).or_else(|| from(b, a))
            }
            _ => None,
        };
        if let Some(value) = value {
            known.insert(dst, value);
        }
    }
    known
}
