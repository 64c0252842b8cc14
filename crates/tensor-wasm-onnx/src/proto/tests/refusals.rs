//! Refusals: every way a model can be wrong, too big, unsupported or late, with the code
//! and the place the error names.

use std::time::Instant;

use super::encode::{attr, f, model, model_with, node, raw_tensor, typed_tensor, Msg};
use super::full_model;
use crate::proto::data_type as dt;
use crate::proto::{decode_model, decode_tensor, Limits};
use crate::{ErrorCode, OnnxError};

fn refused(bytes: &[u8]) -> OnnxError {
    refused_under(bytes, &Limits::default())
}

fn refused_under(bytes: &[u8], limits: &Limits) -> OnnxError {
    match decode_model(bytes, limits) {
        Ok(m) => panic!("decoded: {m:?}"),
        Err(e) => e,
    }
}

/// Asserts the code and that the message contains every one of `words`.
fn assert_refusal(e: &OnnxError, code: ErrorCode, words: &[&str]) {
    assert_eq!(e.code, code, "{e}");
    for w in words {
        assert!(e.message.contains(w), "{w:?} not in {e}");
    }
}

fn with_initializer(t: Msg) -> Vec<u8> {
    model_with(Msg::new().msg(f::GRAPH_INITIALIZER, t))
}

fn with_node(n: Msg) -> Vec<u8> {
    model_with(Msg::new().msg(f::GRAPH_NODE, n))
}

#[test]
fn every_truncation_of_a_valid_model_is_malformed_or_a_whole_model() {
    let bytes = full_model();
    let mut decoded = 0;
    for len in 0..bytes.len() {
        match decode_model(&bytes[..len], &Limits::default()) {
            Ok(_) => decoded += 1,
            Err(e) => assert_eq!(e.code, ErrorCode::Malformed, "prefix of {len}: {e}"),
        }
    }
    // Only the prefixes that end after the graph, at a field boundary, are whole models:
    // the one before the trailing doc string and the one before the metadata.
    assert_eq!(decoded, 2);
}

#[test]
fn a_model_over_max_model_bytes_is_too_large() {
    let bytes = full_model();
    let limits = Limits {
        max_model_bytes: bytes.len() - 1,
        ..Limits::default()
    };
    assert_refusal(
        &refused_under(&bytes, &limits),
        ErrorCode::TooLarge,
        &["max_model_bytes"],
    );
    let tensor = raw_tensor("t", dt::UINT8, &[1], &[0]).into_bytes();
    let limits = Limits {
        max_model_bytes: 3,
        ..Limits::default()
    };
    let e = decode_tensor(&tensor, &limits).unwrap_err();
    assert_refusal(&e, ErrorCode::TooLarge, &["max_model_bytes"]);
}

#[test]
fn counts_past_their_limits_are_too_large_and_name_the_limit() {
    let bytes = full_model();
    let cases: [(Limits, &str); 7] = [
        (
            Limits {
                max_nodes: 1,
                ..Limits::default()
            },
            "max_nodes",
        ),
        (
            Limits {
                max_initializers: 12,
                ..Limits::default()
            },
            "max_initializers",
        ),
        (
            Limits {
                max_values: 4,
                ..Limits::default()
            },
            "max_values",
        ),
        (
            Limits {
                max_dims: 1,
                ..Limits::default()
            },
            "max_dims",
        ),
        (
            Limits {
                max_name_bytes: 4,
                ..Limits::default()
            },
            "max_name_bytes",
        ),
        (
            Limits {
                max_attribute_elements: 2,
                ..Limits::default()
            },
            "max_attribute_elements",
        ),
        (
            Limits {
                max_tensor_bytes: 15,
                ..Limits::default()
            },
            "max_tensor_bytes",
        ),
    ];
    for (limits, name) in cases {
        assert_refusal(
            &refused_under(&bytes, &limits),
            ErrorCode::TooLarge,
            &[name],
        );
    }
}

#[test]
fn a_shape_with_more_dims_than_max_dims_is_too_large() {
    let dims: Vec<_> = (0..9).map(super::encode::D::V).collect();
    let info = super::encode::tensor_value("x", dt::FLOAT, Some(&dims));
    let e = refused(&model_with(Msg::new().msg(f::GRAPH_INPUT, info)));
    assert_refusal(&e, ErrorCode::TooLarge, &["input 0 (`x`)", "max_dims"]);
}

#[test]
fn tensor_data_that_disagrees_with_the_dims_is_malformed() {
    let short = raw_tensor("w", dt::FLOAT, &[2, 2], &[0; 12]);
    let e = refused(&with_initializer(short));
    assert_refusal(
        &e,
        ErrorCode::Malformed,
        &["initializer 0", "tensor `w`", "12 bytes", "16"],
    );

    let long = typed_tensor("w", dt::FLOAT, &[2, 2]).packed_f32(f::TENSOR_FLOAT_DATA, &[0.0; 5]);
    let e = refused(&with_initializer(long));
    assert_refusal(
        &e,
        ErrorCode::Malformed,
        &["tensor `w`", "more than the 16 bytes"],
    );

    let few = typed_tensor("i", dt::INT64, &[3]).packed_ints(f::TENSOR_INT64_DATA, &[1, 2]);
    assert_refusal(
        &refused(&with_initializer(few)),
        ErrorCode::Malformed,
        &["`i`"],
    );

    let none = typed_tensor("n", dt::FLOAT, &[2]);
    assert_refusal(
        &refused(&with_initializer(none)),
        ErrorCode::Malformed,
        &["`n`", "0 bytes"],
    );
}

#[test]
fn negative_dims_are_malformed() {
    let t = raw_tensor("neg", dt::FLOAT, &[2, -1], &[]);
    assert_refusal(
        &refused(&with_initializer(t)),
        ErrorCode::Malformed,
        &["`neg`", "negative"],
    );
    let info = super::encode::tensor_value("x", dt::FLOAT, Some(&[super::encode::D::V(-1)]));
    let e = refused(&model_with(Msg::new().msg(f::GRAPH_INPUT, info)));
    assert_refusal(&e, ErrorCode::Malformed, &["input 0 (`x`)", "negative"]);
}

#[test]
fn dims_whose_product_overflows_are_too_large() {
    let t = raw_tensor("big", dt::FLOAT, &[1 << 40, 1 << 40, 1 << 40], &[0; 4]);
    let e = refused(&with_initializer(t));
    assert_refusal(&e, ErrorCode::TooLarge, &["`big`", "max_tensor_bytes"]);
    // A zero among them makes an empty tensor, however large the others.
    let t = raw_tensor("empty", dt::FLOAT, &[0, i64::MAX, i64::MAX], &[]);
    decode_model(&with_initializer(t), &Limits::default()).unwrap();
}

#[test]
fn external_data_is_unsupported() {
    let located = typed_tensor("ext", dt::FLOAT, &[1]).int(f::TENSOR_DATA_LOCATION, 1);
    let listed = typed_tensor("ext", dt::FLOAT, &[1]).msg(
        f::TENSOR_EXTERNAL_DATA,
        Msg::new().str(1, "location").str(2, "w.bin"),
    );
    // Entries count even where data_location says the data is in the message.
    let contradicted = listed.clone().int(f::TENSOR_DATA_LOCATION, 0);
    for t in [located, listed, contradicted] {
        assert_refusal(
            &refused(&with_initializer(t)),
            ErrorCode::Unsupported,
            &["`ext`", "external"],
        );
    }
    let odd = typed_tensor("odd", dt::FLOAT, &[0]).int(f::TENSOR_DATA_LOCATION, 2);
    assert_refusal(
        &refused(&with_initializer(odd)),
        ErrorCode::Malformed,
        &["data_location"],
    );
}

#[test]
fn string_segmented_and_sub_byte_tensors_are_unsupported() {
    let typed = typed_tensor("s", dt::STRING, &[1]);
    let data = typed_tensor("s", dt::FLOAT, &[1]).str(f::TENSOR_STRING_DATA, "hello");
    for t in [typed, data] {
        assert_refusal(
            &refused(&with_initializer(t)),
            ErrorCode::Unsupported,
            &["`s`", "string tensors"],
        );
    }
    let segment = raw_tensor("seg", dt::FLOAT, &[1], &[0; 4]).msg(f::TENSOR_SEGMENT, Msg::new());
    assert_refusal(
        &refused(&with_initializer(segment)),
        ErrorCode::Unsupported,
        &["segment"],
    );
    let int4 = raw_tensor("q", dt::INT4, &[2], &[0x21]);
    assert_refusal(
        &refused(&with_initializer(int4)),
        ErrorCode::Unsupported,
        &["`int4`"],
    );
    let untyped = Msg::new()
        .str(f::TENSOR_NAME, "u")
        .bytes(f::TENSOR_RAW_DATA, &[1]);
    assert_refusal(
        &refused(&with_initializer(untyped)),
        ErrorCode::Malformed,
        &["no data_type"],
    );
}

#[test]
fn data_in_the_wrong_or_in_two_fields_is_malformed() {
    let wrong = typed_tensor("w", dt::FLOAT, &[1]).packed_ints(f::TENSOR_INT64_DATA, &[1]);
    assert_refusal(
        &refused(&with_initializer(wrong)),
        ErrorCode::Malformed,
        &["int64_data", "float_data"],
    );
    let both = raw_tensor("b", dt::FLOAT, &[1], &[0; 4]).f32(f::TENSOR_FLOAT_DATA, 1.0);
    assert_refusal(
        &refused(&with_initializer(both)),
        ErrorCode::Malformed,
        &["raw_data", "float_data"],
    );
    let ragged = typed_tensor("r", dt::FLOAT, &[1]).bytes(f::TENSOR_FLOAT_DATA, &[0; 5]);
    assert_refusal(
        &refused(&with_initializer(ragged)),
        ErrorCode::Malformed,
        &["float_data", "5 bytes"],
    );
}

#[test]
fn sparse_initializers_and_model_local_functions_are_unsupported() {
    let sparse = model_with(Msg::new().msg(f::GRAPH_SPARSE_INITIALIZER, Msg::new()));
    assert_refusal(
        &refused(&sparse),
        ErrorCode::Unsupported,
        &["sparse initializers"],
    );
    let mut functions = full_model();
    functions.extend(
        Msg::new()
            .msg(f::MODEL_FUNCTIONS, Msg::new().str(1, "f"))
            .into_bytes(),
    );
    assert_refusal(
        &refused(&functions),
        ErrorCode::Unsupported,
        &["model-local functions"],
    );
}

#[test]
fn attribute_references_are_unsupported() {
    let n = node(
        "Op",
        &[],
        &[],
        vec![attr("a", 2).str(f::ATTR_REF_ATTR_NAME, "outer")],
    );
    let e = refused(&with_node(n));
    assert_refusal(
        &e,
        ErrorCode::Unsupported,
        &["node 1 (`Op`)", "attribute `a`", "ref_attr_name"],
    );
}

#[test]
fn an_eleven_byte_varint_is_malformed() {
    let mut bytes = Msg::new().tag(f::MODEL_IR_VERSION, 0).into_bytes();
    bytes.extend([0x80; 10]);
    bytes.push(0x00);
    assert_refusal(
        &refused(&bytes),
        ErrorCode::Malformed,
        &["longer than 10 bytes"],
    );
    // The same inside a node.
    let n = node("Op", &[], &[], vec![]).tag(99, 0).raw(&[0xff; 11]);
    assert_refusal(
        &refused(&with_node(n)),
        ErrorCode::Malformed,
        &["node 1 (`Op`)", "varint"],
    );
}

#[test]
fn group_and_invalid_wire_types_are_malformed() {
    for wire in [3, 4] {
        let bytes = Msg::new().tag(5, wire).into_bytes();
        assert_refusal(&refused(&bytes), ErrorCode::Malformed, &["group"]);
        let n = node("Op", &[], &[], vec![]).tag(50, wire);
        assert_refusal(
            &refused(&with_node(n)),
            ErrorCode::Malformed,
            &["node 1 (`Op`)", "group"],
        );
    }
    for wire in [6, 7] {
        let bytes = Msg::new().tag(5, wire).into_bytes();
        assert_refusal(&refused(&bytes), ErrorCode::Malformed, &["wire type"]);
    }
    assert_refusal(
        &refused(&[0x00, 0x00]),
        ErrorCode::Malformed,
        &["field number 0"],
    );
}

#[test]
fn a_field_with_the_wrong_wire_type_is_malformed() {
    let bytes = Msg::new().str(f::MODEL_IR_VERSION, "nine").into_bytes();
    assert_refusal(
        &refused(&bytes),
        ErrorCode::Malformed,
        &["ir_version", "varint"],
    );
    let n = node("Op", &[], &[], vec![attr("f", 1).uint(f::ATTR_F, 1)]);
    assert_refusal(
        &refused(&with_node(n)),
        ErrorCode::Malformed,
        &["attribute `f`", "32-bit"],
    );
}

#[test]
fn names_that_are_not_utf8_are_malformed() {
    let n = Msg::new().bytes(f::NODE_OP_TYPE, &[0xff, 0xfe]);
    assert_refusal(
        &refused(&with_node(n)),
        ErrorCode::Malformed,
        &["node 1:", "op_type", "UTF-8"],
    );
    let n = node("Op", &[], &[], vec![]).bytes(f::NODE_INPUT, &[0xc3]);
    assert_refusal(
        &refused(&with_node(n)),
        ErrorCode::Malformed,
        &["node 1 (`Op`)", "input", "UTF-8"],
    );
}

#[test]
fn a_deadline_in_the_past_stops_the_decode() {
    let limits = Limits {
        deadline: Some(Instant::now()),
        ..Limits::default()
    };
    let e = refused_under(&full_model(), &limits);
    assert_eq!(e.code, ErrorCode::Deadline, "{e}");
    let tensor = raw_tensor("t", dt::UINT8, &[1], &[0]).into_bytes();
    assert_eq!(
        decode_tensor(&tensor, &limits).unwrap_err().code,
        ErrorCode::Deadline
    );
}

#[test]
fn errors_name_the_node_and_attribute() {
    // `ints` declares 10 bytes and carries 2.
    let pads = Msg::new()
        .str(f::ATTR_NAME, "pads")
        .int(f::ATTR_TYPE, 7)
        .tag(f::ATTR_INTS, 2)
        .raw(&[10, 1, 2]);
    let e = refused(&with_node(node("Conv", &["x"], &["y"], vec![pads])));
    assert_eq!(e.code, ErrorCode::Malformed);
    assert!(
        e.message
            .starts_with("node 1 (`Conv`): attribute `pads`: truncated field 8"),
        "{e}"
    );
    // An attribute tensor is named inside its attribute.
    let value = attr("value", 4).msg(f::ATTR_T, raw_tensor("c", dt::FLOAT, &[1], &[0; 3]));
    let e = refused(&with_node(node("Constant", &[], &["c"], vec![value])));
    assert!(
        e.message
            .starts_with("node 1 (`Constant`): attribute `value`: tensor `c`: data is 3 bytes"),
        "{e}"
    );
}

#[test]
fn structural_mistakes_are_malformed() {
    let cases: Vec<(Vec<u8>, &[&str])> = vec![
        (
            Msg::new().int(f::MODEL_IR_VERSION, 8).into_bytes(),
            &["no graph"],
        ),
        (
            {
                let mut twice = full_model();
                twice.extend(Msg::new().msg(f::MODEL_GRAPH, Msg::new()).into_bytes());
                twice
            },
            &["two `graph`"],
        ),
        (
            with_node(Msg::new().str(f::NODE_INPUT, "x")),
            &["node 1:", "no op_type"],
        ),
        (
            with_node(node("Op", &[], &[], vec![attr("", 2)])),
            &["attribute 0", "no name"],
        ),
        (
            with_node(node(
                "Op",
                &[],
                &[],
                vec![Msg::new().str(f::ATTR_NAME, "a")],
            )),
            &["attribute `a`", "no type and no value"],
        ),
        (
            with_node(node(
                "Op",
                &[],
                &[],
                vec![Msg::new()
                    .str(f::ATTR_NAME, "a")
                    .int(f::ATTR_I, 1)
                    .f32(f::ATTR_F, 1.0)],
            )),
            &["attribute `a`", "more than one kind"],
        ),
        (
            with_node(node("Op", &[], &[], vec![attr("t", 4)])),
            &["attribute `t`", "no `t`"],
        ),
        (
            with_node(node("Op", &[], &[], vec![attr("neg", -1)])),
            &["attribute `neg`", "type -1"],
        ),
        (
            with_node(node("Op", &[], &[], vec![attr("big", 1 << 40)])),
            &["attribute `big`", "out of range for int32"],
        ),
    ];
    for (bytes, words) in cases {
        assert_refusal(&refused(&bytes), ErrorCode::Malformed, words);
    }
}

#[test]
fn an_empty_model_is_malformed() {
    assert_refusal(&refused(&[]), ErrorCode::Malformed, &["no graph"]);
    // A model of nothing but a graph is fine.
    decode_model(&model(Msg::new()), &Limits::default()).unwrap();
}
