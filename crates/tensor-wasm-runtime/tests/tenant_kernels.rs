//! Tenant kernels for functions without the `raw_ptx` capability, on the CPU backend: the
//! guest's own PTX is verified, fenced and run in the interpreter over its memory. It
//! computes what it should, a wild store stays inside the guest's memory, a spinning kernel
//! ends at the invocation's deadline while another tenant's kernel completes, and PTX the
//! verifier refuses is `INVALID_ARGUMENT` with the reason in `last_error`. The same kernel
//! from CUDA C++ (NVRTC) runs too.

use std::time::{Duration, Instant};

use serde_json::json;
use tensor_wasm_runtime::{abi, DeploySpec, Runtime, RuntimeConfig, RuntimeError};
use tensor_wasm_test_support::app::open_runtime;
use tensor_wasm_test_support::guests::tenant_kernels::{self, FILL_ARGS, KERNEL, SPIN_ARGS};

fn deploy(rt: &Runtime, tenant: &str, timeout_ms: u64, raw_ptx: bool) -> String {
    let spec = DeploySpec {
        tenant: tenant.into(),
        timeout_ms: Some(timeout_ms),
        raw_ptx,
        ..DeploySpec::export("run")
    };
    rt.deploy(tenant_kernels::guest().as_bytes(), spec)
        .unwrap()
        .record
        .id
}

fn call(rt: &Runtime, id: &str, export: &str, args: &[serde_json::Value]) -> i64 {
    rt.invoke_export(id, export, args).unwrap()[0]
        .as_i64()
        .unwrap()
}

/// The guest's `last_error` after `run` with these arguments.
fn explain(rt: &Runtime, id: &str, run: [i64; 5]) -> String {
    let mut message = Vec::new();
    loop {
        let mut args: Vec<serde_json::Value> = run.iter().map(|&v| json!(v)).collect();
        args.push(json!(message.len()));
        match call(rt, id, "explain", &args) {
            -1 => return String::from_utf8_lossy(&message).into_owned(),
            byte => message.push(byte as u8),
        }
        if message.len() > 400 {
            return String::from_utf8_lossy(&message).into_owned();
        }
    }
}

fn fill(rt: &Runtime, id: &str) -> i64 {
    call(
        rt,
        id,
        "run",
        &[
            json!(KERNEL.fill),
            json!(4),
            json!(256),
            json!(FILL_ARGS),
            json!(32),
        ],
    )
}

#[test]
fn a_tenant_kernel_without_the_capability_is_fenced_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let rt = open_runtime(
        RuntimeConfig::for_tests(dir.path()),
        &prometheus::Registry::new(),
    );
    let id = deploy(&rt, "tn-a", 5000, false);
    // out[i] = 3i for i < 1000, nothing written past it.
    assert_eq!(
        call(&rt, &id, "fill_check", &[]),
        0,
        "{}",
        explain(&rt, &id, [KERNEL.fill, 4, 256, FILL_ARGS, 32])
    );
    assert_eq!(call(&rt, &id, "fill_check", &[]), 0);

    // The same kernel from CUDA C++: NVRTC's PTX, verified, fenced and interpreted.
    let from_cuda = call(&rt, &id, "fill_check_with", &[json!(KERNEL.cuda_fill)]);
    if tensor_wasm_gpu::nvrtc_available().is_ok() {
        assert_eq!(from_cuda, 0);
    } else {
        assert_eq!(from_cuda, i64::from(abi::code::NOT_AVAILABLE));
    }

    // A store 1 GiB past its buffer lands inside the guest's memory, exactly once.
    assert_eq!(call(&rt, &id, "wild_markers", &[]), 1);

    // The verifier's refusal reaches the guest.
    assert_eq!(
        call(
            &rt,
            &id,
            "run",
            &[
                json!(KERNEL.bad),
                json!(1),
                json!(32),
                json!(FILL_ARGS),
                json!(16)
            ]
        ),
        i64::from(abi::code::INVALID_ARGUMENT)
    );
    let message = explain(&rt, &id, [KERNEL.bad, 1, 32, FILL_ARGS, 16]);
    assert!(
        message.contains("verifier") && message.contains("bar.sync"),
        "{message}"
    );
}

#[test]
fn a_spinning_tenant_kernel_ends_at_the_deadline_while_another_tenant_runs() {
    let dir = tempfile::tempdir().unwrap();
    let config = RuntimeConfig {
        allow_raw_ptx: true,
        ..RuntimeConfig::for_tests(dir.path())
    };
    let rt = open_runtime(config, &prometheus::Registry::new());
    let spinner = deploy(&rt, "tn-spin", 500, false);
    let raw_spinner = deploy(&rt, "tn-raw", 500, true);
    let other = deploy(&rt, "tn-other", 5000, false);
    std::thread::scope(|scope| {
        let spinners: Vec<_> = [&spinner, &raw_spinner]
            .into_iter()
            .map(|id| {
                let rt = &rt;
                scope.spawn(move || {
                    let started = Instant::now();
                    let result = rt.invoke_export(
                        id,
                        "run",
                        &[
                            json!(KERNEL.spin),
                            json!(2),
                            json!(64),
                            json!(SPIN_ARGS),
                            json!(16),
                        ],
                    );
                    (result, started.elapsed())
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(100));
        let started = Instant::now();
        assert_eq!(fill(&rt, &other), 0);
        assert!(
            started.elapsed() < Duration::from_secs(3),
            "another tenant's kernel waited {:?}",
            started.elapsed()
        );
        for spinner in spinners {
            let (result, took) = spinner.join().unwrap();
            assert!(
                matches!(result, Err(RuntimeError::Timeout { timeout_ms: 500 })),
                "{result:?}"
            );
            assert!(
                took < Duration::from_secs(5),
                "ended {took:?} after it started"
            );
        }
    });
    // The tenant's function serves again.
    assert_eq!(fill(&rt, &other), 0);
}
