//! Decodes one instruction statement into [`Instr`]: opcode modifiers, operands, registers,
//! labels and symbols, with [`EmuError::Unsupported`] for everything outside the subset.

use std::collections::HashMap;

use crate::ir::{
    Addr, BoolOp, Cmp, FloatOp, Instr, IntOp, Op, Pred, PredOp, Rounding, Space, Special, Src, Ty,
    TyKind, UnaryOp,
};
use crate::parse::{parse_int, FuncDecl, Statement, Tok};
use crate::EmuError;

/// The names an entry's instructions may use.
#[derive(Debug, Default)]
pub(crate) struct Scope {
    pub regs: HashMap<String, u16>,
    pub preds: HashMap<String, u16>,
    pub labels: HashMap<String, u32>,
    /// Shared variables: byte offset in the block's shared memory.
    pub shared: HashMap<String, u32>,
    /// The entry's parameters: byte offset in the parameter buffer.
    pub params: HashMap<String, u32>,
    /// The frame's `.param` variables (a function's parameters and return value, call
    /// arguments): byte offset in the frame.
    pub frame: HashMap<String, u32>,
    /// `.local` variables: byte offset in the function's local memory.
    pub local: HashMap<String, u32>,
    /// Functions declared before this body: index and layout.
    pub funcs: HashMap<String, (u32, FuncDecl)>,
}

/// A parsed operand.
#[derive(Debug, Clone)]
pub(crate) enum Operand {
    Src(Src),
    Pred(Pred),
    Label(u32),
    Vector(Vec<Src>),
    /// `%r|%p`: a register and a predicate written together (`shfl`).
    DstPred(u16, u16),
    /// An address and the space its symbol names, if it names one.
    Addr(Addr, Option<Space>),
}

pub(crate) struct Decoder<'a> {
    pub scope: &'a Scope,
    pub line: u32,
}

pub(crate) fn decode(statement: &Statement, scope: &Scope) -> Result<Instr, EmuError> {
    Decoder {
        scope,
        line: statement.line,
    }
    .instr(&statement.tokens)
}

fn special(name: &str) -> Option<Special> {
    match name {
        "%laneid" => return Some(Special::LaneId),
        "%warpsize" => return Some(Special::WarpSize),
        _ => {}
    }
    let (reg, axis) = name.split_once('.')?;
    let axis = match axis {
        "x" => 0,
        "y" => 1,
        "z" => 2,
        _ => return None,
    };
    Some(match reg {
        "%tid" => Special::Tid(axis),
        "%ntid" => Special::Ntid(axis),
        "%ctaid" => Special::Ctaid(axis),
        "%nctaid" => Special::Nctaid(axis),
        _ => return None,
    })
}

impl Decoder<'_> {
    pub(crate) fn fail<T>(&self, message: impl Into<String>) -> Result<T, EmuError> {
        Err(EmuError::Parse {
            line: self.line,
            message: message.into(),
        })
    }

    pub(crate) fn unsupported<T>(&self, what: impl Into<String>) -> Result<T, EmuError> {
        Err(EmuError::Unsupported {
            line: self.line,
            what: what.into(),
        })
    }

    pub(crate) fn number(&self, text: &str, negative: bool) -> Result<u64, EmuError> {
        let bits = if let Some(hex) = text.strip_prefix("0f").or(text.strip_prefix("0F")) {
            if hex.len() != 8 {
                return self.fail(format!("bad f32 literal {text}"));
            }
            u32::from_str_radix(hex, 16).map(u64::from).ok()
        } else if let Some(hex) = text.strip_prefix("0d").or(text.strip_prefix("0D")) {
            if hex.len() != 16 {
                return self.fail(format!("bad f64 literal {text}"));
            }
            u64::from_str_radix(hex, 16).ok()
        } else if text.contains('.') {
            return self.unsupported(format!("decimal floating-point literal {text}"));
        } else {
            parse_int(text)
        };
        let Some(bits) = bits else {
            return self.fail(format!("bad number {text}"));
        };
        Ok(if negative { bits.wrapping_neg() } else { bits })
    }

    fn operand(&self, tokens: &[Tok]) -> Result<Operand, EmuError> {
        match tokens {
            [Tok::Punct('['), inner @ .., Tok::Punct(']')] => self.address(inner),
            [Tok::Punct('{'), inner @ .., Tok::Punct('}')] => {
                let mut regs = Vec::new();
                for part in inner.split(|t| *t == Tok::Punct(',')) {
                    match self.operand(part)? {
                        Operand::Src(src) => regs.push(src),
                        other => return self.fail(format!("bad vector element {other:?}")),
                    }
                }
                Ok(Operand::Vector(regs))
            }
            [Tok::Punct('!'), Tok::Word(name)] => match self.scope.preds.get(name) {
                Some(&reg) => Ok(Operand::Pred(Pred { reg, negated: true })),
                None => self.fail(format!("{name} is not a predicate register")),
            },
            [Tok::Word(reg), Tok::Punct('|'), Tok::Word(pred)] => {
                match (self.scope.regs.get(reg), self.scope.preds.get(pred)) {
                    (Some(&r), Some(&p)) => Ok(Operand::DstPred(r, p)),
                    _ => self.fail(format!("{reg}|{pred} is not a register and a predicate")),
                }
            }
            [Tok::Punct('-'), Tok::Num(text)] => {
                Ok(Operand::Src(Src::Imm(self.number(text, true)?)))
            }
            [Tok::Num(text)] => Ok(Operand::Src(Src::Imm(self.number(text, false)?))),
            [Tok::Word(name)] => {
                if let Some(&reg) = self.scope.regs.get(name) {
                    Ok(Operand::Src(Src::Reg(reg)))
                } else if let Some(&reg) = self.scope.preds.get(name) {
                    Ok(Operand::Pred(Pred {
                        reg,
                        negated: false,
                    }))
                } else if let Some(s) = special(name) {
                    Ok(Operand::Src(Src::Special(s)))
                } else if let Some(&offset) = self.scope.shared.get(name) {
                    Ok(Operand::Src(Src::Imm(u64::from(offset))))
                } else if let Some(&offset) = self.scope.local.get(name) {
                    Ok(Operand::Src(Src::Local(offset)))
                } else if let Some(&index) = self.scope.labels.get(name) {
                    Ok(Operand::Label(index))
                } else if name.starts_with('%') {
                    self.unsupported(format!("register {name} (undeclared or special)"))
                } else {
                    self.fail(format!("unknown name {name}"))
                }
            }
            _ => self.fail(format!("cannot read operand {tokens:?}")),
        }
    }

    /// The inside of `[...]`: `reg`, `symbol`, `number`, each optionally `+`/`-` a number.
    fn address(&self, tokens: &[Tok]) -> Result<Operand, EmuError> {
        let (head, offset) = match tokens {
            [head] => (head, 0i64),
            [head, Tok::Punct(sign @ ('+' | '-')), Tok::Num(text)] => {
                let value = self.number(text, false)? as i64;
                (head, if *sign == '-' { -value } else { value })
            }
            // `[%rd1+-4]`, as NVRTC writes a negative offset.
            [head, Tok::Punct('+'), Tok::Punct('-'), Tok::Num(text)] => {
                (head, (self.number(text, false)? as i64).wrapping_neg())
            }
            _ => return self.fail(format!("cannot read address {tokens:?}")),
        };
        match head {
            Tok::Num(text) => {
                let base = self.number(text, false)? as i64;
                Ok(Operand::Addr(
                    Addr {
                        base: None,
                        offset: base.wrapping_add(offset),
                    },
                    None,
                ))
            }
            Tok::Word(name) => {
                if let Some(&reg) = self.scope.regs.get(name) {
                    return Ok(Operand::Addr(
                        Addr {
                            base: Some(reg),
                            offset,
                        },
                        None,
                    ));
                }
                let symbol = |offset_of: u32, space| {
                    Ok(Operand::Addr(
                        Addr {
                            base: None,
                            offset: i64::from(offset_of) + offset,
                        },
                        Some(space),
                    ))
                };
                if let Some(&at) = self.scope.shared.get(name) {
                    return symbol(at, Space::Shared);
                }
                if let Some(&at) = self.scope.params.get(name) {
                    return symbol(at, Space::Param);
                }
                if let Some(&at) = self.scope.frame.get(name) {
                    return symbol(at, Space::Frame);
                }
                if let Some(&at) = self.scope.local.get(name) {
                    return symbol(at, Space::Local);
                }
                self.fail(format!("unknown address {name}"))
            }
            _ => self.fail(format!("cannot read address {tokens:?}")),
        }
    }

    pub(crate) fn src(&self, operand: &Operand) -> Result<Src, EmuError> {
        match operand {
            Operand::Src(src) => Ok(*src),
            other => self.fail(format!("expected a register or value, found {other:?}")),
        }
    }

    pub(crate) fn dst(&self, operand: &Operand) -> Result<u16, EmuError> {
        match operand {
            Operand::Src(Src::Reg(reg)) => Ok(*reg),
            other => self.fail(format!("expected a destination register, found {other:?}")),
        }
    }

    pub(crate) fn pred(&self, operand: &Operand) -> Result<Pred, EmuError> {
        match operand {
            Operand::Pred(pred) => Ok(*pred),
            other => self.fail(format!("expected a predicate, found {other:?}")),
        }
    }

    pub(crate) fn ty(&self, text: &str) -> Result<Ty, EmuError> {
        match Ty::parse(text) {
            Some(ty) => Ok(ty),
            None if text == "pred" => self.unsupported("predicate-typed arithmetic"),
            None => self.fail(format!("unknown type .{text}")),
        }
    }

    fn instr(&self, tokens: &[Tok]) -> Result<Instr, EmuError> {
        let (guard, rest) = match tokens {
            [Tok::Punct('@'), Tok::Punct('!'), Tok::Word(p), rest @ ..] => (Some((p, true)), rest),
            [Tok::Punct('@'), Tok::Word(p), rest @ ..] => (Some((p, false)), rest),
            rest => (None, rest),
        };
        let guard = match guard {
            None => None,
            Some((name, negated)) => match self.scope.preds.get(name) {
                Some(&reg) => Some(Pred { reg, negated }),
                None => return self.fail(format!("{name} is not a predicate register")),
            },
        };
        let [Tok::Word(opcode), operand_tokens @ ..] = rest else {
            return self.fail(format!("expected an instruction, found {rest:?}"));
        };
        const KNOWN: [&str; 35] = [
            "mov", "cvta", "add", "sub", "mul", "div", "rem", "min", "max", "and", "or", "xor",
            "shl", "shr", "mad", "fma", "sqrt", "neg", "abs", "not", "setp", "selp", "cvt",
            "isspacep", "ld", "st", "atom", "red", "shfl", "bra", "bar", "barrier", "ret", "exit",
            "call",
        ];
        let base = opcode.split('.').next().unwrap_or("");
        if !KNOWN.contains(&base) {
            // Refused by name before its operands are read (they may be of forms this
            // parser does not know, like a texture's).
            return self.unsupported(format!("instruction {base}"));
        }
        if opcode == "call" || opcode.starts_with("call.") {
            return Ok(Instr {
                guard,
                op: self.call(opcode, operand_tokens)?,
                line: self.line,
            });
        }
        let mut operands = Vec::new();
        if !operand_tokens.is_empty() {
            let mut depth = 0;
            let mut start = 0;
            for (i, tok) in operand_tokens.iter().enumerate() {
                match tok {
                    Tok::Punct('[' | '{') => depth += 1,
                    Tok::Punct(']' | '}') => depth -= 1,
                    Tok::Punct(',') if depth == 0 => {
                        operands.push(self.operand(&operand_tokens[start..i])?);
                        start = i + 1;
                    }
                    _ => {}
                }
            }
            operands.push(self.operand(&operand_tokens[start..])?);
        }
        let op = self.op(opcode, &operands)?;
        Ok(Instr {
            guard,
            op,
            line: self.line,
        })
    }

    pub(crate) fn arity(
        &self,
        opcode: &str,
        operands: &[Operand],
        n: usize,
    ) -> Result<(), EmuError> {
        if operands.len() != n {
            return self.fail(format!(
                "{opcode} takes {n} operands, got {}",
                operands.len()
            ));
        }
        Ok(())
    }

    /// Float arithmetic modifiers: only `.rn` (or none) and, on f32, `.ftz`. Returns
    /// whether `.ftz` is set and whether `.rn` is.
    fn float_modifiers(
        &self,
        opcode: &str,
        modifiers: &[&str],
        ty: Ty,
    ) -> Result<(bool, bool), EmuError> {
        let mut ftz = false;
        let mut rn = false;
        for modifier in modifiers {
            match *modifier {
                "rn" => rn = true,
                "ftz" if ty.bits == 32 => ftz = true,
                "ftz" => return self.unsupported(format!("{opcode}: .ftz on f64")),
                other => {
                    return self.unsupported(format!(
                        "{opcode}: .{other} (only round-to-nearest .rn float arithmetic, \
                         .ftz on f32)"
                    ))
                }
            }
        }
        Ok((ftz, rn))
    }

    fn op(&self, opcode: &str, operands: &[Operand]) -> Result<Op, EmuError> {
        let parts: Vec<&str> = opcode.split('.').collect();
        let base = parts[0];
        let last = *parts.last().unwrap_or(&"");
        let middle = if parts.len() >= 2 {
            &parts[1..parts.len() - 1]
        } else {
            &[][..]
        };
        let n = |count| self.arity(opcode, operands, count);
        match base {
            "mov" if last == "pred" => self.pred_logic(opcode, PredOp::Mov, operands),
            "and" | "or" | "xor" | "not" if last == "pred" => {
                let op = match base {
                    "and" => PredOp::And,
                    "or" => PredOp::Or,
                    "xor" => PredOp::Xor,
                    _ => PredOp::Not,
                };
                self.pred_logic(opcode, op, operands)
            }
            "mov" => {
                n(2)?;
                let ty = self.ty(last)?;
                Ok(Op::Mov {
                    bits: ty.bits,
                    dst: self.dst(&operands[0])?,
                    src: self.src(&operands[1])?,
                })
            }
            "cvta" => {
                n(2)?;
                let (to, space) = match parts[..] {
                    ["cvta", "to", space, "u64"] => (true, space),
                    ["cvta", space, "u64"] => (false, space),
                    _ => return self.unsupported(format!("{opcode} (only 64-bit cvta)")),
                };
                let space = match space {
                    "global" => Space::Global,
                    "shared" => Space::Shared,
                    "local" => Space::Local,
                    other => return self.unsupported(format!("cvta of .{other}")),
                };
                Ok(Op::Cvta {
                    space,
                    to,
                    dst: self.dst(&operands[0])?,
                    src: self.src(&operands[1])?,
                })
            }
            "add" | "sub" | "mul" | "div" | "rem" | "min" | "max" | "and" | "or" | "xor"
            | "shl" | "shr" => {
                n(3)?;
                let ty = self.ty(last)?;
                let (dst, a, b) = (
                    self.dst(&operands[0])?,
                    self.src(&operands[1])?,
                    self.src(&operands[2])?,
                );
                if ty.kind == TyKind::F {
                    let (ftz, rn) = self.float_modifiers(opcode, middle, ty)?;
                    if base == "div" && !rn {
                        return self.unsupported(format!("{opcode}: only div.rn"));
                    }
                    let op = match base {
                        "add" => FloatOp::Add,
                        "sub" => FloatOp::Sub,
                        "mul" => FloatOp::Mul,
                        "div" => FloatOp::Div,
                        "min" => FloatOp::Min,
                        "max" => FloatOp::Max,
                        _ => return self.unsupported(format!("{opcode} on floats")),
                    };
                    return Ok(Op::Float {
                        op,
                        bits: ty.bits,
                        ftz,
                        dst,
                        a,
                        b,
                    });
                }
                let op = match (base, middle) {
                    ("add", []) => IntOp::Add,
                    ("sub", []) => IntOp::Sub,
                    ("mul", ["lo"]) => IntOp::MulLo,
                    ("mul", ["hi"]) => IntOp::MulHi,
                    ("mul", ["wide"]) if matches!(ty.bits, 16 | 32) && ty.kind != TyKind::B => {
                        return Ok(Op::MulWide { ty, dst, a, b });
                    }
                    ("div", []) => IntOp::Div,
                    ("rem", []) => IntOp::Rem,
                    ("min", []) => IntOp::Min,
                    ("max", []) => IntOp::Max,
                    ("and", []) => IntOp::And,
                    ("or", []) => IntOp::Or,
                    ("xor", []) => IntOp::Xor,
                    ("shl", []) => IntOp::Shl,
                    ("shr", []) => IntOp::Shr,
                    _ => return self.unsupported(opcode.to_owned()),
                };
                if ty.bits == 8 {
                    return self.unsupported(format!("{opcode}: 8-bit arithmetic"));
                }
                Ok(Op::Int { op, ty, dst, a, b })
            }
            "mad" | "fma" => {
                n(4)?;
                let ty = self.ty(last)?;
                let (dst, a, b, c) = (
                    self.dst(&operands[0])?,
                    self.src(&operands[1])?,
                    self.src(&operands[2])?,
                    self.src(&operands[3])?,
                );
                if ty.kind == TyKind::F {
                    // `mad.rn.f32` is the same fused operation as `fma.rn.f32`.
                    let (ftz, rn) = self.float_modifiers(opcode, middle, ty)?;
                    if !rn {
                        return self.unsupported(format!("{opcode}: only fma.rn"));
                    }
                    return Ok(Op::Fma {
                        bits: ty.bits,
                        ftz,
                        dst,
                        a,
                        b,
                        c,
                    });
                }
                if base != "mad" || middle != ["lo"] || ty.bits == 8 {
                    return self.unsupported(format!("{opcode}: only integer mad.lo"));
                }
                Ok(Op::MadLo { ty, dst, a, b, c })
            }
            "sqrt" => {
                n(2)?;
                let ty = self.ty(last)?;
                if ty.kind != TyKind::F {
                    return self.fail(format!("{opcode} of integers"));
                }
                let (ftz, rn) = self.float_modifiers(opcode, middle, ty)?;
                if !rn {
                    return self.unsupported(format!("{opcode}: only sqrt.rn"));
                }
                Ok(Op::Sqrt {
                    bits: ty.bits,
                    ftz,
                    dst: self.dst(&operands[0])?,
                    a: self.src(&operands[1])?,
                })
            }
            "neg" | "abs" | "not" => {
                n(2)?;
                let ty = self.ty(last)?;
                if !middle.is_empty() {
                    return self.unsupported(opcode.to_owned());
                }
                let op = match base {
                    "neg" => UnaryOp::Neg,
                    "abs" => UnaryOp::Abs,
                    _ => UnaryOp::Not,
                };
                Ok(Op::Unary {
                    op,
                    ty,
                    dst: self.dst(&operands[0])?,
                    a: self.src(&operands[1])?,
                })
            }
            "setp" => {
                let ty = self.ty(last)?;
                let ftz = middle.contains(&"ftz");
                if ftz
                    && ty
                        != (Ty {
                            kind: TyKind::F,
                            bits: 32,
                        })
                {
                    return self.unsupported(format!("{opcode}: .ftz other than on f32"));
                }
                let middle: Vec<&str> = middle.iter().copied().filter(|m| *m != "ftz").collect();
                let (cmp, combine) = match middle[..] {
                    [cmp] => (cmp, None),
                    [cmp, op] => (cmp, Some(op)),
                    _ => return self.unsupported(opcode.to_owned()),
                };
                let Some(cmp) = Cmp::parse(cmp) else {
                    return self.unsupported(format!("{opcode}: comparison .{cmp}"));
                };
                let combine = match combine {
                    None => {
                        n(3)?;
                        None
                    }
                    Some(op) => {
                        n(4)?;
                        let op = match op {
                            "and" => BoolOp::And,
                            "or" => BoolOp::Or,
                            "xor" => BoolOp::Xor,
                            other => return self.unsupported(format!("setp .{other}")),
                        };
                        Some((op, self.pred(&operands[3])?))
                    }
                };
                let Operand::Pred(dst) = &operands[0] else {
                    return self
                        .unsupported(format!("{opcode}: destination other than one predicate"));
                };
                if dst.negated {
                    return self.fail("negated destination predicate");
                }
                Ok(Op::Setp {
                    cmp,
                    ty,
                    ftz,
                    dst: dst.reg,
                    a: self.src(&operands[1])?,
                    b: self.src(&operands[2])?,
                    combine,
                })
            }
            "selp" => {
                n(4)?;
                let ty = self.ty(last)?;
                Ok(Op::Selp {
                    bits: ty.bits,
                    dst: self.dst(&operands[0])?,
                    a: self.src(&operands[1])?,
                    b: self.src(&operands[2])?,
                    pred: self.pred(&operands[3])?,
                })
            }
            "cvt" => {
                n(2)?;
                if parts.len() < 3 {
                    return self.fail("cvt needs two types");
                }
                let dst_ty = self.ty(parts[parts.len() - 2])?;
                let src_ty = self.ty(last)?;
                let mut rounding = None;
                let mut sat = false;
                for modifier in &parts[1..parts.len() - 2] {
                    match *modifier {
                        "rn" => rounding = Some(Rounding::Rn),
                        "rni" => rounding = Some(Rounding::Rni),
                        "rzi" => rounding = Some(Rounding::Rzi),
                        "rmi" => rounding = Some(Rounding::Rmi),
                        "rpi" => rounding = Some(Rounding::Rpi),
                        "sat" => sat = true,
                        other => return self.unsupported(format!("cvt modifier .{other}")),
                    }
                }
                crate::ops::check_cvt(dst_ty, src_ty, rounding, sat).map_err(|what| {
                    EmuError::Unsupported {
                        line: self.line,
                        what: format!("{opcode}: {what}"),
                    }
                })?;
                Ok(Op::Cvt {
                    dst_ty,
                    src_ty,
                    rounding,
                    sat,
                    dst: self.dst(&operands[0])?,
                    src: self.src(&operands[1])?,
                })
            }
            "isspacep" => {
                n(2)?;
                let space = match parts[..] {
                    ["isspacep", "global"] => Space::Global,
                    ["isspacep", "shared"] => Space::Shared,
                    ["isspacep", "local"] => Space::Local,
                    _ => return self.unsupported(opcode.to_owned()),
                };
                let dst = self.pred(&operands[0])?;
                if dst.negated {
                    return self.fail("negated destination predicate");
                }
                Ok(Op::IsSpace {
                    space,
                    dst: dst.reg,
                    a: self.src(&operands[1])?,
                })
            }
            "ld" | "st" => self.memory(opcode, &parts, operands),
            "atom" | "red" => self.atom(opcode, &parts, operands),
            "shfl" => self.shfl(opcode, &parts, operands),
            "bra" => {
                if !(parts.len() == 1 || parts[..] == ["bra", "uni"]) {
                    return self.unsupported(opcode.to_owned());
                }
                n(1)?;
                match &operands[0] {
                    Operand::Label(target) => Ok(Op::Bra { target: *target }),
                    other => self.fail(format!("bra to {other:?}")),
                }
            }
            "bar" | "barrier" => {
                let sync = matches!(
                    parts[..],
                    ["bar", "sync"] | ["barrier", "sync"] | ["barrier", "sync", "aligned"]
                );
                if !sync || operands.len() != 1 {
                    return self.unsupported(format!("{opcode} (only bar.sync 0)"));
                }
                match &operands[0] {
                    Operand::Src(Src::Imm(0)) => Ok(Op::Bar),
                    _ => self.unsupported(format!("{opcode} on a barrier other than 0")),
                }
            }
            "ret" => {
                n(0)?;
                Ok(Op::Ret)
            }
            "exit" => {
                n(0)?;
                Ok(Op::Exit)
            }
            other => self.unsupported(format!("instruction {other}")),
        }
    }
}
