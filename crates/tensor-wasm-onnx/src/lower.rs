//! Lowering: the graph, for concrete input shapes, as a list of blueprint launches over
//! buffers (shape inference happens on the way). Ops that only change a shape (Reshape,
//! Flatten, Squeeze, Unsqueeze, Identity, a Transpose that moves only unit axes) launch
//! nothing: their output is their input's buffer. Broadcasting expands an operand to the
//! output's shape: a constant (a bias) here, into a new constant of the plan, anything else by
//! a `gather[rows]` launch with its indices computed here.

use std::time::Instant;

use tensor_wasm_jit::{Blueprint, ParamKind};

use crate::graph::{ConstData, Constant, Graph, GraphNode, Source, ValueId};
use crate::ops::{BinaryOp, Op, UnaryOp};

mod fuse;
mod ints;
mod nn;
mod shape;
#[cfg(test)]
mod tests;

use crate::{OnnxError, Result};
use shape::{index_bytes, reshape};

pub(crate) use nn::batchnorm_affine;

/// Where a tensor's bytes are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Slot {
    /// A constant of the plan ([`Lowered::consts`]).
    Const(usize),
    /// A buffer computed while running ([`Lowered::buffers`]).
    Buffer(usize),
}

/// The bytes of a plan constant.
#[derive(Debug, Clone, PartialEq)]
pub enum ConstBytes {
    /// A constant of the graph, f32 (weights).
    Value(ValueId),
    /// Bytes made while lowering (indices, fills).
    Owned(Vec<u8>),
}

/// A buffer's size and the launches that use it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BufferUse {
    /// Its size in bytes.
    pub bytes: usize,
    /// The first launch that writes it (0 for inputs).
    pub first: usize,
    /// The last launch that reads it (`usize::MAX` for outputs).
    pub last: usize,
}

/// An argument of a launch before the memory plan places buffers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arg {
    /// A tensor: the slot and the bytes the kernel's contract covers.
    Tensor(Slot, u64),
    /// A shape scalar.
    U32(u32),
    /// An f32 scalar.
    F32(f32),
}

/// One kernel launch.
#[derive(Debug, Clone, PartialEq)]
pub struct Launch {
    /// The kernel.
    pub blueprint: Blueprint,
    /// The grid covering the shape.
    pub config: tensor_wasm_gpu::LaunchConfig,
    /// Arguments in the blueprint's parameter order.
    pub args: Vec<Arg>,
    /// The node it computes (for messages).
    pub node: usize,
}

/// The graph lowered for one set of input shapes.
#[derive(Debug, Clone, PartialEq)]
pub struct Lowered {
    /// Constants the launches read.
    pub consts: Vec<ConstBytes>,
    /// Buffers, with their sizes and lifetimes.
    pub buffers: Vec<BufferUse>,
    /// The launches in order.
    pub launches: Vec<Launch>,
    /// Each graph input's slot (a buffer) and shape.
    pub inputs: Vec<(Slot, Vec<usize>)>,
    /// Each graph output's slot and shape.
    pub outputs: Vec<(Slot, Vec<usize>)>,
}

/// The largest element count of one tensor: every size a kernel takes is a u32.
const MAX_ELEMENTS: usize = u32::MAX as usize / 4;

/// The largest constant operand broadcasting expands while lowering (bytes, once per plan, in
/// the plan's arena); a larger one is expanded by a `gather[rows]` launch on each run.
const MAX_EXPANDED_CONSTANT: usize = 1 << 20;

fn elements(dims: &[usize]) -> Option<usize> {
    dims.iter().try_fold(1usize, |a, &d| a.checked_mul(d))
}

fn u32_of(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| OnnxError::too_large(format!("{what}: {v} is over 2^32")))
}

/// An axis attribute normalised against `rank` (negative counts from the end).
fn axis_of(axis: i64, rank: usize, what: &str) -> Result<usize> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if !((0..r.max(1)).contains(&a) || (r == 0 && a == 0)) {
        return Err(OnnxError::invalid_graph(format!(
            "{what}: axis {axis} is outside a tensor of rank {rank}"
        )));
    }
    Ok(a as usize)
}

/// numpy broadcasting of two shapes.
fn broadcast(a: &[usize], b: &[usize], what: &str) -> Result<Vec<usize>> {
    let rank = a.len().max(b.len());
    let pad = |s: &[usize], i: usize| {
        let lead = rank - s.len();
        if i < lead {
            1
        } else {
            s[i - lead]
        }
    };
    (0..rank)
        .map(|i| match (pad(a, i), pad(b, i)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            (x, y) => Err(OnnxError::invalid_graph(format!(
                "{what}: shapes {a:?} and {b:?} do not broadcast ({x} against {y})"
            ))),
        })
        .collect()
}

/// Lowers `graph` for the shapes of its inputs.
pub struct Lower<'g> {
    graph: &'g Graph,
    shapes: Vec<Option<Vec<usize>>>,
    /// int64 values computed when planning (shape arithmetic), by value.
    known: Vec<Option<Constant>>,
    slots: Vec<Option<Slot>>,
    out: Lowered,
    node: usize,
}

impl<'g> Lower<'g> {
    /// Lowers `graph` with `input_shapes` (one per graph input).
    /// With `fuse`, element-wise chains become `chain[..]` launches (the same bits).
    pub fn run(
        graph: &'g Graph,
        input_shapes: &[Vec<usize>],
        deadline: Option<Instant>,
        fuse: bool,
    ) -> Result<Lowered> {
        let mut lower = Lower {
            graph,
            shapes: vec![None; graph.values.len()],
            known: vec![None; graph.values.len()],
            slots: vec![None; graph.values.len()],
            out: Lowered {
                consts: Vec::new(),
                buffers: Vec::new(),
                launches: Vec::new(),
                inputs: Vec::new(),
                outputs: Vec::new(),
            },
            node: 0,
        };
        if input_shapes.len() != graph.inputs.len() {
            return Err(OnnxError::invalid_input(format!(
                "the graph has {} inputs, {} were given",
                graph.inputs.len(),
                input_shapes.len()
            )));
        }
        for (input, shape) in graph.inputs.iter().zip(input_shapes) {
            let n = elements(shape)
                .filter(|&n| n <= MAX_ELEMENTS)
                .ok_or_else(|| {
                    OnnxError::too_large(format!("input `{}`: shape {shape:?}", input.name))
                })?;
            let slot = lower.buffer(4 * n);
            lower.out.buffers[buffer_index(slot)].first = 0;
            lower.set(input.value, slot, shape.clone());
            lower.out.inputs.push((slot, shape.clone()));
        }
        for (i, node) in graph.nodes.iter().enumerate() {
            if let Some(d) = deadline {
                if Instant::now() >= d {
                    return Err(OnnxError::deadline("planning ran past its deadline"));
                }
            }
            lower.node = i;
            lower
                .lower_node(node)
                .map_err(|e| OnnxError::new(e.code, format!("{}: {}", node.what, e.message)))?;
        }
        for &value in &graph.outputs {
            let slot = lower.slot(value)?;
            lower.touch_at(slot, usize::MAX);
            let shape = lower.shape(value)?.to_vec();
            lower.out.outputs.push((slot, shape));
        }
        if fuse {
            fuse::fuse(&mut lower.out);
        }
        Ok(lower.out)
    }

    fn set(&mut self, value: ValueId, slot: Slot, shape: Vec<usize>) {
        self.slots[value] = Some(slot);
        self.shapes[value] = Some(shape);
    }

    /// The slot of `value`; a graph constant gets one on first use.
    fn slot(&mut self, value: ValueId) -> Result<Slot> {
        if let Some(slot) = self.slots[value] {
            return Ok(slot);
        }
        match &self.graph.values[value].source {
            Source::Constant(c) => {
                let bytes = match &c.data {
                    ConstData::F32(_) => ConstBytes::Value(value),
                    ConstData::I64(v) => ConstBytes::Owned(index_bytes(v, None)?),
                };
                let slot = Slot::Const(self.out.consts.len());
                self.out.consts.push(bytes);
                self.set(value, slot, c.dims.clone());
                Ok(slot)
            }
            _ => Err(OnnxError::invalid_graph(format!(
                "`{}` is read before it is computed",
                self.graph.values[value].name
            ))),
        }
    }

    fn shape(&self, value: ValueId) -> Result<&[usize]> {
        if let Some(shape) = &self.shapes[value] {
            return Ok(shape);
        }
        match &self.graph.values[value].source {
            Source::Constant(c) => Ok(&c.dims),
            _ => Err(OnnxError::invalid_graph(format!(
                "`{}` is read before it is computed",
                self.graph.values[value].name
            ))),
        }
    }

    fn buffer(&mut self, bytes: usize) -> Slot {
        let at = self.out.launches.len();
        self.out.buffers.push(BufferUse {
            bytes,
            first: at,
            last: at,
        });
        Slot::Buffer(self.out.buffers.len() - 1)
    }

    /// The bytes of plan constant `c`, little-endian (`None` for a graph constant that is not
    /// f32).
    fn const_bytes(&self, c: usize) -> Option<std::borrow::Cow<'_, [u8]>> {
        match &self.out.consts[c] {
            ConstBytes::Owned(bytes) => Some(std::borrow::Cow::Borrowed(bytes)),
            ConstBytes::Value(v) => match &self.graph.values[*v].source {
                Source::Constant(k) => match &k.data {
                    ConstData::F32(values) => Some(std::borrow::Cow::Owned(
                        values.iter().flat_map(|v| v.to_le_bytes()).collect(),
                    )),
                    _ => None,
                },
                _ => None,
            },
        }
    }

    fn constant(&mut self, bytes: Vec<u8>) -> Slot {
        self.out.consts.push(ConstBytes::Owned(bytes));
        Slot::Const(self.out.consts.len() - 1)
    }

    fn touch_at(&mut self, slot: Slot, at: usize) {
        if let Slot::Buffer(b) = slot {
            let use_ = &mut self.out.buffers[b];
            use_.last = use_.last.max(at);
        }
    }

    /// Emits `descriptor` over `tensors` (inputs, then the output) and the scalars.
    fn launch(
        &mut self,
        descriptor: &str,
        tensors: &[Slot],
        sizes: &[u32],
        floats: &[f32],
    ) -> Result<()> {
        let blueprint = Blueprint::parse(descriptor)
            .map_err(|e| OnnxError::unsupported(format!("kernel `{descriptor}`: {e}")))?;
        let shape = blueprint
            .shape(sizes)
            .ok_or_else(|| OnnxError::kernel(format!("kernel `{descriptor}`: wrong size count")))?;
        let config = blueprint
            .launch_config(&shape)
            .map_err(|e| OnnxError::too_large(format!("kernel `{descriptor}`: {e}")))?;
        let lens = blueprint.buffer_elements(&shape);
        let at = self.out.launches.len();
        let (mut t, mut s, mut f) = (0, 0, 0);
        let mut args = Vec::new();
        for param in blueprint.params() {
            match param.kind {
                ParamKind::Input | ParamKind::Output => {
                    let elements = lens[t].ok_or_else(|| {
                        OnnxError::too_large(format!("kernel `{descriptor}`: buffer size"))
                    })?;
                    args.push(Arg::Tensor(tensors[t], 4 * elements));
                    self.touch_at(tensors[t], at);
                    t += 1;
                }
                ParamKind::U32 => {
                    args.push(Arg::U32(sizes[s]));
                    s += 1;
                }
                ParamKind::F32 => {
                    args.push(Arg::F32(floats[f]));
                    f += 1;
                }
                ParamKind::I32 => {
                    return Err(OnnxError::kernel(format!(
                        "kernel `{descriptor}`: an i32 scalar"
                    )))
                }
            }
        }
        self.out.launches.push(Launch {
            blueprint,
            config,
            args,
            node: self.node,
        });
        Ok(())
    }

    /// A new buffer for `dims` f32 elements, or an error when too large.
    fn output(&mut self, dims: &[usize]) -> Result<Slot> {
        let n = elements(dims)
            .filter(|&n| n <= MAX_ELEMENTS)
            .ok_or_else(|| OnnxError::too_large(format!("an output of shape {dims:?}")))?;
        Ok(self.buffer(4 * n))
    }

    /// A constant of `n` copies of `value`.
    fn fill(&mut self, value: f32, n: usize) -> Slot {
        let bytes = std::iter::repeat_n(value.to_le_bytes(), n)
            .flatten()
            .collect();
        self.constant(bytes)
    }

    /// `slot` (of shape `from`) broadcast to `to`: itself when the layout is already `to`'s,
    /// else a `gather[rows]` copy of the rows it repeats.
    fn expand(&mut self, slot: Slot, from: &[usize], to: &[usize]) -> Result<Slot> {
        let rank = to.len();
        let lead = rank - from.len();
        let f: Vec<usize> = (0..rank)
            .map(|i| if i < lead { 1 } else { from[i - lead] })
            .collect();
        let total = elements(to).unwrap_or(usize::MAX);
        if elements(&f) == Some(total) {
            return Ok(slot);
        }
        // Columns: the longest suffix where the operand already has the output's dimensions.
        let mut k = rank;
        let mut cols = 1usize;
        while k > 0 && f[k - 1] == to[k - 1] {
            cols *= to[k - 1];
            k -= 1;
        }
        let rows_out = elements(&to[..k]).unwrap_or(usize::MAX);
        let table_rows = elements(&f[..k]).unwrap_or(usize::MAX);
        if rows_out > MAX_ELEMENTS || total > MAX_ELEMENTS {
            return Err(OnnxError::too_large(format!("broadcasting to {to:?}")));
        }
        let mut indices = Vec::with_capacity(rows_out * 4);
        let mut coords = vec![0usize; k];
        for _ in 0..rows_out {
            let mut index = 0usize;
            for i in 0..k {
                index = index * f[i] + if f[i] == 1 { 0 } else { coords[i] };
            }
            indices.extend_from_slice(&(index as i32).to_le_bytes());
            for i in (0..k).rev() {
                coords[i] += 1;
                if coords[i] < to[i] {
                    break;
                }
                coords[i] = 0;
            }
        }
        // A constant operand (a bias) is expanded now, once per plan: a copy of its rows into
        // a new constant, the same bytes the gather would write, with no launch.
        if let Slot::Const(c) = slot {
            let expanded = rows_out.saturating_mul(cols).saturating_mul(4);
            if expanded <= MAX_EXPANDED_CONSTANT {
                if let Some(table) = self.const_bytes(c) {
                    let row = 4 * cols;
                    let mut bytes = Vec::with_capacity(expanded);
                    for index in indices.chunks_exact(4) {
                        let i = i32::from_le_bytes(index.try_into().expect("4 bytes")) as usize;
                        bytes.extend_from_slice(&table[i * row..(i + 1) * row]);
                    }
                    return Ok(self.constant(bytes));
                }
            }
        }
        let indices = self.constant(indices);
        let out = self.output(to)?;
        if total > 0 {
            self.launch(
                "gather[rows]",
                &[slot, indices, out],
                &[
                    u32_of(table_rows, "gather rows")?,
                    u32_of(cols, "gather cols")?,
                    u32_of(rows_out, "gather indices")?,
                ],
                &[],
            )?;
        }
        Ok(out)
    }

    fn input(&mut self, node: &GraphNode, i: usize) -> Result<(Slot, Vec<usize>)> {
        let value = node
            .inputs
            .get(i)
            .copied()
            .flatten()
            .ok_or_else(|| OnnxError::invalid_graph(format!("input {i} is required")))?;
        let slot = self.slot(value)?;
        Ok((slot, self.shape(value)?.to_vec()))
    }

    fn optional(&mut self, node: &GraphNode, i: usize) -> Result<Option<(Slot, Vec<usize>)>> {
        match node.inputs.get(i).copied().flatten() {
            Some(_) => self.input(node, i).map(Some),
            None => Ok(None),
        }
    }

    /// The int64 constant at input `i` (shapes, axes).
    fn ints(&self, node: &GraphNode, i: usize) -> Result<Option<Vec<i64>>> {
        let Some(value) = node.inputs.get(i).copied().flatten() else {
            return Ok(None);
        };
        match self.graph.constant(value).or(self.known[value].as_ref()) {
            Some(Constant {
                data: ConstData::I64(v),
                ..
            }) => Ok(Some(v.clone())),
            _ => Err(OnnxError::unsupported(format!(
                "input {i} must be an int64 constant (or computed from shapes)"
            ))),
        }
    }

    fn result(&mut self, node: &GraphNode, slot: Slot, dims: Vec<usize>) -> Result<()> {
        let [output] = node.outputs.as_slice() else {
            return Err(OnnxError::invalid_graph("exactly one output is supported"));
        };
        self.set(*output, slot, dims);
        Ok(())
    }

    fn lower_node(&mut self, node: &GraphNode) -> Result<()> {
        if node.ints {
            return self.lower_ints(node);
        }
        match &node.op {
            Op::Binary(op) => self.binary(node, *op),
            Op::Unary(op) => {
                let (x, dims) = self.input(node, 0)?;
                let out = self.output(&dims)?;
                let n = u32_of(elements(&dims).unwrap_or(0), "elements")?;
                if n > 0 {
                    match op {
                        UnaryOp::Neg => {
                            self.launch("elementwise[scale]", &[x, out], &[n], &[-1.0])?
                        }
                        op => {
                            let name = match op {
                                UnaryOp::Relu => "relu",
                                UnaryOp::Exp => "exp",
                                UnaryOp::Tanh => "tanh",
                                UnaryOp::Sigmoid => "sigmoid",
                                UnaryOp::Erf => "erf",
                                _ => "gelu",
                            };
                            self.launch(&format!("elementwise[{name}]"), &[x, out], &[n], &[])?
                        }
                    }
                }
                self.result(node, out, dims)
            }
            Op::Identity => {
                let (x, dims) = self.input(node, 0)?;
                self.result(node, x, dims)
            }
            Op::MatMul => self.matmul(node),
            Op::Gemm {
                alpha,
                beta,
                trans_a,
                trans_b,
            } => self.gemm(node, *alpha, *beta, *trans_a, *trans_b),
            Op::Conv { window, group } => self.conv(node, *window, *group),
            Op::MaxPool(window) => self.pool(node, "maxpool", *window),
            Op::AveragePool(window) => self.pool(node, "avgpool", *window),
            Op::GlobalAveragePool => self.global_average(node),
            Op::Softmax { axis } => {
                let (x, dims) = self.input(node, 0)?;
                let a = axis_of(*axis, dims.len(), "Softmax")?;
                let out = self.output(&dims)?;
                let outer = elements(&dims[..a]).unwrap_or(1);
                let n = dims.get(a).copied().unwrap_or(1);
                let inner = elements(&dims[(a + 1).min(dims.len())..]).unwrap_or(1);
                if outer * n * inner > 0 {
                    self.launch(
                        "softmax[axis]",
                        &[x, out],
                        &[
                            u32_of(outer, "outer")?,
                            u32_of(n, "n")?,
                            u32_of(inner, "inner")?,
                        ],
                        &[],
                    )?;
                }
                self.result(node, out, dims)
            }
            Op::LayerNorm { axis, epsilon } => self.layernorm(node, *axis, *epsilon),
            Op::Transpose { perm } => self.transpose(node, perm.as_deref()),
            Op::Reshape { allow_zero } => {
                let (x, dims) = self.input(node, 0)?;
                let spec = self.ints(node, 1)?.unwrap_or_default();
                let shape = reshape(&dims, &spec, *allow_zero)?;
                self.result(node, x, shape)
            }
            Op::Flatten { axis } => {
                let (x, dims) = self.input(node, 0)?;
                let a = if *axis as usize == dims.len() && *axis >= 0 {
                    dims.len()
                } else {
                    axis_of(*axis, dims.len(), "Flatten")?
                };
                let shape = vec![
                    elements(&dims[..a]).unwrap_or(0),
                    elements(&dims[a..]).unwrap_or(0),
                ];
                self.result(node, x, shape)
            }
            Op::Squeeze => {
                let (x, dims) = self.input(node, 0)?;
                let shape = squeeze_dims(&dims, self.ints(node, 1)?)?;
                self.result(node, x, shape)
            }
            Op::Unsqueeze => {
                let (x, dims) = self.input(node, 0)?;
                let shape = unsqueeze_dims(&dims, &self.ints(node, 1)?.unwrap_or_default())?;
                self.result(node, x, shape)
            }
            Op::BatchNorm { epsilon } => self.batchnorm(node, *epsilon),
            Op::HardSigmoid { alpha, beta } => {
                let (x, dims) = self.input(node, 0)?;
                let out = self.hard_sigmoid(x, &dims, *alpha, *beta)?;
                self.result(node, out, dims)
            }
            Op::HardSwish => {
                let (x, dims) = self.input(node, 0)?;
                let h = self.hard_sigmoid(x, &dims, 1.0 / 6.0, 0.5)?;
                let n = u32_of(elements(&dims).unwrap_or(0), "elements")?;
                if n > 0 {
                    self.launch("elementwise[mul]", &[h, x, h], &[n], &[])?;
                }
                self.result(node, h, dims)
            }
            Op::Shape { .. } => Err(OnnxError::unsupported("Shape outside shape arithmetic")),
            Op::Slice => Err(OnnxError::unsupported(
                "Slice of a float tensor (only of int64 shape values)",
            )),
            Op::Concat { axis } => self.concat(node, *axis),
            Op::Gather => self.gather(node),
            Op::Reduce {
                kind,
                keep_dims,
                noop_with_empty_axes,
            } => self.reduce(node, *kind, *keep_dims, *noop_with_empty_axes),
        }
    }

    fn binary(&mut self, node: &GraphNode, op: BinaryOp) -> Result<()> {
        let (a, da) = self.input(node, 0)?;
        let (b, db) = self.input(node, 1)?;
        let dims = broadcast(&da, &db, "broadcasting")?;
        let n = elements(&dims).unwrap_or(usize::MAX);
        let out = self.output(&dims)?;
        if n == 0 {
            return self.result(node, out, dims);
        }
        // A product with one constant scalar is one `scale` (the same rounded product).
        if op == BinaryOp::Mul {
            for (x, dx, c) in [(a, &da, node.inputs[1]), (b, &db, node.inputs[0])] {
                let scalar = c
                    .and_then(|v| self.graph.constant(v))
                    .and_then(|k| match &k.data {
                        ConstData::F32(v) if v.len() == 1 => Some(v[0]),
                        _ => None,
                    });
                if let (Some(alpha), true) = (scalar, elements(dx) == Some(n)) {
                    self.launch(
                        "elementwise[scale]",
                        &[x, out],
                        &[u32_of(n, "n")?],
                        &[alpha],
                    )?;
                    return self.result(node, out, dims);
                }
            }
        }
        let a = self.expand(a, &da, &dims)?;
        let b = self.expand(b, &db, &dims)?;
        let descriptor = format!("elementwise[{}]", op.kernel());
        self.launch(&descriptor, &[a, b, out], &[u32_of(n, "n")?], &[])?;
        self.result(node, out, dims)
    }
}

fn buffer_index(slot: Slot) -> usize {
    match slot {
        Slot::Buffer(b) => b,
        Slot::Const(_) => unreachable!("inputs are buffers"),
    }
}

/// Squeeze's output dimensions: `axes` removed (each of size 1), or every unit axis.
fn squeeze_dims(dims: &[usize], axes: Option<Vec<i64>>) -> Result<Vec<usize>> {
    let axes = match axes {
        Some(axes) => axes
            .iter()
            .map(|&a| axis_of(a, dims.len(), "Squeeze"))
            .collect::<Result<Vec<_>>>()?,
        None => (0..dims.len()).filter(|&a| dims[a] == 1).collect(),
    };
    if axes.iter().any(|&a| dims[a] != 1) {
        return Err(OnnxError::invalid_graph(format!(
            "Squeeze of axes {axes:?} of {dims:?}"
        )));
    }
    Ok((0..dims.len())
        .filter(|a| !axes.contains(a))
        .map(|a| dims[a])
        .collect())
}

/// Unsqueeze's output dimensions: a unit axis at each of `axes`.
fn unsqueeze_dims(dims: &[usize], axes: &[i64]) -> Result<Vec<usize>> {
    let rank = dims.len() + axes.len();
    let mut axes = axes
        .iter()
        .map(|&a| axis_of(a, rank, "Unsqueeze"))
        .collect::<Result<Vec<_>>>()?;
    axes.sort_unstable();
    axes.dedup();
    if axes.len() + dims.len() != rank {
        return Err(OnnxError::invalid_graph("Unsqueeze: repeated axes"));
    }
    let mut rest = dims.iter();
    Ok((0..rank)
        .map(|a| {
            if axes.contains(&a) {
                1
            } else {
                *rest.next().expect("rank counts them")
            }
        })
        .collect())
}
