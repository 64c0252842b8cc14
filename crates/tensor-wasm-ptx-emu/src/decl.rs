//! Register declarations of a body: `.reg .type %r<N>` and lists of names.

use crate::decode::Scope;
use crate::ir::Ty;
use crate::parse::{parse_int, Parser, Tok};
use crate::EmuError;

impl Parser {
    /// `.reg .type %r<N>` or `.reg .type %a, %b`.
    pub(crate) fn registers(&self, tokens: &[Tok], scope: &mut Scope) -> Result<(), EmuError> {
        let Some(Tok::Word(ty)) = tokens.get(1) else {
            return self.fail(".reg without a type");
        };
        let pred = ty == ".pred";
        if !pred && ty.strip_prefix('.').and_then(Ty::parse).is_none() {
            return self.unsupported(format!("registers of type {ty}"));
        }
        let mut names = Vec::new();
        let mut rest = &tokens[2..];
        while let [Tok::Word(name), tail @ ..] = rest {
            match tail {
                [Tok::Punct('<'), Tok::Num(count), Tok::Punct('>'), more @ ..] => {
                    let Some(count) = parse_int(count) else {
                        return self.fail("bad register count");
                    };
                    if count > 4096 {
                        return self.unsupported("more than 4096 registers in one declaration");
                    }
                    names.extend((0..count).map(|i| format!("{name}{i}")));
                    rest = more;
                }
                more => {
                    names.push(name.clone());
                    rest = more;
                }
            }
            if let [Tok::Punct(','), more @ ..] = rest {
                rest = more;
            }
        }
        if !rest.is_empty() {
            return self.fail("malformed .reg declaration");
        }
        for name in names {
            let file = if pred {
                &mut scope.preds
            } else {
                &mut scope.regs
            };
            let index = file.len();
            if index >= usize::from(u16::MAX) {
                return self.unsupported("too many registers");
            }
            file.entry(name).or_insert(index as u16);
        }
        Ok(())
    }
}
