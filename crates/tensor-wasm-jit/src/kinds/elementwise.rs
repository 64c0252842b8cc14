//! `elementwise[OP]`: `out[i] = op(inputs[i]...)`, one element per thread.

use std::fmt;

use tensor_wasm_gpu::{KernelArg, LaunchConfig};

use super::{blocks, Kind};
use crate::contract::{Param, ParamKind, Shape};
use crate::cpu::{covered, Element, Stage};
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
    Ok(Stage::Elementwise {
        op,
        alpha,
        inputs: inputs.to_vec(),
        out,
        count,
        next: 0,
    })
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
    let cmp = ops.cmp;
    match op {
        ElementwiseOp::Add => ins!(out, "{} %v0, %v1, %v2;", ops.add),
        ElementwiseOp::Sub => ins!(out, "{} %v0, %v1, %v2;", ops.sub),
        ElementwiseOp::Mul => ins!(out, "{} %v0, %v1, %v2;", ops.mul),
        ElementwiseOp::Div => ins!(out, "div.rn.f32 %v0, %v1, %v2;"),
        ElementwiseOp::Max => {
            ins!(out, "setp.gt.{cmp} %p2, %v1, %v2;");
            ins!(out, "selp.b32 %v0, %v1, %v2, %p2;");
        }
        ElementwiseOp::Min => {
            ins!(out, "setp.lt.{cmp} %p2, %v1, %v2;");
            ins!(out, "selp.b32 %v0, %v1, %v2, %p2;");
        }
        ElementwiseOp::Relu => {
            ins!(out, "mov.b32 %v6, 0;");
            ins!(out, "setp.gt.{cmp} %p2, %v1, %v6;");
            ins!(out, "selp.b32 %v0, %v1, %v6, %p2;");
        }
        ElementwiseOp::Scale => {
            ins!(out, "ld.param.{cmp} %v5, [p_alpha];");
            ins!(out, "{} %v0, %v5, %v1;", ops.mul);
        }
        ElementwiseOp::Fma => ins!(out, "{} %v0, %v1, %v2, %v3;", ops.fma),
        ElementwiseOp::Exp => math::emit_exp(out, "%v0", "%v1", temps),
        ElementwiseOp::Tanh => math::emit_tanh(out, "%v0", "%v1", temps),
        ElementwiseOp::Sigmoid => math::emit_sigmoid(out, "%v0", "%v1", temps),
        ElementwiseOp::Rsqrt => math::emit_rsqrt(out, "%v0", "%v1", temps),
        ElementwiseOp::Erf => math::emit_erf(out, "%v0", "%v1", temps),
        ElementwiseOp::Gelu => math::emit_gelu(out, "%v0", "%v1", temps),
    }
    ins!(out, "st.global.b32 [%rd{}], %v0;", 10 + inputs);
}
