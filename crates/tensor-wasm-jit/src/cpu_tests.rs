//! Tests of the CPU implementation's stepping: a run paused anywhere computes what one pass
//! computes.

use tensor_wasm_gpu::{KernelArg, LaunchConfig};

use crate::{Blueprint, Shape};

/// Deterministic values with every sign, zero, and non-integers.
fn fill(memory: &mut [u8], seed: u32) {
    let mut state = seed.wrapping_mul(2_654_435_761).max(1);
    for chunk in memory.chunks_exact_mut(4) {
        state ^= state << 13;
        state ^= state >> 17;
        state ^= state << 5;
        let value = (state % 2001) as f32 / 64.0 - 15.0;
        chunk.copy_from_slice(&value.to_le_bytes());
    }
}

fn buffer(offset: usize, elements: usize) -> KernelArg {
    KernelArg::Buffer {
        offset: offset as u64,
        len: 4 * elements as u64,
    }
}

/// Runs `run` to the end with steps of `work`, counting steps.
fn run_sliced(
    blueprint: &Blueprint,
    config: &LaunchConfig,
    args: &[KernelArg],
    memory: &mut [u8],
    work: usize,
) -> usize {
    let mut run = blueprint
        .cpu_run(config, args, memory.len())
        .unwrap()
        .with_step_work(work);
    let mut steps = 1;
    while !run.step(memory).unwrap() {
        steps += 1;
        assert!(steps < 10_000_000, "no progress at a step of {work}");
    }
    steps
}

/// Every blueprint kind with a shape that leaves a ragged edge, its launch and memory.
fn launches() -> Vec<(Blueprint, LaunchConfig, Vec<KernelArg>, usize)> {
    let mut cases = Vec::new();
    let add =
        |descriptor: &str, shape: Shape, args: Vec<KernelArg>, len: usize, cases: &mut Vec<_>| {
            let blueprint: Blueprint = descriptor.parse().unwrap();
            let config = blueprint.launch_config(&shape).unwrap();
            cases.push((blueprint, config, args, len));
        };
    let n = 1000;
    add(
        "vector_add[4]",
        Shape::Elements { n: n as u32 },
        vec![
            buffer(0, n),
            buffer(4 * n, n),
            buffer(8 * n, n),
            KernelArg::U32(n as u32),
        ],
        12 * n,
        &mut cases,
    );
    add(
        "elementwise[fma]",
        Shape::Elements { n: n as u32 },
        vec![
            buffer(0, n),
            buffer(4 * n, n),
            buffer(8 * n, n),
            buffer(12 * n, n),
            KernelArg::U32(n as u32),
        ],
        16 * n,
        &mut cases,
    );
    let (rows, cols) = (3, 777);
    add(
        "reduce[sum]",
        Shape::Rows { rows, cols },
        vec![
            buffer(0, (rows * cols) as usize),
            buffer(4 * (rows * cols) as usize, rows as usize),
            KernelArg::U32(rows),
            KernelArg::U32(cols),
        ],
        4 * (rows * cols + rows) as usize,
        &mut cases,
    );
    let (m, nn, k) = (37usize, 300usize, 29usize);
    add(
        "matmul[16x16x16]",
        Shape::Matmul {
            m: m as u32,
            n: nn as u32,
            k: k as u32,
        },
        vec![
            buffer(0, m * k),
            buffer(4 * m * k, k * nn),
            buffer(4 * (m * k + k * nn), m * nn),
            KernelArg::U32(m as u32),
            KernelArg::U32(nn as u32),
            KernelArg::U32(k as u32),
        ],
        4 * (m * k + k * nn + m * nn),
        &mut cases,
    );
    let (images, channels, h, w, kk) = (2usize, 3usize, 9usize, 7usize, 4usize);
    let (input, weight) = (images * channels * h * w, kk * channels * 9);
    let output = images * kk * h * w;
    add(
        "conv2d[3x3,s1,p1]",
        Shape::Conv2d {
            n: images as u32,
            c: channels as u32,
            h: h as u32,
            w: w as u32,
            k: kk as u32,
        },
        vec![
            buffer(0, input),
            buffer(4 * input, weight),
            buffer(4 * (input + weight), output),
            KernelArg::U32(images as u32),
            KernelArg::U32(channels as u32),
            KernelArg::U32(h as u32),
            KernelArg::U32(w as u32),
            KernelArg::U32(kk as u32),
        ],
        4 * (input + weight + output),
        &mut cases,
    );
    cases
}

/// Pausing a run between steps, at any step size down to one operation, never changes a
/// byte of the result: steps resume exactly where the last one stopped.
#[test]
fn a_run_sliced_at_any_step_size_equals_one_pass() {
    for (blueprint, config, args, len) in launches() {
        let mut initial = vec![0u8; len];
        fill(&mut initial, len as u32);
        let mut expected = initial.clone();
        let steps = run_sliced(&blueprint, &config, &args, &mut expected, usize::MAX);
        assert_eq!(steps, 1, "{blueprint}: one unbounded step");
        assert_ne!(expected, initial, "{blueprint} computed nothing");
        for work in [1, 7, 64, 500] {
            let mut memory = initial.clone();
            let steps = run_sliced(&blueprint, &config, &args, &mut memory, work);
            assert!(steps > 1, "{blueprint}: a step of {work} must slice");
            assert!(
                memory == expected,
                "{blueprint}: steps of {work} changed the result"
            );
        }
    }
}

#[test]
fn a_step_over_memory_of_another_length_is_refused() {
    let (blueprint, config, args, len) = launches().remove(0);
    let mut run = blueprint.cpu_run(&config, &args, len).unwrap();
    let mut shorter = vec![0u8; len - 4];
    assert!(run.step(&mut shorter).is_err());
    assert!(shorter.iter().all(|&byte| byte == 0));
}

/// Values that round, overflow, underflow and propagate: placed among ordinary inputs.
const SPECIALS: [f32; 7] = [
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    f32::from_bits(1),
    -0.0,
    f32::MAX,
    1.0e-30,
];

/// The in-place path (aligned memory, no overlap) and the block path (here: memory one byte
/// off alignment) compute the same bytes, special values included.
#[test]
fn the_in_place_and_block_paths_agree() {
    let specials = SPECIALS;
    for (blueprint, config, args, len) in launches() {
        let mut initial = vec![0u8; len];
        fill(&mut initial, 7);
        for (i, chunk) in initial.chunks_exact_mut(4).enumerate().step_by(5) {
            chunk.copy_from_slice(&specials[i % specials.len()].to_le_bytes());
        }
        let mut aligned = vec![0u32; len / 4 + 1];
        let aligned_bytes: &mut [u8] = zerocopy::IntoBytes::as_mut_bytes(&mut aligned[..]);
        let aligned_bytes = &mut aligned_bytes[..len];
        aligned_bytes.copy_from_slice(&initial);
        run_sliced(&blueprint, &config, &args, aligned_bytes, usize::MAX);
        let mut shifted = vec![0u8; len + 1];
        shifted[1..].copy_from_slice(&initial);
        run_sliced(&blueprint, &config, &args, &mut shifted[1..], usize::MAX);
        assert!(
            aligned_bytes == &shifted[1..],
            "{blueprint}: the two paths differ"
        );
    }
}

/// Runs the parts of a launch for `workers` cores one after another, each in steps of one
/// panel or pixel; `false` when the launch has no parts.
fn run_parts(
    blueprint: &Blueprint,
    config: &LaunchConfig,
    args: &[KernelArg],
    memory: &mut [u8],
    workers: usize,
) -> bool {
    let Some(parts) = blueprint
        .cpu_parts(config, args, memory.len(), workers)
        .unwrap()
    else {
        return false;
    };
    assert!(parts.parts.len() <= workers.max(1));
    parts.run_in_order(memory).unwrap();
    true
}

/// f32 words equal bit for bit, any two NaNs taken as equal (payloads are not part of the
/// contract between CPU and GPU, nor between two CPU instruction orders).
fn same_words(left: &[u8], right: &[u8]) -> bool {
    left.len() == right.len()
        && left
            .chunks_exact(4)
            .zip(right.chunks_exact(4))
            .all(|(l, r)| {
                let l = f32::from_le_bytes([l[0], l[1], l[2], l[3]]);
                let r = f32::from_le_bytes([r[0], r[1], r[2], r[3]]);
                l.to_bits() == r.to_bits() || (l.is_nan() && r.is_nan())
            })
}

/// Matmul and conv2d as parts for 1 to 5 cores compute what one `CpuRun` computes, with
/// infinities, NaNs, denormals and signed zeros in every operand; the conv2d with non-finite
/// weights takes the pixel-by-pixel path and still agrees.
#[test]
fn parts_on_any_number_of_cores_equal_one_run() {
    let specials = SPECIALS;
    for (blueprint, config, args, len) in launches() {
        for every in [0, 97, 5] {
            let mut initial = vec![0u8; len];
            fill(&mut initial, 11);
            if every > 0 {
                for (i, chunk) in initial.chunks_exact_mut(4).enumerate().step_by(every) {
                    chunk.copy_from_slice(&specials[i % specials.len()].to_le_bytes());
                }
            }
            let mut expected = initial.clone();
            run_sliced(&blueprint, &config, &args, &mut expected, usize::MAX);
            for workers in 1..=5 {
                let mut memory = initial.clone();
                if !run_parts(&blueprint, &config, &args, &mut memory, workers) {
                    continue;
                }
                assert!(
                    same_words(&memory, &expected),
                    "{blueprint} on {workers} cores, specials every {every}"
                );
            }
        }
    }
}

/// Every blueprint runs as parts while its output overlaps no input. Over an input, an
/// element-wise kernel runs as one `CpuRun` (its order defines the result); the others never
/// get that far: validation refuses it.
#[test]
fn parts_are_offered_only_for_separate_buffers() {
    for (blueprint, config, args, len) in launches() {
        let kind = blueprint.to_string();
        assert!(
            blueprint
                .cpu_parts(&config, &args, len, 4)
                .unwrap()
                .is_some(),
            "{kind}"
        );
        // The output written over the first input.
        let mut aliased = args.clone();
        let KernelArg::Buffer { offset, .. } = args[0] else {
            unreachable!()
        };
        let output = aliased
            .iter()
            .rposition(|arg| matches!(arg, KernelArg::Buffer { .. }))
            .unwrap();
        if let KernelArg::Buffer { offset: out, .. } = &mut aliased[output] {
            *out = offset;
        }
        match blueprint.cpu_parts(&config, &aliased, len, 4) {
            Ok(parts) => assert!(parts.is_none(), "{kind} in place"),
            Err(_) => assert!(!kind.starts_with("elementwise"), "{kind} refused in place"),
        }
    }
}

/// Every blueprint of the conformance set, on its fixed cases (smaller and larger grids than
/// the shape's included): steps of any size and parts on 1 to 4 cores compute what one
/// uninterrupted run computes, and nothing outside the output changes.
#[test]
fn every_catalogue_blueprint_runs_alike_in_steps_and_in_parts() {
    for blueprint in crate::conformance::blueprints() {
        for case in crate::conformance::fixed_cases(&blueprint, 4) {
            let (config, args, layout) = crate::conformance::build(&blueprint, &case);
            let mut expected = layout.memory.clone();
            run_sliced(&blueprint, &config, &args, &mut expected, usize::MAX);
            let mut sliced = layout.memory.clone();
            run_sliced(&blueprint, &config, &args, &mut sliced, 7);
            assert!(same_words(&sliced, &expected), "{blueprint} in steps of 7");
            for workers in 1..=4 {
                let mut memory = layout.memory.clone();
                if run_parts(&blueprint, &config, &args, &mut memory, workers) {
                    assert!(
                        same_words(&memory, &expected),
                        "{blueprint} as parts on {workers} cores, grid {:?}",
                        config.grid
                    );
                }
            }
        }
    }
}

/// The GPU's whole 256-partial tree, every step, for [`crate::cpu::finish_row`] to match.
fn whole_tree(op: crate::ReduceOp, partials: &mut [f32]) -> f32 {
    let mut stride = partials.len() / 2;
    while stride > 0 {
        for t in 0..stride {
            let (acc, x) = (partials[t], partials[t + stride]);
            partials[t] = match op {
                crate::ReduceOp::Sum => acc + x,
                crate::ReduceOp::Max => {
                    if x > acc {
                        x
                    } else {
                        acc
                    }
                }
            };
        }
        stride /= 2;
    }
    partials[0]
}

/// A row shorter than the 256 partials skips the identities' steps and keeps the bits of the
/// whole tree: signed zeros (`-0.0 + 0.0` is `+0.0` on the GPU too), infinities and NaN among
/// the values, at every length around the powers of two.
#[test]
fn a_short_row_folds_to_the_whole_trees_bits() {
    use crate::cpu::{finish_row, reduce_identity, REDUCE_THREADS};
    let specials = [
        -0.0f32,
        0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        1e-45,
    ];
    for op in [crate::ReduceOp::Sum, crate::ReduceOp::Max] {
        for n in (0..=40).chain([63, 64, 65, 127, 128, 129, 200, 255, 256, 257, 700]) {
            for seed in 0..6u32 {
                let mut bytes = vec![0u8; 4 * n];
                fill(&mut bytes, seed + 1);
                let mut values: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
                    .collect();
                if seed > 0 {
                    for (i, value) in values.iter_mut().enumerate() {
                        if (i as u32 + seed).is_multiple_of(seed + 2) {
                            *value = specials[(i + seed as usize) % specials.len()];
                        }
                    }
                    if seed == 5 {
                        // Every value a negative zero: a sum's sign depends on the identities.
                        values.fill(-0.0);
                    }
                }
                let mut full = vec![reduce_identity::<f32>(op); REDUCE_THREADS];
                for (j, value) in values.iter().enumerate() {
                    let p = &mut full[j % REDUCE_THREADS];
                    *p = match op {
                        crate::ReduceOp::Sum => *p + value,
                        crate::ReduceOp::Max if *value > *p => *value,
                        crate::ReduceOp::Max => *p,
                    };
                }
                // Beyond the touched partials: garbage the short tree must not read.
                let mut short = full.clone();
                for p in short.iter_mut().skip(n) {
                    *p = 12345.0;
                }
                let expected = whole_tree(op, &mut full);
                let got = finish_row(op, &mut short, n);
                assert_eq!(
                    got.to_bits(),
                    expected.to_bits(),
                    "{op:?} over {n} values (seed {seed}): {got} vs {expected}"
                );
                let identity = reduce_identity::<f32>(op).to_bits();
                assert!(
                    short[..n.min(REDUCE_THREADS)]
                        .iter()
                        .all(|p| p.to_bits() == identity),
                    "{op:?} over {n}: the touched partials are reset"
                );
            }
        }
    }
}

/// A `conv2d[3x3,s1,p1]` launch over `[n, c, h, w]` with `k` filters: its launch config and
/// arguments, the byte offsets of its weights and output, and the memory's length (input,
/// weights and output in a row from byte 0).
fn conv_launch(
    [n, c, h, w, k]: [usize; 5],
) -> (Blueprint, LaunchConfig, Vec<KernelArg>, [usize; 3]) {
    let blueprint = Blueprint::parse("conv2d[3x3,s1,p1]").unwrap();
    let weights = 4 * n * c * h * w;
    let output = weights + 4 * k * c * 9;
    let len = output + 4 * n * k * h * w;
    let args = vec![
        buffer(0, n * c * h * w),
        buffer(weights, k * c * 9),
        buffer(output, n * k * h * w),
        KernelArg::U32(n as u32),
        KernelArg::U32(c as u32),
        KernelArg::U32(h as u32),
        KernelArg::U32(w as u32),
        KernelArg::U32(k as u32),
    ];
    let shape = blueprint.launch_shape(&args).unwrap();
    assert!(matches!(shape, Shape::Conv2d { .. }), "{shape:?}");
    let config = blueprint.launch_config(&shape).unwrap();
    (blueprint, config, args, [weights, output, len])
}

/// A convolution's packed weights are kept across launches only while their bytes are the
/// same: launches alternating between two sets of weights of one shape, at one place in
/// memory, each compute what one pass over their own weights computes.
#[test]
fn a_convolution_after_its_weights_change_uses_the_new_weights() {
    let (blueprint, config, args, [weights, output, len]) = conv_launch([2, 3, 6, 6, 5]);
    for round in 0..4u32 {
        let mut memory = vec![0u8; len];
        fill(&mut memory[..output], 7);
        // Every other round, other weights (the input stays the same).
        fill(&mut memory[weights..output], 100 + round % 2);
        let mut expected = memory.clone();
        run_sliced(&blueprint, &config, &args, &mut expected, usize::MAX);
        assert!(run_parts(&blueprint, &config, &args, &mut memory, 2));
        assert!(
            same_words(&memory, &expected),
            "round {round}: the parts used other weights"
        );
    }
}

/// The same weight bytes read as rows of other lengths (one filter over two channels, then
/// two filters over one channel) are other weights: the second convolution does not reuse
/// the first one's packing.
#[test]
fn the_same_weight_bytes_in_another_shape_are_packed_again() {
    for (c, k) in [(2usize, 1usize), (1, 2)] {
        let (blueprint, config, args, [weights, output, len]) = conv_launch([1, c, 5, 5, k]);
        let mut memory = vec![0u8; len];
        fill(&mut memory[..weights], 3);
        // The same 18 weights both times.
        fill(&mut memory[weights..output], 77);
        let mut expected = memory.clone();
        run_sliced(&blueprint, &config, &args, &mut expected, usize::MAX);
        // One part: every filter's weights packed as one block of bytes.
        assert!(run_parts(&blueprint, &config, &args, &mut memory, 1));
        assert!(
            same_words(&memory, &expected),
            "{c} channels, {k} filters: the parts differ"
        );
    }
}
