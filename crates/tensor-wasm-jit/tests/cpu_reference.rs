//! Differential tests: every blueprint's `run_cpu` against a naive reference on random inputs,
//! including shapes not divisible by tiles, empty dimensions and partially covering grids.

use proptest::prelude::*;
use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use tensor_wasm_jit::{
    conv2d_output_size, math, Blueprint, BlueprintKind, Chain, ChainOp, Dtype, ElementwiseOp, Shape,
};

/// Byte every output starts as; bytes the launch does not cover must keep it.
const SENTINEL: u8 = 0xA5;

/// Guest memory under construction: buffers placed one after another on 16-byte boundaries.
#[derive(Default)]
struct Memory {
    bytes: Vec<u8>,
}

impl Memory {
    fn place(&mut self, words: &[u32]) -> KernelArg {
        while !self.bytes.len().is_multiple_of(16) {
            self.bytes.push(0x5A);
        }
        let offset = self.bytes.len() as u64;
        for word in words {
            self.bytes.extend_from_slice(&word.to_le_bytes());
        }
        KernelArg::Buffer {
            offset,
            len: 4 * words.len() as u64,
        }
    }

    fn output(&mut self, elements: usize) -> KernelArg {
        let arg = self.place(&vec![u32::from_le_bytes([SENTINEL; 4]); elements]);
        self.bytes.extend_from_slice(&[0x3C; 16]);
        arg
    }

    fn words(&self, arg: &KernelArg) -> Vec<u32> {
        let KernelArg::Buffer { offset, len } = *arg else {
            panic!("not a buffer")
        };
        self.bytes[offset as usize..(offset + len) as usize]
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()
    }
}

/// Reference arithmetic, written independently of the crate: f32 as IEEE, i32 wrapping.
#[derive(Clone, Copy, Debug)]
enum Values {
    F32,
    I32,
}

impl Values {
    fn of(dtype: Dtype) -> Self {
        match dtype {
            Dtype::F32 => Values::F32,
            Dtype::I32 => Values::I32,
        }
    }

    fn binary(self, op: ElementwiseOp, a: u32, b: u32) -> u32 {
        match self {
            Values::F32 => {
                let (a, b) = (f32::from_bits(a), f32::from_bits(b));
                let r = match op {
                    ElementwiseOp::Add => a + b,
                    ElementwiseOp::Sub => a - b,
                    ElementwiseOp::Mul => a * b,
                    ElementwiseOp::Div => a / b,
                    ElementwiseOp::Max => {
                        if a > b {
                            a
                        } else {
                            b
                        }
                    }
                    ElementwiseOp::Min => {
                        if a < b {
                            a
                        } else {
                            b
                        }
                    }
                    _ => unreachable!("not binary"),
                };
                r.to_bits()
            }
            Values::I32 => {
                let (a, b) = (a as i32, b as i32);
                let r = match op {
                    ElementwiseOp::Add => a.wrapping_add(b),
                    ElementwiseOp::Sub => a.wrapping_sub(b),
                    ElementwiseOp::Mul => a.wrapping_mul(b),
                    ElementwiseOp::Max => a.max(b),
                    ElementwiseOp::Min => a.min(b),
                    _ => unreachable!("not binary"),
                };
                r as u32
            }
        }
    }

    fn add(self, a: u32, b: u32) -> u32 {
        self.binary(ElementwiseOp::Add, a, b)
    }

    fn mul(self, a: u32, b: u32) -> u32 {
        self.binary(ElementwiseOp::Mul, a, b)
    }

    fn zero(self) -> u32 {
        0
    }
}

fn value_strategy(dtype: Dtype) -> BoxedStrategy<u32> {
    match dtype {
        Dtype::F32 => prop_oneof![
            8 => (-100.0f32..100.0).prop_map(f32::to_bits),
            1 => Just(0.0f32.to_bits()),
            1 => Just((-0.0f32).to_bits()),
            1 => Just(1.0e-40f32.to_bits()),
        ]
        .boxed(),
        Dtype::I32 => prop_oneof![
            4 => any::<i32>().prop_map(|v| v as u32),
            4 => (-50i32..50).prop_map(|v| v as u32),
        ]
        .boxed(),
    }
}

fn dtype_strategy() -> impl Strategy<Value = Dtype> {
    prop_oneof![Just(Dtype::F32), Just(Dtype::I32)]
}

/// A data type and a pool of random values of that type.
fn typed_pool(min: usize) -> impl Strategy<Value = (Dtype, Vec<u32>)> {
    dtype_strategy().prop_flat_map(move |dtype| {
        (
            Just(dtype),
            prop::collection::vec(value_strategy(dtype), min..97),
        )
    })
}

fn values(dtype: Dtype, count: usize, seed: &[u32]) -> Vec<u32> {
    // Stretch a random pool into `count` values deterministically; f32 values stay finite so
    // that results compare bitwise.
    (0..count)
        .map(|i| seed[(i * 7 + i / seed.len()) % seed.len()])
        .map(|v| match dtype {
            Dtype::F32 if !f32::from_bits(v).is_finite() => 0,
            _ => v,
        })
        .collect()
}

/// Runs a launch as `run_cpu` does (`parts == false`) or as the parts of `cpu_parts` for
/// `workers` cores, one after another (their outputs are disjoint and no part writes what the
/// parts read, so the order does not matter); the parts path must be offered.
fn run(
    blueprint: &Blueprint,
    config: &LaunchConfig,
    args: &[KernelArg],
    bytes: &mut [u8],
    parts: Option<usize>,
) {
    let Some(workers) = parts else {
        blueprint.run_cpu(config, args, bytes).unwrap();
        return;
    };
    blueprint
        .cpu_parts(config, args, bytes.len(), workers)
        .unwrap()
        .expect("launches with separate buffers run as parts")
        .run_in_order(bytes)
        .unwrap();
}

fn shrink_grid(config: LaunchConfig, fraction: [u32; 3]) -> LaunchConfig {
    let mut config = config;
    for (blocks, quarters) in config.grid.iter_mut().zip(fraction) {
        *blocks = (*blocks * quarters).div_ceil(4).max(1);
    }
    config
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn elementwise_matches_the_reference(
        op in prop::sample::select(ElementwiseOp::ALL.to_vec()),
        (dtype, pool) in typed_pool(1),
        n in 0usize..700,
        quarter in 1u32..=4,
        in_place in any::<bool>(),
        alpha_bits in any::<u32>(),
        parts in prop::option::of(1usize..5),
    ) {
        let Ok(blueprint) = Blueprint::parse(&format!("elementwise[{}]:{}", op.as_str(), dtype.as_str())) else {
            prop_assert!(op.inputs() == 1 || op == ElementwiseOp::Div, "{}", op.as_str());
            prop_assert!(dtype == Dtype::I32);
            return Ok(());
        };
        let arith = Values::of(dtype);
        let inputs: Vec<Vec<u32>> = (0..op.inputs())
            .map(|i| values(dtype, n, &pool[i % pool.len()..]))
            .collect();
        let alpha = match dtype {
            Dtype::F32 => values(dtype, 1, &[alpha_bits])[0],
            Dtype::I32 => alpha_bits,
        };
        let mut memory = Memory::default();
        let mut args: Vec<KernelArg> = inputs.iter().map(|v| memory.place(v)).collect();
        let in_place = in_place && op.inputs() > 0;
        let out = if in_place { args[0] } else { memory.output(n) };
        args.push(out);
        if op == ElementwiseOp::Scale {
            args.push(match dtype {
                Dtype::F32 => KernelArg::F32(f32::from_bits(alpha)),
                Dtype::I32 => KernelArg::I32(alpha as i32),
            });
        }
        args.push(KernelArg::U32(n as u32));
        let full = blueprint.launch_config(&Shape::Elements { n: n as u32 }).unwrap();
        let config = shrink_grid(full, [quarter, 4, 4]);
        let before = memory.words(&out);
        // In place, a launch runs as one `CpuRun`, never as parts.
        run(&blueprint, &config, &args, &mut memory.bytes, parts.filter(|_| !in_place));
        let got = memory.words(&out);
        let covered = (config.grid[0] as usize * 256).min(n);
        for i in 0..n {
            if i >= covered {
                prop_assert_eq!(got[i], before[i], "uncovered element {} changed", i);
                continue;
            }
            let want = match op {
                ElementwiseOp::Relu => match dtype {
                    Dtype::F32 => { let x = f32::from_bits(inputs[0][i]); if x > 0.0 { x.to_bits() } else { 0 } }
                    Dtype::I32 => (inputs[0][i] as i32).max(0) as u32,
                },
                ElementwiseOp::Scale => arith.mul(alpha, inputs[0][i]),
                ElementwiseOp::Fma => match dtype {
                    Dtype::F32 => f32::from_bits(inputs[0][i])
                        .mul_add(f32::from_bits(inputs[1][i]), f32::from_bits(inputs[2][i]))
                        .to_bits(),
                    Dtype::I32 => arith.add(arith.mul(inputs[0][i], inputs[1][i]), inputs[2][i]),
                },
                ElementwiseOp::Exp
                | ElementwiseOp::Tanh
                | ElementwiseOp::Sigmoid
                | ElementwiseOp::Rsqrt
                | ElementwiseOp::Erf
                | ElementwiseOp::Gelu => {
                    let x = f32::from_bits(inputs[0][i]);
                    let y = match op {
                        ElementwiseOp::Exp => math::exp(x),
                        ElementwiseOp::Tanh => math::tanh(x),
                        ElementwiseOp::Sigmoid => math::sigmoid(x),
                        ElementwiseOp::Rsqrt => math::rsqrt(x),
                        ElementwiseOp::Erf => math::erf(x),
                        _ => math::gelu(x),
                    };
                    y.to_bits()
                }
                _ => arith.binary(op, inputs[0][i], inputs[1][i]),
            };
            let nan = |bits: u32| f32::from_bits(bits).is_nan();
            if dtype == Dtype::F32 && nan(want) {
                prop_assert!(nan(got[i]), "{} element {}: NaN expected", blueprint, i);
                continue;
            }
            prop_assert_eq!(got[i], want, "{} element {}", blueprint, i);
        }
    }

    #[test]
    fn vector_add_matches_the_reference(
        lanes in prop::sample::select(vec![1u32, 2, 4, 8, 16]),
        (dtype, pool) in typed_pool(2),
        n in 0usize..3000,
        quarter in 1u32..=4,
        parts in prop::option::of(1usize..5),
    ) {
        let blueprint = Blueprint::parse(&format!("vector_add[{lanes}]:{}", dtype.as_str())).unwrap();
        let arith = Values::of(dtype);
        let a = values(dtype, n, &pool);
        let b = values(dtype, n, &pool[1..]);
        let mut memory = Memory::default();
        let args = vec![memory.place(&a), memory.place(&b), memory.output(n), KernelArg::U32(n as u32)];
        let config = shrink_grid(blueprint.launch_config(&Shape::Elements { n: n as u32 }).unwrap(), [quarter, 4, 4]);
        run(&blueprint, &config, &args, &mut memory.bytes, parts);
        let got = memory.words(&args[2]);
        let covered = (config.grid[0] as usize * 256 * lanes as usize).min(n);
        for i in 0..n {
            let want = if i < covered { arith.add(a[i], b[i]) } else { u32::from_le_bytes([SENTINEL; 4]) };
            prop_assert_eq!(got[i], want, "element {}", i);
        }
    }

    #[test]
    fn reduce_matches_the_reference(
        max in any::<bool>(),
        (dtype, pool) in typed_pool(1),
        rows in 0usize..5,
        cols in 0usize..1100,
        parts in prop::option::of(1usize..5),
    ) {
        let op = if max { "max" } else { "sum" };
        let blueprint = Blueprint::parse(&format!("reduce[{op}]:{}", dtype.as_str())).unwrap();
        let x = values(dtype, rows * cols, &pool);
        let mut memory = Memory::default();
        let args = vec![memory.place(&x), memory.output(rows), KernelArg::U32(rows as u32), KernelArg::U32(cols as u32)];
        let config = blueprint.launch_config(&Shape::Rows { rows: rows as u32, cols: cols as u32 }).unwrap();
        run(&blueprint, &config, &args, &mut memory.bytes, parts);
        let got = memory.words(&args[1]);
        for row in 0..rows {
            let values = &x[row * cols..(row + 1) * cols];
            match (dtype, max) {
                (Dtype::I32, false) => {
                    let want = values.iter().fold(0i32, |acc, &v| acc.wrapping_add(v as i32));
                    prop_assert_eq!(got[row] as i32, want);
                }
                (Dtype::I32, true) => {
                    let want = values.iter().map(|&v| v as i32).max().unwrap_or(i32::MIN);
                    prop_assert_eq!(got[row] as i32, want);
                }
                (Dtype::F32, true) => {
                    let want = values.iter().map(|&v| f32::from_bits(v)).fold(f32::NEG_INFINITY, f32::max);
                    prop_assert_eq!(f32::from_bits(got[row]), want);
                }
                (Dtype::F32, false) => {
                    // The documented GPU order: 256 strided partials, then a halving tree.
                    let mut partials = vec![0.0f32; 256];
                    for (t, partial) in partials.iter_mut().enumerate() {
                        for v in values.iter().skip(t).step_by(256) {
                            *partial += f32::from_bits(*v);
                        }
                    }
                    let mut width = 256;
                    while width > 1 {
                        width /= 2;
                        for t in 0..width {
                            partials[t] += partials[t + width];
                        }
                    }
                    prop_assert_eq!(got[row], partials[0].to_bits());
                    let exact: f64 = values.iter().map(|&v| f64::from(f32::from_bits(v))).sum();
                    let scale: f64 = values.iter().map(|&v| f64::from(f32::from_bits(v)).abs()).sum();
                    prop_assert!((f64::from(partials[0]) - exact).abs() <= 1e-5 * scale + 1e-30);
                }
            }
        }
    }

    #[test]
    fn matmul_matches_the_reference(
        tile in prop::sample::select(vec!["16x16x16", "8x4x3", "1x1x1", "5x7x2", "32x8x16"]),
        (dtype, pool) in typed_pool(1),
        m in 0usize..40,
        n in 0usize..40,
        k in 0usize..40,
        quarters in (1u32..=4, 1u32..=4),
        parts in prop::option::of(1usize..5),
    ) {
        let blueprint = Blueprint::parse(&format!("matmul[{tile}]:{}", dtype.as_str())).unwrap();
        let BlueprintKind::Matmul(t) = *blueprint.kind() else { unreachable!() };
        let arith = Values::of(dtype);
        let a = values(dtype, m * k, &pool);
        let b = values(dtype, k * n, &pool[pool.len() / 2..]);
        let mut memory = Memory::default();
        let args = vec![
            memory.place(&a), memory.place(&b), memory.output(m * n),
            KernelArg::U32(m as u32), KernelArg::U32(n as u32), KernelArg::U32(k as u32),
        ];
        let shape = Shape::Matmul { m: m as u32, n: n as u32, k: k as u32 };
        let config = shrink_grid(blueprint.launch_config(&shape).unwrap(), [quarters.0, quarters.1, 4]);
        run(&blueprint, &config, &args, &mut memory.bytes, parts);
        let got = memory.words(&args[2]);
        let rows = (config.grid[1] * t.m) as usize;
        let cols = (config.grid[0] * t.n) as usize;
        for i in 0..m {
            for j in 0..n {
                let want = if i < rows && j < cols {
                    (0..k).fold(arith.zero(), |acc, p| arith.add(acc, arith.mul(a[i * k + p], b[p * n + j])))
                } else {
                    u32::from_le_bytes([SENTINEL; 4])
                };
                prop_assert_eq!(got[i * n + j], want, "c[{}][{}]", i, j);
            }
        }
    }

    #[test]
    fn conv2d_matches_the_reference(
        params in prop::sample::select(vec!["3x3", "3x3,s2,p1", "1x1", "5x3,s3,p2", "2x4,s1,p1"]),
        (dtype, pool) in typed_pool(1),
        dims in (1usize..3, 0usize..4, 0usize..12, 0usize..12, 1usize..4),
        quarter in 1u32..=4,
        parts in prop::option::of(1usize..5),
    ) {
        let (batch, c, h, w, k) = dims;
        let blueprint = Blueprint::parse(&format!("conv2d[{params}]:{}", dtype.as_str())).unwrap();
        let BlueprintKind::Conv2d(conv) = *blueprint.kind() else { unreachable!() };
        let (r, s, stride, pad) = (conv.r as usize, conv.s as usize, conv.stride as usize, conv.pad as usize);
        let (p_out, q_out) = conv2d_output_size(&conv, h as u32, w as u32);
        let (p_out, q_out) = (p_out as usize, q_out as usize);
        let arith = Values::of(dtype);
        let input = values(dtype, batch * c * h * w, &pool);
        let weight = values(dtype, k * c * r * s, &pool[pool.len() / 3..]);
        let mut memory = Memory::default();
        let args = vec![
            memory.place(&input), memory.place(&weight), memory.output(batch * k * p_out * q_out),
            KernelArg::U32(batch as u32), KernelArg::U32(c as u32), KernelArg::U32(h as u32),
            KernelArg::U32(w as u32), KernelArg::U32(k as u32),
        ];
        let shape = Shape::Conv2d { n: batch as u32, c: c as u32, h: h as u32, w: w as u32, k: k as u32 };
        let config = shrink_grid(blueprint.launch_config(&shape).unwrap(), [quarter, 4, 4]);
        run(&blueprint, &config, &args, &mut memory.bytes, parts);
        let got = memory.words(&args[2]);
        let pixels = config.grid[0] as usize * 256;
        for img in 0..batch {
            for ko in 0..k {
                for p in 0..p_out {
                    for q in 0..q_out {
                        let mut acc = arith.zero();
                        for ci in 0..c {
                            for fr in 0..r {
                                for fs in 0..s {
                                    let ih = (p * stride + fr) as isize - pad as isize;
                                    let iw = (q * stride + fs) as isize - pad as isize;
                                    if ih < 0 || iw < 0 || ih >= h as isize || iw >= w as isize {
                                        continue;
                                    }
                                    let x = input[((img * c + ci) * h + ih as usize) * w + iw as usize];
                                    let f = weight[((ko * c + ci) * r + fr) * s + fs];
                                    acc = arith.add(acc, arith.mul(x, f));
                                }
                            }
                        }
                        let index = ((img * k + ko) * p_out + p) * q_out + q;
                        let want = if p * q_out + q < pixels { acc } else { u32::from_le_bytes([SENTINEL; 4]) };
                        prop_assert_eq!(got[index], want, "out[{}][{}][{}][{}]", img, ko, p, q);
                    }
                }
            }
        }
    }
}

/// f32 bits of every class: ordinary values, any bits, NaNs (payloads, both signs), infinities,
/// signed zeros and subnormals.
fn edge_f32() -> impl Strategy<Value = u32> {
    prop_oneof![
        4 => (-10.0f32..10.0).prop_map(f32::to_bits),
        2 => any::<u32>(),
        1 => prop::sample::select(vec![
            0x0000_0000u32, 0x8000_0000, 0x7f80_0000, 0xff80_0000,
            0x7fc0_0000, 0xffc0_0001, 0x7f80_0001, 0x7f7f_ffff,
        ]),
        1 => (0u32..0x0080_0000, any::<bool>()).prop_map(|(m, sign)| m | u32::from(sign) << 31),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// A `chain[..]` computes the bits of its `elementwise[..]` kernels run one after another
    /// (`neg` as `elementwise[scale]` with `alpha = -1`), NaN payloads included, in one run or
    /// as parts, in place or not, over several blocks of the CPU backend.
    #[test]
    fn chain_gives_the_bits_of_its_elementwise_kernels_in_a_row(
        ops in prop::collection::vec(prop::sample::select(ChainOp::ALL.to_vec()), 2..=4),
        n in prop_oneof![0usize..300, 1000usize..2600],
        seed in prop::collection::vec(edge_f32(), 5 * 2600),
        in_place in any::<bool>(),
        parts in prop::option::of(1usize..5),
    ) {
        let chain = Chain::new(&ops).unwrap();
        let names: Vec<&str> = ops.iter().map(ChainOp::as_str).collect();
        let blueprint = Blueprint::parse(&format!("chain[{}]", names.join("."))).unwrap();
        prop_assert_eq!(blueprint.kind(), &BlueprintKind::Chain(chain));
        let inputs: Vec<&[u32]> =
            (0..=chain.operands()).map(|i| &seed[i * n..(i + 1) * n]).collect();
        let shape = Shape::Elements { n: n as u32 };

        let mut memory = Memory::default();
        let mut args: Vec<KernelArg> = inputs.iter().map(|v| memory.place(v)).collect();
        let out = if in_place { args[0] } else { memory.output(n) };
        args.extend([out, KernelArg::U32(n as u32)]);
        let config = blueprint.launch_config(&shape).unwrap();
        run(&blueprint, &config, &args, &mut memory.bytes, parts.filter(|_| !in_place));
        let got = memory.words(&out);

        // The same operations as separate launches, each into a buffer of its own.
        let mut steps = Memory::default();
        let mut value = steps.place(inputs[0]);
        let mut operands = inputs[1..].iter();
        for op in &ops {
            let descriptor = format!("elementwise[{}]", op.elementwise().as_str());
            let kernel = Blueprint::parse(&descriptor).unwrap();
            let mut args = vec![value];
            if op.is_binary() {
                args.push(steps.place(operands.next().unwrap()));
            }
            value = steps.output(n);
            args.push(value);
            if *op == ChainOp::Neg {
                args.push(KernelArg::F32(-1.0));
            }
            args.push(KernelArg::U32(n as u32));
            let config = kernel.launch_config(&shape).unwrap();
            kernel.run_cpu(&config, &args, &mut steps.bytes).unwrap();
        }
        let want = steps.words(&value);
        for i in 0..n {
            prop_assert_eq!(got[i], want[i], "{} element {}", blueprint, i);
        }
    }
}
