//! The WIT packages of `sdk/wit/` (the GPU and guest spans for components) parse and resolve with
//! `wit-parser`, carry a version, and docs/components.md describes each of their interfaces,
//! functions and world.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../..")
        .canonicalize()
        .unwrap()
}

#[test]
fn the_gpu_wit_package_resolves_and_is_documented() {
    resolves_and_is_documented("gpu");
}

#[test]
fn the_trace_wit_package_resolves_and_is_documented() {
    resolves_and_is_documented("trace");
}

/// `sdk/wit/<name>.wit` is package `tensor-wasm:<name>@0.1.0`, and docs/components.md
/// names each of its interfaces, functions and worlds.
fn resolves_and_is_documented(name: &str) {
    let root = root();
    let mut resolve = wit_parser::Resolve::default();
    let (package, _) = resolve
        .push_path(root.join(format!("sdk/wit/{name}.wit")))
        .unwrap_or_else(|e| panic!("sdk/wit/{name}.wit: {e:#}"));
    let package = &resolve.packages[package];
    assert_eq!(
        (package.name.namespace.as_str(), package.name.name.as_str()),
        ("tensor-wasm", name)
    );
    assert_eq!(
        package
            .name
            .version
            .as_ref()
            .map(ToString::to_string)
            .as_deref(),
        Some("0.1.0"),
        "the package is versioned"
    );
    let docs = std::fs::read_to_string(root.join("docs/components.md")).unwrap();
    let mut missing = Vec::new();
    for (name, id) in &package.interfaces {
        if !docs.contains(&format!("`{name}`")) {
            missing.push(format!("interface `{name}`"));
        }
        let interface = &resolve.interfaces[*id];
        for function in interface.functions.values() {
            // Methods and static functions are documented by their own name.
            let short = function.name.rsplit('.').next().unwrap_or(&function.name);
            if !docs.contains(&format!("`{short}`")) {
                missing.push(format!("function `{}` of `{name}`", function.name));
            }
        }
    }
    for name in package.worlds.keys() {
        if !docs.contains(&format!("`{name}`")) {
            missing.push(format!("world `{name}`"));
        }
    }
    assert!(
        missing.is_empty(),
        "docs/components.md does not describe: {}",
        missing.join(", ")
    );
}
