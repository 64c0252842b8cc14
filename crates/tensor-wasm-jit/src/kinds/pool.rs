//! `maxpool[RxS,sT,pP]` and `avgpool[RxS,sT,pP]`: 2-D pooling over an NCHW input into an
//! `n × c × P × Q` output, with `conv2d`'s window grammar, limits and output size
//! ([`conv2d_output_size`]). f32 and i32.
//!
//! Each output reads the window's taps that fall inside the input, in order of filter rows `r`,
//! then columns `s`; taps in the padding are skipped (neither `-inf` nor zero):
//!
//! - maxpool: `m = lowest; m = (x > m || x is NaN) ? x : m` over the taps, `lowest` being -inf
//!   (i32: `i32::MIN`). A NaN tap makes the result NaN (as numpy's `max` and PyTorch's
//!   `max_pool2d`), whatever its place in the window; ties keep the earlier tap (`-0` before
//!   `+0` stays `-0`).
//! - avgpool: `sum = ((+0 + x_0) + x_1) + ...` (f32 `add.rn`, i32 wrapping), then `sum / count`
//!   with `count` the in-range taps (ONNX `count_include_pad = 0`): f32 `div.rn` by `count`
//!   (exact as an f32), i32 division truncating toward zero.
//!
//! A window without an in-range tap writes `lowest` (maxpool) or `+0` (avgpool, `+0 / 1`). With
//! padding below the filter that happens only for an input without rows or columns.
//!
//! Parameters: `input, output, n, c, h, w`. A row grid ([`RowGrid::Spread`]): grid row `r` is
//! output row `r % P` of plane `r / P` (plane = image · c + channel), one output per thread.

use std::fmt;
use std::ops::Range;

use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use zerocopy::FromBytes;

use super::conv2d::{check_window, conv2d_output_size, parse_window, Conv2dParams};
use super::rows::{each_row, load, spread_prologue, with_values, RowGrid, RowOp, RowRun};
use super::{product, Kind};
use crate::contract::{Param, ParamKind, Shape};
use crate::cpu::{Element, Stage};
use crate::cpu_parts::STREAMED;
use crate::emit::{global_pointer, ins, label, Ops};
use crate::gather::{max_pairs_f32, words, words_mut, Indices};
use crate::{Dtype, JitError};

/// `maxpool[RxS,sT,pP]`: the largest in-range tap of each window (a NaN tap wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct MaxPool(pub Conv2dParams);

/// `avgpool[RxS,sT,pP]`: the mean of each window's in-range taps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct AvgPool(pub Conv2dParams);

/// How a pooling kind folds a window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fold {
    Max,
    Mean,
}

/// What the two pooling kinds differ in; the rest is [`Kind`] for both.
trait Pooling: Copy + fmt::Debug {
    const NAME: &'static str;
    const EXAMPLES: &'static [&'static str];
    const FOLD: Fold;
    fn window(&self) -> Conv2dParams;
    fn of(window: Conv2dParams) -> Self;
}

impl Pooling for MaxPool {
    const NAME: &'static str = "maxpool";
    const EXAMPLES: &'static [&'static str] = &[
        "maxpool[2x2,s2]",
        "maxpool[3x3,s2,p1]",
        "maxpool[3x3,p2]",
        "maxpool[1x1]",
        "maxpool[5x3,s3,p2]",
        "maxpool[7x7,s8,p3]",
    ];
    const FOLD: Fold = Fold::Max;
    fn window(&self) -> Conv2dParams {
        self.0
    }
    fn of(window: Conv2dParams) -> Self {
        MaxPool(window)
    }
}

impl Pooling for AvgPool {
    const NAME: &'static str = "avgpool";
    const EXAMPLES: &'static [&'static str] = &[
        "avgpool[2x2,s2]",
        "avgpool[3x3,s2,p1]",
        "avgpool[3x3,p2]",
        "avgpool[1x1]",
        "avgpool[5x3,s3,p2]",
        "avgpool[7x7,s8,p3]",
    ];
    const FOLD: Fold = Fold::Mean;
    fn window(&self) -> Conv2dParams {
        self.0
    }
    fn of(window: Conv2dParams) -> Self {
        AvgPool(window)
    }
}

/// `n, c, h, w` of a shape with four sizes.
fn dims(shape: &Shape) -> Option<[u32; 4]> {
    match shape {
        Shape::Sizes { .. } => shape.sizes().try_into().ok(),
        _ => None,
    }
}

/// Output rows of the row grid (`n · c · P`, saturating) and their length `Q`.
fn rows(window: &Conv2dParams, [n, c, h, w]: [u32; 4]) -> (u64, u64) {
    let (p, q) = conv2d_output_size(window, h, w);
    let planes = u64::from(n) * u64::from(c);
    (planes.saturating_mul(p), q)
}

impl<P: Pooling> Kind for P {
    const NAME: &'static str = <P as Pooling>::NAME;
    const EXAMPLES: &'static [&'static str] = <P as Pooling>::EXAMPLES;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        parse_window(descriptor, params, <P as Pooling>::NAME).map(P::of)
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.window().write_params(f)
    }

    fn check(&self, _dtype: Dtype) -> Result<(), String> {
        check_window(&self.window(), <P as Pooling>::NAME)
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        vec![
            Param::new("input", ParamKind::Input),
            Param::new("output", ParamKind::Output),
            Param::new("n", ParamKind::U32),
            Param::new("c", ParamKind::U32),
            Param::new("h", ParamKind::U32),
            Param::new("w", ParamKind::U32),
        ]
    }

    fn grid_axes(&self) -> usize {
        RowGrid::Spread.axes()
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let (rows, q) = rows(&self.window(), dims(shape)?);
        Some(RowGrid::Spread.grid(rows, q))
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        (sizes.len() == 4).then(|| Shape::of_sizes(sizes))
    }

    fn buffer_elements(&self, shape: &Shape, _buffers: usize) -> Vec<Option<u64>> {
        let Some([n, c, h, w]) = dims(shape) else {
            return Vec::new();
        };
        let (p, q) = conv2d_output_size(&self.window(), h, w);
        let output = product(&[n, c]).and_then(|nc| nc.checked_mul(p)?.checked_mul(q));
        vec![product(&[n, c, h, w]), output]
    }

    fn emit(&self, dtype: Dtype, _params: &[Param], ops: &Ops, out: &mut String) {
        pool(out, ops, dtype, P::FOLD, self.window());
    }

    fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
        buffers: &[usize],
    ) -> Result<Stage<T>, JitError> {
        let (Some(sizes), &[input, output]) = (dims(shape), buffers) else {
            return Err(JitError::InvalidLaunch(format!(
                "{}: {args:?}",
                <P as Pooling>::NAME
            )));
        };
        let window = self.window();
        let (p, q) = conv2d_output_size(&window, sizes[2], sizes[3]);
        let (rows, _) = rows(&window, sizes);
        // Validation checked both buffers against the memory, so a shape with output
        // elements fits in usize; one without has nothing to compute.
        let rows = if q == 0 { 0 } else { rows as usize };
        let [n, c, h, w] = sizes.map(|size| size as usize);
        let mut op = Window {
            fold: P::FOLD,
            r: window.r as usize,
            s: window.s as usize,
            stride: window.stride as usize,
            pad: window.pad as usize,
            h,
            w,
            p: p as usize,
            q: q as usize,
            taps: None,
        };
        op.taps = op.gather_table(rows / op.p.max(1));
        let x = input..input + 4 * n * c * h * w;
        Ok(Box::new(RowRun::<T, _>::new(
            op,
            RowGrid::Spread,
            config,
            vec![x],
            output,
            rows,
            q as usize,
        )))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        // Rows longer than a block (a second block of the row grid) at times.
        let w = if (250..260).contains(&dims[3]) {
            dims[3] + 8
        } else {
            dims[3] % 12
        };
        Shape::of_sizes(&[dims[0] % 3, dims[1] % 4, dims[2] % 12, w])
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [
            Shape::of_sizes(&[2, 3, 17, 13]),
            Shape::of_sizes(&[4, 16, 64, 300]),
        ]
    }
}

/// One output per thread: `%rd1` the grid row (`plane · P + p`), `%rd2` the column `q`; the
/// taps in order of `r` then `s`, those outside the input skipped.
fn pool(out: &mut String, ops: &Ops, dtype: Dtype, fold: Fold, window: Conv2dParams) {
    let Conv2dParams { r, s, stride, pad } = window;
    for (reg, name) in [(20, "n"), (21, "c"), (6, "h"), (7, "w")] {
        ins!(out, "ld.param.u32 %r4, [p_{name}];");
        ins!(out, "cvt.u64.u32 %rd{reg}, %r4;");
    }
    // P = (h + 2 pad - r) / stride + 1 and Q likewise; no output when the padded input is
    // smaller than the filter.
    for (reg, input, filter) in [(9, 6, r), (4, 7, s)] {
        ins!(out, "add.u64 %rd{reg}, %rd{input}, {};", 2 * pad);
        ins!(out, "setp.lt.u64 %p1, %rd{reg}, {filter};");
        ins!(out, "@%p1 bra DONE;");
        ins!(out, "sub.u64 %rd{reg}, %rd{reg}, {filter};");
        ins!(out, "div.u64 %rd{reg}, %rd{reg}, {stride};");
        ins!(out, "add.u64 %rd{reg}, %rd{reg}, 1;");
    }
    ins!(out, "mul.lo.u64 %rd3, %rd20, %rd21;");
    ins!(out, "mul.lo.u64 %rd3, %rd3, %rd9; // rows: n * c * P");
    spread_prologue(out);
    ins!(out, "div.u64 %rd12, %rd1, %rd9; // plane");
    ins!(out, "mul.lo.u64 %rd13, %rd12, %rd9;");
    ins!(out, "sub.u64 %rd13, %rd1, %rd13; // p");
    global_pointer(out, 14, "input");
    ins!(out, "mul.lo.u64 %rd16, %rd12, %rd6;");
    ins!(out, "mul.lo.u64 %rd16, %rd16, %rd7;");
    ins!(out, "shl.b64 %rd16, %rd16, 2;");
    ins!(out, "add.u64 %rd14, %rd14, %rd16; // &input[plane][0][0]");
    ins!(out, "mul.lo.u64 %rd18, %rd13, {stride}; // p * stride");
    ins!(out, "mul.lo.u64 %rd19, %rd2, {stride}; // q * stride");
    match (fold, dtype) {
        (Fold::Max, Dtype::F32) => ins!(out, "mov.f32 %v0, 0fFF800000; // -inf"),
        (Fold::Max, Dtype::I32) => ins!(out, "mov.b32 %v0, -2147483648;"),
        (Fold::Mean, _) => ins!(out, "mov.b32 %v0, 0;"),
    }
    ins!(out, "mov.u32 %r8, 0; // in-range taps");
    ins!(out, "mov.u32 %r6, 0; // r");
    label!(out, "FILTER_ROW");
    ins!(out, "setp.ge.u32 %p3, %r6, {r};");
    ins!(out, "@%p3 bra FILTER_ROW_END;");
    ins!(out, "cvt.u64.u32 %rd23, %r6;");
    ins!(out, "add.u64 %rd23, %rd23, %rd18;");
    ins!(out, "setp.lt.u64 %p4, %rd23, {pad}; // guard: ih >= 0");
    ins!(out, "@%p4 bra FILTER_ROW_NEXT;");
    ins!(out, "sub.u64 %rd23, %rd23, {pad}; // ih");
    ins!(out, "setp.ge.u64 %p4, %rd23, %rd6; // guard: ih < h");
    ins!(out, "@%p4 bra FILTER_ROW_NEXT;");
    ins!(out, "mul.lo.u64 %rd24, %rd23, %rd7;");
    ins!(out, "shl.b64 %rd24, %rd24, 2;");
    ins!(out, "add.u64 %rd24, %rd24, %rd14; // &input[plane][ih][0]");
    ins!(out, "mov.u32 %r7, 0; // s");
    label!(out, "FILTER_COL");
    ins!(out, "setp.ge.u32 %p5, %r7, {s};");
    ins!(out, "@%p5 bra FILTER_ROW_NEXT;");
    ins!(out, "cvt.u64.u32 %rd25, %r7;");
    ins!(out, "add.u64 %rd25, %rd25, %rd19;");
    ins!(out, "setp.lt.u64 %p6, %rd25, {pad}; // guard: iw >= 0");
    ins!(out, "@%p6 bra FILTER_COL_NEXT;");
    ins!(out, "sub.u64 %rd25, %rd25, {pad}; // iw");
    ins!(out, "setp.ge.u64 %p6, %rd25, %rd7; // guard: iw < w");
    ins!(out, "@%p6 bra FILTER_COL_NEXT;");
    ins!(out, "shl.b64 %rd25, %rd25, 2;");
    ins!(out, "add.u64 %rd25, %rd25, %rd24;");
    ins!(out, "ld.global.b32 %v1, [%rd25];");
    match (fold, dtype) {
        (Fold::Max, Dtype::F32) => {
            ins!(out, "setp.gt.f32 %p7, %v1, %v0;");
            ins!(
                out,
                "setp.nan.or.f32 %p7, %v1, %v1, %p7; // a NaN tap is taken"
            );
            ins!(out, "selp.b32 %v0, %v1, %v0, %p7;");
        }
        (Fold::Max, Dtype::I32) => {
            ins!(out, "setp.gt.s32 %p7, %v1, %v0;");
            ins!(out, "selp.b32 %v0, %v1, %v0, %p7;");
        }
        (Fold::Mean, _) => {
            ins!(out, "{} %v0, %v0, %v1;", ops.add);
            ins!(out, "add.u32 %r8, %r8, 1;");
        }
    }
    label!(out, "FILTER_COL_NEXT");
    ins!(out, "add.u32 %r7, %r7, 1;");
    ins!(out, "bra FILTER_COL;");
    label!(out, "FILTER_ROW_NEXT");
    ins!(out, "add.u32 %r6, %r6, 1;");
    ins!(out, "bra FILTER_ROW;");
    label!(out, "FILTER_ROW_END");
    if fold == Fold::Mean {
        ins!(out, "max.u32 %r8, %r8, 1; // no tap: +0 / 1");
        match dtype {
            Dtype::F32 => {
                ins!(out, "cvt.rn.f32.u32 %v2, %r8;");
                ins!(out, "div.rn.f32 %v0, %v0, %v2;");
            }
            Dtype::I32 => ins!(out, "div.s32 %v0, %v0, %r8;"),
        }
    }
    global_pointer(out, 26, "output");
    ins!(
        out,
        "mad.lo.u64 %rd27, %rd1, %rd4, %rd2; // output[plane][p][q]"
    );
    ins!(out, "shl.b64 %rd27, %rd27, 2;");
    ins!(out, "add.u64 %rd27, %rd27, %rd26;");
    ins!(out, "st.global.b32 [%rd27], %v0;");
}

/// Whether `x` is a NaN (never for an integer).
#[inline(always)]
fn is_nan<T: PartialOrd>(x: &T) -> bool {
    x.partial_cmp(x).is_none()
}

/// Maximum pooling's step: `x` when it is larger than `m` or a NaN, else `m` (a select, not a
/// branch: which tap wins is data-dependent).
#[inline(always)]
fn select<T: PartialOrd + Copy>(m: T, x: T) -> T {
    if (x > m) | is_nan(&x) {
        x
    } else {
        m
    }
}

/// The rows of a pooling launch: output row `p` of a plane per grid row.
#[derive(Debug)]
struct Window {
    fold: Fold,
    r: usize,
    s: usize,
    stride: usize,
    pad: usize,
    h: usize,
    w: usize,
    /// Output rows and columns of a plane.
    p: usize,
    q: usize,
    /// Maximum pooling without padding over small planes, for `planes` planes at a time:
    /// entry `((r·S + s) · planes + b) · p·q + f`, where output pixel `f` of plane `b` of a
    /// run reads tap `(r, s)`, counted from the run's first input plane.
    taps: Option<(Indices, usize)>,
}

/// Most entries of a [`Window`]'s table of taps (built for every launch).
const MAX_TAP_TABLE: usize = 1 << 12;

impl Window {
    /// The output columns `j` below `cols` whose tap `s` lies inside a row: `j · stride + s −
    /// pad` in `0..w`.
    fn columns(&self, s: usize, cols: usize) -> std::ops::Range<usize> {
        let first = self.pad.saturating_sub(s).div_ceil(self.stride);
        let end = (self.w + self.pad)
            .saturating_sub(s)
            .div_ceil(self.stride)
            .min(cols);
        first..end.max(first)
    }

    /// Whether the windows are 2×2 at stride 2 and tile each plane exactly (no padding):
    /// [`Window::max_pairs`].
    fn pairs(&self) -> bool {
        (self.r, self.s, self.stride, self.pad) == (2, 2, 2, 0)
            && (self.h, self.w) == (2 * self.p, 2 * self.q)
    }

    /// In-range taps of a row of the window over output column `j`.
    fn taps_across(&self, j: usize) -> usize {
        let at = j * self.stride;
        let first = self.pad.saturating_sub(at);
        let end = self.s.min((self.w + self.pad).saturating_sub(at));
        end.saturating_sub(first)
    }
}

impl<T: Element> RowOp<T> for Window {
    fn row_work(&self) -> usize {
        STREAMED * self.q * self.r * self.s
    }

    fn row(&self, row: usize, inputs: &[&[u8]], out: &mut [u8]) {
        with_values(out, |out: &mut [T]| self.compute(row, inputs, out));
    }

    fn rows(
        &self,
        rows: Range<usize>,
        (row_len, cols): (usize, usize),
        inputs: &[&[u8]],
        out: &mut [u8],
    ) {
        let whole = self.fold == Fold::Max && self.pad == 0 && cols == self.q && cols == row_len;
        // Whole rows (`cols == row_len`): the part's output holds every row in full.
        let end = if whole { 4 * rows.len() * row_len } else { 0 };
        let x = <[T]>::ref_from_bytes(inputs[0]).ok();
        match (x, <[T]>::mut_from_bytes(&mut out[..end])) {
            (Some(x), Ok(out)) if whole => self.max_unpadded(rows, x, out),
            _ => each_row(rows, (row_len, cols), out, |row, out| {
                RowOp::<T>::row(self, row, inputs, out);
            }),
        }
    }
}

impl Window {
    /// The table of taps, for maximum pooling without padding over planes small enough.
    fn gather_table(&self, planes: usize) -> Option<(Indices, usize)> {
        let (pq, taps) = (self.p * self.q, self.r * self.s);
        if self.fold != Fold::Max || self.pad != 0 || pq * taps > MAX_TAP_TABLE || self.pairs() {
            return None;
        }
        let planes = (MAX_TAP_TABLE / (pq * taps).max(1)).clamp(1, planes.max(1));
        let plane_in = self.h * self.w;
        let mut table = Vec::with_capacity(planes * pq * taps);
        for r in 0..self.r {
            for s in 0..self.s {
                for b in 0..planes {
                    for p in 0..self.p {
                        let row = b * plane_in + (p * self.stride + r) * self.w + s;
                        table.extend((0..self.q).map(|q| (row + q * self.stride) as u32));
                    }
                }
            }
        }
        Some((Indices::new(table), planes))
    }

    /// [`Window::max_unpadded`] with the table of taps: plane by plane, each tap of every
    /// pixel gathered at once, then the same select over whole vectors.
    fn max_gathered<T: Element>(
        &self,
        (table, planes): (&Indices, usize),
        rows: Range<usize>,
        x: &[T],
        out: &mut [T],
    ) {
        let (plane_in, pq) = (self.h * self.w, self.p * self.q);
        let mut tap = vec![T::ZERO; planes * pq];
        let (mut row, mut at) = (rows.start, 0);
        while row < rows.end {
            // A run: the rest of one plane, or up to `planes` whole planes.
            let (plane, p) = (row / self.p, row % self.p);
            let count = if p > 0 || rows.end - row < self.p {
                (self.p - p).min(rows.end - row)
            } else {
                (rows.end - row) / self.p * self.p
            }
            .min(planes * self.p);
            let n = count * self.q;
            let values = words(&x[plane * plane_in..]);
            let out = &mut out[at..at + n];
            out.fill(T::LOWEST);
            for k in 0..self.r * self.s {
                table.gather(
                    values,
                    k * planes * pq + p * self.q,
                    words_mut(&mut tap[..n]),
                );
                for (value, &x) in out.iter_mut().zip(&tap[..n]) {
                    let m = *value;
                    *value = select(m, x);
                }
            }
            (row, at) = (row + count, at + n);
        }
    }

    /// [`Window::max_unpadded`] of 2×2 windows at stride 2 that tile each plane (`h = 2p`,
    /// `w = 2q`): output row `R` (planes one after another) reads input rows `2R` and `2R + 1`.
    /// Each pair of columns of every input row is folded first, over the part's whole input
    /// at once (a loop the compiler vectorises), then the two rows' folds. The select is
    /// associative — `sel(sel(a, b), c) = sel(a, sel(b, c))`: with no NaN it keeps the first
    /// of the largest, else the last NaN — and `sel(m, LOWEST) = m`, so this is the taps'
    /// fold in order of r, s, bit for bit.
    fn max_pairs<T: Element>(&self, rows: Range<usize>, x: &[T], out: &mut [T]) {
        let (w, q) = (self.w, self.q);
        let x = &x[2 * rows.start * w..2 * rows.end * w];
        let out = &mut out[..rows.len() * q];
        let done = T::f32s(x, out).map_or(0, |(x, out)| max_pairs_f32(x, q, out));
        let (x, out) = (&x[4 * done..], &mut out[done..]);
        let mut folded = vec![T::LOWEST; x.len() / 2];
        for (m, pair) in folded.iter_mut().zip(x.chunks_exact(2)) {
            *m = select(select(T::LOWEST, pair[0]), pair[1]);
        }
        for (out, rows) in out.chunks_exact_mut(q).zip(folded.chunks_exact(2 * q)) {
            let (top, bottom) = rows.split_at(q);
            // Four at a time (one vector), then the rest: rows are short.
            let whole = q / 4 * 4;
            let fours = out[..whole].chunks_exact_mut(4).zip(top.chunks_exact(4));
            for ((out, top), bottom) in fours.zip(bottom.chunks_exact(4)) {
                for ((value, &top), &bottom) in out.iter_mut().zip(top).zip(bottom) {
                    *value = select(top, bottom);
                }
            }
            let rest = out[whole..].iter_mut().zip(&top[whole..]);
            for ((value, &top), &bottom) in rest.zip(&bottom[whole..]) {
                *value = select(top, bottom);
            }
        }
    }

    /// Maximum pooling without padding (every tap in range), output rows `rows` into `out`
    /// (`q` values a row): each output still takes its taps in order of r, s, by the same
    /// select as [`Window::compute`].
    fn max_unpadded<T: Element>(&self, rows: Range<usize>, x: &[T], out: &mut [T]) {
        if self.pairs() {
            return self.max_pairs(rows, x, out);
        }
        if let Some((table, planes)) = &self.taps {
            return self.max_gathered((table, *planes), rows, x, out);
        }
        let (plane_in, q) = (self.h * self.w, self.q);
        let (mut plane, mut p) = (rows.start / self.p, rows.start % self.p);
        for out in out.chunks_exact_mut(q).take(rows.len()) {
            out.fill(T::LOWEST);
            for r in 0..self.r {
                let line = &x[plane * plane_in + (p * self.stride + r) * self.w..][..self.w];
                for s in 0..self.s {
                    for (j, value) in out.iter_mut().enumerate() {
                        let (m, x) = (*value, line[j * self.stride + s]);
                        *value = select(m, x);
                    }
                }
            }
            p += 1;
            if p == self.p {
                (plane, p) = (plane + 1, 0);
            }
        }
    }
}

impl Window {
    /// Row `row` of the output (`out.len()` of its elements).
    fn compute<T: Element>(&self, row: usize, inputs: &[&[u8]], out: &mut [T]) {
        let (plane, p) = (row / self.p, row % self.p);
        let x = &inputs[0][4 * plane * self.h * self.w..];
        out.fill(match self.fold {
            Fold::Max => T::LOWEST,
            Fold::Mean => T::ZERO,
        });
        // Tap by tap over the whole row: each output still takes its taps in order of r, s.
        let mut rows_in = 0;
        for r in 0..self.r {
            let Some(ih) = (p * self.stride + r).checked_sub(self.pad) else {
                continue;
            };
            if ih >= self.h {
                continue;
            }
            rows_in += 1;
            let line = &x[4 * ih * self.w..4 * (ih + 1) * self.w];
            for s in 0..self.s {
                let columns = self.columns(s, out.len());
                let first = columns.start * self.stride + s - self.pad;
                let outputs = out[columns].iter_mut();
                let taps = (first..).step_by(self.stride);
                match self.fold {
                    Fold::Max => {
                        // A select, not a branch: which tap wins is data-dependent.
                        for (value, iw) in outputs.zip(taps) {
                            let (m, x): (T, T) = (*value, load(line, iw));
                            *value = select(m, x);
                        }
                    }
                    Fold::Mean => {
                        for (value, iw) in outputs.zip(taps) {
                            *value = value.add(load(line, iw));
                        }
                    }
                }
            }
        }
        if self.fold == Fold::Mean {
            for (j, value) in out.iter_mut().enumerate() {
                let count = (rows_in * self.taps_across(j)).max(1);
                *value = value.mean(count as u32);
            }
        }
    }
}

#[cfg(test)]
#[path = "pool_tests.rs"]
mod tests;
