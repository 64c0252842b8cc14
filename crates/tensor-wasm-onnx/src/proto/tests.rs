//! The decoder against models built by hand with a small test-only protobuf encoder: one
//! model with every kind of field decoded in full, then refusals (`refusals`) and
//! properties over random and mutated input (`props`).

mod encode;
mod props;
mod refusals;

use encode::{attr, f, node, raw_tensor, tensor_value, typed_tensor, Msg, D};

use super::data_type as dt;
use super::*;

fn f32s(vs: &[f32]) -> Vec<u8> {
    vs.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A model with two nodes, attributes of every kind, initializers in every data field
/// (packed and unpacked), and value infos with fixed, symbolic and unknown dims.
pub(super) fn full_model() -> Vec<u8> {
    let conv = node(
        "Conv",
        &["x", "w", ""],
        &["y"],
        vec![
            attr("alpha", 1).f32(f::ATTR_F, 0.5),
            attr("group", 2).int(f::ATTR_I, -3),
            attr("mode", 3).str(f::ATTR_S, "constant"),
            attr("value", 4).msg(
                f::ATTR_T,
                typed_tensor("c", dt::INT32, &[2]).packed_ints(f::TENSOR_INT32_DATA, &[-1, 7]),
            ),
            attr("scales", 6).packed_f32(f::ATTR_FLOATS, &[1.0, 2.5]),
            attr("scales_unpacked", 6)
                .f32(f::ATTR_FLOATS, 3.0)
                .f32(f::ATTR_FLOATS, -4.0),
            attr("pads", 7).packed_ints(f::ATTR_INTS, &[0, 1, -1]),
            attr("pads_unpacked", 7)
                .int(f::ATTR_INTS, 5)
                .int(f::ATTR_INTS, i64::MIN)
                .packed_ints(f::ATTR_INTS, &[6]),
            attr("names", 8)
                .str(f::ATTR_STRINGS, "a")
                .str(f::ATTR_STRINGS, "bc"),
            attr("body", 5).msg(
                f::ATTR_G,
                Msg::new().msg(f::GRAPH_NODE, node("Relu", &["q"], &["r"], vec![])),
            ),
            Msg::new().str(f::ATTR_NAME, "untyped").int(f::ATTR_I, 7),
            attr("empty", 7),
        ],
    )
    .str(f::NODE_NAME, "conv0");
    let relu = node("Relu", &["y"], &["z"], vec![])
        .str(f::NODE_DOMAIN, "com.example")
        .str(f::NODE_DOC_STRING, "skipped")
        .uint(99, 1)
        .f64(98, 1.0)
        .f32(97, 1.0)
        .str(96, "unknown");

    let initializers = [
        raw_tensor("w", dt::FLOAT, &[2, 2], &f32s(&[1.0, 2.0, 3.0, 4.0])),
        typed_tensor("f", dt::FLOAT, &[3]).packed_f32(f::TENSOR_FLOAT_DATA, &[1.5, -2.0, 0.25]),
        typed_tensor("fu", dt::FLOAT, &[2])
            .f32(f::TENSOR_FLOAT_DATA, 8.0)
            .f32(f::TENSOR_FLOAT_DATA, 9.0),
        typed_tensor("i64", dt::INT64, &[3]).packed_ints(f::TENSOR_INT64_DATA, &[1, -2, 3]),
        // Unpacked dims and data, the name last and a doc string in between.
        Msg::new()
            .int(f::TENSOR_DIMS, 1)
            .int(f::TENSOR_DIMS, 2)
            .int(f::TENSOR_INT64_DATA, i64::MAX)
            .str(f::TENSOR_DOC_STRING, "doc")
            .int(f::TENSOR_INT64_DATA, -5)
            .int(f::TENSOR_DATA_TYPE, i64::from(dt::INT64))
            .str(f::TENSOR_NAME, "i64u"),
        typed_tensor("h", dt::FLOAT16, &[2]).packed_ints(f::TENSOR_INT32_DATA, &[0x3c00, 0xc000]),
        typed_tensor("b", dt::BOOL, &[3]).packed_ints(f::TENSOR_INT32_DATA, &[1, 0, 1]),
        typed_tensor("i8", dt::INT8, &[2]).packed_ints(f::TENSOR_INT32_DATA, &[-1, 5]),
        typed_tensor("d", dt::DOUBLE, &[2])
            .packed_f64(f::TENSOR_DOUBLE_DATA, &[0.5])
            .f64(f::TENSOR_DOUBLE_DATA, -1.0),
        typed_tensor("u32", dt::UINT32, &[2]).packed_ints(f::TENSOR_UINT64_DATA, &[1, 0xffff_ffff]),
        typed_tensor("empty", dt::FLOAT, &[0]),
        typed_tensor("scalar", dt::INT64, &[]).int(f::TENSOR_INT64_DATA, 42),
        typed_tensor("loc", dt::UINT8, &[2])
            .int(f::TENSOR_DATA_LOCATION, 0)
            .bytes(f::TENSOR_RAW_DATA, &[7, 8]),
    ];

    let mut graph = Msg::new()
        .msg(f::GRAPH_NODE, conv)
        .str(f::GRAPH_NAME, "g")
        .msg(f::GRAPH_NODE, relu)
        .str(f::GRAPH_DOC_STRING, "skipped")
        .msg(f::GRAPH_VALUE_INFO, tensor_value("y", dt::FLOAT, None));
    for t in initializers {
        graph = graph.msg(f::GRAPH_INITIALIZER, t);
    }
    graph = graph
        .msg(
            f::GRAPH_INPUT,
            tensor_value("x", dt::FLOAT, Some(&[D::P("batch"), D::V(3), D::U])),
        )
        .msg(
            f::GRAPH_INPUT,
            Msg::new().str(f::VALUE_NAME, "seq").msg(
                f::VALUE_TYPE,
                Msg::new().msg(
                    f::TYPE_SEQUENCE,
                    Msg::new().msg(1, Msg::new().msg(f::TYPE_TENSOR, Msg::new())),
                ),
            ),
        )
        .msg(f::GRAPH_INPUT, tensor_value("norank", dt::INT64, None))
        .msg(f::GRAPH_INPUT, Msg::new().str(f::VALUE_NAME, "untyped"))
        .msg(
            f::GRAPH_OUTPUT,
            tensor_value("z", dt::FLOAT, Some(&[D::V(1), D::V(0)])),
        );

    Msg::new()
        .int(f::MODEL_IR_VERSION, 9)
        .str(f::MODEL_PRODUCER_NAME, "hand")
        .msg(f::MODEL_OPSET_IMPORT, Msg::new().int(f::OPSET_VERSION, 17))
        .msg(
            f::MODEL_OPSET_IMPORT,
            Msg::new()
                .str(f::OPSET_DOMAIN, "com.microsoft")
                .int(f::OPSET_VERSION, 1),
        )
        .msg(f::MODEL_GRAPH, graph)
        .str(f::MODEL_DOC_STRING, "after the graph")
        .msg(f::MODEL_METADATA_PROPS, Msg::new().str(1, "k").str(2, "v"))
        .into_bytes()
}

fn tensor(name: &str, data_type: i32, dims: &[i64], data: Vec<u8>) -> Tensor {
    Tensor {
        name: name.into(),
        dims: dims.to_vec(),
        data_type,
        data,
    }
}

fn value(name: &str, elem_type: i32, shape: Option<Vec<Dim>>) -> ValueInfo {
    ValueInfo {
        name: name.into(),
        elem_type,
        shape,
    }
}

fn attribute(name: &str, value: AttributeValue) -> Attribute {
    Attribute {
        name: name.into(),
        value,
    }
}

fn strings(names: &[&str]) -> Vec<String> {
    names.iter().map(|s| s.to_string()).collect()
}

/// What [`full_model`] decodes to.
fn full_model_decoded() -> Model {
    use AttributeValue as A;
    let i64s = |vs: &[i64]| vs.iter().flat_map(|v| v.to_le_bytes()).collect::<Vec<u8>>();
    Model {
        ir_version: 9,
        opsets: vec![
            Opset {
                domain: String::new(),
                version: 17,
            },
            Opset {
                domain: "com.microsoft".into(),
                version: 1,
            },
        ],
        graph: Graph {
            name: "g".into(),
            nodes: vec![
                Node {
                    name: "conv0".into(),
                    op_type: "Conv".into(),
                    domain: String::new(),
                    inputs: strings(&["x", "w", ""]),
                    outputs: strings(&["y"]),
                    attributes: vec![
                        attribute("alpha", A::Float(0.5)),
                        attribute("group", A::Int(-3)),
                        attribute("mode", A::String(b"constant".to_vec())),
                        attribute(
                            "value",
                            A::Tensor(tensor(
                                "c",
                                dt::INT32,
                                &[2],
                                [-1i32, 7].map(i32::to_le_bytes).concat(),
                            )),
                        ),
                        attribute("scales", A::Floats(vec![1.0, 2.5])),
                        attribute("scales_unpacked", A::Floats(vec![3.0, -4.0])),
                        attribute("pads", A::Ints(vec![0, 1, -1])),
                        attribute("pads_unpacked", A::Ints(vec![5, i64::MIN, 6])),
                        attribute("names", A::Strings(vec![b"a".to_vec(), b"bc".to_vec()])),
                        attribute("body", A::Other(5)),
                        attribute("untyped", A::Int(7)),
                        attribute("empty", A::Ints(vec![])),
                    ],
                },
                Node {
                    name: String::new(),
                    op_type: "Relu".into(),
                    domain: "com.example".into(),
                    inputs: strings(&["y"]),
                    outputs: strings(&["z"]),
                    attributes: vec![],
                },
            ],
            initializers: vec![
                tensor("w", dt::FLOAT, &[2, 2], f32s(&[1.0, 2.0, 3.0, 4.0])),
                tensor("f", dt::FLOAT, &[3], f32s(&[1.5, -2.0, 0.25])),
                tensor("fu", dt::FLOAT, &[2], f32s(&[8.0, 9.0])),
                tensor("i64", dt::INT64, &[3], i64s(&[1, -2, 3])),
                tensor("i64u", dt::INT64, &[1, 2], i64s(&[i64::MAX, -5])),
                tensor("h", dt::FLOAT16, &[2], vec![0x00, 0x3c, 0x00, 0xc0]),
                tensor("b", dt::BOOL, &[3], vec![1, 0, 1]),
                tensor("i8", dt::INT8, &[2], vec![0xff, 5]),
                tensor(
                    "d",
                    dt::DOUBLE,
                    &[2],
                    [0.5f64, -1.0].map(f64::to_le_bytes).concat(),
                ),
                tensor(
                    "u32",
                    dt::UINT32,
                    &[2],
                    [1u32, u32::MAX].map(u32::to_le_bytes).concat(),
                ),
                tensor("empty", dt::FLOAT, &[0], vec![]),
                tensor("scalar", dt::INT64, &[], i64s(&[42])),
                tensor("loc", dt::UINT8, &[2], vec![7, 8]),
            ],
            inputs: vec![
                value(
                    "x",
                    dt::FLOAT,
                    Some(vec![
                        Dim::Param("batch".into()),
                        Dim::Value(3),
                        Dim::Unknown,
                    ]),
                ),
                value("seq", 0, None),
                value("norank", dt::INT64, None),
                value("untyped", 0, None),
            ],
            outputs: vec![value(
                "z",
                dt::FLOAT,
                Some(vec![Dim::Value(1), Dim::Value(0)]),
            )],
        },
    }
}

#[test]
fn a_hand_built_model_decodes_in_full() {
    let model = decode_model(&full_model(), &Limits::default()).unwrap();
    assert_eq!(model, full_model_decoded());
}

#[test]
fn decoding_is_independent_of_limits_that_are_not_reached() {
    let bytes = full_model();
    let tight = Limits {
        max_model_bytes: bytes.len(),
        max_nodes: 2,
        max_initializers: 13,
        max_tensor_bytes: 24,
        max_dims: 3,
        max_name_bytes: "scales_unpacked".len(),
        max_attribute_elements: 3,
        max_values: 5,
        deadline: Some(std::time::Instant::now() + std::time::Duration::from_secs(3600)),
    };
    assert_eq!(decode_model(&bytes, &tight).unwrap(), full_model_decoded());
}

#[test]
fn a_tensor_decodes_on_its_own() {
    let bytes = raw_tensor(
        "t",
        dt::INT64,
        &[2],
        &[1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0],
    )
    .into_bytes();
    let t = decode_tensor(&bytes, &Limits::default()).unwrap();
    assert_eq!(t.name, "t");
    assert_eq!(t.dims, [2]);
    assert_eq!(t.data_type, dt::INT64);
    assert_eq!(t.data.len(), 16);

    // The same tensor with its data in int64_data.
    let typed = typed_tensor("t", dt::INT64, &[2])
        .packed_ints(f::TENSOR_INT64_DATA, &[1, 2])
        .into_bytes();
    assert_eq!(decode_tensor(&typed, &Limits::default()).unwrap(), t);
}

#[test]
fn complex_and_sixteen_bit_types_take_their_carriers() {
    let cases = [
        (
            typed_tensor("c", dt::COMPLEX64, &[1]).packed_f32(f::TENSOR_FLOAT_DATA, &[1.0, 2.0]),
            f32s(&[1.0, 2.0]),
        ),
        (
            typed_tensor("u16", dt::UINT16, &[2]).packed_ints(f::TENSOR_INT32_DATA, &[65535, 1]),
            vec![0xff, 0xff, 1, 0],
        ),
        (
            typed_tensor("bf", dt::BFLOAT16, &[1]).int(f::TENSOR_INT32_DATA, 0x3f80),
            vec![0x80, 0x3f],
        ),
        (
            typed_tensor("u64", dt::UINT64, &[1]).uint(f::TENSOR_UINT64_DATA, u64::MAX),
            vec![0xff; 8],
        ),
    ];
    for (msg, data) in cases {
        let t = decode_tensor(&msg.into_bytes(), &Limits::default()).unwrap();
        assert_eq!(t.data, data, "{}", t.name);
    }
}

#[test]
fn attribute_values_other_than_the_decoded_kinds_keep_their_type_number() {
    let attrs = vec![
        attr("g", 5).msg(f::ATTR_G, Msg::new().str(f::GRAPH_NAME, "inner")),
        attr("ts", 9).msg(f::ATTR_TENSORS, Msg::new()),
        attr("sp", 11).msg(f::ATTR_SPARSE_TENSOR, Msg::new()),
        // No type: the value field says which.
        Msg::new()
            .str(f::ATTR_NAME, "untyped_graph")
            .msg(f::ATTR_G, Msg::new()),
        // A type number this decoder does not know.
        attr("future", 99),
    ];
    let bytes =
        encode::model_with(Msg::new().msg(f::GRAPH_NODE, node("If", &["c"], &["o"], attrs)));
    let m = decode_model(&bytes, &Limits::default()).unwrap();
    let kinds: Vec<_> = m.graph.nodes[1]
        .attributes
        .iter()
        .map(|a| (a.name.as_str(), a.value.clone()))
        .collect();
    assert_eq!(
        kinds,
        [
            ("g", AttributeValue::Other(5)),
            ("ts", AttributeValue::Other(9)),
            ("sp", AttributeValue::Other(11)),
            ("untyped_graph", AttributeValue::Other(5)),
            ("future", AttributeValue::Other(99)),
        ]
    );
}

#[test]
fn scalar_attributes_left_at_their_default_decode_as_zero() {
    // Writers following proto3 rules leave out fields at their default value.
    let attrs = vec![attr("f", 1), attr("i", 2), attr("s", 3)];
    let bytes = encode::model_with(Msg::new().msg(f::GRAPH_NODE, node("Op", &[], &[], attrs)));
    let m = decode_model(&bytes, &Limits::default()).unwrap();
    let values: Vec<_> = m.graph.nodes[1]
        .attributes
        .iter()
        .map(|a| a.value.clone())
        .collect();
    assert_eq!(
        values,
        [
            AttributeValue::Float(0.0),
            AttributeValue::Int(0),
            AttributeValue::String(vec![])
        ]
    );
}

#[test]
fn data_type_names_and_sizes() {
    assert_eq!(dt::name(dt::FLOAT), "float");
    assert_eq!(dt::name(dt::INT64), "int64");
    assert_eq!(dt::name(dt::FLOAT16), "float16");
    assert_eq!(dt::name(1000), "unknown");
    assert_eq!(dt::element_bytes(dt::FLOAT), Some(4));
    assert_eq!(dt::element_bytes(dt::BOOL), Some(1));
    assert_eq!(dt::element_bytes(dt::FLOAT16), Some(2));
    assert_eq!(dt::element_bytes(dt::DOUBLE), Some(8));
    assert_eq!(dt::element_bytes(dt::COMPLEX128), Some(16));
    assert_eq!(dt::element_bytes(dt::STRING), None);
    assert_eq!(dt::element_bytes(dt::INT4), None);
    assert_eq!(dt::element_bytes(dt::UNDEFINED), None);
    // Every known type has a name; every sized type is known.
    for t in 0..64 {
        if dt::element_bytes(t).is_some() {
            assert_ne!(dt::name(t), "unknown", "{t}");
        }
    }
}

#[test]
fn default_limits_are_the_documented_ones() {
    let l = Limits::default();
    assert_eq!(l.max_model_bytes, 256 << 20);
    assert_eq!(l.max_nodes, 100_000);
    assert_eq!(l.max_initializers, 100_000);
    assert_eq!(l.max_tensor_bytes, 256 << 20);
    assert_eq!(l.max_dims, 8);
    assert_eq!(l.max_name_bytes, 4096);
    assert_eq!(l.max_attribute_elements, 1 << 20);
    assert_eq!(l.max_values, 10_000);
    assert_eq!(l.deadline, None);
}
