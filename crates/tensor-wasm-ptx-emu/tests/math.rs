//! The PTX of `tensor_wasm_jit::math` computes the same bits as its Rust: each function's
//! check kernel (`MathFunction::check_kernel`, one element per thread, guarded by `n`) runs in
//! the interpreter over a few thousand inputs (NaNs, ±inf, ±0, subnormals, huge and tiny
//! values, every threshold's neighbours) and is compared bit for bit with the Rust function
//! (any NaN matches any NaN, but a NaN must meet a NaN).

use tensor_wasm_jit::math::{MathFunction, Temps};
use tensor_wasm_jit::PtxTarget;
use tensor_wasm_ptx_emu::{launch, Allocation, EmuError, Launch, Module, Schedule};

const X_BASE: u64 = 0x1_0000;
const Y_BASE: u64 = 0x8_0000;
const BLOCK: u32 = 128;

/// Every 2^21st bit pattern (all exponents, both signs, NaNs, infinities, subnormals), the
/// edge values, a dense range, and the neighbours of each threshold the sequences select by.
fn inputs() -> Vec<f32> {
    let mut x: Vec<f32> = (0..=u32::MAX)
        .step_by(1 << 21)
        .map(|b| f32::from_bits(b | 0x15))
        .collect();
    x.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(1),
        f32::from_bits(0x007f_ffff),
        f32::MIN_POSITIVE,
        f32::MAX,
        f32::MIN,
        f32::EPSILON,
        1e-30,
        1e30,
    ]);
    x.extend((0..1001).map(|i| -12.0 + 0.024 * i as f32));
    for threshold in [
        0.625f32, 0.875, 3.92, 4.0, 9.0, 88.72284, 103.27893, 103.97208,
    ] {
        let bits = threshold.to_bits();
        x.extend((bits - 40..=bits + 40).map(f32::from_bits));
    }
    let negated: Vec<f32> = x.iter().map(|v| -v).collect();
    x.extend(negated);
    x
}

/// `y[i] = f(x[i])` for every input, in the interpreter: one thread per element and a last
/// block with threads past `n` (the guard must stop them: `y` is exactly `n` elements).
fn run(function: MathFunction, x: &[f32]) -> Result<Vec<f32>, EmuError> {
    let ptx = function.check_kernel(&PtxTarget::default());
    let module = Module::parse(&ptx)?;
    let kernel = module
        .kernel(&function.entry_name())
        .expect("the check kernel's entry");
    let n = u32::try_from(x.len()).unwrap();
    let params = kernel.pack_params(&[
        &X_BASE.to_le_bytes(),
        &Y_BASE.to_le_bytes(),
        &n.to_le_bytes(),
    ])?;
    let mut x_bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
    let mut y_bytes = vec![0u8; x_bytes.len()];
    let grid = n.div_ceil(BLOCK) + 1;
    launch(
        kernel,
        &Launch::new([grid, 1, 1], [BLOCK, 1, 1], &params).schedule(Schedule::Reversed),
        &mut [
            Allocation {
                base: X_BASE,
                bytes: &mut x_bytes,
            },
            Allocation {
                base: Y_BASE,
                bytes: &mut y_bytes,
            },
        ],
    )?;
    Ok(y_bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect())
}

fn same(a: f32, b: f32) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
}

#[test]
fn every_function_computes_the_rust_bits_in_the_interpreter() {
    let x = inputs();
    assert!(x.len() > 4000, "{} inputs", x.len());
    for function in MathFunction::ALL {
        let y = run(function, &x).unwrap_or_else(|e| panic!("{}: {e}", function.name()));
        let mut rust = vec![0.0f32; x.len()];
        function.eval_slice(&mut rust, &x);
        for (i, &v) in x.iter().enumerate() {
            assert!(
                same(y[i], rust[i]) && same(y[i], function.eval(v)),
                "{}({v:e} = {:#010x}): PTX {:e} ({:#010x}), Rust {:e} ({:#010x})",
                function.name(),
                v.to_bits(),
                y[i],
                y[i].to_bits(),
                rust[i],
                rust[i].to_bits()
            );
        }
    }
}

/// `ptx` with the `fma.rn.f32 d, a, b, c;` line that contains `marker` computed as
/// `mul.rn.f32 d, a, b;` then `add.rn.f32 d, d, c;` (two roundings).
fn split_fma(ptx: &str, marker: &str) -> String {
    let line = ptx
        .lines()
        .find(|l| l.contains(marker) && l.trim_start().starts_with("fma.rn.f32"))
        .expect("the fma line");
    let operands = line
        .trim()
        .trim_start_matches("fma.rn.f32")
        .trim_end_matches(';');
    let [d, a, b, c] = operands.split(',').map(str::trim).collect::<Vec<_>>()[..] else {
        panic!("{line}");
    };
    ptx.replacen(
        line,
        &format!("    mul.rn.f32 {d}, {a}, {b};\n    add.rn.f32 {d}, {d}, {c};"),
        1,
    )
}

/// The check above can fail: a sequence with one coefficient changed by one ulp, or one
/// `fma` split into a multiply and an add, no longer matches.
#[test]
fn a_changed_sequence_is_caught() {
    let x = inputs();
    let ptx = MathFunction::Exp.check_kernel(&PtxTarget::default());
    let rust: Vec<f32> = x.iter().map(|&v| MathFunction::Exp.eval(v)).collect();
    let mutants = [
        ptx.replacen("0f3EFFFFFE", "0f3EFFFFFF", 1),
        split_fma(&ptx, "0fBF317218"),
        ptx.replacen("cvt.rni.f32.f32", "cvt.rzi.f32.f32", 1),
    ];
    for (index, mutant) in mutants.iter().enumerate() {
        assert_ne!(*mutant, ptx, "mutant {index} changed nothing");
        let module = Module::parse(mutant).unwrap();
        let kernel = module.kernel("tw_math_exp").unwrap();
        let n = x.len() as u32;
        let params = kernel
            .pack_params(&[
                &X_BASE.to_le_bytes(),
                &Y_BASE.to_le_bytes(),
                &n.to_le_bytes(),
            ])
            .unwrap();
        let mut x_bytes: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        let mut y_bytes = vec![0u8; x_bytes.len()];
        launch(
            kernel,
            &Launch::new([n.div_ceil(BLOCK), 1, 1], [BLOCK, 1, 1], &params),
            &mut [
                Allocation {
                    base: X_BASE,
                    bytes: &mut x_bytes,
                },
                Allocation {
                    base: Y_BASE,
                    bytes: &mut y_bytes,
                },
            ],
        )
        .unwrap();
        let differs = y_bytes
            .chunks_exact(4)
            .zip(&rust)
            .any(|(b, &r)| !same(f32::from_le_bytes(b.try_into().unwrap()), r));
        assert!(differs, "mutant {index} computes the same bits");
    }
}

/// A sequence may write its result over its input, and sequences emitted one after another
/// into one kernel share a `Temps` without clashing.
#[test]
fn sequences_compose_in_one_kernel() {
    let mut temps = Temps::new("m");
    let mut body = String::new();
    // %r1 = gelu(tanh(%r1)), then %r2 = rsqrt(%r1).
    MathFunction::Tanh.emit(&mut body, "%r1", "%r1", &mut temps);
    MathFunction::Gelu.emit(&mut body, "%r1", "%r1", &mut temps);
    MathFunction::Rsqrt.emit(&mut body, "%r2", "%r1", &mut temps);
    let ptx = format!(
        ".version 8.0\n.target sm_80\n.address_size 64\n\
         .visible .entry k(.param .u64 p_x)\n{{\n.reg .b32 %r<3>;\n.reg .b64 %rd<2>;\n{}\
         ld.param.u64 %rd1, [p_x];\nld.global.b32 %r1, [%rd1];\n{body}\
         st.global.b32 [%rd1], %r1;\nst.global.b32 [%rd1+4], %r2;\nret;\n}}\n",
        temps.declarations()
    );
    let module = Module::parse(&ptx).unwrap();
    let kernel = module.kernel("k").unwrap();
    let params = kernel.pack_params(&[&X_BASE.to_le_bytes()]).unwrap();
    for x in [0.3f32, -2.0, 7.5] {
        let mut bytes = [0u8; 8];
        bytes[..4].copy_from_slice(&x.to_le_bytes());
        launch(
            kernel,
            &Launch::new([1, 1, 1], [1, 1, 1], &params),
            &mut [Allocation {
                base: X_BASE,
                bytes: &mut bytes,
            }],
        )
        .unwrap();
        let word = |i: usize| f32::from_le_bytes(bytes[i..i + 4].try_into().unwrap());
        let g = tensor_wasm_jit::math::gelu(tensor_wasm_jit::math::tanh(x));
        assert_eq!(word(0).to_bits(), g.to_bits(), "gelu(tanh({x}))");
        let r = tensor_wasm_jit::math::rsqrt(g);
        assert!(same(word(4), r), "rsqrt(gelu(tanh({x})))");
    }
}
