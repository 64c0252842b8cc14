//! The operators the executor runs: an ONNX node's type and attributes checked and turned into
//! an [`Op`], and each op's output shapes from its input shapes.
//!
//! Everything here is f32 (indices aside); an operator, attribute value or dtype outside what
//! is listed is refused with [`ErrorCode::Unsupported`](crate::ErrorCode) naming it.

use crate::proto::{Attribute, AttributeValue, Node};
use crate::{OnnxError, Result};

/// An element-wise operation of two tensors, with numpy broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinaryOp {
    /// `Add`.
    Add,
    /// `Sub`.
    Sub,
    /// `Mul`.
    Mul,
    /// `Div`.
    Div,
    /// `Max` of two inputs.
    Max,
    /// `Min` of two inputs.
    Min,
}

impl BinaryOp {
    /// The `elementwise[..]` operation computing it.
    pub fn kernel(self) -> &'static str {
        match self {
            BinaryOp::Add => "add",
            BinaryOp::Sub => "sub",
            BinaryOp::Mul => "mul",
            BinaryOp::Div => "div",
            BinaryOp::Max => "max",
            BinaryOp::Min => "min",
        }
    }
}

/// An element-wise function of one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// `Relu`.
    Relu,
    /// `Exp`.
    Exp,
    /// `Tanh`.
    Tanh,
    /// `Sigmoid`.
    Sigmoid,
    /// `Erf`.
    Erf,
    /// `Gelu` with `approximate = "none"`.
    Gelu,
    /// `Neg`: a multiplication by -1 (exact).
    Neg,
}

/// The reduction of `ReduceSum` and `ReduceMean`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceKind {
    /// `ReduceSum`.
    Sum,
    /// `ReduceMean`: the sum divided by the count.
    Mean,
}

/// A 2-D window: filter, one stride and one padding for both axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Filter height and width (`None` for Conv: taken from the weights).
    pub kernel: Option<[usize; 2]>,
    /// The stride of both axes.
    pub stride: usize,
    /// The padding of every side.
    pub pad: usize,
}

/// An operator with its attributes checked.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// `Add`, `Sub`, `Mul`, `Div`, `Max`, `Min`.
    Binary(BinaryOp),
    /// `Relu`, `Exp`, `Tanh`, `Sigmoid`, `Erf`, `Gelu`, `Neg`.
    Unary(UnaryOp),
    /// `Identity`, `Dropout` (inference): the output is the input.
    Identity,
    /// `MatMul` (numpy semantics, batched).
    MatMul,
    /// `Gemm`: `alpha · op(A) · op(B) + beta · C`.
    Gemm {
        /// `alpha`.
        alpha: f32,
        /// `beta`.
        beta: f32,
        /// `transA`.
        trans_a: bool,
        /// `transB`.
        trans_b: bool,
    },
    /// `Conv` (2-D, no dilation; one group, or depthwise: one group per channel).
    Conv {
        /// The window.
        window: Window,
        /// `group`: 1, or the channel count (depthwise).
        group: usize,
    },
    /// `MaxPool` (2-D).
    MaxPool(Window),
    /// `AveragePool` (2-D, padding not counted).
    AveragePool(Window),
    /// `GlobalAveragePool` (2-D).
    GlobalAveragePool,
    /// `Softmax` along `axis`.
    Softmax {
        /// The axis (negative counts from the end).
        axis: i64,
    },
    /// `LayerNormalization` over the axes from `axis` on.
    LayerNorm {
        /// The first normalised axis.
        axis: i64,
        /// `epsilon`.
        epsilon: f32,
    },
    /// `Transpose` (`None`: the axes reversed).
    Transpose {
        /// `perm`.
        perm: Option<Vec<i64>>,
    },
    /// `Reshape` (the shape is the constant second input).
    Reshape {
        /// `allowzero`.
        allow_zero: bool,
    },
    /// `Flatten` at `axis`.
    Flatten {
        /// `axis`.
        axis: i64,
    },
    /// `Squeeze` (axes: the optional constant second input).
    Squeeze,
    /// `Unsqueeze` (axes: the constant second input).
    Unsqueeze,
    /// `Concat` along `axis`.
    Concat {
        /// `axis`.
        axis: i64,
    },
    /// `Gather` along axis 0.
    Gather,
    /// `BatchNormalization` (inference): per channel `(x − mean) / sqrt(var + ε) · scale + B`,
    /// all four parameters constants (folded into a preceding Conv when it is the only reader).
    BatchNorm {
        /// `epsilon`.
        epsilon: f32,
    },
    /// `HardSigmoid`: `max(0, min(1, α·x + β))`.
    HardSigmoid {
        /// `alpha`.
        alpha: f32,
        /// `beta`.
        beta: f32,
    },
    /// `HardSwish`: `x · HardSigmoid(x)` with α = 1/6, β = 0.5.
    HardSwish,
    /// `Shape`: the input's dimensions (from `start` to `end`) as int64, known when planning.
    Shape {
        /// `start`.
        start: i64,
        /// `end`, when given.
        end: Option<i64>,
    },
    /// `Slice` of int64 values known when planning (shape arithmetic); starts, ends, axes and
    /// steps are its constant inputs 1 to 4.
    Slice,
    /// `ReduceSum`, `ReduceMean` (axes: the optional constant second input).
    Reduce {
        /// Which reduction.
        kind: ReduceKind,
        /// `keepdims`.
        keep_dims: bool,
        /// `noop_with_empty_axes`.
        noop_with_empty_axes: bool,
    },
}

/// Every operator type the executor runs, for documentation and error messages.
pub const SUPPORTED: &[&str] = &[
    "Add",
    "Sub",
    "Mul",
    "Div",
    "Max",
    "Min",
    "Relu",
    "Exp",
    "Tanh",
    "Sigmoid",
    "Erf",
    "Gelu",
    "Neg",
    "Identity",
    "Dropout",
    "MatMul",
    "Gemm",
    "Conv",
    "MaxPool",
    "AveragePool",
    "GlobalAveragePool",
    "Softmax",
    "LayerNormalization",
    "Transpose",
    "Reshape",
    "Flatten",
    "Squeeze",
    "Unsqueeze",
    "Concat",
    "Gather",
    "ReduceSum",
    "ReduceMean",
    "Constant",
    "BatchNormalization",
    "HardSigmoid",
    "HardSwish",
    "Shape",
    "Slice",
];

/// The attributes of one node, read by name; every read one is marked, so attributes the
/// executor does not know can be refused.
struct Attrs<'a> {
    node: &'a Node,
    what: String,
}

impl<'a> Attrs<'a> {
    fn new(node: &'a Node, index: usize) -> Self {
        Attrs {
            node,
            what: describe(node, index),
        }
    }

    fn get(&self, name: &str) -> Option<&'a Attribute> {
        self.node.attributes.iter().find(|a| a.name == name)
    }

    fn unsupported(&self, message: impl std::fmt::Display) -> OnnxError {
        OnnxError::unsupported(format!("{}: {message}", self.what))
    }

    fn int(&self, name: &str, default: i64) -> Result<i64> {
        match self.get(name).map(|a| &a.value) {
            None => Ok(default),
            Some(AttributeValue::Int(v)) => Ok(*v),
            Some(_) => Err(self.mistyped(name, "an int")),
        }
    }

    fn float(&self, name: &str, default: f32) -> Result<f32> {
        match self.get(name).map(|a| &a.value) {
            None => Ok(default),
            Some(AttributeValue::Float(v)) => Ok(*v),
            Some(_) => Err(self.mistyped(name, "a float")),
        }
    }

    fn ints(&self, name: &str) -> Result<Option<&'a [i64]>> {
        match self.get(name).map(|a| &a.value) {
            None => Ok(None),
            Some(AttributeValue::Ints(v)) => Ok(Some(v)),
            Some(_) => Err(self.mistyped(name, "a list of ints")),
        }
    }

    fn string(&self, name: &str) -> Result<Option<&'a [u8]>> {
        match self.get(name).map(|a| &a.value) {
            None => Ok(None),
            Some(AttributeValue::String(v)) => Ok(Some(v)),
            Some(_) => Err(self.mistyped(name, "a string")),
        }
    }

    fn mistyped(&self, name: &str, want: &str) -> OnnxError {
        OnnxError::invalid_graph(format!("{}: attribute `{name}` must be {want}", self.what))
    }

    /// Refuses any attribute not in `known`.
    fn only(&self, known: &[&str]) -> Result<()> {
        match self
            .node
            .attributes
            .iter()
            .find(|a| !known.contains(&a.name.as_str()))
        {
            Some(a) => Err(self.unsupported(format_args!("attribute `{}`", a.name))),
            None => Ok(()),
        }
    }

    /// A 2-D window from `kernel_shape`, `strides`, `pads`, `dilations`, `auto_pad`.
    fn window(&self, needs_kernel: bool) -> Result<Window> {
        let kernel = match self.ints("kernel_shape")? {
            Some(&[r, s]) if r > 0 && s > 0 => Some([r as usize, s as usize]),
            Some(other) => {
                return Err(
                    self.unsupported(format_args!("kernel_shape {other:?} (2-D windows only)"))
                )
            }
            None if needs_kernel => {
                return Err(OnnxError::invalid_graph(format!(
                    "{}: kernel_shape is required",
                    self.what
                )))
            }
            None => None,
        };
        let stride = match self.ints("strides")? {
            None => 1,
            Some(&[a, b]) if a == b && a > 0 => a as usize,
            Some(other) => {
                return Err(self.unsupported(format_args!(
                    "strides {other:?} (one stride for both axes only)"
                )))
            }
        };
        let pad = match self.ints("pads")? {
            None => 0,
            Some(&[a, b, c, d]) if a == b && b == c && c == d && a >= 0 => a as usize,
            Some(other) => {
                return Err(self.unsupported(format_args!(
                    "pads {other:?} (the same padding on every side only)"
                )))
            }
        };
        if let Some(d) = self.ints("dilations")? {
            if d.iter().any(|&v| v != 1) {
                return Err(self.unsupported(format_args!("dilations {d:?}")));
            }
        }
        match self.string("auto_pad")? {
            None | Some(b"NOTSET") => {}
            Some(b"VALID") if pad == 0 => {}
            Some(other) => {
                return Err(self.unsupported(format_args!(
                    "auto_pad {:?}",
                    String::from_utf8_lossy(other)
                )))
            }
        }
        Ok(Window {
            kernel,
            stride,
            pad,
        })
    }
}

/// `node` (the `index`-th of the graph) as text for messages: "node 3 (`Conv` conv1)".
pub fn describe(node: &Node, index: usize) -> String {
    if node.name.is_empty() {
        format!("node {index} (`{}`)", node.op_type)
    } else {
        format!("node {index} (`{}` {})", node.op_type, node.name)
    }
}

impl Op {
    /// The op of `node` (the graph's `index`-th), its attributes checked. `Constant` nodes
    /// are not ops (the graph turns them into constants first).
    pub fn from_node(node: &Node, index: usize) -> Result<Op> {
        let a = Attrs::new(node, index);
        if !node.domain.is_empty() && node.domain != "ai.onnx" {
            return Err(a.unsupported(format_args!(
                "operator domain `{}` (only the default ONNX domain)",
                node.domain
            )));
        }
        let op = match node.op_type.as_str() {
            "Add" | "Sub" | "Mul" | "Div" | "Max" | "Min" => {
                a.only(&[])?;
                if node.inputs.len() != 2 {
                    return Err(a.unsupported(format_args!(
                        "{} inputs (exactly two are supported)",
                        node.inputs.len()
                    )));
                }
                Op::Binary(match node.op_type.as_str() {
                    "Add" => BinaryOp::Add,
                    "Sub" => BinaryOp::Sub,
                    "Mul" => BinaryOp::Mul,
                    "Div" => BinaryOp::Div,
                    "Max" => BinaryOp::Max,
                    _ => BinaryOp::Min,
                })
            }
            "Relu" | "Exp" | "Tanh" | "Sigmoid" | "Erf" | "Neg" => {
                a.only(&[])?;
                Op::Unary(match node.op_type.as_str() {
                    "Relu" => UnaryOp::Relu,
                    "Exp" => UnaryOp::Exp,
                    "Tanh" => UnaryOp::Tanh,
                    "Sigmoid" => UnaryOp::Sigmoid,
                    "Erf" => UnaryOp::Erf,
                    _ => UnaryOp::Neg,
                })
            }
            "Gelu" => {
                a.only(&["approximate"])?;
                match a.string("approximate")? {
                    None | Some(b"none") => Op::Unary(UnaryOp::Gelu),
                    Some(other) => {
                        return Err(a.unsupported(format_args!(
                            "approximate = {:?} (only \"none\")",
                            String::from_utf8_lossy(other)
                        )))
                    }
                }
            }
            "Identity" => {
                a.only(&[])?;
                Op::Identity
            }
            "Dropout" => {
                a.only(&["seed"])?;
                if node.outputs.len() > 1 && !node.outputs[1].is_empty() {
                    return Err(a.unsupported("the mask output"));
                }
                if node.inputs.get(2).is_some_and(|t| !t.is_empty()) {
                    return Err(a.unsupported("training_mode (inference only)"));
                }
                Op::Identity
            }
            "MatMul" => {
                a.only(&[])?;
                Op::MatMul
            }
            "Gemm" => {
                a.only(&["alpha", "beta", "transA", "transB"])?;
                Op::Gemm {
                    alpha: a.float("alpha", 1.0)?,
                    beta: a.float("beta", 1.0)?,
                    trans_a: a.int("transA", 0)? != 0,
                    trans_b: a.int("transB", 0)? != 0,
                }
            }
            "Conv" => {
                a.only(&[
                    "kernel_shape",
                    "strides",
                    "pads",
                    "dilations",
                    "auto_pad",
                    "group",
                ])?;
                let group = a.int("group", 1)?;
                if group < 1 {
                    return Err(a.unsupported(format_args!("group = {group}")));
                }
                Op::Conv {
                    window: a.window(false)?,
                    group: group as usize,
                }
            }
            "MaxPool" => {
                a.only(&[
                    "kernel_shape",
                    "strides",
                    "pads",
                    "dilations",
                    "auto_pad",
                    "ceil_mode",
                    "storage_order",
                ])?;
                if a.int("ceil_mode", 0)? != 0 || a.int("storage_order", 0)? != 0 {
                    return Err(a.unsupported("ceil_mode or storage_order other than 0"));
                }
                if node.outputs.len() > 1 && !node.outputs[1].is_empty() {
                    return Err(a.unsupported("the Indices output"));
                }
                Op::MaxPool(a.window(true)?)
            }
            "AveragePool" => {
                a.only(&[
                    "kernel_shape",
                    "strides",
                    "pads",
                    "dilations",
                    "auto_pad",
                    "ceil_mode",
                    "count_include_pad",
                ])?;
                if a.int("ceil_mode", 0)? != 0 {
                    return Err(a.unsupported("ceil_mode = 1"));
                }
                let window = a.window(true)?;
                if a.int("count_include_pad", 0)? != 0 && window.pad > 0 {
                    return Err(a.unsupported("count_include_pad = 1 with padding"));
                }
                Op::AveragePool(window)
            }
            "GlobalAveragePool" => {
                a.only(&[])?;
                Op::GlobalAveragePool
            }
            "Softmax" => {
                a.only(&["axis"])?;
                Op::Softmax {
                    axis: a.int("axis", -1)?,
                }
            }
            "LayerNormalization" => {
                a.only(&["axis", "epsilon", "stash_type"])?;
                if node.outputs.iter().skip(1).any(|o| !o.is_empty()) {
                    return Err(a.unsupported("the Mean and InvStdDev outputs"));
                }
                Op::LayerNorm {
                    axis: a.int("axis", -1)?,
                    epsilon: a.float("epsilon", 1e-5)?,
                }
            }
            "Transpose" => {
                a.only(&["perm"])?;
                Op::Transpose {
                    perm: a.ints("perm")?.map(<[i64]>::to_vec),
                }
            }
            "Reshape" => {
                a.only(&["allowzero"])?;
                Op::Reshape {
                    allow_zero: a.int("allowzero", 0)? != 0,
                }
            }
            "Flatten" => {
                a.only(&["axis"])?;
                Op::Flatten {
                    axis: a.int("axis", 1)?,
                }
            }
            "Squeeze" => {
                a.only(&[])?;
                Op::Squeeze
            }
            "Unsqueeze" => {
                a.only(&[])?;
                Op::Unsqueeze
            }
            "Concat" => {
                a.only(&["axis"])?;
                Op::Concat {
                    axis: a.int("axis", 0)?,
                }
            }
            "Gather" => {
                a.only(&["axis"])?;
                let axis = a.int("axis", 0)?;
                if axis != 0 {
                    return Err(a.unsupported(format_args!("axis = {axis} (only 0)")));
                }
                Op::Gather
            }
            "ReduceSum" | "ReduceMean" => {
                a.only(&["keepdims", "noop_with_empty_axes"])?;
                Op::Reduce {
                    kind: if node.op_type == "ReduceSum" {
                        ReduceKind::Sum
                    } else {
                        ReduceKind::Mean
                    },
                    keep_dims: a.int("keepdims", 1)? != 0,
                    noop_with_empty_axes: a.int("noop_with_empty_axes", 0)? != 0,
                }
            }
            "BatchNormalization" => {
                a.only(&["epsilon", "momentum", "training_mode"])?;
                if a.int("training_mode", 0)? != 0
                    || node.outputs.iter().skip(1).any(|o| !o.is_empty())
                {
                    return Err(a.unsupported("training mode (inference only)"));
                }
                Op::BatchNorm {
                    epsilon: a.float("epsilon", 1e-5)?,
                }
            }
            "HardSigmoid" => {
                a.only(&["alpha", "beta"])?;
                Op::HardSigmoid {
                    alpha: a.float("alpha", 0.2)?,
                    beta: a.float("beta", 0.5)?,
                }
            }
            "HardSwish" => {
                a.only(&[])?;
                Op::HardSwish
            }
            "Shape" => {
                a.only(&["start", "end"])?;
                Op::Shape {
                    start: a.int("start", 0)?,
                    end: match a.get("end") {
                        Some(_) => Some(a.int("end", 0)?),
                        None => None,
                    },
                }
            }
            "Slice" => {
                a.only(&[])?;
                Op::Slice
            }
            other => {
                return Err(OnnxError::unsupported(format!(
                    "{}: operator `{other}` is not supported (supported: {})",
                    describe(node, index),
                    SUPPORTED.join(", ")
                )))
            }
        };
        Ok(op)
    }

    /// Which inputs must be constants known when the graph is loaded (shapes, axes).
    pub fn constant_inputs(&self) -> &'static [usize] {
        match self {
            Op::Reshape { .. } | Op::Squeeze | Op::Unsqueeze | Op::Reduce { .. } => &[1],
            Op::Slice => &[1, 2, 3, 4],
            _ => &[],
        }
    }

    /// Whether the op computes int64 values when planning (shape arithmetic) given int64
    /// data: its outputs are then known numbers, not a tensor in memory.
    pub fn passes_ints(&self) -> bool {
        matches!(
            self,
            Op::Slice | Op::Concat { .. } | Op::Unsqueeze | Op::Squeeze | Op::Identity | Op::Gather
        )
    }

    /// Which inputs hold indices (i32 in the executor) rather than f32 data.
    pub fn index_inputs(&self) -> &'static [usize] {
        match self {
            Op::Gather => &[1],
            _ => &[],
        }
    }
}
