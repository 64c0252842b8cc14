//! Functions from real component toolchains (issue 20): one WIT world
//! (`examples/components/calc.wit`) implemented in Python (`examples/components/python/app.py`,
//! built by componentize-py) and in JavaScript (`examples/components/js/app.js`, built by
//! componentize-js), both pinned and installed by `make deps` under `.tools/`. Each is built
//! here into a WASI 0.2 component, deployed to one real `tensor-wasm serve` and called through
//! the HTTP API with JSON arguments converted by its WIT types. Their hostile variants (an
//! exception, an endless loop, a memory hog) are answered with the usual error codes, and the
//! server keeps serving.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use tensor_wasm_test_support::guests::examples_dir;
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess};
use tensor_wasm_test_support::toolchains::{
    build, check_python_gpu, componentize_py, python_gpu_component, tool,
};

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

/// `examples/components/python` built by componentize-py into `out`.
fn python_component(out: &Path) -> PathBuf {
    let components = examples_dir().join("components");
    let wasm = out.join("calc-python.wasm");
    build(
        Command::new(componentize_py())
            .arg("-d")
            .arg(components.join("calc.wit"))
            .args(["-w", "calc", "componentize", "-p"])
            .arg(components.join("python"))
            .arg("app")
            .arg("-o")
            .arg(&wasm),
        "componentize-py",
    );
    wasm
}

/// `examples/components/js` built by componentize-js into `out`.
fn js_component(out: &Path) -> PathBuf {
    let components = examples_dir().join("components");
    let wasm = out.join("calc-js.wasm");
    build(
        Command::new(tool(
            "TENSOR_WASM_COMPONENTIZE_JS",
            "componentize-js/node_modules/.bin/componentize-js",
        ))
        .arg(components.join("js/app.js"))
        .arg("--wit")
        .arg(components.join("calc.wit"))
        // Outgoing HTTP (fetch) is not offered to guests: built without it.
        .args([
            "--world-name",
            "calc",
            "--disable",
            "http",
            "fetch-event",
            "-o",
        ])
        .arg(&wasm),
        "componentize-js",
    );
    wasm
}

/// The calls every implementation of `calc.wit` answers alike.
fn check_calc(server: &ServeProcess, wasm: &Path, name: &str) {
    let id = server.deploy(
        wasm,
        &format!("name={name}&timeout_ms=2000&memory_limit_bytes=134217728"),
    );
    let call = |export: &str, args: Value| -> (u16, Value) {
        let body = json!({"export": export, "args": args}).to_string();
        let (status, body, _) = server.post(
            &format!("/functions/{id}/invoke"),
            "application/json",
            body.as_bytes(),
        );
        (status, json_of(&body))
    };
    let ok = |results: Value| (200, json!({ "results": results }));
    assert_eq!(call("add", json!([40, 2])), ok(json!([42])), "{name}");
    assert_eq!(
        call("norm", json!([{"x": 3, "y": 4}])),
        ok(json!([5.0])),
        "{name}"
    );
    assert_eq!(
        call("greet", json!(["tensor"])),
        ok(json!(["hello, tensor"])),
        "{name}"
    );
    assert_eq!(
        call("words", json!(["to be or not to be"])),
        ok(json!([[4, 6]])),
        "{name}"
    );
    let (status, body) = call("greet", json!([7]));
    assert_eq!(
        (status, error_code(&body)),
        (400, "invalid_arguments"),
        "{name}: {body}"
    );

    // Hostile variants.
    let (status, body) = call("boom", json!([]));
    assert_eq!(
        (status, error_code(&body)),
        (500, "guest_trap"),
        "{name}: {body}"
    );
    let (status, body) = call("spin", json!([]));
    assert_eq!(
        (status, error_code(&body)),
        (504, "invocation_timeout"),
        "{name}: {body}"
    );
    let (status, body) = call("hog", json!([512]));
    assert_eq!(
        (status, error_code(&body)),
        (500, "memory_limit_exceeded"),
        "{name}: {body}"
    );
    assert_eq!(call("hog", json!([8])), ok(json!([8])), "{name}");
    assert_eq!(
        call("add", json!([1, 2])),
        ok(json!([3])),
        "{name}: still serving"
    );
}

#[test]
fn components_from_python_and_javascript_toolchains_are_served() {
    let out = tempfile::tempdir().unwrap();
    let (python, js) = std::thread::scope(|scope| {
        let python = scope.spawn(|| python_component(out.path()));
        let js = scope.spawn(|| js_component(out.path()));
        (python.join().unwrap(), js.join().unwrap())
    });
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &[]);
    check_calc(&server, &python, "calc-python");
    check_calc(&server, &js, "calc-js");
    server.terminate();
}

/// The GPU for components: a Python function (`examples/components/python/gpu_app.py`) runs
/// blueprints on `tensor-wasm:gpu` buffers on the CPU backend and checks their results against
/// plain Python; its misuses of the interface get the core ABI's errors. (The same component
/// on the emulated CUDA driver: `standin.rs`.)
#[test]
fn a_python_function_runs_kernels_on_gpu_buffers_on_the_cpu_backend() {
    let out = tempfile::tempdir().unwrap();
    let wasm = python_gpu_component(out.path());
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &["--device", "cpu"]);
    check_python_gpu(&server, &wasm);
    server.terminate();
}
