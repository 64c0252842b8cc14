//! The hand-written builtin kernels (`tensor-wasm-gpu/src/ptx/*.ptx`) in the interpreter
//! against the CPU backend, over their fixed cases (`tensor_wasm_jit::conformance`, which the
//! GPU suite runs on hardware) and random sizes and block shapes, under every schedule.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tensor_wasm_gpu::{open_backend, Backend, BuiltinKernel, DeviceChoice, Kernel, TenantKey};
use tensor_wasm_jit::conformance::{
    build_builtin, builtin_fixed_cases, BuiltinCase, BUILTIN_FIXED_CASES,
};
use tensor_wasm_jit::Dtype;
use tensor_wasm_ptx_emu::{Module, Schedule};

use crate::harness::{compare, run_emu};

/// Random cases of the same kind as the fixed ones (`BuiltinCase::draw`), shrinkable.
fn strategy(kernel: BuiltinKernel) -> impl Strategy<Value = BuiltinCase> {
    let (dim, block_y) = match kernel {
        BuiltinKernel::Matmul => (0u32..14, 1u32..17),
        _ => (0u32..600, 1u32..2),
    };
    (
        [dim.clone(), dim.clone(), dim],
        [1u32..300, block_y],
        [-1i32..=2, -1i32..=2],
        any::<u64>(),
    )
        .prop_map(move |(dims, block, grid_delta, seed)| {
            let block = match kernel {
                // Keep matmul blocks within 1024 threads and small enough to be quick.
                BuiltinKernel::Matmul => [1 + block[0] % 16, block[1]],
                _ => block,
            };
            BuiltinCase {
                dims,
                block,
                grid_delta,
                seed,
            }
        })
}

/// The CPU backend's memory after `kernel`'s launch, against the interpreter's under each
/// schedule.
fn check(
    backend: &dyn Backend,
    loaded: &Kernel,
    module: &Module,
    kernel: BuiltinKernel,
    case: &BuiltinCase,
) -> Result<(), String> {
    let tenant = TenantKey::new("ptx-emu");
    let (config, args, layout) = build_builtin(kernel, case);
    let mut expected = layout.memory.clone();
    tensor_wasm_gpu::launch(
        backend,
        &tenant,
        loaded,
        &config,
        &args,
        &mut expected,
        |completion| completion.wait_mut(),
    )
    .and_then(|done| done)
    .map_err(|e| format!("CPU backend: {e}"))?;
    for schedule in [
        Schedule::InOrder,
        Schedule::Reversed,
        Schedule::Random(case.seed),
    ] {
        let actual = run_emu(
            module,
            kernel.descriptor(),
            &config,
            &args,
            &layout.memory,
            &layout.buffers,
            schedule,
        )
        .map_err(|e| format!("{schedule:?}: {e}"))?;
        compare(Dtype::F32, &expected, &actual)
            .map_err(|e| format!("{kernel:?} {config:?} {schedule:?}: {e}"))?;
    }
    Ok(())
}

/// Every builtin on its fixed cases, then on random ones.
pub fn run() {
    let backend = open_backend(DeviceChoice::Cpu).expect("CPU backend");
    for kernel in BuiltinKernel::ALL {
        let module = Module::parse(kernel.ptx()).unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
        let loaded = backend.load_builtin(kernel).expect("builtin");
        for (index, case) in builtin_fixed_cases(kernel, BUILTIN_FIXED_CASES)
            .iter()
            .enumerate()
        {
            if let Err(error) = check(&*backend, &loaded, &module, kernel, case) {
                panic!("builtin {kernel:?}, fixed case {index} {case:?}: {error}");
            }
        }
        let mut runner = TestRunner::new(Config {
            cases: 32,
            failure_persistence: None,
            max_shrink_iters: 64,
            ..Config::default()
        });
        let result = runner.run(&strategy(kernel), |case| {
            check(&*backend, &loaded, &module, kernel, &case).map_err(TestCaseError::fail)
        });
        if let Err(error) = result {
            panic!("builtin {kernel:?}: {error}");
        }
    }
}
