//! Blueprints on the CPU as parts that run on every core at once ([`CpuParts`]), each part a
//! range of outputs computed in the PTX's exact order per output:
//!
//! - element-wise and `vector_add[N]`: ranges of elements;
//! - reduce: ranges of rows, each folded as [`crate::CpuRun`] folds it;
//! - matmul: ranges of output rows, each a blocked, vectorised multiply
//!   ([`tensor_wasm_gpu::gemm`]).
//! - conv2d: one multiply per image, `weights (k × c·r·s) · columns (c·r·s × p·q)`, where the
//!   columns are the input taps each output pixel reads, gathered while b is packed (zero where
//!   a tap falls in the padding). Parts are ranges of (image, output channel) rows.
//!
//! The PTX skips padded taps rather than adding a zero product; the two agree whenever the
//! weights are finite (a sum that starts at +0 is never -0 in round-to-nearest, so adding `±0`
//! leaves it as it was). f32 weights with an infinity or NaN (`0 · inf` is NaN) make the part
//! compute pixel by pixel exactly as the PTX does instead.
//!
//! Parts need an output that overlaps no input: an element-wise kernel in place runs as one
//! [`crate::CpuRun`] instead (validation refuses aliasing for the rest; `disjoint` checks every
//! launch, and the CPU backend checks the parts once more).

use std::ops::Range;
use std::sync::Arc;

use tensor_wasm_gpu::gemm::{decode_into, encode_into, Gemm, GemmSource, Matrices};
use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError, KernelArg, LaunchConfig};

use crate::cpu::{
    apply_bytes, finish_row, fold_span, Element, Stage, BLOCK, REDUCE_SPAN, STEP_WORK,
};
use crate::{Blueprint, Dtype, ElementwiseOp, JitError, ReduceOp, Shape};

/// A step of a part's multiply: one packing, or one column of register tiles (microseconds on
/// an optimised build); the CPU backend runs steps until its slice of time is up.
const GEMM_STEP: usize = 1;

/// Fewer multiply-adds than this per part are not worth another core (unit tests split even
/// the smallest launches, to test the parts' edges).
const MIN_PART_WORK: usize = if cfg!(test) { 1 } else { 1 << 17 };

impl Blueprint {
    /// The CPU run of a launch as parts for up to `workers` cores, after
    /// [`Blueprint::validate_launch`]; `None` when the output overlaps an input (an element-wise
    /// kernel in place): that launch runs as one [`Blueprint::cpu_run`], whose order defines the
    /// result.
    ///
    /// # Errors
    /// Whatever `validate_launch` reports.
    pub fn cpu_parts(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
        workers: usize,
    ) -> Result<Option<CpuParts>, JitError> {
        self.validate_launch(config, args, memory_len)?;
        let shape = self.launch_shape(args)?;
        Ok(match self.dtype() {
            Dtype::F32 => self.parts::<f32>(config, args, &shape, workers),
            Dtype::I32 => self.parts::<i32>(config, args, &shape, workers),
        })
    }

    fn parts<T: Element + Send>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        workers: usize,
    ) -> Option<CpuParts> {
        let boxed = |part: Box<dyn CpuPart>| part;
        let parts = match self.plan::<T>(config, args, shape).ok()? {
            Stage::Kind(run) => run.parts(workers)?,
            Stage::Elementwise {
                op,
                alpha,
                inputs,
                out,
                count,
                ..
            } => CpuParts {
                parts: split(count, 1, workers)
                    .into_iter()
                    .map(|range| {
                        let output = out + 4 * range.start..out + 4 * range.end;
                        let part = ElementwisePart {
                            op,
                            alpha,
                            arity: inputs.len(),
                            next: range.start,
                            range,
                        };
                        (output, boxed(Box::new(part)))
                    })
                    .collect(),
                inputs: inputs.iter().map(|&at| at..at + 4 * count).collect(),
            },
            Stage::Reduce {
                op,
                x,
                out,
                rows,
                cols,
                partials,
                ..
            } => CpuParts {
                parts: split(rows, cols, workers)
                    .into_iter()
                    .map(|range| {
                        let output = out + 4 * range.start..out + 4 * range.end;
                        let part = ReducePart {
                            op,
                            cols,
                            first: range.start,
                            rows: range,
                            col: 0,
                            partials: partials.clone(),
                        };
                        (output, boxed(Box::new(part)))
                    })
                    .collect(),
                inputs: std::iter::once(x..x + 4 * rows * cols).collect(),
            },
            Stage::Matmul {
                a,
                b,
                c,
                n,
                k,
                rows,
                cols,
                ..
            } => CpuParts {
                parts: split(rows, cols * k, workers)
                    .into_iter()
                    .map(|range| {
                        let output = c + 4 * range.start * n..c + 4 * range.end * n;
                        let part = MatmulPart {
                            gemm: Gemm::<T>::new(range.len(), cols, k, n),
                            row0: range.start,
                            k,
                            n,
                        };
                        (output, boxed(Box::new(part)))
                    })
                    .collect(),
                inputs: vec![a..a + 4 * rows * k, b..b + 4 * k * n],
            },
            Stage::Conv {
                conv,
                buffers: [input, weight, output],
                pixels,
                channels,
                images,
                ..
            } => {
                let conv = Arc::new(conv);
                let taps = conv.taps();
                let plane = 4 * conv.p * conv.q;
                let inputs = vec![
                    input..input + images * conv.image_bytes(),
                    weight..weight + 4 * conv.k * taps,
                ];
                if pixels == 0 {
                    return Some(CpuParts {
                        inputs,
                        parts: Vec::new(),
                    });
                }
                let parts = split(images * channels, pixels * taps, workers)
                    .into_iter()
                    .map(|rows| {
                        // Flat row `i` is output channel `i % channels` of image `i / channels`.
                        let first = (rows.start / channels) * conv.k + rows.start % channels;
                        let last = ((rows.end - 1) / channels) * conv.k + (rows.end - 1) % channels;
                        let range = output + plane * first..output + plane * (last + 1);
                        let part = ConvPart::<T> {
                            conv: conv.clone(),
                            pixels,
                            channels,
                            rows,
                            first,
                            exact: None,
                            pixel: 0,
                            gemm: None,
                        };
                        (range, boxed(Box::new(part)))
                    })
                    .collect();
                CpuParts { inputs, parts }
            }
        };
        disjoint(parts)
    }
}

/// `rows` rows of `row_work` multiply-adds each, as at most `workers` ranges of whole rows, none
/// smaller than is worth a core.
pub(crate) fn split(rows: usize, row_work: usize, workers: usize) -> Vec<Range<usize>> {
    if rows == 0 {
        return Vec::new();
    }
    let worth = rows.saturating_mul(row_work.max(1)) / MIN_PART_WORK;
    let count = workers.min(worth).clamp(1, rows);
    let per = rows.div_ceil(count);
    (0..rows)
        .step_by(per)
        .map(|start| start..(start + per).min(rows))
        .collect()
}

/// `parts`, when no output overlaps an input (outputs are disjoint by construction).
pub(crate) fn disjoint(parts: CpuParts) -> Option<CpuParts> {
    let overlap = |x: &Range<usize>, y: &Range<usize>| x.start < y.end && y.start < x.end;
    let clear = parts.parts.iter().all(|(output, _)| {
        output.is_empty()
            || parts
                .inputs
                .iter()
                .all(|input| input.is_empty() || !overlap(output, input))
    });
    clear.then_some(parts)
}

/// Elements `range` of an element-wise kernel (`vector_add[N]` too), from `next` on.
struct ElementwisePart<T> {
    op: ElementwiseOp,
    alpha: Option<T>,
    arity: usize,
    range: Range<usize>,
    next: usize,
}

impl<T: Element + Send> CpuPart for ElementwisePart<T> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        if inputs.len() != self.arity {
            return Err(internal("element-wise"));
        }
        let chunk = self.next..self.range.end.min(self.next + STEP_WORK);
        let mut ins: [&[u8]; 3] = [&[], &[], &[]];
        for (view, input) in ins.iter_mut().zip(inputs) {
            *view = &input[4 * chunk.start..4 * chunk.end];
        }
        let at = chunk.start - self.range.start;
        let out = &mut output[4 * at..4 * (at + chunk.len())];
        apply_bytes(self.op, self.alpha, ins, out);
        self.next = chunk.end;
        Ok(self.next >= self.range.end)
    }
}

/// Rows `rows` of a reduction (the part's output starts at row `first`); the row in progress
/// is folded up to column `col`.
struct ReducePart<T> {
    op: ReduceOp,
    cols: usize,
    first: usize,
    rows: Range<usize>,
    col: usize,
    partials: Vec<T>,
}

impl<T: Element + Send> CpuPart for ReducePart<T> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        let [x] = inputs else {
            return Err(internal("reduce"));
        };
        let mut block = [T::ZERO; BLOCK];
        let mut spent = 0;
        while self.rows.start < self.rows.end && spent < STEP_WORK {
            let row = self.rows.start;
            let span = self.cols.min(self.col + REDUCE_SPAN) - self.col;
            let start = 4 * (row * self.cols + self.col);
            fold_span(
                self.op,
                &mut self.partials,
                &x[start..start + 4 * span],
                &mut block,
            );
            spent += span;
            self.col += span;
            if self.col == self.cols {
                let result = finish_row(self.op, &mut self.partials);
                let at = 4 * (row - self.first);
                encode_into(&[result], &mut output[at..at + 4]);
                self.rows.start += 1;
                self.col = 0;
                spent += self.partials.len();
            }
        }
        Ok(self.rows.start >= self.rows.end)
    }
}

/// Rows `row0..` of a matmul.
struct MatmulPart<T> {
    gemm: Gemm<T>,
    row0: usize,
    k: usize,
    n: usize,
}

impl<T: Element + Send> CpuPart for MatmulPart<T> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        let [a, b] = inputs else {
            return Err(internal("matmul"));
        };
        let source = Matrices {
            a: &a[4 * self.row0 * self.k..],
            b,
            k: self.k,
            ldb: self.n,
        };
        Ok(self.gemm.step(&source, output, GEMM_STEP))
    }
}

fn internal(kernel: &str) -> GpuError {
    GpuError::Cuda(format!(
        "{kernel} part got the wrong inputs (internal error)"
    ))
}

/// Dimensions of one convolution launch.
#[derive(Debug)]
pub(crate) struct Conv {
    pub(crate) n: usize,
    pub(crate) c: usize,
    pub(crate) h: usize,
    pub(crate) w: usize,
    pub(crate) k: usize,
    pub(crate) r: usize,
    pub(crate) s: usize,
    pub(crate) stride: usize,
    pub(crate) pad: usize,
    pub(crate) p: usize,
    pub(crate) q: usize,
}

impl Conv {
    /// Bytes of one input image.
    fn image_bytes(&self) -> usize {
        4 * self.c * self.h * self.w
    }

    /// Taps per output pixel.
    fn taps(&self) -> usize {
        self.c * self.r * self.s
    }
}

/// Output pixel `pq` of channel `ko` of image `img`: `x` is the input tensor's bytes, `w` the
/// weights'. The PTX's order: channels, then filter rows, then columns; taps in the padding are
/// skipped.
pub(crate) fn conv_pixel<T: Element>(
    conv: &Conv,
    [x, w]: [&[u8]; 2],
    [pq, ko, img]: [usize; 3],
) -> T {
    let load = |bytes: &[u8], index: usize| {
        let mut value = [T::ZERO];
        decode_into(&bytes[4 * index..4 * index + 4], &mut value);
        value[0]
    };
    let (p, q) = (pq / conv.q, pq % conv.q);
    let mut acc = T::ZERO;
    for ci in 0..conv.c {
        for r in 0..conv.r {
            let Some(ih) = (p * conv.stride + r).checked_sub(conv.pad) else {
                continue;
            };
            if ih >= conv.h {
                continue;
            }
            let row = ((img * conv.c + ci) * conv.h + ih) * conv.w;
            let taps = ((ko * conv.c + ci) * conv.r + r) * conv.s;
            for s in 0..conv.s {
                let Some(iw) = (q * conv.stride + s).checked_sub(conv.pad) else {
                    continue;
                };
                if iw < conv.w {
                    acc = acc.add(load(x, row + iw).mul(load(w, taps + s)));
                }
            }
        }
    }
    acc
}

/// Flat rows `rows` (image `i / channels`, output channel `i % channels`) of a convolution,
/// whose output range starts at output row `first` (`image * k + channel`).
struct ConvPart<T> {
    conv: Arc<Conv>,
    pixels: usize,
    channels: usize,
    rows: Range<usize>,
    first: usize,
    /// Whether the weights need the pixel-by-pixel path (decided at the first step).
    exact: Option<bool>,
    /// The pixel-by-pixel path: the next pixel of the row in progress.
    pixel: usize,
    /// The multiply of the image in progress.
    gemm: Option<Gemm<T>>,
}

/// One image's taps as the columns of a multiply: `b[(ci, r, s)][pixel]`.
struct Taps<'a> {
    conv: &'a Conv,
    /// The image's bytes.
    x: &'a [u8],
    /// The weights of the first output channel in the multiply onward.
    w: &'a [u8],
}

impl<T: Element> GemmSource<T> for Taps<'_> {
    fn a_row(&self, row: usize, p0: usize, out: &mut [T]) {
        decode_into(&self.w[4 * (row * self.conv.taps() + p0)..], out);
    }

    fn b_row(&self, tap: usize, col0: usize, out: &mut [T]) {
        let conv = self.conv;
        let (ci, rs) = (tap / (conv.r * conv.s), tap % (conv.r * conv.s));
        let (r, s) = (rs / conv.s, rs % conv.s);
        let mut pixel = col0;
        let mut filled = 0;
        while filled < out.len() {
            let (p, q0) = (pixel / conv.q, pixel % conv.q);
            let run = (conv.q - q0).min(out.len() - filled);
            let values = &mut out[filled..filled + run];
            match (p * conv.stride + r).checked_sub(conv.pad) {
                Some(ih) if ih < conv.h => {
                    let row = &self.x[4 * (ci * conv.h + ih) * conv.w..][..4 * conv.w];
                    for (value, q) in values.iter_mut().zip(q0..) {
                        *value = match (q * conv.stride + s).checked_sub(conv.pad) {
                            Some(iw) if iw < conv.w => {
                                let at = 4 * iw;
                                T::from_le([row[at], row[at + 1], row[at + 2], row[at + 3]])
                            }
                            _ => T::ZERO,
                        };
                    }
                }
                _ => values.fill(T::ZERO),
            }
            filled += run;
            pixel += run;
        }
    }
}

impl<T: Element + Send> CpuPart for ConvPart<T> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        let [x, w] = inputs else {
            return Err(internal("conv2d"));
        };
        let conv = self.conv.clone();
        let exact = *self.exact.get_or_insert_with(|| {
            let mut value = [T::ZERO];
            w.chunks_exact(4).any(|bytes| {
                decode_into(bytes, &mut value);
                !value[0].is_finite()
            })
        });
        let channels = self.channels;
        let mut spent = 0;
        while self.rows.start < self.rows.end && spent < STEP_WORK {
            let (img, ko) = (self.rows.start / channels, self.rows.start % channels);
            let row_out = img * conv.k + ko - self.first;
            let plane = conv.p * conv.q;
            if exact {
                let value: T = conv_pixel(&conv, [x, w], [self.pixel, ko, img]);
                let at = 4 * (row_out * plane + self.pixel);
                encode_into(&[value], &mut output[at..at + 4]);
                spent += conv.taps().max(1);
                self.pixel += 1;
                if self.pixel == self.pixels {
                    self.pixel = 0;
                    self.rows.start += 1;
                }
                continue;
            }
            // One multiply per image: this image's remaining rows of the part.
            let end = self.rows.end.min((img + 1) * channels);
            let gemm = self.gemm.get_or_insert_with(|| {
                Gemm::new(end - self.rows.start, self.pixels, conv.taps(), plane)
            });
            let taps = Taps {
                conv: &conv,
                x: &x[img * conv.image_bytes()..],
                w: &w[4 * ko * conv.taps()..],
            };
            let done = gemm.step(&taps, &mut output[4 * row_out * plane..], GEMM_STEP);
            spent += STEP_WORK;
            if done {
                self.rows.start = end;
                self.gemm = None;
            }
        }
        Ok(self.rows.start >= self.rows.end)
    }
}
