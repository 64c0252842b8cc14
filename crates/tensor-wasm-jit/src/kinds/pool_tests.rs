//! The pooling kinds' tests: grammar, launch shape, each fold's edge cases, and the CPU's
//! fast paths against the taps' fold in order.

use super::*;
use crate::{Blueprint, BlueprintKind};

/// Runs `descriptor` on the CPU over an `n × c × h × w` input of `values` (bits) and
/// returns the output's bits; the output buffer starts as a canary.
fn pool_cpu(descriptor: &str, [n, c, h, w]: [u32; 4], values: &[u32]) -> Vec<u32> {
    let blueprint = Blueprint::parse(descriptor).unwrap();
    let shape = Shape::of_sizes(&[n, c, h, w]);
    let elements = blueprint.buffer_elements(&shape);
    let (input, output) = (elements[0].unwrap() as usize, elements[1].unwrap() as usize);
    assert_eq!(values.len(), input);
    let mut memory: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    memory.extend(0x5ac3_5ac3_u32.to_le_bytes().repeat(output));
    let args = [
        KernelArg::Buffer {
            offset: 0,
            len: 4 * input as u64,
        },
        KernelArg::Buffer {
            offset: 4 * input as u64,
            len: 4 * output as u64,
        },
        KernelArg::U32(n),
        KernelArg::U32(c),
        KernelArg::U32(h),
        KernelArg::U32(w),
    ];
    let config = blueprint.launch_config(&shape).unwrap();
    let mut parted = memory.clone();
    blueprint.run_cpu(&config, &args, &mut memory).unwrap();
    blueprint
        .cpu_parts(&config, &args, parted.len(), 3)
        .unwrap()
        .expect("parts")
        .run_in_order(&mut parted)
        .unwrap();
    assert_eq!(memory, parted, "{descriptor}: one run and the parts differ");
    memory[4 * input..]
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

fn f32s(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

fn i32s(values: &[i32]) -> Vec<u32> {
    values.iter().map(|&v| v as u32).collect()
}

#[test]
fn descriptors_share_conv2ds_grammar_and_limits() {
    let max = Blueprint::parse("maxpool[3x3,s2,p1]").unwrap();
    assert_eq!(max.descriptor(), "maxpool[3x3,s2,p1]:f32");
    assert_eq!(max.entry_name(), "tw_maxpool_3x3_s2_p1_f32");
    let window = Conv2dParams {
        r: 2,
        s: 3,
        stride: 1,
        pad: 0,
    };
    assert_eq!(
        *Blueprint::parse("avgpool[2x3]:i32").unwrap().kind(),
        BlueprintKind::AvgPool(AvgPool(window))
    );
    assert_eq!(
        Blueprint::parse("maxpool[2x3]").unwrap().descriptor(),
        "maxpool[2x3,s1,p0]:f32"
    );
    for (bad, says) in [
        ("maxpool[3]", "maxpool takes a filter RxS"),
        (
            "avgpool[3x3,p1,s2]",
            "avgpool options are ,sSTRIDE then ,pPADDING",
        ),
        (
            "maxpool[3x3,p3]",
            "maxpool padding 3 must be smaller than the filter",
        ),
        ("avgpool[12x1]", "avgpool filter r must be in 1..=11"),
        ("maxpool[3x3,s0]", "maxpool stride must be in 1..=8"),
        ("avgpool[3x03]", "not a number"),
    ] {
        let error = Blueprint::parse(bad).unwrap_err().to_string();
        assert!(error.contains(says), "{bad}: {error}");
    }
    // conv2d's own messages still name conv2d.
    let error = Blueprint::parse("conv2d[3x3,p3]").unwrap_err().to_string();
    assert!(error.contains("conv2d padding 3"), "{error}");
}

#[test]
fn the_launch_is_a_row_per_output_row_of_each_plane() {
    let blueprint = Blueprint::parse("avgpool[3x3,s2,p1]").unwrap();
    // 2 × 3 planes of 9 × 600: P = 5, Q = 300.
    let shape = Shape::of_sizes(&[2, 3, 9, 600]);
    let config = blueprint.launch_config(&shape).unwrap();
    assert_eq!(config.grid, [30, 2, 1]);
    assert_eq!(config.block, [256, 1, 1]);
    assert_eq!(
        blueprint.buffer_elements(&shape),
        [Some(2 * 3 * 9 * 600), Some(2 * 3 * 5 * 300)]
    );
    let params: Vec<&str> = blueprint.params().iter().map(|p| p.name).collect();
    assert_eq!(params, ["input", "output", "n", "c", "h", "w"]);
}

#[test]
fn maxpool_takes_the_largest_in_range_tap() {
    // One 4 × 4 plane, 1..16 row by row.
    let plane: Vec<f32> = (1..=16).map(|v| v as f32).collect();
    assert_eq!(
        pool_cpu("maxpool[2x2,s2]", [1, 1, 4, 4], &f32s(&plane)),
        f32s(&[6., 8., 14., 16.])
    );
    // Padding 1, 3 × 3, stride 2: windows over rows/columns -1..=1 and 1..=3.
    assert_eq!(
        pool_cpu("maxpool[3x3,s2,p1]", [1, 1, 4, 4], &f32s(&plane)),
        f32s(&[6., 8., 14., 16.])
    );
    // Negative values: padding is skipped, not a zero tap.
    let negative: Vec<f32> = plane.iter().map(|v| -v).collect();
    assert_eq!(
        pool_cpu("maxpool[3x3,s2,p1]", [1, 1, 4, 4], &f32s(&negative)),
        f32s(&[-1., -2., -5., -6.])
    );
    let ints: Vec<i32> = (1..=16).map(|v| -v).collect();
    assert_eq!(
        pool_cpu("maxpool[3x3,s2,p1]:i32", [1, 1, 4, 4], &i32s(&ints)),
        i32s(&[-1, -2, -5, -6])
    );
}

#[test]
fn a_nan_tap_makes_the_max_nan_wherever_it_is() {
    // 1 × 4, windows 1 × 2 with stride 2: [NaN, 1] and [1, NaN].
    let values = [f32::NAN, 1., 1., f32::NAN];
    let out = pool_cpu("maxpool[1x2,s2]", [1, 1, 1, 4], &f32s(&values));
    assert!(
        out.iter().all(|&bits| f32::from_bits(bits).is_nan()),
        "{out:x?}"
    );
    // Ties keep the earlier tap: -0 then +0 gives -0.
    let out = pool_cpu("maxpool[1x2]", [1, 1, 1, 2], &f32s(&[-0.0, 0.0]));
    assert_eq!(out, [0x8000_0000]);
}

#[test]
fn two_by_two_windows_fold_special_values_in_tap_order() {
    // Every window of four from NaNs (two payloads), infinities, ±0 and ±1: the pairs path
    // (2×2 at stride 2, folding columns first) against the select in order of r, s.
    let specials = [
        f32::NAN.to_bits(),
        0xffc0_0001,
        f32::NEG_INFINITY.to_bits(),
        (-1.0f32).to_bits(),
        (-0.0f32).to_bits(),
        0,
        1.0f32.to_bits(),
        f32::INFINITY.to_bits(),
    ];
    let count = specials.len().pow(4);
    let windows: Vec<[u32; 4]> = (0..count)
        .map(|i| [0, 1, 2, 3].map(|t| specials[i / specials.len().pow(t) % specials.len()]))
        .collect();
    let expected: Vec<u32> = windows
        .iter()
        .map(|taps| {
            let fold = taps
                .iter()
                .fold(f32::NEG_INFINITY, |m, &x| select(m, f32::from_bits(x)));
            fold.to_bits()
        })
        .collect();
    // One 2 × 2 plane per window, and the same windows side by side in planes of 2 × 16.
    let planes: Vec<u32> = windows.concat();
    let got = pool_cpu("maxpool[2x2,s2]", [1, count as u32, 2, 2], &planes);
    assert_eq!(got, expected);
    // Planes of 2 × 2·across: `across` windows side by side (the AVX-512 path takes
    // rows of 1, 2, 4, 8 or 16; 5 takes the other).
    for across in [4, 5, 8] {
        let mut wide = Vec::new();
        for row in windows.chunks(across) {
            for half in [0, 2] {
                wide.extend(row.iter().flat_map(|taps| [taps[half], taps[half + 1]]));
            }
        }
        let planes = (count / across) as u32;
        let wide = &wide[..4 * across * planes as usize];
        let got = pool_cpu("maxpool[2x2,s2]", [1, planes, 2, 2 * across as u32], wide);
        assert_eq!(got, expected[..got.len()], "{across} across");
    }
}

#[test]
fn avgpool_divides_by_the_in_range_taps() {
    // 3 × 3 with padding 1 over a 3 × 3 plane of 1..9: corners average 4 taps, edges 6,
    // the centre 9.
    let plane: Vec<f32> = (1..=9).map(|v| v as f32).collect();
    let expected = [
        (1. + 2. + 4. + 5.) / 4.,
        (1. + 2. + 3. + 4. + 5. + 6.) / 6.,
        (2. + 3. + 5. + 6.) / 4.,
        (1. + 2. + 4. + 5. + 7. + 8.) / 6.,
        45. / 9.,
        (2. + 3. + 5. + 6. + 8. + 9.) / 6.,
        (4. + 5. + 7. + 8.) / 4.,
        (4. + 5. + 6. + 7. + 8. + 9.) / 6.,
        (5. + 6. + 8. + 9.) / 4.,
    ];
    assert_eq!(
        pool_cpu("avgpool[3x3,p1]", [1, 1, 3, 3], &f32s(&plane)),
        f32s(&expected)
    );
    // i32: a wrapping sum, then division truncating toward zero.
    let ints = [-7, 0, 5, 2, i32::MAX, 1];
    assert_eq!(
        pool_cpu("avgpool[1x2,s2]:i32", [1, 1, 1, 6], &i32s(&ints)),
        i32s(&[-3, 3, i32::MIN / 2])
    );
}

#[test]
fn a_window_without_taps_writes_lowest_or_zero() {
    // No input rows, padding 2 under a 3 × 3 filter: P = 2 rows of Q = 5 windows over
    // nothing.
    let max = pool_cpu("maxpool[3x3,p2]", [1, 1, 0, 3], &[]);
    assert_eq!(max, f32s(&[f32::NEG_INFINITY; 10]));
    let max = pool_cpu("maxpool[3x3,p2]:i32", [1, 1, 0, 3], &[]);
    assert_eq!(max, i32s(&[i32::MIN; 10]));
    let mean = pool_cpu("avgpool[3x3,p2]", [1, 1, 0, 3], &[]);
    assert_eq!(mean, [0; 10]);
}

#[test]
fn every_plane_and_row_of_a_batch_is_pooled() {
    // 2 images × 3 channels of 5 × 7, each plane offset by 100 · plane.
    let (n, c, h, w) = (2u32, 3u32, 5u32, 7u32);
    let values: Vec<i32> = (0..n * c * h * w)
        .map(|i| (i / (h * w)) as i32 * 100 + (i % (h * w)) as i32)
        .collect();
    let out = pool_cpu("maxpool[2x2,s2]:i32", [n, c, h, w], &i32s(&values));
    // P = 2, Q = 3: the max of each window is its bottom-right tap.
    let mut expected = Vec::new();
    for plane in 0..6 {
        for p in 0..2 {
            for q in 0..3 {
                expected.push((plane * 100 + (2 * p + 1) * 7 + 2 * q + 1) as u32);
            }
        }
    }
    assert_eq!(out, expected);
}
