//! A Python function from a real toolchain (issue 20): `examples/components/python` built by
//! componentize-py (pinned, installed by `make deps` into `.tools/componentize-py`) into a
//! WASI 0.2 component, deployed to a real `tensor-wasm serve` and called through the HTTP API
//! with JSON arguments converted by its WIT types. Its hostile variants (an exception, an
//! endless loop, a memory hog) are answered with the usual error codes, and the server keeps
//! serving.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{json, Value};
use tensor_wasm_test_support::guests::examples_dir;
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess};

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

fn componentize_py() -> PathBuf {
    let tool = std::env::var_os("TENSOR_WASM_COMPONENTIZE_PY").map_or_else(
        || {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../.tools/componentize-py/bin/componentize-py")
        },
        PathBuf::from,
    );
    assert!(
        tool.exists(),
        "{} is missing: run `make deps` (it installs componentize-py)",
        tool.display()
    );
    tool
}

#[test]
fn a_python_component_from_componentize_py_is_served() {
    let source = examples_dir().join("components/python");
    let out = tempfile::tempdir().unwrap();
    let wasm = out.path().join("calc.wasm");
    let built = Command::new(componentize_py())
        .arg("-d")
        .arg(source.join("calc.wit"))
        .args(["-w", "calc", "componentize", "-p"])
        .arg(&source)
        .arg("app")
        .arg("-o")
        .arg(&wasm)
        .output()
        .expect("running componentize-py");
    assert!(
        built.status.success(),
        "componentize-py: {}",
        String::from_utf8_lossy(&built.stderr)
    );

    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &[]);
    let id = server.deploy(
        &wasm,
        "name=calc&timeout_ms=2000&memory_limit_bytes=134217728",
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
    assert_eq!(call("add", json!([40, 2])), (200, json!({"results": [42]})));
    assert_eq!(
        call("norm", json!([{"x": 3, "y": 4}])),
        (200, json!({"results": [5.0]}))
    );
    assert_eq!(
        call("greet", json!(["tensor"])),
        (200, json!({"results": ["hello, tensor"]}))
    );
    assert_eq!(
        call("words", json!(["to be or not to be"])),
        (200, json!({"results": [[4, 6]]}))
    );
    let (status, body) = call("greet", json!([7]));
    assert_eq!(
        (status, error_code(&body)),
        (400, "invalid_arguments"),
        "{body}"
    );

    // Hostile variants.
    let (status, body) = call("boom", json!([]));
    assert_eq!((status, error_code(&body)), (500, "guest_trap"), "{body}");
    let (status, body) = call("spin", json!([]));
    assert_eq!(
        (status, error_code(&body)),
        (504, "invocation_timeout"),
        "{body}"
    );
    let (status, body) = call("hog", json!([512]));
    assert_eq!(
        (status, error_code(&body)),
        (500, "memory_limit_exceeded"),
        "{body}"
    );
    assert_eq!(call("hog", json!([8])), (200, json!({"results": [8]})));
    assert_eq!(call("add", json!([1, 2])), (200, json!({"results": [3]})));
    server.terminate();
}
