//! What the executor's ONNX tests share: the case files of `scripts/onnx/graphs.py` and
//! `models.py` (written with the pinned `onnx` and `onnxruntime` of `make deps`), and running
//! a case through the executor on the CPU backend.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use serde_json::Value;
use tensor_wasm_onnx::proto::data_type;
use tensor_wasm_onnx::{BackendLauncher, Execution, Model, Options, TensorIn};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The cases of `script` (`graphs.py`, `models.py`) in a new directory.
pub fn cases_of(script: &str) -> tempfile::TempDir {
    let python = root().join(".tools/onnx/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make deps` (it installs the pinned onnx and onnxruntime)",
        python.display()
    );
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(&python)
        .arg(root().join("scripts/onnx").join(script))
        .arg(dir.path())
        .status()
        .unwrap();
    assert!(status.success(), "scripts/onnx/{script} failed");
    dir
}

pub fn dims(v: &Value) -> Vec<usize> {
    v["dims"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d.as_u64().unwrap() as usize)
        .collect()
}

pub fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// An output's dimensions and bytes.
pub type Output = (Vec<usize>, Vec<u8>);

/// Runs `model` on the case's inputs; the outputs' dimensions and bytes, and how many of the
/// plan's launches are fused chains.
pub fn execute(
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
