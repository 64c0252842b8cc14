//! The hand-written builtin kernels (`tensor-wasm-gpu/src/ptx/*.ptx`) in the interpreter
//! against the CPU backend, over random sizes and block shapes and every schedule.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tensor_wasm_gpu::{
    open_backend, BuiltinKernel, DeviceChoice, KernelArg, LaunchConfig, TenantKey,
};
use tensor_wasm_jit::Dtype;
use tensor_wasm_ptx_emu::{Module, Schedule};

use crate::harness::{compare, run_emu, Layout, Rng};

#[derive(Debug, Clone)]
struct Case {
    dims: [u32; 3],
    block: [u32; 2],
    grid_delta: [i32; 2],
    seed: u64,
}

fn strategy(kernel: BuiltinKernel) -> impl Strategy<Value = Case> {
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
            Case {
                dims,
                block,
                grid_delta,
                seed,
            }
        })
}

pub fn run() {
    let backend = open_backend(DeviceChoice::Cpu).expect("CPU backend");
    let tenant = TenantKey::new("ptx-emu");
    for kernel in BuiltinKernel::ALL {
        let module = Module::parse(kernel.ptx()).unwrap_or_else(|e| panic!("{kernel:?}: {e}"));
        let loaded = backend.load_builtin(kernel).expect("builtin");
        let mut runner = TestRunner::new(Config {
            cases: 32,
            failure_persistence: None,
            max_shrink_iters: 64,
            ..Config::default()
        });
        let result = runner.run(&strategy(kernel), |case| {
            let mut rng = Rng(case.seed);
            let [d0, d1, d2] = case.dims;
            let (lens, inputs, scalars): (Vec<usize>, Vec<usize>, Vec<KernelArg>) = match kernel {
                BuiltinKernel::VectorAdd => {
                    let n = d0 as usize;
                    (vec![4 * n; 3], vec![n, n], vec![KernelArg::U32(d0)])
                }
                BuiltinKernel::Scale => {
                    let n = d0 as usize;
                    let alpha = KernelArg::F32(f32::from_bits(rng.f32_bits()));
                    (vec![4 * n; 2], vec![n], vec![alpha, KernelArg::U32(d0)])
                }
                BuiltinKernel::Matmul => {
                    let (m, n, k) = (d0 as usize, d1 as usize, d2 as usize);
                    (
                        vec![4 * m * k, 4 * k * n, 4 * m * n],
                        vec![m * k, k * n],
                        vec![KernelArg::U32(d0), KernelArg::U32(d1), KernelArg::U32(d2)],
                    )
                }
            };
            let mut layout = Layout::new(&lens);
            for (index, &count) in inputs.iter().enumerate() {
                layout.fill(index, count, Dtype::F32, &mut rng);
            }
            let mut args: Vec<KernelArg> = (0..lens.len()).map(|i| layout.arg(i)).collect();
            args.extend(scalars);
            let mut config = match kernel {
                BuiltinKernel::Matmul => LaunchConfig::grid_2d(d1, d0, case.block),
                _ => LaunchConfig::linear(d0, case.block[0]),
            };
            let axes = if kernel == BuiltinKernel::Matmul {
                2
            } else {
                1
            };
            for axis in 0..axes {
                let grid = i64::from(config.grid[axis]) + i64::from(case.grid_delta[axis]);
                config.grid[axis] = grid.max(1) as u32;
            }
            let mut expected = layout.memory.clone();
            tensor_wasm_gpu::launch(
                &*backend,
                &tenant,
                &loaded,
                &config,
                &args,
                &mut expected,
                |completion| completion.wait_mut(),
            )
            .and_then(|done| done)
            .map_err(|e| TestCaseError::fail(format!("CPU backend: {e}")))?;
            for schedule in [
                Schedule::InOrder,
                Schedule::Reversed,
                Schedule::Random(case.seed),
            ] {
                let actual = run_emu(
                    &module,
                    kernel.descriptor(),
                    &config,
                    &args,
                    &layout.memory,
                    &layout.buffers,
                    schedule,
                )
                .map_err(|e| TestCaseError::fail(format!("{schedule:?}: {e}")))?;
                compare(Dtype::F32, &expected, &actual).map_err(|e| {
                    TestCaseError::fail(format!("{kernel:?} {config:?} {schedule:?}: {e}"))
                })?;
            }
            Ok(())
        });
        if let Err(error) = result {
            panic!("builtin {kernel:?}: {error}");
        }
    }
}
