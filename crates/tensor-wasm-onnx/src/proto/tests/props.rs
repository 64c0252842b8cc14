//! Properties over hostile input: random bytes and random edits of a valid model decode to
//! a model that keeps the decoder's promises, or to a stable error; never a panic.

use proptest::prelude::*;
use proptest::sample::Index;

use super::full_model;
use crate::proto::{data_type, decode_model, decode_tensor, Limits, Model, Tensor};
use crate::{ErrorCode, Result};

/// The promises an accepted tensor keeps.
fn check_tensor(t: &Tensor, limits: &Limits) {
    assert!(t.dims.len() <= limits.max_dims);
    assert!(t.dims.iter().all(|&d| d >= 0));
    let element = data_type::element_bytes(t.data_type).expect("a sized type");
    let elements: i64 = t.dims.iter().product();
    assert_eq!(t.data.len() as i64, elements * element as i64, "{t:?}");
    assert!(t.data.len() <= limits.max_tensor_bytes);
}

fn check_model(result: Result<Model>, limits: &Limits) {
    let model = match result {
        Ok(model) => model,
        Err(e) => {
            assert!(
                matches!(
                    e.code,
                    ErrorCode::Malformed | ErrorCode::TooLarge | ErrorCode::Unsupported
                ),
                "{e}"
            );
            return;
        }
    };
    let g = &model.graph;
    assert!(g.nodes.len() <= limits.max_nodes);
    assert!(g.initializers.len() <= limits.max_initializers);
    assert!(g.inputs.len() + g.outputs.len() <= limits.max_values);
    for n in &g.nodes {
        assert!(!n.op_type.is_empty());
        for a in &n.attributes {
            assert!(!a.name.is_empty());
            if let crate::proto::AttributeValue::Tensor(t) = &a.value {
                check_tensor(t, limits);
            }
        }
    }
    for t in &g.initializers {
        check_tensor(t, limits);
    }
    for v in g.inputs.iter().chain(&g.outputs) {
        assert!(v.shape.as_ref().is_none_or(|s| s.len() <= limits.max_dims));
    }
}

/// One edit of a byte string.
#[derive(Debug, Clone)]
enum Edit {
    Flip(Index, u8),
    Set(Index, u8),
    Insert(Index, u8),
    Delete(Index),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<Index>(), 0u8..8).prop_map(|(i, bit)| Edit::Flip(i, bit)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Set(i, b)),
        (any::<Index>(), any::<u8>()).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<Index>().prop_map(Edit::Delete),
    ]
}

fn apply(bytes: &mut Vec<u8>, edit: &Edit) {
    if bytes.is_empty() {
        return;
    }
    match *edit {
        Edit::Flip(ref i, bit) => {
            let at = i.index(bytes.len());
            bytes[at] ^= 1 << bit;
        }
        Edit::Set(ref i, b) => {
            let at = i.index(bytes.len());
            bytes[at] = b;
        }
        Edit::Insert(ref i, b) => {
            let at = i.index(bytes.len() + 1);
            bytes.insert(at, b);
        }
        Edit::Delete(ref i) => {
            bytes.remove(i.index(bytes.len()));
        }
    }
}

/// Small limits, so that the limit checks are reached too.
fn small_limits() -> Limits {
    Limits {
        max_nodes: 1,
        max_initializers: 4,
        max_tensor_bytes: 12,
        max_dims: 2,
        max_name_bytes: 5,
        max_attribute_elements: 2,
        max_values: 2,
        ..Limits::default()
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    #[test]
    fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for limits in [Limits::default(), small_limits()] {
            check_model(decode_model(&bytes, &limits), &limits);
            if let Ok(t) = decode_tensor(&bytes, &limits) {
                check_tensor(&t, &limits);
            }
        }
    }

    #[test]
    fn edited_models_never_panic(edits in proptest::collection::vec(edit(), 1..6)) {
        let mut bytes = full_model();
        for e in &edits {
            apply(&mut bytes, e);
        }
        for limits in [Limits::default(), small_limits()] {
            check_model(decode_model(&bytes, &limits), &limits);
        }
    }
}
