//! `layernorm[rows]`: layer normalisation of each row of a `rows × cols` matrix, with a scale
//! and a bias per column, f32 (ONNX `LayerNormalization` over the trailing axes, flattened
//! into `cols`).
//!
//! Per row, every operation rounded to f32 (`.rn`), `c = cols` converted to f32 (round to
//! nearest):
//! 1. `mean = (Σ x_j) / c`;
//! 2. `d_j = x_j − mean`; `var = (Σ d_j · d_j) / c`;
//! 3. `r = rsqrt(var + epsilon)` ([`crate::math::rsqrt`]: `1 / sqrt`, both correctly rounded);
//! 4. `out_j = (d_j · r) · scale_j + bias_j` (a multiply, a multiply, an add).
//!
//! Both sums: partial `t` of 256 adds elements `t, t + 256, ...` in order from `+0`, then the
//! fixed tree `p[t] = p[t] + p[t + s]` for `s = 128, ..., 1`.
//!
//! Parameters `x, scale, bias, out, rows, cols, epsilon`; one block of 256 threads per row
//! (`grid = [rows, 1, 1]`).

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

/// `layernorm[rows]`: the only form.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct LayerNormRows;

impl Kind for LayerNormRows {
    const NAME: &'static str = "layernorm";
    const EXAMPLES: &'static [&'static str] = &["layernorm[rows]"];
    const RANDOM_CASES: u32 = 32;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        match params {
            "rows" => Ok(LayerNormRows),
            _ => Err(JitError::parse(descriptor, "layernorm takes [rows]")),
        }
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("rows")
    }

    fn check(&self, dtype: Dtype) -> Result<(), String> {
        match dtype {
            Dtype::F32 => Ok(()),
            Dtype::I32 => Err("layernorm is only defined for f32".into()),
        }
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("x", ParamKind::Input),
            Param::new("scale", ParamKind::Input),
            Param::new("bias", ParamKind::Input),
            Param::new("out", ParamKind::Output),
            Param::new("rows", ParamKind::U32),
            Param::new("cols", ParamKind::U32),
            Param::new("epsilon", ParamKind::F32),
        ]
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let Shape::Rows { rows, .. } = shape else {
            return None;
        };
        Some([u64::from(*rows).max(1), 1, 1])
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        match sizes {
            &[rows, cols] => Some(Shape::Rows { rows, cols }),
            _ => None,
        }
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        let Shape::Rows { rows, cols } = *shape else {
            return Vec::new();
        };
        let all = product(&[rows, cols]);
        vec![all, Some(u64::from(cols)), Some(u64::from(cols)), all]
    }

    fn shared_ptx(&self, _dtype: Dtype) -> String {
        format!(".shared .align 4 .b32 smem[{BLOCK_1D}];\n\n")
    }

    fn emit(&self, _dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        let mut temps = Temps::new("m");
        let mut body = String::new();
        emit_layernorm(&mut body, ops, &mut temps);
        out.push_str(&temps.declarations());
        out.push_str(&body);
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Shape::Rows { rows, cols }, &[x, scale, bias, out]) = (*shape, buffers) else {
            return Err(JitError::InvalidLaunch(
                "layernorm takes four buffers".into(),
            ));
        };
        let epsilon = args.iter().find_map(|arg| match arg {
            KernelArg::F32(value) => Some(*value),
            _ => None,
        });
        let Some(epsilon) = epsilon else {
            return Err(JitError::InvalidLaunch("layernorm needs epsilon".into()));
        };
        let (rows, cols) = (rows as usize, cols as usize);
        let op = LayerNorm { cols, epsilon };
        Ok(Box::new(RowRun::<T, _>::covering(
            op,
            vec![
                x..x + 4 * rows * cols,
                scale..scale + 4 * cols,
                bias..bias + 4 * cols,
            ],
            out,
            rows.min(config.grid[0] as usize),
            cols,
            cols,
        )))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::Rows {
            rows: dims[0] % 4,
            cols: dims[1] % 600,
        }
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [
            Shape::Rows { rows: 7, cols: 333 },
            Shape::Rows {
                rows: 128,
                cols: 768,
            },
        ]
    }
}

/// The PTX of one row per block (see the module docs).
fn emit_layernorm(out: &mut String, ops: &Ops, temps: &mut Temps) {
    ins!(out, "mov.u32 %r1, %ctaid.x;");
    ins!(out, "cvt.u64.u32 %rd1, %r1; // row");
    ins!(out, "mov.u32 %r2, %tid.x;");
    ins!(out, "cvt.u64.u32 %rd2, %r2;");
    ins!(out, "ld.param.u32 %r3, [p_rows];");
    ins!(out, "cvt.u64.u32 %rd3, %r3;");
    ins!(out, "ld.param.u32 %r4, [p_cols];");
    ins!(out, "cvt.u64.u32 %rd4, %r4;");
    ins!(
        out,
        "setp.ge.u64 %p1, %rd1, %rd3; // guard: row < rows (uniform in the block)"
    );
    ins!(out, "@%p1 bra DONE;");
    ins!(out, "mul.lo.u64 %rd5, %rd1, %rd4;");
    ins!(out, "shl.b64 %rd5, %rd5, 2;");
    global_pointer(out, 10, "x");
    ins!(out, "add.u64 %rd10, %rd10, %rd5; // &x[row][0]");
    global_pointer(out, 11, "out");
    ins!(out, "add.u64 %rd11, %rd11, %rd5; // &out[row][0]");
    global_pointer(out, 14, "scale");
    global_pointer(out, 15, "bias");
    ins!(out, "mov.u32 %r5, smem;");
    ins!(out, "shl.b32 %r6, %r2, 2;");
    ins!(out, "add.u32 %r7, %r5, %r6; // &smem[t]");
    ins!(out, "cvt.rn.f32.u32 %v5, %r4; // c");

    // 1. The mean.
    ins!(out, "mov.b32 %v0, 0;");
    row_loop(out, "SUM", |out| {
        ins!(out, "ld.global.b32 %v1, [%rd12];");
        ins!(out, "{} %v0, %v0, %v1;", ops.add);
    });
    block_tree(out, "SUM", |out| ins!(out, "{} %v1, %v1, %v2;", ops.add));
    ins!(out, "div.rn.f32 %v3, %v1, %v5; // mean");

    // 2. The variance.
    ins!(out, "mov.b32 %v0, 0;");
    row_loop(out, "VAR", |out| {
        ins!(out, "ld.global.b32 %v1, [%rd12];");
        ins!(out, "{} %v1, %v1, %v3;", ops.sub);
        ins!(out, "{} %v1, %v1, %v1;", ops.mul);
        ins!(out, "{} %v0, %v0, %v1;", ops.add);
    });
    block_tree(out, "VAR", |out| ins!(out, "{} %v1, %v1, %v2;", ops.add));
    ins!(out, "div.rn.f32 %v4, %v1, %v5; // var");

    // 3. r = rsqrt(var + epsilon).
    ins!(out, "ld.param.f32 %v6, [p_epsilon];");
    ins!(out, "{} %v4, %v4, %v6;", ops.add);
    math::emit_rsqrt(out, "%v7", "%v4", temps);

    // 4. out = (d * r) * scale + bias.
    row_loop(out, "OUT", |out| {
        ins!(out, "ld.global.b32 %v1, [%rd12];");
        ins!(out, "{} %v1, %v1, %v3;", ops.sub);
        ins!(out, "{} %v1, %v1, %v7;", ops.mul);
        ins!(out, "shl.b64 %rd7, %rd6, 2;");
        ins!(out, "add.u64 %rd8, %rd14, %rd7;");
        ins!(out, "ld.global.b32 %v2, [%rd8];");
        ins!(out, "{} %v1, %v1, %v2;", ops.mul);
        ins!(out, "add.u64 %rd8, %rd15, %rd7;");
        ins!(out, "ld.global.b32 %v2, [%rd8];");
        ins!(out, "{} %v1, %v1, %v2;", ops.add);
        ins!(out, "st.global.b32 [%rd13], %v1;");
    });
}

/// `for j = t; j < cols; j += 256 { body }` with `%rd6` = j and `%rd12` / `%rd13` the
/// addresses of element `j` of the row in `x` / `out`.
fn row_loop(out: &mut String, tag: &str, body: impl FnOnce(&mut String)) {
    ins!(out, "mov.u64 %rd6, %rd2; // j = t");
    ins!(out, "shl.b64 %rd7, %rd2, 2;");
    ins!(out, "add.u64 %rd12, %rd10, %rd7;");
    ins!(out, "add.u64 %rd13, %rd11, %rd7;");
    label!(out, &format!("{tag}_LOOP"));
    ins!(out, "setp.ge.u64 %p2, %rd6, %rd4; // guard: j < cols");
    ins!(out, "@%p2 bra {tag}_END;");
    body(out);
    ins!(out, "add.u64 %rd6, %rd6, {BLOCK_1D};");
    ins!(out, "add.u64 %rd12, %rd12, {};", 4 * BLOCK_1D);
    ins!(out, "add.u64 %rd13, %rd13, {};", 4 * BLOCK_1D);
    ins!(out, "bra {tag}_LOOP;");
    label!(out, &format!("{tag}_END"));
}

/// A row of a layer normalisation.
#[derive(Debug)]
struct LayerNorm {
    cols: usize,
    epsilon: f32,
}

impl<T: Element> RowOp<T> for LayerNorm {
    fn row_work(&self) -> usize {
        8 * self.cols
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
        // One set of partials for every row (each row leaves them at zero).
        let mut partials = [0f32; REDUCE_THREADS];
        let mut block = [0f32; REDUCE_THREADS];
        // The scale and bias, decoded once for every row.
        let mut affine = vec![0f32; 2 * self.cols];
        let (scale, bias) = affine.split_at_mut(self.cols);
        decode_into(&inputs[1][..4 * self.cols], scale);
        decode_into(&inputs[2][..4 * self.cols], bias);
        each_row(rows, (row_len, cols), out, |row, out| {
            with_values(out, |out: &mut [f32]| {
                let scratch = [&mut partials, &mut block];
                self.compute(row, inputs[0], out, scratch, [scale, bias]);
            });
        });
    }
}

impl LayerNorm {
    /// Row `row` into `out`; `partials` are zero and left so.
    fn compute(
        &self,
        row: usize,
        x: &[u8],
        out: &mut [f32],
        [partials, block]: [&mut [f32; REDUCE_THREADS]; 2],
        [scale, bias]: [&[f32]; 2],
    ) {
        let c = self.cols;
        let x = &x[4 * row * c..][..4 * c];
        // x into `out` (aligned there), its sum, then d = x - mean in place and d · d into
        // the partials, element j into partial j % 256.
        decode_into(x, out);
        fold_span(ReduceOp::Sum, partials, out.as_bytes(), block);
        let count = c as f32;
        let mean = finish_row(ReduceOp::Sum, partials, c) / count;
        for d in out.iter_mut() {
            *d -= mean;
        }
        for chunk in out.chunks(REDUCE_THREADS) {
            for (partial, d) in partials.iter_mut().zip(chunk) {
                *partial += d * d;
            }
        }
        let var = finish_row(ReduceOp::Sum, partials, c) / count;
        let r = math::rsqrt(var + self.epsilon);
        for ((y, &s), &b) in out.iter_mut().zip(scale).zip(bias) {
            *y = (*y * r) * s + b;
        }
    }
}
