//! The lean copy: the tenant's own functions, unfenced and unpolled, renamed with
//! [`LEAN_PREFIX`] and appended to the fenced module. A launch runs a lean entry only when
//! [`crate::Plan::admit`] has proven, for that launch's parameters and grid, that every
//! access stays in bounds and every thread ends within a bounded number of instructions;
//! otherwise it runs the fenced entry of the same name.

use std::collections::HashSet;

use tensor_wasm_ptx_emu::lex::{lex, Tok};

use crate::text::{Space, Text};
use crate::HIDDEN_PARAMS;

/// The prefix of the lean copy's names: its functions and its `.shared` and `.local`
/// variables (tenant text may not use it: it is one of [`crate::RESERVED_PREFIXES`]).
pub const LEAN_PREFIX: &str = "__tw_lean_";

/// The tenant's module after its header, with every function and variable name renamed and
/// the hidden parameters appended to every entry (unused: a launch passes the same
/// parameters to either copy). `None` when the text cannot be relexed.
pub(crate) fn copy(ptx: &str, text: &Text) -> Option<String> {
    let from = text.header_end;
    let region = &ptx[from..];
    let mut names: HashSet<&str> = text.shared.keys().map(String::as_str).collect();
    names.extend(text.dynamic_shared.as_deref());
    for f in &text.functions {
        names.insert(&f.name);
        names.extend(
            f.vars
                .iter()
                .filter(|(_, (space, _))| matches!(space, Space::Shared | Space::Local))
                .map(|(name, _)| name.as_str()),
        );
    }
    // Insertions at byte offsets into `region`.
    let mut edits: Vec<(usize, String)> = Vec::new();
    for token in lex(region).ok()? {
        if let Tok::Word(word) = &token.tok {
            if names.contains(word.as_str()) {
                edits.push((token.start, LEAN_PREFIX.to_owned()));
            }
        }
    }
    for f in text.functions.iter().filter(|f| f.entry) {
        let hidden: Vec<String> = HIDDEN_PARAMS
            .iter()
            .map(|p| format!(".param .u64 {p}"))
            .collect();
        let separator = if f.params_empty { "" } else { ", " };
        edits.push((
            f.params_close.checked_sub(from)?,
            format!("{separator}{}", hidden.join(", ")),
        ));
    }
    edits.sort_by_key(|e| std::cmp::Reverse(e.0));
    let mut out = region.to_owned();
    for (at, inserted) in edits {
        out.insert_str(at, &inserted);
    }
    Some(out)
}
