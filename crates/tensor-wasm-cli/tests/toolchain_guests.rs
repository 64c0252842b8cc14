//! Functions from real component toolchains, all pinned and installed by
//! `make deps` under `.tools/`:
//! - one WIT world (`examples/components/calc.wit`) implemented in Python
//!   (`examples/components/python/app.py`, componentize-py), JavaScript
//!   (`examples/components/js/app.js`, componentize-js) and C (`examples/components/c/calc.c`,
//!   wit-bindgen, clang and `wasm-tools component new`), each deployed to a real
//!   `tensor-wasm serve` and called with JSON arguments converted by its WIT types; their
//!   hostile variants (an exception, an endless loop, a memory hog) answer the usual error
//!   codes while the server keeps serving;
//! - C in the other two styles: a command (`c/upper.c`) and an HTTP handler (`c/http.c`);
//! - commands in Python (`python/upper_cmd.py`) and JavaScript (`js/upper.js`);
//! - the GPU for components: one world (`gpu-demo.wit`) in Python, JavaScript and C running
//!   blueprints on `tensor-wasm:gpu` buffers on the CPU backend.
//!
//! Python's HTTP handler: `http_handlers.rs`; the GPU function over the emulated CUDA driver:
//! `standin.rs`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Value};
use tensor_wasm_test_support::guests::examples_dir;
use tensor_wasm_test_support::serve::{error_code, json_of, ServeProcess};
use tensor_wasm_test_support::toolchains::{
    c_component, c_gpu_component, check_gpu_demo, componentize_js_build, componentize_py_build,
    js_gpu_component, python_gpu_component, wasi_http_proxy_world, wasi_http_wit, wasi_wit_as,
    wit_with_wasi_deps,
};

const BIN: &str = env!("CARGO_BIN_EXE_tensor-wasm");

/// `examples/components/python/app.py` built by componentize-py into `out`.
fn python_component(out: &Path) -> PathBuf {
    let wasm = out.join("calc-python.wasm");
    let wit = examples_dir().join("components/calc.wit");
    componentize_py_build(&wit, "calc", "app", &wasm);
    wasm
}

/// `examples/components/js/app.js` built by componentize-js into `out` (without `fetch`: the
/// function needs none).
fn js_component(out: &Path) -> PathBuf {
    let components = examples_dir().join("components");
    let wasm = out.join("calc-js.wasm");
    let (source, wit) = (components.join("js/app.js"), components.join("calc.wit"));
    componentize_js_build(&source, &wit, "calc", false, &wasm);
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

/// The GPU for components: one world (`examples/components/gpu-demo.wit`) in Python
/// (`python/gpu_app.py`), JavaScript (`js/gpu.js`) and C (`c/gpu.c`) runs blueprints on
/// `tensor-wasm:gpu` buffers on the CPU backend and checks their results against the guest's
/// own arithmetic; their misuses of the interface get the core ABI's errors. (On the emulated
/// CUDA driver: `standin.rs`.)
#[test]
fn functions_in_three_languages_run_kernels_on_gpu_buffers_on_the_cpu_backend() {
    let out = tempfile::tempdir().unwrap();
    let (python, js, c) = std::thread::scope(|scope| {
        let python = scope.spawn(|| python_gpu_component(&out.path().join("python")));
        let js = scope.spawn(|| js_gpu_component(&out.path().join("js")));
        let c = scope.spawn(|| c_gpu_component(&out.path().join("c")));
        (
            python.join().unwrap(),
            js.join().unwrap(),
            c.join().unwrap(),
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &["--device", "cpu"]);
    check_gpu_demo(&server, &python, "gpu-python");
    check_gpu_demo(&server, &js, "gpu-js");
    check_gpu_demo(&server, &c, "gpu-c");
    server.terminate();
}

/// C components from wit-bindgen and wasm-tools, one per style: `examples/components/c/calc.c`
/// (typed exports of `calc.wit`, answering as the Python and JavaScript ones do),
/// `upper.c` (a command, world `upper.wit`) and `http.c` (an HTTP handler, world
/// `wasi:http/proxy`), each with its hostile requests: the HTTP handler's waits in the host
/// (`serve::hostile_waits_in_a_row`) and its hoarded header fields among them.
#[test]
fn c_components_from_wit_bindgen_are_served_in_all_three_styles() {
    let out = tempfile::tempdir().unwrap();
    let components = examples_dir().join("components");
    let c = components.join("c");
    let calc = c_component(
        out.path(),
        &components.join("calc.wit"),
        None,
        "calc",
        &c.join("calc.c"),
    );
    let upper_wit = wit_with_wasi_deps(out.path(), &components.join("upper.wit"));
    let upper = c_component(
        out.path(),
        &upper_wit,
        Some("upper"),
        "upper",
        &c.join("upper.c"),
    );
    let wit = wasi_http_wit();
    let proxy = wasi_http_proxy_world(&wit);
    let http_wasm = c_component(out.path(), &wit, Some(&proxy), "proxy", &c.join("http.c"));

    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &[]);
    check_calc(&server, &calc, "calc-c");

    // The command: stdin upper-cased to stdout.
    let upper = server.deploy(&upper, "name=upper-c&timeout_ms=2000");
    let run = |stdin: &[u8]| {
        let (status, body, exit) =
            server.post(&format!("/functions/{upper}/invoke"), "text/plain", stdin);
        (status, body, exit)
    };
    let (status, body, exit) = run(b"hello, component world");
    assert_eq!(
        (status, body.as_slice(), exit.as_deref()),
        (200, &b"HELLO, COMPONENT WORLD"[..], Some("0"))
    );
    let big: Vec<u8> = (0..200_000u32)
        .map(|i| b"abc xyz\n"[i as usize % 8])
        .collect();
    let (status, body, _) = run(&big);
    assert_eq!(status, 200);
    assert!(
        body == big.to_ascii_uppercase(),
        "the large stdin came back changed"
    );
    let (status, body, _) = run(b"boom");
    assert_eq!((status, error_code(&json_of(&body))), (500, "guest_trap"));
    let (status, body, _) = run(b"spin");
    assert_eq!(
        (status, error_code(&json_of(&body))),
        (504, "invocation_timeout")
    );

    // The HTTP handler.
    let http = server.deploy(&http_wasm, "name=http-c&timeout_ms=2000");
    let at = |path: &str| format!("/functions/{http}/http{path}");
    assert_eq!(server.get(&at("/hello")), (200, b"hello from C\n".to_vec()));
    let (status, body) = server.get(&at("/items/42?x=1"));
    assert_eq!(
        (status, json_of(&body)),
        (200, json!({"id": 42, "method": "GET"}))
    );
    let (status, body) = server.get(&at("/nowhere"));
    assert_eq!(
        (status, json_of(&body)),
        (404, json!({"error": "not found", "path": "/nowhere"}))
    );
    let (status, body, _) = server.post(&at("/echo"), "application/octet-stream", &big);
    assert_eq!(status, 200);
    assert!(body == big, "the echoed body differs");
    let (status, body) = server.get(&at("/boom"));
    assert_eq!((status, error_code(&json_of(&body))), (500, "guest_trap"));
    let (status, body) = server.get(&at("/spin"));
    assert_eq!(
        (status, error_code(&json_of(&body))),
        (504, "invocation_timeout")
    );
    // Header fields it keeps making count against its memory limit (32 MiB here).
    let hoarder = server.deploy(
        &http_wasm,
        "name=http-c-hoard&timeout_ms=30000&memory_limit_bytes=33554432",
    );
    let (status, body) = server.get(&format!("/functions/{hoarder}/http/hoard"));
    assert_eq!(
        (status, error_code(&json_of(&body))),
        (500, "memory_limit_exceeded")
    );
    assert_eq!(server.get(&at("/hello")).0, 200, "still serving");
    // A request body that stops arriving: the handler (which answers 200 before it reads)
    // waits in the host for the rest; at the deadline (2 s) the response is cut off and the
    // connection closed, while the client still holds its side open.
    let addr = server
        .url("")
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_owned();
    let mut stalled = std::net::TcpStream::connect(&addr).expect("connecting");
    let head = format!(
        "POST {} HTTP/1.1\r\nhost: {addr}\r\nauthorization: {}\r\ncontent-length: 100\r\n\r\n0123456789",
        at("/echo"),
        server.auth()
    );
    std::io::Write::write_all(&mut stalled, head.as_bytes()).expect("writing");
    stalled
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut answer = Vec::new();
    std::io::Read::read_to_end(&mut stalled, &mut answer).expect("closed before 30 s");
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.starts_with("HTTP/1.1 200") && !answer.ends_with("0\r\n\r\n"),
        "{answer}"
    );
    assert_eq!(server.get(&at("/hello")).0, 200, "still serving");
    // Waits in the host, 50 in a row, each ended at a 200 ms deadline.
    let hostile = server.deploy(&http_wasm, "name=http-c-hostile&timeout_ms=200");
    tensor_wasm_test_support::serve::hostile_waits_in_a_row(&server, &hostile);
    server.terminate();
}

/// Commands from the Python and JavaScript toolchains: `examples/components/python/upper_cmd.py`
/// (componentize-py, world `wasi:cli/command`: Python's own stdin and stdout) and
/// `examples/components/js/upper.js` (componentize-js, world `upper.wit` against the WASI WIT as
/// 0.2.10), stdin upper-cased to stdout. An exception is a trap in Python and a failing `run`
/// (exit code 1) in JavaScript; an endless loop is stopped at the deadline.
#[test]
fn commands_from_python_and_javascript_toolchains_run() {
    let out = tempfile::tempdir().unwrap();
    let components = examples_dir().join("components");
    let (python, js) = std::thread::scope(|scope| {
        let python = scope.spawn(|| {
            let wit = wasi_http_wit();
            let wasm = out.path().join("upper-python.wasm");
            let world = wasi_http_proxy_world(&wit).replace("wasi:http/proxy", "wasi:cli/command");
            componentize_py_build(&wit, &world, "upper_cmd", &wasm);
            wasm
        });
        let js = scope.spawn(|| {
            let wit = wasi_wit_as(out.path(), "0.2.10", Some(&components.join("upper.wit")));
            let wasm = out.path().join("upper-js.wasm");
            componentize_js_build(&components.join("js/upper.js"), &wit, "upper", false, &wasm);
            wasm
        });
        (python.join().unwrap(), js.join().unwrap())
    });
    let dir = tempfile::tempdir().unwrap();
    let server = ServeProcess::start(Path::new(BIN), dir.path(), &[]);
    let big: Vec<u8> = (0..200_000u32)
        .map(|i| b"abc xyz\n"[i as usize % 8])
        .collect();
    for (wasm, name, boom) in [
        (&python, "upper-python", "trap"),
        (&js, "upper-js", "exit 1"),
    ] {
        let id = server.deploy(wasm, &format!("name={name}&timeout_ms=3000"));
        let run =
            |stdin: &[u8]| server.post(&format!("/functions/{id}/invoke"), "text/plain", stdin);
        let (status, body, exit) = run(b"hello, component world");
        assert_eq!(
            (status, body.as_slice(), exit.as_deref()),
            (200, &b"HELLO, COMPONENT WORLD"[..], Some("0")),
            "{name}"
        );
        let (status, body, _) = run(&big);
        assert_eq!(status, 200, "{name}");
        assert!(
            body == big.to_ascii_uppercase(),
            "{name}: the large stdin came back changed"
        );
        let (status, body, exit) = run(b"boom");
        match boom {
            "trap" => assert_eq!(
                (status, error_code(&json_of(&body))),
                (500, "guest_trap"),
                "{name}"
            ),
            _ => assert_eq!((status, exit.as_deref()), (200, Some("1")), "{name}"),
        }
        let (status, body, _) = run(b"spin");
        assert_eq!(
            (status, error_code(&json_of(&body))),
            (504, "invocation_timeout"),
            "{name}"
        );
    }
    server.terminate();
}
