//! The fencing rewrite: every access the verifier cannot prove in bounds is confined to the
//! memory its space allows, and every loop back-edge and function entry polls the cancel
//! word. The rewrite edits the text, so the fenced module reads like the tenant's own with
//! our instructions (registers `%tw_*`) before the accesses they guard.

use std::collections::{HashMap, HashSet};

use tensor_wasm_ptx_emu::lex::{parse_int, Tok, Token};

use crate::cfg;
use crate::group::{self, constant_addresses};
use crate::text::{type_bytes, Function, Space, Stmt, Text};
use crate::{Fenced, Refusal, FUNCTION_PARAMS, HIDDEN_PARAMS, SHARED_PAD};

/// One text edit: at byte `at`, drop `remove` bytes and insert `insert`.
struct Edit {
    at: usize,
    remove: usize,
    insert: String,
}

/// An address operand `[base+offset]`.
pub(crate) enum Base<'t> {
    Register(&'t str),
    Symbol(&'t str),
    Immediate(u64),
}

pub(crate) struct Address<'t> {
    pub base: Base<'t>,
    pub offset: i64,
    /// Bytes `start..end` of the whole `[...]`.
    start: usize,
    end: usize,
}

pub(crate) fn address(operand: &[Token]) -> Option<Address<'_>> {
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
pub(crate) fn space_of(opcode: &str) -> Space {
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
pub(crate) fn access_bytes(opcode: &str) -> Option<u64> {
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

/// The hidden values a function's fences and polls read, so its prologue loads only those.
#[derive(Default)]
struct Used {
    lo: bool,
    /// `hi − n` for each access size `n` used.
    tops: std::collections::BTreeSet<u64>,
    /// The shared size itself (calls pass it on).
    shared: bool,
    /// `shared − n` for each size of a shared access.
    shared_tops: std::collections::BTreeSet<u64>,
    /// The function's `.local` variable and its size, and `end − n` for each size.
    depot: Option<(String, u64)>,
    local_tops: std::collections::BTreeSet<u64>,
    cancel: bool,
}

/// The rewrite of one module.
pub(crate) struct Rewriter<'a> {
    ptx: &'a str,
    text: &'a Text,
    /// Functions that reach a barrier or warp operation.
    collective: HashSet<String>,
    edits: Vec<Edit>,
    calls: usize,
    /// What the current function's fences and polls read from the prologue.
    used: Used,
    /// The shared variables the current function can name (module-level ones and its own):
    /// name and size, the dynamic array with size `%tw_sh`.
    shared_vars: Vec<(String, String)>,
    /// The current function's groups of accesses and their members by statement.
    groups: Vec<group::Group>,
    members: HashMap<usize, group::Member>,
    pub fences: u32,
    pub polls: u32,
    pub proven: u32,
    /// Accesses covered by their group's fence.
    pub grouped_accesses: u32,
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
            used: Used::default(),
            groups: Vec::new(),
            members: HashMap::new(),
            shared_vars: Vec::new(),
            fences: 0,
            polls: 0,
            proven: 0,
            grouped_accesses: 0,
        }
    }

    /// Checks and rewrites every function.
    pub(crate) fn run(mut self) -> Result<Fenced, Refusal> {
        // Every fenced module has shared memory to bound generic shared addresses by.
        self.insert(
            self.text.header_end,
            format!("\n.shared .align 16 .b8 {SHARED_PAD}[16];\n"),
        );
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
            grouped: self.grouped_accesses,
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

        // Hidden parameters and registers; the prologue loads what the body uses (below).
        let names: &[&str] = if f.entry {
            &HIDDEN_PARAMS
        } else {
            &FUNCTION_PARAMS
        };
        let hidden: Vec<String> = names.iter().map(|p| format!(".param .u64 {p}")).collect();
        let separator = if f.params_empty { "" } else { ", " };
        self.insert(f.params_close, format!("{separator}{}", hidden.join(", ")));
        self.insert(
            f.body_open,
            "\n\t.reg .b64 %tw_lo, %tw_hi, %tw_sh, %tw_cancel, %tw_a, %tw_s, %tw_dl;\
             \n\t.reg .b64 %tw_shlo, %tw_shhi, %tw_x, %tw_y;\
             \n\t.reg .b32 %tw_c;\n\t.reg .pred %tw_p;\n"
                .to_owned(),
        );
        self.used = Used::default();
        if !f.entry {
            self.used.cancel = true;
        }
        let known = constant_addresses(f, &self.text.shared);
        let mut shared_vars: Vec<(String, String)> = self
            .text
            .shared
            .iter()
            .map(|(name, size)| (name.clone(), size.to_string()))
            .chain(
                f.vars
                    .iter()
                    .filter(|(_, (space, _))| *space == Space::Shared)
                    .map(|(name, (_, size))| (name.clone(), size.to_string())),
            )
            .collect();
        shared_vars.push((SHARED_PAD.into(), "16".into()));
        shared_vars.sort();
        if let Some(dynamic) = &self.text.dynamic_shared {
            shared_vars.push((dynamic.clone(), "%tw_sh".into()));
        }
        self.shared_vars = shared_vars;
        // Shared memory every launch of this function has: the variables it names.
        let named_shared: u64 = self
            .text
            .shared
            .iter()
            .filter(|(name, _)| {
                f.stmts
                    .iter()
                    .any(|s| s.tokens.iter().any(|t| t.tok == Tok::Word((*name).clone())))
            })
            .map(|(_, size)| *size)
            .chain(
                f.vars
                    .values()
                    .filter(|(space, _)| *space == Space::Shared)
                    .map(|(_, size)| *size),
            )
            .sum::<u64>();
        let depot_size = depot.as_ref().map_or(0, |(_, size)| *size);
        let (groups, members) = group::groups(f, &known, |space, span| match space {
            Space::Global => span <= 1 << 16,
            Space::Shared => span <= named_shared,
            Space::Local => span <= depot_size,
            _ => false,
        });
        self.groups = groups;
        self.members = members;
        for (i, stmt) in f.stmts.iter().enumerate() {
            let Some(opcode) = stmt.opcode() else {
                continue;
            };
            let base = opcode.split('.').next().unwrap_or("");
            match base {
                "ld" | "st" | "atom" | "red" => self.access(f, i, stmt, opcode, &depot, &known)?,
                "cvta" if opcode.starts_with("cvta.local") => {
                    return Err(refuse(
                        stmt,
                        self.ptx,
                        "the generic address of local memory (a local array passed by pointer): \
                         generic accesses are confined to global and shared memory"
                            .into(),
                    ))
                }
                // A backward branch closes a loop: poll before it.
                "bra" if f.branch_target(stmt).is_some_and(|t| t <= i) => {
                    self.insert(stmt.start, poll());
                    self.used.cancel = true;
                    self.polls += 1;
                }
                "call" => self.call(stmt),
                _ => {}
            }
        }
        let used = std::mem::take(&mut self.used);
        let mut setup = String::new();
        let mut declare = |prefix: &str, values: &std::collections::BTreeSet<u64>| {
            for v in values {
                setup.push_str(&format!("\t.reg .b64 {prefix}{v};\n"));
            }
        };
        declare("%tw_top", &used.tops);
        declare("%tw_st", &used.shared_tops);
        declare("%tw_lt", &used.local_tops);
        if !self.groups.is_empty() {
            setup.push_str(&format!("\t.reg .b64 %tw_g<{}>;\n", self.groups.len()));
        }
        let load = |setup: &mut String, reg: &str, param: &str| {
            setup.push_str(&format!("\tld.param.u64 {reg}, [{param}];\n"));
        };
        if used.lo {
            load(&mut setup, "%tw_lo", HIDDEN_PARAMS[0]);
        }
        if !used.tops.is_empty() {
            load(&mut setup, "%tw_hi", HIDDEN_PARAMS[1]);
        }
        for n in &used.tops {
            setup.push_str(&format!("\tsub.u64 %tw_top{n}, %tw_hi, {n};\n"));
        }
        let shared_bounds = used.shared || !used.shared_tops.is_empty();
        if shared_bounds && !f.entry {
            load(&mut setup, "%tw_shlo", FUNCTION_PARAMS[2]);
            load(&mut setup, "%tw_shhi", FUNCTION_PARAMS[3]);
        } else if shared_bounds {
            // The block's shared memory lies between the lowest variable and the end of the
            // highest (the dynamic array ends `%tw_sh` bytes after its start), wherever the
            // device places them: it may reserve the start of the window for itself. The
            // module always has one variable (the pad the rewrite declares).
            if self.text.dynamic_shared.is_some() {
                load(&mut setup, "%tw_sh", HIDDEN_PARAMS[2]);
            }
            for (k, (name, size)) in self.shared_vars.iter().enumerate() {
                let (lo, hi) = if k == 0 {
                    ("%tw_shlo", "%tw_shhi")
                } else {
                    ("%tw_x", "%tw_y")
                };
                setup.push_str(&format!(
                    "\tmov.u64 {lo}, {name};\n\tadd.u64 {hi}, {lo}, {size};\n"
                ));
                if k > 0 {
                    setup.push_str(
                        "\tmin.u64 %tw_shlo, %tw_shlo, %tw_x;\n\tmax.u64 %tw_shhi, %tw_shhi, %tw_y;\n",
                    );
                }
            }
        }
        for n in &used.shared_tops {
            setup.push_str(&format!("\tsub.u64 %tw_st{n}, %tw_shhi, {n};\n"));
        }
        if let Some((depot, size)) = &used.depot {
            setup.push_str(&format!("\tmov.u64 %tw_dl, {depot};\n"));
            for n in &used.local_tops {
                setup.push_str(&format!("\tadd.u64 %tw_lt{n}, %tw_dl, {};\n", size - n));
            }
        }
        if used.cancel {
            let cancel = if f.entry {
                HIDDEN_PARAMS[3]
            } else {
                FUNCTION_PARAMS[4]
            };
            load(&mut setup, "%tw_cancel", cancel);
            // The first poll tests this read.
            setup.push_str("\tld.volatile.global.u32 %tw_c, [%tw_cancel];\n");
        }
        if !f.entry {
            setup.push_str(&poll());
            self.polls += 1;
        }
        let first_instruction = f.stmts.iter().position(|s| !s.declaration);
        let setup_at = match first_instruction {
            Some(0) | None => f.body_open,
            Some(i) => f.stmts[i - 1].end,
        };
        self.insert(setup_at, format!("\n{setup}"));
        Ok(())
    }

    /// Fences one memory access, or proves it in bounds.
    fn access(
        &mut self,
        f: &Function,
        index: usize,
        stmt: &Stmt,
        opcode: &str,
        depot: &Option<(String, u64)>,
        known: &HashMap<String, (String, i64)>,
    ) -> Result<(), Refusal> {
        let operands = stmt.operands();
        let position = match opcode.split('.').next() {
            Some("ld") | Some("atom") => 1,
            _ => 0,
        };
        let space = space_of(opcode);
        let (Some(operand), Some(bytes)) = (operands.get(position), access_bytes(opcode)) else {
            return Err(refuse(
                stmt,
                self.ptx,
                "an access this verifier cannot read".into(),
            ));
        };
        let Some(mut addr) = address(operand) else {
            return Err(refuse(
                stmt,
                self.ptx,
                "an address this verifier cannot read".into(),
            ));
        };
        // A register holding a variable's address plus a constant is that variable.
        if let Base::Register(r) = addr.base {
            if let Some((symbol, offset)) = known.get(r) {
                let space_of_symbol = f.vars.get(symbol).map_or(Space::Shared, |(s, _)| *s);
                if space_of_symbol == space {
                    addr.base = Base::Symbol(symbol);
                    addr.offset += offset;
                }
            }
        }
        if let Some(member) = self.members.get(&index).copied() {
            self.grouped(stmt, &addr, member, depot);
            return Ok(());
        }
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
                // The dynamic shared array: fenced like a register address.
                None if space == Space::Shared
                    && self.text.dynamic_shared.as_deref() == Some(name) =>
                {
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
        // The address as one operand: the base register itself when it is 64 bits and there
        // is no offset, else computed into `reg`.
        let offset = addr.offset;
        let source = match addr.base {
            Base::Register(r) if f.regs.get(r) != Some(&32) && offset == 0 => r.to_owned(),
            Base::Register(r) if f.regs.get(r) != Some(&32) => {
                code.push_str(&format!("\tadd.s64 {reg}, {r}, {offset};\n"));
                reg.to_owned()
            }
            Base::Register(r) => {
                code.push_str(&format!("\tcvt.u64.u32 {reg}, {r};\n"));
                if offset != 0 {
                    code.push_str(&format!("\tadd.s64 {reg}, {reg}, {offset};\n"));
                }
                reg.to_owned()
            }
            Base::Symbol(s) => {
                code.push_str(&format!("\tmov.u64 {reg}, {s};\n"));
                if offset != 0 {
                    code.push_str(&format!("\tadd.s64 {reg}, {reg}, {offset};\n"));
                }
                reg.to_owned()
            }
            Base::Immediate(v) => {
                let value = v.wrapping_add(offset as u64);
                code.push_str(&format!("\tmov.u64 {reg}, {value};\n"));
                reg.to_owned()
            }
        };
        let mask = (bytes as i64).wrapping_neg();
        match space {
            Space::Shared => {
                self.used.shared_tops.insert(bytes);
                code.push_str(&format!(
                    "\tmax.u64 %tw_s, {source}, %tw_shlo;\n\tmin.u64 %tw_s, %tw_s, %tw_st{bytes};\n\
                     \tand.b64 %tw_s, %tw_s, {mask};\n"
                ));
            }
            Space::Local => {
                let Some((name, size)) = depot.clone().filter(|(_, size)| *size >= bytes) else {
                    return Err(refuse(
                        stmt,
                        self.ptx,
                        "a local access in a function without (enough) local variables".into(),
                    ));
                };
                self.used.depot = Some((name, size));
                self.used.local_tops.insert(bytes);
                code.push_str(&format!(
                    "\tmax.u64 %tw_s, {source}, %tw_dl;\n\tmin.u64 %tw_s, %tw_s, %tw_lt{bytes};\n\
                     \tand.b64 %tw_s, %tw_s, {mask};\n"
                ));
            }
            Space::Global => {
                self.used.lo = true;
                self.used.tops.insert(bytes);
                code.push_str(&format!(
                    "\tmax.u64 %tw_a, {source}, %tw_lo;\n\tmin.u64 %tw_a, %tw_a, %tw_top{bytes};\n\
                     \tand.b64 %tw_a, %tw_a, {mask};\n"
                ));
            }
            Space::Generic => {
                self.used.lo = true;
                self.used.tops.insert(bytes);
                self.used.shared_tops.insert(bytes);
                code.push_str(&format!(
                    "\tisspacep.shared %tw_p, {source};\n\tcvta.to.shared.u64 %tw_s, {source};\n\
                     \tmax.u64 %tw_s, %tw_s, %tw_shlo;\n\tmin.u64 %tw_s, %tw_s, %tw_st{bytes};\n\
                     \tand.b64 %tw_s, %tw_s, {mask};\n\
                     \tcvta.shared.u64 %tw_s, %tw_s;\n\tmax.u64 %tw_a, {source}, %tw_lo;\n\
                     \tmin.u64 %tw_a, %tw_a, %tw_top{bytes};\n\tand.b64 %tw_a, %tw_a, {mask};\n\
                     \tselp.b64 %tw_a, %tw_s, %tw_a, %tw_p;\n"
                ));
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

    /// An access of a group: the first computes the group's clamped register.
    fn grouped(
        &mut self,
        stmt: &Stmt,
        addr: &Address<'_>,
        member: group::Member,
        depot: &Option<(String, u64)>,
    ) {
        let k = member.group;
        let g = &self.groups[k];
        let reg = format!("%tw_g{k}");
        if member.first {
            let mut code = String::new();
            let source = if g.low != 0 {
                code.push_str(&format!("\tadd.s64 {reg}, {}, {};\n", g.register, g.low));
                reg.clone()
            } else {
                g.register.clone()
            };
            let (span, mask) = (g.span, (g.bytes as i64).wrapping_neg());
            match g.space {
                Space::Global => {
                    self.used.lo = true;
                    self.used.tops.insert(span);
                    code.push_str(&format!(
                        "\tmax.u64 {reg}, {source}, %tw_lo;\n\tmin.u64 {reg}, {reg}, %tw_top{span};\n"
                    ));
                }
                Space::Shared => {
                    self.used.shared_tops.insert(span);
                    code.push_str(&format!(
                        "\tmax.u64 {reg}, {source}, %tw_shlo;\n\tmin.u64 {reg}, {reg}, %tw_st{span};\n"
                    ));
                }
                _ => {
                    self.used.depot = depot.clone();
                    self.used.local_tops.insert(span);
                    code.push_str(&format!(
                        "\tmax.u64 {reg}, {source}, %tw_dl;\n\tmin.u64 {reg}, {reg}, %tw_lt{span};\n"
                    ));
                }
            }
            code.push_str(&format!("\tand.b64 {reg}, {reg}, {mask};\n"));
            self.insert(stmt.start, code);
            self.fences += 1;
        } else {
            self.grouped_accesses += 1;
        }
        let relative = if member.relative == 0 {
            String::new()
        } else {
            format!("+{}", member.relative)
        };
        self.edits.push(Edit {
            at: addr.start,
            remove: addr.end - addr.start,
            insert: format!("[{reg}{relative}]"),
        });
    }

    /// Passes the hidden parameters on at a call.
    fn call(&mut self, stmt: &Stmt) {
        self.calls += 1;
        self.used.lo = true;
        self.used.shared = true;
        self.used.cancel = true;
        for n in [1, 2, 4, 8, 16] {
            self.used.tops.insert(n);
        }
        let n = self.calls;
        let mut before = String::new();
        let mut names = Vec::new();
        for (k, reg) in ["%tw_lo", "%tw_hi", "%tw_shlo", "%tw_shhi", "%tw_cancel"]
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

/// The cancellation poll, pipelined: the thread ends if the cancel word was set when the
/// previous poll read it, then reads it again for the next poll. The read's latency (a
/// trip to L2: volatile loads skip L1) overlaps the loop body instead of stalling it;
/// cancellation takes effect one poll later.
fn poll() -> String {
    "\tsetp.ne.u32 %tw_p, %tw_c, 0;\n\t@%tw_p exit;\n\
     \tld.volatile.global.u32 %tw_c, [%tw_cancel];\n"
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
