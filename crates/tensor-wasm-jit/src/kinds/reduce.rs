//! `reduce[OP]`: one output per row of a rows × cols row-major matrix; block `b` reduces row
//! `b` by a fixed tree.

use std::fmt;
use std::ops::Range;

use tensor_wasm_gpu::gemm::encode_into;
use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError, KernelArg, LaunchConfig};

use super::{product, Kind, KindRun};
use crate::contract::{Param, ParamKind, Shape, BLOCK_1D};
use crate::cpu::{
    finish_row, fold_span, reduce_identity, write, Element, Stage, BLOCK, REDUCE_SPAN,
    REDUCE_THREADS, STEP_WORK,
};
use crate::cpu_parts::{disjoint, internal, split};
use crate::emit::{global_pointer, ins, label, Ops};
use crate::{Dtype, JitError};

/// The combining operation of a reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReduceOp {
    /// `acc + x`, starting from `+0`.
    Sum,
    /// `x > acc ? x : acc`, starting from `-inf` (f32) or `i32::MIN`; NaNs are skipped.
    Max,
}

impl ReduceOp {
    /// The descriptor spelling: `sum` or `max`.
    pub fn as_str(&self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Max => "max",
        }
    }
}

impl Kind for ReduceOp {
    const NAME: &'static str = "reduce";
    const EXAMPLES: &'static [&'static str] = &["reduce[sum]", "reduce[max]"];
    const RANDOM_CASES: u32 = 24;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        match params {
            "sum" => Ok(ReduceOp::Sum),
            "max" => Ok(ReduceOp::Max),
            _ => Err(JitError::parse(descriptor, "reduce takes sum or max")),
        }
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("x", ParamKind::Input),
            Param::new("out", ParamKind::Output),
            Param::new("rows", ParamKind::U32),
            Param::new("cols", ParamKind::U32),
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
        match *shape {
            Shape::Rows { rows, cols } => vec![product(&[rows, cols]), Some(u64::from(rows))],
            _ => Vec::new(),
        }
    }

    fn shared_ptx(&self, _dtype: Dtype) -> String {
        format!(".shared .align 4 .b32 smem[{BLOCK_1D}];\n\n")
    }

    fn emit(&self, dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        reduce(out, ops, *self, dtype);
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        _args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Shape::Rows { rows, cols }, &[x, out]) = (shape, buffers) else {
            return Err(JitError::InvalidLaunch("reduce takes two buffers".into()));
        };
        Ok(Box::new(ReduceRun {
            op: *self,
            x,
            out,
            rows: (*rows).min(config.grid[0]) as usize,
            cols: *cols as usize,
            row: 0,
            col: 0,
            partials: vec![reduce_identity(*self); REDUCE_THREADS],
        }))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::Rows {
            rows: dims[0] % 4,
            cols: dims[1],
        }
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [
            Shape::Rows { rows: 7, cols: 333 },
            Shape::Rows {
                rows: 64,
                cols: 4099,
            },
        ]
    }
}

/// `dst = combine(acc, x)`: `acc + x`, or `x > acc ? x : acc`.
fn combine(out: &mut String, ops: &Ops, op: ReduceOp, dst: &str, acc: &str, x: &str) {
    match op {
        ReduceOp::Sum => ins!(out, "{} {dst}, {acc}, {x};", ops.add),
        ReduceOp::Max => {
            ins!(out, "setp.gt.{} %p5, {x}, {acc};", ops.cmp);
            ins!(out, "selp.b32 {dst}, {x}, {acc}, %p5;");
        }
    }
}

/// Block `row` reduces row `row`: thread `t` folds `x[row][t + 256 j]` for j = 0, 1, ... in
/// order, then the 256 partials are combined by a fixed tree in shared memory.
fn reduce(out: &mut String, ops: &Ops, op: ReduceOp, dtype: Dtype) {
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
    global_pointer(out, 10, "x");
    ins!(out, "mul.lo.u64 %rd5, %rd1, %rd4;");
    ins!(out, "shl.b64 %rd5, %rd5, 2;");
    ins!(out, "add.u64 %rd10, %rd10, %rd5; // &x[row][0]");
    match (op, dtype) {
        (ReduceOp::Sum, _) => ins!(out, "mov.b32 %v0, 0;"),
        (ReduceOp::Max, Dtype::F32) => ins!(out, "mov.f32 %v0, 0fFF800000; // -inf"),
        (ReduceOp::Max, Dtype::I32) => ins!(out, "mov.b32 %v0, -2147483648;"),
    }
    ins!(out, "mov.u64 %rd6, %rd2; // j = t");
    label!(out, "STRIDED");
    ins!(out, "setp.ge.u64 %p2, %rd6, %rd4; // guard: j < cols");
    ins!(out, "@%p2 bra STRIDED_END;");
    ins!(out, "shl.b64 %rd7, %rd6, 2;");
    ins!(out, "add.u64 %rd8, %rd10, %rd7;");
    ins!(out, "ld.global.b32 %v1, [%rd8];");
    combine(out, ops, op, "%v0", "%v0", "%v1");
    ins!(out, "add.u64 %rd6, %rd6, {BLOCK_1D};");
    ins!(out, "bra STRIDED;");
    label!(out, "STRIDED_END");
    ins!(out, "mov.u32 %r5, smem;");
    ins!(out, "shl.b32 %r6, %r2, 2;");
    ins!(out, "add.u32 %r7, %r5, %r6; // &smem[t]");
    ins!(out, "st.shared.b32 [%r7], %v0;");
    ins!(out, "bar.sync 0;");
    let mut stride = BLOCK_1D / 2;
    while stride > 0 {
        ins!(out, "setp.ge.u32 %p3, %r2, {stride};");
        ins!(out, "@%p3 bra TREE_{stride};");
        ins!(out, "ld.shared.b32 %v1, [%r7];");
        ins!(out, "ld.shared.b32 %v2, [%r7+{}];", stride * 4);
        combine(out, ops, op, "%v1", "%v1", "%v2");
        ins!(out, "st.shared.b32 [%r7], %v1;");
        label!(out, &format!("TREE_{stride}"));
        ins!(out, "bar.sync 0;");
        stride /= 2;
    }
    ins!(out, "setp.ne.u32 %p4, %r2, 0;");
    ins!(out, "@%p4 bra DONE;");
    ins!(out, "ld.shared.b32 %v1, [%r5];");
    global_pointer(out, 11, "out");
    ins!(out, "shl.b64 %rd9, %rd1, 2;");
    ins!(out, "add.u64 %rd11, %rd11, %rd9;");
    ins!(out, "st.global.b32 [%rd11], %v1;");
}

/// Rows `row..rows` are left; the current row is folded up to column `col`.
#[derive(Debug)]
pub(crate) struct ReduceRun<T> {
    op: ReduceOp,
    x: usize,
    out: usize,
    rows: usize,
    cols: usize,
    row: usize,
    col: usize,
    partials: Vec<T>,
}

impl<T: Element + Send> KindRun<T> for ReduceRun<T> {
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        let Self {
            op,
            x,
            out,
            rows,
            cols,
            row,
            col,
            partials,
        } = self;
        {
            let mut spent = 0;
            let mut values = [T::ZERO; BLOCK];
            while *row < *rows && spent < work {
                let start = *x + 4 * (*row * *cols + *col);
                let span = (*cols).min(*col + REDUCE_SPAN) - *col;
                fold_span(*op, partials, &memory[start..start + 4 * span], &mut values);
                spent += span;
                *col += span;
                if *col == *cols {
                    let result = finish_row(*op, partials, *cols);
                    write(memory, *out, *row, &[result]);
                    *row += 1;
                    *col = 0;
                    spent += REDUCE_THREADS;
                }
            }
            *row >= *rows
        }
    }

    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts> {
        let boxed = |part: Box<dyn CpuPart>| part;
        let Self {
            op,
            x,
            out,
            rows,
            cols,
            partials,
            ..
        } = *self;
        disjoint(CpuParts {
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
        })
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
                let result = finish_row(self.op, &mut self.partials, self.cols);
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
