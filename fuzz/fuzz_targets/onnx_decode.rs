//! Fuzzes the ONNX front end with arbitrary bytes as a model: the decoder, then the graph
//! checks (ordering, operators, types) — an error or a checked graph, never a panic, never an
//! allocation past what the limits and the input's size allow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensor_wasm_onnx::proto::{decode_model, Limits};
use tensor_wasm_onnx::Graph;

fuzz_target!(|data: &[u8]| {
    if let Ok(model) = decode_model(data, &Limits::default()) {
        let _ = Graph::build(&model, None);
    }
});
