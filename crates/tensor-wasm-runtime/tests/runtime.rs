//! Runtime behaviour through its public API: both invocation styles, limits,
//! restart from the store, and isolation between invocations.

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::json;
use tensor_wasm_runtime::{
    DeploySpec, GuestMemory, ModuleSource, Runtime, RuntimeConfig, RuntimeError,
};
use tensor_wasm_test_support::app::open_runtime;
use tensor_wasm_test_support::guests::example;

fn open(dir: &Path) -> Runtime {
    open_with(RuntimeConfig::for_tests(dir))
}

fn open_with(config: RuntimeConfig) -> Runtime {
    open_runtime(config, &prometheus::Registry::new())
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
    // Not before the deadline, and ended by it (the loop never ends by
    // itself). How closely the epoch ticker meets the deadline is a timing
    // figure for a bench; a tight bound here would flake on a loaded machine.
    assert!(took >= Duration::from_millis(190), "{took:?}");
    assert!(took < Duration::from_secs(3), "{took:?}");
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

/// Once, with unified guest memory every memory was allocated at the
/// function's limit while the quota counted one (8 memories of 128 MiB: 1 GiB of RSS).
#[test]
fn modules_with_more_than_one_memory_are_refused_in_both_guest_memory_modes() {
    let eight = format!(
        "(module {} (func (export \"f\") (result i32) i32.const 1))",
        "(memory 1)".repeat(8)
    );
    let imported_and_defined = r#"(module
        (import "env" "m" (memory 1))
        (memory 1)
        (func (export "f") (result i32) i32.const 1))"#;
    for guest_memory in [GuestMemory::Pooled, GuestMemory::Unified] {
        let dir = tempfile::tempdir().unwrap();
        let rt = open_with(RuntimeConfig {
            guest_memory,
            ..RuntimeConfig::for_tests(dir.path())
        });
        for (wat, count) in [(eight.as_str(), "8"), (imported_and_defined, "2")] {
            match rt.deploy(wat.as_bytes(), DeploySpec::export("multi")) {
                Err(RuntimeError::UnsupportedFeature(message)) => assert!(
                    message.contains(&format!("{count} linear memories"))
                        && message.contains("at most one"),
                    "{guest_memory:?}: {message}"
                ),
                other => panic!("{guest_memory:?}: expected unsupported_feature, got {other:?}"),
            }
        }
        assert!(rt.functions().is_empty(), "{guest_memory:?}");
        let one = rt
            .deploy(
                b"(module (memory 1) (func (export \"f\") (result i32) i32.const 1))",
                DeploySpec::export("one"),
            )
            .unwrap();
        assert_eq!(
            rt.invoke_export(&one.record.id, "f", &[]).unwrap(),
            vec![json!(1)],
            "{guest_memory:?}"
        );
    }
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

mod kernels {
    //! Guests launching kernels through `wasi:cuda` on the CPU backend.

    use super::*;
    use tensor_wasm_runtime::abi;

    fn run_vector_add(rt: &Runtime) {
        let f = rt
            .deploy(&example("vector_add.wat"), DeploySpec::export("vadd"))
            .unwrap();
        let id = &f.record.id;
        for n in [1, 255, 256, 1000, 65536] {
            assert_eq!(
                rt.invoke_export(id, "run", &[json!(n)]).unwrap(),
                vec![json!(n)],
                "n = {n}"
            );
        }
        assert_eq!(
            rt.invoke_export(id, "out_of_bounds", &[]).unwrap(),
            vec![json!(abi::code::INVALID_ARGUMENT)]
        );
    }

    #[test]
    fn vector_add_example_matches_the_reference_in_pooled_memory() {
        let dir = tempfile::tempdir().unwrap();
        let rt = open(dir.path());
        assert!(!rt.device().is_cuda());
        assert!(!rt.is_uvm_backed());
        run_vector_add(&rt);
    }

    #[test]
    fn vector_add_example_matches_the_reference_in_unified_host_memory() {
        let dir = tempfile::tempdir().unwrap();
        let rt = open_with(RuntimeConfig {
            guest_memory: GuestMemory::Unified,
            ..RuntimeConfig::for_tests(dir.path())
        });
        assert!(!rt.is_uvm_backed(), "host backing on a CPU-only machine");
        run_vector_add(&rt);
    }

    const PTX_GUEST: &str = r#"(module
      (import "wasi:cuda" "kernel_from_ptx" (func $ptx (param i32 i32 i32 i32) (result i32)))
      (import "wasi:cuda" "kernel_from_cuda" (func $cuda (param i32 i32 i32 i32) (result i32)))
      (import "wasi:cuda" "kernel_from_blueprint" (func $bp (param i32 i32) (result i32)))
      (import "wasi:cuda" "launch" (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
      (import "wasi:cuda" "last_error" (func $err (param i32 i32) (result i32)))
      (memory (export "memory") 1)
      (data (i32.const 0) ".version 8.0\00k\00nope")
      (func (export "ptx") (result i32) (call $ptx (i32.const 0) (i32.const 12) (i32.const 13) (i32.const 1)))
      (func (export "cuda") (result i32) (call $cuda (i32.const 0) (i32.const 12) (i32.const 13) (i32.const 1)))
      (func (export "unknown_blueprint") (result i32) (call $bp (i32.const 15) (i32.const 4)))
      (func (export "bad_handle") (result i32)
        (call $launch (i32.const 7) (i32.const 1) (i32.const 1) (i32.const 1) (i32.const 1) (i32.const 1) (i32.const 1) (i32.const 0) (i32.const 0) (i32.const 0)))
      (func (export "error_len") (result i32)
        (drop (call $bp (i32.const 15) (i32.const 4)))
        (call $err (i32.const 1024) (i32.const 8))))"#;

    #[test]
    fn capabilities_and_errors_are_reported_to_the_guest() {
        let dir = tempfile::tempdir().unwrap();
        let rt = open(dir.path());
        let raw = DeploySpec {
            raw_ptx: true,
            ..DeploySpec::export("ptx")
        };
        assert!(matches!(
            rt.deploy(PTX_GUEST.as_bytes(), raw),
            Err(RuntimeError::InvalidConfig(_))
        ));
        let f = rt
            .deploy(PTX_GUEST.as_bytes(), DeploySpec::export("ptx"))
            .unwrap();
        let call = |export: &str| {
            rt.invoke_export(&f.record.id, export, &[]).unwrap()[0]
                .as_i64()
                .unwrap()
        };
        // Without the capability tenant kernels are verified and fenced: this text has no
        // entry `k`, and the CUDA C++ does not compile (or NVRTC is missing).
        assert_eq!(call("ptx"), i64::from(abi::code::INVALID_ARGUMENT));
        let no_cuda = if tensor_wasm_gpu::nvrtc_available().is_ok() {
            abi::code::INVALID_ARGUMENT
        } else {
            abi::code::NOT_AVAILABLE
        };
        assert_eq!(call("cuda"), i64::from(no_cuda));
        assert_eq!(
            call("unknown_blueprint"),
            i64::from(abi::code::INVALID_ARGUMENT)
        );
        assert_eq!(call("bad_handle"), i64::from(abi::code::BAD_HANDLE));
        assert!(
            call("error_len") > 8,
            "last_error returns the full message length"
        );

        let dir = tempfile::tempdir().unwrap();
        let rt = open_with(RuntimeConfig {
            allow_raw_ptx: true,
            ..RuntimeConfig::for_tests(dir.path())
        });
        let raw = DeploySpec {
            raw_ptx: true,
            ..DeploySpec::export("ptx")
        };
        let f = rt.deploy(PTX_GUEST.as_bytes(), raw).unwrap();
        assert!(f.record.limits.raw_ptx);
        // Raw kernels run in the CPU backend's interpreter: the same two are refused as such.
        let got = rt.invoke_export(&f.record.id, "ptx", &[]).unwrap();
        assert_eq!(
            got,
            vec![json!(abi::code::INVALID_ARGUMENT)],
            "no entry `k`"
        );
        let got = rt.invoke_export(&f.record.id, "cuda", &[]).unwrap();
        assert_eq!(got, vec![json!(no_cuda)], "not CUDA C++");
    }

    /// A JIT blueprint launched with buffers too small for its shape is refused
    /// before launch; a well-formed launch computes the right values.
    const BLUEPRINT_GUEST: &str = r#"(module
      (import "wasi:cuda" "kernel_from_blueprint" (func $bp (param i32 i32) (result i32)))
      (import "wasi:cuda" "launch" (func $launch (param i32 i32 i32 i32 i32 i32 i32 i32 i32 i32) (result i32)))
      (memory (export "memory") 1)
      (data (i32.const 0) "elementwise[relu]:f32")
      (data (i32.const 32) "matmul[16x16x16]")
      (data (i32.const 64) "nonsense[1]")
      (func $record (param $at i32) (param $tag i32) (param $aux i32) (param $value i64)
        (i32.store (local.get $at) (local.get $tag))
        (i32.store offset=4 (local.get $at) (local.get $aux))
        (i64.store offset=8 (local.get $at) (local.get $value)))
      (func (export "relu") (result f32)
        (local $k i32) (local $rc i32)
        (f32.store (i32.const 1024) (f32.const -1))
        (f32.store (i32.const 1028) (f32.const 2))
        (f32.store (i32.const 1032) (f32.const -3))
        (f32.store (i32.const 1036) (f32.const 4))
        (local.set $k (call $bp (i32.const 0) (i32.const 21)))
        (call $record (i32.const 256) (i32.const 7) (i32.const 16) (i64.const 1024))
        (call $record (i32.const 272) (i32.const 7) (i32.const 16) (i64.const 2048))
        (call $record (i32.const 288) (i32.const 2) (i32.const 0) (i64.const 4))
        (local.set $rc (call $launch (local.get $k) (i32.const 1) (i32.const 1) (i32.const 1)
          (i32.const 256) (i32.const 1) (i32.const 1) (i32.const 0) (i32.const 256) (i32.const 48)))
        (if (i32.lt_s (local.get $rc) (i32.const 0)) (then (return (f32.convert_i32_s (local.get $rc)))))
        (f32.add (f32.add (f32.load (i32.const 2048)) (f32.load (i32.const 2052)))
                 (f32.add (f32.load (i32.const 2056)) (f32.load (i32.const 2060)))))
      (func (export "too_small") (result i32)
        (local $k i32)
        (local.set $k (call $bp (i32.const 32) (i32.const 16)))
        (call $record (i32.const 256) (i32.const 7) (i32.const 16) (i64.const 1024))
        (call $record (i32.const 272) (i32.const 7) (i32.const 16) (i64.const 2048))
        (call $record (i32.const 288) (i32.const 7) (i32.const 16) (i64.const 3072))
        (call $record (i32.const 304) (i32.const 2) (i32.const 0) (i64.const 32))
        (call $record (i32.const 320) (i32.const 2) (i32.const 0) (i64.const 32))
        (call $record (i32.const 336) (i32.const 2) (i32.const 0) (i64.const 32))
        (call $launch (local.get $k) (i32.const 2) (i32.const 2) (i32.const 1)
          (i32.const 16) (i32.const 16) (i32.const 1) (i32.const 0) (i32.const 256) (i32.const 96)))
      (func (export "unknown") (result i32) (call $bp (i32.const 64) (i32.const 11))))"#;

    #[test]
    fn jit_blueprints_run_and_are_bounds_checked() {
        let dir = tempfile::tempdir().unwrap();
        let rt = open(dir.path());
        let f = rt
            .deploy(BLUEPRINT_GUEST.as_bytes(), DeploySpec::export("bp"))
            .unwrap();
        let id = &f.record.id;
        assert_eq!(rt.invoke_export(id, "relu", &[]).unwrap(), vec![json!(6.0)]);
        assert_eq!(
            rt.invoke_export(id, "too_small", &[]).unwrap(),
            vec![json!(abi::code::INVALID_ARGUMENT)]
        );
        assert_eq!(
            rt.invoke_export(id, "unknown", &[]).unwrap(),
            vec![json!(abi::code::INVALID_ARGUMENT)]
        );
        // The second invocation reuses the blueprint loaded by the first.
        assert_eq!(rt.invoke_export(id, "relu", &[]).unwrap(), vec![json!(6.0)]);
    }

    #[test]
    fn saturated_dispatcher_ends_the_invocation_as_busy() {
        let dir = tempfile::tempdir().unwrap();
        let rt = open_with(RuntimeConfig {
            dispatch: tensor_wasm_dispatch::DispatchConfig {
                max_in_flight: 1,
                max_queued: 0,
            },
            ..RuntimeConfig::for_tests(dir.path())
        });
        let f = rt
            .deploy(&example("vector_add.wat"), DeploySpec::export("vadd"))
            .unwrap();
        let held = rt.dispatcher().acquire_blocking().unwrap();
        assert!(matches!(
            rt.invoke_export(&f.record.id, "run", &[json!(10)]),
            Err(RuntimeError::Busy(_))
        ));
        drop(held);
        assert_eq!(
            rt.invoke_export(&f.record.id, "run", &[json!(10)]).unwrap(),
            vec![json!(10)]
        );
    }
}

fn counter(registry: &prometheus::Registry, name: &str, result: &str) -> u64 {
    registry
        .gather()
        .iter()
        .filter(|family| family.name() == name)
        .flat_map(|family| family.get_metric())
        .filter(|m| m.get_label().iter().any(|l| l.value() == result))
        .map(|m| m.get_counter().get_value() as u64)
        .sum()
}

#[test]
fn inline_calls_answer_short_import_free_calls_and_hand_overruns_back() {
    let dir = tempfile::tempdir().unwrap();
    let config = RuntimeConfig::for_tests(dir.path());
    let registry = prometheus::Registry::new();
    let rt = open_runtime(config, &registry);
    let calc = rt
        .deploy(&example("calc.wat"), DeploySpec::export("calc"))
        .unwrap();
    let calc = &calc.record.id;
    // Loaded by a first call; from then on the same outcomes inline.
    rt.invoke_export(calc, "add", &[json!(1), json!(1)])
        .unwrap();
    let add = rt.try_invoke_export_inline(calc, "add", &[json!(40), json!(2)]);
    assert_eq!(add.unwrap().unwrap(), vec![json!(42)]);
    assert!(matches!(
        rt.try_invoke_export_inline(calc, "div", &[json!(1), json!(0)]),
        Some(Err(RuntimeError::Trap(_)))
    ));
    assert!(matches!(
        rt.try_invoke_export_inline(calc, "add", &[json!(1)]),
        Some(Err(RuntimeError::InvalidArguments(_)))
    ));
    assert_eq!(
        counter(&registry, "tensor_wasm_inline_calls_total", "done"),
        3
    );

    // An endless loop is cut short at its budget (5-10 ms) and leaves no
    // outcome; after two overruns in a row its calls skip the attempt (one in
    // 256 tries again).
    let spin = rt
        .deploy(&example("loop.wat"), DeploySpec::export("loop"))
        .unwrap();
    let spin = &spin.record.id;
    assert!(matches!(
        rt.invoke_export(spin, "spin", &[]),
        Err(RuntimeError::Timeout { .. })
    ));
    let start = Instant::now();
    assert!(rt.try_invoke_export_inline(spin, "spin", &[]).is_none());
    assert!(rt.try_invoke_export_inline(spin, "spin", &[]).is_none());
    assert!(
        start.elapsed() < Duration::from_secs(1),
        "{:?}",
        start.elapsed()
    );
    let overran = || counter(&registry, "tensor_wasm_inline_calls_total", "overran");
    assert_eq!(overran(), 2);
    for _ in 0..255 {
        assert!(rt.try_invoke_export_inline(spin, "spin", &[]).is_none());
    }
    assert_eq!(overran(), 2, "skipped, not tried");
    assert!(rt.try_invoke_export_inline(spin, "spin", &[]).is_none());
    assert_eq!(overran(), 3, "the 256th call tries again");

    // A deadline shorter than the inline budget is the function's own: the
    // timeout is its outcome inline too, not a reason to run it again.
    let mut short = DeploySpec::export("short");
    short.timeout_ms = Some(5);
    let short = rt.deploy(&example("loop.wat"), short).unwrap();
    let short = &short.record.id;
    assert!(matches!(
        rt.invoke_export(short, "spin", &[]),
        Err(RuntimeError::Timeout { timeout_ms: 5 })
    ));
    assert!(matches!(
        rt.try_invoke_export_inline(short, "spin", &[]),
        Some(Err(RuntimeError::Timeout { timeout_ms: 5 }))
    ));
    assert_eq!(overran(), 3, "a real timeout is not an overrun");

    // Functions with imports (here the GPU ABI) and WASI commands never run inline.
    let gpu = rt
        .deploy(&example("vector_add.wat"), DeploySpec::export("vadd"))
        .unwrap();
    let gpu = &gpu.record.id;
    assert_eq!(
        rt.invoke_export(gpu, "run", &[json!(1000)]).unwrap(),
        vec![json!(1000)]
    );
    assert!(rt
        .try_invoke_export_inline(gpu, "run", &[json!(1000)])
        .is_none());
    let upper = rt
        .deploy(&example("upper.wat"), DeploySpec::wasi("upper"))
        .unwrap();
    assert!(rt
        .try_invoke_export_inline(&upper.record.id, "_start", &[])
        .is_none());
    assert_eq!(
        counter(&registry, "tensor_wasm_inline_calls_total", "done"),
        4
    );
}

#[test]
fn inline_calls_can_be_turned_off() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open_with(RuntimeConfig {
        inline_calls: false,
        ..RuntimeConfig::for_tests(dir.path())
    });
    let calc = rt
        .deploy(&example("calc.wat"), DeploySpec::export("calc"))
        .unwrap();
    rt.invoke_export(&calc.record.id, "add", &[json!(1), json!(1)])
        .unwrap();
    assert!(rt
        .try_invoke_export_inline(&calc.record.id, "add", &[json!(1), json!(1)])
        .is_none());
}

/// Regression test: an inline call runs on an async
/// thread, where one `memory.fill` over a large memory is a single
/// uninterruptible operation. Only modules small in their worst case run
/// inline: a call growing memory past the inline cap (8 MiB by default) is cut
/// short and left to the blocking pool, and modules starting above the cap
/// are never tried.
#[test]
fn inline_calls_may_not_grow_past_the_inline_cap() {
    /// Grows memory by `pages`, fills all of it, returns its size in pages.
    const GROWER: &str = r#"(module
      (memory (export "memory") 1)
      (func (export "grow") (param $pages i32) (result i32)
        (if (i32.lt_s (memory.grow (local.get $pages)) (i32.const 0))
          (then (return (i32.const -1))))
        (memory.fill (i32.const 0) (i32.const 7)
          (i32.mul (memory.size) (i32.const 65536)))
        (memory.size)))"#;
    /// Starts with 12.5 MiB of memory.
    const BIG_MEMORY: &str = r#"(module
      (memory (export "memory") 200)
      (func (export "fill") (result i32)
        (memory.fill (i32.const 0) (i32.const 1) (i32.const 13107200))
        (i32.const 1)))"#;

    let dir = tempfile::tempdir().unwrap();
    let registry = prometheus::Registry::new();
    // Functions may have 16 MiB here; inline calls 8 MiB.
    let rt = open_runtime(RuntimeConfig::for_tests(dir.path()), &registry);
    assert_eq!(rt.config().inline_max_memory_bytes, 8 << 20);
    let overran = || counter(&registry, "tensor_wasm_inline_calls_total", "overran");
    let grow = rt
        .deploy(GROWER.as_bytes(), DeploySpec::export("grow"))
        .unwrap();
    let grow = &grow.record.id;
    assert_eq!(
        rt.invoke_export(grow, "grow", &[json!(191)]).unwrap(),
        vec![json!(192)]
    );
    // Within the cap: inline as before.
    let small = rt.try_invoke_export_inline(grow, "grow", &[json!(10)]);
    assert_eq!(small.unwrap().unwrap(), vec![json!(11)]);
    // Past it (12 MiB): cut short, no outcome; the blocking path answers.
    assert!(rt
        .try_invoke_export_inline(grow, "grow", &[json!(191)])
        .is_none());
    assert_eq!(overran(), 1);
    assert_eq!(
        rt.invoke_export(grow, "grow", &[json!(191)]).unwrap(),
        vec![json!(192)]
    );

    // A module starting above the cap is never tried inline.
    let big = rt
        .deploy(BIG_MEMORY.as_bytes(), DeploySpec::export("big"))
        .unwrap();
    let big = &big.record.id;
    assert_eq!(rt.invoke_export(big, "fill", &[]).unwrap(), vec![json!(1)]);
    assert!(rt.try_invoke_export_inline(big, "fill", &[]).is_none());
    assert_eq!(overran(), 1, "not tried, so not an overrun");
}

/// Once a tenant is retired, no deploy of it stores
/// anything (module or record), while other tenants deploy as before.
#[test]
fn a_retired_tenant_gets_no_new_functions() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open(dir.path());
    let spec = |tenant: &str| DeploySpec {
        tenant: tenant.to_owned(),
        ..DeploySpec::export("calc")
    };
    rt.deploy(&example("calc.wat"), spec("tn-00000000000000aa"))
        .unwrap();
    rt.retire_tenant("tn-00000000000000aa");
    let modules = |dir: &Path| std::fs::read_dir(dir.join("modules")).unwrap().count();
    let before = modules(dir.path());
    let refused = rt.deploy(&example("warm.wat"), spec("tn-00000000000000aa"));
    assert!(
        matches!(refused, Err(RuntimeError::TenantRetired(_))),
        "{refused:?}"
    );
    assert_eq!(rt.functions_of("tn-00000000000000aa").len(), 1);
    assert_eq!(rt.functions_named("tn-00000000000000aa", "calc").len(), 1);
    assert!(rt.functions_named("tn-00000000000000bb", "calc").is_empty());
    assert!(rt
        .functions_named("tn-00000000000000aa", "other")
        .is_empty());
    assert_eq!(modules(dir.path()), before, "no module stored for it");
    rt.deploy(&example("warm.wat"), spec("tn-00000000000000bb"))
        .unwrap();
    // A delete that failed after retiring gives the tenant back.
    rt.reinstate_tenant("tn-00000000000000aa");
    rt.deploy(&example("warm.wat"), spec("tn-00000000000000aa"))
        .unwrap();
}
