//! `wasi-nn` on the device: every ONNX case of `scripts/onnx/graphs.py` and the real models of
//! `models.py` (written into the artifact by `make gpu-suite`, with ONNX Runtime's outputs)
//! run by the real server through
//! `examples/c/nn_run.wasm` with the `gpu` target and with the `cpu` target (the CPU backend
//! beside the CUDA one): the bytes must be identical, and within ONNX Runtime's tolerance.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde_json::{json, Value};

use crate::common::{Section, Suite};
use crate::http::Server;

/// One case of the artifact's `onnx/` directory.
struct Case {
    name: String,
    model: Vec<u8>,
    /// Per input: name, witx tensor type, dimensions, bytes.
    inputs: Vec<(String, u32, Vec<u32>, Vec<u8>)>,
    expected: Vec<Vec<u8>>,
}

fn read_cases(dir: &Path) -> anyhow::Result<Vec<Case>> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("{}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.join("case.json").exists())
        .collect();
    dirs.sort();
    let mut cases = Vec::new();
    for d in dirs {
        let case: Value = serde_json::from_slice(&std::fs::read(d.join("case.json"))?)?;
        let file = |spec: &Value| -> anyhow::Result<Vec<u8>> {
            Ok(std::fs::read(
                d.join(spec["file"].as_str().context("file")?),
            )?)
        };
        let dims = |spec: &Value| -> Vec<u32> {
            spec["dims"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|v| v.as_u64())
                        .map(|v| v as u32)
                        .collect()
                })
                .unwrap_or_default()
        };
        let mut inputs = Vec::new();
        for spec in case["inputs"].as_array().context("inputs")? {
            let ty = if spec["dtype"] == "int64" { 5 } else { 1 };
            let name = spec["name"].as_str().context("name")?.to_owned();
            inputs.push((name, ty, dims(spec), file(spec)?));
        }
        let mut expected = Vec::new();
        for spec in case["outputs"].as_array().context("outputs")? {
            expected.push(file(spec)?);
        }
        cases.push(Case {
            name: case["name"].as_str().context("name")?.to_owned(),
            model: std::fs::read(d.join("model.onnx"))?,
            inputs,
            expected,
        });
    }
    Ok(cases)
}

/// `nn_run`'s stdin for `case` on `target` (0 cpu, 1 gpu).
fn stdin(case: &Case, target: u32) -> Vec<u8> {
    let mut out = Vec::new();
    let put = |out: &mut Vec<u8>, v: u32| out.extend_from_slice(&v.to_le_bytes());
    put(&mut out, target);
    put(&mut out, case.model.len() as u32);
    out.extend_from_slice(&case.model);
    put(&mut out, case.inputs.len() as u32);
    for (name, ty, dims, data) in &case.inputs {
        put(&mut out, name.len() as u32);
        out.extend_from_slice(name.as_bytes());
        put(&mut out, *ty);
        put(&mut out, dims.len() as u32);
        for &d in dims {
            put(&mut out, d);
        }
        put(&mut out, data.len() as u32);
        out.extend_from_slice(data);
    }
    out
}

fn outputs(stdout: &[u8]) -> anyhow::Result<Vec<Vec<u8>>> {
    let word = |at: usize| -> anyhow::Result<usize> {
        let b = stdout.get(at..at + 4).context("output ends early")?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
    };
    let mut at = 4;
    let mut out = Vec::new();
    for _ in 0..word(0)? {
        let len = word(at)?;
        out.push(
            stdout
                .get(at + 4..at + 4 + len)
                .context("output ends early")?
                .to_vec(),
        );
        at += 4 + len;
    }
    Ok(out)
}

/// Whether every element of `got` is within |a − b| ≤ 1e-4·|b| + 1e-5 of `want` (f32 bytes).
fn within_tolerance(got: &[u8], want: &[u8]) -> bool {
    got.len() == want.len()
        && got.chunks_exact(4).zip(want.chunks_exact(4)).all(|(g, w)| {
            let g = f64::from(f32::from_le_bytes([g[0], g[1], g[2], g[3]]));
            let w = f64::from(f32::from_le_bytes([w[0], w[1], w[2], w[3]]));
            (g - w).abs() <= 1e-4 * w.abs() + 1e-5
        })
}

pub fn run(
    suite: &Suite,
    server_binary: &Path,
    examples: &Path,
    dirs: &[PathBuf],
) -> anyhow::Result<Section> {
    let mut cases = Vec::new();
    for dir in dirs {
        cases.extend(read_cases(dir)?);
    }
    if cases.is_empty() {
        bail!("no ONNX cases in the artifact");
    }
    let device = if suite.is_cuda() { "cuda" } else { "cpu" };
    let dir = suite.scratch()?;
    let server = Server::start(server_binary, dir.path(), device)?;
    let module = std::fs::read(examples.join("c/nn_run.wasm")).context("examples/c/nn_run.wasm")?;
    let id = server.deploy(
        &module,
        &[
            ("name", "nn-run"),
            ("style", "wasi"),
            ("memory_limit_bytes", "268435456"),
        ],
    )?;
    let invoke = |target: u32, case: &Case| -> anyhow::Result<Vec<Vec<u8>>> {
        let reply = server.send(
            "POST",
            &format!("/functions/{id}/invoke"),
            &[],
            "application/octet-stream",
            &stdin(case, target),
        )?;
        if reply.status != 200 || reply.exit_code != Some(0) {
            bail!(
                "HTTP {} exit {:?}: {}",
                reply.status,
                reply.exit_code,
                String::from_utf8_lossy(&reply.body[..reply.body.len().min(300)])
            );
        }
        outputs(&reply.body)
    };
    // On a CPU host the gpu target is refused unless the server falls back; the dry run
    // compares the cpu target with itself and with ONNX Runtime.
    let gpu_target = if suite.is_cuda() { 1 } else { 0 };
    let (mut identical, mut within) = (0, 0);
    let mut differing = Vec::new();
    let mut rows = Vec::new();
    for case in &cases {
        let gpu = invoke(gpu_target, case);
        let cpu = invoke(0, case);
        match (gpu, cpu) {
            (Ok(gpu), Ok(cpu)) => {
                let same = gpu == cpu;
                let close = gpu.len() == case.expected.len()
                    && gpu
                        .iter()
                        .zip(&case.expected)
                        .all(|(g, w)| within_tolerance(g, w));
                identical += usize::from(same);
                within += usize::from(close);
                if !same || !close {
                    differing.push(format!(
                        "{} (identical {same}, within tolerance {close})",
                        case.name
                    ));
                }
                rows.push(json!({"case": case.name, "identical": same, "within_tolerance": close}));
            }
            (gpu, cpu) => {
                differing.push(format!(
                    "{}: gpu {:?} cpu {:?}",
                    case.name,
                    gpu.err(),
                    cpu.err()
                ));
                rows.push(json!({"case": case.name, "error": true}));
            }
        }
    }
    let mut section = Section::default();
    section.check(
        "wasi-nn: every ONNX case gives the same bytes on the gpu and cpu targets",
        identical == cases.len(),
        format!(
            "{identical} of {} cases identical; {}",
            cases.len(),
            differing.join("; ")
        ),
    );
    section.check(
        "wasi-nn: every ONNX case is within 1e-4*|b| + 1e-5 of ONNX Runtime",
        within == cases.len(),
        format!("{within} of {} cases within tolerance", cases.len()),
    );
    section.set("cases", json!(rows));
    section.set("server_log_tail", json!(server.log_tail()));
    Ok(section)
}
