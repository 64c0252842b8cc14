//! The lean copy's instructions in the form the launch-time proof (`prove.rs`) executes:
//! registers as indices, labels as instruction indices, variables as ids. Only what can
//! bound an address is decoded closely; any other instruction *clobbers* the registers it
//! names first (its destinations), so the proof knows nothing of them.

use std::collections::HashMap;

use tensor_wasm_ptx_emu::lex::{parse_int, Tok, Token};

use crate::fence::{access_bytes, address, space_of, Base};
use crate::text::{Function, Space, Stmt, Text};

/// A variable of the lean copy: its space, size (0 for the dynamic shared array, whose
/// size is the launch's) and alignment.
#[derive(Debug, Clone)]
pub(crate) struct Var {
    pub space: Space,
    pub size: u64,
    pub align: u64,
    pub dynamic: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Special {
    Tid(usize),
    Ntid(usize),
    Ctaid(usize),
    Nctaid(usize),
    Lane,
    WarpSize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Opnd {
    Reg(u32),
    Imm(i128),
    Special(Special),
    /// A variable's address.
    Var(u32),
    /// Anything else (a float literal, an unknown special register).
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Arith {
    Add,
    Sub,
    MulLo,
    MulWide,
    MadLo,
    MadWide,
    Shl,
    Shr,
    And,
    Or,
    Xor,
    Min,
    Max,
    Rem,
    Div,
    Neg,
    Abs,
    Not,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Logic {
    And,
    Or,
    Xor,
    Not,
    Mov,
}

/// A predicate operand: register and negation.
pub(crate) type PredRef = (u32, bool);

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Kind {
    Mov {
        dst: u32,
        src: Opnd,
    },
    Arith {
        op: Arith,
        signed: bool,
        bits: u32,
        dst: u32,
        a: Opnd,
        b: Opnd,
        c: Opnd,
    },
    Cvt {
        dst: u32,
        to: (bool, u32),
        from: (bool, u32),
        src: Opnd,
    },
    /// `cvta` to generic (`to` false) or from it, for `space`.
    Cvta {
        dst: u32,
        to: bool,
        space: Space,
        src: Opnd,
    },
    Selp {
        dst: u32,
        a: Opnd,
        b: Opnd,
        pred: PredRef,
    },
    Setp {
        dst: u32,
        /// `%p|%q`: the second destination gets the negation.
        negated_dst: Option<u32>,
        cmp: CmpOp,
        signed: bool,
        bits: u32,
        a: Opnd,
        b: Opnd,
        combine: Option<(Logic, PredRef)>,
    },
    Logic {
        op: Logic,
        dst: u32,
        a: PredRef,
        b: Option<PredRef>,
    },
    /// `ld.param` of a named parameter or frame variable.
    LdParam {
        dst: u32,
        name: String,
        offset: i64,
        signed: bool,
        bits: u32,
    },
    StParam {
        name: String,
        offset: i64,
        bits: u32,
        src: Opnd,
    },
    /// A load, store, atomic or reduction outside the parameter space.
    Access {
        space: Space,
        bytes: u64,
        base: Opnd,
        offset: i64,
        dsts: Vec<u32>,
    },
    Bra {
        target: usize,
    },
    Call {
        func: usize,
        args: Vec<String>,
        ret: Option<String>,
    },
    Ret,
    Exit,
    Nop,
    Clobber(Vec<u32>),
    /// A memory access or control transfer the proof cannot read: no launch is proven.
    Unreadable,
}

#[derive(Debug, Clone)]
pub(crate) struct Insn {
    pub guard: Option<PredRef>,
    pub kind: Kind,
    pub line: u32,
}

/// One decoded function.
#[derive(Debug, Clone)]
pub(crate) struct Func {
    pub insns: Vec<Insn>,
    /// Width of each register (predicates: 1).
    pub widths: Vec<u32>,
    /// Whether an instruction is a branch target (where paths meet).
    pub target: Vec<bool>,
    /// The header's parameter names, in order.
    pub params: Vec<String>,
    /// The return value's names.
    pub returns: Vec<String>,
}

fn special(name: &str) -> Option<Special> {
    let (head, dim) = name.split_once('.').unwrap_or((name, ""));
    let d = match dim {
        "x" => 0,
        "y" => 1,
        "z" => 2,
        "" => 3,
        _ => return None,
    };
    Some(match (head, d) {
        ("%tid", 0..=2) => Special::Tid(d),
        ("%ntid", 0..=2) => Special::Ntid(d),
        ("%ctaid", 0..=2) => Special::Ctaid(d),
        ("%nctaid", 0..=2) => Special::Nctaid(d),
        ("%laneid", 3) => Special::Lane,
        ("%warpsize", 3) => Special::WarpSize,
        _ => return None,
    })
}

/// The type of an opcode: its last part that names one (`s32`, `u64`, `b16`, `pred`...).
fn ty(opcode: &str) -> Option<(char, u32)> {
    let last = opcode.rsplit('.').next()?;
    let kind = last.chars().next()?;
    let bits: u32 = last.get(1..)?.parse().ok()?;
    matches!(kind, 'b' | 'u' | 's' | 'f').then_some((kind, bits))
}

fn second_ty(opcode: &str) -> Option<(char, u32)> {
    let mut parts = opcode.rsplit('.');
    parts.next()?;
    ty(parts.next()?)
}

fn cmp(opcode: &str) -> Option<CmpOp> {
    opcode.split('.').skip(1).find_map(|part| {
        Some(match part {
            "eq" => CmpOp::Eq,
            "ne" => CmpOp::Ne,
            "lt" | "lo" => CmpOp::Lt,
            "le" | "ls" => CmpOp::Le,
            "gt" | "hi" => CmpOp::Gt,
            "ge" | "hs" => CmpOp::Ge,
            _ => return None,
        })
    })
}

struct Decoder<'a> {
    f: &'a Function,
    regs: HashMap<&'a str, u32>,
    vars: &'a HashMap<String, u32>,
    funcs: &'a HashMap<String, usize>,
}

impl<'a> Decoder<'a> {
    fn operand(&self, tokens: &[Token]) -> Opnd {
        match tokens {
            [Token {
                tok: Tok::Word(w), ..
            }] => {
                if let Some(&r) = self.regs.get(w.as_str()) {
                    Opnd::Reg(r)
                } else if let Some(s) = special(w) {
                    Opnd::Special(s)
                } else if let Some(&v) = self.vars.get(w) {
                    Opnd::Var(v)
                } else {
                    Opnd::Unknown
                }
            }
            [Token {
                tok: Tok::Num(n), ..
            }] => parse_int(n).map_or(Opnd::Unknown, |v| Opnd::Imm(v as i128)),
            [Token {
                tok: Tok::Punct('-'),
                ..
            }, Token {
                tok: Tok::Num(n), ..
            }] => parse_int(n).map_or(Opnd::Unknown, |v| Opnd::Imm(-(v as i128))),
            _ => Opnd::Unknown,
        }
    }

    fn pred(&self, tokens: &[Token]) -> Option<PredRef> {
        match tokens {
            [Token {
                tok: Tok::Punct('!'),
                ..
            }, rest @ ..] => match self.operand(rest) {
                Opnd::Reg(r) => Some((r, true)),
                _ => None,
            },
            _ => match self.operand(tokens) {
                Opnd::Reg(r) => Some((r, false)),
                _ => None,
            },
        }
    }

    fn reg(&self, tokens: &[Token]) -> Option<u32> {
        match self.operand(tokens) {
            Opnd::Reg(r) => Some(r),
            _ => None,
        }
    }

    /// The registers named in `tokens`.
    fn regs_in(&self, tokens: &[Token]) -> Vec<u32> {
        tokens
            .iter()
            .filter_map(|t| match &t.tok {
                Tok::Word(w) => self.regs.get(w.as_str()).copied(),
                _ => None,
            })
            .collect()
    }

    fn insn(&self, stmt: &Stmt) -> Kind {
        let opcode = stmt.opcode().expect("instructions have opcodes");
        let ops = stmt.operands();
        let base = opcode.split('.').next().unwrap_or("");
        let clobber = || {
            if matches!(
                base,
                "ld" | "st" | "atom" | "red" | "call" | "bra" | "brx" | "ret" | "exit" | "prefetch"
            ) {
                Kind::Unreadable
            } else {
                Kind::Clobber(ops.first().map_or(Vec::new(), |o| self.regs_in(o)))
            }
        };
        self.decode(opcode, &ops).unwrap_or_else(clobber)
    }

    fn decode(&self, opcode: &str, ops: &[&[Token]]) -> Option<Kind> {
        let parts: Vec<&str> = opcode.split('.').collect();
        let has = |m: &str| parts.contains(&m);
        let int = |t: Option<(char, u32)>| t.filter(|(k, _)| *k != 'f');
        let opnd = |k: usize| ops.get(k).map_or(Opnd::Unknown, |o| self.operand(o));
        Some(match parts[0] {
            "mov" if parts.len() == 2 && parts[1] != "pred" => Kind::Mov {
                dst: self.reg(ops.first()?)?,
                src: opnd(1),
            },
            "mov" if parts.get(1) == Some(&"pred") => Kind::Logic {
                op: Logic::Mov,
                dst: self.reg(ops.first()?)?,
                a: self.pred(ops.get(1)?)?,
                b: None,
            },
            "add" | "sub" | "mul" | "mad" | "shl" | "shr" | "and" | "or" | "xor" | "min"
            | "max" | "rem" | "div" | "neg" | "abs" | "not"
                if ty(opcode).is_some_and(|(k, _)| k != 'f') =>
            {
                let (kind, bits) = int(ty(opcode))?;
                let op = match parts[0] {
                    "add" => Arith::Add,
                    "sub" => Arith::Sub,
                    "mul" if has("wide") => Arith::MulWide,
                    "mul" if has("lo") => Arith::MulLo,
                    "mad" if has("wide") => Arith::MadWide,
                    "mad" if has("lo") => Arith::MadLo,
                    "shl" => Arith::Shl,
                    "shr" => Arith::Shr,
                    "and" => Arith::And,
                    "or" => Arith::Or,
                    "xor" => Arith::Xor,
                    "min" => Arith::Min,
                    "max" => Arith::Max,
                    "rem" => Arith::Rem,
                    "div" => Arith::Div,
                    "neg" => Arith::Neg,
                    "abs" => Arith::Abs,
                    "not" => Arith::Not,
                    _ => return None,
                };
                // Saturating or carrying forms are not modelled; wide forms exist up to 32 bits.
                if has("sat") || has("cc") || has("hi") && parts[0] != "mul" {
                    return None;
                }
                if matches!(op, Arith::MulWide | Arith::MadWide) && bits > 32 {
                    return None;
                }
                Kind::Arith {
                    op,
                    signed: kind == 's',
                    bits,
                    dst: self.reg(ops.first()?)?,
                    a: opnd(1),
                    b: opnd(2),
                    c: opnd(3),
                }
            }
            "and" | "or" | "xor" | "not" if parts.get(1) == Some(&"pred") => Kind::Logic {
                op: match parts[0] {
                    "and" => Logic::And,
                    "or" => Logic::Or,
                    "xor" => Logic::Xor,
                    _ => Logic::Not,
                },
                dst: self.reg(ops.first()?)?,
                a: self.pred(ops.get(1)?)?,
                b: ops.get(2).and_then(|o| self.pred(o)),
            },
            "cvt" if parts.len() == 3 => {
                let to = int(second_ty(opcode))?;
                let from = int(ty(opcode))?;
                Kind::Cvt {
                    dst: self.reg(ops.first()?)?,
                    to: (to.0 == 's', to.1),
                    from: (from.0 == 's', from.1),
                    src: opnd(1),
                }
            }
            "cvta" => {
                let to = has("to");
                let space = if has("global") {
                    Space::Global
                } else if has("shared") {
                    Space::Shared
                } else {
                    return None;
                };
                Kind::Cvta {
                    dst: self.reg(ops.first()?)?,
                    to,
                    space,
                    src: opnd(1),
                }
            }
            "selp" => Kind::Selp {
                dst: self.reg(ops.first()?)?,
                a: opnd(1),
                b: opnd(2),
                pred: self.pred(ops.get(3)?)?,
            },
            "setp" => {
                let (kind, bits) = int(ty(opcode))?;
                let dsts = ops.first()?;
                let (dst, negated_dst) = match dsts {
                    [p, Token {
                        tok: Tok::Punct('|'),
                        ..
                    }, q] => (
                        self.reg(std::slice::from_ref(p))?,
                        Some(self.reg(std::slice::from_ref(q))?),
                    ),
                    _ => (self.reg(dsts)?, None),
                };
                let combine = match (parts.iter().find_map(|p| logic(p)), ops.get(3)) {
                    (Some(l), Some(p)) => Some((l, self.pred(p)?)),
                    (None, None) => None,
                    _ => return None,
                };
                Kind::Setp {
                    dst,
                    negated_dst,
                    cmp: cmp(opcode)?,
                    signed: kind == 's',
                    bits,
                    a: opnd(1),
                    b: opnd(2),
                    combine,
                }
            }
            "ld" | "st" | "atom" | "red" => {
                let space = space_of(opcode);
                let position = usize::from(matches!(parts[0], "ld" | "atom"));
                let addr = address(ops.get(position)?)?;
                if space == Space::Param {
                    let Base::Symbol(name) = addr.base else {
                        return None;
                    };
                    let Some((kind, bits)) = int(ty(opcode)) else {
                        // A float parameter: the proof knows nothing of it.
                        return Some(if parts[0] == "ld" {
                            Kind::Clobber(self.regs_in(ops.first()?))
                        } else {
                            Kind::StParam {
                                name: name.to_owned(),
                                offset: addr.offset,
                                bits: ty(opcode)?.1,
                                src: Opnd::Unknown,
                            }
                        });
                    };
                    return Some(if parts[0] == "ld" {
                        Kind::LdParam {
                            dst: self.reg(ops.first()?)?,
                            name: name.to_owned(),
                            offset: addr.offset,
                            signed: kind == 's',
                            bits,
                        }
                    } else {
                        Kind::StParam {
                            name: name.to_owned(),
                            offset: addr.offset,
                            bits,
                            src: opnd(1),
                        }
                    });
                }
                let base = match addr.base {
                    Base::Register(r) => self.regs.get(r).map_or(Opnd::Unknown, |&i| Opnd::Reg(i)),
                    Base::Symbol(s) => self.vars.get(s).map_or(Opnd::Unknown, |&v| Opnd::Var(v)),
                    Base::Immediate(v) => Opnd::Imm(v as i128),
                };
                let dsts = if position == 1 {
                    self.regs_in(ops[0])
                } else {
                    Vec::new()
                };
                Kind::Access {
                    space,
                    bytes: access_bytes(opcode)?,
                    base,
                    offset: addr.offset,
                    dsts,
                }
            }
            "bra" => Kind::Bra {
                target: self.f.branch_target_of(ops.first()?)?,
            },
            "call" => {
                let mut groups = ops.iter().map(|o| {
                    o.iter()
                        .filter_map(|t| match &t.tok {
                            Tok::Word(w) => Some(w.clone()),
                            _ => None,
                        })
                        .collect::<Vec<_>>()
                });
                let parenthesized =
                    |o: &&[Token]| o.first().map(|t| &t.tok) == Some(&Tok::Punct('('));
                let (ret, name, args) = match ops.len() {
                    3 if parenthesized(&ops[0]) => {
                        let ret = groups.next()?;
                        (ret.first().cloned(), groups.next()?, groups.next()?)
                    }
                    2 => (None, groups.next()?, groups.next()?),
                    1 => (None, groups.next()?, Vec::new()),
                    _ => return None,
                };
                Kind::Call {
                    func: *self.funcs.get(name.first()?)?,
                    args,
                    ret,
                }
            }
            "ret" => Kind::Ret,
            "exit" => Kind::Exit,
            "bar" | "barrier" | "membar" | "fence" => Kind::Nop,
            _ => return None,
        })
    }
}

fn logic(part: &str) -> Option<Logic> {
    match part {
        "and" => Some(Logic::And),
        "or" => Some(Logic::Or),
        "xor" => Some(Logic::Xor),
        _ => None,
    }
}

impl Function {
    fn branch_target_of(&self, tokens: &[Token]) -> Option<usize> {
        match &tokens.first()?.tok {
            Tok::Word(label) => self.labels.get(label).copied(),
            _ => None,
        }
    }
}

/// Decodes every function named in `names` (in `text`), with the module's variable table.
pub(crate) fn decode(text: &Text, names: &[&Function]) -> Option<(Vec<Func>, Vec<Var>)> {
    let mut vars: Vec<Var> = Vec::new();
    let mut ids: HashMap<String, u32> = HashMap::new();
    let mut declared: Vec<(String, Var)> = text
        .shared
        .iter()
        .map(|(name, size)| {
            let align = text.aligns.get(name).copied().unwrap_or(1);
            let var = Var {
                space: Space::Shared,
                size: *size,
                align,
                dynamic: false,
            };
            (name.clone(), var)
        })
        .collect();
    if let Some(name) = &text.dynamic_shared {
        let align = text.aligns.get(name).copied().unwrap_or(1);
        let var = Var {
            space: Space::Shared,
            size: 0,
            align,
            dynamic: true,
        };
        declared.push((name.clone(), var));
    }
    for f in names {
        for (name, (space, size)) in &f.vars {
            if matches!(space, Space::Shared | Space::Local) {
                let align = f.aligns.get(name).copied().unwrap_or(1);
                let var = Var {
                    space: *space,
                    size: *size,
                    align,
                    dynamic: false,
                };
                declared.push((name.clone(), var));
            }
        }
    }
    for (name, var) in declared {
        match ids.get(&name) {
            // The same name declared twice alike (one variable per function scope): one id.
            Some(&id) => {
                let known = &vars[id as usize];
                let alike = known.space == var.space
                    && known.size == var.size
                    && known.align == var.align
                    && known.dynamic == var.dynamic;
                if !alike {
                    return None;
                }
            }
            None => {
                ids.insert(name, vars.len() as u32);
                vars.push(var);
            }
        }
    }
    let funcs: HashMap<String, usize> = names
        .iter()
        .enumerate()
        .map(|(i, f)| (f.name.clone(), i))
        .collect();
    let mut out = Vec::new();
    for f in names {
        let mut reg_names: Vec<(&String, &u32)> = f.regs.iter().collect();
        reg_names.sort();
        let regs: HashMap<&str, u32> = reg_names
            .iter()
            .enumerate()
            .map(|(i, (name, _))| (name.as_str(), i as u32))
            .collect();
        let widths = reg_names.iter().map(|(_, w)| **w).collect();
        let decoder = Decoder {
            f,
            regs,
            vars: &ids,
            funcs: &funcs,
        };
        // Instructions only; labels index statements, so map them.
        let mut index_of = vec![0usize; f.stmts.len() + 1];
        let mut insns = Vec::new();
        for (i, stmt) in f.stmts.iter().enumerate() {
            index_of[i] = insns.len();
            if stmt.opcode().is_none() {
                continue;
            }
            let guard = stmt
                .guard()
                .and_then(|(p, negated)| decoder.regs.get(p).map(|&r| (r, negated)));
            if stmt.guard().is_some() && guard.is_none() {
                return None;
            }
            insns.push(Insn {
                guard,
                kind: decoder.insn(stmt),
                line: stmt.line,
            });
        }
        index_of[f.stmts.len()] = insns.len();
        let mut target = vec![false; insns.len() + 1];
        for insn in &mut insns {
            if let Kind::Bra { target: t } = &mut insn.kind {
                *t = index_of[*t];
                target[*t] = true;
            }
        }
        out.push(Func {
            insns,
            widths,
            target,
            params: f.header.clone(),
            returns: f.returns.clone(),
        });
    }
    Some((out, vars))
}
