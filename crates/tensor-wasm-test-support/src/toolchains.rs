//! The component toolchains `make deps` installs under `.tools/` (componentize-py,
//! componentize-js), and the WIT of `wasi:http` that guests of the HTTP-handler style are
//! built against: the one the server's `wasi:http` host (the `wasmtime-wasi-http` crate) is
//! generated from, found through `cargo metadata`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// A tool under `.tools/`, or where the environment variable `variable` says; panics with how
/// to install it when it is missing.
pub fn tool(variable: &str, under_tools: &str) -> PathBuf {
    let path = std::env::var_os(variable).map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.tools")
                .join(under_tools)
        },
        PathBuf::from,
    );
    assert!(
        path.exists(),
        "{} is missing: run `make deps` (it installs the component toolchains)",
        path.display()
    );
    path
}

/// componentize-py, pinned by `make deps`.
pub fn componentize_py() -> PathBuf {
    tool(
        "TENSOR_WASM_COMPONENTIZE_PY",
        "componentize-py/bin/componentize-py",
    )
}

/// Runs a toolchain's build; panics with its output when it fails.
pub fn build(command: &mut Command, what: &str) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("running {what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The `wit/` directory of the `wasmtime-wasi-http` crate this workspace builds against: the
/// `wasi:http` package (and its dependencies) that the server implements.
pub fn wasi_http_wit() -> PathBuf {
    let out = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        // This platform's packages only: the others' may not be downloaded.
        .args([
            "metadata",
            "--format-version",
            "1",
            "--offline",
            "--filter-platform",
        ])
        .arg(host_triple())
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "cargo metadata: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let metadata: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata JSON");
    let manifest = metadata["packages"]
        .as_array()
        .expect("packages")
        .iter()
        .find(|p| p["name"] == "wasmtime-wasi-http")
        .and_then(|p| p["manifest_path"].as_str())
        .expect("wasmtime-wasi-http is a dependency of the workspace");
    let wit = Path::new(manifest).with_file_name("wit");
    assert!(wit.is_dir(), "{} is missing", wit.display());
    wit
}

/// The target triple of the host, from `rustc -vV`.
fn host_triple() -> String {
    let out = Command::new(std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()))
        .arg("-vV")
        .output()
        .expect("running rustc -vV");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find_map(|line| line.strip_prefix("host: "))
        .expect("rustc -vV names the host")
        .to_owned()
}

/// The `wasi:http/proxy` world's full name in the WIT of [`wasi_http_wit`]
/// (`wasi:http/proxy@0.2.x`).
pub fn wasi_http_proxy_world(wit: &Path) -> String {
    let http = std::fs::read_to_string(wit.join("deps/http.wit"))
        .unwrap_or_else(|e| panic!("{}: {e}", wit.join("deps/http.wit").display()));
    let package = http
        .lines()
        .find_map(|line| line.trim().strip_prefix("package "))
        .and_then(|rest| rest.strip_suffix(';'))
        .expect("a package line in http.wit");
    let (name, version) = package.split_once('@').expect("a versioned package");
    format!("{name}/proxy@{version}")
}
