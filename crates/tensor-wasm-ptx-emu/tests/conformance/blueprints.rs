//! Every blueprint of the conformance set (`tensor_wasm_jit::conformance`: every kind × dtype,
//! a spread of tile shapes and convolution filters) over its fixed cases (those the GPU suite's
//! `bit-identity` section runs on hardware) and random small shapes, edge sizes and grids larger
//! or smaller than the shape: the emitted PTX in the interpreter, under every schedule, must
//! leave guest memory bit-identical to `run_cpu` and the CPU backend's parts path (NaN payloads
//! aside), canaries included.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use tensor_wasm_jit::conformance::{build, fixed_cases, random_case_count, Case, FIXED_CASES};
use tensor_wasm_jit::{Blueprint, BlueprintKind};
use tensor_wasm_ptx_emu::Schedule;

use crate::harness::{check_blueprint, Modules};

/// Random cases of the same kind as the fixed ones (`Case::draw`), shrinkable.
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

/// Checks `blueprints` on their fixed cases, then with proptest; panics with the (smallest)
/// failing case.
pub fn run(blueprints: &[Blueprint], modules: &Modules) {
    for blueprint in blueprints {
        let module = modules.get(blueprint);
        for (index, case) in fixed_cases(blueprint, FIXED_CASES).iter().enumerate() {
            let (config, args, layout) = build(blueprint, case);
            let schedules = [Schedule::InOrder, Schedule::Random(case.seed)];
            if let Err(error) =
                check_blueprint(blueprint, &module, &config, &args, &layout, &schedules)
            {
                panic!("{blueprint}, fixed case {index} {case:?} {config:?}: {error}");
            }
        }
        let mut runner = TestRunner::new(Config {
            cases: random_case_count(blueprint),
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

/// A random matmul tile or convolution filter (beyond the fixed list; `conv2d` or
/// `dwconv2d`), one case each.
pub fn random_kinds() -> impl Strategy<Value = (Blueprint, Case)> {
    let dtype = prop_oneof![Just("f32"), Just("i32")];
    let matmul = (1u32..=64, 1u32..=64, 1u32..=64, dtype.clone())
        .prop_filter("at most 1024 threads", |(m, n, _, _)| m * n <= 1024)
        .prop_map(|(m, n, k, dtype)| format!("matmul[{m}x{n}x{k}]:{dtype}"));
    let conv = (
        prop_oneof![Just("conv2d"), Just("dwconv2d")],
        1u32..=11,
        1u32..=11,
        1u32..=8,
        0u32..11,
        dtype,
    )
        .prop_filter("padding below the filter", |(_, r, s, _, p, _)| {
            p < r.min(s)
        })
        .prop_map(|(kind, r, s, t, p, dtype)| format!("{kind}[{r}x{s},s{t},p{p}]:{dtype}"));
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
