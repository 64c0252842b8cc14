//! `softmax[axis]`: softmax along one axis, max-subtracted, f32. The input is viewed as
//! `outer × n × inner` (row-major; `n` is the axis, `outer` the product of the dimensions
//! before it, `inner` of those after it); each of the `outer · inner` lines of `n` elements
//! (stride `inner`) is normalised on its own.
//!
//! Per line, with every operation rounded to f32 (`.rn`):
//! 1. `m` = the line's maximum: partial `t` of 256 folds elements `t, t + 256, ...` in order by
//!    `m = x > m ? x : m` from `-inf` (NaNs are skipped), then the fixed tree
//!    `p[t] = op(p[t], p[t + s])` for `s = 128, ..., 1`;
//! 2. `e_j = exp(x_j − m)` with [`crate::math::exp`];
//! 3. `s` = the sum of the `e_j`, by the same partials (from `+0`) and tree;
//! 4. `out_j = e_j / s`.
//!
//! Parameters `x, out, outer, n, inner`; one block of 256 threads per line
//! (`grid = [outer · inner, 1, 1]`, line `l` is `(l / inner, l % inner)`).

use std::fmt;
use std::ops::Range;

use tensor_wasm_gpu::gemm::decode_into;
use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use zerocopy::IntoBytes;

use super::rows::{block_tree, each_row, with_values, RowOp, RowRun};
use super::{product, Kind};
use crate::contract::{Param, ParamKind, Shape, BLOCK_1D};
use crate::cpu::{finish_row, fold_span, Element, Stage, REDUCE_THREADS};
use crate::emit::{global_pointer, ins, label, Ops};
use crate::math::{self, Temps};
use crate::{Dtype, JitError, ReduceOp};

/// `softmax[axis]`: the only form (the axis is chosen by the launch's sizes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SoftmaxAxis;

/// `outer, n, inner` of a shape with three sizes.
fn sizes(shape: &Shape) -> Option<[u32; 3]> {
    match (shape, &shape.sizes()[..]) {
        (Shape::Sizes { .. }, &[outer, n, inner]) => Some([outer, n, inner]),
        _ => None,
    }
}

impl Kind for SoftmaxAxis {
    const NAME: &'static str = "softmax";
    const EXAMPLES: &'static [&'static str] = &["softmax[axis]"];
    const RANDOM_CASES: u32 = 32;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        match params {
            "axis" => Ok(SoftmaxAxis),
            _ => Err(JitError::parse(descriptor, "softmax takes [axis]")),
        }
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("axis")
    }

    fn check(&self, dtype: Dtype) -> Result<(), String> {
        match dtype {
            Dtype::F32 => Ok(()),
            Dtype::I32 => Err("softmax is only defined for f32".into()),
        }
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("x", ParamKind::Input),
            Param::new("out", ParamKind::Output),
            Param::new("outer", ParamKind::U32),
            Param::new("n", ParamKind::U32),
            Param::new("inner", ParamKind::U32),
        ]
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let [outer, _, inner] = sizes(shape)?;
        Some([(u64::from(outer) * u64::from(inner)).max(1), 1, 1])
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        (sizes.len() == 3).then(|| Shape::of_sizes(sizes))
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        match sizes(shape) {
            Some(dims) => vec![product(&dims); 2],
            None => Vec::new(),
        }
    }

    fn shared_ptx(&self, _dtype: Dtype) -> String {
        format!(".shared .align 4 .b32 smem[{BLOCK_1D}];\n\n")
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        let mut temps = Temps::new("m");
        let mut body = String::new();
        emit_softmax(&mut body, ops, &mut temps);
        out.push_str(&temps.declarations());
        out.push_str(&body);
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        _args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Some([outer, n, inner]), &[x, out]) = (sizes(shape), buffers) else {
            return Err(JitError::InvalidLaunch("softmax takes two buffers".into()));
        };
        let (outer, n, inner) = (outer as usize, n as usize, inner as usize);
        let lines = (outer * inner).min(config.grid[0] as usize);
        // Slabs (outer indices) with a covered line; the last may be covered in part.
        let slabs = lines.div_ceil(inner.max(1));
        let op = Softmax { n, inner, lines };
        Ok(Box::new(RowRun::<T, _>::covering(
            op,
            std::iter::once(x..x + 4 * outer * n * inner).collect(),
            out,
            slabs,
            n * inner,
            n * inner,
        )))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::of_sizes(&[dims[0] % 4, dims[1] % 300, dims[2] % 3])
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [
            Shape::of_sizes(&[7, 333, 1]),
            Shape::of_sizes(&[16, 1000, 3]),
        ]
    }
}

/// The PTX of one line per block (see the module docs); `%r2` is the thread, `%r7` its
/// shared-memory slot.
fn emit_softmax(out: &mut String, ops: &Ops, temps: &mut Temps) {
    ins!(out, "mov.u32 %r1, %ctaid.x;");
    ins!(out, "cvt.u64.u32 %rd1, %r1; // line");
    ins!(out, "mov.u32 %r2, %tid.x;");
    ins!(out, "cvt.u64.u32 %rd2, %r2;");
    ins!(out, "ld.param.u32 %r3, [p_outer];");
    ins!(out, "ld.param.u32 %r4, [p_n];");
    ins!(out, "cvt.u64.u32 %rd4, %r4;");
    ins!(out, "ld.param.u32 %r8, [p_inner];");
    ins!(out, "cvt.u64.u32 %rd9, %r8;");
    ins!(out, "cvt.u64.u32 %rd3, %r3;");
    ins!(out, "mul.lo.u64 %rd3, %rd3, %rd9; // lines");
    ins!(
        out,
        "setp.ge.u64 %p1, %rd1, %rd3; // guard: line < lines (uniform in the block)"
    );
    ins!(out, "@%p1 bra DONE;");
    // First element of the line: (line / inner) * n * inner + line % inner; stride inner.
    ins!(out, "div.u64 %rd5, %rd1, %rd9;");
    ins!(out, "rem.u64 %rd6, %rd1, %rd9;");
    ins!(out, "mul.lo.u64 %rd5, %rd5, %rd4;");
    ins!(out, "mad.lo.u64 %rd5, %rd5, %rd9, %rd6;");
    ins!(out, "shl.b64 %rd5, %rd5, 2;");
    ins!(out, "shl.b64 %rd9, %rd9, 2; // stride in bytes");
    global_pointer(out, 10, "x");
    ins!(out, "add.u64 %rd10, %rd10, %rd5;");
    global_pointer(out, 11, "out");
    ins!(out, "add.u64 %rd11, %rd11, %rd5;");
    ins!(out, "mov.u32 %r5, smem;");
    ins!(out, "shl.b32 %r6, %r2, 2;");
    ins!(out, "add.u32 %r7, %r5, %r6; // &smem[t]");

    // 1. The maximum.
    ins!(out, "mov.f32 %v0, 0fFF800000; // -inf");
    line_loop(out, "MAX", |out| {
        ins!(out, "ld.global.b32 %v1, [%rd12];");
        ins!(out, "setp.gt.f32 %p5, %v1, %v0;");
        ins!(out, "selp.b32 %v0, %v1, %v0, %p5;");
    });
    block_tree(out, "MAX", |out| {
        ins!(out, "setp.gt.f32 %p5, %v2, %v1;");
        ins!(out, "selp.b32 %v1, %v2, %v1, %p5;");
    });
    ins!(out, "mov.b32 %v3, %v1; // m");

    // 2. and 3. e = exp(x - m), stored, and summed.
    ins!(out, "mov.b32 %v0, 0;");
    line_loop(out, "EXP", |out| {
        ins!(out, "ld.global.b32 %v1, [%rd12];");
        ins!(out, "{} %v1, %v1, %v3;", ops.sub);
        math::emit_exp(out, "%v2", "%v1", temps);
        ins!(out, "st.global.b32 [%rd13], %v2;");
        ins!(out, "{} %v0, %v0, %v2;", ops.add);
    });
    block_tree(out, "SUM", |out| ins!(out, "{} %v1, %v1, %v2;", ops.add));
    ins!(out, "mov.b32 %v3, %v1; // s");

    // 4. out = e / s.
    line_loop(out, "DIV", |out| {
        ins!(out, "ld.global.b32 %v1, [%rd13];");
        ins!(out, "div.rn.f32 %v1, %v1, %v3;");
        ins!(out, "st.global.b32 [%rd13], %v1;");
    });
}

/// `for j = t; j < n; j += 256 { body }` with `%rd12` / `%rd13` the addresses of element `j`
/// of the line in `x` / `out` (`%rd10`, `%rd11` its first, `%rd9` the stride in bytes).
fn line_loop(out: &mut String, tag: &str, body: impl FnOnce(&mut String)) {
    ins!(out, "mov.u64 %rd6, %rd2; // j = t");
    ins!(out, "mul.lo.u64 %rd7, %rd2, %rd9;");
    ins!(out, "add.u64 %rd12, %rd10, %rd7;");
    ins!(out, "add.u64 %rd13, %rd11, %rd7;");
    ins!(out, "mul.lo.u64 %rd8, %rd9, {BLOCK_1D}; // 256 elements on");
    label!(out, &format!("{tag}_LOOP"));
    ins!(out, "setp.ge.u64 %p2, %rd6, %rd4; // guard: j < n");
    ins!(out, "@%p2 bra {tag}_END;");
    body(out);
    ins!(out, "add.u64 %rd6, %rd6, {BLOCK_1D};");
    ins!(out, "add.u64 %rd12, %rd12, %rd8;");
    ins!(out, "add.u64 %rd13, %rd13, %rd8;");
    ins!(out, "bra {tag}_LOOP;");
    label!(out, &format!("{tag}_END"));
}

/// A slab (one outer index) of a softmax: its `inner` lines of `n` elements.
#[derive(Debug)]
struct Softmax {
    n: usize,
    inner: usize,
    /// Lines the launch covers (all of them but for a smaller grid).
    lines: usize,
}

impl<T: Element> RowOp<T> for Softmax {
    fn row_work(&self) -> usize {
        // About 30 operations per element for the exponential.
        32 * self.n * self.inner
    }

    fn row(&self, row: usize, inputs: &[&[u8]], out: &mut [u8]) {
        RowOp::<T>::rows(self, row..row + 1, (0, out.len() / 4), inputs, out);
    }

    fn rows(
        &self,
        rows: Range<usize>,
        (row_len, cols): (usize, usize),
        inputs: &[&[u8]],
        out: &mut [u8],
    ) {
        // One set of partials and scratch for every row.
        let mut partials = [0f32; REDUCE_THREADS];
        let mut block = [0f32; REDUCE_THREADS];
        each_row(rows, (row_len, cols), out, |row, out| {
            with_values(out, |out: &mut [f32]| {
                self.slab(row, inputs, out, [&mut partials, &mut block]);
            });
        });
    }

    fn keeps_output(&self) -> bool {
        !self.lines.is_multiple_of(self.inner.max(1))
    }
}

impl Softmax {
    /// Slab `row` into `out`, its `n · inner` elements.
    fn slab(
        &self,
        row: usize,
        inputs: &[&[u8]],
        out: &mut [f32],
        [partials, block]: [&mut [f32; REDUCE_THREADS]; 2],
    ) {
        let x = &inputs[0][4 * row * self.n * self.inner..][..4 * self.n * self.inner];
        let mut line = vec![0f32; if self.inner == 1 { 0 } else { self.n }];
        for i in 0..self.inner.min(self.lines.saturating_sub(row * self.inner)) {
            if self.inner == 1 {
                softmax_line(x, [&mut *partials, &mut *block], out);
                continue;
            }
            let mut bytes = Vec::with_capacity(4 * self.n);
            for j in 0..self.n {
                let at = 4 * (j * self.inner + i);
                bytes.extend_from_slice(&x[at..at + 4]);
            }
            softmax_line(&bytes, [&mut *partials, &mut *block], &mut line);
            for (j, value) in line.iter().enumerate() {
                out[j * self.inner + i] = *value;
            }
        }
    }
}

/// One contiguous line: `x` its `out.len()` elements as bytes.
fn softmax_line(x: &[u8], [partials, block]: [&mut [f32; REDUCE_THREADS]; 2], out: &mut [f32]) {
    // Only the partials a line of n elements touches are read (see `finish_row`).
    let n = out.len();
    decode_into(x, out);
    partials[..n.min(REDUCE_THREADS)].fill(f32::NEG_INFINITY);
    fold_span(ReduceOp::Max, partials, out.as_bytes(), block);
    let m = finish_row(ReduceOp::Max, partials, n);
    for y in out.chunks_mut(REDUCE_THREADS) {
        let d = &mut block[..y.len()];
        for (d, value) in d.iter_mut().zip(y.iter()) {
            *d = *value - m;
        }
        math::exp_slice(y, d);
    }
    // Element j into partial j % 256, in order of j.
    partials[..n.min(REDUCE_THREADS)].fill(0.0);
    for chunk in out.chunks(REDUCE_THREADS) {
        for (partial, value) in partials.iter_mut().zip(chunk) {
            *partial += *value;
        }
    }
    let s = finish_row(ReduceOp::Sum, partials, n);
    for value in out.iter_mut() {
        *value /= s;
    }
}
