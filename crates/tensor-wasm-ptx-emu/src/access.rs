//! Decoding of the instructions that touch memory or other threads and of calls: `ld`/`st`
//! in every state space, `atom`/`red`, `shfl.sync`, predicate logic and `call`.

use crate::decode::{Decoder, Operand};
use crate::ir::{AtomOp, Op, PredOp, ShflMode, Space, Src, TyKind};
use crate::parse::Tok;
use crate::EmuError;

impl Decoder<'_> {
    /// The state space of a memory instruction's modifiers (`None`: generic), its vector
    /// width, and the modifiers it ignores (cache hints, memory-model qualifiers).
    pub(crate) fn space_of(
        &self,
        opcode: &str,
        modifiers: &[&str],
    ) -> Result<(Space, usize), EmuError> {
        let mut space = Space::Generic;
        let mut width = 1;
        for modifier in modifiers {
            match *modifier {
                "global" => space = Space::Global,
                "shared" => space = Space::Shared,
                "param" => space = Space::Param,
                "local" => space = Space::Local,
                "v2" => width = 2,
                "v4" => width = 4,
                // Cache hints and memory-model qualifiers do not change what one thread reads
                // or writes here, where threads run one at a time.
                "ca" | "cg" | "cs" | "lu" | "cv" | "wb" | "wt" | "nc" | "relaxed" | "acquire"
                | "release" | "acq_rel" | "weak" | "volatile" | "cta" | "gpu" | "sys" => {}
                other => return self.unsupported(format!("{opcode}: .{other}")),
            }
        }
        Ok((space, width))
    }

    /// The space an address resolves to: a named symbol's own (a `.param` symbol may be the
    /// entry's or the frame's), else the instruction's.
    pub(crate) fn resolve(
        &self,
        opcode: &str,
        space: Space,
        symbol: Option<Space>,
    ) -> Result<Space, EmuError> {
        match (space, symbol) {
            (space, None) => Ok(space),
            (Space::Param, Some(s @ (Space::Param | Space::Frame))) => Ok(s),
            (Space::Generic, Some(s)) if s != Space::Param && s != Space::Frame => Ok(s),
            (space, Some(s)) if s == space => Ok(space),
            _ => self.fail(format!("{opcode}: symbol of another state space")),
        }
    }

    pub(crate) fn memory(
        &self,
        opcode: &str,
        parts: &[&str],
        operands: &[Operand],
    ) -> Result<Op, EmuError> {
        self.arity(opcode, operands, 2)?;
        let (space, width) = self.space_of(opcode, &parts[1..parts.len() - 1])?;
        let ty = self.ty(parts[parts.len() - 1])?;
        let (value, address) = if parts[0] == "ld" {
            (&operands[0], &operands[1])
        } else {
            (&operands[1], &operands[0])
        };
        let Operand::Addr(addr, symbol_space) = address else {
            return self.fail(format!("{opcode}: expected [address]"));
        };
        let space = self.resolve(opcode, space, *symbol_space)?;
        if space == Space::Param && (addr.base.is_some() || parts[0] == "st") {
            return self.unsupported(format!(
                "{opcode}: only ld.param of a named entry parameter"
            ));
        }
        if space == Space::Frame && addr.base.is_some() {
            return self.unsupported(format!("{opcode}: a .param variable through a register"));
        }
        let values: Vec<Src> = match value {
            Operand::Vector(values) => values.clone(),
            other => vec![self.src(other)?],
        };
        if values.len() != width {
            return self.fail(format!(
                "{opcode} takes {width} values, got {}",
                values.len()
            ));
        }
        if parts[0] == "ld" {
            let dsts = values
                .iter()
                .map(|v| match v {
                    Src::Reg(reg) => Ok(*reg),
                    other => self.fail(format!("ld into {other:?}")),
                })
                .collect::<Result<Vec<_>, _>>()?;
            Ok(Op::Ld {
                space,
                ty,
                dsts,
                addr: *addr,
            })
        } else {
            Ok(Op::St {
                space,
                ty,
                srcs: values,
                addr: *addr,
            })
        }
    }

    /// `atom[.space][.sem][.scope].op.type d, [a], b[, c]` and `red...  [a], b`.
    pub(crate) fn atom(
        &self,
        opcode: &str,
        parts: &[&str],
        operands: &[Operand],
    ) -> Result<Op, EmuError> {
        let red = parts[0] == "red";
        if parts.len() < 3 {
            return self.fail(format!("{opcode}: needs an operation and a type"));
        }
        let ty = self.ty(parts[parts.len() - 1])?;
        let op = match parts[parts.len() - 2] {
            "add" => AtomOp::Add,
            "min" => AtomOp::Min,
            "max" => AtomOp::Max,
            "inc" => AtomOp::Inc,
            "dec" => AtomOp::Dec,
            "and" => AtomOp::And,
            "or" => AtomOp::Or,
            "xor" => AtomOp::Xor,
            "exch" if !red => AtomOp::Exch,
            "cas" if !red => AtomOp::Cas,
            other => return self.unsupported(format!("{opcode}: operation .{other}")),
        };
        if ty.kind == TyKind::F {
            return self.unsupported(format!(
                "{opcode}: float atomics (their rounding is not modelled)"
            ));
        }
        let valid = match op {
            AtomOp::Add | AtomOp::Min | AtomOp::Max => {
                ty.kind != TyKind::B && matches!(ty.bits, 32 | 64)
            }
            AtomOp::Inc | AtomOp::Dec => ty.kind == TyKind::U && ty.bits == 32,
            _ => ty.kind == TyKind::B && matches!(ty.bits, 32 | 64),
        };
        if !valid {
            return self.unsupported(format!(
                "{opcode}: this operation on .{}",
                parts[parts.len() - 1]
            ));
        }
        let (space, width) = self.space_of(opcode, &parts[1..parts.len() - 2])?;
        if width != 1 || matches!(space, Space::Param | Space::Local) {
            return self.unsupported(format!(
                "{opcode}: only scalar atomics on global, shared or generic addresses"
            ));
        }
        let (dst, rest) = if red {
            (None, operands)
        } else {
            let Some((first, rest)) = operands.split_first() else {
                return self.fail(format!("{opcode} without operands"));
            };
            (Some(self.dst(first)?), rest)
        };
        let expected = if op == AtomOp::Cas { 3 } else { 2 };
        if rest.len() != expected {
            return self.fail(format!("{opcode}: wrong number of operands"));
        }
        let Operand::Addr(addr, symbol) = &rest[0] else {
            return self.fail(format!("{opcode}: expected [address]"));
        };
        let space = self.resolve(opcode, space, *symbol)?;
        Ok(Op::Atom {
            op,
            space,
            ty,
            dst,
            addr: *addr,
            b: self.src(&rest[1])?,
            c: rest.get(2).map(|c| self.src(c)).transpose()?,
        })
    }

    /// `shfl.sync.mode.b32 d[|p], a, b, c, membermask`.
    pub(crate) fn shfl(
        &self,
        opcode: &str,
        parts: &[&str],
        operands: &[Operand],
    ) -> Result<Op, EmuError> {
        let mode = match parts[..] {
            ["shfl", "sync", mode, "b32"] => mode,
            _ => return self.unsupported(format!("{opcode} (only shfl.sync.MODE.b32)")),
        };
        let mode = match mode {
            "up" => ShflMode::Up,
            "down" => ShflMode::Down,
            "bfly" => ShflMode::Bfly,
            "idx" => ShflMode::Idx,
            other => return self.unsupported(format!("{opcode}: mode .{other}")),
        };
        self.arity(opcode, operands, 5)?;
        let (dst, pred) = match &operands[0] {
            Operand::DstPred(dst, pred) => (*dst, Some(*pred)),
            other => (self.dst(other)?, None),
        };
        Ok(Op::Shfl {
            mode,
            dst,
            pred,
            a: self.src(&operands[1])?,
            b: self.src(&operands[2])?,
            c: self.src(&operands[3])?,
            mask: self.src(&operands[4])?,
        })
    }

    /// `and.pred d, a, b` (`or`, `xor`), `not.pred d, a`, `mov.pred d, a`.
    pub(crate) fn pred_logic(
        &self,
        opcode: &str,
        op: PredOp,
        operands: &[Operand],
    ) -> Result<Op, EmuError> {
        let unary = matches!(op, PredOp::Not | PredOp::Mov);
        self.arity(opcode, operands, if unary { 2 } else { 3 })?;
        let dst = self.pred(&operands[0])?;
        if dst.negated {
            return self.fail("negated destination predicate");
        }
        Ok(Op::PredLogic {
            op,
            dst: dst.reg,
            a: self.pred(&operands[1])?,
            b: if unary {
                None
            } else {
                Some(self.pred(&operands[2])?)
            },
        })
    }

    /// `call[.uni] [(ret),] name[, (args...)]`: a direct call. Indirect calls (through a
    /// register, with a prototype) are refused.
    pub(crate) fn call(&self, opcode: &str, tokens: &[Tok]) -> Result<Op, EmuError> {
        if !(opcode == "call" || opcode == "call.uni") {
            return self.unsupported(opcode.to_owned());
        }
        let mut rest = tokens;
        let mut ret_name = None;
        if let [Tok::Punct('('), Tok::Word(name), Tok::Punct(')'), Tok::Punct(','), more @ ..] =
            rest
        {
            ret_name = Some(name);
            rest = more;
        }
        let [Tok::Word(callee), more @ ..] = rest else {
            return self.fail(format!("{opcode}: expected a function name"));
        };
        rest = more;
        let mut arg_names = Vec::new();
        if let [Tok::Punct(','), Tok::Punct('('), more @ ..] = rest {
            let mut inner = more;
            loop {
                match inner {
                    [Tok::Punct(')')] => break,
                    [Tok::Word(name), Tok::Punct(','), tail @ ..] => {
                        arg_names.push(name);
                        inner = tail;
                    }
                    [Tok::Word(name), Tok::Punct(')')] => {
                        arg_names.push(name);
                        break;
                    }
                    _ => return self.fail(format!("{opcode}: malformed argument list")),
                }
            }
        } else if !rest.is_empty() {
            return self.unsupported(format!(
                "{opcode}: this form (indirect calls through a register are not run)"
            ));
        }
        if self.scope.regs.contains_key(callee.as_str()) {
            return self.unsupported(format!(
                "{opcode} through register {callee} (indirect call)"
            ));
        }
        let Some((index, decl)) = self.scope.funcs.get(callee.as_str()) else {
            return self.fail(format!("{opcode}: {callee} is not a declared function"));
        };
        if decl.external {
            return self.unsupported(format!("{opcode} of .extern function {callee}"));
        }
        if arg_names.len() != decl.params.len() || ret_name.is_some() != decl.ret.is_some() {
            return self.fail(format!(
                "{opcode}: {callee} takes {} parameters{}, the call passes {}{}",
                decl.params.len(),
                if decl.ret.is_some() {
                    " and returns a value"
                } else {
                    ""
                },
                arg_names.len(),
                if ret_name.is_some() {
                    " and takes a value"
                } else {
                    ""
                },
            ));
        }
        let frame_var = |name: &String| match self.scope.frame.get(name.as_str()) {
            Some(&offset) => Ok(offset),
            None => self.fail(format!("{opcode}: {name} is not a .param variable")),
        };
        Ok(Op::Call {
            func: *index,
            args: arg_names
                .into_iter()
                .map(frame_var)
                .collect::<Result<_, _>>()?,
            ret: ret_name.map(frame_var).transpose()?,
        })
    }
}
