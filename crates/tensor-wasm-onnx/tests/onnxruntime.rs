//! Every graph of `scripts/onnx/graphs.py` (written with the `onnx` package, one or more per
//! supported operator, plus composites and a dynamic batch) through the executor on the CPU
//! backend, against ONNX Runtime's outputs on the same inputs: within
//! |a − b| ≤ 1e-4·|b| + 1e-5 per element, and with element-wise chains fused the same bytes as
//! unfused. The script's bad models are refused with the code it expects.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;
use tensor_wasm_onnx::proto::data_type;
use tensor_wasm_onnx::{BackendLauncher, Execution, Model, Options, TensorIn};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cases, written by the pinned `onnx` and `onnxruntime` of `make deps`.
fn cases() -> tempfile::TempDir {
    let python = root().join(".tools/onnx/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make deps` (it installs the pinned onnx and onnxruntime)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(&python)
        .arg(root().join("scripts/onnx/graphs.py"))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success(), "scripts/onnx/graphs.py failed");
    dir
}

fn dims(v: &Value) -> Vec<usize> {
    v["dims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// An output's dimensions and bytes.
type Output = (Vec<usize>, Vec<u8>);

/// Runs `model` on the case's inputs; the outputs' dimensions and bytes, and how many of the
/// plan's launches are fused chains.
fn execute(
    name: &str,
    dir: &Path,
    case: &Value,
    options: &Options,
) -> Result<(Vec<Output>, usize), String> {
    let bytes = std::fs::read(dir.join("model.onnx")).unwrap();
    let model = Arc::new(Model::load(&bytes, options).map_err(|e| format!("{name}: load: {e}"))?);
    let mut exec: Execution<Vec<u8>> = Execution::new(model.clone());
    let mut shapes = vec![Vec::new(); model.inputs().len()];
    for spec in case["inputs"].as_array().unwrap() {
        let index = model
            .inputs()
            .iter()
            .position(|i| i.name == spec["name"].as_str().unwrap())
            .ok_or_else(|| format!("{name}: no input {}", spec["name"]))?;
        let data = std::fs::read(dir.join(spec["file"].as_str().unwrap())).unwrap();
        let data_type = match spec["dtype"].as_str().unwrap() {
            "float32" => data_type::FLOAT,
            "int64" => data_type::INT64,
            other => panic!("{name}: input dtype {other}"),
        };
        let d = dims(spec);
        exec.set_input(
            index,
            TensorIn {
                dims: &d,
                data_type,
                data: &data,
            },
        )
        .map_err(|e| format!("{name}: set_input: {e}"))?;
        shapes[index] = d;
    }
    let mut launcher = BackendLauncher::cpu().unwrap();
    exec.compute(&mut launcher, &mut |n| Ok(vec![0u8; n]), None)
        .map_err(|e| format!("{name}: compute: {e}"))?;
    let chains = model
        .plan(&shapes, None)
        .unwrap()
        .launches
        .iter()
        .filter(|l| l.blueprint.descriptor().starts_with("chain["))
        .count();
    let outputs = (0..model.output_names().len())
        .map(|i| {
            let (d, b) = exec.output(i).unwrap();
            (d, b.to_vec())
        })
        .collect();
    Ok((outputs, chains))
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
