//! Every blueprint kind × dtype (and a spread of tile shapes and convolution filters) over
//! random small shapes, edge sizes and grids larger or smaller than the shape: the emitted
//! PTX in the interpreter, under every schedule, must leave guest memory bit-identical to
//! `run_cpu` and the CPU backend's parts path (NaN payloads aside), canaries included.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use tensor_wasm_jit::{Blueprint, BlueprintKind, ElementwiseOp, ParamKind, ReduceOp, Shape};
use tensor_wasm_ptx_emu::Schedule;

use crate::harness::{check_blueprint, Layout, Modules, Rng};

/// The blueprints the run covers.
pub fn all() -> Vec<Blueprint> {
    let mut descriptors: Vec<String> = Vec::new();
    for dtype in ["f32", "i32"] {
        for op in ElementwiseOp::ALL {
            if !(op == ElementwiseOp::Div && dtype == "i32") {
                descriptors.push(format!("elementwise[{}]:{dtype}", op.as_str()));
            }
        }
        for lanes in [1, 2, 4, 8, 16] {
            descriptors.push(format!("vector_add[{lanes}]:{dtype}"));
        }
        for op in [ReduceOp::Sum, ReduceOp::Max] {
            descriptors.push(format!("reduce[{}]:{dtype}", op.as_str()));
        }
        for tile in ["16x16x16", "8x32x4", "1x1x1", "3x5x7", "4x4x8", "2x64x3"] {
            descriptors.push(format!("matmul[{tile}]:{dtype}"));
        }
        for filter in ["1x1", "3x3,p1", "3x3,s2,p1", "5x3,p2", "2x2,s2"] {
            descriptors.push(format!("conv2d[{filter}]:{dtype}"));
        }
    }
    descriptors
        .iter()
        .map(|d| Blueprint::parse(d).unwrap_or_else(|e| panic!("{d}: {e}")))
        .collect()
}

/// One random case: five shape numbers, a grid change per axis, spare elements after each
/// buffer, and the seed of the input values.
#[derive(Debug, Clone)]
pub struct Case {
    pub dims: [u32; 5],
    pub grid_delta: [i32; 3],
    pub slack: usize,
    /// Element-wise and vector_add: write the output over the first input.
    pub in_place: bool,
    pub seed: u64,
}

pub fn case_strategy() -> impl Strategy<Value = Case> {
    let dim = prop_oneof![0u32..4, 250u32..260, 0u32..700];
    (
        [dim.clone(), dim.clone(), dim.clone(), dim.clone(), dim],
        [-1i32..=2, -1i32..=2, -1i32..=2],
        0usize..3,
        any::<bool>(),
        any::<u64>(),
    )
        .prop_map(|(dims, grid_delta, slack, in_place, seed)| Case {
            dims,
            grid_delta,
            slack,
            in_place,
            seed,
        })
}

/// The launch of `blueprint` for `case`: configuration, arguments and initial memory.
pub fn build(blueprint: &Blueprint, case: &Case) -> (LaunchConfig, Vec<KernelArg>, Layout) {
    let d = case.dims;
    let shape = match blueprint.kind() {
        BlueprintKind::Elementwise(_) | BlueprintKind::VectorAdd { .. } => {
            Shape::Elements { n: d[0] }
        }
        BlueprintKind::Reduce(_) => Shape::Rows {
            rows: d[0] % 4,
            cols: d[1],
        },
        BlueprintKind::Matmul(_) => Shape::Matmul {
            m: d[0] % 21,
            n: d[1] % 21,
            k: d[2] % 21,
        },
        BlueprintKind::Conv2d(_) => Shape::Conv2d {
            n: 1 + d[0] % 2,
            c: 1 + d[1] % 3,
            h: d[2] % 10,
            w: d[3] % 10,
            k: 1 + d[4] % 3,
        },
    };
    let elements: Vec<usize> = match shape {
        Shape::Elements { n } => {
            let buffers = blueprint
                .params()
                .iter()
                .filter(|p| matches!(p.kind, ParamKind::Input | ParamKind::Output))
                .count();
            vec![n as usize; buffers]
        }
        Shape::Rows { rows, cols } => vec![(rows * cols) as usize, rows as usize],
        Shape::Matmul { m, n, k } => vec![(m * k) as usize, (k * n) as usize, (m * n) as usize],
        Shape::Conv2d { n, c, h, w, k } => {
            let BlueprintKind::Conv2d(params) = blueprint.kind() else {
                unreachable!()
            };
            let (p, q) = tensor_wasm_jit::conv2d_output_size(params, h, w);
            vec![
                (n * c * h * w) as usize,
                (k * c * params.r * params.s) as usize,
                (u64::from(n * k) * p * q) as usize,
            ]
        }
    };
    let lens: Vec<usize> = elements.iter().map(|e| 4 * (e + case.slack)).collect();
    let mut layout = Layout::new(&lens);
    let mut rng = Rng(case.seed);
    let inputs = elements.len() - 1;
    for (index, &count) in elements.iter().enumerate().take(inputs) {
        layout.fill(index, count, blueprint.dtype(), &mut rng);
    }
    let scalars: Vec<u32> = match shape {
        Shape::Elements { n } => vec![n],
        Shape::Rows { rows, cols } => vec![rows, cols],
        Shape::Matmul { m, n, k } => vec![m, n, k],
        Shape::Conv2d { n, c, h, w, k } => vec![n, c, h, w, k],
    };
    let (mut buffer, mut scalar) = (0, 0);
    let mut args: Vec<KernelArg> = blueprint
        .params()
        .iter()
        .map(|param| match param.kind {
            ParamKind::Input | ParamKind::Output => {
                buffer += 1;
                layout.arg(buffer - 1)
            }
            ParamKind::U32 => {
                scalar += 1;
                KernelArg::U32(scalars[scalar - 1])
            }
            ParamKind::F32 => KernelArg::F32(f32::from_bits(rng.f32_bits())),
            ParamKind::I32 => KernelArg::I32(rng.i32_bits() as i32),
        })
        .collect();
    let elementwise = matches!(
        blueprint.kind(),
        BlueprintKind::Elementwise(_) | BlueprintKind::VectorAdd { .. }
    );
    if case.in_place && elementwise {
        let output = blueprint
            .params()
            .iter()
            .position(|p| p.kind == ParamKind::Output)
            .expect("an output");
        args[output] = layout.arg(0);
    }
    let mut config = blueprint.launch_config(&shape).expect("launch config");
    let used = match blueprint.kind() {
        BlueprintKind::Matmul(_) => 2,
        BlueprintKind::Conv2d(_) => 3,
        _ => 1,
    };
    for axis in 0..used {
        let grid = i64::from(config.grid[axis]) + i64::from(case.grid_delta[axis]);
        config.grid[axis] = grid.max(1) as u32;
    }
    (config, args, layout)
}

/// Cases per blueprint: more for the cheap kinds.
fn cases(blueprint: &Blueprint) -> u32 {
    match blueprint.kind() {
        BlueprintKind::Elementwise(_) | BlueprintKind::VectorAdd { .. } => 32,
        BlueprintKind::Reduce(_) => 24,
        BlueprintKind::Matmul(_) | BlueprintKind::Conv2d(_) => 16,
    }
}

/// Checks `blueprints` with proptest; panics with the smallest failing case.
pub fn run(blueprints: &[Blueprint], modules: &Modules) {
    for blueprint in blueprints {
        let module = modules.get(blueprint);
        let mut runner = TestRunner::new(Config {
            cases: cases(blueprint),
            failure_persistence: None,
            max_shrink_iters: 64,
            ..Config::default()
        });
        let result = runner.run(&case_strategy(), |case| {
            let (config, args, layout) = build(blueprint, &case);
            let schedules = [
                Schedule::InOrder,
                Schedule::Reversed,
                Schedule::Random(case.seed),
                Schedule::Random(case.seed ^ 0xffff),
            ];
            check_blueprint(blueprint, &module, &config, &args, &layout, &schedules)
                .map_err(|e| TestCaseError::fail(format!("{blueprint} {config:?}: {e}")))
        });
        if let Err(error) = result {
            panic!("{blueprint}: {error}");
        }
    }
}

/// The dtype-independent kinds, for splitting the run over threads.
pub fn is_heavy(blueprint: &Blueprint) -> bool {
    matches!(
        blueprint.kind(),
        BlueprintKind::Matmul(_) | BlueprintKind::Conv2d(_)
    )
}

/// A random matmul tile or convolution filter (beyond the fixed list), one case each.
pub fn random_kinds() -> impl Strategy<Value = (Blueprint, Case)> {
    let dtype = prop_oneof![Just("f32"), Just("i32")];
    let matmul = (1u32..=64, 1u32..=64, 1u32..=64, dtype.clone())
        .prop_filter("at most 1024 threads", |(m, n, _, _)| m * n <= 1024)
        .prop_map(|(m, n, k, dtype)| format!("matmul[{m}x{n}x{k}]:{dtype}"));
    let conv = (1u32..=11, 1u32..=11, 1u32..=8, 0u32..11, dtype)
        .prop_filter("padding below the filter", |(r, s, _, p, _)| p < r.min(s))
        .prop_map(|(r, s, t, p, dtype)| format!("conv2d[{r}x{s},s{t},p{p}]:{dtype}"));
    (prop_oneof![matmul, conv], case_strategy()).prop_map(|(descriptor, case)| {
        (
            Blueprint::parse(&descriptor).expect("valid descriptor"),
            case,
        )
    })
}

/// Checks random tiles and filters (their PTX parsed fresh for each case).
pub fn run_random_kinds(cases: u32) {
    let mut runner = TestRunner::new(Config {
        cases,
        failure_persistence: None,
        max_shrink_iters: 64,
        ..Config::default()
    });
    let result = runner.run(&random_kinds(), |(blueprint, case)| {
        let ptx = blueprint.emit_ptx(&tensor_wasm_jit::PtxTarget::default());
        let module = tensor_wasm_ptx_emu::Module::parse(&ptx)
            .map_err(|e| TestCaseError::fail(format!("{blueprint}: {e}")))?;
        let (config, args, layout) = build(&blueprint, &case);
        let schedules = [
            Schedule::InOrder,
            Schedule::Reversed,
            Schedule::Random(case.seed),
        ];
        check_blueprint(&blueprint, &module, &config, &args, &layout, &schedules)
            .map_err(|e| TestCaseError::fail(format!("{blueprint} {config:?}: {e}")))
    });
    if let Err(error) = result {
        panic!("random tiles and filters: {error}");
    }
}
