//! Runtime behaviour through its public API: both invocation styles, limits,
//! restart from the store, and isolation between invocations.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use tensor_wasm_runtime::{
    DeploySpec, FsFunctionStore, ModuleSource, Runtime, RuntimeConfig, RuntimeError, RuntimeMetrics,
};

fn example(name: &str) -> Vec<u8> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples")
        .join(name);
    std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn open(dir: &Path) -> Runtime {
    open_with(RuntimeConfig::for_tests(dir))
}

fn open_with(config: RuntimeConfig) -> Runtime {
    let store = Arc::new(FsFunctionStore::open(&config.data_dir).unwrap());
    let metrics = RuntimeMetrics::register(&prometheus::Registry::new()).unwrap();
    Runtime::open(config, store, metrics).unwrap()
}

#[test]
fn export_call_checks_signature_and_returns_typed_results() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let f = rt
        .deploy(&example("calc.wat"), DeploySpec::export("calc"))
        .unwrap();
    let id = &f.record.id;
    assert_eq!(
        rt.invoke_export(id, "add", &[json!(40), json!(2)]).unwrap(),
        vec![json!(42)]
    );
    assert_eq!(
        rt.invoke_export(id, "mul64", &[json!("4294967296"), json!(3)])
            .unwrap(),
        vec![json!(12884901888i64)]
    );
    assert_eq!(
        rt.invoke_export(id, "hypot", &[json!(3.0), json!(4)])
            .unwrap(),
        vec![json!(5.0)]
    );
    assert!(matches!(
        rt.invoke_export(id, "add", &[json!(1)]),
        Err(RuntimeError::InvalidArguments(_))
    ));
    assert!(matches!(
        rt.invoke_export(id, "add", &[json!(1), json!("x")]),
        Err(RuntimeError::InvalidArguments(_))
    ));
    assert!(matches!(
        rt.invoke_export(id, "nope", &[]),
        Err(RuntimeError::UnknownExport(_))
    ));
    let sig = f.exports.iter().find(|e| e.name == "add").unwrap();
    assert_eq!(sig.params.len(), 2);
}

#[test]
fn traps_report_their_message() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let f = rt
        .deploy(&example("calc.wat"), DeploySpec::export("calc"))
        .unwrap();
    match rt.invoke_export(&f.record.id, "div", &[json!(1), json!(0)]) {
        Err(RuntimeError::Trap(message)) => {
            assert!(message.contains("integer divide by zero"), "{message}")
        }
        other => panic!("expected a trap, got {other:?}"),
    }
}

#[test]
fn infinite_loop_times_out_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let spec = DeploySpec {
        timeout_ms: Some(200),
        ..DeploySpec::export("loop")
    };
    let f = rt.deploy(&example("loop.wat"), spec).unwrap();
    let start = Instant::now();
    let result = rt.invoke_export(&f.record.id, "spin", &[]);
    let took = start.elapsed();
    assert!(
        matches!(result, Err(RuntimeError::Timeout { timeout_ms: 200 })),
        "{result:?}"
    );
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(took <= Duration::from_millis(300), "{took:?}");
}

#[test]
fn memory_hog_hits_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let spec = DeploySpec {
        memory_limit_bytes: Some(4 << 20),
        ..DeploySpec::export("hog")
    };
    let f = rt.deploy(&example("hog.wat"), spec).unwrap();
    match rt.invoke_export(&f.record.id, "grow", &[]) {
        Err(RuntimeError::MemoryLimit(message)) => {
            assert!(message.contains("4194304"), "{message}")
        }
        other => panic!("expected the memory limit, got {other:?}"),
    }
}

#[test]
fn initial_memory_above_the_limit_is_refused_at_deploy() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let wat = r#"(module (memory (export "m") 100) (func (export "f")))"#;
    let spec = DeploySpec {
        memory_limit_bytes: Some(1 << 20),
        ..DeploySpec::export("big")
    };
    assert!(matches!(
        rt.deploy(wat.as_bytes(), spec),
        Err(RuntimeError::InvalidConfig(_))
    ));
}

#[test]
fn malformed_modules_and_bad_configs_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    for bad in [
        &b"\0asm\x01\0\0\0\xff\xff"[..],
        b"not wasm at all",
        b"(module (func $f (result i32)))",
    ] {
        assert!(matches!(
            rt.deploy(bad, DeploySpec::export("x")),
            Err(RuntimeError::InvalidModule(_))
        ));
    }
    let imports = r#"(module (import "env" "f" (func)) (func (export "g")))"#;
    assert!(matches!(
        rt.deploy(imports.as_bytes(), DeploySpec::export("x")),
        Err(RuntimeError::InvalidModule(_))
    ));
    assert!(matches!(
        rt.deploy(&example("calc.wat"), DeploySpec::wasi("no-start")),
        Err(RuntimeError::InvalidModule(_))
    ));
    let fuel = DeploySpec {
        fuel: Some(10),
        ..DeploySpec::export("x")
    };
    assert!(matches!(
        rt.deploy(&example("calc.wat"), fuel),
        Err(RuntimeError::InvalidConfig(_))
    ));
    assert!(rt.functions().is_empty());
}

#[test]
fn wasi_command_maps_stdin_to_stdout() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let f = rt
        .deploy(&example("upper.wat"), DeploySpec::wasi("upper"))
        .unwrap();
    let out = rt
        .invoke_command(&f.record.id, b"hello, wasm".to_vec())
        .unwrap();
    assert_eq!(out.exit_code, 0);
    assert_eq!(out.stdout, b"HELLO, WASM");
    assert_eq!(out.stderr_tail, b"upper: done\n");
    assert!(matches!(
        rt.invoke_export(&f.record.id, "_start", &[]),
        Err(RuntimeError::WrongStyle(_))
    ));
}

#[test]
fn fuel_budget_stops_a_loop() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open_with(RuntimeConfig {
        fuel_enabled: true,
        ..RuntimeConfig::for_tests(dir.path())
    });
    let spec = DeploySpec {
        fuel: Some(100_000),
        ..DeploySpec::export("loop")
    };
    let f = rt.deploy(&example("loop.wat"), spec).unwrap();
    assert!(matches!(
        rt.invoke_export(&f.record.id, "spin", &[]),
        Err(RuntimeError::FuelExhausted(100_000))
    ));
}

#[test]
fn restart_uses_precompiled_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let id = {
        let rt = open(dir.path());
        let f = rt
            .deploy(&example("calc.wat"), DeploySpec::export("calc"))
            .unwrap();
        assert_eq!(rt.metrics().module_loads(ModuleSource::Compiled), 1);
        f.record.id
    };
    let rt = open(dir.path());
    assert_eq!(rt.functions().len(), 1);
    assert_eq!(rt.warm_up(), 0);
    assert_eq!(rt.metrics().module_loads(ModuleSource::Compiled), 0);
    assert_eq!(rt.metrics().module_loads(ModuleSource::Artifact), 1);
    assert_eq!(
        rt.invoke_export(&id, "add", &[json!(2), json!(2)]).unwrap(),
        vec![json!(4)]
    );
}

#[test]
fn invocations_do_not_share_state() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let f = rt
        .deploy(&example("calc.wat"), DeploySpec::export("calc"))
        .unwrap();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let rt = rt.clone();
            let id = f.record.id.clone();
            std::thread::spawn(move || {
                for _ in 0..25 {
                    assert_eq!(
                        rt.invoke_export(&id, "bump", &[]).unwrap(),
                        vec![json!(1), json!(1)]
                    );
                }
            })
        })
        .collect();
    for h in handles {
        h.join().unwrap();
    }
}

#[test]
fn delete_removes_the_function_durably() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let f = rt
        .deploy(&example("calc.wat"), DeploySpec::export("calc"))
        .unwrap();
    assert!(rt.delete(&f.record.id).unwrap());
    assert!(!rt.delete(&f.record.id).unwrap());
    drop(rt);
    assert!(open(dir.path()).functions().is_empty());
}
