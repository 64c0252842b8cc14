//! WebAssembly components (WASI 0.2) through the runtime's public API: a command component
//! (`wasi:cli/run`) deploys and runs like a WASI preview 1 command, stdin in and stdout out,
//! with the function's deadline, memory limit and exit code; it is served again after a
//! restart; typed exports take and give JSON by their WIT types; components with nothing to
//! invoke, a mistyped HTTP handler and components this host cannot link are refused clearly.
//!
//! The components are written in the component text format here, so that each test shows the
//! whole guest; guests from real toolchains: `crates/tensor-wasm-cli/tests/toolchain_guests.rs`
//! and `http_handlers.rs`.

use std::path::Path;

use tensor_wasm_runtime::{DeploySpec, Runtime, RuntimeConfig, RuntimeError};
use tensor_wasm_test_support::app::open_runtime;
use tensor_wasm_test_support::guests::MISTYPED_HTTP_HANDLER_COMPONENT;

fn open(dir: &Path) -> Runtime {
    open_runtime(RuntimeConfig::for_tests(dir), &prometheus::Registry::new())
}

/// `examples/echo-component.wat` with `run`'s body replaced by `body` (which leaves `run`'s
/// result: 0 ok, 1 error; `call $echo` copies stdin to stdout).
fn command(body: &str) -> Vec<u8> {
    let wat = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/echo-component.wat"),
    )
    .expect("examples/echo-component.wat");
    let wat = wat.replace("call $echo i32.const 0))", &format!("{body}))"));
    wat::parse_str(&wat).expect("a component in the text format")
}

#[test]
fn a_command_component_runs_with_stdin_stdout_and_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let echo = rt
        .deploy(&command("call $echo i32.const 0"), DeploySpec::wasi("echo"))
        .unwrap();
    assert!(echo.record.component);
    assert!(echo.exports.is_empty());
    assert!(
        echo.typed_exports.is_empty(),
        "a command has no typed exports"
    );
    // Its compiled code is kept, so a restart does not compile it again.
    let artifact = format!("{}.cwasm", echo.record.module_sha256);
    let artifacts: Vec<_> = std::fs::read_dir(dir.path().join("artifacts"))
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(artifacts.contains(&artifact), "{artifacts:?}");
    let out = rt
        .invoke_command(&echo.record.id, b"hello, component\n".to_vec())
        .unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout, b"hello, component\n");

    let failing = rt
        .deploy(
            &command("call $echo i32.const 1"),
            DeploySpec::wasi("fails"),
        )
        .unwrap();
    let out = rt
        .invoke_command(&failing.record.id, b"partial".to_vec())
        .unwrap();
    assert_eq!((out.exit_code, out.stdout.as_slice()), (1, &b"partial"[..]));

    // Deployed as "export" too: what the component exports decides.
    let as_export = rt
        .deploy(&command("i32.const 0"), DeploySpec::export("quiet"))
        .unwrap();
    assert_eq!(as_export.record.style.as_str(), "wasi");

    // After a restart the component is compiled again from the store and served.
    let id = echo.record.id.clone();
    drop(rt);
    let rt = open(dir.path());
    assert_eq!(rt.warm_up(), 0, "every function loads, components included");
    let out = rt.invoke_command(&id, b"again".to_vec()).unwrap();
    assert_eq!(out.stdout, b"again");
    assert!(rt.delete(&id).unwrap());
}

#[test]
fn a_command_component_is_held_to_its_deadline_and_memory_limit() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let spin = rt
        .deploy(
            &command("(loop $forever (br $forever)) i32.const 0"),
            DeploySpec {
                timeout_ms: Some(100),
                ..DeploySpec::wasi("spin")
            },
        )
        .unwrap();
    let err = rt.invoke_command(&spin.record.id, Vec::new()).unwrap_err();
    assert!(
        matches!(err, RuntimeError::Timeout { timeout_ms: 100 }),
        "{err:?}"
    );

    let hog = rt
        .deploy(
            &command("(drop (memory.grow (i32.const 64))) i32.const 0"),
            DeploySpec {
                memory_limit_bytes: Some(1 << 20),
                ..DeploySpec::wasi("hog")
            },
        )
        .unwrap();
    let err = rt.invoke_command(&hog.record.id, Vec::new()).unwrap_err();
    assert!(matches!(err, RuntimeError::MemoryLimit(_)), "{err:?}");

    let trap = rt
        .deploy(&command("unreachable"), DeploySpec::wasi("trap"))
        .unwrap();
    let err = rt.invoke_command(&trap.record.id, Vec::new()).unwrap_err();
    assert!(matches!(err, RuntimeError::Trap(_)), "{err:?}");
    // The runtime still serves.
    let ok = rt
        .deploy(&command("i32.const 0"), DeploySpec::wasi("ok"))
        .unwrap();
    assert_eq!(
        rt.invoke_command(&ok.record.id, Vec::new())
            .unwrap()
            .exit_code,
        0
    );
}

#[test]
fn components_this_host_cannot_run_are_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let handler = wat::parse_str(MISTYPED_HTTP_HANDLER_COMPONENT).unwrap();
    let err = rt
        .deploy(&handler, DeploySpec::export("handler"))
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::InvalidModule(m) if m.contains("wasi:http/incoming-handler")),
        "{err:?}"
    );
    let nothing = wat::parse_str("(component)").unwrap();
    let err = rt
        .deploy(&nothing, DeploySpec::export("nothing"))
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::UnsupportedFeature(m) if m.contains("nothing to invoke")),
        "{err:?}"
    );
    let foreign = wat::parse_str(
        r#"(component
            (import "acme:payments/ledger@1.0.0" (instance $l (export "post" (func))))
            (core module $m (func (export "run") (result i32) i32.const 0))
            (core instance $i (instantiate $m))
            (func $run (result (result)) (canon lift (core func $i "run")))
            (instance $cli (export "run" (func $run)))
            (export "wasi:cli/run@0.2.0" (instance $cli)))"#,
    )
    .unwrap();
    let err = rt
        .deploy(&foreign, DeploySpec::wasi("foreign"))
        .unwrap_err();
    assert!(
        matches!(&err, RuntimeError::InvalidModule(m) if m.contains("does not provide")),
        "{err:?}"
    );
    assert!(rt.functions().is_empty(), "nothing refused was stored");
}

/// `examples/typed-component.wat`: JSON arguments converted by the exports' WIT types
/// (integers, a record, an enum, an option, a string, a result), mismatches refused before
/// anything runs with the place named, and the function's limits.
#[test]
fn typed_exports_take_and_give_json_by_their_wit_types() {
    use serde_json::json;
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let wat = std::fs::read(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/typed-component.wat"),
    )
    .unwrap();
    let f = rt
        .deploy(
            &wat,
            DeploySpec {
                timeout_ms: Some(200),
                ..DeploySpec::wasi("typed")
            },
        )
        .unwrap();
    assert!(f.record.component);
    assert_eq!(f.record.style.as_str(), "export", "its exports decide");
    let id = &f.record.id;
    // The deploy and the function's listing name each typed export with its WIT type.
    let listed: Vec<(&str, &str)> = f
        .typed_exports
        .iter()
        .map(|e| (e.name.as_str(), e.wit.as_str()))
        .collect();
    assert_eq!(
        listed,
        [
            ("add", "func(a: s32, b: s32) -> s32"),
            ("distance", "func(p: record { x: f64, y: f64 }) -> f64"),
            ("level", "func(l: enum { low, high }) -> u32"),
            ("or-zero", "func(v: option<u32>) -> u32"),
            ("length", "func(s: string) -> u32"),
            ("checked-div", "func(a: s32, b: s32) -> result<s32, s32>"),
            ("boom", "func()"),
            ("spin", "func()"),
        ]
    );
    assert!(
        f.exports.is_empty(),
        "core signatures cannot show WIT types"
    );
    assert_eq!(rt.function(id).unwrap().typed_exports, f.typed_exports);
    let call = |export: &str, args: serde_json::Value| {
        rt.invoke_export(id, export, args.as_array().unwrap())
    };
    assert_eq!(call("add", json!([40, 2])).unwrap(), vec![json!(42)]);
    assert_eq!(
        call("distance", json!([{"x": 3, "y": 4}])).unwrap(),
        vec![json!(5.0)]
    );
    assert_eq!(call("level", json!(["high"])).unwrap(), vec![json!(1)]);
    assert_eq!(call("or-zero", json!([null])).unwrap(), vec![json!(0)]);
    assert_eq!(call("or-zero", json!([7])).unwrap(), vec![json!(7)]);
    assert_eq!(call("length", json!(["héllo"])).unwrap(), vec![json!(6)]);
    assert_eq!(
        call("checked-div", json!([7, 2])).unwrap(),
        vec![json!({"ok": 3})]
    );
    assert_eq!(
        call("checked-div", json!([7, 0])).unwrap(),
        vec![json!({"err": 7})]
    );

    let refused = |export: &str, args: serde_json::Value| match call(export, args) {
        Err(RuntimeError::InvalidArguments(m)) => m,
        other => panic!("expected invalid arguments, got {other:?}"),
    };
    assert!(refused("add", json!(["x", 2])).contains("args[0] (a)"));
    assert!(refused("add", json!([2147483648i64, 0])).contains("s32"));
    assert!(refused("add", json!([1])).contains("takes 2 argument(s) (a, b), got 1"));
    assert!(refused("distance", json!([{"x": 3}])).contains("args[0] (p).y: missing"));
    assert!(refused("distance", json!([{"x": 3, "y": 4, "z": 5}])).contains("no field `z`"));
    assert!(refused("level", json!(["mid"])).contains("one of low, high"));
    assert!(matches!(
        call("nope", json!([])),
        Err(RuntimeError::UnknownExport(_))
    ));
    assert!(matches!(
        call("boom", json!([])),
        Err(RuntimeError::Trap(_))
    ));
    assert!(matches!(
        call("spin", json!([])),
        Err(RuntimeError::Timeout { timeout_ms: 200 })
    ));
    // A typed-export component is not a command.
    assert!(matches!(
        rt.invoke_command(id, Vec::new()),
        Err(RuntimeError::WrongStyle(_))
    ));
}
