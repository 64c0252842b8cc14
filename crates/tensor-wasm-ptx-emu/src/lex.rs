//! The PTX lexer: words (identifiers, directives, opcodes, registers), numbers as written,
//! punctuation and string literals, each with its line and byte span (so a rewriter can
//! edit the text around what the parser understood).

use crate::EmuError;

/// What a token is.
#[derive(Debug, Clone, PartialEq)]
pub enum Tok {
    /// An identifier, directive, opcode or register (`ld.global.b32`, `%rd1`, `.reg`).
    Word(String),
    /// A number as written (`42`, `0f3F800000`, `0x10`, `9.0`).
    Num(String),
    /// One punctuation character.
    Punct(char),
    /// A string literal without its quotes (`.pragma "nounroll"`).
    Str(String),
}

/// A token, its 1-based line and its bytes `start..end` in the text.
#[derive(Debug, Clone)]
pub struct Token {
    pub tok: Tok,
    pub line: u32,
    pub start: usize,
    pub end: usize,
}

/// The tokens of PTX text (comments skipped).
///
/// # Errors
/// [`EmuError::Parse`] for an unterminated comment or string, or a character PTX does not
/// use.
pub fn lex(text: &str) -> Result<Vec<Token>, EmuError> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut line = 1u32;
    let mut i = 0;
    let word_start = |c: u8| c.is_ascii_alphabetic() || matches!(c, b'_' | b'.' | b'%' | b'$');
    let word_char = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'.' | b'$');
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'\n' {
            line += 1;
            i += 1;
        } else if c.is_ascii_whitespace() {
            i += 1;
        } else if bytes[i..].starts_with(b"//") {
            while i < bytes.len() && bytes[i] != b'\n' {
                i += 1;
            }
        } else if bytes[i..].starts_with(b"/*") {
            let Some(end) = text[i + 2..].find("*/") else {
                return Err(EmuError::Parse {
                    line,
                    message: "unterminated comment".into(),
                });
            };
            line += text[i..i + 2 + end].matches('\n').count() as u32;
            i += end + 4;
        } else if word_start(c) {
            let start = i;
            i += 1;
            while i < bytes.len() && word_char(bytes[i]) {
                i += 1;
            }
            tokens.push(Token {
                tok: Tok::Word(text[start..i].to_owned()),
                line,
                start,
                end: i,
            });
        } else if c.is_ascii_digit() {
            let start = i;
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                i += 1;
            }
            tokens.push(Token {
                tok: Tok::Num(text[start..i].to_owned()),
                line,
                start,
                end: i,
            });
        } else if c == b'"' {
            let Some(end) = text[i + 1..].find('"') else {
                return Err(EmuError::Parse {
                    line,
                    message: "unterminated string".into(),
                });
            };
            tokens.push(Token {
                tok: Tok::Str(text[i + 1..i + 1 + end].to_owned()),
                line,
                start: i,
                end: i + 2 + end,
            });
            line += text[i..i + 2 + end].matches('\n').count() as u32;
            i += end + 2;
        } else if b"(){}[],;:+-<>@!|".contains(&c) {
            tokens.push(Token {
                tok: Tok::Punct(c as char),
                line,
                start: i,
                end: i + 1,
            });
            i += 1;
        } else {
            return Err(EmuError::Parse {
                line,
                message: format!("unexpected character {:?}", c as char),
            });
        }
    }
    Ok(tokens)
}

/// Parses an integer literal (decimal, `0x` hex, octal-free, optional `U` suffix).
pub fn parse_int(text: &str) -> Option<u64> {
    let text = text.strip_suffix(['U', 'u']).unwrap_or(text);
    if let Some(hex) = text.strip_prefix("0x").or_else(|| text.strip_prefix("0X")) {
        return u64::from_str_radix(hex, 16).ok();
    }
    text.parse().ok()
}
