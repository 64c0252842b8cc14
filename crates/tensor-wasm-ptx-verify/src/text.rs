//! PTX text as the rewriter sees it: each function's header, body and statements with
//! their byte spans, the registers and variables it declares, and its labels. Built on the
//! interpreter's lexer, after the interpreter's parser has accepted the module, so only the
//! layout is read here, not the semantics.

use std::collections::HashMap;

use tensor_wasm_ptx_emu::lex::{lex, parse_int, Tok, Token};

/// A state space of a variable or an access.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Space {
    Global,
    Shared,
    Local,
    Param,
    Generic,
}

/// One statement of a body: an instruction or a declaration.
#[derive(Debug, Clone)]
pub(crate) struct Stmt {
    /// Tokens without the closing `;`.
    pub tokens: Vec<Token>,
    pub line: u32,
    /// Byte offset of its first token.
    pub start: usize,
    /// Byte offset just after its `;`.
    pub end: usize,
    /// Whether it is a declaration (`.reg`, `.local`, ...), not an instruction.
    pub declaration: bool,
}

impl Stmt {
    /// The opcode (after any guard), for an instruction.
    pub fn opcode(&self) -> Option<&str> {
        let rest = self.after_guard();
        match rest.first().map(|t| &t.tok) {
            Some(Tok::Word(w)) if !self.declaration => Some(w),
            _ => None,
        }
    }

    /// The guard predicate: its name and whether it is negated.
    pub fn guard(&self) -> Option<(&str, bool)> {
        match &self.tokens[..] {
            [Token {
                tok: Tok::Punct('@'),
                ..
            }, Token {
                tok: Tok::Punct('!'),
                ..
            }, Token {
                tok: Tok::Word(p), ..
            }, ..] => Some((p, true)),
            [Token {
                tok: Tok::Punct('@'),
                ..
            }, Token {
                tok: Tok::Word(p), ..
            }, ..] => Some((p, false)),
            _ => None,
        }
    }

    fn after_guard(&self) -> &[Token] {
        match self.guard() {
            Some((_, true)) => &self.tokens[3..],
            Some((_, false)) => &self.tokens[2..],
            None => &self.tokens,
        }
    }

    /// The operands: token groups split at top-level commas.
    pub fn operands(&self) -> Vec<&[Token]> {
        let rest = self.after_guard();
        let Some(rest) = rest.get(1..) else {
            return Vec::new();
        };
        let mut groups = Vec::new();
        let (mut depth, mut start) = (0i32, 0);
        for (i, token) in rest.iter().enumerate() {
            match token.tok {
                Tok::Punct('[' | '{' | '(') => depth += 1,
                Tok::Punct(']' | '}' | ')') => depth -= 1,
                Tok::Punct(',') if depth == 0 => {
                    groups.push(&rest[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        if start < rest.len() {
            groups.push(&rest[start..]);
        }
        groups
    }
}

/// A `.entry` or `.func`.
#[derive(Debug, Clone)]
pub(crate) struct Function {
    pub name: String,
    pub entry: bool,
    /// Byte offset of the `)` closing the parameter list (hidden parameters go before it)
    /// and whether the list is empty.
    pub params_close: usize,
    pub params_empty: bool,
    /// Byte offset just after the body's `{`.
    pub body_open: usize,
    pub stmts: Vec<Stmt>,
    /// Label name to the index of the statement it precedes.
    pub labels: HashMap<String, usize>,
    /// Register name to its width in bits (predicates: 1).
    pub regs: HashMap<String, u32>,
    /// Variables (and parameters) by name: space and size in bytes.
    pub vars: HashMap<String, (Space, u64)>,
    /// The parameters of the header (an entry's are the launch's, the same in every thread).
    pub header: Vec<String>,
    /// The alignment in bytes of each `.shared` and `.local` variable the body declares.
    pub aligns: HashMap<String, u64>,
    /// A `.func`'s return value declarations (`func_retval0`), not among `header`.
    pub returns: Vec<String>,
}

impl Function {
    /// The statement a `bra` jumps to (its label's index).
    pub fn branch_target(&self, stmt: &Stmt) -> Option<usize> {
        match &stmt.operands().first()?.first()?.tok {
            Tok::Word(label) => self.labels.get(label).copied(),
            _ => None,
        }
    }
}

/// The functions of a module, in source order, with the module's shared variables.
#[derive(Debug, Clone)]
pub(crate) struct Text {
    pub functions: Vec<Function>,
    pub shared: HashMap<String, u64>,
    /// The module's `.extern .shared` array (the launch's dynamic shared memory), if any.
    pub dynamic_shared: Option<String>,
    /// The alignment in bytes of each module-level `.shared` variable (the dynamic one too).
    pub aligns: HashMap<String, u64>,
    /// Byte offset just after the `.address_size` directive (or 0): where module-level
    /// declarations of the rewrite go.
    pub header_end: usize,
}

/// Width and size of `.type name[N][M]` tokens: (name, size in bytes).
fn variable(tokens: &[Token]) -> Option<(String, u64)> {
    let mut bytes = 0u64;
    let mut name = None;
    let mut count = 1u64;
    let mut i = 0;
    while i < tokens.len() {
        match &tokens[i].tok {
            Tok::Word(w) if w == ".align" => i += 1,
            Tok::Word(w) if w.starts_with('.') => {
                if let Some(b) = type_bytes(&w[1..]) {
                    bytes = b;
                }
            }
            Tok::Word(w) if name.is_none() => name = Some(w.clone()),
            Tok::Punct('[') => {
                if let Some(Tok::Num(n)) = tokens.get(i + 1).map(|t| &t.tok) {
                    count = count.saturating_mul(parse_int(n)?);
                }
            }
            _ => {}
        }
        i += 1;
    }
    Some((name?, bytes.saturating_mul(count)))
}

/// A variable's alignment: its `.align`, else its element type's size (PTX's default).
fn alignment(tokens: &[Token]) -> u64 {
    let mut element = 1;
    for (i, token) in tokens.iter().enumerate() {
        match &token.tok {
            Tok::Word(w) if w == ".align" => {
                if let Some(Tok::Num(n)) = tokens.get(i + 1).map(|t| &t.tok) {
                    return parse_int(n).unwrap_or(1).max(1);
                }
            }
            Tok::Word(w) if w.starts_with('.') => {
                if let Some(b) = type_bytes(&w[1..]) {
                    element = b;
                }
            }
            _ => {}
        }
    }
    element
}

/// Bytes of a scalar type name (`f32`, `b64`, ...).
pub(crate) fn type_bytes(name: &str) -> Option<u64> {
    let bits: u64 = name.get(1..)?.parse().ok()?;
    matches!(name.as_bytes().first(), Some(b'b' | b'u' | b's' | b'f'))
        .then_some(bits / 8)
        .filter(|b| [1, 2, 4, 8].contains(b))
}

/// Reads the layout of `ptx` (already accepted by the interpreter's parser).
pub(crate) fn read(ptx: &str) -> Option<Text> {
    let tokens = lex(ptx).ok()?;
    let mut text = Text {
        functions: Vec::new(),
        shared: HashMap::new(),
        dynamic_shared: None,
        aligns: HashMap::new(),
        header_end: 0,
    };
    let mut i = 0;
    let word = |i: usize| match tokens.get(i).map(|t| &t.tok) {
        Some(Tok::Word(w)) => Some(w.as_str()),
        _ => None,
    };
    while i < tokens.len() {
        match word(i) {
            Some(".entry" | ".func") => {
                let entry = word(i) == Some(".entry");
                i += 1;
                let (function, next) = function(&tokens, i, entry)?;
                i = next;
                if let Some(function) = function {
                    text.functions.push(function);
                }
            }
            Some(".address_size") => {
                text.header_end = tokens.get(i + 1).map_or(tokens[i].end, |t| t.end);
                i += 2;
            }
            Some(".shared") => {
                let end = (i..tokens.len()).find(|&j| tokens[j].tok == Tok::Punct(';'))?;
                let unsized_array = tokens[i + 1..end]
                    .windows(2)
                    .any(|pair| pair[0].tok == Tok::Punct('[') && pair[1].tok == Tok::Punct(']'));
                if let Some((name, size)) = variable(&tokens[i + 1..end]) {
                    text.aligns
                        .insert(name.clone(), alignment(&tokens[i + 1..end]));
                    if unsized_array {
                        text.dynamic_shared = Some(name);
                    } else {
                        text.shared.insert(name, size);
                    }
                }
                i = end + 1;
            }
            _ => i += 1,
        }
    }
    Some(text)
}

/// A function from just after `.entry`/`.func`: `None` for a prototype.
fn function(tokens: &[Token], mut i: usize, entry: bool) -> Option<(Option<Function>, usize)> {
    let mut vars = HashMap::new();
    let mut header = Vec::new();
    let mut param_list = |i: usize| -> Option<(usize, bool, usize)> {
        // `( .param ..., ... )` from the `(` at i: the index of the `)`.
        let close = (i..tokens.len()).find(|&j| tokens[j].tok == Tok::Punct(')'))?;
        let mut count = 0;
        for part in tokens[i + 1..close].split(|t| t.tok == Tok::Punct(',')) {
            if let Some((name, size)) = variable(part) {
                header.push(name.clone());
                vars.insert(name, (Space::Param, size));
                count += 1;
            }
        }
        Some((close, close == i + 1, count))
    };
    // The return value's declaration is not a parameter.
    let mut returns = 0;
    if tokens.get(i)?.tok == Tok::Punct('(') {
        let (close, _, count) = param_list(i)?;
        returns = count;
        i = close + 1;
    }
    let Tok::Word(name) = &tokens.get(i)?.tok else {
        return None;
    };
    let name = name.clone();
    i += 1;
    let (close, params_empty, _) = param_list(i)?;
    let params_close = tokens[close].start;
    let returns: Vec<String> = header.drain(..returns).collect();
    i = close + 1;
    while !matches!(tokens.get(i)?.tok, Tok::Punct('{' | ';')) {
        i += 1;
    }
    if tokens[i].tok == Tok::Punct(';') {
        return Some((None, i + 1));
    }
    let body_open = tokens[i].end;
    i += 1;
    let mut f = Function {
        name,
        entry,
        params_close,
        params_empty,
        body_open,
        stmts: Vec::new(),
        labels: HashMap::new(),
        regs: HashMap::new(),
        vars,
        header,
        aligns: HashMap::new(),
        returns,
    };
    let mut depth = 1;
    while depth > 0 {
        match &tokens.get(i)?.tok {
            Tok::Punct('{') => {
                depth += 1;
                i += 1;
                continue;
            }
            Tok::Punct('}') => {
                depth -= 1;
                i += 1;
                continue;
            }
            Tok::Word(label) if tokens.get(i + 1).map(|t| &t.tok) == Some(&Tok::Punct(':')) => {
                f.labels.insert(label.clone(), f.stmts.len());
                i += 2;
                continue;
            }
            _ => {}
        }
        let end = (i..tokens.len()).find(|&j| tokens[j].tok == Tok::Punct(';'))?;
        let stmt_tokens = tokens[i..end].to_vec();
        let declaration = matches!(&stmt_tokens[0].tok, Tok::Word(w) if w.starts_with('.'));
        if declaration {
            declare(&mut f, &stmt_tokens);
        }
        f.stmts.push(Stmt {
            line: stmt_tokens[0].line,
            start: stmt_tokens[0].start,
            end: tokens[end].end,
            tokens: stmt_tokens,
            declaration,
        });
        i = end + 1;
    }
    Some((Some(f), i))
}

/// Records a body declaration's registers or variable.
fn declare(f: &mut Function, tokens: &[Token]) {
    let Tok::Word(kind) = &tokens[0].tok else {
        return;
    };
    match kind.as_str() {
        ".reg" => {
            let Some(Tok::Word(ty)) = tokens.get(1).map(|t| &t.tok) else {
                return;
            };
            let bits = if ty == ".pred" {
                1
            } else {
                type_bytes(&ty[1..]).map_or(64, |b| b as u32 * 8)
            };
            let mut j = 2;
            while j < tokens.len() {
                if let Tok::Word(name) = &tokens[j].tok {
                    if let (Some(Tok::Punct('<')), Some(Tok::Num(n))) = (
                        tokens.get(j + 1).map(|t| &t.tok),
                        tokens.get(j + 2).map(|t| &t.tok),
                    ) {
                        for k in 0..parse_int(n).unwrap_or(0) {
                            f.regs.insert(format!("{name}{k}"), bits);
                        }
                        j += 3;
                    } else {
                        f.regs.insert(name.clone(), bits);
                    }
                }
                j += 1;
            }
        }
        ".local" | ".shared" | ".param" => {
            let space = match kind.as_str() {
                ".local" => Space::Local,
                ".shared" => Space::Shared,
                _ => Space::Param,
            };
            if let Some((name, size)) = variable(&tokens[1..]) {
                f.aligns.insert(name.clone(), alignment(&tokens[1..]));
                f.vars.insert(name, (space, size));
            }
        }
        _ => {}
    }
}
