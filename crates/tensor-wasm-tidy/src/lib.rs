//! The tidy checks: what the docs claim about the code, checked against the code.
//!
//! Each check is a pure function from texts (source files, a doc, the OpenAPI
//! document, `cargo metadata` output) to a list of findings, one line each; an
//! empty list means the claim holds. `tests/tidy.rs` runs every check on this
//! repository in `make test`; the unit tests below feed each check a drifted input
//! and show that it fails, so no check can silently pass everything.
//!
//! What is checked:
//! - every `.rs` file starts with a `//!` line ([`missing_module_docs`]);
//! - no non-test source file is over [`MAX_SOURCE_LINES`] lines ([`oversized_files`]);
//! - `unsafe` appears only under allowed paths ([`unsafe_outside`]);
//! - every file under a crate's `src/` is named in `docs/ARCHITECTURE.md`'s code map,
//!   and the map names no file that does not exist ([`code_map_drift`]);
//! - README's route table lists exactly the router's routes ([`route_table_drift`]);
//! - README names every error code ([`error_codes_missing`]);
//! - the crate graph in ARCHITECTURE.md is the one `cargo metadata` reports
//!   ([`crate_graph`], [`render_crate_graph`], [`generated_block`]);
//! - relative links in the docs resolve to files inside the repository ([`broken_links`]).
//!
//! ```
//! use tensor_wasm_tidy::{missing_module_docs, SourceFile};
//! let files = [SourceFile::new("crates/a/src/lib.rs", "fn main() {}\n")];
//! assert_eq!(missing_module_docs(&files).len(), 1);
//! ```

use std::collections::{BTreeMap, BTreeSet};

/// The largest non-test source file allowed, in lines.
pub const MAX_SOURCE_LINES: usize = 800;

/// HTTP methods a route table may name.
const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];

/// A source file: its path relative to the repository root (`/`-separated) and its text.
#[derive(Debug, Clone)]
pub struct SourceFile {
    pub path: String,
    pub text: String,
}

impl SourceFile {
    pub fn new(path: impl Into<String>, text: impl Into<String>) -> Self {
        SourceFile {
            path: path.into(),
            text: text.into(),
        }
    }
}

/// Files whose first line is not a `//!` module doc.
pub fn missing_module_docs(files: &[SourceFile]) -> Vec<String> {
    files
        .iter()
        .filter(|f| !f.text.starts_with("//!"))
        .map(|f| {
            format!(
                "{}: the first line is not a `//!` doc saying what the file is for",
                f.path
            )
        })
        .collect()
}

/// Whether `path` holds tests: under a `tests/` directory, or named `tests.rs` or `*_tests.rs`.
pub fn is_test_file(path: &str) -> bool {
    let name = path.rsplit('/').next().unwrap_or(path);
    path.split('/').any(|c| c == "tests") || name == "tests.rs" || name.ends_with("_tests.rs")
}

/// Non-test files longer than `max_lines`.
pub fn oversized_files(files: &[SourceFile], max_lines: usize) -> Vec<String> {
    files
        .iter()
        .filter(|f| !is_test_file(&f.path))
        .filter_map(|f| {
            let lines = f.text.lines().count();
            (lines > max_lines).then(|| {
                format!(
                    "{}: {lines} lines, more than {max_lines} (split it)",
                    f.path
                )
            })
        })
        .collect()
}

/// Lines using `unsafe` (a block, fn, impl, trait, extern, or an `unsafe_code` lint
/// override) in files whose path starts with none of `allowed`. Comments are ignored.
pub fn unsafe_outside(files: &[SourceFile], allowed: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for f in files {
        if allowed.iter().any(|a| f.path.starts_with(a)) {
            continue;
        }
        for (i, line) in f.text.lines().enumerate() {
            let code = strip_line_comment(line);
            if uses_unsafe(&code) {
                found.push(format!(
                    "{}:{}: `unsafe` outside the allow-list: {}",
                    f.path,
                    i + 1,
                    line.trim()
                ));
            }
        }
    }
    found
}

/// The code of one line: string literals emptied, a trailing `//` comment removed.
fn strip_line_comment(line: &str) -> String {
    let mut code = String::with_capacity(line.len());
    let mut chars = line.chars().peekable();
    let mut in_string = false;
    while let Some(c) = chars.next() {
        if in_string {
            match c {
                '\\' => {
                    chars.next();
                }
                '"' => {
                    in_string = false;
                    code.push('"');
                }
                _ => {}
            }
            continue;
        }
        match c {
            '"' => {
                in_string = true;
                code.push('"');
            }
            '/' if chars.peek() == Some(&'/') => break,
            _ => code.push(c),
        }
    }
    code
}

fn uses_unsafe(code: &str) -> bool {
    if code.contains("unsafe_code") && (code.contains("allow(") || code.contains("expect(")) {
        return true;
    }
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(pos) = code[from..].find("unsafe") {
        let start = from + pos;
        let end = start + "unsafe".len();
        from = end;
        let before_ok = start == 0 || !is_ident_byte(bytes[start - 1]);
        let after_ok = end == bytes.len() || !is_ident_byte(bytes[end]);
        if !(before_ok && after_ok) {
            continue;
        }
        let rest = code[end..].trim_start();
        if rest.starts_with('{')
            || ["fn", "impl", "trait", "extern"]
                .iter()
                .any(|kw| rest.starts_with(kw))
        {
            return true;
        }
    }
    false
}

fn is_ident_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// The text of the section headed exactly `heading` (e.g. `"## Code map"`), up to the
/// next heading of the same or a higher level; `None` when there is no such heading.
pub fn section<'a>(doc: &'a str, heading: &str) -> Option<&'a str> {
    let level = heading.chars().take_while(|c| *c == '#').count();
    let mut start = None;
    let mut offset = 0;
    for line in doc.split_inclusive('\n') {
        let trimmed = line.trim_end();
        if let Some(s) = start {
            let hashes = trimmed.chars().take_while(|c| *c == '#').count();
            if hashes > 0 && hashes <= level && trimmed[hashes..].starts_with(' ') {
                return Some(&doc[s..offset]);
            }
        } else if trimmed == heading {
            start = Some(offset + line.len());
        }
        offset += line.len();
    }
    start.map(|s| &doc[s..])
}

/// Every `` `...` `` span of `text`.
pub fn code_spans(text: &str) -> Vec<&str> {
    text.split('`').skip(1).step_by(2).collect()
}

/// One crate's source files, relative to its `src/` directory (`runtime/invoke.rs`), and
/// its other `.rs` files (benches, tests) relative to the crate (`benches/icount.rs`),
/// which the code map may name but need not.
#[derive(Debug, Clone, Default)]
pub struct CrateSources {
    pub name: String,
    pub src_files: Vec<String>,
    pub other_files: Vec<String>,
}

/// Drift between `docs/ARCHITECTURE.md`'s "## Code map" and the crates: a crate without
/// a `### \`name\`` section, a file under `src/` its section does not name in backticks
/// (by its path relative to `src/`), or a `.rs` file the section names that does not exist.
pub fn code_map_drift(architecture: &str, crates: &[CrateSources]) -> Vec<String> {
    let Some(map) = section(architecture, "## Code map") else {
        return vec!["docs/ARCHITECTURE.md has no `## Code map` section".to_owned()];
    };
    let mut found = Vec::new();
    for krate in crates {
        let heading = format!("### `{}`", krate.name);
        let Some(text) = section(map, &heading) else {
            found.push(format!(
                "docs/ARCHITECTURE.md: the code map has no `{heading}` section"
            ));
            continue;
        };
        let named: BTreeSet<&str> = code_spans(text).into_iter().collect();
        for file in &krate.src_files {
            if !named.contains(file.as_str()) {
                found.push(format!(
                    "docs/ARCHITECTURE.md: the code map of `{}` does not name `{file}` (crates/{}/src/{file})",
                    krate.name, krate.name
                ));
            }
        }
        let files: BTreeSet<&str> = krate
            .src_files
            .iter()
            .chain(&krate.other_files)
            .map(String::as_str)
            .collect();
        for name in named {
            let looks_like_file = name.ends_with(".rs")
                && !name.contains(' ')
                && !name.contains('*')
                && !name.starts_with("crates/");
            if looks_like_file && !files.contains(name) {
                found.push(format!(
                    "docs/ARCHITECTURE.md: the code map of `{}` names `{name}`, which is not a file of crates/{}",
                    krate.name, krate.name
                ));
            }
        }
    }
    found
}

/// `(METHOD, path)` of every operation in an OpenAPI document.
pub fn openapi_routes(openapi: &serde_json::Value) -> Vec<(String, String)> {
    let mut routes = Vec::new();
    if let Some(paths) = openapi["paths"].as_object() {
        for (path, item) in paths {
            if let Some(ops) = item.as_object() {
                for method in ops.keys() {
                    let upper = method.to_ascii_uppercase();
                    if METHODS.contains(&upper.as_str()) {
                        routes.push((upper, path.clone()));
                    }
                }
            }
        }
    }
    routes.sort();
    routes
}

/// The error codes an OpenAPI document lists for `Error.error.code`.
pub fn openapi_error_codes(openapi: &serde_json::Value) -> Vec<String> {
    openapi["components"]["schemas"]["Error"]["properties"]["error"]["properties"]["code"]["enum"]
        .as_array()
        .map(|codes| {
            codes
                .iter()
                .filter_map(|c| c.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// The `` `METHOD /path` `` spans of README's "## The API in one screen" section.
fn readme_routes(readme: &str) -> Option<BTreeSet<(String, String)>> {
    let text = section(readme, "## The API in one screen")?;
    let mut routes = BTreeSet::new();
    for span in code_spans(text) {
        if let Some((method, path)) = span.split_once(' ') {
            if METHODS.contains(&method) && path.starts_with('/') && !path.contains(' ') {
                routes.insert((method.to_owned(), path.to_owned()));
            }
        }
    }
    Some(routes)
}

/// Routes of the router missing from README's route table (as `` `METHOD /path` ``),
/// and routes the table lists that the router does not serve.
pub fn route_table_drift(readme: &str, routes: &[(String, String)]) -> Vec<String> {
    let Some(listed) = readme_routes(readme) else {
        return vec!["README.md has no `## The API in one screen` section".to_owned()];
    };
    let served: BTreeSet<(String, String)> = routes.iter().cloned().collect();
    let mut found = Vec::new();
    for (method, path) in served.difference(&listed) {
        found.push(format!(
            "README.md: the route table does not list `{method} {path}`"
        ));
    }
    for (method, path) in listed.difference(&served) {
        found.push(format!(
            "README.md: the route table lists `{method} {path}`, which the router does not serve"
        ));
    }
    found
}

/// Error codes not named (in backticks) in README's "## The API in one screen" section.
pub fn error_codes_missing(readme: &str, codes: &[String]) -> Vec<String> {
    let spans: BTreeSet<&str> = section(readme, "## The API in one screen")
        .map(code_spans)
        .unwrap_or_default()
        .into_iter()
        .collect();
    codes
        .iter()
        .filter(|c| !spans.contains(c.as_str()))
        .map(|c| format!("README.md: the error-code list does not name `{c}`"))
        .collect()
}

/// README's error-code table (rows `` | `code` | status | … | ``): each code's status.
pub fn error_code_statuses(readme: &str) -> BTreeMap<String, u16> {
    readme
        .lines()
        .filter_map(|line| {
            let mut cells = line.strip_prefix("| `")?.splitn(2, "` | ");
            let code = cells.next()?;
            let status = cells.next()?.get(..3)?.parse().ok()?;
            Some((code.to_owned(), status))
        })
        .collect()
}

/// A word of prose without the punctuation around it.
fn bare(word: &str) -> &str {
    word.trim_matches(|c: char| !c.is_ascii_alphanumeric() && c != '_')
}

/// Status codes that `text` (the file `path`) names beside an error code and that differ from
/// `table` (code → status): "429 `busy`", "429 busy" and "`busy` (429)".
pub fn status_code_drift(path: &str, text: &str, table: &BTreeMap<String, u16>) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        for pair in words.windows(2) {
            let (first, second) = (bare(pair[0]), bare(pair[1]));
            let named = match (first.parse::<u16>(), second.parse::<u16>()) {
                (Ok(status), _) if (100..600).contains(&status) => Some((second, status)),
                (_, Ok(status)) if (100..600).contains(&status) && pair[1].starts_with('(') => {
                    Some((first, status))
                }
                _ => None,
            };
            if let Some((code, status)) = named {
                if let Some(&expected) = table.get(code) {
                    if expected != status {
                        found.push(format!(
                            "{path}:{}: `{code}` is named with {status}; the error-code table \
                             answers it with {expected}",
                            n + 1
                        ));
                    }
                }
            }
        }
    }
    found
}

/// Makefile targets (`name:` at the start of a line, not a pattern or file rule) that
/// `build` (BUILD.md) never names as `` `make name` ``.
pub fn undocumented_make_targets(makefile: &str, build: &str) -> Vec<String> {
    let documented: BTreeSet<&str> = build
        .split("`make ")
        .skip(1)
        .filter_map(|rest| {
            let end = rest.find(|c: char| !(c.is_ascii_alphanumeric() || c == '-'))?;
            Some(&rest[..end])
        })
        .collect();
    let targets: BTreeSet<&str> = makefile
        .lines()
        .filter(|line| line.starts_with(|c: char| c.is_ascii_lowercase()))
        .filter_map(|line| {
            let (name, rest) = line.split_once(':')?;
            let is_target = !rest.starts_with('=')
                && name
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
            is_target.then_some(name)
        })
        .collect();
    targets
        .difference(&documented)
        .map(|t| format!("BUILD.md: the target table does not name `make {t}` (Makefile)"))
        .collect()
}

/// Each workspace package and the workspace packages it has a normal (not dev, not
/// build) dependency on, from `cargo metadata --format-version 1 --no-deps`.
pub fn crate_graph(metadata: &serde_json::Value) -> BTreeMap<String, BTreeSet<String>> {
    let packages = metadata["packages"].as_array().cloned().unwrap_or_default();
    let names: BTreeSet<String> = packages
        .iter()
        .filter_map(|p| p["name"].as_str().map(str::to_owned))
        .collect();
    let mut graph = BTreeMap::new();
    for p in &packages {
        let Some(name) = p["name"].as_str() else {
            continue;
        };
        let deps: BTreeSet<String> = p["dependencies"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|d| d["kind"].is_null())
            .filter_map(|d| d["name"].as_str())
            .filter(|d| names.contains(*d))
            .map(str::to_owned)
            .collect();
        graph.insert(name.to_owned(), deps);
    }
    graph
}

/// The crate graph as layers: layer 0 depends on no workspace crate, layer n on
/// crates of lower layers only, each crate with the crates it depends on.
pub fn render_crate_graph(graph: &BTreeMap<String, BTreeSet<String>>) -> String {
    let mut layer: BTreeMap<&str, usize> = BTreeMap::new();
    // Longest path to a leaf; the graph is acyclic (cargo refuses cycles of normal deps).
    fn depth<'a>(
        name: &'a str,
        graph: &'a BTreeMap<String, BTreeSet<String>>,
        memo: &mut BTreeMap<&'a str, usize>,
    ) -> usize {
        if let Some(d) = memo.get(name) {
            return *d;
        }
        let d = graph
            .get(name)
            .map(|deps| {
                deps.iter()
                    .map(|dep| depth(dep, graph, memo) + 1)
                    .max()
                    .unwrap_or(0)
            })
            .unwrap_or(0);
        memo.insert(name, d);
        d
    }
    for name in graph.keys() {
        depth(name, graph, &mut layer);
    }
    let top = layer.values().copied().max().unwrap_or(0);
    let mut out = String::new();
    for level in (0..=top).rev() {
        out.push_str(&format!("layer {level}\n"));
        for (name, deps) in graph {
            if layer.get(name.as_str()) != Some(&level) {
                continue;
            }
            if deps.is_empty() {
                out.push_str(&format!("  {name}\n"));
            } else {
                let deps: Vec<&str> = deps.iter().map(String::as_str).collect();
                out.push_str(&format!("  {name} ──► {}\n", deps.join(", ")));
            }
        }
    }
    out
}

/// The text between `<!-- NAME:begin -->` (and the rest of its line) and
/// `<!-- NAME:end -->` in `doc`.
pub fn generated_block<'a>(doc: &'a str, name: &str) -> Option<&'a str> {
    let begin = format!("<!-- {name}:begin");
    let end = format!("<!-- {name}:end -->");
    let b = doc.find(&begin)?;
    let after = b + doc[b..].find('\n')? + 1;
    let e = after + doc[after..].find(&end)?;
    Some(&doc[after..e])
}

/// `doc` with the block `name` replaced by `content`; `None` without such a block.
pub fn replace_generated_block(doc: &str, name: &str, content: &str) -> Option<String> {
    let old = generated_block(doc, name)?;
    let start = old.as_ptr() as usize - doc.as_ptr() as usize;
    let mut out = String::with_capacity(doc.len());
    out.push_str(&doc[..start]);
    out.push_str(content);
    out.push_str(&doc[start + old.len()..]);
    Some(out)
}

/// Relative links (`[text](target)`) of the markdown file `doc_path` (relative to the
/// repository root) that leave the repository or name a path for which `exists` is
/// false. Links with a scheme (`https:`, `mailto:`) and same-page anchors are skipped.
pub fn broken_links(doc_path: &str, text: &str, exists: impl Fn(&str) -> bool) -> Vec<String> {
    let dir: Vec<&str> = match doc_path.rfind('/') {
        Some(i) => doc_path[..i].split('/').collect(),
        None => Vec::new(),
    };
    let mut found = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let mut rest = line;
        while let Some(p) = rest.find("](") {
            rest = &rest[p + 2..];
            let Some(close) = rest.find(')') else { break };
            let target = &rest[..close];
            rest = &rest[close..];
            let target = target.split('#').next().unwrap_or("");
            if target.is_empty() || target.contains(':') || target.contains(' ') {
                continue;
            }
            match resolve(&dir, target) {
                None => found.push(format!(
                    "{doc_path}:{}: the link `{target}` leaves the repository",
                    i + 1
                )),
                Some(path) if !exists(&path) => found.push(format!(
                    "{doc_path}:{}: the link `{target}` names a missing file ({path})",
                    i + 1
                )),
                Some(_) => {}
            }
        }
    }
    found
}

fn resolve(dir: &[&str], target: &str) -> Option<String> {
    let mut parts: Vec<&str> = if target.starts_with('/') {
        Vec::new()
    } else {
        dir.to_vec()
    };
    for c in target.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop()?;
            }
            c => parts.push(c),
        }
    }
    Some(parts.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_named_against_the_table_is_reported() {
        let readme = "| `busy` | 429 | Every slot. |\n| `internal` | 500 | Failed. |\n";
        let table = error_code_statuses(readme);
        assert_eq!(table.get("busy"), Some(&429));
        let text = "a slot, else `503 busy`.\nok: 429 `busy`, and `internal` (500).\n\
                    wrong: `internal` (502); 404 not found.";
        let found = status_code_drift("doc.md", text, &table);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with("doc.md:1:") && found[0].contains("503"));
        assert!(found[1].starts_with("doc.md:3:") && found[1].contains("502"));
    }

    #[test]
    fn a_make_target_missing_from_build_md_is_reported() {
        let makefile = ".PHONY: a\ntest: deps\n\tcargo test\nCARGO ?= cargo\nX := 1\n\
                        examples/c/%.wasm: x\nserve-compare: deps\n";
        let build = "| `make test` | … |\n";
        assert_eq!(
            undocumented_make_targets(makefile, build),
            vec!["BUILD.md: the target table does not name `make serve-compare` (Makefile)"]
        );
    }

    #[test]
    fn a_file_without_a_module_doc_is_reported() {
        let files = [
            SourceFile::new("a/src/lib.rs", "//! Does a.\n"),
            SourceFile::new("a/src/b.rs", "// not a module doc\n"),
        ];
        let found = missing_module_docs(&files);
        assert_eq!(found.len(), 1);
        assert!(found[0].starts_with("a/src/b.rs"), "{found:?}");
    }

    #[test]
    fn a_long_source_file_is_reported_and_tests_are_exempt() {
        let long = "x\n".repeat(MAX_SOURCE_LINES + 1);
        let files = [
            SourceFile::new("a/src/big.rs", long.clone()),
            SourceFile::new("a/src/tests.rs", long.clone()),
            SourceFile::new("a/src/program_tests.rs", long.clone()),
            SourceFile::new("a/tests/e2e.rs", long.clone()),
            SourceFile::new("a/src/fits.rs", "x\n".repeat(MAX_SOURCE_LINES)),
        ];
        let found = oversized_files(&files, MAX_SOURCE_LINES);
        assert_eq!(found.len(), 1, "{found:?}");
        assert!(found[0].starts_with("a/src/big.rs"));
    }

    #[test]
    fn unsafe_outside_the_allow_list_is_reported() {
        let files = [
            SourceFile::new("crates/mem/src/a.rs", "unsafe { f() }\n"),
            SourceFile::new(
                "crates/api/src/a.rs",
                "// unsafe { in a comment }\nlet unsafe_ish = 1; // unsafe {\nfn f() { unsafe { g() } }\n",
            ),
            SourceFile::new("crates/api/src/b.rs", "unsafe impl Send for X {}\n"),
            SourceFile::new("crates/api/src/c.rs", "#![allow(unsafe_code)]\n"),
            SourceFile::new("crates/api/src/d.rs", "/// This crate has no `unsafe` code.\n"),
            SourceFile::new("crates/api/src/e.rs", "let s = \"unsafe { \\\" }\"; // a string\n"),
        ];
        let found = unsafe_outside(&files, &["crates/mem/"]);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].starts_with("crates/api/src/a.rs:3:"), "{found:?}");
        assert!(found[1].starts_with("crates/api/src/b.rs:1:"));
        assert!(found[2].starts_with("crates/api/src/c.rs:1:"));
    }

    const ARCH: &str = "# Architecture\n\n## Code map\n\n### `tensor-wasm-a`\n- `lib.rs` — overview.\n- `x/y.rs`, `gone.rs` — things; `benches/b.rs` measures them.\n\n## Invariants\n- `z.rs` is not in the map.\n";

    #[test]
    fn the_code_map_must_name_every_file_and_only_existing_ones() {
        let crates = [
            CrateSources {
                name: "tensor-wasm-a".into(),
                src_files: vec!["lib.rs".into(), "x/y.rs".into(), "z.rs".into()],
                other_files: vec!["benches/b.rs".into()],
            },
            CrateSources {
                name: "tensor-wasm-b".into(),
                src_files: vec!["lib.rs".into()],
                ..Default::default()
            },
        ];
        let found = code_map_drift(ARCH, &crates);
        assert_eq!(found.len(), 3, "{found:?}");
        assert!(found[0].contains("does not name `z.rs`"), "{found:?}");
        assert!(found[1].contains("names `gone.rs`"), "{found:?}");
        assert!(
            found[2].contains("no `### `tensor-wasm-b`` section"),
            "{found:?}"
        );

        let fixed = ARCH.replace(", `gone.rs`", ", `z.rs`") + "";
        let crates = &crates[..1];
        assert!(code_map_drift(&fixed, crates).is_empty());
    }

    const OPENAPI: &str = r#"{"paths": {
        "/healthz": {"get": {}},
        "/functions/{id}": {"parameters": [], "get": {}, "patch": {}}
      },
      "components": {"schemas": {"Error": {"properties": {"error": {"properties": {
        "code": {"enum": ["not_found", "busy"]}}}}}}}}"#;

    #[test]
    fn the_route_table_must_list_exactly_the_routes() {
        let spec: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        let routes = openapi_routes(&spec);
        assert_eq!(routes.len(), 3);
        let readme = "## The API in one screen\n| route | what |\n|---|---|\n| `GET /healthz` | liveness |\n| `GET /functions/{id}`, `DELETE /functions/{id}` | show, delete |\n\n## Next\n| `PATCH /functions/{id}` | outside the section |\n";
        let found = route_table_drift(readme, &routes);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("does not list `PATCH /functions/{id}`"));
        assert!(found[1].contains("lists `DELETE /functions/{id}`"));
    }

    #[test]
    fn every_error_code_must_be_named() {
        let spec: serde_json::Value = serde_json::from_str(OPENAPI).unwrap();
        let codes = openapi_error_codes(&spec);
        assert_eq!(codes, ["not_found", "busy"]);
        let readme = "## The API in one screen\nErrors: `not_found` (404).\n";
        let found = error_codes_missing(readme, &codes);
        assert_eq!(found.len(), 1);
        assert!(found[0].contains("`busy`"));
    }

    #[test]
    fn the_crate_graph_is_rendered_in_layers_and_a_stale_block_is_detected() {
        let metadata: serde_json::Value = serde_json::from_str(
            r#"{"packages": [
              {"name": "a", "dependencies": [{"name": "b", "kind": null}, {"name": "c", "kind": "dev"}, {"name": "serde", "kind": null}]},
              {"name": "b", "dependencies": [{"name": "c", "kind": null}]},
              {"name": "c", "dependencies": []}
            ]}"#,
        )
        .unwrap();
        let graph = crate_graph(&metadata);
        let rendered = render_crate_graph(&graph);
        assert_eq!(
            rendered,
            "layer 2\n  a ──► b\nlayer 1\n  b ──► c\nlayer 0\n  c\n"
        );
        let doc = format!(
            "x\n<!-- crate-graph:begin (generated) -->\n{rendered}<!-- crate-graph:end -->\n"
        );
        assert_eq!(
            generated_block(&doc, "crate-graph"),
            Some(rendered.as_str())
        );
        let stale = doc.replace("a ──► b", "a ──► b, c");
        assert_ne!(
            generated_block(&stale, "crate-graph"),
            Some(rendered.as_str())
        );
        assert_eq!(
            replace_generated_block(&stale, "crate-graph", &rendered).as_deref(),
            Some(doc.as_str())
        );
    }

    #[test]
    fn links_outside_the_repository_or_to_missing_files_are_reported() {
        let text = "See [design](../../shared/DESIGN.md), [build](../BUILD.md#x), [gone](gone.md), [web](https://x.invalid/a), [anchor](#top).\n";
        let found = broken_links("docs/ARCHITECTURE.md", text, |p| p == "BUILD.md");
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].contains("leaves the repository"));
        assert!(found[1].contains("missing file (docs/gone.md)"));
    }

    #[test]
    fn sections_end_at_the_next_heading_of_their_level() {
        let doc = "## A\na\n### A1\na1\n## B\nb\n";
        assert_eq!(section(doc, "## A"), Some("a\n### A1\na1\n"));
        assert_eq!(section(doc, "### A1"), Some("a1\n"));
        assert_eq!(section(doc, "## B"), Some("b\n"));
        assert_eq!(section(doc, "## C"), None);
    }
}
