//! Runs every tidy check on this repository (part of `make test`).
//!
//! A failure names each drift and how to fix it. The crate graph block of
//! docs/ARCHITECTURE.md is generated: `TIDY_BLESS=1 cargo test -p tensor-wasm-tidy`
//! rewrites it from `cargo metadata`.

use std::path::{Path, PathBuf};
use std::process::Command;

use tensor_wasm_tidy::*;

/// Paths (relative to the repository root) where `unsafe` is allowed. Everything
/// else is checked; docs/ARCHITECTURE.md ("Where `unsafe` lives") says why each is here.
const UNSAFE_ALLOWED: &[&str] = &[
    "crates/tensor-wasm-mem/",
    "crates/tensor-wasm-gpu/",
    // The one call of wasmtime's `Module::deserialize` (artifacts this server wrote).
    "crates/tensor-wasm-runtime/src/engine.rs",
    // `unsafe fn LocalImage::map_into` (a copy-on-write file mapping whose file must not
    // change while mapped) and its callers, each call with its `// SAFETY:` comment.
    "crates/tensor-wasm-snapshot/src/local.rs",
    "crates/tensor-wasm-snapshot/tests/round_trip.rs",
    "crates/tensor-wasm-snapshot/benches/cold_start.rs",
    "crates/tensor-wasm-runtime/src/snapshot.rs",
    // `setpriority` on the calling thread: blocking work runs below the async threads.
    "crates/tensor-wasm-api/src/priority.rs",
    // Calling the `#[target_feature(enable = "fma")]` loop after detecting FMA at run time.
    "crates/tensor-wasm-jit/src/fma.rs",
    // AVX-512's gather and permutes after detecting it at run time, every index and length
    // checked first.
    "crates/tensor-wasm-jit/src/gather.rs",
    // The stand-in CUDA driver (test support): a C ABI needs `#[no_mangle] extern "C"`
    // functions with raw out-pointers, and its managed memory is raw mappings.
    "crates/tensor-wasm-cuda-standin/",
];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

fn walk(dir: &Path, ext: &str, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if name == "target" || name.to_string_lossy().starts_with('.') {
            continue;
        }
        if path.is_dir() {
            walk(&path, ext, out);
        } else if path.extension().is_some_and(|e| e == ext) {
            out.push(path);
        }
    }
}

fn rel(path: &Path) -> String {
    path.strip_prefix(root())
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/")
}

/// Every `.rs` file of the workspace crates and the fuzz targets.
fn sources() -> Vec<SourceFile> {
    let mut paths = Vec::new();
    walk(&root().join("crates"), "rs", &mut paths);
    walk(&root().join("fuzz"), "rs", &mut paths);
    paths.sort();
    paths
        .iter()
        .map(|p| SourceFile::new(rel(p), std::fs::read_to_string(p).unwrap()))
        .collect()
}

fn crate_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root().join("crates"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("Cargo.toml").is_file())
        .collect();
    dirs.sort();
    dirs
}

fn openapi() -> serde_json::Value {
    serde_json::from_str(&read("crates/tensor-wasm-api/openapi.json")).unwrap()
}

fn assert_clean(what: &str, found: Vec<String>) {
    assert!(
        found.is_empty(),
        "tidy: {what}:\n  {}\n",
        found.join("\n  ")
    );
}

#[test]
fn every_source_file_has_a_module_doc() {
    assert_clean("module docs", missing_module_docs(&sources()));
}

#[test]
fn no_source_file_is_too_long() {
    assert_clean(
        "source files over the size limit",
        oversized_files(&sources(), MAX_SOURCE_LINES),
    );
}

#[test]
fn unsafe_lives_only_where_allowed() {
    assert_clean("unsafe", unsafe_outside(&sources(), UNSAFE_ALLOWED));
}

#[test]
fn the_code_map_names_every_source_file() {
    let crates: Vec<CrateSources> = crate_dirs()
        .iter()
        .map(|dir| {
            let src = dir.join("src");
            let mut files = Vec::new();
            walk(&src, "rs", &mut files);
            let mut src_files: Vec<String> = files
                .iter()
                .map(|f| {
                    f.strip_prefix(&src)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/")
                })
                .collect();
            src_files.sort();
            let mut others = Vec::new();
            walk(&dir.join("benches"), "rs", &mut others);
            walk(&dir.join("tests"), "rs", &mut others);
            let other_files = others
                .iter()
                .map(|f| {
                    f.strip_prefix(dir)
                        .unwrap()
                        .to_string_lossy()
                        .replace('\\', "/")
                })
                .collect();
            CrateSources {
                name: dir.file_name().unwrap().to_string_lossy().into_owned(),
                src_files,
                other_files,
            }
        })
        .collect();
    assert_clean(
        "docs/ARCHITECTURE.md code map",
        code_map_drift(&read("docs/ARCHITECTURE.md"), &crates),
    );
}

#[test]
fn the_readme_lists_every_route_and_error_code() {
    let spec = openapi();
    let readme = read("README.md");
    assert_clean(
        "README route table (the OpenAPI document is checked against the router by the api tests)",
        route_table_drift(&readme, &openapi_routes(&spec)),
    );
    let codes = openapi_error_codes(&spec);
    assert!(
        codes.len() > 10,
        "no error codes found in the OpenAPI document"
    );
    assert_clean("README error codes", error_codes_missing(&readme, &codes));
}

#[test]
fn statuses_named_in_prose_match_the_error_code_table() {
    let table = tensor_wasm_tidy::error_code_statuses(&read("README.md"));
    assert!(
        table.len() > 30,
        "README's error-code table: {} codes",
        table.len()
    );
    let mut docs = vec![root().join("README.md"), root().join("BUILD.md")];
    walk(&root().join("docs"), "md", &mut docs);
    let found = docs
        .iter()
        .flat_map(|path| {
            let text = std::fs::read_to_string(path).expect("a doc");
            tensor_wasm_tidy::status_code_drift(&rel(path), &text, &table)
        })
        .collect();
    assert_clean("status codes in prose", found);
}

#[test]
fn build_md_names_every_make_target() {
    assert_clean(
        "make targets",
        tensor_wasm_tidy::undocumented_make_targets(&read("Makefile"), &read("BUILD.md")),
    );
}

#[test]
fn the_crate_graph_in_the_architecture_doc_is_cargo_metadata() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .args([
            "metadata",
            "--format-version",
            "1",
            "--no-deps",
            "--offline",
        ])
        .current_dir(root())
        .output()
        .expect("cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rendered = render_crate_graph(&crate_graph(&metadata));
    let doc = read("docs/ARCHITECTURE.md");
    let block = generated_block(&doc, "crate-graph").expect(
        "docs/ARCHITECTURE.md has no <!-- crate-graph:begin --> ... <!-- crate-graph:end --> block",
    );
    let block = block
        .trim_start_matches("```text\n")
        .trim_end_matches("```\n");
    if block == rendered {
        return;
    }
    if std::env::var_os("TIDY_BLESS").is_some() {
        let updated =
            replace_generated_block(&doc, "crate-graph", &format!("```text\n{rendered}```\n"))
                .unwrap();
        std::fs::write(root().join("docs/ARCHITECTURE.md"), updated).unwrap();
        return;
    }
    panic!(
        "tidy: docs/ARCHITECTURE.md's crate graph differs from `cargo metadata`; run \
         `TIDY_BLESS=1 cargo test -p tensor-wasm-tidy` to regenerate it. Expected:\n{rendered}"
    );
}

#[test]
fn doc_links_stay_inside_the_repository_and_resolve() {
    let mut docs = vec![
        root().join("README.md"),
        root().join("BUILD.md"),
        root().join("PERFORMANCE.md"),
        root().join("fuzz/README.md"),
    ];
    walk(&root().join("docs"), "md", &mut docs);
    walk(&root().join("bench-results"), "md", &mut docs);
    walk(&root().join("deploy"), "md", &mut docs);
    walk(&root().join("sdk"), "md", &mut docs);
    let root = root();
    let mut found = Vec::new();
    for doc in docs {
        let text = std::fs::read_to_string(&doc).unwrap();
        found.extend(broken_links(&rel(&doc), &text, |p| root.join(p).exists()));
    }
    assert_clean("doc links", found);
}
