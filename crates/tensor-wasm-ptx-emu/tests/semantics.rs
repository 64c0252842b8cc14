//! The interpreter's semantics and checks one at a time, on small hand-written kernels:
//! rounding and fusion, wrapping, shift clamping, NaN rules, conversions, 3-D indices, and
//! each fault it must report (illegal and misaligned addresses, races, deadlocks, runaway
//! loops, unsupported PTX).

use tensor_wasm_ptx_emu::{launch, Allocation, EmuError, Launch, Module, Schedule};

const HEADER: &str = ".version 8.0\n.target sm_80\n.address_size 64\n";
const IN: u64 = 0x1000;
const OUT: u64 = 0x2000;

/// Runs `body` in one thread: `%r1..%r3` hold the three inputs; the results are `%r10`,
/// `%r11` and the 64-bit `%rd10`.
fn run1(body: &str, inputs: [u32; 3]) -> Result<(u32, u32, u64), EmuError> {
    let ptx = format!(
        "{HEADER}.visible .entry k(.param .u64 p_in, .param .u64 p_out)\n{{\n\
         .reg .pred %p<8>;\n.reg .b32 %r<16>;\n.reg .b64 %rd<16>;\n\
         ld.param.u64 %rd1, [p_in];\nld.param.u64 %rd2, [p_out];\n\
         ld.global.b32 %r1, [%rd1];\nld.global.b32 %r2, [%rd1+4];\nld.global.b32 %r3, [%rd1+8];\n\
         {body}\n\
         st.global.b32 [%rd2], %r10;\nst.global.b32 [%rd2+4], %r11;\nst.global.b64 [%rd2+8], %rd10;\n\
         ret;\n}}\n"
    );
    let module = Module::parse(&ptx)?;
    let kernel = &module.kernels()[0];
    let params = kernel.pack_params(&[&IN.to_le_bytes(), &OUT.to_le_bytes()])?;
    let mut input: Vec<u8> = inputs.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut output = [0u8; 16];
    launch(
        kernel,
        &Launch::new([1, 1, 1], [1, 1, 1], &params),
        &mut [
            Allocation {
                base: IN,
                bytes: &mut input,
            },
            Allocation {
                base: OUT,
                bytes: &mut output,
            },
        ],
    )?;
    let word = |i: usize| u32::from_le_bytes(output[i..i + 4].try_into().unwrap());
    Ok((
        word(0),
        word(4),
        u64::from_le_bytes(output[8..16].try_into().unwrap()),
    ))
}

fn r10(body: &str, inputs: [u32; 3]) -> u32 {
    run1(body, inputs)
        .unwrap_or_else(|e| panic!("{body}: {e}"))
        .0
}

fn f(x: f32) -> u32 {
    x.to_bits()
}

#[test]
fn fma_rounds_once_and_mul_add_twice() {
    let a = 0x3f80_0001; // 1 + 2^-23
    let product = (f32::from_bits(a) * f32::from_bits(a)).to_bits();
    let neg = product ^ 0x8000_0000;
    let fused = r10("fma.rn.f32 %r10, %r1, %r2, %r3;", [a, a, neg]);
    assert_eq!(f32::from_bits(fused), 2f32.powi(-46));
    let unfused = r10(
        "mul.rn.f32 %r4, %r1, %r2;\nadd.rn.f32 %r10, %r4, %r3;",
        [a, a, neg],
    );
    assert_eq!(unfused, 0);
    // mad.rn.f32 is the same fused operation.
    assert_eq!(r10("mad.rn.f32 %r10, %r1, %r2, %r3;", [a, a, neg]), fused);
}

#[test]
fn f32_keeps_subnormals_and_writes_a_canonical_nan() {
    assert_eq!(r10("add.rn.f32 %r10, %r1, %r2;", [1, 1, 0]), 2);
    assert_eq!(
        r10("mul.f32 %r10, %r1, %r2;", [0x0080_0000, f(0.5), 0]),
        0x0040_0000
    );
    assert_eq!(
        r10("add.rn.f32 %r10, %r1, %r2;", [0x7fc0_0001, f(1.0), 0]),
        0x7fff_ffff
    );
    assert_eq!(
        r10("div.rn.f32 %r10, %r1, %r2;", [f(1.0), f(3.0), 0]),
        f(1.0 / 3.0)
    );
    assert_eq!(r10("div.rn.f32 %r10, %r1, %r2;", [0, 0, 0]), 0x7fff_ffff);
}

#[test]
fn sqrt_rounds_correctly_and_keeps_the_sign_of_zero() {
    let sqrt = |x: u32| r10("sqrt.rn.f32 %r10, %r1;", [x, 0, 0]);
    for x in [2.0f32, 3.0, 0.5, 1e-3, 1e30, f32::MAX, f32::MIN_POSITIVE] {
        assert_eq!(sqrt(f(x)), f(x.sqrt()), "sqrt({x})");
    }
    // The correctly rounded root of 2 (1.41421353..., not the 1.41421366 above it).
    assert_eq!(sqrt(f(2.0)), 0x3fb5_04f3);
    assert_eq!(sqrt(1), f(f32::from_bits(1).sqrt()), "subnormal operand");
    assert_eq!(sqrt(0x8000_0000), 0x8000_0000, "sqrt(-0) = -0");
    assert_eq!(sqrt(0), 0);
    assert_eq!(sqrt(f(f32::INFINITY)), f(f32::INFINITY));
    assert_eq!(sqrt(f(-1.0)), 0x7fff_ffff, "canonical NaN");
    assert_eq!(sqrt(f(f32::NEG_INFINITY)), 0x7fff_ffff);
    assert_eq!(sqrt(0x7fc0_0001), 0x7fff_ffff);
}

#[test]
fn f32_sign_operations_and_rounding_to_an_integral_value() {
    let one = |body: &str, x: f32| f32::from_bits(r10(body, [f(x), 0, 0]));
    let rni = "cvt.rni.f32.f32 %r10, %r1;";
    assert_eq!(one(rni, 2.5), 2.0, "ties to even");
    assert_eq!(one(rni, 3.5), 4.0);
    assert_eq!(one(rni, -0.4).to_bits(), f(-0.0));
    assert_eq!(one(rni, 1e30), 1e30);
    assert_eq!(one("cvt.rzi.f32.f32 %r10, %r1;", -2.7), -2.0);
    assert_eq!(r10(rni, [0x7fc0_0001, 0, 0]), 0x7fff_ffff);
    assert_eq!(one("abs.f32 %r10, %r1;", -0.0).to_bits(), 0);
    assert_eq!(one("neg.f32 %r10, %r1;", 0.0).to_bits(), f(-0.0));
    assert_eq!(one("neg.f32 %r10, %r1;", -3.0), 3.0);
}

#[test]
fn f32_min_max_follow_the_nan_and_signed_zero_rules() {
    let nan = 0x7fc0_0001;
    assert_eq!(r10("min.f32 %r10, %r1, %r2;", [nan, f(1.0), 0]), f(1.0));
    assert_eq!(r10("max.f32 %r10, %r1, %r2;", [f(2.0), nan, 0]), f(2.0));
    assert_eq!(r10("min.f32 %r10, %r1, %r2;", [nan, nan, 0]), 0x7fff_ffff);
    assert_eq!(
        r10("min.f32 %r10, %r1, %r2;", [0, 0x8000_0000, 0]),
        0x8000_0000
    );
    assert_eq!(r10("max.f32 %r10, %r1, %r2;", [0x8000_0000, 0, 0]), 0);
    assert_eq!(r10("min.s32 %r10, %r1, %r2;", [u32::MAX, 1, 0]), u32::MAX);
    assert_eq!(r10("min.u32 %r10, %r1, %r2;", [u32::MAX, 1, 0]), 1);
}

#[test]
fn integers_wrap() {
    let max = i32::MAX as u32;
    assert_eq!(r10("add.s32 %r10, %r1, %r2;", [max, 1, 0]), i32::MIN as u32);
    assert_eq!(
        r10("mul.lo.s32 %r10, %r1, %r2;", [max, 2, 0]),
        (-2i32) as u32
    );
    assert_eq!(
        r10("mul.hi.u32 %r10, %r1, %r2;", [u32::MAX, u32::MAX, 0]),
        u32::MAX - 1
    );
    assert_eq!(
        r10("mul.hi.s32 %r10, %r1, %r2;", [u32::MAX, 2, 0]),
        u32::MAX
    );
    assert_eq!(r10("mad.lo.s32 %r10, %r1, %r2, %r3;", [max, max, 5]), 6);
    let (_, _, wide) = run1("mul.wide.s32 %rd10, %r1, %r2;", [u32::MAX, 2, 0]).unwrap();
    assert_eq!(wide as i64, -2);
    let (_, _, wide) = run1("mul.wide.u32 %rd10, %r1, %r2;", [u32::MAX, 2, 0]).unwrap();
    assert_eq!(wide, 2 * u64::from(u32::MAX));
    assert_eq!(
        r10("div.s32 %r10, %r1, %r2;", [i32::MIN as u32, u32::MAX, 0]),
        i32::MIN as u32
    );
    assert_eq!(
        r10("rem.s32 %r10, %r1, %r2;", [(-7i32) as u32, 2, 0]),
        u32::MAX
    );
    assert_eq!(
        r10("neg.s32 %r10, %r1;", [i32::MIN as u32, 0, 0]),
        i32::MIN as u32
    );
    assert_eq!(r10("sub.u32 %r10, %r1, %r2;", [0, 1, 0]), u32::MAX);
}

#[test]
fn shifts_clamp_past_the_width() {
    assert_eq!(r10("shl.b32 %r10, %r1, %r2;", [1, 31, 0]), 1 << 31);
    assert_eq!(r10("shl.b32 %r10, %r1, %r2;", [1, 32, 0]), 0);
    assert_eq!(r10("shl.b32 %r10, %r1, %r2;", [1, 1000, 0]), 0);
    assert_eq!(r10("shr.u32 %r10, %r1, %r2;", [u32::MAX, 40, 0]), 0);
    assert_eq!(
        r10("shr.b32 %r10, %r1, %r2;", [u32::MAX, 4, 0]),
        u32::MAX >> 4
    );
    assert_eq!(
        r10("shr.s32 %r10, %r1, %r2;", [(-8i32) as u32, 1, 0]),
        (-4i32) as u32
    );
    assert_eq!(
        r10("shr.s32 %r10, %r1, %r2;", [(-8i32) as u32, 40, 0]),
        u32::MAX
    );
    assert_eq!(r10("shr.s32 %r10, %r1, %r2;", [8, 40, 0]), 0);
}

#[test]
fn integer_division_by_zero_is_reported() {
    let error = run1("div.u32 %r10, %r1, %r2;", [1, 0, 0]).unwrap_err();
    assert!(matches!(error, EmuError::Undefined { .. }), "{error}");
    assert!(error.to_string().contains("division by zero"), "{error}");
}

#[test]
fn comparisons_and_predicates() {
    let nan = 0x7fc0_0000;
    let body = |cmp: &str| format!("setp.{cmp}.f32 %p1, %r1, %r2;\nselp.b32 %r10, 1, 0, %p1;");
    for (cmp, expected) in [
        ("lt", 0),
        ("ltu", 1),
        ("ne", 0),
        ("neu", 1),
        ("nan", 1),
        ("num", 0),
    ] {
        assert_eq!(r10(&body(cmp), [nan, f(1.0), 0]), expected, "{cmp}");
    }
    assert_eq!(r10(&body("eq"), [0, 0x8000_0000, 0]), 1, "-0 == +0");
    // Signed versus unsigned comparison of the same bits.
    let cmp = |ty: &str| format!("setp.lt.{ty} %p1, %r1, %r2;\nselp.b32 %r10, 1, 0, %p1;");
    assert_eq!(r10(&cmp("s32"), [u32::MAX, 0, 0]), 1);
    assert_eq!(r10(&cmp("u32"), [u32::MAX, 0, 0]), 0);
    // Combined with a negated third predicate, and guards of both polarities.
    let combined = "setp.eq.u32 %p2, %r3, 0;\n\
                    setp.lt.and.u32 %p1, %r1, %r2, !%p2;\n\
                    mov.u32 %r10, 7;\n@%p1 mov.u32 %r10, 8;\n\
                    mov.u32 %r11, 7;\n@!%p1 mov.u32 %r11, 9;";
    assert_eq!(run1(combined, [1, 2, 5]).unwrap().0, 8);
    assert_eq!(run1(combined, [1, 2, 0]).unwrap().1, 9);
}

#[test]
fn conversions_round_and_saturate() {
    assert_eq!(
        r10("cvt.rzi.s32.f32 %r10, %r1;", [f(1e10), 0, 0]),
        i32::MAX as u32
    );
    assert_eq!(
        r10("cvt.rzi.s32.f32 %r10, %r1;", [f(-1e10), 0, 0]),
        i32::MIN as u32
    );
    assert_eq!(r10("cvt.rzi.s32.f32 %r10, %r1;", [0x7fc0_0000, 0, 0]), 0);
    assert_eq!(r10("cvt.rni.s32.f32 %r10, %r1;", [f(2.5), 0, 0]), 2);
    assert_eq!(
        r10("cvt.rmi.s32.f32 %r10, %r1;", [f(-2.5), 0, 0]),
        (-3i32) as u32
    );
    assert_eq!(r10("cvt.rpi.u32.f32 %r10, %r1;", [f(-2.5), 0, 0]), 0);
    assert_eq!(
        r10("cvt.rn.f32.s32 %r10, %r1;", [16_777_217, 0, 0]),
        f(16_777_216.0)
    );
    assert_eq!(
        r10("cvt.rn.f32.u32 %r10, %r1;", [u32::MAX, 0, 0]),
        f(4_294_967_296.0)
    );
    assert_eq!(r10("cvt.sat.s16.s32 %r10, %r1;", [70_000, 0, 0]), 32_767);
    assert_eq!(
        r10("cvt.s16.s32 %r10, %r1;", [0x0001_8000, 0, 0]),
        0xffff_8000
    );
    assert_eq!(
        r10("cvt.u16.u32 %r10, %r1;", [70_000, 0, 0]),
        70_000 - 65_536
    );
    let (_, _, wide) = run1("cvt.s64.s32 %rd10, %r1;", [u32::MAX, 0, 0]).unwrap();
    assert_eq!(wide, u64::MAX);
    let (_, _, wide) = run1("cvt.u64.u32 %rd10, %r1;", [u32::MAX, 0, 0]).unwrap();
    assert_eq!(wide, u64::from(u32::MAX));
    assert_eq!(
        r10("mov.b64 %rd3, -1;\ncvt.u32.u64 %r10, %rd3;", [0; 3]),
        u32::MAX
    );
}

/// A kernel over a 3-D grid and block writing, at each thread's global linear index, that
/// index plus one.
const LINEAR: &str = r#"
.visible .entry linear(.param .u64 p_out)
{
    .reg .b32 %r<24>;
    .reg .b64 %rd<4>;
    mov.u32 %r1, %tid.x;   mov.u32 %r2, %tid.y;   mov.u32 %r3, %tid.z;
    mov.u32 %r4, %ntid.x;  mov.u32 %r5, %ntid.y;  mov.u32 %r6, %ntid.z;
    mov.u32 %r7, %ctaid.x; mov.u32 %r8, %ctaid.y; mov.u32 %r9, %ctaid.z;
    mov.u32 %r10, %nctaid.x; mov.u32 %r11, %nctaid.y;
    mad.lo.u32 %r12, %r9, %r11, %r8;
    mad.lo.u32 %r12, %r12, %r10, %r7;   // block linear
    mul.lo.u32 %r13, %r4, %r5;
    mul.lo.u32 %r13, %r13, %r6;          // threads per block
    mad.lo.u32 %r14, %r3, %r5, %r2;
    mad.lo.u32 %r14, %r14, %r4, %r1;    // thread linear
    mad.lo.u32 %r15, %r12, %r13, %r14;
    add.u32 %r16, %r15, 1;
    ld.param.u64 %rd1, [p_out];
    mul.wide.u32 %rd2, %r15, 4;
    add.u64 %rd1, %rd1, %rd2;
    st.global.u32 [%rd1], %r16;
    ret;
}
"#;

#[test]
fn three_dimensional_grids_and_blocks_index_every_thread_once() {
    let module = Module::parse(&format!("{HEADER}{LINEAR}")).unwrap();
    let kernel = module.kernel("linear").unwrap();
    let params = kernel.pack_params(&[&OUT.to_le_bytes()]).unwrap();
    let (grid, block) = ([2, 3, 2], [2, 2, 3]);
    let total = 12 * 12;
    for schedule in Schedule::ALL {
        let mut out = vec![0u8; 4 * total];
        let config = Launch::new(grid, block, &params).schedule(schedule);
        let stats = launch(
            kernel,
            &config,
            &mut [Allocation {
                base: OUT,
                bytes: &mut out,
            }],
        )
        .unwrap();
        assert_eq!((stats.blocks, stats.threads), (12, total as u64));
        for (i, word) in out.chunks_exact(4).enumerate() {
            assert_eq!(u32::from_le_bytes(word.try_into().unwrap()), i as u32 + 1);
        }
    }
}

#[test]
fn an_access_outside_the_allocations_names_kernel_thread_and_address() {
    let module = Module::parse(&format!("{HEADER}{LINEAR}")).unwrap();
    let kernel = module.kernel("linear").unwrap();
    let params = kernel.pack_params(&[&OUT.to_le_bytes()]).unwrap();
    let mut out = vec![0u8; 4 * 7];
    let error = launch(
        kernel,
        &Launch::new([1, 1, 1], [8, 1, 1], &params),
        &mut [Allocation {
            base: OUT,
            bytes: &mut out,
        }],
    )
    .unwrap_err();
    let EmuError::IllegalAddress {
        at, address, size, ..
    } = &error
    else {
        panic!("{error}");
    };
    assert_eq!((at.thread, *address, *size), ([7, 0, 0], OUT + 28, 4));
    assert!(
        error
            .to_string()
            .starts_with("linear block [0, 0, 0] thread [7, 0, 0]"),
        "{error}"
    );
}

#[test]
fn misaligned_vector_accesses_are_reported() {
    let error = run1(
        "add.u64 %rd3, %rd1, 4;\nld.global.v2.b32 {%r10, %r11}, [%rd3];",
        [0; 3],
    )
    .unwrap_err();
    assert!(
        matches!(
            error,
            EmuError::Misaligned {
                address: 0x1004,
                size: 8,
                ..
            }
        ),
        "{error}"
    );
    let (a, b, _) = run1("ld.global.v2.b32 {%r10, %r11}, [%rd1];", [5, 6, 0]).unwrap();
    assert_eq!((a, b), (5, 6));
}

/// Each thread stores its index to `buf[tid]` (shared), then (after `{sync}`) reads
/// `buf[(tid + 1) % n]` and writes it to `out[tid]`.
fn neighbour_kernel(sync: &str, shared_decl_in_entry: bool) -> String {
    let (module_shared, entry_shared) = if shared_decl_in_entry {
        ("", ".shared .align 4 .b32 buf[64];")
    } else {
        (".shared .align 4 .b32 buf[64];", "")
    };
    format!(
        "{HEADER}{module_shared}\n.visible .entry nb(.param .u64 p_out)\n{{\n\
         {entry_shared}\n.reg .b32 %r<12>;\n.reg .b64 %rd<4>;\n\
         mov.u32 %r1, %tid.x;\nmov.u32 %r2, %ntid.x;\nmov.u32 %r3, buf;\n\
         shl.b32 %r4, %r1, 2;\nadd.u32 %r5, %r3, %r4;\nst.shared.u32 [%r5], %r1;\n\
         {sync}\n\
         add.u32 %r6, %r1, 1;\nrem.u32 %r6, %r6, %r2;\nshl.b32 %r6, %r6, 2;\nadd.u32 %r6, %r6, %r3;\n\
         ld.shared.u32 %r7, [%r6];\n\
         ld.param.u64 %rd1, [p_out];\nmul.wide.u32 %rd2, %r1, 4;\nadd.u64 %rd1, %rd1, %rd2;\n\
         st.global.u32 [%rd1], %r7;\nret;\n}}\n"
    )
}

fn run_neighbours(ptx: &str, schedule: Schedule) -> Result<Vec<u32>, EmuError> {
    let module = Module::parse(ptx)?;
    let kernel = &module.kernels()[0];
    let params = kernel.pack_params(&[&OUT.to_le_bytes()])?;
    let mut out = vec![0u8; 4 * 32];
    launch(
        kernel,
        &Launch::new([2, 1, 1], [32, 1, 1], &params).schedule(schedule),
        &mut [Allocation {
            base: OUT,
            bytes: &mut out,
        }],
    )?;
    Ok(out
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect())
}

#[test]
fn a_missing_barrier_is_a_race_under_every_schedule() {
    let expected: Vec<u32> = (0..32).map(|t| (t + 1) % 32).collect();
    for in_entry in [false, true] {
        let good = neighbour_kernel("bar.sync 0;", in_entry);
        let racy = neighbour_kernel("", in_entry);
        for schedule in Schedule::ALL {
            assert_eq!(run_neighbours(&good, schedule).unwrap(), expected);
            let error = run_neighbours(&racy, schedule).unwrap_err();
            assert!(
                matches!(error, EmuError::SharedRace { .. }),
                "{schedule:?}: {error}"
            );
        }
    }
}

#[test]
fn barrier_deadlocks_are_reported() {
    // Thread 0 leaves before the barrier the others wait at.
    let early_exit = neighbour_kernel(
        "setp.eq.u32 %p1, %r1, 0;\n@%p1 bra END;\nbar.sync 0;\nEND:",
        false,
    )
    .replace(".reg .b32 %r<12>;", ".reg .b32 %r<12>;\n.reg .pred %p<2>;");
    let error = run_neighbours(&early_exit, Schedule::InOrder).unwrap_err();
    // Thread 0 reads a neighbour's slot without a barrier, or the others deadlock.
    assert!(
        matches!(
            error,
            EmuError::SharedRace { .. } | EmuError::Deadlock { .. }
        ),
        "{error}"
    );

    let exits = format!(
        "{HEADER}.visible .entry dl()\n{{\n.reg .pred %p<2>;\n.reg .b32 %r<2>;\n\
         mov.u32 %r1, %tid.x;\nsetp.eq.u32 %p1, %r1, 3;\n@%p1 ret;\nbar.sync 0;\nret;\n}}\n"
    );
    let different = format!(
        "{HEADER}.visible .entry dl()\n{{\n.reg .pred %p<2>;\n.reg .b32 %r<2>;\n\
         mov.u32 %r1, %tid.x;\nsetp.eq.u32 %p1, %r1, 3;\n@%p1 bra OTHER;\nbar.sync 0;\nret;\n\
         OTHER:\nbar.sync 0;\nret;\n}}\n"
    );
    for (ptx, says) in [(exits, "exited"), (different, "different barriers")] {
        let module = Module::parse(&ptx).unwrap();
        let error = launch(
            &module.kernels()[0],
            &Launch::new([1, 1, 1], [8, 1, 1], &[]),
            &mut [],
        )
        .unwrap_err();
        assert!(matches!(error, EmuError::Deadlock { .. }), "{error}");
        assert!(error.to_string().contains(says), "{error}");
    }
}

#[test]
fn a_runaway_loop_hits_the_step_limit() {
    let ptx = format!("{HEADER}.visible .entry spin()\n{{\nLOOP:\nbra.uni LOOP;\n}}\n");
    let module = Module::parse(&ptx).unwrap();
    let mut config = Launch::new([1, 1, 1], [1, 1, 1], &[]);
    config.step_limit = 1000;
    let error = launch(&module.kernels()[0], &config, &mut []).unwrap_err();
    assert!(
        matches!(error, EmuError::StepLimit { limit: 1000, .. }),
        "{error}"
    );
}

#[test]
fn dynamic_shared_memory_is_bounded_by_the_launch() {
    let ptx = format!(
        "{HEADER}.extern .shared .align 16 .b8 dyn[];\n.visible .entry d()\n{{\n\
         .reg .b32 %r<4>;\nmov.u32 %r1, dyn;\nmov.u32 %r2, %tid.x;\nshl.b32 %r2, %r2, 2;\n\
         add.u32 %r1, %r1, %r2;\nst.shared.u32 [%r1], %r2;\nret;\n}}\n"
    );
    let module = Module::parse(&ptx).unwrap();
    let kernel = &module.kernels()[0];
    assert!(kernel.uses_dynamic_shared());
    let mut config = Launch::new([1, 1, 1], [4, 1, 1], &[]);
    config.dynamic_shared_bytes = 16;
    launch(kernel, &config, &mut []).unwrap();
    config.dynamic_shared_bytes = 12;
    let error = launch(kernel, &config, &mut []).unwrap_err();
    assert!(
        matches!(error, EmuError::IllegalAddress { address, .. } if address == tensor_wasm_ptx_emu::SHARED_BASE + 12),
        "{error}"
    );
}

#[test]
fn ptx_outside_the_subset_is_unsupported_with_its_line() {
    for (body, what) in [
        ("atom.global.add.f32 %r10, [%rd1], %r1;", "float atomics"),
        ("atom.global.inc.u64 %rd10, [%rd1], 1;", "this operation"),
        ("add.rz.f32 %r10, %r1, %r2;", ".rn"),
        ("add.ftz.f64 %rd10, %rd1, %rd2;", ".ftz on f64"),
        ("ld.const.b32 %r10, [%rd1];", ".const"),
        ("cvta.to.const.u64 %rd3, %rd1;", "cvta of .const"),
        ("div.approx.f32 %r10, %r1, %r2;", "div"),
        ("sqrt.approx.f32 %r10, %r1;", ".approx"),
        ("rsqrt.approx.f32 %r10, %r1;", "rsqrt"),
        ("ex2.approx.f32 %r10, %r1;", "ex2"),
        ("bar.sync 1;", "barrier other than 0"),
        ("mov.u32 %r10, %smid;", "%smid"),
        (
            "shfl.sync.down.b64 %rd10, %rd1, 1, 31, -1;",
            "only shfl.sync",
        ),
        ("vote.sync.all.pred %p1, %p2, -1;", "vote"),
        ("call.uni (%r10), %rd1, (%r1);", "indirect"),
    ] {
        let error = run1(body, [0; 3]).unwrap_err();
        let EmuError::Unsupported { line, what: said } = &error else {
            panic!("{body}: {error}");
        };
        assert_eq!(*line, 14, "{body}");
        assert!(said.contains(what), "{body}: {error}");
    }
    let error = run1("add.u32 %r10, %r1, %q1;", [0; 3]).unwrap_err();
    assert!(
        matches!(
            error,
            EmuError::Parse { line: 14, .. } | EmuError::Unsupported { line: 14, .. }
        ),
        "{error}"
    );
    // A call of a function declared without a body (an external one) is not run.
    let text =
        format!("{HEADER}.extern .func f();\n.visible .entry k()\n{{\ncall.uni f;\nret;\n}}\n");
    let error = Module::parse(&text).unwrap_err();
    assert!(matches!(error, EmuError::Unsupported { .. }), "{error}");
}

#[test]
fn launches_are_validated_before_anything_runs() {
    let module = Module::parse(&format!("{HEADER}{LINEAR}")).unwrap();
    let kernel = module.kernel("linear").unwrap();
    let params = kernel.pack_params(&[&OUT.to_le_bytes()]).unwrap();
    assert_eq!(kernel.params()[0].size, 8);
    assert!(kernel.pack_params(&[&[0u8; 4]]).is_err());
    for (grid, block) in [([0, 1, 1], [1, 1, 1]), ([1, 1, 1], [1025, 1, 1])] {
        let error = launch(kernel, &Launch::new(grid, block, &params), &mut []).unwrap_err();
        assert!(matches!(error, EmuError::InvalidLaunch { .. }), "{error}");
    }
    let error = launch(kernel, &Launch::new([1; 3], [1; 3], &params[..4]), &mut []).unwrap_err();
    assert!(matches!(error, EmuError::InvalidLaunch { .. }), "{error}");
    let (mut a, mut b) = ([0u8; 8], [0u8; 8]);
    let error = launch(
        kernel,
        &Launch::new([1; 3], [1; 3], &params),
        &mut [
            Allocation {
                base: OUT,
                bytes: &mut a,
            },
            Allocation {
                base: OUT + 4,
                bytes: &mut b,
            },
        ],
    )
    .unwrap_err();
    assert!(error.to_string().contains("overlap"), "{error}");
}

#[test]
fn vector_accesses_work_in_every_space() {
    let ptx = format!(
        "{HEADER}.shared .align 16 .b32 buf[8];\n\
         .visible .entry v(.param .u32 p_scale, .param .align 8 .b8 p_pair[8], .param .u64 p_out)\n{{\n\
         .reg .b32 %r<16>;\n.reg .b64 %rd<4>;\n\
         ld.param.v2.u32 {{%r1, %r2}}, [p_pair];\nld.param.u32 %r3, [p_scale];\n\
         mov.u32 %r4, buf;\nst.shared.v4.b32 [%r4], {{%r1, %r2, %r3, %r3}};\n\
         st.shared.v2.b32 [%r4+16], {{%r2, %r1}};\n\
         ld.shared.v4.b32 {{%r5, %r6, %r7, %r8}}, [%r4];\n\
         ld.param.u64 %rd1, [p_out];\nst.global.v4.b32 [%rd1], {{%r5, %r6, %r7, %r8}};\n\
         ld.shared.v2.b32 {{%r9, %r10}}, [buf+16];\nst.global.v2.b32 [%rd1+16], {{%r9, %r10}};\nret;\n}}\n"
    );
    let module = Module::parse(&ptx).unwrap();
    let kernel = module.kernel("v").unwrap();
    let offsets: Vec<(u32, u32)> = kernel.params().iter().map(|p| (p.offset, p.size)).collect();
    assert_eq!(offsets, [(0, 4), (8, 8), (16, 8)]);
    let pair: Vec<u8> = [11u32, 22].iter().flat_map(|v| v.to_le_bytes()).collect();
    let params = kernel
        .pack_params(&[&5u32.to_le_bytes(), &pair, &OUT.to_le_bytes()])
        .unwrap();
    let mut out = [0u8; 24];
    launch(
        kernel,
        &Launch::new([1; 3], [1; 3], &params),
        &mut [Allocation {
            base: OUT,
            bytes: &mut out,
        }],
    )
    .unwrap();
    let words: Vec<u32> = out
        .chunks_exact(4)
        .map(|w| u32::from_le_bytes(w.try_into().unwrap()))
        .collect();
    assert_eq!(words, [11, 22, 5, 5, 22, 11]);
}

mod robustness {
    //! Damaged PTX never panics the parser or the interpreter: it parses to an error, or it
    //! runs to a result or an error.

    use proptest::prelude::*;
    use tensor_wasm_jit::{Blueprint, PtxTarget};
    use tensor_wasm_ptx_emu::{launch, Allocation, Launch, Module, Schedule};

    const BLUEPRINTS: [&str; 5] = [
        "elementwise[min]:f32",
        "vector_add[4]:i32",
        "reduce[sum]:f32",
        "matmul[4x4x4]:i32",
        "conv2d[3x3,s2,p1]:f32",
    ];

    /// Deletes line `line`, or replaces the `which`th number-like word of it by `by`.
    fn damage(ptx: &str, line: usize, which: usize, by: &str, delete: bool) -> String {
        let lines: Vec<&str> = ptx.lines().collect();
        let line = line % lines.len();
        let mut out: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        if delete {
            out.remove(line);
        } else {
            let words: Vec<&str> = lines[line].split(' ').collect();
            let which = which % words.len();
            let mut words: Vec<String> = words.iter().map(|w| w.to_string()).collect();
            words[which] = by.to_owned();
            out[line] = words.join(" ");
        }
        out.join("\n")
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn arbitrary_text_never_panics(text in "[ -~\n]{0,300}") {
            let _ = Module::parse(&text);
        }

        #[test]
        fn damaged_kernels_never_panic(
            blueprint in 0usize..BLUEPRINTS.len(),
            line in any::<usize>(),
            which in any::<usize>(),
            by in prop_oneof![
                Just("0"), Just("-1"), Just("4294967295"), Just("%rd1"), Just("%r1"),
                Just("[%rd1+8];"), Just("bar.sync"), Just("DONE;"), Just("0f7FC00000"),
                Just("99999999999999999999"), Just("%p1"), Just(".shared"), Just("{"),
            ],
            delete in any::<bool>(),
            grid in 1u32..4,
            schedule in prop_oneof![Just(Schedule::InOrder), Just(Schedule::Reversed), Just(Schedule::Random(7))],
        ) {
            let blueprint = Blueprint::parse(BLUEPRINTS[blueprint]).unwrap();
            let ptx = damage(&blueprint.emit_ptx(&PtxTarget::default()), line, which, by, delete);
            let Ok(module) = Module::parse(&ptx) else {
                return Ok(());
            };
            for kernel in module.kernels() {
                // Parameters: every buffer at 0x1000 (one allocation), every scalar 3.
                let mut params = vec![0u8; kernel.param_bytes() as usize];
                for param in kernel.params() {
                    let at = param.offset as usize;
                    if param.size == 8 {
                        params[at..at + 8].copy_from_slice(&0x1000u64.to_le_bytes());
                    } else if param.size == 4 {
                        params[at..at + 4].copy_from_slice(&3u32.to_le_bytes());
                    }
                }
                let mut memory = vec![0u8; 256];
                let mut config = Launch::new([grid, 1, 1], blueprint.block(), &params).schedule(schedule);
                config.step_limit = 20_000;
                let _ = launch(kernel, &config, &mut [Allocation { base: 0x1000, bytes: &mut memory }]);
            }
        }
    }
}
