//! The CPU implementation of every blueprint, computing exactly what the emitted PTX computes.
//!
//! Buffers are read and written as little-endian 32-bit values at byte offsets of guest memory.
//! Only the indices the launch grid covers are computed; every other output byte is left as it
//! was. The per-element order of operations is the GPU's (see each function), so f32 results
//! are bit-identical except for the payload of NaNs, which the hardware canonicalises.

use tensor_wasm_gpu::gemm::{decode_into, encode_into, Lane};
use tensor_wasm_gpu::{KernelArg, LaunchConfig};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout};

use crate::contract::BLOCK_1D;
use crate::kinds::{with_kind, Kind, KindRun};
use crate::{Blueprint, Dtype, JitError, ReduceOp, Shape};

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
    /// `x` and `y` as f32s, for an f32-only fast path; `None` for i32.
    fn f32s<'a>(x: &'a [Self], y: &'a mut [Self]) -> Option<(&'a [f32], &'a mut [f32])>;
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
    fn f32s<'a>(x: &'a [Self], y: &'a mut [Self]) -> Option<(&'a [f32], &'a mut [f32])> {
        Some((x, y))
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
    fn f32s<'a>(_x: &'a [Self], _y: &'a mut [Self]) -> Option<(&'a [f32], &'a mut [f32])> {
        None
    }
}

/// `a > b ? a : b`, the GPU's `setp.gt` + `selp`.
pub(crate) fn max<T: Element>(a: T, b: T) -> T {
    if a > b {
        a
    } else {
        b
    }
}

/// `a < b ? a : b`.
pub(crate) fn min<T: Element>(a: T, b: T) -> T {
    if a < b {
        a
    } else {
        b
    }
}

/// Writes `values` as elements `first..` of the buffer at byte `offset`.
pub(crate) fn write<T: Element>(memory: &mut [u8], offset: usize, first: usize, values: &[T]) {
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

/// Where a launch is, with what it must carry between steps: each kind's own run.
pub(crate) type Stage<T> = Box<dyn KindRun<T>>;

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
pub(crate) fn load<T: Element>(memory: &[u8], offset: usize, index: usize) -> T {
    let at = offset + 4 * index;
    T::from_le([memory[at], memory[at + 1], memory[at + 2], memory[at + 3]])
}

/// Elements an element-wise kernel or a reduction loads at a time into arrays on the stack
/// (4 KiB each, within L1), so a step allocates nothing and its loops vectorise.
pub(crate) const BLOCK: usize = 1024;

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
/// viewed as `T`s (little-endian, aligned), else through `block` (a multiple of 256 long).
pub(crate) fn fold_span<T: Element>(
    op: ReduceOp,
    partials: &mut [T],
    bytes: &[u8],
    block: &mut [T],
) {
    debug_assert!(!block.is_empty() && block.len().is_multiple_of(REDUCE_THREADS));
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
    for chunk in bytes.chunks(4 * block.len()) {
        let values = &mut block[..chunk.len() / 4];
        decode_into(chunk, values);
        fold_values(values);
    }
}

/// Combines a finished row's partials by the GPU's fixed tree (`p[t] = op(p[t], p[t + s])` for
/// `s = 128, 64, ..., 1`) into its result, and resets them to the identity. Only the first
/// `active` partials may hold anything but the identity (a row of `n` elements touches
/// `min(n, 256)`); the others are not read. The bits are the whole tree's: a step that
/// combines two identities gives the identity again and is skipped, and the levels whose
/// partners are all identities combine each active partial with the identity once, which is
/// what they do together (`-0.0 + 0.0` is `+0.0`, and adding `0.0` again changes nothing;
/// `max` with the identity is the partial itself).
pub(crate) fn finish_row<T: Element>(op: ReduceOp, partials: &mut [T], active: usize) -> T {
    match op {
        ReduceOp::Sum => tree(partials, active, T::ZERO, T::add),
        ReduceOp::Max => tree(
            partials,
            active,
            T::LOWEST,
            |acc, x| {
                if x > acc {
                    x
                } else {
                    acc
                }
            },
        ),
    }
}

#[inline(always)]
fn tree<T: Element>(
    partials: &mut [T],
    active: usize,
    identity: T,
    combine: impl Fn(T, T) -> T,
) -> T {
    let touched = active.min(REDUCE_THREADS);
    if touched == 0 {
        return identity;
    }
    let mut stride = REDUCE_THREADS / 2;
    if stride >= touched {
        for p in &mut partials[..touched] {
            *p = combine(*p, identity);
        }
        while stride >= touched {
            stride /= 2;
        }
    }
    let mut active = touched;
    while stride > 0 {
        let (low, high) = partials.split_at_mut(stride);
        let pairs = active.saturating_sub(stride);
        for (p, &x) in low[..pairs].iter_mut().zip(&high[..pairs]) {
            *p = combine(*p, x);
        }
        for p in &mut low[pairs..active.min(stride)] {
            *p = combine(*p, identity);
        }
        active = active.min(stride);
        stride /= 2;
    }
    let result = partials[0];
    partials[..touched].fill(identity);
    result
}

/// The value every partial of a reduction starts from.
pub(crate) fn reduce_identity<T: Element>(op: ReduceOp) -> T {
    match op {
        ReduceOp::Sum => T::ZERO,
        ReduceOp::Max => T::LOWEST,
    }
}

/// Fills `into` with the elements at byte `offset`.
pub(crate) fn load_into<T: Element>(memory: &[u8], offset: usize, into: &mut [T]) {
    decode_into(&memory[offset..offset + 4 * into.len()], into);
}

/// Reduce: elements one pass over guest memory folds in place (a multiple of the partials).
pub(crate) const REDUCE_SPAN: usize = 4 * BLOCK;

/// Threads per reduction block; the tree below assumes this power of two.
pub(crate) const REDUCE_THREADS: usize = BLOCK_1D as usize;
