//! `NodeProto` and `AttributeProto`. Attribute values that hold graphs, lists of tensors,
//! sparse tensors or type protos are skipped as bytes and kept as their type number, so that
//! decoding never recurses into a nested graph.

use std::mem::size_of;

use super::tensor::tensor;
use super::wire::{fixed_run, peek_bytes, place, within, Cx, Fields, Value, Varints};
use super::{Attribute, AttributeValue, Node};
use crate::{OnnxError, Result};

// `NodeProto` field numbers.
const NODE_INPUT: u32 = 1;
const NODE_OUTPUT: u32 = 2;
const NODE_NAME: u32 = 3;
const NODE_OP_TYPE: u32 = 4;
const NODE_ATTRIBUTE: u32 = 5;
const NODE_DOMAIN: u32 = 7;

// `AttributeProto` field numbers.
const ATTR_NAME: u32 = 1;
const ATTR_F: u32 = 2;
const ATTR_I: u32 = 3;
const ATTR_S: u32 = 4;
const ATTR_T: u32 = 5;
const ATTR_G: u32 = 6;
const ATTR_FLOATS: u32 = 7;
const ATTR_INTS: u32 = 8;
const ATTR_STRINGS: u32 = 9;
const ATTR_TENSORS: u32 = 10;
const ATTR_GRAPHS: u32 = 11;
const ATTR_TP: u32 = 14;
const ATTR_TYPE_PROTOS: u32 = 15;
const ATTR_TYPE: u32 = 20;
const ATTR_REF_ATTR_NAME: u32 = 21;
const ATTR_SPARSE_TENSOR: u32 = 22;
const ATTR_SPARSE_TENSORS: u32 = 23;

// `AttributeProto.AttributeType` numbers.
const TYPE_UNDEFINED: i32 = 0;
const TYPE_FLOAT: i32 = 1;
const TYPE_INT: i32 = 2;
const TYPE_STRING: i32 = 3;
const TYPE_TENSOR: i32 = 4;
const TYPE_GRAPH: i32 = 5;
const TYPE_FLOATS: i32 = 6;
const TYPE_INTS: i32 = 7;
const TYPE_STRINGS: i32 = 8;
const TYPE_TENSORS: i32 = 9;
const TYPE_GRAPHS: i32 = 10;
const TYPE_SPARSE_TENSOR: i32 = 11;
const TYPE_SPARSE_TENSORS: i32 = 12;
const TYPE_TYPE_PROTO: i32 = 13;
const TYPE_TYPE_PROTOS: i32 = 14;

/// Decodes the `index`th `NodeProto` of the graph; errors say "node 3 (`Conv`): ...".
pub(super) fn node(bytes: &[u8], index: usize, cx: &mut Cx) -> Result<Node> {
    let label = cx.label(peek_bytes(bytes, NODE_OP_TYPE));
    within(decode_node(bytes, cx), || place("node", index, label))
}

fn decode_node(bytes: &[u8], cx: &mut Cx) -> Result<Node> {
    cx.check_deadline()?;
    let mut n = Node {
        name: String::new(),
        op_type: String::new(),
        domain: String::new(),
        inputs: Vec::new(),
        outputs: Vec::new(),
        attributes: Vec::new(),
    };
    let mut fields = Fields::new(bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            NODE_INPUT => {
                cx.charge(size_of::<String>())?;
                n.inputs.push(cx.name(value, "input")?);
            }
            NODE_OUTPUT => {
                cx.charge(size_of::<String>())?;
                n.outputs.push(cx.name(value, "output")?);
            }
            NODE_NAME => n.name = cx.name(value, "name")?,
            NODE_OP_TYPE => n.op_type = cx.name(value, "op_type")?,
            NODE_DOMAIN => n.domain = cx.name(value, "domain")?,
            NODE_ATTRIBUTE => {
                cx.charge(size_of::<Attribute>())?;
                let index = n.attributes.len();
                n.attributes
                    .push(attribute(value.bytes("attribute")?, index, cx)?);
            }
            _ => {}
        }
    }
    if n.op_type.is_empty() {
        return Err(OnnxError::malformed("no op_type"));
    }
    Ok(n)
}

/// Decodes the `index`th `AttributeProto` of a node; errors say "attribute `pads`: ...".
fn attribute(bytes: &[u8], index: usize, cx: &mut Cx) -> Result<Attribute> {
    let label = cx.label(peek_bytes(bytes, ATTR_NAME));
    within(decode_attribute(bytes, cx), || match label {
        Some(name) if !name.is_empty() => format!("attribute `{name}`"),
        _ => place("attribute", index, None),
    })
}

/// The value fields of one attribute as found, before `type` picks one.
#[derive(Default)]
struct Found<'a> {
    f: Option<f32>,
    i: Option<i64>,
    s: Option<&'a [u8]>,
    t: Option<&'a [u8]>,
    floats: Option<Vec<f32>>,
    ints: Option<Vec<i64>>,
    strings: Option<Vec<Vec<u8>>>,
    /// The type number of the last value field that is not decoded (a graph, ...).
    other: Option<i32>,
}

fn decode_attribute(bytes: &[u8], cx: &mut Cx) -> Result<Attribute> {
    let mut name = String::new();
    let mut ty = TYPE_UNDEFINED;
    let mut found = Found::default();
    let max_elements = cx.limits.max_attribute_elements;
    let too_many = || {
        OnnxError::too_large(format!(
            "more than {max_elements} elements (max_attribute_elements)"
        ))
    };
    let mut fields = Fields::new(bytes);
    while let Some((field, value)) = fields.next_field()? {
        cx.tick()?;
        match field {
            ATTR_NAME => name = cx.name(value, "name")?,
            ATTR_TYPE => ty = value.int32("type")?,
            ATTR_F => found.f = Some(value.float("f")?),
            ATTR_I => found.i = Some(value.int64("i")?),
            ATTR_S => found.s = Some(value.bytes("s")?),
            ATTR_T => found.t = Some(value.bytes("t")?),
            ATTR_FLOATS => {
                let floats = found.floats.get_or_insert_with(Vec::new);
                for chunk in fixed_run(value, 4, "floats")?.chunks_exact(4) {
                    cx.tick()?;
                    if floats.len() >= max_elements {
                        return Err(too_many());
                    }
                    let bits = <[u8; 4]>::try_from(chunk).map_err(|_| too_many())?;
                    cx.charge(size_of::<f32>())?;
                    floats.push(f32::from_le_bytes(bits));
                }
            }
            ATTR_INTS => {
                let ints = found.ints.get_or_insert_with(Vec::new);
                let mut elements = Varints::new(value, "ints")?;
                while let Some(v) = elements.next_varint()? {
                    cx.tick()?;
                    if ints.len() >= max_elements {
                        return Err(too_many());
                    }
                    cx.charge(size_of::<i64>())?;
                    ints.push(v as i64);
                }
            }
            ATTR_STRINGS => {
                let strings = found.strings.get_or_insert_with(Vec::new);
                if strings.len() >= max_elements {
                    return Err(too_many());
                }
                let s = value.bytes("strings")?;
                cx.charge(size_of::<Vec<u8>>() + s.len())?;
                strings.push(s.to_vec());
            }
            ATTR_G => found.other = Some(skip(value, "g", TYPE_GRAPH)?),
            ATTR_TENSORS => found.other = Some(skip(value, "tensors", TYPE_TENSORS)?),
            ATTR_GRAPHS => found.other = Some(skip(value, "graphs", TYPE_GRAPHS)?),
            ATTR_SPARSE_TENSOR => {
                found.other = Some(skip(value, "sparse_tensor", TYPE_SPARSE_TENSOR)?)
            }
            ATTR_SPARSE_TENSORS => {
                found.other = Some(skip(value, "sparse_tensors", TYPE_SPARSE_TENSORS)?)
            }
            ATTR_TP => found.other = Some(skip(value, "tp", TYPE_TYPE_PROTO)?),
            ATTR_TYPE_PROTOS => found.other = Some(skip(value, "type_protos", TYPE_TYPE_PROTOS)?),
            ATTR_REF_ATTR_NAME => {
                return Err(OnnxError::unsupported(
                    "references to a function's attributes (`ref_attr_name`) are not supported",
                ))
            }
            _ => {}
        }
    }
    if name.is_empty() {
        return Err(OnnxError::malformed("no name"));
    }
    if ty == TYPE_UNDEFINED {
        ty = untyped(&found)?;
    }
    let value = match ty {
        TYPE_FLOAT => AttributeValue::Float(found.f.unwrap_or(0.0)),
        TYPE_INT => AttributeValue::Int(found.i.unwrap_or(0)),
        TYPE_STRING => {
            let s = found.s.unwrap_or_default();
            cx.charge(s.len())?;
            AttributeValue::String(s.to_vec())
        }
        TYPE_TENSOR => {
            let t = found
                .t
                .ok_or_else(|| OnnxError::malformed("of type TENSOR, but has no `t`"))?;
            AttributeValue::Tensor(tensor(t, cx)?)
        }
        TYPE_FLOATS => AttributeValue::Floats(found.floats.unwrap_or_default()),
        TYPE_INTS => AttributeValue::Ints(found.ints.unwrap_or_default()),
        TYPE_STRINGS => AttributeValue::Strings(found.strings.unwrap_or_default()),
        ty if ty < 0 => {
            return Err(OnnxError::malformed(format!("unknown attribute type {ty}")));
        }
        ty => AttributeValue::Other(ty),
    };
    Ok(Attribute { name, value })
}

/// Checks that a value this decoder does not read is length-delimited, and returns the
/// attribute type it stands for.
fn skip(value: Value<'_>, what: &str, ty: i32) -> Result<i32> {
    value.bytes(what)?;
    Ok(ty)
}

/// The type of an attribute without a `type` field (files older than IR version 2): that of
/// its one value field.
fn untyped(found: &Found<'_>) -> Result<i32> {
    let present = [
        (found.f.is_some(), TYPE_FLOAT),
        (found.i.is_some(), TYPE_INT),
        (found.s.is_some(), TYPE_STRING),
        (found.t.is_some(), TYPE_TENSOR),
        (found.floats.is_some(), TYPE_FLOATS),
        (found.ints.is_some(), TYPE_INTS),
        (found.strings.is_some(), TYPE_STRINGS),
    ];
    let mut types = present
        .iter()
        .filter(|(there, _)| *there)
        .map(|&(_, ty)| ty)
        .chain(found.other);
    match (types.next(), types.next()) {
        (Some(ty), None) => Ok(ty),
        (None, _) => Err(OnnxError::malformed("no type and no value")),
        (Some(_), Some(_)) => Err(OnnxError::malformed(
            "no type, and values of more than one kind",
        )),
    }
}
