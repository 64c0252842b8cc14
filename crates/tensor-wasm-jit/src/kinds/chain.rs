//! `chain[OP1.OP2...]`: 2 to 4 element-wise operations fused into one kernel, f32, one element
//! per thread. Per element `i`: `v = x[i]`; each operation in order replaces `v` by `f(v)`
//! (unary) or by `op(v, b_j[i])` (binary; `v` is the left operand, `b_j` the next operand
//! buffer); `out[i] = v`.
//!
//! Every operation is exactly the one of `elementwise[..]` (the same PTX sequence and the same
//! CPU function, from `super::elementwise`), so a chain gives the bits of its `elementwise`
//! kernels run one after another; `neg` is `elementwise[scale]` with `alpha = -1`.
//!
//! Parameters `x, b1[, b2[, b3[, b4]]], out, n`: one operand buffer per binary operation, in
//! the order of the operations. Launched as `elementwise` is (block 256, `grid.x =
//! ceil(n / 256)`), and like it `out` may be exactly an input (same offset).

use std::fmt;
use std::ops::Range;

use tensor_wasm_gpu::gemm::decode_into;
use tensor_wasm_gpu::{CpuPart, CpuParts, GpuError, KernelArg, LaunchConfig};
use zerocopy::FromBytes;

use super::elementwise::{self, apply, emit_op, ElementwiseOp};
use super::{Kind, KindRun};
use crate::contract::{Param, ParamKind, Shape};
use crate::cpu::{covered, write, Element, Stage, BLOCK, STEP_WORK};
use crate::cpu_parts::{disjoint, internal, split, STREAMED};
use crate::emit::{global_index_1d, ins, Ops};
use crate::math::Temps;
use crate::{Dtype, JitError};

/// Fewest operations in a chain.
pub const MIN_CHAIN_OPS: usize = 2;
/// Most operations in a chain.
pub const MAX_CHAIN_OPS: usize = 4;

/// `-1.0` as a PTX immediate: `neg`'s factor.
const NEG_ONE: &str = "0fBF800000";

/// The operand buffers' names, in the order of the binary operations.
const OPERAND_NAMES: [&str; MAX_CHAIN_OPS] = ["b1", "b2", "b3", "b4"];

/// One operation of a [`Chain`]: `elementwise[..]`'s, applied to the running value `v`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ChainOp {
    /// `v + b`.
    Add,
    /// `v - b`.
    Sub,
    /// `v * b`.
    Mul,
    /// `v / b`.
    Div,
    /// `v > b ? v : b`.
    Max,
    /// `v < b ? v : b`.
    Min,
    /// `v > 0 ? v : +0`.
    Relu,
    /// [`crate::math::exp`].
    Exp,
    /// [`crate::math::tanh`].
    Tanh,
    /// [`crate::math::sigmoid`].
    Sigmoid,
    /// [`crate::math::erf`].
    Erf,
    /// [`crate::math::gelu`].
    Gelu,
    /// [`crate::math::rsqrt`].
    Rsqrt,
    /// `-1 * v`, rounded (`elementwise[scale]` with `alpha = -1`).
    Neg,
}

impl ChainOp {
    /// Every operation, in descriptor order (unary, then binary).
    pub const ALL: [ChainOp; 14] = [
        ChainOp::Relu,
        ChainOp::Exp,
        ChainOp::Tanh,
        ChainOp::Sigmoid,
        ChainOp::Erf,
        ChainOp::Gelu,
        ChainOp::Rsqrt,
        ChainOp::Neg,
        ChainOp::Add,
        ChainOp::Sub,
        ChainOp::Mul,
        ChainOp::Div,
        ChainOp::Max,
        ChainOp::Min,
    ];

    /// The descriptor spelling (`add`, `relu`, `neg`, ...).
    pub fn as_str(&self) -> &'static str {
        match self {
            ChainOp::Neg => "neg",
            op => op.elementwise().as_str(),
        }
    }

    /// The `elementwise[..]` operation this one is (`neg`: `scale`, with `alpha = -1`).
    pub fn elementwise(&self) -> ElementwiseOp {
        match self {
            ChainOp::Add => ElementwiseOp::Add,
            ChainOp::Sub => ElementwiseOp::Sub,
            ChainOp::Mul => ElementwiseOp::Mul,
            ChainOp::Div => ElementwiseOp::Div,
            ChainOp::Max => ElementwiseOp::Max,
            ChainOp::Min => ElementwiseOp::Min,
            ChainOp::Relu => ElementwiseOp::Relu,
            ChainOp::Exp => ElementwiseOp::Exp,
            ChainOp::Tanh => ElementwiseOp::Tanh,
            ChainOp::Sigmoid => ElementwiseOp::Sigmoid,
            ChainOp::Erf => ElementwiseOp::Erf,
            ChainOp::Gelu => ElementwiseOp::Gelu,
            ChainOp::Rsqrt => ElementwiseOp::Rsqrt,
            ChainOp::Neg => ElementwiseOp::Scale,
        }
    }

    /// Whether the operation reads an operand buffer besides `v`.
    pub fn is_binary(&self) -> bool {
        self.elementwise().inputs() == 2
    }
}

/// `chain[OPS]`: the operations of a fused element-wise chain, 2 to 4 of them (f32 only).
///
/// Launch contract: parameters `x`, one operand buffer `b1, b2, ...` per binary operation in
/// the order of the operations, `out`, `n`; block `[256, 1, 1]`, `grid.x = ceil(n / 256)`
/// (thread `i` computes element `i`); every buffer holds `n` elements; `out` may be exactly
/// an input (same offset), and overlaps none otherwise. Element `i` is `x[i]` put through
/// each operation in order, the running value the left operand of a binary one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Chain {
    /// The operations, then `Neg` in the unused slots (so equal chains compare equal).
    ops: [ChainOp; MAX_CHAIN_OPS],
    len: u8,
}

impl Chain {
    /// The chain of `ops`, `None` unless there are 2 to 4 of them.
    pub fn new(ops: &[ChainOp]) -> Option<Chain> {
        if !(MIN_CHAIN_OPS..=MAX_CHAIN_OPS).contains(&ops.len()) {
            return None;
        }
        let mut all = [ChainOp::Neg; MAX_CHAIN_OPS];
        all[..ops.len()].copy_from_slice(ops);
        Some(Chain {
            ops: all,
            len: ops.len() as u8,
        })
    }

    /// The operations in order.
    pub fn ops(&self) -> &[ChainOp] {
        &self.ops[..usize::from(self.len)]
    }

    /// How many operand buffers the chain reads besides `x` (its binary operations).
    pub fn operands(&self) -> usize {
        self.ops().iter().filter(|op| op.is_binary()).count()
    }
}

impl Kind for Chain {
    const NAME: &'static str = "chain";
    const EXAMPLES: &'static [&'static str] = &[
        "chain[add.relu]",
        "chain[add.gelu]",
        "chain[mul.add.tanh]",
        "chain[exp.sigmoid]",
        "chain[sub.max.div.erf]",
        "chain[neg.relu]",
        "chain[min.rsqrt]",
    ];
    const RANDOM_CASES: u32 = 16;

    fn parse(descriptor: &str, params: &str) -> Result<Self, JitError> {
        let mut ops = Vec::with_capacity(MAX_CHAIN_OPS);
        for name in params.split('.') {
            let Some(op) = ChainOp::ALL.into_iter().find(|op| op.as_str() == name) else {
                return Err(JitError::parse(
                    descriptor,
                    format!(
                        "unknown chain op {name:?} (relu, exp, tanh, sigmoid, erf, gelu, rsqrt, \
                         neg, add, sub, mul, div, max, min)"
                    ),
                ));
            };
            ops.push(op);
        }
        Chain::new(&ops).ok_or_else(|| {
            JitError::parse(
                descriptor,
                format!(
                    "a chain joins {MIN_CHAIN_OPS} to {MAX_CHAIN_OPS} ops with '.', not {}",
                    ops.len()
                ),
            )
        })
    }

    fn write_params(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (index, op) in self.ops().iter().enumerate() {
            if index > 0 {
                f.write_str(".")?;
            }
            f.write_str(op.as_str())?;
        }
        Ok(())
    }

    fn check(&self, dtype: Dtype) -> Result<(), String> {
        match dtype {
            Dtype::F32 => Ok(()),
            Dtype::I32 => Err("chain is only defined for f32".into()),
        }
    }

    fn params(&self, _dtype: Dtype) -> Vec<Param> {
        let mut params = vec![Param::new("x", ParamKind::Input)];
        for name in &OPERAND_NAMES[..self.operands()] {
            params.push(Param::new(name, ParamKind::Input));
        }
        params.push(Param::new("out", ParamKind::Output));
        params.push(Param::new("n", ParamKind::U32));
        params
    }

    fn grid(&self, shape: &Shape) -> Option<[u64; 3]> {
        ElementwiseOp::Add.grid(shape)
    }

    fn shape(&self, sizes: &[u32]) -> Option<Shape> {
        ElementwiseOp::Add.shape(sizes)
    }

    fn buffer_elements(&self, shape: &Shape, buffers: usize) -> Vec<Option<u64>> {
        elementwise::elements(shape, buffers)
    }

    fn in_place(&self) -> bool {
        true
    }

    fn emit(&self, _dtype: Dtype, params: &[Param], ops: &Ops, out: &mut String) {
        let mut temps = Temps::new("m");
        let mut body = String::new();
        emit_chain(&mut body, ops, self.ops(), params, &mut temps);
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
        let Shape::Elements { n } = shape else {
            return Err(JitError::InvalidLaunch(format!("{shape:?} for chain")));
        };
        let Some((&out, inputs)) = buffers.split_last() else {
            return Err(JitError::InvalidLaunch(
                "chain kernel without buffers".into(),
            ));
        };
        if inputs.len() != 1 + self.operands() {
            return Err(JitError::InvalidLaunch(format!(
                "{} input buffers for a chain reading {}",
                inputs.len(),
                1 + self.operands()
            )));
        }
        // `neg`'s factor; none for i32, for which no chain is defined.
        let Some(neg_one) = T::from_arg(&KernelArg::F32(-1.0)) else {
            return Err(JitError::InvalidBlueprint(
                "chain is only defined for f32".into(),
            ));
        };
        Ok(Box::new(ChainRun {
            chain: *self,
            neg_one,
            inputs: inputs.to_vec(),
            out,
            count: covered(config, 1, u64::from(*n)),
            next: 0,
        }))
    }

    fn case_shape(&self, dims: [u32; 5]) -> Shape {
        Shape::Elements { n: dims[0] }
    }

    fn suite_shapes(&self) -> [Shape; 2] {
        [Shape::Elements { n: 1003 }, Shape::Elements { n: 70_001 }]
    }
}

/// `out[i] = chain(x[i], b1[i], ...)` for `i = ctaid.x * 256 + tid.x < n`: `x` in `%v0`, which
/// holds the running value, operand `j` in `%v{j}`; each operation is `elementwise`'s own
/// instruction sequence with `%v0` as its destination and left operand.
fn emit_chain(out: &mut String, ops: &Ops, chain: &[ChainOp], params: &[Param], temps: &mut Temps) {
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
        ins!(out, "ld.global.b32 %v{index}, [%rd{}];", 10 + index);
    }
    let mut operand = 0;
    for op in chain {
        let b = if op.is_binary() {
            operand += 1;
            format!("%v{operand}")
        } else {
            String::new()
        };
        emit_op(
            out,
            ops,
            op.elementwise(),
            "%v0",
            ["%v0", &b, ""],
            NEG_ONE,
            temps,
        );
    }
    ins!(out, "st.global.b32 [%rd{}], %v0;", 10 + inputs);
}

/// Elements `next..count` are left; `inputs` are the offsets of `x` and the operands.
#[derive(Debug)]
struct ChainRun<T> {
    chain: Chain,
    neg_one: T,
    inputs: Vec<usize>,
    out: usize,
    count: usize,
    next: usize,
}

impl<T: Element + Send> KindRun<T> for ChainRun<T> {
    /// `work` counts operations: a step computes about `work / ops` elements.
    fn step(&mut self, memory: &mut [u8], work: usize) -> bool {
        let per_step = (work / self.chain.ops().len()).max(1);
        let range = self.next..self.count.min(self.next.saturating_add(per_step));
        let mut blocks = Blocks::new();
        let mut first = range.start;
        while first < range.end {
            let n = BLOCK.min(range.end - first);
            let bytes = 4 * first..4 * (first + n);
            let ins = self
                .inputs
                .iter()
                .map(|&at| &memory[at + bytes.start..at + bytes.end]);
            let y = blocks.compute(&self.chain, self.neg_one, ins);
            // Every input of the block is read before its outputs are written, so an output
            // over an input (same offset) gives what separate buffers would.
            write(memory, self.out, first, y);
            first += n;
        }
        self.next = range.end;
        self.next >= self.count
    }

    fn parts(self: Box<Self>, workers: usize) -> Option<CpuParts> {
        let boxed = |part: Box<dyn CpuPart>| part;
        let Self {
            chain,
            neg_one,
            inputs,
            out,
            count,
            ..
        } = *self;
        disjoint(CpuParts {
            parts: split(count, STREAMED * chain.ops().len(), workers)
                .into_iter()
                .map(|range| {
                    let output = out + 4 * range.start..out + 4 * range.end;
                    let part = ChainPart {
                        chain,
                        neg_one,
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

/// Elements `range` of a chain, from `next` on; its inputs are whole buffers, its output the
/// range's own bytes.
struct ChainPart<T> {
    chain: Chain,
    neg_one: T,
    arity: usize,
    range: Range<usize>,
    next: usize,
}

impl<T: Element + Send> CpuPart for ChainPart<T> {
    fn step(&mut self, inputs: &[&[u8]], output: &mut [u8]) -> Result<bool, GpuError> {
        if inputs.len() != self.arity {
            return Err(internal("chain"));
        }
        let per_step = STEP_WORK / self.chain.ops().len();
        let chunk = self.next..self.range.end.min(self.next + per_step);
        let mut blocks = Blocks::new();
        for first in chunk.clone().step_by(BLOCK) {
            let n = BLOCK.min(chunk.end - first);
            let ins = inputs
                .iter()
                .map(|input| &input[4 * first..4 * (first + n)]);
            let at = first - self.range.start;
            let out = &mut output[4 * at..4 * (at + n)];
            let y = blocks.compute(&self.chain, self.neg_one, ins);
            write(out, 0, 0, y);
        }
        self.next = chunk.end;
        Ok(self.next >= self.range.end)
    }
}

/// The arrays one block of a chain is computed in: two for the running value, on the stack,
/// and its inputs when their bytes cannot be viewed as `T`s in place (allocated only then);
/// each holds [`BLOCK`] elements (within L1).
struct Blocks<T> {
    inputs: Vec<[T; BLOCK]>,
    value: [T; BLOCK],
    spare: [T; BLOCK],
}

impl<T: Element> Blocks<T> {
    fn new() -> Self {
        Blocks {
            inputs: Vec::new(),
            value: [T::ZERO; BLOCK],
            spare: [T::ZERO; BLOCK],
        }
    }

    /// The chain over one block: `ins` are the bytes of `x` and of each operand (at most
    /// [`BLOCK`] elements each, all as long). Each operation is `elementwise`'s [`apply`] over
    /// the whole block, from one of `value` and `spare` into the other, arranged so that the
    /// last lands in `value`, which is returned.
    fn compute<'a>(
        &mut self,
        chain: &Chain,
        neg_one: T,
        ins: impl Iterator<Item = &'a [u8]> + Clone,
    ) -> &[T] {
        let viewable =
            |bytes: &[u8]| cfg!(target_endian = "little") && <[T]>::ref_from_bytes(bytes).is_ok();
        if !ins.clone().all(viewable) && self.inputs.is_empty() {
            self.inputs = vec![[T::ZERO; BLOCK]; 1 + MAX_CHAIN_OPS];
        }
        let mut views: [&[T]; 1 + MAX_CHAIN_OPS] = [&[]; 1 + MAX_CHAIN_OPS];
        let mut n = 0;
        let mut copies = self.inputs.iter_mut();
        for (view, bytes) in views.iter_mut().zip(ins) {
            n = bytes.len() / 4;
            *view = match copies.next() {
                Some(copy) => typed(bytes, &mut copy[..n]),
                None => typed(bytes, &mut []),
            };
        }
        let [x, operands @ ..] = views;
        let (value, spare) = (&mut self.value[..n], &mut self.spare[..n]);
        let ops = chain.ops();
        let mut operands = operands.into_iter();
        for (index, op) in ops.iter().enumerate() {
            let b = if op.is_binary() {
                operands.next().unwrap_or(&[])
            } else {
                &[]
            };
            let alpha = (*op == ChainOp::Neg).then_some(neg_one);
            let op = op.elementwise();
            // Operation `index` writes `value` when an even number of operations follow it.
            let into_value = (ops.len() - 1 - index).is_multiple_of(2);
            match (index, into_value) {
                (0, true) => apply(op, alpha, value, [x, b, &[]]),
                (0, false) => apply(op, alpha, spare, [x, b, &[]]),
                (_, true) => apply(op, alpha, value, [&*spare, b, &[]]),
                (_, false) => apply(op, alpha, spare, [&*value, b, &[]]),
            }
        }
        value
    }
}

/// `bytes` as `T`s: in place when they can be viewed so (a little-endian host, 4-byte-aligned
/// bytes), else decoded into `copy` (as long as the bytes hold elements).
fn typed<'a, T: Element>(bytes: &'a [u8], copy: &'a mut [T]) -> &'a [T] {
    if cfg!(target_endian = "little") {
        if let Ok(values) = <[T]>::ref_from_bytes(bytes) {
            return values;
        }
    }
    decode_into(bytes, copy);
    copy
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Blueprint;

    #[test]
    fn descriptors_round_trip_and_name_their_operands() {
        let blueprint = Blueprint::parse("chain[sub.max.div.erf]").unwrap();
        assert_eq!(blueprint.descriptor(), "chain[sub.max.div.erf]:f32");
        assert_eq!(blueprint.entry_name(), "tw_chain_sub_max_div_erf_f32");
        let names: Vec<&str> = blueprint.params().iter().map(|p| p.name).collect();
        assert_eq!(names, ["x", "b1", "b2", "b3", "out", "n"]);
        let names: Vec<&str> = Blueprint::parse("chain[exp.neg]")
            .unwrap()
            .params()
            .iter()
            .map(|p| p.name)
            .collect();
        assert_eq!(names, ["x", "out", "n"]);
        for op in ChainOp::ALL {
            let text = format!("chain[{}.{}]:f32", op.as_str(), op.as_str());
            assert_eq!(Blueprint::parse(&text).unwrap().descriptor(), text);
        }
    }

    #[test]
    fn bad_chains_are_refused_with_a_reason() {
        for (text, reason) in [
            ("chain[add]", "2 to 4 ops"),
            ("chain[]", "unknown chain op"),
            ("chain[add.relu.exp.tanh.neg]", "2 to 4 ops"),
            ("chain[add.cosh]", "unknown chain op \"cosh\""),
            ("chain[add..relu]", "unknown chain op \"\""),
            ("chain[add.scale]", "unknown chain op \"scale\""),
            ("chain[add.fma]", "unknown chain op \"fma\""),
            ("chain[add,relu]", "unknown chain op"),
            ("chain[add.relu]:i32", "only defined for f32"),
        ] {
            let error = Blueprint::parse(text).expect_err(text).to_string();
            assert!(error.contains(reason), "{text}: {error}");
        }
    }

    #[test]
    fn each_operation_is_emitted_on_the_running_value() {
        let ptx = Blueprint::parse("chain[neg.sub.relu]")
            .unwrap()
            .emit_ptx(&crate::PtxTarget::default());
        let body = &ptx[ptx.find("ld.global.b32 %v0").expect("x is loaded")..];
        let neg = body.find("mul.rn.f32 %v0, 0fBF800000, %v0;").expect("neg");
        let sub = body.find("sub.rn.f32 %v0, %v0, %v1;").expect("sub");
        let relu = body.find("selp.b32 %v0, %v0, %v6, %p2;").expect("relu");
        let store = body.find("st.global.b32 [%rd12], %v0;").expect("store");
        assert!(neg < sub && sub < relu && relu < store, "{body}");
    }
}
