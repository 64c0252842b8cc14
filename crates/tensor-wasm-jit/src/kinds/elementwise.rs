//! `elementwise[OP]`: `out[i] = op(inputs[i]...)`, one element per thread.

use std::fmt;
use std::ops::Range;

use tensor_wasm_gpu::gemm::{decode_into, encode_into};
use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError, KernelArg, LaunchConfig};
use zerocopy::FromBytes;

use super::{blocks, Kind, KindRun};
use crate::contract::{Param, ParamKind, Shape};
use crate::cpu::{covered, load_into, max, min, write, Element, Stage, BLOCK, STEP_WORK};
use crate::cpu_parts::{disjoint, internal, split, STREAMED};
use crate::emit::{global_index_1d, ins, Ops};
use crate::math::{self, Temps};
use crate::{Dtype, JitError};

/// An element-wise operation: `out[i] = op(inputs[i]...)`.
///
/// `max(a, b)` is `a > b ? a : b` and `min(a, b)` is `a < b ? a : b` (so a NaN `a` gives `b`);
/// `relu(x)` is `x > 0 ? x : +0`. These are spelled out because the hardware `max` instruction
/// and Rust's `f32::max` leave signed zeros unspecified.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ElementwiseOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b` (f32 only: integer division by zero has no portable result).
    Div,
    /// `a > b ? a : b`.
    Max,
    /// `a < b ? a : b`.
    Min,
    /// `x > 0 ? x : 0`.
    Relu,
    /// `alpha * x` with a scalar `alpha`.
    Scale,
    /// `a * b + c` with a single rounding (fused multiply-add; wrapping `a*b+c` for i32).
    Fma,
    /// `e^x` ([`crate::math::exp`]; f32 only, as every function below).
    Exp,
    /// `tanh(x)` ([`crate::math::tanh`]).
    Tanh,
    /// `1 / (1 + e^-x)` ([`crate::math::sigmoid`]).
    Sigmoid,
    /// `1 / sqrt(x)` ([`crate::math::rsqrt`]).
    Rsqrt,
    /// `erf(x)` ([`crate::math::erf`]).
    Erf,
    /// `x · Φ(x)` in the erf form, `(0.5·x)·(1 + erf(x/√2))` ([`crate::math::gelu`]).
    Gelu,
}

impl ElementwiseOp {
    /// Every operation, in descriptor order.
    pub const ALL: [ElementwiseOp; 15] = [
        ElementwiseOp::Add,
        ElementwiseOp::Sub,
        ElementwiseOp::Mul,
        ElementwiseOp::Div,
        ElementwiseOp::Max,
        ElementwiseOp::Min,
        ElementwiseOp::Relu,
        ElementwiseOp::Scale,
        ElementwiseOp::Fma,
        ElementwiseOp::Exp,
        ElementwiseOp::Tanh,
        ElementwiseOp::Sigmoid,
        ElementwiseOp::Rsqrt,
        ElementwiseOp::Erf,
        ElementwiseOp::Gelu,
    ];

    /// The descriptor spelling (`add`, `relu`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            ElementwiseOp::Add => "add",
            ElementwiseOp::Sub => "sub",
            ElementwiseOp::Mul => "mul",
            ElementwiseOp::Div => "div",
            ElementwiseOp::Max => "max",
            ElementwiseOp::Min => "min",
            ElementwiseOp::Relu => "relu",
            ElementwiseOp::Scale => "scale",
            ElementwiseOp::Fma => "fma",
            ElementwiseOp::Exp => "exp",
            ElementwiseOp::Tanh => "tanh",
            ElementwiseOp::Sigmoid => "sigmoid",
            ElementwiseOp::Rsqrt => "rsqrt",
            ElementwiseOp::Erf => "erf",
            ElementwiseOp::Gelu => "gelu",
        }
    }

    /// The f32 function of the functions defined in [`crate::math`], `None` for the
    /// operations of one IEEE instruction.
    pub(crate) fn function(&self) -> Option<SliceFunction> {
        Some(match self {
            ElementwiseOp::Exp => math::exp_slice,
            ElementwiseOp::Tanh => math::tanh_slice,
            ElementwiseOp::Sigmoid => math::sigmoid_slice,
            ElementwiseOp::Rsqrt => math::rsqrt_slice,
            ElementwiseOp::Erf => math::erf_slice,
            ElementwiseOp::Gelu => math::gelu_slice,
            _ => return None,
        })
    }

    /// How many input buffers the operation reads (1 for `relu` and `scale`, 3 for `fma`).
    pub fn inputs(&self) -> usize {
        match self {
            ElementwiseOp::Fma => 3,
            ElementwiseOp::Add
            | ElementwiseOp::Sub
            | ElementwiseOp::Mul
            | ElementwiseOp::Div
            | ElementwiseOp::Max
            | ElementwiseOp::Min => 2,
            _ => 1,
        }
    }
}

/// A function of [`crate::math`] over a slice: `y[i] = f(x[i])`.
pub(crate) type SliceFunction = fn(&mut [f32], &[f32]);

impl Kind for ElementwiseOp {
    const NAME: &'static str = "elementwise";
    const EXAMPLES: &'static [&'static str] = &[
        "elementwise[add]",
        "elementwise[sub]",
        "elementwise[mul]",
        "elementwise[div]",
        "elementwise[max]",
        "elementwise[min]",
        "elementwise[relu]",
        "elementwise[scale]",
        "elementwise[fma]",
        "elementwise[exp]",
        "elementwise[tanh]",
        "elementwise[sigmoid]",
        "elementwise[rsqrt]",
        "elementwise[erf]",
        "elementwise[gelu]",
    ];
    const RANDOM_CASES: u32 = 32;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        ElementwiseOp::ALL
            .into_iter()
            .find(|op| op.as_str() == params)
            .ok_or_else(|| {
                JitError::parse(
                    descriptor,
                    "unknown element-wise op (add, sub, mul, div, max, min, relu, scale, fma, \
                     exp, tanh, sigmoid, rsqrt, erf, gelu)",
                )
            })
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }

    fn check(&self, dtype: Dtype) -> Result<(), String> {
        if (*self == ElementwiseOp::Div || self.function().is_some()) && dtype == Dtype::I32 {
            return Err(format!(
                "elementwise[{}] is only defined for f32",
                self.as_str()
            ));
        }
        Ok(())
    }

    fn params(&self, dtype: Dtype) -> Vec<Param> {
        use ParamKind::{Input, Output, U32};
        let mut params = match self.inputs() {
            1 => vec![Param::new("x", Input)],
            2 => vec![Param::new("a", Input), Param::new("b", Input)],
            _ => vec![
                Param::new("a", Input),
                Param::new("b", Input),
                Param::new("c", Input),
            ],
        };
        params.push(Param::new("out", Output));
        if *self == ElementwiseOp::Scale {
            let alpha = match dtype {
                Dtype::F32 => ParamKind::F32,
                Dtype::I32 => ParamKind::I32,
            };
            params.push(Param::new("alpha", alpha));
        }
        params.push(Param::new("n", U32));
        params
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        let Shape::Elements { n } = shape else {
            return None;
        };
        Some([blocks(u64::from(*n), u64::from(crate::BLOCK_1D)), 1, 1])
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        match sizes {
            &[n] => Some(Shape::Elements { n }),
            _ => None,
        }
    }

    fn buffer_elements(&self, shape: &Shape, buffers: usize) -> Vec<Option<u64>> {
        elements(shape, buffers)
    }

    fn in_place(&self) -> bool {
        true
    }

    fn emit(&self, _dtype: Dtype, params: &[Param], ops: &Ops, out: &mut String) {
        let mut temps = Temps::new("m");
        let mut body = String::new();
        emit_elementwise(&mut body, ops, *self, params, &mut temps);
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
        let Shape::Elements { n } = shape else {
            return Err(JitError::InvalidLaunch(format!(
                "{shape:?} for elementwise"
            )));
        };
        plan(*self, covered(config, 1, u64::from(*n)), args, buffers)
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::Elements { n: dims[0] }
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [Shape::Elements { n: 1003 }, Shape::Elements { n: 70_001 }]
    }
}

/// `n` elements in every buffer of an element-wise kind.
pub(super) fn elements(shape: &Shape, buffers: usize) -> Vec<Option<u64>> {
    match shape {
        Shape::Elements { n } => vec![Some(u64::from(*n)); buffers],
        _ => Vec::new(),
    }
}

/// The CPU run of `op` over the first `count` elements: `buffers` are the inputs then the
/// output.
pub(super) fn plan<T: Element>(
    op: ElementwiseOp,
    count: usize,
    args: &[KernelArg],
    buffers: &[usize],
) -> Result<Stage<T>, JitError> {
    let Some((&out, inputs)) = buffers.split_last() else {
        return Err(JitError::InvalidLaunch(
            "element-wise kernel without buffers".into(),
        ));
    };
    let alpha = args.iter().find_map(T::from_arg);
    let arity_ok = inputs.len() == op.inputs() && (op != ElementwiseOp::Scale || alpha.is_some());
    if !arity_ok {
        return Err(JitError::InvalidLaunch(format!(
            "elementwise[{}] got {} input buffers{}",
            op.as_str(),
            inputs.len(),
            if alpha.is_none() {
                " and no scalar"
            } else {
                ""
            }
        )));
    }
    let f32_only = op == ElementwiseOp::Div || op.function().is_some();
    if f32_only && T::ZERO.div(T::ZERO).is_none() {
        return Err(JitError::InvalidBlueprint(format!(
            "elementwise[{}] is only defined for f32",
            op.as_str()
        )));
    }
    Ok(Box::new(ElementwiseRun {
        op,
        alpha,
        inputs: inputs.to_vec(),
        out,
        count,
        next: 0,
    }))
}

/// `out[i] = op(inputs[i])` for `i = ctaid.x * 256 + tid.x < n`.
fn emit_elementwise(
    out: &mut String,
    ops: &Ops,
    op: ElementwiseOp,
    params: &[Param],
    temps: &mut Temps,
) {
    global_index_1d(out);
    ins!(out, "ld.param.u32 %r3, [p_n];");
    ins!(out, "cvt.u64.u32 %rd2, %r3;");
    ins!(out, "setp.ge.u64 %p1, %rd1, %rd2; // guard: i < n");
    ins!(out, "@%p1 bra DONE;");
    ins!(out, "shl.b64 %rd3, %rd1, 2;");
    let buffers: Vec<&str> = params
        .iter()
        .filter(|p| matches!(p.kind, ParamKind::Input | ParamKind::Output))
        .map(|p| p.name)
        .collect();
    for (index, name) in buffers.iter().enumerate() {
        let reg = 10 + index;
        ins!(out, "ld.param.u64 %rd{reg}, [p_{name}];");
        ins!(out, "cvta.to.global.u64 %rd{reg}, %rd{reg};");
        ins!(out, "add.u64 %rd{reg}, %rd{reg}, %rd3;");
    }
    let inputs = buffers.len() - 1;
    for index in 0..inputs {
        ins!(out, "ld.global.b32 %v{}, [%rd{}];", index + 1, 10 + index);
    }
    if op == ElementwiseOp::Scale {
        ins!(out, "ld.param.{} %v5, [p_alpha];", ops.cmp);
    }
    emit_op(out, ops, op, "%v0", ["%v1", "%v2", "%v3"], "%v5", temps);
    ins!(out, "st.global.b32 [%rd{}], %v0;", 10 + inputs);
}

/// Appends the instructions of `dst = op(a, b, c)` (unary operations read `a`, binary ones
/// `a` and `b`); `alpha` is `scale`'s factor (a register or an immediate). `dst` may be `a`
/// or `b`: every operation reads its inputs before it writes `dst`. Uses `%p2` and, for
/// `relu`, `%v6`; the functions' temporaries come from `temps`.
pub(super) fn emit_op(
    out: &mut String,
    ops: &Ops,
    op: ElementwiseOp,
    dst: &str,
    [a, b, c]: [&str; 3],
    alpha: &str,
    temps: &mut Temps,
) {
    let cmp = ops.cmp;
    match op {
        ElementwiseOp::Add => ins!(out, "{} {dst}, {a}, {b};", ops.add),
        ElementwiseOp::Sub => ins!(out, "{} {dst}, {a}, {b};", ops.sub),
        ElementwiseOp::Mul => ins!(out, "{} {dst}, {a}, {b};", ops.mul),
        ElementwiseOp::Div => ins!(out, "div.rn.f32 {dst}, {a}, {b};"),
        ElementwiseOp::Max => {
            ins!(out, "setp.gt.{cmp} %p2, {a}, {b};");
            ins!(out, "selp.b32 {dst}, {a}, {b}, %p2;");
        }
        ElementwiseOp::Min => {
            ins!(out, "setp.lt.{cmp} %p2, {a}, {b};");
            ins!(out, "selp.b32 {dst}, {a}, {b}, %p2;");
        }
        ElementwiseOp::Relu => {
            ins!(out, "mov.b32 %v6, 0;");
            ins!(out, "setp.gt.{cmp} %p2, {a}, %v6;");
            ins!(out, "selp.b32 {dst}, {a}, %v6, %p2;");
        }
        ElementwiseOp::Scale => ins!(out, "{} {dst}, {alpha}, {a};", ops.mul),
        ElementwiseOp::Fma => ins!(out, "{} {dst}, {a}, {b}, {c};", ops.fma),
        ElementwiseOp::Exp => math::emit_exp(out, dst, a, temps),
        ElementwiseOp::Tanh => math::emit_tanh(out, dst, a, temps),
        ElementwiseOp::Sigmoid => math::emit_sigmoid(out, dst, a, temps),
        ElementwiseOp::Rsqrt => math::emit_rsqrt(out, dst, a, temps),
        ElementwiseOp::Erf => math::emit_erf(out, dst, a, temps),
        ElementwiseOp::Gelu => math::emit_gelu(out, dst, a, temps),
    }
}

/// Elements `next..count` are left; buffers are the inputs then the output.
#[derive(Debug)]
pub(crate) struct ElementwiseRun<T> {
    op: ElementwiseOp,
    alpha: Option<T>,
    inputs: Vec<usize>,
    out: usize,
    count: usize,
    next: usize,
}

impl<T: Element + Send> KindRun<T> for ElementwiseRun<T> {
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        let Self {
            op,
            alpha,
            inputs,
            out,
            count,
            next,
        } = self;
        {
            let range = *next..(*count).min(next.saturating_add(work));
            elementwise::<T>(*op, *alpha, inputs, *out, range.clone(), memory);
            *next = range.end;
            *next >= *count
        }
    }

    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts> {
        let boxed = |part: Box<dyn CpuPart>| part;
        let Self {
            op,
            alpha,
            inputs,
            out,
            count,
            ..
        } = *self;
        disjoint(CpuParts {
            parts: split(count, STREAMED, workers)
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
        })
    }
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
/// The caller's plan (this kind's, or `chain`'s for each of its operations) checked the
/// arity, the scalar and that division is defined.
#[inline(always)]
pub(super) fn apply<T: Element>(
    op: ElementwiseOp,
    alpha: Option<T>,
    y: &mut [T],
    [a, b, c]: [&[T]; 3],
) {
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
