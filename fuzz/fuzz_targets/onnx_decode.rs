//! Fuzzes the ONNX decoder with arbitrary bytes as a model: an error or a model, never a
//! panic, never an allocation past what the limits and the input's size allow.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tensor_wasm_onnx::proto::{decode_model, Limits};

fuzz_target!(|data: &[u8]| {
    let _ = decode_model(data, &Limits::default());
});
