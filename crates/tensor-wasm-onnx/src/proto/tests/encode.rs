//! A protobuf encoder for the tests: builds ONNX messages field by field, well-formed or
//! not, so that every decoder path can be reached without a `.proto` toolchain.

/// Wire types.
pub(crate) const VARINT: u8 = 0;
pub(crate) const FIXED64: u8 = 1;
pub(crate) const LEN: u8 = 2;
pub(crate) const FIXED32: u8 = 5;

/// Appends `v` as a varint.
pub(crate) fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A message under construction.
#[derive(Debug, Clone, Default)]
pub(crate) struct Msg(pub(crate) Vec<u8>);

impl Msg {
    pub(crate) fn new() -> Self {
        Msg(Vec::new())
    }

    /// A field tag alone; the caller appends the payload with [`Msg::raw`].
    pub(crate) fn tag(mut self, field: u32, wire: u8) -> Self {
        put_varint(&mut self.0, (u64::from(field) << 3) | u64::from(wire));
        self
    }

    /// Bytes appended as they are.
    pub(crate) fn raw(mut self, bytes: &[u8]) -> Self {
        self.0.extend_from_slice(bytes);
        self
    }

    pub(crate) fn uint(self, field: u32, v: u64) -> Self {
        let mut m = self.tag(field, VARINT);
        put_varint(&mut m.0, v);
        m
    }

    pub(crate) fn int(self, field: u32, v: i64) -> Self {
        self.uint(field, v as u64)
    }

    pub(crate) fn bytes(self, field: u32, b: &[u8]) -> Self {
        let mut m = self.tag(field, LEN);
        put_varint(&mut m.0, b.len() as u64);
        m.raw(b)
    }

    pub(crate) fn str(self, field: u32, s: &str) -> Self {
        self.bytes(field, s.as_bytes())
    }

    pub(crate) fn msg(self, field: u32, m: Msg) -> Self {
        self.bytes(field, &m.0)
    }

    pub(crate) fn f32(self, field: u32, v: f32) -> Self {
        self.tag(field, FIXED32).raw(&v.to_le_bytes())
    }

    pub(crate) fn f64(self, field: u32, v: f64) -> Self {
        self.tag(field, FIXED64).raw(&v.to_le_bytes())
    }

    pub(crate) fn packed_ints(self, field: u32, vs: &[i64]) -> Self {
        let mut b = Vec::new();
        for &v in vs {
            put_varint(&mut b, v as u64);
        }
        self.bytes(field, &b)
    }

    pub(crate) fn packed_f32(self, field: u32, vs: &[f32]) -> Self {
        let b: Vec<u8> = vs.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.bytes(field, &b)
    }

    pub(crate) fn packed_f64(self, field: u32, vs: &[f64]) -> Self {
        let b: Vec<u8> = vs.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.bytes(field, &b)
    }

    pub(crate) fn into_bytes(self) -> Vec<u8> {
        self.0
    }
}

// ONNX field numbers, as the encoder writes them (the decoder has its own, private copy:
// the tests then check the two agree).
pub(crate) mod f {
    pub(crate) const MODEL_IR_VERSION: u32 = 1;
    pub(crate) const MODEL_PRODUCER_NAME: u32 = 2;
    pub(crate) const MODEL_DOC_STRING: u32 = 6;
    pub(crate) const MODEL_GRAPH: u32 = 7;
    pub(crate) const MODEL_OPSET_IMPORT: u32 = 8;
    pub(crate) const MODEL_METADATA_PROPS: u32 = 14;
    pub(crate) const MODEL_FUNCTIONS: u32 = 25;
    pub(crate) const OPSET_DOMAIN: u32 = 1;
    pub(crate) const OPSET_VERSION: u32 = 2;
    pub(crate) const GRAPH_NODE: u32 = 1;
    pub(crate) const GRAPH_NAME: u32 = 2;
    pub(crate) const GRAPH_INITIALIZER: u32 = 5;
    pub(crate) const GRAPH_DOC_STRING: u32 = 10;
    pub(crate) const GRAPH_INPUT: u32 = 11;
    pub(crate) const GRAPH_OUTPUT: u32 = 12;
    pub(crate) const GRAPH_VALUE_INFO: u32 = 13;
    pub(crate) const GRAPH_SPARSE_INITIALIZER: u32 = 15;
    pub(crate) const NODE_INPUT: u32 = 1;
    pub(crate) const NODE_OUTPUT: u32 = 2;
    pub(crate) const NODE_NAME: u32 = 3;
    pub(crate) const NODE_OP_TYPE: u32 = 4;
    pub(crate) const NODE_ATTRIBUTE: u32 = 5;
    pub(crate) const NODE_DOC_STRING: u32 = 6;
    pub(crate) const NODE_DOMAIN: u32 = 7;
    pub(crate) const ATTR_NAME: u32 = 1;
    pub(crate) const ATTR_F: u32 = 2;
    pub(crate) const ATTR_I: u32 = 3;
    pub(crate) const ATTR_S: u32 = 4;
    pub(crate) const ATTR_T: u32 = 5;
    pub(crate) const ATTR_G: u32 = 6;
    pub(crate) const ATTR_FLOATS: u32 = 7;
    pub(crate) const ATTR_INTS: u32 = 8;
    pub(crate) const ATTR_STRINGS: u32 = 9;
    pub(crate) const ATTR_TENSORS: u32 = 10;
    pub(crate) const ATTR_TYPE: u32 = 20;
    pub(crate) const ATTR_REF_ATTR_NAME: u32 = 21;
    pub(crate) const ATTR_SPARSE_TENSOR: u32 = 22;
    pub(crate) const TENSOR_DIMS: u32 = 1;
    pub(crate) const TENSOR_DATA_TYPE: u32 = 2;
    pub(crate) const TENSOR_SEGMENT: u32 = 3;
    pub(crate) const TENSOR_FLOAT_DATA: u32 = 4;
    pub(crate) const TENSOR_INT32_DATA: u32 = 5;
    pub(crate) const TENSOR_STRING_DATA: u32 = 6;
    pub(crate) const TENSOR_INT64_DATA: u32 = 7;
    pub(crate) const TENSOR_NAME: u32 = 8;
    pub(crate) const TENSOR_RAW_DATA: u32 = 9;
    pub(crate) const TENSOR_DOUBLE_DATA: u32 = 10;
    pub(crate) const TENSOR_UINT64_DATA: u32 = 11;
    pub(crate) const TENSOR_DOC_STRING: u32 = 12;
    pub(crate) const TENSOR_EXTERNAL_DATA: u32 = 13;
    pub(crate) const TENSOR_DATA_LOCATION: u32 = 14;
    pub(crate) const VALUE_NAME: u32 = 1;
    pub(crate) const VALUE_TYPE: u32 = 2;
    pub(crate) const TYPE_TENSOR: u32 = 1;
    pub(crate) const TYPE_SEQUENCE: u32 = 4;
    pub(crate) const TENSOR_TYPE_ELEM_TYPE: u32 = 1;
    pub(crate) const TENSOR_TYPE_SHAPE: u32 = 2;
    pub(crate) const SHAPE_DIM: u32 = 1;
    pub(crate) const DIM_VALUE: u32 = 1;
    pub(crate) const DIM_PARAM: u32 = 2;
    pub(crate) const DIM_DENOTATION: u32 = 3;
}

/// A `TensorProto` with dims (packed), type, name and `raw_data`.
pub(crate) fn raw_tensor(name: &str, data_type: i32, dims: &[i64], raw: &[u8]) -> Msg {
    typed_tensor(name, data_type, dims).bytes(f::TENSOR_RAW_DATA, raw)
}

/// A `TensorProto` with dims (packed), type and name, no data yet.
pub(crate) fn typed_tensor(name: &str, data_type: i32, dims: &[i64]) -> Msg {
    Msg::new()
        .packed_ints(f::TENSOR_DIMS, dims)
        .int(f::TENSOR_DATA_TYPE, i64::from(data_type))
        .str(f::TENSOR_NAME, name)
}

/// One dimension of a value info's shape.
pub(crate) enum D {
    V(i64),
    P(&'static str),
    U,
}

/// A `ValueInfoProto` of a tensor; `dims: None` leaves the shape out.
pub(crate) fn tensor_value(name: &str, elem_type: i32, dims: Option<&[D]>) -> Msg {
    let mut tensor_type = Msg::new().int(f::TENSOR_TYPE_ELEM_TYPE, i64::from(elem_type));
    if let Some(dims) = dims {
        let mut shape = Msg::new();
        for d in dims {
            let dim = match d {
                D::V(v) => Msg::new().int(f::DIM_VALUE, *v),
                D::P(p) => Msg::new().str(f::DIM_PARAM, p),
                D::U => Msg::new().str(f::DIM_DENOTATION, "DATA_BATCH"),
            };
            shape = shape.msg(f::SHAPE_DIM, dim);
        }
        tensor_type = tensor_type.msg(f::TENSOR_TYPE_SHAPE, shape);
    }
    Msg::new()
        .str(f::VALUE_NAME, name)
        .msg(f::VALUE_TYPE, Msg::new().msg(f::TYPE_TENSOR, tensor_type))
}

/// An `AttributeProto` with a name and a type, no value yet.
pub(crate) fn attr(name: &str, ty: i64) -> Msg {
    Msg::new().str(f::ATTR_NAME, name).int(f::ATTR_TYPE, ty)
}

/// A `NodeProto`.
pub(crate) fn node(op_type: &str, inputs: &[&str], outputs: &[&str], attrs: Vec<Msg>) -> Msg {
    let mut n = Msg::new();
    for i in inputs {
        n = n.str(f::NODE_INPUT, i);
    }
    for o in outputs {
        n = n.str(f::NODE_OUTPUT, o);
    }
    n = n.str(f::NODE_OP_TYPE, op_type);
    for a in attrs {
        n = n.msg(f::NODE_ATTRIBUTE, a);
    }
    n
}

/// A `ModelProto` around `graph`, importing the default domain at version 17.
pub(crate) fn model(graph: Msg) -> Vec<u8> {
    Msg::new()
        .int(f::MODEL_IR_VERSION, 8)
        .msg(
            f::MODEL_OPSET_IMPORT,
            Msg::new()
                .str(f::OPSET_DOMAIN, "")
                .int(f::OPSET_VERSION, 17),
        )
        .msg(f::MODEL_GRAPH, graph)
        .into_bytes()
}

/// A model whose graph has one `Identity` node from `x` to `y`, plus `extra` graph fields.
pub(crate) fn model_with(extra: Msg) -> Vec<u8> {
    let graph = Msg::new()
        .msg(f::GRAPH_NODE, node("Identity", &["x"], &["y"], vec![]))
        .raw(&extra.0);
    model(graph)
}
