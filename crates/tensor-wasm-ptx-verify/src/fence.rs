//! The fencing rewrite: every access the verifier cannot prove in bounds is confined to the
//! memory its space allows, and every loop back-edge and function entry polls the cancel
//! word. The rewrite edits the text, so the fenced module reads like the tenant's own with
//! our instructions (registers `%tw_*`) before the accesses they guard.

use std::collections::HashSet;

use tensor_wasm_ptx_emu::lex::{parse_int, Tok, Token};

use crate::cfg;
use crate::text::{type_bytes, Function, Space, Stmt, Text};
use crate::{Fenced, Refusal, HIDDEN_PARAMS};

/// One text edit: at byte `at`, drop `remove` bytes and insert `insert`.
struct Edit {
    at: usize,
    remove: usize,
    insert: String,
}

/// An address operand `[base+offset]`.
enum Base<'t> {
    Register(&'t str),
    Symbol(&'t str),
    Immediate(u64),
}

struct Address<'t> {
    base: Base<'t>,
    offset: i64,
    /// Bytes `start..end` of the whole `[...]`.
    start: usize,
    end: usize,
}

fn address(operand: &[Token]) -> Option<Address<'_>> {
    let [first, inner @ .., last] = operand else {
        return None;
    };
    if first.tok != Tok::Punct('[') || last.tok != Tok::Punct(']') {
        return None;
    }
    let (head, offset) = match inner {
        [head] => (head, 0),
        [head, sign, Token {
            tok: Tok::Num(n), ..
        }] => {
            let value = parse_int(n)? as i64;
            match sign.tok {
                Tok::Punct('+') => (head, value),
                Tok::Punct('-') => (head, -value),
                _ => return None,
            }
        }
        [head, Token {
            tok: Tok::Punct('+'),
            ..
        }, Token {
            tok: Tok::Punct('-'),
            ..
        }, Token {
            tok: Tok::Num(n), ..
        }] => (head, -(parse_int(n)? as i64)),
        _ => return None,
    };
    let base = match &head.tok {
        Tok::Word(w) if w.starts_with('%') => Base::Register(w),
        Tok::Word(w) => Base::Symbol(w),
        Tok::Num(n) => Base::Immediate(parse_int(n)?),
        _ => return None,
    };
    Some(Address {
        base,
        offset,
        start: first.start,
        end: last.end,
    })
}

/// The space named by an opcode's modifiers (none: generic).
fn space_of(opcode: &str) -> Space {
    for part in opcode.split('.').skip(1) {
        match part {
            "global" => return Space::Global,
            "shared" => return Space::Shared,
            "local" => return Space::Local,
            "param" => return Space::Param,
            _ => {}
        }
    }
    Space::Generic
}

/// Bytes one access moves: its type's size times its vector width.
fn access_bytes(opcode: &str) -> Option<u64> {
    let parts: Vec<&str> = opcode.split('.').collect();
    let width = if parts.contains(&"v4") {
        4
    } else if parts.contains(&"v2") {
        2
    } else {
        1
    };
    Some(type_bytes(parts.last()?)? * width)
}

/// `log2` of an access size, the index of its `%tw_top` register.
fn top(bytes: u64) -> u32 {
    bytes.trailing_zeros()
}

/// The rewrite of one module.
pub(crate) struct Rewriter<'a> {
    ptx: &'a str,
    text: &'a Text,
    /// Functions that reach a barrier or warp operation.
    collective: HashSet<String>,
    edits: Vec<Edit>,
    calls: usize,
    pub fences: u32,
    pub polls: u32,
    pub proven: u32,
}

fn refuse(stmt: &Stmt, ptx: &str, reason: String) -> Refusal {
    let end = ptx[stmt.start..]
        .find(';')
        .map_or(ptx.len(), |e| stmt.start + e);
    Refusal {
        line: stmt.line,
        instruction: ptx[stmt.start..end]
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" "),
        reason,
    }
}

impl<'a> Rewriter<'a> {
    pub(crate) fn new(ptx: &'a str, text: &'a Text) -> Self {
        // Functions holding a collective, then their callers, to a fixed point.
        let mut collective: HashSet<String> = HashSet::new();
        loop {
            let before = collective.len();
            for f in &text.functions {
                let reaches = f.stmts.iter().any(|s| {
                    s.opcode().is_some_and(cfg::collective)
                        || (s.opcode().is_some_and(|o| o.starts_with("call"))
                            && callee(s).is_some_and(|c| collective.contains(c)))
                });
                if reaches {
                    collective.insert(f.name.clone());
                }
            }
            if collective.len() == before {
                break;
            }
        }
        Rewriter {
            ptx,
            text,
            collective,
            edits: Vec::new(),
            calls: 0,
            fences: 0,
            polls: 0,
            proven: 0,
        }
    }

    /// Checks and rewrites every function.
    pub(crate) fn run(mut self) -> Result<Fenced, Refusal> {
        for f in &self.text.functions {
            self.function(f)?;
        }
        let mut edits = std::mem::take(&mut self.edits);
        edits.sort_by_key(|e| std::cmp::Reverse(e.at));
        let mut out = self.ptx.to_owned();
        for edit in edits {
            out.replace_range(edit.at..edit.at + edit.remove, &edit.insert);
        }
        Ok(Fenced {
            ptx: out,
            kernels: self
                .text
                .functions
                .iter()
                .filter(|f| f.entry)
                .map(|f| f.name.clone())
                .collect(),
            fences: self.fences,
            polls: self.polls,
            proven: self.proven,
        })
    }

    fn insert(&mut self, at: usize, text: String) {
        self.edits.push(Edit {
            at,
            remove: 0,
            insert: text,
        });
    }

    fn function(&mut self, f: &Function) -> Result<(), Refusal> {
        // Collectives only where every thread of the block arrives.
        let flow = cfg::analyse(f);
        for (i, stmt) in f.stmts.iter().enumerate() {
            let Some(opcode) = stmt.opcode() else {
                continue;
            };
            let reaches = cfg::collective(opcode)
                || (opcode.starts_with("call")
                    && callee(stmt).is_some_and(|c| self.collective.contains(c)));
            if let (true, Some(branch)) = (reaches, flow.region_of[i]) {
                return Err(refuse(
                    stmt,
                    self.ptx,
                    format!(
                        "a barrier or warp operation that only some threads may reach: it \
                         depends on the branch at PTX line {}, whose condition differs \
                         between threads (a thread waiting there could never be cancelled)",
                        f.stmts[branch].line
                    ),
                ));
            }
        }
        let locals: Vec<(&String, u64)> = f
            .vars
            .iter()
            .filter(|(_, (space, _))| *space == Space::Local)
            .map(|(name, (_, size))| (name, *size))
            .collect();
        if locals.len() > 1 {
            let stmt = f
                .stmts
                .iter()
                .find(|s| s.declaration)
                .unwrap_or(&f.stmts[0]);
            return Err(refuse(
                stmt,
                self.ptx,
                "more than one .local variable in a function (NVRTC declares one depot)".into(),
            ));
        }
        let depot = locals.first().map(|(name, size)| ((*name).clone(), *size));

        // Hidden parameters, registers and the prologue.
        let hidden: Vec<String> = HIDDEN_PARAMS
            .iter()
            .map(|p| format!(".param .u64 {p}"))
            .collect();
        let separator = if f.params_empty { "" } else { ", " };
        self.insert(f.params_close, format!("{separator}{}", hidden.join(", ")));
        let prologue = String::from(
            "\n\t.reg .b64 %tw_lo, %tw_hi, %tw_sh, %tw_cancel, %tw_a, %tw_s, %tw_b, %tw_top<5>;\
             \n\t.reg .b32 %tw_c;\n\t.reg .pred %tw_p;\n",
        );
        let mut setup = String::new();
        for (reg, param) in ["%tw_lo", "%tw_hi", "%tw_sh", "%tw_cancel"]
            .iter()
            .zip(HIDDEN_PARAMS)
        {
            setup.push_str(&format!("\tld.param.u64 {reg}, [{param}];\n"));
        }
        for k in 0..5 {
            setup.push_str(&format!("\tsub.u64 %tw_top{k}, %tw_hi, {};\n", 1u64 << k));
        }
        if !f.entry {
            setup.push_str(&poll());
            self.polls += 1;
        }
        self.insert(f.body_open, prologue);
        let first_instruction = f.stmts.iter().position(|s| !s.declaration);
        let setup_at = match first_instruction {
            Some(0) | None => f.body_open,
            Some(i) => f.stmts[i - 1].end,
        };
        self.insert(setup_at, format!("\n{setup}"));

        for (i, stmt) in f.stmts.iter().enumerate() {
            let Some(opcode) = stmt.opcode() else {
                continue;
            };
            let base = opcode.split('.').next().unwrap_or("");
            match base {
                "ld" | "st" | "atom" | "red" => self.access(f, stmt, opcode, &depot)?,
                "cvta" if opcode.starts_with("cvta.local") => {
                    return Err(refuse(
                        stmt,
                        self.ptx,
                        "the generic address of local memory (a local array passed by pointer): \
                         generic accesses are confined to global and shared memory"
                            .into(),
                    ))
                }
                "bra" => {
                    let target = stmt
                        .operands()
                        .first()
                        .and_then(|o| o.first())
                        .and_then(|t| match &t.tok {
                            Tok::Word(l) => f.labels.get(l).copied(),
                            _ => None,
                        });
                    if target.is_some_and(|t| t <= i) {
                        self.insert(stmt.start, poll());
                        self.polls += 1;
                    }
                }
                "call" => self.call(stmt),
                _ => {}
            }
        }
        Ok(())
    }

    /// Fences one memory access, or proves it in bounds.
    fn access(
        &mut self,
        f: &Function,
        stmt: &Stmt,
        opcode: &str,
        depot: &Option<(String, u64)>,
    ) -> Result<(), Refusal> {
        let operands = stmt.operands();
        let index = match opcode.split('.').next() {
            Some("ld") | Some("atom") => 1,
            _ => 0,
        };
        let space = space_of(opcode);
        let (Some(operand), Some(bytes)) = (operands.get(index), access_bytes(opcode)) else {
            return Err(refuse(
                stmt,
                self.ptx,
                "an access this verifier cannot read".into(),
            ));
        };
        let Some(addr) = address(operand) else {
            return Err(refuse(
                stmt,
                self.ptx,
                "an address this verifier cannot read".into(),
            ));
        };
        // Symbols with constant offsets: proven in bounds, or refused.
        if let Base::Symbol(name) = addr.base {
            let size = f
                .vars
                .get(name)
                .map(|(_, size)| *size)
                .or_else(|| self.text.shared.get(name).copied());
            return match size {
                Some(size)
                    if size > 0 && addr.offset >= 0 && addr.offset as u64 + bytes <= size =>
                {
                    self.proven += 1;
                    Ok(())
                }
                // An unsized (dynamic) shared array: fenced like a register address.
                Some(0) if space == Space::Shared => {
                    self.fence(f, stmt, &addr, space, bytes, depot)
                }
                _ => Err(refuse(
                    stmt,
                    self.ptx,
                    format!(
                        "{bytes} bytes at {name}{:+} are outside the variable",
                        addr.offset
                    ),
                )),
            };
        }
        if space == Space::Param {
            return Err(refuse(
                stmt,
                self.ptx,
                "a parameter through a register".into(),
            ));
        }
        self.fence(f, stmt, &addr, space, bytes, depot)
    }

    fn fence(
        &mut self,
        f: &Function,
        stmt: &Stmt,
        addr: &Address<'_>,
        space: Space,
        bytes: u64,
        depot: &Option<(String, u64)>,
    ) -> Result<(), Refusal> {
        let mut code = String::new();
        let reg = match space {
            Space::Shared | Space::Local => "%tw_s",
            _ => "%tw_a",
        };
        match addr.base {
            Base::Register(r) if f.regs.get(r) == Some(&32) => {
                code.push_str(&format!("\tcvt.u64.u32 {reg}, {r};\n"))
            }
            Base::Register(r) => code.push_str(&format!("\tmov.u64 {reg}, {r};\n")),
            Base::Symbol(s) => code.push_str(&format!("\tmov.u64 {reg}, {s};\n")),
            Base::Immediate(v) => code.push_str(&format!("\tmov.u64 {reg}, {v};\n")),
        }
        if addr.offset != 0 {
            code.push_str(&format!("\tadd.s64 {reg}, {reg}, {};\n", addr.offset));
        }
        let mask = (bytes as i64).wrapping_neg();
        let shared_clamp = |code: &mut String| {
            // Offsets are unsigned: one bound; %tw_sh is at least 16 (the runtime's promise).
            code.push_str(&format!(
                "\tsub.u64 %tw_b, %tw_sh, {bytes};\n\tmin.u64 %tw_s, %tw_s, %tw_b;\n\
                 \tand.b64 %tw_s, %tw_s, {mask};\n"
            ));
        };
        let global_clamp = |code: &mut String| {
            code.push_str(&format!(
                "\tmax.u64 %tw_a, %tw_a, %tw_lo;\n\tmin.u64 %tw_a, %tw_a, %tw_top{};\n\
                 \tand.b64 %tw_a, %tw_a, {mask};\n",
                top(bytes)
            ));
        };
        match space {
            Space::Shared => shared_clamp(&mut code),
            Space::Local => {
                let Some((name, size)) = depot.clone().filter(|(_, size)| *size >= bytes) else {
                    return Err(refuse(
                        stmt,
                        self.ptx,
                        "a local access in a function without (enough) local variables".into(),
                    ));
                };
                code.push_str(&format!(
                    "\tmov.u64 %tw_b, {name};\n\tmax.u64 %tw_s, %tw_s, %tw_b;\n\
                     \tadd.u64 %tw_b, %tw_b, {};\n\tmin.u64 %tw_s, %tw_s, %tw_b;\n\
                     \tand.b64 %tw_s, %tw_s, {mask};\n",
                    size - bytes
                ));
            }
            Space::Global => global_clamp(&mut code),
            Space::Generic => {
                code.push_str(
                    "\tisspacep.shared %tw_p, %tw_a;\n\tcvta.to.shared.u64 %tw_s, %tw_a;\n",
                );
                shared_clamp(&mut code);
                code.push_str("\tcvta.shared.u64 %tw_s, %tw_s;\n");
                global_clamp(&mut code);
                code.push_str("\tselp.b64 %tw_a, %tw_s, %tw_a, %tw_p;\n");
            }
            Space::Param => unreachable!("parameters are refused before"),
        }
        self.insert(stmt.start, code);
        self.edits.push(Edit {
            at: addr.start,
            remove: addr.end - addr.start,
            insert: format!("[{reg}]"),
        });
        self.fences += 1;
        Ok(())
    }

    /// Passes the hidden parameters on at a call.
    fn call(&mut self, stmt: &Stmt) {
        self.calls += 1;
        let n = self.calls;
        let mut before = String::new();
        let mut names = Vec::new();
        for (k, reg) in ["%tw_lo", "%tw_hi", "%tw_sh", "%tw_cancel"]
            .iter()
            .enumerate()
        {
            let name = format!("__tw_call{n}_{k}");
            before.push_str(&format!(
                "\t.param .b64 {name};\n\tst.param.b64 [{name}], {reg};\n"
            ));
            names.push(name);
        }
        self.insert(stmt.start, before);
        let last = stmt.tokens.last().expect("a call has tokens");
        if last.tok == Tok::Punct(')') && stmt.tokens.len() > 2 {
            let has_args = stmt
                .tokens
                .iter()
                .rev()
                .nth(1)
                .is_some_and(|t| t.tok != Tok::Punct('('));
            let separator = if has_args { ", " } else { "" };
            self.insert(last.start, format!("{separator}{}", names.join(", ")));
        } else {
            self.insert(last.end, format!(", ({})", names.join(", ")));
        }
    }
}

/// The cancellation poll: the thread ends once the host has set the cancel word.
fn poll() -> String {
    "\tld.volatile.global.u32 %tw_c, [%tw_cancel];\n\tsetp.ne.u32 %tw_p, %tw_c, 0;\n\
     \t@%tw_p exit;\n"
        .to_owned()
}

/// The function a direct call names.
fn callee(stmt: &Stmt) -> Option<&str> {
    let mut tokens = stmt
        .tokens
        .iter()
        .skip_while(|t| !matches!(&t.tok, Tok::Word(w) if w.starts_with("call")));
    tokens.next()?;
    let mut depth = 0;
    for t in tokens {
        match &t.tok {
            Tok::Punct('(') => depth += 1,
            Tok::Punct(')') => depth -= 1,
            Tok::Word(w) if depth == 0 => return Some(w),
            _ => {}
        }
    }
    None
}
