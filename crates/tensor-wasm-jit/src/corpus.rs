//! The corpus of tenant-style CUDA C++ kernels (`kernels/*.cu`, compiled by NVRTC): the
//! shapes real kernels take beyond our blueprints — atomics, per-thread local arrays, an
//! indexed gather through the read-only path, warp shuffles, shared-memory tiles, a device
//! function called through a generic pointer, f64 over a grid-stride loop, a 2-D stencil,
//! flush-to-zero arithmetic. Each has a CPU reference written from its source, so the
//! interpreter, the stand-in driver and a real GPU are all checked against the same bytes.
//! Together with [`crate::conformance::SAXPY`] and [`crate::conformance::BLOCK_SUM`] they
//! are the kernels the PTX verifier and fencing must accept, fence and run unchanged.

use tensor_wasm_gpu::{KernelArg, LaunchConfig};

use crate::conformance::{CudaCase, CudaKernel, Layout, Rng};
use crate::Dtype;

macro_rules! corpus_kernel {
    ($name:ident, $entry:literal, $about:literal) => {
        #[doc = $about]
        pub const $name: CudaKernel = CudaKernel {
            entry: $entry,
            source: include_str!(concat!("../kernels/", $entry, ".cu")),
            about: $about,
        };
    };
}

corpus_kernel!(
    HISTOGRAM,
    "histogram",
    "a 64-bin histogram: atomicAdd on shared bins, then on global ones"
);
corpus_kernel!(
    MEDIAN_STENCIL,
    "median_stencil",
    "a per-thread array in local memory sorted by insertion, blended with .ftz PTX"
);
corpus_kernel!(
    GATHER,
    "gather",
    "an indexed gather through ld.global.nc, 0 for an index past the table"
);
corpus_kernel!(
    WARP_SUM,
    "warp_sum",
    "a sum per warp by a tree of __shfl_down_sync"
);
corpus_kernel!(
    MATMUL_TILED,
    "matmul_tiled",
    "16 x 16 shared-memory tiles, one fused multiply-add per product in k order"
);
corpus_kernel!(
    POLY_CALL,
    "poly_call",
    "a __noinline__ device function reading shared or global memory through a generic pointer"
);
corpus_kernel!(
    DAXPY_STRIDE,
    "daxpy_stride",
    "f64 a * x + y (one fma.rn.f64) over a grid-stride loop"
);
corpus_kernel!(
    CONV2D,
    "conv2d",
    "a 3 x 3 convolution with zero padding on a 2-D grid, fused multiply-adds row by row"
);

/// The corpus kernels of this module (the conformance set lists them after its own).
pub const KERNELS: [CudaKernel; 8] = [
    HISTOGRAM,
    MEDIAN_STENCIL,
    GATHER,
    WARP_SUM,
    MATMUL_TILED,
    POLY_CALL,
    DAXPY_STRIDE,
    CONV2D,
];

/// One launch: the buffers (words before, and after where the kernel writes them), the
/// scalars after them, and how to compare.
struct Spec {
    kernel: CudaKernel,
    grid: [u32; 3],
    block: [u32; 3],
    dtype: Dtype,
    buffers: Vec<(Vec<u32>, Option<Vec<u32>>)>,
    scalars: Vec<KernelArg>,
}

impl Spec {
    fn case(self) -> CudaCase {
        let lens: Vec<usize> = self
            .buffers
            .iter()
            .map(|(words, _)| 4 * words.len())
            .collect();
        let mut layout = Layout::new(&lens);
        for (index, (words, _)) in self.buffers.iter().enumerate() {
            layout.write(index, words);
        }
        let mut args: Vec<KernelArg> = (0..lens.len()).map(|i| layout.arg(i)).collect();
        args.extend(self.scalars);
        let mut after = layout.clone();
        for (index, (_, result)) in self.buffers.iter().enumerate() {
            if let Some(words) = result {
                after.write(index, words);
            }
        }
        CudaCase {
            kernel: self.kernel,
            config: LaunchConfig {
                grid: self.grid,
                block: self.block,
                shared_bytes: 0,
            },
            args,
            layout,
            dtype: self.dtype,
            expected: after.memory,
        }
    }
}

fn f(bits: u32) -> f32 {
    f32::from_bits(bits)
}

fn words(values: impl IntoIterator<Item = f32>) -> Vec<u32> {
    values.into_iter().map(f32::to_bits).collect()
}

/// `.ftz`: a subnormal becomes a zero of its sign.
fn ftz(x: f32) -> f32 {
    if x.is_subnormal() {
        0f32.copysign(x)
    } else {
        x
    }
}

/// The launches of the corpus, with their expected memories.
pub fn cases() -> Vec<CudaCase> {
    let mut rng = Rng::named("corpus");
    let mut draw = |count: usize, dtype| (0..count).map(|_| rng.bits(dtype)).collect::<Vec<_>>();
    let n = 300usize;
    let x = draw(n, Dtype::F32);
    let ints = draw(1000, Dtype::I32);
    let initial_bins = draw(64, Dtype::I32);
    let table = draw(200, Dtype::F32);
    let matmul = (draw(20 * 32, Dtype::F32), draw(32 * 24, Dtype::F32));
    let image = draw(19 * 23, Dtype::F32);
    let filter = draw(9, Dtype::F32);
    let coeffs = draw(32, Dtype::F32);
    let mut index_rng = Rng::named("corpus-indices");
    let indices: Vec<u32> = (0..n)
        .map(|_| (index_rng.below(210) as i32 - 5) as u32)
        .collect();
    let doubles: Vec<f64> = (0..2000)
        .map(|_| {
            // Finite values over a wide range, so no NaN payload question arises.
            let mantissa = index_rng.next_u64() >> 12;
            let exponent = 1023 - 60 + index_rng.below(120);
            f64::from_bits((exponent << 52) | mantissa)
                * if index_rng.below(2) == 0 { 1.0 } else { -1.0 }
        })
        .collect();

    let mut bins = initial_bins.clone();
    for v in &ints {
        bins[(v & 63) as usize] = bins[(v & 63) as usize].wrapping_add(1);
    }

    let median = (0..n).map(|i| {
        let mut w: Vec<f32> = (0..7)
            .map(|k| x[(i as i64 + k - 3).clamp(0, n as i64 - 1) as usize])
            .map(f)
            .collect();
        for k in 1..7 {
            let v = w[k];
            let mut m = k as i64 - 1;
            while m >= 0 && w[m as usize] > v {
                w[m as usize + 1] = w[m as usize];
                m -= 1;
            }
            w[(m + 1) as usize] = v;
        }
        let r = ftz(ftz(w[2]) * 0.25);
        let r = ftz(ftz(w[3]).mul_add(0.5, r));
        ftz(ftz(w[4]).mul_add(0.25, r))
    });

    let gathered = indices.iter().map(|&j| {
        let j = j as i32;
        if (0..table.len() as i32).contains(&j) {
            f(table[j as usize])
        } else {
            0.0
        }
    });

    let warps = n.div_ceil(32);
    let warp_sums = (0..warps).map(|w| {
        let mut v: Vec<f32> = (0..32)
            .map(|lane| x.get(w * 32 + lane).map_or(0.0, |&b| f(b)))
            .collect();
        for offset in [16, 8, 4, 2, 1] {
            v = (0..32)
                .map(|l| {
                    v[l] + if l + offset <= 31 {
                        v[l + offset]
                    } else {
                        v[l]
                    }
                })
                .collect();
        }
        v[0]
    });

    let (m, nn, k) = (20usize, 24usize, 32usize);
    let product = (0..m * nn).map(|i| {
        let (r, c) = (i / nn, i % nn);
        (0..k).fold(0f32, |acc, kk| {
            f(matmul.0[r * k + kk]).mul_add(f(matmul.1[kk * nn + c]), acc)
        })
    });

    let degree = 6usize;
    let poly = x.iter().map(|&v| {
        let v = f(v);
        (0..degree)
            .rev()
            .fold(f(coeffs[degree]), |acc, d| acc * v + f(coeffs[d]))
    });

    let a = -1.75f64;
    let (dx, dy) = doubles.split_at(1000);
    let daxpy = dx.iter().zip(dy).map(|(x, y)| a.mul_add(*x, *y));
    let f64_words = |values: &mut dyn Iterator<Item = f64>| -> Vec<u32> {
        values
            .flat_map(|v| {
                let bits = v.to_bits();
                [bits as u32, (bits >> 32) as u32]
            })
            .collect()
    };

    let (h, w) = (19i64, 23i64);
    let convolved = (0..h * w).map(|i| {
        let (py, px) = (i / w, i % w);
        let mut acc = 0f32;
        for dy in -1..=1 {
            for dx in -1..=1 {
                let (sy, sx) = (py + dy, px + dx);
                let v = if (0..h).contains(&sy) && (0..w).contains(&sx) {
                    f(image[(sy * w + sx) as usize])
                } else {
                    0.0
                };
                acc = v.mul_add(f(filter[((dy + 1) * 3 + dx + 1) as usize]), acc);
            }
        }
        acc
    });

    let zeros = |count: usize| vec![0u32; count];
    let specs = vec![
        Spec {
            kernel: HISTOGRAM,
            grid: [8, 1, 1],
            block: [128, 1, 1],
            dtype: Dtype::I32,
            buffers: vec![(ints.clone(), None), (initial_bins, Some(bins))],
            scalars: vec![KernelArg::U32(ints.len() as u32)],
        },
        Spec {
            kernel: MEDIAN_STENCIL,
            grid: [5, 1, 1],
            block: [64, 1, 1],
            dtype: Dtype::F32,
            buffers: vec![(x.clone(), None), (zeros(n), Some(words(median)))],
            scalars: vec![KernelArg::I32(n as i32)],
        },
        Spec {
            kernel: GATHER,
            grid: [3, 1, 1],
            block: [128, 1, 1],
            dtype: Dtype::F32,
            buffers: vec![
                (table.clone(), None),
                (indices.clone(), None),
                (zeros(n), Some(words(gathered))),
            ],
            scalars: vec![KernelArg::I32(table.len() as i32), KernelArg::I32(n as i32)],
        },
        Spec {
            kernel: WARP_SUM,
            grid: [5, 1, 1],
            block: [64, 1, 1],
            dtype: Dtype::F32,
            buffers: vec![(x.clone(), None), (zeros(warps), Some(words(warp_sums)))],
            scalars: vec![KernelArg::U32(n as u32)],
        },
        Spec {
            kernel: MATMUL_TILED,
            grid: [2, 2, 1],
            block: [16, 16, 1],
            dtype: Dtype::F32,
            buffers: vec![
                (matmul.0.clone(), None),
                (matmul.1.clone(), None),
                (zeros(m * nn), Some(words(product))),
            ],
            scalars: vec![
                KernelArg::I32(m as i32),
                KernelArg::I32(nn as i32),
                KernelArg::I32(k as i32),
            ],
        },
        Spec {
            kernel: POLY_CALL,
            grid: [5, 1, 1],
            block: [64, 1, 1],
            dtype: Dtype::F32,
            buffers: vec![
                (x.clone(), None),
                (coeffs.clone(), None),
                (zeros(n), Some(words(poly))),
            ],
            scalars: vec![KernelArg::I32(degree as i32), KernelArg::I32(n as i32)],
        },
        Spec {
            kernel: DAXPY_STRIDE,
            grid: [3, 1, 1],
            block: [64, 1, 1],
            dtype: Dtype::I32,
            buffers: vec![
                (f64_words(&mut dx.iter().copied()), None),
                (
                    f64_words(&mut dy.iter().copied()),
                    Some(f64_words(&mut daxpy.into_iter())),
                ),
            ],
            scalars: vec![KernelArg::F64(a), KernelArg::U64(dx.len() as u64)],
        },
        Spec {
            kernel: CONV2D,
            grid: [3, 3, 1],
            block: [8, 8, 1],
            dtype: Dtype::F32,
            buffers: vec![
                (image.clone(), None),
                (filter.clone(), None),
                (zeros((h * w) as usize), Some(words(convolved))),
            ],
            scalars: vec![KernelArg::I32(h as i32), KernelArg::I32(w as i32)],
        },
    ];
    specs.into_iter().map(Spec::case).collect()
}
