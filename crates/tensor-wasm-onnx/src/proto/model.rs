//! `ModelProto`, `GraphProto` and `ValueInfoProto` (with the `TypeProto` and
//! `TensorShapeProto` inside it): everything above the nodes.

use std::mem::size_of;

use super::node::node;
use super::tensor::tensor;
use super::wire::{peek_bytes, place, within, Cx, Fields, Value};
use super::{Dim, Graph, Model, Node, Opset, Tensor, ValueInfo};
use crate::{OnnxError, Result};

// `ModelProto` field numbers.
const MODEL_IR_VERSION: u32 = 1;
const MODEL_GRAPH: u32 = 7;
const MODEL_OPSET_IMPORT: u32 = 8;
const MODEL_FUNCTIONS: u32 = 25;

// `OperatorSetIdProto` field numbers.
const OPSET_DOMAIN: u32 = 1;
const OPSET_VERSION: u32 = 2;

// `GraphProto` field numbers.
const GRAPH_NODE: u32 = 1;
const GRAPH_NAME: u32 = 2;
const GRAPH_INITIALIZER: u32 = 5;
const GRAPH_INPUT: u32 = 11;
const GRAPH_OUTPUT: u32 = 12;
const GRAPH_SPARSE_INITIALIZER: u32 = 15;

// `ValueInfoProto` field numbers.
const VALUE_NAME: u32 = 1;
const VALUE_TYPE: u32 = 2;

// `TypeProto` field numbers: the variants of its `value` oneof.
const TYPE_TENSOR: u32 = 1;
const TYPE_SEQUENCE: u32 = 4;
const TYPE_MAP: u32 = 5;
const TYPE_OPAQUE: u32 = 7;
const TYPE_SPARSE_TENSOR: u32 = 8;
const TYPE_OPTIONAL: u32 = 9;

// `TypeProto.Tensor` field numbers.
const TENSOR_TYPE_ELEM_TYPE: u32 = 1;
const TENSOR_TYPE_SHAPE: u32 = 2;

// `TensorShapeProto` and `TensorShapeProto.Dimension` field numbers.
const SHAPE_DIM: u32 = 1;
const DIM_VALUE: u32 = 1;
const DIM_PARAM: u32 = 2;

/// Decodes a `ModelProto`.
pub(super) fn model(bytes: &[u8], cx: &mut Cx) -> Result<Model> {
    let mut ir_version = 0;
    let mut opsets = Vec::new();
    let mut graph_bytes = None;
    let mut fields = Fields::new(bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            MODEL_IR_VERSION => ir_version = value.int64("ir_version")?,
            MODEL_OPSET_IMPORT => {
                let index = opsets.len();
                cx.charge(size_of::<Opset>())?;
                opsets.push(within(opset(value, cx), || {
                    format!("opset_import {index}")
                })?);
            }
            MODEL_GRAPH => {
                // Protobuf would merge two occurrences; no ONNX writer splits a graph.
                if graph_bytes.is_some() {
                    return Err(OnnxError::malformed("the model has two `graph` fields"));
                }
                graph_bytes = Some(value.bytes("graph")?);
            }
            MODEL_FUNCTIONS => {
                return Err(OnnxError::unsupported(
                    "model-local functions (`functions`) are not supported",
                ))
            }
            _ => {}
        }
    }
    let graph_bytes = graph_bytes.ok_or_else(|| OnnxError::malformed("the model has no graph"))?;
    Ok(Model {
        ir_version,
        opsets,
        graph: graph(graph_bytes, cx)?,
    })
}

fn opset(value: Value<'_>, cx: &mut Cx) -> Result<Opset> {
    let mut opset = Opset {
        domain: String::new(),
        version: 0,
    };
    let mut fields = Fields::new(value.bytes("opset_import")?);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            OPSET_DOMAIN => opset.domain = cx.name(value, "domain")?,
            OPSET_VERSION => opset.version = value.int64("version")?,
            _ => {}
        }
    }
    Ok(opset)
}

fn graph(bytes: &[u8], cx: &mut Cx) -> Result<Graph> {
    let mut g = Graph {
        name: String::new(),
        nodes: Vec::new(),
        initializers: Vec::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
    };
    let mut fields = Fields::new(bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            GRAPH_NODE => {
                if g.nodes.len() >= cx.limits.max_nodes {
                    return Err(OnnxError::too_large(format!(
                        "the graph has more than {} nodes (max_nodes)",
                        cx.limits.max_nodes
                    )));
                }
                cx.charge(size_of::<Node>())?;
                g.nodes.push(node(value.bytes("node")?, g.nodes.len(), cx)?);
            }
            GRAPH_NAME => g.name = cx.name(value, "name")?,
            GRAPH_INITIALIZER => {
                if g.initializers.len() >= cx.limits.max_initializers {
                    return Err(OnnxError::too_large(format!(
                        "the graph has more than {} initializers (max_initializers)",
                        cx.limits.max_initializers
                    )));
                }
                let index = g.initializers.len();
                cx.charge(size_of::<Tensor>())?;
                let t = within(tensor(value.bytes("initializer")?, cx), || {
                    format!("initializer {index}")
                })?;
                g.initializers.push(t);
            }
            GRAPH_INPUT | GRAPH_OUTPUT => {
                if g.inputs.len() + g.outputs.len() >= cx.limits.max_values {
                    return Err(OnnxError::too_large(format!(
                        "the graph has more than {} inputs and outputs (max_values)",
                        cx.limits.max_values
                    )));
                }
                let (kind, list) = if field == GRAPH_INPUT {
                    ("input", &mut g.inputs)
                } else {
                    ("output", &mut g.outputs)
                };
                cx.charge(size_of::<ValueInfo>())?;
                list.push(value_info(value.bytes(kind)?, kind, list.len(), cx)?);
            }
            GRAPH_SPARSE_INITIALIZER => {
                return Err(OnnxError::unsupported(
                    "sparse initializers (`sparse_initializer`) are not supported",
                ))
            }
            _ => {}
        }
    }
    Ok(g)
}

/// Decodes a `ValueInfoProto`; errors say "input 2 (`x`): ...".
fn value_info(bytes: &[u8], kind: &str, index: usize, cx: &mut Cx) -> Result<ValueInfo> {
    let label = cx.label(peek_bytes(bytes, VALUE_NAME));
    within(decode_value_info(bytes, cx), || place(kind, index, label))
}

fn decode_value_info(bytes: &[u8], cx: &mut Cx) -> Result<ValueInfo> {
    let mut info = ValueInfo {
        name: String::new(),
        elem_type: 0,
        shape: None,
    };
    let mut type_bytes = None;
    let mut fields = Fields::new(bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            VALUE_NAME => info.name = cx.name(value, "name")?,
            VALUE_TYPE => {
                if type_bytes.is_some() {
                    return Err(OnnxError::malformed("two `type` fields"));
                }
                type_bytes = Some(value.bytes("type")?);
            }
            _ => {}
        }
    }
    let Some(type_bytes) = type_bytes else {
        return Ok(info);
    };

    // The `value` oneof: the last variant present wins. Only tensors are decoded; any other
    // variant leaves the element type 0 and the shape unknown.
    let mut tensor_type = None;
    let mut fields = Fields::new(type_bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            TYPE_TENSOR => tensor_type = Some(value.bytes("tensor_type")?),
            TYPE_SEQUENCE | TYPE_MAP | TYPE_OPAQUE | TYPE_SPARSE_TENSOR | TYPE_OPTIONAL => {
                tensor_type = None
            }
            _ => {}
        }
    }
    let Some(tensor_type) = tensor_type else {
        return Ok(info);
    };

    let mut shape_bytes = None;
    let mut fields = Fields::new(tensor_type);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            TENSOR_TYPE_ELEM_TYPE => info.elem_type = value.int32("elem_type")?,
            TENSOR_TYPE_SHAPE => {
                if shape_bytes.is_some() {
                    return Err(OnnxError::malformed("two `shape` fields"));
                }
                shape_bytes = Some(value.bytes("shape")?);
            }
            _ => {}
        }
    }
    if let Some(shape_bytes) = shape_bytes {
        info.shape = Some(shape(shape_bytes, cx)?);
    }
    Ok(info)
}

/// Decodes a `TensorShapeProto`.
fn shape(bytes: &[u8], cx: &mut Cx) -> Result<Vec<Dim>> {
    let mut dims = Vec::new();
    let mut fields = Fields::new(bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        if field != SHAPE_DIM {
            continue;
        }
        if dims.len() >= cx.limits.max_dims {
            return Err(OnnxError::too_large(format!(
                "the shape has more than {} dims (max_dims)",
                cx.limits.max_dims
            )));
        }
        let index = dims.len();
        cx.charge(size_of::<Dim>())?;
        dims.push(within(dim(value, cx), || format!("dim {index}"))?);
    }
    Ok(dims)
}

/// Decodes a `TensorShapeProto.Dimension`: its `value` oneof, the last variant winning.
fn dim(value: Value<'_>, cx: &mut Cx) -> Result<Dim> {
    let mut dim = Dim::Unknown;
    let mut fields = Fields::new(value.bytes("dim")?);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            DIM_VALUE => {
                let v = value.int64("dim_value")?;
                if v < 0 {
                    return Err(OnnxError::malformed(format!("dim_value is negative ({v})")));
                }
                dim = Dim::Value(v);
            }
            DIM_PARAM => dim = Dim::Param(cx.name(value, "dim_param")?),
            _ => {}
        }
    }
    Ok(dim)
}
