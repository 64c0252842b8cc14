//! The Criterion filter `bench-gate` appends to a bench command to re-run exactly some ids.
//!
//! Criterion 0.8 compiles the first free argument of a bench binary as a regex (the `regex`
//! crate, as here) and runs the benches whose full id (`group/function/param`) it matches
//! anywhere, so the filter is anchored. (`tensor-wasm-bench` reads the same argument back in
//! its bench with its own harness, so that it skips what Criterion would skip.)

/// A regex that matches exactly the given full ids: `^(a|b)$`, each id
/// escaped (`matmul[16x16x16]` has brackets).
pub fn exact_ids(ids: &[&str]) -> String {
    let alternatives: Vec<String> = ids.iter().map(|id| regex::escape(id)).collect();
    format!("^({})$", alternatives.join("|"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use regex::Regex;

    #[test]
    fn exact_ids_match_those_ids_and_nothing_else() {
        let pattern = exact_ids(&[
            "jit_compile/emit_text/matmul[16x16x16]",
            "dispatch/serial/1",
        ]);
        assert_eq!(
            pattern,
            r"^(jit_compile/emit_text/matmul\[16x16x16\]|dispatch/serial/1)$"
        );
        // Criterion's own test: the regex matched anywhere in the full id.
        let f = Regex::new(&pattern).unwrap();
        assert!(f.is_match("jit_compile/emit_text/matmul[16x16x16]"));
        assert!(f.is_match("dispatch/serial/1"));
        // Unanchored, `dispatch/serial/1` would also pick these.
        assert!(!f.is_match("dispatch/serial/10"));
        assert!(!f.is_match("dispatch/serial/1000"));
        assert!(!f.is_match("jit_compile/emit_text/matmul1"));
        assert!(!f.is_match("xdispatch/serial/1"));
    }
}
