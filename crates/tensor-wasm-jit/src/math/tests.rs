//! The math functions against float64 references: the maximum errors of the module docs are
//! measured (and asserted) here, over every 4099th f32 bit pattern, dense sweeps of the
//! interesting ranges, the values around each threshold, and the edges.

use super::*;
use crate::fma::map_f32_on;
use tensor_wasm_gpu::gemm::Isa;

// ---- float64 references -------------------------------------------------------------------

const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// `erf(x)` for `0 ≤ x < 3`: `2/√π · e^(−x²) · Σ 2ⁿ x^(2n+1) / (1·3·…·(2n+1))`, every term
/// positive (no cancellation), summed until a term no longer changes the sum.
fn erf_series(x: f64) -> f64 {
    let mut term = x;
    let mut sum = x;
    let mut n = 0.0;
    while term > sum * 1e-18 {
        n += 1.0;
        term *= 2.0 * x * x / (2.0 * n + 1.0);
        sum += term;
    }
    TWO_OVER_SQRT_PI * (-x * x).exp() * sum
}

/// `erfc(x)` for `x ≥ 3`: the continued fraction
/// `e^(−x²)/√π / (x + (1/2)/(x + 1/(x + (3/2)/(x + ...))))`, 200 levels from the bottom.
fn erfc_fraction(x: f64) -> f64 {
    if x > 27.0 {
        // Below 1e-318: zero for every f32 result measured against it.
        return 0.0;
    }
    let mut f = x;
    for k in (1..=200).rev() {
        f = x + f64::from(k) / 2.0 / f;
    }
    TWO_OVER_SQRT_PI / 2.0 * (-x * x).exp() / f
}

fn erf64(x: f64) -> f64 {
    let a = x.abs();
    // erfc(6) = 2.2e-17 is below half an f64 ulp of 1: erf rounds to 1 from there on.
    let value = if a >= 6.0 {
        1.0
    } else if a >= 3.0 {
        1.0 - erfc_fraction(a)
    } else {
        erf_series(a) // NaN too
    };
    value.copysign(x)
}

fn erfc64(x: f64) -> f64 {
    if x < 3.0 {
        1.0 - erf64(x)
    } else {
        erfc_fraction(x)
    }
}

fn sigmoid64(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// `x·Φ(x) = 0.5·x·erfc(−x/√2)`: no cancellation for negative `x`.
fn gelu64(x: f64) -> f64 {
    if x == f64::NEG_INFINITY {
        return -0.0;
    }
    0.5 * x * erfc64(-x * std::f64::consts::FRAC_1_SQRT_2)
}

fn reference(function: MathFunction) -> fn(f64) -> f64 {
    match function {
        MathFunction::Exp => f64::exp,
        MathFunction::Erf => erf64,
        MathFunction::Tanh => f64::tanh,
        MathFunction::Rsqrt => |x| 1.0 / x.sqrt(),
        MathFunction::Sigmoid => sigmoid64,
        MathFunction::Gelu => gelu64,
    }
}

#[test]
fn the_erf_reference_matches_known_values() {
    // Values of erf and erfc to 16 digits (as tabulated; Python's math.erf agrees).
    let erf = [
        (1e-5, 1.1283791670579e-05),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (2.0, 0.9953222650189527),
        (3.0, 0.9999779095030014),
    ];
    for (x, want) in erf {
        let got = erf64(x);
        assert!(
            ((got - want) / want).abs() < 4e-15,
            "erf({x}) = {got}, not {want}"
        );
        assert_eq!(erf64(-x), -got);
    }
    let erfc = [
        (0.5, 0.4795001221869535),
        (2.0, 0.004677734981047265),
        (3.0, 2.2090496998585438e-05),
        (5.0, 1.5374597944280351e-12),
        (10.0, 2.088487583762545e-45),
    ];
    for (x, want) in erfc {
        let got = erfc64(x);
        assert!(
            ((got - want) / want).abs() < 1e-13,
            "erfc({x}) = {got}, not {want}"
        );
    }
    assert_eq!(erf64(30.0), 1.0);
}

// ---- inputs ---------------------------------------------------------------------------------

/// Every 4099th f32 bit pattern from 0: both signs, every exponent, subnormals, ±inf, NaNs.
fn bit_sweep() -> impl Iterator<Item = f32> {
    (0..=u32::MAX).step_by(4099).map(f32::from_bits)
}

/// `count` evenly spaced values from `lo` to `hi`.
fn dense(lo: f32, hi: f32, count: u32) -> impl Iterator<Item = f32> {
    let step = (f64::from(hi) - f64::from(lo)) / f64::from(count - 1);
    (0..count).map(move |i| (f64::from(lo) + step * f64::from(i)) as f32)
}

/// The `2·n + 1` f32 values nearest to `x` (by bit pattern, within its sign).
fn around(x: f32, n: u32) -> impl Iterator<Item = f32> {
    let bits = x.to_bits();
    (bits.saturating_sub(n)..=bits.saturating_add(n)).map(f32::from_bits)
}

const EDGES: [f32; 16] = [
    0.0,
    -0.0,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::NAN,
    f32::MIN_POSITIVE,
    -f32::MIN_POSITIVE,
    f32::MAX,
    f32::MIN,
    1e-45,
    -1e-45,
    1.0,
    -1.0,
    88.72283,
    -103.97208,
    -87.33655,
];

/// The inputs of each function's largest error over all 2^32 (found by
/// `every_f32_input_is_within_the_bounds`), so that the sampled tests measure the maxima too.
const WORST: [f32; 6] = [
    -5.848642,     // exp: 0.891 ulp
    0.8956949,     // erf: 1.288 ulp
    0.63000596,    // tanh: 1.362 ulp
    1.1827658e-38, // rsqrt: 1.490 ulp
    -4.157294,     // sigmoid: 2.402 ulp
    -0.34085464,   // gelu: 1.776 ulp (x ≥ −0.5); -5.542594: 2 ulp + 8.259e-8
];

/// Every input a function is measured on: the bit sweep, the edges, the worst cases, and
/// `extra`.
fn inputs(extra: impl IntoIterator<Item = f32>) -> Vec<f32> {
    let mut all: Vec<f32> = bit_sweep()
        .chain(EDGES)
        .chain(WORST)
        .chain([-5.542594])
        .chain(extra)
        .collect();
    let negated: Vec<f32> = all.iter().map(|x| -x).collect();
    all.extend(negated);
    all
}

// ---- measuring ------------------------------------------------------------------------------

/// The f32 ulp at `r`: `2^(e − 23)` for `|r|` in `[2^e, 2^(e+1))`, `2^−149` below `2^−126`.
fn ulp(r: f64) -> f64 {
    let a = r.abs();
    if a < f64::from(f32::MIN_POSITIVE) {
        return 2f64.powi(-149);
    }
    let exponent = ((a.to_bits() >> 52) & 0x7ff) as i32 - 1023;
    2f64.powi(exponent - 23)
}

/// What a function's error is held to: at most `ulp` ulps where `ulp_where` holds, and at
/// most `ulp` ulps plus `absolute` everywhere.
struct Bound {
    ulp: f64,
    ulp_where: fn(f32) -> bool,
    absolute: f64,
}

fn bound(function: MathFunction) -> Bound {
    let everywhere = |_| true;
    let ulp = |ulp| Bound {
        ulp,
        ulp_where: everywhere,
        absolute: 0.0,
    };
    match function {
        MathFunction::Exp => ulp(1.0),
        MathFunction::Erf => ulp(1.5),
        MathFunction::Tanh => ulp(1.5),
        MathFunction::Rsqrt => ulp(1.5),
        MathFunction::Sigmoid => ulp(2.5),
        // Where 1 + erf(u) does not cancel much (x ≥ −0.5: 1 + erf ≥ 0.6), ulps alone;
        // below, the absolute error of erf near −1 times 0.5·|x| on top.
        MathFunction::Gelu => Bound {
            ulp: 2.0,
            ulp_where: |x| x >= -0.5,
            absolute: 2f64.powi(-23),
        },
    }
}

/// The largest errors over some inputs: in f32 ulps of the reference (where the bound
/// counts them), and beyond the bound's ulps in absolute terms (everywhere). Infinities
/// count as ±2^128; references beyond that are clamped to it.
#[derive(Debug, Clone, Copy, Default)]
struct Measured {
    inputs: u64,
    max_ulp: f64,
    worst_ulp: f32,
    max_excess: f64,
    worst_excess: f32,
}

impl Measured {
    fn merge(self, other: Measured) -> Measured {
        let (ulp, worst_ulp) = if other.max_ulp > self.max_ulp {
            (other.max_ulp, other.worst_ulp)
        } else {
            (self.max_ulp, self.worst_ulp)
        };
        let (excess, worst_excess) = if other.max_excess > self.max_excess {
            (other.max_excess, other.worst_excess)
        } else {
            (self.max_excess, self.worst_excess)
        };
        Measured {
            inputs: self.inputs + other.inputs,
            max_ulp: ulp,
            worst_ulp,
            max_excess: excess,
            worst_excess,
        }
    }
}

/// The errors of `y[i] = function(x[i])` against `reference`; a NaN must meet a NaN.
fn measure(name: &str, x: &[f32], y: &[f32], reference: fn(f64) -> f64, bound: &Bound) -> Measured {
    let limit = 2f64.powi(128);
    let mut m = Measured::default();
    for (&x, &y) in x.iter().zip(y) {
        m.inputs += 1;
        let r = reference(f64::from(x));
        if r.is_nan() || y.is_nan() {
            assert!(r.is_nan() && y.is_nan(), "{name}({x:e}) = {y:e}, not {r:e}");
            continue;
        }
        let r = r.clamp(-limit, limit);
        let y = if y.is_infinite() {
            limit.copysign(f64::from(y))
        } else {
            f64::from(y)
        };
        let error = (y - r).abs();
        let ulps = error / ulp(r);
        if (bound.ulp_where)(x) && ulps > m.max_ulp {
            (m.max_ulp, m.worst_ulp) = (ulps, x);
        }
        let excess = error - bound.ulp * ulp(r);
        if excess > m.max_excess {
            (m.max_excess, m.worst_excess) = (excess, x);
        }
    }
    m
}

/// Measures `function` (the scalar form) over `inputs`, prints the maxima, and asserts its
/// bound.
fn check(function: MathFunction, inputs: &[f32]) -> Measured {
    let y: Vec<f32> = inputs.iter().map(|&x| function.eval(x)).collect();
    let m = measure(
        function.name(),
        inputs,
        &y,
        reference(function),
        &bound(function),
    );
    report_and_assert(function, &m);
    m
}

fn report_and_assert(function: MathFunction, m: &Measured) {
    let bound = bound(function);
    let name = function.name();
    println!(
        "{name}: {} inputs, max {:.3} ulp at {:e}, max {:.3e} beyond {} ulp at {:e}",
        m.inputs, m.max_ulp, m.worst_ulp, m.max_excess, bound.ulp, m.worst_excess
    );
    assert!(
        m.max_ulp <= bound.ulp,
        "{name}: {} ulp at {:e} (bound {})",
        m.max_ulp,
        m.worst_ulp,
        bound.ulp
    );
    assert!(
        m.max_excess <= bound.absolute,
        "{name}({:e}): {} ulp + {:e} (bound {} ulp + {:e})",
        m.worst_excess,
        bound.ulp,
        m.max_excess,
        bound.ulp,
        bound.absolute
    );
}

#[test]
fn the_measurement_sees_an_error_of_two_ulp() {
    let x: Vec<f32> = dense(-10.0, 10.0, 1001).collect();
    let two_ulp_high: Vec<f32> = x
        .iter()
        .map(|&v| f32::from_bits(exp(v).to_bits() + 2))
        .collect();
    let m = measure(
        "exp + 2 ulp",
        &x,
        &two_ulp_high,
        f64::exp,
        &bound(MathFunction::Exp),
    );
    assert!((1.5..=3.0).contains(&m.max_ulp), "{}", m.max_ulp);
    assert!(m.max_excess > 0.0);
    let counted_nowhere = Bound {
        ulp: 1.0,
        ulp_where: |_| false,
        absolute: 0.0,
    };
    let m = measure("exp + 2 ulp", &x, &two_ulp_high, f64::exp, &counted_nowhere);
    assert_eq!(
        m.max_ulp, 0.0,
        "ulps counted where the bound does not count them"
    );
}

#[test]
fn exp_within_1_ulp() {
    let extra = dense(-104.0, 89.0, 400_001)
        .chain(dense(-1.0, 1.0, 100_001))
        .chain(around(88.72284, 2000))
        .chain(around(-87.33655, 2000))
        .chain(around(-103.27893, 2000))
        .chain(around(-103.97208, 2000));
    check(MathFunction::Exp, &inputs(extra));
}

#[test]
fn rsqrt_within_1_5_ulp() {
    let extra = dense(0.0, 4.0, 100_001).chain(around(1.0, 20_000));
    check(MathFunction::Rsqrt, &inputs(extra));
}

#[test]
fn sigmoid_within_2_5_ulp() {
    let extra = dense(-110.0, 20.0, 400_001).chain(dense(-1.0, 1.0, 100_001));
    check(MathFunction::Sigmoid, &inputs(extra));
}

#[test]
fn tanh_within_1_5_ulp() {
    let extra = dense(-10.0, 10.0, 400_001)
        .chain(around(0.625, 20_000))
        .chain(around(9.0, 2000));
    check(MathFunction::Tanh, &inputs(extra));
}

#[test]
fn erf_within_1_5_ulp() {
    let extra = dense(-5.0, 5.0, 400_001)
        .chain(around(0.875, 20_000))
        .chain(around(4.0, 2000))
        .chain(around(3.92, 20_000));
    check(MathFunction::Erf, &inputs(extra));
}

#[test]
fn gelu_within_2_ulp_plus_2_pow_minus_23() {
    let extra = dense(-12.0, 12.0, 400_001)
        .chain(dense(-1.0, 1.0, 100_001))
        .chain(around(-5.5, 20_000));
    check(MathFunction::Gelu, &inputs(extra));
}

/// Every one of the 2^32 inputs of every function, through the slice forms (vectorised where
/// the CPU allows, the same bits as the scalar forms). Minutes of CPU time:
/// `cargo test -p tensor-wasm-jit --lib -- --ignored --nocapture every_f32`.
#[test]
#[ignore = "exhaustive: minutes of CPU time"]
fn every_f32_input_is_within_the_bounds() {
    const CHUNK: u64 = 1 << 20;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    for function in MathFunction::ALL {
        let (reference, bound) = (reference(function), bound(function));
        let measured = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..threads)
                .map(|worker| {
                    let bound = &bound;
                    scope.spawn(move || {
                        let mut total = Measured::default();
                        let mut y = vec![0.0f32; CHUNK as usize];
                        let mut start = worker * CHUNK;
                        while start < 1 << 32 {
                            let x: Vec<f32> = (start..start + CHUNK)
                                .map(|b| f32::from_bits(b as u32))
                                .collect();
                            function.eval_slice(&mut y, &x);
                            let m = measure(function.name(), &x, &y, reference, bound);
                            total = total.merge(m);
                            start += threads * CHUNK;
                        }
                        total
                    })
                })
                .collect();
            workers
                .into_iter()
                .map(|w| w.join().expect("a worker"))
                .fold(Measured::default(), Measured::merge)
        });
        assert_eq!(measured.inputs, 1 << 32);
        report_and_assert(function, &measured);
    }
}

// ---- exact values ---------------------------------------------------------------------------

#[test]
fn special_values_are_exact() {
    let inf = f32::INFINITY;
    let bits = |x: f32| x.to_bits();
    for function in MathFunction::ALL {
        assert!(function.eval(f32::NAN).is_nan(), "{}", function.name());
        assert!(function.eval(-f32::NAN).is_nan(), "{}", function.name());
    }
    assert_eq!(exp(0.0), 1.0);
    assert_eq!(exp(-0.0), 1.0);
    assert_eq!(exp(inf), inf);
    assert_eq!(bits(exp(-inf)), 0);
    assert_eq!(exp(88.8), inf);
    assert_eq!(exp(f32::MIN), 0.0);
    assert_eq!(exp(1.0), std::f32::consts::E);
    assert_eq!(exp(-103.0), f32::from_bits(1), "e^-103 = 1.32 * 2^-149");
    assert_eq!(exp(-100.0), f32::from_bits(27), "e^-100 = 26.55 * 2^-149");
    assert_eq!(rsqrt(4.0), 0.5);
    assert_eq!(rsqrt(0.0), inf);
    assert_eq!(rsqrt(-0.0), -inf);
    assert_eq!(bits(rsqrt(inf)), 0);
    assert!(rsqrt(-1.0).is_nan());
    assert_eq!(sigmoid(0.0), 0.5);
    assert_eq!(sigmoid(-0.0), 0.5);
    assert_eq!(sigmoid(inf), 1.0);
    assert_eq!(bits(sigmoid(-inf)), 0);
    assert_eq!(sigmoid(-100.0), exp(-100.0), "subnormal tail");
    for (function, at_inf) in [(tanh as fn(f32) -> f32, 1.0), (erf, 1.0)] {
        assert_eq!(bits(function(0.0)), 0);
        assert_eq!(bits(function(-0.0)), bits(-0.0));
        assert_eq!(function(inf), at_inf);
        assert_eq!(function(-inf), -at_inf);
    }
    assert_eq!(tanh(1e-30), 1e-30);
    assert_eq!(erf(3.92), 1.0);
    assert_eq!(tanh(9.02), 1.0);
    assert_eq!(bits(gelu(0.0)), 0);
    assert_eq!(bits(gelu(-0.0)), bits(-0.0));
    assert_eq!(gelu(inf), inf);
    assert_eq!(bits(gelu(-inf)), bits(-0.0));
    assert_eq!(bits(gelu(-20.0)), bits(-0.0));
    assert_eq!(gelu(20.0), 20.0);
}

// ---- slices and PTX -------------------------------------------------------------------------

#[test]
fn slices_give_the_scalar_bits_on_every_path() {
    let x: Vec<f32> = bit_sweep().step_by(7).chain(EDGES).collect();
    for function in MathFunction::ALL {
        let scalar: Vec<f32> = x.iter().map(|&v| function.eval(v)).collect();
        let mut detected = vec![0.0; x.len()];
        function.eval_slice(&mut detected, &x);
        let mut paths = vec![("detected", detected)];
        for isa in Isa::ALL.into_iter().filter(|isa| isa.is_available()) {
            let mut y = vec![0.0; x.len()];
            match function {
                MathFunction::Exp => map_f32_on::<Exp>(isa, &mut y, &x),
                MathFunction::Erf => map_f32_on::<Erf>(isa, &mut y, &x),
                MathFunction::Tanh => map_f32_on::<Tanh>(isa, &mut y, &x),
                MathFunction::Rsqrt => map_f32_on::<Rsqrt>(isa, &mut y, &x),
                MathFunction::Sigmoid => map_f32_on::<Sigmoid>(isa, &mut y, &x),
                MathFunction::Gelu => map_f32_on::<Gelu>(isa, &mut y, &x),
            }
            paths.push((isa.name(), y));
        }
        for (i, &v) in x.iter().enumerate() {
            for (path, y) in paths.iter().map(|(path, y)| (path, y[i])) {
                let same = y.to_bits() == scalar[i].to_bits() || (y.is_nan() && scalar[i].is_nan());
                assert!(
                    same,
                    "{}({v:e}) {path}: {y:e} vs {:e}",
                    function.name(),
                    scalar[i]
                );
            }
        }
    }
}

#[test]
#[should_panic(expected = "lengths differ")]
fn slices_of_different_lengths_are_refused() {
    exp_slice(&mut [0.0; 2], &[1.0; 3]);
}

/// The opcodes the sequences may use: correctly rounded f32 arithmetic, exact conversions,
/// bit operations, comparisons and selects; nothing approximate.
const ALLOWED: [&str; 17] = [
    "add.rn.f32",
    "sub.rn.f32",
    "mul.rn.f32",
    "fma.rn.f32",
    "div.rn.f32",
    "sqrt.rn.f32",
    "abs.f32",
    "neg.f32",
    "cvt.rni.f32.f32",
    "cvt.rzi.s32.f32",
    "add.s32",
    "sub.s32",
    "shr.s32",
    "shl.b32",
    "and.b32",
    "or.b32",
    "selp.b32",
];

#[test]
fn emitted_sequences_use_only_exact_operations_and_write_dst_last() {
    for function in MathFunction::ALL {
        let mut temps = Temps::new("t");
        let mut out = String::new();
        function.emit(&mut out, "%x", "%x", &mut temps);
        let lines: Vec<&str> = out.lines().map(str::trim).collect();
        assert_eq!(lines[0], format!("// %x = {}(%x)", function.name()));
        // Only the last instruction writes the destination (the first operand).
        let writes_x = |l: &&&str| l.split_whitespace().nth(1) == Some("%x,");
        assert_eq!(lines.iter().filter(writes_x).count(), 1, "{out}");
        assert!(lines.last().unwrap().starts_with("mov.b32 %x, %tb"));
        for line in &lines[1..lines.len() - 1] {
            let opcode = line.split_whitespace().next().unwrap();
            let allowed = ALLOWED.contains(&opcode)
                || opcode.starts_with("setp.") && opcode.ends_with(".f32");
            assert!(allowed, "{}: {line}", function.name());
        }
        // Deterministic text, and declarations covering every temporary.
        let mut again = String::new();
        function.emit(&mut again, "%x", "%x", &mut Temps::new("t"));
        assert_eq!(out, again);
        let declared = temps.declarations();
        let used = out.matches("%tb").count();
        assert!(
            used > 0 && declared.contains(".reg .b32 %tb<"),
            "{declared}"
        );
    }
}

#[test]
fn temps_hand_out_fresh_names_and_declare_them() {
    let mut temps = Temps::new("q");
    assert_eq!(temps.declarations(), "");
    assert_eq!(
        (temps.b32(), temps.b32(), temps.pred()),
        ("%qb0".into(), "%qb1".into(), "%qp0".into())
    );
    assert_eq!(
        temps.declarations(),
        "    .reg .b32 %qb<2>;\n    .reg .pred %qp<1>;\n"
    );
}

#[test]
#[should_panic(expected = "ASCII lowercase")]
fn a_temps_prefix_is_letters() {
    Temps::new("%r");
}
