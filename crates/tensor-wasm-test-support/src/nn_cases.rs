//! The ONNX cases of `scripts/onnx/graphs.py` (graphs written with the `onnx` package, with
//! ONNX Runtime's outputs on the same inputs), for the `wasi-nn` guests
//! (`examples/c/nn_run.c`, `examples/components/python/nn_cmd.py`): their stdin, their stdout
//! parsed, and the comparison with ONNX Runtime.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// An input tensor of a case.
#[derive(Debug, Clone)]
pub struct CaseInput {
    /// Its name in the model.
    pub name: String,
    /// The witx tensor type (1 f32, 5 i64).
    pub ty: u32,
    /// Its dimensions.
    pub dims: Vec<u32>,
    /// Its bytes.
    pub data: Vec<u8>,
}

/// One case: a model, its inputs and ONNX Runtime's outputs.
#[derive(Debug, Clone)]
pub struct Case {
    /// The case's name.
    pub name: String,
    /// The ONNX model.
    pub model: Vec<u8>,
    /// Inputs in the model's order.
    pub inputs: Vec<CaseInput>,
    /// ONNX Runtime's outputs, in the model's order.
    pub expected: Vec<Vec<f32>>,
    /// Elements of the largest tensor the case moves (to pick small ones).
    pub largest: usize,
}

/// A model the executor must refuse, and the code it must refuse it with.
#[derive(Debug, Clone)]
pub struct BadModel {
    /// Its file name.
    pub file: String,
    /// The expected error code (`onnx_unsupported`, ...).
    pub expect: String,
    /// The model's bytes.
    pub model: Vec<u8>,
}

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Writes the cases of `scripts/onnx/graphs.py` into `dir` with the pinned `onnx` and
/// `onnxruntime` of `make deps`.
pub fn write_cases(dir: &Path) {
    write_cases_of("graphs.py", dir);
}

/// Writes the real models of `scripts/onnx/models.py` (the digits CNN, the transformer
/// encoder, the pretrained network) as cases into `dir`.
pub fn write_models(dir: &Path) {
    write_cases_of("models.py", dir);
}

fn write_cases_of(script: &str, dir: &Path) {
    let python = root().join(".tools/onnx/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `make deps` (it installs the pinned onnx and onnxruntime)",
        python.display()
    );
    let out = Command::new(&python)
        .arg(root().join("scripts/onnx").join(script))
        .arg(dir)
        .output()
        .unwrap_or_else(|e| panic!("running scripts/onnx/{script}: {e}"));
    assert!(
        out.status.success(),
        "scripts/onnx/{script}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn dims(v: &Value) -> Vec<u32> {
    v["dims"]
        .as_array()
        .expect("dims")
        .iter()
        .map(|d| d.as_u64().expect("a dimension") as u32)
        .collect()
}

fn floats(bytes: &[u8]) -> Vec<f32> {
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// The cases [`write_cases`] wrote into `dir`, by name.
pub fn cases(dir: &Path) -> Vec<Case> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .expect("the cases' directory")
        .map(|e| e.expect("an entry").path())
        .filter(|p| p.join("case.json").exists())
        .collect();
    dirs.sort();
    dirs.iter()
        .map(|d| {
            let case: Value = serde_json::from_slice(&std::fs::read(d.join("case.json")).unwrap())
                .expect("case.json");
            let read =
                |spec: &Value| std::fs::read(d.join(spec["file"].as_str().unwrap())).unwrap();
            let mut largest = 0;
            let inputs = case["inputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|spec| {
                    let ty = match spec["dtype"].as_str().unwrap() {
                        "int64" => 5,
                        _ => 1,
                    };
                    let data = read(spec);
                    largest = largest.max(data.len() / 4);
                    CaseInput {
                        name: spec["name"].as_str().unwrap().to_owned(),
                        ty,
                        dims: dims(spec),
                        data,
                    }
                })
                .collect();
            let expected: Vec<Vec<f32>> = case["outputs"]
                .as_array()
                .unwrap()
                .iter()
                .map(|spec| floats(&read(spec)))
                .collect();
            largest = expected.iter().map(Vec::len).fold(largest, usize::max);
            Case {
                name: case["name"].as_str().unwrap().to_owned(),
                model: std::fs::read(d.join("model.onnx")).unwrap(),
                inputs,
                expected,
                largest,
            }
        })
        .collect()
}

/// The bad models [`write_cases`] wrote into `dir`.
pub fn bad_models(dir: &Path) -> Vec<BadModel> {
    let bad = dir.join("bad");
    let index: Value =
        serde_json::from_slice(&std::fs::read(bad.join("index.json")).unwrap()).unwrap();
    index
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let file = e["file"].as_str().unwrap().to_owned();
            BadModel {
                model: std::fs::read(bad.join(&file)).unwrap(),
                expect: e["expect"].as_str().unwrap().to_owned(),
                file,
            }
        })
        .collect()
}

fn put(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

/// The stdin of the `wasi-nn` guests for the model named `name` (loaded by name) and
/// `inputs`.
pub fn stdin_by_name(name: &str, inputs: &[CaseInput]) -> Vec<u8> {
    let mut with_name = Vec::new();
    put(&mut with_name, name.len() as u32);
    with_name.extend_from_slice(name.as_bytes());
    let mut out = stdin(0, &[], inputs);
    // `stdin` wrote a model length of 0 at 4..8: the name goes right after it.
    out.splice(8..8, with_name);
    out
}

/// The stdin of the `wasi-nn` guests for `model` and `inputs` on `target` (0 cpu, 1 gpu).
pub fn stdin(target: u32, model: &[u8], inputs: &[CaseInput]) -> Vec<u8> {
    let mut out = Vec::new();
    put(&mut out, target);
    put(&mut out, model.len() as u32);
    out.extend_from_slice(model);
    put(&mut out, inputs.len() as u32);
    for input in inputs {
        put(&mut out, input.name.len() as u32);
        out.extend_from_slice(input.name.as_bytes());
        put(&mut out, input.ty);
        put(&mut out, input.dims.len() as u32);
        for &d in &input.dims {
            put(&mut out, d);
        }
        put(&mut out, input.data.len() as u32);
        out.extend_from_slice(&input.data);
    }
    out
}

impl Case {
    /// The guests' stdin for this case on `target`.
    pub fn stdin(&self, target: u32) -> Vec<u8> {
        stdin(target, &self.model, &self.inputs)
    }

    /// Checks `outputs` (a guest's, parsed) against ONNX Runtime's: the same count and
    /// lengths, each element within |a − b| ≤ 1e-4·|b| + 1e-5.
    pub fn check(&self, outputs: &[Vec<u8>]) -> Result<(), String> {
        if outputs.len() != self.expected.len() {
            return Err(format!(
                "{}: {} outputs, ONNX Runtime {}",
                self.name,
                outputs.len(),
                self.expected.len()
            ));
        }
        for (o, (got, want)) in outputs.iter().zip(&self.expected).enumerate() {
            let got = floats(got);
            if got.len() != want.len() {
                return Err(format!(
                    "{}: output {o} has {} elements, ONNX Runtime {}",
                    self.name,
                    got.len(),
                    want.len()
                ));
            }
            for (i, (a, b)) in got.iter().zip(want).enumerate() {
                let (a, b) = (f64::from(*a), f64::from(*b));
                if (a - b).abs().is_nan() || (a - b).abs() > 1e-4 * b.abs() + 1e-5 {
                    return Err(format!(
                        "{}: output {o} element {i}: {a} against ONNX Runtime's {b}",
                        self.name
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The guests' stdout: each output's bytes.
pub fn parse_outputs(stdout: &[u8]) -> Result<Vec<Vec<u8>>, String> {
    let word = |at: usize| -> Result<usize, String> {
        stdout
            .get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
            .ok_or_else(|| format!("the output ends at {at} of {} bytes", stdout.len()))
    };
    let count = word(0)?;
    let mut at = 4;
    let mut outputs = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        let len = word(at)?;
        at += 4;
        let bytes = stdout
            .get(at..at + len)
            .ok_or_else(|| format!("an output of {len} bytes runs past the end"))?;
        outputs.push(bytes.to_vec());
        at += len;
    }
    Ok(outputs)
}
