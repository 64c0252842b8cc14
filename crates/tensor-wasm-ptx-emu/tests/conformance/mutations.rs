//! The mutation check: deliberate corruptions of emitted PTX (a dropped bounds guard, a
//! dropped barrier, an unfused or contracted multiply-add, an off-by-one bound), each of which
//! the harness must catch as a wrong result, an illegal address, a race or a deadlock. This
//! proves the conformance run can fail.

use tensor_wasm_jit::conformance::{build, Case};
use tensor_wasm_jit::{Blueprint, PtxTarget};
use tensor_wasm_ptx_emu::{Module, Schedule};

use crate::harness::check_blueprint;

/// One corruption: replace `from` (which must occur) by `to` in the PTX of `blueprint`, then
/// run the cases with these shape numbers.
struct Mutant {
    name: &'static str,
    blueprint: &'static str,
    from: &'static str,
    to: &'static str,
    /// Replace every occurrence, not only the first.
    everywhere: bool,
    dims: &'static [[u32; 5]],
}

const MUTANTS: &[Mutant] = &[
    Mutant {
        name: "drop the bounds guard of an element-wise kernel",
        blueprint: "elementwise[add]:f32",
        from: "    @%p1 bra DONE;\n",
        to: "",
        everywhere: false,
        dims: &[[300, 0, 0, 0, 0]],
    },
    Mutant {
        name: "element-wise bounds guard off by one",
        blueprint: "elementwise[mul]:i32",
        from: "setp.ge.u64 %p1, %rd1, %rd2;",
        to: "setp.gt.u64 %p1, %rd1, %rd2;",
        everywhere: false,
        dims: &[[300, 0, 0, 0, 0]],
    },
    Mutant {
        name: "vector_add takes the vector path for a partial group",
        blueprint: "vector_add[4]:f32",
        from: "    @%p2 bra TAIL;\n",
        to: "",
        everywhere: false,
        dims: &[[301, 0, 0, 0, 0], [7, 0, 0, 0, 0]],
    },
    Mutant {
        name: "drop the per-element guards of vector_add's tail",
        blueprint: "vector_add[8]:i32",
        from: "    @%p3 bra DONE;\n",
        to: "",
        everywhere: true,
        dims: &[[301, 0, 0, 0, 0], [5, 0, 0, 0, 0]],
    },
    Mutant {
        name: "drop the barrier between a reduction's partials and its tree",
        blueprint: "reduce[sum]:f32",
        from: "    st.shared.b32 [%r7], %v0;\n    bar.sync 0;\n",
        to: "    st.shared.b32 [%r7], %v0;\n",
        everywhere: false,
        dims: &[[1, 300, 0, 0, 0]],
    },
    Mutant {
        name: "drop one barrier of a reduction's tree",
        blueprint: "reduce[max]:i32",
        from: "TREE_32:\n    bar.sync 0;\n",
        to: "TREE_32:\n",
        everywhere: false,
        dims: &[[1, 300, 0, 0, 0]],
    },
    Mutant {
        name: "drop the guard of a reduction tree step",
        blueprint: "reduce[sum]:i32",
        from: "    @%p3 bra TREE_128;\n",
        to: "",
        everywhere: false,
        dims: &[[2, 100, 0, 0, 0]],
    },
    Mutant {
        name: "drop matmul's barrier after staging the tiles",
        blueprint: "matmul[16x16x16]:f32",
        from: "LOAD_B_END:\n    bar.sync 0;\n",
        to: "LOAD_B_END:\n",
        everywhere: false,
        dims: &[[20, 20, 20, 0, 0]],
    },
    Mutant {
        name: "drop matmul's barrier after the products",
        blueprint: "matmul[16x16x16]:i32",
        from: "INNER_END:\n    bar.sync 0;\n",
        to: "INNER_END:\n",
        everywhere: false,
        dims: &[[20, 20, 20, 0, 0]],
    },
    Mutant {
        name: "matmul staging bound off by one (tile_a overruns into tile_b)",
        blueprint: "matmul[8x32x4]:f32",
        from: "setp.ge.u32 %p2, %r6, 32;",
        to: "setp.ge.u32 %p2, %r6, 33;",
        everywhere: false,
        dims: &[[9, 33, 9, 0, 0]],
    },
    Mutant {
        name: "matmul inner depth off by one",
        blueprint: "matmul[8x32x4]:i32",
        from: "min.u64 %rd16, %rd16, 4;",
        to: "min.u64 %rd16, %rd16, 5;",
        everywhere: false,
        dims: &[[9, 33, 9, 0, 0]],
    },
    Mutant {
        name: "matmul row guard of the A tile dropped",
        blueprint: "matmul[16x16x16]:f32",
        from: "    @!%p3 bra STORE_A;\n",
        to: "",
        everywhere: false,
        dims: &[[5, 5, 5, 0, 0]],
    },
    Mutant {
        name: "conv2d input row bound off by one",
        blueprint: "conv2d[3x3,s1,p1]:f32",
        from: "setp.ge.u64 %p4, %rd21, %rd6; // guard: ih < h",
        to: "setp.gt.u64 %p4, %rd21, %rd6;",
        everywhere: false,
        dims: &[[1, 1, 5, 5, 1], [0, 2, 4, 6, 2]],
    },
    Mutant {
        name: "drop the element guard of a permute",
        blueprint: "permute[021]:f32",
        from: "    @%p1 bra DONE;\n",
        to: "",
        everywhere: false,
        dims: &[[5, 6, 100, 0, 2]],
    },
    Mutant {
        name: "drop gather's index range guard (out-of-range indices read past the table)",
        blueprint: "gather[rows]:f32",
        from: "    @%p3 bra STORE;\n",
        to: "",
        everywhere: false,
        dims: &[[10, 20, 30, 0, 0]],
    },
    Mutant {
        name: "gather takes negative indices as out of range",
        blueprint: "gather[rows]:i32",
        from: "    selp.b64 %rd12, %rd13, %rd12, %p2; // negative: from the end\n",
        to: "",
        everywhere: false,
        dims: &[[10, 20, 30, 0, 0]],
    },
    Mutant {
        name: "unfuse an fma into mul + add",
        blueprint: "elementwise[fma]:f32",
        from: "fma.rn.f32 %v0, %v1, %v2, %v3;",
        to: "mul.rn.f32 %v7, %v1, %v2;\n    add.rn.f32 %v0, %v7, %v3;",
        everywhere: false,
        dims: &[[300, 0, 0, 0, 0]],
    },
    Mutant {
        name: "contract matmul's mul + add into an fma",
        blueprint: "matmul[4x4x8]:f32",
        from: "mul.rn.f32 %v4, %v2, %v3;\n    add.rn.f32 %v0, %v0, %v4;",
        to: "fma.rn.f32 %v0, %v2, %v3, %v0;",
        everywhere: false,
        dims: &[[6, 6, 9, 0, 0]],
    },
    Mutant {
        name: "bmm walks a transposed A along its rows",
        blueprint: "bmm[tn]:f32",
        from: "shl.b64 %rd9, %rd21, 2;",
        to: "mov.u64 %rd9, 4;",
        everywhere: false,
        dims: &[[2, 5, 7, 4, 0]],
    },
    Mutant {
        name: "maxpool skips a NaN tap",
        blueprint: "maxpool[3x3,s2,p1]:f32",
        from: "    setp.nan.or.f32 %p7, %v1, %v1, %p7; // a NaN tap is taken\n",
        to: "",
        everywhere: false,
        dims: &[[2, 3, 9, 9, 0]],
    },
    Mutant {
        name: "avgpool counts the padding taps",
        blueprint: "avgpool[3x3,s1,p1]:f32",
        from: "max.u32 %r8, %r8, 1; // no tap: +0 / 1",
        to: "mov.u32 %r8, 9;",
        everywhere: false,
        dims: &[[1, 2, 5, 6, 0]],
    },
    Mutant {
        name: "dwconv2d reads channel 0's filter for every channel",
        blueprint: "dwconv2d[3x3,s1,p1]:f32",
        from: "add.u64 %rd15, %rd15, %rd16; // &weight[channel][0][0]",
        to: "mov.u64 %rd15, %rd15;",
        everywhere: false,
        dims: &[[1, 3, 5, 6, 0]],
    },
    Mutant {
        name: "softmax forgets to subtract the maximum",
        blueprint: "softmax[axis]:f32",
        from: "    sub.rn.f32 %v1, %v1, %v3;\n",
        to: "",
        everywhere: false,
        dims: &[[2, 40, 1, 0, 0], [1, 7, 2, 0, 0]],
    },
    Mutant {
        name: "layernorm's variance without the mean subtracted",
        blueprint: "layernorm[rows]:f32",
        from: "    sub.rn.f32 %v1, %v1, %v3;\n",
        to: "",
        everywhere: false,
        // Short rows: long ones of edge values are mostly infinite or NaN either way.
        dims: &[
            [3, 2, 0, 0, 0],
            [3, 3, 0, 0, 0],
            [2, 4, 0, 0, 0],
            [3, 5, 0, 0, 0],
        ],
    },
    Mutant {
        name: "chain takes the running value as the right operand",
        blueprint: "chain[sub.max.div.erf]:f32",
        from: "sub.rn.f32 %v0, %v0, %v1;",
        to: "sub.rn.f32 %v0, %v1, %v0;",
        everywhere: false,
        dims: &[[300, 0, 0, 0, 0]],
    },
];

/// Runs every mutant; returns `(caught, total)` and panics naming any mutant not caught.
pub fn run() -> (usize, usize) {
    let mut missed = Vec::new();
    for mutant in MUTANTS {
        let blueprint = Blueprint::parse(mutant.blueprint).expect("descriptor");
        let original = blueprint.emit_ptx(&PtxTarget::default());
        assert!(
            original.contains(mutant.from),
            "mutant {:?}: {:?} does not occur in the PTX of {blueprint}",
            mutant.name,
            mutant.from
        );
        let mutated = if mutant.everywhere {
            original.replace(mutant.from, mutant.to)
        } else {
            original.replacen(mutant.from, mutant.to, 1)
        };
        let module = Module::parse(&mutated)
            .unwrap_or_else(|e| panic!("mutant {:?} does not parse: {e}", mutant.name));
        let mut caught = None;
        'cases: for (i, dims) in mutant.dims.iter().enumerate() {
            for seed in 0..4u64 {
                let case = Case {
                    dims: *dims,
                    grid_delta: [0; 3],
                    slack: 0,
                    in_place: false,
                    seed: seed * 7919 + i as u64,
                };
                let (config, args, layout) = build(&blueprint, &case);
                let schedules = [
                    Schedule::InOrder,
                    Schedule::Reversed,
                    Schedule::Random(case.seed),
                ];
                if let Err(how) =
                    check_blueprint(&blueprint, &module, &config, &args, &layout, &schedules)
                {
                    caught = Some(how);
                    break 'cases;
                }
            }
        }
        match caught {
            Some(how) => println!(
                "mutant caught: {} ({}): {how}",
                mutant.name, mutant.blueprint
            ),
            None => missed.push(mutant.name),
        }
    }
    assert!(missed.is_empty(), "mutants not caught: {missed:?}");
    (MUTANTS.len(), MUTANTS.len())
}
