//! The PTX parser: module directives, `.shared` variables, `.entry` functions with their
//! parameters, registers, labels and instructions, decoded by `decode.rs`.

use crate::decode::{decode, Scope};
use crate::ir::{Instr, Ty};
pub(crate) use crate::lex::{lex, parse_int, Tok, Token};

use crate::memory::SHARED_BASE;
use crate::EmuError;

/// Most bytes of kernel parameters (CUDA's limit is 32 764 since 12.1).
const MAX_PARAM_BYTES: u32 = 32 * 1024;

/// Most bytes of static shared memory an entry may declare.
const MAX_STATIC_SHARED: u64 = 1 << 20;

/// Most bytes of `.local` variables one function may declare.
const MAX_LOCAL: u64 = 512 * 1024;

/// A parsed PTX module: its entries, ready to launch.
#[derive(Debug, Clone)]
pub struct Module {
    kernels: Vec<Kernel>,
}

/// The code of an entry or a `.func`, and the memory one call of it needs.
#[derive(Debug, Clone, Default)]
pub(crate) struct Func {
    pub name: String,
    pub instrs: Vec<Instr>,
    pub regs: u16,
    pub preds: u16,
    /// Bytes of the frame's parameter space: a `.func`'s parameters and return value, then
    /// the `.param` variables of the calls it makes.
    pub frame_bytes: u32,
    /// Bytes of the frame's `.local` variables.
    pub local_bytes: u32,
    /// Offset and size of each parameter in the frame.
    pub params: Vec<(u32, u32)>,
    /// Offset and size of the return value in the frame.
    pub ret: Option<(u32, u32)>,
}

/// One `.entry` of a module.
#[derive(Debug, Clone)]
pub struct Kernel {
    pub(crate) name: String,
    pub(crate) params: Vec<ParamInfo>,
    pub(crate) param_bytes: u32,
    /// The entry's own code.
    pub(crate) body: Func,
    /// Every `.func` of the module, which `call` names by index.
    pub(crate) funcs: std::sync::Arc<Vec<Func>>,
    /// Static shared bytes (module-level variables, then this entry's own).
    pub(crate) shared_bytes: u32,
    /// Whether an `.extern .shared` array takes the dynamic shared memory.
    pub(crate) dynamic_shared: bool,
}

/// One kernel parameter: where it lies in the parameter buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamInfo {
    /// Its PTX name.
    pub name: String,
    /// Byte offset in the packed parameter buffer (aligned to `align`).
    pub offset: u32,
    /// Size in bytes.
    pub size: u32,
    /// Alignment in bytes.
    pub align: u32,
}

impl Module {
    /// Parses PTX text.
    ///
    /// Read: `.version`, `.target`, `.address_size 64`; `.shared` variables at module level
    /// and in a function (`.extern .shared` arrays take the launch's dynamic shared memory);
    /// `.visible .entry` with `.param` scalars and `.b8` arrays; `.func` definitions and
    /// prototypes with parameters and a return value; in a body `.reg`, `.local` and `.param`
    /// variables, labels, guards `@%p` / `@!%p`; and the instructions `mov`, `cvta` (to and
    /// from `.global`, `.shared`, `.local`), `add`, `sub`, `mul` (`.lo`, `.hi`, `.wide`),
    /// `mad.lo`, `fma.rn`, `div`, `rem`, `min`, `max`, `sqrt.rn`, `and`, `or`, `xor`, `not`
    /// (predicates too), `neg`, `abs`, `shl`, `shr`, `setp` (with `.and`/`.or`/`.xor`),
    /// `selp`, `cvt`, `ld`/`st` on `.global`, `.shared`, `.local`, `.param` and generic
    /// addresses with `.v2`/`.v4`, integer `atom`/`red` (`add`, `min`, `max`, `inc`, `dec`,
    /// `and`, `or`, `xor`, `exch`, `cas`), `shfl.sync`, `bra`, `bar.sync 0`, `call` (direct),
    /// `ret`, `exit`. Float arithmetic is f32 or f64, `.rn` (or unmodified), optionally `.ftz`
    /// on f32; other roundings, `.sat` on floats, approximate forms, float atomics, indirect
    /// calls, textures and other warp operations are [`EmuError::Unsupported`].
    ///
    /// # Errors
    /// [`EmuError::Parse`] for malformed text, [`EmuError::Unsupported`] for PTX outside the
    /// subset, each with its line.
    pub fn parse(text: &str) -> Result<Module, EmuError> {
        let tokens = lex(text)?;
        Parser {
            tokens,
            at: 0,
            shared: Vec::new(),
            shared_end: 0,
            dynamic_name: None,
            kernels: Vec::new(),
            funcs: Vec::new(),
        }
        .module()
    }

    /// The entry named `name`.
    pub fn kernel(&self, name: &str) -> Option<&Kernel> {
        self.kernels.iter().find(|kernel| kernel.name == name)
    }

    /// Every entry, in source order.
    pub fn kernels(&self) -> &[Kernel] {
        &self.kernels
    }
}

impl Kernel {
    /// The entry name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The parameters, in order.
    pub fn params(&self) -> &[ParamInfo] {
        &self.params
    }

    /// Bytes of the packed parameter buffer.
    pub fn param_bytes(&self) -> u32 {
        self.param_bytes
    }

    /// Static shared memory per block, in bytes.
    pub fn static_shared_bytes(&self) -> u32 {
        self.shared_bytes
    }

    /// Whether the entry declares an `.extern .shared` array (dynamic shared memory).
    pub fn uses_dynamic_shared(&self) -> bool {
        self.dynamic_shared
    }

    /// Instructions in the entry (not counting the functions it calls).
    pub fn instruction_count(&self) -> usize {
        self.body.instrs.len()
    }

    /// The code of function `index` (`None`: the entry's own).
    pub(crate) fn code(&self, index: Option<u32>) -> &Func {
        match index {
            None => &self.body,
            Some(i) => &self.funcs[i as usize],
        }
    }

    /// Packs one byte string per parameter (each exactly the parameter's size) into the
    /// parameter buffer a launch takes, padding each to its alignment.
    ///
    /// # Errors
    /// [`EmuError::InvalidLaunch`] for a wrong count or size.
    pub fn pack_params(&self, values: &[&[u8]]) -> Result<Vec<u8>, EmuError> {
        let invalid = |reason: String| EmuError::InvalidLaunch {
            kernel: self.name.clone(),
            reason,
        };
        if values.len() != self.params.len() {
            return Err(invalid(format!(
                "{} parameters given, the entry takes {}",
                values.len(),
                self.params.len()
            )));
        }
        let mut out = vec![0u8; self.param_bytes as usize];
        for (param, value) in self.params.iter().zip(values) {
            if value.len() != param.size as usize {
                return Err(invalid(format!(
                    "parameter {} takes {} bytes, got {}",
                    param.name,
                    param.size,
                    value.len()
                )));
            }
            let start = param.offset as usize;
            out[start..start + value.len()].copy_from_slice(value);
        }
        Ok(out)
    }
}

/// A shared variable: its name and byte offset in the block's shared memory.
#[derive(Debug, Clone)]
pub(crate) struct SharedVar {
    pub name: String,
    pub offset: u32,
}

pub(crate) struct Parser {
    tokens: Vec<Token>,
    at: usize,
    /// Module-level shared variables.
    shared: Vec<SharedVar>,
    shared_end: u32,
    /// The name of the `.extern .shared` array, if any: the dynamic shared memory.
    dynamic_name: Option<String>,
    kernels: Vec<Kernel>,
    /// Every `.func` declared so far, in order (the index `call` uses), with its body once
    /// defined.
    funcs: Vec<(FuncDecl, Option<Func>)>,
}

/// What a call needs to know of a function: its name and the frame layout of its
/// parameters and return value.
#[derive(Debug, Clone)]
pub(crate) struct FuncDecl {
    pub name: String,
    pub params: Vec<(u32, u32)>,
    pub ret: Option<(u32, u32)>,
    /// Names of the parameters and the return value, in the frame.
    names: Vec<(String, u32)>,
    frame_end: u32,
    pub external: bool,
}

impl Parser {
    fn line(&self) -> u32 {
        self.tokens
            .get(self.at)
            .or(self.tokens.last())
            .map_or(0, |t| t.line)
    }

    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.at).map(|t| &t.tok)
    }

    fn next(&mut self) -> Result<Tok, EmuError> {
        let token = self.tokens.get(self.at).ok_or_else(|| EmuError::Parse {
            line: self.line(),
            message: "unexpected end of text".into(),
        })?;
        self.at += 1;
        Ok(token.tok.clone())
    }

    pub(crate) fn fail<T>(&self, message: impl Into<String>) -> Result<T, EmuError> {
        Err(EmuError::Parse {
            line: self.line(),
            message: message.into(),
        })
    }

    pub(crate) fn unsupported<T>(&self, what: impl Into<String>) -> Result<T, EmuError> {
        Err(EmuError::Unsupported {
            line: self.line(),
            what: what.into(),
        })
    }

    fn expect(&mut self, c: char) -> Result<(), EmuError> {
        match self.next()? {
            Tok::Punct(p) if p == c => Ok(()),
            other => {
                self.at -= 1;
                self.fail(format!("expected {c:?}, found {other:?}"))
            }
        }
    }

    fn eat(&mut self, c: char) -> bool {
        if self.peek() == Some(&Tok::Punct(c)) {
            self.at += 1;
            return true;
        }
        false
    }

    fn word(&mut self) -> Result<String, EmuError> {
        match self.next()? {
            Tok::Word(word) => Ok(word),
            other => {
                self.at -= 1;
                self.fail(format!("expected a name, found {other:?}"))
            }
        }
    }

    fn number(&mut self) -> Result<u64, EmuError> {
        match self.next()? {
            Tok::Num(text) => match parse_int(&text) {
                Some(value) => Ok(value),
                None => self.fail(format!("bad number {text}")),
            },
            other => {
                self.at -= 1;
                self.fail(format!("expected a number, found {other:?}"))
            }
        }
    }

    fn module(mut self) -> Result<Module, EmuError> {
        while let Some(tok) = self.peek().cloned() {
            let Tok::Word(word) = tok else {
                return self.fail(format!("unexpected {tok:?} at module level"));
            };
            match word.as_str() {
                ".version" => {
                    self.at += 1;
                    self.next()?;
                }
                ".target" => {
                    self.at += 1;
                    self.word()?;
                    while self.eat(',') {
                        self.word()?;
                    }
                }
                ".address_size" => {
                    self.at += 1;
                    if self.number()? != 64 {
                        return self.unsupported("address size other than 64");
                    }
                }
                ".visible" | ".weak" | ".extern" | ".entry" | ".shared" | ".func" | ".global"
                | ".const" => self.declaration()?,
                other => return self.fail(format!("unexpected {other} at module level")),
            }
        }
        let mut funcs = Vec::with_capacity(self.funcs.len());
        let defined: Vec<bool> = self.funcs.iter().map(|(_, body)| body.is_some()).collect();
        for (decl, body) in self.funcs {
            // A declared function without a body is only an error when something calls it
            // (the call's decoding checked that it is not `.extern`).
            funcs.push(body.unwrap_or_else(|| Func {
                name: decl.name,
                ..Func::default()
            }));
        }
        let funcs = std::sync::Arc::new(funcs);
        let mut kernels = self.kernels;
        for kernel in &mut kernels {
            kernel.funcs = funcs.clone();
        }
        let bodies: Vec<&Func> = kernels
            .iter()
            .map(|k| &k.body)
            .chain(funcs.iter())
            .collect();
        for body in bodies {
            for instr in &body.instrs {
                if let crate::ir::Op::Call { func, .. } = instr.op {
                    if !defined[func as usize] {
                        return Err(EmuError::Unsupported {
                            line: instr.line,
                            what: format!(
                                "call of {}, a function declared without a body",
                                funcs[func as usize].name
                            ),
                        });
                    }
                }
            }
        }
        Ok(Module { kernels })
    }

    /// A module-level declaration: an entry or a variable.
    fn declaration(&mut self) -> Result<(), EmuError> {
        let mut external = false;
        loop {
            let word = self.word()?;
            match word.as_str() {
                ".visible" | ".weak" => {}
                ".extern" => external = true,
                ".entry" => return self.entry(),
                ".shared" => {
                    let (var, end) = self.shared_var(self.shared_end, external)?;
                    if let Some(var) = var {
                        self.shared_end = end;
                        self.shared.push(var);
                    }
                    return Ok(());
                }
                ".func" => return self.func(external),
                other => return self.unsupported(format!("module-level {other} variables")),
            }
        }
    }

    /// `[.align N] .type name[N]...;` after `.shared`, placed at `end` (rounded up to its
    /// alignment). Returns the variable (`None` for an `.extern` array, which names the
    /// dynamic shared memory: recorded by the caller) and the new end.
    fn shared_var(
        &mut self,
        end: u32,
        external: bool,
    ) -> Result<(Option<SharedVar>, u32), EmuError> {
        let (var, new_end, unsized_array) = self.variable(end, MAX_STATIC_SHARED, "shared")?;
        if external || unsized_array {
            self.dynamic_name = Some(var.name);
            return Ok((None, end));
        }
        Ok((Some(var), new_end))
    }

    /// A `.local` variable: as a shared one, without unsized arrays.
    fn sized_var(&mut self, end: u32, max: u64, what: &str) -> Result<(SharedVar, u32), EmuError> {
        let (var, new_end, unsized_array) = self.variable(end, max, what)?;
        if unsized_array {
            return self.unsupported(format!("an unsized {what} array"));
        }
        Ok((var, new_end))
    }

    /// `[.align N] .type name[N]...;`, placed at `end` rounded up to its alignment, at most
    /// `max` bytes in all: the variable, the new end, and whether an array was unsized.
    fn variable(
        &mut self,
        end: u32,
        max: u64,
        what: &str,
    ) -> Result<(SharedVar, u32, bool), EmuError> {
        let mut align = 0u64;
        let mut ty = None;
        let name = loop {
            let word = self.word()?;
            if word == ".align" {
                align = self.number()?;
            } else if let Some(t) = word.strip_prefix('.').and_then(Ty::parse) {
                ty = Some(t);
            } else if word.starts_with('.') {
                return self.unsupported(format!("{word} on a {what} variable"));
            } else {
                break word;
            }
        };
        let Some(ty) = ty else {
            return self.fail(format!("{what} variable without a type"));
        };
        let mut count = 1u64;
        let mut unsized_array = false;
        while self.eat('[') {
            if self.eat(']') {
                unsized_array = true;
                continue;
            }
            count = count.saturating_mul(self.number()?);
            self.expect(']')?;
        }
        self.expect(';')?;
        let align = align.max(u64::from(ty.bytes()));
        let offset = u64::from(end)
            .checked_next_multiple_of(align)
            .unwrap_or(u64::MAX);
        let new_end = offset.saturating_add(count.saturating_mul(u64::from(ty.bytes())));
        if new_end > max {
            return self.unsupported(format!("more than {max} bytes of {what} memory"));
        }
        Ok((
            SharedVar {
                name,
                offset: offset as u32,
            },
            new_end as u32,
            unsized_array,
        ))
    }
}

/// One instruction statement before decoding: its tokens (without the `;`) and line.
pub(crate) struct Statement {
    pub tokens: Vec<Tok>,
    pub line: u32,
}

impl Parser {
    /// One `.param [.align N] .type name[N]...` declaration of a parameter list, placed
    /// after `end`: its name, offset, size and alignment, and the new end.
    fn param_decl(&mut self, end: u32) -> Result<(ParamInfo, u32), EmuError> {
        if self.word()? != ".param" {
            return self.fail("expected .param");
        }
        let mut align = 0u32;
        let mut ty = None;
        let name = loop {
            let word = self.word()?;
            if word == ".align" {
                align = u32::try_from(self.number()?).unwrap_or(u32::MAX);
            } else if let Some(t) = word.strip_prefix('.').and_then(Ty::parse) {
                ty = Some(t);
            } else if word.starts_with('.') {
                return self.unsupported(format!("{word} on a parameter"));
            } else {
                break word;
            }
        };
        let Some(ty) = ty else {
            return self.fail("parameter without a type");
        };
        let mut count = 1u32;
        while self.eat('[') {
            let n = u32::try_from(self.number()?).unwrap_or(u32::MAX);
            count = count.saturating_mul(n);
            self.expect(']')?;
        }
        let align = align.max(ty.bytes());
        let size = ty.bytes().saturating_mul(count);
        match end
            .checked_next_multiple_of(align)
            .and_then(|offset| Some((offset, offset.checked_add(size)?)))
        {
            Some((offset, end)) if end <= MAX_PARAM_BYTES => Ok((
                ParamInfo {
                    name,
                    offset,
                    size,
                    align,
                },
                end,
            )),
            _ => self.unsupported(format!("more than {MAX_PARAM_BYTES} parameter bytes")),
        }
    }

    /// `( .param ..., .param ... )`, each placed after `end`; the new end.
    fn param_list(&mut self, mut end: u32) -> Result<(Vec<ParamInfo>, u32), EmuError> {
        let mut params = Vec::new();
        self.expect('(')?;
        if self.eat(')') {
            return Ok((params, end));
        }
        loop {
            let (param, new_end) = self.param_decl(end)?;
            end = new_end;
            params.push(param);
            if self.eat(')') {
                return Ok((params, end));
            }
            self.expect(',')?;
        }
    }

    /// `.entry name(params) [directives] { body }`.
    fn entry(&mut self) -> Result<(), EmuError> {
        let name = self.word()?;
        let (params, param_end) = self.param_list(0)?;
        // Performance directives (.maxntid, .reqntid, .minnctapersm, ...) do not change
        // what the kernel computes.
        while self.peek() != Some(&Tok::Punct('{')) {
            self.next()?;
        }
        let mut scope = Scope::default();
        for param in &params {
            scope.params.insert(param.name.clone(), param.offset);
        }
        let (body, shared_bytes, dynamic_shared) = self.body(name.clone(), scope, 0)?;
        self.kernels.push(Kernel {
            name,
            params,
            param_bytes: param_end,
            body,
            funcs: Default::default(),
            shared_bytes,
            dynamic_shared,
        });
        Ok(())
    }

    /// `.func [(.param ret)] name(params)` then `;` (a prototype) or `{ body }`.
    fn func(&mut self, external: bool) -> Result<(), EmuError> {
        let mut end = 0u32;
        let mut names = Vec::new();
        let mut ret = None;
        if self.peek() == Some(&Tok::Punct('(')) {
            let (rets, new_end) = self.param_list(end)?;
            let [value] = &rets[..] else {
                return self.unsupported("a function with more than one return value");
            };
            end = new_end;
            ret = Some((value.offset, value.size));
            names.push((value.name.clone(), value.offset));
        }
        let name = self.word()?;
        let (params, new_end) = self.param_list(end)?;
        end = new_end;
        names.extend(params.iter().map(|p| (p.name.clone(), p.offset)));
        let decl = FuncDecl {
            name: name.clone(),
            params: params.iter().map(|p| (p.offset, p.size)).collect(),
            ret,
            names,
            frame_end: end,
            external,
        };
        let index = match self.funcs.iter().position(|(d, _)| d.name == name) {
            Some(index) => {
                let known = &self.funcs[index].0;
                if known.params != decl.params || known.ret != decl.ret {
                    return self.fail(format!("function {name} declared twice, differently"));
                }
                index
            }
            None => {
                self.funcs.push((decl.clone(), None));
                self.funcs.len() - 1
            }
        };
        while !matches!(self.peek(), Some(Tok::Punct('{' | ';')) | None) {
            self.next()?;
        }
        if self.eat(';') {
            return Ok(());
        }
        if external {
            return self.fail(format!(".extern function {name} with a body"));
        }
        if self.funcs[index].1.is_some() {
            return self.fail(format!("function {name} defined twice"));
        }
        let mut scope = Scope::default();
        for (param, offset) in &decl.names {
            scope.frame.insert(param.clone(), *offset);
        }
        let (mut body, _, _) = self.body(name, scope, decl.frame_end)?;
        body.params = decl.params;
        body.ret = decl.ret;
        self.funcs[index].1 = Some(body);
        Ok(())
    }

    /// `{ body }` of an entry or function: declarations, labels, instructions. `scope` has
    /// the parameters; the frame's own `.param` variables start at `frame_end`. Returns the
    /// code, the static shared bytes and whether dynamic shared memory is used.
    fn body(
        &mut self,
        name: String,
        mut scope: Scope,
        mut frame_end: u32,
    ) -> Result<(Func, u32, bool), EmuError> {
        self.expect('{')?;
        for var in &self.shared {
            scope
                .shared
                .insert(var.name.clone(), SHARED_BASE as u32 + var.offset);
        }
        for (index, (decl, _)) in self.funcs.iter().enumerate() {
            scope
                .funcs
                .insert(decl.name.clone(), (index as u32, decl.clone()));
        }
        let module_dynamic = self.dynamic_name.clone();
        let mut shared_end = self.shared_end;
        let mut local_end = 0u32;
        let mut statements: Vec<Statement> = Vec::new();
        let mut depth = 1;
        loop {
            match self.peek() {
                None => return self.fail(format!("function {name} is not closed")),
                Some(Tok::Punct('{')) => {
                    self.at += 1;
                    depth += 1;
                    continue;
                }
                Some(Tok::Punct('}')) => {
                    self.at += 1;
                    depth -= 1;
                    if depth == 0 {
                        break;
                    }
                    continue;
                }
                _ => {}
            }
            // Labels.
            if let (
                Some(Tok::Word(label)),
                Some(Token {
                    tok: Tok::Punct(':'),
                    ..
                }),
            ) = (self.peek().cloned(), self.tokens.get(self.at + 1))
            {
                if scope
                    .labels
                    .insert(label.clone(), statements.len() as u32)
                    .is_some()
                {
                    return self.fail(format!("label {label} defined twice"));
                }
                self.at += 2;
                continue;
            }
            let line = self.line();
            let start = self.at;
            while self.peek().is_some_and(|t| *t != Tok::Punct(';')) {
                self.at += 1;
            }
            let tokens: Vec<Tok> = self.tokens[start..self.at]
                .iter()
                .map(|t| t.tok.clone())
                .collect();
            self.expect(';')?;
            match tokens.first() {
                Some(Tok::Word(w)) if w == ".reg" => self.registers(&tokens, &mut scope)?,
                Some(Tok::Word(w)) if w == ".shared" || w == ".local" => {
                    let after = self.at;
                    self.at = start + 1;
                    if w == ".shared" {
                        let (var, end) = self.shared_var(shared_end, false)?;
                        if let Some(var) = var {
                            shared_end = end;
                            scope
                                .shared
                                .insert(var.name, SHARED_BASE as u32 + var.offset);
                        }
                    } else {
                        let (var, end) = self.sized_var(local_end, MAX_LOCAL, "local")?;
                        local_end = end;
                        scope.local.insert(var.name, var.offset);
                    }
                    self.at = after;
                }
                Some(Tok::Word(w)) if w == ".param" => {
                    let after = self.at;
                    self.at = start;
                    let (param, end) = self.param_decl(frame_end)?;
                    self.at = after;
                    frame_end = end;
                    scope.frame.insert(param.name, param.offset);
                }
                Some(Tok::Word(w)) if w == ".pragma" => {}
                Some(Tok::Word(w)) if w.starts_with('.') => {
                    return Err(EmuError::Unsupported {
                        line,
                        what: format!("{w} declarations in a function body"),
                    })
                }
                _ => statements.push(Statement { tokens, line }),
            }
        }
        let dynamic_name = self.dynamic_name.take().or(module_dynamic.clone());
        let dynamic_offset = shared_end.next_multiple_of(16);
        if let Some(dynamic) = &dynamic_name {
            scope
                .shared
                .insert(dynamic.clone(), SHARED_BASE as u32 + dynamic_offset);
        }
        let instrs = statements
            .iter()
            .map(|statement| decode(statement, &scope))
            .collect::<Result<Vec<_>, _>>()?;
        self.dynamic_name = module_dynamic;
        let shared_bytes = if dynamic_name.is_some() {
            dynamic_offset
        } else {
            shared_end
        };
        let func = Func {
            name,
            instrs,
            regs: scope.regs.len() as u16,
            preds: scope.preds.len() as u16,
            frame_bytes: frame_end,
            local_bytes: local_end,
            params: Vec::new(),
            ret: None,
        };
        Ok((func, shared_bytes, dynamic_name.is_some()))
    }
}
