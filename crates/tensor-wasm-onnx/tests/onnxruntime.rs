//! Every graph of `scripts/onnx/graphs.py` (written with the `onnx` package, one or more per
//! supported operator, plus composites and a dynamic batch) through the executor on the CPU
//! backend, against ONNX Runtime's outputs on the same inputs: within
//! |a − b| ≤ 1e-4·|b| + 1e-5 per element, and with element-wise chains fused the same bytes as
//! unfused. The script's bad models are refused with the code it expects.

mod common;

use std::path::{Path, PathBuf};

use common::{dims, execute, floats};
use serde_json::Value;
use tensor_wasm_onnx::{Model, Options};

fn cases() -> tempfile::TempDir {
    common::cases_of("graphs.py")
}

/// Runs one case directory, fused and unfused; returns its name, the largest error as a share
/// of the tolerance, and how many fused chains its plan has.
fn run_case(dir: &Path) -> Result<(String, f64, usize), String> {
    let case: Value =
        serde_json::from_slice(&std::fs::read(dir.join("case.json")).unwrap()).unwrap();
    let name = case["name"].as_str().unwrap().to_owned();
    let (outputs, chains) = execute(&name, dir, &case, &Options::default())?;
    let unfused = Options {
        fuse: false,
        ..Options::default()
    };
    let (plain, none) = execute(&name, dir, &case, &unfused)?;
    assert_eq!(none, 0, "{name}: chains with fusion off");
    if plain != outputs {
        return Err(format!("{name}: fused and unfused outputs differ"));
    }
    let bytes = std::fs::read(dir.join("model.onnx")).unwrap();
    let names: Vec<String> = Model::load(&bytes, &Options::default())
        .unwrap()
        .output_names()
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut worst = 0f64;
    for spec in case["outputs"].as_array().unwrap() {
        let index = names
            .iter()
            .position(|n| n == spec["name"].as_str().unwrap())
            .unwrap();
        let want = floats(&std::fs::read(dir.join(spec["file"].as_str().unwrap())).unwrap());
        let (got_dims, got) = &outputs[index];
        if *got_dims != dims(spec) {
            return Err(format!(
                "{name}: output shape {got_dims:?}, ONNX Runtime {:?}",
                dims(spec)
            ));
        }
        for (i, (a, b)) in floats(got).iter().zip(&want).enumerate() {
            let (a, b) = (f64::from(*a), f64::from(*b));
            let tolerance = 1e-4 * b.abs() + 1e-5;
            let share = (a - b).abs() / tolerance;
            if share.is_nan() || share > 1.0 {
                return Err(format!(
                    "{name}: element {i}: {a} against ONNX Runtime's {b}"
                ));
            }
            worst = worst.max(share);
        }
    }
    Ok((name, worst, chains))
}

#[test]
fn every_operator_agrees_with_onnx_runtime() {
    let dir = cases();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("case.json").exists())
        .collect();
    entries.sort();
    assert!(entries.len() >= 80, "{} cases", entries.len());
    let mut failures = Vec::new();
    let mut fused = 0;
    for entry in &entries {
        match run_case(entry) {
            Ok((name, worst, chains)) => {
                fused += chains;
                println!("{name}: largest error {worst:.3} of the tolerance, {chains} fused chains")
            }
            Err(e) => failures.push(e),
        }
    }
    println!("{fused} fused chains in all");
    assert!(fused >= 5, "only {fused} fused chains");
    assert!(
        failures.is_empty(),
        "{} of {} cases failed:\n{}",
        failures.len(),
        entries.len(),
        failures.join("\n")
    );
}

#[test]
fn bad_models_are_refused_with_their_codes() {
    let dir = cases();
    let bad = dir.path().join("bad");
    let index: Value =
        serde_json::from_slice(&std::fs::read(bad.join("index.json")).unwrap()).unwrap();
    let mut failures = Vec::new();
    for entry in index.as_array().unwrap() {
        let file = entry["file"].as_str().unwrap();
        let expect = entry["expect"].as_str().unwrap();
        let bytes = std::fs::read(bad.join(file)).unwrap();
        match Model::load(&bytes, &Options::default()) {
            Ok(_) => failures.push(format!("{file}: loaded; expected {expect}")),
            Err(e) if e.code.as_str() != expect => {
                failures.push(format!("{file}: {e}; expected {expect}"))
            }
            Err(e) => println!("{file}: {e}"),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Every prefix and many one-byte edits of a real model (the attention block) are refused
/// with a stable code or load; none panics.
#[test]
fn truncated_and_mutated_models_are_refused_not_crashed() {
    let dir = cases();
    let bytes = std::fs::read(dir.path().join("attention_block/model.onnx")).unwrap();
    let mut refused = 0;
    for len in (0..bytes.len()).step_by(7) {
        if Model::load(&bytes[..len], &Options::default()).is_err() {
            refused += 1;
        }
    }
    assert!(refused > bytes.len() / 7 - 2, "{refused} prefixes refused");
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    for _ in 0..300 {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        let mut edited = bytes.clone();
        let at = (state % edited.len() as u64) as usize;
        edited[at] = (state >> 32) as u8;
        let _ = Model::load(&edited, &Options::default());
    }
}
