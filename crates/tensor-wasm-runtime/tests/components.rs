//! WebAssembly components (WASI 0.2) through the runtime's public API: a command component
//! (`wasi:cli/run`) deploys and runs like a WASI preview 1 command, stdin in and stdout out,
//! with the function's deadline, memory limit and exit code; it is served again after a
//! restart; styles not built yet and components this host cannot link are refused clearly.
//!
//! The components are written in the component text format here, so that each test shows the
//! whole guest; guests from real toolchains come with the rest of issue 20.

use std::path::Path;

use tensor_wasm_runtime::{DeploySpec, Runtime, RuntimeConfig, RuntimeError};
use tensor_wasm_test_support::app::open_runtime;

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
    let typed = wat::parse_str(
        r#"(component
            (core module $m (func (export "add") (param i32 i32) (result i32)
                local.get 0 local.get 1 i32.add))
            (core instance $i (instantiate $m))
            (func $add (param "a" s32) (param "b" s32) (result s32)
                (canon lift (core func $i "add")))
            (export "add" (func $add)))"#,
    )
    .unwrap();
    let err = rt.deploy(&typed, DeploySpec::export("typed")).unwrap_err();
    assert!(
        matches!(&err, RuntimeError::UnsupportedFeature(m) if m.contains("typed exports (add)")),
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
