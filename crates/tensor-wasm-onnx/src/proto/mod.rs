//! A bounded decoder of the ONNX protobuf: the model, its graph, nodes, attributes,
//! initializers and value infos, with every size checked against [`Limits`].
//!
//! Written from the protobuf wire-format rules (varint, 64-bit, length-delimited and 32-bit
//! wire types; packed and unpacked repeated scalars), not generated from a `.proto` file. It
//! reads only the fields the executor needs and skips the rest, so the structs here are far
//! smaller than ONNX's messages.
//!
//! What a hostile model can do to it: make it return an [`OnnxError`](crate::OnnxError) with
//! a stable code. It never panics, never recurses (nested graphs inside attributes are skipped
//! as bytes), never allocates from a count it has not checked against the bytes that remain,
//! and stops at [`Limits::deadline`]. What it decodes takes at most 16 times the input's size
//! in memory, plus 1 MiB (not counting the spare capacity of growing lists), or the decode
//! fails with [`ErrorCode::TooLarge`](crate::ErrorCode::TooLarge): the format itself allows
//! an expansion of 8 (an `int64` tensor element written as a one-byte varint), and the rest
//! is the per-item overhead of the structs below.

#![warn(missing_docs)]

pub mod data_type;
mod model;
mod node;
mod tensor;
mod wire;

#[cfg(test)]
mod tests;

use std::time::Instant;

use crate::Result;

/// How much of a model the decoder accepts; anything past a limit is an
/// [`ErrorCode::TooLarge`](crate::ErrorCode::TooLarge) error naming the limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    /// The largest encoded model (or tensor, for [`decode_tensor`]), in bytes. Default 256 MiB.
    pub max_model_bytes: usize,
    /// The most nodes in the graph. Default 100 000.
    pub max_nodes: usize,
    /// The most initializers in the graph. Default 100 000.
    pub max_initializers: usize,
    /// The largest payload of one tensor, in bytes, after normalising it to little-endian
    /// element bytes. Default 256 MiB.
    pub max_tensor_bytes: usize,
    /// The most dimensions of a tensor or of a value's shape. Default 8.
    pub max_dims: usize,
    /// The longest name (of a node, value, tensor, attribute, domain, ...), in bytes.
    /// Default 4096.
    pub max_name_bytes: usize,
    /// The most elements of one list-valued attribute (`floats`, `ints`, `strings`).
    /// Default 2^20.
    pub max_attribute_elements: usize,
    /// The most graph inputs and outputs together. Default 10 000.
    pub max_values: usize,
    /// When decoding gives up with [`ErrorCode::Deadline`](crate::ErrorCode::Deadline);
    /// `None` for no deadline. Checked at every node and tensor and every 1024 fields.
    pub deadline: Option<Instant>,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_model_bytes: 256 << 20,
            max_nodes: 100_000,
            max_initializers: 100_000,
            max_tensor_bytes: 256 << 20,
            max_dims: 8,
            max_name_bytes: 4096,
            max_attribute_elements: 1 << 20,
            max_values: 10_000,
            deadline: None,
        }
    }
}

/// A decoded `ModelProto`: the IR version, the operator sets it imports, and its graph.
#[derive(Debug, Clone, PartialEq)]
pub struct Model {
    /// The ONNX IR version the file declares (0 when absent).
    pub ir_version: i64,
    /// The operator sets the model imports, in file order.
    pub opsets: Vec<Opset>,
    /// The main graph.
    pub graph: Graph,
}

/// One imported operator set (`OperatorSetIdProto`).
#[derive(Debug, Clone, PartialEq)]
pub struct Opset {
    /// The operator domain; empty means the default domain `ai.onnx`.
    pub domain: String,
    /// The version of that domain's operator set.
    pub version: i64,
}

/// A decoded `GraphProto`. Value infos of intermediate values and quantization annotations
/// are not kept.
#[derive(Debug, Clone, PartialEq)]
pub struct Graph {
    /// The graph's name (may be empty).
    pub name: String,
    /// The nodes, in file order (ONNX requires topological order; this decoder does not
    /// check it).
    pub nodes: Vec<Node>,
    /// The constant tensors the graph starts with.
    pub initializers: Vec<Tensor>,
    /// The graph inputs (which may include initializers' names).
    pub inputs: Vec<ValueInfo>,
    /// The graph outputs.
    pub outputs: Vec<ValueInfo>,
}

/// A decoded `NodeProto`: one operator application.
#[derive(Debug, Clone, PartialEq)]
pub struct Node {
    /// The node's name (may be empty).
    pub name: String,
    /// The operator, e.g. `Conv` (never empty).
    pub op_type: String,
    /// The operator's domain; empty means `ai.onnx`.
    pub domain: String,
    /// The names of the values the node reads; an empty name is an omitted optional input.
    pub inputs: Vec<String>,
    /// The names of the values the node writes; an empty name is an omitted optional output.
    pub outputs: Vec<String>,
    /// The node's attributes, in file order.
    pub attributes: Vec<Attribute>,
}

/// A decoded `AttributeProto`.
#[derive(Debug, Clone, PartialEq)]
pub struct Attribute {
    /// The attribute's name (never empty).
    pub name: String,
    /// Its value.
    pub value: AttributeValue,
}

/// The value of an attribute.
#[derive(Debug, Clone, PartialEq)]
pub enum AttributeValue {
    /// `FLOAT`: one `f32`.
    Float(f32),
    /// `INT`: one `i64`.
    Int(i64),
    /// `STRING`: bytes (ONNX means UTF-8, but does not require it).
    String(Vec<u8>),
    /// `TENSOR`: one tensor.
    Tensor(Tensor),
    /// `FLOATS`: a list of `f32`.
    Floats(Vec<f32>),
    /// `INTS`: a list of `i64`.
    Ints(Vec<i64>),
    /// `STRINGS`: a list of byte strings.
    Strings(Vec<Vec<u8>>),
    /// Any other kind (graphs, lists of tensors or graphs, sparse tensors, type protos): its
    /// `AttributeProto.AttributeType` number (5 for `GRAPH`, ...), kept so that the executor
    /// can refuse it by name. Its payload is skipped, not decoded.
    Other(i32),
}

/// A decoded `TensorProto` (an initializer or a tensor-valued attribute).
#[derive(Debug, Clone, PartialEq)]
pub struct Tensor {
    /// The tensor's name (may be empty for attribute tensors).
    pub name: String,
    /// Its dimensions, each at least 0; empty for a scalar.
    pub dims: Vec<i64>,
    /// Its element type, one of the [`data_type`] numbers with an
    /// [`element_bytes`](data_type::element_bytes).
    pub data_type: i32,
    /// The elements as little-endian bytes of the element type, whichever field of the file
    /// carried them; exactly `product(dims) * element_bytes(data_type)` long.
    pub data: Vec<u8>,
}

/// A decoded `ValueInfoProto`: a graph input's or output's name and declared type.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueInfo {
    /// The value's name.
    pub name: String,
    /// The tensor element type ([`data_type`] number); 0 when absent, and for values that are
    /// not tensors (sequences, maps, optionals, sparse tensors).
    pub elem_type: i32,
    /// The tensor's shape; `None` when the rank is unknown or the value is not a tensor.
    pub shape: Option<Vec<Dim>>,
}

/// One dimension of a value's declared shape.
#[derive(Debug, Clone, PartialEq)]
pub enum Dim {
    /// A fixed size (at least 0).
    Value(i64),
    /// A symbolic size, e.g. `batch`.
    Param(String),
    /// Neither given.
    Unknown,
}

/// Decodes a serialized `ModelProto`.
///
/// Errors: [`TooLarge`](crate::ErrorCode::TooLarge) past a limit,
/// [`Malformed`](crate::ErrorCode::Malformed) for bytes that are not a well-formed model,
/// [`Unsupported`](crate::ErrorCode::Unsupported) for external data, string tensors, sparse
/// initializers, model-local functions and the like, and
/// [`Deadline`](crate::ErrorCode::Deadline). Messages name the node, attribute or tensor.
///
/// ```
/// use tensor_wasm_onnx::proto::{decode_model, Limits};
/// use tensor_wasm_onnx::ErrorCode;
///
/// // ir_version (field 1) = 8, then an empty graph (field 7, length 0).
/// let model = decode_model(&[0x08, 0x08, 0x3a, 0x00], &Limits::default()).unwrap();
/// assert_eq!(model.ir_version, 8);
/// assert!(model.graph.nodes.is_empty());
///
/// // The same without its graph.
/// let err = decode_model(&[0x08, 0x08], &Limits::default()).unwrap_err();
/// assert_eq!(err.code, ErrorCode::Malformed);
/// ```
pub fn decode_model(bytes: &[u8], limits: &Limits) -> Result<Model> {
    let mut cx = wire::Cx::new(limits, bytes.len())?;
    model::model(bytes, &mut cx)
}

/// Decodes a serialized `TensorProto` on its own (the files ONNX's `numpy_helper` writes),
/// under the same limits and with the same errors as [`decode_model`].
pub fn decode_tensor(bytes: &[u8], limits: &Limits) -> Result<Tensor> {
    let mut cx = wire::Cx::new(limits, bytes.len())?;
    tensor::tensor(bytes, &mut cx)
}
