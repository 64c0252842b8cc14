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

/// `examples/components/python/<module>.py` built by componentize-py for `world` of the WIT at
/// `wit` into `wasm`.
pub fn componentize_py_build(wit: &Path, world: &str, module: &str, wasm: &Path) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    build(
        Command::new(componentize_py())
            .arg("-d")
            .arg(wit)
            .args(["-w", world, "componentize", "-p"])
            .arg(root.join("examples/components/python"))
            .arg(module)
            .arg("-o")
            .arg(wasm),
        "componentize-py",
    );
}

/// `source` built by componentize-js for `world` of the WIT at `wit` into `wasm`; without its
/// `http` and `fetch-event` features unless `http` (an HTTP handler needs them).
pub fn componentize_js_build(source: &Path, wit: &Path, world: &str, http: bool, wasm: &Path) {
    let mut command = Command::new(tool(
        "TENSOR_WASM_COMPONENTIZE_JS",
        "componentize-js/node_modules/.bin/componentize-js",
    ));
    command
        .arg(source)
        .arg("--wit")
        .arg(wit)
        .args(["--world-name", world]);
    if !http {
        command.args(["--disable", "http", "fetch-event"]);
    }
    build(command.arg("-o").arg(wasm), "componentize-js");
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
    dependency_wit("wasmtime-wasi-http")
}

/// The `wit/` directory of the crate `name`, a dependency of the workspace (found through
/// `cargo metadata`).
fn dependency_wit(name: &str) -> PathBuf {
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
        .find(|p| p["name"] == name)
        .and_then(|p| p["manifest_path"].as_str())
        .unwrap_or_else(|| panic!("{name} is a dependency of the workspace"));
    let wit = Path::new(manifest).with_file_name("wit");
    assert!(wit.is_dir(), "{} is missing", wit.display());
    wit
}

/// `examples/components/nn-cmd.wit` with the WASI packages and, as its `wasi:nn`, the WIT
/// wasmtime's `wasi-nn` host is generated from (the `wasmtime-wasi-nn` crate's), in `out`:
/// a component built against it is one written for wasmtime's `wasi-nn`.
pub fn nn_cmd_wit(out: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let dir = wit_with_wasi_deps(out, &root.join("examples/components/nn-cmd.wit"));
    let nn = dir.join("deps/wasi-nn");
    std::fs::create_dir_all(&nn).expect("a WIT directory");
    std::fs::copy(
        dependency_wit("wasmtime-wasi-nn").join("wasi-nn.wit"),
        nn.join("wasi-nn.wit"),
    )
    .expect("copying wasmtime-wasi-nn's WIT");
    dir
}

/// `examples/components/python/nn_cmd.py` built by componentize-py into `out` (world
/// [`nn_cmd_wit`]).
pub fn python_nn_component(out: &Path) -> PathBuf {
    let wasm = out.join("nn-python.wasm");
    componentize_py_build(&nn_cmd_wit(out), "nn-cmd", "nn_cmd", &wasm);
    wasm
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

/// `examples/components/gpu-demo.wit` with `sdk/wit/gpu.wit` as its dependency, laid out in
/// `out` as WIT tools want it (the world, and the package it uses under `deps/`).
pub fn gpu_demo_wit(out: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let wit = out.join("gpu-demo-wit");
    std::fs::create_dir_all(wit.join("deps/tensor-wasm-gpu")).expect("a WIT directory");
    for (from, to) in [
        ("examples/components/gpu-demo.wit", "gpu-demo.wit"),
        ("sdk/wit/gpu.wit", "deps/tensor-wasm-gpu/gpu.wit"),
    ] {
        std::fs::copy(root.join(from), wit.join(to)).unwrap_or_else(|e| panic!("{from}: {e}"));
    }
    wit
}

/// `examples/components/python/gpu_app.py` built by componentize-py into `out` (world
/// [`gpu_demo_wit`]).
pub fn python_gpu_component(out: &Path) -> PathBuf {
    let wasm = out.join("gpu-python.wasm");
    componentize_py_build(&gpu_demo_wit(out), "gpu-demo", "gpu_app", &wasm);
    wasm
}

/// `examples/components/js/gpu.js` built by componentize-js into `out` (world
/// [`gpu_demo_wit`]).
pub fn js_gpu_component(out: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let wasm = out.join("gpu-js.wasm");
    let source = root.join("examples/components/js/gpu.js");
    componentize_js_build(&source, &gpu_demo_wit(out), "gpu-demo", false, &wasm);
    wasm
}

/// `examples/components/c/gpu.c` built with wit-bindgen, clang and wasm-tools into `out`
/// (world [`gpu_demo_wit`]).
pub fn c_gpu_component(out: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let wit = gpu_demo_wit(out);
    c_component(
        out,
        &wit,
        Some("gpu-demo"),
        "gpu_demo",
        &root.join("examples/components/c/gpu.c"),
    )
}

/// Deploys a component of world `gpu-demo` ([`python_gpu_component`], [`js_gpu_component`],
/// [`c_gpu_component`]) to `server` as `name` and checks what it computes on the server's
/// backend: `vector_add` then `scale` chained on device buffers equal to the same float
/// arithmetic in the guest, `matmul` within rounding of the guest's, and each misuse of the
/// GPU interface answered with the error the core ABI gives (the server serving on).
pub fn check_gpu_demo(server: &crate::serve::ServeProcess, wasm: &Path, name: &str) {
    use serde_json::{json, Value};
    let id = server.deploy(
        wasm,
        &format!("name={name}&timeout_ms=20000&memory_limit_bytes=134217728"),
    );
    let call = |export: &str, args: Value| -> Value {
        let (status, body) = server.call(&id, export, args);
        assert_eq!(status, 200, "{name} {export}: {body}");
        body["results"][0].clone()
    };
    let chained = call("add-then-scale", json!([1000, 1.5]));
    assert_eq!(
        chained,
        json!({"ok": {"first": [375.0, 375.375, 375.75, 376.125], "mismatches": 0}}),
        "{name}"
    );
    let worst = call("matmul-check", json!([33, 17, 29]));
    let worst = worst["ok"].as_f64().unwrap_or_else(|| panic!("{worst}"));
    assert!(
        worst < 1e-3,
        "{name}: matmul differs from the guest's by {worst}"
    );
    for (what, error) in [
        ("oversized", "Error_LimitExceeded"),
        ("out-of-range", "Error_InvalidArgument"),
        ("unknown-blueprint", "Error_InvalidArgument"),
        // Tenant PTX without the raw_ptx capability is verified and fenced; this text has
        // no entry `k`.
        ("raw-ptx", "Error_InvalidArgument"),
        ("bad-args", "Error_InvalidArgument"),
        ("hog", "Error_LimitExceeded"),
    ] {
        let answer = call("misuse", json!([what]));
        let text = answer["ok"].as_str().unwrap_or_default();
        assert!(text.starts_with(error), "{name} {what}: {answer}");
    }
    assert_eq!(
        call("add-then-scale", json!([8, 2.0]))["ok"]["mismatches"],
        json!(0),
        "still serving"
    );
}

/// wit-bindgen, pinned by `make deps`.
pub fn wit_bindgen() -> PathBuf {
    tool("TENSOR_WASM_WIT_BINDGEN", "bin/wit-bindgen")
}

/// wasm-tools, pinned by `make deps`.
pub fn wasm_tools() -> PathBuf {
    tool("TENSOR_WASM_WASM_TOOLS", "bin/wasm-tools")
}

/// A C component: bindings for `world` of the WIT at `wit` generated by wit-bindgen (the
/// world's last name, `bindings`, names the generated files), `source` compiled with them by
/// clang into a reactor core module, wrapped by `wasm-tools component new` into
/// `out/<bindings>.wasm`.
pub fn c_component(
    out: &Path,
    wit: &Path,
    world: Option<&str>,
    bindings: &str,
    source: &Path,
) -> PathBuf {
    let generated = out.join(format!("{bindings}-bindings"));
    let mut command = Command::new(wit_bindgen());
    command.arg("c").arg(wit).arg("--out-dir").arg(&generated);
    if let Some(world) = world {
        command.args(["--world", world]);
    }
    build(&mut command, "wit-bindgen c");
    let core = out.join(format!("{bindings}.core.wasm"));
    build(
        Command::new("clang")
            .args(["--target=wasm32-wasi", "-O2", "-mexec-model=reactor", "-I"])
            .arg(&generated)
            .arg(source)
            .arg(generated.join(format!("{bindings}.c")))
            .arg(generated.join(format!("{bindings}_component_type.o")))
            .arg("-o")
            .arg(&core),
        "clang",
    );
    let wasm = out.join(format!("{bindings}.wasm"));
    build(
        Command::new(wasm_tools())
            .args(["component", "new"])
            .arg(&core)
            .arg("-o")
            .arg(&wasm),
        "wasm-tools component new",
    );
    wasm
}

/// A WIT directory in `out` holding `world_file` and, under `deps/`, the WASI 0.2 packages
/// of [`wasi_http_wit`] (cli, io, clocks, ...), for a world of ours that uses them.
pub fn wit_with_wasi_deps(out: &Path, world_file: &Path) -> PathBuf {
    let dir = out.join("wit-with-wasi");
    let deps = dir.join("deps");
    std::fs::create_dir_all(&deps).expect("a WIT directory");
    let name = world_file.file_name().expect("a file name");
    std::fs::copy(world_file, dir.join(name)).expect("copying the world");
    let wasi = wasi_http_wit().join("deps");
    for entry in std::fs::read_dir(&wasi).expect("the wasi:http WIT's deps") {
        let path = entry.expect("an entry").path();
        std::fs::copy(&path, deps.join(path.file_name().expect("a file name")))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    }
    dir
}

/// The WASI WIT of [`wasi_http_wit`] as an earlier 0.2 patch version `version` (such as
/// `0.2.10`), in `out`: the packages' versions rewritten and the items added after `version`
/// (`@since` a later one) left out; with the world file `world` beside them (its WASI versions
/// rewritten too), or else a world `app` that includes `wasi:http/proxy`. For toolchains built
/// against that version: componentize-js 0.23.0's engine imports and exports WASI 0.2.10. A
/// 0.2 host serves any 0.2 patch version.
pub fn wasi_wit_as(out: &Path, version: &str, world: Option<&Path>) -> PathBuf {
    let patch = |v: &str| -> u32 {
        v.strip_prefix("0.2.")
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("{v} is not a 0.2 version"))
    };
    let target = patch(version);
    let source = wasi_http_wit();
    let dir = out.join(format!("wasi-http-{version}"));
    std::fs::create_dir_all(dir.join("deps")).expect("a WIT directory");
    for entry in std::fs::read_dir(source.join("deps")).expect("the wasi:http WIT's deps") {
        let path = entry.expect("an entry").path();
        let text = std::fs::read_to_string(&path).expect("a WIT file");
        let from = format!("@0.2.{}", source_patch(&text));
        let to = format!("@{version}");
        let (mut kept, mut docs, mut skipping) = (String::new(), String::new(), false);
        for line in text.lines() {
            let trimmed = line.trim_start();
            if skipping {
                // A later item ends at its `;` (the ones added in 0.2 patches are functions).
                skipping = !trimmed.ends_with(';');
                continue;
            }
            if trimmed.starts_with("///") {
                docs.push_str(line);
                docs.push('\n');
                continue;
            }
            let since = trimmed
                .strip_prefix("@since(version = ")
                .and_then(|rest| rest.strip_suffix(')'));
            if since.is_some_and(|v| v.starts_with("0.2.") && patch(v) > target) {
                docs.clear();
                skipping = true;
                continue;
            }
            kept.push_str(&docs);
            docs.clear();
            kept.push_str(&line.replace(&from, &to));
            kept.push('\n');
        }
        kept.push_str(&docs);
        std::fs::write(
            dir.join("deps").join(path.file_name().expect("a name")),
            kept,
        )
        .expect("writing WIT");
    }
    let (name, text) = match world {
        Some(path) => {
            let text =
                std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let from = format!("@0.2.{}", source_patch_of_wasi(&source));
            let name = path.file_name().expect("a file name").to_owned();
            (name, text.replace(&from, &format!("@{version}")))
        }
        None => (
            "app.wit".into(),
            format!(
                "package tensor-wasm-tests:app;\n\nworld app {{\n    include \
                 wasi:http/proxy@{version};\n}}\n"
            ),
        ),
    };
    std::fs::write(dir.join(name), text).expect("writing the world");
    dir
}

/// The patch number of the WASI 0.2 version of the WIT of [`wasi_http_wit`] at `wit`.
fn source_patch_of_wasi(wit: &Path) -> u32 {
    source_patch(&std::fs::read_to_string(wit.join("deps/http.wit")).expect("http.wit"))
}

/// The patch number of the 0.2 version of the package a WIT file declares.
fn source_patch(text: &str) -> u32 {
    text.lines()
        .find_map(|line| line.trim().strip_prefix("package "))
        .and_then(|p| p.split_once("@0.2."))
        .and_then(|(_, rest)| rest.trim_end_matches(';').parse().ok())
        .expect("a package of version 0.2.x")
}
