//! A decoded ONNX model checked into the executor's graph: every value defined once, nodes in
//! an order where each reads only values defined before it (a cycle is refused), every
//! operator known with its attributes checked, and every tensor float32 except indices,
//! shapes and axes.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use crate::ops::{describe, Op};
use crate::proto::{data_type, AttributeValue, Dim, Model, Node, Tensor};
use crate::{OnnxError, Result};

/// A value's index in [`Graph::values`].
pub type ValueId = usize;

/// The element type a value has in the executor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Elem {
    /// float32 data.
    F32,
    /// Indices (an int64 or int32 graph input, held as i32).
    Index,
    /// An int64 constant (shapes, axes, indices).
    I64,
}

/// A constant tensor: an initializer, a `Constant` node or a folded subgraph.
#[derive(Debug, Clone, PartialEq)]
pub struct Constant {
    /// Its dimensions.
    pub dims: Vec<usize>,
    /// Its elements.
    pub data: ConstData,
}

/// The elements of a [`Constant`].
#[derive(Debug, Clone, PartialEq)]
pub enum ConstData {
    /// float32.
    F32(Vec<f32>),
    /// int64 (int32 initializers are widened).
    I64(Vec<i64>),
}

impl Constant {
    /// Elements it holds.
    pub fn len(&self) -> usize {
        match &self.data {
            ConstData::F32(v) => v.len(),
            ConstData::I64(v) => v.len(),
        }
    }

    /// Whether it holds no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its executor element type.
    pub fn elem(&self) -> Elem {
        match self.data {
            ConstData::F32(_) => Elem::F32,
            ConstData::I64(_) => Elem::I64,
        }
    }
}

/// Where a value comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// The graph input of this index (in [`Graph::inputs`]).
    Input(usize),
    /// A constant.
    Constant(Constant),
    /// An output of the node of this index (in [`Graph::nodes`]).
    Node(usize),
}

/// A value of the graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Value {
    /// Its ONNX name.
    pub name: String,
    /// Where it comes from.
    pub source: Source,
}

/// One dimension of a graph input as declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InputDim {
    /// A fixed size.
    Fixed(usize),
    /// Any size (a `dim_param` such as a batch dimension, or an unnamed one).
    Dynamic(String),
}

/// A graph input as declared.
#[derive(Debug, Clone, PartialEq)]
pub struct Input {
    /// Its value.
    pub value: ValueId,
    /// Its name.
    pub name: String,
    /// Its executor element type ([`Elem::F32`] or [`Elem::Index`]).
    pub elem: Elem,
    /// Its ONNX data type (`proto::data_type`).
    pub onnx_type: i32,
    /// Its declared dimensions, when declared.
    pub dims: Option<Vec<InputDim>>,
}

/// A node with its operator checked and its inputs and outputs resolved.
#[derive(Debug, Clone, PartialEq)]
pub struct GraphNode {
    /// The operator.
    pub op: Op,
    /// Inputs in order; `None` for an absent optional input.
    pub inputs: Vec<Option<ValueId>>,
    /// Outputs in order (absent optional outputs dropped).
    pub outputs: Vec<ValueId>,
    /// The node as text for messages.
    pub what: String,
    /// Whether its outputs are int64 values computed when planning (shape arithmetic:
    /// `Shape`, and ops passing such values on), not tensors in memory.
    pub ints: bool,
}

/// A checked graph, nodes in execution order.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// Every value.
    pub values: Vec<Value>,
    /// The nodes, each after the nodes it reads from.
    pub nodes: Vec<GraphNode>,
    /// The graph inputs that are not initializers.
    pub inputs: Vec<Input>,
    /// The graph outputs.
    pub outputs: Vec<ValueId>,
}

/// Lowest opset of the default domain accepted: the operators' semantics used here (axes as
/// inputs of Squeeze, Unsqueeze and ReduceSum; Softmax along one axis) date from opset 13.
pub const MIN_OPSET: i64 = 13;

fn check_deadline(deadline: Option<Instant>) -> Result<()> {
    match deadline {
        Some(d) if Instant::now() >= d => Err(OnnxError::deadline(
            "loading the model ran past its deadline",
        )),
        _ => Ok(()),
    }
}

/// A constant from an initializer or a `Constant` node's tensor.
pub fn constant_of(tensor: &Tensor, what: &str) -> Result<Constant> {
    let dims = tensor
        .dims
        .iter()
        .map(|&d| usize::try_from(d))
        .collect::<std::result::Result<Vec<usize>, _>>()
        .map_err(|_| OnnxError::malformed(format!("{what}: negative dimension")))?;
    let data = match tensor.data_type {
        data_type::FLOAT => ConstData::F32(
            tensor
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect(),
        ),
        data_type::INT64 => ConstData::I64(
            tensor
                .data
                .chunks_exact(8)
                .map(|b| i64::from_le_bytes(b.try_into().expect("8 bytes")))
                .collect(),
        ),
        data_type::INT32 => ConstData::I64(
            tensor
                .data
                .chunks_exact(4)
                .map(|b| i64::from(i32::from_le_bytes([b[0], b[1], b[2], b[3]])))
                .collect(),
        ),
        other => {
            return Err(OnnxError::unsupported(format!(
                "{what}: dtype {} (only float32, and int64/int32 for shapes, axes and indices)",
                data_type::name(other)
            )))
        }
    };
    let constant = Constant { dims, data };
    let expected = constant
        .dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d));
    if expected != Some(constant.len()) {
        return Err(OnnxError::malformed(format!(
            "{what}: {} elements for dimensions {:?}",
            constant.len(),
            constant.dims
        )));
    }
    Ok(constant)
}

/// The constant a `Constant` node defines.
fn constant_node(node: &Node, index: usize) -> Result<Constant> {
    let what = describe(node, index);
    let [attribute] = node.attributes.as_slice() else {
        return Err(OnnxError::invalid_graph(format!(
            "{what}: a Constant has exactly one attribute"
        )));
    };
    Ok(match (&*attribute.name, &attribute.value) {
        ("value", AttributeValue::Tensor(t)) => constant_of(t, &what)?,
        ("value_float", AttributeValue::Float(v)) => Constant {
            dims: vec![],
            data: ConstData::F32(vec![*v]),
        },
        ("value_floats", AttributeValue::Floats(v)) => Constant {
            dims: vec![v.len()],
            data: ConstData::F32(v.clone()),
        },
        ("value_int", AttributeValue::Int(v)) => Constant {
            dims: vec![],
            data: ConstData::I64(vec![*v]),
        },
        ("value_ints", AttributeValue::Ints(v)) => Constant {
            dims: vec![v.len()],
            data: ConstData::I64(v.clone()),
        },
        (name, _) => {
            return Err(OnnxError::unsupported(format!(
                "{what}: attribute `{name}` of this type"
            )))
        }
    })
}

impl Graph {
    /// Checks `model` into a graph; `deadline` bounds the work.
    pub fn build(model: &Model, deadline: Option<Instant>) -> Result<Graph> {
        for opset in &model.opsets {
            if (opset.domain.is_empty() || opset.domain == "ai.onnx") && opset.version < MIN_OPSET {
                return Err(OnnxError::unsupported(format!(
                    "opset {} of the default domain (at least {MIN_OPSET})",
                    opset.version
                )));
            }
        }
        let g = &model.graph;
        let mut names = Names::default();
        for t in &g.initializers {
            let constant = constant_of(t, &format!("initializer `{}`", t.name))?;
            names.define(&t.name, Source::Constant(constant))?;
        }
        let initializer_names: std::collections::HashSet<&str> =
            g.initializers.iter().map(|t| t.name.as_str()).collect();
        let mut inputs = Vec::new();
        for info in &g.inputs {
            if initializer_names.contains(info.name.as_str()) {
                continue;
            }
            let elem = match info.elem_type {
                data_type::FLOAT => Elem::F32,
                data_type::INT64 | data_type::INT32 => Elem::Index,
                other => {
                    return Err(OnnxError::unsupported(format!(
                        "graph input `{}` has dtype {} (only float32, and int64/int32 indices)",
                        info.name,
                        data_type::name(other)
                    )))
                }
            };
            let dims = info.shape.as_ref().map(|dims| {
                dims.iter()
                    .map(|d| match d {
                        Dim::Value(v) if *v >= 0 => InputDim::Fixed(*v as usize),
                        Dim::Param(p) => InputDim::Dynamic(p.clone()),
                        _ => InputDim::Dynamic(String::new()),
                    })
                    .collect()
            });
            let value = names.define(&info.name, Source::Input(inputs.len()))?;
            inputs.push(Input {
                value,
                name: info.name.clone(),
                elem,
                onnx_type: info.elem_type,
                dims,
            });
        }

        // Execution order (Kahn): a node is ready once every value it reads is defined.
        let produced: HashMap<&str, usize> = g
            .nodes
            .iter()
            .enumerate()
            .flat_map(|(i, n)| n.outputs.iter().map(move |o| (o.as_str(), i)))
            .filter(|(o, _)| !o.is_empty())
            .collect();
        let mut waiting = vec![0usize; g.nodes.len()];
        let mut readers: Vec<Vec<usize>> = vec![Vec::new(); g.nodes.len()];
        for (i, node) in g.nodes.iter().enumerate() {
            for input in node.inputs.iter().filter(|s| !s.is_empty()) {
                if let Some(&p) = produced.get(input.as_str()) {
                    waiting[i] += 1;
                    readers[p].push(i);
                } else if !names.by_name.contains_key(input.as_str()) {
                    return Err(OnnxError::invalid_graph(format!(
                        "{} reads `{input}`, which nothing defines",
                        describe(node, i)
                    )));
                }
            }
        }
        let mut ready: VecDeque<usize> = (0..g.nodes.len()).filter(|&i| waiting[i] == 0).collect();
        let mut nodes: Vec<GraphNode> = Vec::with_capacity(g.nodes.len());
        let mut done = 0;
        while let Some(i) = ready.pop_front() {
            if done % 256 == 0 {
                check_deadline(deadline)?;
            }
            done += 1;
            let node = &g.nodes[i];
            let what = describe(node, i);
            if node.op_type == "Constant" && (node.domain.is_empty() || node.domain == "ai.onnx") {
                let constant = constant_node(node, i)?;
                let [output] = node.outputs.as_slice() else {
                    return Err(OnnxError::invalid_graph(format!("{what}: one output")));
                };
                names.define(output, Source::Constant(constant))?;
            } else {
                let op = Op::from_node(node, i)?;
                let inputs: Vec<Option<ValueId>> = node
                    .inputs
                    .iter()
                    .map(|s| (!s.is_empty()).then(|| names.by_name[s.as_str()]))
                    .collect();
                let int_data = |v: ValueId| match &names.values[v].source {
                    Source::Constant(c) => c.elem() == Elem::I64,
                    Source::Node(k) => nodes[*k].ints,
                    Source::Input(_) => false,
                };
                let ints = matches!(op, Op::Shape { .. })
                    || (op.passes_ints()
                        && inputs.first().copied().flatten().is_some_and(int_data));
                let index = nodes.len();
                let mut outputs = Vec::new();
                for output in node.outputs.iter().filter(|o| !o.is_empty()) {
                    outputs.push(names.define(output, Source::Node(index))?);
                }
                nodes.push(GraphNode {
                    op,
                    inputs,
                    outputs,
                    what,
                    ints,
                });
            }
            for &r in &readers[i] {
                waiting[r] -= 1;
                if waiting[r] == 0 {
                    ready.push_back(r);
                }
            }
        }
        if done != g.nodes.len() {
            let stuck = (0..g.nodes.len()).find(|&i| waiting[i] > 0).unwrap_or(0);
            return Err(OnnxError::invalid_graph(format!(
                "the graph has a cycle through {}",
                describe(&g.nodes[stuck], stuck)
            )));
        }
        let mut outputs = Vec::new();
        for info in &g.outputs {
            let Some(&id) = names.by_name.get(info.name.as_str()) else {
                return Err(OnnxError::invalid_graph(format!(
                    "graph output `{}` is not produced by any node",
                    info.name
                )));
            };
            outputs.push(id);
        }
        if outputs.is_empty() {
            return Err(OnnxError::invalid_graph("the graph has no output"));
        }
        let graph = Graph {
            values: names.values,
            nodes,
            inputs,
            outputs,
        };
        graph.check_types()?;
        graph.check_groups()?;
        Ok(graph)
    }

    /// The executor element type of `value`.
    pub fn elem(&self, value: ValueId) -> Elem {
        match &self.values[value].source {
            Source::Input(i) => self.inputs[*i].elem,
            Source::Constant(c) => c.elem(),
            Source::Node(n) if self.nodes[*n].ints => Elem::I64,
            Source::Node(_) => Elem::F32,
        }
    }

    /// The constant `value` is, if it is one.
    pub fn constant(&self, value: ValueId) -> Option<&Constant> {
        match &self.values[value].source {
            Source::Constant(c) => Some(c),
            _ => None,
        }
    }

    /// A grouped Conv is depthwise: its weights are a constant `[group, 1, R, S]` (one filter
    /// per channel); other groupings are refused when the model is loaded.
    fn check_groups(&self) -> Result<()> {
        for node in &self.nodes {
            let Op::Conv { group, .. } = node.op else {
                continue;
            };
            if group == 1 {
                continue;
            }
            let weight = node
                .inputs
                .get(1)
                .copied()
                .flatten()
                .and_then(|w| self.constant(w));
            let depthwise =
                weight.is_some_and(|w| w.dims.len() == 4 && w.dims[0] == group && w.dims[1] == 1);
            if !depthwise {
                return Err(OnnxError::unsupported(format!(
                    "{}: group = {group} (one group, or depthwise: constant weights of \
                     [group, 1, R, S])",
                    node.what
                )));
            }
        }
        Ok(())
    }

    /// Every input of every node has the type its operator reads there: float32 data,
    /// indices where indices go, constants where shapes and axes go; graph outputs are
    /// float32.
    fn check_types(&self) -> Result<()> {
        for node in &self.nodes {
            for (slot, input) in node.inputs.iter().enumerate() {
                let Some(value) = *input else { continue };
                let name = &self.values[value].name;
                let elem = self.elem(value);
                let ok = if matches!(node.op, Op::Shape { .. }) {
                    true
                } else if node.op.constant_inputs().contains(&slot) || node.ints {
                    elem == Elem::I64
                } else if node.op.index_inputs().contains(&slot) {
                    matches!(elem, Elem::Index | Elem::I64)
                } else {
                    elem == Elem::F32
                };
                if !ok {
                    let dtype = match &self.values[value].source {
                        Source::Input(i) => data_type::name(self.inputs[*i].onnx_type),
                        _ if elem == Elem::F32 => "float32",
                        _ => "int64",
                    };
                    let want = if node.op.constant_inputs().contains(&slot) {
                        "an int64 constant (initializer or Constant node)"
                    } else if node.op.index_inputs().contains(&slot) {
                        "int64 or int32 indices"
                    } else {
                        "float32 (the only data type this executor computes in)"
                    };
                    return Err(OnnxError::unsupported(format!(
                        "{}: input {slot} `{name}` is {dtype}; it must be {want}",
                        node.what
                    )));
                }
            }
        }
        for &output in &self.outputs {
            if self.elem(output) != Elem::F32 {
                return Err(OnnxError::unsupported(format!(
                    "graph output `{}` is not float32",
                    self.values[output].name
                )));
            }
        }
        Ok(())
    }
}

/// Values defined so far, by name.
#[derive(Default)]
struct Names<'m> {
    values: Vec<Value>,
    by_name: HashMap<&'m str, ValueId>,
}

impl<'m> Names<'m> {
    /// Defines the value `name`; a name defined twice is refused.
    fn define(&mut self, name: &'m str, source: Source) -> Result<ValueId> {
        if name.is_empty() {
            return Err(OnnxError::invalid_graph("a value without a name"));
        }
        let id = self.values.len();
        if self.by_name.insert(name, id).is_some() {
            return Err(OnnxError::invalid_graph(format!(
                "value `{name}` is defined more than once"
            )));
        }
        self.values.push(Value {
            name: name.to_owned(),
            source,
        });
        Ok(id)
    }
}
