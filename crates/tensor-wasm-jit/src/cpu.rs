//! The CPU implementation of every blueprint, computing exactly what the emitted PTX computes.
//!
//! Buffers are read and written as little-endian 32-bit values at byte offsets of guest memory.
//! Only the indices the launch grid covers are computed; every other output byte is left as it
//! was. The per-element order of operations is the GPU's (see each function), so f32 results
//! are bit-identical except for the payload of NaNs, which the hardware canonicalises.

use std::ops::Range;

use tensor_wasm_gpu::gemm::{decode_into, encode_into, Lane};
use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::contract::BLOCK_1D;
use crate::cpu_parts::{conv_pixel, Conv};
use crate::kinds::{with_kind, Kind, KindRun};
use crate::{Blueprint, Dtype, ElementwiseOp, JitError, ReduceOp, Shape};

/// A 32-bit element type with the GPU's arithmetic, viewable in place in guest memory (on a
/// little-endian host, at a 4-byte-aligned address).
/// Addition, multiplication and the byte order come from [`Lane`], shared with the GEMM.
pub(crate) trait Element:
    Lane + PartialOrd + FromBytes + IntoBytes + Immutable + KnownLayout
{
    /// Identity of `max`: -inf or `i32::MIN`.
    const LOWEST: Self;
    fn from_arg(arg: &KernelArg) -> Option<Self>;
    fn sub(self, other: Self) -> Self;
    /// `self * b + c`, fused for f32.
    fn fma(self, b: Self, c: Self) -> Self;
    /// `self / other`; `None` where the GPU has no defined result (integers).
    fn div(self, other: Self) -> Option<Self>;
    /// Neither infinite nor NaN (every integer).
    fn is_finite(self) -> bool;
    /// `self / count`, the mean of values summing to `self` (`count` at least 1 and below
    /// 2^24): f32 divides by `count` converted exactly (`div.rn`), i32 truncates toward zero.
    fn mean(self, count: u32) -> Self;
    /// `f(y, x)` for f32; nothing for i32 (the f32-only functions are refused for it first).
    fn map_f32(f: fn(&mut [f32], &[f32]), y: &mut [Self], x: &[Self]);
    /// `y[i] = a[i].fma(b[i], c[i])`.
    fn fma_into(y: &mut [Self], a: &[Self], b: &[Self], c: &[Self]) {
        for (((y, &a), &b), &c) in y.iter_mut().zip(a).zip(b).zip(c) {
            *y = a.fma(b, c);
        }
    }
}

impl Element for f32 {
    const LOWEST: Self = f32::NEG_INFINITY;
    fn from_arg(arg: &KernelArg) -> Option<Self> {
        match arg {
            KernelArg::F32(value) => Some(*value),
            _ => None,
        }
    }
    fn sub(self, other: Self) -> Self {
        self - other
    }
    fn fma(self, b: Self, c: Self) -> Self {
        self.mul_add(b, c)
    }
    fn fma_into(y: &mut [Self], a: &[Self], b: &[Self], c: &[Self]) {
        crate::fma::fma_f32(y, a, b, c);
    }
    fn div(self, other: Self) -> Option<Self> {
        Some(self / other)
    }
    fn is_finite(self) -> bool {
        f32::is_finite(self)
    }
    fn mean(self, count: u32) -> Self {
        self / count as f32
    }
    fn map_f32(f: fn(&mut [f32], &[f32]), y: &mut [Self], x: &[Self]) {
        f(y, x);
    }
}

impl Element for i32 {
    const LOWEST: Self = i32::MIN;
    fn from_arg(arg: &KernelArg) -> Option<Self> {
        match arg {
            KernelArg::I32(value) => Some(*value),
            _ => None,
        }
    }
    fn sub(self, other: Self) -> Self {
        self.wrapping_sub(other)
    }
    fn fma(self, b: Self, c: Self) -> Self {
        self.wrapping_mul(b).wrapping_add(c)
    }
    fn div(self, _other: Self) -> Option<Self> {
        None
    }
    fn is_finite(self) -> bool {
        true
    }
    fn mean(self, count: u32) -> Self {
        self.wrapping_div(count as i32)
    }
    fn map_f32(_f: fn(&mut [f32], &[f32]), _y: &mut [Self], _x: &[Self]) {}
}

/// `a > b ? a : b`, the GPU's `setp.gt` + `selp`.
fn max<T: Element>(a: T, b: T) -> T {
    if a > b {
        a
    } else {
        b
    }
}

/// `a < b ? a : b`.
fn min<T: Element>(a: T, b: T) -> T {
    if a < b {
        a
    } else {
        b
    }
}

/// Writes `values` as elements `first..` of the buffer at byte `offset`.
fn write<T: Element>(memory: &mut [u8], offset: usize, first: usize, values: &[T]) {
    let start = offset + 4 * first;
    encode_into(values, &mut memory[start..start + 4 * values.len()]);
}

/// Elements a one-dimensional launch covers: `min(n, grid.x * 256 * per_thread)`.
pub(crate) fn covered(config: &LaunchConfig, per_thread: u64, n: u64) -> usize {
    let threads = u64::from(config.grid[0]) * u64::from(BLOCK_1D);
    threads.saturating_mul(per_thread).min(n) as usize
}

/// Work one step computes: multiply-adds for matmul and conv2d, elements for the rest. About
/// 0.1 ms on one core of an optimised build (a few ms unoptimised); the CPU backend checks for
/// cancellation and lets other tenants' work run between steps.
pub(crate) const STEP_WORK: usize = 1 << 18;

/// Matmul: output rows summed together, sharing each row of b while it is in L1.
const MATMUL_ROWS: usize = 4;

impl Blueprint {
    /// Runs the kernel on the CPU over guest `memory`, after [`Blueprint::validate_launch`]:
    /// every step of [`Blueprint::cpu_run`], one after another.
    ///
    /// Exactness per blueprint (f32 results are bit-identical to the GPU's except NaN payloads):
    /// - element-wise and vector_add: one IEEE operation per element (`fma` fused, everything
    ///   else separately rounded), i32 wrapping;
    /// - reduce: the GPU algorithm — in each row, thread `t` of 256 folds elements
    ///   `t, t+256, t+512, ...` in order into its partial; then partials are combined by a fixed
    ///   tree (`p[t] = op(p[t], p[t+s])` for `s = 128, 64, ..., 1`);
    /// - matmul: `c[i][j] = ((0 + a[i][0]·b[0][j]) + a[i][1]·b[1][j]) + ...` in order of `p`,
    ///   each product and sum rounded separately (tiling does not change the order);
    /// - conv2d: the same accumulation over channels `c`, then filter rows `r`, then columns
    ///   `s`; taps that fall in the zero padding are skipped, not added as zero products.
    ///
    /// # Errors
    /// Whatever `validate_launch` reports; nothing is written then.
    pub fn run_cpu(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory: &mut [u8],
    ) -> Result<(), JitError> {
        let mut run = self.cpu_run(config, args, memory.len())?;
        while !run.step(memory)? {}
        Ok(())
    }

    /// Plans the CPU run of a launch over `memory_len` bytes of guest memory, after
    /// [`Blueprint::validate_launch`]; [`CpuRun::step`] then computes it in bounded steps.
    ///
    /// # Errors
    /// Whatever `validate_launch` reports, or an element-wise operation the dtype lacks.
    pub fn cpu_run(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        memory_len: usize,
    ) -> Result<CpuRun, JitError> {
        self.validate_launch(config, args, memory_len)?;
        let shape = self.launch_shape(args)?;
        let typed = match self.dtype() {
            Dtype::F32 => Typed::F32(self.plan::<f32>(config, args, &shape)?),
            Dtype::I32 => Typed::I32(self.plan::<i32>(config, args, &shape)?),
        };
        Ok(CpuRun {
            typed,
            memory_len,
            step_work: STEP_WORK,
        })
    }

    pub(crate) fn plan<T: Element>(
        &self,
        config: &LaunchConfig,
        args: &[KernelArg],
        shape: &Shape,
    ) -> Result<Stage<T>, JitError> {
        // Validation checked every offset against the memory length, so they fit in usize.
        let buffers: Vec<usize> = args
            .iter()
            .filter_map(|arg| match arg {
                KernelArg::Buffer { offset, .. } => Some(*offset as usize),
                _ => None,
            })
            .collect();
        with_kind!(self.kind(), |k| k.plan::<T>(config, args, shape, &buffers))
    }
}

/// A validated launch of a blueprint on the CPU, computed in bounded steps
/// ([`Blueprint::cpu_run`]).
///
/// Each [`CpuRun::step`] computes about the same amount of work (a fraction of a millisecond
/// on an optimised build) and remembers where to resume, so a caller can stop between steps
/// (a cancelled launch) or run other work in between (fairness). Steps go in the order of one
/// uninterrupted run, so the result never depends on where a run was paused — aliased buffers
/// included — and [`Blueprint::run_cpu`] is exactly all steps in a row.
#[derive(Debug)]
pub struct CpuRun {
    typed: Typed,
    memory_len: usize,
    step_work: usize,
}

#[derive(Debug)]
enum Typed {
    F32(Stage<f32>),
    I32(Stage<i32>),
}

/// Where a launch is, with what it must carry between steps.
#[derive(Debug)]
pub(crate) enum Stage<T> {
    /// Elements `next..count` are left; buffers are the inputs then the output.
    Elementwise {
        op: ElementwiseOp,
        alpha: Option<T>,
        inputs: Vec<usize>,
        out: usize,
        count: usize,
        next: usize,
    },
    /// Rows `row..rows` are left; the current row is folded up to column `col`.
    Reduce {
        op: ReduceOp,
        x: usize,
        out: usize,
        rows: usize,
        cols: usize,
        row: usize,
        col: usize,
        partials: Vec<T>,
    },
    /// Output rows `i..rows` are left; rows `i..i + MATMUL_ROWS` are summed up to `p` in
    /// `acc` (row by row, `cols` each). `b_values` is b, decoded at the first step.
    Matmul {
        a: usize,
        b: usize,
        c: usize,
        n: usize,
        k: usize,
        rows: usize,
        cols: usize,
        i: usize,
        p: usize,
        b_values: Vec<T>,
        acc: Vec<T>,
    },
    /// A kind's own run (`crate::kinds::KindRun`).
    Kind(Box<dyn KindRun<T>>),
    /// The next output is pixel `at[0]` of channel `at[1]` of image `at[2]`.
    Conv {
        conv: Conv,
        buffers: [usize; 3],
        pixels: usize,
        channels: usize,
        images: usize,
        at: [usize; 3],
    },
}

impl CpuRun {
    /// Computes the next step over `memory`, the guest memory the run was planned for;
    /// `Ok(true)` once the whole launch is computed (further calls do nothing).
    ///
    /// # Errors
    /// `InvalidLaunch` when `memory` is not as long as the memory the launch was validated
    /// against; nothing is written then.
    pub fn step(&mut self, memory: &mut [u8]) -> Result<bool, JitError> {
        if memory.len() != self.memory_len {
            return Err(JitError::InvalidLaunch(format!(
                "the launch was validated for {} bytes of memory, not {}",
                self.memory_len,
                memory.len()
            )));
        }
        Ok(match &mut self.typed {
            Typed::F32(stage) => stage.step(memory, self.step_work),
            Typed::I32(stage) => stage.step(memory, self.step_work),
        })
    }

    /// The same run with steps of about `work` operations (tests: slicing never changes a
    /// result).
    #[cfg(test)]
    pub(crate) fn with_step_work(mut self, work: usize) -> Self {
        self.step_work = work.max(1);
        self
    }
}

/// Element `index` of the buffer at byte `offset`.
fn load<T: Element>(memory: &[u8], offset: usize, index: usize) -> T {
    let at = offset + 4 * index;
    T::from_le([memory[at], memory[at + 1], memory[at + 2], memory[at + 3]])
}

impl<T: Element> Stage<T> {
    /// Computes about `work` operations; `true` once everything is computed.
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        match self {
            Stage::Kind(run) => run.step(memory, work),
            Stage::Elementwise {
                op,
                alpha,
                inputs,
                out,
                count,
                next,
            } => {
                let range = *next..(*count).min(next.saturating_add(work));
                elementwise::<T>(*op, *alpha, inputs, *out, range.clone(), memory);
                *next = range.end;
                *next >= *count
            }
            Stage::Reduce {
                op,
                x,
                out,
                rows,
                cols,
                row,
                col,
                partials,
            } => {
                let mut spent = 0;
                let mut values = [T::ZERO; BLOCK];
                while *row < *rows && spent < work {
                    let start = *x + 4 * (*row * *cols + *col);
                    let span = (*cols).min(*col + REDUCE_SPAN) - *col;
                    fold_span(*op, partials, &memory[start..start + 4 * span], &mut values);
                    spent += span;
                    *col += span;
                    if *col == *cols {
                        let result = finish_row(*op, partials);
                        write(memory, *out, *row, &[result]);
                        *row += 1;
                        *col = 0;
                        spent += REDUCE_THREADS;
                    }
                }
                *row >= *rows
            }
            Stage::Matmul {
                a,
                b,
                c,
                n,
                k,
                rows,
                cols,
                i,
                p,
                b_values,
                acc,
            } => {
                if *cols == 0 || *rows == 0 {
                    return true;
                }
                if b_values.is_empty() && *k > 0 {
                    // b as it is when the launch starts, decoded once: every tile reads it.
                    b_values.resize(*k * *n, T::ZERO);
                    load_into(memory, *b, b_values);
                    acc.resize(MATMUL_ROWS * *cols, T::ZERO);
                }
                let (cols, n, k) = (*cols, *n, *k);
                let mut spent = 0;
                while *i < *rows {
                    let tile = MATMUL_ROWS.min(*rows - *i);
                    // i-p-j order: each output's products still arrive in order of p; row p
                    // of b serves the tile's rows while it is in L1.
                    while *p < k {
                        let b_row = &b_values[*p * n..][..cols];
                        for (r, sums) in acc.chunks_exact_mut(cols).take(tile).enumerate() {
                            let a_ip = load::<T>(memory, *a, (*i + r) * k + *p);
                            for (sum, &b_pj) in sums.iter_mut().zip(b_row) {
                                *sum = sum.add(a_ip.mul(b_pj));
                            }
                        }
                        *p += 1;
                        spent += cols * tile;
                        if spent >= work && *p < k {
                            return false;
                        }
                    }
                    if k == 0 {
                        acc.resize(MATMUL_ROWS * cols, T::ZERO);
                    }
                    for (r, sums) in acc.chunks_exact(cols).take(tile).enumerate() {
                        write(memory, *c, (*i + r) * n, sums);
                    }
                    acc.fill(T::ZERO);
                    *p = 0;
                    *i += tile;
                    spent += cols * tile;
                    if spent >= work {
                        break;
                    }
                }
                *i >= *rows
            }
            Stage::Conv {
                conv,
                buffers,
                pixels,
                channels,
                images,
                at,
            } => {
                if *pixels == 0 || *channels == 0 {
                    return true;
                }
                let per_pixel = (conv.c * conv.r * conv.s).max(1);
                let mut spent = 0;
                while at[2] < *images && spent < work {
                    let [pq, ko, img] = *at;
                    let [input, weight, _] = *buffers;
                    let tensors = [&memory[input..], &memory[weight..]];
                    let value = conv_pixel::<T>(conv, tensors, [pq, ko, img]);
                    let index = (img * conv.k + ko) * conv.p * conv.q + pq;
                    write(memory, buffers[2], index, &[value]);
                    spent += per_pixel;
                    *at = if pq + 1 < *pixels {
                        [pq + 1, ko, img]
                    } else if ko + 1 < *channels {
                        [0, ko + 1, img]
                    } else {
                        [0, 0, img + 1]
                    };
                }
                at[2] >= *images
            }
        }
    }
}

/// Elements an element-wise kernel or a reduction loads at a time into arrays on the stack
/// (4 KiB each, within L1), so a step allocates nothing and its loops vectorise.
pub(crate) const BLOCK: usize = 1024;

/// Element-wise over elements `range`: `inputs` are the input buffers' offsets. Block by
/// block, every input of a block is read before its outputs are written.
fn elementwise<T: Element>(
    op: ElementwiseOp,
    alpha: Option<T>,
    inputs: &[usize],
    out: usize,
    range: Range<usize>,
    memory: &mut [u8],
) {
    if elementwise_in_place(op, alpha, inputs, out, range.clone(), memory) {
        return;
    }
    let mut x = [[T::ZERO; BLOCK]; 3];
    let mut y = [T::ZERO; BLOCK];
    let mut first = range.start;
    while first < range.end {
        let n = BLOCK.min(range.end - first);
        for (block, &offset) in x.iter_mut().zip(inputs) {
            load_into(memory, offset + 4 * first, &mut block[..n]);
        }
        let [a, b, c] = &x;
        let (a, b, c, y) = (&a[..n], &b[..n], &c[..n], &mut y[..n]);
        apply(op, alpha, y, [a, b, c]);
        write(memory, out, first, y);
        first += n;
    }
}

/// Folds `values` into `partials` in order, value `i` into partial `i % partials.len()`.
#[inline(always)]
fn fold<T: Element>(partials: &mut [T], values: &[T], f: impl Fn(T, T) -> T) {
    for chunk in values.chunks(partials.len()) {
        for (partial, &value) in partials.iter_mut().zip(chunk) {
            *partial = f(*partial, value);
        }
    }
}

/// Folds a span of a row (`bytes`, whole spans of `REDUCE_THREADS` values but the row's last)
/// into the 256 partials, value `i` into partial `i % 256`: in place when the bytes can be
/// viewed as `T`s (little-endian, aligned), else through `block` on the stack.
pub(crate) fn fold_span<T: Element>(
    op: ReduceOp,
    partials: &mut [T],
    bytes: &[u8],
    block: &mut [T; BLOCK],
) {
    let mut fold_values = |values: &[T]| match op {
        ReduceOp::Sum => fold(partials, values, T::add),
        ReduceOp::Max => fold(partials, values, |acc, x| if x > acc { x } else { acc }),
    };
    if cfg!(target_endian = "little") {
        if let Ok(values) = <[T]>::ref_from_bytes(bytes) {
            fold_values(values);
            return;
        }
    }
    for chunk in bytes.chunks(4 * BLOCK) {
        let values = &mut block[..chunk.len() / 4];
        decode_into(chunk, values);
        fold_values(values);
    }
}

/// Combines a finished row's partials by the GPU's fixed tree (`p[t] = op(p[t], p[t + s])` for
/// `s = 128, 64, ..., 1`) into its result, and resets them to the identity.
pub(crate) fn finish_row<T: Element>(op: ReduceOp, partials: &mut [T]) -> T {
    let combine: fn(T, T) -> T = match op {
        ReduceOp::Sum => T::add,
        ReduceOp::Max => |acc, x| if x > acc { x } else { acc },
    };
    let mut stride = REDUCE_THREADS / 2;
    while stride > 0 {
        for t in 0..stride {
            partials[t] = combine(partials[t], partials[t + stride]);
        }
        stride /= 2;
    }
    let result = partials[0];
    partials.fill(reduce_identity(op));
    result
}

/// The value every partial of a reduction starts from.
pub(crate) fn reduce_identity<T: Element>(op: ReduceOp) -> T {
    match op {
        ReduceOp::Sum => T::ZERO,
        ReduceOp::Max => T::LOWEST,
    }
}

/// [`elementwise`] when the output overlaps no input (the common case; the block path of
/// `elementwise` handles the rest): guest memory split into the output and the inputs, then
/// [`apply_bytes`]. Whether it ran.
fn elementwise_in_place<T: Element>(
    op: ElementwiseOp,
    alpha: Option<T>,
    inputs: &[usize],
    out: usize,
    range: Range<usize>,
    memory: &mut [u8],
) -> bool {
    if inputs.len() > 3 {
        return false;
    }
    let bytes = 4 * range.len();
    let out_start = out + 4 * range.start;
    let disjoint = |offset: usize| {
        let start = offset + 4 * range.start;
        start + bytes <= out_start || start >= out_start + bytes
    };
    if !inputs.iter().all(|&offset| disjoint(offset)) {
        return false;
    }
    let (head, rest) = memory.split_at_mut(out_start);
    let (dst, tail) = rest.split_at_mut(bytes);
    let mut views: [&[u8]; 3] = [&[], &[], &[]];
    for (view, &offset) in views.iter_mut().zip(inputs) {
        let start = offset + 4 * range.start;
        *view = if start + bytes <= out_start {
            &head[start..start + bytes]
        } else {
            let at = start - out_start - bytes;
            &tail[at..at + bytes]
        };
    }
    apply_bytes(op, alpha, views, dst);
    true
}

/// `out = op(ins)` over little-endian bytes (unused inputs empty): straight on the bytes viewed
/// as `T`s when they can be (a little-endian host, 4-byte-aligned slices), else block by block
/// through arrays on the stack.
pub(crate) fn apply_bytes<T: Element>(
    op: ElementwiseOp,
    alpha: Option<T>,
    ins: [&[u8]; 3],
    out: &mut [u8],
) {
    if cfg!(target_endian = "little") {
        // An unused input is empty, and an empty byte slice need not be aligned.
        let [a, b, c] = ins.map(|bytes| match bytes {
            [] => Some(&[][..]),
            bytes => <[T]>::ref_from_bytes(bytes).ok(),
        });
        if let (Some(a), Some(b), Some(c)) = (a, b, c) {
            if let Ok(y) = <[T]>::mut_from_bytes(out) {
                apply(op, alpha, y, [a, b, c]);
                return;
            }
        }
    }
    let mut x = [[T::ZERO; BLOCK]; 3];
    let mut y = [T::ZERO; BLOCK];
    let count = out.len() / 4;
    for first in (0..count).step_by(BLOCK) {
        let n = BLOCK.min(count - first);
        for (block, input) in x.iter_mut().zip(ins) {
            if !input.is_empty() {
                decode_into(&input[4 * first..4 * (first + n)], &mut block[..n]);
            }
        }
        let [a, b, c] = &x;
        apply(op, alpha, &mut y[..n], [&a[..n], &b[..n], &c[..n]]);
        encode_into(&y[..n], &mut out[4 * first..4 * (first + n)]);
    }
}

/// `y = op(a, b, c)` element by element (unary ops read `a`, binary ones `a` and `b`).
/// `plan` checked the arity, the scalar and that division is defined.
#[inline(always)]
fn apply<T: Element>(op: ElementwiseOp, alpha: Option<T>, y: &mut [T], [a, b, c]: [&[T]; 3]) {
    match op {
        ElementwiseOp::Add => zip2(y, a, b, T::add),
        ElementwiseOp::Sub => zip2(y, a, b, T::sub),
        ElementwiseOp::Mul => zip2(y, a, b, T::mul),
        ElementwiseOp::Max => zip2(y, a, b, max),
        ElementwiseOp::Min => zip2(y, a, b, min),
        ElementwiseOp::Div => zip2(y, a, b, |a, b| a.div(b).unwrap_or(T::ZERO)),
        ElementwiseOp::Relu => zip2(y, a, a, |a, _| max(a, T::ZERO)),
        ElementwiseOp::Scale => {
            let alpha = alpha.unwrap_or(T::ZERO);
            zip2(y, a, a, |a, _| alpha.mul(a));
        }
        ElementwiseOp::Fma => T::fma_into(y, a, b, c),
        ElementwiseOp::Exp
        | ElementwiseOp::Tanh
        | ElementwiseOp::Sigmoid
        | ElementwiseOp::Rsqrt
        | ElementwiseOp::Erf
        | ElementwiseOp::Gelu => {
            if let Some(f) = op.function() {
                T::map_f32(f, y, a);
            }
        }
    }
}

/// `y[i] = f(a[i], b[i])`.
#[inline(always)]
fn zip2<T: Element>(y: &mut [T], a: &[T], b: &[T], f: impl Fn(T, T) -> T) {
    for ((y, &a), &b) in y.iter_mut().zip(a).zip(b) {
        *y = f(a, b);
    }
}

/// Fills `into` with the elements at byte `offset`.
fn load_into<T: Element>(memory: &[u8], offset: usize, into: &mut [T]) {
    decode_into(&memory[offset..offset + 4 * into.len()], into);
}

/// Reduce: elements one pass over guest memory folds in place (a multiple of the partials).
pub(crate) const REDUCE_SPAN: usize = 4 * BLOCK;

/// Threads per reduction block; the tree below assumes this power of two.
pub(crate) const REDUCE_THREADS: usize = BLOCK_1D as usize;
