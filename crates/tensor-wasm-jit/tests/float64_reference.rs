//! The model kernels against float64 references on ordinary data: the stated tolerances of
//! docs/kernels.md hold (the PTX computes the same bits as this CPU run: the interpreter's
//! conformance run checks that), and the data-movement kinds are exact.
//!
//! Each check prints the largest error it saw, so the documented figures can be re-measured
//! with `cargo test -p tensor-wasm-jit --test float64_reference -- --nocapture`.

use tensor_wasm_gpu::KernelArg;
use tensor_wasm_jit::{Blueprint, Shape};

/// Deterministic values, roughly normal (sum of uniforms), scaled by `scale`.
fn normal(count: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 40) as f32 / (1u64 << 24) as f32
    };
    (0..count)
        .map(|_| {
            let sum: f32 = (0..4).map(|_| uniform()).sum();
            (sum - 2.0) * scale
        })
        .collect()
}

/// Runs `descriptor` on the CPU over `inputs` (f32 values) and an output of `out` elements;
/// `sizes` are the shape's scalars, `extra` the trailing non-size scalars. Returns the output.
fn run(
    descriptor: &str,
    shape: Shape,
    inputs: &[&[f32]],
    out: usize,
    extra: &[KernelArg],
) -> Vec<f32> {
    let blueprint = Blueprint::parse(descriptor).unwrap();
    let mut memory = Vec::new();
    let mut args = Vec::new();
    let place = |values: &[f32], memory: &mut Vec<u8>| {
        let offset = memory.len().next_multiple_of(64);
        memory.resize(offset, 0);
        for value in values {
            memory.extend_from_slice(&value.to_le_bytes());
        }
        KernelArg::Buffer {
            offset: offset as u64,
            len: 4 * values.len() as u64,
        }
    };
    for input in inputs {
        args.push(place(input, &mut memory));
    }
    let output = place(&vec![0.0; out], &mut memory);
    args.push(output);
    args.extend(shape.sizes().into_iter().map(KernelArg::U32));
    args.extend_from_slice(extra);
    let config = blueprint.launch_config(&shape).unwrap();
    blueprint.run_cpu(&config, &args, &mut memory).unwrap();
    let KernelArg::Buffer { offset, .. } = output else {
        unreachable!()
    };
    memory[offset as usize..offset as usize + 4 * out]
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The largest `|got − want| / (atol + rtol·|want|)` (at most 1 within the tolerance).
fn worst(got: &[f32], want: &[f64], atol: f64, rtol: f64) -> f64 {
    assert_eq!(got.len(), want.len());
    got.iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - w).abs() / (atol + rtol * w.abs()))
        .fold(0.0, f64::max)
}

#[test]
fn softmax_is_within_its_tolerance() {
    for (outer, n, inner) in [(64usize, 1000usize, 1usize), (8, 77, 3), (4, 5000, 1)] {
        let x = normal(outer * n * inner, 1 + n as u64, 3.0);
        let got = run(
            "softmax[axis]",
            Shape::of_sizes(&[outer as u32, n as u32, inner as u32]),
            &[&x],
            x.len(),
            &[],
        );
        let mut want = vec![0f64; x.len()];
        for o in 0..outer {
            for i in 0..inner {
                let at = |j: usize| (o * n + j) * inner + i;
                let m = (0..n).map(|j| f64::from(x[at(j)])).fold(f64::MIN, f64::max);
                let s: f64 = (0..n).map(|j| (f64::from(x[at(j)]) - m).exp()).sum();
                for j in 0..n {
                    want[at(j)] = (f64::from(x[at(j)]) - m).exp() / s;
                }
            }
        }
        // Relative 2e-6: exp is within 1 ulp, the sum of n terms within about
        // (n/256 + 8) roundings, one division.
        let error = worst(&got, &want, 1e-30, 2e-6);
        println!("softmax {outer}x{n}x{inner}: {error:.3} of the tolerance");
        assert!(error <= 1.0, "softmax {outer}x{n}x{inner}: {error}");
    }
}

#[test]
fn layernorm_is_within_its_tolerance() {
    for (rows, cols) in [(16usize, 768usize), (3, 5), (2, 4099)] {
        let x = normal(rows * cols, cols as u64, 2.0);
        let x: Vec<f32> = x.iter().map(|v| v + 0.5).collect();
        let scale = normal(cols, 7, 1.0);
        let bias = normal(cols, 8, 1.0);
        let epsilon = 1e-5f32;
        let got = run(
            "layernorm[rows]",
            Shape::Rows {
                rows: rows as u32,
                cols: cols as u32,
            },
            &[&x, &scale, &bias],
            x.len(),
            &[KernelArg::F32(epsilon)],
        );
        let mut want = vec![0f64; x.len()];
        for r in 0..rows {
            let row: Vec<f64> = x[r * cols..][..cols]
                .iter()
                .map(|&v| f64::from(v))
                .collect();
            let mean = row.iter().sum::<f64>() / cols as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / cols as f64;
            let inv = 1.0 / (var + f64::from(epsilon)).sqrt();
            for j in 0..cols {
                want[r * cols + j] =
                    (row[j] - mean) * inv * f64::from(scale[j]) + f64::from(bias[j]);
            }
        }
        // Absolute 2e-6 + relative 2e-6 on outputs of order 1.
        let error = worst(&got, &want, 2e-6, 2e-6);
        println!("layernorm {rows}x{cols}: {error:.3} of the tolerance");
        assert!(error <= 1.0, "layernorm {rows}x{cols}: {error}");
    }
}

#[test]
fn bmm_is_within_its_tolerance() {
    let (batch, m, n, k) = (3usize, 17usize, 19usize, 300usize);
    let a = normal(batch * m * k, 11, 1.0);
    let b = normal(batch * k * n, 12, 1.0);
    for layout in ["nn", "nt", "tn", "tt"] {
        // The same matrices, stored transposed where the layout says so.
        let store = |values: &[f32], rows: usize, cols: usize, transposed: bool| {
            if !transposed {
                return values.to_vec();
            }
            let mut out = vec![0f32; values.len()];
            for (from, to) in values.chunks(rows * cols).zip(out.chunks_mut(rows * cols)) {
                for r in 0..rows {
                    for c in 0..cols {
                        to[c * rows + r] = from[r * cols + c];
                    }
                }
            }
            out
        };
        let stored_a = store(&a, m, k, layout.starts_with('t'));
        let stored_b = store(&b, k, n, layout.ends_with('t'));
        let got = run(
            &format!("bmm[{layout}]"),
            Shape::of_sizes(&[batch as u32, m as u32, n as u32, k as u32]),
            &[&stored_a, &stored_b],
            batch * m * n,
            &[],
        );
        let mut want = vec![0f64; batch * m * n];
        let mut magnitude = vec![0f64; batch * m * n];
        for q in 0..batch {
            for i in 0..m {
                for j in 0..n {
                    for p in 0..k {
                        let x = f64::from(a[(q * m + i) * k + p]);
                        let y = f64::from(b[(q * k + p) * n + j]);
                        want[(q * m + i) * n + j] += x * y;
                        magnitude[(q * m + i) * n + j] += (x * y).abs();
                    }
                }
            }
        }
        // A sum of k products in order: within k · 2^-24 of the sum of their magnitudes.
        let bound = k as f64 * f64::from(f32::EPSILON) / 2.0;
        let error = got
            .iter()
            .zip(&want)
            .zip(&magnitude)
            .map(|((&g, &w), &s)| (f64::from(g) - w).abs() / (bound * s))
            .fold(0.0, f64::max);
        println!("bmm[{layout}] k = {k}: {error:.3} of the tolerance");
        assert!(error <= 1.0, "bmm[{layout}]: {error}");
    }
}

#[test]
fn avgpool_is_within_its_tolerance_and_maxpool_is_exact() {
    let (n, c, h, w) = (2usize, 3usize, 13usize, 11usize);
    let x = normal(n * c * h * w, 21, 4.0);
    let (p, q) = ((h + 2 - 3) / 2 + 1, (w + 2 - 3) / 2 + 1);
    let shape = Shape::of_sizes(&[n as u32, c as u32, h as u32, w as u32]);
    let avg = run("avgpool[3x3,s2,p1]", shape, &[&x], n * c * p * q, &[]);
    let max = run("maxpool[3x3,s2,p1]", shape, &[&x], n * c * p * q, &[]);
    let mut want_avg = vec![0f64; avg.len()];
    for plane in 0..n * c {
        for i in 0..p {
            for j in 0..q {
                let (mut sum, mut count, mut top) = (0f64, 0, f32::NEG_INFINITY);
                for r in 0..3 {
                    for s in 0..3 {
                        let (y, x_) = ((2 * i + r) as isize - 1, (2 * j + s) as isize - 1);
                        if y < 0 || x_ < 0 || y >= h as isize || x_ >= w as isize {
                            continue;
                        }
                        let v = x[(plane * h + y as usize) * w + x_ as usize];
                        sum += f64::from(v);
                        count += 1;
                        top = top.max(v);
                    }
                }
                want_avg[(plane * p + i) * q + j] = sum / f64::from(count);
                assert_eq!(
                    max[(plane * p + i) * q + j],
                    top,
                    "maxpool at {plane} {i} {j}"
                );
            }
        }
    }
    let error = worst(&avg, &want_avg, 1e-6, 1e-6);
    println!("avgpool 3x3: {error:.3} of the tolerance");
    assert!(error <= 1.0, "avgpool: {error}");
}

#[test]
fn dwconv2d_is_within_the_bound_of_a_sum_in_order() {
    let (n, c, h, w) = (2usize, 5usize, 19usize, 23usize);
    let x = normal(n * c * h * w, 31, 1.0);
    for (r, stride, pad) in [(3usize, 1usize, 1usize), (5, 2, 2)] {
        let weight = normal(c * r * r, 32 + r as u64, 1.0);
        let (p, q) = (
            (h + 2 * pad - r) / stride + 1,
            (w + 2 * pad - r) / stride + 1,
        );
        let got = run(
            &format!("dwconv2d[{r}x{r},s{stride},p{pad}]"),
            Shape::of_sizes(&[n as u32, c as u32, h as u32, w as u32]),
            &[&x, &weight],
            n * c * p * q,
            &[],
        );
        let mut want = vec![0f64; got.len()];
        let mut magnitude = vec![0f64; got.len()];
        for plane in 0..n * c {
            let filter = &weight[(plane % c) * r * r..][..r * r];
            for i in 0..p {
                for j in 0..q {
                    let at = (plane * p + i) * q + j;
                    for dr in 0..r {
                        for ds in 0..r {
                            let (y, x_) = (i * stride + dr, j * stride + ds);
                            if y < pad || x_ < pad || y - pad >= h || x_ - pad >= w {
                                continue;
                            }
                            let v = f64::from(x[(plane * h + y - pad) * w + x_ - pad]);
                            let product = v * f64::from(filter[dr * r + ds]);
                            want[at] += product;
                            magnitude[at] += product.abs();
                        }
                    }
                }
            }
        }
        // A sum of r·r products in order: within r·r · 2^-24 of the sum of their magnitudes.
        let bound = (r * r) as f64 * f64::from(f32::EPSILON) / 2.0;
        let error = got
            .iter()
            .zip(&want)
            .zip(&magnitude)
            .map(|((&g, &w), &s)| (f64::from(g) - w).abs() / (bound * s))
            .fold(0.0, f64::max);
        println!("dwconv2d {r}x{r},s{stride},p{pad}: {error:.3} of the tolerance");
        assert!(error <= 1.0, "dwconv2d {r}x{r}: {error}");
    }
}
